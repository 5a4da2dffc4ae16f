"""Faithfulness of relevance maps, measured by perturbation on the user's own model and images.

Each method's map orders the patches of an image by relevance; patches are then removed in steps (default 10% of
the patches per step, from 0% to 100%) and the model's output for the explained target is recorded:

==============  ========================================================================  ========  ===============
mode            patches removed at fraction ``f``                                           score     good map
==============  ========================================================================  ========  ===============
``positive``    the ``f`` most relevant (Chefer et al., CVPR 2021, Sec. 5.1)               accuracy  low AUC
``negative``    the ``f`` least relevant (same)                                            accuracy  high AUC
``deletion``    the ``f`` most relevant (Petsiuk et al., "RISE", BMVC 2018, Sec. 4.1)      prob.     low AUC
``insertion``   all but the ``f`` most relevant, i.e. they are inserted into a blank      prob.     high AUC
                image most relevant first (Petsiuk et al. 2018)
==============  ========================================================================  ========  ===============

"accuracy" is whether the target class is still the arg-max (Chefer et al. record top-1 accuracy); "prob." is the
softmax probability of the target class (Petsiuk et al.). With ``target=None`` the target is each image's
prediction on the clean image (so accuracy starts at 1); pass the labels to score against them. A callable
``target`` (headless models) records its own value in every mode (metric ``"target"``). The AUC is the trapezoidal
area under the score over the fraction of patches actually removed, ``[0, 1]`` (``vitviz.faithfulness_auc``); methods
are compared by the Student-t interval of their mean per-image AUC difference, i.e. the paired t-test
(``vitviz.compare_methods``; ``vitviz.analysis.faithfulness_stats`` says why not the bootstrap by default).

Whole patches: at the nominal step ``f`` (column ``fraction``: 0, 0.1, ..., 1 by default) ``k = floor(f * P + 0.5)``
of the ``P`` patches are removed (inserted, for ``insertion``; rounded half up exactly, in integers:
``(2 i P + n) // (2 n)`` at step ``i`` of ``n``), so the fraction actually removed is ``k / P`` (column
``removed``): on an 8x8 grid 6 of 64 patches, 9.4%, at ``f = 0.1``. ``removed`` is the x of the figure
(``vitviz.plot_faithfulness``) and of the AUC; ``fraction`` stays the step's name (rows are grouped and ``upto=``
chosen by it).

Removal (column ``removal``, ``vitviz.analysis.perturbation``): ``"drop"`` takes the removed patch tokens out of
the sequence right after the position embedding, where the model's family says how (``Family.drop_tokens``), so the
model sees fewer tokens and no invented pixels; otherwise ``"mean"``: the pixels of the removed patches are set to
the dataset mean, i.e. 0 after the model's normalisation, or to ``fill``. Chefer et al. zero pixels; Petsiuk et al.
use zero (deletion) and a blurred image (insertion); both differ from token dropping, so absolute numbers are not
comparable across removals.

Ties: patches of equal relevance are removed in a random order drawn from ``seed`` and the image's id, never in
raster order (a saturated map, e.g. attention flow's many patches at one shared value, would otherwise be scored by
where its patches sit). An image gets the same order whatever the batching and in whichever run.

Tables: the result is a plain tidy frame (``attrs`` hold scalars only), one row per image, method, mode and
fraction; runs over disjoint image ids (``image_offset=`` / ``image_ids=``) concatenate with ``pd.concat``, and
repeated rows are refused by ``faithfulness_auc`` and ``compare_methods``. ``out=`` resumes a run
(``vitviz.analysis.faithfulness_resume``: a fingerprint beside the file refuses rows of another run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.analysis.explain import GRADIENT_METHODS, METHODS, explain, per_method_options
from vitviz.analysis.faithfulness_resume import (
    COLUMNS,
    Layout,
    check_out,
    class_ids,
    fingerprint,
    ids_key,
    image_digests,
    image_id_of,
    restore_ids,
    resume,
)
from vitviz.analysis.faithfulness_stats import BETTER, MODES, bootstrap_ci, compare_methods, faithfulness_auc
from vitviz.analysis.perturbation import Perturbed, drop_module, keep_tokens, ranks_on_host, resolve_removal
from vitviz.core.batching import check_batch_size, check_num_workers, count_images, iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.contexts import autograd, input_checked, normal_tensor
from vitviz.core.datasets import (
    autocast_context,
    autocast_dtype,
    dataset_length,
    is_dataset_source,
    iter_dataset,
    take_targets,
)
from vitviz.core.images import Images, image_list
from vitviz.core.io import atomic_write
from vitviz.core.spec import inspect
from vitviz.core.targets import Target, logits_of, resolve_target
from vitviz.core.util import is_int, is_number, name_list
from vitviz.errors import ImageInputError, InputError, InputTypeError

__all__ = ["BETTER", "COLUMNS", "DEFAULT_METHODS", "MODES", "bootstrap_ci", "compare_methods", "default_methods", "drop_module",
           "faithfulness", "faithfulness_auc", "keep_tokens"]

# the cheap methods (one forward, or one forward and backward, per batch); flow only when asked (see faithfulness)
DEFAULT_METHODS = tuple(m for m in ("attention", "rollout", "grad_rollout", "chefer", "attnlrp", "random")
                        if m in METHODS)
MapFn = Callable[[nn.Module, torch.Tensor, Any], torch.Tensor]
Methods = Sequence[str | MapFn] | Mapping[str, str | MapFn | torch.Tensor]


def default_methods(model: nn.Module) -> tuple[str, ...]:
    """``DEFAULT_METHODS`` less ``"attnlrp"`` when ``model``'s family has no AttnLRP rules (its maps are of a kind the
    rules are not derived for, or vitviz has no rule for one of its modules): what ``faithfulness`` runs when
    ``methods`` is not given; and less every gradient method when ``model`` has quantized layers
    (``vitviz.core.contexts.quantized_layers``: no backward pass)."""
    from vitviz.core.contexts import quantized_layers

    if quantized_layers(model):
        return tuple(m for m in DEFAULT_METHODS if m not in GRADIENT_METHODS)
    if "attnlrp" not in DEFAULT_METHODS:
        return DEFAULT_METHODS
    from vitviz.analysis.attnlrp import attnlrp_supported

    return DEFAULT_METHODS if attnlrp_supported(model) else tuple(m for m in DEFAULT_METHODS if m != "attnlrp")


def _step_count(steps: float) -> int:
    """The number of steps ``1 / steps`` (a whole number), without building them."""
    if not is_number(steps):
        raise InputTypeError(f"steps={steps!r} is a {type(steps).__name__}, not a number; pass a fraction such as 0.1 "
                             "(10% of the patches per step), 0.05 or 0.25")
    k = round(1 / steps) if steps > 0 else 0
    if not 0 < steps <= 0.5 or abs(k * steps - 1) > 1e-9:
        raise InputError(f"steps={steps!r} must divide 1 into whole steps (e.g. 0.1 for 10% per step, 0.05, 0.25)")
    return k


def _fractions(steps: float, n_steps: int, grid: tuple[int, int]) -> np.ndarray:
    """The nominal steps ``0, 1 / n_steps, ..., 1`` on a ``grid`` of patches; refused where a step is finer than one
    patch: with more steps than patches, some steps remove the same whole number of patches as the step before, and
    the curve repeats points (each step removes ``round(f * P)`` patches)."""
    patches = grid[0] * grid[1]
    if n_steps > patches:
        raise InputError(f"steps={steps!r} is finer than one patch: the model's {grid[0]}x{grid[1]} grid has "
                         f"{patches} patches, so {n_steps} steps would remove the same number of patches at several "
                         f"steps (repeated points of the curve); pass steps=1/{patches} ({1 / patches:.4g}, one "
                         "patch per step) or a coarser value")
    return _nominal(n_steps)


def _nominal(n_steps: int) -> np.ndarray:
    """The nominal steps ``0, 1 / n_steps, ..., 1`` (column ``fraction``)."""
    return np.linspace(0, 1, n_steps + 1)


def _metric(mode: str, classes: bool) -> str:
    """The metric of a row of ``mode``: ``"target"`` for a callable target (no classes), else ``"accuracy"`` for
    ``positive`` / ``negative`` and ``"probability"`` for ``deletion`` / ``insertion``."""
    if not classes:
        return "target"
    return "accuracy" if mode in ("positive", "negative") else "probability"


def _layout(table: Mapping[str, Any], modes: Sequence[str], n_steps: int, how: str, target: Target) -> Layout:
    """The rows ``_batch`` writes for every image of a run (what ``out=`` must hold for each image it holds)."""
    classes = not (callable(target) and not isinstance(target, (torch.Tensor, np.ndarray)))  # resolve_target's rule
    return Layout(tuple(table), tuple(modes), tuple(float(f) for f in _nominal(n_steps)), how,
                  {mode: _metric(mode, classes) for mode in modes})


def _known_grid(spec: Any, images: Any) -> tuple[int, int] | None:
    """The patch grid of every image of ``images`` where it is known before they are read: a tensor's, or the
    model's own grid when it takes no other size (``ViTSpec.grid_for_input``); ``None`` for a data set or list of a
    ``dynamic_img_size`` model, whose grid is that of each batch."""
    if isinstance(images, torch.Tensor) and images.ndim >= 3:
        return spec.grid_for_input(images)
    return None if spec.dynamic_img_size else tuple(spec.grid_size)


def _methods(methods: Methods, total: int | None) -> dict[str, str | MapFn | torch.Tensor]:
    """name -> a method name of ``explain``, a callable, or precomputed ``(n_images, gh, gw)`` maps."""
    if isinstance(methods, str):
        methods = [methods]
    if isinstance(methods, (bytes, torch.Tensor)) or not isinstance(methods, Iterable):
        raise InputTypeError(f"methods={methods!r} is a {type(methods).__name__}, not a list of methods; pass method "
                             "names (e.g. ['rollout', 'random']), callables (model, images, target) -> (B, gh, gw), a "
                             "dict name -> method or precomputed maps, or None for default_methods(model)")
    items = list(methods.items()) if isinstance(methods, Mapping) else [
        (m if isinstance(m, str) else getattr(m, "__name__", type(m).__name__), m) for m in methods]
    if not items:
        raise InputError("methods is empty; pass method names (e.g. vitviz.analysis.faithfulness.DEFAULT_METHODS), "
                         "callables or precomputed maps")
    out: dict[str, str | MapFn | torch.Tensor] = {}
    for name, m in items:
        if name in out:
            raise InputError(f"methods names {name!r} twice; give each method its own name (a dict name -> method)")
        if isinstance(m, str):
            if m not in METHODS:
                raise InputError(f"methods holds {m!r}, which is not one of {METHODS}; or pass a callable "
                                 "(model, images, target) -> (B, gh, gw), or precomputed maps in a dict")
        elif isinstance(m, torch.Tensor):
            if m.ndim != 3 or (total is not None and m.shape[0] != total):
                raise InputError(f"methods[{name!r}] holds maps of shape {tuple(m.shape)}; precomputed maps must be "
                                 f"({total if total is not None else 'n_images'}, gh, gw), one per image in order")
        elif not callable(m):
            raise InputError(f"methods[{name!r}] is a {type(m).__name__}; pass a method name, a callable "
                             "(model, images, target) -> (B, gh, gw), or a (n_images, gh, gw) tensor of maps")
        out[str(name)] = m
    return out


def _per_image(values: Any, total: int | None, what: str) -> torch.Tensor | None:
    """A per-image list of class indices as a tensor (so batches of any positions can be indexed), else None."""
    if values is None or callable(values) or isinstance(values, (int, np.integer, str)):
        return None
    t = torch.as_tensor(values)
    if t.ndim == 0:
        return None
    if total is not None and len(t) != total:
        raise InputError(f"{what} holds {len(t)} class indices but there are {total} images; give one per image")
    return t


def _fill(fill: Any, how: str, removal: str) -> torch.Tensor:
    if fill is None:
        return torch.zeros(3)
    if how == "drop":
        raise InputError(f"fill={fill!r} is used only when pixels are filled (removal='mean'), but removal="
                         f"{removal!r} drops this model's tokens; pass removal='mean' to fill, or leave fill out")
    try:
        t = torch.as_tensor(fill, dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"fill={fill!r} is not a number or a list of numbers; pass one value per channel (3), in "
                         "the model's normalised space") from None
    if len(t) not in (1, 3) or not bool(torch.isfinite(t).all()):
        raise InputError(f"fill={fill!r} must be one finite value, or one per channel (3 values), in the model's "
                         "normalised space (e.g. [0, 0, 0], the normalisation mean)")
    return t


def _check_labels(labels: Any, images: Any) -> None:
    if isinstance(labels, str) and (labels != "dataset" or not is_dataset_source(images)):
        raise InputError(f"labels={labels!r}: pass class indices, one per image, or labels='dataset' with a Dataset, "
                         "folder or DataLoader")
    src = getattr(images, "dataset", images)  # a DataLoader's dataset
    if labels == "dataset" and getattr(src, "classes", None) == [] and -1 in getattr(src, "labels", []):
        raise InputError(f"labels='dataset': the folder {str(getattr(src, 'root', ''))!r} has its images directly "
                         "in it, not in one sub-folder per class, so they have no labels; put each class in its own "
                         "sub-folder, or pass labels= as class indices, one per image")


def _truth(lab: Any, clean: Any, model: nn.Module, labels: Any) -> torch.Tensor:
    """The labels of one batch as class indices, checked against the model's classes (errors name ``labels=``)."""
    name = "labels='dataset'" if isinstance(labels, str) else "labels"
    if lab is None:
        raise InputError("labels='dataset': the dataset yields no targets; pass labels= as class indices")
    t = torch.as_tensor(lab)
    logits = logits_of(clean, model)
    classes = logits.shape[-1]
    if t.is_floating_point() or t.dtype == torch.bool or t.ndim != 1:
        raise InputError(f"{name}: got {t.dtype} values of shape {tuple(t.shape)}; labels are integer class "
                         "indices, one per image")
    if len(t) != len(logits):  # a collate_fn's list of labels that is not one per image: no label is whose
        raise InputError(f"{name}: got {len(t)} labels for a batch of {len(logits)} images; labels are integer "
                         "class indices, one per image (check the DataLoader's collate_fn)")
    bad = t[(t < 0) | (t >= classes)]
    if len(bad):
        raise InputError(f"{name}: the label {bad[0].item()} is out of range: {type(model).__name__} has {classes} "
                         f"classes; give labels in 0 ... {classes - 1}")
    return t.to(logits.device)


