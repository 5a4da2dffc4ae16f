"""Table 8 over training seeds (``vitviz.experiments.posemb_seeds``): the runs' architectures, the claims paired by
seed, the resumable sweep on a tiny folder, the figure, and the committed results."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vitviz.errors import CheckpointError, InputError

DATA = Path(__file__).resolve().parents[1] / "data" / "posemb_seeds"


def _runs(final: dict[str, float], seeds=(0, 1, 2), epochs=(1, 2, 3)) -> pd.DataFrame:
    from vitviz.experiments.posemb_seeds import ENCODINGS, run_id

    rows = []
    for enc, acc in final.items():
        for seed in seeds:
            for epoch in epochs:
                rows.append({"run": run_id(enc, seed), "encoding": enc, "pos_emb": ENCODINGS[enc][1], "seed": seed,
                             "epoch": epoch, "test_acc": acc * epoch / max(epochs), "epochs_planned": max(epochs)})
    return pd.DataFrame(rows)


def test_each_encoding_trains_its_ablation_models_architecture_at_one_recipe():
    """The runs of one seed differ in the position embedding only: the shipped ablation models' builders, one
    recipe, one subset, one seed; each run its own folder."""
    from dataclasses import asdict

    from vitviz.experiments.posemb_seeds import PosembSeedsConfig, runs
    from vitviz.zoo.reference import build_reference

    cfg = PosembSeedsConfig(seeds=(3,))
    rs = runs(cfg)
    assert [r.id for r in rs] == ["none-s3", "1d-s3", "2d-s3"]
    recipes = [{k: v for k, v in asdict(r.config).items() if k not in ("model", "out")} for r in rs]
    assert all(rec == recipes[0] for rec in recipes) and recipes[0]["seed"] == 3
    assert len({r.config.run_dir for r in rs}) == 3
    models = {r.keys["encoding"]: build_reference(r.config.model, **r.config.model_kwargs) for r in rs}
    pos = {n: sorted(k for k in m.state_dict() if "pos" in k) for n, m in models.items()}
    assert pos == {"none": [], "1d": ["pos_embed"], "2d": ["pos_embed_col", "pos_embed_prefix", "pos_embed_row"]}
    others = {n: {k: v.shape for k, v in m.state_dict().items() if "pos" not in k} for n, m in models.items()}
    assert others["none"] == others["1d"] == others["2d"]  # everything but the position embedding is shared
    assert {r.keys["pos_emb"] for r in rs} == {"No Pos. Emb.", "1-D Pos. Emb.", "2-D Pos. Emb."}


def test_claims_are_paired_by_seed_and_carry_the_papers_differences():
    """Each comparison is the Student-t interval of the per-seed differences, recomputed here by hand: a seed effect
    shared by every encoding (+-4 points) cancels, so the interval is narrower than the marginal spread; the
    paper's column is Table 8's difference in points."""
    from scipy import stats

    from vitviz.experiments.posemb_seeds import posemb_seed_claims, posemb_seed_differences

    df = _runs({"none": 50.0, "1d": 58.0, "2d": 58.5})
    last = df.epoch == df.epoch.max()
    shared = {0: -4.0, 1: 0.0, 2: 4.0}
    own = {("2d", 0): 0.3, ("2d", 1): -0.4, ("2d", 2): 0.6}
    for sd, d in shared.items():
        df.loc[last & (df.seed == sd), "test_acc"] += d
    for (enc, sd), d in own.items():
        df.loc[last & (df.seed == sd) & (df.encoding == enc), "test_acc"] += d
    c = posemb_seed_claims(df).set_index(["arm", "minus"])
    assert list(c.index) == [("1d", "none"), ("2d", "none"), ("2d", "1d")]
    d = np.array([0.5 + own[("2d", sd)] for sd in shared])  # 2-D minus 1-D, per seed
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    row = c.loc[("2d", "1d")]
    assert row.difference == pytest.approx(d.mean()) and row.seeds == 3 and row.epochs == 3
    assert (row.low, row.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert row.arm_mean - row.minus_mean == pytest.approx(row.difference)
    assert row.excludes_zero == bool(row.low > 0 or row.high < 0)
    assert c.loc[("1d", "none")].difference == pytest.approx(8.0) and c.loc[("1d", "none")].excludes_zero
    assert c.loc[("1d", "none")].low == pytest.approx(8.0)  # no own noise: a zero-width interval
    assert c.paper.to_dict() == pytest.approx({("1d", "none"): 64.206 - 61.382, ("2d", "none"): 64.001 - 61.382,
                                               ("2d", "1d"): 64.001 - 64.206})
    per_seed = posemb_seed_differences(df)
    assert len(per_seed) == 9 and per_seed.groupby(["arm", "minus"]).seed.nunique().eq(3).all()
    one = posemb_seed_claims(df[df.seed == 0])
    assert one.seeds.eq(1).all() and one.low.isna().all() and not one.excludes_zero.any()
    two = posemb_seed_claims(df[df.encoding.isin(["1d", "2d"])])  # only the comparison both arms have
    assert two[["arm", "minus"]].values.tolist() == [["2d", "1d"]]


def test_claims_refuse_an_unfinished_run_a_missing_seed_and_an_unknown_measure():
    from vitviz.experiments.posemb_seeds import posemb_seed_claims

    df = _runs({"none": 50.0, "1d": 58.0, "2d": 58.5})
    behind = df[~((df.run == "2d-s1") & (df.epoch == 3))]
    with pytest.raises(InputError, match=r"not every run reached epoch 3 \(2d-s1 at epoch 2\).*"
                                         r"posemb_seed_claims\(df\[df.epoch <= 2\]\)"):
        posemb_seed_claims(behind)
    assert posemb_seed_claims(behind[behind.epoch <= 2]).epochs.eq(2).all()  # the message's fix
    with pytest.raises(InputError, match="do not share their seeds: none-s2 missing"):
        posemb_seed_claims(df[df.run != "none-s2"])
    with pytest.raises(InputError, match=r"metric='fewshot5' is not a column of df.*read_posemb_seeds_fewshot"):
        posemb_seed_claims(df, "fewshot5")


def test_the_sweep_trains_resumes_and_measures_few_shot_on_a_tiny_folder(tmp_path, tiny_folder):
    """Two encodings, one epoch: the results table holds a row per run, a rerun trains nothing and rebuilds the
    same table, a folder of other settings is refused, and ``--fewshot`` measures each run's last epoch (the sweep's
    few-shot reader: every kept epoch when asked)."""
    from vitviz.experiments.posemb_seeds import (
        PosembSeedsConfig,
        fewshot,
        fewshot_metric,
        read_posemb_seeds,
        read_posemb_seeds_fewshot,
        run_sweep,
        write_results,
    )

    kw = dict(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"),
              encodings=("none", "2d"), seeds=(0,), epochs=1, warmup_epochs=0.5, train_subset=50, test_subset=20,
              batch_size=25)
    table = run_sweep(PosembSeedsConfig(**kw))
    assert table.run.tolist() == ["none-s0", "2d-s0"] and table.test_images.tolist() == [20, 20]
    weights = tmp_path / "runs" / "2d-s0" / "cifar10-vit-2dpos" / "epochs" / "epoch_001.pt"
    stamp = weights.stat().st_mtime_ns
    assert run_sweep(PosembSeedsConfig(**kw)).equals(table) and weights.stat().st_mtime_ns == stamp  # nothing retrained
    assert read_posemb_seeds(kw["results"]).run.tolist() == table.run.tolist()
    assert json.loads((tmp_path / "r.json").read_text())["settings"]["encodings"] == ["none", "2d"]
    with pytest.raises(ValueError, match="config differs.*test_subset"):
        write_results(PosembSeedsConfig(**{**kw, "test_subset": 30}))
    shots = fewshot(PosembSeedsConfig(**kw), shots=1, seeds=(0, 1), test_per_class=2)
    assert shots.groupby(["encoding", "epoch"]).seed.nunique().to_dict() == {("2d", 1): 2, ("none", 1): 2}
    assert set(shots.columns) >= {"model", "encoding", "pos_emb", "run_seed", "epoch", "accuracy"}
    mean = read_posemb_seeds_fewshot(tmp_path / "r_fewshot.csv")  # named after its sweep's results, r.csv
    assert not (tmp_path / "posemb_seeds_fewshot.csv").exists()
    assert read_posemb_seeds_fewshot(results=kw["results"]).equals(mean)  # found from its sweep's results
    with pytest.raises(InputError, match="both name a table"):
        read_posemb_seeds_fewshot(tmp_path / "r_fewshot.csv", results=kw["results"])
    # 1-shot accuracies are named after their shot count (they were named fewshot5, drawn as "5-shot")
    assert mean.draws.eq(2).all() and set(mean.columns) >= {"encoding", "seed", "epoch", "fewshot1"}
    assert "fewshot5" not in mean and fewshot_metric(mean) == "fewshot1"
    two = {**kw, "epochs": 2, "out": str(tmp_path / "two"), "results": str(tmp_path / "two" / "r.csv")}
    run_sweep(PosembSeedsConfig(**two))
    assert fewshot(PosembSeedsConfig(**two), shots=1, seeds=(0,), test_per_class=2).epoch.tolist() == [2, 2]
    from vitviz.experiments.posemb_seeds import runs
    from vitviz.experiments.sweep import fewshot_of_epochs

    every = fewshot_of_epochs(runs(PosembSeedsConfig(**two)), two["data"], shots=1, seeds=(0,), test_per_class=2)
    assert every.epoch.tolist() == [1, 2, 1, 2]  # each kept epoch, run by run
    with pytest.raises(TypeError, match="last_only"):
        fewshot_of_epochs(runs(PosembSeedsConfig(**two)), two["data"], last_only="False")
    # kept weights cut off (a run folder copied part-way): the file and the fix, not torch's zip error
    cut = tmp_path / "two" / "none-s0" / "cifar10-vit-nopos" / "epochs" / "epoch_001.pt"
    cut.write_bytes(cut.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(cut))}.*truncated.*delete it.*train none-s0 again"):
        fewshot_of_epochs(runs(PosembSeedsConfig(**two)), two["data"], shots=1, seeds=(0,), test_per_class=2)


def test_epoch_weights_of_an_earlier_run_are_refused_not_measured_or_mixed(tmp_path, tiny_folder):
    """A run keeps an epoch's weights only after its last.pt holds that epoch. Epoch files beyond last.pt's epoch,
    or without a last.pt (deleted to train the run again), are an earlier run's: the few-shot measure of the "last
    epoch" read them as this run's, and a new run would have kept its epochs among them."""
    from vitviz.experiments.posemb_seeds import PosembSeedsConfig, run_sweep, runs
    from vitviz.experiments.sweep import fewshot_of_epochs

    kw = dict(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"), encodings=("2d",),
              seeds=(0,), epochs=1, warmup_epochs=0.5, train_subset=50, test_subset=20, batch_size=25)
    run_sweep(PosembSeedsConfig(**kw))
    run_dir = tmp_path / "runs" / "2d-s0" / "cifar10-vit-2dpos"
    earlier = run_dir / "epochs" / "epoch_002.pt"  # as an earlier, longer run of the folder left it
    shutil.copy(run_dir / "epochs" / "epoch_001.pt", earlier)
    with pytest.raises(InputError, match=r"keeps 1 epoch weights \(epoch_002.pt\) of an earlier run of 2d-s0: its "
                                         r"last.pt is at epoch 1.*delete them"):
        fewshot_of_epochs(runs(PosembSeedsConfig(**kw)), kw["data"], shots=1, seeds=(0,), test_per_class=2,
                          last_only=True)
    (run_dir / "last.pt").unlink()  # to train the run again
    with pytest.raises(InputError, match=r"keeps 2 epoch weights \(epoch_001.pt, epoch_002.pt\).*there is no "
                                         r"last.pt"):
        run_sweep(PosembSeedsConfig(**kw))
    assert not (run_dir / "last.pt").exists()  # refused before training


