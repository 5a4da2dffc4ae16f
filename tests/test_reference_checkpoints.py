"""Every shipped reference checkpoint loads offline and scores what its card says.

Accuracy is re-measured here through the user-facing path (JPEG files -> ``vitviz.load_images`` with the model's
``pretrained_cfg`` preprocessing), independent of the training runner's in-memory evaluation.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path

import pytest
import torch

import vitviz
from vitviz.zoo.reference import REFERENCE_MODELS
from vitviz.zoo.weights import checkpoint_dir

CARDS = sorted(checkpoint_dir().glob("*.json"))
ROOT = Path(__file__).resolve().parents[1]


def cifar_root() -> Path | None:
    for cand in (os.environ.get("VITVIZ_DATA"), ROOT.parent / "shared" / "data" / "cifar10"):
        if cand and (Path(cand) / "test").is_dir():
            return Path(cand)
    return None


def subset500(root: Path) -> tuple[list[Path], list[int], list[str]]:
    classes = sorted(p.name for p in (root / "test").iterdir() if p.is_dir())
    files, labels = [], []
    for i, c in enumerate(classes):
        picks = sorted((root / "test" / c).iterdir())[:50]
        files += picks
        labels += [i] * len(picks)
    return files, labels, classes


@pytest.mark.parametrize("card_path", CARDS, ids=[p.stem for p in CARDS])
def test_checkpoint_matches_its_card(card_path):
    card = json.loads(card_path.read_text())
    weights = card_path.with_suffix(".safetensors")
    assert weights.is_file(), f"{card_path.name} has no {weights.name} beside it"
    assert card["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()  # what load_model checks
    model = vitviz.load_model(card["name"], device="cpu")
    arch = card["architecture"]
    module, _, builder = arch["builder"].rpartition(".")  # the card names the function that builds the model
    ref = REFERENCE_MODELS[card["name"]]
    assert getattr(importlib.import_module(module), builder) is ref.factory
    assert arch["kwargs"] == {**ref.kwargs, **card["recipe"]["model_kwargs"]}
    assert arch["parameters"] == sum(p.numel() for p in model.parameters())
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (3, 32, 32) and len(cfg["label_names"]) == 10
    assert card["epochs"] >= 1 and card["test_images"] == 10_000
    if card["name"] != "cifar10-resnet":
        spec = vitviz.inspect(model)
        assert spec.grid_size == (8, 8) and spec.patch_size == (4, 4) and spec.num_prefix_tokens == 1
    root = cifar_root()
    if root is None:
        pytest.skip("CIFAR-10 test images not found (set VITVIZ_DATA)")
    files, labels, classes = subset500(root)
    assert classes == cfg["label_names"]
    correct = 0
    with torch.no_grad():
        for i in range(0, len(files), 100):
            x = vitviz.load_images(model, files[i:i + 100])
            correct += (model(x).argmax(-1) == torch.tensor(labels[i:i + 100])).sum().item()
    acc = 100.0 * correct / len(files)
    assert abs(acc - card["test_top1_subset500"]) <= 2.0, (acc, card["test_top1_subset500"])


def test_checkpoint_folder_stays_small():
    total = sum(p.stat().st_size for p in checkpoint_dir().glob("*") if p.is_file())
    assert total <= 40 * 2**20, f"vitviz/zoo/checkpoints holds {total / 2**20:.1f} MB (budget 40 MB)"


def test_shipped_ablation_models_share_their_controls_recipe():
    """The no-pos and 2-D models are only comparable with the 1-D control if recipe and budget are identical."""
    from vitviz.zoo.cards import posemb_ablation_results

    table = posemb_ablation_results()
    shipped = table[table["trained"] & (table["pos_emb"] != "1-D Pos. Emb.")]
    if shipped.empty:
        pytest.skip("no ablation checkpoint shipped")
    bad = shipped[shipped["same_recipe_as_control"] != True]  # noqa: E712 (NA counts as not the same)
    assert bad.empty, bad[["model", "recipe_differences"]].to_string()


def test_readme_reference_table_quotes_the_cards():
    """The README's table of reference models says what the shipped cards say (accuracy, locality, epochs)."""
    from vitviz.zoo.cards import reference_table

    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- reference-table -->")[1].split("<!-- /reference-table -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].split("`")[1]] = cells
    cards = reference_table().set_index("model")
    trained = cards[cards.trained]
    assert set(rows) == set(trained.index)
    for name, cells in rows.items():
        card = trained.loc[name]
        assert cells[1].startswith(f"{card.test_top1:.2f}%"), (name, cells[1])
        if card.floor == card.floor:  # a floor: the README says whether it is met
            assert ("met)" in cells[1]) and (("not met" not in cells[1]) == bool(card.meets_floor)), (name, cells[1])
        if card.locality == card.locality:
            assert cells[2] == f"{card.locality:.2f}", (name, cells[2])
        else:
            assert cells[2].startswith("("), (name, cells[2])
        assert cells[3] == str(card.epochs), (name, cells[3])



