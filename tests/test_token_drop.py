"""Patch removal is a Family method: each family drops tokens where its output stays defined, exactly, and one
architecture gets the same removal (and the same curves) whichever library it comes from."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import transformers as T
from conftest import tiny_timm_vit
from hf_models import SMALL

import vitviz
from vitviz.errors import InputError

KEEP = torch.tensor([[0, 3, 5, 20], [1, 2, 22, 23]])  # 4 of the 24 patches of a 4x6 grid, per image


def hf_drop(model, x, keep=KEEP):
    from vitviz.analysis.perturbation import keep_tokens

    with torch.no_grad(), keep_tokens(model, keep):
        return model(pixel_values=x).last_hidden_state


def kept_index(prefix: int, keep=KEEP) -> torch.Tensor:
    return torch.cat([torch.arange(prefix).expand(len(keep), -1), keep + prefix], dim=1)


def encoder(model, h):
    """The transformer layers on a token sequence ``h`` (transformers >= 5.2 ViT / DeiT: ``layers``)."""
    if hasattr(model, "encoder"):
        return model.encoder(h).last_hidden_state
    for layer in model.layers:
        h = layer(h, None)
    return h


DINO = {k: v for k, v in SMALL.items() if k != "intermediate_size"} | {"mlp_ratio": 2}


@pytest.mark.parametrize("build, prefix", [
    (lambda: T.ViTModel(T.ViTConfig(image_size=(32, 48), **SMALL)), 1),
    (lambda: T.DeiTModel(T.DeiTConfig(image_size=(32, 48), **SMALL)), 2),
    (lambda: T.Dinov2Model(T.Dinov2Config(image_size=32, **DINO)), 1),
    (lambda: T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(image_size=32, num_register_tokens=3, **DINO)),
     4),
], ids=["vit", "deit", "dinov2", "dinov2-registers"])
def test_hugging_face_drop_equals_the_encoder_on_the_shorter_sequence(build, prefix):
    model = build().eval()
    with torch.no_grad():
        for p in model.parameters():  # tokens and tables start at zeros: random values make dropping visible
            p.add_(torch.randn_like(p) * 0.02)
    x = torch.randn(2, 3, 32, 48)
    assert vitviz.inspect(model).num_prefix_tokens == prefix
    got = hf_drop(model, x)
    with torch.no_grad():
        seq = model.embeddings(x)
        seq = seq.gather(1, kept_index(prefix)[..., None].expand(-1, -1, seq.shape[-1]))  # the shorter sequence
        want = model.layernorm(encoder(model, seq))
    assert got.shape == (2, prefix + 4, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the drop is gone afterwards
        torch.testing.assert_close(model(pixel_values=x).last_hidden_state,
                                   model.layernorm(encoder(model, model.embeddings(x))), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["beit", "data2vec"])
@pytest.mark.parametrize("config", [
    dict(image_size=(32, 48), use_relative_position_bias=True),
    dict(image_size=32, use_shared_relative_position_bias=True, use_absolute_position_embeddings=True),
], ids=["per-layer-bias", "shared-bias+absolute"])
def test_beit_drop_keeps_each_pair_its_relative_bias(config, family):
    """Reference: the full sequence with the removed keys masked out of every attention (their bias set to -1e9):
    the kept tokens then see exactly what they see when the removed ones are dropped. data2vec vision: BEiT's
    layout in transformers' older modules."""
    if family == "beit":
        model = T.BeitModel(T.BeitConfig(use_mean_pooling=False, **config, **SMALL)).eval()
    else:
        model = T.Data2VecVisionModel(T.Data2VecVisionConfig(use_mean_pooling=False, **config, **SMALL)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name or "embeddings" in name:
                p.normal_(std=0.5)
    x = torch.randn(2, 3, 32, 48) if config["image_size"] == (32, 48) else torch.randn(2, 3, 32, 32)
    keep = KEEP if x.shape[-1] == 48 else torch.tensor([[0, 3, 5, 12], [1, 2, 14, 15]])
    n = 1 + (24 if x.shape[-1] == 48 else 16)
    index = kept_index(1, keep)
    got = hf_drop(model, x, keep)
    mask = torch.full((2, 1, n, n), -1e9)
    for b in range(2):
        mask[b, :, :, index[b]] = 0
    hooks = [m.register_forward_hook(lambda _m, _i, out: out + mask) for m in model.modules()
             if type(m).__name__.endswith("RelativePositionBias")]
    with torch.no_grad():
        full = model(pixel_values=x).last_hidden_state
    for h in hooks:
        h.remove()
    want = full.gather(1, index[..., None].expand(-1, -1, 32))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the kept patches in another sequence order: each token's output follows it (biases go with positions)
    flipped = hf_drop(model, x, keep.flip(1))
    torch.testing.assert_close(flipped[:, 1:].flip(1), want[:, 1:], atol=1e-5, rtol=1e-5)


def test_beit_faithfulness_drops_tokens_instead_of_failing():
    model = T.BeitModel(T.BeitConfig(image_size=(32, 48), use_relative_position_bias=True, use_mean_pooling=False,
                                     **SMALL)).eval()
    df = vitviz.faithfulness(model, torch.randn(2, 3, 32, 48), ["random"], target=lambda o: o.pooler_output.norm(
        dim=-1), steps=0.5, progress=False)
    assert set(df["removal"]) == {"drop"} and np.isfinite(df["score"]).all()


@pytest.mark.parametrize("timm_model, hf_model, expected", [
    (lambda: tiny_timm_vit(), lambda: T.ViTForImageClassification(T.ViTConfig(image_size=(32, 48), **SMALL)),
     "drop"),
    (lambda: timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=64, depth=2),
     lambda: T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(image_size=(32, 48), **SMALL)), "drop"),
    (lambda: timm.create_model("beit_base_patch16_224", pretrained=False, img_size=64, depth=2, global_pool="token"),
     lambda: T.BeitForImageClassification(T.BeitConfig(image_size=32, use_mean_pooling=False, **SMALL)), "drop"),
    (lambda: timm.create_model("beit_base_patch16_224", pretrained=False, img_size=64, depth=2),
     lambda: T.BeitForImageClassification(T.BeitConfig(image_size=32, **SMALL)), "mean"),
    (lambda: tiny_timm_vit(global_pool="avg", class_token=False),
     lambda: T.Dinov2ForImageClassification(T.Dinov2Config(image_size=32, **DINO)), "mean"),
], ids=["vit", "deit-distilled", "beit-token", "beit-mean-pooled", "patch-mean-readout"])
def test_one_architecture_gets_one_removal_whatever_its_library(timm_model, hf_model, expected):
    removals = []
    for model in (timm_model().eval(), hf_model().eval()):
        x = torch.randn(1, 3, *vitviz.inspect(model).img_size)
        df = vitviz.faithfulness(model, x, ["random"], modes=["deletion"], steps=0.5, progress=False)
        removals.append(set(df["removal"]))
    assert removals[0] == removals[1] == {expected}


