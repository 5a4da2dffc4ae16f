"""An analysis call on a CUDA model, without a GPU: the host's side of the kernel path, pinned on the CPU.

On a GPU the host queues a forward's kernels ahead of the device. A host-device synchronisation inside the forward
(``.item()``, ``bool(t)``, ``float(t)``, ``torch.equal``, a copy to the CPU or a blocking one from it, ``nonzero``)
makes the host wait until every kernel queued so far has run, and the device then idles while the host prepares
the next layer: the call costs the host's time plus the device's instead of the larger of the two.

These tests run ``attention_rollout``, ``mean_attention_distance`` and ``attention_statistics`` on models whose
tensors are fake CUDA tensors (``torch._subclasses.FakeTensorMode``: shapes, dtypes and devices, no data), so that
every device-dependent branch runs as on a GPU (``kernels.use_kernel``, the sm_90 block table, ``forward_lse``'s
CUDA ops), the head-map kernels' launches left out (``headmaps._launch``). A dispatch mode inside the fake mode
records every op that synchronises on a GPU, with where it was called, and answers the data-dependent ones (a fake
tensor holds no value) with a neutral value.

What they pin:

- no synchronisation inside the forward pass, for every family with a stream probe, in float32 and bfloat16, and
  for rollout's options (the discard rule, max and min fusion, the full matrix);
- ``forward_lse``'s check (``checked``) reads one float per attention module on a configuration's first call, and
  none on later calls (its docstring's promise);
- the synchronisations outside the forward (the input's finiteness check, distance's result) do not grow with the
  depth, and on the dataset path (a ``DataLoader`` of CPU images) not with the number of batches;
- distance adds into its running sums in place, on the device (no copy, no transfer per layer).

``test_the_recorder_sees_a_sync_inside_the_forward`` shows that the recorder fails a call that synchronises. The
tests run in a child process (``test_the_fake_cuda_tests_in_a_child_process``; see ``CHILD``). The gradient methods
cannot run on fake CUDA tensors (autograd's engine asks the driver for the device of a CUDA backward):
``tests/test_gradient_host_path.py`` checks them on the CPU, as ``tests/test_faithfulness_host.py`` the
faithfulness loop (``host_reads.ValueReads``).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import EVA_CASES, tiny_eva, tiny_parallel, tiny_relative, tiny_timm_vit
from test_stream_heads import tiny_torchvision_vit
from torch import nn

import vitviz
from vitviz.core import kernels

needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="the kernel path needs Triton")
fake_tensor = pytest.importorskip("torch._subclasses.fake_tensor")
python_dispatch = pytest.importorskip("torch.utils._python_dispatch")
aten = torch.ops.aten

CHILD = os.environ.get("VITVIZ_FAKE_CUDA_CHILD") == "1"
# the fake-CUDA tests run in a child process only (``test_the_fake_cuda_tests_in_a_child_process``): libraries cache
# tensors a forward builds (Hugging Face BEiT's relative position index, DINOv3's patch centres: lru caches keyed by
# shape, or device), and one built on fake tensors would be handed to every later test of the process
in_child = pytest.mark.skipif(not CHILD, reason="runs in a child process (test_the_fake_cuda_tests_in_a_child_process)")

# What the tests need of fake CUDA tensors without a driver, tried in a child process: an older torch (2.5.1 seen)
# initialises CUDA for a view of a fake CUDA tensor and aborts the process (C++ terminate, no Python exception).
_PROBE = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode(allow_non_fake_inputs=True):
    p = torch.nn.Parameter(torch.empty(1, 5, 8, device="cuda"))
    x = p.reshape(-1, 8)[1:].unflatten(-1, (2, 4)).transpose(0, 1)
    q = torch.randn(2, 2, 5, 4, device="cuda", dtype=torch.bfloat16)
    y = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert y.device.type == "cuda" and torch.cat([x, x]).softmax(-1).device.type == "cuda"
"""


