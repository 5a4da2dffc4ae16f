"""Figures of representation probes: accuracy by depth (``plot_layer_probes``) and the class-token-versus-GAP
training curves in the style of the ViT paper's Fig. 9 (``plot_cls_vs_gap``), and Table 8's comparisons over training
seeds (``plot_posemb_seeds``)."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from vitviz.errors import InputError
from vitviz.plot.layout import ACCURACY_TOP, place_legend
from vitviz.plot.style import FIGSIZE, label, new_figure, styled


def _colors(n: int) -> list:
    cmap = mpl.colormaps["viridis"]
    return [cmap(v) for v in (np.linspace(0.0, 0.85, n) if n > 1 else [0.3])]


@styled
def plot_layer_probes(df: pd.DataFrame, *, ax: Axes | None = None, level: float = 0.95) -> Axes:
    """Few-shot linear accuracy of each block's representation by depth, one line per model (and shots).

    Args:
        df: rows of ``vitviz.layer_probes`` (one per model, layer, shots and draw), several models concatenated.
        ax: the Axes to draw in (default: a new figure).
        level: the interval drawn around each mean (Student-t over draws).

    Returns:
        the Axes: x "Block (depth)", y "Few-shot linear top-1 [%]"; the pre-logits representation (after the final
        norm and pooling) is an unjoined marker one step past the last block.
    """
    from vitviz.analysis.representations import summarize_probes

    need = {"model", "layer", "depth", "shots", "accuracy"}
    if not need <= set(df.columns) or df.empty:
        raise InputError(f"plot_layer_probes needs rows of vitviz.layer_probes (columns {sorted(need)}), got "
                         f"{sorted(df.columns)} with {len(df)} rows")
    s = summarize_probes(df, level=level)
    if ax is None:
        fig = new_figure(FIGSIZE["wide"])
        fig.set_layout_engine("constrained")  # the labels inside the figure, as in every vitviz figure
        ax = fig.add_subplot()
    groups = list(s.groupby(["model", "shots"], sort=False))
    colors = _colors(len(groups))
    for color, ((model, shots), g) in zip(colors, groups):
        blocks = g[g.layer != "pre_logits"].sort_values("depth")
        ax.plot(blocks.depth, blocks.accuracy, "o-", color=color, markersize=3.5, label=f"{model}, {shots}-shot")
        if blocks.low.notna().any():
            ax.fill_between(blocks.depth, blocks.low, blocks.high, color=color, alpha=0.2, linewidth=0)
        pre = g[g.layer == "pre_logits"]
        if not pre.empty:
            p = pre.iloc[0]
            yerr = None if np.isnan(p.low) else [[p.accuracy - p.low], [p.high - p.accuracy]]
            ax.errorbar([p.depth], [p.accuracy], yerr=yerr, fmt="D", color=color, markersize=4, capsize=2)
    depths = sorted(int(d) for d in s.depth.unique())
    labels = [str(d) for d in depths]
    if (s.layer == "pre_logits").any():
        pre_depths = set(int(d) for d in s[s.layer == "pre_logits"].depth)
        labels = ["pre-\nlogits" if d in pre_depths and not (s[s.depth == d].layer != "pre_logits").any() else str(d)
                  for d in depths]
    ax.set_xticks(depths, labels)
    ax.set_xlabel("Block (depth)")
    ax.set_ylabel(label("Few-shot linear top-1", "%"))
    draws = int(s.draws.max())
    ax.set_title(f"Where the representation forms ({draws} draws, {int(level * 100)}% intervals)")
    ax.grid(alpha=0.3)
    # not loc="best": matplotlib 3.8 counts a band only by its outline there, and put the legend on the intervals
    place_legend(ax, frameon=False, ymax=ACCURACY_TOP)
    return ax


@styled
def plot_cls_vs_gap(df: pd.DataFrame, *, ax: Axes | None = None, metric: str = "test_acc") -> Axes:
    """Accuracy after each epoch, one line per head type (class token, GAP) and learning rate: the ViT paper's
    Fig. 9 at CIFAR-10 scale (the paper plots ImageNet 5-shot linear top-1 over ~7 epochs of JFT pre-training).

    Args:
        df: ``vitviz.experiments.cls_vs_gap.read_cls_vs_gap()`` rows (``head, lr, seed, epoch`` and ``metric``);
            several seeds are averaged, their range (lowest to highest seed) shaded; the legend's title says so.
        ax: the Axes (default: a new figure).
        metric: the column to draw (``test_acc``: CIFAR-10 test top-1 %, or ``fewshot5`` when present: ``fewshot<K>``
            for K shots, labelled with its K).

    Returns:
        the Axes.
    """
    need = {"head", "lr", "epoch", metric}
    if not need <= set(df.columns) or df.empty:
        raise InputError(f"plot_cls_vs_gap needs columns {sorted(need)}, got {sorted(df.columns)} ({len(df)} rows)")
    if ax is None:
        fig = new_figure(FIGSIZE["single"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    styles = {"cls": "-", "gap": "--"}
    lrs = sorted(df.lr.unique(), reverse=True)
    colors = dict(zip(lrs, _colors(len(lrs))))
    counts = df.groupby(["head", "lr"]).seed.nunique() if "seed" in df else pd.Series(1, index=[0])
    same = counts.nunique() == 1  # every line over the same number of seeds: the legend's title says it once
    for (head, lr), g in df.groupby(["head", "lr"], sort=True):
        by = g.groupby("epoch")[metric]
        mean = by.mean()
        name = "CLS-Token" if head == "cls" else "GAP"
        seeds = g.seed.nunique() if "seed" in g else 1
        ax.plot(mean.index, mean.values, styles.get(head, ":"), marker="o", markersize=3, color=colors[lr],
                label=f"{name}, lr={lr:.3g}" + (f" ({seeds} seeds)" if seeds > 1 and not same else ""))
        if seeds > 1:
            ax.fill_between(mean.index, by.min().values, by.max().values, color=colors[lr], alpha=0.2, linewidth=0)
    ax.set_xlabel("Epochs of training")
    name = _measure_name(metric)
    ax.set_ylabel(label(name, "%") if name != metric else metric)
    ax.grid(alpha=0.3)
    many = int(counts.max()) > 1
    title = (f"mean of {int(counts.max())} seeds, band: their range" if many and same
             else "mean over seeds, band: their range" if many else None)
    place_legend(ax, frameon=False, ymax=ACCURACY_TOP, title=title, title_fontsize="small")
    return ax


_ENCODING_NAMES = {"none": "none", "1d": "1-D", "2d": "2-D"}
_MEASURE_NAMES = {"test_acc": "CIFAR-10 test top-1", "train_acc": "CIFAR-10 train top-1"}


def _measure_name(metric: str) -> str:
    """A measure's name for a label: ``fewshot<K>`` (``mean_over_draws``) says its own shot count."""
    from vitviz.experiments.posemb_seeds import fewshot_shots

    shots = fewshot_shots(metric)
    return f"CIFAR-10 {shots}-shot linear top-1" if shots is not None else _MEASURE_NAMES.get(metric, metric)


