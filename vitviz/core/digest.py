"""Fingerprints of what a result depends on: a model's weights, an image source's contents and a callable.

A resumable run (``reduce_dataset(checkpoint=...)``, ``extract_features``' cache, ``faithfulness(out=...)``) may
only continue from a file written by the same run. The class name and the number of images do not identify a
run: a fine-tuned copy of a model, or another test set of the same size, would be merged in silently. These digests
do: ``model_digest`` hashes every parameter and buffer (names, dtypes, shapes and bytes), ``readout_digest`` a
model's settings besides its tensors (each module's class and plain public attributes, a Hugging Face ``config``;
every ``reduce_dataset`` checkpoint, the probes' ``cache=`` and ``faithfulness(out=)`` add it: another pooling or a
norm's ``eps`` keeps every tensor), ``source_digest`` hashes what a source yields without loading an image where the
source says what it holds (a folder's files with their sizes and modification times, named relative to the folder,
so that a folder moved elsewhere with its files' times kept is the same source; a ``TensorDataset``'s tensors, a
torchvision dataset's arrays and ``target_transform``, a ``Subset``'s indices, a ``DataLoader``'s dataset, its
``collate_fn`` (when not the default) and sampler and, for a sampler of fixed order, the positions it reads: a
``DistributedSampler``'s rank and world size and a ``drop_last`` loader's dropped tail count, the batch size
otherwise does not). A map-style ``Dataset`` of another kind is identified by its class, its length, its
``transform`` (and ``target_transform``), what it holds in its own attributes (tensors, arrays, pandas tables, lists
of file paths with each file's size and modification time, of strings or of integers: a path list's image replaced
or edited anywhere, or one label changed, is seen) and the values of three of its items (the first, the middle and
the last: image tensors and labels; another data set differs there, an edit of one image among the others that its
attributes do not show is not seen). They
are loaded only when a digest is asked for, i.e. by a run with a checkpoint, cache or ``out=``; item 0 is loaded
twice, and a dataset that gives other values the second time (a random transform) is refused with a
``CheckpointError``, as a run on it cannot be resumed to the same result. The global random states (torch's CPU
generator, numpy's, ``random``'s) are restored afterwards, so the loads do not change the run. An
``IterableDataset`` cannot be read by index and stays identified by its class, length (where it has one) and
``transform``.

``callable_digest`` identifies a callable argument (a ``target=`` function, a method) by what it computes, not by
its name alone: two lambdas, or two closures made by one factory with other arguments, have the same qualified name.
A function is hashed by its module, qualified name, code (bytecode, names and constants, nested code objects
included; not the line numbers), defaults, the contents of its closure and the values of the globals it reads: each
name in the ``co_names`` of its code and of its nested code objects that is a key of its ``__globals__``, in name
order (so ``CLASS = 3`` and ``CLASS = 5`` read by one lambda differ, and a global helper function it calls counts by
its own code, closure and globals); a function met again while it is being hashed (a recursive function, two that
call each other) is hashed the second time by its qualified name only. A ``functools.partial`` is hashed by its
function, arguments and keywords; a bound method by its function and its ``self``; an ``nn.Module`` by
``model_digest`` and its ``repr``; another callable object by its class, the code of its ``__call__`` and its state
(its ``repr``, or its attributes where the ``repr`` is the default ``<... at 0x...>``, and else the attributes that
hold code, such as the function of torchvision's ``Lambda``, whose ``repr`` is ``Lambda()``). A dataset's
``transform`` is hashed by these rules too: a plain function or a ``Compose`` of lambdas resumes, two different
lambdas do not. Values met on the way (closure cells, defaults, globals, arguments) are hashed by the same rules:
tensors and arrays by ``tensor_digest``, numbers, strings, ``None`` and containers by value, callables recursively
(to a depth of 6), a module by its ``__name__`` alone (its contents are never walked), a class by its module and
qualified name, and any other object by its class and its ``repr``, or by its class alone where the ``repr`` shows a
memory address (which differs from run to run), so two such objects of one class are not told apart. Hence not seen:
what a function reads through a global module or class (``np.pi``, ``config.CLASS`` of an imported module
``config`` or of a class ``Config``), the attributes of a global object known by its class alone, what it looks up
by a computed name (``getattr(obj, name)``, ``globals()[name]``), and the builtins (``len``; named in the code, not
valued). An object whose attributes count and change as it is called (a counter) gives another digest after a run.
The digest is the same in every process for the same source on the same Python version (bytecode differs between
Python versions, so a file written under another Python is refused, never merged).

Hashing is SHA-1 over the raw bytes (tensors are copied to the CPU one at a time): about a second for ViT-B/16's
86 M parameters on one core, once per call.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import os
import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.util import is_int, kept_rng
from vitviz.errors import CheckpointError

__all__ = ["callable_digest", "file_key", "image_digest", "model_digest", "readout_digest", "source_digest",
           "tensor_digest"]

_DEPTH = 6  # how deep values inside values (a closure over a partial over a closure ...) are followed
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")  # the default repr, <Foo object at 0x7f...>, differs from run to run
_HASHING: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("_HASHING", default=frozenset())
"""The ids of the functions being hashed on the current path: one met again (a recursive function) is named only."""


def _feed_tensor(h: Any, t: torch.Tensor) -> None:
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.device.type == "meta" or t.numel() == 0:
        return
    flat = t.detach().reshape(-1).contiguous().cpu()
    h.update(flat.view(torch.uint8).numpy().tobytes() if flat.dtype != torch.uint8 else flat.numpy().tobytes())


def tensor_digest(t: Any) -> str:
    """A hex digest of a tensor's (or array's, or number's) dtype, shape and values."""
    h = hashlib.sha1()
    _feed_tensor(h, torch.as_tensor(t))
    return h.hexdigest()[:16]


