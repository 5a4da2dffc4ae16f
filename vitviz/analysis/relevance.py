"""Gradient-based relevance: Chefer et al.'s generic relevance, and vitviz's gradient-weighted rollout.

Both weight each layer's post-softmax attention ``A_l`` ``(B, H, N, N)`` by the gradient ``dA_l = d s / d A_l`` of
the explained scalar ``s`` (``target=``: a class logit, or any callable score; see ``vitviz.core.targets``) and keep
the positive part, averaged over heads: ``Abar_l = E_h[(dA_l * A_l)^+]``. They differ in how layers combine:

``chefer`` -- Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal and
Encoder-Decoder Transformers", ICCV 2021, Eq. (5)-(6) (self-attention rule): ``R = I``; for each layer in forward
order ``R <- R + Abar_l R``; the map is the class token's row of ``R`` over the patch columns, the row their ViT's
head reads; vitviz reads the rows of the tokens the model's head reads (``ViTSpec.readout``: the class row for a
class-token head, the mean of the patch rows for average pooling, the mean of the class and distillation rows for
DeiT-distilled; ``vitviz.analysis.propagation``). No ``0.5`` residual
weight and no renormalisation: relevance accumulates. (Their CVPR 2021 paper, "Transformer Interpretability Beyond
Attention Visualization", uses LRP relevances instead of the attention itself; that method is not implemented
here.) The reference code (``Transformer-MM-Explainability``) computes the same rule one image at a time; here it
is batched.

``grad_rollout`` -- vitviz's gradient-weighted rollout: the same head weighting ``Abar_l`` fed through attention
rollout's layer matrix (Abnar & Zuidema 2020): ``A_l' = rownorm(0.5 Abar_l + 0.5 I)`` and ``R_l = A_l' R_{l-1}``,
so rows of ``R`` sum to 1. It is *not* Chefer's rule (no accumulation ``R + Abar R``, rows renormalised), and *not*
the widely copied ``vit_grad_rollout`` of jacobgil/vit-explain, which (1) averages heads *before* clipping
negatives (``(grad * A).mean(heads)`` then ``< 0 -> 0``), (2) pairs each layer's attention with the gradient of the
layer at the mirrored position (its backward hooks record gradients last layer first), (3) discards the weakest
entries over the whole flattened matrix of the first image only and (4) divides by the row sums along the wrong
axis (``a / a.sum(dim=-1)`` broadcasts them over columns); it also handles one image. vitviz pairs each gradient
with its own layer, clips per head before averaging, discards row by row and keeps rows stochastic. Tests pin
each of these differences.

Models whose head averages the patch tokens (and models without a class token) read the mean of the patch query
rows, as in ``attention_rollout``; ``token="class"`` reads the class row whatever the head reads. Gradients come from ``torch.autograd.grad`` on the captured maps, so the parameters'
``.grad`` are untouched and the model is left as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitviz.analysis.propagation import (
    LayerRule,
    PoolRows,
    Propagator,
    check_block_start,
    layer_range,
    propagate,
    propagated_output,
    require_flow_maps,
)
from vitviz.core.batching import count_images, iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.capture import capture_attention, check_layer_index
from vitviz.core.contexts import autograd, grad_leaf
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.targets import ResolvedTarget, Target, resolve_target
from vitviz.errors import InputError, InputTypeError, UnsupportedModelError

__all__ = ["attention_gradients", "chefer_from_attentions", "chefer_relevance", "grad_rollout",
           "grad_rollout_from_attentions", "weighted_attention"]


def attention_gradients(
    model: nn.Module,
    x: torch.Tensor,
    target: Target,
    *,
    spec: ViTSpec | None = None,
    layers: Sequence[int] | None = None,
    start: int = 0,
    n_images: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], ResolvedTarget]:
    """One forward and backward pass: each layer's attention and the gradient of the target score with respect to it.

    Args:
        model: any ViT ``vitviz.inspect`` reads whose attention probabilities feed the output.
        x: a normalised ``(b, 3, H, W)`` batch on the model's device.
        target: see ``vitviz.core.targets.resolve_target``.
        spec: ``inspect(model)`` if already known.
        layers: attention-layer indices (default all).
        start, n_images: the batch's offset and the image set's size (for per-image targets).

    Returns:
        ``(attentions, gradients, resolved)``: detached ``(b, H, N, N)`` maps and their gradients, in layer order,
        and the resolved target (its scores detached).
    """
    spec = spec or inspect(model)
    # also under a caller's torch.no_grad() or torch.inference_mode(): the score must stay in the graph
    with autograd(model, f"the attention gradients (chefer, grad_rollout) of {spec.name}"):
        x = grad_leaf(x)  # keeps the maps in the graph also when the weights are frozen
        with capture_attention(model, layers=layers, retain_grad=True) as cap:
            out = model(x)
        resolved = resolve_target(target, out, start=start, n_images=n_images, model=model)
        score = resolved.scores.sum()
        attns = cap.attentions
        # nn.MultiheadAttention (torchvision) returns a reshaped view of the probabilities it multiplies into the
        # values; the gradient flows through the base tensor, whose gradient reshaped is the map's.
        targets = [_used_tensor(a) for a in attns]
        live = [t for t in targets if t is not None]
        if not resolved.scores.requires_grad:
            raise InputError(f"{spec.name}: the target score does not depend on the input (no gradient); a callable "
                             "target must compute its score from the model output with differentiable torch ops")
        found = iter(torch.autograd.grad(score, live, allow_unused=True) if live else ())
        grads = [None if t is None else _as_map(next(found), a) for t, a in zip(targets, attns)]
    unused = [name for name, g in zip(cap.layer_names, grads) if g is None]
    if unused:
        why = ("this model computes them outside autograd: under torch.no_grad, or in a reentrant "
               "torch.utils.checkpoint, which use_reentrant=False avoids"
               if any(not a.requires_grad for a, g in zip(attns, grads) if g is None)
               else "this model's probe recomputes or copies the probabilities")
        raise UnsupportedModelError(
            f"{spec.name}: the attention captured at {unused[0]}{' and others' if len(unused) > 1 else ''} does not "
            f"feed the output ({why}), so it has no gradient; "
            "use a gradient-free method (attention, rollout, flow), or a model whose attention probabilities are "
            "read where they are used (timm, Hugging Face, torchvision, a ViT with an attn_drop module)")
    resolved = ResolvedTarget(resolved.scores.detach(), resolved.classes,
                              None if resolved.logits is None else resolved.logits.detach())
    return [a.detach() for a in attns], [g.detach() for g in grads], resolved  # type: ignore[union-attr]


def _used_tensor(attn: torch.Tensor) -> torch.Tensor | None:
    """The tensor whose gradient is the map's: the map, or the base it is a same-size view of."""
    if not attn.requires_grad:
        return None
    base = attn._base
    if base is not None and base.requires_grad and base.numel() == attn.numel() and attn.is_contiguous():
        return base
    return attn


