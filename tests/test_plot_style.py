"""The house style, checked on the drawn figures: units written one way, blocks counted from 1, colorbars as tall as
their image, and names that overlap neither each other, the points, the legend nor the axes edge.

Every public plot function is rendered with the calls of ``test_plot_api._calls`` (tiny models, a 4x6 patch grid).
"""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import tiny_study_runs, tiny_timm_vit  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.text import Annotation, Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402
from test_plot_api import PUBLIC_PLOTS, _calls  # noqa: E402

import vitviz  # noqa: E402
from vitviz.errors import InputError  # noqa: E402
from vitviz.plot.style import PAGE_WIDTH  # noqa: E402

# a unit in parentheses: the house form is "Quantity [unit]"
PAREN_UNIT = re.compile(r"\((?:%|px|pixels?|[kMGTPE]?FLOPs|exaFLOPs|degrees?|°|s|ms|points)\)")
# quantities that have a unit, and the unit their label must end with
# every accuracy is in percent (a gap between accuracies is in points); the faithfulness curves' fractions of images
# are drawn x100 too
NEEDS_UNIT = [(re.compile(r"accuracy(?! gap)|top-1", re.IGNORECASE), r"\[%\]"),
              (re.compile(r"attention distance"), r"\[pixels\]"),
              (re.compile(r"^Total .*compute"), r"\[\w*FLOPs\]")]


def _figure(out) -> plt.Figure:
    return out.figure if isinstance(out, Axes) else out


def _all_axes(fig):
    """Every axes of ``fig``, with the insets (colorbars drawn beside an image) inside them."""
    for ax in fig.axes:
        yield ax
        yield from ax.child_axes


def _labels(fig) -> list[str]:
    """Every axis label line of ``fig`` (colorbar labels included: a colorbar is an axes)."""
    lines = []
    for ax in _all_axes(fig):
        for text in (ax.get_xlabel(), ax.get_ylabel()):
            lines += [line for line in text.split("\n") if line.strip()]
    return lines


def test_label_writes_the_house_form():
    from vitviz.plot.style import label

    assert label("Transfer accuracy", "%") == "Transfer accuracy [%]"
    assert label("Cosine similarity") == "Cosine similarity"
    with pytest.raises(InputError, match="not a bare unit"):
        label("Distance", "(pixels)")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_timm_vit()


def _accuracy_curves(labels: bool) -> pd.DataFrame:
    """Curves of ``vitviz.faithfulness`` scored by accuracy (a fraction of the images, 0 to 1, in the table)."""
    rows = [{"mode": m, "method": meth, "fraction": f, "removed": f, "score": float(f < 0.5 or i == 0),
             "metric": "accuracy", "removal": "drop", "image": i}
            for m in ("positive", "negative") for meth in ("random", "rollout") for i in range(3)
            for f in (0.0, 0.5, 1.0)]
    df = pd.DataFrame(rows)
    df.attrs["labels"] = labels
    return df


def _unit_walk(model):
    """(name, figure) for every public plot function, and the faithfulness figures scored by accuracy."""
    calls = _calls(model)
    for name in PUBLIC_PLOTS:
        yield name, _figure(calls[name]())
    for labels in (False, True):
        yield f"plot_faithfulness_grid (accuracy, labels={labels})", \
            vitviz.plot_faithfulness_grid(_accuracy_curves(labels))
        yield f"plot_faithfulness (accuracy, labels={labels})", \
            vitviz.plot_faithfulness(_accuracy_curves(labels), mode="positive").figure


