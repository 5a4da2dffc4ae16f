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

``probe_timm_stream`` serves ``capture_attention(heads="stream")`` on timm's plain ``Attention``, on the rotary
``EvaAttention`` and ``AttentionRope`` (EVA, EVA-02, DINOv3, PE, ``vit_*_rope_*``) and on the relative-position
``RelPosAttention`` (``vit_relpos_*``, ``vit_srelpos_*``), BEiT ``Attention`` (BEiT, BEiT v2),
``ParallelScalingBlock`` (``vit_pwee_*``, ``*_xp_*``) and differential attention (``DiffAttention``,
``DiffParallelScalingBlock``: each head ``S_2h - lambda S_2h+1`` from the ``2 H`` heads of the forward's two kernel
calls, ``stream.differential_heads``; no vitviz reduction takes these signed maps, so this serves
``capture_attention(heads="stream")`` itself, with the forward left fused). CaiT has none: timm's
``TalkingHeadAttn`` has no fused path, and ``ClassAttn`` forms one row per head. The module keeps its fused
``scaled_dot_product_attention`` (the forward's output is bit-for-bit the plain forward's), and each head's
``softmax(q_h k_h^T * scale + bias)`` is recomputed (``stream.recomputed_heads``) from the ``q`` and ``k`` the
kernel was given: those ``q_norm`` and ``k_norm`` return (BEiT: its ``qkv`` weight and ``q_bias`` / ``k_bias``
applied once more to the block's tokens), rotated past the prefix tokens by the defining module's own
``apply_rot_embed_cat`` with the ``rope`` the call received (rotary classes), key heads repeated for grouped-query
attention; the bias is the mask built by timm's own ``resolve_self_attn_mask``, or the relative position bias the
fused path passes as ``attn_mask`` (``rel_pos.get_bias()``, ``_get_rel_pos_bias()``, the shared bias). A call whose
``(B, H, N, N)`` maps are small (under ``stream.EXPLICIT_BELOW_BYTES``, 8 MiB) and that the kernels do not serve
runs timm's explicit path instead, for that call only, and hands on its maps (in the model's dtype). On CUDA the
``HeadMaps``' ``fuse`` and ``distance_sums`` run the Triton kernels of ``vitviz.core.kernels.headmaps``.
"""

from __future__ import annotations

import inspect
import math
import sys
import weakref
from typing import Any

import torch
from torch import nn

import vitviz.core.families.stream as stream
from vitviz.core import kernels
from vitviz.core.contexts import once_per_window
from vitviz.core.families.base import Emit, HeadMaps, Probe, Undo, chain_undos, held_attr, plain_linear
from vitviz.core.families.probes import probe_attn_drop
from vitviz.core.kernels import forward_lse
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


def _fused_head_dim(module: nn.Module) -> int | None:
    """The width of the heads timm's fused kernel is given (its default scale is ``head_dim ** -0.5``): the module's
    ``head_dim``, else read off its ``qkv`` (BEiT) or ``k`` (CaiT ``ClassAttn``) projection; None where unknown."""
    head_dim, heads = getattr(module, "head_dim", None), getattr(module, "num_heads", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    if not isinstance(heads, int) or heads <= 0:
        return None
    qkv, k = getattr(module, "qkv", None), getattr(module, "k", None)
    if isinstance(qkv, nn.Linear) and qkv.out_features % (3 * heads) == 0:
        return qkv.out_features // (3 * heads)
    if isinstance(k, nn.Linear) and k.out_features % heads == 0:
        return k.out_features // heads
    return None


def check_fused_scale(module: nn.Module, name: str = "") -> None:
    """Refuse a timm attention module whose ``scale`` was changed while its fused path is on.

    timm's fused path calls ``scaled_dot_product_attention`` without ``scale=``: it scales by ``head_dim ** -0.5``
    and never reads ``scale``, which only the explicit path multiplies in. Such a model computes with the default
    scale, but the explicit path a capture switches on (and the recomputation of ``heads="stream"``) would use
    ``scale``: maps the model does not compute, and outputs that change while captured.

    Raises:
        UnsupportedModelError: naming the module's class, both scales and the fix.
    """
    scale = getattr(module, "scale", None)
    if not getattr(module, "fused_attn", False) or not isinstance(scale, (int, float)) or isinstance(scale, bool):
        return
    if not any(c.__module__.startswith("timm.") for c in type(module).__mro__):
        return
    head_dim = _fused_head_dim(module)
    if head_dim is None:
        return
    default = head_dim ** -0.5
    if math.isclose(float(scale), default, rel_tol=1e-6):
        return
    where = f"{name} ({type(module).__name__}, timm)" if name else f"{type(module).__name__} (timm)"
    raise UnsupportedModelError(
        f"{where} has scale={float(scale):.6g} with fused_attn=True, but timm's fused kernel never reads scale and "
        f"scales by head_dim ** -0.5 = {default:.6g}: the model computes with {default:.6g}, while vitviz's explicit "
        f"path would use {float(scale):.6g} (maps the model does not compute, outputs that change while captured). "
        "Set fused_attn = False on the attention modules (the model then computes with its scale), or set scale back "
        f"to {default:.6g}"
    )


def probe_timm(module: nn.Module, emit: Emit) -> Undo:
    """Dispatch on the attention module's class; plain softmax attention uses ``probe_attn_drop``. A module whose
    ``scale`` its fused path ignores is refused (``check_fused_scale``)."""
    check_fused_scale(module)
    for cls in type(module).__mro__:
        if cls.__name__ in _PROBES:
            return _PROBES[cls.__name__][0](module, emit)
    return probe_attn_drop(module, emit)


# The timm attention classes the stream probe serves: (defining Python module, class name) -> how it forms q, k and
# the bias (timm 1.0.26 to 1.0.31). Every one calls ``scaled_dot_product_attention`` when ``fused_attn`` is on, else
# an explicit path whose softmax passes ``attn_drop``.
# - "mask": q, k from ``q_norm`` / ``k_norm``; the mask built by ``resolve_self_attn_mask``;
# - "rotary": the same, then ``apply_rot_embed_cat`` past the ``num_prefix_tokens`` prefix when ``rope`` is given
#   (and, for ``AttentionRope`` with grouped key heads, the key heads repeated);
# - "relpos": q, k from ``q_norm`` / ``k_norm``; the bias ``rel_pos.get_bias()``, else the block's shared bias;
# - "beit": q, k from the ``qkv`` weight and the ``q_bias`` / ``k_bias`` (no submodule sees them: the forward calls
#   ``F.linear`` itself); the bias ``_get_rel_pos_bias()`` plus the model's shared bias, or either alone;
# - "parallel" (``ParallelScalingBlock``, the whole block is the attention module): as "mask", but ``q_norm`` /
#   ``k_norm`` see ``(B, N, H, d)`` (the forward transposes after them);
# - "differential" (``DiffAttention``, ``DiffParallelScalingBlock``): as "mask" with ``2 H`` query and key heads of
#   half the width, paired ``(2h, 2h + 1)`` by the forward's two kernel calls, and ``_compute_lambda()``.
_STREAMED = {
    ("timm.models.vision_transformer", "Attention"): "mask",  # re-exported from timm.layers.attention
    ("timm.models.eva", "EvaAttention"): "rotary",  # EVA-02, rotary ViTs (vit_*_rope_*), DINOv3, PE
    ("timm.layers.attention", "AttentionRope"): "rotary",  # Eva's attn_type="rope" (grouped key heads in newer timm)
    ("timm.models.vision_transformer_relpos", "RelPosAttention"): "relpos",  # vit_relpos_*, vit_srelpos_*
    ("timm.models.beit", "Attention"): "beit",  # BEiT, BEiT v2
    ("timm.models.vision_transformer", "ParallelScalingBlock"): "parallel",  # vit_pwee_*
    ("timm.layers.diff_attention", "DiffAttention"): "differential",  # vit_dwee_* (attn_layer="diff")
    ("timm.models.vision_transformer", "DiffParallelScalingBlock"): "differential",  # vit_dpwee_*
}
_MASKED = ("resolve_self_attn_mask", "maybe_add_mask")
_HELPERS = {"mask": _MASKED, "rotary": (*_MASKED, "apply_rot_embed_cat"), "relpos": (), "beit": (),
            "parallel": _MASKED, "differential": _MASKED}


@once_per_window  # asked twice per layer in a call's set-up (stream_probe_for, then the probe)
def _stream_kind(module: nn.Module) -> tuple[str, Any] | None:
    """``(kind, defining Python module)`` when ``module`` is exactly one of the ``_STREAMED`` classes (not a
    subclass, which may compute attention differently) running its class's forward (not a ``forward`` set on the
    instance, which the recomputation would not follow: its maps are read where its softmax reaches ``attn_drop``)
    with what its forward uses where the probe reads it; else None."""
    if "forward" in vars(module):
        return None
    kind = None
    for (owner, name), how in _STREAMED.items():
        defining = sys.modules.get(owner)
        if defining is not None and type(module) is getattr(defining, name, None):
            kind = how
            break
    if kind is None:
        return None
    vt = sys.modules.get(type(module).__module__)
    if vt is None or not all(callable(getattr(vt, f, None)) for f in _HELPERS[kind]):
        return None
    if kind == "rotary" and not isinstance(getattr(module, "num_prefix_tokens", None), int):
        return None
    if kind == "differential" and not callable(getattr(module, "_compute_lambda", None)):
        return None
    if kind == "beit":
        # q and k are projected again from the qkv weights (``_beit_qk``): only a plain Linear computes what they say
        if not plain_linear(getattr(module, "qkv", None)) or not callable(getattr(module, "_get_rel_pos_bias", None)):
            return None
        if not all(hasattr(module, a) for a in ("q_bias", "k_bias", "relative_position_bias_table")):
            return None
    else:
        q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
        if not isinstance(q_norm, nn.Module) or not isinstance(k_norm, nn.Module) or q_norm is k_norm:
            return None
    if kind == "relpos" and not hasattr(module, "rel_pos"):
        return None
    if kind == "relpos" and not (module.rel_pos is None or callable(getattr(module.rel_pos, "get_bias", None))):
        return None
    if not isinstance(getattr(module, "attn_drop", None), nn.Module) or not hasattr(module, "fused_attn"):
        return None
    if not isinstance(getattr(module, "scale", None), float) or not isinstance(getattr(module, "num_heads", None), int):
        return None
    return kind, vt


def stream_probe_for(module: nn.Module) -> Probe | None:
    """``probe_timm_stream`` for the ``_STREAMED`` classes (timm's plain ``Attention``, ``EvaAttention``,
    ``AttentionRope``, ``RelPosAttention``, BEiT's ``Attention``, ``ParallelScalingBlock``, ``DiffAttention`` and
    ``DiffParallelScalingBlock``); None for every other module."""
    return probe_timm_stream if _stream_kind(module) is not None else None


def _recomputed_heads(vt: Any, module: nn.Module, q: torch.Tensor, k: torch.Tensor, attn_mask: Any,
                      is_causal: bool, kernel: bool = False, lse: torch.Tensor | None = None) -> HeadMaps:
    """``stream.recomputed_heads`` with the bias timm's explicit path adds (its own ``resolve_self_attn_mask``)."""
    n = q.shape[2]
    return stream.recomputed_heads(q, k, module.scale, lambda scores: vt.resolve_self_attn_mask(
        n, scores, attn_mask, is_causal), kernel=kernel, attn_mask=attn_mask, is_causal=is_causal, lse=lse)


