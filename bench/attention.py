"""What reading attention costs on a ViT: every method side by side, one run, same model and input.

Methods (``--methods``):

- ``plain``: the model's own forward (timm's fused ``scaled_dot_product_attention``: flash attention on CUDA);
- ``explicit``: the forward with the fused kernel off and every layer's ``(B, H, N, N)`` materialised and dropped
  (what a ``heads="full"`` capture pays: the floor of any method that reads the maps the model itself forms);
- ``store``: store-every-layer rollout as popular code does it (vit-explain's ``VITAttentionRollout``): keep every
  layer's ``(B, H, N, N)`` (``capture_attention(store=True)``), then fuse and multiply the full ``N x N`` matrices;
- ``timm``: timm's ``AttentionExtract`` (fx graph extraction of every ``attn.softmax``): extraction only, an anchor;
- ``rollout``: ``vitviz.attention_rollout`` (``heads="stream"``: the fused kernel stays on, each head is recomputed
  from ``q``, ``k`` into one ``(B, N, N)`` buffer and fused at once, the class row pushed at the end);
- ``store_distance``: every layer stored, then mean attention distance from the stored maps;
- ``distance``: ``vitviz.mean_attention_distance`` (``heads="stream"``: each head reduced to sums as it is recomputed);
- ``rollout_torch``, ``distance_torch``: the same with the head-map kernels forbidden (``VITVIZ_HEADMAP_KERNEL=off``:
  the PyTorch stream path, which is what ``rollout``/``distance`` run on CPU);
- ``rollout_kernel``, ``distance_kernel``: the same with the Triton head-map kernels forced on (what
  ``rollout``/``distance`` run on CUDA by default; CUDA only), ``rollout_kernel`` with the kernels' own first pass
  (the forward's log-sum-exp forced off);
- ``rollout_fwdlse``: ``rollout_kernel`` with the row log-sum-exp taken from the forward's own SDPA call
  (``vitviz.core.kernels.forward_lse``, forced on: no first pass of the kernels; timm and Hugging Face models, CUDA
  only). By default ``rollout`` on CUDA is ``rollout_fwdlse`` for float32 models (outside autocast) and
  ``rollout_kernel`` for the others;
- ``grad_rollout``: ``vitviz.grad_rollout`` (needs the backward; off by default on CPU);
- ``rollout_graphed``, ``distance_graphed``: ``rollout``/``distance`` recorded once as a CUDA graph and replayed
  per call (``vitviz.graphed``: the call's Python runs at recording, a call is the input's check, one copy in, one
  replay, one copy out); ``plain_graphed``: the plain forward recorded the same way (``torch.cuda.graph``), the
  floor of a recorded call. Recorded in the set-up (``graph_reserved_mb``: the memory each recording's private
  pool holds while it lives, counted as extra memory beside a replay's peak; ``graph_recordings``: how often each
  recorded, 1 where every timed call replayed, said in the output otherwise). CUDA only, not in the defaults.
- ``rollout_kernel_prev``, ``distance_kernel_prev``, ``rollout_graphed_prev``, ``distance_graphed_prev``: the same
  four calls with sm_90's previous tiles (``previous_sm90_tiles``: before ``headmaps.SM90_TABLE``, the distance pass
  and float32's passes 64 x 64 with 8 warps and 3 stages, bf16's rows and fusing passes 64 x 32 with 8 warps and 2
  stages), so that one run times both tables end to end; on other GPUs they are the same calls. CUDA only.

``--model hf:vit-base-patch16`` (or ``hf:vit-large-patch16``) times a Hugging Face ``ViTModel`` of that size with
its default SDPA attention instead of a timm model: ``explicit`` is then the eager implementation a ``heads="full"``
capture switches to, and rollout/distance run the Hugging Face stream probe (``vitviz.core.families.hf_probes``);
``timm`` does not apply. ``--model tv:vit_b_16`` (or ``tv:vit_l_16``) does the same for torchvision's
``VisionTransformer`` (``nn.MultiheadAttention``: ``explicit`` is ``need_weights=True``, rollout/distance run
``vitviz.core.families.stream.probe_mha_stream``).

On CPU the default methods are those before the kernels existed (no ``*_torch``/``*_kernel``, no ``grad_rollout``).

Time: median of ``--repeats`` rounds after a warm-up round, the methods taking turns within each round, so a change
in background load hits them alike; also the fastest run and the median process CPU time. Images/s = batch /
median wall time. Peak memory above what the model and input hold: on CUDA ``torch.cuda.max_memory_allocated`` in
the timing process; on CPU the peak resident set (``VmHWM`` reset through ``/proc/self/clear_refs``) of a fresh
process per method. Random weights (timing does not depend on them).

Run from the repository root: ``python bench/attention.py`` (CPU: 224 px batch 8 and 448 px batch 2). See
docs/benchmarks.md for the GPU command and the recorded figures.
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
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the vitviz of this checkout, not an installed one

METHODS = ("plain", "explicit", "store", "timm", "rollout", "store_distance", "distance", "rollout_torch",
           "distance_torch", "rollout_kernel", "distance_kernel", "rollout_fwdlse", "grad_rollout", "plain_graphed",
           "rollout_graphed", "distance_graphed", "rollout_kernel_prev", "distance_kernel_prev", "rollout_graphed_prev",
           "distance_graphed_prev")
GRAPHED = ("plain_graphed", "rollout_graphed", "distance_graphed", "rollout_graphed_prev", "distance_graphed_prev")
PREVIOUS_TILES = ("rollout_kernel_prev", "distance_kernel_prev", "rollout_graphed_prev", "distance_graphed_prev")
CUDA_ONLY = ("rollout_kernel", "distance_kernel", "rollout_fwdlse", "grad_rollout", *GRAPHED, *PREVIOUS_TILES)
NEW_ON_CPU = ("rollout_torch", "distance_torch")  # not in the CPU defaults (rollout/distance already are that path)
KERNEL_MODE = {"rollout_torch": "off", "distance_torch": "off", "rollout_kernel": "on", "distance_kernel": "on"}
GOAL_TIME = {224: 1.10, 448: 1.35}  # streaming method / plain on CPU
GOAL_TIME_CUDA = {"bf16": {448: 1.30}, "fp16": {448: 1.30}, "fp32": {448: 1.15}}
EXIT_GOAL_MISSED = 3  # the exit status when every case ran but a goal was missed (1: a case failed)
GOAL_MEMORY = 0.20  # streaming method's extra memory / its store-everything counterpart's
PAIRS = {"rollout": "store", "distance": "store_distance", "rollout_torch": "store",
         "distance_torch": "store_distance", "rollout_kernel": "store", "distance_kernel": "store_distance",
         "rollout_fwdlse": "store", "rollout_graphed": "store", "distance_graphed": "store_distance",
         "rollout_kernel_prev": "store", "distance_kernel_prev": "store_distance", "rollout_graphed_prev": "store",
         "distance_graphed_prev": "store_distance"}


@contextmanager
def previous_sm90_tiles():
    """A context in which the head-map kernels take sm_90's tiles as they were before ``headmaps.SM90_TABLE``
    (which be3a06c brought): the distance pass and float32's passes 64 x 64, 8 warps, 3 stages; bf16's and fp16's rows
    and fusing passes the shapes of other GPUs, 64 x 32, 8 warps, 2 stages. Where ``SM90_TABLE`` does not apply
    (other GPUs, head dims over 64, a bias or mask), nothing changes."""
    import torch

    from vitviz.core.kernels import headmaps

    real = headmaps._sm90_table
    headmaps._sm90_table = lambda kernel, dtype: (
        (64, 64, 8, 3) if kernel == "distance" or dtype == torch.float32 else (64, 32, 8, 2))
    try:
        yield
    finally:
        headmaps._sm90_table = real


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


def popular_rollout(attentions, discard_ratio: float = 0.0):
    """vit-explain's rollout (store everything, then multiply): mean heads, ``(W + I) / 2``, rows normalised."""
    import torch

    result = torch.eye(attentions[0].size(-1), device=attentions[0].device)
    for attention in attentions:
        fused = attention.float().mean(dim=1)
        a = (fused + torch.eye(fused.size(-1), device=fused.device)) / 2
        a = a / a.sum(dim=-1, keepdim=True)
        result = torch.matmul(a, result)
    mask = result[:, 0, 1:]
    return mask.reshape(mask.shape[0], *([int(mask.shape[-1] ** 0.5)] * 2))


