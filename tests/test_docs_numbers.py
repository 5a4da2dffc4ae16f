"""The figures the documentation pages and ``data/*/README.md`` quote, recomputed from the committed files they come
from (``bench/results/``, ``data/``, ``docs/coverage.md``, the shipped cards).

One table of cases: each recomputes its figures, formats them as the page writes them and names the page; the test
asserts every formatted figure is in the page's text (whitespace folded). Editing a figure on the page, or the
file it is read from, fails the case. (The 1,000-image faithfulness table, the AttnLRP coverage table, the 64-image
AttnLRP run, study.md's matched-compute table and posemb_seeds' intervals have their own tests:
``tests/test_faithfulness.py``, ``tests/test_readme.py``, ``tests/test_docs_pages.py``,
``tests/test_study_claims.py``, ``tests/test_posemb_seeds.py``.)
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS, DATA, RESULTS = ROOT / "docs", ROOT / "data", ROOT / "bench" / "results"
WORDS = {3: "three", 5: "five", 9: "nine", 10: "ten"}
MODES = ["positive", "negative", "deletion", "insertion"]  # the explain.md tables' column order


def text_of(path: Path) -> str:
    return " ".join(path.read_text().split())


def _trapezoid(y, x) -> float:
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


def _interval(v: float, lo: float, hi: float, sign: str = "") -> str:
    return f"{v:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def _sci(v: float, digits: int) -> str:
    """``1.3e-7`` as the pages write it (Python writes ``1.3e-07``)."""
    mantissa, exponent = f"{v:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _minutes(seconds) -> str:
    return f"{round(min(seconds) / 60)} to {round(max(seconds) / 60)} minutes"


def card(model: str) -> dict:
    """A shipped model's card (what ``vitviz.reference_table()`` reads), without importing torch."""
    return json.loads((ROOT / "vitviz" / "zoo" / "checkpoints" / f"{model}.json").read_text())


def _last_epochs(csv: Path) -> pd.DataFrame:
    df = pd.read_csv(csv)
    return df.sort_values("epoch").groupby("run").tail(1)


# --- docs/explain.md ---------------------------------------------------------------------------------------------

def explain_500_images() -> list[str]:
    """The 500-image run with flow (``bench/results/faithfulness/``): AUC table, paired differences against chefer
    and against random with their verdicts, and Chefer et al.'s convention."""
    run = RESULTS / "faithfulness"
    auc = pd.read_csv(run / "auc.csv").set_index(["method", "mode"])
    assert set(auc.n_images) == {500}
    want = [f"| {m} | " + " | ".join(_interval(*auc.loc[(m, mode), ["auc", "ci_low", "ci_high"]]) for mode in MODES)
            + " |" for m in auc.index.get_level_values(0).unique()]
    for baseline, methods in (("chefer", ["attnlrp", "grad_rollout", "rollout"]),
                              ("random", ["attention", "rollout", "flow", "chefer", "attnlrp"])):
        paired = pd.read_csv(run / f"paired_vs_{baseline}.csv").set_index(["method", "mode"])
        want += [f"| {m} | " + " | ".join(
            _interval(*paired.loc[(m, mode), ["diff", "ci_low", "ci_high"]], sign="+") + " "
            + paired.loc[(m, mode), "verdict"] for mode in MODES) + " |" for m in methods]
    conv = pd.read_csv(run / "chefer_convention.csv").set_index(["method", "mode"]).auc_x100
    methods = ["attention", "rollout", "flow", "grad_rollout", "chefer", "attnlrp", "random"]
    want.append("negative / positive = " + ", ".join(
        f"{m} {conv[(m, 'negative')]:.2f} / {conv[(m, 'positive')]:.2f}" for m in methods) + ".")
    want.append(f"{auc.n_images.iloc[0]} images")
    return want


