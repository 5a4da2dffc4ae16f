"""The head-map kernels compiled for real GPUs on a machine without one: every variant the entry points launch builds
to a cubin for the H100/H200 (sm_90) and the A100 (sm_80), spills no registers and fits the shared memory of the
smallest CUDA parts.

The interpreter tests (``test_headmap_kernel.py``) check what the kernels compute; they cannot see what a GPU build
does with them: Triton's interpreter accepts code that its compiler rejects, and it has no registers to run out of.
Triton compiles ahead of time without a driver (``triton.compile`` with an explicit ``GPUTarget``; its wheel ships
``ptxas``), so this file records the launches of ``fuse_heads_kernel`` and ``distance_sums_kernel`` (dtypes, head
dims, masks, block shapes as ``headmaps._blocks`` picks them for a GPU) instead of running them, compiles each for
the target and reads ``ptxas``'s own report (``TRITON_DUMP_PTXAS_LOG``):

- zero bytes of register spills, at head dims 64 (ViT-B/L), 80 (ViT-H/14; 88 for ViT-g/14 builds the same
  128-wide tiles) and 160 (the 256-wide tiles);
- ``metadata.shared`` within ``SHARED_LIMIT`` (99 KiB, what one block may take on sm_86/89/120; sm_80 allows 163
  KiB, sm_90 227 KiB), so the kernels launch on consumer GPUs too; the shapes of sm_90's own table (``_blocks``)
  within sm_90's 227 KiB.

``test_the_check_sees_spills_and_oversized_tiles`` compiles the block shapes vitviz used before and sees the check
fail on them. These signatures carry no specialisation; a GPU's first call compiles through Triton's JIT, which
specialises the build on the arguments (pointers and strides divisible by 16, ones as constants) and may allocate
registers otherwise (Triton 3.8, sm_90: the bf16 distance pass with a float bias in 64 x 64 tiles with 4 warps spills
hundreds of bytes here and nothing there; float32's fusing pass in sm_90's table 4 bytes here, nothing there). So
``test_the_kernels_as_tritons_jit_specialises_them_compile_without_spills`` compiles ViT-B/16's launches through
Triton's own launch path on a stand-in driver, as a GPU would, and holds those builds to the same check. What this
file cannot say is how fast the kernels run: that is
``bench/headmap_kernel.py`` on a GPU (``bench/gpu_run.sh``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitviz.core import kernels

pytestmark = pytest.mark.skipif(not kernels.triton_available(),
                                reason=f"needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")

SHARED_LIMIT = 99 * 1024
POINTER = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.uint8: "*u8"}


def launches(monkeypatch, dtype: torch.dtype, d: int, blocks: str | None = None, precision: str | None = None,
             arch: int | None = None) -> dict:
    """The distinct kernel launches of the entry points for ``q, k`` ``(2, 3, 37, d)`` of ``dtype``: the head mean
    (no mask), the head max under a bool mask, the head min under a causal mask, and the distance sums without a
    mask and under a float bias per head, with the block shapes ``_blocks`` picks for a GPU of compute capability
    ``arch`` (None: one without a table of its own). Recorded at ``headmaps._launch``, not run.
    ``{key: (kernel, signature, constexprs, options)}``."""
    from vitviz.core.kernels import headmaps

    assert not headmaps.interpreting(), "this process must compile for GPUs, not interpret"
    monkeypatch.setattr(headmaps, "_arch", lambda device: arch)
    if blocks is None:
        monkeypatch.delenv("VITVIZ_HEADMAP_BLOCKS", raising=False)
    else:
        monkeypatch.setenv("VITVIZ_HEADMAP_BLOCKS", blocks)
    seen: dict = {}

    def record(kernel, grid, args, meta):
        options = {key: meta[key] for key in ("num_warps", "num_stages")}
        constexprs = {key: value for key, value in meta.items() if key not in options}
        names = [name for name in kernel.arg_names if name not in constexprs]
        assert len(names) == len(args), (names, len(args))
        signature = {}
        for name in kernel.arg_names:
            if name in constexprs:
                signature[name] = "constexpr"
                continue
            value = args[names.index(name)]
            if isinstance(value, torch.Tensor):
                signature[name] = POINTER[value.dtype]
            elif isinstance(value, float):
                signature[name] = "fp32"
            else:
                assert isinstance(value, int) and -2**31 <= value < 2**31, (name, value)
                signature[name] = "i32"
        key = (kernel.fn.__name__, tuple(signature.items()), tuple(sorted(constexprs.items())),
               tuple(sorted(options.items())))
        seen[key] = (kernel, signature, constexprs, options)

    monkeypatch.setattr(headmaps, "_launch", record)
    b, h, n = 2, 3, 37
    q, k = torch.zeros(b, h, n, d, dtype=dtype), torch.zeros(b, h, n, d, dtype=dtype)
    headmaps.fuse_heads_kernel(q, k, d ** -0.5, "mean", precision=precision)
    headmaps.fuse_heads_kernel(q, k, d ** -0.5, "max", attn_mask=torch.ones(n, n, dtype=torch.bool),
                               precision=precision)
    headmaps.fuse_heads_kernel(q, k, d ** -0.5, "min", is_causal=True, precision=precision)
    headmaps.distance_sums_kernel(q, k, d ** -0.5, torch.ones(n - 1, n - 1), 1, precision=precision)
    headmaps.distance_sums_kernel(q, k, d ** -0.5, torch.ones(n - 1, n - 1), 1, attn_mask=torch.zeros(h, n, n),
                                  precision=precision)
    assert len(seen) >= 7, list(seen)  # rows: plain, bool, causal, distance, distance + bias; fuse: mean, max, min
    return seen


def compiled(kernel, signature: dict, constexprs: dict, options: dict, arch: int, tmp_path,
             monkeypatch) -> dict:
    """Compile one launch for ``sm_<arch>``; its shared memory, registers and spill bytes from ptxas's report."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not hasattr(getattr(getattr(triton, "knobs", None), "nvidia", None), "dump_ptxas_log"):
        pytest.skip(f"Triton {triton.__version__} cannot print ptxas's report (TRITON_DUMP_PTXAS_LOG)")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))  # a cache hit would skip ptxas
    monkeypatch.setenv("TRITON_DUMP_PTXAS_LOG", "1")
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        binary = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32),
                                options={**options, "enable_fp_fusion": True})
    log = report.getvalue()
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    registers = re.search(r"Used (\d+) registers", log)
    assert spills and registers, f"no ptxas report for {kernel.fn.__name__} on sm_{arch}:\n{log[-2000:]}"
    assert binary.asm.get("cubin"), "no cubin"
    return {"shared": int(binary.metadata.shared), "registers": int(registers.group(1)),
            "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2))}


def problems(usage: dict, limit: int = SHARED_LIMIT, spill: int = 0) -> list[str]:
    """What is wrong with a compiled launch: more shared memory than ``limit``, more spill bytes than ``spill``."""
    found = []
    if usage["shared"] > limit:
        found.append(f"{usage['shared']} bytes of shared memory > {limit}")
    if usage["spill_stores"] > spill or usage["spill_loads"] > spill:
        found.append(f"{usage['spill_stores']} bytes of spill stores, {usage['spill_loads']} of spill loads")
    return found


DTYPES = {"bf16": (torch.bfloat16, None), "fp16": (torch.float16, None), "fp32": (torch.float32, None),
          "fp32-ieee": (torch.float32, "ieee")}  # float32 with vitviz's precision (3xTF32 at d <= 64), and exact
# sm_90 (the H100/H200 the benchmarks run on) at every head-dim class; sm_80 (older ptxas) at ViT-B's
CASES = ([(90, dt, d) for dt in ("bf16", "fp16", "fp32") for d in (64, 80, 160)]
         + [(90, "fp32-ieee", 64)] + [(80, dt, 64) for dt in DTYPES])


@pytest.mark.parametrize(("arch", "dt", "d"), CASES, ids=[f"sm{a}-{dt}-d{d}" for a, dt, d in CASES])
def test_every_variant_compiles_without_spills(monkeypatch, tmp_path, arch, dt, d):
    """The shapes every GPU takes (no table of its own), compiled for sm_90 and sm_80, within 99 KiB."""
    dtype, precision = DTYPES[dt]
    failures = []
    for (name, *_), (kernel, signature, constexprs, options) in launches(monkeypatch, dtype, d,
                                                                         precision=precision).items():
        usage = compiled(kernel, signature, constexprs, options, arch, tmp_path, monkeypatch)
        found = problems(usage)
        if found:
            failures.append(f"{name} {constexprs} {options}: {'; '.join(found)} ({usage})")
    assert not failures, "\n".join(failures)


SM90_SHARED = 227 * 1024  # what one block may take on sm_90
# what a launch in sm_90's table may spill when built from its bare signature, without the JIT's specialisation on
# its arguments (strides divisible by 16 and the like): the distance pass (64 x 64, 4 warps) 68 to 204 bytes under
# Triton 3.8, 324 under 3.9, float32's fusing pass (128 x 64) 124 under 3.9. As a GPU's first call builds them
# (test_the_kernels_as_tritons_jit_specialises_them_compile_without_spills) they spill nothing, and the H200
# measured them fastest all the same (headmaps._blocks)
SM90_TABLE_SPILL = 512
SM90_CASES = [(dt, d) for dt in ("bf16", "fp16", "fp32") for d in (64, 80)] + [("fp32-ieee", 64)]


@pytest.mark.parametrize(("dt", "d"), SM90_CASES, ids=[f"{dt}-d{d}" for dt, d in SM90_CASES])
def test_the_sm90_table_compiles_without_spills(monkeypatch, tmp_path, dt, d):
    """The shapes ``_blocks`` picks on sm_90 (H100, H200), compiled for sm_90: no spills, within the 227 KiB of
    shared memory a block may take there. At head dim 64 the rows pass without a bias, the distance pass and the
    fusing passes take ``SM90_TABLE``'s tiles; every other launch is the shape every GPU takes. One exception: a
    launch in the table's tiles, built from its bare signature, may spill up to ``SM90_TABLE_SPILL`` bytes (none
    as the JIT builds it)."""
    from vitviz.core.kernels import headmaps

    dtype, precision = DTYPES[dt]
    failures, tables = [], 0
    for (name, *_), (kernel, signature, constexprs, options) in launches(monkeypatch, dtype, d, precision=precision,
                                                                         arch=90).items():
        kind = "fuse" if name == "_fuse_kernel" else "distance" if constexprs["WITH_DIST"] else "rows"
        table = (constexprs["BLOCK_M"], constexprs["BLOCK_N"], options["num_warps"], options["num_stages"]) == (
            headmaps._sm90_table(kind, dtype))
        tables += table
        usage = compiled(kernel, signature, constexprs, options, 90, tmp_path, monkeypatch)
        found = problems(usage, SM90_SHARED, spill=SM90_TABLE_SPILL if table else 0)
        if found:
            failures.append(f"{name} {constexprs} {options}: {'; '.join(found)} ({usage})")
    assert not failures, "\n".join(failures)
    assert tables == (0 if d > 64 or precision == "ieee" else 3), tables


def biased_distance(launch: tuple) -> bool:
    """Whether a recorded launch is the distance pass under a float bias."""
    kernel, _, constexprs, _ = launch
    return kernel.fn.__name__ == "_rows_kernel" and constexprs["WITH_DIST"] and constexprs["BIAS_KIND"] == 1


def test_the_check_sees_spills_and_oversized_tiles(monkeypatch, tmp_path):
    """The block shapes of vitviz 0.1 (64 x 64 tiles with 4 warps and 3 stages for head dims <= 64, else 64 x 32 with
    4 warps and 2 stages, whatever the dtype) fail the check: the distance pass with a float bias spills in bf16 at
    ViT-B's head dim, and in float32 at head dim 160 both spills and outgrows 99 KiB of shared memory (so under
    Triton 3.8 and 3.9 alike; 3.8 builds the float32 fusing pass with a bias in too much shared memory but no
    spills)."""
    seen = launches(monkeypatch, torch.bfloat16, 64, blocks="64,64,4,3")  # the dtype's own precision
    (kernel, signature, constexprs, options), = [v for v in seen.values() if biased_distance(v)]
    usage = compiled(kernel, signature, constexprs, options, 90, tmp_path, monkeypatch)
    assert usage["spill_stores"] > 256 and usage["shared"] <= SHARED_LIMIT, usage

    seen = launches(monkeypatch, torch.float32, 160, blocks="64,32,4,2", precision="ieee")
    (kernel, signature, constexprs, options), = [v for v in seen.values() if biased_distance(v)]
    usage = compiled(kernel, signature, constexprs, options, 90, tmp_path, monkeypatch)
    assert usage["shared"] > SHARED_LIMIT and usage["spill_stores"] > 256, usage
    assert len(problems(usage)) == 2


JIT_CHILD = r"""
import contextlib, importlib.util, io, json, re, sys
import torch
spec = importlib.util.spec_from_file_location("call_overhead", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
from triton.runtime.driver import driver
from vitviz.analysis.distance import patch_distance_matrix
from vitviz.core.kernels import headmaps

arch = int(sys.argv[2])
driver.set_active(bench.StandInDriver(arch))
headmaps._arch = lambda device: arch  # the block shapes this GPU takes
assert not headmaps.interpreting()
b, h, n, d, grid = 2, 12, 785, 64, 28  # ViT-B/16 at 448 px


def widths(before):  # the global loads of the builds made since ``before``, by width
    found = [".v4" if ".v4" in op else ".v2" if ".v2" in op else "scalar"
             for c in bench.StandInDriver.builds(headmaps._kernels()) if id(c) not in before
             for op in re.findall(r"ld\.global[.\w]*", c.asm["ptx"])]
    return {w: found.count(w) for w in set(found)}


found, loads_by_width = [], []
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    q, k, _ = torch.randn(b, n, 3, h, d, dtype=dtype).permute(2, 0, 3, 1, 4)  # timm's qkv layout
    q224, k224, _ = torch.randn(b, 197, 3, h, d, dtype=dtype).permute(2, 0, 3, 1, 4)  # 224 px: P = 196 patches
    calls = [lambda: headmaps.fuse_heads_kernel(q, k, d ** -0.5, "mean"),
             lambda: headmaps.fuse_heads_kernel(q, k, d ** -0.5, "max", attn_mask=torch.ones(n, n, dtype=torch.bool)),
             lambda: headmaps.fuse_heads_kernel(q, k, d ** -0.5, "min", is_causal=True),
             lambda: headmaps.distance_sums_kernel(q, k, d ** -0.5, patch_distance_matrix(grid, 16), 1),
             lambda: headmaps.distance_sums_kernel(q, k, d ** -0.5, patch_distance_matrix(grid, 16), 1,
                                                   attn_mask=torch.zeros(h, n, n)),
             lambda: headmaps.distance_sums_kernel(q224, k224, d ** -0.5, patch_distance_matrix(14, 16), 1)]
    for i, call in enumerate(calls):
        log = io.StringIO()
        before = {id(c) for c in bench.StandInDriver.builds(headmaps._kernels())}
        try:
            with contextlib.redirect_stdout(log):
                call()
        except AttributeError as err:  # a Triton asking its driver for more than the stand-in has
            if "StandInDriver" not in str(err) and "Utils" not in str(err):
                raise
            print(json.dumps({"unsupported": str(err)}))
            sys.exit(0)
        for name, stores, loads in re.findall(
                r"Function properties for (\w+)\s+\d+ bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                r"loads", log.getvalue()):
            found.append([str(dtype), name, int(stores), int(loads)])
        if i in (3, 5):  # the distance pass without a mask, at 448 and 224 px: its global loads, by width
            loads_by_width.append([str(dtype), {3: n, 5: 197}[i], widths(before)])
shared = [int(c.metadata.shared) for c in bench.StandInDriver.builds(headmaps._kernels())]
print(json.dumps({"spills": found, "shared": shared, "launches": bench.StandInDriver.launches,
                  "distance_loads": loads_by_width}))
"""


@pytest.mark.parametrize("arch", [90, 80])
def test_the_kernels_as_tritons_jit_specialises_them_compile_without_spills(tmp_path, arch):
    """The launches of ViT-B/16 at 448 px (timm's q and k, views of one qkv tensor) compiled through Triton's own
    launch path, as a GPU's first call compiles them: the JIT specialises the build on its arguments (pointers and
    strides divisible by 16, unit strides and a prefix of one token as constants), which the signatures above leave
    out. Every build spills nothing and fits the GPU's shared memory (sm_90's table on sm_90), and the distance
    pass without a mask reads global memory in 128-bit loads only (its PTX). Run in a child
    process on ``bench/call_overhead.py``'s stand-in driver (compiles for ``sm_<arch>``, launches nothing)."""
    import triton

    if not hasattr(getattr(triton, "knobs", None), "nvidia"):
        pytest.skip(f"Triton {triton.__version__} cannot print ptxas's report (TRITON_DUMP_PTXAS_LOG)")
    bench = Path(__file__).resolve().parents[1] / "bench" / "call_overhead.py"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), TRITON_DUMP_PTXAS_LOG="1")
    proc = subprocess.run([sys.executable, "-c", JIT_CHILD, str(bench), str(arch)], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "unsupported" in report:
        pytest.skip(f"Triton {triton.__version__} asks more of its driver than the stand-in has: {report['unsupported']}")
    assert report["launches"] == 3 * (2 + 2 + 2 + 1 + 1 + 1), report["launches"]  # every call went through Triton
    assert len(report["spills"]) >= 3 * 5, report["spills"]  # a ptxas report per build (builds shared by calls)
    spilled = [entry for entry in report["spills"] if entry[2] or entry[3]]
    assert not spilled, f"sm_{arch}: builds spill registers: {spilled}"
    assert max(report["shared"]) <= {90: SM90_SHARED, 80: 163 * 1024}[arch], report["shared"]
    # the distance pass walks the tokens patches first, so its distance tiles are rows of P = 784 floats read from
    # their start: aligned, 128 bits a load (offset by the prefix token, as before, they took 16 scalar loads a
    # tile); at 224 px the 196 x 196 matrix is padded to 208 x 208 (unpadded: 16 scalar loads a tile again)
    assert len(report["distance_loads"]) == 6, report["distance_loads"]  # a build per dtype and token count
    for dtype, n, widths in report["distance_loads"]:
        assert set(widths) == {".v4"}, f"sm_{arch} {dtype}, N = {n}: the distance pass's loads by width: {widths}"
