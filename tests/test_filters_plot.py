"""RGB embedding filters (vitviz.analysis.filters), the position-embedding and filter figures, save_figure, notebook 01."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402
from torch import nn  # noqa: E402

import vitviz  # noqa: E402
from vitviz.analysis.filters import embedding_filters, filter_pca
from vitviz.errors import NoRGBFiltersError
from vitviz.plot.filters import filters_to_rgb
from vitviz.zoo.reference import build_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tiny_vit(img_size=(32, 48), patch_size=8, **kwargs) -> VisionTransformer:
    kwargs = {"embed_dim": 32, "depth": 1, "num_heads": 2, "num_classes": 0, **kwargs}
    return VisionTransformer(img_size=img_size, patch_size=patch_size, **kwargs).eval()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def colorbars(fig) -> list:
    """The "Cosine similarity" colorbars of ``fig``, also those drawn as an inset of their image's axes."""
    axes = [a for ax in fig.axes for a in (ax, *ax.child_axes)]
    return [ax for ax in axes if ax.get_ylabel() == "Cosine similarity"]


# ---- filters ---------------------------------------------------------------------------------------------------

def test_embedding_filters_plain_vit_is_the_patch_projection():
    model = tiny_vit()
    weights, source = embedding_filters(model)
    assert source == "patch_embed.proj"
    assert weights.shape == (32, 3, 8, 8)
    torch.testing.assert_close(weights, model.patch_embed.proj.weight.detach())


def test_embedding_filters_hybrid_uses_backbone_stem_conv():
    model = build_reference("cifar10-hybrid")
    assert vitviz.inspect(model).hybrid
    weights, source = embedding_filters(model)
    stem = model.patch_embed.backbone[0][0]
    assert isinstance(stem, nn.Conv2d) and stem.in_channels == 3
    assert source == "patch_embed.backbone.0.0"
    torch.testing.assert_close(weights, stem.weight.detach())
    assert model.patch_embed.proj.kernel_size == (1, 1)  # the "patch" projection itself is not RGB


def test_filter_pca_matches_numpy_svd():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(40, 3, 4, 4)) * np.linspace(3, 0.1, 48).reshape(1, 3, 4, 4)
    comps, ratio = filter_pca(torch.tensor(w, dtype=torch.float32), n_components=28)
    assert comps.shape == (28, 3, 4, 4) and ratio.shape == (28,)
    x = w.reshape(40, -1) - w.reshape(40, -1).mean(axis=0)
    _u, s, vh = np.linalg.svd(x, full_matrices=False)
    flat = comps.reshape(28, -1).double().numpy()
    np.testing.assert_allclose(np.abs(np.sum(flat * vh[:28], axis=1)), 1.0, atol=1e-4)  # equal up to sign
    np.testing.assert_allclose(ratio.numpy(), (s**2 / np.sum(s**2))[:28], rtol=1e-4)
    assert np.all(np.diff(ratio.numpy()) <= 1e-7)
    peak = flat[np.arange(28), np.abs(flat).argmax(axis=1)]
    assert np.all(peak > 0)  # deterministic sign


def test_filter_pca_caps_components_and_rejects_bad_input():
    comps, ratio = filter_pca(torch.randn(5, 3, 2, 2), n_components=28)
    assert comps.shape[0] == 4 and ratio.sum() == pytest.approx(1.0, abs=1e-5)  # 5 centred filters: rank 4
    with pytest.raises(ValueError, match="two filters"):
        filter_pca(torch.randn(1, 3, 2, 2))
    with pytest.raises(ValueError, match="C_out, C_in, kh, kw"):
        filter_pca(torch.randn(5, 12))


def test_no_rgb_conv_and_non_vit_raise():
    with pytest.raises(NoRGBFiltersError, match="input channels"):
        embedding_filters(tiny_vit(in_chans=1))
    with pytest.raises(vitviz.NotAViTError):
        embedding_filters(nn.Sequential(nn.Conv2d(3, 8, 3)))
    with pytest.raises(vitviz.NotAViTError):
        vitviz.plot_pos_embed(nn.Sequential(nn.Conv2d(3, 8, 3)))


# ---- position-embedding figures --------------------------------------------------------------------------------

