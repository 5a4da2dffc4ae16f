"""Hugging Face ``ViTModel`` / ``ViTForImageClassification`` (transformers >= 5), any attention implementation."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Family, Layout, probe_hf


def _root(model: nn.Module) -> tuple[nn.Module, str]:
    return (model.vit, "vit.") if hasattr(model, "vit") else (model, "")


class HuggingFaceFamily(Family):
    name = "huggingface"
    probe = staticmethod(probe_hf)

    def match(self, model: nn.Module) -> bool:
        config = getattr(model, "config", None)
        return type(model).__module__.startswith("transformers.") and getattr(config, "model_type", None) == "vit"

    def layout(self, model: nn.Module) -> Layout:
        c = model.config
        size = c.image_size if isinstance(c.image_size, (tuple, list)) else (c.image_size, c.image_size)
        patch = c.patch_size if isinstance(c.patch_size, (tuple, list)) else (c.patch_size, c.patch_size)
        return Layout(
            img_size=(int(size[0]), int(size[1])),
            patch_size=(int(patch[0]), int(patch[1])),
            grid_size=(int(size[0]) // int(patch[0]), int(size[1]) // int(patch[1])),
            prefix_tokens=("cls",),
            pos_embed_kind="learned",
            pos_embed_covers_prefix=True,
            depth=int(c.num_hidden_layers),
            num_heads=int(c.num_attention_heads),
            embed_dim=int(c.hidden_size),
        )

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        root, prefix = _root(model)
        if hasattr(root, "layers"):  # transformers >= 5.2
            path, layers = "layers", root.layers
            return [(f"{prefix}{path}.{i}.attention", layer.attention) for i, layer in enumerate(layers)]
        # transformers 5.0 and 5.1: ViTAttention wraps ViTSelfAttention, the module that returns the weights
        path, layers = "encoder.layer", root.encoder.layer
        out = []
        for i, layer in enumerate(layers):
            inner = getattr(layer.attention, "attention", None)
            if isinstance(inner, nn.Module):
                out.append((f"{prefix}{path}.{i}.attention.attention", inner))
            else:
                out.append((f"{prefix}{path}.{i}.attention", layer.attention))
        return out

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        return _root(model)[0].embeddings.position_embeddings

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return _root(model)[0].embeddings.patch_embeddings.projection

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        p = _root(model)[1]
        return {
            "patch_embed": (f"{p}embeddings.patch_embeddings.",),
            "pos_embed": (f"{p}embeddings.position_embeddings",),
            "prefix_tokens": (f"{p}embeddings.cls_token", f"{p}embeddings.mask_token"),
            "blocks": (f"{p}layers.", f"{p}encoder."),
            "norm": (f"{p}layernorm.",),
            "head": ("classifier.", f"{p}pooler."),
        }

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        h, w = self.layout(model).img_size
        # ViTImageProcessor's defaults: resize straight to the input size, mean = std = 0.5.
        return {"input_size": (3, h, w), "interpolation": "bilinear", "mean": (0.5, 0.5, 0.5),
                "std": (0.5, 0.5, 0.5), "crop_pct": 1.0, "crop_mode": "squash"}
