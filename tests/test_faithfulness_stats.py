"""Intervals of faithfulness AUCs and paired comparisons: coverage at few images, refusals, the interval options."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import vitviz
from vitviz.errors import InputError


def null_curves(n_images: int, n_methods: int, rng: np.random.Generator) -> pd.DataFrame:
    """Curves whose AUC is the score: ``base`` at 0 and ``m<j>`` at a standard normal per image, so every paired
    difference ``m<j> - base`` is an independent draw with true mean 0 (metric ``target``: unbounded, not cut)."""
    rows = []
    values = {"base": np.zeros(n_images), **{f"m{j}": rng.normal(size=n_images) for j in range(n_methods)}}
    for method, v in values.items():
        for i in range(n_images):
            for f in (0.0, 1.0):
                rows.append((i, method, "deletion", f, v[i], "target", "drop"))
    return pd.DataFrame(rows, columns=["image", "method", "mode", "fraction", "score", "metric", "removal"])


def false_verdicts(n_images: int, interval: str, reps: int = 400) -> float:
    df = null_curves(n_images, reps, np.random.default_rng(n_images))
    paired = vitviz.compare_methods(df, baseline="base", interval=interval, n_boot=400)
    assert len(paired) == reps and (paired["n_images"] == n_images).all()
    return float((paired["verdict"] != "indistinguishable").mean())


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_paired_verdicts_at_no_difference_are_wrong_at_the_nominal_rate(n):
    # 400 null differences: the rate's standard error at 5% is 1.1%; the percentile bootstrap gives 49%, 25%, 19%
    # and 8.8% at 2, 3, 5 and 10 images here, each refused by this tolerance
    rate = false_verdicts(n, "t")
    assert 0.02 <= rate <= 0.085, rate
    if n <= 5:
        assert false_verdicts(n, "bootstrap") > 0.12  # the documented narrowness of the bootstrap option


def test_the_default_interval_is_the_paired_t_interval():
    from vitviz.analysis.faithfulness_stats import t_ci

    rng = np.random.default_rng(3)
    df = null_curves(7, 1, rng)
    paired = vitviz.compare_methods(df, baseline="base")
    d = df[(df.method == "m0") & (df.fraction == 0)].sort_values("image")["score"].to_numpy()
    half = stats.t.ppf(0.975, 6) * d.std(ddof=1) / np.sqrt(7)
    assert paired[["ci_low", "ci_high"]].iloc[0].tolist() == pytest.approx([d.mean() - half, d.mean() + half])
    assert paired.attrs["interval"] == "t"
    auc = vitviz.faithfulness_auc(df)
    row = auc[auc.method == "m0"].iloc[0]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(t_ci(d))
    boot = vitviz.faithfulness_auc(df, interval="bootstrap", n_boot=300, seed=2)
    assert boot[boot.method == "m0"][["ci_low", "ci_high"]].iloc[0].tolist() == pytest.approx(
        list(vitviz.bootstrap_ci(d, n_boot=300, seed=2)))
    assert boot.attrs["interval"] == "bootstrap"


def test_one_image_gives_no_interval_and_no_verdict():
    from vitviz.analysis.faithfulness_stats import t_ci

    df = null_curves(1, 2, np.random.default_rng(0))
    paired = vitviz.compare_methods(df, baseline="base")
    assert (paired["verdict"] == "too few images").all()
    assert paired["ci_low"].isna().all() and paired["ci_high"].isna().all()
    assert vitviz.faithfulness_auc(df)["ci_low"].isna().all()
    assert all(np.isnan(vitviz.bootstrap_ci([0.3]))) and all(np.isnan(t_ci([0.3])))


@pytest.mark.parametrize("kw, match", [(dict(n_boot=0), "n_boot=0 must be a positive int"),
                                       (dict(n_boot=10.5), "n_boot=10.5"), (dict(n_boot=True), "n_boot=True"),
                                       (dict(interval="bca"), "interval='bca'"), (dict(ci=95), "ci=95"),
                                       (dict(upto=90), r"upto=90 must be a fraction .* \(0, 1\]"),
                                       (dict(upto=0.95), r"upto=0.95 is not one of the fractions of df \(0, 0.5, 1\)")])
def test_bad_interval_arguments_name_the_value(kw, match):
    df = null_curves(4, 1, np.random.default_rng(0))
    df = pd.concat([df, df[df.fraction == 0].assign(fraction=0.5)], ignore_index=True)
    for f in (vitviz.faithfulness_auc, lambda d, **k: vitviz.compare_methods(d, baseline="base", **k)):
        with pytest.raises(InputError, match=match):
            f(df, **kw)
    with pytest.raises(InputError, match="seed=-1"):
        vitviz.bootstrap_ci([0.1, 0.2], seed=-1)


def test_nan_scores_are_refused_not_called_indistinguishable():
    df = null_curves(4, 1, np.random.default_rng(0))
    df.loc[(df.method == "m0") & (df.image == 2), "score"] = np.nan
    for f in (vitviz.faithfulness_auc, lambda d: vitviz.compare_methods(d, baseline="base")):
        with pytest.raises(InputError, match="2 NaN scores, e.g. image 2, m0/deletion"):
            f(df)
    with pytest.raises(InputError, match="NaN or infinite"):
        vitviz.bootstrap_ci([0.1, np.nan, 0.3])


def curve_frame(removed: bool) -> pd.DataFrame:
    """Two images whose curve falls 1, 0.5, 0 at the nominal steps 0, 0.5, 1, where 0.4 of the patches were removed
    at the step 0.5 (as on a grid the step does not divide)."""
    rows = [(i, "m", "deletion", f, r, s, "probability", "drop") for i in range(2)
            for f, r, s in ((0.0, 0.0, 1.0), (0.5, 0.4, 0.5), (1.0, 1.0, 0.0))]
    df = pd.DataFrame(rows, columns=["image", "method", "mode", "fraction", "removed", "score", "metric", "removal"])
    return df if removed else df.drop(columns="removed")


def test_the_auc_is_over_removed_where_the_frame_has_it_and_over_fraction_otherwise():
    # over removed: (1 + 0.5) / 2 * 0.4 + (0.5 + 0) / 2 * 0.6 = 0.45; over the nominal steps: 0.5
    assert vitviz.faithfulness_auc(curve_frame(removed=True))["auc"].item() == pytest.approx(0.45, abs=1e-15)
    assert vitviz.faithfulness_auc(curve_frame(removed=False))["auc"].item() == pytest.approx(0.5, abs=1e-15)
    # upto= picks the nominal step 0.5, integrated to the 0.4 removed there
    assert vitviz.faithfulness_auc(curve_frame(True), upto=0.5)["auc"].item() == pytest.approx(0.3, abs=1e-15)
    df = curve_frame(True)
    df.loc[(df.image == 1) & (df.fraction == 1.0), "removed"] = 0.3  # falls: not a faithfulness frame
    with pytest.raises(InputError, match=r"image 1, m/deletion, has 'removed' values \[0.0, 0.4, 0.3\] that fall"):
        vitviz.faithfulness_auc(df)


def flat_curves(aucs: dict[str, list[float]], metric: str) -> pd.DataFrame:
    """Flat curves (the same score at the fractions 0 and 1), so each image's AUC is its score."""
    rows = [(i, method, "deletion", f, a, metric, "drop") for method, v in aucs.items() for i, a in enumerate(v)
            for f in (0.0, 1.0)]
    return pd.DataFrame(rows, columns=["image", "method", "mode", "fraction", "score", "metric", "removal"])


