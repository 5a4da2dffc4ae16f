"""Resuming ``vitviz.faithfulness(out=...)``: the CSV of rows, its fingerprint, and the round trip of image ids.

``out`` holds the rows written so far; ``<out>.json`` beside it holds the fingerprint of the run that wrote them:
every argument the rows depend on (methods, modes, steps, removal, fill, seed, target, labels, method options,
autocast; a callable by ``callable_digest``: its code, defaults, closure and globals, not its name alone),
``model_digest(model)``, ``readout_digest(model)`` (the settings besides the weights: the same tensors pooled
another way score otherwise) and, for a folder, ``Dataset`` or ``DataLoader``, ``source_digest(images)``
(``vitviz.core.digest``). A rerun continues only from a file whose fingerprint equals its own; any other file (another
seed, target, model, data set, a file without a fingerprint, or one written by a vitviz whose rows had other columns)
is refused with a ``CheckpointError`` that names the differing keys, rather than mixed in. Tensor and list inputs are
digested image by image instead (``image_digests``: each image's values, or a path's size and modification time), so
a rerun may pass more images than the run it continues (a data set processed in chunks), but an id whose rows ``out``
holds must still name the same pixels: a rerun that gives such an id other pixels is refused, never answered from the
old rows; a rerun that gives pixels ``out`` holds under a new id is warned that they count twice. Per-image ``labels=``
and ``target=`` (one class index per image) are kept the same way, id by id (``class_ids``), so a chunked run may
give the new images their own labels, but an id whose rows ``out`` holds must keep the class it was scored with: a
rerun that gives it another is refused, never answered from rows scored against the old one. A data set's images
are numbered by ``image_offset`` or ``image_ids``, which its fingerprint holds (``ids_key``): the same data set
numbered otherwise is refused. The rows keep the order of the run that wrote them, so a rerun given the same methods
or modes in another order (which the fingerprint, holding them as a set, lets pass) is refused too (``check_rows``):
its table would equal no fresh run's.

The rows themselves are checked too (``check_rows``): vitviz writes ``out`` atomically, but a file cut off or edited
by another program (an interrupted copy, a hand edit) may lack rows of an image, or hold values no run writes; such a
file is refused with a ``CheckpointError`` naming what is wrong, never continued as if those images were done.

Image ids and method names are read back as the strings they were written as and mapped to the ids of the current
run, so an id ``"001"`` stays ``"001"`` (not the number 1) and a resumed run returns the same frame as an
uninterrupted one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.digest import (
    callable_digest,
    image_digest,
    model_digest,
    readout_digest,
    source_digest,
    tensor_digest,
)
from vitviz.core.images import image_list
from vitviz.core.io import atomic_write_json, read_csv_exact
from vitviz.core.util import is_int
from vitviz.errors import CheckpointError, ImageInputError, InputError, InputTypeError

# the fingerprint holds COLUMNS: a file written before a column was added (e.g. "removed", the fraction of patches
# actually removed) is refused by ``resume`` rather than continued with rows of two layouts
COLUMNS = ["image", "method", "mode", "fraction", "removed", "score", "metric", "removal"]
TEXT = ("image", "method", "mode", "metric", "removal")
# the arguments given one class index per image, kept id by id in the fingerprint file under "<name>_by_image"
PER_IMAGE = ("target", "labels")


@dataclass(frozen=True)
class Layout:
    """The rows a run writes for every image: one per method, mode and step, each with the metric its mode scores
    and the run's removal (``faithfulness`` builds it as ``_batch`` writes the rows; ``check_rows`` holds a file to
    it)."""

    methods: tuple[str, ...]
    modes: tuple[str, ...]
    fractions: tuple[float, ...]
    removal: str
    metrics: Mapping[str, str]  # mode -> the metric its rows hold

    @property
    def rows_per_image(self) -> int:
        return len(self.methods) * len(self.modes) * len(self.fractions)

    @property
    def distinct_per_image(self) -> int:
        """The distinct (method, mode, step) rows of an image (fewer than ``rows_per_image`` where ``modes``
        repeats a mode, whose rows the run writes twice)."""
        return len(set(self.methods)) * len(set(self.modes)) * len(self.fractions)


def sidecar(out: str | os.PathLike) -> Path:
    """The fingerprint file of ``out``: ``<out>.json``."""
    return Path(f"{os.fspath(out)}.json")


def check_out(out: Any) -> None:
    """Refuse an ``out=`` that is not the path of a file: another type, or an existing folder (the rows go to the
    CSV file ``out``, its fingerprint to ``<out>.json`` beside it)."""
    if out is None:
        return
    if not isinstance(out, (str, os.PathLike)):
        raise InputTypeError(f"out={out!r} is a {type(out).__name__}, not a file path; pass the path of a CSV file "
                             "the rows are written to, e.g. out='faithfulness.csv', or None")
    if os.path.isdir(out):
        raise InputError(f"out={str(out)!r} is a folder; out= must be a file path, the CSV file the rows are written "
                         f"to, not a folder: pass e.g. out={str(Path(out) / 'faithfulness.csv')!r}")


def _describe(value: Any, per_image: torch.Tensor | None) -> Any:
    """A JSON value that tells a target / labels argument apart from any other; one class index per image is
    ``"per-image"`` here, its values kept id by id (``class_ids``), so a chunked run may add images."""
    if per_image is not None:
        return "per-image"
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if callable(value):
        return _callable(value)
    return f"value:{tensor_digest(value)}"


def _callable(fn: Any) -> str:
    """A callable by its name (for the error message) and ``callable_digest`` (its code, defaults, closure and the
    values of the globals it reads: two lambdas, closures over other values, or one lambda over another global,
    differ)."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    return f"callable:{name}:{callable_digest(fn)}"


