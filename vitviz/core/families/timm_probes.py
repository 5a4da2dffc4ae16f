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
head's ``softmax(q_h k_h^T * scale + bias)`` is recomputed from the ``q`` and ``k`` that ``q_norm`` and ``k_norm``
return, with the mask built by timm's own ``resolve_self_attn_mask``, one ``(B, N, N)`` buffer at a time. The
probabilities are float32 (the scores are computed in the model's dtype, as timm's explicit path does). A call
whose ``(B, H, N, N)`` maps are small (under ``EXPLICIT_BELOW_BYTES``, 8 MiB) runs timm's explicit path instead,
for that call only, and hands on its maps (in the model's dtype): there, materialising costs less than
recomputing. On CUDA (``vitviz.core.kernels.use_kernel``) the ``HeadMaps``' ``fuse`` and ``distance_sums`` run the
Triton kernels of ``vitviz.core.kernels.headmaps`` on ``q`` and ``k`` (no ``(B, H, N, N)``, no per-head buffers;
every call, small maps too); ``heads()`` still recomputes each head in PyTorch for other reductions.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

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
    """Each head's ``softmax(q_h * scale @ k_h^T + bias)``, as timm's explicit path computes it, into buffers
    (allocated when the first head is asked for). With ``kernel``, ``fuse`` and ``distance_sums`` run the Triton
    kernels of ``vitviz.core.kernels`` on ``q`` and ``k`` instead of folding these heads."""
    b, h, n, _ = q.shape
    bufs: dict[str, Any] = {}

    def buffers() -> dict[str, Any]:
        if not bufs:
            bufs["qs"] = q * module.scale
            bufs["scores"] = scores = torch.empty(b, n, n, dtype=q.dtype, device=q.device)
            bias = vt.resolve_self_attn_mask(n, scores, attn_mask, is_causal)
            if bias is not None:
                bias = bias.reshape((1,) * (4 - bias.ndim) + tuple(bias.shape))  # SDPA broadcasting: (B|1, H|1, N, N)
            bufs["bias"] = bias
            upcast = bufs["upcast"] = q.dtype != torch.float32
            bufs["score32"] = torch.empty(b, n, n, dtype=torch.float32, device=q.device) if upcast else scores
            bufs["probs"] = torch.empty(b, n, n, dtype=torch.float32, device=q.device)
        return bufs

    def head(i: int) -> torch.Tensor:
        qs, scores, bias, upcast, score32, probs = (buffers()[key] for key in
                                                    ("qs", "scores", "bias", "upcast", "score32", "probs"))
        with torch.no_grad():
            torch.matmul(qs[:, i], k[:, i].transpose(-2, -1), out=scores)
            if bias is not None:
                scores.add_(bias[:, i if bias.shape[1] > 1 else 0])
            if upcast:
                score32.copy_(scores)
            return torch.ops.aten._softmax.out(score32, -1, False, out=probs)

    if not kernel:
        return HeadMaps((b, h, n, n), torch.float32, q.device, head)
    from vitviz.core.kernels import headmaps  # imports Triton

    mask = dict(attn_mask=attn_mask, is_causal=is_causal)

    def fuse(how: str, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
        direct = out is not None and out.dtype == torch.float32
        fused = headmaps.fuse_heads_kernel(q, k, module.scale, how, out=out if direct else None, **mask)
        return fused if direct else (fused.to(dtype) if out is None else out.copy_(fused))

    def distance_sums(distances: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        return headmaps.distance_sums_kernel(q, k, module.scale, distances, p, **mask)

    return HeadMaps((b, h, n, n), torch.float32, q.device, head, fuse=fuse, distance_sums=distance_sums)


# Below this many bytes of one layer's (B, H, N, N) float32 maps the stream probe lets timm's explicit path run for
# that call instead (small maps: materialising them costs less than computing q k^T a second time; measured on
# the 2-core CPU: cifar10-vit, 128 images of 65 tokens, 6.5 MB per layer, 534-581 img/s explicit vs 469-481
# recomputed; ViT-B/16 at 224 px, batch 8, 15 MB per layer, 1.13-1.17x vs 1.06-1.13x a plain forward).
EXPLICIT_BELOW_BYTES = 8 << 20


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
        state["explicit"] = not state["kernel"] and b * module.num_heads * n * n * 4 < EXPLICIT_BELOW_BYTES
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
        kernel = state.pop("kernel", False)  # other dtypes (float64) take the PyTorch path, unless forced
        kernel = kernel and (kernels.supports(q) or kernels.kernel_mode() == "on")
        emit(_recomputed_heads(vt, module, q.detach(), k.detach(), mask, causal, kernel))

    handles = [module.register_forward_pre_hook(before, with_kwargs=True),
               module.q_norm.register_forward_hook(on_q), module.k_norm.register_forward_hook(on_k),
               module.attn_drop.register_forward_hook(on_drop), module.register_forward_hook(after)]
    return chain_undos([restore, *(hd.remove for hd in handles)])
