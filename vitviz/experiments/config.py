"""What determines a training run, and the command lines of ``train`` and ``study``, without importing torch.

``vitviz train --help`` and ``vitviz study --help`` read these parsers, so they answer at once; the commands
import torch only when they run.
"""

from __future__ import annotations

import argparse
import numbers
import os
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from vitviz.core.recipe import RUNTIME_KEYS
from vitviz.errors import InputError, OptionValueError


@dataclass
class TrainConfig:
    """Everything that determines a run. Two runs with equal configs produce equal weights (same machine)."""

    model: str
    data: str | None = None
    out: str = "runs"
    epochs: int = 40
    batch_size: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_epochs: float = 3.0
    label_smoothing: float = 0.1
    augment: str = "crop-flip"  # "crop-flip", "trivialaugment" or "randaugment" (the latter two add to crop-flip)
    seed: int = 0
    train_subset: int | None = None  # N class-balanced images, for tests and smoke runs
    test_subset: int | None = None
    device: str = "auto"
    threads: int | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    cache: str | None = None  # decoded-dataset cache folder (default: <out>/.cache)
    compile: bool = True  # torch.compile on CUDA (no effect on CPU); does not change what is computed

    @property
    def run_dir(self) -> Path:
        return Path(self.out) / self.model


def check_training_state(state: dict[str, Any], cfg: TrainConfig, fingerprint: dict[str, Any],
                         path: str | os.PathLike) -> int:
    """Refuse to continue (or export) the training state ``state`` (read from ``path``) as the run ``cfg`` on the data
    ``fingerprint`` (``{"train": ..., "test": ...}``, ``vitviz.experiments.data.split_fingerprint``) when it was
    trained otherwise.

    Every ``TrainConfig`` field but ``RUNTIME_KEYS`` must be equal (the subsets, batch size and recipe included; a
    field the state predates must hold its default, which the state was trained with), and
    each split's images, labels, class names and count equal to those the state was trained and tested on; the
    dataset's path does not count (folders move between machines). ``InputError`` otherwise, naming the field or the
    split and what differs.

    A state written before vitviz fingerprinted the data holds none: it is resumed with a ``UserWarning`` that names
    the file and says its data could not be checked, rather than refused, so that runs already under way are not
    stranded (their subsets and recipe are still checked). The epochs it holds stay marked unchecked in the states
    written after it, and every later resume warns again.

    Returns:
        The first epoch whose data were checked (``0``: all of them), to be stored with the next state.
    """
    saved = {k: v for k, v in state["config"].items() if k not in RUNTIME_KEYS}
    mine = {k: v for k, v in asdict(cfg).items() if k in saved}
    if saved != mine:
        diff = {k: (saved[k], mine.get(k)) for k in saved if saved[k] != mine.get(k)}
        raise InputError(f"cannot resume {path}: its config differs (saved, now): {diff}. Resume it with its own "
                         "settings, or start this run in another folder (--out)")
    # a field TrainConfig gained after the state was written: the state was trained as its default says
    defaults = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default for f in fields(cfg)}
    newer = {k: (defaults[k], v) for k, v in asdict(cfg).items()
             if k not in state["config"] and k not in RUNTIME_KEYS and v != defaults[k]}
    if newer:
        raise InputError(f"cannot resume {path}: it was written before vitviz had the settings {sorted(newer)}, so "
                         f"it was trained as their defaults say; they differ now (default, now): {newer}. Resume it "
                         "with the defaults, or start this run in another folder (--out)")
    recorded = state.get("data_fingerprint")
    if recorded is None:
        warnings.warn(f"{path} was written before vitviz recorded the data a run trains on: its data could not be "
                      f"checked against {cfg.data!r}; it is resumed as if they were the same. If it was trained on "
                      "other images, start this run in another folder (--out)", stacklevel=3)
        return int(state["epoch"])
    for split in ("train", "test"):
        old, new = recorded.get(split, {}), fingerprint[split]
        diff = [k for k in new if old.get(k) != new[k]]
        if diff:
            what = "; ".join(f"{k}: saved {old.get(k)!r}, now {new[k]!r}" for k in diff)
            raise InputError(
                f"cannot resume {path}: its {split} split differs from the {split} split of data={cfg.data!r} "
                f"({what}), so it was trained on another dataset (or another version of it). Point --data at the "
                "dataset it was trained on, or start this run in another folder (--out)")
    checked_from = int(state.get("data_checked_from", 0))
    if checked_from:
        warnings.warn(f"{path}: its first {checked_from} epochs were trained before vitviz recorded the data, so "
                      "whether they saw these images could not be checked", stacklevel=3)
    return checked_from