def _method(m: Any) -> str:
    if isinstance(m, str):
        return f"explain:{m}"
    if isinstance(m, torch.Tensor):
        return f"maps:{tensor_digest(m.float())}"
    return _callable(m)


def _option(value: Any) -> str:
    """A method option JSON cannot hold: a callable by ``_callable``, a tensor or array by its values (its repr
    elides them), anything else by its repr."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"value:{tensor_digest(value)}"
    return _callable(value) if callable(value) else repr(value)


def fingerprint(model: nn.Module, images: Any, dataset: bool, table: Mapping[str, Any], modes: Sequence[str],
                steps: float, how: str, fill: torch.Tensor | None, seed: int, target: Any,
                target_all: torch.Tensor | None, labels: Any, labels_all: torch.Tensor | None,
                options: Mapping[str, Any], amp: torch.dtype | None, out: Any = None,
                ids: Any = None) -> dict[str, Any]:
    """Everything the rows of a ``faithfulness`` run depend on, as a JSON-ready dict (see the module docstring);
    ``out`` is named in the error of a data set that cannot be resumed (``source_digest``). ``ids`` says which id
    each image of a data set gets (``ids_key``): the same data set numbered otherwise would score every image again
    under new ids, each image counted twice in the table."""
    fp = {"format": 1, "columns": COLUMNS, "methods": {k: _method(v) for k, v in table.items()},
          "modes": sorted(modes), "steps": float(steps), "removal": how,
          "fill": None if fill is None else [float(v) for v in fill.reshape(-1)], "seed": int(seed),
          "target": _describe(target, target_all), "labels": _describe(labels, labels_all),
          "method_options": json.loads(json.dumps(options, sort_keys=True, default=_option)),
          "autocast": None if amp is None else str(amp), "model": model_digest(model),
          "readout": readout_digest(model),
          "images": source_digest(images, f"out={str(out)!r}") if dataset else None}
    if dataset:  # (tensor inputs are known id by id, by their pixels)
        fp["image_ids"] = ids
    return json.loads(json.dumps(fp))  # tuples become lists, as they come back from the file


def ids_key(image_ids: Sequence[Hashable] | None, image_offset: int) -> int | str:
    """How a data set's images are numbered, for the fingerprint: the offset, or a digest of the ids as text."""
    if image_ids is None:
        return int(image_offset)
    import hashlib

    return "ids:" + hashlib.sha1(json.dumps([str(i) for i in image_ids]).encode()).hexdigest()[:16]


