"""Chunk an image set into model-ready batches (shared by the streaming reductions)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vitviz.core.images import Images, image_list, images_and_range, warn_unnormalised
from vitviz.core.util import is_int
from vitviz.errors import ImageInputError, InputError


def count_images(images: Images) -> int:
    """How many images ``images`` holds (``vitviz.core.images.image_list``: a 3-D tensor or a single non-list item
    counts as one, a ``(B, H, W, C)`` array as ``B``)."""
    return len(image_list(images))


def check_batch_size(batch_size: object) -> None:
    """Raise ``InputError`` unless ``batch_size`` is ``None`` or a positive integer (``int`` or a NumPy integer;
    not a bool or a float)."""
    if batch_size is None:
        return
    if not is_int(batch_size) or batch_size < 1:
        raise InputError(
            f"batch_size={batch_size!r} is not a positive number of images; pass an integer such as 32, or None "
            "for one batch of all images"
        )


def check_num_workers(num_workers: object) -> None:
    """Raise ``InputError`` unless ``num_workers`` is a non-negative integer (``int`` or a NumPy integer)."""
    if not is_int(num_workers) or num_workers < 0:
        raise InputError(
            f"num_workers={num_workers!r} is not a number of loader worker processes; pass a non-negative integer "
            "(0 reads the images in this process)"
        )


def iter_batches(
    model: nn.Module,
    images: Images,
    batch_size: int | None = None,
    *,
    progress: bool = False,
    desc: str = "images",
) -> Iterator[torch.Tensor]:
    """Yield normalised ``(b, 3, H, W)`` batches of at most ``batch_size`` images on the model's device.

    Raw images (paths, PIL, arrays) are decoded chunk by chunk, so a large set is never held at once.

    Args:
        model: the ViT (preprocessing and device come from it, through ``vitviz.load_images``).
        images: anything ``vitviz.load_images`` takes.
        batch_size: images per batch; ``None``: all at once.
        progress: show a tqdm progress bar (over images).
        desc: the progress bar's label.
    """
    check_batch_size(batch_size)
    if isinstance(images, (Dataset, DataLoader)):
        raise ImageInputError(
            f"images: a {type(images).__name__} is a dataset; this analysis takes a batch (a (B, 3, H, W) tensor, "
            "PIL images, arrays or image paths): load the images it should read as one (vitviz.load_images(model, "
            "paths), or torch.stack of the dataset's images). mean_attention_distance, attention_statistics, "
            "faithfulness and the probes take a folder, Dataset or DataLoader"
        )
    items = image_list(images)
    total = len(items)
    if total == 0:
        raise ImageInputError("images: 0 images given; pass at least one image")
    step = total if batch_size is None else int(batch_size)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=desc, unit="img")
    warned = False
    try:
        for start in range(0, total, step):
            # all at once: the tensor itself, not a view of it (contexts.input_checked knows a tensor by identity)
            chunk = items if step >= total else items[start:start + step]
            x, found = images_and_range(model, chunk)
            if not warned:  # ToTensor() pixels (load_images's warning): once per call, not per chunk
                warned = warn_unnormalised(model, found, stacklevel=4)
            yield x
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
