"""Faithfulness of every map on cifar10-vit: AUCs with intervals and paired differences against chefer.

The images and labels are those of notebooks/04_faithfulness.ipynb (``example_images``, taken in turn from each
class). Resumable: the curves go to ``<out>/curves.csv`` (``faithfulness(..., out=)``, not committed); a rerun
continues. Writes ``auc.csv``, ``paired_vs_chefer.csv``, ``paired_vs_random.csv`` and ``chefer_convention.csv``.

    VITVIZ_DATA=/work/shared/data/cifar10 python bench/faithfulness_eval.py --n 500 --out bench/results/faithfulness
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import vitviz
from vitviz.analysis.faithfulness import DEFAULT_METHODS
from vitviz.zoo.samples import example_images, resolve_test_folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--out", default="bench/results/faithfulness")
    ap.add_argument("--flow", action="store_true", help="add attention flow (slow)")
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--interval", choices=("t", "bootstrap"), default="t",
                    help="interval of a mean over images (docs/explain.md's tables: bootstrap)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    vit = vitviz.load_model("cifar10-vit").eval()
    folder = resolve_test_folder(None)
    images = example_images(folder, args.n)
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    labels = [classes.index(name) for name in images.labels]
    methods = list(DEFAULT_METHODS) + (["flow"] if args.flow else [])
    start = time.perf_counter()
    df = vitviz.faithfulness(vit, images.images, methods, labels=labels, batch_size=args.batch_size,
                             out=out / "curves.csv", progress=False)
    print(f"{args.n} images x {len(methods)} methods ({df['removal'].iloc[0]}): {time.perf_counter() - start:.0f} s")
    auc = vitviz.faithfulness_auc(df, interval=args.interval)
    auc.to_csv(out / "auc.csv", index=False)
    paired = vitviz.compare_methods(df, baseline="chefer", interval=args.interval)
    paired.to_csv(out / "paired_vs_chefer.csv", index=False)
    vitviz.compare_methods(df, baseline="random", interval=args.interval).to_csv(out / "paired_vs_random.csv",
                                                                                index=False)
    # Chefer et al.'s convention: accuracy AUC up to the step 0.9, x100 (positive and negative perturbation)
    chefer = vitviz.faithfulness_auc(df[df["mode"].isin(["positive", "negative"])], interval=args.interval, upto=0.9)
    chefer.assign(auc_x100=chefer["auc"] * 100).to_csv(out / "chefer_convention.csv", index=False)
    pd_opts = dict(index=False, float_format=lambda v: f"{v:.4f}")
    print(auc.to_string(**pd_opts))
    print(paired.drop(columns=["baseline", "removal", "better"]).to_string(**pd_opts))


if __name__ == "__main__":
    main()
