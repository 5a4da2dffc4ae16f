"""A vitviz call stopped midway (a user's hook that raises, a ``KeyboardInterrupt``, a bad target in a later
batch) leaves the model and the process's global state as they were; so do a forward in a capture, the training
runner's ``evaluate`` and ``count_flops`` in every setting; Grad-CAM's first import moves no random generator.
What is compared: ``untouched.py`` and ``test_model_unchanged.py``."""

from __future__ import annotations

import pytest
import torch
from untouched import (
    MODELS,
    assert_same,
    global_state,
    hf_vit,
    hybrid,
    images,
    model_state,
    needs,
    roughen,
    unchanged,
)

import vitviz

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
        needs(name)
    build, size = MODELS[family]
    model = build()
    hooks = roughen(model)
    hooks.fail_at = (1 if name == "count_flops-backward" else 2, error)
    x = images(size)
    with unchanged(model), pytest.raises(type(error)):
        RAISING[name](model, x)
    assert hooks.calls >= hooks.fail_at[0]


@pytest.mark.parametrize("name", ["explain-chefer", "explain-grad_rollout", "explain-attnlrp", "gradcam",
                                  "input_x_gradient"])
def test_a_bad_target_in_the_second_batch_leaves_everything_as_it_was(name):
    needs(name)
    build, size = MODELS["hybrid"]
    model = build()
    roughen(model)
    x = images(size)
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

    needs("gradcam")
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


def _capture(model, x):
    with vitviz.capture_attention(model) as cap, torch.no_grad():
        model(x) if not hasattr(model, "config") else model(pixel_values=x)
    return cap


def test_a_forward_in_a_capture_changes_only_what_the_forward_itself_changes():
    """``capture_attention`` is not decorated: the user's forward runs in the user's modes (BatchNorm in training
    mode updates its statistics). The capture adds nothing to what the same forward does without it."""
    build, size = MODELS["hybrid"]
    model = build()
    roughen(model)
    x = images(size)
    torch.manual_seed(5)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    with torch.no_grad():
        plain = model(x)
    want = {k: v for k, v in {**model_state(model), **global_state()}.items() if k != "versions"}  # reset below
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
