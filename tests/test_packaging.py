"""Packaging: environment.yml and pyproject.toml agree; `import vitviz` stays light; a built wheel works anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package, which pytest needs there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return {r.replace(" ", "") for r in reqs}


def conda_pip_requirements() -> tuple[set[str], list]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    return {r.replace(" ", "") for r in pip}, deps


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    pip, deps = conda_pip_requirements()
    assert pip == pyproject_requirements(), (
        f"only in pyproject: {sorted(pyproject_requirements() - pip)}; only in environment.yml: "
        f"{sorted(pip - pyproject_requirements())}"
    )
    assert "python=3.11" in deps and "pip" in deps


# extras that `make test-oldest` does not install (the browser tests, the documentation site) and a linter
NOT_IN_OLDEST = {"browser", "docs"}
LINTERS = {"ruff"}


def test_make_test_oldest_pins_every_declared_minimum():
    """Each `>=` in pyproject.toml (runtime and the extras make test-oldest installs) is pinned in
    tests/constraints-oldest.txt on its minimum's release line: `>=3.8` by 3.8.x, `>=0.4.3` by 0.4.3."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        declared += [] if extra in NOT_IN_OLDEST else reqs
    pins = {}
    for line in (ROOT / "tests" / "constraints-oldest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints-oldest.txt: {line!r} is not a pin (==)"
            pins[canonicalize_name(req.name)] = Version(spec.version)
    unpinned, off_line = [], []
    for text in declared:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name in LINTERS:
            continue
        (spec,) = [s for s in req.specifier if s.operator == ">="]
        minimum = Version(spec.version)
        if name not in pins:
            unpinned.append(text)
        elif pins[name] < minimum or pins[name].release[:len(minimum.release)] != minimum.release:
            off_line.append(f"{text} pinned at {pins[name]}")
    assert not unpinned, f"declared but not tested at the minimum (add a pin to tests/constraints-oldest.txt): {unpinned}"
    assert not off_line, f"pinned off the declared minimum's release line: {off_line}"


def test_import_is_light():
    code = (
        "import sys, vitviz; heavy = [m for m in ('torch', 'timm', 'matplotlib', 'ipywidgets', 'jupyter_client', 'IPython', "
        "'seaborn', 'pandas', 'papermill', 'transformers') if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import vitviz pulled in {out}"


def test_lazy_exports_resolve():
    import vitviz

    for name in vitviz._LAZY:
        assert callable(getattr(vitviz, name)), name
    assert set(vitviz._LAZY) <= set(dir(vitviz))
    # tab completion offers the API and the subpackages, not the module's own imports
    assert not {"Any", "annotations", "importlib", "ModuleType"} & set(dir(vitviz))
    assert {"errors", "VitvizError", "attnlrp"} <= set(dir(vitviz))


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """Build the wheel from the source tree and install it (no dependencies: the venv has them) into a scratch
    target that is not the source tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, text=True)
    (tmp / "build.log").write_text(build.stdout + build.stderr)
    wheels = list((tmp / "dist").glob("vitviz-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp / "site"),
                    str(wheels[0])], check=True, capture_output=True, text=True)
    return tmp


def test_wheel_builds_without_setuptools_warnings(installed_wheel):
    # setuptools takes every data folder with an identifier's name (zoo/checkpoints, data/study, ...) for a
    # namespace package and warns about each one not listed, some 300 lines at every install; setup.py lists them
    log = (installed_wheel / "build.log").read_text()
    assert "BuildBackendWarning" not in log and "absent from the `packages` configuration" not in log, log[-3000:]


def run_installed(site_root: Path, code: str) -> str:
    """Run ``code`` with only the installed wheel on the path (not the source tree), from an unrelated folder."""
    env = {**os.environ, "PYTHONPATH": str(site_root / "site"), "PYTHONSAFEPATH": "1"}
    env.pop("VITVIZ_CHECKPOINTS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=site_root, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_installed_wheel_carries_the_paper_tables_and_reference_checkpoints(installed_wheel):
    out = run_installed(installed_wheel, (
        "import vitviz, torch\n"
        "print(vitviz.__file__)\n"
        "print(len(vitviz.paper_results()))\n"
        "m = vitviz.load_model('cifar10-vit', device='cpu')\n"
        "print(m(torch.zeros(1, 3, 32, 32)).shape[-1])\n"
        "print(len(vitviz.reference_table()))\n"
    ))
    path, paper_rows, classes, cards = out.split()
    assert Path(path).is_relative_to(installed_wheel / "site"), f"imported from {path}, not the wheel"
    assert int(paper_rows) == 18  # Table 6: every ViT, ResNet and hybrid row
    assert int(classes) == 10
    assert int(cards) == len(list((ROOT / "vitviz" / "zoo" / "checkpoints").glob("*.json")))


def test_wheel_holds_every_shipped_data_file(installed_wheel):
    site = installed_wheel / "site" / "vitviz" / "zoo"
    for folder in ("checkpoints", "tables"):
        shipped = {p.name for p in (ROOT / "vitviz" / "zoo" / folder).iterdir()}
        assert shipped <= {p.name for p in (site / folder).iterdir()}, folder


def test_notebooks_are_committed_clean():
    """No outputs, no execution counts, and valid nbformat (every cell has an id)."""
    import json

    import nbformat

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            assert "id" in cell, f"{path.name} cell {i} has no id"
            if cell["cell_type"] == "code":
                assert not cell["outputs"] and cell["execution_count"] is None, f"{path.name} cell {i} has outputs"
        nbformat.validate(nbformat.reads(path.read_text(), as_version=4))


def test_wheel_carries_the_notebooks_and_the_study_results(installed_wheel):
    """The notebooks (``notebooks/`` -> ``vitviz.notebooks``) and the study CSV (``data/`` -> ``vitviz.data``)
    are package data: an installed vitviz finds them by import name, from an unrelated folder."""
    out = run_installed(installed_wheel, (
        "from vitviz.report.notebooks import find_notebooks\n"
        "from vitviz.experiments.study import read_results\n"
        "for p in find_notebooks(): print(p)\n"
        "print(len(read_results()))\n"
    ))
    *paths, rows = out.split()
    source = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert [Path(p).name for p in paths] == source and len(source) == 5  # 01 ... 05
    assert all(Path(p).is_relative_to(installed_wheel / "site" / "vitviz" / "notebooks") for p in paths), paths
    assert int(rows) == len(read_csv_rows(ROOT / "data" / "study" / "hybrid_vs_pure.csv")) > 0


def read_csv_rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines()[1:] if line.strip()]


def test_no_code_finds_files_through_the_source_tree():
    """Files beside the code are package data, found with importlib.resources; nothing climbs out of vitviz/."""
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "vitviz").rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if "parents[" in line or ".parent.parent" in line]
    assert not offenders, offenders


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.newest_only  # what the wheel holds is the same on every version; the oldest run executes each notebook
def test_report_from_the_installed_wheel_runs_every_notebook(installed_wheel, tmp_path, tiny_folder):
    """``vitviz report`` from the wheel (not the source tree) executes the four shipped notebooks (on a tiny
    CIFAR-style folder: notebook 04 needs a labelled test set)."""
    import json

    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(installed_wheel / "site"), "PYTHONSAFEPATH": "1", "MPLBACKEND": "Agg",
           "VITVIZ_DATA": str(tiny_folder)}
    env.pop("VITVIZ_CHECKPOINTS", None)
    run = subprocess.run([sys.executable, "-m", "vitviz", "report", "--out", str(out), "--formats", "png"],
                         capture_output=True, text=True, env=env, cwd=installed_wheel, timeout=1800)
    meta = json.loads((out / "meta.json").read_text())
    assert run.returncode == 0, (run.stderr[-3000:], meta["failures"])
    assert len(meta["notebooks"]) == len(list((ROOT / "notebooks").glob("*.ipynb"))) == 5, meta["notebooks"]
    assert all(nb["ok"] for nb in meta["notebooks"]), meta["failures"]
    assert all(Path(nb["source"]).is_relative_to(installed_wheel / "site") for nb in meta["notebooks"])
