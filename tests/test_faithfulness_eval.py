"""The evaluation without artefacts: ties, tidy frames, chunked runs, paired comparisons, inputs, map-kind checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.analysis import faithfulness as fa
from vitviz.errors import CheckpointError, InputError, UnsupportedModelError

_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # NumPy 2 renamed trapz



def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in one order (a run's row order follows its batches)."""
    return df.sort_values(["image", "method", "mode", "fraction"]).reset_index(drop=True)


def constant_maps(model, x, method, target=None, **_):
    """A map with every patch equally relevant (a saturated map's worst case)."""
    return torch.ones(len(x), *vitviz.inspect(model).grid_for_input(x))


def raster_scores(model, x, k):
    """Probability of the clean prediction with the first ``k`` patches in raster order dropped (timm by hand)."""
    with torch.no_grad():
        pred = model(x).argmax(-1)
        h = model._pos_embed(model.patch_embed(x))
        h = torch.cat([h[:, :1], h[:, 1 + k:]], dim=1)
        for blk in model.blocks:
            h = blk(model.norm_pre(h) if blk is model.blocks[0] else h)
        return model.forward_head(model.norm(h)).softmax(-1).gather(1, pred[:, None])[:, 0]


# ----------------------------------------------------------------------------------------------------- ties
def test_ties_are_not_broken_in_raster_order(monkeypatch):
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    monkeypatch.setattr(fa, "explain", constant_maps)
    df = vitviz.faithfulness(model, x, ["attention"], modes=["deletion"], steps=0.25, progress=False)
    got = df[df["fraction"] == 0.25].sort_values("image")["score"].to_numpy()
    raster = raster_scores(model, x, 6).numpy()
    assert not np.allclose(got, raster, atol=1e-6)  # raster order would reproduce these exactly


def test_tie_order_is_seeded_per_image_and_independent_of_batching(monkeypatch):
    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    monkeypatch.setattr(fa, "explain", constant_maps)
    run = dict(modes=["deletion", "insertion"], steps=0.25, progress=False)
    a = vitviz.faithfulness(model, x, ["attention"], batch_size=5, **run)
    b = vitviz.faithfulness(model, x, ["attention"], batch_size=2, **run)
    pd.testing.assert_frame_equal(tidy(a), tidy(b), atol=1e-6, rtol=0)
    again = vitviz.faithfulness(model, x, ["attention"], batch_size=5, **run)
    pd.testing.assert_frame_equal(a, again)
    other = vitviz.faithfulness(model, x, ["attention"], batch_size=5, seed=1, **run)
    assert not np.allclose(a["score"], other["score"])
    # a chunk run with the right offset gives its images exactly the rows of the whole run
    chunk = vitviz.faithfulness(model, x[3:], ["attention"], image_offset=3, **run)
    whole = a[a["image"] >= 3].reset_index(drop=True)
    pd.testing.assert_frame_equal(chunk.reset_index(drop=True), whole, atol=1e-6, rtol=0)


def test_rank_patches_orders_by_value_and_shuffles_only_ties():
    from vitviz.analysis.perturbation import rank_patches

    maps = torch.tensor([[[0.5, 1.0, 1.0], [0.2, 1.0, 0.5]]])  # (1, 2, 3): three patches tie at the top
    rank = rank_patches(maps, [0], seed=0)[0]
    assert sorted(rank[[1, 2, 4]].tolist()) == [0, 1, 2] and sorted(rank[[0, 5]].tolist()) == [3, 4]
    assert rank[3] == 5
    flat = torch.zeros(50, 1, 24)  # every patch ties: over 50 images the first removed patch varies
    first = rank_patches(flat, list(range(50))).argmin(dim=1)
    assert len(set(first.tolist())) > 10 and (first == 0).float().mean() < 0.2
    torch.testing.assert_close(rank_patches(flat[:3], [7, 8, 9]), rank_patches(flat[7:10], [7, 8, 9]))
    with pytest.raises(InputError, match="NaN"):
        rank_patches(torch.full((1, 2, 2), float("nan")), [0])


