"""Class token versus GAP (runner config, claims, figure), the Table 8 few-shot claims, plot_layer_probes, and
notebook 05 end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from vitviz.errors import InputError


def test_gap_config_builds_the_papers_gap_head():
    from vitviz.experiments.cls_vs_gap import LRS, ClsGapConfig, train_config
    from vitviz.zoo.reference import build_reference

    assert LRS == pytest.approx((1e-3, 1e-3 * 3 / 8))  # the recipe's rate and the paper's 3e-4 / 8e-4 ratio
    tc = train_config(ClsGapConfig(), "gap", LRS[1], 0)
    model = build_reference(tc.model, **tc.model_kwargs).eval()
    assert model.cls_token is None and model.num_prefix_tokens == 0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # the paper's GAP: final LayerNorm on every token, then the mean, then the linear head
        tokens = model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(x))))
        torch.testing.assert_close(model(x), model.head(model.norm(tokens).mean(1)))
    cls = build_reference("cifar10-vit", **train_config(ClsGapConfig(), "cls", LRS[0], 0).model_kwargs)
    assert cls.cls_token is not None


def _runs(acc):
    rows = []
    for (head, lr), final in acc.items():
        for epoch in (1, 2, 3):
            rows.append({"run": f"{head}-{lr}", "head": head, "lr": lr, "seed": 0, "epoch": epoch,
                         "test_acc": final * epoch / 3, "epochs_planned": 3})
    return pd.DataFrame(rows)


def test_cls_vs_gap_claims_from_the_last_epoch():
    from vitviz.experiments.cls_vs_gap import cls_vs_gap_claims

    df = _runs({("cls", 1e-3): 60.0, ("cls", 3e-4): 55.0, ("gap", 1e-3): 40.0, ("gap", 3e-4): 59.0})
    c = cls_vs_gap_claims(df).set_index("head")
    assert c.loc["cls", "best_lr"] == 1e-3 and c.loc["gap", "best_lr"] == 3e-4
    assert c.loc["gap", "gap_best"] == pytest.approx(59.0 - 60.0)
    assert not c.loc["gap", "same_best_lr"]
    assert c.loc["gap", "lr_effect"] == pytest.approx(40.0 - 59.0)


def test_cls_vs_gap_claims_pair_the_heads_by_seed():
    """The interval of ``gap_best`` is the paired t interval over seeds of (GAP at its best rate - class token at
    its best rate), recomputed here by hand; the unpaired difference of the two heads' means has the same centre but
    a seed effect shared by both heads (here +-3 points) would widen a marginal interval, not the paired one."""
    from scipy import stats

    from vitviz.experiments.cls_vs_gap import cls_vs_gap_claims

    final = {("cls", 1e-3): 60.0, ("cls", 3e-4): 55.0, ("gap", 1e-3): 40.0, ("gap", 3e-4): 59.0}
    shared = {0: -3.0, 1: 0.0, 2: 3.0}  # what a seed does to every run
    own = {("gap", 3e-4): {0: 0.5, 1: -0.2, 2: 0.1}}  # GAP's own seed-to-seed noise at its best rate
    df = pd.concat([_runs(final).assign(seed=sd) for sd in shared], ignore_index=True)
    last = df.epoch == df.epoch.max()
    for sd, d in shared.items():
        df.loc[last & (df.seed == sd), "test_acc"] += d
    for (head, lr), noise in own.items():
        for sd, d in noise.items():
            df.loc[last & (df.seed == sd) & (df["head"] == head) & (df.lr == lr), "test_acc"] += d
    c = cls_vs_gap_claims(df).set_index("head").loc["gap"]
    diff = np.array([59.0 + own[("gap", 3e-4)][sd] - 60.0 for sd in shared])  # the shared effect cancels
    half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
    assert c.seeds == 3 and c.best_lr == 3e-4
    assert c.gap_best == pytest.approx(diff.mean())
    assert (c.gap_best_low, c.gap_best_high) == pytest.approx((diff.mean() - half, diff.mean() + half))
    assert c.gap_best_high - c.gap_best_low < 2.0  # a marginal interval over the +-3 shared effect is wider
    at_cls = np.array([40.0 - 60.0] * 3)  # no own noise at 1e-3: a zero-width interval
    assert (c.gap_at_cls_lr, c.gap_at_cls_lr_low, c.gap_at_cls_lr_high) == pytest.approx((at_cls.mean(),) * 3)
    one = cls_vs_gap_claims(df[df.seed == 0]).set_index("head").loc["gap"]
    assert one.seeds == 1 and np.isnan(one.gap_best_low) and np.isnan(one.gap_best_high)
    only_low = cls_vs_gap_claims(df[(df["head"] == "cls") | (df.lr == 3e-4)]).set_index("head").loc["gap"]
    assert only_low.gap_best == pytest.approx(diff.mean()) and np.isnan(only_low.gap_at_cls_lr)  # GAP not at 1e-3
    with pytest.raises(InputError, match=r"do not share their seeds: gap-lr0.0003-s2 missing"):
        cls_vs_gap_claims(df[~((df.seed == 2) & (df["head"] == "gap") & (df.lr == 3e-4))])


def test_cls_vs_gap_reader_and_figure(tmp_path):
    from vitviz.experiments.cls_vs_gap import read_cls_vs_gap
    from vitviz.plot.probes import plot_cls_vs_gap

    with pytest.raises(InputError, match="cls_vs_gap --data"):
        read_cls_vs_gap(tmp_path / "missing.csv")
    df = _runs({("cls", 1e-3): 60.0, ("cls", 3e-4): 55.0, ("gap", 1e-3): 40.0, ("gap", 3e-4): 59.0})
    df.to_csv(tmp_path / "r.csv", index=False)
    ax = plot_cls_vs_gap(read_cls_vs_gap(tmp_path / "r.csv"))
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == [
        "CLS-Token, lr=0.0003", "CLS-Token, lr=0.001", "GAP, lr=0.0003", "GAP, lr=0.001"]
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "GAP, lr=0.001")
    np.testing.assert_allclose(line.get_ydata(), [40 / 3, 80 / 3, 40])
    with pytest.raises(InputError, match="columns"):
        plot_cls_vs_gap(df.drop(columns="lr"))


def test_cls_vs_gap_figure_says_what_its_bands_are():
    """With several seeds each line is their mean and its band their range: the legend's title says so once (or
    each label its own count where the lines differ), a band per line spans the lowest to the highest seed."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from vitviz.plot.probes import plot_cls_vs_gap

    base = _runs({("cls", 1e-3): 60.0, ("gap", 1e-3): 40.0})
    df = pd.concat([base, base.assign(seed=1, test_acc=base.test_acc + 3.0)], ignore_index=True)
    ax = plot_cls_vs_gap(df)
    try:
        legend = ax.get_legend()
        assert legend.get_title().get_text() == "mean of 2 seeds, band: their range"
        assert sorted(t.get_text() for t in legend.get_texts()) == ["CLS-Token, lr=0.001", "GAP, lr=0.001"]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 2
        top = max(float(b.get_paths()[0].vertices[:, 1].max()) for b in bands)
        assert top == pytest.approx(60.0 + 3.0)  # the higher seed's last epoch
    finally:
        plt.close(ax.figure)
    uneven = df[~((df["head"] == "gap") & (df.seed == 1))]
    ax = plot_cls_vs_gap(uneven)
    try:
        legend = ax.get_legend()
        assert legend.get_title().get_text() == "mean over seeds, band: their range"
        assert sorted(t.get_text() for t in legend.get_texts()) == ["CLS-Token, lr=0.001 (2 seeds)", "GAP, lr=0.001"]
    finally:
        plt.close(ax.figure)


