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
area under the score over the fraction axis ``[0, 1]``.

Removal (column ``removal``): ``"drop"`` takes the removed patch tokens out of the sequence right after the
position embedding (a forward hook on the dropout that follows it: timm ``pos_drop``, torchvision
``encoder.dropout``, Hugging Face ``embeddings.dropout``), so the model sees fewer tokens and no invented pixels; it
is used for ViTs with a class token or registers and absolute (or no) position embeddings. Otherwise ``"mean"``:
the pixels of the removed patches are set to the dataset mean, i.e. 0 after the model's normalisation (whose mean
is its training set's), or to ``fill``. Chefer et al. zero pixels; Petsiuk et al. use zero (deletion) and a blurred
image (insertion); both differ from token dropping, so absolute numbers are not comparable across removals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.analysis.explain import GRADIENT_METHODS, METHODS, explain
from vitviz.core.batching import count_images, iter_batches
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.targets import Target, logits_of, resolve_target
from vitviz.errors import InputError

__all__ = ["MODES", "bootstrap_ci", "drop_module", "faithfulness", "faithfulness_auc", "keep_tokens"]

MODES = ("positive", "negative", "deletion", "insertion")
BETTER = {"positive": "lower", "negative": "higher", "deletion": "lower", "insertion": "higher"}


def drop_module(model: nn.Module, spec: ViTSpec | None = None) -> nn.Module | None:
    """The module whose output is the token sequence right after the position embedding, or ``None``.

    ``None`` (so patches are removed by the mean instead) for models without a class token or registers, rotary
    or relative position encodings, pooling over patch tokens, and families vitviz has no such module for.
    """
    spec = spec or inspect(model)
    if spec.num_prefix_tokens == 0 or spec.pos_embed_kind == "rotary":
        return None
    if spec.family == "timm":
        from timm.models.vision_transformer import VisionTransformer

        if isinstance(model, VisionTransformer) and getattr(model, "global_pool", None) in ("token", "map"):
            return getattr(model, "pos_drop", None)
        return None
    if spec.family == "torchvision":
        return model.encoder.dropout
    if spec.family == "huggingface":
        root = getattr(model, "vit", model)
        return getattr(getattr(root, "embeddings", None), "dropout", None)
    return None


