"""Every raise in vitviz/ raises a vitviz error class (``vitviz.errors``), never a bare built-in exception.

Each vitviz class also derives from the built-in a caller expects (``InputError`` is a ``ValueError``,
``OutOfRangeError`` an ``IndexError``...), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import vitviz
import vitviz.errors as errors

ROOT = Path(vitviz.__file__).parent
BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    if isinstance(exc, ast.Name):
        return exc.id
    if isinstance(exc, ast.Attribute):
        return exc.attr
    return None


def bare_raises(root: Path = ROOT) -> list[str]:
    """``path:line name`` of every ``raise <BuiltinException>`` under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        nodes = [n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Raise)]
        for node in sorted(nodes, key=lambda n: n.lineno):
            if _raised_name(node) in BUILTIN_EXCEPTIONS:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {_raised_name(node)}")
    return found


def test_no_bare_builtin_raise_in_vitviz() -> None:
    assert bare_raises() == []


def test_the_scan_finds_a_bare_raise(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f(x):\n    if x:\n        raise ValueError('no')\n    raise KeyError(x)\n")
    assert [s.split(" ")[1] for s in bare_raises(tmp_path)] == ["ValueError", "KeyError"]


def test_every_raised_vitviz_name_is_an_error_class() -> None:
    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.VitvizError)}
    unknown = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = _raised_name(node)
                if name and name[0].isupper() and name not in classes:
                    unknown.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {name}")
    assert unknown == []


def test_no_raise_of_the_base_class() -> None:
    """Every raise names a specific class (input, model, capture, data...), never the bare base ``VitvizError``."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and _raised_name(node) == "VitvizError":
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_class_is_a_vitviz_error(name: str) -> None:
    assert issubclass(getattr(errors, name), errors.VitvizError)
