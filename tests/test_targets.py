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


def _torchvision_vit(heads: torch.nn.Module | None = None) -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=7)
    if heads is not None:
        model.heads = heads  # the usual way to take the classifier off: the output is the (B, 32) class token
    return model.eval()


def _open_clip_tower() -> torch.nn.Module:
    pytest.importorskip("open_clip")
    from hf_models import open_clip_tower

    return open_clip_tower(image_size=32)  # its output: the (B, 16) image embedding after proj


def _open_clip_model() -> torch.nn.Module:
    pytest.importorskip("open_clip")
    from hf_models import open_clip_model

    return open_clip_model()  # model(images): (image features, None, logit scale)


def _timm_without_head() -> torch.nn.Module:
    model = tiny_timm_vit()
    model.head = torch.nn.Identity()  # num_classes still says 10: the output is the (B, D) pooled feature
    return model


HEADLESS = {  # (model, input size, why it has no classifier head, as the refusal says)
    "open_clip-tower": (_open_clip_tower, (32, 32), "an open_clip model: its output is the 16-dimensional image "
                                                    "embedding"),
    "open_clip-CLIP": (_open_clip_model, (32, 48), "an open_clip model"),
    "torchvision-Identity": (lambda: _torchvision_vit(torch.nn.Identity()), (32, 32), "heads is Identity"),
    "torchvision-empty": (lambda: _torchvision_vit(torch.nn.Sequential()), (32, 32), "heads is Sequential"),
    "timm-Identity": (_timm_without_head, (32, 48), "classifier is Identity"),
}


@pytest.mark.parametrize("target", [None, 1, [0, 1]], ids=["predicted", "int", "per-image"])
@pytest.mark.parametrize("kind", list(HEADLESS))
def test_a_class_target_on_a_headless_model_is_refused_and_a_score_is_explained(kind, target):
    """Their output is a (B, D) embedding: read as logits, target=None would explain its largest coordinate."""
    make, size, why = HEADLESS[kind]
    torch.manual_seed(0)
    model = make()
    x = torch.randn(2, 3, *size)
    name = type(model).__name__
    for method in ("chefer", "grad_rollout"):
        with pytest.raises(InputError, match=f"{name} has no classifier head \\(.*{why}.*\\); pass a callable "
                                             "target=lambda out"):
            vitviz.explain(model, x, method, target=target)
    with torch.no_grad():
        out = model(x)
        embedding = out[0] if isinstance(out, tuple) else out
    with pytest.raises(InputError, match=f"{name} has no classifier head"):
        logits_of(out, model)
    reference = torch.randn(embedding.shape[-1], generator=torch.Generator().manual_seed(1))

    def similarity(out):
        return F.cosine_similarity(out[0] if isinstance(out, tuple) else out, reference[None], dim=-1)

    maps = vitviz.explain(model, x, "chefer", target=similarity)
    assert maps.shape == (2, size[0] // 8, size[1] // 8) and torch.isfinite(maps).all() and maps.abs().sum() > 0


@pytest.mark.filterwarnings("ignore::vitviz.errors.CompletenessWarning")  # few steps, for speed: not converged
@pytest.mark.parametrize("call", ["gradcam", "integrated_gradients", "faithfulness", "sanity_checks"])
def test_every_entry_point_refuses_a_class_of_an_open_clip_tower(call):
    pytest.importorskip("captum")
    pytest.importorskip("pytorch_grad_cam")
    model = _open_clip_tower()
    x = torch.randn(2, 3, 32, 32)
    run = {"gradcam": lambda t: vitviz.explain(model, x, "gradcam", target=t),
           "integrated_gradients": lambda t: vitviz.explain(model, x, "integrated_gradients", target=t, n_steps=2),
           "faithfulness": lambda t: vitviz.faithfulness(model, x, methods=["chefer"], target=t, modes=("deletion",),
                                                         steps=0.5, progress=False),
           "sanity_checks": lambda t: vitviz.sanity_checks(model, x, methods=["chefer"], target=t,
                                                           tests=("repeat",))}[call]
    with pytest.raises(InputError, match="VisionTransformer has no classifier head.*target=lambda out"):
        run(None)
    run(lambda out: out.norm(dim=-1))  # a score per image runs


def test_a_torchvision_vit_with_a_linear_head_reads_logits():
    model = _torchvision_vit(torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5)))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert logits_of(model(x), model).shape == (2, 5)
    assert vitviz.explain(model, x, "chefer", target=4).shape == (2, 4, 4)


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