@in_eval_mode
def faithfulness(
    model: nn.Module,
    images: Images | Any,
    methods: Methods | None = None,
    target: Target = None,
    *,
    labels: Sequence[int] | torch.Tensor | str | None = None,
    steps: float = 0.1,
    modes: Sequence[str] = MODES,
    removal: str = "auto",
    fill: Sequence[float] | torch.Tensor | None = None,
    method_options: Mapping[str, Mapping[str, Any]] | None = None,
    batch_size: int = 50,
    progress: bool = True,
    seed: int = 0,
    image_offset: int = 0,
    image_ids: Sequence[Hashable] | None = None,
    out: str | os.PathLike | None = None,
    autocast: bool | torch.dtype = False,
    num_workers: int = 0,
) -> Any:
    """Perturbation curves of every method on every image, as a tidy ``pandas.DataFrame``.

    Args:
        model: any ViT ``vitviz.inspect`` reads (on the GPU if it is there: everything runs on its device).
        images: a normalised ``(B, 3, H, W)`` batch, a list (anything ``iter_batches`` takes), or a whole dataset:
            a folder of images, a ``torch.utils.data.Dataset`` (an ``IterableDataset`` too: ids counted as its
            images come; per-image ``image_ids=``, ``target=``, ``labels=`` or maps of another number than the
            images it yields are refused, too few when the image without one comes, too many at its end) or a
            ``DataLoader`` that reads in dataset order (``shuffle=False``; a shuffling or sampling loader is refused,
            as its images could not be matched to their ids, targets, labels and maps). Every batch gets the checks
            of a tensor input (3 channels, floating point, finite values).
        methods: what to evaluate: ``vitviz.explain`` method names; callables ``f(model, images, target) -> (B,
            gh, gw)`` (``target`` is the batch's explained classes, or the callable target); or a dict name ->
            any of these or precomputed maps ``(n_images, gh, gw)`` (in the order of ``images``). Default
            (``None``): ``default_methods(model)``, the cheap ones of ``DEFAULT_METHODS`` the model supports
            (``attnlrp`` only where its family has AttnLRP rules). ``"flow"`` only when asked: it solves a max-flow per image, about
            11 s per image at ViT-B/16 size (197 tokens, 12 layers) on a CPU.
        target: ``None`` (each image's clean prediction), a class index, one per image (e.g. the labels), or a
            callable ``f(output) -> (B,)``.
        labels: one class index per image, or ``"dataset"`` (the targets a Dataset / DataLoader yields; a folder
            needs one sub-folder per class); when given, ``accuracy`` is whether the arg-max equals the label (top-1
            accuracy, as in Chefer et al.'s evaluation code), while ``probability`` stays that of the explained
            class, and ``attrs["labels"]`` is True. Default: accuracy against the explained class. Refused with a
            callable ``target``, which scores its own value and no accuracy the labels could be scored in.
        steps: the nominal fraction of patches removed per step (the curve has ``1 / steps + 1`` points, 0% to
            100%); each step removes the nearest whole number of patches (column ``removed``). At least one patch
            per step: on a grid of ``P`` patches the finest is ``1 / P``; a finer value is refused (its steps would
            repeat points of the curve).
        modes: any of ``positive``, ``negative``, ``deletion``, ``insertion`` (module docstring), each once; one name
            alone is that mode.
        removal: ``"auto"`` (drop tokens where the model's family can, else mean), ``"drop"`` or ``"mean"``.
        fill: the value of removed pixels for ``"mean"``, one finite number or one per channel (3), in the model's
            normalised space (default 0: the normalisation mean, the model's training-set mean). Refused when
            ``removal`` resolves to ``"drop"``, where no pixel is filled.
        method_options: per method name, options for ``vitviz.explain`` (e.g. ``{"attention": {"layer": -1}}``); a
            name that is neither a method here nor a ``vitviz.explain`` method is refused.
        batch_size: images per pass.
        progress: show a progress bar over images.
        seed: the seed of the random order among patches of equal relevance (per image: seed and image id).
        image_offset: the id of the first image (ids are ``image_offset + position``): give a later chunk of a
            data set the offset of its first image so that chunks concatenate without colliding.
        image_ids: one id per image (ints or strings), instead of ``image_offset``.
        out: the path of a CSV file (not a folder) the rows are appended to after every batch (atomically: the file is
            always a complete table), with the run's fingerprint in ``<out>.json``; a rerun with the same ``out`` and
            the same arguments, model and data skips the images already in it and returns the whole table, equal to an
            uninterrupted run's. A file of another run (any argument the rows depend on, the model's weights, a data
            set's contents; ``vitviz.analysis.faithfulness_resume``) or without a fingerprint is refused with a
            ``CheckpointError``, and so is a file cut off or edited by another program (an image without all its
            rows, a value no run writes). A rerun may pass more images (chunks); per-image ``labels=`` /
            ``target=`` are kept id by id, so the images already written must keep their classes.
        autocast: run maps and forward passes under ``torch.autocast`` (``vitviz.core.datasets.autocast_dtype``):
            ``True`` bfloat16 on CUDA (nothing on the CPU), a dtype on any device; default none.
        num_workers: loader workers for a folder or ``Dataset``.

    Returns:
        DataFrame with columns ``image`` (the image id), ``method``, ``mode``, ``fraction`` (the nominal step
        ``f``: 0, ``steps``, ..., 1), ``removed`` (the fraction of the image's ``P`` patches actually removed, or
        inserted for ``insertion``: ``round(f * P) / P``, halves rounded up; the x of the figure and of the AUC),
        ``score``, ``metric`` (``accuracy``, ``probability`` or ``target``) and ``removal``; ``attrs`` hold scalars
        only (``removal``, ``seed``, ``steps``, ``labels``: whether ``accuracy`` is against ``labels=``; ``readout``:
        the tokens the head reads, whose rows the row-reading maps explain, ``ViTSpec.readout`` in words). AUCs:
        ``vitviz.faithfulness_auc(df)``; paired comparisons: ``vitviz.compare_methods(df, baseline=...)``.
    """
    import pandas as pd

    modes = name_list(modes, "modes", MODES)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise InputError(f"modes={modes!r}: each must be one of {MODES}")
    twice = next((m for i, m in enumerate(modes) if m in modes[:i]), None)
    if twice is not None:  # its rows would be written twice: a frame faithfulness_auc refuses
        raise InputError(f"modes names {twice!r} twice; give each mode once, e.g. modes={list(dict.fromkeys(modes))!r}")
    n_steps = _step_count(steps)
    check_out(out)
    dataset = is_dataset_source(images)
    total = dataset_length(images) if dataset else count_images(images)
    if dataset and isinstance(images, (str, os.PathLike)):
        from vitviz.core.datasets import ImageFolder

        images = ImageFolder(images, model)
        total = len(images)
    if total == 0:
        raise ImageInputError(_no_images(images, "holds"))
    table = _methods(default_methods(model) if methods is None else methods, total)
    spec = inspect(model)
    grid = _known_grid(spec, images)
    if grid is not None:  # else each batch's grid is checked (_batch)
        _fractions(steps, n_steps, grid)
    how = resolve_removal(model, removal)
    fill_t = _fill(fill, how, removal)
    options = per_method_options(method_options, table)
    if batch_size is None:
        raise InputError("batch_size=None: faithfulness needs a number of images per pass; pass an integer such "
                         "as 50")
    check_batch_size(batch_size)
    check_num_workers(num_workers)
    if not is_int(seed):
        raise InputError(f"seed={seed!r} must be an int (the seed of the random order among equal patches)")
    image_id = image_id_of(image_ids, image_offset, total)
    _check_labels(labels, images)
    if labels is not None and callable(target):
        given = repr(labels) if isinstance(labels, (str, int)) or not hasattr(labels, "__len__") else \
            f"<{type(labels).__name__} of {len(labels)} labels>"
        raise InputError(f"labels={given} with target={getattr(target, '__name__', type(target).__name__)}, a "
                         "callable: a callable target is scored by its own value (metric 'target'), so there is no "
                         "accuracy to score against the labels; drop labels=, or pass target=None (each image's "
                         "prediction) or class indices to score top-1 accuracy against them")
    target_all, labels_all = _per_image(target, total, "target"), _per_image(labels, total, "labels")
    device = next(model.parameters()).device
    amp = autocast_dtype(autocast, device, default=None)
    fp = None if out is None else fingerprint(
        model, images, dataset, table, modes, steps, how, fill_t if how == "mean" else None, seed, target,
        target_all, labels, labels_all, options, amp, out, ids_key(image_ids, image_offset))
    pixels = image_digests(images, image_id, total) if out is not None and not dataset else None
    classes = None if out is None else {"target": class_ids(target_all, image_id, "target"),
                                         "labels": class_ids(labels_all, image_id, "labels")}
    prev = resume(out, fp, restore_ids(image_ids, image_id, total), pixels,
                  _layout(table, modes, n_steps, how, target), classes)
    done = set() if prev is None else set(prev["image"])
    todo = [p for p in range(total)] if total is not None else None
    if todo is not None and done:
        todo = [p for p in todo if image_id(p) not in done]
    frames = [] if prev is None else [prev]
    if todo is not None and not todo:
        return _finish(pd, frames, how, seed, steps, labels, spec.readout.describe(spec.prefix_tokens))
    if dataset:
        batches = iter_dataset(model, images, batch_size=batch_size, num_workers=num_workers, positions=todo)
    else:
        items = image_list(images)
        chosen = items if todo is None or len(todo) == total else (
            items[todo] if isinstance(items, torch.Tensor) else [items[p] for p in todo])
        positions = todo if todo is not None else []
        batches = ((x, None, positions[s:s + len(x)]) for s, x in zip(
            range(0, len(positions), batch_size), iter_batches(model, chosen, batch_size)))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo) if todo is not None else None, desc="faithfulness", unit="img")
    yielded = 0  # the images the data set yielded (an iterable one is counted as they come)
    try:
        for x, loaded, pos in batches:
            yielded = max(yielded, max(pos, default=-1) + 1)
            if todo is None:  # an iterable dataset: skip what out= holds
                keep = [i for i, p in enumerate(pos) if image_id(p) not in done]
                if not keep:
                    continue
                loaded = take_targets(loaded, keep, len(x))
                x, pos = x[keep], [pos[i] for i in keep]
            ids = [image_id(p) for p in pos]
            records = _batch(model, spec, x, pos, ids, table, options, target, target_all, labels, labels_all,
                             loaded, how, fill_t, steps, n_steps, modes, seed, amp)
            frame = pd.DataFrame.from_records(records, columns=COLUMNS)
            frames.append(frame)
            if out is not None:
                whole = pd.concat(frames, ignore_index=True)
                atomic_write(out, lambda tmp, whole=whole: whole.to_csv(tmp, index=False))
            if bar is not None:
                bar.update(len(x))
    finally:
        if bar is not None:
            bar.close()
    if total is None:
        if not yielded:
            raise ImageInputError(_no_images(images, "yielded"))
        _check_counted(yielded, image_ids, image_id, target_all, labels_all, table)
    return _finish(pd, frames, how, seed, steps, labels, spec.readout.describe(spec.prefix_tokens))


