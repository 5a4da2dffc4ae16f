"""The row log-sum-exp from the model's own fused attention call, for the head-map kernels.

``fuse_heads_kernel`` needs each row's log-sum-exp ``(B, H, N)``; without it, it makes a first pass over the keys of
its own (``row_logsumexp``), as long as the fusing pass itself. The fused kernel a timm attention module calls
computes that log-sum-exp anyway (flash attention keeps it for the backward), but
``F.scaled_dot_product_attention`` does not return it. ``sdpa_with_lse`` runs the backend SDPA itself would pick
(``torch._fused_sdp_choice``, with the same arguments) through the ATen op that also returns it:

- CUDA flash attention: ``aten._scaled_dot_product_flash_attention`` (as SDPA calls it for head dims that are a
  multiple of 8; others SDPA pads first: not taken);
- CUDA memory-efficient attention: ``aten._scaled_dot_product_efficient_attention`` with ``compute_log_sumexp``
  (its log-sum-exp is kept for a number of rows rounded up to a multiple of 32: cut to ``N``);
- CUDA cuDNN attention (what SDPA picks for half types on recent torch and GPUs):
  ``aten._scaled_dot_product_cudnn_attention`` with ``compute_log_sumexp`` (a ``(B, H, N, 1)`` log-sum-exp on
  recent torch: its last dim is dropped). SDPA calls the same op without the log-sum-exp in inference, and cuDNN
  builds another graph for a call that keeps it, so that its output is SDPA's bit for bit is not known beforehand:
  the first call of each configuration (device, dtypes, shapes, strides, causality, scale) also runs SDPA and
  compares the two outputs (one GPU sync); a configuration whose outputs differ in any bit is left to SDPA from then
  on (``None``), one that matched takes the op's answer without the comparison (``_same_as_sdpa``);
- CPU flash attention: ``aten._scaled_dot_product_flash_attention_for_cpu`` (bit for bit SDPA's output, tested;
  the kernels run on CPU tensors only under Triton's interpreter, in the tests);
- anything else (a mask, dropout, gradients being recorded, grouped-query attention, another backend such as
  math): None, and the caller keeps SDPA and the kernels' own first pass.

Under autocast SDPA computes in the autocast dtype, but the ATen ops are not on autocast's lists: ``q``, ``k`` and
``v`` are cast first as autocast casts them for SDPA (``kernels.sdpa_operands``), so the output is SDPA's, bit for
bit, and the log-sum-exp that of the casts, which the kernels read too (``stream.recomputed_heads``).

``ForwardLSE`` is the ``TorchFunctionMode`` the stream probes hold open around one attention call (timm:
``timm_probes.probe_timm_stream``, the ``mask``, ``rotary`` and ``parallel`` kinds, around the module's forward;
Hugging Face: ``hf_probes``, around the ``"sdpa"`` implementation it runs, where no mask is passed): it answers
that call's one ``F.scaled_dot_product_attention`` through ``sdpa_with_lse`` and keeps the log-sum-exp. Not
torchvision's or open_clip's ``nn.MultiheadAttention``: in inference its fast path is one
``torch._native_multi_head_attention`` call, whose attention runs inside ATen where no Python mode sees it (and
its other path reaches SDPA inside ``F.multi_head_attention_forward``, which the mode sees only as a whole).

``checked`` compares it, on the first, middle and last query row of every head, with the log-sum-exp recomputed in
float32 from the ``q`` and ``k`` the kernels will read (a layout or unit error moves it by far more than the 2e-3
allowed); a failed check warns once and the kernels make their own pass. A module that passed is trusted for later
calls with the same configuration (backend, dtypes, shapes, scale, causality): one check, and one GPU sync, per
module and configuration in a process, not one per call.

By default (``auto``) it is taken where it was measured to pay. For float32 CUDA tensors outside autocast, where
SDPA runs its memory-efficient kernel: that branch passed the GPU checks on an H100 and an H200 (torch 2.11: the
forward's output bit for bit SDPA's, the maps those of the kernels' own pass) and saved time in every float32 case
measured on the H100 by the fastest repeat (ViT-B/16 and ViT-L/16 at 224 and 448 px, Hugging Face's ViT-B/16 at 448
px; in five of the six by the median), and on the H200 in all five (ViT-B/16 448 px rollout 1.29x the plain
forward against 1.39x). For half types (a bfloat16 or float16 tensor, or CUDA autocast) only for calls of at least
``HALF_MIN_SCORES`` attention scores (``B * H * N * N``, 2**27): the flash and cuDNN branches passed the same GPU
checks on the H200, where taking the log-sum-exp saves the device a pass but costs the host the mode's work, and a
bf16 call at batch 8 is bound by the host. There, at 448 px, batch 8, it lost (ViT-B/16, 6e7 scores: 3.84x against
3.41x; ViT-L/16, 8e7: 2.49x against 2.21x; Hugging Face's ViT-B/16: 2.73x against 2.54x) and at 224 px, batch 32
(1.5e7) too (3.45x against 3.08x); at batch 32 and 64 (2.4e8 and 4.7e8 scores) it won (1.50x against 1.77x, 1.42x
against 1.65x). A call recorded as a CUDA graph (``vitviz.graphed``) takes it at any size: its host work is done
once, at recording, and what is left is the device's, where the log-sum-exp saves a pass (H200, ViT-B/16, 448 px,
batch 8, bf16: the device busy 4.85 ms a rollout call with it, 5.81 ms without). ``VITVIZ_FORWARD_LSE=on|off|auto``
(or ``use_forward_lse(True/False)``) forces or forbids it. The distance (``vitviz.mean_attention_distance``, its
dataset reduction) never takes it: its kernel (``distance_sums_kernel``) makes one pass with a softmax of its own
and reads no log-sum-exp, so its captures run under ``use_forward_lse(False)``. ``bench/gpu_run.sh`` checks the
CUDA branches (``pytest -m gpu``) and times ``rollout_kernel`` (forced off) against
``rollout_fwdlse`` (forced on).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

from vitviz.core.contexts import recording
from vitviz.core.kernels import sdpa_operands
from vitviz.errors import InputError

__all__ = ["ATOL", "HALF_MIN_SCORES", "ForwardLSE", "checked", "enabled", "sdpa_with_lse", "use_forward_lse"]

ATOL = 2e-3  # natural-log units; float32 recomputation vs the kernel's, summation order only (~1e-5 seen)
_ENV = "VITVIZ_FORWARD_LSE"
HALF_MIN_SCORES = 1 << 27  # half types: B * H * N * N from which ``auto`` takes it (see the module docstring)
_override: list[bool] = []
_warned: list[bool] = []
_verified: weakref.WeakKeyDictionary[Any, set[tuple]] = weakref.WeakKeyDictionary()  # checked: passed, per module
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


_MODES = {"1": "on", "on": "on", "true": "on", "yes": "on", "0": "off", "off": "off", "false": "off", "no": "off",
          "": "auto", "auto": "auto"}


def enabled(x: torch.Tensor | None = None, scores: int | None = None) -> bool:
    """Whether the stream probe takes the log-sum-exp from the forward of an attention module whose input (or
    query) is ``x`` and whose call forms ``scores`` attention scores (``B * H * N * N``): ``use_forward_lse``, else
    ``$VITVIZ_FORWARD_LSE`` (``on``/``1``, ``off``/``0``), else ``auto``: for a float32 CUDA ``x`` outside CUDA
    autocast, and for a bfloat16 or float16 one (or a float32 one under CUDA autocast) when ``scores`` is at least
    ``HALF_MIN_SCORES`` or the call is being recorded (``core.contexts.recording``: ``vitviz.graphed``) (see the
    module docstring); never without ``x``, on the CPU or for other dtypes.

    Raises:
        InputError: ``$VITVIZ_FORWARD_LSE`` is none of those values.
    """
    if _override:
        return _override[-1]
    raw = os.environ.get(_ENV, "")
    mode = _MODES.get(raw.strip().lower())
    if mode is None:
        raise InputError(f"{_ENV}={raw!r} is not one of on, off, auto (or 1, 0); unset it or pick one")
    if mode != "auto":
        return mode == "on"
    if x is None or x.device.type != "cuda" or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if x.dtype == torch.float32 and not torch.is_autocast_enabled("cuda"):
        return True
    if recording():  # a recorded call (vitviz.graphed) pays the host's part once: the device's saved pass wins
        return True
    return scores is not None and scores >= HALF_MIN_SCORES


def setting() -> tuple[bool | None, str | None]:
    """What ``enabled`` reads besides its arguments: the innermost ``use_forward_lse`` (None outside one) and
    ``$VITVIZ_FORWARD_LSE`` (a recorded call is recorded again when it changes: ``core.graphs``)."""
    return (_override[-1] if _override else None), os.environ.get(_ENV)


@contextlib.contextmanager
def use_forward_lse(on: bool) -> Iterator[None]:
    """Take the row log-sum-exp from the forward's fused attention (``True``) or not, in this block."""
    _override.append(bool(on))
    try:
        yield
    finally:
        _override.pop()


