"""Hugging Face families: capture equals the model's own eager ``output_attentions``, leaves no trace, and the
layout ``inspect`` reads drives rollout, distance and position similarity (tiny random-weight models)."""

from __future__ import annotations

import pytest
import torch
from hf_models import HF_CASES, SMALL, eager_copy, eager_rebuilt, hf_case
from test_capture import hooks_everywhere, instance_forwards

import vitviz
from vitviz.analysis.rollout import rollout_from_attentions
from vitviz.core.families import family_of
from vitviz.core.families.hf_base import vision_config
from vitviz.core.images import data_config
from vitviz.errors import CaptureError, InputError, NoPositionEmbeddingError, UnsupportedModelError

transformers = pytest.importorskip("transformers")


def attn_impls(model: torch.nn.Module) -> tuple[str, str]:
    return model.config._attn_implementation, vision_config(model)._attn_implementation


@pytest.mark.parametrize("name", HF_CASES)
def test_capture_equals_eager_output_attentions(name):
    case = hf_case(name)
    model, x = case.model, case.x
    impls = attn_impls(model)
    assert impls == ("sdpa", "sdpa")  # the model under analysis keeps its default implementation
    mask_ratio = getattr(model.config, "mask_ratio", None)
    with torch.no_grad():
        before = case.run(model, x)
        with vitviz.capture_attention(model) as cap:
            inside = case.run(model, x)
            # switched for the read-out only, on the config the attention modules read (CLIPModel: the vision one);
            # data2vec vision: its modules are built SDPA or eager, the probe runs the eager forward per call
            assert vision_config(model)._attn_implementation == ("sdpa" if case.extra.get("per_call") else "eager")
        after = case.run(model, x)
    reference = case.reference(model, x)
    n = len(case.prefix) + case.grid[0] * case.grid[1]
    assert len(cap.attentions) == len(reference) == 2
    for got, want in zip(cap.attentions, reference):
        assert got.shape == want.shape == (2, 2, n, n)
        assert float((got - want).abs().max()) <= 1e-5
        torch.testing.assert_close(got.sum(-1), torch.ones(2, 2, n), atol=1e-5, rtol=0)
    # the model is as it was: implementation, hooks, instance attributes, config, outputs
    assert attn_impls(model) == impls
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0
    assert getattr(model.config, "mask_ratio", None) == mask_ratio
    if name == "vit-mae":  # outside the capture ViTMAE masks 75% of the patches at random, as before
        assert before.shape[1] == after.shape[1] == 1 + 4 and inside.shape[1] == 1 + 16
        ref = eager_copy(model)
        ref.config.mask_ratio = 0.0
        with torch.no_grad():
            unmasked = ref(pixel_values=x, noise=case.extra["noise"]).last_hidden_state
        torch.testing.assert_close(inside, unmasked, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(inside, before, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(after, before, atol=0, rtol=0)


@pytest.mark.parametrize("name", HF_CASES)
def test_two_captures_closed_first_opened_first_leave_the_model_as_it_was(name):
    """Each capture once set the model up (ViTMAE unmasked, CLIPModel's guard) and undid its own set-up as it
    closed: closing the first capture first left the second reading a masked ViTMAE, then the first's wrapper and
    a mask ratio of 0 on the model for good. The set-up is shared: made by the first open capture, undone by the
    last one to close."""
    case = hf_case(name)
    model, x = case.model, case.x
    mask_ratio = getattr(model.config, "mask_ratio", None)
    with torch.no_grad():
        a = vitviz.capture_attention(model)
        a.__enter__()
        b = vitviz.capture_attention(model)
        cap = b.__enter__()
        a.__exit__(None, None, None)
        case.run(model, x)  # read by b alone, the model still set up for it
        n = len(case.prefix) + case.grid[0] * case.grid[1]
        assert cap.attentions[0].shape[-1] == n
        b.__exit__(None, None, None)
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0
    assert getattr(model.config, "mask_ratio", None) == mask_ratio


@pytest.mark.parametrize("name", HF_CASES)
def test_inspect_reads_the_layout_from_the_config(name):
    case = hf_case(name)
    spec = vitviz.inspect(case.model)
    assert (spec.family, spec.prefix_tokens, spec.pos_embed_kind) == ("huggingface", case.prefix, case.pos_kind)
    assert spec.grid_for_input(case.x) == case.grid
    assert (spec.depth, spec.num_heads, spec.embed_dim, spec.patch_size) == (2, 2, 32, (8, 8))
    assert len(spec.attention_modules) == 2 and all(spec.attention_modules)
    assert spec.class_token_index == (0 if "cls" in case.prefix else None)
    assert spec.params["total"] == sum(p.numel() for p in case.model.parameters())
    assert spec.params["patch_embed"] > 0 and spec.params["blocks"] > 0
    pos = family_of(case.model).pos_embed(case.model)
    if case.pos_kind in ("relative-bias", "rotary"):  # position applied inside attention: no table
        assert pos is None
    else:  # an absolute table: the patch rows of the built grid, plus the prefix rows it covers
        rows = (spec.num_prefix_tokens if spec.pos_embed_covers_prefix else 0) + spec.num_patches
        assert pos.shape == (1, rows, 32)
    filters, _ = vitviz.embedding_filters(case.model)
    assert filters.shape[:2] == (32, 3)  # the RGB patch projection: D filters over 3 channels
    cfg = data_config(case.model)
    assert cfg["input_size"] == (3, *spec.img_size) and len(cfg["mean"]) == len(cfg["std"]) == 3


@pytest.mark.parametrize("name", HF_CASES)
def test_analyses_are_finite_and_shaped_by_the_grid(name):
    case = hf_case(name)
    model = case.model.vision_model if name.endswith("-model") else case.model
    gh, gw = case.grid
    maps = vitviz.attention_rollout(model, case.x)
    assert maps.shape == (2, gh, gw) and torch.isfinite(maps).all() and (maps >= 0).all()
    dist = vitviz.mean_attention_distance(model, case.x)
    assert dist.shape == (2, 2) and torch.isfinite(dist).all() and (dist > 0).all()
    if case.pos_kind in ("relative-bias", "rotary"):
        with pytest.raises(NoPositionEmbeddingError, match=case.pos_kind):
            vitviz.pos_embed_similarity(case.model)
        return
    sim = vitviz.pos_embed_similarity(case.model)
    table = vitviz.inspect(case.model).grid_size
    assert sim.shape == (*table, *table) and torch.isfinite(sim).all()
    torch.testing.assert_close(sim.reshape(table[0] * table[1], -1).diagonal(), torch.ones(table[0] * table[1]))


def test_distilled_deit_has_two_prefix_tokens_and_rolls_out_from_cls_and_dist():
    case = hf_case("deit-distilled")  # ...WithTeacher: logits = mean of the class head and the distillation head
    with torch.no_grad(), vitviz.capture_attention(case.model) as cap:
        case.run(case.model, case.x)
    full = rollout_from_attentions(cap.attentions, num_prefix_tokens=2)
    maps = vitviz.attention_rollout(case.model, case.x)
    torch.testing.assert_close(maps, (full[:, 0, 2:] + full[:, 1, 2:]).reshape(2, 4, 6) / 2)
    torch.testing.assert_close(vitviz.attention_rollout(case.model, case.x, token="class"),
                               full[:, 0, 2:].reshape(2, 4, 6))
    dist_row = vitviz.attention_rollout(case.model, case.x, token=1)
    torch.testing.assert_close(dist_row, full[:, 1, 2:].reshape(2, 4, 6))


def test_siglip_has_no_class_token_and_rollout_uses_the_mean_of_patch_rows():
    case = hf_case("siglip-vision")
    spec = vitviz.inspect(case.model)
    assert spec.prefix_tokens == () and spec.class_token_index is None and not spec.pos_embed_covers_prefix
    ref = rollout_from_attentions(case.reference(case.model, case.x), num_prefix_tokens=0)  # (B, 16, 16)
    # the default weights the rows by the pooling head's attention (tests/test_readout.py); "patches": their mean
    maps = vitviz.attention_rollout(case.model, case.x, token="patches")
    torch.testing.assert_close(maps, ref.mean(dim=1).reshape(2, 4, 4), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(maps, ref[:, 0].reshape(2, 4, 4), atol=1e-4)  # not the first patch's row
    torch.testing.assert_close(vitviz.attention_rollout(case.model, case.x, token=5), ref[:, 5].reshape(2, 4, 4),
                               atol=1e-5, rtol=1e-4)


def test_dinov2_registers_are_prefix_tokens_without_positions():
    case = hf_case("dinov2-registers")
    spec = vitviz.inspect(case.model)
    assert spec.num_prefix_tokens == 4 and not spec.pos_embed_covers_prefix
    table = case.model.embeddings.position_embeddings
    pos = family_of(case.model).pos_embed(case.model)
    torch.testing.assert_close(pos, table[:, 1:])  # the class row dropped; registers have none
    x = torch.randn(1, 3, 40, 24)  # DINOv2 interpolates its table: the grid follows the input
    with torch.no_grad(), vitviz.capture_attention(case.model) as cap:
        case.model(pixel_values=x)
    assert spec.grid_for_input(x) == (5, 3) and cap.attentions[0].shape[-1] == 4 + 15


def test_dinov3_reads_its_rotary_layout_from_the_model_itself():
    """DINOv3's ``base_model_prefix`` names its encoder: the vision root stays the model (the layers are
    ``model.layer.i``); positions are rotary (no table), the registers are prefix tokens, and patches are filled,
    not dropped, since the rotation is laid over the last P tokens of the sequence."""
    case = hf_case("dinov3")
    spec = vitviz.inspect(case.model)
    assert spec.attention_modules == ("model.layer.0.attention", "model.layer.1.attention")
    assert spec.readout.describe(spec.prefix_tokens).startswith("class token")
    family = family_of(case.model)
    assert family.token_drop_module(case.model) is None and "rotary" in family.token_drop_refusal(case.model)
    x64 = torch.randn(1, 3, 40, 64)  # another size: the rotary angles and the grid follow it
    assert vitviz.attention_rollout(case.model, x64).shape == (1, 5, 8)


def test_dinov3_backbone_is_read_like_the_model():
    """``DINOv3ViTBackbone`` (feature maps out) has the model's layout and maps; a class target is refused with the
    callable fix, since its output holds no logits."""
    config = transformers.DINOv3ViTConfig(image_size=32, num_register_tokens=1, out_indices=[2], **SMALL)
    backbone = transformers.DINOv3ViTBackbone(config).eval()
    spec = vitviz.inspect(backbone)
    assert spec.attention_modules == ("model.layer.0.attention", "model.layer.1.attention")
    assert spec.prefix_tokens == ("cls", "reg") and spec.pos_embed_kind == "rotary"
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad(), vitviz.capture_attention(backbone) as cap:
        backbone(pixel_values=x)
    ref = eager_copy(backbone)
    with torch.no_grad():
        want = ref(pixel_values=x, output_attentions=True).attentions
    assert len(cap.attentions) == len(want) == 2
    for got, w in zip(cap.attentions, want):
        assert got.shape == w.shape == (2, 2, 2 + 24, 2 + 24) and float((got - w).abs().max()) <= 1e-5
    with pytest.raises(InputError, match="DINOv3ViTBackbone holds no"):
        vitviz.explain(backbone, x, method="chefer", target=0)


def test_ijepa_has_no_class_token_and_reads_the_patch_mean():
    """I-JEPA: no prefix token, the readout (and the backbone's representation, which has no pooler) is the mean of
    the patch tokens, never the first patch; ImageNet mean and std as in its training code."""
    case = hf_case("ijepa")
    spec = vitviz.inspect(case.model)
    assert spec.num_prefix_tokens == 0 and spec.readout.patch_mean
    backbone = case.model.ijepa
    with torch.no_grad():
        want = backbone(pixel_values=case.x).last_hidden_state.mean(1)
        got = family_of(backbone).pre_logits(backbone, case.x)
    torch.testing.assert_close(got, want)
    assert data_config(case.model)["mean"] == (0.485, 0.456, 0.406)


def test_vit_msn_preprocesses_like_its_checkpoints():
    """Without a preprocessor_config.json, ViTMSN gets the ImageNet mean and std its checkpoints were converted with
    (ViTImageProcessor's class defaults are 0.5)."""
    cfg = data_config(hf_case("vit-msn").model)
    assert (cfg["mean"], cfg["std"]) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def test_vit_mae_refuses_noise_that_reorders_the_patches():
    case = hf_case("vit-mae")
    shuffled = torch.rand(2, 16)
    with pytest.raises(CaptureError, match="ViTMAEModel.*shuffle"), vitviz.capture_attention(case.model):
        case.model(pixel_values=case.x, noise=shuffled)
    assert case.model.config.mask_ratio == 0.75 and instance_forwards(case.model) == 0
    with torch.no_grad(), vitviz.capture_attention(case.model) as cap:  # identity noise is accepted
        case.model(pixel_values=case.x, noise=case.extra["noise"])
    assert cap.attentions[0].shape == (2, 2, 17, 17)


def test_vit_mae_refuses_a_forward_set_on_its_embeddings():
    """vitviz reads ViTMAE unmasked by running the embeddings' class forward with identity noise: a forward the user
    set on the embeddings instance was bypassed for the capture, and the maps were those of a model that does not run
    the user's code."""
    case = hf_case("vit-mae")
    emb = case.model.embeddings
    calls = []

    def own(pixel_values, noise=None, *args, **kwargs):
        calls.append(1)
        return type(emb).forward(emb, pixel_values * 2, noise, *args, **kwargs)

    emb.forward = own
    try:
        with pytest.raises(UnsupportedModelError, match=r"ViTMAEModel: its ViTMAEEmbeddings has a forward of its own set "
                                                        r"on the instance.*del model\.embeddings\.forward"):
            with vitviz.capture_attention(case.model):
                case.model(pixel_values=case.x)
        assert not calls and vars(emb)["forward"] is own and case.model.config.mask_ratio == 0.75
    finally:
        del emb.forward
    with torch.no_grad(), vitviz.capture_attention(case.model) as cap:  # without it, read as before
        case.model(pixel_values=case.x)
    assert cap.attentions[0].shape == (2, 2, 17, 17) and instance_forwards(case.model) == 0


def test_vit_mae_encoder_captured_inside_a_capture_of_its_pre_training_model():
    """The encoder of a ViTMAEForPreTraining prepared twice at once (each model is prepared once): the second sees
    vitviz's own forward on the embeddings, not the user's, and reads the model as the first does."""
    config = transformers.ViTMAEConfig(image_size=32, **SMALL)
    outer = transformers.ViTMAEForPreTraining(config).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), vitviz.capture_attention(outer, layers=[0]), vitviz.capture_attention(outer.vit) as cap:
        out = outer.vit(pixel_values=x)
    assert torch.equal(out.ids_restore[0].long(), torch.arange(16)) and cap.attentions[0].shape[-1] == 17
    assert instance_forwards(outer) == 0 and outer.config.mask_ratio == 0.75


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vit_mae_keeps_patch_order_in_half_precision(dtype):
    # 48x48 patches: bfloat16 (> 256) and float16 (> 2048) both round consecutive integers to ties, so an arange
    # noise in the model's dtype would be argsorted into a shuffle
    config = transformers.ViTMAEConfig(image_size=192, patch_size=4, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32, attn_implementation="eager")
    model = transformers.ViTMAEModel(config).eval().to(dtype)
    x = torch.randn(1, 3, 192, 192, dtype=dtype)
    p = 48 * 48
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        out = model(pixel_values=x)
    assert torch.equal(out.ids_restore[0].long(), torch.arange(p))
    model.config.mask_ratio = 0.0  # the reference: the model's own eager weights, patches in order (exact noise)
    with torch.no_grad():
        ref = model(pixel_values=x, noise=torch.arange(p, dtype=torch.float64)[None], output_attentions=True)
    assert torch.equal(out.last_hidden_state, ref.last_hidden_state)
    assert torch.equal(cap.attentions[0], ref.attentions[0]) and cap.attentions[0].shape[-1] == 1 + p


@pytest.mark.parametrize("name", ["clip-model", "chinese-clip-model", "aimv2-model"])
def test_clip_model_analyses_the_vision_tower_and_refuses_pixels_in_forward(name):
    case = hf_case(name)
    model = case.model
    cls = type(model).__name__
    spec = vitviz.inspect(model)
    assert all(n.startswith("vision_model.") for n in spec.attention_modules)
    assert spec.params["other"] == sum(p.numel() for n, p in model.named_parameters()
                                       if not n.startswith("vision_model."))
    with pytest.raises(InputError, match=rf"{cls}\.forward takes input_ids.*model\.vision_model"):
        vitviz.attention_rollout(model, case.x)
    assert instance_forwards(model) == 0 and attn_impls(model) == ("sdpa", "sdpa")
    with pytest.raises(UnsupportedModelError, match=r"AttnLRP is not available.*image-text.*model\.vision_model"):
        vitviz.attnlrp(model, case.x, target=0)
    ids = torch.tensor([[0, 5, 6, 1]])
    with torch.no_grad(), vitviz.capture_attention(model) as cap:  # a real image-text call passes through
        model(input_ids=ids, pixel_values=case.x)
    torch.testing.assert_close(cap.attentions[0], case.reference(model, case.x)[0], atol=1e-5, rtol=0)


def test_capture_restores_the_implementation_when_the_body_raises():
    case = hf_case("beit-relative")
    with pytest.raises(RuntimeError, match="boom"), vitviz.capture_attention(case.model):
        case.run(case.model, case.x)
        raise RuntimeError("boom")
    assert attn_impls(case.model) == ("sdpa", "sdpa") and hooks_everywhere(case.model) == 0


def test_other_hugging_face_image_models_are_refused_with_the_reason():
    swin = transformers.SwinModel(transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                          num_heads=[1, 2], window_size=4))
    with pytest.raises(UnsupportedModelError, match=r"SwinModel.*model_type='swin'.*not a model vitviz reads"):
        vitviz.inspect(swin)
    with pytest.raises(UnsupportedModelError, match="SwinModel"), vitviz.capture_attention(swin):
        pass
    siglip2 = transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    with pytest.raises(UnsupportedModelError, match="Siglip2VisionModel"):
        vitviz.inspect(siglip2)


def test_a_layout_that_does_not_check_out_is_refused():
    model = transformers.ViTModel(transformers.ViTConfig(image_size=32, **SMALL))
    model.config.num_hidden_layers = 3  # the config no longer describes the module list
    with pytest.raises(UnsupportedModelError, match=r"ViTModel.*2 attention modules.*num_hidden_layers=3"):
        vitviz.inspect(model)


def _auto_configs():
    T = transformers
    vision = dict(image_size=32, **SMALL)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99)
    dino = {k: v for k, v in vision.items() if k != "intermediate_size"}
    return {
        "ViTConfig": T.ViTConfig(**vision), "DeiTConfig": T.DeiTConfig(**vision),
        "BeitConfig": T.BeitConfig(use_relative_position_bias=True, **vision), "Dinov2Config": T.Dinov2Config(**dino),
        "Dinov2WithRegistersConfig": T.Dinov2WithRegistersConfig(**dino), "CLIPVisionConfig": T.CLIPVisionConfig(**vision),
        "CLIPConfig": T.CLIPConfig(vision_config=vision, text_config=text, projection_dim=16),
        "SiglipVisionConfig": T.SiglipVisionConfig(**vision),
        "SiglipConfig": T.SiglipConfig(vision_config=vision, text_config=text), "ViTMAEConfig": T.ViTMAEConfig(**vision),
        "MetaClip2Config": T.MetaClip2Config(vision_config=vision, text_config=text, projection_dim=16),
        "ChineseCLIPConfig": T.ChineseCLIPConfig(vision_config=vision, text_config=text, projection_dim=16),
        "Data2VecVisionConfig": T.Data2VecVisionConfig(use_relative_position_bias=True, **vision),
    }


