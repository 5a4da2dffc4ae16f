"""``bench/gpu_run.sh``, the one script that produces every GPU figure, rehearsed on the CPU (``GPU_RUN_REHEARSAL=1``:
tiny models and shapes, the kernels under Triton's interpreter, nothing installed): every part runs, every command
line it builds is accepted, every JSON file it promises is written with the rows the README's tables read. The
rehearsal's figures mean nothing; what it proves is that the first GPU at hand spends its minutes measuring."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vitviz.core import kernels

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
_spec = importlib.util.spec_from_file_location("bench_attention", BENCH / "attention.py")
attention_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention_bench)
_spec = importlib.util.spec_from_file_location("bench_gpu_tables", BENCH / "gpu_tables.py")
gpu_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_tables)

pytestmark = [pytest.mark.slow,
              pytest.mark.newest_only,  # a GPU run installs into the machine's newest torch: not one of the matrix
              # the rehearsal (the module's fixture, in its first test's time) runs every part on the CPU: some 13
              # minutes on a quiet 2-core machine, past the suite's 900 s on a loaded one; its subprocess's own limit
              pytest.mark.timeout(2400),
              pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                 reason="needs bash and coreutils' timeout"),
              pytest.mark.skipif(not kernels.triton_available(),
                                 reason=f"needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")]

PLAN = "setup graphed tests b16_448 profile l16_448 batch dataset hf tv micro_b16 b16_224 l16_224 faith dataset_torch micro"
PARTS = ["setup", "tests", "profile_timeline_vit_tiny_patch16_224_bf16", "profile_timeline_vit_tiny_patch16_224_fp32",
         "profile_timeline_vit-base-patch16_bf16", "profile_python", "profile_ops", "micro",
         "attention_b16", "attention_graphed", "attention_l16", "attention_hf_vit-base", "attention_hf_vit_b_16",
         "attention_batch", "dataset", "faithfulness"]


def _run(out: Path, *parts: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VITVIZ_HEADMAP", "TRITON_INTERPRET", "GPU_RUN_"))}
    env.update(GPU_RUN_REHEARSAL="1", OUT=str(out), PYTHON=sys.executable, **extra)
    return subprocess.run(["bash", str(BENCH / "gpu_run.sh"), *parts], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=2400)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    return out, _run(out)


def test_every_part_runs_and_reports_its_exit_status(rehearsal):
    out, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert summary.startswith(f"gpu_run parts: {PLAN} ")
    status = dict(re.findall(r"^(\S+): exit (\d+)", summary, flags=re.M))
    for part in PARTS:
        names = [name for name in status if name.startswith(part)]
        assert names, f"{part} did not run:\n{summary}"
        for name in names:  # bench/attention.py exits 3 when a goal is missed (the rehearsal measures none: 0)
            allowed = {"0", str(attention_bench.EXIT_GOAL_MISSED)} if part.startswith("attention") else {"0"}
            assert status[name] in allowed, f"{name}: exit {status[name]}\n{(out / 'run.log').read_text()[-4000:]}"
    assert "SKIPPED" not in summary


def test_the_out_folder_holds_the_thirteen_files_every_table_needs(rehearsal):
    out, _ = rehearsal
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["env.json", "attention_b16.json", "attention_graphed.json", "attention_l16.json", "attention_hf.json",
         "dataset.json", "micro.json", "attention_batch.json", "timeline.json", "faithfulness.json", "run.log",
         "parts.txt", "summary.txt"])
    env = json.loads((out / "env.json").read_text())
    assert env["smoke_max_abs"] < 1e-5 and env["timm_stream_probe"] and env["torch"]
    methods = set(attention_bench.METHODS) - {"grad_rollout", "rollout", "distance", *attention_bench.GRAPHED,
                                               *attention_bench.PREVIOUS_TILES}
    # timm's AttentionExtract: timm models only; the forward LSE: not torchvision's MultiheadAttention
    for tag, model, sizes, want in (
            ("b16", "vit_tiny_patch16_224", {32, 48}, methods), ("l16", "vit_small_patch16_224", {32, 48}, methods),
            ("hf", "hf:vit-base-patch16", {48}, methods - {"timm"}),
            ("hf", "tv:vit_b_16", {48}, methods - {"timm", "rollout_fwdlse"})):
        rows = [r for r in json.loads((out / f"attention_{tag}.json").read_text()) if r["model"] == model]
        for dtype in ("bf16", "fp32"):
            for size in sizes:
                got = [r["method"] for r in rows if r["dtype"] == dtype and r["size"] == size]
                assert sorted(got) == sorted(want), (tag, model, dtype, size)
        assert {(r["dtype"], r["size"]) for r in rows} == {(d, s) for d in ("bf16", "fp32") for s in sizes}
        assert all(r["images_per_s"] > 0 and r["tokens"] > 1 for r in rows)
    graphed = json.loads((out / "attention_graphed.json").read_text())  # on the CPU: the part's eager methods
    assert sorted((r["dtype"], r["method"]) for r in graphed) == sorted(
        (dt, m) for dt in ("bf16", "fp32")
        for m in ("plain", "store", "store_distance", "rollout_kernel", "rollout_fwdlse", "distance_kernel",
                  "rollout_kernel_prev", "distance_kernel_prev"))
    micro = json.loads((out / "micro.json").read_text())
    assert micro and not [r for r in micro if "error" in r]
    assert all(r["max_abs"] < 1e-5 and r["sdpa_ms"] > 0 for r in micro)
    assert {r["dtype"] for r in micro} == {"fp32", "fp32-ieee"}  # micro_b16's rows, then micro's appended
    batches = json.loads((out / "attention_batch.json").read_text())
    assert sorted({(r["dtype"], r["batch"]) for r in batches}) == [("bf16", 3), ("bf16", 4), ("fp32", 3)]
    assert all(sorted(r["method"] for r in batches if (r["dtype"], r["batch"]) == case) == sorted(
        ["plain", "rollout_kernel", "rollout_fwdlse", "distance_kernel"]) for case in {("bf16", 3), ("fp32", 3)})
    timeline = json.loads((out / "timeline.json").read_text())  # one run per dtype, a row per method
    assert [(run["model"], run["dtype"], [r["method"] for r in run["rows"]]) for run in timeline] == [
        (model, dt, ["plain", "rollout_kernel", "rollout_fwdlse", "distance_kernel"])
        for model, dt in (("vit_tiny_patch16_224", "bf16"), ("vit_tiny_patch16_224", "fp32"),
                          ("hf:vit-base-patch16", "bf16"))]
    assert all(0 < r["host_ms"] <= r["total_ms"] for run in timeline for r in run["rows"])
    data = json.loads((out / "dataset.json").read_text())
    assert [r["reduction"] for r in data] == ["plain", "distance", "plain", "distance"]
    assert [r["kernel"] for r in data] == ["on", "on", "on", "off"] and all(r["images"] == 8 for r in data)
    faith = json.loads((out / "faithfulness.json").read_text())
    assert [(r["model"], r["n"], r["batch"]) for r in faith] == [("vit_tiny_patch16_224", 4, 2)]
    assert faith[0]["passes"] > 2 and min(faith[0][k] for k in ("passes_ms", "loop_ms", "read_each_ms")) > 0


def test_the_gpu_tests_are_collected(rehearsal):
    """On the CPU the ``gpu`` tests skip, but they import and are collected: the GPU run will not fail on a typo."""
    out, _ = rehearsal
    log = (out / "run.log").read_text()
    tests = log[log.index("--- tests (limit"):log.index("--- tests: exit")]
    skipped = re.search(r"(\d+) skipped", tests)
    assert skipped and int(skipped.group(1)) >= 15 and not re.search(r"\d+ errors?\b", tests), tests[-2000:]
    assert "deselected" in tests  # only the gpu tests of those files were run


def test_the_readmes_list_the_plan_in_the_scripts_order():
    """README.md, bench/README.md and docs/benchmarks.md name the default plan's parts in the order bench/gpu_run.sh
    runs them (a cut run keeps the first ones): they described an older order (the faithfulness loop before 224 px,
    the kernels alone right after the goal cases, no recorded calls)."""
    script = (BENCH / "gpu_run.sh").read_text()
    plan = re.search(r"^PLAN=\(([^)]*)\)", script, flags=re.M).group(1).split()
    assert " ".join(["setup", *plan]) == PLAN
    readme = " ".join((ROOT / "README.md").read_text().split())
    start = readme.index("One command of under 10 minutes produces the GPU figures")
    bench_readme = (BENCH / "README.md").read_text()
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    doc = doc[doc.index("Everything is prepared as one script"):doc.index("The summary names each part's exit status")]
    for name, text in (("README.md", readme[start:readme.index("$OUT", start)]),
                       ("bench/README.md", bench_readme[bench_readme.index("| `gpu_run.sh` |"):].split("\n")[0]),
                       ("docs/benchmarks.md", doc)):
        named = re.findall(r"`([a-z0-9_]+)`", text)
        assert [n for n in named if n in plan] == plan, (name, named)


def test_past_the_deadline_every_part_is_skipped_and_said_so(tmp_path):
    """The deadline cuts the plan, never the script: a part that would start with under 30 s left is recorded as
    SKIPPED in the summary, aliases expand, an unknown part is named, and the script still ends with its summary."""
    proc = _run(tmp_path, "attn_hf", "micro", "nosuchpart", GPU_RUN_DEADLINE_S="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("gpu_run parts: setup hf tv micro nosuchpart ")
    skipped = re.findall(r"^(\S+): SKIPPED", summary, flags=re.M)
    assert skipped == ["setup", "attention_hf_vit-base-patch16_bf16_48", "attention_hf_vit-base-patch16_fp32_48",
                       "attention_hf_vit_b_16_bf16_48", "attention_hf_vit_b_16_fp32_48", "micro"], summary
    assert "nosuchpart: UNKNOWN part" in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts.txt", "run.log", "summary.txt"]
    tables = gpu_tables.render(tmp_path)  # nothing measured: said so for each file, every part listed
    for name in ("env.json", "attention_b16.json", "attention_graphed.json", "attention_l16.json", "attention_hf.json",
                 "dataset.json", "micro.json"):
        assert f"{name}: not" in tables, name
    assert tables.count(": SKIPPED") == 6 and "- nosuchpart: UNKNOWN part" in tables
    assert "`gpu` tests: no pytest summary in this run." in tables


def test_a_failed_smoke_check_still_writes_the_versions(tmp_path):
    """setup writes env.json (atomically) before its kernel smoke check, and again with the error where the check
    raises: a GPU run whose kernels fail at once still hands back the versions and GPU it failed on, and the tables
    say the check failed (env.json was not written at all, and the tables said only "setup did not run or failed")."""
    proc = _run(tmp_path, "setup", VITVIZ_HEADMAP_BLOCKS="not-four-integers")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^setup: exit 1 ", (tmp_path / "summary.txt").read_text(), flags=re.M)
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["torch"] and env["triton"] and "smoke_max_abs" not in env
    assert env["smoke_error"].startswith("InputError: VITVIZ_HEADMAP_BLOCKS='not-four-integers'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json", "parts.txt", "run.log", "summary.txt"]  # no .tmp
    assert "kernel smoke check FAILED: InputError: VITVIZ_HEADMAP_BLOCKS" in gpu_tables.render(tmp_path)


def _cell(tables: str, first: list[str], column: int) -> str:
    """The cell in ``column`` of the Markdown table row whose first cells are ``first``."""
    for line in tables.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[:len(first)] == first:
            return cells[column]
    raise AssertionError(f"no row {first}")


def _section(tables: str, heading: str) -> str:
    """The text under the ``#### heading`` line, up to the next heading (the same model may head two sections)."""
    start = tables.splitlines(keepends=True).index(f"#### {heading}\n")
    text = "".join(tables.splitlines(keepends=True)[start + 1:])
    return text.split("\n#### ", 1)[0]


