"""Small-scale hybrid-versus-pure study (the ViT paper's Fig. 5 at CIFAR-10 scale).

``python -m vitviz.experiments.study hybrid-vs-pure --data DIR --seeds 0,1,2`` trains, with the project's training
runner, a grid of sizes for each family -- pure ViT (patch 4), hybrid (a convolutional stem feeding the same
transformer at patch 1) and ResNet -- each at several epoch budgets on a class-balanced training subset (plus,
with ``--full-epochs``, budgets on the whole training set for ``--full-sizes``), each configuration once per seed,
and records test accuracy against training compute (forward + backward FLOPs per image from ``FlopCounterMode`` x
images seen), wall time, device and versions. The seed sets the initial weights and every epoch's shuffling,
augmentation and dropout; training and test sets are the same for every seed.

Resumable: results go to one CSV (one row per finished run, rewritten atomically); a rerun skips finished runs
and a run killed half-way continues from its last epoch checkpoint. A row holds what its result depends on
besides its ``run_id`` (``SETTINGS``: batch size, test subset, a digest of the whole training recipe, and the
fingerprints of the images, labels and classes it was trained and tested on); a rerun whose settings or data
differ from a row's is refused (``check_rows``, see ``vitviz.experiments.study_rows``) rather than handed the old
row as its own. ``--smoke`` runs one tiny run per family (``StudyConfig.smoke``); the sizing options given
with it (``--seeds 0,1``) still apply.
Several processes can share the work (``--families`` / ``--sizes``, one results CSV each); ``merge_results``
joins their CSVs. Summaries over seeds and the matched-compute comparison are in ``vitviz.experiments.compare``.
"""

from __future__ import annotations

import io
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from vitviz.core.io import atomic_write_json, atomic_write_text
from vitviz.core.util import cli_errors
from vitviz.errors import InputError
from vitviz.experiments.config import study_parser
from vitviz.experiments.study_rows import DIGESTS, check_mergeable, row_settings
from vitviz.experiments.study_rows import check_rows as check_table_rows
from vitviz.experiments.train import TrainConfig, train
from vitviz.zoo.reference import FAMILY_LABELS
from vitviz.zoo.weights import versions

FAMILIES: dict[str, tuple[str, str]] = {  # key -> (reference architecture, family label used in figures)
    key: (arch, FAMILY_LABELS[arch])
    for key, arch in (("vit", "cifar10-vit"), ("hybrid", "cifar10-hybrid"), ("resnet", "cifar10-resnet"))
}
HYBRID_STEM = {"stem_widths": (16, 32, 64)}  # one stem for every hybrid size, as the paper's R50x1 for every ViT
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "S": {"vit": {"embed_dim": 64, "depth": 4, "num_heads": 2},
          "hybrid": {"embed_dim": 64, "depth": 4, "num_heads": 2, **HYBRID_STEM},
          "resnet": {"widths": (16, 32, 64, 128)}},
    "M": {"vit": {"embed_dim": 96, "depth": 6, "num_heads": 3},
          "hybrid": {"embed_dim": 96, "depth": 6, "num_heads": 3, **HYBRID_STEM},
          "resnet": {"widths": (24, 48, 96, 192)}},
    "L": {"vit": {"embed_dim": 128, "depth": 8, "num_heads": 4},
          "hybrid": {"embed_dim": 128, "depth": 8, "num_heads": 4, **HYBRID_STEM},
          "resnet": {"widths": (32, 64, 128, 256)}},
}


