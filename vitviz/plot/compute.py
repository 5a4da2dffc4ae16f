"""Transfer accuracy against pre-training compute, in the style of the ViT paper's Fig. 5.

``plot_compute_curves()`` draws the paper's Table 6 numbers; given a measured DataFrame (e.g. from
``python -m vitviz.experiments.study hybrid-vs-pure``) it draws that with the same families, colours and markers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from vitviz.core.util import check_positive_int
from vitviz.errors import InputError, UnknownNameError
from vitviz.experiments.compare import pareto_frontier
from vitviz.plot.layout import ACCURACY_TOP, place_labels, place_legend
from vitviz.plot.style import FIGSIZE, PAGE_WIDTH, label, new_figure, styled

if TYPE_CHECKING:
    import pandas as pd

# family label prefix -> (colour, marker); measured studies use "Transformer (ViT)", "ResNet", "Hybrid"
FAMILY_STYLES: dict[str, tuple[str, str]] = {
    "Transformer": ("#1f77b4", "o"),
    "ResNet": ("#7f7f7f", "s"),
    "Hybrid": ("#d62728", "^"),
}
METRIC_TITLES = {"avg5": "Average-5", "imagenet": "ImageNet", "imagenet_real": "ImageNet ReaL",
                 "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "pets": "Oxford-IIIT Pets",
                 "flowers": "Oxford Flowers-102", "test_acc": "CIFAR-10 test"}
X_LABELS = {"exaflops": label("Total pre-training compute", "exaFLOPs"),
            "train_pflops": label("Total training compute", "PFLOPs"),
            "train_tflops": label("Total training compute", "TFLOPs")}
GAP_YLABEL = label("Accuracy gap", "points")  # fits a 2.8 in figure; the title says "at equal compute"


def family_style(family: str) -> tuple[str, str]:
    """(colour, marker) for a family label; unknown families get matplotlib's next colour and a diamond."""
    for prefix, style in FAMILY_STYLES.items():
        if family.startswith(prefix):
            return style
    return ("#9467bd", "D")


def point_labels(part: pd.DataFrame, df: pd.DataFrame, label_col: str = "model") -> list[str]:
    """Each point's name; models that appear at several budgets get their epochs too ("ViT-L/16, 14 ep")."""
    repeated = set(df[label_col][df[label_col].duplicated()]) if "epochs" in df else set()
    return [f"{m}, {e} ep" if m in repeated else str(m) for m, e in
            zip(part[label_col], part["epochs"] if "epochs" in part else [None] * len(part))]


def default_ylabel(metric: str) -> str:
    """The paper's "Transfer accuracy [%]"; "Test accuracy [%]" for ``test_acc`` (a study testing on its task)."""
    return label("Test accuracy" if metric == "test_acc" else "Transfer accuracy", "%")


