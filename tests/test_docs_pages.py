"""The documentation site's Markdown pages and ``bench/README.md`` say what the code does.

- Every Python code block of ``docs/*.md`` runs, offline, on a tiny random-weight ViT, page by page in one
  namespace (as a reader would paste them). The names a page takes as given (``model``, ``images``, a headless
  ``dino``, ...) are set up here, as the page describes them; a block that cannot run here (it needs CUDA or several
  GPUs) is skipped *by name* in ``SKIPS`` with the reason, and a name there that no longer exists fails the suite.
  (README.md's blocks: ``tests/test_readme.py``.)
- Every ``vitviz.<name>(...)`` call the README and the pages show names a public function and passes it only
  arguments it takes.
- ``bench/README.md``'s table names every script of ``bench/``.
- Figures quoted that no other test holds are those of their recorded runs in ``bench/results/``: the import times,
  the README's CPU benchmark rows, AttnLRP against Chefer on ``cifar10-vit``.
- Minimum versions quoted are ``pyproject.toml``'s; "the N notebooks" is the number shipped; the docs build's small
  notebook parameters are parameters the notebooks declare.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH = ROOT / "bench"

# block name -> why it does not run in the suite
SKIPS = {
    "gpu.md: On a GPU: what runs there, the switches, and calls recorded as CUDA graphs #1": "moves a model to CUDA",
    "gpu.md: Many calls of one shape: `vitviz.graphed` #1": "records CUDA graphs (tests/test_graphs.py, on a GPU)",
    "benchmarks.md: GPU: calls recorded as CUDA graphs (`vitviz.graphed`) #1":
        "records CUDA graphs (tests/test_graphs.py, on a GPU)",
    "benchmarks.md: A 50,000-image folder on 8 GPUs #1": "needs torchrun, NCCL and 8 CUDA devices",
}
SLOW = {  # blocks that run every default method's perturbation curves: a minute on a 2-core CPU
    "explain.md: `vitviz.faithfulness`: which map should I believe? #1",
}


def page_blocks(path: Path) -> list[tuple[str, str]]:
    """``(name, code)`` of each ```python block of a page; the name is the page, the nearest heading above the
    block and the block's ordinal under it."""
    blocks, heading, count, fence = [], "top", {}, False
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = not fence if line.strip() != "```python" else fence
        if line.startswith("#") and not fence:
            heading = line.lstrip("#").strip()
        if line.strip() == "```python":
            j = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
            count[heading] = count.get(heading, 0) + 1
            blocks.append((f"{path.name}: {heading} #{count[heading]}", "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return blocks


def all_blocks() -> list[tuple[str, str]]:
    return [b for page in sorted(DOCS.glob("*.md")) for b in page_blocks(page)]


def test_docs_blocks_are_found_and_skips_exist():
    names = [n for n, _ in all_blocks()]
    assert len(names) >= 8 and len(set(names)) == len(names)
    missing = (set(SKIPS) | SLOW) - set(names)
    assert not missing, f"SKIPS / SLOW name blocks the docs no longer have: {missing}"


def _given(page: str, tmp_path: Path) -> dict:
    """What each page takes as given, as it describes it."""
    import timm
    import torch.nn.functional as F  # noqa: N812
    from PIL import Image
    from skimage import data as skdata

    import vitviz

    Image.fromarray(skdata.chelsea()).save(tmp_path / "cat.jpg")  # index.md: "your images"
    torch.manual_seed(0)
    kw = dict(pretrained=False, img_size=32, patch_size=8, depth=2)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, **kw).eval()
    dino = timm.create_model("vit_tiny_patch16_224", num_classes=0, **kw).eval()  # a headless model
    x = torch.randn(2, 3, 32, 32)
    return {"index.md": {},
            "explain.md": {"vitviz": vitviz, "model": model, "images": x, "dino": dino, "x": x, "x_ref": x[:1],
                           "F": F}}.get(page, {})


def _run_page(page: str, tmp_path: Path, monkeypatch, only: set[str] | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace = {"__name__": "__docs__", **_given(page, tmp_path)}
    return run_blocks(page_blocks(DOCS / page), namespace, "docs", lambda name: name in SKIPS or (
        only is not None and name not in only) or (only is None and name in SLOW))


def run_blocks(blocks: list[tuple[str, str]], namespace: dict, where: str, skip=lambda name: False) -> list[str]:
    """Execute ``blocks`` in order in one ``namespace`` (as a reader pastes them), leaving out those ``skip``
    names; a failure names its block. Returns the names of the blocks run."""
    ran = []
    for name, code in blocks:
        if skip(name):
            continue
        try:
            exec(compile(code, f"{where} [{name}]", "exec"), namespace)
        except Exception as err:  # name the block in the failure
            raise AssertionError(f"{where} block {name!r} failed: {type(err).__name__}: {err}") from err
        ran.append(name)
    return ran


@pytest.mark.parametrize("page", sorted({n.split(":")[0] for n, _ in all_blocks() if n not in SKIPS}))
def test_every_docs_python_block_runs_offline(page, tmp_path, monkeypatch):
    ran = _run_page(page, tmp_path, monkeypatch)
    names = [n for n, _ in page_blocks(DOCS / page)]
    assert set(ran) == set(names) - set(SKIPS) - SLOW


@pytest.mark.slow
def test_the_slow_docs_blocks_run_offline(tmp_path, monkeypatch):
    for page in sorted({n.split(":")[0] for n in SLOW}):
        assert _run_page(page, tmp_path, monkeypatch, only=SLOW)


def bench_scripts_missing_from_table(readme: str, scripts: list[str]) -> list[str]:
    """The scripts that no row of the README's table (``| `name` | ... |``) names."""
    rows = set(re.findall(r"^\| `([\w.]+)` \|", readme, re.M))
    return [s for s in scripts if s not in rows]


def test_bench_readme_names_every_script():
    scripts = sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh"))
    assert "attention.py" in scripts
    missing = bench_scripts_missing_from_table((BENCH / "README.md").read_text(), scripts)
    assert not missing, f"bench/README.md's table does not name {missing}: add a row saying what each measures"


def test_the_bench_table_check_sees_a_missing_script():
    table = "| script | measures |\n| --- | --- |\n| `attention.py` | x |\n\nsee `dataset.py`\n"
    assert bench_scripts_missing_from_table(table, ["attention.py", "dataset.py"]) == ["dataset.py"]


def test_import_times_quoted_are_the_recorded_run():
    """README.md and docs/benchmarks.md quote ``bench/import_time.py``'s recorded run (they once quoted 0.002 s and
    0.025 s for the same figure, neither of them recorded)."""
    run = (BENCH / "results" / "cpu_import_time.txt").read_text()
    base, extra = re.search(r"import torch, timm: ([\d.]+) s +import vitviz on top: ([\d.]+) s", run).groups()
    helps = dict(re.findall(r"^(vitviz(?: \w+)? --help): ([\d.]+) s", run, re.M))
    assert set(helps) == {"vitviz --help", "vitviz report --help", "vitviz train --help", "vitviz study --help"}
    assert float(extra) <= 0.5 and max(map(float, helps.values())) < 1.0  # the goals the docs name
    readme = " ".join((ROOT / "README.md").read_text().split())
    span = f"{min(helps.values(), key=float)}-{max(helps.values(), key=float)} s"
    assert f"`import vitviz` adds {extra} s to `import torch, timm`" in readme and span in readme
    page = " ".join((DOCS / "benchmarks.md").read_text().split())
    sub = [v for k, v in helps.items() if k != "vitviz --help"]
    assert (f"`import torch, timm` {base} s, `import vitviz` on top {extra} s; `vitviz --help` "
            f"{helps['vitviz --help']} s, `vitviz SUBCOMMAND --help` {min(sub, key=float)} to {max(sub, key=float)} s"
            in page)


def declared_minimums() -> dict[str, str]:
    """``pyproject.toml``'s ``name>=version`` of every dependency and extra, by name."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return dict(re.fullmatch(r"([\w-]+)>=([\d.]+)", r.replace(" ", "")).groups() for r in reqs)


def version_claim_problems(text: str, minimums: dict[str, str]) -> list[str]:
    """Each ``name >= version`` of a page (prose or backticks) that is not the declared minimum of ``name``."""
    problems = []
    for name, version in re.findall(r"\b([\w-]+) ?>= ?(\d[\d.]*\d|\d)", text):
        if name in minimums and version != minimums[name]:
            problems.append(f"{name} >= {version} (declared: >= {minimums[name]})")
    return problems


def test_minimum_versions_quoted_are_the_declared_ones():
    """README.md and the docs quote each dependency's minimum as pyproject.toml declares it (docs/families.md said
    ``transformers >= 5.0`` and README.md ``transformers >= 5`` where 5.9 is declared, and 5.0-5.8 fail), and the
    README's version table gives every declared minimum its row. docs/trust.md's account of the minimums, which
    quotes the first declarations (``torch>=2.1``) and transformers' own (``torch >= 2.4``), is left out."""
    minimums = declared_minimums()
    assert minimums["transformers"] == "5.9" and minimums["torch"] == "2.5"
    for page in [ROOT / "README.md", BENCH / "README.md", *sorted(DOCS.glob("*.md"))]:
        if page.name != "trust.md":
            problems = version_claim_problems(page.read_text(), minimums)
            assert not problems, f"{page.name} quotes {problems}"
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| | newest tested | declared minimum"):].split("\n\n")[0]
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [n.strip(" `") for n in re.sub(r"\(.*?\)", "", cells[0]).split("/")]
        if names == ["Python"]:
            continue
        shown = [v.strip() for v in cells[2].split("/")]
        assert shown == [minimums[n] for n in names], line
    assert version_claim_problems("Hugging Face (`transformers >= 5`), torch>=2.5, `timm >= 1.0.9`",
                                  minimums) == ["transformers >= 5 (declared: >= 5.9)",
                                                "timm >= 1.0.9 (declared: >= 1.0.26)"]


NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def notebook_count_claims(text: str) -> list[int]:
    """How many notebooks each "the five notebooks" (any number, in words or digits) of a text says there are."""
    found = re.findall(r"\b(?:the|all|every|its) (\w+) notebooks\b", text, re.I)
    return [NUMBERS.get(w.lower(), int(w) if w.isdigit() else -1) for w in found if w.lower() in NUMBERS or w.isdigit()]


def test_the_number_of_notebooks_said_is_the_number_shipped():
    """The Makefile's ``docs`` target and ``vitviz/core/resources.py`` spoke of "the four notebooks" after the fifth
    was added; README.md and the docs site said five."""
    shipped = len(list((ROOT / "notebooks").glob("*.ipynb")))
    sources = [ROOT / "README.md", ROOT / "Makefile", *DOCS.glob("*.md"), *DOCS.glob("*.py"),
               *(ROOT / "vitviz").rglob("*.py")]
    wrong = {str(p.relative_to(ROOT)): c for p in sources if (c := [n for n in notebook_count_claims(p.read_text())
                                                                   if n != shipped])}
    assert not wrong, f"{shipped} notebooks are shipped, but these say otherwise: {wrong}"
    assert notebook_count_claims("runs the four notebooks; every 5 notebooks; the notebooks") == [4, 5]


def _bench_attention():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_attention_docs", BENCH / "attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# README.md's CPU rows of the benchmark table -> the recorded runs they come from (file, model)
CPU_ROWS = {
    "ViT-B/16, 224 px, batch 8": ([("cpu_attention_stream.json", "vit_base_patch16_224"),
                                   ("cpu_attention_stream_r7.json", "vit_base_patch16_224"),
                                   ("cpu_attention_stream_r7b.json", "vit_base_patch16_224")], 224),
    "ViT-B/16, 448 px, batch 2": ([("cpu_attention_stream.json", "vit_base_patch16_224"),
                                   ("cpu_attention_stream_r7.json", "vit_base_patch16_224"),
                                   ("cpu_attention_stream_r7b.json", "vit_base_patch16_224")], 448),
    "Hugging Face `ViTModel` (B/16), 224 px, batch 8, SDPA": ([("cpu_attention_hf.json", "hf:vit-base-patch16")], 224),
    "torchvision `vit_b_16`, 224 px, batch 8": ([("cpu_attention_hf.json", "tv:vit_b_16")], 224),
    "timm EVA-02 B/14 (rotary), 224 px, batch 8": ([("cpu_attention_timm_variants.json", "eva02_base_patch14_224")],
                                                   224),
}
MEMORY_ONLY = {  # a row's further runs that measured memory only (their times were taken on a shared CPU)
    "timm EVA-02 B/14 (rotary), 224 px, batch 8": [("cpu_attention_eva02_memory.json", "eva02_base_patch14_224")],
}


def _span(values: list[float], fmt: str) -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def test_the_readmes_cpu_benchmark_rows_are_the_recorded_runs():
    """README.md's benchmark table, CPU rows: images/s of the plain forward, the explicit path's and vitviz's
    rollout and distance time over the plain forward's (the range over the runs), and rollout's extra memory over
    store-everything's, recomputed with ``bench/attention.py``'s own ``goal_rows`` from the JSON each row comes from
    (the H200 rows: ``tests/test_bench_goals.py``)."""
    import json
    import math

    attention = _bench_attention()
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("<!-- benchmark-table -->"):readme.index("<!-- /benchmark-table -->")]
    rows = {cells[1]: cells for line in table.splitlines() if line.startswith("| 2-core Xeon CPU")
            for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]}
    assert set(rows) == set(CPU_ROWS)
    for label, (runs, size) in CPU_ROWS.items():
        plain, explicit, rollout, distance, memory = [], [], [], [], []
        for name, model in runs + MEMORY_ONLY.get(label, []):
            recorded = [r for r in json.loads((BENCH / "results" / name).read_text()) if r["model"] == model]
            (case,) = [c for (_, m, dtype, px, _), c in attention.cases(recorded).items()
                       if m == model and dtype == "fp32" and px == size
                       and ((name, model) not in runs or c["plain"].get("setting", "default") == "default")]
            goals = {g["method"]: g for g in attention.goal_rows(case)}
            if (name, model) in runs:
                plain.append(case["plain"]["images_per_s"])
                explicit.append(case["explicit"]["time_s"] / case["plain"]["time_s"])
                rollout.append(goals["rollout"]["x_plain"])
                distance.append(goals["distance"]["x_plain"])
            share = goals["rollout"]["memory_share"]
            if share is not None and not math.isnan(share):
                memory.append(share)
        _, _, plain_cell, explicit_cell, rollout_cell, distance_cell, memory_cell = rows[label]
        assert plain_cell == f"{_span(plain, '{:.1f}')} img/s", label
        assert explicit_cell.split(" (")[0] == f"{_span(explicit, '{:.2f}')}x", label
        assert rollout_cell == f"{_span(rollout, '{:.2f}')}x", label
        assert distance_cell == f"{_span(distance, '{:.2f}')}x", label
        if max(memory) <= 0:
            assert memory_cell == "within noise of plain", label
        else:
            assert memory_cell == _span(memory, "{:.0%}").replace("%-", "-"), label


