"""The explorers' in-memory caches serve the model's weights as they are now: after a change of the weights (an
optimizer step, ``load_state_dict``, an in-place edit, a replaced parameter) the next view equals that of an
explorer built fresh on the changed model (``vitviz.core.contexts.WeightsWatch``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit

pytest.importorskip("ipywidgets")

import vitviz  # noqa: E402
from vitviz.core.contexts import WeightsWatch  # noqa: E402

PHOTO = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)


def _edit_in_place(model):
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.add_(1.0)


def _optimizer_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(1))).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _load_state_dict(model):
    other = tiny_timm_vit(depth=2)
    model.load_state_dict(other.state_dict())


def _replace_parameter(model):
    qkv = model.blocks[0].attn.qkv
    qkv.weight = torch.nn.Parameter(qkv.weight.detach() * 3)


def _assign_data(model):
    qkv = model.blocks[0].attn.qkv
    qkv.weight.data = qkv.weight.data * 3


CHANGES = {"in_place": _edit_in_place, "optimizer_step": _optimizer_step, "load_state_dict": _load_state_dict,
           "replace_parameter": _replace_parameter, "assign_data": _assign_data}


@pytest.mark.parametrize("rollout", [False, True], ids=["attention", "rollout"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_attention_explorer_shows_the_changed_weights(change, rollout):
    torch.manual_seed(0)
    model = tiny_timm_vit(depth=2)
    w = vitviz.explore_attention(model, PHOTO)
    w.set(layer=0, rollout=rollout)
    before = w.map().copy()
    CHANGES[change](model)
    w.set(layer=1)  # the slider moves
    w.set(layer=0)
    fresh = vitviz.explore_attention(model, PHOTO)
    fresh.set(layer=0, rollout=rollout)
    assert not np.array_equal(fresh.map(), before)  # the change shows in the maps
    np.testing.assert_array_equal(w.map(), fresh.map())
    assert w.png == fresh.png


def test_an_unchanged_model_is_not_captured_again():
    model = tiny_timm_vit(depth=2)
    w = vitviz.explore_attention(model, PHOTO)
    for layer in (0, 1, 0):
        w.set(layer=layer)
    assert w.forwards == 1
    _edit_in_place(model)
    w.set(layer=1)
    assert w.forwards == 2


def test_the_explorer_keeps_its_own_copy_of_the_image():
    """An image tensor edited in place after the explorer was built: the maps stay those of the picture shown."""
    model = tiny_timm_vit(depth=2)
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    w = vitviz.explore_attention(model, x)
    want = w.map().copy()
    x.mul_(-1)
    w.cache.clear()
    np.testing.assert_array_equal(w.map(), want)


def _shift_pos_embed(model):
    with torch.no_grad():
        model.pos_embed.add_(torch.randn(model.pos_embed.shape, generator=torch.Generator().manual_seed(2)))


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_pos_embed_explorer_shows_the_changed_table(change):
    torch.manual_seed(0)
    model = tiny_timm_vit(depth=2)
    w = vitviz.explore_pos_embed(model, size=32)
    before = w.map().copy()
    {**CHANGES, "in_place": _shift_pos_embed,
     "replace_parameter": lambda m: setattr(m, "pos_embed", torch.nn.Parameter(m.pos_embed.detach().flip(1))),
     "assign_data": lambda m: setattr(m.pos_embed, "data", m.pos_embed.data.flip(1))}[change](model)
    w.set(row=0)
    w.set(row=w.grid[0] // 2)
    fresh = vitviz.explore_pos_embed(model, size=32)
    assert not np.array_equal(fresh.map(), before)
    np.testing.assert_array_equal(w.map(), fresh.map())
    assert w.png == fresh.png


def test_the_watch_sees_each_kind_of_change():
    model = tiny_timm_vit(depth=2)
    watch = WeightsWatch(model)
    assert not watch.changed()
    for change in CHANGES.values():
        change(model)
        assert watch.changed()
        assert not watch.changed()  # each call looks anew
    model.register_buffer("extra", torch.zeros(1))
    assert watch.changed()


def test_a_colormap_registered_again_under_its_name_is_drawn_as_it_is_now():
    import matplotlib
    from matplotlib.colors import ListedColormap

    from vitviz.widgets._render import colorize

    name = "vitviz-test-recoloured"
    values = np.linspace(0, 1, 6).reshape(2, 3)
    matplotlib.colormaps.register(ListedColormap(["black", "white"], name=name), force=True)
    try:
        first = colorize(values, name, 0.0, 1.0)
        with pytest.warns(UserWarning, match="Overwriting"):
            matplotlib.colormaps.register(ListedColormap(["red", "blue"], name=name), force=True)
        second = colorize(values, name, 0.0, 1.0)
    finally:
        matplotlib.colormaps.unregister(name)
    assert (first[..., 0] == first[..., 1]).all()  # grey
    np.testing.assert_array_equal(second[0, 0], [255, 0, 0])
    np.testing.assert_array_equal(second[-1, -1], [0, 0, 255])
