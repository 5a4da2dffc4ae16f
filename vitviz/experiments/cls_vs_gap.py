"""Class token versus global average pooling (the ViT paper's App. D.3, Fig. 9) at CIFAR-10 scale.

Dosovitskiy et al. (ICLR 2021), App. D.3 "Head type and class token": a ViT classifying from the class token and
one classifying from the global average of the patch tokens (GAP, no class token) "both work similarly well, but
require different learning-rates" (Fig. 9: class token at lr 8e-4; GAP at 8e-4 does poorly, at 3e-4 it matches).

``python -m vitviz.experiments.cls_vs_gap --data DIR`` trains the reference recipe (``cifar10-vit``, the project's
training runner) with each head at the paper's two learning-rate regimes scaled to this recipe: the recipe's own
rate (1e-3, the regime of the paper's 8e-4) and that rate times the paper's ratio 3/8 (3.75e-4, the regime of its
3e-4). The GAP model is timm's ``VisionTransformer(class_token=False, global_pool="avg", fc_norm=False)``: the final
LayerNorm is applied to every token and the normalised patch tokens are averaged, as in the paper's code
(``classifier="gap"``: the encoder's final norm, then the mean over tokens). timm's default for ``global_pool="avg"``
(``fc_norm=True``) would instead average first and normalise after.

Resumable (``vitviz.experiments.sweep``): every run checkpoints each epoch atomically (``train``'s ``last.pt``) and
keeps each epoch's weights (``epochs/epoch_NNN.pt``, for measuring few-shot accuracy per epoch afterwards); a rerun
skips finished runs and continues an interrupted one from its last epoch. After every epoch the results CSV (one row
per run and epoch) is rewritten atomically from all run folders, so it always holds every finished epoch.
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from vitviz.analysis.intervals import PERCENT_DIFFERENCE, t_interval
from vitviz.core.io import atomic_write_text
from vitviz.core.resources import shipped_csv
from vitviz.core.util import cli_errors
from vitviz.experiments.config import (
    TrainConfig,
    name_list,
    positive_float_list,
)
from vitviz.experiments.data import run_fingerprint
from vitviz.experiments.posemb_seeds import fewshot_shots, mean_over_draws
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
from vitviz.zoo.weights import versions

# head type -> model_kwargs of cifar10-vit (timm VisionTransformer arguments)
HEADS: dict[str, dict[str, Any]] = {
    "cls": {},
    "gap": {"class_token": False, "global_pool": "avg", "fc_norm": False},
}
RECIPE_LR = 1e-3  # cifar10-vit's recipe (TrainConfig.lr)
PAPER_LRS = (8e-4, 3e-4)  # Fig. 9's two regimes
LRS = (RECIPE_LR, RECIPE_LR * PAPER_LRS[1] / PAPER_LRS[0])  # 1e-3 and 3.75e-4
RESULTS = "data/cls_vs_gap/cls_vs_gap.csv"
PERCENT_METRICS = ("test_acc", "train_acc")  # accuracies in percent (their differences lie in +-100), and fewshot<K>


@dataclass
class ClsGapConfig:
    """The sweep: every head x learning rate x seed, each a ``TrainConfig`` of ``cifar10-vit``."""

    data: str | None = None
    out: str = "runs/cls_vs_gap"
    results: str = RESULTS
    heads: tuple[str, ...] = ("cls", "gap")
    lrs: tuple[float, ...] = LRS
    seeds: tuple[int, ...] = (0,)
    epochs: int = 8
    warmup_epochs: float = 1.0
    train_subset: int | None = 10_000
    test_subset: int | None = 2_000
    batch_size: int = 128
    device: str = "auto"
    threads: int | None = 1


def run_id(head: str, lr: float, seed: int) -> str:
    """``gap-lr0.000375-s0``."""
    return f"{head}-lr{lr:g}-s{seed}"


def train_config(cfg: ClsGapConfig, head: str, lr: float, seed: int) -> TrainConfig:
    """The ``TrainConfig`` of one run of the sweep."""
    return TrainConfig(
        model="cifar10-vit", data=cfg.data, out=str(Path(cfg.out) / run_id(head, lr, seed)), epochs=cfg.epochs,
        batch_size=cfg.batch_size, lr=lr, warmup_epochs=cfg.warmup_epochs, seed=seed,
        train_subset=cfg.train_subset, test_subset=cfg.test_subset, device=cfg.device, threads=cfg.threads,
        model_kwargs=dict(HEADS[head]), cache=str(Path(cfg.out) / ".cache"), compile=False,
    )


def runs(cfg: ClsGapConfig) -> list[SweepRun]:
    """Every run of the sweep: head x learning rate x seed."""
    return [SweepRun(run_id(head, lr, seed), {"head": head, "lr": lr, "seed": seed}, train_config(cfg, head, lr, seed))
            for head in cfg.heads for lr in cfg.lrs for seed in cfg.seeds]


def collect(cfg: ClsGapConfig, fingerprint: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per (run, finished epoch), read from every run folder (``sweep.collect_runs``); a run folder trained
    otherwise than ``cfg`` says is refused (``sweep.check_run_folder``), never labelled with ``cfg``'s settings.

    ``fingerprint``: the data's (``run_fingerprint``), computed here when not given.
    """
    return collect_runs(runs(cfg), fingerprint)