def test_plot_pos_embed_non_square_mosaic_labels_and_colorbar():
    torch.manual_seed(0)
    model = tiny_vit()  # 4x6 grid
    ax = vitviz.plot_pos_embed(model)
    fig = ax.figure
    assert fig.axes[0] is ax
    assert ax.get_xlabel() == "Input patch column" and ax.get_ylabel() == "Input patch row"
    cbars = colorbars(fig)
    assert len(cbars) == 1 and fig.axes == [ax] and ax.child_axes == cbars  # the colorbar: an inset of the mosaic
    (im,) = ax.images
    assert im.get_clim() == (-1.0, 1.0)
    mosaic = np.ma.filled(im.get_array(), np.nan)
    gap = 1
    assert mosaic.shape == (4 * 4 + 3 * gap, 6 * 6 + 5 * gap)  # 4 rows of 4x6 tiles, 6 columns of them
    sim = vitviz.pos_embed_similarity(model).numpy()
    y, x = 2 * (4 + gap), 5 * (6 + gap)
    np.testing.assert_allclose(mosaic[y:y + 4, x:x + 6], sim[2, 5])  # tile (r=2, c=5)
    assert np.isnan(mosaic[4, :]).all() and np.isnan(mosaic[:, 6]).all()  # gaps
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4", "5", "6"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "3", "4"]
    np.testing.assert_allclose(ax.get_xticks(), np.arange(6) * 7 + 2.5)  # tile centres
    assert "VisionTransformer" in ax.get_title() and "4x6 grid" in ax.get_title()


def test_plot_pos_embed_large_grid_is_subsampled_and_says_so():
    torch.manual_seed(0)
    model = tiny_vit(img_size=24 * 4, patch_size=4)  # 24x24 grid
    ax = vitviz.plot_pos_embed(model, max_tiles=16)
    fig = ax.figure
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == [str(i) for i in range(1, 25, 2)]  # every 2nd: 12 tiles
    gap = round(24 / 7)
    assert ax.images[0].get_array().shape == (12 * 24 + 11 * gap,) * 2
    assert "every 2nd row and column" in ax.get_title()
    assert len(colorbars(fig)) == 1


def test_plot_pos_embed_resampled_and_custom_title():
    torch.manual_seed(0)
    ax = vitviz.plot_pos_embed(tiny_vit(), img_size=(64, 80), title="mine")
    assert ax.get_title() == "mine"
    assert ax.images[0].get_array().shape == (8 * 8 + 7, 10 * 10 + 9)
    ax2 = vitviz.plot_pos_embed(tiny_vit(), img_size=(64, 80))
    assert "8x10 grid, resampled from 4x6" in ax2.get_title()


def test_plot_pos_embed_similarity_single_patch():
    torch.manual_seed(0)
    sim = vitviz.pos_embed_similarity(tiny_vit())
    ax = vitviz.plot_pos_embed_similarity(sim, query=(1, 4))
    np.testing.assert_allclose(ax.images[0].get_array(), sim[1, 4].numpy())
    assert ax.get_xlabel() == "Input patch column" and ax.get_ylabel() == "Input patch row"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4", "5", "6"]
    (marker,) = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert marker.get_xy() == (3.5, 0.5)  # column 4, row 1 (zero-based)
    assert len(colorbars(ax.figure)) == 1
    _fig, ax2 = plt.subplots()
    assert vitviz.plot_pos_embed_similarity(sim, (0, 0), ax=ax2, colorbar=False) is ax2
    _fig, ax3 = plt.subplots()
    assert vitviz.plot_pos_embed(tiny_vit(), ax=ax3) is ax3
    assert len(ax2.figure.axes) == 1
    with pytest.raises(IndexError, match="outside the 4x6 grid"):
        vitviz.plot_pos_embed_similarity(sim, query=(4, 0))


def test_plot_pos_embed_similarity_refuses_what_is_no_cosine():
    """On the fixed [-1, 1] scale, dot products were drawn in the end colours and a NaN as the axes background,
    under a colorbar that said "Cosine similarity"."""
    torch.manual_seed(0)
    sim = vitviz.pos_embed_similarity(tiny_vit()).numpy()
    dots = sim * 3.0
    with pytest.raises(vitviz.InputError, match=r"sim holds \d+ values that are no cosine similarity .*the first at "
                                                r"\(0, 0, 0, 0\): 3.0"):
        vitviz.plot_pos_embed_similarity(dots)
    holed = sim.copy()
    holed[1, 2, 0, 3] = np.nan
    with pytest.raises(vitviz.InputError, match=r"sim holds 1 values .*\(1, 2, 0, 3\): nan"):
        vitviz.plot_pos_embed_similarity(holed, query=(0, 0))
    rounded = np.clip(sim * (1 + 1e-6), -1 - 5e-5, 1 + 5e-5)  # float32 rounding past 1 is still a cosine
    ax = vitviz.plot_pos_embed_similarity(rounded, query=(1, 4))
    np.testing.assert_allclose(ax.images[0].get_array(), rounded[1, 4])
    assert ax.images[0].norm.vmin == -1.0 and ax.images[0].norm.vmax == 1.0


