"""A vitviz call gives the same result in the caller's contexts as in a plain call, bit for bit, or refuses with a
vitviz error that names the cause and the fix; never a raw torch error.

The contexts: ``torch.no_grad()``, ``torch.inference_mode()``, ``torch.autocast("cpu", dtype=torch.bfloat16)``
(the call's own ``autocast=`` decides the precision, not the caller's), an input made in inference mode, and a
model whose parameters are inference tensors (built and loaded inside ``torch.inference_mode()``): the analyses
without a backward pass run on it, the gradient ones refuse it with ``InferenceTensorError`` (``core.contexts.autograd``;
``sanity_checks`` runs on a copy of its own with normal tensors, and works). Each call also leaves the model and
the process as they were (``untouched.unchanged``). The calls are those of ``test_model_unchanged.py``.
"""

from __future__ import annotations

import copy
import io

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
from test_model_unchanged import CALLS, call_of
from untouched import MODELS, images, needs, roughen, unchanged

import vitviz
from vitviz.errors import InferenceTensorError

# the calls with a backward pass through the model: refused on a model of inference tensors
GRADIENT = {"attnlrp", "attnlrp-pixels", "chefer_relevance", "count_flops-backward", "faithfulness", "grad_rollout", "gradcam",
            "input_x_gradient", "integrated_gradients", "plot_explanations_grid",
            *(f"explain-{m}" for m in ("attnlrp", "chefer", "grad_rollout", "gradcam", "input_x_gradient",
                                       "integrated_gradients"))}
CONTEXTS = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


