"""Training runner: end to end on a tiny dataset, bit-for-bit resume, corrupt state refused, export + card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import vitviz
from vitviz.errors import CheckpointError, InputError
from vitviz.experiments.train import (
    Interrupted,
    TrainConfig,
    _run_devices,
    device_description,
    lr_at,
    random_crop_flip,
    train,
)


def config(tmp_path, data, **kw):
    args = dict(model="cifar10-vit", data=str(data), out=str(tmp_path), epochs=2, batch_size=32, warmup_epochs=0.5,
                model_kwargs={"depth": 2})
    args.update(kw)
    return TrainConfig(**args)


def test_tiny_run_end_to_end(tmp_path, tiny_folder):
    cfg = config(tmp_path, tiny_folder)
    summary = train(cfg, progress=False)
    assert summary["train_images"] == 300 and summary["test_images"] == 100
    assert summary["flops_per_image_train"] > 2 * summary["flops_per_image_forward"] > 0
    history = json.loads((cfg.run_dir / "metrics.json").read_text())
    assert [r["epoch"] for r in history] == [1, 2]
    assert history[-1]["loss"] < history[0]["loss"]
    assert {"loss", "train_acc", "test_acc", "images_per_s", "epoch_time_s"} <= set(history[0])
    assert (cfg.run_dir / "metrics.csv").read_text().startswith("epoch,loss,train_acc,test_acc")
    assert history[0]["device"] == history[1]["device"] == summary["device"]
    expected = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert summary["device"] == device_description(expected)

    from vitviz.experiments.export import export_reference

    card = export_reference(cfg, tmp_path / "export")
    assert card["epochs"] == 2 and 0 <= card["test_top1"] <= 100 and card["test_images"] == 100
    assert card["architecture"]["kwargs"] == {"depth": 2}
    assert -1 <= card["pos_embed_locality"] <= 1
    assert card["versions"]["torch"] == torch.__version__
    assert card["sha256"] == hashlib.sha256((tmp_path / "export" / "cifar10-vit.safetensors").read_bytes()).hexdigest()
    model = vitviz.load_model(tmp_path / "export" / "cifar10-vit.safetensors", depth=2, device="cpu")
    assert vitviz.inspect(model).grid_size == (8, 8)


@pytest.mark.parametrize("model", ["cifar10-vit", "cifar10-hybrid"])
def test_resume_after_kill_mid_epoch_is_bit_identical(tmp_path, tiny_folder, model):
    """Also for the hybrid, whose BatchNorm statistics a vitviz call on resume (``count_flops``) must not touch."""
    straight = config(tmp_path / "a", tiny_folder, augment="trivialaugment", model=model)
    train(straight, progress=False)

    killed = config(tmp_path / "b", tiny_folder, augment="trivialaugment", model=model)

    def kill(epoch, step):
        if epoch == 1 and step == 4:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(killed, on_step=kill, progress=False)
    assert torch.load(killed.run_dir / "last.pt", weights_only=True)["epoch"] == 1
    train(killed, resume=True, progress=False)

    a = torch.load(straight.run_dir / "last.pt", weights_only=True)
    b = torch.load(killed.run_dir / "last.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []
    assert [r["test_acc"] for r in a["history"]] == [r["test_acc"] for r in b["history"]]


def test_a_run_folder_that_holds_a_run_is_not_trained_over_without_resume(tmp_path, tiny_folder):
    """Forgetting --resume after a kill once started the run afresh and replaced its last.pt and metrics after the
    first epoch, exit status 0: the folder's run is refused instead, its files left as they were."""
    summary = train(config(tmp_path, tiny_folder, epochs=1), progress=False)
    run_dir = Path(summary["run_dir"])
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(InputError, match=r"already holds a run \(last.pt.*Pass resume=True \(--resume\)"):
        train(config(tmp_path, tiny_folder, epochs=1, lr=5e-3), progress=False)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_resume_refuses_a_different_recipe(tmp_path, tiny_folder):
    train(config(tmp_path, tiny_folder, epochs=1), progress=False)
    with pytest.raises(ValueError, match="config differs.*lr"):
        train(config(tmp_path, tiny_folder, epochs=2, lr=5e-3), resume=True, progress=False)
    # 1 epoch of a 1-epoch schedule is past the 0.5-epoch warm-up: a 2-epoch resume would not be a 2-epoch run
    with pytest.raises(ValueError, match="--epochs 1, or start the longer run in another folder"):
        train(config(tmp_path, tiny_folder, epochs=2), resume=True, progress=False)
    # inside the warm-up the schedules agree, so a longer run may continue it
    train(config(tmp_path / "w", tiny_folder, epochs=1, warmup_epochs=1.0), progress=False)
    summary = train(config(tmp_path / "w", tiny_folder, epochs=2, warmup_epochs=1.0), resume=True, progress=False)
    assert summary["epochs"] == 2