def test_plot_embedding_filters_tiles_and_titles():
    torch.manual_seed(0)
    model = tiny_vit()  # 32 filters of 3x8x8
    ax = vitviz.plot_embedding_filters(model)
    assert len(ax.figure.axes) == 1 and len(ax.images) == 1
    assert ax.get_title() == "RGB embedding filters (first 28 principal components)"
    mosaic = np.asarray(ax.images[0].get_array())
    assert mosaic.shape == (4 * 8 + 3, 7 * 8 + 6, 4)  # 4 rows x 7 columns of 8x8 tiles, 1-pixel gaps
    tiles = filters_to_rgb(vitviz.filter_pca(vitviz.embedding_filters(model)[0], 28)[0])
    r, c = divmod(9, 7)  # the 10th component: row 2, column 3
    np.testing.assert_allclose(mosaic[r * 9:r * 9 + 8, c * 9:c * 9 + 8, :3], tiles[9])
    assert (mosaic[8, :, 3] == 0).all() and (mosaic[:, 8, 3] == 0).all()  # transparent gaps
    first = mosaic[:8, :8, :3]
    assert first.min() == pytest.approx(0.0) and first.max() == pytest.approx(1.0)

    hybrid = vitviz.plot_embedding_filters(build_reference("cifar10-hybrid"))  # 32 filters of 3x3x3: 27 comps
    assert hybrid.images[0].get_array().shape[:2] == (4 * 3 + 3, 7 * 3 + 6)  # 27 tiles in 4 rows of 7
    assert "hybrid's backbone stem conv" in hybrid.get_title() and "27 components exist" in hybrid.get_xlabel()


def test_plot_filter_variance():
    torch.manual_seed(0)
    ax = vitviz.plot_filter_variance(tiny_vit(patch_size=4, img_size=16))  # 32 filters of 48 inputs: 31 comps
    assert ax.get_xlabel().startswith("Principal component") and ax.get_ylabel() == "Explained variance ratio"
    assert len(ax.patches) == 31
    _fig, ax2 = plt.subplots()
    ratio = np.array([0.5, 0.3, 0.2])
    assert vitviz.plot_filter_variance(ratio, ax=ax2) is ax2
    np.testing.assert_allclose(ax2.lines[0].get_ydata(), [0.5, 0.8, 1.0])


@pytest.mark.parametrize(("ratio", "message"), [
    ([3.2, 1.1, 0.4], r"2 of the 3 values are not ratios in \[0, 1\] \(the first: component 1, 3.2\).*not the "
                      "variances"),
    ([0.5, np.nan, 0.1], r"component 2, nan"),
    ([0.5, -0.2, 0.1], r"component 2, -0.2"),
    ([0.6, 0.5, 0.1], r"sums to 1.2"),
    ([[0.5, 0.2], [0.1, 0.1]], r"shape \(2, 2\) is not one ratio per component"),
])
def test_plot_filter_variance_refuses_what_is_not_a_ratio(ratio, message):
    """The y axis is fixed at [0, 1.02]: variances (not ratios) and running sums above 1 were drawn off the top of
    the axes, a NaN or negative bar was left out, and a 2-D table was flattened into "components", all silently."""
    with pytest.raises(vitviz.InputError, match=message):
        vitviz.plot_filter_variance(np.asarray(ratio))


def test_plot_filter_variance_takes_ratios_of_any_array_kind():
    ax = vitviz.plot_filter_variance(torch.tensor([[0.5, 0.3, 0.2]]))  # one row: one ratio per component
    np.testing.assert_allclose([p.get_height() for p in ax.patches], [0.5, 0.3, 0.2])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.8, 1.0])
    ax = vitviz.plot_filter_variance([0.4, 0.3, 0.3 + 1e-9])  # rounding past 1 is a sum of 1
    assert ax.get_ylim() == (0, 1.02)


