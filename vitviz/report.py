"""``python -m vitviz report``: render every vitviz figure for the embedded reference models, offline.

Writes ``<out>/figures/<name>.{png,pdf,svg}``, ``<out>/arrays/<name>.npz`` (the numbers behind each figure),
``<out>/meta.json`` (models, settings, versions, device, git commit) and ``<out>/index.html`` (a page that shows
the figures). A figure that fails is reported by name and the others are still written.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
import subprocess
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz._io import atomic_write, atomic_write_json, atomic_write_text
from vitviz.checkpoints import versions
from vitviz.models import WeightsUnavailableError, load_model
from vitviz.reference import build_reference

DEFAULT_MODELS = ("cifar10-vit", "cifar10-vit-2dpos", "cifar10-hybrid")


@dataclass
class LoadedModel:
    key: str
    model: nn.Module
    trained: bool
    note: str = ""


@dataclass
class Report:
    out: Path
    formats: tuple[str, ...] = ("png", "pdf", "svg")
    figures: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)


def load_or_random(name: str, device: str = "auto") -> LoadedModel:
    """A reference model with its shipped weights, or with random weights and a note saying so."""
    try:
        return LoadedModel(name, load_model(name, device=device), True)
    except WeightsUnavailableError:
        model = build_reference(name).eval()
        return LoadedModel(name, model, False, "random weights: the trained checkpoint is not in data/checkpoints")


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _figure_jobs(m: LoadedModel) -> list[tuple[str, Callable[[], tuple[Any, dict[str, np.ndarray]]]]]:
    import vitviz

    spec = vitviz.inspect(m.model)
    jobs = []
    if spec.has_abs_pos_embed:
        def pos() -> tuple[Any, dict[str, np.ndarray]]:
            sim = vitviz.pos_embed_similarity(m.model)
            return vitviz.plot_pos_embed(m.model), {"similarity": sim.numpy(),
                                                     "locality": np.array(vitviz.pos_embed_locality(m.model))}

        jobs.append((f"{m.key}_pos_embed", pos))

    def filters() -> tuple[Any, dict[str, np.ndarray]]:
        weights, _source = vitviz.embedding_filters(m.model)
        comps, ratio = vitviz.filter_pca(weights)
        return vitviz.plot_embedding_filters(m.model), {"components": np.asarray(comps),
                                                         "explained_variance_ratio": np.asarray(ratio)}

    jobs.append((f"{m.key}_embedding_filters", filters))
    return jobs


def _global_jobs() -> list[tuple[str, Callable[[], tuple[Any, dict[str, np.ndarray]]]]]:
    """Figures that do not depend on a model: the paper's Fig. 5 and the measured small-scale study."""
    import vitviz
    from vitviz.study import read_results

    def paper() -> tuple[Any, dict[str, np.ndarray]]:
        df = vitviz.paper_results()
        return vitviz.plot_compute_curves(df, frontier=True), {c: df[c].to_numpy() for c in
                                                                ("exaflops", "avg5", "imagenet")}

    jobs = [("paper_fig5_compute_curves", paper)]
    measured = read_results()
    if len(measured):
        def study() -> tuple[Any, dict[str, np.ndarray]]:
            fig = vitviz.plot_compute_curves(measured, metrics=("test_acc",), x="train_pflops", frontier=True,
                                             annotate=True)
            return fig, {c: measured[c].to_numpy() for c in ("train_pflops", "test_acc", "epochs")}

        jobs.append(("study_hybrid_vs_pure", study))
    return jobs


def _save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def render_report(out: str | os.PathLike = "reports", models: tuple[str, ...] = DEFAULT_MODELS,
                  formats: tuple[str, ...] = ("png", "pdf", "svg"), device: str = "auto",
                  progress: bool = True) -> Report:
    """Render every figure for ``models`` into ``out``; return what was written and what failed."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from tqdm.auto import tqdm

    import vitviz

    report = Report(Path(out), tuple(formats))
    (report.out / "figures").mkdir(parents=True, exist_ok=True)
    (report.out / "arrays").mkdir(parents=True, exist_ok=True)
    loaded = [load_or_random(name, device) for name in models]
    none = LoadedModel("", nn.Identity(), True)
    jobs = [(m, name, fn) for m in loaded for name, fn in _figure_jobs(m)]
    jobs += [(none, name, fn) for name, fn in _global_jobs()]
    for m, name, fn in tqdm(jobs, desc="vitviz report", disable=not progress):
        try:
            fig, arrays = fn()
            paths = vitviz.save_figure(fig, report.out / "figures" / name, formats=report.formats)
            plt.close(fig)
            atomic_write(report.out / "arrays" / f"{name}.npz", lambda tmp, a=arrays: _save_npz(tmp, a))
            report.figures.append({"name": name, "model": m.key or None, "trained": m.trained, "note": m.note,
                                   "files": [str(Path(p).relative_to(report.out)) for p in paths]})
        except Exception as e:  # keep going: one broken figure must not lose the others
            report.failures.append({"name": name, "error": f"{type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()})
    meta = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "models": {m.key: {"trained": m.trained, "note": m.note, "spec": repr(vitviz.inspect(m.model))}
                   for m in loaded},
        "formats": list(report.formats),
        "device": str(next(loaded[0].model.parameters()).device) if loaded else None,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": versions(),
        "git_commit": git_commit(),
        "figures": report.figures,
        "failures": [{k: v for k, v in f.items() if k != "traceback"} for f in report.failures],
    }
    atomic_write_json(report.out / "meta.json", meta)
    atomic_write_text(report.out / "index.html", _index_html(report, meta))
    return report


def _index_html(report: Report, meta: dict[str, Any]) -> str:
    rows = []
    for fig in report.figures:
        png = next((f for f in fig["files"] if f.endswith(".png")), None)
        note = f"<p class=note>{html.escape(fig['note'])}</p>" if fig["note"] else ""
        img = f'<img src="{html.escape(png)}" alt="{html.escape(fig["name"])}">' if png else ""
        links = " ".join(f'<a href="{html.escape(f)}">{html.escape(Path(f).suffix[1:])}</a>' for f in fig["files"])
        rows.append(f"<section><h2>{html.escape(fig['name'])}</h2>{note}{img}<p>{links}</p></section>")
    for f in report.failures:
        rows.append(f"<section><h2>{html.escape(f['name'])} (failed)</h2><pre>{html.escape(f['traceback'])}</pre>"
                    "</section>")
    specs = "".join(f"<h3>{html.escape(k)}</h3><pre>{html.escape(v['spec'])}</pre>" for k, v in meta["models"].items())
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>vitviz report</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:100%}"
        ".note{color:#a33}</style></head><body><h1>vitviz report</h1>"
        f"<p>{html.escape(meta['created'])}, vitviz {html.escape(meta['versions']['vitviz'])}, "
        f"commit {html.escape(str(meta['git_commit']))}</p>{specs}{''.join(rows)}</body></html>\n"
    )
