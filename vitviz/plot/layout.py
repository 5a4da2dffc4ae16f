"""Where text goes in a drawn figure: names beside points (``place_labels``) and legends (``place_legend``) that
cover neither each other nor the data, measured with the renderer's own text and legend extents.

Both settle the layout first (``Figure.draw_without_rendering``), so call them after a figure's last layout change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from vitviz.errors import InputError

__all__ = ["ACCURACY_TOP", "CORRELATION_TOP", "covered_data", "place_labels", "place_legend"]

# the largest values of bounded quantities: ``place_legend(..., ymax=...)`` never raises an axis past them
ACCURACY_TOP = 100.0  # an accuracy in percent
CORRELATION_TOP = 1.0  # a correlation (Pearson, Spearman), a cosine similarity

# y limits of the axes whose legend ``place_legend`` placed: (limits it found, limits it left, its ymax); a second
# call (after the figure's layout) starts from the limits found, not from the raised ones
PLACED: WeakKeyDictionary[Axes, tuple[tuple[float, float], tuple[float, float], float | None]] = WeakKeyDictionary()

# legend positions inside the axes, in the order they are tried: corners first, then the sides' middles
LEGEND_LOCS = ("upper left", "upper right", "lower right", "lower left", "center right", "center left",
               "upper center", "lower center")


def _candidates(gap: float) -> list[tuple[float, float, str, str]]:
    """Offsets (points) and alignments around a point: the four diagonals, then above, below, right and left."""
    return [(gap, gap, "left", "bottom"), (gap, -gap, "left", "top"), (-gap, gap, "right", "bottom"),
            (-gap, -gap, "right", "top"), (0.0, 1.4 * gap, "center", "bottom"), (0.0, -1.4 * gap, "center", "top"),
            (1.4 * gap, 0.0, "left", "center_baseline"), (-1.4 * gap, 0.0, "right", "center_baseline")]


def place_labels(ax: Axes, xy: Any, texts: Iterable[str], colors: Iterable[Any] | None = None, *,
                 avoid: Any = None, marker_radius: float = 3.0, fontsize: float = 6.0, **kwargs: Any) -> list[Any]:
    """Name points with texts that overlap neither each other, nor the points, nor the legend, nor the axes edge.

    Greedy placement: each label in turn (the order of ``texts`` is its priority) tries the offsets of
    ``_candidates`` around its point, first at ``marker_radius + 1`` points, then two and four times as far (with a
    thin leader line), and takes the first place whose text box, as the renderer measures it, lies inside the axes and
    clear of the labels already placed, of every point in ``avoid`` (a square of ``marker_radius`` points around
    each) and of the axes' legend. A label that finds no free place is left out. The layout is settled first
    (``draw_without_rendering``), so call this after the figure's last layout change (``tight_layout``); a legend
    at ``loc="best"`` is fixed where it was drawn, so that it does not move onto the labels later.

    Args:
        ax: the axes.
        xy: ``(n, 2)`` data coordinates of the points named.
        texts: ``n`` labels.
        colors: ``n`` text colours (default the text colour).
        avoid: ``(m, 2)`` data coordinates of all points the labels must not cover (default ``xy``).
        marker_radius: half the marker size, in points.
        fontsize: label size, in points; further ``kwargs`` go to ``ax.annotate``.

    Returns:
        the annotations placed, in the order of ``texts`` (those left out are not returned).
    """
    xy = np.asarray(xy, dtype=float).reshape(-1, 2)
    texts = list(texts)
    colors = list(colors) if colors is not None else [None] * len(texts)
    if not len(xy) == len(texts) == len(colors):
        raise InputError(f"place_labels: {len(xy)} points, {len(texts)} texts and {len(colors)} colours; pass one of "
                         "each per point")
    fig = ax.figure
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72.0  # display pixels per point
    frame = ax.get_window_extent(renderer).padded(-px)
    blocked = []
    legend = ax.get_legend()
    if legend is not None and legend.get_visible():
        box = legend.get_window_extent(renderer)
        if box.overlaps(ax.get_window_extent(renderer)):
            legend.set_loc(tuple(ax.transAxes.inverted().transform((box.x0, box.y0))))
        blocked.append(box)
    others = np.asarray(xy if avoid is None else avoid, dtype=float).reshape(-1, 2)
    r = marker_radius * px
    for x0, y0 in ax.transData.transform(others):
        blocked.append(Bbox.from_extents(x0 - r, y0 - r, x0 + r, y0 + r))
    placed = []
    for (x, y), text, color in zip(xy, texts, colors):
        kw = {"fontsize": fontsize, **kwargs} | ({"color": color} if color is not None else {})
        probe = ax.annotate(text, (x, y), xytext=(0, 0), textcoords="offset points", **kw)
        spot = None
        for ring, gap in enumerate((marker_radius + 1.0, 2 * marker_radius + 5.0, 4 * marker_radius + 10.0)):
            for dx, dy, ha, va in _candidates(gap):
                probe.set_position((dx, dy))
                probe.set_horizontalalignment(ha)
                probe.set_verticalalignment(va)
                probe.update_positions(renderer)
                box = Text.get_window_extent(probe, renderer).padded(0.5 * px)  # the text alone, no leader line
                if frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1) and not any(
                        box.overlaps(b) for b in blocked):
                    spot = (ring, dx, dy, ha, va, box)
                    break
            if spot:
                break
        probe.remove()
        if spot is None:
            continue
        ring, dx, dy, ha, va, box = spot
        leader = {"arrowprops": {"arrowstyle": "-", "lw": 0.4, "color": color or "0.3", "shrinkA": 0,
                                 "shrinkB": marker_radius}} if ring else {}
        placed.append(ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                  **kw, **leader))
        blocked.append(box)
    return placed


def covered_data(ax: Axes, box: Bbox) -> list[str]:
    """The data of ``ax`` that the display box ``box`` covers: lines (their segments, at 50 points each), bands
    (``fill_between``, filled), error bars, markers and reference lines (``axhline``: a legend on one hides it);
    the grid and texts are not data.

    Returns:
        one description per artist covered (empty: ``box`` is clear of the data).
    """
    hits = []
    for k, artist in enumerate(ax.get_children()):
        if not artist.get_visible() or isinstance(artist, Legend):
            continue
        what = f"{type(artist).__name__} {k} ({artist.get_label()})"
        if isinstance(artist, Line2D):
            xy = np.asarray(artist.get_xydata(), dtype=float)
            if not len(xy):
                continue
            pts = artist.get_transform().transform(xy)
            if len(pts) > 1 and artist.get_linestyle() not in ("None", "", " "):
                t = np.linspace(0.0, 1.0, 50)[:, None]
                pts = np.concatenate([a + t * (b - a) for a, b in zip(pts[:-1], pts[1:])])
            if np.any(_inside(pts, box)):
                hits.append(what)
        elif isinstance(artist, (PolyCollection, LineCollection)):
            if any(path.transformed(artist.get_transform()).intersects_bbox(box, filled=isinstance(
                    artist, PolyCollection)) for path in artist.get_paths()):
                hits.append(what)
        elif isinstance(artist, PathCollection) and len(artist.get_offsets()):
            if np.any(_inside(artist.get_offset_transform().transform(artist.get_offsets()), box)):
                hits.append(what)
    return hits


def _inside(pts: np.ndarray, box: Bbox) -> np.ndarray:
    ok = np.isfinite(pts).all(axis=1)
    return ok & (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)


def place_legend(ax: Axes, *args: Any, locs: Sequence[str] = LEGEND_LOCS, headroom: int = 3,
                 ymax: float | None = None, **kwargs: Any) -> Legend:
    """``ax.legend(*args, **kwargs)`` at the first place in ``locs`` where it covers no data (``covered_data``).

    Where every place covers some, the y axis is raised by a sixth of its range (at most ``headroom`` times, never
    above ``ymax``) to make room above the data, and the upper places are tried again; failing that the legend goes
    beside the axes (``style.LEGEND_BESIDE``) and the y axis keeps its limits. ``ymax`` is the largest value the
    quantity can take: 100 for an accuracy in percent (``ACCURACY_TOP``), 1 for a correlation (``CORRELATION_TOP``);
    an axis stretched past it would show a range no value can reach (an axis the data already carry past it is not
    cut). Matplotlib's ``loc="best"`` counts a band only by its outline, so it may put a legend on one.

    Without ``args`` and ``kwargs``, the legend ``ax`` already has is moved (call it again once a figure's layout is
    final: a figure-level function lays out its panels after each placed its legend); the y limits this function
    raised before are restored first, and ``ymax`` defaults to the one given then.

    Returns:
        the legend.
    """
    from vitviz.plot.style import LEGEND_BESIDE

    fig = ax.figure
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend()
    if args or kwargs or legend is None:
        legend = ax.legend(*args, loc=locs[0], **kwargs)
    earlier = PLACED.get(ax)
    if earlier is not None:  # placed before: start again from the limits it found, with its bound
        limits, raised, bound = earlier
        ymax = bound if ymax is None else ymax
        if ax.get_ylim() == raised:
            ax.set_ylim(*limits)
    limits = ax.get_ylim()
    top = max(limits[1], ymax) if ymax is not None else float("inf")  # the data may already reach past ymax
    for attempt in range(headroom + 1):
        for loc in locs if attempt == 0 else [loc for loc in locs if loc.startswith("upper")]:
            legend.set_loc(loc)
            legend.set_bbox_to_anchor(None)
            if not covered_data(ax, legend.get_window_extent(renderer)):
                PLACED[ax] = (limits, ax.get_ylim(), ymax)
                return legend
        low, high = ax.get_ylim()
        if high >= top:
            break
        ax.set_ylim(low, min(high + (high - low) / 6, top))
    ax.set_ylim(*limits)
    PLACED[ax] = (limits, limits, ymax)
    legend.set_loc(LEGEND_BESIDE["loc"])
    legend.set_bbox_to_anchor(LEGEND_BESIDE["bbox_to_anchor"], transform=ax.transAxes)
    return legend