def explain_1000_images() -> list[str]:
    """Notebook 04's 1,000-image run (``faithfulness_notebook04``): Chefer et al.'s convention (accuracy AUC up to
    the step 0.9, x100) and where the whole patches fall on the 8x8 grid."""
    rec = np.load(RESULTS / "faithfulness_notebook04" / "faithfulness_curves.npz")
    removed, curves = rec["removed"], rec["curves"]
    methods = sorted(["attention", "rollout", "grad_rollout", "chefer", "attnlrp", "integrated_gradients",
                      "input_x_gradient", "gradcam", "random"])
    names = ["deletion", "insertion", "negative", "positive"]
    upto = int(np.argmin(np.abs(removed - 0.9))) + 1  # the step 0.9, the last Chefer et al. integrate to

    def conv(m, mode):
        return 100 * _trapezoid(curves[methods.index(m) * len(names) + names.index(mode)][:upto], removed[:upto])

    order = ["attnlrp", "chefer", "grad_rollout", "integrated_gradients", "gradcam", "input_x_gradient", "rollout",
             "attention", "random"]
    line = "negative / positive: " + ", ".join(
        f"{m} {conv(m, 'negative'):.2f} / {conv(m, 'positive'):.2f}" for m in order) + "."
    nominal = np.linspace(0, 1, len(removed))  # the steps 0, 0.1, ..., 1 the AUC was once taken over
    moved = max(abs(_trapezoid(row, removed) - _trapezoid(row, nominal)) for row in curves)
    patches = 64
    k1, k9 = round(removed[1] * patches), round(removed[upto - 1] * patches)
    return [line, f"On the 1,000 images of the table below, no AUC moved by more than {math.ceil(moved * 1e4) / 1e4}",
            f"{k1} of the {patches} patches ({100 * k1 / patches:.1f}%) at `f = 0.1`",
            f"{k9} ({100 * k9 / patches:.1f}%) at `f = 0.9`", f"(x {removed[upto - 1]:.3f} on {patches} patches)",
            f"removed at {removed[1]:.3f} rather than 0.1"]


def explain_lxt() -> list[str]:
    """AttnLRP against lxt (``attnlrp_lxt.json``): the table, and the agreement without lxt's stabiliser."""
    run = json.loads((RESULTS / "attnlrp_lxt.json").read_text())
    c = run["comparisons"]
    rows = {"default (epsilon, AttnLRP attention)": "vitviz default (epsilon, attnlrp)",
            "gamma 0.05 + CP attention": "vitviz gamma + cp",
            "same, `in_proj` left at the plain gradient": "vitviz gamma + cp, in_proj plain",
            "same, `in_proj` and `out_proj` left at the plain gradient": "vitviz gamma + cp, in_proj and out_proj plain"}

    def rel(v):
        return f"{v:.2f}" if v >= 0.01 else _sci(v, 1)

    want = [f"| {row} | {c[k]['pearson_mean']:.3f} / {c[k]['pearson_min']:.3f} | {rel(c[k]['max_abs_diff_rel'])} |"
            for row, k in rows.items()]
    exact = c["vitviz gamma + cp, in_proj and out_proj plain"]["max_abs_diff_rel"]
    bare = c["vitviz gamma + cp, in_proj and out_proj plain (lxt without its 1e-10 input stabiliser)"]
    want.append(f"agrees with lxt to {_sci(exact, 1)} of the peak, and to {_sci(bare['max_abs_diff_rel'], 0)}")
    want += [f"{run['images']} CIFAR-10 test images", f"linear gamma {run['gamma_linear']}",
             f"lxt {run['versions']['lxt']}, zennit {run['versions']['zennit']}"]
    return want