@pytest.mark.parametrize("config_name", ["ViTConfig", "DeiTConfig", "BeitConfig", "Dinov2Config",
                                         "Dinov2WithRegistersConfig", "CLIPVisionConfig", "CLIPConfig",
                                         "SiglipVisionConfig", "SiglipConfig", "ViTMAEConfig", "MetaClip2Config",
                                         "ChineseCLIPConfig", "Data2VecVisionConfig"])
def test_whatever_auto_model_returns_is_read_exactly(config_name):
    model = transformers.AutoModel.from_config(_auto_configs()[config_name]).eval()
    spec = vitviz.inspect(model)
    vision = model.vision_model if hasattr(model, "vision_model") else model
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        vision(pixel_values=x)
    ref = eager_rebuilt(model) if config_name == "Data2VecVisionConfig" else eager_copy(model)
    ref_vision = ref.vision_model if hasattr(ref, "vision_model") else ref
    if config_name == "ViTMAEConfig":
        ref.config.mask_ratio = 0.0
        kw = {"noise": torch.arange(16.0).expand(2, 16)}
    else:
        kw = {}
    with torch.no_grad():
        want = ref_vision(pixel_values=x, output_attentions=True, **kw).attentions
    assert spec.family == "huggingface" and len(cap.attentions) == len(want) == spec.depth == 2
    for got, w in zip(cap.attentions, want):
        assert got.shape[-1] == spec.num_tokens and float((got - w).abs().max()) <= 1e-5


