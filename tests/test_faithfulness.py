"""vitviz.faithfulness: the perturbations are what they say, the scores are the model's, the AUCs and intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.analysis.perturbation import drop_module, fill_patches, keep_tokens
from vitviz.errors import InputError


def timm_on_tokens(model, x, keep):
    """timm forward written out, keeping the class token and the patches ``keep`` after the position embedding."""
    h = model._pos_embed(model.patch_embed(x))
    idx = keep[..., None].expand(-1, -1, h.shape[-1])
    h = torch.cat([h[:, :1], h[:, 1:].gather(1, idx)], dim=1)
    h = model.norm_pre(h)
    for blk in model.blocks:
        h = blk(h)
    return model.forward_head(model.norm(h))


def test_dropping_tokens_equals_running_the_model_on_the_kept_tokens():
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    keep = torch.tensor([[0, 3, 5, 20], [1, 2, 22, 23]])
    module = drop_module(model)
    assert module is model.pos_drop
    with torch.no_grad():
        with keep_tokens(model, keep):
            got = model(x)
        torch.testing.assert_close(got, timm_on_tokens(model, x, keep))
        assert not torch.allclose(got, model(x))  # and the hook is gone afterwards:
        torch.testing.assert_close(model(x), timm_on_tokens(model, x, torch.arange(24).expand(2, -1)))


def test_torchvision_and_hugging_face_drop_after_their_position_embedding():
    from torchvision.models.vision_transformer import VisionTransformer
    from transformers import ViTConfig, ViTForImageClassification

    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64).eval()
    hf = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=64)).eval()
    assert drop_module(tv) is tv.encoder.dropout and drop_module(hf) is hf.vit.embeddings.dropout
    x = torch.randn(2, 3, 32, 32)
    keep = torch.tensor([[0, 5, 9], [3, 4, 15]])
    with torch.no_grad():
        seq = []
        handle = hf.vit.embeddings.register_forward_hook(lambda _m, _i, out: seq.append(out))
        hf(x)
        handle.remove()
        kept = torch.cat([seq[0][:, :1], seq[0][:, 1:].gather(1, keep[..., None].expand(-1, -1, 32))], dim=1)
        h = kept
        for layer in hf.vit.layers:  # transformers >= 5.2 layout
            h = layer(h, None)
        want = hf.classifier(hf.vit.layernorm(h)[:, 0])
        with keep_tokens(hf, keep):
            torch.testing.assert_close(hf(x).logits, want, atol=1e-5, rtol=1e-5)


def test_models_without_prefix_tokens_fall_back_to_the_mean():
    model = tiny_timm_vit(class_token=False, global_pool="avg")
    assert drop_module(model) is None
    x = torch.randn(4, 3, 32, 48)
    df = vitviz.faithfulness(model, x, ["random"], steps=0.5, progress=False)
    assert set(df["removal"]) == {"mean"} and df.attrs["removal"] == "mean"
    assert df.attrs["readout"].startswith("mean of the patch tokens")  # what the row-reading maps explained
    with pytest.raises(InputError, match="removal='drop'.*use removal='mean'"):
        vitviz.faithfulness(model, x, ["random"], removal="drop", progress=False)


def test_mean_fill_sets_exactly_the_removed_patches():
    x = torch.randn(2, 3, 32, 48)
    removed = torch.zeros(2, 24, dtype=torch.bool)
    removed[0, 7] = True  # row 1, column 1 of the 4x6 grid: pixels [8:16, 8:16]
    removed[1, 23] = True  # the last patch: pixels [24:32, 40:48]
    out = fill_patches(x, removed, (4, 6), (8, 8), torch.tensor([1.0, 2.0, 3.0]))
    changed = (out != x).any(dim=1)
    assert changed[0, 8:16, 8:16].all() and changed[0].sum() == 64
    assert changed[1, 24:32, 40:48].all() and changed[1].sum() == 64
    assert out[0, :, 8, 8].tolist() == [1.0, 2.0, 3.0]


def test_each_score_is_the_model_on_the_perturbed_input():
    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    df = vitviz.faithfulness(model, x, ["random", "chefer"], steps=0.25, batch_size=2, progress=False)
    assert list(df.columns) == ["image", "method", "mode", "fraction", "removed", "score", "metric", "removal"]
    assert len(df) == 3 * 2 * 4 * 5 and set(df["removal"]) == {"drop"}
    with torch.no_grad():
        pred = model(x).argmax(-1)
    maps = vitviz.explain(model, x, "random")
    for i in range(3):
        order = maps[i].flatten().argsort(descending=True)  # i.i.d. uniform: no ties
        for mode, f in [("deletion", 0.25), ("insertion", 0.75), ("deletion", 1.0)]:
            k = round(f * 24)
            keep = order[k:] if mode == "deletion" else order[:k]
            with torch.no_grad():
                logits = timm_on_tokens(model, x[i:i + 1], keep.sort().values[None])
            want = logits.softmax(-1)[0, pred[i]].item()
            got = df.query(f"image == {i} and method == 'random' and mode == '{mode}' and fraction == {f}")
            assert got["metric"].item() == "probability"
            assert got["score"].item() == pytest.approx(want, abs=1e-5)
    clean = df[df["fraction"] == 0]
    assert (clean[clean["metric"] == "accuracy"]["score"] == 1).all()  # target=None: the clean prediction


def test_labels_score_accuracy_against_the_truth():
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    with torch.no_grad():
        pred = model(x).argmax(-1)
    wrong = ((pred + 1) % 5).tolist()
    df = vitviz.faithfulness(model, x, ["random"], labels=wrong, steps=0.5, progress=False)
    clean = df[(df["fraction"] == 0) & (df["metric"] == "accuracy")]
    assert (clean["score"] == 0).all()
    with pytest.raises(InputError, match="3 class indices but there are 4 images"):
        vitviz.faithfulness(model, x, ["random"], labels=[0, 1, 2], progress=False)


def test_labels_with_a_callable_target_are_refused():
    """A callable target is scored by its own value: labels given beside it would score nothing, so they are
    refused before any work rather than dropped while ``attrs["labels"]`` says they were used."""
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    for labels in ([0, 1], [99, 99], torch.tensor([0, 1])):
        with pytest.raises(InputError, match=r"labels=<\w+ of 2 labels> with target=<lambda>, a callable.*drop labels="):
            vitviz.faithfulness(model, x, ["random"], target=lambda out: out[:, 3], labels=labels, steps=0.5,
                                progress=False)


def test_callable_targets_record_their_own_score():
    model = tiny_timm_vit(num_classes=0)
    x = torch.randn(2, 3, 32, 48)
    df = vitviz.faithfulness(model, x, ["chefer"], target=lambda out: out.norm(dim=-1), steps=0.5,
                             progress=False)
    assert set(df["metric"]) == {"target"}
    with torch.no_grad():
        norms = model(x).norm(dim=-1)
    clean = df[(df["fraction"] == 0) & (df["mode"] == "deletion")].sort_values("image")
    np.testing.assert_allclose(clean["score"], norms.numpy(), rtol=1e-5)


def test_auc_and_bootstrap_interval():
    model = tiny_timm_vit()
    x = torch.randn(6, 3, 32, 48)
    df = vitviz.faithfulness(model, x, ["random", "rollout"], steps=0.25, progress=False)
    auc = vitviz.faithfulness_auc(df, n_boot=200)
    assert len(auc) == 2 * 4 and set(auc["better"]) == {"lower", "higher"}
    row = auc[(auc["method"] == "rollout") & (auc["mode"] == "insertion")].iloc[0]
    curves = df[(df["method"] == "rollout") & (df["mode"] == "insertion")].sort_values("fraction")
    by_hand = np.mean([sum((a + b) / 2 * (x1 - x0) for a, b, x0, x1 in zip(g["score"].iloc[:-1], g["score"].iloc[1:],
                                                                         g["fraction"].iloc[:-1], g["fraction"].iloc[1:]))
                       for _, g in curves.groupby("image")])
    assert row["auc"] == pytest.approx(by_hand) and row["ci_low"] <= row["auc"] <= row["ci_high"]
    assert row["n_images"] == 6
    short = vitviz.faithfulness_auc(df, n_boot=10, upto=0.5)
    assert (short["auc"] <= auc["auc"] + 1e-12).all()  # non-negative scores over a shorter range
    assert all(np.isscalar(v) for v in df.attrs.values())  # tidy: no table hides in attrs


def test_bootstrap_ci_is_seeded_and_shrinks_with_more_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(size=20), rng.normal(size=2000)
    assert vitviz.bootstrap_ci(small, seed=1) == vitviz.bootstrap_ci(small, seed=1)
    lo, hi = vitviz.bootstrap_ci(small)
    assert lo < small.mean() < hi
    lo2, hi2 = vitviz.bootstrap_ci(large)
    assert hi2 - lo2 < (hi - lo) / 3
    with pytest.raises(InputError, match="ci=1.5"):
        vitviz.bootstrap_ci(small, ci=1.5)


def test_bad_arguments_name_the_value():
    model = tiny_timm_vit()
    x = torch.randn(1, 3, 32, 48)
    with pytest.raises(InputError, match="steps=0.3"):
        vitviz.faithfulness(model, x, ["random"], steps=0.3, progress=False)
    with pytest.raises(InputError, match="'lime'"):
        vitviz.faithfulness(model, x, ["lime"], progress=False)
    with pytest.raises(InputError, match="modes"):
        vitviz.faithfulness(model, x, ["random"], modes=["sideways"], progress=False)


def test_plot_faithfulness(tmp_path):
    import matplotlib

    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    df = vitviz.faithfulness(model, x, ["random", "rollout"], steps=0.5, progress=False)
    fig = vitviz.plot_faithfulness_grid(df)
    assert len(fig.axes) == 4
    assert [a.get_ylabel() for a in fig.axes] == ["Target-class accuracy [%]"] * 2 + ["Target-class probability"] * 2
    # accuracies drawn in percent (the table keeps fractions), probabilities as they are
    for ax, mode, scale in zip(fig.axes, ("positive", "negative", "deletion", "insertion"), (100, 100, 1, 1)):
        want = df[df["mode"] == mode].groupby(["method", "removed"])["score"].mean() * scale
        drawn = [line.get_ydata() for line in ax.lines if len(line.get_xdata()) == want.loc["random"].size]
        assert any(np.allclose(y, want.loc["random"].to_numpy()) for y in drawn), (mode, want, drawn)
        assert any(np.allclose(y, want.loc["rollout"].to_numpy()) for y in drawn), mode
        assert ax.get_ylim() == ((0, 105) if scale == 100 else (0, 1.05))
    assert df["score"].between(0, 1).all()  # the table: fractions
    assert fig.axes[3].get_xlabel() == "Patches inserted [fraction]\n(the others dropped)"
    labels = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert labels == ["random", "rollout"]
    fig.savefig(tmp_path / "curves.png")
    _, ax = matplotlib.pyplot.subplots()
    assert vitviz.plot_faithfulness(df, ax=ax, mode="deletion") is ax
    with pytest.raises(InputError, match="pass mode="):
        vitviz.plot_faithfulness(df, ax=ax)
    with pytest.raises(InputError, match="pass mode="):
        vitviz.plot_faithfulness(df)  # never a Figure: one mode, one Axes
    alone = vitviz.plot_faithfulness(df[df["mode"] == "insertion"])
    assert alone.get_xlabel() == "Patches inserted [fraction]\n(the others dropped)"
    filled = df.assign(removal="mean")  # the label names how the patches not yet inserted are removed
    assert vitviz.plot_faithfulness(filled, mode="insertion").get_xlabel().endswith("(the others mean-filled)")
    assert vitviz.plot_faithfulness(filled, mode="deletion").get_xlabel().endswith("(mean fill)")
    with pytest.raises(InputError, match="image_offset"):  # a repeated run would count its images twice
        vitviz.plot_faithfulness_grid(pd.concat([df, df]))
    mixed = pd.concat([df, df.assign(removal="mean", image=df["image"] + 3)])
    with pytest.raises(InputError, match="mixes removals"):
        vitviz.plot_faithfulness_grid(mixed)
    maps = {m: vitviz.explain(model, x, m) for m in ("rollout", "random")}
    fig = vitviz.plot_explanations_grid(model, x, maps, labels=["a", "b", "c"])
    assert [a.get_title() for a in fig.axes[:3]] == ["Input", "rollout", "random"]
    assert fig.axes[-1].get_ylabel() == "Relevance (relative to max)"


def test_signed_explanations_grid_keeps_the_negative_evidence():
    """AttnLRP is signed: the default grid clips its negative values (and overlays the rest on the image); with
    ``signed=True`` each map is drawn alone over [-1, 1] (divided by its largest absolute value, the sign kept) on a
    diverging scale, token maps and pixel maps alike."""
    import matplotlib.pyplot as plt

    from vitviz.plot.attention import upsample_maps

    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    maps = {"tokens": vitviz.attnlrp(model, x), "pixels": vitviz.attnlrp(model, x, read_at="pixels")}
    assert all((m < 0).any() for m in maps.values())
    fig = vitviz.plot_explanations_grid(model, x, maps, signed=True)
    try:
        assert fig.axes[-1].get_ylabel() == "Relevance (relative to max |R|)"
        heat = [a for a in fig.axes[:-1] if a.get_title() in ("tokens", "pixels")]
        for a in heat:
            (im,) = a.get_images()  # the map alone, no image under it
            data = im.get_array()
            assert im.get_cmap().name == "RdBu_r" and im.get_clim() == (-1, 1)
            assert data.min() < 0 and abs(abs(data).max() - 1) < 1e-6
        got = fig.axes[2].get_images()[0].get_array()
        want = upsample_maps(maps["pixels"][:1], tuple(x.shape[-2:]), None)[0]
        np.testing.assert_allclose(got, want / np.abs(want).max(), rtol=1e-5, atol=1e-7)
    finally:
        plt.close(fig)
    clipped = vitviz.plot_explanations_grid(model, x, maps)
    try:
        overlay = clipped.axes[1].get_images()
        assert len(overlay) == 2 and overlay[1].get_array().min() >= 0  # the image, then the clipped map over it
    finally:
        plt.close(clipped)


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_04_runs_headless(run_notebook, tiny_folder, tmp_path):
    out_dir = tmp_path / "figs"
    nb, text, images = run_notebook("04_faithfulness.ipynb", data_dir=str(tiny_folder / "test"), n_images=10,
                                   n_show=2, n_sanity=2, batch_size=10, n_boot=50, out_dir=str(out_dir))
    import vitviz
    from vitviz.analysis.faithfulness import default_methods

    methods = len(default_methods(vitviz.load_model("cifar10-vit"))) + 3  # and the three library baselines
    assert f"10 images x {methods} methods" in text and "tokens dropped" in text
    assert f"2 images x {methods} methods" in text  # the sanity checks
    assert "indistinguishable from it" in text and "believe:" in text and "cosine similarity to the reference" in text
    # the maps side by side, the signed ones with their sign, the curves, the sanity curves, the headless maps
    assert len(images) == 5
    tables = "".join("".join(o.get("data", {}).get("text/plain", "")) for c in nb.cells for o in c.get("outputs", []))
    assert "negative share of |R|" in tables and "attnlrp" in tables  # the share of each signed method's map
    for stem in ("explanations_side_by_side", "explanations_signed", "faithfulness_curves", "sanity_checks_cascading",
                 "headless_target_callable"):
        assert (out_dir / f"{stem}.png").exists()


def _notebook_04_setup(data_dir, monkeypatch) -> dict:
    """Run notebook 04's set-up cell (the one after its parameters) on ``data_dir``, with a tiny model for the
    shipped one; return its namespace."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "04_faithfulness.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    start = next(i for i, c in enumerate(code) if "parameters" in c["metadata"].get("tags", []))
    monkeypatch.setattr(vitviz, "load_model", lambda name, checkpoint=None: tiny_timm_vit(img_size=32, num_classes=10))
    namespace: dict = {}
    exec("".join(code[start]["source"]), namespace)
    namespace.update(data_dir=str(data_dir), n_images=4)
    exec("".join(code[start + 1]["source"]), namespace)
    return namespace


