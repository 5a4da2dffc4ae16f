"""Files that travel in the wheel beside the code, found through the import system, never through the source tree.

Two folders of the repository are shipped as package data under names of their own (``setup.py`` maps them):

- ``notebooks/`` as ``vitviz.notebooks``: the five notebooks ``vitviz report`` executes;
- ``data/`` as ``vitviz.data``: the committed results of the hybrid-versus-pure study (``data/study/``).

The repository keeps one copy of each (the top-level folder users open); a wheel, an editable install and a
source install all resolve the same name with ``importlib.resources``.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Any

from vitviz.errors import DataNotFoundError, InputError

__all__ = ["SHIPPED", "shipped_dir"]

# package name -> the repository folder it is built from
SHIPPED = {"vitviz.notebooks": "notebooks", "vitviz.data": "data"}


def shipped_dir(package: str) -> Path:
    """The folder of a shipped data package (``"vitviz.notebooks"`` or ``"vitviz.data"``) on this install.

    Raises:
        VitvizError: ``package`` is not one of ``SHIPPED``, or this install lacks it (vitviz imported from a
            source folder on ``PYTHONPATH`` that was never installed: run ``pip install -e .`` there).
    """
    if package not in SHIPPED:
        raise InputError(f"package={package!r} is not shipped data; pass one of {sorted(SHIPPED)}")
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        raise DataNotFoundError(
            f"{package} (the repository's {SHIPPED[package]}/ folder) is not installed with this vitviz; install "
            "vitviz (`pip install -e .` in a checkout, or the wheel) rather than putting its folder on PYTHONPATH"
        ) from None
    return Path(str(root))


def shipped_csv(path: str | os.PathLike | None, default: str, missing: str) -> Any:
    """A results table as a DataFrame: ``path``, else ``default`` (a path under the repository's ``data/``, e.g.
    ``"data/cls_vs_gap/cls_vs_gap.csv"``) in the shipped ``vitviz.data`` package.

    Raises:
        DataNotFoundError: the file is not there; the message names it and ``missing`` (how to make it).
    """
    from vitviz.core.io import read_csv_exact

    file = Path(path) if path is not None else shipped_dir("vitviz.data") / Path(default).relative_to("data")
    if not file.is_file():
        raise DataNotFoundError(f"no results at {str(file)!r}; {missing} (or pass path=)")
    return read_csv_exact(file)  # every float to the bit (a learning rate read one ulp off is another rate)