def test_vit_mae_for_pretraining_reads_the_encoder_only():
    model = transformers.ViTMAEForPreTraining(transformers.ViTMAEConfig(
        image_size=32, decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
        decoder_intermediate_size=32, **SMALL)).eval()
    spec = vitviz.inspect(model)
    assert spec.attention_modules == ("vit.layers.0.attention", "vit.layers.1.attention")
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(pixel_values=torch.randn(1, 3, 32, 32))
    assert cap.attentions[0].shape == (1, 2, 17, 17) and model.config.mask_ratio == 0.75


@pytest.mark.parametrize("close", ["first opened first", "last opened first"])
def test_vit_mae_and_its_encoder_captured_at_once_are_left_as_they_were(close):
    # ViTMAEForPreTraining and its .vit are two models sharing the encoder and the config: each capture unmasks
    # them; however the captures end, the mask ratio and the embeddings' class forward come back
    model = transformers.ViTMAEForPreTraining(transformers.ViTMAEConfig(
        image_size=32, decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
        decoder_intermediate_size=32, **SMALL)).eval()
    x = torch.randn(1, 3, 32, 32)
    captures = [vitviz.capture_attention(model), vitviz.capture_attention(model.vit)]
    caps = [c.__enter__() for c in captures]
    with torch.no_grad():
        model.vit(pixel_values=x)
    assert model.config.mask_ratio == 0.0 and all(len(c.attentions) == 2 for c in caps)
    for c in captures if close == "first opened first" else captures[::-1]:
        c.__exit__(None, None, None)
    assert model.config.mask_ratio == 0.75 and model.vit.config.mask_ratio == 0.75
    assert instance_forwards(model) == 0 and hooks_everywhere(model) == 0
    with torch.no_grad():  # masking again: 25% of the 16 patches kept, plus the class token
        assert model.vit(pixel_values=x).last_hidden_state.shape[1] == 5


