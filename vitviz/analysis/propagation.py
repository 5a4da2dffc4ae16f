"""Propagation of attention through the layers: one per-layer rule and one product, for every method that uses it.

Attention rollout, gradient-weighted rollout, Chefer et al.'s relevance, the attention explorer and attention
flow's layer graph all turn each residual block's attention into one matrix ``A_l`` ``(B, N, N)`` and chain the
blocks, ``R = A_L A_{L-1} ... A_1``. This module holds the three steps they share, once:

1. **Head fusion** (``fuse_heads``): ``(B, H, N, N)`` (or a streamed ``HeadMaps``) -> ``W`` ``(B, N, N)``, the mean
   (ViT paper, App. D.8), max or min over heads. Gradient methods bring their own head reduction
   (``mean_h (grad * A)^+``, Chefer et al., ICCV 2021, Eq. 5) and feed ``W`` directly.
2. **Branch averaging** (``Propagator``): several attention modules in one residual block (parallel blocks,
   ``ViTSpec.attention_blocks``) are averaged after head fusion, ``W = mean_j W_j``: the residual adds the
   branches with equal weight (vitviz's choice; no published rule covers this layout).
3. **The layer rule** (``LayerRule``), from ``W`` to ``A``:

   - ``"rollout"`` (Abnar & Zuidema, ACL 2020, Eq. 1): ``A = rownorm(0.5 rownorm(W) + 0.5 I)``; with
     ``discard_ratio`` the weakest entries of each row of ``rownorm(W)`` are zeroed first (``discard_weakest``) and
     the row renormalised; ``residual=False`` gives ``A = rownorm(W)``.
   - ``"grad_rollout"``: the same on a gradient-weighted ``W`` whose magnitude is kept (no ``rownorm`` before the
     residual): ``A = rownorm(0.5 W + 0.5 I)``.
   - ``"chefer"`` (Chefer, Gur & Wolf, ICCV 2021, Eq. 6): ``A = I + W``, no renormalisation; ``W`` is stored and
     the identity applied in the product, ``R + W R``, as in the reference code's ``R <- R + W R``.

**The rows read** (``output_rows``): by default the rows of the tokens the model's head reads
(``ViTSpec.readout``, ``vitviz.core.families.readout``): the class token's row (a class-token head; unchanged bit for
bit), the mean of the class and distillation rows (DeiT-distilled), the mean of the patch rows (average pooling,
and every model without a class token), ``0.5 e_cls + 0.5 mean(patch rows)`` (``[cls, patch mean]`` heads). Abnar &
Zuidema (2020) and Chefer et al. (2021) read the class row because their models' heads read the class token; a
head that never reads it (``global_pool="avg"``) makes the class row an explanation of a token the output ignores.
An attention pool (timm ``"map"``, SigLIP's head, open_clip's attentional pooler) outputs ``sum_j a_j v_j``: where the
family reads its attention ``a`` (``ViTSpec.readout.pool_attention``; ``PoolRows``), the rows read are ``a`` itself,
per image, so the map is ``a . R``; other attention pools, max pooling and heads on every token are approximated by
the mean of the rows pooled over (the readout's ``exact`` is ``False``). ``token="class"`` reads the class row
whatever the head, ``token="patches"`` the mean of the patch rows, ``token=<int>`` any single row.

The product (``Propagator.result``): ``R = A_L ... A_1`` bottom up, or rows ``v`` pushed from the top,
``v A_L ... A_1`` (``K N^2`` per layer, not ``N^3``). A ``Propagator`` is ``capture_attention``'s ``on_layer``
reducer (each layer fused and turned into ``A_l`` as the forward pass runs; only ``L`` ``(B, N, N)`` matrices
kept); ``propagate`` runs it on maps already in hand.

Shapes: ``B`` batch, ``H`` heads, ``N`` tokens (prefix + patches), ``K`` rows, ``(gh, gw)`` grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitviz.analysis.readout_rows import PoolRows, Rows, output_rows, output_token
from vitviz.core.capture import HeadMaps, check_layer_index
from vitviz.core.spec import ViTSpec
from vitviz.core.util import check_bool, is_int, is_number
from vitviz.errors import CaptureError, InputError, InputTypeError

__all__ = [
    "FLOW_MAPS", "HEAD_FUSIONS", "RULES", "LayerRule", "PoolRows", "Propagator", "check_block_start",
    "discard_weakest", "fuse_heads", "layer_range", "output_rows", "output_token", "propagate", "propagated_output",
    "query_vectors", "require_flow_maps", "rollout_to_maps",
]

HEAD_FUSIONS = ("mean", "max", "min")
RULES = ("rollout", "grad_rollout", "chefer")
FLOW_MAPS = ("softmax", "class-attention")  # map kinds that are a flow between tokens (ViTSpec.attention_maps)


def fuse_heads(attn: torch.Tensor | HeadMaps, head_fusion: str = "mean", dtype: torch.dtype = torch.float32,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Fuse the heads of ``(B, H, N, N)`` attention into ``(B, N, N)`` (``mean``, ``max`` or ``min``).

    The one entry point for head fusion. ``attn`` may be a ``HeadMaps`` (``capture_attention(heads="stream")``):
    the heads are then folded in one at a time. ``out``: a ``(B, N, N)`` tensor of ``dtype`` to write into.
    """
    if not isinstance(attn, (torch.Tensor, HeadMaps)):
        raise InputTypeError(f"attn: expected a (B, H, N, N) torch.Tensor, got {type(attn).__name__}; pass one "
                             "layer's post-softmax map (torch.as_tensor(a) for a NumPy array)")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(f"dtype={dtype!r} is not a floating torch dtype; pass torch.float32 (the default), "
                         "torch.float64 or a half-precision dtype")
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise InputError(f"attn: expected attention of shape (B, H, N, N), got {tuple(attn.shape)}; pass one "
                         "layer's post-softmax map")
    if head_fusion not in HEAD_FUSIONS:
        raise InputError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if isinstance(attn, HeadMaps):
        return attn.fuse(head_fusion, dtype, out)
    if head_fusion == "mean":  # sum then scale: one pass over the maps (``mean(dtype=)`` takes about twice as long)
        summed = attn.sum(dim=1, dtype=dtype) if out is None else torch.sum(attn, dim=1, dtype=dtype, out=out)
        return summed.mul_(1.0 / attn.shape[1])
    fused = (attn.amax(dim=1) if head_fusion == "max" else attn.amin(dim=1)).to(dtype)
    return fused if out is None else out.copy_(fused)