def explain_quantus() -> list[str]:
    """The Quantus cross-check (``quantus_check.json``): Spearman correlations of the rankings, chefer's scores,
    the run's size and time, and which methods every ranking puts first and last."""
    run = json.loads((RESULTS / "quantus_check.json").read_text())
    rho = run["spearman_between_rankings"]
    row = []
    for removal in ("mean", "drop"):
        row.append(" | ".join(f"{rho[f'vitviz_deletion_auc_{removal} vs {q}']:.3f}"
                              for q in ("quantus_pixel_flipping_auc", "quantus_region_perturbation_aopc")))
    firsts = {r[0] for r in run["ranking_best_first"].values()}
    lasts = {r[-1] for r in run["ranking_best_first"].values()}
    assert firsts == {"attnlrp"} and lasts == {"random"}, "the page says every ranking puts attnlrp first, random last"
    chefer = run["scores"]["chefer"]
    return [f"| pixels filled with the mean (Quantus's own removal) | {row[0]} |",
            f"| tokens dropped (vitviz's default for this model) | {row[1]} |",
            f"(chefer: Quantus {chefer['quantus_pixel_flipping_auc']:.3f}, vitviz "
            f"{chefer['vitviz_deletion_auc_mean']:.3f})",
            f"`bench/results/quantus_check.json`, {round(run['seconds'])} s",
            f"`cifar10-vit`, {run['images']} CIFAR-10 test images", f"({WORDS[len(run['methods'])]} methods",
            "Every ranking puts `attnlrp` first and `random` last"]


def explain_gpu_faithfulness() -> list[str]:
    """The faithfulness loop on the H200 (``h200_gpu_run_3/faithfulness.json``)."""
    [r] = json.loads((RESULTS / "h200_gpu_run_3" / "faithfulness.json").read_text())
    return [f"on an {r['gpu']} (ViT-B/16, {r['size']} px, {r['autocast']} autocast, {r['n']} images in batches of "
            f"{r['batch']}, {r['passes']} passes a batch)",
            f"the loop took {r['loop_x']:.2f}x the plain passes' time, the reading loop {r['read_each_x']:.2f}x"]


def explain_readout_maps() -> list[str]:
    """How far the maps moved when vitviz began reading the tokens a head pools (``bench/results/readout_maps.md``,
    the largest difference over the new map's peak): ranges over the mean-pooling models, per method."""
    rows = {}
    for line in (RESULTS / "readout_maps.md").read_text().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(["attention", "rollout", "flow", "grad_rollout", "chefer"], cells[1:]))
    equal = sorted(m for m, r in rows.items() if set(r.values()) <= {"equal", "n/a"})
    assert equal == ["hf clip-vision", "hf vit", "timm no class token, avg", "timm token", "torchvision"]

    def span(models, method):
        v = [float(rows[m][method]) for m in models]
        return f"{min(v):.2f}-{max(v):.2f}"

    avg = ["timm avg", "timm beit (avg)", "hf beit-shared-abs"]
    assert {rows[m][k] for m in avg for k in ("grad_rollout", "chefer")} == {"1"}
    distilled = [float(rows[m][k]) for m in ("timm distilled", "hf deit-distilled") for k in ("chefer", "grad_rollout")]
    assert max(float(rows[m]["rollout"]) for m in ("timm distilled", "hf deit-distilled")) < 0.01
    return [f"with mean pooling: rollout {span(avg, 'rollout')}, flow {span(avg, 'flow')}, raw attention "
            f"{span(avg, 'attention')}, Chefer and gradient rollout 1.0",
            f"Chefer and gradient rollout {min(distilled):.2f} and {max(distilled):.2f}, rollout under 0.01",
            f"timm `\"map\"`: rollout {float(rows['timm map']['rollout']):.2f}; SigLIP: rollout "
            f"{float(rows['hf siglip-vision']['rollout']):.2f}"]