def file_key(path: str | os.PathLike) -> str:
    """What identifies a file's contents without reading them: its size and modification time."""
    path = Path(path)
    st = path.stat() if path.is_file() else None
    return f"{st.st_size if st else -1}:{st.st_mtime_ns if st else -1}"


def image_digest(item: Any) -> str | None:
    """One image's digest: a tensor's or array's values, a PIL image's mode, size and pixels, a file's resolved
    path, size and modification time; ``None`` for anything else."""
    if isinstance(item, np.ndarray):
        item = torch.from_numpy(np.ascontiguousarray(item))
    if isinstance(item, torch.Tensor):
        return tensor_digest(item)
    if isinstance(item, (str, os.PathLike)):
        path = Path(item)
        return hashlib.sha1(f"path:{path.resolve()}:{file_key(path)}".encode()).hexdigest()[:16]
    if hasattr(item, "mode") and hasattr(item, "size") and hasattr(item, "tobytes"):  # a PIL image
        return hashlib.sha1(f"{item.mode}{item.size}".encode() + item.tobytes()).hexdigest()[:16]
    return None


def model_digest(model: nn.Module) -> str:
    """A hex digest of ``model``'s class, parameter and buffer names, dtypes, shapes and values.

    Two models get the same digest exactly when they hold the same tensors under the same names (a copy does;
    a fine-tuned, re-initialised or cast copy does not).
    """
    h = hashlib.sha1(type(model).__qualname__.encode())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(name.encode())
        _feed_tensor(h, t)
    return h.hexdigest()[:16]


_PLAIN = (type(None), bool, int, float, str)