def test_corrupt_training_state_is_refused(tmp_path, tiny_folder):
    cfg = config(tmp_path, tiny_folder, epochs=1)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "last.pt").write_bytes(b"\x80\x02 not a checkpoint")
    # the fix for a run's own state: it cannot be downloaded again
    with pytest.raises(CheckpointError, match=r"last.pt.*corrupt.*delete it with the rest of the run folder .*to train the run again") as err:
        train(cfg, resume=True, progress=False)
    assert "download" not in str(err.value)


def test_missing_dataset_says_where_to_point(tmp_path, monkeypatch):
    monkeypatch.delenv("VITVIZ_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="VITVIZ_DATA"):
        train(TrainConfig(model="cifar10-vit", out=str(tmp_path)), progress=False)


def test_schedule_and_augmentation():
    lrs = [lr_at(s, 100, 10, 1e-3, 1e-5) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lr_at(100, 100, 10, 1e-3, 1e-5) == pytest.approx(1e-5)
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).reshape(2, 3, 8, 8)
    out = random_crop_flip(images, torch.Generator().manual_seed(0), padding=2)
    assert out.shape == images.shape and out.dtype == torch.uint8
    # every output pixel is an input pixel or zero padding
    assert set(out.unique().tolist()) <= set(images.unique().tolist()) | {0}


def test_card_tables_compare_the_ablation_fairly(tmp_path, tiny_folder, capsys):
    """reference_table and posemb_ablation_results read real exported cards; a changed recipe is flagged."""
    from vitviz.experiments.export import export_reference
    from vitviz.zoo.cards import posemb_ablation_results, reference_table

    export = tmp_path / "export"
    runs = (("cifar10-vit", {}), ("cifar10-vit-1dpos", {}), ("cifar10-vit-nopos", {}),
            ("cifar10-vit-2dpos", {"lr": 3e-3}))
    for name, kw in runs:
        cfg = config(tmp_path, tiny_folder, model=name, epochs=1, model_kwargs={"depth": 1}, **kw)
        train(cfg, progress=False)
        export_reference(cfg, export)

    table = posemb_ablation_results(export).set_index("model")
    assert list(table["pos_emb"]) == ["No Pos. Emb.", "1-D Pos. Emb.", "2-D Pos. Emb."]
    assert table["same_recipe_as_control"].tolist() == [True, True, False]
    assert table.loc["cifar10-vit-2dpos", "recipe_differences"] == "lr"
    assert table["locality"].isna().tolist() == [True, False, False]
    assert list(table.index) == ["cifar10-vit-nopos", "cifar10-vit-1dpos", "cifar10-vit-2dpos"]
    assert table.loc["cifar10-vit-nopos", "paper_5shot"] < table.loc["cifar10-vit-1dpos", "paper_5shot"]
    cards = {p.stem: json.loads(p.read_text()) for p in export.glob("*.json")}
    assert table.loc["cifar10-vit-1dpos", "test_top1"] == cards["cifar10-vit-1dpos"]["test_top1"]

    ref = reference_table(export).set_index("model")
    assert ref.loc["cifar10-vit", "trained"] and not ref.loc["cifar10-hybrid", "trained"]
    assert ref.loc["cifar10-vit", "floor"] == 78.0
    assert bool(ref.loc["cifar10-vit", "meets_floor"]) is (cards["cifar10-vit"]["test_top1"] >= 78.0)
    assert ref["meets_floor"].isna()[["cifar10-vit-nopos", "cifar10-hybrid"]].all()

    # the compute axis: only cifar10-vit of the three families is trained; 300 images x 1 epoch
    from vitviz.zoo.cards import reference_compute

    comp = reference_compute(export)
    assert comp["model"].tolist() == ["cifar10-vit"] and comp["family"].tolist() == ["Transformer (ViT)"]
    card = cards["cifar10-vit"]
    assert card["train_images"] == 300 and comp.loc[0, "images_seen"] == 300
    assert comp.loc[0, "train_pflops"] == pytest.approx(card["flops_per_image_train_step"] * 300 / 1e15)
    assert comp.loc[0, "test_acc"] == card["test_top1"]
    fig = vitviz.plot_compute_curves(comp, metrics=("test_acc",), x="train_pflops", ylabel="Test accuracy [%]")
    assert fig.axes[0].get_ylabel() == "Test accuracy [%]"
    import matplotlib.pyplot as plt

    plt.close(fig)
    # an older card without train_images: a subset recipe says how many; a full CIFAR-10 run is 50,000
    old = {k: v for k, v in card.items() if k != "train_images"}
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    (old_dir / "cifar10-vit.json").write_text(json.dumps({**old, "recipe": {**old["recipe"], "train_subset": 120}}))
    assert reference_compute(old_dir).loc[0, "train_images"] == 120
    from vitviz.zoo.cards import DATASET

    (old_dir / "cifar10-vit.json").write_text(json.dumps({**old, "dataset": DATASET}))
    assert reference_compute(old_dir).loc[0, "images_seen"] == 50_000 * card["epochs"]
    (old_dir / "cifar10-vit.json").write_text(json.dumps({**old, "dataset": "my own images"}))
    with pytest.raises(ValueError, match="how many training images"):
        reference_compute(old_dir)

    from vitviz.__main__ import main

    assert main(["models", "--checkpoints", str(export)]) == 0
    out = capsys.readouterr().out
    assert "| cifar10-vit-2dpos | True |" in out and "| No Pos. Emb. | cifar10-vit-nopos | True | 1 |" in out
    assert "| cifar10-hybrid | False |" in out

    fig = vitviz.plot_posemb_ablation_grid(export)
    curves, paper = fig.axes
    labels = [line.get_label() for line in curves.get_lines() if not line.get_label().startswith("_")]
    assert [label.split(" (")[0] for label in labels] == ["None", "1-D", "2-D"]
    # the 2-D card's lr differs from its control's: the title says so, not "one recipe"
    assert curves.get_title().endswith("\nUNEQUAL recipes: lr differ, 1 epoch") and "5-shot" in paper.get_ylabel()
    plt.close(fig)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="make train-reference"):
        vitviz.plot_posemb_ablation_grid(tmp_path / "empty")
    # a folder that is not there (a typo) is named as such, not read as "no model trained"
    for missing in (tmp_path / "typo", export / "cifar10-vit-2dpos.json"):
        with pytest.raises(FileNotFoundError, match=r"directory=.*(not there|a file), not a folder of cards"):
            reference_table(missing)

    (export / "cifar10-vit-2dpos.json").write_text('{"format": "vitviz-reference-card-v1", "name": ')
    with pytest.raises(CheckpointError, match="cifar10-vit-2dpos.json.*export it again"):
        reference_table(export)


