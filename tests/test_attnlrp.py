"""AttnLRP (Achtibat et al., ICML 2024): a float64 hand-written reference, conservation, restoration, batching,
targets, families and refusals."""

from __future__ import annotations

import copy
import functools
import re

import pytest
import timm
import torch
from conftest import with_gated_attention
from lrp_reference import (
    params_cait,
    params_hf,
    params_open_clip,
    params_siglip,
    params_timm,
    params_torchvision,
    pixels_timm,
    reference,
)
from torch import nn

from vitviz.analysis.attnlrp import attnlrp, attnlrp_tokens
from vitviz.core.families.lrp import LRPRules, lrp_rules
from vitviz.core.spec import inspect
from vitviz.errors import InputError, UnsupportedModelError


def tiny_timm(dtype=torch.float64, **kw) -> nn.Module:
    args = dict(img_size=(16, 24), patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5)
    args.update(kw)
    torch.manual_seed(0)
    m = timm.models.vision_transformer.VisionTransformer(**args).to(dtype).eval()
    _jitter(m)
    return m


def tokens_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    store = {}
    with lrp_rules(model) as session:
        model(x)
        store["t"] = session.tokens.detach()
    return store["t"]


@pytest.mark.parametrize("kw", [dict(), dict(class_token=False, global_pool="avg", reg_tokens=2),
                                dict(init_values=0.5)])
def test_equals_float64_reference(kw):
    m = tiny_timm(**kw)
    x = torch.randn(3, 3, 16, 24, dtype=torch.float64)
    rel, score = attnlrp_tokens(m, x, [0, 3, 4])
    ref, logit = reference(params_timm(m), tokens_of(m, x), torch.tensor([0, 3, 4]))
    assert torch.allclose(score, logit, atol=1e-12)
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()
    maps = attnlrp(m, x, [0, 3, 4])  # (B, gh, gw) = patch tokens in raster order on the 2x3 grid
    assert maps.shape == (3, 2, 3)
    assert torch.allclose(maps, ref[:, m.num_prefix_tokens:].reshape(3, 2, 3), atol=1e-10)


def test_reference_differs_from_plain_gradient():
    """The rules matter: input x gradient without them is far from the reference (guards a test that cannot
    fail)."""
    m = tiny_timm()
    x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    ref, _ = reference(params_timm(m), tokens_of(m, x), torch.tensor([1, 1]))
    t = tokens_of(m, x).requires_grad_(True)
    logits = m.forward_head(m.norm(m.blocks(t)))
    (g,) = torch.autograd.grad(logits[:, 1].sum(), t)
    assert (((t * g).sum(-1)) - ref).abs().max() > 1e-3 * ref.abs().max()


def test_cp_variant_equals_reference():
    m = tiny_timm()
    x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    rel, _ = attnlrp_tokens(m, x, 2, rules=LRPRules(attention="cp"))
    ref, _ = reference(params_timm(m), tokens_of(m, x), torch.tensor([2, 2]), attention="cp")
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()


def _jitter(m: nn.Module) -> nn.Module:
    """Random, not-small weights everywhere (timm and transformers initialise biases and LN at 0 / 1)."""
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


def _zero_biases(m: nn.Module) -> None:
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.zero_()


def test_conservation_cp_exact():
    """Zero biases, epsilon 0, CP attention: every rule is conservative, so the tokens sum to the logit."""
    m = tiny_timm()
    _zero_biases(m)
    x = torch.randn(4, 3, 16, 24, dtype=torch.float64)
    rel, score = attnlrp_tokens(m, x, 1, rules=LRPRules(epsilon=0.0, attention="cp"))
    assert torch.allclose(rel.sum(1), score, rtol=1e-10, atol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_conservation_attnlrp(dtype, tol):
    """Zero biases, epsilon 0: tokens sum to the logit minus what the softmaxes absorb (Prop. 3.1's bias term),
    measured independently from each layer's map A and the gradient g reaching it:
    absorbed = sum_rows [sum_i A_i h_i - sum_i log(A_i) A_i (h_i - A.h)] with h = g / 2 (the attn @ v uniform
    rule halves it; vitviz applies that half at the q/k projection, so the hooked gradient is g)."""
    m = tiny_timm(dtype=dtype)
    _zero_biases(m)
    maps, grads = [], []
    handles = []
    for blk in m.blocks:
        blk.attn.fused_attn = False

        def hook(_m, _i, out):
            maps.append(out.detach())
            out.register_hook(lambda g: grads.insert(0, g.detach()))

        handles.append(blk.attn.attn_drop.register_forward_hook(hook))
    x = torch.randn(4, 3, 16, 24, dtype=dtype)
    rel, score = attnlrp_tokens(m, x, 3, rules=LRPRules(epsilon=0.0))
    for h in handles:
        h.remove()
    absorbed = 0
    for a, g in zip(maps, grads):
        h = g / 2
        ah = (a * h).sum(-1, keepdim=True)
        absorbed = absorbed + ((a * h).sum(-1) - (torch.log(a) * a * (h - ah)).sum(-1)).sum((1, 2))
    assert torch.allclose(rel.sum(1), score - absorbed, rtol=tol, atol=tol * score.abs().max())
    assert (absorbed.abs() > 1e-3 * score.abs()).all()  # the softmax does absorb: the check is not vacuous


def test_default_epsilon_within_stated_tolerance():
    """epsilon=1e-6 (default) against epsilon=0 on a float64 model: the stabiliser shifts each linear layer's
    relevance by a factor z / (z + eps) (relative eps / |z|), so with random weights, where some |z| come near
    1e-3, the maps move by under 1e-3 of their peak."""
    m = tiny_timm()
    x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    a, _ = attnlrp_tokens(m, x, 0)
    b, _ = attnlrp_tokens(m, x, 0, rules=LRPRules(epsilon=0.0))
    assert (a - b).abs().max() < 1e-3 * b.abs().max()
    assert (a - b).abs().max() > 0  # the stabiliser is applied


def _state(m: nn.Module) -> tuple:
    hooks = sum(len(mm._forward_hooks) + len(mm._forward_pre_hooks) + len(mm._backward_hooks) for mm in m.modules())
    attrs = sorted((n, k) for n, mm in m.named_modules() for k in vars(mm) if k == "forward")
    flags = [getattr(mm, "fused_attn", None) for mm in m.modules()]
    return hooks, attrs, flags, {k: v.clone() for k, v in m.state_dict().items()}


def _same(a: tuple, b: tuple) -> bool:
    return a[:3] == b[:3] and a[3].keys() == b[3].keys() and all(torch.equal(a[3][k], b[3][k]) for k in a[3])


def test_model_restored_exactly_also_after_error():
    m = tiny_timm(dtype=torch.float32)
    x = torch.randn(2, 3, 16, 24)
    before, y0 = _state(m), m(x)
    attnlrp(m, x)
    assert _same(before, _state(m)) and torch.equal(m(x), y0)

    def boom(out):
        raise KeyError("inside the call")

    with pytest.raises(KeyError):
        attnlrp(m, x, boom)
    assert _same(before, _state(m)) and torch.equal(m(x), y0)
    import torch.nn.functional as F

    globals_before = [nn.Linear.forward, nn.LayerNorm.forward, nn.GELU.forward, nn.MultiheadAttention.forward,
                      F.linear, F.layer_norm, F.scaled_dot_product_attention, F.gelu, torch.softmax, torch.matmul]
    with pytest.raises(RuntimeError):
        with lrp_rules(m):
            assert any("forward" in vars(mm) for mm in m.modules())  # the rules are installed inside
            assert globals_before == [nn.Linear.forward, nn.LayerNorm.forward, nn.GELU.forward,  # nothing global
                                      nn.MultiheadAttention.forward, F.linear, F.layer_norm,
                                      F.scaled_dot_product_attention, F.gelu, torch.softmax, torch.matmul]
            raise RuntimeError("body")
    assert _same(before, _state(m)) and torch.equal(m(x), y0)


def test_forward_unchanged_under_rules():
    m = tiny_timm(dtype=torch.float32)
    x = torch.randn(2, 3, 16, 24)
    y0 = m(x)
    with lrp_rules(m, LRPRules(linear="gamma")):
        assert torch.allclose(m(x), y0, atol=1e-6)


def test_batch_equals_one_at_a_time_and_targets():
    m = tiny_timm(dtype=torch.float32)
    x = torch.randn(4, 3, 16, 24)
    classes = [0, 4, 2, 2]
    full = attnlrp(m, x, classes)
    singles = torch.cat([attnlrp(m, x[i:i + 1], classes[i]) for i in range(4)])
    assert torch.allclose(full, singles, atol=1e-5)
    assert torch.allclose(attnlrp(m, x, classes, batch_size=3), full, atol=1e-5)
    assert torch.allclose(attnlrp(m, x, lambda out: out[torch.arange(4), torch.tensor(classes)]), full, atol=1e-6)
    pred = m(x).argmax(-1).tolist()
    assert torch.allclose(attnlrp(m, x), attnlrp(m, x, pred), atol=1e-6)
    assert not torch.allclose(attnlrp(m, x, 0), attnlrp(m, x, 1), atol=1e-3)  # class-specific


def test_torchvision_equals_reference():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(1)
    m = VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                          num_classes=5).to(torch.float64).eval()
    _jitter(m)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    y0 = m(x)
    with lrp_rules(m):
        assert torch.allclose(m(x), y0, atol=1e-12)
    rel, _ = attnlrp_tokens(m, x, [1, 2])
    ref, _ = reference(params_torchvision(m), tokens_of(m, x), torch.tensor([1, 2]))
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()


