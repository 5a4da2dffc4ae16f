"""Every Python code block of README.md runs, offline, in order, in one namespace (as a reader would paste them).

A block that cannot run offline is skipped *by name* in ``OFFLINE_SKIPS`` with the reason, and the README says so
next to it; a name in ``OFFLINE_SKIPS`` that no longer exists fails the suite, so the list cannot rot. The few
names the README takes as given (a user's own ViT ``my_vit``, an image file ``cat.jpg``) are set up here exactly as
the README describes them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_docs_pages import page_blocks, run_blocks
from torch import nn
from tutorial_vit import Block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# block name -> why it cannot run offline (the README says so beside the block)
OFFLINE_SKIPS = {
    "Pretrained weights #1": "loads weight files downloaded elsewhere (model.safetensors, ViT-*.npz)",
}


def readme_blocks() -> list[tuple[str, str]]:
    """``(name, code)`` of each ```python block; the name is the nearest heading above it (outside code blocks) and
    its ordinal there (``test_docs_pages.page_blocks``, without the page's name)."""
    return [(name.split(": ", 1)[1], code) for name, code in page_blocks(README)]


class MyViT(nn.Module):
    """The README's "anything else" ViT: its own module names, described with ``vitviz.describe``."""

    def __init__(self, dim: int = 32, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.stem = nn.Module()
        self.stem.conv = nn.Conv2d(3, dim, kernel_size=16, stride=16)
        self.encoder = nn.Module()
        self.encoder.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder.pos = nn.Parameter(torch.randn(1, 1 + 14 * 14, dim) * 0.02)
        self.encoder.layers = nn.ModuleList([nn.Module() for _ in range(depth)])
        for layer in self.encoder.layers:
            layer.attn = Block(dim, heads, with_dropout_module=False).attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem.conv(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.encoder.cls.expand(len(x), -1, -1), x], 1) + self.encoder.pos
        for layer in self.encoder.layers:
            x = x + layer.attn(x)
        return x[:, 0]


def test_readme_blocks_are_found_and_skips_exist():
    names = [n for n, _ in readme_blocks()]
    assert len(names) >= 4
    missing = set(OFFLINE_SKIPS) - set(names)
    assert not missing, f"OFFLINE_SKIPS names blocks the README no longer has: {missing}"
    for name in OFFLINE_SKIPS:  # the README tells the reader too
        heading = name.rsplit(" #", 1)[0]
        section = README.read_text().split(heading, 1)[1][:1500].lower()
        assert "offline" in section, f"the README's {heading!r} section should say its example needs files"


@pytest.mark.slow
def test_every_readme_python_block_runs_offline(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from skimage import data as skdata

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    Image.fromarray(skdata.chelsea()).save(tmp_path / "cat.jpg")
    namespace: dict = {"my_vit": MyViT().eval(), "__name__": "__readme__"}
    ran = run_blocks(readme_blocks(), namespace, "README.md", lambda name: name in OFFLINE_SKIPS)
    assert ran, "no README block ran"
    assert (tmp_path / "pos_embed.pdf").stat().st_size > 0


def test_readme_names_only_public_calls():
    """Every ``vitviz.<name>(`` the README shows resolves (the old ``vitviz.cards.reference_table()`` did not)."""
    import importlib

    import vitviz

    text = README.read_text()
    for dotted in sorted(set(re.findall(r"\bvitviz((?:\.[A-Za-z_]\w*)+)\(", text))):
        parts = dotted.strip(".").split(".")
        obj = vitviz
        for k, part in enumerate(parts):
            if not hasattr(obj, part):  # a submodule not yet imported
                obj = importlib.import_module("vitviz." + ".".join(parts[: k + 1]))
            else:
                obj = getattr(obj, part)
        assert callable(obj), f"vitviz{dotted} in README.md is not callable"


def _split_arguments(text: str) -> list[str]:
    """``"a, b=(1, 2), *, c=..."`` -> ``["a", "b=(1, 2)", "*", "c=..."]``: commas inside brackets do not split."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [a for a in [*out, cur.strip()] if a]


def readme_call_signatures() -> list[tuple[str, list[str]]]:
    """``(dotted name, arguments)`` of each call the README's tables spell out with its arguments, e.g.
    ``vitviz.load_model(name_or_path, *, pretrained=False, ...)``; ``vitviz.plot_attention_distance(_grid)``
    (a name's variant, not a call) is left out."""
    calls = []
    for line in README.read_text().splitlines():
        if line.startswith("| `"):
            for m in re.finditer(r"`(?:with )?vitviz\.([\w.]+)\((.*?)\)(?: as \w+:)?`", line.split("|")[1]):
                if not m.group(2).startswith("_"):
                    calls.append((m.group(1), _split_arguments(m.group(2))))
    return calls


