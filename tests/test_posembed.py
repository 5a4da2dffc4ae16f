"""Position-embedding similarity and locality (vitviz.analysis.posembed), and the paper's Table 8 loader."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

import vitviz
from vitviz.analysis.posembed import (
    grid_distances,
    patch_pos_embed,
    pos_embed_locality,
    pos_embed_similarity,
    sincos_pos_embed,
    sincos_vit,
)
from vitviz.errors import NoPositionEmbeddingError
from vitviz.zoo.paper import locality_table
from vitviz.zoo.reference import build_reference


def tiny_vit(img_size=(32, 48), patch_size=8, **kwargs) -> VisionTransformer:
    """A 1-block ViT; (32, 48) px at patch 8 is a non-square 4x6 grid."""
    kwargs = {"embed_dim": 32, "depth": 1, "num_heads": 2, "num_classes": 0, **kwargs}
    return VisionTransformer(img_size=img_size, patch_size=patch_size, **kwargs).eval()


def reference_similarity(emb: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Independent computation: normalise each row with numpy, then all dot products."""
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    return (unit @ unit.T).reshape(*grid, *grid)


def test_similarity_invariants_on_non_square_grid():
    torch.manual_seed(0)
    model = tiny_vit()
    sim = pos_embed_similarity(model)
    assert sim.shape == (4, 6, 4, 6)
    flat = sim.reshape(24, 24)
    torch.testing.assert_close(flat, flat.T)
    torch.testing.assert_close(torch.diagonal(flat), torch.ones(24))
    assert sim.min() >= -1 and sim.max() <= 1
    assert (flat - torch.eye(24)).abs().max() < 0.9  # a random table is not all alike


def test_similarity_matches_independent_numpy():
    torch.manual_seed(1)
    model = tiny_vit()
    expected = reference_similarity(model.pos_embed[0, 1:].detach().numpy().astype(np.float64), (4, 6))
    np.testing.assert_allclose(pos_embed_similarity(model).numpy(), expected, atol=1e-6)


