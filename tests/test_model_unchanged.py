"""Every vitviz call that takes a model leaves the model, and the process's global state, exactly as it was.

The model is made deliberately non-trivial first (``roughen``): its modules in mixed training/eval modes, known
``.grad`` tensors on some parameters, some parameters frozen, a forward, a forward-pre and a full-backward hook of
the user's, timm's ``fused_attn`` mixed across blocks. After each call, also one that raises midway (a bad target
in the second batch, a user's hook that raises, a ``KeyboardInterrupt``), the test compares bit for bit: every
parameter and buffer (values, dtype, the objects themselves), every ``.grad`` (``None`` stays ``None``),
``requires_grad``, every module's ``training`` flag, its hook dicts, its attribute names (an instance ``forward``,
a cache left behind) and ``fused_attn``, a Hugging Face config; and the global state: grad mode, inference mode, autocast, the torch / NumPy / Python random
generators, the thread count, the SDPA backend flags and (for plots) matplotlib's rcParams.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import warnings
from collections.abc import Callable

import matplotlib
import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit
from torch import nn
from torch.utils.data import TensorDataset

import vitviz
from vitviz.analysis import baselines

# What a library does when it is first imported is its own: cv2 and scikit-learn set environment variables;
# scipy, numpy's matrix module and sympy add warnings filters. They are imported here, before any snapshot.
# pytorch-grad-cam is not: its first import (rich draws a random id) must not move Python's random generator.
for _library in ("cv2", "sklearn", "scipy.sparse", "scipy.special", "networkx", "sympy", "torch.utils.flop_counter"):
    with contextlib.suppress(ImportError):
        importlib.import_module(_library)

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
              "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
              "_load_state_dict_post_hooks")


# ---------------------------------------------------------------- the models, made non-trivial


def hybrid() -> nn.Module:
    from vitviz.zoo.reference import build_reference

    return build_reference("cifar10-hybrid", depth=2)


def hf_vit() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=5,
                                    hidden_dropout_prob=0.1)
    return transformers.ViTForImageClassification(config)


def torchvision_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                             num_classes=5, dropout=0.1)


def open_clip_vit() -> nn.Module:
    pytest.importorskip("open_clip")
    from open_clip.transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, width=32, layers=2, heads=4, mlp_ratio=2.0,
                             output_dim=5)


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, int]]] = {
    "timm": (lambda: tiny_timm_vit(drop_rate=0.1, proj_drop_rate=0.1, drop_path_rate=0.1), (32, 48)),
    "hybrid": (hybrid, (32, 32)),
    "huggingface": (hf_vit, (32, 32)),
    "torchvision": (torchvision_vit, (32, 32)),
    "open_clip": (open_clip_vit, (32, 32)),
}


class UserHooks:
    """A user's hooks: they count calls; ``fail_at=(n, exc)`` makes the forward hook raise ``exc`` on its n-th call."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_at: tuple[int, BaseException] | None = None

    def __deepcopy__(self, memo):  # a copy of the model (sanity checks) calls the same hooks
        return self

    def forward(self, module, args, output):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at[0]:
            raise self.fail_at[1]

    def pre(self, module, args):
        return None

    def backward(self, module, grad_input, grad_output):
        return None


def roughen(model: nn.Module) -> UserHooks:
    """Mixed modes, known grads, frozen parameters, user hooks and mixed ``fused_attn`` flags on ``model``."""
    model.train()
    for i, m in enumerate(model.modules()):
        if i % 3 == 1:
            m.training = False  # this module only: its children keep theirs
    gen = torch.Generator().manual_seed(7)
    for i, (_, p) in enumerate(model.named_parameters()):
        if i % 4 == 3:
            p.requires_grad_(False)
        if i % 3 == 0:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
    fused = [m for m in model.modules() if hasattr(m, "fused_attn")]
    for i, m in enumerate(fused):
        m.fused_attn = bool(i % 2)
    hooks = UserHooks()
    model.register_forward_hook(hooks.forward)
    model.register_forward_pre_hook(hooks.pre)
    last_linear = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        last_linear.register_full_backward_hook(hooks.backward)
    return hooks


