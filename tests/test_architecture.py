"""The package's layers point one way and hold no import cycle; each shared rule is written once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "vitviz"

# layer -> the layers it may import (besides itself). vitviz/__init__.py and __main__.py are the entry points and
# may import anything lazily.
ALLOWED = {
    "errors": set(),
    "core": {"errors"},
    "analysis": {"errors", "core"},
    "zoo": {"errors", "core", "analysis"},
    "plot": {"errors", "core", "analysis", "zoo", "experiments"},  # experiments: the study's statistics
    "widgets": {"errors", "core", "analysis", "zoo", "plot", "experiments"},
    "experiments": {"errors", "core", "analysis", "zoo"},
    "report": {"errors", "core", "analysis", "zoo", "plot", "widgets", "experiments"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str, top_level_only: bool) -> set[str]:
    """vitviz modules imported by ``path`` (relative imports resolved; ``from a import b`` counts ``a.b`` when
    ``a.b`` is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # also imports nested in top-level try/if blocks, but not in functions or TYPE_CHECKING
        nodes = [n for stmt in tree.body if not (isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test))
                 for n in ([stmt] if not isinstance(stmt, (ast.Try, ast.If)) else list(ast.walk(stmt)))]
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vitviz")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("vitviz"):
                continue
            found.add(target)
            for a in node.names:
                cand = f"{target}.{a.name}"
                if (PKG.parent / cand.replace(".", "/")).with_suffix(".py").exists() or \
                        (PKG.parent / cand.replace(".", "/") / "__init__.py").exists():
                    found.add(cand)
    return found


def graph(top_level_only: bool) -> dict[str, set[str]]:
    mods = {module_name(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in imports_of(p, m, top_level_only) if i in mods and i != m} for m, p in mods.items()}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] not in ("__main__",) else None


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_cycle_at_module_level():
    assert find_cycle(graph(top_level_only=True)) is None, f"import cycle: {find_cycle(graph(True))}"


def test_no_cycle_between_modules_even_through_lazy_imports():
    """Imports inside functions count too: a lazy import that closes a loop is still a cycle between modules.
    Parent packages are left out (a package's ``__init__`` re-exporting its children is not a loop)."""
    g = graph(top_level_only=False)
    g = {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in g.items()}
    assert find_cycle(g) is None, f"import cycle: {' -> '.join(find_cycle(g))}"


def test_layers_import_only_downwards():
    bad = []
    for m, deps in graph(top_level_only=False).items():
        src = layer(m)
        if src is None or src not in ALLOWED:
            continue
        for d in deps:
            dst = layer(d)
            if dst and dst != src and dst not in ALLOWED[src]:
                bad.append(f"{m} -> {d} ({src} may import only {sorted(ALLOWED[src]) or 'nothing'})")
    assert not bad, "layer violations:\n" + "\n".join(sorted(bad))


def test_every_subpackage_is_a_known_layer():
    layers = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    layers |= {p.stem for p in PKG.glob("*.py") if not p.stem.startswith("__")}
    assert layers == set(ALLOWED), f"unknown or missing layers: {layers ^ set(ALLOWED)}"


def test_the_cycle_detector_finds_a_planted_cycle():
    g = graph(top_level_only=True)
    g["vitviz.core.spec"] = g["vitviz.core.spec"] | {"vitviz.analysis.rollout"}
    assert find_cycle(g) is not None


def test_error_classes_are_defined_in_one_module():
    defined = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases):
                defined.append((module_name(p), node.name))
    assert {m for m, _ in defined} == {"vitviz.errors"}, defined


@pytest.mark.parametrize("rule", ["def pair(", "def _pair(", "def grid_for_input("])
def test_shared_rules_are_written_once(rule):
    hits = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if rule in p.read_text()]
    expected = 0 if rule == "def _pair(" else 1
    assert len(hits) == expected, hits


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["study", "--help"], ["report", "--help"],
                                  ["models", "--help"], ["inspect", "--help"]])
def test_cli_help_imports_no_torch(argv):
    """``vitviz ... --help`` answers without importing torch, timm or matplotlib (bench/import_time.py times it)."""
    import subprocess
    import sys

    code = (f"import sys\nfrom vitviz.__main__ import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'timm', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
    assert "usage:" in out.stdout


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(path: Path, module: str) -> list[str]:
    """``from vitviz.x import _name``, ``import vitviz.x._y`` and ``x._name`` on an imported vitviz module, where
    the private name belongs to another module (a private module, ``_render``, may be used inside its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    bad: list[str] = []
    aliases: dict[str, str] = {}  # local name -> vitviz module it is bound to

    def check(dotted: str, line: int) -> None:
        parts = dotted.split(".")
        for k, part in enumerate(parts):
            if _private(part):
                owner = ".".join(parts[:k])  # the module (or package) the private name belongs to
                if not (module == owner or module.startswith(owner + ".")):
                    bad.append(f"{module}:{line} uses {dotted}")
                return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("vitviz"):
                    check(a.name, node.lineno)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "vitviz"
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if not target.startswith("vitviz"):
                continue
            for a in node.names:
                full = f"{target}.{a.name}"
                check(full, node.lineno)
                is_module = (PKG.parent / full.replace(".", "/")).with_suffix(".py").exists() or \
                    (PKG.parent / full.replace(".", "/") / "__init__.py").exists()
                if is_module:
                    aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and _private(node.attr):
            check(f"{aliases[node.value.id]}.{node.attr}", node.lineno)
    return bad


def test_no_module_uses_another_modules_private_names():
    bad = [b for p in sorted(PKG.rglob("*.py")) for b in private_imports(p, module_name(p))]
    assert not bad, "private names used across modules (make them public where they belong):\n" + "\n".join(bad)


def test_the_private_name_scan_finds_a_planted_import(tmp_path):
    planted = PKG / "analysis" / "explain.py"
    probe = tmp_path / "explain.py"
    probe.write_text(planted.read_text() + "\nfrom vitviz.analysis.rollout import _hidden\n"
                     "from vitviz.core.families import timm_probes\nx = timm_probes._PROBES\n")
    found = private_imports(probe, "vitviz.analysis.explain")
    assert len(found) == 2 and "_hidden" in found[0] and "_PROBES" in found[1]
    assert not private_imports(PKG / "widgets" / "attention.py", "vitviz.widgets.attention")  # _render: same package