def image_digests(images: Any, image_id: Callable[[int], Hashable], total: int | None) -> dict[str, str]:
    """``{str(id): digest}`` for the images of a tensor or list input (empty where the items are not images
    vitviz can digest, or cannot be counted)."""
    try:
        items = list(image_list(images))
    except ImageInputError:  # the run refuses it with this message; nothing to digest
        return {}
    if total is None or len(items) != total:
        return {}
    digests = {str(image_id(p)): image_digest(item) for p, item in enumerate(items)}
    return {k: v for k, v in digests.items() if v is not None}


def class_ids(values: torch.Tensor | None, image_id: Callable[[int], Hashable],
              name: str = "values") -> dict[str, int] | None:
    """``{str(id): class}`` for a per-image ``target=`` or ``labels=`` (``None`` for any other kind, which the
    fingerprint holds whole); ``name`` names the argument where it holds more values than ``image_ids`` ids (an
    iterable data set, whose images are not counted up front)."""
    if values is None:
        return None
    out = {}
    for p, v in enumerate(values.reshape(-1).to(torch.int64).tolist()):
        try:
            out[str(image_id(p))] = int(v)
        except InputError:  # past the last of image_ids
            raise InputError(f"{name} holds {len(values)} class indices but image_ids holds fewer ids ({p}); give "
                             "one of each per image") from None
    return out


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def resume(out: str | os.PathLike | None, fp: dict[str, Any] | None,
           restore: Callable[[str], Hashable], pixels: Mapping[str, str] | None = None,
           layout: Layout | None = None,
           classes: Mapping[str, Mapping[str, int] | None] | None = None) -> Any:
    """The rows ``out`` holds (``None`` when there is no file), refused with a ``CheckpointError`` unless the
    fingerprint beside it equals ``fp``, its rows are every image's complete ``layout`` (``check_rows``), every id
    with rows there has the same ``pixels`` digest now (when both runs digested it) and the same class in each
    per-image argument of ``classes`` (``{"labels": {id: class}, "target": ...}``, ``class_ids``); image ids are
    mapped back with ``restore``. The fingerprint file keeps the digests and classes of every image either run was
    given."""
    pixels = dict(pixels or {})
    given = {name: dict(ids) for name, ids in (classes or {}).items() if ids is not None}
    if out is None:
        return None
    if not os.path.exists(out):
        atomic_write_json(sidecar(out), {**(fp or {}), "pixels": pixels,
                                         **{f"{name}_by_image": ids for name, ids in given.items()}})
        return None
    advice = f"delete {str(out)!r} (and {str(sidecar(out))!r}) to start over, or pass another out="
    if not sidecar(out).exists():
        raise CheckpointError(f"out={str(out)!r} has no fingerprint file {str(sidecar(out))!r} (written by an older "
                              "vitviz or another program), so vitviz cannot tell whether its rows belong to this run; "
                              + advice)
    try:
        saved = json.loads(sidecar(out).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"out={str(out)!r}: its fingerprint {str(sidecar(out))!r} cannot be read ({exc}); "
                              + advice) from exc
    saved_pixels = saved.pop("pixels", {}) if isinstance(saved, dict) else {}
    saved_classes = {name: saved.pop(f"{name}_by_image", None) for name in PER_IMAGE} if isinstance(saved, dict) \
        else {}
    columns = saved.get("columns") if isinstance(saved, dict) else None
    if fp is not None and isinstance(columns, list) and columns != fp.get("columns"):
        lacks = [c for c in fp["columns"] if c not in columns]
        why = (" ('removed': the fraction of patches actually removed at each step, the x of the AUC and of the "
               "figure)") if "removed" in lacks else ""
        raise CheckpointError(f"out={str(out)!r} was written by another version of vitviz: its rows have the columns "
                              f"{columns}, this version writes {fp['columns']}"
                              + (f", it lacks {lacks}" if lacks else "")
                              + f"{why}; this run cannot continue it: " + advice)
    if saved != fp:
        keys = sorted(k for k in set(fp) | set(saved) if fp.get(k) != saved.get(k))
        diff = "; ".join(f"{k}: {_show(saved.get(k))} there, {_show(fp.get(k))} now" for k in keys)
        raise CheckpointError(f"out={str(out)!r} holds another run (differs in {', '.join(keys)}: {diff}); "
                              + advice)
    # read_csv_exact: a resumed frame must equal an uninterrupted one to the bit
    try:
        prev = read_csv_exact(out, dtype={c: str for c in TEXT}, keep_default_na=False,
                              na_values={"score": ["", "nan", "NaN"]})
    except (OSError, ValueError) as exc:  # pandas' ParserError and EmptyDataError are ValueErrors
        raise CheckpointError(f"out={str(out)!r} cannot be read as a vitviz.faithfulness table ({str(exc).strip()}); the file "
                              "was cut off or edited by another program (vitviz writes it whole); " + advice) from exc
    if list(prev.columns) != COLUMNS:
        raise CheckpointError(f"out={str(out)!r} is not a vitviz.faithfulness table (columns {list(prev.columns)}); "
                              + advice)
    if layout is not None:
        check_rows(prev, out, layout, advice)
    other = sorted({i for i in prev["image"] if i in pixels and i in saved_pixels and pixels[i] != saved_pixels[i]})
    if other:
        raise CheckpointError(f"out={str(out)!r} holds rows for image id(s) {other[:5]} computed on other pixels than "
                              "the images given now with those ids (another batch numbered from the same ids?); "
                              "give the new images ids of their own (image_offset= or image_ids=), or " + advice)
    written = {str(i) for i in prev["image"]}
    for name, now in given.items():
        _check_classes(out, name, written, now, saved_classes.get(name), advice)
    known = {saved_pixels[i]: i for i in written if i in saved_pixels}
    twice = sorted((i, known[d]) for i, d in pixels.items() if i not in saved_pixels and d in known)
    if twice:
        warnings.warn(f"out={str(out)!r} holds rows for the same pixels as image id(s) "
                      f"{', '.join(f'{new!r} (as {old!r})' for new, old in twice[:5])}: those images are scored again "
                      "under a new id and count twice in the table; give them the ids they have there, or leave "
                      "them out", stacklevel=3)
    grown = {name: {**(saved_classes.get(name) or {}), **now} for name, now in given.items()}
    if (pixels and any(saved_pixels.get(k) != v for k, v in pixels.items())) or any(
            grown[name] != saved_classes.get(name) for name in grown):
        atomic_write_json(sidecar(out), {**fp, "pixels": {**saved_pixels, **pixels},
                                         **{f"{name}_by_image": ids for name, ids in grown.items()}})
    prev["image"] = [restore(s) for s in prev["image"]]
    return prev