def test_intervals_of_bounded_metrics_are_cut_to_their_range():
    # two images of AUC 0 and 1: the t interval of the mean is 0.5 +- 6.35; of m - base (base at 0.5 on both), 0 +- 6.35
    aucs = {"base": [0.5, 0.5], "m": [0.0, 1.0]}
    half = stats.t.ppf(0.975, 1) * np.std([0.0, 1.0], ddof=1) / np.sqrt(2)
    for metric in ("probability", "accuracy"):
        df = flat_curves(aucs, metric)
        row = vitviz.faithfulness_auc(df).set_index("method").loc["m"]
        assert (row["ci_low"], row["ci_high"]) == (0.0, 1.0)
        paired = vitviz.compare_methods(df, baseline="base").iloc[0]
        assert (paired["ci_low"], paired["ci_high"]) == (-1.0, 1.0)
        assert paired["verdict"] == "indistinguishable"  # zero lies in [-1, 1]: the cut never moves a verdict
        boot = vitviz.faithfulness_auc(df, interval="bootstrap", n_boot=200).set_index("method").loc["m"]
        assert 0.0 <= boot["ci_low"] <= boot["ci_high"] <= 1.0
    # the raw output of a headless model is unbounded: not cut
    df = flat_curves(aucs, "target")
    row = vitviz.faithfulness_auc(df).set_index("method").loc["m"]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.5 - half, 0.5 + half))
    paired = vitviz.compare_methods(df, baseline="base").iloc[0]
    assert (paired["ci_low"], paired["ci_high"]) == pytest.approx((-half, half))
    # an interval inside the range is left as it is
    df = flat_curves({"base": [0.5, 0.5, 0.5], "m": [0.4, 0.5, 0.6]}, "probability")
    row = vitviz.faithfulness_auc(df).set_index("method").loc["m"]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(t_ci_of([0.4, 0.5, 0.6]))