# ---------------------------------------------------------------- what must not change


def model_state(model: nn.Module) -> dict:
    config = getattr(model, "config", None)
    return {
        "tensors": {k: (id(v), v.dtype, v.device, v.detach().clone())
                    for k, v in [*model.named_parameters(), *model.named_buffers()]},
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()},
        "grad_objects": {k: id(p.grad) for k, p in model.named_parameters()},
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "param_hooks": {k: list(getattr(p, "_backward_hooks", None) or {}) for k, p in model.named_parameters()},
        "modules": [(name, type(m), m.training, getattr(m, "fused_attn", None), sorted(vars(m)),
                     {d: list(getattr(m, d, {}) or {}) for d in HOOK_DICTS})
                    for name, m in model.named_modules()],
        "config": config.to_dict() if config is not None and hasattr(config, "to_dict") else None,
        "attn_impl": getattr(config, "_attn_implementation", None),
    }


def global_state() -> dict:
    b = torch.backends
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "autocast": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "threads": torch.get_num_threads(),
        "sdpa": (b.cuda.flash_sdp_enabled(), b.cuda.mem_efficient_sdp_enabled(), b.cuda.math_sdp_enabled(),
                 b.cuda.cudnn_sdp_enabled()),
        "mha_fastpath": b.mha.get_fastpath_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "anomaly": torch.is_anomaly_enabled(),
        "rcParams": dict(matplotlib.rcParams),
        "warnings": list(warnings.filters),
        "environ": dict(os.environ),
    }


def assert_same(before: dict, after: dict) -> None:
    for key in before:
        a, b = before[key], after[key]
        if key in ("tensors", "state_dict", "grads"):
            assert a.keys() == b.keys(), key
            for k in a:
                va, vb = a[k], b[k]
                if key == "tensors":
                    assert va[:3] == vb[:3], f"{key} {k}: object, dtype or device changed"
                    va, vb = va[3], vb[3]
                assert (va is None) == (vb is None), f"{key} {k}: {va is None} -> {vb is None}"
                if va is not None:
                    assert torch.equal(va, vb), f"{key} {k} changed"
        elif key == "torch_rng":
            assert torch.equal(a, b), "the global torch random generator moved"
        elif key == "numpy_rng":
            assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:], "NumPy's global generator moved"
        elif key == "modules":
            for ma, mb in zip(a, b):
                assert ma == mb, f"module {ma[0]!r}: {ma} -> {mb}"
            assert len(a) == len(b)
        else:
            assert a == b, f"{key}: {a} -> {b}"


@contextlib.contextmanager
def unchanged(model: nn.Module):
    """The block leaves ``model`` and the global state exactly as they were (also when it raises)."""
    torch.manual_seed(123)
    np.random.seed(123)
    before = {**model_state(model), **global_state()}
    try:
        yield
    finally:
        assert_same(before, {**model_state(model), **global_state()})


# ---------------------------------------------------------------- the calls


def _images(size: tuple[int, int], n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(3))


def _data(x: torch.Tensor) -> TensorDataset:
    return TensorDataset(x, torch.arange(len(x)) % 2)


def _capture(model, x):
    with vitviz.capture_attention(model) as cap, torch.no_grad():
        model(x) if not hasattr(model, "config") else model(pixel_values=x)
    return cap


def _explorer(model, x):
    pytest.importorskip("ipywidgets")
    explorer = vitviz.explore_attention(model, x[:1], size=32)
    explorer.attentions(0)
    return explorer


def _reduce(model, x):
    from vitviz.analysis.distance import DistanceReduction

    return vitviz.reduce_dataset(model, _data(x), DistanceReduction(model), batch_size=1)