HF_MODELS = {  # --model hf:NAME: a Hugging Face ViTModel (SDPA attention) of the ViT paper's sizes, random weights
    "hf:vit-base-patch16": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "hf:vit-large-patch16": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=4096),
}


TV_MODELS = ("tv:vit_b_16", "tv:vit_l_16")  # --model tv:NAME: torchvision's VisionTransformer, random weights


def build_model(name: str, size: int):
    """A timm model by name, or (``hf:...``, ``HF_MODELS``) a Hugging Face ``ViTModel``, or (``tv:...``,
    ``TV_MODELS``) a torchvision ``VisionTransformer``, at ``size`` px."""
    if name.startswith("tv:"):
        if name not in TV_MODELS:
            raise SystemExit(f"--model {name}: the torchvision models here are {list(TV_MODELS)}")
        import torchvision

        return getattr(torchvision.models, name[3:])(weights=None, image_size=size)
    if name.startswith("hf:"):
        if name not in HF_MODELS:
            raise SystemExit(f"--model {name}: the Hugging Face models here are {sorted(HF_MODELS)}")
        import transformers

        config = transformers.ViTConfig(image_size=size, patch_size=16, **HF_MODELS[name])
        return transformers.ViTModel(config, add_pooling_layer=False)
    import timm

    return timm.create_model(name, pretrained=False, img_size=size)


