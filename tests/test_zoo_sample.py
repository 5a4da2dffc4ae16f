"""One architecture per timm family through the conformance invariants (the whole registry: test_zoo_registry).

Models are built with random weights, 2 blocks, at a small image size. The harness itself is checked: a capture
that returns differential attention's pre-difference maps, or CaiT's pre-mixing maps, must fail it.
"""

from __future__ import annotations

import pytest
import timm
import torch
from conformance import check_model
from conftest import with_gated_attention

import vitviz
from vitviz.core.families import timm_probes
from vitviz.errors import UnsupportedModelError

SAMPLE = [
    "cait_xxs24_224",  # talking-heads self-attention over patches, then class attention
    "vit_small_patch16_18x2_224",  # ParallelThingsBlock: two attention branches per block
    "vit_pwee_patch16_reg1_gap_256",  # ParallelScalingBlock
    "vit_dwee_patch16_reg1_gap_256",  # differential attention
    "vit_dpwee_patch16_reg1_gap_256",  # parallel differential attention
    "naflexvit_base_patch16_gap",  # NaFlexVit, 4 registers, any input size
    "vit_relpos_small_patch16_rpn_224",  # relative position bias, no class token
    "beit_base_patch16_224",  # BEiT relative position bias table
    "eva02_tiny_patch14_224",  # EVA-02, rotary + absolute
    "vit_medium_patch16_rope_reg1_gap_256",  # rotary only
    "flexivit_small",
    "deit_tiny_distilled_patch16_224",  # class + distillation tokens
    "vit_base_patch16_reg4_gap_256",  # registers
    "vit_tiny_r_s16_p8_224",  # hybrid
]


def build(name: str, depth: int = 2) -> torch.nn.Module:
    stride = 14 if "patch14" in name else 16
    return timm.create_model(name, pretrained=False, img_size=4 * stride, depth=depth).eval()


def batch(model: torch.nn.Module) -> torch.Tensor:
    spec = vitviz.inspect(model)
    sh, sw = spec.patch_size
    return torch.randn(2, 3, 4 * sh, 6 * sw) if spec.dynamic_img_size else torch.randn(2, 3, *spec.img_size)


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_architecture_passes_the_invariants(name):
    model = build(name)
    summary = check_model(model, batch(model))
    assert summary["layers"] == len(vitviz.inspect(model).attention_modules)


# NaFlexVit's EVA path (naflexvit.get_block_fn: EvaBlock with EvaAttention or AttentionRope), outside the registry
NAFLEX_EVA = {
    "rope-axial": dict(rope_type="axial", pos_embed="none"),
    "rope-axial-learned-gated": dict(rope_type="axial", attn_gated=True),
    "rope-mixed-registers": dict(rope_type="mixed", pos_embed="none", reg_tokens=2),
    "rope-dinov3-class-token": dict(rope_type="dinov3", rope_rotate_half=True, pos_embed="none", class_token=True,
                                    global_pool="token"),
    "eva-attention-swiglu-qk-norm": dict(attn_type="eva", swiglu_mlp=True, qk_norm=True),
    "rope-grouped-keys": dict(rope_type="axial", qkv_fused=False, num_heads=4, num_kv_heads=2),
}


@pytest.mark.parametrize("case", NAFLEX_EVA)
def test_naflexvit_eva_path_passes_the_invariants(case):
    """NaFlexVit built with rotary embeddings, an EVA attention, SwiGLU, an output gate or grouped key heads runs
    EvaBlocks: the captured maps equal the recomputation from the weights (rotary, grouped keys), with the model's
    output and state unchanged, on a non-square grid; the gate multiplies the output, not the maps."""
    torch.manual_seed(0)
    try:
        model = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, img_size=64, depth=2, embed_dim=64,
                                  **{"num_heads": 2, **NAFLEX_EVA[case]}).eval()
    except (TypeError, ValueError, AssertionError) as err:  # an older timm without this option
        pytest.skip(f"this timm does not build NaFlexVit with {NAFLEX_EVA[case]}: {err}")
    if NAFLEX_EVA[case].get("attn_gated") and getattr(model.blocks[0].attn, "gate", None) is None:
        pytest.skip("this timm builds NaFlexVit without the output gate attn_gated=True asks for")
    assert type(model.blocks[0]).__name__ == "EvaBlock"
    summary = check_model(model, torch.randn(2, 3, 64, 96))
    assert summary["layers"] == 2


def test_gated_attention_passes_the_invariants():
    """timm's ``Attention`` with an output gate (``gated=True``) inside a VisionTransformer: the maps are the
    softmax's, recomputed from ``qkv``; the gate, a function of the block's input, scales the output only."""
    model = with_gated_attention(build("vit_base_patch16_reg4_gap_256"), seed=0)
    check_model(model, batch(model))


def test_sam_is_refused_for_its_windowed_attention():
    with torch.device("meta"):
        model = timm.create_model("samvit_base_patch16", pretrained=False)
    with pytest.raises(UnsupportedModelError, match=r"VisionTransformerSAM.*windowed.*4-D position table"):
        vitviz.inspect(model)


