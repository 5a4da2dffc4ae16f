"""What the GPU compiler makes of each head-map kernel's key loop, per block shape, on a machine without a GPU.

For one layer's shapes (``--shape``, as ``bench/headmap_kernel.py`` names them) and each dtype and block shape
(``BM,BN,WARPS,STAGES``, as ``VITVIZ_HEADMAP_BLOCKS`` takes them; ``default``: vitviz's choice for ``sm_<arch>``),
the three launches of ``vitviz.core.kernels.headmaps`` are compiled through Triton's own JIT on
``bench/call_overhead.py``'s stand-in driver (it compiles for ``sm_<arch>`` and launches nothing), as a GPU's first
call compiles them, with timm's ``q`` and ``k`` (views of one ``qkv`` tensor) and the distance matrix of the grid:

- ``rows``: the row maximum and sum (``row_logsumexp``, rollout's first pass);
- ``fuse``: the head mean given those (``fuse_heads_kernel``, rollout's second pass);
- ``distance``: the distance sums (``distance_sums_kernel``, one pass).

Each cubin is disassembled with the ``nvdisasm`` that Triton's wheel ships, and its key loop (the longest backward
branch: the walk over key tiles, or over heads in the fusing pass) is counted: instructions per thread and per score
(``instructions x threads / (BM x BN)``: what one score costs the SM's issue slots), and among them ``BAR``
(barriers), ``STS``/``LDS`` (shared-memory stores and loads outside the pipelined operand tiles), ``SHFL`` (warp
shuffles), ``MUFU`` (the special-function unit: ``exp``), ``LDG`` (global loads outside ``cp.async``); with the
shared memory a block takes, ptxas's registers and spill bytes (``TRITON_DUMP_PTXAS_LOG``) and the warps an SM can
hold at once of the kernel (from those).

A proxy, not a timing: it shows the code a shape makes (a row reduction that crosses warps costs shared-memory
stores, a barrier and loads on every key tile; a tile loaded in one layout and used in another goes through shared
memory), and where two shapes differ in it, which to measure (``bench/headmap_kernel.py`` on a GPU decides).

    python bench/headmap_sass.py [--arch 90] [--shape vit_b16_448] [--dtypes bf16 fp32] [--blocks default ...]
                                 [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COUNTED = ("BAR", "STS", "LDS", "SHFL", "MUFU", "LDG")
KERNELS = ("rows", "fuse", "distance")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nvdisasm() -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not path.exists():
        raise SystemExit(f"headmap_sass: Triton {triton.__version__} ships no nvdisasm at {path}; this tool needs it")
    return str(path)


_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def key_loop(sass: str) -> collections.Counter:
    """The opcodes (their first dotted part) of the longest backward branch's body in ``nvdisasm`` output."""
    lines = sass.splitlines()
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line.strip())}
    start = end = -1
    for i, line in enumerate(lines):
        target = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if target and labels.get(target.group(1), i) < i and i - labels[target.group(1)] > end - start:
            start, end = labels[target.group(1)], i
    if start < 0:
        raise RuntimeError("no loop (backward branch) in the disassembly")
    return collections.Counter(m.group(1) for m in map(_OPCODE.match, lines[start:end + 1]) if m)