def t_ci_of(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values)
    half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return v.mean() - half, v.mean() + half


def test_bounded_scores_outside_their_range_are_refused():
    df = flat_curves({"base": [0.5, 0.5], "m": [0.2, 1.5]}, "probability")
    for f in (vitviz.faithfulness_auc, lambda d: vitviz.compare_methods(d, baseline="base")):
        with pytest.raises(InputError, match=r"2 probability scores outside \[0, 1\], e.g. 1.5 at image 1, "
                                             r"m/deletion.*metric 'target'"):
            f(df)


def test_upto_is_refused_for_curves_that_lack_that_step():
    # two methods on the same images with the same curve 1 - f, one run at steps=0.1, the other at steps=0.25: the
    # second has no step 0.9, so upto=0.9 would integrate it over [0, 0.75] only and compare it with the first's
    # [0, 0.9] (the same curves called different)
    rows = [(i, m, "deletion", float(f), float(f), 1 - float(f), "probability", "mean")
            for i in range(3) for m, n in (("a", 10), ("b", 4)) for f in np.linspace(0, 1, n + 1)]
    df = pd.DataFrame(rows, columns=["image", "method", "mode", "fraction", "removed", "score", "metric", "removal"])
    for f in (vitviz.faithfulness_auc, lambda d, **k: vitviz.compare_methods(d, baseline="a", **k)):
        with pytest.raises(InputError, match=r"upto=0.9.*b/deletion"):
            f(df, upto=0.9)
    # a step both curves have: each integrated over [0, 0.5], as the trapezoid of 1 - x there (exact: 0.375)
    aucs = vitviz.faithfulness_auc(df, upto=0.5).set_index("method")["auc"]
    assert aucs.to_dict() == pytest.approx({"a": 0.375, "b": 0.375})
    assert vitviz.compare_methods(df, baseline="a", upto=0.5)["diff"].item() == pytest.approx(0, abs=1e-12)


def test_identical_curves_on_other_step_grids_are_indistinguishable_not_better_by_a_rounding_error():
    """The same curve 1 - f at steps 0.1 and 0.25 (b): the trapezoids may differ by about 1e-17 at every image (they
    do with newer NumPy and pandas), the same at each, so the paired interval had width 0 beside 0 and the verdict
    read "better". c is a's curve one bit lower at every step, a rounding difference on every version. Rounding-size
    differences count as 0; a real difference, however constant over images, still decides."""
    rows = [(i, m, "deletion", float(f), float(f), 1 - float(f), "probability", "mean")
            for i in range(3) for m, n in (("a", 10), ("b", 4)) for f in np.linspace(0, 1, n + 1)]
    df = pd.DataFrame(rows, columns=["image", "method", "mode", "fraction", "removed", "score", "metric", "removal"])
    df = pd.concat([df, df[df.method == "a"].assign(method="c", score=lambda d: d.score * (1 - 2.0 ** -52))],
                   ignore_index=True)
    from vitviz.analysis.faithfulness_stats import per_image_auc

    a = per_image_auc(df).pivot(index="image", columns="method", values="auc")
    assert ((a["c"] - a["a"]) < 0).all()  # the rounding difference this test is about, at every image
    for upto in (0.5, 1.0):
        for interval in ("t", "bootstrap"):
            got = vitviz.compare_methods(df, baseline="a", upto=upto, interval=interval).set_index("method")
            assert (got["verdict"] == "indistinguishable").all() and (got["diff"] == 0).all()
    lower = df.assign(score=np.where(df["method"] == "b", df["score"] * (1 - 1e-6), df["score"]))  # real, tiny
    assert vitviz.compare_methods(lower, baseline="a").set_index("method").loc["b", "verdict"] == "better"


