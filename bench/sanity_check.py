"""Adebayo et al.'s sanity checks (``vitviz.sanity_checks``) of every ``vitviz.explain`` method but flow on the
shipped ``cifar10-vit``: the verdict table, the tidy per-image table and the cascading / independent figures.

    PYTHONPATH=. python bench/sanity_check.py --images 20

Writes ``bench/results/sanity_check.json`` (summary and settings), ``sanity_check.csv`` (every value) and
``sanity_check_{cascading,independent}.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

import vitviz  # noqa: E402
from vitviz.plot.style import save_figure  # noqa: E402


def test_images(root: Path, n: int) -> list[str]:
    """``n`` test images, the same number from each class (round robin over the class folders)."""
    files = [sorted(c.glob("*.jpg")) for c in sorted(p for p in root.iterdir() if p.is_dir())]
    out, k = [], 0
    while len(out) < n:
        out += [str(f[k]) for f in files if k < len(f)][: n - len(out)]
        k += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--data", default=os.environ.get("VITVIZ_DATA", "../shared/data/cifar10"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/sanity_check")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    model = vitviz.load_model("cifar10-vit")
    x = vitviz.load_images(model, test_images(Path(args.data) / "test", args.images))
    df = vitviz.sanity_checks(model, x, seed=args.seed)
    summary = vitviz.sanity_summary(df)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(f"{out}.csv", index=False, float_format="%.6g")
    for test in ("cascading", "independent"):
        ax = vitviz.plot_sanity_checks(df, test=test)
        save_figure(ax.figure, f"{out}_{test}", formats=("png",))
    records = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
               for r in summary.reset_index().to_dict(orient="records")]  # nan -> null: strict JSON
    result = {"model": "cifar10-vit", "images": len(x), "seed": args.seed, "summary": records, "threshold": summary.attrs["threshold"], "decision_step": summary.attrs["decision_step"],
        "seconds": round(time.time() - t0, 1), "torch_threads": torch.get_num_threads(),
        "command": f"PYTHONPATH=. python bench/sanity_check.py --images {args.images}"}
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(summary.round(3).to_string())


if __name__ == "__main__":
    main()
