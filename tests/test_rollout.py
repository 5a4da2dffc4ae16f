"""Attention rollout and gradient rollout: invariants on synthetic maps, an independent reference on real models."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from conftest import tiny_timm_vit
from torch import nn

import vitviz
from vitviz.analysis.relevance import grad_rollout_from_attentions
from vitviz.analysis.rollout import (
    RolloutReducer,
    discard_weakest,
    rollout_from_attentions,
    rollout_to_maps,
)
from vitviz.errors import LayerSelectError, VitvizError
from vitviz.zoo.reference import build_reference

# ---- an independent rollout, written from the formula with explicit loops, in float64 ------------------------


def ref_layer(w: torch.Tensor, p: int, discard: float, residual: bool, normalise: bool = True) -> torch.Tensor:
    """One layer's ``A`` from a fused ``(N, N)`` map, row by row."""
    n = w.shape[0]
    w = w.clone()
    for i in range(n):
        if normalise:
            w[i] = w[i] / w[i].sum()
        if discard > 0:
            cand = [j for j in range(p, n) if j != i]
            k = math.floor(discard * len(cand))
            for j in sorted(cand, key=lambda j: (float(w[i, j]), j))[:k]:
                w[i, j] = 0.0
            if normalise:
                w[i] = w[i] / w[i].sum()
    if residual:
        w = 0.5 * w + 0.5 * torch.eye(n, dtype=w.dtype)
        w = w / w.sum(dim=1, keepdim=True)
    return w


def ref_rollout(attns, p=1, fusion="mean", discard=0.0, residual=True) -> torch.Tensor:
    """``R = A_L ... A_1`` per image; attns: list of ``(B, H, N, N)``."""
    b, h, n, _ = attns[0].shape
    out = torch.zeros(b, n, n, dtype=torch.float64)
    for bi in range(b):
        r = torch.eye(n, dtype=torch.float64)
        for attn in attns:
            heads = [attn[bi, k].double() for k in range(h)]
            w = {"mean": sum(heads) / h, "max": torch.stack(heads).amax(0), "min": torch.stack(heads).amin(0)}[fusion]
            r = ref_layer(w, p, discard, residual) @ r
        out[bi] = r
    return out


def captured(model, x):
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    return cap.attentions


def softmax_maps(layers=3, b=2, h=3, n=9, sharp=3.0):
    return [torch.softmax(torch.randn(b, h, n, n) * sharp, dim=-1) for _ in range(layers)]


# ---- invariants on synthetic maps ------------------------------------------------------------------------------

@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("discard", [0.0, 0.6])
def test_identity_attention_rolls_out_to_identity(residual, discard):
    eye = torch.eye(11).expand(2, 4, 11, 11)
    r = rollout_from_attentions([eye] * 5, num_prefix_tokens=2, discard_ratio=discard, residual=residual)
    torch.testing.assert_close(r, torch.eye(11).expand(2, 11, 11), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("residual", [True, False])
def test_every_rollout_row_sums_to_one(fusion, discard, residual):
    r = rollout_from_attentions(softmax_maps(), head_fusion=fusion, discard_ratio=discard, residual=residual)
    assert (r >= 0).all()
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 9), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.5])
@pytest.mark.parametrize("residual", [True, False])
def test_pure_function_equals_the_formula(fusion, discard, residual):
    maps = softmax_maps(layers=4, n=10)
    got = rollout_from_attentions(maps, num_prefix_tokens=2, head_fusion=fusion, discard_ratio=discard,
                                  residual=residual)
    want = ref_rollout(maps, p=2, fusion=fusion, discard=discard, residual=residual)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_negative_start_layer_slices_the_blocks_like_the_maps():
    """``start_layer=-2`` keeps the last two maps and their block indices (two branches of one parallel block,
    averaged): the same as the non-negative index, and as the formula on the averaged branches."""
    maps = softmax_maps(layers=4, n=10)
    blocks = [0, 0, 1, 1]
    got = rollout_from_attentions(maps, num_prefix_tokens=2, start_layer=-2, blocks=blocks)
    torch.testing.assert_close(got, rollout_from_attentions(maps, num_prefix_tokens=2, start_layer=2, blocks=blocks))
    averaged = [(maps[2] + maps[3]) / 2]  # one block: the branches' head means averaged
    torch.testing.assert_close(got.double(), ref_rollout(averaged, p=2), atol=1e-5, rtol=1e-4)
    bad = [m.clone() for m in maps]
    bad[3][0, 0, 0, 0] = float("nan")
    with pytest.raises(VitvizError, match=r"attentions\[3\] \(layer 3"):  # the map's own index, not -1
        rollout_from_attentions(bad, start_layer=-1)


