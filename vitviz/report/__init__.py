"""``python -m vitviz report``: the notebooks executed headless, plus every package figure, offline.

Two kinds of steps, each shown by a tqdm bar and each allowed to fail without losing the others:

- the notebooks of ``notebooks/`` run with papermill (``vitviz.report.notebooks``): each gets ``out_dir`` (its
  figures go to ``<out>/figures``), ``arrays_dir`` (``<out>/arrays``) and, when given, the model and an image
  folder; the executed notebooks are written to ``<out>/notebooks/<name>.ipynb`` and as self-contained HTML;
- the package figures for the reference models (or ``--model``): ``<out>/figures/<model>_<figure>.{png,pdf,svg}``
  with the numbers behind each in ``<out>/arrays/<name>.npz``; with several models, ``compare_attention_distance``
  puts their attention distances side by side (``_comparison_jobs``).

``<out>/meta.json`` records the model, resolution, settings, versions, device and git commit (and, for each figure
averaged over images, which images: ``<figure>.npz`` holds their paths or names), and
``<out>/index.html`` links every notebook page and shows every figure. A failed notebook names its cell.

Both are written before the first step (``"status": "running"``, no figures, notebooks or failures yet) and again
after every step, so they list exactly the files this run has written so far, never an earlier run's over new
files; ``"status"`` is ``"complete"`` once every step ran, and ``"interrupted"`` where the run was stopped
(Ctrl-C, an exception outside the steps); a run killed outright (``kill -9``, a job's time limit) stays
``"running"``. ``write_gallery`` takes figures from a complete report only (``STATUS_COMPLETE``).

A rerun into the same folder starts clean: once its models have loaded, the earlier report's ``figures/``,
``arrays/`` and ``notebooks/`` are emptied (``_start_clean``), so the folders never mix an earlier run's files (a
figure that failed this time, a file a killed run wrote before its ``meta.json`` listed it) with new ones. A folder
whose subfolders hold files but that has no ``meta.json`` (not a vitviz report) is refused, and left untouched.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.io import atomic_write, atomic_write_json, atomic_write_text, save_arrays
from vitviz.errors import DataNotFoundError, InputError
from vitviz.zoo.models import load_model_or_random
from vitviz.zoo.reference import REFERENCE_MODELS
from vitviz.zoo.weights import versions

DEFAULT_MODELS = ("cifar10-vit", "cifar10-vit-2dpos", "cifar10-hybrid")
IMAGE_SOURCE = "image_source"  # the array naming the images a figure was computed on; also its meta.json entry
# meta.json's "status": the run is under way (or was killed), stopped part-way, or ran every step
STATUS_RUNNING, STATUS_INTERRUPTED, STATUS_COMPLETE = "running", "interrupted", "complete"
Job = Callable[[], tuple[Any, dict[str, np.ndarray]]]


@dataclass
class LoadedModel:
    key: str
    model: nn.Module
    trained: bool
    note: str = ""
    checkpoint: Path | None = None  # the weights file it was loaded from, when one was given


@dataclass
class Report:
    out: Path
    formats: tuple[str, ...] = ("png", "pdf", "svg")
    figures: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    notebooks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def model_key(name: str) -> str:
    """A file-name-safe key for a model name or weights path (``"runs/my vit.pth"`` -> ``"my_vit"``)."""
    stem = Path(name).stem if os.sep in name or Path(name).suffix in (".safetensors", ".pth", ".pt", ".bin",
                                                                     ".npz") else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)


def load_or_random(name: str, device: str = "auto", checkpoint: str | os.PathLike | None = None,
                   key: str | None = None) -> LoadedModel:
    """``vitviz.load_model_or_random`` wrapped with the report's key (default ``model_key(name)``) and a note for
    random weights; with a ``checkpoint`` (a weights file for ``name``'s architecture), its weights or an error."""
    model = load_model_or_random(name, checkpoint=checkpoint, device=device, verbose=False)
    key = model_key(name) if key is None else key
    file = None if checkpoint is None else Path(checkpoint)
    if not model.vitviz_random_weights:
        return LoadedModel(key, model, True, checkpoint=file)
    note = ("random weights: the trained checkpoint is not in vitviz/zoo/checkpoints" if name in REFERENCE_MODELS
            else "random weights: a timm architecture without pretrained weights")
    return LoadedModel(key, model, False, note, file)


Weights = str | os.PathLike | None


def model_weights(names: Sequence[str], model: str | None,
                  checkpoint: Weights | Sequence[Weights]) -> list[tuple[str, Path | None, str]]:
    """``render_report``'s models with their weights files and keys: ``(name, checkpoint or None, key)`` each.

    ``checkpoint`` is one file (for ``model``, wherever it is among ``names``) or one entry per name, in order (a
    file, or ``None`` for the model's own weights). A key is ``model_key(name)``; a name given more than once (two
    checkpoints of one architecture) is told apart by its file's stem (``vit_b16-step1000``; ``-own`` without one).
    Every file must exist and every key be distinct: figures of two models must never share a file name.
    """
    if checkpoint is None or isinstance(checkpoint, (str, os.PathLike)):
        if checkpoint is not None and not model:
            raise InputError(f"checkpoint={str(checkpoint)!r} without model=: pass the architecture the file holds, "
                             "model='<timm model name>' (or a reference model's name)")
        files: list[Weights] = [checkpoint if checkpoint is not None and name == model else None for name in names]
        given = [] if checkpoint is None else [(model, checkpoint)]  # checked also where model is not among names
    else:
        files = list(checkpoint)
        if len(files) != len(names):
            raise InputError(f"checkpoint= holds {len(files)} files for {len(names)} models {list(names)}: pass one "
                             "entry per model, in the same order (None for a model's own weights)")
        given = [(name, file) for name, file in zip(names, files) if file is not None]
    for name, file in given:
        if not Path(file).is_file():
            raise DataNotFoundError(f"checkpoint={str(file)!r} is not a file; pass the weights file of {name!r} "
                                    "(.safetensors, .pth/.pt/.bin or .npz)")
    paths = [None if file is None else Path(file).resolve() for file in files]  # the notebooks run in their own folder
    twice = {name for name in names if list(names).count(name) > 1}
    keys = [model_key(name) if name not in twice else f"{model_key(name)}-{model_key(str(f)) if f else 'own'}"
            for name, f in zip(names, paths)]
    clash = sorted({k for k in keys if keys.count(k) > 1})
    if clash:
        clashing = [(n, None if f is None else str(f)) for n, f, k in zip(names, paths, keys) if k in clash]
        raise InputError(f"models and checkpoints {clashing} would write figures under the same name {clash[0]!r}: "
                         "give each model once, or each copy of one architecture a weights file of its own name")
    return list(zip(names, paths, keys))


def git_commit() -> str | None:
    """The commit of the git checkout this vitviz runs from, or ``None`` (an installed wheel: no checkout).

    Asks git about the package's own folder, and only when git tracks this very file there (a wheel installed into
    a virtual environment inside some repository is not that repository's code).
    """
    here = Path(__file__).resolve()
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(here.parent), *args], capture_output=True, text=True,
                                  check=True, timeout=5).stdout.strip()

        git("ls-files", "--error-unmatch", here.name)
        return git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None