def test_notebook_04_labels_follow_the_class_folders_and_a_flat_folder_has_none(tmp_path, monkeypatch):
    """The report hands notebook 04 your images as ``data_dir``: a flat folder failed in its set-up cell
    (ValueError: '0000' is not in list), and a hidden folder beside the classes (``.ipynb_checkpoints``) shifted
    every label by one, so accuracy was scored against the wrong class without a word."""
    from PIL import Image

    tree, flat = tmp_path / "tree", tmp_path / "flat"
    for name in ("cat", "dog"):
        (tree / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (32, 32), (100 * i, 50, 200)).save(tree / name / f"{i:04d}.png")
    (tree / ".ipynb_checkpoints").mkdir()
    (tree / "empty").mkdir()  # no images: no class (ImageFolder would refuse it)
    ns = _notebook_04_setup(tree, monkeypatch)
    assert ns["class_names"] == ["cat", "dog"]
    assert ns["labels"] == [["cat", "dog"].index(label) for label in ns["images"].labels] == [0, 1, 0, 1]
    flat.mkdir()
    for i in range(3):
        Image.new("RGB", (32, 32), (80 * i, 50, 200)).save(flat / f"{i:04d}.png")
    ns = _notebook_04_setup(flat, monkeypatch)
    assert ns["labels"] is None and ns["class_names"] == []  # scored against each image's own prediction