def _setup(args: argparse.Namespace, device: str, size: int, batch: int):
    import copy

    import torch

    import vitviz
    from vitviz.analysis.distance import attention_distance_from_maps

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    model = build_model(args.model, size).eval().to(device=device, dtype=dtype)
    x = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
    spec = vitviz.inspect(model)
    extract = None
    if "timm" in args.methods:
        if args.model.startswith(("hf:", "tv:")):
            raise SystemExit("--methods timm (timm's AttentionExtract) needs a timm model, not " + args.model)
        from timm.utils import AttentionExtract

        explicit = copy.deepcopy(model)
        for m in explicit.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False  # fx needs the softmax node in the graph
        extract = AttentionExtract(explicit, method="fx")

    from vitviz.core.kernels import forward_lse, headmap_kernel

    graphed: dict[str, object] = {}
    reserved_mb: dict[str, float] = {}  # per recording: the memory its graph's private pool holds

    def reserved() -> float:  # what the allocator holds once the free cached blocks are returned: a live graph's
        if not device.startswith("cuda"):  # private pool stays (its blocks are released when the graph is)
            return 0.0
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved() / 2**20

    before = reserved()
    if "plain_graphed" in args.methods:
        static = x.clone()
        with torch.no_grad():  # torch's own recipe: warm-up runs on a side stream, then the capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model(static)
            torch.cuda.current_stream().wait_stream(side)
            plain_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(plain_graph):
                plain_out = model(static)

        def plain_replay(images):
            static.copy_(images)
            plain_graph.replay()
            return plain_out.clone()

        graphed["plain_graphed"] = plain_replay
        reserved_mb["plain_graphed"], before = reserved() - before, reserved()
    if "rollout_graphed" in args.methods:
        graphed["rollout_graphed"] = vitviz.graphed(vitviz.attention_rollout, model, x)
        reserved_mb["rollout_graphed"], before = reserved() - before, reserved()
    if "distance_graphed" in args.methods:
        graphed["distance_graphed"] = vitviz.graphed(vitviz.mean_attention_distance, model, x, autocast=False)
        reserved_mb["distance_graphed"], before = reserved() - before, reserved()
    if "rollout_graphed_prev" in args.methods:  # the tiles are those of the recording: each replay runs them
        with previous_sm90_tiles():
            graphed["rollout_graphed_prev"] = vitviz.graphed(vitviz.attention_rollout, model, x)
        reserved_mb["rollout_graphed_prev"], before = reserved() - before, reserved()
    if "distance_graphed_prev" in args.methods:
        with previous_sm90_tiles():
            graphed["distance_graphed_prev"] = vitviz.graphed(vitviz.mean_attention_distance, model, x,
                                                              autocast=False)
        reserved_mb["distance_graphed_prev"], before = reserved() - before, reserved()

    def once(method: str):
        if method in graphed:
            return graphed[method](x)
        if method == "grad_rollout":
            return vitviz.grad_rollout(model, x, target=0)
        if method in ("rollout_kernel_prev", "distance_kernel_prev"):
            with previous_sm90_tiles():
                return once(method[:-len("_prev")])
        if method == "rollout_fwdlse":  # the kernels with the forward's log-sum-exp, whatever the default
            with forward_lse.use_forward_lse(True), headmap_kernel(KERNEL_MODE["rollout_kernel"]):
                return once("rollout")
        if method == "rollout_kernel":  # the kernels with their own first pass, whatever the default
            with forward_lse.use_forward_lse(False), headmap_kernel(KERNEL_MODE[method]):
                return once("rollout")
        if method in KERNEL_MODE:
            with headmap_kernel(KERNEL_MODE[method]):
                return once(method.split("_")[0])
        with torch.no_grad():
            if method == "plain":
                return model(x)
            if method == "explicit":
                with vitviz.capture_attention(model, on_layer=lambda i, a: None, store=False):
                    return model(x)
            if method == "store":
                with vitviz.capture_attention(model) as cap:
                    model(x)
                return popular_rollout(cap.attentions)
            if method == "store_distance":
                with vitviz.capture_attention(model) as cap:
                    model(x)
                return torch.stack([attention_distance_from_maps(a, spec) for a in cap.attentions])
            if method == "timm":
                return extract(x)
            if method == "rollout":
                return vitviz.attention_rollout(model, x)
            if method == "distance":
                return vitviz.mean_attention_distance(model, x, batch_size=batch, autocast=False)  # model's dtype
        raise ValueError(method)

    once.graph_reserved_mb = reserved_mb
    once.graphed = graphed
    return once, spec