def test_a_sweeps_few_shot_table_is_named_after_its_results_and_never_overwrites_another():
    """The few-shot table of a second sweep beside the default one (``--results .../posemb_seeds_15k.csv``) gets its
    own name; the default sweeps keep the names their tables were committed under."""
    from vitviz.experiments import cls_vs_gap, posemb_seeds
    from vitviz.experiments.sweep import fewshot_results

    def where(module, results, name):
        return fewshot_results(results, module.RESULTS, name).as_posix()

    assert where(posemb_seeds, posemb_seeds.RESULTS, posemb_seeds.FEWSHOT_NAME) == \
        "data/posemb_seeds/posemb_seeds_fewshot.csv"
    assert where(posemb_seeds, "data/posemb_seeds/posemb_seeds_15k.csv", posemb_seeds.FEWSHOT_NAME) == \
        "data/posemb_seeds/posemb_seeds_15k_fewshot.csv"
    assert where(cls_vs_gap, cls_vs_gap.RESULTS, "fewshot_by_epoch.csv") == "data/cls_vs_gap/fewshot_by_epoch.csv"
    assert where(cls_vs_gap, "data/cls_vs_gap/cls_vs_gap_15k.csv", "fewshot_by_epoch.csv") == \
        "data/cls_vs_gap/cls_vs_gap_15k_fewshot.csv"
    assert (DATA / "posemb_seeds_fewshot.csv").is_file()  # what the default name reads is committed


