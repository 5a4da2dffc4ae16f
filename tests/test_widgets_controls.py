"""The explorers' controls driven by code: a value set on a control itself is refused as ``set()`` refuses it, a
redraw that fails leaves the controls on the figure still shown, ``set()`` ends on the values it was given, and the
browser's own updates (``set_state``) go on as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit

pytest.importorskip("ipywidgets")

import vitviz  # noqa: E402
from vitviz.errors import InputError, InputTypeError, OutOfRangeError, UnknownNameError  # noqa: E402
from vitviz.widgets import explore_attention, explore_pos_embed  # noqa: E402


def photo(h: int = 32, w: int = 48, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def shown(explorer) -> tuple:
    """Everything a user sees of an explorer: the PNG, the status line, every control's value."""
    return explorer.png, explorer.status.value, {n: getattr(explorer, n).value for n in explorer.control_names()}


def test_a_value_set_on_a_control_that_cannot_hold_it_is_refused_and_nothing_changes():
    """``explorer.alpha.value = 1.5`` became 1.0 (ipywidgets clamps a slider's value without a word) and the overlay
    was drawn at full opacity, ``resolution.value = 1000`` drew 128 px; ``head.value = True`` showed head 2; a missing
    choice raised a bare ``TraitError``. Each is now refused before the control takes it, with the error ``set()``
    raises, naming the control, the value and what it takes."""
    model = tiny_timm_vit()
    depth = len(vitviz.inspect(model).attention_modules)
    w = explore_attention(model, [photo(), photo(seed=1)])
    w.set(alpha=0.4, discard=0.5)
    before = shown(w)
    refused = [
        ("alpha", 1.5, OutOfRangeError, r"AttentionExplorer\.alpha\.value = 1\.5: outside the alpha control's range "
                                        r"\[0\.0, 1\.0\]; pass a value in it"),
        ("alpha", -0.2, OutOfRangeError, r"alpha\.value = -0\.2: .*\[0\.0, 1\.0\]"),
        ("alpha", float("nan"), OutOfRangeError, r"alpha\.value = nan: .*\[0\.0, 1\.0\]"),
        ("discard", 0.99, OutOfRangeError, r"discard\.value = 0\.99: outside .*\[0\.0, 0\.95\]"),
        ("layer", depth, OutOfRangeError, rf"layer\.value = {depth}: not one of the layer control's values 0, 1 "
                                          r"\(Python indices; the slider shows them counted from 1\)"),
        ("row", -1, OutOfRangeError, r"row\.value = -1: not one of the row control's values 0, 1, 2, 3"),
        ("head", True, InputError, r"head\.value = True: not one of the head control's values 'mean', 'max', 'min', "
                                   r"0, 1; pass one of them"),
        ("head", "avg", InputError, r"head\.value = 'avg'"),
        ("query", "cls", InputError, r"query\.value = 'cls'"),
        ("image_index", 2, InputError, r"image_index\.value = 2: not one of the image_index control's values 0, 1"),
        ("rollout", "yes", InputTypeError, r"rollout\.value = 'yes': the rollout control is a checkbox; pass True"),
    ]
    for name, value, error, message in refused:
        with pytest.raises(error, match=message):
            getattr(w, name).value = value
        assert shown(w) == before, f"{name}.value = {value!r} changed the explorer"
    w.alpha.value = 1.0  # the ends of the range, and an int for a float slider, are taken and drawn
    assert w.alpha.value == 1.0 and w.png != before[0]
    w.layer.value = np.int64(0)  # a NumPy index is an index
    assert w.layer.value == 0 and type(w.layer.value) is int

    p = explore_pos_embed(model)
    before = shown(p)
    for name, value, error, message in [
        ("resolution", 1000, OutOfRangeError, r"PosEmbedExplorer\.resolution\.value = 1000: outside the resolution "
                                              r"control's range \[16, 128\]"),
        ("resolution", 24.7, InputError, r"resolution\.value = 24\.7: not a multiple of the 8 px token stride"),
        ("view", "rgb", InputError, r"view\.value = 'rgb': not one of the view control's values 'similarity', 'pca'"),
        ("col", 6, OutOfRangeError, r"col\.value = 6"),
    ]:
        with pytest.raises(error, match=message):
            getattr(p, name).value = value
        assert shown(p) == before, f"{name}.value = {value!r} changed the explorer"


def test_the_browsers_updates_still_move_the_controls_and_redraw():
    """A slider moved in the browser arrives through ``set_state`` (the widget's comm): it is drawn as before, and a
    float slider's value a hair past its end from JavaScript's arithmetic (``19 * 0.05``) is clamped by ipywidgets,
    not refused."""
    w = explore_attention(tiny_timm_vit(), photo())
    png = w.png
    w.layer.set_state({"index": 0})  # a selection slider sends its index
    assert w.layer.value == 0 and w.png != png and "layer 1 of 2" in w.status.value
    png = w.png
    w.alpha.set_state({"value": 0.25})
    assert w.alpha.value == 0.25 and w.png != png
    w.rollout.set_state({"value": True})
    w.discard.set_state({"value": 19 * 0.05})
    assert 19 * 0.05 > 0.95 and w.discard.value == 0.95 and "discard 0.95" in w.status.value
    w.head.set_state({"index": 3})  # "head 1"
    assert w.head.value == 0 and "head 1" in w.status.value
    p = explore_pos_embed(tiny_timm_vit())
    p.resolution.set_state({"value": 64})
    assert p.grid == (8, 12) and len(p.row.options) == 8