ABLATION = ("cifar10-vit-nopos", "cifar10-vit-1dpos", "cifar10-vit-2dpos")


def draws_table(gap=9.0, enc_diff=0.5, draw_sd=3.0, noise=0.05, seeds=8, shots=(5,)):
    """A per-draw few-shot table of the three ablation models: a draw effect every model shares (an easy or hard set
    of shots), 1-D = none + gap, 2-D = 1-D + enc_diff, each with a little noise of its own."""
    rng = np.random.default_rng(0)
    rows = []
    for k in shots:
        for seed in range(seeds):
            shared = 60 + rng.normal(0, draw_sd)
            for model, off in zip(ABLATION, (0.0, gap, gap + enc_diff)):
                rows.append({"model": model, "pos_emb": {"cifar10-vit-nopos": "No Pos. Emb.",
                                                         "cifar10-vit-1dpos": "1-D Pos. Emb.",
                                                         "cifar10-vit-2dpos": "2-D Pos. Emb."}[model],
                             "layer": "pre_logits", "depth": 7, "probe": "linear", "shots": k, "seed": seed,
                             "accuracy": shared + off + rng.normal(0, noise), "train_images": 10 * k,
                             "test_images": 10_000})
    return pd.DataFrame(rows)


def test_posemb_draw_claims_pair_by_draw():
    """Each comparison's interval is the Student-t interval of the per-draw differences (recomputed here with scipy);
    a draw effect the models share makes the marginal intervals overlap where the paired one excludes 0."""
    from scipy import stats

    from vitviz.experiments.posemb_fewshot import posemb_draw_claims, posemb_measures

    raw = draws_table()
    got = posemb_draw_claims(raw).set_index(["measure", "arm", "minus"])
    acc = raw.pivot(index="seed", columns="model", values="accuracy")
    for arm, minus, a, b in (("1d", "none", 1, 0), ("2d", "none", 2, 0), ("2d", "1d", 2, 1)):
        d = (acc[ABLATION[a]] - acc[ABLATION[b]]).to_numpy()
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        row = got.loc[("fewshot5", arm, minus)]
        assert row.difference == pytest.approx(d.mean()) and row.draws == len(d)
        assert (row.low, row.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert got.loc[("fewshot5", "2d", "1d"), "excludes_zero"]
    m = posemb_measures(raw).set_index("model")
    one, two = m.loc["cifar10-vit-1dpos"], m.loc["cifar10-vit-2dpos"]
    assert two.fewshot5_low < one.fewshot5_high  # the marginal intervals overlap: they would not resolve it
    assert got.loc[("fewshot5", "2d", "none"), "paper"] == pytest.approx(64.001 - 61.382, abs=0.01)


@pytest.mark.parametrize("enc_diff, holds", [(0.5, True), (10.0, False)])
def test_posemb_claims_decide_the_finding_on_paired_intervals(enc_diff, holds):
    from vitviz.experiments.posemb_fewshot import posemb_claims, posemb_draw_claims, posemb_measures

    raw = draws_table(enc_diff=enc_diff)
    m = posemb_measures(raw)
    c = posemb_claims(m, fewshot=raw).set_index("measure")
    paired = posemb_draw_claims(raw).set_index(["arm", "minus"])
    row = c.loc["fewshot5"]
    assert row.gap_low == pytest.approx(min(paired.loc[("1d", "none"), "low"], paired.loc[("2d", "none"), "low"]))
    assert row.spread_bound == pytest.approx(max(abs(paired.loc[("2d", "1d"), "low"]),
                                                 abs(paired.loc[("2d", "1d"), "high"])))
    assert row.finding_holds is holds and row.draws == 8 and "paired over 8 draws" in row.basis
    assert row.ordering == "2-D > 1-D > none" and not row.same_order_as_paper
    assert c.loc["paper_5shot", "finding_holds"] is True and c.loc["paper_5shot", "same_order_as_paper"]
    # one number per model (the cards' top-1), or no per-draw table: no interval, so no verdict
    assert c.loc["test_top1", "finding_holds"] is None and "one number per model" in c.loc["test_top1", "basis"]
    alone = posemb_claims(m).set_index("measure")
    assert alone.loc["fewshot5", "finding_holds"] is None and "fewshot=" in alone.loc["fewshot5", "basis"]
    assert alone.loc["fewshot5", "gap_to_none"] == pytest.approx(row.gap_to_none)


def test_posemb_claims_judge_every_shot_count_measured():
    """A table measured at other shots than 5 and 10 (``--shots 1,25``) got claims for the paper's row and top-1
    only: its few-shot measures were left out of the table without a word. Each shot count is a measure."""
    from vitviz.experiments.posemb_fewshot import posemb_claims, posemb_measures

    raw = draws_table(shots=(1, 25))
    c = posemb_claims(posemb_measures(raw), fewshot=raw).set_index("measure")
    assert list(c.index) == ["paper_5shot", "test_top1", "fewshot1", "fewshot25"]
    assert c.loc[["fewshot1", "fewshot25"], "draws"].tolist() == [8, 8]


def test_the_committed_fewshot_claims_are_what_the_data_readme_says():
    from vitviz.experiments.posemb_fewshot import (
        posemb_claims,
        posemb_draw_claims,
        posemb_measures,
        read_posemb_fewshot,
    )

    raw = read_posemb_fewshot()
    text = (Path(__file__).resolve().parents[1] / "data" / "posemb_fewshot" / "README.md").read_text()
    paired = posemb_draw_claims(raw)
    for c in paired.itertuples():
        quoted = f"{c.arm} minus {c.minus}: {c.difference:+.2f} [{c.low:+.2f}, {c.high:+.2f}]"
        assert quoted in text, f"{c.measure}: {quoted!r} is not in data/posemb_fewshot/README.md"
    claims = posemb_claims(posemb_measures(raw), fewshot=raw).set_index("measure")
    assert claims.loc[["fewshot5", "fewshot10"], "finding_holds"].tolist() == [True, True]
    assert paired[(paired.arm == "2d") & (paired.minus == "1d")].excludes_zero.all()
    m = posemb_measures(raw).set_index("model")  # "which overlap at 5 shots"
    assert m.loc["cifar10-vit-2dpos", "fewshot5_low"] < m.loc["cifar10-vit-1dpos", "fewshot5_high"]


def test_the_committed_fewshot_table_names_its_images_so_its_draws_pair_unwarned():
    """The committed table was measured again with the image digests: its draws pair with the images checked (no
    UncheckedImagesWarning), a draw on other images is refused, and the same rows without the digest columns (as
    the table was before) still pair by seed and count, with the warning, to the same differences."""
    import warnings

    from vitviz.errors import UncheckedImagesWarning
    from vitviz.experiments.posemb_fewshot import MODELS, posemb_draw_differences, read_posemb_fewshot

    raw = read_posemb_fewshot()
    assert {"train_digest", "test_digest"} <= set(raw.columns), list(raw.columns)
    assert raw[["train_digest", "test_digest"]].notna().all().all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedImagesWarning)
        paired = posemb_draw_differences(raw)
    assert len(paired) == 3 * raw.shots.nunique() * raw.seed.nunique()  # three comparisons at every draw
    other = raw.copy()
    other.loc[(other.model == MODELS[2]) & (other.seed == 1), "train_digest"] = "another-draw"
    with pytest.raises(InputError, match=rf"{MODELS[0]} and {MODELS[2]} were measured on different few-shot "
                                         r"training images at the 5-shot draw seed=1"):
        posemb_draw_differences(other)
    with pytest.warns(UncheckedImagesWarning, match=r"does not say which images.*paired by seed"):
        unchecked = posemb_draw_differences(raw.drop(columns=["train_digest", "test_digest"]))
    pd.testing.assert_frame_equal(unchecked, paired)