def readme_signature_problems(calls: list[tuple[str, list[str]]]) -> list[str]:
    """What a README call shows that its function does not take: an argument shown before ``*`` (so passable by
    position) that is keyword-only, more leading positional values than the function has positional parameters, a
    named parameter it does not have (and no ``**`` to take it), a literal default it does not have, or a ``**name``
    under another name."""
    import ast
    import importlib
    import inspect

    import vitviz

    problems = []
    for dotted, arguments in calls:
        obj: object = vitviz
        parts = dotted.split(".")
        for k, part in enumerate(parts):
            obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(
                "vitviz." + ".".join(parts[: k + 1]))
        params = inspect.signature(obj).parameters
        kinds = {p.kind for p in params.values()}
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keyword_only, bare = False, 0
        for arg in arguments:
            if arg == "*":
                keyword_only = True
            elif arg.startswith("**"):
                var = [p.name for p in params.values() if p.kind is p.VAR_KEYWORD]
                if var != [arg[2:]]:
                    problems.append(f"vitviz.{dotted}: README shows {arg}, the function takes {var or 'none'}")
            elif "=" not in arg:  # a positional value or placeholder (`model`, `"figs/name"`)
                bare += 1
                if bare > len(positional) and inspect.Parameter.VAR_POSITIONAL not in kinds:
                    problems.append(f"vitviz.{dotted}: README passes {bare} values by position, the function "
                                    f"takes {len(positional)}")
            else:
                name, default = (t.strip() for t in arg.split("=", 1))
                p = params.get(name)
                if p is None:
                    if inspect.Parameter.VAR_KEYWORD not in kinds:
                        problems.append(f"vitviz.{dotted}: README shows {name}=, the function has no such parameter")
                    continue
                if not keyword_only and p.kind is p.KEYWORD_ONLY:
                    problems.append(f"vitviz.{dotted}: README shows {name}= before `*`, but it is keyword-only")
                if default != "...":
                    try:
                        value = ast.literal_eval(default)
                    except (ValueError, SyntaxError):
                        value = default  # a name, e.g. a dtype: compared as the text the README shows
                    if p.default != value:
                        problems.append(f"vitviz.{dotted}: README shows {name}={default}, the default is "
                                        f"{p.default!r}")
    return problems


def test_the_readme_tables_show_each_call_as_its_function_takes_it():
    """The README's call table is what a reader types: a parameter it shows before ``*`` can be passed by
    position, a default it shows is the default (``load_model``'s keyword-only parameters were once shown as
    positional, ``**timm_kwargs`` under another name than the function's ``**kwargs``)."""
    calls = readme_call_signatures()
    assert {"load_model", "pos_embed_similarity", "save_figure", "explain"} <= {d for d, _ in calls}
    assert readme_signature_problems(calls) == []
    broken = [("load_model", ["name_or_path", "pretrained=False", "**timm_kwargs"]),
              ("pos_embed_similarity", ["model", "img_size=448"]), ("inspect", ["model", "spec"])]
    assert len(readme_signature_problems(broken)) == 5


