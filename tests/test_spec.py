"""inspect(): the token layout, read from the model, for every family and every model the ViT paper names."""

from __future__ import annotations

import contextlib
import copy

import pytest
import timm
import torch
from conftest import tiny_timm_vit
from timm.layers import build_sincos2d_pos_embed

import vitviz
from vitviz.zoo.reference import build_reference


def test_vit_b16_layout_and_parameter_table():
    model = timm.create_model("vit_base_patch16_224")
    spec = vitviz.inspect(model)
    assert spec.grid_size == (14, 14) and spec.patch_size == (16, 16) and spec.img_size == (224, 224)
    assert spec.prefix_tokens == ("cls",) and spec.class_token_index == 0 and spec.num_tokens == 197
    assert (spec.depth, spec.num_heads, spec.embed_dim) == (12, 12, 768)
    assert spec.pos_embed_kind == "learned" and spec.pos_embed_covers_prefix
    p = spec.params
    assert p["total"] == sum(t.numel() for t in model.parameters()) == 86_567_656  # "86.6M" in tutorials
    assert p["patch_embed"] == 768 * 3 * 16 * 16 + 768
    assert p["pos_embed"] == 197 * 768 and p["prefix_tokens"] == 768
    assert p["head"] == 768 * 1000 + 1000 and p["norm"] == 2 * 768
    assert p["blocks"] == 12 * (4 * 768 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768)
    text = repr(spec)
    assert "14x14 grid" in text and "86.57M" in text and "prefix [cls]" in text


def test_non_square_grid_is_not_swapped():
    spec = vitviz.inspect(tiny_timm_vit(img_size=(32, 48), patch_size=8))
    assert spec.grid_size == (4, 6) and spec.img_size == (32, 48) and spec.num_patches == 24


def test_registers_without_class_embedding():
    spec = vitviz.inspect(tiny_timm_vit(reg_tokens=4, no_embed_class=True))
    assert spec.prefix_tokens == ("cls", "reg", "reg", "reg", "reg")
    assert not spec.pos_embed_covers_prefix and spec.num_tokens == 29


def test_no_class_token_and_no_pos_embed():
    spec = vitviz.inspect(tiny_timm_vit(class_token=False, global_pool="avg", pos_embed="none"))
    assert spec.prefix_tokens == () and spec.class_token_index is None
    assert spec.pos_embed_kind == "none" and not spec.has_abs_pos_embed


def test_fixed_sincos_embedding_is_reported():
    model = tiny_timm_vit(class_token=False, global_pool="avg", no_embed_class=True)
    pe = build_sincos2d_pos_embed((4, 6), 32).unsqueeze(0)
    model.pos_embed = torch.nn.Parameter(pe, requires_grad=False)
    assert vitviz.inspect(model).pos_embed_kind == "sincos"


def test_rotary_models_are_reported():
    model = timm.create_model("vit_medium_patch16_rope_reg1_gap_256", img_size=64)
    spec = vitviz.inspect(model)
    assert spec.pos_embed_kind == "rotary" and spec.prefix_tokens == ("reg",)


PAPER_MODELS = [  # every model the ViT paper names: timm name, grid, stride, depth, heads, width, Table 1 size
    ("vit_base_patch16_224", (14, 14), 16, 12, 12, 768, 86e6),
    ("vit_base_patch32_224", (7, 7), 32, 12, 12, 768, 86e6),
    ("vit_large_patch16_224", (14, 14), 16, 24, 16, 1024, 307e6),
    ("vit_large_patch32_224", (7, 7), 32, 24, 16, 1024, 307e6),
    ("vit_huge_patch14_224", (16, 16), 14, 32, 16, 1280, 632e6),
    ("vit_base_r50_s16_224", (14, 14), 16, 12, 12, 768, None),
]


