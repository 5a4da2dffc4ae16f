"""Training runner: end to end on a tiny dataset, bit-for-bit resume, corrupt state refused, export + card."""

from __future__ import annotations

import json

import pytest
import torch

import vitviz
from vitviz.checkpoints import CheckpointError
from vitviz.train import Interrupted, TrainConfig, lr_at, random_crop_flip, train


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

    from vitviz.cards import export_reference

    card = export_reference(cfg, tmp_path / "export")
    assert card["epochs"] == 2 and 0 <= card["test_top1"] <= 100 and card["test_images"] == 100
    assert card["architecture"]["kwargs"] == {"depth": 2}
    assert -1 <= card["pos_embed_locality"] <= 1
    assert card["versions"]["torch"] == torch.__version__
    model = vitviz.load_model(tmp_path / "export" / "cifar10-vit.safetensors", depth=2, device="cpu")
    assert vitviz.inspect(model).grid_size == (8, 8)


def test_resume_after_kill_mid_epoch_is_bit_identical(tmp_path, tiny_folder):
    straight = config(tmp_path / "a", tiny_folder, augment="trivialaugment")
    train(straight, progress=False)

    killed = config(tmp_path / "b", tiny_folder, augment="trivialaugment")

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
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert [r["test_acc"] for r in a["history"]] == [r["test_acc"] for r in b["history"]]


def test_resume_refuses_a_different_recipe(tmp_path, tiny_folder):
    train(config(tmp_path, tiny_folder, epochs=1), progress=False)
    with pytest.raises(ValueError, match="config differs.*lr"):
        train(config(tmp_path, tiny_folder, epochs=2, lr=5e-3), resume=True, progress=False)


def test_corrupt_training_state_is_refused(tmp_path, tiny_folder):
    cfg = config(tmp_path, tiny_folder, epochs=1)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "last.pt").write_bytes(b"\x80\x02 not a checkpoint")
    with pytest.raises(CheckpointError, match="last.pt.*corrupt"):
        train(cfg, resume=True, progress=False)


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
