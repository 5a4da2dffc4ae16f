"""RGB embedding filters as in the ViT paper's Fig. 7 left, and the variance their components explain.

Dosovitskiy et al., ICLR 2021 (arXiv 2010.11929), Fig. 7 left: the first 28 principal components of ViT-L/32's
RGB patch-embedding filters, as RGB tiles in 4 rows of 7. For hybrids the tiles come from the backbone stem's first
conv (the patch projection there is a 1x1 conv over features, with no RGB filters), for a conv stem from the stem's
first conv; the title says which (``vitviz.analysis.filters.filter_origin``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from matplotlib.axes import Axes
from torch import nn

from vitviz.analysis.filters import embedding_filters, filter_origin, filter_pca
from vitviz.core.spec import inspect
from vitviz.core.util import check_positive_int, float_array
from vitviz.errors import InputError
from vitviz.plot.style import FIGSIZE, new_figure, styled

__all__ = ["filters_mosaic", "filters_to_rgb", "plot_embedding_filters", "plot_filter_variance"]

N_COLS = 7
N_PAPER = 28  # components in the paper's Fig. 7 left
MAX_VARIANCE_BARS = 64  # plot_filter_variance shows at most this many components unless told otherwise


def filters_to_rgb(components: torch.Tensor | np.ndarray) -> np.ndarray:
    """Components ``(n, 3, kh, kw)`` to images ``(n, kh, kw, 3)``, each min-max scaled to ``[0, 1]`` on its own.

    A constant component becomes mid-grey.
    """
    x = np.asarray(torch.as_tensor(components).detach().cpu().double()).transpose(0, 2, 3, 1)
    lo = x.min(axis=(1, 2, 3), keepdims=True)
    span = x.max(axis=(1, 2, 3), keepdims=True) - lo
    out = np.where(span > 0, (x - lo) / np.where(span > 0, span, 1.0), 0.5)
    return out.astype(np.float32)


# what the filters are, by filter_origin: only a patch projection's are Fig. 7 left's embedding filters
_WHAT = {"patch projection": "embedding filters", "hybrid backbone stem": "filters of the hybrid's backbone stem conv",
         "conv stem": "filters of the conv stem's first conv"}


def _title(origin: str, n: int, requested: int) -> str:
    which = f"first {n} principal components" if n >= requested else f"all {n} principal components"
    if origin == "patch projection":
        return f"RGB {_WHAT[origin]} ({which})"
    return f"RGB {_WHAT[origin]}\n({which})"


def filters_mosaic(tiles: np.ndarray, ncols: int = N_COLS, gap: int = 1) -> np.ndarray:
    """RGB tiles ``(n, kh, kw, 3)`` -> one RGBA mosaic, ``ncols`` per row, ``gap`` transparent pixels between."""
    n, kh, kw, _ = tiles.shape
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    out = np.zeros((nrows * (kh + gap) - gap, ncols * (kw + gap) - gap, 4), dtype=np.float32)
    for i, tile in enumerate(tiles):
        r, c = divmod(i, ncols)
        y, x = r * (kh + gap), c * (kw + gap)
        out[y:y + kh, x:x + kw, :3] = tile
        out[y:y + kh, x:x + kw, 3] = 1.0
    return out


@styled
def plot_embedding_filters(model: nn.Module, *, ax: Axes | None = None, n_components: int = 28) -> Axes:
    """Fig. 7 left for any ViT: principal components of the RGB embedding filters, as RGB tiles.

    Tiles are laid out 7 per row (4 x 7 for 28), in order of explained variance, each min-max scaled to
    ``[0, 1]`` on its own, drawn as one mosaic image with transparent gaps. When the conv has fewer filters (or
    inputs) than ``n_components`` allow, every component there is is shown and the x label says why.

    Args:
        model: a ViT (for hybrids the backbone stem's first RGB conv is used, for a conv stem its first conv; the
            title says so).
        ax: draw into these axes; default a new figure sized to the tiles.
        n_components: how many components to show.

    Returns:
        the axes holding the mosaic (one image; ticks off), titled with what the tiles are.

    Raises:
        NoRGBFiltersError: the model has no conv over RGB pixels.
    """
    weights, source = embedding_filters(model)
    origin = filter_origin(model)
    comps, _ratio = filter_pca(weights, n_components)
    tiles = filters_to_rgb(comps)
    n = len(tiles)
    ncols = min(N_COLS, n)
    nrows = math.ceil(n / ncols)
    short = n < n_components
    if ax is None:
        title_lines = 1 if origin == "patch projection" else 2
        fig = new_figure((0.78 * ncols + 0.2, 0.72 * nrows + 0.35 + 0.3 * title_lines + 0.3 * short))
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    gap = max(1, round(tiles.shape[1] / 8))
    ax.imshow(filters_mosaic(tiles, ncols, gap), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(_title(origin, n, n_components))
    if short:
        c_out, c_in, kh, kw = weights.shape
        ax.set_xlabel(f"{source}: {c_out} filters of {c_in}x{kh}x{kw}; {n} components exist (of {n_components} "
                      "asked)", fontsize=7.5)
    return ax


def _ratios(values: Any) -> np.ndarray:
    """``values`` as explained variance ratios, one per component, refused where they cannot be: the y axis is fixed
    at ``[0, 1.02]``, so a ratio above 1 (variances, not their ratios) or a running sum above 1 was drawn off the
    top of the axes, a NaN or negative bar left out, and a 2-D table flattened into one row of "components"."""
    ratio = float_array(values, "model_or_ratio")
    if sum(n > 1 for n in ratio.shape) > 1:
        raise InputError(f"model_or_ratio of shape {ratio.shape} is not one ratio per component; pass a 1-D ratio, "
                         "e.g. vitviz.filter_pca(weights, n)[1], or the model")
    ratio = ratio.reshape(-1)
    bad = ~np.isfinite(ratio) | (ratio < 0) | (ratio > 1)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise InputError(f"model_or_ratio: {int(bad.sum())} of the {ratio.size} values are not ratios in [0, 1] (the "
                         f"first: component {k + 1}, {ratio[k]}); pass the explained variance ratio (each variance "
                         "divided by their total), e.g. vitviz.filter_pca(weights, n)[1], not the variances")
    if ratio.sum() > 1 + 1e-6:
        raise InputError(f"model_or_ratio sums to {ratio.sum():.6g}, but explained variance ratios of one "
                         "decomposition sum to at most 1; pass the ratio of one decomposition (each variance divided "
                         "by their total)")
    return ratio


@styled
def plot_filter_variance(
    model_or_ratio: nn.Module | torch.Tensor | np.ndarray,
    *,
    ax: Axes | None = None,
    n_components: int | None = None,
) -> Axes:
    """Explained variance ratio of each principal component of the RGB embedding filters, and its running sum.

    Args:
        model_or_ratio: a ViT (its filters are decomposed with ``vitviz.filter_pca``) or an explained variance
            ratio ``(n,)``.
        ax: draw here; default a new ``6.4 x 3.2`` in figure.
        n_components: show the first ``n`` components (default: all, at most 64); the cumulative line counts
            all components either way.

    Returns:
        the axes: bars per component, a line for the cumulative ratio; x "Principal component" (from 1),
        y "Explained variance ratio".

    Raises:
        InputError: ``n_components`` is not a positive int (or None), or there are no ratios to plot, or the ratios
            are not 1-D, hold a value outside ``[0, 1]`` (or NaN), or sum to more than 1.
        InputTypeError: the ratios are not numbers.
    """
    if n_components is not None:
        check_positive_int(n_components, "n_components", "how many components to show (or None for all, at most "
                           f"{MAX_VARIANCE_BARS})")
    title = None
    if isinstance(model_or_ratio, nn.Module):
        spec = inspect(model_or_ratio)
        weights, _source = embedding_filters(model_or_ratio)
        _comps, ratio_t = filter_pca(weights, n_components=int(np.prod(weights.shape[1:])))
        ratio = ratio_t.numpy()
        title = f"Variance of the RGB {_WHAT[filter_origin(model_or_ratio)]} — {spec.name}"
    else:
        ratio = _ratios(model_or_ratio)
    if ratio.size == 0:
        raise InputError("no explained variance ratios to plot")
    total = ratio.size
    cumulative = np.cumsum(ratio)  # over all components, so a cut-off axis still shows the true running sum
    n = min(total, n_components if n_components is not None else MAX_VARIANCE_BARS)
    ratio, cumulative = ratio[:n], cumulative[:n]
    if ax is None:
        fig = new_figure(FIGSIZE["wide"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    x = np.arange(1, ratio.size + 1)
    ax.bar(x, ratio, width=0.8, color="C0", label="per component")
    ax.plot(x, cumulative, color="C1", marker="o", markersize=2.5, label="cumulative")
    if n > N_PAPER:
        ax.axvline(N_PAPER + 0.5, color="0.5", linestyle=":", linewidth=1.0)
        # left of the line, halfway between the bars and the cumulative curve over the note's width (about a
        # quarter of the components shown), where neither is
        span = max(1, n // 4)
        low, high = float(ratio[N_PAPER - span:N_PAPER].max()), float(cumulative[N_PAPER - span])
        ax.annotate(f"first {N_PAPER} (Fig. 7 left)", (N_PAPER + 0.5, (low + high) / 2), xytext=(-3, 0),
                    textcoords="offset points", ha="right", va="center", fontsize=7.5, color="0.35")
    ax.set_xlim(0.3, ratio.size + 0.7)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("Principal component" + (f" (first {n} of {total})" if n < total else ""))
    ax.set_ylabel("Explained variance ratio")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="center right", frameon=False)
    if title:
        ax.set_title(title)
    return ax
