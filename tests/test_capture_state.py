"""Several captures open at once on one model: any exit order restores the model, every open capture sees every pass."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit
from torch import nn

import vitviz
from vitviz.core.capture import open_probes


def snapshot(model: nn.Module) -> dict:
    """Everything a capture may touch: flags, hooks, instance forwards, HF attention implementation, weights."""
    config = getattr(model, "config", None)
    return {
        "fused": [getattr(m, "fused_attn", None) for m in model.modules()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()],
        "forwards": [("forward" in vars(m)) for m in model.modules()],
        "attn_impl": getattr(config, "_attn_implementation", None),
        "state": {k: v.clone() for k, v in model.state_dict().items()},
    }


def assert_same(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k != "state"} == {k: v for k, v in b.items() if k != "state"}
    assert all(torch.equal(v, b["state"][k]) for k, v in a["state"].items())


def tiny_torchvision_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32,
                             mlp_dim=64, num_classes=7).eval()


def tiny_hf_vit(impl: str = "sdpa") -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=64, num_labels=3)
    model = transformers.ViTForImageClassification(config).eval()
    model.config._attn_implementation = impl
    return model


MODELS = {
    "timm": (lambda: tiny_timm_vit(depth=3), lambda: torch.randn(2, 3, 32, 48)),
    "torchvision": (tiny_torchvision_vit, lambda: torch.randn(2, 3, 32, 32)),
    "huggingface": (tiny_hf_vit, lambda: torch.randn(2, 3, 32, 32)),
}


def run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(pixel_values=x) if hasattr(model, "config") else model(x)
    return out.logits if hasattr(out, "logits") else out


@pytest.fixture(params=list(MODELS))
def model_and_input(request):
    build, make_x = MODELS[request.param]
    return build(), make_x()


@pytest.mark.parametrize("order", ["lifo", "fifo"])
def test_two_open_captures_see_every_pass_and_restore_in_any_exit_order(model_and_input, order):
    model, x = model_and_input
    before = snapshot(model)
    with torch.no_grad():
        reference = run(model, x)
        first = vitviz.capture_attention(model)
        a = first.__enter__()
        run(model, x)
        second = vitviz.capture_attention(model, layers=[0, -1])
        b = second.__enter__()
        run(model, x)
        (second if order == "lifo" else first).__exit__(None, None, None)
        # the capture still open keeps probing: it sees the pass after the other one closed
        run(model, 2 * x)
        (first if order == "lifo" else second).__exit__(None, None, None)
    # each saw every pass run while it was open; the one open last saw the 2 x pass
    assert (a.forwards, b.forwards) == ((3, 1) if order == "lifo" else (2, 2))
    last, other = (a, b) if order == "lifo" else (b, a)
    with torch.no_grad(), vitviz.capture_attention(model) as fresh:
        run(model, 2 * x)
    want = fresh.attentions if last is a else [fresh.attentions[0], fresh.attentions[-1]]
    for got, ref in zip(last.attentions, want):
        torch.testing.assert_close(got, ref)
    assert not torch.allclose(other.attentions[0], fresh.attentions[0])  # it closed before the 2 x pass
    assert_same(snapshot(model), before)
    assert open_probes(model) == 0
    with torch.no_grad():
        torch.testing.assert_close(run(model, x), reference, atol=0, rtol=0)


def test_non_lifo_exit_leaves_timm_fused_attention_on_and_the_open_capture_working():
    model, x = tiny_timm_vit(), torch.randn(1, 3, 32, 48)
    first = vitviz.capture_attention(model)
    a = first.__enter__()
    second = vitviz.capture_attention(model)
    b = second.__enter__()
    first.__exit__(None, None, None)  # the first one opened exits first (a cell closes it)
    assert not any(blk.attn.fused_attn for blk in model.blocks), "the open capture still needs the explicit path"
    with torch.no_grad():
        model(x)
    assert b.forwards == 1 and len(b.attentions) == 2
    with pytest.raises(vitviz.CaptureError, match="no forward pass"):
        a.attentions  # noqa: B018  (it closed before the pass)
    second.__exit__(None, None, None)
    assert all(blk.attn.fused_attn for blk in model.blocks)


def test_nested_captures_with_an_exception_inside_restore_everything(model_and_input):
    model, x = model_and_input
    before = snapshot(model)
    with pytest.raises(ZeroDivisionError):
        with torch.no_grad(), vitviz.capture_attention(model) as outer:
            with vitviz.capture_attention(model, layers=0) as inner:
                run(model, x)
                raise ZeroDivisionError("body failed")
    assert outer.forwards == 1 and inner.forwards == 1
    assert_same(snapshot(model), before)
    assert open_probes(model) == 0


def test_huggingface_shared_config_stays_eager_until_the_last_capture_exits():
    model, x = tiny_hf_vit("sdpa"), torch.randn(1, 3, 32, 32)
    first = vitviz.capture_attention(model, layers=[0, 1])
    a = first.__enter__()
    second = vitviz.capture_attention(model, layers=[1, 2])
    b = second.__enter__()
    first.__exit__(None, None, None)  # layers 0 and 1's first subscriber leaves; layer 2 still needs eager
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        model(pixel_values=x)
    assert b.forwards == 1 and a.forwards == 0
    second.__exit__(None, None, None)
    assert model.config._attn_implementation == "sdpa"


def test_captures_on_two_models_are_independent():
    m1, m2, x = tiny_timm_vit(), tiny_timm_vit(), torch.randn(1, 3, 32, 48)
    with torch.no_grad(), vitviz.capture_attention(m1) as c1, vitviz.capture_attention(m2) as c2:
        m1(x)
    assert c1.forwards == 1 and c2.forwards == 0
    assert open_probes(m1) == open_probes(m2) == 0


def tiny_data2vec(impl: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.Data2VecVisionConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64, num_labels=3,
                                               use_relative_position_bias=True)
    return transformers.Data2VecVisionForImageClassification._from_config(config, attn_implementation=impl).eval()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("first", ["full", "stream"])
@pytest.mark.parametrize("order", ["lifo", "fifo"])
def test_a_full_and_a_stream_capture_of_data2vec_both_read_and_restore_in_any_order(order, first, impl):
    """data2vec vision's attention is read through a forward set on the instance (its older module layout). With a
    ``heads="full"`` and a ``heads="stream"`` capture open at once, both see the pass and get the same maps, and the
    instance has no forward of vitviz's left whichever closes first (seen before: the capture opened first saw no
    pass, and closing it first left the other's forward on every attention module)."""
    model, x = tiny_data2vec(impl), torch.randn(2, 3, 32, 32)
    attention = [m for name, m in model.named_modules() if name.endswith("attention.attention")]
    assert len(attention) == 2 and ("Sdpa" in type(attention[0]).__name__) == (impl == "sdpa")
    before = snapshot(model)
    streamed: dict[int, torch.Tensor] = {}
    opened = {"full": lambda: vitviz.capture_attention(model),
              "stream": lambda: vitviz.capture_attention(
                  model, heads="stream", store=False,
                  on_layer=lambda i, maps: streamed.__setitem__(i, torch.stack([m for _, m in maps.heads()], 1)))}
    with torch.no_grad():
        reference = run(model, x)
        a = opened[first]()
        got_a = a.__enter__()
        b = opened["stream" if first == "full" else "full"]()
        got_b = b.__enter__()
        assert all("forward" in vars(m) for m in attention)
        torch.testing.assert_close(run(model, x), reference)
        (b if order == "lifo" else a).__exit__(None, None, None)
        (a if order == "lifo" else b).__exit__(None, None, None)
    assert got_a.forwards == got_b.forwards == 1
    full = got_a if first == "full" else got_b
    assert sorted(streamed) == [0, 1]
    for i, maps in enumerate(full.attentions):
        torch.testing.assert_close(streamed[i], maps)
    assert not any("forward" in vars(m) for m in attention)
    assert_same(snapshot(model), before)
    assert open_probes(model) == 0
    with torch.no_grad():
        torch.testing.assert_close(run(model, x), reference, atol=0, rtol=0)


