"""``vitviz.core.kernels.forward_lse``: the row log-sum-exp taken from the forward's own fused attention call.

On CPU SDPA picks its flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``), so the op and its
log-sum-exp are checked here against SDPA (bit for bit) and float64; the calls it must leave to SDPA return None.
The kernels' use of it runs under Triton's interpreter (``tests/test_headmap_kernel.py``); the CUDA branches run in
the ``gpu`` tests.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_timm_vit

from vitviz.core import kernels
from vitviz.core.capture import capture_attention
from vitviz.core.families import stream
from vitviz.core.kernels import forward_lse
from vitviz.errors import InputError


def qkv(dtype=torch.float32, b=2, h=3, n=37, d=16):
    torch.manual_seed(0)
    return [torch.randn(b, h, n, d).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_the_output_is_sdpas_bit_for_bit_and_the_lse_that_of_its_scores(dtype, causal):
    q, k, v = qkv(dtype)
    got = forward_lse.sdpa_with_lse(q, k, v, is_causal=causal, scale=0.3)
    assert got is not None
    out, lse = got
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3))
    s = q.double() @ k.double().transpose(-2, -1) * 0.3
    if causal:
        s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 37)
    # half precision: the CPU kernel rounds the scaled scores to the input dtype (6e-5 seen), well inside ``ATOL``
    atol = 1e-5 if dtype == torch.float32 else forward_lse.ATOL / 4
    torch.testing.assert_close(lse.double(), s.logsumexp(-1), rtol=0, atol=atol)


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16])
def test_sdpa_operands_are_what_sdpa_computes_with(autocast):
    """Under autocast SDPA casts each floating-point argument but float64 (``q``, ``k``, ``v``, a float mask) to the
    autocast dtype: its output is SDPA's on ``kernels.sdpa_operands`` without autocast, bit for bit. Outside autocast,
    and for None and bool masks, nothing is cast."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        q, k, v = qkv(dtype)
        bias = torch.randn(37, 37).to(dtype)
        with torch.autocast("cpu", dtype=autocast):
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            cast = kernels.sdpa_operands(q, k, v, bias)
        assert {t.dtype for t in cast} == {want.dtype} == {torch.float64 if dtype == torch.float64 else autocast}
        assert torch.equal(F.scaled_dot_product_attention(*cast[:3], attn_mask=cast[3]), want)
    keep = torch.ones(37, 37, dtype=torch.bool)
    with torch.autocast("cpu", dtype=autocast):
        assert kernels.sdpa_operands(None, keep)[0] is None and kernels.sdpa_operands(None, keep)[1] is keep
    assert all(a is b for a, b in zip(kernels.sdpa_operands(q, k, bias), (q, k, bias)))


def test_under_autocast_the_answer_is_that_of_sdpas_casts():
    """Under autocast the ATen op is not cast by autocast, so ``sdpa_with_lse`` casts ``q``, ``k`` and ``v`` as SDPA's
    autocast does: float32 inputs give SDPA's bfloat16 output bit for bit, and the log-sum-exp of the bfloat16
    casts' scores."""
    q, k, v = qkv()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.scaled_dot_product_attention(q, k, v)
        for inputs in ((q, k, v), (q, k, v.bfloat16()), (q.bfloat16(), k.bfloat16(), v.bfloat16())):
            out, lse = forward_lse.sdpa_with_lse(*inputs)
            assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    s = q.bfloat16().double() @ k.bfloat16().double().transpose(-2, -1) * 16 ** -0.5
    torch.testing.assert_close(lse.double(), s.logsumexp(-1), rtol=0, atol=forward_lse.ATOL / 4)


@pytest.mark.parametrize("case", ["mask", "dropout", "gradients", "grouped keys", "head dim 12", "3-d"])
def test_calls_it_cannot_answer_alike_are_left_to_sdpa(case):
    q, k, v = qkv()
    kwargs: dict = {}
    if case == "mask":
        kwargs["attn_mask"] = torch.ones(37, 37, dtype=torch.bool)
    elif case == "dropout":
        kwargs["dropout_p"] = 0.1
    elif case == "gradients":
        q.requires_grad_(True)
    elif case == "grouped keys":
        k, v = k[:, :1], v[:, :1]
    elif case == "head dim 12":
        q, k, v = qkv(d=12)
    else:
        q, k, v = q[0], k[0], v[0]
    assert forward_lse.sdpa_with_lse(q, k, v, **kwargs) is None


