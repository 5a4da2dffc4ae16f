"""Attention rollout (Abnar & Zuidema, ACL 2020) and gradient-weighted rollout, streamed layer by layer.

Rollout, as used for the ViT paper's Fig. 6 and 14 (Dosovitskiy et al., ICLR 2021, App. D.8): for each layer
fuse the heads of the post-softmax attention ``(B, H, N, N)`` into ``W`` ``(B, N, N)`` (mean by default; a max or
min over heads is renormalised to rows summing to 1, as the mean's do), add the residual connection as
``A = 0.5 W + 0.5 I`` with rows renormalised, and multiply through the layers,
``R_l = A_l R_{l-1}`` with ``R_0 = I``. Row ``t`` of ``R_L`` says how much each input token flows into output
token ``t``; the map is that row over the patch columns, reshaped to the ``(gh, gw)`` grid ``vitviz.inspect``
reads (never ``sqrt(N)``). Prefix tokens (class, distillation, registers) take part in every product.

The output rows: those of the tokens the model's head reads (``spec.readout``, ``vitviz.core.families.readout``).
Abnar & Zuidema and the ViT paper read the class token's row because their models' heads read the class token; the
same rule for other heads reads the head's own tokens. A class-token head: the class row (as before, bit for bit).
Average pooling (timm ``global_pool="avg"``, also with a class token the head never reads; timm ``Beit``; Hugging
Face BEiT's mean pooling; open_clip ``pool_type="avg"``) and models without a class token (SigLIP, timm
``class_token=False``): the **mean of the rollout rows of all patch queries** (``rollout_to_maps(token=None)``),
how much each patch flows, on average, into the patch tokens the head averages. DeiT-distilled (timm
``VisionTransformerDistilled``, Hugging Face ``DeiTForImageClassificationWithTeacher``; eval-mode logits are the
mean of the class head on the class token and the distillation head on the distillation token): the mean of the
class and distillation rows. Attention pools (timm ``"map"``, SigLIP's head, open_clip's attentional pooler) weight
the tokens by their own query's attention ``a``, which depends on the image: vitviz reads ``a`` during the same
forward pass (``readout_rows.PoolRows``) and the map is ``a . R``; attention pools it cannot read (timm ``"prr"``,
NaFlexViT) and max pooling get the uniform mean of the rows pooled over, an approximation
(``spec.readout.exact`` is ``False``). ``token="class"`` reads the class row whatever the head reads (the old
rule); ``token="patches"`` the mean of the patch rows; ``token=<int>`` any single row. ``tests/test_readout*.py``
pins each case.

``attention_rollout`` reduces each layer as the forward pass produces it (``capture_attention(on_layer=...,
store=False)``) with the ``Propagator`` of ``vitviz.analysis.propagation`` (the one place the layer rule, the
branch averaging and the product live): the layer's ``(B, H, N, N)`` map is fused into ``A_l`` ``(B, N, N)`` at
once and dropped, so no ``(B, H, N, N)`` outlives its layer. For the maps (one row of ``R``) no ``N x N x N``
product is formed: the layers' ``A_l`` are kept (``L`` fused maps, ``1/H`` of what storing the attention takes) and
the query row is pushed through them from the top after the pass, ``r = e_t A_L A_{L-1} ... A_1``, a vector-matrix
product per layer. ``return_full=True`` multiplies the kept layers bottom up (``R_l = A_l R_{l-1}``, ``N^3`` per
layer).

``grad_rollout`` (in ``vitviz.analysis.relevance``) is vitviz's gradient-weighted
rollout: Chefer et al.'s head weighting ``W = mean_h (attn * d s / d attn)^+`` (ICCV 2021, Eq. 5) fed through the
row-renormalised ``0.5 W + 0.5 I`` rollout above. It is neither Chefer et al.'s relevance rule (``R <- R + W R``;
``vitviz.explain(..., method="chefer")``) nor jacobgil/vit-explain's ``vit_grad_rollout``; the module docstring of
``vitviz.analysis.relevance`` lists the differences.

vit-explain's ``discard_ratio`` differs from vitviz's: it drops the weakest entries over the whole flattened matrix
(of the first image only), then divides by the row sums along the wrong axis; vitviz drops them row by row and
keeps every row stochastic (``discard_weakest``). Its ``"max"`` and ``"min"`` head fusions differ too: it adds the
identity to the fused map as it is, ``(W + I) / 2``, whose rows do not sum to 1 (more for max, less for min), so
the skip connection gets less or more than half of each row; vitviz renormalises the fused rows first,
``A = rownorm(0.5 rownorm(W) + 0.5 I)`` (``vitviz.analysis.propagation.LayerRule``), keeping rollout's equal
weights (``tests/test_explain.py`` pins both differences).

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

import numbers
from collections.abc import Sequence

import torch
from torch import nn

from vitviz.analysis.propagation import (  # re-exported: the public names rollout has always had
    FLOW_MAPS,
    HEAD_FUSIONS,
    LayerRule,
    PoolRows,
    Propagator,
    check_block_start,
    discard_weakest,
    fuse_heads,
    layer_range,
    propagate,
    propagated_output,
    query_vectors,
    require_flow_maps,
    rollout_to_maps,
)
from vitviz.core.batching import iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.capture import capture_attention, check_layer_index
from vitviz.core.graphs import graphable
from vitviz.core.images import Images
from vitviz.core.spec import inspect
from vitviz.errors import InputError

ROLLOUT_MAPS = FLOW_MAPS  # map kinds rollout is defined for (ViTSpec.attention_maps)

__all__ = [
    "HEAD_FUSIONS", "ROLLOUT_MAPS", "RolloutReducer", "attention_rollout", "discard_weakest", "fuse_heads",
    "query_vectors", "rollout_from_attentions", "rollout_to_maps",
]


class RolloutReducer(Propagator):
    """A ``Propagator`` with attention rollout's rule (``LayerRule("rollout", ...)``); ``rollout`` is ``R``.

    Args:
        num_prefix_tokens, discard_ratio, residual: the ``LayerRule``'s.
        head_fusion, assume_stochastic, num_layers, dtype, blocks: the ``Propagator``'s.
    """

    def __init__(self, *, num_prefix_tokens: int = 1, head_fusion: str = "mean", discard_ratio: float = 0.0,
                 residual: bool = True, assume_stochastic: bool = False, num_layers: int | None = None,
                 blocks: Sequence[int] | None = None, dtype: torch.dtype = torch.float32) -> None:
        rule = LayerRule("rollout", residual=residual, discard_ratio=discard_ratio,
                         num_prefix_tokens=num_prefix_tokens)
        super().__init__(rule, head_fusion=head_fusion, blocks=blocks, assume_stochastic=assume_stochastic,
                         num_layers=num_layers, dtype=dtype)

    @property
    def rollout(self) -> torch.Tensor:
        """The product ``R`` ``(B, N, N)`` of the layers fed so far (rows sum to 1)."""
        return self.result()

    def rows(self, v: torch.Tensor) -> torch.Tensor:
        """Rows ``v R``: ``v`` ``(B, K, N)`` or ``(B, N)``, pushed through the kept layers from the top."""
        return self.result(v)


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
        start_layer: layers before this index (negative counts from the end) are left out of the product (with
            ``blocks``, the first module of a block: one inside a block of parallel branches is refused,
            ``check_block_start``).
        blocks: block index of every map (``ViTSpec.attention_blocks``); maps of one block (parallel branches)
            are averaged after head fusion (see ``vitviz.analysis.propagation.Propagator``).

    Returns:
        ``R`` ``(B, N, N)`` float32, ``R = A_L ... A_{start}``; rows sum to 1.

    Raises:
        InputError: no maps, a map holding NaN or infinite values (the message names the layer), or
            ``num_prefix_tokens`` that leaves no patch token.
        LayerSelectError: ``start_layer`` not an integer from ``-L`` to ``L - 1`` (``L`` maps).
    """
    attentions = list(attentions)
    if not attentions:
        raise InputError("attentions: no layers to roll out (an empty list); pass at least one attention map")
    first = check_layer_index(start_layer, len(attentions), "start_layer", "these maps")  # the first map kept
    layers = attentions[first:]
    for i, a in enumerate(layers):
        if isinstance(a, torch.Tensor) and not bool(torch.isfinite(a).all()):
            raise InputError(f"attentions[{first + i}] (layer {first + i}, 0-based) holds "
                             f"{int(torch.isnan(a).sum())} NaN and {int(torch.isinf(a).sum())} infinite values; "
                             "the rollout would be NaN. Check the capture (NaN pixels, an overflow in half "
                             "precision?) or leave that layer out")
    n = layers[0].shape[-1] if isinstance(layers[0], torch.Tensor) else None
    if n is not None and isinstance(num_prefix_tokens, numbers.Integral) and num_prefix_tokens >= n:
        raise InputError(f"num_prefix_tokens={num_prefix_tokens} leaves no patch token of the {n} tokens of the "
                         f"maps; pass the number of tokens before the patches, below {n} (1 for a class token; "
                         "ViTSpec.num_prefix_tokens)")
    rule = LayerRule("rollout", residual=residual, discard_ratio=discard_ratio, num_prefix_tokens=num_prefix_tokens)
    check_block_start(None if blocks is None else list(blocks), first, start_layer, "these maps")
    kept = None if blocks is None else list(blocks)[first:first + len(layers)]
    return propagate(layers, rule, head_fusion=head_fusion, blocks=kept)