@pytest.mark.parametrize("start", [-5, 4, True, 1.0])
def test_start_layer_of_maps_in_hand_is_an_index_in_range(start):
    """The pure functions read ``start_layer`` as ``attention_rollout`` does: an int from ``-L`` to ``L - 1``. A slice
    would take ``-5`` of 4 maps as 0 (the whole product, silently) and ``True`` as 1; a float raised TypeError."""
    maps = softmax_maps(layers=4)
    for fn in (lambda s: rollout_from_attentions(maps, start_layer=s),
               lambda s: grad_rollout_from_attentions(maps, maps, start_layer=s)):
        with pytest.raises(LayerSelectError, match=rf"start_layer={start!r} "):
            fn(start)
        torch.testing.assert_close(fn(-4), fn(0))
        torch.testing.assert_close(fn(-1), fn(3))


def test_uniform_attention_gives_a_uniform_map():
    n, p, grid = 1 + 12, 1, (3, 4)
    uniform = torch.full((2, 3, n, n), 1.0 / n)
    r = rollout_from_attentions([uniform] * 4, num_prefix_tokens=p)
    for token in (0, None):  # the class token, and the mean over patch queries
        m = rollout_to_maps(r, grid, p, token)
        assert m.shape == (2, 3, 4)
        torch.testing.assert_close(m, m[:, :1, :1].expand_as(m), atol=1e-7, rtol=0)


def test_discard_never_zeroes_the_diagonal_or_prefix_columns():
    n, p = 10, 3
    w = torch.rand(4, n, n) + 0.01
    w[:, :, :p] = 1e-6  # the prefix columns are the weakest, and still survive
    w[:, torch.arange(n), torch.arange(n)] = 1e-7  # so is the diagonal
    for ratio in (0.5, 1.0):
        out = discard_weakest(w, ratio, p)
        assert (out[:, :, :p] > 0).all()
        assert (out.diagonal(dim1=-2, dim2=-1) > 0).all()
        zeros = (out == 0).sum(-1)  # per row: floor(ratio * patch columns other than the row itself)
        cand = torch.tensor([n - p if i < p else n - p - 1 for i in range(n)])
        assert torch.equal(zeros, torch.floor(ratio * cand).long().expand(4, n))
    out = discard_weakest(w, 0.5, p)
    for i in range(n):  # the zeroed entries are the row's weakest candidates
        cand = [j for j in range(p, n) if j != i]
        kept = [float(w[0, i, j]) for j in cand if out[0, i, j] > 0]
        dropped = [float(w[0, i, j]) for j in cand if out[0, i, j] == 0]
        assert max(dropped) <= min(kept)


