"""The look shared by every vitviz figure, and ``save_figure``.

Figures are sized for a paper column or a notebook cell (a few inches wide) with fonts readable at that size.
Plot functions draw inside ``vitviz_style()``; it changes matplotlib's settings only for their duration.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from vitviz.core.util import is_number
from vitviz.errors import InputError, InputTypeError

__all__ = ["RC", "FIGSIZE", "LEGEND_BESIDE", "PAGE_WIDTH", "PAPER_FIGURES", "BlockSpan", "band_legend_title",
           "colorbar_beside", "colorbar_beside_block", "fit_columns", "image_block", "interval_label", "label",
           "new_figure", "plot_level", "save_figure", "styled", "vitviz_style"]

# rcParams for paper-size figures: 8-9 pt text, thin lines, no top/right spines
RC: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "figure.titlesize": 10,
    "axes.linewidth": 0.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.major.width": 0.8,
    "ytick.major.width": 0.8,
    "xtick.major.size": 3,
    "ytick.major.size": 3,
    "lines.linewidth": 1.5,
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.05,
    "pdf.fonttype": 42,  # TrueType in PDFs: editable text
    "svg.fonttype": "none",
    "svg.hashsalt": "vitviz",  # fixed SVG element ids: the same figure gives the same bytes
    "image.interpolation": "nearest",
}

# Fixed file metadata per format: no creation dates and no software versions, so that rendering the same figure
# twice gives byte-identical files (``make report`` on an unchanged tree changes no tracked file).
METADATA: dict[str, dict[str, None]] = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
}

# The naming rule of vitviz's plot functions (seaborn's split): an axes-level function is
# ``plot_<thing>(data, *, ax=None, ...) -> Axes`` and draws into one Axes (a colorbar may be added beside it); a
# figure-level function lays out several Axes and returns the Figure; its name ends in ``_grid`` (seaborn's word
# for its figure-level objects), except the ViT paper's two multi-panel figures whose names the design contract
# fixes: ``plot_rollout`` (Fig. 6, input/attention pairs) and ``plot_compute_curves`` (Fig. 5, two panels).
PAPER_FIGURES = ("plot_rollout", "plot_compute_curves")


def plot_level(name: str) -> str:
    """``"figure"`` or ``"axes"``: what the plot function called ``name`` returns, read from its name alone.

    Axes-level functions take ``ax=`` (keyword-only) and return the ``Axes``; figure-level ones return the
    ``Figure``: their names end in ``_grid``, or are one of ``PAPER_FIGURES``.

    Raises:
        InputTypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise InputTypeError(f"name={name!r} ({type(name).__name__}) is not a function name; pass the name of a "
                             "plot function as a string, e.g. plot_level('plot_rollout')")
    return "figure" if name.endswith("_grid") or name in PAPER_FIGURES else "axes"


# default sizes in inches
FIGSIZE = {"square": (4.8, 4.4), "wide": (6.4, 3.2), "single": (3.4, 2.8)}
# A paper's double column, in inches. A wider figure is shrunk to fit the page, and its 8-9 pt text with it (a 13 in
# figure prints its titles at 5 pt): plot_rollout, plot_attention_heads_grid, plot_faithfulness_grid and
# plot_study_grid wrap or shrink their panels to fit it by default. Figures that grow with their inputs (more
# metrics, models, methods or images) may still be wider.
PAGE_WIDTH = 7.0