@dataclass
class StudyConfig:
    data: str | None = None
    out: str = "runs/study"
    results: str = "data/study/hybrid_vs_pure.csv"
    families: Sequence[str] = ("vit", "hybrid", "resnet")
    sizes: Sequence[str] = ("S", "M", "L")
    epochs: Sequence[int] = (2, 4, 8)
    train_subset: int | None = 5_000
    test_subset: int | None = None  # None: the whole test set (CIFAR-10: 10,000 images)
    full_epochs: Sequence[int] = ()  # budgets trained on the whole training set ...
    full_sizes: Sequence[str] = ("S", "M")  # ... for these sizes
    batch_size: int = 128
    seeds: Sequence[int] = (0, 1, 2)
    device: str = "auto"
    threads: int | None = None
    compile: bool = False  # torch.compile on CUDA: these runs last seconds, compiling takes longer
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def smoke(cls, **kw: Any) -> StudyConfig:
        """One tiny run per family: for tests and a first look."""
        return cls(**{"sizes": ("S",), "epochs": (1,), "train_subset": 200, "test_subset": 100, "batch_size": 50,
                      "seeds": (0,), **kw})


def run_id(family_key: str, size: str, epochs: int, train_subset: int | None, seed: int) -> str:
    """``vit-S-e8-n5000-s0``: family, size, epochs, training images (``all`` for the whole set), seed."""
    return f"{family_key}-{size}-e{epochs}-n{train_subset or 'all'}-s{seed}"


def plan(cfg: StudyConfig) -> list[dict[str, Any]]:
    """Every run of the study as ``run_id``, family, size, epochs, train_subset, seed and model kwargs.

    Order: the subset budgets before the whole-training-set ones; within each, seed by seed (so a sweep cut short
    has whole seeds, not a little of every seed), cheapest budget first.
    """
    for name, values in (("families", cfg.families), ("sizes", [*cfg.sizes, *cfg.full_sizes])):
        known = FAMILIES if name == "families" else SIZES
        unknown = [v for v in values if v not in known]
        if unknown:
            raise InputError(f"unknown {name} {unknown}; choose from {sorted(known)}")
    if not cfg.seeds:
        raise InputError("seeds is empty: give at least one seed, e.g. --seeds 0,1,2")
    for name, example in (("families", "vit,hybrid,resnet"), ("sizes", "S,M,L")):
        if not getattr(cfg, name):  # no run planned: the study printed a KeyError for its empty table
            raise InputError(f"{name} is empty: give at least one, e.g. --{name} {example}")
    if not cfg.epochs and not cfg.full_epochs:
        raise InputError("epochs and full_epochs are both empty: give an epoch budget, e.g. --epochs 2,4,8")
    for name in ("epochs", "full_epochs"):
        bad = [e for e in getattr(cfg, name) if isinstance(e, bool) or not isinstance(e, numbers.Integral) or e < 1]
        if bad:
            raise InputError(f"{name}={tuple(getattr(cfg, name))!r} (--{name.replace('_', '-')}) holds {bad}, not "
                             "positive whole numbers of epochs; pass budgets of 1 or more, e.g. 2,4,8")
    blocks = [(cfg.train_subset, cfg.epochs, cfg.sizes)]
    if cfg.full_epochs:
        blocks.append((None, cfg.full_epochs, [s for s in cfg.full_sizes if s in cfg.sizes] or cfg.full_sizes))
    runs = []
    for subset, budgets, sizes in blocks:
        for seed in cfg.seeds:
            for epochs in sorted(budgets):
                for size in sizes:
                    for fam in cfg.families:
                        runs.append({"run_id": run_id(fam, size, int(epochs), subset, int(seed)),
                                     "family_key": fam, "size": size, "epochs": int(epochs),
                                     "train_subset": subset, "seed": int(seed),
                                     "model_kwargs": SIZES[size][fam]})
    return runs


def default_results() -> Path:
    """The committed study CSV as installed: ``data/study/hybrid_vs_pure.csv``, shipped as ``vitviz.data``."""
    from vitviz.core.resources import shipped_dir

    return shipped_dir("vitviz.data") / "study" / "hybrid_vs_pure.csv"


