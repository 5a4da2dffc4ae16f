"""How a model pools its last block's tokens into one vector, applied to any block (``Family.pooled_token``).

``pool_tokens`` is timm's ``global_pool_nlc`` (``timm.models.vision_transformer``): ``"token"`` takes token 0;
``"avg"``, ``"avgmax"`` (``0.5 (max + mean)``) and ``"max"`` reduce the tokens after the prefix tokens (all tokens
with ``include_prefix``, timm's ``pool_include_prefix``). The families that read out by a reduction (timm
``global_pool``, Hugging Face BEiT's mean pooling and DINOv2's classifier, open_clip ``pool_type="avg"``) call it
from their ``pooled_token``; every other readout keeps the default of ``Family.pooled_token``: the class token
when there is one, else the mean of the patch tokens. An attention-pooling head (timm ``"map"``, SigLIP, open_clip's
attentional pooler) is trained on the last block's tokens only, so it is not applied to other blocks: they get
that default too.
"""

from __future__ import annotations

import torch
from torch import nn

from vitviz.errors import InputError

__all__ = ["REDUCTIONS", "pool_tokens", "timm_pooled_token"]

REDUCTIONS = ("avg", "avgmax", "max")  # readouts that reduce over tokens


def pool_tokens(tokens: torch.Tensor, pool: str, num_prefix_tokens: int, include_prefix: bool = False
                ) -> torch.Tensor:
    """``(B, N, D)`` -> ``(B, D)`` as timm's ``global_pool_nlc``: ``"token"``, ``"avg"``, ``"avgmax"``, ``"max"``."""
    if pool == "token":
        return tokens[:, 0]
    x = tokens if include_prefix else tokens[:, num_prefix_tokens:]
    if pool == "avg":
        return x.mean(dim=1)
    if pool == "avgmax":
        return 0.5 * (x.amax(dim=1) + x.mean(dim=1))
    if pool == "max":
        return x.amax(dim=1)
    raise InputError(f"pool={pool!r} is not one of ('token', {', '.join(map(repr, REDUCTIONS))}); pass one of "
                     "them (timm's global_pool names)")


def timm_pooled_token(model: nn.Module, tokens: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor | None:
    """A timm model's ``global_pool`` applied to ``tokens``; ``None`` where the default applies (``"token"``,
    no pooling, or an attention pool)."""
    pool = getattr(model, "global_pool", "token")
    if getattr(model, "attn_pool", None) is not None or pool not in REDUCTIONS:
        return None
    return pool_tokens(tokens, pool, num_prefix_tokens, bool(getattr(model, "pool_include_prefix", False)))
