"""Attention figures: labels, titles, legends, colorbars, drawn data; notebook 02 end to end."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
import vitviz.zoo.reference
from vitviz.core.images import data_config, denormalise
from vitviz.errors import InputTypeError
from vitviz.plot.attention import upsample_maps

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]


def colorbar_labels(fig):
    return [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_plot_rollout_pairs_inputs_and_attention_with_a_colorbar():
    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    fig = vitviz.plot_rollout(model, x, labels=["a", "b", "c"])
    assert titles(fig) == ["Input", "Attention"] * 3
    assert colorbar_labels(fig) == ["Attention (relative to max)"]
    inputs = [ax for ax in fig.axes if ax.get_title() == "Input"]
    assert [ax.get_xlabel() for ax in inputs] == ["a", "b", "c"]
    # the input shown is the de-normalised image the model saw, and the heat map is the rollout, upsampled
    np.testing.assert_allclose(inputs[1].images[0].get_array(), denormalise(model, x)[1], atol=1e-6)
    heat = [ax for ax in fig.axes if ax.get_title() == "Attention"][2].images[1].get_array()
    maps = vitviz.attention_rollout(model, x)
    np.testing.assert_allclose(heat, upsample_maps(maps, (32, 48))[2], atol=1e-6)
    assert heat.shape == (32, 48) and heat.max() == pytest.approx(1.0)


def test_denormalise_inverts_the_model_preprocessing():
    model = vitviz.zoo.reference.build_reference("cifar10-vit").eval()
    photo = (np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)
    x = vitviz.load_images(model, photo)
    cfg = data_config(model)
    assert cfg["mean"] != (0.485, 0.456, 0.406)  # CIFAR statistics, not ImageNet's
    np.testing.assert_allclose(denormalise(model, x)[0], photo / 255.0, atol=1e-5)


def test_plot_rollout_modes_and_given_maps():
    model = tiny_timm_vit(reg_tokens=4, no_embed_class=True)
    photos = [np.full((20, 30, 3), 128, dtype=np.uint8)] * 4  # raw images are preprocessed for the model
    fig = vitviz.plot_rollout(model, photos, mode="both")
    assert titles(fig) == ["Input", "Attention", "Attention mask"] * 4
    assert len(fig.axes) == 2 * 6 + 1  # 4 images in 2 rows of 2, and the colorbar
    fig = vitviz.plot_rollout(model, photos[:2], mode="mask", maps=torch.rand(2, 4, 6))
    assert titles(fig) == ["Input", "Attention"] * 2 and colorbar_labels(fig) == []
    with pytest.raises(ValueError, match="one \\(gh, gw\\) map per image"):
        vitviz.plot_rollout(model, photos[:2], maps=torch.rand(3, 4, 6))
    with pytest.raises(ValueError, match="mode"):
        vitviz.plot_rollout(model, photos[:2], mode="heat")
    signed = torch.rand(2, 4, 6) - 0.5  # e.g. AttnLRP's maps: their negative half was drawn as 0
    with pytest.raises(vitviz.InputError, match="negative values.*signed=True"):
        vitviz.plot_rollout(model, photos[:2], maps=signed)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_maps_holding_nan_or_inf_are_refused_not_drawn_blank(bad):
    """Each map is divided by its maximum: one NaN patch made every pixel of its panel NaN (an empty "Attention"
    panel, a black "mask" one), one inf left a single bright patch; both were drawn without a word."""
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    maps = torch.rand(2, 4, 6)
    maps[1, 2, 3] = bad
    for mode in ("overlay", "mask"):
        with pytest.raises(vitviz.InputError, match=r"maps holds 1 NaN or infinite values of 48 \(the first at index "
                                             r"\(1, 2, 3\).*torch.nan_to_num"):
            vitviz.plot_rollout(model, x, maps=maps, mode=mode)
    with pytest.raises(vitviz.InputError, match=r"maps\['rollout'\] holds 1 NaN or infinite values"):
        vitviz.plot_explanations_grid(model, x, {"rollout": maps})
    with pytest.raises(vitviz.InputError, match=r"maps\['lrp'\] holds 1 NaN"):
        vitviz.plot_explanations_grid(model, x, {"lrp": maps - 0.5}, signed=True)
    with pytest.raises(InputTypeError, match=r"maps\['rollout'\]=.*does not hold numbers"):
        vitviz.plot_explanations_grid(model, x, {"rollout": "not maps"})
    # finite maps, as NumPy arrays or lists, are drawn as before
    fig = vitviz.plot_explanations_grid(model, x, {"rollout": np.nan_to_num(maps.numpy(), posinf=0.0).tolist()})
    heat = fig.axes[1].images[-1].get_array()
    assert np.isfinite(heat).all() and heat.max() == pytest.approx(1.0)


def test_maps_are_drawn_over_the_pixels_their_patches_see():
    """A model built for a size that is no multiple of its stride (36x52 at 8 px: 4x6 patches over 32x48 px, as
    384 px at 14 px patches gives 27 over 378) draws each patch over its own pixels, the uncovered rim at 0;
    stretched over the whole image, the last patch was drawn 3-4 px down and right of its pixels."""
    model = tiny_timm_vit(img_size=(36, 52))
    x = torch.randn(1, 3, 36, 52)
    maps = torch.zeros(1, 4, 6)
    maps[0, 3, 5] = 1.0  # the bottom-right patch: pixels 24..31 x 40..47

    def hot(arr):
        ys, xs = np.nonzero(np.asarray(arr) > 0.5)
        return ys.min(), ys.max(), xs.min(), xs.max()

    fig = vitviz.plot_rollout(model, x, maps=maps)
    assert hot(fig.axes[1].images[1].get_array()) == (24, 31, 40, 47)
    fig = vitviz.plot_explanations_grid(model, x, {"rollout": maps})
    assert hot(fig.axes[1].images[-1].get_array()) == (24, 31, 40, 47)
    fig = vitviz.plot_attention_heads_grid(model, x)
    panel = next(ax for ax in fig.axes if ax.get_title() == "Head 1")
    assert panel.images[0].get_extent() == [0, 48, 32, 0]
    assert tuple(panel.get_xlim()) == (0, 52) and tuple(panel.get_ylim()) == (36, 0)
    fig = vitviz.plot_attention_heads_grid(model, x, query=(3, 5))  # the query's red square on the same pixels
    for ax in fig.axes:
        if ax.get_title() in ("Input", "Head 1", "Head 2"):
            (square,) = ax.patches
            assert (*square.get_xy(), square.get_width(), square.get_height()) == (40, 24, 8, 8)
    pixels = torch.rand(1, 36, 52)  # a map on the pixels (AttnLRP read_at="pixels") is drawn as it is
    np.testing.assert_allclose(upsample_maps(pixels, (36, 52), None, covered=(32, 48)), pixels.numpy())


def test_plot_attention_heads_grid_one_panel_per_head_on_a_shared_scale():
    model = tiny_timm_vit(num_heads=4)
    x = torch.randn(1, 3, 32, 48)
    fig = vitviz.plot_attention_heads_grid(model, x, layer=1)
    assert titles(fig) == ["Input", "Head 1", "Head 2", "Head 3", "Head 4"]
    assert colorbar_labels(fig) == ["Attention weight"]
    assert "layer 2 of 2" in fig._suptitle.get_text() and "class token" in fig._suptitle.get_text()
    with torch.no_grad(), vitviz.capture_attention(model, layers=1) as cap:
        model(x)
    want = cap.attentions[0][0, :, 0, 1:].reshape(4, 4, 6)  # class token row over the 4x6 patches
    heads = [ax for ax in fig.axes if ax.get_title().startswith("Head")]
    for k, ax in enumerate(heads):
        np.testing.assert_allclose(ax.images[0].get_array(), want[k].numpy(), atol=1e-6)
        assert ax.images[0].get_clim() == heads[0].images[0].get_clim()
    fig = vitviz.plot_attention_heads_grid(model, x, layer=0, query=(1, 2))
    assert "patch (row 2, column 3)" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="one image"):
        vitviz.plot_attention_heads_grid(model, torch.randn(2, 3, 32, 48))


def test_heads_grid_refuses_attention_the_model_computes_as_nan():
    """A head whose weights are NaN (an overflow in half precision) made the shared scale NaN: every panel blank
    without a word. It is refused, naming the layer and the head."""
    from vitviz.errors import ComputeError

    model = tiny_timm_vit(num_heads=4)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight[attn.head_dim:2 * attn.head_dim] = float("nan")  # head 2's queries
    with pytest.raises(ComputeError, match=r"layer 1 holds NaN or infinite weights in head\(s\) \[2\] of 4"):
        vitviz.plot_attention_heads_grid(model, torch.randn(1, 3, 32, 48), layer=0)


def test_heads_grid_draws_signed_maps_on_a_diverging_scale():
    """Differential attention's maps hold negative weights: drawn from 0 up, they showed as 0. The scale is then
    symmetric about 0 (diverging colormap), each panel's data the captured row itself."""
    from conftest import tiny_parallel

    model = tiny_parallel("differential")
    with torch.no_grad():  # lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init well above 1: rows dip below 0
        for block in model.blocks:
            block.attn.lambda_q1.fill_(0.5)
            block.attn.lambda_k1.fill_(0.5)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad(), vitviz.capture_attention(model, layers=-1) as cap:
        model(x)
    attn = cap.attentions[0][0].float()  # (H, N, N)
    query = int(attn[:, :, 1:].amin(dim=(0, 2)).argmin())  # the token whose row reaches lowest
    want = attn[:, query, 1:].reshape(-1, 4, 6).numpy()
    assert want.min() < 0
    fig = vitviz.plot_attention_heads_grid(model, x, query=query)
    heads = [ax.images[0] for ax in fig.axes if ax.get_title().startswith("Head")]
    top = np.abs(want).max()
    for k, im in enumerate(heads):
        np.testing.assert_allclose(im.get_array(), want[k], atol=1e-6)
        np.testing.assert_allclose(im.get_clim(), (-top, top), rtol=1e-6)
        assert im.get_cmap().name == "RdBu_r"
    fig = vitviz.plot_attention_heads_grid(tiny_timm_vit(), x)  # weights of a softmax: 0 to the largest
    assert fig.axes[1].images[0].get_clim()[0] == 0 and fig.axes[1].images[0].get_cmap().name == "viridis"