def test_posemb_claims_point_values():
    from vitviz.experiments.posemb_fewshot import posemb_claims

    m = pd.DataFrame({
        "model": list(ABLATION), "pos_emb": ["No Pos. Emb.", "1-D Pos. Emb.", "2-D Pos. Emb."],
        "paper_5shot": [61.382, 64.206, 64.001],
        "test_top1": [50.0, 52.0, 58.0],  # order 2-D > 1-D > none
    })
    c = posemb_claims(m).set_index("measure")
    assert c.loc["test_top1", "ordering"] == "2-D > 1-D > none" and not c.loc["test_top1", "same_order_as_paper"]
    assert c.loc["test_top1", "gap_to_none"] == pytest.approx(2.0)
    assert c.loc["test_top1", "encoding_spread"] == pytest.approx(6.0)


def test_posemb_draw_differences_refuse_what_does_not_pair():
    from vitviz.experiments.posemb_fewshot import posemb_draw_differences

    raw = draws_table()
    with pytest.raises(InputError, match=r"at 5 shots cifar10-vit-1dpos and cifar10-vit-nopos do not share their draws "
                                         r"\(seeds \[3\] are in one only\).*--seeds"):
        posemb_draw_differences(raw.drop(raw[(raw.model == "cifar10-vit-1dpos") & (raw.seed == 3)].index)
                                .reset_index(drop=True))
    with pytest.raises(InputError, match=r"'cifar10-vit-2dpos' has 2 rows for the 5-shot draw seed=0"):
        posemb_draw_differences(pd.concat([raw, raw[(raw.model == "cifar10-vit-2dpos") & (raw.seed == 0)]]))
    other = raw.copy()
    other.loc[other.model == "cifar10-vit-2dpos", "test_images"] = 1_000
    with pytest.raises(InputError, match=r"different test sets .*--test-subset"):
        posemb_draw_differences(other)
    with pytest.raises(InputError, match=r"lacks the column\(s\) \['seed', 'accuracy'\]"):
        posemb_draw_differences(raw.drop(columns=["seed", "accuracy"]))
    two_1d = ("cifar10-vit-nopos", "cifar10-vit", "cifar10-vit-1dpos")  # two models of one encoding
    with pytest.raises(InputError, match=r"one model per encoding .*\(unknown: \[\]\)"):
        posemb_draw_differences(raw, ablation=two_1d)
    with pytest.raises(InputError, match=r"\(unknown: \['vit_base'\]\)"):
        posemb_draw_differences(raw, ablation=("cifar10-vit-nopos", "vit_base"))