def test_siglip_model_refuses_pixels_in_forward_like_clip():
    model = transformers.AutoModel.from_config(_auto_configs()["SiglipConfig"]).eval()
    with pytest.raises(InputError, match=r"SiglipModel\.forward takes input_ids"):
        vitviz.mean_attention_distance(model, torch.randn(1, 3, 32, 32))
    assert instance_forwards(model) == 0


def test_training_mode_with_attention_dropout_is_refused():
    model = transformers.ViTModel(transformers.ViTConfig(image_size=32, attention_probs_dropout_prob=0.1, **SMALL))
    with pytest.raises(CaptureError, match=r"ViTModel is in training mode with attention dropout 0.1.*eval"):
        with vitviz.capture_attention(model.train()):
            pass
    assert hooks_everywhere(model) == 0 and model.config._attn_implementation == "sdpa"
    with torch.no_grad(), vitviz.capture_attention(model.eval()) as cap:  # eval mode: no dropout, exact
        model(pixel_values=torch.randn(1, 3, 32, 32))
    torch.testing.assert_close(cap.attentions[0].sum(-1), torch.ones(1, 2, 17))


def test_dinov2_patch_14_on_a_non_square_input():
    config = transformers.Dinov2Config(image_size=28, patch_size=14, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, mlp_ratio=2)
    model = transformers.Dinov2Model(config).eval()
    spec = vitviz.inspect(model)
    x = torch.randn(2, 3, 42, 70)  # 3x5 patches of 14 px; the table (2x2) is interpolated by the model
    assert spec.patch_size == (14, 14) and spec.dynamic_img_size and spec.grid_for_input(x) == (3, 5)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(pixel_values=x)
    with torch.no_grad():
        want = eager_copy(model)(pixel_values=x, output_attentions=True).attentions
    for got, w in zip(cap.attentions, want):
        assert got.shape == (2, 2, 16, 16) and float((got - w).abs().max()) <= 1e-5
    maps = vitviz.attention_rollout(model, x)
    assert maps.shape == (2, 3, 5) and torch.isfinite(maps).all()


