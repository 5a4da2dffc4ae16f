"""Hugging Face DINOv2 (``Dinov2Model``) and DINOv2 with registers (``Dinov2WithRegistersModel``).

Layout (``Dinov2Embeddings``): ``[cls, patches]``; with registers (``Dinov2WithRegistersEmbeddings``)
``[cls, reg * config.num_register_tokens, patches]``. The learned absolute table ``(1, 1 + P, D)`` covers the
class token only (registers get no position). The model bicubically interpolates its table to whatever input it
is given (``Dinov2Embeddings.interpolate_pos_encoding`` runs on every call), so the grid follows the input:
``dynamic_img_size=True`` and ``spec.grid_for_input(x)`` is ``(H // patch, W // patch)``.

Patch removal: tokens are dropped at ``embeddings.dropout`` (table interpolated and added) for ``Dinov2Model``
(its pooled output is the class token); ``Dinov2ForImageClassification`` reads the mean of the patch tokens too,
so its pixels are filled instead.
"""

from __future__ import annotations

import torch
from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily, vision_config
from vitviz.core.families.pooling import pool_tokens
from vitviz.core.families.readout import PATCHES, Readout
from vitviz.core.util import pair


class HFDinov2Family(HFVisionFamily):
    model_types = ("dinov2",)
    layer_paths = (("encoder.layer", "attention"), ("layers", "attention"))
    dynamic_img_size = True
    # the authors' code normalises with the ImageNet mean and std (timm IMAGENET_DEFAULT_MEAN / _STD)
    authors_mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def pools_patches(self, model: nn.Module) -> bool:
        # Dinov2ForImageClassification classifies [cls, mean of the patch tokens]; Dinov2Model pools the cls token
        return type(model).__name__.endswith("ForImageClassification")

    def pooled_token(self, model: nn.Module, tokens: torch.Tensor, prefix_tokens: tuple[str, ...]) -> torch.Tensor:
        """The classifier's input ``[cls, mean of the patch tokens]`` ``(B, 2D)`` (registers left out of the mean)
        for ``Dinov2ForImageClassification``; the class token (``pooler_output``'s token) for the backbone."""
        if self.pools_patches(model):
            return torch.cat([tokens[:, 0], pool_tokens(tokens, "avg", len(prefix_tokens))], dim=-1)
        return super().pooled_token(model, tokens, prefix_tokens)

    def pos_embed_at(self, model: nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
        """The table the embeddings add for a ``grid`` input, from their own ``interpolate_pos_encoding``
        (``Dinov2Model``: bicubic without antialiasing, unlike timm's resampling; with registers: antialiased),
        laid out as ``pos_embed``."""
        emb = self.embeddings(model)
        table = emb.position_embeddings
        (ph, pw), (gh, gw) = pair(emb.patch_embeddings.patch_size), grid
        tokens = torch.zeros(1, 1 + gh * gw, table.shape[-1], dtype=table.dtype, device=table.device)
        with torch.no_grad():
            full = emb.interpolate_pos_encoding(tokens, gh * ph, gw * pw)
        return full if self.pos_embed_covers_prefix else full[:, 1:]

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """``Dinov2ForImageClassification``: one linear head on ``[cls, mean of the patch tokens]``, the two parts
        given equal weight; the backbone: the class token."""
        if self.pools_patches(model):
            return Readout("concat", ((0,), (PATCHES,)), "Dinov2ForImageClassification")
        return super().readout(model, prefix_tokens)


class HFDinov2RegistersFamily(HFDinov2Family):
    model_types = ("dinov2_with_registers",)
    processor_type = "dinov2"  # the register checkpoints use DINOv2's image processor

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ("cls",) + ("reg",) * int(vision_config(model).num_register_tokens)

    # the table covers only the class token; the registers sit between it and the patches
    pos_embed_covers_prefix = False

    def pos_embed(self, model: nn.Module):
        table = super().pos_embed(model)
        return None if table is None else table[:, 1:]
