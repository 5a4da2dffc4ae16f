"""``vitviz.capture_attention``: record post-softmax attention ``(B, H, N, N)`` from any supported ViT.

The only module in vitviz that knows about hooks, fused attention and devices. Inside the block the explicit
attention path of each selected layer is switched on (timm's fused ``scaled_dot_product_attention`` never
materialises probabilities), a probe reads the probabilities, and on exit, also when the body raises, every flag,
hook and attribute is exactly as before.

What a map holds is the family's to say, per layer, in ``vitviz.inspect(model).attention_maps``: ``softmax``
(post-softmax probabilities, rows sum to 1: nearly every ViT), ``class-attention`` (CaiT's class row),
``talking-heads`` (CaiT's weights after head mixing; rows do not sum to 1, entries may be negative) or
``differential`` (``S1 - lambda S2``; rows sum to ``1 - lambda``). Rollout and distance refuse maps that are not
a flow of attention; ``docs/zoo.md`` has the table.

Any number of captures can be open on one model at once, and they may exit in any order (two explorers, a
capture opened in one notebook cell and closed in another): each attention module gets one shared probe with a
list of subscribers; every open capture sees every forward pass that runs while it is open, and the module's
original state comes back when the last capture that uses it exits.

Every map's ``N`` must be the layout's prefix tokens plus the input's patch grid (``spec.grid_for_input``), else
``CaptureError`` names both numbers. A forward that raises inside the block (out of memory in block 1) leaves no
unfinished pass: a retry in the same block is read afresh, and the block exits cleanly (a pass stopped by a
``KeyboardInterrupt``, which runs no hook, is dropped at the next forward or at the exit: ``_watch_passes``). What such a pass already
handed to ``on_layer`` is the caller's to undo (``on_abort=``); without it later passes in the block are refused.

Activation checkpointing (timm's and open_clip's ``set_grad_checkpointing``, Hugging Face's
``gradient_checkpointing_enable``) is switched off while a capture is open and back on when the last capture open on
the model exits (``core.contexts.checkpointing_off`` says why). A recomputation the model does on its own (its own
``torch.utils.checkpoint`` calls) is not a forward pass: the maps a probe reads during a backward pass are dropped,
the forward's maps having been read already.

Two ways to consume the maps:

- ``store=True`` (default): ``cap.attentions`` is the list of ``(B, H, N, N)`` tensors, in layer order, from the
  most recent forward pass (``accumulate=True`` concatenates passes along the batch).
- ``on_layer=fn``: ``fn(i, attn)`` is called as each layer's map is produced (``i`` is the position in the selected
  layers, which run in order). With ``store=False`` nothing else is kept, so a reduction such as rollout holds one
  layer's maps at a time instead of every layer's.
- ``on_layer=fn, store=False, heads="stream"``: ``attn`` is a ``HeadMaps`` that hands out one head's ``(B, N, N)``
  map at a time. For timm's plain, rotary, relative-position and BEiT attention, the Hugging Face
  families on SDPA and (on CUDA) torchvision's and open_clip's ``nn.MultiheadAttention`` (``Family.stream_probe``)
  the model then keeps its fused attention kernel (its output is exactly the plain forward's) and each head's
  probabilities are recomputed from the module's ``q`` and ``k`` into one reused buffer, so no ``(B, H, N, N)``
  tensor is made (layers whose maps would take under 8 MiB run the explicit path instead, which is faster there);
  other modules' maps are wrapped as they come.
  Rollout, mean attention distance and the dataset statistics read attention this way.

Example::

    with vitviz.capture_attention(model) as cap:
        logits = model(x)
    cap.attentions[-1].shape  # (B, H, N, N)
"""

from __future__ import annotations

import fnmatch
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from torch import nn

from vitviz.core.contexts import checkpointing_off, walk_once
from vitviz.core.families import family_of
from vitviz.core.families.base import Emit, HeadMaps, Probe, Undo, chain_undos, shared_prepare
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.util import check_bool, is_int
from vitviz.errors import (
    CaptureError,
    ForwardStopped,
    InputError,
    InputTypeError,
    LayerSelectError,
    UnsupportedModelError,
)

LayerSelect = int | str | Sequence[int | str] | None
OnLayer = Callable[[int, torch.Tensor], None]  # or (int, HeadMaps) with heads="stream"
OnAbort = Callable[[int], None]  # the number of layers on_layer was handed of a pass that raised
HEAD_MODES = ("full", "stream")