def test_the_mode_answers_one_call_and_gives_up_on_a_second():
    q, k, v = qkv()
    with forward_lse.ForwardLSE() as mode:
        out = F.scaled_dot_product_attention(q, k, v)
        torch.add(q, 1)  # other functions pass through
    assert mode.calls == 1 and mode.lse is not None
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    with forward_lse.ForwardLSE() as mode:
        F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(q, k, v)
    assert mode.calls == 2 and mode.lse is None


def test_a_wrong_lse_fails_the_check_and_warns_once(monkeypatch):
    q, k, _ = qkv()
    lse = (q @ k.transpose(-2, -1) * 0.25).logsumexp(-1)
    monkeypatch.setattr(forward_lse, "_warned", [])
    assert forward_lse.checked(lse, q, k, 0.25) is lse
    with pytest.warns(RuntimeWarning, match="log-sum-exp"):
        assert forward_lse.checked(lse + 0.01, q, k, 0.25) is None
    assert forward_lse.checked(lse.transpose(1, 2).reshape(2, 3, 37), q, k, 0.25) is None  # another layout
    assert forward_lse.checked(lse[:, :1], q, k, 0.25) is None


def test_a_module_that_passed_is_trusted_for_the_same_configuration_only(monkeypatch):
    """``checked(owner=, config=)``: after one pass, the same module and configuration skip the recomputation (a wrong
    value would now go through: what is trusted is the configuration); another scale, shape, configuration or
    module is checked again, and a failed check is not remembered."""
    q, k, v = qkv()
    with forward_lse.ForwardLSE() as mode:
        F.scaled_dot_product_attention(q, k, v, scale=0.25)
    lse, config = mode.lse, mode.config
    assert config is not None and config[-2:] == (False, 0.25)
    owner, other = torch.nn.Identity(), torch.nn.Identity()
    monkeypatch.setattr(forward_lse, "_warned", [True])  # no warning in this test
    gaps: list[float] = []
    gap = forward_lse._gap
    monkeypatch.setattr(forward_lse, "_gap", lambda *a: (lambda g: gaps.append(g) or g)(gap(*a)))
    assert forward_lse.checked(lse + 0.01, q, k, 0.25, owner=owner, config=config) is None  # failed: not remembered
    assert forward_lse.checked(lse, q, k, 0.25, owner=owner, config=config) is lse
    assert len(gaps) == 2
    wrong = lse + 0.01
    assert forward_lse.checked(wrong, q, k, 0.25, owner=owner, config=config) is wrong  # trusted: no recomputation
    assert len(gaps) == 2
    assert forward_lse.checked(wrong, q, k, 0.3, owner=owner, config=config) is None  # another scale
    assert forward_lse.checked(wrong, q, k, 0.25, owner=other, config=config) is None  # another module
    assert forward_lse.checked(wrong, q, k, 0.25, owner=owner, config=(*config[:-1], 0.3)) is None
    assert forward_lse.checked(wrong[:1], q[:1], k[:1], 0.25, owner=owner, config=config) is None  # another batch
    assert forward_lse.checked(wrong, q, k, 0.25) is None  # no owner: always checked
    assert len(gaps) == 7


def test_inside_a_cuda_graph_capture_an_unchecked_configuration_is_not_checked(monkeypatch):
    """While a CUDA graph is captured (``vitviz.graphed``) no value can be read: ``checked`` then trusts what it
    verified before (the recording's warm-up runs) and answers None for anything else, without the recomputation
    (the kernels make their own first pass); outside a capture it checks as always."""
    q, k, v = qkv()
    with forward_lse.ForwardLSE() as mode:
        F.scaled_dot_product_attention(q, k, v, scale=0.25)
    lse, config = mode.lse, mode.config
    owner = torch.nn.Identity()
    gaps: list[float] = []
    gap = forward_lse._gap
    monkeypatch.setattr(forward_lse, "_gap", lambda *a: (lambda g: gaps.append(g) or g)(gap(*a)))
    monkeypatch.setattr(forward_lse, "capturing", lambda t: True)
    assert forward_lse.checked(lse, q, k, 0.25, owner=owner, config=config) is None and gaps == []
    monkeypatch.setattr(forward_lse, "capturing", lambda t: False)
    assert forward_lse.checked(lse, q, k, 0.25, owner=owner, config=config) is lse and len(gaps) == 1  # warm-up
    monkeypatch.setattr(forward_lse, "capturing", lambda t: True)
    assert forward_lse.checked(lse, q, k, 0.25, owner=owner, config=config) is lse and len(gaps) == 1