def test_discard_breaks_ties_by_position_earlier_first():
    """Uniform attention (all ties) on a 3x4 grid: each row drops its first candidates in token order."""
    n, p = 1 + 12, 1
    out = discard_weakest(torch.full((2, n, n), 1.0 / n), 0.5, p)
    kept = (out > 0).int()
    # class row: 12 candidates, floor(0.5 * 12) = 6 dropped: the first six patches (grid rows 0 and half of 1)
    assert kept[0, 0, 1:].reshape(3, 4).tolist() == [[0, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]]
    # patch token 3 (row 0, col 2): 11 candidates, 5 dropped: tokens 1, 2, 4, 5, 6 (never itself, never token 0)
    assert kept[1, 3].tolist() == [1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert torch.equal(kept[0], kept[1])


def test_reducer_restarts_on_a_new_pass_and_rejects_bad_options():
    maps = softmax_maps()
    red = RolloutReducer()
    for _ in range(2):  # two forward passes in one capture block must not multiply into each other
        for i, a in enumerate(maps):
            red(i, a)
    torch.testing.assert_close(red.rollout, rollout_from_attentions(maps))
    with pytest.raises(ValueError, match="head_fusion"):
        RolloutReducer(head_fusion="median")
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout_from_attentions(maps, discard_ratio=1.5)


# ---- real (tiny) models against the reference -------------------------------------------------------------------

def deit_distilled():
    return timm.create_model("deit_tiny_distilled_patch16_224", img_size=(48, 64), depth=3).eval()  # 3x4 grid


def hybrid():
    return timm.create_model("vit_tiny_r_s16_p8_224", img_size=(64, 96), depth=2).eval()  # 2x3 grid, stride 32


MODELS = {
    "cls-4x6": lambda: tiny_timm_vit(),
    "registers": lambda: tiny_timm_vit(reg_tokens=4, no_embed_class=True),
    "deit-distilled": deit_distilled,
    "hybrid": hybrid,
    "cifar10-hybrid": lambda: build_reference("cifar10-hybrid", depth=2).eval(),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("discard", [0.0, 0.4])
def test_rollout_of_real_models_equals_the_reference(name, discard):
    model = MODELS[name]()
    spec = vitviz.inspect(model)
    x = torch.randn(3, 3, *spec.img_size)
    p, (gh, gw) = spec.num_prefix_tokens, spec.grid_size
    want = ref_rollout(captured(model, x), p=p, discard=discard)
    full = vitviz.attention_rollout(model, x, discard_ratio=discard, return_full=True)
    torch.testing.assert_close(full.double(), want, atol=1e-5, rtol=1e-4)
    maps = vitviz.attention_rollout(model, x, discard_ratio=discard)
    assert maps.shape == (3, gh, gw)
    # the rows the head reads: the class row; DeiT-distilled's eval logits average its class and distillation heads
    read = (want[:, 0] + want[:, 1]) / 2 if "dist" in spec.prefix_tokens else want[:, spec.class_token_index]
    for r in range(gh):  # row-major patches: patch (r, c) is token p + r * gw + c
        for c in range(gw):
            torch.testing.assert_close(maps[:, r, c].double(), read[:, p + r * gw + c], atol=1e-5, rtol=1e-4)


def test_prefix_tokens_take_part_in_the_product():
    model = deit_distilled()
    x = torch.randn(2, 3, 48, 64)
    attns = captured(model, x)
    got = vitviz.attention_rollout(model, x)
    without_dist = [a[:, :, [0, *range(2, 14)]][:, :, :, [0, *range(2, 14)]] for a in attns]
    without_dist = [a / a.sum(-1, keepdim=True) for a in without_dist]
    other = ref_rollout(without_dist, p=1)[:, 0, 1:].reshape(2, 3, 4)
    assert not torch.allclose(got.double(), other, atol=1e-4)  # dropping the dist token changes the result


def test_token_choice_and_no_class_token():
    model = tiny_timm_vit(class_token=False, global_pool="avg")
    x = torch.randn(2, 3, 32, 48)
    want = ref_rollout(captured(model, x), p=0)
    got = vitviz.attention_rollout(model, x)  # no class token: the mean over all patch-query rows
    torch.testing.assert_close(got.double(), want.mean(dim=1).reshape(2, 4, 6), atol=1e-5, rtol=1e-4)
    got = vitviz.attention_rollout(model, x, token=7)
    torch.testing.assert_close(got.double(), want[:, 7].reshape(2, 4, 6), atol=1e-5, rtol=1e-4)
    with pytest.raises(IndexError, match="out of range"):
        vitviz.attention_rollout(model, x, token=24)


def test_streaming_equals_store_everything_and_batches_are_independent():
    model = tiny_timm_vit(depth=4)
    x = torch.randn(5, 3, 32, 48)
    stored = rollout_from_attentions(captured(model, x))
    streamed = vitviz.attention_rollout(model, x, return_full=True)
    torch.testing.assert_close(streamed, stored, atol=1e-6, rtol=1e-5)
    chunked = vitviz.attention_rollout(model, x, return_full=True, batch_size=2)
    torch.testing.assert_close(chunked, stored, atol=1e-6, rtol=1e-5)
    one = vitviz.attention_rollout(model, x[3:4], return_full=True)
    torch.testing.assert_close(one[0], stored[3], atol=1e-6, rtol=1e-5)


def test_start_layer_skips_the_first_layers():
    model = tiny_timm_vit(depth=4)
    x = torch.randn(2, 3, 32, 48)
    want = ref_rollout(captured(model, x)[2:])
    got = vitviz.attention_rollout(model, x, start_layer=2, return_full=True)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    with pytest.raises(IndexError, match="start_layer"):
        vitviz.attention_rollout(model, x, start_layer=4)


def test_raw_images_and_model_state_untouched():
    model = tiny_timm_vit()
    photos = [torch.randint(0, 255, (40, 60, 3), dtype=torch.uint8).numpy() for _ in range(2)]
    maps = vitviz.attention_rollout(model, photos)
    assert maps.shape == (2, 4, 6) and torch.isfinite(maps).all()
    assert all(b.attn.fused_attn for b in model.blocks)


# ---- gradient rollout ---------------------------------------------------------------------------------------------

def ref_grad_rollout(attns, grads, p=1) -> torch.Tensor:
    b, h, n, _ = attns[0].shape
    out = torch.zeros(b, n, n, dtype=torch.float64)
    for bi in range(b):
        r = torch.eye(n, dtype=torch.float64)
        for a, g in zip(attns, grads):
            w = sum(torch.relu(a[bi, k].double() * g[bi, k].double()) for k in range(h)) / h
            r = ref_layer(w, p, 0.0, True, normalise=False) @ r
        out[bi] = r
    return out


def attns_and_grads(model, x, target):
    with vitviz.capture_attention(model, retain_grad=True) as cap:
        logits = model(x)
    logits[torch.arange(len(x)), target].sum().backward()
    return [a.detach() for a in cap.attentions], [a.grad for a in cap.attentions]


def layered_model():
    """Layers that differ strongly: the first attends sharply, the others softly."""
    model = tiny_timm_vit(depth=3)
    with torch.no_grad():
        q = model.blocks[0].attn.qkv.weight[:64]
        q.mul_(6.0)
        model.blocks[2].attn.qkv.weight[:64].mul_(0.2)
    return model


def test_grad_rollout_pairs_each_gradient_with_its_own_layer():
    model = layered_model()
    x = torch.randn(2, 3, 32, 48)
    target = torch.tensor([1, 3])
    attns, grads = attns_and_grads(model, x, target)
    model.zero_grad(set_to_none=True)
    want = ref_grad_rollout(attns, grads)
    reversed_pairing = ref_grad_rollout(attns, grads[::-1])  # what the widely copied code does
    got = vitviz.grad_rollout(model, x, target=target, return_full=True)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    def relative(r):  # the map as drawn: the class token's row over the patches, divided by its maximum
        m = r[:, 0, 1:]
        return m / m.amax(dim=-1, keepdim=True)

    assert (relative(got.double()) - relative(want)).abs().max() < 1e-3
    assert (relative(got.double()) - relative(reversed_pairing)).abs().max() > 0.05
    maps = vitviz.grad_rollout(model, x, target=target)
    torch.testing.assert_close(maps.double(), want[:, 0, 1:].reshape(2, 4, 6), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.double(), grad_rollout_from_attentions(attns, grads).double(), atol=1e-5,
                               rtol=1e-4)
    assert all(p.grad is None for p in model.parameters())  # the model's gradients are left alone


def test_grad_rollout_targets_default_to_the_prediction():
    model = layered_model()
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        pred = model(x).argmax(-1)
    torch.testing.assert_close(vitviz.grad_rollout(model, x), vitviz.grad_rollout(model, x, target=pred))
    one = vitviz.grad_rollout(model, x, target=2, batch_size=2)
    torch.testing.assert_close(one, vitviz.grad_rollout(model, x, target=[2, 2, 2]), atol=1e-6, rtol=1e-5)
    for p in model.parameters():
        p.requires_grad_(False)  # frozen weights: the maps still get gradients through the input
    torch.testing.assert_close(vitviz.grad_rollout(model, x, target=2), one, atol=1e-6, rtol=1e-5)


def test_grad_rollout_other_layouts_and_errors():
    model = deit_distilled()
    x = torch.randn(2, 3, 48, 64)
    attns, grads = attns_and_grads(model, x, torch.tensor([0, 1]))
    got = vitviz.grad_rollout(model, x, target=[0, 1], return_full=True)
    torch.testing.assert_close(got.double(), ref_grad_rollout(attns, grads, p=2), atol=1e-5, rtol=1e-4)
    with pytest.raises(VitvizError, match="classifier head"):
        vitviz.grad_rollout(tiny_timm_vit(num_classes=0), torch.randn(1, 3, 32, 48))
    with pytest.raises(ValueError, match="target"):
        vitviz.grad_rollout(tiny_timm_vit(), torch.randn(2, 3, 32, 48), target=9)


def test_grad_rollout_refuses_maps_that_do_not_feed_the_logits():
    from tutorial_vit import TutorialViT

    model = TutorialViT(with_dropout_module=False).eval()  # probe='qkv' recomputes the maps beside the model's own
    x = torch.randn(2, 3, 32, 32)
    assert vitviz.attention_rollout(model, x).shape == (2, 4, 4)  # plain rollout works
    with pytest.raises(VitvizError, match="does not feed the output"):
        vitviz.grad_rollout(model, x)


def test_grad_rollout_reads_torchvision_gradients_through_the_weights_view():
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                              num_classes=7).eval()  # nn.MultiheadAttention returns a view of its probabilities
    nn.init.normal_(model.heads.head.weight)  # torchvision starts the head at zero: no gradient at all
    maps = vitviz.grad_rollout(model, torch.randn(2, 3, 32, 32))
    assert maps.shape == (2, 4, 4) and torch.isfinite(maps).all()


def test_dynamic_image_size_reads_the_grid_from_the_input():
    model = tiny_timm_vit(dynamic_img_size=True)
    x = torch.randn(2, 3, 40, 56)  # 5x7 grid instead of the built 4x6
    want = ref_rollout(captured(model, x))
    got = vitviz.attention_rollout(model, x)
    torch.testing.assert_close(got.double(), want[:, 0, 1:].reshape(2, 5, 7), atol=1e-5, rtol=1e-4)
