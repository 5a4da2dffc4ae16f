"""Table 8 over training seeds: the position-embedding ablation trained at several seeds, compared paired by seed.

Dosovitskiy et al. (ICLR 2021), Sec. 4.5 and App. D.4, Table 8: ViT-B/16 with no position embedding, a learned 1-D
embedding, a learned 2-D (row and column) embedding and relative embeddings, measured by ImageNet 5-shot linear
accuracy: "while there is a large gap between the performances of the model with no positional embedding and models
with positional embedding, there is little to no difference between different ways of encoding positional
information" (61.38 % without, 64.21 % 1-D, 64.00 % 2-D).

The shipped ablation models (``cifar10-vit-{nopos,1dpos,2dpos}``) are one training seed each: a difference between
them mixes the encoding with the seed. ``python -m vitviz.experiments.posemb_seeds --data DIR`` trains the three
encodings (the shipped models' architectures, with the reference recipe of the project's training runner) at every
seed on the same class-balanced subsets, and ``posemb_seed_claims`` states the paper's comparisons as differences
with 95 % Student-t intervals *paired by seed*: both arms of one seed read the same images in the same seeded order,
so the pairing takes out what the seeds share. Measures: end-to-end test top-1 of the last epoch (``test_acc``) and,
after ``--fewshot``, 5-shot linear accuracy of its pre-logits (``fewshot5``, Table 8's measure).

Resumable (``vitviz.experiments.sweep``): every run checkpoints each epoch atomically and keeps each epoch's
weights; a rerun skips finished runs and continues an interrupted one; the results CSV (one row per run and epoch)
is rewritten atomically after every epoch.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from vitviz.analysis.intervals import PERCENT_DIFFERENCE, drop_rounding, t_interval
from vitviz.core.resources import shipped_csv
from vitviz.core.util import cli_errors
from vitviz.experiments.config import (
    TrainConfig,
    name_list,
    positive_float,
)
from vitviz.experiments.sweep import (
    SweepRun,
    add_sweep_options,
    collect_runs,
    fewshot_of_epochs,
    fewshot_results,
    last_epoch_per_seed,
    train_runs,
    write_table,
)

# encoding -> (the shipped ablation model whose architecture is trained, Table 8's row)
ENCODINGS: dict[str, tuple[str, str]] = {
    "none": ("cifar10-vit-nopos", "No Pos. Emb."),
    "1d": ("cifar10-vit-1dpos", "1-D Pos. Emb."),
    "2d": ("cifar10-vit-2dpos", "2-D Pos. Emb."),
}
# the paper's comparisons: (arm, minus arm)
COMPARISONS = (("1d", "none"), ("2d", "none"), ("2d", "1d"))
RESULTS = "data/posemb_seeds/posemb_seeds.csv"
FEWSHOT_NAME = "posemb_seeds_fewshot.csv"  # the default sweep's few-shot table, beside RESULTS
# every committed sweep, by the suffix of its report figure (table8_posemb_seeds<suffix>): 10 seeds at 5,000 images
# and 5 seeds at 15,000 (data/posemb_seeds/README.md); each few-shot table lies beside its results
SWEEPS = {"": RESULTS, "_15k": "data/posemb_seeds/posemb_seeds_15k.csv"}
METRICS = ("test_acc", "train_acc", "fewshot5")  # accuracies in percent


@dataclass
class PosembSeedsConfig:
    """The sweep: every encoding x seed, each a ``TrainConfig`` of its ablation model at one recipe and budget."""

    data: str | None = None
    out: str = "runs/posemb_seeds"
    results: str = RESULTS
    encodings: tuple[str, ...] = tuple(ENCODINGS)
    seeds: tuple[int, ...] = tuple(range(10))
    epochs: int = 8
    warmup_epochs: float = 1.0
    lr: float = 1e-3
    train_subset: int | None = 5_000
    test_subset: int | None = 1_000
    batch_size: int = 128
    device: str = "auto"
    threads: int | None = 1


def run_id(encoding: str, seed: int) -> str:
    """``2d-s3``."""
    return f"{encoding}-s{seed}"


def train_config(cfg: PosembSeedsConfig, encoding: str, seed: int) -> TrainConfig:
    """The ``TrainConfig`` of one run of the sweep."""
    return TrainConfig(
        model=ENCODINGS[encoding][0], data=cfg.data, out=str(Path(cfg.out) / run_id(encoding, seed)),
        epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, warmup_epochs=cfg.warmup_epochs, seed=seed,
        train_subset=cfg.train_subset, test_subset=cfg.test_subset, device=cfg.device, threads=cfg.threads,
        cache=str(Path(cfg.out) / ".cache"), compile=False,
    )


def runs(cfg: PosembSeedsConfig) -> list[SweepRun]:
    """Every run of the sweep, seed by seed (so that a sweep stopped part-way holds whole seeds)."""
    return [SweepRun(run_id(e, s), {"encoding": e, "pos_emb": ENCODINGS[e][1], "seed": s}, train_config(cfg, e, s))
            for s in cfg.seeds for e in cfg.encodings]


def write_results(cfg: PosembSeedsConfig, fingerprint: dict[str, Any] | None = None) -> pd.DataFrame:
    """Rewrite the results CSV (atomically) and its settings JSON from the run folders. ``fingerprint``: the data's
    (``run_fingerprint``; computed when not given), shared by every run of the sweep."""
    from vitviz.zoo.weights import versions

    table = collect_runs(runs(cfg), fingerprint)
    meta = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}
    write_table(cfg.results, table, {"settings": meta, "encodings": ENCODINGS, "versions": versions()})
    return table


def run_sweep(cfg: PosembSeedsConfig, *, progress: bool = False) -> pd.DataFrame:
    """Train every run in turn (resuming any started one); return the results table."""
    from vitviz.experiments.data import run_fingerprint

    fingerprint = run_fingerprint(runs(cfg)[0].config)  # shared by all runs (one subset of one dataset)
    train_runs(runs(cfg), lambda: write_results(cfg, fingerprint), tag="posemb_seeds", progress=progress)
    return write_results(cfg, fingerprint)


def fewshot(cfg: PosembSeedsConfig, *, shots: int = 5, seeds: tuple[int, ...] = (0, 1, 2),
            test_per_class: int = 100, results: str | None = None) -> pd.DataFrame:
    """5-shot linear accuracy of every run's last epoch (``sweep.fewshot_of_epochs``; the comparisons read the last
    epoch), written beside the results CSV and named after it (``sweep.fewshot_results``: ``posemb_seeds.csv`` ->
    ``posemb_seeds_fewshot.csv``, ``posemb_seeds_15k.csv`` -> ``posemb_seeds_15k_fewshot.csv``), one row per run
    and draw; ``results``: another path."""
    table = fewshot_of_epochs(runs(cfg), cfg.data, shots=shots, seeds=seeds, test_per_class=test_per_class,
                              last_only=True)
    path = results or fewshot_results(cfg.results, RESULTS, FEWSHOT_NAME)
    write_table(path, table, {"shots": shots, "draws": list(seeds), "test_per_class": test_per_class,
                              "sweep": str(cfg.results)})
    return table


def read_posemb_seeds(path: str | Path | None = None) -> pd.DataFrame:
    """The measured sweep (one row per run and epoch; see ``data/posemb_seeds/README.md``)."""
    return shipped_csv(path, RESULTS, "run `python -m vitviz.experiments.posemb_seeds --data DIR`")


def read_posemb_seeds_fewshot(path: str | Path | None = None, *, results: str | Path | None = None) -> pd.DataFrame:
    """``posemb_seeds_fewshot.csv`` averaged over the few-shot draws: one row per run and epoch, with ``encoding,
    pos_emb, seed, epoch, fewshot<K>`` (mean K-shot linear top-1 %, K the table's ``shots``: ``fewshot5`` for the
    committed tables and ``--fewshot``) and ``draws``; ready for ``posemb_seed_claims(..., metric="fewshot5")``
    (``fewshot_metric(df)`` names the column). ``results``: instead of ``path``, the results CSV of the sweep
    whose few-shot table to read (the table ``--fewshot`` wrote beside it, ``sweep.fewshot_results``)."""
    if results is not None:
        if path is not None:
            from vitviz.errors import InputError

            raise InputError(f"read_posemb_seeds_fewshot: path={str(path)!r} and results={str(results)!r} both name "
                             "a table; pass path= (the few-shot CSV) or results= (its sweep's results CSV)")
        path = fewshot_results(results, RESULTS, FEWSHOT_NAME)
    raw = shipped_csv(path, str(Path(RESULTS).with_name(FEWSHOT_NAME)),
                      "run `python -m vitviz.experiments.posemb_seeds --data DIR --fewshot` after training")
    return mean_over_draws(raw, ["encoding", "pos_emb", "run_seed", "epoch"], "read_posemb_seeds_fewshot")


def mean_over_draws(raw: pd.DataFrame, keys: list[str], what: str) -> pd.DataFrame:
    """A sweep's few-shot table (one row per run, epoch and draw) averaged over the draws per ``keys`` (the run
    and epoch, ``run_seed`` among them): ``fewshot<K>`` (``K``: the table's ``shots``, so that the name says the
    shot count the accuracies were measured at) and ``draws``, with ``run_seed`` named ``seed``.

    Raises:
        InputError: the table has no ``shots`` column (the name would guess it), holds several shot counts, layers
            or probes (their mean is no one measure); or a run
            does not hold every draw of the table once (a draw missing or repeated): its mean would be over other
            few-shot images than the runs it is paired with; or two runs drew other training images at one draw
            seed, or were scored on other test images (``representations.check_draw_images``). A table without the
            image digests (written before ``linear_fewshot`` recorded them) is read with an
            ``UncheckedImagesWarning``: its runs are paired by draw seed and image counts alone.
    """
    import warnings

    from vitviz.analysis.representations import check_draw_images
    from vitviz.errors import InputError, UncheckedImagesWarning

    for col in ("shots", "layer", "probe"):
        values = sorted(raw[col].unique().tolist()) if col in raw else []
        if len(values) > 1:
            raise InputError(f"{what}: the table holds {col} {values}, whose accuracies would be averaged into one "
                             f"measure; pass the rows of one, e.g. raw[raw.{col} == {values[0]!r}]")
    if "shots" not in raw or raw.empty:
        raise InputError(f"{what}: the table has no shots column ({', '.join(map(str, raw.columns))}), so the shot "
                         "count its accuracies were measured at is unknown; pass the table linear_fewshot wrote "
                         "(or add the column: raw.assign(shots=K))")
    column = f"fewshot{int(raw['shots'].iloc[0])}"
    if "seed" in raw:
        every = sorted(int(d) for d in raw["seed"].unique())
        for key, part in raw.groupby(keys):
            held = sorted(int(d) for d in part["seed"])
            if held != every:
                run = part["model"].iloc[0] if "model" in part else dict(zip(keys, key))
                raise InputError(f"{what}: run {run} at epoch {int(part['epoch'].iloc[0])} holds draws {held}, not "
                                 f"each of {every} once, so its mean is over other few-shot images than the runs it "
                                 "is paired with; measure the missing draws (or drop the repeated rows), or keep the "
                                 "draws every run holds: raw[raw.seed.isin([...])]")
    if "seed" in raw and "model" in raw:
        unchecked = check_draw_images(raw, "model", what)
        if unchecked:
            named = ", ".join(unchecked[:3]) + (f" and {len(unchecked) - 3} more" if len(unchecked) > 3 else "")
            warnings.warn(UncheckedImagesWarning(
                f"{what}: the table does not say which images runs {named} were measured on (no train_digest/"
                "test_digest: written before linear_fewshot recorded them), so nothing checks that they drew the "
                "same training images at each seed and were scored on the same test images; measure the few-shot "
                "accuracy again (--fewshot) to have the images checked"), stacklevel=3)
    g = raw.groupby(keys).accuracy
    out = pd.concat([g.mean().rename(column), g.size().rename("draws")], axis=1).reset_index()
    return out.rename(columns={"run_seed": "seed"})


FEWSHOT_COLUMN = re.compile(r"fewshot([0-9]+)")  # the column mean_over_draws names: fewshot<K>, K the shots


def fewshot_shots(column: Any) -> int | None:
    """The shot count ``K`` of a few-shot accuracy column ``fewshot<K>`` (``mean_over_draws``); None for any other."""
    found = FEWSHOT_COLUMN.fullmatch(str(column))
    return int(found[1]) if found else None


def fewshot_metric(df: pd.DataFrame) -> str:
    """The few-shot accuracy column of a table ``mean_over_draws`` made (``fewshot<K>``, K its shot count).

    Raises:
        InputError: ``df`` holds no such column, or several.
    """
    from vitviz.errors import InputError

    found = [c for c in df.columns if fewshot_shots(c) is not None]
    if len(found) != 1:
        raise InputError(f"df holds {'no' if not found else len(found)} few-shot accuracy columns (fewshot<K>"
                         f"{': ' + ', '.join(found) if found else ''}; columns {', '.join(map(str, df.columns))}); "
                         "pass the table read_posemb_seeds_fewshot() or read_fewshot_by_epoch() returns")
    return found[0]


def posemb_seed_differences(df: pd.DataFrame, metric: str = "test_acc") -> pd.DataFrame:
    """Per training seed, each comparison of ``COMPARISONS`` whose two encodings ``df`` holds, on the last epoch of
    every run: ``measure, arm, minus, seed, arm_value, minus_value, difference`` (``arm_value - minus_value``).

    Raises:
        InputError: ``metric`` is not a column of ``df``; or a run has not reached the last epoch, or the
            encodings do not share their seeds, or a run has two rows at the last epoch
            (``sweep.last_epoch_per_seed``, whose message gives the fix).
    """
    from vitviz.errors import InputError

    if metric not in df:
        raise InputError(f"posemb_seed_claims: metric={metric!r} is not a column of df ({', '.join(df.columns)}); "
                         "pass test_acc or train_acc (read_posemb_seeds()), or fewshot5 (fewshot<K> at K "
                         "shots: read_posemb_seeds_fewshot())")
    last = last_epoch_per_seed(df, ("encoding",), run_id, "posemb_seed_claims")
    per_seed = last.set_index(["encoding", "seed"])[metric].sort_index()
    have = set(last.encoding)
    rows = []
    for arm, minus in COMPARISONS:
        if not {arm, minus} <= have:
            continue
        for seed in sorted(set(last.seed)):
            a, b = float(per_seed.loc[(arm, seed)]), float(per_seed.loc[(minus, seed)])
            rows.append({"measure": metric, "arm": arm, "minus": minus, "seed": int(seed), "arm_value": a,
                         "minus_value": b, "difference": a - b, "epoch": int(last.epoch.max())})
    return pd.DataFrame(rows, columns=["measure", "arm", "minus", "seed", "arm_value", "minus_value", "difference",
                                       "epoch"])


def posemb_seed_claims(df: pd.DataFrame, metric: str = "test_acc") -> pd.DataFrame:
    """Table 8's comparisons on the last epoch of every run, paired by training seed.

    One row per comparison of ``COMPARISONS`` whose two encodings ``df`` holds (1-D minus none, 2-D minus none,
    2-D minus 1-D): ``arm``, ``minus``, their means over seeds (``arm_mean``, ``minus_mean``), ``difference`` (the
    mean of the per-seed differences of ``posemb_seed_differences``, equal to the difference of the means) with
    ``low``/``high`` its 95 % Student-t interval over the seeds (``vitviz.analysis.intervals.t_interval``; NaN with
    one seed), ``excludes_zero`` (the interval lies above or below 0: a difference the seeds resolve), ``paper``
    (Table 8's difference, ImageNet 5-shot, in points), ``seeds``, ``epochs``.

    The paper's finding reads: both encodings minus none exclude zero above, and 2-D minus 1-D does not.

    Raises:
        InputError: as ``posemb_seed_differences``.
    """
    return claims_of_differences(posemb_seed_differences(df, metric))


def claims_of_differences(diffs: pd.DataFrame, pairs: str = "seeds") -> pd.DataFrame:
    """``posemb_seed_claims`` from the per-seed differences ``posemb_seed_differences`` returned (for a caller that
    draws them too, so that they are read once), or from any table of paired differences with its columns
    (``measure, arm, minus, arm_value, minus_value, difference``, ``epoch`` where there is one): ``pairs`` names
    the column that counts the pairs (``"seeds"``; ``"draws"`` for the few-shot draws of
    ``posemb_fewshot.posemb_draw_differences``). An accuracy in percent (``METRICS``, any ``fewshotK``) gets its
    interval cut to the range of a difference of two accuracies. A per-pair difference of rounding size is 0
    (``vitviz.analysis.intervals.drop_rounding``): it is no difference the pairs resolve."""
    from vitviz.zoo.paper import posemb_ablation

    paper = 100 * posemb_ablation().set_index("pos_emb")["default_stem"]
    metric = diffs.measure.iloc[0] if len(diffs) else None
    bounds = PERCENT_DIFFERENCE if metric in METRICS or fewshot_shots(metric) is not None else None
    rows = []
    for (arm, minus), g in diffs.groupby(["arm", "minus"], sort=False):
        mean, low, high = t_interval(drop_rounding(g.difference, g.arm_value, g.minus_value), bounds=bounds)
        row = {"measure": metric, "arm": arm, "minus": minus, "arm_mean": float(g.arm_value.mean()),
               "minus_mean": float(g.minus_value.mean()), "difference": mean, "low": low, "high": high,
               "excludes_zero": bool(low > 0 or high < 0),
               "paper": float(paper[ENCODINGS[arm][1]] - paper[ENCODINGS[minus][1]]), pairs: int(len(g))}
        if "epoch" in g:
            row["epochs"] = int(g.epoch.max())
        rows.append(row)
    return pd.DataFrame(rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vitviz.experiments.posemb_seeds", description=__doc__.split("\n")[0])
    add_sweep_options(p, PosembSeedsConfig)
    p.add_argument("--encodings", type=name_list(ENCODINGS), default=",".join(ENCODINGS),
                   help="comma-separated, of: " + ", ".join(ENCODINGS))
    p.add_argument("--lr", type=positive_float, default=PosembSeedsConfig.lr)
    p.add_argument("--fewshot", action="store_true", help="only measure 5-shot accuracy of each run's last epoch")
    return p


@cli_errors("python -m vitviz.experiments.posemb_seeds")
def main(argv: list[str] | None = None) -> int:
    import torch

    p = parser()
    a = p.parse_args(argv)
    for option, values in (("--encodings", a.encodings), ("--seeds", a.seeds)):
        if not values:
            p.error(f"{option} is empty; pass at least one, comma-separated")
    cfg = PosembSeedsConfig(
        data=a.data, out=a.out, results=a.results, encodings=a.encodings, seeds=a.seeds, epochs=a.epochs,
        warmup_epochs=a.warmup_epochs, lr=a.lr, train_subset=a.train_subset or None,
        test_subset=a.test_subset or None, batch_size=a.batch_size, device=a.device, threads=a.threads,
    )
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.fewshot:
        fewshot(cfg)
        shots = read_posemb_seeds_fewshot(results=cfg.results)
        print(posemb_seed_claims(shots, fewshot_metric(shots)).to_string(), flush=True)
        return 0
    run_sweep(cfg, progress=a.progress)
    print(posemb_seed_claims(read_posemb_seeds(cfg.results)).to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
