"""Fingerprints of what a result depends on: a model's weights and an image source's contents.

A resumable run (``reduce_dataset(checkpoint=...)``, ``extract_features``' cache, ``faithfulness(out=...)``) may
only continue from a file written by the same run. The class name and the number of images do not identify a
run: a fine-tuned copy of a model, or another test set of the same size, would be merged in silently. These digests
do: ``model_digest`` hashes every parameter and buffer (names, dtypes, shapes and bytes), ``source_digest`` hashes
what a source yields without loading an image where the source says what it holds (a folder's files with their
sizes and modification times, a ``TensorDataset``'s tensors, a torchvision dataset's arrays, a ``Subset``'s
indices, a ``DataLoader``'s dataset and sampler). A ``Dataset`` of another kind is identified by its class, its
length and its ``transform``, and the docstrings of the resumable functions say so.

Hashing is SHA-1 over the raw bytes (tensors are copied to the CPU one at a time): about a second for ViT-B/16's
86 M parameters on one core, once per call.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["image_digest", "model_digest", "source_digest", "tensor_digest"]


def _feed_tensor(h: Any, t: torch.Tensor) -> None:
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.device.type == "meta" or t.numel() == 0:
        return
    flat = t.detach().reshape(-1).contiguous().cpu()
    h.update(flat.view(torch.uint8).numpy().tobytes() if flat.dtype != torch.uint8 else flat.numpy().tobytes())


def tensor_digest(t: Any) -> str:
    """A hex digest of a tensor's (or array's, or number's) dtype, shape and values."""
    h = hashlib.sha1()
    _feed_tensor(h, torch.as_tensor(t))
    return h.hexdigest()[:16]


def _file_key(path: Path) -> str:
    """What identifies a file's contents without reading them: its size and modification time."""
    st = path.stat() if path.is_file() else None
    return f"{st.st_size if st else -1}:{st.st_mtime_ns if st else -1}"


def image_digest(item: Any) -> str | None:
    """One image's digest: a tensor's or array's values, a PIL image's mode, size and pixels, a file's resolved
    path, size and modification time; ``None`` for anything else."""
    if isinstance(item, np.ndarray):
        item = torch.from_numpy(np.ascontiguousarray(item))
    if isinstance(item, torch.Tensor):
        return tensor_digest(item)
    if isinstance(item, (str, os.PathLike)):
        path = Path(item)
        return hashlib.sha1(f"path:{path.resolve()}:{_file_key(path)}".encode()).hexdigest()[:16]
    if hasattr(item, "mode") and hasattr(item, "size") and hasattr(item, "tobytes"):  # a PIL image
        return hashlib.sha1(f"{item.mode}{item.size}".encode() + item.tobytes()).hexdigest()[:16]
    return None


def model_digest(model: nn.Module) -> str:
    """A hex digest of ``model``'s class, parameter and buffer names, dtypes, shapes and values.

    Two models get the same digest exactly when they hold the same tensors under the same names (a copy does;
    a fine-tuned, re-initialised or cast copy does not).
    """
    h = hashlib.sha1(type(model).__qualname__.encode())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(name.encode())
        _feed_tensor(h, t)
    return h.hexdigest()[:16]


def _feed_source(h: Any, src: Any, depth: int = 0) -> None:
    from torch.utils.data import DataLoader, Subset, TensorDataset

    if depth > 8:  # a wrapper of a wrapper of ...: its class is all we say
        h.update(type(src).__qualname__.encode())
        return
    if isinstance(src, (str, os.PathLike)):
        root = Path(src)
        h.update(f"folder:{root.resolve()}".encode())
        for p in sorted(q for q in root.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(root)}:{_file_key(p)}".encode())
        return
    h.update(type(src).__qualname__.encode())
    if isinstance(src, DataLoader):
        from vitviz.core.loader_order import loader_sampler

        sampler = loader_sampler(src)
        h.update(f"sampler:{type(sampler).__qualname__}".encode())
        _feed_source(h, src.dataset, depth + 1)
        return
    if isinstance(src, Subset):
        h.update(np.asarray(list(src.indices), dtype=np.int64).tobytes())
        _feed_source(h, src.dataset, depth + 1)
        return
    if isinstance(src, TensorDataset):
        for t in src.tensors:
            _feed_tensor(h, t)
        return
    files = getattr(src, "files", None) or getattr(src, "samples", None)
    root = getattr(src, "root", None)
    if isinstance(files, (list, tuple)) and files:  # vitviz's and torchvision's image folders
        for item in files:
            p = Path(item[0] if isinstance(item, (tuple, list)) else item)
            h.update(f"{p}:{_file_key(p)}:{item}".encode())
    elif root is not None:
        h.update(f"root:{root}".encode())
    for attr in ("data", "targets", "labels"):  # torchvision's in-memory datasets (CIFAR, MNIST)
        value = getattr(src, attr, None)
        if isinstance(value, torch.Tensor):
            _feed_tensor(h, value)
        elif isinstance(value, np.ndarray):
            h.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], (int, np.integer)):
            h.update(np.asarray(value, dtype=np.int64).tobytes())
    try:
        h.update(f"len:{len(src)}".encode())
    except TypeError:
        h.update(b"len:?")
    transform = getattr(src, "transform", None)
    if transform is not None:
        h.update(repr(transform).encode())


def source_digest(source: Any) -> str:
    """A hex digest of an image source (folder, ``Dataset`` or ``DataLoader``): see the module docstring."""
    h = hashlib.sha1()
    _feed_source(h, source)
    return h.hexdigest()[:16]