def test_ranks_on_host_are_rank_patches_ranks_read_once():
    """``ranks_on_host`` (what ``faithfulness`` ranks with): ``rank_patches``' ranks on the CPU, the maps'
    finiteness checked from the same copy; a NaN or infinite map is refused as ``rank_patches`` refuses it."""
    from vitviz.analysis.perturbation import rank_patches, ranks_on_host

    torch.manual_seed(0)
    maps = torch.randn(6, 3, 4).round(decimals=1)  # rounded: ties, shuffled by each image's id
    ids = [3, "a", 5, "b", 7, 9]
    host = ranks_on_host(maps, ids, seed=2)
    assert host.device.type == "cpu" and host.dtype == torch.long and host.shape == (6, 12)
    assert torch.equal(host, rank_patches(maps, ids, seed=2))
    for bad in (float("nan"), float("inf")):
        broken = maps.clone()
        broken[4, 1, 2] = bad
        with pytest.raises(InputError, match="NaN or infinite"):
            ranks_on_host(broken, ids)
    with pytest.raises(InputError, match="5 image ids for 6 maps"):
        ranks_on_host(maps, ids[:5])


# ----------------------------------------------------------------------------------------------------- tidy frames
def test_runs_over_chunks_concatenate_merge_and_count_every_image():
    model = tiny_timm_vit()
    x = torch.randn(8, 3, 32, 48)
    run = dict(modes=["deletion"], steps=0.5, progress=False)
    a = vitviz.faithfulness(model, x[:4], ["random", "rollout"], **run)
    b = vitviz.faithfulness(model, x[4:], ["random", "rollout"], image_offset=4, **run)
    assert all(np.isscalar(v) for v in a.attrs.values())
    both = pd.concat([a, b], ignore_index=True)
    assert sorted(both["image"].unique()) == list(range(8))
    merged = both.merge(both.groupby("image", as_index=False)["score"].mean(), on="image", suffixes=("", "_mean"))
    assert len(merged) == len(both)
    auc = vitviz.faithfulness_auc(both, n_boot=50)
    assert set(auc["n_images"]) == {8}
    whole = vitviz.faithfulness(model, x, ["random", "rollout"], **run)
    pd.testing.assert_frame_equal(auc, vitviz.faithfulness_auc(whole, n_boot=50), atol=1e-6, rtol=0)
    with pytest.raises(InputError, match=r"image_offset=.*image_ids="):
        vitviz.faithfulness_auc(pd.concat([a, a]))
    with pytest.raises(InputError, match="image_offset"):
        vitviz.compare_methods(pd.concat([a, a]), baseline="random")
    named = vitviz.faithfulness(model, x[:2], ["random"], image_ids=["cat.jpg", "dog.jpg"], **run)
    assert set(named["image"]) == {"cat.jpg", "dog.jpg"}


# ----------------------------------------------------------------------------------------------------- paired comparisons
def synthetic(per_image: dict[str, np.ndarray], mode: str = "deletion") -> pd.DataFrame:
    """Curves that are flat at each image's value, so the AUC over [0, 1] is that value."""
    rows = [{"image": i, "method": m, "mode": mode, "fraction": f, "score": v, "metric": "probability",
             "removal": "drop"} for m, vals in per_image.items() for i, v in enumerate(vals) for f in (0.0, 0.5, 1.0)]
    return pd.DataFrame(rows)


def test_paired_difference_separates_what_overlapping_intervals_do_not():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, 60)  # large between-image spread
    df = synthetic({"chefer": base, "lrp": base - 0.01 + rng.normal(0, 0.002, 60)})
    auc = vitviz.faithfulness_auc(df, n_boot=500).set_index("method")
    assert auc.loc["lrp", "ci_high"] > auc.loc["chefer", "ci_low"]  # the marginal intervals overlap ...
    cmp = vitviz.compare_methods(df, baseline="chefer", n_boot=500).iloc[0]
    assert cmp["ci_high"] < 0 and cmp["verdict"] == "better"  # ... the paired difference is clearly below zero
    flipped = vitviz.compare_methods(synthetic({"chefer": base, "lrp": base - 0.01}, "insertion"), n_boot=200)
    assert flipped.iloc[0]["verdict"] == "worse"  # insertion: higher is better
    same = vitviz.compare_methods(synthetic({"chefer": base, "lrp": base + rng.normal(0, 0.01, 60)}), n_boot=200)
    assert same.iloc[0]["verdict"] == "indistinguishable"