def test_summary_names_the_hardware_that_trained_the_epochs(tmp_path):
    """A resume on other hardware (or a no-op resume to export) must not relabel the epochs already trained."""
    rows = [{"epoch": 1}, {"epoch": 2}]  # a runner that did not record devices
    (tmp_path / "summary.json").write_text(json.dumps({"device": "CPU: old box"}))
    assert _run_devices(rows, tmp_path, "GPU: new box") == "CPU: old box"
    rows.append({"epoch": 3, "device": "GPU: new box"})
    assert _run_devices(rows, tmp_path, "GPU: new box") == "CPU: old box; GPU: new box"
    assert _run_devices([{"epoch": 1}], tmp_path / "nowhere", "x") == "unrecorded"
    assert _run_devices([], tmp_path, "here") == "here"


def test_a_run_killed_between_its_last_checkpoint_and_its_metrics_gets_them_on_resume(tmp_path, tiny_folder,
                                                                                     monkeypatch):
    """``last.pt`` of the final epoch is written before ``metrics.json``/``.csv``: a resume that has no epoch left to
    train must still write the metrics of the epochs the checkpoint holds."""
    import vitviz.experiments.train as runner

    cfg = config(tmp_path, tiny_folder, epochs=1)

    def killed(run_dir, history):
        raise Interrupted

    monkeypatch.setattr(runner, "_write_metrics", killed)
    with pytest.raises(Interrupted):
        train(cfg, progress=False)
    monkeypatch.undo()
    assert torch.load(cfg.run_dir / "last.pt", weights_only=True)["epoch"] == 1
    assert not (cfg.run_dir / "metrics.json").exists()
    summary = train(cfg, resume=True, progress=False)
    history = json.loads((cfg.run_dir / "metrics.json").read_text())
    assert [r["epoch"] for r in history] == [1] and history[0]["test_acc"] == summary["test_acc"]
    assert (cfg.run_dir / "metrics.csv").read_text().splitlines()[1].startswith("1,")