@pytest.mark.parametrize("size", [(16, 64), (48, 48)])
def test_interpolate_pos_encoding_to_another_grid_is_refused(size):
    """A ViT called with ``interpolate_pos_encoding=True`` makes the input's grid, not the built one vitviz reads it
    on: refused, naming the call, the two grids and the fix; also where the grids hold as many tokens (16x64 at
    8 px: 2x8, as many as the built 4x4), where ``N`` alone would let the maps through to be read on 4x4. At the
    built size the call is read as any."""
    model = transformers.ViTForImageClassification(transformers.ViTConfig(image_size=32, num_labels=3, **SMALL))
    model.eval()
    gh, gw = size[0] // 8, size[1] // 8
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        with pytest.raises(CaptureError, match=rf"interpolate_pos_encoding=True on a {size[0]}x{size[1]} input, "
                                               rf"whose patch grid is {gh}x{gw}.* built 4x4 grid .*"
                                               rf"config.image_size=\({size[0]}, {size[1]}\)"):
            model(pixel_values=torch.randn(1, 3, *size), interpolate_pos_encoding=True)
        model(pixel_values=torch.randn(1, 3, 32, 32), interpolate_pos_encoding=True)
    with torch.no_grad():
        want = eager_copy(model)(pixel_values=torch.zeros(1, 3, 32, 32), output_attentions=True).attentions
    assert cap.forwards == 1 and cap.attentions[0].shape == want[0].shape == (1, 2, 17, 17)


