"""A model quantized with torch's quantized kernels (``torch.ao.quantization.quantize_dynamic``, as PyTorch's DeiT
deployment tutorial does) is read as it computes where vitviz only runs its forward, and refused, naming the layer,
where the kernels cannot give the answer.

Those kernels have no backward pass, keep their weights packed (``weight()`` is a method, not a parameter) and have
no formula in ``torch.utils.flop_counter``. Before the refusals: AttnLRP failed with "'function' object has no
attribute 'dtype'", integrated gradients with "appears to not have been used in the graph", Grad-CAM with
"'NoneType' object has no attribute 'ndim'", Chefer's relevance named the wrong reason; and two answers were
silently wrong: ``count_flops`` counted 27% of the tiny ViT's FLOPs, and the sanity checks' randomisation left every
quantized layer trained (the head was not even listed), so a map looked insensitive to weights never changed.
"""

from __future__ import annotations

import pytest
import torch
from conformance import check_model
from conftest import tiny_timm_vit
from test_adapters import ref_called_projection
from torch import nn
from untouched import MODELS, images

import vitviz
from vitviz.analysis.explain import GRADIENT_METHODS
from vitviz.analysis.faithfulness import default_methods
from vitviz.analysis.sanity import randomisation_layers
from vitviz.core.contexts import quantized_layers
from vitviz.core.targets import logits_of
from vitviz.errors import UnsupportedModelError

# torch deprecates torch.ao.quantization in favour of torchao; the eager API is still in every torch vitviz supports
pytestmark = [pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated"),
              pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning:torchao.*")]

X = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))


def _quantized(model: nn.Module, dtype: torch.dtype = torch.qint8) -> nn.Module:
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=dtype)


@pytest.fixture(scope="module")
def float_and_quantized():
    torch.manual_seed(0)
    model = tiny_timm_vit()
    return model, _quantized(model)


@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16])
def test_quantized_maps_equal_attention_from_the_quantized_projection(dtype):
    """The conformance harness (maps against attention written out from ``qkv`` *called*, the quantized kernel
    included; rows; stream path; model and output unchanged) on a non-square grid."""
    torch.manual_seed(0)
    quantized = _quantized(tiny_timm_vit(), dtype)
    names = [name for name, _ in quantized_layers(quantized)]
    assert names[:2] == ["blocks.0.attn.qkv", "blocks.0.attn.proj"] and names[-1] == "head" and len(names) == 9
    check_model(quantized, X, reference=ref_called_projection)


def test_quantization_changes_the_maps_it_is_read_from(float_and_quantized):
    """What the conformance test reads is the quantized model's attention, not the float model's."""
    model, quantized = float_and_quantized
    with vitviz.capture_attention(model) as a, torch.no_grad():
        model(X)
    with vitviz.capture_attention(quantized) as b, torch.no_grad():
        quantized(X)
    assert not torch.equal(a.attentions[0], b.attentions[0])
    torch.testing.assert_close(b.attentions[0], a.attentions[0], rtol=0, atol=0.05)


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_gradient_methods_are_refused_naming_the_quantized_layer(float_and_quantized, method):
    model, quantized = float_and_quantized
    if method == "gradcam":
        pytest.importorskip("pytorch_grad_cam")
    if method in ("integrated_gradients", "input_x_gradient"):
        pytest.importorskip("captum")
    with pytest.raises(UnsupportedModelError, match=r"layer 'blocks\.0\.attn\.qkv' is quantized \(torch\.ao\.nn\."
                                                    r"quantized\.dynamic.*9 such layers\): .*no backward pass"):
        vitviz.explain(quantized, X, method=method)
    assert vitviz.explain(model, X, method=method).shape == (2, 4, 6)


@pytest.mark.parametrize("family", ["timm", "huggingface", "torchvision"])
def test_every_family_refuses_a_gradient_through_quantized_kernels(family):
    build, size = MODELS[family]
    torch.manual_seed(0)
    quantized = _quantized(build().eval())
    x = images(size)
    with pytest.raises(UnsupportedModelError, match="is quantized .*no backward pass"):
        vitviz.explain(quantized, x, method="chefer")
    assert vitviz.explain(quantized, x, method="rollout").isfinite().all()


