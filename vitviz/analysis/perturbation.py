"""Removing patches from a ViT's input, and the order in which a relevance map removes them.

Two removals (``vitviz.faithfulness``'s ``removal`` column):

- ``"drop"``: the removed patch tokens are taken out of the sequence right after the position embedding, so the
  model sees fewer tokens and no invented pixels. Where and how is the model family's business
  (``Family.token_drop_module`` / ``Family.drop_tokens`` in ``vitviz.core.families``): timm ``pos_drop``,
  torchvision ``encoder.dropout``, the Hugging Face embeddings' ``dropout`` (ViT, DeiT, BEiT, DINOv2, CLIP), open_clip ``patch_dropout``; BEiT's
  relative position biases are gathered over the kept tokens. A family drops tokens only where the output stays
  defined with every patch removed (a class token or registers and a readout from them), so one architecture gets
  the same removal whichever library it comes from.
- ``"mean"``: the pixels of the removed patches are set to ``fill`` (default 0 in the model's normalised space,
  i.e. its training-set mean).

Ties: a map orders the patches by relevance, most relevant first. Patches of equal relevance (a saturated map,
a constant one) are put in a random order drawn from ``(seed, image id)``, never in raster order, so an image gets
the same order whatever the batching and whichever run it is part of.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from vitviz.core.datasets import autocast_context
from vitviz.core.families import family_of
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.targets import Target, logits_of
from vitviz.errors import InputError

__all__ = ["REMOVALS", "Perturbed", "drop_module", "fill_patches", "image_seed", "keep_tokens", "rank_patches",
           "ranks_on_host", "resolve_removal"]

REMOVALS = ("auto", "drop", "mean")


def drop_module(model: nn.Module, spec: ViTSpec | None = None) -> nn.Module | None:
    """The module after which ``model``'s patch tokens are dropped (``Family.token_drop_module``), or ``None``."""
    return family_of(model).token_drop_module(model)


def resolve_removal(model: nn.Module, removal: str) -> str:
    """``"drop"`` or ``"mean"`` for ``removal`` in ``REMOVALS`` (``"auto"``: drop where the family can)."""
    if removal not in REMOVALS:
        raise InputError(f"removal={removal!r} must be 'auto', 'drop' or 'mean'")
    family = family_of(model)
    module = family.token_drop_module(model)
    if removal == "drop" and module is None:
        raise InputError(f"removal='drop': {family.token_drop_refusal(model)}, so vitviz cannot drop its patch "
                         "tokens; use removal='mean'")
    return "drop" if removal in ("auto", "drop") and module is not None else "mean"


@contextmanager
def keep_tokens(model: nn.Module, keep: torch.Tensor, spec: ViTSpec | None = None) -> Iterator[None]:
    """Inside the block, ``model`` sees its prefix tokens and only the patches ``keep`` ``(B, k)`` (sequence order).

    The family installs the drop (``Family.drop_tokens``) and removes it on exit, also when the body raises.
    """
    spec = spec or inspect(model)
    undo = family_of(model).drop_tokens(model, keep, spec.num_prefix_tokens)
    try:
        yield
    finally:
        undo()


def fill_patches(x: torch.Tensor, removed: torch.Tensor, grid: tuple[int, int], stride: tuple[int, int],
                 fill: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, C, H, W)`` with the pixels of the ``removed`` ``(B, P)`` bool patches set to ``fill`` ``(C,)``."""
    gh, gw = grid
    mask = removed.reshape(-1, 1, gh, gw).repeat_interleave(stride[0], 2).repeat_interleave(stride[1], 3)
    full = torch.zeros(x.shape[0], 1, *x.shape[-2:], dtype=torch.bool, device=x.device)
    full[..., :mask.shape[-2], :mask.shape[-1]] = mask
    return torch.where(full, fill.to(x)[None, :, None, None], x)


def image_seed(seed: int, image: Hashable) -> int:
    """The generator seed of one image: from ``seed`` and the image's id (an int, or a string hashed by CRC-32)."""
    key = operator.index(image) if hasattr(image, "__index__") else zlib.crc32(str(image).encode())
    return (int(seed) * 1_000_003 + key) % (2 ** 63)


