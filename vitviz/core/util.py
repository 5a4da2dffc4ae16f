"""Small rules written once."""

from __future__ import annotations

import contextlib
import functools
import numbers
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _whole(v: object) -> int | None:
    """``v`` as an int when it is a whole number (an int, a NumPy integer, an integral float), else None."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        pass
    if isinstance(v, numbers.Real) and float(v).is_integer():
        return int(v)
    return None


def pair(v: int | float | Sequence[int], name: str = "size", *, positive: bool = False) -> tuple[int, int]:
    """``v`` as ``(h, w)``: an int (or integral float) for both, or a 2-sequence of them.

    Args:
        v: the value to read.
        name: the argument's name, for the message.
        positive: also refuse a zero or negative side.

    Raises:
        InputError: ``v`` is neither, a bool (``True`` is not a size), a string, a pair holding something other
            than whole numbers, or (with ``positive``) a pair with a side below 1.
    """
    from vitviz.errors import InputError

    if isinstance(v, bool):
        raise InputError(f"{name}={v!r} is a bool; pass an int or (h, w)")
    if isinstance(v, numbers.Real):
        if _whole(v) is None:
            raise InputError(f"{name}={v!r} is not a whole number; pass an int or (h, w)")
        h = w = _whole(v)
    else:
        try:
            a, b = v  # type: ignore[misc]
        except (TypeError, ValueError):
            a = b = None
        if a is None or isinstance(v, (str, bytes)):
            raise InputError(f"{name}={v!r} is neither an int nor an (h, w) pair")
        h, w = _whole(a), _whole(b)
        if h is None or w is None:
            raise InputError(f"{name}={v!r}: (h, w) must be whole numbers, e.g. (16, 16)")
    if positive and (h < 1 or w < 1):
        raise InputError(f"{name}={v!r} has a side below 1; pass positive sizes, an int or (h, w)")
    return h, w


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (``int`` or a NumPy integer) and not a bool: Python counts ``True`` as 1, but
    a bool is never a count, an index or a seed here."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a real number (int, float or a NumPy scalar of either) and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(value: object, argument: str, meaning: str) -> int:
    """``value`` as an int; ``InputError`` unless it is a positive integer (``int`` or a NumPy integer; not a bool
    or a float). ``meaning`` completes the message, e.g. ``"the panels per row (e.g. 6)"``."""
    from vitviz.errors import InputError

    if not is_int(value) or value < 1:
        raise InputError(f"{argument}={value!r} must be a positive int, {meaning}")
    return int(value)


def float_array(values: Any, argument: str) -> Any:
    """``values`` (a tensor, an array, numbers or nested sequences of them) as a float64 NumPy array.

    Raises:
        InputTypeError: a string, or anything that does not hold numbers only; the message names ``argument``.
    """
    import numpy as np

    from vitviz.errors import InputTypeError

    if hasattr(values, "detach"):  # a torch tensor (any dtype, any device)
        values = values.detach().cpu().double()
    bad = isinstance(values, (str, bytes))
    if not bad:
        try:
            arr = np.asarray(values)
            bad = arr.dtype.kind not in "biuf" and arr.dtype.kind != "O"
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            bad = True
    if bad:
        shown = repr(values) if len(repr(values)) <= 60 else f"a {type(values).__name__}"
        raise InputTypeError(f"{argument}={shown} does not hold numbers only; pass a tensor, an array or a list of "
                             "numbers")
    return arr


@contextlib.contextmanager
def module_mode(model: Any, training: bool) -> Iterator[Any]:
    """``model`` in training (``True``) or eval (``False``) mode for the block (``model.train(training)``); on the
    way out, also when the block raises, every submodule gets its own ``training`` flag back, so a model whose parts
    were in different modes (a frozen backbone in eval, a head in training) is left exactly as it was."""
    modules = list(model.modules())
    modes = [m.training for m in modules]
    model.train(training)
    try:
        yield model
    finally:
        for m, was in zip(modules, modes):
            m.training = was


def eval_mode(model: Any) -> contextlib.AbstractContextManager[Any]:
    """``module_mode(model, False)``: eval mode for the block, each submodule's own mode back afterwards."""
    return module_mode(model, False)


