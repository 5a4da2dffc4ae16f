"""The caller's contexts and the model's state as a vitviz call meets them, each rule written once.

A call runs inside whatever the caller set up: ``torch.no_grad()``, ``torch.inference_mode()``, ``torch.autocast``,
a model built or loaded in inference mode, hooks on parameters, activation checkpointing. Here is what vitviz does
with each (see ``docs/trust.md``, "Your contexts"): ``without_autocast`` keeps a caller's autocast out of an
analysis; ``autograd`` is the block of a gradient analysis (inference mode off, autograd on, a model of inference
tensors refused, parameters ``frozen`` or their hooks off with ``parameter_hooks_off``), with ``grad_leaf`` and
``normal_tensor`` for the tensors that enter its graph and ``model_copy`` for a copy vitviz may change;
``checkpointing_off`` keeps a model's activation checkpointing out of a capture and a FLOP count;
``WeightsWatch`` tells a cache whether the model's tensors changed since it was filled; ``recording`` tells an
analysis that it runs for a CUDA graph's recording (``core.graphs``), where it may read no value on the host; and
``input_checked`` tells it that a caller already checked its input batch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

__all__ = ["Recording", "WeightsWatch", "autograd", "checked_before", "checkpointing_off", "frozen", "grad_leaf",
           "inference_tensor", "input_checked", "inspect_memo", "inspect_once", "is_quantized", "model_copy",
           "module_attribute", "named_submodules", "normal_tensor", "once_per_window", "open_walk_window",
           "parameter_hooks_off", "recording", "recording_into", "submodules", "tensor_version", "to_host", "walk_once",
           "without_autocast"]


# inspect_once(): model id -> (model, structure, spec, walk_once window of the read), for the block's duration
_ONCE: contextvars.ContextVar[dict[int, tuple[Any, tuple, Any, Any]] | None] = contextvars.ContextVar(
    "vitviz_inspect_once", default=None)


@contextlib.contextmanager
def inspect_once() -> Iterator[None]:
    """Inside the block, ``vitviz.inspect(model)`` reads a model once: a later call on the same model with the same
    structure (the same submodules, parameters and buffers, each of the same shape) returns the spec read first.

    Every analysis runs in such a block (``core.calls.in_eval_mode``): its own ``inspect``, the image loader's
    (``load_images``) and ``capture_attention``'s read the same model in one call, and one read of a ViT-B cost
    some 5 to 7 ms of Python on a 2-core CPU (a dozen walks over its 276 modules), about what its whole bf16
    forward takes on an H100 at batch 8 (5.3 ms, docs/benchmarks.md). A model changed within the block (a module
    or parameter replaced, a table resized) is read again: each later read compares the model's structure with the
    first's, except while the ``walk_once`` window the first read was made in is still open (the call's set-up,
    before any forward pass, which replaces nothing: the walks themselves are shared there). Blocks nest: an inner
    one shares the outer's reads. Outside any block, every call reads the model afresh (a plain attribute such as
    timm's ``global_pool`` may change between a user's calls)."""
    if _ONCE.get() is not None:
        yield
        return
    token = _ONCE.set({})
    try:
        yield
    finally:
        _ONCE.reset(token)


def inspect_memo() -> dict[int, tuple[Any, tuple, Any, Any]] | None:
    """The reads of the innermost ``inspect_once`` block (``vitviz.core.spec.inspect`` fills it), or None outside."""
    return _ONCE.get()


class _Walks:
    """The walks of one ``walk_once`` window, ``id(model) -> (model, named modules, modules)``, and the results of the
    ``once_per_window`` functions, ``(function, ids of the arguments) -> (arguments, result)``, while ``open``."""

    __slots__ = ("open", "models", "results")

    def __init__(self) -> None:
        self.open = True
        self.models: dict[int, tuple[Any, list[tuple[str, Any]], list[Any]]] = {}
        self.results: dict[tuple, tuple[tuple, Any]] = {}

    def close(self) -> None:
        self.open = False
        self.models.clear()
        self.results.clear()


_WALKS: contextvars.ContextVar[_Walks | None] = contextvars.ContextVar("vitviz_walk_once", default=None)


@contextlib.contextmanager
def walk_once() -> Iterator[None]:
    """The set-up of one analysis call, until its first forward pass: inside, ``submodules`` and
    ``named_submodules`` walk a model once between them.

    A call's set-up walks its model's modules some ten times before the forward pass: eval mode, the devices
    (autocast), the structure for each of three ``inspect`` reads, the family (twice), the relative-bias test, the
    parameter count, the checkpointing flags. Nothing in that set-up adds, removes or replaces a module (vitviz
    sets flags, attributes and methods on instances), and no forward runs in it. The window closes at the first
    forward of any module, anywhere (a global forward pre-hook that closes it and is removed as it fires, before
    the module's own hooks run), and at the end of the block; after that every walk is made afresh, so a model
    changed by a forward pass (a lazily built module) is seen. Blocks nest: an inner one shares the outer's window
    (closed or not). ``core.calls.in_eval_mode`` opens one for every analysis call."""
    if _WALKS.get() is not None:
        yield
        return
    from torch.nn.modules.module import register_module_forward_pre_hook

    walks = _Walks()
    handle = None

    def close(*_: Any) -> None:
        walks.close()
        handle.remove()

    handle = register_module_forward_pre_hook(close)
    token = _WALKS.set(walks)
    try:
        yield
    finally:
        _WALKS.reset(token)
        close()


def open_walk_window() -> Any:
    """The open ``walk_once`` window of this context (an opaque object, the same one until it closes), or None outside
    one or once it closed: ``inspect`` trusts a read made in the same open window without comparing structures."""
    walks = _WALKS.get()
    return walks if walks is not None and walks.open else None


def _walked(model: Any) -> tuple[list[tuple[str, Any]], list[Any]] | None:
    """``(named modules, modules)`` of ``model`` in the open ``walk_once`` window (one named walk, on first use), or
    None outside one (or once it closed)."""
    walks = _WALKS.get()
    if walks is None or not walks.open:
        return None
    hit = walks.models.get(id(model))
    if hit is None or hit[0] is not model:
        named = _named_walk(model)
        hit = walks.models[id(model)] = (model, named, [m for _, m in named])
    return hit[1], hit[2]


def once_per_window(fn: Any) -> Any:
    """``fn(*args)``, a function of the module tree of its arguments (modules, a family) and nothing else, computed
    once per ``walk_once`` window for the same arguments (the same objects), like the walks themselves: the window
    is a call's set-up, which replaces no module. Outside a window (or once it closed) every call computes. A list
    result is handed out as a new list each time, so that a caller may change its own.

    For what a call's set-up asks several times: a family's ``attention_modules`` (six times in one ``inspect`` and
    capture of a timm ViT), a probe's reading of an attention class (twice per layer)."""

    @functools.wraps(fn)
    def cached(*args: Any) -> Any:
        walks = _WALKS.get()
        if walks is None or not walks.open:
            return fn(*args)
        key = (fn, *map(id, args))
        hit = walks.results.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], args, strict=True)):
            hit = walks.results[key] = (args, fn(*args))
        return list(hit[1]) if isinstance(hit[1], list) else hit[1]

    return cached


