"""capture_attention: equals attention recomputed by hand, leaves no trace, works for every family."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import timm
import torch
from conftest import tiny_timm_vit
from torch import nn
from tutorial_vit import OddViT, TutorialViT

import vitviz
from vitviz.errors import CaptureError


def softmax_attention(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Independent reference: ``softmax(q k^T * scale)`` over the last axis, in float64."""
    scores = torch.einsum("bhnd,bhmd->bhnm", q.double(), k.double()) * scale
    return torch.softmax(scores, dim=-1)


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = t.shape
    return t.reshape(b, n, heads, d // heads).transpose(1, 2)


@contextlib.contextmanager
def record_inputs(modules: list[nn.Module]) -> Iterator[list[torch.Tensor]]:
    """Record each module's first positional input (what its attention sees); the hooks go on exit."""
    seen: list[torch.Tensor] = []
    handles = [m.register_forward_pre_hook(lambda _m, args, kw=None: seen.append(args[0].detach()))
               for m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def hooks_everywhere(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def instance_forwards(model: nn.Module) -> int:
    return sum("forward" in vars(m) for m in model.modules())


def timm_reference(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    attns = [b.attn for b in model.blocks]
    with record_inputs(attns) as seen, torch.no_grad():
        model(x)
    out = []
    for a, inp in zip(attns, seen):
        q, k, _ = a.qkv(inp).reshape(inp.shape[0], inp.shape[1], 3, a.num_heads, -1).permute(2, 0, 3, 1, 4)
        out.append(softmax_attention(q, k, a.scale).float())
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # 4x6 non-square grid, class token
        {"class_token": False, "global_pool": "avg"},
        {"reg_tokens": 4, "no_embed_class": True},
    ],
    ids=["cls", "no-cls", "registers"],
)
def test_timm_capture_equals_attention_from_qkv(kwargs):
    model = tiny_timm_vit(**kwargs)
    x = torch.randn(3, 3, 32, 48)
    ref = timm_reference(model, x)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    spec = vitviz.inspect(model)
    assert len(cap.attentions) == len(ref) == 2
    for got, want in zip(cap.attentions, ref):
        assert got.shape == (3, 2, spec.num_tokens, spec.num_tokens)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]), atol=1e-5, rtol=0)