@pytest.mark.parametrize("card_path", CARDS, ids=[p.stem for p in CARDS])
def test_card_flops_are_what_count_flops_counts(card_path):
    """A card's FLOPs per image are vitviz's count for its architecture, the forward pass and a training step;
    ``reference_compute`` puts the training step times the images seen on the study's compute axis, beside the
    sweep's counts. A training step is three forward passes less the first convolution's input gradient (the
    image needs none): backward costs twice the forward for every matmul and convolution, attention's included."""
    from vitviz.analysis.flops import count_flops
    from vitviz.zoo.reference import CIFAR10_INPUT, build_reference

    card = json.loads(card_path.read_text())
    model = build_reference(card["name"], **card["recipe"]["model_kwargs"])  # the count does not read the weights
    forward, step = card["flops_per_image_forward"], card["flops_per_image_train_step"]
    assert forward == count_flops(model, CIFAR10_INPUT)  # the training step follows (count_flops(backward=True)):
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    out = [(32 + 2 * conv.padding[i] - conv.kernel_size[i]) // conv.stride[i] + 1 for i in (0, 1)]
    first_conv = 2 * out[0] * out[1] * conv.weight.numel()
    assert step == 3 * forward - first_conv


def test_a_card_missing_a_field_is_refused_naming_the_card_and_the_field(tmp_path):
    """A hand-edited or truncated-by-hand card was a bare KeyError ('test_top1') from deep inside the tables."""
    from vitviz.errors import CheckpointError
    from vitviz.zoo.cards import posemb_ablation_results, reference_compute, reference_table

    card = json.loads((checkpoint_dir() / "cifar10-vit.json").read_text())
    del card["test_top1"], card["architecture"]["parameters"]
    (tmp_path / "cifar10-vit.json").write_text(json.dumps(card))
    for table in (reference_table, reference_compute, posemb_ablation_results):
        with pytest.raises(CheckpointError, match=r"cifar10-vit\.json' lacks test_top1, architecture\.parameters; "
                                                  r"export it again"):
            table(tmp_path)


def test_the_ablation_figure_says_one_recipe_only_when_the_cards_share_it(tmp_path):
    """The title said "one recipe" for any three cards of equal epochs, also when another learning rate was used."""
    import matplotlib.pyplot as plt

    names = ("cifar10-vit-nopos", "cifar10-vit-1dpos", "cifar10-vit-2dpos")
    for name in names:
        card = json.loads((checkpoint_dir() / f"{name}.json").read_text())
        if name == "cifar10-vit-2dpos":
            card["recipe"]["lr"] *= 3
        (tmp_path / f"{name}.json").write_text(json.dumps(card))
    fig = vitviz.plot_posemb_ablation_grid(tmp_path)
    assert fig.axes[0].get_title() == "vitviz CIFAR-10 ViTs\nUNEQUAL recipes: lr differ, 32 epochs"
    plt.close(fig)
    (tmp_path / "cifar10-vit-1dpos.json").unlink()  # nothing to compare with
    fig = vitviz.plot_posemb_ablation_grid(tmp_path)
    assert fig.axes[0].get_title() == "vitviz CIFAR-10 ViTs\nrecipe unchecked (no 1-D control), 32 epochs"
    plt.close(fig)


def test_the_ablation_recipes_compare_what_is_computed_not_where_or_how_fast_it_ran(tmp_path):
    """A card records the run's decoded-data cache folder and whether it was compiled (``compile``, absent from
    cards written before it existed); neither changes the weights (``TrainConfig``'s runtime keys), yet a
    re-exported ablation model differed from its shipped control in them and was shown under UNEQUAL recipes."""
    from vitviz.experiments.config import RUNTIME_KEYS
    from vitviz.zoo.cards import posemb_ablation_results

    names = ("cifar10-vit-nopos", "cifar10-vit-1dpos", "cifar10-vit-2dpos")
    for name in names:
        card = json.loads((checkpoint_dir() / f"{name}.json").read_text())
        if name == "cifar10-vit-nopos":
            assert {"cache", "compile"} <= set(RUNTIME_KEYS)
            card["recipe"].update(cache="/scratch/runs/.cache", compile=True)
        if name == "cifar10-vit-2dpos":
            card["recipe"].update(compile=False, weight_decay=card["recipe"]["weight_decay"] * 2)
        (tmp_path / f"{name}.json").write_text(json.dumps(card))
    table = posemb_ablation_results(tmp_path).set_index("model")
    assert table["same_recipe_as_control"].tolist() == [True, True, False]
    assert table["recipe_differences"].tolist() == ["", "", "weight_decay"]
