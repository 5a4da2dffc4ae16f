"""target=: class indices, one per image, or a callable on the raw output (headless models), resolved in one place."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_timm_vit

import vitviz
from vitviz.core.targets import logits_of, resolve_target
from vitviz.errors import InputError

LOGITS = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]], requires_grad=True)


def test_class_targets_pick_their_logit():
    r = resolve_target(None, LOGITS)
    assert r.classes.tolist() == [1, 0] and r.scores.tolist() == pytest.approx([2.0, 3.0])
    assert resolve_target(2, LOGITS).classes.tolist() == [2, 2]
    assert resolve_target([2, 1], LOGITS).scores.tolist() == pytest.approx([-1.0, 0.0])
    assert resolve_target(torch.tensor([0, 2]), LOGITS).classes.tolist() == [0, 2]
    assert resolve_target(np.array([1, 1]), LOGITS).classes.tolist() == [1, 1]
    assert resolve_target(np.int64(2), LOGITS).classes.tolist() == [2, 2]
    assert resolve_target(torch.tensor(1), LOGITS).classes.tolist() == [1, 1]
    assert resolve_target(0, LOGITS).scores.requires_grad  # in the graph, for the gradient methods


def test_per_image_lists_are_sliced_by_batch_and_their_length_checked():
    r = resolve_target([0, 1, 2, 0], LOGITS, start=2, n_images=4)
    assert r.classes.tolist() == [2, 0]
    with pytest.raises(InputError, match="3 class indices but there are 2 images"):
        resolve_target([0, 1, 2], LOGITS)


@pytest.mark.parametrize("bad, message", [
    (1.7, "target=1.7 is not an integer class index"),
    (True, "target=True is a bool"),
    ([1, True], "True in target=\\[1, True\\] is not one"),
    ([1, 0.5], "0.5 in target"),
    (torch.tensor([0.0, 1.0]), "torch.float32 tensor"),
    (torch.tensor([True, False]), "torch.bool tensor"),
    (torch.zeros(2, 1, dtype=torch.long), "1-D"),
    ("cat", "'cat' \\(str\\) is not understood"),
    (3, "target=3 is out of range: the model has 3 classes; give class indices in 0 ... 2"),
    ([0, -1], "target=-1 is out of range"),
])
def test_bad_targets_name_the_value_and_the_fix(bad, message):
    with pytest.raises(InputError, match=message) as info:
        resolve_target(bad, LOGITS)
    assert "target" in str(info.value)


def test_logits_are_read_from_tensors_tuples_and_model_outputs():
    class Out(dict):
        logits = LOGITS

    assert logits_of((LOGITS, None)) is LOGITS
    assert logits_of(Out()) is LOGITS
    with pytest.raises(InputError, match="no \\(B, classes\\) logits .* callable"):
        logits_of(torch.zeros(2, 3, 4))


def test_callable_targets_receive_the_raw_output():
    seen = []

    def score(out):
        seen.append(out)
        return out["emb"].norm(dim=-1)

    out = {"emb": torch.ones(2, 4)}
    r = resolve_target(score, out)
    assert seen[0] is out and r.classes is None and r.scores.tolist() == [2.0, 2.0]
    assert resolve_target(lambda o: o["emb"][:, :1], out).scores.shape == (2,)  # (B, 1) is accepted
    with pytest.raises(InputError, match="must return one score per image, shape \\(2,\\)"):
        resolve_target(lambda o: o["emb"], out)
    with pytest.raises(InputError, match="returned float"):
        resolve_target(lambda o: 1.0, out)


def test_headless_timm_model_explains_a_cosine_similarity():
    model = tiny_timm_vit(num_classes=0)  # a feature extractor: (B, D) embeddings, no classifier
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        reference = model(x[2:])[0]
    with pytest.raises(InputError, match="no classifier head \\(num_classes=0\\); pass a callable target"):
        vitviz.explain(model, x, "chefer", target=1)

    def similarity(out):
        return F.cosine_similarity(out, reference[None], dim=-1)

    for method in ("chefer", "grad_rollout"):
        maps = vitviz.explain(model, x, method, target=similarity)
        assert maps.shape == (3, 4, 6) and torch.isfinite(maps).all()
    # batches of one give the maps of the whole batch
    torch.testing.assert_close(vitviz.explain(model, x, "chefer", target=similarity, batch_size=1),
                               vitviz.explain(model, x, "chefer", target=similarity), atol=1e-6, rtol=1e-5)


def test_headless_hugging_face_model_gets_the_model_output_object():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64)
    model = ViTModel(cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    kinds = []

    def pooled_norm(out):
        kinds.append(type(out).__name__)
        return out.pooler_output.norm(dim=-1)

    maps = vitviz.grad_rollout(model, x, target=pooled_norm)
    assert maps.shape == (2, 4, 4) and kinds == ["BaseModelOutputWithPooling"]
    with pytest.raises(InputError, match="ViTModel holds no \\(B, classes\\) logits"):
        vitviz.grad_rollout(model, x, target=0)


def test_grad_rollout_callable_equals_the_class_target_it_names():
    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    torch.testing.assert_close(vitviz.grad_rollout(model, x, target=lambda out: out[:, 2]),
                               vitviz.grad_rollout(model, x, target=2))
    torch.testing.assert_close(vitviz.explain(model, x, "chefer", target=lambda out: out[:, 2]),
                               vitviz.explain(model, x, "chefer", target=[2, 2, 2]))


@pytest.mark.parametrize("method", ["chefer", "grad_rollout", "attnlrp"])
def test_a_score_that_is_not_finite_gives_that_image_a_nan_map_and_no_other(method):
    """No read refuses a NaN score (the gradient methods read nothing between their passes): that image's map is
    NaN, where it cannot pass for a real map, and every other image's map is the finite target's, in one batch or
    several."""
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    seen = []  # images scored so far: the callable sees the set batch by batch

    def spoiled(out):  # NaN for image 3 of the set: its score times NaN, the others times 1
        s = out[:, 0]
        index = torch.arange(len(s), device=s.device) + sum(seen)
        seen.append(len(s))
        return s * torch.where(index == 3, float("nan"), 1.0)

    want = vitviz.explain(model, x, method, target=lambda out: out[:, 0])
    assert bool(torch.isfinite(want).all())
    for batch_size in (None, 2):
        seen.clear()
        got = vitviz.explain(model, x, method, target=spoiled, batch_size=batch_size)
        assert bool(torch.isnan(got[3]).all())
        torch.testing.assert_close(got[:3], want[:3])