def defaults_quoted() -> list[tuple[Path, str]]:
    """Defaults and thresholds the pages quote, read from the code."""
    import inspect

    import vitviz
    from vitviz.analysis.faithfulness_stats import t_ci
    from vitviz.core.families.stream import EXPLICIT_BELOW_BYTES
    from vitviz.core.images import NORMALISED_LIMIT
    from vitviz.core.kernels.forward_lse import HALF_MIN_SCORES

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    assert HALF_MIN_SCORES == 2 ** (HALF_MIN_SCORES.bit_length() - 1)
    scores = f"from 2**{HALF_MIN_SCORES.bit_length() - 1} attention scores"
    assert EXPLICIT_BELOW_BYTES % 2 ** 20 == 0
    return [(DOCS / "gpu.md", scores), (DOCS / "architecture.md", scores),
            (DOCS / "architecture.md", f"calls whose maps take under {EXPLICIT_BELOW_BYTES // 2 ** 20} MiB"),
            (DOCS / "explain.md", f"`max_tokens={default(vitviz.attention_flow, 'max_tokens')}` tokens"),
            (DOCS / "explain.md", f"`epsilon={default(vitviz.attnlrp, 'epsilon'):.0e}` (default)".replace("e-06", "e-6")),
            (DOCS / "explain.md", f"(`gamma={default(vitviz.attnlrp, 'gamma')}`"),
            (DOCS / "explain.md", f"steps={default(vitviz.faithfulness, 'steps')})"),
            (DOCS / "trust.md", f"cache_bytes={default(vitviz.explore_attention, 'cache_bytes') // 2 ** 20} * 2**20"),
            (DOCS / "trust.md", f"values beyond {NORMALISED_LIMIT:g} in magnitude"),
            # the uncut t interval of two images of AUC 0 and 1
            (DOCS / "explain.md", f"give `0.5 +- {(t_ci([0.0, 1.0])[1] - t_ci([0.0, 1.0])[0]) / 2:.1f}`")]


# --- docs/gpu.md -------------------------------------------------------------------------------------------------

def _ratios(path: Path) -> dict[tuple[str, str], float]:
    rows = [r for r in json.loads(path.read_text()) if (r["size"], r["batch"]) == (448, 8)]
    assert {r["gpu"] for r in rows} == {"NVIDIA H200"}
    plain = {r["dtype"]: r["time_s"] for r in rows if r["method"] == "plain"}
    return {(r["dtype"], r["method"]): r["time_s"] / plain[r["dtype"]] for r in rows}


def gpu_page() -> list[str]:
    """docs/gpu.md's H200 figures: eager and recorded calls against the plain forward (run 6), the recording's
    memory pool, and the dataset path (run 5)."""
    eager = _ratios(RESULTS / "h200_gpu_run_6" / "attention_b16.json")
    graphed_rows = json.loads((RESULTS / "h200_gpu_run_6" / "attention_graphed.json").read_text())
    graphed = _ratios(RESULTS / "h200_gpu_run_6" / "attention_graphed.json")
    pool = {(r["dtype"], r["method"]): r for r in graphed_rows}
    # float32 rollout takes the forward's log-sum-exp by default; half types below 2**27 scores do not
    want = [f"eager bfloat16 rollout took {eager[('bf16', 'rollout_kernel')]:.2f}x the plain forward and distance "
            f"{eager[('bf16', 'distance_kernel')]:.2f}x; float32, where the GPU is the bound, "
            f"{eager[('fp32', 'rollout_fwdlse')]:.2f}x and {eager[('fp32', 'distance_kernel')]:.2f}x",
            f"Recorded, bfloat16 rollout took {graphed[('bf16', 'rollout_graphed')]:.2f}x the plain forward and "
            f"distance {graphed[('bf16', 'distance_graphed')]:.2f}x (float32: {graphed[('fp32', 'rollout_graphed')]:.2f}x"
            f" and {graphed[('fp32', 'distance_graphed')]:.2f}x)",
            f"bfloat16 rollout's recording held {pool[('bf16', 'rollout_graphed')]['graph_reserved_mb']:.0f} MB (a "
            f"recording of the plain forward alone holds {pool[('bf16', 'plain_graphed')]['graph_reserved_mb']:.0f} MB;"
            f" the kept `(L, B, N, N)` layer maps take {pool[('bf16', 'plain')]['kept_alloc_mb']:.0f} MB)"]
    dataset = json.loads((RESULTS / "h200_gpu_run_5" / "dataset.json").read_text())
    distance = [r for r in dataset if r["reduction"] == "distance"]
    plain = max(r["images_per_s"] for r in dataset if r["reduction"] == "plain")  # the faster plain forward
    [d] = distance
    want.append(f"mean attention distance over {d['images']:,} images at 224 px ran at "
                f"{100 * d['images_per_s'] / plain:.0f}% of a plain forward's images/s")
    return want


