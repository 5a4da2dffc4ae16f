"""Run the notebooks (``vitviz.notebooks``: the repository's ``notebooks/``, shipped in the wheel) headless for the report (papermill), and turn them into HTML (nbconvert).

Each notebook has one ``parameters`` cell; the report sets only the parameters a notebook declares: ``out_dir``
(where it saves its figures), ``arrays_dir`` (where it saves the numbers behind them), the model (``model_name``
or ``vit_model``) and an image folder (``images_dir``, ``image_dir`` or ``data_dir``). The kernel is ``python3``
from the running interpreter's environment; ``MPLBACKEND`` is taken out of its environment, or Jupyter's inline
backend would not be chosen and the figures would vanish from the executed notebook; a relative ``$VITVIZ_DATA``
is made absolute, since each kernel runs in its notebook's folder. A failing notebook is kept
(executed up to the failure, with the traceback) and its failing cell is named.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitviz.errors import InputError
from vitviz.zoo.samples import DATA_ENV

__all__ = ["NotebookRun", "check_parameter", "find_notebooks", "notebook_html", "notebook_parameters",
           "parameters_for", "run_notebook"]

# what the report knows -> the parameter names a notebook may use for it, in order of preference
PARAMETER_NAMES = {
    "out_dir": ("out_dir",),
    "arrays_dir": ("arrays_dir",),
    "model": ("model_name", "vit_model", "model"),
    "checkpoint": ("checkpoint",),  # the weights file of that model
    "images": ("images_dir", "image_dir", "data_dir", "images"),
}


@dataclass
class NotebookRun:
    """What happened to one notebook: where its outputs are, and the failing cell if it failed."""

    name: str
    source: str
    parameters: dict[str, Any]
    executed: str | None = None
    html: str | None = None
    ok: bool = False
    error: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_notebooks(folder: str | os.PathLike | None = None) -> list[Path]:
    """The ``*.ipynb`` files of ``folder`` in name order (checkpoints and hidden files left out).

    Args:
        folder: default the installed notebooks, ``vitviz.notebooks`` (``vitviz.core.resources.shipped_dir``).
    """
    if folder is None:
        from vitviz.core.resources import shipped_dir

        folder = shipped_dir("vitviz.notebooks")
    return sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("."))


def notebook_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """The parameters declared in the notebook's ``parameters`` cell: name -> default (as source text)."""
    import papermill

    return {name: p["default"] for name, p in papermill.inspect_notebook(str(path)).items()}


def check_parameter(name: str, value: Any, kind: Any) -> Any:
    """A notebook parameter's value, refused unless it is of ``kind``: how every shipped notebook reads its flags,
    counts and lists, and what ``run_notebook`` checks before a notebook runs.

    papermill passes a parameter given raw (``papermill -r with_flow False``, or a value read from a text file) as
    the string ``'False'``, which a notebook's ``if with_flow:`` reads as True; ``'128'`` as a count fails far from
    its cause, or not at all; ``'[1, 5]'`` as a list of shots is iterated character by character.

    Args:
        name: the parameter's name, for the message.
        value: its value.
        kind: ``bool`` (True or False: ``vitviz.core.util.check_bool``'s rule, that of ``load_model(pretrained=)``,
            which also takes 0 and 1), ``int`` (a whole number, not a bool: ``is_int``) or ``float`` (any real
            number, not a bool: ``is_number``); ``list[int]``, ``list[float]``, ``list[str]`` or ``list[bool]``
            (a list, not a string or a tuple, whose every element is of that kind, ``True`` and ``False`` only for
            ``list[bool]``), or ``list`` (a list of anything); a tuple: the choices ``value`` must be one of (a
            string parameter such as notebook 04's ``interval``, which a later cell would refuse only after the
            expensive ones ran); any other kind takes any value.

    Returns:
        ``value`` (a bool for ``kind=bool``).

    Raises:
        InputTypeError: ``value`` is not of ``kind``; the message names the parameter, the value and the fix.
        InputError: ``value`` is not one of the choices ``kind``.
    """
    from vitviz.core.util import check_bool, is_int, is_number
    from vitviz.errors import InputTypeError

    if isinstance(kind, tuple):
        if not any(value == c and type(value) is type(c) for c in kind):
            raise InputError(f"{name}={value!r} is not one of {list(kind)}; pass one of them (the notebook's {name} "
                             "parameter)")
        return value

    how = f"the notebook's {name} parameter; papermill -p and -y pass it typed, -r as a string"
    if kind is bool:
        return check_bool(value, name, how)
    if (kind is int and not is_int(value)) or (kind is float and not is_number(value)):
        raise InputTypeError(f"{name}={value!r} is not {'an int' if kind is int else 'a number'}; pass "
                             f"{'a whole number' if kind is int else 'a number'}, not a string or a bool ({how})")
    if kind is list or getattr(kind, "__origin__", None) is list:
        (item,) = getattr(kind, "__args__", (None,))
        words, one, example = _LIST_ITEMS.get(item, ("values", "", "[1, 5]"))
        if not isinstance(value, list):
            raise InputTypeError(f"{name}={value!r} is not a list; pass a list of {words}, e.g. {example} (papermill "
                                 f"-y '{name}: {example}'), not a string or a single value ({how})")
        ok = {int: is_int, float: is_number, str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool)}
        bad = [v for v in value if item in ok and not ok[item](v)]
        if bad:
            raise InputTypeError(f"{name}={value!r} holds {bad[0]!r}, which is not {one}; pass a list of {words}, "
                                 f"e.g. {example} ({how})")
    return value


