"""An analysis call recorded once as a CUDA graph and replayed for each batch: ``vitviz.graphed``.

On a GPU at small batches an analysis call is bound by its host: on an H200 (ViT-B/16, 448 px, batch 8, bfloat16;
``docs/benchmarks.md``) the host took some 19 ms to issue a rollout call whose kernels ran in 4.9 ms. The Python
of the call (reading the model, the capture's set-up, a stream probe's hooks per layer, the kernels' launch
arguments) is the same on every call of the same shape. A CUDA graph (``torch.cuda.CUDAGraph``) records the
kernels one call queues and replays them with one launch: that Python runs once, at recording.

``graphed(fn, model, example, **options)`` records ``fn(model, example, **options)`` and returns a
``GraphedCall``; ``call(images)`` copies ``images`` into the recorded input, replays, and returns copies of the
outputs (a device tensor cloned, a result the analysis returns on the CPU copied there), so a result is never
overwritten by a later call. Each call still checks its input as the analysis does (a normalised float tensor,
finite: one read on the host) before it reaches the model.

A recording is made again, before the call replays, when:

- the batch has another shape or dtype (each is recorded once and kept: the last, smaller batch of a loop records
  its own graph);
- the model's structure changed (a submodule, parameter or buffer added, removed or replaced) or one of its
  tensors moved to other memory, another dtype or device (``model.half()``, ``p.data = ...``: a model moved to
  another device records there, one moved off CUDA is refused) or was given other strides in place (``w.t_()``);
- a submodule's attribute was set, replaced or removed (a module's ``scale``, ``fused_attn``, timm's
  ``global_pool``, ``training``, a tensor kept outside the parameters and buffers), or one of a ``config`` object
  a submodule holds (Hugging Face's ``_attn_implementation``, which ``set_attn_implementation`` writes): compared
  by identity (``_Attributes``), so an attribute set again to an equal new object records again;
- a submodule's class changed (``m.__class__ = ...``), or a forward hook added or removed (on a submodule, or
  PyTorch's global ones): a replay runs no hook, so one added after the recording is recorded (and warned of);
- a switch differs: vitviz's (``headmap_kernel``'s mode, ``$VITVIZ_HEADMAP_KERNEL``, ``forward_lse``'s setting,
  ``$VITVIZ_HEADMAP_BLOCKS``) or PyTorch's that pick the kernels (SDPA's backends and their priority,
  ``torch.nn.attention.sdpa_kernel``; TF32; reduced-precision reductions; cuDNN's ``enabled``, ``benchmark``,
  ``deterministic``; ``torch.use_deterministic_algorithms``; the preferred BLAS library; ``nn.MultiheadAttention``'s
  fast path).

Weights written in place (an optimizer step, ``load_state_dict``) need no new recording: the graph reads the
parameters' memory when it replays. What a replay does not see (make a new ``graphed`` call after changing it):
what changes inside an attribute's object (a list appended to, a dict or an object other than a ``config``
written into), a global the forward reads, and Python code the call runs (a hook of yours runs at recording, not
at replay: a recording warns when the model carries forward hooks or an open ``vitviz.capture_attention``).

Recordable analyses are marked ``graphable`` (``attention_rollout``, ``mean_attention_distance``); they queue no
host read of a device value while ``core.contexts.recording()`` holds (pinned on fake CUDA tensors by
``tests/test_cuda_host_path.py``): the input's finiteness check is made by ``GraphedCall`` before the copy, and a
result the analysis hands back on the CPU is marked with ``contexts.to_host`` and copied after the replay. The call's
first runs (``WARMUP``, on a side stream, before the capture) compile the kernels and fill what vitviz keeps per
configuration (``forward_lse.checked``'s trust), so the recorded run reads nothing either.
"""

from __future__ import annotations

import operator
import os
import sys
import warnings
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from vitviz.core.contexts import Recording, named_submodules, recording_into, walk_once
from vitviz.errors import CaptureError, InputError, InputTypeError, UnsupportedModelError, VitvizError

__all__ = ["GraphedCall", "graphable", "graphed"]

CHANGED_IN_A_ROW = 3  # calls in a row that find the model changed: each recorded again, and a warning says why
WARMUP = 2  # eager runs on a side stream before the capture: kernels compiled, per-configuration checks made


def graphable(fn: Callable) -> Callable:
    """Mark an analysis ``fn(model, images, **options)`` as recordable by ``graphed`` (see the module docstring for
    what that promises)."""
    fn.__vitviz_graphable__ = True  # type: ignore[attr-defined]
    return fn


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