def test_every_unit_is_written_the_house_way(model):
    """Units in square brackets at the end of the label, never in parentheses; quantities with a unit carry it: every
    accuracy (test, transfer, few-shot, faithfulness target-class or top-1) is in [%]."""
    seen, bad = [], []
    try:
        for name, fig in _unit_walk(model):
            for line in _labels(fig):
                if PAREN_UNIT.search(line):
                    bad.append((name, line, "unit in parentheses"))
                if "[" in line and not re.fullmatch(r"[^\[\]]+ \[[^\[\]]+\]", line):
                    bad.append((name, line, "brackets not at the end"))
                for quantity, unit in NEEDS_UNIT:
                    if quantity.search(line):
                        seen.append(line)
                        if not re.search(unit + "$", line):
                            bad.append((name, line, f"needs {unit}"))
            plt.close("all")
    finally:
        plt.close("all")
    assert not bad, bad
    # the walk reached the labels with units: accuracy, distance and compute
    assert any("[%]" in s for s in seen) and any("[pixels]" in s for s in seen) and any("FLOPs" in s for s in seen)
    assert {"Target-class accuracy [%]", "Top-1 accuracy vs. labels [%]"} <= set(seen)


# --- colorbars -----------------------------------------------------------------------------------------------------

def _colorbar_and_image(ax):
    im = ax.images[0]
    return im.colorbar.ax, im


@pytest.mark.parametrize("img_size,patch", [((16, 24), 4), ((24, 16), 4), ((32, 32), 8)])  # 4x6, 6x4, 4x4
@pytest.mark.parametrize("at", ["default", "page"])
@pytest.mark.parametrize("which", ["plot_pos_embed", "plot_pos_embed_similarity"])
def test_colorbar_is_as_tall_as_the_image(img_size, patch, at, which):
    model = tiny_timm_vit(img_size=img_size, patch_size=patch)
    try:
        ax = None if at == "default" else plt.figure(figsize=(PAGE_WIDTH, 3.0), layout="constrained").add_subplot()
        ax = vitviz.plot_pos_embed(model, ax=ax) if which == "plot_pos_embed" else \
            vitviz.plot_pos_embed_similarity(model, (0, 1), ax=ax)
        fig = ax.figure
        fig.canvas.draw()
        cax, im = _colorbar_and_image(ax)
        to_fig = fig.transFigure.inverted()
        bar = cax.get_window_extent().transformed(to_fig)
        image = im.get_window_extent().transformed(to_fig)
        tol = 1.0 / (fig.dpi * fig.get_figheight())  # one pixel
        assert abs(bar.y0 - image.y0) <= tol and abs(bar.y1 - image.y1) <= tol, (bar, image)
        assert bar.x0 > image.x1  # beside the image, not over it
        assert cax.get_ylabel() == "Cosine similarity"
    finally:
        plt.close("all")


def _block_colorbar(fig, text):
    """The colorbar labelled ``text`` and the drawn extent (pixels) of the block of images beside it."""
    fig.canvas.draw()
    (cax,) = [ax for ax in fig.axes if ax.get_ylabel() == text]
    images = [im.get_window_extent() for ax in fig.axes if ax.get_visible() and ax is not cax for im in ax.images]
    return cax.get_window_extent(), Bbox.union(images), len({round(b.y0) for b in images})