def test_heads_grid_query_names_are_the_explanations_token_names():
    """``query="class"`` and ``query="patches"`` pick the rows ``token=`` picks in the explanations: the class
    token's query, and the mean over the patch queries (here on an average-pooling model, whose head reads that
    mean, and on a class-token model, whose head does not)."""
    from vitviz.errors import InputError

    for pool in ("avg", "token"):
        model = tiny_timm_vit(num_heads=2, global_pool=pool)
        x = torch.randn(1, 3, 32, 48)
        with torch.no_grad(), vitviz.capture_attention(model, layers=0) as cap:
            model(x)
        attn = cap.attentions[0][0]  # (H, N, N)
        for query, row, name in (("class", attn[:, 0, 1:], "class token"),
                                 ("patches", attn[:, 1:, 1:].mean(1), "mean over patch queries")):
            fig = vitviz.plot_attention_heads_grid(model, x, layer=0, query=query)
            assert name in fig._suptitle.get_text()
            heads = [ax for ax in fig.axes if ax.get_title().startswith("Head")]
            for k, ax in enumerate(heads):
                np.testing.assert_allclose(ax.images[0].get_array(), row[k].reshape(4, 6).numpy(), atol=1e-6)
        readout = vitviz.plot_attention_heads_grid(model, x, layer=0, query="readout")
        default = vitviz.plot_attention_heads_grid(model, x, layer=0)
        assert readout._suptitle.get_text() == default._suptitle.get_text()
        plt.close("all")
    with pytest.raises(InputError, match="query='cls' is not one of"):
        vitviz.plot_attention_heads_grid(model, x, query="cls")
    no_class = tiny_timm_vit(class_token=False, global_pool="avg")
    with pytest.raises(InputError, match="no class token"):
        vitviz.plot_attention_heads_grid(no_class, x, query="class")