def time_case(args: argparse.Namespace, device: str, size: int, batch: int) -> dict:
    """Median wall time of each method, methods taking turns; on CUDA also each method's peak memory.

    A method other than ``plain`` that raises in its warm-up call is left out of the rest of the case and named in
    ``failed`` (method -> the error), so that one method's failure (a kernel that does not build on this GPU, say)
    does not lose the other methods' rows of the case; ``plain``, what every ratio divides by, failing fails the
    case."""
    import torch

    once, spec = _setup(args, device, size, batch)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times: dict[str, list[float]] = {m: [] for m in args.methods}
    cpu: dict[str, list[float]] = {m: [] for m in args.methods}
    failed: dict[str, str] = {}
    for i in range(args.repeats + 1):
        for m in [m for m in args.methods if m not in failed]:
            sync()
            t, c = time.perf_counter(), time.process_time()
            if i == 0 and m != "plain":  # the warm-up call: a method that fails here is left out, and said
                try:
                    out = once(m)
                except Exception as e:  # noqa: BLE001 - any failure of one method; the others go on
                    failed[m] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    times.pop(m), cpu.pop(m)
                    if cuda:
                        torch.cuda.empty_cache()
                    continue
            else:
                out = once(m)
            sync()
            if i:  # the first round warms up
                times[m].append(time.perf_counter() - t)
                cpu[m].append(time.process_time() - c)
            del out
    peak: dict[str, float] = {}
    if cuda:
        for m in times:
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = once(m)
            torch.cuda.synchronize()
            peak[m] = (torch.cuda.max_memory_allocated() - base) / 2**20
            del out
    kept_alloc_mb = None
    if cuda:  # the kept (L, B, N, N) float32 layer maps as the allocator holds them: one block, whose size it
        # rounds (a large one up to 2 MiB, unsplit when less than 1 MiB would be left: c10's CUDACachingAllocator)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        kept = torch.empty(len(spec.attention_modules), batch, spec.num_tokens, spec.num_tokens, device=device)
        kept_alloc_mb = (torch.cuda.memory_allocated() - base) / 2**20
        del kept
    # how often each vitviz.graphed call recorded (1: the set-up's only; more: the timed calls recorded again, and
    # their times are not a replay's)
    recordings = {m: call.recordings for m, call in once.graphed.items() if hasattr(call, "recordings")}
    return {"times": times, "cpu": cpu, "peak": peak, "failed": failed, "graph_reserved_mb": once.graph_reserved_mb,
            "kept_alloc_mb": kept_alloc_mb, "graph_recordings": recordings,
            "tokens": spec.num_tokens, "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if cuda else None, "layers": len(spec.attention_modules),
            "versions": versions()}


