"""timm Vision Transformers: ``VisionTransformer`` and its relatives.

Read exactly: ``VisionTransformer`` (DeiT, DeiT-distilled, registers, hybrids, FlexiViT, parallel blocks,
differential attention), ``Eva`` (EVA-02, rotary ViTs), ``Beit`` and ``VisionTransformerRelPos`` (relative
position bias), ``Cait`` (talking-heads self-attention over the patches, then class attention). What each layer's
captured map holds is its *map kind* (``vitviz.core.families.timm_probes``).

Position kinds: the absolute table's kind (``pos_kind.table_kind``), with ``+rotary`` (a ``rope`` module: EVA-02)
or ``+relative-bias`` (BEiT with ``use_abs_pos_emb``) when the model has that as well, as Hugging Face BEiT's
``learned+relative-bias``; without a table ``rotary``, ``relative-bias`` or ``none``.

Parallel blocks: ``ParallelThingsBlock`` (``*_18x2_*``, Touvron et al. 2022) has one attention module per branch,
named ``blocks.{i}.attns.{j}.attn``; ``ParallelScalingBlock`` (``*_xp_*``, ``vit_pwee*``, Dehghani et al. 2023)
and ``DiffParallelScalingBlock`` (``vit_dpwee*``) compute attention and MLP from one fused projection, so the
block itself (``blocks.{i}``) is the attention module.

Patch removal (``vitviz.faithfulness``): tokens are dropped after ``pos_drop`` (the position embedding added) in
``VisionTransformer`` with prefix tokens and a ``token`` or ``map`` readout, and in ``Beit`` with a ``token``
readout (its relative position biases are gathered over the kept tokens); every other model has its pixels filled.

Refused with ``UnsupportedModelError``: ``VisionTransformerSAM`` (windowed attention in most layers, over a
``(B, gh, gw, D)`` token map with a 4-D position table: the maps are per window, not over the image's tokens),
any other timm model whose attention modules vitviz has no probe for, and (when captured) an attention module or
``AttentionPoolLatent`` whose ``scale`` was changed while ``fused_attn`` is on (timm's fused kernel never reads
``scale``: ``timm_probes.check_fused_scale``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from vitviz.core.contexts import module_attribute, submodules
from vitviz.core.families.base import Family, Layout, Undo, chain_undos, set_attr
from vitviz.core.families.pooling import timm_pooled_token
from vitviz.core.families.pos_kind import table_kind
from vitviz.core.families.probes import probe_latent_pool
from vitviz.core.families.readout import Readout, timm_readout
from vitviz.core.families.timm_blocks import SCALING_BLOCKS, attention_of
from vitviz.core.families.timm_probes import check_fused_scale, map_kind, probe_timm, stream_probe_for
from vitviz.core.families.token_drop import gather_bias, gather_bias_hook, token_index
from vitviz.core.util import pair
from vitviz.errors import UnsupportedModelError

# attention modules whose maps a probe reads exactly (checked by tests/conformance.py against a recomputation)
KNOWN_ATTENTION = {
    "Attention", "AttentionRope", "EvaAttention", "RelPosAttention", "TalkingHeadAttn", "ClassAttn",
    "DiffAttention", *SCALING_BLOCKS,
}
REFUSED = {
    "VisionTransformerSAM": "its attention is windowed (14x14 windows in most layers, global in a few) over a "
                            "(B, gh, gw, D) token map with a 4-D position table and decomposed relative position "
                            "bias, so its maps are per window rather than over the image's tokens",
}


def unknown_attention(modules: list[tuple[str, nn.Module]]) -> list[str]:
    """Names of the attention classes among ``modules`` that no probe reads exactly: any class whose nearest timm
    class is not in ``KNOWN_ATTENTION``, and a subclass (named like a known one or not) whose ``forward`` is its
    own; a subclass that keeps timm's ``forward`` is read as the timm class it derives from."""
    out = []
    for _, module in modules:
        cls = type(module)
        base = next((c for c in cls.__mro__ if c.__module__.startswith("timm.")), None)
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if base is None or base.__name__ not in KNOWN_ATTENTION:
            out.append(cls.__name__ if cls.__name__ not in KNOWN_ATTENTION else qualified)
        elif cls is not base and cls.forward is not base.forward:
            out.append(f"{qualified} (a subclass of timm's {base.__name__} with its own forward)")
    return sorted(set(out))