# ----------------------------------------------------------------------------------------------------- whole patches
_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # NumPy 2 renamed trapz
STEPS = np.linspace(0, 1, 11)  # the nominal steps of steps=0.1, as faithfulness writes them


def grid_8x8():
    """An 8x8 grid of 64 patches, where the nominal steps of 0.1 are not whole patches (6.4 at 0.1)."""
    torch.manual_seed(0)
    return tiny_timm_vit(img_size=64)


def test_removed_is_the_fraction_of_patches_actually_removed(monkeypatch):
    from vitviz.analysis import faithfulness as fa

    counted = []

    class Counting(fa.Perturbed):
        def scores(self, sets):
            counted.extend(removed.sum(dim=1).tolist() for removed in sets)  # patches removed per image
            return super().scores(sets)

    monkeypatch.setattr(fa, "Perturbed", Counting)
    modes = ["positive", "negative", "deletion", "insertion"]
    df = vitviz.faithfulness(grid_8x8(), torch.randn(2, 3, 64, 64), ["random"], modes=modes, steps=0.1,
                             progress=False)
    want = np.floor(df["fraction"].to_numpy() * 64 + 0.5) / 64
    np.testing.assert_array_equal(df["removed"].to_numpy(), want)
    assert df.loc[df["fraction"] == 0.1, "removed"].unique().tolist() == [6 / 64]  # 9.4%, not 10%
    # the masks the model saw, one call per (step, mode) in that order: insertion counts the patches present
    for (f, mode), n in zip([(f, m) for f in STEPS for m in modes], counted):
        got = df[(df["fraction"] == f) & (df["mode"] == mode)].sort_values("image")["removed"].to_numpy()
        shown = [64 - c for c in n] if mode == "insertion" else n
        np.testing.assert_array_equal(got * 64, shown)