def read_results(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """The study CSV (default: the committed one, ``default_results()``); an empty frame when the file is absent.

    Raises:
        CheckpointError: a row holds fewer or more cells than the header, or the last line is not ended: the file
            was cut off (an interrupted copy, a disk error; vitviz writes it whole) or edited by another program.
            Read as it is, the cut row's missing cells would be empty (its settings, so it passed for a row written
            before vitviz recorded them) and its last cell cut short, and a rerun would skip its run as done.
    """
    path = Path(path) if path is not None else default_results()
    import csv

    from vitviz.core.io import read_csv_exact
    from vitviz.errors import CheckpointError

    if not path.is_file() or not path.stat().st_size:
        return pd.DataFrame()
    text = path.read_text(encoding="utf-8")
    lines = list(csv.reader(io.StringIO(text)))
    width = len(lines[0])
    bad = next((n for n, cells in enumerate(lines[1:], start=2) if cells and len(cells) != width), None)
    if bad is not None or not text.endswith("\n"):
        what = (f"line {bad} holds {len(lines[bad - 1])} cells, its header {width}" if bad is not None else
                f"its last line (line {len(lines)}) is not ended")
        raise CheckpointError(f"results {str(path)!r}: {what}: the file was cut off (an interrupted copy, a disk "
                              "error) or edited by another program (vitviz writes it whole). Restore it from a copy, "
                              "or delete that line: the next run of the study writes the row again from its run "
                              "folder (its last.pt: the epochs it holds are not trained again)")
    return read_csv_exact(path, dtype=dict.fromkeys(DIGESTS, str))  # hex digests stay strings


def _train_config(cfg: StudyConfig, run: dict[str, Any]) -> TrainConfig:
    arch = FAMILIES[run["family_key"]][0]
    return TrainConfig(
        model=arch, data=cfg.data, out=str(Path(cfg.out) / run["run_id"]), epochs=run["epochs"],
        batch_size=cfg.batch_size, warmup_epochs=min(3.0, 0.2 * run["epochs"]), seed=run["seed"],
        train_subset=run["train_subset"], test_subset=cfg.test_subset, device=cfg.device, threads=cfg.threads,
        model_kwargs=dict(run["model_kwargs"]), cache=str(Path(cfg.out) / ".cache"), compile=cfg.compile,
    )


def check_rows(cfg: StudyConfig, table: pd.DataFrame) -> None:
    """Refuse to continue ``cfg.results`` when a row of ``table`` was computed with other settings or data than
    ``cfg``'s runs (``vitviz.experiments.study_rows.check_rows``)."""
    if not len(table) or "run_id" not in table:
        return
    configs = {r["run_id"]: _train_config(cfg, r) for r in plan(cfg)}
    check_table_rows(table, configs, str(cfg.results), Path(cfg.out))


def write_meta(cfg: StudyConfig, table: pd.DataFrame) -> None:
    """``<results>.json`` beside the CSV: the study's settings, the size grid, and which runs are done."""
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    planned = [r["run_id"] for r in plan(cfg)]
    finished = list(table["run_id"]) if "run_id" in table else []
    atomic_write_json(Path(cfg.results).with_suffix(".json"), {
        "study": "hybrid-vs-pure", "settings": settings, "sizes": SIZES, "families": FAMILIES,
        "compute": "forward+backward FLOPs per 32x32 image (torch.utils.flop_counter.FlopCounterMode) x images seen",
        "runs_finished": len(finished), "runs_planned": len(planned),
        "runs_pending": [r for r in planned if r not in finished],
        "note": "wall_time_s depends on the device and on what else ran beside it (see the device column; GPU "
                "sweeps run several runs at once on one GPU): compare compute, not wall time",
    })


def run_study(cfg: StudyConfig, *, progress: bool = True,
              on_run: Callable[[dict[str, Any]], None] | None = None) -> pd.DataFrame:
    """Run every planned run not yet in ``cfg.results``; return the whole results table.

    Args:
        cfg: the study's settings.
        progress: tqdm bars (over runs, and the runner's per epoch).
        on_run: called with each finished run's row (after it is written).
    """
    from tqdm.auto import tqdm

    from vitviz.zoo.reference import build_reference

    results = Path(cfg.results)
    if results.is_dir():  # each finished run's row would fail to be written
        raise InputError(f"results={str(results)!r} (--results) is a folder; pass the CSV file to write, e.g. "
                         f"{str(results / 'hybrid_vs_pure.csv')!r}")
    table = read_results(results)
    check_rows(cfg, table)
    done = set(table["run_id"]) if "run_id" in table else set()
    todo = [r for r in plan(cfg) if r["run_id"] not in done]
    write_meta(cfg, table)
    for run in tqdm(todo, desc="hybrid-vs-pure runs", disable=not progress):
        tc = _train_config(cfg, run)
        summary = train(tc, resume=True, progress=progress)
        arch, label = FAMILIES[run["family_key"]]
        params = sum(p.numel() for p in build_reference(arch, **tc.model_kwargs).parameters())
        images_seen = summary["train_images"] * run["epochs"]
        row = {
            "run_id": run["run_id"], "family": label, "model": f"{run['family_key']}-{run['size']}",
            "size": run["size"], "epochs": run["epochs"], "params": params,
            "flops_train_per_image": summary["flops_per_image_train"],
            "flops_forward_per_image": summary["flops_per_image_forward"],
            "train_images": summary["train_images"], "images_seen": images_seen,
            "train_pflops": summary["flops_per_image_train"] * images_seen / 1e15,
            "test_acc": summary["test_acc"], "test_images": summary["test_images"],
            "wall_time_s": summary["train_time_s"], "device": summary["device"], "seed": run["seed"],
            **row_settings(tc, summary["data_fingerprint"]),
            **{f"{k}_version": v for k, v in versions().items()},
        }
        table = pd.concat([table, pd.DataFrame([row])], ignore_index=True)
        _write_csv(results, table)
        write_meta(cfg, table)
        if on_run is not None:
            on_run(row)
    return table


def _write_csv(path: Path, table: pd.DataFrame) -> None:
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    atomic_write_text(path, buf.getvalue())


def merge_results(parts: Sequence[str | os.PathLike], out: str | os.PathLike) -> pd.DataFrame:
    """Join results CSVs of processes that shared a sweep into ``out`` (atomically): rows already in ``out`` are
    kept, a ``run_id`` is kept once (the first seen), rows ordered by family, size, training images, epochs, seed.

    The parts must be parts of one study: ``InputError`` when two rows of one ``run_id`` differ in a ``SETTINGS``
    column, or any two rows in a ``STUDY_WIDE`` one (another test subset, batch size or test set), naming the files.
    The data count by their fingerprints, so parts computed on several machines (the data in other folders) merge.
    """
    sources = [out, *parts]
    frames = [read_results(p).assign(_part=str(p)) for p in sources]
    table = pd.concat([f for f in frames if len(f)], ignore_index=True)
    check_mergeable(table)
    table = table.drop(columns="_part").drop_duplicates("run_id", keep="first")
    family_order = {label: i for i, (_, label) in enumerate(FAMILIES.values())}
    order = table.assign(_f=table["family"].map(family_order), _s=table["size"].map(list(SIZES).index))
    table = order.sort_values(["train_images", "epochs", "_s", "_f", "seed"]).drop(columns=["_f", "_s"])
    table = table.reset_index(drop=True)
    _write_csv(Path(out), table)
    return table


def worker_groups(cfg: StudyConfig) -> list[dict[str, Any]]:
    """Split a sweep into independent parts for ``run_parallel``: one per family and size and training set.

    Each part is a dict of ``StudyConfig`` overrides plus its ``name``; the whole-training-set parts (the longest)
    come first, and within a part the seeds run one after the other.
    """
    full_sizes = [s for s in cfg.full_sizes if s in cfg.sizes] or list(cfg.full_sizes)
    groups = [{"name": f"{fam}-{size}-nall", "families": (fam,), "sizes": (size,), "full_sizes": (size,),
               "epochs": ()} for size in (full_sizes if cfg.full_epochs else []) for fam in cfg.families]
    groups += [{"name": f"{fam}-{size}-n{cfg.train_subset or 'all'}", "families": (fam,), "sizes": (size,),
                "full_epochs": ()} for size in cfg.sizes for fam in cfg.families if cfg.epochs]
    return groups


def run_parallel(cfg: StudyConfig, workers: int) -> pd.DataFrame:
    """Run the sweep as ``workers`` processes at a time (one per ``worker_groups`` part; e.g. several runs
    sharing one GPU), each resumable with its own CSV in ``<results>.parts/``; then merge them into ``results``.

    The dataset is decoded into the shared cache first, so the workers only load it. A worker that exits with an
    error (out of memory, killed) fails the call with ``RunInterrupted`` naming it and its log, after the parts that
    finished are merged: before, its runs were silently missing from a table written as the study's.
    """
    import json
    import subprocess
    import time

    from vitviz.experiments.data import load_split

    for split, subset in (("train", None), ("test", None)):
        load_split(_train_config(cfg, {**plan(cfg)[0], "train_subset": subset}), split, subset)
    parts_dir = Path(str(cfg.results) + ".parts")
    parts_dir.mkdir(parents=True, exist_ok=True)
    pending, running, parts, failed = list(worker_groups(cfg)), [], [], []
    base = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    while pending or running:
        while pending and len(running) < workers:
            group = pending.pop(0)
            name = group.pop("name")
            part = parts_dir / f"{name}.csv"
            parts.append(part)
            conf = {**base, **group, "results": str(part)}
            log = open(parts_dir / f"{name}.log", "w")  # noqa: SIM115 - closed when the worker ends
            cmd = [sys.executable, "-m", "vitviz.experiments.study", "hybrid-vs-pure", "--no-progress",
                   "--config", json.dumps(conf)]
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log, name))
        time.sleep(1.0)
        for proc, log, name in list(running):
            if proc.poll() is not None:
                log.close()
                running.remove((proc, log, name))
                print(f"worker {name} finished (exit {proc.returncode})", flush=True)
                if proc.returncode != 0:
                    failed.append(f"{name} (exit {proc.returncode}; its log: {parts_dir / f'{name}.log'})")
    done = [p for p in parts if p.is_file()]
    table = merge_results(done, cfg.results) if done or not failed else pd.DataFrame()
    if len(table) or not failed:  # the description lists the runs done, and the runs planned
        write_meta(cfg, table)
    if failed:  # the finished parts are merged above; the study is not done until every part is
        from vitviz.errors import RunInterrupted

        raise RunInterrupted(
            f"{len(failed)} of {len(parts)} study workers did not finish: {'; '.join(failed)}. The runs they finished "
            f"are kept ({len(table)} rows merged into {cfg.results!r}); read the log, then run the same command "
            "again: each worker resumes from its part's CSV and run folders, and runs done are not trained again")
    return table


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


