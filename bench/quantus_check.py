"""Score vitviz's maps with Quantus's PixelFlipping and RegionPerturbation and compare the method rankings with
vitviz's own deletion AUCs (``vitviz.faithfulness``), on the shipped ``cifar10-vit``.

Quantus (Hedström et al., JMLR 2023) is not a dependency of vitviz; this check runs in its own virtualenv, e.g.::

    python -m venv /tmp/quantus-venv
    echo /path/to/vitviz/.venv/lib/python3.11/site-packages > /tmp/quantus-venv/lib/python3.11/site-packages/shared.pth
    /tmp/quantus-venv/bin/python -m pip install --no-deps quantus==0.6.0
    PYTHONPATH=. /tmp/quantus-venv/bin/python bench/quantus_check.py --images 32

quantus 0.6 calls ``np.trapz``, which NumPy 2.4 removed: this script (and only this script) sets
``np.trapz = np.trapezoid`` before importing quantus (same function, renamed in NumPy 2.0).

What is compared, on the same images and the same maps (``vitviz.explain``, target: the predicted class):

- vitviz ``deletion`` (Petsiuk et al. 2018): target-class probability as the most relevant patches are removed,
  AUC over the removed fraction (one patch per step); lower is better. Twice: ``removal="mean"`` (pixels set to 0 in normalised space,
  the dataset mean) and ``removal="drop"`` (tokens dropped; the default for this model).
- Quantus ``PixelFlipping`` (Bach et al., PLoS ONE 2015): each map upsampled to pixels (nearest: every pixel of a
  patch gets its patch's value), ``features_in_step`` = 16 (Quantus flips the ``(3, H, W)`` features, so one patch's 48 equal values take
  3 steps), ``perturb_baseline``
  = 0.0 in normalised space (the same fill as vitviz's ``mean``), softmax probability; AUC by Quantus
  (trapezoid, unit spacing), divided by the number of steps so it is on vitviz's ``[0, 1]`` scale; lower is better.
- Quantus ``RegionPerturbation`` (Samek et al., IEEE TNNLS 2017), ``patch_size=4`` (the ViT's patch), ``morf``,
  every region: the mean over steps of ``p(x) - p(x_perturbed)`` (AOPC); higher is better.

Rankings are compared by Spearman's rho over the methods (scores oriented so that higher is better). Ties
within a map are broken differently (vitviz: by its own rule; Quantus: ``np.argsort`` order), which matters for
maps with many equal values (saturated rollout).
Writes ``bench/results/quantus_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

np.trapz = np.trapezoid  # quantus 0.6 calls np.trapz, removed in NumPy 2.4 (renamed np.trapezoid in 2.0)

import quantus  # noqa: E402
import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import vitviz  # noqa: E402
from vitviz.analysis.explain import GRADIENT_METHODS  # noqa: E402
from vitviz.analysis.faithfulness import faithfulness, faithfulness_auc  # noqa: E402

METHODS = ["attnlrp", "chefer", "grad_rollout", "rollout", "attention", "integrated_gradients", "input_x_gradient", "gradcam",
           "random"]


def test_images(root: Path, n: int) -> list[str]:
    """``n`` test images, the same number from each class (round robin over the class folders)."""
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    files = [sorted(c.glob("*.jpg")) for c in classes]
    out, k = [], 0
    while len(out) < n:
        for f in files:
            if k < len(f) and len(out) < n:
                out.append(str(f[k]))
        k += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--data", default=os.environ.get("VITVIZ_DATA", "../shared/data/cifar10"))
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--out", default="bench/results/quantus_check.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    t0 = time.time()
    model = vitviz.load_model("cifar10-vit")
    spec = vitviz.inspect(model)
    x = vitviz.load_images(model, test_images(Path(args.data) / "test", args.images))
    with torch.no_grad():
        pred = model(x).argmax(-1)
    sh, sw = spec.patch_size
    x_np, y_np = x.numpy(), pred.numpy()
    scores: dict[str, dict[str, float]] = {}
    for method in args.methods:
        tgt = pred if method in GRADIENT_METHODS else None
        maps = vitviz.explain(model, x, method, tgt).detach()
        a = maps.repeat_interleave(sh, 1).repeat_interleave(sw, 2)[:, None].numpy().astype(np.float32)
        # quantus checks features_in_step against H * W but flips over the (3, H, W) features: 3 steps per patch
        pf = quantus.PixelFlipping(features_in_step=sh * sw, perturb_baseline=0.0, normalise=False, abs=False,
                                   return_auc_per_sample=True, disable_warnings=True)
        auc = np.asarray(pf(model=model, x_batch=x_np, y_batch=y_np, a_batch=a, channel_first=True, softmax=True,
                            device="cpu", batch_size=64), dtype=np.float64)
        flips = 3 * x_np.shape[-2] * x_np.shape[-1] // (sh * sw)
        steps = spec.num_patches
        rp = quantus.RegionPerturbation(patch_size=sh, order="morf", regions_evaluation=steps, perturb_baseline=0.0,
                                        normalise=False, abs=False, disable_warnings=True)
        curves = np.asarray(rp(model=model, x_batch=x_np, y_batch=y_np, a_batch=a, channel_first=True,
                               softmax=True, device="cpu", batch_size=64), dtype=np.float64)
        scores[method] = {"quantus_pixel_flipping_auc": float((auc / (flips - 1)).mean()),
                          "quantus_region_perturbation_aopc": float(curves.mean())}
        print(method, scores[method], flush=True)
    for removal in ("mean", "drop"):
        df = faithfulness(model, x, args.methods, modes=["deletion"], steps=1 / spec.num_patches, removal=removal,
                          progress=False)
        auc = faithfulness_auc(df)
        for _, row in auc.iterrows():
            scores[row["method"]][f"vitviz_deletion_auc_{removal}"] = float(row["auc"])
    methods = list(scores)

    def col(key: str, sign: float) -> np.ndarray:
        return sign * np.array([scores[m][key] for m in methods])  # oriented: higher is better

    ref = {"vitviz_deletion_auc_mean": col("vitviz_deletion_auc_mean", -1),
           "vitviz_deletion_auc_drop": col("vitviz_deletion_auc_drop", -1)}
    other = {"quantus_pixel_flipping_auc": col("quantus_pixel_flipping_auc", -1),
             "quantus_region_perturbation_aopc": col("quantus_region_perturbation_aopc", 1)}
    rho = {f"{a} vs {b}": float(spearmanr(ra, rb).statistic) for a, ra in ref.items() for b, rb in other.items()}
    ranking = {k: [methods[i] for i in np.argsort(-v, kind="stable")] for k, v in {**ref, **other}.items()}
    result = {
        "model": "cifar10-vit", "images": int(len(x)), "methods": methods, "scores": scores,
        "ranking_best_first": ranking, "spearman_between_rankings": rho,
        "settings": {"pixel_flipping": {"features_in_step": sh * sw, "perturb_baseline": 0.0,
                                        "auc": "quantus trapezoid / (steps - 1)"},
                     "region_perturbation": {"patch_size": sh, "order": "morf", "regions_evaluation": steps,
                                             "perturb_baseline": 0.0},
                     "vitviz_deletion": {"steps": f"1/{spec.num_patches}", "removal": ["mean", "drop"]},
                     "numpy_patch": "np.trapz = np.trapezoid (quantus 0.6 on NumPy 2.4)"},
        "versions": {"quantus": quantus.__version__, "numpy": np.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "seconds": round(time.time() - t0, 1),
        "command": f"PYTHONPATH=. /tmp/quantus-venv/bin/python bench/quantus_check.py --images {args.images}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"ranking_best_first": ranking, "spearman_between_rankings": rho}, indent=2))


if __name__ == "__main__":
    main()
