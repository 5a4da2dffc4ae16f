"""Similarity of two relevance maps, as the sanity checks of Adebayo et al. (NeurIPS 2018, Sec. 3) measure it.

- ``spearman``: Spearman's rank correlation, i.e. the Pearson correlation of the ranks, tied values sharing their
  mean rank (the definition ``scipy.stats.spearmanr`` uses). ``nan`` when either map is constant (no ordering) or
  holds NaN. Maps of two shapes are refused, also when they hold as many patches (a 4x6 and a 6x4 grid): their
  flattened patches are not the same patches.

Maps may be NumPy arrays or tensors of any float dtype (bfloat16 included), on any device.
- ``ssim``: the structural similarity index (Wang et al., IEEE TIP 2004, Eq. 13) of the two maps, each first
  taken in absolute value and min-max scaled to ``[0, 1]`` (so ``data_range=1``; a constant map becomes all
  zeros; ``nan`` when either map holds NaN or an infinity, as ``spearman`` is for a NaN). Computed by
  ``skimage.metrics.structural_similarity`` when scikit-image is installed (the ``notebooks`` extra), else by
  ``ssim_reference`` below, which implements the same defaults: a ``7 x 7`` uniform window (the largest odd size
  that fits, on grids smaller than 7 patches; maps with a side below 3 are refused with ``InputError``),
  ``K1 = 0.01``, ``K2 = 0.03``, sample covariances, and the mean over the windows that lie wholly inside the map.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import uniform_filter
from scipy.stats import rankdata

from vitviz.core.util import float_array
from vitviz.errors import InputError

__all__ = ["scale_unit", "spearman", "ssim", "ssim_reference", "window_size"]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two maps of the same shape (flattened); ``nan`` if either is constant.

    Raises:
        InputError: the maps differ in shape (see the module docstring).
    """
    a, b = float_array(a, "spearman: a"), float_array(b, "spearman: b")
    if a.shape != b.shape:
        raise InputError(f"spearman: the two maps have shapes {a.shape} and {b.shape}; pass maps of one grid (maps "
                         "of two grids do not hold the same patches at the same positions)")
    ra = rankdata(a.ravel())
    rb = rankdata(b.ravel())
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def scale_unit(m: np.ndarray) -> np.ndarray:
    """``|m|`` min-max scaled to ``[0, 1]`` (all zeros when ``|m|`` is constant)."""
    m = np.abs(np.asarray(m, dtype=np.float64))
    span = m.max() - m.min()
    return (m - m.min()) / span if span > 0 else np.zeros_like(m)


MIN_WINDOW = 3  # the smallest SSIM window: a side of 1 has no spread, and 2 is even (no centre pixel)


def window_size(shape: tuple[int, ...]) -> int:
    """skimage's default window (7), or the largest odd size that fits a smaller map (at least 3).

    Raises:
        InputError: a map side below 3 (no window fits).
    """
    if len(shape) != 2 or min(shape) < MIN_WINDOW:
        raise InputError(f"ssim: a map of shape {tuple(shape)} is too small; SSIM needs 2-D maps of at least "
                         f"{MIN_WINDOW}x{MIN_WINDOW} patches (its smallest window); use an input with a larger "
                         "patch grid, or compare such maps with spearman only")
    w = min(7, *shape)
    return w if w % 2 == 1 else w - 1


def _check_pair(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise InputError(f"ssim: the two maps have shapes {a.shape} and {b.shape}; pass maps of one grid")


def ssim_reference(a: np.ndarray, b: np.ndarray, *, data_range: float = 1.0, win_size: int = 7) -> float:
    """SSIM of two 2-D arrays, Wang et al. (2004) Eq. (13), with a uniform ``win_size`` window and sample covariances.

    The local means, variances and covariance are taken over every ``win_size x win_size`` window; the index is
    the mean of ``(2 mu_a mu_b + C1)(2 s_ab + C2) / ((mu_a^2 + mu_b^2 + C1)(s_a^2 + s_b^2 + C2))`` over the windows
    wholly inside the arrays, with ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, ``L = data_range``.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    _check_pair(a, b)
    if a.ndim != 2 or win_size % 2 == 0 or not MIN_WINDOW <= win_size <= min(a.shape):
        raise InputError(f"ssim_reference: win_size={win_size} does not fit maps of shape {a.shape}; pass an odd "
                         f"win_size from {MIN_WINDOW} to the map's shorter side (window_size(shape) picks one)")
    n = win_size * win_size
    cov_norm = n / (n - 1)
    mu_a, mu_b = uniform_filter(a, win_size), uniform_filter(b, win_size)
    vaa = cov_norm * (uniform_filter(a * a, win_size) - mu_a * mu_a)
    vbb = cov_norm * (uniform_filter(b * b, win_size) - mu_b * mu_b)
    vab = cov_norm * (uniform_filter(a * b, win_size) - mu_a * mu_b)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * vab + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (vaa + vbb + c2))
    pad = (win_size - 1) // 2
    return float(s[pad:s.shape[0] - pad, pad:s.shape[1] - pad].mean())


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of two ``(gh, gw)`` maps after ``scale_unit`` (see the module docstring); ``nan`` when either map holds
    NaN or an infinity.

    Raises:
        InputError: the maps differ in shape, or a side is below 3 patches (no SSIM window fits).
    """
    a, b = float_array(a, "ssim: a"), float_array(b, "ssim: b")
    _check_pair(a, b)
    win = window_size(a.shape)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")  # scale_unit would make a map holding NaN all zeros
    a, b = scale_unit(a), scale_unit(b)
    try:
        from skimage.metrics import structural_similarity
    except ImportError:
        return ssim_reference(a, b, data_range=1.0, win_size=win)
    return float(structural_similarity(a, b, data_range=1.0, win_size=win))
