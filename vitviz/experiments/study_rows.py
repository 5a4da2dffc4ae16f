"""What a study row depends on besides its ``run_id``, and the refusals of a table that mixes studies.

A row of ``vitviz.experiments.study`` is one finished training run. Its ``run_id`` names the family, size, epochs,
training subset and seed; the result also depends on the batch size, the test subset, the rest of the recipe and on
the images themselves. ``row_settings`` records them in the row (``SETTINGS``); ``check_rows`` refuses to continue a
results table whose rows were computed otherwise than the runs now planned, ``check_mergeable`` to merge parts of
different studies. The data count by value (``vitviz.experiments.data.split_fingerprint``), never by their path:
parts of one study computed on several machines, with the data in other folders, still merge and resume.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from vitviz.errors import InputError
from vitviz.experiments.config import RUNTIME_KEYS, TrainConfig
from vitviz.experiments.data import fingerprint_digest, load_split, split_fingerprint

SETTINGS = ("batch_size", "test_subset", "recipe_digest", "train_data", "test_data")
"""The columns that say what a row's result depends on besides its ``run_id``."""
STUDY_WIDE = ("batch_size", "test_subset", "test_data")
"""The settings every row of one study shares (the training data differ between subset and whole-set budgets)."""
DIGESTS = ("recipe_digest", "train_data", "test_data")
"""The columns of hex digests (read back as strings: ``"1e45"`` is not a number)."""


def row_settings(tc: TrainConfig, fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SETTINGS`` of the run ``tc`` on the data ``fingerprint`` (``{"train": ..., "test": ...}``,
    ``split_fingerprint``): the recipe digest covers every ``TrainConfig`` field that changes the numbers (all but
    ``vitviz.experiments.config.RUNTIME_KEYS``, the epochs kept: paths, device, threads and compilation do not count)."""
    recipe = {k: v for k, v in asdict(tc).items() if k not in RUNTIME_KEYS or k == "epochs"}
    return {"batch_size": tc.batch_size, "test_subset": tc.test_subset,
            "recipe_digest": hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16],
            "train_data": fingerprint_digest(fingerprint["train"]), "test_data": fingerprint_digest(fingerprint["test"])}


def setting_value(value: Any) -> Any:
    """A setting as a CSV cell gives it back: ``None`` for an empty cell, an integral float as an int."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _recorded(row: pd.Series) -> bool:
    return all(c in row and setting_value(row[c]) is not None for c in DIGESTS)


def check_rows(table: pd.DataFrame, configs: Mapping[str, TrainConfig], results: str, out: Path) -> None:
    """Refuse to continue the results table ``table`` (of the file ``results``) when a row was computed with other
    settings or data than the planned runs ``configs`` (``run_id`` to ``TrainConfig``).

    A planned run's row must match it in every ``SETTINGS`` column, any other row in the ``STUDY_WIDE`` ones (one
    table is one study: its seeds are pooled). ``InputError`` otherwise, naming the row, what differs, and the fix:
    another ``--results`` and ``--out``, or the row deleted with its run folder to compute it again. Refused rather
    than recomputed: the row's run folder (under ``out``) holds the old run's checkpoint, which a recomputation would
    have to delete.

    Rows written before vitviz recorded their settings have none: their ``train_images`` and ``test_images`` are
    checked against the data (a test subset changes them), and a ``UserWarning`` names the file and says their batch
    size, recipe and images could not be checked. The data are loaded (from the decoded cache) once per split and
    subset.
    """
    if not len(table) or not configs:
        return
    splits: dict[tuple[str, int | None], tuple[int, dict[str, Any]]] = {}

    def split(tc: TrainConfig, name: str) -> tuple[int, dict[str, Any]]:
        subset = tc.train_subset if name == "train" else tc.test_subset
        if (name, subset) not in splits:
            data = load_split(tc, name, subset)
            splits[name, subset] = len(data), split_fingerprint(data)
        return splits[name, subset]

    any_run = next(iter(configs.values()))
    legacy = 0
    for _, row in table.iterrows():
        tc = configs.get(row["run_id"])
        planned = tc is not None
        tc = tc or any_run
        if _recorded(row):
            fingerprint = {name: split(tc, name)[1] for name in ("train", "test")}
            want = row_settings(tc, fingerprint)
            what = "; ".join(f"{c}: row {setting_value(row[c])!r}, now {want[c]!r}"
                             for c in (SETTINGS if planned else STUDY_WIDE) if setting_value(row[c]) != want[c])
        else:
            legacy += 1
            counts = {"test_images": split(tc, "test")[0], **({"train_images": split(tc, "train")[0]} if planned else {})}
            what = "; ".join(f"{c}: row {setting_value(row.get(c))!r}, now {n}"
                             for c, n in counts.items() if setting_value(row.get(c)) != n)
        if what:
            raise InputError(
                f"{results}: row {row['run_id']} was computed with other settings or data than this study's "
                f"({what}), so it is not this study's result. Write this study to another results file and run "
                f"folder (--results, --out), or delete the row and its run folder ({out / row['run_id']}) to "
                "compute it again")
    if legacy:
        warnings.warn(f"{results}: {legacy} rows were written before vitviz recorded a row's settings and data; "
                      "their image counts match this study's, but their batch size, recipe and images could not be "
                      "checked: they are kept as this study's", stacklevel=3)


def check_mergeable(table: pd.DataFrame) -> None:
    """Refuse rows (each with its file in ``_part``) that cannot belong to one study: two of one ``run_id`` that
    differ in a ``SETTINGS`` column, or any two that differ in a ``STUDY_WIDE`` one; rows without recorded
    settings are not compared."""
    if not all(c in table for c in SETTINGS):
        return
    rows = table[table["recipe_digest"].notna()]
    for column in STUDY_WIDE:
        values = rows[column].map(setting_value).astype(object)
        if values.nunique(dropna=False) > 1:
            found = rows.assign(_v=values).groupby("_v", dropna=False)["_part"].first()
            raise InputError(f"cannot merge study results computed with other {column}: "
                             + ", ".join(f"{v!r} in {part}" for v, part in found.items())
                             + "; merge only parts of one study (same --test-subset, --batch-size and data)")
    for run, same in rows.groupby("run_id"):
        for column in SETTINGS:
            if same[column].map(setting_value).astype(object).nunique(dropna=False) > 1:
                raise InputError(f"cannot merge study results: run {run} has other {column} in "
                                 f"{' and '.join(dict.fromkeys(same['_part']))}; its two results are not of one run")
