"""Small rules written once."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def pair(v: int | float | Sequence[int], name: str = "size") -> tuple[int, int]:
    """``v`` as ``(h, w)``: an int (or integral float) for both, or a 2-sequence.

    Raises:
        InputError: ``v`` is neither, or a bool (``True`` is not a size).
    """
    from vitviz.errors import InputError

    if isinstance(v, bool):
        raise InputError(f"{name}={v!r} is a bool; pass an int or (h, w)")
    if isinstance(v, (int, float)):
        if float(v) != int(v):
            raise InputError(f"{name}={v!r} is not a whole number; pass an int or (h, w)")
        return int(v), int(v)
    try:
        h, w = v  # type: ignore[misc]
    except (TypeError, ValueError):
        raise InputError(f"{name}={v!r} is neither an int nor an (h, w) pair") from None
    return int(h), int(w)


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[Any]:
    """``model`` in eval mode for the block (``model.eval()``); on the way out, also when the block raises, every
    submodule gets its own ``training`` flag back, so a model whose parts were in different modes (a frozen
    backbone in eval, a head in training) is left exactly as it was."""
    modules = list(model.modules())
    modes = [m.training for m in modules]
    model.eval()
    try:
        yield model
    finally:
        for m, training in zip(modules, modes):
            m.training = training


def in_eval_mode(fn: F) -> F:
    """Decorator for an analysis ``fn(model, ...)``: the model runs in eval mode for the call (``eval_mode``).

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
        with eval_mode(model):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