def test_attnlrp_is_not_offered_and_not_in_the_default_method_lists(float_and_quantized):
    model, quantized = float_and_quantized
    assert vitviz.analysis.attnlrp.attnlrp_supported(model)
    assert not vitviz.analysis.attnlrp.attnlrp_supported(quantized)
    assert set(GRADIENT_METHODS) & set(default_methods(model))
    assert not set(GRADIENT_METHODS) & set(default_methods(quantized))
    assert "rollout" in default_methods(quantized)


def test_count_flops_refuses_what_the_counter_cannot_see(float_and_quantized):
    """The counter itself, run on the quantized model, sees 27% of the float model's FLOPs (docs/trust.md's figure)."""
    from torch.utils.flop_counter import FlopCounterMode

    from vitviz.analysis.flops import sdpa_math_backend

    model, quantized = float_and_quantized
    counts = []
    for net in (model, quantized):  # as count_flops counts: attention on SDPA's math backend
        with sdpa_math_backend(), FlopCounterMode(display=False) as counter, torch.no_grad():
            net(X[:1])
        counts.append(counter.get_total_flops())
    assert counts[0] == vitviz.count_flops(model) and round(100 * counts[1] / counts[0]) == 27
    with pytest.raises(UnsupportedModelError, match=r"count_flops: .*'blocks\.0\.attn\.qkv' is quantized.*no formula"
                                                    r".*float model"):
        vitviz.count_flops(quantized)
    assert vitviz.count_flops(model) > 0


def test_randomisation_tests_are_refused_and_the_others_run(float_and_quantized):
    """The cascading and independent tests re-initialise parameters; a quantized layer's weights are none."""
    model, quantized = float_and_quantized
    assert [name for name, _ in randomisation_layers(model)][:2] == ["head", "norm"]
    with pytest.raises(UnsupportedModelError, match=r"'blocks\.0\.attn\.qkv' is quantized.*packed.*float model"):
        randomisation_layers(quantized)
    for tests in (("cascading",), ("independent",)):
        with pytest.raises(UnsupportedModelError, match="packed"):
            vitviz.sanity_checks(quantized, X, methods=["rollout"], tests=tests)
    table = vitviz.sanity_checks(quantized, X, tests=("repeat", "random_logit"))
    assert set(table["method"]) == {"attention", "rollout", "random"}  # the gradient-free methods, by default
    assert (table.query("test == 'repeat'")["value"].dropna() == 1).all()


def test_packed_weights_count_as_parameters(float_and_quantized):
    """``weight()`` / ``bias()`` of a quantized layer are its parameters: the counts equal the float model's."""
    model, quantized = float_and_quantized
    assert vitviz.inspect(quantized).params == vitviz.inspect(model).params


def test_quantized_model_is_left_as_it_was(float_and_quantized):
    _, quantized = float_and_quantized

    def state():
        packed = [(name, m.weight().dequantize(), m.bias()) for name, m in quantized_layers(quantized)]
        return packed, {k: v.clone() for k, v in quantized.state_dict().items() if isinstance(v, torch.Tensor)}

    before = state()
    with torch.no_grad():
        out = quantized(X)
    with pytest.raises(UnsupportedModelError):
        vitviz.explain(quantized, X, method="chefer")
    vitviz.explain(quantized, X, method="rollout")
    with torch.no_grad():
        assert torch.equal(quantized(X), out)
    after = state()
    assert [n for n, *_ in before[0]] == [n for n, *_ in after[0]] and before[1].keys() == after[1].keys()
    for (_, w0, b0), (_, w1, b1) in zip(before[0], after[0]):
        assert torch.equal(w0, w1) and torch.equal(b0, b1)
    for k, v in before[1].items():
        assert torch.equal(v, after[1][k]), k


# ------------------------------------------------------------------------------------------------ torchao's quantize_