def git_dirty() -> bool | None:
    """Whether the checkout of ``git_commit`` has changes to tracked files that are not committed (the report was then
    rendered from code that commit does not hold); ``None`` where there is no checkout."""
    if git_commit() is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "status", "--porcelain",
                              "--untracked-files=no"], capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.strip())


DISTANCE_IMAGES = 128  # images the attention-distance figures average over (the paper's 128)


def _figure_jobs(m: LoadedModel, images: Any = None,
                 distances: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, Job]]:
    """The figures of one model; its attention distances also go to ``distances[m.key]`` (for
    ``_comparison_jobs``) when that is given. ``images``: the ``ImageSet`` of ``--images``, listed once by
    ``render_report`` (``None``: CIFAR-10 test images from ``$VITVIZ_DATA``, else scikit-image's photographs)."""
    import vitviz

    spec = vitviz.inspect(m.model)
    jobs = []

    def with_file(ax: Any) -> Any:  # a figure drawn from a given file says which, also seen outside the report
        if m.checkpoint is not None:
            ax.set_title(f"{ax.get_title()}\nweights: {m.checkpoint.name}")
        return ax.figure

    if spec.has_abs_pos_embed:
        def pos() -> tuple[Any, dict[str, np.ndarray]]:
            sim = vitviz.pos_embed_similarity(m.model)
            arrays = {"similarity": sim.numpy(), "locality": np.array(vitviz.pos_embed_locality(m.model))}
            return with_file(vitviz.plot_pos_embed(m.model)), arrays

        jobs.append((f"{m.key}_pos_embed", pos))

    def filters() -> tuple[Any, dict[str, np.ndarray]]:
        weights, _source = vitviz.embedding_filters(m.model)
        comps, ratio = vitviz.filter_pca(weights)
        arrays = {"components": np.asarray(comps), "explained_variance_ratio": np.asarray(ratio)}
        return with_file(vitviz.plot_embedding_filters(m.model)), arrays

    jobs.append((f"{m.key}_embedding_filters", filters))

    def distance() -> tuple[Any, dict[str, np.ndarray]]:
        from vitviz.zoo.samples import example_images

        # --images (a file, a flat folder or a class tree), else CIFAR-10 test images from $VITVIZ_DATA, else photographs
        found = images if images is not None else example_images(None, DISTANCE_IMAGES)
        dist = vitviz.mean_attention_distance(m.model, found.images)
        ax = vitviz.plot_attention_distance(dist, label=f"{m.key} ({len(found)} images)")
        names = [str(i) if isinstance(i, (str, os.PathLike)) else label for i, label in zip(found.images, found.labels)]
        px = dist.numpy()
        if distances is not None:
            distances[m.key] = {"distance_px": px, "images": len(found), "source": found.source}
        return with_file(ax), {"distance_px": px, "images": np.array(names, dtype=str),
                               "labels": np.array(found.labels, dtype=str), IMAGE_SOURCE: np.array(found.source)}

    jobs.append((f"{m.key}_attention_distance", distance))
    return jobs