def test_hf_vit_equals_reference():
    import transformers as T

    torch.manual_seed(2)
    c = T.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=16,
                    patch_size=8, num_labels=5)
    m = T.ViTForImageClassification(c).to(torch.float64).eval()
    _jitter(m)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    rel, score = attnlrp_tokens(m, x, [4, 0])
    ref, logit = reference(params_hf(m), tokens_of(m, x), torch.tensor([4, 0]))
    assert torch.allclose(score, logit, atol=1e-12)
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()


def test_refusals():
    m = tiny_timm(dtype=torch.float32, global_pool="max")
    with pytest.raises(UnsupportedModelError, match="global_pool='max'"):
        attnlrp(m, torch.randn(1, 3, 16, 24))
    eva = timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=1, img_size=28, global_pool="avgmax")
    with pytest.raises(UnsupportedModelError, match="Eva.*global_pool='avgmax'"):
        attnlrp(eva.eval(), torch.randn(1, 3, 28, 28))
    m = tiny_timm(dtype=torch.float32, act_layer=nn.Sigmoid)  # an MLP's sigmoid: sigmoid(0) != 0, no identity rule
    with pytest.raises(UnsupportedModelError, match=r"no rule for the module blocks\.0\.mlp\.act.*Sigmoid"):
        attnlrp(m, torch.randn(1, 3, 16, 24))
    import transformers as T
    from tutorial_vit import TutorialViT

    with pytest.raises(UnsupportedModelError, match="TutorialViT.*no AttnLRP rules"):
        attnlrp(TutorialViT().eval(), torch.randn(1, 3, 32, 32))
    small = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    clip = T.CLIPModel(T.CLIPConfig(vision_config=dict(small, image_size=16, patch_size=8), text_config=small)).eval()
    with pytest.raises(UnsupportedModelError, match=r"CLIPModel.*image-text model.*model\.vision_model"):
        attnlrp(clip, torch.randn(1, 3, 16, 16), lambda out: out.image_embeds.sum(-1))
    from vitviz.analysis.explain import GRADIENT_METHODS, METHODS

    assert "attnlrp" in METHODS and "attnlrp" in GRADIENT_METHODS


def test_gamma_rule_matches_explicit_formula():
    """One Linear layer, zennit's generalised gamma rule written out: for z_k > 0,
    R_j = sum_k [x_j^+ (w + g w^+)_kj + x_j^- (w + g w^-)_kj] R_k / (sum of those over j + bias part), and the
    mirror image for z_k < 0."""
    torch.manual_seed(3)
    lin = nn.Linear(5, 4).double()
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    gm = 0.3
    with lrp_rules_on_linear(lin, LRPRules(linear="gamma", gamma=gm)):
        z = lin(x)
        r_out = torch.randn_like(z)
        (g,) = torch.autograd.grad(z, x, r_out / z)  # relevance R_out enters as gradient R_out / z
    w, b = lin.weight.detach(), lin.bias.detach()
    xd = x.detach()
    expected = torch.zeros_like(xd)
    for n in range(3):
        for k in range(4):
            if z[n, k] > 0:
                wa, wb, bb = w[k] + gm * w[k].clamp(min=0), w[k] + gm * w[k].clamp(max=0), b[k] + gm * b[k].clamp(min=0)
            else:
                wa, wb, bb = w[k] + gm * w[k].clamp(max=0), w[k] + gm * w[k].clamp(min=0), b[k] + gm * b[k].clamp(max=0)
            contrib = xd[n].clamp(min=0) * wa + xd[n].clamp(max=0) * wb
            den = contrib.sum() + bb
            den = den + 1e-6 * (1 if den >= 0 else -1)
            expected[n] += contrib / den * r_out[n, k]
    assert torch.allclose(xd * g, expected, atol=1e-12)


def lrp_rules_on_linear(lin: nn.Linear, rules: LRPRules):
    from contextlib import contextmanager

    from vitviz.core.families.lrp import install_linear

    @contextmanager
    def ctx():
        undo = install_linear(lin, rules.linear, rules)
        try:
            yield
        finally:
            undo()

    return ctx()


@pytest.mark.parametrize("kind", ["deit", "vit_msn", "ijepa", "beit", "data2vec", "data2vec-eager", "dinov2",
                                  "dinov2_with_registers", "dinov3", "clip", "clip-projection", "metaclip2",
                                  "chinese-clip", "altclip", "dinov3-gated", "siglip", "siglip-classifier",
                                  "aimv2", "aimv2-no-head"])