def write_results(cfg: ClsGapConfig, fingerprint: dict[str, Any] | None = None) -> pd.DataFrame:
    """Rewrite the results CSV (atomically) and its settings JSON from the run folders (``collect``)."""
    table = collect(cfg, fingerprint)
    meta = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}
    write_table(cfg.results, table, {"settings": meta, "heads": HEADS, "paper_lrs": list(PAPER_LRS),
                                     "versions": versions()})
    return table


def run_sweep(cfg: ClsGapConfig, *, progress: bool = False) -> pd.DataFrame:
    """Train every run in turn (resuming any started one); return the results table."""
    fingerprint = run_fingerprint(train_config(cfg, cfg.heads[0], cfg.lrs[0], cfg.seeds[0]))  # shared by all runs
    train_runs(runs(cfg), lambda: write_results(cfg, fingerprint), tag="cls_vs_gap", progress=progress)
    return write_results(cfg, fingerprint)


def read_cls_vs_gap(path: str | Path | None = None) -> pd.DataFrame:
    """The measured class-token-versus-GAP sweep (one row per run and epoch; see ``data/cls_vs_gap/README.md``)."""
    return shipped_csv(path, RESULTS, "run `python -m vitviz.experiments.cls_vs_gap --data DIR`")


def fewshot_by_epoch(cfg: ClsGapConfig, *, shots: int = 5, seeds: tuple[int, ...] = (0, 1, 2),
                     test_per_class: int = 100, results: str | None = None) -> pd.DataFrame:
    """5-shot linear accuracy (Fig. 9's measure) of every kept epoch's weights, written beside the results CSV.

    Few-shot images come from the training folder (``seeds`` draws), scored on the first ``test_per_class``
    test images of each class. Returns one row per run, epoch and draw, written to ``results`` or beside the
    results CSV (``sweep.fewshot_results``: ``fewshot_by_epoch.csv`` for the default sweep, ``<stem>_fewshot.csv``
    for another, such as ``cls_vs_gap_15k_fewshot.csv``, so that one sweep's table never overwrites another's).
    """
    table = fewshot_of_epochs(runs(cfg), cfg.data, shots=shots, seeds=seeds, test_per_class=test_per_class)
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    atomic_write_text(results or fewshot_results(cfg.results, RESULTS, "fewshot_by_epoch.csv"), buf.getvalue())
    return table