def test_qk_norm_model_is_captured():
    model = tiny_timm_vit(qk_norm=True)
    x = torch.randn(2, 3, 32, 48)
    attns = [b.attn for b in model.blocks]
    with record_inputs(attns) as seen, torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    for a, inp, got in zip(attns, seen, cap.attentions):
        q, k, _ = a.qkv(inp).reshape(2, inp.shape[1], 3, 2, -1).permute(2, 0, 3, 1, 4)
        want = softmax_attention(a.q_norm(q), a.k_norm(k), a.scale).float()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_fused_model_outputs_unchanged_and_no_trace_left(timm_vit):
    assert all(b.attn.fused_attn for b in timm_vit.blocks), "timm builds fused attention by default"
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        before = timm_vit(x)
        state = {k: v.clone() for k, v in timm_vit.state_dict().items()}
        with vitviz.capture_attention(timm_vit) as cap:
            assert not any(b.attn.fused_attn for b in timm_vit.blocks), "explicit path switched on inside"
            inside = timm_vit(x)
        after = timm_vit(x)
    torch.testing.assert_close(inside, before, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert all(b.attn.fused_attn for b in timm_vit.blocks)
    assert hooks_everywhere(timm_vit) == 0
    assert all(torch.equal(v, state[k]) for k, v in timm_vit.state_dict().items())
    assert not timm_vit.training
    assert len(cap.attentions) == 2


def test_flags_and_hooks_restored_after_exception(timm_vit):
    timm_vit.blocks[1].attn.fused_attn = False  # a mixed starting state must come back exactly
    with pytest.raises(ZeroDivisionError):
        with vitviz.capture_attention(timm_vit):
            timm_vit(torch.randn(1, 3, 32, 48))
            raise ZeroDivisionError("body failed")
    assert [b.attn.fused_attn for b in timm_vit.blocks] == [True, False]
    assert hooks_everywhere(timm_vit) == 0


def test_existing_user_hooks_survive(timm_vit):
    calls = []
    h = timm_vit.blocks[0].attn.attn_drop.register_forward_hook(lambda *a: calls.append(1))
    with vitviz.capture_attention(timm_vit):
        timm_vit(torch.randn(1, 3, 32, 48))
    timm_vit.blocks[0].attn.fused_attn = False
    timm_vit(torch.randn(1, 3, 32, 48))
    assert len(calls) == 2 and len(timm_vit.blocks[0].attn.attn_drop._forward_hooks) == 1
    h.remove()


def test_layer_selection_by_index_and_pattern():
    model = tiny_timm_vit(depth=4)
    x = torch.randn(1, 3, 32, 48)
    with vitviz.capture_attention(model) as full:
        model(x)
    with vitviz.capture_attention(model, layers=[-1, 1]) as some:
        model(x)
    assert some.layer_names == ["blocks.1.attn", "blocks.3.attn"]
    torch.testing.assert_close(some.attentions[0], full.attentions[1])
    torch.testing.assert_close(some.attentions[1], full.attentions[3])
    with vitviz.capture_attention(model, layers="blocks.[23].attn") as pat:
        model(x)
    assert pat.layer_names == ["blocks.2.attn", "blocks.3.attn"]
    with pytest.raises(vitviz.errors.InputError, match="matches no attention module"):
        with vitviz.capture_attention(model, layers="nope*"):
            pass
    with pytest.raises(IndexError, match="4 attention layers"):
        with vitviz.capture_attention(model, layers=7):
            pass
    assert hooks_everywhere(model) == 0


def test_on_layer_streams_in_order_without_storing(timm_vit):
    seen = []
    with vitviz.capture_attention(timm_vit, on_layer=lambda i, a: seen.append((i, a.shape)), store=False) as cap:
        timm_vit(torch.randn(2, 3, 32, 48))
        timm_vit(torch.randn(1, 3, 32, 48))
    assert [i for i, _ in seen] == [0, 1, 0, 1]
    assert seen[0][1] == (2, 2, 25, 25) and seen[2][1] == (1, 2, 25, 25)
    assert cap.forwards == 2
    with pytest.raises(CaptureError, match="store=False"):
        _ = cap.attentions


def test_last_forward_kept_or_accumulated(timm_vit):
    a, b = torch.randn(2, 3, 32, 48), torch.randn(3, 3, 32, 48)
    with vitviz.capture_attention(timm_vit) as last:
        timm_vit(a)
        timm_vit(b)
    with vitviz.capture_attention(timm_vit, accumulate=True) as acc:
        timm_vit(a)
        timm_vit(b)
    assert last.attentions[0].shape[0] == 3
    assert acc.attentions[0].shape[0] == 5
    torch.testing.assert_close(acc.attentions[0][2:], last.attentions[0])


def test_no_forward_is_a_clear_error(timm_vit):
    with vitviz.capture_attention(timm_vit) as cap:
        pass
    with pytest.raises(CaptureError, match="no forward pass"):
        _ = cap.attentions


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models(dtype):
    try:
        torch.nn.functional.layer_norm(torch.ones(1, 2, dtype=dtype), (2,))
    except RuntimeError:  # torch < 2.3 has no float16 LayerNorm on the CPU
        pytest.skip(f"this torch ({torch.__version__}) has no {dtype} LayerNorm on the CPU")
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    ref = timm_reference(model, x)
    model = model.to(dtype)
    with torch.no_grad(), vitviz.capture_attention(model, dtype=torch.float32) as cap:
        model(x.to(dtype))
    assert all(b.attn.fused_attn for b in model.blocks)
    for got, want in zip(cap.attentions, ref):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]), atol=2e-2, rtol=0)
        torch.testing.assert_close(got, want, atol=3e-2, rtol=0)


def test_deit_distilled_two_prefix_tokens():
    model = timm.create_model("deit_tiny_distilled_patch16_224", img_size=(32, 64)).eval()
    spec = vitviz.inspect(model)
    assert spec.prefix_tokens == ("cls", "dist") and spec.grid_size == (2, 4)
    x = torch.randn(1, 3, 32, 64)
    ref = timm_reference(model, x)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    assert cap.attentions[0].shape == (1, 3, 10, 10)
    torch.testing.assert_close(cap.attentions[-1], ref[-1], atol=1e-5, rtol=1e-4)