@pytest.mark.parametrize("argv, message", [
    (["--encodings", "1d,3d"], "argument --encodings: '3d' in '1d,3d': not one of none, 1d, 2d"),
    (["--lr", "0"], "argument --lr: 0.0 is not a finite number above 0"),
    (["--lr", "fast"], "argument --lr: 'fast' is not a number"),
    (["--seeds", ","], "--seeds is empty"),
    (["--epochs", "0"], "argument --epochs: 0 is not a positive count"),
])
def test_the_command_line_refuses_bad_values_naming_the_option(argv, message, tmp_path, capsys):
    from vitviz.experiments.posemb_seeds import main

    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--data", str(tmp_path / "none"), "--results", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_the_figure_draws_each_seed_the_paired_interval_and_the_paper():
    import matplotlib.pyplot as plt

    from vitviz.experiments.posemb_seeds import posemb_seed_claims
    from vitviz.plot.probes import plot_posemb_seeds

    df = _runs({"none": 50.0, "1d": 58.0, "2d": 58.5})
    df.loc[(df.epoch == 3) & (df.seed == 1), "test_acc"] += 1.0  # a shared seed effect
    df.loc[(df.epoch == 3) & (df.seed == 2) & (df.encoding == "2d"), "test_acc"] -= 1.5
    ax = plot_posemb_seeds(df)
    try:
        assert [t.get_text() for t in ax.get_yticklabels()] == ["1-D minus none", "2-D minus none",
                                                                 "2-D minus 1-D"]
        assert ax.get_xlabel() == "Difference [percentage points]" and ax.get_title() == "CIFAR-10 test top-1"
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["one seed (3 seeds)", "mean, 95% interval paired by seed", "paper (Table 8, ImageNet 5-shot)"]
        dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and len(ln.get_xdata()) == 3]
        top = dots[0]  # 1-D minus none: 8 points at every seed
        np.testing.assert_allclose(top.get_xdata(), [8.0, 8.0, 8.0])
        c = posemb_seed_claims(df).set_index(["arm", "minus"]).loc[("2d", "1d")]
        bars = [col for col in ax.collections if col.get_segments()]
        spans = sorted((float(s[:, 0].min()), float(s[:, 0].max())) for col in bars for s in col.get_segments()
                       if abs(s[0, 1] - s[1, 1]) < 1e-9 and s[0, 0] != s[1, 0])
        assert (c.low, c.high) == pytest.approx(min(spans, key=lambda s: abs(s[0] - c.low)))
        paper = [ln for ln in ax.get_lines() if ln.get_marker() == "D"]
        assert sorted(float(ln.get_xdata()[0]) for ln in paper) == pytest.approx(sorted(
            [64.206 - 61.382, 64.001 - 61.382, 64.001 - 64.206]))
    finally:
        plt.close(ax.figure)
    with pytest.raises(InputError, match="no two of a comparison"):
        plot_posemb_seeds(df[df.encoding == "1d"])


