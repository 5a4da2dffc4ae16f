"""The hybrid-versus-pure sweep: smoke run end to end, resumable, finished runs never recomputed."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

import vitviz.experiments.study as study
from vitviz.experiments.study import StudyConfig, plan, run_study
from vitviz.experiments.study_rows import SETTINGS


class Stop(Exception):
    pass


def test_plan_runs_every_configuration_once_per_seed():
    runs = plan(StudyConfig(full_epochs=(16,)))
    assert len(runs) == (3 * 3 * 3 + 2 * 3) * 3 == len({r["run_id"] for r in runs})
    sub = [r for r in runs if r["train_subset"] == 5000]
    full = [r for r in runs if r["train_subset"] is None]
    assert {r["epochs"] for r in sub} == {2, 4, 8} and {r["size"] for r in sub} == {"S", "M", "L"}
    assert {r["epochs"] for r in full} == {16} and {r["size"] for r in full} == {"S", "M"}
    assert runs.index(full[0]) == len(sub), "the subset budgets come first"
    assert [r["seed"] for r in full] == [0] * 6 + [1] * 6 + [2] * 6, "whole seeds one after the other"
    assert full[0]["run_id"] == "vit-S-e16-nall-s0" and sub[0]["run_id"] == "vit-S-e2-n5000-s0"
    with pytest.raises(ValueError, match="unknown sizes"):
        plan(StudyConfig(sizes=("XL",)))
    with pytest.raises(ValueError, match="seeds is empty"):
        plan(StudyConfig(seeds=()))


def test_worker_groups_partition_the_plan():
    cfg = StudyConfig(full_epochs=(16,))
    ids = []
    for group in study.worker_groups(cfg):
        group = dict(group)
        group.pop("name")
        ids += [r["run_id"] for r in plan(StudyConfig(**{**cfg.__dict__, **group}))]
    assert sorted(ids) == sorted(r["run_id"] for r in plan(cfg))


def test_merge_keeps_each_run_once_in_plan_order(tmp_path):
    from vitviz.experiments.study import merge_results

    def rows(ids):
        return pd.DataFrame([{"run_id": i, "family": {"vit": "Transformer (ViT)", "resnet": "ResNet"}[i.split("-")[0]],
                              "size": i.split("-")[1], "epochs": int(i.split("-")[2][1:]), "train_images": 5000,
                              "seed": int(i[-1]), "test_acc": float(len(i))} for i in ids])

    rows(["resnet-S-e2-n5000-s0", "vit-S-e2-n5000-s1"]).to_csv(tmp_path / "a.csv", index=False)
    rows(["vit-S-e2-n5000-s0", "resnet-S-e2-n5000-s0"]).to_csv(tmp_path / "b.csv", index=False)
    table = merge_results([tmp_path / "a.csv", tmp_path / "b.csv"], tmp_path / "out.csv")
    assert list(table.run_id) == ["vit-S-e2-n5000-s0", "vit-S-e2-n5000-s1", "resnet-S-e2-n5000-s0"]
    assert list(pd.read_csv(tmp_path / "out.csv").run_id) == list(table.run_id)


def test_smoke_sweep_resumes_without_repeating_runs(tmp_path, tiny_folder, monkeypatch):
    cfg = StudyConfig.smoke(data=str(tiny_folder), out=str(tmp_path / "runs"),
                            results=str(tmp_path / "results.csv"), train_subset=100, test_subset=50, seeds=(0, 1))
    calls = []
    real_train = study.train
    monkeypatch.setattr(study, "train", lambda tc, **kw: calls.append(tc.out) or real_train(tc, **kw))

    def kill_after_first(row):
        raise Stop(row["run_id"])

    with pytest.raises(Stop, match="vit-S-e1-n100-s0"):
        run_study(cfg, progress=False, on_run=kill_after_first)
    first = pd.read_csv(cfg.results)
    assert list(first.run_id) == ["vit-S-e1-n100-s0"]

    table = run_study(cfg, progress=False)
    expected = [f"{f}-S-e1-n100-s{s}" for s in (0, 1) for f in ("vit", "hybrid", "resnet")]
    assert [c.rsplit("/", 1)[-1] for c in calls] == expected, "no run repeated"
    parsed = pd.read_csv(cfg.results)
    assert list(parsed.run_id) == expected == list(table.run_id)
    assert list(parsed.seed) == [0, 0, 0, 1, 1, 1] and (parsed.test_images == 50).all()
    assert set(parsed.family) == {"Transformer (ViT)", "Hybrid", "ResNet"}
    assert (parsed.train_pflops > 0).all() and parsed.test_acc.between(0, 100).all()
    assert (parsed.images_seen == parsed.train_images * parsed.epochs).all()
    assert parsed.device.str.startswith("CPU").all()
    # the seed reaches the runner: the two seeds' ViTs trained differently
    w0, w1 = (torch.load(tmp_path / "runs" / f"vit-S-e1-n100-s{s}" / "cifar10-vit" / "last.pt",
                         weights_only=False)["model"]["head.weight"] for s in (0, 1))
    assert not torch.equal(w0, w1)
    assert run_study(cfg, progress=False).equals(parsed) and len(calls) == 6, "a finished sweep trains nothing"


def test_pack_decodes_to_the_same_pixels_as_the_folder(tmp_path, tiny_folder):
    from vitviz.experiments.data import load_image_folder, load_pack, pack_image_folder

    path = pack_image_folder(tiny_folder, tmp_path / "pack.npz")
    for split in ("train", "test"):
        a, b = load_image_folder(tiny_folder / split), load_pack(path, split, cache_dir=tmp_path / "cache")
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels) and a.classes == b.classes
    cached = load_pack(path, "test", cache_dir=tmp_path / "cache")
    assert torch.equal(cached.images, load_image_folder(tiny_folder / "test").images)
    with pytest.raises(ValueError, match="pack with a 'val' split"):
        load_pack(path, "val")


@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_a_pack_cut_short_is_refused_naming_the_file_and_the_fix(tmp_path, tiny_folder, keep):
    """A pack whose copy stopped part-way gave numpy's or zipfile's bare error (``BadZipFile``), naming no fix."""
    from vitviz.errors import InputError
    from vitviz.experiments.data import load_pack, pack_image_folder

    path = pack_image_folder(tiny_folder, tmp_path / "pack.npz")
    blob = path.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(blob[: int(len(blob) * keep)])
    with pytest.raises(InputError, match=r"cut\.npz' cannot be read as a .* pack .*damaged or cut short.*"
                                         r"pack_image_folder\(root, path\)"):
        load_pack(cut, "train", cache_dir=tmp_path / "cache")


def test_meta_lists_pending_runs(tmp_path):
    import json

    from vitviz.experiments.study import write_meta

    cfg = StudyConfig(results=str(tmp_path / "r.csv"), sizes=("S",), epochs=(1, 2), seeds=(0,))
    write_meta(cfg, pd.DataFrame({"run_id": ["vit-S-e1-n5000-s0"]}))
    meta = json.loads((tmp_path / "r.json").read_text())
    assert meta["runs_finished"] == 1 and meta["runs_planned"] == 6
    assert "vit-S-e1-n5000-s0" not in meta["runs_pending"] and "vit-S-e2-n5000-s0" in meta["runs_pending"]


def test_the_decoded_cache_is_not_reused_for_an_image_replaced_under_its_name(tmp_path, tiny_folder):
    import shutil

    from vitviz.experiments.data import load_image_folder

    folder = tmp_path / "data"
    shutil.copytree(tiny_folder, folder)
    cache = tmp_path / "cache"
    before = load_image_folder(folder / "test", cache_dir=cache)
    shutil.copyfile(folder / "test" / "class1" / "0000.jpg", folder / "test" / "class0" / "0003.jpg")
    after = load_image_folder(folder / "test", cache_dir=cache)
    assert torch.equal(after.images, load_image_folder(folder / "test").images)
    assert not torch.equal(after.images, before.images)



@pytest.mark.parametrize("source", ["folder", "pack"])
def test_a_cut_off_decoded_cache_is_decoded_again_with_a_warning(tmp_path, tiny_folder, source):
    """A decoded cache cut off (a run folder copied part-way, a disk error) once stopped every run that read the
    data with torch's zip error; it is a cache: the images are decoded again and the file rewritten."""
    from vitviz.experiments.data import load_image_folder, load_pack, pack_image_folder

    cache = tmp_path / "cache"
    if source == "pack":
        pack = pack_image_folder(tiny_folder, tmp_path / "tiny.npz")
        load = lambda: load_pack(pack, "test", cache_dir=cache)  # noqa: E731
    else:
        load = lambda: load_image_folder(tiny_folder / "test", cache_dir=cache)  # noqa: E731
    fresh = load()
    (written,) = cache.iterdir()
    written.write_bytes(written.read_bytes()[: written.stat().st_size // 2])
    with pytest.warns(UserWarning, match=rf"{re.escape(str(written))}.*cannot be read.*decoded again"):
        again = load()
    assert torch.equal(again.images, fresh.images) and torch.equal(again.labels, fresh.labels)
    assert torch.equal(torch.load(written, weights_only=True)["images"], fresh.images)  # rewritten whole


def test_the_pack_cache_sees_an_edit_anywhere_in_the_pack(tmp_path):
    """The decoded cache of a pack is keyed by every byte: a byte changed between the ones a sample would read, or a
    label changed, decodes again instead of serving the stale tensors."""
    import numpy as np
    from PIL import Image

    from vitviz.experiments.data import load_pack, pack_image_folder

    rng = np.random.default_rng(0)
    for c in range(2):  # 120 noise JPEGs of 64 x 64: over 128 kB, so a sample of 65,536 bytes skips bytes
        for i in range(60):
            folder = tmp_path / "data" / "train" / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(folder / f"{i:04d}.jpg")
    path = pack_image_folder(tmp_path / "data", tmp_path / "pack.npz", splits=("train",))
    cache = tmp_path / "cache"
    before = load_pack(path, "train", cache_dir=cache)
    with np.load(path) as pack:
        arrays = {k: pack[k] for k in pack.files}
    data, offsets = arrays["train_data"].copy(), arrays["train_offsets"]
    stride = max(1, len(data) // 65536)
    assert stride > 1, "the pack must be large enough for a sample to skip bytes"
    start, end = int(offsets[7]), int(offsets[8])
    at = next(i for i in range((start + end) // 2, end) if i % stride)  # a byte a strided sample never reads
    data[at] ^= 0xFF
    labels = arrays["train_labels"].copy()
    labels[0] = 9
    np.savez(path, **{**arrays, "train_data": data, "train_labels": labels})
    fresh = load_pack(path, "train")
    assert not torch.equal(fresh.images, before.images) and fresh.labels[0] == 9
    cached = load_pack(path, "train", cache_dir=cache)
    assert torch.equal(cached.images, fresh.images) and torch.equal(cached.labels, fresh.labels)


def _one_run(tmp_path, data, **kw):
    """A one-run sweep (vit, S, 1 epoch, seed 0) writing ``tmp_path/results.csv``."""
    args = dict(data=str(data), out=str(tmp_path / "runs"), results=str(tmp_path / "results.csv"),
                families=("vit",), train_subset=50, test_subset=20)
    return StudyConfig.smoke(**{**args, **kw})


def test_a_rerun_with_other_settings_or_data_is_refused_not_handed_the_old_row(tmp_path, tiny_folder, monkeypatch):
    import shutil

    cfg = _one_run(tmp_path, tiny_folder)
    first = run_study(cfg, progress=False)
    assert first.loc[0, "test_subset"] == 20 and first.loc[0, "batch_size"] == 50
    assert {"recipe_digest", "train_data", "test_data"} <= set(first.columns)
    calls = []
    monkeypatch.setattr(study, "train", lambda tc, **kw: calls.append(tc) or pytest.fail("nothing to train"))
    for change, column in (({"test_subset": 30}, "test_subset"), ({"batch_size": 25}, "batch_size")):
        with pytest.raises(ValueError, match=rf"row vit-S-e1-n50-s0 was computed with other .*{column}: row .*"
                                             r"another results file and run folder \(--results, --out\)"):
            run_study(_one_run(tmp_path, tiny_folder, **change), progress=False)
    other = tmp_path / "other"
    shutil.copytree(tiny_folder, other)
    shutil.copyfile(other / "train" / "class1" / "0000.jpg", other / "train" / "class0" / "0003.jpg")
    with pytest.raises(ValueError, match=r"vit-S-e1-n50-s0 .*\(train_data: row '[0-9a-f]+', now '[0-9a-f]+'\)"):
        run_study(_one_run(tmp_path, other), progress=False)
    # a row not in the plan (another seed) still shares the study-wide settings: its test set differs
    shutil.copyfile(other / "train" / "class0" / "0003.jpg", other / "test" / "class0" / "0000.jpg")
    with pytest.raises(ValueError, match=r"vit-S-e1-n50-s0 .*test_data: row"):
        run_study(_one_run(tmp_path, other, seeds=(1,)), progress=False)
    # the same images in another folder (another machine): the row is this study's, nothing is trained again
    moved = tmp_path / "moved"
    shutil.copytree(tiny_folder, moved)
    assert run_study(_one_run(tmp_path, moved, out=str(tmp_path / "elsewhere")), progress=False).equals(
        study.read_results(cfg.results)) and not calls


def test_rows_without_settings_are_checked_by_their_image_counts(tmp_path, tiny_folder, monkeypatch):
    """Rows written before vitviz recorded their settings: a test subset shows in test_images (refused); the rest
    cannot be checked (a warning naming the file)."""
    cfg = _one_run(tmp_path, tiny_folder)
    run_study(cfg, progress=False)
    old = study.read_results(cfg.results).drop(columns=list(SETTINGS))
    old.to_csv(cfg.results, index=False)
    monkeypatch.setattr(study, "train", lambda tc, **kw: pytest.fail("nothing to train"))
    with pytest.warns(UserWarning, match=r"results\.csv: 1 rows were written before vitviz recorded"):
        run_study(cfg, progress=False)
    with pytest.raises(ValueError, match=r"test_images: row 20, now 30"):
        run_study(_one_run(tmp_path, tiny_folder, test_subset=30), progress=False)


def test_merge_refuses_parts_of_two_studies_and_joins_parts_of_one(tmp_path):
    from vitviz.experiments.study import merge_results

    def part(name, run_ids, **settings):
        rows = [{"run_id": i, "family": "Transformer (ViT)", "size": "S", "epochs": 1, "train_images": 50,
                 "seed": int(i[-1]), "test_acc": 10.0, "batch_size": 50, "test_subset": None,
                 "recipe_digest": "abc", "train_data": "0123456789012345", "test_data": "1e45", **settings}
                for i in run_ids]
        pd.DataFrame(rows).to_csv(tmp_path / name, index=False)
        return tmp_path / name

    a = part("a.csv", ["vit-S-e1-n50-s0"])
    b = part("b.csv", ["vit-S-e1-n50-s1"])  # another machine, the same study
    table = merge_results([a, b], tmp_path / "out.csv")
    assert list(table.run_id) == ["vit-S-e1-n50-s0", "vit-S-e1-n50-s1"]
    assert list(study.read_results(tmp_path / "out.csv").test_data) == ["1e45", "1e45"], "digests stay strings"
    c = part("c.csv", ["vit-S-e1-n50-s2"], test_subset=20)
    with pytest.raises(ValueError, match=r"other test_subset: .*20.* in .*c\.csv"):
        merge_results([a, c], tmp_path / "out2.csv")
    d = part("d.csv", ["vit-S-e1-n50-s0"], recipe_digest="abd")
    with pytest.raises(ValueError, match=r"run vit-S-e1-n50-s0 has other recipe_digest in .*a\.csv and .*d\.csv"):
        merge_results([a, d], tmp_path / "out3.csv")


def test_the_decoded_cache_follows_a_moved_folder(tmp_path, tiny_folder, monkeypatch):
    """Where the folder lies does not count: the same files elsewhere (times kept) are read from the cache."""
    import shutil

    import vitviz.experiments.data as data

    shutil.copytree(tiny_folder / "test", tmp_path / "a" / "test")
    cache = tmp_path / "cache"
    want = data.load_image_folder(tmp_path / "a" / "test", cache_dir=cache)
    shutil.move(tmp_path / "a", tmp_path / "b")
    monkeypatch.setattr(data, "_decode", lambda path: pytest.fail(f"decoded {path} again"))
    got = data.load_image_folder(tmp_path / "b" / "test", cache_dir=cache)
    assert torch.equal(got.images, want.images) and torch.equal(got.labels, want.labels)


def test_a_balanced_subset_takes_every_class_when_n_is_not_a_multiple_of_the_classes():
    """The first ceil(n / C) of each class, then the first n of those in file order, left the last classes out:
    25 of 10 classes of 30 gave class 8 one image and class 9 none."""
    import torch

    from vitviz.experiments.data import balanced_indices

    labels = torch.arange(10).repeat_interleave(30)
    assert torch.bincount(labels[balanced_indices(labels, 25)], minlength=10).tolist() == [3] * 5 + [2] * 5
    assert balanced_indices(labels, 20).tolist() == [i for c in range(10) for i in (30 * c, 30 * c + 1)]
    short = torch.cat([torch.zeros(1, dtype=torch.long), torch.ones(30, dtype=torch.long)])  # class 0: one image
    assert torch.bincount(short[balanced_indices(short, 10)]).tolist() == [1, 5]


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "a,b"], "argument --seeds: 'a' in 'a,b' is not a whole number"),
    (["--epochs", "2,-1"], "argument --epochs: -1 in '2,-1' is not a positive count"),
    (["--full-epochs", "0"], "argument --full-epochs: 0 in '0' is not a positive count"),
    (["--workers", "-2"], "argument --workers: -2 is not a positive count"),
    (["--train-subset", "-5"], "argument --train-subset: -5 is negative"),
    (["--test-subset", "-1"], "argument --test-subset: -1 is negative"),
])
def test_the_command_line_refuses_bad_counts_before_any_run(argv, message, capsys):
    """``--seeds a,b`` raised a ValueError traceback; ``--epochs 2,-1`` planned runs of -1 epochs (their folders
    made), ``--workers -2`` ran one process, ``--train-subset -5`` trained on half the classes."""
    from vitviz.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["study", "hybrid-vs-pure", "--data", "nowhere", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_command_line_reads_the_lists_it_is_given():
    from vitviz.experiments.config import study_parser

    a = study_parser().parse_args(["hybrid-vs-pure", "--seeds", "3, 4", "--epochs", "1,5", "--full-epochs", "16"])
    assert (a.seeds, a.epochs, a.full_epochs) == ((3, 4), (1, 5), (16,))
    a = study_parser().parse_args(["hybrid-vs-pure"])
    assert (a.seeds, a.epochs, a.full_epochs) == ((0, 1, 2), (2, 4, 8), ())


def test_smoke_sets_the_defaults_and_the_options_given_with_it_still_apply(monkeypatch, capsys):
    """``--smoke --seeds 0,1`` ran one seed: the smoke values replaced what was asked."""
    seen = []
    monkeypatch.setattr(study, "run_study", lambda cfg, progress: seen.append(cfg) or pd.DataFrame(
        columns=["run_id", "params", "train_pflops", "test_acc", "wall_time_s"]))
    smoke = StudyConfig.smoke()
    assert study.main(["hybrid-vs-pure", "--smoke"]) == 0
    assert study.main(["hybrid-vs-pure", "--smoke", "--seeds", "0,1", "--epochs", "2", "--sizes", "M",
                       "--test-subset", "0"]) == 0
    assert study.main(["hybrid-vs-pure", "--seeds", "5"]) == 0
    plain, given, full = seen
    keys = ("sizes", "epochs", "seeds", "train_subset", "test_subset", "full_epochs", "batch_size")
    assert [getattr(plain, k) for k in keys] == [tuple(getattr(smoke, k)) if k in ("sizes", "epochs", "seeds",
                                                 "full_epochs") else getattr(smoke, k) for k in keys]
    assert (given.sizes, given.epochs, given.seeds, given.test_subset) == (("M",), (2,), (0, 1), None)
    assert (given.train_subset, given.batch_size) == (smoke.train_subset, smoke.batch_size)
    assert (full.seeds, full.sizes, full.train_subset, full.batch_size) == ((5,), ("S", "M", "L"), 5_000, 128)


def test_a_results_folder_empty_lists_and_a_budget_below_one_are_refused_before_any_run(tmp_path, capsys):
    from vitviz.__main__ import main

    for argv, message in ((["--families", ""], "families is empty"), (["--sizes", ","], "sizes is empty"),
                          (["--epochs", ""], "epochs and full_epochs are both empty")):  # a KeyError traceback
        assert main(["study", "hybrid-vs-pure", "--data", str(tmp_path / "none"), "--results",
                     str(tmp_path / "r.csv"), "--out", str(tmp_path / "runs"), "--no-progress", *argv]) == 2
        assert f"vitviz study: error: {message}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"epochs=\(2, 0\) \(--epochs\) holds \[0\]"):
        plan(StudyConfig(epochs=(2, 0)))
    with pytest.raises(ValueError, match=r"full_epochs=\(-16,\) \(--full-epochs\) holds \[-16\]"):
        plan(StudyConfig(full_epochs=(-16,)))
    assert main(["study", "hybrid-vs-pure", "--data", str(tmp_path / "none"), "--results", str(tmp_path),
                 "--out", str(tmp_path / "runs"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "(--results) is a folder; pass the CSV file" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("cut", ["in_a_cell", "at_a_comma"])
def test_a_cut_off_results_file_is_refused_not_read_as_done_runs(tmp_path, cut):
    """vitviz writes the study CSV whole, but a copy cut part-way ends in a short row. pandas filled its missing
    cells with NaN (its settings, so it passed for a row written before vitviz recorded them, with a warning) and
    kept its last cell cut short (a wall time of 12 s for 1234.5 s), and a rerun skipped that run as done. The
    file is refused, naming it, the line and the fix."""
    from vitviz.errors import CheckpointError

    header = "run_id,family,epochs,test_acc,wall_time_s,seed,recipe_digest\n"
    rows = "vit-S-e1-n200-s0,ViT,1,31.5,1234.5,0,0123abcd\nhybrid-S-e1-n200-s0,Hybrid,1,35.0,2345.5,0,4567ef01\n"
    whole = tmp_path / "whole.csv"
    whole.write_text(header + rows)
    assert study.read_results(whole).wall_time_s.tolist() == [1234.5, 2345.5]
    text = header + rows
    end = text.rindex("2345.5") + 2 if cut == "in_a_cell" else text.rindex(",0,4567")  # "23" / "...,2345.5"
    path = tmp_path / "cut.csv"
    path.write_text(text[:end])
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}.*line 3 holds [45] cells, its header 7.*cut "
                                              r"off.*delete that line"):
        study.read_results(path)
    with pytest.raises(CheckpointError, match="cut off"):  # before anything trains
        run_study(StudyConfig.smoke(results=str(path), out=str(tmp_path / "runs")), progress=False)
    path.write_text(text[:-1])  # every cell there, the last line not ended
    with pytest.raises(CheckpointError, match=r"its last line \(line 3\) is not ended"):
        study.read_results(path)
    path.write_text(text + "\n")  # a blank line: pandas skips it, and so does the check
    assert study.read_results(path).equals(study.read_results(whole))


def test_a_parallel_study_whose_worker_fails_is_refused_naming_it_not_written_as_complete(tmp_path, monkeypatch):
    """``run_parallel`` printed a failed worker's exit code and went on to merge and describe the study as if its runs
    were all there; it now raises ``RunInterrupted`` naming the worker and its log."""
    import subprocess

    import vitviz.experiments.data as data
    from vitviz.errors import RunInterrupted
    from vitviz.experiments import study

    cfg = StudyConfig(results=str(tmp_path / "r.csv"), sizes=("S",), epochs=(1,), seeds=(0,), full_epochs=())
    names = [g["name"] for g in study.worker_groups(cfg)]  # one part a family
    assert len(names) >= 2
    monkeypatch.setattr(data, "load_split", lambda *a, **k: None)  # no dataset decoded
    started = []

    class Worker:  # a worker process: the first exits with an error, the others finish with nothing to add
        def __init__(self, cmd, stdout=None, stderr=None):
            self.code = 3 if not started else 0
            started.append(cmd)

        def poll(self):
            return self.code

        @property
        def returncode(self):
            return self.code

    monkeypatch.setattr(subprocess, "Popen", Worker)
    monkeypatch.setattr("time.sleep", lambda s: None)
    with pytest.raises(RunInterrupted, match=rf"1 of {len(names)} study workers did not finish: {names[0]} \(exit 3; "
                                             rf"its log: .*{names[0]}\.log\).*run the same command again"):
        study.run_parallel(cfg, workers=2)
    assert len(started) == len(names)  # every part was started: a failure stops none of the others
    assert not (tmp_path / "r.json").exists()  # no run finished: no description written
