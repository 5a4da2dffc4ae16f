"""Seeded training sweeps: the arms of an ablation, each trained at several seeds by ``train``, resumable, with one
results table rebuilt from the run folders and arms compared by intervals paired over seeds.

The experiments built on it (``cls_vs_gap``: class token versus GAP; ``posemb_seeds``: Table 8 over training seeds)
name their runs and arms; this module owns what they share:

- ``train_runs``: trains every run in turn, resuming an interrupted one from its last epoch (``train``'s atomic
  ``last.pt``), skipping finished ones, and keeping each epoch's weights (``epochs/epoch_NNN.pt``) for measures taken
  afterwards; after every epoch the caller rewrites its results table, so it always holds every finished epoch;
- ``collect_runs``: one row per run and finished epoch, read from the run folders, each checked against the sweep's
  settings and data (``check_run_folder``) so that no folder trained otherwise is labelled with them;
- ``fewshot_of_epochs``: few-shot linear accuracy (the ViT paper's Sec. 4.1 measure) of every kept epoch's weights;
- ``last_epoch_per_seed``: the last epoch of every run, refused unless every run reached it and every arm has every
  seed (a comparison over seeds that silently drops a run or a seed is not the comparison asked for);
- ``write_table``: a results CSV and its settings JSON, written atomically.
"""

from __future__ import annotations

import argparse
import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from vitviz.core.io import atomic_save, atomic_write_json, atomic_write_text
from vitviz.errors import InputError
from vitviz.experiments.config import TrainConfig
from vitviz.experiments.data import run_fingerprint


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep.

    Attributes:
        id: its name (``gap-lr0.000375-s0``): the ``run`` column of the results, and its folder under the sweep's.
        keys: the columns that name it in the results, in order, the training seed as ``seed`` (e.g. ``{"head":
            "gap", "lr": 3.75e-4, "seed": 0}``).
        config: the ``TrainConfig`` that trains it (``config.run_dir`` holds its folder).
    """

    id: str
    keys: dict[str, Any]
    config: TrainConfig


def add_sweep_options(p: argparse.ArgumentParser, defaults: Any) -> None:
    """The command-line options every sweep shares, with the defaults of its config class ``defaults``: where the
    data, run folders and results are, the seeds, the budget and the device; the sweep adds its own arms."""
    from vitviz.experiments.config import count_or_all, int_list, non_negative_float, positive_int

    p.add_argument("--data", help="dataset root with train/ and test/ (default: $VITVIZ_DATA)")
    p.add_argument("--out", default=defaults.out, help="run folders (default: %(default)s)")
    p.add_argument("--results", default=defaults.results, help="results CSV (default: %(default)s)")
    p.add_argument("--seeds", type=int_list(), default=",".join(map(str, defaults.seeds)),
                   help="seeds, comma-separated (default: %(default)s)")
    p.add_argument("--epochs", type=positive_int, default=defaults.epochs)
    p.add_argument("--warmup-epochs", type=non_negative_float, default=defaults.warmup_epochs)
    p.add_argument("--train-subset", type=count_or_all, default=defaults.train_subset, help="0: all 50,000")
    p.add_argument("--test-subset", type=count_or_all, default=defaults.test_subset, help="0: all 10,000")
    p.add_argument("--batch-size", type=positive_int, default=defaults.batch_size)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--progress", action="store_true")


def check_run_folder(tc: TrainConfig, fingerprint: dict[str, Any] | None) -> bool:
    """Whether ``tc.run_dir`` holds a run of this sweep (``last.pt`` present); ``InputError`` when it holds a run
    trained otherwise (``check_training_state``: another recipe, subset or dataset) or for another number of epochs,
    whose metrics or kept epochs would be labelled with this sweep's settings. ``fingerprint``: the data's
    (``run_fingerprint``), shared by every run of the sweep."""
    return _check_run_state(tc, fingerprint, _last_state(tc.run_dir))


def _last_state(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir``'s ``last.pt`` (``load_training_state``), or None without one."""
    from vitviz.zoo.weights import load_training_state

    last = run_dir / "last.pt"
    return load_training_state(last) if last.exists() else None