CAPTUM = ("integrated_gradients", "input_x_gradient")
CALLS: dict[str, Callable] = {
    "inspect": lambda m, x: vitviz.inspect(m),
    "describe": lambda m, x: vitviz.describe(m, probe="qkv"),
    "load_images": lambda m, x: vitviz.load_images(m, x),
    "capture_attention-no-forward": lambda m, x: _enter_exit(m),
    **{f"explain-{meth}": (lambda m, x, meth=meth: vitviz.explain(m, x, meth, target=None if meth in (
        "attention", "rollout", "flow", "random") else [1, 0])) for meth in (
        "attention", "rollout", "flow", "grad_rollout", "chefer", "attnlrp", "random", *CAPTUM, "gradcam")},
    "attention_rollout": lambda m, x: vitviz.attention_rollout(m, x),
    "attention_flow": lambda m, x: vitviz.attention_flow(m, x),
    "grad_rollout": lambda m, x: vitviz.grad_rollout(m, x, target=1),
    "chefer_relevance": lambda m, x: vitviz.chefer_relevance(m, x, target=1),
    "attnlrp": lambda m, x: vitviz.attnlrp(m, x, target=1),
    "integrated_gradients": lambda m, x: vitviz.integrated_gradients(m, x, 1, n_steps=3),
    "input_x_gradient": lambda m, x: vitviz.input_x_gradient(m, x, 1),
    "gradcam": lambda m, x: vitviz.gradcam(m, x, 1),
    "mean_attention_distance": lambda m, x: vitviz.mean_attention_distance(m, x),
    "mean_attention_distance-dataset": lambda m, x: vitviz.mean_attention_distance(m, _data(x), batch_size=1),
    "attention_statistics": lambda m, x: vitviz.attention_statistics(m, x),
    "attention_statistics-autocast": lambda m, x: vitviz.attention_statistics(m, x, autocast=torch.bfloat16),
    "reduce_dataset": _reduce,
    "pos_embed_similarity": lambda m, x: vitviz.pos_embed_similarity(m),
    "pos_embed_locality": lambda m, x: vitviz.pos_embed_locality(m),
    "embedding_filters": lambda m, x: vitviz.embedding_filters(m),
    "extract_features": lambda m, x: vitviz.extract_features(m, _data(x), layers="all"),
    "extract_features-autocast": lambda m, x: vitviz.extract_features(m, _data(x), autocast=torch.bfloat16),
    "knn_probe": lambda m, x: vitviz.knn_probe(m, _data(x), _data(x), k=1),
    "linear_fewshot": lambda m, x: vitviz.linear_fewshot(m, _data(x), _data(x), shots=(1,), seeds=[0]),
    "layer_probes": lambda m, x: vitviz.layer_probes(m, _data(x), _data(x), shots=(1,), seeds=[0]),
    "per_class_subset": lambda m, x: vitviz.per_class_subset(m, _data(x), 1),
    "faithfulness": lambda m, x: vitviz.faithfulness(m, x, methods=["rollout", "chefer", "random"], target=1,
                                                     modes=("deletion",), steps=0.5, progress=False),
    "sanity_checks": lambda m, x: vitviz.sanity_checks(m, x, methods=["chefer", "rollout"],
                                                       tests=("cascading", "random_logit", "repeat")),
    "count_flops-forward": lambda m, x: vitviz.count_flops(m, (3, *x.shape[-2:])),
    "count_flops-backward": lambda m, x: vitviz.count_flops(m, (3, *x.shape[-2:]), backward=True),
    "plot_pos_embed": lambda m, x: vitviz.plot_pos_embed(m),
    "plot_pos_embed_similarity": lambda m, x: vitviz.plot_pos_embed_similarity(m),
    "plot_embedding_filters": lambda m, x: vitviz.plot_embedding_filters(m),
    "plot_filter_variance": lambda m, x: vitviz.plot_filter_variance(m),
    "plot_attention_distance": lambda m, x: vitviz.plot_attention_distance(m, x),
    "plot_attention_distance_grid": lambda m, x: vitviz.plot_attention_distance_grid({"a": m}, x),
    "plot_rollout": lambda m, x: vitviz.plot_rollout(m, x),
    "plot_attention_heads_grid": lambda m, x: vitviz.plot_attention_heads_grid(m, x[:1]),
    "plot_explanations_grid": lambda m, x: vitviz.plot_explanations_grid(m, x, {"chefer": vitviz.explain(m, x)}),
    "explore_attention": _explorer,
    "explore_pos_embed": lambda m, x: vitviz.explore_pos_embed(m, size=32),
}


