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


def fail_once(module: torch.nn.Module, error: type[BaseException] = RuntimeError) -> torch.utils.hooks.RemovableHandle:
    """A pre-hook on ``module`` that raises ``error`` at the first call: out of memory, or Ctrl-C (a
    ``KeyboardInterrupt`` skips even torch's ``always_call`` hooks)."""
    calls = {"n": 0}

    def hook(_m, _args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise error("CUDA out of memory (simulated)")

    return module.register_forward_pre_hook(hook)


ERRORS = pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt], ids=["error", "interrupt"])


@ERRORS
@pytest.mark.parametrize("heads", ["full", "stream"])
@pytest.mark.parametrize("entry", ["model", "forward_features"])
def test_a_retry_after_a_forward_that_raised_is_read_afresh(heads, entry, error):
    model = tiny_timm_vit(depth=3)
    x = torch.randn(2, 3, 32, 48)
    want = timm_reference(model, x[:1])
    run = model if entry == "model" else model.forward_features
    handle = fail_once(model.blocks[1], error)
    streamed: dict[int, torch.Tensor] = {}
    kwargs = dict(heads="stream", store=False, on_layer=lambda i, hm: streamed.__setitem__(i, hm.full().clone()),
                  on_abort=lambda k: None) if heads == "stream" else {}  # a dict by layer: a retry overwrites
    with torch.no_grad(), vitviz.capture_attention(model, **kwargs) as cap:
        with pytest.raises(error, match="simulated"):
            run(x)  # block 0's map was emitted, then block 1 raised
        # an interrupted pass (torch runs no hook of vitviz's as a KeyboardInterrupt passes) is dropped at the retry
        assert cap.forwards == (0 if error is RuntimeError else 1)
        run(x[:1])  # the retry, a smaller batch
        got = cap.attentions if heads == "full" else [streamed[i] for i in range(3)]
        assert cap.forwards == 1
    handle.remove()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w, atol=1e-5, rtol=1e-4)
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0


@pytest.mark.parametrize("heads", ["full", "stream"])
def test_a_block_that_caught_an_interrupted_forward_exits_cleanly(heads):
    """Ctrl-C stops a forward in block 1 and the block goes on without a retry: it exits without an error (before:
    a ``CaptureError`` for the layers the stopped pass never reached), having read no pass."""
    model = tiny_timm_vit(depth=3)
    handle = fail_once(model.blocks[1], KeyboardInterrupt)
    kwargs = dict(heads="stream", store=False, on_layer=lambda i, hm: None,
                  on_abort=lambda k: None) if heads == "stream" else {}
    with torch.no_grad(), vitviz.capture_attention(model, **kwargs) as cap:
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(1, 3, 32, 48))
    handle.remove()
    assert cap.forwards == 0
    if heads == "full":
        with pytest.raises(CaptureError, match="no forward pass"):
            cap.attentions  # noqa: B018
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


class RunningSum:
    """A reduction kept across layers, the way rollout and distance keep theirs: the sum of every map handed over."""

    def __init__(self):
        self.total, self.layers, self.aborted = 0.0, 0, []

    def __call__(self, i, attn):
        self.total += float(attn.full().sum() if hasattr(attn, "full") else attn.sum())
        self.layers += 1

    def undo(self, k):  # for the test: forget the whole pass (a real reduction keeps its layers to take back)
        self.aborted.append(k)
        self.total, self.layers = 0.0, 0


@pytest.mark.parametrize("heads", ["full", "stream"])
@pytest.mark.parametrize("failing", ["blocks.1", "blocks.2.mlp"])  # mid-pass; after the last attention layer
def test_a_retry_after_on_layer_was_handed_part_of_a_failed_pass_is_refused(heads, failing):
    """The layers a raising pass handed to on_layer sit in the caller's reduction: a retry in the same block would
    add a second pass to them, silently. It is refused, naming on_abort, the way to undo them."""
    model = tiny_timm_vit(depth=3)
    x = torch.randn(2, 3, 32, 48)
    handle = fail_once(model.get_submodule(failing))
    reduce = RunningSum()
    kwargs = dict(heads="stream", store=False) if heads == "stream" else {}
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=reduce, **kwargs):
        with pytest.raises(RuntimeError, match="simulated"):
            model(x)
        handed = 1 if failing == "blocks.1" else 3
        assert reduce.layers == handed
        with pytest.raises(CaptureError, match=rf"raised after on_layer had been handed {handed} of its layers "
                                               r"\(blocks.0.attn.*on_abort=fn"):
            model(x)
        with pytest.raises(CaptureError, match="on_abort"):  # every later pass, not only the first
            model(x)
    handle.remove()
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0