@contextlib.contextmanager
def kept_grads(model: Any) -> Iterator[Any]:
    """The parameters' ``.grad`` set aside for the block: every parameter enters it with ``.grad = None``, so a
    ``backward()`` inside accumulates nothing into the user's gradients and a ``zero_grad()`` inside (as
    pytorch-grad-cam calls) clears nothing of theirs; on the way out, also when the block raises, each parameter
    gets its own ``.grad`` back (the same tensor, or ``None``) and what the block left is dropped."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield model
    finally:
        for p, g in zip(params, grads):
            p.grad = g


@contextlib.contextmanager
def kept_buffers(model: Any) -> Iterator[Any]:
    """Every buffer of ``model`` (BatchNorm's running statistics and ``num_batches_tracked``, spectral norm's power
    iteration vectors, any other) left after the block as it was before, also when the block raises: the block
    runs on copies of the buffers (normal tensors, also of inference tensors; one copy per tensor, so a buffer
    shared by two modules stays shared) and each module gets its own tensors back afterwards, never written, so
    their version counters do not move (a graph of yours that saved a buffer can still run its backward pass). A
    buffer written through another reference the block held is given its values back in place."""
    import torch

    saved = [(m, name, b) for m in model.modules() for name, b in m.named_buffers(recurse=False)]
    tensors = {id(b): b for _, _, b in saved}
    values = {k: b.detach().clone() for k, b in tensors.items()}
    versions = {k: None if b.is_inference() else b._version for k, b in tensors.items()}
    with torch.inference_mode(False):
        work = {k: b.detach().clone().requires_grad_(b.requires_grad) for k, b in tensors.items()}
    try:
        for m, name, b in saved:
            m._buffers[name] = work[id(b)]
        yield model
    finally:
        for m, name, b in saved:
            m._buffers[name] = b
        with torch.no_grad():
            for k, b in tensors.items():
                if (None if b.is_inference() else b._version) != versions[k] or not torch.equal(b, values[k]):
                    with torch.inference_mode(b.is_inference()):  # an inference tensor is written there only
                        b.copy_(values[k])


@contextlib.contextmanager
def kept_rng(*devices: Any) -> Iterator[None]:
    """The global random generators left after the block as they were before, also when it raises: Python's ``random``,
    NumPy's global generator, torch's CPU generator and that of each CUDA device in ``devices`` (``torch.device``s;
    CPU ones need nothing more). For draws vitviz cannot give a generator of its own: dropout in a training-mode
    forward, a library that draws at import. vitviz's own random draws use their own ``torch.Generator`` or
    ``np.random.default_rng``."""
    import random

    import numpy as np
    import torch

    cuda = sorted({torch.cuda.current_device() if d.index is None else d.index
                   for d in map(torch.device, devices) if d.type == "cuda"})
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def _device_types(model: Any) -> list[str]:
    """The device types of ``model``'s parameters and buffers, and ``"cpu"``."""
    tensors = [*model.parameters(), *model.buffers()] if callable(getattr(model, "parameters", None)) else []
    return sorted({"cpu", *(t.device.type for t in tensors)})


@contextlib.contextmanager
def without_autocast(model: Any) -> Iterator[None]:
    """A caller's ``torch.autocast`` switched off for the block on every device type ``model`` lives on (and the
    CPU): an analysis computes in the model's own precision unless its own ``autocast=`` argument says otherwise
    (``vitviz.core.datasets.autocast_context``, entered inside the block), so a result does not depend on the
    context it was called in, and a checkpoint's fingerprint (which records the call's autocast dtype) describes
    how its numbers were computed."""
    import torch

    with contextlib.ExitStack() as stack:
        for kind in _device_types(model):
            stack.enter_context(torch.autocast(kind, enabled=False))
        yield


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
    emptied and refilled in place (torch reads those very dicts)."""
    saved = []
    for p in model.parameters():
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            hooks = getattr(p, attr, None)
            if hooks:
                saved.append((hooks, dict(hooks)))
                hooks.clear()
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
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
      instead (``parameter_hooks_off``).

    Raises:
        InferenceTensorError: a parameter or buffer of ``model`` is an inference tensor.
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

        return [(name, weakref.ref(t), None if t.is_inference() else t._version, t.data_ptr())
                for name, t in [*self.model.named_parameters(), *self.model.named_buffers()]]

    def changed(self) -> bool:
        """Whether a tensor was added, removed, replaced or written in place since the last call (or since the
        watch was made); each call looks anew."""
        now = [*self.model.named_parameters(), *self.model.named_buffers()]
        same = len(now) == len(self._seen) and all(
            name == seen_name and ref() is t and (None if t.is_inference() else t._version) == version
            and t.data_ptr() == ptr for (name, t), (seen_name, ref, version, ptr) in zip(now, self._seen))
        if not same:
            self._seen = self._look()
        return not same


def in_eval_mode(fn: F) -> F:
    """Decorator for an analysis ``fn(model, ...)``: the model runs in eval mode for the call (``eval_mode``), and
    a caller's ``torch.autocast`` does not reach it (``without_autocast``; the call's own ``autocast=`` does).

    Every analysis is defined on the model at inference. In training mode dropout makes each map a random draw (two
    calls on the same image differ) and BatchNorm updates its running statistics (the call would change the model);
    a model straight from ``timm.create_model`` or a training loop is in training mode. ``capture_attention`` is
    not decorated: a forward pass of the caller's own runs in the caller's mode.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        model = args[0] if args else kwargs.get("model")
        if not (callable(getattr(model, "modules", None)) and callable(getattr(model, "eval", None))):
            return fn(*args, **kwargs)  # not a module: fn refuses it with its own error
        with eval_mode(model), without_autocast(model):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def cli_errors(prog: str) -> Callable[[F], F]:
    """Decorator for a command line's ``main``: a vitviz error (a refused argument, model, checkpoint or resume)
    is printed as ``<prog>: error: <message>`` on stderr and the command exits with status 2, argparse's status
    for a usage error, instead of a traceback; the message already names the argument, the value and the fix.
    Any other exception keeps its traceback (a fault, not a refusal); so does a vitviz error with the environment
    variable ``VITVIZ_TRACEBACK=1``."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            import os
            import sys

            from vitviz.errors import VitvizError

            try:
                return fn(*args, **kwargs)
            except VitvizError as e:
                if os.environ.get("VITVIZ_TRACEBACK") == "1":
                    raise
                print(f"{prog}: error: {e}", file=sys.stderr)
                return 2

        return wrapper  # type: ignore[return-value]

    return decorate
