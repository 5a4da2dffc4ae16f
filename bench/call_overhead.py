"""What one analysis call costs beside the model's own compute: a ViT-B/16-shaped model (12 blocks, 12 heads) of
width 96 on 32 px inputs, whose forward is almost all Python, timed plain and under vitviz's calls.

On a GPU at small batches this per-call cost, not the maps, decides what rollout and distance cost (docs/benchmarks.md,
"GPU: measured on an NVIDIA H100"); this measures it on any machine, without one. Times are the fastest of
``--rounds`` rounds of ``--number`` calls each (per call), one torch thread.

The rows "(kernel path)" run the calls as on a GPU, through the head-map kernels' entry points, with the kernel
launches themselves left out (``headmaps._launch`` does nothing; the maps are garbage, the time is the host's:
argument checks, buffers, the launch arguments). They need Triton; ``TRITON_INTERPRET=1`` is set for this process
so that CPU tensors may take that path.

The rows "(graphed, replay left out)" time a ``vitviz.graphed`` call (the CUDA-graph route, ``core.graphs``) on the
host: the model's state compared with the recording's, the input's checks, the copy in, the copies out; the replay
itself is left out (a recording backend that runs the call once and replays nothing: a replay is one launch).

The rows "(kernel path, forward LSE on)" run them with the forward's log-sum-exp forced on
(``forward_lse.use_forward_lse(True)``, as a float32 CUDA call has it by default; on the CPU SDPA's flash op
answers): rollout's head mean reads it, the distance leaves it alone (``analysis.distance._stream_capture``).

The row "call set-up" is what an analysis call does on the host before and after its forward pass, without it:
the call's contexts (``core.contexts.walk_once``, eval mode, autocast off, ``inspect_once``), two reads of the model
and a stream capture opened and closed. ``--cpu-time`` times in the process's CPU time instead of the wall clock
(steadier on a shared machine; one torch thread, so the two agree on a quiet one).

    python bench/call_overhead.py [--rounds 5] [--number 10] [--cpu-time] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the vitviz of this checkout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=10)
    parser.add_argument("--cpu-time", action="store_true", help="time in process CPU time, not wall-clock time")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: CPU tensors may take the kernel path
    import torch
    from timm.models.vision_transformer import VisionTransformer

    import vitviz
    from vitviz.core import kernels

    try:
        from vitviz.core.contexts import inspect_once
    except ImportError:  # a vitviz from before inspect_once (to time the change): every inspect reads the model
        from contextlib import nullcontext as inspect_once
    try:
        from vitviz.core.contexts import walk_once
    except ImportError:  # a vitviz from before walk_once: every walk is made
        from contextlib import nullcontext as walk_once
    from vitviz.core.contexts import without_autocast
    from vitviz.core.util import eval_mode

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=16, embed_dim=96, depth=12, num_heads=12).eval()
    x = torch.randn(1, 3, 32, 32)

    def plain() -> None:
        with torch.no_grad():
            model(x)

    def capture() -> None:  # set-up and tear-down of a stream capture, no forward
        with inspect_once(), vitviz.capture_attention(model, on_layer=lambda i, a: None, store=False,
                                                      heads="stream"):
            pass

    def call_setup() -> None:  # an analysis call's host work before and after its forward, without it
        with walk_once(), eval_mode(model), without_autocast(model), inspect_once():
            vitviz.inspect(model)
            vitviz.inspect(model)
            with vitviz.capture_attention(model, on_layer=lambda i, a: None, store=False, heads="stream"):
                pass

    cases = {"plain forward": plain, "inspect": lambda: vitviz.inspect(model), "capture set-up": capture,
             "call set-up": call_setup,
             "attention_rollout": lambda: vitviz.attention_rollout(model, x),
             "mean_attention_distance": lambda: vitviz.mean_attention_distance(model, x, batch_size=1,
                                                                                autocast=False)}
    if kernels.triton_available():
        from vitviz.core.kernels import headmaps

        def host_only(fn):
            def run() -> None:
                real = headmaps._launch
                headmaps._launch = lambda kernel, grid, call_args, meta: None
                try:
                    with kernels.headmap_kernel("on"):
                        fn()
                finally:
                    headmaps._launch = real
            return run

        cases["attention_rollout (kernel path)"] = host_only(cases["attention_rollout"])
        cases["mean_attention_distance (kernel path)"] = host_only(cases["mean_attention_distance"])
        from vitviz.core.kernels import forward_lse

        def lse_on(fn):  # the forward's log-sum-exp forced on around the call, as a float32 CUDA call has it
            def run() -> None:
                with forward_lse.use_forward_lse(True):
                    fn()
            return run

        cases["attention_rollout (kernel path, forward LSE on)"] = host_only(lse_on(cases["attention_rollout"]))
        cases["mean_attention_distance (kernel path, forward LSE on)"] = host_only(
            lse_on(cases["mean_attention_distance"]))
    try:
        from vitviz.core import graphs
    except ImportError:  # a vitviz from before vitviz.graphed
        graphs = None
    if graphs is not None:
        class NoReplay:  # records by running the call once; a replay launches nothing
            @staticmethod
            def available(device) -> bool:
                return True

            @staticmethod
            def record(run, device):
                return (lambda: None), run()

        graphs.GraphedCall.backend = NoReplay
        recorded = vitviz.graphed(vitviz.attention_rollout, model, x)
        recorded_distance = vitviz.graphed(vitviz.mean_attention_distance, model, x, autocast=False)
        cases["attention_rollout (graphed, replay left out)"] = lambda: recorded(x)
        cases["mean_attention_distance (graphed, replay left out)"] = lambda: recorded_distance(x)
    rows = []
    for name, fn in cases.items():
        fn()  # warm-up
        timer = timeit.Timer(fn, timer=time.process_time if args.cpu_time else time.perf_counter)
        best = min(timer.timeit(number=args.number) / args.number for _ in range(args.rounds))
        rows.append({"case": name, "ms": best * 1e3})
    base = rows[0]["ms"]
    for row in rows:
        row["x_plain"] = row["ms"] / base
        print(f"{row['case']:52} {row['ms']:7.2f} ms  {row['x_plain']:5.2f}x the plain forward")
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "cpu_time": args.cpu_time, "rows": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