@ERRORS
@pytest.mark.parametrize("heads", ["full", "stream"])
@pytest.mark.parametrize("failing", ["blocks.1", "blocks.2.mlp"])
def test_on_abort_is_told_how_many_layers_to_undo_and_the_retry_is_read(heads, failing, error):
    model = tiny_timm_vit(depth=3)
    x = torch.randn(2, 3, 32, 48)
    clean = RunningSum()
    kwargs = dict(heads="stream", store=False) if heads == "stream" else {}
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=clean, **kwargs):
        model(x)
    handle = fail_once(model.get_submodule(failing), error)
    reduce = RunningSum()
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=reduce, on_abort=reduce.undo, **kwargs) as cap:
        with pytest.raises(error, match="simulated"):
            model(x)
        model(x)
        assert cap.forwards == 1
    handle.remove()
    assert reduce.aborted == [1 if failing == "blocks.1" else 3]  # once, though every watched module saw the error
    assert reduce.layers == 3 and reduce.total == pytest.approx(clean.total)


def test_a_pass_that_raises_before_its_first_layer_leaves_the_reduction_whole():
    """A forward that raises before any attention layer (a bad input in the patch embedding) after a finished pass
    handed nothing of its own: no on_abort call, and the next pass is read."""
    model = tiny_timm_vit(depth=2)
    x = torch.randn(1, 3, 32, 48)
    reduce = RunningSum()
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=reduce, on_abort=reduce.undo) as cap:
        model(x)
        handle = fail_once(model.patch_embed)
        with pytest.raises(RuntimeError, match="simulated"):
            model(x)
        handle.remove()
        model(x)
        assert cap.forwards == 2
    assert reduce.aborted == [] and reduce.layers == 4


def test_a_propagator_undoes_a_failed_pass_itself():
    """vitviz's Propagator carries its own on_abort (it starts afresh at each pass): a retry after a failure is read,
    and its rollout is a clean pass's."""
    from vitviz.analysis.propagation import LayerRule, Propagator

    model = tiny_timm_vit(depth=3)
    x = torch.randn(2, 3, 32, 48)
    clean = Propagator(LayerRule("rollout"))
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=clean, store=False, heads="stream"):
        model(x)
    handle = fail_once(model.blocks[2].mlp)
    prop = Propagator(LayerRule("rollout"))
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=prop, store=False, heads="stream"):
        with pytest.raises(RuntimeError, match="simulated"):
            model(x)
        assert prop.matrices == []  # undone as the pass failed
        model(x)
    handle.remove()
    torch.testing.assert_close(prop.result(), clean.result())


@pytest.mark.parametrize("failing", ["patch_embed", "blocks.0.norm1"])  # before the first layer: model, blocks
def test_a_finished_pass_is_kept_when_a_later_forward_raises_before_its_first_layer(failing):
    """accumulate=True joins every finished pass: one that a later forward's failure (before it emitted any map)
    marked failed would be replaced by the next pass, its images lost from the batch."""
    model = tiny_timm_vit(depth=2)
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad(), vitviz.capture_attention(model, accumulate=True) as cap:
        model(x[:1])
        handle = fail_once(model.get_submodule(failing))
        with pytest.raises(RuntimeError, match="simulated"):
            model(x[1:2])
        handle.remove()
        model(x[2:])
        assert cap.forwards == 2
        got = cap.attentions
    want = timm_reference(model, x[[0, 2]])
    for g, w in zip(got, want, strict=True):
        assert g.shape[0] == 2
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_on_abort_needs_on_layer_and_a_function():
    model = tiny_timm_vit(depth=2)
    for kwargs in (dict(on_abort=lambda k: None), dict(on_abort=3, on_layer=lambda i, a: None)):
        with pytest.raises(vitviz.errors.InputTypeError, match="on_abort="):
            with vitviz.capture_attention(model, **kwargs):
                pass


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
