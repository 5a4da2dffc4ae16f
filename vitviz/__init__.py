"""vitviz: analysis and visualization of Vision Transformers.

Data flows one way: model -> capture -> compute -> plot. Plotting modules (matplotlib) and widgets are imported
on first use, so ``import vitviz`` costs little more than ``import torch, timm``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from vitviz.core.capture import AttentionCapture, capture_attention
from vitviz.core.families import describe, register_family
from vitviz.core.images import load_images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.errors import (
    CaptureError,
    CheckpointError,
    ImageInputError,
    NotAViTError,
    VitvizError,
    WeightsUnavailableError,
)
from vitviz.zoo.models import load_model

# name -> module, imported on first attribute access (PEP 562)
_LAZY = {
    "pos_embed_similarity": "vitviz.analysis.posembed",
    "pos_embed_locality": "vitviz.analysis.posembed",
    "embedding_filters": "vitviz.analysis.filters",
    "filter_pca": "vitviz.analysis.filters",
    "plot_pos_embed": "vitviz.plot.posembed",
    "plot_pos_embed_similarity": "vitviz.plot.posembed",
    "plot_posemb_ablation": "vitviz.plot.posembed",
    "plot_embedding_filters": "vitviz.plot.filters",
    "plot_filter_variance": "vitviz.plot.filters",
    "save_figure": "vitviz.plot.style",
    "Saver": "vitviz.plot.style",
    "paper_results": "vitviz.zoo.paper",
    "plot_compute_curves": "vitviz.plot.compute",
    "count_flops": "vitviz.analysis.flops",
    "attention_rollout": "vitviz.analysis.rollout",
    "grad_rollout": "vitviz.analysis.rollout",
    "rollout_from_attentions": "vitviz.analysis.rollout",
    "mean_attention_distance": "vitviz.analysis.distance",
    "attention_statistics": "vitviz.analysis.attention_stats",
    "reduce_dataset": "vitviz.core.datasets",
    "plot_rollout": "vitviz.plot.attention",
    "plot_attention_heads": "vitviz.plot.attention",
    "plot_attention_distance": "vitviz.plot.attention",
    "plot_attention_distance_grid": "vitviz.plot.attention",
    "load_model_or_random": "vitviz.zoo.models",
    "explore_attention": "vitviz.widgets",
    "explore_pos_embed": "vitviz.widgets",
    "save_arrays": "vitviz.core.io",
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
