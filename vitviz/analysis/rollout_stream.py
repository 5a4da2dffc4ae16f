"""The streaming part of attention rollout: head fusion, discarding, the residual, and ``RolloutReducer``.

See ``vitviz.analysis.rollout`` for the method (Abnar & Zuidema, ACL 2020; ViT paper App. D.8) and the public
calls; this module holds the per-layer arithmetic they share, so it can run while the forward pass goes by.

Shapes: ``B`` batch, ``H`` heads, ``N`` tokens (prefix + patches), ``K`` rows.
"""

from __future__ import annotations

import torch

from vitviz.core.capture import HeadMaps
from vitviz.errors import VitvizError

__all__ = ["HEAD_FUSIONS", "RolloutReducer", "discard_weakest", "fuse_heads", "query_vectors"]

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attn: torch.Tensor | HeadMaps, head_fusion: str = "mean", dtype: torch.dtype = torch.float32,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Fuse the heads of ``(B, H, N, N)`` attention into ``(B, N, N)`` (``mean``, ``max`` or ``min``).

    ``attn`` may be a ``HeadMaps`` (``capture_attention(heads="stream")``): the heads are then folded in one at a
    time. ``out``: a ``(B, N, N)`` tensor of ``dtype`` to write into.
    """
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (B, H, N, N), got {tuple(attn.shape)}")
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if isinstance(attn, HeadMaps):  # heads folded in turn, or the stream probe's kernel (vitviz.core.kernels)
        return attn.fuse(head_fusion, dtype, out)
    if head_fusion == "mean":  # sum then scale: one pass over the maps (``mean(dtype=)`` takes about twice as long)
        summed = attn.sum(dim=1, dtype=dtype) if out is None else torch.sum(attn, dim=1, dtype=dtype, out=out)
        return summed.mul_(1.0 / attn.shape[1])
    fused = (attn.amax(dim=1) if head_fusion == "max" else attn.amin(dim=1)).to(dtype)
    return fused if out is None else out.copy_(fused)


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
        num_layers: with ``keep="layers"``, the layers one pass feeds: their maps then go into one ``(L, B, N, N)``
            block allocated at the first layer, the heads fused straight into it (no per-layer allocations to
            fragment the heap between the forward's large temporaries).
    """

    def __init__(self, *, num_prefix_tokens: int = 1, head_fusion: str = "mean", discard_ratio: float = 0.0,
                 residual: bool = True, normalise: bool = True, assume_stochastic: bool = False,
                 dtype: torch.dtype = torch.float32, keep: str = "product", num_layers: int | None = None) -> None:
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
        self.num_layers = num_layers
        self._block: torch.Tensor | None = None
        self.layers = 0
        self._rollout: torch.Tensor | None = None
        self._layers: list[torch.Tensor] = []

    def __call__(self, position: int, attn: torch.Tensor | HeadMaps) -> None:
        if position == 0:
            self.reset()
        slot = self._slot(attn)  # fuse straight into the kept block
        self.update_fused(fuse_heads(attn, self.head_fusion, self.dtype, out=slot))

    def _slot(self, attn: torch.Tensor | HeadMaps) -> torch.Tensor | None:
        """This layer's place in the kept ``(L, B, N, N)`` block, or None (no block, or it does not fit)."""
        if self.keep != "layers" or not self.num_layers or self.layers >= self.num_layers or attn.ndim != 4:
            return None
        shape = (self.num_layers, attn.shape[0], attn.shape[-2], attn.shape[-1])
        if self._block is None or self._block.shape != shape or self._block.device != attn.device:
            self._block = torch.empty(shape, dtype=self.dtype, device=attn.device)
        return self._block[self.layers]

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
            slot = self._block[self.layers] if self._block is not None and self.layers < len(self._block) else None
            if slot is not None and a.data_ptr() != slot.data_ptr() and slot.shape == a.shape:
                slot.copy_(a)  # layer_matrix made a new tensor (discarding, renormalising): keep it in the block
                a = slot
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
