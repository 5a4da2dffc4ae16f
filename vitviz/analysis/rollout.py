"""Attention rollout (Abnar & Zuidema, ACL 2020) and gradient-weighted rollout, streamed layer by layer.

Rollout, as used for the ViT paper's Fig. 6 and 14 (Dosovitskiy et al., ICLR 2021, App. D.8): for each layer
fuse the heads of the post-softmax attention ``(B, H, N, N)`` into ``W`` ``(B, N, N)`` (mean by default), add the
residual connection as ``A = 0.5 W + 0.5 I`` with rows renormalised, and multiply through the layers,
``R_l = A_l R_{l-1}`` with ``R_0 = I``. Row ``t`` of ``R_L`` says how much each input token flows into output
token ``t``; the map is that row over the patch columns, reshaped to the ``(gh, gw)`` grid ``vitviz.inspect``
reads (never ``sqrt(N)``). Prefix tokens (class, distillation, registers) take part in every product.

``attention_rollout`` reduces each layer as the forward pass produces it (``capture_attention(on_layer=...,
store=False)``): the layer's ``(B, H, N, N)`` map is fused into ``A_l`` ``(B, N, N)`` at once and dropped, so no
``(B, H, N, N)`` outlives its layer. For the maps (one row of ``R``) no ``N x N x N`` product is formed: the
layers' ``A_l`` are kept (``L`` fused maps, ``1/H`` of what storing the attention takes) and the query row is pushed
through them from the top after the pass, ``r = e_t A_L A_{L-1} ... A_1``, a vector-matrix product per layer.
``return_full=True`` multiplies the running product while streaming instead (``R_l = A_l R_{l-1}``, ``N^3`` per
layer).

``grad_rollout`` is the class-specific variant popularised by Chefer et al. (CVPR 2021) and the widely used
``vit_grad_rollout``: per layer ``W = mean_h relu(attn * d logit / d attn)``, then the same residual and product.
Gradients are matched to their layer by position (the copied code pairs them in reverse order).

Shapes: ``B`` batch, ``H`` heads, ``N`` tokens (prefix + patches), ``P`` patch tokens, ``(gh, gw)`` grid.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitviz.analysis.rollout_stream import (  # re-exported
    HEAD_FUSIONS,
    RolloutReducer,
    discard_weakest,
    fuse_heads,
    query_vectors,
)
from vitviz.core.batching import iter_batches
from vitviz.core.capture import capture_attention
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.errors import VitvizError

__all__ = [
    "HEAD_FUSIONS", "RolloutReducer", "attention_rollout", "discard_weakest", "fuse_heads", "grad_rollout",
    "grad_rollout_from_attentions", "query_vectors", "rollout_from_attentions", "rollout_to_maps",
]


def rollout_from_attentions(
    attentions: Sequence[torch.Tensor],
    *,
    num_prefix_tokens: int = 1,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    residual: bool = True,
    start_layer: int = 0,
) -> torch.Tensor:
    """Attention rollout of per-layer maps already in hand (pure function).

    Args:
        attentions: per layer, in order, post-softmax ``(B, H, N, N)`` maps (e.g. ``cap.attentions``).
        num_prefix_tokens: leading non-patch tokens (protected from discarding).
        head_fusion, discard_ratio, residual: as in ``attention_rollout``.
        start_layer: layers before this index are left out of the product.

    Returns:
        ``R`` ``(B, N, N)`` float32, ``R = A_L ... A_{start}``; rows sum to 1.
    """
    layers = list(attentions)[start_layer:]
    if not layers:
        raise ValueError(f"no layers to roll out: {len(attentions)} maps given, start_layer={start_layer}")
    reducer = RolloutReducer(num_prefix_tokens=num_prefix_tokens, head_fusion=head_fusion,
                             discard_ratio=discard_ratio, residual=residual)
    for i, attn in enumerate(layers):
        reducer(i, attn)
    return reducer.rollout


def grad_rollout_from_attentions(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    *,
    num_prefix_tokens: int = 1,
    discard_ratio: float = 0.0,
    start_layer: int = 0,
) -> torch.Tensor:
    """Gradient-weighted rollout: ``W_l = mean_h relu(attn_l * grad_l)``, then ``A = 0.5 W + 0.5 I`` and product.

    Args:
        attentions: per layer ``(B, H, N, N)`` maps; ``gradients``: the gradient of the target logit with
            respect to the *same* layer's map, same order and shapes.
        num_prefix_tokens, discard_ratio, start_layer: as in ``rollout_from_attentions``.

    Returns:
        ``R`` ``(B, N, N)`` float32; rows sum to 1.
    """
    if len(attentions) != len(gradients):
        raise ValueError(f"{len(attentions)} attention maps but {len(gradients)} gradients")
    reducer = RolloutReducer(num_prefix_tokens=num_prefix_tokens, discard_ratio=discard_ratio, normalise=False)
    for attn, grad in list(zip(attentions, gradients))[start_layer:]:
        if attn.shape != grad.shape:
            raise ValueError(f"attention {tuple(attn.shape)} and gradient {tuple(grad.shape)} differ in shape")
        reducer.update_fused((attn.float() * grad.float()).clamp_min_(0).mean(dim=1))
    return reducer.rollout


def _output_token(spec: ViTSpec, token: int | None, n: int) -> int | None:
    if token is None:
        return spec.class_token_index
    if not -n <= token < n:
        raise IndexError(f"{spec.name}: token {token} is out of range for {n} tokens")
    return token % n


def rollout_to_maps(rollout: torch.Tensor, grid_size: tuple[int, int], num_prefix_tokens: int,
                    token: int | None) -> torch.Tensor:
    """Row ``token`` of ``R`` ``(B, N, N)`` over the patch columns, as ``(B, gh, gw)`` maps.

    ``token=None`` averages the rows of all patch queries (for models without a class token).
    """
    gh, gw = grid_size
    b, n, _ = rollout.shape
    if n != num_prefix_tokens + gh * gw:
        raise ValueError(f"rollout over {n} tokens does not fit {num_prefix_tokens} prefix tokens and a "
                         f"{gh}x{gw} grid ({num_prefix_tokens + gh * gw} tokens)")
    rows = rollout[:, num_prefix_tokens:].mean(dim=1) if token is None else rollout[:, token]
    return rows[:, num_prefix_tokens:].reshape(b, gh, gw)


def _layer_range(spec: ViTSpec, start_layer: int) -> list[int]:
    depth = len(spec.attention_modules)
    start = start_layer % depth if -depth <= start_layer < 0 else start_layer
    if not 0 <= start < depth:
        raise IndexError(f"{spec.name} has {depth} attention layers; start_layer={start_layer} is out of range")
    return list(range(start, depth))


def _output(spec: ViTSpec, rollout: torch.Tensor, x: torch.Tensor, token: int | None, full: bool) -> torch.Tensor:
    if full:
        return rollout
    grid = spec.grid_for_input(x)
    return rollout_to_maps(rollout, grid, spec.num_prefix_tokens, _output_token(spec, token, rollout.shape[-1]))


def _maps_from_reducer(spec: ViTSpec, reducer: RolloutReducer, x: torch.Tensor, token: int | None) -> torch.Tensor:
    """The ``(B, gh, gw)`` maps of ``rollout_to_maps``, as one row vector per image pushed through the layers."""
    gh, gw = spec.grid_for_input(x)
    p = spec.num_prefix_tokens
    b, n = len(x), p + gh * gw
    v = query_vectors(b, n, p, _output_token(spec, token, n), device=x.device)
    return reducer.rows(v)[:, p:].reshape(b, gh, gw)


def attention_rollout(
    model: nn.Module,
    images: Images,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    residual: bool = True,
    start_layer: int = 0,
    token: int | None = None,
    return_full: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) from the output token to the input patches, as in ViT Fig. 6.

    Each layer is fused while the forward pass runs (no ``(B, H, N, N)`` map outlives its layer); for the maps the
    layers' ``(B, N, N)`` matrices are kept and the output token's row is pushed through them from the top (no
    ``N^3`` products); ``return_full`` multiplies the running product instead. All on the model's device. The
    model's mode is left as is (call ``model.eval()`` first for dropout-free
    maps).

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor, or PIL images / arrays / paths (see ``vitviz.load_images``).
        head_fusion: how to merge heads: ``"mean"`` (the paper), ``"max"`` or ``"min"``.
        discard_ratio: zero this fraction of the weakest fused attentions of each row (never the diagonal, never
            a prefix-token column), then renormalise rows.
        residual: model the skip connection as ``A = 0.5 W + 0.5 I`` (rows renormalised).
        start_layer: leave out the layers before this one (their attention is not even materialised).
        token: the output token whose row is read: default the class token; for models without one, the mean of
            the rows of all patch queries; an int picks any token index (prefix tokens first, then patches
            row-major).
        return_full: return the whole rollout ``R`` instead of the maps.
        batch_size: images per forward pass (default: all at once).
        progress: show a progress bar over images.

    Returns:
        ``(B, gh, gw)`` float32 maps (row of ``R`` over the patch columns; non-negative, summing to at most 1), or
        ``(B, N, N)`` with ``return_full=True``; on the model's device.
    """
    spec = inspect(model)
    layers = _layer_range(spec, start_layer)
    reducer = RolloutReducer(num_prefix_tokens=spec.num_prefix_tokens, head_fusion=head_fusion,
                             discard_ratio=discard_ratio, residual=residual, assume_stochastic=True,
                             keep="product" if return_full else "layers", num_layers=len(layers))
    out: list[torch.Tensor] = []
    for x in iter_batches(model, images, batch_size, progress=progress, desc="rollout"):
        with torch.no_grad(), capture_attention(model, layers=layers, on_layer=reducer, store=False):
            model(x)
        out.append(reducer.rollout if return_full else _maps_from_reducer(spec, reducer, x, token))
        reducer.reset()
    return torch.cat(out)