def fit_columns(n: int, width: float, extra: float = 0.0, max_width: float = PAGE_WIDTH) -> tuple[int, float]:
    """How to lay out ``n`` panels of ``width`` inches (plus ``extra`` inches of colorbar or legend) on a page.

    Returns:
        ``(columns, width)``: as many columns (at most ``n``) as fit at ``width``, and the panel width, shrunk
        so that one column still fits when even it is wider than ``max_width``.
    """
    columns = max(1, min(n, int((max_width - extra) // width)))
    return columns, min(width, (max_width - extra) / columns)


F = TypeVar("F", bound=Callable[..., Any])


def label(text: str, unit: str | None = None) -> str:
    """An axis or colorbar label in the house form: the quantity, then its unit in square brackets.

    ``label("Transfer accuracy", "%")`` -> ``"Transfer accuracy [%]"``; ``label("Cosine similarity")`` (no unit)
    -> ``"Cosine similarity"``. Square brackets are the form of the ViT paper's quantitative figures (Fig. 5:
    "Transfer accuracy [%]", "Total pre-training compute [exaFLOPs]"), so every vitviz figure writes units that way,
    also where the paper's Fig. 7 writes "Mean attention distance (pixels)". Parentheses stay for what is not a
    unit ("Network depth (layer)", "Attention (relative to max)").

    Raises:
        InputError: ``unit`` is empty or already bracketed.
    """
    if unit is None:
        return text
    if not isinstance(unit, str) or not unit.strip() or unit.strip()[0] in "([":
        raise InputError(f"unit={unit!r} is not a bare unit; pass e.g. label({text!r}, '%') or no unit")
    return f"{text} [{unit.strip()}]"


def colorbar_beside(ax: Axes, mappable: Any, text: str, *, ticks: Any = None, width: float = 0.12,
                    pad: float = 0.1) -> Any:
    """A colorbar right of ``ax``, exactly as tall as the drawn axes box, whatever its aspect.

    ``fig.colorbar(..., ax=ax, shrink=...)`` sizes the bar to the space the layout gives the axes; an image with
    ``aspect="equal"`` (a 4 x 6 mosaic) is then drawn shorter than that space and the bar sticks out above and below
    it. Here the bar is an inset of ``ax`` (so layout engines make room for it): its height follows the box the
    image is drawn in, its width and gap are fixed in inches.

    Args:
        ax: the axes (its image or plot).
        mappable: what the colorbar shows (``ax.imshow``'s result).
        text: the colorbar label (``label(...)``).
        ticks: colorbar ticks (default matplotlib's).
        width, pad: bar width and gap to ``ax``, in inches.

    Returns:
        the ``Colorbar``.
    """
    from matplotlib.transforms import ScaledTranslation, blended_transform_factory

    fig = ax.figure
    # x: inches from the axes' right edge; y: the axes' own fraction (0 bottom, 1 top), both read at draw time
    beside = blended_transform_factory(fig.dpi_scale_trans + ScaledTranslation(1, 0, ax.transAxes), ax.transAxes)
    cax = ax.inset_axes((pad, 0.0, width, 1.0), transform=beside)
    return _colorbar_in(cax, mappable, text, ticks)


def _colorbar_in(cax: Axes, mappable: Any, text: str, ticks: Any) -> Any:
    """The house colorbar of ``mappable`` drawn in ``cax``: labelled ``text``, a thin outline."""
    cbar = cax.figure.colorbar(mappable, cax=cax, ticks=ticks)
    cbar.set_label(text)
    cbar.outline.set_linewidth(0.5)
    return cbar


def image_block(fig: Figure, rows: int, cols: int, *, colorbar: bool = True, bar_width: float = 0.12
                ) -> tuple[Any, Axes | None]:
    """``rows x cols`` axes for images and, with ``colorbar``, one slim column right of them that holds the block's
    colorbar (``colorbar_beside_block``): the layout engine makes room for its ticks and label.

    Args:
        fig: the (empty) figure.
        rows, cols: the block of image panels.
        colorbar: add the colorbar column.
        bar_width: the bar's width in inches (its column is about as wide).

    Returns:
        ``(axes, cax)``: a ``(rows, cols)`` array of axes, and the colorbar's axes (``None`` without ``colorbar``).
    """
    import numpy as np

    if not colorbar:
        return np.asarray(fig.subplots(rows, cols, squeeze=False)), None
    panel = max((fig.get_figwidth() - 0.8) / cols, 0.3)  # inches a panel gets, about
    grid = fig.add_gridspec(rows, cols + 1, width_ratios=[1.0] * cols + [bar_width / panel])
    axes = np.empty((rows, cols), dtype=object)
    for r in range(rows):
        for c in range(cols):
            axes[r, c] = fig.add_subplot(grid[r, c])
    return axes, fig.add_subplot(grid[:, cols])


class BlockSpan:
    """Axes locator of a block's colorbar: from the top of the highest image to the bottom of the lowest, as drawn.

    Called at draw time (and by the layout engine): it first fits each image's axes to its image (``apply_aspect``;
    an image with ``aspect="equal"`` is drawn smaller than the space the layout gives it), then spans the drawn
    boxes. The bar keeps the left edge of its own axes (its column) and is ``width`` inches wide.
    """

    def __init__(self, images: Iterable[Axes], width: float) -> None:
        self.images, self.width = list(images), width

    def __call__(self, cax: Axes, renderer: Any) -> Any:
        from matplotlib.transforms import Bbox

        shown = [a for a in self.images if a.get_visible()] or self.images
        for a in shown:
            a.apply_aspect()
        top = max(a.get_position().y1 for a in shown)
        bottom = min(a.get_position().y0 for a in shown)
        fig = cax.figure
        cell = cax.get_position(original=True)
        return Bbox.from_bounds(cell.x0, bottom, self.width * fig.dpi / fig.bbox.width, top - bottom)


def colorbar_beside_block(cax: Axes, images: Iterable[Axes], mappable: Any, text: str, *, ticks: Any = None,
                          width: float = 0.12) -> Any:
    """The colorbar of a block of image panels (several rows), exactly as tall as the block of images drawn: from the
    top of the first row's image to the bottom of the last row's, whatever the grid's aspect, the figure's size or
    the number of rows (``BlockSpan``). ``fig.colorbar(..., ax=axes, shrink=...)`` sizes a bar to the space the
    layout gives the axes, not to the images drawn in them.

    Args:
        cax: the colorbar's axes, right of the block (``image_block``'s second result).
        images: the axes of the block's images.
        mappable: what the colorbar shows; text: its label; ticks: its ticks (default matplotlib's).
        width: the bar's width in inches.

    Returns:
        the ``Colorbar``.
    """
    cax.set_axes_locator(BlockSpan(images, width))
    cax.set_label("<colorbar>")  # the name matplotlib gives the axes of ``fig.colorbar(..., ax=...)``
    return _colorbar_in(cax, mappable, text, ticks)


def interval_label(errorbar: Any) -> str | None:
    """What seaborn's ``errorbar=`` draws, in words for a legend: every band and error bar says what it is.

    ``("se", 1.96)`` -> "95% CI of the mean (±1.96 SE)", ``("ci", 95)`` -> "95% bootstrap CI", ``("sd", 1)`` ->
    "±1 SD", ``("pi", 50)`` -> "50% percentile interval", ``None`` -> ``None``; a callable by its name.
    """
    if errorbar is None:
        return None
    if callable(errorbar):
        return getattr(errorbar, "__name__", "interval")
    kind, level = (errorbar, None) if isinstance(errorbar, str) else errorbar
    level = {"se": 1, "sd": 1, "ci": 95, "pi": 95}.get(kind, level) if level is None else level
    if kind == "se":
        return f"95% CI of the mean (±{level:g} SE)" if abs(level - 1.96) < 1e-9 else f"±{level:g} SE"
    return {"sd": f"±{level:g} SD", "ci": f"{level:g}% bootstrap CI", "pi": f"{level:g}% percentile interval"
            }.get(kind, f"{kind} {level:g}")


# a legend beside the axes (upper left corner just right of them): off the data and the bands
LEGEND_BESIDE: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.02, 1), "frameon": False,
                                 "title_fontsize": 7.5, "alignment": "left"}


def band_legend_title(errorbar: Any, n_images: int | None, what: str = "Method") -> str:
    """A legend title: ``what``, then the band around each mean (``interval_label``) and over how many images, in
    short lines (a legend beside the axes must not squeeze them); ``what`` alone without a band."""
    band = interval_label(errorbar)
    if band is None:
        return what
    band = band.replace(" (", "\n(", 1)
    return f"{what}\nband: {band}" + (f", {n_images} images" if n_images else "")


@contextlib.contextmanager
def vitviz_style(**overrides: Any) -> Iterator[None]:
    """Context manager: vitviz's rcParams (plus ``overrides``) for the duration of the block.

    Interactive mode is the exception: when the block turns it on (Jupyter's inline backend does so when the
    first figure loads it), it stays on, or later figures would no longer show at the end of a cell.
    """
    interactive = mpl.is_interactive()
    try:
        with mpl.rc_context({**RC, **overrides}):
            try:
                yield
            finally:
                interactive = mpl.is_interactive()
    finally:
        mpl.interactive(interactive)


def styled(func: F) -> F:
    """Decorator: run a plot function inside ``vitviz_style()``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with vitviz_style():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A new figure through pyplot, so that notebooks display it at the end of the cell."""
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize)