def _normalise_rows(w: torch.Tensor) -> torch.Tensor:
    return w / w.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)


def _check_ratio(ratio: float) -> None:
    if not is_number(ratio) or not 0.0 <= ratio <= 1.0:  # is_number: a real number, not a bool or a string
        raise InputError(f"discard_ratio={ratio!r} is not a fraction in [0, 1]; e.g. discard_ratio=0.9 zeroes the "
                         "weakest 90% of each row")


def discard_weakest(w: torch.Tensor, ratio: float, num_prefix_tokens: int) -> torch.Tensor:
    """Zero the weakest ``ratio`` of each row's entries, never the diagonal nor a prefix-token column.

    Row ``i`` may lose ``floor(ratio * c_i)`` entries, where ``c_i`` counts its patch columns other than ``i``
    (``P`` for a prefix row, ``P - 1`` for a patch row). Among equal values the earlier position (lower token
    index) is discarded first: the candidates are ordered by a stable sort. Rows are not renormalised.

    Args:
        w: ``(B, N, N)`` fused attention.
        ratio: fraction in ``[0, 1]``.
        num_prefix_tokens: the leading tokens whose columns are kept.

    Returns:
        a new ``(B, N, N)`` tensor (``w`` itself when nothing is discarded).
    """
    _check_ratio(ratio)
    n = w.shape[-1]
    p = min(int(num_prefix_tokens), n)
    # how many each row may lose, counted on the host (the max of a device tensor is a wait per layer on a GPU), in
    # float64 as ``floor(ratio * count)``: P = n - p columns for a prefix row (its diagonal is a prefix column),
    # P - 1 for a patch row
    k_prefix, k_patch = math.floor(ratio * float(n - p)), math.floor(ratio * float(max(n - p - 1, 0)))
    k_max = max(k_prefix if p else 0, k_patch)  # k_patch is 0 where there is no patch row
    if k_max == 0:
        return w
    protected = torch.zeros(n, n, dtype=torch.bool, device=w.device)
    protected[:, :p] = True
    protected.fill_diagonal_(True)
    k_row = torch.full((n,), k_patch, dtype=torch.long, device=w.device)  # (N,)
    k_row[:p].fill_(k_prefix)
    scores = w.masked_fill(protected, float("inf"))
    # (B, N, k_max), weakest first; a stable sort keeps ties in token order (topk's order among ties is unspecified)
    idx = scores.sort(dim=-1, stable=True).indices[..., :k_max]
    take = (torch.arange(k_max, device=w.device) < k_row[:, None]).expand_as(idx)
    drop = torch.zeros_like(w, dtype=torch.bool).scatter_(-1, idx, take)
    return w.masked_fill(drop, 0.0)


