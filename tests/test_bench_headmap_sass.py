"""``bench/headmap_sass.py``: the head-map kernels' key loops as the GPU compiler builds them, read from the cubin on a
machine without a GPU. Checked here: the loop finder on a known disassembly, and on real sm_90 builds the finding
the tile candidates rest on (bench/headmap_kernel.py's CANDIDATES, docs/benchmarks.md): 64-row tiles over 8 warps
split each row between two warp groups, so their row reductions go through shared memory behind barriers on every
key tile, which 128-row tiles over 8 warps (one warp group per 64 rows) do not."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitviz.core import kernels

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_headmap_sass", ROOT / "bench" / "headmap_sass.py")
sass_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_bench)

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0030*/                   MUFU.EX2 R3, R3 ;
        /*0040*/              @!P1 BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/                   SHFL.BFLY PT, R5, R4, 0x1, 0x1f ;
        /*0060*/               @P2 BRA `(.L_x_1) ;
.L_x_2:
        /*0070*/                   NOP ;
        /*0080*/                   BRA `(.L_x_2) ;
.L_x_0:
        /*0090*/                   EXIT ;
"""


def test_the_key_loop_is_the_longest_backward_branch():
    ops = sass_bench.key_loop(SASS)
    assert ops == {"HGMMA": 1, "MUFU": 1, "BAR": 1, "SHFL": 1, "BRA": 1}  # not the forward branch, not the spin
    with pytest.raises(RuntimeError, match="no loop"):
        sass_bench.key_loop(SASS.replace("`(.L_x_1)", "`(.L_x_0)").replace("`(.L_x_2)", "`(.L_x_0)"))


def test_resident_warps_follow_registers_and_shared_memory():
    assert sass_bench._resident_warps(90, 8, 92, 40960) == 16  # 92 registers x 256 threads: 2 blocks of 8 warps
    assert sass_bench._resident_warps(90, 8, 40, 16896) == 48  # registers allow 6 blocks, shared memory 12
    assert sass_bench._resident_warps(90, 4, 64, 200 * 1024) == 4  # shared memory: one block
    assert sass_bench._resident_warps(80, 4, 64, 100 * 1024) == 4  # sm_80: 164 KiB, one block of 100 KiB
    assert sass_bench._resident_warps(90, 4, None, 0) is None


@pytest.mark.slow
@pytest.mark.skipif(not kernels.triton_available(),
                    reason=f"needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")
def test_8_warp_64_row_tiles_reduce_rows_through_shared_memory(tmp_path):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "VITVIZ_HEADMAP_BLOCKS")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "headmap_sass.py"), "--dtypes", "bf16", "--blocks",
                           "64,64,8,3", "128,64,8,3", "--json", str(out)], capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode and "'StandInDriver' object has no attribute" in proc.stderr:
        pytest.skip("this Triton asks more of its driver than the stand-in has: "
                    + proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {(r["blocks"], r["kernel"]): r for r in json.loads(out.read_text())}
    assert set(rows) == {(b, k) for b in ("64,64,8,3", "128,64,8,3") for k in ("rows", "fuse", "distance")}
    for (blocks, _), r in rows.items():
        bm, bn, warps, _ = map(int, r["tiles"].split(","))
        assert r["tiles"] == blocks and r["spill_bytes"] == 0 and r["warps_per_sm"] >= warps, r
        assert r["MUFU"] > 0 and r["per_score"] == pytest.approx(r["loop"] * warps * 32 / (bm * bn)), r  # the exp
    # the rows pass reduces each key tile twice (row maximum, row sum): across warp groups on 64-row tiles
    wide, tall = rows[("64,64,8,3", "rows")], rows[("128,64,8,3", "rows")]
    assert wide["STS"] > 0 and wide["BAR"] > tall["BAR"] and tall["STS"] == 0, (wide, tall)
    assert tall["per_score"] < wide["per_score"]
    assert rows[("64,64,8,3", "distance")]["BAR"] > rows[("128,64,8,3", "distance")]["BAR"]