_LIST_ITEMS = {int: ("whole numbers", "a whole number", "[1, 5]"), float: ("numbers", "a number", "[0.5, 1.0]"),
               str: ("strings", "a string", '["cifar10-vit"]'), bool: ("True or False", "a bool", "[True, False]")}


def _declared_kind(default: str) -> Any:
    """The kind ``check_parameter`` checks for a parameter whose default is the source text ``default``: ``bool``,
    ``int`` or ``float`` for such a literal; for a list literal ``list[int]`` (``list[float]``, ``list[str]``,
    ``list[bool]``) when its elements are all of that one kind, else ``list``; None for anything else (a string, a
    path, None: not checked)."""
    import ast

    try:
        value = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, list):
        kinds = {type(v) for v in value}
        return list[kinds.pop()] if len(kinds) == 1 and kinds <= {bool, int, float, str} else list
    return type(value) if type(value) in (bool, int, float) else None


def parameters_for(path: str | os.PathLike, **known: Any) -> dict[str, Any]:
    """Map the report's settings (``out_dir``, ``arrays_dir``, ``model``, ``checkpoint``, ``images``) onto the
    notebook's names.

    Settings that are ``None`` and settings the notebook does not declare are left out, so every notebook runs
    with its own offline defaults for them.
    """
    declared = notebook_parameters(path)
    chosen: dict[str, Any] = {}
    for key, value in known.items():
        if value is None:
            continue
        if key not in PARAMETER_NAMES:
            raise InputError(f"unknown report setting {key!r}; known: {sorted(PARAMETER_NAMES)}")
        name = next((n for n in PARAMETER_NAMES[key] if n in declared), None)
        if name is not None:
            chosen[name] = str(value) if isinstance(value, os.PathLike) else value
    model = next((n for n in PARAMETER_NAMES["model"] if n in chosen), None)
    if known.get("checkpoint") is not None and model is not None and "checkpoint" not in chosen:
        raise InputError(f"{Path(path).name} takes {model} but no checkpoint parameter: it would run "
                         f"{chosen[model]!r} without the weights file {str(known['checkpoint'])!r}; give the notebook "
                         "a `checkpoint = None` parameter passed to its vitviz.load_model call")
    return chosen


@contextmanager
def kernel_environment() -> Iterator[None]:
    """The environment kernels inherit, for the duration of the block: without ``MPLBACKEND``, and with a relative
    ``$VITVIZ_DATA`` made absolute (a kernel runs in its notebook's folder, where the relative path means nothing)."""
    saved = {k: os.environ.get(k) for k in ("MPLBACKEND", DATA_ENV)}
    os.environ.pop("MPLBACKEND", None)
    if saved[DATA_ENV]:
        os.environ[DATA_ENV] = str(Path(saved[DATA_ENV]).expanduser().absolute())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _snapshot(folders: list[Path]) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for d in folders if d.is_dir() for p in d.iterdir() if p.is_file()}


def _source_index(path: Path, source: str, executed_index: int) -> int:
    """The failing cell's 0-based index in the source notebook (papermill's index counts its injected cell)."""
    import nbformat

    cells = nbformat.read(str(path), as_version=4).cells
    hits = [i for i, c in enumerate(cells) if c.source == source]
    return min(hits, key=lambda i: abs(i - executed_index)) if hits else executed_index