def test_halves_round_up_also_where_the_float_fraction_falls_short(monkeypatch):
    """``k = round(f * P)``, halves up, computed exactly: on a 3x5 grid with ``steps=1/6`` the step ``f = 5/6`` is
    12.5 patches, so 13 are removed (``5/6 * 15 + 0.5`` in floats is just below 13 and floors to 12)."""
    from fractions import Fraction

    from vitviz.analysis import faithfulness as fa

    counted = []

    class Counting(fa.Perturbed):
        def scores(self, sets):
            counted.extend(removed.sum(dim=1).tolist() for removed in sets)
            return super().scores(sets)

    monkeypatch.setattr(fa, "Perturbed", Counting)
    model = tiny_timm_vit(img_size=(24, 40))  # a 3x5 grid, P = 15
    modes = ["deletion", "insertion"]
    df = vitviz.faithfulness(model, torch.randn(2, 3, 24, 40), ["random"], modes=modes, steps=1 / 6,
                             progress=False)
    p = 15
    want = [int(Fraction(i * p, 6) + Fraction(1, 2)) for i in range(7)]  # exact floor(i P / 6 + 1/2)
    assert want[5] == 13
    for i, f in enumerate(sorted(df["fraction"].unique())):
        rows = df[df["fraction"] == f]
        assert set(rows["removed"]) == {want[i] / p}
    for (i, mode), n in zip([(i, m) for i in range(7) for m in modes], counted):
        assert n == ([p - want[i]] * 2 if mode == "insertion" else [want[i]] * 2)

