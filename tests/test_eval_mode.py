"""The analyses run the model in eval mode and put every module's mode back (``vitviz.core.calls.in_eval_mode``).

A model from ``timm.create_model`` or a training loop is in training mode. There dropout would make every map a
random draw and BatchNorm would update its running statistics, so each analysis is checked here against the same
call on the model in eval mode, and the model afterwards against its state before: modes per module, buffers.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit
from torch.utils.data import TensorDataset

import vitviz
from vitviz.core.util import eval_mode

X = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))
DROPOUT = dict(drop_rate=0.5, pos_drop_rate=0.5, attn_drop_rate=0.5, proj_drop_rate=0.5, drop_path_rate=0.5)

CALLS = {
    **{f"explain-{m}": (lambda model, m=m: vitviz.explain(model, X, m, target=None if m in (
        "attention", "rollout", "flow", "random") else [1, 3])) for m in (
        "attention", "rollout", "flow", "grad_rollout", "chefer", "attnlrp", "input_x_gradient", "gradcam")},
    "integrated_gradients": lambda model: vitviz.integrated_gradients(model, X, [1, 3], n_steps=4),
    "attention_rollout": lambda model: vitviz.attention_rollout(model, X),
    "attention_flow": lambda model: vitviz.attention_flow(model, X),
    "grad_rollout": lambda model: vitviz.grad_rollout(model, X, target=2),
    "chefer_relevance": lambda model: vitviz.chefer_relevance(model, X, target=2),
    "attnlrp": lambda model: vitviz.attnlrp(model, X, target=2),
    "mean_attention_distance": lambda model: vitviz.mean_attention_distance(model, X),
    "mean_attention_distance-dataset": lambda model: vitviz.mean_attention_distance(
        model, TensorDataset(X, torch.zeros(2, dtype=torch.long)), batch_size=1),
    "attention_statistics": lambda model: vitviz.attention_statistics(model, X)["mean_attention"],
    "extract_features": lambda model: vitviz.extract_features(
        model, (X, torch.tensor([0, 1])), layers="all").feats["pre_logits"],
    "faithfulness": lambda model: torch.tensor(vitviz.faithfulness(
        model, X, methods=["rollout"], target=[1, 3], modes=("deletion",), progress=False)["score"].to_numpy()),
}


def _modes(model: torch.nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_analysis_of_a_model_in_training_mode_is_that_of_the_model_in_eval_mode(name):
    """With dropout 0.5 everywhere, a call in training mode would be a random draw; it equals the eval call, and the
    model's mixed modes (its last block in eval, the rest training) are as they were."""
    torch.manual_seed(0)
    model = tiny_timm_vit(**DROPOUT)
    want = CALLS[name](model)  # eval mode
    model.train()
    model.blocks[-1].eval()
    before = _modes(model)
    got = CALLS[name](model)
    assert _modes(model) == before
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_batchnorm_statistics_are_not_updated():
    """A hybrid's BatchNorm in training mode would fold each batch into its running statistics."""
    model = vitviz.load_model("cifar10-hybrid").train()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    x = torch.randn(2, 3, 32, 32)
    vitviz.mean_attention_distance(model, x)
    vitviz.explain(model, x, "chefer", target=0)
    assert model.training and all(m.training for m in model.modules())
    for k, v in model.named_buffers():
        assert torch.equal(v, buffers[k]), k


def test_the_modes_come_back_when_the_call_raises():
    model = tiny_timm_vit().train()
    model.head.eval()
    before = _modes(model)
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        assert not any(_modes(model))
        raise RuntimeError("inside")
    assert _modes(model) == before
    with pytest.raises(vitviz.InputError):  # a bad argument, refused inside the decorated call
        vitviz.attention_rollout(model, X, head_fusion="median")
    assert _modes(model) == before


def test_the_heads_figure_is_that_of_the_model_in_eval_mode():
    torch.manual_seed(0)
    model = tiny_timm_vit(**DROPOUT)
    want = vitviz.plot_attention_heads_grid(model, X[:1], layer=1)
    model.train()
    got = vitviz.plot_attention_heads_grid(model, X[:1], layer=1)
    assert model.training
    pairs = list(zip(want.axes, got.axes))
    assert all(len(a.images) == len(b.images) for a, b in pairs)
    for a, b in pairs:
        for ia, ib in zip(a.images, b.images):
            assert (ia.get_array() == ib.get_array()).all()
