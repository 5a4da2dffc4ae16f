"""``capture_attention(heads="stream")``: maps handed out one head at a time.

On timm's plain ``Attention`` the stream probe leaves the fused kernel running and recomputes each head from the
module's ``q`` and ``k``: its maps must equal the explicit path's (which ``tests/conformance.py`` checks against a
recomputation from the weights), the model's output must be the plain forward's bit for bit, and the module must
come back untouched. Below ``EXPLICIT_BELOW_BYTES`` per layer it runs the explicit path for that call instead; the
tests set the threshold to pick each path (``recompute`` / ``explicit``). Everywhere else the maps are wrapped.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    EVA_CASES,
    PARALLEL_CASES,
    RELATIVE_CASES,
    tiny_eva,
    tiny_parallel,
    tiny_relative,
    tiny_timm_vit,
)

import vitviz
from vitviz.analysis.distance import DistanceReducer, patch_distance_matrix
from vitviz.analysis.rollout import RolloutReducer, fuse_heads
from vitviz.core.capture import HeadMaps, capture_attention, open_probes
from vitviz.core.families import stream, timm_probes
from vitviz.errors import InputError


@pytest.fixture
def recompute(monkeypatch):
    """Every call recomputes (the tiny test models' maps are far below the default threshold; BEiT recomputes on
    CPU only when asked)."""
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    monkeypatch.setattr(stream, "REPROJECT_WITHOUT_KERNEL", True)


def full_maps(model, x):
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    return [a.clone() for a in cap.attentions]


def stream_maps(model, x, kinds=None):
    got: list[torch.Tensor] = []

    def keep(_i, hm):
        assert isinstance(hm, HeadMaps)
        if kinds is not None:
            kinds.append(hm._head.__qualname__)
        got.append(torch.stack([m.clone() for _, m in hm.heads()], dim=1))

    with torch.no_grad(), capture_attention(model, on_layer=keep, store=False, heads="stream"):
        out = model(x)
    return got, out


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [t.shape for t in a] == [t.shape for t in b]
    return max(float((s - t).abs().max()) for s, t in zip(a, b))


@pytest.mark.parametrize("kwargs", [{}, {"qk_norm": True}, {"class_token": False, "global_pool": "avg"},
                                    {"reg_tokens": 2}])
def test_stream_maps_equal_the_explicit_maps_and_the_output_is_the_plain_forward(kwargs, recompute):
    model = tiny_timm_vit(**kwargs)
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        plain = model(x)
    kinds: list[str] = []
    got, out = stream_maps(model, x, kinds)
    assert kinds and all("recomputed_heads" in k for k in kinds)  # the stream probe recomputed every layer
    assert max_difference(got, full_maps(model, x)) < 1e-6
    assert torch.equal(out, plain)  # the fused kernel ran: not one bit of the output changed
    assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
    assert open_probes(model) == 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_small_maps_take_the_explicit_path_for_that_call_only(monkeypatch):
    model = tiny_timm_vit()
    x1, x8 = torch.randn(1, 3, 32, 48), torch.randn(8, 3, 32, 48)
    per_image = 2 * 25 * 25 * 4  # heads x tokens^2 x float32
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 4 * per_image)  # 1 image: explicit; 8: recomputed
    fused_during: list[bool] = []
    kinds: list[str] = []

    def keep(_i, hm):
        kinds.append(hm._head.__qualname__)
        fused_during.append(model.blocks[0].attn.fused_attn)
        for _ in hm.heads():
            pass

    with torch.no_grad(), capture_attention(model, on_layer=keep, store=False, heads="stream"):
        model(x1)
        model(x8)
    assert ["HeadMaps.of" in k for k in kinds] == [True, True, False, False]
    assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))  # restored after each call
    got, _ = stream_maps(model, x1)
    assert max_difference(got, full_maps(model, x1)) == 0.0  # the explicit path's own maps
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_broken_recomputation_is_caught(monkeypatch, recompute):
    """The comparison above fails when the recomputation is wrong (here: the scale left out)."""
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    want = full_maps(model, x)
    original = timm_probes._recomputed_heads

    class Unscaled:
        def __init__(self, module):
            self.__dict__.update(num_heads=module.num_heads)
            self.scale = 1.0

    monkeypatch.setattr(timm_probes, "_recomputed_heads",
                        lambda vt, module, q, k, mask, causal, *rest: original(vt, Unscaled(module), q, k, mask,
                                                                             causal, *rest))
    got, _ = stream_maps(model, x)
    assert max_difference(got, want) > 1e-3


def _explicit(module, x, **kwargs):
    from vitviz.core.families.probes import probe_attn_drop

    out: list[torch.Tensor] = []
    undo = probe_attn_drop(module, out.append)
    try:
        with torch.no_grad():
            module(x, **kwargs)
    finally:
        undo()
    return out[0]


def _streamed(module, x, *args, **kwargs):
    out: list[HeadMaps] = []
    undo = timm_probes.probe_timm_stream(module, out.append)
    try:
        with torch.no_grad():
            y = module(x, *args, **kwargs)
        full = torch.stack([m.clone() for _, m in out[0].heads()], dim=1)
    finally:
        undo()
    assert "recomputed_heads" in out[0]._head.__qualname__  # recomputed beside the fused kernel
    return full, y


@pytest.mark.parametrize("mask", ["bool", "float", "per-head", "causal"])
def test_masks_follow_timms_explicit_path(mask, recompute):
    from timm.models.vision_transformer import Attention

    module = Attention(16, num_heads=4).eval()
    x = torch.randn(2, 9, 16)
    if mask == "bool":
        keep = torch.rand(2, 1, 9, 9) > 0.3
        keep |= torch.eye(9, dtype=torch.bool)  # no row without a key
        kwargs = {"attn_mask": keep}
    elif mask == "float":
        kwargs = {"attn_mask": torch.randn(9, 9)}
    elif mask == "per-head":
        kwargs = {"attn_mask": torch.randn(2, 4, 9, 9)}
    else:
        kwargs = {"is_causal": True}
    want = _explicit(module, x, **kwargs)
    got, _ = _streamed(module, x, **kwargs)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_reduced_precision_maps_are_float32_softmax_of_the_model_dtype_scores(recompute):
    model = tiny_timm_vit().to(torch.bfloat16)
    x = torch.randn(2, 3, 32, 48, dtype=torch.bfloat16)
    got, _ = stream_maps(model, x)
    want = full_maps(model, x)  # timm's explicit path: bf16 softmax
    assert all(g.dtype == torch.float32 for g in got)
    torch.testing.assert_close(got[0].sum(-1), torch.ones_like(got[0].sum(-1)), atol=1e-5, rtol=0)
    assert max_difference(got, [w.float() for w in want]) < 1e-2  # bf16 rounding of the explicit maps


def test_other_modules_are_wrapped_as_they_come():
    from timm.models.cait import Cait

    model = Cait(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    kinds: list[str] = []
    got, _ = stream_maps(model, x, kinds)
    assert kinds and not any("recomputed_heads" in k for k in kinds)
    assert max_difference(got, full_maps(model, x)) == 0.0


# ---- timm relative-position attention: BEiT Attention and RelPosAttention ---------------------------------------


def test_beit_reads_its_explicit_maps_where_no_kernel_serves_the_call(monkeypatch):
    """BEiT's q and k must be projected once more; on the CPU its explicit path is cheaper (1.02x against 1.23x a
    plain forward, docs/benchmarks.md), so by default it runs there; relative-position attention, whose q and k
    the probe reads, still recomputes."""
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    x = torch.randn(2, 3, 32, 48)
    for case, recomputed in (("beit", False), ("relpos-mlp", True)):
        model = tiny_relative(case)
        kinds: list[str] = []
        got, _ = stream_maps(model, x, kinds)
        assert len(kinds) == 2 and all(("recomputed_heads" in k) == recomputed for k in kinds), (case, kinds)
        assert max_difference(got, full_maps(model, x)) < 1e-6
        assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("case", ["beit", "beit-separate-bias", "beit-without-qkv-bias", "multihead-attention"])
def test_reprojected_q_and_k_are_the_forwards_bit_for_bit(monkeypatch, recompute, case, autocast):
    """BEiT and ``nn.MultiheadAttention`` hide their q and k, so the stream probe projects them again: by the whole
    packed projection, called as the forward calls it, so they are the q and k the forward's SDPA call receives, bit
    for bit. (Projecting only the q and k rows, at ViT-B/16's width, 768, gave other q and k in the last bit under
    bfloat16 autocast on the CPU, and with ``qkv_bias_separate`` in float32 too.) ``nn.MultiheadAttention`` calls
    SDPA in Python only off its inference fast path (one ATen op), which CUDA autocast leaves, and gradients being
    recorded here."""
    from conformance import randomise_zero_biases
    from timm.models.beit import Beit

    torch.manual_seed(0)
    if case == "multihead-attention":
        module = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()
        x = torch.randn(4, 197, 768)
        run = lambda: module(x, x, x, need_weights=False)  # noqa: E731
        probe = stream.probe_mha_stream
    else:
        model = Beit(img_size=224, patch_size=16, embed_dim=768, depth=1, num_heads=12, num_classes=3,
                     use_rel_pos_bias=True, use_abs_pos_emb=False, qkv_bias=case != "beit-without-qkv-bias").eval()
        randomise_zero_biases(model)
        module = model.blocks[0].attn
        module.qkv_bias_separate = case == "beit-separate-bias"
        x = torch.randn(4, 197, 768)
        run = lambda: module(x)  # noqa: E731
        probe = timm_probes.probe_timm_stream
    read: list[tuple[torch.Tensor, torch.Tensor]] = []
    given: list[tuple[torch.Tensor, torch.Tensor]] = []  # what the forward's SDPA call receives
    recomputed, sdpa = stream.recomputed_heads, torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(stream, "recomputed_heads", lambda q, k, *a, **kw: read.append((q, k)) or recomputed(
        q, k, *a, **kw))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda q, k, *a, **kw: given.append(
        (q.clone(), k.clone())) or sdpa(q, k, *a, **kw))
    emitted: list[HeadMaps] = []
    undo = probe(module, emitted.append)
    try:
        # nn.MultiheadAttention: gradients on keep it off its fast path, as CUDA autocast does
        with torch.set_grad_enabled(case == "multihead-attention"), torch.autocast("cpu", dtype=torch.bfloat16,
                                                                                  enabled=autocast):
            run()
    finally:
        undo()
    assert len(read) == len(given) == len(emitted) == 1
    (q, k), (want_q, want_k) = read[0], given[0]
    assert q.dtype == want_q.dtype == (torch.bfloat16 if autocast else torch.float32)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


@pytest.mark.parametrize(("case", "broken"), [("beit", "bias left out"), ("beit-shared-bias", "bias left out"),
                                              ("relpos-mlp", "bias left out"), ("relpos-shared", "bias left out"),
                                              ("beit", "q_bias left out")])
def test_a_broken_relative_recomputation_is_caught(monkeypatch, recompute, case, broken):
    model = tiny_relative(case)
    x = torch.randn(2, 3, 32, 48)
    want = full_maps(model, x)
    if broken == "bias left out":
        monkeypatch.setattr(timm_probes, "_relative_bias", lambda kind, module, shared: None)
    else:
        original = timm_probes._beit_qk

        def without_q_bias(module, x):
            q_bias, module.q_bias = module.q_bias, None
            try:
                return original(module, x)
            finally:
                module.q_bias = q_bias

        monkeypatch.setattr(timm_probes, "_beit_qk", without_q_bias)
    got, _ = stream_maps(model, x)
    assert max_difference(got, want) > 1e-3


# ---- timm rotary attention: EvaAttention and AttentionRope -------------------------------------------------------

@pytest.mark.parametrize("case", [*EVA_CASES, *RELATIVE_CASES])
def test_rotary_and_relative_stream_maps_equal_the_explicit_maps_and_the_output_is_the_plain_forward(case,
                                                                                                    recompute):
    model = tiny_eva(**EVA_CASES[case]) if case in EVA_CASES else tiny_relative(case)
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        plain = model(x)
    kinds: list[str] = []
    got, out = stream_maps(model, x, kinds)
    assert len(kinds) == 2 and all("recomputed_heads" in k for k in kinds)
    assert max_difference(got, full_maps(model, x)) < 1e-6
    assert torch.equal(out, plain)
    assert open_probes(model) == 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))


@pytest.mark.parametrize("broken", ["rope left out", "half rotation flipped", "keys not rotated"])
def test_a_broken_rotary_recomputation_is_caught(monkeypatch, recompute, broken):
    """The comparison above fails when the rotation is wrong: skipped, in the other layout, or on q alone."""
    model = tiny_eva(**EVA_CASES["rope-half-registers"])
    x = torch.randn(2, 3, 32, 48)
    want = full_maps(model, x)
    original = timm_probes._rotated

    calls: list[int] = []

    class Flipped:
        def __init__(self, module):
            self.num_prefix_tokens = module.num_prefix_tokens
            self.rotate_half = not module.rotate_half if broken == "half rotation flipped" else module.rotate_half

    def rotated(vt, module, t, rope, dtype):
        calls.append(1)
        if broken == "rope left out" or (broken == "keys not rotated" and len(calls) % 2 == 0):  # q, then k
            return t.to(dtype)
        return original(vt, Flipped(module), t, rope, dtype)

    monkeypatch.setattr(timm_probes, "_rotated", rotated)
    got, _ = stream_maps(model, x)
    assert max_difference(got, want) > 1e-3


@pytest.mark.parametrize("mask", ["bool", "float", "causal"])
def test_rotary_masks_follow_timms_explicit_path(mask, recompute):
    from timm.layers import RotaryEmbeddingCat
    from timm.models.eva import EvaAttention

    torch.manual_seed(0)
    module = EvaAttention(16, num_heads=2, num_prefix_tokens=1, scale_norm=False).eval()
    rope = RotaryEmbeddingCat(8, in_pixels=False, feat_shape=[2, 4]).get_embed()  # 8 patches + 1 prefix token
    x = torch.randn(2, 9, 16)
    kwargs: dict = {"rope": rope}
    if mask == "bool":
        keep = torch.rand(2, 1, 9, 9) > 0.3
        kwargs["attn_mask"] = keep | torch.eye(9, dtype=torch.bool)
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(9, 9)
    else:
        kwargs["is_causal"] = True
    want = _explicit(module, x, **kwargs)
    got, _ = _streamed(module, x, **kwargs)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    got_positional, _ = _streamed(module, x, rope, kwargs.get("attn_mask"), kwargs.get("is_causal", False))
    torch.testing.assert_close(got_positional, want, atol=1e-6, rtol=1e-5)


def test_rotary_reduced_precision_maps_are_float32_softmax_of_the_model_dtype_scores(recompute):
    model = tiny_eva(**EVA_CASES["eva02"]).to(torch.bfloat16)
    x = torch.randn(2, 3, 32, 48, dtype=torch.bfloat16)
    got, _ = stream_maps(model, x)
    want = full_maps(model, x)  # timm's explicit path: bf16 softmax
    assert all(g.dtype == torch.float32 for g in got)
    assert max_difference(got, [w.float() for w in want]) < 1e-2  # bf16 rounding of the explicit maps


# ---- timm parallel and differential attention: ParallelScalingBlock, DiffAttention, DiffParallelScalingBlock -----

@pytest.mark.parametrize("case", PARALLEL_CASES)
def test_parallel_and_differential_stream_maps_equal_the_explicit_maps_and_the_output_is_the_plain_forward(case,
                                                                                                         recompute):
    """``ParallelScalingBlock`` (q and k read at ``q_norm`` / ``k_norm`` in ``(B, N, H, d)``) and differential
    attention (``S_2h - lambda S_2h+1`` from ``2 H`` recomputed heads) against the explicit path's maps, which
    ``tests/conformance.py`` checks against a recomputation from the weights."""
    model = tiny_parallel(case)
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        plain = model(x)
    kinds: list[str] = []
    got, out = stream_maps(model, x, kinds)
    want = "differential_heads" if "differential" in case else "recomputed_heads"
    assert len(kinds) == 2 and all(want in k for k in kinds), kinds
    assert max_difference(got, full_maps(model, x)) < 1e-6
    assert torch.equal(out, plain)
    assert open_probes(model) == 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))


@pytest.mark.parametrize("case", ["differential", "differential-parallel"])
def test_small_differential_maps_take_the_explicit_path_and_are_combined(case):
    """Below ``EXPLICIT_BELOW_BYTES`` the explicit path's ``(B, 2H, N, N)`` maps are read and combined per pair."""
    model = tiny_parallel(case)
    x = torch.randn(2, 3, 32, 48)
    kinds: list[str] = []
    got, _ = stream_maps(model, x, kinds)
    assert kinds and all(k.startswith("HeadMaps.of") for k in kinds)  # the explicit maps, not recomputed
    assert [tuple(g.shape) for g in got] == [(2, 2, 25, 25)] * 2
    assert max_difference(got, full_maps(model, x)) < 1e-6
    assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))  # restored after the call