def command_line() -> str:
    """This process's command as one would type it from the repository root (``python bench/SCRIPT.py ARGS``): each
    benchmark's rows record it, so that a table of them names the command that reproduces each row."""
    import shlex

    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def versions() -> dict:
    """The installed versions of the packages a benchmark's figures depend on (None: not installed)."""
    import importlib.metadata as md

    out = {}
    for name in ("torch", "timm", "triton", "transformers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def memory_case(args: argparse.Namespace, device: str, size: int, batch: int, method: str) -> float:
    """Peak resident memory (MiB) of two runs of ``method`` above what the model and its input hold (CPU)."""
    import gc

    once, _ = _setup(args, device, size, batch)
    gc.collect()
    exact = _reset_peak()
    base = _rss_kib("VmRSS") * 1024 if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for _ in range(2):
        out = once(method)
        del out
    hwm = _rss_kib("VmHWM") if exact else None
    return ((hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 - base) / 2**20


def spawn(args: argparse.Namespace, kind: str, device: str, size: int, batch: int, methods: list[str]):
    cmd = [sys.executable, __file__, "--_case", f"{kind},{device},{size},{batch}", "--repeats", str(args.repeats),
           *(["--thp"] if args.thp else []),
           "--model", args.model, "--dtype", args.dtype, "--methods", *methods]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if args.thp:  # read by PyTorch's CPU allocator at start-up: large tensors on 2 MB transparent huge pages
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"case {kind} {device} {size} {methods} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, device: str, size: int, batch: int,
            failed: list[str] | None = None) -> list[dict]:
    """The rows of one case; a method the case's process left out (``time_case``'s ``failed``) gets no row and is
    appended to ``failed`` as ``"<device> <size> px batch <batch> <method>: <error>"``."""
    timing = spawn(args, "time", device, size, batch, args.methods)
    run = uuid.uuid4().hex[:12]  # the process that timed this case: its rows' ratios are to its own plain forward
    results = []
    for m in args.methods:
        if m in timing.get("failed", {}):
            print(f"{device} {args.model} {args.dtype} {size}px b{batch} {m}: failed, left out of this case: "
                  f"{timing['failed'][m]}", file=sys.stderr, flush=True)
            if failed is not None:
                failed.append(f"{device} {size} px batch {batch} {m}: {timing['failed'][m]}")
            continue
        if device.startswith("cuda"):
            mem = timing["peak"][m]
        else:
            mem = None if args.no_memory else spawn(args, "memory", device, size, batch, [m])
        t, c = timing["times"][m], timing["cpu"][m]
        med = statistics.median(t)
        results.append({"model": args.model, "dtype": args.dtype, "device": device, "gpu": timing["gpu"],
                        "size": size, "batch": batch, "method": m, "time_s": med, "times": t, "images_per_s": batch / med,
                        "cpu_s": statistics.median(c), "cpu_times": c, "peak_extra_mb": mem,
                        "graph_reserved_mb": timing.get("graph_reserved_mb", {}).get(m),
                        "kept_alloc_mb": timing.get("kept_alloc_mb"),
                        "graph_recordings": timing.get("graph_recordings", {}).get(m),
                        "tokens": timing["tokens"], "threads": timing["threads"], "layers": timing["layers"],
                        "versions": timing["versions"], "run": run, "command": getattr(args, "command", None)})
        print(f"{device} {args.model} {args.dtype} {size}px b{batch} {m:15} {med:.4f} s  {batch / med:8.1f} img/s  "
              + ("peak not measured" if mem is None else f"peak +{mem:.1f} MB"), flush=True)
        if results[-1]["graph_recordings"] not in (None, 1):
            print(f"  {m}: recorded {results[-1]['graph_recordings']} times, not once: its times include "
                  "recordings (the model or a switch changed between calls)", flush=True)
    return results


def _peak(row: dict) -> float:
    """A row's peak extra memory in MB; NaN where it was not measured (``--no-memory`` records ``None``: the JSON
    stays strict, no ``NaN`` token), so the shares and sums over it are NaN, i.e. not measured."""
    return float("nan") if row["peak_extra_mb"] is None else row["peak_extra_mb"]


def goal_rows(case: dict[str, dict]) -> list[dict]:
    """The goals of one case (``case``: method -> result row, one device, model, dtype and size, ``plain`` among
    them): for each streaming method measured, its time over plain's, its extra memory over plain's against its
    store-everything counterpart's, and which goals it meets (``None``: no goal at this size, or the memory share not
    measured: the counterpart not run beside it, whose fields are then ``None``, or CPU ``--no-memory``'s unmeasured (``None``) peaks;
    such a goal is neither met nor missed, while the time goal and the kept maps' bound are still judged).
    The one place the goals are computed: ``report`` prints these, ``bench/gpu_tables.py`` tabulates them."""
    plain = case["plain"]
    dev, dtype, size = plain["device"], plain["dtype"], plain["size"]
    goals = GOAL_TIME if dev == "cpu" else GOAL_TIME_CUDA.get(dtype, {})
    # the kept (L, B, N, N) float32 fused layer maps of keep="layers" rollout: the GPU memory bound, as the allocator
    # holds them where the run measured it (``kept_alloc_mb``: peaks are counted in its blocks, 226.0 MB for the
    # 225.7 MB of ViT-B/16's at 448 px, batch 8), else their bytes (rows recorded before the layer count was,
    # bench/results/h100_attention*.json, have none)
    kept = None if dev == "cpu" or "layers" not in plain else plain.get("kept_alloc_mb") or (
        plain["layers"] * plain["batch"] * plain["tokens"] ** 2 * 4 / 2**20)
    rows = []
    for stream, store in PAIRS.items():
        if stream not in case:
            continue
        counterpart = case.get(store)  # None: not run beside it (bench/gpu_run.sh's batch part), no memory share
        # a recorded call also holds its recording: the memory of its graph's private pool counts as extra
        extra = _peak(case[stream]) + (case[stream].get("graph_reserved_mb") or 0.0) - _peak(plain)
        extra_store = None if counterpart is None else _peak(counterpart) - _peak(plain)
        share = extra / extra_store if extra_store is not None and extra_store > 0 else float("nan")
        # not measured (no counterpart, CPU --no-memory's unmeasured peaks) or no store-everything memory to compare with
        memory_met = None if share != share else share <= GOAL_MEMORY
        floor = case.get("plain_graphed")
        # a recorded call beside the plain forward recorded the same way: what the maps add to a recording (both
        # pools and both replays' peaks), apart from what recording a forward itself holds beyond its eager peak
        recorded = case[stream].get("graph_reserved_mb") is not None and floor is not None and \
            floor.get("graph_reserved_mb") is not None
        extra_graphed = (_peak(case[stream]) + case[stream]["graph_reserved_mb"]
                         - _peak(floor) - floor["graph_reserved_mb"]) if recorded else None
        rows.append({"method": stream, "store": store, "x_plain": case[stream]["time_s"] / plain["time_s"],
                     "x_plain_graphed": None if floor is None else case[stream]["time_s"] / floor["time_s"],
                     "store_x_plain": None if counterpart is None else counterpart["time_s"] / plain["time_s"],
                     "extra_mb": extra,
                     "store_extra_mb": extra_store, "memory_share": share, "time_goal": goals.get(size),
                     "time_met": case[stream]["time_s"] / plain["time_s"] <= goals[size] if size in goals else None,
                     "memory_goal": GOAL_MEMORY, "memory_met": memory_met,
                     "kept_mb": kept, "kept_met": None if kept is None else extra <= kept,
                     "extra_over_plain_graphed_mb": extra_graphed,
                     "kept_met_over_plain_graphed": None if kept is None or extra_graphed is None
                     else extra_graphed <= kept})
    return rows


def cases(results: list[dict]) -> dict[tuple, dict[str, dict]]:
    """The results grouped by (device, model, dtype, size, batch), each a dict method -> row, in the order first
    seen: a size run at two batches is two cases, each method over the plain forward of its own batch.

    A case measured again (``--json`` appends: the same command run twice, a part of ``bench/gpu_run.sh`` run again
    after a cut) is the later process's rows alone (each row's ``run``: the process that timed it), never mixed with
    the earlier's: every ratio is to the plain forward timed in the same process, and a method the later process did
    not run has no row rather than one divided by another process's plain forward. Rows without ``run`` (recorded
    before it was) group as before.

    Rows of two ``setting`` s (a field a results file may carry: one model measured with a switch of vitviz's set
    otherwise) under one key are refused: each setting's rows are their own cases, over their own plain forward
    (``report`` splits them); grouped together, one setting's rows replaced the other's and a ratio was taken over
    the other setting's plain forward."""
    out: dict[tuple, dict[str, dict]] = {}
    runs: dict[tuple, object] = {}
    settings: dict[tuple, object] = {}
    for r in results:
        key = (r["device"], r["model"], r["dtype"], r["size"], r["batch"])
        if settings.setdefault(key, r.get("setting")) != r.get("setting"):
            raise ValueError(f"{key}: rows of two settings, {settings[key]!r} and {r.get('setting')!r}; group each "
                             "setting's rows on their own (report() does)")
        if key in runs and runs[key] != r.get("run"):
            out[key] = {}  # a later process's case: replaces the earlier's whole (the key keeps its place)
        runs[key] = r.get("run")
        out.setdefault(key, {})[r["method"]] = r
    return out


def report(results: list[dict]) -> bool:
    """Print the table and the goals; True when every goal measured here was met. Rows of several ``setting`` s
    are printed a setting at a time, each under its name (``cases``)."""
    named = list(dict.fromkeys(r.get("setting") for r in results))
    if len(named) > 1:
        met = True
        for setting in named:
            print(f"\nsetting: {setting}")
            met = report([r for r in results if r.get("setting") == setting]) and met
        return met
    ok = True
    hdr = (f"{'device':6} {'model':22} {'dtype':5} {'px':>4} {'B':>3} {'N':>4} {'method':15} {'wall s':>8} "
           f"{'x plain':>7} {'min x':>6} {'cpu x':>6} {'img/s':>8} {'peak MB':>9}")
    print("\nwall = median wall time; min x = fastest run / fastest plain; cpu x = median process CPU time / plain's "
          "(robust to other processes when torch runs one thread); peak = memory above model + input\n" + hdr)
    for (dev, model, dtype, size, _), case in cases(results).items():
        plain = case["plain"]
        for m, r in case.items():
            print(f"{dev:6} {model:22} {dtype:5} {size:>4} {r['batch']:>3} {r['tokens']:>4} {m:15} {r['time_s']:8.4f} "
                  f"{r['time_s'] / plain['time_s']:7.2f} {min(r['times']) / min(plain['times']):6.2f} "
                  f"{r['cpu_s'] / plain['cpu_s']:6.2f} {r['images_per_s']:8.1f} {_peak(r):9.1f}")
        for g in goal_rows(case):
            graphed = "" if g["x_plain_graphed"] is None else f", {g['x_plain_graphed']:.2f}x plain_graphed"
            store = "" if g["store_x_plain"] is None else f", {g['store_x_plain']:.2f}x for {g['store']}"
            versus = "" if g["store_extra_mb"] is None else \
                f" vs {g['store_extra_mb']:.1f} MB ({g['memory_share']:.0%})"
            line = [f"  -> {g['method']}: {g['x_plain']:.2f}x plain{graphed}{store}; extra memory "
                    f"{g['extra_mb']:.1f} MB{versus}"]
            if g["time_met"] is not None:
                ok &= g["time_met"]
                line.append(f"time goal <= {g['time_goal']:.2f}x: {'met' if g['time_met'] else 'MISSED'}")
            if g["memory_met"] is None:
                line.append(f"memory goal <= {GOAL_MEMORY:.0%}: not measured"
                            + (f" ({g['store']} not run)" if g["store_extra_mb"] is None else ""))
            else:
                ok &= g["memory_met"]
                line.append(f"memory goal <= {GOAL_MEMORY:.0%}: {'met' if g['memory_met'] else 'MISSED'}")
            if g["kept_met"] is not None:
                ok &= g["kept_met"]
                line.append(f"extra <= kept layer maps ({g['kept_mb']:.1f} MB): {'met' if g['kept_met'] else 'MISSED'}")
            if g["kept_met_over_plain_graphed"] is not None:
                line.append(f"over the recorded plain forward {g['extra_over_plain_graphed_mb']:.1f} MB: "
                            f"{'met' if g['kept_met_over_plain_graphed'] else 'MISSED'}")
            print("; ".join(line))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_base_patch16_224",
                    help=f"timm model name, or one of {sorted(HF_MODELS)} (Hugging Face ViTModel, SDPA) or {list(TV_MODELS)} "
                    "(torchvision); random weights")
    ap.add_argument("--sizes", type=int, nargs="+", default=[224, 448])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 2], help="one per size (or one for all)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", nargs="+", default=None, help="cpu and/or cuda (default: cuda if present, else cpu)")
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS,
                    help="default: all but grad_rollout on CPU, all on CUDA")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--thp", action="store_true", help="THP_MEM_ALLOC_ENABLE=1 for every method (CPU: large tensors "
                    "on huge pages, fewer page faults for the N x N maps)")
    ap.add_argument("--json", default=None, help="also write the results to this file (appends to a list there)")
    ap.add_argument("--no-memory", action="store_true", help="CPU: skip the fresh process per method that measures "
                    "its peak memory (recorded as null)")
    ap.add_argument("--_case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._case:
        kind, dev, size, batch = args._case.split(",")
        if kind == "time":
            print(json.dumps(time_case(args, dev, int(size), int(batch))))
        else:
            print(json.dumps(memory_case(args, dev, int(size), int(batch), args.methods[0])))
        return 0
    if args.device is None:
        import torch

        args.device = ["cuda"] if torch.cuda.is_available() else ["cpu"]
    batches = args.batch * len(args.sizes) if len(args.batch) == 1 else args.batch
    if len(batches) != len(args.sizes):
        ap.error(f"--batch takes one value or one per size; got {args.batch} for sizes {args.sizes}")
    from vitviz.core.io import atomic_write_json

    args.command = command_line()  # each row names the command that measured it
    asked, path = args.methods, Path(args.json) if args.json else None
    results, failed = [], []
    for dev in args.device:  # each device its own defaults (CUDA's kernels and recorded calls, not on the CPU)
        methods = asked or [m for m in METHODS
                            if m not in GRAPHED and (dev != "cpu" or m not in CUDA_ONLY + NEW_ON_CPU)]
        args.methods = ["plain", *[m for m in methods if m != "plain"]]
        for size, batch in zip(args.sizes, batches):
            try:
                rows = measure(args, dev, size, batch, failed)
            except RuntimeError as e:  # a case's process failed: said, and the other cases still run
                print(e, file=sys.stderr, flush=True)
                failed.append(f"{dev} {size} px batch {batch}")
                continue
            results += rows
            if path is not None:  # after every case, atomically: a run cut by a time limit keeps the cases before
                old = json.loads(path.read_text()) if path.exists() else []
                atomic_write_json(path, old + rows)
    ok = report(results)
    if failed:
        print(f"\nfailed cases or methods (exit 1): {'; '.join(failed)}", flush=True)
        return 1
    return 0 if ok else EXIT_GOAL_MISSED


if __name__ == "__main__":
    sys.exit(main())
