"""Image datasets for training and evaluation: ImageFolder trees decoded once into memory.

The dataset root is always a parameter; when it is omitted, the ``VITVIZ_DATA`` environment variable names it.
A root holds ``train/<class>/*`` and ``test/<class>/*`` (torchvision's ``ImageFolder`` layout), or is a JPEG pack
(``pack_image_folder``): one ``.npz`` with each split's encoded files in ImageFolder order, the bytes every file of
a split starts with stored once (CIFAR-10's 60,000 JPEGs share a 623-byte header: 55 MB of files pack into about
16 MB), so a dataset can travel to another machine and decode there to exactly the same pixels.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.datasets import ImageFolder

from vitviz.core.digest import file_key, tensor_digest
from vitviz.core.io import atomic_save, atomic_write
from vitviz.errors import DataNotFoundError, InputError
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


def split_fingerprint(data: TensorDataset) -> dict[str, Any]:
    """What a run trains or tests on, by value: the digests (``vitviz.core.digest.tensor_digest``: dtype, shape and
    every byte) of the decoded uint8 images ``(M, 3, H, W)`` and of the labels ``(M,)``, the class names and ``M``.

    Neither the folder's path nor its files' times count: the same images moved to another machine, or packed
    (``pack_image_folder``), give the same fingerprint; one pixel, one label or one class name changed gives another.
    0.14 s for CIFAR-10's 50,000 training images (154 MB) on one core; decoding them takes 15 s.
    """
    return {"images": tensor_digest(data.images), "labels": tensor_digest(data.labels),
            "classes": list(data.classes), "count": len(data.labels)}


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    """One short hex digest of a ``split_fingerprint`` (for a table cell)."""
    import json

    return hashlib.sha1(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def balanced_indices(labels: torch.Tensor, n: int) -> torch.Tensor:
    """The first images of each class (deterministic), ``n`` in all, sorted: ``n // C`` of every class and one more
    of each of the first ``n % C`` classes, so that no two classes differ by more than one image (fewer where a
    class has fewer)."""
    classes = int(labels.max()) + 1 if len(labels) else 0
    base, extra = divmod(n, max(classes, 1))
    picks = [torch.nonzero(labels == c).flatten()[:base + (c < extra)] for c in range(classes)]
    return torch.sort(torch.cat(picks))[0] if picks else torch.zeros(0, dtype=torch.long)


def _decode(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.array(im.convert("RGB"))


def _read_cache(cache: Path | None) -> dict[str, torch.Tensor] | None:
    """The decoded images and labels a cache file holds, or ``None`` when there is none. A file that cannot be read
    (cut off by a copy or a disk error; vitviz writes it atomically) is only a cache: ``None`` with a warning naming
    it, and the caller decodes the images again and rewrites it."""
    if cache is None or not cache.exists():
        return None
    try:
        blob = torch.load(cache, map_location="cpu", weights_only=True)
        if isinstance(blob, dict) and all(isinstance(blob.get(k), torch.Tensor) for k in ("images", "labels")):
            return blob
        reason = "it holds no images and labels"
    except Exception as exc:  # noqa: BLE001 (torch's zip, pickle and I/O errors have no common base)
        reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:120]}"
    warnings.warn(f"the decoded-image cache {str(cache)!r} cannot be read ({reason}); the images are decoded again "
                  "and the cache rewritten", stacklevel=3)
    return None


def load_image_folder(folder: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> TensorDataset:
    """Decode every image of an ImageFolder tree into one uint8 tensor (all images must share one size).

    With ``cache_dir``, the decoded tensor is stored there (keyed by the files' paths inside ``folder``, sizes and
    modification times) and reused next time.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataNotFoundError(f"image folder {str(folder)!r} not found (expected <root>/<split>/<class>/*.jpg)")
    index = ImageFolder(str(folder))
    if not index.samples:
        raise DataNotFoundError(f"image folder {str(folder)!r} holds no images")
    # keyed by each file's path inside the folder, size and modification time: an image replaced under its name is
    # decoded again, the same folder moved elsewhere (its files' times kept) is not
    key = hashlib.sha1("\n".join(f"{Path(p).relative_to(folder).as_posix()}:{file_key(p)}"
                                 for p, _ in index.samples).encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"{folder.name}-{key}.pt" if cache_dir is not None else None
    blob = _read_cache(cache)
    if blob is not None:
        return TensorDataset(blob["images"], blob["labels"], list(index.classes))
    images = [torch.from_numpy(_decode(p)).permute(2, 0, 1) for p, _ in index.samples]
    sizes = {tuple(im.shape) for im in images}
    if len(sizes) != 1:
        raise InputError(f"images in {str(folder)!r} differ in size ({sorted(sizes)[:3]}...); resize them first")
    data = TensorDataset(torch.stack(images), torch.tensor([t for _, t in index.samples]), list(index.classes))
    if cache is not None:
        atomic_save({"images": data.images, "labels": data.labels}, cache)
    return data


PACK_FORMAT = "vitviz-jpeg-pack-v1"


def pack_image_folder(root: str | os.PathLike, path: str | os.PathLike,
                      splits: tuple[str, ...] = ("train", "test")) -> Path:
    """Write the encoded files of ``root/<split>`` ImageFolder trees into one ``.npz`` (see the module docstring).

    Args:
        root: dataset root with one ImageFolder tree per split.
        path: the ``.npz`` to write (atomically).
        splits: the split folders to pack.

    Returns:
        ``path``. Per split the file holds ``<split>_prefix`` (uint8, the shared leading bytes),
        ``<split>_data`` (uint8, every file without it, concatenated), ``<split>_offsets`` (int64, ``(M + 1,)``),
        ``<split>_labels`` (int64, ``(M,)``) and ``<split>_classes``.
    """
    root, path = Path(root), Path(path)
    if path.suffix != ".npz":
        raise InputError(f"pack path {str(path)!r} must end in .npz")
    arrays: dict[str, np.ndarray] = {"format": np.array(PACK_FORMAT)}
    for split in splits:
        index = ImageFolder(str(root / split))
        blobs = [Path(p).read_bytes() for p, _ in index.samples]
        prefix = os.path.commonprefix(blobs)
        rest = [b[len(prefix):] for b in blobs]
        arrays[f"{split}_prefix"] = np.frombuffer(prefix, dtype=np.uint8)
        arrays[f"{split}_data"] = np.frombuffer(b"".join(rest), dtype=np.uint8)
        arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum([len(r) for r in rest])]).astype(np.int64)
        arrays[f"{split}_labels"] = np.array([t for _, t in index.samples], dtype=np.int64)
        arrays[f"{split}_classes"] = np.array(index.classes)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    return atomic_write(path, write)