@pytest.mark.parametrize("broken", ["lambda left out", "pair order swapped", "heads paired by halves"])
def test_a_broken_differential_recomputation_is_caught(monkeypatch, recompute, broken):
    """The comparison above fails when the pairs or lambda are wrong: heads ``(2h, 2h + 1)`` are one head's pair (the
    forward's ``reshape(B, H, 2, N, d)``), not ``(h, h + H)``."""
    model = tiny_parallel("differential", num_heads=4)
    x = torch.randn(2, 3, 32, 48)
    want = full_maps(model, x)
    original = stream.differential_heads

    def differential_heads(q, k, scale, bias, lam, **kwargs):
        h2 = q.shape[1]
        if broken == "lambda left out":
            lam = torch.zeros_like(lam)
        order = {"pair order swapped": [j ^ 1 for j in range(h2)],
                 "heads paired by halves": [j // 2 + (j % 2) * (h2 // 2) for j in range(h2)]}.get(broken)
        if order is not None:
            q, k = q[:, order], k[:, order]
        return original(q, k, scale, bias, lam, **kwargs)

    monkeypatch.setattr(stream, "differential_heads", differential_heads)
    got, _ = stream_maps(model, x)
    assert max_difference(got, want) > 1e-3


@pytest.mark.parametrize("mask", ["bool", "float", "causal"])
@pytest.mark.parametrize("cls", ["ParallelScalingBlock", "DiffAttention"])
def test_parallel_and_differential_masks_follow_timms_explicit_path(mask, cls, recompute):
    from timm.layers.diff_attention import DiffAttention
    from timm.models.vision_transformer import ParallelScalingBlock

    torch.manual_seed(0)
    module = (ParallelScalingBlock(16, num_heads=2) if cls == "ParallelScalingBlock"
              else DiffAttention(16, num_heads=2, depth=1)).eval()
    x = torch.randn(2, 9, 16)
    kwargs: dict = {}
    if mask == "bool":
        kwargs["attn_mask"] = (torch.rand(2, 1, 9, 9) > 0.3) | torch.eye(9, dtype=torch.bool)
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(9, 9)
    else:
        kwargs["is_causal"] = True
    want = _explicit(module, x, **kwargs)
    if cls == "DiffAttention":  # the explicit path's (B, 2H, N, N) softmax maps, combined as its forward does
        with torch.no_grad():
            want = want[:, 0::2] - module._compute_lambda() * want[:, 1::2]
    out: list[HeadMaps] = []
    undo = timm_probes.probe_timm_stream(module, out.append)
    try:
        with torch.no_grad():
            module(x, **kwargs)
        got = torch.stack([m.clone() for _, m in out[0].heads()], dim=1)
    finally:
        undo()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_subclasses_of_the_streamed_classes_are_not_streamed():
    from timm.models.eva import EvaAttention

    class Mine(EvaAttention):
        pass

    assert timm_probes.stream_probe_for(Mine(16, num_heads=2, scale_norm=False)) is None
    assert timm_probes.stream_probe_for(EvaAttention(16, num_heads=2, scale_norm=False)) is timm_probes.probe_timm_stream


def test_stream_needs_on_layer_and_no_store():
    model = tiny_timm_vit()
    with pytest.raises(InputError, match="heads='sideways' is not understood"):
        with capture_attention(model, heads="sideways"):
            pass
    with pytest.raises(InputError, match="pass on_layer=fn and store=False"):
        with capture_attention(model, heads="stream"):
            pass
    with pytest.raises(InputError, match="pass on_layer=fn and store=False"):
        with capture_attention(model, on_layer=lambda i, a: None, store=False, heads="stream", retain_grad=True):
            pass
    assert open_probes(model) == 0


@pytest.mark.parametrize("threshold", [0, 1 << 40])
def test_module_restored_when_the_body_raises(monkeypatch, threshold):
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", threshold)
    model = tiny_timm_vit()
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(model, on_layer=lambda i, a: None, store=False, heads="stream"):
            model(torch.randn(1, 3, 32, 48))
            raise RuntimeError("boom")
    assert open_probes(model) == 0
    assert all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_fusing_streamed_heads_equals_fusing_the_tensor(fusion):
    a = torch.randn(3, 4, 7, 7).softmax(-1)
    torch.testing.assert_close(fuse_heads(HeadMaps.of(a), fusion), fuse_heads(a, fusion))
    out = torch.empty(3, 7, 7)
    assert fuse_heads(HeadMaps.of(a), fusion, out=out) is out


@pytest.mark.parametrize("threshold", [0, 1 << 40])
def test_reductions_fed_streamed_heads_equal_those_fed_tensors(monkeypatch, threshold):
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", threshold)
    model = tiny_timm_vit(depth=3)
    x = torch.randn(2, 3, 32, 48)
    maps = full_maps(model, x)
    spec = vitviz.inspect(model)
    a = RolloutReducer(num_prefix_tokens=1, assume_stochastic=True)
    d = DistanceReducer(3, 2, 1, patch_distance_matrix((4, 6), 8))
    for i, m in enumerate(maps):
        a(i, m)
        d(i, m)
    torch.testing.assert_close(vitviz.attention_rollout(model, x, return_full=True), a.rollout, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(vitviz.mean_attention_distance(model, x), d.result(), atol=1e-5, rtol=1e-6)
    assert spec.num_heads == 2


def _largest_allocation(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)


def test_rollout_and_distance_never_allocate_a_batch_heads_tokens_tokens_tensor(recompute):
    """With 16 heads over 26 tokens, one (B, H, N, N) float32 map is the largest tensor a forward could make."""
    model = tiny_timm_vit(img_size=(40, 40), patch_size=8, embed_dim=16, num_heads=16)
    x = torch.randn(4, 3, 40, 40)
    bhnn = 4 * 16 * 26 * 26 * 4

    def full():
        with torch.no_grad(), capture_attention(model, on_layer=lambda i, a: None, store=False):
            model(x)

    assert _largest_allocation(full) >= bhnn  # the measurement sees the explicit path's maps
    assert _largest_allocation(lambda: vitviz.attention_rollout(model, x)) < bhnn
    assert _largest_allocation(lambda: vitviz.mean_attention_distance(model, x)) < bhnn


@pytest.mark.gpu
def test_stream_on_cuda_matches_cpu_and_holds_no_batch_heads_tokens_tokens_tensor(recompute):
    model = tiny_timm_vit(img_size=(64, 64), patch_size=4, embed_dim=32, num_heads=8, depth=2)  # N = 257
    x = torch.randn(4, 3, 64, 64)
    want_r, want_d = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    model, xc = model.cuda(), x.cuda()
    torch.testing.assert_close(vitviz.attention_rollout(model, xc).cpu(), want_r, atol=1e-4, rtol=1e-3)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got_d = vitviz.mean_attention_distance(model, xc, autocast=False)  # float32, as the CPU reference
    torch.cuda.synchronize()
    torch.testing.assert_close(got_d, want_d, atol=1e-3, rtol=1e-4)
    assert torch.cuda.max_memory_allocated() - base < 4 * 8 * 257 * 257 * 4  # one (B, H, N, N) float32 map


# ---- torchvision: nn.MultiheadAttention (stream.probe_mha_stream) ----------------------------------------------


def tiny_torchvision_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64).eval()


@pytest.mark.parametrize("threshold", [0, 1 << 62], ids=["recomputed", "explicit"])
def test_torchvision_stream_maps_equal_its_weights_and_the_forward_is_untouched(monkeypatch, threshold):
    monkeypatch.setattr(stream, "REPROJECT_WITHOUT_KERNEL", True)  # on CPU: recomputed only when asked
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", threshold)
    model = tiny_torchvision_vit()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        plain = model(x)
    kinds: list[str] = []
    got, out = stream_maps(model, x, kinds)
    want = full_maps(model, x)  # probe_mha: need_weights=True, per head
    assert max_difference(got, want) < 1e-6
    assert kinds and all(("recomputed_heads" in k) == (threshold == 0) for k in kinds)
    assert torch.equal(out, plain)  # the forward ran as torchvision calls it (need_weights=False)
    assert all(not m._forward_hooks and not m._forward_pre_hooks and "forward" not in vars(m) for m in model.modules())


def test_torchvision_broken_recomputation_is_caught(monkeypatch):
    """The comparison above fails when the recomputation is wrong (here: q and k swapped, the maps transposed)."""
    monkeypatch.setattr(stream, "REPROJECT_WITHOUT_KERNEL", True)
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    model = tiny_torchvision_vit()
    x = torch.randn(2, 3, 32, 32)
    want = full_maps(model, x)
    original = stream.recomputed_heads
    monkeypatch.setattr(stream, "recomputed_heads", lambda q, k, *a, **kw: original(k, q, *a, **kw))
    got, _ = stream_maps(model, x)
    assert max_difference(got, want) > 1e-3


def test_torchvision_calls_with_masks_read_the_weights():
    """A call the recomputation does not cover (here an attention mask) runs with ``need_weights=True`` for that
    call and hands on the module's own per-head weights."""
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 7, 16)
    mask = torch.rand(7, 7) > 0.5
    mask.fill_diagonal_(False)  # True = not allowed (nn.MultiheadAttention's bool mask)
    assert stream.mha_stream_probe_for(mha) is stream.probe_mha_stream
    got: list = []
    undo = stream.probe_mha_stream(mha, got.append)
    try:
        with torch.no_grad():
            out, weights = mha(x, x, x, attn_mask=mask, need_weights=False)
    finally:
        undo()
    with torch.no_grad():
        want_out, want = mha(x, x, x, attn_mask=mask, average_attn_weights=False)
    assert weights is not None and len(got) == 1 and not got[0]._head.__qualname__.startswith("recomputed")
    torch.testing.assert_close(got[0].full(), want, rtol=0, atol=0)
    torch.testing.assert_close(out, want_out)
    assert not mha._forward_hooks and not mha._forward_pre_hooks
    assert stream.mha_stream_probe_for(torch.nn.MultiheadAttention(16, 2)) is None  # not batch-first


def test_torchvision_on_cpu_reads_the_weights_by_default():
    """Without the kernels the stream probe reads ``need_weights=True`` weights (cheaper on CPU than recomputing)."""
    model = tiny_torchvision_vit()
    kinds: list[str] = []
    with vitviz.headmap_kernel("off"):
        got, _ = stream_maps(model, torch.randn(2, 3, 32, 32), kinds)
    assert kinds and not any("recomputed_heads" in k for k in kinds)


def test_the_forward_signature_is_read_once_per_class_and_afresh_for_an_instance_forward():
    """The stream probe binds each call's arguments with the module's ``forward`` signature, read once per class
    function; a ``forward`` set on the instance is read as it is."""
    import inspect as pyinspect

    model = tiny_timm_vit()
    first, second = model.blocks[0].attn, model.blocks[1].attn
    assert timm_probes._forward_signature(first) == pyinspect.signature(first.forward)
    assert timm_probes._forward_signature(first) is timm_probes._forward_signature(second)

    def own(tokens, rope=None):
        return tokens

    second.forward = own
    assert list(timm_probes._forward_signature(second).parameters) == ["tokens", "rope"]
    assert list(timm_probes._forward_signature(first).parameters)[0] == "x"


def test_a_forward_set_on_the_instance_is_not_recomputed(recompute):
    """A timm ``Attention`` whose instance was given a forward of its own (here: ``softmax(3 q k^T * scale)``)
    computes what the recomputation from ``q_norm`` / ``k_norm`` and ``scale`` does not know: its maps are read where
    its softmax reaches ``attn_drop`` (the full probe's, wrapped), equal to the full capture's and to ``3 q k^T``,
    not to ``q k^T``; the instance's forward stays."""
    import types

    def tempered(self, x, attn_mask=None, is_causal=False):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        attn = self.attn_drop((q @ k.transpose(-2, -1) * self.scale * 3.0).softmax(-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))

    torch.manual_seed(0)
    model = tiny_timm_vit()
    attn = model.blocks[1].attn
    attn.forward = types.MethodType(tempered, attn)
    fused = attn.fused_attn
    x = torch.randn(2, 3, 32, 48)
    seen: list[torch.Tensor] = []
    handle = attn.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        got, _ = stream_maps(model, x)
    finally:
        handle.remove()
    assert max_difference(got, full_maps(model, x)) < 1e-6
    with torch.no_grad():
        q, k, _ = attn.qkv(seen[0]).reshape(2, -1, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        logits = (q.double() @ k.double().transpose(-2, -1)) * attn.scale
    torch.testing.assert_close(got[1].double(), (3.0 * logits).softmax(-1), atol=1e-5, rtol=1e-4)
    assert vars(attn)["forward"].__func__ is tempered and attn.fused_attn == fused
    assert open_probes(model) == 0
