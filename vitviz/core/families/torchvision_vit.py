"""``torchvision.models.VisionTransformer`` (``vit_b_16`` and friends).

Attention: ``probe_mha`` reads the per-head weights (``need_weights=True``); reductions (``heads="stream"``) use
``stream.probe_mha_stream``, which leaves the forward untouched and recomputes the maps from ``q`` and ``k``.
A capture in training mode with ``attention_dropout > 0`` is refused with ``CaptureError`` (the weights
``nn.MultiheadAttention`` returns are the dropped-out ones): call ``model.eval()`` first.

Patch removal: tokens are dropped after ``encoder.dropout`` (the position embedding added); the readout is the
class token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Family, Layout, Undo
from vitviz.core.families.probes import probe_mha, refuse_mha_dropout
from vitviz.core.families.stream import mha_stream_probe_for


class TorchvisionFamily(Family):
    name = "torchvision"
    probe = staticmethod(probe_mha)
    stream_probe = staticmethod(mha_stream_probe_for)  # the fused forward kept, maps recomputed (core/families/stream)

    def match(self, model: nn.Module) -> bool:
        return any(
            c.__name__ == "VisionTransformer" and c.__module__ == "torchvision.models.vision_transformer"
            for c in type(model).__mro__
        )

    def layout(self, model: nn.Module) -> Layout:
        size, patch = int(model.image_size), int(model.patch_size)
        layers = list(model.encoder.layers)
        return Layout(
            img_size=(size, size),
            patch_size=(patch, patch),
            grid_size=(size // patch, size // patch),
            prefix_tokens=("cls",),
            pos_embed_kind="learned",
            pos_embed_covers_prefix=True,
            depth=len(layers),
            num_heads=int(layers[0].self_attention.num_heads) if layers else 0,
            embed_dim=int(model.hidden_dim),
        )

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(f"encoder.layers.{i}.self_attention", layer.self_attention)
                for i, layer in enumerate(model.encoder.layers)]

    def prepare(self, model: nn.Module) -> Undo:
        """Refuse training mode with attention dropout (``nn.MultiheadAttention`` returns the dropped-out weights)."""
        refuse_mha_dropout(model, self.attention_modules(model), self.name)
        return lambda: None

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        return model.encoder.pos_embedding

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return model.conv_proj

    def stem_conv(self, model: nn.Module) -> nn.Conv2d | None:
        return next((m for m in model.conv_proj.modules() if isinstance(m, nn.Conv2d) and m.in_channels == 3), None)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        return {
            "patch_embed": ("conv_proj.",),
            "pos_embed": ("encoder.pos_embedding",),
            "prefix_tokens": ("class_token",),
            "blocks": ("encoder.layers.",),
            "norm": ("encoder.ln.",),
            "head": ("heads.",),
        }

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        size = int(model.image_size)
        return {"input_size": (3, size, size), "interpolation": "bilinear", "mean": IMAGENET_DEFAULT_MEAN,
                "std": IMAGENET_DEFAULT_STD, "crop_pct": 0.875, "crop_mode": "center"}

    def token_drop_module(self, model: nn.Module) -> nn.Module | None:
        return model.encoder.dropout

    def lrp_rules(self, model: nn.Module, rules: Any, emit: Any) -> Any:
        from vitviz.core.families.lrp_families import torchvision_rules

        return torchvision_rules(model, rules, emit)
