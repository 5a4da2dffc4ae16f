"""Every vitviz call that takes a model leaves the model, and the process's global state, exactly as it was.

The model is made deliberately untidy first (``untouched.roughen``): its modules in mixed training/eval modes,
known ``.grad`` tensors on some parameters, some parameters frozen, a forward, a forward-pre and a full-backward
hook of the user's, ``fused_attn`` mixed across blocks. After each call ``untouched.unchanged`` compares bit for
bit: every parameter and buffer (values, dtype, device, the objects themselves), every ``.grad`` (the same tensor
with the same values; ``None`` stays ``None``), ``requires_grad``, every module's ``training`` flag, its hook dicts,
its attribute names (an instance ``forward``, a cache left behind) and ``fused_attn``, a Hugging Face config; and
the global state: grad mode, inference mode, anomaly mode, autocast, the torch / NumPy / Python random generators,
the thread count, the SDPA backend and MHA fast-path flags, deterministic algorithms, the default dtype, warnings
filters, the environment and matplotlib's rcParams. Calls stopped midway: ``test_model_unchanged_raises.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from untouched import MODELS, dataset, images, needs, roughen, unchanged

import vitviz


def _explorer(model, x):
    pytest.importorskip("ipywidgets")
    explorer = vitviz.explore_attention(model, x[:1], size=32)
    explorer.attentions(0)
    return explorer


def _reduce(model, x):
    from vitviz.analysis.distance import DistanceReduction

    return vitviz.reduce_dataset(model, dataset(x), DistanceReduction(model), batch_size=1)


CAPTUM = ("integrated_gradients", "input_x_gradient")
CALLS: dict[str, Callable] = {
    "inspect": lambda m, x: vitviz.inspect(m),
    "describe": lambda m, x: vitviz.describe(m, probe="qkv"),
    "load_images": lambda m, x: vitviz.load_images(m, x),
    "capture_attention-no-forward": lambda m, x: _enter_exit(m),
    **{f"explain-{meth}": (lambda m, x, meth=meth: vitviz.explain(m, x, meth, target=None if meth in (
        "attention", "rollout", "flow", "random") else [1, 0])) for meth in (
        "attention", "rollout", "flow", "grad_rollout", "chefer", "attnlrp", "random", *CAPTUM, "gradcam")},
    "attention_rollout": lambda m, x: vitviz.attention_rollout(m, x),
    "attention_flow": lambda m, x: vitviz.attention_flow(m, x),
    "grad_rollout": lambda m, x: vitviz.grad_rollout(m, x, target=1),
    "chefer_relevance": lambda m, x: vitviz.chefer_relevance(m, x, target=1),
    "attnlrp": lambda m, x: vitviz.attnlrp(m, x, target=1),
    "attnlrp-pixels": lambda m, x: vitviz.attnlrp(m, x, target=1, read_at="pixels", linear_rule="gamma"),
    "integrated_gradients": lambda m, x: vitviz.integrated_gradients(m, x, 1, n_steps=3),
    "input_x_gradient": lambda m, x: vitviz.input_x_gradient(m, x, 1),
    "gradcam": lambda m, x: vitviz.gradcam(m, x, 1),
    "mean_attention_distance": lambda m, x: vitviz.mean_attention_distance(m, x),
    "mean_attention_distance-dataset": lambda m, x: vitviz.mean_attention_distance(m, dataset(x), batch_size=1),
    "attention_statistics": lambda m, x: vitviz.attention_statistics(m, x),
    "attention_statistics-autocast": lambda m, x: vitviz.attention_statistics(m, x, autocast=torch.bfloat16),
    "reduce_dataset": _reduce,
    "pos_embed_similarity": lambda m, x: vitviz.pos_embed_similarity(m),
    "pos_embed_locality": lambda m, x: vitviz.pos_embed_locality(m),
    "embedding_filters": lambda m, x: vitviz.embedding_filters(m),
    "extract_features": lambda m, x: vitviz.extract_features(m, dataset(x), layers="all"),
    "extract_features-autocast": lambda m, x: vitviz.extract_features(m, dataset(x), autocast=torch.bfloat16),
    "knn_probe": lambda m, x: vitviz.knn_probe(m, dataset(x), dataset(x), k=1),
    "linear_fewshot": lambda m, x: vitviz.linear_fewshot(m, dataset(x), dataset(x), shots=(1,), seeds=[0]),
    "layer_probes": lambda m, x: vitviz.layer_probes(m, dataset(x), dataset(x), shots=(1,), seeds=[0]),
    "per_class_subset": lambda m, x: vitviz.per_class_subset(m, dataset(x), 1),
    "faithfulness": lambda m, x: vitviz.faithfulness(m, x, methods=["rollout", "chefer", "random"], target=1,
                                                     modes=("deletion",), steps=0.5, progress=False),
    "sanity_checks": lambda m, x: vitviz.sanity_checks(m, x, methods=["chefer", "rollout"],
                                                       tests=("cascading", "random_logit", "repeat")),
    "count_flops-forward": lambda m, x: vitviz.count_flops(m, (3, *x.shape[-2:])),
    "count_flops-backward": lambda m, x: vitviz.count_flops(m, (3, *x.shape[-2:]), backward=True),
    "plot_pos_embed": lambda m, x: vitviz.plot_pos_embed(m),
    "plot_pos_embed_similarity": lambda m, x: vitviz.plot_pos_embed_similarity(m),
    "plot_embedding_filters": lambda m, x: vitviz.plot_embedding_filters(m),
    "plot_filter_variance": lambda m, x: vitviz.plot_filter_variance(m),
    "plot_attention_distance": lambda m, x: vitviz.plot_attention_distance(m, x),
    "plot_attention_distance_grid": lambda m, x: vitviz.plot_attention_distance_grid({"a": m}, x),
    "plot_rollout": lambda m, x: vitviz.plot_rollout(m, x),
    "plot_attention_heads_grid": lambda m, x: vitviz.plot_attention_heads_grid(m, x[:1]),
    "plot_explanations_grid": lambda m, x: vitviz.plot_explanations_grid(m, x, {"chefer": vitviz.explain(m, x)}),
    "explore_attention": _explorer,
    "explore_pos_embed": lambda m, x: vitviz.explore_pos_embed(m, size=32),
}


def _score(out: torch.Tensor) -> torch.Tensor:
    """One score per image from a headless model's embedding (an open_clip tower's output): its norm."""
    return out.float().norm(dim=-1)


# the calls above that explain a class, with a score per image instead: a headless model refuses a class target
HEADLESS_CALLS: dict[str, Callable] = {
    **{f"explain-{meth}": (lambda m, x, meth=meth: vitviz.explain(m, x, meth, target=_score)) for meth in (
        "grad_rollout", "chefer", "attnlrp", *CAPTUM, "gradcam")},
    "grad_rollout": lambda m, x: vitviz.grad_rollout(m, x, target=_score),
    "chefer_relevance": lambda m, x: vitviz.chefer_relevance(m, x, target=_score),
    "attnlrp": lambda m, x: vitviz.attnlrp(m, x, target=_score),
    "attnlrp-pixels": lambda m, x: vitviz.attnlrp(m, x, target=_score, read_at="pixels", linear_rule="gamma"),
    "integrated_gradients": lambda m, x: vitviz.integrated_gradients(m, x, _score, n_steps=3),
    "input_x_gradient": lambda m, x: vitviz.input_x_gradient(m, x, _score),
    "gradcam": lambda m, x: vitviz.gradcam(m, x, _score),
    "faithfulness": lambda m, x: vitviz.faithfulness(m, x, methods=["rollout", "chefer", "random"], target=_score,
                                                     modes=("deletion",), steps=0.5, progress=False),
    "sanity_checks": lambda m, x: vitviz.sanity_checks(m, x, methods=["chefer", "rollout"], target=_score,
                                                       tests=("cascading", "random_logit", "repeat")),
    "plot_explanations_grid": lambda m, x: vitviz.plot_explanations_grid(
        m, x, {"chefer": vitviz.explain(m, x, target=_score)}),
}


def call_of(name: str, model: nn.Module) -> Callable:
    """``CALLS[name]``, with a score target for an open_clip tower (its output is an embedding, not logits)."""
    headless = type(model).__module__.split(".")[0] == "open_clip"
    return HEADLESS_CALLS.get(name, CALLS[name]) if headless else CALLS[name]


def _enter_exit(model):
    with vitviz.capture_attention(model, layers=[0, -1]):
        pass


def _call(name: str, model: nn.Module, x: torch.Tensor, family: str) -> None:
    import matplotlib.pyplot as plt

    try:
        call_of(name, model)(model, x)
    finally:
        plt.close("all")


def test_a_refused_call_leaves_everything_as_it_was():
    """A refusal leaves no trace either: AttnLRP on a whole open_clip CLIP model (its forward takes text; vitviz
    names ``model.visual``), after vitviz has read the model and chosen its rules."""
    open_clip = pytest.importorskip("open_clip")
    model = open_clip.CLIP(8, dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16),
                           dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1))
    roughen(model)
    x = images((32, 32))
    with unchanged(model):
        with pytest.raises(vitviz.UnsupportedModelError, match=r"model\.visual"):
            vitviz.explain(model, x, "attnlrp", target=lambda out: out[0].sum(-1))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_on_a_timm_vit_leaves_everything_as_it_was(name):
    needs(name)
    build, size = MODELS["timm"]
    model = build()
    roughen(model)
    x = images(size)
    with unchanged(model):
        _call(name, model, x, "timm")


HYBRID_CALLS = ("count_flops-forward", "count_flops-backward", "explain-chefer", "explain-attnlrp", "gradcam",
                "input_x_gradient", "mean_attention_distance", "extract_features", "faithfulness", "sanity_checks",
                "plot_embedding_filters", "plot_rollout")


@pytest.mark.parametrize("name", HYBRID_CALLS)
def test_a_call_on_a_hybrid_with_batchnorm_leaves_everything_as_it_was(name):
    needs(name)
    build, size = MODELS["hybrid"]
    model = build()
    roughen(model)
    assert any(isinstance(m, nn.BatchNorm2d) and m.training for m in model.modules())
    x = images(size)
    with unchanged(model):
        _call(name, model, x, "hybrid")


OTHER_CALLS = ("capture_attention-no-forward", "explain-chefer", "explain-grad_rollout", "explain-attnlrp",
               "attnlrp-pixels", "attention_rollout", "mean_attention_distance", "extract_features", "gradcam",
               "count_flops-forward", "count_flops-backward", "sanity_checks", "plot_pos_embed")


@pytest.mark.parametrize("family", ["huggingface", "torchvision", "open_clip"])
@pytest.mark.parametrize("name", OTHER_CALLS)
def test_a_call_on_other_families_leaves_everything_as_it_was(family, name):
    needs(name)
    build, size = MODELS[family]
    model = build()
    roughen(model)
    x = images(size)
    with unchanged(model):
        _call(name, model, x, family)
