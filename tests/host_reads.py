"""A recorder of the ops that read a tensor's value on the host, for the tests that keep a GPU busy.

On a GPU each such read waits until every kernel queued so far has run; the device then idles while the host
prepares what comes next. On the CPU nothing waits, but the reads are the same ops: ``ValueReads`` records each one
with the vitviz frames that made it, so a CPU test can pin where a call reads values (its set-up, once per batch)
and where it must not (inside a forward or backward pass, between the passes of a loop).

Recorded: the ATen ops that read a value (``.item()``, ``bool(t)``, ``float(t)``, ``nonzero``, ``equal``,
``masked_select``, ``unique``) and the tensor methods that hand values to Python or NumPy without one (``tolist``,
``numpy``, ``cpu``: on the CPU ``cpu()`` is the tensor itself and dispatches nothing).
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch

python_dispatch = pytest.importorskip("torch.utils._python_dispatch")
aten = torch.ops.aten

READS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.allclose.default,
         aten.nonzero.default, aten.masked_select.default, aten._unique2.default}  # each waits on a GPU
METHODS = ("tolist", "numpy", "cpu")


def vitviz_frames(depth: int = 3) -> str:
    where = [f"{f.filename.rsplit('/vitviz/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()
             if "/vitviz/" in f.filename and "/tests/" not in f.filename]
    return " < ".join(reversed(where[-depth:]))


class ValueReads(python_dispatch.TorchDispatchMode):
    """``with ValueReads(monkeypatch) as reads:`` -> ``reads.log``: ``("read", what and where)`` per value read,
    in order, with whatever the test appends to it (its own events)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []
        self.active = False
        for name in METHODS:
            real = getattr(torch.Tensor, name)

            def method(t, *args, _real=real, _name=name, **kwargs):
                if self.active:
                    self.log.append(("read", f"Tensor.{_name} at {vitviz_frames()}"))
                return _real(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, method)

    def __enter__(self) -> ValueReads:
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in READS:
            self.log.append(("read", f"{func} at {vitviz_frames()}"))
        return func(*args, **(kwargs or {}))

    def reads(self) -> list[str]:
        return [what for kind, what in self.log if kind == "read"]