def test_dynamic_img_size_captures_other_sizes():
    model = tiny_timm_vit(dynamic_img_size=True)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(torch.randn(1, 3, 64, 40))
    assert cap.attentions[0].shape == (1, 2, 1 + 8 * 5, 1 + 8 * 5)


@pytest.mark.parametrize("second", [(48, 32), (32, 32)])
def test_accumulating_passes_of_another_grid_is_refused(second):
    """``accumulate=True`` concatenates passes along the batch: a ``dynamic_img_size`` model's passes at two grids
    would make one batch no grid reads (48x32 after 32x48: the same N, the grid transposed), so the second pass is
    refused, naming the two grids; passes of one grid still accumulate."""
    model = tiny_timm_vit(img_size=32, dynamic_img_size=True)
    gh, gw = second[0] // 8, second[1] // 8
    with torch.no_grad(), vitviz.capture_attention(model, accumulate=True) as cap:
        model(torch.randn(1, 3, 32, 48))
        model(torch.randn(2, 3, 32, 48))
        with pytest.raises(CaptureError, match=rf"accumulate=True.*a {gh}x{gw} patch grid \(N={1 + gh * gw}\).*"
                                               r"a 4x6 patch grid \(N=25\).*one capture per input size"):
            model(torch.randn(1, 3, *second))
    assert cap.forwards == 2 and cap.attentions[0].shape == (3, 2, 25, 25)
    with torch.no_grad(), vitviz.capture_attention(model) as last:  # the last pass only: any size
        model(torch.randn(1, 3, 32, 48))
        model(torch.randn(1, 3, *second))
    assert last.attentions[0].shape == (1, 2, 1 + gh * gw, 1 + gh * gw)


def test_hybrid_tiny_r_s16_p8():
    model = timm.create_model("vit_tiny_r_s16_p8_224").eval()
    spec = vitviz.inspect(model)
    assert spec.hybrid and spec.patch_size == (32, 32) and spec.grid_size == (7, 7)
    x = torch.randn(1, 3, 224, 224)
    ref = timm_reference(model, x)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    torch.testing.assert_close(cap.attentions[3], ref[3], atol=1e-5, rtol=1e-4)


def test_torchvision_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32,
                              mlp_dim=64, num_classes=7).eval()
    spec = vitviz.inspect(model)
    assert (spec.family, spec.grid_size, spec.prefix_tokens, spec.num_heads) == ("torchvision", (4, 4), ("cls",), 4)
    x = torch.randn(2, 3, 32, 32)
    mhas = [layer.self_attention for layer in model.encoder.layers]
    lns = [layer.ln_1 for layer in model.encoder.layers]
    with record_inputs(mhas) as seen, torch.no_grad():
        before = model(x)
        with vitviz.capture_attention(model) as cap:
            inside = model(x)
    torch.testing.assert_close(inside, before, atol=1e-5, rtol=1e-5)
    assert instance_forwards(model) == 0 and hooks_everywhere(model) == 0
    for mha, inp, got in zip(mhas, seen[:2], cap.attentions):
        qkv = torch.nn.functional.linear(inp, mha.in_proj_weight, mha.in_proj_bias)
        q, k, _ = (split_heads(t, 4) for t in qkv.chunk(3, dim=-1))
        torch.testing.assert_close(got, softmax_attention(q, k, 8 ** -0.5).float(), atol=1e-5, rtol=1e-4)
    assert len(lns) == 2


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_huggingface_vit_any_attention_implementation(impl):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=3)
    model = transformers.ViTForImageClassification(config).eval()
    model.config._attn_implementation = impl
    spec = vitviz.inspect(model)
    assert (spec.family, spec.grid_size, spec.num_tokens) == ("huggingface", (4, 4), 17)
    layers = model.vit.layers if hasattr(model.vit, "layers") else model.vit.encoder.layer
    attns = [layer.attention for layer in layers]
    x = torch.randn(2, 3, 32, 32)
    with record_inputs(attns) as seen, torch.no_grad():
        before = model(pixel_values=x).logits
        with vitviz.capture_attention(model) as cap:
            inside = model(pixel_values=x).logits
    assert model.config._attn_implementation == impl
    torch.testing.assert_close(inside, before, atol=1e-5, rtol=1e-5)
    for a, inp, got in zip(attns, seen, cap.attentions):
        qp, kp = (a.q_proj, a.k_proj) if hasattr(a, "q_proj") else (a.attention.query, a.attention.key)  # < 5.2
        q, k = split_heads(qp(inp), 4), split_heads(kp(inp), 4)
        torch.testing.assert_close(got, softmax_attention(q, k, 8 ** -0.5).float(), atol=1e-5, rtol=1e-4)
    assert hooks_everywhere(model) == 0


