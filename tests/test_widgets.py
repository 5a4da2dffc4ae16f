"""The Jupyter explorers without a browser: controls driven through ``.value``, the PNG they send, its size."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit
from PIL import Image

pytest.importorskip("ipywidgets")

import vitviz  # noqa: E402
from vitviz.errors import NoPositionEmbeddingError
from vitviz.widgets import AttentionExplorer, PosEmbedExplorer, explore_attention, explore_pos_embed  # noqa: E402
from vitviz.widgets._render import cell_at  # noqa: E402

MB = 1_000_000


def photo(h: int = 40, w: int = 56, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def decode(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def captured(model, explorer: AttentionExplorer, index: int = 0) -> list[torch.Tensor]:
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(explorer._x[index:index + 1])
    return cap.attentions


def count_forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def widget_state_bytes(widget) -> int:
    """Bytes of the serialized state of ``widget`` and every widget below it (binary buffers counted raw)."""
    import ipywidgets

    seen, total, todo = set(), 0, [widget]
    while todo:
        w = todo.pop()
        if id(w) in seen:
            continue
        seen.add(id(w))
        state = w.get_state()
        for value in state.values():
            if isinstance(value, (bytes, memoryview)):
                total += len(value)
        total += len(json.dumps({k: v for k, v in state.items() if not isinstance(v, (bytes, memoryview))},
                                default=str))
        todo += [v for v in vars(w).values() if isinstance(v, ipywidgets.Widget)]
        todo += [c for c in getattr(w, "children", ()) if isinstance(c, ipywidgets.Widget)]
    return total


# ---- attention ---------------------------------------------------------------------------------------------------

BAR = 6 + 12 + 44  # the colour bar right of a map: gap, bar, tick labels


def _bar_colours(png: bytes, width: int, cmap: str) -> tuple[float, float]:
    """How far (0-255) the colours down the middle of the colour bar right of a ``width``-px map lie from matplotlib's
    ``cmap`` from 1 (top) to 0 (bottom) at the same rows, and the largest step between two entries of a 256-entry
    table of ``cmap`` (the resolution of the explorers' lookup table)."""
    import matplotlib

    pixels = decode(png)
    bar = pixels[:, width + 6 + 6]  # the bar's middle column
    cm = matplotlib.colormaps[cmap]
    want = cm(np.linspace(1.0, 0.0, len(bar)))[:, :3] * 255
    step = np.abs(np.diff(cm(np.linspace(0.0, 1.0, 256))[:, :3] * 255, axis=0)).max()  # one step of a 256-entry LUT
    return np.abs(bar.astype(float) - want).max(), step + 0.5


def _tick_rows(png: bytes, width: int) -> np.ndarray:
    """Rows of the tick-label room right of the bar that hold dark (text) pixels."""
    room = decode(png)[:, width + 18:].min(axis=(1, 2))
    return np.flatnonzero(room < 100)


def test_attention_overlay_has_a_labelled_colour_bar():
    """The overlay's colours, 0 to the map's maximum, as a bar with its two ends labelled; the status line counts
    layers, heads, rows and columns from 1, as the figures' titles do."""
    model = tiny_timm_vit(depth=3, num_heads=2)
    w = explore_attention(model, photo())
    error, step = _bar_colours(w.png, w.map_size[1], "inferno")
    assert error <= step  # 256-entry lookup table: a step of the colormap at most
    rows = _tick_rows(w.png, w.map_size[1])
    dh = w.map_size[0]
    assert rows.min() < 12 and rows.max() > dh - 12 and not ((rows > 20) & (rows < dh - 20)).any()  # two ends
    w.set(layer=0, head=1, query="patch", row=0, col=5)
    assert "layer 1 of 3 (" in w.status.value and "head 2;" in w.status.value
    assert "patch (row 1, column 6)" in w.status.value
    assert dict((v, k) for k, v in w.head.options)[1] == "head 2"
    w.set(rollout=True, layer=2)
    assert "rollout through layer 3 of 3" in w.status.value

def test_signed_attention_is_drawn_on_a_diverging_scale():
    """Differential attention's rows hold negative weights: on the scale from 0 to the map's maximum every patch of
    a negative row was drawn in the bottom colour, under a bar from 0 to 1 and a status "0 to the map's max -0.221".
    They are drawn as plot_attention_heads_grid draws them: RdBu_r from -m to m, m the largest |weight|."""
    import matplotlib
    from conftest import tiny_parallel

    model = tiny_parallel("differential")
    with torch.no_grad():  # lambda well above 1: rows dip below 0
        for block in model.blocks:
            block.attn.lambda_q1.fill_(0.5)
            block.attn.lambda_k1.fill_(0.5)
    x = torch.randn(1, 3, 32, 48)
    w = explore_attention(model, x, alpha=1.0)  # the map alone: its colours can be read back
    attn = captured(model, w)[-1][0].float()  # (H, N, N)
    token = int(attn[0, 1:, 1:].amin(dim=1).argmin()) + 1  # the patch query whose head-1 row reaches lowest
    w.set(head=0, query="patch", row=(token - 1) // 6, col=(token - 1) % 6)
    heat = w.map()
    np.testing.assert_allclose(heat, attn[0, token, 1:].reshape(4, 6).numpy(), atol=1e-6)
    assert heat.min() < 0
    m = float(np.abs(heat).max())
    assert f"signed weights, {-m:.3g} (blue) to {m:.3g} (red)" in w.status.value and "RdBu_r" in w.status.value
    error, step = _bar_colours(w.png, w.map_size[1], "RdBu_r")
    assert error <= step
    pixels = decode(w.png)
    dh, dw = w.map_size
    lut = matplotlib.colormaps["RdBu_r"]
    for r, c in ((0, 0), (3, 5), ((token - 1) // 6, (token - 1) % 6)):  # each patch's centre: its weight's colour
        y, x0 = int((r + 0.5) * dh / 4), int((c + 0.5) * dw / 6)
        if (r, c) == ((token - 1) // 6, (token - 1) % 6):
            x0 += 3 if dw / 6 > 8 else 0  # clear of the query's outline
        want = np.asarray(lut((heat[r, c] + m) / (2 * m))[:3]) * 255
        assert np.abs(pixels[y, x0].astype(float) - want).max() <= step, (r, c)


def test_every_attention_control_changes_the_png():
    model = tiny_timm_vit(depth=3, num_heads=2)  # 4x6 grid: a non-square grid catches h/w swaps
    w = vitviz.explore_attention(model, photo())
    assert isinstance(w, AttentionExplorer) and w.image.format == "png"
    assert w.map_size == (213, 320)  # 32x48 px input, longer side 320
    assert decode(w.png).shape[:2] == (213, 320 + BAR)  # the overlay, then its colour bar
    changes = [("layer", 0), ("head", 1), ("head", "max"), ("head", "min"), ("query", "patch"), ("row", 0),
               ("col", 5), ("rollout", True), ("discard", 0.5), ("alpha", 0.2), ("layer", 2)]
    for name, value in changes:
        before = w.png
        getattr(w, name).value = value
        assert w.png != before, f"setting {name}={value!r} left the image unchanged"
        assert w.png == bytes(w.image.value)
    assert not w.discard.disabled


def test_attention_map_is_the_captured_row():
    model = tiny_timm_vit(depth=3, num_heads=2)
    w = explore_attention(model, photo())
    attn = captured(model, w)
    (gh, gw), p = w.grid, 1
    assert (gh, gw) == (4, 6)
    w.set(layer=1, head=0)  # class-token query
    np.testing.assert_allclose(w.map(), attn[1][0, 0, 0, p:].reshape(gh, gw).numpy(), rtol=1e-6)
    w.set(head="mean", query="patch", row=3, col=1)
    expected = attn[1][0].mean(0)[p + 3 * gw + 1, p:].reshape(gh, gw).numpy()
    np.testing.assert_allclose(w.map(), expected, rtol=1e-5)
    w.set(head="max")
    np.testing.assert_allclose(w.map(), attn[1][0].amax(0)[p + 3 * gw + 1, p:].reshape(gh, gw).numpy(), rtol=1e-6)


def test_rollout_view_matches_the_package_rollout():
    rollout = pytest.importorskip("vitviz.analysis.rollout")
    model = tiny_timm_vit(depth=3, num_heads=2)
    w = explore_attention(model, photo())
    attn = captured(model, w)
    w.set(rollout=True, layer=1, discard=0.25)
    expected = rollout.rollout_from_attentions(attn[:2], num_prefix_tokens=1, discard_ratio=0.25)[0, 0, 1:]
    np.testing.assert_allclose(w.map(), expected.reshape(4, 6).numpy(), rtol=1e-5)
    assert w.map().sum() <= 1 + 1e-5


def test_the_model_runs_once_per_image():
    model = tiny_timm_vit(depth=2)
    calls = count_forwards(model)
    w = explore_attention(model, [photo(seed=0), photo(seed=1)], labels=["a", "b"])
    assert calls[0] == 1
    for layer in (0, 1, 0):
        w.set(layer=layer, head="max", rollout=layer == 1)
    assert calls[0] == 1
    first = w.png
    w.image_index.value = 1
    assert calls[0] == 2 and w.png != first
    w.image_index.value = 0
    assert calls[0] == 2 and w.png == first


def test_the_attention_cache_is_bounded_in_bytes_and_results_stay_right():
    model = tiny_timm_vit(depth=2)
    images = [photo(seed=s) for s in range(7)]
    probe = explore_attention(model, images[:1])
    per_image = probe.cache.nbytes  # both layers' (1, H, N, N) maps of one image
    assert per_image == 2 * 2 * 25 * 25 * 4
    bound = int(2.5 * per_image)  # room for two images' maps, not three
    w = explore_attention(model, images, cache_bytes=bound)
    first_maps = {}
    for i in range(len(images)):
        w.image_index.value = i
        w.set(rollout=i % 2 == 1, layer=1)
        first_maps[i] = w.map().copy()
        assert w.cache.nbytes <= bound, "the cache outgrew its bound"
    assert w.cache.evictions > 0 and w.forwards == len(images)
    assert sum(1 for k in w.cache._items if k[0] == "attn") <= 2
    for i in (0, 3, 6):  # browsing back: evicted images are captured again, and show the same numbers
        w.image_index.value = i
        w.set(rollout=i % 2 == 1, layer=1)
        np.testing.assert_allclose(w.map(), first_maps[i], rtol=1e-6)
        ref = vitviz.load_images(model, images[i])
        with torch.no_grad(), vitviz.capture_attention(model) as cap:
            model(ref)
        if i % 2 == 0:
            np.testing.assert_allclose(w.map(), cap.attentions[1][0].mean(0)[0, 1:].reshape(4, 6).numpy(), rtol=1e-5)
        assert w.cache.nbytes <= bound
    assert w.forwards > len(images)
    with pytest.raises(vitviz.errors.InputError, match="cache_bytes=0"):
        explore_attention(model, images[:1], cache_bytes=0)


def test_moving_a_query_slider_or_clicking_picks_a_patch():
    w = explore_attention(tiny_timm_vit(), photo())
    assert w.query.value == 0  # the class token
    w.row.value = 1
    assert w.query.value == "patch"
    w.query.value = 0
    dh, dw = w.map_size
    w.on_click({"type": "click", "dataX": dw - 1, "dataY": 0})  # top-right corner of the drawing
    assert (w.query.value, w.row.value, w.col.value) == ("patch", 0, 5)
    png = w.png
    w.on_click({"type": "click", "dataX": dw + 50, "dataY": 0})  # outside the map: ignored
    assert w.png == png
    assert cell_at(0, dh - 1, (dh, dw), (4, 6)) == (3, 0)


def test_models_without_a_class_token_and_with_registers():
    no_cls = tiny_timm_vit(class_token=False, global_pool="avg")
    w = explore_attention(no_cls, photo())
    assert w.query.value == "mean" and "mean of patch queries (output)" in dict(w.query.options)
    attn = captured(no_cls, w)
    np.testing.assert_allclose(w.map(), attn[-1][0].mean(0)[:, :].mean(0).reshape(4, 6).numpy(), rtol=1e-5)
    regs = explore_attention(tiny_timm_vit(reg_tokens=2), photo())
    assert [label for label, _ in regs.query.options][:3] == ["class token (output)", "register token 0",
                                                              "register token 1"]
    before = regs.png
    regs.query.value = 2
    assert regs.png != before


def test_set_names_the_controls_when_one_is_unknown():
    w = explore_attention(tiny_timm_vit(), photo())
    with pytest.raises(AttributeError, match="layer"):
        w.set(layers=1)
    assert w.set(layer=0, head=1) is w


def test_index_sliders_show_counts_from_one_and_hold_python_indices():
    """The layer, row and column sliders read "1" ... n, as the titles and the status line count; their values stay
    the indices the API takes (an IntSlider showed "5" for the layer the status called "layer 6 of 6")."""
    model = tiny_timm_vit()
    depth = len(vitviz.inspect(model).attention_modules)
    w = explore_attention(model, photo())
    assert (w.layer.value, w.layer.label) == (depth - 1, str(depth))
    assert f"layer {depth} of {depth}" in w.status.value
    w.set(layer=0, query="patch", row=1, col=np.int64(5))  # any integer type
    assert (w.layer.label, w.row.label, w.col.label) == ("1", "2", "6")
    assert "layer 1 of" in w.status.value and "patch (row 2, column 6)" in w.status.value
    np.testing.assert_allclose(w.map(), captured(model, w)[0][0].mean(0)[1 + 1 * 6 + 5, 1:].reshape(4, 6).numpy(),
                               rtol=1e-5)
    p = explore_pos_embed(model)
    assert [label for label, _ in p.row.options] == ["1", "2", "3", "4"] and p.row.value == 2


def test_set_refuses_values_a_control_cannot_hold_and_changes_nothing():
    """ipywidgets clamps a number to a slider's range silently (layer=20 showed the last layer) and answers a
    missing choice with a bare TraitError; set() names the control, the value and what it takes."""
    from vitviz.errors import InputError, OutOfRangeError

    model = tiny_timm_vit()
    depth = len(vitviz.inspect(model).attention_modules)
    w = explore_attention(model, photo())
    before = (w.png, w.layer.value, w.head.value, w.alpha.value)
    with pytest.raises(OutOfRangeError, match=rf"set\(layer={depth}\).*layer control's values 0, 1.*counted from 1"):
        w.set(head=1, layer=depth)
    with pytest.raises(OutOfRangeError, match=r"row=-1"):
        w.set(row=-1)
    with pytest.raises(OutOfRangeError, match=r"alpha=1.5\).*\[0.0, 1.0\]"):
        w.set(alpha=1.5)
    with pytest.raises(OutOfRangeError, match=r"discard=0.99"):
        w.set(discard=0.99)
    with pytest.raises(InputError, match=r"head='avg'.*'mean', 'max', 'min', 0, 1"):
        w.set(head="avg")
    with pytest.raises(InputError, match=r"layer=True"):
        w.set(layer=True)  # a bool is no index
    assert (w.png, w.layer.value, w.head.value, w.alpha.value) == before  # head=1 was put back
    p = explore_pos_embed(model)
    with pytest.raises(OutOfRangeError, match=r"col=6"):
        p.set(col=6)
    p.set(resolution=64, row=7)  # each value is checked against what the ones before it made: 8 rows at 64 px
    assert p.grid == (8, 12) and p.row.value == 7
    state = (p.png, p.resolution.value, p.row.value, p.col.value, len(p.row.options))
    with pytest.raises(OutOfRangeError, match=r"row=5"):
        p.set(resolution=16, row=5)  # 2 rows at 16 px: refused, and the resolution and rows put back
    assert (p.png, p.resolution.value, p.row.value, p.col.value, len(p.row.options)) == state


def test_vit_b16_payload_stays_under_one_megabyte():
    timm = pytest.importorskip("timm")
    skimage_data = pytest.importorskip("skimage.data")
    model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    w = explore_attention(model, skimage_data.chelsea())
    sizes = []
    for change in ({}, {"layer": 0}, {"rollout": True, "discard": 0.9}, {"query": "patch", "head": 11}):
        w.set(**change)
        sizes.append(len(w.png))
        state = w.image.get_state()
        assert len(state["value"]) == len(w.png)
    assert max(sizes) < MB, sizes
    assert widget_state_bytes(w) < MB
    p = explore_pos_embed(model)
    p.set(resolution=896)  # 56x56 grid
    assert len(p.png) < MB and widget_state_bytes(p) < MB


@pytest.mark.gpu
def test_attention_stays_on_the_model_device():
    model = tiny_timm_vit().cuda()
    w = explore_attention(model, photo())
    assert all(a.device.type == "cuda" for a in w.attentions())
    w.layer.value = 0
    assert w.map().shape == (4, 6)


# ---- position embedding -------------------------------------------------------------------------------------------

def test_every_pos_embed_control_changes_the_png():
    model = tiny_timm_vit()
    w = vitviz.explore_pos_embed(model)
    assert isinstance(w, PosEmbedExplorer) and w.grid == (4, 6)
    for name, value in (("row", 0), ("col", 5), ("resolution", 64), ("view", "pca"), ("row", 2)):
        before = w.png
        getattr(w, name).value = value
        assert w.png != before, f"setting {name}={value!r} left the image unchanged"
    assert decode(w.png).shape[:2] == w.map_size


def test_pos_embed_explorer_of_a_model_with_no_table_at_other_sizes():
    """A Hugging Face ViT built for a non-square grid cannot run at another size (its interpolate_pos_encoding
    reads the table as a square grid): the explorer shows its own table with the size slider disabled, and a size
    set anyway is refused by name rather than drawn from a table the model never makes."""
    transformers = pytest.importorskip("transformers")
    model = transformers.ViTModel(transformers.ViTConfig(
        image_size=(32, 48), patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64)).eval()
    p = explore_pos_embed(model)
    assert p.resolution.disabled and p.grid == (4, 6) and len(p.png)
    shown = (p.png, p.resolution.value)
    with pytest.raises(vitviz.errors.InputError, match=r"img_size: ViTModel is built for a 4x6 grid"):
        p.set(resolution=64)
    # refused while drawing: the size put back (it stayed at 64, and every later change failed on it)
    assert (p.png, p.resolution.value) == shown
    p.set(row=0, view="pca")
    assert p.map().shape == (4, 6, 3)
    assert not explore_pos_embed(tiny_timm_vit()).resolution.disabled


def test_pos_embed_resolution_off_the_stride_is_refused_and_nothing_changes():
    """ipywidgets snaps only the browser's slider to its step: set(resolution=17) on 8 px patches was taken, the
    draw then failed on a size that is no multiple of the stride, and the explorer stayed on it, every later change
    failing the same way."""
    from vitviz.errors import InputError

    p = explore_pos_embed(tiny_timm_vit())
    state = (p.png, p.resolution.value, p.row.value, p.col.value)
    with pytest.raises(InputError, match=r"set\(resolution=17\): not a multiple of the 8 px token stride .*16 or 24"):
        p.set(resolution=17)
    assert (p.png, p.resolution.value, p.row.value, p.col.value) == state
    p.set(resolution=24, row=2)  # on the stride: a 3x4... grid at 24x36 px
    assert p.grid == (3, 4) and p.row.value == 2 and p.map().shape == (3, 4)


def test_a_control_set_directly_is_checked_as_set_checks_it():
    """Code that drives a control itself (``explorer.resolution.value = 17``) went past ``set()``'s check: the draw
    failed on a size off the token stride and the explorer stayed on it, every later change failing the same way.
    The observer now refuses the value as ``set()`` does and puts the control back."""
    from vitviz.errors import InputError

    p = explore_pos_embed(tiny_timm_vit())
    state = (p.png, p.resolution.value, p.row.value, p.col.value, p.status.value)
    with pytest.raises(InputError, match=r"PosEmbedExplorer.resolution.value = 17: not a multiple of the 8 px token "
                                         r"stride .*16 or 24"):
        p.resolution.value = 17
    assert (p.png, p.resolution.value, p.row.value, p.col.value, p.status.value) == state
    p.row.value = 0  # later changes work
    p.resolution.value = 24
    assert p.grid == (3, 4) and p.map().shape == (3, 4)
    with pytest.raises(InputError, match=r"resolution.value = 17"), p.hold():  # also inside hold()
        p.resolution.value = 17
    assert p.resolution.value == 24 and p.grid == (3, 4)


def test_pos_embed_explorer_of_a_model_whose_size_is_no_multiple_of_its_stride():
    """A model built for 36x52 px at 8 px patches (a 4x6 grid over 32x48 of them, as SigLIP's 384 px at 14 px
    patches): the explorer asked for its table at 36x48 px, which no stride divides, and failed as it was built."""
    model = tiny_timm_vit(img_size=(36, 52))
    p = explore_pos_embed(model)
    assert p.img_size == (36, 52) and p.grid == (4, 6)
    np.testing.assert_allclose(p.map(), vitviz.pos_embed_similarity(model).numpy()[2, 3])
    assert "the model&#x27;s own table" in p.status.value
    p.set(resolution=16)  # other sizes on the stride, the width keeping the aspect ratio
    assert p.img_size == (16, 24) and p.grid == (2, 3)
    p.set(resolution=36)  # and back to its own size, off the stride
    assert p.img_size == (36, 52) and p.grid == (4, 6)


def test_pos_embed_colour_bar_is_labelled_minus_one_to_one():
    w = explore_pos_embed(tiny_timm_vit())
    w.set(row=0, col=5)
    dh, dw = w.map_size
    assert decode(w.png).shape[:2] == (dh, dw + BAR)
    error, step = _bar_colours(w.png, dw, "viridis")
    assert error <= step
    rows = _tick_rows(w.png, dw)
    assert rows.min() < 12 and rows.max() > dh - 12 and ((rows > dh / 2 - 10) & (rows < dh / 2 + 10)).any()
    assert "Query patch (row 1, column 6)" in w.status.value


def test_pos_embed_map_is_the_similarity_at_each_resolution():
    model = tiny_timm_vit()
    w = explore_pos_embed(model)
    w.set(row=1, col=4)
    np.testing.assert_allclose(w.map(), vitviz.pos_embed_similarity(model)[1, 4].numpy(), atol=1e-6)
    assert w.map()[1, 4] == pytest.approx(1.0)
    w.resolution.value = 64  # 64x96 px: an 8x12 grid, the aspect ratio kept
    assert w.img_size == (64, 96) and w.grid == (8, 12)
    assert (w.row.options[-1], w.col.options[-1]) == (("8", 7), ("12", 11))  # shown from 1, held from 0
    assert (w.row.value, w.col.value) == (3, 9)  # the same place
    sim = vitviz.pos_embed_similarity(model, img_size=(64, 96))
    np.testing.assert_allclose(w.map(), sim[3, 9].numpy(), atol=1e-6)
    w.resolution.value = 16  # back down: a 2x3 grid, sliders clamped
    assert (len(w.row.options), len(w.col.options)) == (2, 3) and (w.row.value, w.col.value) == (0, 2)
    w.view.value = "pca"
    rgb = w.map()
    assert rgb.shape == (2, 3, 3) and rgb.min() >= 0 and rgb.max() <= 1


def test_pos_embed_click_and_missing_table():
    w = explore_pos_embed(tiny_timm_vit())
    dh, dw = w.map_size
    w.on_click({"dataX": 0, "dataY": dh - 1})
    assert (w.row.value, w.col.value) == (3, 0)
    png = w.png
    w.on_click({"dataX": dw + 3, "dataY": 0})  # on the colour bar: ignored
    assert w.png == png
    with pytest.raises(NoPositionEmbeddingError, match="no absolute position embedding"):
        explore_pos_embed(tiny_timm_vit(pos_embed="none"))


def test_the_output_query_follows_the_readout():
    avg = explore_attention(tiny_timm_vit(global_pool="avg"), photo())  # a class token the head never reads
    labels = [label for label, _ in avg.query.options]
    assert labels[:2] == ["mean of patch queries (output)", "class token"] and avg.query.value == "mean"


def test_a_grid_short_of_the_image_is_drawn_marked_and_clicked_over_its_own_pixels():
    """A model built at a size that is no multiple of its stride (36x52 at 8 px: a 4x6 grid over 32x48 px) sees
    no patch in the image's last rows and columns. The explorer drew the map stretched over the whole image (patch
    (3, 5) shown a patch's tenth further on than it sits), marked its query there and picked a patch for a click
    on the edge no patch sees: each now follows the pixels the grid covers, as the static figures do."""
    import matplotlib

    model = tiny_timm_vit(img_size=(36, 52))
    w = explore_attention(model, photo(36, 52), size=260, alpha=1.0)
    dh, dw = w.map_size
    eh, ew = w.grid_extent
    assert (dh, dw) == (180, 260) and (eh, ew) == (160, 240)  # 32 of 36 rows, 48 of 52 columns
    w.on_click({"type": "click", "dataX": ew - 1, "dataY": eh - 1})  # the last patch's last pixel
    assert (w.query.value, w.row.value, w.col.value) == ("patch", 3, 5)
    png = w.png
    for x, y in ((dw - 1, dh - 1), (ew, 0), (0, eh)):  # the edge no patch sees: no patch picked
        w.on_click({"type": "click", "dataX": x, "dataY": y})
        assert w.png == png and (w.row.value, w.col.value) == (3, 5)
    pixels = decode(w.png)[:, :dw]
    bottom = np.round(np.asarray(matplotlib.colormaps[w.cmap](0.0)[:3]) * 255)
    assert np.abs(pixels[eh + 2:, :].reshape(-1, 3) - bottom).max() <= 1  # no patch there: the bottom colour
    assert np.abs(pixels[:, ew + 2:].reshape(-1, 3) - bottom).max() <= 1
    heat = w._row()[1:].reshape(w.grid).numpy()
    top = np.round(np.asarray(matplotlib.colormaps[w.cmap](1.0)[:3]) * 255)
    r, c = np.unravel_index(heat.argmax(), heat.shape)  # the hottest patch is drawn over its own 40x40 pixels
    block = pixels[r * eh // 4 + 3:(r + 1) * eh // 4 - 3, c * ew // 6 + 3:(c + 1) * ew // 6 - 3]
    assert np.abs(block.reshape(-1, 3) - top).max() <= 1
    mark = decode(w.png)[eh - 1, ew - 20]  # the query's outline runs along the grid's last row of pixels
    assert tuple(mark) == (0, 255, 255)


def test_the_status_gives_the_prefix_tokens_share_of_a_fused_row():
    """A max (min) over heads sums to more (less) than 1 over the row: the status line said the prefix tokens'
    sum of it was "of the row" (the shipped cifar10-vit, last layer, max: 1% said, 0.3% of a row summing to 2.3)."""
    import re

    torch.manual_seed(0)
    model = tiny_timm_vit(depth=1, num_heads=8)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(6)  # peaked heads that disagree (random weights attend uniformly)
    w = explore_attention(model, photo())
    fused = captured(w.model, w)[0][0]  # (H, N, N)
    for head, rows in (("max", fused.amax(0)), ("min", fused.amin(0)), ("mean", fused.mean(0))):
        for query in (0, "patch"):
            w.set(head=head, layer=0, query=query, row=2, col=3)
            row = rows[0 if query == 0 else 1 + 2 * 6 + 3]
            share = float(row[0] / row.sum())
            shown = int(re.search(r"(\d+)% of the row goes to prefix tokens", w.status.value).group(1))
            assert abs(shown - 100 * share) <= 0.5 + 1e-6, (head, query, shown, share)
    assert float(fused.amax(0)[0].sum()) > 1.5  # a max row is no distribution


def test_a_click_picks_the_patch_drawn_under_the_pixel():
    """Each display pixel shows the patch its centre lies in (nearest-neighbour by pixel centres); a click on it
    picked the patch its top-left corner lies in, the neighbour, on a strip one pixel wide along every patch
    boundary that falls inside a pixel (1062 of the 213x320 pixels of a 4x6 grid, 3804 of 320x320 at 14x14)."""
    from vitviz.widgets._render import _display

    for grid, size, covered in (((4, 6), (213, 320), None), ((14, 14), (320, 320), None),
                                ((4, 6), (180, 260), (160, 240))):
        extent = covered or size
        ids = np.arange(grid[0] * grid[1], dtype=np.float32).reshape(grid)
        drawn = _display(ids, size, "nearest", covered).round().astype(int)[: extent[0], : extent[1]]
        rows = np.array([cell_at(0, y, extent, grid)[0] for y in range(extent[0])])  # rows and columns are
        cols = np.array([cell_at(x, 0, extent, grid)[1] for x in range(extent[1])])  # picked independently
        picked = rows[:, None] * grid[1] + cols[None, :]
        assert (picked == drawn).all(), f"{grid} drawn {size}: {int((picked != drawn).sum())} pixels pick another patch"
    w = explore_attention(tiny_timm_vit(), photo(32, 48))  # 4x6 grid drawn 213x320: row 2 starts at pixel 53
    assert w.map_size == (213, 320)
    w.on_click({"type": "click", "dataX": 0, "dataY": 53})
    assert (w.query.value, w.row.value, w.col.value) == ("patch", 1, 0)


def test_nan_values_are_not_drawn_as_the_lowest_value():
    """The explorers' pixels drew a NaN value in the bottom colour (as the lowest value), and one NaN made the
    overlay's default top the NaN maximum, so every other patch fell to the bottom colour too. A NaN value now gets
    ``NO_VALUE`` alone (heat maps) or shows the image without colour (overlays), and the top is the largest value."""
    from vitviz.widgets._render import NO_VALUE, _lut, colorize, overlay

    lut = _lut("inferno")
    colours = colorize(np.array([[np.nan, 1.0], [0.0, 0.5]]), "inferno", 0.0, 1.0)
    assert tuple(colours[0, 0]) == NO_VALUE and tuple(colours[0, 1]) == tuple(lut[255])
    assert tuple(colours[1, 0]) == tuple(lut[0]) and NO_VALUE not in {tuple(c) for c in lut[[0, 255]]}
    base = np.full((4, 4, 3), 40, np.uint8)
    out = overlay(base, np.array([[np.nan, 2.0], [0.0, 1.0]]), alpha=1.0, cmap="inferno")
    assert (out[:2, :2] == 40).all()  # the NaN patch: the image alone
    assert tuple(out[0, 3]) == tuple(lut[255]) and tuple(out[3, 0]) == tuple(lut[0])  # 2.0 is the top