SECTIONS = {"b16": "ViT-B/16", "graphed": "ViT-B/16, calls recorded as CUDA graphs (vitviz.graphed)",
            "l16": "ViT-L/16", "hf": "Hugging Face and torchvision ViT-B/16"}


def test_the_tables_show_every_measured_row_and_the_goals_recomputed(rehearsal):
    """bench/gpu_tables.py on the rehearsal's folder: a row per method with its images/s, its time over plain's and
    each goal as recomputed here from the JSON rows; the dataset shares; the parts and the tests' counts."""
    out, _ = rehearsal
    tables = gpu_tables.render(out)
    assert "not written" not in tables and "not measured in this run" not in tables  # every part's file is there
    # the rehearsal measures no memory (--no-memory): the goal rows' memory share, and only it, says so
    measured = [line for line in tables.splitlines() if "not measured" in line]
    assert measured and all(line.split(" | ")[9] == "not measured" and line.count("not measured") == 1
                            for line in measured), measured[:3]
    for tag, heading in SECTIONS.items():
        rows = json.loads((out / f"attention_{tag}.json").read_text())
        section = _section(tables, heading)
        for r in rows:
            plain = next(p for p in rows if (p["model"], p["dtype"], p["size"], p["method"])
                         == (r["model"], r["dtype"], r["size"], "plain"))
            ratio = r["time_s"] / plain["time_s"]
            if r["method"] in attention_bench.PAIRS:  # the goal table: one row per case and streaming method
                goal = attention_bench.GOAL_TIME[r["size"]] if r["size"] in attention_bench.GOAL_TIME else None
                cell = _cell(section, [r["model"], r["dtype"], str(r["size"]), r["method"]], 4)
                assert cell == f"{ratio:.2f}", (r["model"], r["method"], cell)
                verdict = _cell(section, [r["model"], r["dtype"], str(r["size"]), r["method"]], 6)
                assert verdict == ("no goal at this size" if goal is None else
                                   f"<= {goal:.2f}x: {'met' if ratio <= goal else 'MISSED'}")
        assert all(f"--model {r['model']} --dtype {r['dtype']} --sizes {r['size']} --batch {r['batch']}" in section
                   for r in rows)
    batches = json.loads((out / "attention_batch.json").read_text())  # a row per dtype and batch, x per method
    for r in batches:
        if r["method"] != "plain":
            plain = next(p for p in batches
                         if (p["dtype"], p["batch"], p["method"]) == (r["dtype"], r["batch"], "plain"))
            column = 5 + ["rollout_kernel", "rollout_fwdlse", "distance_kernel"].index(r["method"])
            cell = _cell(tables, [r["model"], r["dtype"], str(r["size"]), str(r["batch"])], column)
            assert cell.split()[0] == f"{r['time_s'] / plain['time_s']:.2f}", (cell, r)
    for run in json.loads((out / "timeline.json").read_text()):  # a row per method, its times as measured
        for r in run["rows"]:
            assert _cell(tables, [run["model"], run["dtype"], r["method"]], 4) == f"{r['total_ms']:.2f}", (run, r)
    data = json.loads((out / "dataset.json").read_text())
    fastest = max(r["images_per_s"] for r in data if r["reduction"] == "plain")
    for r in data:
        if r["reduction"] == "distance":
            share = r["images_per_s"] / fastest
            cell = _cell(tables, ["distance", r["kernel"]], 3)
            assert cell == f"{share:.0%}: {'met' if share >= gpu_tables.DATASET_GOAL else 'MISSED'}"
    for r in json.loads((out / "faithfulness.json").read_text()):  # the loop's and the reading loop's ratios
        assert _cell(tables, [r["model"], str(r["size"]), r["autocast"]], 8) == f"{r['loop_x']:.2f}", r
        assert _cell(tables, [r["model"], str(r["size"]), r["autocast"]], 10) == f"{r['read_each_x']:.2f}", r
    assert tables.count("| tiny |") == len(json.loads((out / "micro.json").read_text()))
    assert re.search(r"`gpu` tests: .*\d+ skipped", tables)
    assert all(f"- {name}: exit" in tables for name in ("setup", "tests", "micro", "faithfulness"))


