"""``vitviz.explore_attention(model, image)``: one image's attention, layer by layer, head by head, in a widget.

The model runs once per image (``vitviz.capture_attention``, all layers); the ``(1, H, N, N)`` maps stay in the
kernel on the model's device, and each change of a control renders only the displayed ``(gh, gw)`` map, blended
over the image, as a PNG. The query is the token the head reads (marked "(output)": the class token, the mean
of the patch queries for average pooling and models without a class token, or the rows the head reads weighted
as it weights them, e.g. DeiT-distilled's class and distillation queries or an attention pool's own attention;
``ViTSpec.readout``), another prefix token, or any patch, picked by sliders or by clicking the image. The rollout
toggle shows attention rollout (Abnar & Zuidema 2020; the ViT paper's Fig. 6) through the selected layer.

Memory is bounded: the captured maps (about 22 MB per image for ViT-B/16 at 224 px) and the rollout products
live in one least-recently-used cache bounded in bytes (``cache_bytes``, default ``DEFAULT_CACHE_BYTES``); an
image whose maps were evicted is captured again when it is shown again. The images themselves wait on the CPU.
The cache holds the maps of the model's weights as they are: when a parameter or buffer changed since (an
optimizer step, ``load_state_dict``, an in-place edit; ``core.contexts.WeightsWatch``), the next view captures anew.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from torch import nn

from vitviz.analysis.propagation import HEAD_FUSIONS, fuse_heads, require_flow_maps
from vitviz.analysis.readout_rows import PoolRows, output_rows
from vitviz.analysis.rollout import rollout_from_attentions
from vitviz.core.capture import capture_attention
from vitviz.core.contexts import WeightsWatch, without_autocast
from vitviz.core.images import Images, denormalise, load_images
from vitviz.core.spec import inspect
from vitviz.core.util import check_positive_int, eval_mode, is_int, is_number
from vitviz.errors import InputError
from vitviz.plot.attention import attention_scale, covered_pixels
from vitviz.widgets._base import Explorer, index_slider
from vitviz.widgets._controls import CheckedCheckbox, CheckedDropdown, CheckedFloatSlider
from vitviz.widgets._render import (
    check_cmap,
    colorbar,
    covered_display,
    display_size,
    mark_cell,
    overlay,
    png_bytes,
    resize_rgb,
)

__all__ = ["AttentionExplorer", "explore_attention"]

DEFAULT_CACHE_BYTES = 256 * 2**20  # captured maps and rollout products kept per explorer


def _nbytes(value: torch.Tensor | Sequence[torch.Tensor]) -> int:
    tensors = [value] if isinstance(value, torch.Tensor) else list(value)
    return sum(t.numel() * t.element_size() for t in tensors)


class ByteLRU:
    """A least-recently-used cache of tensors (or lists of tensors) bounded by their total size in bytes.

    Adding an entry evicts the least recently used ones until the total fits ``max_bytes``; the entry just added
    is always kept, so one entry larger than the bound is held alone until the next one arrives.
    """

    def __init__(self, max_bytes: int) -> None:
        if not is_int(max_bytes) or max_bytes < 1:
            raise InputError(
                f"cache_bytes={max_bytes!r} is not a positive number of bytes; pass e.g. 256 * 2**20 (256 MiB)"
            )
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.evictions = 0
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def __contains__(self, key: Any) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any) -> Any:
        """The value for ``key`` (marked most recently used), or ``None``."""
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key][0]

    def clear(self) -> None:
        """Drop every entry (the bound and the eviction count stay)."""
        self._items.clear()
        self.nbytes = 0

    def put(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key`` and evict least recently used entries beyond the bound."""
        if key in self._items:
            self.nbytes -= self._items.pop(key)[1]
        size = _nbytes(value)
        self._items[key] = (value, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes and len(self._items) > 1:
            _old, (_value, old_size) = self._items.popitem(last=False)
            self.nbytes -= old_size
            self.evictions += 1
        return value


def _token_options(prefix_tokens: Sequence[str], readout: Any = None) -> list[tuple[str, int | str]]:
    """The query choices; ``(output)`` marks the one the model's head reads (``ViTSpec.readout``: the class token,
    or, offered first, the mean of the patch queries for average pooling and models without a class token, or
    ``"readout"``, the rows the head reads weighted as it weights them: the class and distillation queries'
    mean of DeiT-distilled, an attention pool's own attention over the tokens)."""
    single = getattr(readout, "single_token", 0 if "cls" in prefix_tokens else None)
    pooled = bool(getattr(readout, "weights_by_pool", False))
    patch_out = not pooled and bool(getattr(readout, "patch_mean", "cls" not in prefix_tokens))
    options: list[tuple[str, int | str]] = []
    regs = 0
    for i, name in enumerate(prefix_tokens):
        if name == "cls":
            options.append(("class token (output)" if single == i else "class token", i))
        elif name == "reg":
            options.append((f"register token {regs}", i))
            regs += 1
        else:
            options.append((f"{name} token", i))
    if patch_out:
        options.insert(0, ("mean of patch queries (output)", "mean"))
    elif "cls" not in prefix_tokens:
        options.append(("mean of patch queries", "mean"))
    if readout is not None and (pooled or (single is None and not patch_out)):  # a weighting of several rows
        options.insert(0, ("queries the head reads (output)", "readout"))
    options.append(("patch (row, col)", "patch"))
    return options


class AttentionExplorer(Explorer):
    """Widget: attention of one query over the patches of an image, for a layer and a head (or fused heads).

    Controls (ipywidgets; set ``.value`` or call ``set(...)``: both refuse a value a control cannot hold, leaving
    the view as it was): ``layer``, ``row`` and ``col`` (Python indices, shown counted from 1: the ``layer`` slider
    reads "6" for ``layer=5``), ``head`` (an int or ``"mean"``/``"max"``/``"min"``; the menu reads "head 1" for
    ``head=0``), ``query`` (a prefix-token index, ``"mean"``, ``"readout"`` or ``"patch"``), ``rollout`` (bool),
    ``discard`` (rollout discard ratio), ``alpha`` (overlay opacity) and ``image_index`` (when several images are
    given). ``image.value`` holds the PNG shown: the overlay, then its colour bar (0 to the map's maximum, ticks
    labelled; a map with negative weights, differential attention's, from ``-m`` to ``m`` on ``RdBu_r``, ``m`` its
    largest absolute weight, as ``plot_attention_heads_grid`` draws it); ``status`` says what it is, counting
    layers, heads, rows and columns from 1 as the figures' titles and the sliders do. ``map()`` returns the current
    ``(gh, gw)`` numbers.
    """

    def __init__(self, model: nn.Module, images: Images, *, labels: Sequence[str] | None = None, size: int = 320,
                 cmap: str = "inferno", alpha: float = 0.6, interpolation: str = "nearest",
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        check_positive_int(size, "size", "the pixels of the longer side of the drawn overlay (e.g. 320)")
        check_cmap(cmap)
        if not is_number(alpha) or not 0 <= alpha <= 1:
            raise InputError(f"alpha={alpha!r} must lie in [0, 1], the opacity of the map over the image (e.g. 0.6)")
        self.model = model
        self.spec = inspect(model)
        self.cache = ByteLRU(cache_bytes)  # ("attn", i) -> list of (1, H, N, N); ("rollout", ...) -> (N, N)
        self.forwards = 0  # forward passes run (one per image shown, again after an eviction or a weight change)
        self._weights = WeightsWatch(model)  # the cache holds maps of these weights only
        self._readout: dict[int, Any] = {}  # image -> the rows its head reads, set with each capture of its maps
        # (B, 3, H, W), a copy of vitviz's own (the maps and the drawn image stay those of one picture); one image
        # at a time goes to the device
        self._x = load_images(model, images, device="cpu").clone()
        self._rgb = denormalise(model, self._x)
        h, w = self._x.shape[-2:]
        self.grid = self.spec.grid_for_input(self._x)
        self.map_size = display_size(h, w, size)
        # the patch grid may cover less than the image (a size that is no multiple of the stride): each patch is
        # drawn, marked and clicked over its own pixels (vitviz.plot.attention.covered_pixels)
        self._extent = covered_display(self.map_size, (h, w), covered_pixels(model, self._x))
        self.cmap, self.interpolation = cmap, interpolation
        self._bases: OrderedDict[int, np.ndarray] = OrderedDict()
        depth, heads, gh, gw = len(self.spec.attention_modules), self.spec.num_heads, *self.grid
        names = list(labels) if labels is not None else [f"image {i}" for i in range(len(self._x))]
        if len(names) != len(self._x):
            raise InputError(f"labels: {len(names)} labels for {len(self._x)} images; pass one label per image")
        style = {"description_width": "88px"}
        self.image_index = CheckedDropdown(options=list(zip(names, range(len(names)))), value=0,
                                            description="image", style=style,
                                            layout=widgets.Layout(display="" if len(names) > 1 else "none"))
        self.layer = index_slider(depth, depth - 1, "layer", style)  # shows 1 ... depth, holds 0 ... depth - 1
        self.head = CheckedDropdown(options=[(f"{f} of heads", f) for f in HEAD_FUSIONS]
                                     + [(f"head {i + 1}", i) for i in range(heads)], value="mean",
                                     description="head", style=style)
        options = _token_options(self.spec.prefix_tokens, self.spec.readout)
        self.query = CheckedDropdown(options=options, value=options[0][1], description="query", style=style)
        self.row = index_slider(gh, gh // 2, "query row", style)
        self.col = index_slider(gw, gw // 2, "query col", style)
        self.rollout = CheckedCheckbox(value=False, description="rollout through this layer", indent=False)
        self.discard = CheckedFloatSlider(value=0.0, min=0.0, max=0.95, step=0.05, description="discard ratio",
                                           style=style, disabled=True, continuous_update=False)
        self.alpha = CheckedFloatSlider(value=alpha, min=0.0, max=1.0, step=0.05, description="opacity",
                                         style=style, continuous_update=False)
        controls = [self.image_index, self.layer, self.head, self.query, self.row, self.col, self.rollout,
                    self.discard, self.alpha]
        super().__init__(controls, title=f"Attention of {self.spec.name}")
        self.refresh()

    # -- data ----------------------------------------------------------------------------------------------------

    def attentions(self, index: int | None = None) -> list[torch.Tensor]:
        """All layers' ``(1, H, N, N)`` maps for one image, captured by one forward pass on first use."""
        i = self.image_index.value if index is None else index
        if self._weights.changed():  # fine-tuned, loaded or edited since the maps were captured: capture anew
            self.cache.clear()
        maps = self.cache.get(("attn", i))
        if maps is None:
            param = next(self.model.parameters(), None)
            x = self._x[i:i + 1].to(param.device if param is not None else "cpu")
            with torch.no_grad(), eval_mode(self.model), without_autocast(self.model), \
                    capture_attention(self.model) as cap, PoolRows(self.model, self.spec, None) as pool:
                self.model(x)
            self.forwards += 1
            maps = self.cache.put(("attn", i), cap.attentions)
            n = maps[-1].shape[-1]
            read = pool.take(n)  # an attention pool's (1, N) attention over the tokens; else the fixed weighting
            rows = output_rows(self.spec, None, n) if read is None else read[0]
            self._readout[i] = rows.detach().float().cpu() if isinstance(rows, torch.Tensor) else rows
        return maps

    def _fused(self, attn: torch.Tensor, head: int | str) -> torch.Tensor:
        """``(1, H, N, N)`` -> ``(N, N)`` for one head or fused heads, float32."""
        if isinstance(head, int):
            return attn[0, head].float()
        return fuse_heads(attn, head)[0]

    def _rollout_matrix(self, i: int, layer: int, head: int | str, discard: float) -> torch.Tensor:
        key = ("rollout", i, layer, head, round(discard, 6))
        if self._weights.changed():
            self.cache.clear()
        matrix = self.cache.get(key)
        if matrix is None:
            require_flow_maps(self.spec, list(range(layer + 1)), "rollout")  # refuses maps that are not a flow
            maps = self.attentions(i)[: layer + 1]
            if isinstance(head, int):  # one head index followed through every layer
                maps, head = [a[:, head:head + 1] for a in maps], "mean"
            matrix = self.cache.put(key, rollout_from_attentions(
                maps, num_prefix_tokens=self.spec.num_prefix_tokens, head_fusion=head, discard_ratio=discard,
                blocks=self.spec.attention_blocks[: layer + 1] or None)[0])
        return matrix

    def _query_row(self, m: torch.Tensor) -> torch.Tensor:
        p, gw = self.spec.num_prefix_tokens, self.grid[1]
        q = self.query.value
        if q == "patch":
            return m[p + self.row.value * gw + self.col.value]
        if q == "mean":
            return m[p:].mean(dim=0)
        if q == "readout":  # the rows the head reads for the image shown (attentions() set them)
            rows = self._readout[self.image_index.value]
            if isinstance(rows, torch.Tensor):  # (N,) weights
                return rows.to(device=m.device, dtype=m.dtype) @ m
            return m[p:].mean(dim=0) if rows is None else m[rows]
        return m[int(q)]

    def map(self) -> np.ndarray:
        """The ``(gh, gw)`` map now shown: the query's attention (or rollout) over the patch tokens."""
        return self._row()[self.spec.num_prefix_tokens:].reshape(self.grid).numpy()

    def _row(self) -> torch.Tensor:
        i, layer, head = self.image_index.value, self.layer.value, self.head.value
        attn = self.attentions(i)
        n = attn[layer].shape[-1]
        if n != self.spec.num_prefix_tokens + self.grid[0] * self.grid[1]:
            raise InputError(f"{self.spec.name}: layer {layer} attends over {n} tokens, but the layout is "
                             f"{self.spec.num_prefix_tokens} prefix tokens and a {self.grid[0]}x{self.grid[1]} grid")
        if self.rollout.value:
            m = self._rollout_matrix(i, layer, head, float(self.discard.value))
        else:
            m = self._fused(attn[layer], head)
        return self._query_row(m).detach().float().cpu()  # only (N,) numbers leave the device

    # -- drawing -------------------------------------------------------------------------------------------------

    @property
    def grid_extent(self) -> tuple[int, int]:
        """The ``(ch, cw)`` pixels of the drawn image the patch grid covers (all of it unless its size is no
        multiple of the token stride)."""
        return self._extent

    def _base(self, i: int) -> np.ndarray:
        if i not in self._bases:
            self._bases[i] = resize_rgb(self._rgb[i], self.map_size)
            while len(self._bases) > 8:  # display-size uint8 pictures; a few are plenty
                self._bases.popitem(last=False)
        self._bases.move_to_end(i)
        return self._bases[i]

    def render(self) -> tuple[bytes, str]:
        """The overlay PNG and the status line for the current controls."""
        row = self._row()
        p = self.spec.num_prefix_tokens
        heat = row[p:].reshape(self.grid).numpy()
        cmap, vmin, vmax = self.scale(heat)
        pixels = overlay(self._base(self.image_index.value), heat, alpha=float(self.alpha.value), cmap=cmap,
                         interpolation=self.interpolation, covered=self._extent, vmin=vmin, vmax=vmax)
        if self.query.value == "patch":
            pixels = mark_cell(pixels, (self.row.value, self.col.value), self.grid, covered=self._extent)
        ticks = ((0.0, f"{vmin:.3g}"), (0.5, "0"), (1.0, f"{vmax:.3g}")) if vmin < 0 else \
            ((0.0, "0"), (1.0, f"{vmax:.3g}"))
        bar = colorbar(self.map_size[0], cmap, ticks=ticks)
        pixels = np.concatenate([pixels, bar], axis=1)
        # the prefix tokens' share of the row: a fused max (min) row sums to more (less) than 1
        total = float(row.sum())
        return png_bytes(pixels), self._status(heat, float(row[:p].sum()) / total if p and total > 0 else 0.0)

    def scale(self, heat: np.ndarray) -> tuple[str, float, float]:
        """``(cmap, vmin, vmax)`` of the overlay of ``heat`` (its finite values): the explorer's colormap from 0 to
        the map's maximum; for a map holding negative weights (differential attention's signed rows; a scale from 0
        drew them all in the bottom colour) ``RdBu_r`` from ``-m`` to ``m``, ``m`` the largest absolute weight, as
        ``vitviz.plot_attention_heads_grid`` draws them (``vitviz.plot.attention.attention_scale``)."""
        finite = heat[np.isfinite(heat)]
        return attention_scale(float(finite.min()) if finite.size else 0.0,
                               float(finite.max()) if finite.size else 0.0, None, self.cmap)

    def _status(self, heat: np.ndarray, to_prefix: float) -> str:
        layer, head = self.layer.value, self.head.value
        depth = len(self.spec.attention_modules)
        # counted from 1, as the figures' titles ("layer 6 of 6", "Head 1", "patch (row 2, column 3)") and the
        # sliders' labels; the controls hold Python indices
        what = (f"rollout through layer {layer + 1} of {depth}"
                + (f", discard {self.discard.value:.2f}" if self.discard.value else "") if self.rollout.value
                else f"layer {layer + 1} of {depth} ({self.spec.attention_modules[layer]})")
        heads = f"head {head + 1}" if isinstance(head, int) else f"{head} over {self.spec.num_heads} heads"
        query = dict((v, k) for k, v in self.query.options)[self.query.value]
        if self.query.value == "patch":
            query = f"patch (row {self.row.value + 1}, column {self.col.value + 1})"
        click = " Click the image to pick a query patch." if self.clickable else ""
        return (f"<span style='font-size:90%'>{html.escape(what)}; {html.escape(heads)}; query: "
                f"{html.escape(query)}. Colour (the bar): {html.escape(self._scale_words(heat))}; "
                f"{to_prefix:.0%} of the row goes to prefix tokens.{click}</span>")

    def _scale_words(self, heat: np.ndarray) -> str:
        cmap, vmin, vmax = self.scale(heat)
        if vmin < 0:
            return (f"signed weights, {vmin:.3g} (blue) to {vmax:.3g} (red), 0 white ({cmap}); the map spans "
                    f"{heat.min():.3g} to {heat.max():.3g}")
        return f"0 to the map's max {heat.max():.3g} ({cmap})"

    # -- control logic -------------------------------------------------------------------------------------------

    def select_patch(self, row: int, col: int) -> None:
        """Make patch ``(row, col)`` (zero-based) the query."""
        self.set(query="patch", row=int(row), col=int(col))

    def _changed(self, change: dict[str, Any]) -> None:
        owner = change["owner"]
        if owner is self.rollout:
            self.discard.disabled = not self.rollout.value
        elif owner in (self.row, self.col) and self.query.value != "patch":
            self.query.value = "patch"


def explore_attention(model: nn.Module, image: Images, *, labels: Sequence[str] | None = None, size: int = 320,
                      cmap: str = "inferno", alpha: float = 0.6, interpolation: str = "nearest",
                      cache_bytes: int = DEFAULT_CACHE_BYTES) -> AttentionExplorer:
    """An interactive view of the attention maps of ``model`` on ``image`` (Jupyter; offline).

    The model runs once per image, capturing every layer (``vitviz.capture_attention``) on its own device; the
    maps stay in the kernel and only the displayed overlay travels to the browser, as a PNG.

    Args:
        model: any ViT ``vitviz.inspect`` reads (run in eval mode, each module's mode put back afterwards).
        image: one image or several (tensor, PIL image, array or path; see ``vitviz.load_images``); with several,
            an ``image`` dropdown switches between them.
        labels: names of the images for that dropdown.
        size: pixels of the longer side of the drawn overlay.
        cmap: matplotlib colormap of the map.
        alpha: initial opacity of the map over the image.
        interpolation: ``nearest`` (patch blocks), ``bilinear`` or ``bicubic`` upsampling of the map.
        cache_bytes: bound, in bytes, of the least-recently-used cache of captured maps and rollout products
            (default 256 MiB); images evicted from it are captured again when shown.

    Returns:
        ``AttentionExplorer``, an ``ipywidgets.VBox``: display it; drive it with its controls (``layer``,
        ``head``, ``query``, ``row``, ``col``, ``rollout``, ``discard``, ``alpha``, ``image_index``) or
        ``set(...)``; ``image.value`` is the PNG shown and ``map()`` the ``(gh, gw)`` numbers behind it.

    Raises:
        InputError: ``size`` not a positive int, ``alpha`` outside ``[0, 1]``, ``labels`` not one per image, or
            ``cmap`` no matplotlib colormap name (``UnknownNameError``).
    """
    return AttentionExplorer(model, image, labels=labels, size=size, cmap=cmap, alpha=alpha,
                             interpolation=interpolation, cache_bytes=cache_bytes)
