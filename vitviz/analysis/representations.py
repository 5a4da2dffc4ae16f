"""Probing a model's frozen representation: few-shot linear accuracy, weighted k-NN, and both at every depth.

``linear_fewshot``, ``knn_probe`` and ``layer_probes`` extract features once (``vitviz.core.features``: one
forward pass per batch through the dataset path, resumable with ``cache=``) and score them with the probes of
``vitviz.analysis.probes`` (the ViT paper's closed-form least squares, Sec. 4.1; DINO's k-NN). Results are tidy
``pandas`` tables, one row per (model, layer, shots, seed); ``summarize_probes`` adds means and 95% intervals.

Layers: ``layer=None`` reads the pre-logits representation (what the classifier sees); ``layer=i`` reads block
``i``'s output (0-based) and pools it as the model's readout pools its last block (``Family.pooled_token``): timm
``global_pool`` (``"token"``: the class token; ``"avg"``, ``"avgmax"``, ``"max"``: the reduction over the tokens after
the prefix tokens, as timm's own pooling), Hugging Face BEiT with mean pooling (the patch mean), DINOv2's classifier
(``[class token, patch mean]``), open_clip ``pool_type="avg"`` (the patch mean), DeiT-distilled (the mean of the
class and distillation tokens, as its head reads them); otherwise the class token, or the
mean of the patch tokens for models without one. An attention-pooling head (timm ``"map"``, SigLIP) is trained on
the last block only and is not applied to other blocks: they get the class token, else the patch mean. No norm is
applied (timm's ``norm`` before pooling and ``fc_norm`` after it belong to the pre-logits, ``layer=None``).
``depth`` in the tables counts blocks from 1; the pre-logits representation has ``depth = L + 1`` for an
``L``-block model.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from vitviz.analysis.intervals import PERCENT, t_interval
from vitviz.analysis.probes import fewshot_draws, knn_accuracy, linear_fewshot_accuracy
from vitviz.core.features import (
    PRE_LOGITS,
    FeatureReduction,
    Features,
    as_dataset_source,
    extract_features,
    resolve_blocks,
)
from vitviz.core.util import check_bool, is_int, is_number
from vitviz.errors import InputError

__all__ = ["linear_fewshot", "knn_probe", "layer_probes", "per_class_subset", "summarize_probes"]


def labels_of(source: Any) -> np.ndarray | None:
    """The labels of a dataset source without loading its images, when it can say (else ``None``)."""
    if isinstance(source, (str, os.PathLike)):
        return None  # resolved after the folder is indexed
    if isinstance(source, Subset):
        inner = labels_of(source.dataset)
        return None if inner is None else inner[np.asarray(source.indices)]
    if getattr(source, "target_transform", None) is not None:
        return None  # torchvision's datasets map each item's label by it: the attribute holds the labels before
    for attr in ("labels", "targets"):
        lab = getattr(source, attr, None)
        if lab is not None and not callable(lab):
            lab = np.asarray(lab)
            try:  # a list that does not hold one label per item is not the items' labels
                return lab if lab.ndim == 1 and len(lab) == len(source) else None
            except TypeError:  # a source without a length
                return None
    tensors = getattr(source, "tensors", None)  # torch TensorDataset
    if tensors is not None and len(tensors) > 1:
        return tensors[1].cpu().numpy()
    return None


def per_class_subset(model: nn.Module, source: Any, per_class: int) -> Subset:
    """The first ``per_class`` images of each class of ``source`` (a folder or a labelled Dataset), in order:
    a small, deterministic, class-balanced evaluation set (e.g. 100 per class of CIFAR-10's test set). Where every
    class has fewer images (a small sample folder), each gives all of them: still balanced.

    Raises:
        InputError: ``per_class`` below 1, or above the images of some classes but not of others (the set would not
            be balanced; the message names the short classes). Or a Dataset's ``labels``/``targets`` attribute
            (by which the images are picked) disagrees with the labels the picked items yield (the subset would not
            hold ``per_class`` images of each class): the labels the picked items yield are checked
            (``_item_labels``: read from the arrays the dataset's ``__getitem__`` takes them from where it is one
            that vitviz knows, else by reading the items).
    """
    if not is_int(per_class) or per_class < 1:
        raise InputError(f"per_class={per_class!r} must be a positive int, the images kept of each class (e.g. 100)")
    ds = _index(model, source)
    labels = labels_of(ds)
    if labels is None:
        raise InputError("per_class_subset needs labels it can read without the images (a folder, a torchvision "
                         "dataset without target_transform, a TensorDataset)")
    classes = np.unique(labels)
    counts = {int(c): int((labels == c).sum()) for c in classes}
    short = {c: n for c, n in counts.items() if n < per_class}
    if len({min(n, per_class) for n in counts.values()}) > 1:  # the classes would give unequal numbers of images
        raise InputError(f"per_class={per_class} exceeds the images of class(es) {short} (class: images); pass a "
                         "smaller per_class")
    keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in classes]))
    _check_item_labels(labels[keep], _item_labels(ds, keep), keep, "source",
                       "the subset picked by the attribute would not hold `per_class` images of each class",
                       "keep the attribute equal to the labels the items yield")
    return Subset(ds, keep.tolist())


def _item_labels(ds: Any, keep: np.ndarray) -> np.ndarray:
    """The labels the items ``keep`` of ``ds`` yield. Where ``type(ds).__getitem__`` is one that returns its label
    from an array as it is (vitviz's folder and torchvision's ``DatasetFolder``/``ImageFolder``: ``samples``;
    torchvision's CIFAR and MNIST datasets: ``targets``; ``TensorDataset``: its second tensor; ``labels_of`` gives
    none for a ``target_transform``), the label is read from that array, not by decoding the image; any other
    ``__getitem__`` (a subclass overriding it included) is called for each item."""
    from torch.utils.data import TensorDataset

    from vitviz.core.datasets import ImageFolder

    getitem = type(ds).__getitem__
    if getitem is ImageFolder.__getitem__:
        return np.array([int(ds.labels[int(i)]) for i in keep])
    if getitem is TensorDataset.__getitem__ and len(ds.tensors) > 1:
        return np.array([int(ds.tensors[1][int(i)]) for i in keep])
    try:
        from torchvision.datasets import CIFAR10, MNIST, DatasetFolder
    except ImportError:
        pass
    else:
        if getitem is DatasetFolder.__getitem__ and getattr(ds, "target_transform", None) is None:
            return np.array([int(ds.samples[int(i)][1]) for i in keep])
        if getitem in (CIFAR10.__getitem__, MNIST.__getitem__) and getattr(ds, "target_transform", None) is None:
            return np.array([int(ds.targets[int(i)]) for i in keep])
    return np.array([int(ds[int(i)][1]) for i in keep])


def _index(model: nn.Module, source: Any, argument: str = "source", classes: Sequence[str] | None = None) -> Any:
    from vitviz.core.datasets import ImageFolder
    from vitviz.core.loader_order import loader_positions

    src = as_dataset_source(source)
    if isinstance(src, DataLoader):
        loader_positions(src, argument)  # features are kept in dataset order: refuses a loader of unknown order
    return ImageFolder(src, model, classes) if isinstance(src, (str, os.PathLike)) else src


def _class_names(source: Any) -> list[str] | None:
    """The class names a dataset numbers its labels by (``classes``: vitviz's and torchvision's folders), or None;
    through any nesting of ``Subset`` and ``DataLoader``."""
    while isinstance(source, (Subset, DataLoader)):
        source = source.dataset
    names = getattr(source, "classes", None)
    return list(names) if isinstance(names, (list, tuple)) else None


def _same_images(train: Any, test: Any) -> bool:
    """Whether ``train`` and ``test`` are one source: the same object (a ``DataLoader`` standing for its dataset),
    the same folder, or the same image tensor (copies of the images are not detected)."""
    train, test = (s.dataset if isinstance(s, DataLoader) else s for s in (train, test))
    if train is test:
        return True
    if isinstance(train, (str, os.PathLike)) and isinstance(test, (str, os.PathLike)):
        return Path(train).resolve() == Path(test).resolve()
    if isinstance(train, (tuple, list)) and isinstance(test, (tuple, list)) and train and test:
        return train[0] is test[0]
    return False


def _index_pair(model: nn.Module, train: Any, test: Any) -> tuple[Any, Any]:
    """``train`` and ``test`` indexed, their labels numbering the same classes: a test folder is labelled by the
    training set's class names (a folder numbers its own sorted sub-folders, so a test folder lacking one class
    would shift every later label onto the wrong class); two datasets that name their classes must name the same.

    Raises:
        InputError: a test folder with a class the training set lacks, datasets naming different classes, or
            ``train`` and ``test`` the same images (``_same_images``)."""
    if _same_images(train, test):
        raise InputError("train and test are the same images, so the probe would be scored on the images it was "
                         "fitted on (k-NN: each test image is its own nearest neighbour); pass held-out test images, "
                         "e.g. the test split's folder")
    tr = _index(model, train, "train")
    names = _class_names(tr)
    te = _index(model, test, "test", classes=names if isinstance(as_dataset_source(test), (str, os.PathLike)) else None)
    other = _class_names(te)
    if names is not None and other is not None and names != other:
        raise InputError(f"train and test number different classes (train: {names}; test: {other}), so a test "
                         "label would be scored as another class; pass the test set as a folder (vitviz labels it "
                         "by the training set's class names) or build both datasets with the same classes")
    return tr, te


def _extract(model: nn.Module, src: Any, keep: np.ndarray | None, layers: Any, pre_logits: bool, cache: Any,
             tag: str, **kw: Any) -> Features:
    if keep is not None and isinstance(src, Dataset) and not isinstance(src, DataLoader):
        src = Subset(src, keep.tolist())
    checkpoint = None
    if cache is not None:
        from vitviz.core.datasets import autocast_dtype
        from vitviz.core.digest import model_digest, readout_digest, source_digest

        # one file per model weights and readout, images, layers and autocast: a cache folder serves many models.
        # Autocast as it resolves on the model's device (None is bfloat16 on CUDA, nothing on the CPU): features
        # cached on a GPU are not the CPU's, and autocast=None and False on the CPU share one file
        param = next(model.parameters(), None)
        amp = autocast_dtype(kw.get("autocast"), param.device if param is not None else "cpu")
        # ... and by the version of the computation: a file of an older one is not found (computed afresh), as a
        # cache should, rather than refused by reduce_dataset's fingerprint
        what = [tag, keep.tolist() if keep is not None else "all", layers, pre_logits, str(amp),
                f"v{FeatureReduction.version}",
                model_digest(model), readout_digest(model), source_digest(src, f"cache={str(cache)!r}")]
        key = hashlib.sha1(repr(what).encode()).hexdigest()[:16]
        checkpoint = Path(cache) / f"features-{tag}-{key}.pt"
    return extract_features(model, src, layers=layers, pre_logits=pre_logits, checkpoint=checkpoint, **kw)


def _name(model: nn.Module, name: str | None) -> str:
    from vitviz.core.spec import model_name

    return name or model_name(model)


def images_digest(source: Any, indices: Any, labels: np.ndarray) -> str | None:
    """A digest of which images ``source`` holds at ``indices`` and their ``labels``, the same whatever model reads
    them (the images, not their preprocessed pixels), so that two models' few-shot rows can be checked to rest on
    the same images: a folder's files (vitviz's or torchvision's) by their paths relative to its root and their
    sizes, a ``TensorDataset``'s or a torchvision dataset's ``data`` by the selected images' values, through any
    ``Subset``. ``None`` where the images cannot be named without reading them (a ``DataLoader``, another
    ``Dataset``)."""
    from vitviz.core.digest import tensor_digest

    idx = np.asarray(indices, dtype=np.int64)
    while isinstance(source, Subset):
        idx, source = np.asarray(source.indices, dtype=np.int64)[idx], source.dataset
    root = getattr(source, "root", None)
    files = getattr(source, "files", None)  # vitviz's ImageFolder
    samples = getattr(source, "samples", None)  # torchvision's DatasetFolder / ImageFolder
    paths = ([files[i] for i in idx] if isinstance(files, list) and len(files) == len(source) else
             [s[0] for s in (samples[i] for i in idx)] if isinstance(samples, list) and len(samples) == len(source)
             else None)
    if paths is not None and root is not None:
        names = []
        for f in map(Path, paths):
            try:
                rel = f.relative_to(root).as_posix()
            except ValueError:
                rel = f.as_posix()
            names.append(f"{rel}:{f.stat().st_size if f.is_file() else -1}")
    elif getattr(source, "tensors", None):  # torch TensorDataset
        names = [tensor_digest(source.tensors[0][idx])]
    elif isinstance(getattr(source, "data", None), np.ndarray) and len(source.data) == len(source):
        names = [tensor_digest(source.data[idx])]  # torchvision's CIFAR and the like: the raw pixels
    else:
        return None
    h = hashlib.sha1("\n".join(names).encode())
    h.update(np.asarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def check_draw_images(rows: pd.DataFrame, group: str, what: str) -> list[str]:
    """Refuse few-shot rows paired by draw that rest on other images: at one ``shots`` and ``seed``, every value of
    ``group`` (a model, a run) must have drawn the same training images (``train_digest``) and been scored on the
    same test images (``test_digest``), as ``linear_fewshot`` records them.

    Returns:
        the values of ``group`` whose images could not be checked (no digest columns: a table written before they
        were recorded; or no digest: images vitviz cannot name), for the caller's warning; ``[]`` when all were.

    Raises:
        InputError: two values of ``group`` hold different digests at one draw; the message names both, the seed
            and the shots.
    """
    unchecked: dict[str, None] = {}
    for col, images in (("train_digest", "few-shot training images"), ("test_digest", "test images")):
        if col not in rows:
            return [str(g) for g in dict.fromkeys(rows[group])]
        unchecked.update((str(g), None) for g in rows.loc[rows[col].isna(), group])
        known = rows[rows[col].notna()]
        for (shots, seed), g in known.groupby(["shots", "seed"], sort=True):
            seen = g.drop_duplicates(col)  # the first row of each digest (a run's epochs share theirs)
            if len(seen) > 1:
                (a, x), (b, y) = seen[[group, col]].iloc[:2].itertuples(index=False)
                raise InputError(f"{what}: {a} and {b} were measured on different {images} at the {int(shots)}-shot "
                                 f"draw seed={int(seed)} ({col} {x} against {y}), so their "
                                 "difference would compare other images, not the models; measure both on the same "
                                 "data (one training folder, one test set) with the same seeds")
    return list(unchecked)


def _features(model: nn.Module, train: Any, test: Any, shots: Sequence[int], seeds: Sequence[int], layers: Any,
              pre_logits: bool, cache: Any, name: str, **kw: Any) -> tuple[Features, Features, dict, dict]:
    """Features of exactly the training images some draw uses (all of them for a DataLoader), and of the test set;
    the draws (indices into the training features) and the digests of the images (``images_digest``): per draw key
    and ``"test"``."""
    tr, te = _index_pair(model, train, test)
    labels = labels_of(tr)
    digests: dict[Any, str | None] = {}
    if labels is not None:
        draws = fewshot_draws(labels, shots, seeds)
        digests = {key: images_digest(tr, idx, labels[idx]) for key, idx in draws.items()}
        keep = np.unique(np.concatenate(list(draws.values())))
        ftr = _extract(model, tr, keep, layers, pre_logits, cache, f"{name}-train", **kw)
        _check_item_labels(labels[keep], ftr.labels.numpy(), keep)
        remap = {int(i): j for j, i in enumerate(keep)}
        draws = {key: np.array([remap[int(i)] for i in idx]) for key, idx in draws.items()}
    else:  # a DataLoader: every image once, then draw from its labels
        ftr = _extract(model, tr, None, layers, pre_logits, cache, f"{name}-train", **kw)
        draws = fewshot_draws(ftr.labels.numpy(), shots, seeds)
    fte = _extract(model, te, None, layers, pre_logits, cache, f"{name}-test", **kw)
    digests["test"] = images_digest(te, np.arange(len(fte)), fte.labels.numpy())
    return ftr, fte, draws, digests


def _check_item_labels(said: np.ndarray, yielded: np.ndarray, images: np.ndarray, argument: str = "train",
                       result: str = "the draws made from the attribute would not hold `shots` images of each class",
                       fix: str = "keep the attribute equal to the items' labels, or pass "
                                  "torch.utils.data.ConcatDataset([dataset]), which has no such attribute: the draws "
                                  "are then made from the labels the items yield") -> None:
    """Refuses items whose labels differ from what the dataset's attribute said (``labels_of``): ``images`` were
    picked by the attribute (the few-shot draws, ``per_class_subset``), so they would not hold what was asked of
    each class the items name (``result``)."""
    wrong = np.flatnonzero(said != yielded)
    if len(wrong):
        i = wrong[0]
        raise InputError(f"{argument}: the dataset's labels attribute (labels or targets) says image "
                         f"{int(images[i])} is class {int(said[i])}, but its item yields {int(yielded[i])} "
                         f"({len(wrong)} of {len(said)} picked images disagree), so {result}; {fix}")


def _fewshot_rows(ftr: Features, fte: Features, draws: dict, l2_reg: float | None, name: str, depth: int,
                  keys: Sequence[Any], digests: dict) -> list[dict[str, Any]]:
    ytr, yte = ftr.labels.numpy(), fte.labels.numpy()
    k = int(max(ytr.max(), yte.max())) + 1
    rows = []
    for key in keys:
        xtr, xte = ftr.feats[key].numpy(), fte.feats[key].numpy()
        for (shots, seed), idx in sorted(draws.items()):
            acc, l2 = linear_fewshot_accuracy(xtr[idx], ytr[idx], xte, yte, l2_reg=l2_reg, num_classes=k)
            rows.append({"model": name, "layer": "pre_logits" if key == PRE_LOGITS else f"block{key}",
                         "depth": depth if key == PRE_LOGITS else int(key) + 1, "probe": "linear", "shots": shots,
                         "seed": seed, "l2_reg": l2, "accuracy": acc, "train_images": len(idx),
                         "test_images": len(yte), "train_digest": digests.get((shots, seed)),
                         "test_digest": digests.get("test")})
    return rows


def linear_fewshot(model: nn.Module, train: Any, test: Any, shots: Sequence[int] = (1, 5, 10, 25),
                   l2_reg: float | None = None, seeds: Sequence[int] = range(5), layer: int | None = None, *,
                   name: str | None = None, batch_size: int = 64, num_workers: int = 0, progress: bool = False,
                   cache: str | os.PathLike | None = None, autocast: Any = None) -> pd.DataFrame:
    """The ViT paper's few-shot linear accuracy (Dosovitskiy et al. 2021, Sec. 4.1) of ``model``'s representation.

    For every ``shots`` and seed, ``shots`` training images per class are drawn (nested over ``shots``), a
    closed-form least-squares map from their frozen features to ``{-1, 1}^K`` is fitted and scored on ``test``
    (``vitviz.analysis.probes``: standardisation, unpenalised intercept, ``l2`` by leave-one-out error over
    ``2^-10..2^10`` on the examples when ``l2_reg`` is None). ``l2_reg=vitviz.analysis.probes.BIG_VISION_L2``
    (``2^10``) reproduces the authors' evaluator (big_vision ``evaluators/fewshot_lsr.py``), which uses that fixed
    penalty with no selection; its configuration draws ``shots=(1, 5, 10, 25)`` with ``seeds=range(3)``, and
    ``fewshot_draws`` draws the way it does.

    Args:
        model: any ViT vitviz reads (run in eval mode; its device is used).
        train, test: a folder (one sub-folder per class), a ``Dataset`` of ``(x, label)``, a ``DataLoader`` in a
            known order (``shuffle=False``; the draws index the dataset, so a shuffling, subset or weighted-sampling
            loader is refused) or
            ``(images (M, 3, H, W), labels (M,))`` tensors. Only the training images some draw uses are read
            when the labels are known without the images (folders, torchvision datasets, tensors; a dataset's
            ``labels``/``targets`` that disagree with the labels its items yield are refused). A test folder
            is labelled by the training set's class names (it may lack a class), and two datasets that name their
            classes must name the same ones. Test images of a class no training image holds are refused, from any
            source (the probe could never predict them), and so is one source as both (the same folder, Dataset
            or image tensor: the probe would be scored on the images it was fitted on).
        shots: images per class. l2_reg: fixed penalty, or None to choose it. seeds: one draw each.
        layer: None for the pre-logits representation, or a block index for that block's pooled token.
        name: the ``model`` column (default: the model's name).
        batch_size, num_workers, progress, autocast: feature extraction (``reduce_dataset``).
        cache: folder for resumable feature files, one per model weights and readout settings, images, layers
            and autocast (``vitviz.core.digest``: ``model_digest``, ``readout_digest``, ``source_digest``): a rerun
            of the same model on the same images reuses them; another model, pooling or dataset gets files of its
            own.

    Returns:
        one row per (shots, seed): ``model, layer, depth, probe, shots, seed, l2_reg, accuracy`` (top-1 %),
        ``train_images, test_images``, and ``train_digest, test_digest``: which images the draw and the test set
        are (``images_digest``; the same for every model that read the same images, ``None`` where vitviz cannot
        name them: a ``DataLoader``), so that a comparison paired by draw can check it pairs the same images.
    """
    nm = _name(model, name)
    layers = None if layer is None else [layer]
    ftr, fte, draws, digests = _features(model, train, test, shots, seeds, layers, layer is None, cache, nm,
                                   batch_size=batch_size, num_workers=num_workers, progress=progress,
                                   autocast=autocast)
    key = PRE_LOGITS if layer is None else resolve_blocks(model, layer)[0]
    depth = len(resolve_blocks(model, "all")) + 1
    return pd.DataFrame(_fewshot_rows(ftr, fte, draws, l2_reg, nm, depth, [key], digests))


def knn_probe(model: nn.Module, train: Any, test: Any, *, k: int = 20, temperature: float = 0.07,
              layer: int | None = None, name: str | None = None, batch_size: int = 64, num_workers: int = 0,
              progress: bool = False, cache: str | os.PathLike | None = None, autocast: Any = None) -> pd.DataFrame:
    """DINO's weighted k-NN accuracy (Caron et al., ICCV 2021) with every ``train`` image as a reference.

    Args: as ``linear_fewshot``; ``k`` neighbours and ``temperature`` of ``exp(sim / T)``
    (``vitviz.analysis.probes.knn_accuracy``).

    Returns:
        one row: ``model, layer, depth, probe ("knn"), k, temperature, accuracy, train_images, test_images``.
    """
    nm = _name(model, name)
    layers = None if layer is None else [layer]
    kw = dict(batch_size=batch_size, num_workers=num_workers, progress=progress, autocast=autocast)
    tr, te = _index_pair(model, train, test)
    ftr = _extract(model, tr, None, layers, layer is None, cache, f"{nm}-knntrain", **kw)
    fte = _extract(model, te, None, layers, layer is None, cache, f"{nm}-test", **kw)
    key = PRE_LOGITS if layer is None else resolve_blocks(model, layer)[0]
    acc = knn_accuracy(ftr.feats[key].numpy(), ftr.labels.numpy(), fte.feats[key].numpy(), fte.labels.numpy(),
                       k=k, temperature=temperature)
    return pd.DataFrame([{"model": nm, "layer": "pre_logits" if layer is None else f"block{key}",
                          "depth": len(resolve_blocks(model, "all")) + 1 if layer is None else key + 1, "probe": "knn", "k": k,
                          "temperature": temperature, "accuracy": acc, "train_images": len(ftr),
                          "test_images": len(fte)}])


def layer_probes(model: nn.Module, train: Any, test: Any, shots: Sequence[int] = (5,),
                 seeds: Sequence[int] = range(5), *, l2_reg: float | None = None, pre_logits: bool = True,
                 name: str | None = None, batch_size: int = 64, num_workers: int = 0, progress: bool = False,
                 cache: str | os.PathLike | None = None, autocast: Any = None) -> pd.DataFrame:
    """Few-shot linear accuracy of every block's pooled token (and the pre-logits), from ONE pass over the data.

    Every block's output is captured in the same forward pass (``extract_features(layers="all")``), so the cost
    is one feature extraction whatever the depth. Args and rows as ``linear_fewshot``; ``depth`` is the block's
    number counted from 1 (``L`` blocks), and the pre-logits rows (``layer="pre_logits"``: after the final norm and
    pooling) have ``depth = L + 1``.
    """
    pre_logits = check_bool(pre_logits, "pre_logits", "probe the pre-logits representation too")
    nm = _name(model, name)
    ftr, fte, draws, digests = _features(model, train, test, shots, seeds, "all", pre_logits, cache, nm,
                                   batch_size=batch_size, num_workers=num_workers, progress=progress,
                                   autocast=autocast)
    blocks = resolve_blocks(model, "all")
    rows = _fewshot_rows(ftr, fte, draws, l2_reg, nm, len(blocks) + 1, blocks + ([PRE_LOGITS] if pre_logits else []),
                         digests)
    return pd.DataFrame(rows)


def _check_one_row_per_draw(g: pd.DataFrame, by: list[str], key: Any) -> None:
    """Refuses a ``summarize_probes`` group that holds a draw twice (a k-NN row, without a seed, is one draw): rows of
    several probes or settings, whose mean would mix them and count each draw twice in the interval."""
    draws = g["seed"] if "seed" in g else pd.Series(np.nan, index=g.index)
    twice = draws.duplicated(keep=False)
    if not twice.any():
        return
    seed = draws[twice].iloc[0]
    same = g[twice & ((draws == seed) | (draws.isna() & pd.isna(seed)))]
    # the l2 a probe chose differs from draw to draw: grouping by it would split one probe's draws
    differ = [c for c in same.columns if c not in (*by, "seed", "accuracy", "l2_reg", "train_digest", "test_digest")
              and same[c].nunique(dropna=False) > 1]
    group = ", ".join(f"{c}={v.item() if isinstance(v, np.generic) else v!r}"
                      for c, v in zip(by, key if isinstance(key, tuple) else (key,)))
    which = "seed " + str(int(seed)) if pd.notna(seed) else "one draw (no seed)"
    fix = (f"its rows differ in {differ}: add one to by, e.g. by={(*by, differ[0])!r}" if differ else
           "give each table a name of its own before concatenating (linear_fewshot(..., name='m-fixed-l2')) or a "
           "column to add to by (df.assign(setting='fixed-l2')); repeated rows: df.drop_duplicates()")
    raise InputError(f"summarize_probes: the group {group} holds {which} twice ({len(same)} rows), so its mean "
                     f"would mix probes or settings and count that draw twice in the interval; {fix}, or pass "
                     "the rows of one probe")


def summarize_probes(df: pd.DataFrame, by: Sequence[str] = ("model", "layer", "depth", "probe", "shots"),
                     level: float = 0.95) -> pd.DataFrame:
    """Mean accuracy over seeds with the Student-t ``level`` interval: columns ``by + [accuracy, low, high,
    draws]``.

    The interval is cut to the accuracy's range, 0 to 100 % (``vitviz.analysis.intervals.t_interval``'s
    ``bounds``): few draws near either end give a Student-t half-width past it.

    One group per value of ``by``; a missing value is a value of its own, so the k-NN rows of a table concatenated
    with linear ones (no ``shots``) keep their own row (one draw: no interval). The interval is over one group's
    draws (the spread of the few-shot draw, on a fixed test set); it is not a paired comparison: two models probed
    with the same seeds use the same training images, and their per-seed differences are what to compare.

    Raises:
        InputError: a group holds one draw twice (tables of several probes or settings concatenated: the same
            ``seed`` twice, or two k-NN rows); the message names the columns that tell them apart, to add to ``by``.
    """
    if "accuracy" not in df:
        raise InputError("summarize_probes needs a probe table with an 'accuracy' column (linear_fewshot, ...)")
    if not is_number(level) or not 0 < level < 1:
        raise InputError(f"level={level!r} must lie in (0, 1), e.g. 0.95 (not a percentage)")
    if isinstance(by, str):
        raise InputError(f"by={by!r} is a string, not a collection of column names; pass by=({by!r},)")
    by = [c for c in by if c in df.columns]
    if not by:
        raise InputError(f"by: none of the columns to group by is in df; pass some of {list(df.columns)}")
    rows = []
    for key, g in df.groupby(by, sort=True, dropna=False):  # k-NN rows have no shots: a group of their own
        _check_one_row_per_draw(g, by, key)
        m, lo, hi = t_interval(g["accuracy"].to_numpy(), level, bounds=PERCENT)  # one draw: NaN, uncut
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "accuracy": m, "low": lo,
                     "high": hi, "draws": len(g)})
    return pd.DataFrame(rows)