def check_formats(formats: Iterable[str], fig: Figure | None = None) -> list[str]:
    """``formats`` as lower-case extensions without dots, each one matplotlib can write.

    Raises:
        InputError: ``formats`` is a single string, empty, or holds something that is not a supported format; the
            message lists the supported ones. Checked before any file is written.
    """
    if isinstance(formats, str):
        raise InputError(f"formats={formats!r} is a string, not a collection of formats; pass "
                         f"formats=({formats!r},)")
    canvas = (fig if fig is not None else Figure()).canvas
    supported = sorted(canvas.get_supported_filetypes())
    wanted = list(formats)
    bad = [f for f in wanted if not isinstance(f, str) or f.lower().lstrip(".") not in supported]
    if bad:
        raise InputError(f"formats={tuple(wanted)!r}: {bad} not supported by matplotlib; pass formats among "
                         f"{supported}, e.g. formats=('png', 'pdf')")
    if not wanted:
        raise InputError("save_figure needs at least one format, e.g. formats=('png',)")
    return [f.lower().lstrip(".") for f in wanted]


def save_figure(
    fig: Figure | Axes,
    path_stem: str | os.PathLike,
    formats: Iterable[str] = ("png", "pdf", "svg"),
    *,
    dpi: int | None = None,
) -> list[Path]:
    """Write ``fig`` once per format (each file atomically), creating folders as needed; the same figure always gives
    the same bytes (fixed metadata, no dates: see ``METADATA``; fixed SVG ids).

    Args:
        fig: the figure, or an axes (its whole figure is written), as the axes-level ``plot_*`` return.
        path_stem: path without extension, e.g. ``"reports/pos_embed"`` (an extension among ``formats`` is
            dropped: ``"pos_embed.png"`` also writes ``pos_embed.pdf`` and ``pos_embed.svg``).
        formats: file extensions, e.g. ``("png",)``; each one matplotlib writes (``png``, ``pdf``, ``svg``,
            ``eps``, ``jpg``, ...).
        dpi: resolution of raster formats, a positive number (default: vitviz's 200).

    Returns:
        the paths written, in the order of ``formats``.

    Raises:
        InputError: ``fig`` is not a figure or axes, ``formats`` is empty, a string or holds an unsupported format,
            or ``dpi`` is not positive; checked before anything is written.
    """
    if not isinstance(fig, (Figure, Axes)):
        raise InputError(f"fig={fig!r} is not a matplotlib Figure or Axes; pass what a vitviz plot_* call returns")
    fig = fig.figure if isinstance(fig, Axes) else fig
    formats = check_formats(formats, fig)
    if dpi is not None and (not is_number(dpi) or not 0 < dpi < float("inf")):
        raise InputError(f"dpi={dpi!r} is not a positive number of dots per inch; pass e.g. dpi=300, or None for "
                         f"vitviz's {RC['savefig.dpi']}")
    from vitviz.core.io import atomic_write

    stem = Path(path_stem)
    if stem.suffix.lstrip(".").lower() in formats:
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    with vitviz_style():
        for fmt in formats:
            path = stem.parent / f"{stem.name}.{fmt}"
            # atomically: matplotlib opens an SVG or PDF before drawing into it, so an interrupted draw would
            # leave a truncated file in place of the previous one
            atomic_write(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=dpi or RC["savefig.dpi"],
                                                                metadata=METADATA.get(fmt)))
            written.append(path)
    return written


class Saver:
    """``save(fig, stem, **arrays)`` for notebooks: the figure to ``out_dir`` (PNG, PDF, SVG) and the numbers
    behind it to ``arrays_dir/<stem>.npz``, each only when its folder is set (the report sets both).

    Example::

        save = vitviz.Saver(out_dir, arrays_dir)
        save(fig, "fig5_compute_curves", exaflops=df.exaflops)
    """

    def __init__(self, out_dir: str | os.PathLike | None = None, arrays_dir: str | os.PathLike | None = None,
                 formats: Iterable[str] = ("png", "pdf", "svg")) -> None:
        self.out_dir, self.arrays_dir, self.formats = out_dir, arrays_dir, tuple(check_formats(formats))

    def __call__(self, fig: Figure | Axes, stem: str, **arrays: Any) -> list[Path]:
        written: list[Path] = []
        if self.out_dir:
            written += save_figure(fig, Path(self.out_dir) / stem, formats=self.formats)
        if self.arrays_dir and arrays:
            from vitviz.core.io import save_arrays

            written.append(save_arrays(Path(self.arrays_dir) / stem, **arrays))
        return written