# --- docs/study.md -----------------------------------------------------------------------------------------------

def study_page() -> list[str]:
    """The sweep's size and the prose beside the matched-compute table: the range in decades, the ResNet's lead,
    and the whole-training-set comparisons (an interval "above +x" is the lowest bound, rounded down)."""
    from vitviz.core.io import read_csv_exact
    from vitviz.experiments.compare import matched_compute

    runs = read_csv_exact(DATA / "study" / "hybrid_vs_pure.csv")  # what read_results() reads, without the runner
    hyb, vit, res = "Hybrid", "Transformer (ViT)", "ResNet"
    count = runs.groupby("train_images").size()
    seeds = runs.seed.nunique()
    want = [f"3 seeds each ({count[5000]} runs)", f"3 seeds each ({count[50000]} runs): {len(runs)} runs",
            f"all {runs.test_images.max():,} CIFAR-10 test images", f"{seeds} seeds, points"]
    small, whole = runs[runs.train_images == 5000], runs[runs.train_images == 50000]

    def decades(t):
        return math.log10(t.train_pflops.max() / t.train_pflops.min())

    def floor1(v):
        return f"{math.floor(10 * v) / 10:+.1f}"

    t = matched_compute(small, hyb, vit, n=5)
    r = matched_compute(small, res, hyb, n=5)
    assert (r.gap_low > 0).all()
    want += [f"over this {decades(t):.1f}-decade range",
             f"The ResNet leads the hybrid at every matched compute (by {r.gap.min():.0f}-{r.gap.max():.0f} points)"]
    t = matched_compute(whole, hyb, vit, n=5)
    r = matched_compute(whole, res, hyb, n=5)
    assert (t.gap_low > 0).all() and (r.gap_low > 0).all()
    want += [f"({whole.seed.nunique()} seeds, a {decades(t):.2f}-decade shared range, "
             f"{t.train_pflops.min():.3f}-{t.train_pflops.max():.3f} PFLOPs)",
             f"by {t.gap.iloc[0]:.1f} to {t.gap.iloc[-1]:.1f} points (every 95% CI above {floor1(t.gap_low.min())})",
             f"by {r.gap.iloc[0]:.1f} to {r.gap.iloc[-1]:.1f} points (every CI above {floor1(r.gap_low.min())})"]
    assert runs.device.str.contains("H100 80GB HBM3").all()
    return want + ["One NVIDIA H100 80GB HBM3"]


# --- docs/zoo.md and docs/coverage.md ----------------------------------------------------------------------------

def coverage_counts() -> dict[str, int]:
    """docs/coverage.md's family table (the page `make test-zoo` writes), its columns summed and checked against
    its own "all" row."""
    text = (DOCS / "coverage.md").read_text()
    head = ["supported", "inspect-only", "refused", "build-failed", "wrong", "count"]
    rows = {m.group(1).strip("`*"): [int(v) for v in m.group(2).split(" | ")]
            for m in re.finditer(r"^\| (`[\w*]+`|\*\*all\*\*) \| ([\d |]+?) \|$", text, re.M)
            if len(m.group(2).split(" | ")) == len(head)}
    total = rows.pop("all")
    assert [sum(col) for col in zip(*rows.values())] == total, "the family rows do not add up to the 'all' row"
    assert all(sum(r[:5]) == r[5] for r in rows.values()), "a family's statuses do not add up to its count"
    kinds = sum(int(n) for n in re.findall(r"^\| [\w, -]+ \| (\d+) \|$", text, re.M))
    counts = dict(zip(head, total))
    assert kinds == counts["supported"], "the map-kind table does not count every supported architecture"
    return counts


