"""Few-shot linear and k-NN probes: the closed form against numpy.linalg, LOO against brute force, k-NN against a
loop, features against the model's own forward, and the bad inputs."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

from tests.conftest import tiny_timm_vit
from vitviz.analysis.probes import (
    L2_GRID,
    RidgeFit,
    fewshot_draws,
    knn_accuracy,
    linear_fewshot_accuracy,
    pm1_targets,
    select_l2,
    standardize,
)
from vitviz.errors import CheckpointError, InputError, LayerSelectError


def _blobs(n_per_class, k=4, d=6, seed=0, spread=1.5):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, spread, (k, d))
    y = np.repeat(np.arange(k), n_per_class)
    return centres[y] + rng.normal(0, 1, (len(y), d)), y


def _numpy_ridge(x, y, l2, k):
    """Independent reference: standardise by hand, solve the augmented normal equations with an unpenalised bias."""
    mu, sd = x.mean(0), x.std(0) + 1e-5
    a = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    t = np.full((len(y), k), -1.0)
    t[np.arange(len(y)), y] = 1.0
    pen = l2 * np.eye(a.shape[1])
    pen[-1, -1] = 0.0
    coef = np.linalg.solve(a.T @ a + pen, a.T @ t)
    return coef, mu, sd


@pytest.mark.parametrize("n_per_class,d", [(3, 20), (30, 6)])  # dual (n < D) and primal (n > D) branches
def test_closed_form_equals_numpy_linalg(n_per_class, d):
    x, y = _blobs(n_per_class, d=d)
    xt, yt = _blobs(50, d=d, seed=1)
    for l2 in (2.0 ** -4, 1.0, 16.0):
        coef, mu, sd = _numpy_ridge(x, y, l2, 4)
        fit = RidgeFit(standardize(x)[0], pm1_targets(y, 4))
        w, b = fit.weights(l2)
        np.testing.assert_allclose(w, coef[:-1], rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(b[0], coef[-1], rtol=1e-7, atol=1e-9)
        ref_pred = (np.hstack([(xt - mu) / sd, np.ones((len(xt), 1))]) @ coef).argmax(1)
        acc, used = linear_fewshot_accuracy(x, y, xt, yt, l2_reg=l2)
        assert used == l2
        assert acc == pytest.approx(100 * (ref_pred == yt).mean())


def test_leave_one_out_error_equals_brute_force_refits():
    x, y = _blobs(4, d=10)
    xs = standardize(x)[0]
    t = pm1_targets(y, 4)
    fit = RidgeFit(xs, t)
    for l2 in (2.0 ** -6, 0.5, 64.0):
        errs = []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            a = np.hstack([xs[keep], np.ones((keep.sum(), 1))])
            pen = l2 * np.eye(a.shape[1])
            pen[-1, -1] = 0
            coef = np.linalg.solve(a.T @ a + pen, a.T @ t[keep])
            errs.append(((np.append(xs[i], 1.0) @ coef - t[i]) ** 2).mean())
        assert fit.loo_squared_error(l2) == pytest.approx(np.mean(errs), rel=1e-6)
    brute = {l2: fit.loo_squared_error(l2) for l2 in L2_GRID}
    assert select_l2(fit) == min(brute, key=lambda v: (brute[v], -v))


def _knn_loop(xtr, ytr, xte, k, temp, ncls):
    preds = []
    for q in xte:
        sims = [(float(q @ r / np.linalg.norm(q) / np.linalg.norm(r)), int(c)) for r, c in zip(xtr, ytr)]
        sims.sort(key=lambda s: -s[0])
        votes = [0.0] * ncls
        for s, c in sims[:k]:
            votes[c] += np.exp(s / temp)
        preds.append(int(np.argmax(votes)))
    return np.array(preds)


@pytest.mark.parametrize("k,temp", [(20, 0.07), (3, 1.0)])
def test_knn_equals_a_direct_loop(k, temp):
    xtr, ytr = _blobs(15, d=5, spread=0.8)
    xte, yte = _blobs(10, d=5, seed=3, spread=0.8)
    ref = _knn_loop(xtr, ytr, xte, k, temp, 4)
    assert knn_accuracy(xtr, ytr, xte, yte, k=k, temperature=temp, chunk=7) == pytest.approx(100 * (ref == yte).mean())


def test_draws_are_nested_balanced_and_refuse_too_many_shots():
    y = np.repeat(np.arange(3), [5, 7, 9])
    d = fewshot_draws(y, (1, 2, 5), seeds=(0, 1))
    for seed in (0, 1):
        assert set(d[(2, seed)]) <= set(d[(5, seed)])
        assert np.bincount(y[d[(5, seed)]]).tolist() == [5, 5, 5]
    assert not np.array_equal(d[(5, 0)], d[(5, 1)])
    with pytest.raises(InputError, match="shots=6 exceeds.*0: 5"):
        fewshot_draws(y, (6,), seeds=(0,))
    with pytest.raises(InputError, match="positive"):
        fewshot_draws(y, (0,), seeds=(0,))
    with pytest.raises(InputError, match="seeds"):
        fewshot_draws(y, (1,), seeds=())
    with pytest.raises(InputError, match=r"shots='\[1, 5\]' is a string.*shots=\(1, 5\)"):
        fewshot_draws(y, "[1, 5]", seeds=(0,))  # papermill's -p passes a list as its text


def test_bad_feature_inputs():
    x, y = _blobs(3)
    with pytest.raises(InputError, match="dimensions"):
        linear_fewshot_accuracy(x, y, x[:, :3], y)
    with pytest.raises(InputError, match="l2_reg"):
        linear_fewshot_accuracy(x, y, x, y, l2_reg=0)
    with pytest.raises(InputError, match="NaN"):
        linear_fewshot_accuracy(np.full_like(x, np.nan), y, x, y)
    with pytest.raises(InputError, match="k="):
        knn_accuracy(x, y, x, y, k=len(x) + 1)
    for bad in (float("inf"), "1", True, float("nan")):
        with pytest.raises(InputError, match=r"l2_reg=.* must be a finite positive number"):
            linear_fewshot_accuracy(x, y, x, y, l2_reg=bad)


def test_labels_that_are_not_class_indices_are_refused():
    """A fraction cast to an int merges classes (0.2 and 0.7 both class 0: a one-class problem read as 100%), and
    a negative label indexes the classes from the end: both refused, in the probes and the draws."""
    x, y = _blobs(3)
    for call in (linear_fewshot_accuracy, knn_accuracy):
        with pytest.raises(InputError, match=r"labels must be class indices \(ints >= 0\), got dtype float64"):
            call(x, y + 0.2, x, y)
        with pytest.raises(InputError, match=r"labels must be class indices \(ints >= 0\), got -1"):
            call(x, y - 1, x, y)
    assert linear_fewshot_accuracy(x, y.astype(np.float64), x, y) == linear_fewshot_accuracy(x, y, x, y)
    with pytest.raises(InputError, match=r"fewshot_draws: labels must be class indices.*got dtype float64"):
        fewshot_draws(y * 0.5, (1,), (0,))


def test_a_model_probe_refuses_labels_that_are_not_class_indices():
    from vitviz.analysis.representations import knn_probe, linear_fewshot

    model = tiny_timm_vit()
    (xtr, ytr), (xte, yte) = _data(2, classes=2), _data(1, classes=2, seed=1)
    for labels, got in ((ytr * 0.5 + 0.2, r"(dtype float32|torch.float32 values such as 0.2)"), (ytr - 3, "-3")):
        match = rf"labels.* must be class indices \(ints >= 0\), got {got}"
        with pytest.raises(InputError, match=match):
            linear_fewshot(model, (xtr, labels), (xte, yte), shots=(1,), seeds=(0,), l2_reg=1.0)
        with pytest.raises(InputError, match=match):
            knn_probe(model, (xtr, labels), (xte, yte), k=1)


def test_a_dataset_whose_labels_are_names_is_refused_naming_labels_and_the_fix():
    """A Dataset yielding (image, class name): its batches' targets are a list of strings, which reached
    torch.as_tensor and failed as a bare "ValueError: too many dimensions 'str'"; the error names the labels, the
    values and the fix, as for other labels that are not class indices."""
    from torch.utils.data import DataLoader, Dataset

    from vitviz.analysis.representations import linear_fewshot
    from vitviz.core.features import extract_features

    class Named(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.randn(3, 32, 48), ("cat", "dog")[i % 2]

    model = tiny_timm_vit()
    match = r"labels: .*'cat'.*not class indices.*classes\.index"
    for source in (Named(), DataLoader(Named(), batch_size=2)):
        with pytest.raises(InputError, match=match):
            extract_features(model, source)
    with pytest.raises(InputError, match=match):
        linear_fewshot(model, Named(), _data(1, classes=2), shots=(1,), seeds=(0,))


def _data(n_per_class, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(classes).repeat_interleave(n_per_class)
    x = torch.randn(len(y), 3, 32, 48, generator=g) + y[:, None, None, None] * 0.3
    return x, y


def test_linear_fewshot_on_a_model_equals_numpy_on_its_own_forward():
    from vitviz.analysis.representations import linear_fewshot

    model = tiny_timm_vit()
    train, test = _data(6), _data(4, seed=1)
    df = linear_fewshot(model, train, test, shots=(1, 3), seeds=(0, 1), l2_reg=0.5, batch_size=7)
    assert len(df) == 4 and set(df.columns) >= {"model", "layer", "shots", "seed", "l2_reg", "accuracy"}
    with torch.no_grad():
        ftr = model.forward_head(model.forward_features(train[0]), pre_logits=True).numpy()
        fte = model.forward_head(model.forward_features(test[0]), pre_logits=True).numpy()
        # block 0's class token, by running the blocks by hand
        x = model._pos_embed(model.patch_embed(train[0]))
        b0_tr = model.blocks[0](model.norm_pre(x))[:, 0].numpy()
        x = model._pos_embed(model.patch_embed(test[0]))
        b0_te = model.blocks[0](model.norm_pre(x))[:, 0].numpy()
    draws = fewshot_draws(train[1].numpy(), (1, 3), (0, 1))
    for row in df.itertuples():
        idx = draws[(row.shots, row.seed)]
        coef, mu, sd = _numpy_ridge(ftr[idx], train[1].numpy()[idx], 0.5, 5)
        pred = (np.hstack([(fte - mu) / sd, np.ones((len(fte), 1))]) @ coef).argmax(1)
        assert row.accuracy == pytest.approx(100 * (pred == test[1].numpy()).mean())
    d0 = linear_fewshot(model, train, test, shots=(3,), seeds=(0,), l2_reg=0.5, layer=0)
    idx = draws[(3, 0)]
    coef, mu, sd = _numpy_ridge(b0_tr[idx], train[1].numpy()[idx], 0.5, 5)
    pred = (np.hstack([(b0_te - mu) / sd, np.ones((len(b0_te), 1))]) @ coef).argmax(1)
    assert d0.accuracy.item() == pytest.approx(100 * (pred == test[1].numpy()).mean())
    assert d0.layer.item() == "block0" and d0.depth.item() == 1


def test_layer_probes_read_every_block_in_one_pass_and_match_single_layers():
    from vitviz.analysis.representations import layer_probes, linear_fewshot

    model = tiny_timm_vit(depth=3)
    train, test = _data(4), _data(3, seed=1)
    calls = []
    model.patch_embed.register_forward_hook(lambda *a: calls.append(1))
    df = layer_probes(model, train, test, shots=(2,), seeds=(0, 1), batch_size=100)
    assert len(calls) == 2  # one batch of the drawn training images, one of the test images
    assert sorted(df.layer.unique()) == ["block0", "block1", "block2", "pre_logits"]
    assert df[df.layer == "pre_logits"].depth.unique().tolist() == [4]
    for i in range(3):
        single = linear_fewshot(model, train, test, shots=(2,), seeds=(0, 1), layer=i)
        np.testing.assert_allclose(df[df.layer == f"block{i}"].accuracy.to_numpy(), single.accuracy.to_numpy())


def test_gap_models_pool_the_patch_tokens_and_pre_logits_match_timm():
    from vitviz.core.features import extract_features

    model = tiny_timm_vit(class_token=False, global_pool="avg", fc_norm=False)
    x, y = _data(2)
    f = extract_features(model, (x, y), layers=[1])
    with torch.no_grad():
        tokens = model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(x))))
        torch.testing.assert_close(f.feats[1], tokens.mean(1))
        torch.testing.assert_close(f.feats["pre_logits"], model.norm(tokens).mean(1))


def test_feature_cache_is_reused_without_running_the_model(tmp_path):
    from vitviz.core.features import extract_features

    model = tiny_timm_vit()
    x, y = _data(3)
    first = extract_features(model, (x, y), layers="all", checkpoint=tmp_path / "f.pt", batch_size=4)
    model.patch_embed.register_forward_hook(lambda *a: (_ for _ in ()).throw(AssertionError("model ran")))
    again = extract_features(model, (x, y), layers="all", checkpoint=tmp_path / "f.pt", batch_size=4)
    for key in first.feats:
        torch.testing.assert_close(first.feats[key], again.feats[key])
    assert torch.equal(first.labels, y)


def test_a_feature_cache_serves_each_model_and_dataset_its_own_features(tmp_path):
    """The cache is keyed by the weights and the images: another model of the same class and name, or another
    test set of the same size, is computed afresh, never answered from the first model's file."""
    from vitviz.analysis.representations import layer_probes, linear_fewshot

    torch.manual_seed(0)
    a, b = tiny_timm_vit(), tiny_timm_vit()
    train, test, other = _data(2), _data(4, seed=1), _data(4, seed=2)
    kw = {"shots": (1, 2), "seeds": (0, 1), "name": "m"}  # one name for both: the name is not the identity
    want = {(m, t): linear_fewshot(mm, train, tt, **kw).accuracy.tolist()
            for m, mm in (("a", a), ("b", b)) for t, tt in (("test", test), ("other", other))}
    assert want[("a", "test")] != want[("b", "test")] or want[("a", "other")] != want[("b", "other")]
    for (m, t), acc in want.items():
        got = linear_fewshot({"a": a, "b": b}[m], train, {"test": test, "other": other}[t], cache=tmp_path, **kw)
        assert got.accuracy.tolist() == acc, (m, t)
    # the pre-logits cache and a per-layer run share one folder without colliding
    assert len(layer_probes(a, train, test, shots=(1,), seeds=(0,), name="m", cache=tmp_path)) > 0