def test_plot_layer_probes_draws_means_by_depth():
    from vitviz.analysis.representations import summarize_probes
    from vitviz.plot.probes import plot_layer_probes

    rng = np.random.default_rng(0)
    rows = [{"model": m, "layer": f"block{d - 1}" if d <= 3 else "pre_logits", "depth": d, "probe": "linear",
             "shots": 5, "seed": s, "accuracy": 10 * d + off + rng.normal()}
            for m, off in (("a", 0), ("b", 5)) for d in (1, 2, 3, 4) for s in range(4)]
    df = pd.DataFrame(rows)
    ax = plot_layer_probes(df)
    s = summarize_probes(df)
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "b, 5-shot")
    want = s[(s.model == "b") & (s.layer != "pre_logits")].sort_values("depth")
    np.testing.assert_allclose(line.get_ydata(), want.accuracy)
    assert ax.get_xlabel() == "Block (depth)" and "%" in ax.get_ylabel()
    with pytest.raises(InputError, match="layer_probes"):
        plot_layer_probes(df.drop(columns="depth"))


@pytest.mark.slow
@pytest.mark.notebook
def test_notebook_05_runs_headless(run_notebook, tiny_folder, tmp_path):
    out_dir = tmp_path / "figs"
    _, text, images = run_notebook("05_representations.ipynb", cifar_root=str(tiny_folder), shots=[1, 5],
                                   n_draws=3, test_per_class=5, knn_train_per_class=20, out_dir=str(out_dir),
                                   model_names=["cifar10-vit", "cifar10-hybrid"])
    assert "largest gain entering block" in text
    assert len(images) >= 2 and (out_dir / "layer_probes.png").exists()
    from vitviz.experiments.cls_vs_gap import cls_vs_gap_claims, read_cls_vs_gap

    c = cls_vs_gap_claims(read_cls_vs_gap()).set_index("head").loc["gap"]  # the committed sweep, as printed
    assert (f"Best GAP minus best class token: {c.gap_best:+.2f} points (95% interval paired over {int(c.seeds)} "
            f"seeds: {c.gap_best_low:+.2f} to {c.gap_best_high:+.2f})") in text