class _SharedProbe:
    """One probe on one attention module, fanning each map out to every open capture that uses the module."""

    def __init__(self, module: nn.Module, probe: Probe) -> None:
        self.subscribers: list[tuple[object, Emit]] = []
        self.undo = probe(module, self._fan_out)

    def _fan_out(self, attn: torch.Tensor) -> None:
        if torch._C._current_graph_task_id() != -1:
            return  # a backward pass recomputing the forward (activation checkpointing): its maps were read then
        for _token, emit in list(self.subscribers):
            emit(attn)


# module -> probe function -> its shared probe; an entry lives while at least one capture subscribes.
_PROBES: weakref.WeakKeyDictionary[nn.Module, dict[Probe, _SharedProbe]] = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()


def subscribe(module: nn.Module, probe: Probe, emit: Emit) -> Undo:
    """Receive the attention maps of ``module``; the probe is installed for the first subscriber only.

    Returns:
        ``unsubscribe()``; the last subscriber's call removes the probe and restores the module exactly.
    """
    token = object()
    with _LOCK:
        probes = _PROBES.setdefault(module, {})
        shared = probes.get(probe)
        if shared is None:
            shared = probes[probe] = _SharedProbe(module, probe)
        shared.subscribers.append((token, emit))

    def unsubscribe() -> None:
        with _LOCK:
            if not any(t is token for t, _ in shared.subscribers):
                return  # already unsubscribed
            shared.subscribers[:] = [(t, e) for t, e in shared.subscribers if t is not token]
            if shared.subscribers:
                return
            probes = _PROBES.get(module, {})
            probes.pop(probe, None)
            if not probes:
                _PROBES.pop(module, None)
            shared.undo()

    return unsubscribe


def open_probes(model: nn.Module) -> int:
    """How many attention modules of ``model`` carry a shared probe now (0 when no capture is open on it)."""
    with _LOCK:
        return sum(len(_PROBES.get(m, {})) for m in model.modules())


def check_layer_index(value: object, depth: int, argument: str = "layers", model_name: str = "model") -> int:
    """Validate one layer index (negative counts from the end) and return it as ``0 <= i < depth``.

    Raises:
        LayerSelectError: a bool, a float or another non-integer, or an index outside ``-depth .. depth-1``.
    """
    if not is_int(value):
        kind = type(value).__name__
        hint = f"an integer such as {int(value)}" if isinstance(value, (float, np.floating)) and float(
            value).is_integer() else "an integer layer index (0 is the first, -1 the last)"
        raise LayerSelectError(
            f"{argument}={value!r} is a {kind}, not a layer index; pass {hint}"
            + (" or a module-name pattern such as 'blocks.1*'" if argument == "layers" else "")
        )
    index = int(value)
    if not -depth <= index < depth:
        raise LayerSelectError(
            f"{argument}={index} is out of range: {model_name} has {depth} attention layers; pass an index "
            f"from {-depth} to {depth - 1}"
        )
    return index % depth


def select_layers(names: Sequence[str], layers: LayerSelect, model_name: str = "model") -> list[int]:
    """Indices into ``names`` chosen by ``layers``: None (all), ints (negative allowed) or fnmatch patterns.

    The one validation path for layer selectors (``capture_attention``, and every call that takes ``layers``).

    Raises:
        LayerSelectError: a bool, float or other non-index, an empty selection, an index out of range, or a
            pattern that matches no attention module (each message names the value and the fix).
    """
    if layers is None:
        return list(range(len(names)))
    if isinstance(layers, (np.ndarray, torch.Tensor)) and layers.ndim == 0:  # torch.tensor(1), np.array(1)
        items: list[object] = [layers.item()]
    elif isinstance(layers, (str, int, float, bool, np.integer, np.floating)):
        items = [layers]
    elif isinstance(layers, (Sequence, range, np.ndarray, torch.Tensor)):
        items = list(layers.tolist() if isinstance(layers, (np.ndarray, torch.Tensor)) else layers)
    else:
        raise LayerSelectError(
            f"layers={layers!r} ({type(layers).__name__}) is not a layer selector; pass None (all layers), an "
            "index, a list of indices, or a module-name pattern such as 'blocks.1*'"
        )
    if not items:
        raise LayerSelectError(
            f"layers={layers!r} selects no layer; pass None for all {len(names)} layers of {model_name}, or "
            "at least one index or pattern"
        )
    chosen: list[int] = []
    for item in items:
        if isinstance(item, str):
            hits = [i for i, n in enumerate(names) if fnmatch.fnmatchcase(n, item)]
            if not hits:
                raise LayerSelectError(
                    f"layers={item!r} matches no attention module of {model_name}; its attention modules are "
                    f"{names[0]!r} ... {names[-1]!r} (select by index, or by a pattern such as 'blocks.1*')"
                )
        else:
            hits = [check_layer_index(item, len(names), "layers", model_name)]
        chosen += [h for h in hits if h not in chosen]
    return sorted(chosen)