def test_a_later_call_resumes_the_out_folder(tmp_path):
    """The plan is longer than one call of 10 minutes: a later call into the same $OUT keeps what the earlier ones
    wrote (each file was removed the first time a call wrote to it, so a second call lost the first one's rows),
    skips the parts an earlier call ran to its end, and its summary holds every call's parts. Each row names the
    command and versions that measured it, env.json the machine of every call."""
    earlier = {"model": "from an earlier call", "size": 1, "device": "cpu", "n": 1, "batch": 1, "steps": 1.0,
               "autocast": "off", "passes": 1, "passes_ms": 1.0, "loop_ms": 1.0, "read_each_ms": 1.0, "loop_x": 1.0,
               "read_each_x": 1.0, "images_per_s": 1.0}
    (tmp_path / "faithfulness.json").write_text(json.dumps([earlier]))
    for _ in range(2):
        proc = _run(tmp_path, "faith")
        assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "faithfulness.json").read_text())
    assert len(rows) == 2 and rows[0] == earlier  # the second call ran the part no more
    assert rows[1]["command"].startswith("python bench/faithfulness_speed.py --device cpu --model vit_tiny_patch16_224 ")
    assert rows[1]["versions"]["torch"] and rows[1]["versions"]["triton"]
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count("gpu_run parts: setup faith ") == 2 and summary.count("faithfulness: exit 0") == 1
    assert "faith: DONE in an earlier call" in summary and summary.count("setup: exit 0") == 2
    assert len(json.loads((tmp_path / "env.json").read_text())["calls"]) == 2
    tables = gpu_tables.render(tmp_path)
    assert tables.count("gpu_run parts: setup faith ") == 2 and "- faith: DONE in an earlier call" in tables
    assert _cell(tables, ["from an earlier call", "1", "off"], 8) == "1.00"
    proc = _run(tmp_path, "faith", GPU_RUN_REDO="1")  # asked for: measured again, appended
    assert proc.returncode == 0 and len(json.loads((tmp_path / "faithfulness.json").read_text())) == 3
