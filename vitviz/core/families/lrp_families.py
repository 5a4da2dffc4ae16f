"""Where each family's AttnLRP rules go (``Family.lrp_rules``); the rules themselves are in ``lrp.py``.

Each installer checks that every module after the token embedding computes something vitviz has a rule for
(refusing the model with ``UnsupportedModelError`` otherwise), installs the rules on the instances, hooks the first
block's input, and returns the undo.
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
    lrp_linear,
    pool_kv_factor,
    qkv_factor,
    scale_vector,
)
from vitviz.core.families.timm_vit import attention_of
from vitviz.errors import UnsupportedModelError

Emit = Callable[..., None]  # emit(tokens); emit(prefix, "late_prefix") for CaiT's class token

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
TIMM_COMMON = {"Mlp", "LayerScale", "Sequential", "ModuleList", "AttentionPoolLatent", *TIMM_GATED}
BEFORE_BLOCKS = ("patch_embed", "pos_drop", "patch_drop", "norm_pre")


def _refuse(model: nn.Module, reason: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{type(model).__name__}: AttnLRP is not available for this model: {reason}; "
                                 "use explain(method='chefer') instead")


def _with_input_hook(undo: Undo, first_block: nn.Module, emit: Emit, arg: str) -> Undo:
    try:
        return chain_undos([undo, input_hook(first_block, emit, arg)])
    except BaseException:
        undo()
        raise


def _separate_qkv_factors(rules: LRPRules, name: str, attn: nn.Module, parts: tuple[str, str, str],
                          factors: dict[str, torch.Tensor]) -> None:
    """The uniform rule's scales on separate q / k / v projections ``<name>.<part>`` (one ``Linear`` each)."""
    for f, part in enumerate(parts):
        lin = getattr(attn, part)
        factors[f"{name}.{part}"] = qkv_factor(rules, (lin.out_features,) * 3, lin.weight).chunk(3)[f]


