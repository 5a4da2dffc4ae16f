"""``vitviz.graphed``: an analysis recorded once as a CUDA graph, replayed per batch (``vitviz.core.graphs``).

Without a GPU the recording backend is replaced by ``ReplayDouble``, which keeps a graph's contract: the capture's
outputs are the static tensors every replay overwrites, and they hold no result until the first replay (the double
fills them with NaN, as a capture leaves them unwritten); a replay reruns the recorded call on the static input and
writes its results into those tensors. What the tests pin is ``GraphedCall``'s side: the input checked and copied,
the results copied out (a later call never overwrites an earlier result), a recording per shape, a new recording
when the model or vitviz's switches change, and the refusals. That a recorded call queues no host read (what a
capture needs) is pinned on fake CUDA tensors in ``tests/test_cuda_host_path.py``; the real graphs against the
eager call, in the ``gpu`` test at the end.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import tiny_timm_vit
from torch import nn

import vitviz
from vitviz.core import contexts, graphs
from vitviz.core.kernels import forward_lse
from vitviz.errors import CaptureError, ImageInputError, InputError, InputTypeError, UnsupportedModelError


class ReplayDouble:
    """A recording backend for the CPU with a CUDA graph's contract (see the module docstring)."""

    records = 0
    replays = 0

    @staticmethod
    def available(device: torch.device) -> bool:
        return True

    @classmethod
    def record(cls, run, device):
        cls.records += 1
        for _ in range(graphs.WARMUP):
            run()
        outputs = run()
        tensors = [t for t in _leaves(outputs)]
        for t in tensors:
            t.fill_(float("nan"))  # a capture queues kernels without running them

        def replay() -> None:
            cls.replays += 1
            for static, new in zip(tensors, _leaves(run()), strict=True):
                static.copy_(new)

        return replay, outputs


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _leaves(o)]
    return []


@pytest.fixture
def double(monkeypatch):
    monkeypatch.setattr(graphs.GraphedCall, "backend", ReplayDouble)
    ReplayDouble.records = ReplayDouble.replays = 0
    return ReplayDouble


