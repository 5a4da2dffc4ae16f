"""What a resumable or cached computation is keyed by: every thing that changes its numbers, and nothing else.

Each test changes one thing between a run and its resume and expects a refusal (``CheckpointError``) or a
recomputation; the opposite tests change what must not count (where a folder lies, the batch size, the progress bar)
and expect the file to be used."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import tiny_timm_vit
from torch.utils.data import DataLoader, TensorDataset

import vitviz
from vitviz.analysis.distance import DistanceReduction
from vitviz.core.digest import source_digest
from vitviz.core.features import extract_features
from vitviz.errors import CheckpointError


def images(n=6, seed=1):
    return torch.randn(n, 3, 32, 48, generator=torch.Generator().manual_seed(seed))


class Stop(Exception):
    pass


class StopAt(torch.utils.data.Dataset):
    """The images of ``x`` (with label 0), raising ``Stop`` at item ``at``."""

    def __init__(self, x, at=None):
        self.x, self.at = x, at

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i == self.at:
            raise Stop
        return self.x[i], 0


def test_a_model_setting_besides_the_weights_is_part_of_a_reduction_checkpoint(tmp_path):
    """A norm's eps changes every later attention map and keeps every tensor: the partial sums of the old model must
    not be summed with the new model's (before: resumed, a mix of the two models' distances)."""
    model, x = tiny_timm_vit(), images()
    ckpt = tmp_path / "distance.pt"
    with pytest.raises(Stop):
        vitviz.mean_attention_distance(model, StopAt(x, at=4), batch_size=2, checkpoint=ckpt, checkpoint_every=1)
    model.blocks[1].norm1.eps = 0.5
    changed = vitviz.mean_attention_distance(model, x)
    assert not torch.allclose(changed, vitviz.mean_attention_distance(tiny_timm_vit(), x)), "eps changes the maps"
    with pytest.raises(CheckpointError, match=r"differs in readout \(the model's settings besides its weights"):
        vitviz.mean_attention_distance(model, StopAt(x), batch_size=2, checkpoint=ckpt)


def test_a_checkpoint_without_the_computation_version_is_refused(tmp_path):
    model, x = tiny_timm_vit(), images(4)
    ckpt = tmp_path / "distance.pt"
    want = vitviz.mean_attention_distance(model, StopAt(x), batch_size=2, checkpoint=ckpt)
    saved = torch.load(ckpt, weights_only=True)
    assert saved["fingerprint"]["version"] == DistanceReduction.version
    saved["fingerprint"]["version"] = DistanceReduction.version - 1  # the computation before the last fix
    torch.save(saved, ckpt)
    with pytest.raises(CheckpointError, match=r"differs in version \(vitviz's computation of the reduction"):
        vitviz.mean_attention_distance(model, StopAt(x), batch_size=2, checkpoint=ckpt)
    del saved["fingerprint"]["version"]  # as written before vitviz recorded it
    torch.save(saved, ckpt)
    with pytest.raises(CheckpointError, match=r"differs in version \(vitviz's computation of the reduction"):
        vitviz.mean_attention_distance(model, StopAt(x), batch_size=2, checkpoint=ckpt)
    ckpt.unlink()
    torch.testing.assert_close(vitviz.mean_attention_distance(model, StopAt(x), checkpoint=ckpt), want)


def test_a_moved_folder_resumes_and_batch_size_and_progress_do_not_count(tmp_path, tiny_folder):
    """Where the folder lies is not what the run computes on: a copy elsewhere (file times kept) answers from the
    checkpoint without a forward pass (before: refused as other data); so do another batch size and a progress bar."""
    model = tiny_timm_vit(img_size=32, num_classes=10)
    here = tmp_path / "here"
    shutil.copytree(tiny_folder / "test" / "class3", here / "class3")  # copytree keeps the files' times
    shutil.copytree(tiny_folder / "test" / "class7", here / "class7")
    ckpt = tmp_path / "features.pt"
    want = extract_features(model, here, layers=[0], checkpoint=ckpt)
    there = tmp_path / "elsewhere" / "moved"
    shutil.move(here, there)
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    got = extract_features(model, there, layers=[0], checkpoint=ckpt, batch_size=3, progress=True)
    handle.remove()
    assert not calls and torch.equal(got.feats[0], want.feats[0]) and torch.equal(got.labels, want.labels)
    (there / "class7" / "0001.jpg").write_bytes((there / "class3" / "0001.jpg").read_bytes())
    with pytest.raises(CheckpointError, match=r"differs in data \(the images read\)"):
        extract_features(model, there, layers=[0], checkpoint=ckpt)


def test_a_loaders_collate_fn_is_part_of_its_digest(tmp_path):
    """A collate_fn that changes the images (here: scales them) reads other inputs from the same dataset."""
    ds = TensorDataset(images(4), torch.arange(4))

    def scaled(batch):
        x, y = torch.utils.data.default_collate(batch)
        return 2 * x, y

    plain = DataLoader(ds, batch_size=2)
    assert source_digest(plain) == source_digest(DataLoader(ds, batch_size=2, collate_fn=None))
    assert source_digest(DataLoader(ds, batch_size=2, collate_fn=scaled)) != source_digest(plain)
    model = tiny_timm_vit()
    ckpt = tmp_path / "distance.pt"
    vitviz.mean_attention_distance(model, plain, checkpoint=ckpt)
    with pytest.raises(CheckpointError, match=r"differs in data \(the images read\)"):
        vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=2, collate_fn=scaled), checkpoint=ckpt)


FAITH = dict(methods=["random"], modes=["deletion"], steps=0.5, progress=False, batch_size=2)


def test_a_data_set_numbered_otherwise_is_refused_and_pixels_under_a_new_id_warn(tmp_path):
    """A data set run again with another image_offset would score every image again under new ids (each counted
    twice in the table; before: appended silently); tensor chunks that repeat an image already written warn."""
    model, x = tiny_timm_vit(), images(4)
    out = tmp_path / "curves.csv"
    first = vitviz.faithfulness(model, TensorDataset(x), out=out, **FAITH)
    with pytest.raises(CheckpointError, match=r"differs in image_ids: image_ids: 0 there, 10 now"):
        vitviz.faithfulness(model, TensorDataset(x), out=out, image_offset=10, **FAITH)
    with pytest.raises(CheckpointError, match=r"differs in image_ids"):
        vitviz.faithfulness(model, TensorDataset(x), out=out, image_ids=list("abcd"), **FAITH)
    again = vitviz.faithfulness(model, TensorDataset(x), out=out, **FAITH)
    assert len(again) == len(first)
    chunks = tmp_path / "chunks.csv"
    vitviz.faithfulness(model, x[:2], out=chunks, **FAITH)
    vitviz.faithfulness(model, x[2:], out=chunks, image_offset=2, **FAITH)  # a later chunk: other images, no warning
    with pytest.warns(UserWarning, match=r"same pixels as image id\(s\) '4' \(as '0'\).*count twice"):
        vitviz.faithfulness(model, x[:1], out=chunks, image_offset=4, **FAITH)


def test_cls_vs_gap_never_labels_a_run_folder_of_other_settings_with_its_own(tmp_path, tiny_folder):
    """The results CSV is rebuilt from every run folder and labelled with the sweep's settings: a folder trained with
    another test subset or on other data is refused (before: its rows were labelled test_images=30 silently)."""
    from vitviz.experiments.cls_vs_gap import ClsGapConfig, fewshot_by_epoch, run_sweep, write_results

    kw = dict(data=str(tiny_folder), out=str(tmp_path / "runs"), results=str(tmp_path / "r.csv"), heads=("cls",),
              lrs=(1e-3,), epochs=1, warmup_epochs=0.5, train_subset=50, test_subset=20, batch_size=25)
    table = run_sweep(ClsGapConfig(**kw))
    assert table.test_images.tolist() == [20]
    assert write_results(ClsGapConfig(**kw)).equals(table)  # the same sweep: its folders are its own
    for change, match in (({"test_subset": 30}, "config differs.*test_subset"),
                          ({"epochs": 2}, "holds a 1-epoch run, this sweep trains 2")):
        with pytest.raises(ValueError, match=match):
            write_results(ClsGapConfig(**{**kw, **change}))
        with pytest.raises(ValueError, match=match):
            fewshot_by_epoch(ClsGapConfig(**{**kw, **change}), shots=1, seeds=(0,), test_per_class=2)
    other = tmp_path / "other"
    shutil.copytree(tiny_folder, other)
    shutil.copyfile(other / "test" / "class1" / "0000.jpg", other / "test" / "class0" / "0000.jpg")
    with pytest.raises(ValueError, match="its test split differs"):
        write_results(ClsGapConfig(**{**kw, "data": str(other)}))


def test_the_probe_cache_is_keyed_by_the_autocast_the_device_resolves(tmp_path, monkeypatch):
    """``autocast=None`` is bfloat16 on CUDA and nothing on the CPU: a cache filled on a GPU must not be the CPU run's
    file (before: the same file name, refused with a CheckpointError); None and False on the CPU share one file."""
    import vitviz.core.datasets as datasets
    from vitviz.analysis.representations import linear_fewshot

    model = tiny_timm_vit(num_classes=5)
    y = torch.arange(5).repeat_interleave(2)
    x = images(len(y)) + y[:, None, None, None]
    test = (x.clone(), y)  # the same pictures, another tensor: train and test are not one source
    kw = {"shots": (1,), "seeds": (0,), "name": "m"}
    real = datasets.autocast_dtype
    monkeypatch.setattr(datasets, "autocast_dtype",  # None as it resolves on CUDA
                        lambda a, device, default=torch.bfloat16: real(a, "cuda", default))
    linear_fewshot(model, (x, y), test, cache=tmp_path, **kw)
    monkeypatch.undo()
    assert len(list(tmp_path.glob("features-*.pt"))) == 2  # train and test
    want = linear_fewshot(model, (x, y), test, **kw)
    got = linear_fewshot(model, (x, y), test, cache=tmp_path, **kw)
    assert got.accuracy.tolist() == want.accuracy.tolist() and len(list(tmp_path.glob("features-*.pt"))) == 4
    linear_fewshot(model, (x, y), test, cache=tmp_path, autocast=False, **kw)
    assert len(list(tmp_path.glob("features-*.pt"))) == 4, "None and False run alike on the CPU: one file"


def test_a_probe_cache_of_an_older_computation_is_computed_afresh_not_refused(tmp_path, monkeypatch):
    """A cache is not a run to resume: files of another version of the feature computation are not found (before:
    the same file name, refused by the checkpoint's fingerprint)."""
    from vitviz.analysis.representations import linear_fewshot
    from vitviz.core.features import FeatureReduction

    model = tiny_timm_vit(num_classes=5)
    y = torch.arange(5).repeat_interleave(2)
    x = images(len(y)) + y[:, None, None, None]
    test = (x.clone(), y)  # the same pictures, another tensor: train and test are not one source
    kw = {"shots": (1,), "seeds": (0,), "name": "m"}
    want = linear_fewshot(model, (x, y), test, cache=tmp_path, **kw)
    monkeypatch.setattr(FeatureReduction, "version", FeatureReduction.version + 1)
    got = linear_fewshot(model, (x, y), test, cache=tmp_path, **kw)
    assert got.accuracy.tolist() == want.accuracy.tolist() and len(list(tmp_path.glob("features-*.pt"))) == 4
