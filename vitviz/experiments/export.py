"""Export a trained reference model: fp16 ``.safetensors`` plus its JSON card.

The card records what a reader needs to trust and reproduce the checkpoint: architecture, recipe, epochs, CIFAR-10
test top-1 on all test images and on the fixed 500-image subset (the first 50 test images of each class, in
file-name order), position-embedding locality, FLOPs per image, train wall time, hardware, seed, library versions
and the dataset. Accuracies are measured on the exported fp16 weights, i.e. on exactly what users load. Reading
cards is ``vitviz.zoo.cards``.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vitviz.core.io import atomic_write, atomic_write_json
from vitviz.errors import ComputeError
from vitviz.experiments.config import check_training_state
from vitviz.experiments.data import balanced_indices, load_split, run_fingerprint
from vitviz.zoo.cards import DATASET
from vitviz.zoo.reference import CIFAR10_INPUT, REFERENCE_MODELS, build_reference
from vitviz.zoo.weights import CARD_FORMAT, file_sha256, load_training_state, versions

SUBSET_SIZE = 500


def _locality(model: torch.nn.Module) -> float | None:
    """Spearman locality of the position embedding; ``None`` for models without one (ResNet, no-pos ViT)."""
    from vitviz.analysis.posembed import pos_embed_locality
    from vitviz.core.families import family_of
    from vitviz.errors import NotAViTError

    try:
        if family_of(model).pos_embed(model) is None:
            return None
    except NotAViTError:
        return None
    return round(float(pos_embed_locality(model)), 4)


def _training_hardware(cfg: Any) -> str:
    import json

    from vitviz.experiments.measure import device_description

    summary = cfg.run_dir / "summary.json"
    if summary.exists():
        return json.loads(summary.read_text())["device"]
    return device_description(torch.device("cpu"))


def export_reference(cfg: Any, dest: str | os.PathLike) -> dict[str, Any]:
    """Write ``<dest>/<model>.safetensors`` (fp16) and ``<dest>/<model>.json`` from ``cfg.run_dir/last.pt``.

    Args:
        cfg: the ``TrainConfig`` of the finished run.
        dest: folder for the checkpoint and card (``vitviz/zoo/checkpoints`` for the shipped ones).

    Returns:
        The card as a dict.
    """
    from safetensors.torch import save_file

    from vitviz.analysis.flops import count_flops
    from vitviz.experiments.measure import evaluate

    state = load_training_state(cfg.run_dir / "last.pt")
    check_training_state(state, cfg, run_fingerprint(cfg), cfg.run_dir / "last.pt")  # the card describes cfg, its data
    planned = state["config"]["epochs"]
    if planned != cfg.epochs:  # a snapshot of a longer schedule is not the run the card's recipe would describe
        raise ComputeError(f"{cfg.run_dir}/last.pt holds epoch {state['epoch']} of a {planned}-epoch schedule, not a "
                           f"{cfg.epochs}-epoch run: its learning rates followed the longer schedule. Export it as "
                           f"the {planned}-epoch run it is (finish it first), or train a {cfg.epochs}-epoch run in "
                           "another folder (--out)")
    if state["epoch"] < cfg.epochs:
        raise ComputeError(f"{cfg.run_dir}/last.pt holds epoch {state['epoch']} of {cfg.epochs}; finish it first "
                           "(python -m vitviz.experiments.train ... --resume)")
    dest = Path(dest)
    name = cfg.model
    half = {k: v.detach().to(torch.float16).contiguous() for k, v in state["model"].items()}
    target = dest / f"{name}.safetensors"
    atomic_write(target, lambda tmp: save_file(half, tmp, metadata={"vitviz.model": name, "format": "fp16"}))

    model = build_reference(name, **cfg.model_kwargs)
    model.load_state_dict(half)  # exactly what users load: fp16 values in fp32 parameters
    model.eval()
    device = torch.device("cpu")
    test = load_split(cfg, "test", None)
    subset = test.subset(balanced_indices(test.labels, SUBSET_SIZE))
    history = state["history"]
    card = {
        "format": CARD_FORMAT,
        "name": name,
        "file": str(target.name),
        "sha256": file_sha256(target),  # load_model refuses a file whose bytes differ
        "description": REFERENCE_MODELS[name].description,
        "architecture": {
            "builder": f"vitviz.zoo.reference.{REFERENCE_MODELS[name].factory.__name__}",
            "kwargs": {**REFERENCE_MODELS[name].kwargs, **cfg.model_kwargs},
            "parameters": sum(p.numel() for p in model.parameters()),
            "input_size": list(CIFAR10_INPUT),
        },
        "recipe": {k: v for k, v in asdict(cfg).items() if k not in ("data", "out", "device", "threads")},
        "epochs": state["epoch"],
        "train_images": len(load_split(cfg, "train", cfg.train_subset)),
        "test_top1": round(evaluate(model, test, device), 2),
        "test_images": len(test),
        "test_top1_subset500": round(evaluate(model, subset, device), 2),
        "subset500": "first 50 test images of each class in file-name order (test/<class>/0000-0049.jpg here)",
        "pos_embed_locality": _locality(model),
        "flops_per_image_forward": count_flops(model, CIFAR10_INPUT),
        "flops_per_image_train_step": count_flops(model, CIFAR10_INPUT, backward=True),
        "train_time_s": round(state["train_time"], 1),
        "hardware": _training_hardware(cfg),
        "seed": cfg.seed,
        "versions": versions(),
        "dataset": DATASET,
        "history": history,
        "exported": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_json(dest / f"{name}.json", card)
    return card