@pytest.mark.parametrize(("name", "grid", "stride", "depth", "heads", "dim", "paper_params"), PAPER_MODELS)
def test_paper_model_families(name, grid, stride, depth, heads, dim, paper_params):
    """Every model the ViT paper names inspects to its layout, and its sizes match Table 1. Built on the meta
    device: ``inspect`` reads modules and parameter shapes only, so ViT-L and ViT-H need no memory and no time."""
    with torch.device("meta"):
        model = timm.create_model(name)
    assert next(model.parameters()).is_meta
    spec = vitviz.inspect(model)
    assert spec.grid_size == grid and spec.patch_size == (stride, stride)
    assert (spec.depth, spec.num_heads, spec.embed_dim) == (depth, heads, dim)
    assert spec.hybrid == ("r50" in name)
    if paper_params:  # Table 1's "86M/307M/632M" are the transformer's size (patch and head layers vary)
        assert abs(spec.params["blocks"] - paper_params) / paper_params < 0.02


@pytest.mark.parametrize("name", ["vit_base_patch32_224", pytest.param("vit_base_r50_s16_224", marks=pytest.mark.slow)])
def test_paper_models_capture_at_224(name):
    """The capture on real weights (random) at the paper's resolution: one map per head over every token."""
    model = timm.create_model(name).eval()
    spec = vitviz.inspect(model)
    with torch.no_grad(), vitviz.capture_attention(model, layers=-1) as cap:
        model(torch.randn(1, 3, 224, 224))
    assert cap.attentions[0].shape == (1, spec.num_heads, spec.num_tokens, spec.num_tokens)


def test_reference_models_layout():
    for name in ("cifar10-vit", "cifar10-vit-1dpos", "cifar10-vit-nopos", "cifar10-vit-2dpos", "cifar10-hybrid"):
        spec = vitviz.inspect(build_reference(name))
        assert spec.grid_size == (8, 8) and spec.patch_size == (4, 4) and spec.prefix_tokens == ("cls",), name
    assert vitviz.inspect(build_reference("cifar10-vit-2dpos")).pos_embed_kind == "learned-2d"
    assert vitviz.inspect(build_reference("cifar10-vit-nopos")).pos_embed_kind == "none"
    hybrid = vitviz.inspect(build_reference("cifar10-hybrid"))
    assert hybrid.hybrid and hybrid.pos_embed_covers_prefix


def test_2d_pos_embed_is_row_and_column_tables():
    model = build_reference("cifar10-vit-2dpos")
    pe = model.pos_embed
    assert pe.shape == (1, 65, 96)
    grid = pe[0, 1:].reshape(8, 8, 96)
    torch.testing.assert_close(grid[3, :, :48], model.pos_embed_row[0, 3].expand(8, 48))
    torch.testing.assert_close(grid[:, 5, 48:], model.pos_embed_col[0, 5].expand(8, 48))
    assert "pos_embed_row" in model.state_dict() and "pos_embed" not in model.state_dict()


def test_a_user_attention_subclass_with_its_own_forward_is_refused_whatever_its_name():
    from conftest import tiny_timm_vit
    from timm.models.vision_transformer import Attention

    from vitviz.errors import UnsupportedModelError

    class Tempered(Attention):  # softmax(3 q k^T * scale): not what timm's Attention computes
        def forward(self, x, attn_mask=None, is_causal=False):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
            attn = self.attn_drop((q @ k.transpose(-2, -1) * self.scale * 3.0).softmax(-1))
            return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))

    class Renamed(Tempered):
        pass

    Renamed.__name__ = "Attention"  # named like timm's class

    class KeepsForward(Attention):  # only construction differs: timm's forward, read as timm's Attention
        pass

    for cls, ok in ((Tempered, False), (Renamed, False), (KeepsForward, True)):
        model = tiny_timm_vit()
        for block in model.blocks:
            new = cls(32, num_heads=2, qkv_bias=True)
            new.load_state_dict(block.attn.state_dict())
            block.attn = new
        if ok:
            assert vitviz.inspect(model).attention_maps == ("softmax", "softmax")
        else:
            with pytest.raises(UnsupportedModelError, match="no exact probe"):
                vitviz.inspect(model)


