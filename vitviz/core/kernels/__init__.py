"""GPU kernels for attention reductions, and when to use them (``vitviz.core.kernels.headmaps``: the Triton code).

The stream probes (``capture_attention(heads="stream")`` on timm's ``Attention``, ``EvaAttention``,
``AttentionRope``, ``RelPosAttention``, BEiT ``Attention``, ``ParallelScalingBlock`` and differential attention (its
head mean and distance sums), on the Hugging Face families' SDPA attention and on
torchvision's and open_clip's ``nn.MultiheadAttention``; ``vitviz.core.families.stream``) hand each layer's maps to
the reductions as a ``HeadMaps``; on CUDA its ``fuse`` (head mean/max/min) and ``distance_sums`` run the Triton
kernels of ``headmaps``, which never form a ``(B, H, N, N)`` tensor. The PyTorch recomputation stays the CPU path
and the reference.

Whether the kernels run is decided per call by ``use_kernel(device)``, from the mode set by ``headmap_kernel(mode)``
(a context manager) or else the environment variable ``VITVIZ_HEADMAP_KERNEL``:

- ``auto`` (default): on CUDA tensors when Triton ``MIN_TRITON`` or newer is installed (``triton``, or the
  ``pytorch-triton`` build PyTorch's nightly wheels bring);
- ``on``: always; on CPU tensors this needs Triton's interpreter (``TRITON_INTERPRET=1``; for tests);
- ``off``: never (the PyTorch path everywhere).

``forward_lse`` takes the fusing kernel's row log-sum-exp from the forward's own fused attention call (the timm and
Hugging Face stream probes) instead of a first pass of its own: by default for float32 CUDA tensors outside autocast,
where it was measured (``VITVIZ_FORWARD_LSE=on|off|auto``).

Importing this package does not import Triton.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import torch

from vitviz.errors import InputError, NoSuchAttributeError

__all__ = ["MODES", "headmap_kernel", "kernel_mode", "sdpa_operands", "supports", "use_kernel"]

MODES = ("auto", "on", "off")
_ENV = "VITVIZ_HEADMAP_KERNEL"
_override: list[str] = []
_triton: dict[str, bool] = {}


def kernel_mode() -> str:
    """The mode now in force: the innermost ``headmap_kernel(mode)``, else ``$VITVIZ_HEADMAP_KERNEL``, else auto."""
    if _override:
        return _override[-1]
    mode = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    aliases = {"1": "on", "force": "on", "true": "on", "0": "off", "false": "off", "never": "off"}
    mode = aliases.get(mode, mode)
    if mode not in MODES:
        raise InputError(f"{_ENV}={os.environ.get(_ENV)!r} is not one of {MODES}; unset it or pick one")
    return mode


@contextlib.contextmanager
def headmap_kernel(mode: str) -> Iterator[None]:
    """Force (``"on"``), forbid (``"off"``) or let vitviz decide (``"auto"``) the head-map kernels in this block."""
    if mode not in MODES:
        raise InputError(f"mode must be one of {MODES}, got {mode!r}")
    _override.append(mode)
    try:
        yield
    finally:
        _override.pop()


MIN_TRITON = (3, 6)  # the oldest Triton the kernels are tested on (3.1's interpreter rejects their tl.arange calls)


# the distributions that install the ``triton`` module: Triton's own, and the builds PyTorch's nightly and ROCm
# wheels depend on instead (``pytorch-triton``, version "3.4.0+git..." and the like)
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")


def triton_version() -> tuple[int, ...] | None:
    """The installed Triton's version as ``(major, minor)``, read from its metadata without importing it (from the
    first of ``TRITON_DISTRIBUTIONS`` installed); or None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in TRITON_DISTRIBUTIONS:
        try:
            parts = version(name).split(".")[:2]
        except PackageNotFoundError:
            continue
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)
    return None


def triton_available() -> bool:
    """Whether a Triton the kernels support (``MIN_TRITON`` or newer) is installed (checked once, without importing
    it); with an older Triton the PyTorch stream path runs instead."""
    if "ok" not in _triton:
        found = importlib.util.find_spec("triton") is not None and triton_version() is not None
        _triton["ok"] = found and triton_version() >= MIN_TRITON  # type: ignore[operator]
    return _triton["ok"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def use_kernel(device: torch.device | str) -> bool:
    """Whether reductions over tensors on ``device`` run the head-map kernels now (see the module docstring).

    Raises:
        InputError: the mode is ``on`` but the kernels cannot run there (no Triton; CPU tensors without
            ``TRITON_INTERPRET=1``).
    """
    mode = kernel_mode()
    if mode == "off":
        return False
    dev = torch.device(device)
    runnable = triton_available() and (dev.type == "cuda" or (dev.type == "cpu" and _interpreting()))
    if mode == "on" and not runnable:
        raise InputError(
            f"the head-map kernels were forced on ({_ENV}=on or headmap_kernel('on')) but cannot run on {dev}: "
            + (f"Triton {'.'.join(map(str, MIN_TRITON))} or newer is not installed" if not triton_available() else
               "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before the first kernel runs")
        )
    return runnable if mode == "on" else (dev.type == "cuda" and triton_available())


def supports(q: torch.Tensor) -> bool:
    """Whether the kernels take this ``q`` (and a ``k`` like it): float16, bfloat16 or float32, head dim <= 256."""
    return q.dtype in (torch.float16, torch.bfloat16, torch.float32) and q.shape[-1] <= 256


def sdpa_operands(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The tensors as ``F.scaled_dot_product_attention`` computes with them, called now.

    Under autocast for their device, SDPA is on autocast's lower-precision list (``AT_FORALL_LOWER_PRECISION_FP`` in
    ATen's ``autocast_mode.h``, for CUDA; CPU autocast casts it too; torch 2.5.1 and 2.15 alike): autocast casts
    each floating-point tensor argument other than float64 (``q``, ``k``, ``v``, a float mask) to the autocast dtype
    before any backend runs. So the maps of the forward are those of these casts, not of the ``q`` and ``k`` the
    module handed to SDPA: under CUDA autocast a ``LayerNorm`` (qk-norm) gives float32 ``q`` and ``k``, and SDPA
    computes with their bfloat16 roundings. Outside autocast (for the tensors' device), and for None, bool or
    float64 tensors, the tensors as they are. (An eager ``q @ k^T`` under autocast is cast the same way: ``matmul``
    is on the same list.)
    """
    if not any(t is not None for t in tensors):
        return tensors
    device = next(t for t in tensors if t is not None).device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)


def __getattr__(name: str) -> Any:  # the kernels' entry points, imported (with Triton) on first use
    if name in ("fuse_heads_kernel", "distance_sums_kernel", "row_logsumexp"):
        from vitviz.core.kernels import headmaps

        return getattr(headmaps, name)
    raise NoSuchAttributeError(f"module 'vitviz.core.kernels' has no attribute {name!r}")
