"""The context every analysis call runs in (``in_eval_mode``): eval mode, no caller's autocast, the model read and
walked once, and its family's set-up (``core.families.prepared``).

A module of its own, above ``core.families``: ``core.util`` sits below the families (they use it), and the call's
context needs both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from vitviz.core.contexts import inspect_once, walk_once, without_autocast
from vitviz.core.families import prepared
from vitviz.core.util import eval_mode

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["in_eval_mode"]


def in_eval_mode(fn: F) -> F:
    """Decorator for an analysis ``fn(model, ...)``: the model runs in eval mode for the call (``eval_mode``), and
    a caller's ``torch.autocast`` does not reach it (``without_autocast``; the call's own ``autocast=`` does).

    Every analysis is defined on the model at inference. In training mode dropout makes each map a random draw (two
    calls on the same image differ) and BatchNorm updates its running statistics (the call would change the model);
    a model straight from ``timm.create_model`` or a training loop is in training mode. ``capture_attention`` is
    not decorated: a forward pass of the caller's own runs in the caller's mode. The model is read once for the
    call (``core.contexts.inspect_once``), and walked once in the set-up before its first forward pass
    (``core.contexts.walk_once``). Its family sets it up for the call (``core.families.prepared``: ViTMAE unmasked,
    an image-text model's image call refused), so every forward pass of the call sees the model a capture sees.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        model = args[0] if args else kwargs.get("model")
        if not (callable(getattr(model, "modules", None)) and callable(getattr(model, "eval", None))):
            return fn(*args, **kwargs)  # not a module: fn refuses it with its own error
        with walk_once(), eval_mode(model), without_autocast(model), inspect_once(), prepared(model):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
