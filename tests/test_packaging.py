"""Packaging: environment.yml and pyproject.toml agree; `import vitviz` stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib
import yaml

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


def test_import_is_light():
    # what `import torch, timm` pulls in by itself is not vitviz's doing: torch 2.2's ONNX exporter imports
    # transformers when it is installed, for instance
    heavy = "('matplotlib', 'ipywidgets', 'jupyter_client', 'IPython', 'seaborn', 'pandas', 'papermill', 'transformers')"
    code = "import sys, {mods}; print(','.join(m for m in " + heavy + " if m in sys.modules))"
    run = [sys.executable, "-c"]
    base = set(filter(None, subprocess.run([*run, code.format(mods="torch, timm")], capture_output=True, text=True,
                                           check=True).stdout.strip().split(",")))
    out = set(filter(None, subprocess.run([*run, code.format(mods="vitviz")], capture_output=True, text=True,
                                          check=True).stdout.strip().split(",")))
    assert out <= base, f"import vitviz pulled in {sorted(out - base)}"


def test_lazy_exports_resolve():
    import vitviz

    for name in vitviz._LAZY:
        assert callable(getattr(vitviz, name)), name
    assert set(vitviz._LAZY) <= set(dir(vitviz))