def test_fewshot_by_epoch_scores_every_kept_epoch(tiny_folder, tmp_path):
    from vitviz.analysis.representations import linear_fewshot, per_class_subset
    from vitviz.experiments.cls_vs_gap import (
        HEADS,
        ClsGapConfig,
        fewshot_by_epoch,
        read_fewshot_by_epoch,
        train_config,
    )
    from vitviz.plot.probes import plot_cls_vs_gap
    from vitviz.zoo.reference import build_reference

    cfg = ClsGapConfig(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"),
                       heads=("gap",), lrs=(1e-3,))
    run_dir = train_config(cfg, "gap", 1e-3, 0).run_dir / "epochs"
    run_dir.mkdir(parents=True)
    weights = {}
    for epoch in (1, 2):
        torch.manual_seed(epoch)
        weights[epoch] = build_reference("cifar10-vit", **HEADS["gap"]).eval()
        torch.save(weights[epoch].state_dict(), run_dir / f"epoch_{epoch:03d}.pt")
    with pytest.warns(UserWarning, match="keeps epoch weights but no last.pt.*could not be checked"):
        raw = fewshot_by_epoch(cfg, shots=2, seeds=(0, 1), test_per_class=3)
    assert sorted(raw.epoch.unique()) == [1, 2] and len(raw) == 4
    for epoch, model in weights.items():  # the same numbers as probing that epoch's model directly
        test = per_class_subset(model, tiny_folder / "test", 3)
        direct = linear_fewshot(model, tiny_folder / "train", test, shots=(2,), seeds=(0, 1))
        np.testing.assert_allclose(raw[raw.epoch == epoch].accuracy.to_numpy(), direct.accuracy.to_numpy())
    mean = read_fewshot_by_epoch(tmp_path / "r_fewshot.csv")  # named after its sweep's results, r.csv
    assert list(mean.columns[:4]) == ["head", "lr", "seed", "epoch"] and (mean.draws == 2).all()
    assert "fewshot5" not in mean  # 2-shot accuracies: named (and labelled) 2-shot, not 5-shot
    assert mean.fewshot2.tolist() == pytest.approx(raw.groupby("epoch").accuracy.mean().tolist())
    ax = plot_cls_vs_gap(mean, metric="fewshot2")
    assert ax.get_ylabel().startswith("CIFAR-10 2-shot linear top-1")


def test_cls_vs_gap_claims_refuse_runs_that_did_not_reach_the_last_epoch():
    """An unfinished run dropped out of the last-epoch comparison without a word: with the GAP head's best rate
    missing, the claims read "different learning rates" (the paper's finding) from one rate."""
    from vitviz.experiments.cls_vs_gap import cls_vs_gap_claims

    df = _runs({("cls", 1e-3): 60.0, ("cls", 3e-4): 55.0, ("gap", 1e-3): 58.0, ("gap", 3e-4): 50.0})
    partial = df[~((df["head"] == "gap") & (df["lr"] == 1e-3) & (df["epoch"] == df["epoch"].max()))]
    with pytest.raises(InputError, match=r"gap-lr0.001-s0 at epoch .*cls_vs_gap_claims\(df\[df.epoch <= "):
        cls_vs_gap_claims(partial)
    common = int(partial.groupby(["head", "lr", "seed"]).epoch.max().min())
    c = cls_vs_gap_claims(partial[partial.epoch <= common]).set_index("head")
    assert c.loc["gap", "epochs"] == common and c.loc["gap", "best_lr"] == 1e-3  # every rate compared
    assert cls_vs_gap_claims(df).set_index("head").loc["gap", "same_best_lr"]