def coverage_page() -> list[str]:
    c = coverage_counts()
    real = c["supported"] + c["refused"] + c["wrong"]
    return [f"**{c['supported']} of {real} real builds fully supported ({100 * c['supported'] / real:.1f}%)**, "
            f"{c['refused']} refused with the reason, {c['wrong']} silently wrong; {c['inspect-only']} inspected only;"
            f" {c['build-failed']} not buildable by timm; {c['count']} in all."]


def zoo_page() -> list[str]:
    c = coverage_counts()
    real = c["supported"] + c["refused"] + c["wrong"]
    samvit = re.search(r"^\| `samvit_\*` \| ([\d |]+) \|$", (DOCS / "coverage.md").read_text(), re.M).group(1)
    assert int(samvit.split(" | ")[2]) == c["refused"], "every refusal is a samvit_*"
    version = re.search(r"with timm ([\d.]+)", (DOCS / "coverage.md").read_text()).group(1)
    return [f"({c['count']} architectures with timm {version};",
            f"{c['supported']} of {real} real builds fully supported ({100 * c['supported'] / real:.1f}%), "
            f"the {c['refused']} `samvit_*` refused, {c['wrong']} silently wrong, {c['inspect-only']} over 400M "
            "parameters inspected on the meta device"]


# --- data/*/README.md --------------------------------------------------------------------------------------------

def cls_vs_gap_readme() -> list[str]:
    """The two sweeps' budgets and seeds, and each group's training time a run, from the CSVs."""
    small = _last_epochs(DATA / "cls_vs_gap" / "cls_vs_gap.csv")
    big = _last_epochs(DATA / "cls_vs_gap" / "cls_vs_gap_15k.csv")
    want = []
    for df in (small, big):
        assert sorted(df.seed.unique()) == [0, 1, 2, 3, 4] and len(df) == 4 * 5
    assert set(small.epochs_planned) == {8} and set(big.epochs_planned) == {10}
    want += [f"a class-balanced subset of {small.train_images.iloc[0]:,} training images (the first "
             f"{small.train_images.iloc[0] // 10} of each class), {small.epoch.max()} epochs (1 warm-up epoch), "
             f"evaluated after every epoch on a class-balanced {small.test_images.iloc[0]:,}-image test subset",
             f"with {big.train_images.iloc[0]:,} training images ({big.train_images.iloc[0] // 10:,} per class), "
             f"{big.epoch.max()} epochs (1 warm-up) and a {big.test_images.iloc[0]:,}-image test subset",
             "**Five seeds** (0-4) of each of the four runs", "(complete: 4 runs x 10 epochs)"]
    s0, s14 = small[small.seed == 0].train_time_s, small[small.seed > 0].train_time_s
    want += [f"seed 0 first (cores shared with other jobs; {s0.min():.0f}-{s0.max():.0f} s of training a run",
             f"two seeds at a time ({s14.min():.0f}-{s14.max():.0f} s of training a run",
             f"; {_minutes(big[big.seed > 0].train_time_s)} of training a run, the range is the sharing of the two cores)"]
    few = pd.read_csv(DATA / "cls_vs_gap" / "fewshot_by_epoch.csv")
    assert sorted(few.run_seed.unique()) == [0, 1, 2, 3, 4], "fewshot_by_epoch.csv holds all five seeds"
    return want


def layer_probes_readme() -> list[str]:
    probes = pd.read_csv(DATA / "layer_probes" / "cifar10_layer_probes.csv")
    table = pd.read_csv(DATA / "layer_probes" / "cifar10_fewshot_table.csv")
    [shots] = probes.shots.unique()
    [test] = probes.test_images.unique()
    [table_test] = table.test_images.unique()
    models = sorted(probes.model.unique())
    assert models == ["cifar10-hybrid", "cifar10-vit", "cifar10-vit-nopos"]
    assert sorted(table.model.unique()) == ["cifar10-hybrid", "cifar10-vit", "cifar10-vit-1dpos",
                                            "cifar10-vit-2dpos", "cifar10-vit-nopos"]
    return [f"shots=({shots},), seeds=range({probes.seed.nunique()})",
            f"{probes.seed.nunique()} draws of {shots} training images per class",
            f"`vitviz.per_class_subset(model, test, {test // 10})`", f"the first {test // 10} test images of each class",
            f"shots=({', '.join(str(s) for s in sorted(table.shots.unique()))}), seeds=range({table.seed.nunique()})",
            f"the first {table_test // 10} test images of each class ({table_test:,} images)"]


