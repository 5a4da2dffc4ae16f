"""Head maps recomputed from ``q`` and ``k`` beside a fused attention kernel: what every stream probe emits.

A stream probe (``Family.stream_probe``: timm's plain, rotary, relative-position, BEiT, parallel-block and
differential attention in ``timm_probes``, the Hugging Face attention modules in ``hf_probes``, torchvision's and
open_clip's ``nn.MultiheadAttention`` here: ``probe_mha_stream``) leaves the model's fused attention running, so the
forward's output is the plain forward's, and hands the reductions a ``HeadMaps`` that recomputes each head's
``softmax(q_h k_h^T * scale + bias)`` from the ``q`` and ``k`` the kernel was given (under autocast, as SDPA casts
them: ``kernels.sdpa_operands``):

- on CPU (and wherever the kernels are off): in PyTorch, one head at a time into one ``(B, N, N)`` float32 buffer,
  the scores formed in the model's dtype as the explicit (eager) paths form them (the reference);
- on CUDA (``vitviz.core.kernels.use_kernel``): ``fuse`` and ``distance_sums`` run the Triton kernels of
  ``vitviz.core.kernels.headmaps`` on ``q`` and ``k`` (no ``(B, H, N, N)``, no per-head buffers).

A call whose ``(B, H, N, N)`` float32 maps would take fewer than ``EXPLICIT_BELOW_BYTES`` (8 MiB) runs the module's
explicit path instead when the kernels are off (materialising small maps costs less than computing ``q k^T`` a
second time; measured on a 2-core CPU: ``cifar10-vit``, 128 images of 65 tokens, 6.5 MB per layer, 534-581 img/s
explicit vs 469-481 recomputed; ViT-B/16 at 224 px, batch 8, 15 MB per layer, 1.13-1.17x vs 1.06-1.13x a plain
forward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitviz.core import kernels
from vitviz.core.families.base import Emit, HeadMaps, Probe, Undo, chain_undos
from vitviz.core.families.probes import mha_dropout_error
from vitviz.errors import CaptureError

__all__ = ["EXPLICIT_BELOW_BYTES", "REPROJECT_WITHOUT_KERNEL", "differential_heads", "explicit_is_cheaper",
           "mha_stream_probe_for", "probe_mha_stream", "recomputed_heads", "reprojected_qk", "sdpa_bias",
           "use_kernel_for"]

EXPLICIT_BELOW_BYTES = 8 << 20


def use_kernel_for(q: torch.Tensor) -> bool:
    """Whether the head-map kernels serve this call's ``q`` (the mode in force, the device, the dtype and head dim;
    other dtypes such as float64 take the PyTorch path unless the kernels are forced on)."""
    return kernels.use_kernel(q.device) and (kernels.supports(q) or kernels.kernel_mode() == "on")


def explicit_is_cheaper(batch: int, heads: int, tokens: int, kernel: bool) -> bool:
    """Whether a call should run the module's explicit path: its maps are small and the kernels are off."""
    return not kernel and batch * heads * tokens * tokens * 4 < EXPLICIT_BELOW_BYTES


def sdpa_bias(n: int, dtype: torch.dtype, device: torch.device, attn_mask: torch.Tensor | None,
              is_causal: bool) -> torch.Tensor | None:
    """The additive bias ``scaled_dot_product_attention`` applies for ``attn_mask`` / ``is_causal`` (or None).

    As SDPA (and timm's ``resolve_self_attn_mask``): ``is_causal`` gives ``-inf`` above the diagonal; a bool mask
    keeps its ``True`` entries (``False`` -> ``-inf``); a float mask is added as it is.
    """
    if is_causal:
        return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu_(1)
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        return torch.zeros_like(attn_mask, dtype=dtype).masked_fill_(~attn_mask, float("-inf"))
    return attn_mask