def test_data2vec_vision_is_read_per_call_whichever_implementation_it_was_built_with():
    """data2vec vision picks its attention class when built (SDPA by default, which returns no weights): the probe
    runs the eager forward per call either way; a caller's own output_attentions=True still gets the weights; the
    model without a pooler reads out the patch mean its use_mean_pooling asks for (there is no final norm)."""
    case = hf_case("data2vec-relative")
    sdpa, x = case.model, case.x
    eager = eager_rebuilt(sdpa)
    family = family_of(sdpa)
    assert type(sdpa.encoder.layer[0].attention.attention).__name__ == "Data2VecVisionSdpaSelfAttention"
    assert family.stream_probe(eager.encoder.layer[0].attention.attention) is None  # eager: weights as they come
    want = case.reference(sdpa, x)
    for model in (sdpa, eager):
        with torch.no_grad(), vitviz.capture_attention(model) as cap:
            out = model(pixel_values=x, output_attentions=True)
        assert instance_forwards(model) == 0 and hooks_everywhere(model) == 0
        for got, theirs, w in zip(cap.attentions, out.attentions, want):
            assert float((got - w).abs().max()) <= 1e-6 and torch.equal(got, theirs)
    torch.testing.assert_close(vitviz.attention_rollout(eager, x), vitviz.attention_rollout(sdpa, x))
    spec = vitviz.inspect(sdpa)
    assert sdpa.pooler is None and spec.readout.how == "mean" and "use_mean_pooling" in spec.readout.source
    with torch.no_grad():
        hidden = sdpa(pixel_values=x).last_hidden_state
        torch.testing.assert_close(family.pre_logits(sdpa, x), hidden[:, 1:].mean(1))
    token = transformers.Data2VecVisionModel(transformers.Data2VecVisionConfig(image_size=32, use_mean_pooling=False,
                                                                               **SMALL))
    assert vitviz.inspect(token).readout.how == "token"  # a final norm and the class token