def _plain(value: Any) -> bool:
    """A value made of numbers, strings, ``None``, tuples, lists and dicts of them (a setting, not state)."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def readout_digest(model: nn.Module) -> str:
    """A hex digest of what decides ``model``'s outputs besides its tensors: every submodule's name and class and its
    public attributes of plain values (numbers, strings, ``None`` and containers of them; not ``training``), such as
    timm's ``global_pool``, ``num_prefix_tokens`` and ``pool_include_prefix`` or a norm's ``eps``, and a Hugging Face
    model's ``config`` (its public plain entries).

    ``model_digest`` does not see these: timm's ``reset_classifier(0, "avg")`` after ``reset_classifier(0,
    "token")`` keeps every tensor and changes the features; this digest changes with it.
    """
    h = hashlib.sha1(b"readout:")
    for name, module in model.named_modules():
        h.update(f"{name}:{_name(module)}".encode())
        attrs = dict(vars(module))
        config = attrs.pop("config", None)
        if config is not None and callable(getattr(config, "to_dict", None)):
            attrs.update({f"config.{k}": v for k, v in config.to_dict().items() if not k.startswith("_")})
        for key in sorted(attrs):
            value = attrs[key]
            if key != "training" and not key.startswith("_") and _plain(value):
                h.update(f"{key}={value!r};".encode())
    return h.hexdigest()[:16]


def _name(obj: Any) -> str:
    """``module.qualname`` of a function or class (of the object's class for anything else)."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', None) or '?'}.{getattr(named, '__qualname__', type(obj).__name__)}"


def _stable_repr(obj: Any) -> str | None:
    """``repr(obj)``, or ``None`` where it shows a memory address (or fails): it would differ from run to run."""
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 (a broken repr says nothing stable)
        return None
    return None if _ADDRESS.search(text) else text


def _feed_code(h: Any, code: types.CodeType) -> None:
    h.update(f"code:{code.co_argcount}:{code.co_kwonlyargcount}:{code.co_flags}:{code.co_names}".encode())
    h.update(code.co_code)  # the unspecialised bytecode: calling the function does not change it
    for const in code.co_consts:
        _feed_value(h, const, 0)


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and its nested code objects load (globals, builtins and attribute names alike)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _feed_value(h: Any, value: Any, depth: int) -> None:
    """Feeds one value met inside a callable (a closure cell, a default, a global, a partial's argument): module
    docstring."""
    if depth > _DEPTH:
        h.update(f"deep:{_name(value)}".encode())
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, type(Ellipsis))):
        h.update(f"{type(value).__name__}:{value!r}".encode())
    elif isinstance(value, torch.Tensor) or (
            isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc"):
        h.update(f"tensor:{tensor_digest(value)}".encode())
    elif isinstance(value, (tuple, list, np.ndarray)):
        h.update(f"{type(value).__name__}:{len(value)}".encode())
        for v in value:
            _feed_value(h, v, depth + 1)
    elif isinstance(value, (set, frozenset)):  # in no fixed order (string hashes differ between processes)
        h.update(f"{type(value).__name__}:{sorted(_value_digest(v, depth + 1) for v in value)}".encode())
    elif isinstance(value, dict):
        h.update(f"dict:{len(value)}".encode())
        for k, v in sorted(value.items(), key=lambda kv: _value_digest(kv[0], depth + 1)):
            _feed_value(h, k, depth + 1)
            _feed_value(h, v, depth + 1)
    elif isinstance(value, types.CodeType):
        _feed_code(h, value)
    elif isinstance(value, types.ModuleType):
        h.update(f"module:{value.__name__}".encode())
    elif not isinstance(value, os.PathLike) and (pixels := image_digest(value)) is not None:  # a PIL image
        h.update(f"image:{pixels}".encode())
    elif callable(value):
        _feed_callable(h, value, depth + 1)
    else:
        h.update(f"object:{_name(value)}:{_stable_repr(value)}".encode())


def _value_digest(value: Any, depth: int) -> str:
    h = hashlib.sha1()
    _feed_value(h, value, depth)
    return h.hexdigest()


def _feed_state(h: Any, obj: Any, depth: int) -> None:
    """An object a callable carries (a callable instance, a bound method's ``self``): its ``repr``, or its
    attributes where the ``repr`` shows a memory address."""
    if isinstance(obj, nn.Module):
        h.update(f"module:{model_digest(obj)}:{_stable_repr(obj)}".encode())
        return
    text = _stable_repr(obj)
    h.update(f"state:{_name(obj)}:{text}".encode())
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return
    if text is None:
        _feed_value(h, dict(attrs), depth + 1)
        return
    for key in sorted(attrs):  # a stable repr can still hide code: torchvision's Lambda prints "Lambda()"
        if _holds_code(attrs[key]):
            h.update(f"attr:{key}".encode())
            _feed_value(h, attrs[key], depth + 1)


def _holds_code(value: Any) -> bool:
    """A callable other than a class (a function, a transform), or a list or tuple holding one."""
    if isinstance(value, (list, tuple)):
        return any(_holds_code(v) for v in value)
    return callable(value) and not isinstance(value, type)


def _feed_callable(h: Any, fn: Any, depth: int) -> None:
    if depth > _DEPTH:
        h.update(f"deep:{_name(fn)}".encode())
        return
    if isinstance(fn, functools.partial):
        h.update(b"partial:")
        _feed_callable(h, fn.func, depth + 1)
        _feed_value(h, fn.args, depth + 1)
        _feed_value(h, fn.keywords, depth + 1)
    elif isinstance(fn, types.MethodType):
        h.update(b"method:")
        _feed_callable(h, fn.__func__, depth + 1)
        _feed_state(h, fn.__self__, depth)
    elif isinstance(fn, types.FunctionType) and id(fn) in _HASHING.get():
        h.update(f"recursion:{_name(fn)}".encode())  # met again inside itself: its code is hashed further up
    elif isinstance(fn, types.FunctionType):
        h.update(f"function:{_name(fn)}".encode())
        _feed_code(h, fn.__code__)
        _feed_value(h, fn.__defaults__, depth + 1)
        _feed_value(h, fn.__kwdefaults__, depth + 1)
        token = _HASHING.set(_HASHING.get() | {id(fn)})
        try:
            for cell in fn.__closure__ or ():
                try:
                    content = cell.cell_contents
                except ValueError:  # a cell not yet filled
                    h.update(b"cell:empty")
                    continue
                _feed_value(h, content, depth + 1)
            for name in sorted(_global_names(fn.__code__) & fn.__globals__.keys()):  # builtins are not in there
                h.update(f"global:{name}".encode())
                _feed_value(h, fn.__globals__[name], depth + 1)
        finally:
            _HASHING.reset(token)
    elif isinstance(fn, (type, types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                         types.MethodWrapperType, types.ClassMethodDescriptorType)):
        h.update(f"builtin:{_name(fn)}".encode())  # torch.argmax, a class: by name (no Python code to hash)
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):  # a tensor's bound method
            _feed_value(h, owner, depth + 1)
    else:  # a callable object: an nn.Module, a transform, an instance of a class with __call__
        h.update(f"object:{_name(fn)}".encode())
        call = type(fn).__call__
        if isinstance(call, types.FunctionType) and not isinstance(fn, nn.Module):
            _feed_callable(h, call, depth + 1)
        _feed_state(h, fn, depth)


