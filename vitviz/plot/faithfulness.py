"""Figures of ``vitviz.explain`` and ``vitviz.faithfulness``: maps side by side, and the perturbation curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from vitviz.errors import InputError
from vitviz.plot.style import (
    FIGSIZE,
    LEGEND_BESIDE,
    PAGE_WIDTH,
    band_legend_title,
    colorbar_beside_block,
    image_block,
    label,
    new_figure,
    styled,
)

__all__ = ["plot_explanations_grid", "plot_faithfulness", "plot_faithfulness_grid"]

TITLES = {"positive": "Positive perturbation\nmost relevant removed first\n(lower is better)",
          "negative": "Negative perturbation\nleast relevant removed first\n(higher is better)",
          "deletion": "Deletion\nmost relevant removed first\n(lower is better)",
          "insertion": "Insertion\nmost relevant inserted first\n(higher is better)"}
# accuracies in percent, as every other vitviz accuracy; the DataFrame keeps them as fractions (its AUCs too)
YLABELS = {"accuracy": label("Target-class accuracy", "%"), "probability": "Target-class probability",
           "target": "Target score"}
LABELS_YLABEL = label("Top-1 accuracy vs. labels", "%")  # faithfulness(..., labels=...): arg-max against the labels
PERCENT = ("accuracy",)  # metrics drawn x100: the table's fractions of images, shown in percent
# the x: the fraction of the patches actually removed (column "removed", round(f * P) / P), or, for a frame without
# that column, the nominal step (column "fraction"); "removed" becomes "inserted" for insertion
XLABELS = {"removed": label("Patches removed", "fraction"),  # of all the patches; short: two panels side by side
           "fraction": label("Patches removed", "nominal fraction")}
# how the patches outside the kept set are removed; insertion keeps the inserted ones and removes the others
REMOVALS = {"drop": "tokens dropped", "mean": "mean fill"}
REMOVALS_INSERTION = {"drop": "the others dropped", "mean": "the others mean-filled"}


def _modes(df: Any) -> list[str]:
    from vitviz.analysis.faithfulness_stats import check_curves

    if getattr(df, "empty", False):
        raise InputError("df is an empty DataFrame; run vitviz.faithfulness(model, images) first and pass its result")
    # a DataFrame, one row per image, method, mode and fraction: a repeated run would weigh its images twice
    check_curves(df)
    return list(dict.fromkeys(df["mode"]))


def _palette(df: Any) -> tuple[list[str], dict[str, Any]]:
    import seaborn as sns

    methods = list(dict.fromkeys(df["method"]))
    return methods, dict(zip(methods, sns.color_palette("tab10", len(methods))))


@styled
def plot_faithfulness(df: Any, *, ax: Axes | None = None, mode: str | None = None,
                      errorbar: Any = ("se", 1.96)) -> Axes:
    """One perturbation mode: mean score against the fraction of patches removed (inserted), one line per method.

    The x of each step is the fraction of the patches actually removed, ``removed`` (``round(f * P) / P`` at the
    nominal step ``f``; on 64 patches the step 0.1 is drawn at 6 / 64, 0.094), the x of ``faithfulness_auc``. A
    ``df`` without that column (an older vitviz's, or one built by hand) is drawn over the nominal ``fraction``,
    and the axis label says so. The label's second line names how patches are removed: "(tokens dropped)" or
    "(mean fill)"; for insertion, which keeps the inserted patches, "(the others dropped)" or "(the others
    mean-filled)".

    Accuracies are drawn in percent (y from 0 to 100 %, as every vitviz accuracy), while ``df`` and the AUCs of
    ``faithfulness_auc`` keep them as fractions from 0 to 1 (the plot multiplies by 100); probabilities and target
    scores are drawn as they are.

    Axes-level; ``plot_faithfulness_grid`` draws every mode of ``df`` side by side.

    Args:
        df: the DataFrame of ``vitviz.faithfulness`` (runs over distinct image ids may be concatenated).
        ax: draw into these axes; default a new figure.
        mode: which mode to draw (``"positive"``, ``"negative"``, ``"deletion"``, ``"insertion"``; default: the
            only one in ``df``).
        errorbar: seaborn's ``errorbar`` for the band around each mean (default: a normal 95% interval of the mean
            over images, ``("se", 1.96)``; ``None`` for no band).

    Returns:
        the axes: x the fraction of patches actually removed (inserted), y the score (for ``accuracy`` with
        ``df.attrs["labels"]`` True, i.e. ``faithfulness(..., labels=...)``: "Top-1 accuracy vs. labels [%]",
        else the target-class score, an accuracy in "[%]"), a legend of methods beside the axes, its title naming the band
        (``vitviz.plot.style.interval_label``) and the number of images.

    Raises:
        InputError: ``df`` is not a DataFrame of ``vitviz.faithfulness``, is empty, holds several modes and
            ``mode`` is not given, or lacks ``mode``; or its images removed different fractions at one step (other
            patch grids: their mean has no one x).
    """
    import seaborn as sns

    modes = _modes(df)
    if mode is None and len(modes) > 1:
        raise InputError(f"df holds modes {modes}; pass mode=... (one of them), or draw all with "
                         "vitviz.plot_faithfulness_grid(df)")
    mode = mode or modes[0]
    sub = df[df["mode"] == mode]
    if sub.empty:
        raise InputError(f"mode={mode!r} is not in the DataFrame; pass one of {modes}")
    methods, palette = _palette(df)
    if ax is None:
        fig = new_figure((FIGSIZE["single"][0] * 1.3, FIGSIZE["single"][1] * 1.3))
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    if sub["removal"].nunique() > 1:
        raise InputError(f"mode={mode!r} mixes removals {sorted(set(sub['removal']))}; their curves are not "
                         "comparable: draw df[df['removal'] == ...] for each")
    x = "removed" if "removed" in sub.columns else "fraction"
    if x == "removed":
        _check_one_axis(sub, mode)
        sub = sub.assign(removed=sub.groupby("fraction")["removed"].transform("first"))  # one x per step, exactly
    metric = sub["metric"].iloc[0]
    if metric in PERCENT:
        sub = sub.assign(score=100.0 * sub["score"])
    sns.lineplot(data=sub, x=x, y="score", hue="method", hue_order=methods, palette=palette,
                 errorbar=errorbar, marker="o", markersize=3, ax=ax)
    removal = sub["removal"].iloc[0]
    ax.set_title(TITLES[mode])
    removals = REMOVALS_INSERTION if mode == "insertion" else REMOVALS
    xlabel = XLABELS[x] + (f"\n({removals[removal]})" if removal in removals else "")  # two lines: fits a panel
    ax.set_xlabel(xlabel.replace("removed", "inserted" if mode == "insertion" else "removed"))
    ax.set_ylabel(LABELS_YLABEL if metric == "accuracy" and df.attrs.get("labels") else YLABELS[metric])
    if ax.get_legend() is not None:
        # beside the axes: the bands fill the corners
        ax.legend(title=band_legend_title(errorbar, sub["image"].nunique() if "image" in sub else None),
                  **LEGEND_BESIDE)
    ax.set_xlim(0, 1)
    # the band of a mean of 0/1 accuracies may reach past 100 %; the mean cannot
    if metric in PERCENT:
        ax.set_ylim(0, 105)
    elif metric == "probability":
        ax.set_ylim(0, 1.05)
    return ax


def _check_one_axis(sub: Any, mode: str) -> None:
    """Refuse a mode whose images removed different fractions at one nominal step (other patch grids)."""
    spread = sub.groupby("fraction")["removed"].agg(["min", "max", "count", "size"])
    if (spread["count"] < spread["size"]).any():
        raise InputError(f"mode={mode!r}: df holds rows without a 'removed' value (frames of an older vitviz, which "
                         "has no 'removed' column, concatenated with newer ones?); rerun vitviz.faithfulness on those "
                         "images, or draw over the nominal steps with df.drop(columns='removed')")
    bad = spread[spread["max"] - spread["min"] > 1e-9]
    if len(bad):
        f, row = bad.index[0], bad.iloc[0]
        raise InputError(f"mode={mode!r}: at the step fraction={f:g} the images of df removed from {row['min']:.4g} "
                         f"to {row['max']:.4g} of their patches (images of other patch grids), so their mean curve "
                         "has no one x; draw each grid's images apart (df[df['image'].isin(...)]), or draw over the "
                         "nominal steps with df.drop(columns='removed')")


@styled
def plot_faithfulness_grid(df: Any, *, errorbar: Any = ("se", 1.96)) -> Figure:
    """Every perturbation mode of ``df`` side by side, one panel each (``plot_faithfulness`` per panel).

    Args:
        df: the DataFrame of ``vitviz.faithfulness``.
        errorbar: as in ``plot_faithfulness``.

    Returns:
        the figure: one axes per mode, in the order of ``df``, two per row (a double column, ``PAGE_WIDTH``); the
        legend "Method" beside the last, titled as in ``plot_faithfulness``.
    """
    modes = _modes(df)
    cols = min(len(modes), 2)
    rows = -(-len(modes) // cols)
    height = FIGSIZE["single"][1] * 1.3
    fig = new_figure((PAGE_WIDTH, height * rows))
    grid = fig.subplots(rows, cols, squeeze=False)
    axes = grid.ravel()
    for a in axes[len(modes):]:
        a.set_visible(False)
    for a, m in zip(axes, modes):
        plot_faithfulness(df, ax=a, mode=m, errorbar=errorbar)
        if a.get_legend() is not None:
            a.get_legend().remove()
    handles, labels = axes[0].get_legend_handles_labels()
    title = band_legend_title(errorbar, df["image"].nunique() if "image" in df else None)
    axes[len(modes) - 1].legend(handles, labels, title=title, **LEGEND_BESIDE)
    fig.tight_layout()
    return fig


@styled
def plot_explanations_grid(model: Any, images: Any, maps: Mapping[str, torch.Tensor], *,
                           labels: Sequence[str] | None = None, cmap: str | None = None, alpha: float = 0.5,
                           signed: bool = False, fig: Figure | None = None) -> Figure:
    """One row per image: the input, then each method's map over it (each map divided by its maximum; negative
    values clipped), or with ``signed`` each map alone, divided by its largest absolute value, on a diverging scale
    (for signed methods: AttnLRP, input x gradient, integrated gradients, whose negative evidence the default
    hides).

    Args:
        model: the ViT (its preprocessing de-normalises the inputs shown).
        images: the images the maps were computed on (anything ``vitviz.load_images`` takes).
        maps: method name -> ``(B, gh, gw)`` maps on the model's token grid for these images (or ``(B, H, W)``,
            one value per pixel), e.g. ``{m: vitviz.explain(model, x, m) for m in methods}``.
        labels: one caption per image (row), e.g. the class.
        cmap, alpha: heat-map colors (default ``magma``, perceptually uniform; ``RdBu_r`` with ``signed``, red
            positive, blue negative, white zero) and opacity (over the image; a signed map is drawn alone).
        signed: keep the sign (each map over ``[-1, 1]``) instead of clipping the negative values.
        fig: draw into this (empty) figure; default a new one sized to the panels.

    Returns:
        the figure, with one colorbar, ``"Relevance (relative to max)"`` (``signed``:
        ``"Relevance (relative to max |R|)"``), as tall as the block of images (top of the first row's to bottom of
        the last row's).

    Raises:
        InputError: a map set that is not one map per image on the images' token grid or that holds NaN or infinite
            values, or ``labels`` not one per image.
        InputTypeError: a map set that does not hold numbers.
    """

    from vitviz.core.images import denormalise, load_images
    from vitviz.plot.attention import check_map_grid, covered_pixels, finite_maps, upsample_maps

    x = load_images(model, images)
    names = list(maps)
    b = len(x)
    maps = {name: finite_maps(maps[name], f"maps[{name!r}]") for name in names}
    for name in names:
        if maps[name].ndim != 3 or maps[name].shape[0] != b:
            raise InputError(f"maps[{name!r}] of shape {tuple(maps[name].shape)} is not one (gh, gw) map per image "
                             f"for {b} images")
        check_map_grid(model, x, maps[name], f"maps[{name!r}]")
    if labels is not None and len(labels) != b:
        raise InputError(f"labels holds {len(labels)} captions for {b} images; pass one label per image (row)")
    rgb = denormalise(model, x)
    cols = len(names) + 1
    if fig is None:
        fig = new_figure((1.25 * cols + 0.6, 1.3 * b + 0.3))
        fig.set_layout_engine("constrained")  # room for the colorbar's label inside the figure
    axes, cax = image_block(fig, b, cols, colorbar=bool(names))
    mappable = None
    cmap = cmap or ("RdBu_r" if signed else "magma")
    for j, name in enumerate(["Input", *names]):
        heat = None if j == 0 else upsample_maps(maps[name], tuple(x.shape[-2:]), "absmax" if signed else "max",
                                                 covered=covered_pixels(model, x))
        for i in range(b):
            a = axes[i, j]
            if heat is None or not signed:
                a.imshow(rgb[i], interpolation="bilinear")
            if heat is not None:
                mappable = a.imshow(heat[i], cmap=cmap, alpha=1.0 if signed else alpha, vmin=-1 if signed else 0,
                                    vmax=1, interpolation="bilinear")
            a.set_xticks([])
            a.set_yticks([])
            for spine in a.spines.values():
                spine.set_visible(False)
            if i == 0:
                a.set_title(name.replace("_", "_\n", 1) if len(name) > 12 else name)  # long names on two lines
            if j == 0 and labels is not None:
                a.set_ylabel(labels[i])
    if cax is not None and mappable is not None:
        import matplotlib as mpl

        opaque = mpl.cm.ScalarMappable(norm=mappable.norm, cmap=mappable.cmap)  # the colours, not the overlay
        label = "Relevance (relative to max |R|)" if signed else "Relevance (relative to max)"
        colorbar_beside_block(cax, axes.ravel(), opaque, label)  # first row to last
    return fig
