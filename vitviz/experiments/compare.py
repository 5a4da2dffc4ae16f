"""Seed summaries and matched-compute comparisons of the hybrid-versus-pure study (tidy DataFrames in and out).

The one gap API is ``matched_compute``: family ``a`` minus family ``b`` at equal compute, for the measured study
(per seed, ``x="train_pflops"``) and for the paper's Table 6 (one run per model, no seed column: one "seed",
no interval; ``metric="imagenet", x="exaflops"``).

The ViT paper's Fig. 5 compares families at equal pre-training compute. Here each family's accuracy is a curve
of compute: per seed, the family's Pareto frontier (its runs that no cheaper-or-equal run beats, ``pareto_frontier``),
its points joined by straight lines in log10(compute) (past the last point its value holds up to the largest compute
measured) and read on a grid shared by the two families compared (only inside both families' measured ranges:
nothing is extrapolated). Between two frontier points the line lies above the best accuracy any run reached at or
below that compute (a step curve would stay at the lower point until the next run): it assumes a compute between two
runs' would buy an accuracy between theirs, the same assumption for every family.

The gap between two families is taken seed by seed (seed ``s`` of one family against seed ``s`` of the other). The
pairing is not arbitrary: the seed sets every epoch's shuffling and crop-and-flip draws from a generator of their own
(``vitviz.experiments.train``), so one seed's runs of every family and size see the same images in the same batches
with the same crops and flips (only their initial weights differ, the architectures being different). The seeds are
independent of each other, so the per-seed gaps are, and their spread estimates the gap's own variance (a paired
t-interval); two families without a seed in common are refused, and seeds only one family has are left out
with a ``UserWarning`` naming them. Every mean carries a 95% Student-t interval over
the seeds: ``mean +- t_{0.975, n-1} * sd / sqrt(n)``, cut to the accuracy's range (0 ... 100 %; a gap: -100 ... 100
points; ``vitviz.analysis.intervals``), which the accuracy columns must hold (``check_percent``). Runs without a
compute or an accuracy (NaN) are refused, not left out.

A frontier takes a maximum over noisy runs, so it is biased upwards by about the same amount for every family
with the same number of runs per seed; the gap, not the level, is the quantity compared.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from vitviz.analysis.intervals import PERCENT, PERCENT_DIFFERENCE, drop_rounding, t_interval
from vitviz.core.util import check_positive_int
from vitviz.errors import InputError

CONFIG_COLUMNS = ["family", "model", "size", "train_images", "epochs"]
COMPUTE_UNITS = {"train_pflops": "PFLOPs", "exaflops": "exaFLOPs"}  # compute column -> unit in sentences


def check_percent(runs: pd.DataFrame, metric: str) -> None:
    """Refuse an accuracy column ``metric`` of ``runs`` with a value outside 0 ... 100 (%): its intervals are cut to
    that range (``vitviz.analysis.intervals.PERCENT``). A missing column is left to the caller's own error."""
    if not isinstance(runs, pd.DataFrame) or metric not in runs.columns:
        return
    values = pd.to_numeric(runs[metric], errors="coerce")
    bad = values[(values < PERCENT[0]) | (values > PERCENT[1])]
    if len(bad):
        raise InputError(f"metric={metric!r} must be an accuracy in percent, 0 to 100, but holds {bad.iloc[0]:g}; "
                         "pass an accuracy column (its intervals are cut to 0 ... 100 %)")