def _block_figure(which, rows, at):
    """``which`` drawn with ``rows`` rows of panels (4x6 token grid), at its default size or at the page's width;
    returns the figure and its colorbar label."""
    model = tiny_timm_vit(num_heads=2 * rows + 1, embed_dim=8 * (2 * rows + 1))  # heads grid: 1 + H panels in rows of 2 (2 * rows + 2 panels)
    x = torch.randn(rows, 3, 32, 48)

    def page(default):
        w, h = default
        return plt.figure(figsize=(PAGE_WIDTH, PAGE_WIDTH * h / w), layout="constrained")

    if which == "plot_rollout":  # one image (two panels) per row: 32x48 pairs do not fit two to a row
        fig = vitviz.plot_rollout(model, x)
        return (fig if at == "default" else vitviz.plot_rollout(model, x, fig=page(fig.get_size_inches()))), \
            "Attention (relative to max)"
    if which == "plot_explanations_grid":
        maps = {"rollout": vitviz.explain(model, x, "rollout"), "random": vitviz.explain(model, x, "random")}
        fig = vitviz.plot_explanations_grid(model, x, maps)
        return (fig if at == "default" else vitviz.plot_explanations_grid(
            model, x, maps, fig=page(fig.get_size_inches()))), "Relevance (relative to max)"
    fig = vitviz.plot_attention_heads_grid(model, x[:1], ncols=2)
    return (fig if at == "default" else vitviz.plot_attention_heads_grid(
        model, x[:1], ncols=2, fig=page(fig.get_size_inches()))), "Attention weight"


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("at", ["default", "page"])
@pytest.mark.parametrize("which", ["plot_rollout", "plot_explanations_grid", "plot_attention_heads_grid"])
def test_block_colorbar_is_as_tall_as_the_block_of_images(which, rows, at):
    """A colorbar beside several rows of panels spans the images drawn, from the top of the first row's to the bottom
    of the last row's (``fig.colorbar(ax=axes, shrink=0.8)`` drew it at 80% of the axes' space)."""
    torch.manual_seed(0)
    try:
        fig, text = _block_figure(which, rows, at)
        bar, block, drawn_rows = _block_colorbar(fig, text)
        assert drawn_rows == (rows + 1 if which == "plot_attention_heads_grid" else rows)
        assert abs(bar.y1 - block.y1) <= 1.5 and abs(bar.y0 - block.y0) <= 1.5, (bar, block)
        assert bar.x0 > block.x1  # beside the block, not over it
        assert fig.get_size_inches()[0] <= PAGE_WIDTH + 1e-6
    finally:
        plt.close("all")


def test_block_colorbar_follows_a_figure_without_layout_engine():
    """In a figure without a layout engine, and after the figure is resized, the bar still spans the images."""
    model = tiny_timm_vit()
    try:
        fig = vitviz.plot_rollout(model, torch.randn(3, 3, 32, 48), fig=plt.figure(figsize=(5.0, 6.0)))
        for size in ((5.0, 6.0), (4.0, 9.0)):
            fig.set_size_inches(*size)
            bar, block, _ = _block_colorbar(fig, "Attention (relative to max)")
            assert abs(bar.y1 - block.y1) <= 1.5 and abs(bar.y0 - block.y0) <= 1.5, (size, bar, block)
    finally:
        plt.close("all")


# --- names beside points -------------------------------------------------------------------------------------------