def test_a_checkpoint_of_other_weights_or_images_is_refused(tmp_path):
    from vitviz.core.features import extract_features

    model = tiny_timm_vit()
    x, y = _data(2)
    extract_features(model, (x, y), checkpoint=tmp_path / "f.pt")
    with pytest.raises(CheckpointError, match="weights"):
        extract_features(tiny_timm_vit(), (x, y), checkpoint=tmp_path / "f.pt")
    with pytest.raises(CheckpointError, match=r"data \(the images read\)"):
        extract_features(model, (x.flip(-1), y), checkpoint=tmp_path / "f.pt")


def test_a_numpy_block_index_is_that_block_and_a_float_is_refused_naming_the_layer():
    """A NumPy integer (from np.arange over the blocks) was called "not a block of this 2-block model", or failed as
    a bare TypeError when given alone; it is the block it names. A float is refused with a LayerSelectError."""
    from vitviz.core.features import extract_features, resolve_blocks

    model = tiny_timm_vit()
    assert resolve_blocks(model, np.int64(1)) == resolve_blocks(model, 1) == [1]
    assert resolve_blocks(model, [np.int64(0), np.int32(-1)]) == resolve_blocks(model, [0, -1]) == [0, 1]
    train = _data(1, classes=2)
    torch.testing.assert_close(extract_features(model, train, layers=np.int64(1), pre_logits=False).feats[1],
                               extract_features(model, train, layers=1, pre_logits=False).feats[1])
    for bad in (1.0, [1.0], True):
        with pytest.raises(LayerSelectError, match=rf"layer={bad!r}"):
            resolve_blocks(model, bad)