@styled
def plot_posemb_seeds(df: pd.DataFrame, *, ax: Axes | None = None, metric: str = "test_acc") -> Axes:
    """Table 8's comparisons over training seeds: per comparison (1-D minus none, 2-D minus none, 2-D minus 1-D),
    each seed's difference (a dot), their mean with its 95 % Student-t interval paired by seed (a bar), and the
    paper's difference (Table 8, ViT-B/16, ImageNet 5-shot linear; an open diamond), in percentage points.

    Args:
        df: ``vitviz.experiments.posemb_seeds.read_posemb_seeds()`` rows (or ``read_posemb_seeds_fewshot()`` with
            ``metric="fewshot5"``); the last epoch of every run is compared (``posemb_seed_claims``).
        ax: the Axes (default: a new figure).
        metric: the column compared (``test_acc``, ``train_acc`` or ``fewshot5``: ``fewshot<K>`` for K shots).

    Returns:
        the Axes.
    """
    from vitviz.experiments.posemb_seeds import claims_of_differences, posemb_seed_differences

    diffs = posemb_seed_differences(df, metric)
    claims = claims_of_differences(diffs)
    if claims.empty:
        raise InputError(f"plot_posemb_seeds: df holds the encodings {sorted(set(df.encoding))}, no two of a "
                         "comparison (1d and none, 2d and none, or 2d and 1d); pass the sweep's results")
    if ax is None:
        fig = new_figure(FIGSIZE["single"])
        fig.set_layout_engine("constrained")
        ax = fig.add_subplot()
    names = [f"{_ENCODING_NAMES[c.arm]} minus {_ENCODING_NAMES[c.minus]}" for c in claims.itertuples()]
    y = np.arange(len(claims))[::-1]  # the first comparison on top
    seeds = int(claims.seeds.max())
    for yi, c in zip(y, claims.itertuples()):
        d = diffs[(diffs.arm == c.arm) & (diffs.minus == c.minus)].difference.to_numpy()
        ax.plot(d, np.full(len(d), yi + 0.18), "o", color="0.55", markersize=3.5, linestyle="none",
                label=f"one seed ({seeds} seeds)" if yi == y[0] else None)
        if seeds > 1:
            ax.errorbar(c.difference, yi, xerr=[[c.difference - c.low], [c.high - c.difference]], fmt="o",
                        color="black", markersize=5, capsize=3,
                        label="mean, 95% interval paired by seed" if yi == y[0] else None)
        else:
            ax.plot(c.difference, yi, "o", color="black", markersize=5, label="one seed: no interval"
                    if yi == y[0] else None)
        ax.plot(c.paper, yi - 0.18, "D", markerfacecolor="none", markeredgecolor="tab:red", markersize=5,
                linestyle="none", label="paper (Table 8, ImageNet 5-shot)" if yi == y[0] else None)
    ax.axvline(0.0, color="0.3", linewidth=0.8, zorder=0)
    ax.set_yticks(y, names)
    ax.set_ylim(y.min() - 0.6, y.max() + 1.4)  # room above for the legend
    ax.set_title(_measure_name(metric), fontsize="medium")
    ax.set_xlabel(label("Difference", "percentage points"))
    ax.grid(axis="x", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    rank = ("one seed", "mean", "paper")  # the dots, the interval, the paper
    order = sorted(range(len(names)), key=lambda i: next(r for r, p in enumerate(rank) if names[i].startswith(p)))
    ax.legend([handles[i] for i in order], [names[i] for i in order], loc="upper center", frameon=False,
              fontsize="small")
    return ax


def sweep_budget(runs: pd.DataFrame) -> str:
    """The training budget of a seed sweep's rows as a line of text (``"CIFAR-10, 10 seeds, 5,000 training images,
    8 epochs, 1,000 test images"``): the parts its columns hold one value of (``seed``, ``train_images``,
    ``epochs_planned``, ``test_images``), ``""`` when none does."""
    parts = []
    if "seed" in runs:
        parts.append(f"{runs.seed.nunique()} seed{'s' * (runs.seed.nunique() != 1)}")
    for column, unit in (("train_images", "training images"), ("epochs_planned", "epochs"),
                         ("test_images", "test images")):
        if column in runs and runs[column].nunique() == 1:
            parts.append(f"{int(runs[column].iloc[0]):,} {unit}")
    return ", ".join(["CIFAR-10", *parts]) if parts else ""


@styled
def plot_posemb_seeds_grid(runs: pd.DataFrame | None = None, fewshot: pd.DataFrame | None = None) -> Figure:
    """``plot_posemb_seeds`` for both measures side by side: CIFAR-10 test top-1 after the last epoch (left) and
    few-shot linear accuracy of the same weights' pre-logits (right, Table 8's measure: 5 shots in the committed
    tables; the panel's title says the table's shot count), one legend, titled with the
    sweep's budget (``sweep_budget``: seeds, training images, epochs, test images).

    Args:
        runs: ``read_posemb_seeds()`` rows (default: the committed ``data/posemb_seeds`` sweep).
        fewshot: ``read_posemb_seeds_fewshot()`` rows (default: the committed table when ``runs`` is the default,
            else none: the figure has the left panel only).

    Returns:
        the figure.
    """
    from vitviz.experiments.posemb_seeds import fewshot_metric, read_posemb_seeds, read_posemb_seeds_fewshot

    if runs is None:
        runs = read_posemb_seeds()
        fewshot = read_posemb_seeds_fewshot() if fewshot is None else fewshot
    panels = [("test_acc", runs)] + ([(fewshot_metric(fewshot), fewshot)] if fewshot is not None else [])
    budget = sweep_budget(runs)
    fig = new_figure((FIGSIZE["wide"][0], 2.9 + 0.25 * bool(budget)) if len(panels) == 2 else FIGSIZE["single"])
    fig.set_layout_engine("constrained")
    if budget:  # which sweep: the same comparisons at another budget give other differences
        fig.suptitle(budget, fontsize="medium")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for i, (ax, (metric, df)) in enumerate(zip(axes, panels)):
        plot_posemb_seeds(df, ax=ax, metric=metric)
        if i:
            ax.get_legend().remove()  # one legend for both panels
    return fig
