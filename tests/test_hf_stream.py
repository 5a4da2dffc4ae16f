"""The Hugging Face stream probe (``vitviz.core.families.hf_probes``): under ``heads="stream"`` the model keeps its
SDPA attention (output bit for bit the plain forward's) and the maps recomputed from its query and key equal the
model's own eager ``output_attentions``; every family, both paths (recomputed, explicit), nested captures, and the
model left as it was. The kernels' side (CUDA and Triton's interpreter) is in ``test_headmap_kernel.py``."""

from __future__ import annotations

import pytest
import torch
from hf_models import HF_CASES, hf_case
from test_capture import hooks_everywhere, instance_forwards

import vitviz
from vitviz.core.capture import HeadMaps
from vitviz.core.families import family_of, hf_probes, stream
from vitviz.core.families.hf_base import HFVisionFamily, vision_config

pytest.importorskip("transformers")

PATHS = {"recomputed": 0, "explicit": 1 << 62}  # stream.EXPLICIT_BELOW_BYTES for each path


def impls(model):
    return model.config._attn_implementation, vision_config(model)._attn_implementation


def stream_capture(model, run, x, kinds=None):
    got: dict[int, torch.Tensor] = {}

    def keep(i, hm):
        assert isinstance(hm, HeadMaps)
        if kinds is not None:
            kinds.append(hm._head.__qualname__)
        got[i] = torch.stack([m.float().clone() for _, m in hm.heads()], dim=1)

    with torch.no_grad(), vitviz.capture_attention(model, on_layer=keep, store=False, heads="stream"):
        out = run(model, x)
    return [got[i] for i in sorted(got)], out


def left_clean(model):
    assert impls(model) == ("sdpa", "sdpa")
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0
    assert not hf_probes._original and not len(hf_probes._listeners) and not len(hf_probes._weights)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", HF_CASES)
def test_stream_maps_equal_eager_output_attentions(name, path, monkeypatch):
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", PATHS[path])
    case = hf_case(name)
    model, x = case.model, case.x
    probe = hf_probes.probe_hf_per_call_stream if case.extra.get("per_call") else hf_probes.probe_hf_stream
    assert family_of(model).stream_probe(family_of(model).attention_modules(model)[0][1]) is probe
    with torch.no_grad():
        plain = case.run(model, x)
    kinds: list[str] = []
    got, out = stream_capture(model, case.run, x, kinds)
    want = case.reference(model, x)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape
        # recomputed: float32 scores formed in another order than eager's (scale before the product), ~1e-7
        assert float((g - w).abs().max()) <= (1e-6 if path == "recomputed" else 0.0)
    if path == "recomputed":
        assert kinds and all(k.startswith("recomputed_heads.") for k in kinds)
        if name != "vit-mae":  # ViTMAE runs unmasked inside any capture
            assert torch.equal(out, plain)  # SDPA ran: not one bit of the output changed
    else:
        assert kinds and not any("recomputed_heads" in k for k in kinds)
    left_clean(model)


@pytest.mark.parametrize("name", ["vit", "vit-msn", "ijepa", "dinov3", "metaclip2-classifier", "chinese-clip-model",
                                  "altclip-vision", "data2vec-relative", "data2vec-shared-abs"])
def test_a_broken_recomputation_is_caught(name, monkeypatch):
    """The comparison above fails when the recomputation is wrong (here: the scale 5% off, which moves the tiny
    models' probabilities by ~1e-4, about a hundred times the tolerance of 1e-6), also on the families added last
    (ViTMSN, I-JEPA without a class token, DINOv3's rotated queries and keys, the CLIP-built towers, data2vec vision's
    own stream probe)."""
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    case = hf_case(name)
    original = stream.recomputed_heads
    monkeypatch.setattr(stream, "recomputed_heads", lambda q, k, scale, *a, **kw: original(q, k, scale * 1.05, *a, **kw))
    got, _ = stream_capture(case.model, case.run, case.x)
    assert max(float((g - w).abs().max()) for g, w in zip(got, case.reference(case.model, case.x))) > 1e-5


def test_reductions_read_the_same_maps_as_without_the_stream_probe(monkeypatch):
    """Rollout and mean attention distance through the stream probe equal the same analyses of the eager maps."""
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    for name in ("vit", "beit-relative", "dinov2-registers"):
        case = hf_case(name)
        model, x = case.model, case.x
        with vitviz.headmap_kernel("off"):
            got = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
            with monkeypatch.context() as m:
                m.setattr(HFVisionFamily, "stream_probe", staticmethod(lambda module: None))  # eager, wrapped
                want = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
        assert got[0].shape == (2, *case.grid)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
        left_clean(model)