def test_the_committed_sweep_is_complete_and_its_claims_are_what_the_readme_says():
    """Every encoding at every seed its settings list, each run at its last epoch; the few-shot table measures the
    same runs. The figures quoted in data/posemb_seeds/README.md are the claims recomputed here."""
    from vitviz.experiments.posemb_seeds import (
        ENCODINGS,
        posemb_seed_claims,
        read_posemb_seeds,
        read_posemb_seeds_fewshot,
    )

    runs = read_posemb_seeds()
    settings = json.loads((DATA / "posemb_seeds.json").read_text())["settings"]
    assert sorted(runs.seed.unique()) == settings["seeds"] and set(runs.encoding) == set(ENCODINGS)
    assert runs.groupby("run").epoch.max().eq(settings["epochs"]).all()
    assert runs.train_images.eq(settings["train_subset"]).all() and runs.test_images.eq(settings["test_subset"]).all()
    shots = read_posemb_seeds_fewshot()
    assert set(zip(shots.encoding, shots.seed)) == set(zip(runs.encoding, runs.seed))
    text = (DATA / "README.md").read_text()
    for metric, frame in (("test_acc", runs), ("fewshot5", shots)):
        for c in posemb_seed_claims(frame, metric).itertuples():
            quoted = f"{c.arm} minus {c.minus}: {c.difference:+.2f} [{c.low:+.2f}, {c.high:+.2f}]"
            assert quoted in text, f"{metric}: {quoted!r} is not in data/posemb_seeds/README.md"
        last = frame[frame.epoch == frame.epoch.max()].groupby("encoding")[metric].mean()
        means = f"means: none {last['none']:.2f} %, 1-D {last['1d']:.2f} %, 2-D {last['2d']:.2f} %"
        assert means in text, f"{metric}: {means!r} is not in data/posemb_seeds/README.md"
    top = posemb_seed_claims(runs).set_index(["arm", "minus"])  # the README's sentence on the sweep
    readme = " ".join((DATA.parents[1] / "README.md").read_text().split())
    assert "each encoding is less than a point above none in top-1 (a gap the seeds resolve for 2-D only)" in readme
    assert top.loc[[("1d", "none"), ("2d", "none")], "difference"].between(0, 1).all()
    assert top.excludes_zero.to_dict() == {("1d", "none"): False, ("2d", "none"): True, ("2d", "1d"): False}
    from vitviz.zoo.cards import read_cards

    top1 = {m: c["test_top1"] for m, c in read_cards().items()}
    gaps = (f"{top1['cifar10-vit-1dpos'] - top1['cifar10-vit-nopos']:.1f} (1-D) and "
            f"{top1['cifar10-vit-2dpos'] - top1['cifar10-vit-nopos']:.1f} (2-D) points above none")
    assert gaps in " ".join(text.split()), gaps