def rank_patches(maps: torch.Tensor, images: Sequence[Hashable], seed: int = 0) -> torch.Tensor:
    """Each patch's rank by relevance, 0 the most relevant; ties in a random order drawn per image.

    Args:
        maps: ``(B, gh, gw)`` (or ``(B, P)``) relevance.
        images: the ``B`` image ids (the tie order of an image depends on ``seed`` and its id only).
        seed: the seed of the tie orders.

    Returns:
        ``(B, P)`` long ranks on ``maps``' device: patches are sorted by relevance (compared in float64, so distinct
        values of any dtype stay distinct), descending; among equal values by a random permutation of the image's
        patches.

    Raises:
        InputError: a map holds NaN or infinite values, or ``images`` holds another number of ids than ``maps``
            maps.
    """
    ranks, finite = _ranks(maps, images, seed)
    if not bool(finite):
        raise _not_finite()
    return ranks


def ranks_on_host(maps: torch.Tensor, images: Sequence[Hashable], seed: int = 0) -> torch.Tensor:
    """``rank_patches``' ranks on the CPU, where the removed sets are made (``vitviz.faithfulness``), with one read
    of the device: the ranks and the maps' finiteness copied together (two reads, each waiting for the device, if
    the check were made first)."""
    ranks, finite = _ranks(maps, images, seed)
    b, p = ranks.shape
    host = torch.cat([ranks.flatten(), finite.reshape(1).to(ranks.dtype)]).cpu()
    if not host[-1]:
        raise _not_finite()
    return host[:-1].reshape(b, p)


def _not_finite() -> InputError:
    return InputError("the relevance maps hold NaN or infinite values; a map must be finite to order patches")


