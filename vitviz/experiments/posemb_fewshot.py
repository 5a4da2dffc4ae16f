"""Table 8 measured the paper's way: few-shot linear accuracy of vitviz's position-embedding ablation models.

The ViT paper reports its position-embedding ablation (Table 8) as ImageNet 5-shot linear accuracy of the frozen
representation (Sec. 4.1); vitviz's ablation models (``cifar10-vit-{nopos,1dpos,2dpos}``, one recipe and budget,
and the longer-trained ``cifar10-vit``) carry fine-tuned (here: trained-end-to-end) CIFAR-10 top-1 on their cards.
``python -m vitviz.experiments.posemb_fewshot --data DIR`` measures the paper's measure on them: 5- and 10-shot
linear accuracy on CIFAR-10 (few-shot images drawn from ``train/``, scored on every image of ``test/``, 10 draws),
one CSV row per model, shots and draw. ``posemb_measures`` puts both measures and the paper's numbers side by side;
``posemb_claims`` tests, under each measure, the paper's ordering and its finding ("a large gap to no position
embedding, small differences among the encodings").
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pandas as pd

from vitviz.core.io import atomic_write_json, atomic_write_text
from vitviz.core.resources import shipped_csv
from vitviz.core.util import cli_errors
from vitviz.experiments.config import count_or_all, int_list, positive_int

MODELS = ("cifar10-vit-nopos", "cifar10-vit-1dpos", "cifar10-vit-2dpos", "cifar10-vit")
RESULTS = "data/posemb_fewshot/posemb_fewshot.csv"
POS_EMB = {"cifar10-vit-nopos": "No Pos. Emb.", "cifar10-vit-1dpos": "1-D Pos. Emb.",
           "cifar10-vit-2dpos": "2-D Pos. Emb.", "cifar10-vit": "1-D Pos. Emb."}


def measure(data: str | None = None, shots: tuple[int, ...] = (5, 10), seeds: tuple[int, ...] = tuple(range(10)),
            models: tuple[str, ...] = MODELS, results: str = RESULTS, test_subset: int | None = None,
            progress: bool = False) -> pd.DataFrame:
    """Measure every model's few-shot linear accuracy and write the results CSV (plus a JSON of the settings).

    Args:
        data: dataset root with ``train/`` and ``test/`` (default ``$VITVIZ_DATA``).
        shots, seeds: the few-shot settings (10 draws by default). test_subset: first ``n / 10`` test images of
            each class (None: all).
    """
    import torch

    from vitviz.analysis.representations import linear_fewshot
    from vitviz.core.datasets import ImageFolder
    from vitviz.zoo.models import load_model
    from vitviz.zoo.samples import resolve_data_root
    from vitviz.zoo.weights import versions

    root = resolve_data_root(data)
    frames = []
    for name in models:
        model = load_model(name).eval().float()
        test = ImageFolder(root / "test", model)
        if test_subset:
            from vitviz.experiments.data import balanced_indices

            keep = balanced_indices(torch.tensor(test.labels), test_subset).tolist()
            test = torch.utils.data.Subset(test, keep)
            test.labels = [test.dataset.labels[i] for i in keep]  # type: ignore[attr-defined]
        df = linear_fewshot(model, root / "train", test, shots=shots, seeds=seeds, name=name, progress=progress,
                            batch_size=250)
        df.insert(1, "pos_emb", POS_EMB[name])
        frames.append(df)
        print(df.groupby("shots").accuracy.describe(), flush=True)
    table = pd.concat(frames, ignore_index=True)
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    atomic_write_text(results, buf.getvalue())
    from vitviz.experiments.measure import device_description

    atomic_write_json(Path(results).with_suffix(".json"), {
        "command": " ".join(sys.argv), "shots": list(shots), "seeds": list(seeds), "models": list(models),
        "test_subset": test_subset, "hardware": device_description(torch.device("cpu")), "versions": versions()})
    return table


def read_posemb_fewshot(path: str | Path | None = None) -> pd.DataFrame:
    """The measured few-shot table (one row per model, shots and draw; see ``data/posemb_fewshot/README.md``)."""
    return shipped_csv(path, RESULTS, "run `python -m vitviz.experiments.posemb_fewshot --data DIR`")


def posemb_measures(fewshot: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ablation model: few-shot linear accuracy (mean and 95% t-interval over draws, per shots), the card's
    end-to-end CIFAR-10 top-1, and the paper's Table 8 (ImageNet 5-shot linear, ViT-B/16) for its row."""
    from vitviz.analysis.representations import summarize_probes
    from vitviz.zoo.cards import read_cards
    from vitviz.zoo.paper import posemb_ablation

    fewshot = read_posemb_fewshot() if fewshot is None else fewshot
    summ = summarize_probes(fewshot, by=("model", "shots"))
    paper = posemb_ablation().set_index("pos_emb")["default_stem"]
    cards = read_cards()
    rows = []
    for model in dict.fromkeys(fewshot["model"]):
        row = {"model": model, "pos_emb": POS_EMB.get(model, ""),
               "test_top1": cards[model]["test_top1"] if model in cards else float("nan"),
               "epochs": cards[model]["epochs"] if model in cards else pd.NA}
        for s in summ[summ.model == model].itertuples():
            row[f"fewshot{s.shots}"] = s.accuracy
            row[f"fewshot{s.shots}_low"] = s.low
            row[f"fewshot{s.shots}_high"] = s.high
        row["paper_5shot"] = 100 * float(paper[row["pos_emb"]]) if row["pos_emb"] in paper else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def posemb_claims(measures: pd.DataFrame, ablation: tuple[str, ...] = MODELS[:3]) -> pd.DataFrame:
    """Under each measure (columns of ``posemb_measures``), over the three ablation models (same recipe):

    - ``ordering``: the models from best to worst, and ``same_order_as_paper`` (paper: 1-D > 2-D > none);
    - ``gap_to_none``: the weaker encoding's score minus no position embedding's;
    - ``encoding_spread``: the difference between the 1-D and 2-D scores;
    - ``finding_holds``: ``gap_to_none > 0`` and ``gap_to_none > 2 * encoding_spread`` -- a large gap to no
      position embedding and small differences among encodings (the paper's: 2.62 points against 0.21).
    """
    sub = measures.set_index("model").loc[list(ablation)]
    label = {m: sub.loc[m, "pos_emb"].split(" ")[0] if m != "cifar10-vit-nopos" else "none" for m in ablation}
    paper_order = [label[m] for m in sorted(ablation, key=lambda m: -sub.loc[m, "paper_5shot"])]
    rows = []
    for col in [c for c in ("paper_5shot", "test_top1", "fewshot5", "fewshot10") if c in sub]:
        v = sub[col]
        order = [label[m] for m in sorted(ablation, key=lambda m: -v[m])]
        enc = v[[m for m in ablation if m != "cifar10-vit-nopos"]]
        gap = float(enc.min() - v["cifar10-vit-nopos"])
        spread = float(enc.max() - enc.min())
        rows.append({"measure": col, "ordering": " > ".join(order), "same_order_as_paper": order == paper_order,
                     "gap_to_none": gap, "encoding_spread": spread, "finding_holds": gap > 0 and gap > 2 * spread})
    return pd.DataFrame(rows)


@cli_errors("python -m vitviz.experiments.posemb_fewshot")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vitviz.experiments.posemb_fewshot", description=__doc__.split("\n")[0])
    p.add_argument("--data", help="dataset root with train/ and test/ (default: $VITVIZ_DATA)")
    p.add_argument("--shots", type=int_list(positive=True), default="5,10", help="shots per class, comma-separated")
    p.add_argument("--seeds", type=positive_int, default=10, help="draws (seeds 0..n-1)")
    p.add_argument("--test-subset", type=count_or_all, default=0, help="balanced test images (0: all 10,000)")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--threads", type=positive_int)
    p.add_argument("--progress", action="store_true")
    a = p.parse_args(argv)
    if not a.shots:
        p.error("--shots is empty; pass shots per class, comma-separated, e.g. 5,10")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    measure(a.data, a.shots, tuple(range(a.seeds)), results=a.results,
            test_subset=a.test_subset or None, progress=a.progress)
    print(posemb_claims(posemb_measures(read_posemb_fewshot(a.results))).to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
