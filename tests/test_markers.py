"""Every test that executes a notebook is marked ``slow`` (``make test-fast`` leaves it out, ``make test`` runs it).

A test executes a notebook when it takes the ``run_notebook`` fixture, is marked ``notebook``, or calls
``render_report`` with notebooks other than ``()``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _marks(func: ast.FunctionDef) -> set[str]:
    names = set()
    for dec in func.decorator_list:
        node = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            names.add(node.attr)
    return names


def _runs_notebooks(func: ast.FunctionDef) -> bool:
    if "run_notebook" in {a.arg for a in func.args.args} or "notebook" in _marks(func):
        return True
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "render_report":
            kw = {k.arg: k.value for k in node.keywords}
            empty = isinstance(kw.get("notebooks"), ast.Tuple) and not kw["notebooks"].elts
            if not empty:
                return True
    return False


def notebook_tests_not_slow(folder: Path = TESTS) -> list[str]:
    found = []
    for path in sorted(folder.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and _runs_notebooks(node) \
                    and "slow" not in _marks(node):
                found.append(f"{path.relative_to(folder)}::{node.name}")
    return found


def test_every_notebook_test_is_marked_slow():
    assert not notebook_tests_not_slow(), notebook_tests_not_slow()


def test_the_scan_finds_an_unmarked_notebook_test(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.notebook\ndef test_a():\n    pass\n\n"
        "def test_b(run_notebook):\n    pass\n\n"
        "def test_c():\n    render_report('x', notebooks=())\n\n"
        "def test_d():\n    render_report('x')\n\n"
        "@pytest.mark.slow\n@pytest.mark.notebook\ndef test_e():\n    pass\n")
    assert notebook_tests_not_slow(tmp_path) == ["test_x.py::test_a", "test_x.py::test_b", "test_x.py::test_d"]
