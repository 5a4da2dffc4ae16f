"""Figures of ``vitviz.explain`` and ``vitviz.faithfulness``: maps side by side, and the perturbation curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from vitviz.errors import InputError
from vitviz.plot.style import FIGSIZE, new_figure, styled

__all__ = ["plot_explanations", "plot_faithfulness"]

TITLES = {"positive": "Positive perturbation\nmost relevant removed first\n(lower is better)",
          "negative": "Negative perturbation\nleast relevant removed first\n(higher is better)",
          "deletion": "Deletion\nmost relevant removed first\n(lower is better)",
          "insertion": "Insertion\nmost relevant inserted first\n(higher is better)"}
YLABELS = {"accuracy": "Target-class accuracy", "probability": "Target-class probability",
           "target": "Target score"}
XLABELS = {"drop": "Patches removed [fraction] (tokens dropped)", "mean": "Patches removed [fraction] (mean fill)"}


@styled
def plot_faithfulness(df: Any, ax: Axes | None = None, *, mode: str | None = None,
                      errorbar: Any = ("se", 1.96)) -> Figure | Axes:
    """Mean score against the fraction of patches removed (inserted), one line per method.

    Args:
        df: the DataFrame of ``vitviz.faithfulness`` (runs over distinct image ids may be concatenated).
        ax: draw one ``mode`` into this Axes and return it; ``None``: a new figure, one panel per mode in ``df``.
        mode: with ``ax``, which mode to draw (default: the only one in ``df``).
        errorbar: seaborn's ``errorbar`` for the band around each mean (default: a normal 95% interval of the mean
            over images, ``("se", 1.96)``; ``None`` for no band).

    Returns:
        the Figure (``ax=None``) or the Axes.
    """
    import seaborn as sns

    from vitviz.analysis.faithfulness_stats import check_curves

    check_curves(df)  # one row per image, method, mode and fraction: a repeated run would weigh its images twice
    modes = list(dict.fromkeys(df["mode"]))
    if not modes:
        raise InputError("plot_faithfulness got an empty DataFrame; run vitviz.faithfulness(model, images) first")
    methods = list(dict.fromkeys(df["method"]))
    palette = dict(zip(methods, sns.color_palette("tab10", len(methods))))

    def draw(a: Axes, m: str) -> None:
        sub = df[df["mode"] == m]
        if sub.empty:
            raise InputError(f"mode={m!r} is not in the DataFrame; it holds {modes}")
        sns.lineplot(data=sub, x="fraction", y="score", hue="method", hue_order=methods, palette=palette,
                     errorbar=errorbar, marker="o", markersize=3, ax=a)
        metric = sub["metric"].iloc[0]
        if sub["removal"].nunique() > 1:
            raise InputError(f"mode={m!r} mixes removals {sorted(set(sub['removal']))}; their curves are not "
                             "comparable: draw df[df['removal'] == ...] for each")
        removal = sub["removal"].iloc[0]
        a.set_title(TITLES[m])
        a.set_xlabel(XLABELS.get(removal, "Patches removed [fraction]").replace(
            "removed", "inserted" if m == "insertion" else "removed"))
        a.set_ylabel(YLABELS[metric])
        a.set_xlim(0, 1)
        if metric in ("accuracy", "probability"):
            a.set_ylim(0, 1.05)  # the band of a mean of 0/1 accuracies may reach past 1; the mean cannot

    if ax is not None:
        if mode is None and len(modes) > 1:
            raise InputError(f"the DataFrame holds modes {modes}; pass mode=... to draw one into ax")
        draw(ax, mode or modes[0])
        return ax
    width, height = FIGSIZE["single"]
    fig = new_figure((width * len(modes) * 1.05, height * 1.3))
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for i, (a, m) in enumerate(zip(axes, modes)):
        draw(a, m)
        if i < len(modes) - 1 and a.get_legend() is not None:
            a.get_legend().remove()
        elif a.get_legend() is not None:
            a.legend(title="Method", loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    fig.tight_layout()
    return fig


@styled
def plot_explanations(model: Any, images: Any, maps: Mapping[str, torch.Tensor], *,
                      labels: Sequence[str] | None = None, cmap: str = "jet", alpha: float = 0.5) -> Figure:
    """One row per image: the input, then each method's map over it (each map divided by its maximum).

    Args:
        model: the ViT (its preprocessing de-normalises the inputs shown).
        images: the images the maps were computed on (anything ``vitviz.load_images`` takes).
        maps: method name -> ``(B, gh, gw)`` maps, e.g. ``{m: vitviz.explain(model, x, m) for m in methods}``.
        labels: one caption per image (row), e.g. the class.
        cmap, alpha: heat-map colors and opacity.

    Returns:
        the figure, with one colorbar "Relevance (relative to max)".
    """
    import numpy as np

    from vitviz.core.images import denormalise, load_images
    from vitviz.plot.attention import upsample_maps

    x = load_images(model, images)
    rgb = denormalise(model, x)
    names = list(maps)
    b = len(x)
    for name in names:
        if maps[name].shape[0] != b:
            raise InputError(f"maps[{name!r}] holds {maps[name].shape[0]} maps for {b} images")
    cols = len(names) + 1
    fig = new_figure((1.25 * cols + 0.6, 1.3 * b + 0.3))
    axes = np.atleast_2d(fig.subplots(b, cols, squeeze=False))
    mappable = None
    for j, name in enumerate(["Input", *names]):
        heat = None if j == 0 else upsample_maps(maps[name], tuple(x.shape[-2:]))
        for i in range(b):
            a = axes[i, j]
            a.imshow(rgb[i], interpolation="bilinear")
            if heat is not None:
                mappable = a.imshow(heat[i], cmap=cmap, alpha=alpha, vmin=0, vmax=1, interpolation="bilinear")
            a.set_xticks([])
            a.set_yticks([])
            for spine in a.spines.values():
                spine.set_visible(False)
            if i == 0:
                a.set_title(name)
            if j == 0 and labels is not None:
                a.set_ylabel(labels[i])
    if mappable is not None:
        import matplotlib as mpl

        opaque = mpl.cm.ScalarMappable(norm=mappable.norm, cmap=mappable.cmap)  # the colours, not the overlay
        fig.colorbar(opaque, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02,
                     label="Relevance (relative to max)")
    return fig
