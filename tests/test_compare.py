"""Seed summaries and the matched-compute comparison, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import vitviz
from vitviz.analysis.trends import depth_trend
from vitviz.errors import InputError
from vitviz.experiments.compare import (
    compute_grid,
    describe_matched,
    frontier_at,
    gap_trend,
    matched_compute,
    summarize,
    t_interval,
)

T_0975_2 = 4.302652729749464  # Student t, 97.5% quantile, 2 degrees of freedom (tables)


def test_t_interval_by_hand():
    mean, lo, hi = t_interval([1.0, 2.0, 3.0])  # sd 1, n 3
    assert mean == 2.0 and hi - mean == pytest.approx(T_0975_2 / np.sqrt(3)) and mean - lo == pytest.approx(hi - mean)
    assert np.isnan(t_interval([5.0])[1]) and t_interval([5.0])[0] == 5.0
    assert np.isnan(t_interval([])[0])


def test_t_interval_drops_nans_and_refuses_what_has_no_interval():
    """A NaN is a missing measurement and is dropped; an infinite value (no mean) and a confidence outside
    (0, 1) (``confidence=95`` gave a NaN interval without a word) are refused by name."""
    assert t_interval([1.0, np.nan, 2.0, 3.0]) == t_interval([1.0, 2.0, 3.0])
    with pytest.raises(InputError, match=r"values hold inf, which has no mean"):
        t_interval([1.0, np.inf, 3.0])
    for confidence in (95, 0, 1.0, -0.5, True, "0.95"):
        with pytest.raises(InputError, match=r"confidence=.* must lie in \(0, 1\).*0\.95"):
            t_interval([1.0, 2.0, 3.0], confidence)
    assert t_interval([1.0, 2.0, 3.0], 0.5)[2] - 2.0 < t_interval([1.0, 2.0, 3.0], 0.99)[2] - 2.0


def test_summarize_one_row_per_configuration():
    runs = pd.DataFrame({"family": "A", "model": ["a-S"] * 3 + ["a-M"], "size": ["S"] * 3 + ["M"],
                         "train_images": 100, "epochs": 2, "seed": [0, 1, 2, 0], "train_pflops": [1.0] * 3 + [2.0],
                         "test_acc": [10.0, 20.0, 30.0, 50.0]})
    s = summarize(runs).set_index("model")
    assert s.loc["a-S", "mean"] == 20.0 and s.loc["a-S", "sd"] == 10.0 and s.loc["a-S", "n_seeds"] == 3
    assert s.loc["a-S", "ci_high"] == pytest.approx(20 + T_0975_2 * 10 / np.sqrt(3))
    assert s.loc["a-M", "n_seeds"] == 1 and np.isnan(s.loc["a-M", "ci_low"])


def test_frontier_interpolates_in_log_compute_and_never_extrapolates():
    x = np.array([1.0, 10.0, 100.0, 1000.0])
    y = np.array([10.0, 30.0, 20.0, 50.0])  # the 100 point is beaten by the cheaper 10 point
    got = frontier_at(x, y, np.array([0.5, 1.0, np.sqrt(10.0), 100.0, 1000.0, 2000.0]))
    # frontier (1, 10), (10, 30), (1000, 50): halfway in log between 10 and 1000 is 100 -> 40
    np.testing.assert_allclose(got, [np.nan, 10.0, 20.0, 40.0, 50.0, np.nan])
    # past the last frontier point the best value holds up to the largest compute measured
    np.testing.assert_allclose(frontier_at(np.array([1.0, 10.0]), np.array([50.0, 40.0]), np.array([3.0, 10.0])),
                               [50.0, 50.0])


def _runs(family, seed, points):
    return [{"family": family, "seed": seed, "train_pflops": c, "test_acc": a} for c, a in points]


def test_matched_compute_by_hand():
    rows = []
    for seed, shift in ((0, 0.0), (1, 2.0), (2, 4.0)):
        rows += _runs("A", seed, [(1.0, 40 + shift), (100.0, 60 + shift)])   # A at 10: 50 + shift
        rows += _runs("B", seed, [(10.0, 45.0), (1000.0, 70.0)])             # B at 10: 45
    runs = pd.DataFrame(rows)
    np.testing.assert_allclose(compute_grid(runs, ("A", "B"), 3), [10.0, np.sqrt(1000.0), 100.0])
    t = matched_compute(runs, "A", "B", grid=np.array([10.0, 100.0]))
    # at 10: gaps 5, 7, 9 -> mean 7, sd 2; at 100: A 60/62/64, B halfway (log) between 45 and 70 = 57.5
    assert list(t.n_seeds) == [3, 3]
    assert t.gap.tolist() == pytest.approx([7.0, 4.5])
    assert t.gap_high[0] - 7.0 == pytest.approx(T_0975_2 * 2 / np.sqrt(3))
    assert not t.within_noise[0] and t.A[0] == pytest.approx(52.0) and t.B[1] == pytest.approx(57.5)
    trend = gap_trend(runs, "A", "B", n=2)  # gap falls 2.5 points over the one decade 10 -> 100, every seed
    assert trend["slope"] == pytest.approx(-2.5) and trend["decades"] == pytest.approx(1.0)
    assert trend["slope_low"] == pytest.approx(-2.5) and trend["n_seeds"] == 3
    lines = describe_matched(t, "A", "B", trend)
    assert lines[0].startswith("at 10 PFLOPs (3 seeds): A leads by 7.0 points")
    assert lines[-1].endswith("the lead of A shrinks with compute")


def test_within_noise_and_one_seed():
    rows = _runs("A", 0, [(1.0, 50.0), (10.0, 60.0)]) + _runs("B", 0, [(1.0, 52.0), (10.0, 55.0)])
    rows += _runs("A", 1, [(1.0, 54.0), (10.0, 60.0)]) + _runs("B", 1, [(1.0, 50.0), (10.0, 55.0)])
    t = matched_compute(pd.DataFrame(rows), "A", "B", grid=np.array([1.0, 10.0]))
    assert t.gap.tolist() == pytest.approx([1.0, 5.0])
    assert t.within_noise.tolist() == [True, False]  # gaps -2, +4: interval spans 0; gaps 5, 5: no spread
    assert "within noise" in describe_matched(t, "A", "B")[0]
    one = matched_compute(pd.DataFrame(rows[:4]), "A", "B", grid=np.array([1.0]))
    assert one.within_noise[0] is None and "no interval" in describe_matched(one, "A", "B")[0]
    with pytest.raises(ValueError, match="no runs of family 'C'"):
        compute_grid(pd.DataFrame(rows), ("A", "C"))
    with pytest.raises(ValueError, match="share no compute range"):
        compute_grid(pd.DataFrame(_runs("A", 0, [(1.0, 1.0)]) + _runs("B", 0, [(5.0, 1.0)])), ("A", "B"))


def test_depth_trend_spearman():
    rising = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    t = depth_trend(rising)
    from scipy import stats

    ref = stats.pearsonr(stats.rankdata([0, 0, 1, 1, 2, 2, 3, 3]), stats.rankdata(rising.ravel()))
    assert t["rho"] == pytest.approx(ref[0]) and t["rho"] > 0.9 and t["p"] < 0.01
    assert depth_trend(rising[::-1])["rho"] == pytest.approx(-t["rho"])
    assert t["first_mean"] == 1.5 and t["last_mean"] == 7.5 and (t["layers"], t["heads"]) == (4, 2)
    with pytest.raises(ValueError, match="L >= 2"):
        depth_trend(np.ones((1, 3)))


def test_depth_trend_of_a_constant_statistic_is_nan_without_a_warning_and_no_heads_are_refused():
    """Every value the same: no ordering, so rho and p are NaN (scipy said so with a ConstantInputWarning only); a
    statistic of no heads is refused naming its shape."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = depth_trend(np.full((3, 2), 0.5))
    assert np.isnan(t["rho"]) and np.isnan(t["p"]) and t["first_mean"] == t["last_mean"] == 0.5
    with pytest.raises(ValueError, match=r"H >= 1 head, got shape \(3, 0\)"):
        depth_trend(np.ones((3, 0)))