def test_auc_integrates_over_the_fraction_actually_removed():
    model = grid_8x8()
    df = vitviz.faithfulness(model, torch.randn(5, 3, 64, 64), ["random", "rollout"], steps=0.1, progress=False)
    for upto in (1.0, 0.9):
        auc = vitviz.faithfulness_auc(df, upto=upto).set_index(["method", "mode"])["auc"]
        nominal = vitviz.faithfulness_auc(df.drop(columns="removed"), upto=upto).set_index(["method", "mode"])["auc"]
        for (method, mode), g in df[df["fraction"] <= upto + 1e-9].groupby(["method", "mode"]):
            per_image = [_trapezoid(c["score"], c["removed"]) for _, c in g.sort_values("fraction").groupby("image")]
            assert auc[(method, mode)] == pytest.approx(np.mean(per_image), rel=0, abs=1e-12)
        assert (auc - nominal).abs().max() > 1e-4  # the nominal axis gives other numbers
    paired = vitviz.compare_methods(df, baseline="rollout").set_index("mode")

    def by_hand(method, mode):
        c = df[(df["method"] == method) & (df["mode"] == mode)].sort_values(["image", "fraction"])
        return np.array([_trapezoid(g["score"], g["removed"]) for _, g in c.groupby("image")])

    for mode in ("positive", "deletion", "insertion"):
        assert paired.loc[mode, "diff"] == pytest.approx((by_hand("random", mode) - by_hand("rollout", mode)).mean(),
                                                         rel=0, abs=1e-12)