def _check_run_state(tc: TrainConfig, fingerprint: dict[str, Any] | None, state: dict[str, Any] | None) -> bool:
    """``check_run_folder`` on ``state``, ``tc.run_dir``'s ``last.pt`` already read (None: there is none)."""
    from vitviz.experiments.config import check_training_state

    if state is None:
        return False
    last = tc.run_dir / "last.pt"
    check_training_state(state, tc, fingerprint if fingerprint is not None else run_fingerprint(tc), last)
    if state["config"]["epochs"] != tc.epochs:
        raise InputError(f"{last} holds a {state['config']['epochs']}-epoch run, this sweep trains {tc.epochs} "
                         "epochs: resume it with its own --epochs, or write this sweep to another folder (--out)")
    return True


def collect_runs(runs: Sequence[SweepRun], fingerprint: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per (run, finished epoch), read from every run folder's ``last.pt`` (its ``history``: ``train``
    writes ``metrics.json`` from it just after, so a run killed between the two writes has a ``metrics.json`` an
    epoch behind, or none): ``run``, the run's keys,
    ``epochs_planned``, ``train_images``, ``test_images`` (the images the run was checked to have trained and tested
    on: a subset larger than the dataset, or the whole of a dataset other than CIFAR-10, is not the number asked
    for), then the epoch's metrics (the schedule's rate at the end of the epoch as ``lr_end``). A run folder trained
    otherwise than its ``SweepRun.config`` says is refused (``check_run_folder``), never labelled with its settings.

    ``fingerprint``: the data's (``run_fingerprint``), computed for the first run folder when not given.
    """
    rows = []
    for run in runs:
        tc = run.config
        state = _last_state(tc.run_dir)
        if state is None:
            metrics = tc.run_dir / "metrics.json"
            if metrics.exists():
                raise InputError(f"{metrics} has no last.pt beside it, so the run it measures cannot be "
                                 "checked against this sweep's settings; train it again (delete the folder)")
            continue
        if fingerprint is None:
            fingerprint = run_fingerprint(tc)
        _check_run_state(tc, fingerprint, state)
        for row in state["history"]:
            row = dict(row)
            row["lr_end"] = row.pop("lr")  # the schedule's rate at the end of the epoch
            rows.append({"run": run.id, **run.keys, "epochs_planned": tc.epochs,
                         "train_images": fingerprint["train"]["count"],
                         "test_images": fingerprint["test"]["count"], **row})
    return pd.DataFrame(rows)


def write_table(path: str | Path, table: pd.DataFrame, meta: dict[str, Any]) -> None:
    """Write ``table`` to the CSV ``path`` and ``meta`` (settings, versions) to the JSON beside it, each atomically."""
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    atomic_write_text(path, buf.getvalue())
    atomic_write_json(Path(path).with_suffix(".json"), meta)


def fewshot_results(results: str | Path, default_results: str, default_name: str) -> Path:
    """Where a sweep's few-shot table goes: beside its results CSV, named after it (``<stem>_fewshot.csv``), so that
    measuring one sweep never overwrites the few-shot table of another sweep in the same folder (a larger sweep's
    ``--results data/.../name_15k.csv`` beside the default one); results named as the sweep's default
    (``default_results``) keep the name their table was committed under (``default_name``)."""
    results = Path(results)
    if results.name == Path(default_results).name:
        return results.with_name(default_name)
    return results.with_name(f"{results.stem}_fewshot.csv")


def recover_last_epoch(run_dir: Path, epochs_dir: Path) -> None:
    """A run killed after writing ``last.pt`` but before keeping that epoch's weights: keep them from it."""
    _recover_of_state(epochs_dir, _last_state(run_dir))


def _recover_of_state(epochs_dir: Path, state: dict[str, Any] | None) -> None:
    """``recover_last_epoch`` on ``state``, the run's ``last.pt`` already read (None: there is none)."""
    if state is not None:
        _keep_last_epoch(state, epochs_dir)


def _keep_last_epoch(state: dict[str, Any], epochs_dir: Path) -> None:
    """Keep the weights of the epoch the training state ``state`` holds in ``epochs_dir`` where they are not."""
    target = epochs_dir / f"epoch_{state['epoch']:03d}.pt"
    if not target.exists():
        atomic_save(state["model"], target)


def _epoch_of(path: Path) -> int:
    """The epoch of a kept weights file ``epochs/epoch_NNN.pt``."""
    return int(path.stem.split("_")[1])


def stale_epochs(run_dir: Path) -> tuple[list[Path], int | None]:
    """The kept epoch weights (``epochs/epoch_NNN.pt``) of ``run_dir`` that its ``last.pt`` does not account for,
    and that ``last.pt``'s epoch (None without one): the files numbered beyond it, or every one without a
    ``last.pt``. ``train`` writes ``last.pt`` before the sweep keeps that epoch's weights, so such files are an
    earlier run's (its ``last.pt`` deleted to train the run again), and would pass for this run's epochs."""
    return _stale_of_state(run_dir, _last_state(run_dir))