def test_cls_vs_gap_rates_are_one_number_from_the_command_line_to_the_claims():
    """The command's default ``--lrs`` once printed the rates with ``:g``: it trained at ``0.000375`` where the
    sweep's code trains at ``1e-3 * 3 / 8 = 0.00037499999999999995``, the same run id, so the two could not resume
    each other's folders and a table holding both counted one run as two rates (every seed "missing" at each). The
    default is now ``LRS`` to the last bit, the claims refuse rates that differ only in their last bits, and the
    committed tables carry one rate per run; each committed sweep holds every run of the seeds its settings list
    (seeds trained apart and merged in)."""
    from vitviz.experiments.cls_vs_gap import (
        LRS,
        cls_vs_gap_claims,
        parser,
        read_cls_vs_gap,
        read_fewshot_by_epoch,
    )

    assert parser().parse_args([]).lrs == LRS
    df = _runs({("cls", 1e-3): 60.0, ("cls", LRS[1]): 55.0, ("gap", 1e-3): 58.0, ("gap", LRS[1]): 50.0})
    typed = df.assign(lr=df.lr.where((df["head"] == "cls") | (df.lr == 1e-3), 0.000375))  # GAP's rate typed
    with pytest.raises(InputError, match=r"0\.00037499999999999995 and 0\.000375 differ only in their last bits"):
        cls_vs_gap_claims(typed)
    fixed = typed.assign(lr=typed.lr.map(lambda x: min(LRS, key=lambda r: abs(r - x))))  # the message's fix
    assert cls_vs_gap_claims(fixed).equals(cls_vs_gap_claims(df))
    runs, fewshot = read_cls_vs_gap(), read_fewshot_by_epoch()
    assert set(fewshot.lr) == set(runs.lr) == set(LRS)
    assert cls_vs_gap_claims(fewshot, metric="fewshot5").seeds.eq(runs.seed.nunique()).all()
    data = Path(__file__).resolve().parents[1] / "data" / "cls_vs_gap"
    for name in ("cls_vs_gap", "cls_vs_gap_15k"):  # each committed sweep: the seeds its settings list, every run
        table = read_cls_vs_gap(data / f"{name}.csv")
        settings = json.loads((data / f"{name}.json").read_text())["settings"]
        assert sorted(table.seed.unique()) == settings["seeds"] and set(table.lr) == set(settings["lrs"])
        assert cls_vs_gap_claims(table).seeds.eq(len(settings["seeds"])).all()


def test_cls_vs_gap_rows_count_the_images_the_runs_used(tiny_folder, tmp_path):
    """``train_images``/``test_images`` were the subsets asked for, or CIFAR-10's 50,000/10,000 for the whole set,
    whatever the data held (here 300 and 100 images)."""
    import json
    from dataclasses import asdict

    from vitviz.experiments.cls_vs_gap import ClsGapConfig, collect, train_config
    from vitviz.experiments.data import run_fingerprint

    cfg = ClsGapConfig(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"),
                       heads=("cls",), lrs=(1e-3,), epochs=1, train_subset=None, test_subset=500)
    tc = train_config(cfg, "cls", 1e-3, 0)
    tc.run_dir.mkdir(parents=True)
    history = [{"epoch": 1, "test_acc": 10.0, "lr": 1e-3}]  # the epochs are read from last.pt, as train writes it
    state = {"format": "vitviz-train-state-v1", "config": asdict(tc), "epoch": 1, "history": history,
             "data_fingerprint": run_fingerprint(tc)}
    torch.save(state, tc.run_dir / "last.pt")
    (tc.run_dir / "metrics.json").write_text(json.dumps(history))
    rows = collect(cfg)
    assert rows[["train_images", "test_images"]].values.tolist() == [[300, 100]]


