"""Atomic file writes: write to a temporary file in the same folder, then rename over the target.

The temporary file's data reach the disk (``fsync``) before the rename, and the rename itself (the folder,
``fsync``) after it: a rename can otherwise reach the disk before the data it names, so that a power loss or a
crash of the machine, not only of the process, leaves an empty or partial file under the target's name. (Where a
folder cannot be opened for ``fsync``, Windows, the rename is left to the file system.)

The temporary file is ``.<name>.<host>.<pid>.<random>.tmp`` beside the target. A process killed while it writes
(SIGKILL, the out-of-memory killer, a preempted job) cannot remove its own; the next write of the same target
removes it once that process is gone: a temporary file of this host whose process no longer exists and that has
not changed for ``STALE_AFTER_S`` seconds (a checkpoint of a run killed and resumed again and again would
otherwise leave one file of its size per kill).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vitviz.errors import InputError

STALE_AFTER_S = 600.0  # a temporary file untouched this long, of a process gone, is a killed write's


def _host() -> str:
    return socket.gethostname().replace(".", "-") or "host"


def _alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would end the process there: take every writer as alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but is another user's (PermissionError), or the question cannot be asked here
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that killed writes of ``path`` left beside it (see the module docstring).

    Only this host's files are considered (a process of another host sharing the folder cannot be asked whether
    it lives), never this process's own, and never one changed in the last ``STALE_AFTER_S`` seconds.

    Returns:
        the files removed.
    """
    path = Path(path)
    stem = f".{path.name}.{_host()}."
    removed = []
    for tmp in map(Path, glob.glob(os.path.join(glob.escape(str(path.parent)), glob.escape(stem) + "*.tmp"))):
        pid = tmp.name[len(stem):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):  # another writer of the same target may remove it first
            if time.time() - tmp.stat().st_mtime >= STALE_AFTER_S:
                tmp.unlink()
                removed.append(tmp)
    return removed


_NO_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES, errno.EPERM, errno.EISDIR}


def _fsync(path: str | os.PathLike, folder: bool = False) -> None:
    """``fsync`` a file's data, or a folder's entries, to the disk (see the module docstring). A file system that
    cannot (``EINVAL``, ``ENOTSUP``: some network and FUSE mounts; a folder it will not open) is left to its own
    ordering: the rename is done either way, and a write that succeeded must not be reported as failed (a long run
    would stop at its checkpoint). An I/O error (``EIO``: the data did not reach the disk) is raised."""
    if folder and os.name == "nt":  # a folder cannot be opened there
        return
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    except OSError as err:
        if err.errno in _NO_FSYNC:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _NO_FSYNC:
            raise
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` and move the result to ``path`` in one rename; no partial file ever shows, also
    after a crash of the machine (the data are on the disk before the rename, and the rename after it).

    Temporary files of earlier writes of ``path`` killed before they could clean up are removed first
    (``remove_stale_temporaries``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_host()}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file ordinary permissions
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync(path.parent, folder=True)
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

    Raises:
        InputError: no arrays, or an array of Python objects other than strings (``.npz`` could hold it only as a
            pickle, which ``np.load`` refuses by default). Strings held as objects (a pandas column of names) are
            written as unicode strings.
    """
    import numpy as np

    if not arrays:
        raise InputError("save_arrays needs at least one array, e.g. save_arrays(stem, similarity=sim)")
    values = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in arrays.items()}
    for k, v in values.items():
        if v.dtype == object:
            if not all(isinstance(item, str) for item in v.flat):
                kinds = sorted({type(item).__name__ for item in v.flat})
                raise InputError(f"save_arrays: {k}= holds Python objects ({', '.join(kinds)}), which a .npz file "
                                 "keeps only as a pickle that np.load refuses; pass numbers or strings (e.g. "
                                 f"{k}=column.astype(str))")
            values[k] = v.astype(str)
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