def test_compare_methods_equals_a_hand_written_paired_bootstrap():
    model = tiny_timm_vit()
    x = torch.randn(6, 3, 32, 48)
    df = vitviz.faithfulness(model, x, ["chefer", "rollout", "random"], steps=0.25, progress=False)
    got = vitviz.compare_methods(df, baseline="chefer", interval="bootstrap", n_boot=300, seed=3)
    assert len(got) == 2 * 4 and set(got["baseline"]) == {"chefer"}
    for _, row in got.iterrows():
        def auc(method, row=row):
            sub = df[(df["method"] == method) & (df["mode"] == row["mode"])]
            curves = sub.pivot(index="image", columns="fraction", values="score").sort_index()
            return _trapezoid(curves.to_numpy(), curves.columns.to_numpy(), axis=1)

        d = auc(row["method"]) - auc("chefer")
        rng = np.random.default_rng(3)
        means = d[rng.integers(0, len(d), size=(300, len(d)))].mean(axis=1)
        lo, hi = np.quantile(means, [0.025, 0.975])
        assert row["diff"] == pytest.approx(d.mean()) and row["n_images"] == 6
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((lo, hi))
    with pytest.raises(InputError, match="baseline='attnlrp' is not among"):
        vitviz.compare_methods(df, baseline="attnlrp")


# ----------------------------------------------------------------------------------------------------- inputs
def test_callables_and_precomputed_maps_equal_the_named_method():
    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    run = dict(modes=["deletion", "positive"], steps=0.25, progress=False, batch_size=2)
    named = vitviz.faithfulness(model, x, ["chefer"], **run)
    maps = vitviz.explain(model, x, "chefer")
    calls = []

    def mine(m, images, target):
        calls.append(target)
        return vitviz.explain(m, images, "chefer", target)

    by_callable = vitviz.faithfulness(model, x, [mine], **run)
    assert set(by_callable["method"]) == {"mine"} and all(isinstance(t, torch.Tensor) for t in calls)
    given = vitviz.faithfulness(model, x, {"chefer": maps}, **run)
    for other in (by_callable, given):
        np.testing.assert_allclose(other["score"], named["score"], atol=1e-6)
    with pytest.raises(InputError, match=r"shape \(2, 4, 6\).*\(3, gh, gw\)"):
        vitviz.faithfulness(model, x, {"chefer": maps[:2]}, **run)
    with pytest.raises(InputError, match=r"must return \(2, 4, 6\)"):
        vitviz.faithfulness(model, x, {"bad": lambda m, i, t: torch.ones(len(i), 24)}, **run)


def test_datasets_give_the_rows_of_the_batch_and_resume_from_out(tmp_path, monkeypatch):
    from torch.utils.data import DataLoader, TensorDataset

    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    labels = torch.tensor([0, 1, 2, 3, 4])
    run = dict(methods=["random", "rollout"], modes=["deletion", "positive"], steps=0.5, progress=False)
    want = vitviz.faithfulness(model, x, labels=labels, **run)
    for source in (TensorDataset(x, labels), DataLoader(TensorDataset(x, labels), batch_size=2)):
        got = vitviz.faithfulness(model, source, labels="dataset", batch_size=3, **run)
        pd.testing.assert_frame_equal(tidy(got), tidy(want), atol=1e-6, rtol=0)
    out = tmp_path / "curves.csv"
    first = vitviz.faithfulness(model, x[:2], out=out, **run)  # an interrupted run: two images written
    assert len(pd.read_csv(out)) == len(first)
    resumed = vitviz.faithfulness(model, x, out=out, batch_size=2, **run)
    plain = vitviz.faithfulness(model, x, **run)
    pd.testing.assert_frame_equal(tidy(resumed), tidy(plain), atol=1e-6, rtol=0)
    monkeypatch.setattr(fa, "explain", lambda *a, **k: pytest.fail("a finished run recomputed maps"))
    pd.testing.assert_frame_equal(vitviz.faithfulness(model, x, out=out, **run), resumed, atol=1e-9, rtol=0)
    with pytest.raises(CheckpointError, match="another run"):
        vitviz.faithfulness(model, x, out=out, **{**run, "steps": 0.25})


