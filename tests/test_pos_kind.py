"""The position-embedding kind is read from what the table is, never from ``requires_grad``."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit
from timm.layers import build_sincos2d_pos_embed
from tutorial_vit import TutorialViT

import vitviz
from vitviz.core.families.pos_kind import is_sincos_table, table_kind


@pytest.mark.parametrize("make", [tiny_timm_vit, lambda: TutorialViT()], ids=["timm", "tutorial"])
def test_freezing_keeps_a_learned_table_learned(make):
    model = make()
    assert vitviz.inspect(model).pos_embed_kind == "learned"
    model.requires_grad_(False)
    spec = vitviz.inspect(model)
    assert spec.pos_embed_kind == "learned" and spec.has_abs_pos_embed
    assert not model.pos_embed.requires_grad


def test_frozen_model_stays_in_the_locality_table():
    model = tiny_timm_vit().requires_grad_(False)
    from vitviz.zoo.paper import locality_table

    row = locality_table({"frozen": model}).iloc[0]
    assert row["pos_embed_kind"] == "learned" and row["paper_row"] == "1-D Pos. Emb."


@pytest.mark.parametrize("as_buffer", [True, False], ids=["buffer", "parameter"])
@pytest.mark.parametrize("trainable", [True, False])
def test_a_sincos_table_is_sincos_however_it_is_stored(as_buffer, trainable):
    model = tiny_timm_vit(class_token=False, global_pool="avg", no_embed_class=True)
    table = build_sincos2d_pos_embed((4, 6), 32).unsqueeze(0)
    del model.pos_embed
    if as_buffer:
        model.register_buffer("pos_embed", table)
    else:
        model.pos_embed = torch.nn.Parameter(table, requires_grad=trainable)
    assert vitviz.inspect(model).pos_embed_kind == "sincos"


def test_sincos_detection_ignores_column_order_but_not_values():
    table = build_sincos2d_pos_embed((4, 6), 32)
    assert is_sincos_table(table[:, torch.randperm(32)], (4, 6))  # sin/cos and h/w halves in another order
    assert not is_sincos_table(table[torch.randperm(24)], (4, 6))  # rows no longer follow the grid
    assert not is_sincos_table(table + 0.01 * torch.randn_like(table), (4, 6))  # trained away from sincos
    assert not is_sincos_table(table, (6, 4))  # the same rows on the transposed grid


def test_a_buffer_that_is_not_sincos_is_fixed():
    buf = torch.randn(1, 24, 32)
    assert table_kind(buf, (4, 6), 0) == "fixed"
    assert table_kind(torch.nn.Parameter(buf.clone()), (4, 6), 0) == "learned"


def test_with_sincos_pos_embed_is_reported_as_sincos():
    from vitviz.analysis.posembed import with_sincos_pos_embed

    model = with_sincos_pos_embed(tiny_timm_vit())
    assert vitviz.inspect(model).pos_embed_kind == "sincos"
    model.requires_grad_(True)  # unfreezing does not make the sincos values learned
    assert vitviz.inspect(model).pos_embed_kind == "sincos"


def test_open_clip_kind_is_read_from_the_table_not_requires_grad():
    pytest.importorskip("open_clip")
    from hf_models import open_clip_model, open_clip_tower

    learned = open_clip_model().requires_grad_(False)  # a learned table, frozen
    assert vitviz.inspect(learned).pos_embed_kind == "learned"
    sincos = open_clip_tower(image_size=32, pos_embed_type="sin_cos_2d").requires_grad_(True)  # sincos, trainable
    assert sincos.positional_embedding.requires_grad
    assert vitviz.inspect(sincos).pos_embed_kind == "sincos"


def test_timm_kinds_join_an_absolute_table_with_rotary_or_a_relative_bias_as_hugging_face_does():
    import timm

    transformers = pytest.importorskip("transformers")

    def timm_kind(name, **kw):
        return vitviz.inspect(timm.create_model(name, pretrained=False, img_size=32, depth=1, **kw)).pos_embed_kind

    beit = dict(embed_dim=64, num_heads=2)
    assert timm_kind("beit_base_patch16_224", use_abs_pos_emb=True, use_rel_pos_bias=True, **beit) == (
        "learned+relative-bias")
    assert timm_kind("beit_base_patch16_224", use_abs_pos_emb=True, use_rel_pos_bias=False, **beit) == "learned"
    assert timm_kind("beit_base_patch16_224", **beit) == "relative-bias"
    assert timm_kind("eva02_tiny_patch14_224") == "learned+rotary"
    assert timm_kind("vit_medium_patch16_rope_reg1_gap_256") == "rotary"
    hf = transformers.BeitModel(transformers.BeitConfig(
        image_size=32, patch_size=16, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        use_absolute_position_embeddings=True, use_relative_position_bias=True))
    assert vitviz.inspect(hf).pos_embed_kind == "learned+relative-bias"
    spec = vitviz.inspect(timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=32, depth=1))
    assert spec.has_abs_pos_embed  # the table is still there for pos_embed_similarity
