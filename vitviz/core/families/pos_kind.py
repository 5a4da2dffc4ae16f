"""What a position-embedding table *is*, read from the table itself, never from ``requires_grad``.

Kinds (``ViTSpec.pos_embed_kind``):

- ``learned``: an ``nn.Parameter`` whose values are not a sine-cosine table. Freezing the model
  (``model.requires_grad_(False)``) does not change what the table is, so it stays ``learned``.
- ``sincos``: a table whose patch rows are a fixed 2-D sine-cosine embedding (MoCo v3 / MAE, timm
  ``build_sincos2d_pos_embed``), whether it is stored as a buffer or as a (frozen or not) parameter: the values
  decide. A table matches when its patch rows have the Gram matrix of a 2-D sincos table of the same grid and width
  (up to the order of the columns: sin/cos halves and h/w halves may be swapped), and every row has squared norm
  ``D / 2`` (each frequency contributes ``sin^2 + cos^2 = 1``).
- ``fixed``: a tensor that is not a parameter (a buffer) and not a sincos table.
- ``learned-2d``, ``learned-factorized``, ``rotary``, ``relative-bias``, ``none``: set by the families from the
  modules the model has (a table generated from row and column tables, rotary embeddings, a relative position
  bias table in the attention layers, nothing).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

__all__ = ["is_sincos_table", "table_kind"]

# table_kind's verdicts: id(table) -> (weak reference, (version, data_ptr, shape, dtype, device, grid, prefix), kind)
_KINDS: dict[int, tuple[weakref.ref, tuple, str]] = {}


def _sincos_candidates(grid: tuple[int, int], dim: int) -> list[torch.Tensor]:
    from timm.layers import build_sincos2d_pos_embed

    try:  # patches row-major over (gh, gw), as the tokens are laid out
        return [build_sincos2d_pos_embed(list(grid), dim=dim).double()]
    except (AssertionError, ValueError):  # a width the generator does not accept
        return []


def is_sincos_table(rows: torch.Tensor, grid: tuple[int, int], atol: float = 1e-4) -> bool:
    """Whether ``rows`` ``(P, D)`` (patch rows, row-major over the ``grid``) is a fixed 2-D sine-cosine table."""
    if rows.ndim != 2 or rows.is_meta or rows.shape[0] != grid[0] * grid[1] or rows.shape[1] % 4:
        return False
    e = rows.detach().double().cpu()
    d = e.shape[1]
    if not torch.allclose((e * e).sum(-1), torch.full((e.shape[0],), d / 2, dtype=e.dtype), atol=atol * d):
        return False  # cheap test first: learned tables are nowhere near norm^2 = D/2
    gram = e @ e.T
    return any(torch.allclose(gram, c @ c.T, atol=atol * d) for c in _sincos_candidates(grid, d))


def table_kind(pos: torch.Tensor, grid: tuple[int, int], num_prefix_rows: int) -> str:
    """``learned``, ``sincos`` or ``fixed`` for an absolute table ``(1, L, D)`` / ``(L, D)`` (see module doc).

    Args:
        pos: the table; on the meta device its values are unknown and only its type decides.
        grid: ``(gh, gw)`` the table's patch rows cover.
        num_prefix_rows: leading rows that belong to prefix tokens (not compared).
    """
    key = None if pos.is_meta or pos.is_inference() else (
        pos._version, pos.data_ptr(), tuple(pos.shape), pos.dtype, pos.device, tuple(grid), num_prefix_rows)
    seen = _KINDS.get(id(pos))
    if key is not None and seen is not None and seen[0]() is pos and seen[1] == key:
        return seen[2]
    rows = pos.reshape(-1, pos.shape[-1])[num_prefix_rows:]
    sincos = not rows.is_meta and is_sincos_table(rows, grid)
    kind = "sincos" if sincos else "learned" if isinstance(pos, nn.Parameter) else "fixed"
    if key is not None and not rows.is_meta:
        # the comparison copies the table to the CPU (a device sync on a GPU) and forms its Gram matrix: kept per
        # table until the table is written in place (its version counter moves) or freed
        ident = id(pos)
        _KINDS[ident] = (weakref.ref(pos, lambda _ref: _KINDS.pop(ident, None)), key, kind)
    return kind