def _stale_of_state(run_dir: Path, state: dict[str, Any] | None) -> tuple[list[Path], int | None]:
    """``stale_epochs`` on ``state``, ``run_dir``'s ``last.pt`` already read (None: there is none)."""
    kept = sorted((run_dir / "epochs").glob("epoch_*.pt"))
    if state is None:
        return kept, None
    epoch = int(state["epoch"])
    return [p for p in kept if _epoch_of(p) > epoch], epoch


def _stale_error(run_id: str, run_dir: Path, stale: list[Path], epoch: int | None) -> InputError:
    where = "there is no last.pt" if epoch is None else f"its last.pt is at epoch {epoch}"
    shown = ", ".join(p.name for p in stale[:3]) + (", ..." if len(stale) > 3 else "")
    return InputError(f"{stale[0].parent} keeps {len(stale)} epoch weights ({shown}) of an earlier run of {run_id}: "
                      f"{where}, and a run keeps an epoch only after its last.pt holds it, so they would pass for "
                      f"this run's epochs; delete them (or the run folder {run_dir}) to train "
                      f"{run_id} again")


def train_runs(runs: Sequence[SweepRun], after_epoch: Callable[[], Any], *, tag: str,
               progress: bool = False) -> None:
    """Train every run in turn (resuming a started one, skipping a finished one), keeping each epoch's weights in
    ``<run_dir>/epochs/epoch_NNN.pt`` and calling ``after_epoch()`` (the caller's results rewrite) after each."""
    from vitviz.experiments.train import train

    for run in runs:
        tc = run.config
        epochs_dir = tc.run_dir / "epochs"
        state = _last_state(tc.run_dir)  # read once: the recovery of its last epoch and the stale-epoch check
        _recover_of_state(epochs_dir, state)
        stale, epoch = _stale_of_state(tc.run_dir, state)  # lists the kept epochs after the recovery
        del state  # the whole training state (optimizer and all): not held while the run trains
        if stale:  # refused before training: the new run's epochs would be mixed with them, or overwrite them
            raise _stale_error(run.id, tc.run_dir, stale, epoch)

        def keep(epoch: int, model: torch.nn.Module, row: dict[str, Any], d: Path = epochs_dir) -> None:
            atomic_save({k: v.detach().cpu() for k, v in model.state_dict().items()}, d / f"epoch_{epoch:03d}.pt")
            after_epoch()

        print(f"[{tag}] {run.id}: {tc}", flush=True)
        summary = train(tc, resume=True, on_epoch=keep, progress=progress)
        print(f"[{tag}] done {run.id}: {summary}", flush=True)