def _check_classes(out: Any, name: str, written: set[str], now: Mapping[str, int], saved: Any,
                   advice: str) -> None:
    """Refuse a rerun that gives an image id whose rows ``out`` holds another class in the per-image argument
    ``name`` (``labels`` or ``target``) than its rows were scored with, or whose class the file does not record."""
    saved = saved if isinstance(saved, dict) else {}
    unknown = sorted(i for i in written if i in now and i not in saved)
    if unknown:
        raise CheckpointError(f"out={str(out)!r} holds rows for image id(s) {unknown[:5]} but its fingerprint "
                              f"{str(sidecar(out))!r} does not record the per-image {name}= they were scored with, so "
                              f"vitviz cannot tell whether the {name} given now are theirs; " + advice)
    other = sorted(i for i in written if i in now and saved[i] != now[i])
    if other:
        shown = ", ".join(f"{i!r}: {saved[i]} there, {now[i]} now" for i in other[:5])
        raise CheckpointError(f"out={str(out)!r} holds rows for image id(s) {other[:5]} scored with other per-image "
                              f"{name}= than given now ({shown}); a resumed run cannot mix results of two {name} for "
                              f"one image: give those images the {name} they were scored with (a chunked run keeps "
                              "the classes of the images already written), or new ids of their own (image_offset= or "
                              "image_ids=), or " + advice)


