"""Transfer accuracy against pre-training compute, in the style of the ViT paper's Fig. 5.

``plot_compute_curves()`` draws the paper's Table 6 numbers; given a measured DataFrame (e.g. from
``python -m vitviz.experiments.study hybrid-vs-pure``) it draws that with the same families, colours and markers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from vitviz.plot.style import FIGSIZE, new_figure, styled

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
X_LABELS = {"exaflops": "Total pre-training compute [exaFLOPs]", "train_pflops": "Total training compute [PFLOPs]",
            "train_tflops": "Total training compute [TFLOPs]"}


def family_style(family: str) -> tuple[str, str]:
    """(colour, marker) for a family label; unknown families get matplotlib's next colour and a diamond."""
    for prefix, style in FAMILY_STYLES.items():
        if family.startswith(prefix):
            return style
    return ("#9467bd", "D")


def pareto_frontier(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points not beaten by any cheaper-or-equal point: the best accuracy reached so far, by compute."""
    order = np.lexsort((-y, x))
    xs, ys, best = [], [], -np.inf
    for i in order:
        if y[i] > best:
            xs.append(x[i])
            ys.append(y[i])
            best = y[i]
    return np.asarray(xs), np.asarray(ys)


def point_labels(part: pd.DataFrame, df: pd.DataFrame, label_col: str = "model") -> list[str]:
    """Each point's name; models that appear at several budgets get their epochs too ("ViT-L/16, 14 ep")."""
    repeated = set(df[label_col][df[label_col].duplicated()]) if "epochs" in df else set()
    return [f"{m}, {e} ep" if m in repeated else str(m) for m, e in
            zip(part[label_col], part["epochs"] if "epochs" in part else [None] * len(part))]


def draw_compute_panel(ax: Axes, df: pd.DataFrame, metric: str, *, x: str = "exaflops",
                       annotate: bool = False, frontier: bool = False, label_col: str = "model") -> Axes:
    """One Fig. 5 panel on ``ax``: ``metric`` against ``x`` (log scale), one colour and marker per family."""
    for family, part in df.groupby("family", sort=False):
        colour, marker = family_style(str(family))
        xs, ys = part[x].to_numpy(float), part[metric].to_numpy(float)
        ax.scatter(xs, ys, color=colour, marker=marker, s=28, label=str(family), zorder=3,
                   edgecolors="white", linewidths=0.5)
        if frontier and len(part) > 1:
            fx, fy = pareto_frontier(xs, ys)
            ax.plot(fx, fy, color=colour, lw=1.0, alpha=0.7, zorder=2)
        if annotate:
            for xi, yi, name in zip(xs, ys, point_labels(part, df, label_col)):
                ax.annotate(name, (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=6, color=colour)
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
    ax.grid(True, which="major", alpha=0.3, lw=0.5)
    return ax


@styled
def plot_compute_curves(
    df: pd.DataFrame | None = None,
    metrics: Sequence[str] = ("avg5", "imagenet"),
    fig: Figure | None = None,
    *,
    x: str = "exaflops",
    annotate: bool = False,
    frontier: bool = False,
    titles: Mapping[str, str] | None = None,
    suptitle: str | None = None,
    ylabel: str = "Transfer accuracy [%]",
) -> Figure:
    """Fig. 5 of the ViT paper: transfer accuracy vs total pre-training compute, one panel per metric.

    Args:
        df: one row per model with ``family``, ``model``, ``x`` and the ``metrics`` columns (accuracy in %).
            ``None``: the paper's Table 6 (``vitviz.zoo.paper.paper_results()``).
        metrics: columns to plot, one panel each (paper: ``("avg5", "imagenet")``, titled "Average-5" and
            "ImageNet"; a measured study: ``("test_acc",)``).
        fig: draw into this figure (cleared) instead of a new one.
        x: compute column; ``exaflops`` (paper), or ``train_pflops`` / ``train_tflops`` for measured runs.
        annotate: write each model's name beside its point.
        frontier: draw each family's Pareto frontier (best accuracy reached at or below each compute).
        titles: override panel titles, by metric.
        suptitle: a title over the panels.
        ylabel: the first panel's y label (the paper's "Transfer accuracy [%]"; a study that tests on its
            training task: "Test accuracy [%]").

    Returns:
        The figure; ``ylabel`` on the first panel, legend with the families.
    """
    if df is None:
        from vitviz.zoo.paper import paper_results

        df = paper_results()
    missing = [c for c in ("family", x, *metrics) if c not in df.columns]
    if missing:
        raise KeyError(f"plot_compute_curves: the DataFrame lacks columns {missing}; it has {list(df.columns)}")
    if fig is None:
        w, h = FIGSIZE["wide"]
        fig = new_figure((max(w, 3.3 * len(metrics)), h))
    else:
        fig.clear()
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        draw_compute_panel(ax, df, metric, x=x, annotate=annotate, frontier=frontier)
        if titles and metric in titles:
            ax.set_title(titles[metric])
    axes[0].set_ylabel(ylabel)
    axes[0].legend(loc="best", frameon=False)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig
