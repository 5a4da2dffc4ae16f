"""The head-map Triton kernels (``vitviz.core.kernels``) against float64 softmax and the PyTorch stream path.

On a machine without a GPU the kernels run on CPU tensors under Triton's interpreter. Triton's interpreter must be
on (``TRITON_INTERPRET=1``) before ``triton.language`` is imported: its library functions (``tl.sum``, ``tl.max``)
are ``triton.jit`` functions, interpretable only when made in that mode, and timm imports Triton, so by the time a
test runs it is too late to switch (seen: "Cannot call @triton.jit'd outside of the scope of a kernel"). And a
process that imported Triton interpreted cannot compile kernels for a GPU. So every interpreter test runs in one
child process that starts with ``TRITON_INTERPRET=1`` (``test_kernels_under_the_interpreter`` runs this file
there); in this process they are skipped, Triton stays in its compiled mode, and no other test sees the variable.

Tolerances, and why:

- kernel vs float64 softmax of the same ``q``, ``k`` (and bias): 2e-6 absolute on probabilities and on the patch
  weights, 2e-5 relative on distance sums. The kernel accumulates ``q . k`` in float32 and works in float32 from
  there (scores of magnitude < ~10: rounding ~1e-6 relative); the head mean/max/min and the sums add a few ulps.
  A wrong scale or a dropped key tile moves probabilities by ~1e-2 and distances by percents.
- kernel vs the PyTorch stream path (``_recomputed_heads``, what the CPU runs): float32 2e-6; float16 5e-3 and
  bfloat16 4e-2 absolute on probabilities. The PyTorch path (like timm's explicit path) rounds ``q * scale`` and
  the scores to the model's dtype before the float32 softmax: a score ``s`` moves by up to ``|s| 2^-11`` (fp16) or
  ``|s| 2^-8`` (bf16), a probability by about that factor; the kernel does not round there (as flash attention).
  Each tolerance is checked to exceed the PyTorch path's own distance from float64 (it is the larger error).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import EVA_CASES, RELATIVE_CASES, tiny_eva, tiny_parallel, tiny_relative, tiny_timm_vit

import vitviz
from vitviz.core import kernels
from vitviz.core.capture import capture_attention
from vitviz.core.families import stream, timm_probes
from vitviz.errors import InputError

pytestmark = pytest.mark.skipif(not kernels.triton_available(),
                                reason=f"needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TORCH_PATH_ATOL = {torch.float32: 2e-6, torch.float16: 5e-3, torch.bfloat16: 4e-2}


CHILD = os.environ.get("VITVIZ_KERNEL_TEST_CHILD") == "1"  # this process is the interpreter child


@pytest.fixture
def interpret(monkeypatch):
    """The kernels module, in the child process that started with ``TRITON_INTERPRET=1``; skipped elsewhere."""
    if not CHILD:
        pytest.skip("runs under Triton's interpreter in a child process (test_kernels_under_the_interpreter)")
    monkeypatch.delenv("VITVIZ_HEADMAP_BLOCKS", raising=False)
    from vitviz.core.kernels import headmaps

    assert headmaps.interpreting() and type(headmaps.triton.language.sum).__name__ == "InterpretedFunction"
    return headmaps


@pytest.fixture
def recompute_stream(monkeypatch):
    """The PyTorch stream path recomputes every call (the tiny models' maps are below ``EXPLICIT_BELOW_BYTES``)."""
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)


@pytest.fixture
def kernel_calls(interpret, monkeypatch):
    """``{"fuse": n, "distance": n}``: how often the entry points of the kernels ran in this test."""
    calls = {"fuse": 0, "distance": 0}

    def counting(name, fn):
        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return run

    for name, attr in (("fuse", "fuse_heads_kernel"), ("distance", "distance_sums_kernel")):
        monkeypatch.setattr(interpret, attr, counting(name, getattr(interpret, attr)))
    return calls


@pytest.mark.skipif(CHILD, reason="the driver runs in the parent process only")
def test_kernels_under_the_interpreter():
    """Run this file's interpreter tests in a fresh process that imports Triton with ``TRITON_INTERPRET=1``."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VITVIZ_HEADMAP")}
    env.update(TRITON_INTERPRET="1", VITVIZ_KERNEL_TEST_CHILD="1",
               PYTHONPATH=os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
                           "-m", "not gpu", str(Path(__file__).resolve())],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"interpreter tests failed:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 31, proc.stdout[-3000:]  # every interpreter test ran there
    assert "runs under Triton's interpreter" not in proc.stdout, proc.stdout[-3000:]


def qk(b: int, h: int, n: int, d: int, dtype: torch.dtype, spread: float = 2.0):
    """``q, k`` ``(B, H, N, d)`` as timm makes them: views of one ``qkv`` tensor (not contiguous)."""
    qkv = (torch.randn(b, n, 3, h, d) * spread ** 0.5).to(dtype)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return q, k


def probs64(q, k, scale, bias=None, causal=False):
    """float64 ``softmax(q k^T scale + bias)`` ``(B, H, N, N)``: the reference."""
    s = q.double() @ k.double().transpose(-1, -2) * scale
    n = s.shape[-1]
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    elif bias is not None:
        b = bias.reshape((1,) * (4 - bias.ndim) + tuple(bias.shape))
        s = s.masked_fill(~b, float("-inf")) if b.dtype == torch.bool else s + b.double()
    return s.softmax(-1)


def fused64(p, how):
    return {"mean": p.mean(1), "max": p.amax(1), "min": p.amin(1)}[how]


def distance64(p, dist, prefix):
    a = p[:, :, prefix:, prefix:]
    return (a * dist.double()).sum(-1), a.sum(-1)


def check_distance(got, p, dist, prefix):
    wd, wp = distance64(p, dist, prefix)
    assert got[0].shape == wd.shape and got[1].shape == wp.shape
    torch.testing.assert_close(got[0].double(), wd, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got[1].double(), wp, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_fused_maps_and_distance_sums_equal_float64_softmax(interpret, dtype):
    """Odd N = 37 over 16-token tiles (a ragged last tile), head dim 80 padded to 128, 5 prefix tokens."""
    q, k = qk(2, 3, 37, 80, dtype)
    scale = 80 ** -0.5
    p = probs64(q, k, scale)
    for how in ("mean", "max", "min"):
        torch.testing.assert_close(interpret.fuse_heads_kernel(q, k, scale, how).double(), fused64(p, how),
                                   rtol=0, atol=2e-6)
    dist = torch.rand(32, 32) * 100
    check_distance(interpret.distance_sums_kernel(q, k, scale, dist, 5), p, dist, 5)


@pytest.mark.parametrize(("d", "prefix"), [(32, 1), (64, 0), (24, 2)])
def test_head_dims_and_prefix_counts(interpret, d, prefix):
    q, k = qk(1, 2, 33, d, torch.float16)
    p = probs64(q, k, d ** -0.5)
    torch.testing.assert_close(interpret.fuse_heads_kernel(q, k, d ** -0.5).double(), p.mean(1), rtol=0, atol=2e-6)
    dist = torch.rand(33 - prefix, 33 - prefix) * 50
    check_distance(interpret.distance_sums_kernel(q, k, d ** -0.5, dist, prefix), p, dist, prefix)


def _masks(b: int, h: int, n: int):
    keep = torch.rand(n, n) > 0.3
    keep.fill_diagonal_(True)
    keep[:, 20:] = True
    keep[3:6, :20] = False  # rows whose first key tile is wholly masked: the running max starts at -inf
    per_head = torch.randn(1, h, n, n) * 2  # float bias, one per head, broadcast over the batch
    per_image = (torch.rand(b, 1, n, n) > 0.5) | torch.eye(n, dtype=torch.bool)
    padding = torch.zeros(b, 1, n, n)  # NaFlex-style: image 0's last 5 tokens are padding, as keys and as queries
    padding[0, :, :, -5:] = padding[0, :, -5:, :] = torch.finfo(torch.float32).min  # those rows: uniform, not NaN
    return {"bool 2-D": keep, "float per head": per_head, "bool per image": per_image,
            "float per head 3-D": per_head[0].to(torch.bfloat16), "causal": None, "finfo.min padding": padding}


@pytest.mark.parametrize("kind", ["bool 2-D", "float per head", "bool per image", "float per head 3-D", "causal",
                                  "finfo.min padding"])
def test_masks_follow_timm(interpret, kind):
    """timm's ``resolve_self_attn_mask``: bool keeps True, float is added, ``is_causal`` wins; broadcast per head."""
    b, h, n = 2, 3, 35
    q, k = qk(b, h, n, 32, torch.float32)
    mask = _masks(b, h, n)[kind]
    causal = kind == "causal"
    p = probs64(q, k, 32 ** -0.5, mask, causal)
    got = interpret.fuse_heads_kernel(q, k, 32 ** -0.5, "max", attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(got.double(), fused64(p, "max"), rtol=0, atol=2e-6)
    dist = torch.rand(n - 1, n - 1)
    check_distance(interpret.distance_sums_kernel(q, k, 32 ** -0.5, dist, 1, attn_mask=mask, is_causal=causal),
                   p, dist, 1)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # numpy, in the interpreter: 1 / 0, inf - inf
def test_a_fully_masked_row_is_nan_in_the_head_mean_max_and_min(interpret):
    """A bool mask that masks every key of row 3 in head 0 and of row 5 in every head: those rows' softmax is NaN,
    and so are their head mean, max and min (``torch.amax``, and the PyTorch stream path's ``torch.maximum``,
    propagate NaN). The kernel's max and min dropped the NaN head (Triton's ``maximum`` is ``fmax`` by default):
    row 3 showed the other heads' maximum, row 5 -inf (max) and +inf (min)."""
    b, h, n = 1, 3, 19
    q, k = qk(b, h, n, 16, torch.float32)
    keep = torch.ones(1, h, n, n, dtype=torch.bool)
    keep[0, 0, 3] = False
    keep[0, :, 5] = False
    p = probs64(q, k, 0.25, keep)
    for how in ("mean", "max", "min"):
        got = interpret.fuse_heads_kernel(q, k, 0.25, how, attn_mask=keep)
        assert got[0, 3].isnan().all() and got[0, 5].isnan().all(), how
        torch.testing.assert_close(got.double(), fused64(p, how), rtol=0, atol=2e-6, equal_nan=True)


def test_the_gpu_block_shapes(interpret, monkeypatch):
    """Every tile shape ``_blocks`` picks on a GPU (not the interpreter's 16 x 16; non-square ones among them, and
    sm_90's own), with
    ``N = BLOCK_M + BLOCK_N + 7`` tokens, so the last query tile and the last key tile are both ragged."""
    with monkeypatch.context() as gpu:
        gpu.setattr(interpret, "interpreting", lambda: False)
        shapes = {interpret._blocks(d, dtype, interpret._precision(precision, dtype, d), arch=arch, kernel=kernel)
                  for d in (64, 80, 160) for dtype in DTYPES.values() for precision in (None, "ieee")
                  for arch in (None, 80, 90) for kernel in ("rows", "distance", "fuse")}
    assert len(shapes) >= 3 and any(bm != bn for bm, bn, _, _ in shapes), shapes
    for bm, bn, warps, stages in sorted(shapes):
        monkeypatch.setenv("VITVIZ_HEADMAP_BLOCKS", f"{bm},{bn},{warps},{stages}")
        n = bm + bn + 7
        q, k = qk(1, 2, n, 24, torch.float32)
        bias = torch.randn(1, 2, n, n)
        p = probs64(q, k, 24 ** -0.5, bias)
        for how in ("mean", "min"):
            got = interpret.fuse_heads_kernel(q, k, 24 ** -0.5, how, attn_mask=bias)
            torch.testing.assert_close(got.double(), fused64(p, how), rtol=0, atol=2e-6, msg=f"{bm}x{bn} {how}")
        dist = torch.rand(n - 1, n - 1) * 100
        check_distance(interpret.distance_sums_kernel(q, k, 24 ** -0.5, dist, 1, attn_mask=bias), p, dist, 1)


def test_lse_from_the_caller_and_out(interpret):
    q, k = qk(2, 2, 21, 16, torch.float32)
    lse = (q.double() @ k.double().transpose(-1, -2) * 0.25).logsumexp(-1)
    torch.testing.assert_close(interpret.row_logsumexp(q, k, 0.25).double(), lse, rtol=1e-6, atol=1e-6)
    block = torch.full((3, 2, 21, 21), float("nan"))
    got = interpret.fuse_heads_kernel(q, k, 0.25, "mean", lse=lse.float(), out=block[1])
    assert got.data_ptr() == block[1].data_ptr() and not block[1].isnan().any() and block[0].isnan().all()
    torch.testing.assert_close(got.double(), probs64(q, k, 0.25).mean(1), rtol=0, atol=2e-6)
    with pytest.raises(InputError, match="lse"):
        interpret.fuse_heads_kernel(q, k, 0.25, lse=lse[:, :1])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_kernel_heads_equal_the_pytorch_stream_path(interpret, dtype):
    """``HeadMaps.fuse`` / ``distance_sums`` with and without the kernel, on one timm module's q and k."""
    module = tiny_timm_vit(embed_dim=64, num_heads=2).blocks[0].attn
    _kind, vt = timm_probes._stream_kind(module)
    q, k = qk(2, 2, 29, 32, dtype)
    torch_path = timm_probes._recomputed_heads(vt, module, q, k, None, False)
    kernel_path = timm_probes._recomputed_heads(vt, module, q, k, None, False, True)
    p = probs64(q, k, module.scale)
    for how in ("mean", "max", "min"):
        want, got = torch_path.fuse(how), kernel_path.fuse(how)
        err_torch = float((want.double() - fused64(p, how)).abs().max())
        assert err_torch < TORCH_PATH_ATOL[dtype]  # the tolerance covers the reference's own rounding
        torch.testing.assert_close(got, want, rtol=0, atol=TORCH_PATH_ATOL[dtype])
    dist = torch.rand(28, 28) * 30
    for got, want in zip(kernel_path.distance_sums(dist, 1), torch_path.distance_sums(dist, 1)):
        torch.testing.assert_close(got, want, rtol=TORCH_PATH_ATOL[dtype] * 10, atol=TORCH_PATH_ATOL[dtype] * 10)


def test_a_distance_matrix_is_padded_once_per_call_and_again_after_a_write(interpret, monkeypatch):
    """The distance pass pads a matrix whose side is not a multiple of 16 (here P = 24: a 4 x 6 grid) once for all
    the layers of a call, not once per layer (a launch each on a GPU); a matrix written in place since is padded
    again (its new values read), another matrix (the next call's) is padded for itself, and the padded copy goes
    when its matrix does."""
    pads: list[tuple[int, ...]] = []
    real_pad = torch.nn.functional.pad

    def counting(t, pad, *args, **kwargs):
        pads.append(tuple(t.shape))
        return real_pad(t, pad, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "pad", counting)
    model = tiny_timm_vit(reg_tokens=2, depth=4)  # 3 prefix tokens, 4x6 grid, 4 layers
    x = torch.randn(2, 3, 32, 48)
    with kernels.headmap_kernel("off"):
        want = vitviz.mean_attention_distance(model, x)
    with kernels.headmap_kernel("on"):
        got = vitviz.mean_attention_distance(model, x)
        assert pads == [(24, 24)]  # one pad for the call's 4 layers
        vitviz.mean_attention_distance(model, x)
        assert pads == [(24, 24)] * 2  # the next call's own matrix
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    q, k = qk(1, 2, 27, 16, torch.float32)
    dist = torch.rand(24, 24) * 40
    p = probs64(q, k, 0.25)
    check_distance(interpret.distance_sums_kernel(q, k, 0.25, dist, 3), p, dist, 3)
    check_distance(interpret.distance_sums_kernel(q, k, 0.25, dist, 3), p, dist, 3)
    assert len(pads) == 3  # the same matrix, unwritten: its padded copy
    dist.mul_(2.0)
    check_distance(interpret.distance_sums_kernel(q, k, 0.25, dist, 3), p, dist, 3)  # the new values
    assert len(pads) == 4
    del dist
    assert not interpret._PADDED  # dropped with its matrix


def test_forced_kernel_gives_the_pytorch_rollout_and_distance(interpret, monkeypatch, kernel_calls):
    """``headmap_kernel("on")`` routes rollout and distance through the kernels (counted), with the same results."""
    calls = kernel_calls
    model = tiny_timm_vit(reg_tokens=2)  # 3 prefix tokens, 4x6 grid: N = 27
    x = torch.randn(2, 3, 32, 48)
    with kernels.headmap_kernel("off"):
        want_r, want_d = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
        want_min = vitviz.attention_rollout(model, x, head_fusion="min", discard_ratio=0.5)
    assert calls == {"fuse": 0, "distance": 0}
    with kernels.headmap_kernel("auto"):  # CPU tensors: auto never picks the kernels
        vitviz.attention_rollout(model, x)
    assert calls == {"fuse": 0, "distance": 0}
    with kernels.headmap_kernel("on"):
        got_r, got_d = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
        got_min = vitviz.attention_rollout(model, x, head_fusion="min", discard_ratio=0.5)
    assert calls == {"fuse": 4, "distance": 2}  # two layers each
    torch.testing.assert_close(got_r, want_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_d, want_d, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got_min, want_min, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("VITVIZ_HEADMAP_KERNEL", "on")  # the environment variable does the same
    vitviz.attention_rollout(model, x)
    assert calls["fuse"] == 6


@pytest.mark.parametrize("name", ["vit", "beit-relative", "dinov2-registers", "clip-vision", "data2vec-shared-abs"])
def test_forced_kernel_on_hugging_face_models(interpret, kernel_calls, name):
    """The Hugging Face stream probe (``hf_probes``) routes through the kernels too: q and k as transformers hands
    them to SDPA, BEiT's relative position bias as a float mask per head, prefix tokens and registers; data2vec
    vision's own stream probe with its shared bias."""
    pytest.importorskip("transformers")
    from hf_models import hf_case

    calls = kernel_calls
    case = hf_case(name)
    model, x = case.model, case.x
    with kernels.headmap_kernel("off"):
        want = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    assert calls == {"fuse": 0, "distance": 0}
    with kernels.headmap_kernel("on"):
        got = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    assert calls == {"fuse": 2, "distance": 2}  # two layers each
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)


def test_forced_kernel_on_torchvision_and_open_clip(interpret, kernel_calls):
    """torchvision's and open_clip's ``nn.MultiheadAttention`` (``stream.probe_mha_stream``: q and k projected again
    from the input) through the kernels: the same rollout and distance as the PyTorch stream path."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    models = [VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32,
                                mlp_dim=64).eval()]
    if importlib.util.find_spec("open_clip") is not None:  # open_clip's towers: the same nn.MultiheadAttention
        from hf_models import open_clip_tower

        models.append(open_clip_tower())  # 32x48 input: a 4x6 grid
    for model in models:
        kernel_calls["fuse"] = 0
        x = torch.randn(2, 3, *vitviz.inspect(model).img_size)
        with kernels.headmap_kernel("off"):
            want = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
        with kernels.headmap_kernel("on"):
            got = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
        assert kernel_calls["fuse"] == 2, type(model).__name__
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["eva02", "rope-dinov3", "grouped-key-heads", "beit", "beit-shared-bias",
                                  "relpos-mlp", "relpos-shared"])
def test_forced_kernel_on_timm_rotary_and_relative_models(interpret, kernel_calls, case):
    """timm's ``EvaAttention`` and ``AttentionRope`` (``timm_probes.probe_timm_stream``: q and k rotated as the
    forward rotates them, key heads repeated for grouped-query attention), BEiT's ``Attention`` and
    ``RelPosAttention`` (their relative position bias as a float mask per head) through the kernels."""
    model = tiny_eva(**EVA_CASES[case]) if case in EVA_CASES else tiny_relative(case)
    assert case in EVA_CASES or case in RELATIVE_CASES
    x = torch.randn(2, 3, 32, 48)
    with kernels.headmap_kernel("off"):
        want = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    assert not kernel_calls["fuse"]
    with kernels.headmap_kernel("on"):
        got = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    assert kernel_calls["fuse"] == 2  # one per layer
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["parallel-qk-norm-registers", "differential", "differential-qk-norm-gap",
                                  "differential-parallel"])
def test_forced_kernel_on_timm_parallel_and_differential_attention(interpret, kernel_calls, recompute_stream, case):
    """``ParallelScalingBlock`` (rollout and distance) and differential attention (whose signed maps no reduction
    takes: the stream ``HeadMaps`` directly) through the kernels, as the PyTorch stream path gives them. A
    differential head mean is the even heads' mean minus lambda times the odd heads' (two kernel calls), its
    distance sums the pairs' sums combined alike (one call); its head max takes the PyTorch fold."""
    calls = kernel_calls
    model = tiny_parallel(case, num_heads=4)
    x = torch.randn(2, 3, 32, 48)
    prefix = vitviz.inspect(model).num_prefix_tokens
    d = torch.rand(24, 24) * 40

    def reduced():
        if "differential" not in case:
            return vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
        out: list[torch.Tensor] = []

        def on_layer(_i, hm):
            out.extend([hm.fuse("mean"), hm.fuse("max"), *hm.distance_sums(d, prefix)])

        with torch.no_grad(), capture_attention(model, on_layer=on_layer, store=False, heads="stream"):
            model(x)
        return out

    with kernels.headmap_kernel("off"):
        want = reduced()
    assert calls == {"fuse": 0, "distance": 0}
    with kernels.headmap_kernel("on"):
        got = reduced()
    assert calls == ({"fuse": 4, "distance": 2} if "differential" in case else {"fuse": 2, "distance": 2})
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)


def _rollout_with_output(model, x, run=lambda model, x: model(x)):
    """Rollout's fused maps per layer through the stream probe, and the forward's output (``run(model, x)``) under
    it."""
    fused: list[torch.Tensor] = []
    with torch.no_grad(), capture_attention(model, on_layer=lambda i, hm: fused.append(hm.fuse("mean")),
                                            store=False, heads="stream"):
        out = run(model, x)
    return fused, out


@pytest.mark.parametrize("case", ["timm", "timm-parallel", "hf"])
def test_the_probes_tell_forward_lse_how_many_scores_a_call_forms(interpret, monkeypatch, recompute_stream, case):
    """``forward_lse.enabled`` decides half types by the call's size: timm's stream probe and Hugging Face's hand it
    ``B * H * N * N`` of each attention call, with the tokens or query it reads the dtype and device of."""
    from vitviz.core.kernels import forward_lse

    asked: list[tuple[Any, Any]] = []
    monkeypatch.setattr(forward_lse, "enabled", lambda x=None, scores=None: asked.append((x, scores)) and False)
    if case == "hf":
        transformers = pytest.importorskip("transformers")
        config = transformers.ViTConfig(image_size=32, patch_size=16, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, attn_implementation="sdpa")
        model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    else:
        model = tiny_timm_vit() if case == "timm" else tiny_parallel("parallel")
    spec = vitviz.inspect(model)
    x = torch.randn(3, 3, *spec.img_size)
    with kernels.headmap_kernel("on"):
        _rollout_with_output(model, x)
    scores = 3 * spec.num_heads * spec.num_tokens**2
    assert [s for _, s in asked] == [scores] * len(spec.attention_modules), asked
    assert all(t.dtype == torch.float32 and t.shape[0] == 3 for t, _ in asked)


@pytest.fixture
def first_passes(interpret, monkeypatch):
    """The kernels' first passes over the keys (``_rows``) made in this test, one entry each."""
    passes: list[int] = []
    rows = interpret._rows
    monkeypatch.setattr(interpret, "_rows", lambda *a: passes.append(1) or rows(*a))
    return passes


@pytest.mark.parametrize("case", ["plain", "registers", "eva02", "parallel"])
def test_the_forward_lse_spares_the_first_pass(interpret, monkeypatch, recompute_stream, first_passes, case):
    """With ``forward_lse`` on, ``fuse`` takes the row log-sum-exp of the module's own SDPA call (answered by the
    flash op that returns it) and the kernels make no first pass: the same fused maps as with their own pass, and
    the forward's output bit for bit the plain forward's. Each module's log-sum-exp is checked in the first forward
    only (``checked``'s trust per module and configuration); a second forward gives the same maps."""
    from vitviz.core.kernels import forward_lse

    passes = first_passes
    checks: list[int] = []
    gap = forward_lse._gap
    monkeypatch.setattr(forward_lse, "_gap", lambda *a: checks.append(1) or gap(*a))
    model = {"plain": lambda: tiny_timm_vit(),
             "registers": lambda: tiny_timm_vit(reg_tokens=2, class_token=False, global_pool="avg"),
             "eva02": lambda: tiny_eva(**EVA_CASES["eva02"]), "parallel": lambda: tiny_parallel("parallel")}[case]()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        plain = model(x)
    with kernels.headmap_kernel("on"):
        with forward_lse.use_forward_lse(False):
            want, _ = _rollout_with_output(model, x)
        assert len(passes) == 2  # one first pass per layer
        passes.clear()
        with forward_lse.use_forward_lse(True):
            got, out = _rollout_with_output(model, x)
            assert len(checks) == 2  # one per layer
            again, _ = _rollout_with_output(model, x)
    assert not passes and len(checks) == 2
    assert torch.equal(out, plain)
    assert torch._C._len_torch_function_stack() == 0
    for g, w, a in zip(got, want, again, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=2e-6)
        assert torch.equal(a, g)


def _layer_norm_in_float32(qk: list[torch.Tensor]):
    """A forward hook for a ``LayerNorm`` under CPU autocast: its output computed in float32 from a float32 input,
    as CUDA autocast runs ``layer_norm`` (CPU autocast gives bfloat16); the outputs are kept in ``qk``."""
    def hook(m, inputs, _out):
        out = torch.nn.functional.layer_norm(inputs[0].float(), m.normalized_shape, m.weight, m.bias, m.eps)
        qk.append(out)
        return out
    return hook


@pytest.mark.parametrize("float32_qk", [False, True], ids=["bf16", "float32-qk-norm"])
def test_under_autocast_the_kernels_read_what_sdpa_computes_with(interpret, recompute_stream, first_passes,
                                                                 float32_qk):
    """Under autocast (bfloat16) SDPA computes with ``q``, ``k`` and ``v`` cast to bfloat16, whatever dtype the module
    hands it. The kernels read the same casts (``kernels.sdpa_operands``): their maps are the float64 softmax of the
    bfloat16 ``q`` and ``k`` to 1e-6, also where a qk-norm ``LayerNorm`` gives float32 ``q`` and ``k``, as under CUDA
    autocast (simulated here; the float32 values' own maps are more than 1e-3 away). With ``forward_lse`` on, the
    call is answered (no first pass) through the ATen op on the same casts: the forward's output stays the plain
    autocast forward's bit for bit, the maps those of the kernels' own pass (to 1e-4: the CPU flash op's bfloat16
    log-sum-exp), and no warning comes (``checked`` recomputes with autocast off from the casts)."""
    from vitviz.core.kernels import forward_lse

    passes = first_passes
    torch.manual_seed(0)
    model, x = tiny_timm_vit(qk_norm=True), torch.randn(2, 3, 32, 48)
    qk: list[torch.Tensor] = []
    with torch.no_grad():
        for block in model.blocks:
            for norm in (block.attn.q_norm, block.attn.k_norm):
                norm.weight.mul_(3)  # sharper attention, so that the rounding of q and k shows in the maps
                norm.register_forward_hook(_layer_norm_in_float32(qk) if float32_qk else
                                           lambda _m, _i, out: qk.append(out))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(x)
    with kernels.headmap_kernel("on"), torch.autocast("cpu", dtype=torch.bfloat16):
        with forward_lse.use_forward_lse(False):
            qk.clear()
            want, _ = _rollout_with_output(model, x)
        passes.clear()
        with forward_lse.use_forward_lse(True), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a refused log-sum-exp would warn
            got, out = _rollout_with_output(model, x)
    assert out.dtype == plain.dtype and torch.equal(out, plain)
    assert len(passes) == 0
    assert {t.dtype for t in qk} == {torch.float32 if float32_qk else torch.bfloat16}
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-4)  # the CPU flash op's bfloat16 log-sum-exp: 5e-5 seen
        q, k = qk[2 * i], qk[2 * i + 1]

        def maps(q, k, scale=model.blocks[i].attn.scale):
            return (q.double() @ k.double().transpose(-2, -1) * scale).softmax(-1).mean(1)
        torch.testing.assert_close(w.double(), maps(q.bfloat16(), k.bfloat16()), rtol=0, atol=1e-6)
        if float32_qk:
            assert float((w.double() - maps(q, k)).abs().max()) > 1e-3


@pytest.mark.parametrize("name", ["vit", "dinov2-registers", "clip-vision", "beit-relative"])
def test_the_forward_lse_spares_the_first_pass_on_hugging_face_models(interpret, recompute_stream, first_passes,
                                                                      name):
    """The Hugging Face stream probe runs transformers' ``"sdpa"`` implementation under ``ForwardLSE``: no first
    pass, the fused maps of the kernels' own pass, the output the plain forward's bit for bit. BEiT's relative
    position bias reaches SDPA as a mask, which ``sdpa_with_lse`` leaves alone: the kernels make their own pass."""
    pytest.importorskip("transformers")
    from hf_models import hf_case

    from vitviz.core.kernels import forward_lse

    passes = first_passes
    case = hf_case(name)
    model, x = case.model, case.x
    with torch.no_grad():
        plain = case.run(model, x)
    with kernels.headmap_kernel("on"):
        with forward_lse.use_forward_lse(False):
            want, _ = _rollout_with_output(model, x, case.run)
        assert len(passes) == 2  # one first pass per layer
        passes.clear()
        with forward_lse.use_forward_lse(True):
            got, out = _rollout_with_output(model, x, case.run)
    assert len(passes) == (2 if name == "beit-relative" else 0)
    assert torch.equal(out, plain)
    assert torch._C._len_torch_function_stack() == 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=2e-6)


def test_a_wrong_forward_lse_is_refused_by_the_check(interpret, monkeypatch, recompute_stream):
    """A log-sum-exp off by 0.01 fails ``forward_lse.checked``: a warning, and the kernels make their own pass (the
    right maps). Without the check the maps would be off by 1%, which the comparison sees."""
    from vitviz.core.kernels import forward_lse

    model, x = tiny_timm_vit(), torch.randn(2, 3, 32, 48)
    with kernels.headmap_kernel("on"):
        want, _ = _rollout_with_output(model, x)
        answer = forward_lse._answer
        monkeypatch.setattr(forward_lse, "_answer", lambda *a: (lambda o: (o[0], o[1] + 0.01, o[2]))(answer(*a)))
        monkeypatch.setattr(forward_lse, "_warned", [])
        with forward_lse.use_forward_lse(True), pytest.warns(RuntimeWarning, match="log-sum-exp"):
            checked, _ = _rollout_with_output(model, x)
        monkeypatch.setattr(forward_lse, "checked", lambda lse, *a, **kw: lse)
        with forward_lse.use_forward_lse(True):
            unchecked, _ = _rollout_with_output(model, x)
    assert max(float((g - w).abs().max()) for g, w in zip(checked, want)) < 2e-6
    assert max(float((g - w).abs().max()) for g, w in zip(unchecked, want)) > 1e-4


def test_a_forward_that_raises_leaves_no_mode_behind(interpret, monkeypatch, recompute_stream):
    from vitviz.core.kernels import forward_lse

    model = tiny_timm_vit()

    def boom(*_a):
        raise RuntimeError("boom")

    inside = model.blocks[1].attn.proj  # runs after the SDPA call, inside the attention module's forward
    inside.register_forward_pre_hook(boom)
    with kernels.headmap_kernel("on"), forward_lse.use_forward_lse(True), pytest.raises(RuntimeError, match="boom"):
        _rollout_with_output(model, torch.randn(1, 3, 32, 48))
    assert torch._C._len_torch_function_stack() == 0
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules() if m is not inside)


def test_forcing_without_interpreter_on_cpu_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with kernels.headmap_kernel("on"), pytest.raises(InputError, match="TRITON_INTERPRET"):
        kernels.use_kernel("cpu")
    monkeypatch.setenv("VITVIZ_HEADMAP_KERNEL", "sometimes")
    with pytest.raises(InputError, match="VITVIZ_HEADMAP_KERNEL"):
        kernels.use_kernel("cpu")
    monkeypatch.setenv("VITVIZ_HEADMAP_KERNEL", "off")
    assert kernels.use_kernel("cuda") is False
    with pytest.raises(InputError, match="mode"):
        kernels.headmap_kernel("always").__enter__()