def _check_names(fig) -> list[int]:
    """Assert that no name overlaps another, a point, the legend or the axes edge; return the names per axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72
    counts = []
    for ax in fig.axes:
        notes = [t for t in ax.texts if isinstance(t, Annotation)]
        boxes = []
        for t in notes:
            t.update_positions(renderer)
            boxes.append(Text.get_window_extent(t, renderer))  # the text itself (a leader line may reach its point)
        frame = ax.get_window_extent(renderer)
        for t, b in zip(notes, boxes):
            assert frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1, t.get_text()
        for i, a in enumerate(boxes):
            for j in range(i + 1, len(boxes)):
                assert not a.overlaps(boxes[j]), (notes[i].get_text(), notes[j].get_text())
        r = 2.5 * px  # the markers' radius (s=28 pt^2)
        for coll in ax.collections:
            if isinstance(coll, PathCollection):
                for x, y in coll.get_offset_transform().transform(coll.get_offsets()):
                    dot = Bbox.from_extents(x - r, y - r, x + r, y + r)
                    hits = [t.get_text() for t, b in zip(notes, boxes) if b.overlaps(dot)]
                    assert not hits, f"{hits} cover the point at {x:.0f}, {y:.0f} px"
        if ax.get_legend() is not None:
            legend = ax.get_legend().get_window_extent(renderer)
            assert not [t.get_text() for t, b in zip(notes, boxes) if b.overlaps(legend)]
        counts.append(len(notes))
    return counts


# matplotlib 3.11 measures a 6-point name about 3% narrower and 8% lower than 3.8-3.10 do (its text layout changed),
# and the paper's 18 models all find a place only with the smaller boxes (tests/constraints-oldest.txt tests 3.8)
MPL_TEXT_3_11 = tuple(int(v) for v in matplotlib.__version__.split(".")[:2]) >= (3, 11)


@pytest.mark.parametrize("at", ["default", "page"])
def test_paper_fig5_names_every_model_without_overlap(at):
    df = vitviz.paper_results()
    try:
        fig = None if at == "default" else plt.figure(figsize=(PAGE_WIDTH, 3.2))
        fig = vitviz.plot_compute_curves(df, annotate=True, fig=fig)
        pair = _check_names(fig)
        ax = vitviz.plot_compute_panel(df, "imagenet", annotate=True)
        single = _check_names(ax.figure)
        if MPL_TEXT_3_11:
            assert pair == [len(df), len(df)] and single == [len(df)]  # room for all 18 models in each panel
        else:  # the larger text boxes of matplotlib 3.8-3.10: a name or three finds no free place and is left out
            assert min(pair + single) >= len(df) - 3, (pair, single)
    finally:
        plt.close("all")


def _leader_crossings(fig) -> list[tuple[str, str]]:
    """(label, what its drawn leader line runs through): another label's text, or another point's marker. The line is
    the path matplotlib draws, sampled every half pixel or so."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    r = 2.5 * fig.dpi / 72  # the markers' radius (s=28 pt^2)
    hits = []
    for ax in fig.axes:
        notes = [t for t in ax.texts if isinstance(t, Annotation)]
        boxes = [Text.get_window_extent(t, renderer) for t in notes]
        dots = np.concatenate([c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections
                               if isinstance(c, PathCollection)] or [np.zeros((0, 2))])
        for t in notes:
            if t.arrow_patch is None:
                continue
            arrow = t.arrow_patch
            verts = arrow.get_transform().transform_path(arrow.get_path()).vertices
            line = np.concatenate([a + np.linspace(0, 1, 200)[:, None] * (b - a) for a, b in zip(verts, verts[1:])])
            point = ax.transData.transform(t.xy)
            for other, box in zip(notes, boxes):
                if other is not t and any(box.contains(x, y) for x, y in line):
                    hits.append((t.get_text(), other.get_text()))
            for d in dots:
                if np.hypot(*(d - point)) > 0.5 and np.any((np.abs(line - d) < r).all(axis=1)):
                    hits.append((t.get_text(), f"the point at {d[0]:.0f}, {d[1]:.0f} px"))
    return hits


@pytest.mark.parametrize("at", ["default", "page"])
def test_paper_fig5_leader_lines_cross_no_label_and_no_point(at):
    """Fig. 5 on the paper's data, every model named: no leader line runs across another label or another point
    (``ResNet200x3``'s and ``R50x1+ViT-L/16, 14 ep``'s crossed neighbouring labels)."""
    df = vitviz.paper_results()
    try:
        fig = None if at == "default" else plt.figure(figsize=(PAGE_WIDTH, 3.2))
        fig = vitviz.plot_compute_curves(df, annotate=True, fig=fig)
        assert sum(t.arrow_patch is not None for ax in fig.axes for t in ax.texts) >= 3  # leader lines were drawn
        assert _leader_crossings(fig) == []
        ax = vitviz.plot_compute_panel(df, "imagenet", annotate=True)
        assert _leader_crossings(ax.figure) == []
    finally:
        plt.close("all")


def test_place_labels_leaders_cross_no_label_in_a_crowd():
    """Twenty-five points in a crowd, named with leader lines where needed: no leader runs across another label or
    another point, no label overlaps another (the greedy placement drew leaders across labels here)."""
    from vitviz.plot.layout import place_labels

    xy = np.random.default_rng(3).uniform(0.3, 0.7, size=(25, 2))
    try:
        fig, ax = plt.subplots(figsize=(3.4, 2.8))
        ax.scatter(*xy.T, s=28)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        notes = place_labels(ax, xy, [f"model {k}" for k in range(len(xy))], marker_radius=2.5)
        assert len(notes) >= 20 and sum(t.arrow_patch is not None for t in notes) >= 5
        assert _leader_crossings(fig) == []
        _check_names(fig)
    finally:
        plt.close("all")