def _rotated(vt: Any, module: nn.Module, t: torch.Tensor, rope: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as the rotary classes' forward hands it to the kernel: ``apply_rot_embed_cat`` (the defining module's
    own) past the ``num_prefix_tokens`` prefix, cast back to the projections' dtype (their ``type_as(v)``)."""
    npt = module.num_prefix_tokens
    half = getattr(module, "rotate_half", False)
    return torch.cat([t[:, :, :npt, :], vt.apply_rot_embed_cat(t[:, :, npt:, :], rope, half=half)], dim=2).to(dtype)


def _beit_qk(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BEiT's q and k ``(B, H, N, d)``, its ``qkv`` projection computed once more from the block's normalised tokens
    as its forward computes it: ``qkv(x)`` without ``q_bias``; else with the bias ``cat(q_bias, k_bias, v_bias)``,
    in the projection (``F.linear``) or added to its output (``qkv_bias_separate``)."""
    weight, heads = module.qkv.weight, module.num_heads
    if module.q_bias is None:
        return stream.reprojected_qk(x, weight, module.qkv.bias, heads)
    bias = torch.cat((module.q_bias, module.k_bias, module.v_bias))
    if getattr(module, "qkv_bias_separate", False):
        return stream.reprojected_qk(x, weight, module.qkv.bias, heads, added=bias)
    return stream.reprojected_qk(x, weight, bias, heads)


def _relative_bias(kind: str, module: nn.Module, shared: torch.Tensor | None) -> torch.Tensor | None:
    """The float bias the fused path passes as ``attn_mask`` (``relpos`` and ``beit`` kinds)."""
    if kind == "relpos":
        return module.rel_pos.get_bias() if module.rel_pos is not None else shared
    if module.relative_position_bias_table is None:
        return shared
    own = module._get_rel_pos_bias()
    return own if shared is None else own + shared


# a class's forward function -> the signature of its bound method (probe set-up runs per layer and per call)
_SIGNATURES: weakref.WeakKeyDictionary[Any, inspect.Signature] = weakref.WeakKeyDictionary()


def _forward_signature(module: nn.Module) -> inspect.Signature:
    """``inspect.signature(module.forward)``, read once per forward function (an instance's own ``forward``, set on
    the instance, is read every time)."""
    forward = module.forward
    func = getattr(forward, "__func__", None)
    if func is None or getattr(forward, "__self__", None) is not module:
        return inspect.signature(forward)
    signature = _SIGNATURES.get(func)
    if signature is None:
        signature = _SIGNATURES[func] = inspect.signature(forward)
    return signature


def probe_timm_stream(module: nn.Module, emit: Emit) -> Undo:
    """A ``_STREAMED`` timm attention module under ``heads="stream"``: fused attention left on, ``HeadMaps``
    recomputed from q, k (rotated as the forward rotates them, key heads repeated for grouped-query attention as the
    forward repeats them) with the mask or relative position bias the fused kernel was given.

    For a call whose maps would take fewer than ``EXPLICIT_BELOW_BYTES``, and (BEiT, which projects q and k again;
    see ``stream.REPROJECT_WITHOUT_KERNEL``) for every call the kernels do not serve, the module runs its explicit
    path instead (``fused_attn`` off for that call only) and the softmax output read at ``attn_drop`` is handed on.
    """
    found = _stream_kind(module)
    if found is None:
        raise UnsupportedModelError(f"{type(module).__name__} is not one of the timm attention classes with a stream "
                                    "probe (Attention, EvaAttention, AttentionRope, RelPosAttention, BEiT Attention, "
                                    "ParallelScalingBlock, DiffAttention, DiffParallelScalingBlock)")
    check_fused_scale(module)
    kind, vt = found
    pairs = 2 if kind == "differential" else 1  # differential attention: two softmax maps per head
    signature = _forward_signature(module)  # Attention: (x, attn_mask, is_causal); rotary: (x, rope, ...)
    first = next(iter(signature.parameters))  # the tokens
    state: dict[str, Any] = {}

    def restore() -> None:
        undo = state.pop("restore", None)
        if undo is not None:
            undo()
        recorder = state.pop("recorder", None)
        if recorder is not None:  # the forward raised before ``after``: leave no mode behind
            recorder.__exit__(None, None, None)

    def before(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        restore()
        state.clear()
        try:
            call = signature.bind(*args, **kwargs).arguments
        except TypeError as err:
            raise CaptureError(f"{type(module).__name__}.forward: {err}") from err
        x = call[first]
        b, n = int(x.shape[0]), int(x.shape[1])
        state["kernel"] = kernel = kernels.use_kernel(x.device)  # the kernels beat materialising, small maps too
        reproject = kind == "beit" and not kernel and not stream.REPROJECT_WITHOUT_KERNEL  # see the flag
        state["explicit"] = reproject or stream.explicit_is_cheaper(b, module.num_heads * pairs, n, kernel)
        if state["explicit"] and getattr(module, "fused_attn", False):
            state["restore"] = held_attr(module, "fused_attn", False)  # counted: see probe_attn_drop
        elif kernel and kind in ("mask", "rotary", "parallel") and forward_lse.enabled(
                x, b * module.num_heads * n * n) and getattr(module, "fused_attn", False):
            recorder = forward_lse.ForwardLSE()  # answers the module's SDPA call, keeping the row log-sum-exp
            recorder.__enter__()
            state["recorder"] = recorder
        state.update(x=x, mask=call.get("attn_mask"), causal=bool(call.get("is_causal", False)), rope=call.get("rope"),
                     shared=call.get("shared_rel_pos", call.get("shared_rel_pos_bias")))

    def on_q(_m: nn.Module, inputs: Any, out: torch.Tensor) -> None:
        state["q"], state["dtype"] = out, inputs[0].dtype  # the projections' dtype: v's, which rotary q/k take

    def on_k(_m: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        state["k"] = out

    def differential(maps: torch.Tensor) -> torch.Tensor:
        """The explicit path's ``(B, 2H, N, N)`` softmax maps -> ``S_2h - lambda S_2h+1`` (``probe_diff``)."""
        pair = maps.unflatten(1, (module.num_heads, 2))
        return pair[:, :, 0] - module._compute_lambda().type_as(maps) * pair[:, :, 1]

    def on_drop(_m: nn.Module, inputs: Any, _out: Any) -> None:
        if state.get("explicit"):
            state["maps"] = inputs[0].detach()

    def after(_m: nn.Module, _inputs: Any, _out: Any) -> None:
        recorder = state.get("recorder")
        lse, config = (recorder.lse, recorder.config) if recorder is not None and recorder.calls == 1 else (None, None)
        restore()
        call = {key: state.pop(key, None) for key in ("x", "q", "k", "maps", "mask", "causal", "rope", "shared",
                                                      "dtype", "kernel", "explicit")}
        if call["explicit"]:
            if call["maps"] is None:
                raise CaptureError(f"{type(module).__name__}: attn_drop did not run in this forward pass, so "
                                   "vitviz cannot read its attention")
            with torch.no_grad():
                emit(HeadMaps.of(differential(call["maps"]) if kind == "differential" else call["maps"]))
            return
        with torch.no_grad():
            if kind == "beit":
                if call["x"] is None:
                    raise CaptureError(f"{type(module).__name__}: its forward pre-hook did not run in this pass")
                q, k = _beit_qk(module, call["x"])
            else:
                q, k = call["q"], call["k"]
                if q is None or k is None:
                    raise CaptureError(f"{type(module).__name__}: q_norm / k_norm did not run in this forward pass, "
                                       "so vitviz cannot recompute its attention")
                q, k = q.detach(), k.detach()
                if kind == "parallel":
                    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, N, H, d) -> (B, H, N, d), as the forward
            if call["rope"] is not None:
                q, k = (_rotated(vt, module, t, call["rope"], call["dtype"]) for t in (q, k))
            groups = getattr(module, "num_kv_groups", 1)
            if groups > 1:
                k = k.repeat_interleave(groups, dim=1)  # as the forward: head h reads key head h // groups
            bias = _relative_bias(kind, module, call["shared"]) if kind in ("relpos", "beit") else None
        kernel = bool(call["kernel"]) and stream.use_kernel_for(q)  # float64: the PyTorch path
        if kind in ("relpos", "beit"):
            bias = bias.detach() if bias is not None else None
            emit(stream.recomputed_heads(q, k, module.scale, lambda _scores: bias, kernel=kernel, attn_mask=bias))
        elif kind == "differential":
            n, mask, causal = q.shape[2], call["mask"], bool(call["causal"])
            with torch.no_grad():
                lam = module._compute_lambda().type_as(q)  # as the forward: in the projections' dtype
            emit(stream.differential_heads(q, k, module.scale, lambda scores: vt.resolve_self_attn_mask(
                n, scores, mask, causal), lam, kernel=kernel and mask is None, is_causal=causal))
        else:
            lse = forward_lse.checked(lse, q, k, module.scale, bool(call["causal"]), owner=module,
                                      config=config) if kernel else None
            emit(_recomputed_heads(vt, module, q, k, call["mask"], bool(call["causal"]), kernel, lse))

    hooks = [(module, before, True), (module.attn_drop, on_drop, False), (module, after, False)]
    if kind != "beit":
        hooks[1:1] = [(module.q_norm, on_q, False), (module.k_norm, on_k, False)]
    handles = [m.register_forward_pre_hook(fn, with_kwargs=True) if pre else m.register_forward_hook(fn)
               for m, fn, pre in hooks]
    return chain_undos([restore, *(hd.remove for hd in handles)])
