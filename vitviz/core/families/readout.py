"""Which token rows a model's head reads: ``ViTSpec.readout``, one rule per family (``Family.readout``).

A ViT's output is computed from its last block's tokens by a *readout*: the class token (the ViT paper's head),
the mean of the class and distillation tokens (timm ``VisionTransformerDistilled`` and Hugging Face
``DeiTForImageClassificationWithTeacher`` in eval mode average the class head on the class token and the
distillation head on the distillation token, so the logits depend on both rows), the mean of the patch tokens
(timm ``global_pool="avg"``: ``x[:, num_prefix_tokens:].mean(1)``, registers and class token left out unless
``pool_include_prefix``; Hugging Face ``BeitPooler`` with ``use_mean_pooling``: ``hidden_states[:, 1:].mean(1)``;
open_clip ``pool_type="avg"``: ``x[:, 1:].mean(1)``), the class token beside the patch mean (Hugging Face
``Dinov2ForImageClassification``: one linear head on their concatenation), or an attention pool (timm
``global_pool="map"``, SigLIP's ``MultiheadAttentionPoolingHead``, open_clip's attentional pooler), whose output is
no token row at all.

Many models carry a class token their head never reads (timm ``global_pool="avg"``, the default of timm ``Beit``,
MAE-style fine-tuned ViTs, Hugging Face BEiT classifiers, open_clip ``pool_type="avg"``), so "the class token if
the model has one" is not the output token. The row-reading explanations (rollout, flow, Chefer's relevance,
gradient rollout, raw attention) read ``Readout.weights``: the rows of the tokens the head reads, each part of the
readout given equal weight and each part the mean of its tokens. Abnar & Zuidema (ACL 2020) and Chefer et al. (ICCV
2021) read the class token's row because their models' heads read the class token; reading the head's own tokens
is that rule for every head.

An attention pool's output is ``sum_j a_j v_j``: its query's attention ``a`` over the tokens (heads averaged, the
queries the output keeps) weights them, and ``a`` depends on the image. Where the family reads that attention
(``Family.readout_attention``, probes in ``vitviz.core.families.probes``: timm ``AttentionPoolLatent``, ``global_pool="map"``; Hugging Face SigLIP's
``MultiheadAttentionPoolingHead``; Hugging Face AIMv2's ``Aimv2AttentionPoolingHead`` (``hf_aimv2``); open_clip's
``AttentionalPooler`` with ``pool_type`` ``"tok"`` or ``"avg"``; ``Readout.pool_attention``), the explanations'
last step is ``a . R``: the pool's own attention over the rows.
``exact`` is ``False`` where no such weighting is read: other attention pools (timm NaFlexViT, ``"prr"``), a max over
tokens (``"max"``, ``"avgmax"``), or no pooling at all (a head applied to every token). vitviz then reads the uniform
mean of the tokens pooled (the patch tokens, or also the prefix tokens with ``pool_include_prefix``), or, with no
pooling, the class token (or the patch mean without one), and says so.

Shapes: ``N`` tokens (``p`` prefix tokens, then the patches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitviz.errors import InputError

__all__ = ["HOWS", "PATCHES", "Readout", "default_readout", "distilled_readout", "pooled_over", "query_mean",
           "timm_readout"]

PATCHES = "patches"  # a part's token set: every patch token
HOWS = ("token", "mean", "concat", "max", "avgmax", "attention-pool", "none")
INEXACT = ("max", "avgmax", "attention-pool", "none")

Part = tuple[int | str, ...]  # prefix-token indices and/or PATCHES; the part is the mean of these tokens


@dataclass(frozen=True)
class Readout:
    """Which last-block token rows a model's output is computed from, and how they combine.

    Attributes:
        how: ``"token"`` (one token, e.g. the class token), ``"mean"`` (the mean of the parts' tokens: class and
            distillation tokens, or the patch tokens), ``"concat"`` (the parts side by side into one head, e.g.
            ``[class token, patch mean]``), ``"max"`` / ``"avgmax"`` (timm's max and ``0.5 (max + mean)`` over
            tokens), ``"attention-pool"`` (a learned query attends over the tokens) or ``"none"`` (no pooling: a
            head on every token).
        parts: the token sets read, each a tuple of prefix-token indices and/or ``PATCHES``; a part is the mean
            of its tokens. For ``"attention-pool"``, ``"max"`` and ``"avgmax"``: the tokens pooled over.
        source: where the rule was read (e.g. ``"timm global_pool='avg'"``), for the description.
        pool_attention: for ``"attention-pool"``: the family reads the pool's own attention over the tokens
            (``Family.readout_attention``), so the explanations weight the rows by it.
    """

    how: str
    parts: tuple[Part, ...]
    source: str = ""
    pool_attention: bool = False

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise InputError(f"Readout(how={self.how!r}) is not one of {HOWS}")
        if not self.parts or any(not part for part in self.parts):
            raise InputError(f"Readout(parts={self.parts!r}) must name at least one token set, each non-empty")

    @property
    def weights_by_pool(self) -> bool:
        """Whether the rows read are weighted by an attention pool's own attention over the tokens, read during the
        forward pass (``pool_attention``; ``vitviz.analysis.readout_rows.PoolRows``)."""
        return self.how == "attention-pool" and self.pool_attention

    @property
    def exact(self) -> bool:
        """Whether the rows read are the readout's own (a fixed mean of token rows, or an attention pool's own
        attention), not vitviz's approximation."""
        return self.how not in INEXACT or self.weights_by_pool

    @property
    def prefix_parts(self) -> tuple[int, ...] | None:
        """The prefix tokens read where each part is one prefix token (the class token; DeiT-distilled's class and
        distillation tokens), else ``None``."""
        if all(len(part) == 1 and isinstance(part[0], int) for part in self.parts):
            return tuple(part[0] for part in self.parts)
        return None

    @property
    def single_token(self) -> int | None:
        """The one prefix token read (class-token readouts), else ``None``."""
        read = self.prefix_parts
        return read[0] if read is not None and len(read) == 1 else None

    @property
    def patch_mean(self) -> bool:
        """Whether the rows read are the uniform mean of the patch tokens' rows."""
        return self.parts == ((PATCHES,),)

    def weights(self, n: int, num_prefix_tokens: int, *, dtype: torch.dtype = torch.float64,
                device: torch.device | None = None) -> torch.Tensor:
        """The row selector ``(N,)``: the mean over parts of each part's uniform mean over its tokens (sums to 1).

        Args:
            n: tokens in the sequence (``N``; the grid may follow the input).
            num_prefix_tokens: ``p``, the tokens before the patches.
        """
        w = torch.zeros(n, dtype=dtype, device=device)
        for i in range(len(self.parts)):
            idx = self.token_indices(i, n, num_prefix_tokens)
            w[idx] += 1.0 / (len(idx) * len(self.parts))
        return w

    def token_indices(self, part: int, n: int, num_prefix_tokens: int) -> list[int]:
        """The sequence indices of part ``part``'s tokens, in sequence order (an attention pool's keys)."""
        p = num_prefix_tokens
        if not 0 <= p < n:
            raise InputError(f"a readout over {n} tokens with {p} prefix tokens has no patch token; pass the "
                             "sequence length and ViTSpec.num_prefix_tokens")
        idx: list[int] = []
        for t in self.parts[part]:
            if t == PATCHES:
                idx += range(p, n)
            elif isinstance(t, int) and 0 <= t < p:
                idx.append(t)
            else:
                raise InputError(f"readout token {t!r} is neither a prefix-token index below {p} nor {PATCHES!r}")
        return sorted(idx)

    def describe(self, prefix_tokens: tuple[str, ...] = (), *, source: bool = True) -> str:
        """In words, e.g. ``"mean of the patch tokens (timm global_pool='avg')"``; ``source=False`` leaves out
        where the rule was read."""
        names = {"cls": "class token", "dist": "distillation token", "reg": "register"}

        def part_words(part: Part) -> str:
            words = []
            for t in part:
                if t == PATCHES:
                    words.append("the patch tokens")
                else:
                    name = prefix_tokens[t] if isinstance(t, int) and t < len(prefix_tokens) else "prefix"
                    words.append(f"{names.get(name, name + ' token')} {t}")
            return " + ".join(words)

        tokens = [part_words(p) for p in self.parts]
        text = {
            "token": tokens[0],
            "mean": "mean of " + " and ".join(tokens),
            "concat": "[" + ", ".join(("mean of " + t) if PATCHES in p else t for t, p in zip(tokens, self.parts))
                      + "] concatenated",
            "max": "max over " + tokens[0],
            "avgmax": "0.5 (max + mean) over " + tokens[0],
            "attention-pool": "attention pool over " + tokens[0],
            "none": "no pooling (head on every token)",
        }[self.how]
        if self.weights_by_pool:
            text += "; explanations weight the rows by the pool's own attention"
        elif not self.exact:
            text += "; explanations read " + ("the class token" if self.single_token is not None
                                              else "the mean of " + " and ".join(tokens))
        return text + (f" ({self.source})" if self.source and source else "")


