"""Cost of attention rollout on ViT-B/16: plain forward vs store-everything-then-rollout vs vitviz's streaming.

Cases, each in a fresh subprocess (so peak memory is that case's alone), for every device and image size:

- ``plain``: the model's own forward (timm's fused ``scaled_dot_product_attention``), no attention read;
- ``explicit``: the forward with every layer's attention materialised but dropped (the floor any rollout pays);
- ``store``: every layer's ``(B, H, N, N)`` attention stored (``capture_attention(store=True)``), then rolled out,
  as most rollout code does;
- ``rollout``: ``vitviz.attention_rollout``, which reduces each layer during the forward.

Time: median of ``--repeats`` runs after a warm-up, the methods taking turns in one process (so a change in
background load hits them alike). Peak memory above what model and input hold, one fresh process per method: on
CPU the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``; ``ru_maxrss`` where that is
unavailable), on CUDA ``torch.cuda.max_memory_allocated``. Random weights (timing does not depend on them).

Run: python bench/attention.py [--sizes 224 448] [--batch 2] [--repeats 5] [--device cpu cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

MODEL = "vit_base_patch16_224"
METHODS = ("plain", "explicit", "store", "rollout")
GOAL_TIME = {224: 1.10, 448: 1.5}  # rollout / plain on CPU
GOAL_MEMORY = 0.30  # rollout's extra memory / store-everything's extra memory


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _setup(device: str, size: int, batch: int, threads: int | None):
    import timm
    import torch

    import vitviz
    from vitviz.analysis.rollout import rollout_from_attentions, rollout_to_maps

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False, img_size=size).eval().to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    spec = vitviz.inspect(model)

    def once(method: str) -> torch.Tensor:
        with torch.no_grad():
            if method == "plain":
                return model(x)
            if method == "explicit":
                with vitviz.capture_attention(model, on_layer=lambda i, a: None, store=False):
                    return model(x)
            if method == "store":
                with vitviz.capture_attention(model) as cap:
                    model(x)
                r = rollout_from_attentions(cap.attentions, num_prefix_tokens=spec.num_prefix_tokens)
                return rollout_to_maps(r, spec.grid_size, spec.num_prefix_tokens, spec.class_token_index)
        return vitviz.attention_rollout(model, x)

    return once, spec


def time_case(device: str, size: int, methods: list[str], batch: int, repeats: int, threads: int | None) -> dict:
    """Median wall time of each method; the methods take turns, so a change in background load hits all alike."""
    import torch

    once, spec = _setup(device, size, batch, threads)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    for i in range(repeats + 1):
        for m in methods:
            sync()
            t, c = time.perf_counter(), time.process_time()
            out = once(m)
            sync()
            if i:  # the first round warms up
                times[m].append(time.perf_counter() - t)
                cpu[m].append(time.process_time() - c)
            del out
    return {"times": times, "cpu": cpu, "tokens": spec.num_tokens, "threads": torch.get_num_threads()}


def memory_case(device: str, size: int, method: str, batch: int, threads: int | None) -> float:
    """Peak memory (MiB) of two runs of ``method`` above what the model and its input hold."""
    import gc

    import torch

    once, _ = _setup(device, size, batch, threads)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        gc.collect()
        exact = _reset_peak()
        base = _rss_kib("VmRSS") * 1024 if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for _ in range(2):
        out = once(method)
        del out
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    hwm = _rss_kib("VmHWM") if exact else None
    return ((hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 - base) / 2**20


def spawn(args: argparse.Namespace, *case: str) -> dict | float:
    cmd = [sys.executable, __file__, "--_case", ",".join(case), "--batch", str(args.batch),
           "--repeats", str(args.repeats)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode:
        raise RuntimeError(f"case {case} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, device: str, size: int, methods: list[str]) -> list[dict]:
    timing = spawn(args, "time", device, str(size), *methods)
    results = []
    for m in methods:
        mem = spawn(args, "memory", device, str(size), m)
        t, c = timing["times"][m], timing["cpu"][m]
        results.append({"device": device, "size": size, "method": m, "time_s": statistics.median(t), "times": t,
                        "cpu_s": statistics.median(c), "cpu_times": c, "peak_extra_mb": mem,
                        "tokens": timing["tokens"], "threads": timing["threads"]})
        print(f"{device} {size}px {m:9} {statistics.median(t):.3f} s  peak +{mem:.1f} MB", flush=True)
    return results


def report(results: list[dict], batch: int) -> bool:
    ok = True
    print(f"\n{MODEL}, batch {batch}, random weights. wall = median wall time, min = fastest run, cpu = median "
          "process CPU time\n(robust to other processes when torch runs one thread); peak = memory above model + input")
    print(f"{'device':7} {'px':>4} {'N':>4} {'method':9} {'wall s':>8} {'x plain':>8} {'min s':>8} {'x plain':>8} "
          f"{'cpu s':>8} {'x plain':>8} {'peak MB':>9}")
    for dev in dict.fromkeys(r["device"] for r in results):
        for size in dict.fromkeys(r["size"] for r in results if r["device"] == dev):
            case = {r["method"]: r for r in results if r["device"] == dev and r["size"] == size}
            plain = case["plain"]
            for m, r in case.items():
                lo, lo_plain = min(r["times"]), min(plain["times"])
                print(f"{dev:7} {size:>4} {r['tokens']:>4} {m:9} {r['time_s']:8.3f} {r['time_s'] / plain['time_s']:8.2f} "
                      f"{lo:8.3f} {lo / lo_plain:8.2f} {r['cpu_s']:8.3f} {r['cpu_s'] / plain['cpu_s']:8.2f} "
                      f"{r['peak_extra_mb']:9.1f}")
            if "rollout" in case and "store" in case:
                t = case["rollout"]["time_s"] / plain["time_s"]
                ts = case["store"]["time_s"] / plain["time_s"]
                tc = case["rollout"]["cpu_s"] / plain["cpu_s"]
                extra_r = case["rollout"]["peak_extra_mb"] - plain["peak_extra_mb"]
                extra_s = case["store"]["peak_extra_mb"] - plain["peak_extra_mb"]
                mem = extra_r / extra_s if extra_s > 0 else float("nan")
                line = (f"  -> {dev} {size}px: rollout {t:.2f}x plain (CPU time {tc:.2f}x), store-everything "
                        f"{ts:.2f}x plain; extra memory "
                        f"over plain: rollout {extra_r:.1f} MB, store {extra_s:.1f} MB, ratio {mem:.2f}")
                goals = []
                if dev == "cpu" and size in GOAL_TIME:
                    hit = t <= GOAL_TIME[size]
                    ok &= hit
                    goals.append(f"time goal <= {GOAL_TIME[size]:.2f}x (median wall): {'met' if hit else 'MISSED'}")
                hit = mem <= GOAL_MEMORY
                ok &= hit
                goals.append(f"memory goal <= {GOAL_MEMORY:.0%} of store's extra: {'met' if hit else 'MISSED'}")
                print(line + "\n     " + "; ".join(goals))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[224, 448])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", nargs="+", default=None, help="cpu and/or cuda (default: cpu, plus cuda if present)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--_case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._case:
        kind, dev, size, *rest = args._case.split(",")
        if kind == "time":
            print(json.dumps(time_case(dev, int(size), rest, args.batch, args.repeats, args.threads)))
        else:
            print(json.dumps(memory_case(dev, int(size), rest[0], args.batch, args.threads)))
        return 0
    methods = ["plain", *[m for m in args.methods if m != "plain"]]
    if args.device is None:
        import torch

        args.device = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for dev in args.device:
        for size in args.sizes:
            results += measure(args, dev, size, methods)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if report(results, args.batch) else 1


if __name__ == "__main__":
    sys.exit(main())