class AttentionCapture:
    """What ``capture_attention`` yields. ``attentions``: list of ``(B, H, N, N)`` tensors in layer order;
    ``forwards``: the forward passes whose maps it read (a pass that raised is not counted)."""

    def __init__(self, spec: ViTSpec, layer_indices: list[int], *, on_layer: OnLayer | None, store: bool,
                 dtype: torch.dtype | None, accumulate: bool, retain_grad: bool, model_class: str = "model",
                 on_abort: OnAbort | None = None) -> None:
        self.spec = spec
        self.layer_indices = layer_indices
        self.layer_names = [spec.attention_modules[i] for i in layer_indices]
        self.forwards = 0
        self._model_class = model_class
        self._image_hw: tuple[int, int] | None = None  # (H, W) of the batch the running forward was given
        # enclosing calls running, with their sizes and whether they asked for interpolate_pos_encoding=True
        self._inputs: list[tuple[nn.Module, tuple[int, int], bool]] = []
        self._on_layer = on_layer
        self._on_abort = on_abort
        self._handed = 0  # on_layer calls of the running pass
        self._running: list[nn.Module] = []  # watched (enclosing) module calls running, outermost first
        self._call_emits = 0  # maps emitted since the outermost watched call began
        # (layers handed, their names) of a pass that raised with no on_abort to undo them: later passes refused
        self._spoiled: tuple[int, list[str]] | None = None
        self._store = store
        self._dtype = dtype
        self._accumulate = accumulate
        self._retain_grad = retain_grad
        self._current: dict[int, torch.Tensor | None] = {}
        self._failed_pass = False  # _current holds a pass that raised after its last selected layer
        self._done: list[torch.Tensor] | None = None
        # (patch grid or None where unknown, N) of the running pass and of the maps kept (accumulate=True)
        self._pass_tokens: tuple[tuple[int, int] | None, int] | None = None
        self._done_tokens: tuple[tuple[int, int] | None, int] | None = None

    def _emit(self, position: int, attn: torch.Tensor | HeadMaps) -> None:
        if self._spoiled is not None:
            self._refuse_spoiled()
        self._call_emits += 1
        if position == 0 or position in self._current:
            self._handed = 0
            if self._failed_pass:  # a retry of a pass that raised after its last selected layer replaces it
                self._current, self._failed_pass = {}, False
                self.forwards -= 1
            self._close_pass()
            self._check_tokens(position, attn.shape[-1])  # before counting: a refused pass is no forward read
            self._start_pass(attn.shape[-1])
            self.forwards += 1
        else:
            self._check_tokens(position, attn.shape[-1])
        if isinstance(attn, HeadMaps):  # heads="stream": passed on, never stored
            if self._on_layer is not None:
                self._handed += 1
                self._on_layer(position, attn if self._dtype is None else attn.to(self._dtype))
            self._current[position] = None
            return
        if self._retain_grad and attn.requires_grad:
            attn.retain_grad()
        elif not self._retain_grad:
            attn = attn.detach()
        if self._dtype is not None:
            attn = attn.to(self._dtype)
        if self._on_layer is not None:
            self._handed += 1
            self._on_layer(position, attn)
        self._current[position] = attn if self._store else None

    def _check_tokens(self, position: int, n: int) -> None:
        """Raise ``CaptureError`` unless a map's ``N`` is the layout's prefix tokens plus the input's patch grid.

        A model read at its built size (not ``dynamic_img_size``) that a call asks to interpolate its position table
        to another input (Hugging Face ``interpolate_pos_encoding=True``) makes that input's grid: refused, also where
        the two grids hold as many tokens (a 16x64 input to a 32x32 model at 8 px: 2x8 and 4x4), which ``N`` alone
        would let through with the tokens read on the wrong grid."""
        spec = self.spec
        if not spec.dynamic_img_size and self._image_hw is not None and any(e[2] for e in self._inputs):
            (h, w), (bh, bw) = self._image_hw, spec.img_size
            ih, iw = spec.grid_for((h, w))
            if (ih, iw) != tuple(spec.grid_size):
                raise CaptureError(
                    f"{spec.name} ({self._model_class}): called with interpolate_pos_encoding=True on a {h}x{w} "
                    f"input, whose patch grid is {ih}x{iw}, but vitviz reads this model on its built "
                    f"{spec.grid_size[0]}x{spec.grid_size[1]} grid ({bh}x{bw} px) and would misplace the tokens. "
                    f"Call it on {bh}x{bw} images (vitviz.load_images resizes them), or build it for this size "
                    f"(config.image_size=({h}, {w}))"
                )
        if spec.dynamic_img_size and self._image_hw is None:
            return  # the grid follows an input this capture has not seen (a call past the hooked modules)
        gh, gw = spec.grid_for(self._image_hw) if spec.dynamic_img_size else spec.grid_size
        want = spec.num_prefix_tokens + gh * gw
        if n != want:
            off_stride = spec.dynamic_img_size and not spec.on_stride(self._image_hw)  # type: ignore[arg-type]
            (h, w), (sh, sw) = (self._image_hw or spec.img_size), spec.patch_size
            fix = (f"The {h}x{w} input is not a whole number of {sh}x{sw} token strides (the model padded or cropped "
                   "it to a grid of its own): resize or crop the images to multiples of the stride" if off_stride else
                   "Feed the model its built input size (vitviz.load_images), or describe its layout with "
                   "vitviz.describe(model, prefix_tokens=...)")
            raise CaptureError(
                f"{spec.name} ({self._model_class}): {self.layer_names[position]} attended over N={n} tokens, but "
                f"its layout is {spec.num_prefix_tokens} prefix tokens {spec.prefix_tokens} + a {gh}x{gw} patch "
                f"grid = {want}; vitviz would misplace the tokens. {fix}"
            )

    def _start_pass(self, n: int) -> None:
        """Note the grid and ``N`` of the pass that starts; with ``accumulate=True``, raise ``CaptureError`` when
        they differ from those of the maps kept: the passes' maps would be concatenated into one batch that no one
        grid reads (a ``dynamic_img_size`` model given inputs of other sizes; a 32x48 and a 48x32 input even make
        the same ``N``)."""
        spec = self.spec
        grid = spec.grid_for(self._image_hw) if spec.dynamic_img_size and self._image_hw is not None else None
        self._pass_tokens = (grid, n)
        done = self._done_tokens
        if not (self._accumulate and self._store and self._done is not None and done is not None):
            return
        if (grid is not None and done[0] is not None and grid != done[0]) or n != done[1]:
            def what(tokens: tuple[tuple[int, int] | None, int]) -> str:
                g, count = tokens
                return f"a {g[0]}x{g[1]} patch grid (N={count})" if g is not None else f"N={count} tokens"

            raise CaptureError(
                f"{spec.name}: capture_attention(accumulate=True) concatenates the maps of successive forward passes "
                f"along the batch, but this pass's input makes {what(self._pass_tokens)} and the earlier passes' "
                f"{what(done)}: maps of two grids do not form one (B, H, N, N) batch that one grid reads. Open one "
                "capture per input size, or resize the images to one size (vitviz.load_images)"
            )

    def _abort_pass(self, error: BaseException | None = None) -> None:
        """A forward raised: drop the maps of its unfinished pass (a retry starts a fresh one). A pass that raised
        after every selected layer (out of memory in the last MLP or the head) keeps its maps for a read, but a
        retry replaces it: it is neither counted beside the retry nor, with ``accumulate=True``, joined to the
        retry's maps (the same images twice). A vitviz hook that ends the forward on purpose once it has read what
        it needs (``ForwardStopped``) ends a pass whose layers all ran as a complete one.

        The layers already handed to ``on_layer`` cannot be taken back by the capture: ``on_abort(k)`` is called
        once with their count, for the caller to undo them; without ``on_abort`` every later pass of this capture is
        refused (``_refuse_spoiled``), since a reduction ``on_layer`` keeps would hold them beside the retry.

        A forward that raised before emitting any map of its own (a bad input in the patch embedding) aborts
        nothing: the maps held are a finished earlier pass's, neither dropped nor marked failed."""
        if self._call_emits == 0:
            return
        if self._handed and not isinstance(error, ForwardStopped):
            handed, self._handed = self._handed, 0  # once per pass: the hooks of nested modules all see the error
            if self._on_abort is not None:
                self._on_abort(handed)
            else:
                self._spoiled = (handed, [self.layer_names[i] for i in sorted(self._current)][:handed])
        if not self._current:
            return
        if len(self._current) == len(self.layer_names):
            self._failed_pass = not isinstance(error, ForwardStopped)
            return
        self._current = {}
        self.forwards -= 1

    def _refuse_spoiled(self) -> None:
        handed, names = self._spoiled  # type: ignore[misc]
        shown = ", ".join(names[:3]) + (f", ... {names[-1]}" if len(names) > 3 else "")
        raise CaptureError(
            f"{self.spec.name} ({self._model_class}): an earlier forward pass inside this capture_attention block "
            f"raised after on_layer had been handed {handed} of its layers ({shown}); a reduction on_layer keeps "
            "would hold them beside this pass's. Open a new capture_attention block (and a new reduction) for the "
            "retry, or pass on_abort=fn: fn(k) is called when a pass raises after k layers were handed to on_layer, "
            "to undo them (on_abort=lambda k: None where on_layer keeps nothing across layers)"
        )

    def _close_pass(self) -> None:
        if not self._current:
            return
        self._failed_pass = False
        missing = [self.layer_names[i] for i in range(len(self.layer_names)) if i not in self._current]
        if missing:
            raise CaptureError(
                f"{self.spec.name}: the forward pass produced no attention for {missing}; the module was not "
                "called, or it computes attention without the path vitviz probes (describe it with "
                "vitviz.describe(model, probe='qkv'))"
            )
        if self._store:
            maps = [self._current[i] for i in range(len(self.layer_names))]
            if self._accumulate and self._done is not None:
                maps = [torch.cat([a, b], dim=0) for a, b in zip(self._done, maps)]
            self._done = maps  # type: ignore[assignment]
            self._done_tokens = self._pass_tokens
        self._current = {}

    @property
    def attentions(self) -> list[torch.Tensor]:
        """Per selected layer, ``(B, H, N, N)`` maps, of the kind ``spec.attention_maps`` names (post-softmax
        probabilities, rows summing to 1, for ``softmax`` layers)."""
        self._close_pass()
        if not self._store:
            raise CaptureError("capture_attention(..., store=False) keeps no maps; use on_layer= to reduce them")
        if self._done is None:
            raise CaptureError(f"no forward pass of {self.spec.name} ran inside the capture_attention block")
        return self._done

    def stacked(self) -> torch.Tensor:
        """All selected layers as one ``(L, B, H, N, N)`` tensor."""
        return torch.stack(self.attentions)


