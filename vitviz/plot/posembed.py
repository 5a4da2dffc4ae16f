"""Position-embedding similarity figures in the style of the ViT paper's Fig. 7 center and Fig. 10.

Dosovitskiy et al., ICLR 2021 (arXiv 2010.11929): a ``gh x gw`` grid of tiles; tile ``(r, c)`` is itself a
``gh x gw`` image of the cosine similarity between the position embedding of patch ``(r, c)`` and those of all
patches. Axes "Input patch row" / "Input patch column", numbered from 1; one colorbar, "Cosine similarity".
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import nn

from vitviz.analysis.posembed import Size, pos_embed_similarity
from vitviz.core.util import check_positive_int, float_array, is_int
from vitviz.errors import DataNotFoundError, InputError, InputTypeError, OutOfRangeError
from vitviz.plot.style import FIGSIZE, colorbar_beside, label, new_figure, styled

__all__ = ["plot_pos_embed", "plot_pos_embed_similarity", "plot_posemb_ablation_grid", "pos_embed_mosaic", "tile_layout"]

ROW_LABEL = "Input patch row"
COL_LABEL = "Input patch column"
CBAR_LABEL = "Cosine similarity"
COSINE_SLACK = 1e-4  # float32 rounding: a cosine may come out a little past 1


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def tile_layout(grid_size: tuple[int, int], max_tiles: int = 16) -> tuple[np.ndarray, np.ndarray, int]:
    """Which query patches get a tile: every ``k``-th row and column, so that at most ``max_tiles`` per side.

    Args:
        grid_size: ``(gh, gw)``.
        max_tiles: most tiles along either side.

    Returns:
        ``(rows, cols, k)``: zero-based patch rows and columns shown, and the step ``k`` (1: all tiles).

    Raises:
        InputError: ``max_tiles`` is not a positive int.
    """
    check_positive_int(max_tiles, "max_tiles", "the most tiles along either side (e.g. 16)")
    gh, gw = grid_size
    k = max(1, math.ceil(max(gh, gw) / max_tiles))
    return np.arange(0, gh, k), np.arange(0, gw, k), k


def pos_embed_mosaic(sim: np.ndarray, rows: np.ndarray, cols: np.ndarray, gap: int) -> np.ndarray:
    """Lay the tiles ``sim[r, c]`` (each ``gh x gw``) out as one image, tiles ``gap`` pixels apart.

    Args:
        sim: ``(gh, gw, gh, gw)`` similarities.
        rows, cols: query patch rows and columns to show (zero-based), top to bottom and left to right.
        gap: pixels between tiles (filled with NaN).

    Returns:
        array ``(len(rows) * gh + (len(rows) - 1) * gap, len(cols) * gw + (len(cols) - 1) * gap)``.
    """
    gh, gw = sim.shape[:2]
    out = np.full((len(rows) * (gh + gap) - gap, len(cols) * (gw + gap) - gap), np.nan, dtype=np.float32)
    for a, r in enumerate(rows):
        for b, c in enumerate(cols):
            y, x = a * (gh + gap), b * (gw + gap)
            out[y:y + gh, x:x + gw] = sim[r, c]
    return out


def _cmap(name: str):
    import matplotlib as mpl

    return mpl.colormaps[name].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))  # the gaps show the axes background


def _as_sim(source: nn.Module | torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(source, nn.Module):
        source = pos_embed_similarity(source)
    sim = float_array(source, "sim").astype(np.float32)
    if sim.ndim != 4 or sim.shape[:2] != sim.shape[2:]:
        raise InputError(f"expected similarities of shape (gh, gw, gh, gw), got {sim.shape}")
    # the scale is fixed at [-1, 1]: a larger value (dot products, not cosines) was drawn in the end colour, a NaN in
    # none (the axes background), and the colorbar said "Cosine similarity" all the same
    bad = ~(np.abs(sim) <= 1.0 + COSINE_SLACK)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"sim holds {int(bad.sum())} values that are no cosine similarity (NaN, or outside [-1, 1]; "
                         f"the first at {where}: {sim[where]}); pass vitviz.pos_embed_similarity(model) (or the "
                         "model), not dot products or distances")
    return sim


@styled
def plot_pos_embed(
    model: nn.Module | torch.Tensor,
    *,
    ax: Axes | None = None,
    img_size: Size | None = None,
    cmap: str = "viridis",
    max_tiles: int = 16,
    title: str | None = None,
    grid_size: Size | None = None,
    num_prefix_tokens: int | None = None,
) -> Axes:
    """Fig. 7 center for any ViT: similarity of each patch's position embedding with all others, as tiles.

    Tile ``(r, c)`` (row ``r`` from the top, column ``c`` from the left) shows ``cos(E_rc, E_ij)`` over all
    ``(i, j)``. The tiles are drawn as one mosaic image with thin gaps. Grids wider than ``max_tiles`` show every
    ``k``-th row and column of tiles (each tile still covers the full grid), and the title says so.

    Args:
        model: a ViT, or a ``(1, L, D)`` position-embedding tensor (then pass ``grid_size``).
        img_size: resample the embedding to this input size first (timm's bicubic resampling); a multiple of the
            token stride (``vitviz.analysis.posembed.patch_pos_embed``).
        ax: draw into these axes (a colorbar is added beside them); default a new ``4.8 x 4.4`` in figure.
        cmap: matplotlib colormap name.
        max_tiles: most tiles along either side.
        title: the axes title; default "Position embedding similarity — <name>" and the grid.
        grid_size, num_prefix_tokens: for a tensor, as in ``vitviz.pos_embed_similarity``.

    Returns:
        the axes holding the mosaic; ``ax.figure`` also holds the colorbar "Cosine similarity" (limits
        ``[-1, 1]``), an inset of ``ax`` (``ax.child_axes``; ``ax.images[0].colorbar``) exactly as tall as the
        mosaic whatever the grid's aspect.

    Raises:
        InputError: ``max_tiles`` is not a positive int; as ``vitviz.pos_embed_similarity`` for the embedding.
    """
    sim = pos_embed_similarity(model, img_size=img_size, grid_size=grid_size, num_prefix_tokens=num_prefix_tokens)
    sim_np = sim.numpy()
    gh, gw = sim_np.shape[:2]
    rows, cols, k = tile_layout((gh, gw), max_tiles)
    gap = max(1, round(max(gh, gw) / 7))
    mosaic = pos_embed_mosaic(sim_np, rows, cols, gap)

    if ax is None:
        fig = new_figure(FIGSIZE["square"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    im = ax.imshow(mosaic, cmap=_cmap(cmap), vmin=-1.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(np.arange(len(cols)) * (gw + gap) + (gw - 1) / 2, [str(c + 1) for c in cols])
    ax.set_yticks(np.arange(len(rows)) * (gh + gap) + (gh - 1) / 2, [str(r + 1) for r in rows])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel(COL_LABEL)
    ax.set_ylabel(ROW_LABEL)
    colorbar_beside(ax, im, CBAR_LABEL, ticks=[-1, -0.5, 0, 0.5, 1])  # as tall as the mosaic, any grid aspect

    if title is None:
        if isinstance(model, nn.Module):
            from vitviz.core.spec import inspect

            spec = inspect(model)
            name, old = spec.name, spec.grid_size
        else:
            name, old = "position embedding tensor", (gh, gw)
        grid = f"{gh}x{gw} grid" + (f", resampled from {old[0]}x{old[1]}" if (gh, gw) != tuple(old) else "")
        title = f"Position embedding similarity — {name}\n({grid})"
        if k > 1:
            title += f"\ntiles for every {_ordinal(k)} row and column"
    ax.set_title(title)
    return ax


def _patch(query: object) -> tuple[int, int]:
    """``query`` as a ``(row, column)`` of ints; ``InputTypeError`` for anything else (a float, a flat index)."""
    rc = None
    if isinstance(query, (tuple, list)) and len(query) == 2:
        rc = tuple(None if not is_int(v) else int(v) for v in query)
    if rc is None or None in rc:
        raise InputTypeError(f"query={query!r} is not a (row, column) patch; pass two zero-based ints, e.g. (0, 0)")
    return rc[0], rc[1]


@styled
def plot_pos_embed_similarity(
    sim: torch.Tensor | np.ndarray | nn.Module,
    query: tuple[int, int] = (0, 0),
    *,
    ax: Axes | None = None,
    cmap: str = "viridis",
    colorbar: bool = True,
) -> Axes:
    """One tile of Fig. 7 center, large: similarity of patch ``query``'s position embedding to all patches.

    Args:
        sim: ``(gh, gw, gh, gw)`` similarities from ``vitviz.pos_embed_similarity`` (or a ViT, to compute them).
        query: zero-based ``(row, column)`` of the patch, as in ``sim[row, column]``; the axes number patches
            from 1, and a red square marks the query.
        ax: draw here; default a new ``3.4 x 2.8`` in figure.
        cmap: matplotlib colormap name.
        colorbar: add a colorbar "Cosine similarity" (limits ``[-1, 1]``), an inset of ``ax`` as tall as the map.

    Returns:
        the axes.

    Raises:
        InputError: ``sim`` is not of shape ``(gh, gw, gh, gw)``, or holds a NaN or a value outside ``[-1, 1]``.
        InputTypeError: ``query`` is not a ``(row, column)`` pair of ints, or ``sim`` does not hold numbers.
        OutOfRangeError: ``query`` is outside the grid.
    """
    r, c = _patch(query)
    sim_np = _as_sim(sim)
    gh, gw = sim_np.shape[:2]
    if not (0 <= r < gh and 0 <= c < gw):
        raise OutOfRangeError(f"query {query} is outside the {gh}x{gw} grid (zero-based row, column)")
    if ax is None:
        fig = new_figure(FIGSIZE["single"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    im = ax.imshow(sim_np[r, c], cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    step_r, step_c = max(1, math.ceil(gh / 12)), max(1, math.ceil(gw / 12))
    ax.set_xticks(np.arange(0, gw, step_c), [str(j + 1) for j in range(0, gw, step_c)])
    ax.set_yticks(np.arange(0, gh, step_r), [str(i + 1) for i in range(0, gh, step_r)])
    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    for spine in ax.spines.values():
        spine.set_visible(True)
    ax.set_xlabel(COL_LABEL)
    ax.set_ylabel(ROW_LABEL)
    ax.set_title(f"Similarity to patch ({r + 1}, {c + 1})")
    if colorbar:
        colorbar_beside(ax, im, CBAR_LABEL, ticks=[-1, -0.5, 0, 0.5, 1])
    return ax


# one colour per kind of position embedding, shared by both panels of plot_posemb_ablation_grid
ABLATION_COLORS = {"No Pos. Emb.": "#7f7f7f", "1-D Pos. Emb.": "#1f77b4", "2-D Pos. Emb.": "#d62728"}


def _short_kind(table8_row: str) -> str:
    return {"No Pos. Emb.": "None"}.get(table8_row, table8_row.replace(" Pos. Emb.", ""))


@styled
def plot_posemb_ablation_grid(directory: str | os.PathLike | None = None) -> Figure:
    """The position-embedding ablation (paper Table 8) for vitviz's CIFAR-10 models, beside the paper's numbers.

    Left: CIFAR-10 test top-1 after every epoch for ``cifar10-vit-nopos``, ``cifar10-vit-1dpos`` and
    ``cifar10-vit-2dpos`` (one recipe and budget, read from their cards; the final value is that of the exported
    fp16 weights on all 10,000 test images; the title names the recipe fields or budgets that differ, if any).
    Right: Table 8's default-stem row (ViT-B/16, ImageNet 5-shot linear).
    The two panels measure different things on different scales; compare the ordering and the gaps, not the values.

    Args:
        directory: folder of the cards (default ``vitviz/zoo/checkpoints``).

    Returns:
        the figure: two axes, the learning curves and the paper's Table 8 row.

    Raises:
        FileNotFoundError: none of the three models has a card (train them with ``make train-reference``).
    """
    from vitviz.zoo.cards import posemb_ablation_results, read_cards

    table = posemb_ablation_results(directory)
    cards = read_cards(directory)
    trained = table[table["trained"]]
    if trained.empty:
        raise DataNotFoundError("no card of cifar10-vit-nopos, cifar10-vit-1dpos or cifar10-vit-2dpos was found; "
                                "train them with `make train-reference` (or pass directory=)")
    fig = new_figure(FIGSIZE["wide"])
    fig.set_layout_engine("constrained")
    ax_curve, ax_paper = fig.subplots(1, 2, width_ratios=[1.6, 1])
    for row in trained.itertuples():
        history = cards[row.model]["history"]
        color = ABLATION_COLORS[row.pos_emb]
        ax_curve.plot([h["epoch"] for h in history], [h["test_acc"] for h in history], color=color,
                      label=f"{_short_kind(row.pos_emb)} ({row.model}): {row.test_top1:.2f}%")
        ax_curve.plot([row.epochs], [row.test_top1], "o", color=color, markersize=4)
    ax_curve.set_xlabel("Epoch")
    ax_curve.set_ylabel(label("CIFAR-10 test top-1", "%"))
    epochs = sorted({int(e) for e in trained["epochs"]})
    budget = (f"{epochs[0]} epoch{'s' if epochs[0] != 1 else ''}" if len(epochs) == 1
              else "UNEQUAL budgets: " + ", ".join(map(str, epochs)) + " epochs")
    # the recipe as posemb_ablation_results compares it with the 1-D control's (epochs apart: the budget says those)
    differ = sorted({f for d in trained["recipe_differences"] for f in d.split(", ") if f and f != "epochs"})
    if differ:
        recipe = "UNEQUAL recipes: " + ", ".join(differ) + " differ"
    elif trained["same_recipe_as_control"].isna().any():
        recipe = "recipe unchecked (no 1-D control)"
    else:
        recipe = "one recipe"
    if recipe == "one recipe" and len(epochs) == 1:
        ax_curve.set_title(f"vitviz CIFAR-10 ViTs, {recipe}, {budget}")
    else:  # a warning gets lines of its own, wrapped to the panel's width
        import textwrap

        ax_curve.set_title("\n".join(["vitviz CIFAR-10 ViTs", *textwrap.wrap(f"{recipe}, {budget}", 48)]))
    ax_curve.legend(loc="lower right", frameon=False)
    ax_curve.grid(alpha=0.3)

    kinds = list(table["pos_emb"])
    values = 100 * table["paper_5shot"].to_numpy()
    # points, not bars: the axis does not start at 0, and a bar would exaggerate the 3-point gap
    for i, (kind, v) in enumerate(zip(kinds, values)):
        ax_paper.plot([i], [v], "o", color=ABLATION_COLORS[kind], markersize=7)
        ax_paper.annotate(f"{v:.1f}", (i, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax_paper.set_xticks(range(len(kinds)), [_short_kind(k) for k in kinds])
    ax_paper.set_xlim(-0.5, len(kinds) - 0.5)
    ax_paper.grid(axis="y", alpha=0.3)
    ax_paper.set_ylim(60, 66)
    ax_paper.set_xlabel("Position embedding")
    ax_paper.set_ylabel(label("ImageNet 5-shot linear top-1", "%"))
    ax_paper.set_title("Paper, Table 8 (ViT-B/16)")
    return fig