def test_study_figure_has_error_bars_and_a_gap_band():
    from conftest import tiny_study_runs
    from matplotlib.collections import LineCollection, PolyCollection

    from vitviz.plot.compute import plot_study_grid

    fig = plot_study_grid(tiny_study_runs())
    runs_ax, gap_ax = fig.axes
    assert runs_ax.get_xscale() == "log" and runs_ax.get_ylabel() == "Test accuracy [%]"
    assert "3 seeds" in runs_ax.get_title()
    assert any(isinstance(c, LineCollection) for c in runs_ax.collections), "error bars"
    assert any(isinstance(c, PolyCollection) for c in gap_ax.collections), "the gap's band"
    assert gap_ax.get_ylabel() == "Accuracy gap [points]" and gap_ax.get_title() == "At equal training compute"
    assert [t.get_text() for t in runs_ax.get_legend().get_texts()] == ["Hybrid", "Transformer (ViT)"]


def test_intervals_of_accuracies_stay_in_0_to_100():
    """Few seeds near 100 %: the Student-t half-width reaches past 100, the interval is cut there (the mean of
    accuracies is at most 100, so the cut interval covers it as often), and the uncut one is what it was."""
    from vitviz.analysis.intervals import PERCENT, t_interval

    values = [99.9, 97.0, 99.5]
    mean, lo, hi = t_interval(values)
    assert hi > 100  # the case the cut is for
    assert t_interval(values, bounds=PERCENT) == (mean, lo, 100.0)
    assert t_interval([0.2, 3.0, 0.1], bounds=PERCENT)[1] == 0.0
    assert np.isnan(t_interval([99.0], bounds=PERCENT)[1])  # one value: no interval, cut or not
    with pytest.raises(InputError, match=r"the value 101 lies outside bounds=\(0.0, 100.0\)"):
        t_interval([99.0, 101.0], bounds=PERCENT)
    m, low, high = t_interval([100.0, 100.0 + 1e-12], bounds=PERCENT)  # a rounding error past the range: in it
    assert low <= m <= high and m > 100.0  # the cut interval still holds its own mean
    runs = pd.DataFrame({"family": "ViT", "model": "ViT-Ti", "size": "Ti", "train_images": 100, "epochs": 1,
                         "seed": [0, 1, 2], "train_pflops": 1.0, "test_acc": values})
    row = summarize(runs).iloc[0]
    assert (row["ci_low"], row["ci_high"]) == (lo, 100.0)
    with pytest.raises(InputError, match=r"metric='test_acc' must be an accuracy in percent, 0 to 100, but holds 150"):
        summarize(runs.assign(test_acc=[150.0, 90.0, 91.0]))