@pytest.mark.skipif(CHILD, reason="the driver runs in the parent process only")
def test_the_fake_cuda_tests_in_a_child_process():
    """Run this file's tests in a fresh process (see ``CHILD``), where this torch runs fake CUDA tensors."""
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        errors = [line for line in probe.stderr.splitlines() if "Error" in line] or [f"exit {probe.returncode}"]
        pytest.skip(f"this torch ({torch.__version__}) cannot run fake CUDA tensors here: {errors[0].strip()[:200]}")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "VITVIZ_FAKE_CUDA_CHILD": "1",
           "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
                           "-m", "not gpu", str(Path(__file__).resolve())],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"fake-CUDA tests failed:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 40, proc.stdout[-3000:]  # the PyTorch path's cases at least


def _neutral(args: tuple) -> Any:  # a fake tensor's "value": True, 1 or 0.0 as its dtype asks
    t = args[0]
    return True if t.dtype == torch.bool else 0.0 if t.is_floating_point() else 1


# ops that wait for the device on CUDA -> the answer given in place of a value (None: run the op)
_SYNCS: dict[Any, Callable[[tuple], Any] | None] = {
    aten._local_scalar_dense.default: _neutral,  # .item(), bool(t), float(t), int(t)
    aten.is_nonzero.default: lambda args: True,
    aten.equal.default: lambda args: True,
    aten.allclose.default: lambda args: False,
    aten.nonzero.default: None,
    aten.masked_select.default: None,
}


def _crossing(func: Any, args: tuple, kwargs: dict) -> str | None:
    """``"to the CPU"`` or ``"from the CPU"`` for an op that copies between the CPU and CUDA and waits for the
    device: every copy to the CPU, and a blocking one from it (torch synchronises the stream after a copy from
    pageable memory unless ``non_blocking``); else None."""
    if func is aten._to_copy.default:
        device = kwargs.get("device")
        src, dst = args[0].device.type, None if device is None else torch.device(device).type
        blocking = not kwargs.get("non_blocking", False)
    elif func is aten.copy_.default:
        src, dst = args[1].device.type, args[0].device.type
        blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    else:
        return None
    if src == "cuda" and dst == "cpu":
        return "to the CPU"
    if src == "cpu" and dst == "cuda" and blocking:
        return "from the CPU"
    return None


