"""Pixels for the explorers: overlays and heat maps as PNG bytes, drawn with PIL and a matplotlib colormap.

Only the map on screen travels to the browser, as one PNG in an ``ipywidgets.Image``; nothing here keeps state.
Shapes: ``(H, W, 3)`` RGB images (float in ``[0, 1]`` or uint8), ``(gh, gw)`` maps, ``(dh, dw)`` display size.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitviz.errors import UnknownNameError
from vitviz.plot.attention import upsample_maps

__all__ = ["cell_at", "check_cmap", "colorbar", "colorize", "covered_display", "display_size", "heat_png", "mark_cell",
           "overlay", "png_bytes", "resize_rgb"]

RESAMPLE = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC}
MARK = (0, 255, 255)  # cyan outline around the query patch
NO_VALUE = (128, 128, 128)  # a value that is NaN or infinite: mid grey, in none of the explorers' colormaps' ends


def check_cmap(cmap: object) -> str:
    """``cmap`` if it names a colormap in matplotlib's registry; else ``UnknownNameError`` (the explorers failed
    with matplotlib's ``KeyError`` at their first draw)."""
    import matplotlib

    if not isinstance(cmap, str) or cmap not in matplotlib.colormaps:
        raise UnknownNameError(f"cmap={cmap!r} is not a matplotlib colormap name; pass one of "
                               "matplotlib.colormaps, e.g. 'inferno' or 'viridis'")
    return cmap


def _lut(cmap: str) -> np.ndarray:
    """A ``(256, 3)`` uint8 lookup table for a matplotlib colormap name, read from the registry at each call (tens
    of microseconds): a colormap registered again under the same name is drawn as it is now."""
    import matplotlib

    return (matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3] * 255).round().astype(np.uint8)