def test_attnlrp_coverage_figures_are_the_recorded_run():
    """The AttnLRP coverage figures in README.md and docs/explain.md, at the tokens and at the pixels, are those of
    bench/attnlrp_coverage.py's recorded run (``bench/results/attnlrp_coverage.json``), and that run found nothing
    wrong: at the pixels only the hybrids are refused, pointed to the tokens."""
    import json

    run = json.loads((ROOT / "bench/results/attnlrp_coverage.json").read_text())
    arch, models = run["architectures"], run["models"]
    assert set(arch) <= {"supported", "refused", "unbuilt"}  # no FAILED architecture
    readme = " ".join(README.read_text().split())
    total = sum(arch.values())
    assert (f"all {total} architectures" if arch["supported"] == total
            else f"{arch['supported']} of the {total} architectures") in readme
    assert f"{models['supported']} models" in readme
    explain = (ROOT / "docs/explain.md").read_text()
    for status in arch:
        assert f"| {arch[status]} | {models[status]} |" in explain
    if set(arch) == {"supported"}:
        assert "None is refused and none failed" in explain
    worst = max(row.get("conservation_rel_error", 0.0) for row in run["rows"])
    assert f"at most {worst:.1e}" in explain
    # at the pixels: every supported architecture read there too, or refused with its reason, none failed
    pixels = run["pixels"]
    assert set(pixels["architectures"]) <= {"supported", "refused"}
    assert sum(pixels["architectures"].values()) == arch["supported"]
    table = explain[explain.index('| at the pixels (`read_at="pixels"`)'):]
    for status in pixels["architectures"]:
        assert f"| {pixels['architectures'][status]} | {pixels['models'][status]} |" in table.split("\n\n")[0]
    worst = max(row.get("pixels_rel_error", 0.0) for row in run["rows"])
    assert f"at most {worst:.1e}" in table
    assert f"{pixels['models']['supported']} of those {models['supported']} models" in readme
    refused = [row for row in run["rows"] if row.get("pixels") == "refused"]
    assert all("HybridEmbed" in row["architecture"] and "read_at='tokens'" in row["pixels_reason"] for row in refused)


def test_cpu_dataset_and_call_overhead_figures_are_the_recorded_run():
    """The README's CPU row of the dataset path (images/s and peak memory ranges, the share of a plain forward) and
    its host time of a recorded call are those of the JSON in ``bench/results/cpu_epyc_run_1/``, and the machine
    named is the one that run recorded."""
    import json

    run = ROOT / "bench/results/cpu_epyc_run_1"
    env = json.loads((run / "env.json").read_text())
    distance = [json.loads((run / f"dataset_distance_{i}.json").read_text()) for i in (1, 2, 3)]
    plain = [json.loads((run / f"dataset_plain_{i}.json").read_text()) for i in (1, 2, 3)]
    assert {r["reduction"] for r in distance} == {"distance"} and {r["reduction"] for r in plain} == {"plain"}
    assert all(r["images"] == 10000 and r["threads"] == 1 and r["workers"] == 1 for r in distance + plain)
    readme = " ".join(README.read_text().split())
    row = next(line for line in README.read_text().splitlines() if line.startswith(f"| 2-core {env['cpu']} CPU"))

    def span(rows, key, fmt="{:.0f}"):
        vals = [r[key] for r in rows]
        return f"{fmt.format(min(vals))}-{fmt.format(max(vals))}"

    share = sum(r["images_per_s"] for r in distance) / sum(r["images_per_s"] for r in plain)
    assert f"{span(distance, 'images_per_s')} (3 runs; {share:.0%} of a plain forward's " \
           f"{span(plain, 'images_per_s')} over the same loader)" in row
    assert f"{span(distance, 'peak_mib')} MiB resident" in row
    calls = {r["case"]: r["ms"] for r in json.loads((run / "call_overhead.json").read_text())["rows"]}
    graphed, eager = calls["attention_rollout (graphed, replay left out)"], calls["attention_rollout (kernel path)"]
    assert (f"On a 2-core {env['cpu']} CPU the host's part of a recorded rollout call is {graphed:.2f} ms against "
            f"{eager:.2f} ms for the eager call on the kernels' path, {graphed / eager:.3f}x") in readme
