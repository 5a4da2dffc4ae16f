"""open_clip vision towers: capture equals attention recomputed from each ``nn.MultiheadAttention``'s ``in_proj``,
leaves no trace, and the layout drives rollout, distance, position similarity and the RGB filters."""

from __future__ import annotations

import pytest
import torch
from hf_models import mha_reference, open_clip_model, open_clip_tower
from test_capture import hooks_everywhere, instance_forwards, record_inputs

import vitviz
from vitviz.core.images import data_config
from vitviz.errors import CaptureError, NotAViTError, UnsupportedModelError

open_clip = pytest.importorskip("open_clip")


def towers():
    return {"tower": open_clip_tower(), "clip": open_clip_model(),
            "tower-sincos-avgpool": open_clip_tower(image_size=32, pos_embed_type="sin_cos_2d", pool_type="avg")}


@pytest.mark.parametrize("which", ["tower", "clip", "tower-sincos-avgpool"])
def test_capture_equals_attention_recomputed_from_in_proj(which):
    model = towers()[which]
    visual = getattr(model, "visual", model)
    x = torch.randn(2, 3, *visual.image_size)
    grid = tuple(visual.grid_size)
    n = 1 + grid[0] * grid[1]
    mhas = [b.attn for b in visual.transformer.resblocks]
    with torch.no_grad():
        before = model(x)
        with record_inputs(mhas) as seen, vitviz.capture_attention(model) as cap:
            inside = model(x)
        after = model(x)
    before, inside, after = (o[0] if isinstance(o, tuple) else o for o in (before, inside, after))
    want = mha_reference(mhas, seen)
    assert len(cap.attentions) == 2
    for got, ref in zip(cap.attentions, want):
        assert got.shape == (2, 2, n, n)
        assert float((got - ref).abs().max()) <= 1e-5
        torch.testing.assert_close(got.sum(-1), torch.ones(2, 2, n), atol=1e-5, rtol=0)
    torch.testing.assert_close(inside, before, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0


@pytest.mark.parametrize("which", ["tower", "clip", "tower-sincos-avgpool"])
def test_inspect_and_analyses(which):
    model = towers()[which]
    visual = getattr(model, "visual", model)
    spec = vitviz.inspect(model)
    grid = tuple(visual.grid_size)
    assert (spec.family, spec.prefix_tokens, spec.grid_size, spec.patch_size) == ("open_clip", ("cls",), grid, (8, 8))
    assert spec.pos_embed_kind == ("sincos" if "sincos" in which else "learned") and spec.pos_embed_covers_prefix
    assert (spec.depth, spec.num_heads, spec.embed_dim) == (2, 2, 32)
    prefix = "visual." if which == "clip" else ""
    assert spec.attention_modules == (f"{prefix}transformer.resblocks.0.attn", f"{prefix}transformer.resblocks.1.attn")
    assert spec.params["total"] == sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 3, *spec.img_size)
    maps = vitviz.attention_rollout(model, x)
    assert maps.shape == (2, *grid) and torch.isfinite(maps).all() and (maps >= 0).all()
    dist = vitviz.mean_attention_distance(model, x)
    assert dist.shape == (2, 2) and torch.isfinite(dist).all() and (dist > 0).all()
    sim = vitviz.pos_embed_similarity(model)
    assert sim.shape == (*grid, *grid) and torch.isfinite(sim).all()
    torch.testing.assert_close(sim.reshape(grid[0] * grid[1], -1).diagonal(), torch.ones(grid[0] * grid[1]))
    filters, _ = vitviz.embedding_filters(model)
    assert filters.shape[:2] == (32, 3)
    cfg = data_config(model)
    assert cfg["input_size"] == (3, *spec.img_size) and cfg["mean"] == open_clip.OPENAI_DATASET_MEAN


