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

__all__ = ["ACCURACY_TOP", "CORRELATION_TOP", "covered_data", "leader_line", "place_labels", "place_legend",
           "segment_crosses"]

# the largest values of bounded quantities: ``place_legend(..., ymax=...)`` never raises an axis past them
ACCURACY_TOP = 100.0  # an accuracy in percent
CORRELATION_TOP = 1.0  # a correlation (Pearson, Spearman), a cosine similarity

# y limits of the axes whose legend ``place_legend`` placed: (limits it found, limits it left, its ymax); a second
# call (after the figure's layout) starts from the limits found, not from the raised ones
PLACED: WeakKeyDictionary[Axes, tuple[tuple[float, float], tuple[float, float], float | None]] = WeakKeyDictionary()

# distances (points) of a label from its point, by ring: beside the marker, then with a leader line, further out
def ring_gaps(radius: float) -> tuple[float, ...]:
    """The distances (points) of ``place_labels``' rings around a marker of ``radius`` points."""
    return (radius + 1.0, 2 * radius + 5.0, 4 * radius + 10.0, 6 * radius + 16.0)


ANGLES = (20, 40, 60, 80)  # directions between the diagonals and the axes, degrees from the x axis
SEARCH_STEPS = 50_000  # choose_places: places tried before the best assignment found so far is taken


# legend positions inside the axes, in the order they are tried: corners first, then the sides' middles
LEGEND_LOCS = ("upper left", "upper right", "lower right", "lower left", "center right", "center left",
               "upper center", "lower center")


def _candidates(gap: float, ring: int = 0) -> list[tuple[float, float, str, str]]:
    """Offsets (points) and alignments around a point: the four diagonals, then above, below, right and left; from
    the second ring on (labels with a leader line) also the eight directions between those, 30 degrees off the
    axes."""
    near = [(gap, gap, "left", "bottom"), (gap, -gap, "left", "top"), (-gap, gap, "right", "bottom"),
            (-gap, -gap, "right", "top"), (0.0, 1.4 * gap, "center", "bottom"), (0.0, -1.4 * gap, "center", "top"),
            (1.4 * gap, 0.0, "left", "center_baseline"), (-1.4 * gap, 0.0, "right", "center_baseline")]
    if not ring:
        return near
    between = [(sx * 1.4 * gap * np.cos(a), sy * 1.4 * gap * np.sin(a), "left" if sx > 0 else "right",
                "bottom" if sy > 0 else "top")
               for a in np.radians(ANGLES) for sx in (1, -1) for sy in (1, -1)]
    return near + between