def display_size(h: int, w: int, target: int) -> tuple[int, int]:
    """``(dh, dw)``: ``(h, w)`` scaled so that the longer side is ``target`` pixels (aspect ratio kept)."""
    scale = target / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def resize_rgb(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An ``(H, W, 3)`` image (float ``[0, 1]`` or uint8) resized to ``size = (dh, dw)`` as uint8.

    Enlargements by 2x or more use nearest neighbour (small inputs such as 32-px CIFAR images stay honest);
    other sizes use bicubic resampling.
    """
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0.0, 1.0) * 255).round().astype(np.uint8)
    h, w = arr.shape[:2]
    if (h, w) == tuple(size):
        return arr
    mode = "nearest" if size[0] >= 2 * h and size[1] >= 2 * w else "bicubic"
    return np.asarray(Image.fromarray(arr).resize((size[1], size[0]), RESAMPLE[mode]))


def _display(values: np.ndarray, size: tuple[int, int], interpolation: str,
             covered: tuple[int, int] | None = None) -> np.ndarray:
    return upsample_maps(np.asarray(values, dtype=np.float32)[None], size, None, interpolation=interpolation,
                         covered=covered)[0]


def covered_display(size: tuple[int, int], image_hw: tuple[int, int], covered_hw: tuple[int, int]
                    ) -> tuple[int, int]:
    """The ``(ch, cw)`` display pixels, from the top left, of a ``size = (dh, dw)`` drawing of an ``image_hw``
    image whose patch grid covers ``covered_hw`` of its pixels (``vitviz.plot.attention.covered_pixels``): the
    drawing's share of the grid, where each patch is drawn, marked and clicked."""
    (dh, dw), (h, w), (ch, cw) = size, image_hw, covered_hw
    return min(dh, round(dh * ch / h)), min(dw, round(dw * cw / w))


def colorize(values: np.ndarray, cmap: str, vmin: float, vmax: float) -> np.ndarray:
    """``(h, w)`` values -> ``(h, w, 3)`` uint8 colours, ``vmin`` and ``vmax`` at the ends of ``cmap``; a NaN value
    gets ``NO_VALUE`` (it was drawn in the bottom colour, as if it were the lowest value), and so does an infinite
    one (``inf`` was drawn in the top colour, as if it were the largest finite value, ``-inf`` in the bottom one)."""
    values = np.asarray(values, dtype=np.float32)
    span = max(float(vmax) - float(vmin), np.finfo(np.float32).tiny)
    idx = np.clip((values - vmin) / span, 0.0, 1.0)
    out = _lut(cmap)[np.nan_to_num(idx * 255).round().astype(np.uint8)]
    out[~np.isfinite(values)] = NO_VALUE
    return out


def overlay(base: np.ndarray, heat: np.ndarray, *, alpha: float = 0.6, cmap: str = "inferno",
            interpolation: str = "nearest", vmax: float | None = None,
            covered: tuple[int, int] | None = None, vmin: float = 0.0) -> np.ndarray:
    """A heat map blended over an image.

    Args:
        base: ``(dh, dw, 3)`` uint8 image at display size.
        heat: ``(gh, gw)`` map (one value per patch), non-negative unless ``vmin`` is below 0.
        alpha: opacity of the heat colours (0: image only, 1: map only).
        cmap: matplotlib colormap name.
        interpolation: ``nearest`` (patch blocks), ``bilinear`` or ``bicubic`` upsampling of the map.
        vmax: value drawn with the top colour (default: the map's maximum, as in the paper's Fig. 6; NaN left out).
        vmin: value drawn with the bottom colour (default 0; ``-vmax`` for a signed map on a diverging scale).
        covered: the ``(ch, cw)`` display pixels the patch grid covers (``covered_display``); the map is stretched
            over those alone and the rest, which no patch sees, gets the bottom colour. Default: the whole image.

    Returns:
        ``(dh, dw, 3)`` uint8; where the map is NaN or infinite, the image alone.
    """
    heat = np.asarray(heat, dtype=np.float32)
    finite = heat[np.isfinite(heat)]
    top = (float(finite.max()) if finite.size else vmin) if vmax is None else float(vmax)
    shown = _display(heat, base.shape[:2], interpolation, covered)
    colours = colorize(shown, cmap, vmin, top if top > vmin else vmin + 1.0)
    out = (1.0 - alpha) * base.astype(np.float32) + alpha * colours.astype(np.float32)
    bad = ~np.isfinite(shown)
    out[bad] = base[bad]  # a NaN or infinite value shows the image alone, no colour (matplotlib's "bad" colour)
    return out.round().clip(0, 255).astype(np.uint8)


def heat_png(values: np.ndarray, size: tuple[int, int], *, cmap: str, vmin: float, vmax: float,
             interpolation: str = "nearest") -> np.ndarray:
    """``(gh, gw)`` values drawn alone at display size: ``(dh, dw, 3)`` uint8."""
    return colorize(_display(values, size, interpolation), cmap, vmin, vmax)


def mark_cell(image: np.ndarray, cell: tuple[int, int], grid: tuple[int, int], colour: tuple[int, int, int] = MARK,
              covered: tuple[int, int] | None = None) -> np.ndarray:
    """Outline patch ``cell = (row, col)`` of a ``grid = (gh, gw)`` on a ``(dh, dw, 3)`` uint8 image whose
    ``covered = (ch, cw)`` top-left pixels the grid covers (default: all of it)."""
    dh, dw = covered if covered is not None else image.shape[:2]
    (r, c), (gh, gw) = cell, grid
    y0, y1 = round(r * dh / gh), round((r + 1) * dh / gh) - 1
    x0, x1 = round(c * dw / gw), round((c + 1) * dw / gw) - 1
    im = Image.fromarray(image)
    width = 1 if min(dh / gh, dw / gw) < 12 else 2
    ImageDraw.Draw(im).rectangle((x0, y0, x1, y1), outline=colour, width=width)
    return np.asarray(im)


TICK_FONT_PX = 11  # tick labels of the explorers' colour bars
TICK_ROOM = 44  # pixels right of a colour bar for its tick labels


def colorbar(height: int, cmap: str, width: int = 12, gap: int = 6,
             ticks: Sequence[tuple[float, str]] = ()) -> np.ndarray:
    """A vertical ``(height, gap + width [+ TICK_ROOM], 3)`` uint8 colour scale, top colour at the top, white gap on
    the left; ``ticks``: ``(position, text)`` pairs, position 0 at the bottom colour and 1 at the top, each drawn as a
    short tick and its text right of the bar (in ``TICK_ROOM`` more pixels; the bar is the image's scale, as a
    figure's colorbar is)."""
    ramp = np.linspace(1.0, 0.0, height, dtype=np.float32)[:, None].repeat(width, axis=1)
    bar = colorize(ramp, cmap, 0.0, 1.0)
    out = np.concatenate([np.full((height, gap, 3), 255, np.uint8), bar], axis=1)
    if not ticks:
        return out
    room = Image.new("RGB", (TICK_ROOM, height), (255, 255, 255))
    draw = ImageDraw.Draw(room)
    font = ImageFont.load_default(size=TICK_FONT_PX)
    for position, text in ticks:
        y = round((1.0 - float(position)) * (height - 1))
        draw.line((0, y, 3, y), fill=(0, 0, 0), width=1)
        top, bottom = draw.textbbox((0, 0), text, font=font)[1::2]
        ty = min(max(y - (top + bottom) / 2, -top), height - bottom)  # centred on the tick, inside the image
        draw.text((5, ty), text, fill=(0, 0, 0), font=font)
    return np.concatenate([out, np.asarray(room)], axis=1)


def png_bytes(image: np.ndarray) -> bytes:
    """Encode an ``(h, w, 3)`` uint8 image as PNG."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def cell_at(x: float, y: float, size: tuple[int, int], grid: tuple[int, int]) -> tuple[int, int] | None:
    """The ``(row, col)`` drawn at pixel ``(x, y)`` of a ``size = (dh, dw)`` drawing of a ``(gh, gw)`` grid (give the
    pixels the grid covers, ``covered_display``, where it does not cover the whole image).

    ``x`` and ``y`` index pixels (ipyevents' ``dataX``/``dataY``); each pixel belongs to the cell its centre lies in,
    as the maps are drawn (nearest-neighbour upsampling by pixel centres, ``upsample_maps``) and outlined
    (``mark_cell``), so a click on a patch's edge pixel picks the patch drawn there, not its neighbour.

    Returns:
        the cell, or ``None`` when the point lies outside the grid's drawing (e.g. on a colour bar, or on the
        image's edge that no patch sees).
    """
    dh, dw = size
    gh, gw = grid
    if not (0 <= x < dw and 0 <= y < dh):
        return None
    px, py = int(x) + 0.5, int(y) + 0.5  # the pixel's centre
    return min(int(py * gh / dh), gh - 1), min(int(px * gw / dw), gw - 1)