@styled
def plot_compute_panel(df: pd.DataFrame, metric: str = "avg5", *, ax: Axes | None = None, x: str = "exaflops",
                       annotate: bool = False, frontier: bool = False, label_col: str = "model",
                       ylabel: str | None = None, legend: bool = True) -> Axes:
    """One Fig. 5 panel: ``metric`` against ``x`` (log scale), one colour and marker per family.

    Args:
        df: one row per model with ``family``, ``label_col``, ``x`` and ``metric`` (accuracy in %), e.g.
            ``vitviz.paper_results()``.
        metric: the accuracy column (its title from ``METRIC_TITLES``).
        ax: draw into these axes; default a new figure.
        x: the compute column; frontier: each family's Pareto frontier.
        annotate: name each point (``annotate_models``: no label overlaps another, a point, the legend or the axes
            edge; labels that find no free place are left out).
        label_col: the column naming each point.
        ylabel: the y label (default "Transfer accuracy [%]", or "Test accuracy [%]" for ``test_acc``).
        legend: draw the legend of families.

    Returns:
        the axes, x log-scaled and labelled with the compute unit, y with the accuracy, a legend of families.

    Raises:
        UnknownNameError: ``df`` lacks ``family``, ``x`` or ``metric``.
        InputError: a row's compute is not a positive number, or its ``metric`` is NaN (it would be left out of
            the log axis without a word).
    """
    _check_points(df, x, metric, label_col)
    if ax is None:
        fig = new_figure(FIGSIZE["single"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    for family, part in df.groupby("family", sort=False):
        colour, marker = family_style(str(family))
        xs, ys = part[x].to_numpy(float), part[metric].to_numpy(float)
        ax.scatter(xs, ys, color=colour, marker=marker, s=28, label=str(family), zorder=3,
                   edgecolors="white", linewidths=0.5)
        if frontier and len(part) > 1:
            fx, fy = pareto_frontier(xs, ys)
            ax.plot(fx, fy, color=colour, lw=1.0, alpha=0.7, zorder=2)
    ax.set_xscale("log")
    values = df[x].to_numpy(float)
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() < 10 * values.min():
        # Show at least one decade: on a narrower log axis a few percent of compute would span the whole panel.
        centre = np.sqrt(values.min() * values.max())
        ax.set_xlim(centre / np.sqrt(10), centre * np.sqrt(10))
        # Within about one decade the default labels are "2 x 10^-1"-style minor ticks: label 1-2-5 plainly.
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    # Room above and below the extreme points for their labels: the top one must not sit on the frame.
    ax.margins(y=0.12)
    ax.set_title(METRIC_TITLES.get(metric, metric))
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel(default_ylabel(metric) if ylabel is None else ylabel)
    if legend:
        ax.legend(loc="best", frameon=False)
    ax.grid(True, which="major", alpha=0.3, lw=0.5)
    if annotate:
        annotate_models(ax, df, metric, x=x, label_col=label_col)
    return ax


def _require_columns(df: pd.DataFrame, columns: Sequence[str], caller: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UnknownNameError(f"{caller}: the DataFrame lacks columns {missing}; it has {list(df.columns)}")


def _check_points(df: pd.DataFrame, x: str, metric: str, label_col: str) -> None:
    """Refuse rows the panel cannot draw: on the log x axis matplotlib leaves a compute of 0, a negative one or NaN
    out of the scatter, and a NaN accuracy is no point either, so a model went missing from the figure without a
    word."""
    _require_columns(df, ("family", x, metric), "plot_compute_panel")
    xs, ys = df[x].to_numpy(float), df[metric].to_numpy(float)
    bad = ~(np.isfinite(xs) & (xs > 0) & np.isfinite(ys))
    if bad.any():
        names = df[label_col] if label_col in df.columns else df.index.to_series()
        shown = [f"{n} ({x}={a:g}, {metric}={b:g})" for n, a, b in zip(names[bad], xs[bad], ys[bad])]
        raise InputError(f"{int(bad.sum())} of the {len(df)} rows cannot be drawn on the log {x} axis (a compute "
                         f"that is not a positive number, or a NaN {metric}): {', '.join(shown[:5])}"
                         f"{', ...' if len(shown) > 5 else ''}; drop or fix those rows, e.g. "
                         f"df[(df[{x!r}] > 0) & df[{metric!r}].notna()]")


def annotate_models(ax: Axes, df: pd.DataFrame, metric: str, *, x: str = "exaflops", label_col: str = "model"
                    ) -> list[Any]:
    """Name the points of a compute panel, in their family's colour, without overlaps (``layout.place_labels``).

    One label per configuration: the seeds of one model at one compute share it, at the seed of median accuracy.
    Labels are listed in order of accuracy, best first (the order ``place_labels`` breaks ties in); one that finds no
    free place (a crowded panel) is left out; no leader line crosses another label, point or leader. Call it after the
    figure's last layout change. At the default size all 18 models of the ViT paper's Table 6 are named with
    matplotlib 3.11 or newer; earlier releases measure text larger, and one to three names find no place.

    Returns:
        the annotations placed.
    """
    frame = df.assign(_name=point_labels(df, df, label_col))
    frame = frame[np.isfinite(frame[x].to_numpy(float)) & np.isfinite(frame[metric].to_numpy(float))]
    anchors = []
    for (family, name, xv), g in frame.groupby(["family", "_name", x], sort=False):
        y = g[metric].sort_values().iloc[len(g) // 2]
        anchors.append((float(y), float(xv), str(name), family_style(str(family))[0]))
    anchors.sort(key=lambda a: -a[0])
    return place_labels(ax, [(a[1], a[0]) for a in anchors], [a[2] for a in anchors], [a[3] for a in anchors],
                        avoid=frame[[x, metric]].to_numpy(float), marker_radius=3.0, fontsize=6)


@styled
def plot_compute_curves(
    df: pd.DataFrame | None = None,
    metrics: Sequence[str] = ("avg5", "imagenet"),
    *,
    fig: Figure | None = None,
    x: str = "exaflops",
    annotate: bool = False,
    frontier: bool = False,
    titles: Mapping[str, str] | None = None,
    suptitle: str | None = None,
    ylabel: str = label("Transfer accuracy", "%"),
) -> Figure:
    """Fig. 5 of the ViT paper: transfer accuracy vs total pre-training compute, one panel per metric.

    Args:
        df: one row per model with ``family``, ``model``, ``x`` and the ``metrics`` columns (accuracy in %).
            ``None``: the paper's Table 6 (``vitviz.zoo.paper.paper_results()``).
        metrics: columns to plot, one panel each (paper: ``("avg5", "imagenet")``, titled "Average-5" and
            "ImageNet"; a measured study: ``("test_acc",)``).
        fig: draw into this figure (cleared) instead of a new one.
        x: compute column; ``exaflops`` (paper), or ``train_pflops`` / ``train_tflops`` for measured runs.
        annotate: name each point beside it, once the panels are laid out (``annotate_models``: no label overlaps
            another, a point, the legend or the axes edge; labels that find no free place are left out).
        frontier: draw each family's Pareto frontier (best accuracy reached at or below each compute).
        titles: override panel titles, by metric.
        suptitle: a title over the panels.
        ylabel: the first panel's y label (the paper's "Transfer accuracy [%]"; a study that tests on its
            training task: "Test accuracy [%]").

    Returns:
        The figure; ``ylabel`` on the first panel, legend with the families.

    Raises:
        InputError: ``metrics`` is empty or a bare string.
        UnknownNameError: ``df`` lacks ``family``, ``x`` or a metric column.
    """
    if isinstance(metrics, str):
        raise InputError(f"metrics={metrics!r} is a string; pass a sequence of columns, e.g. ({metrics!r},)")
    if not len(metrics):
        raise InputError(f"metrics={metrics!r} selects no column to plot; pass at least one, e.g. ('avg5', "
                         "'imagenet') (the paper) or ('test_acc',) (a measured study)")
    if df is None:
        from vitviz.zoo.paper import paper_results

        df = paper_results()
    _require_columns(df, ("family", x, *metrics), "plot_compute_curves")
    if fig is None:
        w, h = FIGSIZE["wide"]
        fig = new_figure((max(w, 3.3 * len(metrics)), h))
    else:
        fig.clear()
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for i, (ax, metric) in enumerate(zip(axes, metrics)):  # the y label and the legend on the first panel only
        plot_compute_panel(df, metric, ax=ax, x=x, frontier=frontier, ylabel=ylabel if i == 0 else "",
                           legend=i == 0)
        if titles and metric in titles:
            ax.set_title(titles[metric])
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    if annotate:  # after the layout: the labels are placed where the points are finally drawn
        for ax, metric in zip(axes, metrics):
            annotate_models(ax, df, metric, x=x)
    return fig


def _plain_log_ticks(ax: Axes) -> None:
    """Plain labels ("0.002") on a log x axis spanning a decade or a few: 1-2-5 ticks where their labels fit side by
    side at the axes' width (labels of 8 pt, about 0.065 in a character), else one tick a decade."""
    lo, hi = ax.get_xlim()
    width = ax.get_position().width * ax.figure.get_figwidth()
    span = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs: tuple[float, ...] = (1.0,)
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
             for m in (1.0, 2.0, 5.0) if lo <= m * 10.0 ** e <= hi] if lo > 0 else []
    at = [width * math.log10(t / lo) / span for t in ticks]
    half = [0.065 * len(f"{t:g}") / 2 for t in ticks]
    if all(b - a > ha + hb + 0.08 for a, b, ha, hb in zip(at, at[1:], half, half[1:])):
        subs = (1.0, 2.0, 5.0)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _t_band(values: Any) -> tuple[float, float]:
    """seaborn ``errorbar=`` callable: the 95% Student-t interval of the mean accuracy (the study's interval), cut
    to 0 ... 100 % (``vitviz.analysis.intervals``)."""
    from vitviz.analysis.intervals import PERCENT, t_interval

    return t_interval(values, bounds=PERCENT)[1:]


def _t_band_gap(values: Any) -> tuple[float, float]:
    """``_t_band`` of a difference of two accuracies, cut to -100 ... 100 percentage points."""
    from vitviz.analysis.intervals import PERCENT_DIFFERENCE, t_interval

    return t_interval(values, bounds=PERCENT_DIFFERENCE)[1:]


def _family_palette(families: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    return ({f: family_style(f)[0] for f in families}, {f: family_style(f)[1] for f in families})


@styled
def plot_study_runs(runs: pd.DataFrame, *, ax: Axes | None = None, metric: str = "test_acc",
                    x: str = "train_pflops", frontier: bool = True) -> Axes:
    """One measured Fig. 5 panel with seaborn: each configuration's mean over seeds with its 95%
    t-interval as error bars, and (``frontier``) each family's per-seed Pareto frontier, mean and 95% band.

    Args:
        runs: tidy rows of one study block, one per run: ``family``, ``model``, ``epochs``, ``seed``, ``x``,
            ``metric`` (the study CSV's columns).
        ax: draw into these axes; default a new figure.
        metric, x: accuracy [%] and compute [PFLOPs] columns.
        frontier: draw the frontier bands (``vitviz.experiments.compare.family_curves``).

    Returns:
        the axes: x the training compute (log), y "Test accuracy [%]", a legend of families titled with the
        number of seeds and the interval (95% t-interval; the frontier's 95% t-band).

    Raises:
        InputError: ``runs`` holds several training sets (``train_images``; ``plot_study_grid`` draws each).
    """
    if ax is None:
        fig = new_figure(FIGSIZE["single"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    import seaborn as sns

    from vitviz.experiments.compare import check_one_training_set, check_percent, family_curves

    check_percent(runs, metric)
    families = list(dict.fromkeys(runs["family"]))
    check_one_training_set(runs, families)  # one block: a configuration's mean and a frontier over one set
    palette, markers = _family_palette(families)
    runs = runs.assign(config=runs["model"] + "-e" + runs["epochs"].astype(str))
    if frontier:
        curves = []
        for fam in families:
            xs = runs.loc[runs["family"] == fam, x]
            grid = np.geomspace(xs.min(), xs.max(), 24)
            curves.append(family_curves(runs[runs["family"] == fam], grid, [fam], metric))
        sns.lineplot(data=_concat(curves), x=x, y=metric, hue="family", hue_order=families, palette=palette,
                     errorbar=_t_band, lw=1.0, alpha=0.8, legend=False, ax=ax)
    sns.lineplot(data=runs, x=x, y=metric, hue="family", hue_order=families, palette=palette, style="family",
                 markers=markers, dashes=False, units="config", estimator=None, linestyle="", ax=ax,
                 legend=False, alpha=0.35, markersize=3)  # every seed, faint
    sns.lineplot(data=runs, x=x, y=metric, hue="family", hue_order=families, palette=palette,  # x: one config
                 style="family", markers=markers, dashes=False, estimator="mean",
                 errorbar=_t_band, err_style="bars", linestyle="", markersize=6, markeredgecolor="white",
                 markeredgewidth=0.5, err_kws={"elinewidth": 1.0, "capsize": 2}, ax=ax)
    ax.set_xscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel(default_ylabel(metric))
    ax.grid(True, which="major", alpha=0.3, lw=0.5)
    handles, labels = ax.get_legend_handles_labels()
    seeds = runs.groupby("config")["seed"].nunique()
    n = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    title = f"mean of {n} seeds, 95% t-interval" + ("\nlines: frontier, 95% t-band" if frontier else "")
    # off the bands and points, never raising the axis past 100 % (room above the data, or beside the axes)
    place_legend(ax, handles, labels, frameon=False, title=title, title_fontsize=7, ymax=ACCURACY_TOP)
    return ax


def _concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


@styled
def plot_matched_gap(runs: pd.DataFrame, a: str = "Hybrid", b: str = "Transformer (ViT)", *,
                     ax: Axes | None = None, n: int = 24, metric: str = "test_acc") -> Axes:
    """``a`` minus ``b`` at equal training compute with seaborn: the per-seed frontier gap
    (``vitviz.experiments.compare``), mean and 95% t-band over seeds, over the compute range both cover; 0 dashed.

    Args:
        runs: the study rows (as for ``plot_study_runs``).
        a, b: the two families compared.
        ax: draw into these axes; default a new figure.
        n: compute points on the shared grid; metric: the accuracy column.

    Returns:
        the axes: x the training compute (log), y "Accuracy gap [points]", titled "At equal training compute", a
        legend naming the mean gap's seeds and 95% t-interval and the single-seed lines (one entry).

    Raises:
        InputError: ``n`` is not a positive int, the families have no runs, share no compute range or no seed
            (the gap is taken seed by seed), or ``runs`` holds several training sets (``train_images``;
            ``plot_study_grid`` draws each).

    Warns:
        UserWarning: seeds only one family has (left out of the gap; ``compare.check_shared_seeds``).
    """
    check_positive_int(n, "n", "the compute points on the shared grid (e.g. 24)")
    if ax is None:
        fig = new_figure(FIGSIZE["single"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    import seaborn as sns

    from vitviz.experiments.compare import (
        check_one_training_set,
        check_percent,
        check_shared_seeds,
        compute_grid,
        family_curves,
    )

    check_percent(runs, metric)
    check_one_training_set(runs, (a, b))
    grid = compute_grid(runs, (a, b), n)
    check_shared_seeds(runs, a, b, "plot_matched_gap")
    curves = family_curves(runs, grid, (a, b), metric)
    wide = curves.pivot_table(index=["train_pflops", "seed"], columns="family", values=metric).reset_index()
    wide = wide.assign(gap=wide[a] - wide[b]).dropna(subset=["gap"])
    colour = family_style(a)[0]
    seeds = wide["seed"].nunique()
    sns.lineplot(data=wide, x="train_pflops", y="gap", errorbar=_t_band_gap, color=colour, lw=1.2, ax=ax,
                 label=f"{a} - {b}\n(mean of {seeds} seeds, 95% t-interval)")
    sns.lineplot(data=wide, x="train_pflops", y="gap", units="seed", estimator=None, color=colour, lw=0.5,
                 alpha=0.35, ax=ax, label="single seeds")
    handles, labels = ax.get_legend_handles_labels()
    first = {lab: h for h, lab in reversed(list(zip(handles, labels)))}  # one entry per label, not one per seed
    ax.axhline(0.0, color="0.3", lw=0.8, ls="--")
    ax.set_xscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel(X_LABELS["train_pflops"])
    ax.set_ylabel(GAP_YLABEL)
    ax.set_title("At equal training compute")
    ax.grid(True, which="major", alpha=0.3, lw=0.5)
    place_legend(ax, [first[lab] for lab in dict.fromkeys(labels)], list(dict.fromkeys(labels)), frameon=False,
                 fontsize=7)  # off the band
    return ax


@styled
def plot_study_grid(runs: pd.DataFrame, a: str = "Hybrid", b: str = "Transformer (ViT)", *,
               fig: Figure | None = None, suptitle: str | None = None) -> Figure:
    """The measured study, one row of panels per training-set size: accuracy against compute (seed means with
    95% t-intervals, frontier bands), and ``a`` minus ``b`` at equal compute with its 95% band.

    Args:
        runs: the study CSV (one row per run); ``train_images`` separates the blocks.
        a, b: the families whose matched-compute gap is drawn.
        fig: draw into this figure (cleared).
        suptitle: a title over the panels (e.g. naming the GPU).

    Returns:
        The figure: ``2 * blocks`` axes, titled with the training-set size.
    """
    blocks = sorted(runs["train_images"].unique())
    if fig is None:
        fig = new_figure((PAGE_WIDTH, 3.0 * len(blocks)))
    else:
        fig.clear()
    # laid out while the panels are drawn, so that each legend is placed (layout.place_legend) where its panel ends
    fig.set_layout_engine("constrained")
    if suptitle:
        fig.suptitle(suptitle)
    axes = fig.subplots(len(blocks), 2, squeeze=False)
    for row, n_train in zip(axes, blocks):
        part = runs[runs["train_images"] == n_train]
        seeds = part.groupby("model")["seed"].nunique()
        note = f"{n_train:,} training images, {seeds.min()}-{seeds.max()} seeds" if seeds.min() != seeds.max() \
            else f"{n_train:,} training images, {seeds.min()} seeds"
        plot_study_runs(part, ax=row[0])
        row[0].set_title(f"CIFAR-10 test ({note})")
        plot_matched_gap(part, a, b, ax=row[1])
    for ax in axes.ravel():  # the panels are laid out now: each legend again where it covers no data
        place_legend(ax)
    return fig