def test_rollout_matches_a_hand_rollout_of_the_reference_maps():
    model = open_clip_tower()
    x = torch.randn(2, 3, 32, 48)
    mhas = [b.attn for b in model.transformer.resblocks]
    with torch.no_grad(), record_inputs(mhas) as seen:
        model(x)
    r = torch.eye(25).expand(2, 25, 25)
    for a in mha_reference(mhas, seen):
        w = 0.5 * a.mean(dim=1) + 0.5 * torch.eye(25)
        r = w @ r
    torch.testing.assert_close(vitviz.attention_rollout(model, x), r[:, 0, 1:].reshape(2, 4, 6), atol=1e-5, rtol=1e-4)


def test_create_model_config_builds_and_reads():
    model = open_clip.create_model("ViT-S-32", pretrained=None, force_image_size=64).eval()
    vision = open_clip.get_model_config("ViT-S-32")["vision_cfg"]
    spec = vitviz.inspect(model)
    assert (spec.grid_size, spec.depth, spec.embed_dim) == ((2, 2), vision["layers"], vision["width"])
    assert spec.num_heads == vision["width"] // vision.get("head_width", 64)
    assert data_config(model)["interpolation"] == model.visual.preprocess_cfg["interpolation"]
    with torch.no_grad(), vitviz.capture_attention(model, layers=-1) as cap:
        model(torch.randn(1, 3, 64, 64))
    assert cap.attentions[0].shape == (1, spec.num_heads, 5, 5)


def test_unreadable_towers_are_refused():
    custom = open_clip_tower(block_type="custom")
    with pytest.raises(UnsupportedModelError, match=r"VisionTransformer.*CustomResidualAttentionBlock.*block_type"):
        vitviz.inspect(custom)
    dropping = open_clip_tower(patch_dropout=0.5).train()
    with pytest.raises(CaptureError, match="patch_dropout=0.5.*model.eval"), vitviz.capture_attention(dropping):
        pass
    assert hooks_everywhere(dropping) == 0 and instance_forwards(dropping) == 0
    for kw in ({"qk_norm": True}, {"scaled_cosine_attn": True}):
        with pytest.raises(UnsupportedModelError, match="not nn.MultiheadAttention"):
            vitviz.inspect(open_clip_tower(**kw))
    from open_clip.timm_model import TimmModel

    trunk = TimmModel("vit_tiny_patch16_224", embed_dim=16, image_size=32, pretrained=False)
    with pytest.raises(UnsupportedModelError, match=r"TimmModel.*analyse model\.visual\.trunk"):
        vitviz.inspect(trunk)
    resnet = open_clip.create_model("RN50", pretrained=None).visual
    with pytest.raises(NotAViTError, match="ModifiedResNet"):
        vitviz.inspect(resnet)


@pytest.mark.parametrize("recompute", [True, False], ids=["recomputed", "weights"])
def test_stream_capture_equals_the_full_capture(monkeypatch, recompute):
    """``heads="stream"`` (``stream.probe_mha_stream``, as for torchvision): the same maps as the full capture, the
    forward as it was; recomputed where the kernels serve the call (forced here on CPU), weights read otherwise."""
    from vitviz.core.families import stream

    monkeypatch.setattr(stream, "REPROJECT_WITHOUT_KERNEL", recompute)
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    model = open_clip_model()
    x = torch.randn(2, 3, *model.visual.image_size)
    with torch.no_grad():
        plain = model.encode_image(x)
        with vitviz.capture_attention(model) as cap:
            model.encode_image(x)
    got, kinds = {}, []

    def keep(i, hm):
        kinds.append(hm._head.__qualname__)
        got[i] = hm.full().float().clone()

    with torch.no_grad(), vitviz.capture_attention(model, on_layer=keep, store=False, heads="stream"):
        out = model.encode_image(x)
    assert len(got) == 2 and all(("recomputed_heads" in k) == recompute for k in kinds)
    for i, want in enumerate(cap.attentions):
        assert float((got[i] - want).abs().max()) <= 1e-6
    if recompute:
        assert torch.equal(out, plain)
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0