def test_leader_geometry():
    from vitviz.plot.layout import leader_line, segment_crosses

    a, b = leader_line(Bbox.from_extents(0, 0, 10, 4), (30, 2), 3.0)  # leaves the box at its right edge
    assert np.allclose(a, (10, 2)) and np.allclose(b, (27, 2))
    assert leader_line(Bbox.from_extents(0, 0, 10, 4), (11, 2), 3.0) is None  # nothing left to draw
    assert segment_crosses((0, 0), (10, 10), Bbox.from_extents(4, 4, 6, 6))
    assert segment_crosses((5, 0), (5, 10), Bbox.from_extents(4, 4, 6, 6))  # vertical, through the box
    assert not segment_crosses((0, 0), (10, 0), Bbox.from_extents(4, 1, 6, 2))
    assert not segment_crosses((0, 0), (3, 3), Bbox.from_extents(4, 4, 6, 6))  # ends short of it


def test_reference_models_are_named_without_overlap():
    """The gallery's ``reference_compute`` (notebook 03): the shipped CIFAR-10 models, each named."""
    from vitviz.zoo.cards import reference_compute

    ref = reference_compute()
    if not len(ref):
        pytest.skip("no reference model cards in this checkout")
    try:
        fig = vitviz.plot_compute_curves(ref, metrics=("test_acc",), x="train_pflops", annotate=True,
                                         ylabel="Test accuracy [%]")
        assert _check_names(fig) == [len(ref)]
        assert sorted(t.get_text() for t in fig.axes[0].texts) == sorted(ref["model"])
    finally:
        plt.close("all")


def test_report_study_figure_names_do_not_overlap():
    """The whole measured study in one compute panel: many configurations; those that fit are named, none overlap."""
    from vitviz.experiments.study import read_results

    runs = read_results()
    if not len(runs):
        pytest.skip("no study results in this checkout")
    try:
        fig = vitviz.plot_compute_curves(runs, metrics=("test_acc",), x="train_pflops", frontier=True, annotate=True,
                                         ylabel="Test accuracy [%]")
        configurations = len(runs.groupby(["family", "model", "epochs", "train_pflops"]))
        (named,) = _check_names(fig)
        assert configurations / 2 <= named <= configurations
    finally:
        plt.close("all")


# --- blocks counted from 1, each metric named ----------------------------------------------------------------------

def _sanity_table() -> pd.DataFrame:
    from vitviz.analysis.sanity import METRICS

    layers = ["head", "norm", "block 2", "block 1", "block 0", "embeddings"]  # the table's names: model.blocks[i]
    rows = [{"test": test, "method": m, "step": k, "layer": layer, "image": i, "metric": metric,
             "value": 1.0 - 0.15 * k + 0.01 * i}
            for test in ("cascading", "independent") for m in ("rollout", "chefer") for k, layer in enumerate(layers)
            for i in range(3) for metric in METRICS]
    return pd.DataFrame(rows)


def test_sanity_figure_counts_blocks_from_one_and_names_each_metric():
    from vitviz.analysis.sanity import METRICS
    from vitviz.plot.sanity import YLABELS

    df = _sanity_table()
    want = ["head", "norm", "block 3", "block 2", "block 1", "embeddings"]
    labels = {}
    try:
        for metric in METRICS:
            for test in ("cascading", "independent"):
                ax = vitviz.plot_sanity_checks(df, metric=metric, test=test)
                assert [t.get_text() for t in ax.get_xticklabels()] == want
                labels[metric] = ax.get_ylabel()
                plt.close("all")
    finally:
        plt.close("all")
    assert set(YLABELS) == set(METRICS)
    flat = {m: s.replace("\n", " ") for m, s in labels.items()}
    # spearman_abs compares the absolute values of the two maps, spearman the signed maps, ssim |m| scaled to [0, 1]
    assert "Spearman" in flat["spearman_abs"] and "|trained map| vs |randomised map|" in flat["spearman_abs"]
    assert "Spearman" in flat["spearman"] and "signed" in flat["spearman"] and "|" not in flat["spearman"]
    assert flat["ssim"].startswith("SSIM") and "|trained map|" in flat["ssim"] and "[0, 1]" in flat["ssim"]
    assert "absolute values" not in " ".join(flat.values())  # the old, ambiguous wording