def test_plot_attention_distance_labels_dots_and_legend():
    model = tiny_timm_vit(depth=3, num_heads=2)
    x = torch.randn(2, 3, 32, 48)
    ax = vitviz.plot_attention_distance(model, x, label="tiny")
    assert ax.get_xlabel() == "Network depth (layer)"
    assert ax.get_ylabel() == "Mean attention distance [pixels]"
    assert ax.get_title() == "tiny"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Head 1", "Head 2"]
    dist = vitviz.mean_attention_distance(model, x)
    # one dot per head per layer (a tidy table drawn by seaborn: layer-major rows), layers numbered from 1
    (coll,) = ax.collections
    np.testing.assert_allclose(coll.get_offsets(), np.c_[[1, 1, 2, 2, 3, 3], dist.reshape(-1).numpy()], rtol=1e-5)
    colors = coll.get_facecolors()[:, :3]
    np.testing.assert_allclose(colors[0::2], np.repeat(colors[:1], 3, 0))  # head 1 keeps one colour ...
    assert not np.allclose(colors[0], colors[1])  # ... distinct from head 2
    with pytest.raises(ValueError, match="pass the images"):
        vitviz.plot_attention_distance(model)


def test_plot_attention_distance_from_arrays_many_heads_and_units():
    ax = vitviz.plot_attention_distance(np.ones((4, 20)), patch_size=16)
    assert ax.get_legend() is None
    assert colorbar_labels(ax.figure) == ["Head"]  # 20 heads: a colorbar instead of 20 legend entries
    np.testing.assert_allclose(ax.collections[0].get_offsets()[:, 1], 16.0)  # patch units -> pixels
    _, ax = plt.subplots()
    assert vitviz.plot_attention_distance(np.ones((2, 3)), ax=ax) is ax