def test_non_square_grid_is_row_major_not_swapped():
    """Patch (r, c) gets e_r + e_{4+c}: cos = (same row + same column) / 2, so rows and columns are told apart."""
    model = tiny_vit()
    grid = torch.zeros(4, 6, 32)
    for r in range(4):
        for c in range(6):
            grid[r, c, r] = 1.0
            grid[r, c, 4 + c] = 1.0
    with torch.no_grad():
        model.pos_embed[0, 0] = 7.0  # the class token's row must be ignored
        model.pos_embed[0, 1:] = grid.reshape(24, 32)
    sim = pos_embed_similarity(model)
    assert sim.shape == (4, 6, 4, 6)
    r, c = 1, 4
    np.testing.assert_allclose(sim[r, c, r, :].numpy(), [0.5, 0.5, 0.5, 0.5, 1.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(sim[r, c, :, c].numpy(), [0.5, 1.0, 0.5, 0.5], atol=1e-6)
    assert sim[r, c, 0, 0] == pytest.approx(0.0, abs=1e-6)


def test_two_prefix_tokens_deit_distilled():
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", img_size=(48, 64)).eval()
    assert vitviz.inspect(model).prefix_tokens == ("cls", "dist")
    assert model.pos_embed.shape[1] == 2 + 3 * 4
    expected = reference_similarity(model.pos_embed[0, 2:].detach().double().numpy(), (3, 4))
    np.testing.assert_allclose(pos_embed_similarity(model).numpy(), expected, atol=1e-6)


def test_registers_with_no_embed_class_keep_every_row():
    torch.manual_seed(0)
    model = tiny_vit(reg_tokens=4, no_embed_class=True)
    spec = vitviz.inspect(model)
    assert spec.num_prefix_tokens == 5 and not spec.pos_embed_covers_prefix
    assert model.pos_embed.shape[1] == 24  # patches only
    expected = reference_similarity(model.pos_embed[0].detach().double().numpy(), (4, 6))
    np.testing.assert_allclose(pos_embed_similarity(model).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_resampled_size_matches_timm_by_hand(no_embed_class):
    torch.manual_seed(0)
    model = tiny_vit(no_embed_class=no_embed_class)
    sim = pos_embed_similarity(model, img_size=(64, 80))
    assert sim.shape == (8, 10, 8, 10)
    prefix = 0 if no_embed_class else 1
    resampled = resample_abs_pos_embed(model.pos_embed.detach(), new_size=[8, 10], old_size=[4, 6],
                                       num_prefix_tokens=prefix)
    expected = reference_similarity(resampled[0, prefix:].double().numpy(), (8, 10))
    np.testing.assert_allclose(sim.numpy(), expected, atol=1e-5)
    assert pos_embed_similarity(model, img_size=40).shape == (5, 5, 5, 5)  # int size: square


def added_table(model, embeddings: nn.Module, img_size) -> torch.Tensor:
    """The ``(P, D)`` position rows the model's own embeddings add to the patch tokens of a blank ``img_size``
    input (run, not derived): the patch projection's output replaced by zeros, the last ``P`` tokens read."""
    proj = vitviz.core.families.family_of(model).patch_proj(model)
    handle = proj.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))
    try:
        with torch.no_grad():
            out = embeddings(torch.zeros(1, 3, *img_size))
    finally:
        handle.remove()
    out = out[0] if isinstance(out, tuple) else out
    gh, gw = vitviz.inspect(model).grid_for(img_size)
    return out[0, -gh * gw:].float()


# Hugging Face models that run at another size through their embeddings' interpolate_pos_encoding
HF_INTERPOLATING = {
    "hf-vit": ("ViTModel", "ViTConfig", {}),
    "hf-vit-msn": ("ViTMSNModel", "ViTMSNConfig", {}),
    "hf-ijepa": ("IJepaModel", "IJepaConfig", {}),
    "hf-deit": ("DeiTModel", "DeiTConfig", {}),
    "hf-clip": ("CLIPVisionModel", "CLIPVisionConfig", {}),
    "hf-siglip": ("SiglipVisionModel", "SiglipVisionConfig", {}),
    "hf-vit-mae": ("ViTMAEModel", "ViTMAEConfig", {"mask_ratio": 0.0}),
    "hf-beit": ("BeitModel", "BeitConfig", {"use_absolute_position_embeddings": True}),
}


def model_own_resampling(name):
    """Models that make their table for another input size their own way, with the module that adds it."""
    import transformers as T
    from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg

    small = dict(patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    if name == "hf-dinov2":  # bicubic without antialiasing (timm's resampling antialiases)
        m = T.Dinov2Model(T.Dinov2Config(image_size=32, **small))
    elif name == "hf-dinov2-registers":
        m = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(image_size=32, num_register_tokens=2, **small))
    elif name in HF_INTERPOLATING:  # interpolate_pos_encoding=True on the call: bicubic without antialiasing
        model_cls, config_cls, extra = HF_INTERPOLATING[name]
        m = getattr(T, model_cls)(getattr(T, config_cls)(image_size=32, **extra, **small)).eval()
        with torch.no_grad():
            table = vitviz.core.families.family_of(m).pos_embed(m)
            table.copy_(torch.randn_like(table))  # some are built as zeros or a fixed sin-cos table
        if name == "hf-vit-mae":  # patches in their own order (MAE shuffles them with the noise)
            return m, lambda x: m.embeddings(x, noise=torch.arange(
                (x.shape[-2] // 8) * (x.shape[-1] // 8), dtype=torch.float32)[None], interpolate_pos_encoding=True)
        if name == "hf-beit":  # BEiT's embeddings always interpolate their absolute table
            return m, m.embeddings
        return m, lambda x: m.embeddings(x, interpolate_pos_encoding=True)
    elif name == "hf-aimv2-native":  # a sin-cos table built for the grid
        m = T.Aimv2VisionModel(T.Aimv2VisionConfig(image_size=32, is_native=True, **small))
    else:  # row and column tables resampled apart, then summed
        cfg = NaFlexVitCfg(patch_size=8, embed_dim=32, depth=1, num_heads=2, pos_embed="factorized",
                           pos_embed_grid_size=(4, 4))
        m = NaFlexVit(cfg, num_classes=0, img_size=32)
        return m.eval(), m.embeds
    if name.startswith("hf-dinov2"):  # built from a config, the table may start at zeros: give it random values
        with torch.no_grad():
            m.embeddings.position_embeddings.normal_()
    return m.eval(), m.embeddings


@pytest.mark.parametrize("name", ["hf-dinov2", "hf-dinov2-registers", "hf-aimv2-native", "timm-naflex-factorized",
                                  *HF_INTERPOLATING])
@pytest.mark.parametrize("img_size", [(16, 24), (48, 48), (24, 40)])
def test_resampled_table_is_the_one_the_model_adds_at_that_size(name, img_size):
    """``img_size=`` gives the table the model itself adds to an input of that size, for models that make it
    their own way (``Family.pos_embed_at``); timm's resampling of the stored table differs from theirs (here by
    10-40% of the table's scale, the cosine similarities by up to 0.47)."""
    torch.manual_seed(0)
    model, embeddings = model_own_resampling(name)
    expected = added_table(model, embeddings, img_size)
    emb, grid = patch_pos_embed(model, img_size=img_size)
    assert grid == (img_size[0] // 8, img_size[1] // 8)
    torch.testing.assert_close(emb, expected, atol=1e-6, rtol=1e-5)
    sim = pos_embed_similarity(model, img_size=img_size)
    np.testing.assert_allclose(sim.numpy(), reference_similarity(expected.double().numpy(), grid), atol=1e-5)


def test_a_non_square_hugging_face_vit_has_no_table_at_another_size():
    """Hugging Face's interpolate_pos_encoding reads the stored table as a square grid: a ViT built for 4x6
    patches cannot run at another size, so no table is made up for one; at its own size the table is read."""
    import transformers as T

    small = dict(patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    m = T.ViTModel(T.ViTConfig(image_size=(32, 48), **small)).eval()
    assert pos_embed_similarity(m).shape == (4, 6, 4, 6)
    with pytest.raises(vitviz.errors.InputError, match=r"img_size: ViTModel is built for a 4x6 grid.*cannot run at "
                                                       r"another size.*config.image_size"):
        pos_embed_similarity(m, img_size=(48, 48))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_table_that_is_not_finite_is_refused(bad):
    """One NaN row made the whole similarity table NaN and locality NaN, the value a flat table gets."""
    model = tiny_vit()
    with torch.no_grad():
        model.pos_embed[0, 3, 5] = bad
    for call in (pos_embed_similarity, pos_embed_locality, patch_pos_embed):
        with pytest.raises(vitviz.errors.InputError, match=r"hold [01] NaN and [01] infinite values.*checkpoint"):
            call(model)
    with pytest.raises(vitviz.errors.InputError, match="NaN"):
        pos_embed_similarity(model.pos_embed.detach(), grid_size=(4, 6))


def tokens_grid(model, img_size) -> tuple[int, int]:
    """The (gh, gw) grid the model's own patch embedding makes from an input of img_size (run, not derived)."""
    pe = model.patch_embed
    with torch.no_grad():
        x = torch.zeros(1, 3, *img_size)
        feats = pe.backbone(x) if hasattr(pe, "backbone") else x
        feats = feats[-1] if isinstance(feats, (list, tuple)) else feats
        return tuple(pe.proj(feats).shape[-2:])


@pytest.mark.parametrize("name", ["cifar10-hybrid", "vit_tiny_r_s16_p8_224"])
def test_resampled_grid_is_the_hybrids_own_or_refused(name):
    """A hybrid's backbone rounds sizes its own way (cifar10-hybrid's padded stride-2 convs round up), so
    ``img_size // stride`` is its grid only for multiples of the token stride; other sizes are refused, as
    images of those sizes are."""
    torch.manual_seed(0)
    model = (build_reference(name) if name.startswith("cifar10") else
             timm.create_model(name, pretrained=False, img_size=(64, 96), depth=1)).eval()
    spec = vitviz.inspect(model)
    sh, sw = spec.patch_size
    size = (9 * sh, 5 * sw)  # a multiple: the model's own grid, resampled as timm does
    grid = tokens_grid(model, size)
    sim = pos_embed_similarity(model, img_size=size)
    assert sim.shape == (*grid, *grid)
    resampled = resample_abs_pos_embed(model.pos_embed.detach(), new_size=list(grid),
                                       old_size=list(spec.grid_size), num_prefix_tokens=1)
    np.testing.assert_allclose(sim.numpy(), reference_similarity(resampled[0, 1:].double().numpy(), grid),
                               atol=1e-5)
    odd = (9 * sh + sh // 2 + 1, 5 * sw)
    assert tokens_grid(model, odd) != spec.grid_for(odd) or name != "cifar10-hybrid"
    for call in (pos_embed_similarity, pos_embed_locality, patch_pos_embed):
        with pytest.raises(vitviz.errors.InputError, match="multiple of the"):
            call(model, img_size=odd)


def test_tensor_input_needs_grid_and_checks_rows():
    torch.manual_seed(0)
    pos = torch.randn(1, 1 + 12, 16)
    with pytest.raises(ValueError, match="grid_size"):
        pos_embed_similarity(pos)
    with pytest.raises(ValueError, match="13 rows"):
        pos_embed_similarity(pos, grid_size=(3, 4), num_prefix_tokens=0)
    sim = pos_embed_similarity(pos, grid_size=(3, 4), num_prefix_tokens=1)
    expected = reference_similarity(pos[0, 1:].double().numpy(), (3, 4))
    np.testing.assert_allclose(sim.numpy(), expected, atol=1e-6)
    torch.testing.assert_close(pos_embed_similarity(pos[0], grid_size=(3, 4)), sim)  # default: L - gh*gw rows
    with pytest.raises(ValueError, match="img_size"):
        pos_embed_similarity(pos, grid_size=(3, 4), img_size=64)
    with pytest.raises(ValueError, match="read from the model"):
        pos_embed_similarity(tiny_vit(), grid_size=(4, 6))


def test_learned_2d_reference_model():
    """cifar10-vit-2dpos: patches in one row share half of the embedding, so same-row similarity is higher."""
    torch.manual_seed(0)
    model = build_reference("cifar10-vit-2dpos")
    emb, grid = patch_pos_embed(model)
    assert grid == (8, 8) and emb.shape == (64, 96)
    sim = pos_embed_similarity(model)
    same_row = sim[2, 3, 2, torch.arange(8) != 3].mean()
    other = sim[2, 3][torch.arange(8) != 2][:, torch.arange(8) != 3].mean()
    assert same_row > other + 0.3


def test_grid_distances():
    d = grid_distances((4, 6))
    assert d.shape == (4, 6, 4, 6)
    assert d[0, 0, 3, 4] == pytest.approx(5.0)
    assert d[2, 1, 2, 5] == pytest.approx(4.0)
    torch.testing.assert_close(d.reshape(24, 24), d.reshape(24, 24).T)


def test_locality_is_one_for_similarity_falling_with_distance():
    theta = 0.25 * torch.arange(6, dtype=torch.float64)  # a 1x6 strip; cos sim = cos(0.25 |i - j|)
    pos = torch.stack([theta.cos(), theta.sin()], dim=-1)
    assert pos_embed_locality(pos, grid_size=(1, 6)) == pytest.approx(1.0)
    assert pos_embed_locality(pos.flip(0)[[0, 2, 4, 1, 3, 5]], grid_size=(1, 6)) < 0.5


def test_locality_sincos_near_one_random_near_zero():
    sincos = sincos_vit("vit_tiny_patch16_224", img_size=128, depth=1)  # 8x8 grid, D = 192
    spec = vitviz.inspect(sincos)
    assert spec.pos_embed_kind == "sincos" and spec.grid_size == (8, 8)
    assert not sincos.pos_embed.requires_grad
    assert torch.count_nonzero(sincos.pos_embed[0, 0]) == 0  # the class token's row is zero
    assert pos_embed_locality(sincos) > 0.7
    assert pos_embed_locality(sincos_pos_embed((8, 8), 64), grid_size=(8, 8)) > 0.7

    torch.manual_seed(0)
    random = tiny_vit(img_size=64, embed_dim=64)  # 8x8 grid, timm's trunc-normal init
    assert abs(pos_embed_locality(random)) < 0.2


def test_models_without_position_embedding_raise():
    nopos = build_reference("cifar10-vit-nopos")
    with pytest.raises(NoPositionEmbeddingError, match="cifar10-vit-nopos"):
        pos_embed_similarity(nopos)
    with pytest.raises(vitviz.VitvizError, match="no absolute position embedding"):
        pos_embed_locality(tiny_vit(pos_embed="none"))


def test_not_a_vit_raises():
    with pytest.raises(vitviz.NotAViTError):
        pos_embed_similarity(nn.Sequential(nn.Conv2d(3, 8, 3)))


def test_paper_table8_and_locality_table():
    from vitviz.zoo.paper import posemb_ablation

    table = posemb_ablation()
    assert list(table["pos_emb"]) == ["No Pos. Emb.", "1-D Pos. Emb.", "2-D Pos. Emb.", "Rel. Pos. Emb."]
    assert table.loc[0, "default_stem"] == pytest.approx(0.61382)
    assert math.isnan(table.loc[0, "every_layer"])

    torch.manual_seed(0)
    out = locality_table({"learned": tiny_vit(), "none": tiny_vit(pos_embed="none"),
                          "sincos": sincos_vit("vit_tiny_patch16_224", img_size=64, depth=1)})
    assert list(out["pos_embed_kind"]) == ["learned", "none", "sincos"]
    assert out.loc[0, "grid"] == "4x6" and out.loc[0, "paper_5shot"] == pytest.approx(0.64206)
    assert math.isnan(out.loc[1, "locality"]) and out.loc[1, "paper_5shot"] == pytest.approx(0.61382)
    assert pd.isna(out.loc[2, "paper_row"]) and math.isnan(out.loc[2, "paper_5shot"])
    assert out.loc[2, "locality"] > 0.5


def test_import_vitviz_does_not_import_matplotlib():
    code = ("import sys, vitviz; vitviz.pos_embed_similarity; vitviz.filter_pca; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'; "
            "assert callable(vitviz.plot_pos_embed) and 'matplotlib' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("bad", [1.0, "1", True])
def test_a_prefix_count_that_is_not_an_int_is_refused_naming_it(bad):
    """``num_prefix_tokens=1.0`` raised slicing's TypeError and ``"1"`` a comparison's; a bool is no count. Refused,
    naming the argument; the int 1 gives the similarity of the rows after the first."""
    pos = torch.randn(1, 1 + 12, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=rf"num_prefix_tokens={bad!r}.*int >= 0"):
        pos_embed_similarity(pos, grid_size=(3, 4), num_prefix_tokens=bad)
    np.testing.assert_allclose(pos_embed_similarity(pos, grid_size=(3, 4), num_prefix_tokens=1).numpy(),
                               reference_similarity(pos[0, 1:].double().numpy(), (3, 4)), atol=1e-6)
