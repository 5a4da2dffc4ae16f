"""``docs/architecture.md`` (the documentation site's architecture page) names every module of ``vitviz/``.

A module is named by its path relative to ``vitviz/`` (``analysis/rollout.py``, ``core/families/hf_vit.py``,
``errors.py``), or, for a package's ``__init__.py`` that only re-exports (under 20 lines), by the package folder
(``analysis/``). Modules added later are found the same way, so a new module fails this test until the page
says what it is.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
SMALL_INIT = 20  # lines: an __init__.py this short only re-exports; its package folder names it


def unnamed_modules(page_text: str, package: Path = ROOT / "vitviz") -> list[str]:
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if "checkpoints" in rel or "__pycache__" in rel:
            continue
        names = [rel]
        if path.name == "__init__.py":
            names.append(rel.removesuffix("__init__.py") or "__init__.py")  # "analysis/"
            if len(path.read_text().splitlines()) >= SMALL_INIT:
                names = [rel]  # a real module: its own path
            if rel == "__init__.py":
                names = ["__init__.py"]
        if not any(n in page_text for n in names):
            missing.append(rel)
    return missing


def test_architecture_page_names_every_module():
    missing = unnamed_modules(PAGE.read_text())
    assert not missing, f"docs/architecture.md does not name {missing}; say in a line what each is"


def test_the_check_finds_an_unnamed_module(tmp_path):
    pkg = tmp_path / "vitviz"
    (pkg / "analysis").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "analysis" / "__init__.py").write_text('"""x"""\n')
    (pkg / "analysis" / "rollout.py").write_text("")
    (pkg / "analysis" / "sanity.py").write_text("")
    (pkg / "report").mkdir()
    (pkg / "report" / "__init__.py").write_text("x = 1\n" * SMALL_INIT)
    text = "`__init__.py`, analysis/: `analysis/rollout.py`; report/ renders"
    assert unnamed_modules(text, pkg) == ["analysis/sanity.py", "report/__init__.py"]