def sdpa_with_lse(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(F.scaled_dot_product_attention(*args, **kwargs), logsumexp (B, H, N) float32)``, or None where the backend
    SDPA would pick has no op returning the log-sum-exp with the same output (see the module docstring)."""
    got = _answer(args, kwargs)
    return None if got is None else got[:2]


def _answer(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, tuple] | None:
    """``sdpa_with_lse``'s answer and ``ForwardLSE.config``: what it depends on besides the values (the backend
    SDPA picks, the device, the dtypes and shapes of the operands, ``is_causal`` and ``scale``)."""
    call = {**dict(zip(_SDPA_ARGS, args)), **kwargs}
    q, k, v = call.get("query"), call.get("key"), call.get("value")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)) or set(call) - set(_SDPA_ARGS):
        return None
    dropout, causal, scale = float(call.get("dropout_p", 0.0)), bool(call.get("is_causal", False)), call.get("scale")
    if call.get("attn_mask") is not None or dropout or call.get("enable_gqa", False) or q.shape[1] != k.shape[1]:
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return None
    if q.shape[-1] % 8 or v.shape[-1] != q.shape[-1]:
        return None  # SDPA pads such head dims before its kernels
    q, k, v = sdpa_operands(q, k, v)  # autocast casts them for SDPA; the ATen ops below are not on its lists
    choice = int(torch._fused_sdp_choice(q, k, v, None, dropout, causal, scale=scale))
    op = _OPS.get((q.device.type, choice))
    if op is None:
        return None
    compared = choice in _COMPARED
    key = (choice, str(q.device), *((t.dtype, tuple(t.shape), t.stride()) for t in (q, k, v)), causal, scale)
    if compared and _SAME.get(key) is False:
        return None  # this configuration's output differed from SDPA's once: SDPA answers it
    if compared and key not in _SAME and capturing(q):
        return None  # the comparison reads a value, which a CUDA graph's capture cannot wait for: SDPA answers it
    n = q.shape[2]
    out, lse = op(q, k, v, dropout, causal, scale)
    if lse.ndim == 4 and lse.shape[-1] == 1:  # cuDNN's (B, H, N, 1)
        lse = lse[..., 0]
    if lse.shape[-1] > n:  # memory-efficient attention keeps rows rounded up to a multiple of 32
        lse = lse[..., :n]
    if tuple(lse.shape) != (q.shape[0], q.shape[1], n) or tuple(out.shape) != (*q.shape[:3], v.shape[-1]):
        return None
    if compared and not _same_as_sdpa(key, out, q, k, v, dropout, causal, scale):
        return None
    config = (choice, str(q.device), *((t.dtype, tuple(t.shape)) for t in (q, k, v)), causal, scale)
    return out, lse.float(), config


def _flash_cpu(q, k, v, dropout: float, causal: bool, scale: float | None) -> tuple:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, causal, scale=scale)[:2]


def _flash_cuda(q, k, v, dropout: float, causal: bool, scale: float | None) -> tuple:
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False, scale=scale)[:2]


def _efficient_cuda(q, k, v, dropout: float, causal: bool, scale: float | None) -> tuple:
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, dropout, causal,
                                                                   scale=scale)[:2]


def _cudnn_cuda(q, k, v, dropout: float, causal: bool, scale: float | None) -> tuple:
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, dropout, causal, False,
                                                               scale=scale)[:2]


# (device type, the backend SDPA picks) -> the ATen op that returns SDPA's output and the row log-sum-exp
_OPS: dict[tuple[str, int], Any] = {
    ("cpu", SDPBackend.FLASH_ATTENTION.value): _flash_cpu,
    ("cuda", SDPBackend.FLASH_ATTENTION.value): _flash_cuda,
    ("cuda", SDPBackend.EFFICIENT_ATTENTION.value): _efficient_cuda,
    ("cuda", SDPBackend.CUDNN_ATTENTION.value): _cudnn_cuda,
}
# the backends whose op, asked for the log-sum-exp, may not give SDPA's output bit for bit (``_same_as_sdpa``)
_COMPARED = frozenset({SDPBackend.CUDNN_ATTENTION.value})
_SAME: dict[tuple, bool] = {}  # configuration -> whether the op's output was SDPA's bit for bit


def _same_as_sdpa(key: tuple, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float,
                  causal: bool, scale: float | None) -> bool:
    """Whether ``out`` (an op of ``_COMPARED``) is SDPA's output for the call, bit for bit: compared on the first call
    of each configuration (SDPA run once more, one GPU sync) and remembered for the process."""
    same = _SAME.get(key)
    if same is None:
        with torch.no_grad():
            plain = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal, scale=scale)
        same = _SAME[key] = bool(torch.equal(out, plain))
    return same


class ForwardLSE(TorchFunctionMode):
    """Answers the one ``F.scaled_dot_product_attention`` call inside the block through ``sdpa_with_lse`` and keeps
    its log-sum-exp in ``lse`` (None where it could not, or where the block made another such call), and in
    ``config`` what the answer depends on besides the values: the backend SDPA picked, the device, the dtypes and
    shapes of ``q``, ``k``, ``v``, ``is_causal`` and ``scale`` (for ``checked``'s trust)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.lse: torch.Tensor | None = None
        self.config: tuple | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.calls += 1
        got = _answer(args, kwargs) if self.calls == 1 else None
        if got is None:
            self.lse = None
            return func(*args, **kwargs)
        out, self.lse, self.config = got
        return out


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t``'s CUDA stream is being captured into a CUDA graph now (``vitviz.graphed``), where no value can be
    read on the host: a configuration first met there is not compared or checked (``checked``, ``_answer``), and
    the safe answer is taken (SDPA's output, the kernels' own first pass). False without CUDA initialised."""
    return t.is_cuda and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _gap(lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scale: float, is_causal: bool) -> float:
    """The largest difference of ``lse`` from the float32 recomputation on the first, middle and last query row of
    every head (a GPU sync: the result is read). Autocast is off for it: under autocast the matmul would run in the
    autocast dtype (seen: 1.4e-2 off in bfloat16 on a 2-block timm ViT, and the check refused a right value)."""
    n = q.shape[2]
    rows = sorted({0, n // 2, n - 1})

    def picked(t: torch.Tensor) -> torch.Tensor:  # the rows as slices: an index list would be copied from the CPU
        return torch.cat([t[:, :, r:r + 1] for r in rows], 2)  # first (on a GPU, a wait of its own)

    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        scores = (picked(q).float() @ k.float().transpose(-2, -1)) * scale
        if is_causal:  # SDPA's causal mask: row r reads keys 0..r
            cols = torch.arange(k.shape[2], device=q.device)
            scores = scores.masked_fill(torch.stack([cols > r for r in rows]), float("-inf"))
        return float((scores.logsumexp(-1) - picked(lse)).abs().max())


def checked(lse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor, scale: float, is_causal: bool = False, *,
            owner: Any = None, config: tuple | None = None) -> torch.Tensor | None:
    """``lse`` where its first, middle and last row of every head agree with ``logsumexp(q k^T * scale)`` (keys past
    the row masked where ``is_causal``) recomputed in float32 to ``ATOL``; else None (with one warning per process).

    With ``owner`` (the attention module) and ``config`` (``ForwardLSE.config``), a call that passed is remembered,
    and the next call of that module with the same configuration (and the same ``q``/``k`` dtype and shape, scale and
    causality) is trusted without the recomputation, whose reading of one float is a GPU sync: the errors the check
    is there for (an op's layout or units, a probe reading other ``q``, ``k`` or scale than the forward's) belong to
    the configuration, not to the values. So a run of many batches checks each module once per configuration, in
    this process."""
    if lse is None:
        return None
    b, h, n, _ = q.shape
    if tuple(lse.shape) != (b, h, n):
        return None
    key = None
    if owner is not None and config is not None:
        key = (config, q.dtype, tuple(q.shape), k.dtype, tuple(k.shape), float(scale), bool(is_causal))
        if key in _verified.get(owner, ()):
            return lse
    if capturing(q):  # a check reads a float, which a capture cannot wait for: the kernels' own first pass
        return None
    gap = _gap(lse, *sdpa_operands(q, k), scale, is_causal)  # under autocast: the q and k SDPA computed with
    if gap <= ATOL:
        if key is not None:
            _verified.setdefault(owner, set()).add(key)
        return lse
    if not _warned:
        _warned.append(True)
        warnings.warn(f"the row log-sum-exp of the forward's fused attention differs from a recomputation by {gap:.3g} "
                      f"(allowed {ATOL}); the head-map kernels compute their own (set {_ENV}=0 to skip the attempt)",
                      RuntimeWarning, stacklevel=2)
    return None
