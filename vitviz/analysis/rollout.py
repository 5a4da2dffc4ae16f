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
store=False)``): the layer's ``(B, H, N, N)`` map is fused into ``A_l`` ``(B, N, N)`` at once and dropped, so no
``(B, H, N, N)`` outlives its layer. For the maps (one row of ``R``) no ``N x N x N`` product is formed: the
layers' ``A_l`` are kept (``L`` fused maps, ``1/H`` of what storing the attention takes) and the query row is pushed
through them from the top after the pass, ``r = e_t A_L A_{L-1} ... A_1``, a vector-matrix product per layer.
``return_full=True`` multiplies the running product while streaming instead (``R_l = A_l R_{l-1}``, ``N^3`` per
layer).

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

from vitviz.analysis.rollout_stream import (  # re-exported
    HEAD_FUSIONS,
    RolloutReducer,
    discard_weakest,
    fuse_heads,
    query_vectors,
)
from vitviz.core.batching import iter_batches
from vitviz.core.capture import capture_attention, check_layer_index
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect

ROLLOUT_MAPS = ("softmax", "class-attention")  # map kinds rollout is defined for (ViTSpec.attention_maps)

__all__ = [
    "BranchAverage", "HEAD_FUSIONS", "ROLLOUT_MAPS", "RolloutReducer", "attention_rollout", "discard_weakest",
    "fuse_heads", "query_vectors", "rollout_from_attentions", "rollout_to_maps",
]


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
    _check_maps(spec, layers, "attention_rollout")
    blocks = [spec.attention_blocks[i] for i in layers] if spec.attention_blocks else layers
    reducer = RolloutReducer(num_prefix_tokens=spec.num_prefix_tokens, head_fusion=head_fusion,
                             discard_ratio=discard_ratio, residual=residual, assume_stochastic=True,
                             keep="product" if return_full else "layers", num_layers=len(set(blocks)))
    feed = BranchAverage(reducer, blocks) if len(set(blocks)) < len(blocks) else reducer
    out: list[torch.Tensor] = []
    for x in iter_batches(model, images, batch_size, progress=progress, desc="rollout"):
        with torch.no_grad(), capture_attention(model, layers=layers, on_layer=feed, store=False, heads="stream"):
            model(x)
        out.append(reducer.rollout if return_full else _maps_from_reducer(spec, reducer, x, token))
        reducer.reset()
    return torch.cat(out)

