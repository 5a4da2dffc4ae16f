"""The head-map kernels alone on CUDA (``vitviz.core.kernels.headmaps``): time per layer against the attention that
the forward itself runs, block shapes swept, and the agreement with the PyTorch stream path.

For each shape (one layer of ViT-B/16 or ViT-L/16 at 224 or 448 px) and dtype, with ``q, k, v`` ``(B, H, N, d)``:

- ``sdpa``: ``F.scaled_dot_product_attention(q, k, v)`` (flash attention in bf16/fp16, the memory-efficient kernel
  in float32): the forward's own cost;
- ``lse``: ``row_logsumexp`` (the first pass); ``fuse``: ``fuse_heads_kernel`` given that lse (the second);
- ``fuse+lse``: both, as the stream probe runs them for rollout; ``distance``: ``distance_sums_kernel`` (one pass);
- ``torch_fuse``: the PyTorch stream path's head mean (``HeadMaps.fuse`` over the recomputed heads), the reference.

Times are medians of ``triton.testing.do_bench`` (CUDA events) in milliseconds; ``max_abs`` is the largest
difference of the kernel's head mean from the PyTorch path's. Each ``--blocks`` entry ``BM,BN,WARPS,STAGES`` is one
kernel configuration (``VITVIZ_HEADMAP_BLOCKS``); ``default`` is vitviz's choice (``CANDIDATES``: the others swept by
default). Rows are appended to ``--json`` when it exists. Dtype ``fp32`` runs the kernels
at vitviz's float32 precision (3xTF32 at head dim 64), ``fp32-ieee`` with plain float32 dots, for comparison.

    python bench/headmap_kernel.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DTYPES = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp32": ("float32", None),
          "fp32-ieee": ("float32", "ieee")}  # name: (torch dtype, the kernels' precision argument)
# the block shapes swept besides vitviz's choice: sm_90's table (64 x 64, 8 warps) and the half types' shape for
# every GPU (64 x 32), then shapes in which one warp group (4 warps) owns 64 whole rows, as in flash attention:
# 64 x 64 with 4 warps, 128 x 64 and 128 x 32 with 8. Compiled for sm_90 they keep the row maxima and sums within
# warps where 64-row tiles over 8 warps split each row between two warp groups (and exchange partial sums through
# shared memory, with a barrier, for every reduction: bench/headmap_sass.py); none spills for sm_90 at ViT-B's
# head dim without a mask, in bf16 or 3xTF32 float32.
CANDIDATES = ["64,64,8,3", "64,32,8,2", "64,64,4,3", "128,64,8,3", "128,64,8,2", "128,32,8,3"]
SHAPES = {  # name: (B, H, N, d, L)
    "vit_b16_224": (32, 12, 197, 64, 12),
    "vit_b16_448": (8, 12, 785, 64, 12),
    "vit_l16_224": (32, 16, 197, 64, 24),
    "vit_l16_448": (8, 16, 785, 64, 24),
    "tiny": (2, 3, 37, 16, 2),  # for --device cpu under TRITON_INTERPRET=1 (bench/gpu_run.sh's rehearsal)
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=[s for s in SHAPES if s != "tiny"], choices=list(SHAPES))
    ap.add_argument("--device", default="cuda", help="cuda; or cpu under TRITON_INTERPRET=1 (a rehearsal: its times "
                    "are the interpreter's and mean nothing)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32", "fp32-ieee"], choices=list(DTYPES),
                    help="fp32: vitviz's float32 precision (3xTF32 at head dim <= 64); fp32-ieee: plain float32 dots")
    ap.add_argument("--blocks", nargs="+",
                    default=["default", *CANDIDATES])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from attention import command_line, versions
    from triton.testing import do_bench

    from vitviz.core.families.base import HeadMaps
    from vitviz.core.kernels import headmaps

    cuda = args.device.startswith("cuda")

    def bench(fn) -> float:
        if cuda:
            return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[1]

    def case(name: str, dt: str) -> list[dict]:
        b, h, n, d, layers = SHAPES[name]
        dtype, prec = getattr(torch, DTYPES[dt][0]), DTYPES[dt][1]
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device=args.device, dtype=dtype) for _ in range(3))
        scale = d ** -0.5
        dist = torch.rand(n - 1, n - 1, device=args.device) * 400
        qs = q * scale

        def head(i: int) -> torch.Tensor:
            return (qs[:, i] @ k[:, i].transpose(-1, -2)).float().softmax(-1)

        def torch_path() -> torch.Tensor:
            return HeadMaps((b, h, n, n), torch.float32, q.device, head).fuse("mean")

        ref = torch_path()
        base = {"shape": name, "dtype": dt, "B": b, "H": h, "N": n, "d": d, "layers": layers,
                "gpu": torch.cuda.get_device_name() if cuda else None, "command": command_line(),
                "versions": versions()}
        sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v))
        torch_fuse = bench(torch_path)
        out = torch.empty(b, n, n, device=args.device)
        rows = []
        for blocks in args.blocks:
            if blocks == "default":
                os.environ.pop("VITVIZ_HEADMAP_BLOCKS", None)
            else:
                os.environ["VITVIZ_HEADMAP_BLOCKS"] = blocks
            try:
                lse = headmaps.row_logsumexp(q, k, scale, precision=prec)
                err = float((headmaps.fuse_heads_kernel(q, k, scale, "mean", lse=lse, out=out, precision=prec)
                             - ref).abs().max())
                t = {"lse": bench(lambda: headmaps.row_logsumexp(q, k, scale, precision=prec)),
                     "fuse": bench(lambda lse=lse: headmaps.fuse_heads_kernel(q, k, scale, "mean", lse=lse, out=out,
                                                                             precision=prec)),
                     "fuse+lse": bench(lambda: headmaps.fuse_heads_kernel(q, k, scale, "mean", out=out,
                                                                         precision=prec)),
                     "distance": bench(lambda: headmaps.distance_sums_kernel(q, k, scale, dist, 1, precision=prec))}
                row = {**base, "blocks": blocks, "sdpa_ms": sdpa, "torch_fuse_ms": torch_fuse, "max_abs": err,
                       **{f"{key}_ms": val for key, val in t.items()}}
                print(f"{name:12} {dt:9} {blocks:11} sdpa {sdpa:7.3f} ms | lse {t['lse']:7.3f} fuse {t['fuse']:7.3f} "
                      f"fuse+lse {t['fuse+lse']:7.3f} ({t['fuse+lse'] / sdpa:4.2f}x sdpa) distance "
                      f"{t['distance']:7.3f} ({t['distance'] / sdpa:4.2f}x) | torch fuse {torch_fuse:7.3f} | "
                      f"max|diff| {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001 (a configuration that does not compile: report it, go on)
                row = {**base, "blocks": blocks, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{name:12} {dt:9} {blocks:11} ERROR {row['error']}", flush=True)
            rows.append(row)
        return rows

    path = Path(args.json) if args.json else None
    rows = json.loads(path.read_text()) if path is not None and path.exists() else []  # appended to, as by attention.py
    for name in args.shapes:
        for dt in args.dtypes:
            rows += case(name, dt)
            if cuda:
                torch.cuda.empty_cache()
            if path is not None:  # after every case, atomically: a run cut short by its time limit keeps what it measured
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(rows, indent=1) + "\n")
                os.replace(tmp, path)
    os.environ.pop("VITVIZ_HEADMAP_BLOCKS", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
