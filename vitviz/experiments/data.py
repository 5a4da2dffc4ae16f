"""Image datasets for training and evaluation: ImageFolder trees decoded once into memory.

The dataset root is always a parameter; when it is omitted, the ``VITVIZ_DATA`` environment variable names it.
A root holds ``train/<class>/*`` and ``test/<class>/*`` (torchvision's ``ImageFolder`` layout).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.datasets import ImageFolder

from vitviz.core.io import atomic_save
from vitviz.zoo.samples import DATA_ENV, resolve_data_root  # noqa: F401  (the dataset root rule lives with the samples)


@dataclass
class TensorDataset:
    """Decoded images ``(M, 3, H, W)`` uint8, labels ``(M,)`` int64 and the class names."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: torch.Tensor | list[int]) -> TensorDataset:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return TensorDataset(self.images[idx], self.labels[idx], self.classes)


def balanced_indices(labels: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``ceil(n / C)`` images of each class (deterministic), truncated to ``n``, sorted."""
    classes = int(labels.max()) + 1 if len(labels) else 0
    per_class = -(-n // max(classes, 1))
    picks = [torch.nonzero(labels == c).flatten()[:per_class] for c in range(classes)]
    return torch.sort(torch.cat(picks))[0][:n] if picks else torch.zeros(0, dtype=torch.long)


def _decode(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.array(im.convert("RGB"))


def load_image_folder(folder: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> TensorDataset:
    """Decode every image of an ImageFolder tree into one uint8 tensor (all images must share one size).

    With ``cache_dir``, the decoded tensor is stored there (keyed by the file list) and reused next time.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {str(folder)!r} not found (expected <root>/<split>/<class>/*.jpg)")
    index = ImageFolder(str(folder))
    if not index.samples:
        raise FileNotFoundError(f"image folder {str(folder)!r} holds no images")
    key = hashlib.sha1("\n".join(p for p, _ in index.samples).encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"{folder.name}-{key}.pt" if cache_dir is not None else None
    if cache is not None and cache.exists():
        blob = torch.load(cache, weights_only=True)
        return TensorDataset(blob["images"], blob["labels"], list(index.classes))
    images = [torch.from_numpy(_decode(p)).permute(2, 0, 1) for p, _ in index.samples]
    sizes = {tuple(im.shape) for im in images}
    if len(sizes) != 1:
        raise ValueError(f"images in {str(folder)!r} differ in size ({sorted(sizes)[:3]}...); resize them first")
    data = TensorDataset(torch.stack(images), torch.tensor([t for _, t in index.samples]), list(index.classes))
    if cache is not None:
        atomic_save({"images": data.images, "labels": data.labels}, cache)
    return data


def load_split(cfg: Any, split: str, subset: int | None) -> TensorDataset:
    """The ``split`` folder (``train``/``test``) of ``cfg.data``, decoded once into ``cfg.cache`` (or
    ``<cfg.out>/.cache``); a class-balanced subset of ``subset`` images when given."""
    root = resolve_data_root(cfg.data)
    data = load_image_folder(root / split, cache_dir=Path(cfg.cache or Path(cfg.out) / ".cache"))
    return data.subset(balanced_indices(data.labels, subset)) if subset else data
