"""Conformance harness: the invariants every model vitviz reads must satisfy, checked by ``check_model``.

``check_model(model, x)`` asserts, for one batch ``x``:

1. the captured maps equal an independent recomputation of each attention layer from its weights and the input it
   received (recorded with a forward pre-hook of our own; the recomputation is written here, per attention class:
   ``softmax(q k^T * scale + bias)`` with the family's q/k norms, rotary embedding, relative position bias,
   talking-heads mixing, class attention or differential combination), shaped ``(B, H, N, N)`` with ``N`` from
   ``vitviz.inspect`` and the input's grid;
2. rows sum to 1, or to the documented row sum of the map kind (``ViTSpec.attention_maps``);
3. the model's output is unchanged by the capture (bitwise after it; within fp tolerance of the fused path during
   it), and every flag, hook and instance attribute of every module is restored;
4. ``capture_attention(heads="stream")``, which rollout and distance read, hands out the same maps head by head
   (on timm's plain ``Attention`` recomputed from ``q`` and ``k`` beside the fused kernel), with the same output
   and the state restored;
5. rollout, mean attention distance and position similarity are finite and shaped by the grid, or raise
   ``UnsupportedModelError`` / ``NoPositionEmbeddingError`` exactly where the map kinds / position kind say so.

A model vitviz refuses raises ``UnsupportedModelError`` from ``vitviz.inspect`` (propagated to the caller).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import vitviz
from vitviz.core.capture import _enclosing_modules
from vitviz.core.families import family_of
from vitviz.errors import NoPositionEmbeddingError, UnsupportedModelError

Reference = Callable[[nn.Module, tuple, dict], torch.Tensor]


# ---------------------------------------------------------------- independent recomputation, per attention class
def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, c = t.shape
    return t.reshape(b, n, heads, c // heads).transpose(1, 2)


def _qkv(m: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``(B, H, N, d)`` from a fused qkv Linear (with BEiT/EVA-style separate q/k/v biases) or q/k projections."""
    b, n, _ = x.shape
    if getattr(m, "qkv", None) is not None:
        bias = m.qkv.bias
        if getattr(m, "q_bias", None) is not None:
            k_bias = m.k_bias if getattr(m, "k_bias", None) is not None else torch.zeros_like(m.q_bias)
            bias = torch.cat((m.q_bias, k_bias, m.v_bias))
            if getattr(m, "qkv_bias_separate", False) and m.qkv.bias is not None:
                bias = bias + m.qkv.bias
        out = x @ m.qkv.weight.T + (bias if bias is not None else 0)
        q, k, _ = out.reshape(b, n, 3, m.num_heads, -1).permute(2, 0, 3, 1, 4)
        return q, k
    q = m.q_proj(x).reshape(b, n, m.num_heads, -1).transpose(1, 2)
    kv_heads = getattr(m, "num_kv_heads", m.num_heads)
    k = m.k_proj(x).reshape(b, n, kv_heads, -1).transpose(1, 2)
    return q, k