def test_the_committed_15k_sweep_is_complete_and_its_claims_are_what_the_readme_says():
    """The larger sweep (three times the images, 10 epochs, five seeds): every run finished, its few-shot table (found
    beside it) measures the same runs, and the figures of the README's section on it are its claims."""
    from vitviz.experiments.posemb_seeds import (
        ENCODINGS,
        posemb_seed_claims,
        read_posemb_seeds,
        read_posemb_seeds_fewshot,
    )

    results = DATA / "posemb_seeds_15k.csv"
    runs = read_posemb_seeds(results)
    settings = json.loads((DATA / "posemb_seeds_15k.json").read_text())["settings"]
    assert sorted(runs.seed.unique()) == settings["seeds"] == [0, 1, 2, 3, 4] and set(runs.encoding) == set(ENCODINGS)
    assert runs.groupby("run").epoch.max().eq(settings["epochs"]).all() and settings["epochs"] == 10
    assert runs.train_images.eq(15_000).all() and runs.test_images.eq(2_000).all()
    shots = read_posemb_seeds_fewshot(results=results)
    assert set(zip(shots.encoding, shots.seed)) == set(zip(runs.encoding, runs.seed)) and shots.draws.eq(3).all()
    text = " ".join((DATA / "README.md").read_text().split("## A larger sweep")[1].split())
    claims = {}
    for metric, frame in (("test_acc", runs), ("fewshot5", shots)):
        claims[metric] = posemb_seed_claims(frame, metric).set_index(["arm", "minus"])
        for (arm, minus), c in claims[metric].iterrows():
            quoted = f"{arm} minus {minus}: {c.difference:+.2f} [{c.low:+.2f}, {c.high:+.2f}]"
            assert quoted in text, f"{metric}: {quoted!r} is not in the README's section on the larger sweep"
        last = frame[frame.epoch == frame.epoch.max()].groupby("encoding")[metric].mean()
        means = f"means: none {last['none']:.2f} %, 1-D {last['1d']:.2f} %, 2-D {last['2d']:.2f} %"
        assert means in text, f"{metric}: {means!r} is not in the README's section on the larger sweep"
    top = claims["test_acc"]  # the section's reading of them, and the project README's sentence
    assert top.loc[[("1d", "none"), ("2d", "none")], "low"].gt(3).all()
    assert not top.loc[("2d", "1d"), "excludes_zero"] and abs(top.loc[("2d", "1d"), "difference"]) < 0.5
    readme = " ".join((DATA.parents[1] / "README.md").read_text().split())
    assert "opens the gap to about five points for each encoding, both intervals far above 0" in readme
    assert top.loc[[("1d", "none"), ("2d", "none")], "difference"].round().eq(5).all()


@pytest.mark.parametrize("suffix", ["", "_15k"])
def test_the_report_draws_each_seed_sweep_with_the_numbers_of_its_claims_and_its_budget(monkeypatch, suffix):
    """``vitviz report`` draws every committed sweep (``SWEEPS``), titled with its budget (the 5,000- and the
    15,000-image sweeps give other differences, so a figure must say which it shows), and saves the claims behind
    it; without the sweeps (an installed copy that lacks them) the figures are left out, not a failure."""
    import matplotlib.pyplot as plt

    import vitviz.experiments.posemb_seeds as ps
    from vitviz import report
    from vitviz.errors import DataNotFoundError

    results = DATA.parents[1] / ps.SWEEPS[suffix]
    runs, shots = ps.read_posemb_seeds(results), ps.read_posemb_seeds_fewshot(results=results)
    fig, arrays = dict(report._global_jobs())[f"table8_posemb_seeds{suffix}"]()
    try:
        claims = pd.concat([ps.posemb_seed_claims(runs), ps.posemb_seed_claims(shots, "fewshot5")],
                           ignore_index=True)
        np.testing.assert_array_equal(arrays["difference"], claims.difference)
        np.testing.assert_array_equal(arrays["low"], claims.low)
        assert list(arrays["measure"]) == list(claims.measure) and list(arrays["arm"]) == list(claims.arm)
        assert len(fig.axes) == 2 and [t.get_text() for t in fig.axes[0].get_yticklabels()][0] == "1-D minus none"
        last = runs[runs.epoch == runs.epochs_planned]
        assert fig.get_suptitle() == (f"CIFAR-10, {runs.seed.nunique()} seeds, {last.train_images.iloc[0]:,} "
                                      f"training images, {last.epochs_planned.iloc[0]} epochs, "
                                      f"{last.test_images.iloc[0]:,} test images")
    finally:
        plt.close(fig)

    def missing(path=None):
        raise DataNotFoundError("no results")

    monkeypatch.setattr(ps, "read_posemb_seeds", missing)
    assert not [name for name in dict(report._global_jobs()) if name.startswith("table8_posemb_seeds")]


def test_a_sweep_budget_names_only_what_its_rows_hold_one_value_of():
    from vitviz.plot.probes import sweep_budget

    runs = pd.DataFrame({"seed": [0, 0, 1], "train_images": [5000, 5000, 5000], "epochs_planned": [8, 8, 4]})
    assert sweep_budget(runs) == "CIFAR-10, 2 seeds, 5,000 training images"
    assert sweep_budget(runs.iloc[:1]) == "CIFAR-10, 1 seed, 5,000 training images, 8 epochs"
    assert sweep_budget(pd.DataFrame({"loss": [1.0]})) == ""


@pytest.mark.parametrize("sweep, gap_sweep, other_cpu", [("posemb_seeds", "cls_vs_gap", True),
                                                          ("posemb_seeds_15k", "cls_vs_gap_15k", False)])