def summarize(runs: pd.DataFrame, metric: str = "test_acc") -> pd.DataFrame:
    """One row per configuration (family, model, size, training images, epochs) over its seeds.

    Returns:
        ``CONFIG_COLUMNS`` + ``train_pflops`` (equal for every seed), ``n_seeds``, ``mean``, ``sd``, ``ci_low``,
        ``ci_high`` (95% t-interval of the mean, cut to 0 ... 100 %: ``t_interval``'s ``bounds``; NaN with one
        seed). A run without an accuracy or a compute (NaN) is refused, as in ``matched_compute``, and so is a
        seed with two rows for one configuration (it would count twice).
    """
    check_percent(runs, metric)
    if "family" in runs:
        _check_measured(runs, list(dict.fromkeys(runs["family"])), metric, "train_pflops")
    if "seed" in runs:
        keys = [*CONFIG_COLUMNS, "seed"]
        twice = runs[runs.duplicated(keys, keep=False)]
        if len(twice):  # one seed would enter the mean and the interval twice
            r = twice.iloc[0]
            name = r["run_id"] if "run_id" in twice else f"{r['model']} ({int(r['epochs'])} epochs)"
            same = (twice[keys] == r[keys]).all(axis=1)
            raise InputError(f"summarize: run {name} has {int(same.sum())} rows for seed {r['seed']}, which would "
                             f"count twice; pass one row per run, e.g. runs.drop_duplicates({keys})")
    rows = []
    for key, part in runs.groupby(CONFIG_COLUMNS, sort=False):
        mean, lo, hi = t_interval(part[metric], bounds=PERCENT)
        rows.append({**dict(zip(CONFIG_COLUMNS, key)), "train_pflops": float(part["train_pflops"].mean()),
                     "n_seeds": int(part["seed"].nunique()), "mean": mean,
                     "sd": float(part[metric].std(ddof=1)) if len(part) > 1 else float("nan"),
                     "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def pareto_frontier(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points not beaten by any cheaper-or-equal point: the best accuracy reached so far, by compute."""
    order = np.lexsort((-y, x))
    xs, ys, best = [], [], -np.inf
    for i in order:
        if y[i] > best:
            xs.append(x[i])
            ys.append(y[i])
            best = y[i]
    return np.asarray(xs), np.asarray(ys)


def frontier_at(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The Pareto frontier of points ``(x, y)`` (``pareto_frontier``), linearly interpolated in
    ``log10(x)`` at ``grid``; NaN outside ``[min(x), max(x)]``. Past the last frontier point the best value holds.
    """
    fx, fy = pareto_frontier(np.asarray(x, float), np.asarray(y, float))
    fx = np.append(fx, np.max(x)) if np.max(x) > fx[-1] else fx
    fy = np.append(fy, fy[-1]) if len(fy) < len(fx) else fy
    grid = np.asarray(grid, float)
    out = np.interp(np.log10(grid), np.log10(fx), fy)
    out[(grid < fx[0] * (1 - 1e-9)) | (grid > fx[-1] * (1 + 1e-9))] = np.nan
    return out


def shared_range(runs: pd.DataFrame, families: Sequence[str], x: str = "train_pflops") -> tuple[float, float]:
    """``(low, high)``: the compute range every one of ``families`` covers (the highest of their cheapest runs, the
    lowest of their most expensive ones), in ``x``'s unit; ``InputError`` for a family without runs or families
    whose ranges do not overlap."""
    lows, highs = [], []
    for fam in families:
        values = runs.loc[runs["family"] == fam, x]
        if not len(values):
            raise InputError(f"no runs of family {fam!r}; families present: {sorted(runs['family'].unique())}")
        lows.append(values.min())
        highs.append(values.max())
    lo, hi = max(lows), min(highs)
    if lo > hi:
        raise InputError(f"families {list(families)} share no compute range (lowest maxima {hi:.3g} below "
                         f"highest minima {lo:.3g} in {x})")
    return float(lo), float(hi)


def compute_grid(runs: pd.DataFrame, families: Sequence[str], n: int = 7, x: str = "train_pflops") -> np.ndarray:
    """``n`` log-spaced compute values spanning the range every one of ``families`` covers (their overlap)."""
    n = check_positive_int(n, "n", "the compute points on the shared grid (e.g. 7)")
    lo, hi = shared_range(runs, families, x)
    return np.geomspace(lo, hi, n) if hi > lo else np.array([lo])


def _check_measured(runs: pd.DataFrame, families: Sequence[str], metric: str, x: str) -> None:
    """Refuse rows of ``families`` without a positive compute ``x`` or with no ``metric`` (NaN: an unfinished or
    failed run), which a frontier would otherwise leave out without a word, naming the first such run."""
    part = runs[runs["family"].isin(list(families))]
    for col, bad in ((x, lambda v: ~(v > 0)), (metric, lambda v: v.isna())):
        if col not in part:
            continue
        rows = part[bad(pd.to_numeric(part[col], errors="coerce")).to_numpy()]
        if len(rows):
            first = rows.iloc[0]
            name = first["run_id"] if "run_id" in rows else f"row {rows.index[0]} ({first['family']})"
            want = "a positive compute" if col == x else "a value"
            raise InputError(f"{col}: {len(rows)} runs of {list(families)} have no {want} (first: {name}, "
                             f"{col}={first[col]!r}); the frontiers would leave them out silently. Finish those runs "
                             f"or drop them first, e.g. runs.dropna(subset=[{x!r}, {metric!r}])")


def family_curves(runs: pd.DataFrame, grid: np.ndarray, families: Sequence[str] | None = None,
                  metric: str = "test_acc", x: str = "train_pflops") -> pd.DataFrame:
    """Tidy per-seed frontier curves: rows of ``family``, ``seed``, ``x`` (the grid), ``metric``.

    Rows without a ``seed`` column (the paper's table: one run per model) count as one seed, 0.
    """
    families = list(families) if families is not None else list(runs["family"].unique())
    _check_measured(runs, families, metric, x)
    if "seed" not in runs:
        runs = runs.assign(seed=0)
    rows = []
    for fam in families:
        for seed, part in runs[runs["family"] == fam].groupby("seed"):
            ys = frontier_at(part[x].to_numpy(), part[metric].to_numpy(), grid)
            rows += [{"family": fam, "seed": int(seed), x: float(g), metric: float(y)}
                     for g, y in zip(grid, ys)]
    return pd.DataFrame(rows)


def matched_compute(runs: pd.DataFrame, a: str = "Hybrid", b: str = "Transformer (ViT)", *, n: int = 7,
                    grid: np.ndarray | None = None, metric: str = "test_acc",
                    x: str = "train_pflops") -> pd.DataFrame:
    """Family ``a`` against family ``b`` at equal training compute (see the module docstring).

    Args:
        runs: the study CSV's rows (one per run; ``family``, ``seed``, ``x``, ``metric``), from one training set
            (compare blocks separately: rows of several ``train_images`` are refused); or the paper's Table 6
            (``vitviz.paper_results()``, no seeds).
        a, b: the family labels compared; the gap is ``a - b``.
        n: grid points over the compute range both families cover (ignored when ``grid`` is given).
        grid: compute values (in ``x``'s unit) to compare at.
        metric: the accuracy column.
        x: the compute column (``"train_pflops"``; the paper's table: ``"exaflops"``).

    Returns:
        One row per grid point: ``x``, ``n_seeds``, ``<a>``/``<b>`` means with ``_low``/``_high``,
        ``gap``, ``gap_low``, ``gap_high`` (95% t-interval over seeds, points) and ``within_noise`` (the gap's
        interval includes 0; ``None`` where one seed gives no interval). A per-seed gap of rounding size is 0
        (``vitviz.analysis.intervals.drop_rounding``).
    """
    check_percent(runs, metric)
    check_one_training_set(runs, (a, b))
    if grid is None:
        grid = compute_grid(runs, (a, b), n, x)
    else:
        grid = np.asarray(grid, float).reshape(-1)
        lo, hi = shared_range(runs, (a, b), x)
        outside = grid[~((grid >= lo * (1 - 1e-9)) & (grid <= hi * (1 + 1e-9)))]
        if len(outside):
            raise InputError(f"grid={outside[0]:g} lies outside the compute range both {a!r} and {b!r} cover "
                             f"({lo:.4g} ... {hi:.4g} in {x}); nothing is extrapolated: pass grid values inside it, "
                             "or grid=None for n points over it")
    check_shared_seeds(runs, a, b, "matched_compute")
    curves = family_curves(runs, grid, (a, b), metric, x)
    wide = curves.pivot(index=[x, "seed"], columns="family", values=metric).reset_index()
    rows = []
    for g, part in wide.groupby(x):
        part = part.dropna(subset=[a, b])
        ma, la, ha = t_interval(part[a], bounds=PERCENT)
        mb, lb, hb = t_interval(part[b], bounds=PERCENT)
        gap, gl, gh = t_interval(drop_rounding(part[a] - part[b], part[a], part[b]), bounds=PERCENT_DIFFERENCE)
        rows.append({x: g, "n_seeds": len(part), a: ma, f"{a}_low": la, f"{a}_high": ha, b: mb,
                     f"{b}_low": lb, f"{b}_high": hb, "gap": gap, "gap_low": gl, "gap_high": gh,
                     "within_noise": bool(not (gl > 0 or gh < 0)) if np.isfinite(gl) else None})
    return pd.DataFrame(rows)


def check_one_training_set(runs: pd.DataFrame, families: Sequence[str]) -> None:
    """Refuse rows of ``families`` from several training sets (the study CSV's ``train_images`` blocks): one
    frontier (or one configuration's mean) over both would join a subset's runs to the whole set's as if more
    compute had bought the difference.

    Raises:
        InputError: the rows of ``families`` hold more than one ``train_images`` value; the message names the sizes
            and the selection that keeps one.
    """
    if "train_images" not in runs:
        return
    sizes = sorted(runs.loc[runs["family"].isin(list(families)), "train_images"].dropna().unique())
    if len(sizes) > 1:
        names = " and ".join(repr(f) for f in families) if len(families) <= 2 else "the families"
        raise InputError(f"runs holds runs of {names} on {len(sizes)} training sets (train_images "
                         f"{', '.join(f'{int(v):,}' for v in sizes)}): compare each alone, e.g. "
                         f"runs[runs.train_images == {int(sizes[0])}]")


def check_shared_seeds(runs: pd.DataFrame, a: str, b: str, caller: str) -> None:
    """Refuse two families with no seed in common: the gap is taken seed by seed, so there would be nothing to pair
    (a table of NaN). Seeds only one family has are left out of the comparison, with a ``UserWarning`` naming them
    (only ``n_seeds`` showed it). Rows without a ``seed`` column (the paper's table) are one seed."""
    if "seed" not in runs:
        return
    seeds = {fam: set(runs.loc[runs["family"] == fam, "seed"].dropna().astype(int)) for fam in (a, b)}
    if seeds[a] and seeds[b] and not seeds[a] & seeds[b]:
        raise InputError(f"families {a!r} (seeds {sorted(seeds[a])}) and {b!r} (seeds {sorted(seeds[b])}) share no "
                         "seed: the gap is taken seed by seed (a seed's runs see the same batches and augmentations "
                         "in every family), so nothing pairs; train both families with the same seeds (--seeds)")
    only = [f"{fam!r} has seed(s) {sorted(seeds[fam] - seeds[other])} that {other!r} lacks"
            for fam, other in ((a, b), (b, a)) if seeds[fam] - seeds[other]]
    if only:  # those seeds' runs get no gap: say so, rather than let the table look complete
        warnings.warn(f"{caller}: {'; '.join(only)}, so they are left out (the gap is taken seed by seed over the "
                      f"{len(seeds[a] & seeds[b])} seed(s) both families have); train both families with the same "
                      "seeds (--seeds), or drop the unpaired runs first", UserWarning, stacklevel=3)


def gap_trend(runs: pd.DataFrame, a: str = "Hybrid", b: str = "Transformer (ViT)", *, n: int = 7,
              metric: str = "test_acc") -> dict[str, float]:
    """Does the lead of ``a`` over ``b`` shrink with compute? Per seed, the least-squares slope of the
    matched-compute gap against log10(compute) (points per decade); mean and 95% t-interval over seeds.

    Returns:
        ``slope`` (points per decade; negative: the lead shrinks), ``slope_low``, ``slope_high``, ``n_seeds``,
        ``decades`` (the width of the shared compute range).
    """
    if check_positive_int(n, "n", "the compute points the slope is fitted to (e.g. 7)") < 2:
        raise InputError(f"n={n}: a slope needs at least 2 compute points; pass n >= 2 (e.g. 7)")
    check_one_training_set(runs, (a, b))
    grid = compute_grid(runs, (a, b), n)
    check_shared_seeds(runs, a, b, "gap_trend")
    curves = family_curves(runs, grid, (a, b), metric)
    wide = curves.pivot_table(index=["seed", "train_pflops"], columns="family", values=metric).reset_index()
    slopes = []
    for _, part in wide.groupby("seed"):
        part = part.dropna(subset=[a, b])
        if len(part) >= 2:
            gaps = drop_rounding(part[a] - part[b], part[a], part[b])
            slopes.append(np.polyfit(np.log10(part["train_pflops"]), gaps, 1)[0])
    slope, lo, hi = t_interval(slopes)
    return {"slope": slope, "slope_low": lo, "slope_high": hi, "n_seeds": len(slopes),
            "decades": float(np.log10(grid[-1] / grid[0]))}


def study_design(runs: pd.DataFrame) -> pd.DataFrame:
    """What a study CSV holds, per training-set size: epoch budgets, sizes, seeds per configuration (min and
    max), runs, test images and the hardware that trained them."""
    rows = []
    for n_train, part in runs.groupby("train_images"):
        seeds = part.groupby(["model", "epochs"])["seed"].nunique()
        rows.append({"train_images": int(n_train), "epochs": sorted(int(e) for e in part["epochs"].unique()),
                     "sizes": sorted(part["size"].unique()), "configurations": len(seeds),
                     "seeds_min": int(seeds.min()), "seeds_max": int(seeds.max()), "runs": len(part),
                     "test_images": sorted(int(t) for t in part["test_images"].unique()),
                     "device": "; ".join(sorted(part["device"].astype(str).unique()))})
    return pd.DataFrame(rows)


def describe_matched(table: pd.DataFrame, a: str, b: str, trend: dict[str, float] | None = None) -> list[str]:
    """The claims a ``matched_compute`` table (and a ``gap_trend``) supports, one sentence each: who leads at
    each compute, by how much, with the 95% interval, "within noise" where it includes 0."""
    x = table.columns[0] if len(table.columns) else "train_pflops"  # the compute column matched_compute wrote
    unit = COMPUTE_UNITS.get(x, x)
    lines = []
    for _, r in table.iterrows():
        n = int(r['n_seeds'])
        head = f"at {r[x]:.3g} {unit} ({n} seed{'s' if n != 1 else ''}): "
        if n == 0:
            lines.append(head + "no seed measured both families here")
        elif r["within_noise"] is None:
            lines.append(head + f"{a} - {b} = {r['gap']:+.1f} points (one seed: no interval)")
        elif r["within_noise"]:
            lines.append(head + f"within noise ({a} - {b} = {r['gap']:+.1f} points, 95% CI "
                         f"[{r['gap_low']:+.1f}, {r['gap_high']:+.1f}])")
        else:
            lead, gap = (a, r["gap"]) if r["gap"] > 0 else (b, -r["gap"])
            lo, hi = sorted((abs(r["gap_low"]), abs(r["gap_high"])))
            lines.append(head + f"{lead} leads by {gap:.1f} points (95% CI [{lo:.1f}, {hi:.1f}])")
    if trend is not None:
        if not np.isfinite(trend["slope_low"]):
            verdict = "no interval (fewer than 2 seeds)"
        elif trend["slope_low"] > 0:
            verdict = f"the lead of {a} grows with compute"
        elif trend["slope_high"] < 0:
            verdict = f"the lead of {a} shrinks with compute"
        else:
            verdict = "no trend beyond noise"
        lines.append(f"trend over {trend['decades']:.2f} decades: {trend['slope']:+.1f} points per decade "
                     f"(95% CI [{trend['slope_low']:+.1f}, {trend['slope_high']:+.1f}]): {verdict}")
    return lines
