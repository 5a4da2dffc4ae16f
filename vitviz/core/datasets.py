"""Reductions over whole datasets: a folder, a ``Dataset`` or a ``DataLoader``, on one device or many.

The machinery is generic: a ``RunningReduction`` keeps running sums (tensors that add up over images), ``update``s
them from one batch, and turns them into a ``result``. ``reduce_dataset`` feeds it every image once:

- sources: a folder of images (``ImageFolder``: class sub-folders or flat, preprocessed with the model's own data
  config), any ``torch.utils.data.Dataset`` yielding ``x`` or ``(x, target, ...)``, or a ready ``DataLoader``;
- loading: ``num_workers`` worker processes, pinned memory and non-blocking copies when the model is on CUDA,
  ``torch.autocast`` (bfloat16 by default) on CUDA, a tqdm progress bar;
- memory: only the running sums and one batch live at a time, whatever the dataset's size;
- resuming: with ``checkpoint=path`` the sums and the count of images done are written atomically every
  ``checkpoint_every`` batches; a rerun with the same path continues after the last images written;
- many processes: under ``torchrun`` (``torch.distributed`` initialised) each rank reads its own shard
  (``ShardSampler``, a ``DistributedSampler`` without the padding that would count images twice) and the sums are
  all-reduced at the end, so every rank returns the result over the whole dataset.

Faithfulness curves, statistics of attention, anything averaged over images plugs in as a ``RunningReduction``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from vitviz.core.batching import check_batch_size, check_num_workers
from vitviz.core.calls import in_eval_mode
from vitviz.core.images import collate_images, read_batches
from vitviz.core.io import atomic_save
from vitviz.core.loader_order import ShardSampler, loader_positions, loader_sampler, own_items
from vitviz.core.util import is_int
from vitviz.errors import (
    CheckpointError,
    ImageInputError,
    ImagesLeftOutWarning,
    InputError,
    InputTypeError,
    NotImplementedInVitviz,
)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")

__all__ = ["ImageFolder", "RunningReduction", "ShardSampler", "autocast_context", "autocast_dtype", "dataset_length",
           "is_dataset_source", "iter_dataset", "reduce_dataset"]


class ImageFolder(Dataset):
    """The images under ``root`` (recursively, sorted), preprocessed for ``model``; items are ``(x, label)``.

    ``label`` is the index of the image's first-level sub-folder among the sorted sub-folders (the
    ``ImageFolder`` convention), or -1 for images directly in ``root``. With ``classes`` (another folder's
    ``classes``, e.g. the training set's for its test set), the index of the sub-folder's name among them: a test
    folder that lacks a class keeps the others' labels; a sub-folder not among them is refused.
    """

    def __init__(self, root: str | os.PathLike, model: nn.Module, classes: Sequence[str] | None = None) -> None:
        from timm.data import create_transform

        from vitviz.core.images import data_config

        self.root = Path(root)
        if not self.root.is_dir():
            raise InputError(f"images={str(root)!r} is not a folder; pass a folder of images, a Dataset or a "
                             "DataLoader")
        self.files = sorted(p for p in self.root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not self.files:
            raise ImageInputError(f"images: the folder {str(root)!r} holds 0 images ({', '.join(IMAGE_SUFFIXES)}); "
                                  "pass a folder with at least one image")
        found = sorted({p.relative_to(self.root).parts[0] for p in self.files if p.parent != self.root})
        if classes is not None:
            known = set(classes)
            unknown = [c for c in found if c not in known]
            if unknown:
                raise InputError(f"{str(root)!r} has class sub-folder(s) {unknown} that the training set does not "
                                 f"have (its classes: {list(classes)}); a probe can score only the classes it was "
                                 "fitted on: leave them out of the test folder, or add them to the training folder")
        self.classes = list(classes) if classes is not None else found
        index = {c: i for i, c in enumerate(self.classes)}
        self.labels = [index[p.relative_to(self.root).parts[0]] if p.parent != self.root else -1 for p in self.files]
        self.transform = create_transform(**data_config(model), is_training=False)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from vitviz.core.images import to_pil

        # the checks and messages of an image given by its path (an unreadable file, a 16-bit image)
        return self.transform(to_pil(self.files[i], "images")), self.labels[i]


class RunningReduction:
    """Running sums over images. Subclasses set ``self.sums`` (name -> tensor) and implement ``update``/``result``.

    ``sums`` hold everything that adds up over images (all-reduced across ranks, written to checkpoints);
    ``images`` counts the images seen. ``fingerprint`` names what is reduced, so a checkpoint of another
    reduction or model is refused instead of mixed in.
    """

    name = "reduction"
    version = 1
    """The version of vitviz's computation of this reduction, in every checkpoint's fingerprint: raised when a fix
    changes the numbers, so that a checkpoint of the old computation is refused rather than summed with the new.
    (Checkpoints written before it was recorded have none and are refused: some predate running the model in eval
    mode, whose dropout and BatchNorm changed the sums.)"""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.images = 0

    def update(self, model: nn.Module, x: torch.Tensor, target: Any = None) -> None:
        """Add one batch ``x`` ``(b, 3, H, W)`` (on the model's device) to the sums."""
        raise NotImplementedInVitviz

    def result(self) -> Any:
        raise NotImplementedInVitviz

    def fingerprint(self) -> dict[str, Any]:
        return {"reduction": self.name}

    def state_dict(self) -> dict[str, Any]:
        return {"images": self.images, "sums": {k: v.detach().cpu() for k, v in self.sums.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.images = int(state["images"])
        self.sums = {k: v.clone() for k, v in state["sums"].items()}


def is_dataset_source(images: Any) -> bool:
    """True for what ``reduce_dataset`` takes and a batch does not: a folder, a ``Dataset``, a ``DataLoader``."""
    if isinstance(images, (Dataset, DataLoader)):
        return True
    return isinstance(images, (str, os.PathLike)) and Path(images).is_dir()


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _checkpoint_path(path: str | os.PathLike, rank: int, world: int) -> Path:
    path = Path(path)
    return path if world == 1 else path.with_name(f"{path.stem}.rank{rank}-of-{world}{path.suffix}")


def _fingerprint(reduction: RunningReduction, model: nn.Module, source: Any, n: int | None, amp: torch.dtype | None,
                 rank: int, world: int, path: Path) -> dict:
    """What a checkpoint's sums depend on: the reduction's settings and version, the model's weights and its settings
    besides them (``readout_digest``: a norm's ``eps``, pooling, prefix tokens), the images and autocast; not the
    batch size, workers, progress bar or where the folder lies."""
    from vitviz.core.digest import model_digest, readout_digest, source_digest

    return {**reduction.fingerprint(), "version": reduction.version, "model": type(model).__name__,
            "weights": model_digest(model), "readout": readout_digest(model),
            "dataset_images": n, "data": source_digest(source, f"checkpoint={str(path)!r}"),
            "autocast": str(amp) if amp else None,
            "rank": rank, "world_size": world}


def _load(path: Path, fingerprint: dict) -> dict | None:
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (any unreadable file is the same error for the user)
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read ({exc}); delete it to start over") from exc
    old = saved.get("fingerprint") if isinstance(saved, dict) else None
    if old != fingerprint:
        old = old if isinstance(old, dict) else {}
        keys = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
        what = ", ".join(f"{k} ({_MEANING.get(k, 'a setting')}): {old.get(k)!r} there, {fingerprint.get(k)!r} now"
                         for k in keys)
        raise CheckpointError(f"checkpoint {str(path)!r} belongs to another run; it differs in {what}. Pass another "
                              "checkpoint path, or delete the file to start over")
    return saved


_MEANING = {"weights": "the model's parameters and buffers", "data": "the images read",
            "dataset_images": "the number of images", "autocast": "the autocast dtype", "model": "the model class",
            "readout": "the model's settings besides its weights: pooling, prefix tokens, norms, config",
            "version": "vitviz's computation of the reduction, raised when a fix changed its numbers"}


def _loader(source: Any, model: nn.Module, batch_size: int, num_workers: int, pin: bool, rank: int, world: int,
            skip: int) -> tuple[DataLoader | Any, int]:
    """The loader to read and how many of its leading images must still be skipped by hand."""
    if isinstance(source, DataLoader):
        samplers = (getattr(source, "sampler", None), getattr(getattr(source, "batch_sampler", None), "sampler", None))
        if world > 1 and not any(isinstance(s, DistributedSampler) for s in samplers):
            raise InputError("under torch.distributed a DataLoader must shard its data (sampler=DistributedSampler"
                             "(...)); or pass the Dataset or folder and vitviz shards it")
        return source, skip
    dataset = source
    if not isinstance(dataset, Dataset):
        raise InputError(f"images={type(source).__name__} is neither a folder, a Dataset nor a DataLoader")
    if isinstance(dataset, IterableDataset):  # no sampler: read in its own order, what a checkpoint holds skipped
        check_unsharded(dataset, world, num_workers)
        return own_loader(dataset, batch_size=batch_size, pin_memory=pin), skip
    sampler = ShardSampler(dataset, num_replicas=world, rank=rank, skip=skip)
    return own_loader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, pin_memory=pin,
                      persistent_workers=False), 0


def check_unsharded(dataset: IterableDataset, world: int, num_workers: int) -> None:
    """Refuse to read the ``IterableDataset`` ``dataset`` from several ranks or loader workers: each would read every
    image, so every image would count once per rank or worker."""
    if world > 1 or num_workers:
        raise InputError(f"images={type(dataset).__name__}() is an IterableDataset, which vitviz cannot shard "
                         f"between {'ranks' if world > 1 else 'loader workers'} (each would read every image); "
                         "pass num_workers=0 on one process, or a DataLoader whose dataset shards itself "
                         "(torch.utils.data.get_worker_info)")


def own_loader(dataset: Dataset, **options: Any) -> DataLoader:
    """A ``DataLoader`` that vitviz builds, with a ``torch.Generator`` of its own: starting one draws the workers'
    base seed from its generator, so reading a folder or ``Dataset`` never moves the user's global torch generator
    (a ``DataLoader`` the user passes draws from the generator it was given, the global one if none).
    ``pin_memory`` is dropped for a ``TensorDataset`` (or a ``Subset`` of one) holding tensors off the host: only
    host memory can be pinned (``(images, labels)`` already on the GPU raised in the loader's pinning)."""
    if options.get("pin_memory") and not _on_host(dataset):
        options = {**options, "pin_memory": False}
    return DataLoader(dataset, generator=torch.Generator(), collate_fn=collate_images, **options)


def _on_host(dataset: Dataset) -> bool:
    """Whether ``dataset`` yields host tensors, as far as can be seen without reading it: a ``TensorDataset``'s
    tensors are looked at (through ``Subset``); any other dataset is taken to (it is read by loader workers)."""
    while isinstance(dataset, torch.utils.data.Subset):
        dataset = dataset.dataset
    if isinstance(dataset, torch.utils.data.TensorDataset):
        return all(t.device.type == "cpu" for t in dataset.tensors)
    return True


def take_targets(target: Any, sel: Sequence[int], n: int) -> Any:
    """A batch's targets at the places ``sel`` its images are taken at: a tensor indexed, a list or tuple of one
    target per image (a ``collate_fn`` that gives the labels as a list) taken item by item; anything else (``None``,
    a target that is not one item per image) as it is."""
    if isinstance(target, torch.Tensor):
        return target[list(sel)]
    if isinstance(target, (list, tuple)) and len(target) == n:
        return [target[i] for i in sel]
    return target


def _split(batch: Any) -> tuple[torch.Tensor, Any]:
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0], (batch[1] if len(batch) > 1 else None)
    keys = f" with keys {sorted(map(str, batch))[:6]}" if isinstance(batch, dict) else ""
    raise InputError(f"images: a batch of the Dataset / DataLoader must be an image tensor or (images, targets, "
                     f"...), got a {type(batch).__name__}{keys}; wrap the dataset so that each item is (image, "
                     "label), e.g. (item['pixel_values'], item['label']) for a dict")


def _batch_check(model: nn.Module, pin: bool, cast: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """A batch of a folder, Dataset or DataLoader gets the checks of a tensor input (``check_tensor``: 3 channels,
    floating point, finite; ``check_size``: a size the model takes; errors name ``images``), then goes to the
    model's device (and, with ``cast``, its floating dtype). A batch of pixels in [0, 1] for a model whose
    preprocessing normalises (``warn_unnormalised``: a Dataset with ``ToTensor()`` and no ``Normalize``) is warned
    about once per returned check, that is once per call of a dataset path, not once per batch."""
    from vitviz.core.images import check_size, check_tensor, spec_or_none, warn_unnormalised

    device = _device(model)
    param = next(model.parameters(), None)
    dtype = param.dtype if cast and param is not None and param.is_floating_point() else None
    spec = spec_or_none(model)
    warned = False

    def ready(x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4:  # check_tensor's message names (3, H, W) tensors, which a batch of the tensor path may be
            raise ImageInputError(
                f"images: a batch of the Dataset / DataLoader has shape {tuple(x.shape)}, not (B, 3, H, W): its items "
                "must be (3, H, W) image tensors (grayscale (H, W) items: x.expand(3, -1, -1) in the dataset's "
                "transform; (1, 3, H, W) items: x[0]), and a DataLoader must batch them (batch_size=None reads single "
                "items: pass batch_size=1 or more)")
        nonlocal warned
        found = check_tensor(x, "images")
        if not warned:
            warned = warn_unnormalised(model, found, "images", stacklevel=4)
        if spec is not None:
            check_size(spec, x.shape[-2], x.shape[-1])
        return x.to(device=device, dtype=dtype or x.dtype, non_blocking=pin)

    return ready


def warn_left_out(source: Any) -> None:
    """Warn (``ImagesLeftOutWarning``) when ``source`` is a ``DataLoader`` that drops its last, short batch
    (``drop_last=True``, its sampler's length not a multiple of its batch size), or whose ``DistributedSampler``
    drops the dataset's tail (its own ``drop_last=True``, the dataset's length not a multiple of the ranks): a result
    over it would cover fewer images than the loader's dataset holds, and nothing else would say so. Both dataset
    paths (``reduce_dataset``, ``iter_dataset``) call it before they read. A loader whose sampler has no length (an ``IterableDataset``) cannot
    be told and is passed over."""
    sampler = loader_sampler(source) if isinstance(source, DataLoader) else None
    if isinstance(sampler, DistributedSampler) and not isinstance(sampler, ShardSampler) and sampler.drop_last:
        n, ranks = len(sampler.dataset), sampler.num_replicas  # type: ignore[arg-type]
        if n % ranks:  # the sampler's own drop_last: the dataset's tail is in no rank's shard
            warnings.warn(
                f"images: this DataLoader's DistributedSampler has drop_last=True, so of the dataset's {n} images "
                f"its {ranks} ranks read {n - n % ranks} and leave the last {n % ranks} out of the result. Pass "
                "DistributedSampler(..., drop_last=False) (vitviz leaves its padding out), or the Dataset itself, "
                "to read every image (ImagesLeftOutWarning)", ImagesLeftOutWarning, stacklevel=3)
    batches = getattr(source, "batch_sampler", None) if isinstance(source, DataLoader) else None
    if batches is None or getattr(batches, "drop_last", False) is not True:
        return
    try:
        given, size = len(batches.sampler), int(batches.batch_size)
    except (TypeError, AttributeError):
        return
    left = given % size if size > 0 else 0
    if left:
        warnings.warn(
            f"images: this DataLoader has drop_last=True, so of the {given} images its sampler gives it reads "
            f"{given - left} ({given // size} batches of {size}) and leaves the last {left} out of the result. "
            "Pass a DataLoader with drop_last=False, or the Dataset itself, to read every image (ImagesLeftOutWarning)",
            ImagesLeftOutWarning, stacklevel=3)


def dataset_length(source: Any) -> int | None:
    """How many images a ``Dataset`` or ``DataLoader`` holds (``None`` for an iterable dataset)."""
    try:
        return len(source.dataset if isinstance(source, DataLoader) else source)
    except TypeError:
        return None


def iter_dataset(
    model: nn.Module,
    source: str | os.PathLike | Dataset | DataLoader,
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    positions: list[int] | None = None,
) -> Iterator[tuple[torch.Tensor, Any, list[int]]]:
    """Yield ``(x, targets, positions)`` batches of ``source`` on the model's device (for per-image results).

    Unlike ``reduce_dataset`` (running sums) this hands every batch to the caller with the positions of its images in
    the dataset, so per-image results can be labelled and resumed. Every batch gets the checks of a tensor input
    (``vitviz.core.images.check_tensor``: 3 channels, floating point, finite, a size the model takes; errors name
    ``images=``) and is cast to the model's floating dtype.

    Args:
        model: the ViT (device, dtype and, for a folder, preprocessing).
        source: a folder of images, a ``Dataset`` (items ``x`` or ``(x, target, ...)``), an ``IterableDataset``
            (positions counted as its items come; read in this process, ``num_workers > 0`` refused with an
            ``InputError``: each worker would read every image) or a ``DataLoader`` that reads in a known order
            (``vitviz.core.loader_order``: ``shuffle=False``, a ``ShardSampler``, a ``DistributedSampler(shuffle=
            False)`` without its padding); a shuffling or otherwise sampling loader is refused (``InputError``); a
            ``drop_last=True`` loader whose last batch is short is warned about (``ImagesLeftOutWarning``).
        batch_size, num_workers, pin_memory: for the loader vitviz builds (not for a ready ``DataLoader``).
        positions: read only these positions (a ``Dataset`` reads just them; a ``DataLoader`` or an iterable
            dataset loads every batch and the others are dropped).

    Yields:
        ``x`` ``(b, 3, H, W)`` on the model's device, the batch's targets (or ``None``), and the ``b`` positions.
    """
    from torch.utils.data import IterableDataset

    check_num_workers(num_workers)
    if isinstance(source, (str, os.PathLike)):
        source = ImageFolder(source, model)
    device = _device(model)
    pin = device.type == "cuda" if pin_memory is None else pin_memory
    wanted = None if positions is None else set(positions)
    ready = _batch_check(model, pin, cast=True)

    if isinstance(source, IterableDataset):
        check_unsharded(source, 1, num_workers)
        source = own_loader(source, batch_size=batch_size, pin_memory=pin)
    if isinstance(source, DataLoader):
        warn_left_out(source)
        order = loader_positions(source)
        start = 0
        for batch in read_batches(source):
            x, target = _split(batch)
            pos = list(range(start, start + len(x))) if order is None else order[start:start + len(x)]
            start += len(x)
            if wanted is not None or None in pos:
                sel = [i for i, p in enumerate(pos) if p is not None and (wanted is None or p in wanted)]
                if not sel:
                    continue
                if len(sel) < len(pos):
                    target = take_targets(target, sel, len(x))
                    x, pos = x[sel], [pos[i] for i in sel]
            yield ready(x), target, pos
        return
    if not isinstance(source, Dataset):
        raise InputError(f"images={type(source).__name__} is neither a folder, a Dataset nor a DataLoader")
    order = list(range(len(source))) if positions is None else list(positions)  # type: ignore[arg-type]
    loader = own_loader(torch.utils.data.Subset(source, order), batch_size=batch_size, num_workers=num_workers,
                        pin_memory=pin, shuffle=False)
    done = 0
    for batch in read_batches(loader):
        x, target = _split(batch)
        yield ready(x), target, order[done:done + len(x)]
        done += len(x)


AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def autocast_dtype(autocast: torch.dtype | bool | None, device: torch.device | str,
                   default: torch.dtype | None = torch.bfloat16) -> torch.dtype | None:
    """The one autocast rule of vitviz: the ``torch.autocast`` dtype a run on ``device`` uses, or ``None``.

    ``None`` (the default of the dataset reductions) gives ``default`` on CUDA, ``True`` bfloat16 on CUDA; both
    give nothing on the CPU, where bfloat16 autocast is slower than float32 on most processors. ``False`` gives
    nothing. A dtype (``torch.bfloat16`` or ``torch.float16``) is used as it is on any device, the CPU included.
    Every input path of a function (tensor, folder, ``Dataset``, ``DataLoader``) resolves its ``autocast=`` here,
    so the same images give the same numbers whichever way they are passed.
    """
    cuda = torch.device(device).type == "cuda"
    if autocast is False:
        return None
    if autocast is True:
        return torch.bfloat16 if cuda else None
    if autocast is None:
        return default if cuda else None
    if autocast not in AUTOCAST_DTYPES:
        raise InputError(f"autocast={autocast!r} is not one of None (bfloat16 on CUDA), True, False, torch.bfloat16 "
                         "or torch.float16; pass one of them")
    return autocast


def autocast_context(amp: torch.dtype | None, device: torch.device | str) -> Any:
    """``torch.autocast`` on ``device`` with ``amp`` (from ``autocast_dtype``), or, with ``None``, autocast switched
    off there: ``autocast=False`` computes in the model's precision also inside a caller's ``torch.autocast``.
    While a ``GraphedCall`` records (``core.contexts.recording``) autocast keeps no cache of cast weights, as
    PyTorch asks of autocast in a region captured as a CUDA graph (``torch.cuda.make_graphed_callables`` refuses
    ``cache_enabled=True``)."""
    from vitviz.core.contexts import recording

    kind = torch.device(device).type
    if not amp:
        return torch.autocast(kind, enabled=False)
    return torch.autocast(kind, dtype=amp, cache_enabled=False) if recording() else torch.autocast(kind, dtype=amp)


@in_eval_mode
def reduce_dataset(
    model: nn.Module,
    source: str | os.PathLike | Dataset | DataLoader,
    reduction: RunningReduction,
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    autocast: torch.dtype | bool | None = None,
    progress: bool = False,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 50,
    all_reduce: bool = True,
) -> RunningReduction:
    """Feed every image of ``source`` once to ``reduction``; returns it with the sums over the whole dataset.

    Every batch gets the checks of a tensor input (3 channels, floating point, finite, a size the model takes;
    errors name ``images``) before it reaches the model.

    Args:
        model: the ViT (device, dtype and preprocessing come from it), run in eval mode for the call (each module's
            mode put back afterwards).
        source: a folder of images, a ``Dataset`` (items ``x`` or ``(x, target, ...)``, ``x`` normalised
            ``(3, H, W)``) or a ``DataLoader`` (used as it is: its batch size, workers and sampler, less the
            repeats a ``DistributedSampler`` pads its shard with; a ``drop_last=True`` loader whose last batch is
            short leaves that batch out, with an ``ImagesLeftOutWarning``; with
            ``checkpoint`` it must read in a known order, ``shuffle=False``, since resuming skips the images
            done).
        reduction: the running sums to fill (a ``RunningReduction``).
        batch_size, num_workers: for the loader vitviz builds.
        pin_memory: page-locked batches for fast copies; default: when the model is on CUDA.
        autocast: ``torch.autocast`` dtype (``autocast_dtype``): by default bfloat16 on CUDA and none on the
            CPU; ``False`` for none; a dtype is used on any device.
        progress: a tqdm bar over this rank's images.
        checkpoint: file for resumable partial results (one per rank under torch.distributed); written atomically
            every ``checkpoint_every`` batches and at the end; a rerun continues where it stopped. The file holds
            a fingerprint of the run (the reduction's settings, ``vitviz.core.digest``'s digests of the model's
            weights and of ``source``, the autocast dtype); a rerun that differs in any of them is refused with a
            ``CheckpointError`` naming what differs, never merged. A ``Dataset`` whose items differ from read to
            read (a random transform) cannot be checkpointed (``CheckpointError``; ``vitviz.core.digest``).
        all_reduce: under torch.distributed, sum the ranks' sums (every rank then holds the whole dataset's).

    Returns:
        ``reduction``, its ``sums`` and ``images`` covering every image (of every rank, after the all-reduce).
    """
    if not isinstance(reduction, RunningReduction):
        raise InputTypeError(f"reduction={reduction!r} is not a RunningReduction; pass one, e.g. "
                             "vitviz.analysis.distance.DistanceReduction(model)")
    check_batch_size(batch_size)
    if batch_size is None:
        raise InputError("batch_size=None (one batch of every image) applies to a tensor batch; a folder, Dataset "
                         "or DataLoader is read in batches: pass an integer such as 32")
    if not is_int(checkpoint_every) or checkpoint_every < 1:
        raise InputError(f"checkpoint_every={checkpoint_every!r} is not a positive number of batches; pass an "
                         "integer such as 50")
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise InputTypeError(f"checkpoint={checkpoint!r} is not a file path; pass a path such as 'run.pt', or None")
    if checkpoint is not None and Path(checkpoint).is_dir():
        raise InputError(f"checkpoint={str(checkpoint)!r} is a folder; pass a file path in it, such as "
                         f"{str(Path(checkpoint) / (reduction.name + '.pt'))!r}")
    check_num_workers(num_workers)
    rank, world = _world()
    device = _device(model)
    cuda = device.type == "cuda"
    pin = cuda if pin_memory is None else pin_memory
    amp = autocast_dtype(autocast, device)
    if isinstance(source, (str, os.PathLike)):
        source = ImageFolder(source, model)
    try:
        n = len(source.dataset if isinstance(source, DataLoader) else source)  # type: ignore[arg-type]
    except TypeError:
        n = None  # an iterable dataset
    if n == 0:
        raise ImageInputError(f"images: 0 images in {type(source).__name__}; pass at least one image")
    warn_left_out(source)
    path = _checkpoint_path(checkpoint, rank, world) if checkpoint is not None else None
    if path is not None and isinstance(source, DataLoader):
        loader_positions(source)  # resuming skips the images done: refused for a loader of unknown order
    ready = _batch_check(model, pin, cast=not amp)
    fingerprint = _fingerprint(reduction, model, source, n, amp, rank, world, path) if path is not None else {}
    saved = _load(path, fingerprint) if path is not None else None
    if saved is not None:
        reduction.load_state_dict(saved["state"])
    done = reduction.images
    loader, skip = _loader(source, model, batch_size, num_workers, pin, rank, world, done)

    def save() -> None:
        if path is not None:
            atomic_save({"fingerprint": fingerprint, "state": reduction.state_dict()}, path)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        mine = len(range(rank, n, world)) if n is not None else None
        bar = tqdm(total=mine, initial=done, desc=f"{reduction.name}" + (f" rank {rank}" if world > 1 else ""),
                   unit="img", disable=None)
    batches = 0
    left = own_items(loader_sampler(loader))  # a DistributedSampler pads its shard with repeats: not read
    try:
        for batch in read_batches(loader):
            x, target = _split(batch)
            if left is not None:
                if left <= 0:
                    break
                if len(x) > left:
                    x, target = x[:left], (target[:left] if target is not None else None)
                left -= len(x)
            if skip > 0:  # a ready DataLoader cannot start mid-way: skip what the checkpoint holds
                if skip >= len(x):
                    skip -= len(x)
                    continue
                x, target, skip = x[skip:], (target[skip:] if target is not None else None), 0
            x = ready(x)
            with torch.no_grad(), autocast_context(amp, device):
                reduction.update(model, x, target)
            reduction.images += len(x)
            batches += 1
            if bar is not None:
                bar.update(len(x))
            if batches % checkpoint_every == 0:
                save()
        save()
    finally:
        if bar is not None:
            bar.close()
    if world > 1 and all_reduce:
        _all_reduce(reduction, device)
    if world == 1 and reduction.images == 0:  # an iterable dataset that yielded nothing
        raise ImageInputError(f"images: {type(source).__name__} yielded 0 images; pass at least one image")
    return reduction


def _all_reduce(reduction: RunningReduction, device: torch.device) -> None:
    dist = torch.distributed
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    for key, value in reduction.sums.items():
        t = value.to(on)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        reduction.sums[key] = t.to(value.device)
    count = torch.tensor([reduction.images], dtype=torch.float64, device=on)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    reduction.images = int(count.item())
