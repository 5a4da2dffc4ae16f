"""Checkpoint files: reading any weights file safely, training state, and the exported reference checkpoints.

A reference checkpoint is ``<name>.safetensors`` (fp16 weights, metadata ``vitviz.model = <name>``) plus
``<name>.json``, its card: the weights file's SHA-256 (checked when the model is loaded), architecture, recipe,
accuracy, position-embedding locality, FLOPs, wall time, hardware, seed, library versions and dataset.
"""

from __future__ import annotations

import os
import platform
import zipfile
from pathlib import Path
from typing import Any

import torch

from vitviz.errors import CheckpointError

CHECKPOINTS_ENV = "VITVIZ_CHECKPOINTS"
CARD_FORMAT = "vitviz-reference-card-v1"



def checkpoint_dir() -> Path:
    """Where the reference checkpoints live: ``$VITVIZ_CHECKPOINTS`` or the repository's ``vitviz/zoo/checkpoints``."""
    env = os.environ.get(CHECKPOINTS_ENV)
    return Path(env) if env else Path(__file__).resolve().parent / "checkpoints"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, as hex: what a reference card records of its weights (``sha256``)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_card_hash(path: str | os.PathLike, name: str) -> None:
    """Refuse the weights file ``path`` of reference model ``name`` when the card beside it (``<stem>.json``, a
    card of ``name``) records a ``sha256`` the file's bytes do not have.

    A file damaged inside its tensor data (a bad copy, a disk error) still parses, so without the hash its broken
    weights (NaN or garbage values) would load without a word. No card, another model's card, or a card without a
    hash: nothing to check.

    Raises:
        CheckpointError: the hash differs; the message names the file, both hashes and the fix.
    """
    import json

    path = Path(path)
    try:
        card = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT or card.get("name") != name:
        return
    want = card.get("sha256")
    if not want:
        return
    got = file_sha256(path)
    if got != want:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has SHA-256 {got}, its card {str(path.with_suffix('.json'))!r} records "
            f"{want}: the file is damaged or is not the one the card describes. Reinstall vitviz for its shipped "
            f"checkpoints, or export it again (`python -m vitviz.experiments.train {name} --resume --export DIR`)"
        )


DOWNLOAD_AGAIN = "download or export it again"


def _corrupt(path: Path, err: BaseException, fix: str = DOWNLOAD_AGAIN) -> CheckpointError:
    reason = (str(err).strip().splitlines() or [""])[0][:160]
    return CheckpointError(
        f"cannot read checkpoint {str(path)!r} ({type(err).__name__}: {reason}). The file is truncated, corrupt "
        f"or not a weights file: {fix}"
    )


def read_state_dict(path: str | os.PathLike, fix: str = DOWNLOAD_AGAIN) -> dict[str, torch.Tensor]:
    """Load a ``.safetensors`` or ``.pth``/``.pt``/``.bin`` state dict on the CPU (``weights_only`` pickles).

    Wrapper dicts (``state_dict``, ``model``, ``state_dict_ema``) and a ``module.`` prefix are unwrapped.
    Raises ``CheckpointError`` with the file name and ``fix`` (what to do about it) when the file cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd: Any = load_file(str(path), device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors, pickle and zip errors have no common base
        raise _corrupt(path, e, fix) from None
    if isinstance(sd, dict):
        for key in ("state_dict_ema", "state_dict", "model"):
            if isinstance(sd.get(key), dict):
                sd = sd[key]
                break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{str(path)!r} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:
        raise _corrupt(Path(path), e) from None


def check_npz(path: str | os.PathLike) -> None:
    """Refuse a corrupt ``.npz`` before timm's loader sees it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} not found")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except zipfile.BadZipFile as e:
        raise _corrupt(path, e) from None
    if bad is not None:
        raise _corrupt(path, zipfile.BadZipFile(f"member {bad} fails its CRC check"))


def load_training_state(path: str | os.PathLike) -> dict[str, Any]:
    """A ``last.pt`` written by ``vitviz.experiments.train``; ``CheckpointError`` when it is corrupt.

    It holds ``model``, ``optimizer``, ``epoch``, ``history``, ``train_time``, ``config`` and, since vitviz records
    what a run trains on, ``data_fingerprint`` (``{"train": ..., "test": ...}``, see
    ``vitviz.experiments.data.split_fingerprint``) and ``data_checked_from``; ``vitviz.experiments.config.
    check_training_state`` compares them with a run that resumes or exports it.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise _corrupt(path, e, "copy it again if it came from another machine, else delete it with the rest "
                                "of the run folder (metrics, kept epochs) to train the run again from its first epoch") from None
    if not isinstance(state, dict) or state.get("format") != "vitviz-train-state-v1":
        raise CheckpointError(f"{str(path)!r} is not a vitviz training state (last.pt)")
    return state


def versions() -> dict[str, str]:
    import timm

    import vitviz

    return {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "vitviz": vitviz.__version__}