def _comparison_jobs(distances: dict[str, dict[str, Any]]) -> list[tuple[str, Job]]:
    """Figures of several models side by side, drawn from what their own figures computed (``_figure_jobs``): the
    mean attention distance of every model on one shared y axis (Fig. 11's layout), each on the same images."""
    import vitviz

    def distance() -> tuple[Any, dict[str, np.ndarray]]:
        if len(distances) < 2:
            raise InputError(f"the comparison needs the attention distances of two models or more; only "
                             f"{sorted(distances) or 'none'} had them (see the failures above)")
        sources = {d["source"] for d in distances.values()}
        counts = {d["images"] for d in distances.values()}
        fig = vitviz.plot_attention_distance_grid({k: d["distance_px"] for k, d in distances.items()})
        same = len(sources) == len(counts) == 1  # example_images: one source and count, the same images
        fig.suptitle(f"Mean attention distance, the same {next(iter(counts))} images" if same else
                     "Mean attention distance (each panel's title: the model)")
        return fig, {**{f"distance_px_{k}": d["distance_px"] for k, d in distances.items()},
                     "models": np.array(list(distances), dtype=str), IMAGE_SOURCE: np.array("; ".join(sorted(sources)))}

    return [("compare_attention_distance", distance)]


def _global_jobs() -> list[tuple[str, Job]]:
    """Figures that do not depend on a model: the paper's Fig. 5, Table 8 from the shipped models' cards and over
    training seeds (``table8_posemb_seeds<suffix>``, one per committed sweep of ``posemb_seeds.SWEEPS``), and the
    measured small-scale study."""
    import vitviz
    from vitviz.experiments.study import read_results

    def paper() -> tuple[Any, dict[str, np.ndarray]]:
        df = vitviz.paper_results()
        return vitviz.plot_compute_curves(df, frontier=True), _columns(df, ("family", "model", "epochs", "exaflops",
                                                                            "avg5", "imagenet"))

    jobs = [("paper_fig5_compute_curves", paper)]
    from vitviz.zoo.cards import posemb_ablation_results

    ablation = posemb_ablation_results()
    if ablation["trained"].any():
        def posemb() -> tuple[Any, dict[str, np.ndarray]]:
            return vitviz.plot_posemb_ablation_grid(), {
                **_columns(ablation, ("pos_emb", "model")),
                "test_top1": ablation["test_top1"].to_numpy(dtype=float),
                "epochs": ablation["epochs"].to_numpy(dtype=float, na_value=np.nan),
                "paper_5shot": ablation["paper_5shot"].to_numpy(dtype=float)}

        jobs.append(("table8_posemb_ablation", posemb))
    from vitviz.core.resources import shipped_dir
    from vitviz.errors import DataNotFoundError
    from vitviz.experiments.posemb_seeds import (
        SWEEPS,
        fewshot_metric,
        posemb_seed_claims,
        read_posemb_seeds,
        read_posemb_seeds_fewshot,
    )

    for suffix, results in SWEEPS.items():  # every committed seed sweep, each with its budget in the title
        try:
            path = shipped_dir("vitviz.data") / Path(results).relative_to("data")
            runs, shots = read_posemb_seeds(path), read_posemb_seeds_fewshot(results=path)
        except DataNotFoundError:  # an installed copy without the committed sweep: no figure, not a failure
            continue

        def posemb_seeds(runs: Any = runs, shots: Any = shots) -> tuple[Any, dict[str, np.ndarray]]:
            import pandas as pd

            claims = pd.concat([posemb_seed_claims(runs), posemb_seed_claims(shots, fewshot_metric(shots))],
                               ignore_index=True)
            return vitviz.plot_posemb_seeds_grid(runs, shots), _columns(claims, (
                "measure", "arm", "minus", "difference", "low", "high", "paper", "seeds"))

        jobs.append((f"table8_posemb_seeds{suffix}", posemb_seeds))
    measured = read_results()
    if len(measured):
        def study() -> tuple[Any, dict[str, np.ndarray]]:
            # one row of panels per training-set size, seed means with their intervals and the gap at equal
            # compute (as notebook 03): one panel of every seed would join the sizes' frontiers and take the best seed
            return vitviz.plot_study_grid(measured), _columns(measured, (
                "family", "model", "epochs", "seed", "train_images", "train_pflops", "test_acc"))

        jobs.append(("study_hybrid_vs_pure", study))
    return jobs


