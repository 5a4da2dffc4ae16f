"""Atomic writes (``vitviz.core.io``): no partial file ever shows, and a write killed mid-way leaves no litter
beyond the next write of the same target."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vitviz.core import io

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


def temporaries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".tmp"))


def age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def killed_writer(target: Path) -> None:
    """A process that starts ``atomic_write(target)`` and is SIGKILLed in the middle of writing."""
    marker = target.with_name("started")
    code = textwrap.dedent(f"""
        import time
        from vitviz.core.io import atomic_write

        def write(tmp):
            with open(tmp, "wb") as f:
                f.write(b"partial" * 1000)
                f.flush()
                open({str(marker)!r}, "w").close()
                time.sleep(120)

        atomic_write({str(target)!r}, write)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the writer exited before it began to write"
            assert time.monotonic() < deadline, "the writer did not begin to write"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    marker.unlink()


def test_a_killed_writes_temporary_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "last.pt"
    killed_writer(target)
    (left,) = temporaries(tmp_path)  # what a SIGKILL leaves: nothing at the target, one temporary beside it
    assert not target.exists() and left.name.startswith(".last.pt.")
    io.atomic_write_text(target, "first")
    assert temporaries(tmp_path) == [left]  # changed moments ago: kept (its process may be a slow writer elsewhere)
    age(left, io.STALE_AFTER_S + 1)
    io.atomic_write_text(target, "second")
    assert temporaries(tmp_path) == [] and target.read_text() == "second"


def test_only_this_hosts_dead_writers_old_temporaries_are_removed(tmp_path):
    target = tmp_path / "run [1].pt"  # glob characters in the name are matched literally
    host, me = io._host(), os.getpid()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        names = {
            "dead": f".{target.name}.{host}.{dead.pid}.abc123.tmp",
            "alive": f".{target.name}.{host}.{alive.pid}.abc123.tmp",
            "mine": f".{target.name}.{host}.{me}.abc123.tmp",
            "other host": f".{target.name}.elsewhere-{host}.{dead.pid}.abc123.tmp",
            "other target": f".other.pt.{host}.{dead.pid}.abc123.tmp",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"x")
            age(tmp_path / name, io.STALE_AFTER_S + 1)
        removed = io.remove_stale_temporaries(target)
        assert [p.name for p in removed] == [names["dead"]]
        kept = {p.name for p in temporaries(tmp_path)}
        assert kept == {v for k, v in names.items() if k != "dead"}
    finally:
        alive.kill()
        alive.wait()


def test_a_failed_write_leaves_nothing_and_the_old_file_intact(tmp_path):
    target = tmp_path / "rows.json"
    io.atomic_write_json(target, {"a": 1})

    def fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        io.atomic_write(target, fail)
    assert temporaries(tmp_path) == [] and target.read_text() == '{\n  "a": 1\n}\n'


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads a descriptor's path from /proc")
def test_the_data_reach_the_disk_before_the_rename_and_the_rename_after_it(tmp_path, monkeypatch):
    """``fsync`` of the temporary file, holding every byte, then the rename, then ``fsync`` of the folder: without
    them a machine's crash can leave the target's name on an empty or partial file."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        where = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", where, Path(where).read_bytes() if Path(where).is_file() else None))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "out" / "rows.json"
    io.atomic_write_json(target, {"a": 1})
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    (_, synced, data), (_, src, dst), (_, folder, _) = events
    assert synced == src != dst == str(target) and data == target.read_bytes() == b'{\n  "a": 1\n}\n'
    assert folder == str(target.parent)


def test_a_file_system_that_cannot_fsync_still_gets_the_file_and_an_io_error_is_raised(tmp_path, monkeypatch):
    """Some network and FUSE mounts refuse ``fsync`` (``EINVAL``): the write is still made and reported as made (a
    long run would otherwise stop at a checkpoint it had written). An I/O error (the data did not reach the disk)
    is raised, the target left as it was."""
    import errno

    real = os.fsync

    def refuse(code):
        def fsync(fd):
            raise OSError(code, os.strerror(code))
        return fsync

    target = tmp_path / "rows.json"
    monkeypatch.setattr(os, "fsync", refuse(errno.EINVAL))
    io.atomic_write_json(target, {"a": 1})
    assert target.read_text() == '{\n  "a": 1\n}\n'
    monkeypatch.setattr(os, "fsync", refuse(errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        io.atomic_write_json(target, {"a": 2})
    assert target.read_text() == '{\n  "a": 1\n}\n' and temporaries(tmp_path) == []
    monkeypatch.setattr(os, "fsync", real)


def test_save_arrays_writes_names_as_strings_np_load_reads(tmp_path):
    """A pandas column of names is an object array: written as it was, the .npz held a pickle np.load refuses."""
    import numpy as np
    import pandas as pd

    from vitviz.core.io import save_arrays
    from vitviz.errors import InputError

    path = save_arrays(tmp_path / "points", family=pd.Series(["ViT", "Hybrid"]), acc=np.array([1.0, 2.0]))
    with np.load(path) as z:
        assert list(z["family"]) == ["ViT", "Hybrid"] and list(z["acc"]) == [1.0, 2.0]
    with pytest.raises(InputError, match="mixed= holds Python objects"):
        save_arrays(tmp_path / "bad", mixed=np.array([{"a": 1}, None], dtype=object))
