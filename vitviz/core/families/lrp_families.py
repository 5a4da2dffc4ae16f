"""Where each family's AttnLRP rules go (``Family.lrp_rules``); the rules themselves are in ``lrp.py``, timm's
installer in ``lrp_timm.py``.

Each installer checks that every module after the token embedding computes something vitviz has a rule for
(refusing the model with ``UnsupportedModelError`` otherwise), installs the rules on the instances, hooks the first
block's input, and returns the undo.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vitviz.core.families.base import Undo, chain_undos, set_attr
from vitviz.core.families.lrp import (
    LRPRules,
    classify,
    gate_up_factors,
    input_hook,
    install_generic,
    lrp_linear,
    pool_kv_factor,
    qkv_factor,
)
from vitviz.errors import UnsupportedModelError

Emit = Callable[..., None]  # emit(tokens); emit(prefix, "late_prefix") for CaiT's class token


def refuse(model: nn.Module, reason: str) -> UnsupportedModelError:
    """The refusal every installer raises: the model's class, the reason, and the method that runs instead."""
    return UnsupportedModelError(f"{type(model).__name__}: AttnLRP is not available for this model: {reason}; "
                                 "use explain(method='chefer') instead")


def with_input_hook(undo: Undo, first_block: nn.Module, emit: Emit, arg: str, rules: LRPRules) -> Undo:
    """``undo`` chained with the hook that reads the first block's input (``lrp.input_hook``; a leaf unless the
    relevance is read at the pixels); ``undo`` runs also when the hook cannot be installed."""
    try:
        return chain_undos([undo, input_hook(first_block, emit, arg, leaf=rules.read_at == "tokens")])
    except BaseException:
        undo()
        raise


def separate_qkv_factors(rules: LRPRules, name: str, attn: nn.Module, parts: tuple[str, str, str],
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
             if n and (rules.read_at == "pixels" or not n.startswith("conv_proj"))
             and not isinstance(m, nn.MultiheadAttention) and ".self_attention." not in f"{n}."]
    containers = {"Encoder", "Sequential", "EncoderBlock", "MLPBlock", "ModuleList", "VisionTransformer"}
    groups = classify(names, type(model).__name__, containers)
    undos = [install_generic(groups, rules)]
    try:
        for i, layer in enumerate(model.encoder.layers):
            mha = layer.self_attention
            name = f"encoder.layers.{list(model.encoder.layers._modules)[i]}.self_attention"
            if not _one_in_proj(mha):
                raise refuse(model, f"{name} has separate q/k/v projections or extra key biases")
            undos.append(set_attr(mha, "forward", _mha_forward(mha, name, rules)))
        undos.append(input_hook(model.encoder.layers[0], emit, "input", leaf=rules.read_at == "tokens"))
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
        raise refuse(model, "it is an image-text model (its forward takes text and L2-normalises the features); "
                             "pass its vision tower (model.visual, the same weights) with a callable target on its "
                             "output")
    mhas = []
    for i, block in enumerate(model.transformer.resblocks):
        mha = getattr(block, "attn", None)
        name = f"transformer.resblocks.{i}.attn"
        if not _one_in_proj(mha):
            raise refuse(model, f"{name} is not an nn.MultiheadAttention with one input projection")
        mhas.append((name, mha, False))
    for pooler in ("attn_pool", "attn_pool_contrastive"):  # CoCa's attentional poolers: learned queries
        if getattr(model, pooler, None) is not None:
            mha = getattr(model, pooler).attn
            if not _one_in_proj(mha, pool=True):
                raise refuse(model, f"{pooler}.attn has extra key biases")
            mhas.append((f"{pooler}.attn", mha, True))
    off = tuple(f"{n}." for n, _, _ in mhas)
    embedding = () if rules.read_at == "pixels" else ("conv1", "patch_dropout", "ln_pre")
    names = [(n, m) for n, m in model.named_modules() if n and n.split(".")[0] not in embedding
             and not f"{n}.".startswith(off)]
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
    return with_input_hook(chain_undos(undos), model.transformer, emit, "x", rules)  # (B, N, D) whatever batch_first