class Breakable(torch.nn.Module):
    """A tiny ViT whose forward raises while ``broken`` (a model that fails on a recompute: out of memory, a
    device gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = tiny_timm_vit()
        self.broken = False
        self.vit.register_forward_pre_hook(self._check)

    def _check(self, *_) -> None:
        if self.broken:
            raise RuntimeError("the model failed")


def test_a_redraw_that_fails_leaves_the_controls_on_the_figure_shown():
    """The model raised while a new image's maps were captured: a control set directly kept its new value while the
    figure and status still showed the old view (``image_index`` 1 above image 0's overlay), and ``set()`` put the
    controls back only for a refused value, not for a failed draw. Now the controls go back to the view shown."""
    model = Breakable()
    w = explore_attention(model.vit, [photo(), photo(seed=1)])
    model.broken = True
    before = shown(w)
    with pytest.raises(RuntimeError, match="the model failed"):
        w.image_index.value = 1  # image 1's maps need a forward pass
    assert shown(w) == before
    with pytest.raises(RuntimeError, match="the model failed"):
        w.set(layer=0, image_index=1, alpha=0.3)
    assert shown(w) == before
    with pytest.raises(RuntimeError, match="the model failed"), w.hold():
        w.layer.value = 0
        w.image_index.value = 1
    assert shown(w) == before
    model.broken = False  # later changes work, and draw what they say
    w.image_index.value = 1
    assert w.image_index.value == 1 and w.png != before[0]
    np.testing.assert_allclose(w.map(), explore_attention(model.vit, photo(seed=1)).map())


def test_a_redraw_that_fails_puts_a_resolution_and_its_grid_back():
    """The position-embedding explorer resizes its row and column sliders with the resolution; a draw that fails
    at the new size puts the size, the sliders' options and the query patch back."""
    model = tiny_timm_vit()
    p = explore_pos_embed(model)
    p.set(row=3, col=1)
    before = shown(p) + (p.row.options, p.col.options)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(p), "table", lambda self: (_ for _ in ()).throw(RuntimeError("no table")))
        with pytest.raises(RuntimeError, match="no table"):
            p.resolution.value = 64
    assert shown(p) + (p.row.options, p.col.options) == before
    p.resolution.value = 64
    assert p.grid == (8, 12) and p.map().shape == (8, 12)


def test_set_ends_on_the_values_it_was_given():
    """``set(query=0, row=1)`` (the class token's row) showed patch (2, 4)'s row: the row slider's change turns the
    query into ``"patch"`` (as moving it in the browser should), after the query given was set. Every control named
    now ends at its value."""
    model = tiny_timm_vit()
    w = explore_attention(model, photo())
    w.set(query="patch")
    w.set(query=0, row=1)
    assert (w.query.value, w.row.value) == (0, 1)
    np.testing.assert_allclose(w.map(), explore_attention(model, photo()).set(query=0).map())
    w.set(row=2)  # a row alone still picks that patch
    assert (w.query.value, w.row.value) == ("patch", 2)
    p = explore_pos_embed(model)
    p.set(row=1, resolution=64)  # the row moves with the grid, then is set as given on the 8-row grid
    assert (p.grid, p.row.value) == ((8, 12), 1)


def test_inf_is_not_drawn_as_a_colour():
    """``colorize`` drew ``inf`` in the top colour (as the largest value) and ``-inf`` in the bottom one, and the
    overlay blended them over the image; they now get ``NO_VALUE`` and the image alone, as NaN does."""
    from vitviz.widgets._render import NO_VALUE, _lut, colorize, overlay

    lut = _lut("inferno")
    colours = colorize(np.array([[np.inf, 1.0], [-np.inf, 0.0]]), "inferno", 0.0, 1.0)
    assert tuple(colours[0, 0]) == NO_VALUE and tuple(colours[1, 0]) == NO_VALUE
    assert tuple(colours[0, 1]) == tuple(lut[255]) and tuple(colours[1, 1]) == tuple(lut[0])
    base = np.full((4, 4, 3), 40, np.uint8)
    out = overlay(base, np.array([[np.inf, 2.0], [-np.inf, 1.0]]), alpha=1.0, cmap="inferno")
    assert (out[:2, :2] == 40).all() and (out[2:, :2] == 40).all()  # the infinite patches: the image alone
    assert tuple(out[0, 3]) == tuple(lut[255])  # 2.0 is the top


def test_explorer_arguments_are_checked_by_name():
    """A colormap name matplotlib does not know failed with matplotlib's ``KeyError`` at the first draw, and
    ``max_scale=0`` with a bare traitlets ``TraitError`` ("setting max < min")."""
    model = tiny_timm_vit()
    with pytest.raises(UnknownNameError, match=r"cmap='nope' is not a matplotlib colormap name"):
        explore_attention(model, photo(), cmap="nope")
    with pytest.raises(UnknownNameError, match=r"cmap='nope'"):
        explore_pos_embed(model, cmap="nope")
    for bad in (0, 2.5):
        with pytest.raises(InputError, match=rf"max_scale.*{bad}"):
            explore_pos_embed(model, max_scale=bad)
    assert explore_pos_embed(model, max_scale=2).resolution.max == 64