class SyncRecorder(python_dispatch.TorchDispatchMode):
    """Records each op that synchronises on a GPU as ``(op, inside the forward, where)``; ``where``: the vitviz
    frames that called it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, bool, list[str]]] = []
        self.in_forward = False
        self.ops: collections.Counter[str] = collections.Counter()  # every op inside the forward, by name

    def _record(self, what: str) -> None:
        frames = [f"{f.filename.rsplit('vitviz/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()
                  if "/vitviz/" in f.filename and "/tests/" not in f.filename]
        self.records.append((what, self.in_forward, frames[-3:]))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.in_forward:
            self.ops[str(func)] += 1
        if func in _SYNCS:
            if any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in args):
                self._record(str(func))  # a CPU tensor's value is read without waiting for the device
            answer = _SYNCS[func]
            if answer is not None:
                return answer(args)
        else:
            crossing = _crossing(func, args, kwargs)
            if crossing is not None:
                self._record(f"{func} ({crossing})")
        return func(*args, **kwargs)

    def inside(self) -> list[tuple[str, list[str]]]:
        return [(what, where) for what, inside, where in self.records if inside]

    def outside(self) -> list[str]:
        return [what for what, inside, _ in self.records if not inside]


class FakeCuda:
    """``model`` as fake CUDA tensors (``dtype``), its calls recorded: ``run(fn)`` -> the call's ``SyncRecorder``;
    ``launches``: the head-map kernel launches asked for (left out)."""

    def __init__(self, model: nn.Module, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype = torch.float32) -> None:
        self.launches = 0
        if kernels.triton_available():
            from vitviz.core.kernels import headmaps  # imports Triton

            def launch(kernel: Any, grid: tuple, args: tuple, meta: dict) -> None:
                self.launches += 1

            monkeypatch.setattr(headmaps, "_launch", launch)
            monkeypatch.setattr(headmaps, "_capability", lambda index: 90)  # an H100's sm_90 (no driver is asked)
            monkeypatch.setattr(headmaps, "_NO_BIAS", {})  # its fake CUDA placeholder goes with the test
        self.mode = fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
        self.dtype = dtype
        self.model = model
        made: dict[int, torch.Tensor] = {}  # each tensor once: a tied weight stays one parameter
        with self.mode:  # made on the device (older torch cannot move a fake tensor to CUDA without a driver)
            for module in model.modules():
                for table in (module._parameters, module._buffers):
                    for key, t in table.items():
                        if t is not None:
                            if id(t) not in made:
                                new = torch.empty(t.shape, device="cuda",
                                                  dtype=dtype if t.is_floating_point() else t.dtype)
                                made[id(t)] = nn.Parameter(new, t.requires_grad) if isinstance(
                                    t, nn.Parameter) else new
                            table[key] = made[id(t)]

    def images(self, *shape: int) -> torch.Tensor:
        with self.mode:
            return torch.randn(*shape, device="cuda", dtype=self.dtype)

    def run(self, fn: Callable[[nn.Module], Any], recorder: SyncRecorder | None = None) -> SyncRecorder:
        recorder = SyncRecorder() if recorder is None else recorder
        enter = self.model.register_forward_pre_hook(lambda *_: setattr(recorder, "in_forward", True))
        leave = self.model.register_forward_hook(lambda *_: setattr(recorder, "in_forward", False))
        try:
            with self.mode, recorder, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn(self.model)
        finally:
            enter.remove()
            leave.remove()
        return recorder


def sdpa_as_on_a_gpu(monkeypatch: pytest.MonkeyPatch, backend: Any = None) -> None:
    """SDPA's pick for fake CUDA tensors, as a GPU makes it: ``backend`` (an ``SDPBackend``) for every dtype, or by
    default the memory-efficient kernel in float32 and flash in half types."""
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice

    def pick(q: torch.Tensor, *args: Any, **kwargs: Any) -> int:
        if q.device.type != "cuda":
            return choice(q, *args, **kwargs)
        if backend is not None:
            return backend.value
        return (SDPBackend.EFFICIENT_ATTENTION if q.dtype == torch.float32 else SDPBackend.FLASH_ATTENTION).value

    monkeypatch.setattr(torch, "_fused_sdp_choice", pick)


def lse_answers(monkeypatch: pytest.MonkeyPatch) -> list:
    """What ``forward_lse.checked`` hands the probes, call by call: the forward's log-sum-exp, or None (not taken,
    or its check failed)."""
    from vitviz.core.kernels import forward_lse

    answered: list = []
    checked = forward_lse.checked
    monkeypatch.setattr(forward_lse, "checked", lambda *a, **kw: answered.append(checked(*a, **kw)) or answered[-1])
    return answered


def hugging_face(name: str) -> nn.Module:
    pytest.importorskip("transformers")
    from hf_models import hf_case

    torch.manual_seed(0)
    return hf_case(name).model


def open_clip() -> nn.Module:
    pytest.importorskip("open_clip")
    from hf_models import open_clip_tower

    torch.manual_seed(0)
    return open_clip_tower()


FAMILIES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "timm": (tiny_timm_vit, (2, 3, 32, 48)),
    "timm-eva02": (lambda: tiny_eva(**EVA_CASES["eva02"]), (2, 3, 32, 48)),
    "timm-grouped-key-heads": (lambda: tiny_eva(**EVA_CASES["grouped-key-heads"]), (2, 3, 32, 48)),
    "timm-parallel": (lambda: tiny_parallel("parallel"), (2, 3, 32, 48)),
    "timm-relpos": (lambda: tiny_relative("relpos-mlp"), (2, 3, 32, 48)),
    "timm-beit": (lambda: tiny_relative("beit"), (2, 3, 32, 48)),
    "torchvision": (tiny_torchvision_vit, (2, 3, 32, 32)),
    "huggingface": (lambda: hugging_face("vit"), (2, 3, 32, 48)),
    "huggingface-beit": (lambda: hugging_face("beit-relative"), (2, 3, 32, 48)),
    "huggingface-dinov2": (lambda: hugging_face("dinov2"), (2, 3, 32, 48)),  # its table interpolated
    "huggingface-dinov3": (lambda: hugging_face("dinov3"), (2, 3, 32, 48)),  # rotary
    "huggingface-clip": (lambda: hugging_face("clip-vision"), (2, 3, 32, 32)),
    "open_clip": (open_clip, (2, 3, 32, 48)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_analysis_call_leaves_what_a_recording_compares_as_it_was(family):
    """``vitviz.graphed`` records again when the model's state (``graphs._model_state``: its structure, tensors'
    memory, plain attributes, a held ``config``'s; the switches) differs from the recording's. Whatever an analysis
    call changes on a model of each family (eval mode, checkpointing flags, a probe's switches, Hugging Face's
    attention implementation) it undoes, so a recorded call's next call replays instead of recording again."""
    from vitviz.core import graphs

    torch.manual_seed(0)
    make, shape = FAMILIES[family]
    model = make()
    x = torch.randn(*shape)
    before = graphs._model_state(model)
    for call in _calls(x).values():
        call(model)
        assert graphs._model_state(model) == before, family