def flat(value, out: list) -> list:
    """Every number, string and drawn pixel of a result, in a fixed order (tensors as float64 arrays)."""
    if isinstance(value, torch.Tensor):
        out.append(value.detach().double().cpu().numpy())
    elif isinstance(value, np.ndarray):
        out.append(value)
    elif isinstance(value, (int, float, str, bool, type(None))):
        out.append(value)
    elif isinstance(value, pd.DataFrame):
        out.append(value.to_string())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            flat(value[k], out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            flat(v, out)
    elif isinstance(value, torch.nn.Module):
        pass
    elif isinstance(getattr(value, "figure", value), matplotlib.figure.Figure):
        buf = io.BytesIO()
        getattr(value, "figure", value).savefig(buf, format="rgba")
        out.append(buf.getvalue())
    elif hasattr(value, "png"):  # an explorer: the PNG it shows
        out.append(value.png)
    elif hasattr(value, "__dict__"):
        flat({k: v for k, v in vars(value).items() if not k.startswith("_")}, out)
    else:
        out.append(repr(value))
    return out


def assert_equal(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for a, b in zip(got, want):
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.shape == b.shape and np.array_equal(a, b, equal_nan=True), what
        else:
            assert a == b, what


def result(name: str, model, x) -> list:
    import matplotlib.pyplot as plt

    try:
        return flat(call_of(name, model)(model, x), [])
    finally:
        plt.close("all")


def inference_copy(model):
    """The same model, built and loaded inside ``torch.inference_mode()``: every parameter an inference tensor."""
    state = copy.deepcopy(model.state_dict())
    with torch.inference_mode():
        twin = copy.deepcopy(model)
        twin.load_state_dict(state)
    assert all(t.is_inference() for t in [*twin.parameters(), *twin.buffers()])
    return twin


def _case(family: str):
    build, size = MODELS[family]
    torch.manual_seed(0)
    return build().eval(), images(size)


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_inside_a_callers_context_is_the_plain_call(name, context):
    needs(name)
    model, x = _case("timm")
    roughen(model)  # hooks, grads, mixed modes: kept also in the caller's context
    want = result(name, model, x)
    with unchanged(model), CONTEXTS[context]():
        got = result(name, model, x)
    assert_equal(got, want, f"{name} inside {context}")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_input_made_in_inference_mode_gives_the_plain_result(name):
    needs(name)
    model, x = _case("timm")
    want = result(name, model, x)
    with torch.inference_mode():
        x = x.clone()
    assert x.is_inference()
    assert_equal(result(name, model, x), want, name)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_model_of_inference_tensors_gives_the_plain_result_or_a_clear_refusal(name):
    needs(name)
    model, x = _case("timm")
    want = result(name, model, x)
    twin = inference_copy(model)
    for context in (torch.enable_grad, torch.inference_mode):
        if name in GRADIENT:
            with pytest.raises(InferenceTensorError, match="inference tensor") as e:
                result(name, twin, x)
            assert "outside inference mode" in str(e.value) and "clone" in str(e.value)
        else:
            with context():
                assert_equal(result(name, twin, x), want, name)


def test_the_refusals_fix_works():
    """The message's fix (clone the tensors outside inference mode, assign them) gives the plain call's maps."""
    model, x = _case("timm")
    want = vitviz.explain(model, x, "chefer", target=1)
    twin = inference_copy(model)
    with pytest.raises(InferenceTensorError) as e:
        vitviz.explain(twin, x, "chefer", target=1)
    assert "assign=True" in str(e.value)
    twin.load_state_dict({k: v.clone() for k, v in twin.state_dict().items()}, assign=True)
    assert not any(p.is_inference() for p in twin.parameters()) and all(p.requires_grad for p in twin.parameters())
    torch.testing.assert_close(vitviz.explain(twin, x, "chefer", target=1), want, rtol=0, atol=0)


HYBRID = ("count_flops-forward", "count_flops-backward", "explain-chefer", "gradcam", "faithfulness",
          "sanity_checks", "mean_attention_distance")


@pytest.mark.parametrize("name", HYBRID)
def test_a_hybrid_with_batchnorm_in_the_callers_contexts(name):
    """BatchNorm's buffers as inference tensors: ``kept_buffers`` writes them back in inference mode."""
    needs(name)
    model, x = _case("hybrid")
    assert_plain_in_every_context(name, model, x, name)


def assert_plain_in_every_context(name: str, model, x, what: str) -> None:
    """``name`` on ``model`` gives the plain call's result inside each caller's context, leaving the model as it
    was; on the model's inference-tensor twin, the plain result or (gradient methods) ``InferenceTensorError``."""
    want = result(name, model, x)
    for context in CONTEXTS.values():
        with unchanged(model), context():
            assert_equal(result(name, model, x), want, what)
    twin = inference_copy(model)
    if name in GRADIENT:
        with pytest.raises(InferenceTensorError):
            result(name, twin, x)
    else:
        assert_equal(result(name, twin, x), want, what)


OTHER = ("explain-chefer", "explain-grad_rollout", "gradcam", "attention_rollout", "extract_features",
         "count_flops-forward", "count_flops-backward", "sanity_checks")


@pytest.mark.parametrize("family", ["huggingface", "torchvision", "open_clip"])
@pytest.mark.parametrize("name", OTHER)
def test_other_families_in_the_callers_contexts(name, family):
    needs(name)
    model, x = _case(family)
    assert_plain_in_every_context(name, model, x, f"{name} on {family}")


def test_autocast_false_is_exact_inside_a_callers_autocast():
    """``autocast=False`` is the model's own precision also inside a caller's ``torch.autocast``."""
    model, x = _case("timm")
    want = vitviz.attention_statistics(model, x, autocast=False)["mean_attention"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = vitviz.attention_statistics(model, x, autocast=False)["mean_attention"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _saliency(model, x, classes):
    """A map method of the user's that differentiates: ``|d score / d x|`` summed per 8x8 patch."""
    x = x.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(x).gather(1, classes[:, None]).sum(), x)
    return torch.nn.functional.avg_pool2d(grad.abs().sum(1, keepdim=True), 8)[:, 0]


def test_a_users_gradient_method_in_faithfulness_runs_inside_inference_mode():
    """``faithfulness`` hands a callable method autograd and tensors it can differentiate through."""
    model, x = _case("timm")

    def run():
        return vitviz.faithfulness(model, x, methods={"saliency": _saliency}, target=1, modes=("deletion",),
                                   steps=0.5, progress=False)

    want = run()
    with torch.inference_mode():
        x = x.clone()  # an input made in inference mode too
        got = run()
    pd.testing.assert_frame_equal(got, want, check_exact=True)
