"""Training runner for the reference models: ``python -m vitviz.experiments.train MODEL --data DIR [--epochs N] [--resume]``.

Recipe (the standard small-scale CIFAR one): random crop with 4 px zero padding and horizontal flips (optionally
TrivialAugment or RandAugment from torchvision), AdamW with linear warmup then cosine decay, label smoothing.
On CUDA: the decoded dataset lives on the GPU, augmentation runs there, losses and accuracies accumulate there
(one host sync per epoch, none per step), bf16 autocast, and ``torch.compile`` unless ``compile=False`` (small
models that train for seconds do not earn back the compile time). The dataset is decoded once into memory.

Every epoch writes ``<out>/<model>/last.pt`` atomically; ``--resume`` continues from it and reproduces the
uninterrupted run bit for bit (each epoch's shuffling, augmentation and dropout are seeded from ``(seed, epoch)``).
Metrics go to ``metrics.csv`` and ``metrics.json`` beside it; ``export`` writes the fp16 ``.safetensors`` plus a
JSON card (see ``vitviz.zoo.cards``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from vitviz.analysis.flops import count_flops
from vitviz.core.io import atomic_save, atomic_write_json, atomic_write_text
from vitviz.core.util import cli_errors
from vitviz.errors import InputError
from vitviz.errors import RunInterrupted as Interrupted  # noqa: F401  (the name step callbacks raise)
from vitviz.experiments.config import (
    TrainConfig,
    check_config,
    check_training_state,
    config_from_args,
    train_parser,
)
from vitviz.experiments.data import TensorDataset, load_split, split_fingerprint
from vitviz.experiments.measure import device_description, evaluate, normalize
from vitviz.zoo.models import resolve_device
from vitviz.zoo.reference import CIFAR10_INPUT, build_reference


def lr_at(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warmup from 0, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def random_crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Batched ``RandomCrop(size, padding)`` + ``RandomHorizontalFlip`` on ``(B, C, H, W)`` uint8 images.

    The random offsets and flips are drawn from ``generator`` (a CPU generator, so a run draws the same numbers on
    every device) and applied on the images' device.
    """
    b, c, h, w = images.shape
    dev = images.device
    padded = F.pad(images, (padding,) * 4)
    oy = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(dev, non_blocking=True)
    ox = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(dev, non_blocking=True)
    rows = (oy[:, None] + torch.arange(h, device=dev))[:, None, :, None]
    cols = (ox[:, None] + torch.arange(w, device=dev))[:, None, None, :]
    out = padded[torch.arange(b, device=dev)[:, None, None, None], torch.arange(c, device=dev)[None, :, None, None],
                 rows, cols]
    flip = (torch.rand(b, generator=generator) < 0.5).to(dev, non_blocking=True)
    return torch.where(flip[:, None, None, None], out.flip(-1), out)


