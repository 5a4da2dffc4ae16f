"""Table 8 measured the paper's way: few-shot linear accuracy of vitviz's position-embedding ablation models.

The ViT paper reports its position-embedding ablation (Table 8) as ImageNet 5-shot linear accuracy of the frozen
representation (Sec. 4.1); vitviz's ablation models (``cifar10-vit-{nopos,1dpos,2dpos}``, one recipe and budget,
and the longer-trained ``cifar10-vit``) carry fine-tuned (here: trained-end-to-end) CIFAR-10 top-1 on their cards.
``python -m vitviz.experiments.posemb_fewshot --data DIR`` measures the paper's measure on them: 5- and 10-shot
linear accuracy on CIFAR-10 (few-shot images drawn from ``train/``, scored on every image of ``test/``, 10 draws),
one CSV row per model, shots and draw. ``posemb_measures`` puts both measures and the paper's numbers side by side;
``posemb_draw_claims`` states Table 8's comparisons as differences with 95 % intervals paired by draw (every model
reads the same shots at one seed); ``posemb_claims`` tests, under each measure, the paper's ordering and its finding
("a large gap to no position embedding, small differences among the encodings") on those intervals.
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


def posemb_draw_differences(fewshot: pd.DataFrame | None = None, ablation: tuple[str, ...] = MODELS[:3]
                            ) -> pd.DataFrame:
    """Table 8's comparisons per few-shot draw: ``measure`` (``fewshotK``), ``arm, minus`` (encodings of
    ``posemb_seeds.COMPARISONS``: 1-D minus none, 2-D minus none, 2-D minus 1-D), ``seed`` (the draw),
    ``arm_value, minus_value, difference`` in points.

    The draws pair: ``linear_fewshot`` draws the same training images for every model at one seed and shots, and
    each model is scored on the same test images, so the per-draw differences take out what a draw shares (an easy
    or hard set of shots) and their Student-t interval is the paired one. The marginal intervals of
    ``posemb_measures`` (each model over its draws) overlap where the paired one does not, and the other way round.

    What the pairing checks: the rows pair on ``shots`` and ``seed`` (the draw), and a draw or a shot count one
    model lacks is refused; two models whose draw at one seed holds other training images (``train_digest``) or
    whose test images differ (``test_digest``, ``representations.images_digest``) are refused, naming both and the
    seed. The committed table carries both columns. A table without them (written before ``linear_fewshot``
    recorded them) names no image: its test sets are compared by their ``test_images`` counts alone and its draws
    by seed, which cannot tell two sets of one size apart, so it pairs with an ``UncheckedImagesWarning``. Measure
    the compared models in one ``measure`` call (one ``--data``, one ``--test-subset``), as the committed table
    was.

    Args:
        fewshot: the per-draw table (``read_posemb_fewshot()``, the default): ``model, shots, seed, accuracy``.
        ablation: the models compared, one per encoding (their ``pos_emb`` in ``POS_EMB``).

    Raises:
        InputError: a column is missing; a model of ``ablation`` is not in ``POS_EMB`` or two share an encoding; a
            model has two rows for one draw, or the models do not share their draws or test images (no pairing).
    """
    import warnings

    from vitviz.analysis.representations import check_draw_images
    from vitviz.errors import InputError, UncheckedImagesWarning
    from vitviz.experiments.posemb_seeds import COMPARISONS, ENCODINGS

    encoding_of = {pos_emb: encoding for encoding, (_, pos_emb) in ENCODINGS.items()}  # Table 8's row -> encoding
    fewshot = read_posemb_fewshot() if fewshot is None else fewshot
    missing = [c for c in ("model", "shots", "seed", "accuracy") if c not in fewshot]
    if missing:
        raise InputError(f"posemb_draw_differences: fewshot lacks the column(s) {missing}; pass the per-draw table "
                         "of read_posemb_fewshot() (or of linear_fewshot), not posemb_measures' summary")
    unknown = [m for m in ablation if m not in POS_EMB]
    encodings = [encoding_of[POS_EMB[m]] for m in ablation if m in POS_EMB]
    if unknown or len(set(encodings)) != len(encodings):
        raise InputError(f"posemb_draw_differences: ablation={tuple(ablation)!r} must name one model per encoding "
                         f"among {list(POS_EMB)} (unknown: {unknown}); e.g. ablation={MODELS[:3]!r}")
    model_of = dict(zip(encodings, ablation))
    rows = []
    unchecked: dict[str, None] = {}
    for shots, g in fewshot[fewshot.model.isin(ablation)].groupby("shots", sort=True):
        twice = g[g.duplicated(["model", "seed"], keep=False)]
        if len(twice):
            r = twice.iloc[0]
            raise InputError(f"posemb_draw_differences: {r.model!r} has {int((twice.model == r.model).sum())} rows "
                             f"for the {shots}-shot draw seed={int(r.seed)} (several layers or probes?); pass one "
                             "row per model, shots and draw (the pre-logits linear probe)")
        unchecked.update(dict.fromkeys(check_draw_images(g, "model", "posemb_draw_differences")))
        by_model = {m: h.set_index("seed") for m, h in g.groupby("model")}
        for arm, minus in COMPARISONS:
            a_name, b_name = model_of.get(arm), model_of.get(minus)
            if a_name not in by_model or b_name not in by_model:
                continue
            a, b = by_model[a_name], by_model[b_name]
            if set(a.index) != set(b.index):
                only = sorted(set(a.index) ^ set(b.index))
                raise InputError(f"posemb_draw_differences: at {shots} shots {a_name} and {b_name} do not share "
                                 f"their draws (seeds {only} are in one only), so their differences do not pair; "
                                 "measure both models with the same seeds (python -m "
                                 "vitviz.experiments.posemb_fewshot --seeds N)")
            if "test_images" in g and set(a.test_images) != set(b.test_images):
                raise InputError(f"posemb_draw_differences: {a_name} and {b_name} were scored on different test "
                                 f"sets ({sorted(set(a.test_images))} against {sorted(set(b.test_images))} images); "
                                 "measure both on the same test images (the same --test-subset)")
            for seed in sorted(a.index):
                x, y = float(a.loc[seed, "accuracy"]), float(b.loc[seed, "accuracy"])
                rows.append({"measure": f"fewshot{int(shots)}", "arm": arm, "minus": minus, "seed": int(seed),
                             "arm_value": x, "minus_value": y, "difference": x - y})
    if unchecked and rows:
        warnings.warn(UncheckedImagesWarning(
            f"posemb_draw_differences: the table does not say which images {', '.join(unchecked)} were measured on "
            "(no train_digest/test_digest: written before linear_fewshot recorded them), so their draws are paired "
            "by seed and their test sets by count, which cannot tell two sets of one size apart; measure them "
            "again (python -m vitviz.experiments.posemb_fewshot --data DIR) to have the images checked"),
            stacklevel=2)
    return pd.DataFrame(rows, columns=["measure", "arm", "minus", "seed", "arm_value", "minus_value", "difference"])


def posemb_draw_claims(fewshot: pd.DataFrame | None = None, ablation: tuple[str, ...] = MODELS[:3]) -> pd.DataFrame:
    """Table 8's comparisons (1-D minus none, 2-D minus none, 2-D minus 1-D) under each few-shot measure, paired by
    draw: the columns of ``posemb_seeds.posemb_seed_claims`` (``difference`` with ``low``/``high`` its 95 %
    Student-t interval over the per-draw differences of ``posemb_draw_differences``, ``excludes_zero``, the paper's
    difference), with ``draws`` for ``seeds``.

    The interval is over the draws of the shots with each trained model fixed: it says whether these three models
    differ, not whether the encodings would at another training seed (``posemb_seeds`` answers that)."""
    from vitviz.experiments.posemb_seeds import claims_of_differences

    diffs = posemb_draw_differences(fewshot, ablation)
    frames = [claims_of_differences(g, pairs="draws") for _, g in diffs.groupby("measure", sort=False)]
    return pd.concat(frames, ignore_index=True) if frames else claims_of_differences(diffs, pairs="draws")


def posemb_claims(measures: pd.DataFrame, ablation: tuple[str, ...] = MODELS[:3], *,
                  fewshot: pd.DataFrame | None = None) -> pd.DataFrame:
    """Under each measure (columns of ``posemb_measures``), over the three ablation models (same recipe):

    - ``ordering``: the models from best to worst, and ``same_order_as_paper`` (paper: 1-D > 2-D > none);
    - ``gap_to_none``: the weaker encoding's score minus no position embedding's; ``encoding_spread``: the
      difference between the 1-D and 2-D scores (point values, for reading);
    - ``finding_holds``: the paper's finding -- a large gap to no position embedding, small differences among the
      encodings -- decided on the paired intervals of ``posemb_draw_claims`` for a few-shot measure: both
      encodings minus none lie above 0 (``gap_low``, the smaller of their intervals' lower ends, > 0) and above
      every 1-D/2-D difference the interval of 2-D minus 1-D admits (``gap_low > spread_bound``, the larger
      absolute end of that interval). ``draws``: the pairs. For the paper's own row the finding is read off its
      numbers (``gap_to_none > 2 * encoding_spread``: 2.62 points against 0.21). A measure with one number per
      model (``test_top1``: one trained model per encoding) has no interval: ``finding_holds`` is None
      (undecided; ``posemb_seeds.posemb_seed_claims`` compares the encodings over training seeds). ``basis``
      says which of the three decided.

    Args:
        measures: ``posemb_measures()``'s table.
        ablation: the three models, no position embedding first.
        fewshot: the per-draw table the intervals pair over (the one given to ``posemb_measures``, e.g.
            ``read_posemb_fewshot()``); without it the few-shot measures are undecided too.
    """
    from vitviz.experiments.posemb_seeds import fewshot_shots

    sub = measures.set_index("model").loc[list(ablation)]
    label = {m: sub.loc[m, "pos_emb"].split(" ")[0] if m != "cifar10-vit-nopos" else "none" for m in ablation}
    paper_order = [label[m] for m in sorted(ablation, key=lambda m: -sub.loc[m, "paper_5shot"])]
    paired = posemb_draw_claims(fewshot, ablation).set_index(["measure", "arm", "minus"]) \
        if fewshot is not None else None
    rows = []
    shots = sorted((c for c in sub.columns if fewshot_shots(c) is not None), key=fewshot_shots)
    for col in [c for c in ("paper_5shot", "test_top1") if c in sub] + shots:  # every shot count measured
        v = sub[col]
        order = [label[m] for m in sorted(ablation, key=lambda m: -v[m])]
        enc = v[[m for m in ablation if m != "cifar10-vit-nopos"]]
        gap = float(enc.min() - v["cifar10-vit-nopos"])
        spread = float(enc.max() - enc.min())
        row = {"measure": col, "ordering": " > ".join(order), "same_order_as_paper": order == paper_order,
               "gap_to_none": gap, "encoding_spread": spread, "gap_low": float("nan"),
               "spread_bound": float("nan"), "draws": 0, "finding_holds": None}
        if col == "paper_5shot":
            row.update(finding_holds=bool(gap > 0 and gap > 2 * spread), basis="the paper's numbers")
        elif paired is not None and (col, "2d", "1d") in paired.index:
            c = paired.loc[col]
            gap_low = float(min(c.loc[("1d", "none"), "low"], c.loc[("2d", "none"), "low"]))
            bound = float(max(abs(c.loc[("2d", "1d"), "low"]), abs(c.loc[("2d", "1d"), "high"])))
            draws = int(c.loc[("2d", "1d"), "draws"])
            row.update(gap_low=gap_low, spread_bound=bound, draws=draws,
                       finding_holds=bool(gap_low > 0 and gap_low > bound),
                       basis=f"95% intervals paired over {draws} draws")
        elif col.startswith("fewshot"):
            row["basis"] = "undecided: no per-draw rows of this measure (fewshot=) to pair over"
        else:
            row["basis"] = "undecided: one number per model, no interval (posemb_seed_claims: over seeds)"
        rows.append(row)
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
    table = read_posemb_fewshot(a.results)
    print(posemb_claims(posemb_measures(table), fewshot=table).to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
