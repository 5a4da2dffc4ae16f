"""Block features are pooled as the model's own readout pools its last block: timm's ``global_pool`` (token, avg,
avgmax, max; attention pooling falls back to the class token, else the patch mean), Hugging Face BEiT's mean pooling
and DINOv2's classifier input, open_clip's ``pool_type``."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit

from vitviz.core.features import extract_features

X = torch.randn(4, 3, 32, 48, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0, 1, 0, 1])


def block_outputs(blocks, run):
    """Each block's output tokens during ``run()``."""
    out: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda _m, _i, o: out.append(o[0] if isinstance(o, tuple) else o))
               for b in blocks]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return out


TIMM_POOLS = {  # the reduction timm's global_pool_nlc applies to tokens (B, N, D) with p prefix tokens
    "token": lambda t, p: t[:, 0],
    "avg": lambda t, p: t[:, p:].mean(1),
    "avgmax": lambda t, p: 0.5 * (t[:, p:].amax(1) + t[:, p:].mean(1)),
    "max": lambda t, p: t[:, p:].amax(1),
}


@pytest.mark.parametrize("pool", list(TIMM_POOLS))
@pytest.mark.parametrize("reg_tokens", [0, 2])
def test_timm_block_features_pool_as_global_pool_and_lead_to_the_pre_logits(pool, reg_tokens):
    model = tiny_timm_vit(global_pool=pool, reg_tokens=reg_tokens)  # a class token, and registers
    p = 1 + reg_tokens
    f = extract_features(model, (X, Y), layers="all")
    tokens = block_outputs(model.blocks, lambda: model(X))
    for i, t in enumerate(tokens):
        torch.testing.assert_close(f.feats[i], TIMM_POOLS[pool](t, p))
    if pool != "token":
        assert not torch.allclose(f.feats[1], t[:, 0])  # not the class token
    # timm: pre-logits = fc_norm(pool(norm(tokens))); norm is per token (commutes with taking token 0), and
    # timm leaves norm as the identity when it pools over patches (the norm moves to fc_norm, after the pool)
    with torch.no_grad():
        torch.testing.assert_close(f.feats["pre_logits"], model.fc_norm(model.norm(f.feats[1])))


def test_timm_pool_including_prefix_tokens_and_attention_pooling():
    model = tiny_timm_vit(global_pool="avg", reg_tokens=1, pool_include_prefix=True)
    f = extract_features(model, (X, Y), layers=[1])
    t = block_outputs(model.blocks, lambda: model(X))[1]
    torch.testing.assert_close(f.feats[1], t.mean(1))  # every token, prefix included, as timm pools it
    for class_token in (True, False):  # "map": the head's attention pool is trained on the last block only
        model = tiny_timm_vit(global_pool="map", class_token=class_token)
        f = extract_features(model, (X, Y), layers=[0])
        t = block_outputs(model.blocks, lambda model=model: model(X))[0]
        torch.testing.assert_close(f.feats[0], t[:, 0] if class_token else t.mean(1))


def test_hf_beit_mean_pooling_and_dinov2_classifier_input():
    import transformers as T

    small = dict(patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    x = X[:, :, :, :32]
    beit = T.BeitForImageClassification(T.BeitConfig(image_size=32, num_labels=2, use_mean_pooling=True, **small))
    token = T.BeitForImageClassification(T.BeitConfig(image_size=32, num_labels=2, use_mean_pooling=False, **small))
    dino = T.Dinov2ForImageClassification(T.Dinov2Config(image_size=32, num_labels=2, **small))
    dino_reg = T.Dinov2WithRegistersForImageClassification(T.Dinov2WithRegistersConfig(
        image_size=32, num_labels=2, num_register_tokens=2, **small))
    backbone = T.Dinov2Model(T.Dinov2Config(image_size=32, **small))
    cases = [
        (beit, lambda h: h[:, 1:].mean(1)),  # BeitPooler: the mean of the patch tokens
        (token, lambda h: h[:, 0]),
        (dino, lambda h: torch.cat([h[:, 0], h[:, 1:].mean(1)], -1)),  # the classifier reads [cls, patch mean]
        (dino_reg, lambda h: torch.cat([h[:, 0], h[:, 3:].mean(1)], -1)),  # registers left out of the mean
        (backbone, lambda h: h[:, 0]),  # Dinov2Model's pooler_output: the class token
    ]
    for model, pool in cases:
        model.eval()
        f = extract_features(model, (x, Y), layers="all")
        with torch.no_grad():
            hidden = model(pixel_values=x, output_hidden_states=True).hidden_states
        for i in range(2):
            torch.testing.assert_close(f.feats[i], pool(hidden[i + 1]), msg=type(model).__name__)
        assert f.feats[1].shape[-1] == f.feats["pre_logits"].shape[-1]


@pytest.mark.parametrize("pool_type", ["tok", "avg"])
def test_open_clip_block_features_follow_pool_type(pool_type):
    from hf_models import open_clip_tower

    tower = open_clip_tower(pool_type=pool_type)
    f = extract_features(tower, (X, Y), layers="all")
    tokens = block_outputs(tower.transformer.resblocks, lambda: tower(X))
    for i, t in enumerate(tokens):
        t = t if tower.transformer.batch_first else t.transpose(0, 1)
        torch.testing.assert_close(f.feats[i], t[:, 1:].mean(1) if pool_type == "avg" else t[:, 0])


def test_cait_blocks_over_patches_alone_are_pooled_by_their_mean():
    """CaiT's self-attention blocks hold no class token (token 0 is a patch); its class-attention blocks output
    the class token alone."""
    import timm

    from vitviz.core.features import extract_features

    model = timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                              depth_token_only=2, embed_dim=32, num_heads=2, num_classes=5).eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    f = extract_features(model, (x, torch.arange(3)), layers="all")
    with torch.no_grad():
        patches = model.blocks(model.pos_drop(model.patch_embed(x) + model.pos_embed))
        cls = model.cls_token.expand(3, -1, -1)
        for blk in model.blocks_token_only:
            cls = blk(patches, cls)
    torch.testing.assert_close(f.feats[1], patches.mean(1))
    torch.testing.assert_close(f.feats[3], cls[:, 0])
    torch.testing.assert_close(f.feats["pre_logits"], model.norm(torch.cat([cls, patches], 1))[:, 0])


def test_distilled_block_features_average_the_class_and_distillation_tokens_as_the_head_does():
    """DeiT-distilled's head reads (x[:, 0] + x[:, 1]) / 2 (timm ``forward_head(pre_logits=True)``), so every
    block is pooled that way, not by the class token alone."""
    import timm

    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=(32, 48), patch_size=8,
                              embed_dim=32, depth=2, num_heads=2, num_classes=2).eval()
    f = extract_features(model, (X, Y), layers="all")
    tokens = block_outputs(model.blocks, lambda: model(X))
    for i, t in enumerate(tokens):
        torch.testing.assert_close(f.feats[i], (t[:, 0] + t[:, 1]) / 2, rtol=0, atol=0)
        assert not torch.allclose(f.feats[i], t[:, 0])
    with torch.no_grad():  # the pre-logits: the mean of the two tokens after the final norm
        torch.testing.assert_close(f.feats["pre_logits"], model.forward_head(model.forward_features(X), True))
        torch.testing.assert_close(f.feats["pre_logits"], model.norm(tokens[-1])[:, :2].mean(1))
