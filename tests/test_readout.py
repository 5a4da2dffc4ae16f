"""The readout rule (``ViTSpec.readout``) and the row-reading explanations that follow it.

Every expected value here is recomputed independently of vitviz: which tokens a head reads from the gradient of
the model's own output with respect to its last block's tokens; rollout and Chefer's relevance from attention
written out from each block's ``qkv`` weights (timm) or returned by Hugging Face's eager ``output_attentions``.
"""

from __future__ import annotations

import pytest
import torch

import vitviz
from vitviz.core.families import family_of
from vitviz.core.families.readout import PATCHES, Readout

timm = pytest.importorskip("timm")

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def timm_vit(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**TINY, **kw}).eval()
    with torch.no_grad():  # timm starts the class and register tokens near zero: make them count
        for name in ("cls_token", "reg_token"):
            if getattr(m, name, None) is not None:
                getattr(m, name).normal_()
    return m


def timm_deit_distilled() -> torch.nn.Module:
    torch.manual_seed(0)
    m = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, **TINY).eval()
    with torch.no_grad():
        m.cls_token.normal_()
        m.dist_token.normal_()
    return m


def images(seed: int = 1, n: int = 2, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------------------------- references
def explicit_timm(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """timm's forward written out: each block's attention ``softmax(q k^T * scale)`` from its ``qkv`` weights.

    Returns ``(logits, attentions (B, H, N, N) in the graph, last block's tokens (B, N, D))``.
    """
    t = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    attns = []
    for blk in model.blocks:
        a = blk.attn
        h = blk.norm1(t)
        b, n, c = h.shape
        q, k, v = a.qkv(h).reshape(b, n, 3, a.num_heads, c // a.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = a.q_norm(q), a.k_norm(k)
        attn = ((q * a.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        attns.append(attn)
        o = a.proj(a.norm((attn @ v).transpose(1, 2).reshape(b, n, c)))
        t = t + blk.ls1(o)
        t = t + blk.ls2(blk.mlp(blk.norm2(t)))
    return model.forward_head(model.norm(t)), attns, t


def rollout_matrix(attns: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema Eq. 1 in float64: ``R = A_L ... A_1``, ``A = rownorm(0.5 mean_h W + 0.5 I)``."""
    r = None
    for w in attns:
        w = w.detach().double().mean(dim=1)
        a = 0.5 * w + 0.5 * torch.eye(w.shape[-1], dtype=w.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        r = a if r is None else a @ r
    return r


def patch_cols(rows: torch.Tensor, p: int, grid: tuple[int, int]) -> torch.Tensor:
    return rows[:, p:].reshape(len(rows), *grid).float()


def read_tokens(model: torch.nn.Module, x: torch.Tensor, output) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's output (``output(model, x)``) and the gradient of a random projection of it with respect to the
    last block's tokens ``(B, N, D)``."""
    family = family_of(model)
    _, block = family.blocks(model)[-1]
    seen = []
    handle = block.register_forward_hook(lambda _m, _i, out: seen.append(out[0] if isinstance(out, tuple) else out))
    try:
        out = output(model, x)
    finally:
        handle.remove()
    proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (g,) = torch.autograd.grad((out * proj).sum(), seen[-1])
    return out, family.block_tokens(model, g, len(x))


# ---------------------------------------------------------------------- (a) avg pooling with a class token
def test_avg_pool_head_ignores_the_class_token_and_rollout_reads_the_patch_mean():
    m, x = timm_vit(global_pool="avg"), images()
    logits, attns, last = explicit_timm(m, x)
    torch.testing.assert_close(logits, m(x), atol=1e-5, rtol=1e-5)  # the written-out forward is timm's
    (g,) = torch.autograd.grad(logits.sum(), last)
    assert torch.count_nonzero(g[:, 0]) == 0  # the head never reads the final class token
    assert bool((g[:, 1:].abs().sum(-1) > 0).all())
    spec = vitviz.inspect(m)
    assert spec.class_token_index == 0 and spec.readout == Readout("mean", ((PATCHES,),), spec.readout.source)
    assert "readout    mean of the patch tokens" in repr(spec)
    r = rollout_matrix(attns)
    want = patch_cols(r[:, 1:].mean(dim=1), 1, (4, 4))
    got = vitviz.attention_rollout(m, x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    class_row = patch_cols(r[:, 0], 1, (4, 4))
    assert (got - class_row).abs().max() > 1e-3  # the old default (the class row) is another map
    torch.testing.assert_close(vitviz.attention_rollout(m, x, token="class"), class_row, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(vitviz.explain(m, x, "rollout"), want, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------- (b) distilled
def test_distilled_deit_logits_are_the_mean_of_two_heads_and_maps_the_mean_of_two_rows():
    m, x = timm_deit_distilled(), images()
    feats = m.forward_features(x)
    torch.testing.assert_close(m(x), (m.head(feats[:, 0]) + m.head_dist(feats[:, 1])) / 2)  # eval-mode logits
    _, g = read_tokens(m, x, lambda model, x: model(x))
    assert bool((g[:, :2].abs().sum(-1) > 0).all()) and torch.count_nonzero(g[:, 2:]) == 0
    spec = vitviz.inspect(m)
    assert spec.readout.how == "mean" and spec.readout.parts == ((0,), (1,))
    torch.testing.assert_close(spec.readout.weights(18, 2)[:3], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    _, attns, _ = explicit_timm(m, x)
    r = rollout_matrix(attns)
    want = patch_cols((r[:, 0] + r[:, 1]) / 2, 2, (4, 4))
    torch.testing.assert_close(vitviz.attention_rollout(m, x), want, atol=1e-6, rtol=1e-5)
    for method in ("chefer", "grad_rollout", "attention", "flow"):
        rows = [vitviz.explain(m, x, method, token=t) for t in (0, 1)]
        scale = float(rows[0].abs().max())
        torch.testing.assert_close(vitviz.explain(m, x, method), (rows[0] + rows[1]) / 2, atol=1e-6 * scale,
                                   rtol=1e-5)
        assert (rows[0] - rows[1]).abs().max() > 1e-3 * scale  # the two rows differ, so the mean is a claim


# -------------------------------------------------------------------------------------------- (c) HF BEiT
def test_hf_beit_mean_pooling_reads_the_patch_mean():
    from hf_models import _eager_attentions, hf_case

    case = hf_case("beit-shared-abs")  # BeitForImageClassification, use_mean_pooling (the config's default)
    m, x = case.model, case.x
    assert m.config.use_mean_pooling
    out = m(pixel_values=x, output_hidden_states=True)
    (g,) = torch.autograd.grad(out.logits.sum(), out.hidden_states[-1])
    assert torch.count_nonzero(g[:, 0]) == 0 and bool((g[:, 1:].abs().sum(-1) > 0).all())
    spec = vitviz.inspect(m)
    assert spec.readout.patch_mean and spec.readout.exact
    r = rollout_matrix(_eager_attentions(m, x))
    want = patch_cols(r[:, 1:].mean(dim=1), 1, case.grid)
    torch.testing.assert_close(vitviz.attention_rollout(m, x), want, atol=1e-6, rtol=1e-5)
    assert (vitviz.attention_rollout(m, x, token="class") - want).abs().max() > 1e-4


def test_hf_deit_with_teacher_reads_the_class_and_distillation_rows():
    from hf_models import _eager_attentions, hf_case

    case = hf_case("deit-distilled")
    m, x = case.model, case.x
    out = m(pixel_values=x)
    torch.testing.assert_close(out.logits, (out.cls_logits + out.distillation_logits) / 2)
    assert vitviz.inspect(m).readout.parts == ((0,), (1,))
    r = rollout_matrix(_eager_attentions(m, x))
    want = patch_cols((r[:, 0] + r[:, 1]) / 2, 2, case.grid)
    torch.testing.assert_close(vitviz.attention_rollout(m, x), want, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------- (d) class-token readouts unchanged
@pytest.mark.parametrize("method", ["attention", "rollout", "flow", "grad_rollout", "chefer"])
def test_class_token_heads_read_the_class_row_bit_for_bit(method):
    m, x = timm_vit(), images()  # global_pool="token"
    assert vitviz.inspect(m).readout.single_token == 0
    default = vitviz.explain(m, x, method)
    assert torch.equal(default, vitviz.explain(m, x, method, token=0))
    assert torch.equal(default, vitviz.explain(m, x, method, token="class"))


def test_token_class_refused_without_a_class_token():
    m = timm_vit(class_token=False, global_pool="avg")
    with pytest.raises(vitviz.InputError, match="no class token"):
        vitviz.attention_rollout(m, images(), token="class")
    with pytest.raises(vitviz.InputError, match="not one of"):
        vitviz.attention_rollout(m, images(), token="cls")


def test_token_patches_reads_the_mean_of_the_patch_rows():
    m, x = timm_vit(), images()  # a class-token head
    _, attns, _ = explicit_timm(m, x)
    want = patch_cols(rollout_matrix(attns)[:, 1:].mean(dim=1), 1, (4, 4))
    torch.testing.assert_close(vitviz.attention_rollout(m, x, token="patches"), want, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------- (e) Chefer, float64, avg pool
def test_chefer_on_avg_pool_matches_eq_5_6_with_the_patch_mean_readout():
    m, x = timm_vit(global_pool="avg").double(), images(dtype=torch.float64)
    logits, attns, _ = explicit_timm(m, x)
    target = logits.argmax(dim=-1)
    grads = torch.autograd.grad(logits[torch.arange(len(x)), target].sum(), attns)
    r = torch.eye(attns[0].shape[-1], dtype=torch.float64).expand(len(x), -1, -1)
    for a, g in zip(attns, grads):  # Eq. 5: mean_h (grad * A)^+ ; Eq. 6: R <- R + Abar R
        r = r + (g * a).clamp(min=0).mean(dim=1).detach() @ r
    want = r[:, 1:, 1:].mean(dim=1).reshape(len(x), 4, 4)
    got = vitviz.chefer_relevance(m, x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    assert (got - r[:, 0, 1:].reshape(len(x), 4, 4)).abs().max() > 1e-6  # not the class row


# ------------------------------------------------------------------- the rule, family by family, vs gradients
def _timm(**kw):
    return lambda: (timm_vit(**kw), images())


def _hf(name):
    def build():
        from hf_models import hf_case

        case = hf_case(name)
        return case.model, case.x
    return build


def _hf_dinov2_classifier():
    import transformers as T

    torch.manual_seed(0)
    m = T.Dinov2ForImageClassification(T.Dinov2Config(image_size=32, patch_size=8, hidden_size=32,
                                                      num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                                                      num_labels=3)).eval()
    with torch.no_grad():
        m.dinov2.embeddings.cls_token.normal_()
    return m, images()


def _torchvision():
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                          num_classes=5).eval()
    with torch.no_grad():
        m.heads.head.weight.normal_()
    return m, images()


def _open_clip(**kw):
    def build():
        from hf_models import open_clip_tower

        torch.manual_seed(0)
        return open_clip_tower(**kw), torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    return build


def _hf_output(model, x):
    out = model(pixel_values=x)
    return out.logits if getattr(out, "logits", None) is not None else out.pooler_output


def _tutorial():
    from tutorial_vit import TutorialViT

    torch.manual_seed(0)
    return TutorialViT().eval(), images()


def _tutorial_gap():
    """A hand-written ViT whose head averages the patch tokens beside its class token, described as such."""
    from tutorial_vit import TutorialViT

    class GapViT(TutorialViT):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.patch_embed(x)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)[:, 1:].mean(1))

    torch.manual_seed(0)
    return vitviz.describe(GapViT().eval(), readout="avg"), images()


def _cls_vs_gap():
    from vitviz.experiments.cls_vs_gap import HEADS

    return timm_vit(**HEADS["gap"]), images()  # the GAP arm of the class-token-versus-GAP experiment


CASES = {
    "tutorial (custom family)": (_tutorial, "token"),
    "tutorial with a GAP head, describe(readout='avg')": (_tutorial_gap, "mean"),
    "cls_vs_gap GAP arm": (_cls_vs_gap, "mean"),
    "timm token": (_timm(), "token"),
    "timm avg": (_timm(global_pool="avg"), "mean"),
    "timm avg + registers, include prefix": (_timm(global_pool="avg", reg_tokens=2, pool_include_prefix=True), "mean"),
    "timm avg, no class token": (_timm(global_pool="avg", class_token=False), "mean"),
    "timm map": (_timm(global_pool="map"), "attention-pool"),
    "timm eva02 map (every token pooled)": (lambda: (timm.create_model(
        "eva02_tiny_patch14_224", pretrained=False, img_size=28, depth=2, num_classes=5, global_pool="map").eval(),
        torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(1))), "attention-pool"),
    "timm distilled": (lambda: (timm_deit_distilled(), images()), "mean"),
    "timm beit (avg default)": (lambda: (timm.create_model("beit_base_patch16_224", pretrained=False,
                                                           **TINY).eval(), images()), "mean"),
    "timm beit token": (lambda: (timm.create_model("beit_base_patch16_224", pretrained=False, global_pool="token",
                                                   **TINY).eval(), images()), "token"),
    "hf vit": (_hf("vit"), "token"),
    "hf deit with teacher": (_hf("deit-distilled"), "mean"),
    "hf beit mean pooling": (_hf("beit-shared-abs"), "mean"),
    "hf data2vec vision mean pooling": (_hf("data2vec-shared-abs"), "mean"),
    "hf metaclip 2 classifier": (_hf("metaclip2-classifier"), "mean"),
    "hf dinov2 classifier": (_hf_dinov2_classifier, "concat"),
    "hf clip vision": (_hf("clip-vision"), "token"),
    "hf siglip": (_hf("siglip-vision"), "attention-pool"),
    "hf aimv2": (_hf("aimv2-vision"), "attention-pool"),
    "torchvision": (_torchvision, "token"),
    "open_clip tok": (_open_clip(), "token"),
    "open_clip avg": (_open_clip(pool_type="avg"), "mean"),
    "open_clip attentional pooler": (_open_clip(attentional_pool=True), "attention-pool"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_readout_names_exactly_the_tokens_the_output_depends_on(name):
    build, how = CASES[name]
    m, x = build()
    spec = vitviz.inspect(m)
    assert spec.readout.how == how
    if spec.family == "huggingface":
        output = _hf_output
    else:
        def output(model, x):
            out = model(x)
            return out[0] if isinstance(out, tuple) else out
    _, g = read_tokens(m, x, output)
    read = g.abs().sum(dim=(0, 2)) > 0  # (N,): tokens the output depends on
    weights = spec.readout.weights(g.shape[1], spec.num_prefix_tokens)
    assert read.tolist() == (weights > 0).tolist()
    assert spec.readout.exact  # every readout here is read exactly (attention pools: their own attention)



def test_dinov2_classifier_reads_the_class_row_beside_the_patch_mean():
    from hf_models import _eager_attentions

    m, x = _hf_dinov2_classifier()
    out = m(pixel_values=x, output_hidden_states=True)
    seq = m.dinov2.layernorm(out.hidden_states[-1])
    feats = torch.cat([seq[:, 0], seq[:, 1:].mean(dim=1)], dim=-1)
    torch.testing.assert_close(m.classifier(feats), out.logits)  # one head on [cls, patch mean]
    r = rollout_matrix(_eager_attentions(m, x))
    want = patch_cols(0.5 * r[:, 0] + 0.5 * r[:, 1:].mean(dim=1), 1, (4, 4))
    torch.testing.assert_close(vitviz.attention_rollout(m, x), want, atol=1e-6, rtol=1e-5)


def test_describe_takes_the_readout_of_a_hand_written_head():
    """``vitviz.describe(readout=...)``: the maps read, and the probes pool every block, as the head reads."""
    from tutorial_vit import TutorialViT

    from vitviz.core.features import extract_features
    from vitviz.errors import InputError

    m, x = _tutorial_gap()
    assert vitviz.inspect(m).readout.patch_mean
    torch.testing.assert_close(vitviz.attention_rollout(m, x), vitviz.attention_rollout(m, x, token="patches"),
                               rtol=0, atol=0)
    assert not torch.allclose(vitviz.attention_rollout(m, x), vitviz.attention_rollout(m, x, token="class"))
    outputs: list[torch.Tensor] = []
    handle = m.blocks[0].register_forward_hook(lambda _m, _i, o: outputs.append(o))
    try:
        feats = extract_features(m, (x, torch.tensor([0, 1])), layers=[0]).feats[0]
    finally:
        handle.remove()
    torch.testing.assert_close(feats, outputs[0][:, 1:].mean(1))
    from vitviz.core.families.custom import CustomFamily

    two = CustomFamily(prefix_tokens=("cls", "dist"), readout=("cls", "dist")).readout(m, ("cls", "dist"))
    assert (two.how, two.parts) == ("mean", ((0,), (1,)))
    for bad in ("mean", ("cls", "reg"), 3):
        with pytest.raises(InputError, match=r"readout=.*pass 'avg'.*prefix_tokens=\('cls',\)"):
            vitviz.describe(TutorialViT().eval(), readout=bad)
