"""Write the API reference's index pages from ``vitviz._LAZY`` (run by ``conf.py`` at every build).

``api.rst`` lists every public name, grouped by the layer of the module that defines it; autosummary then makes one
page per name (``generated/vitviz.<name>.rst``, template ``_templates/autosummary/entry.rst``). ``plot_api.md``
tables every plot function with its level and return type, read from ``vitviz.plot_level``.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import vitviz

LAYERS = [  # module prefix -> section title, in the order data flows
    ("vitviz.errors", "Errors"),
    ("vitviz.core", "Model access and capture (core)"),
    ("vitviz.analysis", "Analysis"),
    ("vitviz.zoo", "Models, reference checkpoints and the paper's tables (zoo)"),
    ("vitviz.plot", "Figures (plot)"),
    ("vitviz.widgets", "Widgets"),
    ("vitviz.report", "Report"),
    ("vitviz.experiments", "Experiments"),
]


def public_names() -> dict[str, str]:
    """Every public name -> the module ``vitviz`` takes it from (the error classes: ``vitviz.errors``)."""
    names = {name: "vitviz.errors" for name in vitviz.__all__ if name not in vitviz._LAZY}
    names.update(vitviz._LAZY)
    return names


def other_error_classes() -> list[str]:
    """The classes of ``vitviz.errors`` that ``vitviz`` does not export by name (the warnings a caller filters, the
    finer error classes), documented under their module."""
    import vitviz.errors as errors

    return sorted(n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.VitvizError)
                  and c.__module__ == errors.__name__ and n not in vitviz.__all__)


def _section(module: str) -> str:
    for prefix, title in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return title
    return "Other"


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:  # unchanged pages keep their time stamp: fast rebuilds
        path.write_text(text)


def write_api_page(path: Path) -> None:
    groups: dict[str, list[str]] = {}
    for name, module in public_names().items():
        groups.setdefault(_section(module), []).append(name)
    lines = [".. This page is written by api_build.py from vitviz._LAZY at every build; do not edit.", "",
             "API reference", "=============", "",
             "Every public name of ``vitviz``, one page each, grouped by layer (see :doc:`architecture`). "
             "``import vitviz`` is light: each name is imported on first use.", "",
             ".. currentmodule:: vitviz", ""]
    for _prefix, title in [*LAYERS, ("", "Other")]:
        if title not in groups:
            continue
        lines += [title, "-" * len(title), "", ".. autosummary::", "   :toctree: generated",
                  "   :template: entry.rst", "", *[f"   {n}" for n in sorted(groups[title])], ""]
        if title == "Errors":  # the rest of vitviz.errors: the warnings and the finer error classes
            lines += ["The warnings vitviz gives and the finer error classes, imported from ``vitviz.errors``:", "",
                      ".. currentmodule:: vitviz.errors", "", ".. autosummary::", "   :toctree: generated",
                      "   :template: entry.rst", "", *[f"   {n}" for n in other_error_classes()], "",
                      ".. currentmodule:: vitviz", ""]
    _write(path, "\n".join(lines))


def _returns(name: str) -> str:
    ret = inspect.signature(getattr(vitviz, name)).return_annotation
    return ret if isinstance(ret, str) else getattr(ret, "__name__", str(ret))


def write_plot_page(path: Path) -> None:
    plots = sorted(n for n in vitviz._LAZY if n.startswith("plot_") and n != "plot_level")
    rows = []
    for level in ("axes", "figure"):
        for name in plots:
            if vitviz.plot_level(name) == level:
                summary = (inspect.getdoc(getattr(vitviz, name)) or "").split("\n")[0]
                rows.append(f"| [`vitviz.{name}`](generated/vitviz.{name}) | {level}-level | `{_returns(name)}` | "
                            f"{summary.replace('|', '/')} |")
    text = "\n".join([
        "<!-- This page is written by api_build.py from vitviz._LAZY at every build; do not edit. -->",
        "",
        "# Plot functions",
        "",
        "vitviz's plot functions follow seaborn's split. An **axes-level** function is",
        "`plot_<thing>(data, *, ax=None, ...)`: it draws into one `Axes` (a new figure when `ax` is `None`; a",
        "colorbar may be added beside it) and returns that `Axes`; `ax` is always keyword-only. A **figure-level**",
        "function lays out several axes and returns the `Figure`; its name ends in `_grid`, except the ViT paper's",
        "two multi-panel figures whose names the design contract fixes, `plot_rollout` (Fig. 6) and",
        "`plot_compute_curves` (Fig. 5). `vitviz.plot_level(name)` answers from the name alone, and",
        "`tests/test_plot_api.py` checks every function below against it. None shows or saves a figure",
        "(`vitviz.save_figure` writes PNG, PDF and SVG and accepts an `Axes` too). Default colormaps are",
        "perceptually uniform (viridis, magma).",
        "",
        "| function | level | returns | what it draws |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
    ])
    _write(path, text)