def callable_digest(fn: Any) -> str:
    """A hex digest of what ``fn`` computes: its qualified name, code, defaults, closure and the values of the globals
    it reads (see the module docstring); equal in every process for the same source, and different for two lambdas
    or closures that differ in a constant, a captured value or the value of a global they read."""
    h = hashlib.sha1(b"callable:")
    _feed_callable(h, fn, 0)
    return h.hexdigest()[:16]


def _feed_items(h: Any, src: Any, n: int, resumed_by: str) -> None:
    """The values of items 0, n // 2 and n - 1 of a map-style dataset vitviz cannot otherwise identify; item 0 is
    read twice, and a dataset that gives it other values the second time is refused (module docstring)."""
    picks = sorted({0, n // 2, n - 1})
    with kept_rng():  # loading items for a digest must not change the run's draws
        first = _value_digest(src[0], 0)
        if _value_digest(src[0], 0) != first:
            argument = resumed_by.partition("=")[0]
            raise CheckpointError(
                f"{resumed_by}: the Dataset {type(src).__qualname__} gives its item 0 other values each time it is "
                "read (a random transform, e.g. RandomResizedCrop or RandomHorizontalFlip?), so vitviz cannot tell "
                "its images from another dataset's and a run on it cannot be resumed to the same result; give the "
                f"dataset a deterministic transform (e.g. Resize and CenterCrop), or run without {argument}=")
        digests = [first, *(_value_digest(src[i], 0) for i in picks[1:])]
    h.update(f"items:{picks}:{digests}".encode())


def _loader_order(loader: Any, sampler: Any) -> list[int] | None:
    """The dataset positions a ``DataLoader`` with a sampler of fixed order reads, in order (its batch sampler's
    batches joined: the batch size counts only where ``drop_last`` drops a tail); ``None`` for any other sampler
    (a shuffling one is not drawn from: that would move the run's random generators)."""
    from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

    from vitviz.core.loader_order import ShardSampler

    fixed = isinstance(sampler, (SequentialSampler, ShardSampler)) or (
        isinstance(sampler, DistributedSampler) and not sampler.shuffle)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not fixed or (batch_sampler is not None and type(batch_sampler) is not BatchSampler):
        return None
    if batch_sampler is None:
        return [int(i) for i in sampler]
    return [int(i) for batch in batch_sampler for i in batch]


def _relative(path: Path, root: Path | None) -> str:
    """``path`` relative to ``root`` where it lies under it (POSIX separators), else as given."""
    if root is not None:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    return str(path)


def _feed_source(h: Any, src: Any, resumed_by: str, depth: int = 0) -> None:
    from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset, default_collate

    if depth > 8:  # a wrapper of a wrapper of ...: its class is all we say
        h.update(type(src).__qualname__.encode())
        return
    if isinstance(src, (str, os.PathLike)):  # by its files relative to it: a folder moved elsewhere is the same
        root = Path(src)
        h.update(b"folder:")
        for p in sorted(q for q in root.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(root)}:{file_key(p)}".encode())
        return
    h.update(type(src).__qualname__.encode())
    if isinstance(src, DataLoader):
        from vitviz.core.loader_order import loader_sampler

        sampler = loader_sampler(src)
        h.update(f"sampler:{type(sampler).__qualname__}".encode())
        order = _loader_order(src, sampler)
        if order is not None:  # which items it reads: a DistributedSampler's rank, a drop_last's dropped tail
            h.update(f"order:{len(order)}".encode() + np.asarray(order, dtype=np.int64).tobytes())
        collate = getattr(src, "collate_fn", None)  # a collate_fn may change the images (normalise, resize)
        if collate is not None and collate is not default_collate:
            h.update(b"collate_fn:")
            _feed_callable(h, collate, 0)
        _feed_source(h, src.dataset, resumed_by, depth + 1)
        return
    if isinstance(src, Subset):
        h.update(np.asarray(list(src.indices), dtype=np.int64).tobytes())
        _feed_source(h, src.dataset, resumed_by, depth + 1)
        return
    if isinstance(src, TensorDataset):
        for t in src.tensors:
            _feed_tensor(h, t)
        return
    files = getattr(src, "files", None) or getattr(src, "samples", None)
    root = getattr(src, "root", None)
    known = isinstance(files, (list, tuple)) and bool(files)  # what the dataset holds, read without an image
    if known:  # vitviz's and torchvision's image folders: each file relative to the root (a moved folder is the same)
        base = Path(root) if isinstance(root, (str, os.PathLike)) else None
        for item in files:
            p = Path(item[0] if isinstance(item, (tuple, list)) else item)
            rest = list(item[1:]) if isinstance(item, (tuple, list)) else []  # the label of (path, label)
            h.update(f"{_relative(p, base)}:{file_key(p)}:{rest}".encode())
    elif root is not None:
        h.update(f"root:{root}".encode())
    for attr in ("data", "targets", "labels"):  # torchvision's in-memory datasets (CIFAR, MNIST)
        value = getattr(src, attr, None)
        if isinstance(value, torch.Tensor):
            _feed_tensor(h, value)
        elif isinstance(value, np.ndarray):
            h.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], (int, np.integer)):
            h.update(np.asarray(value, dtype=np.int64).tobytes())
        else:
            continue
        known = known or attr == "data"
    try:
        n = len(src)
    except TypeError:
        n = None
    h.update(f"len:{n if n is not None else '?'}".encode())
    transform = getattr(src, "transform", None)
    if transform is not None:  # by what it computes (a Lambda's function included), never by a memory address
        _feed_callable(h, transform, 0)
    target_transform = getattr(src, "target_transform", None)  # torchvision's datasets map their labels by it
    if target_transform is not None:
        h.update(b"target_transform:")
        _feed_callable(h, target_transform, 0)
    if not known and isinstance(src, Dataset):
        _feed_held(h, src)
    if not known and n and isinstance(src, Dataset) and not isinstance(src, IterableDataset):
        _feed_items(h, src, n, resumed_by)