def test_model_level_bad_inputs():
    from vitviz.analysis.representations import linear_fewshot

    model = tiny_timm_vit()
    train, test = _data(2), _data(1, seed=1)
    with pytest.raises(InputError, match="shots=5 exceeds"):
        linear_fewshot(model, train, test, shots=(5,), seeds=(0,))
    with pytest.raises(LayerSelectError, match="layer=7"):
        linear_fewshot(model, train, test, shots=(1,), seeds=(0,), layer=7)
    with pytest.raises(InputError, match="batches must be"):
        linear_fewshot(model, (train[0], train[1][:3]), test, shots=(1,), seeds=(0,))
    with pytest.raises(InputError, match="folder, a Dataset"):
        linear_fewshot(model, [1, 2, 3], test)


def test_folder_sources_read_only_the_drawn_images(tiny_folder):
    from vitviz.analysis.representations import knn_probe, linear_fewshot, summarize_probes

    model = tiny_timm_vit(img_size=32, num_classes=10)
    df = linear_fewshot(model, tiny_folder / "train", tiny_folder / "test", shots=(1, 5), seeds=(0, 1, 2))
    assert (df.train_images == df.shots * 10).all() and (df.test_images == 100).all()
    s = summarize_probes(df)
    assert list(s.shots) == [1, 5] and (s.low <= s.accuracy).all() and (s.accuracy <= s.high).all()
    k = knn_probe(model, tiny_folder / "train", tiny_folder / "test", k=5)
    assert k.train_images.item() == 300 and 0 <= k.accuracy.item() <= 100


def test_a_test_folder_lacking_a_class_is_labelled_by_the_training_folders_classes(tiny_folder, tmp_path):
    """A folder numbers its own sorted sub-folders: a test folder without ``class3`` would label ``class4`` as 3, and
    so on, each scored as another training class. The test folder is labelled by the training folder's class
    names: the same accuracy as the same images with their training-set labels, on both probes. A test class the
    training set lacks, and two datasets that name different classes, are refused."""
    import shutil

    from vitviz.analysis.representations import knn_probe, linear_fewshot
    from vitviz.core.datasets import ImageFolder

    model = tiny_timm_vit(img_size=32, num_classes=10)
    train, test = tiny_folder / "train", tmp_path / "test"
    shutil.copytree(tiny_folder / "test", test)
    shutil.rmtree(test / "class3")
    ds = ImageFolder(test, model, classes=ImageFolder(train, model).classes)
    assert 3 not in ds.labels and ds.labels[-10:] == [9] * 10 and ImageFolder(test, model).labels[-10:] == [8] * 10
    x, y = torch.stack([ds[i][0] for i in range(len(ds))]), torch.tensor(ds.labels)
    for probe, kw in ((linear_fewshot, dict(shots=(5,), seeds=(0,), l2_reg=1.0)), (knn_probe, dict(k=5))):
        got, want = probe(model, train, test, **kw), probe(model, train, (x, y), **kw)
        assert got.accuracy.item() == want.accuracy.item(), probe.__name__
    (test / "class10").mkdir()
    shutil.copy(next((tiny_folder / "test" / "class3").iterdir()), test / "class10" / "0000.jpg")
    with pytest.raises(InputError, match=r"class10"):
        linear_fewshot(model, train, test, shots=(1,), seeds=(0,))
    with pytest.raises(InputError, match="number different classes"):
        knn_probe(model, ImageFolder(train, model), ImageFolder(test, model), k=5)


def test_class_names_are_compared_through_nested_subsets_and_loaders(tiny_folder, tmp_path):
    """A test folder lacking a class numbers the later classes one lower: named classes are compared however the
    dataset is wrapped (a per_class_subset in a DataLoader, a Subset of it), not only one wrapper deep, where the
    shifted labels were scored as other classes without a word. Wrapped with the training classes, it is probed."""
    import shutil

    from torch.utils.data import DataLoader, Subset

    from vitviz.analysis.representations import knn_probe, per_class_subset
    from vitviz.core.datasets import ImageFolder

    model = tiny_timm_vit(img_size=32, num_classes=10)
    train, test = tiny_folder / "train", tmp_path / "test"
    shutil.copytree(tiny_folder / "test", test)
    shutil.rmtree(test / "class3")
    sub = per_class_subset(model, test, 2)
    assert ImageFolder(test, model).classes != ImageFolder(train, model).classes
    for wrapped in (DataLoader(sub, batch_size=4), Subset(sub, range(len(sub)))):
        with pytest.raises(InputError, match="number different classes"):
            knn_probe(model, train, wrapped, k=5)
    same = per_class_subset(model, ImageFolder(test, model, classes=ImageFolder(train, model).classes), 2)
    want = knn_probe(model, train, same, k=5).accuracy.item()
    assert knn_probe(model, train, DataLoader(same, batch_size=4), k=5).accuracy.item() == want


