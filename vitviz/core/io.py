"""Atomic file writes: write to a temporary file in the same folder, then rename over the target."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vitviz.errors import InputError


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` and move the result to ``path`` in one rename; no partial file ever shows."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` atomically."""
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_arrays(path_stem: str | os.PathLike, **arrays: Any) -> Path:
    """Write the numbers behind a figure to ``<path_stem>.npz`` atomically (tensors are moved to numpy).

    Args:
        path_stem: path without extension, e.g. ``"reports/arrays/pos_embed"`` (a ``.npz`` suffix is kept).
        arrays: name -> array, tensor or number.

    Returns:
        the path written.
    """
    import numpy as np

    if not arrays:
        raise InputError("save_arrays needs at least one array, e.g. save_arrays(stem, similarity=sim)")
    values = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in arrays.items()}
    path = Path(path_stem)
    path = path if path.suffix == ".npz" else path.parent / f"{path.name}.npz"

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **values)

    return atomic_write(path, write)


def read_csv_exact(path: str | os.PathLike, **kwargs: Any) -> Any:
    """``pandas.read_csv`` with every float read back to the bit it was written from.

    pandas before 3.1 parses floats with a fast C routine that is not correctly rounded (a 17-digit score can come
    back one ulp off), unless ``float_precision="round_trip"``; pandas 3.1 rounds correctly by default and
    deprecates the argument.
    """
    import re

    import pandas as pd

    found = re.match(r"(\d+)\.(\d+)", pd.__version__)
    if found is None or (int(found[1]), int(found[2])) < (3, 1):
        kwargs.setdefault("float_precision", "round_trip")
    return pd.read_csv(path, **kwargs)