def test_the_cuda_dispatch_reads_tritons_version_from_either_distribution(monkeypatch):
    """``auto`` runs the kernels on CUDA tensors when a Triton >= ``MIN_TRITON`` is installed, whichever distribution
    installed the ``triton`` module: PyTorch's nightly wheels bring ``pytorch-triton`` (no ``triton`` metadata), and
    there the kernels were silently off, and ``headmap_kernel('on')`` said no Triton was installed. An older Triton
    (or none) keeps the PyTorch path; CPU tensors never take the kernels in ``auto``. (The device check faked: no GPU
    is needed to decide.)"""
    import importlib.metadata as md

    installed: dict[str, str] = {}

    def version(name: str) -> str:
        if name not in installed:
            raise md.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(md, "version", version)
    monkeypatch.delenv("VITVIZ_HEADMAP_KERNEL", raising=False)
    for dists, want in (({"pytorch-triton": "3.7.0+git2c4f1b"}, (3, 7)), ({"triton": "3.10.1"}, (3, 10)),
                        ({"triton": "3.1.0"}, (3, 1)), ({}, None)):
        installed.clear()
        installed.update(dists)
        kernels._triton.clear()  # triton_available() is read once per process
        ok = want is not None and want >= kernels.MIN_TRITON
        assert kernels.triton_version() == want and kernels.triton_available() is ok, dists
        assert kernels.use_kernel("cuda") is ok and kernels.use_kernel("cpu") is False, dists
        if not ok:
            with kernels.headmap_kernel("on"), pytest.raises(InputError, match="Triton 3.6 or newer is not installed"):
                kernels.use_kernel("cuda")
    kernels._triton.clear()


def test_an_unknown_precision_is_refused_before_any_launch():
    from vitviz.core.kernels import headmaps

    q, k = qk(1, 2, 9, 16, torch.float32)
    with pytest.raises(InputError, match=r"precision must be one of .*'bf16x3'"):
        headmaps.fuse_heads_kernel(q, k, 0.25, precision="bf16x3")
    assert headmaps._precision(None, torch.float32, 64) == "tf32x3"
    assert headmaps._precision(None, torch.float32, 80) == "ieee"
    assert headmaps._precision("ieee", torch.float32, 64) == "ieee"
    assert headmaps._precision("ieee", torch.bfloat16, 64) == "tf32"  # half types: their own MMA, precision unread


def _recorded_launches(monkeypatch, headmaps) -> list[tuple[tuple, tuple]]:
    """``(grid, args)`` of every launch from now on, recorded at ``headmaps._launch`` and not run."""
    launches: list[tuple[tuple, tuple]] = []
    monkeypatch.setattr(headmaps, "_launch", lambda kernel, grid, args, meta: launches.append((grid, args)))
    return launches


def test_maps_past_2_31_elements_launch_in_batch_chunks_whose_offsets_fit_int32(monkeypatch):
    """The kernels form ``b * stride_b`` in int32 (Triton's type for an int argument below 2**31): a call whose
    ``(B, N, N)`` maps hold 2**31 elements or more (here 2,048 images of 1,025 tokens: 8.6 GB of float32, which an
    80 GB GPU holds), or whose ``q`` does (head dim 128), is launched over batch chunks in each of which every
    tensor's offsets stay below 2**31; it was one launch whose offsets wrapped to negative ones. (Meta tensors:
    shapes and strides, no memory.)"""
    from vitviz.core.kernels import headmaps

    launches = _recorded_launches(monkeypatch, headmaps)
    b, h, n, d = 2048, 12, 1025, 128
    q, k = (torch.empty(b, h, n, d, dtype=torch.bfloat16, device="meta") for _ in range(2))
    headmaps.fuse_heads_kernel(q, k, d ** -0.5, "mean", lse=torch.empty(b, h, n, device="meta"),
                               attn_mask=torch.empty(b, 1, n, n, dtype=torch.bool, device="meta"))
    headmaps.distance_sums_kernel(q, k, d ** -0.5, torch.empty(n - 1, n - 1, device="meta"), 1)
    fuse = [(grid, args) for grid, args in launches if len(grid) == 3]
    rows = [(grid, args) for grid, args in launches if len(grid) == 2]
    assert len(fuse) > 1 and len(rows) > 1  # chunked
    assert sum(grid[2] for grid, _ in fuse) == b and sum(grid[1] for grid, _ in rows) == b * h
    for _, args in launches:
        for t in args:
            if isinstance(t, torch.Tensor):
                assert headmaps._extent(tuple(t.shape), t.stride()) < 2**31, (tuple(t.shape), t.stride())
    with pytest.raises(InputError, match=r"out of shape \(1, 46341, 46341\).*2\*\*31.*headmap_kernel\('off'\)"):
        big = torch.empty(1, 1, 46341, 16, device="meta")
        headmaps.fuse_heads_kernel(big, big, 0.25, lse=torch.empty(1, 1, 46341, device="meta"))


def test_a_mask_on_another_device_is_refused_before_any_launch(monkeypatch):
    """q and k on one device, ``attn_mask`` on another: refused naming both, before a launch (which was handed the
    mask's pointer as it was: on a GPU, a host mask's address read as device memory). So is a negative prefix count,
    whose distance matrix of ``N + 1`` patches had the kernel read token -1 (before ``q``'s first element)."""
    from vitviz.core.kernels import headmaps

    launches = _recorded_launches(monkeypatch, headmaps)
    q, k = qk(1, 2, 9, 16, torch.float32)
    for fn in (lambda m: headmaps.fuse_heads_kernel(q, k, 0.25, attn_mask=m),
               lambda m: headmaps.distance_sums_kernel(q, k, 0.25, torch.ones(8, 8), 1, attn_mask=m)):
        with pytest.raises(InputError, match=r"attn_mask must be on q's device cpu; got meta"):
            fn(torch.ones(9, 9, dtype=torch.bool, device="meta"))
    assert not launches
    with pytest.raises(InputError, match=r"num_prefix_tokens must be between 0 and N = 9; got -1"):
        headmaps.distance_sums_kernel(q, k, 0.25, torch.ones(10, 10), -1)  # 10 "patches" from token -1 on
    assert not launches