def test_inspect_reads_a_model_once_per_analysis_call(monkeypatch):
    """Inside an analysis call (``inspect_once``) the model is read once, not by each of the call's own inspect,
    the image loader's and capture_attention's; outside a call, every inspect reads the model afresh."""
    from vitviz.core import spec as spec_module

    model = tiny_timm_vit()
    x = torch.randn(2, 3, *vitviz.inspect(model).img_size)
    reads = []
    real = spec_module._inspect
    monkeypatch.setattr(spec_module, "_inspect", lambda m, *a: reads.append(m) or real(m, *a))
    vitviz.attention_rollout(model, x)
    assert len(reads) == 1
    assert vitviz.inspect(model) is not vitviz.inspect(model) and len(reads) == 3


def test_inspect_once_reads_a_changed_model_again():
    """A submodule, parameter or buffer replaced inside the block (here: a deeper model, a resized table) is read
    again, and its spec says so."""
    from vitviz.core.contexts import inspect_once

    model = tiny_timm_vit()
    with inspect_once():
        first = vitviz.inspect(model)
        assert vitviz.inspect(model) is first
        model.blocks.append(copy.deepcopy(model.blocks[0]))
        deeper = vitviz.inspect(model)
        assert deeper is not first and deeper.depth == first.depth + 1
        model.pos_embed = torch.nn.Parameter(torch.zeros(1, model.pos_embed.shape[1], model.pos_embed.shape[2]))
        assert vitviz.inspect(model) is not deeper
        other = tiny_timm_vit()
        assert vitviz.inspect(other) is not vitviz.inspect(model)


def test_inspect_compares_structures_only_once_the_set_up_window_closed(monkeypatch):
    """In an analysis call's set-up (an open ``walk_once`` window, which replaces nothing) a model read once is
    not compared again: one structure per call, not one per ``inspect``. Once a forward pass closed the window,
    each read compares, and a module replaced by then is read again."""
    from vitviz.core import spec as spec_module
    from vitviz.core.contexts import inspect_once, walk_once

    model = tiny_timm_vit()
    compared = []
    real = spec_module.model_structure
    monkeypatch.setattr(spec_module, "model_structure", lambda m: compared.append(m) or real(m))
    vitviz.attention_rollout(model, torch.randn(1, 3, 32, 48))
    assert compared == [model]  # three reads (the call's, the loader's, the capture's), one structure
    compared.clear()
    with walk_once(), inspect_once():
        first = vitviz.inspect(model)
        assert vitviz.inspect(model) is first and len(compared) == 1
        with torch.no_grad():
            model(torch.randn(1, 3, 32, 48))  # closes the window
        assert vitviz.inspect(model) is first and len(compared) == 2
        model.blocks.append(copy.deepcopy(model.blocks[0]))
        assert vitviz.inspect(model).depth == first.depth + 1 and len(compared) == 3


def test_parameter_counts_are_kept_across_calls_while_the_structure_stays(monkeypatch):
    """``count_params`` with a structure (as ``inspect`` calls it in an analysis call) counts a model once while
    its named modules, parameters and buffers stay; a resized head, a module under a new name, another family's
    components or a quantized layer (its packed weights are no parameters) are counted afresh, and every count
    equals a fresh count."""
    from vitviz.core import contexts
    from vitviz.core import spec as spec_module
    from vitviz.core.families import family_of

    model = tiny_timm_vit()
    walks = []
    real = contexts.is_quantized
    monkeypatch.setattr(contexts, "is_quantized", lambda m: walks.append(1) or real(m))

    def count(m, family=None):
        walks.clear()
        family = family or family_of(m)
        got = spec_module.count_params(m, family, spec_module.model_structure(m))
        assert got == spec_module.count_params(m, family)  # a fresh count
        return got, len(walks) > len(list(m.modules()))  # counted: a walk before the fresh one's

    first, counted = count(model)
    assert counted
    again, counted = count(model)
    assert again == first and not counted
    model.head = torch.nn.Linear(model.head.in_features, 3)
    resized, counted = count(model)
    assert counted and resized["head"] == model.head.in_features * 3 + 3 and resized["total"] < first["total"]
    model.fc = model._modules.pop("head")  # the same module under another name: no longer the head's
    renamed, counted = count(model)
    assert counted and renamed["head"] == 0 and renamed["other"] == resized["head"]

    class Other(type(family_of(model))):
        def param_components(self, m):
            return {**super().param_components(m), "head": ("fc.",)}

    other, counted = count(model, Other())
    assert counted and other["head"] == resized["head"]
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    count(quantized)
    _, counted = count(quantized)
    assert counted  # never kept