def images(b=2, seed=0):
    return torch.randn(b, 3, 32, 48, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fn", ["attention_rollout", "mean_attention_distance"])
def test_a_graphed_call_returns_what_the_analysis_returns(fn, double):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    analysis = getattr(vitviz, fn)
    call = vitviz.graphed(analysis, model, images(seed=9))
    for seed in (1, 2):
        x = images(seed=seed)
        got, want = call(x), analysis(model, x)
        assert got.device == want.device and got.dtype == want.dtype
        assert torch.equal(got, want)  # the first call too: a call replays after it records
    assert call.recordings == 1 and double.records == 1 and double.replays == 2


def test_a_graphed_call_warns_about_to_tensor_pixels(double):
    """A replay runs no ``load_images``, whose check warns about pixels in [0, 1] for a model that normalises
    (``ToTensor()`` without ``Normalize``): the graphed call's own check of its input warns as the analysis would,
    once per call. The example, read for its shape and dtype only, is not warned about."""
    import warnings

    from vitviz.errors import ImageRangeWarning

    torch.manual_seed(0)
    model = tiny_timm_vit()
    pixels = torch.rand(2, 3, 32, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageRangeWarning)
        call = vitviz.graphed(vitviz.attention_rollout, model, pixels)
        call(images())
    for _ in range(2):  # the first call records, the second replays
        with pytest.warns(ImageRangeWarning, match=r"images: values from .*none negative.*mean \(0\.485, 0\.456, "
                                                   r"0\.406\).*Normalize") as seen:
            call(pixels)
        assert sum(issubclass(w.category, ImageRangeWarning) for w in seen) == 1
        assert seen[0].filename == __file__


def test_the_options_are_the_analysis_options(double):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = images()
    call = vitviz.graphed(vitviz.attention_rollout, model, x, head_fusion="max", token="patches")
    assert torch.equal(call(x), vitviz.attention_rollout(model, x, head_fusion="max", token="patches"))
    assert not torch.equal(call(x), vitviz.attention_rollout(model, x))


def test_what_a_call_records_is_fixed_once_made(double):
    """``call.options`` (a dict) could be changed after the recording, and ``call.fn`` or ``call.model`` set, with
    no effect on the replay: the change was silently ignored. The options are a read-only view, and setting any of
    the three is an ``InputError`` naming the fix; the call keeps replaying what it recorded."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = images()
    call = vitviz.graphed(vitviz.attention_rollout, model, x, head_fusion="max")
    with pytest.raises(TypeError):
        call.options["head_fusion"] = "min"
    for name, value in (("options", {"head_fusion": "min"}), ("fn", vitviz.mean_attention_distance),
                        ("model", tiny_timm_vit())):
        with pytest.raises(vitviz.InputError, match=rf"GraphedCall\.{name} is fixed when the call is recorded.*make "
                                                    r"a new vitviz\.graphed"):
            setattr(call, name, value)
    assert dict(call.options) == {"head_fusion": "max"} and call.model is model
    assert torch.equal(call(x), vitviz.attention_rollout(model, x, head_fusion="max"))


def test_a_result_is_a_copy_that_a_later_call_leaves_alone(double):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    first = call(images(seed=1))
    kept = first.clone()
    second = call(images(seed=2))
    assert torch.equal(first, kept) and not torch.equal(first, second)
    distance = vitviz.graphed(vitviz.mean_attention_distance, model, images())
    d1 = distance(images(seed=1))
    assert d1.device.type == "cpu"  # marked to_host: copied to the CPU, as the analysis returns it
    d1_kept = d1.clone()
    distance(images(seed=2))
    assert torch.equal(d1, d1_kept)


def test_each_shape_is_recorded_once(double):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images(b=4))
    call(images(b=4))
    small = images(b=1, seed=3)
    assert torch.equal(call(small), vitviz.attention_rollout(model, small))  # a last, smaller batch
    call(images(b=4, seed=4))
    call(images(b=1, seed=5))
    assert call.recordings == 2
    assert "(4, 3, 32, 48) float32" in repr(call) and "(1, 3, 32, 48) float32" in repr(call)


@pytest.mark.filterwarnings("ignore:vitviz.graphed.*changed before each")
def test_a_changed_model_is_recorded_again(double):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    x = images(seed=1)
    with torch.no_grad():  # written in place: the graph reads the same memory, no new recording
        model.blocks[0].attn.qkv.weight.mul_(3)
    assert torch.equal(call(x), vitviz.attention_rollout(model, x)) and call.recordings == 1
    model.blocks[1].attn.qkv = nn.Linear(32, 96)  # a module replaced
    assert torch.equal(call(x), vitviz.attention_rollout(model, x)) and call.recordings == 2
    model.blocks[1].attn.qkv.weight.data = torch.randn(96, 32)  # a tensor moved to other memory
    assert torch.equal(call(x), vitviz.attention_rollout(model, x)) and call.recordings == 3
    model.double()  # every tensor in another dtype
    assert torch.equal(call(x), vitviz.attention_rollout(model, x)) and call.recordings == 4
    assert torch.equal(call(x.double()), vitviz.attention_rollout(model, x.double()))  # a batch of another dtype
    call(x.double())
    call(x)
    assert call.recordings == 5


@pytest.mark.filterwarnings("ignore:vitviz.graphed.*changed before each")
def test_a_changed_switch_is_recorded_again(double, monkeypatch):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    call(images())
    with forward_lse.use_forward_lse(False):
        call(images())
    assert call.recordings == 2
    with vitviz.headmap_kernel("off"):
        call(images())
    assert call.recordings == 3
    call(images())
    monkeypatch.setenv("VITVIZ_HEADMAP_BLOCKS", "16,16,1,1")  # the kernels' tiles: another order of sums
    call(images())
    call(images())
    assert call.recordings == 5


@pytest.mark.filterwarnings("ignore:vitviz.graphed.*changed before each")
def test_a_changed_plain_attribute_is_recorded_again(double):
    """A plain attribute the forward reads (a number, a flag, a tuple) or a plain tensor a module keeps outside its
    parameters and buffers, changed between calls: the next call records again (a replay would run the old
    value's kernels). A call that changes nothing records nothing: vitviz's own per-call changes (eval mode,
    checkpointing flags, the capture's switches) are undone before the next call compares."""
    torch.manual_seed(0)
    model = tiny_timm_vit().train()  # the user's mode: the analysis runs in eval mode and restores it
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    x = images(seed=1)
    before = call(x)
    call(x)
    assert call.recordings == 1 and model.training
    attn = model.blocks[0].attn
    attn.fused_attn = not attn.fused_attn
    call(x)
    assert call.recordings == 2
    attn.fused_attn = False  # timm's explicit path reads scale (its fused kernel never does; a capture refuses that)
    attn.scale = attn.scale * 4  # read by the forward at each call: the maps change
    got = call(x)
    assert call.recordings == 3 and torch.equal(got, vitviz.attention_rollout(model, x))
    assert not torch.allclose(got, before)
    model.blocks[1].attn.kept = torch.zeros(3)  # a plain tensor attribute, added, then replaced
    call(x)
    model.blocks[1].attn.kept.add_(1)  # written in place: the same memory, no new recording
    call(x)
    assert call.recordings == 4
    model.blocks[1].attn.kept = torch.zeros(3)
    call(x)
    attn.window = (4, 4)  # a tuple of numbers, added, then changed
    call(x)
    attn.window = (4, 8)
    call(x)
    assert call.recordings == 7
    model.eval()  # the training flag: a mode is a plain attribute too
    call(x)
    call(x)
    assert call.recordings == 8


def test_a_changed_hugging_face_config_is_recorded_again(double):
    """Hugging Face's attention reads ``config._attn_implementation`` at each forward: a model switched to another
    implementation records again; two calls that change nothing record once (vitviz's capture switches it and
    back inside the call)."""
    pytest.importorskip("transformers")
    from hf_models import hf_case

    case = hf_case("vit")
    model, x = case.model, case.x
    call = vitviz.graphed(vitviz.attention_rollout, model, x)
    call(x)
    call(x)
    assert call.recordings == 1
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager" if impl != "eager" else "sdpa")
    assert torch.allclose(call(x), vitviz.attention_rollout(model, x), atol=1e-6)
    assert call.recordings == 2


@pytest.mark.filterwarnings("ignore:vitviz.graphed.*changed before each")
def test_a_changed_pytorch_switch_is_recorded_again(double):
    """SDPA's backends (``torch.nn.attention.sdpa_kernel``) and TF32 pick the kernels a forward queues: a call under
    other switches records again, and again when they are back; TF32 set through either of PyTorch's APIs (the old
    ``allow_tf32``, which a torch refuses to read once the new ``fp32_precision`` was set, and the new)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    with sdpa_kernel(SDPBackend.MATH):
        call(images())
    assert call.recordings == 2
    call(images())
    assert call.recordings == 3
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not old
        call(images())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert call.recordings == 4
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch 2.9 on: the new API (after which the old one refuses to be read)
        old = matmul.fp32_precision
        try:
            matmul.fp32_precision = "tf32" if old != "tf32" else "ieee"
            call(images())
            assert call.recordings == 5
            call(images())
            assert call.recordings == 5
        finally:
            matmul.fp32_precision = old


@pytest.mark.filterwarnings("ignore:vitviz.graphed.*changed before each")
def test_more_pytorch_switches_are_recorded_again(double):
    """PyTorch's other switches that pick the kernels a forward queues, or refuse some: cuDNN's (enabled, benchmark,
    deterministic), deterministic algorithms (an eager call would take deterministic kernels or refuse), the
    reduced-precision reductions of math SDPA and fp16 matmul accumulation, SDPA's backend priority
    (``sdpa_kernel(..., set_priority=True)``), the preferred BLAS library and ``nn.MultiheadAttention``'s fast
    path: each changed records again, and again when it is back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    cudnn, cuda = torch.backends.cudnn, torch.backends.cuda
    switches = [
        (lambda: cudnn.enabled, lambda v: setattr(cudnn, "enabled", v), lambda v: not v),
        (lambda: cudnn.benchmark, lambda v: setattr(cudnn, "benchmark", v), lambda v: not v),
        (lambda: cudnn.deterministic, lambda v: setattr(cudnn, "deterministic", v), lambda v: not v),
        (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms, lambda v: not v),
        (cuda.fp16_bf16_reduction_math_sdp_allowed, cuda.allow_fp16_bf16_reduction_math_sdp, lambda v: not v),
        (lambda: cuda.matmul.allow_fp16_accumulation, lambda v: setattr(cuda.matmul, "allow_fp16_accumulation", v),
         lambda v: not v),
        (torch.backends.mha.get_fastpath_enabled, torch.backends.mha.set_fastpath_enabled, lambda v: not v),
        (cuda.preferred_blas_library, cuda.preferred_blas_library,
         lambda v: "cublaslt" if v.name.lower() != "cublaslt" else "cublas"),
    ]
    recordings = call.recordings
    for read, write, other in switches:
        try:
            old = read()
        except AttributeError:  # a switch this torch does not have (the oldest supported lacks some)
            continue
        try:
            write(other(old))
            call(images())
            call(images())
        finally:
            write(old)
        call(images())
        assert call.recordings == recordings + 2, read
        recordings = call.recordings
    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        return  # a torch without a priority order to set
    everything = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                  SDPBackend.CUDNN_ATTENTION, SDPBackend.OVERRIDEABLE]
    with sdpa_kernel(everything, set_priority=True):  # every backend on, math first: only the order differs
        call(images())
    call(images())
    assert call.recordings == recordings + 2


def test_a_model_changed_before_every_call_is_named_in_a_warning(double):
    """A model found changed by ``CHANGED_IN_A_ROW`` calls in a row records each time (more than the eager call
    costs): a warning at the caller's line names what changed. Attributes are compared by identity: an attribute
    set again to an equal new object (a float recomputed) counts as changed."""
    import warnings

    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    attn = model.blocks[0].attn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(graphs.CHANGED_IN_A_ROW - 1):
            attn.scale = attn.scale * 1.0  # equal, a new object
            call(images())
        call(images())  # unchanged: the count starts again
        for _ in range(graphs.CHANGED_IN_A_ROW - 1):
            attn.scale = attn.scale * 1.0
            call(images())
    assert call.recordings == 1 + 2 * (graphs.CHANGED_IN_A_ROW - 1)
    attn.scale = attn.scale * 1.0
    with pytest.warns(UserWarning, match=rf"VisionTransformer changed before each of the last "
                                         rf"{graphs.CHANGED_IN_A_ROW} calls \(the attributes blocks.0.attn.scale\), "
                                         r"so each recorded again") as seen:
        call(images())
    assert seen[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attn.scale = attn.scale * 1.0
        call(images())  # the same streak goes on: said once
        call(images())  # unchanged: a new streak may start
    model.blocks[1].attn.extra = 1
    call(images())
    model.blocks[1].attn.more = 2
    call(images())
    del model.blocks[1].attn.extra  # names added and removed are named too
    with pytest.warns(UserWarning, match=r"\(the attributes blocks.1.attn.extra\), so"):
        call(images())
    before = graphs._model_state(model)
    for i in range(5):
        setattr(model.blocks[0].attn, f"a{i}", i)
    assert graphs._what_changed(before, graphs._model_state(model)) == (
        "the attributes blocks.0.attn.a0, blocks.0.attn.a1, blocks.0.attn.a2, blocks.0.attn.a3 and 1 more")
    assert graphs._what_changed(graphs._model_state(model), graphs._model_state(model.half())) == (
        "its structure or a tensor's memory, dtype or device")


@pytest.mark.filterwarnings("ignore:vitviz.graphed.*carries forward hooks")
@pytest.mark.filterwarnings("ignore:vitviz.graphed.*changed before each")
def test_a_changed_class_or_hook_is_recorded_again(double):
    """A submodule's class changed (``m.__class__ = ...``: another forward, the same instance dict) or a forward
    hook added or removed after the recording (on a module, or PyTorch's global ones): a replay would run the old
    kernels, without the hook's or with them. The next call records again, and that recording warns of the hooks."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    x = images(seed=1)

    class Doubled(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    model.blocks[0].norm1.__class__ = Doubled
    call(x)
    assert call.recordings == 2
    handle = model.blocks[0].register_forward_pre_hook(lambda m, args: (args[0] * 3,))
    with pytest.warns(UserWarning, match=r"carries forward hooks \(blocks.0\)"):
        call(x)
    call(x)
    assert call.recordings == 3
    handle.remove()
    call(x)
    assert call.recordings == 4
    handle = model.blocks[1].attn.register_forward_hook(lambda m, args, out: out * 3)
    call(x)
    handle.remove()
    handle = model.blocks[1].attn.register_forward_hook(lambda m, args, out: out * 3)  # another, the same count
    call(x)
    handle.remove()
    assert call.recordings == 6
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: None)
    try:
        with pytest.warns(UserWarning, match="PyTorch's global forward hooks"):
            call(x)
        call(x)
    finally:
        handle.remove()
    call(x)
    assert call.recordings == 8
    before = graphs._model_state(model)
    model.blocks[0].norm1.__class__ = nn.LayerNorm
    assert graphs._what_changed(before, graphs._model_state(model)) == "the attributes blocks.0.norm1.__class__"
    before = graphs._model_state(model)
    handle = model.blocks[1].register_forward_hook(lambda m, args, out: None)
    assert graphs._what_changed(before, graphs._model_state(model)) == "the forward hooks of blocks.1"
    handle.remove()

def test_a_tensor_restrided_in_place_is_recorded_again(double):
    """A parameter or buffer given other strides in place (``w.t_()`` on a square weight, ``w.set_`` on its own
    storage): the same object, shape and memory, read in another order; a replay would read it in the recorded
    order. The next call records again."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    x = images(seed=1)
    weight = model.blocks[0].attn.proj.weight  # (32, 32)
    with torch.no_grad():
        weight.t_()
    call(x)
    assert call.recordings == 2
    with torch.no_grad():
        weight.set_(weight.untyped_storage(), 0, weight.shape, (weight.shape[1], 1))  # back to its first strides
    call(x)
    call(x)
    assert call.recordings == 3

def test_a_model_moved_to_another_device_is_recorded_there_or_refused(double, monkeypatch):
    """A recording is made on the device the model is on now: one moved (``model.to(...)``) records again there
    (its input copied to that device), or, moved to a device a CUDA graph cannot record on (the CPU), is refused as
    ``vitviz.graphed`` refuses it, not recorded on the device it left."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    devices = []
    record = ReplayDouble.record
    monkeypatch.setattr(ReplayDouble, "record", classmethod(lambda cls, run, device: devices.append(device)
                                                            or record.__func__(cls, run, device)))
    monkeypatch.setattr(ReplayDouble, "available", staticmethod(lambda device: device.type == "cpu"))
    model.to("meta")
    with pytest.raises(UnsupportedModelError, match=r"VisionTransformer has its parameters on meta"):
        call(images())
    assert devices == [] and call.recordings == 1
    monkeypatch.setattr(ReplayDouble, "available", staticmethod(lambda device: True))
    assert call(images()).device.type == "meta"  # a device without data stands in for another GPU
    assert devices == [torch.device("meta")] and call.recordings == 2

def test_bad_input_is_refused_before_it_reaches_the_recording(double):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    call = vitviz.graphed(vitviz.attention_rollout, model, images())
    x = images(seed=1)
    want = call(x)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ImageInputError, match=r"images: .* 1 NaN"):
        call(bad)
    with pytest.raises(InputTypeError, match=r"images: got a list"):
        call([x])
    with pytest.raises(ImageInputError, match=r"images: .*uint8"):
        call(x.to(torch.uint8))
    assert torch.equal(call(x), want)


def test_what_cannot_be_recorded_is_refused(double, monkeypatch):
    model = tiny_timm_vit()
    with pytest.raises(InputError, match=r"fn=attention_statistics cannot be recorded"):
        vitviz.graphed(vitviz.attention_statistics, model, images())
    with pytest.raises(InputError, match=r"batch_size=1: a recorded call"):
        vitviz.graphed(vitviz.attention_rollout, model, images(), batch_size=1)
    with pytest.raises(ImageInputError, match=r"example: .* 0 images"):
        vitviz.graphed(vitviz.attention_rollout, model, images()[:0])
    monkeypatch.setattr(graphs.GraphedCall, "backend", graphs._CudaGraphs)  # the real backend: CUDA only
    with pytest.raises(UnsupportedModelError, match=r"VisionTransformer has its parameters on cpu.*model.cuda"):
        vitviz.graphed(vitviz.attention_rollout, model, images())


def test_a_failed_capture_names_the_call_the_model_and_the_way_out(double, monkeypatch):
    """A capture that fails (on a GPU: a read of a value, a copy from the CPU, inside the model's own forward) is
    reported as a ``CaptureError`` that names the analysis and the model class; a vitviz refusal stays itself."""
    model = tiny_timm_vit()

    def failing(run, device):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(ReplayDouble, "record", staticmethod(failing))
    with pytest.raises(CaptureError, match=r"attention_rollout on VisionTransformer could not be recorded as a CUDA "
                                           r"graph: CUDA error: operation not permitted.*without vitviz.graphed"):
        vitviz.graphed(vitviz.attention_rollout, model, images())

    def refusing(run, device):
        run()

    monkeypatch.setattr(ReplayDouble, "record", staticmethod(refusing))
    with pytest.raises(InputError, match="head_fusion"):
        vitviz.graphed(vitviz.attention_rollout, model, images(), head_fusion="median")


def test_a_recording_warns_of_the_python_a_replay_does_not_run(double):
    """Forward hooks on the model's modules, PyTorch's global forward hooks and an open ``capture_attention`` run
    at recording only: the recording warns, naming them, at the caller's line (also a recording made by a call, for
    a new shape); a model without hooks records silently."""
    import warnings

    torch.manual_seed(0)
    model = tiny_timm_vit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call = vitviz.graphed(vitviz.attention_rollout, model, images())  # no hooks: no warning
    handle = model.blocks[1].attn.register_forward_pre_hook(lambda m, args: None)
    with pytest.warns(UserWarning, match=r"VisionTransformer carries forward hooks \(blocks.1.attn\)\. A recorded "
                                         r"call runs Python only while it records") as seen:
        vitviz.graphed(vitviz.attention_rollout, model, images())
    assert seen[0].filename == __file__
    with pytest.warns(UserWarning, match=r"blocks.1.attn") as seen:
        call(images(b=3))  # a new shape: recorded now, with the hook in place
    assert seen[0].filename == __file__
    handle.remove()
    with vitviz.capture_attention(model), pytest.warns(UserWarning, match="an open vitviz.capture_attention on 2"):
        vitviz.graphed(vitviz.mean_attention_distance, model, images())
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: None)
    try:
        with pytest.warns(UserWarning, match="PyTorch's global forward hooks"):
            vitviz.graphed(vitviz.attention_rollout, model, images())
    finally:
        handle.remove()


def test_recording_leaves_the_host_reads_to_the_graphed_call():
    """While recording, ``check_tensor`` reads no value (the call checked its input before the copy), ``to_host``
    marks instead of copying, and autocast keeps no weight cache; outside, each does what it always did."""
    from vitviz.core.datasets import autocast_context
    from vitviz.core.images import check_tensor

    bad = torch.full((1, 3, 8, 8), float("nan"))
    with pytest.raises(ImageInputError):
        check_tensor(bad)
    rec = contexts.Recording()
    t = torch.zeros(2)
    with contexts.recording_into(rec):
        assert contexts.recording()
        check_tensor(bad)  # no read
        assert contexts.to_host(t) is t and rec.host[0] is t
        with autocast_context(torch.bfloat16, "cpu"):
            assert not torch.is_autocast_cache_enabled()
    assert not contexts.recording()
    with autocast_context(torch.bfloat16, "cpu"):
        assert torch.is_autocast_cache_enabled()
    with pytest.raises(ImageInputError, match="NaN"):
        check_tensor(bad, "example")


def _cuda_family(family: str) -> nn.Module:
    if family == "huggingface":
        transformers = pytest.importorskip("transformers")
        config = transformers.ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=6,
                                        num_attention_heads=6, intermediate_size=768)
        return transformers.ViTModel(config, add_pooling_layer=False).eval()
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=224, patch_size=16, embed_dim=384, depth=6, num_heads=6).eval()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["timm", "huggingface"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("fn", ["attention_rollout", "mean_attention_distance"])
def test_cuda_graphs_replay_the_eager_call(fn, dtype, family):
    """On a GPU: a ViT-S/16-shaped timm or Hugging Face model at 224 px (its stream probe, the kernels; float32
    with the forward's log-sum-exp), the real CUDA graph against the eager call, for two batches after the
    recording, and a new shape."""
    torch.manual_seed(0)
    model = _cuda_family(family).to("cuda", dtype)
    analysis = getattr(vitviz, fn)
    options = {"autocast": False} if fn == "mean_attention_distance" else {}
    x = torch.randn(4, 3, 224, 224, device="cuda", dtype=dtype)
    call = vitviz.graphed(analysis, model, x, **options)
    for seed in (1, 2):
        y = torch.randn(4, 3, 224, 224, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(seed))
        got, want = call(y), analysis(model, y, **options)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    small = x[:1].clone()
    torch.testing.assert_close(call(small), analysis(model, small, **options), rtol=1e-5, atol=1e-6)
    assert call.recordings == 2