def test_capturing_is_false_for_cpu_tensors_and_without_cuda():
    q, _, _ = qkv()
    assert forward_lse.capturing(q) is False


CUDNN = torch.nn.attention.SDPBackend.CUDNN_ATTENTION.value


def _as_cudnn(monkeypatch, op) -> list:
    """SDPA's choice made cuDNN attention's on CPU, answered by ``op``; returns the list of the comparisons with SDPA
    ``forward_lse`` makes (each runs SDPA once more)."""
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *a, **kw: CUDNN)
    monkeypatch.setitem(forward_lse._OPS, ("cpu", CUDNN), op)
    monkeypatch.setattr(forward_lse, "_SAME", {})
    compared: list[int] = []
    same = forward_lse._same_as_sdpa

    def counted(key, *args):
        if key not in forward_lse._SAME:
            compared.append(1)
        return same(key, *args)

    monkeypatch.setattr(forward_lse, "_same_as_sdpa", counted)
    return compared


def _cudnn_like(ran: list[int]):
    """A stand-in for cuDNN attention's op on CPU: the flash op, its log-sum-exp shaped ``(B, H, N, 1)`` as cuDNN's
    on recent torch; each run appended to ``ran``."""

    def op(q, k, v, dropout, causal, scale):
        ran.append(1)
        out, lse = forward_lse._flash_cpu(q, k, v, dropout, causal, scale)
        return out, lse[..., None]

    return op


def test_inside_a_capture_cudnn_attention_is_not_compared_and_sdpa_answers(monkeypatch):
    """A cuDNN configuration not compared yet is not compared inside a CUDA graph's capture (the comparison reads a
    value): SDPA answers, without the op; one compared before (the warm-up runs) is answered as always."""
    ran: list[int] = []
    compared = _as_cudnn(monkeypatch, _cudnn_like(ran))
    q, k, v = qkv()
    monkeypatch.setattr(forward_lse, "capturing", lambda t: True)
    assert forward_lse.sdpa_with_lse(q, k, v, scale=0.3) is None and compared == [] and ran == []
    monkeypatch.setattr(forward_lse, "capturing", lambda t: False)
    assert forward_lse.sdpa_with_lse(q, k, v, scale=0.3) is not None and len(compared) == 1
    monkeypatch.setattr(forward_lse, "capturing", lambda t: True)
    assert forward_lse.sdpa_with_lse(q, k, v, scale=0.3) is not None and len(compared) == 1 and len(ran) == 2


def test_cudnn_attention_is_compared_with_sdpa_once_per_configuration(monkeypatch):
    """cuDNN attention (here a stand-in on CPU: the flash op, its log-sum-exp shaped ``(B, H, N, 1)`` as cuDNN's on
    recent torch): the first call of a configuration runs SDPA once more and compares the outputs; a match is
    answered, and later calls of that configuration without SDPA; another shape, dtype or scale is compared again."""
    sdpa = F.scaled_dot_product_attention
    ran: list[int] = []
    compared = _as_cudnn(monkeypatch, _cudnn_like(ran))
    q, k, v = qkv()
    got = forward_lse.sdpa_with_lse(q, k, v, scale=0.3)
    assert got is not None and len(compared) == 1
    out, lse = got
    assert torch.equal(out, sdpa(q, k, v, scale=0.3)) and lse.shape == (2, 3, 37)
    assert torch.equal(lse, forward_lse._flash_cpu(q, k, v, 0.0, False, 0.3)[1])
    assert forward_lse.sdpa_with_lse(q, k, v, scale=0.3) is not None and len(compared) == 1  # trusted
    for args in (qkv(n=41), qkv(torch.bfloat16)):
        assert forward_lse.sdpa_with_lse(*args, scale=0.3) is not None
    assert forward_lse.sdpa_with_lse(q, k, v, scale=0.25) is not None
    assert len(compared) == 4 and len(ran) == 5
    with forward_lse.ForwardLSE() as mode:  # through the mode: the same answer, no comparison
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, scale=0.3), out)
    assert mode.lse is not None and mode.config[0] == CUDNN and len(compared) == 4


