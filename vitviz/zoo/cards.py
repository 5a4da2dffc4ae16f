"""Reading the cards of the shipped reference models: tables of what each card says.

Cards are written by ``vitviz.experiments.export`` when a model is trained; this module only reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitviz.errors import CheckpointError, DataNotFoundError, InputError
from vitviz.zoo.reference import FAMILY_LABELS, REFERENCE_MODELS
from vitviz.zoo.weights import CARD_FORMAT

if TYPE_CHECKING:
    import pandas as pd

DATASET = (
    "CIFAR-10 (Krizhevsky, 2009, 'Learning Multiple Layers of Features from Tiny Images'): 50,000 train and "
    "10,000 test 32x32 RGB images in 10 classes, read as JPEG files in ImageFolder layout (JPEG re-encoding "
    "shifts pixel values slightly against the original binary release)"
)


# what the tables below read from every card (``train_images`` is optional: older cards lack it)
CARD_KEYS = ("name", "architecture", "recipe", "epochs", "test_top1", "test_images", "test_top1_subset500",
             "pos_embed_locality", "flops_per_image_forward", "flops_per_image_train_step", "train_time_s",
             "hardware", "history")


def read_cards(directory: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The JSON cards of the shipped reference checkpoints, by model name (``{}`` when none are there).

    Args:
        directory: folder of the cards; default ``vitviz.zoo.weights.checkpoint_dir()`` (``$VITVIZ_CHECKPOINTS`` or
            the repository's ``vitviz/zoo/checkpoints``).

    Raises:
        CheckpointError: a card is not valid JSON, is not a vitviz reference card, or lacks one of ``CARD_KEYS``.
        DataNotFoundError: ``directory`` is given and is not a folder (a typo would read as "no model trained").
    """
    import json

    from vitviz.zoo.weights import checkpoint_dir

    folder = Path(directory) if directory is not None else checkpoint_dir()
    if directory is not None and not folder.is_dir():
        raise DataNotFoundError(f"directory={str(directory)!r} is {'a file' if folder.exists() else 'not there'}, not a "
                                "folder of cards; pass the folder the cards were exported to, or leave it out for "
                                "the shipped ones")
    cards = {}
    for path in sorted(folder.glob("*.json")):
        try:
            card = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"cannot read the card {str(path)!r} ({err}); export it again with "
                                  "`python -m vitviz.experiments.train MODEL --resume --export DIR`") from err
        if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
            raise CheckpointError(f"{str(path)!r} is not a vitviz reference card (format {CARD_FORMAT!r} expected)")
        missing = [k for k in CARD_KEYS if k not in card] + (
            [] if isinstance(card.get("architecture"), dict) and "parameters" in card["architecture"]
            else ["architecture.parameters"])
        if missing:
            raise CheckpointError(f"the card {str(path)!r} lacks {', '.join(dict.fromkeys(missing))}; export it again "
                                  "with `python -m vitviz.experiments.train MODEL --resume --export DIR`")
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
    raise InputError(f"the card of {card['name']} does not say how many training images it saw; export it again")


def reference_compute(directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """The trained ViT, hybrid and ResNet reference models as points on the study's compute axis.

    Same columns as ``vitviz.experiments.study.read_results()`` (``family``, ``model``, ``epochs``, ``params``,
    ``flops_train_per_image``, ``train_images``, ``images_seen``, ``train_pflops``, ``test_acc``, ``test_images``,
    ``wall_time_s``), so ``plot_compute_curves(df, metrics=("test_acc",), x="train_pflops")`` draws them. Unlike the
    sweep (a subset of the training images, a subset of the test images), these are full CIFAR-10 runs measured on
    all 10,000 test images: plot them beside the sweep, not on the same curves. Models without a card are left out.
    """
    import pandas as pd


    cards = read_cards(directory)
    rows = []
    for name, family in FAMILY_LABELS.items():
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
    """Recipe fields (other than the model name) in which ``card`` differs from ``control``; the runtime fields
    that do not change the weights (``vitviz.core.recipe.RUNTIME_KEYS``: the cache folder, compilation;
    the epochs excepted) do not count."""
    from vitviz.core.recipe import RUNTIME_KEYS

    skip = {"model", *RUNTIME_KEYS} - {"epochs"}
    a, b = card["recipe"], control["recipe"]
    return sorted(k for k in set(a) | set(b) if k not in skip and a.get(k) != b.get(k))


def posemb_ablation_results(directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """The CIFAR-10 position-embedding ablation beside the paper's Table 8: none, 1-D and 2-D, side by side.

    Each row is one reference model: ``cifar10-vit-nopos``, ``cifar10-vit-1dpos`` (the 1-D control) and
    ``cifar10-vit-2dpos``, identical except for the position embedding. The control is a model of its own so that
    the default ``cifar10-vit`` (same architecture) can be trained for longer without breaking the comparison.

    Returns:
        DataFrame with ``pos_emb`` (the Table 8 row), ``model``, ``trained``, ``epochs``, ``test_top1`` (%, all
        10,000 test images, the exported fp16 weights), ``locality``, ``same_recipe_as_control`` (the training
        recipe, epochs included, equals the 1-D control's except for the model name, cache folder and compilation;
        NA when either card is missing), ``recipe_differences`` (the fields that differ) and ``paper_5shot`` (Table 8, ViT-B/16 ImageNet 5-shot linear accuracy, as a fraction).
    """
    import pandas as pd

    from vitviz.zoo.paper import TABLE8_ROW_FOR_KIND, posemb_ablation

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


def posemb_ablation_gaps(directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """The ablation's differences, in percentage points, beside the same differences in the paper's Table 8.

    Rows: ``1-D minus none``, ``2-D minus none``, ``2-D minus 1-D`` (top-1 on CIFAR-10 from the cards; Table 8's
    ImageNet 5-shot linear accuracy times 100) and ``locality 2-D minus 1-D`` (Spearman locality, no paper value).
    Columns: ``comparison``, ``cifar10``, ``paper`` (NaN where a card is missing or the paper has no number).
    """
    import pandas as pd

    df = posemb_ablation_results(directory).set_index("pos_emb")
    top1, paper, loc = df["test_top1"], df["paper_5shot"] * 100, df["locality"]
    none, one, two = "No Pos. Emb.", "1-D Pos. Emb.", "2-D Pos. Emb."
    rows = [
        ("1-D minus none (points)", top1[one] - top1[none], paper[one] - paper[none]),
        ("2-D minus none (points)", top1[two] - top1[none], paper[two] - paper[none]),
        ("2-D minus 1-D (points)", top1[two] - top1[one], paper[two] - paper[one]),
        ("locality 2-D minus 1-D", loc[two] - loc[one], float("nan")),
    ]
    return pd.DataFrame(rows, columns=["comparison", "cifar10", "paper"]).round(2)