def run_notebook(path: str | os.PathLike, out: str | os.PathLike, parameters: dict[str, Any], *,
                 kernel: str = "python3", cell_timeout: int | None = 1800, start_timeout: int = 120,
                 watch: tuple[str | os.PathLike, ...] = ()) -> NotebookRun:
    """Execute one notebook with papermill into ``out/<name>.ipynb`` and convert it to ``out/<name>.html``.

    Args:
        path: the notebook.
        out: folder for the executed notebook and its HTML.
        parameters: values for its ``parameters`` cell (see ``parameters_for``).
        kernel: Jupyter kernel name.
        cell_timeout: seconds one cell may run (``None``: no limit).
        start_timeout: seconds the kernel may take to start.
        watch: folders whose new or rewritten files are listed in ``NotebookRun.files`` (figures, arrays).

    An earlier ``out/<name>.ipynb`` and ``.html`` are removed first: a notebook that fails before papermill writes
    it (unreadable, a kernel that does not start) has ``executed`` and ``html`` None, not an earlier run's pages.

    Raises:
        InputTypeError: a parameter whose default in the notebook is a bool, an int, a float or a list is given a
            value of another kind, or a list of other elements (``check_parameter``), before anything runs or is
            written.

    Returns:
        ``NotebookRun``; on failure ``ok`` is False and ``error`` holds ``cell_index`` (0-based, in the source
        notebook), ``exec_count``, ``ename``, ``evalue`` and a one-line ``message`` naming the cell.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path, out = Path(path), Path(out)
    if parameters:  # a flag, count or list of the wrong kind is refused before a kernel starts
        for name, default in notebook_parameters(path).items():
            kind = _declared_kind(default)
            if name in parameters and kind is not None:
                check_parameter(name, parameters[name], kind)
    out.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(path.stem, str(path), dict(parameters))
    executed = out / f"{path.stem}.ipynb"
    if executed.resolve() == path.resolve():
        raise InputError(f"out={str(out)!r} is the folder of {path.name}: its executed copy would replace it; pass "
                         "another out")
    for earlier in (executed, out / f"{path.stem}.html"):  # never taken for this run's where papermill writes none
        earlier.unlink(missing_ok=True)
    folders = [Path(w) for w in watch]
    before = _snapshot(folders)
    start = time.monotonic()
    try:
        with kernel_environment():
            papermill.execute_notebook(str(path), str(executed), parameters=parameters, kernel_name=kernel,
                                       cwd=str(path.parent), progress_bar=False, log_output=False,
                                       start_timeout=start_timeout, execution_timeout=cell_timeout)
        run.ok = True
    except PapermillExecutionError as e:
        index = _source_index(path, e.source, e.cell_index)
        first = next((line for line in e.source.splitlines() if line.strip()), "")
        run.error = {"cell_index": index, "exec_count": e.exec_count, "ename": e.ename, "evalue": e.evalue,
                     "source": e.source,
                     "message": f"{path.name}: cell {index} (execution count {e.exec_count}, `{first[:60]}`) "
                                f"raised {e.ename}: {e.evalue}"}
    except Exception as e:  # kernel died, timeout, unreadable notebook: keep going, say what happened
        run.error = {"cell_index": None, "exec_count": None, "ename": type(e).__name__, "evalue": str(e),
                     "message": f"{path.name}: {type(e).__name__}: {e}"}
    run.seconds = round(time.monotonic() - start, 1)
    after = _snapshot(folders)
    run.files = sorted(str(p) for p, t in after.items() if before.get(p) != t)
    if executed.is_file():
        run.executed = str(executed)
        try:
            run.html = str(notebook_html(executed, out / f"{path.stem}.html"))
        except Exception as e:  # the executed notebook is still there
            run.error = run.error or {"cell_index": None, "exec_count": None, "ename": type(e).__name__,
                                      "evalue": str(e), "message": f"{path.name}: HTML export failed: {e}"}
            run.ok = False
    return run


# nbconvert's lab page without its CDN scripts (require.js, MathJax, Mermaid): the page loads nothing from the
# network; styles and figures are inline. TeX in markdown then shows as source.
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def notebook_html(notebook: str | os.PathLike, html_path: str | os.PathLike) -> Path:
    """Write ``notebook`` as one self-contained HTML page (nbconvert's ``HTMLExporter``, images embedded).

    The page needs no network: figures are embedded as data URLs and the CDN scripts of nbconvert's template
    are left out (``OFFLINE_TEMPLATE``).
    """
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    from vitviz.core.io import atomic_write_text

    nb = nbformat.read(str(notebook), as_version=4)
    exporter = HTMLExporter(embed_images=True, template_file="vitviz_offline.html.j2",
                            extra_loaders=[DictLoader({"vitviz_offline.html.j2": OFFLINE_TEMPLATE})])
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": Path(notebook).stem}})
    return atomic_write_text(html_path, body)