def _three_seeds(a_seeds=(0, 1, 2), b_seeds=(0, 1, 2)):
    rows = []
    for seed in a_seeds:
        rows += _runs("A", seed, [(1.0, 40.0 + seed), (100.0, 60.0 + seed)])
    for seed in b_seeds:
        rows += _runs("B", seed, [(1.0, 45.0), (100.0, 70.0 - seed)])
    return pd.DataFrame(rows)


def test_families_without_a_common_seed_are_refused_not_a_table_of_nan():
    """The gap is taken seed by seed: families trained on other seeds have nothing to pair (the table was all NaN,
    each sentence saying "one seed: no interval" over 0 seeds)."""
    runs = _three_seeds(b_seeds=(3, 4, 5))
    with pytest.raises(InputError, match=r"'A' \(seeds \[0, 1, 2\]\) and 'B' \(seeds \[3, 4, 5\]\) share no seed"):
        matched_compute(runs, "A", "B", n=3)
    with pytest.raises(InputError, match="share no seed"):
        gap_trend(runs, "A", "B", n=3)
    with pytest.warns(UserWarning, match="matched_compute"):
        partly = matched_compute(_three_seeds(b_seeds=(1, 2, 3)), "A", "B", n=3)  # the seeds in common pair
    assert list(partly.n_seeds) == [2, 2, 2]