# PyTorch's switches that pick the kernels a forward queues (or refuse some), each read as its own function: SDPA's
# backends and their priority (as torch.nn.attention.sdpa_kernel sets them), the float32 precision of matmuls and
# convolutions, through the API of each version (fp32_precision where it exists, the older allow_tf32 and float32
# matmul precision; a torch that has had the new API set refuses to read the old one, and one without the new API
# has no such attribute), the reduced-precision reductions and accumulation, cuDNN's choice of algorithms,
# deterministic algorithms (an eager call under them takes deterministic kernels, or refuses), the BLAS library and
# nn.MultiheadAttention's fast path (torchvision's ViT)
_TORCH_SWITCHES = (
    lambda: torch.backends.cuda.flash_sdp_enabled(), lambda: torch.backends.cuda.mem_efficient_sdp_enabled(),
    lambda: torch.backends.cuda.math_sdp_enabled(), lambda: torch.backends.cuda.cudnn_sdp_enabled(),
    lambda: torch._C._get_sdp_priority_order(),
    lambda: torch.backends.cuda.matmul.fp32_precision, lambda: torch.backends.cudnn.fp32_precision,
    lambda: torch.backends.cudnn.conv.fp32_precision, lambda: torch.backends.fp32_precision,
    lambda: torch.backends.cuda.matmul.allow_tf32, lambda: torch.backends.cudnn.allow_tf32,
    torch.get_float32_matmul_precision,
    lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    lambda: torch.backends.cuda.matmul.allow_fp16_accumulation,
    lambda: torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
    lambda: torch.backends.cudnn.enabled, lambda: torch.backends.cudnn.benchmark,
    lambda: torch.backends.cudnn.deterministic,
    torch.are_deterministic_algorithms_enabled, torch.is_deterministic_algorithms_warn_only_enabled,
    lambda: torch.backends.cuda.preferred_blas_library(), lambda: torch.backends.mha.get_fastpath_enabled())


def _switch(read: Callable[[], Any]) -> Any:
    """One of PyTorch's switches, or None where this torch has it not or refuses to read it (``_TORCH_SWITCHES``)."""
    try:
        return read()
    except (AttributeError, RuntimeError):
        return None


def _settings() -> tuple:
    """The switches a recording depends on beside the model: vitviz's (the kernels' mode in force, from
    ``headmap_kernel`` or ``$VITVIZ_HEADMAP_KERNEL``; ``forward_lse``'s setting; the kernels' tiles,
    ``$VITVIZ_HEADMAP_BLOCKS``, read at each launch) and PyTorch's that pick the kernels
    a forward queues (``_TORCH_SWITCHES``: SDPA's backends, the float32 precision of matmuls and convolutions, the
    reduced-precision reductions, cuDNN's and the deterministic algorithms' settings...)."""
    from vitviz.core import kernels
    from vitviz.core.kernels import forward_lse

    return (kernels.kernel_mode(), forward_lse.setting(), os.environ.get("VITVIZ_HEADMAP_BLOCKS"),
            tuple(_switch(read) for read in _TORCH_SWITCHES))