def test_hf_families_conserve_under_cp(kind):
    """Zero biases, epsilon 0, CP attention: exact conservation, which fails if a norm or an activation kept its
    plain gradient, or a gated MLP's product its plain one; the forward is unchanged under the rules. AIMv2's
    RMSNorm computes in float32 whatever the model's dtype (transformers' code), so its sum holds to that
    precision."""
    import transformers as T

    common = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=16,
                  patch_size=8)
    torch.manual_seed(4)
    if kind == "deit":
        m = T.DeiTForImageClassification(T.DeiTConfig(**common, num_labels=3))
    elif kind == "beit":
        m = T.BeitForImageClassification(T.BeitConfig(**common, num_labels=3, use_relative_position_bias=True))
    elif kind.startswith("data2vec"):  # BEiT's layout, its own softmax (eager) or SDPA call; shared bias, layer scale
        cfg = T.Data2VecVisionConfig(**common, num_labels=3, use_shared_relative_position_bias=True)
        m = T.Data2VecVisionForImageClassification._from_config(
            cfg, attn_implementation="eager" if kind.endswith("eager") else "sdpa")
    elif kind in ("clip", "metaclip2"):  # the patch-mean classifiers of CLIP's vision code (QuickGELU, pre-LN)
        vision = {k: v for k, v in common.items()}
        m = (T.CLIPForImageClassification(T.CLIPConfig(vision_config=vision, num_labels=3)) if kind == "clip" else
             T.MetaClip2ForImageClassification(T.MetaClip2Config(vision_config=vision, num_labels=3)))
    elif kind in ("clip-projection", "chinese-clip", "altclip"):  # the final-normed class token (and a projection)
        m = {"clip-projection": lambda: T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(**common,
                                                                                          projection_dim=8)),
             "chinese-clip": lambda: T.ChineseCLIPVisionModel(T.ChineseCLIPVisionConfig(**common)),
             "altclip": lambda: T.AltCLIPVisionModel(T.AltCLIPVisionConfig(**common))}[kind]()
    elif kind == "vit_msn":
        m = T.ViTMSNForImageClassification(T.ViTMSNConfig(**common, num_labels=3))
    elif kind == "ijepa":  # no class token: the classifier reads the mean of the patch tokens
        m = T.IJepaForImageClassification(T.IJepaConfig(**common, num_labels=3))
    elif kind == "dinov2":
        m = T.Dinov2Model(T.Dinov2Config(**common))
    elif kind.startswith("dinov3"):  # rotary q and k, registers, layer scale; the 7B model's gated MLP
        m = T.DINOv3ViTModel(T.DINOv3ViTConfig(**common, num_register_tokens=2, use_gated_mlp=kind.endswith("gated")))
    elif kind == "siglip":  # the attention-pooling head: a probe query through an nn.MultiheadAttention
        m = T.SiglipVisionModel(T.SiglipVisionConfig(**common))
    elif kind == "siglip-classifier":  # the patch mean, no head
        m = T.SiglipForImageClassification(T.SiglipConfig(vision_config=dict(common), num_labels=3))
    elif kind.startswith("aimv2"):  # RMSNorm, a SwiGLU MLP, the pooling head (its cls_token query, no projection)
        m = T.Aimv2VisionModel(T.Aimv2VisionConfig(**common, use_head=kind == "aimv2"))
    else:
        m = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**common, num_register_tokens=2))
    m = m.double().eval()
    _jitter(m)
    _zero_biases(m)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    def features(out):  # a feature model's embedding: CLIPVisionModelWithProjection's projected one, else the pooler's
        if getattr(out, "image_embeds", None) is not None:
            return out.image_embeds
        return out.pooler_output if out.pooler_output is not None else out.last_hidden_state.mean(1)

    logits = getattr(m, "classifier", None) is not None
    target = 1 if logits else (lambda out: features(out).sum(-1))
    y0 = m(x)
    y0 = y0.logits if logits else features(y0)
    with lrp_rules(m):
        y1 = m(x)
        y1 = y1.logits if logits else features(y1)
    assert torch.allclose(y0, y1, atol=1e-12)
    rel, score = attnlrp_tokens(m, x, target, rules=LRPRules(epsilon=0.0, attention="cp"))
    assert torch.allclose(rel.sum(1), score, rtol=1e-5 if kind.startswith("aimv2") else 1e-9, atol=0)
    maps = attnlrp(m, x, target)
    assert maps.shape == (2, 2, 2) and torch.isfinite(maps).all()


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
def test_vit_mae_is_read_unmasked_in_patch_order_and_equals_float64_reference(attention):
    """ViTMAE shuffles and masks its patch tokens at random on every call (``config.mask_ratio``): AttnLRP reads the
    encoder as the capture does, unmasked and in patch order, for the call only. The first block's input is the
    patch embedding plus the position table in raster order, the relevance equals the hand-written reference
    (explaining the sum of the final-normed class token), and afterwards the model masks again. The pre-training
    model (its decoder reconstructs pixels) is refused, naming its encoder."""
    import transformers as T

    torch.manual_seed(12)
    cfg = T.ViTMAEConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                         image_size=16, patch_size=8, mask_ratio=0.75)
    m = _jitter(T.ViTMAEModel(cfg).double().eval())
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    target = lambda out: out.last_hidden_state[:, 0].sum(-1)  # noqa: E731
    rel, score = attnlrp_tokens(m, x, target, rules=LRPRules(attention=attention))
    tokens = tokens_of(m, x)
    emb = m.embeddings
    patches = emb.patch_embeddings.projection(x).flatten(2).transpose(1, 2) + emb.position_embeddings[:, 1:]
    assert torch.allclose(tokens[:, 1:], patches, atol=1e-12)  # all four patches, in raster order
    ref, total = reference(params_hf(m), tokens, None, attention=attention)
    assert torch.allclose(score, total, atol=1e-12)
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()
    assert m.config.mask_ratio == 0.75 and m(x).last_hidden_state.shape[1] == 1 + 1  # it masks again
    pretraining = T.ViTMAEForPreTraining(cfg).eval()
    with pytest.raises(UnsupportedModelError, match=r"ViTMAEForPreTraining.*model\.vit"):
        attnlrp(pretraining, torch.randn(1, 3, 16, 16), lambda out: out.logits.sum((1, 2)))


def test_dinov3_rotary_attention_conserves_up_to_the_softmax_share(monkeypatch):
    """DINOv3 rotates q and k (RoPE) between the projections and the scores: the full AttnLRP rule (not CP) sends
    relevance through that rotation, which, linear and without bias, must pass it on whole. Zero biases, epsilon 0:
    the tokens sum to the score minus what the softmaxes absorb, measured from each map A and the gradient g
    reaching it, as in test_conservation_attnlrp; a rotation that lost or gained relevance would break the sum."""
    import transformers as T

    torch.manual_seed(5)
    m = T.DINOv3ViTModel(T.DINOv3ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=32, image_size=16, patch_size=8, num_register_tokens=1))
    m = _jitter(m.double().eval())
    _zero_biases(m)
    m.set_attn_implementation("eager")  # its softmax is then torch's, where the maps and their gradients are read
    maps, grads = [], []
    softmax = torch.nn.functional.softmax

    def recording_softmax(*args, **kwargs):
        out = softmax(*args, **kwargs)
        if out.requires_grad:
            maps.append(out.detach())
            out.register_hook(lambda g: grads.insert(0, g.detach()))
        return out

    monkeypatch.setattr(torch.nn.functional, "softmax", recording_softmax)
    x = torch.randn(3, 3, 16, 24, dtype=torch.float64)
    rel, score = attnlrp_tokens(m, x, lambda out: out.pooler_output.sum(-1), rules=LRPRules(epsilon=0.0))
    assert len(maps) == len(grads) == 2
    absorbed = 0
    for a, g in zip(maps, grads):
        h = g / 2
        ah = (a * h).sum(-1, keepdim=True)
        absorbed = absorbed + ((a * h).sum(-1) - (torch.log(a) * a * (h - ah)).sum(-1)).sum((1, 2))
    assert torch.allclose(rel.sum(1), score - absorbed, rtol=1e-9, atol=1e-9 * score.abs().max())
    assert (absorbed.abs() > 1e-3 * score.abs()).all()  # the softmax does absorb: the check is not vacuous