def _enclosing_modules(model: nn.Module, named: list[tuple[str, nn.Module]]) -> list[nn.Module]:
    """The modules that hold every one of the ``(name, module)`` pairs ``named`` (names as ``named_modules`` gives
    them): ``model`` first, then down to their nearest common ancestor. Whatever entry point runs them
    (``model(x)``, ``model.vision_model``, ``forward_features``'s ``blocks``) passes through at least one. A name
    that does not lead to its module is looked up in ``named_modules``; a module not in ``model`` gives
    ``[model]``."""
    paths, names = [], None
    for name, module in named:
        path = _module_path(model, name)
        if path is None or path[-1] is not module:  # walked by its module: names of named_modules, once
            names = names if names is not None else {id(m): n for n, m in model.named_modules()}
            found = names.get(id(module))
            path = None if found is None else _module_path(model, found)
            if path is None:
                return [model]
        paths.append(path)
    common = []
    for level in zip(*paths):
        if any(m is not level[0] for m in level):
            break
        common.append(level[0])
    return common or [model]


def _module_path(model: nn.Module, name: str) -> list[nn.Module] | None:
    """``model`` and each module down the dotted ``name`` (``model`` alone for ``""``); None if a part is missing."""
    path = [model]
    for part in name.split(".") if name else []:
        child = path[-1]._modules.get(part)
        if child is None:
            return None
        path.append(child)
    return path