class _Attributes:
    """Every submodule's instance dict, and that of a ``config`` object a submodule holds: the names (a tuple per
    dict, compared by equality) and the values (one flat list, compared by identity, each dict's led by its
    object's class, named ``__class__`` by ``changed``); and the submodules' forward hooks (``hooks``: the handles'
    ids, compared by equality).
    An attribute set, replaced or removed (``attn.scale = ...``, ``model.eval()``, a plain tensor swapped for
    another, Hugging Face's ``set_attn_implementation``), a class changed (``m.__class__ = ...``: another forward)
    or a hook added or removed (a replay runs no hook: one added after the recording must be recorded, and warned
    of) makes them differ. Values by identity, not equality: in C, and safe for any value (``==`` on two tensors is
    a tensor); a value set again to an equal new object (a float recomputed) records again, never wrongly replays.
    Holds its values until the next state replaces it (a replaced tensor lives one recording longer)."""

    __slots__ = ("paths", "names", "values", "hooks")

    def __init__(self, model: nn.Module) -> None:
        paths: list[str] = []
        names: list[tuple] = []
        values: list[Any] = []
        hooks: list[tuple] = []
        path, name, keep, add, hook = paths.append, names.append, values.append, values.extend, hooks.append
        configs: set[int] = set()
        for where, m in named_submodules(model):
            d = m.__dict__
            path(where)
            name(tuple(d))
            keep(type(m))
            add(d.values())
            pre, post = d["_forward_pre_hooks"], d["_forward_hooks"]
            if pre or post:  # the hooks' kinds (with kwargs, always called) are keyed by the same handle ids
                hook((where, tuple(pre), tuple(post)))
            config = d.get("config")  # Hugging Face's attention reads config._attn_implementation at each forward
            if config is not None and id(config) not in configs and hasattr(config, "__dict__"):
                configs.add(id(config))
                path(f"{where}.config" if where else "config")
                name(tuple(vars(config)))
                keep(type(config))
                add(vars(config).values())
        self.paths, self.names, self.values, self.hooks = paths, names, values, hooks

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _Attributes) and self.names == other.names and self.hooks == other.hooks
                and all(map(operator.is_, self.values, other.values)))  # equal names: lists of one length

    __hash__ = None  # type: ignore[assignment]

    def changed(self, before: _Attributes) -> list[str]:
        """The attributes (``path.name``) set, replaced or removed since ``before``, where the modules are the
        same; ``[]`` where they are not (the structure changed)."""
        if self.paths != before.paths:
            return []
        out: list[str] = []
        new_at = old_at = 0
        for where, new, old in zip(self.paths, self.names, before.names, strict=True):
            dot = f"{where}." if where else ""
            if self.values[new_at] is not before.values[old_at]:
                out.append(dot + "__class__")
            new_at, old_at = new_at + 1, old_at + 1
            if new == old:
                out += [dot + n for i, n in enumerate(new) if self.values[new_at + i] is not before.values[old_at + i]]
            else:
                out += [dot + n for n in sorted(set(new) ^ set(old))]
            new_at, old_at = new_at + len(new), old_at + len(old)
        return out


def _what_changed(before: tuple, now: tuple) -> str:
    """``_model_state`` ``before`` against ``now``, in words, for a warning."""
    said = []
    if now[0] != before[0]:
        said.append("its structure or a tensor's memory, dtype or device")
    if now[1] != before[1]:
        names = now[1].changed(before[1])
        more = f" and {len(names) - 4} more" if len(names) > 4 else ""
        hooked = sorted({where for where, *_ in set(now[1].hooks) ^ set(before[1].hooks)})
        if names or not hooked:
            said.append(f"the attributes {', '.join(names[:4])}{more}" if names else "its attributes")
        if hooked:
            said.append(f"the forward hooks of {', '.join(w or 'the model itself' for w in hooked[:4])}")
    if now[2] != before[2]:
        said.append("vitviz's or PyTorch's kernel switches")
    if now[3] != before[3]:
        said.append("PyTorch's global forward hooks")
    return "; ".join(said)


def _model_state(model: nn.Module) -> tuple:
    """The model as a recording depends on it: its structure with each tensor's memory, dtype, device and strides
    (``spec.model_structure(memory=True)``), each submodule's attributes, class and hooks (``_Attributes``),
    ``_settings``, and PyTorch's global forward hooks (read before ``walk_once``, which adds one of its own); the
    model walked once (``walk_once``)."""
    from torch.nn.modules import module as torch_module

    from vitviz.core.spec import model_structure

    hooks = tuple(torch_module._global_forward_pre_hooks), tuple(torch_module._global_forward_hooks)
    with walk_once():
        return model_structure(model, memory=True), _Attributes(model), _settings(), hooks


def _foreign_hooks(model: nn.Module) -> list[str]:
    """What of the model's Python would run at recording only: the modules carrying forward hooks (pre or post),
    PyTorch's global forward hooks, and an open vitviz capture on the model (its probes are such hooks)."""
    from torch.nn.modules import module as torch_module

    from vitviz.core.capture import open_probes

    probed = open_probes(model)
    if probed:
        return [f"an open vitviz.capture_attention on {probed} attention modules"]
    found = [name or "the model itself" for name, m in named_submodules(model)
             if m._forward_hooks or m._forward_pre_hooks]
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        found.append("PyTorch's global forward hooks (register_module_forward_hook)")
    return found