def test_plot_draws_each_step_at_the_fraction_removed():
    model = grid_8x8()
    df = vitviz.faithfulness(model, torch.randn(3, 3, 64, 64), ["random", "rollout"], steps=0.1, progress=False)
    removed = np.floor(STEPS * 64 + 0.5) / 64
    for mode in ("positive", "insertion"):
        ax = vitviz.plot_faithfulness(df, mode=mode)
        lines = [line for line in ax.get_lines() if len(line.get_xdata()) == len(STEPS)]
        assert len(lines) == 2  # one mean curve per method
        for line in lines:
            np.testing.assert_array_equal(np.asarray(line.get_xdata(), dtype=np.float64), removed)
        verb, how = ("inserted", "the others") if mode == "insertion" else ("removed", "tokens")
        assert ax.get_xlabel() == f"Patches {verb} [fraction]\n({how} dropped)"
    old = vitviz.plot_faithfulness(df.drop(columns="removed"), mode="deletion")  # an older vitviz's frame
    lines = [line for line in old.get_lines() if len(line.get_xdata()) == len(STEPS)]
    np.testing.assert_array_equal(np.asarray(lines[0].get_xdata(), dtype=np.float64), STEPS)
    assert old.get_xlabel() == "Patches removed [nominal fraction]\n(tokens dropped)"


