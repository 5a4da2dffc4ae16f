"""The Student-t interval of a mean, written once.

``mean +- t_{n-1, (1 + confidence) / 2} * sd / sqrt(n)`` with the sample standard deviation (``ddof=1``): the
interval of the one-sample t-test, and of the paired t-test when the values are per-image or per-seed differences.
Its coverage is exact for normal values and approximate for others (central limit theorem). The seeds of a study
(``vitviz.experiments.compare``), the few-shot draws of the probes (``vitviz.analysis.representations``) and the
per-image AUCs of the faithfulness tests (``vitviz.analysis.faithfulness_stats``) all use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["t_interval"]


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval of the mean: ``(mean, low, high)``.

    Args:
        values: independent measurements (NaNs dropped), e.g. one accuracy per seed or one AUC per image.
        confidence: coverage of the interval.

    Returns:
        ``(mean, low, high)``; with fewer than 2 values the interval is ``(nan, nan)``, with none the mean too.
    """
    from scipy import stats

    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half
