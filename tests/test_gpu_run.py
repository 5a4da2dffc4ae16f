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

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                 reason="needs bash and coreutils' timeout"),
              pytest.mark.skipif(not kernels.triton_available(),
                                 reason=f"needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")]

PARTS = ["setup", "tests", "micro", "attention_b16", "attention_l16", "attention_hf", "attention_tv", "dataset"]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VITVIZ_HEADMAP", "TRITON_INTERPRET"))}
    env.update(GPU_RUN_REHEARSAL="1", OUT=str(out), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(BENCH / "gpu_run.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    return out, proc


def test_every_part_runs_and_reports_its_exit_status(rehearsal):
    out, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("gpu_run parts: setup tests micro attn_b16 attn_l16 attn_hf dataset")
    status = dict(re.findall(r"^(\S+): exit (\d+)", summary, flags=re.M))
    for part in PARTS:
        names = [name for name in status if name.startswith(part)]
        assert names, f"{part} did not run:\n{summary}"
        for name in names:  # bench/attention.py exits 3 when a goal is missed (always, on the CPU's tiny shapes)
            allowed = {"0", str(attention_bench.EXIT_GOAL_MISSED)} if part.startswith("attention") else {"0"}
            assert status[name] in allowed, f"{name}: exit {status[name]}\n{(out / 'run.log').read_text()[-4000:]}"
    assert "SKIPPED" not in summary


def test_the_json_files_hold_every_row_the_tables_need(rehearsal):
    out, _ = rehearsal
    env = json.loads((out / "env.json").read_text())
    assert env["smoke_max_abs"] < 1e-5 and env["timm_stream_probe"] and env["torch"]
    methods = set(attention_bench.METHODS) - {"grad_rollout", "rollout", "distance"}
    # timm's AttentionExtract: timm models only; the forward LSE: not torchvision's MultiheadAttention
    for tag, want in (("b16", methods), ("l16", methods), ("hf", methods - {"timm"}),
                      ("tv", methods - {"timm", "rollout_fwdlse"})):
        rows = json.loads((out / f"attention_{tag}.json").read_text())
        assert {r["dtype"] for r in rows} == {"bf16", "fp32"}
        for dtype in ("bf16", "fp32"):
            assert {r["method"] for r in rows if r["dtype"] == dtype} == want
        assert all(r["images_per_s"] > 0 and r["tokens"] > 1 for r in rows)
    assert {r["model"] for r in json.loads((out / "attention_hf.json").read_text())} == {"hf:vit-base-patch16"}
    assert {r["model"] for r in json.loads((out / "attention_tv.json").read_text())} == {"tv:vit_b_16"}
    micro = json.loads((out / "micro.json").read_text())
    assert micro and not [r for r in micro if "error" in r]
    assert all(r["max_abs"] < 1e-5 and r["sdpa_ms"] > 0 for r in micro)
    data = json.loads((out / "dataset.json").read_text())
    assert [r["reduction"] for r in data] == ["plain", "distance", "distance", "plain"]
    assert [r["kernel"] for r in data] == ["on", "on", "off", "on"] and all(r["images"] == 8 for r in data)


def test_the_gpu_tests_are_collected(rehearsal):
    """On the CPU the ``gpu`` tests skip, but they import and are collected: the GPU run will not fail on a typo."""
    out, _ = rehearsal
    log = (out / "gpu_tests.log").read_text()
    skipped = re.search(r"(\d+) skipped", log)
    assert skipped and int(skipped.group(1)) >= 15 and not re.search(r"\d+ errors?\b", log), log[-2000:]