@cli_errors("vitviz study")
def main(argv: list[str] | None = None) -> int:
    parser = study_parser()
    a = parser.parse_args(argv)
    smoke = StudyConfig.smoke()
    if a.smoke:  # the smoke run's sizes, budgets, subsets and seeds become the defaults; options given still count
        parser.set_defaults(sizes=",".join(smoke.sizes), epochs=",".join(map(str, smoke.epochs)),
                            seeds=",".join(map(str, smoke.seeds)), train_subset=smoke.train_subset,
                            test_subset=smoke.test_subset, full_epochs=",".join(map(str, smoke.full_epochs)))
        a = parser.parse_args(argv)
    if a.config:
        import json

        run_study(StudyConfig(**json.loads(a.config)), progress=False)
        return 0
    common = {"data": a.data, "out": a.out, "results": a.results, "device": a.device, "threads": a.threads,
              "families": _names(a.families), "compile": a.compile}
    cfg = StudyConfig(sizes=_names(a.sizes), epochs=a.epochs, seeds=a.seeds,
                      train_subset=a.train_subset or None, test_subset=a.test_subset or None,
                      full_epochs=a.full_epochs, full_sizes=_names(a.full_sizes),
                      **({"batch_size": smoke.batch_size} if a.smoke else {}), **common)
    table = run_parallel(cfg, a.workers) if a.workers > 1 else run_study(cfg, progress=not a.no_progress)
    cols = ["run_id", "params", "train_pflops", "test_acc", "wall_time_s"]
    print(table[cols].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
