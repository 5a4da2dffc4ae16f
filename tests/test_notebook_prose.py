"""Notebook prose carries no stale numbers.

Every number in a notebook's markdown is either a reference (figure, table, section, equation, venue and year,
arXiv id, a model or dataset name such as ViT-L/16 or CIFAR-10), inside a code span, or a fact of the paper or of
vitviz listed in ``PAPER_FACTS`` (by its number and the words around it) with the check that ties it to the shipped
tables. Numbers measured on the user's model or the shipped checkpoints are printed by cells, never typed, so they
follow ``--model`` and retraining.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

REFERENCE = re.compile(
    r"`(?![\d.,\s]+`)[^`]*`"  # code spans (a bare number in backticks is prose: `10` draws)
    r"|\[[^\]]*\]\([^)]*\)"  # markdown links
    r"|\b(?:Fig(?:ure)?s?\.?|Tables?|Sec(?:tion)?\.?|App(?:endix)?\.?|Eq\.|Equation|[Nn]otebooks?|arXiv|v)\s*"
    r"[A-Z]?\d+(?:\.\d+)*(?:\s*(?:,|and|or|-)\s*\d+)*"  # Fig. 7, Table 6, Sec. 3.2, notebook 04, Figs. 6 and 14
    r"|\b(?:ICLR|ICCV|CVPR|NeurIPS|ACL|ECCV|BMVC|ICML|TMLR)\s+\d{4}"  # venue and year
    r"|\b(?:19|20)\d{2}\b"  # years
    r"|\b(?:R\d+\+ViT|ViT|DeiT|BiT|ResNet)(?:-[A-Za-z]+)?(?:/\d+)?(?:-\d+)?\b"  # ViT-L/16, ResNet-50, R50+ViT-L/16
    r"|\b(?:JFT-300M|ImageNet-21k|ImageNet-1k|CIFAR-10+|CIFAR-100|Flowers-102|Oxford-IIIT)\b"
    r"|\b(?:DINOv\d|L[12]|log10)\b|\bL2-normalised\b"  # a model's name, a norm, a logarithm's base
    r"|\b[0-9]-D\b|\b\d+-shot\b|\b16x16 Words\b|\bAverage-5\b|\bTop-1\b|\btop-1\b"
    r"|^#+ .*$",  # headings name things, they do not report numbers
    re.MULTILINE,
)
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:x\d+)?")


def _table1(variant: str, column: str) -> int:
    from vitviz.zoo.paper import model_variants

    return int(model_variants().set_index("model").loc[variant, column])


def _timm_layout(name: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(patch size, input size) of a timm architecture, built on the meta device (no weights, no memory)."""
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    return tuple(model.patch_embed.patch_size), tuple(model.patch_embed.img_size)


def _hybrid_stride(name: str) -> int:
    """The pixels per token of a timm hybrid's backbone (its input over its feature grid), built on the meta device."""
    import timm
    import torch

    with torch.device("meta"):
        embed = timm.create_model(name, pretrained=False).patch_embed
    return embed.img_size[0] // embed.grid_size[0]


def _default(func, name: str):
    import inspect

    return inspect.signature(func).parameters[name].default


