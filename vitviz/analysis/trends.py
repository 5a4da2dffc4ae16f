"""Depth trends of per-layer, per-head statistics (e.g. mean attention distance), with a test statistic.

The ViT paper (Fig. 7 right, Fig. 11) reads mean attention distance as growing with depth. ``depth_trend`` states
that as Spearman's rank correlation between layer index and the statistic over every (layer, head) pair, with its
two-sided p-value (``scipy.stats.spearmanr``; heads of one layer share the layer's rank, so ties are handled by
average ranks). Heads of one model are not independent samples, so the p-value describes this model's heads, not
a population of models.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitviz.core.util import float_array
from vitviz.errors import InputError


def depth_trend(values: Any) -> dict[str, float]:
    """Spearman's rho of a ``(L, H)`` per-layer, per-head statistic against the layer index.

    Args:
        values: ``(L, H)`` array or tensor (e.g. ``vitviz.mean_attention_distance`` output), L >= 2.

    Returns:
        ``rho`` (-1..1; positive: grows with depth; NaN, with ``p``, when every value is the same: no ordering to
        correlate), ``p`` (two-sided), ``layers``, ``heads``, and the first and last layers' head means
        ``first_mean`` and ``last_mean``.

    Raises:
        InputError: ``values`` is not ``(L, H)`` numbers with ``L >= 2`` and ``H >= 1``, or holds NaN or infinite
            values.
    """
    from scipy import stats

    x = float_array(values, "depth_trend: values")
    if x.ndim != 2 or x.shape[0] < 2:
        raise InputError(f"depth_trend: values must be (L, H) with L >= 2 layers, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise InputError(f"depth_trend: values holds {int((~np.isfinite(x)).sum())} NaN or infinite values of "
                         f"{x.size}, e.g. at layer {int(bad[0])}, head {int(bad[1])} (0-based); rho would be NaN. "
                         "Drop or fix those heads first")
    if x.shape[1] == 0:
        raise InputError(f"depth_trend: values must be (L, H) with H >= 1 head, got shape {x.shape}")
    layers = np.repeat(np.arange(x.shape[0]), x.shape[1])
    if np.ptp(x) == 0:  # a constant statistic has no ranks to correlate: no trend, said so without scipy's warning
        rho = p = float("nan")
    else:
        rho, p = stats.spearmanr(layers, x.reshape(-1))
    return {"rho": float(rho), "p": float(p), "layers": int(x.shape[0]), "heads": int(x.shape[1]),
            "first_mean": float(x[0].mean()), "last_mean": float(x[-1].mean())}