def _copy_with_one_image_changed(src, dst, split="train"):
    """A copy of the ImageFolder tree ``src`` at ``dst``, one ``split`` image replaced by another class's image."""
    import shutil

    shutil.copytree(src, dst)
    shutil.copyfile(dst / split / "class1" / "0000.jpg", dst / split / "class0" / "0003.jpg")
    return dst


def test_resume_refuses_another_dataset_and_follows_a_moved_one(tmp_path, tiny_folder):
    """The dataset's path does not count (it moves between machines); what the run trains and tests on does."""
    import shutil

    train(config(tmp_path / "runs", tiny_folder, epochs=1), progress=False)
    state = torch.load(tmp_path / "runs" / "cifar10-vit" / "last.pt", weights_only=True)
    assert set(state["data_fingerprint"]) == {"train", "test"} and state["data_checked_from"] == 0
    for split in ("train", "test"):
        other = _copy_with_one_image_changed(tiny_folder, tmp_path / f"other-{split}", split)
        with pytest.raises(ValueError, match=rf"its {split} split differs .*images: saved .*another folder \(--out\)"):
            train(config(tmp_path / "runs", other, epochs=1), resume=True, progress=False)
    relabelled = tmp_path / "relabelled"
    shutil.copytree(tiny_folder, relabelled)
    (relabelled / "train" / "class9").rename(relabelled / "train" / "classZ")
    with pytest.raises(ValueError, match="its train split differs .*classes: saved"):
        train(config(tmp_path / "runs", relabelled, epochs=1), resume=True, progress=False)
    moved = tmp_path / "moved"
    shutil.copytree(tiny_folder, moved)  # the same images elsewhere: a resume continues
    summary = train(config(tmp_path / "runs", moved, epochs=1), resume=True, progress=False)
    assert summary["data_fingerprint"] == state["data_fingerprint"]
    # the subsets select what is trained on: another subset is another run
    with pytest.raises(ValueError, match="config differs.*test_subset"):
        train(config(tmp_path / "runs", moved, epochs=1, test_subset=50), resume=True, progress=False)


def stopped_after_one_epoch(tmp_path, data):
    """A 2-epoch run stopped after its first epoch: its config, its ``last.pt`` and the state read from it."""
    cfg = config(tmp_path, data, epochs=2, warmup_epochs=1.0)

    def stop(epoch, step):
        if epoch == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(cfg, on_step=stop, progress=False)
    path = cfg.run_dir / "last.pt"
    return cfg, path, torch.load(path, weights_only=True)


def test_a_state_without_a_data_fingerprint_resumes_with_a_warning_that_stays(tmp_path, tiny_folder):
    """A ``last.pt`` written before the data were fingerprinted is resumed, with a warning naming it, also later."""
    cfg, path, state = stopped_after_one_epoch(tmp_path, tiny_folder)
    del state["data_fingerprint"], state["data_checked_from"]
    torch.save(state, path)
    with pytest.warns(UserWarning, match=r"last\.pt was written before vitviz recorded the data.*could not be checked"):
        train(cfg, resume=True, progress=False)
    after = torch.load(path, weights_only=True)
    assert after["epoch"] == 2 and after["data_checked_from"] == 1
    with pytest.warns(UserWarning, match=r"last\.pt: its first 1 epochs were trained before vitviz recorded"):
        train(cfg, resume=True, progress=False)