def _enter_exit(model):
    with vitviz.capture_attention(model, layers=[0, -1]):
        pass


def _needs(name: str) -> None:
    method = name.removeprefix("explain-")
    if method in baselines.LIBRARIES and method not in baselines.installed():
        pytest.skip(f"{method} needs {baselines.LIBRARIES[method]}, which is not installed")


REFUSED = {("open_clip", "explain-attnlrp")}  # vitviz says why, by design


def _call(name: str, model: nn.Module, x: torch.Tensor, family: str) -> None:
    import matplotlib.pyplot as plt

    try:
        if (family, name) in REFUSED:  # a refusal must leave no trace either
            with pytest.raises(vitviz.VitvizError):
                CALLS[name](model, x)
        else:
            CALLS[name](model, x)
    finally:
        plt.close("all")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_on_a_timm_vit_leaves_everything_as_it_was(name):
    _needs(name)
    build, size = MODELS["timm"]
    model = build()
    roughen(model)
    x = _images(size)
    with unchanged(model):
        _call(name, model, x, "timm")


HYBRID_CALLS = ("count_flops-forward", "count_flops-backward", "explain-chefer", "explain-attnlrp", "gradcam",
                "input_x_gradient", "mean_attention_distance", "extract_features", "faithfulness", "sanity_checks",
                "plot_embedding_filters", "plot_rollout")


@pytest.mark.parametrize("name", HYBRID_CALLS)
def test_a_call_on_a_hybrid_with_batchnorm_leaves_everything_as_it_was(name):
    _needs(name)
    build, size = MODELS["hybrid"]
    model = build()
    roughen(model)
    assert any(isinstance(m, nn.BatchNorm2d) and m.training for m in model.modules())
    x = _images(size)
    with unchanged(model):
        _call(name, model, x, "hybrid")


OTHER_CALLS = ("capture_attention-no-forward", "explain-chefer", "explain-grad_rollout", "explain-attnlrp",
               "attention_rollout", "mean_attention_distance", "extract_features", "gradcam", "count_flops-forward",
               "count_flops-backward", "sanity_checks", "plot_pos_embed")


@pytest.mark.parametrize("family", ["huggingface", "torchvision", "open_clip"])
@pytest.mark.parametrize("name", OTHER_CALLS)
def test_a_call_on_other_families_leaves_everything_as_it_was(family, name):
    _needs(name)
    build, size = MODELS[family]
    model = build()
    roughen(model)
    x = _images(size)
    with unchanged(model):
        _call(name, model, x, family)


def test_a_forward_in_a_capture_changes_only_what_the_forward_itself_changes():
    """``capture_attention`` is not decorated: the user's forward runs in the user's modes (BatchNorm in training
    mode updates its statistics). The capture adds nothing to what the same forward does without it."""
    build, size = MODELS["hybrid"]
    model = build()
    roughen(model)
    x = _images(size)
    torch.manual_seed(5)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    with torch.no_grad():
        plain = model(x)
    want = {**model_state(model), **global_state()}
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    torch.manual_seed(5)
    with torch.no_grad():
        captured = _capture(model, x)
    assert len(captured.attentions) == 2
    assert_same(want, {**model_state(model), **global_state()})
    with torch.no_grad():
        torch.manual_seed(5)
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
        assert torch.equal(model(x), plain)


# ---------------------------------------------------------------- calls that raise midway


RAISING = {
    "explain-chefer": lambda m, x: vitviz.explain(m, x, "chefer", target=1, batch_size=1),
    "gradcam": lambda m, x: vitviz.gradcam(m, x, 1, batch_size=1),
    "attention_rollout": lambda m, x: vitviz.attention_rollout(m, x, batch_size=1),
    "faithfulness": lambda m, x: vitviz.faithfulness(m, x, methods=["chefer"], target=1, modes=("deletion",),
                                                     steps=0.5, progress=False, batch_size=1),
    "sanity_checks": lambda m, x: vitviz.sanity_checks(m, x, methods=["chefer"], tests=("cascading",),
                                                       batch_size=1),
    "count_flops-backward": lambda m, x: vitviz.count_flops(m, (3, *x.shape[-2:]), backward=True),
}