@pytest.mark.parametrize("error", [RuntimeError("user hook"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_a_stream_pass_stopped_in_a_timm_attention_then_a_full_capture_closed_last_restores_fused_attention(error):
    """A ``heads="stream"`` capture's explicit call switches ``fused_attn`` off for the call; a call stopped inside
    the attention keeps it off until the capture's next call or exit. A ``heads="full"`` capture opened then and
    closed last still reads the next pass, and leaves ``fused_attn`` as the user had it (seen before: block 0 came
    back ``False``, and the full capture found no map for it once the stream capture had closed)."""
    model, x = tiny_timm_vit(), torch.randn(1, 3, 32, 48)
    model.blocks[1].attn.fused_attn = False  # the user's: stays off
    before = snapshot(model)

    def stop(*_):
        raise error

    streamed = vitviz.capture_attention(model, heads="stream", on_layer=lambda i, maps: None, store=False)
    streamed.__enter__()
    handle = model.blocks[0].attn.attn_drop.register_forward_hook(stop)
    with torch.no_grad(), pytest.raises(type(error)):
        model(x)
    handle.remove()
    full = vitviz.capture_attention(model)
    cap = full.__enter__()
    streamed.__exit__(None, None, None)
    with torch.no_grad():
        model(x)
    assert cap.forwards == 1 and len(cap.attentions) == 2
    full.__exit__(None, None, None)
    assert [blk.attn.fused_attn for blk in model.blocks] == [True, False]
    assert_same(snapshot(model), before)
    assert open_probes(model) == 0