def _watch_passes(cap: AttentionCapture, modules: list[nn.Module]) -> Undo:
    """Hooks on the enclosing ``modules``: note the input's image size (the grid of ``dynamic_img_size`` models),
    and when a forward raises (out of memory in block 1, a user's hook) drop the unfinished pass, so a retry in
    the same block is read afresh.

    A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``: Ctrl-C in a notebook) skips even
    ``always_call`` hooks (torch runs them in an ``except Exception``): the stopped calls stay on ``_running``. A
    watched module called again while it is on ``_running`` is such a leftover (a module does not call itself), so
    the stopped pass is dropped then, as ``after`` would have (before: the retry was refused with a ``CaptureError``
    naming the layers the stopped pass never reached)."""
    def before(m: nn.Module, args: tuple, kwargs: dict) -> None:
        if any(r is m for r in cap._running):  # left by a call a KeyboardInterrupt stopped
            cap._running.clear()
            cap._inputs.clear()
            cap._image_hw = None
            cap._abort_pass()
        if not cap._running:  # the outermost watched call starts: nothing emitted or handed by it yet
            cap._call_emits = cap._handed = 0
        cap._running.append(m)
        x = args[0] if args else kwargs.get("pixel_values", kwargs.get("x"))
        if isinstance(x, torch.Tensor) and x.ndim == 4:
            cap._inputs.append((m, (int(x.shape[-2]), int(x.shape[-1])), bool(kwargs.get("interpolate_pos_encoding"))))
            cap._image_hw = cap._inputs[-1][1]

    def after(m: nn.Module, _args: tuple, _kwargs: dict, result: object) -> None:
        if cap._inputs and cap._inputs[-1][0] is m:
            cap._inputs.pop()
            cap._image_hw = cap._inputs[-1][1] if cap._inputs else None
        if cap._running and cap._running[-1] is m:
            cap._running.pop()
        if result is None and sys.exc_info()[1] is not None:  # always_call: run as the forward's exception passes
            cap._abort_pass(sys.exc_info()[1])

    handles = []
    for module in modules:
        handles.append(module.register_forward_pre_hook(before, with_kwargs=True, prepend=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True, always_call=True))

    def undo() -> None:
        for handle in handles:
            handle.remove()

    return undo