def test_a_model_whose_head_pools_nothing_is_refused_for_its_pre_logits_and_probed_at_a_block():
    """timm's ``global_pool=''`` hands every token to the head: no pre-logits vector to probe (refused, the model
    class and the fix named, rather than torch's shape error); a block's tokens are pooled as before."""
    from timm.models.vision_transformer import VisionTransformer

    from vitviz.core.features import extract_features
    from vitviz.errors import UnsupportedModelError

    model = VisionTransformer(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3,
                              global_pool="").eval()
    x, y = torch.randn(4, 3, 32, 48), torch.tensor([0, 1, 2, 0])
    with pytest.raises(UnsupportedModelError, match=r"VisionTransformer: its pre-logits output is \(4, 25, 32\)"):
        extract_features(model, (x, y))
    feats = extract_features(model, (x, y), layers=[1], pre_logits=False)
    with torch.no_grad():  # the class token of the last block's output, read by hand
        tokens = model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(x))))
    torch.testing.assert_close(feats.feats[1], tokens[:, 0])


def test_labels_an_attribute_does_not_describe_are_read_from_the_items():
    """A dataset's ``targets`` are its items' labels only without a ``target_transform`` (torchvision maps each item's
    label by it) and with one label per item: otherwise the draws are made from the labels the items carry, as
    for the same images given as tensors."""
    from torch.utils.data import Dataset

    from vitviz.analysis.representations import labels_of, linear_fewshot

    class Mapped(Dataset):  # torchvision's convention: ``targets`` before ``target_transform``
        def __init__(self, x, y, target_transform=None, extra=0):
            self.x, self.targets, self.target_transform = x, y.tolist() + [0] * extra, target_transform

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            y = self.targets[i]
            return self.x[i], y if self.target_transform is None else self.target_transform(y)

    model = tiny_timm_vit()
    (x, y), test = _data(6, classes=6), _data(2, classes=3, seed=1)
    merged = Mapped(x, y, target_transform=lambda c: c // 2)  # six folders, three classes
    assert labels_of(merged) is None and labels_of(Mapped(x, y, extra=3)) is None
    assert (labels_of(Mapped(x, y)) == y.numpy()).all()
    got = linear_fewshot(model, merged, test, shots=(2,), seeds=(0, 1), l2_reg=0.5)
    want = linear_fewshot(model, (x, y // 2), test, shots=(2,), seeds=(0, 1), l2_reg=0.5)
    assert (got.train_images == 2 * 3).all()
    assert got.accuracy.tolist() == want.accuracy.tolist()


def test_knn_weights_are_exponential_in_similarity_over_temperature():
    # one very similar neighbour of class 0 outvotes two fairly similar ones of class 1 only through exp(sim / T)
    q = np.array([[1.0, 0.0]])
    ref = np.array([[0.99, np.sqrt(1 - 0.99 ** 2)], [0.5, np.sqrt(0.75)], [0.5, -np.sqrt(0.75)], [-1.0, 0.0]])
    lab = np.array([0, 1, 1, 0])
    assert knn_accuracy(ref, lab, q, np.array([0]), k=3, temperature=0.07) == 100.0
    assert knn_accuracy(ref, lab, q, np.array([1]), k=3, temperature=100.0) == 100.0  # flat weights: majority
    assert _knn_loop(ref, lab, q, 3, 0.07, 2).tolist() == [0]


def test_hf_and_torchvision_features_equal_the_libraries_hidden_states():
    """Block tokens and pre-logits against each library's own outputs (output_hidden_states; the head's input)."""
    from transformers import ViTConfig, ViTForImageClassification, ViTModel

    from vitviz.core.features import extract_features

    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=3)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    for model in (ViTForImageClassification(cfg).eval(), ViTModel(cfg).eval()):
        f = extract_features(model, (x, y), layers="all")
        with torch.no_grad():
            root = model.vit if hasattr(model, "vit") else model
            out = root(pixel_values=x, output_hidden_states=True)
        for i in range(2):
            torch.testing.assert_close(f.feats[i], out.hidden_states[i + 1][:, 0])
        want = out.last_hidden_state[:, 0] if hasattr(model, "classifier") else out.pooler_output
        torch.testing.assert_close(f.feats["pre_logits"], want)

    from torchvision.models import VisionTransformer

    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                           num_classes=3).eval()
    f = extract_features(tv, (x, y), layers="all")
    with torch.no_grad():
        tokens = tv._process_input(x)
        tokens = torch.cat([tv.class_token.expand(len(x), -1, -1), tokens], dim=1) + tv.encoder.pos_embedding
        b0 = tv.encoder.layers[0](tokens)
        b1 = tv.encoder.layers[1](b0)
        torch.testing.assert_close(f.feats[0], b0[:, 0])
        torch.testing.assert_close(f.feats["pre_logits"], tv.encoder.ln(b1)[:, 0])


@pytest.mark.parametrize("batch_first", [True, False])
def test_open_clip_features_equal_its_own_tower(batch_first):
    from tests.hf_models import open_clip_model
    from vitviz.core.features import extract_features

    model = open_clip_model()
    visual = model.visual
    visual.transformer.batch_first = batch_first
    x, y = torch.randn(3, 3, 32, 48), torch.tensor([0, 1, 0])
    f = extract_features(model, (x, y), layers="all")
    with torch.no_grad():
        torch.testing.assert_close(f.feats["pre_logits"], model.encode_image(x))
        tokens = visual._embeds(x)  # patch embedding, class token, position embedding, ln_pre
        first = visual.transformer.resblocks[0](tokens if batch_first else tokens.transpose(0, 1))
        first = first if batch_first else first.transpose(0, 1)
        torch.testing.assert_close(f.feats[0], first[:, 0])


def _fewshot_lsr(x, y, x_test, k, l2):
    """big_vision's evaluators/fewshot_lsr.py, re-written in numpy: whiten with the examples' mean and std (+1e-5),
    append a constant feature 100 for the bias (penalised like the rest), {-1, 1} targets, ridge without centring."""
    mean, std = x.mean(0, keepdims=True), x.std(0, keepdims=True) + 1e-5
    a = np.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
    a_test = np.pad((x_test - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
    t = 2.0 * np.eye(k)[y] - 1.0
    w = np.linalg.solve(a.T @ a + l2 * np.eye(a.shape[1]), a.T @ t)
    return a_test @ w


def test_big_vision_l2_reproduces_the_authors_evaluator_on_balanced_draws():
    from vitviz.analysis.probes import BIG_VISION_L2

    assert BIG_VISION_L2 == 2.0 ** 10
    rng = np.random.default_rng(3)
    k = 7
    xte, yte = rng.normal(size=(300, 12)) * 0.6, rng.integers(0, k, 300)
    xte += np.eye(k, 12)[yte]
    for shots, d in ((1, 12), (5, 12), (10, 40)):  # the dual (n <= D) and primal (n > D) branches
        x, y = _blobs(shots, k=k, d=d, seed=shots, spread=0.7)  # class-balanced, as every fewshot draw
        xt = np.pad(xte, ((0, 0), (0, d - 12))) + rng.normal(size=(300, d)) * 0.3
        ref = _fewshot_lsr(x, y, xt, k, BIG_VISION_L2)
        acc, l2 = linear_fewshot_accuracy(x, y, xt, yte, l2_reg=BIG_VISION_L2, num_classes=k)
        assert l2 == BIG_VISION_L2 and acc == 100.0 * (ref.argmax(1) == yte).mean()
        # the scores differ by one constant per image (the bias feature only shrinks the same intercept of every
        # class by n / (n + l2 / 100^2)), so every prediction is the same
        xs, xts = standardize(x, xt)
        w, b = RidgeFit(xs, pm1_targets(y, k)).weights(BIG_VISION_L2)
        diff = xts @ w + b - ref
        np.testing.assert_allclose(diff, diff[:, :1].repeat(k, 1), atol=1e-9)
        n = len(y)
        np.testing.assert_allclose(diff[:, 0], (2.0 / k - 1) * (1 - n / (n + BIG_VISION_L2 / 1e4)), atol=1e-9)


def test_fewshot_draws_are_the_authors_draws():
    """big_vision draws, per seed, one permutation of each class's indices (classes in order) and takes the first
    ``shots``; vitviz's draws are the same sets."""
    labels = np.random.default_rng(0).integers(0, 4, 60)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        perms = [rng.permutation(np.where(labels == c)[0]) for c in range(4)]
        got = fewshot_draws(labels, (1, 5), (seed,))
        for shots in (1, 5):
            assert np.array_equal(got[(shots, seed)], np.sort(np.concatenate([p[:shots] for p in perms])))


def test_every_source_kind_gives_the_same_probe_results_and_a_shuffling_loader_is_refused():
    """Tensors, a Dataset, a Subset and an ordered DataLoader of the same images give the same features (the model's
    own pre-logits, row for row) and the same draws and accuracies; a loader whose order is unknown is refused."""
    from torch.utils.data import DataLoader, Subset, TensorDataset

    from vitviz.analysis.representations import layer_probes, linear_fewshot
    from vitviz.core.features import extract_features

    model = tiny_timm_vit()
    train, test = _data(5), _data(3, seed=1)
    with torch.no_grad():
        want = model.forward_head(model.forward_features(train[0]), pre_logits=True)
    ref = linear_fewshot(model, train, test, shots=(1, 3), seeds=(0, 1), name="m")
    ref_layers = layer_probes(model, train, test, shots=(2,), seeds=(0,), name="m")
    sources = {
        "dataset": (TensorDataset(*train), TensorDataset(*test)),
        "subset": (Subset(TensorDataset(*train), range(len(train[1]))), TensorDataset(*test)),
        "loader": (DataLoader(TensorDataset(*train), batch_size=4), DataLoader(TensorDataset(*test), batch_size=2)),
    }
    for kind, (tr, te) in sources.items():
        f = extract_features(model, tr)
        torch.testing.assert_close(f.feats["pre_logits"], want, msg=kind)
        assert torch.equal(f.labels, train[1]), kind
        got = linear_fewshot(model, tr, te, shots=(1, 3), seeds=(0, 1), name="m")
        assert got.accuracy.tolist() == ref.accuracy.tolist(), kind
        got_layers = layer_probes(model, tr, te, shots=(2,), seeds=(0,), name="m")
        assert got_layers.accuracy.tolist() == ref_layers.accuracy.tolist(), kind
    shuffled = DataLoader(TensorDataset(*train), batch_size=4, shuffle=True)
    with pytest.raises(InputError, match="order"):
        extract_features(model, shuffled)
    with pytest.raises(InputError, match="train= is a DataLoader"):
        linear_fewshot(model, shuffled, test, shots=(1,), seeds=(0,))


def test_per_class_subset_holds_the_first_per_class_images_of_every_class():
    from torch.utils.data import TensorDataset

    from vitviz.analysis.representations import per_class_subset

    model = tiny_timm_vit()
    y = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 1, 2, 0, 1])
    x = torch.randn(len(y), 3, 32, 48)
    for source in ((x, y), TensorDataset(x, y)):
        for k in (1, 3):
            sub = per_class_subset(model, source, k)
            want = sorted(i for c in range(3) for i in [j for j in range(len(y)) if y[j] == c][:k])
            assert list(sub.indices) == want
            assert np.bincount(y[list(sub.indices)].numpy()).tolist() == [k, k, k]
    with pytest.raises(InputError, match="per_class=5.*class"):
        per_class_subset(model, (x[:-1], y[:-1]), 5)  # classes of 4, 3 and 4 images: never fewer, silently
    with pytest.raises(InputError, match=r"per_class=4.*\{1: 3\}"):
        per_class_subset(model, (x[:-1], y[:-1]), 4)
    with pytest.raises(InputError, match="per_class=0"):
        per_class_subset(model, (x, y), 0)
    assert list(per_class_subset(model, (x, y), 6).indices) == list(range(len(y)))  # 4 of each: all, balanced


def test_a_feature_cache_is_keyed_by_the_readout_as_well_as_the_weights(tmp_path):
    """Same weights, another pooling (timm ``reset_classifier(0, global_pool)``): other features, never the cached
    ones."""
    from vitviz.analysis.representations import linear_fewshot
    from vitviz.core.features import extract_features

    model = tiny_timm_vit(num_classes=0, fc_norm=False)
    train, test = _data(4), _data(3, seed=1)
    kw = {"shots": (2,), "seeds": (0, 1), "name": "m"}
    model.reset_classifier(0, "token")
    token = extract_features(model, train, checkpoint=tmp_path / "f.pt")
    for layer in (None, 0):
        linear_fewshot(model, train, test, layer=layer, cache=tmp_path / "c", **kw)
    model.reset_classifier(0, "avg")
    fresh = extract_features(model, train)
    assert not torch.allclose(fresh.feats["pre_logits"], token.feats["pre_logits"])
    with pytest.raises(CheckpointError, match="readout"):
        extract_features(model, train, checkpoint=tmp_path / "f.pt")
    for layer in (None, 0):
        want = linear_fewshot(model, train, test, layer=layer, **kw)
        got = linear_fewshot(model, train, test, layer=layer, cache=tmp_path / "c", **kw)
        assert got.accuracy.tolist() == want.accuracy.tolist(), layer


def test_summarize_probes_keeps_knn_rows_beside_linear_rows():
    import pandas as pd

    from vitviz.analysis.intervals import t_interval
    from vitviz.analysis.representations import knn_probe, linear_fewshot, summarize_probes

    model = tiny_timm_vit()
    train, test = _data(4), _data(3, seed=1)
    lin = linear_fewshot(model, train, test, shots=(1, 2), seeds=(0, 1, 2), name="m")
    knn = knn_probe(model, train, test, k=3, name="m")
    s = summarize_probes(pd.concat([lin, knn], ignore_index=True))
    assert sorted(s.probe) == ["knn", "linear", "linear"]
    row = s[s.probe == "knn"].iloc[0]
    assert row.accuracy == knn.accuracy.item() and row.draws == 1
    for shots in (1, 2):
        row = s[(s.probe == "linear") & (s.shots == shots)].iloc[0]
        m, lo, hi = t_interval(lin[lin.shots == shots].accuracy.to_numpy())
        assert (row.accuracy, row.low, row.high, row.draws) == pytest.approx((m, max(lo, 0), min(hi, 100), 3))


def test_summarize_probes_cuts_the_interval_to_0_to_100_percent():
    """Draws near 0 % or 100 % give a Student-t interval past the range; the summary cuts it there and leaves an
    interval inside the range, and a single draw's missing one, as they are."""
    import pandas as pd

    from vitviz.analysis.intervals import t_interval
    from vitviz.analysis.representations import summarize_probes

    groups = {"low": [0.0, 0.0, 12.0], "high": [100.0, 100.0, 90.0], "inside": [40.0, 50.0, 45.0], "one": [30.0]}
    df = pd.DataFrame([{"model": name, "layer": "block0", "depth": 1, "probe": "linear", "shots": 1, "seed": i,
                        "accuracy": a} for name, values in groups.items() for i, a in enumerate(values)])
    s = summarize_probes(df).set_index("model")
    raw = {name: t_interval(values) for name, values in groups.items()}
    assert raw["low"][1] < 0 and raw["high"][2] > 100  # the case: uncut, past the range
    assert s.loc["low", "low"] == 0 and s.loc["low", "high"] == pytest.approx(raw["low"][2])
    assert s.loc["high", "high"] == 100 and s.loc["high", "low"] == pytest.approx(raw["high"][1])
    assert (s.loc["inside", ["accuracy", "low", "high"]].tolist() == pytest.approx(list(raw["inside"])))
    assert np.isnan(s.loc["one", "low"]) and np.isnan(s.loc["one", "high"]) and s.loc["one", "accuracy"] == 30


def test_features_in_a_process_group_are_refused_with_advice_that_can_be_followed():
    """extract_features does not gather across ranks: in a process group it is refused on every rank, rank 0 too,
    so the message names the rank and says to call it outside the group (it used to say "call it on rank 0 only",
    which failed the same way)."""
    import torch.distributed as dist

    from vitviz.core.features import extract_features

    model = tiny_timm_vit()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(InputError, match=r"torch\.distributed is initialised here \(rank 0 of 1\).*"
                                             r"before init_process_group or after destroy_process_group"):
            extract_features(model, _data(1, classes=2))
    finally:
        dist.destroy_process_group()
    assert extract_features(model, _data(1, classes=2)).labels.tolist() == [0, 1]


def test_tensors_off_the_host_are_not_pinned():
    """Only host memory can be pinned: the loader vitviz builds over (images, labels) already on a device drops
    pin_memory (pinning raised in the loader for CUDA tensors), through a Subset too; host tensors keep it."""
    from torch.utils.data import Subset, TensorDataset

    from vitviz.core.datasets import own_loader

    off = TensorDataset(torch.empty(2, 3, 4, 4, device="meta"), torch.empty(2, device="meta"))
    host = TensorDataset(torch.zeros(2, 3, 4, 4), torch.zeros(2))
    assert not own_loader(off, pin_memory=True).pin_memory
    assert not own_loader(Subset(off, [1]), pin_memory=True).pin_memory
    assert own_loader(host, pin_memory=True).pin_memory and own_loader(Subset(host, [0]), pin_memory=True).pin_memory


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_features_of_images_and_labels_already_on_the_gpu():
    from vitviz.core.features import extract_features

    model = tiny_timm_vit().cuda()
    x, y = _data(2, classes=2)
    got = extract_features(model, (x.cuda(), y.cuda()))
    torch.testing.assert_close(got.feats["pre_logits"], extract_features(model, (x, y)).feats["pre_logits"].cuda())


def test_a_num_classes_below_a_label_is_refused_naming_it():
    """``num_classes`` smaller than a label failed deep in the targets or the votes with a bare IndexError; 0 was
    read as "not given". Both are refused naming num_classes, its value and the classes the labels need."""
    x, y = _blobs(3)
    need = int(y.max()) + 1
    for call in (linear_fewshot_accuracy, functools.partial(knn_accuracy, k=5)):
        for bad in (need - 1, 0, -2, 2.5, True):
            with pytest.raises(InputError, match=rf"num_classes={bad!r}.*{need}"):
                call(x, y, x, y, num_classes=bad)
    assert knn_accuracy(x, y, x, y, k=5, num_classes=need + 2) == knn_accuracy(x, y, x, y, k=5)  # unused classes get no vote


def test_test_images_of_a_class_no_training_image_holds_are_refused_on_every_input_path():
    """A test image of a class without training examples can never be predicted (its target column is -1 for
    every example; no reference votes for it), so it counted as an error: 5 classes of test images against 4 of
    training gave 80 % at best, without a word. A test folder with such a class was refused already; tensors,
    Datasets and DataLoaders are refused the same way, in both probes, naming the classes."""
    from torch.utils.data import DataLoader, TensorDataset

    from vitviz.analysis.representations import knn_probe, linear_fewshot

    x, y = _blobs(3, k=4)
    xt, yt = _blobs(2, k=5, seed=1)
    for call in (linear_fewshot_accuracy, functools.partial(knn_accuracy, k=3)):
        with pytest.raises(InputError, match=r"test: label\(s\) \[4\] \(2 images\) .*no training example"):
            call(x, y, xt, yt)
        call(x, y, xt[yt < 4], yt[yt < 4])  # the classes training holds: probed
    model = tiny_timm_vit()
    train, test = _data(2, classes=3), _data(1, classes=4, seed=1)
    for te in (test, TensorDataset(*test), DataLoader(TensorDataset(*test), batch_size=2)):
        with pytest.raises(InputError, match=r"label\(s\) \[3\]"):
            linear_fewshot(model, train, te, shots=(1,), seeds=(0,), l2_reg=1.0)
        with pytest.raises(InputError, match=r"label\(s\) \[3\]"):
            knn_probe(model, train, te, k=1)


def test_seeds_that_are_not_distinct_non_negative_ints_are_refused_naming_them():
    """Each seed is one draw: seeds=(0.2, 0.7) were cast to 0 and 0 and seeds=(0, 0) drew seed 0 once, so the
    table held one draw where two were asked for (an interval over fewer draws, without a word); seeds=5 (five
    draws meant) failed with a bare TypeError and a negative seed with numpy's ValueError. A bool is no shot count."""
    from vitviz.analysis.representations import linear_fewshot

    y = np.repeat(np.arange(3), 4)
    assert sorted(fewshot_draws(y, (1,), np.arange(3))) == [(1, 0), (1, 1), (1, 2)]
    for bad, match in (((0.2, 0.7), r"seeds=\(0.2, 0.7\).*0.2"), ((0, 0), r"seeds=\(0, 0\).*repeat"),
                       ((-1,), r"seeds=\(-1,\).*-1"), (5, r"seeds=5.*range\(5\)"), ((True,), r"True")):
        with pytest.raises(InputError, match=match):
            fewshot_draws(y, (1,), bad)
    with pytest.raises(InputError, match=r"shots=True"):
        fewshot_draws(y, (True,), (0,))
    model = tiny_timm_vit()
    with pytest.raises(InputError, match=r"seeds=3.*range\(3\)"):
        linear_fewshot(model, _data(2, classes=2), _data(1, classes=2), shots=(1,), seeds=3)


def test_an_l2_grid_with_a_penalty_that_is_not_positive_is_refused_as_l2_reg_is():
    """``grid`` was not checked as ``l2_reg`` is: a grid holding 0 chose l2=0, a ridge without a penalty on fewer
    examples than dimensions (a singular system: infinite weights), and returned its accuracy; an empty grid failed
    in min(). Both are refused naming grid and the value."""
    x, y = _blobs(2, d=20)
    for bad in ((0.0, 1.0), (-1.0,), (1.0, float("nan")), (True,)):
        with pytest.raises(InputError, match=r"grid: l2=.* must be a finite positive number"):
            linear_fewshot_accuracy(x, y, x, y, grid=bad)
        with pytest.raises(InputError, match=r"grid: l2="):
            select_l2(RidgeFit(standardize(x)[0], pm1_targets(y, 4)), bad)
    with pytest.raises(InputError, match=r"grid=\(\) holds no l2"):
        linear_fewshot_accuracy(x, y, x, y, grid=())
    assert linear_fewshot_accuracy(x, y, x, y, grid=(0.5, 2.0))[1] in (0.5, 2.0)


def test_a_labels_attribute_that_disagrees_with_the_items_labels_is_refused():
    """The draws are made from a dataset's ``targets`` (read without the images), the probe is fitted on the labels
    its items yield: a dataset that maps its labels in ``__getitem__`` without a ``target_transform`` (six fine
    classes merged into three) gave draws of 2 per fine class, i.e. 4 per probed class where shots=2 was asked for,
    without a word. The labels the items carry are compared with the attribute and a disagreement refused; the
    dataset wrapped without the attribute (the fix the message gives) is probed on its items' labels."""
    from torch.utils.data import ConcatDataset, Dataset

    from vitviz.analysis.representations import linear_fewshot

    class Merged(Dataset):
        def __init__(self, x, y):
            self.x, self.targets = x, y.tolist()

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.targets[i] // 2

    model = tiny_timm_vit()
    (x, y), test = _data(4, classes=6), _data(2, classes=3, seed=1)
    with pytest.raises(InputError, match=r"train: the dataset's labels attribute .*image \d+ is class 1.* yields 0"):
        linear_fewshot(model, Merged(x, y), test, shots=(2,), seeds=(0,), l2_reg=0.5)
    got = linear_fewshot(model, ConcatDataset([Merged(x, y)]), test, shots=(2,), seeds=(0,), l2_reg=0.5)  # the fix
    want = linear_fewshot(model, (x, y // 2), test, shots=(2,), seeds=(0,), l2_reg=0.5)
    assert got.accuracy.tolist() == want.accuracy.tolist() and got.train_images.tolist() == [6]


def test_knn_k_and_temperature_are_checked_as_counts_and_numbers():
    """k=True was read as k=1 (a 1-NN accuracy where 20 neighbours were meant to vote) and a NumPy integer k was
    refused as "not an int"; temperature="0.07" failed with a bare TypeError."""
    x, y = _blobs(3)
    assert knn_accuracy(x, y, x, y, k=np.int64(3)) == knn_accuracy(x, y, x, y, k=3)
    with pytest.raises(InputError, match=r"k=True must be an int"):
        knn_accuracy(x, y, x, y, k=True)
    for bad in ("0.07", 0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match=rf"temperature={bad!r} must be a finite positive number"):
            knn_accuracy(x, y, x, y, k=5, temperature=bad)


def test_knn_weights_do_not_overflow_at_a_small_temperature():
    """exp(sim / T) overflowed to inf for T = 1e-3 (sim near 1: exp(1000)), every neighbour tied at inf and the vote
    went to the neighbour with the lowest class index: 31.25 % where the limit, the nearest neighbour's class (1-NN),
    scores 28.75 %. The weights are taken relative to each query's most similar neighbour (one factor per query,
    the same votes), so a small temperature reaches that limit."""
    x, y = _blobs(20, seed=0)
    xt, yt = _blobs(20, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert knn_accuracy(x, y, xt, yt, k=20, temperature=1e-3) == knn_accuracy(x, y, xt, yt, k=1)
    for temp in (0.07, 0.5):  # the loop's weights, unscaled: the same accuracy
        ref = _knn_loop(x, y, xt, 20, temp, 4)
        assert knn_accuracy(x, y, xt, yt, k=20, temperature=temp) == pytest.approx(100 * (ref == yt).mean())


def test_summarize_probes_refuses_a_group_that_holds_one_draw_twice():
    """Two probes of one model concatenated (the chosen l2 and big_vision's fixed one; k-NN at k=3 and k=5) fell
    into one group: their accuracies were averaged into one number and each draw counted twice, an interval over 6
    "draws" that are 3 draws of two protocols. A group holding a draw twice is refused, naming it and the columns
    that tell the rows apart; grouped by one of them, each probe gets its own row."""
    import pandas as pd

    from vitviz.analysis.probes import BIG_VISION_L2
    from vitviz.analysis.representations import knn_probe, linear_fewshot, summarize_probes

    model = tiny_timm_vit()
    train, test = _data(4), _data(3, seed=1)
    chosen = linear_fewshot(model, train, test, shots=(2,), seeds=(0, 1, 2), name="m")
    fixed = linear_fewshot(model, train, test, shots=(2,), seeds=(0, 1, 2), name="m", l2_reg=BIG_VISION_L2)
    both = pd.concat([chosen.assign(setting="loo"), fixed.assign(setting="big_vision")], ignore_index=True)
    with pytest.raises(InputError, match=r"model='m'.*seed 0 .*twice.*'setting'"):
        summarize_probes(both)
    s = summarize_probes(both, by=("model", "shots", "setting"))
    assert sorted(s.setting) == ["big_vision", "loo"] and (s.draws == 3).all()
    knn = pd.concat([knn_probe(model, train, test, k=k, name="m") for k in (3, 5)], ignore_index=True)
    with pytest.raises(InputError, match=r"model='m'.*'k'"):
        summarize_probes(knn)
    assert summarize_probes(knn, by=("model", "probe", "k")).draws.tolist() == [1, 1]
    with pytest.raises(InputError, match=r"seed 0 twice.*name of its own"):  # told apart by nothing but the l2
        summarize_probes(pd.concat([chosen, fixed], ignore_index=True))


def test_the_same_images_as_train_and_test_are_refused(tiny_folder):
    """With the training images as the test set, every k-NN query finds itself at similarity 1 (k=1: 100 % for a
    random-weight model whose probe on other images scores near chance) and the linear probe is scored on the
    images it was fitted on. The same folder, Dataset (also in a DataLoader) or tensors passed as both are refused,
    naming train and test."""
    from torch.utils.data import DataLoader, TensorDataset

    from vitviz.analysis.representations import knn_probe, linear_fewshot

    x, y = _data(3)
    same = TensorDataset(x, y)
    folder = tiny_timm_vit(img_size=32, num_classes=10)
    for model, train, test in ((tiny_timm_vit(), (x, y), (x, y)), (tiny_timm_vit(), same, same),
                               (tiny_timm_vit(), same, DataLoader(same, batch_size=4)),
                               (folder, tiny_folder / "train", str(tiny_folder / "train"))):
        with pytest.raises(InputError, match=r"train and test are the same images"):
            knn_probe(model, train, test, k=1)
        with pytest.raises(InputError, match=r"train and test are the same images"):
            linear_fewshot(model, train, test, shots=(1,), seeds=(0,))
    assert knn_probe(tiny_timm_vit(), (x, y), (x.clone(), y), k=1).accuracy.item() == 100.0  # copies: not detected


def test_pre_logits_must_be_a_bool():
    """pre_logits="False" (papermill's -p passes text) is truthy: the pre-logits were extracted and probed where
    they were turned off, without a word. A value that is not a bool is refused naming pre_logits."""
    from vitviz.analysis.representations import layer_probes
    from vitviz.core.features import extract_features

    model = tiny_timm_vit()
    train, test = _data(2, classes=2), _data(1, classes=2, seed=1)
    for bad in ("False", 2, None):
        with pytest.raises(InputError, match=rf"pre_logits={bad!r}"):
            extract_features(model, train, layers=[0], pre_logits=bad)
        with pytest.raises(InputError, match=rf"pre_logits={bad!r}"):
            layer_probes(model, train, test, shots=(1,), seeds=(0,), pre_logits=bad)
    assert list(extract_features(model, train, layers=[0], pre_logits=np.bool_(False)).feats) == [0]


def test_the_default_l2_is_chosen_on_the_few_shot_examples_never_on_the_test_images():
    """big_vision fixes l2 = 2^10; vitviz's default chooses it by leave-one-out error on the few-shot examples
    (module docstring). The choice is the same whatever the test images, and it is not the l2 that scores best on
    them: a choice made on the test set would be."""
    rng = np.random.default_rng(4)
    centres = rng.normal(0, 0.8, (5, 30))
    y, yt = np.repeat(np.arange(5), 3), np.repeat(np.arange(5), 40)
    x = centres[y] + rng.normal(0, 1, (len(y), 30))
    chosen = select_l2(RidgeFit(standardize(x)[0], pm1_targets(y, 5)))
    best_on_test_differs = False
    for _ in range(8):  # test sets of the same classes
        xt = centres[yt] + rng.normal(0, 1, (len(yt), 30))
        acc, l2 = linear_fewshot_accuracy(x, y, xt, yt)
        assert l2 == chosen and acc == linear_fewshot_accuracy(x, y, xt, yt, l2_reg=chosen)[0]
        by_l2 = {v: linear_fewshot_accuracy(x, y, xt, yt, l2_reg=v)[0] for v in L2_GRID}
        best_on_test_differs |= by_l2[chosen] < max(by_l2.values())
    assert best_on_test_differs


def test_per_class_subset_refuses_a_labels_attribute_that_disagrees_with_the_items_labels():
    """per_class_subset picks the images by a dataset's ``targets`` (read without the images): a dataset that maps
    its labels in ``__getitem__`` (six classes merged into three) gave 2 images of each attribute class, i.e. 4 of
    each class its items name where per_class=2 was asked for, without a word. The items picked are read and a
    disagreement refused; a dataset whose attribute holds its items' labels gets its subset."""
    from torch.utils.data import Dataset

    from vitviz.analysis.representations import per_class_subset

    class Merged(Dataset):
        def __init__(self, x, y, merge):
            self.x, self.targets, self.merge = x, y.tolist(), merge

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.targets[i] // 2 if self.merge else self.targets[i]

    model = tiny_timm_vit()
    x, y = _data(3, classes=6)
    with pytest.raises(InputError, match=r"source: the dataset's labels attribute .*image 3 is class 1.* yields 0"):
        per_class_subset(model, Merged(x, y, merge=True), 2)
    sub = per_class_subset(model, Merged(x, y, merge=False), 2)
    assert np.bincount([sub[i][1] for i in range(len(sub))]).tolist() == [2] * 6


def test_per_class_subset_checks_a_torchvision_datasets_labels_without_decoding_its_images(tiny_folder):
    """To check the labels attribute it picked by, per_class_subset read every picked item of any dataset but
    vitviz's folder: for torchvision's CIFAR10, whose items yield ``targets`` as they are (a check that cannot fail),
    3 classes x 2 decoded and transformed 6 images, one more pass over the subset than its caller makes. Where the
    dataset's ``__getitem__`` takes the label from an array as it is, that array is read instead: no image decoded,
    and still refused when it disagrees (a torchvision folder whose samples were relabelled, not its targets); a
    ``__getitem__`` of its own is still called."""
    from torch.utils.data import TensorDataset
    from torchvision.datasets import CIFAR10
    from torchvision.datasets import ImageFolder as TVFolder

    from vitviz.analysis.representations import per_class_subset

    reads = []

    def counting(img):
        reads.append(img)
        return torch.zeros(3, 32, 48)

    model = tiny_timm_vit()
    cifar = CIFAR10.__new__(CIFAR10)  # as torchvision builds it from its files, without them
    cifar.data = np.zeros((12, 32, 48, 3), np.uint8)
    cifar.targets, cifar.transform, cifar.target_transform = [0, 1, 2] * 4, counting, None
    assert list(per_class_subset(model, cifar, 2).indices) == [0, 1, 2, 3, 4, 5] and reads == []
    folder = TVFolder(str(tiny_folder / "test"), transform=counting)
    sub = per_class_subset(model, folder, 1)
    assert [folder.targets[i] for i in sub.indices] == list(range(10)) and reads == []
    folder.samples = [(path, 0) for path, _ in folder.samples]  # relabelled items; targets left as they were
    with pytest.raises(InputError, match=r"source: the dataset's labels attribute .*image 10 is class 1.* yields 0 "
                                         r"\(9 of 10 picked images disagree\)"):
        per_class_subset(model, folder, 1)
    assert reads == []

    class Shifted(CIFAR10):  # its own __getitem__: the items are read
        def __getitem__(self, i):
            return super().__getitem__(i)[0], (self.targets[i] + 1) % 3

    shifted = Shifted.__new__(Shifted)
    shifted.__dict__.update(cifar.__dict__)
    with pytest.raises(InputError, match=r"image 0 is class 0, but its item yields 1"):
        per_class_subset(model, shifted, 2)
    assert len(reads) == 6
    x, y = _data(2, classes=3)
    assert list(per_class_subset(model, TensorDataset(x, y), 1).indices) == [0, 2, 4]


def test_images_digest_names_tensor_images_by_value_and_a_loader_not_at_all():
    """(images, labels) tensors: the same images give the same digest, other images of the same shape (or other
    labels) another; a DataLoader's images cannot be named without reading them: None (a pairing then warns)."""
    from torch.utils.data import DataLoader, TensorDataset

    from vitviz.analysis.representations import images_digest

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, 8, 8, generator=g), torch.tensor([0, 1, 2, 0, 1, 2])
    idx = np.arange(6)
    same = images_digest(TensorDataset(x.clone(), y), idx, y.numpy())
    assert same == images_digest(TensorDataset(x, y), idx, y.numpy()) and same is not None
    assert same != images_digest(TensorDataset(x + 1, y), idx, y.numpy())
    assert same != images_digest(TensorDataset(x, y), idx, y.roll(1).numpy())
    assert images_digest(TensorDataset(x, y), idx[:3], y[:3].numpy()) != same
    assert images_digest(DataLoader(TensorDataset(x, y)), idx, y.numpy()) is None
