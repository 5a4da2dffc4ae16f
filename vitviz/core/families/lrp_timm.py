"""timm's AttnLRP installer (``timm_rules``): which block, attention and MLP classes each timm model class may hold
(``TIMM_LAYOUTS``), the uniform rule's scales on their projections, and vitviz's own forwards where timm computes a
projection without calling its module (q / v biases inside ``F.linear``). The rules are in ``lrp.py``; the other
families' installers and the shared checks in ``lrp_families.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitviz.core.families.base import Undo, chain_undos, set_attr
from vitviz.core.families.lrp import (
    QKV_FACTORS,
    LRPRules,
    classify,
    fused_gate_factor,
    gate_up_factors,
    input_hook,
    install_generic,
    install_output_gate,
    lrp_linear,
    pool_kv_factor,
    qkv_factor,
    scale_vector,
)
from vitviz.core.families.lrp_families import Emit, refuse, separate_qkv_factors, with_input_hook
from vitviz.core.families.timm_blocks import SCALING_BLOCKS, attention_of
from vitviz.errors import UnsupportedModelError


@dataclass(frozen=True)
class TimmLayout:
    """What vitviz's AttnLRP rules accept in one timm model class: its block and attention classes (by name, within
    that model's file), the top-level children off the relevance path (run before the first block, or computing
    constants: rotary angles, shared relative position biases), the ``global_pool`` values with a rule (an
    ``attn_pool`` must be timm's ``AttentionPoolLatent``), for an attention whose fused ``qkv`` takes its biases
    inside ``F.linear`` (so the projection is never called as a module) the forward of vitviz's that computes the
    same with the rules on that projection, and the attention's children that compute a constant (RelPos's bias
    MLP), off the relevance path too; and the block and attention classes of the blocks that update the class token
    alone after the others (CaiT's ``blocks_token_only``: its class token enters there, and is read there)."""

    blocks: tuple[str, ...]
    attentions: tuple[str, ...]
    off_path: tuple[str, ...]
    pools: tuple[str, ...]
    fused_bias_forward: Callable[..., Callable[..., torch.Tensor]] | None = None
    constant_children: tuple[str, ...] = ()
    class_attention: tuple[str, str] = ()


TIMM_GATED = ("GluMlp", "SwiGLU")  # act(gate) * up: fc1 = [gate, up] (or [up, gate] with gate_last); fc1_g, fc1_x
TIMM_COMMON = {"Mlp", "LayerScale", "Sequential", "ModuleList", "AttentionPoolLatent", "PatchEmbed",
               "NaFlexEmbeds", *TIMM_GATED}  # the embeddings: containers, on the relevance path at the pixels
BEFORE_BLOCKS = ("patch_embed", "pos_drop", "patch_drop", "norm_pre")
EMBEDDING = (*BEFORE_BLOCKS, "embeds")  # the token embedding: on the relevance path when it is read at the pixels


def _fused_bias_qkv(attn: nn.Module, x: torch.Tensor, rule: str, rules: LRPRules,
                    factor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``q, k, v`` ``(B, H, N, d)`` of a fused ``qkv`` whose q / v biases are added inside ``F.linear`` (timm Eva and
    BEiT), with the linear rule and the uniform rule's scales on that projection."""
    b, n, _ = x.shape
    bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    qkv = lrp_linear(x, attn.qkv.weight, bias, rule, rules, factor)
    return qkv.reshape(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def _eva_fused_bias_forward(attn: nn.Module, vt: Any, name: str, rules: LRPRules,
                            factor: torch.Tensor) -> Callable[..., torch.Tensor]:
    """``EvaAttention.forward`` (timm 1.0.26 to 1.0.31) for a fused ``qkv`` whose q / v biases the forward adds
    inside ``F.linear(x, qkv.weight, bias)``, so that ``qkv`` is never called as a module: the same computation
    with the linear rule and the uniform rule's scales on that projection. Everything else is the module's own
    (``gate``, ``q_norm``, ``k_norm``, ``norm``, ``proj`` are called, with their rules, a gate held constant by
    ``install_output_gate``; the rotation is timm's ``apply_rot_embed_cat`` from the module's file)."""
    rule = rules.linear_for(f"{name}.qkv")

    def rotate(t: torch.Tensor, rope: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        npt, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
        return torch.cat([t[:, :, :npt, :], vt.apply_rot_embed_cat(t[:, :, npt:, :], rope, half=half)],
                         dim=2).type_as(like)

    def forward(x: torch.Tensor, rope: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        gate = attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None  # newer timm only
        q, k, v = _fused_bias_qkv(attn, x, rule, rules, factor)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:
            q, k = rotate(q, rope, v), rotate(k, rope, v)
        if attn.fused_attn:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        else:
            scores = (q * attn.scale) @ k.transpose(-2, -1)
            scores = vt.maybe_add_mask(scores, vt.resolve_self_attn_mask(n, scores, attn_mask, is_causal=is_causal))
            o = attn.attn_drop(scores.softmax(dim=-1)) @ v
        o = attn.norm(o.transpose(1, 2).reshape(b, n, -1))
        if gate is not None:
            o = o * gate
        return attn.proj_drop(attn.proj(o))

    return forward


def _beit_fused_bias_forward(attn: nn.Module, vt: Any, name: str, rules: LRPRules,
                             factor: torch.Tensor) -> Callable[..., torch.Tensor]:
    """timm BEiT's ``Attention.forward`` (timm 1.0.26 to 1.0.31) for its fused ``qkv`` with q / v biases added inside
    ``F.linear``: the same computation with the linear rule and the uniform rule's scales on that projection; the
    relative position biases (its own table's and the model's shared one) are constants added to the scores."""
    rule = rules.linear_for(f"{name}.qkv")

    def forward(x: torch.Tensor, shared_rel_pos_bias: torch.Tensor | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = _fused_bias_qkv(attn, x, rule, rules, factor)
        own = attn._get_rel_pos_bias() if attn.relative_position_bias_table is not None else None
        if attn.fused_attn:
            mask = own if shared_rel_pos_bias is None else (
                shared_rel_pos_bias if own is None else own + shared_rel_pos_bias)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = (q * attn.scale) @ k.transpose(-2, -1)
            if own is not None:
                scores = scores + own
            if shared_rel_pos_bias is not None:
                scores = scores + shared_rel_pos_bias
            o = attn.attn_drop(scores.softmax(dim=-1)) @ v
        return attn.proj_drop(attn.proj(o.transpose(1, 2).reshape(b, n, -1)))

    return forward


# ParallelScalingBlock (ViT-22B's block) and its differential variant make attention and MLP from one fused in_proj
# (the block is the attention); ParallelThingsBlock sums branches of (norm, Attention) and of (norm, Mlp)
VIT_LAYOUT = TimmLayout(("Block", "ResPostBlock", "ParallelThingsBlock", *SCALING_BLOCKS),
                        ("Attention", "DiffAttention"), BEFORE_BLOCKS, ("token", "avg", ""))
TIMM_LAYOUTS = {
    "VisionTransformer": VIT_LAYOUT,
    "VisionTransformerDistilled": VIT_LAYOUT,  # DeiT-distilled: two heads averaged (linear)
    # NaFlexVit: timm's Block, or EvaBlock where its config asks for rotary embeddings, an EVA attention, SwiGLU,
    # gated attention or grouped key heads (naflexvit.get_block_fn)
    "NaFlexVit": TimmLayout(("Block", "EvaBlock"), ("Attention", "EvaAttention", "AttentionRope"),
                            (*BEFORE_BLOCKS, "embeds", "rope"), ("token", "avg", ""), _eva_fused_bias_forward),
    "Eva": TimmLayout(("EvaBlock", "EvaBlockPostNorm"), ("EvaAttention", "AttentionRope"), (*BEFORE_BLOCKS, "rope"),
                      ("avg", "token", ""), _eva_fused_bias_forward),
    "Beit": TimmLayout(("Block",), ("Attention",), (*BEFORE_BLOCKS, "rel_pos_bias"), ("avg", "token", ""),
                       _beit_fused_bias_forward),
    "VisionTransformerRelPos": TimmLayout(("RelPosBlock", "ResPostRelPosBlock"), ("RelPosAttention",),
                                          (*BEFORE_BLOCKS, "shared_rel_pos"), ("avg", "token", ""),
                                          constant_children=("rel_pos",)),
    # CaiT: talking-heads self-attention over the patches, then class attention (the class token's query alone)
    "Cait": TimmLayout(("LayerScaleBlock",), ("TalkingHeadAttn",), BEFORE_BLOCKS, ("token", "avg", ""),
                       class_attention=("LayerScaleBlockClassAttn", "ClassAttn")),
}


def _timm_attention_factors(model: nn.Module, layout: TimmLayout, rules: LRPRules, name: str, attn: nn.Module,
                            factors: dict[str, torch.Tensor], fused_bias: list[tuple[str, nn.Module]],
                            gated: list[tuple[str, nn.Module]]) -> None:
    """The uniform rule's scales on one timm attention module's q / k / v projections (a fused ``qkv`` or separate
    ``q_proj`` / ``k_proj`` / ``v_proj``); an attention whose fused ``qkv`` takes its biases inside ``F.linear`` is
    added to ``fused_bias`` (its layout's forward of vitviz's runs it), one with an output gate to ``gated``
    (``install_output_gate``). A differential attention's q and k hold two half-width heads per head, each behind
    its own ``q k^T``: the same 1/4, 1/4, 1/2 per feature."""
    if getattr(attn, "gate", None) is not None:
        if not isinstance(attn.gate, nn.Module):
            raise refuse(model, f"{name}'s output gate is not a module vitviz can hold constant")
        gated.append((name, attn))
    if isinstance(getattr(attn, "qkv", None), nn.Module):
        d = attn.qkv.out_features // 3
        factors[f"{name}.qkv"] = qkv_factor(rules, (d, d, d), attn.qkv.weight)
        if getattr(attn, "q_bias", None) is not None and not getattr(attn, "qkv_bias_separate", False):
            if layout.fused_bias_forward is None:
                raise refuse(model, f"{name} adds q/v biases to its fused qkv projection itself")
            fused_bias.append((name, attn))
    else:
        separate_qkv_factors(rules, name, attn, ("q_proj", "k_proj", "v_proj"), factors)


def timm_rules(model: nn.Module, rules: LRPRules, emit: Emit) -> Undo:
    """timm ``VisionTransformer`` (and DeiT-distilled) with ``Block`` or the post-norm ``ResPostBlock``, the parallel
    ``ParallelThingsBlock`` and ``ParallelScalingBlock``, ``Attention`` or differential attention (``DiffAttention``,
    ``DiffParallelScalingBlock``); ``NaFlexVit`` (the same blocks, or ``EvaBlock`` with ``EvaAttention`` or
    ``AttentionRope`` where its config asks for rotary embeddings, SwiGLU, gated attention or grouped key heads; its
    masked average pool is linear); ``Eva`` (EVA, EVA-02, DINOv3, PE, Sapiens2, the rotary ``vit_*_rope_*`` and
    ``vit_*_lingbot`` ViTs: ``EvaAttention`` or ``AttentionRope``, pre- or post-norm blocks); ``Beit`` (BEiT, BEiT
    v2); ``VisionTransformerRelPos`` (``vit_relpos_*``, ``vit_srelpos_*``). Each with an ``Mlp``, ``SwiGLU`` or
    ``GluMlp``; class-token, average or attention pooling (``AttentionPoolLatent``). Sigmoid gates, a ``GluMlp``'s
    or ``SwiGLU``'s (the original GLU) and an attention's output gate (``gated=True``, NaFlexVit's ``attn_gated``),
    are held constant, all relevance to the other factor (``lrp``'s module docstring). Fused attention stays on (its
    gradient is the softmax rule's).

    Rotary q and k (Eva) are rotated by angles that depend on the grid only: a linear map without bias, so gradient
    x input passes the relevance on whole (as for Hugging Face DINOv3); grouped key heads are repeated, a copy.
    A ``ParallelScalingBlock``'s ``in_proj`` makes ``[mlp hidden, q, k, v]``: the q / k / v features get the
    uniform rule's scales, the MLP's keep their gradient (the identity rule then acts on ``mlp_act``); the summed
    branches of ``ParallelThingsBlock`` are linear. Differential attention's ``lambda`` is computed from the weights
    only: ``A1 - lambda A2`` is a linear combination of two softmax maps (``lrp``'s module docstring).
    Relative position biases (BEiT, RelPos) are constants added to the scores, absorbed by the softmax rule as a
    mask is. The angles and the biases' tables (and the MLP that RelPos computes its bias with) are off the
    relevance path."""
    kind = type(model).__name__
    layout = TIMM_LAYOUTS.get(kind)
    if layout is None:
        raise refuse(model, f"vitviz has AttnLRP rules for timm's {', '.join(TIMM_LAYOUTS)} only, not {kind}")
    if getattr(model, "distilled_training", False) and model.training:
        raise refuse(model, "distilled training mode returns two outputs")
    pool = getattr(model, "attn_pool", None)
    if (pool is not None and type(pool).__name__ != "AttentionPoolLatent") or (
            pool is None and getattr(model, "global_pool", "token") not in layout.pools):
        raise refuse(model, f"global_pool={getattr(model, 'global_pool', None)!r} with {type(pool).__name__} (max "
                             "pooling, or an attention pool other than timm's AttentionPoolLatent) has no AttnLRP "
                             "rule in vitviz")
    factors: dict[str, torch.Tensor] = {}
    fused_bias: list[tuple[str, nn.Module]] = []
    gated: list[tuple[str, nn.Module]] = []
    for i, block in enumerate(model.blocks):
        if type(block).__name__ in SCALING_BLOCKS and type(block).__name__ in layout.blocks:
            # one in_proj makes [mlp hidden, q, k, v]: the MLP's part keeps its gradient, q / k / v get the scales
            hidden, d = block.in_split[0], block.in_split[1]
            factors[f"blocks.{i}.in_proj"] = scale_vector((hidden, d, d, d), (1.0, *QKV_FACTORS[rules.attention]),
                                                          block.in_proj.weight)
            continue
        attentions = attention_of(block, i)
        kinds = sorted({type(a).__name__ for _, a in attentions})
        if type(block).__name__ not in layout.blocks or not attentions or not set(kinds) <= set(layout.attentions):
            raise refuse(model, f"blocks.{i} is a {type(block).__name__} with {'/'.join(kinds) or 'no'} attention; "
                                 f"vitviz has AttnLRP rules for {'/'.join(layout.blocks)} with "
                                 f"{'/'.join(layout.attentions)} only (talking-heads attention is not covered)")
        for name, attn in attentions:
            _timm_attention_factors(model, layout, rules, name, attn, factors, fused_bias, gated)
    late = list(getattr(model, "blocks_token_only", None) or ())
    for i, block in enumerate(late):
        name = f"blocks_token_only.{i}.attn"
        if (type(block).__name__, type(getattr(block, "attn", None)).__name__) != layout.class_attention:
            raise refuse(model, f"blocks_token_only.{i} is a {type(block).__name__} with "
                                 f"{type(getattr(block, 'attn', None)).__name__}; vitviz has AttnLRP rules for "
                                 f"{'/'.join(layout.class_attention) or 'no class-attention blocks'} there")
        separate_qkv_factors(rules, name, block.attn, ("q", "k", "v"), factors)  # q: the class token's, an input
    sigmoid_gates = []  # a gated MLP's sigmoid (the original GLU): held constant, no rule runs on it
    for name, m in model.named_modules():
        sigmoid = type(m).__name__ in TIMM_GATED and isinstance(getattr(m, "act", None), nn.Sigmoid)
        if sigmoid:
            sigmoid_gates.append(f"{name}.act")
        if type(m).__name__ == "SwiGLU":
            factors[f"{name}.fc1_g"], factors[f"{name}.fc1_x"] = gate_up_factors(rules, m.fc1_g, m.fc1_x, sigmoid)
        elif type(m).__name__ == "GluMlp":
            factors[f"{name}.fc1"] = fused_gate_factor(rules, m.fc1, not m.gate_last, sigmoid)
    if pool is not None:  # a learned latent query: k and v only carry relevance (lrp.POOL_KV_FACTORS)
        e = pool.kv.out_features // 2
        factors["attn_pool.kv"] = pool_kv_factor(rules, (e, e), pool.kv.weight)
    constant = (*(f"blocks.{i}.attn.{c}" for i in range(len(model.blocks)) for c in layout.constant_children),
                *sigmoid_gates)
    pixels = rules.read_at == "pixels"
    if pixels and isinstance(getattr(getattr(model, "patch_embed", None), "backbone", None), nn.Module):
        raise UnsupportedModelError(f"{type(model).__name__}: AttnLRP at the pixels (read_at='pixels') needs a patch "
                                    "embedding vitviz has rules for, and this hybrid's CNN backbone (batch or group "
                                    "norms, pooling) has none; read the relevance at the tokens (read_at='tokens', "
                                    "the default)")
    off_path = tuple(p for p in layout.off_path if not (pixels and p in EMBEDDING))
    names = [(n, m) for n, m in model.named_modules() if n and n.split(".")[0] not in off_path
             and not any(n == c or n.startswith(f"{c}.") for c in constant)]
    groups = classify(names, kind, {kind, *layout.blocks, *layout.attentions, *layout.class_attention, *TIMM_COMMON})
    # NaFlexVit's embedding adds its position table to the projection's output in place
    undos = [install_generic(groups, rules, factors, copy=lambda name: pixels and name.split(".")[0] in EMBEDDING)]
    try:
        for name, attn in fused_bias:
            vt = sys.modules[type(attn).__module__]
            forward = layout.fused_bias_forward(attn, vt, name, rules, factors[f"{name}.qkv"])
            undos.append(set_attr(attn, "forward", forward))
        undos += [install_output_gate(attn) for _name, attn in gated]
        if late and not pixels:  # CaiT's class token: read where it enters the first class-attention block
            undos.append(input_hook(late[0], lambda t: emit(t, "late_prefix"), "x_cls", index=1))
    except BaseException:
        chain_undos(undos)()
        raise
    return with_input_hook(chain_undos(undos), model.blocks[0], emit, "x", rules)
