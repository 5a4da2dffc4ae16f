"""Where the time of one method goes: torch.profiler's table of the top operators (CPU or CUDA), or with
``--python`` cProfile's table of the Python functions (cumulative time over ``--calls`` calls): on a GPU at small
batches a call's Python, not its kernels, can decide its time (docs/benchmarks.md).

``--timeline`` answers, per method, whether a call is bound by the host or by the device, and why (one line each,
and ``--json``): ``host_ms``, the time until the call returns, and ``total_ms``, until the device is done (medians of
``--calls``; a call that returns CUDA tensors returns before its kernels have run, unless it waits for them);
``kernel_ms``, the summed time of its device kernels, and ``busy_ms``, the time the device was busy (their
intervals merged), per call from torch.profiler; ``runtime``, each CUDA runtime or driver call (launches, copies,
``cudaStreamSynchronize``, ``cudaMalloc``, ``cudaFree``...) per call with its host time, but for the timing's own
``cudaDeviceSynchronize`` (vitviz never calls it); ``gaps``, the longest stretches the device idled between the
kernels of three calls in a row, with the kernel before each; ``syncs``, each synchronizing operation
``torch.cuda.set_sync_debug_mode`` reports in one call, with the vitviz frames that called it. On the CPU only the
host times are meaningful.

Run from the repository root::

    python bench/profile_attention.py --method rollout --size 448 --batch 2 --threads 1
    python bench/profile_attention.py --method rollout --size 448 --batch 8 --device cuda --dtype bf16
    python bench/profile_attention.py --method plain rollout_kernel --size 448 --batch 8 --device cuda --dtype bf16 \
        --python --rows 30
    python bench/profile_attention.py --method plain rollout_kernel distance_kernel --size 448 --batch 8 \
        --device cuda --dtype bf16 --timeline --json timeline.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    from attention import METHODS, _setup

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--method", nargs="+", default=["plain", "explicit", "rollout"], choices=METHODS)
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--python", action="store_true", help="cProfile's table of Python functions instead")
    ap.add_argument("--calls", type=int, default=10, help="calls profiled with --python, timed with --timeline")
    ap.add_argument("--timeline", action="store_true", help="host, device and synchronisations of each call")
    ap.add_argument("--json", type=Path, help="--timeline: also append this run to the list in this file (JSON)")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    args.methods = args.method
    once, _ = _setup(args, args.device, args.size, args.batch)
    cuda = args.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if args.timeline:
        from vitviz.core.io import atomic_write_json

        earlier = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
        run = {"model": args.model, "size": args.size, "batch": args.batch, "dtype": args.dtype,
               "device": args.device, "rows": []}
        for m in args.method:
            run["rows"].append(timeline(once, m, cuda, args.calls, acts))
            print(f"timeline {json.dumps(run['rows'][-1])}", flush=True)
            if args.json:  # this run appended to the file's list, after each method: a cut keeps what was measured
                atomic_write_json(args.json, [*earlier, run])
        return 0
    for m in args.method:
        for _ in range(2):
            once(m)
        if cuda:
            torch.cuda.synchronize()
        if args.python:
            import cProfile
            import pstats
            import time

            profiler = cProfile.Profile()
            start = time.perf_counter()
            profiler.enable()
            for _ in range(args.calls):
                once(m)
            if cuda:
                torch.cuda.synchronize()
            profiler.disable()
            wall = (time.perf_counter() - start) / args.calls
            print(f"\n== {m} ({args.model}, {args.size} px, batch {args.batch}, {args.dtype}, {args.device}): "
                  f"{args.calls} calls under cProfile, {wall * 1e3:.2f} ms a call")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(args.rows)
            continue
        with profile(activities=acts) as prof:
            once(m)
            if cuda:
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(f"\n== {m} ({args.model}, {args.size} px, batch {args.batch}, {args.dtype}, {args.device})")
        print(prof.key_averages().table(sort_by=key, row_limit=args.rows))
    return 0


def _runtime_call(name: str) -> bool:
    """A CUDA runtime (``cudaLaunchKernel``) or driver (``cuLaunchKernel``, as Triton launches) call's event."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def busy_and_gaps(kernels: list[tuple[float, float, str]]) -> tuple[float, list[tuple[float, str]]]:
    """``(busy, gaps)`` of kernels ``(start, end, name)``: the time covered by their intervals merged, and each
    stretch between them that none covers as ``(length, the kernel that ran last before it)``, longest first."""
    busy, gaps, end, last = 0.0, [], None, None
    for start, stop, name in sorted(kernels):
        if end is not None and start > end:
            gaps.append((start - end, last))
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
        if stop >= end:
            last = name
    return busy, sorted(gaps, reverse=True)


def timeline(once, method: str, cuda: bool, calls: int, acts: list) -> dict:
    """One method's row of ``--timeline`` (see the module docstring)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import profile

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(2):
        once(method)
    sync()
    host, total = [], []
    for _ in range(calls):
        sync()
        start = time.perf_counter()
        out = once(method)
        returned = time.perf_counter()
        sync()
        done = time.perf_counter()
        host.append((returned - start) * 1e3)
        total.append((done - start) * 1e3)
        del out
    row: dict = {"method": method, "calls": calls, "host_ms": statistics.median(host),
                 "total_ms": statistics.median(total)}
    if not cuda:
        return row
    syncs: list[dict] = []

    def seen(message, category, filename, lineno, file=None, line=None) -> None:  # the Python stack is still there
        frames = [f"{f.filename.rsplit('/vitviz/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()
                  if "/vitviz/" in f.filename]
        syncs.append({"what": str(message).split("\n")[0][:120], "at": f"{Path(filename).name}:{lineno}",
                      "vitviz": frames[-3:]})

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = seen
            out = once(method)
            del out
    finally:
        torch.cuda.set_sync_debug_mode(0)
    sync()
    row["syncs"] = syncs
    profiled = 3
    with profile(activities=acts) as prof:
        for _ in range(profiled):
            once(method)
        sync()
    kernels, runtime = [], {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kernels.append((e.time_range.start, e.time_range.end, e.name))
        elif _runtime_call(e.name) and e.name != "cudaDeviceSynchronize":  # that is this timing's own sync()
            count, us = runtime.get(e.name, (0, 0.0))
            runtime[e.name] = (count + 1, us + e.time_range.elapsed_us())
    busy, gaps = busy_and_gaps(kernels)
    row.update(kernel_ms=sum(b - a for a, b, _ in kernels) / profiled / 1e3, busy_ms=busy / profiled / 1e3,
               kernels_per_call=len(kernels) / profiled,
               runtime={name: {"calls": count / profiled, "ms": us / profiled / 1e3}
                        for name, (count, us) in sorted(runtime.items(), key=lambda kv: -kv[1][1])},
               gaps=[{"ms": gap / 1e3, "after": name[:80]} for gap, name in gaps[:5]])
    return row


if __name__ == "__main__":
    sys.exit(main())