def test_mean_pooled_readouts_refuse_drop_with_the_reason():
    model = T.BeitForImageClassification(T.BeitConfig(image_size=32, **SMALL)).eval()
    with pytest.raises(InputError, match="mean over patch tokens.*use removal='mean'"):
        vitviz.faithfulness(model, torch.randn(1, 3, 32, 32), ["random"], removal="drop", progress=False)


def timm_to_hf(model: torch.nn.Module) -> torch.nn.Module:
    """The timm ViT's weights in a Hugging Face ``ViTForImageClassification`` (same computation)."""
    d = model.embed_dim
    hf = T.ViTForImageClassification(T.ViTConfig(
        image_size=tuple(model.patch_embed.img_size), patch_size=8, hidden_size=d, num_hidden_layers=len(model.blocks),
        num_attention_heads=model.blocks[0].attn.num_heads, intermediate_size=model.blocks[0].mlp.fc1.out_features,
        num_labels=model.num_classes, layer_norm_eps=1e-6, hidden_act="gelu")).eval()
    src = model.state_dict()
    sd = {"vit.embeddings.cls_token": src["cls_token"], "vit.embeddings.position_embeddings": src["pos_embed"],
          "vit.embeddings.patch_embeddings.projection.weight": src["patch_embed.proj.weight"],
          "vit.embeddings.patch_embeddings.projection.bias": src["patch_embed.proj.bias"],
          "vit.layernorm.weight": src["norm.weight"], "vit.layernorm.bias": src["norm.bias"],
          "classifier.weight": src["head.weight"], "classifier.bias": src["head.bias"]}
    for i in range(len(model.blocks)):
        b, h = f"blocks.{i}.", f"vit.layers.{i}."
        for part, (w, bias) in zip(("q_proj", "k_proj", "v_proj"), zip(src[b + "attn.qkv.weight"].split(d),
                                                                        src[b + "attn.qkv.bias"].split(d))):
            sd[h + f"attention.{part}.weight"], sd[h + f"attention.{part}.bias"] = w, bias
        pairs = {"attention.o_proj": "attn.proj", "layernorm_before": "norm1", "layernorm_after": "norm2",
                 "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
        for theirs, ours in pairs.items():
            for t in ("weight", "bias"):
                sd[h + f"{theirs}.{t}"] = src[b + f"{ours}.{t}"]
    missing = hf.load_state_dict(sd, strict=True)
    assert not missing.missing_keys
    return hf


def test_the_same_weights_in_timm_and_hugging_face_give_the_same_curves():
    model = tiny_timm_vit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf = timm_to_hf(model)
    x = torch.randn(4, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(hf(pixel_values=x).logits, model(x), atol=1e-5, rtol=1e-5)
    run = dict(methods=["random", "rollout"], steps=0.25, progress=False)
    a, b = vitviz.faithfulness(model, x, **run), vitviz.faithfulness(hf, x, **run)
    assert set(a["removal"]) == set(b["removal"]) == {"drop"}
    pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=0)


def test_timm_beit_drop_keeps_each_pair_its_relative_bias():
    """As for Hugging Face BEiT: the reference masks the removed keys out of every attention of the full sequence."""
    from vitviz.analysis.perturbation import keep_tokens

    model = timm.create_model("beit_base_patch16_224", pretrained=False, img_size=(64, 96), depth=2, embed_dim=32,
                              num_heads=2, global_pool="token").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_(std=0.5)
    x = torch.randn(2, 3, 64, 96)
    index = kept_index(1)
    with torch.no_grad(), keep_tokens(model, KEEP):
        got = model.forward_features(x)
    mask = torch.full((2, 1, 25, 25), -1e9)
    for b in range(2):
        mask[b, :, :, index[b]] = 0
    originals = []
    for block in model.blocks:
        attn = block.attn
        originals.append(attn._get_rel_pos_bias)
        attn._get_rel_pos_bias = lambda f=attn._get_rel_pos_bias: f() + mask
    try:
        with torch.no_grad():
            full = model.forward_features(x)
    finally:
        for block in model.blocks:
            del block.attn._get_rel_pos_bias
    torch.testing.assert_close(got, full.gather(1, index[..., None].expand(-1, -1, 32)), atol=1e-5, rtol=1e-5)


def test_open_clip_drops_before_ln_pre_like_hugging_face_clip():
    """open_clip tower: dropping equals its forward written out on the shorter sequence; CLIP from either library
    gets the same removal."""
    from hf_models import open_clip_tower

    from vitviz.analysis.perturbation import keep_tokens

    model = open_clip_tower()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        with keep_tokens(model, KEEP):
            got = model(x)
        h = model.conv1(x).flatten(2).transpose(1, 2)
        h = torch.cat([model.class_embedding.expand(2, 1, -1), h], dim=1) + model.positional_embedding
        h = h.gather(1, kept_index(1)[..., None].expand(-1, -1, h.shape[-1]))
        h = model.transformer(model.ln_pre(h))
        want = model.ln_post(h)[:, 0] @ model.proj
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    hf = T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, **SMALL)).eval()
    vm, x32, keep = getattr(hf, "vision_model", hf), torch.randn(2, 3, 32, 32), torch.tensor([[0, 3, 5, 12], [1, 2, 14, 15]])
    with torch.no_grad():
        seq = vm.embeddings(x32).gather(1, kept_index(1, keep)[..., None].expand(-1, -1, 32))
        torch.testing.assert_close(hf_drop(hf, x32, keep), vm.encoder(vm.pre_layrnorm(seq)).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)
    target = lambda out: (out[0] if isinstance(out, tuple) else getattr(out, "pooler_output", out)).norm(dim=-1)  # noqa: E731
    removals = [set(vitviz.faithfulness(m, torch.randn(1, 3, *vitviz.inspect(m).img_size), ["random"], target=target,
                                        modes=["deletion"], steps=0.5, progress=False)["removal"])
                for m in (model, hf)]
    assert removals == [{"drop"}, {"drop"}]
    avg = open_clip_tower(pool_type="avg")
    assert set(vitviz.faithfulness(avg, x, ["random"], target=target, modes=["deletion"], steps=0.5,
                                   progress=False)["removal"]) == {"mean"}
