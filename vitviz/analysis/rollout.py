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

from vitviz.core.batching import iter_batches
from vitviz.core.capture import capture_attention
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.errors import VitvizError

__all__ = [
    "HEAD_FUSIONS", "RolloutReducer", "attention_rollout", "discard_weakest", "fuse_heads", "grad_rollout",
    "grad_rollout_from_attentions", "query_vectors", "rollout_from_attentions", "rollout_to_maps",
]

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attn: torch.Tensor, head_fusion: str = "mean", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fuse the heads of ``(B, H, N, N)`` attention into ``(B, N, N)`` (``mean``, ``max`` or ``min``)."""
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (B, H, N, N), got {tuple(attn.shape)}")
    if head_fusion == "mean":  # sum then scale: one pass over the maps (``mean(dtype=)`` takes about twice as long)
        return attn.sum(dim=1, dtype=dtype).mul_(1.0 / attn.shape[1])
    if head_fusion == "max":
        return attn.amax(dim=1).to(dtype)
    if head_fusion == "min":
        return attn.amin(dim=1).to(dtype)
    raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")


def _normalise_rows(w: torch.Tensor) -> torch.Tensor:
    return w / w.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)


def discard_weakest(w: torch.Tensor, ratio: float, num_prefix_tokens: int) -> torch.Tensor:
    """Zero the weakest ``ratio`` of each row's entries, never the diagonal nor a prefix-token column.

    Row ``i`` may lose ``floor(ratio * c_i)`` entries, where ``c_i`` counts its patch columns other than ``i``
    (``P`` for a prefix row, ``P - 1`` for a patch row); ties are broken by position. Rows are not renormalised.

    Args:
        w: ``(B, N, N)`` fused attention.
        ratio: fraction in ``[0, 1]``.
        num_prefix_tokens: the leading tokens whose columns are kept.

    Returns:
        a new ``(B, N, N)`` tensor (``w`` itself when nothing is discarded).
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"discard_ratio must lie in [0, 1], got {ratio}")
    n = w.shape[-1]
    protected = torch.zeros(n, n, dtype=torch.bool, device=w.device)
    protected[:, :num_prefix_tokens] = True
    protected.fill_diagonal_(True)
    k_row = torch.floor(ratio * (n - protected.sum(dim=1)).double()).long()  # (N,)
    k_max = int(k_row.max()) if n else 0
    if k_max == 0:
        return w
    scores = w.masked_fill(protected, float("inf"))
    idx = scores.topk(k_max, dim=-1, largest=False).indices  # (B, N, k_max), weakest first
    take = (torch.arange(k_max, device=w.device) < k_row[:, None]).expand_as(idx)
    drop = torch.zeros_like(w, dtype=torch.bool).scatter_(-1, idx, take)
    return w.masked_fill(drop, 0.0)