def test_the_table_kind_follows_an_in_place_write():
    """``table_kind`` keeps its verdict per table only until the table is written in place: a learned table
    overwritten with a sincos one (as ``load_state_dict`` writes) reads ``sincos`` at once, and back."""
    model = tiny_timm_vit()
    spec = vitviz.inspect(model)
    assert spec.pos_embed_kind == "learned"
    prefix = spec.num_prefix_tokens if spec.pos_embed_covers_prefix else 0
    table = build_sincos2d_pos_embed(list(spec.grid_size), dim=model.pos_embed.shape[-1])
    learned = model.pos_embed.detach().clone()
    with torch.no_grad():
        model.pos_embed[0, prefix:].copy_(table)
    assert vitviz.inspect(model).pos_embed_kind == "sincos"
    with torch.no_grad():
        model.pos_embed.copy_(learned)
    assert vitviz.inspect(model).pos_embed_kind == "learned"


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "beit_base_patch16_224", "vit_relpos_base_patch16_224"])
def test_module_attribute_is_getattr(name):
    """``module_attribute`` (the walks' fast ``getattr(m, n, None)``) agrees with ``getattr`` on every submodule,
    for parameters, buffers, submodules, plain attributes, properties, None entries and missing names."""
    from vitviz.core.contexts import module_attribute

    model = timm.create_model(name, pretrained=False, img_size=32, patch_size=16, depth=2, embed_dim=64,
                              num_heads=2)
    names = ("relative_position_bias_table", "rel_pos", "rel_pos_bias", "shared_rel_pos", "grad_checkpointing",
             "gradient_checkpointing", "weight", "bias", "qkv", "fused_attn", "num_heads", "training", "scale",
             "relative_position_index", "no_such_name", "T_destination", "dump_patches")
    checked = 0
    for m in model.modules():
        for n in names:
            assert module_attribute(m, n) is getattr(m, n, None), (type(m).__name__, n)
            checked += getattr(m, n, None) is not None
    assert checked > 50


def test_checkpointing_flags_are_read_as_getattr():
    """``checkpointing_off``'s flag test (``_flag_is_true``) is ``getattr(m, flag, None) is True`` on every
    submodule: flags in the instance's dict (True, False, a truthy non-bool), on the class, as a property, and
    absent; a parameter, buffer or submodule under a flag's name is never ``True``."""
    from vitviz.core.contexts import CHECKPOINTING_FLAGS, _flag_is_true

    class Flagged(torch.nn.Identity):
        grad_checkpointing = True  # a class attribute

        @property
        def gradient_checkpointing(self):
            return True

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=16, depth=2,
                              embed_dim=64, num_heads=2)
    model.grad_checkpointing = True
    model.blocks[0].gradient_checkpointing = 1  # truthy, not True
    model.blocks[1].grad_checkpointing = False
    model.flagged = Flagged()
    model.blocks[0].grad_checkpointing = torch.nn.Identity()  # a submodule under a flag's name
    model.norm.register_buffer("gradient_checkpointing", torch.ones(()))
    seen = []
    for m in model.modules():
        for flag in CHECKPOINTING_FLAGS:
            assert _flag_is_true(m, flag) is (getattr(m, flag, None) is True), (type(m).__name__, flag)
            seen.append(_flag_is_true(m, flag))
    assert sum(seen) == 3  # the model's flag, the class attribute, the property


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "beit_base_patch16_224", "eva02_tiny_patch14_224"])
def test_submodules_is_modules(name):
    """``submodules`` (the walks' stack-based ``model.modules()``) gives the same modules in the same order, a
    module reached twice (shared) once."""
    from vitviz.core.contexts import named_submodules, submodules

    model = timm.create_model(name, pretrained=False, img_size=32, patch_size=16, depth=2, embed_dim=64,
                              num_heads=2)
    model.shared = model.blocks[1]  # reached twice: listed where modules() lists it, once
    model.blocks[0].gone = None  # a child slot set to None: skipped, as named_modules skips it
    assert [id(m) for m in submodules(model)] == [id(m) for m in model.modules()]
    assert [(n, id(m)) for n, m in named_submodules(model)] == [(n, id(m)) for n, m in model.named_modules()]