def _rope(m: nn.Module, t: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
    if rope is None:
        return t
    from timm.layers import apply_rot_embed_cat

    npt = m.num_prefix_tokens
    half = getattr(m, "rotate_half", False)
    return torch.cat([t[:, :, :npt], apply_rot_embed_cat(t[:, :, npt:], rope, half=half)], dim=2)


def ref_softmax_attention(m: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """timm ``Attention``, ``EvaAttention``, ``AttentionRope``, BEiT ``Attention``, ``RelPosAttention``."""
    x = args[0]
    q, k = _qkv(m, x)
    q, k = getattr(m, "q_norm", nn.Identity())(q), getattr(m, "k_norm", nn.Identity())(k)
    rope = kwargs.get("rope", args[1] if len(args) > 1 and type(m).__name__ != "Attention" else None)
    q, k = _rope(m, q, rope).type_as(q), _rope(m, k, rope).type_as(k)
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = (q * m.scale) @ k.transpose(-2, -1)
    table = getattr(m, "relative_position_bias_table", None)
    if table is not None:  # BEiT: table indexed by relative position, (1, H, N, N)
        n = logits.shape[-1]
        bias = table[m.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        logits = logits + bias[None]
    rel_pos = getattr(m, "rel_pos", None)
    if rel_pos is not None:
        logits = logits + rel_pos.get_bias()
    shared = kwargs.get("shared_rel_pos_bias", kwargs.get("shared_rel_pos"))
    if shared is not None and rel_pos is None:
        logits = logits + shared
    return logits.softmax(dim=-1)


def ref_parallel_scaling(m: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """timm ``ParallelScalingBlock``: q, k from the fused in-projection."""
    x = args[0]
    b, n, c = x.shape
    y = m.in_proj(m.in_norm(x))
    _mlp, q, k, _v = torch.split(y, m.in_split, dim=-1)
    q = m.q_norm(q.view(b, n, m.num_heads, -1)).transpose(1, 2)
    k = m.k_norm(k.view(b, n, m.num_heads, -1)).transpose(1, 2)
    return ((q * m.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def _lambda(m: nn.Module) -> torch.Tensor:
    """Differential attention's lambda (Ye et al. 2024, Eq. 2 as in timm): one scalar."""
    if getattr(m, "lambda_a", None) is not None:
        lam = torch.exp(m.lambda_a) - torch.exp(m.lambda_b)
    else:
        lam = torch.exp((m.lambda_q1 * m.lambda_k1).sum().float()) - torch.exp((m.lambda_q2 * m.lambda_k2).sum().float())
    return lam + (0.8 - 0.6 * math.exp(-0.3 * _depth(m)))


def _depth(m: nn.Module) -> int:
    # timm sets lambda_init = 0.8 - 0.6 exp(-0.3 depth); invert it to read the layer's depth
    return round(-math.log((0.8 - m.lambda_init) / 0.6) / 0.3)


def ref_differential(m: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """``DiffAttention`` / ``DiffParallelScalingBlock``: ``softmax(Q1 K1^T s) - lambda softmax(Q2 K2^T s)``."""
    x = args[0]
    b, n, c = x.shape
    if hasattr(m, "in_proj"):
        _mlp, q, k, _v = torch.split(m.in_proj(m.in_norm(x)), m.in_split, dim=-1)
    else:
        q, k, _v = (x @ m.qkv.weight.T + (m.qkv.bias if m.qkv.bias is not None else 0)).chunk(3, dim=-1)
    q = m.q_norm(q.reshape(b, n, 2 * m.num_heads, -1).transpose(1, 2))
    k = m.k_norm(k.reshape(b, n, 2 * m.num_heads, -1).transpose(1, 2))
    s = ((q * m.scale) @ k.transpose(-2, -1)).softmax(dim=-1).view(b, m.num_heads, 2, n, n)
    return s[:, :, 0] - _lambda(m).to(s.dtype) * s[:, :, 1]


def ref_talking_heads(m: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """CaiT ``TalkingHeadAttn`` (patch tokens only), embedded after an identity class-token row."""
    x = args[0]
    b, p, c = x.shape
    h = m.num_heads
    q, k, _v = (x @ m.qkv.weight.T + (m.qkv.bias if m.qkv.bias is not None else 0)).reshape(b, p, 3, h, c // h).permute(2, 0, 3, 1, 4)
    logits = (q * m.scale) @ k.transpose(-2, -1)  # (B, H, P, P)
    logits = torch.einsum("gh,bhij->bgij", m.proj_l.weight, logits) + m.proj_l.bias[None, :, None, None]
    probs = logits.softmax(dim=-1)
    mixed = torch.einsum("gh,bhij->bgij", m.proj_w.weight, probs) + m.proj_w.bias[None, :, None, None]
    out = torch.zeros(b, h, p + 1, p + 1, dtype=mixed.dtype)
    out[:, :, 0, 0] = 1.0
    out[:, :, 1:, 1:] = mixed
    return out


def ref_class_attn(m: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """CaiT ``ClassAttn``: the class row over ``[cls, patches]``; patch rows identity."""
    u = args[0]
    b, n, c = u.shape
    q = _split_heads(m.q(u[:, :1]), m.num_heads)
    k = _split_heads(m.k(u), m.num_heads)
    row = ((q * m.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, 1, N)
    out = torch.eye(n, dtype=row.dtype).repeat(b, m.num_heads, 1, 1)
    out[:, :, 0] = row[:, :, 0]
    return out


REFERENCES: dict[str, Reference] = {
    "Attention": ref_softmax_attention,
    "EvaAttention": ref_softmax_attention,
    "AttentionRope": ref_softmax_attention,
    "RelPosAttention": ref_softmax_attention,
    "ParallelScalingBlock": ref_parallel_scaling,
    "DiffAttention": ref_differential,
    "DiffParallelScalingBlock": ref_differential,
    "TalkingHeadAttn": ref_talking_heads,
    "ClassAttn": ref_class_attn,
}


def expected_row_sums(m: nn.Module, kind: str, ref: torch.Tensor) -> torch.Tensor:
    """The documented row sums of one layer's ``(B, H, N, N)`` maps (see ``vitviz.core.families.timm_probes``)."""
    b, h, n, _ = ref.shape
    if kind == "differential":
        return (1 - _lambda(m).to(ref.dtype)).expand(b, h, n)
    if kind == "talking-heads":  # patch rows: sum_g W_hg + P b_h per head; class row (identity): 1
        per_head = m.proj_w.weight.sum(dim=1) + (n - 1) * m.proj_w.bias
        out = per_head[None, :, None].expand(b, h, n).clone()
        out[:, :, 0] = 1.0
        return out
    return torch.ones(b, h, n)


# ---------------------------------------------------------------- state snapshot (flags, hooks, attributes)
def _state(model: nn.Module) -> list[tuple]:
    rows = []
    for name, m in model.named_modules():
        hooks = tuple(len(getattr(m, a)) for a in vars(m) if a.endswith("hooks") and isinstance(getattr(m, a), dict))
        attrs = tuple(sorted((k, repr(v)) for k, v in vars(m).items()
                             if not k.startswith("_") and not isinstance(v, (torch.Tensor, nn.Module))))
        rows.append((name, m.training, hooks, attrs, tuple(sorted(vars(m).keys()))))
    return rows


# ---------------------------------------------------------------- the check
ZERO_INITIALISED = ("relative_position_bias_table", "q_bias", "v_bias")


def randomise_zero_biases(model: nn.Module, std: float = 0.5) -> list[str]:
    """Give random values to the zero-initialised bias parameters (BEiT's relative position bias tables, its
    ``q_bias`` / ``v_bias``; timm and Hugging Face initialise them to zeros), so that a capture or recomputation that
    leaves one out is caught. Returns the names changed."""
    g = torch.Generator().manual_seed(0)
    changed = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ZERO_INITIALISED and p.numel() and not p.any():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * std)
                changed.append(name)
    return changed


def check_model(model: nn.Module, x: torch.Tensor, reference: dict[str, Reference] | Reference | None = None, *,
                atol: float = 2e-5, output_atol: float = 1e-4) -> dict[str, Any]:
    """Assert every invariant on ``model`` for the batch ``x``; returns a summary dict.

    Args:
        model: a ViT in eval mode. Its zero-initialised bias parameters get random values first
            (``randomise_zero_biases``).
        x: ``(B, 3, H, W)`` input fitting ``vitviz.inspect(model)`` (its grid is ``spec.grid_for_input(x)``).
        reference: a recomputation ``fn(module, args, kwargs) -> (B, H, N, N)`` for every attention module, or a
            dict class name -> fn overriding ``REFERENCES``.
        atol: tolerance of the maps against the reference.
        output_atol: tolerance (absolute and relative) of the captured pass's output against the fused one: the
            capture computes attention explicitly, within float rounding of the fused kernel; a model that quantizes
            its activations turns that rounding into a quantization step.

    Raises:
        UnsupportedModelError: from ``vitviz.inspect`` for a model vitviz refuses (the clear error).
        AssertionError: an invariant does not hold (a silently wrong answer).
    """
    spec = vitviz.inspect(model)
    family = family_of(model)
    modules = family.attention_modules(model)
    randomise_zero_biases(model)
    gh, gw = spec.grid_for_input(x)
    b, n = x.shape[0], spec.num_prefix_tokens + gh * gw
    refs = dict(REFERENCES)
    if isinstance(reference, dict):
        refs.update(reference)
    assert len(spec.attention_maps) == len(modules) == len(spec.attention_blocks), "spec lists disagree"
    assert spec.depth == len(set(spec.attention_blocks)), f"depth {spec.depth} != blocks {spec.attention_blocks}"
    assert spec.num_heads > 0, "inspect reports 0 heads"
    assert _enclosing_modules(model, modules) == _enclosing_by_named_modules(model, [m for _, m in modules]), \
        "the capture watches other enclosing modules than named_modules' paths give"

    before = _state(model)
    with torch.no_grad():
        out_ref = model(x)
    inputs: dict[str, tuple[tuple, dict]] = {}
    handles = [m.register_forward_pre_hook(lambda _m, a, k, name=name: inputs.__setitem__(name, (a, k)),
                                           with_kwargs=True) for name, m in modules]
    try:
        with torch.no_grad(), vitviz.capture_attention(model) as cap:
            out_cap = model(x)
        maps = cap.attentions
    finally:
        for h in handles:
            h.remove()
    assert _state(model) == before, "capture left a flag, hook or attribute changed"
    with torch.no_grad():
        out_after = model(x)
    assert torch.equal(_tensor(out_after), _tensor(out_ref)), "model output changed after the capture"
    torch.testing.assert_close(_tensor(out_cap), _tensor(out_ref), atol=output_atol, rtol=output_atol,
                               msg=lambda m: f"output during the capture differs from the fused path: {m}")

    assert len(maps) == len(modules), f"{len(maps)} maps for {len(modules)} attention modules"
    worst = 0.0
    for (name, m), kind, a in zip(modules, spec.attention_maps, maps):
        assert a.shape == (b, spec.num_heads, n, n), f"{name}: map {tuple(a.shape)} != {(b, spec.num_heads, n, n)}"
        fn = reference if callable(reference) else refs.get(type(m).__name__)
        assert fn is not None, f"{name}: no reference recomputation for {type(m).__name__}"
        with torch.no_grad():
            ref = fn(m, *inputs[name]).float()
        torch.testing.assert_close(a.float(), ref, atol=atol, rtol=1e-4,
                                   msg=lambda msg, name=name, kind=kind: f"{name} ({kind}) differs from the recomputation: {msg}")
        worst = max(worst, float((a.float() - ref).abs().max()))
        with torch.no_grad():
            sums = expected_row_sums(m, kind, ref)
        torch.testing.assert_close(a.float().sum(-1), sums.float(), atol=1e-4, rtol=1e-4,
                                   msg=lambda msg, name=name, kind=kind: f"{name} ({kind}) rows do not sum as documented: {msg}")
        if kind in ("softmax", "class-attention"):
            assert bool((a >= 0).all()), f"{name}: negative probabilities"

    _check_stream(model, x, maps, out_ref, [name for name, _ in modules], atol, output_atol)
    _check_analyses(model, x, spec, (gh, gw))
    return {"name": spec.name, "layers": len(maps), "max_abs_diff": worst, "maps": sorted(set(spec.attention_maps))}


def _enclosing_by_named_modules(model: nn.Module, modules: list[nn.Module]) -> list[nn.Module]:
    """The modules on every path from ``model`` to ``modules``, the paths read from ``named_modules`` (the
    capture's ``_enclosing_modules`` follows the family's names instead)."""
    named = dict(model.named_modules())
    names = {id(m): n for n, m in named.items()}
    paths = [[named[".".join(names[id(m)].split(".")[:i])] for i in range(len(names[id(m)].split(".")) + 1)]
             if names[id(m)] else [model] for m in modules]
    common = []
    for level in zip(*paths):
        if any(m is not level[0] for m in level):
            break
        common.append(level[0])
    return common


def _check_stream(model: nn.Module, x: torch.Tensor, maps: list[torch.Tensor], out_ref: Any, names: list[str],
                  atol: float, output_atol: float = 1e-4) -> None:
    """``heads="stream"`` (what rollout and distance read) hands out the same maps, head by head; the forward's
    output is the fused path's (bit for bit where a stream probe keeps the fused kernel) and the state comes back."""
    from vitviz.core.families import stream

    default, reproject = stream.EXPLICIT_BELOW_BYTES, stream.REPROJECT_WITHOUT_KERNEL
    for threshold in (0, 1 << 62):  # every call recomputed (on CPU too), then every call explicit
        before = _state(model)
        got: dict[int, torch.Tensor] = {}

        def keep(i: int, hm: Any, got: dict[int, torch.Tensor] = got) -> None:
            got[i] = torch.stack([m.float().clone() for _, m in hm.heads()], dim=1)

        stream.EXPLICIT_BELOW_BYTES, stream.REPROJECT_WITHOUT_KERNEL = threshold, threshold == 0
        try:
            with torch.no_grad(), vitviz.capture_attention(model, on_layer=keep, store=False, heads="stream"):
                out = model(x)
        finally:
            stream.EXPLICIT_BELOW_BYTES, stream.REPROJECT_WITHOUT_KERNEL = default, reproject
        path = "recomputed" if threshold == 0 else "explicit"
        assert _state(model) == before, f"stream capture ({path}) left a flag, hook or attribute changed"
        torch.testing.assert_close(_tensor(out), _tensor(out_ref), atol=output_atol, rtol=output_atol,
                                   msg=lambda m, p=path: f"output during the stream capture ({p}) differs: {m}")
        assert sorted(got) == list(range(len(maps))), f"stream capture fed layers {sorted(got)} of {len(maps)}"
        for i, (name, a) in enumerate(zip(names, maps)):
            torch.testing.assert_close(got[i], a.float(), atol=atol, rtol=1e-4,
                                       msg=lambda msg, name=name, p=path: f"{name}: heads='stream' ({p}) maps differ: {msg}")


def _tensor(out: Any) -> torch.Tensor:
    out = getattr(out, "logits", out)
    return out[0] if isinstance(out, (tuple, list)) else out


def _check_analyses(model: nn.Module, x: torch.Tensor, spec: Any, grid: tuple[int, int]) -> None:
    from vitviz.analysis.rollout import ROLLOUT_MAPS

    kinds = set(spec.attention_maps)
    if kinds <= set(ROLLOUT_MAPS):
        r = vitviz.attention_rollout(model, x)
        assert r.shape == (x.shape[0], *grid) and bool(torch.isfinite(r).all()), f"rollout {tuple(r.shape)}"
        full = vitviz.attention_rollout(model, x, return_full=True)
        torch.testing.assert_close(full.sum(-1), torch.ones(full.shape[:2]), atol=1e-4, rtol=1e-4)
    else:
        try:
            vitviz.attention_rollout(model, x)
        except UnsupportedModelError:
            pass
        else:
            raise AssertionError(f"rollout ran on {sorted(kinds)} maps instead of refusing")
        first = next((i for i in range(len(spec.attention_maps))
                      if set(spec.attention_maps[i:]) <= set(ROLLOUT_MAPS)), None)
        if first is not None:  # CaiT: the class-attention stage rolls out
            r = vitviz.attention_rollout(model, x, start_layer=first)
            assert r.shape == (x.shape[0], *grid) and bool(torch.isfinite(r).all())
    if kinds == {"softmax"}:
        d = vitviz.mean_attention_distance(model, x)
        assert d.shape == (len(spec.attention_modules), spec.num_heads), f"distance {tuple(d.shape)}"
        assert bool(torch.isfinite(d).all()) and bool((d >= 0).all())
    else:
        try:
            vitviz.mean_attention_distance(model, x)
        except UnsupportedModelError:
            pass
        else:
            raise AssertionError(f"distance ran on {sorted(kinds)} maps instead of refusing")
    if spec.has_abs_pos_embed:
        s = vitviz.pos_embed_similarity(model)
        assert s.shape == (*spec.grid_size, *spec.grid_size) and bool(torch.isfinite(s).all())
    else:
        try:
            vitviz.pos_embed_similarity(model)
        except NoPositionEmbeddingError:
            pass
        else:
            raise AssertionError(f"pos_embed_similarity ran on a {spec.pos_embed_kind!r} model")