@contextmanager
def keep_tokens(module: nn.Module, num_prefix_tokens: int, keep: torch.Tensor) -> Iterator[None]:
    """Inside the block, ``module``'s output ``(B, N, D)`` keeps its prefix tokens and the patches ``keep``.

    Args:
        module: see ``drop_module``.
        num_prefix_tokens: leading tokens always kept.
        keep: ``(B, k)`` patch indices (0-based over the patches) to keep, in sequence order.
    """
    def hook(_m: nn.Module, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
        idx = keep.to(out.device)[..., None].expand(-1, -1, out.shape[-1])
        return torch.cat([out[:, :num_prefix_tokens], out[:, num_prefix_tokens:].gather(1, idx)], dim=1)

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _fill_patches(x: torch.Tensor, removed: torch.Tensor, grid: tuple[int, int], stride: tuple[int, int],
                  fill: torch.Tensor) -> torch.Tensor:
    """``x`` with the pixels of the ``removed`` ``(B, P)`` bool patches set to ``fill`` ``(C,)``."""
    gh, gw = grid
    mask = removed.reshape(-1, 1, gh, gw).repeat_interleave(stride[0], 2).repeat_interleave(stride[1], 3)
    full = torch.zeros(x.shape[0], 1, *x.shape[-2:], dtype=torch.bool, device=x.device)
    full[..., :mask.shape[-2], :mask.shape[-1]] = mask
    return torch.where(full, fill.to(x)[None, :, None, None], x)


def _score(out: Any, target: Target, classes: torch.Tensor | None, model: nn.Module,
           truth: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    if classes is None:
        return {"target": target(out).detach().float().reshape(-1)}  # type: ignore[misc,operator]
    logits = logits_of(out, model).float()
    return {"probability": logits.softmax(-1).gather(1, classes[:, None])[:, 0],
            "accuracy": (logits.argmax(-1) == (classes if truth is None else truth)).float()}


def _fractions(steps: float) -> np.ndarray:
    k = round(1 / steps) if steps > 0 else 0
    if not 0 < steps <= 0.5 or abs(k * steps - 1) > 1e-9:
        raise InputError(f"steps={steps!r} must divide 1 into whole steps (e.g. 0.1 for 10% per step, 0.05, 0.25)")
    return np.linspace(0, 1, k + 1)


def faithfulness(
    model: nn.Module,
    images: Images,
    methods: Sequence[str] = METHODS,
    target: Target = None,
    *,
    labels: Sequence[int] | torch.Tensor | None = None,
    steps: float = 0.1,
    modes: Sequence[str] = MODES,
    removal: str = "auto",
    fill: Sequence[float] | torch.Tensor | None = None,
    method_options: Mapping[str, Mapping[str, Any]] | None = None,
    batch_size: int = 50,
    progress: bool = True,
) -> Any:
    """Perturbation curves of every method on every image, as a tidy ``pandas.DataFrame``.

    Args:
        model: any ViT ``vitviz.inspect`` reads (on the GPU if it is there: everything runs on its device).
        images: a normalised ``(B, 3, H, W)`` batch, a list, or anything ``iter_batches`` takes.
        methods: names for ``vitviz.explain``.
        target: ``None`` (each image's clean prediction), a class index, one per image (e.g. the labels), or a
            callable ``f(output) -> (B,)``.
        labels: one class index per image; when given, ``accuracy`` is whether the arg-max equals the label (as in
            Chefer et al.'s evaluation code, which explains one class and scores against the ground truth), while
            ``probability`` stays that of the explained class. Default: accuracy against the explained class.
        steps: the fraction of patches removed per step (the curve has ``1 / steps + 1`` points, 0% to 100%).
        modes: any of ``positive``, ``negative``, ``deletion``, ``insertion`` (module docstring).
        removal: ``"auto"`` (drop tokens where the model allows it, else mean), ``"drop"`` or ``"mean"``.
        fill: the per-channel value of removed pixels for ``"mean"``, in the model's normalised space (default
            0: the normalisation mean, the model's training-set mean).
        method_options: per method, options for ``vitviz.explain`` (e.g. ``{"attention": {"layer": -1}}``).
        batch_size: images per pass.
        progress: show a progress bar over images.

    Returns:
        DataFrame with columns ``image`` (index in ``images``), ``method``, ``mode``, ``fraction``, ``score``,
        ``metric`` (``accuracy``, ``probability`` or ``target``) and ``removal``; ``df.attrs["auc"]`` holds
        ``faithfulness_auc(df)``.
    """
    import pandas as pd

    for m in methods:
        if m not in METHODS:
            raise InputError(f"methods holds {m!r}, which is not one of {METHODS}")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise InputError(f"modes={list(modes)!r}: each must be one of {MODES}")
    fractions = _fractions(steps)
    spec = inspect(model)
    module = drop_module(model, spec)
    if removal not in ("auto", "drop", "mean"):
        raise InputError(f"removal={removal!r} must be 'auto', 'drop' or 'mean'")
    if removal == "drop" and module is None:
        raise InputError(f"removal='drop': {spec.name} has no token sequence vitviz can drop tokens from (it needs a "
                         "class token or registers, absolute position embeddings and a class-token readout); use "
                         "removal='mean'")
    how = "drop" if removal in ("auto", "drop") and module is not None else "mean"
    fill_t = torch.zeros(3) if fill is None else torch.as_tensor(fill, dtype=torch.float32).reshape(-1)
    options = {k: dict(v) for k, v in (method_options or {}).items()}
    total = count_images(images)
    records: list[dict[str, Any]] = []
    start = 0
    with torch.no_grad():
        for x in iter_batches(model, images, batch_size, progress=progress, desc="faithfulness"):
            b = len(x)
            clean = model(x)
            resolved = resolve_target(target, clean, start=start, n_images=total, model=model)
            classes = resolved.classes
            truth = None if labels is None or classes is None else resolve_target(
                labels, clean, start=start, n_images=total, model=model).classes
            batch_target = target if classes is None else classes
            pert = _Perturbed(model, spec, x, how, module, fill_t, target, classes, truth)
            p = pert.num_patches
            for method in methods:
                opts = dict(options.get(method, {}))
                if method == "random":
                    opts.setdefault("offset", start)
                with torch.enable_grad():
                    maps = explain(model, x, method, batch_target if method in GRADIENT_METHODS else None, **opts)
                order = maps.detach().flatten(1).float().argsort(dim=1, descending=True, stable=True)
                rank = torch.empty_like(order).scatter_(1, order, torch.arange(p, device=order.device).expand(b, -1))
                for f in fractions:
                    k = int(np.floor(f * p + 0.5))
                    most = pert.scores(rank < k)  # the k most relevant removed
                    least = pert.scores(rank >= p - k)  # the k least relevant removed
                    kept_top = pert.scores(rank >= k)  # only the k most relevant present (insertion)
                    for mode in modes:
                        scores = {"positive": most, "deletion": most, "negative": least, "insertion": kept_top}[mode]
                        metric = _metric_for(mode, classes is None)
                        for i, s in enumerate(scores[metric]):
                            records.append({"image": start + i, "method": method, "mode": mode,
                                            "fraction": float(f), "score": s, "metric": metric, "removal": how})
            start += b
    df = pd.DataFrame.from_records(records, columns=["image", "method", "mode", "fraction", "score", "metric",
                                                     "removal"])
    df.attrs["removal"] = how
    df.attrs["auc"] = faithfulness_auc(df)
    return df


class _Perturbed:
    """One batch ``x``: the scores of the model with any set of patches removed (identical sets run once)."""

    def __init__(self, model: nn.Module, spec: ViTSpec, x: torch.Tensor, how: str, module: nn.Module | None,
                 fill: torch.Tensor, target: Target, classes: torch.Tensor | None,
                 truth: torch.Tensor | None = None) -> None:
        self.model, self.spec, self.x, self.how, self.module = model, spec, x, how, module
        self.fill, self.target, self.classes, self.truth = fill, target, classes, truth
        self.grid = spec.grid_for_input(x)
        self.num_patches = self.grid[0] * self.grid[1]
        self.cache: dict[tuple[int, ...], dict[str, list[float]]] = {}

    def scores(self, removed: torch.Tensor) -> dict[str, list[float]]:
        """Per metric, one score per image, with the ``removed`` ``(b, P)`` bool patches taken out."""
        key = tuple(removed.flatten().nonzero().flatten().tolist())
        if key not in self.cache:
            b = len(self.x)
            if self.how == "drop":
                keep = (~removed).nonzero()[:, 1].reshape(b, self.num_patches - int(removed[0].sum()))
                with keep_tokens(self.module, self.spec.num_prefix_tokens, keep):  # type: ignore[arg-type]
                    out = self.model(self.x)
            else:
                out = self.model(_fill_patches(self.x, removed, self.grid, self.spec.patch_size, self.fill))
            scored = _score(out, self.target, self.classes, self.model, self.truth)
            self.cache[key] = {k: v.detach().cpu().double().tolist() for k, v in scored.items()}
        return self.cache[key]


def _metric_for(mode: str, callable_target: bool) -> str:
    if callable_target:
        return "target"
    return "accuracy" if mode in ("positive", "negative") else "probability"


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                 statistic: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (or ``statistic`` over axis 1) of ``values``, resampling them.

    Args:
        values: one value per unit (image).
        n_boot: resamples.
        ci: coverage, e.g. 0.95.
        seed: the generator's seed (same seed, same interval).
        statistic: ``f(resamples (n_boot, n)) -> (n_boot,)``; default the mean.

    Returns:
        ``(low, high)``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) == 0:
        raise InputError(f"bootstrap_ci needs a non-empty 1-D set of values, got shape {v.shape}")
    if not 0 < ci < 1:
        raise InputError(f"ci={ci!r} must lie in (0, 1), e.g. 0.95")
    rng = np.random.default_rng(seed)
    samples = v[rng.integers(0, len(v), size=(n_boot, len(v)))]
    stats = samples.mean(axis=1) if statistic is None else statistic(samples)
    lo, hi = np.quantile(stats, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return float(lo), float(hi)


def faithfulness_auc(df: Any, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, upto: float = 1.0) -> Any:
    """Area under each curve per image, averaged over images, with a bootstrap interval over images.

    Args:
        df: the DataFrame of ``faithfulness``.
        n_boot, ci, seed: as in ``bootstrap_ci`` (the same resamples of images for every row).
        upto: integrate over fractions ``[0, upto]`` only; Chefer et al. integrate up to 0.9
            (``np.trapz(acc, x) * 100`` with ``x = 0, 0.1, ..., 0.9``), so ``upto=0.9`` times 100 is their number.

    Returns:
        DataFrame with one row per ``method``, ``mode``, ``metric``: ``auc`` (mean over images), ``ci_low``,
        ``ci_high``, ``n_images``, ``better`` (``lower`` / ``higher``) and ``removal``.
    """
    import pandas as pd

    rows = []
    keys = ["method", "mode", "metric", "removal"]
    df = df[df["fraction"] <= upto + 1e-9]
    for (method, mode, metric, removal), g in df.groupby(keys, sort=False):
        grid = g.pivot_table(index="image", columns="fraction", values="score", aggfunc="first").sort_index(axis=1)
        if grid.isna().to_numpy().any():
            raise InputError(f"the curves of {method}/{mode} do not share their fractions across images")
        y, xs = grid.to_numpy(), grid.columns.to_numpy(dtype=np.float64)
        per_image = pd.Series(((y[:, 1:] + y[:, :-1]) / 2 * np.diff(xs)).sum(axis=1), index=grid.index)  # trapezoid
        lo, hi = bootstrap_ci(per_image.to_numpy(), n_boot=n_boot, ci=ci, seed=seed)
        rows.append({"method": method, "mode": mode, "metric": metric, "auc": float(per_image.mean()),
                     "ci_low": lo, "ci_high": hi, "n_images": len(per_image), "better": BETTER[mode],
                     "removal": removal})
    return pd.DataFrame(rows, columns=["method", "mode", "metric", "auc", "ci_low", "ci_high", "n_images",
                                       "better", "removal"])