def _count_walks(monkeypatch, contexts) -> list:
    """The models ``contexts`` walks from now on (with or without names), in order."""
    walked: list = []
    for name in ("_walk", "_named_walk"):
        walk = getattr(contexts, name)
        monkeypatch.setattr(contexts, name, lambda m, walk=walk: walked.append(m) or walk(m))
    return walked


def test_walk_once_walks_a_model_once_until_the_first_forward(monkeypatch):
    """Inside ``walk_once`` a model's modules are walked once for ``submodules`` and ``named_submodules`` (a new
    list each time; nested blocks share the window); the first forward of any module closes the window, its global hook gone as it fires, and every walk is
    made afresh from then on: a module a forward pass added is seen. The hook is gone also when the block raises."""
    from torch.nn.modules.module import _global_forward_pre_hooks

    from vitviz.core import contexts

    model = tiny_timm_vit()
    walked = _count_walks(monkeypatch, contexts)
    hooks = len(_global_forward_pre_hooks)

    def grow(module, _args):  # a module built lazily in the first forward pass
        if not hasattr(module, "grown"):
            module.grown = torch.nn.Identity()

    model.register_forward_pre_hook(grow)
    with contexts.walk_once():
        assert len(_global_forward_pre_hooks) == hooks + 1
        first = contexts.submodules(model)
        first.clear()  # the caller's own list
        with contexts.walk_once():
            assert [id(m) for m in contexts.submodules(model)] == [id(m) for m in model.modules()]
            named = [(n, id(m)) for n, m in model.named_modules()]
            assert [(n, id(m)) for n, m in contexts.named_submodules(model)] == named
        contexts.submodules(model.blocks[0])  # another module: walked on its own
        assert walked == [model, model.blocks[0]]
        with torch.no_grad():
            model(torch.randn(1, 3, 32, 48))
        assert len(_global_forward_pre_hooks) == hooks
        assert [id(m) for m in contexts.submodules(model)] == [id(m) for m in model.modules()]
        assert model.grown in contexts.submodules(model) and walked.count(model) == 3
    assert len(_global_forward_pre_hooks) == hooks
    with pytest.raises(RuntimeError, match="in the block"), contexts.walk_once():
        raise RuntimeError("raised in the block")
    assert len(_global_forward_pre_hooks) == hooks
    contexts.submodules(model)
    contexts.named_submodules(model)
    assert walked.count(model) == 5  # outside a window: every call walks


def test_an_analysis_call_walks_its_model_once(monkeypatch):
    """``attention_rollout`` and ``mean_attention_distance`` walk the model's modules once in their set-up (some
    ten walks without the window), with the same results."""
    from vitviz.core import calls, contexts

    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    walked = _count_walks(monkeypatch, contexts)
    got = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    assert walked.count(model) == 2
    monkeypatch.setattr(calls, "walk_once", contextlib.nullcontext)
    walked.clear()
    want = vitviz.attention_rollout(model, x), vitviz.mean_attention_distance(model, x)
    assert walked.count(model) > 10
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_a_capture_walks_its_model_once_in_its_set_up(monkeypatch):
    """``capture_attention`` opened on its own (outside an analysis call) walks the model once in its set-up (its own
    ``walk_once`` window: the read, the family, the parameter count, the checkpointing flags); its forwards are
    read as before, and a set-up that raises leaves no probe behind."""
    from vitviz.core import contexts
    from vitviz.core.capture import open_probes

    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    walked = _count_walks(monkeypatch, contexts)
    with vitviz.capture_attention(model) as cap:
        assert walked.count(model) == 1
        model(x)
    assert len(cap.attentions) == len(model.blocks) and open_probes(model) == 0
    with pytest.raises(vitviz.errors.LayerSelectError), vitviz.capture_attention(model, layers=99):
        pass
    assert open_probes(model) == 0