def _as_map(grad: torch.Tensor | None, attn: torch.Tensor) -> torch.Tensor | None:
    return None if grad is None else grad.reshape(attn.shape)


def weighted_attention(attn: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``E_h[(grad * A)^+]`` ``(B, N, N)`` (Chefer et al. 2021, Eq. 5), float32 or float64 for a float64 model."""
    if not isinstance(attn, torch.Tensor) or not isinstance(grad, torch.Tensor):
        raise InputTypeError(f"gradient: expected the attention and its gradient as torch.Tensors, got "
                             f"{type(attn).__name__} and {type(grad).__name__}; pass torch.as_tensor(a) for arrays")
    if attn.ndim != 4:
        raise InputError(f"gradient: expected (B, H, N, N) attention and gradient, got {tuple(attn.shape)}; pass "
                         "every layer's map with its batch and head axes")
    if attn.shape != grad.shape:
        raise InputError(f"gradient: attention {tuple(attn.shape)} and gradient {tuple(grad.shape)} differ in "
                         "shape; pass each layer's map with the gradient of the same layer")
    dtype = torch.promote_types(attn.dtype, torch.float32)
    return (attn.to(dtype) * grad.to(dtype)).clamp_min_(0).mean(dim=1)


def _weighted_maps(attentions: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if len(attentions) != len(gradients):
        raise InputError(f"gradients: {len(attentions)} attention maps but {len(gradients)} gradients; pass one "
                         "gradient per map")
    if not attentions:
        raise InputError("attentions: no layers given; pass at least one map")
    return [weighted_attention(a, g) for a, g in zip(attentions, gradients)]


def chefer_from_attentions(attentions: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor],
                           blocks: Sequence[int] | None = None) -> torch.Tensor:
    """Chefer et al. (ICCV 2021) Eq. 6 on maps in hand: ``R = I``, ``R <- R + E_h[(grad * A)^+] R`` per layer.

    Args:
        attentions: per layer, in forward order, ``(B, H, N, N)`` post-softmax maps.
        gradients: the gradient of the explained score with respect to the same layer's map, same shapes.
        blocks: block index of each map (``ViTSpec.attention_blocks``); parallel branches of one block are
            averaged into one update (``vitviz.analysis.propagation.Propagator``). Default: one block per map.

    Returns:
        ``R`` ``(B, N, N)`` float32 (float64 for float64 maps); row ``i``: relevance of every token for token ``i``.
    """
    weights = _weighted_maps(attentions, gradients)
    return propagate(weights, LayerRule("chefer"), blocks=blocks, dtype=weights[0].dtype)


def grad_rollout_from_attentions(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    *,
    num_prefix_tokens: int = 1,
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    blocks: Sequence[int] | None = None,
) -> torch.Tensor:
    """vitviz's gradient-weighted rollout on maps in hand: ``R_l = rownorm(0.5 E_h[(grad*A)^+] + 0.5 I) R_{l-1}``.

    Args:
        attentions: per layer ``(B, H, N, N)`` maps; ``gradients``: the gradient of the target score with respect
            to the *same* layer's map, same order and shapes.
        num_prefix_tokens, discard_ratio, start_layer: as in ``vitviz.rollout_from_attentions`` (the discard is
            row-wise and spares the diagonal and the prefix columns; ``start_layer`` an index from ``-L`` to
            ``L - 1``, negative counting from the end).
        blocks: block index of each map (``ViTSpec.attention_blocks``); parallel branches are averaged.

    Returns:
        ``R`` ``(B, N, N)`` float32; rows sum to 1.
    """
    attentions = list(attentions)
    if not attentions:
        raise InputError("attentions: no layers given; pass at least one map")
    first = check_layer_index(start_layer, len(attentions), "start_layer", "these maps")
    check_block_start(None if blocks is None else list(blocks), first, start_layer, "these maps")
    weights = _weighted_maps(attentions, list(gradients))[first:]  # the counts checked on the maps as given
    rule = LayerRule("grad_rollout", discard_ratio=discard_ratio, num_prefix_tokens=num_prefix_tokens)
    return propagate(weights, rule, blocks=None if blocks is None else list(blocks)[first:])


def _run(model: nn.Module, images: Images, target: Target, rule: str, *, discard_ratio: float, start_layer: int,
         token: int | str | None, return_full: bool, batch_size: int | None, progress: bool) -> torch.Tensor:
    spec = inspect(model)
    layers = layer_range(spec, start_layer)
    require_flow_maps(spec, layers, rule)  # signed or mixed maps (differential attention, CaiT talking heads): refused
    blocks = [spec.attention_blocks[i] for i in layers] if spec.attention_blocks else None
    layer_rule = LayerRule(rule, discard_ratio=discard_ratio, num_prefix_tokens=spec.num_prefix_tokens)
    total = count_images(images)
    out: list[torch.Tensor] = []
    done = 0
    for x in iter_batches(model, images, batch_size, progress=progress, desc=rule.replace("_", " ")):
        with PoolRows(model, spec, token) as pool:
            attns, grads, _ = attention_gradients(model, x, target, spec=spec, layers=layers, start=done,
                                                  n_images=total)
        rows = pool.take(attns[0].shape[-1])
        weights = _weighted_maps(attns, grads)
        del attns, grads
        dtype = weights[0].dtype if rule == "chefer" else torch.float32
        prop = Propagator(layer_rule, blocks=blocks, dtype=dtype).feed(weights)
        out.append(propagated_output(spec, prop, x, token, return_full, from_top=False, rows=rows))
        done += len(x)
    return torch.cat(out)


@in_eval_mode
def chefer_relevance(
    model: nn.Module,
    images: Images,
    target: Target = None,
    *,
    start_layer: int = 0,
    token: int | str | None = None,
    return_full: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Chefer, Gur & Wolf (ICCV 2021) generic relevance for self-attention, Eq. (5)-(6); see the module docstring.

    Args:
        model: any ViT ``vitviz.inspect`` reads whose attention feeds its output (timm, Hugging Face, torchvision).
        images: a normalised ``(B, 3, H, W)`` tensor, or anything ``vitviz.load_images`` takes.
        target: ``None`` (predicted class), a class index, one per image, or a callable ``f(output) -> (B,)``.
        start_layer: leave out the layers before this one.
        token: the rows read: default the rows of the tokens the model's head reads (``ViTSpec.readout``: the class
            row; the mean of the class and distillation rows; the mean of the patch rows for average pooling or no
            class token); ``"class"``: the class row; an int: that token's row.
        return_full: return ``R`` ``(B, N, N)`` instead of the maps.
        batch_size: images per forward/backward pass (default all at once).
        progress: show a progress bar over images.

    Returns:
        ``(B, gh, gw)`` relevance (non-negative), or ``(B, N, N)``; on the model's device; float32, float64 for a
        float64 model (the product runs in the gradients' dtype; ``vitviz.explain`` casts to float32).
    """
    return _run(model, images, target, "chefer", discard_ratio=0.0, start_layer=start_layer, token=token,
                return_full=return_full, batch_size=batch_size, progress=progress)


@in_eval_mode
def grad_rollout(
    model: nn.Module,
    images: Images,
    target: Target = None,
    *,
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    token: int | str | None = None,
    return_full: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Gradient-weighted attention rollout (vitviz's rule; see the module docstring for how it differs).

    Per layer ``W_l = mean_h (attn_l * d s / d attn_l)^+`` (Chefer et al.'s head weighting, ICCV 2021 Eq. 5),
    then attention rollout's ``A_l = rownorm(0.5 W_l + 0.5 I)`` and ``R_l = A_l R_{l-1}`` (Abnar & Zuidema 2020).
    This is neither Chefer et al.'s relevance (``vitviz.explain(..., method="chefer")``) nor vit-explain's
    ``vit_grad_rollout``.

    Args:
        model: a ViT whose attention feeds its output; with a class target it needs logits, a headless model takes
            a callable target.
        images: as in ``attention_rollout``.
        target: ``None`` (predicted class), a class index, one per image, or a callable ``f(output) -> (B,)``.
        discard_ratio: zero this fraction of the weakest entries of each row of ``W_l`` (never the diagonal nor a
            prefix column) before the residual; rows stay stochastic.
        start_layer, token, return_full, batch_size, progress: as in ``attention_rollout``.

    Returns:
        ``(B, gh, gw)`` maps (or ``(B, N, N)`` with ``return_full``), float32, on the model's device.
    """
    return _run(model, images, target, "grad_rollout", discard_ratio=discard_ratio, start_layer=start_layer,
                token=token, return_full=return_full, batch_size=batch_size, progress=progress)