def test_parallel_branches_are_named_and_counted():
    spec = vitviz.inspect(build("vit_small_patch16_18x2_224", depth=3))
    assert spec.depth == 3 and spec.num_heads == 6
    assert spec.attention_modules[:3] == ("blocks.0.attns.0.attn", "blocks.0.attns.1.attn", "blocks.1.attns.0.attn")
    assert spec.attention_blocks == (0, 0, 1, 1, 2, 2)
    xp = vitviz.inspect(build("vit_pwee_patch16_reg1_gap_256", depth=3))
    assert xp.attention_modules == ("blocks.0", "blocks.1", "blocks.2") and xp.num_heads == 4


def test_parallel_rollout_averages_the_branches_of_a_block():
    model = build("vit_small_patch16_18x2_224")
    x = batch(model)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    eye = torch.eye(cap.attentions[0].shape[-1])
    expected = None
    for i in range(0, len(cap.attentions), 2):
        w = (cap.attentions[i].mean(1) + cap.attentions[i + 1].mean(1)) / 2
        a = 0.5 * w + 0.5 * eye
        expected = a if expected is None else a @ expected
    got = vitviz.attention_rollout(model, x, return_full=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    spec = vitviz.inspect(model)
    pure = vitviz.rollout_from_attentions(cap.attentions, num_prefix_tokens=1, blocks=spec.attention_blocks)
    torch.testing.assert_close(pure, expected, atol=1e-5, rtol=1e-5)
    sequential = vitviz.rollout_from_attentions(cap.attentions, num_prefix_tokens=1)  # branches as layers
    assert not torch.allclose(sequential, expected, atol=1e-4)


def test_cait_rollout_refuses_talking_heads_and_rolls_out_class_attention():
    model = build("cait_xxs24_224")
    spec = vitviz.inspect(model)
    assert spec.num_tokens == spec.num_patches + 1 and spec.attention_maps == (
        "talking-heads", "talking-heads", "class-attention", "class-attention")
    x = batch(model)
    with pytest.raises(UnsupportedModelError, match=r"talking-heads.*start_layer=2"):
        vitviz.attention_rollout(model, x)
    with pytest.raises(UnsupportedModelError, match="mean_attention_distance"):
        vitviz.mean_attention_distance(model, x)
    with torch.no_grad(), vitviz.capture_attention(model, layers=[2, 3]) as cap:
        model(x)
    a2, a3 = (0.5 * a.mean(1) + 0.5 * torch.eye(a.shape[-1]) for a in cap.attentions)
    maps = vitviz.attention_rollout(model, x, start_layer=2)
    torch.testing.assert_close(maps, (a3 @ a2)[:, 0, 1:].reshape(maps.shape), atol=1e-6, rtol=1e-5)


def test_differential_maps_are_signed_and_refused_by_rollout():
    model = build("vit_dwee_patch16_reg1_gap_256")
    x = batch(model)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    lam = model.blocks[0].attn._compute_lambda()
    torch.testing.assert_close(cap.attentions[0].sum(-1), (1 - lam).expand(cap.attentions[0].shape[:3]))
    with pytest.raises(UnsupportedModelError, match="differential"):
        vitviz.attention_rollout(model, x)


def test_relative_bias_models_report_their_kind():
    assert vitviz.inspect(build("beit_base_patch16_224")).pos_embed_kind == "relative-bias"
    assert vitviz.inspect(build("vit_relpos_small_patch16_rpn_224")).pos_embed_kind == "relative-bias"
    assert vitviz.inspect(build("vit_medium_patch16_rope_reg1_gap_256")).pos_embed_kind == "rotary"


# ---------------------------------------------------------------- the harness fails on wrong captures
def test_harness_fails_on_pre_difference_maps(monkeypatch):
    def pre_difference(module, emit):  # the 2H softmax maps before S1 - lambda S2
        return timm_probes.probe_attn_drop(module, emit)

    monkeypatch.setitem(timm_probes._PROBES, "DiffAttention", (pre_difference, "differential"))
    model = build("vit_dwee_patch16_reg1_gap_256")
    with pytest.raises(AssertionError, match=r"blocks\.0\.attn: map \(2, 8, 17, 17\) != \(2, 4, 17, 17\)"):
        check_model(model, batch(model))


def test_harness_fails_on_pre_mixing_talking_heads_maps(monkeypatch):
    def pre_mixing(module, emit):  # softmax output before proj_w (the input of proj_w, heads last)
        hook = module.proj_w.register_forward_pre_hook(
            lambda _m, args: emit(timm_probes.embed_patch_maps(args[0].permute(0, 3, 1, 2), 1)))
        return hook.remove

    monkeypatch.setitem(timm_probes._PROBES, "TalkingHeadAttn", (pre_mixing, "talking-heads"))
    model = build("cait_xxs24_224")
    with pytest.raises(AssertionError, match=r"blocks\.0\.attn \(talking-heads\) differs from the recomputation"):
        check_model(model, batch(model))


def test_unknown_attention_module_is_refused_by_class():
    class GatedAttention(torch.nn.Module):  # a user's own attention inside a timm model
        def __init__(self, inner):
            super().__init__()
            self.inner, self.num_heads = inner, inner.num_heads

        def forward(self, x, **kwargs):
            return self.inner(x, **kwargs)

    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=64, depth=2).eval()
    model.blocks[1].attn = GatedAttention(model.blocks[1].attn)
    with pytest.raises(UnsupportedModelError, match=r"VisionTransformer \(timm\) uses the attention module "
                                                    r"GatedAttention"):
        vitviz.inspect(model)


