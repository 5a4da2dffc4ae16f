"""Notebook 03's statements about the measured study, checked against the committed CSV and the shipped cards.

The notebook prints the numbers (``vitviz.experiments.compare``); its prose states the conclusions in words. If a
new sweep changes a conclusion, these tests fail and the prose must change with it.
"""

from __future__ import annotations

import pytest

from vitviz.experiments.compare import gap_trend, matched_compute, study_design
from vitviz.experiments.study import read_results

HYB, VIT, RES = "Hybrid", "Transformer (ViT)", "ResNet"


@pytest.fixture(scope="module")
def runs():
    df = read_results()
    if not len(df):
        pytest.skip("no committed study CSV")
    return df


def test_design_three_seeds_on_the_whole_test_set(runs):
    design = study_design(runs).set_index("train_images")
    assert design.loc[5000, "epochs"] == [2, 4, 8] and design.loc[5000, "sizes"] == ["L", "M", "S"]
    assert design.loc[5000, "seeds_min"] >= 3 and design.loc[5000, "configurations"] == 27
    assert (runs.test_images == 10_000).all()
    assert design.loc[50000, "epochs"] == [16] and design.loc[50000, "sizes"] == ["M", "S"]
    assert design.loc[50000, "seeds_min"] >= 3 and design.loc[50000, "configurations"] == 6
    assert runs.groupby("run_id").size().max() == 1, "one row per run"
    assert runs.device.str.contains("H100").all(), "the notebook's figure title names the GPU"


def test_subset_claims(runs):
    block = runs[runs.train_images == 5000]
    t = matched_compute(block, HYB, VIT, n=5)
    assert (t.n_seeds == 3).all()
    assert t.within_noise.iloc[0], "lowest matched compute: hybrid lead within noise"
    assert not t.within_noise.iloc[-1] and t.gap_low.iloc[-1] > 0, "highest: hybrid leads, interval above 0"
    trend = gap_trend(block, HYB, VIT, n=5)
    assert trend["slope_low"] > 0, "the lead does not shrink: positive slope, interval above 0"
    r = matched_compute(block, RES, HYB, n=5)
    assert (r.gap_low > 0).all(), "ResNet leads the hybrid at every matched compute"


def test_full_training_set_claims(runs):
    block = runs[runs.train_images == 50000]
    t = matched_compute(block, HYB, VIT, n=5)
    assert (t.n_seeds == 3).all() and (t.gap_low > 0).all(), "hybrid leads at every matched compute, interval > 0"
    assert (matched_compute(block, RES, HYB, n=5).gap_low > 0).all(), "the ResNet leads the hybrid"
    assert gap_trend(block, HYB, VIT, n=5)["decades"] < 1, "a fraction of a decade"


def test_compute_lies_orders_of_magnitude_below_the_paper(runs):
    """"many orders of magnitude below the paper's smallest model": at least four decades."""
    import vitviz

    paper_min_pflops = vitviz.paper_results().exaflops.min() * 1000
    assert paper_min_pflops / runs.train_pflops.max() > 1e4


def test_reference_card_claims():
    from vitviz.zoo.cards import reference_compute

    ref = reference_compute()
    if len(ref) < 3:
        pytest.skip("reference checkpoints not all shipped")
    r = ref.set_index("family")
    assert r.test_acc.idxmax() == RES and r.train_pflops.idxmin() == RES, "ResNet: best accuracy, least compute"
    assert r.loc[HYB, "test_acc"] > r.loc[VIT, "test_acc"] and r.loc[HYB, "train_pflops"] < r.loc[VIT, "train_pflops"]


def test_docs_table_quotes_the_committed_csv(runs):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "study.md").read_text()
    rows = re.findall(r"^\| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([-+0-9.]+) \| \[([-+0-9.]+), ([-+0-9.]+)\] \|",
                      text, flags=re.M)
    t = matched_compute(runs[runs.train_images == 5000], HYB, VIT, n=5)
    assert len(rows) == len(t)
    for row, (_, r) in zip(rows, t.iterrows()):
        got = [float(v) for v in row]
        want = [r.train_pflops, r[HYB], r[VIT], r.gap, r.gap_low, r.gap_high]
        assert got == pytest.approx(want, abs=6e-3), (row, want)
    trend = gap_trend(runs[runs.train_images == 5000], HYB, VIT, n=5)
    assert f"{trend['slope']:+.1f} points per decade (95% CI [{trend['slope_low']:+.1f}, " \
           f"{trend['slope_high']:+.1f}])" in text


def test_reference_models_sit_right_of_every_sweep_run(runs):
    """Notebook 03: the reference models lie "more than a decade beyond the 5,000-image runs, less than half a
    decade beyond the whole-set ones" (it said "one to two decades further right than the sweep": the whole-set
    runs end 0.14 decades short of the cheapest reference model)."""
    import numpy as np

    from vitviz.zoo.cards import reference_compute

    ref = reference_compute()
    if len(ref) < 3:
        pytest.skip("reference checkpoints not all shipped")
    top = runs.groupby("train_images").train_pflops.max()
    assert ref.train_pflops.min() > top.max(), "right of every run"
    assert np.log10(ref.train_pflops.min() / top[5000]) > 1, "more than a decade beyond the subset's runs"
    assert np.log10(ref.train_pflops.max() / top[50000]) < 0.5, "less than half a decade beyond the whole-set runs"


def test_readme_states_the_committed_study(runs):
    """README.md's study paragraph: runs, seeds, test images, the GPU, and the hybrid's lead at the top of the
    5,000-image range ("about 8 points"), as the committed CSV has them."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    section = text[text.index("## The hybrid-versus-pure study"):text.index("## Notebooks")]
    assert f"{len(runs)} runs" in section and f"{runs.seed.nunique()} seeds each" in section
    assert f"all {runs.test_images.max():,} CIFAR-10 test images" in section
    assert "H100" in section and runs.device.str.contains("H100").all()
    lead = int(re.search(r"about (\d+) points at the top of the range", section).group(1))
    top = matched_compute(runs[runs.train_images == 5000], HYB, VIT, n=5).iloc[-1]
    assert abs(top.gap - lead) < 0.5 and top.gap_low > 0
