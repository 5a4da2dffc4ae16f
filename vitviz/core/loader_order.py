"""The order in which a loader reads a dataset.

``ShardSampler`` is the sampler ``reduce_dataset`` builds: each rank of ``torch.distributed`` reads its own shard,
in order, without padding. ``loader_positions`` gives the dataset position of every image a ``DataLoader`` yields,
for results kept per image (``vitviz.core.datasets.iter_dataset``) and for resuming a checkpoint.

A loader reads its dataset in its sampler's order; per-image results (ids, targets, labels, precomputed maps,
resuming) need the position of every image it yields. Only samplers whose order is known are accepted: a
``SequentialSampler`` (``shuffle=False``), a ``ShardSampler``, a ``DistributedSampler(shuffle=False)`` (positions are
the sampler's indices) and the placeholder of an ``IterableDataset`` (positions counted as the items come). A
shuffling, weighted or subset-sampling loader, or one with a custom batch sampler, is refused with an
``InputError``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from vitviz.errors import InputError

__all__ = ["ShardSampler", "loader_positions", "loader_sampler", "own_items"]


class ShardSampler(DistributedSampler):
    """Rank ``r`` of ``W`` reads items ``r, r + W, r + 2W, ...`` in order, starting after ``skip`` of its own.

    Unlike ``DistributedSampler`` it never pads (padding repeats images, which would then count twice in a mean)
    and never shuffles (a reduction does not care about order, and resuming needs a fixed one).
    """

    def __init__(self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None,
                 skip: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        self.skip = skip

    def _mine(self) -> range:
        return range(self.rank, len(self.dataset), self.num_replicas)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return iter(self._mine()[self.skip:])

    def __len__(self) -> int:
        return len(self._mine()[self.skip:])


def loader_sampler(loader: DataLoader) -> object:
    """The sampler that orders ``loader``'s dataset (its batch sampler's, when it has one)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return getattr(batch_sampler, "sampler", None) if batch_sampler is not None else loader.sampler


def own_items(sampler: object) -> int | None:
    """How many of a padding ``DistributedSampler``'s items are this rank's own images (``None``: no padding).

    ``DistributedSampler(drop_last=False)`` pads the dataset to a multiple of the ranks by repeating its first
    indices at the end, so the padding is the tail of each rank's list: rank ``r`` of ``W`` owns
    ``len(range(r, n, W))`` items, whatever the shuffling. Counting the repeats would weigh those images twice.
    """
    if not isinstance(sampler, DistributedSampler) or isinstance(sampler, ShardSampler) or sampler.drop_last:
        return None
    return len(range(sampler.rank, len(sampler.dataset), sampler.num_replicas))  # type: ignore[arg-type]


def loader_positions(loader: DataLoader, argument: str = "images") -> list[int | None] | None:
    """The dataset positions ``loader`` reads, in order (``None``: an iterable dataset, counted as it comes); the
    items a ``DistributedSampler`` pads its shard with (repeats of other ranks' images) are ``None``.

    Refuses a loader whose order vitviz cannot know (shuffling, weighted or subset sampling, a custom batch
    sampler): per-image results would be attached to the wrong images.
    """
    from torch.utils.data import SequentialSampler
    from torch.utils.data.dataloader import _InfiniteConstantSampler

    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = loader_sampler(loader)
    if isinstance(sampler, _InfiniteConstantSampler):  # an IterableDataset: its own order
        return None
    ordered = isinstance(sampler, (SequentialSampler, ShardSampler)) or (
        isinstance(sampler, DistributedSampler) and not sampler.shuffle)
    if batch_sampler is not None and type(batch_sampler) is not torch.utils.data.BatchSampler:
        ordered, sampler = False, batch_sampler
    if not ordered:
        raise InputError(f"{argument}= is a DataLoader with a {type(sampler).__name__}, which reads the images in an "
                         "order vitviz cannot know, so per-image results (ids, targets, labels, precomputed maps, "
                         "resuming) would go to the wrong images; pass the Dataset itself, or a DataLoader with "
                         "shuffle=False")
    order: list[int | None] = list(iter(sampler))
    own = own_items(sampler)
    return order if own is None else order[:own] + [None] * (len(order) - own)