def _logits(out: object, spec: ViTSpec, model: nn.Module) -> torch.Tensor:
    if getattr(model, "num_classes", None) == 0:
        raise VitvizError(f"grad_rollout needs class logits, but {spec.name} has no classifier head "
                          "(num_classes=0); build it with num_classes > 0 or load a classifier")
    logits = getattr(out, "logits", out)
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise VitvizError(f"grad_rollout needs class logits (B, classes) from {spec.name}, got {shape}; use a model "
                          "with a classifier head (timm: num_classes > 0)")
    return logits


def grad_rollout(
    model: nn.Module,
    images: Images,
    target: int | Sequence[int] | torch.Tensor | None = None,
    *,
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    token: int | None = None,
    return_full: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Class-specific rollout: attention weighted by the gradient of the ``target`` logit (Chefer et al. 2021).

    Per layer ``W = mean_h relu(attn * d logit_target / d attn)``, then ``A = 0.5 W + 0.5 I`` (rows renormalised)
    and ``R_l = A_l R_{l-1}`` as in ``attention_rollout``. Gradients come from ``torch.autograd.grad`` on the
    captured maps, so each is paired with its own layer and the parameters' ``.grad`` are left untouched.

    Args:
        model: a ViT with a classifier head (its output, or ``output.logits``, is ``(B, classes)``).
        images: as in ``attention_rollout``.
        target: class index for every image, one per image, or ``None`` for each image's predicted class.
        discard_ratio, start_layer, token, return_full, batch_size, progress: as in ``attention_rollout``.

    Returns:
        ``(B, gh, gw)`` maps (or ``(B, N, N)`` with ``return_full``), float32, on the model's device.
    """
    spec = inspect(model)
    layers = _layer_range(spec, start_layer)
    targets = torch.as_tensor(target) if target is not None else None
    out: list[torch.Tensor] = []
    done = 0
    for x in iter_batches(model, images, batch_size, progress=progress, desc="grad rollout"):
        x = x.detach().requires_grad_(True)  # keeps the maps in the graph also when the weights are frozen
        with torch.enable_grad(), capture_attention(model, layers=layers, retain_grad=True) as cap:
            logits = _logits(model(x), spec, model)
        attns = cap.attentions
        if targets is None:
            tgt = logits.argmax(dim=-1)
        else:
            tgt = targets.reshape(-1)[done:done + len(x)] if targets.numel() > 1 else targets.reshape(1).expand(len(x))
        tgt = tgt.to(logits.device, torch.long)
        if tgt.numel() != len(x) or int(tgt.max()) >= logits.shape[1] or int(tgt.min()) < 0:
            raise ValueError(f"target must hold one class index in [0, {logits.shape[1]}) per image; got "
                             f"{target!r} for {len(x)} images")
        score = logits.gather(1, tgt[:, None]).sum()
        live = [a for a in attns if a.requires_grad]
        found = iter(torch.autograd.grad(score, live, allow_unused=True) if live else ())
        grads = [next(found) if a.requires_grad else None for a in attns]
        unused = [name for name, g in zip(cap.layer_names, grads) if g is None]
        if unused:
            raise VitvizError(
                f"{spec.name}: the attention captured at {unused[0]}{' and others' if len(unused) > 1 else ''} does "
                "not feed the logits (this model's probe recomputes or copies the probabilities), so it has no "
                "gradient and grad_rollout cannot weight it; use attention_rollout, or a model whose attention "
                "probabilities are read where they are used (timm, Hugging Face, a ViT with an attn_drop module)")
        rollout = grad_rollout_from_attentions([a.detach() for a in attns], grads,
                                               num_prefix_tokens=spec.num_prefix_tokens,
                                               discard_ratio=discard_ratio)
        del attns, grads, logits, cap
        done += len(x)
        out.append(_output(spec, rollout, x, token, return_full))
    return torch.cat(out)
