"""Hugging Face BEiT (``BeitModel``, ``BeitForImageClassification``, ``BeitForMaskedImageModeling``), and data2vec
vision (``HFData2VecVisionFamily``: the same layout in transformers' older module layout).

Layout (``BeitEmbeddings``): ``[cls, patches]``. Position information is read from the config:

- ``use_relative_position_bias`` (one table per layer) or ``use_shared_relative_position_bias`` (one for the
  model): a learned relative position bias added to the attention scores before the softmax; there is no
  absolute table, ``pos_embed_kind="relative-bias"`` and ``pos_embed_similarity`` refuses (no table to compare).
- ``use_absolute_position_embeddings``: a learned absolute table ``(1, 1 + P, D)`` covering the class token,
  ``pos_embed_kind="learned"`` (``"learned+relative-bias"`` when a relative bias is used as well).

The captured maps are the post-softmax probabilities, bias included (what multiplies the values), exactly what
``output_attentions=True`` returns under the eager implementation.

Patch removal: tokens are dropped after the embeddings (position table added) and every relative position bias
(``BeitRelativePositionBias``, per layer or shared) is gathered over the kept tokens, so each kept pair keeps the
bias of its own positions; with ``use_mean_pooling`` (the default of the classification head) the readout is a mean
over patch tokens and the pixels are filled instead.
"""

from __future__ import annotations

import torch
from torch import nn

from vitviz.core.families.base import Undo, chain_undos
from vitviz.core.families.hf_base import HFVisionFamily, vision_config, vision_root
from vitviz.core.families.hf_probes import per_call_stream_probe_for, probe_hf_per_call
from vitviz.core.families.pooling import pool_tokens
from vitviz.core.families.readout import PATCHES, Readout
from vitviz.core.families.token_drop import gather_bias_hook, token_index


class HFBeitFamily(HFVisionFamily):
    model_types = ("beit",)

    def pos_embed_kind_of(self, model: nn.Module) -> str:
        c = vision_config(model)
        kinds = []
        if getattr(c, "use_absolute_position_embeddings", False):
            kinds.append("learned")
        if getattr(c, "use_relative_position_bias", False) or getattr(c, "use_shared_relative_position_bias", False):
            kinds.append("relative-bias")
        return "+".join(kinds) or "none"

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        p = vision_root(model)[1]
        # relative position bias tables: per layer, or one shared by the model
        comps["pos_embed"] = comps["pos_embed"] + (f"{p}shared_position_bias.",)
        return comps

    def pools_patches(self, model: nn.Module) -> bool:
        pooler = getattr(vision_root(model)[0], "pooler", None)
        return getattr(pooler, "layernorm", None) is not None  # BeitPooler: mean over patch tokens

    def pooled_token(self, model: nn.Module, tokens: torch.Tensor, prefix_tokens: tuple[str, ...]) -> torch.Tensor:
        """``use_mean_pooling``: the mean of the patch tokens (``BeitPooler``, before its layernorm); else the
        class token."""
        if self.pools_patches(model):
            return pool_tokens(tokens, "avg", len(prefix_tokens))
        return super().pooled_token(model, tokens, prefix_tokens)

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """``use_mean_pooling``: the mean of the patch tokens (``BeitPooler``: ``hidden_states[:, 1:].mean(1)``;
        data2vec vision: its pooler, or the pooling its missing pooler would do); else the class token."""
        if self.pools_patches(model):
            pooler = getattr(vision_root(model)[0], "pooler", None)
            name = type(pooler).__name__ if pooler is not None else "no pooler"
            return Readout("mean", ((PATCHES,),), f"{name}, use_mean_pooling")
        return super().readout(model, prefix_tokens)

    def drop_tokens(self, model: nn.Module, keep: torch.Tensor, num_prefix_tokens: int) -> Undo:
        undos = [super().drop_tokens(model, keep, num_prefix_tokens)]
        index = token_index(num_prefix_tokens, keep)
        undos += [gather_bias_hook(m, index) for m in model.modules()
                  if type(m).__name__.endswith("RelativePositionBias")]
        return chain_undos(undos)


class HFData2VecVisionFamily(HFBeitFamily):
    """Hugging Face data2vec vision (``Data2VecVisionModel``, ``Data2VecVisionForImageClassification``; Baevski et al.,
    "data2vec", ICML 2022): BEiT's layout, position options, pooling and patch removal (its model file is "Copied
    from transformers.models.beit"), in the older transformers layout that BEiT has left.

    Its self-attention (``encoder.layer[i].attention.attention``) computes the softmax itself (no attention
    interface) and returns the weights only when called with ``output_attentions=True``; the SDPA class the model
    is built with returns none. ``probe_hf_per_call`` runs the eager ``forward`` for the capture and reads its
    weights (``output_attentions`` passed down by the model gives the same maps, from a model built eager; the
    tests compare with it). Under ``heads="stream"`` the SDPA forward runs as it is and ``probe_hf_per_call_stream``
    recomputes the maps from its query and key projections and its bias.
    """

    model_types = ("data2vec-vision",)
    layer_paths = (("encoder.layer", "attention"),)
    probe = staticmethod(probe_hf_per_call)
    stream_probe = staticmethod(per_call_stream_probe_for)

    def pools_patches(self, model: nn.Module) -> bool:
        """The pooler's mean over patch tokens; also without a pooler (``Data2VecVisionModel`` is built without one by
        default) when ``config.use_mean_pooling``: the model then has no final norm (``layernorm`` is an identity)
        and its class token is not what its head reads."""
        root = vision_root(model)[0]
        if getattr(root, "pooler", None) is None:
            return bool(getattr(vision_config(model), "use_mean_pooling", False))
        return super().pools_patches(model)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        comps["pos_embed"] = comps["pos_embed"] + (f"{vision_root(model)[1]}encoder.relative_position_bias.",)
        return comps

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The self-attention inside each layer's ``attention`` wrapper (``Data2VecVisionAttention.attention``)."""
        out = []
        for name, wrapper in super().attention_modules(model):
            inner = getattr(wrapper, "attention", None)
            if not isinstance(inner, nn.Module) or not type(inner).__name__.endswith("SelfAttention"):
                raise self._fail(model, f"{name}.attention is a {type(inner).__name__}, not the self-attention "
                                        "module of this transformers version's data2vec vision")
            out.append((f"{name}.attention", inner))
        return out