def test_a_mode_no_run_writes_is_refused_by_name():
    # the direction of a mode (BETTER) is known for the four modes only: another is refused naming it, not a KeyError
    df = flat_curves({"a": [0.5, 0.5], "b": [0.4, 0.6]}, "probability")
    df["mode"] = "Deletion"
    for f in (vitviz.faithfulness_auc, lambda d: vitviz.compare_methods(d, baseline="a")):
        with pytest.raises(InputError, match=r"df holds mode 'Deletion', which is not one of \('positive', "):
            f(df)


def test_a_mode_the_baseline_was_not_run_in_is_named_not_left_out_without_a_word():
    """The baseline on deletion only, another method on deletion and insertion: the insertion curves got no row and
    the table looked complete. A warning names what is not compared; the deletion row is the paired comparison."""
    both = flat_curves({"a": [0.2, 0.4, 0.5], "b": [0.3, 0.5, 0.7]}, "probability")
    frame = pd.concat([both, both[both.method == "b"].assign(mode="insertion")], ignore_index=True)
    with pytest.warns(UserWarning, match=r"baseline='a' has no curves for insertion/probability/drop"):
        got = vitviz.compare_methods(frame, baseline="a")
    assert got[["mode", "method"]].values.tolist() == [["deletion", "b"]]
    assert got["diff"].item() == pytest.approx(0.1333333333333)



def test_the_bootstrap_of_a_comparison_resamples_images_for_both_methods_at_once():
    """The paired bootstrap: one resample of images moves both methods' AUCs of an image together, so the
    between-image spread (here 100 times the difference's) cancels; resampling the two methods apart would not."""
    rng = np.random.default_rng(5)
    n = 40
    base = rng.normal(scale=10.0, size=n)
    shifted = base + 0.5 + rng.normal(scale=0.1, size=n)
    rows = [(i, m, "deletion", f, v[i], "target", "drop") for m, v in (("base", base), ("m", shifted))
            for i in range(n) for f in (0.0, 1.0)]
    df = pd.DataFrame(rows, columns=["image", "method", "mode", "fraction", "score", "metric", "removal"])
    row = vitviz.compare_methods(df, baseline="base", interval="bootstrap", n_boot=500, seed=4).iloc[0]
    idx = np.random.default_rng(4).integers(0, n, size=(500, n))  # bootstrap_ci's resamples: seed 4, n images
    joint = np.quantile(shifted[idx].mean(1) - base[idx].mean(1), [0.025, 0.975])
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(joint))
    assert row["verdict"] == "worse" and row["ci_high"] - row["ci_low"] < 0.1  # deletion: higher is worse
    apart = shifted[idx].mean(1) - base[np.random.default_rng(9).integers(0, n, size=(500, n))].mean(1)
    assert np.ptp(np.quantile(apart, [0.025, 0.975])) > 30 * (row["ci_high"] - row["ci_low"])


def test_t_interval_is_scipys_one_sample_interval_and_takes_any_tensor_dtype():
    torch = pytest.importorskip("torch")
    from vitviz.analysis.intervals import t_interval

    values = [0.25, 0.5, 0.75, 1.5, 2.0]  # exact in bfloat16
    want = stats.ttest_1samp(values, 0.0).confidence_interval(0.9)  # t quantile at n - 1 = 4 degrees of freedom
    for v in (values, torch.tensor(values, dtype=torch.bfloat16), torch.tensor(values, dtype=torch.float16)):
        mean, lo, hi = t_interval(v, 0.9)
        assert (mean, lo, hi) == pytest.approx((np.mean(values), want.low, want.high), rel=1e-12)