def test_images_of_other_grids_are_each_integrated_over_their_own_removed_fractions():
    a = vitviz.faithfulness(grid_8x8(), torch.randn(3, 3, 64, 64), ["random"], modes=["deletion"], progress=False)
    b = vitviz.faithfulness(tiny_timm_vit(), torch.randn(2, 3, 32, 48), ["random"], modes=["deletion"],
                            image_offset=3, progress=False)  # 4x6: 2 of 24 patches at 0.1
    assert b.loc[b["fraction"] == 0.1, "removed"].unique().tolist() == [2 / 24]
    both = pd.concat([a, b], ignore_index=True)
    per_image = vitviz.analysis.faithfulness_stats.per_image_auc(both).set_index("image")["auc"]
    alone = pd.concat([vitviz.analysis.faithfulness_stats.per_image_auc(d) for d in (a, b)]).set_index("image")["auc"]
    pd.testing.assert_series_equal(per_image.sort_index(), alone.sort_index(), rtol=0, atol=1e-15)
    assert vitviz.faithfulness_auc(both)["n_images"].item() == 5
    with pytest.raises(InputError, match=r"mode='deletion': at the step fraction=0.1 the images of df removed from "
                                         r"0.08333 to 0.09375 .* draw each grid's images apart"):
        vitviz.plot_faithfulness(both)
    older = pd.concat([a, b.drop(columns="removed")], ignore_index=True)  # a frame of an older vitviz added
    with pytest.raises(InputError, match=r"22 rows without a 'removed' value .*df.drop\(columns='removed'\)"):
        vitviz.faithfulness_auc(older)
    with pytest.raises(InputError, match=r"rows without a 'removed' value .*df.drop\(columns='removed'\)"):
        vitviz.plot_faithfulness(older)
    assert len(vitviz.faithfulness_auc(older.drop(columns="removed"))) == 1  # all over the nominal steps


def test_the_readme_table_is_the_recorded_notebook_run():
    """README.md's and docs/explain.md's faithfulness tables (notebook 04, 1,000 images) quote the recorded run:
    each AUC is the area under that method's and mode's mean curve (bench/results/faithfulness_notebook04), and
    the method the README says to believe is the best on all four tests there."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rec = np.load(root / "bench/results/faithfulness_notebook04/faithfulness_curves.npz")
    methods = sorted(["attention", "rollout", "grad_rollout", "chefer", "attnlrp", "integrated_gradients",
                      "input_x_gradient", "gradcam", "random"])
    modes = ["deletion", "insertion", "negative", "positive"]  # the saved rows: methods, then modes, by name
    assert rec["curves"].shape == (len(methods) * len(modes), len(rec["removed"]))
    area = {(m, mode): float(_trapezoid(rec["curves"][i * len(modes) + j], rec["removed"]))
            for i, m in enumerate(methods) for j, mode in enumerate(modes)}
    columns = ["positive", "negative", "deletion", "insertion"]  # the tables' order
    for doc, heading in (("README.md", "## Which map should I believe?"),
                         ("docs/explain.md", "### Result on `cifar10-vit`, 1,000 CIFAR-10 test images")):
        text = (root / doc).read_text().split(heading, 1)[1].split("\n#", 1)[0]  # that section alone
        rows = {m: [float(v) for v in re.findall(r"(\d\.\d{3}) \[\d\.\d{3}, \d\.\d{3}\]", line)]
                for line in text.splitlines()
                for m in methods if re.match(rf"\| \**{m}\** \| \**\d\.\d{{3}} \[", line)}
        assert set(rows) == set(methods), (doc, sorted(rows))
        for m, values in rows.items():
            assert values == pytest.approx([area[(m, c)] for c in columns], abs=6e-4), (doc, m)
    best = {c: (min if c in ("positive", "deletion") else max)(methods, key=lambda m: area[(m, c)]) for c in columns}
    assert set(best.values()) == {"attnlrp"} and "believe AttnLRP" in (root / "README.md").read_text()