def load_pack(path: str | os.PathLike, split: str, cache_dir: str | os.PathLike | None = None) -> TensorDataset:
    """Decode one split of a JPEG pack (``pack_image_folder``) into memory, cached like ``load_image_folder``."""
    import io
    import zipfile

    path = Path(path)
    try:
        with np.load(path) as pack:
            if str(pack.get("format", "")) != PACK_FORMAT or f"{split}_data" not in pack:
                raise InputError(f"{str(path)!r} is not a {PACK_FORMAT} pack with a {split!r} split; "
                                 "write one with vitviz.experiments.data.pack_image_folder(root, path)")
            prefix = pack[f"{split}_prefix"].tobytes()
            data, offsets = pack[f"{split}_data"], pack[f"{split}_offsets"]
            labels, classes = torch.from_numpy(pack[f"{split}_labels"]), [str(c) for c in pack[f"{split}_classes"]]
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError) as err:  # cut short or damaged (a copy stopped)
        if isinstance(err, InputError):
            raise
        raise InputError(f"{str(path)!r} cannot be read as a {PACK_FORMAT} pack ({type(err).__name__}: {err}): the "
                         "file is damaged or cut short (an interrupted copy). Write it again with "
                         "vitviz.experiments.data.pack_image_folder(root, path), or copy it again") from err
    # keyed by every byte of the split (and its labels and classes), never a sample of them: an edit anywhere decodes
    # again (CIFAR-10's training split is 15 MB packed: 15 ms to hash)
    head = np.frombuffer(bytearray(prefix), np.uint8)
    parts = (tensor_digest(torch.from_numpy(a)) for a in (head, offsets, data, labels.numpy()))
    key = hashlib.sha1(f"{'|'.join(parts)}|{classes}".encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"pack-{split}-{key}.pt" if cache_dir is not None else None
    blob = _read_cache(cache)
    if blob is not None:
        return TensorDataset(blob["images"], blob["labels"], classes)
    images = []
    for i in range(len(labels)):
        with Image.open(io.BytesIO(prefix + data[offsets[i] : offsets[i + 1]].tobytes())) as im:
            images.append(torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1))
    out = TensorDataset(torch.stack(images), labels, classes)
    if cache is not None:
        atomic_save({"images": out.images, "labels": out.labels}, cache)
    return out


def load_split(cfg: Any, split: str, subset: int | None) -> TensorDataset:
    """The ``split`` folder (``train``/``test``) of ``cfg.data`` (a root or a JPEG pack), decoded once into
    ``cfg.cache`` (or ``<cfg.out>/.cache``); a class-balanced subset of ``subset`` images when given."""
    root = resolve_data_root(cfg.data)
    cache_dir = Path(cfg.cache or Path(cfg.out) / ".cache")
    if root.is_file():
        data = load_pack(root, split, cache_dir=cache_dir)
    else:
        data = load_image_folder(root / split, cache_dir=cache_dir)
    return data.subset(balanced_indices(data.labels, subset)) if subset else data


def run_fingerprint(cfg: Any) -> dict[str, dict[str, Any]]:
    """``{"train": ..., "test": ...}``: the ``split_fingerprint`` of what the run ``cfg`` trains on (its training
    subset) and tests on (its test subset), as ``vitviz.experiments.train`` stores it in ``last.pt``."""
    return {"train": split_fingerprint(load_split(cfg, "train", cfg.train_subset)),
            "test": split_fingerprint(load_split(cfg, "test", cfg.test_subset))}