def test_batch_chunks_give_the_maps_of_one_launch(interpret, monkeypatch):
    """With the offset limit lowered to split a tiny batch into one image per launch, the head max under a bias per
    image and the distance sums equal float64's (each chunk reads its own images, masks and output rows)."""
    monkeypatch.setattr(interpret, "OFFSET_LIMIT", 1100)  # q: 672 elements an image
    b, h, n, d = 3, 2, 21, 16
    q, k = (torch.randn(b, h, n, d) for _ in range(2))
    assert interpret._batch_chunks(b, dict(q=q)) == [(0, 1), (1, 2), (2, 3)]
    bias = torch.randn(b, 1, n, n)
    p = probs64(q, k, 0.25, bias)
    torch.testing.assert_close(interpret.fuse_heads_kernel(q, k, 0.25, "max", attn_mask=bias).double(),
                               fused64(p, "max"), rtol=0, atol=2e-6)
    dist = torch.rand(n - 1, n - 1) * 10
    check_distance(interpret.distance_sums_kernel(q, k, 0.25, dist, 1, attn_mask=bias), p, dist, 1)


def test_no_interpreter_leaks_into_this_process():
    """The parent process never sets ``TRITON_INTERPRET``: its kernels are built compiled (for a GPU)."""
    if CHILD:
        pytest.skip("parent process only")
    from vitviz.core.kernels import headmaps

    assert os.environ.get("TRITON_INTERPRET", "0") != "1" and not headmaps.interpreting()
    assert all(type(f).__name__ == "JITFunction" for f in headmaps._kernels())


# ---- CUDA: the compiled kernels on real shapes (pytest -m gpu; bench/gpu_run.sh) --------------------------------


def test_3xtf32_products_are_as_close_to_float64_as_float32_products():
    """Why float32 maps use 3xTF32 at head dims <= 64 (``headmaps._precision``): emulated here in PyTorch (TF32 =
    float32 rounded to 10 mantissa bits; ``a b ~ hi(a) hi(b) + hi(a) lo(b) + lo(a) hi(b)``), softmax probabilities on
    ViT-B/16 448 px shapes are as close to float64 as those of plain float32 products, and TF32 alone is not."""
    def tf32(x):
        return ((x.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)  # round to nearest, ties away

    def dot3(a, b):
        a_hi, b_hi = tf32(a), tf32(b)
        return a_hi @ tf32(b - b_hi) + tf32(a - a_hi) @ b_hi + a_hi @ b_hi

    torch.manual_seed(0)
    q, k = qk(1, 12, 785, 64, torch.float32)
    scale = 64 ** -0.5
    p64 = probs64(q, k, scale)
    err = {name: float(((s * scale).softmax(-1).double() - p64).abs().max()) for name, s in [
        ("fp32", q @ k.transpose(-1, -2)), ("3xtf32", dot3(q, k.transpose(-1, -2))),
        ("tf32", tf32(q) @ tf32(k).transpose(-1, -2))]}
    assert err["fp32"] < 2e-6 and err["3xtf32"] < 1.5 * err["fp32"], err
    assert err["tf32"] > 100 * err["3xtf32"], err


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "precision"), [(torch.float32, None), (torch.float32, "ieee"),
                                                   (torch.float16, None), (torch.bfloat16, None)],
                         ids=["fp32", "fp32-ieee", "fp16", "bf16"])
def test_cuda_kernel_on_vit_b16_448(dtype, precision):
    """ViT-B/16 at 448 px: N = 785, 12 heads of 64, batch 4; float32 scores in 3xTF32 (vitviz's choice at this head
    dim) and in 'ieee'. 1e-5 here, not the interpreter's 2e-6: on the GPU ``exp`` is ``ex2.approx`` of
    ``x log2 e`` (relative error ~1e-6 for arguments down to -20) and the tensor cores sum in another order."""
    from vitviz.core.kernels import headmaps

    assert not headmaps.interpreting()
    q, k = (t.cuda() for t in qk(4, 12, 785, 64, dtype))
    scale = 64 ** -0.5
    p = probs64(q.cpu(), k.cpu(), scale)
    for how in ("mean", "max", "min"):
        got = headmaps.fuse_heads_kernel(q, k, scale, how, precision=precision).cpu().double()
        torch.testing.assert_close(got, fused64(p, how), rtol=0, atol=1e-5)
    dist = torch.rand(784, 784, device="cuda") * 300
    wd, wp = (t.cpu().double() for t in headmaps.distance_sums_kernel(q, k, scale, dist, 1, precision=precision))
    want_wd, want_wp = distance64(p, dist.cpu(), 1)
    torch.testing.assert_close(wd, want_wd, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wp, want_wp, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_cuda_rollout_and_distance_memory_and_values():
    """Kernel path vs PyTorch path on CUDA (same rollout and distance), and its extra memory is at most the kept
    ``(L, B, N, N)`` float32 layer maps plus one layer's ``(B, N, N)``: no ``(B, H, N, N)``, no per-head buffers."""
    model = tiny_timm_vit(img_size=(224, 224), patch_size=16, embed_dim=192, num_heads=12, depth=4).cuda()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    with kernels.headmap_kernel("off"):
        want_r, want_d = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x, autocast=False)
    with kernels.headmap_kernel("on"):
        vitviz.attention_rollout(model, x)  # compile outside the measurement
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model(x)
        torch.cuda.synchronize()
        plain = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        got_r = vitviz.attention_rollout(model, x)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base - plain
        got_d = vitviz.mean_attention_distance(model, x, autocast=False)
    torch.testing.assert_close(got_r, want_r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_d, want_d, rtol=1e-4, atol=1e-3)
    n = 197
    assert extra <= (4 + 1) * 8 * n * n * 4 + (1 << 20), f"extra {extra / 2**20:.1f} MiB"


def _cuda_model(name: str):
    if name == "hf-vit":
        transformers = pytest.importorskip("transformers")
        config = transformers.ViTConfig(image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=4,
                                        num_attention_heads=12, intermediate_size=384)
        return transformers.ViTModel(config, add_pooling_layer=False)
    import timm

    return timm.create_model(name, pretrained=False, depth=4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["hf-vit", "eva02_tiny_patch14_224", "beit_base_patch16_224"])
def test_cuda_families_run_the_kernels(name):
    """A Hugging Face ViT (SDPA kept, ``hf_probes``), timm's EVA-02 (rotary ``EvaAttention``) and BEiT (relative
    position bias, q and k projected again) on CUDA: rollout and distance through the kernels by default, equal to
    the PyTorch stream path."""
    model = _cuda_model(name).cuda().eval()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    with kernels.headmap_kernel("off"):
        want_r, want_d = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x, autocast=False)
    from vitviz.core.kernels import headmaps

    calls = []
    original = headmaps.fuse_heads_kernel
    headmaps.fuse_heads_kernel = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    try:
        got_r = vitviz.attention_rollout(model, x)  # the kernels by default
        got_d = vitviz.mean_attention_distance(model, x, autocast=False)
    finally:
        headmaps.fuse_heads_kernel = original
    assert len(calls) == 4
    torch.testing.assert_close(got_r, want_r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_d, want_d, rtol=1e-4, atol=1e-3)