@pytest.mark.parametrize("module, argv, message", [
    ("cls_vs_gap", ["--seeds", "a"], "argument --seeds: 'a' in 'a' is not a whole number"),  # a traceback
    ("cls_vs_gap", ["--lrs", "x"], "argument --lrs: 'x' in 'x' is not a number"),  # a traceback
    ("cls_vs_gap", ["--lrs", "3e-4,0"], "argument --lrs: 0.0 in '3e-4,0' is not a finite number above 0"),
    ("cls_vs_gap", ["--heads", "cls,avg"], "argument --heads: 'avg' in 'cls,avg': not one of cls, gap"),
    ("cls_vs_gap", ["--epochs", "0"], "argument --epochs: 0 is not a positive count"),
    ("cls_vs_gap", ["--warmup-epochs", "-1"], "argument --warmup-epochs: -1.0 is not a finite number of 0 or more"),
    ("cls_vs_gap", ["--train-subset", "-5"], "argument --train-subset: -5 is negative"),
    ("cls_vs_gap", ["--seeds", ","], "--seeds is empty"),
    ("posemb_fewshot", ["--seeds", "0"], "argument --seeds: 0 is not a positive count"),  # no draw at all
    ("posemb_fewshot", ["--shots", "5,x"], "argument --shots: 'x' in '5,x' is not a whole number"),  # a traceback
    ("posemb_fewshot", ["--shots", ","], "--shots is empty"),
    ("posemb_fewshot", ["--test-subset", "-2"], "argument --test-subset: -2 is negative"),
])
def test_the_experiment_command_lines_refuse_bad_values_naming_the_option(module, argv, message, tmp_path, capsys):
    """Each bad value is argparse's usage error (exit 2) naming the option, the value and the fix, before any data is
    read (the data folder is not there) and without a traceback."""
    import importlib

    main = importlib.import_module(f"vitviz.experiments.{module}").main
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--data", str(tmp_path / "none"), "--results", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_cls_vs_gap_claims_refuse_a_run_with_two_last_epoch_rows():
    """A run listed twice at its last epoch counted as two seeds: its seed weighed twice in the head's mean and
    entered the paired interval twice (6 pairs from 5 seeds, a narrower interval); it is refused naming the run."""
    from vitviz.experiments.cls_vs_gap import cls_vs_gap_claims

    final = {("cls", 1e-3): 60.0, ("cls", 3e-4): 55.0, ("gap", 1e-3): 40.0, ("gap", 3e-4): 59.0}
    df = pd.concat([_runs(final).assign(seed=sd) for sd in range(3)], ignore_index=True)
    df.loc[(df.epoch == 3) & (df.seed == 1), "test_acc"] += 1.0
    twice = pd.concat([df, df[(df.epoch == 3) & (df["head"] == "gap") & (df.seed == 0)]], ignore_index=True)
    with pytest.raises(InputError, match=r"gap-lr0.001-s0 has 2 rows at epoch 3.*drop_duplicates"):
        cls_vs_gap_claims(twice)


def test_the_few_shot_by_epoch_reader_refuses_a_run_missing_a_draw(tmp_path):
    """One run's epoch without draw 2 averaged other few-shot images than the runs it is compared with; refused
    naming the run."""
    from vitviz.experiments.cls_vs_gap import read_fewshot_by_epoch

    rows = [{"model": f"{h}-lr0.001-s0", "head": h, "lr": 1e-3, "run_seed": 0, "epoch": e, "layer": "pre_logits",
             "depth": 7, "probe": "linear", "shots": 5, "seed": d, "l2_reg": 1024.0, "accuracy": 20.0 + d + e,
             "train_images": 50, "test_images": 1000} for h in ("cls", "gap") for e in (1, 2) for d in (0, 1, 2)]
    path = tmp_path / "f.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    assert read_fewshot_by_epoch(path).fewshot5.tolist() == pytest.approx([22.0, 23.0, 22.0, 23.0])
    pd.DataFrame(rows[:-1]).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"gap-lr0.001-s0.*epoch 2.*draws \[0, 1\].*\[0, 1, 2\]"):
        read_fewshot_by_epoch(path)


def with_digests(raw):
    """``draws_table`` with the image digests linear_fewshot records: one training draw per shots and seed, one test
    set, the same for every model."""
    return raw.assign(train_digest=[f"train-{k}-{s}" for k, s in zip(raw.shots, raw.seed)], test_digest="test-all")


def test_posemb_draw_differences_refuse_draws_on_other_images_of_the_same_count():
    """Two models' draws at one seed on other images (the same counts) were paired silently; refused naming both
    models and the seed. A table without the digests (as the committed one was written) still pairs, with a
    warning."""
    import warnings

    from vitviz.errors import UncheckedImagesWarning
    from vitviz.experiments.posemb_fewshot import posemb_draw_differences

    raw = with_digests(draws_table())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedImagesWarning)
        paired = posemb_draw_differences(raw)
    other_test = raw.copy()
    other_test.loc[other_test.model == "cifar10-vit-2dpos", "test_digest"] = "test-other"  # 10,000 images too
    with pytest.raises(InputError, match=r"cifar10-vit-nopos and cifar10-vit-2dpos were measured on different test "
                                         r"images at the 5-shot draw seed=0"):
        posemb_draw_differences(other_test)
    other_draw = raw.copy()
    other_draw.loc[(other_draw.model == "cifar10-vit-nopos") & (other_draw.seed == 3), "train_digest"] = "train-x"
    with pytest.raises(InputError, match=r"cifar10-vit-nopos and cifar10-vit-1dpos were measured on different "
                                         r"few-shot training images at the 5-shot draw seed=3"):
        posemb_draw_differences(other_draw)
    with pytest.warns(UncheckedImagesWarning, match=r"cifar10-vit-nopos, cifar10-vit-1dpos, cifar10-vit-2dpos.*"
                                                    r"paired by seed and their test sets by count"):
        old = posemb_draw_differences(raw.drop(columns=["train_digest", "test_digest"]))
    pd.testing.assert_frame_equal(old, paired)