def is_timm(model: nn.Module) -> bool:
    return any(c.__module__.startswith("timm.") for c in type(model).__mro__)


def relative_kinds(model: nn.Module) -> list[str]:
    """The position information a model has besides an absolute table: ``rotary`` (a ``rope`` module, EVA-02) and
    ``relative-bias`` (BEiT with ``use_abs_pos_emb``), each once, for kinds joined by ``+``."""
    return (["rotary"] if getattr(model, "rope", None) is not None else []) + (
        ["relative-bias"] if _has_relative_bias(model) else [])


def _latent_pool(model: nn.Module) -> nn.Module | None:
    """A ``VisionTransformer``'s (or ``Eva``'s) ``AttentionPoolLatent``, which it calls without a mask."""
    pool = getattr(model, "attn_pool", None)
    return pool if type(pool).__name__ == "AttentionPoolLatent" and hasattr(pool, "q_norm") else None


_RELATIVE_BIAS = ("relative_position_bias_table", "rel_pos", "rel_pos_bias", "shared_rel_pos")


@functools.cache
def _class_has_relative_name(cls: type) -> bool:
    return any(hasattr(cls, n) for n in _RELATIVE_BIAS)


def _has_relative_bias(model: nn.Module) -> bool:
    empty: dict = {}
    for m in submodules(model):
        d = m.__dict__  # a module none of whose dicts nor class has such a name is passed over without a lookup
        if not _class_has_relative_name(type(m)):
            params, buffers, children = (d.get("_parameters") or empty, d.get("_buffers") or empty,
                                         d.get("_modules") or empty)
            for n in _RELATIVE_BIAS:  # four names looked up, not a module's some thirty keys hashed
                if n in d or n in params or n in buffers or n in children:
                    break
            else:
                continue
        if any(module_attribute(m, n) is not None for n in _RELATIVE_BIAS):
            return True
    return False