_READ_ABOVE = frozenset({"files", "samples", "root", "data", "targets", "labels", "transform", "target_transform",
                         "transforms"})


def _feed_held(h: Any, src: Any) -> None:
    """What a ``Dataset`` of another kind holds in its own attributes, read without loading an image: every
    attribute (in name order) that is a tensor or an array of numbers or strings (by its values), a pandas table
    (every cell and the index; a column of paths also by each file's size and modification time), or a list or
    tuple of strings or paths (each by its text and, where it names a file, that file's size and modification
    time) or of integers (by value); so an image file replaced or edited anywhere in a path list, or one label
    changed, gives another digest although the three items read after this may not show it. Other attributes
    (objects, dicts, a file handle) are not read."""
    try:
        attrs = vars(src)
    except TypeError:  # __slots__: nothing of its own to read
        return
    for name in sorted(set(attrs) - _READ_ABOVE):
        value = attrs[name]
        if isinstance(value, np.ndarray) and value.dtype.kind in "SU":  # strings: by their bytes
            h.update(f"held:{name}:{value.dtype}{value.shape}:".encode() + np.ascontiguousarray(value).tobytes())
        elif isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype.kind in "biufc"):
            h.update(f"held:{name}:".encode())
            _feed_tensor(h, torch.as_tensor(value))
        elif type(value).__module__.startswith("pandas") and type(value).__name__ in ("DataFrame", "Series"):
            _feed_table(h, name, value)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, os.PathLike)) for v in value):
            h.update(f"held:{name}:".encode())
            _feed_paths(h, value)
        elif isinstance(value, (list, tuple)) and value and all(is_int(v) for v in value):
            h.update(f"held:{name}:".encode() + np.asarray(value, dtype=np.int64).tobytes())