def test_timm_distilled_and_no_class_token_conserve_under_cp():
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(5)
    for m in (VisionTransformerDistilled(img_size=(16, 24), patch_size=8, embed_dim=16, depth=2, num_heads=2,
                                         num_classes=3),
              tiny_timm(class_token=False, global_pool="avg", no_embed_class=True)):
        m = m.double().eval()
        _jitter(m)
        _zero_biases(m)
        x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
        rel, score = attnlrp_tokens(m, x, 2, rules=LRPRules(epsilon=0.0, attention="cp"))
        assert rel.shape == (2, m.num_prefix_tokens + 6)
        assert torch.allclose(rel.sum(1), score, rtol=1e-9, atol=0)


def test_half_precision_model():
    """A bfloat16 model: float32 maps, close in rank to the float32 model's (rounding moves them, not the rules)."""
    m = tiny_timm(dtype=torch.float32)
    x = torch.randn(2, 3, 16, 24)
    full = attnlrp(m, x, 1)
    half = attnlrp(m.to(torch.bfloat16), x.to(torch.bfloat16), 1)
    assert half.dtype == torch.float32
    a, b = full.flatten(1), half.flatten(1)
    r = torch.nn.functional.cosine_similarity(a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True))
    assert (r > 0.9).all()


@pytest.mark.gpu
def test_gpu_equals_cpu():
    m = tiny_timm(dtype=torch.float32)
    x = torch.randn(3, 3, 16, 24)
    cpu = attnlrp(m, x, [0, 1, 2])
    gpu = attnlrp(m.cuda(), x.cuda(), [0, 1, 2])
    assert gpu.device.type == "cuda"
    assert torch.allclose(gpu.cpu(), cpu, atol=1e-4 * cpu.abs().max())


def equals_reference(m, x, params: dict, attention: str, forward_atol: float | None = None):
    """AttnLRP's token relevances of ``m`` on ``x`` for targets 0, 3 and 4 against the hand-written float64 reference
    (to 1e-10 of its peak, the score to 1e-12), the forward under the rules unchanged (bit for bit, or to
    ``forward_atol``); returns both relevances."""
    y0 = m(x)
    with lrp_rules(m):
        y = m(x)
    assert torch.equal(y, y0) if forward_atol is None else torch.allclose(y, y0, atol=forward_atol)
    rel, score = attnlrp_tokens(m, x, [0, 3, 4], rules=LRPRules(attention=attention))
    ref, logit = reference(params, tokens_of(m, x), torch.tensor([0, 3, 4]), attention=attention)
    assert torch.allclose(score, logit, atol=1e-12)
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()
    return rel, ref


GATED = {"swiglu": dict(mlp_layer=timm.layers.SwiGLU, act_layer=nn.SiLU),  # separate gate and up projections
         "glu-packed": dict(mlp_layer=timm.layers.SwiGLUPacked, act_layer=nn.SiLU),  # one fc1, act on the first half
         "glu-gate-last": dict(mlp_layer=functools.partial(timm.layers.GluMlp, gate_last=True), act_layer=nn.GELU),
         "glu-sigmoid": dict(mlp_layer=timm.layers.GluMlp, act_layer=nn.Sigmoid),  # the original GLU: held constant
         "swiglu-sigmoid": dict(mlp_layer=timm.layers.SwiGLU, act_layer=nn.Sigmoid),
         "map": dict(global_pool="map", class_token=False),  # AttentionPoolLatent: a learned query
         "map-class-token-swiglu": dict(global_pool="map", mlp_layer=timm.layers.SwiGLU, act_layer=nn.SiLU)}


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
@pytest.mark.parametrize("kind", list(GATED))
def test_gated_mlps_and_attention_pool_equal_float64_reference(kind, attention):
    """Gated MLPs (the uniform rule on act(gate) * up) and timm's attention pool (a learned query: the scores pass
    all their relevance to the keys) against the hand-written reference; the forward is unchanged."""
    m = tiny_timm(**GATED[kind])
    equals_reference(m, torch.randn(3, 3, 16, 24, dtype=torch.float64), params_timm(m), attention, forward_atol=1e-12)


def gated_attention(m: nn.Module) -> nn.Module:
    """``m`` with gated attention (``conftest.with_gated_attention``), jittered, in float64."""
    return _jitter(with_gated_attention(m).double().eval())


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
@pytest.mark.parametrize("kw", [dict(), dict(class_token=False, global_pool="avg", reg_tokens=2)])
def test_gated_attention_equals_float64_reference(kw, attention):
    """An attention's sigmoid output gate, ``o * sigmoid(z)``, held constant under both attention rules (all of the
    product's relevance to ``o``), against the hand-written reference; the forward is the model's own bit for bit."""
    m = gated_attention(tiny_timm(**kw))
    assert all(b.attn.gate is not None for b in m.blocks)
    equals_reference(m, torch.randn(3, 3, 16, 24, dtype=torch.float64), params_timm(m), attention)


@pytest.mark.parametrize("name", ["gated-vit", "naflexvit+eva-gated-swiglu", "naflexvit+rope-gated"])
def test_gated_attention_conservation_fails_without_the_gate_rule(name, monkeypatch):
    """The tests above are not vacuous: with the gate's rule left out (the plain gradient through the product and
    the sigmoid to the gate projection), CP no longer conserves."""
    from vitviz.core.families import lrp_timm

    m = gated_attention(tiny_timm()) if name == "gated-vit" else tiny_registered(name)
    _zero_biases(m)
    x = torch.randn(2, 3, *((16, 24) if name == "gated-vit" else (32, 32)), dtype=torch.float64)
    rules = LRPRules(epsilon=0.0, attention="cp")
    rel, score = attnlrp_tokens(m, x, 1, rules=rules)
    assert torch.allclose(rel.sum(1), score, rtol=1e-9, atol=0)
    monkeypatch.setattr(lrp_timm, "install_output_gate", lambda attn: lambda: None)
    rel, score = attnlrp_tokens(m, x, 1, rules=rules)
    assert not torch.allclose(rel.sum(1), score, rtol=1e-3, atol=0)


PARALLEL = {  # timm's parallel blocks and differential attention
    "scaling": dict(block_fn=timm.models.vision_transformer.ParallelScalingBlock, qkv_bias=True),  # ViT-22B
    "scaling-fused-out": dict(block_fn=functools.partial(timm.models.vision_transformer.ParallelScalingBlock,
                                                         fuse_out_proj=True), init_values=0.5),
    "things": dict(block_fn=timm.models.vision_transformer.ParallelThingsBlock, qkv_bias=True, init_values=0.5),
    "differential": dict(attn_layer=timm.layers.DiffAttention),
    "differential-scaling": dict(block_fn=timm.models.vision_transformer.DiffParallelScalingBlock)}


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
@pytest.mark.parametrize("kind", list(PARALLEL))
def test_parallel_blocks_and_differential_attention_equal_float64_reference(kind, attention):
    """Parallel blocks (ViT-22B's ``ParallelScalingBlock``: attention and MLP from one fused projection, whose MLP part
    keeps its gradient; ``ParallelThingsBlock``: summed branches) and differential attention (``A1 - lambda A2``, a
    sum of two softmax maps' products with v, each under the uniform rule, then the per-head RMS norm) against the
    hand-written reference; the forward is unchanged."""
    m = tiny_timm(**PARALLEL[kind])
    equals_reference(m, torch.randn(3, 3, 16, 24, dtype=torch.float64), params_timm(m), attention)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