def test_cudnn_attention_whose_output_differs_in_one_bit_is_left_to_sdpa(monkeypatch):
    """A configuration whose cuDNN output (the call keeping the log-sum-exp) differs from SDPA's in one bit is never
    answered: the module's output stays SDPA's, and later calls of that configuration go to SDPA without running the
    op; another configuration is compared on its own."""
    sdpa = F.scaled_dot_product_attention
    ran = []

    def op(q, k, v, dropout, causal, scale):
        ran.append(1)
        out, lse = forward_lse._flash_cpu(q, k, v, dropout, causal, scale)
        if q.shape[2] == 37:  # this configuration: one element one float32 step off
            out = out.clone()
            out.view(-1)[5] = torch.nextafter(out.view(-1)[5], torch.tensor(float("inf")))
        return out, lse

    compared = _as_cudnn(monkeypatch, op)
    q, k, v = qkv()
    assert forward_lse.sdpa_with_lse(q, k, v) is None and len(compared) == 1
    with forward_lse.ForwardLSE() as mode:
        out = F.scaled_dot_product_attention(q, k, v)
    assert mode.lse is None and torch.equal(out, sdpa(q, k, v))
    assert len(ran) == 1 and len(compared) == 1  # remembered: neither the op nor the comparison again
    assert forward_lse.sdpa_with_lse(*qkv(n=41)) is not None and len(compared) == 2


def test_the_mode_records_what_its_answer_depends_on():
    q, k, v = qkv()
    configs = []
    for dtype, causal in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False)):
        with forward_lse.ForwardLSE() as mode:
            F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=causal)
        configs.append(mode.config)
    assert len(set(configs)) == 3 and None not in configs
    with forward_lse.ForwardLSE() as mode:  # not answered (a mask): no configuration
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(37, 37, dtype=torch.bool))
    assert mode.lse is None and mode.config is None


def test_the_check_reads_causal_attention_as_sdpa_does(monkeypatch):
    """A causal call's log-sum-exp passes the check told ``is_causal``; read as full attention it fails (its rows
    but the last sum over fewer keys)."""
    q, k, v = qkv()
    _, lse = forward_lse.sdpa_with_lse(q, k, v, is_causal=True, scale=0.25)
    monkeypatch.setattr(forward_lse, "_warned", [])
    assert forward_lse.checked(lse, q, k, 0.25, is_causal=True) is lse
    with pytest.warns(RuntimeWarning, match="log-sum-exp"):
        assert forward_lse.checked(lse, q, k, 0.25) is None


def _tensor_on(device: str, dtype: torch.dtype) -> Any:
    """What ``enabled`` reads of a tensor (its device and dtype): a CUDA one without a GPU."""
    return types.SimpleNamespace(device=torch.device(device), dtype=dtype)


def test_by_default_on_for_float32_cuda_and_for_large_half_type_calls(monkeypatch):
    """``auto``: for float32 CUDA tensors outside autocast, whatever the size (SDPA's memory-efficient branch, faster
    in every float32 case measured); for bfloat16 and float16 CUDA tensors, and float32 ones under CUDA autocast,
    only from ``HALF_MIN_SCORES`` attention scores (on the H200 a bf16 call at 448 px lost at batch 8 and won at
    batch 32); never on the CPU, for float64, or without the tensor."""
    monkeypatch.delenv("VITVIZ_FORWARD_LSE", raising=False)
    large, small = forward_lse.HALF_MIN_SCORES, forward_lse.HALF_MIN_SCORES - 1
    assert 8 * 12 * 785**2 < large <= 32 * 12 * 785**2  # ViT-B/16 at 448 px: batch 8 below, batch 32 above
    for scores in (None, 1, large):
        assert forward_lse.enabled(_tensor_on("cuda", torch.float32), scores)
        assert forward_lse.enabled(_tensor_on("cuda:1", torch.float32), scores)
    for dtype in (torch.bfloat16, torch.float16):
        assert forward_lse.enabled(_tensor_on("cuda", dtype), large), dtype
        for scores in (None, small):
            assert not forward_lse.enabled(_tensor_on("cuda", dtype), scores), (dtype, scores)
    for device, dtype in (("cpu", torch.float32), ("cpu", torch.bfloat16), ("cuda", torch.float64)):
        assert not forward_lse.enabled(_tensor_on(device, dtype), large), (device, dtype)
    assert not forward_lse.enabled() and not forward_lse.enabled(None, large)  # nothing to decide by
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type="cuda": device_type == "cuda")
    assert not forward_lse.enabled(_tensor_on("cuda", torch.float32))  # SDPA computes in the autocast dtype
    assert not forward_lse.enabled(_tensor_on("cuda", torch.float32), small)
    assert forward_lse.enabled(_tensor_on("cuda", torch.float32), large)
    monkeypatch.setenv("VITVIZ_FORWARD_LSE", "auto")
    assert not forward_lse.enabled(_tensor_on("cuda", torch.float32), small)
    assert forward_lse.enabled(_tensor_on("cuda", torch.bfloat16), large)