def test_a_full_capture_inside_a_stream_capture_gets_eager_weights(monkeypatch):
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    case = hf_case("beit-relative")
    model, x = case.model, case.x
    want = case.reference(model, x)
    outer: list[HeadMaps] = []
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=lambda i, hm: outer.append(hm.full().clone()),
                                                   store=False, heads="stream"):
        assert vision_config(model)._attn_implementation == hf_probes.NAME
        with vitviz.capture_attention(model) as inner:
            case.run(model, x)
        assert vision_config(model)._attn_implementation == hf_probes.NAME and not len(hf_probes._weights)
    for got in (inner.attentions, outer):
        assert len(got) == 2
        for g, w in zip(got, want):
            assert float((g.float() - w).abs().max()) == 0.0  # both read the eager weights of that pass
    left_clean(model)


def test_a_stream_capture_inside_a_full_capture_wraps_the_eager_weights(monkeypatch):
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    case = hf_case("vit")
    model, x = case.model, case.x
    kinds: list[str] = []
    with torch.no_grad(), vitviz.capture_attention(model) as outer:
        got, _ = stream_capture(model, case.run, x, kinds)
        assert impls(model) == ("eager", "eager")
    assert kinds and not any("recomputed_heads" in k for k in kinds)  # no stream probe on an eager config
    for g, w, o in zip(got, case.reference(model, x), outer.attentions):
        assert float((g - w).abs().max()) == 0.0 and float((o - w).abs().max()) == 0.0
    left_clean(model)


def test_a_model_on_eager_attention_gets_no_stream_probe():
    case = hf_case("dinov2")
    model = case.model
    model.set_attn_implementation("eager")
    module = family_of(model).attention_modules(model)[0][1]
    assert family_of(model).stream_probe(module) is None
    got, _ = stream_capture(model, case.run, case.x)
    for g, w in zip(got, case.reference(model, case.x)):
        assert float((g - w).abs().max()) == 0.0
    assert model.config._attn_implementation == "eager" and not hf_probes._original


def test_the_implementation_comes_back_when_the_body_raises(monkeypatch):
    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)
    case = hf_case("clip-model")  # the vision config is switched, the text config never
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), vitviz.capture_attention(
            case.model, on_layer=lambda i, hm: None, store=False, heads="stream"):
        assert vision_config(case.model)._attn_implementation == hf_probes.NAME
        assert case.model.config.text_config._attn_implementation == "sdpa"
        case.run(case.model, case.x)
        raise RuntimeError("boom")
    left_clean(case.model)
    with torch.no_grad():  # and the model runs as before, on SDPA
        case.run(case.model, case.x)


@pytest.mark.parametrize("kinds", [("stream", "full"), ("full", "stream"), ("stream", "full", "full"),
                                   ("stream", "stream", "full"), ("full", "stream", "full"),
                                   ("stream", "full", "stream")])
def test_nested_captures_close_in_any_order(kinds, monkeypatch):
    import itertools

    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)  # the stream probe recomputes where it runs
    case = hf_case("vit")
    model, x = case.model, case.x
    want = case.reference(model, x)  # the model's own eager output_attentions
    for order in itertools.permutations(range(len(kinds))):
        seen: list[list[torch.Tensor]] = [[] for _ in kinds]
        managers, caps = [], []
        for i, kind in enumerate(kinds):
            if kind == "stream":
                keep = seen[i]
                cm = vitviz.capture_attention(model, on_layer=lambda _l, hm, keep=keep: keep.append(hm.full().clone()),
                                              store=False, heads="stream")
            else:
                cm = vitviz.capture_attention(model)
            managers.append(cm)
            caps.append(cm.__enter__())
        open_ = set(range(len(kinds)))
        for closing in order:
            with torch.no_grad():
                case.run(model, x)
            for i in open_:  # every capture still open reads this pass exactly
                got = caps[i].attentions if kinds[i] == "full" else seen[i][-2:]
                assert len(got) == 2
                for g, w in zip(got, want):  # eager weights, or recomputed from q and k (a stream capture alone)
                    torch.testing.assert_close(g.float(), w, rtol=1e-5, atol=1e-6)
            managers[closing].__exit__(None, None, None)
            open_.discard(closing)
        left_clean(model)
        assert not hf_probes._users
