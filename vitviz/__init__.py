"""vitviz: analysis and visualization of Vision Transformers.

Data flows one way: model -> capture -> analysis -> plot -> widgets / report (``docs/architecture.md``). Every
public name below is imported on first use (PEP 562), so ``import vitviz`` loads neither torch nor matplotlib
until a call needs them, and ``python -m vitviz --help`` answers at once. The error classes are cheap and eager.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from vitviz.errors import (
    CaptureError,
    CheckpointError,
    ImageInputError,
    InputError,
    MissingDependencyError,
    NoPositionEmbeddingError,
    NoRGBFiltersError,
    NoSuchAttributeError,
    NotAViTError,
    UnsupportedModelError,
    VitvizError,
    WeightsUnavailableError,
)

__version__ = "0.1.0"

# public name -> module, imported on first attribute access (PEP 562); grouped by layer
_LAZY = {
    # core: model access
    "inspect": "vitviz.core.spec",
    "ViTSpec": "vitviz.core.spec",
    "describe": "vitviz.core.families",
    "register_family": "vitviz.core.families",
    "capture_attention": "vitviz.core.capture",
    "AttentionCapture": "vitviz.core.capture",
    "HeadMaps": "vitviz.core.capture",
    "headmap_kernel": "vitviz.core.kernels",
    "graphed": "vitviz.core.graphs",
    "GraphedCall": "vitviz.core.graphs",
    "load_images": "vitviz.core.images",
    "save_arrays": "vitviz.core.io",
    "reduce_dataset": "vitviz.core.datasets",
    # analysis: tensors in, tensors out
    "pos_embed_similarity": "vitviz.analysis.posembed",
    "pos_embed_locality": "vitviz.analysis.posembed",
    "embedding_filters": "vitviz.analysis.filters",
    "filter_pca": "vitviz.analysis.filters",
    "count_flops": "vitviz.analysis.flops",
    "attention_rollout": "vitviz.analysis.rollout",
    "grad_rollout": "vitviz.analysis.relevance",
    "rollout_from_attentions": "vitviz.analysis.rollout",
    "mean_attention_distance": "vitviz.analysis.distance",
    "attention_statistics": "vitviz.analysis.attention_stats",
    "distance_table": "vitviz.analysis.tables",
    "depth_trend": "vitviz.analysis.trends",
    "explain": "vitviz.analysis.explain",
    "chefer_relevance": "vitviz.analysis.relevance",
    "attnlrp": "vitviz.analysis.attnlrp",
    "attention_flow": "vitviz.analysis.flow",
    "fuse_heads": "vitviz.analysis.propagation",
    "propagate": "vitviz.analysis.propagation",
    "LayerRule": "vitviz.analysis.propagation",
    "Propagator": "vitviz.analysis.propagation",
    "faithfulness": "vitviz.analysis.faithfulness",
    "faithfulness_auc": "vitviz.analysis.faithfulness_stats",
    "bootstrap_ci": "vitviz.analysis.faithfulness_stats",
    "compare_methods": "vitviz.analysis.faithfulness_stats",
    "sanity_checks": "vitviz.analysis.sanity",
    "sanity_summary": "vitviz.analysis.sanity",
    "integrated_gradients": "vitviz.analysis.baselines",
    "input_x_gradient": "vitviz.analysis.baselines",
    "gradcam": "vitviz.analysis.baselines",
    "linear_fewshot": "vitviz.analysis.representations",
    "knn_probe": "vitviz.analysis.representations",
    "layer_probes": "vitviz.analysis.representations",
    "summarize_probes": "vitviz.analysis.representations",
    "per_class_subset": "vitviz.analysis.representations",
    "extract_features": "vitviz.core.features",
    # zoo: models to analyse, the paper's tables, the reference models' cards
    "load_model": "vitviz.zoo.models",
    "load_model_or_random": "vitviz.zoo.models",
    "paper_results": "vitviz.zoo.paper",
    "reference_table": "vitviz.zoo.cards",
    "reference_compute": "vitviz.zoo.cards",
    "posemb_ablation_results": "vitviz.zoo.cards",
    "posemb_ablation_gaps": "vitviz.zoo.cards",
    # plot: figures in the house style; axes-level plot_<thing>(..., *, ax=None) -> Axes, figure-level names end
    # in _grid (or are the paper's multi-panel figures plot_rollout, plot_compute_curves) -> Figure
    "plot_pos_embed": "vitviz.plot.posembed",
    "plot_pos_embed_similarity": "vitviz.plot.posembed",
    "plot_posemb_ablation_grid": "vitviz.plot.posembed",
    "plot_embedding_filters": "vitviz.plot.filters",
    "plot_filter_variance": "vitviz.plot.filters",
    "plot_compute_curves": "vitviz.plot.compute",
    "plot_compute_panel": "vitviz.plot.compute",
    "plot_study_runs": "vitviz.plot.compute",
    "plot_matched_gap": "vitviz.plot.compute",
    "plot_study_grid": "vitviz.plot.compute",
    "plot_rollout": "vitviz.plot.attention",
    "plot_attention_heads_grid": "vitviz.plot.attention",
    "plot_attention_distance": "vitviz.plot.attention",
    "plot_attention_distance_grid": "vitviz.plot.attention",
    "plot_faithfulness": "vitviz.plot.faithfulness",
    "plot_faithfulness_grid": "vitviz.plot.faithfulness",
    "plot_explanations_grid": "vitviz.plot.faithfulness",
    "plot_level": "vitviz.plot.style",
    "plot_sanity_checks": "vitviz.plot.sanity",
    "plot_layer_probes": "vitviz.plot.probes",
    "plot_cls_vs_gap": "vitviz.plot.probes",
    "plot_posemb_seeds": "vitviz.plot.probes",
    "plot_posemb_seeds_grid": "vitviz.plot.probes",
    "save_figure": "vitviz.plot.style",
    "Saver": "vitviz.plot.style",
    # widgets
    "explore_attention": "vitviz.widgets",
    "explore_pos_embed": "vitviz.widgets",
}

__all__ = [
    "CaptureError", "CheckpointError", "ImageInputError", "InputError", "MissingDependencyError",
    "NoPositionEmbeddingError",
    "NoRGBFiltersError", "NotAViTError", "UnsupportedModelError", "VitvizError", "WeightsUnavailableError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise NoSuchAttributeError(f"module 'vitviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (what a notebook's tab completion offers) and the subpackages already imported; not the
    module's own imports (``importlib``, ``Any``, ``annotations``)."""
    loaded = {name for name, value in globals().items()
              if isinstance(value, ModuleType) and value.__name__ == f"{__name__}.{name}"}
    return sorted({*__all__, *loaded})