class TimmFamily(Family):
    name = "timm"
    probe = staticmethod(probe_timm)
    stream_probe = staticmethod(stream_probe_for)

    def match(self, model: nn.Module) -> bool:
        if is_timm(model) and type(model).__name__ in REFUSED:
            return True  # recognised, then refused by layout() with the reason
        return (
            is_timm(model)
            and (hasattr(model, "num_prefix_tokens") or type(model).__name__ == "Cait")  # older timm: no attribute
            and hasattr(getattr(model, "patch_embed", None), "grid_size")
            and isinstance(getattr(model, "blocks", None), nn.Module)
        )

    def check_supported(self, model: nn.Module) -> None:
        cls = type(model).__name__
        if cls in REFUSED:
            raise UnsupportedModelError(f"{cls} (timm) is not supported: {REFUSED[cls]}")
        mods = self.attention_modules(model)
        if not mods:
            raise UnsupportedModelError(f"{cls} (timm) has no attention module vitviz can find in model.blocks")
        unknown = unknown_attention(mods)
        if unknown:
            raise UnsupportedModelError(
                f"{cls} (timm) uses the attention module {unknown[0]}, which vitviz has no exact probe for; "
                "describe the model with vitviz.describe(model, probe=...) if its attention is softmax(q k^T)"
            )

    def pooled_token(self, model: nn.Module, tokens: torch.Tensor, prefix_tokens: tuple[str, ...]) -> torch.Tensor:
        """As ``global_pool`` pools (``pooling.timm_pooled_token``); ``"token"`` and attention pooling: the default.

        CaiT: its self-attention blocks run over the patches alone and are pooled by the mean of their patch
        tokens; its class-attention blocks output the class token alone, which is their feature."""
        if hasattr(model, "blocks_token_only"):
            return tokens[:, 0] if tokens.shape[1] == 1 else tokens.mean(dim=1)
        pooled = timm_pooled_token(model, tokens, len(prefix_tokens))
        return super().pooled_token(model, tokens, prefix_tokens) if pooled is None else pooled

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """As ``forward_head`` reads the tokens (``readout.timm_readout``); an ``AttentionPoolLatent`` is read
        exactly (``readout_attention``)."""
        return timm_readout(model, prefix_tokens, _latent_pool(model) is not None)

    def readout_attention(self, model: nn.Module, emit: Any) -> Undo | None:
        """``AttentionPoolLatent`` (``global_pool="map"``): its attention recomputed from its ``q`` and ``k``
        (``probes.probe_latent_pool``); query 0 for ``pool="token"``, else every query averaged."""
        pool = _latent_pool(model)
        if pool is None:
            return None
        try:  # recomputed with pool.scale, which its fused kernel never reads
            check_fused_scale(pool, "attn_pool")
        except UnsupportedModelError as err:
            raise UnsupportedModelError(f"{type(model).__name__} (timm): {err}") from err
        return probe_latent_pool(pool, "first" if getattr(pool, "pool", "token") == "token" else "all", emit)

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        tokens: list[str] = []
        if getattr(model, "cls_token", None) is not None:
            tokens.append("cls")
        if getattr(model, "dist_token", None) is not None:
            tokens.append("dist")
        reg = getattr(model, "reg_token", None)
        if reg is not None:
            tokens += ["reg"] * reg.shape[1]
        count = getattr(model, "num_prefix_tokens", len(tokens))  # timm < 1.0.27 CaiT has no num_prefix_tokens
        if len(tokens) != count:
            tokens = ["prefix"] * count
        return tuple(tokens)

    def layout(self, model: nn.Module) -> Layout:
        self.check_supported(model)
        pe = model.patch_embed
        grid = pair(pe.grid_size)
        stride = pair(pe.feat_ratio(as_scalar=False)) if hasattr(pe, "feat_ratio") else pair(pe.patch_size)
        img = pair(pe.img_size) if getattr(pe, "img_size", None) is not None else (grid[0] * stride[0],
                                                                                     grid[1] * stride[1])
        prefix = self.prefix_tokens(model)
        pos = self.pos_embed(model)
        kind = getattr(model, "pos_embed_kind", None)  # a model that generates its table says what it is
        covers = False
        if pos is None:
            if not kind:
                kind = ("rotary" if getattr(model, "rope", None) is not None
                        else "relative-bias" if _has_relative_bias(model) else "none")
        else:
            num_patches = grid[0] * grid[1]
            if pos.shape[1] == num_patches + len(prefix) and len(prefix) and not getattr(model, "no_embed_class",
                                                                                          False):
                covers = True
            elif pos.shape[1] != num_patches:
                raise UnsupportedModelError(
                    f"{type(model).__name__}: pos_embed has {pos.shape[1]} rows but the {grid[0]}x{grid[1]} grid "
                    f"has {num_patches} patches and {len(prefix)} prefix tokens; the model is inconsistent"
                )
            kind = kind or table_kind(pos, grid, len(prefix) if covers else 0)
            kind = "+".join([kind] + relative_kinds(model))  # as Hugging Face BEiT: "learned+relative-bias"
        mods = self.attention_modules(model)
        first = mods[0][1]
        return Layout(
            img_size=img,
            patch_size=stride,
            grid_size=grid,
            prefix_tokens=prefix,
            pos_embed_kind=kind,
            pos_embed_covers_prefix=covers,
            depth=len(model.blocks) + len(getattr(model, "blocks_token_only", ())),
            num_heads=int(getattr(first, "num_heads", 0)),
            embed_dim=int(model.embed_dim),
            hybrid=hasattr(pe, "backbone"),
            dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
        )

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        mods = [m for i, b in enumerate(model.blocks) for m in attention_of(b, i)]
        for i, b in enumerate(getattr(model, "blocks_token_only", ())):  # CaiT class-attention layers
            mods.append((f"blocks_token_only.{i}.attn", b.attn))
        return mods

    def attention_maps(self, model: nn.Module) -> list[str]:
        return [map_kind(m) for _, m in self.attention_modules(model)]

    def attention_blocks(self, model: nn.Module) -> list[int]:
        names = [n for n, _ in self.attention_modules(model)]
        keys = [".".join(n.split(".")[:2]) for n in names]  # blocks.3 / blocks_token_only.0
        order = list(dict.fromkeys(keys))
        return [order.index(k) for k in keys]

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        return getattr(model, "pos_embed", None)

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return getattr(model.patch_embed, "proj", None)

    def stem_conv(self, model: nn.Module) -> nn.Conv2d | None:
        backbone = getattr(model.patch_embed, "backbone", None)
        if backbone is None:
            return super().stem_conv(model)
        return next((m for m in backbone.modules() if isinstance(m, nn.Conv2d) and m.in_channels == 3), None)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        return {
            "patch_embed": ("patch_embed.",),
            "pos_embed": ("pos_embed",),
            "prefix_tokens": ("cls_token", "dist_token", "reg_token"),
            "blocks": ("blocks.", "blocks_token_only.", "rel_pos", "rope."),
            "norm": ("norm_pre.", "norm."),
            "head": ("fc_norm.", "attn_pool.", "head.", "head_dist."),
        }

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        from timm.data import resolve_data_config

        return resolve_data_config(model=model)

    def _token_drop(self, model: nn.Module) -> tuple[nn.Module | None, str]:
        from timm.models.vision_transformer import VisionTransformer

        cls = type(model).__name__
        pool = getattr(model, "global_pool", None)
        if getattr(model, "rope", None) is not None:
            return None, f"{cls} (timm) encodes positions by rotary embeddings inside attention"
        if int(getattr(model, "num_prefix_tokens", 0)) == 0 or cls == "Cait":
            return None, (f"{cls} (timm) has no prefix token in the sequence at its position embedding (the readout "
                          "would be empty with every patch dropped)")
        if isinstance(model, VisionTransformer) and pool in ("token", "map"):
            return model.pos_drop, ""
        if cls == "Beit" and pool == "token":
            return model.pos_drop, ""
        if pool not in ("token", "map"):
            return None, f"{cls} (timm) reads out global_pool={pool!r}, a mean over patch tokens"
        return None, f"vitviz has no token-dropping point for {cls} (timm)"

    def token_drop_module(self, model: nn.Module) -> nn.Module | None:
        return self._token_drop(model)[0]

    def token_drop_refusal(self, model: nn.Module) -> str:
        return self._token_drop(model)[1]

    def drop_tokens(self, model: nn.Module, keep: torch.Tensor, num_prefix_tokens: int) -> Undo:
        undos = [super().drop_tokens(model, keep, num_prefix_tokens)]
        if type(model).__name__ == "Beit":  # relative position biases over the kept tokens' own positions
            index = token_index(num_prefix_tokens, keep)
            shared = getattr(model, "rel_pos_bias", None)
            if isinstance(shared, nn.Module):
                undos.append(gather_bias_hook(shared, index))
            for block in model.blocks:
                attn = block.attn
                if getattr(attn, "relative_position_bias_table", None) is not None:
                    original = type(attn)._get_rel_pos_bias.__get__(attn)
                    undos.append(set_attr(attn, "_get_rel_pos_bias",
                                           lambda original=original: gather_bias(original(), index)))
        return chain_undos(undos)

    def lrp_rules(self, model: nn.Module, rules: Any, emit: Any) -> Any:
        from vitviz.core.families.lrp_timm import timm_rules

        return timm_rules(model, rules, emit)