@pytest.mark.parametrize("with_dropout_module", [True, False], ids=["attn_drop", "qkv-recompute"])
def test_tutorial_vit(with_dropout_module):
    model = TutorialViT(with_dropout_module=with_dropout_module).eval()
    spec = vitviz.inspect(model)
    assert (spec.family, spec.grid_size, spec.prefix_tokens, spec.pos_embed_covers_prefix) == (
        "tutorial", (4, 4), ("cls",), True)
    x = torch.randn(2, 3, 32, 32)
    attns = [b.attn for b in model.blocks]
    with record_inputs(attns) as seen, torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    for a, inp, got in zip(attns, seen, cap.attentions):
        q, k, _ = a.qkv(inp).reshape(2, 17, 3, 2, 16).permute(2, 0, 3, 1, 4)
        torch.testing.assert_close(got, softmax_attention(q, k, a.scale).float(), atol=1e-5, rtol=1e-4)
    assert hooks_everywhere(model) == 0


def test_described_custom_vit():
    model = OddViT().eval()
    with pytest.raises(vitviz.NotAViTError, match="describe"):
        vitviz.inspect(model)
    attrs_before = {id(m): dict(vars(m)).keys() for m in model.modules()}
    vitviz.describe(model, attention="layers.*.attn", probe="qkv", img_size=16, patch_size=4, prefix_tokens=(),
                    pos_embed="where", patch_proj="stem")
    assert {id(m): dict(vars(m)).keys() for m in model.modules()} == attrs_before, "describe must not modify"
    spec = vitviz.inspect(model)
    assert (spec.family, spec.grid_size, spec.num_prefix_tokens, spec.depth, spec.num_heads) == (
        "custom", (4, 4), 0, 3, 4)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(torch.randn(1, 3, 16, 16))
    assert [a.shape for a in cap.attentions] == [(1, 4, 16, 16)] * 3


def test_describe_rejects_inconsistent_layout():
    with pytest.raises(vitviz.NotAViTError, match="pos_embed has 16 rows"):
        vitviz.describe(OddViT(), attention="layers.*.attn", img_size=32, patch_size=4, prefix_tokens=(),
                        pos_embed="where", patch_proj="stem")


@pytest.mark.parametrize("model", [nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), "resnet18"])
def test_non_vit_models_are_refused(model):
    if model == "resnet18":
        model = timm.create_model("resnet18")
    with pytest.raises(vitviz.NotAViTError, match="not a Vision Transformer"):
        vitviz.inspect(model)
    with pytest.raises(vitviz.NotAViTError):
        with vitviz.capture_attention(model):
            pass


def test_grad_flows_with_retain_grad(timm_vit):
    with vitviz.capture_attention(timm_vit, retain_grad=True) as cap:
        timm_vit(torch.randn(1, 3, 32, 48))[0, 1].backward()
    assert all(a.grad is not None and a.grad.shape == a.shape for a in cap.attentions)
    assert hooks_everywhere(timm_vit) == 0


@pytest.mark.gpu
def test_capture_on_cuda_matches_cpu():
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad(), vitviz.capture_attention(model) as cpu:
        model(x)
    model = model.cuda()
    with torch.no_grad(), vitviz.capture_attention(model) as gpu:
        model(x.cuda())
    assert gpu.attentions[0].device.type == "cuda"
    torch.testing.assert_close(gpu.attentions[-1].cpu(), cpu.attentions[-1], atol=1e-3, rtol=1e-3)
    model = model.half()
    with torch.no_grad(), vitviz.capture_attention(model, dtype=torch.float32) as half:
        model(x.cuda().half())
    torch.testing.assert_close(half.attentions[-1].cpu(), cpu.attentions[-1], atol=2e-2, rtol=0)


