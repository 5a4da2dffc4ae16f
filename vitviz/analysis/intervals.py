"""The Student-t interval of a mean, written once.

``mean +- t_{n-1, (1 + confidence) / 2} * sd / sqrt(n)`` with the sample standard deviation (``ddof=1``): the
interval of the one-sample t-test, and of the paired t-test when the values are per-image or per-seed differences.
Its coverage is exact for normal values and approximate for others (central limit theorem). The seeds of a study
(``vitviz.experiments.compare``), the few-shot draws of the probes (``vitviz.analysis.representations``) and the
per-image AUCs of the faithfulness tests (``vitviz.analysis.faithfulness_stats``) all use it.

A bounded quantity (an accuracy in percent: ``PERCENT``) gets its interval cut to its range (``bounds=``): with few
values near either end the half-width reaches past it, and a figure or table would show an accuracy below 0 or above
100 %. The mean of values in a range lies in it, so the cut interval holds the mean exactly as often as the uncut
one.

A paired difference of rounding size (``ROUNDING`` times the values' size) is no difference: two arms that agree up
to a float rounding (a mean summed in another order, a curve interpolated on another knot) differ by about 1e-15 at
every pair, all of one sign, and the interval of width 0 of those would read as a difference the pairs resolve.
``drop_rounding`` sets such differences to 0 before ``t_interval`` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vitviz.core.util import float_array, is_number
from vitviz.errors import InputError

__all__ = ["PERCENT", "PERCENT_DIFFERENCE", "ROUNDING", "drop_rounding", "t_interval"]

PERCENT = (0.0, 100.0)  # an accuracy in percent
PERCENT_DIFFERENCE = (-100.0, 100.0)  # the difference of two accuracies in percent
ROUNDING = 1e-12  # a paired difference up to this, relative to the values' size (at least 1), counts as 0


def drop_rounding(differences: Sequence[float] | np.ndarray, *values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``differences`` (paired, ``a - b``) as float64 with those of rounding size set to 0: up to ``ROUNDING`` times
    the largest absolute value of ``values`` (the arms ``a`` and ``b``; at least 1). NaNs stay NaN."""
    d = np.asarray(differences, dtype=np.float64).copy()
    sizes = [np.nanmax(np.abs(np.asarray(v, dtype=np.float64)), initial=0.0) for v in values]
    d[np.abs(d) <= ROUNDING * max([1.0, *sizes])] = 0.0
    return d


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95,
               bounds: tuple[float, float] | None = None) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval of the mean: ``(mean, low, high)``.

    Args:
        values: independent measurements (NaNs dropped: a missing measurement), e.g. one accuracy per seed or one
            AUC per image: numbers, an array or a tensor of any dtype. An infinite value is refused: it has no mean.
        confidence: coverage of the interval, in ``(0, 1)`` (0.95 for a 95% interval).
        bounds: ``(low, high)``, the range every value lies in (``PERCENT`` for accuracies in percent): the interval
            is cut to it (see the module docstring). A value outside it is refused.

    Returns:
        ``(mean, low, high)``; with fewer than 2 values the interval is ``(nan, nan)``, with none the mean too.
    """
    from scipy import stats

    if not is_number(confidence) or not 0 < confidence < 1:
        raise InputError(f"t_interval: confidence={confidence!r} must lie in (0, 1), the coverage of the interval "
                         "(e.g. 0.95 for a 95% interval)")
    x = float_array(values, "t_interval: values").reshape(-1)  # a tensor of any dtype (bfloat16), on any device
    if np.isinf(x).any():
        raise InputError(f"t_interval: values hold {x[np.isinf(x)][0]:g}, which has no mean; pass finite "
                         "measurements (NaN for a missing one, which is dropped)")
    x = x[~np.isnan(x)]
    if bounds is not None:
        lo, hi = bounds
        slack = 1e-9 * (hi - lo)  # a value a rounding error past its range (a trapezoid's sum) is in it
        outside = x[(x < lo - slack) | (x > hi + slack)]
        if len(outside):
            raise InputError(f"t_interval: the value {outside[0]:g} lies outside bounds={tuple(bounds)!r}; pass the "
                             "range the values lie in (an accuracy in percent: (0, 100)), or bounds=None")
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    if bounds is not None:  # never past the mean itself (a mean a rounding error past the range stays inside)
        return mean, max(mean - half, min(float(bounds[0]), mean)), min(mean + half, max(float(bounds[1]), mean))
    return mean, mean - half, mean + half