def test_once_per_window_computes_once_per_window_and_arguments():
    """``once_per_window``: inside an open ``walk_once`` window one computation per function and argument objects (a
    list handed out as a new list each time), another for other objects; after the window closed (a forward), and
    outside any, every call computes."""
    from vitviz.core import contexts

    calls: list = []

    @contexts.once_per_window
    def modules_of(model):
        calls.append(model)
        return list(model.children())

    model, other = tiny_timm_vit(), tiny_timm_vit()
    with contexts.walk_once():
        first = modules_of(model)
        first.append("changed by the caller")
        assert modules_of(model) == list(model.children())  # the caller's list, not the kept one, was changed
        assert modules_of(other) == list(other.children())
        assert calls == [model, other]
        model(torch.randn(1, 3, 32, 48))  # the first forward closes the window
        modules_of(model)
        assert calls == [model, other, model]
    modules_of(model)
    modules_of(model)
    assert calls == [model, other, model, model, model]


def test_a_calls_set_up_lists_the_attention_modules_once(monkeypatch):
    """A call's set-up asks its family for the attention modules some six times (``inspect``'s layout, maps and
    blocks; the capture): they are listed once (``Family.attention_modules`` is ``once_per_window``), one
    ``attention_of`` per block, with the same result as listing them each time."""
    from vitviz.core import calls
    from vitviz.core.families import timm_vit

    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    listed: list = []
    real = timm_vit.attention_of
    monkeypatch.setattr(timm_vit, "attention_of", lambda block, i: listed.append(i) or real(block, i))
    got = vitviz.attention_rollout(model, x)
    assert sorted(listed) == list(range(len(model.blocks)))
    monkeypatch.setattr(calls, "walk_once", contextlib.nullcontext)  # no window: listed at every ask
    listed.clear()
    want = vitviz.attention_rollout(model, x)
    assert len(listed) >= 5 * len(model.blocks)
    assert torch.equal(got, want)


def test_without_autocast_reads_the_devices_only_under_an_autocast(monkeypatch):
    """``without_autocast`` switches off a caller's autocast on the model's device types; where none is on, it reads
    no device (a walk over the model's tensors less in every call) and changes nothing."""
    from vitviz.core import contexts

    model = tiny_timm_vit()
    read: list = []
    real = contexts._device_types
    monkeypatch.setattr(contexts, "_device_types", lambda m: read.append(m) or real(m))
    with contexts.without_autocast(model):
        assert not torch._C._is_any_autocast_enabled()
    assert read == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with contexts.without_autocast(model):
            assert not torch._C._is_any_autocast_enabled()
        assert torch._C._is_any_autocast_enabled()
    assert read == [model]
    # MPS's autocast, which torch._C._is_any_autocast_enabled does not ask about, is seen too (its flag set directly:
    # no Apple GPU here; the CPU model's devices are read, its CPU autocast off, the MPS flag left as it was)
    torch.set_autocast_enabled("mps", True)
    try:
        with contexts.without_autocast(model):
            assert torch.is_autocast_enabled("mps")
    finally:
        torch.set_autocast_enabled("mps", False)
    assert read == [model, model]


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "beit_base_patch16_224"])
def test_count_params_counts_what_named_parameters_names(name):
    """``count_params`` reads the parameters in its own walk: per component, the sums of ``named_parameters()``
    (each tensor once, under its first name, a shared one too), whatever component its first name falls in."""
    from vitviz.core.families import family_of
    from vitviz.core.spec import count_params

    model = timm.create_model(name, pretrained=False, img_size=32, patch_size=16, depth=2, embed_dim=64,
                              num_heads=2)
    model.head = torch.nn.Linear(64, 64)
    model.head.weight = model.blocks[1].mlp.fc2.weight  # tied: counted once, in the blocks (its first name)
    model.extra = torch.nn.Parameter(torch.zeros(7))  # no component's prefix: "other"
    family = family_of(model)
    expected = dict.fromkeys(count_params(model, family), 0)
    for n, p in model.named_parameters():
        comp = next((c for c, prefixes in family.param_components(model).items() if n.startswith(prefixes)), "other")
        expected[comp] += p.numel()
    expected["total"] = sum(v for k, v in expected.items() if k != "total")
    assert count_params(model, family) == expected
    assert expected["other"] == 7 and expected["head"] < 64 * 64  # the tied weight is not the head's