def _notebook_parameter(stem: str, name: str) -> str:
    """The default of ``name`` in the parameters cell of notebook ``stem``, as source text."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    m = re.search(rf"^{name}\s*=\s*([^#\n]+)", "".join(cell["source"]), re.MULTILINE)
    return m.group(1).strip() if m else ""


def _vit_compute_saving() -> float:
    """Table 6: the median over ResNets of (its exaFLOPs) / (the cheapest ViT with an Average-5 as high)."""
    import numpy as np

    import vitviz

    df = vitviz.paper_results()
    vit = df[df["family"].str.startswith("Transformer")]
    ratios = [r.exaflops / vit.loc[vit["avg5"] >= r.avg5, "exaflops"].min()
              for r in df[df["family"].str.startswith("ResNet")].itertuples() if (vit["avg5"] >= r.avg5).any()]
    return float(np.median(ratios))


def _auc_of_a_constant(value: float, upto: float) -> float:
    """``vitviz.faithfulness_auc`` of a curve constant at ``value``, integrated over ``[0, upto]``."""
    import numpy as np
    import pandas as pd

    import vitviz

    fractions = np.round(np.arange(0, 1.0001, 0.1), 10)
    df = pd.DataFrame([{"method": "m", "mode": "positive", "metric": "accuracy", "removal": "drop", "image": i,
                        "fraction": f, "score": value} for i in range(3) for f in fractions])
    return float(vitviz.faithfulness_auc(df, upto=upto)["auc"].iloc[0])


def _study_subsets() -> set[int]:
    from vitviz.experiments.study import read_results

    return set(read_results().train_images)


def _notebook_source(stem: str) -> str:
    return "".join("".join(c["source"]) for c in json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
                   if c["cell_type"] == "code")


def _vitviz(name: str):
    import importlib

    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module or "vitviz"), attr)


# number as written -> the facts it may state, each (a pattern its prose context must match, where the paper or
# vitviz says it, a check that computes it from the shipped tables, timm's own architectures, or vitviz's defaults
# and behaviour). A number is accepted only with the words of one of its facts around it: "16" is the patch size
# of "16-px patches", not a mean distance of "16 px".
PAPER_FACTS = {
    "7x7": [(r"7x7 grid", "ViT-L/32 at 224 px: a 7x7 grid (Fig. 7)",
             lambda: _timm_layout("vit_large_patch32_224")[1][0] // _timm_layout("vit_large_patch32_224")[0][0] == 7)],
    "32x32": [(r"32x32 (patches|pixels)", "ViT-L/32 patches are 32x32 pixels",
               lambda: _timm_layout("vit_large_patch32_224")[0] == (32, 32))],
    "14x14": [(r"14x14 (grid|\(or finer\) maps)", "ViT-L/16 at 224 px: a 14x14 grid",
               lambda: _timm_layout("vit_large_patch16_224")[1][0] // _timm_layout("vit_large_patch16_224")[0][0]
               == 14)],
    "16x16": [(r"16x16 one, so the\s+arrangement", "ViT-B/16 patches are 16x16 pixels",
               lambda: _timm_layout("vit_base_patch16_224")[0] == (16, 16))],
    "224": [(r"224[- ]px", "the paper's pre-training resolution (Sec. 4.1)",
             lambda: _timm_layout("vit_large_patch32_224")[1] == (224, 224))],
    "196": [(r"196 tokens", "tokens of ViT-L/16 at 224 px",
             lambda: (224 // _timm_layout("vit_large_patch16_224")[0][0]) ** 2 == 196)],
    "1024": [(r"1024-wide embeddings", "ViT-Large hidden size D (Table 1)",
              lambda: _table1("ViT-Large", "hidden_size_D") == 1024)],
    "24": [(r"24 layers", "ViT-Large layers (Table 1)", lambda: _table1("ViT-Large", "layers") == 24)],
    "16": [(r"16-px patches", "ViT-L/16's patches are 16 px",
            lambda: _timm_layout("vit_large_patch16_224")[0] == (16, 16)),
           (r"\(stride 16\)", "the paper's hybrid: ResNet features at stride 16 (Sec. 3.1, R50 stage 4 dropped)",
            lambda: _hybrid_stride("vit_base_r50_s16_224") == 16),
           (r"gradients runs with 16 steps", "notebook 04's sanity checks run integrated gradients with 16 steps",
            lambda: '"integrated_gradients": {"n_steps": 16}' in _notebook_source("04_faithfulness"))],
    "128": [(r"averaged over 128 images", "images averaged for the mean attention distance (App. D.7): notebooks 02 "
             "and 03 default to it", lambda: _notebook_parameter("02_attention", "n_images") == "128"
             and _notebook_parameter("03_hybrid_vs_pure", "n_images") == "128")],
    "0.5": [(r"rank correlation at least 0\.5", "sanity_summary's failure threshold on the mean |Spearman|",
             lambda: _default(_vitviz("sanity_summary"), "threshold") == 0.5)],
    "28": [(r"first 28 principal components", "principal components shown in Fig. 7 left",
            lambda: _default(_vitviz("plot_embedding_filters"), "n_components") == 28)],
    "18": [(r"18 models", "models of Table 6", lambda: _vitviz("paper_results")().shape[0] == 18)],
    "7": [(r"for 7 or 14 epochs", "pre-training epochs in Table 6",
           lambda: 7 in set(_vitviz("paper_results")()["epochs"]))],
    "14": [(r"for 7 or 14 epochs", "pre-training epochs in Table 6",
            lambda: 14 in set(_vitviz("paper_results")()["epochs"]))],
    "2": [(r"2-4x less", "ViT needs 2-4x less compute than ResNets for the same accuracy (Sec. 4.4)",
           lambda: 2 <= _vit_compute_saving() <= 4)],
    "4": [(r"2-4x less", "ViT needs 2-4x less compute than ResNets for the same accuracy (Sec. 4.4)",
           lambda: 2 <= _vit_compute_saving() <= 4)],
    "10": [(r"steps of 10%|0%, 10%, \.\.\.", "perturbation steps of 10% (Chefer et al. 2021)",
            lambda: _default(_vitviz("faithfulness"), "steps") == 0.1)],
    "95": [(r"95% (Student-t |t-)?(interval|band)", "confidence level of every interval (Student t, bootstrap)",
            lambda: _default(_vitviz("bootstrap_ci"), "ci") == 0.95
            and _default(_vitviz("faithfulness_auc"), "ci") == 0.95
            and _default(_vitviz("vitviz.experiments.compare.t_interval"), "confidence") == 0.95)],
    "0.975": [(r"t\(0\.975, n-1\)", "t quantile of a two-sided 95% interval",
               lambda: abs(__import__("scipy.stats", fromlist=["t"]).t.cdf(
                   __import__("scipy.stats", fromlist=["t"]).t.ppf(0.5 + 0.95 / 2, 4), 4) - 0.975) < 1e-12)],
    "5,000": [(r"5,000-image", "the study's class-balanced training subset", lambda: 5000 in _study_subsets())],
    "50,000": [(r"50,000\s+images", "CIFAR-10's training set, the study's whole-set runs",
                lambda: 50000 in _study_subsets())],
    "0.9": [(r"from 0 to 0\.9|nominal step `0\.9`",
             "Chefer et al. integrate accuracy over removed fractions 0 to 0.9 (their AUC convention)",
             lambda: abs(_auc_of_a_constant(1.0, upto=0.9) - 0.9) < 1e-9)],
    "0.07": [(r"temperature `?0\.07", "the weighted k-NN temperature (DINO, Caron et al. 2021), knn_probe's default",
              lambda: _default(_vitviz("knn_probe"), "temperature") == 0.07)],
    "100": [(r"100% of the patches|x100", "100% of the patches; AUC in percent (x100): a curve at 1 over every "
             "fraction has AUC 1, 100%", lambda: abs(100 * _auc_of_a_constant(1.0, upto=1.0) - 100) < 1e-9)],
}
FACTS = [(number, i) for number, facts in PAPER_FACTS.items() for i in range(len(facts))]
# definitional values (a correlation of 0 or 1, counting from 1), not measurements
SMALL = {"0", "1"}


def paper_fact(number: str, context: str) -> int | None:
    """The index of the fact of ``PAPER_FACTS[number]`` whose words are around the number, else ``None``."""
    return next((i for i, (words, _, _) in enumerate(PAPER_FACTS.get(number, ())) if re.search(words, context)),
                None)


def prose_numbers(path: Path) -> list[tuple[int, str, str]]:
    cells = json.loads(path.read_text())["cells"]
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text = REFERENCE.sub(" ", "".join(cell["source"]))
        for m in NUMBER.finditer(text):
            found.append((i, m.group(), text[max(0, m.start() - 40): m.end() + 40].replace("\n", " ")))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_holds_only_references_and_checked_paper_facts(path):
    stray = [f"cell {i}: {num!r} in '...{ctx}...'" for i, num, ctx in prose_numbers(path)
             if num not in SMALL and paper_fact(num, ctx) is None]
    assert not stray, ("numbers typed in prose (print them from a cell, or add a checked paper fact with the words "
                       "around it):\n" + "\n".join(stray))


def test_every_paper_fact_is_stated_somewhere():
    """A fact no notebook states any more is dropped from the table, not kept to let its number through."""
    stated = {(num, paper_fact(num, ctx)) for path in NOTEBOOKS for _, num, ctx in prose_numbers(path)}
    assert [f for f in FACTS if f not in stated] == []


@pytest.mark.parametrize("number, index", FACTS)
def test_paper_facts_agree_with_the_shipped_tables(number, index):
    _, where, check = PAPER_FACTS[number][index]
    assert check(), f"{number} ({where}) disagrees with the shipped tables"


def test_the_scan_catches_a_typed_measurement(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["The ViT-L/16 of Fig. 7 reaches 12.1 px; 67.05 % top-1."]}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    assert [n for _, n, _ in prose_numbers(tmp_path / "x.ipynb")] == ["12.1", "67.05"]
    nb["cells"][0]["source"] = ["Set `n_images = 8` and `timm_model`; we ran `12` draws at `0.35`."]
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    assert [n for _, n, _ in prose_numbers(tmp_path / "x.ipynb")] == ["12", "0.35"]  # bare numbers are prose
    # a fact's number in other words is no fact: the mean distance of "16 px" is not the patches' "16-px"
    nb["cells"][0]["source"] = ["Its heads reach 16 px, and 95 of them stay local; 16-px patches, 95% intervals. "
                                "A DINOv2 tower, L2-normalised, against log10 compute."]
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    found = prose_numbers(tmp_path / "x.ipynb")
    assert [(n, paper_fact(n, ctx)) for _, n, ctx in found] == [("16", None), ("95", None), ("16", 0), ("95", 0)]


def test_the_ablation_claims_in_notebook_01_hold_on_the_shipped_cards():
    """Notebook 01 says, in words: any embedding beats none on CIFAR-10, by a far larger margin than in the paper,
    and the 2-D table is more local than the 1-D one."""
    import vitviz

    gaps = vitviz.posemb_ablation_gaps().set_index("comparison")
    assert gaps.loc["1-D minus none (points)", "cifar10"] > 0 and gaps.loc["2-D minus none (points)", "cifar10"] > 0
    for row in ("1-D minus none (points)", "2-D minus none (points)"):
        assert gaps.loc[row, "cifar10"] > 2 * gaps.loc[row, "paper"] > 0
    assert gaps.loc["locality 2-D minus 1-D", "cifar10"] > 0
    assert abs(gaps.loc["2-D minus 1-D (points)", "paper"]) < 0.5  # the paper's "within a fraction of a point"


# sections that only narrate: what the notebook does not reproduce, said in words
NARRATIVE_SECTIONS = {"Where this differs from the paper"}


def sections(path: Path) -> list[tuple[str, int, int]]:
    """``(heading, markdown cell index, code cells before the next heading)`` of each heading of a notebook."""
    found: list[list] = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            found += [[m.group(1), i, 0] for m in re.finditer(r"^#+\s+(.*)$", "".join(cell["source"]), re.MULTILINE)]
        elif found:
            found[-1][2] += 1
    return [tuple(s) for s in found]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_section_holds_the_code_its_prose_announces(path):
    """A heading's prose describes the cells under it: a section with no code cell before the next heading sets
    its figure under another section's heading (notebook 01 announced its interpolated embedding, then showed the
    few-shot tables under a heading of their own and the interpolated figure below them)."""
    empty = [f"cell {i}: {heading!r}" for heading, i, code in sections(path)
             if code == 0 and heading not in NARRATIVE_SECTIONS]
    assert not empty, "sections without a code cell (move the cells their prose describes under them):\n" + \
        "\n".join(empty)
