"""``vitviz.explore_pos_embed(model)``: the position-embedding similarity of one patch, at any resolution.

One tile of the ViT paper's Fig. 7 center at a time (Dosovitskiy et al., ICLR 2021): the cosine similarity of the
chosen patch's position embedding with every patch's (``vitviz.pos_embed_similarity``), on the paper's fixed
``[-1, 1]`` scale. The resolution control resamples the table to another input size the way timm does for
fine-tuning at a higher resolution (bicubic ``resample_abs_pos_embed``, Sec. 3.2 of the paper), or takes the table
the model itself makes for that size where it makes it its own way (``vitviz.pos_embed_similarity``); the ``view``
control switches to the first three principal components of the (resampled) embedding drawn as RGB.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.analysis.posembed import patch_pos_embed, pos_embed_similarity
from vitviz.core.contexts import WeightsWatch
from vitviz.core.families import family_of
from vitviz.core.spec import inspect
from vitviz.core.util import check_positive_int
from vitviz.errors import InputError, NoPositionEmbeddingError
from vitviz.widgets._base import Explorer, index_slider, resize_index_slider
from vitviz.widgets._controls import CheckedIntSlider, CheckedToggleButtons
from vitviz.widgets._render import (
    check_cmap,
    colorbar,
    display_size,
    heat_png,
    mark_cell,
    png_bytes,
    resize_rgb,
)

__all__ = ["PosEmbedExplorer", "explore_pos_embed"]

CACHE = 4  # resolutions whose tables are kept


def _pca_rgb(emb: torch.Tensor, grid: tuple[int, int]) -> np.ndarray:
    """First three principal components of ``(P, D)`` rows as a ``(gh, gw, 3)`` image, each scaled to [0, 1]."""
    x = emb.double() - emb.double().mean(dim=0)
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    comps = (u[:, :3] * s[:3]).numpy()
    if comps.shape[1] < 3:
        comps = np.pad(comps, ((0, 0), (0, 3 - comps.shape[1])))
    lo, hi = comps.min(axis=0), comps.max(axis=0)
    comps = (comps - lo) / np.where(hi > lo, hi - lo, 1.0)
    return comps.reshape(*grid, 3)


SIMILARITY_TICKS = ((0.0, "-1"), (0.5, "0"), (1.0, "1"))  # the colour bar: cosine similarity, fixed scale


class PosEmbedExplorer(Explorer):
    """Widget: cosine similarity of one patch's position embedding with all others (Fig. 7 center, one tile).

    Controls (ipywidgets; set ``.value`` or call ``set(...)``: both refuse a value a control cannot hold, leaving
    the view as it was): ``row`` and ``col`` (the query patch, Python indices, shown counted from 1),
    ``resolution`` (input height in pixels; the width keeps the model's aspect ratio; the grid is
    ``size // patch_size``), ``view`` (``"similarity"`` or ``"pca"``). ``image.value`` holds the PNG shown (in the
    similarity view with its colour bar, ticks -1, 0 and 1); ``status`` counts rows and columns from 1, as the
    figures do; ``map()`` returns the numbers behind it.
    """

    def __init__(self, model: nn.Module, *, size: int = 320, cmap: str = "viridis", max_scale: int = 4) -> None:
        check_positive_int(size, "size", "the pixels of the longer side of the drawn map (e.g. 320)")
        check_positive_int(max_scale, "max_scale", "the multiple of the model's input size the resolution slider "
                           "reaches (e.g. 4)")
        check_cmap(cmap)
        self.model = model
        self.spec = inspect(model)
        if not self.spec.has_abs_pos_embed:
            raise NoPositionEmbeddingError(
                f"{self.spec.name} has no absolute position embedding (pos_embed_kind="
                f"{self.spec.pos_embed_kind!r}); explore_pos_embed needs a learned or sincos table")
        self.size, self.cmap = size, cmap
        # the model makes its table for other sizes its own way (Family.pos_embed_at), not timm's resampling
        try:
            self._own_resampling = family_of(model).pos_embed_at(model, tuple(self.spec.grid_size)) is not None
            fixed = False
        except InputError:  # a model that makes no table for another size (a non-square Hugging Face ViT)
            self._own_resampling, fixed = True, True
        self._tables: OrderedDict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = OrderedDict()
        self._weights = WeightsWatch(model)
        (h, _), (ph, _) = self.spec.img_size, self.spec.patch_size
        gh, gw = self.spec.grid_size
        style = {"description_width": "88px"}
        self.resolution = CheckedIntSlider(value=h, min=ph * min(2, gh), max=max(h, ph) * max_scale, step=ph,
                                            description="img size [px]", style=style, continuous_update=False,
                                            disabled=fixed)
        self.row = index_slider(gh, gh // 2, "patch row", style)  # show 1 ... gh, hold 0 ... gh - 1
        self.col = index_slider(gw, gw // 2, "patch column", style)
        self.view = CheckedToggleButtons(options=[("similarity", "similarity"), ("embedding (PCA)", "pca")],
                                          value="similarity", description="view", style=style)
        self._shown_grid = (gh, gw)
        super().__init__([self.resolution, self.row, self.col, self.view],
                         title=f"Position embedding of {self.spec.name}")
        self.refresh()

    # -- data ----------------------------------------------------------------------------------------------------

    @property
    def img_size(self) -> tuple[int, int]:
        """The input size ``(H, W)`` in pixels the embedding is resampled to (the model's own at start)."""
        (h0, w0), pw = self.spec.img_size, self.spec.patch_size[1]
        h = int(self.resolution.value)
        if h == h0:  # the model's own size, also where it is no multiple of the stride (384 px at 14 px patches)
            return h0, w0
        return h, max(pw, round(h * w0 / h0 / pw) * pw)

    @property
    def grid(self) -> tuple[int, int]:  # type: ignore[override]
        """``(gh, gw)`` patches at the current resolution."""
        return self.spec.grid_for(self.img_size)

    @property
    def map_size(self) -> tuple[int, int]:  # type: ignore[override]
        return display_size(*self.grid, self.size)

    def table(self) -> tuple[torch.Tensor, np.ndarray]:
        """``(E, sim)`` at the current resolution: ``(gh * gw, D)`` embeddings and ``(gh, gw, gh, gw)`` cosines."""
        key = self.img_size
        if self._weights.changed():  # the tables of other weights (fine-tuned, loaded, edited) are not shown
            self._tables.clear()
        if key not in self._tables:
            size = None if key == tuple(self.spec.img_size) else key
            emb, _ = patch_pos_embed(self.model, img_size=size)
            self._tables[key] = (emb, pos_embed_similarity(self.model, img_size=size).numpy())
            while len(self._tables) > CACHE:
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        return self._tables[key]

    def map(self) -> np.ndarray:
        """``(gh, gw)`` cosine similarities of the query patch, or ``(gh, gw, 3)`` PCA colours in the PCA view."""
        emb, sim = self.table()
        if self.view.value == "pca":
            return _pca_rgb(emb, self.grid)
        return sim[self.row.value, self.col.value]

    # -- drawing -------------------------------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The map PNG (with a colour bar in the similarity view) and the status line."""
        values, size = self.map(), self.map_size
        cell = (self.row.value, self.col.value)
        if self.view.value == "pca":
            pixels = mark_cell(resize_rgb(values, size), cell, self.grid, colour=(255, 255, 255))
        else:
            pixels = mark_cell(heat_png(values, size, cmap=self.cmap, vmin=-1.0, vmax=1.0), cell, self.grid,
                               colour=(255, 0, 0))
            pixels = np.concatenate([pixels, colorbar(size[0], self.cmap, ticks=SIMILARITY_TICKS)], axis=1)
        return png_bytes(pixels), self._status(values)

    def _status(self, values: np.ndarray) -> str:
        (gh, gw), (h, w) = self.grid, self.img_size
        (h0, w0), (gh0, gw0) = self.spec.img_size, self.spec.grid_size
        where = "the model's own table" if (h, w) == (h0, w0) else (
            f"the table the model makes for this size from its {gh0}x{gw0} one at {h0}x{w0} px"
            if self._own_resampling else
            f"resampled (bicubic, timm's resample_abs_pos_embed) from {gh0}x{gw0} at {h0}x{w0} px")
        # counted from 1, as the figures' titles and the sliders' labels; the sliders hold Python indices
        head = f"{gh}x{gw} grid at {h}x{w} px: {where}. Query patch (row {self.row.value + 1}, column " \
            f"{self.col.value + 1})"
        if self.view.value == "pca":
            text = f"{head} outlined; RGB = the first three principal components of the embedding rows."
        else:
            r, c = self.row.value, self.col.value
            near = [values[i, j] for i, j in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)) if 0 <= i < gh
                    and 0 <= j < gw]
            text = (f"{head}. Cosine similarity, colour bar -1 (bottom) to 1 (top) ({self.cmap}); mean with the "
                    f"4 neighbours {np.mean(near) if near else float('nan'):.3f}, minimum {values.min():.3f}.")
        click = " Click a patch to pick it." if self.clickable else ""
        return f"<span style='font-size:90%'>{html.escape(text)}{click}</span>"

    # -- control logic -------------------------------------------------------------------------------------------

    def _checked(self, name: str, value: Any, *, direct: bool = False) -> Any:
        """As ``Explorer._checked``; a ``resolution`` that is no multiple of the slider's step (the token stride),
        which ipywidgets takes as it is (it snaps only the browser's slider), is refused naming the two nearest,
        whether it comes through ``set()`` or is set on the slider itself."""
        value = super()._checked(name, value, direct=direct)
        step, low = self.resolution.step, self.resolution.min
        if name == "resolution" and (value - low) % step and value != self.spec.img_size[0]:  # the model's own
            below = low + (value - low) // step * step
            raise InputError(f"{self._said(name, value, direct)}: not a multiple of the {step} px token "
                             f"stride the resolution slider steps by; pass e.g. {below} or {below + step}")
        return value

    def select_patch(self, row: int, col: int) -> None:
        """Make patch ``(row, col)`` (zero-based, at the current resolution) the query."""
        self.set(row=int(row), col=int(col))

    def _changed(self, change: dict[str, Any]) -> None:
        if change["owner"] is not self.resolution:
            return
        (old_h, old_w), (gh, gw) = self._shown_grid, self.grid
        self._shown_grid = (gh, gw)
        for slider, old, new in ((self.row, old_h, gh), (self.col, old_w, gw)):
            value = min(int((slider.value + 0.5) * new / old), new - 1)  # the same place in the image
            if new != old:
                resize_index_slider(slider, new, value)


def explore_pos_embed(model: nn.Module, *, size: int = 320, cmap: str = "viridis", max_scale: int = 4
                      ) -> PosEmbedExplorer:
    """An interactive view of the position embedding of ``model`` (Jupyter; offline).

    Pick a patch (sliders, or a click on the map when ``ipyevents`` is installed) to see the cosine similarity of
    its embedding with every patch's; change ``resolution`` to see the table resampled to another input size.

    Args:
        model: any ViT with an absolute (learned or sincos) position embedding.
        size: pixels of the longer side of the drawn map.
        cmap: matplotlib colormap (fixed scale ``[-1, 1]``).
        max_scale: the resolution slider reaches this multiple of the model's input size.

    Returns:
        ``PosEmbedExplorer``, an ``ipywidgets.VBox`` with controls ``row``, ``col``, ``resolution``, ``view``;
        ``image.value`` is the PNG shown and ``map()`` the numbers behind it.

    Raises:
        NoPositionEmbeddingError: the model has no absolute position embedding.
        InputError: ``size`` or ``max_scale`` is not a positive int, or ``cmap`` no matplotlib colormap name
            (``UnknownNameError``).
    """
    return PosEmbedExplorer(model, size=size, cmap=cmap, max_scale=max_scale)
