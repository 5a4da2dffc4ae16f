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

``probe_timm_stream`` serves ``capture_attention(heads="stream")`` on timm's plain ``Attention``: the module keeps
its fused ``scaled_dot_product_attention`` (the forward's output is bit-for-bit the plain forward's), and each
head's ``softmax(q_h k_h^T * scale + bias)`` is recomputed (``stream.recomputed_heads``) from the ``q`` and ``k``
that ``q_norm`` and ``k_norm`` return, with the mask built by timm's own ``resolve_self_attn_mask``. A call whose
``(B, H, N, N)`` maps are small (under ``stream.EXPLICIT_BELOW_BYTES``, 8 MiB) and that the kernels do not serve
runs timm's explicit path instead, for that call only, and hands on its maps (in the model's dtype). On CUDA the
``HeadMaps``' ``fuse`` and ``distance_sums`` run the Triton kernels of ``vitviz.core.kernels.headmaps``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

import vitviz.core.families.stream as stream
from vitviz.core import kernels
from vitviz.core.families.base import Emit, HeadMaps, Probe, Undo, chain_undos, probe_attn_drop, set_attr
from vitviz.errors import CaptureError, UnsupportedModelError

MAP_KINDS = ("softmax", "talking-heads", "class-attention", "differential")


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
    return probe_attn_drop(module, lambda a: emit(embed_patch_maps(a, 1)))


def probe_class_attn(module: nn.Module, emit: Emit) -> Undo:
    """CaiT ``ClassAttn``: the class token's softmax row, patch rows identity."""
    return probe_attn_drop(module, lambda a: emit(embed_class_rows(a)))


def probe_diff(module: nn.Module, emit: Emit) -> Undo:
    """``DiffAttention`` / ``DiffParallelScalingBlock``: the effective signed map ``S1 - lambda S2`` per head."""
    heads = int(module.num_heads)

    def transform(a: torch.Tensor) -> None:
        b, _h2, n, _ = a.shape
        pair = a.view(b, heads, 2, n, n)
        lam = module._compute_lambda().type_as(a)  # as in timm's forward: keeps the graph for grad methods
        emit(pair[:, :, 0] - lam * pair[:, :, 1])

    return probe_attn_drop(module, transform)


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


def _timm_attention_module(module: nn.Module) -> Any | None:
    """The Python module that defines ``type(module)`` when ``module`` is exactly timm's plain ``Attention`` (the
    class ``timm.models.vision_transformer`` uses; not a subclass, which may compute attention differently) and the
    mask helpers its explicit path calls live there (``timm.layers.attention`` in timm 1.0.26 to 1.0.31); else
    None."""
    vision_transformer = sys.modules.get("timm.models.vision_transformer")
    if vision_transformer is None or type(module) is not getattr(vision_transformer, "Attention", None):
        return None
    vt = sys.modules.get(type(module).__module__)
    if vt is None or not all(callable(getattr(vt, f, None)) for f in ("resolve_self_attn_mask", "maybe_add_mask")):
        return None
    q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
    if not isinstance(q_norm, nn.Module) or not isinstance(k_norm, nn.Module) or q_norm is k_norm:
        return None
    if not isinstance(getattr(module, "attn_drop", None), nn.Module):
        return None
    if not isinstance(getattr(module, "scale", None), float) or not isinstance(getattr(module, "num_heads", None), int):
        return None
    return vt


def stream_probe_for(module: nn.Module) -> Probe | None:
    """``probe_timm_stream`` for timm's plain ``Attention``; None for every other module."""
    return probe_timm_stream if _timm_attention_module(module) is not None else None


def _recomputed_heads(vt: Any, module: nn.Module, q: torch.Tensor, k: torch.Tensor, attn_mask: Any,
                      is_causal: bool, kernel: bool = False) -> HeadMaps:
    """``stream.recomputed_heads`` with the bias timm's explicit path adds (its own ``resolve_self_attn_mask``)."""
    n = q.shape[2]
    return stream.recomputed_heads(q, k, module.scale, lambda scores: vt.resolve_self_attn_mask(
        n, scores, attn_mask, is_causal), kernel=kernel, attn_mask=attn_mask, is_causal=is_causal)


def probe_timm_stream(module: nn.Module, emit: Emit) -> Undo:
    """timm ``Attention`` under ``heads="stream"``: fused attention left on, ``HeadMaps`` recomputed from q, k.

    For a call whose maps would take fewer than ``EXPLICIT_BELOW_BYTES``, the module runs its explicit path
    instead (``fused_attn`` off for that call only) and the softmax output read at ``attn_drop`` is handed on.
    """
    vt = _timm_attention_module(module)
    if vt is None:
        raise UnsupportedModelError(f"{type(module).__name__} is not timm's plain Attention; it has no stream probe")
    state: dict[str, Any] = {}

    def restore() -> None:
        undo = state.pop("restore", None)
        if undo is not None:
            undo()

    def before(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        restore()
        state.clear()
        x = args[0] if args else kwargs.get("x")
        b, n = int(x.shape[0]), int(x.shape[1])
        state["kernel"] = kernels.use_kernel(x.device)  # the kernels beat materialising, small maps too
        state["explicit"] = stream.explicit_is_cheaper(b, module.num_heads, n, state["kernel"])
        if state["explicit"] and getattr(module, "fused_attn", False):
            state["restore"] = set_attr(module, "fused_attn", False)
        state["mask"] = kwargs.get("attn_mask", args[1] if len(args) > 1 else None)
        state["causal"] = bool(kwargs.get("is_causal", args[2] if len(args) > 2 else False))

    def on_q(_m: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        state["q"] = out

    def on_k(_m: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        state["k"] = out

    def on_drop(_m: nn.Module, inputs: Any, _out: Any) -> None:
        if state.get("explicit"):
            state["maps"] = inputs[0].detach()

    def after(_m: nn.Module, _inputs: Any, _out: Any) -> None:
        restore()
        q, k, maps = state.pop("q", None), state.pop("k", None), state.pop("maps", None)
        mask, causal = state.pop("mask", None), state.pop("causal", False)
        if state.pop("explicit", False):
            if maps is None:
                raise CaptureError(f"{type(module).__name__}: attn_drop did not run in this forward pass, so "
                                   "vitviz cannot read its attention")
            emit(HeadMaps.of(maps))
            return
        if q is None or k is None:
            raise CaptureError(f"{type(module).__name__}: q_norm / k_norm did not run in this forward pass, so "
                               "vitviz cannot recompute its attention")
        kernel = state.pop("kernel", False) and stream.use_kernel_for(q)  # float64: the PyTorch path
        emit(_recomputed_heads(vt, module, q.detach(), k.detach(), mask, causal, kernel))

    handles = [module.register_forward_pre_hook(before, with_kwargs=True),
               module.q_norm.register_forward_hook(on_q), module.k_norm.register_forward_hook(on_k),
               module.attn_drop.register_forward_hook(on_drop), module.register_forward_hook(after)]
    return chain_undos([restore, *(hd.remove for hd in handles)])