HF_SUFFIXES = ("ForImageClassification", "ForImageClassificationWithTeacher", "Model", "Encoder", "Layer",
               "Attention", "SelfAttention", "SdpaSelfAttention", "SelfOutput", "Intermediate", "Output", "MLP",
               "LayerScale", "Pooler", "DropPath", "EncoderLayer", "VisionModel", "VisionModelWithProjection",
               "VisionAttention", "VisionEncoder", "VisionLayer", "VisionMLP",  # CLIP and the towers built from it
               "RelativePositionBias",  # BEiT: a table-only bias on the scores (absorbed by the softmax rule)
               "Embeddings", "PatchEmbeddings", "VisionEmbeddings")  # read at the pixels: patch conv, + tables
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
        raise refuse(model, "it is an image-text model whose forward takes text too; pass its vision tower "
                             "(model.vision_model, the same weights) with a callable target on its output")
    stem = {"vit": "ViT", "vit_msn": "ViTMSN", "ijepa": "IJepa", "deit": "DeiT", "beit": "Beit", "dinov2": "Dinov2",
            "dinov2_with_registers": "Dinov2WithRegisters", "dinov3_vit": "DINOv3ViT",
            "data2vec-vision": "Data2VecVision", "clip": "CLIP", "clip_vision_model": "CLIP", "metaclip_2": "MetaClip2",
            "metaclip_2_vision_model": "MetaClip2", "chinese_clip_vision_model": "ChineseCLIP",
            "altclip_vision_model": "AltCLIP", "siglip": "Siglip", "siglip_vision_model": "Siglip",
            "aimv2_vision_model": "Aimv2", "vit_mae": "ViTMAE"}.get(model_type)
    if stem is None:
        raise refuse(model, f"model_type={model_type!r}: vitviz has AttnLRP rules for Hugging Face ViT, ViTMSN, "
                             "ViTMAE, I-JEPA, DeiT, BEiT, data2vec vision, DINOv2, DINOv3, SigLIP, AIMv2 and the CLIP "
                             "vision towers (CLIP, MetaCLIP 2, Chinese-CLIP, AltCLIP) only")
    containers = {f"{stem}{s}" for s in HF_SUFFIXES} | {"ModuleList", "Sequential", *HF_GATED, *HF_POOLS}
    factors: dict[str, torch.Tensor] = {}
    mhas: list[tuple[str, nn.MultiheadAttention]] = []
    for name, m in model.named_modules():
        cls = type(m).__name__
        if isinstance(getattr(m, "gate_proj", None), nn.Linear) and cls not in HF_GATED:  # its product: no rule
            raise refuse(model, f"{name} ({cls}) is a gated MLP vitviz has no rule for")
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
    constant = {"rope_embeddings"} | ({"embeddings"} if rules.read_at == "tokens" else set())
    names = [(n, m) for n, m in model.named_modules()
             if n and not constant & set(n.split(".")) and not f"{n}.".startswith(off)]
    groups = classify(names, kind, containers, norms=HF_NORMS)
    for name, attn in attention:
        # q_proj/k_proj/v_proj (transformers 5.23); DINOv2 under transformers 5.9 names them query/key/value
        parts = next((ps for ps in (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"))
                      if all(isinstance(getattr(attn, p, None), nn.Linear) for p in ps)), None)
        if parts is None:
            raise refuse(model, f"{name} ({type(attn).__name__}) has no q_proj/k_proj/v_proj (or query/key/value) "
                                 "Linear layers")
        separate_qkv_factors(rules, name, attn, parts, factors)
    undos = [install_generic(groups, rules, factors)]
    try:
        for name, mha in mhas:
            if not _one_in_proj(mha):
                raise refuse(model, f"{name} has separate q/k/v projections or extra key biases")
            undos.append(set_attr(mha, "forward", _mha_forward(mha, name, rules, pool=True)))
    except BaseException:
        chain_undos(undos)()
        raise
    return with_input_hook(chain_undos(undos), layers[0], emit, "hidden_states", rules)