def test_cait_equals_float64_reference(attention, fused):
    """CaiT: talking heads (linear maps across the heads before and after the softmax take the epsilon rule) over the
    patches, then class attention (the class token's query, an input: the self-attention scales). Its class token
    joins after the patch blocks and is read where it enters the first class-attention block: the relevance has the
    class token first, as every other model's, and the map its patches. Against the hand-written reference, with the
    class attention fused (SDPA) and explicit; the forward is unchanged."""
    torch.manual_seed(11)
    m = timm.create_model("cait_xxs24_224", pretrained=False, img_size=(16, 24), patch_size=8, embed_dim=16, depth=2,
                          num_heads=2, num_classes=5)
    m = _jitter(m.double().eval())
    for block in m.blocks_token_only:
        block.attn.fused_attn = fused
    x = torch.randn(3, 3, 16, 24, dtype=torch.float64)
    rel, ref = equals_reference(m, x, params_cait(m), attention)
    assert rel.shape == ref.shape == (3, 1 + 6)
    assert torch.allclose(attnlrp(m, x, [0, 3, 4], attention_rule=attention), ref[:, 1:].reshape(3, 2, 3),
                          atol=1e-10 * ref.abs().max())


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
def test_siglip_head_equals_float64_reference(attention):
    """SigLIP's attention-pooling head (a probe query through an nn.MultiheadAttention, then a residual MLP)
    against the hand-written reference, explaining the sum of the image embedding."""
    import transformers as T

    torch.manual_seed(6)
    m = T.SiglipVisionModel(T.SiglipVisionConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=32, image_size=16, patch_size=8))
    m = _jitter(m.double().eval())
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    y0 = m(x).pooler_output
    with lrp_rules(m):
        assert torch.allclose(m(x).pooler_output, y0, atol=1e-12)
    rel, score = attnlrp_tokens(m, x, lambda out: out.pooler_output.sum(-1), rules=LRPRules(attention=attention))
    ref, total = reference(params_siglip(m), tokens_of(m, x), None, attention=attention)
    assert torch.allclose(score, total, atol=1e-12)
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()


def test_siglip_head_keeps_the_half_lxts_recipe_drops(monkeypatch):
    """lxt's recipe for this head (``lxt/efficient/models/siglip2.py``, SigLIP 2's identical head) stops the gradient
    at the keys and halves the attention output's, under both its variants: the keys get nothing and the values
    half, so the half of the relevance the uniform rule gives the scores is dropped. vitviz passes the scores' half
    on to the keys (the query is a weight), and under CP the values get all of it. Zero biases, epsilon 0, CP: vitviz
    conserves the score; lxt's head, written as vitviz's scales (keys 0, values 1/2), keeps exactly half."""
    import transformers as T

    from vitviz.core.families import lrp

    torch.manual_seed(7)
    m = T.SiglipVisionModel(T.SiglipVisionConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=32, image_size=16, patch_size=8))
    m = _jitter(m.double().eval())
    _zero_biases(m)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    rules = LRPRules(epsilon=0.0, attention="cp")
    rel, score = attnlrp_tokens(m, x, lambda out: out.pooler_output.sum(-1), rules=rules)
    assert torch.allclose(rel.sum(1), score, rtol=1e-9, atol=0)
    monkeypatch.setitem(lrp.POOL_KV_FACTORS, "cp", (0.0, 0.5))
    lxt_rel, _ = attnlrp_tokens(m, x, lambda out: out.pooler_output.sum(-1), rules=rules)
    assert torch.allclose(lxt_rel.sum(1), score / 2, rtol=1e-9, atol=0)


# timm configurations outside its registry: NaFlexVit's EVA path (naflexvit.get_block_fn: EvaBlock with
# EvaAttention or AttentionRope for rotary embeddings, an EVA attention, SwiGLU, gated attention, grouped key heads)
TIMM_CONFIGS = {
    "naflexvit+eva-gated-swiglu": ("naflexvit_base_patch16_gap", dict(attn_type="eva", attn_gated=True,
                                                                      swiglu_mlp=True)),  # vitviz's Eva forward
    "naflexvit+rope-gated": ("naflexvit_base_patch16_gap", dict(rope_type="axial", attn_gated=True)),
    "naflexvit+rope-grouped-keys": ("naflexvit_base_patch16_gap", dict(rope_type="axial", qkv_fused=False,
                                                                       num_kv_heads=1)),
    "naflexvit+rope-dinov3-gated": ("naflexvit_base_patch16_gap", dict(rope_type="dinov3", rope_rotate_half=True,
                                                                       attn_gated=True, reg_tokens=4)),
    "naflexvit+rope-mixed-map": ("naflexvit_base_patch16_map", dict(rope_type="mixed", attn_gated=True)),
}
# the full rule's conservation test reads every softmax at an attention's attn_drop: not an attention pool's
FULL_RULE_CONFIGS = [c for c, (name, _) in TIMM_CONFIGS.items() if not name.endswith("_map")]


TIMM_LAYOUT_MODELS = ["eva02_tiny_patch14_224",  # EvaAttention, fused qkv with biases (a forward of vitviz's), GluMlp
       "eva02_base_patch14_224",  # separate q/k/v projections, SwiGLU, rotary
       "eva02_base_patch16_clip_224",  # scale_norm LayerNorm inside the attention, class-token readout
       "eva02_enormous_patch14_clip_224",  # EvaBlockPostNorm, no rotary
       "vit_small_patch16_dinov3_qkvb",  # DINOv3: rotary past the class token and registers, layer scale
       "vit_small_plus_patch16_dinov3",  # DINOv3 with SwiGLU
       "vit_base_patch16_rope_224",  # AttentionRope (modules' projections), class token
       "vit_base_patch16_rope_mixed_224",  # learned per-layer rotary frequencies
       "vit_pe_core_small_patch16_384",  # Perception Encoder: AttentionRope, attention pool over every token
       "beit_base_patch16_224",  # timm BEiT: in-F.linear q/v biases (a forward of vitviz's), relative position bias
       "beitv2_base_patch16_224",
       "vit_relpos_small_patch16_rpn_224",  # relative position bias from an MLP, post-norm blocks, no class token
       "vit_srelpos_small_patch16_224",  # one relative position bias shared by every block
       "vit_small_patch16_18x2_224",  # ParallelThingsBlock: two attention and two MLP branches per block
       "vit_base_patch16_xp_224",  # ParallelScalingBlock (ViT-22B) with qk norm, class token
       "vit_pwee_patch16_reg1_gap_256",  # ParallelScalingBlock, fused output projection, register, average pool
       "vit_dwee_patch16_reg1_gap_256",  # differential attention (DiffAttention), RMS norms
       "vit_dpwee_patch16_reg1_gap_256",  # DiffParallelScalingBlock
       "cait_xxs24_224",  # CaiT: talking heads, class attention (its class token read where it enters)
       *TIMM_CONFIGS]


