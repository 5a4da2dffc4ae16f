"""Areas under the faithfulness curves, their intervals over images, and paired comparisons of methods.

Every method of a ``vitviz.faithfulness`` run sees the same images, so two methods are compared on the per-image
difference of their AUCs (a paired comparison): ``compare_methods``. Comparing each method's marginal interval
(``faithfulness_auc``) ignores that pairing: two intervals may overlap while the paired difference is clearly
non-zero (between-image variance cancels in the difference). A method is called better or worse than another only
when the paired interval of the difference excludes zero; otherwise the two are indistinguishable on these images.

Intervals (``interval=``): by default the Student-t interval of the mean (``mean +- t_{n-1} * sd / sqrt(n)``, the
interval of the paired t-test for the differences of ``compare_methods``), which holds its coverage from two
images on when the per-image values are roughly normal and, by the central limit theorem, for any shape as the
images grow. ``interval="bootstrap"`` is the percentile bootstrap of the mean; it is too narrow on few images (its
width shrinks by ``sqrt((n - 1) / n)`` and its quantiles are about normal ones, not t ones: at 2 images it is the range of
the two values, and a method is called better or worse at a true difference of 0 about half the time; Hesterberg
2015, "What Teachers Should Know About the Bootstrap", The American Statistician 69(4)), so use it from
about 30 images on. With fewer than 2 images no interval exists: it is NaN and the verdict ``too few images``.

Bounded metrics (``AUC_BOUNDS``): an ``accuracy`` or ``probability`` score lies in ``[0, 1]`` and is integrated over
a fraction in ``[0, 1]``, so its AUC lies in ``[0, 1]`` and a difference of two in ``[-1, 1]``. The t interval is
cut to that range (``vitviz.analysis.intervals.t_interval``'s ``bounds``): with few images near either end its
half-width reaches past it (two images of accuracy AUC 0 and 1: ``0.5 +- 6.4``). The mean lies in the range, so the
cut interval holds it exactly as often as the uncut one, and a paired verdict is unchanged (zero lies in
``[-1, 1]``). A bootstrap interval is a range of means of values in the range and needs no cut. The ``target``
metric (the raw output of a headless model) is unbounded and not cut.

The x of every AUC: the column ``removed`` of a ``vitviz.faithfulness`` frame, the fraction of patches actually
removed (inserted) at each step, ``round(f * P) / P`` for the nominal step ``f`` (column ``fraction``) and ``P``
patches; each image's curve is integrated over its own ``removed`` values, so images of different grids are each
integrated over what was removed from them. A frame without ``removed`` (one written by an older vitviz, or built by
hand) is integrated over ``fraction``, as before that column existed. ``upto=`` and the grouping of rows read the
nominal ``fraction``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vitviz.analysis.intervals import drop_rounding, t_interval
from vitviz.core.util import float_array, is_int, is_number
from vitviz.errors import InputError, InputTypeError

__all__ = ["AUC_BOUNDS", "BETTER", "INTERVALS", "MODES", "bootstrap_ci", "compare_methods", "faithfulness_auc",
           "mean_interval", "per_image_auc", "t_ci"]

MODES = ("positive", "negative", "deletion", "insertion")
BETTER = {"positive": "lower", "negative": "higher", "deletion": "lower", "insertion": "higher"}
CURVE_KEY = ["image", "method", "mode", "fraction", "metric", "removal"]
GROUP = ["method", "mode", "metric", "removal"]
INTERVALS = ("t", "bootstrap")
TOO_FEW = "too few images"
AUC_BOUNDS = {"accuracy": (0.0, 1.0), "probability": (0.0, 1.0)}  # score in [0, 1], integrated over x in [0, 1]


def auc_bounds(metric: str, difference: bool = False) -> tuple[float, float] | None:
    """The range of a ``metric``'s AUC (of a difference of two AUCs with ``difference=True``); ``None``: unbounded."""
    bounds = AUC_BOUNDS.get(metric)
    if bounds is None or not difference:
        return bounds
    return bounds[0] - bounds[1], bounds[1] - bounds[0]