def posemb_fewshot_readme() -> list[str]:
    df = pd.read_csv(DATA / "posemb_fewshot" / "posemb_fewshot.csv")
    seeds = sorted(df.seed.unique())
    assert seeds == list(range(len(seeds)))
    assert sorted(df.model.unique()) == ["cifar10-vit", "cifar10-vit-1dpos", "cifar10-vit-2dpos", "cifar10-vit-nopos"]
    shots = sorted(df.shots.unique())
    return [f"{shots[0]} and {shots[1]} training images per class",
            f"({len(seeds)} draws, seeds 0-{seeds[-1]},", f"scored on all {df.test_images.max():,} `test/` images",
            f"Student-t 95% over the {len(seeds)} draws", "for the four models"]


def posemb_seeds_readme() -> list[str]:
    """Run counts, training times and accuracies of the two sweeps, and the shipped ablation models' cards."""
    runs = _last_epochs(DATA / "posemb_seeds" / "posemb_seeds.csv")
    big = _last_epochs(DATA / "posemb_seeds" / "posemb_seeds_15k.csv")
    few = pd.read_csv(DATA / "posemb_seeds" / "posemb_seeds_fewshot.csv")
    big_few = pd.read_csv(DATA / "posemb_seeds" / "posemb_seeds_15k_fewshot.csv")
    assert few.model.nunique() == len(runs) and big_few.model.nunique() == len(big)
    means = runs.groupby("encoding").test_acc.mean()
    ablation = pd.DataFrame({m: card(m) for m in ("cifar10-vit-nopos", "cifar10-vit-1dpos", "cifar10-vit-2dpos")}).T
    assert set(ablation.epochs) == {32}
    top1 = ablation.test_top1.astype(float)
    about = math.floor(means.min())
    assert means.max() < about + 1, f"the three encodings' means {means.round(2).to_dict()} are not all {about}.x %"
    return [f"All {len(runs)} runs on an AMD EPYC CPU",
            f"({runs.train_time_s.min():.0f}-{runs.train_time_s.max():.0f} s of training",
            f"the few-shot measurement took two minutes for all {few.model.nunique()}",
            f"(about {about} % test top-1, against {top1.min():.0f}-{top1.max():.0f} % for the shipped "
            f"models after {ablation.epochs.iloc[0]} epochs",
            f"are {top1['cifar10-vit-1dpos'] - top1['cifar10-vit-nopos']:.1f} (1-D) and "
            f"{top1['cifar10-vit-2dpos'] - top1['cifar10-vit-nopos']:.1f} (2-D) points above none in top-1",
            f"{_minutes(big.train_time_s)} a run (the range is the sharing of the two cores), the few-shot "
            f"measurement a minute for all {big_few.model.nunique()}",
            f"(complete: 3 encodings x {big.seed.nunique()} seeds x {big.epoch.max()} epochs)"]