def _resident_warps(arch: int, warps: int, registers: int | None, shared: int) -> int | None:
    """Warps an SM holds at once of this kernel (occupancy): blocks limited by registers (64 Ki per SM, allocated
    per warp in units of 256), shared memory (228 KiB per SM on sm_90, 164 KiB on sm_80, 1 KiB of it reserved per
    block) and 64 warps per SM."""
    if registers is None:
        return None
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * warps)
    by_shared = ({90: 228, 80: 164}[arch] * 1024) // (shared + 1024)
    return min(by_registers, by_shared, 64 // warps) * warps


def _call(headmaps, name: str, lse, dist, **operands) -> None:
    if name == "rows":
        headmaps.row_logsumexp(**operands)
    elif name == "fuse":
        headmaps.fuse_heads_kernel(how="mean", lse=lse, **operands)
    else:
        headmaps.distance_sums_kernel(distances=dist, num_prefix_tokens=1, **operands)


def analyse(arch: int, shape: str, dtypes: list[str], blocks: list[str], micro=None) -> list[dict]:
    """One row per dtype, block shape and kernel; compiles in this process (the stand-in driver is made active).
    ``micro``: ``bench/headmap_kernel.py`` as a module (its shapes and dtypes), when the caller has it."""
    import torch
    from triton.runtime.driver import driver

    from vitviz.analysis.distance import patch_distance_matrix
    from vitviz.core.kernels import headmaps

    micro = micro or _module("headmap_kernel")
    shapes, dtype_names = micro.SHAPES, micro.DTYPES
    stand_in = _module("call_overhead").StandInDriver
    driver.set_active(stand_in(arch))
    headmaps._arch = lambda device: arch  # the block shapes this GPU takes
    _, h, n, d, _ = shapes[shape]
    b, grid = 2, round((n - 1) ** 0.5)
    if grid * grid + 1 != n:
        raise SystemExit(f"headmap_sass: {shape} has {n} tokens, not a square grid and one class token")
    nvdisasm, rows, launched = _nvdisasm(), [], []
    launch = headmaps._launch

    def recorded(kernel, grid_, args, meta):  # the block shape each launch took, then Triton's own launch path
        launched.append(meta)
        launch(kernel, grid_, args, meta)

    headmaps._launch = recorded
    for dt in dtypes:
        dtype, precision = getattr(torch, dtype_names[dt][0]), dtype_names[dt][1]
        q, k, _ = torch.randn(b, n, 3, h, d, dtype=dtype).permute(2, 0, 3, 1, 4)  # timm's qkv layout
        lse = torch.zeros(b, h, n)
        dist = patch_distance_matrix(grid, 16)
        operands = dict(q=q, k=k, scale=d ** -0.5, precision=precision)
        for config in blocks:
            if config == "default":
                os.environ.pop("VITVIZ_HEADMAP_BLOCKS", None)
            else:
                os.environ["VITVIZ_HEADMAP_BLOCKS"] = config
            for name in KERNELS:
                seen = {id(c) for c in stand_in.builds(headmaps._kernels())}
                log = io.StringIO()
                launched.clear()
                with contextlib.redirect_stdout(log):
                    _call(headmaps, name, lse, dist, **operands)
                new = [c for c in stand_in.builds(headmaps._kernels()) if id(c) not in seen]
                if len(launched) != 1:
                    raise RuntimeError(f"{dt} {config} {name}: {len(launched)} launches, expected 1")
                meta = launched[0]
                bm, bn, warps, stages = (meta[key] for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
                same = [r for r in rows if (r["dtype"], r["kernel"], r["tiles"]) == (dt, name, f"{bm},{bn},{warps},"
                                                                                     f"{stages}")]
                if not new and same:  # "default" is one of the shapes already compiled: the same build
                    rows.append({**same[0], "blocks": config})
                    continue
                if len(new) != 1:
                    raise RuntimeError(f"{dt} {config} {name}: {len(new)} new builds, expected 1")
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(new[0].asm["cubin"])
                    f.flush()
                    sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
                ops = key_loop(sass)
                regs = re.search(r"Used (\d+) registers", log.getvalue())
                spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.getvalue())
                total = sum(ops.values())
                reg_count = int(regs.group(1)) if regs else None
                rows.append({"arch": arch, "shape": shape, "dtype": dt, "blocks": config, "kernel": name,
                             "tiles": f"{bm},{bn},{warps},{stages}", "loop": total,
                             "per_score": total * warps * 32 / (bm * bn), **{op: ops.get(op, 0) for op in COUNTED},
                             "shared": int(new[0].metadata.shared),
                             "registers": reg_count,
                             "warps_per_sm": _resident_warps(arch, warps, reg_count, int(new[0].metadata.shared)),
                             "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else None})
    headmaps._launch = launch
    os.environ.pop("VITVIZ_HEADMAP_BLOCKS", None)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, choices=[80, 90], help="compute capability (90: H100, H200)")
    ap.add_argument("--shape", default="vit_b16_448", help="a layer of bench/headmap_kernel.py's SHAPES")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], help="bench/headmap_kernel.py's DTYPES")
    ap.add_argument("--blocks", nargs="+", default=None,
                    help="block shapes BM,BN,WARPS,STAGES or default (vitviz's); default: vitviz's and "
                         "bench/headmap_kernel.py's CANDIDATES")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    micro = _module("headmap_kernel")
    if args.shape not in micro.SHAPES or not set(args.dtypes) <= set(micro.DTYPES):
        ap.error(f"--shape must be one of {sorted(micro.SHAPES)} and --dtypes among {sorted(micro.DTYPES)}; got "
                 f"{args.shape!r} and {args.dtypes}")
    os.environ.pop("TRITON_INTERPRET", None)  # compiled, not interpreted (before Triton is imported)
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # a cache hit would skip ptxas and its report
        rows = analyse(args.arch, args.shape, args.dtypes, args.blocks or ["default", *micro.CANDIDATES], micro)
    print(f"sm_{args.arch}, {args.shape}: each kernel's key loop (per thread; per score = x threads / tile)")
    print(f"{'dtype':9} {'blocks':11} {'kernel':8} {'tiles':11} {'loop':>5} {'/score':>7} "
          + " ".join(f"{op:>4}" for op in COUNTED) + f" {'shared':>7} {'regs':>4} {'spill':>5} {'warps/SM':>8}")
    for r in rows:
        print(f"{r['dtype']:9} {r['blocks']:11} {r['kernel']:8} {r['tiles']:11} {r['loop']:5d} {r['per_score']:7.2f} "
              + " ".join(f"{r[op]:4d}" for op in COUNTED)
              + f" {r['shared']:7d} {r['registers'] if r['registers'] is not None else '-':>4} "
              f"{r['spill_bytes'] if r['spill_bytes'] is not None else '-':>5} "
              f"{r['warps_per_sm'] if r['warps_per_sm'] is not None else '-':>8}")
    if args.json:
        path = Path(args.json)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1) + "\n")
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