def notebook_parameters(path: Path) -> set[str]:
    """The names a notebook's ``parameters`` cell assigns (what papermill can set)."""
    import ast
    import json

    cells = [c for c in json.loads(path.read_text())["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged 'parameters'"
    tree = ast.parse("".join(cells[0]["source"]))
    return {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}


def test_the_docs_small_notebook_parameters_are_the_notebooks_own():
    """``docs/notebooks_build.py`` runs each notebook with small parameters for the site. papermill only warns of a
    parameter the notebook does not declare, so a renamed parameter would leave the docs build running that notebook
    at full size (or the site showing other settings than it says) with no error: every notebook has an entry, and
    every name in it is one of that notebook's parameters."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_notebooks_build", DOCS / "notebooks_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    notebooks = {p.stem: p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
    assert set(build.PARAMETERS) == set(notebooks)
    for stem, params in build.PARAMETERS.items():
        unknown = set(params) - notebook_parameters(notebooks[stem])
        assert not unknown, f"docs/notebooks_build.py gives {stem} parameters it does not declare: {unknown}"
    assert "n_images" in notebook_parameters(notebooks["04_faithfulness"])


def _dotted(node) -> str | None:
    import ast

    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == "vitviz" and parts else None


def call_problems(code: str) -> list[str]:
    """Each ``vitviz.<name>(...)`` call of ``code`` that names nothing, or that its function cannot take: an
    unknown keyword, too many values by position, a required argument missing (a call written with ``...`` among
    its values, ``vitviz.explain(..., method="chefer")``, is checked for its keywords only)."""
    import ast
    import importlib
    import inspect

    import vitviz

    problems = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call) or (dotted := _dotted(node.func)) is None:
            continue
        obj = vitviz
        try:
            for k, part in enumerate(dotted.split(".")):
                obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(
                    "vitviz." + ".".join(dotted.split(".")[: k + 1]))
        except (ImportError, AttributeError):
            problems.append(f"vitviz.{dotted} does not exist")
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        keywords = {k.arg: None for k in node.keywords}
        partial = any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in node.args)
        try:
            sig.bind_partial(**keywords) if partial else sig.bind(*node.args, **keywords)
        except TypeError as err:
            problems.append(f"{ast.unparse(node)[:100]}: {err}")
    return problems


def docs_code() -> list[tuple[str, str]]:
    """``(where, code)`` of every Python block and every backticked ``vitviz.<name>(...)`` of README.md,
    bench/README.md and docs/*.md that parses as Python."""
    import ast

    out = []
    for page in [ROOT / "README.md", BENCH / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        pieces = [(m.start(), m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]
        pieces += [(m.start(), re.sub(r"^with (.*) as \w+:$", r"\1", m.group(1)))
                   for m in re.finditer(r"`([^`\n]*\bvitviz\.[\w.]+\([^`\n]*\))`", text)]
        for start, code in pieces:
            try:
                ast.parse(code)
            except SyntaxError:
                continue
            out.append((f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, start) + 1}", code))
    return out


def test_every_vitviz_call_the_docs_show_is_one_its_function_takes():
    """README.md's tables are checked argument by argument (``tests/test_readme.py``); this holds every other
    ``vitviz.<name>(...)`` of the README and the docs pages to the function's signature too."""
    code = docs_code()
    assert len(code) > 50
    problems = [f"{where}: {p}" for where, c in code for p in call_problems(c)]
    assert not problems, "\n".join(problems)
    assert call_problems("vitviz.pos_embed_similarity(m, img_sz=64); vitviz.explain(..., method='x'); "
                         "vitviz.nothing(); vitviz.inspect(m, x); vitviz.plot_explanations_grid(..., signd=True)") == [
        "vitviz.pos_embed_similarity(m, img_sz=64): got an unexpected keyword argument 'img_sz'",
        "vitviz.nothing does not exist", "vitviz.inspect(m, x): too many positional arguments",
        "vitviz.plot_explanations_grid(..., signd=True): got an unexpected keyword argument 'signd'"]


def test_attnlrp_against_chefer_on_cifar10_vit_is_the_recorded_run():
    """docs/explain.md's AttnLRP-versus-Chefer table on 64 CIFAR-10 images and its ``explain`` times are those of
    ``bench/attnlrp_faithfulness.py``'s recorded output (the times quoted, 0.20 s and 0.18 s, had no record)."""
    run = (BENCH / "results" / "attnlrp_faithfulness.txt").read_text()
    times = dict(re.findall(r"explain\('(\w+)'\) on 64 images: median ([\d.]+) s", run))
    page = " ".join((DOCS / "explain.md").read_text().split())
    assert (f"One `explain` call on the 64 images took a median {times['attnlrp']} s for attnlrp and "
            f"{times['chefer']} s for chefer") in page
    rows = re.findall(r"^(\w+) +attnlrp ([\d.]+) +chefer ([\d.]+) +paired difference (\S+ \[\S+ \S+\])$", run, re.M)
    assert [r[0] for r in rows] == ["deletion", "insertion", "positive", "negative"]
    text = (DOCS / "explain.md").read_text()
    for mode, attnlrp, chefer, diff in rows:
        assert re.search(rf"^\| {mode}, \w+ \((?:lower|higher)\) \| {attnlrp} \| {chefer} \| {re.escape(diff)} \|$",
                         text, re.M), mode


def test_every_error_and_warning_class_the_docs_name_has_an_api_page():
    """The API reference listed only the error classes ``vitviz`` exports by name: the warnings docs/trust.md tells a
    caller to filter (``ImageRangeWarning``, ``ImagesLeftOutWarning``, ...) and the finer error classes had no page.
    Every class of ``vitviz.errors`` is now on the API page (``docs/api_build.py``), and every one the pages and the
    README name is among them."""
    import sys

    import vitviz.errors as errors

    sys.path.insert(0, str(DOCS))
    try:
        import api_build
    finally:
        sys.path.remove(str(DOCS))
    classes = {n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.VitvizError)
               and c.__module__ == errors.__name__}
    listed = set(api_build.other_error_classes()) | {n for n, m in api_build.public_names().items()
                                                      if m == "vitviz.errors"}
    assert classes <= listed, sorted(classes - listed)
    text = " ".join(p.read_text() for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))])
    named = set(re.findall(r"\b([A-Z][A-Za-z]*(?:Error|Warning))\b", text)) & set(vars(errors))
    assert {"ImageRangeWarning", "ImagesLeftOutWarning"} <= named  # the check reads the pages
    assert named <= listed, sorted(named - listed)