def data_readmes() -> list[tuple[Path, str]]:
    """data/README.md's account of the sweeps, and data/study/README.md's of the archived CPU sweep."""
    small = _last_epochs(DATA / "posemb_seeds" / "posemb_seeds.csv")
    big = _last_epochs(DATA / "posemb_seeds" / "posemb_seeds_15k.csv")
    archive = pd.read_csv(DATA / "study" / "archive" / "hybrid_vs_pure_cpu_seed0_2k_test.csv")
    assert archive.seed.nunique() == 1
    return [(DATA / "README.md", f"trained again at {WORDS[small.seed.nunique()]} seeds on a small budget"),
            (DATA / "README.md", f"the same at {WORDS[big.train_images.iloc[0] // small.train_images.iloc[0]]} times "
                                 f"the images ({big.train_images.iloc[0]:,} images, {big.epoch.max()} epochs, "
                                 f"{WORDS[big.seed.nunique()]} seeds)"),
            (DATA / "study" / "README.md", f"the earlier one-seed CPU sweep ({archive.train_images.max():,} training "
                                           f"images, {archive.test_images.max():,} test images)")]


def trust_page() -> list[str]:
    """The nopos model's score on its card's 500-image subset (the figure an old timm misses)."""
    return [f"scores 20.6% instead of {card('cifar10-vit-nopos')['test_top1_subset500']:.1f}% on its card's "
            "500-image subset"]


CASES = {
    "explain.md: 500 images with flow": (DOCS / "explain.md", explain_500_images),
    "explain.md: 1,000 images, Chefer's convention and whole patches": (DOCS / "explain.md", explain_1000_images),
    "explain.md: against lxt": (DOCS / "explain.md", explain_lxt),
    "explain.md: Quantus": (DOCS / "explain.md", explain_quantus),
    "explain.md: faithfulness loop on the GPU": (DOCS / "explain.md", explain_gpu_faithfulness),
    "explain.md: maps read at the pooled tokens": (DOCS / "explain.md", explain_readout_maps),
    "gpu.md": (DOCS / "gpu.md", gpu_page),
    "study.md": (DOCS / "study.md", study_page),
    "coverage.md": (DOCS / "coverage.md", coverage_page),
    "zoo.md": (DOCS / "zoo.md", zoo_page),
    "data/cls_vs_gap/README.md": (DATA / "cls_vs_gap" / "README.md", cls_vs_gap_readme),
    "data/layer_probes/README.md": (DATA / "layer_probes" / "README.md", layer_probes_readme),
    "data/posemb_fewshot/README.md": (DATA / "posemb_fewshot" / "README.md", posemb_fewshot_readme),
    "data/posemb_seeds/README.md": (DATA / "posemb_seeds" / "README.md", posemb_seeds_readme),
    "trust.md": (DOCS / "trust.md", trust_page),
}


def missing_figures(page: Path, figures: list[str]) -> list[str]:
    text = text_of(page)
    return [f for f in figures if " ".join(f.split()) not in text]


@pytest.mark.parametrize("case", list(CASES))
def test_the_figures_a_page_quotes_are_its_recorded_source(case):
    page, figures = CASES[case]
    want = figures()
    assert want, case
    missing = missing_figures(page, want)
    assert not missing, f"{page.relative_to(ROOT)} does not say (recomputed from its source): {missing}"


def test_the_defaults_and_thresholds_quoted_are_the_codes():
    missing = [f"{page.name}: {figure}" for page, figure in defaults_quoted() if missing_figures(page, [figure])]
    assert not missing, f"not said as the code has it: {missing}"


def test_the_data_folder_readmes_describe_the_committed_tables():
    missing = [f"{page.relative_to(ROOT)}: {figure}" for page, figure in data_readmes()
               if missing_figures(page, [figure])]
    assert not missing, f"not what the tables hold: {missing}"


def test_a_changed_figure_is_seen(tmp_path):
    """The check reads the page: one figure of the 500-image table changed by a unit in its last digit fails it."""
    page = tmp_path / "explain.md"
    text = (DOCS / "explain.md").read_text()
    row = "| attnlrp | 0.257 [0.238, 0.276] |"
    assert row in text
    page.write_text(text.replace(row, "| attnlrp | 0.258 [0.238, 0.276] |"))
    assert missing_figures(page, explain_500_images()) == [
        "| attnlrp | 0.257 [0.238, 0.276] | 0.722 [0.687, 0.753] | 0.189 [0.176, 0.202] | 0.816 [0.809, 0.822] |"]