def test_aimv2_native_position_table_is_the_one_its_embeddings_add():
    """A native AIMv2 builds its sin-cos table for every input; vitviz returns the table the model's own code adds
    at the config's grid (the embeddings' output minus their normed patch projection), and the learned model's
    nn.Embedding rows otherwise."""
    case = hf_case("aimv2-native")
    m, emb = case.model, case.model.embeddings
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        added = emb(x) - emb.rms_norm(emb.patch_embed(x).flatten(2).transpose(1, 2))
    pos = family_of(m).pos_embed(m)
    assert pos.shape == (1, 16, 32)
    torch.testing.assert_close(pos, added, atol=1e-6, rtol=0)
    assert float(pos.std()) > 0.1  # a real table, not zeros
    learned = hf_case("aimv2-vision").model
    table = learned.embeddings.position_embedding.weight[None]
    torch.testing.assert_close(family_of(learned).pos_embed(learned), table)


def test_every_analysis_reads_vit_mae_unmasked_not_only_the_captured_ones():
    """ViTMAE masks 75% of its patches at random on every call; the capture switched that off, but an analysis's own
    forward passes outside one did not: two identical faithfulness calls scored differently (their perturbed passes
    each saw another random quarter of the patches), and features read from the pooled tokens of a random quarter.
    Every analysis call now runs its family's set-up (``core.families.prepared``), undone afterwards."""
    case = hf_case("vit-mae")
    model, x = case.model, case.x
    config = vision_config(model)
    ratio = config.mask_ratio
    assert ratio > 0
    score = lambda out: out.last_hidden_state[:, 0, :3].sum(-1)  # noqa: E731 (the encoder has no classes)
    first = vitviz.faithfulness(model, x, methods=["random"], target=score, steps=0.5, removal="mean")
    again = vitviz.faithfulness(model, x, methods=["random"], target=score, steps=0.5, removal="mean")
    assert first["score"].tolist() == again["score"].tolist()
    from vitviz.core.features import extract_features

    labels = torch.zeros(len(x), dtype=torch.long)
    one = extract_features(model, (x, labels)).feats["pre_logits"]
    two = extract_features(model, (x, labels)).feats["pre_logits"]
    assert torch.equal(one, two)
    with torch.no_grad():
        config.mask_ratio = 0.0  # what the unmasked encoder gives, patch order aside: its class token
        noise = torch.arange(case.grid[0] * case.grid[1], dtype=torch.float32).expand(len(x), -1)
        want = model(x, noise=noise).last_hidden_state[:, 0]
        config.mask_ratio = ratio
    torch.testing.assert_close(one, want)
    assert config.mask_ratio == ratio and "forward" not in vars(family_of(model).embeddings(model))


