"""Small-scale hybrid-versus-pure study (the ViT paper's Fig. 5 at CIFAR-10 scale).

``python -m vitviz.experiments.study hybrid-vs-pure --data DIR`` trains, with the project's training runner, a grid of sizes
for each family -- pure ViT (patch 4), hybrid (a convolutional stem feeding the same transformer at patch 1) and
ResNet -- each at several epoch budgets, and records test accuracy against training compute (forward + backward
FLOPs per image from ``FlopCounterMode`` x images seen), wall time, device and versions.

Resumable: results go to one CSV (one row per finished run, rewritten atomically); a rerun skips finished runs
and a run killed half-way continues from its last epoch checkpoint. ``--smoke`` runs one tiny run per family.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from vitviz.core.io import atomic_write_json, atomic_write_text
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
    epochs: Sequence[int] = (2, 5)
    train_subset: int | None = 10_000
    test_subset: int | None = 2_000
    batch_size: int = 128
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def smoke(cls, **kw: Any) -> StudyConfig:
        """One tiny run per family: for tests and a first look."""
        return cls(**{"sizes": ("S",), "epochs": (1,), "train_subset": 200, "test_subset": 100, "batch_size": 50,
                      **kw})


def plan(cfg: StudyConfig) -> list[dict[str, Any]]:
    """Every run of the study, cheapest budgets first, as ``run_id``, family, size, epochs and model kwargs."""
    runs = []
    for epochs in sorted(cfg.epochs):
        for size in cfg.sizes:
            for fam in cfg.families:
                runs.append({"run_id": f"{fam}-{size}-e{epochs}", "family_key": fam, "size": size,
                             "epochs": int(epochs), "model_kwargs": SIZES[size][fam]})
    return runs


DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / "data" / "study" / "hybrid_vs_pure.csv"


def read_results(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """The study CSV (default: the committed ``data/study/hybrid_vs_pure.csv``); empty frame when absent."""
    path = Path(path) if path is not None else DEFAULT_RESULTS
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()


def _train_config(cfg: StudyConfig, run: dict[str, Any]) -> TrainConfig:
    arch = FAMILIES[run["family_key"]][0]
    return TrainConfig(
        model=arch, data=cfg.data, out=str(Path(cfg.out) / run["run_id"]), epochs=run["epochs"],
        batch_size=cfg.batch_size, warmup_epochs=min(3.0, 0.2 * run["epochs"]), seed=cfg.seed,
        train_subset=cfg.train_subset, test_subset=cfg.test_subset, device=cfg.device, threads=cfg.threads,
        model_kwargs=dict(run["model_kwargs"]), cache=str(Path(cfg.out) / ".cache"),
    )


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
        "note": "wall_time_s was measured on a shared 2-core machine (other jobs running): compare compute, "
                "not wall time",
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
    table = read_results(results)
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
            "wall_time_s": summary["train_time_s"], "device": summary["device"], "seed": cfg.seed,
            **{f"{k}_version": v for k, v in versions().items()},
        }
        table = pd.concat([table, pd.DataFrame([row])], ignore_index=True)
        buf = io.StringIO()
        table.to_csv(buf, index=False)
        atomic_write_text(results, buf.getvalue())
        write_meta(cfg, table)
        if on_run is not None:
            on_run(row)
    return table


def _pair_key(model: str) -> str:
    return model.replace("R50x1+", "").replace("hybrid-", "").replace("vit-", "")


def hybrid_gap(df: pd.DataFrame, metric: str = "test_acc", x: str = "train_pflops") -> pd.DataFrame:
    """Hybrid minus pure ViT at the same transformer size and budget, with the compute of each.

    Works for the paper's Table 6 (``metric="imagenet"``, ``x="exaflops"``; ``R50x1+ViT-B/32`` pairs with
    ``ViT-B/32``) and for a measured study (``hybrid-S`` pairs with ``vit-S``).

    Returns:
        One row per pair: ``pair``, ``epochs``, ``vit``, ``hybrid`` (the metric), ``gap`` (hybrid - vit, points),
        ``vit_<x>``, ``hybrid_<x>``, sorted by the ViT's compute.
    """
    vit = df[df["family"].str.startswith("Transformer")]
    hyb = df[df["family"].str.startswith("Hybrid")]
    rows = []
    for _, h in hyb.iterrows():
        match = vit[(vit["model"].map(_pair_key) == _pair_key(h["model"])) & (vit["epochs"] == h["epochs"])]
        if len(match):
            v = match.iloc[0]
            rows.append({"pair": _pair_key(h["model"]), "epochs": h["epochs"], "vit": v[metric],
                         "hybrid": h[metric], "gap": h[metric] - v[metric], f"vit_{x}": v[x], f"hybrid_{x}": h[x]})
    return pd.DataFrame(rows).sort_values(f"vit_{x}").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vitviz.experiments.study", description=__doc__.split("\n\n")[0])
    p.add_argument("study", choices=["hybrid-vs-pure"])
    p.add_argument("--data", help="dataset root with train/ and test/ (default: $VITVIZ_DATA)")
    p.add_argument("--out", default="runs/study", help="run folders (checkpoints; not committed)")
    p.add_argument("--results", default="data/study/hybrid_vs_pure.csv", help="results CSV (one row per run)")
    p.add_argument("--smoke", action="store_true", help="one tiny run per family")
    p.add_argument("--sizes", default="S,M,L")
    p.add_argument("--epochs", default="2,5", help="epoch budgets, comma-separated")
    p.add_argument("--train-subset", type=int, default=10_000)
    p.add_argument("--test-subset", type=int, default=2_000)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    common = {"data": a.data, "out": a.out, "results": a.results, "device": a.device, "threads": a.threads}
    if a.smoke:
        cfg = StudyConfig.smoke(**common)
    else:
        cfg = StudyConfig(sizes=tuple(a.sizes.split(",")), epochs=tuple(int(e) for e in a.epochs.split(",")),
                          train_subset=a.train_subset or None, test_subset=a.test_subset or None, **common)
    table = run_study(cfg, progress=not a.no_progress)
    cols = ["run_id", "params", "train_pflops", "test_acc", "wall_time_s"]
    print(table[cols].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