def test_the_committed_1d_runs_repeat_the_class_token_runs_of_cls_vs_gap(sweep, gap_sweep, other_cpu):
    """The 1-D arm's ``TrainConfig`` is that of cls_vs_gap's class token at the recipe's rate but for the model's
    name (``cifar10-vit-1dpos`` is ``cifar10-vit``'s architecture) and the folders, and the two sweeps were trained
    in other sessions (the 5,000-image ones on different CPUs, their ``device`` columns): every epoch's loss and
    accuracies agree at every seed both hold, so each sweep's runs are what their configs say, not one machine's
    accident."""
    from dataclasses import asdict

    from vitviz.experiments.cls_vs_gap import LRS, ClsGapConfig, read_cls_vs_gap
    from vitviz.experiments.cls_vs_gap import train_config as cls_config
    from vitviz.experiments.posemb_seeds import PosembSeedsConfig, read_posemb_seeds, train_config

    settings = json.loads((DATA / f"{sweep}.json").read_text())["settings"]
    gap_settings = json.loads((DATA.parent / "cls_vs_gap" / f"{gap_sweep}.json").read_text())["settings"]
    mine = asdict(train_config(PosembSeedsConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                   for k, v in settings.items()}), "1d", 0))
    theirs = asdict(cls_config(ClsGapConfig(**{k: tuple(v) if isinstance(v, list) else v
                                               for k, v in gap_settings.items()}), "cls", LRS[0], 0))
    differ = {k for k in mine if mine[k] != theirs[k]}
    assert differ - {"out", "cache", "data"} == {"model"}  # where things are, and the model's name
    assert (mine["model"], theirs["model"]) == ("cifar10-vit-1dpos", "cifar10-vit")
    ours = read_posemb_seeds(DATA / f"{sweep}.csv").query("encoding == '1d'")
    cls = read_cls_vs_gap(DATA.parent / "cls_vs_gap" / f"{gap_sweep}.csv").query("head == 'cls' and lr == @LRS[0]")
    both = cls.merge(ours, on=["seed", "epoch"], suffixes=("_cls", "_1d"))
    assert both.seed.nunique() == len(set(cls.seed) & set(ours.seed)) >= 3
    assert len(both) == both.seed.nunique() * settings["epochs"]
    if other_cpu:
        assert set(both.device_cls).isdisjoint(set(both.device_1d)), "trained on the same CPU"
    for column in ("loss", "train_acc", "test_acc"):
        assert both[f"{column}_cls"].tolist() == both[f"{column}_1d"].tolist(), column


def test_a_difference_of_rounding_size_is_no_difference():
    """Two encodings whose accuracies agree up to one float rounding (the last bit, as a mean over draws summed in
    another order gives) at every seed do not differ: the per-seed differences of 1e-14, all of one sign, made an
    interval of width 0 away from 0 that read as a difference the seeds resolve."""
    from vitviz.experiments.posemb_seeds import posemb_seed_claims

    df = _runs({"none": 50.0, "1d": 58.0, "2d": 58.0})
    last = df.epoch == df.epoch.max()
    for sd, d in {0: -4.1, 1: 0.3, 2: 3.7}.items():
        df.loc[last & (df.seed == sd), "test_acc"] += d
    two_d = last & (df.encoding == "2d")
    df.loc[two_d, "test_acc"] = np.nextafter(df.loc[two_d, "test_acc"].to_numpy(), np.inf)
    row = posemb_seed_claims(df).set_index(["arm", "minus"]).loc[("2d", "1d")]
    assert row.difference == pytest.approx(0.0, abs=1e-12) and row.low <= 0 <= row.high
    assert not row.excludes_zero


def test_claims_refuse_a_run_with_two_last_epoch_rows():
    """A run whose last epoch is listed twice (tables concatenated) is refused naming it, not a TypeError from
    reading one seed's value."""
    from vitviz.experiments.posemb_seeds import posemb_seed_claims

    df = _runs({"none": 50.0, "1d": 58.0, "2d": 58.5})
    twice = pd.concat([df, df[(df.run == "1d-s0") & (df.epoch == 3)]], ignore_index=True)
    with pytest.raises(InputError, match=r"1d-s0 has 2 rows at epoch 3.*drop_duplicates"):
        posemb_seed_claims(twice)


def _fewshot_rows(draws_of: dict[str, tuple[int, ...]], shots=5) -> pd.DataFrame:
    """A few-shot table of encodings none and 1d at seeds 0 and 1 (each run's draws as given, else 0, 1, 2)."""
    from vitviz.experiments.posemb_seeds import ENCODINGS, run_id

    rows = []
    for enc in ("none", "1d"):
        for seed in (0, 1):
            for draw in draws_of.get(run_id(enc, seed), (0, 1, 2)):
                rows.append({"model": run_id(enc, seed), "encoding": enc, "pos_emb": ENCODINGS[enc][1],
                             "run_seed": seed, "epoch": 8, "layer": "pre_logits", "depth": 7, "probe": "linear",
                             "shots": shots, "seed": draw, "l2_reg": 1024.0,
                             "accuracy": 30.0 + 5 * (enc == "1d") + 3 * draw + seed, "train_images": 50,
                             "test_images": 1000})
    return pd.DataFrame(rows)