def tiny_registered(name: str) -> nn.Module:
    """A 2-block float64 model of timm's registry (or a ``TIMM_CONFIGS`` configuration), jittered, zero biases;
    skips what this timm does not build."""
    name, extra = TIMM_CONFIGS.get(name, (name, {}))
    torch.manual_seed(8)
    try:
        m = timm.create_model(name, pretrained=False, depth=2, embed_dim=32, num_heads=2, img_size=32, num_classes=3,
                              **extra)
    except (TypeError, ValueError, AssertionError) as err:
        assert extra, f"{name} does not build: {err}"  # only the configurations may be missing from an older timm
        pytest.skip(f"this timm does not build {name} with {extra}: {err}")
    if extra.get("attn_gated") and all(getattr(blk.attn, "gate", None) is None for blk in m.blocks):
        pytest.skip(f"this timm builds {name} without the output gate attn_gated=True asks for")  # an older timm
    m = _jitter(m.double().eval())
    _zero_biases(m)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    try:
        m(x)
    except RuntimeError as err:  # timm < 1.0.31's RotaryEmbeddingMixed builds float32 angles: no float64 forward
        pytest.skip(f"{name} has no float64 forward in this timm ({err})")
    return m


@pytest.mark.parametrize("name", TIMM_LAYOUT_MODELS)
def test_timm_layouts_forward_unchanged_and_conserve_under_cp(name):
    """timm Eva (EVA-02, DINOv3, rotary ViTs, PE), BEiT, relative-position ViTs, parallel blocks and differential
    attention: the forward under the rules is the model's own bit for bit (also where vitviz runs its own
    EvaAttention or BEiT attention forward), and with zero biases, epsilon 0 and CP the tokens sum to the logit,
    which fails if a gate, a norm, a rotation or an attention scale kept its plain gradient."""
    m = tiny_registered(name)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    y0 = m(x)
    with lrp_rules(m):
        assert torch.equal(m(x), y0)
    rel, score = attnlrp_tokens(m, x, 1, rules=LRPRules(epsilon=0.0, attention="cp"))
    assert rel.shape == (2, inspect(m).num_prefix_tokens + 4)  # timm < 1.0.27's CaiT has no num_prefix_tokens
    assert torch.allclose(rel.sum(1), score, rtol=1e-9, atol=0)


@pytest.mark.parametrize("name", ["eva02_tiny_patch14_224", "vit_small_patch16_dinov3_qkvb",
                                  "vit_base_patch16_rope_224", "vit_base_patch16_rope_mixed_224",
                                  "beit_base_patch16_224", "vit_relpos_small_patch16_rpn_224",
                                  "vit_small_patch16_18x2_224", "vit_pwee_patch16_reg1_gap_256",
                                  "vit_dwee_patch16_reg1_gap_256", "vit_dpwee_patch16_reg1_gap_256",
                                  *FULL_RULE_CONFIGS])
def test_timm_layouts_full_rule_conserves_up_to_the_softmax_share(name):
    """The full AttnLRP rule through Eva's rotary q and k, past relative position biases, through parallel branches
    and both softmaxes of a differential attention (its maps read as the 2H heads' softmaxes): zero biases, epsilon 0,
    the tokens sum to the logit minus what the softmaxes absorb, measured from each map A (read at ``attn_drop`` on
    the explicit path) and the gradient g reaching it, as in test_conservation_attnlrp, minus what the constant
    relative position bias b added to the scores takes (its share ``b_i A_i (h_i - A.h)``: ``log A - b`` stands for
    the scores ``q.k`` below). A rotation that lost relevance, or q / k scales other than 1/4, would break the sum."""
    m = tiny_registered(name)
    maps, grads, biases, handles = [], [], [], []
    for mod in m.modules():
        if hasattr(mod, "fused_attn") and isinstance(getattr(mod, "attn_drop", None), nn.Module):
            mod.fused_attn = False

            def hook(_m, _i, out, mod=mod):
                maps.append(out.detach())
                out.register_hook(lambda g: grads.insert(0, g.detach()))
                if getattr(mod, "relative_position_bias_table", None) is not None:  # BEiT's own table
                    biases.append(mod._get_rel_pos_bias().detach())
                elif getattr(mod, "rel_pos", None) is not None:  # RelPos: its bias module
                    biases.append(mod.rel_pos.get_bias().detach())
                else:
                    biases.append(torch.zeros(()))

            handles.append(mod.attn_drop.register_forward_hook(hook))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    rel, score = attnlrp_tokens(m, x, 1, rules=LRPRules(epsilon=0.0))
    for h in handles:
        h.remove()
    assert len(maps) == len(grads) == len(handles) >= 2
    absorbed = 0
    for a, g, b in zip(maps, grads, biases):
        h = g / 2
        ah = (a * h).sum(-1, keepdim=True)
        scores_share = (torch.xlogy(a, a) - a * b) * (h - ah)  # (log A - b) A (h - A.h), 0 where A underflows to 0
        absorbed = absorbed + ((a * h).sum(-1) - scores_share.sum(-1)).sum((1, 2))
    assert torch.allclose(rel.sum(1), score - absorbed, rtol=1e-9, atol=1e-9 * score.abs().max())
    assert (absorbed.abs() > 1e-3 * score.abs()).all()  # the softmax does absorb: the check is not vacuous


def tiny_open_clip(**kw) -> nn.Module:
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(10)
    m = VisionTransformer(image_size=16, patch_size=8, width=16, layers=2, heads=2, mlp_ratio=2.0,
                          **{"output_dim": 5, **kw})
    return _jitter(m.double().eval())


COCA = dict(attentional_pool=True, attn_pooler_heads=2, attn_pooler_queries=3)  # learned queries over the tokens


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
@pytest.mark.parametrize("kw", [dict(), dict(act_layer="quickgelu", ls_init_value=0.5),
                                dict(COCA, output_dim=8),  # keys of another width: separate q / k / v projections
                                dict(COCA, output_dim=16)])  # one in_proj
def test_open_clip_tower_equals_float64_reference(kw, attention):
    """An open_clip vision tower (its nn.MultiheadAttention and its bare ``proj`` matrix run forwards of vitviz's;
    CoCa's attentional pooler is an attention pool with learned queries) against the hand-written reference,
    explaining one image-feature per image; the output is unchanged."""
    from open_clip.transformer import QuickGELU

    kw = {**kw, "act_layer": QuickGELU} if kw.get("act_layer") == "quickgelu" else kw
    m = tiny_open_clip(**kw)
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    y0 = m(x)
    with lrp_rules(m):
        assert torch.allclose(m(x), y0, atol=1e-12)
    feats = torch.tensor([0, 3, 4])
    rules = LRPRules(attention=attention)
    rel, score = attnlrp_tokens(m, x, lambda out: out.gather(1, feats[:, None])[:, 0], rules=rules)
    ref, feature = reference(params_open_clip(m), tokens_of(m, x), feats, attention=attention)
    assert torch.allclose(score, feature, atol=1e-12)
    assert (rel - ref).abs().max() < 1e-10 * ref.abs().max()


@pytest.mark.parametrize("kw", [dict(pool_type="avg", ls_init_value=0.5), dict(COCA, pool_type="avg", output_dim=8),
                                dict(COCA, attentional_pool="parallel", output_dim=16),
                                dict(COCA, attentional_pool="cascade", output_dim=16)])