def submodules(model: Any) -> list[Any]:
    """``list(model.modules())``: the same modules in the same order (pre-order, each once), walked with a stack
    instead of ``named_modules``' generator per module (a quarter of the time: 0.09 against 0.34 ms for a ViT-B's
    276 modules on a 2-core CPU; vitviz walks a model several times per analysis call). Inside a ``walk_once``
    window the walk is made once (a new list is returned each time)."""
    walked = _walked(model)
    return _walk(model) if walked is None else list(walked[1])


def named_submodules(model: Any) -> list[tuple[str, Any]]:
    """``list(model.named_modules())``: the same names and modules in the same order (pre-order, each module once,
    under the name it is first reached by), walked with a stack as ``submodules`` is; once per ``walk_once``
    window, with ``submodules``."""
    walked = _walked(model)
    return _named_walk(model) if walked is None else list(walked[0])


def _walk(model: Any) -> list[Any]:  # without the names: a third faster than _named_walk, for walks outside a window
    out: list[Any] = []
    seen: set[int] = set()
    stack = [model]
    pop, push, keep, mark = stack.pop, stack.extend, out.append, seen.add  # bound once: this loop runs per module
    while stack:
        module = pop()
        if module is None or id(module) in seen:  # a child slot set to None (nn.Module allows it)
            continue
        mark(id(module))
        keep(module)
        children = module._modules
        if children:
            push(reversed(children.values()))
    return out