def recomputed_heads(q: torch.Tensor, k: torch.Tensor, scale: float,
                     bias: Callable[[torch.Tensor], torch.Tensor | None], *, kernel: bool = False,
                     attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                     lse: torch.Tensor | None = None) -> HeadMaps:
    """Each head's ``softmax(q_h * scale @ k_h^T + bias)`` as a ``HeadMaps`` (float32 probabilities).

    Args:
        q, k: ``(B, H, N, d)`` as the attention kernel received them (detached); under autocast they are cast as
            SDPA casts them (``kernels.sdpa_operands``: float32 ``q`` and ``k`` from a qk-norm ``LayerNorm`` under
            CUDA autocast are read in bfloat16, as the forward computed with them), and so is a float ``attn_mask``.
        scale: the softmax scale the module passes to the kernel.
        bias: ``bias(scores) -> additive bias`` broadcastable to ``(B, H, N, N)`` (or None), given a ``(B, N, N)``
            scores buffer of the model's dtype; called once, when the first head is asked for (the PyTorch path).
        kernel: run ``fuse`` and ``distance_sums`` through the Triton kernels, which take the raw
            ``attn_mask`` / ``is_causal`` (SDPA semantics) instead of ``bias``.
        lse: the rows' log-sum-exp ``(B, H, N)`` from the forward's fused attention (``kernels.forward_lse``), which
            spares ``fuse``'s kernel its first pass; None: the kernel makes it.
    """
    q, k, attn_mask = kernels.sdpa_operands(q, k, attn_mask)  # under autocast: what SDPA computes with
    b, h, n, _ = q.shape
    bufs: dict[str, Any] = {}

    def buffers() -> dict[str, Any]:
        if not bufs:
            bufs["qs"] = q * scale
            bufs["scores"] = scores = torch.empty(b, n, n, dtype=q.dtype, device=q.device)
            add = bias(scores)
            if add is not None:
                add = add.reshape((1,) * (4 - add.ndim) + tuple(add.shape))  # SDPA broadcasting: (B|1, H|1, N, N)
            bufs["bias"] = add
            upcast = bufs["upcast"] = q.dtype != torch.float32
            bufs["score32"] = torch.empty(b, n, n, dtype=torch.float32, device=q.device) if upcast else scores
            bufs["probs"] = torch.empty(b, n, n, dtype=torch.float32, device=q.device)
        return bufs

    def head(i: int) -> torch.Tensor:
        qs, scores, add, upcast, score32, probs = (buffers()[key] for key in
                                                   ("qs", "scores", "bias", "upcast", "score32", "probs"))
        with torch.no_grad():
            torch.matmul(qs[:, i], k[:, i].transpose(-2, -1), out=scores)
            if add is not None:
                scores.add_(add[:, i if add.shape[1] > 1 else 0])
            if upcast:
                score32.copy_(scores)
            return torch.ops.aten._softmax.out(score32, -1, False, out=probs)

    if not kernel:
        return HeadMaps((b, h, n, n), torch.float32, q.device, head)
    from vitviz.core.kernels import headmaps  # imports Triton

    mask = dict(attn_mask=attn_mask, is_causal=is_causal)

    def fuse(how: str, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
        direct = out is not None and out.dtype == torch.float32
        fused = headmaps.fuse_heads_kernel(q, k, scale, how, out=out if direct else None, lse=lse, **mask)
        return fused if direct else (fused.to(dtype) if out is None else out.copy_(fused))

    def distance_sums(distances: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        return headmaps.distance_sums_kernel(q, k, scale, distances, p, **mask)

    return HeadMaps((b, h, n, n), torch.float32, q.device, head, fuse=fuse, distance_sums=distance_sums)


def differential_heads(q: torch.Tensor, k: torch.Tensor, scale: float,
                       bias: Callable[[torch.Tensor], torch.Tensor | None], lam: torch.Tensor, *,
                       kernel: bool = False, is_causal: bool = False) -> HeadMaps:
    """Differential attention's maps (Ye et al. 2024, Eq. 1), ``A_h = S_2h - lam * S_2h+1``, as a ``HeadMaps`` of
    ``H = q.shape[1] // 2`` heads (float32), with ``S_j = softmax(q_j k_j^T * scale + bias)`` recomputed as
    ``recomputed_heads`` does from the ``2 H`` query and key heads the module's two fused kernel calls receive
    (timm's ``DiffAttention`` pairs heads ``2h`` and ``2h + 1``).

    Signed; each head costs two softmax maps and one ``(B, N, N)`` buffer. On the kernels (``kernel``; no
    ``attn_mask``, which the caller then reads through ``bias``): the head mean is the mean of the even heads minus
    ``lam`` times the mean of the odd ones (two ``fuse_heads_kernel`` calls over ``H`` heads each), and the distance
    sums are the pairs' sums combined the same way (both linear in the maps); the head max and min do not split
    so and fold the heads one at a time.

    Args:
        q, k: ``(B, 2H, N, d)``.
        lam: the layer's lambda (a 0-dim tensor, as the module computes it).
    """
    q, k = kernels.sdpa_operands(q, k)
    b, h2, n, _ = q.shape
    if h2 % 2:
        raise CaptureError(f"differential attention needs an even number of query heads (pairs); got {h2}")
    pairs = recomputed_heads(q, k, scale, bias)
    neg = (-lam.detach()).to(device=q.device, dtype=torch.float32)
    buf: list[torch.Tensor] = []

    def head(i: int) -> torch.Tensor:
        if not buf:
            buf.append(torch.empty(b, n, n, dtype=torch.float32, device=q.device))
        out = buf[0].copy_(pairs._head(2 * i))  # the pair's buffer is overwritten by the next call
        return out.addcmul_(pairs._head(2 * i + 1), neg)

    plain = HeadMaps((b, h2 // 2, n, n), torch.float32, q.device, head)
    if not kernel:
        return plain
    from vitviz.core.kernels import headmaps  # imports Triton

    def fuse(how: str, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
        if how != "mean":
            return plain.fuse(how, dtype, out)
        even, odd = (headmaps.fuse_heads_kernel(q[:, j::2], k[:, j::2], scale, "mean", is_causal=is_causal)
                     for j in (0, 1))
        fused = even.addcmul_(odd, neg)
        return fused.to(dtype) if out is None else out.copy_(fused)

    def distance_sums(distances: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        weighted, weight = (s.unflatten(1, (h2 // 2, 2)) for s in
                            headmaps.distance_sums_kernel(q, k, scale, distances, p, is_causal=is_causal))
        return weighted[:, :, 0].addcmul(weighted[:, :, 1], neg), weight[:, :, 0].addcmul(weight[:, :, 1], neg)

    return HeadMaps(tuple(plain.shape), torch.float32, q.device, head, fuse=fuse, distance_sums=distance_sums)


def reprojected_qk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, heads: int, *,
                   added: torch.Tensor | None = None, seq_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` ``(B, H, N, d)`` projected once more from the layer's input ``x`` ``(B, N, D)`` by the whole
    packed ``[q; k; v]`` projection, as the forward projects them (``weight`` ``(3 H d, D)``, ``bias`` ``(3 H d,)``
    or None; ``added``: a bias the forward adds to the projection's output afterwards, timm's
    ``qkv_bias_separate``; ``seq_first``: the projection takes ``x.transpose(0, 1)``, as a ``batch_first``
    ``nn.MultiheadAttention`` hands its input to ``F.multi_head_attention_forward``): for modules whose q and k no
    submodule sees (``nn.MultiheadAttention``, timm's BEiT).

    The same call on the same shapes gives the forward's q and k bit for bit. Projecting only the q and k rows
    would cost a third less, but a GEMM of another width may round otherwise: under CPU bfloat16 autocast, at
    ViT-B/16's width, such q and k differed from the forward's in the last bit
    (``tests/test_stream_heads.py::test_reprojected_q_and_k_are_the_forwards_bit_for_bit``), and the maps of a
    2-block BEiT of that width with sharpened ``qkv`` weights by up to 8e-4.
    """
    with torch.no_grad():
        if seq_first:
            qkv = torch.nn.functional.linear(x.detach().transpose(0, 1), weight, bias).transpose(0, 1)
        else:
            qkv = torch.nn.functional.linear(x.detach(), weight, bias)
        if added is not None:
            qkv += added  # in place, as the forward adds it (the result keeps the projection's dtype)
    return qkv.unflatten(-1, (3, heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)[:2]  # views


# Probes that must project q and k again from the layer's input (nn.MultiheadAttention below, timm's BEiT attention in
# timm_probes: no submodule sees their q and k): without the kernels (CPU), reading the explicit path's weights costs
# less than the projection and recomputation. Measured on the 2-core CPU, one thread, 224 px, batch 8
# (bench/attention.py): torchvision vit_b_16, rollout recomputed 1.26x a plain forward against 1.02x for the explicit
# path; timm beit_base_patch16_224, 1.23x against 1.02x (process CPU time; both measured when only the q and k rows
# were projected again, before ``reprojected_qk`` took the whole packed projection, which costs more). So they
# recompute only where the kernels serve the call, unless this is set (tests set it to check the recomputation on CPU).
REPROJECT_WITHOUT_KERNEL = False


# ---------------------------------------------------------------------------------------- nn.MultiheadAttention

_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
             "is_causal")


def mha_stream_probe_for(module: nn.Module) -> Probe | None:
    """``probe_mha_stream`` for a batch-first self-attention ``nn.MultiheadAttention`` with one packed input
    projection (torchvision's ViT) running its class's forward; None for every other module, and for one given a
    ``forward`` of its own on the instance (its weights are then read by ``probe_mha``)."""
    if not isinstance(module, nn.MultiheadAttention) or not module.batch_first or not module._qkv_same_embed_dim:
        return None
    if "forward" in vars(module):  # a forward set on the instance: the reprojection would not follow it
        return None
    if module.in_proj_weight is None or module.bias_k is not None or module.add_zero_attn:
        return None
    return probe_mha_stream


def probe_mha_stream(module: nn.Module, emit: Emit) -> Undo:
    """``nn.MultiheadAttention`` under ``heads="stream"``: its forward runs untouched (``need_weights=False`` as
    torchvision calls it: the fused path, output bit for bit the plain forward's), and each head's
    ``softmax(q_h k_h^T / sqrt(d))`` is recomputed from ``q`` and ``k`` projected again from the input with the
    module's ``in_proj_weight`` and ``in_proj_bias`` (``F.multi_head_attention_forward``'s first step, its packed
    projection of the sequence-first input, once more: the cost of the maps without the ``(B, H, N, N)``).

    A call the kernels do not serve (CPU; see ``REPROJECT_WITHOUT_KERNEL``), with masks, or with distinct
    query/key/value tensors runs with ``need_weights=True, average_attn_weights=False`` instead, for that call only,
    and its per-head weights are handed on (what ``probe_mha`` reads). A call in training mode with attention
    dropout raises ``CaptureError``, as ``probe_mha`` does.
    """
    state: dict[str, Any] = {}

    def before(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        state.clear()
        if len(args) > len(_MHA_ARGS):
            raise CaptureError(f"{type(module).__name__}.forward got {len(args)} positional arguments")
        call = {**dict(zip(_MHA_ARGS, args)), **kwargs}
        x = call.get("query")
        plain = (x is not None and x.dim() == 3 and call.get("key") is x and call.get("value") is x
                 and call.get("attn_mask") is None and call.get("key_padding_mask") is None
                 and not call.get("is_causal", False) and not (module.training and module.dropout > 0))
        heads = module.num_heads
        kernel = plain and use_kernel_for(x.unflatten(-1, (heads, -1)))  # dtype and head dim as q will have
        recompute = plain and (kernel or (REPROJECT_WITHOUT_KERNEL
                                          and not explicit_is_cheaper(x.shape[0], heads, x.shape[1], kernel)))
        if not recompute:
            error = mha_dropout_error(type(module).__name__, module)
            if error is not None:  # the weights of this call would be the dropped-out ones
                raise error
            state["explicit"] = True
            return (), {**call, "need_weights": True, "average_attn_weights": False}
        state.update(x=x, kernel=kernel)
        return None

    def after(_m: nn.Module, _args: tuple, _kwargs: dict, out: Any) -> None:
        if state.pop("explicit", False):
            weights = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if weights is None:
                raise CaptureError(f"{type(module).__name__} returned no attention weights with need_weights=True")
            emit(HeadMaps.of(weights.detach()))
            return
        x = state.pop("x", None)
        if x is None:
            raise CaptureError(f"{type(module).__name__}: its forward pre-hook did not run in this pass")
        q, k = reprojected_qk(x, module.in_proj_weight, module.in_proj_bias, module.num_heads, seq_first=True)
        emit(recomputed_heads(q, k, q.shape[-1] ** -0.5, lambda scores: None, kernel=state.pop("kernel", False)))

    handles = [module.register_forward_pre_hook(before, with_kwargs=True),
               module.register_forward_hook(after, with_kwargs=True)]
    return chain_undos([h.remove for h in handles])
