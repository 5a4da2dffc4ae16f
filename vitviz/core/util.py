"""Small rules written once."""

from __future__ import annotations

import contextlib
import functools
import numbers
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from vitviz.core.contexts import submodules, tensor_version

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


def check_bool(value: object, argument: str, meaning: str) -> bool:
    """``value`` as a bool; ``InputTypeError`` unless it is one (Python's or NumPy's, or 0 / 1): a truthy string
    such as ``'False'`` or ``'no'`` would otherwise read as True. ``meaning`` says what the flag does, e.g. ``"keep
    the maps"``."""
    import numpy as np

    from vitviz.errors import InputTypeError

    try:
        ok = isinstance(value, (bool, numbers.Integral, np.bool_)) and value in (True, False)
    except (TypeError, ValueError, RuntimeError):  # an array or tensor: no single truth value
        ok = False
    if not ok:
        raise InputTypeError(f"{argument}={value!r} is not a bool; pass True or False ({meaning})")
    return bool(value)


def class_indices(y: Any, what: str) -> Any:
    """``y`` (an array or a sequence) as an int64 NumPy array of class indices; ``InputError`` naming ``what``
    where a value is not one: a bool, a fraction (cast to an int, 0.2 and 0.7 would merge into class 0) or a
    negative number (an index from the end)."""
    import numpy as np

    from vitviz.errors import InputError

    y = np.asarray(y)
    if y.dtype == bool or not np.issubdtype(y.dtype, np.number) or (
            np.issubdtype(y.dtype, np.floating) and not (np.isfinite(y).all() and (y == np.round(y)).all())):
        raise InputError(f"{what}: labels must be class indices (ints >= 0), got dtype {y.dtype}; a label cast to "
                         "an int would merge classes (0.2 and 0.7 both class 0)")
    y = y.astype(np.int64)
    if (y < 0).any():
        raise InputError(f"{what}: labels must be class indices (ints >= 0), got {int(y[y < 0][0])}; a negative "
                         "label would index the classes from the end")
    return y


def name_list(value: object, argument: str, known: Sequence[str] | Callable[[], Sequence[str]]) -> list[str]:
    """``value`` as a list of names: one name (a string) is a list of one, as ``["deletion"]``, never its
    characters; a list, tuple or other iterable is listed as it is (the caller checks each name against ``known``).

    Raises:
        InputTypeError: ``value`` is neither a string nor an iterable (``None``, a number); the message names
            ``argument``, the value and the names ``known`` (or those a callable ``known`` returns, called only
            then).
    """
    from collections.abc import Iterable, Mapping

    from vitviz.errors import InputTypeError

    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        names = tuple(known() if callable(known) else known)
        raise InputTypeError(f"{argument}={value!r} is a {type(value).__name__}, not a list of names; pass one of "
                             f"{names} or a list of them, e.g. {argument}={list(names[:1])!r}")
    return list(value)


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
    modules = submodules(model)
    modes = [m.training for m in modules]
    if any(was != training for was in modes):  # model.train() sets every flag through nn.Module.__setattr__
        model.train(training)
    try:
        yield model
    finally:
        for m, was in zip(modules, modes):
            if m.training != was:  # nn.Module.__setattr__ is slow: only the flags that changed
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
    versions = {k: tensor_version(b) for k, b in tensors.items()}
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
                if tensor_version(b) != versions[k] or not torch.equal(b, values[k]):
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
