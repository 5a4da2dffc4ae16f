"""AttnLRP against Chefer et al. on the shipped ``cifar10-vit``: perturbation AUCs and paired bootstrap differences,
plus one ``explain`` call's time for each.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/attnlrp_faithfulness.py --data ../shared/data/cifar10/test

Images: every 156th JPEG of the sorted test folder, the first ``--n`` (64). Tokens are dropped (``removal="auto"``);
the AUC per image is the trapezoid over the fractions of patches actually removed at the 11 steps (column ``removed``,
``per_image_auc``); the interval is a 95% bootstrap over images of the paired difference attnlrp - chefer (2,000
resamples, seed 0).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import vitviz
from vitviz.analysis.faithfulness_stats import per_image_auc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    model = vitviz.load_model("cifar10-vit").eval()
    root = Path(a.data)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = sorted(root.rglob("*.jpg"))[::156][: a.n]
    labels = [classes.index(f.parent.name) for f in files]
    x = vitviz.load_images(model, [str(f) for f in files])
    times: dict[str, list[float]] = {"attnlrp": [], "chefer": []}
    for _ in range(a.repeats):  # interleaved
        for method in times:
            t = time.perf_counter()
            vitviz.explain(model, x, method)
            times[method].append(time.perf_counter() - t)
    for method, ts in times.items():
        print(f"explain({method!r}) on {len(x)} images: median {statistics.median(ts):.3f} s, min {min(ts):.3f} s")
    df = vitviz.faithfulness(model, x, ("chefer", "attnlrp"), labels=labels, progress=False)
    rng = np.random.default_rng(0)
    per_image = per_image_auc(df)  # each image's trapezoid over the fractions of patches actually removed
    for mode in ("deletion", "insertion", "positive", "negative"):
        d = per_image[per_image["mode"] == mode]
        auc = {m: d[d["method"] == m].sort_values("image")["auc"].to_numpy() for m in ("chefer", "attnlrp")}
        diff = auc["attnlrp"] - auc["chefer"]
        boots = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(2000)]
        lo, hi = np.percentile(boots, [2.5, 97.5])
        print(f"{mode:9s} attnlrp {auc['attnlrp'].mean():.3f}  chefer {auc['chefer'].mean():.3f}  "
              f"paired difference {diff.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]")


if __name__ == "__main__":
    main()