def _line(prev: Any, where: Any) -> int:
    """The line of the file (1: the header) of the first row ``where`` is true."""
    return int(np.flatnonzero(np.asarray(where))[0]) + 2


def check_rows(prev: Any, out: Any, layout: Layout, advice: str) -> None:
    """Refuse rows ``out`` holds that this run would not write (``layout``): a method, mode, removal, metric or
    step it has not, a column that is not numbers, or an image without exactly one row per method, mode and step
    (a file cut off or edited by another program: vitviz writes it whole). Nothing is dropped: the file is refused
    with the line or the image ids that are wrong."""
    import pandas as pd

    where = f"out={str(out)!r}"
    damaged = "(the file was cut off or edited by another program; vitviz writes it whole)"
    blank = prev["image"] == ""
    if blank.any():
        raise CheckpointError(f"{where} has a row without an image id at line {_line(prev, blank)} {damaged}; "
                              + advice)
    for column, allowed in (("method", layout.methods), ("mode", layout.modes), ("removal", (layout.removal,))):
        bad = ~prev[column].isin(allowed)
        if bad.any():
            value = prev[column][bad].iloc[0]
            raise CheckpointError(f"{where} holds {column} {value!r} at line {_line(prev, bad)}, which this run does "
                                  f"not write (its {column}s: {list(allowed)}) {damaged}; " + advice)
    expected = prev["mode"].map(dict(layout.metrics))
    bad = prev["metric"] != expected
    if bad.any():
        first = int(np.flatnonzero(bad.to_numpy())[0])
        raise CheckpointError(f"{where} holds metric {prev['metric'].iloc[first]!r} at line {first + 2}, where this "
                              f"run writes {expected.iloc[first]!r} for mode {prev['mode'].iloc[first]!r} {damaged}; "
                              + advice)
    for column in ("fraction", "removed", "score"):
        if not pd.api.types.is_float_dtype(prev[column]) and not pd.api.types.is_integer_dtype(prev[column]):
            values = pd.to_numeric(prev[column], errors="coerce")
            bad = values.isna() & prev[column].notna()
            value = prev[column][bad].iloc[0] if bad.any() else prev[column].iloc[0]
            line = _line(prev, bad) if bad.any() else 2
            raise CheckpointError(f"{where} holds {column} {value!r} at line {line}, not a number {damaged}; "
                                  + advice)
    bad = ~prev["fraction"].isin(layout.fractions)
    if bad.any():
        raise CheckpointError(f"{where} holds fraction {float(prev['fraction'][bad].iloc[0])!r} at line {_line(prev, bad)}, "
                              f"which is not a step of this run ({list(layout.fractions)}) {damaged}; " + advice)
    bad = ~prev["removed"].between(0, 1)
    if bad.any():
        raise CheckpointError(f"{where} holds removed {float(prev['removed'][bad].iloc[0])!r} at line {_line(prev, bad)}, "
                              f"not a fraction of the patches in [0, 1] {damaged}; " + advice)
    n, unique = layout.rows_per_image, layout.distinct_per_image
    rows = prev.groupby("image", sort=False).size()
    distinct = prev.drop_duplicates(["image", "method", "mode", "fraction"]).groupby("image", sort=False).size()
    wrong = [i for i in rows.index if rows[i] != n or distinct[i] != unique]
    if wrong:
        counts = ", ".join(f"{i!r}: {rows[i]} rows" + (f" ({rows[i] - n} repeated)"
                                                       if distinct[i] == unique and rows[i] > n else "")
                           for i in wrong[:5])
        raise CheckpointError(f"{where} holds incomplete rows for image id(s) {wrong[:5]}"
                              + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
                              + f" ({counts}), where this run writes {n} per image, one per method, mode and "
                              f"step ({len(layout.methods)} x {len(layout.modes)} x {len(layout.fractions)}) "
                              f"{damaged}; " + advice)
    # the fingerprint holds the modes sorted and the methods as a dict, so another order passes it; but the rows
    # keep the order of the run that wrote them (every image has every method and mode, so their first rows show
    # it): continued in another order, the table would equal no fresh run's
    for column in ("methods", "modes"):
        written, now = list(dict.fromkeys(prev[column[:-1]])), list(getattr(layout, column))
        if written and written != now:
            raise CheckpointError(f"{where} was written with the {column} in the order {written!r}, this run gives "
                                  f"{now!r}: its rows keep the order of the run that wrote them, so the table would "
                                  f"equal no fresh run's; pass {column}= in the order {written!r} to continue it, or "
                                  + advice)