@pytest.mark.parametrize("family", ["timm", "hybrid"])
@pytest.mark.parametrize("error", [RuntimeError("user hook"), KeyboardInterrupt()], ids=["error", "interrupt"])
@pytest.mark.parametrize("name", sorted(RAISING))
def test_a_call_stopped_by_a_users_hook_leaves_everything_as_it_was(name, error, family):
    if name == "gradcam":
        _needs(name)
    build, size = MODELS[family]
    model = build()
    hooks = roughen(model)
    hooks.fail_at = (1 if name == "count_flops-backward" else 2, error)
    x = _images(size)
    with unchanged(model), pytest.raises(type(error)):
        RAISING[name](model, x)
    assert hooks.calls >= hooks.fail_at[0]


@pytest.mark.parametrize("name", ["explain-chefer", "explain-grad_rollout", "explain-attnlrp", "gradcam",
                                  "input_x_gradient"])
def test_a_bad_target_in_the_second_batch_leaves_everything_as_it_was(name):
    _needs(name)
    build, size = MODELS["hybrid"]
    model = build()
    roughen(model)
    x = _images(size)
    method = name.removeprefix("explain-")
    with unchanged(model), pytest.raises(vitviz.InputError):
        vitviz.explain(model, x, method, target=[1, 99], batch_size=1)


def test_evaluate_of_the_training_runner_leaves_everything_as_it_was():
    """``experiments.measure.evaluate`` (each epoch's test accuracy) runs in eval mode and keeps mixed modes."""
    from vitviz.experiments.data import TensorDataset as Decoded
    from vitviz.experiments.measure import evaluate

    model = hybrid()
    hooks = roughen(model)
    data = Decoded(torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1, 2]), ["a", "b", "c"])
    with unchanged(model):
        acc = evaluate(model, data, torch.device("cpu"), batch_size=2)
    hooks.calls, hooks.fail_at = 0, (2, KeyboardInterrupt())
    with unchanged(model), pytest.raises(KeyboardInterrupt):
        evaluate(model, data, torch.device("cpu"), batch_size=2)
    assert 0 <= acc <= 100


def test_count_flops_counts_a_training_step_also_under_no_grad_and_for_a_hugging_face_output():
    """The backward pass runs with grad enabled whatever the caller's mode, and starts from a Hugging Face model's
    logits (its output is a ``ModelOutput``, not a tensor)."""
    model = hf_vit().eval()
    forward = vitviz.count_flops(model)
    step = vitviz.count_flops(model, backward=True)
    with torch.no_grad():
        assert vitviz.count_flops(model, backward=True) == step
    assert step > 2 * forward > 0


def test_the_first_grad_cam_call_in_a_fresh_process_moves_no_random_generator():
    """pytorch-grad-cam is imported on first use, and a library it imports draws from Python's ``random`` at import
    (rich's style ids); vitviz imports it with the generators kept (``baselines``), so a seeded script gives the
    same draws with or without a Grad-CAM call in the middle. A fresh interpreter: the import happens in the call."""
    import subprocess
    import sys

    _needs("gradcam")
    code = (
        "import random, sys, numpy as np, torch\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import tiny_timm_vit\n"
        "import vitviz\n"
        "assert 'pytorch_grad_cam' not in sys.modules\n"
        "model, x = tiny_timm_vit(), torch.zeros(1, 3, 32, 48)\n"
        "random.seed(0); np.random.seed(0); torch.manual_seed(0)\n"
        "before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())\n"
        "vitviz.gradcam(model, x, 1)\n"
        "assert 'pytorch_grad_cam' in sys.modules\n"
        "assert random.getstate() == before[0], 'random'\n"
        "assert (np.random.get_state()[1] == before[1]).all(), 'numpy'\n"
        "assert torch.equal(torch.get_rng_state(), before[2]), 'torch'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