def test_open_clip_conserves_under_cp_and_refuses_the_whole_clip_model(kw):
    """The patch-mean tower and CoCa's attentional poolers (the mean of the queries; the contrastive pooler beside
    the first, or after it) conserve exactly under CP (zero biases, epsilon 0), which fails if ``proj``, a pooler or
    the attention kept the plain gradient; a whole CLIP model (its forward takes text, its features are
    L2-normalised) is refused, naming ``model.visual``."""
    import open_clip

    m = tiny_open_clip(**kw)
    _zero_biases(m)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    rel, score = attnlrp_tokens(m, x, lambda out: out.sum(-1), rules=LRPRules(epsilon=0.0, attention="cp"))
    assert torch.allclose(rel.sum(1), score, rtol=1e-9, atol=0)
    clip = open_clip.create_model("ViT-B-32", pretrained=None)
    with pytest.raises(UnsupportedModelError, match=r"image-text model.*model\.visual"):
        attnlrp(clip.eval(), torch.randn(1, 3, 224, 224), lambda out: out[0].sum(-1))


# ------------------------------------------------------------------------------------------------ at the pixels

@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
@pytest.mark.parametrize("kw", [dict(), dict(class_token=False, global_pool="avg", reg_tokens=2)])
def test_pixels_equal_float64_reference(kw, attention):
    """``read_at="pixels"``: on from the tokens through the position table's sum (the table keeps its share, as a
    bias) and the patch convolution (the epsilon rule, default epsilon), against the hand-written reference, which
    writes the convolution as a linear map of the unfolded patches. The model is left as it was."""
    m = tiny_timm(**kw)
    x = torch.randn(3, 3, 16, 24, dtype=torch.float64)
    before = _state(m)
    got = attnlrp(m, x, [0, 3, 4], attention_rule=attention, read_at="pixels")
    assert _same(_state(m), before)
    r_tokens, _ = reference(params_timm(m), tokens_of(m, x), torch.tensor([0, 3, 4]), attention=attention,
                            per_feature=True)
    ref = pixels_timm(m, x, r_tokens)
    assert got.shape == (3, 16, 24)
    assert (got - ref).abs().max() < 1e-10 * ref.abs().max()


@pytest.mark.parametrize("rule", ["epsilon", "gamma", "plain"])
@pytest.mark.parametrize("conv", [dict(kernel_size=4, stride=4), dict(kernel_size=3, stride=2, padding=1)])
def test_conv_rule_equals_the_linear_rule_on_unfolded_patches(conv, rule):
    """A convolution is a linear map of its unfolded input: the conv rule's pixel relevance equals the linear rule's
    on the unfolded patches, folded back (overlapping windows summed), for every linear rule."""
    from vitviz.core.families.lrp import install_conv, lrp_linear

    torch.manual_seed(13)
    layer = nn.Conv2d(3, 5, **conv).double()
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    rules = LRPRules(linear=rule, epsilon=1e-2)
    undo = install_conv(layer, rule, rules)
    try:
        leaf = x.clone().requires_grad_(True)
        out = layer(leaf)
        g = torch.randn_like(out)
        (grad,) = torch.autograd.grad(out, leaf, g)
    finally:
        undo()
    assert "forward" not in vars(layer)
    cols = torch.nn.functional.unfold(x, layer.kernel_size, stride=layer.stride, padding=layer.padding)
    leaf_cols = cols.transpose(1, 2).clone().requires_grad_(True)
    z = lrp_linear(leaf_cols, layer.weight.flatten(1), layer.bias, rule, rules)
    assert torch.allclose(z.transpose(1, 2).reshape(out.shape), out, atol=1e-12)
    (g_cols,) = torch.autograd.grad(z, leaf_cols, g.flatten(2).transpose(1, 2))
    want = torch.nn.functional.fold((leaf_cols * g_cols).transpose(1, 2).detach(), x.shape[-2:], layer.kernel_size,
                                    stride=layer.stride, padding=layer.padding)
    assert torch.allclose(x * grad, want, atol=1e-10)


def _zero_position_tables(m: nn.Module) -> None:
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.split(".")[-1] in ("pos_embed", "pos_embedding", "positional_embedding", "position_embeddings") or (
                    name.endswith("position_embedding.weight")):
                p.zero_()


PIXEL_FAMILIES = {
    "timm": lambda: tiny_timm(),
    "timm-eva02": lambda: tiny_registered("eva02_tiny_patch14_224"),
    "timm-cait": lambda: tiny_registered("cait_xxs24_224"),
    "timm-beit": lambda: tiny_registered("beit_base_patch16_224"),
    "timm-parallel": lambda: tiny_registered("vit_pwee_patch16_reg1_gap_256"),
    "timm-naflexvit": lambda: tiny_registered("naflexvit_base_patch16_gap"),
    "timm-naflexvit-rope-gated": lambda: tiny_registered("naflexvit+rope-gated"),  # rotary beside its table
    **{f"hf-{stem.lower()}": (lambda stem=stem: _hf(stem)) for stem in (
        "ViT", "DeiT", "Beit", "Data2VecVision", "Dinov2", "DINOv3ViT", "Siglip", "CLIPVision", "Aimv2Vision",
        "ViTMAE")},
    "torchvision": lambda: _jitter(__import__("torchvision").models.VisionTransformer(
        image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=3)
        .double().eval()),
    "open_clip": lambda: tiny_open_clip(),
}


def _hf(stem: str) -> nn.Module:
    import transformers as T

    torch.manual_seed(14)
    common = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=16,
                  patch_size=8)
    model = {"Siglip": "SiglipVisionModel", "CLIPVision": "CLIPVisionModel", "Aimv2Vision": "Aimv2VisionModel"}
    config = {"Siglip": "SiglipVisionConfig"}.get(stem, f"{stem}Config")
    extra = {"Beit": dict(use_absolute_position_embeddings=True), "ViTMAE": dict(mask_ratio=0.75),
             "DINOv3ViT": dict(num_register_tokens=2)}.get(stem, {})
    return _jitter(getattr(T, model.get(stem, f"{stem}Model"))(getattr(T, config)(**common, **extra)).double().eval())


@pytest.mark.parametrize("family", list(PIXEL_FAMILIES))
def test_pixels_sum_per_patch_to_the_patch_tokens(family):
    """Every family's token embedding read at the pixels: with zero biases, zero position tables and epsilon 0 the
    pixels of each patch sum to that patch token's relevance (the rules in between pass everything on), under both
    attention rules; the explained score is the same. Fails if a norm in the embedding (open_clip's ``ln_pre``)
    kept the plain gradient, or a pixel went to the wrong patch; the convolution's own rule (epsilon > 0) is
    checked against the reference above."""
    m = PIXEL_FAMILIES[family]()
    _zero_biases(m)
    _zero_position_tables(m)
    spec = inspect(m)
    size = (32, 32) if family.startswith("timm-") else (16, 24) if family == "timm" else (16, 16)
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    target = 1 if family.startswith("timm") or family == "torchvision" else (
        (lambda out: out.sum(-1)) if family == "open_clip" else (lambda out: out.last_hidden_state[:, 0].sum(-1)))
    (gh, gw), (ph, pw) = spec.grid_for_input(x), spec.patch_size
    for attention in ("attnlrp", "cp"):
        tokens, score = attnlrp_tokens(m, x, target, rules=LRPRules(epsilon=0.0, attention=attention))
        pixels, same = attnlrp_tokens(m, x, target, rules=LRPRules(epsilon=0.0, attention=attention,
                                                                    read_at="pixels"))
        assert torch.equal(score, same) and pixels.shape == x[:, 0].shape
        covered = pixels[:, :gh * ph, :gw * pw]  # EVA-02's 14 px patches leave 4 of the 32 px rows and columns
        # the patch convolution never reads the rest: exactly zero there (comparing the sums of the whole and of the
        # covered part would depend on the order of float64 summation, which differs with the shape)
        assert not pixels[:, gh * ph:].any() and not pixels[:, :, gw * pw:].any()
        per_patch = covered.reshape(2, gh, ph, gw, pw).sum((2, 4)).flatten(1)
        patches = tokens[:, spec.num_prefix_tokens:]
        assert torch.allclose(per_patch, patches, atol=1e-10 * patches.abs().max())


