"""What one analysis call costs beside the model's own compute: a ViT-B/16-shaped model (12 blocks, 12 heads) of
width 96 on 32 px inputs, whose forward is almost all Python, timed plain and under vitviz's calls.

On a GPU at small batches this per-call cost, not the maps, decides what rollout and distance cost (docs/benchmarks.md,
"GPU: measured on an NVIDIA H100"); this measures it on any machine, without one. Times are the fastest of
``--rounds`` rounds of ``--number`` calls each (per call; the cases take turns, round by round), one torch thread.

The rows "(kernel path)" run the calls as on a GPU, through the head-map kernels' entry points, with the kernel
launches themselves left out (``headmaps._launch`` does nothing; the maps are garbage, the time is the host's:
argument checks, buffers, the launch arguments). They need Triton; ``TRITON_INTERPRET=1`` is set for this process
so that CPU tensors may take that path.

The rows "(graphed, replay left out)" time a ``vitviz.graphed`` call (the CUDA-graph route, ``core.graphs``) on the
host: the model's state compared with the recording's, the input's checks, the copy in, the copies out; the replay
itself is left out (a recording backend that runs the call once and replays nothing: a replay is one launch).

With ``--triton-launch``, rows "(kernel path, Triton's launch path)" run the same calls with the launches made
through Triton's own launch path (``JITFunction.run``: the arguments bound, the specialisation key computed, the
compiled kernel looked up, the launcher called) on a stand-in driver (``StandInDriver``) that compiles for sm_90
(Triton's wheel ships ``ptxas``; the warm-up call compiles) and whose launcher does nothing: what Triton's Python
costs per launch, without a GPU (the driver's own ``cuLaunchKernelEx`` stays left out). Triton then runs compiled,
not interpreted (``TRITON_INTERPRET`` unset: Triton's own modules follow it at import), and vitviz is told CPU
tensors may take the kernels. Against the "(kernel path)" rows of the same run, the difference is Triton's launch
path (rollout: two launches a layer; distance: one).

The rows "(kernel path, forward LSE on)" run them with the forward's log-sum-exp forced on
(``forward_lse.use_forward_lse(True)``, as a float32 CUDA call has it by default; on the CPU SDPA's flash op
answers): rollout's head mean reads it, the distance leaves it alone (``analysis.distance._stream_capture``).

The rows "...: before the forward" time the host from a call's start to its model's first module (a pre-hook on
the patch embedding; the fastest of ``--rounds`` x ``--number`` calls): on a GPU the device has nothing to do until
then, so a call whose device work is the bound (float32 at 448 px) is that much longer than its device work.

The row "call set-up" is what an analysis call does on the host before and after its forward pass, without it:
the call's contexts (``core.contexts.walk_once``, eval mode, autocast off, ``inspect_once``), two reads of the model
and a stream capture opened and closed. ``--cpu-time`` times in the process's CPU time instead of the wall clock
(steadier on a shared machine; one torch thread, so the two agree on a quiet one).

    python bench/call_overhead.py [--rounds 5] [--number 10] [--cpu-time] [--triton-launch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the vitviz of this checkout


class StandInDriver:
    """A Triton driver for a machine without a GPU: kernels compile for ``sm_<arch>``, launches do nothing (counted in
    ``launches``). Only what ``JITFunction.run`` and ``CompiledKernel`` ask of the active driver (Triton 3.8 and 3.9).
    Also the driver with which ``tests/test_headmap_compile.py`` compiles the kernels through Triton's JIT, as a GPU's
    first call would."""

    SHARED = {90: 227 * 1024, 80: 163 * 1024}  # what one block may take (99 KiB on sm_86/89/120)
    launches = 0

    class Utils:
        def __init__(self, shared: int) -> None:
            self.shared = shared

        @staticmethod
        def load_binary(name, kernel, shared, device):  # (module, function, registers, spills, max threads)
            # a module that is not None: Triton loads a kernel again at every launch while its module is None
            # (CompiledKernel._init_handles, which launch_metadata calls), a cost a GPU's launches do not have
            return "stand-in module", None, 0, 0, 1024

        def get_device_properties(self, device):
            return {"max_shared_mem": self.shared, "multiprocessor_count": 132, "max_num_regs": 65536,
                    "warpSize": 32}

        @staticmethod
        def unload_module(module):
            pass

    def __init__(self, arch: int = 90) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)
        self.utils = self.Utils(self.SHARED.get(arch, 99 * 1024))

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def launcher_cls(self, src, metadata):
        def launch(*args) -> None:
            StandInDriver.launches += 1
        return launch

    @staticmethod
    def builds(functions) -> list:
        """The compiled kernels the JIT functions hold for device 0 (what the calls so far compiled), in order."""
        return [c for fn in functions for c in fn.device_caches[0][0].values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=10)
    parser.add_argument("--cpu-time", action="store_true", help="time in process CPU time, not wall-clock time")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--triton-launch", action="store_true",
                        help="also the kernel-path calls launched through Triton's launch path (StandInDriver)")
    args = parser.parse_args()

    import os

    if args.triton_launch:  # compiled kernels (Triton's state follows $TRITON_INTERPRET at its import), no GPU
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: CPU tensors may take the kernels
    import torch
    from timm.models.vision_transformer import VisionTransformer

    import vitviz
    from vitviz.core import kernels

    if args.triton_launch:
        if not kernels.triton_available():
            parser.error(f"--triton-launch needs Triton {'.'.join(map(str, kernels.MIN_TRITON))} or newer")
        from triton.runtime.driver import driver

        driver.set_active(StandInDriver())
        kernels._interpreting = lambda: True  # vitviz lets CPU tensors take the (compiled) kernels

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

        def launched(fn):  # the call on the kernels' path
            def run() -> None:
                with kernels.headmap_kernel("on"):
                    fn()
            return run

        def host_only(fn):  # ... with the launches left out
            def run() -> None:
                real = headmaps._launch
                headmaps._launch = lambda kernel, grid, call_args, meta: None
                try:
                    launched(fn)()
                finally:
                    headmaps._launch = real
            return run

        cases["attention_rollout (kernel path)"] = host_only(cases["attention_rollout"])
        cases["mean_attention_distance (kernel path)"] = host_only(cases["mean_attention_distance"])
        if args.triton_launch:
            cases["attention_rollout (kernel path, Triton's launch path)"] = launched(cases["attention_rollout"])
            cases["mean_attention_distance (kernel path, Triton's launch path)"] = launched(
                cases["mean_attention_distance"])
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
    launches: dict[str, int] = {}
    for name, fn in cases.items():
        fn()  # warm-up (with --triton-launch, the first kernel-path call compiles)
        before = StandInDriver.launches
        fn()
        launches[name] = StandInDriver.launches - before  # through Triton's launch path, in one call
    clock = time.process_time if args.cpu_time else time.perf_counter
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.rounds):  # the cases take turns, so that a drift of the machine touches each alike
        for name, fn in cases.items():
            best[name] = min(best[name], timeit.Timer(fn, timer=clock).timeit(number=args.number) / args.number)
    rows = [{"case": name, "ms": best[name] * 1e3, "triton_launches": launches[name]} for name in cases]
    # the host's time from a call's start to its model's first module (the patch embedding): on a GPU the device
    # waits through it, so it adds to a call whose device work is the bound (float32 at 448 px)
    before: dict[str, float] = {}
    started = [0.0]
    reached: list[float] = []
    hook = model.patch_embed.register_forward_pre_hook(lambda _m, _a: reached.append(clock() - started[0]))
    try:
        for name in [n for n in cases if n in ("plain forward", "attention_rollout (kernel path)",
                                               "mean_attention_distance (kernel path)")]:
            reached.clear()
            for _ in range(args.rounds * args.number):
                started[0] = clock()
                cases[name]()
            before[name] = min(reached)
    finally:
        hook.remove()
    rows += [{"case": f"{name}: before the forward", "ms": t * 1e3, "triton_launches": 0} for name, t in before.items()]
    base = rows[0]["ms"]
    for row in rows:
        row["x_plain"] = row["ms"] / base
        launched = f"  ({row['triton_launches']} Triton launches a call)" if row["triton_launches"] else ""
        print(f"{row['case']:62} {row['ms']:7.2f} ms  {row['x_plain']:5.2f}x the plain forward{launched}")
    if args.json:
        triton = kernels.triton_version()
        args.json.write_text(json.dumps({"torch": torch.__version__, "triton": triton and ".".join(map(str, triton)),
                                         "cpu_time": args.cpu_time, "triton_launch": args.triton_launch,
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
