"""What ``vitviz.faithfulness``'s perturbation loop costs beside its forward passes, on any device.

The curves of one batch take some 40 passes per method (``steps=0.1``, four modes, identical removed sets run once).
``Perturbed.scores`` queues them back to back and the scores of a batch are read once, so on a GPU the host
prepares the next pass while the device runs the last one. This measures, in one process on the same batch
(precomputed random maps, so that only the loop is timed; ``removal="mean"``: every pass sees the whole image):

- ``loop``: ``vitviz.faithfulness`` on ``--n`` images, its passes counted;
- ``read_each``: the same call with every pass's output read right after it (``.item()``), as a loop that reads
  each pass's scores before building the next set does: on a GPU the device then waits for the host between passes;
- ``passes``: as many plain forward passes of the same batch, back to back, one read at the end.

Ratios ``loop / passes`` and ``read_each / passes`` are printed and written (``--json``, appended to the file's
list). On a CPU every op waits anyway, so the three agree up to the loop's host work; on a GPU the gap between
``read_each`` and ``loop`` is the device's idle time that reading between passes costs.

    python bench/faithfulness_speed.py --model vit_base_patch16_224 --device cuda --n 100 --batch 50 --autocast bf16
    python bench/faithfulness_speed.py --model vit_tiny_patch16_224 --size 64 --n 8 --batch 4      # a CPU check
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the vitviz of this checkout, not an installed one
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_base_patch16_224", help="a timm name (random weights)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=100, help="images (random, normalised)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--steps", type=float, default=0.1)
    ap.add_argument("--autocast", choices=("off", "bf16", "fp16"), default="off")
    ap.add_argument("--repeats", type=int, default=3, help="each case's time: the fastest of this many")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    from attention import build_model, command_line, versions

    import vitviz
    from vitviz.core.io import atomic_write_json

    dev = torch.device(args.device)
    amp = {"off": False, "bf16": torch.bfloat16, "fp16": torch.float16}[args.autocast]
    torch.manual_seed(0)
    model = build_model(args.model, args.size).to(dev).eval()
    grid = vitviz.inspect(model).grid_size
    x = torch.randn(args.n, 3, args.size, args.size, device=dev)
    maps = torch.rand(args.n, *grid, device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    passes = [0]

    def count(module, inputs, output) -> None:
        passes[0] += 1

    def read(module, inputs, output) -> None:
        output.float().sum().item()  # the host waits for this pass before building the next

    def loop(read_each: bool) -> None:
        handle = model.register_forward_hook(read) if read_each else None
        try:
            vitviz.faithfulness(model, x, {"given": maps}, removal="mean", steps=args.steps, batch_size=args.batch,
                                progress=False, autocast=amp)
        finally:
            if handle is not None:
                handle.remove()

    counter = model.register_forward_hook(count)
    loop(False)  # warm-up, and the number of forward passes a call makes (the clean ones included)
    counter.remove()
    per_call = passes[0]
    starts = range(0, args.n, args.batch)

    def plain() -> None:  # as many passes as the call makes, over its batches in turn
        with torch.no_grad(), vitviz.core.datasets.autocast_context(amp or None, dev):
            for i in range(per_call):
                s = starts[i % len(starts)]
                model(x[s:s + args.batch])
        sync()

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    row = {"model": args.model, "size": args.size, "device": str(dev), "n": args.n, "batch": args.batch,
           "steps": args.steps, "autocast": args.autocast, "passes": per_call, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "command": command_line(),
           "versions": versions()}
    row["passes_ms"] = timed(plain)
    row["loop_ms"] = timed(lambda: loop(False))
    row["read_each_ms"] = timed(lambda: loop(True))
    row["loop_x"] = row["loop_ms"] / row["passes_ms"]
    row["read_each_x"] = row["read_each_ms"] / row["passes_ms"]
    row["images_per_s"] = args.n / row["loop_ms"] * 1e3
    print(f"faithfulness {args.model} {args.size} px, {args.n} images, batch {args.batch}, {per_call} passes, "
          f"autocast {args.autocast}, {dev}: passes {row['passes_ms']:.1f} ms, loop {row['loop_ms']:.1f} ms "
          f"({row['loop_x']:.2f}x), read after each pass {row['read_each_ms']:.1f} ms ({row['read_each_x']:.2f}x), "
          f"{row['images_per_s']:.1f} img/s")
    if args.json:
        rows = json.loads(args.json.read_text()) if args.json.exists() else []
        atomic_write_json(args.json, rows + [row])


if __name__ == "__main__":
    main()