def test_a_state_written_before_a_setting_existed_resumes_only_with_its_default(tmp_path, tiny_folder):
    """A ``last.pt`` whose config lacks a field TrainConfig has now was trained as that field's default says: only
    fields the state held were compared, so resuming it with another value went through without a word. It is
    refused, naming the field, its default and the value given; with the default it resumes."""
    cfg, path, state = stopped_after_one_epoch(tmp_path, tiny_folder)
    assert state["config"]["label_smoothing"] == 0.1  # the default, which an older state did not record
    del state["config"]["label_smoothing"]
    torch.save(state, path)
    with pytest.raises(InputError, match=r"written before vitviz had the settings \['label_smoothing'\].*"
                                         r"\(default, now\): \{'label_smoothing': \(0\.1, 0\.2\)\}"):
        train(config(tmp_path, tiny_folder, epochs=2, warmup_epochs=1.0, label_smoothing=0.2), resume=True,
              progress=False)
    assert train(cfg, resume=True, progress=False)["epochs"] == 2


def test_export_refuses_a_state_trained_otherwise_than_its_card_would_say(tmp_path, tiny_folder):
    """The card is written from ``cfg`` and its data: a ``last.pt`` of another recipe or dataset is not exported."""
    from vitviz.experiments.export import export_reference

    train(config(tmp_path, tiny_folder, epochs=1, model_kwargs={"depth": 1}), progress=False)
    other = _copy_with_one_image_changed(tiny_folder, tmp_path / "other")
    with pytest.raises(ValueError, match="its train split differs"):
        export_reference(config(tmp_path, other, epochs=1, model_kwargs={"depth": 1}), tmp_path / "export")
    with pytest.raises(ValueError, match="config differs.*lr"):
        export_reference(config(tmp_path, tiny_folder, epochs=1, lr=5e-3, model_kwargs={"depth": 1}),
                         tmp_path / "export")
    assert not (tmp_path / "export").exists()
    card = export_reference(config(tmp_path, tiny_folder, epochs=1, model_kwargs={"depth": 1}), tmp_path / "export")
    assert card["recipe"]["lr"] == 1e-3


def test_the_command_line_prints_a_refusal_without_a_traceback(tmp_path, tiny_folder, capsys, monkeypatch):
    """A refused resume is a usage error: one line on stderr, exit status 2; other faults keep their traceback."""
    from vitviz.__main__ import main
    from vitviz.experiments.train import main as train_main

    args = ["--data", str(tiny_folder), "--out", str(tmp_path), "--epochs", "1", "--no-progress"]
    assert main(["train", "cifar10-vit", *args]) == 0
    capsys.readouterr()
    for entry, argv in ((main, ["train", "cifar10-vit", *args]), (train_main, ["cifar10-vit", *args])):
        assert entry([*argv, "--resume", "--lr", "5e-3"]) == 2
        err = capsys.readouterr().err
        assert "error: cannot resume" in err and "config differs" in err and "Traceback" not in err
    monkeypatch.setenv("VITVIZ_TRACEBACK", "1")
    with pytest.raises(ValueError, match="config differs"):
        main(["train", "cifar10-vit", *args, "--resume", "--lr", "5e-3"])
    monkeypatch.delenv("VITVIZ_TRACEBACK")
    with pytest.raises(RuntimeError, match="not a refusal"):  # not a vitviz error: the traceback stays
        from vitviz.core.util import cli_errors

        cli_errors("vitviz")(lambda: (_ for _ in ()).throw(RuntimeError("not a refusal")))()