def _named_walk(model: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", model)]
    pop, keep, mark = stack.pop, out.append, seen.add
    while stack:
        name, module = pop()
        if module is None or id(module) in seen:
            continue
        mark(id(module))
        keep((name, module))
        children = module._modules
        if children:
            dot = f"{name}." if name else ""
            stack.extend([(dot + child, m) for child, m in reversed(children.items())])
    return out


def module_attribute(module: Any, name: str) -> Any:
    """``getattr(module, name, None)`` for an ``nn.Module``, without ``nn.Module.__getattr__``'s exception for a
    missing name (walks that look for a flag or a table on every submodule ask some thousand times per ViT-B, each
    miss building an ``AttributeError`` message): the instance's dicts first, then its class (a property)."""
    d = module.__dict__
    if name in d:
        return d[name]
    for key in ("_parameters", "_buffers", "_modules"):
        table = d.get(key)
        if table and name in table:
            return table[name]
    return getattr(module, name, None) if hasattr(type(module), name) else None  # a class attribute, a property


def _device_types(model: Any) -> list[str]:
    """The device types of ``model``'s parameters and buffers, and ``"cpu"``."""
    if not callable(getattr(model, "modules", None)):
        return ["cpu"]
    kinds = {"cpu"}
    seen: set[int] = set()  # a tensor's device is read once: ``t.device`` builds a device object each time
    for m in submodules(model):
        for table in (m._parameters, m._buffers):
            if table:
                for t in table.values():
                    if t is not None and id(t) not in seen:
                        seen.add(id(t))
                        kinds.add(t.device.type)
    return sorted(kinds)


_AUTOCAST_LEFT_OUT = ("mps",)  # what torch._C._is_any_autocast_enabled does not ask (seen in torch 2.14, 2.15)


def _autocast_on() -> bool:
    """Whether a ``torch.autocast`` is on for any device type: ``torch._C._is_any_autocast_enabled`` (CPU, CUDA, XPU,
    IPU, HPU, XLA, the private-use backend), and the types it leaves out asked one by one (MPS)."""
    import torch

    if torch._C._is_any_autocast_enabled():
        return True
    for kind in _AUTOCAST_LEFT_OUT:
        try:
            if torch.is_autocast_enabled(kind):
                return True
        except RuntimeError:  # a torch without autocast for this device type
            continue
    return False


@contextlib.contextmanager
def without_autocast(model: Any) -> Iterator[None]:
    """A caller's ``torch.autocast`` switched off for the block on every device type ``model`` lives on (and the
    CPU): an analysis computes in the model's own precision unless its own ``autocast=`` argument says otherwise
    (``vitviz.core.datasets.autocast_context``, entered inside the block), so a result does not depend on the
    context it was called in, and a checkpoint's fingerprint (which records the call's autocast dtype) describes
    how its numbers were computed.

    Where no autocast is on for any device type (``_autocast_on``; the common case), there is nothing to switch off
    and the model's devices are not read: a walk over its tensors less in every call's set-up, before the forward,
    while the device waits."""
    import torch

    if not _autocast_on():
        yield
        return
    with contextlib.ExitStack() as stack:
        for kind in _device_types(model):
            stack.enter_context(torch.autocast(kind, enabled=False))
        yield


def _flag_is_true(module: Any, name: str) -> bool:
    """``module_attribute(module, name) is True`` for a flag: a parameter, buffer or submodule is never ``True``, so
    only the instance's dict and the class are read (half the time of ``module_attribute``, asked twice per module
    per analysis call)."""
    d = module.__dict__
    if name in d:
        return d[name] is True
    cls = type(module)
    return hasattr(cls, name) and getattr(module, name, None) is True


# module -> attribute -> [open blocks that switched it off, its value before the first]
_CHECKPOINTING: weakref.WeakKeyDictionary[Any, dict[str, list]] = weakref.WeakKeyDictionary()
_CHECKPOINTING_LOCK = threading.RLock()
CHECKPOINTING_FLAGS = ("grad_checkpointing", "gradient_checkpointing")  # timm, open_clip; Hugging Face


@contextlib.contextmanager
def checkpointing_off(model: Any) -> Iterator[None]:
    """Activation checkpointing off in ``model`` for the block: every submodule's ``grad_checkpointing`` (timm's
    and open_clip's ``set_grad_checkpointing``) or ``gradient_checkpointing`` (Hugging Face's
    ``gradient_checkpointing_enable``) flag that is ``True`` is ``False`` in the block and ``True`` again after.

    A checkpointed block runs its forward a second time in the backward pass: a capture would be handed its maps
    twice, a block recomputed after a capture's probes are gone would no longer match its forward
    (``torch.utils.checkpoint`` refuses), and ``count_flops(backward=True)`` would count the recomputation, a
    memory-for-compute trade of the training set-up rather than the model's compute. Checkpointing changes memory,
    never values. Blocks may nest and overlap on one model and end in any order (two captures open at once): the
    flags come back when the last block that switched them off ends, also when it raises."""
    taken: list[tuple[Any, str]] = []
    with _CHECKPOINTING_LOCK:
        # a WeakKeyDictionary lookup builds a weak reference: only while some block holds flags. Asked once, not per
        # module (its len() is a Python call): the entries this walk adds are for modules it has passed
        held_any = bool(_CHECKPOINTING)
        empty: dict[str, list] = {}
        for module in submodules(model):
            held = _CHECKPOINTING.get(module, empty) if held_any else empty
            for attr in CHECKPOINTING_FLAGS:
                entry = held.get(attr)
                if entry is not None:
                    entry[0] += 1
                elif _flag_is_true(module, attr):
                    _CHECKPOINTING.setdefault(module, {})[attr] = [1, True]
                    setattr(module, attr, False)
                else:
                    continue
                taken.append((module, attr))
    try:
        yield
    finally:
        with _CHECKPOINTING_LOCK:
            while taken:
                module, attr = taken.pop()
                flags = _CHECKPOINTING[module]
                flags[attr][0] -= 1
                if flags[attr][0] == 0:
                    setattr(module, attr, flags.pop(attr)[1])
                    if not flags:
                        del _CHECKPOINTING[module]


def tensor_version(t: Any) -> int | None:
    """``t``'s version counter (every in-place write bumps it), or ``None`` for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


_QUANTIZED = ("torch.ao.nn.quantized.", "torch.ao.nn.intrinsic.quantized.")


def quantized_layers(model: Any) -> list[tuple[str, Any]]:
    """The layers of ``model`` that compute with quantized weights, as ``(name, module)``, in module order:

    - torch's quantized modules: what ``torch.ao.quantization.quantize_dynamic`` puts in (qint8 or float16
      ``Linear``) and what ``convert`` leaves in a statically quantized model. Their kernels have no backward pass,
      keep their weights packed in the kernel's state (``weight()`` is a method, not a parameter) and have no
      formula in ``torch.utils.flop_counter``. Not among them: the packed-parameter holders those layers own,
      ``FloatFunctional`` (float arithmetic of a model prepared but not converted) and the reference quantized
      modules (``torch.ao.nn.quantized.reference``: float parameters fake-quantised in a differentiable forward);
    - layers whose own parameter is one of torchao's quantized tensors (``quantize_``: ``TorchAOBaseTensor``
      subclasses such as ``Int8Tensor`` or ``AffineQuantizedTensor``), whose gradient and FLOP count depend on the
      configuration (an int8 activation has no gradient, and its integer matmul is not counted).

    Read from the class hierarchy, so that neither torch.ao nor torchao is imported for a model without them."""
    found = [m for m in submodules(model) if is_quantized(m)]
    if not found:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    return [(names[id(m)], m) for m in found]


def is_quantized(module: Any) -> bool:
    """Whether ``quantized_layers`` lists ``module``: a torch quantized module or one with a torchao parameter."""
    if _quantized_class(type(module)):
        return True
    params = module._parameters
    if params:
        for p in params.values():  # a loop, not any(generator): asked of every module once per call
            if _torchao_class(type(p)):
                return True
    return False


@functools.cache
def _quantized_class(cls: type) -> bool:
    path = f"{cls.__module__}."
    return (path.startswith(_QUANTIZED) and not path.startswith("torch.ao.nn.quantized.reference.")
            and not cls.__name__.endswith("PackedParams") and cls.__name__ != "FloatFunctional")


@functools.cache
def _torchao_class(cls: type) -> bool:
    return any(c.__name__ == "TorchAOBaseTensor" and c.__module__.startswith("torchao") for c in cls.__mro__)


def _quantized_kind(module: Any) -> str:
    """What makes ``module`` quantized, for a message: its class path, or its torchao weight's class."""
    cls = type(module)
    tensor = next((p for p in module._parameters.values() if _torchao_class(type(p))), None)
    if tensor is not None:
        return f"a {cls.__name__} with torchao's {type(tensor).__name__} weights"
    return f"{cls.__module__}.{cls.__qualname__}"