def test_save_figure_writes_every_format(tmp_path):
    fig = vitviz.plot_pos_embed(tiny_vit())
    paths = vitviz.save_figure(fig, tmp_path / "deep" / "er" / "pos_embed")
    assert [p.suffix for p in paths] == [".png", ".pdf", ".svg"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    assert paths[1].read_bytes()[:4] == b"%PDF"
    assert "<svg" in paths[2].read_text()[:2000]
    only = vitviz.save_figure(fig, tmp_path / "one.png", formats=("png",))
    assert only == [tmp_path / "one.png"] and only[0].stat().st_size > 0


def test_style_keeps_interactive_mode_turned_on_inside():
    """Jupyter's inline backend turns interactive mode on when the first figure loads it; that must survive."""
    from vitviz.plot.style import RC, vitviz_style

    was = matplotlib.is_interactive()
    try:
        matplotlib.interactive(False)
        with vitviz_style():
            assert matplotlib.rcParams["font.size"] == RC["font.size"]
            matplotlib.interactive(True)
        assert matplotlib.is_interactive()
        matplotlib.rcParams["font.size"] = 13.0
        with vitviz_style():
            pass
        assert matplotlib.rcParams["font.size"] == 13.0  # everything else is restored
    finally:
        matplotlib.interactive(was)
        matplotlib.rcParams["font.size"] = matplotlib.rcParamsDefault["font.size"]


# ---- notebook --------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_notebook_01_runs_offline_and_saves_figures(tmp_path, run_notebook):
    out_dir = tmp_path / "figs"
    _, _, images = run_notebook("01_position_embeddings.ipynb", out_dir=str(out_dir))
    assert len(images) >= 7  # every figure cell shows its figure, not only the first one
    for stem in ("fig7_center_reference", "fig7_left_reference", "fig7_center_timm", "sincos", "interpolated"):
        for fmt in ("png", "pdf", "svg"):
            assert (out_dir / f"{stem}.{fmt}").stat().st_size > 0, f"{stem}.{fmt} missing"


def test_hybrid_filters_are_the_standardised_weights_timm_applies():
    """timm hybrid stems are StdConv2dSame: the PCA must see the standardised weights forward applies."""
    import timm
    from timm.layers import StdConv2d

    from vitviz.analysis.filters import applied_weight

    model = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, img_size=64, depth=1, num_classes=3)
    stem = model.patch_embed.backbone.conv
    assert type(stem).__name__ == "StdConv2dSame"
    with torch.no_grad():
        stem.weight.mul_(3.0).add_(0.5)  # raw weights far from standardised
    weights, source = embedding_filters(model)
    assert source == "patch_embed.backbone.conv"
    raw = stem.weight.detach().double()
    flat = raw.reshape(raw.shape[0], -1)
    expected = (flat - flat.mean(1, keepdim=True)) / torch.sqrt(flat.var(1, unbiased=False, keepdim=True) + stem.eps)
    torch.testing.assert_close(weights.double(), expected.reshape_as(raw), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(weights, stem.weight.detach().float(), atol=1e-2)
    # the PCA runs on those standardised filters
    comps, _ratio = filter_pca(weights, 5)
    comps_raw, _ = filter_pca(stem.weight.detach(), 5)
    assert not torch.allclose(comps, comps_raw, atol=1e-3)
    # and what forward applies is exactly that weight (plain StdConv2d: no dynamic padding to replicate)
    conv = StdConv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), torch.nn.functional.conv2d(x, applied_weight(conv), conv.bias, padding=1))
    plain = nn.Conv2d(3, 4, 2)
    assert torch.equal(applied_weight(plain), plain.weight.detach())


def test_a_conv_stem_is_not_titled_as_patch_embedding_filters():
    """A ViT whose patch projection is a stack of convs (torchvision's conv_stem_configs, Xiao et al. 2021) has no
    patch-sized RGB filters: its first RGB conv is a 3x3 stem conv, which the figures drew under the title of
    Fig. 7 left, "RGB embedding filters", as if they were patch-embedding filters."""
    from torchvision.models.vision_transformer import ConvStemConfig
    from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT

    torch.manual_seed(0)
    stem = [ConvStemConfig(16, 3, 2), ConvStemConfig(32, 3, 2), ConvStemConfig(32, 3, 2), ConvStemConfig(32, 3, 2)]
    model = TorchvisionViT(image_size=64, patch_size=16, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64,
                           conv_stem_configs=stem).eval()
    assert not vitviz.inspect(model).hybrid
    weights, source = embedding_filters(model)
    assert weights.shape == (16, 3, 3, 3) and source == "conv_proj.conv_bn_relu_0.0"
    ax = vitviz.plot_embedding_filters(model)
    assert "embedding filters" not in ax.get_title() and "conv stem" in ax.get_title()
    variance = vitviz.plot_filter_variance(model)
    assert "embedding filters" not in variance.get_title() and "conv stem" in variance.get_title()
    assert vitviz.analysis.filters.filter_origin(model) == "conv stem"
    assert vitviz.analysis.filters.filter_origin(tiny_vit()) == "patch projection"
    assert vitviz.analysis.filters.filter_origin(build_reference("cifar10-hybrid")) == "hybrid backbone stem"