@contextmanager
def capture_attention(
    model: nn.Module,
    layers: LayerSelect = None,
    *,
    on_layer: OnLayer | None = None,
    store: bool = True,
    dtype: torch.dtype | None = None,
    accumulate: bool = False,
    retain_grad: bool = False,
    heads: str = "full",
    on_abort: OnAbort | None = None,
) -> Iterator[AttentionCapture]:
    """Record post-softmax attention of ``model`` for every forward inside the block.

    Args:
        model: any ViT ``vitviz.inspect`` reads (timm, torchvision, Hugging Face, tutorial, described).
        layers: which attention layers: ``None`` (all), an index or indices (negative allowed), or fnmatch
            patterns on module names (``"blocks.1*.attn"``).
        on_layer: ``fn(i, attn)`` called as each selected layer's ``(B, H, N, N)`` map is produced.
        store: keep the maps in ``cap.attentions`` (set False when ``on_layer`` reduces them).
        dtype: cast the maps (e.g. ``torch.float32`` for half-precision models); default: as computed.
            Softmax statistics are float32 in every probe (PyTorch's softmax kernels accumulate in float32).
        accumulate: concatenate the maps of successive forwards along the batch instead of keeping the last; a
            forward whose input makes another patch grid than the earlier ones' (a ``dynamic_img_size`` model) is
            refused with ``CaptureError``.
        retain_grad: keep the maps in the autograd graph and retain their gradients (for gradient rollout).
        heads: ``"full"`` (default): ``on_layer`` and ``attentions`` get ``(B, H, N, N)`` tensors. ``"stream"``:
            ``on_layer`` gets a ``HeadMaps`` per layer, one head's ``(B, N, N)`` at a time (needs ``on_layer`` and
            ``store=False``; no gradients). See the module docstring.
        on_abort: ``fn(k)`` called once when a forward raises after ``on_layer`` was handed ``k >= 1`` of its layers
            (out of memory in block 5), to undo them in the reduction before a retry; default: ``on_layer``'s own
            ``on_abort`` method where it has one (``vitviz.Propagator``, which starts afresh at every pass). Without
            either, every later forward in the block is refused with ``CaptureError``: the reduction would silently
            mix the failed pass's layers with the retry's. A vitviz hook that stops a forward on purpose
            (``ForwardStopped``) is no failure.

    Yields:
        ``AttentionCapture`` with ``attentions``, ``layer_names``, ``spec`` and ``forwards``.
    """
    with walk_once():  # the set-up's walks over the model made once (an analysis call's window, or one of its own)
        cap, undos = _open_capture(model, layers, on_layer, store, dtype, accumulate, retain_grad, heads, on_abort)
    try:
        yield cap
        if cap._running:  # a forward a KeyboardInterrupt stopped, caught in the block (``_watch_passes``)
            cap._running.clear()
            cap._abort_pass()
        cap._close_pass()
    finally:
        chain_undos(undos)()


