"""Triton kernels: head-fused softmax attention and per-head distance sums, tile by tile, no ``(B, H, N, N)``.

For ``P_h = softmax(q_h k_h^T * scale + bias_h)`` (rows over keys), one ViT layer's reductions need only

- ``fuse_heads_kernel``: the head mean, max or min ``(B, N, N)`` float32 (rollout, the explorer's fused maps);
- ``distance_sums_kernel``: per head and patch query ``i``, ``sum_j P_h[i, j] d[i, j]`` and ``sum_j P_h[i, j]`` over
  the patch keys ``j`` ``(B, H, P)`` each (mean attention distance, ``vitviz.analysis.distance``).

Both recompute the scores from ``q`` and ``k`` ``(B, H, N, d)`` (in the model's dtype, any strides) on the fly,
as flash attention does (Dao et al., "FlashAttention", NeurIPS 2022, Alg. 1: a running row maximum ``m`` and a
running sum ``l`` rescaled by ``exp(m_old - m_new)`` as the key tiles go by):

- ``_rows_kernel`` (grid: query tile x ``B*H``) walks the key tiles once per query tile and writes the row
  maximum ``m`` and sum ``l`` ``(B, H, N)`` (the log-sum-exp is ``m + log l``); with ``WITH_DIST`` it also keeps
  the running distance-weighted and patch-key sums, rescaled like ``l``, so the distance needs this single pass,
  and walks queries and keys patches first, the prefix tokens last, so that each distance tile starts where the
  distance matrix's rows do (aligned: read in 128-bit loads, where offset by the prefix it took scalar ones; a
  matrix whose side is not a multiple of 16, 196 patches at 224 px with /16 patches, is padded with zeros to one);
- ``_fuse_kernel`` (grid: query tile x key tile x ``B``) loops over the heads for its output tile, forms
  ``exp(s - m) / l`` and folds it into a float32 accumulator (sum, max or min), then writes the tile once. (Not
  ``exp(s - lse)``: where a float mask puts ``finfo.min`` on a whole row, ``m + log l`` rounds to ``m`` and the
  row would sum to ``l``; the PyTorch path gives that row uniform weights, and so does this.)

The scores are ``q . k`` with float32 accumulation times ``scale`` in float32, plus the bias, in natural units (a
float mask of ``finfo.min`` stays finite, where folding ``log2 e`` into it would overflow to ``-inf``), as SDPA's
flash kernels compute them. Float32 ``q`` and ``k`` are multiplied on tensor cores in 3xTF32 (``"tf32x3"``: each
operand split into a TF32 high part and a TF32 remainder, three products summed, the remainders' product dropped)
at head dims <= 64, as PyTorch's own float32 SDPA kernel does on sm_80 and newer (its memory-efficient CUTLASS
kernel, ``OpMultiplyAddFastF32``). Emulated in PyTorch on ViT-B/16 448 px shapes, its softmax probabilities are
as close to float64 as those of plain float32 products (largest error 9.0e-7 against 7.8e-7; TF32 alone 5.5e-4;
``test_3xtf32_products_are_as_close_to_float64_as_float32_products``). Wider heads use plain float32 products on
CUDA cores (``"ieee"``: no 3xTF32 tile shape builds without register spills there; see ``_blocks``). timm's
explicit path (and vitviz's PyTorch stream path, the reference) rounds ``q * scale`` and the scores to the model's
dtype first, so in bf16/fp16 the two differ by that rounding.

Masks follow timm's ``resolve_self_attn_mask``: ``is_causal`` wins over ``attn_mask``; a bool mask keeps ``True``
entries (``False`` -> ``-inf``); a float mask is added; any shape broadcastable to ``(B, H, N, N)``. A row whose
keys are all masked gives NaN, as ``torch.softmax`` does, and so do its head mean, max and min (as ``torch.amax``
gives them: the max and min fold with ``PropagateNan.ALL``, where Triton's default would drop that head). Head dims are padded to a power of two (>= 16) with
masked loads.

Triton is imported with this module (``vitviz.core.kernels`` imports it only when a kernel runs). The kernels are
built with ``triton.jit`` on first use, once for compiled and once for interpreted mode (``TRITON_INTERPRET=1``,
read at that moment), so tests can run them on CPU tensors under the interpreter without leaking that mode into
other code. Under the interpreter bf16 tiles are upcast to float32 before ``tl.dot`` (Triton 3.9's interpreter
multiplies bf16 bit patterns as integers; bf16 products are exact in float32, so the result is that of a bf16 dot
with float32 accumulation, the same as on the GPU up to summation order).
"""

