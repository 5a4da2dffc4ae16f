"""Hugging Face AIMv2 vision (``Aimv2VisionModel``, and the vision tower of ``Aimv2Model``; Fini et al.,
"Multimodal Autoregressive Pre-training of Large Vision Encoders", 2024).

Layout (``Aimv2VisionEmbeddings``): patches only, **no class token** (``prefix_tokens=()``): the patch projection,
an RMSNorm, then the position embedding added:

- ``config.is_native=False`` (the fixed-resolution checkpoints): a learned table, an ``nn.Embedding`` of ``P`` rows
  read as ``(1, P, D)``; the input must have the config's size.
- ``config.is_native=True``: a fixed 2-D sin-cos table built for every input's grid (``dynamic_img_size=True``),
  ``pos_embed_kind="sincos"``; ``pos_embed`` returns the table the model's own code builds for the config's
  grid (the embeddings run on a blank image with their RMSNorm's output replaced by zeros: what remains is the
  table the forward adds).

Blocks: pre-RMSNorm, attention through transformers' attention interface (read as every Hugging Face family),
a SwiGLU MLP (AttnLRP: the uniform rule on its product, ``lrp.GATE_FACTORS``). The image embedding
(``pooler_output``) comes from the attention-pooling head (``Aimv2AttentionPoolingHead``, ``use_head``): a learned
query (``head.cls_token``, no projection) attends over the final-normed patch tokens with ``head.k_proj`` keys, each
head at SDPA's default scale ``d ** -0.5``; it is the readout (``readout_attention``: that attention, recomputed
from the ``k_proj`` output during the forward pass, the heads averaged). Without a head the readout is the patch
mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Emit, Layout, Undo
from vitviz.core.families.hf_base import HFAttentionPoolFamily, vision_config, vision_root
from vitviz.core.families.readout import query_mean
from vitviz.core.util import pair


class HFAimv2Family(HFAttentionPoolFamily):
    model_types = ("aimv2", "aimv2_vision_model")
    layer_paths = (("encoder.layers", "attention"),)
    patch_conv_path = "patch_embed"
    pos_attr = "position_embedding"
    pool_class = "Aimv2AttentionPoolingHead"  # with use_head

    def _native(self, model: nn.Module) -> bool:
        return bool(getattr(vision_config(model), "is_native", False))

    def pos_embed_kind_of(self, model: nn.Module) -> str:
        return "sincos" if self._native(model) else "learned"

    def layout(self, model: nn.Module) -> Layout:
        return dataclasses.replace(super().layout(model), dynamic_img_size=self._native(model))

    def stored_pos_table(self, model: nn.Module) -> torch.Tensor | None:
        return None if self._native(model) else super().stored_pos_table(model)

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        """The learned table; for a native model the sin-cos table its embeddings add at the config's size."""
        if not self._native(model):
            return super().pos_embed(model)
        c = vision_config(model)
        return self._native_table(model, pair(c.image_size, "config.image_size"))

    def pos_embed_at(self, model: nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
        """A native model's sin-cos table built for ``grid`` (no resampling of the config-size table gives it);
        the learned table of a fixed-size model is resampled as timm does (``None``)."""
        if not self._native(model):
            return None
        (ph, pw) = pair(vision_config(model).patch_size, "config.patch_size")
        return self._native_table(model, (int(grid[0]) * ph, int(grid[1]) * pw))

    def _native_table(self, model: nn.Module, size: tuple[int, int]) -> torch.Tensor:
        """The sin-cos table a native model's embeddings add to a ``size`` input: the embeddings run on a blank
        image with their RMSNorm's output replaced by zeros."""
        emb, c = self.embeddings(model), vision_config(model)
        weight = emb.patch_embed.weight
        blank = torch.zeros(1, int(c.num_channels), *size, dtype=weight.dtype, device=weight.device)
        handle = emb.rms_norm.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))
        try:
            with torch.no_grad():
                return emb(blank)
        finally:
            handle.remove()

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        p = vision_root(model)[1]
        comps["norm"] = comps["norm"] + (f"{p}rms_norm.", f"{p}embeddings.rms_norm.")
        return comps

    def pool_probe(self, head: nn.Module, emit: Emit) -> Undo:
        return probe_aimv2_pool(head, emit)


def probe_aimv2_pool(head: nn.Module, emit: Emit) -> Undo:
    """``Aimv2AttentionPoolingHead``: each call emits its query's attention over the tokens ``(B, N)``, the heads
    averaged (``query_mean``), recomputed as ``softmax(q k^T * d ** -0.5)`` from its ``cls_token`` (the query, split
    into heads) and its ``k_proj`` output (the SDPA call keeps running)."""
    seen: dict[str, torch.Tensor] = {}

    def after(module: nn.Module, _args: Any, _out: Any) -> None:
        k = seen.pop("k")
        b, n, dim = k.shape
        h = int(module.num_heads)
        dtype = torch.promote_types(k.dtype, torch.float32)
        k = k.detach().to(dtype).reshape(b, n, h, dim // h).transpose(1, 2)  # (B, H, N, d)
        q = module.cls_token.detach().to(dtype).reshape(1, h, 1, dim // h)
        emit(query_mean(torch.softmax((q * (dim // h) ** -0.5) @ k.transpose(-2, -1), dim=-1), "first"))

    handles = [head.k_proj.register_forward_hook(lambda _m, _i, out: seen.__setitem__("k", out)),
               head.register_forward_hook(after)]

    def undo() -> None:
        for handle in handles:
            handle.remove()

    return undo