def _open_capture(model: nn.Module, layers: LayerSelect, on_layer: OnLayer | None, store: bool,
                  dtype: torch.dtype | None, accumulate: bool, retain_grad: bool,
                  heads: str, on_abort: OnAbort | None = None) -> tuple[AttentionCapture, list[Undo]]:
    """``capture_attention``'s set-up: its arguments checked, the capture and its probes installed; returns the
    capture and what undoes the set-up, in order (undone already if the set-up raised)."""
    spec = inspect(model)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(
            f"dtype={dtype!r} is not a floating torch dtype; attention maps are probabilities: pass "
            "torch.float32 (or torch.float16 / torch.bfloat16), or None to keep the model's dtype"
        )
    if on_layer is not None and not callable(on_layer):
        raise InputTypeError(f"on_layer={on_layer!r} is not callable; pass a function on_layer(position, attn) or "
                             "None")
    if on_abort is None and on_layer is not None:
        on_abort = getattr(on_layer, "on_abort", None)  # a reduction that knows how to undo a failed pass
    if on_abort is not None and (not callable(on_abort) or on_layer is None):
        raise InputTypeError(f"on_abort={on_abort!r}: pass a function on_abort(k) that undoes the k layers a failed "
                             "pass handed to on_layer= (which it needs), or None")
    if heads not in HEAD_MODES:
        raise InputError(f"heads={heads!r} is not understood; pass 'full' ((B, H, N, N) maps) or 'stream' "
                         "(one head at a time, for reductions)")
    check_bool(store, "store", "keep every layer's maps for .attentions, or only hand them to on_layer")
    check_bool(accumulate, "accumulate", "join the maps of successive forward passes along the batch")
    check_bool(retain_grad, "retain_grad", "keep the maps' gradients after backward")
    if heads == "stream" and (store or on_layer is None or retain_grad or accumulate):
        raise InputError(
            "heads='stream' hands each layer's heads to on_layer one at a time and keeps nothing: pass on_layer=fn "
            "and store=False (without retain_grad or accumulate), or use heads='full' to keep the maps"
        )
    family = family_of(model)
    modules = family.attention_modules(model)
    chosen = select_layers([n for n, _ in modules], layers, spec.name)
    cap = AttentionCapture(spec, chosen, on_layer=on_layer, store=store, dtype=dtype, accumulate=accumulate,
                           retain_grad=retain_grad, model_class=type(model).__name__, on_abort=on_abort)
    undos: list[Undo] = []
    try:
        stack = ExitStack()
        undos.append(stack.close)
        stack.enter_context(checkpointing_off(model))
        undos.append(shared_prepare(family, model))
        undos.append(_watch_passes(cap, _enclosing_modules(model, [modules[i] for i in chosen])))
        for position, index in enumerate(chosen):
            name, module = modules[index]
            try:
                stream = family.stream_probe(module) if heads == "stream" else None
                if stream is not None:
                    undos.append(subscribe(module, stream, lambda a, p=position: cap._emit(p, a)))
                elif heads == "stream":
                    undos.append(subscribe(module, family.probe,
                                           lambda a, p=position: cap._emit(p, HeadMaps.of(a.detach()))))
                else:
                    undos.append(subscribe(module, family.probe, lambda a, p=position: cap._emit(p, a)))
            except UnsupportedModelError as err:  # a probe refusing its module: say which model and which module
                raise UnsupportedModelError(f"{type(model).__name__} ({family.name}), attention module {name!r}: "
                                            f"{err}") from err
    except BaseException:
        chain_undos(undos)()
        raise
    return cap, undos