def cls_vs_gap_claims(df: pd.DataFrame, metric: str = "test_acc") -> pd.DataFrame:
    """The paper's App. D.3 statements, tested on the last epoch of every run (mean over seeds):

    - per head, the best learning rate and its accuracy (``best_lr``, ``best``), and the accuracy at each rate;
    - ``gap_best`` = best GAP minus best class token (the paper: "both work similarly well"), with
      ``gap_best_low``/``gap_best_high``: its 95% Student-t interval *paired by seed* (per seed, the GAP run at GAP's
      best rate minus the class-token run at the class token's best rate, the rates chosen on the seed means;
      ``vitviz.analysis.intervals.t_interval``); NaN with one seed. The seed is the unit: both heads of one seed
      read the same training subset, test subset and seeded order, so the pairing takes out what the seeds share;
    - ``gap_at_cls_lr`` (``_low``/``_high`` likewise): GAP minus class token at the class token's best rate (the
      paper: GAP does poorly at the class token's rate); NaN when GAP was not trained at that rate;
    - ``same_best_lr``: whether both heads do best at the same rate (the paper: they "require different
      learning-rates"; GAP fails at the class token's rate);
    - ``lr_effect``: per head, accuracy at the recipe's rate minus at the lower rate.

    Raises:
        InputError: a run (head, learning rate, seed) has not reached the last epoch: its rate would drop out of the
            comparison without a word (and could move ``best_lr``); the message names the runs and the epoch every
            run reached, to compare at with ``df[df.epoch <= k]``. Or the runs do not share their seeds (a seed
            trained for some head and rate only): the seed means would average different seeds and the pairing
            would drop some; the message names the missing runs. Or two learning rates print alike (``:g``, one run
            id) but differ in their last bits (``0.000375`` typed, ``1e-3 * 3 / 8`` computed): one run would count
            as two rates. Or a run has two rows at the last epoch (its seed would count twice).
    """
    from vitviz.errors import InputError

    by_id: dict[str, list[float]] = {}  # the rates by the name run_id gives them
    for lr in sorted(df.lr.unique()):
        by_id.setdefault(f"{lr:g}", []).append(float(lr))
    twins = [rates for rates in by_id.values() if len(rates) > 1]
    if twins:
        raise InputError(f"learning rates {', '.join(' and '.join(map(repr, t)) for t in twins)} differ "
                         "only in their last bits (the same run id), so one run would count as two rates; write "
                         "each as the rate its run was trained at, e.g. df.assign(lr=df.lr.map(lambda x: "
                         f"min(LRS, key=lambda r: abs(r - x)))) with LRS = {LRS!r}")
    last = last_epoch_per_seed(df, ("head", "lr"), run_id, "cls_vs_gap_claims")
    mean = last.groupby(["head", "lr"])[metric].mean().unstack("lr")
    rows = []
    for head, accs in mean.iterrows():
        best_lr = float(accs.idxmax())
        rows.append({"head": head, **{f"{metric}@lr={lr:g}": float(v) for lr, v in accs.items()},
                     "best_lr": best_lr, "best": float(accs.max()),
                     "lr_effect": float(accs[max(accs.index)] - accs[min(accs.index)]),
                     "epochs": int(df.epoch.max()), "seeds": int(last.seed.nunique())})
    out = pd.DataFrame(rows)
    if {"cls", "gap"} <= set(out["head"]):
        b = out.set_index("head")
        per_seed = last.set_index(["head", "lr", "seed"])[metric].sort_index()
        cls_lr = b.loc["cls", "best_lr"]
        bounds = PERCENT_DIFFERENCE if metric in PERCENT_METRICS or fewshot_shots(metric) is not None else None
        for name, gap_lr in (("gap_best", b.loc["gap", "best_lr"]), ("gap_at_cls_lr", cls_lr)):
            if ("gap", gap_lr) not in per_seed.index:  # GAP never trained at the class token's rate
                out[name] = out[f"{name}_low"] = out[f"{name}_high"] = float("nan")
                continue
            diff = per_seed.loc[("gap", gap_lr)] - per_seed.loc[("cls", cls_lr)]  # aligned on the seed
            out[name], out[f"{name}_low"], out[f"{name}_high"] = t_interval(diff.to_numpy(), bounds=bounds)
        out["same_best_lr"] = bool(b.loc["gap", "best_lr"] == cls_lr)
    return out


def read_fewshot_by_epoch(path: str | Path | None = None) -> pd.DataFrame:
    """``fewshot_by_epoch.csv`` averaged over the few-shot draws: one row per run and epoch, with ``head, lr, seed,
    epoch, fewshot5`` (mean 5-shot linear top-1 %, Fig. 9's measure; ``fewshot<K>`` for a table of K shots) and
    ``draws``; ready for ``plot_cls_vs_gap(..., metric="fewshot5")`` and ``cls_vs_gap_claims(..., metric="fewshot5")``. A run missing a
    draw (or holding one twice) is refused (``posemb_seeds.mean_over_draws``)."""
    raw = shipped_csv(path, str(Path(RESULTS).with_name("fewshot_by_epoch.csv")),
                      "run `python -m vitviz.experiments.cls_vs_gap --data DIR --fewshot` after training")
    return mean_over_draws(raw, ["head", "lr", "run_seed", "epoch"], "read_fewshot_by_epoch")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vitviz.experiments.cls_vs_gap", description=__doc__.split("\n")[0])
    add_sweep_options(p, ClsGapConfig)
    p.add_argument("--heads", type=name_list(HEADS), default="cls,gap", help="comma-separated, of: cls, gap")
    # repr, not :g: the default is LRS to the last bit (3.75e-4 is 0.00037499999999999995), so that runs started
    # without --lrs and runs of the sweep's code carry one rate, and resume each other's folders
    p.add_argument("--lrs", type=positive_float_list, default=",".join(repr(x) for x in LRS),
                   help="learning rates, comma-separated (default: %(default)s)")
    p.add_argument("--fewshot", action="store_true", help="only measure 5-shot accuracy of the kept epochs")
    return p


@cli_errors("python -m vitviz.experiments.cls_vs_gap")
def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    for option, values in (("--heads", a.heads), ("--lrs", a.lrs), ("--seeds", a.seeds)):
        if not values:
            p.error(f"{option} is empty; pass at least one, comma-separated")
    cfg = ClsGapConfig(
        data=a.data, out=a.out, results=a.results, heads=a.heads, lrs=a.lrs, seeds=a.seeds,
        epochs=a.epochs, warmup_epochs=a.warmup_epochs, train_subset=a.train_subset or None,
        test_subset=a.test_subset or None, batch_size=a.batch_size, device=a.device, threads=a.threads,
    )
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.fewshot:
        print(fewshot_by_epoch(cfg).groupby(["head", "lr", "epoch"]).accuracy.mean().to_string(), flush=True)
        return 0
    print(run_sweep(cfg, progress=a.progress).to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
