"""The plot API's one rule, checked on every public plot function of ``vitviz._LAZY``.

Axes-level ``plot_<thing>(data, *, ax=None, ...)`` take ``ax`` keyword-only and return the ``Axes`` (the one
given, when given); figure-level functions (names ending in ``_grid``, and the paper's ``plot_rollout`` and
``plot_compute_curves``) take no ``ax`` and return a ``Figure``. No default colormap is ``jet``. A new public plot
function fails ``test_every_plot_function_is_called`` until it gets a call below.
"""

from __future__ import annotations

import inspect

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import tiny_study_runs, tiny_timm_vit  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import vitviz  # noqa: E402
from vitviz.experiments.cls_vs_gap import read_cls_vs_gap  # noqa: E402
from vitviz.experiments.posemb_seeds import read_posemb_seeds  # noqa: E402
from vitviz.plot.style import PAPER_FIGURES, plot_level  # noqa: E402

PUBLIC_PLOTS = sorted(n for n in vitviz._LAZY if n.startswith("plot_") and n != "plot_level")
UNIFORM = {"viridis", "magma", "cividis", "inferno", "plasma", "RdBu_r", "coolwarm", "vlag", "icefire"}


def _study_runs() -> pd.DataFrame:
    return tiny_study_runs()


def _curves(modes=("deletion", "insertion")) -> pd.DataFrame:
    rows = [{"mode": m, "method": meth, "fraction": f, "score": s, "metric": "probability", "removal": "drop",
             "image": i}
            for m in modes for meth in ("random", "rollout") for i in range(3)
            for f, s in ((0.0, 0.9), (0.5, 0.5), (1.0, 0.1))]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_timm_vit()


def _calls(model) -> dict:
    """name -> a call taking ``**kw`` (``ax=`` for axes-level functions) on tiny inputs."""
    x = torch.randn(2, 3, 32, 48)
    maps = {"rollout": vitviz.explain(model, x, "rollout"), "random": vitviz.explain(model, x, "random")}
    runs = _study_runs()
    return {
        "plot_pos_embed": lambda **kw: vitviz.plot_pos_embed(model, **kw),
        "plot_pos_embed_similarity": lambda **kw: vitviz.plot_pos_embed_similarity(
            vitviz.pos_embed_similarity(model), (1, 2), **kw),
        "plot_posemb_ablation_grid": lambda **kw: vitviz.plot_posemb_ablation_grid(**kw),
        "plot_embedding_filters": lambda **kw: vitviz.plot_embedding_filters(model, **kw),
        "plot_filter_variance": lambda **kw: vitviz.plot_filter_variance(np.array([0.5, 0.3, 0.2]), **kw),
        "plot_compute_curves": lambda **kw: vitviz.plot_compute_curves(**kw),
        "plot_compute_panel": lambda **kw: vitviz.plot_compute_panel(vitviz.paper_results(), "imagenet", **kw),
        "plot_study_runs": lambda **kw: vitviz.plot_study_runs(runs, **kw),
        "plot_matched_gap": lambda **kw: vitviz.plot_matched_gap(runs, **kw),
        "plot_study_grid": lambda **kw: vitviz.plot_study_grid(runs, **kw),
        "plot_rollout": lambda **kw: vitviz.plot_rollout(model, x, **kw),
        "plot_attention_heads_grid": lambda **kw: vitviz.plot_attention_heads_grid(model, x[:1], **kw),
        "plot_attention_distance": lambda **kw: vitviz.plot_attention_distance(np.ones((2, 3)), **kw),
        "plot_attention_distance_grid": lambda **kw: vitviz.plot_attention_distance_grid(
            {"a": np.ones((2, 3)), "b": np.ones((2, 3))}, **kw),
        "plot_faithfulness": lambda **kw: vitviz.plot_faithfulness(_curves(), mode="deletion", **kw),
        "plot_faithfulness_grid": lambda **kw: vitviz.plot_faithfulness_grid(_curves(), **kw),
        "plot_explanations_grid": lambda **kw: vitviz.plot_explanations_grid(model, x, maps, **kw),
        "plot_layer_probes": lambda **kw: vitviz.plot_layer_probes(pd.DataFrame(
            [{"model": "m", "layer": f"block{d}", "depth": d + 1, "probe": "linear", "shots": 5, "seed": s,
              "accuracy": 10.0 * d + s} for d in range(3) for s in range(2)]), **kw),
        "plot_cls_vs_gap": lambda **kw: vitviz.plot_cls_vs_gap(read_cls_vs_gap(), **kw),
        "plot_posemb_seeds": lambda **kw: vitviz.plot_posemb_seeds(read_posemb_seeds(), **kw),
        "plot_posemb_seeds_grid": lambda **kw: vitviz.plot_posemb_seeds_grid(**kw),
        "plot_sanity_checks": lambda **kw: vitviz.plot_sanity_checks(
            vitviz.sanity_checks(model.eval(), x, methods=["chefer"], tests=("cascading",)), **kw),
    }


def test_every_plot_function_is_called(model):
    assert set(_calls(model)) == set(PUBLIC_PLOTS), "give each public plot function a call in _calls"