def image_id_of(image_ids: Sequence[Hashable] | None, image_offset: int,
                total: int | None) -> Callable[[int], Hashable]:
    """The id of the image at each position: ``image_offset + position``, or ``image_ids[position]``."""
    if image_ids is None:
        if not is_int(image_offset) or image_offset < 0:
            raise InputError(f"image_offset={image_offset!r} must be a non-negative int (the id of the first image)")
        return lambda p: int(image_offset) + p
    if isinstance(image_ids, (str, bytes, Mapping)) or not isinstance(image_ids, Iterable):
        raise InputTypeError(f"image_ids={image_ids!r} is a {type(image_ids).__name__}, not one id per image; pass a "
                             "list of ids (ints or strings), one per image, e.g. image_ids=[0, 1], or image_offset=")
    ids = [i.item() if isinstance(i, (np.generic, torch.Tensor)) else i for i in image_ids]
    if total is not None and len(ids) != total:
        raise InputError(f"image_ids holds {len(ids)} ids but there are {total} images; give one per image")
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InputError(f"image_ids repeats {dup!r}; every image needs its own id")
    if len({str(i) for i in ids}) != len(ids):
        dup = sorted({str(i) for i in ids if sum(str(j) == str(i) for j in ids) > 1})[0]
        raise InputError(f"image_ids holds ids that read the same as text ({dup!r} as a number and as a string), "
                         "which a CSV (out=) cannot tell apart; give every image an id of its own")
    if image_offset:
        raise InputError("pass image_ids= or image_offset=, not both")

    def of(p: int) -> Hashable:
        if p >= len(ids):  # an iterable data set, counted as its images come
            raise InputError(f"image_ids holds {len(ids)} ids but the data set yields more images; give one per "
                             "image")
        return ids[p]

    return of


def restore_ids(image_ids: Sequence[Hashable] | None, image_id: Callable[[int], Hashable],
             total: int | None) -> Callable[[str], Hashable]:
    """Maps an id read back from ``out=`` (a string) to the id this run gives the image."""
    if total is not None:
        known = {str(image_id(p)): image_id(p) for p in range(total)}
    else:  # an iterable data set: its image_ids are known, though its images are not counted
        known = {}
        for p in itertools.count() if image_ids is not None else ():
            try:
                i = image_id(p)
            except InputError:  # past the last id
                break
            known[str(i)] = i

    def restore(s: str) -> Hashable:
        if s in known:
            return known[s]
        # a number only where it was written as one ("12", not "012" or "--1": text ids of another chunk)
        if image_ids is None and re.fullmatch(r"0|-?[1-9][0-9]*", s):
            return int(s)
        return s

    return restore