def test_a_library_vit_no_family_recognises_is_refused_not_guessed(monkeypatch):
    """A timm ViT whose layout its family cannot read (here: the attribute the family keys on removed, as in an
    older timm) is refused with UnsupportedModelError naming the class; the tutorial heuristics never read it,
    although it has patch_embed.proj, pos_embed and blocks[i].attn.qkv."""
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    monkeypatch.delattr(type(model), "num_prefix_tokens", raising=False)
    monkeypatch.delattr(model, "num_prefix_tokens", raising=False)
    with pytest.raises(vitviz.UnsupportedModelError, match=r"VisionTransformer \(timm\) has attention modules"):
        vitviz.inspect(model)


def test_enclosing_modules_follow_the_names_and_fall_back_to_named_modules():
    """The modules a capture watches for the input's size (``_enclosing_modules``): down the attention modules'
    names to their common ancestor; a name that does not lead to its module is looked up by the module, and a
    module outside the model gives the model alone."""
    from vitviz.core.capture import _enclosing_modules

    model = tiny_timm_vit()
    attn = [block.attn for block in model.blocks]
    assert _enclosing_modules(model, [(f"blocks.{i}.attn", a) for i, a in enumerate(attn)]) == [model, model.blocks]
    assert _enclosing_modules(model, [(f"layers.{i}", a) for i, a in enumerate(attn)]) == [model, model.blocks]
    assert _enclosing_modules(model, [("blocks.0.attn", attn[1])]) == [model, model.blocks, model.blocks[1], attn[1]]
    assert _enclosing_modules(model, [("blocks.0.attn", nn.Linear(2, 2))]) == [model]