def _feed_paths(h: Any, values: Any) -> None:
    """Strings or paths, each by its text and what ``file_key`` says of the file it names (``-1:-1``: none)."""
    for v in values:
        h.update(f"{os.fspath(v)}:{file_key(v)}\0".encode())


def _feed_table(h: Any, name: str, table: Any) -> None:
    """A pandas ``DataFrame`` or ``Series``: every cell and the index by value, and a column of paths (one whose
    first cell names a file) also by its files' sizes and modification times; a table pandas cannot hash (cells
    holding lists or dicts) is not read."""
    import pandas as pd

    try:
        cells = pd.util.hash_pandas_object(table, index=True).to_numpy().tobytes()
    except TypeError:
        return
    columns = list(table.items()) if hasattr(table, "columns") else [(table.name, table)]
    h.update(f"held:{name}:{[c for c, _ in columns]}:".encode() + cells)
    for column, values in columns:
        values = values.tolist()
        if values and all(isinstance(v, str) for v in values) and os.path.isfile(values[0]):
            h.update(f"files:{column}:".encode())
            _feed_paths(h, values)


def source_digest(source: Any, resumed_by: str = "checkpoint=") -> str:
    """A hex digest of an image source (folder, ``Dataset`` or ``DataLoader``): see the module docstring.

    ``resumed_by`` names the argument that asked for it, with its value (``"checkpoint='run.pt'"``), for the
    ``CheckpointError`` of a dataset whose items differ from read to read. A ``Dataset`` vitviz cannot identify
    without its items has three of them loaded: call this only for a run that is resumed or cached.
    """
    h = hashlib.sha1()
    _feed_source(h, source, resumed_by)
    return h.hexdigest()[:16]
