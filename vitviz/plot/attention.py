"""Attention figures of the ViT paper: rollout (Fig. 6, 14), per-head maps, mean attention distance (Fig. 7, 11).

Dosovitskiy et al., ICLR 2021 (arXiv 2010.11929). Fig. 6 pairs each "Input" with its "Attention": the rollout map
(Abnar & Zuidema 2020) upsampled to the image, divided by its maximum and multiplied into the image as an alpha
mask; here it can also be drawn as a heat overlay with a colorbar. Fig. 7 right and Fig. 11 plot the mean
attention distance of every head against depth, one dot per head per layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import seaborn as sns
import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import nn

from vitviz.analysis.distance import distance_by_block, mean_attention_distance
from vitviz.analysis.propagation import rollout_to_maps
from vitviz.analysis.readout_rows import TOKEN_NAMES, PoolRows, output_rows
from vitviz.analysis.rollout import attention_rollout
from vitviz.analysis.tables import distance_table
from vitviz.core.capture import capture_attention, check_layer_index
from vitviz.core.contexts import without_autocast
from vitviz.core.images import Images, denormalise, load_images
from vitviz.core.spec import inspect
from vitviz.core.util import check_positive_int, eval_mode, float_array, is_int, is_number
from vitviz.errors import ComputeError, InputError, InputTypeError, OutOfRangeError
from vitviz.plot.style import (
    FIGSIZE,
    PAGE_WIDTH,
    colorbar_beside_block,
    fit_columns,
    image_block,
    label,
    new_figure,
    styled,
)

__all__ = ["plot_attention_distance", "plot_attention_distance_grid", "plot_attention_heads_grid",
           "plot_rollout", "upsample_maps"]

MODES = ("overlay", "mask", "both")
SCALES = ("max", "minmax")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
DIST_XLABEL = "Network depth (layer)"
DIST_YLABEL = label("Mean attention distance", "pixels")  # the paper's Fig. 7 writes "(pixels)"
MAX_LEGEND_HEADS = 16  # more heads than this: a colorbar "Head" replaces the legend


def upsample_maps(maps: torch.Tensor | np.ndarray, size: tuple[int, int], scale: str | None = "max", *,
                  interpolation: str = "bilinear", covered: tuple[int, int] | None = None) -> np.ndarray:
    """``(B, gh, gw)`` maps -> ``(B, H, W)``, each scaled to ``[0, 1]`` on its own (the one upsampling rule of the
    figures and the explorers).

    ``scale="max"`` clips negatives and divides by the maximum (the paper's look: a uniform map stays uniform);
    ``"minmax"`` stretches the minimum to 0 (shows structure in flat maps, and exaggerates noise); ``"absmax"``
    keeps the sign and divides by the largest absolute value (``[-1, 1]``: signed maps, AttnLRP's); ``None`` keeps
    the values. ``interpolation``: ``"bilinear"`` (the paper's figures), ``"nearest"`` (patch blocks; PIL's and
    OpenCV's nearest, ``torch``'s ``nearest-exact``) or ``"bicubic"``. ``covered``: the ``(gh * sh, gw * sw)``
    pixels, from the top left, that the patch grid covers (``covered_pixels``); a token map is stretched over those
    alone and the rest, which no patch sees (a model built for a size that is no multiple of its stride, e.g. 384 px
    at 14 px patches: 27 patches over 378 px), is 0. Stretched over the whole image, patch ``i`` would be drawn
    ``i`` times the remainder over the grid's size away from its pixels.
    """
    if scale is not None and scale not in (*SCALES, "absmax"):
        raise InputError(f"scale must be one of {(*SCALES, 'absmax')} or None, got {scale!r}")
    if interpolation not in INTERPOLATIONS:
        raise InputError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    x = torch.as_tensor(maps).detach().float().cpu()[:, None]
    onto = tuple(size) if covered is None or tuple(x.shape[-2:]) == tuple(size) else tuple(covered)
    if interpolation == "nearest":
        m = F.interpolate(x, size=onto, mode="nearest-exact")[:, 0]
    else:
        m = F.interpolate(x, size=onto, mode=interpolation, align_corners=False)[:, 0]
    if onto != tuple(size):  # the pixels past the grid belong to no patch
        m = F.pad(m, (0, size[1] - onto[1], 0, size[0] - onto[0]))
    if scale is None:
        return m.numpy()
    if scale == "absmax":
        peak = m.flatten(1).abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
        return (m / peak[:, None, None]).numpy()
    m = m.clamp_min(0)
    if scale == "minmax":
        m = m - m.flatten(1).amin(dim=1)[:, None, None]
    peak = m.flatten(1).amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    return (m / peak[:, None, None]).numpy()


def _bare(ax: Axes) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def covered_pixels(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """The ``(gh * sh, gw * sw)`` pixels of the batch ``x`` that the patch grid of ``model`` covers, from the top
    left (``upsample_maps(covered=...)``); the image's own size where the grid covers all of it."""
    spec = inspect(model)
    (gh, gw), (sh, sw) = spec.grid_for_input(x), spec.patch_size
    return min(gh * sh, int(x.shape[-2])), min(gw * sw, int(x.shape[-1]))


def finite_maps(maps: torch.Tensor | np.ndarray, argument: str) -> torch.Tensor:
    """``maps`` as a float tensor on the CPU, refused when any value is NaN or infinite: each map is divided by its
    maximum before it is drawn, so one NaN (or inf) would blank its whole panel (every pixel NaN, drawn as nothing)
    or leave one bright spot and the rest black, without a word.

    Raises:
        InputTypeError: ``maps`` does not hold numbers.
        InputError: a value is NaN or infinite; the message names ``argument``, the first map and patch holding one,
            and how many there are.
    """
    held = torch.from_numpy(float_array(maps, argument))
    bad = ~torch.isfinite(held)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise InputError(f"{argument} holds {int(bad.sum())} NaN or infinite values of {held.numel()} (the first at "
                         f"index {where}: {held[where].item()}), which the figure cannot scale; recompute the maps "
                         "(a NaN often comes from an overflow in half precision), or mark the values you mean with "
                         "torch.nan_to_num(maps, nan=0.0) if 0 is what they stand for")
    return held


SIGNED_CMAP = "RdBu_r"  # attention with negative weights: red positive, blue negative, white 0


def attention_scale(low: float, high: float, cmap: str | None, default: str) -> tuple[str, float, float]:
    """``(cmap, vmin, vmax)`` of attention weights spanning ``low`` to ``high``: ``cmap`` (else ``default``) from 0
    to the largest weight (1 where every weight is 0); where a weight is negative (differential attention's signed
    maps, which a scale from 0 would draw as 0) ``cmap`` (else ``SIGNED_CMAP``) from ``-m`` to ``m``, ``m`` the
    largest absolute weight, so that 0 sits in the middle and nothing is clipped. ``plot_attention_heads_grid`` and
    the attention explorer draw on it."""
    if low < 0:
        m = max(-low, high)
        return cmap or SIGNED_CMAP, -m, m
    return cmap or default, 0.0, high if high > 0 else 1.0


def check_map_grid(model: nn.Module, x: torch.Tensor, maps: torch.Tensor, argument: str) -> None:
    """Refuse ``(B, h, w)`` maps that are neither on the token grid of ``model`` for the batch ``x`` nor on its
    pixels: maps of other images (another size) or of another model would be stretched over these silently."""
    grid = tuple(inspect(model).grid_for_input(x))
    size = tuple(x.shape[-2:])
    got = tuple(maps.shape[-2:])
    if got not in (grid, size):
        raise InputError(f"{argument}: maps of {got[0]}x{got[1]} do not fit these images, whose token grid is "
                         f"{grid[0]}x{grid[1]} ({size[0]}x{size[1]} pixels); pass the maps computed on these images "
                         "with this model, e.g. vitviz.explain(model, images, method)")


@styled
def plot_rollout(
    model: nn.Module,
    images: Images,
    *,
    mode: str = "overlay",
    maps: torch.Tensor | None = None,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    token: int | str | None = None,
    labels: Sequence[str] | None = None,
    scale: str = "max",
    ncols: int | None = None,
    cmap: str = "magma",
    alpha: float = 0.5,
    fig: Figure | None = None,
) -> Figure:
    """Fig. 6 / Fig. 14 for any ViT: "Input" and "Attention" side by side for each image.

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor, or PIL images / arrays / paths; the input shown is what the
            model sees (resized, cropped), de-normalised with the model's mean and std.
        mode: ``"overlay"`` (heat map over the image, colorbar), ``"mask"`` (the paper's look: the image times the
            map, normalised to its maximum) or ``"both"`` (three panels per image).
        maps: ``(B, gh, gw)`` maps to draw instead of ``attention_rollout`` (e.g. from ``grad_rollout``), on the
            model's token grid for these images (or ``(B, H, W)``, one value per pixel).
        head_fusion, discard_ratio, token: passed to ``attention_rollout`` (``token=None``: the rows of the tokens
            the model's head reads, ``vitviz.inspect(model).readout``; ``"class"``: the class row; an int: one row).
        labels: one caption per image, written under its input (e.g. the class).
        scale: ``"max"`` divides each map by its maximum (the paper); ``"minmax"`` also maps its minimum to 0.
        ncols: images per row (default as many as fit a 7 in double column, ``PAGE_WIDTH``: up to 4, or 3 with
            ``mode="both"``).
        cmap, alpha: heat-map colors (default ``magma``, perceptually uniform) and opacity of the overlay.
        fig: draw into this (empty) figure; default a new one sized to the panels.

    Returns:
        the figure; panels titled "Input", "Attention" (and "Attention mask" with ``mode="both"``), one colorbar
        "Attention (relative to max)" unless ``mode="mask"``, as tall as the block of images (top of the first row's
        to bottom of the last row's).

    Raises:
        InputError: ``mode`` unknown, ``ncols`` not a positive int, ``maps`` not one map per image on the images'
            token grid (or pixel grid), holding NaN or infinite values, or holding negative values (signed
            relevance: ``plot_explanations_grid`` with ``signed=True`` draws it), or ``labels`` not one per image.
        InputTypeError: ``maps`` does not hold numbers.
    """
    if mode not in MODES:
        raise InputError(f"mode must be one of {MODES}, got {mode!r}")
    if scale is not None and scale not in SCALES:  # upsample_maps' "absmax" is for signed maps, not drawn here
        raise InputError(f"scale must be one of {SCALES}, got {scale!r}")
    if ncols is not None:
        check_positive_int(ncols, "ncols", "the images per row (or None for up to 4)")
    x = load_images(model, images)
    if maps is None:
        maps = attention_rollout(model, x, head_fusion=head_fusion, discard_ratio=discard_ratio, token=token)
    maps = finite_maps(maps, "maps")
    if maps.ndim != 3 or maps.shape[0] != x.shape[0]:
        raise InputError(f"expected one (gh, gw) map per image: {x.shape[0]} images, maps {tuple(maps.shape)}")
    check_map_grid(model, x, maps, "maps")
    held = torch.as_tensor(maps)
    low, peak = float(held.min()), float(held.abs().max())
    if low < -1e-6 * peak:  # the scales here start at 0: negative relevance would be drawn as none
        raise InputError(f"maps hold negative values (down to {low:.3g}, largest |value| {peak:.3g}), which "
                         "plot_rollout would draw as 0; draw signed maps (AttnLRP, input x gradient) with "
                         "vitviz.plot_explanations_grid(model, images, {'attnlrp': maps}, signed=True)")
    if labels is not None and len(labels) != x.shape[0]:
        raise InputError(f"{len(labels)} labels for {x.shape[0]} images")
    imgs = denormalise(model, x)
    masks = upsample_maps(maps, imgs.shape[1:3], scale, covered=covered_pixels(model, x))

    titles = {"overlay": ["Input", "Attention"], "mask": ["Input", "Attention"],
              "both": ["Input", "Attention", "Attention mask"]}[mode]
    k, b = len(titles), len(imgs)
    h, w = imgs.shape[1:3]
    aspect = min(w / h, 2.0)
    extra = 0.7 if mode != "mask" else 0.1  # the colorbar
    # by default as many images per row as fit a double column at 1.55 in a panel (at most 4; 3 with "both")
    per_row, group = fit_columns(min(b, 3 if mode == "both" else 4), k * 1.55 * aspect, extra)
    per_row = ncols or per_row
    rows = math.ceil(b / per_row)
    per_row = ncols or math.ceil(b / rows)  # balanced rows: 4 images in threes -> 2 x 2
    panel = group / (k * aspect)
    if fig is None:
        fig = new_figure((k * per_row * panel * aspect + extra, rows * (panel + 0.35) + 0.2))
        fig.set_layout_engine("constrained")
    axes, cax = image_block(fig, rows, k * per_row, colorbar=mode != "mask")
    heat = None
    for i in range(rows * per_row):
        group = axes[i // per_row, (i % per_row) * k:(i % per_row + 1) * k]
        if i >= b:
            for ax in group:
                ax.set_visible(False)
            continue
        for j, (ax, title) in enumerate(zip(group, titles)):
            _bare(ax)
            ax.set_title(title)
            if j == 0:
                ax.imshow(imgs[i], interpolation="antialiased")
                if labels is not None:
                    ax.set_xlabel(str(labels[i]))
            elif title == "Attention" and mode != "mask":
                ax.imshow(imgs[i], interpolation="antialiased")
                heat = ax.imshow(masks[i], cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0, interpolation="antialiased")
            else:  # the paper's look: the image seen through the normalised map
                ax.imshow(imgs[i] * masks[i][..., None], interpolation="antialiased")
    if cax is not None:  # as tall as the block of images, first row to last
        cbar = colorbar_beside_block(cax, axes.ravel(), heat, "Attention (relative to max)" if scale == "max"
                                     else "Attention (min-max scaled)")
        cbar.solids.set_alpha(1.0)
    return fig


_TOKEN_WORDS = {"cls": "class", "dist": "distillation", "reg": "register"}


def _query(spec, query: int | str | tuple[int, int] | None, grid: tuple[int, int]) -> tuple[int | str | None, str]:
    """The query as ``output_rows`` takes it, and its name: ``None`` (or ``"readout"``) for the queries the head
    reads, ``"patches"`` for the mean over patch queries, else a token index (``"class"``, an int, a patch)."""
    p = spec.num_prefix_tokens
    if isinstance(query, str):
        if query == "patches":
            return "patches", "mean over patch queries"
        if query == "class":  # refused, naming the fix, on a model without a class token
            return output_rows(spec, "class", p + grid[0] * grid[1]), "class token"
        if query != "readout":
            raise InputError(f"{spec.name}: query={query!r} is not one of {TOKEN_NAMES}; pass None (the queries the "
                             "head reads), 'class', 'patches' (the mean over patch queries), a token index or a "
                             "(row, column) patch")
        query = None
    if query is None:
        read = spec.readout
        if read.weights_by_pool:
            return None, "queries weighted by the attention pool"
        if read.single_token is not None:
            return None, f"{_TOKEN_WORDS.get(spec.prefix_tokens[read.single_token], 'prefix')} token"
        if read.patch_mean:
            return None, "mean over patch queries"
        if read.how == "mean" and read.prefix_parts is not None:
            words = [_TOKEN_WORDS.get(spec.prefix_tokens[t], "prefix") for t in read.prefix_parts]
            return None, f"mean of the {' and '.join(words)} queries"
        return None, f"queries the head reads ({read.describe(spec.prefix_tokens, source=False)})"
    if isinstance(query, (tuple, list)):
        if len(query) != 2 or any(not is_int(v) for v in query):
            raise InputTypeError(f"query={query!r} is not a (row, column) patch; pass two zero-based ints, e.g. "
                                 "(0, 0), a token index, or None")
        r, c = (int(v) for v in query)
        if not (0 <= r < grid[0] and 0 <= c < grid[1]):
            raise OutOfRangeError(f"query patch {query} is outside the {grid[0]}x{grid[1]} grid")
        return p + r * grid[1] + c, f"patch (row {r + 1}, column {c + 1})"
    n = p + grid[0] * grid[1]
    if not is_int(query):
        raise InputTypeError(f"query={query!r} is a {type(query).__name__}, not a token index; pass an int in "
                             f"{-n} ... {n - 1}, a (row, column) patch, 'class', 'patches' or None")
    query = int(query)
    if not -n <= query < n:
        raise OutOfRangeError(f"query token {query} is out of range for {n} tokens")
    q = query % n
    name = spec.prefix_tokens[q] if q < p else f"patch token {q - p}"
    return q, f"{name} token" if q < p else name


@styled
def plot_attention_heads_grid(
    model: nn.Module,
    image: Images,
    layer: int = -1,
    *,
    query: int | str | tuple[int, int] | None = None,
    cmap: str | None = None,
    ncols: int = 6,
    fig: Figure | None = None,
) -> Figure:
    """The output token's attention over the patches, one panel per head, for one layer and one image.

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        image: one image (PIL, array, path, or a ``(3, H, W)`` / ``(1, 3, H, W)`` normalised tensor).
        layer: attention layer, a Python index (0 is the first; negative counts from the end); titles count from 1.
        query: the query token: by default the queries the model's head reads (``ViTSpec.readout``, as the
            explanations and the attention explorer read them): the class token of a class-token head, the mean
            over patch queries for average pooling, the mean of the class and distillation queries of
            DeiT-distilled, the queries weighted by an attention pool's own attention; ``"class"`` (the class
            token's query whatever the head reads) or ``"patches"`` (the mean over patch queries), the names
            ``token=`` takes in the explanations; an int token index, or a ``(row, column)`` patch (zero-based).
        cmap: colormap of the maps (default ``viridis`` from 0 to the largest weight; ``RdBu_r`` from ``-m`` to
            ``m``, ``m`` the largest absolute weight, when a map holds negative weights: differential attention's
            signed maps, whose negative entries a scale from 0 would draw as 0); ncols: panels per row (narrower
            than 1.5 in when ``ncols`` of them would not fit a 7 in double column); fig: draw into this figure.

    Returns:
        the figure: an "Input" panel, then "Head 1" ... "Head H" (shared scale), one colorbar "Attention weight" as
        tall as the block of panels (top of the first row's to bottom of the last row's).

    Raises:
        InputError: ``ncols`` not a positive int, more than one image, ``query`` a string other than ``"readout"``,
            ``"class"`` and ``"patches"``, or ``"class"`` on a model without a class token.
        ComputeError: the model's attention holds NaN or infinite weights at this layer (the message names the
            heads).
        InputTypeError: ``query`` neither an int, a name, a ``(row, column)`` pair of ints nor None.
        OutOfRangeError: ``query`` outside the tokens or the grid.
    """
    check_positive_int(ncols, "ncols", "the panels per row (e.g. 6)")
    x = load_images(model, image)
    if x.shape[0] != 1:
        raise InputError(f"plot_attention_heads_grid draws one image; got {x.shape[0]} (pass images[i])")
    spec = inspect(model)
    depth = len(spec.attention_modules)
    check_layer_index(layer, depth, "layer", spec.name)
    grid = spec.grid_for_input(x)
    q, qname = _query(spec, query, grid)
    with torch.no_grad(), eval_mode(model), without_autocast(model), capture_attention(model, layers=layer) as cap, \
            PoolRows(model, spec, q) as pool:  # reads an attention pool for q=None only
        model(x)
    attn = cap.attentions[0][0].float()  # (H, N, N)
    n = attn.shape[-1]
    read = pool.take(n)  # an attention pool's own attention over the tokens, (1, N); else None
    rows = output_rows(spec, q, n) if read is None else read[0]
    heads = rollout_to_maps(attn, grid, spec.num_prefix_tokens, rows).cpu().numpy()  # (H, gh, gw)
    bad = [k + 1 for k in range(len(heads)) if not np.isfinite(heads[k]).all()]
    if bad:  # the shared scale would be NaN: every panel blank (or a NaN colorbar), without a word
        raise ComputeError(f"{spec.name}: the attention of layer {layer % depth + 1} holds NaN or infinite weights "
                           f"in head(s) {bad} of {len(heads)} for this image, which the figure cannot scale; the "
                           "model computes them (most often an overflow in half precision): run it in float32, "
                           "e.g. model.float()")
    p = spec.num_prefix_tokens
    img = denormalise(model, x)[0]
    h, w = img.shape[:2]
    ch, cw = covered_pixels(model, x)

    n = len(heads) + 1
    cols = min(n, ncols)
    nrows = math.ceil(n / cols)
    if fig is None:  # panels of 1.5 in, narrower where ncols of them would not fit a double column
        aspect = min(w / h, 2.0)
        width = min(1.5 * aspect, (PAGE_WIDTH - 0.7) / cols)
        fig = new_figure((cols * width + 0.7, nrows * (width / aspect + 0.15) + 0.45))
        fig.set_layout_engine("constrained")
    block, cax = image_block(fig, nrows, cols)
    axes = block.ravel()
    cmap, vmin, vmax = attention_scale(float(heads.min()), float(heads.max()), cmap, "viridis")
    axes[0].imshow(img, interpolation="antialiased")
    axes[0].set_title("Input")
    im = None
    for k, ax in enumerate(axes[1:n]):
        # each patch over its own pixels: the grid covers (ch, cw) of the image's (h, w) (covered_pixels)
        im = ax.imshow(heads[k], cmap=cmap, vmin=vmin, vmax=vmax, extent=(0, cw, ch, 0), interpolation="nearest")
        ax.set_xlim(0, w)
        ax.set_ylim(h, 0)
        ax.set_title(f"Head {k + 1}")
    if is_int(q) and q >= p:  # mark the query patch
        from matplotlib.patches import Rectangle

        r, c = divmod(q - p, grid[1])
        sh, sw = ch / grid[0], cw / grid[1]  # the patch's own pixels: the grid covers (ch, cw) of (h, w)
        for ax in axes[:n]:
            ax.add_patch(Rectangle((c * sw, r * sh), sw, sh, fill=False, edgecolor="red", linewidth=1.0))
    for ax in axes[:n]:
        _bare(ax)
    for ax in axes[n:]:
        ax.set_visible(False)
    colorbar_beside_block(cax, axes[:n], im, "Attention weight")  # as tall as the block of maps, first row to last
    title = f"{spec.name}: layer {layer % depth + 1} of {depth}, attention of the {qname}"
    if len(title) > 11 * fig.get_figwidth():  # about the characters a line of the title holds: two lines
        title = title.replace(", attention of", "\nattention of", 1)
    fig.suptitle(title)
    return fig


def _distances(source: nn.Module | torch.Tensor | np.ndarray, images: Images | None, patch_size: int | None,
               batch_size: int, argument: str = "model_or_distances") -> tuple[np.ndarray, int]:
    """The ``(layers, heads)`` distances to draw and how many parallel branches each layer's heads come from (a
    model's parallel blocks are one layer each: ``distance_by_block``)."""
    if patch_size is not None:  # a stride of 0 or -16 px drew every head at 0 or below it, without a word
        if not is_number(patch_size) or not 0 < patch_size < math.inf:
            raise InputError(f"patch_size={patch_size!r} is not a positive number of pixels; pass the token stride, "
                             "e.g. patch_size=16, or None")
    if isinstance(source, nn.Module):
        if images is None:
            raise InputError("plot_attention_distance(model, images): pass the images to average over (the paper "
                             "uses 128), or pass precomputed (L, H) distances from vitviz.mean_attention_distance")
        spec = inspect(source)
        if patch_size is not None and (patch_size, patch_size) != tuple(spec.patch_size):
            # a rescale (patch_size / stride) left the axis saying "pixels" of numbers that were not
            sh, sw = spec.patch_size
            raise InputError(
                f"patch_size={patch_size!r}: the distances of {spec.name} are measured in its input pixels with its "
                f"{sh}x{sw} token stride, read from the model (a hybrid's is its backbone's reduction times its "
                "patch size); leave patch_size=None with a model. To draw distances counted in patches, pass them "
                "with patch_size= (the stride in pixels)")
        dist = mean_attention_distance(source, images, batch_size=batch_size)
        undefined = torch.isnan(dist)
        if bool(undefined.any()):  # seaborn left the dot out without a word
            layer, head = (int(i) + 1 for i in torch.nonzero(undefined)[0])
            raise InputError(
                f"{argument}: layer {layer}, head {head} has no mean attention distance ({int(undefined.sum())} of "
                f"the {dist.numel()} heads of {spec.name} are NaN): in some image every patch query of "
                "the head attends to prefix tokens alone, so it has no distance over patch keys "
                "(vitviz.analysis.distance). Leave those images out, or draw the finite heads from "
                "vitviz.mean_attention_distance's table yourself")
        dist, branches = distance_by_block(dist, spec.attention_blocks)
        return dist.numpy(), branches
    d = float_array(source, argument)
    if d.ndim != 2 or 0 in d.shape:
        raise InputError(f"{argument}: expected distances of shape (layers, heads) with at least one of each, got "
                         f"{d.shape}; pass vitviz.mean_attention_distance(model, images), or the model and images")
    bad = ~np.isfinite(d) | (d < 0)
    if bad.any():  # seaborn left NaN heads out without a word, and inf made matplotlib's axis limits fail
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"{argument}: {int(bad.sum())} of the {d.size} distances are negative, NaN or infinite (the "
                         f"first: layer {where[0] + 1}, head {where[1] + 1}: {d[where]}), and a mean attention "
                         "distance is a finite length of at least 0; pass vitviz.mean_attention_distance's result")
    return (d * patch_size if patch_size is not None else d), 1


def _head_colors(h: int, cmap: str | None) -> list:
    import matplotlib as mpl

    name = cmap or ("tab10" if h <= 10 else "tab20" if h <= 20 else "viridis")
    cm = mpl.colormaps[name]
    if getattr(cm, "N", 256) >= 256 or h > cm.N:
        return [cm(i / max(h - 1, 1)) for i in range(h)]
    return [cm(i) for i in range(h)]


@styled
def plot_attention_distance(
    model_or_distances: nn.Module | torch.Tensor | np.ndarray,
    images: Images | None = None,
    *,
    ax: Axes | None = None,
    label: str | None = None,
    patch_size: int | None = None,
    batch_size: int = 32,
    cmap: str | None = None,
    legend: bool = True,
    ylim: tuple[float, float] | None = None,
) -> Axes:
    """Fig. 7 right / Fig. 11: mean attention distance of every head against depth, one dot per head per layer.

    Args:
        model_or_distances: a ViT (then ``images`` is required; a parallel block's branches are drawn at the
            block's depth, their heads "Branch b, head h": ``vitviz.analysis.distance.distance_by_block``), or
            ``(L, H)`` distances in pixels from ``vitviz.mean_attention_distance`` (one row per layer drawn).
        images: the images to average over (the paper uses 128).
        ax: draw into these axes; default a new figure.
        label: the axes title (e.g. "ViT-L/16").
        patch_size: with distances, they are in patch units and are multiplied by this stride to give pixels;
            with a model, None (the stride is read from the model; another than its own is refused).
        batch_size: images per forward pass when computing.
        cmap: colormap for the heads (default ``tab10``/``tab20``, ``viridis`` beyond 20 heads).
        legend: draw "Head 1" ... "Head H" (a colorbar "Head" when there are more than 16 heads).
        ylim: y limits (default from 0 to a little above the largest distance).

    Returns:
        the axes: x "Network depth (layer)" counting layers from 1, y "Mean attention distance [pixels]".

    Raises:
        InputError: a model without ``images``, or one with a head that has no distance (NaN: in some image its
            patch queries attend to prefix tokens alone); distances not of shape ``(layers, heads)``, empty, or
            holding a negative, NaN or infinite value; ``patch_size`` not a positive number, or, with a model,
            not its token stride.
    """
    dist, branches = _distances(model_or_distances, images, patch_size, batch_size)
    n_layers, n_heads = dist.shape
    per_branch = n_heads // branches
    if ax is None:
        fig = new_figure(FIGSIZE["single"] if n_heads <= 8 else (4.2, 2.8))
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    colors = _head_colors(n_heads, cmap)
    depth = np.arange(1, n_layers + 1)
    table = distance_table(dist)  # tidy: one row per (layer, head)
    table["Head"] = [f"Head {k + 1}" if branches == 1 else f"Branch {k // per_branch + 1}, head {k % per_branch + 1}"
                     for k in table["head"]]
    sns.scatterplot(data=table, x="layer", y="distance_px", hue="Head", palette=colors, s=14, edgecolor="none",
                    alpha=0.9, zorder=2, legend=legend and n_heads <= MAX_LEGEND_HEADS, ax=ax)
    ax.set_xlabel(DIST_XLABEL)
    ax.set_ylabel(DIST_YLABEL)
    step = max(1, math.ceil(n_layers / 12))
    ax.set_xticks(depth[::step])
    ax.set_xlim(0.3, n_layers + 0.7)
    top = float(np.nanmax(dist)) if dist.size else 1.0
    ax.set_ylim(ylim or (0.0, top * 1.08 if top > 0 else 1.0))
    ax.grid(axis="y", linewidth=0.4, alpha=0.4, zorder=0)
    if label:
        ax.set_title(label)
    if legend and n_heads <= MAX_LEGEND_HEADS:
        ax.legend(title=None, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, handletextpad=0.2,
                  borderaxespad=0.0, labelspacing=0.25, ncol=1 if n_heads <= 8 else 2, columnspacing=0.6,
                  markerscale=1.2)
    elif legend:
        import matplotlib as mpl

        norm = mpl.colors.BoundaryNorm(np.arange(0.5, n_heads + 1.5), n_heads)
        cm = mpl.colors.ListedColormap(colors)
        cbar = ax.figure.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=cm), ax=ax, pad=0.02, aspect=25,
                                  ticks=[1, n_heads // 2, n_heads])
        cbar.set_label("Head")
        cbar.outline.set_linewidth(0.5)
    return ax


@styled
def plot_attention_distance_grid(
    models: Mapping[str, nn.Module | torch.Tensor | np.ndarray],
    images: Images | None = None,
    *,
    batch_size: int = 32,
    fig: Figure | None = None,
) -> Figure:
    """Several models side by side on a shared y axis, as Fig. 11 (ViT-L/16, R50x1 + ViT-L/16).

    Args:
        models: title -> a ViT or ``(L, H)`` distances, e.g. ``{"ViT": vit, "Hybrid": hybrid}``.
        images: the images every model given as a module averages over.
        batch_size: images per forward pass; fig: draw into this figure.

    Returns:
        the figure, one axes per model titled by its key; the head legend on the last axes only when every model
        has the same number of heads.
    """
    if not models:
        raise InputError("plot_attention_distance_grid needs at least one model")
    dists = {name: _distances(src, images, None, batch_size, f"models[{name!r}]")[0] for name, src in models.items()}
    heads = {d.shape[1] for d in dists.values()}
    top = max(float(np.nanmax(d)) for d in dists.values())
    if fig is None:
        fig = new_figure((2.6 * len(dists) + 0.9, 2.8))
        fig.set_layout_engine("constrained")
    axes = np.asarray(fig.subplots(1, len(dists), sharey=True, squeeze=False)).ravel()
    for i, (ax, (name, d)) in enumerate(zip(axes, dists.items())):
        plot_attention_distance(d, ax=ax, label=name, legend=len(heads) > 1 or i == len(dists) - 1,
                                ylim=(0.0, top * 1.08 if top > 0 else 1.0))
        if i:
            ax.set_ylabel("")
            ax.tick_params(labelleft=False)
    return fig
