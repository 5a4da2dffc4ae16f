"""Fig. 5 from Table 6: the data, the figure, and FLOP counting against the analytic ViT formula."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from vitviz.analysis.flops import count_flops, vit_forward_flops
from vitviz.errors import InputError
from vitviz.plot.compute import pareto_frontier, plot_compute_curves
from vitviz.zoo.paper import paper_results
from vitviz.zoo.reference import build_reference

SHARED = Path(__file__).resolve().parents[2] / "shared" / "paper" / "vit_table6_scaling.csv"


def test_table6_matches_the_shared_copy_number_for_number():
    df = paper_results()
    assert len(df) == 18 and set(df.family) == {"Transformer (ViT)", "ResNet (BiT)", "Hybrid"}
    if not SHARED.is_file():
        pytest.skip("shared/paper not beside the repository")
    ref = pd.read_csv(SHARED)
    cols = ["imagenet", "imagenet_real", "cifar10", "cifar100", "pets", "flowers", "exaflops", "epochs"]
    assert list(df.model) == list(ref.model) and list(df.family) == list(ref.family)
    np.testing.assert_array_equal(df[cols].to_numpy(), ref[cols].to_numpy())
    np.testing.assert_allclose(df.avg5, ref.avg5_derived, atol=5e-4)


def test_paper_numbers_quoted_in_the_issue():
    df = paper_results().set_index(["model", "epochs"])
    assert df.loc[("R50x1+ViT-B/32", 7), "imagenet"] == 84.90 and df.loc[("ViT-B/32", 7), "imagenet"] == 80.73
    assert df.loc[("R50x1+ViT-L/16", 14), "imagenet"] == df.loc[("ViT-L/16", 14), "imagenet"] == 87.12


def scatter_points(ax) -> dict[str, np.ndarray]:
    return {c.get_label(): np.asarray(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection)}


def test_figure_points_labels_and_scale():
    fig = plot_compute_curves(frontier=True, annotate=True)
    df = paper_results()
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["Average-5", "ImageNet"]
    assert axes[0].get_ylabel() == "Transfer accuracy [%]"
    assert all(ax.get_xlabel() == "Total pre-training compute [exaFLOPs]" and ax.get_xscale() == "log"
               for ax in axes)
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert legend == ["Transformer (ViT)", "ResNet (BiT)", "Hybrid"]
    for ax, metric in zip(axes, ["avg5", "imagenet"]):
        pts = scatter_points(ax)
        for family, part in df.groupby("family"):
            np.testing.assert_allclose(pts[family], part[["exaflops", metric]].to_numpy(float))


def test_measured_dataframe_in_the_same_style():
    df = pd.DataFrame({"family": ["Transformer (ViT)", "Hybrid", "ResNet"], "model": ["a", "b", "c"],
                       "train_pflops": [1.0, 2.0, 4.0], "test_acc": [50.0, 60.0, 70.0]})
    fig = plot_compute_curves(df, metrics=("test_acc",), x="train_pflops")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Total training compute [PFLOPs]" and ax.get_title() == "CIFAR-10 test"
    assert set(scatter_points(ax)) == {"Transformer (ViT)", "Hybrid", "ResNet"}
    with pytest.raises(KeyError, match="lacks columns"):
        plot_compute_curves(df, metrics=("avg5",), x="train_pflops")
    # points 9% apart in compute: the log axis still spans a decade, so the gap is not blown up to the panel width
    close = df.assign(train_pflops=[0.305, 0.31, 0.332])
    lo, hi = plot_compute_curves(close, metrics=("test_acc",), x="train_pflops").axes[0].get_xlim()
    assert hi / lo == pytest.approx(10.0) and lo < 0.305 and hi > 0.332
    assert np.sqrt(lo * hi) == pytest.approx(np.sqrt(0.305 * 0.332))
    # ...labelled with plain 1-2-5 numbers, and the extreme points keep a margin from the frame
    ax = plot_compute_curves(close, metrics=("test_acc",), x="train_pflops").axes[0]
    ax.figure.canvas.draw()
    visible = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    assert visible == ["0.2", "0.5", "1"]
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    ylo, yhi = ax.get_ylim()
    assert yhi - 70.0 >= 0.09 * (yhi - ylo) and 50.0 - ylo >= 0.09 * (yhi - ylo)
    # a wide range keeps matplotlib's own limits
    lo, hi = plot_compute_curves(df.assign(train_pflops=[0.01, 1.0, 10.0]), metrics=("test_acc",),
                                 x="train_pflops").axes[0].get_xlim()
    assert lo < 0.01 and hi > 10.0 and hi / lo < 1e4


def test_pareto_frontier():
    fx, fy = pareto_frontier(np.array([1, 2, 3, 4.0]), np.array([50, 45, 60, 58.0]))
    np.testing.assert_array_equal(fx, [1, 3])
    np.testing.assert_array_equal(fy, [50, 60])


@pytest.mark.parametrize(("kwargs", "img", "patch", "classes"), [
    ({"embed_dim": 96, "depth": 6, "mlp_ratio": 2.0}, (32, 32), 4, 10),
    ({"embed_dim": 64, "depth": 3, "mlp_ratio": 4.0}, (32, 48), 8, 10),
])
def test_flop_counter_agrees_with_the_analytic_vit_formula(kwargs, img, patch, classes):
    model = build_reference("cifar10-vit", img_size=img, patch_size=patch, num_heads=2, **kwargs)
    measured = count_flops(model, (3, *img))
    analytic = vit_forward_flops(img_size=img, patch_size=patch, num_classes=classes, **kwargs)
    assert abs(measured - analytic) / analytic < 0.05
    assert count_flops(model, (3, *img), backward=True) > 2.5 * measured  # backward ~ 2x forward


def test_vit_b16_analytic_flops_match_the_published_17_6_gmacs():
    flops = vit_forward_flops(img_size=(224, 224), patch_size=16, embed_dim=768, depth=12)
    assert abs(flops / 2 / 1e9 - 17.6) < 0.1


def test_paper_hybrid_gap_at_equal_compute_closes_with_compute():
    """The one gap API on the paper's Table 6 (no seeds): Hybrid minus ViT at equal exaFLOPs, each family's
    Pareto frontier interpolated in log10(compute), recomputed here by hand at the ends of the shared range."""
    from vitviz.experiments.compare import matched_compute

    paper = paper_results()
    gap = matched_compute(paper, "Hybrid", "Transformer (ViT)", metric="imagenet", x="exaflops", n=5)
    assert gap.exaflops.iloc[0] == pytest.approx(106) and gap.exaflops.iloc[-1] == pytest.approx(1668)
    assert (gap.n_seeds == 1).all() and gap.within_noise.isna().all()  # one run per model: no interval

    def vit_frontier(e):  # the ViT frontier: 55 -> 80.73, 196 -> 84.37, 783 -> 86.30, 1567 -> 87.12, 4262 -> 88.08
        xs, ys = [55, 196, 783, 1567, 4262], [80.73, 84.37, 86.30, 87.12, 88.08]
        return np.interp(np.log10(e), np.log10(xs), ys)

    assert gap.gap.iloc[0] == pytest.approx(84.90 - vit_frontier(106))
    assert gap.gap.iloc[-1] == pytest.approx(87.12 - vit_frontier(1668))
    assert gap.gap.iloc[0] > 2 and abs(gap.gap.iloc[-1]) < 0.5 and gap.gap.is_monotonic_decreasing


@pytest.mark.slow
@pytest.mark.notebook
def test_notebook_03_runs_offline_and_saves_figures(tmp_path, monkeypatch, run_notebook):
    monkeypatch.delenv("VITVIZ_DATA", raising=False)  # scikit-image's photographs stand in for CIFAR-10
    rows = [("Transformer (ViT)", "vit", e, 0.1 * e, 30.0 + e) for e in (1, 2)]
    rows += [("Hybrid", "hybrid", e, 0.15 * e, 35.0 + e) for e in (1, 2)]
    rows += [("ResNet", "resnet", e, 0.12 * e, 40.0 + e) for e in (1, 2)]
    csv = tmp_path / "study.csv"
    pd.DataFrame([{"run_id": f"{m}-S-e{e}-n100-s{s}", "family": f, "model": f"{m}-S", "size": "S", "epochs": e,
                   "params": 1, "train_images": 100, "train_pflops": c, "test_acc": a + s, "test_images": 100,
                   "wall_time_s": 1.0, "device": "cpu", "seed": s}
                  for f, m, e, c, a in rows for s in (0, 1)]).to_csv(csv, index=False)
    _, text, images = run_notebook("03_hybrid_vs_pure.ipynb", results_csv=str(csv), n_images=4,
                                   out_dir=str(tmp_path / "figs"), arrays_dir=str(tmp_path / "arrays"))
    assert len(images) >= 3 and "Spearman rho(layer, head distance)" in text and "95% CI" in text
    stems = ["fig5_compute_curves", "study_compute_curves", "fig11_attention_distance_vit_vs_hybrid"]
    from vitviz.zoo.cards import reference_compute

    if len(reference_compute()):  # the shipped cards on the compute axis
        stems.append("reference_compute")
    for stem in stems:
        assert (tmp_path / "figs" / f"{stem}.png").stat().st_size > 1000, stem
        assert (tmp_path / "arrays" / f"{stem}.npz").is_file(), stem


def test_annotations_name_the_budget_of_repeated_models():
    fig = plot_compute_curves(annotate=True)
    texts = {t.get_text() for t in fig.axes[1].texts}
    assert {"ViT-L/16, 7 ep", "ViT-L/16, 14 ep", "ViT-B/32"} <= texts


def _set_fused(model, fused: bool) -> None:
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = fused


@pytest.mark.parametrize("backward", [False, True])
def test_flop_count_is_the_same_on_the_fused_and_the_explicit_attention_path(backward):
    model = build_reference("cifar10-vit", img_size=(32, 32), patch_size=4, embed_dim=64, depth=2, num_heads=2)
    _set_fused(model, True)
    fused = count_flops(model, (3, 32, 32), backward=backward)
    _set_fused(model, False)
    explicit = count_flops(model, (3, 32, 32), backward=backward)
    assert fused == explicit  # and both equal the analytic formula with its 2 N^2 D attention term (above)


def test_flop_count_of_bare_sdpa_matches_two_matmuls_on_every_backend():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Sdpa(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, x):  # x (1, 3, 8, 16): read as (B, H, N, d) = (1, 3, 8, 16)
            return F.scaled_dot_product_attention(x * self.w, x, x)

    flops = count_flops(Sdpa(), (3, 8, 16))
    assert flops == 2 * 2 * 3 * 8 * 8 * 16  # QK^T and AV: 2 matmuls of H*N*N*d multiply-adds


@pytest.mark.parametrize(("exaflops", "imagenet", "message"), [
    (0.0, 80.0, r"ViT-X \(exaflops=0, imagenet=80\)"),
    (-5.0, 80.0, r"ViT-X \(exaflops=-5"),
    (np.nan, 80.0, r"ViT-X \(exaflops=nan"),
    (100.0, np.nan, r"ViT-X \(exaflops=100, imagenet=nan\)"),
])
def test_a_point_the_log_axis_cannot_draw_is_refused_not_left_out(exaflops, imagenet, message):
    """On the log compute axis matplotlib left a compute of 0, a negative one or NaN out of the scatter (and a NaN
    accuracy is no point either): the model went missing from Fig. 5 without a word."""
    import matplotlib.pyplot as plt

    from vitviz.plot.compute import plot_compute_panel

    df = pd.concat([paper_results(), pd.DataFrame({"family": ["Transformer (ViT)"], "model": ["ViT-X"], "epochs": [7],
                                                    "exaflops": [exaflops], "imagenet": [imagenet], "avg5": [90.0]})],
                   ignore_index=True)
    with pytest.raises(InputError, match=r"1 of the 19 rows cannot be drawn on the log exaflops axis.*"
                                                + message):
        plot_compute_panel(df, "imagenet")
    with pytest.raises(InputError, match=message):
        plot_compute_curves(df, metrics=("imagenet",))
    plt.close("all")


def test_a_panel_alone_names_its_y_axis_and_families():
    import matplotlib.pyplot as plt

    from vitviz.plot.compute import plot_compute_panel

    ax = plot_compute_panel(paper_results(), "imagenet")
    assert ax.get_ylabel() == "Transfer accuracy [%]"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Transformer (ViT)", "ResNet (BiT)", "Hybrid"]
    measured = pd.DataFrame({"family": ["Hybrid"], "model": ["h"], "train_pflops": [1.0], "test_acc": [50.0]})
    assert plot_compute_panel(measured, "test_acc", x="train_pflops").get_ylabel() == "Test accuracy [%]"
    fig = plot_compute_curves()  # the paper's Fig. 5: y label and legend on the first panel only
    assert fig.axes[1].get_ylabel() == "" and fig.axes[1].get_legend() is None
    plt.close("all")