_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", "amp": "autocast-bf16"}
_FORWARD_LSE_CASES = [(d, f) for f in ("timm", "hf") for d in _DTYPES] + [("amp", "timm-qk-norm")]


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "family"), _FORWARD_LSE_CASES,
                         ids=[f"{_DTYPES[d]}-{f}" for d, f in _FORWARD_LSE_CASES])
def test_cuda_forward_lse_on_vit_b16(dtype, family, monkeypatch):
    """The CUDA branches of ``forward_lse`` on a ViT-B/16 at 448 px (N = 785, batch 2; timm's, 12 blocks, and a
    Hugging Face ``ViTModel``, 4 blocks, through its SDPA implementation): SDPA's own choice answered by the op that
    returns the log-sum-exp (flash in half precision, memory-efficient in float32), so the forward's output is the
    plain forward's bit for bit; every layer's log-sum-exp passes the check (no warning) and the fused maps are
    those of the kernels' own first pass. Where SDPA picks cuDNN attention, its op keeping the log-sum-exp is
    compared with SDPA once per configuration: every layer is answered where the outputs matched, none where not,
    and the output is the plain forward's either way. ``autocast-bf16``: a float32 model under ``torch.autocast`` (bfloat16),
    whose q, k and v come out of the autocast ``Linear`` in bfloat16. ``timm-qk-norm``: the same with qk-norm, whose
    ``LayerNorm`` CUDA autocast runs in float32: SDPA casts q and k to bfloat16, and so do ``sdpa_with_lse`` and the
    kernels (``kernels.sdpa_operands``), whose first layer's maps are the float64 maps of those casts."""
    import contextlib
    import warnings

    from torch.nn.attention import SDPBackend

    from vitviz.core.kernels import forward_lse

    monkeypatch.setattr(forward_lse, "_SAME", {})  # cuDNN's comparisons: this test's configuration only
    amp = dtype == "amp"
    dtype = torch.bfloat16 if amp else dtype
    q = torch.randn(2, 12, 785, 64, device="cuda", dtype=dtype)
    choice = SDPBackend(torch._fused_sdp_choice(q, q, q))
    if choice not in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        pytest.skip(f"SDPA picks {choice.name} here, which forward_lse leaves to SDPA (no log-sum-exp taken)")
    torch.manual_seed(0)
    if family == "timm":
        import timm

        model, depth = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=448), 12
    elif family == "timm-qk-norm":
        import timm

        model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=448, qk_norm=True, depth=4)
        depth, qk = 4, []
        for norm in (model.blocks[0].attn.q_norm, model.blocks[0].attn.k_norm):
            norm.register_forward_hook(lambda _m, _i, out: qk.append(out))
    else:
        transformers = pytest.importorskip("transformers")
        model = transformers.ViTModel(transformers.ViTConfig(image_size=448, num_hidden_layers=4,
                                                             attn_implementation="sdpa"), add_pooling_layer=False)
        depth = 4
    model = model.eval().cuda().to(torch.float32 if amp else dtype)
    x = torch.randn(2, 3, 448, 448, device="cuda", dtype=torch.float32 if amp else dtype)
    tensor = (lambda out: out) if family.startswith("timm") else (lambda out: out.last_hidden_state)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    with torch.no_grad(), autocast():
        plain = tensor(model(x))
    answered: list[bool] = []
    answer = forward_lse._answer  # what ForwardLSE calls for sdpa_with_lse's answer
    forward_lse._answer = lambda *a: (lambda got: answered.append(got is not None) or got)(answer(*a))
    try:
        with kernels.headmap_kernel("on"), autocast():
            with forward_lse.use_forward_lse(False):
                want, _ = _rollout_with_output(model, x)
            with forward_lse.use_forward_lse(True), warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                got, out = _rollout_with_output(model, x)
    finally:
        forward_lse._answer = answer
    if choice == SDPBackend.CUDNN_ATTENTION:  # answered only where cuDNN kept SDPA's output bit for bit (compared)
        same = set(forward_lse._SAME.values())  # this test's one configuration
        assert len(same) == 1 and answered == [same.pop()] * depth, (forward_lse._SAME, answered)
    else:
        assert answered == [True] * depth, answered  # every layer's call answered, none left to SDPA
    assert torch.equal(tensor(out), plain)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    if family == "timm-qk-norm":
        assert {t.dtype for t in qk} == {torch.float32}  # CUDA autocast's LayerNorm
        q, k = (t.bfloat16().double() for t in qk[:2])
        maps = (q @ k.transpose(-2, -1) * model.blocks[0].attn.scale).softmax(-1).mean(1)
        torch.testing.assert_close(want[0].double(), maps, rtol=0, atol=1e-5)


def test_the_sm90_table_covers_only_the_launches_the_sweep_measured(interpret, monkeypatch):
    """On sm_90, ``SM90_TABLE``'s tiles (rows and distance passes 64 x 64 with 4 warps, fusing pass 64 x 64 with 8
    warps, 128 x 64 in float32) at head dims <= 64 without a bias, mask or causal mask, in 3xTF32 or a half type;
    every other launch, and every other GPU, keeps the shared shapes."""
    monkeypatch.setattr(interpret, "interpreting", lambda: False)
    monkeypatch.delenv("VITVIZ_HEADMAP_BLOCKS", raising=False)
    table = interpret.SM90_TABLE

    def shape(dtype=torch.float32, kernel="rows", arch=90, d=64, precision="tf32x3", **kw):
        return interpret._blocks(d, dtype, interpret._precision(precision, dtype, d), arch=arch, kernel=kernel, **kw)

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert shape(dtype, "rows") == shape(dtype, "distance") == table["rows"] == (64, 64, 4, 3)
        assert shape(dtype, "fuse") == (table["fuse-fp32"] if dtype == torch.float32 else table["fuse"])
    assert table["fuse"] == (64, 64, 8, 3) and table["fuse-fp32"] == (128, 64, 8, 2)
    others = [shape(dtype, kernel, **kw) for dtype in (torch.bfloat16, torch.float32)
              for kernel in ("rows", "distance", "fuse")
              for kw in (dict(arch=None), dict(arch=80), dict(arch=89), dict(arch=100), dict(d=80), dict(bias_kind=1),
                         dict(bias_kind=2), dict(causal=True))]
    others += [shape(kernel=kernel, precision="ieee") for kernel in ("rows", "distance", "fuse")]
    assert not set(table.values()) & set(others), others