def _check_counted(yielded: int, image_ids: Any, image_id: Callable[[int], Hashable], target_all: Any,
                   labels_all: Any, table: Mapping[str, Any]) -> None:
    """Refuse per-image values beyond the ``yielded`` images of an iterable data set, as a counted input refuses
    another number up front: an extra value is one the run matched to no image (most often values of another
    selection, or in another order). Too few were refused as the image without one came (``_batch``)."""
    n_ids = None
    if image_ids is not None:  # the ids image_id_of kept: it refuses the first position past them
        n_ids = yielded
        while True:
            try:
                image_id(n_ids)
            except InputError:
                break
            n_ids += 1
    counts = [("image_ids", n_ids, "ids"), ("target", None if target_all is None else len(target_all),
                                             "class indices"),
              ("labels", None if labels_all is None else len(labels_all), "class indices"),
              *((f"methods[{n!r}]", len(m), "maps") for n, m in table.items() if isinstance(m, torch.Tensor))]
    for what, n, kind in counts:
        if n is not None and n != yielded:
            raise InputError(f"{what} holds {n} {kind} but the data set yielded {yielded} images; give one per "
                             f"image (the rows of the {yielded} images are computed, and written to out= where it "
                             "is given)")


def _no_images(images: Any, verb: str) -> str:
    """The message for a call given no images: ``verb`` is "holds" (a counted input) or "yielded" (an iterable
    data set, counted as its images came)."""
    if not is_dataset_source(images):
        return "images: 0 images given; pass at least one image"
    from torch.utils.data import DataLoader

    source = type(images.dataset).__name__ if isinstance(images, DataLoader) else None
    what = f"DataLoader's {source}" if source else type(images).__name__
    return f"images: the {what} {verb} 0 images; pass at least one image"