@dataclass(frozen=True)
class LayerRule:
    """The per-layer rule ``W -> A`` of a propagation method (see the module docstring for the equations).

    Args:
        kind: ``"rollout"``, ``"grad_rollout"`` or ``"chefer"``.
        residual: model the skip connection, ``0.5 W + 0.5 I`` (rollout kinds; Chefer's ``I + W`` always has it).
        discard_ratio: fraction of each row's weakest entries to zero (rollout kinds; see ``discard_weakest``).
        num_prefix_tokens: leading non-patch tokens (their columns are never discarded).
    """

    kind: str = "rollout"
    residual: bool = True
    discard_ratio: float = 0.0
    num_prefix_tokens: int = 1

    def __post_init__(self) -> None:
        if self.kind not in RULES:
            raise InputError(f"rule kind must be one of {RULES}, got {self.kind!r}")
        _check_ratio(self.discard_ratio)
        if self.residual not in (True, False):  # a bool (or NumPy's), not a truthy string such as 'no'
            raise InputTypeError(f"residual={self.residual!r} is not True or False; pass residual=True to model the "
                                 "skip connection (0.5 W + 0.5 I), False to leave it out")
        p = self.num_prefix_tokens
        if not is_int(p) or p < 0:
            raise InputError(f"num_prefix_tokens={p!r} is not a count of tokens; pass a non-negative integer, the "
                             "tokens before the patches (1 for a class token; ViTSpec.num_prefix_tokens)")
        if self.kind == "chefer" and (self.discard_ratio or not self.residual):
            raise InputError("the chefer rule (A = I + W) takes no discard_ratio and always keeps the residual; "
                             "use kind='grad_rollout' to discard")

    @property
    def skip(self) -> bool:
        """True when ``A = I + M`` with ``M`` the stored matrix (the identity is applied in the product)."""
        return self.kind == "chefer"

    def __call__(self, w: torch.Tensor, *, stochastic: bool = False) -> torch.Tensor:
        """The stored matrix of one layer from its fused ``(B, N, N)`` map ``W`` (``W`` may be modified in place).

        ``stochastic``: ``W``'s rows already sum to 1 (the head mean of softmax maps), so renormalising would only
        cost time.
        """
        if self.kind == "chefer":
            return w
        normalise = self.kind == "rollout"  # grad_rollout keeps the gradient weights' magnitude against I
        stochastic = stochastic and normalise
        if normalise and not stochastic:
            w = _normalise_rows(w)
        if self.discard_ratio > 0:
            w = discard_weakest(w, self.discard_ratio, self.num_prefix_tokens)
            if normalise:
                w = _normalise_rows(w)
                stochastic = False
        if self.residual:
            w.mul_(0.5)
            w.diagonal(dim1=-2, dim2=-1).add_(0.5)
            if not stochastic:
                w = _normalise_rows(w)
        return w