def test_the_rule_is_read_from_the_name():
    assert plot_level("plot_rollout") == "figure" and plot_level("plot_compute_curves") == "figure"
    assert plot_level("plot_study_grid") == "figure" and plot_level("plot_attention_distance") == "axes"
    assert set(PAPER_FIGURES) <= set(PUBLIC_PLOTS)


@pytest.mark.parametrize("name", PUBLIC_PLOTS)
def test_signature_follows_the_rule(name):
    params = inspect.signature(getattr(vitviz, name)).parameters
    if plot_level(name) == "axes":
        assert "ax" in params and params["ax"].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params["ax"].default is None, name
        assert "fig" not in params, name
    else:
        assert "ax" not in params, f"{name} is figure-level by its name but takes ax"
        if "fig" in params:
            assert params["fig"].kind is inspect.Parameter.KEYWORD_ONLY, name
    for pname, p in params.items():
        if "cmap" in pname and p.default is not inspect.Parameter.empty:
            assert p.default != "jet", f"{name}({pname}=...) defaults to jet"
            assert p.default is None or p.default in UNIFORM, f"{name}({pname}={p.default!r})"


@pytest.mark.parametrize("name", PUBLIC_PLOTS)
def test_return_type_follows_the_rule(name, model):
    call = _calls(model)[name]
    try:
        if plot_level(name) == "axes":
            out = call()
            assert isinstance(out, Axes) and not isinstance(out, Figure), f"{name} returned {type(out)}"
            _fig, ax = plt.subplots()
            assert call(ax=ax) is ax, f"{name} did not draw into the ax it was given"
        else:
            out = call()
            assert isinstance(out, Figure), f"{name} returned {type(out)}"
    finally:
        plt.close("all")


def test_no_plot_module_names_jet():
    """No colormap default hides inside a body either (e.g. ``cmap = cmap or "jet"``)."""
    import vitviz.plot.attention
    import vitviz.plot.compute
    import vitviz.plot.faithfulness
    import vitviz.plot.filters
    import vitviz.plot.posembed

    for module in (vitviz.plot.attention, vitviz.plot.compute, vitviz.plot.faithfulness, vitviz.plot.filters,
                   vitviz.plot.posembed):
        assert '"jet"' not in inspect.getsource(module) and "'jet'" not in inspect.getsource(module), module


@pytest.mark.parametrize("name", PUBLIC_PLOTS)
def test_default_figure_fits_a_double_column(name, model):
    """A figure wider than a page is shrunk to fit it, and its 8-9 pt text with it (below 6 pt past ~10 in)."""
    from vitviz.plot.style import PAGE_WIDTH

    try:
        out = _calls(model)[name]()
        fig = out.figure if isinstance(out, Axes) else out
        assert fig.get_size_inches()[0] <= PAGE_WIDTH + 1e-6, f"{name}: {fig.get_size_inches()} in"
    finally:
        plt.close("all")


def _overlaps(texts) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent()) for t in texts if t.get_text() and t.get_visible()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


@pytest.mark.parametrize("shape,mode", [((4, 3, 32, 32), "overlay"), ((3, 3, 32, 48), "both")])
def test_rollout_titles_do_not_overlap_at_page_width(shape, mode):
    model = tiny_timm_vit(img_size=shape[2:])
    try:
        fig = vitviz.plot_rollout(model, torch.randn(*shape), mode=mode)
        fig.canvas.draw()
        assert not _overlaps([ax.title for ax in fig.axes])
    finally:
        plt.close("all")


def test_heads_grid_of_twelve_heads_fits_the_page_without_overlap():
    from vitviz.plot.style import PAGE_WIDTH

    model = tiny_timm_vit(embed_dim=48, num_heads=12)
    try:
        fig = vitviz.plot_attention_heads_grid(model, torch.randn(1, 3, 32, 48))
        assert fig.get_size_inches()[0] <= PAGE_WIDTH + 1e-6
        fig.canvas.draw()
        assert not _overlaps([ax.title for ax in fig.axes])
    finally:
        plt.close("all")


def test_bands_say_what_interval_they_are():
    """A shaded band or error bar is named in the legend: which interval, over what."""
    from vitviz.plot.style import interval_label

    assert interval_label(("se", 1.96)) == "95% CI of the mean (±1.96 SE)"
    assert interval_label(("ci", 90)) == "90% bootstrap CI" and interval_label(("sd", 1)) == "±1 SD"
    assert interval_label(None) is None
    try:
        curves = _curves().assign(removed=lambda d: d["fraction"])
        title = vitviz.plot_faithfulness(curves, mode="deletion").get_legend().get_title().get_text()
        assert title == "Method\nband: 95% CI of the mean\n(±1.96 SE), 3 images"
        fig = vitviz.plot_faithfulness_grid(curves, errorbar=None)
        assert fig.axes[1].get_legend().get_title().get_text() == "Method"
        ax = vitviz.plot_study_runs(_study_runs())
        assert "95% t-interval" in ax.get_legend().get_title().get_text()
        ax = vitviz.plot_matched_gap(_study_runs())
        assert "95% t-interval" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    finally:
        plt.close("all")