def _policy(name: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    from torchvision.transforms import v2

    if name == "crop-flip":
        return None
    if name == "trivialaugment":
        return v2.TrivialAugmentWide()
    if name == "randaugment":
        return v2.RandAugment()
    raise InputError(f"unknown augment {name!r}; use crop-flip, trivialaugment or randaugment")


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip or name.startswith("pos_embed") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _write_metrics(run_dir: Path, history: list[dict[str, Any]]) -> None:
    atomic_write_json(run_dir / "metrics.json", history)
    if history:
        buf = io.StringIO()
        columns = list(dict.fromkeys(k for row in history for k in row))  # rows of older runners lack some
        writer = csv.DictWriter(buf, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(history)
        atomic_write_text(run_dir / "metrics.csv", buf.getvalue())


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    on_step: Callable[[int, int], None] | None = None,
    on_epoch: Callable[[int, nn.Module, dict[str, Any]], None] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``cfg.model``; return a summary (final metrics, FLOPs, wall time, run folder).

    Args:
        cfg: the run's configuration.
        resume: continue from ``<run_dir>/last.pt`` if present (its config must match ``cfg``); without it, a
            ``run_dir`` that holds a ``last.pt`` is refused rather than trained over.
        on_step: called as ``on_step(epoch, step_in_epoch)`` after every optimizer step.
        on_epoch: called as ``on_epoch(epoch, model, row)`` after each epoch's checkpoint is written (``epoch``
            counts from 1; ``row`` is that epoch's metrics), e.g. to keep every epoch's weights.
        progress: show tqdm progress bars.

    ``cfg.threads`` sets torch's CPU threads for the run only: the count the process had is restored on return,
    also when the run raises.
    """
    check_config(cfg)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, resume=resume, on_step=on_step, on_epoch=on_epoch, progress=progress)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: TrainConfig, *, resume: bool, on_step: Callable[[int, int], None] | None,
           on_epoch: Callable[[int, nn.Module, dict[str, Any]], None] | None, progress: bool) -> dict[str, Any]:
    """``train``'s run, on the thread count ``train`` set."""
    device = resolve_device(cfg.device)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    train_data = load_split(cfg, "train", cfg.train_subset)
    test_data = load_split(cfg, "test", cfg.test_subset)
    fingerprint = {"train": split_fingerprint(train_data), "test": split_fingerprint(test_data)}
    if device.type == "cuda":  # a few hundred MB at most: keep it on the GPU, gather batches there
        train_data = TensorDataset(train_data.images.to(device), train_data.labels.to(device), train_data.classes)
        test_data = TensorDataset(test_data.images.to(device), test_data.labels, test_data.classes)

    torch.manual_seed(cfg.seed)
    model = build_reference(cfg.model, **cfg.model_kwargs).to(device)
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.999))
    steps_per_epoch = math.ceil(len(train_data) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    warmup_steps = max(1, round(cfg.warmup_epochs * steps_per_epoch))
    policy = _policy(cfg.augment)

    start_epoch, history, train_time = 0, [], 0.0
    data_checked_from = 0  # the first epoch trained on data this run's fingerprint was checked against
    ckpt_path = run_dir / "last.pt"
    if not resume and ckpt_path.exists():  # a fresh run would replace it after its first epoch
        raise InputError(
            f"{run_dir} already holds a run ({ckpt_path.name}, with its metrics): training it again from scratch "
            "would overwrite the epochs it trained. Pass resume=True (--resume) to continue it, another folder "
            "(--out) for a new run, or delete the folder to start it over")
    if resume and ckpt_path.exists():
        from vitviz.zoo.weights import load_training_state

        state = load_training_state(ckpt_path)
        data_checked_from = check_training_state(state, cfg, fingerprint, ckpt_path)
        planned = state["config"]["epochs"]
        if state["epoch"] > cfg.epochs:  # its weights and metrics would pass for a shorter run's
            raise InputError(
                f"cannot resume {ckpt_path} as a {cfg.epochs}-epoch run: it already holds {state['epoch']} epochs "
                f"(of a {planned}-epoch schedule). Resume it with --epochs {planned}, or start the shorter run in "
                "another folder (--out)")
        if planned != cfg.epochs and state["epoch"] > cfg.warmup_epochs:
            # The cosine schedule depends on the total, so the epochs already trained followed another schedule;
            # only inside the linear warm-up (which does not depend on it) is the run the same.
            raise InputError(
                f"cannot resume {ckpt_path} as a {cfg.epochs}-epoch run: it holds {state['epoch']} epochs of a "
                f"{planned}-epoch schedule, past the {cfg.warmup_epochs:g}-epoch warm-up, so its learning rates "
                f"differ from a {cfg.epochs}-epoch run's. Resume it with --epochs {planned}, or start the longer "
                "run in another folder (--out)")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch, history, train_time = state["epoch"], state["history"], state["train_time"]
        _write_metrics(run_dir, history)  # a kill between last.pt and the metrics left them an epoch behind

    forward = model
    use_cuda = device.type == "cuda"
    if use_cuda and cfg.compile:
        forward = torch.compile(model)
    flops_fwd = count_flops(model, CIFAR10_INPUT)
    flops_train = count_flops(model, CIFAR10_INPUT, backward=True)

    here = device_description(device)
    for epoch in range(start_epoch, cfg.epochs):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
        torch.manual_seed(cfg.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(train_data), generator=gen).to(train_data.images.device)
        model.train()
        if use_cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        seen = 0
        bar = tqdm(range(steps_per_epoch), desc=f"{cfg.model} epoch {epoch + 1}/{cfg.epochs}", disable=not progress,
                   mininterval=1.0 if sys.stderr.isatty() else 30.0, leave=False)
        for i in bar:
            idx = perm[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            images = train_data.images[idx]
            if policy is not None:
                images = torch.stack([policy(im) for im in images])
            x = normalize(random_crop_flip(images, gen), device)
            y = train_data.labels[idx].to(device, non_blocking=True)
            step = epoch * steps_per_epoch + i
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total_steps, warmup_steps, cfg.lr, cfg.min_lr)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_cuda):
                logits = forward(x)
                loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * len(y)
            correct += (logits.argmax(-1) == y).sum()
            seen += len(y)
            if on_step is not None:
                on_step(epoch, i)
            if progress and not use_cuda:  # formatting reads the values: a host sync, so only off the GPU
                bar.set_postfix(loss=f"{loss_sum.item() / seen:.3f}", acc=f"{100 * correct.item() / seen:.1f}",
                                refresh=False)
        if use_cuda:
            torch.cuda.synchronize(device)
        epoch_time = time.perf_counter() - t0
        loss_sum, correct = loss_sum.item(), correct.item()
        train_time += epoch_time
        row = {
            "epoch": epoch + 1,
            "loss": round(loss_sum / seen, 5),
            "train_acc": round(100.0 * correct / seen, 3),
            "test_acc": round(evaluate(model, test_data, device), 3),
            "lr": opt.param_groups[0]["lr"],
            "images_per_s": round(seen / epoch_time, 1),
            "epoch_time_s": round(epoch_time, 2),
            "train_time_s": round(train_time, 2),
            "device": here,
        }
        history.append(row)
        if progress:
            tqdm.write(f"{cfg.model} epoch {row['epoch']}: loss {row['loss']:.4f} train {row['train_acc']:.2f}% "
                       f"test {row['test_acc']:.2f}% ({row['images_per_s']:.0f} img/s)")
        atomic_save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1, "history": history,
             "train_time": train_time, "config": asdict(cfg), "format": "vitviz-train-state-v1",
             "data_fingerprint": fingerprint, "data_checked_from": data_checked_from},
            ckpt_path,
        )
        _write_metrics(run_dir, history)
        if on_epoch is not None:
            on_epoch(epoch + 1, model, row)

    summary = {
        "model": cfg.model,
        "run_dir": str(run_dir),
        "epochs": cfg.epochs,
        "test_acc": history[-1]["test_acc"] if history else None,
        "train_time_s": round(train_time, 1),
        "flops_per_image_forward": flops_fwd,
        "flops_per_image_train": flops_train,
        "train_images": len(train_data),
        "test_images": len(test_data),
        "data_fingerprint": fingerprint,
        "device": _run_devices(history, run_dir, here),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    return summary


def _run_devices(history: list[dict[str, Any]], run_dir: Path, here: str) -> str:
    """The hardware that trained the run's epochs (``"; "``-joined when a resume moved it), not the one now.

    Epochs from runners that did not record a device take it from the run's previous ``summary.json``.
    """
    devices = [row["device"] for row in history if "device" in row]
    if len(devices) < len(history):
        previous = run_dir / "summary.json"
        try:
            devices.insert(0, json.loads(previous.read_text())["device"])
        except (OSError, ValueError, KeyError):
            devices.insert(0, "unrecorded")
    return "; ".join(dict.fromkeys(devices)) or here


@cli_errors("vitviz train")
def main(argv: list[str] | None = None) -> int:
    """``python -m vitviz.experiments.train`` (also ``vitviz train``)."""
    return run_from_args(train_parser().parse_args(argv))


def run_from_args(a: argparse.Namespace) -> int:
    """Train (and export) as the parsed command line says."""
    cfg = config_from_args(a)
    summary = train(cfg, resume=a.resume, progress=not a.no_progress)
    print(summary)
    if a.export:
        from vitviz.experiments.export import export_reference

        card = export_reference(cfg, a.export)
        print(f"exported {card['file']}: test top-1 {card['test_top1']:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