@pytest.mark.parametrize("heads", ["full", "stream"])
def test_a_scale_the_fused_kernel_ignores_is_refused(heads):
    """timm's fused path never reads ``scale`` (it scales by ``head_dim ** -0.5``): a model whose ``scale`` was
    changed computes with the default, so reading it with the changed scale (the explicit path, the recomputation)
    would show maps it does not compute and change its outputs while captured. Refused, naming the model class, the
    module, both scales and the fix; the model is left as it was. With ``fused_attn=False`` the model computes with
    its scale, and the maps are read with it."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    attn = model.blocks[1].attn
    attn.fused_attn = True
    attn.scale = attn.scale * 4
    default = attn.head_dim ** -0.5
    x = torch.randn(2, 3, 32, 48)
    kwargs = dict(on_layer=lambda i, a: None, store=False, heads="stream") if heads == "stream" else {}
    with pytest.raises(vitviz.UnsupportedModelError,
                       match=rf"VisionTransformer \(timm\), attention module 'blocks.1.attn': Attention \(timm\) has "
                             rf"scale={attn.scale:.6g} with fused_attn=True.*head_dim \*\* -0.5 = {default:.6g}.*"
                             r"Set fused_attn = False"):
        with vitviz.capture_attention(model, **kwargs):
            pass
    assert hooks_everywhere(model) == 0 and attn.fused_attn is True and "fused_attn" in vars(attn)
    attn.fused_attn = False  # the model now computes with its own scale: read with it
    with torch.no_grad(), vitviz.capture_attention(model, layers=[1]) as cap, record_inputs([attn]) as seen:
        model(x)
    with torch.no_grad():
        q, k, _ = attn.qkv(seen[0]).reshape(2, -1, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        want = softmax_attention(attn.q_norm(q), attn.k_norm(k), attn.scale).float()
    torch.testing.assert_close(cap.attentions[0], want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("heads", ["full", "stream"])
def test_a_multihead_attention_forward_set_on_the_instance_keeps_running(heads, monkeypatch):
    """An ``nn.MultiheadAttention`` (torchvision) whose instance was given a forward of its own (here: the queries
    scaled by 3) is read as that forward computes: the capture used to call the class's forward in its place (the
    maps and, with them, the model were those of the plain module). The maps equal the weights of the user's forward
    written out, the model's output is its plain output, and the instance keeps its forward. A forward of its own
    that returns no weights is refused, naming the fix."""
    import types

    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=5).eval()
    mha = model.encoder.layers[1].self_attention

    def tempered(self, query, key, value, **kwargs):
        return nn.MultiheadAttention.forward(self, query * 3.0, key, value, **kwargs)

    mha.forward = types.MethodType(tempered, mha)
    from vitviz.core.families import stream

    monkeypatch.setattr(stream, "EXPLICIT_BELOW_BYTES", 0)  # the stream probe recomputes where it can (not here)
    monkeypatch.setattr(stream, "REPROJECT_WITHOUT_KERNEL", True)
    x = torch.randn(2, 3, 32, 32)
    got: list[torch.Tensor] = []
    kwargs = dict(on_layer=lambda i, a: got.append(a.full().clone()), store=False, heads="stream") \
        if heads == "stream" else dict(on_layer=lambda i, a: got.append(a.clone()))
    with torch.no_grad(), record_inputs([mha]) as seen:
        plain = model(x)
        with vitviz.capture_attention(model, **kwargs):
            out = model(x)
        t = seen[0]
        want = nn.MultiheadAttention.forward(mha, t * 3.0, t, t, need_weights=True, average_attn_weights=False)[1]
    torch.testing.assert_close(got[1], want, atol=1e-6, rtol=1e-5)
    assert torch.equal(out, plain)
    assert vars(mha)["forward"].__func__ is tempered and hooks_everywhere(model) == 0

    mha.forward = types.MethodType(lambda self, q, k, v, **kw: (nn.MultiheadAttention.forward(self, q, k, v)[0], None),
                                   mha)
    with pytest.raises(CaptureError, match="returned no attention weights.*need_weights=True"):
        with torch.no_grad(), vitviz.capture_attention(model, **kwargs):
            model(x)


def test_an_off_stride_input_to_a_padding_dynamic_model_is_refused_naming_the_stride():
    """A ``dynamic_img_size`` model that pads its input (timm ``dynamic_img_pad=True``) makes a grid of its own from
    a 36x44 input at 8 px (5x6, not the 4x5 of whole strides): refused, and the message says the input is off the
    token stride and how to fix it, not to feed the model its built size (which it does not need)."""
    model = tiny_timm_vit(dynamic_img_size=True, dynamic_img_pad=True)
    with pytest.raises(CaptureError, match=r"N=31 tokens.*4x5 patch grid = 21.*The 36x44 input is not a whole number "
                                           r"of 8x8 token strides.*multiples of the stride"):
        with torch.no_grad(), vitviz.capture_attention(model):
            model(torch.randn(1, 3, 36, 44))
    with torch.no_grad(), vitviz.capture_attention(model) as cap:  # on the stride: any size
        model(torch.randn(1, 3, 40, 48))
    assert cap.attentions[0].shape == (1, 2, 31, 31)


def test_an_interrupt_while_a_capture_ends_still_restores_every_module(monkeypatch):
    """A Ctrl-C (or any error) in one step of the exit once skipped the steps after it: the probes stayed on the
    model, its fused attention off, and every later forward kept handing maps to the dead capture."""
    import vitviz.core.capture as capture_module

    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    fused = [b.attn.fused_attn for b in model.blocks]
    real, calls = capture_module.subscribe, []

    def interrupted_once(module, probe, emit):  # the first module restored on the way out: Ctrl-C right after it
        undo = real(module, probe, emit)

        def interrupt():
            undo()
            calls.append(module)
            if len(calls) == 1:
                raise KeyboardInterrupt

        return interrupt

    monkeypatch.setattr(capture_module, "subscribe", interrupted_once)
    with pytest.raises(KeyboardInterrupt), vitviz.capture_attention(model) as cap:
        model(x)
    assert len(cap.attentions) == 2
    assert hooks_everywhere(model) == 0 and vitviz.core.capture.open_probes(model) == 0
    assert [b.attn.fused_attn for b in model.blocks] == fused and instance_forwards(model) == 0
    model(x)
    assert cap.forwards == 1 and len(calls) == 2  # the ended capture sees no later pass