def _values(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    v = float_array(values, f"{what}: values")
    if v.ndim != 1 or len(v) == 0:
        raise InputError(f"{what} needs a non-empty 1-D set of values, got shape {v.shape}")
    if not np.isfinite(v).all():
        raise InputError(f"{what}: values holds {int((~np.isfinite(v)).sum())} NaN or infinite values of {len(v)}; "
                         "an interval of a mean needs finite values (drop or fix them first)")
    return v


def _check_ci(ci: float) -> None:
    if not is_number(ci) or not 0 < ci < 1:
        raise InputError(f"ci={ci!r} must lie in (0, 1), e.g. 0.95")


def _check_n_boot(n_boot: int) -> None:
    if not is_int(n_boot) or n_boot < 1:
        raise InputError(f"n_boot={n_boot!r} must be a positive int, the number of bootstrap resamples (e.g. 1000)")


def t_ci(values: Sequence[float] | np.ndarray, *, ci: float = 0.95,
         bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """Student-t interval of the mean of ``values``: ``mean +- t_{n-1, (1 + ci) / 2} * sd / sqrt(n)``.

    The interval of the (paired, for differences) t-test. Its coverage is exact for normal values and holds
    approximately for others (central limit theorem); with fewer than 2 values there is none: ``(nan, nan)``.
    ``bounds``: the range every value lies in (``auc_bounds``); the interval is cut to it (see the module docstring).
    """
    v = _values(values, "t_ci")
    _check_ci(ci)
    _, low, high = t_interval(v, ci, bounds=bounds)
    return low, high


def _check_interval(interval: str, n_boot: int, ci: float) -> None:
    if interval not in INTERVALS:
        raise InputError(f"interval={interval!r} must be 't' (Student-t interval of the mean, the default) or "
                         "'bootstrap' (percentile bootstrap, too narrow below about 30 images)")
    _check_n_boot(n_boot)
    _check_ci(ci)


def mean_interval(values: Sequence[float] | np.ndarray, *, interval: str = "t", n_boot: int = 1000,
                  ci: float = 0.95, seed: int = 0, bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """The ``interval`` (``"t"``: ``t_ci``, cut to ``bounds``; ``"bootstrap"``: ``bootstrap_ci``, inside them
    already) of the mean of ``values``; ``(nan, nan)`` with fewer than 2 values (see the module docstring)."""
    _check_interval(interval, n_boot, ci)
    if interval == "t":
        return t_ci(values, ci=ci, bounds=bounds)
    return bootstrap_ci(values, n_boot=n_boot, ci=ci, seed=seed)


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                 statistic: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (or ``statistic`` over axis 1) of ``values``, resampling them.

    Too narrow on few values (Hesterberg 2015, see the module docstring): at 2 values it is their range. With
    fewer than 2 values there is no interval: ``(nan, nan)``.

    Args:
        values: one value per unit (image), finite.
        n_boot: resamples, a positive int.
        ci: coverage, e.g. 0.95.
        seed: the generator's seed (same seed and number of values, same resamples).
        statistic: ``f(resamples (n_boot, n)) -> (n_boot,)``; default the mean.

    Returns:
        ``(low, high)``.
    """
    v = _values(values, "bootstrap_ci")
    _check_ci(ci)
    _check_n_boot(n_boot)
    if not is_int(seed) or seed < 0:
        raise InputError(f"seed={seed!r} must be a non-negative int (the seed of the resamples)")
    if len(v) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    samples = v[rng.integers(0, len(v), size=(n_boot, len(v)))]
    stats = samples.mean(axis=1) if statistic is None else statistic(samples)
    lo, hi = np.quantile(stats, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return float(lo), float(hi)


def check_curves(df: Any) -> None:
    """Refuse a non-DataFrame, or a curves frame with missing columns or repeated ``(image, method, mode, fraction,
    metric, removal)``."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        shown = repr(df) if len(repr(df)) <= 60 else f"a {type(df).__name__}"
        raise InputTypeError(f"df={shown} is not a DataFrame; pass the DataFrame of vitviz.faithfulness")
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
    """The area under each image's curve: the trapezoid of ``score`` over ``removed``, the fraction of patches
    actually removed (``round(f * P) / P`` at the nominal step ``f``), from the step 0 to the step ``upto``.

    A ``df`` without the column ``removed`` (a frame of an older vitviz, or one built by hand) is integrated over
    the nominal ``fraction`` instead. Each image is integrated over its own ``removed`` values, so images of
    different patch grids are each integrated over what was removed from them.

    Args:
        df: the DataFrame of ``vitviz.faithfulness`` (several runs concatenated, with distinct image ids).
        upto: integrate over the nominal steps ``[0, upto]`` only: one of the values of ``fraction`` in ``(0, 1]``
            (e.g. 0.9 with ``steps=0.1``; on 64 patches its x is ``58 / 64``, about 0.906).

    Returns:
        DataFrame with columns ``image``, ``method``, ``mode``, ``metric``, ``removal``, ``auc``.

    Raises:
        InputError: ``df`` not a DataFrame, a mode not in ``MODES``, repeated rows, NaN scores (an AUC of NaN has
            no interval), an ``accuracy`` or ``probability`` score outside ``[0, 1]`` (``AUC_BOUNDS``), rows
            without a ``removed`` value (frames with and without the column concatenated), ``removed`` decreasing
            along a curve, or ``upto`` outside ``(0, 1]`` or not one of the fractions.
    """
    import pandas as pd

    check_curves(df)
    other = [m for m in dict.fromkeys(df["mode"]) if m not in MODES]  # BETTER knows these modes' directions only
    if other:
        raise InputError(f"df holds mode {other[0]!r}, which is not one of {MODES}; pass the DataFrame of "
                         "vitviz.faithfulness")
    nan = df["score"].isna()
    if nan.any():
        r = df[nan].iloc[0]
        image = r["image"].item() if isinstance(r["image"], np.generic) else r["image"]
        raise InputError(f"df holds {int(nan.sum())} NaN scores, e.g. image {image!r}, {r['method']}/{r['mode']} "
                         f"at fraction {r['fraction']}: the model gave NaN outputs there (NaN pixels, or a callable "
                         "target that returns NaN); fix the inputs or drop those images (df[df.image != ...])")
    _check_bounded_scores(df)
    _check_upto(upto, df["fraction"].unique())
    actual = "removed" in df.columns  # the x: the fraction actually removed, else the nominal step
    if actual:
        _check_removed(df)
    df = df[df["fraction"] <= upto + 1e-9]
    parts = []
    for (method, mode, metric, removal), g in df.groupby(GROUP, sort=False):
        grid = g.pivot(index="image", columns="fraction", values="score").sort_index(axis=1)
        if grid.isna().to_numpy().any():
            raise InputError(f"the curves of {method}/{mode} do not share their fractions across images (runs with "
                             "different steps= cannot be mixed)")
        if not np.isclose(grid.columns.max(), upto, rtol=0, atol=1e-9):  # each curve to upto, not the step below
            shown = ", ".join(f"{f:g}" for f in grid.columns)
            raise InputError(f"upto={upto!r} is not one of the fractions of the curves of {method}/{mode} ({shown}, "
                             "up to upto; a run with another steps=): they would be integrated up to the last "
                             "fraction below it, over another range than the other curves. Pass a fraction every "
                             "curve has")
        y = grid.to_numpy(dtype=np.float64)
        if actual:  # each image over its own x: images of other grids remove other fractions at one step
            xs = g.pivot(index="image", columns="fraction", values="removed").reindex(
                index=grid.index, columns=grid.columns).to_numpy(dtype=np.float64)
        else:
            xs = np.broadcast_to(grid.columns.to_numpy(dtype=np.float64), y.shape)
        widths = np.diff(xs, axis=1)
        if (widths < 0).any():
            i = int(np.argwhere(widths < 0)[0][0])
            raise InputError(f"df: the curve of image {_plain(grid.index[i])!r}, {method}/{mode}, has 'removed' "
                             f"values {xs[i].tolist()} that fall as 'fraction' grows; 'removed' is the fraction of "
                             "patches removed at each step, so it cannot fall. Pass the frame of vitviz.faithfulness, "
                             "or drop the column (df.drop(columns='removed')) to integrate over 'fraction'")
        auc = ((y[:, 1:] + y[:, :-1]) / 2 * widths).sum(axis=1)  # trapezoid
        parts.append(pd.DataFrame({"image": grid.index, "method": method, "mode": mode, "metric": metric,
                                   "removal": removal, "auc": auc}))
    if not parts:
        raise InputError("df holds no curves; run vitviz.faithfulness(model, images) first")
    return pd.concat(parts, ignore_index=True)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (for messages)."""
    return value.item() if isinstance(value, np.generic) else value


def _check_bounded_scores(df: Any) -> None:
    """Refuse an ``accuracy`` or ``probability`` score outside ``[0, 1]`` (``AUC_BOUNDS``): its AUC's interval is cut
    to that range, which would hide such a value."""
    for metric, (lo, hi) in AUC_BOUNDS.items():
        rows = df[df["metric"] == metric]
        bad = rows[(rows["score"] < lo) | (rows["score"] > hi)]
        if len(bad):
            r = bad.iloc[0]
            raise InputError(f"df holds {len(bad)} {metric} scores outside [{lo:g}, {hi:g}], e.g. "
                             f"{_plain(r['score']):g} at image {_plain(r['image'])!r}, {r['method']}/{r['mode']}, "
                             f"fraction {r['fraction']}: not a frame of vitviz.faithfulness. Give raw model outputs "
                             "the metric 'target' (unbounded), or fix the scores")


def _check_removed(df: Any) -> None:
    """Refuse rows without a ``removed`` value: frames with and without the column concatenated."""
    missing = df["removed"].isna()
    if missing.any():
        r = df[missing].iloc[0]
        raise InputError(f"df holds {int(missing.sum())} rows without a 'removed' value (of {len(df)}), e.g. image "
                         f"{_plain(r['image'])!r}, {r['method']}/{r['mode']} at fraction {r['fraction']}: a frame of "
                         "an older vitviz, which has no 'removed' column, concatenated with a newer one? Their curves "
                         "are not on one axis. Rerun vitviz.faithfulness on those images, or drop the column from "
                         "every frame (df.drop(columns='removed')) to integrate all of them over the nominal "
                         "'fraction'")


def _check_upto(upto: float, fractions: np.ndarray) -> None:
    if not is_number(upto) or not 0 < upto <= 1:
        raise InputError(f"upto={upto!r} must be a fraction of the patches in (0, 1], e.g. 0.9 (not a percentage)")
    fr = np.sort(np.asarray(fractions, dtype=np.float64))
    if len(fr) and not np.isclose(fr, upto, rtol=0, atol=1e-9).any():
        shown = ", ".join(f"{f:g}" for f in fr)
        raise InputError(f"upto={upto!r} is not one of the fractions of df ({shown}); the curve would be integrated "
                         "up to the last fraction below it. Pass one of them")


def faithfulness_auc(df: Any, *, interval: str = "t", n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                     upto: float = 1.0) -> Any:
    """Area under each curve per image, averaged over images, with an interval of that mean over images.

    The intervals are marginal: to say that one method beats another, use ``compare_methods`` (paired over the
    same images), not whether two of these intervals overlap. Each image's AUC is the trapezoid of its score over
    ``removed``, the fraction of patches actually removed (``per_image_auc``); a ``df`` without that column (an
    older vitviz's, or one built by hand) is integrated over the nominal ``fraction``.

    Args:
        df: the DataFrame of ``faithfulness`` (runs may be concatenated when their image ids differ; repeated
            ``(image, method, mode, fraction)`` rows are refused with an ``InputError``).
        interval: ``"t"`` (default: the Student-t interval of the mean, ``t_ci``) or ``"bootstrap"`` (the percentile
            bootstrap, ``bootstrap_ci``: too narrow below about 30 images; see the module docstring).
        n_boot, seed: for ``interval="bootstrap"`` (the same resamples of images for every row).
        ci: coverage, e.g. 0.95.
        upto: integrate over the nominal steps ``[0, upto]`` only (one of the values of ``fraction``); Chefer et al.
            integrate up to 0.9 (``np.trapz(acc, x) * 100`` with ``x = 0, 0.1, ..., 0.9``), so ``upto=0.9`` times
            100 is their number (over the fractions actually removed: on 64 patches up to ``58 / 64``).

    Returns:
        DataFrame with one row per ``method``, ``mode``, ``metric``: ``auc`` (mean over images), ``ci_low``,
        ``ci_high`` (NaN with fewer than 2 images; cut to ``[0, 1]`` for an ``accuracy`` or ``probability`` AUC, see
        the module docstring), ``n_images``, ``better`` (``lower`` / ``higher``) and
        ``removal``; ``attrs["interval"]`` names the interval.
    """
    import pandas as pd

    _check_interval(interval, n_boot, ci)  # the arguments, before any work
    rows = []
    for (method, mode, metric, removal), g in per_image_auc(df, upto=upto).groupby(GROUP, sort=False):
        lo, hi = mean_interval(g["auc"].to_numpy(), interval=interval, n_boot=n_boot, ci=ci, seed=seed,
                               bounds=auc_bounds(metric))
        rows.append({"method": method, "mode": mode, "metric": metric, "auc": float(g["auc"].mean()),
                     "ci_low": lo, "ci_high": hi, "n_images": len(g), "better": BETTER[mode], "removal": removal})
    out = pd.DataFrame(rows, columns=["method", "mode", "metric", "auc", "ci_low", "ci_high", "n_images",
                                      "better", "removal"])
    out.attrs = {"interval": interval, "ci": float(ci)}
    return out


def verdict(low: float, high: float, better: str) -> str:
    """``better``, ``worse`` or ``indistinguishable`` for a paired interval ``[low, high]`` of method - baseline;
    ``too few images`` when there is no interval (NaN: fewer than 2 images)."""
    if np.isnan(low) or np.isnan(high):
        return TOO_FEW
    if low > 0:
        return "better" if better == "higher" else "worse"
    if high < 0:
        return "better" if better == "lower" else "worse"
    return "indistinguishable"


def compare_methods(df: Any, baseline: str = "chefer", *, interval: str = "t", n_boot: int = 1000, ci: float = 0.95,
                    seed: int = 0, upto: float = 1.0) -> Any:
    """Paired comparison of each method's per-image AUC with the baseline's, over the same images.

    For each mode (and metric, removal) and each method other than ``baseline``: ``d_i = AUC_method,i -
    AUC_baseline,i`` over the images ``i`` both were run on; ``diff`` is the mean of ``d`` and the interval is, by
    default, the Student-t interval of that mean (the paired t-test's: ``mean(d) +- t_{n-1} * sd(d) / sqrt(n)``).
    The verdict reads the mode's direction: on ``deletion``/``positive`` (lower is better) a difference whose
    interval lies below zero is ``better``; on ``insertion``/``negative`` one above zero; an interval that contains
    zero is ``indistinguishable``; with fewer than 2 images the interval is NaN and the verdict ``too few images``
    (one image says nothing about the spread over images). A per-image difference of rounding size (up to
    ``vitviz.analysis.intervals.ROUNDING`` times the AUCs' size, ``drop_rounding``) counts as 0: identical curves
    integrated on other step grids differ by about 1e-17 at every image, whose interval of width 0 would otherwise
    read ``better`` or ``worse``. For an ``accuracy`` or ``probability`` metric the
    interval is cut to ``[-1, 1]``, the range of a difference of two AUCs (the verdict stays the same). The AUCs
    are ``per_image_auc``'s: over ``removed``, the fraction of patches actually removed, or over the nominal
    ``fraction`` for a ``df`` without that column.

    Args:
        df: the DataFrame of ``vitviz.faithfulness``.
        baseline: the method every other is compared with.
        interval: ``"t"`` (default, the paired t interval) or ``"bootstrap"`` (the percentile bootstrap of the mean
            difference, resampling images so that both methods' values of an image move together; too narrow below
            about 30 images: at 2 to 5 images it calls methods that do not differ better or worse 17% to 50% of the
            time at a nominal 5%; see the module docstring).
        n_boot, seed: for ``interval="bootstrap"`` (the same image resamples for every method).
        ci: coverage, e.g. 0.95.
        upto: integrate over the nominal steps ``[0, upto]`` only (one of the values of ``fraction``).

    Returns:
        DataFrame with columns ``mode``, ``metric``, ``removal``, ``method``, ``baseline``, ``auc``,
        ``baseline_auc``, ``diff``, ``ci_low``, ``ci_high``, ``n_images``, ``better`` (the mode's direction) and
        ``verdict`` (``better`` / ``worse`` / ``indistinguishable`` / ``too few images``); ``attrs["interval"]``
        names the interval. A mode, metric and removal the baseline was not run in has no rows, with a
        ``UserWarning`` naming it.
    """
    import pandas as pd

    _check_interval(interval, n_boot, ci)  # the arguments, before any work
    aucs = per_image_auc(df, upto=upto)
    methods = list(dict.fromkeys(aucs["method"]))
    if baseline not in methods:
        raise InputError(f"baseline={baseline!r} is not among the methods of df ({methods}); pass one of them")
    rows, unpaired = [], []
    for (mode, metric, removal), g in aucs.groupby(["mode", "metric", "removal"], sort=False):
        table = g.pivot(index="image", columns="method", values="auc")
        if baseline not in table:
            unpaired.append(f"{mode}/{metric}/{removal}")
            continue
        for method in [m for m in methods if m != baseline and m in table]:
            pair = table[[method, baseline]]
            if pair.isna().to_numpy().any():
                raise InputError(f"{method} and {baseline} were not run on the same images ({mode}): "
                                 f"{int(pair[method].notna().sum())} vs {int(pair[baseline].notna().sum())} images; "
                                 "a paired comparison needs both methods on every image")
            d = (pair[method] - pair[baseline]).to_numpy(dtype=np.float64)
            # a difference of rounding size is none: identical curves integrated on other step grids differ by
            # 1e-17 at every image, an interval of width 0 away from 0 that would read "better" or "worse"
            d = drop_rounding(d, pair[method], pair[baseline])
            lo, hi = mean_interval(d, interval=interval, n_boot=n_boot, ci=ci, seed=seed,
                                   bounds=auc_bounds(metric, difference=True))
            rows.append({"mode": mode, "metric": metric, "removal": removal, "method": method, "baseline": baseline,
                         "auc": float(pair[method].mean()), "baseline_auc": float(pair[baseline].mean()),
                         "diff": float(d.mean()), "ci_low": lo, "ci_high": hi, "n_images": len(d),
                         "better": BETTER[mode], "verdict": verdict(lo, hi, BETTER[mode])})
    if unpaired:  # those methods' curves get no row: say so, rather than let the table look complete
        import warnings

        warnings.warn(f"compare_methods: baseline={baseline!r} has no curves for {', '.join(unpaired)} "
                      "(mode/metric/removal), so the methods run there are not compared; run the baseline there "
                      "too, or pass another baseline", UserWarning, stacklevel=2)
    out = pd.DataFrame(rows, columns=["mode", "metric", "removal", "method", "baseline", "auc", "baseline_auc",
                                      "diff", "ci_low", "ci_high", "n_images", "better", "verdict"])
    out.attrs = {"interval": interval, "ci": float(ci)}
    return out
