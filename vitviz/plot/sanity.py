"""The figure of ``vitviz.sanity_checks``: similarity to the original map against the randomisation step."""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes

from vitviz.analysis.sanity import check_sanity_table
from vitviz.errors import InputError
from vitviz.plot.style import FIGSIZE, LEGEND_BESIDE, band_legend_title, new_figure, styled

__all__ = ["layer_tick", "plot_sanity_checks"]

# what each metric of vitviz.analysis.sanity compares (vitviz.analysis.similarity): the trained model's map of an
# image against the map after randomisation (|m|: absolute values; SSIM on |m| min-max scaled to [0, 1])
YLABELS = {"spearman_abs": "Spearman rank correlation,\n|trained map| vs |randomised map|",
           "spearman": "Spearman rank correlation,\nsigned trained map vs randomised map",
           "ssim": "SSIM, |trained map| vs |randomised map|\n(each min-max scaled to [0, 1])"}
XLABELS = {"cascading": "Randomised from the top down to (cumulative)",
           "independent": "Randomised layer (one at a time)"}


def layer_tick(layer: str) -> str:
    """A sanity-table layer name as the figures write it: blocks counted from 1, as in every vitviz figure.

    The table of ``vitviz.sanity_checks`` keeps ``"block i"`` for ``model.blocks[i]`` (Python's index, and the name
    ``steps=`` and ``decision_step=`` take), so ``"block 0"`` is drawn ``"block 1"``; other names are unchanged.
    """
    head, _, index = layer.partition(" ")
    return f"block {int(index) + 1}" if head == "block" and index.isdigit() else layer


@styled
def plot_sanity_checks(df: Any, *, ax: Axes | None = None, test: str = "cascading", metric: str = "spearman_abs",
                       errorbar: Any = ("se", 1.96), threshold: float | None = 0.5) -> Axes:
    """Mean similarity to the trained model's map against the randomisation step, one line per method.

    Args:
        df: the table of ``vitviz.sanity_checks``.
        ax: the Axes to draw into (default: a new figure).
        test: ``"cascading"`` or ``"independent"``.
        metric: ``"spearman_abs"``, ``"spearman"`` or ``"ssim"``.
        errorbar: seaborn's band around each mean over images (default a normal 95% interval of the mean,
            ``("se", 1.96)``; ``None`` for none).
        threshold: draw the pass/fail threshold of ``vitviz.analysis.sanity.sanity_summary`` on the cascading
            ``spearman_abs`` curves (``None``: no line).

    Returns:
        the Axes; x tick labels are the layer names from the top (head) down, blocks counted from 1 as in every
        vitviz figure (``layer_tick``: the table's ``"block 0"``, ``model.blocks[0]``, is drawn "block 1"); the y
        label says which two maps the metric compares (``YLABELS``); the threshold line, when drawn, is a legend
        entry.

    Raises:
        InputError: ``df`` is not the table of ``vitviz.sanity_checks``, or holds no rows of ``test`` and ``metric``.
    """
    import seaborn as sns

    if metric not in YLABELS or test not in XLABELS:
        raise InputError(f"test={test!r}, metric={metric!r}: test must be one of {tuple(XLABELS)} and metric one "
                         f"of {tuple(YLABELS)}")
    check_sanity_table(df, "plot_sanity_checks")
    sub = df[(df["test"] == test) & (df["metric"] == metric)]
    if sub.empty:
        raise InputError(f"the table holds no {test!r} rows for metric {metric!r}; run vitviz.sanity_checks(model, "
                         f"images, tests=({test!r},)) first")
    if ax is None:
        width, height = FIGSIZE["wide"]
        fig = new_figure((width, height * 1.25))
        fig.set_layout_engine("constrained")  # the y label and the legend beside the axes inside the figure
        ax = fig.add_subplot()
    methods = list(dict.fromkeys(sub["method"]))
    palette = dict(zip(methods, sns.color_palette("tab10", len(methods))))
    sns.lineplot(data=sub, x="step", y="value", hue="method", hue_order=methods, palette=palette,
                 errorbar=errorbar, marker="o", markersize=3.5, ax=ax)
    steps = sub[["step", "layer"]].drop_duplicates().sort_values("step")
    ax.set_xticks(steps["step"].tolist())
    ax.set_xticklabels([layer_tick(n) for n in steps["layer"]], rotation=45, ha="right")
    ax.axhline(0, color="0.6", lw=0.8, zorder=0)
    if threshold is not None and metric == "spearman_abs" and test == "cascading":  # where the verdict is made
        # named in the legend, not by a text on the axes, which would sit on the curves
        ax.axhline(threshold, color="0.3", lw=0.8, ls="--", zorder=0, label=f"fail at or above {threshold:g}")
    ax.set_ylim(-1.05 if metric == "spearman" or sub["value"].min() < 0 else 0, 1.05)
    ax.set_xlabel(XLABELS[test])
    ax.set_ylabel(YLABELS[metric])
    if ax.get_legend() is not None:
        ax.legend(title=band_legend_title(errorbar, sub["image"].nunique()), **LEGEND_BESIDE)
    return ax