@pytest.mark.parametrize(("distances", "patch_size", "message"), [
    ([[10.0, np.nan], [20.0, 30.0]], None, r"1 of the 4 distances .* \(the first: layer 1, head 2: nan\)"),
    ([[10.0, 12.0], [np.inf, 30.0]], None, r"the first: layer 2, head 1: inf"),
    ([[10.0, -2.0], [20.0, 30.0]], None, r"negative, NaN or infinite"),
    (np.zeros((0, 3)), None, r"shape \(layers, heads\) with at least one of each, got \(0, 3\)"),
    (np.zeros((3, 0)), None, r"got \(3, 0\)"),
    ([[1.0, 2.0]], 0, r"patch_size=0 is not a positive number"),
    ([[1.0, 2.0]], -16, r"patch_size=-16 is not a positive number"),
])
def test_plot_attention_distance_refuses_distances_it_cannot_draw(distances, patch_size, message):
    """A NaN head was left out of the dots without a word, an inf failed in matplotlib's axis limits, negative or
    empty distances and a stride of 0 or -16 px drew an axis of nothing (every head at 0 or below)."""
    with pytest.raises(vitviz.InputError, match=message):
        vitviz.plot_attention_distance(np.asarray(distances), patch_size=patch_size)
    if patch_size is None:
        with pytest.raises(vitviz.InputError, match=r"models\['B'\]: .*" + message.split(".*")[0]):
            vitviz.plot_attention_distance_grid({"A": np.ones((2, 2)), "B": np.asarray(distances)})


def _head_on_the_class_token_alone() -> torch.nn.Module:
    """A 2-block ViT (4x6 grid, 2 heads) whose layer 1, head 1 puts every patch query's weight on the class key
    alone (its patch weights underflow to 0): that head has no mean attention distance (NaN)."""
    model = tiny_timm_vit(depth=2, num_heads=2)  # width 32: 16 per head
    with torch.no_grad():
        model.patch_embed.proj.weight.zero_()
        model.patch_embed.proj.bias.zero_()
        model.pos_embed.zero_()  # every patch token is 0, so its LayerNorm output is 0
        model.cls_token.zero_()
        model.cls_token[0, 0, 0] = 10.0
        qkv = model.blocks[0].attn.qkv
        qkv.weight.zero_()
        qkv.bias.zero_()
        qkv.weight[32:48, 0] = 1.0  # head 1's keys read the first feature, large for the class token alone
        qkv.bias[0:16] = 100.0  # head 1's queries: a large constant
    return model


def test_plot_attention_distance_of_a_model_refuses_a_head_without_a_distance():
    """A head whose patch queries attend to prefix tokens alone in some image has no distance (NaN, the
    analysis' rule); computed from a model, that dot was left out of the figure without a word (3 dots for 2
    layers of 2 heads), while the same NaN passed as distances was refused."""
    model = _head_on_the_class_token_alone()
    x = torch.randn(2, 3, 32, 48)
    dist = vitviz.mean_attention_distance(model, x)
    assert torch.isnan(dist[0, 0]) and bool(torch.isfinite(dist.reshape(-1)[1:]).all())
    message = r"layer 1, head 1 has no mean attention distance.*prefix tokens alone"
    with pytest.raises(vitviz.InputError, match=message):
        vitviz.plot_attention_distance(model, x)
    with pytest.raises(vitviz.InputError, match=r"models\['ViT'\]: " + message):
        vitviz.plot_attention_distance_grid({"ViT": model}, x)