# --- the sweep: other faults found by looking at every figure ------------------------------------------------------

def _tick_overlaps(ax) -> list[tuple[str, str]]:
    ticks = [t for t in ax.get_xticklabels() if t.get_text() and t.get_visible()]
    boxes = [t.get_window_extent() for t in ticks]
    return [(ticks[i].get_text(), ticks[i + 1].get_text()) for i in range(len(boxes) - 1)
            if boxes[i].overlaps(boxes[i + 1])]


@pytest.mark.parametrize("at", ["default", "page"])
@pytest.mark.parametrize("which", ["plot_study_runs", "plot_matched_gap"])
def test_compute_tick_labels_do_not_overlap(at, which):
    """Three decades of training compute at a column's width: 1-2-5 labels ran into each other ("0.00050.001")."""
    from vitviz.experiments.study import read_results

    runs = read_results()
    runs = runs[runs["train_images"] == runs["train_images"].min()] if len(runs) else runs  # one block
    runs = runs if len(runs) and which == "plot_study_runs" else tiny_study_runs().assign(
        train_pflops=lambda d: d["train_pflops"] * 10.0 ** (d["epochs"] - 5))  # 1e-4 ... 4e-1
    try:
        ax = None if at == "default" else plt.figure(figsize=(PAGE_WIDTH, 3.0), layout="constrained").add_subplot()
        ax = getattr(vitviz, which)(runs, ax=ax)
        ax.figure.canvas.draw()
        assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 3
        assert not _tick_overlaps(ax)
    finally:
        plt.close("all")


def test_study_grid_titles_clear_the_next_panel():
    """A one-line title "CIFAR-10 test (5,000 training images, 3 seeds)" ran into the next panel's y label."""
    try:
        from vitviz.experiments.study import read_results

        runs = read_results()
        fig = vitviz.plot_study_grid(runs if len(runs) else tiny_study_runs().assign(train_images=50_000))
        fig.canvas.draw()
        texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label) if t.get_text()]
        boxes = [t.get_window_extent() for t in texts]
        hits = [(texts[i].get_text(), texts[j].get_text()) for i in range(len(texts)) for j in range(i + 1, len(texts))
                if boxes[i].overlaps(boxes[j])]
        assert not hits
    finally:
        plt.close("all")


def test_faithfulness_grid_x_labels_keep_apart():
    """At page width the two panels' x labels ("Patches removed [fraction of all patches]") nearly touched."""
    rows = [{"mode": m, "method": meth, "fraction": f, "removed": f, "score": 1.0 - f, "removal": "drop", "image": i,
             "metric": "accuracy" if m in ("positive", "negative") else "probability"}
            for m in ("positive", "negative", "deletion", "insertion") for meth in ("random", "rollout")
            for i in range(3) for f in (0.0, 0.5, 1.0)]
    fig = vitviz.plot_faithfulness_grid(pd.DataFrame(rows))
    try:
        fig.canvas.draw()
        gaps = []
        for left, right in ((0, 1), (2, 3)):
            a, b = (fig.axes[k].xaxis.label.get_window_extent() for k in (left, right))
            gaps.append((b.x0 - a.x1) / fig.dpi)
        assert min(gaps) >= 0.3, gaps  # inches between the labels of the two panels of a row
    finally:
        plt.close(fig)


