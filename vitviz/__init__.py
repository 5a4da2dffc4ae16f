"""vitviz: analysis and visualization of Vision Transformers.

Data flows one way: model -> capture -> compute -> plot. Plotting modules (matplotlib) and widgets are imported
on first use, so ``import vitviz`` costs little more than ``import torch, timm``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from vitviz.capture import AttentionCapture, CaptureError, capture_attention
from vitviz.checkpoints import CheckpointError
from vitviz.families import NotAViTError, VitvizError, describe, register_family
from vitviz.images import ImageInputError, load_images
from vitviz.models import WeightsUnavailableError, load_model
from vitviz.spec import ViTSpec, inspect

# name -> module, imported on first attribute access (PEP 562)
_LAZY = {
    "pos_embed_similarity": "vitviz.posembed",
    "pos_embed_locality": "vitviz.posembed",
    "embedding_filters": "vitviz.filters",
    "filter_pca": "vitviz.filters",
    "plot_pos_embed": "vitviz.plot.posembed",
    "plot_pos_embed_similarity": "vitviz.plot.posembed",
    "plot_posemb_ablation": "vitviz.plot.posembed",
    "plot_embedding_filters": "vitviz.plot.filters",
    "plot_filter_variance": "vitviz.plot.filters",
    "save_figure": "vitviz.plot.style",
    "paper_results": "vitviz.paper",
    "plot_compute_curves": "vitviz.plot.compute",
    "count_flops": "vitviz.flops",
    "attention_rollout": "vitviz.rollout",
    "grad_rollout": "vitviz.rollout",
    "rollout_from_attentions": "vitviz.rollout",
    "mean_attention_distance": "vitviz.distance",
    "plot_rollout": "vitviz.plot.attention",
    "plot_attention_heads": "vitviz.plot.attention",
    "plot_attention_distance": "vitviz.plot.attention",
    "plot_attention_distance_grid": "vitviz.plot.attention",
    "load_model_or_random": "vitviz.models",
    "explore_attention": "vitviz.widgets",
    "explore_pos_embed": "vitviz.widgets",
    "save_arrays": "vitviz._io",
}

__all__ = [
    "AttentionCapture", "CaptureError", "CheckpointError", "ImageInputError", "NotAViTError", "ViTSpec",
    "VitvizError", "WeightsUnavailableError", "capture_attention", "describe", "inspect", "load_images",
    "load_model", "register_family", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
