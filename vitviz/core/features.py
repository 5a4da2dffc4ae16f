"""Frozen representations of a whole dataset, extracted once: the pre-logits and any block's pooled token.

``extract_features(model, source)`` feeds every image of ``source`` once through ``reduce_dataset`` (device,
autocast, progress bar, resumable checkpoint file) and returns, per image, the model's pre-logits representation
(``Family.pre_logits``: timm ``forward_head(forward_features(x), pre_logits=True)``, the input of a Hugging Face
or torchvision classifier, a Hugging Face backbone's ``pooler_output``, open_clip's image features) and/or each
requested block's image representation (``Family.pooled_token`` of the block's output tokens, pooled as the
model's readout pools its last block: the class token, or the patch mean for a model that averages; see
``vitviz.analysis.representations``), all from ONE forward pass per batch, with the labels.

Features are stored row by row in running "sums" (each row written once, zero elsewhere), so the resumable
checkpoint of ``reduce_dataset`` doubles as a feature cache: a rerun with the same ``checkpoint`` path reads the
finished features back without touching the model.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import TensorDataset as TorchTensorDataset

from vitviz.core.calls import in_eval_mode
from vitviz.core.datasets import RunningReduction, reduce_dataset
from vitviz.core.loader_order import loader_positions
from vitviz.core.util import check_bool, class_indices, is_int
from vitviz.errors import InputError, LayerSelectError, UnsupportedModelError

PRE_LOGITS = "pre_logits"
FeatureSource = str | os.PathLike | Dataset | DataLoader | tuple[torch.Tensor, torch.Tensor]


@dataclass
class Features:
    """Per-image representations: ``feats[key]`` ``(M, D)`` float32 for ``key`` ``"pre_logits"`` or a block index
    (0-based), ``labels`` ``(M,)`` int64."""

    feats: dict[str | int, torch.Tensor]
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


def resolve_blocks(model: nn.Module, layers: Any) -> list[int]:
    """Block indices for ``layers``: ``None`` (none), ``"all"``, an int or a list of ints (negative from the end;
    NumPy integers too)."""
    from vitviz.core.families import family_of

    depth = len(family_of(model).blocks(model))
    if layers is None:
        return []
    if isinstance(layers, str):
        if layers != "all":
            raise LayerSelectError(f"layer={layers!r}: pass 'all', a block index or a list of them")
        return list(range(depth))
    items = [layers] if isinstance(layers, numbers.Number) else list(layers)  # a bool or a float: refused below
    out = []
    for i in items:
        if not is_int(i) or not -depth <= i < depth:
            raise LayerSelectError(f"layer={i!r} is not a block of this {depth}-block model; use 0..{depth - 1} "
                                   "or -1 for the last block")
        out.append(int(i) % depth)
    return sorted(set(out))


class FeatureReduction(RunningReduction):
    """Collects per-image representations as row-wise "sums" (see the module docstring).

    Args:
        model: the ViT.
        num_images: the dataset's size ``M`` (rows to allocate).
        blocks: block indices whose pooled token to keep.
        pre_logits: whether to keep the pre-logits representation.
        rows: the dataset position of each image this process sees, by order (default ``0, 1, 2, ...``).
    """

    name = "features"

    def __init__(self, model: nn.Module, num_images: int, blocks: list[int], pre_logits: bool = True,
                 rows: Sequence[int] | None = None) -> None:
        super().__init__()
        from vitviz.core.families import family_of
        from vitviz.core.spec import inspect

        self.model = model
        self.family = family_of(model)
        self.prefix = inspect(model).prefix_tokens
        self.block_modules = [m for _, m in self.family.blocks(model)]
        self.blocks = blocks
        self.want_pre_logits = pre_logits
        self.num_images = num_images
        self.rows = rows if rows is not None else range(num_images)
        self.sums = {"labels": torch.zeros(num_images, dtype=torch.long),
                     "filled": torch.zeros(num_images, dtype=torch.long)}

    def fingerprint(self) -> dict[str, Any]:
        # the weights and the readout (pooling, prefix tokens) are in reduce_dataset's fingerprint
        return {"reduction": self.name, "blocks": list(self.blocks), "pre_logits": self.want_pre_logits,
                "images": self.num_images}

    def _put(self, key: str, rows: torch.Tensor, values: torch.Tensor) -> None:
        values = values.detach().float().cpu()
        if key not in self.sums:
            self.sums[key] = torch.zeros(self.num_images, values.shape[-1])
        self.sums[key][rows] = values

    def update(self, model: nn.Module, x: torch.Tensor, target: Any = None) -> None:
        b = len(x)
        rows = torch.tensor(self.rows[self.images: self.images + b], dtype=torch.long)
        if target is None:
            raise InputError("features for probes need labels: pass a folder with one sub-folder per class, a "
                             "Dataset yielding (image, label) or (images, labels) batches")
        try:
            given = torch.as_tensor(target).cpu()
        except (TypeError, ValueError):  # e.g. class names: default_collate gives a list of strings
            raise InputError(f"labels: the dataset's targets {repr(target)[:80]} are not class indices (ints >= 0); "
                             "yield each image's class index instead, e.g. classes.index(name)") from None
        if (given == -1).any():
            raise InputError("images without a class (label -1: files directly in the folder) cannot be probed; "
                             "put each class's images in its own sub-folder")
        labels = torch.from_numpy(class_indices(given.float() if given.dtype == torch.bfloat16 else given, "labels"))
        tokens: dict[int, torch.Tensor] = {}
        handles = []
        for i in self.blocks:
            def hook(_m: nn.Module, _inp: Any, out: Any, i: int = i) -> None:
                tokens[i] = self.family.pooled_token(model, self.family.block_tokens(model, out, b), self.prefix)
            handles.append(self.block_modules[i].register_forward_hook(hook))
        try:
            if self.want_pre_logits:
                pre = self.family.pre_logits(model, x)
                if pre.ndim != 2:
                    raise UnsupportedModelError(
                        f"{type(model).__name__}: its pre-logits output is {tuple(pre.shape)}, every token rather "
                        "than one vector per image (its head pools nothing, as timm's global_pool=''), so it has no "
                        "pre-logits representation to probe; pass layer=<block index> (that block's tokens, pooled "
                        "as the readout pools them) or build the model with a pooling (global_pool='token' or 'avg')")
                self._put(PRE_LOGITS, rows, pre)
            else:
                model(x)
        finally:
            for h in handles:
                h.remove()
        for i in self.blocks:
            self._put(f"block{i}", rows, tokens[i])
        self.sums["labels"][rows] = labels
        self.sums["filled"][rows] = 1

    def result(self) -> Features:
        keep = self.sums["filled"].bool()
        feats: dict[str | int, torch.Tensor] = {}
        if self.want_pre_logits:
            feats[PRE_LOGITS] = self.sums[PRE_LOGITS][keep]
        for i in self.blocks:
            feats[i] = self.sums[f"block{i}"][keep]
        return Features(feats, self.sums["labels"][keep])


def as_dataset_source(source: Any) -> Dataset | DataLoader | str | os.PathLike:
    """Batches ``(images, labels)`` become a ``TensorDataset``; folders, Datasets and DataLoaders pass through."""
    if isinstance(source, (tuple, list)) and len(source) == 2 and all(isinstance(t, torch.Tensor) for t in source):
        x, y = source
        if x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
            raise InputError(f"batches must be (images (M, 3, H, W), labels (M,)), got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}")
        return TorchTensorDataset(x, y)
    if isinstance(source, (str, os.PathLike, Dataset, DataLoader)):
        return source
    raise InputError(f"expected a folder, a Dataset, a DataLoader or (images, labels) tensors, got "
                     f"{type(source).__name__}")


@in_eval_mode
def extract_features(model: nn.Module, source: FeatureSource, *, layers: Any = None, pre_logits: bool = True,
                     batch_size: int = 64, num_workers: int = 0, autocast: torch.dtype | bool | None = None,
                     progress: bool = False, checkpoint: str | os.PathLike | None = None) -> Features:
    """Every image's representation(s) in ``source``, from one forward pass per batch (see the module docstring).

    Args:
        model: the ViT, on its device (run in eval mode for the call).
        source: a folder (ImageFolder layout, preprocessed with the model's data config), a ``Dataset`` of
            ``(x, label)``, a ``DataLoader`` that reads it in a known order (``shuffle=False``; a shuffling, subset or
            weighted-sampling loader is refused with an ``InputError``: its rows could not be put in dataset order) or
            ``(images (M, 3, H, W), labels (M,))`` tensors (preprocessed).
        layers: blocks whose pooled token to keep: ``None``, ``"all"``, an index or a list.
        pre_logits: keep the pre-logits representation.
        batch_size, num_workers, autocast, progress, checkpoint: as in ``reduce_dataset`` (``checkpoint`` makes the
            extraction resumable and caches the finished features).

    Returns:
        ``Features`` (``(M, D)`` per key, ``(M,)`` labels) in dataset order.
    """
    from vitviz.core.datasets import ImageFolder

    src = as_dataset_source(source)
    if isinstance(src, (str, os.PathLike)):
        src = ImageFolder(src, model)
    data = src.dataset if isinstance(src, DataLoader) else src
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError:
        raise InputError("features need a dataset of known length (an iterable dataset has none)") from None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise InputError(f"extract_features runs in one process, and torch.distributed is initialised here (rank "
                         f"{torch.distributed.get_rank()} of {torch.distributed.get_world_size()}): its features are "
                         "not gathered across ranks; call it before init_process_group or after "
                         "destroy_process_group, or in a process that does not join the group")
    pre_logits = check_bool(pre_logits, "pre_logits", "keep the pre-logits representation")
    blocks = resolve_blocks(model, layers)
    if not blocks and not pre_logits:
        raise InputError("nothing to extract: pre_logits=False and layers=None")
    rows = None
    if isinstance(src, DataLoader):  # each image's row is its dataset position, not its place in the loader's order
        positions = loader_positions(src, "source")  # refuses a loader of unknown order (shuffling, subset sampling)
        rows = None if positions is None else [p for p in positions if p is not None]  # None: a padded repeat
    red = reduce_dataset(model, src, FeatureReduction(model, n, blocks, pre_logits, rows), batch_size=batch_size,
                         num_workers=num_workers, autocast=autocast, progress=progress, checkpoint=checkpoint)
    return red.result()