from __future__ import annotations

import functools
import os
import weakref

import torch
import triton
import triton.language as tl

from vitviz.core.contexts import tensor_version
from vitviz.errors import InputError

__all__ = ["distance_sums_kernel", "fuse_heads_kernel", "row_logsumexp"]

HOW = {"mean": 0, "max": 1, "min": 2}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _scores(q, kt, qk_scale, BIAS, b, h, rows, cols, inb, sbb, sbh, sbi, sbj,
            BIAS_KIND: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One ``(BLOCK_M, BLOCK_N)`` tile of head ``h``'s scores ``q k^T * scale`` in fp32, with the bias or keep-mask
    and the causal mask applied (masked entries -inf); both kernels call it."""
    s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
    if BIAS_KIND == 1:
        bias = tl.load(BIAS + b * sbb + h * sbh + rows[:, None] * sbi + cols[None, :] * sbj, mask=inb, other=0.0)
        s += bias.to(tl.float32)
    if BIAS_KIND == 2:
        keep = tl.load(BIAS + b * sbb + h * sbh + rows[:, None] * sbi + cols[None, :] * sbj, mask=inb, other=1)
        s = tl.where(keep != 0, s, float("-inf"))
    if CAUSAL:
        s = tl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    return s


_SCORES = _scores  # the plain function, jitted in _kernels() for the mode in force


def _rows_kernel(Q, K, BIAS, DIST, M, L, WD, WP,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, sbb, sbh, sbi, sbj, sdi, sdj,
                 H, N, D, P0, P, PD, qk_scale,
                 BIAS_KIND: tl.constexpr, CAUSAL: tl.constexpr, WITH_DIST: tl.constexpr, UPCAST: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    # with WITH_DIST the tiles walk the tokens patches first: position v is token v + P0 for v < P (the patches)
    # and token v - P after them (the prefix), so a distance tile is DIST[r, v] itself, read from its rows' start.
    # DIST is PD x PD, PD = P rounded up to a multiple of 16, zero past P (``_rows`` pads it where P is not one): a
    # tile's mask then changes only at multiples of 16 and its loads are 128 bits wide on every grid
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if WITH_DIST:
        rows = tl.where(r < P, r + P0, r - P)
    else:
        rows = r
    dd = tl.arange(0, BLOCK_D)
    row_in = r < N
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dd[None, :] * sqd,
                mask=row_in[:, None] & (dd[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    wd = tl.zeros([BLOCK_M], tl.float32)
    wp = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        v = start + tl.arange(0, BLOCK_N)
        if WITH_DIST:
            cols = tl.where(v < P, v + P0, v - P)
        else:
            cols = v
        col_in = v < N
        kt = tl.load(K + b * skb + h * skh + cols[None, :] * skn + dd[:, None] * skd,
                     mask=col_in[None, :] & (dd[:, None] < D), other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        inb = row_in[:, None] & col_in[None, :]
        s = _scores(q, kt, qk_scale, BIAS, b, h, rows, cols, inb, sbb, sbh, sbi, sbj, BIAS_KIND, CAUSAL, PRECISION)
        s = tl.where(col_in[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: no (-inf) - (-inf)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        if WITH_DIST:
            patch_key = v < P
            d = tl.load(DIST + r[:, None] * sdi + v[None, :] * sdj, mask=(r < PD)[:, None] & (v < PD)[None, :],
                        other=0.0)  # zero past P: the prefix keys add nothing to wd
            wd = wd * alpha + tl.sum(p * d, 1)
            wp = wp * alpha + tl.sum(tl.where(patch_key[None, :], p, 0.0), 1)
        m = m_new
    tl.store(M + bh * N + rows, m, mask=row_in)
    tl.store(L + bh * N + rows, l_sum, mask=row_in)
    if WITH_DIST:
        out = bh * P + r
        keep_row = r < P
        tl.store(WD + out, wd / l_sum, mask=keep_row)
        tl.store(WP + out, wp / l_sum, mask=keep_row)


def _fuse_kernel(Q, K, BIAS, M, L, OUT,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, sbb, sbh, sbi, sbj, sob, soi, soj,
                 H, N, D, qk_scale, inv_h,
                 HOW: tl.constexpr, BIAS_KIND: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dd = tl.arange(0, BLOCK_D)
    row_in = rows < N
    col_in = cols < N
    inb = row_in[:, None] & col_in[None, :]
    if HOW == 0:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    elif HOW == 1:
        acc = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
    else:
        acc = tl.full([BLOCK_M, BLOCK_N], float("inf"), tl.float32)
    for h in range(0, H):
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dd[None, :] * sqd,
                    mask=row_in[:, None] & (dd[None, :] < D), other=0.0)
        kt = tl.load(K + b * skb + h * skh + cols[None, :] * skn + dd[:, None] * skd,
                     mask=col_in[None, :] & (dd[:, None] < D), other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            kt = kt.to(tl.float32)
        s = _scores(q, kt, qk_scale, BIAS, b, h, rows, cols, inb, sbb, sbh, sbi, sbj, BIAS_KIND, CAUSAL, PRECISION)
        m = tl.load(M + (b * H + h) * N + rows, mask=row_in, other=0.0)
        inv_l = 1.0 / tl.load(L + (b * H + h) * N + rows, mask=row_in, other=1.0)
        p = tl.exp(s - m[:, None]) * inv_l[:, None]  # not exp(s - lse): m + log(l) drops log(l) when |m| > ~1e7
        if HOW == 0:
            acc += p
        elif HOW == 1:
            acc = tl.maximum(acc, p, propagate_nan=tl.PropagateNan.ALL)  # a fully masked row: NaN, as amax
        else:
            acc = tl.minimum(acc, p, propagate_nan=tl.PropagateNan.ALL)
    if HOW == 0:
        acc = acc * inv_h
    tl.store(OUT + b * sob + rows[:, None] * soi + cols[None, :] * soj, acc, mask=inb)


_BUILT: dict[bool, tuple] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter now (``TRITON_INTERPRET=1``)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _kernels() -> tuple:
    mode = interpreting()
    if mode not in _BUILT:
        # the kernels call _scores by its global name: it is a jitted function of the same mode when they compile
        globals()["_scores"] = triton.jit(_SCORES)
        _BUILT[mode] = (triton.jit(_rows_kernel), triton.jit(_fuse_kernel))
    return _BUILT[mode]


@functools.cache
def _capability(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def _arch(device: torch.device) -> int | None:
    """The compute capability of a CUDA ``device`` as one number (90 for sm_90), read once per device; None
    elsewhere (the offline compile test sets it)."""
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


# sm_90's tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) at head dims <= 64 without a bias or mask, by pass; the
# float32 fusing pass has its own (``_blocks`` says where they were measured)
SM90_TABLE = {"rows": (64, 64, 4, 3), "distance": (64, 64, 4, 3), "fuse": (64, 64, 8, 3), "fuse-fp32": (128, 64, 8, 2)}


def _sm90_table(kernel: str, dtype: torch.dtype) -> tuple[int, int, int, int]:
    return SM90_TABLE["fuse-fp32" if kernel == "fuse" and dtype == torch.float32 else kernel]


def _blocks(d: int, dtype: torch.dtype, precision: str, *, arch: int | None = None, kernel: str = "fuse",
            bias_kind: int = 0, causal: bool = False) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` for head dim ``d``, ``q``'s dtype and the dot's precision
    (``_precision``), the GPU's compute capability ``arch`` (``_arch``), the pass (``"rows"``: the row maximum and
    sum alone; ``"distance"``: with the distance sums; ``"fuse"``: the head fusion), the bias kind (``_bias``) and
    the causal mask; ``VITVIZ_HEADMAP_BLOCKS="64,64,8,3"`` overrides (``bench/headmap_kernel.py --blocks`` sweeps
    it).

    On sm_90 (H100, H200: 227 KiB of shared memory per block), at head dims <= 64 without a bias or mask (fused
    attention's case), every pass takes ``SM90_TABLE``'s tiles: the rows and distance passes 64 x 64 with 4 warps
    and 3 stages, the fusing pass 64 x 64 with 8 warps and 3 stages, 128 x 64 with 8 warps and 2 stages in float32
    (3xTF32). The H200 sweep (``bench/results/h200_gpu_run_5/micro.json``, ViT-B/16 at 448 px, per layer, against
    the shapes before) measured them fastest of the six shapes swept: bf16 rows 0.058 against 0.091 ms, fusing
    0.055 against 0.072, distance 0.110 against 0.152; float32 rows 0.163 against 0.366, fusing 0.199 against
    0.364, distance 0.221 against 0.472. 4 warps hold a 64-row tile in one warp group, so no row reduction crosses
    warps through shared memory (``bench/headmap_sass.py``, barriers per key tile: the rows pass 2 against 4 to 14,
    the distance pass 8 to 10 against 16 to 22). fp16 takes bf16's shapes (the same instructions; not swept).
    Other shapes and head dims than that layer's were not swept with these tiles; the H100 sweep before them
    (``bench/results/h100_gpu_run_1/micro.json``) had put 64 x 64 with 8 warps ahead of the shared shapes at all
    four of its shapes. As the JIT builds them for a first call
    (specialised on the arguments) they spill nothing on sm_90 under Triton 3.8 and 3.9; built from the bare
    signature, the distance pass and float32's fusing pass spill 68 to 324 bytes (``tests/test_headmap_compile.py``
    holds both). The end-to-end effect in bf16 is not settled: run 6's recorded bf16 calls were not faster against
    its recorded forward than run 5's (docs/benchmarks.md); float32's were. Not taken there: every variant with a
    mask or bias (the distance pass spills 8 to 136 bytes in 64 x 64 tiles), ``"ieee"`` float32 and sm_80, where
    most float32 64 x 64 passes spill 212 to 848 bytes.

    Every other launch takes the shapes below, chosen so that no kernel variant spills registers and each fits the
    99 KiB of shared memory a block may take on the smallest CUDA parts (sm_86/89/120), as compiled offline for
    sm_90 and sm_80 by Triton 3.8 and 3.9 (their ptxas differ: a shape clean under one can spill under the other);
    ``tests/test_headmap_compile.py`` checks it in ``make test`` without a GPU, with the Triton installed. Before,
    ``64 x 64`` tiles with 4 warps spilled up to 1.4 KB per thread in bf16 (the distance pass with a float bias
    keeps score, probability, bias-pointer and distance-pointer tiles live) and up to 9.3 KB in float32; with 8
    warps and 3 stages the same pass still spilled 8 bytes under Triton 3.8 (sm_90), clean under 3.9, hence
    ``64 x 32`` tiles in half types. Float32 ``"ieee"`` dots run on CUDA cores with both operands in registers, and
    for sm_90 ptxas allocates such kernels 32 registers and spills kilobytes unless the tiles are small (seen from
    ``32 x 32`` tiles at head dim 128); the 3xTF32 dot at head dim 64 builds cleanly on both targets and both Triton
    versions only in ``64 x 16`` tiles with one stage (``64 x 32`` spilled up to 156 bytes on sm_80 under Triton
    3.8, ``32 x 32`` under either) and spilled in every shape tried at 128. Speed is for the GPU sweep to settle:
    these are the shapes that build cleanly.
    """
    env = os.environ.get("VITVIZ_HEADMAP_BLOCKS")
    if env:
        try:
            bm, bn, w, s = (int(v) for v in env.split(","))
        except ValueError:
            raise InputError(f"VITVIZ_HEADMAP_BLOCKS={env!r}: expected four integers BLOCK_M,BLOCK_N,WARPS,STAGES "
                             "such as '64,64,8,3'") from None
        return bm, bn, w, s
    if interpreting():
        return 16, 16, 1, 1  # tiles smaller than the test shapes: every edge case crosses tiles
    if arch == 90 and d <= 64 and bias_kind == 0 and not causal and precision != "ieee":
        return _sm90_table(kernel, dtype)
    if dtype == torch.float32:
        if d > 64:
            return 16, 16, 4, 1
        return (32, 32, 8, 2) if precision == "ieee" else (64, 16, 8, 1)
    if d <= 64:
        return 64, 32, 8, 2
    return (64, 32, 8, 2) if d <= 128 else (16, 16, 4, 1)


def _launch(kernel, grid: tuple[int, ...], args: tuple, meta: dict) -> None:
    """Run ``kernel[grid](*args, **meta)``; the one place the kernels launch (the offline compile test records the
    launches here). Floating-point contraction (``a * b + c`` as one FMA) is asked for explicitly, as Triton has
    always defaulted to it; Triton 3.9 warns that its default will change."""
    kernel[grid](*args, enable_fp_fusion=True, **meta)


def _check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.ndim != 4 or q.shape != k.shape:
        raise InputError(f"q and k must both be (B, H, N, d); got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.dtype != k.dtype or q.dtype not in _DTYPES:
        raise InputError(f"q and k must share a dtype among {_DTYPES}; got {q.dtype} and {k.dtype} (cast them)")
    if q.device != k.device:
        raise InputError(f"q and k must be on one device; got {q.device} and {k.device}")
    if q.shape[-1] > 256:
        raise InputError(f"head dim {q.shape[-1]} > 256 is not supported by the head-map kernel")


OFFSET_LIMIT = 2**31  # Triton passes an int argument below 2**31 as int32, and the kernels multiply it so


def _extent(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """The largest element offset from a tensor's first element that indexing it forms: ``sum((size - 1) * stride)``."""
    return sum((size - 1) * st for size, st in zip(shape, stride) if size > 1)


def _batch_chunks(b: int, batched: dict[str, torch.Tensor], whole: dict[str, torch.Tensor] | None = None
                  ) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` batch ranges to launch a kernel over, so that no offset the kernel forms in 32-bit integers
    reaches ``OFFSET_LIMIT``: the kernels index ``T + b * stride_b + h * stride_h + ...`` with the program id ``b``
    and each stride in int32 (Triton's type for an int argument below 2**31), so ``(B, N, N)`` float32 maps of
    ``B * N * N >= 2**31`` elements (batch 128 of 4,097 tokens, 1024 px with /16 patches) would wrap to negative
    offsets: reads and writes outside the tensors. One range (``[(0, b)]``) where everything fits, the usual case.
    ``batched``: the tensors whose first dim is the batch, by name; ``whole``: those every launch reads whole.

    Raises:
        InputError: a single image's offsets, or a ``whole`` tensor's, reach ``OFFSET_LIMIT`` (``N`` > 46,340 tokens).
    """
    step = max(b, 1)
    for name, t, per_image in [(n, t, True) for n, t in batched.items()] + \
            [(n, t, False) for n, t in (whole or {}).items()]:
        shape, stride = tuple(t.shape), t.stride()
        one = _extent(shape[1:], stride[1:]) if per_image else _extent(shape, stride)
        if one >= OFFSET_LIMIT:
            raise InputError(f"{name} of shape {shape} (strides {stride}) needs element offsets up to {one} >= 2**31 "
                             f"for {'a single image' if per_image else 'one launch'}, past the head-map kernels' "
                             "32-bit indexing; use fewer tokens, or turn the kernels off (headmap_kernel('off') or "
                             "VITVIZ_HEADMAP_KERNEL=off)")
        if per_image and shape[0] > 1 and stride[0] > 0:
            step = min(step, (OFFSET_LIMIT - 1 - one) // stride[0] + 1)
    return [(lo, min(lo + step, b)) for lo in range(0, b, step)] or [(0, b)]


def _cut(t: torch.Tensor, lo: int, hi: int, b: int) -> torch.Tensor:
    """Images ``lo:hi`` of ``t`` (``t`` itself for the whole batch: one launch, no view made)."""
    return t if lo == 0 and hi == b else t[lo:hi]


_NO_BIAS: dict[torch.device, torch.Tensor] = {}  # device -> the placeholder a kernel without a bias is passed


def _no_bias(device: torch.device) -> torch.Tensor:
    """A one-element tensor on ``device`` for the bias argument of a launch without one (never read: ``BIAS_KIND``
    0 compiles the loads out), made once per device instead of once per launch."""
    t = _NO_BIAS.get(device)
    if t is None:
        t = _NO_BIAS[device] = torch.empty(1, device=device)
    return t


def _bias(attn_mask: torch.Tensor | None, is_causal: bool, shape: torch.Size, device: torch.device):
    """``(kind, tensor, strides)`` for the kernels: kind 0 none, 1 additive float, 2 bool keep-mask."""
    if is_causal or attn_mask is None:  # timm: is_causal takes precedence over attn_mask
        return 0, _no_bias(device), (0, 0, 0, 0)
    if attn_mask.device != device:  # a kernel handed another device's pointer reads what is not there
        raise InputError(f"attn_mask must be on q's device {device}; got {attn_mask.device} (move it with .to)")
    if not 2 <= attn_mask.ndim <= 4:
        raise InputError(f"attn_mask must have 2 to 4 dims broadcastable to (B, H, N, N) = {tuple(shape)}; "
                         f"got {tuple(attn_mask.shape)}")
    mask = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + tuple(attn_mask.shape))
    try:
        mask = mask.expand(shape)  # broadcast dims get stride 0: nothing is copied
    except RuntimeError:
        raise InputError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, N, N) = "
                         f"{tuple(shape)}") from None
    if mask.dtype == torch.bool:
        return 2, mask.view(torch.uint8), tuple(mask.stride())
    if not mask.dtype.is_floating_point:
        raise InputError(f"attn_mask must be bool (True = attend) or float (added to the scores); got {mask.dtype}")
    return 1, mask, tuple(mask.stride())


PRECISIONS = ("ieee", "tf32x3", "tf32")


def _precision(requested: str | None, dtype: torch.dtype, d: int) -> str:
    """``tl.dot``'s ``input_precision``: for float32 the one requested, else 3xTF32 at head dims <= 64 and plain
    float32 beyond (see the module docstring); half types ignore it (tensor-core MMA in their own type)."""
    if requested is not None and requested not in PRECISIONS:
        raise InputError(f"precision must be one of {PRECISIONS} or None (vitviz's choice), got {requested!r}")
    if dtype != torch.float32:
        return "tf32"  # Triton's default; only float32 operands read it
    return requested or ("tf32x3" if d <= 64 else "ieee")


def _common(q: torch.Tensor, k: torch.Tensor, scale: float, attn_mask, is_causal: bool, precision: str | None):
    _check_qk(q, k)
    b, h, n, d = q.shape
    kind, bias, sb = _bias(attn_mask, is_causal, torch.Size((b, h, n, n)), q.device)
    upcast = interpreting() and q.dtype == torch.bfloat16
    block_d = max(16, 1 << (d - 1).bit_length())  # the next power of two (triton's helper costs 5 us a call)
    precision = _precision(precision, q.dtype, d)
    return dict(BIAS_KIND=kind, CAUSAL=bool(is_causal), UPCAST=upcast, PRECISION=precision, BLOCK_D=block_d), \
        bias, sb, float(scale)


_PADDED: list = []  # the last matrix padded: [weakref to the caller's matrix, its version, device, padded copy]


def _forget(ref: weakref.ref) -> None:  # the kept matrix died: its padded copy goes with it
    if _PADDED and _PADDED[0] is ref:
        _PADDED.clear()


def _padded(distances: torch.Tensor, device: torch.device, pd: int) -> torch.Tensor:
    """``distances`` ``(P, P)`` as the distance pass reads it: float32 on ``device``, with a zero margin up to
    ``(pd, pd)`` where ``P`` is not a multiple of 16 (224 px with /16 patches, ``P = 196``), so that the kernel's
    tiles load 128 bits wide. The padded copy is made once per matrix, not once per layer: the last one is kept
    while the caller's matrix lives (dropped with it) and is unwritten (its version counter; an inference tensor,
    which has none, is padded each time), so the layers of one call, which share the matrix, pad it once. While a
    CUDA graph is being captured nothing is kept or reused: the capture records its own pad, so a replay never
    reads a copy made outside the graph (which a later write or free could change)."""
    p = distances.shape[0]
    if pd == p:
        return distances.to(device=device, dtype=torch.float32)
    # a capture runs on an initialised CUDA; asking before that would initialise it (and fail without a driver)
    capturing = device.type == "cuda" and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
    version = None if capturing else tensor_version(distances)
    last = tuple(_PADDED)  # one read of the slot: another thread may replace or clear it meanwhile
    if version is not None and len(last) == 4:
        ref, kept_version, kept_device, kept = last
        if ref() is distances and kept_version == version and kept_device == device:
            return kept
    padded = torch.nn.functional.pad(distances.to(device=device, dtype=torch.float32), (0, pd - p, 0, pd - p))
    if version is not None:
        _PADDED[:] = [weakref.ref(distances, _forget), version, device, padded]
    return padded


def _rows(q, k, scale, attn_mask, is_causal, distances, num_prefix_tokens, precision, common=None):
    """The rows pass; ``common``: ``_common``'s answer for these arguments, when the caller has it."""
    const, bias, sb, qk_scale = common or _common(q, k, scale, attn_mask, is_causal, precision)
    b, h, n, d = q.shape
    bm, bn, warps, stages = _blocks(d, q.dtype, const["PRECISION"], arch=_arch(q.device),
                                    kernel="distance" if distances is not None else "rows",
                                    bias_kind=const["BIAS_KIND"], causal=const["CAUSAL"])
    m = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    l_sum = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    with_dist = distances is not None
    if with_dist:
        if not 0 <= num_prefix_tokens <= n:  # the kernel reads token v + num_prefix_tokens for patch v
            raise InputError(f"num_prefix_tokens must be between 0 and N = {n}; got {num_prefix_tokens}")
        p = n - num_prefix_tokens
        if distances.shape != (p, p):
            raise InputError(f"distances must be (P, P) = ({p}, {p}) for N = {n} tokens and {num_prefix_tokens} "
                             f"prefix tokens; got {tuple(distances.shape)}")
        pd = -(-p // 16) * 16
        dist = _padded(distances, q.device, pd)
        wd = torch.empty(b, h, p, device=q.device, dtype=torch.float32)
        wp = torch.empty(b, h, p, device=q.device, dtype=torch.float32)
        sd = tuple(dist.stride())
    else:
        dist = wd = wp = m
        sd = (0, 0)
        pd = 0
    rows_kernel, _ = _kernels()
    meta = dict(WITH_DIST=with_dist, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **const)
    batched = dict(q=q, k=k, row_max=m, row_sum=l_sum, **(dict(weighted=wd, weight=wp) if with_dist else {}),
                   **(dict(attn_mask=bias) if const["BIAS_KIND"] else {}))
    for lo, hi in _batch_chunks(b, batched, dict(distances=dist) if with_dist else None):
        qc, kc, mc, lc = (_cut(t, lo, hi, b) for t in (q, k, m, l_sum))
        bc = _cut(bias, lo, hi, b) if const["BIAS_KIND"] else bias
        wdc, wpc = (_cut(wd, lo, hi, b), _cut(wp, lo, hi, b)) if with_dist else (mc, mc)
        _launch(rows_kernel, (-(-n // bm), (hi - lo) * h),
                (qc, kc, bc, dist, mc, lc, wdc, wpc, *q.stride(), *k.stride(), *sb, *sd, h, n, d,
                 int(num_prefix_tokens), n - int(num_prefix_tokens), pd, qk_scale), meta)
    return m, l_sum, ((wd, wp) if with_dist else None)


def row_logsumexp(q: torch.Tensor, k: torch.Tensor, scale: float, *, attn_mask: torch.Tensor | None = None,
                  is_causal: bool = False, precision: str | None = None) -> torch.Tensor:
    """``logsumexp_j (q_i . k_j * scale + bias_ij)`` per head and query: ``(B, H, N)`` float32 (natural log).

    Args:
        q, k: ``(B, H, N, d)`` in float16, bfloat16 or float32, on CUDA (or on CPU under ``TRITON_INTERPRET=1``).
        scale: the module's softmax scale (``d ** -0.5`` for timm's ``Attention``).
        attn_mask, is_causal: as timm's ``Attention.forward`` takes them (see the module docstring).
        precision: ``tl.dot``'s ``input_precision`` for float32 inputs (``"ieee"``, ``"tf32x3"``, ``"tf32"``);
            None: 3xTF32 at head dims <= 64, ``"ieee"`` beyond (see the module docstring).
    """
    m, l_sum, _ = _rows(q, k, scale, attn_mask, is_causal, None, 0, precision)
    return m + l_sum.log()


def fuse_heads_kernel(q: torch.Tensor, k: torch.Tensor, scale: float, how: str = "mean", *,
                      attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                      lse: torch.Tensor | None = None, out: torch.Tensor | None = None,
                      precision: str | None = None) -> torch.Tensor:
    """Head mean, max or min of ``softmax(q_h k_h^T * scale + bias_h)``: ``(B, N, N)`` float32.

    Args:
        q, k, scale, attn_mask, is_causal, precision: as ``row_logsumexp``.
        how: ``"mean"``, ``"max"`` or ``"min"`` over the heads.
        lse: the row log-sum-exp ``(B, H, N)`` when the caller has it (e.g. from a flash forward); else computed
            here by ``row_logsumexp`` (one more pass over the keys).
        out: a float32 ``(B, N, N)`` tensor to write into (any strides).

    Returns:
        ``out`` (or a new tensor): ``(B, N, N)`` float32.
    """
    if how not in HOW:
        raise InputError(f"how must be one of {tuple(HOW)}, got {how!r}")
    common = _common(q, k, scale, attn_mask, is_causal, precision)
    const, bias, sb, qk_scale = common
    b, h, n, d = q.shape
    if lse is None:  # the row maximum and the sum of exp(s - max): exact also where |max| swamps log(sum)
        m, l_sum, _ = _rows(q, k, scale, attn_mask, is_causal, None, 0, precision, common)
    elif lse.shape != (b, h, n):
        raise InputError(f"lse must be (B, H, N) = {(b, h, n)}; got {tuple(lse.shape)}")
    else:
        m, l_sum = lse.to(device=q.device, dtype=torch.float32).contiguous(), torch.ones(b, h, n, device=q.device)
    if out is None:
        out = torch.empty(b, n, n, device=q.device, dtype=torch.float32)
    elif out.shape != (b, n, n) or out.dtype != torch.float32 or out.device != q.device:
        raise InputError(f"out must be a float32 (B, N, N) = {(b, n, n)} tensor on {q.device}; got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    bm, bn, warps, stages = _blocks(d, q.dtype, const["PRECISION"], arch=_arch(q.device), kernel="fuse",
                                    bias_kind=const["BIAS_KIND"], causal=const["CAUSAL"])
    _, fuse_kernel = _kernels()
    meta = dict(HOW=HOW[how], BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **const)
    for lo, hi in _batch_chunks(b, dict(q=q, k=k, lse=m, row_sum=l_sum, out=out,
                                        **(dict(attn_mask=bias) if const["BIAS_KIND"] else {}))):
        qc, kc, mc, lc, oc = (_cut(t, lo, hi, b) for t in (q, k, m, l_sum, out))
        bc = _cut(bias, lo, hi, b) if const["BIAS_KIND"] else bias
        _launch(fuse_kernel, (-(-n // bm), -(-n // bn), hi - lo),
                (qc, kc, bc, mc, lc, oc, *q.stride(), *k.stride(), *sb, *out.stride(), h, n, d, qk_scale, 1.0 / h),
                meta)
    return out


def distance_sums_kernel(q: torch.Tensor, k: torch.Tensor, scale: float, distances: torch.Tensor,
                         num_prefix_tokens: int, *, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                         precision: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, each patch query's attention-weighted distance sum and patch-key weight, in one pass.

    With ``P_h = softmax(q_h k_h^T * scale + bias_h)`` over all ``N`` keys and ``p = num_prefix_tokens``:
    ``weighted[b, h, i] = sum_{j >= p} P_h[p + i, j] * distances[i, j - p]`` and
    ``weight[b, h, i] = sum_{j >= p} P_h[p + i, j]`` (prefix tokens have no position: they are neither queries
    nor keys of the distance; ``vitviz.analysis.distance`` renormalises by ``weight``).

    Args:
        q, k, scale, attn_mask, is_causal, precision: as ``row_logsumexp``.
        distances: ``(P, P)`` pixels between patch centres (``patch_distance_matrix``), ``P = N - p``.
        num_prefix_tokens: ``p``.

    Returns:
        ``(weighted, weight)``, each ``(B, H, P)`` float32.
    """
    return _rows(q, k, scale, attn_mask, is_causal, distances, num_prefix_tokens, precision)[2]
