"""Probes for timm attention modules whose maps are not plain softmax probabilities over one token sequence.

Every probe emits ``(B, H, N, N)`` with ``N`` the model's token count (prefix + patches), the map that multiplies
the values of that layer, and a *map kind* (``ViTSpec.attention_maps``) says what its rows hold:

- ``softmax``: post-softmax probabilities; rows sum to 1 (timm ``Attention``, ``EvaAttention``, ``AttentionRope``,
  BEiT and relative-position attention, the branches of ``ParallelThingsBlock``, ``ParallelScalingBlock``).
- ``talking-heads`` (CaiT ``TalkingHeadAttn``, Touvron et al. 2021, Sec. 3 / Shazeer et al. 2020): the patch
  self-attention maps *after* the second head mixing, ``A'_h = sum_g W_hg softmax(sum_g' L_gg' s_g')_g + b_h``
  (``proj_l`` before, ``proj_w`` after the softmax). These are the weights that multiply the values. They are
  signed, and patch row ``i`` of head ``h`` sums to ``sum_g W_hg + P b_h`` (``W``, ``b``: ``proj_w``'s weight and
  bias, ``P``: patch keys), the same for every row. The class token does not take part in these layers (it is
  added after them), so its row and column are those of the identity (the token passes unchanged).
- ``class-attention`` (CaiT ``ClassAttn``): only the class token queries (over ``[cls, patches]``, softmax, row
  sums 1); patch tokens are not updated by these layers, so their rows are identity rows (sum 1).
- ``differential`` (``DiffAttention``, Ye et al. 2024, Eq. 1): ``softmax(Q1 K1^T s) - lambda softmax(Q2 K2^T s)``
  per head, with timm's ``lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init`` (one scalar per layer), before the
  per-head ``sub_norm`` (an RMSNorm of the head's output, which timm then scales by ``1 - lambda_init``). Signed;
  rows sum to ``1 - lambda``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Emit, Undo, _chain, _set_attr, probe_attn_drop
from vitviz.errors import VitvizError

MAP_KINDS = ("softmax", "talking-heads", "class-attention", "differential")


def _hook_attn_drop(module: nn.Module, transform: Any) -> Undo:
    drop = getattr(module, "attn_drop", None)
    if not isinstance(drop, nn.Module):
        raise VitvizError(f"{type(module).__name__} has no attn_drop module to read attention from")
    undos: list[Undo] = []
    if hasattr(module, "fused_attn"):
        undos.append(_set_attr(module, "fused_attn", False))
    undos.append(drop.register_forward_hook(lambda _m, inputs, _out: transform(inputs[0])).remove)
    return _chain(undos)


def embed_patch_maps(attn: torch.Tensor, num_prefix: int = 1) -> torch.Tensor:
    """``(B, H, P, P)`` patch-only maps -> ``(B, H, prefix + P, prefix + P)``, identity rows for the prefix."""
    b, h, p, _ = attn.shape
    n = num_prefix + p
    out = attn.new_zeros(b, h, n, n)
    out[:, :, num_prefix:, num_prefix:] = attn
    idx = torch.arange(num_prefix, device=attn.device)
    out[:, :, idx, idx] = 1
    return out


def embed_class_rows(attn: torch.Tensor) -> torch.Tensor:
    """``(B, H, 1, N)`` class-token rows -> ``(B, H, N, N)``, identity rows for the patch tokens."""
    b, h, _, n = attn.shape
    out = torch.eye(n, dtype=attn.dtype, device=attn.device).expand(b, h, n, n).clone()
    out[:, :, :1] = attn
    return out


def probe_talking_heads(module: nn.Module, emit: Emit) -> Undo:
    """CaiT ``TalkingHeadAttn``: the post-``proj_w`` maps over the patches, embedded with the class token."""
    return _hook_attn_drop(module, lambda a: emit(embed_patch_maps(a, 1)))


def probe_class_attn(module: nn.Module, emit: Emit) -> Undo:
    """CaiT ``ClassAttn``: the class token's softmax row, patch rows identity."""
    return _hook_attn_drop(module, lambda a: emit(embed_class_rows(a)))


def probe_diff(module: nn.Module, emit: Emit) -> Undo:
    """``DiffAttention`` / ``DiffParallelScalingBlock``: the effective signed map ``S1 - lambda S2`` per head."""
    heads = int(module.num_heads)

    def transform(a: torch.Tensor) -> None:
        b, _h2, n, _ = a.shape
        pair = a.view(b, heads, 2, n, n)
        lam = module._compute_lambda().type_as(a)  # as in timm's forward: keeps the graph for grad methods
        emit(pair[:, :, 0] - lam * pair[:, :, 1])

    return _hook_attn_drop(module, transform)


_PROBES = {
    "TalkingHeadAttn": (probe_talking_heads, "talking-heads"),
    "ClassAttn": (probe_class_attn, "class-attention"),
    "DiffAttention": (probe_diff, "differential"),
    "DiffParallelScalingBlock": (probe_diff, "differential"),
}


def map_kind(module: nn.Module) -> str:
    """The map kind a timm attention module yields (see module docstring)."""
    for cls in type(module).__mro__:
        if cls.__name__ in _PROBES:
            return _PROBES[cls.__name__][1]
    return "softmax"


def probe_timm(module: nn.Module, emit: Emit) -> Undo:
    """Dispatch on the attention module's class; plain softmax attention uses ``probe_attn_drop``."""
    for cls in type(module).__mro__:
        if cls.__name__ in _PROBES:
            return _PROBES[cls.__name__][0](module, emit)
    return probe_attn_drop(module, emit)