NO_BACKWARD = ("torch's quantized kernels have no backward pass, and through quantized weights the gradient is the "
               "model's only for some configurations, so vitviz runs no gradient analysis on them; the gradient-free "
               "analyses (attention, rollout, flow, mean attention distance) read the quantized model as it computes; "
               "for this one, use the float model it was quantized from (quantize_dynamic returns a quantized copy; "
               "quantize_ works in place, so quantize a copy)")


def refuse_quantized(model: Any, what: str, because: str = NO_BACKWARD) -> None:
    """Raise ``UnsupportedModelError`` when ``model`` has a quantized layer (``quantized_layers``), naming ``what``
    (the analysis), the model, its first quantized layer and how many there are, then ``because`` (why and the fix;
    default: the gradient analyses' reason, ``NO_BACKWARD``). Torch's quantized kernels have no backward pass, and
    through torchao's quantized tensors the gradient is the model's only for some configurations (none through an
    int8 activation). Before this refusal the gradient methods failed inside autograd or a rule ("'function' object
    has no attribute 'dtype'", "appears to not have been used in the graph"), or Chefer's named the wrong reason."""
    from vitviz.errors import UnsupportedModelError

    layers = quantized_layers(model)
    if layers:
        name, module = layers[0]
        raise UnsupportedModelError(f"{what}: {type(model).__name__}'s layer {name!r} is quantized "
                                    f"({_quantized_kind(module)}; {len(layers)} such layers): {because}")