def fewshot_of_epochs(runs: Sequence[SweepRun], data: str | None, *, shots: int = 5,
                      seeds: tuple[int, ...] = (0, 1, 2), test_per_class: int = 100,
                      last_only: bool = False) -> pd.DataFrame:
    """Few-shot linear accuracy (``vitviz.linear_fewshot``, the ViT paper's Sec. 4.1) of every kept epoch's weights.

    Few-shot images come from ``<data>/train`` (``seeds`` draws, the same images for every run), scored on the first
    ``test_per_class`` images of each class of ``<data>/test``. Returns ``linear_fewshot``'s rows (its ``seed``: the
    draw) with the run's keys inserted after ``model`` (the run id), the training seed as ``run_seed``, and
    ``epoch``. ``last_only``: measure each run's last kept epoch only (what a comparison at the last epoch reads).
    A run folder trained otherwise than the sweep says is refused (``check_run_folder``); kept weights without a
    ``last.pt`` to check them by are measured with a warning. The epoch a run's ``last.pt`` holds is kept from it
    first where it is not (a run killed after writing ``last.pt``, before keeping that epoch's weights), as the
    sweep's next training call would: else the run's last epoch would be measured as the one before.
    """
    from vitviz.core.util import check_bool

    check_bool(last_only, "last_only", "measure only the last kept epoch of each run")
    from vitviz.analysis.representations import linear_fewshot, per_class_subset
    from vitviz.zoo.reference import build_reference
    from vitviz.zoo.samples import resolve_data_root
    from vitviz.zoo.weights import read_state_dict

    root = resolve_data_root(data)
    fingerprint = None  # the sweep's data, computed for the first run folder that has a last.pt
    frames = []
    for run in runs:
        tc = run.config
        state = _last_state(tc.run_dir)  # read once: the run's checks and its stale epochs
        if fingerprint is None and state is not None:
            fingerprint = run_fingerprint(tc)
        if not _check_run_state(tc, fingerprint, state) and any((tc.run_dir / "epochs").glob("epoch_*.pt")):
            warnings.warn(f"{tc.run_dir} keeps epoch weights but no last.pt: whether they were trained as "
                          f"{run.id} of this sweep could not be checked", stacklevel=2)
        stale, epoch = _stale_of_state(tc.run_dir, state)
        if stale and epoch is not None:  # beyond the run's last.pt: an earlier run's (without one: warned above)
            raise _stale_error(run.id, tc.run_dir, stale, epoch)
        if state is not None:  # killed after its last.pt, before it kept that epoch: the last epoch is last.pt's
            _keep_last_epoch(state, tc.run_dir / "epochs")
        model = build_reference(tc.model, **tc.model_kwargs).eval()
        test = per_class_subset(model, root / "test", test_per_class)
        kept = sorted((tc.run_dir / "epochs").glob("epoch_*.pt"))
        for path in kept[-1:] if last_only else kept:
            model.load_state_dict(read_state_dict(path, fix=f"delete it (the run's last epoch is kept again from "
                                                    f"its last.pt by the next run of the sweep), or train {run.id} "
                                                    "again in a new folder"))
            df = linear_fewshot(model, root / "train", test, shots=(shots,), seeds=seeds, name=run.id,
                                batch_size=250)
            for i, (key, value) in enumerate([*run.keys.items(), ("epoch", _epoch_of(path))]):
                df.insert(1 + i, "run_seed" if key == "seed" else key, value)
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def last_epoch_per_seed(df: pd.DataFrame, arms: Sequence[str], run_id: Callable[..., str], fix: str) -> pd.DataFrame:
    """The rows of the last epoch of every run of a sweep's results ``df`` (one row per run and epoch, with the
    ``arms`` columns and ``seed``), checked for a comparison over seeds.

    Args:
        arms: the columns that, with ``seed``, name a run (``("head", "lr")``).
        run_id: names a run from its ``arms`` values and seed, for the messages.
        fix: the call to write in the message's fix, without its argument (``"cls_vs_gap_claims"``).

    Raises:
        InputError: a run has not reached the last epoch (it would drop out of the comparison without a word); the
            message names the runs and the epoch every run reached, to compare at with ``df[df.epoch <= k]``. Or
            the arms do not share their seeds: the seed means would average different seeds and the pairing by seed
            would drop some; the message names the missing runs. Or a run has two rows at the last epoch (tables
            concatenated): its seed would count twice in the mean and the paired interval.
    """
    keys = [*arms, "seed"]
    reached = df.groupby(keys).epoch.max()
    behind = reached[reached < df.epoch.max()]
    if len(behind):
        runs = ", ".join(f"{run_id(*k)} at epoch {e}" for k, e in behind.items())
        raise InputError(f"not every run reached epoch {df.epoch.max()} ({runs}), so the last epoch compares only some "
                         f"of the runs; finish them, or compare at the epoch every run reached: "
                         f"{fix}(df[df.epoch <= {int(reached.min())}])")
    last = df[df.epoch == df.epoch.max()]
    twice = last[last.duplicated(keys, keep=False)]
    if len(twice):
        r = twice.iloc[0]
        rows = int((twice[keys] == r[keys]).all(axis=1).sum())
        raise InputError(f"{fix}: run {run_id(*r[keys])} has {rows} rows at epoch {int(r.epoch)} (tables "
                         "concatenated?), so its seed would count twice; pass one row per run and epoch, e.g. "
                         f"df.drop_duplicates({[*keys, 'epoch']})")
    have = set(last[keys].itertuples(index=False, name=None))
    arm_values = {k[:-1] for k in have}
    missing = sorted((*a, sd) for a in arm_values for sd in set(last.seed) if (*a, sd) not in have)
    if missing:
        raise InputError(f"the runs do not share their seeds: {', '.join(run_id(*m) for m in missing)} missing, so "
                         "the seed means would average different seeds and the pairing by seed would drop some; "
                         "train the missing runs, or keep the seeds every run has: df[df.seed.isin([...])]")
    return last