def _ranks(maps: torch.Tensor, images: Sequence[Hashable], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rank_patches``' ranks and whether every map is finite (a 0-dim bool), both on ``maps``' device, queued
    without reading a value: the tie orders are drawn on the host first and sent without waiting."""
    flat = maps.detach().flatten(1)
    b, p = flat.shape
    if len(images) != b:
        raise InputError(f"rank_patches got {len(images)} image ids for {b} maps")
    perm = torch.stack([torch.randperm(p, generator=torch.Generator().manual_seed(image_seed(seed, i)))
                        for i in images]).to(flat.device, non_blocking=True)
    # ranked in float64 (float32 on MPS, which has none): a float32 cast would turn values closer than its
    # resolution (float64 maps, 1e-12 apart) into ties and shuffle them
    flat = flat.float() if flat.device.type == "mps" else flat.double()
    finite = torch.isfinite(flat).all()
    within = flat.gather(1, perm).argsort(dim=1, descending=True, stable=True)  # stable: ties keep perm's order
    order = perm.gather(1, within)
    return torch.empty_like(order).scatter_(1, order, torch.arange(p, device=order.device).expand(b, -1)), finite


def score_output(out: Any, target: Target, classes: torch.Tensor | None, model: nn.Module,
                 truth: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per metric, one score per image of the model output ``out`` (see ``vitviz.faithfulness``)."""
    if classes is None:
        return {"target": target(out).detach().float().reshape(-1)}  # type: ignore[misc,operator]
    logits = logits_of(out, model).float()
    return {"probability": logits.softmax(-1).gather(1, classes[:, None])[:, 0],
            "accuracy": (logits.argmax(-1) == (classes if truth is None else truth)).float()}


class Perturbed:
    """One batch ``x``: the scores of the model with any sets of patches removed (identical sets run once).

    ``scores`` takes every set of one batch at once and keeps the host ahead of the device: the sets are read on
    the host (CPU masks, so reading them waits for nothing), their kept indices or masks go to the device without
    waiting (``non_blocking``), the forward passes are queued back to back, and the scores stay on the device. The
    caller reads them once, when every set has run (``vitviz.faithfulness``: once per batch). Reading a set or a
    score between two passes would make a GPU idle while the host prepares the next pass.

    Args:
        model, spec: the ViT and ``vitviz.inspect(model)``.
        x: ``(b, 3, H, W)`` normalised batch on the model's device.
        how: ``"drop"`` or ``"mean"`` (``resolve_removal``).
        fill: ``(C,)`` pixel value of removed patches for ``"mean"``.
        target, classes, truth: what is scored (``score_output``).
        autocast: a ``torch.autocast`` dtype for the forward passes (CUDA), or ``None``.
    """

    def __init__(self, model: nn.Module, spec: ViTSpec, x: torch.Tensor, how: str, fill: torch.Tensor,
                 target: Target, classes: torch.Tensor | None, truth: torch.Tensor | None = None,
                 autocast: torch.dtype | None = None) -> None:
        self.model, self.spec, self.x, self.how = model, spec, x, how
        self.fill, self.target, self.classes, self.truth = fill, target, classes, truth
        self.autocast = autocast
        self.grid = spec.grid_for_input(x)
        self.num_patches = self.grid[0] * self.grid[1]
        self.cache: dict[bytes, dict[str, torch.Tensor]] = {}

    def _forward(self, x: torch.Tensor) -> Any:
        with autocast_context(self.autocast, x.device):
            return self.model(x)

    def _prepare(self, removed: torch.Tensor) -> torch.Tensor:
        """What the pass of one set needs on the device: the kept patches ``(b, k)`` (``"drop"``) or the removed
        mask ``(b, P)`` (``"mean"``), read from the CPU mask and sent without waiting."""
        if self.how == "drop":
            b = len(removed)
            keep = (~removed).nonzero()[:, 1].reshape(b, self.num_patches - int(removed[0].sum()))
            return keep.to(self.x.device, non_blocking=True)
        return removed.to(self.x.device, non_blocking=True)

    def scores(self, sets: Sequence[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """Per set, per metric, one score per image ``(b,)`` on the device, with the set's patches taken out.

        Args:
            sets: ``(b, P)`` bool masks of the removed patches, on the CPU; every image of a set loses as many
                patches (for ``"drop"``).
        """
        keys = []
        todo: dict[bytes, torch.Tensor] = {}
        for removed in sets:  # the host's part first: nothing here waits for the device
            if removed.device.type != "cpu" or removed.dtype != torch.bool or removed.shape != (len(self.x),
                                                                                                self.num_patches):
                raise InputError(f"Perturbed.scores: a removed set must be a ({len(self.x)}, {self.num_patches}) "
                                 f"bool mask on the CPU, got {tuple(removed.shape)} {removed.dtype} on "
                                 f"{removed.device}")
            counts = removed.sum(1)
            if self.how == "drop" and bool((counts != counts[0]).any()):  # else one image's kept patches go to the next
                raise InputError(f"Perturbed.scores: a removed set removes {', '.join(map(str, counts.tolist()))} "
                                 "patches of its images; 'drop' needs as many removed from every image of a set")
            key = removed.numpy().tobytes()
            keys.append(key)
            if key not in self.cache and key not in todo:
                todo[key] = self._prepare(removed)
        for key, arg in todo.items():  # then the passes, back to back
            if self.how == "drop":
                with keep_tokens(self.model, arg, self.spec):
                    out = self._forward(self.x)
            else:
                out = self._forward(fill_patches(self.x, arg, self.grid, self.spec.patch_size, self.fill))
            self.cache[key] = {k: v.detach() for k, v in
                               score_output(out, self.target, self.classes, self.model, self.truth).items()}
        return [self.cache[key] for key in keys]