def _warn(message: str) -> None:
    """A ``UserWarning`` at the user's line: the first frame outside this file."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def _warn_hooks(fn: Callable, model: nn.Module) -> None:
    found = _foreign_hooks(model)
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        _warn(f"vitviz.graphed({_name(fn)}): {type(model).__name__} carries forward hooks ({shown}). A recorded "
              f"call runs Python only while it records ({WARMUP} warm-ups and the capture), never at a replay: the "
              "tensors a hook computes are replayed, its other effects (a list it appends to, a counter) happen at "
              "recording only. Remove the hooks (or close the capture) before vitviz.graphed, or call the analysis "
              "without it")


def _deliver(out: Any, host: list[torch.Tensor]) -> Any:
    """The recorded outputs as a call hands them back: each tensor copied (to the CPU where ``host`` holds it)."""
    if isinstance(out, torch.Tensor):
        return out.to("cpu", copy=True) if any(out is t for t in host) else out.clone()  # a copy, on any device
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # a named tuple
        return type(out)(*(_deliver(o, host) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_deliver(o, host) for o in out)
    if isinstance(out, dict):
        return {k: _deliver(v, host) for k, v in out.items()}
    return out


class _CudaGraphs:
    """The recording backend: ``record(run, device)`` -> ``(replay, outputs)``: ``WARMUP`` eager runs on a side
    stream, then one run captured into a ``torch.cuda.CUDAGraph`` (its memory in the graph's private pool)."""

    @staticmethod
    def available(device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    @staticmethod
    def record(run: Callable[[], Any], device: torch.device) -> tuple[Callable[[], None], Any]:
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
        return graph.replay, out


def _key(x: torch.Tensor) -> tuple:
    """What a recording is kept per: the batch's shape and dtype (the analysis casts it as the model needs)."""
    return tuple(x.shape), x.dtype


class _Graph:
    """One recording: the input it reads, how to replay it, its outputs and which of them go to the CPU."""

    __slots__ = ("static", "replay", "outputs", "host")

    def __init__(self, static: torch.Tensor, replay: Callable[[], None], outputs: Any,
                 host: list[torch.Tensor]) -> None:
        self.static, self.replay, self.outputs, self.host = static, replay, outputs, host


class GraphedCall:
    """``fn(model, images, **options)`` recorded as CUDA graphs, one per input shape and dtype; see ``graphed``.

    Attributes:
        fn, model, options: what is recorded; fixed when the call is made (setting one, or an option, raises
            ``InputError``: a replay would run the recording of the former, so make a new ``vitviz.graphed`` call).
        recordings: how many recordings were made (a new shape, a changed model or switch each make one).
    """

    backend: Any = _CudaGraphs
    _FIXED = ("fn", "model", "options")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._FIXED and name in self.__dict__:
            raise InputError(f"GraphedCall.{name} is fixed when the call is recorded: a replay would run the "
                             f"recording of the former {name}; make a new vitviz.graphed(fn, model, example, "
                             "**options) call")
        object.__setattr__(self, name, value)

    def __init__(self, fn: Callable, model: nn.Module, example: torch.Tensor, **options: Any) -> None:
        if not getattr(fn, "__vitviz_graphable__", False):
            raise InputError(f"fn={_name(fn)} cannot be recorded as a CUDA graph; pass vitviz.attention_rollout or "
                             "vitviz.mean_attention_distance (the analyses that queue no host read inside a call)")
        if not isinstance(model, nn.Module):
            raise InputTypeError(f"model: got a {type(model).__name__}; pass the nn.Module to analyse")
        self.model = model
        self.device = self._device()
        for key in ("batch_size", "progress"):
            if options.get(key) not in (None, False):
                raise InputError(f"{key}={options[key]!r}: a recorded call runs its whole batch in one pass, without "
                                 "progress bar; leave it out (record the batch size you want as the example's)")
        self.fn, self.options = fn, MappingProxyType(dict(options))  # read-only: see the class docstring
        self.recordings = 0
        self._changed_in_a_row = 0
        self._graphs: dict[tuple, _Graph] = {}
        self._state: tuple | None = None
        self._check(example, "example")
        self._record(example)

    def _device(self) -> torch.device:
        """The device the model's parameters are on now, where the backend records (a model moved since the last
        recording, ``model.to(...)``, is recorded on its new device, or refused off CUDA)."""
        device = next((p.device for p in self.model.parameters()), None)
        if device is None or not self.backend.available(device):
            raise UnsupportedModelError(
                f"{type(self.model).__name__} has its parameters on {device}; a CUDA graph records a call on a CUDA "
                "device (model.cuda()). On the CPU call the analysis itself: there is no launch cost to save")
        return device

    def _check(self, x: Any, argument: str) -> tuple[float, float] | None:
        from vitviz.core.images import check_tensor

        if not isinstance(x, torch.Tensor):
            raise InputTypeError(f"{argument}: got a {type(x).__name__}; a recorded call takes a normalised "
                                 "(B, 3, H, W) float tensor (vitviz.load_images(model, images) makes one)")
        return check_tensor(x, argument)  # shape, channels, dtype, finiteness: the analysis's own checks

    def _record(self, x: torch.Tensor, state: tuple | None = None) -> _Graph:
        """Record the call on a batch like ``x``, on the model's device now; ``state``: the model's ``_model_state``,
        where the caller has it."""
        self.device = self._device()
        static = torch.empty_like(x, device=self.device, memory_format=torch.contiguous_format)
        static.copy_(x)
        rec = Recording()

        def run() -> Any:  # each run marks its own outputs: the last one's are the recording's
            rec.host.clear()
            with recording_into(rec):
                return self.fn(self.model, static, **self.options)

        state = _model_state(self.model) if state is None else state
        _warn_hooks(self.fn, self.model)
        try:
            replay, outputs = self.backend.record(run, self.device)
        except VitvizError:
            raise  # a refused input or model: the analysis's own error
        except RuntimeError as err:
            raise CaptureError(
                f"{_name(self.fn)} on {type(self.model).__name__} could not be recorded as a CUDA graph: {err}. "
                "Something in its forward reads a value on the host or copies from the CPU (a model's own "
                "`.item()`, a tensor made from a Python list); call the analysis without vitviz.graphed") from err
        self._state = state
        graph = self._graphs[_key(x)] = _Graph(static, replay, outputs, list(rec.host))
        self.recordings += 1
        return graph

    def __call__(self, images: torch.Tensor) -> Any:
        """``fn(model, images, **options)``: the recorded kernels replayed on ``images`` (recorded first where
        ``images`` has a shape not seen, or the model or vitviz's switches changed); copies of the outputs."""
        from vitviz.core.images import warn_unnormalised

        state = _model_state(self.model)  # before the finiteness read waits for the device: no idle gap after it
        # pixels in [0, 1] for a model that normalises (load_images's warning: a replay runs no load_images)
        warn_unnormalised(self.model, self._check(images, "images"), "images")
        if state != self._state:
            self._changed_in_a_row += 1
            if self._changed_in_a_row == CHANGED_IN_A_ROW:
                self._warn_changing(state)
            self._graphs.clear()
        else:
            self._changed_in_a_row = 0
        graph = self._graphs.get(_key(images)) or self._record(images, state)
        graph.static.copy_(images)  # a capture queues its kernels without running them: every call replays
        graph.replay()
        return _deliver(graph.outputs, graph.host)

    def _warn_changing(self, state: tuple) -> None:
        _warn(f"vitviz.graphed({_name(self.fn)}): {type(self.model).__name__} changed before each of the last "
              f"{CHANGED_IN_A_ROW} calls ({_what_changed(self._state, state)}), so each recorded again, which costs "
              "more than the eager call. Leave the model as it is between calls (set what you change once, then "
              "call vitviz.graphed), or call the analysis without it")

    def __repr__(self) -> str:
        shapes = ", ".join(f"{shape} {str(dtype).removeprefix('torch.')}" for shape, dtype in self._graphs) or "none"
        return f"GraphedCall({_name(self.fn)}, {type(self.model).__name__}, recorded: {shapes})"


def graphed(fn: Callable, model: nn.Module, example: torch.Tensor, **options: Any) -> GraphedCall:
    """``fn(model, images, **options)`` recorded once as a CUDA graph, replayed per call (module docstring).

    Args:
        fn: ``vitviz.attention_rollout`` or ``vitviz.mean_attention_distance``.
        model: the model, on a CUDA device; it runs in eval mode, as in the analysis.
        example: a normalised ``(B, 3, H, W)`` float tensor of the shape and dtype the calls will pass (its values
            do not matter); recorded now.
        **options: ``fn``'s options (``head_fusion``, ``token``, ``autocast``...), fixed for every call;
            ``batch_size`` and ``progress`` are refused (one pass per call).

    Returns:
        A ``GraphedCall``: ``call(images)`` returns what ``fn(model, images, **options)`` returns.

    Raises:
        InputError: ``fn`` is not recordable, or an option does not apply to a recorded call.
        UnsupportedModelError: the model is not on a CUDA device.
        ImageInputError: ``example`` is not a normalised finite image batch.
        CaptureError: the call could not be captured (its model reads a value or copies from the CPU in its
            forward).
    """
    return GraphedCall(fn, model, example, **options)