def _one_in_proj(mha: nn.Module, pool: bool = False) -> bool:
    """Whether ``mha`` is an ``nn.MultiheadAttention`` of a form vitviz's forward for it computes: q, k, v from one
    ``in_proj`` (no extra key bias), or for an attention pool also separate q / k / v projections (keys and values
    of another width than the queries: open_clip's attentional pooler)."""
    return isinstance(mha, nn.MultiheadAttention) and mha.bias_k is None and (
        (mha.in_proj_weight is not None and mha._qkv_same_embed_dim) or (pool and not mha._qkv_same_embed_dim))


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
    """``EvaAttention.forward`` (timm 1.0.26 to 1.0.31, ungated) for a fused ``qkv`` whose q / v biases the forward
    adds inside ``F.linear(x, qkv.weight, bias)``, so that ``qkv`` is never called as a module: the same computation
    with the linear rule and the uniform rule's scales on that projection. Everything else is the module's own
    (``q_norm``, ``k_norm``, ``norm``, ``proj`` are called, with their rules; the rotation is timm's
    ``apply_rot_embed_cat`` from the module's file)."""
    rule = rules.linear_for(f"{name}.qkv")

    def rotate(t: torch.Tensor, rope: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        npt, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
        return torch.cat([t[:, :, :npt, :], vt.apply_rot_embed_cat(t[:, :, npt:, :], rope, half=half)],
                         dim=2).type_as(like)

    def forward(x: torch.Tensor, rope: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
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
SCALING_BLOCKS = ("ParallelScalingBlock", "DiffParallelScalingBlock")
VIT_LAYOUT = TimmLayout(("Block", "ResPostBlock", "ParallelThingsBlock", *SCALING_BLOCKS),
                        ("Attention", "DiffAttention"), BEFORE_BLOCKS, ("token", "avg", ""))
TIMM_LAYOUTS = {
    "VisionTransformer": VIT_LAYOUT,
    "VisionTransformerDistilled": VIT_LAYOUT,  # DeiT-distilled: two heads averaged (linear)
    "NaFlexVit": TimmLayout(("Block",), ("Attention",), (*BEFORE_BLOCKS, "embeds"), ("token", "avg", "")),
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
                            factors: dict[str, torch.Tensor], fused_bias: list[tuple[str, nn.Module]]) -> None:
    """The uniform rule's scales on one timm attention module's q / k / v projections (a fused ``qkv`` or separate
    ``q_proj`` / ``k_proj`` / ``v_proj``); an attention whose fused ``qkv`` takes its biases inside ``F.linear`` is
    added to ``fused_bias`` (its layout's forward of vitviz's runs it). A differential attention's q and k hold two
    half-width heads per head, each behind its own ``q k^T``: the same 1/4, 1/4, 1/2 per feature."""
    if getattr(attn, "gate", None) is not None:
        raise _refuse(model, f"{name} is gated (a sigmoid gate multiplies the attention output)")
    if isinstance(getattr(attn, "qkv", None), nn.Module):
        d = attn.qkv.out_features // 3
        factors[f"{name}.qkv"] = qkv_factor(rules, (d, d, d), attn.qkv.weight)
        if getattr(attn, "q_bias", None) is not None and not getattr(attn, "qkv_bias_separate", False):
            if layout.fused_bias_forward is None:
                raise _refuse(model, f"{name} adds q/v biases to its fused qkv projection itself")
            fused_bias.append((name, attn))
    else:
        _separate_qkv_factors(rules, name, attn, ("q_proj", "k_proj", "v_proj"), factors)


def timm_rules(model: nn.Module, rules: LRPRules, emit: Emit) -> Undo:
    """timm ``VisionTransformer`` (and DeiT-distilled) with ``Block`` or the post-norm ``ResPostBlock``, the parallel
    ``ParallelThingsBlock`` and ``ParallelScalingBlock``, ``Attention`` or differential attention (``DiffAttention``,
    ``DiffParallelScalingBlock``); ``NaFlexVit`` (the same blocks; its masked average pool is linear); ``Eva`` (EVA,
    EVA-02, DINOv3, PE, Sapiens2, the rotary ``vit_*_rope_*`` and ``vit_*_lingbot`` ViTs: ``EvaAttention`` or
    ``AttentionRope``, pre- or post-norm blocks); ``Beit`` (BEiT, BEiT v2); ``VisionTransformerRelPos``
    (``vit_relpos_*``, ``vit_srelpos_*``). Each with an ``Mlp``, ``SwiGLU`` or ``GluMlp``; class-token, average or
    attention pooling (``AttentionPoolLatent``). Fused attention stays on (its gradient is the softmax rule's).

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
        raise _refuse(model, f"vitviz has AttnLRP rules for timm's {', '.join(TIMM_LAYOUTS)} only, not {kind}")
    if getattr(model, "distilled_training", False) and model.training:
        raise _refuse(model, "distilled training mode returns two outputs")
    pool = getattr(model, "attn_pool", None)
    if (pool is not None and type(pool).__name__ != "AttentionPoolLatent") or (
            pool is None and getattr(model, "global_pool", "token") not in layout.pools):
        raise _refuse(model, f"global_pool={getattr(model, 'global_pool', None)!r} with {type(pool).__name__} (max "
                             "pooling, or an attention pool other than timm's AttentionPoolLatent) has no AttnLRP "
                             "rule in vitviz")
    factors: dict[str, torch.Tensor] = {}
    fused_bias: list[tuple[str, nn.Module]] = []
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
            raise _refuse(model, f"blocks.{i} is a {type(block).__name__} with {'/'.join(kinds) or 'no'} attention; "
                                 f"vitviz has AttnLRP rules for {'/'.join(layout.blocks)} with "
                                 f"{'/'.join(layout.attentions)} only (talking-heads attention is not covered)")
        for name, attn in attentions:
            _timm_attention_factors(model, layout, rules, name, attn, factors, fused_bias)
    late = list(getattr(model, "blocks_token_only", None) or ())
    for i, block in enumerate(late):
        name = f"blocks_token_only.{i}.attn"
        if (type(block).__name__, type(getattr(block, "attn", None)).__name__) != layout.class_attention:
            raise _refuse(model, f"blocks_token_only.{i} is a {type(block).__name__} with "
                                 f"{type(getattr(block, 'attn', None)).__name__}; vitviz has AttnLRP rules for "
                                 f"{'/'.join(layout.class_attention) or 'no class-attention blocks'} there")
        _separate_qkv_factors(rules, name, block.attn, ("q", "k", "v"), factors)  # q: the class token's, an input
    for name, m in model.named_modules():
        if type(m).__name__ == "SwiGLU":
            factors[f"{name}.fc1_g"], factors[f"{name}.fc1_x"] = gate_up_factors(rules, m.fc1_g, m.fc1_x)
        elif type(m).__name__ == "GluMlp":
            factors[f"{name}.fc1"] = fused_gate_factor(rules, m.fc1, gate_first=not m.gate_last)
    if pool is not None:  # a learned latent query: k and v only carry relevance (lrp.POOL_KV_FACTORS)
        e = pool.kv.out_features // 2
        factors["attn_pool.kv"] = pool_kv_factor(rules, (e, e), pool.kv.weight)
    constant = tuple(f"blocks.{i}.attn.{c}" for i in range(len(model.blocks)) for c in layout.constant_children)
    names = [(n, m) for n, m in model.named_modules() if n and n.split(".")[0] not in layout.off_path
             and not any(n == c or n.startswith(f"{c}.") for c in constant)]
    groups = classify(names, kind, {kind, *layout.blocks, *layout.attentions, *layout.class_attention, *TIMM_COMMON})
    undos = [install_generic(groups, rules, factors)]
    try:
        for name, attn in fused_bias:
            vt = sys.modules[type(attn).__module__]
            forward = layout.fused_bias_forward(attn, vt, name, rules, factors[f"{name}.qkv"])
            undos.append(set_attr(attn, "forward", forward))
        if late:  # CaiT's class token: read where it enters the first class-attention block, blk(x, x_cls)
            undos.append(input_hook(late[0], lambda t: emit(t, "late_prefix"), "x_cls", index=1))
    except BaseException:
        chain_undos(undos)()
        raise
    return _with_input_hook(chain_undos(undos), model.blocks[0], emit, "x")


def _mha_forward(mha: nn.MultiheadAttention, name: str, rules: LRPRules, pool: bool = False) -> Callable[..., tuple]:
    """``nn.MultiheadAttention`` with the rules on its projections (its own weights): self-attention, or with
    ``pool`` an attention pool whose query is a learned probe (SigLIP's head): the probe's projection is a constant
    (no relevance is read there) and ``k``, ``v`` get the pool's scales (``lrp.POOL_KV_FACTORS``)."""
    e, h = mha.embed_dim, mha.num_heads
    bias = mha.in_proj_bias
    qb, kb, vb = (None,) * 3 if bias is None else bias.chunk(3)
    packed = mha._qkv_same_embed_dim  # one in_proj_weight; else q_proj_weight, k_proj_weight, v_proj_weight
    w = mha.in_proj_weight if packed else mha.k_proj_weight
    factor = pool_kv_factor(rules, (e, e), w) if pool else qkv_factor(rules, (e, e, e), w)
    in_rule, out_rule = rules.linear_for(f"{name}.in_proj"), rules.linear_for(f"{name}.out_proj")
    what = "an attention pool (a probe query over the tokens as keys and values)" if pool else "self-attention"

    def forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: object = None,
                need_weights: bool = True, attn_mask: object = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        shaped = (key is value) and ((query is not key) if pool else (query is key))
        if not shaped or key_padding_mask is not None or attn_mask is not None or is_causal:
            raise UnsupportedModelError(f"{name}: AttnLRP in vitviz covers unmasked {what} only")
        x, qx = (key, query) if mha.batch_first else (key.transpose(0, 1), query.transpose(0, 1))
        b, n, _ = x.shape
        if pool and packed:  # as torch's _in_projection_packed: q alone, then k and v from one product
            q = F.linear(qx, w[:e], qb).detach()  # a constant of the weights
            k, v = lrp_linear(x, w[e:], None if bias is None else bias[e:], in_rule, rules, factor).chunk(2, dim=-1)
        elif pool:  # as torch's _in_projection: one product each
            q = F.linear(qx, mha.q_proj_weight, qb).detach()
            fk, fv = factor.chunk(2)
            k = lrp_linear(x, mha.k_proj_weight, kb, in_rule, rules, fk)
            v = lrp_linear(x, mha.v_proj_weight, vb, in_rule, rules, fv)
        else:
            q, k, v = lrp_linear(x, w, bias, in_rule, rules, factor).chunk(3, dim=-1)
        m = qx.shape[1]
        q = q.reshape(b, m, h, e // h).transpose(1, 2)
        k, v = (t.reshape(b, n, h, e // h).transpose(1, 2) for t in (k, v))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, m, e)
        out = lrp_linear(o, mha.out_proj.weight, mha.out_proj.bias, out_rule, rules)
        return (out if mha.batch_first else out.transpose(0, 1)), None

    return forward


def torchvision_rules(model: nn.Module, rules: LRPRules, emit: Emit) -> Undo:
    """torchvision ``VisionTransformer``: ``nn.MultiheadAttention`` runs a forward of vitviz's with the rules on its
    ``in_proj`` and ``out_proj`` (the module's own call of ``F.multi_head_attention_forward`` uses the weights
    directly, so no module-level rule would reach them)."""
    names = [(n, m) for n, m in model.named_modules()
             if n and not n.startswith("conv_proj") and not isinstance(m, nn.MultiheadAttention)
             and ".self_attention." not in f"{n}."]
    containers = {"Encoder", "Sequential", "EncoderBlock", "MLPBlock", "ModuleList", "VisionTransformer"}
    groups = classify(names, type(model).__name__, containers)
    undos = [install_generic(groups, rules)]
    try:
        for i, layer in enumerate(model.encoder.layers):
            mha = layer.self_attention
            name = f"encoder.layers.{list(model.encoder.layers._modules)[i]}.self_attention"
            if not _one_in_proj(mha):
                raise _refuse(model, f"{name} has separate q/k/v projections or extra key biases")
            undos.append(set_attr(mha, "forward", _mha_forward(mha, name, rules)))
        undos.append(input_hook(model.encoder.layers[0], emit, "input"))
    except BaseException:
        chain_undos(undos)()
        raise
    return chain_undos(undos)


OPEN_CLIP_CONTAINERS = {"VisionTransformer", "Transformer", "ResidualAttentionBlock", "Sequential", "ModuleList",
                        "LayerScale", "AttentionalPooler"}


def open_clip_rules(model: nn.Module, rules: LRPRules, emit: Emit) -> Undo:
    """An open_clip ``VisionTransformer`` tower with the standard ``ResidualAttentionBlock``: its
    ``nn.MultiheadAttention`` runs a forward of vitviz's with the rules on ``in_proj`` and ``out_proj`` (as for
    torchvision); GELU and QuickGELU take the identity rule. The output projection ``proj`` is a bare matrix the
    tower's forward multiplies by, so the tower runs a forward of vitviz's (its own ``_embeds``, ``transformer`` and
    ``_pool``, then the linear rule on that product, as ``F.linear`` with ``proj.T``). CoCa's attentional poolers
    (learned queries over the tokens; ``attentional_pool`` ``True``, ``"parallel"`` or ``"cascade"``) are attention
    pools: their ``nn.MultiheadAttention`` runs vitviz's forward in its pool mode (the queries' projection a
    constant, ``k`` and ``v`` with ``lrp.POOL_KV_FACTORS``, separate projections where the keys' width differs). A
    whole ``CLIP`` model is refused (its forward takes text and L2-normalises the features): explain
    ``model.visual``, the same weights."""
    if isinstance(getattr(model, "visual", None), nn.Module):
        raise _refuse(model, "it is an image-text model (its forward takes text and L2-normalises the features); "
                             "pass its vision tower (model.visual, the same weights) with a callable target on its "
                             "output")
    mhas = []
    for i, block in enumerate(model.transformer.resblocks):
        mha = getattr(block, "attn", None)
        name = f"transformer.resblocks.{i}.attn"
        if not _one_in_proj(mha):
            raise _refuse(model, f"{name} is not an nn.MultiheadAttention with one input projection")
        mhas.append((name, mha, False))
    for pooler in ("attn_pool", "attn_pool_contrastive"):  # CoCa's attentional poolers: learned queries
        if getattr(model, pooler, None) is not None:
            mha = getattr(model, pooler).attn
            if not _one_in_proj(mha, pool=True):
                raise _refuse(model, f"{pooler}.attn has extra key biases")
            mhas.append((f"{pooler}.attn", mha, True))
    off = tuple(f"{n}." for n, _, _ in mhas)
    names = [(n, m) for n, m in model.named_modules() if n and n.split(".")[0] not in ("conv1", "patch_dropout",
             "ln_pre") and not f"{n}.".startswith(off)]
    groups = classify(names, type(model).__name__, OPEN_CLIP_CONTAINERS)
    rule = rules.linear_for("proj")

    def forward(x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        pooled, tokens = model._pool(model.transformer(model._embeds(x)))
        if model.proj is not None:
            pooled = lrp_linear(pooled, model.proj.t(), None, rule, rules)
        return (pooled, tokens) if model.output_tokens else pooled

    undos = [install_generic(groups, rules)]
    try:
        for name, mha, pool in mhas:
            undos.append(set_attr(mha, "forward", _mha_forward(mha, name, rules, pool=pool)))
        undos.append(set_attr(model, "forward", forward))
    except BaseException:
        chain_undos(undos)()
        raise
    return _with_input_hook(chain_undos(undos), model.transformer, emit, "x")  # (B, N, D) whatever batch_first


HF_SUFFIXES = ("ForImageClassification", "ForImageClassificationWithTeacher", "Model", "Encoder", "Layer",
               "Attention", "SelfAttention", "SdpaSelfAttention", "SelfOutput", "Intermediate", "Output", "MLP",
               "LayerScale", "Pooler", "DropPath", "EncoderLayer", "VisionModel", "VisionModelWithProjection",
               "VisionAttention", "VisionEncoder", "VisionLayer", "VisionMLP",  # CLIP and the towers built from it
               "RelativePositionBias")  # BEiT: a table-only bias on the scores (absorbed by the softmax rule)
HF_GATED = {"Aimv2MLP": ("gate_proj", "up_proj"), "DINOv3ViTGatedMLP": ("gate_proj", "up_proj")}  # SwiGLU
HF_NORMS = ("Aimv2RMSNorm",)  # weight * x / sqrt(mean(x^2) + eps), as torch's RMSNorm (not Gemma's 1 + weight)
# attention pools with a learned query: SigLIP's runs an nn.MultiheadAttention (its forward is replaced), AIMv2's
# its k_proj / v_proj and SDPA (the scales sit on the projections)
HF_POOLS = {"SiglipMultiheadAttentionPoolingHead": ("attention",), "Aimv2AttentionPoolingHead": ("k_proj", "v_proj")}


def hf_rules(model: nn.Module, rules: LRPRules, emit: Emit, layers: list[nn.Module],
             attention: list[tuple[str, nn.Module]]) -> Undo:
    """Hugging Face ViT / ViTMSN / ViTMAE (its encoder, read unmasked in patch order as the capture reads it) / I-JEPA /
    DeiT / BEiT / data2vec vision / DINOv2 / DINOv3 / the CLIP vision towers
    (CLIP, MetaCLIP 2, Chinese-CLIP, AltCLIP: QuickGELU takes the identity rule as GELU does; ``pre_layrnorm`` runs
    before the first block, where the relevance is read): ``q_proj``, ``k_proj``, ``v_proj`` (or ``query``, ``key``,
    ``value``) of each attention module get the uniform rule's gradient scales; the attention (the interface, eager
    or SDPA; data2vec vision's own softmax or SDPA call) runs untouched. Image-text models are refused (their
    forward needs text): their ``vision_model`` is explained instead.

    DINOv3's rotary embedding rotates q and k by angles that depend on the input's size only: a linear map without
    bias, whose gradient x input is the LRP-0 rule (conservative), and its ``rope_embeddings`` module (the angles)
    is off the relevance path. Gated MLPs (DINOv3's ``use_gated_mlp``, the 7B model; AIMv2) get the uniform rule
    on the product (``lrp.GATE_FACTORS`` on ``gate_proj`` and ``up_proj``). The attention-pooling heads of SigLIP and
    AIMv2 (a learned query) get the pool's scales on ``k`` and ``v`` (``lrp.POOL_KV_FACTORS``); SigLIP's
    ``nn.MultiheadAttention`` runs a forward of vitviz's with its own weights."""
    kind = type(model).__name__
    model_type = getattr(model.config, "model_type", "")
    if isinstance(getattr(model, "text_model", None), nn.Module):
        raise _refuse(model, "it is an image-text model whose forward takes text too; pass its vision tower "
                             "(model.vision_model, the same weights) with a callable target on its output")
    stem = {"vit": "ViT", "vit_msn": "ViTMSN", "ijepa": "IJepa", "deit": "DeiT", "beit": "Beit", "dinov2": "Dinov2",
            "dinov2_with_registers": "Dinov2WithRegisters", "dinov3_vit": "DINOv3ViT",
            "data2vec-vision": "Data2VecVision", "clip": "CLIP", "clip_vision_model": "CLIP", "metaclip_2": "MetaClip2",
            "metaclip_2_vision_model": "MetaClip2", "chinese_clip_vision_model": "ChineseCLIP",
            "altclip_vision_model": "AltCLIP", "siglip": "Siglip", "siglip_vision_model": "Siglip",
            "aimv2_vision_model": "Aimv2", "vit_mae": "ViTMAE"}.get(model_type)
    if stem is None:
        raise _refuse(model, f"model_type={model_type!r}: vitviz has AttnLRP rules for Hugging Face ViT, ViTMSN, "
                             "ViTMAE, I-JEPA, DeiT, BEiT, data2vec vision, DINOv2, DINOv3, SigLIP, AIMv2 and the CLIP "
                             "vision towers (CLIP, MetaCLIP 2, Chinese-CLIP, AltCLIP) only")
    containers = {f"{stem}{s}" for s in HF_SUFFIXES} | {"ModuleList", "Sequential", *HF_GATED, *HF_POOLS}
    factors: dict[str, torch.Tensor] = {}
    mhas: list[tuple[str, nn.MultiheadAttention]] = []
    for name, m in model.named_modules():
        cls = type(m).__name__
        if isinstance(getattr(m, "gate_proj", None), nn.Linear) and cls not in HF_GATED:  # its product: no rule
            raise _refuse(model, f"{name} ({cls}) is a gated MLP vitviz has no rule for")
        if cls in HF_GATED:
            gate, up = HF_GATED[cls]
            factors[f"{name}.{gate}"], factors[f"{name}.{up}"] = gate_up_factors(rules, getattr(m, gate),
                                                                                   getattr(m, up))
        if cls in HF_POOLS and HF_POOLS[cls] == ("attention",):
            mhas.append((f"{name}.attention", m.attention))
        elif cls in HF_POOLS:
            k, v = (getattr(m, p) for p in HF_POOLS[cls])
            fk, fv = pool_kv_factor(rules, (k.out_features, v.out_features), k.weight).split(
                [k.out_features, v.out_features])
            factors[f"{name}.k_proj"], factors[f"{name}.v_proj"] = fk, fv
    off = tuple(f"{n}." for n, _ in mhas)  # their forward is vitviz's, with their own weights
    names = [(n, m) for n, m in model.named_modules()
             if n and not {"embeddings", "rope_embeddings"} & set(n.split(".")) and not f"{n}.".startswith(off)]
    groups = classify(names, kind, containers, norms=HF_NORMS)
    for name, attn in attention:
        # q_proj/k_proj/v_proj (transformers 5.23); DINOv2 under transformers 5.9 names them query/key/value
        parts = next((ps for ps in (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"))
                      if all(isinstance(getattr(attn, p, None), nn.Linear) for p in ps)), None)
        if parts is None:
            raise _refuse(model, f"{name} ({type(attn).__name__}) has no q_proj/k_proj/v_proj (or query/key/value) "
                                 "Linear layers")
        _separate_qkv_factors(rules, name, attn, parts, factors)
    undos = [install_generic(groups, rules, factors)]
    try:
        for name, mha in mhas:
            if not _one_in_proj(mha):
                raise _refuse(model, f"{name} has separate q/k/v projections or extra key biases")
            undos.append(set_attr(mha, "forward", _mha_forward(mha, name, rules, pool=True)))
    except BaseException:
        chain_undos(undos)()
        raise
    return _with_input_hook(chain_undos(undos), layers[0], emit, "hidden_states")