def test_pixels_refusals_and_bad_input():
    hybrid = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, img_size=32, depth=1, num_classes=3).eval()
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(UnsupportedModelError,
                       match=r"VisionTransformer: AttnLRP at the pixels.*hybrid.*read_at='tokens', the default"):
        attnlrp(hybrid, x, read_at="pixels")
    assert attnlrp(hybrid, x).shape[1:] == inspect(hybrid).grid_size  # at the tokens
    m = tiny_timm(dtype=torch.float32)
    from vitviz.errors import InputError

    with pytest.raises(InputError, match="read_at='image' is not one of"):
        attnlrp(m, torch.randn(1, 3, 16, 24), read_at="image")
    with pytest.raises(InputError, match="return_tokens=True.*read_at='pixels'"):
        attnlrp(m, torch.randn(1, 3, 16, 24), read_at="pixels", return_tokens=True)


@pytest.mark.parametrize("option", ["epsilon", "gamma"])
@pytest.mark.parametrize("value", [None, "x", float("inf"), True])
def test_rule_parameters_that_are_not_finite_numbers_are_refused(option, value):
    """epsilon and gamma are non-negative finite numbers: None and a string get an InputError naming the option (not
    float()'s TypeError / ValueError), and an infinite epsilon (every relevance 0) or gamma is refused, not run."""
    from vitviz.errors import InputError

    m = tiny_timm(dtype=torch.float32)
    with pytest.raises(InputError, match=f"{option}="):
        attnlrp(m, torch.randn(1, 3, 16, 24), **{option: value})


def test_return_tokens_must_be_a_bool():
    from vitviz.errors import InputTypeError

    m = tiny_timm(dtype=torch.float32)
    with pytest.raises(InputTypeError, match="return_tokens='no'"):
        attnlrp(m, torch.randn(1, 3, 16, 24), return_tokens="no")  # a truthy string would return (B, N) tokens


@pytest.mark.parametrize("norm", [nn.LayerNorm(8), nn.RMSNorm(8, eps=1e-6)], ids=["layernorm", "rmsnorm"])
def test_norm_rule_in_float16_keeps_a_token_with_a_large_feature(norm):
    """The norm rule divides by the token's standard deviation (RMS), held constant. Computed in float16, the mean
    of the squares overflows once a feature passes about 256 (ViTs carry such features), the denominator becomes
    infinite and the token's relevance through the norm exactly 0; the forward (torch upcasts) is unaffected. The
    rule's float16 backward must equal the same rule computed in float32."""
    from vitviz.core.families.lrp import install_norm

    torch.manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(8) + 0.5)
    x = torch.randn(3, 8)
    x[0, 2] = 400.0  # one token with a large feature, within float16's range
    g = torch.randn(3, 8)
    grads = []
    for dtype in (torch.float32, torch.float16):
        m = copy.deepcopy(norm).to(dtype)
        xi = x.to(dtype).requires_grad_(True)
        undo = install_norm(m)
        try:
            (gx,) = torch.autograd.grad(m(xi), xi, g.to(dtype))
        finally:
            undo()
        grads.append(gx.float())
    want, got = grads
    assert (want.abs().amax(1) > 1e-3).all()  # every token, the large one too, receives relevance
    # per token (the large token's gradient is small: its standard deviation is large), to float16's precision
    assert ((got - want).abs().amax(1) <= 1e-2 * want.abs().amax(1)).all()


def test_norm_rule_of_a_channel_layer_norm_normalises_the_channels():
    """timm's ``LayerNorm2d`` normalises the channels (axis 1) of a ``(B, C, H, W)`` map. The rule's backward had
    normalised the last axis (the map's width) with the ``(C,)`` weight broadcast along it: a wrong relevance, or a
    shape error where ``W != C``. It must equal the rule of ``nn.LayerNorm`` over the channels moved last."""
    from timm.layers import LayerNorm2d

    from vitviz.core.families.lrp import install_norm

    torch.manual_seed(0)
    norm2d, norm = LayerNorm2d(4, eps=1e-6), nn.LayerNorm(4, eps=1e-6)
    with torch.no_grad():
        norm2d.weight.copy_(torch.rand(4) + 0.5)
        norm.weight.copy_(norm2d.weight)
    x, g = torch.randn(2, 4, 3, 4), torch.randn(2, 4, 3, 4)  # W == C: a last-axis rule runs without a shape error
    grads = []
    for m, xi, gi in ((norm2d, x, g), (norm, x.permute(0, 2, 3, 1), g.permute(0, 2, 3, 1))):
        xi = xi.clone().requires_grad_(True)
        undo = install_norm(m)
        try:
            (gx,) = torch.autograd.grad(m(xi), xi, gi)
        finally:
            undo()
        grads.append(gx)
    torch.testing.assert_close(grads[0], grads[1].permute(0, 3, 1, 2))


def test_plain_patterns_must_name_a_layer_that_takes_the_linear_rule():
    """``plain`` leaves the named linear layers at the plain gradient. A pattern that matched only modules without
    the linear rule (a norm, an activation, a whole block, the patch convolution read at the tokens) used to pass
    the check and change nothing: the default map, silently, for a comparison asked to differ. Each pattern must
    name a layer that takes the linear rule where the relevance is read; every such layer is accepted (open_clip's
    bare ``proj`` matrix, the patch convolution at the pixels)."""
    m = tiny_timm()
    x = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    for pattern in ("blocks.0.norm1", "blocks.*.mlp.act", "blocks.0", "patch_embed.proj"):
        with pytest.raises(InputError, match=rf"\['{re.escape(pattern)}'\] match no layer that takes the linear rule"):
            attnlrp(m, x, 1, plain=(pattern,))
    gamma = dict(linear_rule="gamma")  # far from the plain gradient on every layer (epsilon=1e-6 is close to it)
    for pattern, kw in (("blocks.0.attn.qkv", gamma), ("blocks.*.mlp.fc2", gamma), ("head", gamma),
                        ("patch_embed.proj", dict(gamma, read_at="pixels"))):
        assert not torch.allclose(attnlrp(m, x, 1, plain=(pattern,), **kw), attnlrp(m, x, 1, **kw))
    clip = tiny_open_clip()
    xc = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    feature = lambda out: out[:, 2]  # noqa: E731
    assert not torch.allclose(attnlrp(clip, xc, feature, plain=("proj",), **gamma), attnlrp(clip, xc, feature, **gamma))