def test_the_few_shot_means_of_runs_refuse_runs_measured_on_other_images(tmp_path):
    """The runs of a sweep are compared on their means over the draws: a run whose draw or test set held other
    images (the same counts) is refused; a table without the digests is read with a warning."""
    import warnings

    from vitviz.errors import UncheckedImagesWarning
    from vitviz.experiments.cls_vs_gap import read_fewshot_by_epoch

    rows = [{"model": f"{h}-lr0.001-s0", "head": h, "lr": 1e-3, "run_seed": 0, "epoch": e, "layer": "pre_logits",
             "depth": 7, "probe": "linear", "shots": 5, "seed": d, "l2_reg": 1024.0, "accuracy": 20.0 + d + e,
             "train_images": 50, "test_images": 1000, "train_digest": f"draw{d}", "test_digest": "test"}
            for h in ("cls", "gap") for e in (1, 2) for d in (0, 1, 2)]
    path = tmp_path / "f.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedImagesWarning)
        assert read_fewshot_by_epoch(path).fewshot5.tolist() == pytest.approx([22.0, 23.0, 22.0, 23.0])
    bad = pd.DataFrame(rows)
    bad.loc[(bad["head"] == "gap") & (bad.epoch == 2), "test_digest"] = "another-test"
    bad.to_csv(path, index=False)
    with pytest.raises(InputError, match=r"cls-lr0.001-s0 and gap-lr0.001-s0 were measured on different test images "
                                         r"at the 5-shot draw seed=0"):
        read_fewshot_by_epoch(path)
    pd.DataFrame(rows).drop(columns=["train_digest", "test_digest"]).to_csv(path, index=False)
    with pytest.warns(UncheckedImagesWarning, match=r"runs cls-lr0.001-s0, gap-lr0.001-s0 were measured on"):
        read_fewshot_by_epoch(path)


def test_linear_fewshot_records_which_images_each_draw_and_the_test_set_are(tiny_folder):
    """Two models on the same folders record the same digests (the images, not the preprocessed pixels); another test
    subset of the same size records another, and posemb_draw_differences refuses to pair them."""
    from torch.utils.data import Subset

    from vitviz.analysis.representations import linear_fewshot, per_class_subset
    from vitviz.core.datasets import ImageFolder
    from vitviz.experiments.posemb_fewshot import posemb_draw_differences
    from vitviz.zoo.reference import build_reference

    models = {}
    for i, name in enumerate(ABLATION[:2]):
        torch.manual_seed(i)
        models[name] = build_reference("cifar10-vit").eval()
    first = {n: per_class_subset(m, tiny_folder / "test", 3) for n, m in models.items()}
    a, b = (linear_fewshot(m, tiny_folder / "train", first[n], shots=(2,), seeds=(0, 1), name=n)
            for n, m in models.items())
    assert a.train_digest.notna().all() and a.test_digest.notna().all()
    assert a.train_digest.tolist() == b.train_digest.tolist() and a.train_digest.nunique() == 2
    assert a.test_digest.tolist() == b.test_digest.tolist() and a.accuracy.tolist() != b.accuracy.tolist()
    assert len(posemb_draw_differences(pd.concat([a, b]), ABLATION[:2])) == 2
    # the last 3 test images of each class: as many images, other ones
    m = models[ABLATION[1]]
    full = ImageFolder(tiny_folder / "test", m)
    labels = np.asarray(full.labels)
    last = Subset(full, np.sort(np.concatenate([np.flatnonzero(labels == c)[-3:] for c in range(10)])).tolist())
    c = linear_fewshot(m, tiny_folder / "train", last, shots=(2,), seeds=(0, 1), name=ABLATION[1])
    assert (c.test_images == a.test_images).all() and c.test_digest.iloc[0] != a.test_digest.iloc[0]
    assert c.train_digest.tolist() == a.train_digest.tolist()
    with pytest.raises(InputError, match=r"different test images at the 2-shot draw seed=0"):
        posemb_draw_differences(pd.concat([a, c]), ABLATION[:2])
