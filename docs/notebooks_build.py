"""Execute the five notebooks with small parameters for the documentation site (run by ``conf.py``).

Each notebook runs headless (papermill, the ``python3`` kernel, the report's ``kernel_environment``) into
``docs/notebooks/<name>.ipynb``, which myst-nb renders. Small parameters (a few images, few bootstrap resamples)
keep a cold build to about a minute per notebook on a CPU; the figures are the notebooks' own, only noisier. A run
is cached: it is repeated only when the notebook, its parameters or any source file of ``vitviz/`` changed
(``<name>.key`` holds the hash), so a rebuild of unchanged sources executes nothing.

Why execute here rather than render ``make report``'s executed copies: a fresh clone has no report, and copies
from an older report could show figures the current code no longer draws. ``make report`` remains the full-size
run (the notebooks' own defaults: 128 images, 100 for the perturbation tests).

Images: ``$VITVIZ_DATA`` (a CIFAR-10 ImageFolder root, as for ``make report``); notebook 04 needs it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# notebook stem -> parameters (the docs' small run); the rest keep their offline defaults
PARAMETERS: dict[str, dict[str, Any]] = {
    "01_position_embeddings": {},
    "02_attention": {"n_images": 8},
    "03_hybrid_vs_pure": {"n_images": 8},
    "04_faithfulness": {"n_images": 12, "n_show": 3, "n_sanity": 2, "batch_size": 12, "n_boot": 100},
    "05_representations": {"n_draws": 2, "test_per_class": 10, "knn_train_per_class": 20},
}


def _key(path: Path, params: dict[str, Any]) -> str:
    h = hashlib.sha256(path.read_bytes())
    h.update(json.dumps(params, sort_keys=True).encode())
    h.update(os.environ.get("VITVIZ_DATA", "").encode())
    for src in sorted((ROOT / "vitviz").rglob("*.py")):
        h.update(src.relative_to(ROOT).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()


def execute_all(out: Path) -> list[Path]:
    """Execute every notebook of ``notebooks/`` whose cache key changed; return the executed copies.

    Raises:
        RuntimeError: a notebook failed (its cell and error are named); the docs build stops.
    """
    import time

    import papermill

    from vitviz.report.notebooks import find_notebooks, kernel_environment

    out.mkdir(parents=True, exist_ok=True)
    done = []
    for path in find_notebooks(ROOT / "notebooks"):
        params = PARAMETERS.get(path.stem, {})
        key = _key(path, params)
        executed, stamp = out / f"{path.stem}.ipynb", out / f"{path.stem}.key"
        if not (executed.is_file() and stamp.is_file() and stamp.read_text() == key):
            print(f"docs: executing {path.name} with {params or 'its defaults'}", flush=True)
            stamp.unlink(missing_ok=True)
            start = time.monotonic()
            with kernel_environment():  # papermill's error names the failing cell and stops the build
                papermill.execute_notebook(str(path), str(executed), parameters=params, kernel_name="python3",
                                           cwd=str(path.parent), progress_bar=False, execution_timeout=600)
            print(f"docs: {path.name} took {time.monotonic() - start:.0f} s", flush=True)
            stamp.write_text(key)
        done.append(executed)
    return done