def test_resume_refuses_a_state_past_the_epochs_asked_for(tmp_path, tiny_folder):
    """Inside the warm-up a run may continue as a longer one; as a shorter one it returned the later epoch's
    accuracy and weights labelled with the fewer epochs (the loop ran no epoch)."""
    kw = dict(epochs=2, warmup_epochs=3.0, train_subset=10, test_subset=10, batch_size=10,
              model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2})
    train(config(tmp_path, tiny_folder, **kw), progress=False)
    with pytest.raises(ValueError, match=r"as a 1-epoch run: it already holds 2 epochs .*--epochs 2"):
        train(config(tmp_path, tiny_folder, **{**kw, "epochs": 1}), resume=True, progress=False)


def test_one_seed_draws_the_same_batches_and_augmentations_in_every_family(tmp_path, tiny_folder, monkeypatch):
    """What ``vitviz.experiments.compare`` pairs by seed: each epoch's order, crops and flips come from a generator
    seeded by (seed, epoch) alone, so a seed's runs of the ViT and the hybrid see the same training batches."""
    import vitviz.experiments.train as runner

    seen: dict[str, list[torch.Tensor]] = {}

    def record(name):
        def crop_flip(images, generator, padding=4):
            out = random_crop_flip(images, generator, padding)
            seen.setdefault(name, []).append(out.clone())
            return out
        return crop_flip

    def stop(epoch, step):
        if step == 1:
            raise Interrupted

    monkeypatch.setattr(runner, "count_flops", lambda *a, **k: 0)  # not what this test is about
    batches = {}
    for name, seed in (("cifar10-vit", 0), ("cifar10-hybrid", 0), ("cifar10-vit", 1)):
        monkeypatch.setattr(runner, "random_crop_flip", record(f"{name}-{seed}"))
        small = {"depth": 1, "embed_dim": 32, "num_heads": 2, **({"stem_widths": (4, 8, 8)} if name == "cifar10-hybrid" else {})}
        cfg = config(tmp_path / f"{name}-{seed}", tiny_folder, model=name, seed=seed, train_subset=20,
                     test_subset=10, batch_size=4, model_kwargs=small, cache=str(tmp_path / "cache"))
        with pytest.raises(Interrupted):
            train(cfg, on_step=stop, progress=False)
        batches[name, seed] = seen[f"{name}-{seed}"]
    assert len(batches["cifar10-vit", 0]) == 2
    assert all(torch.equal(v, h) for v, h in zip(batches["cifar10-vit", 0], batches["cifar10-hybrid", 0]))
    assert not torch.equal(batches["cifar10-vit", 0][0], batches["cifar10-vit", 1][0])  # another seed: others


