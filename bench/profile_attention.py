"""Where the time of one method goes: torch.profiler's table of the top operators (CPU or CUDA), or with
``--python`` cProfile's table of the Python functions (cumulative time over ``--calls`` calls): on a GPU at small
batches a call's Python, not its kernels, can decide its time (docs/benchmarks.md).

Run from the repository root::

    python bench/profile_attention.py --method rollout --size 448 --batch 2 --threads 1
    python bench/profile_attention.py --method rollout --size 448 --batch 8 --device cuda --dtype bf16
    python bench/profile_attention.py --method plain rollout_kernel --size 448 --batch 8 --device cuda --dtype bf16 \
        --python --rows 30
"""

from __future__ import annotations

import argparse
import sys
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
    ap.add_argument("--calls", type=int, default=10, help="calls profiled with --python")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    args.methods = args.method
    once, _ = _setup(args, args.device, args.size, args.batch)
    cuda = args.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
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


if __name__ == "__main__":
    sys.exit(main())
