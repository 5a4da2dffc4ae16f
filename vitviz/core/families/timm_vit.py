"""timm Vision Transformers: ``VisionTransformer`` and subclasses (DeiT-distilled, registers, hybrids, Eva)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Family, Layout, probe_attn_drop
from vitviz.core.util import pair
from vitviz.errors import VitvizError


def _is_timm(model: nn.Module) -> bool:
    return any(c.__module__.startswith("timm.") for c in type(model).__mro__)


class TimmFamily(Family):
    name = "timm"
    probe = staticmethod(probe_attn_drop)

    def match(self, model: nn.Module) -> bool:
        return (
            _is_timm(model)
            and hasattr(model, "num_prefix_tokens")
            and hasattr(getattr(model, "patch_embed", None), "grid_size")
            and isinstance(getattr(model, "blocks", None), nn.Module)
        )

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        tokens: list[str] = []
        if getattr(model, "cls_token", None) is not None:
            tokens.append("cls")
        if getattr(model, "dist_token", None) is not None:
            tokens.append("dist")
        reg = getattr(model, "reg_token", None)
        if reg is not None:
            tokens += ["reg"] * reg.shape[1]
        if len(tokens) != model.num_prefix_tokens:
            tokens = ["prefix"] * model.num_prefix_tokens
        return tuple(tokens)

    def layout(self, model: nn.Module) -> Layout:
        pe = model.patch_embed
        grid = pair(pe.grid_size)
        stride = pair(pe.feat_ratio(as_scalar=False)) if hasattr(pe, "feat_ratio") else pair(pe.patch_size)
        img = pair(pe.img_size) if getattr(pe, "img_size", None) is not None else (grid[0] * stride[0],
                                                                                     grid[1] * stride[1])
        prefix = self.prefix_tokens(model)
        pos = self.pos_embed(model)
        kind = getattr(model, "pos_embed_kind", None)
        covers = False
        if pos is None:
            kind = kind or ("rotary" if getattr(model, "rope", None) is not None else "none")
        else:
            if not kind:
                trainable = isinstance(pos, nn.Parameter) and pos.requires_grad
                kind = "learned" if trainable else "sincos"
            num_patches = grid[0] * grid[1]
            if pos.shape[1] == num_patches + len(prefix) and len(prefix) and not getattr(model, "no_embed_class",
                                                                                          False):
                covers = True
            elif pos.shape[1] != num_patches:
                raise VitvizError(
                    f"{type(model).__name__}: pos_embed has {pos.shape[1]} rows but the {grid[0]}x{grid[1]} grid "
                    f"has {num_patches} patches and {len(prefix)} prefix tokens; the model is inconsistent"
                )
        blocks = list(model.blocks)
        attn = getattr(blocks[0], "attn", None) if blocks else None
        return Layout(
            img_size=img,
            patch_size=stride,
            grid_size=grid,
            prefix_tokens=prefix,
            pos_embed_kind=kind,
            pos_embed_covers_prefix=covers,
            depth=len(blocks),
            num_heads=int(getattr(attn, "num_heads", 0)),
            embed_dim=int(model.embed_dim),
            hybrid=hasattr(pe, "backbone"),
            dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
        )

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(f"blocks.{i}.attn", b.attn) for i, b in enumerate(model.blocks) if hasattr(b, "attn")]

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        return getattr(model, "pos_embed", None)

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return getattr(model.patch_embed, "proj", None)

    def stem_conv(self, model: nn.Module) -> nn.Conv2d | None:
        backbone = getattr(model.patch_embed, "backbone", None)
        if backbone is None:
            return super().stem_conv(model)
        return next((m for m in backbone.modules() if isinstance(m, nn.Conv2d) and m.in_channels == 3), None)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        return {
            "patch_embed": ("patch_embed.",),
            "pos_embed": ("pos_embed",),
            "prefix_tokens": ("cls_token", "dist_token", "reg_token"),
            "blocks": ("blocks.",),
            "norm": ("norm_pre.", "norm."),
            "head": ("fc_norm.", "attn_pool.", "head.", "head_dist."),
        }

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        from timm.data import resolve_data_config

        return resolve_data_config(model=model)