def test_export_refuses_a_snapshot_of_a_longer_schedule(tmp_path, tiny_folder):
    """Epoch 2 of a 4-epoch run (past its warm-up) was exported as a finished 2-epoch run: the card's recipe said 2
    epochs of cosine decay, the weights had followed the 4-epoch schedule."""
    from dataclasses import asdict

    from vitviz.errors import ComputeError
    from vitviz.experiments.data import run_fingerprint
    from vitviz.experiments.export import export_reference
    from vitviz.zoo.reference import build_reference

    kw = dict(train_subset=10, test_subset=10, model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2})
    longer, shorter = config(tmp_path, tiny_folder, epochs=4, **kw), config(tmp_path, tiny_folder, epochs=2, **kw)
    longer.run_dir.mkdir(parents=True)
    model = build_reference(longer.model, **longer.model_kwargs)
    torch.save({"format": "vitviz-train-state-v1", "config": asdict(longer), "epoch": 2, "model": model.state_dict(),
                "history": [], "train_time": 0.0, "data_fingerprint": run_fingerprint(longer)},
               longer.run_dir / "last.pt")
    with pytest.raises(ComputeError, match="holds epoch 2 of a 4-epoch schedule, not a 2-epoch run"):
        export_reference(shorter, tmp_path / "export")
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "argument --epochs: 0 is not a positive count"),
    (["--epochs", "-1"], "argument --epochs: -1 is not a positive count"),
    (["--batch-size", "0"], "argument --batch-size: 0 is not a positive count"),
    (["--train-subset", "-5"], "argument --train-subset: -5 is not a positive count"),
    (["--test-subset", "0"], "argument --test-subset: 0 is not a positive count"),
    (["--threads", "-1"], "argument --threads: -1 is not a positive count"),
    (["--epochs", "two"], "argument --epochs: 'two' is not a whole number"),
])
def test_the_command_line_refuses_a_count_below_one(argv, message, capsys):
    """``--epochs 0`` and ``-1`` wrote a run of no epochs and exited 0, ``--batch-size 0`` raised ZeroDivisionError,
    ``--train-subset -5`` trained on all but one image of half the classes (25,000 CIFAR-10 images)."""
    from vitviz.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "cifar10-vit", "--data", "nowhere", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_train_refuses_a_config_no_run_can_follow_before_reading_data(tmp_path, capsys):
    """The Python call (and every runner built on it: the study, cls_vs_gap) is held to the same counts; an ``out``
    that is a file, or lies under one, is named instead of failing with NotADirectoryError."""
    from vitviz.__main__ import main
    from vitviz.errors import InputError

    data = tmp_path / "no-data-here"  # never read: each refusal comes first
    for kw, message in ((dict(train_subset=-5), r"train_subset=-5 \(--train-subset\) is not a positive int"),
                        (dict(epochs=0), r"epochs=0 \(--epochs\) is not a positive int"),
                        (dict(batch_size=0), r"batch_size=0 \(--batch-size\) is not a positive int"),
                        (dict(threads=0), r"threads=0 \(--threads\) is not a positive int")):
        with pytest.raises(InputError, match=message):
            train(config(tmp_path, data, **kw), progress=False)
    file = tmp_path / "a-file"
    file.write_text("")
    for out in (file, file / "below"):
        with pytest.raises(InputError, match=r"\(--out\): .*a-file' is a file, not a folder"):
            train(config(out, data), progress=False)
    assert main(["train", "cifar10-vit", "--data", str(data), "--out", str(file), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error: out=" in err and "is a file" in err and "Traceback" not in err


def test_threads_are_the_runs_only(tmp_path, tiny_folder):
    """``threads=`` set torch's CPU threads for the rest of the process (a notebook's later work ran on them)."""
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    train(config(tmp_path, tiny_folder, epochs=1, threads=other, train_subset=50, test_subset=20), progress=False)
    assert torch.get_num_threads() == before
    with pytest.raises(InputError):  # a run that raises (its folder holds another run) restores them too
        train(config(tmp_path, tiny_folder, epochs=1, threads=other, train_subset=60, test_subset=20),
              resume=True, progress=False)
    assert torch.get_num_threads() == before


TRAIN_CHILD = """
import time
from vitviz.experiments.train import TrainConfig, train
cfg = TrainConfig(**{cfg!r})
train(cfg, progress=False, on_step=lambda epoch, step: time.sleep(0.1))  # slow enough to be killed in epoch 2
"""


def test_a_run_killed_for_real_resumes_bit_identical(tmp_path, tiny_folder):
    """SIGKILL in a subprocess once the first epoch's last.pt is written; a resume in another process trains the
    same weights and metrics as the run never killed."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from dataclasses import asdict

    # one thread in both processes: CPU reductions split over another thread count round otherwise (and the
    # parent's count is whatever the tests before this one left), which is not what this test asks about
    threads = torch.get_num_threads()
    killed = config(tmp_path / "b", tiny_folder, augment="trivialaugment", epochs=2, threads=1)
    script = tmp_path / "child.py"
    script.write_text(TRAIN_CHILD.format(cfg=asdict(killed)))
    child = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL)
    try:
        while child.poll() is None and not (killed.run_dir / "last.pt").exists():
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert torch.load(killed.run_dir / "last.pt", weights_only=True)["epoch"] == 1
    try:
        train(killed, resume=True, progress=False)
        straight = config(tmp_path / "a", tiny_folder, augment="trivialaugment", epochs=2, threads=1)
        train(straight, progress=False)
    finally:
        torch.set_num_threads(threads)
    a = torch.load(straight.run_dir / "last.pt", weights_only=True)
    b = torch.load(killed.run_dir / "last.pt", weights_only=True)
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []
    assert [r["test_acc"] for r in a["history"]] == [r["test_acc"] for r in b["history"]]
