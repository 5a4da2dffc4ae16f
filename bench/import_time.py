"""Import cost of vitviz on top of torch + timm (goal: at most 0.5 s more), and the time ``vitviz --help`` and
``vitviz SUBCOMMAND --help`` take (goal: under 1 s), medians of fresh interpreters.

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


def help_time(args: list[str], runs: int) -> float:
    import time

    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "vitviz", *args, "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    base, extra = measure(runs)
    print(f"import torch, timm: {base:.3f} s   import vitviz on top: {extra:.3f} s   (median of {runs}; goal <= 0.5 s)")
    helps = {" ".join(["vitviz", *a, "--help"]): help_time(a, runs) for a in ([], ["report"], ["train"], ["study"])}
    for cmd, t in helps.items():
        print(f"{cmd}: {t:.3f} s (goal < 1 s)")
    sys.exit(0 if extra <= 0.5 and max(helps.values()) < 1.0 else 1)