@pytest.mark.parametrize("method", ["grad_rollout", "chefer"])
def test_gradient_methods_refuse_signed_maps(method):
    """Differential attention and CaiT's talking heads are not flows between tokens: the gradient-weighted methods
    refuse them as rollout does (the headless DINOv2-style target is irrelevant to the refusal)."""
    for name in ("vit_dwee_patch16_reg1_gap_256", "cait_xxs24_224"):
        model = build(name)
        with pytest.raises(UnsupportedModelError, match=r"differential|talking-heads"):
            vitviz.explain(model, batch(model), method=method)


def test_chefer_averages_the_branches_of_a_parallel_block():
    from vitviz.analysis.relevance import attention_gradients, chefer_from_attentions

    model = build("vit_small_patch16_18x2_224")
    x = batch(model)
    spec = vitviz.inspect(model)
    attns, grads, _ = attention_gradients(model, x, None, spec=spec, layers=list(range(len(spec.attention_modules))))
    r = torch.eye(attns[0].shape[-1]).expand(len(x), -1, -1)
    for i in range(0, len(attns), 2):  # Chefer's update with the two branches' weights averaged
        w = sum((a * g).clamp_min(0).mean(1) for a, g in ((attns[i], grads[i]), (attns[i + 1], grads[i + 1]))) / 2
        r = r + w @ r
    got = chefer_from_attentions(attns, grads, spec.attention_blocks)
    eye = torch.eye(r.shape[-1])
    scale = (r - eye).abs().max()  # random weights: the relevance beyond I is small (~1e-6); compare it to scale
    assert scale > 0
    torch.testing.assert_close(got - eye, r - eye, atol=1e-5 * scale, rtol=1e-4)
    maps = vitviz.explain(model, x, method="chefer")
    torch.testing.assert_close(maps, r[:, 0, 1:].reshape(maps.shape), atol=1e-5 * scale, rtol=1e-4)
    series = chefer_from_attentions(attns, grads)  # the branches chained as layers: not the same
    assert (series - r).abs().max() > 1e-2 * scale


LRP_SUPPORTED = {"eva02_tiny_patch14_224", "vit_medium_patch16_rope_reg1_gap_256", "flexivit_small",
                 "deit_tiny_distilled_patch16_224", "vit_base_patch16_reg4_gap_256", "vit_tiny_r_s16_p8_224",
                 "vit_base_patch16_siglip_224", "aimv2_large_patch14_224", "vit_small_patch16_dinov3_qkvb",
                 "vit_pe_core_small_patch16_384", "vit_base_patch16_rpn_224", "vit_relpos_small_patch16_rpn_224",
                 "beit_base_patch16_224", "beitv2_base_patch16_224", "vit_srelpos_small_patch16_224",
                 "naflexvit_base_patch16_gap", "naflexvit_base_patch16_map", "vit_small_patch16_18x2_224",
                 "vit_pwee_patch16_reg1_gap_256", "vit_dwee_patch16_reg1_gap_256", "vit_dpwee_patch16_reg1_gap_256",
                 "cait_xxs24_224"}


@pytest.mark.parametrize("name", SAMPLE + sorted(LRP_SUPPORTED - set(SAMPLE)))
def test_attnlrp_conserves_or_refuses(name):
    """No silent wrong answer from AttnLRP across timm's families: each architecture either is refused with
    UnsupportedModelError, or (float64, zero biases, epsilon 0, CP attention: every rule conservative) its token
    relevances sum to the score (the sum of the outputs: logits, or features without a head) exactly and its
    forward is unchanged. Which ones are supported is pinned."""
    from vitviz.analysis.attnlrp import attnlrp_tokens
    from vitviz.core.families.lrp import LRPRules, lrp_rules

    torch.manual_seed(9)
    model = build(name).double()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.3)
            if pname.endswith("bias"):
                p.zero_()
    x = batch(model).double()
    try:
        rel, score = attnlrp_tokens(model, x, lambda out: out.sum(-1), rules=LRPRules(epsilon=0.0, attention="cp"))
    except UnsupportedModelError as err:
        assert name not in LRP_SUPPORTED, f"{name} is refused: {err}"
        assert "AttnLRP" in str(err) or "softmax" in str(err)
        return
    assert name in LRP_SUPPORTED, f"{name} is supported: add it to LRP_SUPPORTED"
    assert torch.allclose(rel.sum(1), score, rtol=1e-9, atol=0)
    y0 = model(x)
    with lrp_rules(model):
        assert torch.equal(model(x), y0)