def _finish(pd: Any, frames: list[Any], how: str, seed: int, steps: float, labels: Any, readout: str) -> Any:
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    df.attrs = {"removal": how, "seed": int(seed), "steps": float(steps), "labels": labels is not None,
                "readout": readout}
    return df


def _batch(model: nn.Module, spec: Any, x: torch.Tensor, pos: list[int], ids: list[Hashable],
           table: Mapping[str, Any], options: Mapping[str, dict], target: Target, target_all: torch.Tensor | None,
           labels: Any, labels_all: torch.Tensor | None, loaded: Any, how: str, fill: torch.Tensor,
           steps: float, n_steps: int, modes: Sequence[str], seed: int, amp: torch.dtype | None) -> list[dict]:
    """The curve rows of one batch ``x`` of images at dataset positions ``pos`` with ids ``ids``, at the ``n_steps``
    steps of ``steps`` (refused here where they are finer than a patch of this batch's grid)."""
    from vitviz.analysis.perturbation import image_seed

    b = len(x)
    with torch.no_grad(), autocast_context(amp, x.device):
        clean = model(x)
    idx = torch.as_tensor(pos)
    # an iterable data set is counted as its images come: its per-image values are checked here, not up front
    for what, values in (("target", target_all), ("labels", labels_all),
                         *((f"methods[{n!r}]", m) for n, m in table.items() if isinstance(m, torch.Tensor))):
        if values is not None and max(pos) >= len(values):
            kind = "maps" if what.startswith("methods") else "class indices"
            raise InputError(f"{what} holds {len(values)} {kind} but the data set yields more images; give one per "
                             "image")
    batch_target = target_all[idx] if target_all is not None else target
    classes = resolve_target(batch_target, clean, model=model).classes
    truth = None
    if classes is not None and labels is not None:
        lab = loaded if isinstance(labels, str) else labels_all[idx] if labels_all is not None else labels
        if lab is not None and torch.as_tensor(lab).ndim == 0:
            lab = torch.as_tensor(lab).expand(b)  # one class for every image
        truth = _truth(lab, clean, model, labels)
    explained = target if classes is None else classes
    pert = Perturbed(model, spec, x, how, fill, target, classes, truth, autocast=amp)
    grid = pert.grid
    fractions = _fractions(steps, n_steps, grid)
    pending: list[tuple[dict, torch.Tensor]] = []  # (a curve point's columns, its (b,) scores on the device)
    for name, method in table.items():
        opts = dict(options.get(name, {}))
        # x was checked where it was loaded: a method's own check would wait for the last method's passes, then
        # leave the device idle while the method sets itself up
        with autocast_context(amp, x.device), input_checked(x):
            if isinstance(method, torch.Tensor):
                maps = method[idx.to(method.device)]
            elif method == "random":
                opts.pop("offset", None)  # the image id sets each image's map, in one call for the batch
                maps = explain(model, x, "random", offset=[image_seed(0, i) for i in ids], **opts)
            elif isinstance(method, str):  # a gradient method turns autograd on itself (core.contexts.autograd)
                maps = explain(model, x, method, explained if method in GRADIENT_METHODS else None, **opts)
            else:  # your function, with autograd on and tensors it can differentiate through
                with autograd(None, f"method {name!r}"):
                    maps = method(model, normal_tensor(x), normal_tensor(explained))
        if not isinstance(maps, torch.Tensor) or tuple(maps.shape) != (b, *grid):
            shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
            raise InputError(f"method {name!r} gave maps of shape {shape} for a batch of {b} images; a map "
                             f"method must return ({b}, {grid[0]}, {grid[1]}), one (gh, gw) map per image")
        rank = ranks_on_host(maps.to(x.device), ids, seed)  # the sets are made on the host: one read
        p = pert.num_patches
        curve: list[tuple[str, float, float, str]] = []
        sets: list[torch.Tensor] = []
        for step, f in enumerate(fractions):
            # the nominal step f = step / n_steps, rounded to whole patches (half up), in integers: the float
            # f * P + 0.5 falls just short of a whole number where f * P is a half (5/6 * 15 = 12.5 -> 12)
            k = (2 * step * p + n_steps) // (2 * n_steps)
            for mode in modes:
                sets.append({"positive": rank < k, "deletion": rank < k, "negative": rank >= p - k,
                             "insertion": rank >= k}[mode])  # insertion: only the k most relevant present
                metric = _metric(mode, classes is not None)
                curve.append((mode, float(f), k / p, metric))
        with torch.no_grad():
            for (mode, f, removed_share, metric), scored in zip(curve, pert.scores(sets)):
                pending.append(({"method": name, "mode": mode, "fraction": f, "removed": removed_share,
                                 "metric": metric, "removal": how}, scored[metric]))
    # the scores of the whole batch read at once: one wait for the device per batch, after its last pass
    values = torch.stack([v.float() for _, v in pending]).cpu().double().tolist() if pending else []
    records: list[dict] = []
    for (row, _), scores in zip(pending, values):
        records += [{"image": ids[i], **row, "score": s} for i, s in enumerate(scores)]
    return records