def test_no_name_in_every_figure_sits_outside_its_figure(model):
    """Every figure of every public plot function, at its default size: no axis label, title or legend lies past
    the figure's edge, where ``fig.savefig`` without ``bbox_inches="tight"`` cuts it off (the probes, the sanity
    checks and the explanations grid had no layout engine)."""
    try:
        for name in PUBLIC_PLOTS:
            fig = _figure(_calls(model)[name]())
            fig.canvas.draw()
            page = fig.bbox
            for ax in _all_axes(fig):
                for t in (ax.title, ax.xaxis.label, ax.yaxis.label, ax.get_legend()):
                    if t is not None and t.get_visible() and (not isinstance(t, Text) or t.get_text()):
                        b = t.get_window_extent()
                        what = t.get_text() if isinstance(t, Text) else "legend"
                        assert page.x0 - 1 <= b.x0 and b.x1 <= page.x1 + 1, (name, what)
                        assert page.y0 - 1 <= b.y0 and b.y1 <= page.y1 + 1, (name, what)
            plt.close("all")
    finally:
        plt.close("all")


def test_filter_variance_note_is_off_the_curve():
    """The "first 28 (Fig. 7 left)" note sat on the cumulative curve."""
    ratio = 0.88 ** np.arange(48)  # 97% explained by the first 28: the curve runs along the top
    ratio /= ratio.sum()
    try:
        ax = vitviz.plot_filter_variance(ratio)
        ax.figure.canvas.draw()
        (note,) = [t for t in ax.texts if t.get_text().startswith("first 28")]
        box = note.get_window_extent()
        line = ax.lines[0]
        pts = line.get_transform().transform(line.get_xydata())
        xs = np.linspace(pts[:, 0].min(), pts[:, 0].max(), 2000)
        curve = np.column_stack([xs, np.interp(xs, pts[:, 0], pts[:, 1])])
        assert not any(box.contains(x, y) for x, y in curve)
    finally:
        plt.close("all")


def _legend_hits(ax) -> list[str]:
    """What a legend inside ``ax`` covers: data lines, bands (``fill_between``), error bars and markers; reference
    lines across the whole axes (``axhline``, ``axvline``) are not data."""
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.lines import Line2D

    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return []
    box = legend.get_window_extent()
    if not box.overlaps(ax.get_window_extent()):
        return []  # beside the axes
    hits = []
    for k, artist in enumerate(ax.get_children()):
        if not artist.get_visible():
            continue
        what = f"{type(artist).__name__} {k} {artist.get_label()!r}"
        if isinstance(artist, Line2D):
            xy = artist.get_xydata()
            if len(xy) < 2 or (list(artist.get_xdata()) == [0, 1] or list(artist.get_ydata()) == [0, 1]):
                continue  # a marker-only point is checked as a point below; axhline / axvline span the axes
            pts = artist.get_transform().transform(xy)
            t = np.linspace(0, 1, 50)[:, None]
            dense = np.concatenate([a + t * (b - a) for a, b in zip(pts[:-1], pts[1:])]) \
                if artist.get_linestyle() not in ("None", "", " ") else pts
            if any(box.contains(x, y) for x, y in dense):
                hits.append(what)
        elif isinstance(artist, (PolyCollection, LineCollection)):
            for path in artist.get_paths():
                if path.transformed(artist.get_transform()).intersects_bbox(
                        box, filled=isinstance(artist, PolyCollection)):
                    hits.append(what)
                    break
        elif isinstance(artist, PathCollection):
            pts = artist.get_offset_transform().transform(artist.get_offsets())
            if any(box.contains(x, y) for x, y in pts):
                hits.append(what)
    return hits


def test_legends_cover_no_data(model):
    """No legend inside the axes of any public plot function (at its default size) lies on a line, a band or a point.
    """
    covered = {}
    try:
        for name in PUBLIC_PLOTS:
            fig = _figure(_calls(model)[name]())
            fig.canvas.draw()
            for ax in fig.axes:
                hits = _legend_hits(ax)
                if hits:
                    covered[f"{name}: {ax.get_title()}"] = hits
            plt.close("all")
        runs = __import__("vitviz.experiments.study", fromlist=["read_results"]).read_results()
        for n in sorted(runs["train_images"].unique()):
            ax = vitviz.plot_matched_gap(runs[runs["train_images"] == n])
            ax.figure.canvas.draw()
            if _legend_hits(ax):
                covered[f"plot_matched_gap (study data, {n})"] = _legend_hits(ax)
            plt.close("all")
    finally:
        plt.close("all")
    assert not covered, "\n".join(f"{k}: {v}" for k, v in covered.items())