def test_folder_input(tiny_folder):
    model = tiny_timm_vit(img_size=32)
    df = vitviz.faithfulness(model, tiny_folder / "test", ["random"], modes=["deletion"], steps=0.5, progress=False,
                             batch_size=40)
    assert df["image"].nunique() == 100 and set(df["removal"]) == {"drop"}


def test_default_methods_are_the_cheap_ones():
    assert "flow" not in fa.DEFAULT_METHODS
    assert {"attention", "rollout", "grad_rollout", "chefer", "random"} <= set(fa.DEFAULT_METHODS)
    assert "~11 s" in fa.faithfulness.__doc__ or "11 s per image" in fa.faithfulness.__doc__


# ----------------------------------------------------------------------------------------------------- map kinds
def tiny_cait():
    import timm

    return timm.create_model("cait_xxs24_224", pretrained=False, img_size=64, depth=2).eval()


@pytest.mark.parametrize("reduction", ["mean_attention_distance", "attention_statistics"])
def test_every_input_path_refuses_cait_maps(reduction, tmp_path):
    from PIL import Image
    from torch.utils.data import DataLoader, TensorDataset

    model = tiny_cait()
    x = torch.randn(2, 3, 64, 64)
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "a.png")
    fn = getattr(vitviz, reduction) if hasattr(vitviz, reduction) else None
    if fn is None:
        from vitviz.analysis.attention_stats import attention_statistics as fn
    for source in (x, TensorDataset(x), DataLoader(TensorDataset(x), batch_size=1), tmp_path):
        with pytest.raises(UnsupportedModelError, match=rf"{reduction}.*talking-heads"):
            fn(model, source)


@pytest.mark.gpu
def test_autocast_on_cuda_stays_close_to_float32():
    model = tiny_timm_vit().cuda()
    x = torch.randn(4, 3, 32, 48, device="cuda")
    run = dict(methods=["random"], modes=["deletion"], steps=0.25, progress=False)  # same maps: only the forwards differ
    exact = vitviz.faithfulness(model, x, **run)
    fast = vitviz.faithfulness(model, x, autocast=True, **run)
    assert (fast["removal"] == exact["removal"]).all()
    np.testing.assert_allclose(fast["score"], exact["score"], atol=0.02)


def test_default_methods_include_attnlrp_only_where_the_family_has_rules():
    """``faithfulness`` without ``methods`` runs the cheap methods the model supports: a timm ViT gets attnlrp, a
    hand-written ViT (no AttnLRP rules) the others, instead of an error from attnlrp."""
    from conftest import tiny_timm_vit
    from tutorial_vit import TutorialViT

    from vitviz.analysis.faithfulness import DEFAULT_METHODS, default_methods

    timm_vit = tiny_timm_vit().eval()
    assert default_methods(timm_vit) == DEFAULT_METHODS and "attnlrp" in DEFAULT_METHODS
    tutorial = TutorialViT().eval()
    assert default_methods(tutorial) == tuple(m for m in DEFAULT_METHODS if m != "attnlrp")
    df = vitviz.faithfulness(tutorial, torch.randn(2, 3, 32, 32), steps=0.5, modes=["deletion"], progress=False)
    assert set(df["method"]) == set(DEFAULT_METHODS) - {"attnlrp"}
    # the probe left the model as it was
    assert not any(m._forward_hooks for m in timm_vit.modules())