@pytest.mark.parametrize("heads", ["full", "stream"])
def test_data2vec_vision_with_a_forward_set_on_the_instance_is_refused(heads):
    """data2vec vision's attention is read by running its class's eager forward in place of the instance's (or
    beside its SDPA forward): a forward the user set on the instance (here: the hidden states scaled by 3 before the
    class's forward) was bypassed while captured, the maps and the outputs those of the plain module. Refused,
    naming the model, the module and the fix; nothing is left on the model."""
    import types

    case = hf_case("data2vec-relative")
    model, x = case.model, case.x
    attn = model.encoder.layer[1].attention.attention
    cls_forward = type(attn).forward
    attn.forward = types.MethodType(lambda self, h, *a, **kw: cls_forward(self, h * 3.0, *a, **kw), attn)
    kwargs = dict(on_layer=lambda i, a: None, store=False, heads="stream") if heads == "stream" else {}
    with pytest.raises(vitviz.UnsupportedModelError,
                       match=r"Data2VecVisionModel \(.*\), attention module 'encoder.layer.1.attention.attention': "
                             r"Data2VecVisionSdpaSelfAttention has a forward of its own set on the instance"):
        with torch.no_grad(), vitviz.capture_attention(model, **kwargs):
            model(pixel_values=x)
    assert instance_forwards(model) == 1 and hooks_everywhere(model) == 0
