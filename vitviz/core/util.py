"""Small rules written once."""

from __future__ import annotations

from collections.abc import Sequence


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