def test_a_recorded_call_takes_it_at_any_size(monkeypatch):
    """While a call is recorded as a CUDA graph (``contexts.recording``: ``vitviz.graphed``), ``auto`` takes the
    forward's log-sum-exp for half types below ``HALF_MIN_SCORES`` too (the host's work is paid once, at recording;
    the device saves a pass); still never on the CPU or for float64, and the environment and the context still
    force it off."""
    from vitviz.core import contexts

    monkeypatch.delenv("VITVIZ_FORWARD_LSE", raising=False)
    small = forward_lse.HALF_MIN_SCORES - 1
    with contexts.recording_into(contexts.Recording()):
        for dtype in (torch.bfloat16, torch.float16):
            for scores in (None, 1, small):
                assert forward_lse.enabled(_tensor_on("cuda", dtype), scores), (dtype, scores)
        for device, dtype in (("cpu", torch.bfloat16), ("cuda", torch.float64)):
            assert not forward_lse.enabled(_tensor_on(device, dtype), small), (device, dtype)
        with forward_lse.use_forward_lse(False):
            assert not forward_lse.enabled(_tensor_on("cuda", torch.bfloat16), small)
        monkeypatch.setenv("VITVIZ_FORWARD_LSE", "off")
        assert not forward_lse.enabled(_tensor_on("cuda", torch.bfloat16), small)
    monkeypatch.delenv("VITVIZ_FORWARD_LSE")
    assert not forward_lse.enabled(_tensor_on("cuda", torch.bfloat16), small)  # the eager call: by size, as before


@pytest.mark.parametrize(("value", "on"), [("1", True), ("on", True), (" ON ", True), ("0", False), ("off", False),
                                           ("false", False)])
def test_the_environment_forces_it_and_the_context_overrides_the_environment(monkeypatch, value, on):
    monkeypatch.setenv("VITVIZ_FORWARD_LSE", value)
    for x in (None, _tensor_on("cuda", torch.float32), _tensor_on("cpu", torch.bfloat16)):
        assert forward_lse.enabled(x) is on
    with forward_lse.use_forward_lse(not on):
        assert forward_lse.enabled(_tensor_on("cuda", torch.float32)) is (not on)
    assert forward_lse.enabled() is on


def test_a_value_it_does_not_know_is_refused_with_its_name(monkeypatch):
    monkeypatch.setenv("VITVIZ_FORWARD_LSE", "sometimes")
    with pytest.raises(InputError, match=r"VITVIZ_FORWARD_LSE='sometimes' is not one of on, off, auto"):
        forward_lse.enabled(_tensor_on("cuda", torch.float32))


def test_without_the_kernels_the_stream_probe_never_opens_the_mode(monkeypatch):
    """On CPU (kernels off) the PyTorch stream path has no use for the log-sum-exp: SDPA runs as it is."""
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    opened: list[int] = []
    monkeypatch.setattr(forward_lse.ForwardLSE, "__enter__",
                        lambda self: opened.append(1) or torch.overrides.TorchFunctionMode.__enter__(self))
    model = tiny_timm_vit()
    with forward_lse.use_forward_lse(True), torch.no_grad(), capture_attention(
            model, on_layer=lambda i, a: a.fuse(), store=False, heads="stream"):
        model(torch.randn(2, 3, 32, 48))
    assert not opened


def test_without_the_kernels_the_hugging_face_probe_never_opens_the_mode(monkeypatch):
    pytest.importorskip("transformers")
    from hf_models import hf_case

    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    opened: list[int] = []
    monkeypatch.setattr(forward_lse.ForwardLSE, "__enter__",
                        lambda self: opened.append(1) or torch.overrides.TorchFunctionMode.__enter__(self))
    case = hf_case("vit")
    with forward_lse.use_forward_lse(True), torch.no_grad(), capture_attention(
            case.model, on_layer=lambda i, a: a.fuse(), store=False, heads="stream"):
        case.model(pixel_values=case.x)
    assert not opened
