"""Export a trained reference model: fp16 ``.safetensors`` plus its JSON card.

The card records what a reader needs to trust and reproduce the checkpoint: architecture, recipe, epochs, CIFAR-10
test top-1 on all test images and on the fixed 500-image subset (the first 50 test images of each class, in
file-name order), position-embedding locality, FLOPs per image, train wall time, hardware, seed, library versions
and the dataset. Accuracies are measured on the exported fp16 weights, i.e. on exactly what users load.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vitviz._io import atomic_write, atomic_write_json
from vitviz.checkpoints import CARD_FORMAT, load_training_state, versions
from vitviz.data import balanced_indices
from vitviz.reference import REFERENCE_MODELS, build_reference

if TYPE_CHECKING:
    import pandas as pd

SUBSET_SIZE = 500
DATASET = (
    "CIFAR-10 (Krizhevsky, 2009, 'Learning Multiple Layers of Features from Tiny Images'): 50,000 train and "
    "10,000 test 32x32 RGB images in 10 classes, read as JPEG files in ImageFolder layout (JPEG re-encoding "
    "shifts pixel values slightly against the original binary release)"
)


def _locality(model: torch.nn.Module) -> float | None:
    """Spearman locality of the position embedding; ``None`` for models without one (ResNet, no-pos ViT)."""
    from vitviz.families import NotAViTError, family_of
    from vitviz.posembed import pos_embed_locality

    try:
        if family_of(model).pos_embed(model) is None:
            return None
    except NotAViTError:
        return None
    return round(float(pos_embed_locality(model)), 4)


def _training_hardware(cfg: Any) -> str:
    import json

    from vitviz.train import device_description

    summary = cfg.run_dir / "summary.json"
    if summary.exists():
        return json.loads(summary.read_text())["device"]
    return device_description(torch.device("cpu"))


def export_reference(cfg: Any, dest: str | os.PathLike) -> dict[str, Any]:
    """Write ``<dest>/<model>.safetensors`` (fp16) and ``<dest>/<model>.json`` from ``cfg.run_dir/last.pt``.

    Args:
        cfg: the ``TrainConfig`` of the finished run.
        dest: folder for the checkpoint and card (``data/checkpoints`` for the shipped ones).

    Returns:
        The card as a dict.
    """
    from safetensors.torch import save_file

    from vitviz.flops import count_flops
    from vitviz.train import _load_split, evaluate

    state = load_training_state(cfg.run_dir / "last.pt")
    if state["epoch"] < cfg.epochs:
        raise RuntimeError(f"{cfg.run_dir}/last.pt holds epoch {state['epoch']} of {cfg.epochs}; finish it first "
                           "(python -m vitviz.train ... --resume)")
    dest = Path(dest)
    name = cfg.model
    half = {k: v.detach().to(torch.float16).contiguous() for k, v in state["model"].items()}
    target = dest / f"{name}.safetensors"
    atomic_write(target, lambda tmp: save_file(half, tmp, metadata={"vitviz.model": name, "format": "fp16"}))

    model = build_reference(name, **cfg.model_kwargs)
    model.load_state_dict(half)  # exactly what users load: fp16 values in fp32 parameters
    model.eval()
    device = torch.device("cpu")
    test = _load_split(cfg, "test", None)
    subset = test.subset(balanced_indices(test.labels, SUBSET_SIZE))
    history = state["history"]
    card = {
        "format": CARD_FORMAT,
        "name": name,
        "file": str(target.name),
        "description": REFERENCE_MODELS[name].description,
        "architecture": {
            "builder": f"vitviz.reference.{REFERENCE_MODELS[name].factory.__name__}",
            "kwargs": {**REFERENCE_MODELS[name].kwargs, **cfg.model_kwargs},
            "parameters": sum(p.numel() for p in model.parameters()),
            "input_size": [3, 32, 32],
        },
        "recipe": {k: v for k, v in asdict(cfg).items() if k not in ("data", "out", "device", "threads")},
        "epochs": state["epoch"],
        "train_images": len(_load_split(cfg, "train", cfg.train_subset)),
        "test_top1": round(evaluate(model, test, device), 2),
        "test_images": len(test),
        "test_top1_subset500": round(evaluate(model, subset, device), 2),
        "subset500": "first 50 test images of each class in file-name order (test/<class>/0000-0049.jpg here)",
        "pos_embed_locality": _locality(model),
        "flops_per_image_forward": count_flops(model),
        "flops_per_image_train_step": count_flops(model, backward=True),
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


def read_cards(directory: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The JSON cards of the shipped reference checkpoints, by model name (``{}`` when none are there).

    Args:
        directory: folder of the cards; default ``vitviz.checkpoints.checkpoint_dir()`` (``$VITVIZ_CHECKPOINTS`` or
            the repository's ``data/checkpoints``).

    Raises:
        CheckpointError: a card is not valid JSON or is not a vitviz reference card.
    """
    import json

    from vitviz.checkpoints import CheckpointError, checkpoint_dir

    folder = Path(directory) if directory is not None else checkpoint_dir()
    cards = {}
    for path in sorted(folder.glob("*.json")):
        try:
            card = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"cannot read the card {str(path)!r} ({err}); export it again with "
                                  "`python -m vitviz.train MODEL --resume --export DIR`") from err
        if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
            raise CheckpointError(f"{str(path)!r} is not a vitviz reference card (format {CARD_FORMAT!r} expected)")
        cards[card["name"]] = card
    return cards