def place_labels(ax: Axes, xy: Any, texts: Iterable[str], colors: Iterable[Any] | None = None, *,
                 avoid: Any = None, marker_radius: float = 3.0, fontsize: float = 6.0, **kwargs: Any) -> list[Any]:
    """Name points with texts that overlap neither each other, nor the points, nor the legend, nor the axes edge, and
    whose leader lines cross no other label and no other point.

    Each label's places are the offsets of ``_candidates`` around its point, at the distances of ``ring_gaps``: first
    beside the marker, then further out with a thin leader line from the text to its point. A place is free when its
    text box, as the renderer measures it, lies inside the axes, clear of every point in ``avoid`` (a square of
    ``marker_radius`` points around each) and of the axes' legend, and its leader line (from the edge of the text's
    box to ``marker_radius`` points short of its point, as matplotlib draws it) crosses neither the legend nor
    another point. ``choose_places`` then picks one free place per label such that no two labels overlap and no
    leader line crosses another label or another leader line: as many labels as it can, then as near their points
    as it can. A label that finds no place is left out. The layout
    is settled first (``draw_without_rendering``), so call this after the figure's last layout change
    (``tight_layout``); a legend at ``loc="best"`` is fixed where it was drawn, so that it does not move onto the
    labels later.

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
    fixed = []  # the legend: no text on it, no leader line across it
    legend = ax.get_legend()
    if legend is not None and legend.get_visible():
        box = legend.get_window_extent(renderer)
        if box.overlaps(ax.get_window_extent(renderer)):
            legend.set_loc(tuple(ax.transAxes.inverted().transform((box.x0, box.y0))))
        fixed.append(box)
    others = np.asarray(xy if avoid is None else avoid, dtype=float).reshape(-1, 2)
    r = marker_radius * px
    dots = ax.transData.transform(others)
    dots = dots[np.isfinite(dots).all(axis=1)]
    squares = [Bbox.from_extents(x0 - r, y0 - r, x0 + r, y0 + r) for x0, y0 in dots]
    kws = [{"fontsize": fontsize, **kwargs} | ({"color": c} if c is not None else {}) for c in colors]
    # each label's free places, nearest first, clear of the frame, the points and the legend: (ring, dx, dy, ha, va,
    # text box, leader line or None, distance)
    free = []
    for (x, y), text, kw in zip(xy, texts, kws):
        point = ax.transData.transform((x, y))
        own = np.hypot(*(dots - point).T) < 0.5 if len(dots) else np.zeros(0, dtype=bool)  # its own marker(s)
        probe = ax.annotate(text, (x, y), xytext=(0, 0), textcoords="offset points", **kw)
        spots = []
        for ring, gap in enumerate(ring_gaps(marker_radius)):
            for k, (dx, dy, ha, va) in enumerate(_candidates(gap, ring)):
                probe.set_position((dx, dy))
                probe.set_horizontalalignment(ha)
                probe.set_verticalalignment(va)
                probe.update_positions(renderer)
                box = Text.get_window_extent(probe, renderer).padded(0.5 * px)  # the text alone, no leader line
                if not (frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)) or any(
                        box.overlaps(b) for b in [*fixed, *squares]):
                    continue
                # from the text's own box: matplotlib clips the line at that box padded by 2 points, or a little
                # inside it (its clipping is approximate), so the line drawn never starts outside this one
                leader = leader_line(box, point, r) if ring else None
                if leader is not None and (any(segment_crosses(*leader, b) for b in fixed) or any(
                        segment_crosses(*leader, sq) for sq, mine in zip(squares, own) if not mine)):
                    continue
                # how far: the ring's distance, then the order of _candidates (upper right first)
                spots.append((ring, dx, dy, ha, va, box, leader, gap * (1.0 + 0.01 * k)))
        probe.remove()
        free.append(spots)

    best = choose_places([[spot[5:] for spot in spots] for spots in free])
    placed = []
    for i in sorted(best):
        ring, dx, dy, ha, va = free[i][best[i]][:5]
        arrow = {"arrowprops": {"arrowstyle": "-", "lw": 0.4, "color": colors[i] or "0.3", "shrinkA": 0,
                                "shrinkB": marker_radius}} if ring else {}
        placed.append(ax.annotate(texts[i], tuple(xy[i]), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                  **kws[i], **arrow))
    return placed


def choose_places(free: Sequence[Sequence[tuple[Bbox, Any, float]]], steps: int = SEARCH_STEPS) -> dict[int, int]:
    """One place per label, clear of the others: no two text boxes overlap, no leader line crosses another label's box
    or another leader line; as many labels as possible, then as near their points as possible.

    A branch-and-bound search over ``free[i]``, the places of label ``i`` (``(text box, leader line or None, distance
    from its point)``, nearest first): the label with the fewest places left goes next (ties: the earlier label),
    each of its places nearest first, then leaving it out; every place taken strikes out the places of the other
    labels it clashes with. It keeps the assignment naming the most labels, and among those the smallest sum of
    distances; a branch that cannot beat it is cut. After ``steps`` places tried, the best found so far is taken,
    and each label in turn moves to its nearest place clear of the others' (a label left out takes any such place)
    until none moves.

    Returns:
        label -> the index of its place in ``free[label]``; labels left out are missing.
    """
    owner = np.array([i for i, spots in enumerate(free) for _ in spots], dtype=int)
    if not len(owner):
        return {}
    index = [np.flatnonzero(owner == i) for i in range(len(free))]
    flat = [spot for spots in free for spot in spots]
    boxes = np.array([[b.x0, b.y0, b.x1, b.y1] for b, _, _ in flat])
    cost = np.array([d for _, _, d in flat], dtype=float)
    clash = ((boxes[:, None, 0] < boxes[None, :, 2]) & (boxes[None, :, 0] < boxes[:, None, 2])
             & (boxes[:, None, 1] < boxes[None, :, 3]) & (boxes[None, :, 1] < boxes[:, None, 3]))
    ends = np.array([np.concatenate(line) if line is not None else np.full(4, np.nan) for _, line, _ in flat])
    crosses = _segments_cross_boxes(ends[:, :2], ends[:, 2:], boxes)  # leader of row crosses box of column
    clash |= crosses | crosses.T | _segments_cross(ends)
    clash[owner[:, None] == owner[None, :]] = False
    best: dict[int, int] = {}
    best_cost = np.inf
    tried = 0

    def search(chosen: dict[int, int], spent: float, alive: np.ndarray, left: list[int]) -> None:
        nonlocal best, best_cost, tried
        if len(chosen) > len(best) or (len(chosen) == len(best) and spent < best_cost):
            best, best_cost = dict(chosen), spent
        if not left or tried >= steps:
            return
        options = {i: index[i][alive[index[i]]] for i in left}
        reachable = [i for i in left if len(options[i])]
        if len(chosen) + len(reachable) < len(best) or (len(chosen) + len(reachable) == len(best) and spent + sum(
                cost[options[i]].min() for i in reachable) >= best_cost):
            return
        i = min(left, key=lambda j: (len(options[j]), j))
        rest = [j for j in left if j != i]
        for c in options[i]:
            tried += 1
            chosen[i] = int(c - index[i][0])
            search(chosen, spent + cost[c], alive & ~clash[c], rest)
            del chosen[i]
            if tried >= steps:
                return
        search(chosen, spent, alive, rest)  # leave label i out

    search({}, 0.0, np.ones(len(owner), dtype=bool), list(range(len(free))))
    # then each label in turn to its nearest place clear of the others' (a left-out one to any), until none moves
    chosen = {i: int(index[i][0] + k) for i, k in best.items()}
    moved = True
    while moved:
        moved = False
        for i in range(len(free)):
            others = [c for j, c in chosen.items() if j != i]
            blocked = clash[others].any(axis=0) if others else np.zeros(len(owner), dtype=bool)
            options = [c for c in index[i][np.argsort(cost[index[i]], kind="stable")] if not blocked[c]]
            if options and (i not in chosen or cost[options[0]] < cost[chosen[i]]):
                chosen[i], moved = int(options[0]), True
    return {i: int(c - index[i][0]) for i, c in chosen.items()}


def _segments_cross(ends: np.ndarray) -> np.ndarray:
    """``(n, n)``: whether segments ``ends[k] = (x0, y0, x1, y1)`` cross (proper crossings: orientation tests); NaN
    segments cross nothing."""
    p, r = ends[:, None, :2], ends[:, None, 2:] - ends[:, None, :2]
    q, s = ends[None, :, :2], ends[None, :, 2:] - ends[None, :, :2]

    def cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]

    with np.errstate(invalid="ignore"):
        d1, d2 = cross(r, q - p), cross(r, q + s - p)  # q's ends on either side of p's line
        d3, d4 = cross(s, p - q), cross(s, p + r - q)  # p's ends on either side of q's line
        return (d1 * d2 < 0) & (d3 * d4 < 0)


def _segments_cross_boxes(a: np.ndarray, b: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``(n, m)``: whether segment ``a[k] -> b[k]`` crosses box ``boxes[l]`` (``x0, y0, x1, y1``); NaN segments cross
    nothing (``_clip``, for all pairs at once)."""
    t0 = np.zeros((len(a), len(boxes)))
    t1 = np.ones((len(a), len(boxes)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for axis in (0, 1):
            s, d = a[:, axis, None], (b - a)[:, axis, None]
            lo, hi = boxes[None, :, axis], boxes[None, :, axis + 2]
            u, v = (lo - s) / d, (hi - s) / d
            inside = (s >= lo) & (s <= hi)
            t0 = np.maximum(t0, np.where(d == 0, np.where(inside, -np.inf, np.inf), np.minimum(u, v)))
            t1 = np.minimum(t1, np.where(d == 0, np.where(inside, np.inf, -np.inf), np.maximum(u, v)))
    return (t0 <= t1) & np.isfinite(a).all(axis=1)[:, None]


def _clip(a: np.ndarray, b: np.ndarray, box: Bbox) -> tuple[float, float] | None:
    """The part ``(t0, t1)`` of the segment ``a + t (b - a)``, ``0 <= t <= 1``, inside ``box`` (Liang-Barsky), or
    ``None`` when the segment misses it."""
    t0, t1 = 0.0, 1.0
    for d, s, lo, hi in ((b[0] - a[0], a[0], box.x0, box.x1), (b[1] - a[1], a[1], box.y0, box.y1)):
        if d == 0:
            if s < lo or s > hi:
                return None
            continue
        u, v = sorted(((lo - s) / d, (hi - s) / d))
        t0, t1 = max(t0, u), min(t1, v)
        if t0 > t1:
            return None
    return t0, t1


def segment_crosses(a: Any, b: Any, box: Bbox) -> bool:
    """Whether the segment from ``a`` to ``b`` (display coordinates) crosses or touches ``box``."""
    return _clip(np.asarray(a, dtype=float), np.asarray(b, dtype=float), box) is not None


def leader_line(text_box: Bbox, point: Any, shrink: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The leader line of an annotation whose text fills ``text_box`` (display coordinates): from the box's centre
    towards ``point``, starting where it leaves the box and ending ``shrink`` pixels short of the point (matplotlib's
    ``shrinkB``); ``None`` when nothing of it is left. Matplotlib draws a part of it: it clips the line near the
    box padded by 2 points."""
    point = np.asarray(point, dtype=float)
    centre = np.array([(text_box.x0 + text_box.x1) / 2, (text_box.y0 + text_box.y1) / 2])
    length = float(np.hypot(*(point - centre)))
    inside = _clip(centre, point, text_box)
    start = 0.0 if inside is None else inside[1]
    end = 1.0 - shrink / length if length > 0 else 0.0
    if end <= start:
        return None
    return centre + start * (point - centre), centre + end * (point - centre)


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