def _columns(df: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The columns ``names`` of ``df`` as arrays ``np.load`` reads without pickles: the labels that say which point is
    which (family, model, seed) as unicode strings beside the numbers."""
    from pandas.api.types import is_numeric_dtype

    return {c: df[c].to_numpy() if is_numeric_dtype(df[c]) else df[c].to_numpy().astype(str) for c in names}


REPORT_FOLDERS = ("figures", "arrays", "notebooks")  # the report's own: a rerun empties them first


def _start_clean(out: Path, inputs: Sequence[Path]) -> None:
    """Empty the ``REPORT_FOLDERS`` of an earlier report in ``out`` (one with a ``meta.json``), so that a rerun never
    shows an earlier run's files beside its own: a figure that fails this time, a notebook not run this time, a file
    a killed run wrote before its ``meta.json`` listed it. Then make the folders.

    Raises:
        InputError: ``out`` has no ``meta.json`` but its ``REPORT_FOLDERS`` hold files (not a vitviz report: they
            are left alone), or one of ``inputs`` (a checkpoint, notebook or image folder) lies in those folders.
    """
    import shutil

    folders = [out / sub for sub in REPORT_FOLDERS]
    held = [p for d in folders if d.is_dir() for p in sorted(d.iterdir())]
    if held and not (out / "meta.json").is_file():
        shown = ", ".join(str(p.relative_to(out)) for p in held[:3]) + (", ..." if len(held) > 3 else "")
        raise InputError(f"out={str(out)!r} holds files ({shown}) that no vitviz report wrote (there is "
                         f"no meta.json): the report empties {'/, '.join(REPORT_FOLDERS)}/ before it writes; pass a "
                         "new or empty folder, or move those files away")
    for path in inputs:
        resolved = Path(path).resolve()
        inside = next((d for d in folders if resolved.is_relative_to(d.resolve())), None)
        if held and inside is not None:
            raise InputError(f"{str(path)!r} lies in {str(inside)!r}, which the report empties before it writes; "
                             "move it out of the report folder, or pass another out=")
    for d in folders:
        if d.is_dir():
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)


def _figure_step(report: Report, m: LoadedModel, name: str, fn: Job) -> Callable[[], None]:
    def step() -> None:
        import matplotlib.pyplot as plt

        import vitviz

        before = set(plt.get_fignums())
        try:
            fig, arrays = fn()
            paths = vitviz.save_figure(fig, report.out / "figures" / name, formats=report.formats)
            save_arrays(report.out / "arrays" / name, **arrays)
            entry = {"name": name, "model": m.key or None, "trained": m.trained, "note": m.note,
                     "files": [str(Path(p).relative_to(report.out)) for p in paths]}
            if IMAGE_SOURCE in arrays:  # which images the figure averages over (CIFAR-10, yours, or photographs)
                entry["images"] = str(arrays[IMAGE_SOURCE])
            report.figures.append(entry)
        except Exception as e:  # keep going: one broken figure must not lose the others
            report.failures.append({"name": name, "kind": "figure", "error": f"{type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()})
        finally:  # the step's figures, also those of a step that failed half-way (a report holds dozens)
            for number in set(plt.get_fignums()) - before:
                plt.close(number)

    return step


def _notebook_step(report: Report, path: Path, settings: dict[str, Any], kernel: str,
                   cell_timeout: int | None) -> Callable[[], None]:
    def step() -> None:
        from vitviz.report.notebooks import PARAMETER_NAMES, NotebookRun, parameters_for, run_notebook

        params = None
        try:
            params = parameters_for(path, **settings)
            run = run_notebook(path, report.out / "notebooks", params, kernel=kernel, cell_timeout=cell_timeout,
                               watch=(report.out / "figures", report.out / "arrays"))
        except Exception as e:  # an unreadable notebook, papermill missing: say so, keep the rest
            run = NotebookRun(path.stem, str(path), {}, error={"cell_index": None, "exec_count": None,
                                                               "ename": type(e).__name__, "evalue": str(e),
                                                               "message": f"{path.name}: {type(e).__name__}: {e}"})
        entry = run.as_dict()
        # a setting given that the notebook has no parameter for: it ran on its own default instead (said in the index)
        entry["not_taken"] = {} if params is None else {
            key: str(settings[key]) for key in ("model", "images")
            if settings.get(key) is not None and not any(n in params for n in PARAMETER_NAMES[key])}
        for key in ("executed", "html"):
            entry[key] = str(Path(entry[key]).relative_to(report.out)) if entry[key] else None
        entry["files"] = [str(Path(f).relative_to(report.out)) for f in run.files]
        report.notebooks.append(entry)
        if not run.ok:
            report.failures.append({"name": f"notebook {path.name}", "kind": "notebook",
                                    "error": run.error["message"] if run.error else "failed",
                                    "traceback": (run.error or {}).get("source", "")})

    return step


# Figures of the trained reference models and the paper's tables (the README's gallery).
GALLERY = ("cifar10-vit_pos_embed", "cifar10-vit_embedding_filters", "fig6_rollout_vit", "cifar10-vit_attention_distance",
           "paper_fig5_compute_curves", "cifar10-vit-2dpos_pos_embed", "table8_posemb_ablation",
           "fig11_attention_distance", "reference_compute")


# A gallery PNG is left as it is when the new render differs from it by rendering noise only: float32 results
# that differ in the last bits between thread counts or CPUs move a few anti-aliased or colormapped pixels by a
# level or two. Larger or wider changes are real and rewrite the file.
GALLERY_NOISE_LEVELS = 4  # of 255
GALLERY_NOISE_FRACTION = 1e-3  # of the pixels


def _same_picture(path: Path, im: Any) -> bool:
    """Whether the PNG at ``path`` shows ``im`` (RGB, same size) up to rendering noise."""
    from PIL import Image

    if not path.is_file():
        return False
    with Image.open(path) as old:
        if old.size != im.size:
            return False
        a = np.asarray(old.convert("RGB"), dtype=np.int16)
    diff = np.abs(a - np.asarray(im, dtype=np.int16)).max(axis=-1)
    return bool(diff.max() <= GALLERY_NOISE_LEVELS and (diff > 0).mean() <= GALLERY_NOISE_FRACTION)


def write_gallery(report_out: str | os.PathLike, gallery: str | os.PathLike, names: Sequence[str] = GALLERY,
                  width: int = 720) -> list[Path]:
    """Copy the key figures of a report, downscaled to ``width`` px, into ``gallery`` (the README's pictures).

    A gallery file that already shows the same picture (up to rendering noise; see ``GALLERY_NOISE_LEVELS``) is
    not rewritten, so ``make report`` on an unchanged tree changes no tracked file. Where the report has a
    ``meta.json``, only the figures it lists as written by that run (a package figure, or a file a notebook wrote)
    are copied: a PNG left in ``figures/`` by an earlier run, whose figure or notebook failed or was not run this
    time, is not passed off as current. A report whose ``meta.json`` is not ``"status": "complete"`` (still being
    rendered, or stopped part-way: its ``figures/`` lacks the steps not run and may hold a half-written one's) is
    refused; a ``meta.json`` without a status (written by a vitviz before it had one) counts as complete.

    Returns:
        the PNGs of the gallery, written or kept; figures the report lacks (or did not write) are skipped.

    Raises:
        InputError: ``report_out``'s ``meta.json`` is not complete.
    """
    import json

    from PIL import Image

    meta_path = Path(report_out) / "meta.json"
    fresh = None
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        status = meta.get("status", STATUS_COMPLETE)
        if status != STATUS_COMPLETE:
            raise InputError(f"report_out={str(report_out)!r}: its meta.json says status {status!r}, not "
                             f"{STATUS_COMPLETE!r} (the report was stopped part-way or is still being rendered: "
                             "figures/ lacks the steps not run yet and may hold a half-written step's files); render "
                             f"it again to the end (render_report, or python -m vitviz report --out {report_out}) "
                             "before writing the gallery")
        fresh = {Path(f) for entry in [*meta.get("figures", []), *meta.get("notebooks", [])]
                 for f in entry.get("files", [])}
    written = []
    for name in names:
        src = Path(report_out) / "figures" / f"{name}.png"
        if not src.is_file() or (fresh is not None and Path("figures", f"{name}.png") not in fresh):
            continue
        with Image.open(src) as im:
            im = im.convert("RGB")
            if im.width > width:
                im = im.resize((width, round(im.height * width / im.width)), Image.Resampling.LANCZOS)
            target = Path(gallery) / f"{name}.png"
            if not _same_picture(target, im):
                atomic_write(target, lambda tmp, im=im: im.save(tmp, format="PNG", optimize=True))
        written.append(target)
    return written


def render_report(
    out: str | os.PathLike = "reports",
    models: Sequence[str] | None = None,
    formats: Sequence[str] = ("png", "pdf", "svg"),
    device: str = "auto",
    progress: bool = True,
    *,
    notebooks: Sequence[str | os.PathLike] | None = None,
    model: str | None = None,
    checkpoint: Weights | Sequence[Weights] = None,
    images: str | os.PathLike | None = None,
    kernel: str = "python3",
    cell_timeout: int | None = 1800,
) -> Report:
    """Execute the notebooks and render every package figure into ``out``; return what was written and failed.

    Args:
        out: the report folder.
        models: model names for the package figures (default: ``(model,)`` when ``model`` is given, else
            ``DEFAULT_MODELS``, the reference models).
        formats: figure formats of the package figures.
        device: device of the package figures' models (``"auto"``: CUDA when available).
        progress: show a tqdm bar over the steps, and first, with ``images``, which images the figures use (their
            ``source``, on stderr).
        notebooks: the notebooks to execute (default: every installed notebook, ``vitviz.notebooks``, built from
            the repository's ``notebooks/``; ``()`` for none).
        model: a model name or weights path for the notebooks that declare ``model_name`` (default: their own);
            also the package figures' model when ``models`` is not given.
        checkpoint: a weights file for ``model``'s architecture (``vitviz.load_model(model, checkpoint=...)``: a
            ``.safetensors``, ``.pth`` or the original JAX ``.npz``), used wherever ``model`` is: the package
            figures and the notebooks' ``checkpoint`` parameter. Or one entry per name in ``models``, in order (a
            file, or ``None`` for that model's own weights), to compare checkpoints: ``models=("vit_tiny_patch16_224",
            "vit_tiny_patch16_224"), checkpoint=("step1000.pth", "step9000.pth")`` draws each (keys
            ``vit_tiny_patch16_224-step1000`` and ``-step9000``, ``model_weights``); the notebooks get the first
            model with its file.
        images: your images, for the package figures that show images and the notebooks that declare
            ``images_dir``/``image_dir``/``data_dir``: an image file, a flat folder of images (sorted by name)
            or a class-folder tree (``vitviz.zoo.samples.images_from``).
        kernel: Jupyter kernel the notebooks run in.
        cell_timeout: seconds a notebook cell may run.

    Returns:
        ``Report`` with ``figures``, ``notebooks`` (one dict per notebook, see ``NotebookRun``) and ``failures``.

    ``<out>/meta.json`` and ``<out>/index.html`` are written before the first step (``"status": "running"``) and
    after each, so a stopped run's list exactly the files it wrote; ``"status": "complete"`` once all steps ran,
    ``"interrupted"`` when one raised past its own handling (``KeyboardInterrupt``, which is then raised again).
    An earlier report in ``out`` has its ``figures/``, ``arrays/`` and ``notebooks/`` emptied first, once the models
    have loaded (``_start_clean``).

    Raises:
        InputError: ``out``'s subfolders hold files but it has no ``meta.json`` (not a vitviz report), or a
            checkpoint, notebook or ``images`` lies in the folders the rerun empties; bad ``checkpoint``/``models``.
        DataNotFoundError: ``images`` is neither an image file nor a folder of images (``images_from``).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from tqdm.auto import tqdm

    import vitviz
    from vitviz.report.html import index_html
    from vitviz.report.notebooks import find_notebooks

    report = Report(Path(out), tuple(formats))
    names = tuple(models) if models is not None else (model,) if model else DEFAULT_MODELS
    several = checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike))
    if several and models is None:
        raise InputError(f"checkpoint= holds {len(list(checkpoint))} entries without models=: pass the models they "
                         "belong to, one per entry, in the same order")
    weights = model_weights(names, model, checkpoint)
    if several:  # the notebooks take the first model (or model=) with its file
        model = model or names[0]
        checkpoint = next((f for n, f, _ in weights if n == model), None)
    elif checkpoint is not None:
        checkpoint = Path(checkpoint).resolve()  # the notebooks run in their own folder
    image_path = Path(images).resolve() if images is not None else None
    found = None
    if image_path is not None:  # a typo would fail every figure that shows images, and every notebook given it
        from vitviz.zoo.samples import images_from

        found = images_from(image_path, DISTANCE_IMAGES)  # listed once: the check, and every figure's images
    nb_paths = find_notebooks() if notebooks is None else [Path(p) for p in notebooks]
    for i, nb in enumerate(nb_paths):  # each is executed into notebooks/<stem>.ipynb and .html
        other = next((o for o in nb_paths[:i] if o.stem == nb.stem), None)
        if other is not None:
            raise InputError(f"notebooks= holds two notebooks named {nb.stem!r} ({str(other)!r}, {str(nb)!r}): both "
                             f"would be written to notebooks/{nb.stem}.ipynb; rename one, or pass each once")
    loaded = [load_or_random(name, device, file, key) for name, file, key in weights]
    none = LoadedModel("", nn.Identity(), True)
    distances: dict[str, dict[str, Any]] = {}  # each model's attention distances, for the comparison
    steps = [(name, _figure_step(report, m, name, fn)) for m in loaded
             for name, fn in _figure_jobs(m, found, distances)]
    if len(loaded) > 1:
        steps += [(name, _figure_step(report, none, name, fn)) for name, fn in _comparison_jobs(distances)]
    steps += [(name, _figure_step(report, none, name, fn)) for name, fn in _global_jobs()]
    settings = {"out_dir": (report.out / "figures").resolve(), "arrays_dir": (report.out / "arrays").resolve(),
                "model": model, "checkpoint": checkpoint, "images": image_path}
    steps += [(f"notebook {p.stem}", _notebook_step(report, p, settings, kernel, cell_timeout)) for p in nb_paths]
    meta = {
        "created": None,
        "status": STATUS_RUNNING,
        "model": model,
        "checkpoint": checkpoint and str(checkpoint),
        "images": settings["images"] and str(settings["images"]),
        "resolution": {m.key: list(vitviz.inspect(m.model).img_size) for m in loaded},
        "settings": {"formats": list(report.formats), "device": device, "kernel": kernel,
                     "cell_timeout_s": cell_timeout, "notebooks": [p.name for p in nb_paths]},
        "models": {m.key: {"name": name, "checkpoint": file and str(file), "trained": m.trained, "note": m.note,
                           "spec": repr(vitviz.inspect(m.model))} for m, (name, file, _) in zip(loaded, weights)},
        "formats": list(report.formats),
        "device": str(next(loaded[0].model.parameters()).device) if loaded else None,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": versions(),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "notebooks": [],
        "figures": [],
        "failures": [],
    }

    def write_meta(status: str) -> None:
        # what this run wrote so far, so neither file ever describes an earlier run's figures beside new ones
        meta.update({"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "status": status,
                     "notebooks": report.notebooks, "figures": report.figures,
                     "failures": [{k: v for k, v in f.items() if k != "traceback"} for f in report.failures]})
        atomic_write_json(report.out / "meta.json", meta)
        atomic_write_text(report.out / "index.html", index_html(report, meta))

    _start_clean(report.out, [f for _, f, _ in weights if f is not None] + nb_paths
                 + ([image_path] if image_path is not None else []))
    write_meta(STATUS_RUNNING)
    try:
        if progress and found is not None:  # the listing the figures use, said once, before the first step
            tqdm.write(f"vitviz report: images: {found.source}", file=sys.stderr)
        bar = tqdm(steps, desc="vitviz report", unit="step", disable=not progress)
        for label, step in bar:
            bar.set_postfix_str(label)
            step()
            write_meta(STATUS_RUNNING)
    except BaseException:  # Ctrl-C (KeyboardInterrupt is no Exception a step catches), SystemExit: say so, re-raise
        write_meta(STATUS_INTERRUPTED)
        raise
    write_meta(STATUS_COMPLETE)
    return report