def test_the_few_shot_reader_refuses_runs_that_do_not_hold_the_same_draws(tmp_path):
    """A run missing a draw (or holding one twice) averaged other few-shot images than the run it is paired with: the
    per-seed difference mixed the encodings with the draws (here a draw worth 3 points each). Refused naming the run
    and the draws; the complete table reads as the mean over each run's three draws."""
    from vitviz.experiments.posemb_seeds import read_posemb_seeds_fewshot

    path = tmp_path / "f.csv"
    _fewshot_rows({}).to_csv(path, index=False)
    full = read_posemb_seeds_fewshot(path).set_index(["encoding", "seed"])
    assert full.draws.eq(3).all() and full.loc[("1d", 1), "fewshot5"] == pytest.approx(30 + 5 + 3 + 1)
    for draws, match in (((0, 1), r"1d-s1 at epoch 8 holds draws \[0, 1\].*\[0, 1, 2\]"),
                         ((0, 1, 2, 2), r"1d-s1 at epoch 8 holds draws \[0, 1, 2, 2\].*\[0, 1, 2\]")):
        _fewshot_rows({"1d-s1": draws}).to_csv(path, index=False)
        with pytest.raises(InputError, match=match):
            read_posemb_seeds_fewshot(path)
    pd.concat([_fewshot_rows({}), _fewshot_rows({}, shots=10)]).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"shots.*\[5, 10\]"):
        read_posemb_seeds_fewshot(path)


def test_a_few_shot_table_is_named_and_labelled_with_its_own_shot_count(tmp_path):
    """A table of 1-shot accuracies was read as ``fewshot5`` and drawn under "CIFAR-10 5-shot linear top-1": the
    column is now ``fewshot<K>`` (K the table's shots), the figure's title says K; a table without ``shots``
    (whose count the name would guess) is refused."""
    import vitviz
    from vitviz.experiments.posemb_seeds import fewshot_metric, posemb_seed_claims, read_posemb_seeds_fewshot

    path = tmp_path / "f.csv"
    _fewshot_rows({}, shots=1).to_csv(path, index=False)
    one = read_posemb_seeds_fewshot(path)
    assert "fewshot5" not in one and fewshot_metric(one) == "fewshot1"
    assert one.fewshot1.tolist() == pytest.approx(
        _fewshot_rows({}).groupby(["encoding", "run_seed"], sort=True).accuracy.mean().tolist())
    assert posemb_seed_claims(one, "fewshot1").measure.eq("fewshot1").all()
    ax = vitviz.plot_posemb_seeds(one, metric="fewshot1")
    assert ax.get_title() == "CIFAR-10 1-shot linear top-1"
    _fewshot_rows({}).to_csv(path, index=False)
    five = read_posemb_seeds_fewshot(path)
    assert fewshot_metric(five) == "fewshot5"
    assert vitviz.plot_posemb_seeds(five, metric="fewshot5").get_title() == "CIFAR-10 5-shot linear top-1"
    _fewshot_rows({}).drop(columns="shots").to_csv(path, index=False)
    with pytest.raises(InputError, match=r"read_posemb_seeds_fewshot: the table has no shots column"):
        read_posemb_seeds_fewshot(path)
    with pytest.raises(InputError, match=r"df holds no few-shot accuracy columns"):
        fewshot_metric(five.drop(columns="fewshot5"))


def test_fewshot_of_epochs_reads_each_runs_last_pt_once(tmp_path, tiny_folder, monkeypatch):
    """The few-shot measure read every run's last.pt twice (torch.load of the whole training state, optimizer and
    all): once to check the run folder, once more for the epochs beyond it. It is read once, for both checks."""
    import torch

    from vitviz.experiments.posemb_seeds import PosembSeedsConfig, run_sweep, runs
    from vitviz.experiments.sweep import fewshot_of_epochs

    kw = dict(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"),
              encodings=("none", "2d"), seeds=(0,), epochs=1, warmup_epochs=0.5, train_subset=50, test_subset=20,
              batch_size=25)
    run_sweep(PosembSeedsConfig(**kw))
    read, load = [], torch.load

    def counting(f, *args, **kwargs):
        read.append(Path(f if isinstance(f, (str, Path)) else f.name).resolve())
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    df = fewshot_of_epochs(runs(PosembSeedsConfig(**kw)), kw["data"], shots=1, seeds=(0,), test_per_class=2)
    assert df.epoch.tolist() == [1, 1]
    lasts = [p for p in read if p.name == "last.pt"]
    assert len(lasts) == 2 and len(set(lasts)) == 2, lasts  # each run's, once
    with pytest.raises(InputError, match=r"last.pt holds a 1-epoch run, this sweep trains 2 epochs"):  # still checked
        fewshot_of_epochs(runs(PosembSeedsConfig(**{**kw, "epochs": 2})), kw["data"], shots=1, seeds=(0,),
                          test_per_class=2)


