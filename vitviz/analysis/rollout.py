"""Attention rollout (Abnar & Zuidema, ACL 2020) and gradient-weighted rollout, streamed layer by layer.

Rollout, as used for the ViT paper's Fig. 6 and 14 (Dosovitskiy et al., ICLR 2021, App. D.8): for each layer
fuse the heads of the post-softmax attention ``(B, H, N, N)`` into ``W`` ``(B, N, N)`` (mean by default), add the
residual connection as ``A = 0.5 W + 0.5 I`` with rows renormalised, and multiply through the layers,
``R_l = A_l R_{l-1}`` with ``R_0 = I``. Row ``t`` of ``R_L`` says how much each input token flows into output
token ``t``; the map is that row over the patch columns, reshaped to the ``(gh, gw)`` grid ``vitviz.inspect``
reads (never ``sqrt(N)``). Prefix tokens (class, distillation, registers) take part in every product.

The output token: the class token when the model has one (``spec.class_token_index``). A model without one
(SigLIP, timm ``class_token=False``: ``spec.class_token_index is None``) has no output row to read, so the map is
the **mean of the rollout rows of all patch queries** over the patch columns (``rollout_to_maps(token=None)``),
i.e. how much each patch flows, on average, into the patch tokens the model pools; ``token=`` picks any single row
instead. ``tests/test_families_hf.py`` pins this for SigLIP.

``attention_rollout`` reduces each layer as the forward pass produces it (``capture_attention(on_layer=...,
store=False)``), so besides the layer being computed only the running product and the fused map, a few
``(B, N, N)`` tensors, are alive, on the model's device.

``grad_rollout`` (in ``vitviz.analysis.relevance``) is vitviz's gradient-weighted
rollout: Chefer et al.'s head weighting ``W = mean_h (attn * d s / d attn)^+`` (ICCV 2021, Eq. 5) fed through the
row-renormalised ``0.5 W + 0.5 I`` rollout above. It is neither Chefer et al.'s relevance rule (``R <- R + W R``;
``vitviz.explain(..., method="chefer")``) nor jacobgil/vit-explain's ``vit_grad_rollout``; the module docstring of
``vitviz.analysis.relevance`` lists the differences.

vit-explain's ``discard_ratio`` differs from vitviz's: it drops the weakest entries over the whole flattened matrix
(of the first image only), then divides by the row sums along the wrong axis; vitviz drops them row by row and
keeps every row stochastic (``discard_weakest``).

Layouts beyond one softmax map per layer (``ViTSpec.attention_maps`` / ``attention_blocks``):

- parallel blocks (several attention branches whose outputs the residual adds, timm ``ParallelThingsBlock``):
  the branches' fused maps are averaged, ``W = mean_j W_j``, then ``A = 0.5 W + 0.5 I`` as for one map (our
  choice: the residual adds the branches with equal weight; rollout has no published rule for this layout).
- CaiT: the talking-heads self-attention layers are refused (mixed across heads after the softmax, signed, rows
  not summing to 1: not a flow between tokens); the class-attention layers roll out as usual (class row softmax,
  patch rows identity), so ``start_layer=<index of the first class-attention layer>`` gives the class token's
  rollout over the class-attention stage.
- differential attention (signed ``S1 - lambda S2``, rows sum to ``1 - lambda``): refused.

Shapes: ``B`` batch, ``H`` heads, ``N`` tokens (prefix + patches), ``P`` patch tokens, ``(gh, gw)`` grid.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitviz.core.batching import iter_batches
from vitviz.core.capture import capture_attention, check_layer_index
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.errors import VitvizError

ROLLOUT_MAPS = ("softmax", "class-attention")  # map kinds rollout is defined for (ViTSpec.attention_maps)

__all__ = [
    "BranchAverage", "HEAD_FUSIONS", "ROLLOUT_MAPS", "RolloutReducer", "attention_rollout", "discard_weakest",
    "fuse_heads", "rollout_from_attentions", "rollout_to_maps",
]

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attn: torch.Tensor, head_fusion: str = "mean", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fuse the heads of ``(B, H, N, N)`` attention into ``(B, N, N)`` (``mean``, ``max`` or ``min``)."""
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (B, H, N, N), got {tuple(attn.shape)}")
    if head_fusion == "mean":
        return attn.mean(dim=1, dtype=dtype)
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
    """Streaming rollout: feed one layer at a time, in layer order; ``rollout`` is the running ``(B, N, N)``.

    Usable directly as ``capture_attention(model, on_layer=reducer, store=False)``: a call with layer position 0
    starts a new product, so consecutive forward passes do not mix.

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
    """

    def __init__(self, *, num_prefix_tokens: int = 1, head_fusion: str = "mean", discard_ratio: float = 0.0,
                 residual: bool = True, normalise: bool = True, assume_stochastic: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
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
        self.layers = 0
        self._rollout: torch.Tensor | None = None

    def __call__(self, position: int, attn: torch.Tensor) -> None:
        if position == 0:
            self.reset()
        self.update_fused(fuse_heads(attn, self.head_fusion, self.dtype))

    def reset(self) -> None:
        self.layers = 0
        self._rollout = None

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
        if self._rollout is not None and self._rollout.shape != a.shape:
            raise ValueError(f"layer maps changed shape within one pass: {tuple(self._rollout.shape)} then "
                             f"{tuple(a.shape)}")
        self._rollout = a if self._rollout is None else torch.bmm(a, self._rollout)
        self.layers += 1

    @property
    def rollout(self) -> torch.Tensor:
        """The product ``R`` ``(B, N, N)`` of the layers fed so far (rows sum to 1 when normalised)."""
        if self._rollout is None:
            raise VitvizError("RolloutReducer: no layer was fed; run a forward pass inside capture_attention")
        return self._rollout


def rollout_from_attentions(
    attentions: Sequence[torch.Tensor],
    *,
    num_prefix_tokens: int = 1,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    residual: bool = True,
    start_layer: int = 0,
    blocks: Sequence[int] | None = None,
) -> torch.Tensor:
    """Attention rollout of per-layer maps already in hand (pure function).

    Args:
        attentions: per layer, in order, post-softmax ``(B, H, N, N)`` maps (e.g. ``cap.attentions``).
        num_prefix_tokens: leading non-patch tokens (protected from discarding).
        head_fusion, discard_ratio, residual: as in ``attention_rollout``.
        start_layer: layers before this index are left out of the product.
        blocks: block index of every map (``ViTSpec.attention_blocks``); maps of one block (parallel branches)
            are averaged after head fusion (see ``BranchAverage``).

    Returns:
        ``R`` ``(B, N, N)`` float32, ``R = A_L ... A_{start}``; rows sum to 1.
    """
    layers = list(attentions)[start_layer:]
    if not layers:
        raise ValueError(f"no layers to roll out: {len(attentions)} maps given, start_layer={start_layer}")
    reducer = RolloutReducer(num_prefix_tokens=num_prefix_tokens, head_fusion=head_fusion,
                             discard_ratio=discard_ratio, residual=residual)
    feed = reducer if blocks is None else BranchAverage(reducer, list(blocks)[start_layer:start_layer + len(layers)])
    for i, attn in enumerate(layers):
        feed(i, attn)
    return reducer.rollout


class BranchAverage:
    """Feed a ``RolloutReducer`` one averaged fused map per residual block (parallel branches averaged).

    Args:
        reducer: the reducer to feed (its ``head_fusion`` and ``dtype`` are used).
        blocks: block index of each selected attention module, in the order they run.
    """

    def __init__(self, reducer: RolloutReducer, blocks: Sequence[int]) -> None:
        self.reducer = reducer
        self.blocks = list(blocks)
        self.last = {b: p for p, b in enumerate(self.blocks)}
        self.count = {b: self.blocks.count(b) for b in self.last}
        self._sum: torch.Tensor | None = None

    def __call__(self, position: int, attn: torch.Tensor) -> None:
        if position == 0:
            self.reducer.reset()
            self._sum = None
        w = fuse_heads(attn, self.reducer.head_fusion, self.reducer.dtype)
        self._sum = w if self._sum is None else self._sum + w
        block = self.blocks[position]
        if position == self.last[block]:
            self.reducer.update_fused(self._sum / self.count[block])
            self._sum = None


def _check_maps(spec: ViTSpec, layers: list[int], method: str) -> None:
    maps = spec.attention_maps or ("softmax",) * len(spec.attention_modules)
    ok_from = next((i for i in range(len(maps)) if all(k in ROLLOUT_MAPS for k in maps[i:])), None)
    hint = (f"start_layer={ok_from} rolls out only the layers from {spec.attention_modules[ok_from]} on"
            if ok_from is not None and ok_from > layers[0] else "")
    spec.require_maps(method, ROLLOUT_MAPS, layers, hint)


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
    start = check_layer_index(start_layer, depth, "start_layer", spec.name)
    return list(range(start, depth))


def _output(spec: ViTSpec, rollout: torch.Tensor, x: torch.Tensor, token: int | None, full: bool) -> torch.Tensor:
    if full:
        return rollout
    grid = spec.grid_for_input(x)
    return rollout_to_maps(rollout, grid, spec.num_prefix_tokens, _output_token(spec, token, rollout.shape[-1]))


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

    Each layer is reduced while the forward pass runs; only the running product and the current fused map stay
    alive, on the model's device. The model's mode is left as is (call ``model.eval()`` first for dropout-free
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
    _check_maps(spec, layers, "attention_rollout")
    reducer = RolloutReducer(num_prefix_tokens=spec.num_prefix_tokens, head_fusion=head_fusion,
                             discard_ratio=discard_ratio, residual=residual, assume_stochastic=True)
    blocks = [spec.attention_blocks[i] for i in layers] if spec.attention_blocks else layers
    feed = BranchAverage(reducer, blocks) if len(set(blocks)) < len(blocks) else reducer
    out: list[torch.Tensor] = []
    for x in iter_batches(model, images, batch_size, progress=progress, desc="rollout"):
        with torch.no_grad(), capture_attention(model, layers=layers, on_layer=feed, store=False):
            model(x)
        out.append(_output(spec, reducer.rollout, x, token, return_full))
        reducer.reset()
    return torch.cat(out)