def test_plot_attention_distance_puts_a_parallel_blocks_branches_at_its_depth():
    """timm's ParallelThingsBlock runs two attention branches side by side in one residual block; the figure drew
    each branch as a layer of its own, so a 3-block model went to "Network depth (layer)" 6 and block 2's heads
    sat at depths 3 and 4. A block is one layer: its branches' heads are drawn together at its depth."""
    import timm

    model = timm.create_model("vit_small_patch16_18x2_224", depth=3, img_size=(32, 48), patch_size=8, embed_dim=32,
                              num_heads=2).eval()
    assert vitviz.inspect(model).attention_blocks == (0, 0, 1, 1, 2, 2)
    x = torch.randn(2, 3, 32, 48)
    ax = vitviz.plot_attention_distance(model, x)
    dist = vitviz.mean_attention_distance(model, x)  # (6 modules, 2 heads)
    by_block = dist.reshape(3, 4)  # each block: its first branch's heads, then its second's
    (coll,) = ax.collections
    np.testing.assert_allclose(coll.get_offsets(), np.c_[np.repeat([1, 2, 3], 4), by_block.reshape(-1).numpy()],
                               rtol=1e-5)
    assert ax.get_xlim()[1] < 4 and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "Branch 1, head 1", "Branch 1, head 2", "Branch 2, head 1", "Branch 2, head 2"]


def test_plot_attention_distance_of_a_model_takes_no_other_stride_than_the_models():
    """With a model, patch_size= rescaled the distances by patch_size / the model's stride under the same "pixels"
    axis: for vit_tiny_r_s16_p8 (a hybrid: 8x8 patches of backbone features, a 32 px token stride) patch_size=8,
    the "p8" of its name, drew every head at a quarter of its distance in pixels. The stride is read from the
    model; another one is refused, naming it."""
    import timm

    model = timm.create_model("vit_tiny_r_s16_p8_224", img_size=(64, 96), depth=1).eval()
    assert vitviz.inspect(model).patch_size == (32, 32)
    x = torch.randn(1, 3, 64, 96)
    with pytest.raises(vitviz.InputError, match=r"patch_size=8: .*vit_tiny_r_s16_p8_224.*32x32 token stride.*patch_size=None"):
        vitviz.plot_attention_distance(model, x, patch_size=8)
    ax = vitviz.plot_attention_distance(model, x, patch_size=32)  # the model's own stride: the same figure
    np.testing.assert_allclose(ax.collections[0].get_offsets()[:, 1],
                               vitviz.mean_attention_distance(model, x).reshape(-1).numpy(), rtol=1e-5)


def test_plot_attention_distance_grid_shares_the_y_axis():
    vit = tiny_timm_vit(depth=2, num_heads=2)
    fig = vitviz.plot_attention_distance_grid({"ViT": vit, "Hybrid": torch.tensor([[30.0, 35.0], [40.0, 50.0]])},
                                              torch.randn(2, 3, 32, 48))
    a, b = fig.axes[:2]
    assert (a.get_title(), b.get_title()) == ("ViT", "Hybrid")
    assert a.get_ylim() == b.get_ylim() and a.get_ylim()[1] >= 50.0
    assert a.get_ylabel() == "Mean attention distance [pixels]" and b.get_xlabel() == "Network depth (layer)"
    assert a.get_legend() is None and b.get_legend() is not None


def test_lazy_exports_resolve():
    for name in ("attention_rollout", "grad_rollout", "rollout_from_attentions", "mean_attention_distance",
                 "plot_rollout", "plot_attention_heads_grid", "plot_attention_distance", "plot_attention_distance_grid",
                 "load_model_or_random"):
        assert callable(getattr(vitviz, name)), name


# ---- notebook --------------------------------------------------------------------------------------------------

def tiny_image_folder(root: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "ship"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / cls / f"{i:04d}.png")
    return root


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_notebook_02_runs_offline_and_saves_figures(tmp_path, monkeypatch, run_notebook):
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path / "no-checkpoints"))  # the random-weight fallback
    out_dir = tmp_path / "figs"
    _, text, images = run_notebook("02_attention.ipynb", out_dir=str(out_dir), n_images=6,
                                   data_dir=str(tiny_image_folder(tmp_path / "test")))
    assert "RANDOM weights" in text and "6 images from" in text
    assert len(images) >= 8
    for stem in ("fig6_rollout_vit", "fig6_rollout_hybrid", "fig14_rollout_photos", "grad_rollout_vit",
                 "heads_first_layer", "heads_last_layer", "fig11_attention_distance"):
        for fmt in ("png", "pdf", "svg"):
            assert (out_dir / f"{stem}.{fmt}").stat().st_size > 0, f"{stem}.{fmt} missing"