def _calls(x: torch.Tensor) -> dict[str, Callable[[nn.Module], Any]]:
    return {"attention_rollout": lambda m: vitviz.attention_rollout(m, x),
            "mean_attention_distance": lambda m: vitviz.mean_attention_distance(m, x, autocast=False)}


@in_child
@pytest.mark.parametrize("path", [pytest.param("kernels", marks=needs_triton), "pytorch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_analysis_call_on_cuda_waits_for_the_device_nowhere_inside_its_forward(family, dtype, path, monkeypatch):
    """On the head-map kernels (what a GPU with Triton runs) and on the PyTorch stream path (kernels off, or a
    Triton too old), with SDPA picking the backend it picks on a GPU (memory-efficient attention in float32, flash
    in half types: ``sdpa_as_on_a_gpu``), so that the forward's log-sum-exp is taken where it is by default
    (``forward_lse.enabled``: float32 on the kernels). Its check reads one float per module on the first call
    (``forward_lse.checked``), the one wait allowed there; none on the second call."""
    sdpa_as_on_a_gpu(monkeypatch)
    make, shape = FAMILIES[family]
    cuda = FakeCuda(make(), monkeypatch, dtype)
    layers = len(vitviz.inspect(make()).attention_modules)
    x = cuda.images(*shape)
    with kernels.headmap_kernel("auto" if path == "kernels" else "off"):
        for name, call in _calls(x).items():
            for attempt in ("first", "second"):
                before = cuda.launches
                recorder = cuda.run(call)
                waits = recorder.inside()
                if attempt == "first" and path == "kernels" and dtype == torch.float32:
                    checks = [(what, where) for what, where in waits if where[-1].endswith(" _gap")]
                    assert len(checks) <= layers, checks  # forward_lse's check: one float per module, once
                    waits = [w for w in waits if w not in checks]
                assert waits == [], (f"{family} {name} ({attempt} call): the host waits for the device inside the "
                                     f"forward: {waits}")
                # the path asked for: on the kernels, each attention layer asked for at least one launch
                launched = cuda.launches - before
                assert launched >= layers if path == "kernels" else launched == 0, (name, launched, layers)


class AnyCopy(SyncRecorder):
    """``SyncRecorder`` that also records a copy from the CPU made ``non_blocking`` (which waits for nothing, but
    inside a CUDA graph's capture would be recorded as a copy from host memory the graph does not own)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in (aten._to_copy.default, aten.copy_.default) and _crossing(func, args, kwargs or {}) is None:
            src = args[1] if func is aten.copy_.default else args[0]
            dst = args[0].device.type if func is aten.copy_.default else (kwargs or {}).get("device")
            if src.device.type == "cpu" and dst is not None and torch.device(dst).type == "cuda":
                self._record(f"{func} (from the CPU, non_blocking)")
        return super().__torch_dispatch__(func, types, args, kwargs)


@in_child
@pytest.mark.parametrize("path", [pytest.param("kernels", marks=needs_triton), "pytorch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_recorded_call_waits_for_the_device_nowhere(family, dtype, path, monkeypatch):
    """What a CUDA graph's capture needs of ``vitviz.graphed``'s recorded run (``core.graphs``): after its warm-up
    runs (where ``forward_lse`` makes its checks), a call under ``recording`` queues no host read at all, inside the
    forward or outside it (the input's finiteness check and distance's result read are left to ``GraphedCall``,
    before the copy in and after the replay), and no copy from the CPU, blocking or not (``AnyCopy``). The same
    call outside a recording reads its input's finiteness (the recorder sees it here). And the calls, recorded or
    not, leave what a recording compares (``graphs._model_state``) as they found it."""

    from vitviz.core import contexts, graphs

    sdpa_as_on_a_gpu(monkeypatch)
    make, shape = FAMILIES[family]
    cuda = FakeCuda(make(), monkeypatch, dtype)
    x = cuda.images(*shape)
    calls = {**_calls(x), "mean_attention_distance, autocast": lambda m: vitviz.mean_attention_distance(
        m, x, autocast=torch.bfloat16)}
    with kernels.headmap_kernel("auto" if path == "kernels" else "off"):
        state = graphs._model_state(cuda.model)  # what a recording compares: every call leaves it as it was
        for name, call in calls.items():
            with contexts.recording_into(contexts.Recording()):
                for _ in range(graphs.WARMUP):
                    cuda.run(call)
                recorder = cuda.run(call, AnyCopy())
            assert recorder.records == [], f"{family} {name}: a recorded call waits for the device: {recorder.records}"
            assert any("to the CPU" in what for what in cuda.run(call).outside()), name  # the input's check
            assert graphs._model_state(cuda.model) == state, f"{family} {name}: the calls left the model changed"


@in_child
@pytest.mark.parametrize("options", [dict(discard_ratio=0.5), dict(discard_ratio=0.9, head_fusion="max"),
                                     dict(head_fusion="min", token="patches"), dict(return_full=True)],
                         ids=["discard", "discard-max", "min-patches", "full"])
def test_rollouts_options_wait_nowhere_inside_the_forward(options, monkeypatch):
    """The discard rule counts each row's candidates on the host (the max of a device tensor was a wait per layer)."""
    cuda = FakeCuda(tiny_timm_vit(depth=3), monkeypatch)
    x = cuda.images(2, 3, 32, 48)
    for _ in range(2):
        recorder = cuda.run(lambda m: vitviz.attention_rollout(m, x, **options))
        assert recorder.inside() == [], recorder.inside()


@in_child
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_forward_lse_reads_one_float_per_module_on_the_first_call_only(dtype, monkeypatch):
    """With the forward's log-sum-exp taken (SDPA's flash op, as SDPA picks it on a GPU), ``checked`` compares it
    once per module and configuration (one float read, a sync, per module) and trusts later calls."""
    from torch.nn.attention import SDPBackend

    from vitviz.core.kernels import forward_lse

    sdpa_as_on_a_gpu(monkeypatch, SDPBackend.FLASH_ATTENTION)
    answered = lse_answers(monkeypatch)
    cuda = FakeCuda(tiny_timm_vit(depth=3), monkeypatch, dtype)
    x = cuda.images(2, 3, 32, 48)
    with forward_lse.use_forward_lse(True):
        first = cuda.run(lambda m: vitviz.attention_rollout(m, x))
        assert len(answered) == 3 and all(lse is not None for lse in answered)  # every layer took the forward's
        # one wait per module, reading the check's float: nothing else waits (its rows are sliced, not indexed)
        assert [(what, where[-1].split()[-1]) for what, where in first.inside()] == [
            ("aten._local_scalar_dense.default", "_gap")] * 3, first.inside()
        answered.clear()
        second = cuda.run(lambda m: vitviz.attention_rollout(m, x))
        assert len(answered) == 3 and all(lse is not None for lse in answered)
        assert second.inside() == []


@in_child
@needs_triton
def test_a_recorded_half_type_call_takes_the_forwards_log_sum_exp_and_reads_nothing(monkeypatch):
    """A bf16 call below ``HALF_MIN_SCORES``: eager, ``auto`` leaves the forward's log-sum-exp (the call is bound by
    the host); recorded (``vitviz.graphed``'s warm-ups, then the capture), it takes it on every layer, checks it in
    the warm-ups, and the recorded run reads nothing and copies nothing from the CPU."""
    from torch.nn.attention import SDPBackend

    from vitviz.core import contexts, graphs
    from vitviz.core.kernels import forward_lse

    monkeypatch.delenv("VITVIZ_FORWARD_LSE", raising=False)
    sdpa_as_on_a_gpu(monkeypatch, SDPBackend.FLASH_ATTENTION)
    answered = lse_answers(monkeypatch)
    cuda = FakeCuda(tiny_timm_vit(depth=3), monkeypatch, torch.bfloat16)
    x = cuda.images(2, 3, 32, 48)
    assert 2 * 3 * 7**2 < forward_lse.HALF_MIN_SCORES

    def rollout(m):
        return vitviz.attention_rollout(m, x)

    with kernels.headmap_kernel("auto"):
        cuda.run(rollout)
        assert answered == [None] * 3  # eager: by size, not taken (``checked`` hands the probe None)
        answered.clear()
        with contexts.recording_into(contexts.Recording()):
            for _ in range(graphs.WARMUP):
                cuda.run(rollout)
            assert len(answered) == 3 * graphs.WARMUP and all(lse is not None for lse in answered)
            answered.clear()
            recorder = cuda.run(rollout, AnyCopy())
        assert len(answered) == 3 and all(lse is not None for lse in answered)  # taken, trusted: no check
        assert recorder.records == [], recorder.records


@in_child
@needs_triton
def test_distance_leaves_the_forwards_log_sum_exp_alone(monkeypatch):
    """The forward's log-sum-exp is on by default for a float32 CUDA call, and rollout's head mean reads it; the
    distance's kernel makes its own pass and never reads it, so neither of distance's paths (a batch, a dataset's
    ``DistanceReduction``) takes it: no mode's work on the host, no check's read."""

    from vitviz.analysis.distance import DistanceReduction

    monkeypatch.delenv("VITVIZ_FORWARD_LSE", raising=False)
    sdpa_as_on_a_gpu(monkeypatch)
    answered = lse_answers(monkeypatch)
    cuda = FakeCuda(tiny_timm_vit(depth=3), monkeypatch, torch.float32)
    x = cuda.images(2, 3, 32, 48)
    with kernels.headmap_kernel("auto"):
        cuda.run(lambda m: vitviz.attention_rollout(m, x))
        assert len(answered) == 3 and all(lse is not None for lse in answered)  # rollout takes it
        answered.clear()
        for distance in (lambda m: vitviz.mean_attention_distance(m, x, autocast=False),
                         lambda m: DistanceReduction(m).update(m, x)):
            recorder = cuda.run(distance)
            assert answered == [None] * 3, answered
            assert recorder.inside() == []  # no check read a value inside the forward
            answered.clear()


@in_child
@needs_triton
def test_the_syncs_outside_the_forward_do_not_grow_with_the_depth(monkeypatch):
    counts = {}
    for depth in (2, 4):
        cuda = FakeCuda(tiny_timm_vit(depth=depth), monkeypatch)
        x = cuda.images(2, 3, 32, 48)
        for name, call in _calls(x).items():
            cuda.run(call)  # the first call also reads the position table once (pos_kind: kept until written)
            counts[depth, name] = sorted(cuda.run(call).outside())
    for name in _calls(torch.zeros(1)):
        assert counts[2, name] == counts[4, name], (name, counts[2, name], counts[4, name])
    assert len(counts[4, "attention_rollout"]) <= 1  # the input's finiteness check
    assert len(counts[4, "mean_attention_distance"]) <= 3  # that check, and the result read (two copies)


@in_child
@needs_triton
def test_distance_adds_into_its_running_sums_in_place(monkeypatch):
    """Per layer, distance adds each image's per-head distances into its float64 running sums on the device, in
    place: no copy (``sums[i] += x.double()`` would cast, then write the row back onto itself; on a GPU two more
    launches per layer) and no transfer inside the forward."""
    cuda = FakeCuda(tiny_timm_vit(depth=3), monkeypatch)
    x = cuda.images(2, 3, 32, 48)
    call = _calls(x)["mean_attention_distance"]
    cuda.run(call)
    ops = cuda.run(call).ops
    assert ops["aten.add_.Tensor"] == 2 * 3  # the sums and the image counts of each layer
    assert ops["aten.copy_.default"] == 0 and ops["aten._to_copy.default"] == 0, ops


@in_child
@needs_triton
@pytest.mark.parametrize("reduction", ["mean_attention_distance", "attention_statistics"])
def test_the_dataset_path_waits_for_the_device_once_per_run_not_per_batch(reduction, monkeypatch):
    """A ``DataLoader`` of CPU images: each batch is checked on the CPU before it moves (no wait), no forward
    waits, and the result is read once at the end, whatever the number of batches."""
    from torch.utils.data import DataLoader, TensorDataset

    cuda = FakeCuda(tiny_timm_vit(depth=2), monkeypatch)
    kwargs = {"autocast": False} if reduction == "mean_attention_distance" else {}
    cuda.run(lambda m: vitviz.attention_rollout(m, torch.randn(1, 3, 32, 48)))  # reads the position table once
    outside = {}
    for batches in (1, 3):
        images = torch.randn(4 * batches, 3, 32, 48)
        loader = DataLoader(TensorDataset(images, torch.zeros(len(images), dtype=torch.long)), batch_size=4)
        recorder = cuda.run(lambda m, loader=loader: getattr(vitviz, reduction)(m, loader, **kwargs))
        assert recorder.inside() == [], recorder.inside()
        outside[batches] = sorted(recorder.outside())
    assert outside[1] == outside[3], outside


@in_child
@needs_triton
@pytest.mark.parametrize("sync", ["item", "cpu"])
def test_the_recorder_sees_a_sync_inside_the_forward(sync, monkeypatch):
    """The recorder fails a call that reads a value inside the forward (as the first test would): a stream
    probe's ``HeadMaps`` built after one ``.item()`` or ``.cpu()`` of its ``q``."""
    from vitviz.core.families import stream

    recomputed = stream.recomputed_heads

    def syncing(q, *args, **kwargs):
        q.sum().item() if sync == "item" else q.cpu()
        return recomputed(q, *args, **kwargs)

    monkeypatch.setattr(stream, "recomputed_heads", syncing)
    cuda = FakeCuda(tiny_timm_vit(depth=2), monkeypatch)
    x = cuda.images(2, 3, 32, 48)
    recorder = cuda.run(lambda m: vitviz.attention_rollout(m, x))
    inside = recorder.inside()
    assert len(inside) == 2  # one per layer
    assert all(("_local_scalar_dense" if sync == "item" else "to the CPU") in what for what, _ in inside)
    assert all(any("syncing" in frame or "recomputed_heads" in frame or "timm_probes" in frame for frame in where)
               for _, where in inside), inside
