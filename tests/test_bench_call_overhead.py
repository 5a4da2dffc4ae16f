"""``bench/call_overhead.py --triton-launch``: the kernel-path calls launched through Triton's own launch path on a
stand-in driver (compiled for sm_90, launching nothing), so that the host's cost of Triton's launches is measured
without a GPU. Checked here: the calls really go through Triton's launch path (two launches a layer for rollout,
one for the distance), beside the rows with the launches left out, in one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitviz.core import kernels

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not kernels.triton_available(),
                                 reason=f"needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")]


def test_the_kernel_path_calls_go_through_tritons_launch_path(tmp_path):
    out = tmp_path / "overhead.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compiled here, not taken from another run's cache
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "call_overhead.py"), "--rounds", "1", "--number", "1",
                           "--triton-launch", "--json", str(out)], capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode and "'StandInDriver' object has no attribute" in proc.stderr:
        pytest.skip(f"this Triton asks more of its driver than the stand-in has: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = {row["case"]: row for row in result["rows"]}
    layers = 12  # the bench's ViT-B/16-shaped model
    launched = {"attention_rollout": 2 * layers, "mean_attention_distance": layers}  # rows + fuse; distance alone
    for call, expected in launched.items():
        assert rows[f"{call} (kernel path, Triton's launch path)"]["triton_launches"] == expected, call
        assert rows[f"{call} (kernel path)"]["triton_launches"] == 0, call  # launches left out: Triton not asked
        assert rows[f"{call} (kernel path, Triton's launch path)"]["ms"] > 0
    assert rows["plain forward"]["triton_launches"] == 0
    assert result["triton_launch"] is True and result["triton"]