@graphable
@in_eval_mode
def attention_rollout(
    model: nn.Module,
    images: Images,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    residual: bool = True,
    start_layer: int = 0,
    token: int | str | None = None,
    return_full: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) from the output token to the input patches, as in ViT Fig. 6.

    Each layer is fused while the forward pass runs (no ``(B, H, N, N)`` map outlives its layer); for the maps the
    layers' ``(B, N, N)`` matrices are kept and the output token's row is pushed through them from the top (no
    ``N^3`` products); ``return_full`` multiplies the kept layers instead. All on the model's device. The
    model runs in eval mode for the call, every module's mode put back afterwards (``core.calls.in_eval_mode``).

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor, or PIL images / arrays / paths (see ``vitviz.load_images``).
        head_fusion: how to merge heads: ``"mean"`` (the paper), ``"max"`` or ``"min"`` (the fused rows are then
            renormalised to sum to 1 before the residual, unlike vit-explain: module docstring).
        discard_ratio: zero this fraction of the weakest fused attentions of each row (never the diagonal, never
            a prefix-token column), then renormalise rows.
        residual: model the skip connection as ``A = 0.5 W + 0.5 I`` (``W``'s rows summing to 1; ``A``'s rows
            renormalised).
        start_layer: leave out the layers before this one (their attention is not even materialised); the first
            attention module of a residual block (one inside a block of parallel branches is refused).
        token: the rows read: default (``None``) the rows of the tokens the model's head reads (``spec.readout``:
            the class row for a class-token head; the mean of the rows of all patch queries for average pooling or
            no class token; the mean of the class and distillation rows for DeiT-distilled; attention pools: the
            rows weighted by the pool's own attention); ``"class"``: the class row whatever the head reads;
            ``"patches"``: the mean of the patch rows; an int picks any token index (prefix tokens first, then
            patches row-major).
        return_full: return the whole rollout ``R`` instead of the maps.
        batch_size: images per forward pass (default: all at once).
        progress: show a progress bar over images.

    Returns:
        ``(B, gh, gw)`` float32 maps (row of ``R`` over the patch columns; non-negative, summing to at most 1), or
        ``(B, N, N)`` with ``return_full=True``; on the model's device.
    """
    spec = inspect(model)
    layers = layer_range(spec, start_layer)
    require_flow_maps(spec, layers, "attention_rollout")
    blocks = [spec.attention_blocks[i] for i in layers] if spec.attention_blocks else None
    reducer = RolloutReducer(num_prefix_tokens=spec.num_prefix_tokens, head_fusion=head_fusion,
                             discard_ratio=discard_ratio, residual=residual, assume_stochastic=True,
                             blocks=blocks, num_layers=len(set(blocks or layers)))
    out: list[torch.Tensor] = []
    for x in iter_batches(model, images, batch_size, progress=progress, desc="rollout"):
        with torch.no_grad(), capture_attention(model, layers=layers, on_layer=reducer, store=False, heads="stream"), \
                PoolRows(model, spec, token) as pool:
            model(x)
        n = reducer.matrices[0].shape[-1] if reducer.matrices else 0
        out.append(propagated_output(spec, reducer, x, token, return_full, rows=pool.take(n) if n else None))
        reducer.reset()
    return torch.cat(out)
