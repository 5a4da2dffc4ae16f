"""Tidy tables (one observation per row) of analysis results, for pandas and seaborn.

Wide tensors such as the ``(L, H)`` mean attention distance become long ``DataFrame``s with one row per
(model, layer, head), which is what seaborn's axes-level functions (``sns.stripplot(data=df, x="layer",
y="distance_px", ax=ax)``) and ``DataFrame.groupby`` take.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.util import float_array, pair
from vitviz.errors import InputError

if TYPE_CHECKING:
    import pandas as pd


def distance_table(distance: Any, model: str = "model", patch_size: int | tuple[int, int] | None = None
                   ) -> pd.DataFrame:
    """``(L, H)`` mean attention distance (pixels) as rows of ``model``, ``layer`` (1-based, as the paper's
    "Network depth (layer)"), ``head`` (0-based) and ``distance_px``.

    Args:
        distance: ``(L, H)`` tensor or array from ``vitviz.mean_attention_distance``.
        model: the label of the ``model`` column.
        patch_size: when given, a ``distance_patches`` column (distance in token strides) is added; ``(sh, sw)``
            positive strides in pixels, or an int for a square stride. A non-square stride divides by the geometric
            mean ``sqrt(sh * sw)``, the side of a square patch of the same area (a distance mixes both directions,
            so no one of the two strides is its unit).

    Returns:
        ``L * H`` rows in layer-major order.

    Raises:
        InputError: ``distance`` is not ``(L, H)`` numbers, or ``patch_size`` is not a positive int or pair.
    """
    import numpy as np
    import pandas as pd

    d = float_array(distance, "distance")
    stride = None if patch_size is None else pair(patch_size, "patch_size", positive=True)
    if d.ndim != 2:
        raise InputError(f"distance must be (L, H), got shape {d.shape}")
    layers, heads = d.shape
    df = pd.DataFrame({
        "model": model,
        "layer": np.repeat(np.arange(1, layers + 1), heads),
        "head": np.tile(np.arange(heads), layers),
        "distance_px": d.reshape(-1),
    })
    if stride is not None:
        df["distance_patches"] = df["distance_px"] / float(np.sqrt(stride[0] * stride[1]))
    return df
