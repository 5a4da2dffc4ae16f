"""A forward that raises inside a capture (out of memory in block 1) leaves no unfinished pass behind: a retry in
the same block is read afresh and the block exits cleanly. And every map's N is checked against the layout: a
model whose tokens are not the prefix tokens plus the input's patch grid is refused instead of misread."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit
from test_capture import hooks_everywhere, instance_forwards, timm_reference
from test_tutorial_vits import RegViT

import vitviz
from vitviz.errors import CaptureError


def fail_once(module: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    calls = {"n": 0}

    def hook(_m, _args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")

    return module.register_forward_pre_hook(hook)


@pytest.mark.parametrize("heads", ["full", "stream"])
@pytest.mark.parametrize("entry", ["model", "forward_features"])
def test_a_retry_after_a_forward_that_raised_is_read_afresh(heads, entry):
    model = tiny_timm_vit(depth=3)
    x = torch.randn(2, 3, 32, 48)
    want = timm_reference(model, x[:1])
    run = model if entry == "model" else model.forward_features
    handle = fail_once(model.blocks[1])
    streamed: dict[int, torch.Tensor] = {}
    kwargs = dict(heads="stream", store=False, on_layer=lambda i, hm: streamed.__setitem__(i, hm.full().clone())
                  ) if heads == "stream" else {}
    with torch.no_grad(), vitviz.capture_attention(model, **kwargs) as cap:
        with pytest.raises(RuntimeError, match="simulated"):
            run(x)  # block 0's map was emitted, then block 1 raised
        assert cap.forwards == 0
        run(x[:1])  # the retry, a smaller batch
        got = cap.attentions if heads == "full" else [streamed[i] for i in range(3)]
        assert cap.forwards == 1
    handle.remove()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w, atol=1e-5, rtol=1e-4)
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0


def test_a_pass_that_raised_after_every_selected_layer_is_kept():
    model = tiny_timm_vit(depth=3)
    x = torch.randn(1, 3, 32, 48)
    handle = fail_once(model.blocks[2])
    with torch.no_grad(), vitviz.capture_attention(model, layers=[0, 1]) as cap:
        with pytest.raises(RuntimeError):
            model(x)
    handle.remove()
    for g, w in zip(cap.attentions, timm_reference(model, x)[:2]):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_retry_replaces_a_pass_that_raised_after_its_last_layer(accumulate):
    """Out of memory in the last block's MLP (after every attention layer): a retry is the one pass read, never
    counted beside it nor, with accumulate=True, joined to it (the same images twice)."""
    model = tiny_timm_vit(depth=2)
    x = torch.randn(2, 3, 32, 48)
    handle = fail_once(model.blocks[1].mlp)
    with torch.no_grad(), vitviz.capture_attention(model, accumulate=accumulate) as cap:
        with pytest.raises(RuntimeError, match="simulated"):
            model(x)
        model(x)
        assert cap.forwards == 1
        got = cap.attentions
    handle.remove()
    for g, w in zip(got, timm_reference(model, x), strict=True):
        assert g.shape[0] == 2
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_a_layer_that_is_not_called_is_still_an_error():
    model = tiny_timm_vit(depth=3)
    with pytest.raises(CaptureError, match=r"produced no attention for \['blocks.2.attn'\]"):
        with torch.no_grad(), vitviz.capture_attention(model):
            tokens = model.patch_embed(torch.randn(1, 3, 32, 48))
            tokens = model._pos_embed(tokens)
            model.blocks[1](model.blocks[0](tokens))  # block 2 never runs, nothing raised
    assert hooks_everywhere(model) == 0


def test_tokens_that_do_not_match_the_layout_are_refused():
    model = RegViT(regs=4).eval()  # [cls, 4 registers, 16 patches]: N = 21
    vitviz.describe(model, prefix_tokens=("cls",), img_size=32, patch_size=8)  # the registers left out
    with pytest.raises(CaptureError, match=r"RegViT \(RegViT\): blocks.0.attn attended over N=21 tokens, but its "
                                           r"layout is 1 prefix tokens \('cls',\) \+ a 4x4 patch grid = 17"):
        with torch.no_grad(), vitviz.capture_attention(model):
            model(torch.randn(1, 3, 32, 32))
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0


def test_dynamic_models_are_checked_against_the_input_grid():
    model = tiny_timm_vit(dynamic_img_size=True, reg_tokens=2, no_embed_class=True)
    spec = vitviz.inspect(model)
    for size in ((32, 48), (40, 16)):
        x = torch.randn(1, 3, *size)
        with torch.no_grad(), vitviz.capture_attention(model) as cap:
            model(x)
        gh, gw = spec.grid_for_input(x)
        assert cap.attentions[0].shape[-1] == 3 + gh * gw
