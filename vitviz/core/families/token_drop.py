"""Dropping patch tokens inside a model (the faithfulness tests' ``removal="drop"``): which sequence positions are
kept, and hooks that keep them in a module's output or in a relative position bias.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Undo = Callable[[], None]

__all__ = ["gather_bias", "gather_bias_hook", "gather_tokens", "keep_token_hook", "token_index"]


def token_index(num_prefix_tokens: int, keep: torch.Tensor) -> torch.Tensor:
    """``(B, prefix + k)`` sequence positions kept: every prefix token, then the patches ``keep`` ``(B, k)``."""
    prefix = torch.arange(num_prefix_tokens, device=keep.device).expand(keep.shape[0], -1)
    return torch.cat([prefix, keep.long() + num_prefix_tokens], dim=1)


def gather_tokens(seq: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``seq`` ``(B, N, D)`` -> ``(B, n, D)``: the tokens at ``index`` ``(B, n)``, in that order."""
    return seq.gather(1, index.to(seq.device)[..., None].expand(-1, -1, seq.shape[-1]))


def gather_bias(bias: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A relative position bias ``(..., H, N, N)`` (one for every image) -> ``(B, H, n, n)`` over the tokens kept.

    Row ``i`` and column ``j`` of the result are the bias between kept tokens ``index[b, i]`` and ``index[b, j]``:
    a kept token keeps its position, the bias it had in the full sequence.
    """
    n = bias.shape[-1]
    flat = bias.reshape(-1, n, n)  # (H, N, N)
    idx = index.to(bias.device)
    return flat[:, idx[:, :, None], idx[:, None, :]].permute(1, 0, 2, 3)  # (B, H, n, n)


def keep_token_hook(module: nn.Module, index: torch.Tensor) -> Undo:
    """Hook ``module`` so its output sequence ``(B, N, D)`` (or a tuple starting with it) keeps the tokens ``index``."""
    def hook(_m: nn.Module, _inputs: Any, out: Any) -> Any:
        if isinstance(out, tuple):
            return (gather_tokens(out[0], index), *out[1:])
        return gather_tokens(out, index)

    return module.register_forward_hook(hook).remove


def gather_bias_hook(module: nn.Module, index: torch.Tensor) -> Undo:
    """Hook a module that returns a relative position bias ``(..., H, N, N)`` to return it over the kept tokens."""
    return module.register_forward_hook(lambda _m, _i, out: gather_bias(out, index)).remove
