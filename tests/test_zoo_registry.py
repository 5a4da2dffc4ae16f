"""Every ViT-like architecture in timm's registry passes the conformance invariants or is refused clearly.

Marked ``zoo`` (``make test-zoo``, excluded from ``make test``): about 300 architectures built with random weights
at a small image size. Each result is appended to ``VITVIZ_ZOO_RESULTS`` (default ``reports/zoo/results.jsonl``),
from which ``python tests/zoo_registry.py table`` writes ``docs/coverage.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from zoo_registry import DEFAULT_RESULTS, append, registry_names, run_one

pytestmark = pytest.mark.zoo
RESULTS = Path(os.environ.get("VITVIZ_ZOO_RESULTS", DEFAULT_RESULTS))


@pytest.mark.parametrize("name", registry_names())
def test_registry_architecture(name):
    row = run_one(name)
    append(RESULTS, row)
    assert row["status"] != "wrong", f"{name}: {row.get('reason')}\n{row.get('trace', '')}"
    if row["status"] == "build-failed":
        pytest.skip(f"timm cannot build {name}: {row['reason']}")