# --- bounded axes: no accuracy above 100 %, no correlation above 1 ------------------------------------------------

ACCURACY_AXIS = re.compile(r"accuracy(?! gap).*\[%\]|top-1.*\[%\]", re.IGNORECASE)
CORRELATION_AXIS = re.compile(r"correlation|Spearman|SSIM|Cosine similarity", re.IGNORECASE)
# matplotlib's own autoscale margin (axes.ymargin, 5% of the range) above a value at the bound: a point or band at
# 100 % keeps its marker inside the frame; any more is a range no value can reach
MARGIN = 0.05


def _bounded_walk(model):
    from vitviz.experiments.study import read_results

    yield from _unit_walk(model)
    runs = read_results()
    if len(runs):
        yield "plot_study_grid (data/study)", vitviz.plot_study_grid(runs)
        for n in sorted(runs["train_images"].unique()):
            yield f"plot_study_runs (data/study, {n})", vitviz.plot_study_runs(
                runs[runs["train_images"] == n]).figure
    for at in ("default", "page"):
        fig = None if at == "default" else plt.figure(figsize=(PAGE_WIDTH, 3.2))
        yield f"plot_compute_curves (annotated, {at})", vitviz.plot_compute_curves(annotate=True, fig=fig)


def test_no_accuracy_axis_above_100_and_no_correlation_above_1(model):
    """``layout.place_legend`` raised the y axis for room above the data: ``plot_study_runs`` on the study's data
    ran to ~110 %. Every accuracy axis [%] of every public plot ends at most 5 points above 100, every correlation
    axis at most 0.05 above 1."""
    bad, seen = [], set()
    try:
        for name, fig in _bounded_walk(model):
            fig.canvas.draw()
            for ax in _all_axes(fig):
                text = ax.get_ylabel().replace("\n", " ")
                for axis, top in ((ACCURACY_AXIS, 100.0), (CORRELATION_AXIS, 1.0)):
                    if text and axis.search(text):
                        seen.add(top)
                        if max(ax.get_ylim()) > top * (1 + MARGIN) + 1e-9:
                            bad.append((name, text, ax.get_ylim()))
            plt.close("all")
    finally:
        plt.close("all")
    assert seen == {100.0, 1.0}  # the walk met both kinds of axes
    assert not bad, bad


def test_place_legend_stops_at_the_bound_and_goes_beside():
    """With no room within ``ymax`` the legend goes beside the axes and the limits stay; a second call (after the
    layout) starts from the limits found, not from those it raised."""
    from vitviz.plot.layout import place_legend

    xs = np.linspace(0, 1, 50)
    try:
        fig, ax = plt.subplots(figsize=(3.4, 2.8), layout="constrained")
        ax.fill_between(xs, 0, 96, alpha=0.3, label="band")  # data fills the axes up to 96 %
        ax.plot(xs, 50 + 40 * np.sin(6 * xs), label="curve")
        ax.set_ylim(0, 97)
        legend = place_legend(ax, ymax=100.0)
        assert ax.get_ylim() == (0, 97)  # raising to 100 % gives no room: limits kept
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1  # beside the axes

        def banded(size):
            fig, ax = plt.subplots(figsize=size, layout="constrained")
            ax.fill_between(xs, 0, 96, alpha=0.3, label="band")
            ax.plot(xs, 96 * xs, label="a curve with a long name")
            ax.set_ylim(0, 97)
            return fig, ax

        fig, ax = banded((3.4, 2.8))
        place_legend(ax)  # unbounded: raised for room above the data
        assert ax.get_ylim()[1] > 100
        fig.set_size_inches(2.4, 1.6)  # the layout changes (as a grid's panels are laid out): placed again
        place_legend(ax)
        _, fresh = banded((2.4, 1.6))
        place_legend(fresh)
        assert ax.get_ylim() == fresh.get_ylim()  # from the limits found, not raised twice over
    finally:
        plt.close("all")