def inference_tensor(model: Any) -> str | None:
    """The name of the first parameter or buffer of ``model`` that is an inference tensor (made or loaded inside
    ``torch.inference_mode()``), or None."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_inference():
            return name
    return None


@contextlib.contextmanager
def parameter_hooks_off(model: Any) -> Iterator[None]:
    """The hooks on ``model``'s parameters (``p.register_hook``, ``p.register_post_accumulate_grad_hook``) do not
    run in the block, and are all back afterwards (the same hooks, in their order; their handles still remove them),
    also when the block raises: a backward pass of vitviz's own is no step of your training, whose gradient hooks
    (clipping, logging, a gradient all-reduce) must not see it. The hook dicts torch keeps on each parameter are
    emptied and refilled in place (torch reads those very dicts). A hook registered on a parameter inside the block
    is gone afterwards (torch 2.5's ``FlopCounterMode`` leaves its module tracker's hooks on a parametrisation's
    ``original`` tensors)."""
    saved = []
    for p in model.parameters():
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            hooks = getattr(p, attr, None)
            saved.append((p, attr, hooks, dict(hooks) if hooks else {}))
            if hooks:
                hooks.clear()
    try:
        yield
    finally:
        for p, attr, hooks, items in saved:
            for now in {id(d): d for d in (hooks, getattr(p, attr, None)) if d is not None}.values():
                now.clear()
            if hooks is not None:
                hooks.update(items)


@contextlib.contextmanager
def frozen(model: Any) -> Iterator[None]:
    """Every parameter of ``model`` with ``requires_grad=False`` for the block, each flag back afterwards (also when
    the block raises)."""
    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


@contextlib.contextmanager
def autograd(model: Any, what: str, *, weights: bool = False) -> Iterator[None]:
    """Autograd on for the block of a gradient analysis ``what`` (a name for the message) of ``model`` (``None``: a
    function of the user's, whose model is not checked), also under a caller's ``torch.no_grad()`` or
    ``torch.inference_mode()``: the block runs with ``torch.inference_mode(False)`` and ``torch.enable_grad()``,
    the caller's modes back afterwards.

    The rules:

    - a gradient analysis runs inside a caller's inference mode when the model's parameters and buffers are normal
      tensors; an input made in inference mode is cloned where it enters the graph (``grad_leaf``,
      ``normal_tensor``);
    - a model whose parameters or buffers are inference tensors cannot be differentiated through (autograd cannot
      save them for the backward pass) and is refused; cloning every weight silently would double the model's
      memory. Analyses without a backward pass (attention, rollout, flow, distances, features) run on such a
      model as on any other;
    - the gradients are those of the input and of activations only: every parameter is frozen for the block
      (``frozen``), so no parameter's gradient is computed and no hook of yours on a parameter runs (a library's
      ``loss.backward()``, as pytorch-grad-cam's, included). With ``weights=True`` (``count_flops``' training
      step, which counts the parameters' gradients) the parameters keep their flags and their hooks are off
      instead (``parameter_hooks_off``);
    - a model with quantized layers (``quantized_layers``: ``quantize_dynamic``, a converted statically quantized
      model, torchao's ``quantize_``) is refused; the gradient-free analyses read it as it computes.

    Raises:
        InferenceTensorError: a parameter or buffer of ``model`` is an inference tensor.
        UnsupportedModelError: ``model`` has a quantized layer.
    """
    import torch

    from vitviz.errors import InferenceTensorError

    name = None if model is None else inference_tensor(model)
    if name is not None:
        raise InferenceTensorError(
            f"{what}: a backward pass through the model is needed, but its tensor {name!r} is an inference tensor (the "
            "model was built or loaded inside torch.inference_mode()); load the model outside inference mode "
            "(torch.no_grad() is fine), or clone its tensors outside it: "
            "model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)")
    if model is not None:
        refuse_quantized(model, what)
    keep = contextlib.nullcontext() if model is None else (parameter_hooks_off if weights else frozen)(model)
    with torch.inference_mode(False), torch.enable_grad(), keep:
        yield


def model_copy(model: Any) -> Any:
    """``copy.deepcopy(model)`` made outside inference mode: its tensors are normal tensors (also those of a model
    built or loaded inside ``torch.inference_mode()``, and also when the caller is in inference mode), so gradient
    analyses run on the copy and its weights can be re-initialised in place."""
    import copy

    import torch

    with torch.inference_mode(False):
        return copy.deepcopy(model)


def normal_tensor(x: Any) -> Any:
    """``x``, or a clone of it where it is an inference tensor (made inside ``torch.inference_mode()``), which
    autograd could not save for a backward pass; anything but a tensor as it is. Call it inside ``autograd``."""
    return x.clone() if callable(getattr(x, "is_inference", None)) and x.is_inference() else x


def grad_leaf(x: Any) -> Any:
    """``x`` as a new leaf that requires grad (sharing its storage, or a clone of an inference tensor), for a
    gradient with respect to the input. Call it inside ``autograd``."""
    return normal_tensor(x).detach().requires_grad_(True)


class WeightsWatch:
    """Whether a model's tensors changed since the last look, cheaply, for a cache of results computed from them.

    A look reads, per parameter and buffer: its name, the tensor object (held by a weak reference, so a replaced
    tensor is seen also where Python reuses the address), its storage address (``p.data = ...``) and its version
    counter, which every in-place write bumps: an optimizer step, ``load_state_dict`` (it copies in place), a
    ``with torch.no_grad(): p.add_(1)``. Not seen: a write through ``p.data`` (``p.data.add_(1)``), which bypasses
    the version counter as it bypasses autograd (write under ``torch.no_grad()`` instead), and an in-place write to
    an inference tensor (possible only inside ``torch.inference_mode()``), which has no version counter; replacing
    either tensor is seen.

    Args:
        model: the ``nn.Module`` watched.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._seen = self._look()

    def _look(self) -> list[tuple[str, Any, int | None, int]]:
        import weakref

        return [(name, weakref.ref(t), tensor_version(t), t.data_ptr())
                for name, t in [*self.model.named_parameters(), *self.model.named_buffers()]]

    def changed(self) -> bool:
        """Whether a tensor was added, removed, replaced or written in place since the last call (or since the
        watch was made); each call looks anew."""
        now = [*self.model.named_parameters(), *self.model.named_buffers()]
        same = len(now) == len(self._seen) and all(
            name == seen_name and ref() is t and tensor_version(t) == version
            and t.data_ptr() == ptr for (name, t), (seen_name, ref, version, ptr) in zip(now, self._seen))
        if not same:
            self._seen = self._look()
        return not same


class Recording:
    """What a ``GraphedCall``'s recorded run marks (``core.graphs``): its outputs delivered on the CPU (``to_host``)."""

    __slots__ = ("host",)

    def __init__(self) -> None:
        self.host: list[Any] = []


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("vitviz_recording", default=None)


def recording() -> bool:
    """Whether the code runs for a ``GraphedCall``'s recording (its warm-up runs or the capture, ``recording_into``):
    no host read of a device value may be queued, as a captured stream cannot wait for one. ``core.images``'s
    finiteness check is then left to the ``GraphedCall`` (made before the copy in), ``to_host`` marks instead of
    copying, and ``core.datasets.autocast_context`` keeps no cast-weight cache."""
    return _RECORDING.get() is not None


@contextlib.contextmanager
def recording_into(rec: Recording) -> Iterator[None]:
    """The block runs as a ``GraphedCall``'s recording (``recording``), marking into ``rec``."""
    token = _RECORDING.set(rec)
    try:
        yield
    finally:
        _RECORDING.reset(token)


# input_checked(): the batches a caller checked for finiteness, each with its version counter then
_CHECKED: contextvars.ContextVar[tuple[tuple[Any, int], ...]] = contextvars.ContextVar("vitviz_checked", default=())


@contextlib.contextmanager
def input_checked(x: Any) -> Iterator[None]:
    """In the block, ``core.images.check_tensor`` takes the tensor ``x`` as checked for finiteness while it is
    unwritten (the same object, its version counter unchanged; an inference tensor, which has none, is read
    again): a caller that checked a batch once (``vitviz.faithfulness``) calls analyses on it without each reading
    it again, a read that on a GPU waits for every kernel queued before it (the caller's last passes) and leaves
    the device idle while the analysis sets itself up. Its shape and dtype are checked as ever."""
    version = tensor_version(x)
    token = _CHECKED.set(_CHECKED.get() + ((x, version),)) if version is not None else None
    try:
        yield
    finally:
        if token is not None:
            _CHECKED.reset(token)


def checked_before(x: Any) -> bool:
    """Whether ``x`` is a batch an enclosing ``input_checked`` holds, unwritten since."""
    return any(t is x and v == tensor_version(x) for t, v in _CHECKED.get())


def to_host(t: Any) -> Any:
    """``t.cpu()``; while ``recording()``, ``t`` itself, marked to be copied to the CPU after each replay."""
    rec = _RECORDING.get()
    if rec is None:
        return t.cpu()
    rec.host.append(t)
    return t