class Propagator:
    """Streaming propagation: feed one attention module at a time, in forward order; read ``R`` or rows of it.

    Use it as ``capture_attention(model, on_layer=prop, store=False, heads="stream")``; a call with position 0
    starts a new pass, so consecutive forward passes do not mix. Each call takes the module's ``(B, H, N, N)`` map
    (or ``HeadMaps``), fused here, or a ``(B, N, N)`` map already reduced over heads (gradient-weighted maps).

    Args:
        rule: the ``LayerRule``.
        head_fusion: ``mean``, ``max`` or ``min`` (for 4-D maps).
        blocks: the residual block of each module fed (``ViTSpec.attention_blocks``, aligned with the modules fed):
            consecutive modules of one block are averaged into one ``A_l``. Default: one block per module.
        assume_stochastic: the maps fed are post-softmax (rows sum to 1), so their head mean needs no
            renormalisation.
        num_layers: the number of blocks one pass feeds: their matrices then go into one ``(L, B, N, N)`` tensor
            allocated at the first layer, the heads fused straight into it (no per-layer allocations).
        dtype: dtype of the matrices and the product (float32 by default, also for half-precision models).
    """

    def __init__(self, rule: LayerRule, *, head_fusion: str = "mean", blocks: Sequence[int] | None = None,
                 assume_stochastic: bool = False, num_layers: int | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        if not isinstance(rule, LayerRule):
            raise InputTypeError(f"rule={rule!r} is not a LayerRule; pass e.g. LayerRule('rollout') (kinds: {RULES})")
        if head_fusion not in HEAD_FUSIONS:
            raise InputError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
        self.rule = rule
        self.head_fusion = head_fusion
        self.blocks = None if blocks is None else list(blocks)
        self.stochastic = assume_stochastic and head_fusion == "mean"
        self.num_layers = num_layers
        self.dtype = dtype
        self.matrices: list[torch.Tensor] = []  # one stored matrix per block fed (A_l, or W_l when rule.skip)
        self._block: torch.Tensor | None = None
        self._pending: list[torch.Tensor] = []

    def reset(self) -> None:
        self.matrices = []
        self._pending = []

    def on_abort(self, layers: int) -> None:
        """``capture_attention``'s ``on_abort``: a forward pass that raised after ``layers`` of its maps were fed
        leaves nothing to undo beyond them; they are dropped (the retry, from position 0, would reset anyway)."""
        self.reset()

    def _last_of_block(self, position: int) -> bool:
        b = self.blocks
        return b is None or position + 1 >= len(b) or b[position + 1] != b[position]

    def _slot(self, shape: torch.Size, device: torch.device) -> torch.Tensor | None:
        """This block's place in the kept ``(L, B, N, N)`` tensor, or None (no such tensor, or it does not fit)."""
        i = len(self.matrices)
        if not self.num_layers or i >= self.num_layers:
            return None
        full = (self.num_layers, *shape)
        if self._block is None or self._block.shape != full or self._block.device != device:
            self._block = torch.empty(full, dtype=self.dtype, device=device)
        return self._block[i]

    def __call__(self, position: int, attn: torch.Tensor | HeadMaps) -> None:
        if not isinstance(attn, (torch.Tensor, HeadMaps)):
            raise InputTypeError(f"attn: expected a (B, H, N, N) or (B, N, N) torch.Tensor, got "
                                 f"{type(attn).__name__}; pass torch.as_tensor(a) for a NumPy array")
        if attn.ndim not in (3, 4) or attn.shape[-1] != attn.shape[-2]:
            raise InputError(f"attn: expected a map of shape (B, H, N, N) or (B, N, N), got {tuple(attn.shape)}; "
                             "pass every layer's map with its batch axis (a[None] for one image's (N, N) map)")
        if position == 0:
            self.reset()
        last = self._last_of_block(position)
        fused = attn.ndim == 4
        if fused:
            b, _, n, _ = attn.shape
            slot = self._slot(torch.Size((b, n, n)), attn.device) if last and not self._pending else None
            w = fuse_heads(attn, self.head_fusion, self.dtype, out=slot)
        else:
            w = attn.to(self.dtype, copy=True)  # the rule works in place
        if self._pending or not last:  # parallel branches of one block: averaged after head fusion
            self._pending.append(w)
            if not last:
                return
            total = self._pending[0]
            for extra in self._pending[1:]:
                total = total + extra
            w, self._pending = total / len(self._pending), []
        self.push(w, stochastic=fused and self.stochastic)

    def feed(self, maps: Sequence[torch.Tensor | HeadMaps]) -> Propagator:
        """Feed one pass of maps in hand, in forward order (a new pass); returns ``self``."""
        for i, m in enumerate(maps):
            self(i, m)
        return self

    def push(self, w: torch.Tensor, *, stochastic: bool = False) -> None:
        """Add one block given its fused ``(B, N, N)`` map ``W`` (which may be modified in place)."""
        a = self.rule(w.to(self.dtype), stochastic=stochastic)
        if self.matrices and self.matrices[-1].shape != a.shape:
            raise CaptureError(f"layer maps changed shape within one pass: {tuple(self.matrices[-1].shape)} "
                                    f"then {tuple(a.shape)}; feed one forward pass at a time, from position 0")
        slot = self._slot(a.shape, a.device)
        if slot is not None and a.data_ptr() != slot.data_ptr():
            slot.copy_(a)  # the rule made a new tensor (discarding, renormalising): keep it in the block
            a = slot
        self.matrices.append(a)

    def result(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The full product ``R`` ``(B, N, N)``, or the rows ``v R`` for ``rows=v`` ``(B, K, N)`` or ``(B, N)``.

        ``R`` is multiplied bottom up, ``A_L (... (A_2 A_1))``; rows are pushed from the top, ``((v A_L) ...) A_1``.
        The result is always a new tensor, never a kept matrix (with ``num_layers`` those live in one block that
        the next pass overwrites), also when the product has a single layer.
        """
        if not self.matrices:
            raise CaptureError("Propagator: no layer was fed; run a forward pass inside capture_attention("
                              "on_layer=propagator) or call propagate(...) on maps in hand")
        skip = self.rule.skip
        if rows is None:
            r = self.matrices[0]
            if skip:
                n = r.shape[-1]
                r = torch.eye(n, dtype=r.dtype, device=r.device) + r
            elif len(self.matrices) == 1:
                r = r.clone()  # R = A_1: a copy, not a view into the kept block
            for a in self.matrices[1:]:
                r = r + torch.bmm(a, r) if skip else torch.bmm(a, r)
            return r
        b, n = self.matrices[0].shape[0], self.matrices[0].shape[-1]
        if not isinstance(rows, torch.Tensor):
            raise InputTypeError(f"rows: expected a ({b}, {n}) or ({b}, K, {n}) torch.Tensor, got "
                                 f"{type(rows).__name__}")
        if rows.ndim not in (2, 3) or rows.shape[0] != b or rows.shape[-1] != n:
            raise InputError(f"rows of shape {tuple(rows.shape)} do not fit maps of {b} images and {n} tokens; pass "
                             f"row selectors of shape ({b}, {n}) or ({b}, K, {n}) (query_vectors builds them), or "
                             "rows=None for the full product")
        vec = rows.ndim == 2
        r = rows.to(self.dtype)[:, None] if vec else rows.to(self.dtype)
        for a in reversed(self.matrices):
            r = r + torch.bmm(r, a) if skip else torch.bmm(r, a)
        return r[:, 0] if vec else r


def propagate(maps: Sequence[torch.Tensor], rule: LayerRule, *, rows: torch.Tensor | None = None,
              head_fusion: str = "mean", blocks: Sequence[int] | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Propagation of maps already in hand (a ``Propagator`` fed in order): ``R`` or the rows ``v R``.

    Args:
        maps: per attention module, in forward order, ``(B, H, N, N)`` maps (fused with ``head_fusion``) or
            ``(B, N, N)`` maps already reduced over heads.
        rule: the ``LayerRule``.
        rows: ``None`` for the full ``R`` ``(B, N, N)``; else row selectors ``v`` ``(B, N)`` or ``(B, K, N)``.
        head_fusion, blocks, dtype: as in ``Propagator``.

    Returns:
        ``R`` ``(B, N, N)`` or ``v R`` (the shape of ``v``), in ``dtype``.

    Raises:
        InputError: no maps, ``blocks`` not one per map, or ``rows`` of a shape that does not fit the maps.
    """
    maps = list(maps)
    if not maps:
        raise InputError("maps: no layers to propagate (an empty list); pass at least one attention map")
    if blocks is not None and len(blocks) != len(maps):
        raise InputError(f"blocks: {len(blocks)} block indices for {len(maps)} maps; pass one block index per map "
                         "(ViTSpec.attention_blocks, sliced like the maps)")
    return Propagator(rule, head_fusion=head_fusion, blocks=blocks, dtype=dtype).feed(maps).result(rows)


def query_vectors(batch: int, n: int, num_prefix_tokens: int, token: Rows, *,
                  device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The row selector ``(B, N)`` whose product with ``R`` is the row ``rollout_to_maps`` reads.

    ``e_token`` for a token index; for ``token=None`` the mean of the patch queries' unit rows; for an ``(N,)``
    tensor of row weights (``output_rows``), those weights.
    """
    v = torch.zeros(batch, n, device=device, dtype=dtype)
    if isinstance(token, torch.Tensor):  # (N,) for every image, or (B, N) per image
        v.copy_(token.to(device=v.device, dtype=dtype).expand(batch, n))
    elif token is None:
        v[:, num_prefix_tokens:] = 1.0 / (n - num_prefix_tokens)
    else:
        v[:, token] = 1.0
    return v


def _check_tokens(n: int, grid_size: tuple[int, int], num_prefix_tokens: int) -> None:
    gh, gw = grid_size
    if n != num_prefix_tokens + gh * gw:
        raise InputError(f"a propagation over {n} tokens does not fit {num_prefix_tokens} prefix tokens and a "
                         f"{gh}x{gw} grid ({num_prefix_tokens + gh * gw} tokens); pass the grid of the input "
                         "(ViTSpec.grid_for_input)")


def rollout_to_maps(rollout: torch.Tensor, grid_size: tuple[int, int], num_prefix_tokens: int,
                    token: Rows) -> torch.Tensor:
    """Row ``token`` of ``R`` ``(B, N, N)`` over the patch columns, as ``(B, gh, gw)`` maps.

    ``token=None`` averages the rows of all patch queries (average pooling, models without a class token); an
    ``(N,)`` tensor ``w`` (``output_rows``) gives ``w R``, the weighted sum of the rows.
    """
    b, n, _ = rollout.shape
    _check_tokens(n, grid_size, num_prefix_tokens)
    if isinstance(token, torch.Tensor):
        if token.shape not in ((n,), (b, n)):
            raise InputError(f"token: row weights of shape {tuple(token.shape)} do not fit {b} images of {n} tokens; "
                             f"pass ({n},) or ({b}, {n})")
        w = token.to(device=rollout.device, dtype=rollout.dtype).expand(b, n)
        rows = torch.bmm(w[:, None], rollout)[:, 0]
    else:
        rows = rollout[:, num_prefix_tokens:].mean(dim=1) if token is None else rollout[:, token]
    return rows[:, num_prefix_tokens:].reshape(b, *grid_size)


def layer_range(spec: ViTSpec, start_layer: int) -> list[int]:
    """The attention-module indices ``start_layer ... depth - 1`` (``start_layer`` checked: an index, at the first
    attention module of its residual block, ``check_block_start``)."""
    depth = len(spec.attention_modules)
    start = check_layer_index(start_layer, depth, "start_layer", spec.name)
    check_block_start(spec.attention_blocks, start, start_layer, spec.name)
    return list(range(start, depth))


def check_block_start(blocks: Sequence[int] | None, first: int, start_layer: int, name: str = "the model") -> None:
    """Refuse a ``start_layer`` (``first`` its index from 0) that starts inside a residual block: where several
    attention modules share one block (parallel branches, ``blocks`` their block indices), the block's matrix is
    their average (``Propagator``), so keeping only its later branches would propagate them as the whole block.

    Raises:
        InputError: ``blocks[first]`` is the block of ``blocks[first - 1]``; the message names the block's first
            module, and the next block's.
    """
    if not blocks or first <= 0 or first >= len(blocks) or blocks[first] != blocks[first - 1]:
        return
    blocks = list(blocks)
    block = blocks[first]
    own = blocks.index(block)
    after = next((i for i in range(first, len(blocks)) if blocks[i] != block), None)
    fix = f"start_layer={own} (the block's first attention module)" + (
        f" or {after} (the next block's)" if after is not None else "")
    raise InputError(f"start_layer={start_layer}: attention module {first} of {name} is a later branch of residual "
                     f"block {block}, whose {blocks.count(block)} parallel attention modules make one step of the "
                     f"propagation together (their maps averaged); starting at it would propagate part of the block "
                     f"as the whole. Pass {fix}")


def require_flow_maps(spec: ViTSpec, layers: list[int], method: str, *, suggest_start: bool = True) -> None:
    """Refuse maps that are not a flow between tokens (signed, mixed across heads): ``UnsupportedModelError``.

    Differential attention (``S1 - lambda S2``) and CaiT's talking-heads maps are refused by every propagation
    method; ``suggest_start`` names the ``start_layer`` from which the layers are all flows (CaiT's class stage).
    """
    maps = spec.attention_maps or ("softmax",) * len(spec.attention_modules)
    ok_from = next((i for i in range(len(maps)) if all(k in FLOW_MAPS for k in maps[i:])), None)
    hint = (f"start_layer={ok_from} rolls out only the layers from {spec.attention_modules[ok_from]} on"
            if suggest_start and ok_from is not None and ok_from > layers[0] else "")
    spec.require_maps(method, FLOW_MAPS, layers, hint)


def propagated_output(spec: ViTSpec, prop: Propagator, x: torch.Tensor, token: int | str | None, full: bool, *,
                      from_top: bool = True, rows: torch.Tensor | None = None) -> torch.Tensor:
    """What a propagation call returns for the batch ``x``: ``R`` ``(B, N, N)``, or the ``(B, gh, gw)`` maps.

    The maps are the rows ``output_rows(spec, token)`` reads (default the rows the model's head reads,
    ``ViTSpec.readout``) over the patch columns: pushed from the top through the kept matrices (``from_top``, no ``N^3``
    product), or read off the full product ``R`` (the gradient methods, whose cost is the backward pass: their
    maps stay bit-identical to the row of ``R`` they return with ``return_full``). ``rows``: ``(B, N)`` row weights
    read during the pass (``PoolRows.take``), used instead of ``output_rows``.
    """
    check_bool(full, "return_full", "return the whole (B, N, N) product R instead of the maps")
    if not prop.matrices:
        return prop.result()  # raises: nothing was fed
    if full or not from_top:
        r = prop.result()
        if full:
            return r
        return rollout_to_maps(r, spec.grid_for_input(x), spec.num_prefix_tokens,
                               output_rows(spec, token, r.shape[-1]) if rows is None else rows)
    grid = spec.grid_for_input(x)
    p = spec.num_prefix_tokens
    b, n = len(x), prop.matrices[0].shape[-1]
    _check_tokens(n, grid, p)
    read = output_rows(spec, token, n) if rows is None else rows
    v = query_vectors(b, n, p, read, device=prop.matrices[0].device, dtype=prop.dtype)
    return prop.result(v)[:, p:].reshape(b, *grid)
