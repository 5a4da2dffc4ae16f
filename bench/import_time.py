"""Import cost of vitviz on top of torch + timm (goal: at most 0.5 s more), median of fresh interpreters.

Run: python bench/import_time.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

BASE = "import time; t=time.perf_counter(); import torch, timm; b=time.perf_counter()-t; "


def measure(runs: int) -> tuple[float, float]:
    base, extra = [], []
    code = BASE + "t=time.perf_counter(); import vitviz; print(b, time.perf_counter()-t)"
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        b, e = map(float, out.split())
        base.append(b)
        extra.append(e)
    return statistics.median(base), statistics.median(extra)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    base, extra = measure(runs)
    print(f"import torch, timm: {base:.3f} s   import vitviz on top: {extra:.3f} s   (median of {runs}; goal <= 0.5 s)")
    sys.exit(0 if extra <= 0.5 else 1)