class RolloutReducer:
    """Streaming rollout: feed one layer at a time, in layer order; ``rollout`` is the product ``(B, N, N)``.

    Usable directly as ``capture_attention(model, on_layer=reducer, store=False)``: a call with layer position 0
    starts a new product, so consecutive forward passes do not mix.

    With ``keep="product"`` (default) each layer is multiplied into the running ``R`` as it comes (``N^3`` per
    layer and image). With ``keep="layers"`` the layers' ``A_l`` ``(B, N, N)`` are kept instead and ``rows(v)``
    pushes row vectors ``v R = v A_L ... A_1`` through them from the top (``N^2`` per layer): the cheap way to get
    a few rows of ``R`` (the class token's, the mean patch query's). ``rollout`` works in both modes.

    Args:
        num_prefix_tokens: leading non-patch tokens (their columns are never discarded).
        head_fusion: ``mean``, ``max`` or ``min``.
        discard_ratio: fraction of each row's weakest fused attentions to zero (see ``discard_weakest``).
        residual: use ``A = 0.5 W + 0.5 I`` (rows renormalised) instead of ``W``.
        normalise: row-normalise the fused map before (and after) discarding; ``False`` keeps raw magnitudes
            (gradient rollout).
        assume_stochastic: the maps fed are post-softmax (rows sum to 1), so the mean over heads needs no
            renormalisation (saves two passes per layer; ``attention_rollout`` sets it).
        dtype: the dtype of the product (float32 by default, also for half-precision models).
        keep: ``"product"`` (multiply while streaming) or ``"layers"`` (keep each ``A_l``, push rows at the end).
    """

    def __init__(self, *, num_prefix_tokens: int = 1, head_fusion: str = "mean", discard_ratio: float = 0.0,
                 residual: bool = True, normalise: bool = True, assume_stochastic: bool = False,
                 dtype: torch.dtype = torch.float32, keep: str = "product") -> None:
        if keep not in ("product", "layers"):
            raise ValueError(f"keep must be 'product' or 'layers', got {keep!r}")
        if head_fusion not in HEAD_FUSIONS:
            raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
        if not 0.0 <= discard_ratio <= 1.0:
            raise ValueError(f"discard_ratio must lie in [0, 1], got {discard_ratio}")
        self.num_prefix_tokens = num_prefix_tokens
        self.head_fusion = head_fusion
        self.discard_ratio = discard_ratio
        self.residual = residual
        self.normalise = normalise
        self.dtype = dtype
        self.assume_stochastic = assume_stochastic
        self.keep = keep
        self.layers = 0
        self._rollout: torch.Tensor | None = None
        self._layers: list[torch.Tensor] = []

    def __call__(self, position: int, attn: torch.Tensor) -> None:
        if position == 0:
            self.reset()
        self.update_fused(fuse_heads(attn, self.head_fusion, self.dtype))

    def reset(self) -> None:
        self.layers = 0
        self._rollout = None
        self._layers = []

    def layer_matrix(self, w: torch.Tensor) -> torch.Tensor:
        """``A`` for one layer from its fused ``(B, N, N)`` map ``W`` (which may be modified in place)."""
        w = w.to(self.dtype)
        # the head mean of post-softmax rows is row-stochastic already: renormalising would only cost time
        stochastic = self.normalise and self.head_fusion == "mean" and self.assume_stochastic
        if self.normalise and not stochastic:
            w = _normalise_rows(w)
        if self.discard_ratio > 0:
            w = discard_weakest(w, self.discard_ratio, self.num_prefix_tokens)
            if self.normalise:
                w = _normalise_rows(w)
                stochastic = False
        if self.residual:
            w.mul_(0.5)
            w.diagonal(dim1=-2, dim2=-1).add_(0.5)
            if not stochastic:
                w = _normalise_rows(w)
        return w

    def update_fused(self, w: torch.Tensor) -> None:
        """Multiply one more layer, given its fused ``(B, N, N)`` map (may be modified in place): ``R <- A R``."""
        a = self.layer_matrix(w)
        last = self._rollout if self._rollout is not None else (self._layers[-1] if self._layers else None)
        if last is not None and last.shape != a.shape:
            raise ValueError(f"layer maps changed shape within one pass: {tuple(last.shape)} then {tuple(a.shape)}")
        if self.keep == "layers":
            self._layers.append(a)
        else:
            self._rollout = a if self._rollout is None else torch.bmm(a, self._rollout)
        self.layers += 1

    def _check_fed(self) -> None:
        if self.layers == 0:
            raise VitvizError("RolloutReducer: no layer was fed; run a forward pass inside capture_attention")

    @property
    def rollout(self) -> torch.Tensor:
        """The product ``R`` ``(B, N, N)`` of the layers fed so far (rows sum to 1 when normalised)."""
        self._check_fed()
        if self._rollout is None:  # keep="layers": multiply the kept layers once, bottom up
            r = self._layers[0]
            for a in self._layers[1:]:
                r = torch.bmm(a, r)
            return r
        return self._rollout

    def rows(self, v: torch.Tensor) -> torch.Tensor:
        """Rows ``v R`` of the rollout: ``v`` ``(B, K, N)`` or ``(B, N)`` -> same shape, in ``dtype``.

        With ``keep="layers"`` the rows go through the kept ``A_l`` from the top, ``v A_L ... A_1`` (``K N^2``
        per layer); otherwise they are read off the running product.
        """
        self._check_fed()
        vec = v.ndim == 2
        r = v.to(self.dtype)[:, None] if vec else v.to(self.dtype)
        if self._rollout is not None:
            r = torch.bmm(r, self._rollout)
        else:
            for a in reversed(self._layers):
                r = torch.bmm(r, a)
        return r[:, 0] if vec else r


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


def query_vectors(batch: int, n: int, num_prefix_tokens: int, token: int | None, *,
                  device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The row selector ``(B, N)`` whose product with ``R`` is the row ``rollout_to_maps`` reads.

    ``e_token`` for a token index; for ``token=None`` the mean of the patch queries' unit rows.
    """
    v = torch.zeros(batch, n, device=device, dtype=dtype)
    if token is None:
        v[:, num_prefix_tokens:] = 1.0 / (n - num_prefix_tokens)
    else:
        v[:, token] = 1.0
    return v


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
                             keep="product" if return_full else "layers")
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