def _sweep_killed_at(tmp_path, tiny_folder, monkeypatch, target, name):
    """A two-epoch sweep of one run, killed (``RunInterrupted``) when epoch 2 reaches ``target`` (patched at
    ``name``), after ``train`` wrote that epoch's ``last.pt``; returns the sweep's config."""
    import vitviz.experiments.sweep as sweep_module
    import vitviz.experiments.train as train_module
    from vitviz.errors import RunInterrupted
    from vitviz.experiments.posemb_seeds import PosembSeedsConfig, run_sweep

    cfg = PosembSeedsConfig(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"),
                            encodings=("2d",), seeds=(0,), epochs=2, warmup_epochs=0.5, train_subset=50,
                            test_subset=20, batch_size=25)
    module = {"train": train_module, "sweep": sweep_module}[target]
    real = getattr(module, name)

    def killed(*args, **kwargs):
        if target == "train" and len(args[1]) == 2 or target == "sweep" and Path(args[1]).name == "epoch_002.pt":
            raise RunInterrupted("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, killed)
    with pytest.raises(RunInterrupted):
        run_sweep(cfg)
    monkeypatch.setattr(module, name, real)
    return cfg


def test_a_run_killed_between_its_last_pt_and_its_metrics_is_collected_with_every_epoch(tmp_path, tiny_folder,
                                                                                         monkeypatch):
    """``train`` writes an epoch's ``last.pt``, then ``metrics.json``: a kill between the two left metrics.json an
    epoch behind, and the results table (``write_results``, read from metrics.json) lacked the run's last epoch
    until the run was trained again. It is read from last.pt: the same table as the resumed sweep's."""
    from vitviz.experiments.posemb_seeds import run_sweep, write_results
    from vitviz.zoo.weights import load_training_state

    cfg = _sweep_killed_at(tmp_path, tiny_folder, monkeypatch, "train", "_write_metrics")
    run_dir = tmp_path / "runs" / "2d-s0" / "cifar10-vit-2dpos"
    assert load_training_state(run_dir / "last.pt")["epoch"] == 2
    assert [r["epoch"] for r in json.loads((run_dir / "metrics.json").read_text())] == [1]  # the kill's window
    table = write_results(cfg)
    assert table.epoch.tolist() == [1, 2]
    resumed = run_sweep(cfg)  # trains nothing: rewrites metrics.json from last.pt
    assert resumed.equals(table)


def test_fewshot_measures_the_last_epoch_of_a_run_killed_before_it_kept_it(tmp_path, tiny_folder, monkeypatch):
    """A sweep keeps an epoch's weights (``epochs/epoch_NNN.pt``) after ``train`` wrote its ``last.pt``: a kill
    between the two left the finished run's last kept epoch one behind, and ``--fewshot`` (the last epoch only)
    measured epoch 1 as the run's last. The epoch last.pt holds is kept from it first, as the next training call
    would."""
    import torch

    from vitviz.experiments.posemb_seeds import runs
    from vitviz.experiments.sweep import fewshot_of_epochs
    from vitviz.zoo.weights import load_training_state

    cfg = _sweep_killed_at(tmp_path, tiny_folder, monkeypatch, "sweep", "atomic_save")
    run_dir = tmp_path / "runs" / "2d-s0" / "cifar10-vit-2dpos"
    assert sorted(p.name for p in (run_dir / "epochs").iterdir()) == ["epoch_001.pt"]  # the kill's window
    df = fewshot_of_epochs(runs(cfg), cfg.data, shots=1, seeds=(0,), test_per_class=2, last_only=True)
    assert df.epoch.tolist() == [2]
    kept = torch.load(run_dir / "epochs" / "epoch_002.pt", weights_only=True)
    state = load_training_state(run_dir / "last.pt")["model"]
    assert kept.keys() == state.keys() and all(torch.equal(kept[k], state[k]) for k in kept)


def test_train_runs_reads_each_runs_last_pt_once_before_training(tmp_path, tiny_folder, monkeypatch):
    """Before each run trains, the sweep read its last.pt twice (torch.load of the whole training state): once to
    keep the epoch a killed run had not kept yet, once more for the stale-epoch check. It is read once, for both;
    ``train`` reads it again to resume."""
    import torch

    import vitviz.experiments.train as train_module
    from vitviz.experiments.posemb_seeds import PosembSeedsConfig, run_sweep, runs
    from vitviz.experiments.sweep import train_runs

    kw = dict(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"),
              encodings=("none", "2d"), seeds=(0,), epochs=1, warmup_epochs=0.5, train_subset=50, test_subset=20,
              batch_size=25)
    run_sweep(PosembSeedsConfig(**kw))
    kept = tmp_path / "runs" / "2d-s0" / "cifar10-vit-2dpos" / "epochs" / "epoch_001.pt"
    kept.unlink()  # as a run killed after writing last.pt, before keeping that epoch's weights, left it
    read, before_train, load, train = [], {}, torch.load, train_module.train

    def counting(f, *args, **kwargs):
        read.append(Path(f if isinstance(f, (str, Path)) else f.name).resolve())
        return load(f, *args, **kwargs)

    def training(cfg, **kwargs):
        before_train[cfg.run_dir.parent.name] = [p.parent.parent.name for p in read if p.name == "last.pt"]
        summary = train(cfg, **kwargs)  # resumes from last.pt: its own read, not counted
        read.clear()
        return summary

    monkeypatch.setattr(torch, "load", counting)
    monkeypatch.setattr(train_module, "train", training)
    train_runs(runs(PosembSeedsConfig(**kw)), lambda: None, tag="test")
    assert before_train == {"none-s0": ["none-s0"], "2d-s0": ["2d-s0"]}  # each run's, once
    assert kept.is_file()  # the killed run's last epoch still kept from that one read