def test_seeds_only_one_family_has_are_named_not_dropped_silently():
    """Seeds one family lacks were left out of the gap silently (only ``n_seeds`` showed it): both functions now
    warn, naming each family's unpaired seeds; families with the same seeds give no warning."""
    import warnings

    runs = _three_seeds(a_seeds=(0, 1, 2, 7), b_seeds=(1, 2, 3))
    msg = r"'A' has seed\(s\) \[0, 7\] that 'B' lacks; 'B' has seed\(s\) \[3\] that 'A' lacks"
    with pytest.warns(UserWarning, match="matched_compute: " + msg + r".*over the 2 seed\(s\) both"):
        t = matched_compute(runs, "A", "B", n=3)
    assert list(t.n_seeds) == [2, 2, 2]
    with pytest.warns(UserWarning, match="gap_trend: " + msg):
        assert gap_trend(runs, "A", "B", n=3)["n_seeds"] == 2
    with pytest.warns(UserWarning, match=r"'A' has seed\(s\) \[2\] that 'B' lacks, so"):
        matched_compute(_three_seeds(b_seeds=(0, 1)), "A", "B", n=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        matched_compute(_three_seeds(), "A", "B", n=3)
        gap_trend(_three_seeds(), "A", "B", n=3)


def test_a_grid_outside_the_shared_range_is_refused_not_dropped():
    """Nothing is extrapolated: a grid point outside both families' range was silently left out of the table (all
    of them: an empty frame without columns)."""
    runs = _three_seeds()
    with pytest.raises(InputError, match=r"grid=1000 lies outside the compute range both 'A' and 'B' cover "
                                         r"\(1 \.\.\. 100 in train_pflops\)"):
        matched_compute(runs, "A", "B", grid=np.array([10.0, 1000.0]))
    with pytest.raises(InputError, match="grid=0.1 lies outside"):
        matched_compute(runs, "A", "B", grid=np.array([0.1]))
    assert list(matched_compute(runs, "A", "B", grid=np.array([1.0, 100.0])).train_pflops) == [1.0, 100.0]


def test_a_grid_point_no_seed_measured_in_both_families_keeps_its_row():
    rows = _runs("A", 0, [(1.0, 40.0), (100.0, 60.0)]) + _runs("A", 1, [(1.0, 41.0), (10.0, 50.0)])
    rows += _runs("B", 0, [(1.0, 45.0), (10.0, 50.0)]) + _runs("B", 1, [(1.0, 44.0), (100.0, 70.0)])
    t = matched_compute(pd.DataFrame(rows), "A", "B", grid=np.array([1.0, 50.0]))
    assert list(t.n_seeds) == [2, 0] and np.isnan(t.gap[1]) and t.within_noise[1] is None
    assert describe_matched(t, "A", "B")[1] == "at 50 PFLOPs (0 seeds): no seed measured both families here"


@pytest.mark.parametrize("column", ["test_acc", "train_pflops"])
def test_runs_without_an_accuracy_or_a_compute_are_refused_not_left_out(column):
    """A NaN accuracy (an unfinished run) was skipped by the frontier without a word, or raised an IndexError
    when it was a seed's only run left."""
    runs = _three_seeds().assign(run_id=lambda d: [f"r{i}" for i in range(len(d))])
    runs.loc[3, column] = np.nan
    with pytest.raises(InputError, match=rf"{column}: 1 runs of \['A', 'B'\] have no .*first: r3"):
        matched_compute(runs, "A", "B", n=3)
    one = _three_seeds()
    one.loc[(one.family == "A") & (one.seed == 0), "test_acc"] = np.nan
    with pytest.raises(InputError, match="test_acc: 2 runs"):
        matched_compute(one, "A", "B", n=3)
    # a seed summary over the seeds that have one was labelled with all three (n_seeds 3, the mean of 2)
    runs = runs.assign(model=runs.family, size="S", train_images=100, epochs=1)
    with pytest.raises(InputError, match=rf"{column}: 1 runs of \['A', 'B'\] have no .*first: r3"):
        summarize(runs)


def test_describe_matched_reads_the_compute_column_of_the_paper_table():
    """``matched_compute(..., x="exaflops")`` (the paper's Table 6) is described in exaFLOPs (it raised KeyError)."""
    import vitviz

    t = matched_compute(vitviz.paper_results(), "Hybrid", "Transformer (ViT)", metric="imagenet", x="exaflops", n=5)
    lines = describe_matched(t, "Hybrid", "Transformer (ViT)")
    assert lines[0] == f"at 106 exaFLOPs (1 seed): Hybrid - Transformer (ViT) = {t.gap[0]:+.1f} points " \
                       "(one seed: no interval)"
    assert len(lines) == 5


def test_runs_of_several_training_sets_are_refused_not_joined_into_one_frontier():
    """The study CSV holds two blocks (5,000 and 50,000 training images); ``matched_compute(read_results())`` joined
    them into one frontier per seed."""
    small = _three_seeds().assign(train_images=100)
    both = pd.concat([small, small.assign(train_images=1000, train_pflops=small.train_pflops * 10)])
    with pytest.raises(InputError, match=r"on 2 training sets \(train_images 100, 1,000\).*train_images == 100\]"):
        matched_compute(both, "A", "B", n=3)
    with pytest.raises(InputError, match="on 2 training sets"):
        gap_trend(both, "A", "B", n=3)
    assert len(matched_compute(both[both.train_images == 1000], "A", "B", n=3)) == 3


@pytest.mark.parametrize("n", [0, -1, 2.5])
def test_a_grid_size_that_is_not_a_positive_int_is_refused_naming_n(n):
    """It raised a KeyError on 'family' (0), numpy's ValueError (-1) or a TypeError (2.5)."""
    with pytest.raises(InputError, match=r"\bn\b.*compute points"):
        matched_compute(_three_seeds(), "A", "B", n=n)
    with pytest.raises(InputError, match=r"\bn\b.*compute points"):
        gap_trend(_three_seeds(), "A", "B", n=n)


def test_gap_trend_needs_two_compute_points():
    """With one grid point every seed's slope was skipped: a NaN slope over "0 seeds", no error."""
    with pytest.raises(InputError, match="n=1: a slope needs at least 2 compute points"):
        gap_trend(_three_seeds(), "A", "B", n=1)


def test_the_study_plots_refuse_runs_of_several_training_sets():
    """plot_study_runs averaged a configuration over both training sets and ran one frontier through them, and
    plot_matched_gap joined their frontiers, as matched_compute did; plot_study_grid draws each set apart."""
    import matplotlib.pyplot as plt
    from conftest import tiny_study_runs

    one = tiny_study_runs()
    runs = pd.concat([one, one.assign(train_images=1000, test_acc=lambda d: d.test_acc + 9)])
    try:
        for plot in (vitviz.plot_study_runs, vitviz.plot_matched_gap):
            with pytest.raises(InputError, match=r"2 training sets \(train_images 100, 1,000\).*train_images == 100"):
                plot(runs)
            plot(runs[runs["train_images"] == 1000])  # one set draws
        assert len(vitviz.plot_study_grid(runs).axes) >= 4  # a row of panels per set
    finally:
        plt.close("all")


def test_plot_matched_gap_pairs_seeds_as_matched_compute_does():
    """plot_matched_gap paired the seeds itself: seeds one family lacks were left out without a word, and two
    families with no seed in common drew an empty panel (a legend of "mean of 0 seeds"). It now warns and refuses
    as matched_compute does, and its legend counts the paired seeds."""
    import warnings

    import matplotlib.pyplot as plt

    try:
        with pytest.raises(InputError, match=r"'A' \(seeds \[0, 1, 2\]\) and 'B' \(seeds \[3, 4, 5\]\) share no"):
            vitviz.plot_matched_gap(_three_seeds(b_seeds=(3, 4, 5)), "A", "B", n=3)
        with pytest.warns(UserWarning, match=r"plot_matched_gap: 'A' has seed\(s\) \[0\] that 'B' lacks"):
            ax = vitviz.plot_matched_gap(_three_seeds(b_seeds=(1, 2)), "A", "B", n=3)
        assert any("mean of 2 seeds" in t.get_text() for t in ax.get_legend().get_texts())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            vitviz.plot_matched_gap(_three_seeds(), "A", "B", n=3)
    finally:
        plt.close("all")


def test_a_gap_of_rounding_size_is_within_noise_not_a_lead():
    """Family B's middle run lies on family A's straight line (in log10 compute) and the two share every other run,
    so the two frontiers are the same curve and the gap is 0 at every compute; interpolating on B's extra knot
    differs from interpolating over A's one segment by a rounding error (7e-15) at some grid points, the same at
    every seed, whose interval of width 0 read "A leads by 0.0 points"."""
    x0, x1, xm, y0, y1 = 1.0, 100.0, 3.0, 10.0, 50.0
    ym = y0 + (y1 - y0) * (np.log10(xm) - np.log10(x0)) / (np.log10(x1) - np.log10(x0))
    rows = []
    for s in range(3):
        rows += [{"family": "A", "seed": s, "train_pflops": x, "test_acc": y + s} for x, y in ((x0, y0), (x1, y1))]
        rows += [{"family": "B", "seed": s, "train_pflops": x, "test_acc": y + s}
                 for x, y in ((x0, y0), (xm, ym), (x1, y1))]
    runs = pd.DataFrame(rows)
    table = matched_compute(runs, "A", "B")
    assert (table.within_noise == True).all()  # noqa: E712 (None is not True)
    assert np.allclose(table.gap, 0.0, atol=1e-12) and (table.gap_low <= 0).all() and (table.gap_high >= 0).all()
    assert not any("leads" in line for line in describe_matched(table, "A", "B"))
    trend = gap_trend(runs, "A", "B")
    assert trend["slope_low"] <= 0 <= trend["slope_high"]


def test_summarize_refuses_a_seed_with_two_rows_not_counted_twice():
    """A run listed twice (a CSV concatenated with itself in part) is one seed, yet its accuracy entered the mean
    and the interval twice (n_seeds said 3, the interval was over 4 values, narrower); it is refused by name."""
    runs = pd.DataFrame({"family": "A", "model": "a-S", "size": "S", "train_images": 100, "epochs": 2,
                         "seed": [0, 1, 2], "train_pflops": 1.0, "test_acc": [10.0, 20.0, 30.0],
                         "run_id": ["a-s0", "a-s1", "a-s2"]})
    with pytest.raises(InputError, match=r"a-s1.*2 rows.*seed 1.*drop_duplicates"):
        summarize(pd.concat([runs, runs.iloc[[1]]], ignore_index=True))
    mean, lo, hi = summarize(runs).iloc[0][["mean", "ci_low", "ci_high"]]
    assert (mean, lo, hi) == pytest.approx(t_interval([10.0, 20.0, 30.0], bounds=(0.0, 100.0)))