COUNTS = ("epochs", "batch_size", "train_subset", "test_subset", "threads")
"""``TrainConfig`` fields that count something: a positive int (the subsets and threads may also be None)."""


def check_config(cfg: TrainConfig) -> None:
    """Refuse a ``TrainConfig`` no run can follow, before any data is read.

    Raises:
        InputError: a field of ``COUNTS`` is not a positive int (``train_subset=-5`` took all but one image of half
            the classes, ``epochs=0`` wrote a run of no epochs), or ``<out>/<model>`` or a folder above it is a file.
    """
    for name in COUNTS:
        value = getattr(cfg, name)
        if value is None and name not in ("epochs", "batch_size"):
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            option = "--" + name.replace("_", "-")
            leave = "" if name in ("epochs", "batch_size") else " (or leave it out: None)"
            raise InputError(f"{name}={value!r} ({option}) is not a positive int; pass a count of 1 or more{leave}")
    folder = cfg.run_dir
    while not folder.exists() and folder.parent != folder:  # the nearest folder that is there must be a folder
        folder = folder.parent
    if folder.exists() and not folder.is_dir():
        raise InputError(f"out={cfg.out!r} (--out): {str(folder)!r} is a file, not a folder; pass a folder for the "
                         "runs (it is made when missing)")


def _whole_number(text: str, low: int, fix: str) -> int:
    """``text`` as a whole number of at least ``low``, else argparse's error (it names the option and the value)."""
    try:
        value = int(text)
    except ValueError:
        raise OptionValueError(f"{text!r} is not a whole number; pass {fix}") from None
    if value < low:
        raise OptionValueError(f"{value} is {'negative' if low == 0 else 'not a positive count'}; pass {fix}")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of 1 or more (argparse names the option and the value otherwise)."""
    return _whole_number(text, 1, "a count of 1 or more")


def count_or_all(text: str) -> int:
    """An argparse ``type``: a whole number of 0 (all) or more."""
    return _whole_number(text, 0, "0 (all) or a count of 1 or more")


def _each(text: str, read: Any) -> tuple:
    """``read(part, text)`` of every comma-separated part of ``text`` (empty parts skipped), as a tuple."""
    return tuple(read(part, text) for part in (v.strip() for v in text.split(",")) if part)


def int_list(positive: bool = False) -> Any:
    """An argparse ``type``: comma-separated whole numbers (``"0,1,2"``) as a tuple; with ``positive``, each 1 or
    more (epoch budgets)."""

    def read(part: str, text: str) -> int:
        try:
            value = int(part)
        except ValueError:
            raise OptionValueError(
                f"{part!r} in {text!r} is not a whole number; pass comma-separated whole numbers, e.g. 0,1,2"
            ) from None
        if positive and value < 1:
            raise OptionValueError(f"{value} in {text!r} is not a positive count; pass 1 or more")
        return value

    return lambda text: _each(text, read)


def non_negative_float(text: str) -> float:
    """An argparse ``type``: a finite number of 0 or more (warm-up epochs)."""
    try:
        value = float(text)
    except ValueError:
        raise OptionValueError(f"{text!r} is not a number; pass 0 or more, e.g. 1.5") from None
    if not 0 <= value < float("inf"):
        raise OptionValueError(f"{value} is not a finite number of 0 or more; pass 0 or more, e.g. 1.5")
    return value


def _positive_float(part: str, text: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise OptionValueError(f"{part!r} in {text!r} is not a number; pass comma-separated numbers above 0, "
                               "e.g. 1e-3,3e-4") from None
    if not 0 < value < float("inf"):
        raise OptionValueError(f"{value} in {text!r} is not a finite number above 0; pass e.g. 1e-3,3e-4")
    return value


def positive_float_list(text: str) -> tuple[float, ...]:
    """An argparse ``type``: comma-separated finite numbers above 0 (learning rates, ``"1e-3,3e-4"``) as a tuple."""
    return _each(text, _positive_float)


def positive_float(text: str) -> float:
    """An argparse ``type``: one finite number above 0 (a learning rate, ``"1e-3"``)."""
    try:
        value = float(text)
    except ValueError:
        raise OptionValueError(f"{text!r} is not a number; pass a number above 0, e.g. 1e-3") from None
    if not 0 < value < float("inf"):
        raise OptionValueError(f"{value} is not a finite number above 0; pass e.g. 1e-3")
    return value


def name_list(known: Any) -> Any:
    """An argparse ``type``: comma-separated names, each one of ``known``, as a tuple."""

    def parse(text: str) -> tuple[str, ...]:
        names = _each(text, lambda part, _: part)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise OptionValueError(f"{', '.join(map(repr, unknown))} in {text!r}: not one of {', '.join(known)}; "
                                   "pass them comma-separated")
        return names

    return parse


def train_parser(prog: str = "python -m vitviz.experiments.train") -> argparse.ArgumentParser:
    """The command line of ``vitviz train``."""
    p = argparse.ArgumentParser(prog=prog, description="Train a vitviz reference model on CIFAR-10 (resumable; "
                                "checkpoints written atomically every epoch).")
    p.add_argument("model", help="reference model name, e.g. cifar10-vit")
    p.add_argument("--data", help="dataset root with train/ and test/ (default: $VITVIZ_DATA)")
    p.add_argument("--epochs", type=positive_int, default=TrainConfig.epochs)
    p.add_argument("--out", default="runs", help="runs folder (default: runs)")
    p.add_argument("--resume", action="store_true", help="continue from <out>/<model>/last.pt")
    p.add_argument("--batch-size", type=positive_int, default=TrainConfig.batch_size)
    p.add_argument("--lr", type=float, default=TrainConfig.lr)
    p.add_argument("--weight-decay", type=float, default=TrainConfig.weight_decay)
    p.add_argument("--warmup-epochs", type=float, default=TrainConfig.warmup_epochs)
    p.add_argument("--augment", default=TrainConfig.augment, choices=["crop-flip", "trivialaugment", "randaugment"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-subset", type=positive_int, help="use only N training images (balanced over classes)")
    p.add_argument("--test-subset", type=positive_int, help="evaluate on only N test images (balanced)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads")
    p.add_argument("--no-compile", action="store_true", help="no torch.compile on CUDA")
    p.add_argument("--export", metavar="DIR", help="after training, write <model>.safetensors + card to DIR")
    p.add_argument("--no-progress", action="store_true")
    return p


def config_from_args(a: argparse.Namespace) -> TrainConfig:
    """The ``TrainConfig`` a parsed ``train`` command line describes."""
    return TrainConfig(
        model=a.model, data=a.data, out=a.out, epochs=a.epochs, batch_size=a.batch_size, lr=a.lr,
        weight_decay=a.weight_decay, warmup_epochs=a.warmup_epochs, augment=a.augment, seed=a.seed,
        train_subset=a.train_subset, test_subset=a.test_subset, device=a.device, threads=a.threads,
        compile=not a.no_compile,
    )


def study_parser(prog: str = "python -m vitviz.experiments.study") -> argparse.ArgumentParser:
    """The command line of ``vitviz study``."""
    p = argparse.ArgumentParser(prog=prog, description="The hybrid-versus-pure study on CIFAR-10: every family, "
                                "size, budget and seed, resumable; one CSV row per run.")
    p.add_argument("study", choices=["hybrid-vs-pure"])
    p.add_argument("--data", help="dataset root with train/ and test/, or a .npz JPEG pack (default: $VITVIZ_DATA)")
    p.add_argument("--out", default="runs/study", help="run folders (checkpoints; not committed)")
    p.add_argument("--results", default="data/study/hybrid_vs_pure.csv", help="results CSV (one row per run)")
    p.add_argument("--smoke", action="store_true", help="one tiny run per family: size S, 1 epoch, 200 training "
                   "and 100 test images (class-balanced), seed 0 (the sizing options given with it still apply)")
    p.add_argument("--families", default="vit,hybrid,resnet")
    p.add_argument("--sizes", default="S,M,L")
    p.add_argument("--seeds", type=int_list(), default="0,1,2",
                   help="seeds, comma-separated: every configuration runs once per seed")
    p.add_argument("--epochs", type=int_list(positive=True), default="2,4,8",
                   help="epoch budgets on the training subset, comma-separated")
    p.add_argument("--train-subset", type=count_or_all, default=5_000,
                   help="class-balanced training images (0: all)")
    p.add_argument("--full-epochs", type=int_list(positive=True), default="",
                   help="epoch budgets on the whole training set (e.g. 16)")
    p.add_argument("--full-sizes", default="S,M", help="sizes trained on the whole training set")
    p.add_argument("--test-subset", type=count_or_all, default=0, help="class-balanced test images (0: all)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads")
    p.add_argument("--compile", action="store_true", help="torch.compile on CUDA (slower for these short runs)")
    p.add_argument("--workers", type=positive_int, default=1, help="processes at a time (e.g. runs sharing one GPU)")
    p.add_argument("--config", help=argparse.SUPPRESS)  # a worker's whole StudyConfig as JSON (run_parallel)
    p.add_argument("--no-progress", action="store_true")
    return p