def _hours(seconds: float | None) -> float:
    return round(seconds / 3600, 2) if seconds is not None else float("nan")


def reference_table(directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """One row per reference model, trained or not: what its card says, and whether it meets its floor.

    Returns:
        DataFrame with ``model``, ``trained`` (a card is there), ``description``, ``params``, ``test_top1`` (%, all
        10,000 test images), ``test_top1_subset500``, ``floor`` (%; NaN for the ablation models, which are held to
        their control's budget instead), ``meets_floor`` (NA without a floor or a card), ``locality``,
        ``epochs``, ``train_hours``, ``gflops_forward`` (per image) and ``hardware``.
    """
    import pandas as pd

    cards = read_cards(directory)
    rows = []
    for name, ref in REFERENCE_MODELS.items():
        card = cards.get(name)
        top1 = card["test_top1"] if card else float("nan")
        rows.append({
            "model": name,
            "trained": card is not None,
            "description": ref.description,
            "params": card["architecture"]["parameters"] if card else pd.NA,
            "test_top1": top1,
            "test_top1_subset500": card["test_top1_subset500"] if card else float("nan"),
            "floor": ref.floor if ref.floor is not None else float("nan"),
            "meets_floor": (top1 >= ref.floor) if (card and ref.floor is not None) else pd.NA,
            "locality": (card["pos_embed_locality"] if card and card["pos_embed_locality"] is not None
                         else float("nan")),
            "epochs": card["epochs"] if card else pd.NA,
            "train_hours": _hours(card["train_time_s"]) if card else float("nan"),
            "gflops_forward": round(card["flops_per_image_forward"] / 1e9, 4) if card else float("nan"),
            "hardware": card["hardware"] if card else "",
        })
    return pd.DataFrame(rows)


CIFAR10_TRAIN_IMAGES = 50_000


def _train_images(card: dict[str, Any]) -> int:
    """Training images per epoch: the card's ``train_images``, else the full CIFAR-10 train split (older cards)."""
    if "train_images" in card:
        return int(card["train_images"])
    subset = card["recipe"].get("train_subset")
    if subset is None and card.get("dataset") == DATASET:
        return CIFAR10_TRAIN_IMAGES
    if subset is not None:
        return int(subset)
    raise ValueError(f"the card of {card['name']} does not say how many training images it saw; export it again")


def reference_compute(directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """The trained ViT, hybrid and ResNet reference models as points on the study's compute axis.

    Same columns as ``vitviz.study.read_results()`` (``family``, ``model``, ``epochs``, ``params``,
    ``flops_train_per_image``, ``train_images``, ``images_seen``, ``train_pflops``, ``test_acc``, ``test_images``,
    ``wall_time_s``), so ``plot_compute_curves(df, metrics=("test_acc",), x="train_pflops")`` draws them. Unlike the
    sweep (a subset of the training images, a subset of the test images), these are full CIFAR-10 runs measured on
    all 10,000 test images: plot them beside the sweep, not on the same curves. Models without a card are left out.
    """
    import pandas as pd

    from vitviz.study import FAMILIES  # the study's family labels, so both tables draw in the same style

    cards = read_cards(directory)
    rows = []
    for name, family in FAMILIES.values():
        card = cards.get(name)
        if card is None:
            continue
        images = _train_images(card)
        seen = images * card["epochs"]
        rows.append({
            "run_id": name, "family": family, "model": name, "epochs": card["epochs"],
            "params": card["architecture"]["parameters"],
            "flops_train_per_image": card["flops_per_image_train_step"],
            "flops_forward_per_image": card["flops_per_image_forward"],
            "train_images": images, "images_seen": seen,
            "train_pflops": card["flops_per_image_train_step"] * seen / 1e15,
            "test_acc": card["test_top1"], "test_images": card["test_images"],
            "wall_time_s": card["train_time_s"],
        })
    columns = ["run_id", "family", "model", "epochs", "params", "flops_train_per_image", "flops_forward_per_image",
               "train_images", "images_seen", "train_pflops", "test_acc", "test_images", "wall_time_s"]
    return pd.DataFrame(rows, columns=columns)


def _recipe_difference(card: dict[str, Any], control: dict[str, Any]) -> list[str]:
    """Recipe fields (other than the model name) in which ``card`` differs from ``control``."""
    a, b = card["recipe"], control["recipe"]
    return sorted(k for k in set(a) | set(b) if k != "model" and a.get(k) != b.get(k))


def posemb_ablation_results(directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """The CIFAR-10 position-embedding ablation beside the paper's Table 8: none, 1-D and 2-D, side by side.

    Each row is one reference model: ``cifar10-vit-nopos``, ``cifar10-vit-1dpos`` (the 1-D control) and
    ``cifar10-vit-2dpos``, identical except for the position embedding. The control is a model of its own so that
    the default ``cifar10-vit`` (same architecture) can be trained for longer without breaking the comparison.

    Returns:
        DataFrame with ``pos_emb`` (the Table 8 row), ``model``, ``trained``, ``epochs``, ``test_top1`` (%, all
        10,000 test images, the exported fp16 weights), ``locality``, ``same_recipe_as_control`` (the training
        recipe, epochs included, equals the 1-D control's except for the model name; NA when either card is
        missing), ``recipe_differences`` (the fields that differ) and ``paper_5shot`` (Table 8, ViT-B/16 ImageNet 5-shot linear accuracy, as a fraction).
    """
    import pandas as pd

    from vitviz.paper import TABLE8_ROW_FOR_KIND, posemb_ablation

    paper = posemb_ablation().set_index("pos_emb")["default_stem"]
    cards = read_cards(directory)
    control_name = REFERENCE_MODELS["cifar10-vit-nopos"].control
    members = [("none", "cifar10-vit-nopos"), ("learned", control_name), ("learned-2d", "cifar10-vit-2dpos")]
    control = cards.get(control_name)
    rows = []
    for kind, name in members:
        card = cards.get(name)
        row_name = TABLE8_ROW_FOR_KIND[kind]
        diff = _recipe_difference(card, control) if card is not None and control is not None else []
        same: Any = (not diff) if card is not None and control is not None else pd.NA
        rows.append({
            "pos_emb": row_name,
            "model": name,
            "trained": card is not None,
            "epochs": card["epochs"] if card else pd.NA,
            "test_top1": card["test_top1"] if card else float("nan"),
            "locality": (card["pos_embed_locality"] if card and card["pos_embed_locality"] is not None
                         else float("nan")),
            "same_recipe_as_control": same,
            "recipe_differences": ", ".join(diff),
            "paper_5shot": float(paper[row_name]),
        })
    return pd.DataFrame(rows)


def markdown_table(df: pd.DataFrame) -> str:
    """``df`` as a GitHub Markdown table (missing values as blanks), e.g. for a README or a closing note."""
    import pandas as pd

    def cell(v: Any) -> str:
        if v is None or (not isinstance(v, (list, dict, str)) and pd.isna(v)):
            return ""
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + " --- |" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)