def default_readout(prefix_tokens: tuple[str, ...], source: str = "") -> Readout:
    """The class token when the model has one (the first prefix token named ``"cls"``), else the patch mean."""
    if "cls" in prefix_tokens:
        return Readout("token", ((prefix_tokens.index("cls"),),), source)
    return Readout("mean", ((PATCHES,),), source)


def pooled_over(prefix_tokens: tuple[str, ...], include_prefix: bool) -> Part:
    """The tokens a timm reduction pools over: the patches, also the prefix tokens with ``pool_include_prefix``."""
    return (*range(len(prefix_tokens)), PATCHES) if include_prefix else (PATCHES,)


def distilled_readout(prefix_tokens: tuple[str, ...], source: str) -> Readout:
    """The mean of the class and distillation tokens (DeiT-distilled heads in eval mode)."""
    return Readout("mean", ((prefix_tokens.index("cls"),), (prefix_tokens.index("dist"),)), source)


def timm_readout(model: nn.Module, prefix_tokens: tuple[str, ...], pool_attention: bool = False) -> Readout:
    """A timm model's readout, read as its ``forward_head`` reads the tokens.

    ``VisionTransformerDistilled`` (a ``head_dist``): ``(head(x[:, 0]) + head_dist(x[:, 1])) / 2`` whatever
    ``global_pool`` says; an ``attn_pool`` (``"map"``, ``"prr"``): attention pooling over the patch tokens (every
    token with ``pool_include_prefix``, and for ``Eva``, which hands them all to its pool); ``global_pool``
    ``"token"``: the class token, ``"avg"`` / ``"avgmax"`` / ``"max"``: the reduction over ``x[:, num_prefix_tokens:]`` (all
    tokens with ``pool_include_prefix``), ``""``: none. ``Beit``, ``VisionTransformerRelPos`` and ``Cait`` take the
    mean of the patch tokens for ``"avg"`` and the class token otherwise. ``pool_attention``: the family reads an
    ``attn_pool``'s attention (``Readout.pool_attention``).
    """
    pool = getattr(model, "global_pool", "token")
    include = getattr(model, "pool_include_prefix", None)  # VisionTransformer, NaFlexVit; Eva has none
    over = pooled_over(prefix_tokens, bool(include))
    src = f"timm global_pool={pool!r}"
    if getattr(model, "head_dist", None) is not None and "dist" in prefix_tokens and "cls" in prefix_tokens:
        return distilled_readout(prefix_tokens, "timm distilled head, eval mode")
    if getattr(model, "attn_pool", None) is not None:  # Eva's pool() hands every token to its attn_pool
        return Readout("attention-pool", (pooled_over(prefix_tokens, include is None or bool(include)),), src,
                       pool_attention)
    if not pool:
        return Readout("none", default_readout(prefix_tokens).parts, src)
    if pool == "token":
        return default_readout(prefix_tokens, src)
    if type(model).__name__ in ("Beit", "VisionTransformerRelPos", "Cait"):  # forward_head: avg, else x[:, 0]
        return Readout("mean", ((PATCHES,),), src) if pool == "avg" else default_readout(prefix_tokens, src)
    if pool in ("avg", "max", "avgmax"):
        return Readout("mean" if pool == "avg" else pool, (over,), src)
    return default_readout(prefix_tokens, src)


def query_mean(weights: torch.Tensor, queries: str) -> torch.Tensor:
    """``(B, H, L, N')`` pool attention -> ``(B, N')``: the heads averaged over the queries the output keeps
    (``"first"``: query 0, timm ``pool="token"`` and open_clip ``"tok"``; ``"rest"``: the mean of queries 1..,
    open_clip ``"avg"``; ``"all"``: the mean of every query)."""
    w = weights.detach().to(torch.promote_types(weights.dtype, torch.float32))
    picked = {"first": w[:, :, :1], "rest": w[:, :, 1:], "all": w}[queries]
    return picked.mean(dim=(1, 2))

