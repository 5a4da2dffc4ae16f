"""What a vitviz call must leave as it was, for ``test_model_unchanged*.py``: models made deliberately untidy
(``roughen``), snapshots of the model and of the process's global state, and ``unchanged``, the block that
compares them bit for bit (see ``test_model_unchanged.py``)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import random
import sys
import warnings
import weakref
from collections.abc import Callable

import matplotlib
import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit
from torch import nn
from torch.utils.data import TensorDataset

from vitviz.analysis import baselines

# What a library does when it is first imported is its own: cv2 and scikit-learn set environment variables;
# scipy, numpy's matrix module and sympy add warnings filters. They are imported here, before any snapshot.
# pytorch-grad-cam is not: its first import (rich draws a random id) must not move Python's random generator.
for _library in ("cv2", "sklearn", "scipy.sparse", "scipy.special", "networkx", "sympy", "torch.utils.flop_counter"):
    with contextlib.suppress(ImportError):
        importlib.import_module(_library)

_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its UserHooks (``roughen``)
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
        self.param_calls = 0  # the parameter hooks': a vitviz call must never run them
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

    def param_grad(self, grad):
        self.param_calls += 1

    def param_accumulated(self, param):
        self.param_calls += 1


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
    for i, p in enumerate(p for p in model.parameters() if p.requires_grad):
        (p.register_hook if i % 2 else p.register_post_accumulate_grad_hook)(
            hooks.param_grad if i % 2 else hooks.param_accumulated)
    _HOOKS[model] = hooks
    return hooks


# ---------------------------------------------------------------- what must not change


def parametrizations(model: nn.Module) -> list:
    """Per parametrized module (``torch.nn.utils.parametrize``, weight and spectral norm): its name, its tensors'
    names and the classes of their parametrizations, in order."""
    from torch.nn.utils import parametrize

    return [(name, {k: [type(p) for p in plist] for k, plist in m.parametrizations.items()})
            for name, m in model.named_modules() if parametrize.is_parametrized(m)]


def model_state(model: nn.Module) -> dict:
    config = getattr(model, "config", None)
    return {
        "parametrizations": parametrizations(model),
        "tensors": {k: (id(v), v.dtype, v.device, v.detach().clone())
                    for k, v in [*model.named_parameters(), *model.named_buffers()]},
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        # an in-place write, even of the same values, bumps a version: a graph of yours that saved the tensor could
        # then not run its backward pass, and a cache keyed by versions would be dropped
        "versions": {k: None if v.is_inference() else v._version
                     for k, v in [*model.named_parameters(), *model.named_buffers()]},
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()},
        "grad_objects": {k: id(p.grad) for k, p in model.named_parameters()},
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "param_attrs": {k: (sorted(vars(p)), p.retains_grad) for k, p in model.named_parameters()},
        "param_hooks": {k: (list(getattr(p, "_backward_hooks", None) or {}),
                            list(getattr(p, "_post_accumulate_grad_hooks", None) or {}))
                        for k, p in model.named_parameters()},
        "param_hook_calls": getattr(_HOOKS.get(model), "param_calls", None),
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
        "module_hooks": {name: list(getattr(torch.nn.modules.module, name, {}))  # every module's (walk_once's)
                         for name in ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_hooks",
                                      "_global_backward_pre_hooks", "_global_module_registration_hooks")},
        "mode_stacks": (torch._C._len_torch_function_stack(),
                        len(torch.utils._python_dispatch._get_current_dispatch_mode_stack())),
        "parametrize_cache": (torch.nn.utils.parametrize._cache_enabled, dict(torch.nn.utils.parametrize._cache)),
        "cudnn": (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic, b.cudnn.allow_tf32),
        "matmul": (torch.get_float32_matmul_precision(), b.cuda.matmul.allow_tf32,
                   b.cuda.matmul.allow_fp16_reduced_precision_reduction,
                   b.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "mkldnn": b.mkldnn.enabled,
        "default_device": torch.get_default_device(),
        "numpy_errors": np.geterr(),
        "numpy_print": np.get_printoptions(),
        "torch_print": vars(torch._tensor_str.PRINT_OPTS).copy(),
        "recursion_limit": sys.getrecursionlimit(),
        "interactive": matplotlib.is_interactive(),
        "backend": matplotlib.get_backend(),
        "loggers": {name: (lg.level, lg.disabled, list(lg.handlers), lg.propagate)
                    for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)},
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
        elif key == "loggers":  # a library imported for the first time adds its own; those there stay as they were
            assert {k: b.get(k) for k in a} == a, "a logger's level, handlers or propagation changed"
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


def images(size: tuple[int, int], n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(3))


def dataset(x: torch.Tensor) -> TensorDataset:
    return TensorDataset(x, torch.arange(len(x)) % 2)


def needs(name: str) -> None:
    """Skip unless the library a baseline method (``explain-gradcam``, ``integrated_gradients``...) needs is here."""
    method = name.removeprefix("explain-")
    if method in baselines.LIBRARIES and method not in baselines.installed():
        pytest.skip(f"{method} needs {baselines.LIBRARIES[method]}, which is not installed")

