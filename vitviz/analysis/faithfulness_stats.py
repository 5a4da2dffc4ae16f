"""Areas under the faithfulness curves, their bootstrap intervals, and paired comparisons of methods.

Every method of a ``vitviz.faithfulness`` run sees the same images, so two methods are compared on the per-image
difference of their AUCs, resampling images jointly (a paired bootstrap): ``compare_methods``. Comparing each
method's marginal interval (``faithfulness_auc``) ignores that pairing: two intervals may overlap while the paired
difference is clearly non-zero (between-image variance cancels in the difference). A method is called better or
worse than another only when the paired interval of the difference excludes zero; otherwise the two are
indistinguishable on these images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vitviz.errors import InputError

__all__ = ["BETTER", "MODES", "bootstrap_ci", "compare_methods", "faithfulness_auc", "per_image_auc"]

MODES = ("positive", "negative", "deletion", "insertion")
BETTER = {"positive": "lower", "negative": "higher", "deletion": "lower", "insertion": "higher"}
CURVE_KEY = ["image", "method", "mode", "fraction", "metric", "removal"]
GROUP = ["method", "mode", "metric", "removal"]


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                 statistic: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (or ``statistic`` over axis 1) of ``values``, resampling them.

    Args:
        values: one value per unit (image).
        n_boot: resamples.
        ci: coverage, e.g. 0.95.
        seed: the generator's seed (same seed and number of values, same resamples).
        statistic: ``f(resamples (n_boot, n)) -> (n_boot,)``; default the mean.

    Returns:
        ``(low, high)``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) == 0:
        raise InputError(f"bootstrap_ci needs a non-empty 1-D set of values, got shape {v.shape}")
    if not 0 < ci < 1:
        raise InputError(f"ci={ci!r} must lie in (0, 1), e.g. 0.95")
    rng = np.random.default_rng(seed)
    samples = v[rng.integers(0, len(v), size=(n_boot, len(v)))]
    stats = samples.mean(axis=1) if statistic is None else statistic(samples)
    lo, hi = np.quantile(stats, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return float(lo), float(hi)


def check_curves(df: Any) -> None:
    """Refuse a curves frame with missing columns or repeated ``(image, method, mode, fraction, metric, removal)``."""
    missing = [c for c in CURVE_KEY + ["score"] if c not in df.columns]
    if missing:
        raise InputError(f"df lacks the columns {missing}; pass the DataFrame of vitviz.faithfulness")
    dup = df.duplicated(CURVE_KEY, keep=False)
    if dup.any():
        r = df[dup].iloc[0]
        raise InputError(
            f"df holds {int(dup.sum())} rows that repeat an (image, method, mode, fraction, metric, removal), e.g. "
            f"image {r['image']!r}, {r['method']}/{r['mode']} at fraction {r['fraction']}: the same image ids appear "
            "more than once, as when runs that each number their images from 0 are concatenated. Give each run its "
            "own ids (vitviz.faithfulness(..., image_offset=<images in the earlier runs>) or image_ids=[...]), or "
            "drop a repeated run with df.drop_duplicates(subset=[...])")


def per_image_auc(df: Any, *, upto: float = 1.0) -> Any:
    """The area under each image's curve (trapezoid over the fraction axis ``[0, upto]``).

    Args:
        df: the DataFrame of ``vitviz.faithfulness`` (several runs concatenated, with distinct image ids).
        upto: integrate over fractions ``[0, upto]`` only.

    Returns:
        DataFrame with columns ``image``, ``method``, ``mode``, ``metric``, ``removal``, ``auc``.
    """
    import pandas as pd

    check_curves(df)
    df = df[df["fraction"] <= upto + 1e-9]
    parts = []
    for (method, mode, metric, removal), g in df.groupby(GROUP, sort=False):
        grid = g.pivot(index="image", columns="fraction", values="score").sort_index(axis=1)
        if grid.isna().to_numpy().any():
            raise InputError(f"the curves of {method}/{mode} do not share their fractions across images (runs with "
                             "different steps= cannot be mixed)")
        y, xs = grid.to_numpy(dtype=np.float64), grid.columns.to_numpy(dtype=np.float64)
        auc = ((y[:, 1:] + y[:, :-1]) / 2 * np.diff(xs)).sum(axis=1)  # trapezoid
        parts.append(pd.DataFrame({"image": grid.index, "method": method, "mode": mode, "metric": metric,
                                   "removal": removal, "auc": auc}))
    if not parts:
        raise InputError("df holds no curves; run vitviz.faithfulness(model, images) first")
    return pd.concat(parts, ignore_index=True)


def faithfulness_auc(df: Any, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, upto: float = 1.0) -> Any:
    """Area under each curve per image, averaged over images, with a bootstrap interval over images.

    The intervals are marginal: to say that one method beats another, use ``compare_methods`` (paired over the
    same images), not whether two of these intervals overlap.

    Args:
        df: the DataFrame of ``faithfulness`` (runs may be concatenated when their image ids differ; repeated
            ``(image, method, mode, fraction)`` rows are refused with an ``InputError``).
        n_boot, ci, seed: as in ``bootstrap_ci`` (the same resamples of images for every row).
        upto: integrate over fractions ``[0, upto]`` only; Chefer et al. integrate up to 0.9
            (``np.trapz(acc, x) * 100`` with ``x = 0, 0.1, ..., 0.9``), so ``upto=0.9`` times 100 is their number.

    Returns:
        DataFrame with one row per ``method``, ``mode``, ``metric``: ``auc`` (mean over images), ``ci_low``,
        ``ci_high``, ``n_images``, ``better`` (``lower`` / ``higher``) and ``removal``.
    """
    import pandas as pd

    rows = []
    for (method, mode, metric, removal), g in per_image_auc(df, upto=upto).groupby(GROUP, sort=False):
        lo, hi = bootstrap_ci(g["auc"].to_numpy(), n_boot=n_boot, ci=ci, seed=seed)
        rows.append({"method": method, "mode": mode, "metric": metric, "auc": float(g["auc"].mean()),
                     "ci_low": lo, "ci_high": hi, "n_images": len(g), "better": BETTER[mode], "removal": removal})
    return pd.DataFrame(rows, columns=["method", "mode", "metric", "auc", "ci_low", "ci_high", "n_images",
                                       "better", "removal"])


def verdict(low: float, high: float, better: str) -> str:
    """``better``, ``worse`` or ``indistinguishable`` for a paired interval ``[low, high]`` of method - baseline."""
    if low > 0:
        return "better" if better == "higher" else "worse"
    if high < 0:
        return "better" if better == "lower" else "worse"
    return "indistinguishable"


def compare_methods(df: Any, baseline: str = "chefer", *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                    upto: float = 1.0) -> Any:
    """Paired bootstrap of each method's per-image AUC minus the baseline's, over the same images.

    For each mode (and metric, removal) and each method other than ``baseline``: ``d_i = AUC_method,i -
    AUC_baseline,i`` over the images ``i`` both were run on; ``diff`` is the mean of ``d`` and the interval a
    percentile bootstrap of that mean, resampling images (so both methods' values of an image move together). The
    verdict reads the mode's direction: on ``deletion``/``positive`` (lower is better) a difference whose interval
    lies below zero is ``better``; on ``insertion``/``negative`` one above zero; an interval that contains zero is
    ``indistinguishable``.

    Args:
        df: the DataFrame of ``vitviz.faithfulness``.
        baseline: the method every other is compared with.
        n_boot, ci, seed: as in ``bootstrap_ci`` (the same image resamples for every method).
        upto: integrate over fractions ``[0, upto]`` only.

    Returns:
        DataFrame with columns ``mode``, ``metric``, ``removal``, ``method``, ``baseline``, ``auc``,
        ``baseline_auc``, ``diff``, ``ci_low``, ``ci_high``, ``n_images``, ``better`` (the mode's direction) and
        ``verdict`` (``better`` / ``worse`` / ``indistinguishable``).
    """
    import pandas as pd

    aucs = per_image_auc(df, upto=upto)
    methods = list(dict.fromkeys(aucs["method"]))
    if baseline not in methods:
        raise InputError(f"baseline={baseline!r} is not among the methods of df ({methods}); pass one of them")
    rows = []
    for (mode, metric, removal), g in aucs.groupby(["mode", "metric", "removal"], sort=False):
        table = g.pivot(index="image", columns="method", values="auc")
        if baseline not in table:
            continue
        for method in [m for m in methods if m != baseline and m in table]:
            pair = table[[method, baseline]]
            if pair.isna().to_numpy().any():
                raise InputError(f"{method} and {baseline} were not run on the same images ({mode}): "
                                 f"{int(pair[method].notna().sum())} vs {int(pair[baseline].notna().sum())} images; "
                                 "a paired comparison needs both methods on every image")
            d = (pair[method] - pair[baseline]).to_numpy(dtype=np.float64)
            lo, hi = bootstrap_ci(d, n_boot=n_boot, ci=ci, seed=seed)
            rows.append({"mode": mode, "metric": metric, "removal": removal, "method": method, "baseline": baseline,
                         "auc": float(pair[method].mean()), "baseline_auc": float(pair[baseline].mean()),
                         "diff": float(d.mean()), "ci_low": lo, "ci_high": hi, "n_images": len(d),
                         "better": BETTER[mode], "verdict": verdict(lo, hi, BETTER[mode])})
    return pd.DataFrame(rows, columns=["mode", "metric", "removal", "method", "baseline", "auc", "baseline_auc",
                                       "diff", "ci_low", "ci_high", "n_images", "better", "verdict"])