def _torchao(kind: str) -> nn.Module:
    """The tiny ViT with torchao's int8 weight-only or dynamic int8 activation + weight quantization: the
    configuration classes of torchao >= 0.9, or the functions of the older releases (torch 2.5's torchao 0.7)."""
    ao = pytest.importorskip("torchao.quantization")
    config = {"weight": ("Int8WeightOnlyConfig", "int8_weight_only"),
              "dynamic": ("Int8DynamicActivationInt8WeightConfig", "int8_dynamic_activation_int8_weight")}[kind]
    make = getattr(ao, config[0], None) or getattr(ao, config[1])
    torch.manual_seed(0)
    model = tiny_timm_vit()
    ao.quantize_(model, make())
    return model


@pytest.mark.parametrize("kind", ["weight", "dynamic"])
def test_torchao_quantized_maps_are_read_as_computed_and_the_rest_refused(kind):
    model = _torchao(kind)
    layers = quantized_layers(model)
    assert [name for name, _ in layers][:2] == ["blocks.0.attn.qkv", "blocks.0.attn.proj"] and len(layers) == 9
    # int8 activations: the capture's explicit attention (float rounding off the fused kernel's) can flip a rounding
    # of the next layer's input quantization, a step of up to ~1/127 of its range; the maps are held to the default
    check_model(model, X, reference=ref_called_projection, output_atol=1e-4 if kind == "weight" else 0.1)
    named = r"'blocks\.0\.attn\.qkv' is quantized \(a Linear with torchao's \w+ weights; 9 such layers\)"
    for method in ("chefer", "attnlrp", "input_x_gradient"):
        if method == "input_x_gradient":
            pytest.importorskip("captum")
        with pytest.raises(UnsupportedModelError, match=named + ".*no backward pass"):
            vitviz.explain(model, X, method=method)
    with pytest.raises(UnsupportedModelError, match=named + ".*no formula"):
        vitviz.count_flops(model)
    with pytest.raises(UnsupportedModelError, match=named + ".*quantized tensors"):
        vitviz.sanity_checks(model, X, methods=["rollout"], tests=("cascading",))
    assert not set(GRADIENT_METHODS) & set(default_methods(model))


def test_torchao_dynamic_int8_hides_compute_from_the_counter():
    """Why count_flops refuses torchao's layers: with int8 activations the counter misses the integer matmuls."""
    from torch.utils.flop_counter import FlopCounterMode

    from vitviz.analysis.flops import sdpa_math_backend

    torch.manual_seed(0)
    counts = []
    for net in (tiny_timm_vit(), _torchao("dynamic")):
        with sdpa_math_backend(), FlopCounterMode(display=False) as counter, torch.no_grad():
            net(X[:1])
        counts.append(counter.get_total_flops())
    if counts[1] == counts[0]:
        pytest.skip("this torchao dequantizes the int8 activations on the CPU (torchao 0.7): the counter sees all")
    assert counts[1] < 0.5 * counts[0]


def test_quantized_layers_are_torchs_quantized_modules_and_not_their_float_kin():
    """What a statically quantized model holds after ``convert`` counts (its modules compute with packed weights);
    a reference quantized module (float weights, fake-quantised in a differentiable forward), ``FloatFunctional``
    and the packed-parameter holders do not."""
    from torch.ao.nn import quantized as nnq
    from torch.ao.nn.quantized import reference as nnqr

    model = nn.Sequential(nn.Linear(4, 4), nnq.Linear(4, 4), nnq.FloatFunctional(), nnqr.Linear(4, 4),
                          nnq.Conv2d(3, 3, 1), nnq.Quantize(1.0, 0, torch.quint8))
    assert [name for name, _ in quantized_layers(model)] == ["1", "4", "5"]
    assert quantized_layers(nn.Sequential(nn.Linear(4, 4), nnqr.Linear(4, 4), nnq.FloatFunctional())) == []


def test_a_quantized_classifier_head_is_read_as_the_logits(float_and_quantized):
    """``quantize_dynamic``'s ``Linear`` holds no ``nn.Parameter``: the head is still a classifier, not a
    weightless one (``nn.Identity``) that would make the model headless."""
    model, quantized = float_and_quantized
    df = vitviz.faithfulness(quantized, X, methods=["rollout"], modes=("deletion",), steps=0.5, progress=False)
    assert set(df["metric"]) == {"probability"} and df["score"].between(0, 1).all()
    with torch.no_grad():
        torch.testing.assert_close(logits_of(quantized(X), quantized), quantized(X), rtol=0, atol=0)
