"""Throughput of the dataset path: a reduction over a whole folder (or synthetic images), images/s and peak memory.

Runs ``vitviz.mean_attention_distance`` (or ``attention_statistics``) over every image once through
``vitviz.core.datasets.reduce_dataset`` and reports images/s, wall time and peak memory (CPU: peak resident set
``VmHWM``; CUDA: ``torch.cuda.max_memory_allocated``).

Run from the repository root::

    python bench/dataset.py --model cifar10-vit --folder ../shared/data/cifar10/test --workers 1
    python bench/dataset.py --model vit_base_patch16_224 --synthetic 4096 --device cuda --batch 256
    python bench/dataset.py --model vit_base_patch16_224 --synthetic 16384 --device cuda --batch 256 \
        --reduction plain --warmup 4      # the plain forward over the same loader: the images/s to compare with
    torchrun --nproc_per_node 8 bench/dataset.py --model MODEL --folder DIR --device cuda --batch 256 --workers 8 \
        --checkpoint runs/distance.pt --out runs/distance_result.pt

Under ``torchrun`` (``WORLD_SIZE`` > 1) each process takes the GPU ``LOCAL_RANK`` (NCCL; gloo on CPU), reads its
shard and the sums are all-reduced; rank 0 prints and writes the result. ``--model`` is a vitviz zoo name (``vitviz.load_model``) or a timm name (random weights).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the vitviz of this checkout, not an installed one
sys.path.insert(0, str(ROOT / "bench"))


class SyntheticImages(Dataset):
    """``n`` images read from a pool of random ones in turn (image ``i`` is ``pool[i % len(pool)]``), items ``(x,)``
    as a ``TensorDataset``'s; at module level so that loader workers started by spawn can unpickle it."""

    def __init__(self, pool, n: int):
        self.pool, self.n = pool, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (self.pool[i % len(self.pool)],)


def _hwm_mib() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cifar10-vit")
    ap.add_argument("--folder", default=None, help="folder of images (default: --synthetic random images)")
    ap.add_argument("--synthetic", type=int, default=1024, help="number of random images when no folder is given")
    ap.add_argument("--pool", type=int, default=1024, help="--synthetic reads this many distinct random images in "
                    "turn (image i is image i %% pool): the loader copies every image as for a dataset in memory, "
                    "without generating and holding all of them (16,384 at 224 px would be 9.9 GB)")
    ap.add_argument("--reduction", default="distance", choices=["distance", "statistics", "plain"],
                    help="plain: the model's forward alone over the same loader (the baseline for images/s)")
    ap.add_argument("--kernel", default=None, choices=["auto", "on", "off"],
                    help="the head-map kernels (VITVIZ_HEADMAP_KERNEL; default: the environment's, else auto)")
    ap.add_argument("--warmup", type=int, default=0, help="batches run (and not timed) before the measured pass")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--autocast", default="bf16", choices=["bf16", "fp16", "off"], help="on CUDA")
    ap.add_argument("--checkpoint", default=None, help="resumable running sums (one file per rank)")
    ap.add_argument("--out", default=None, help="torch.save the result here (rank 0)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.kernel:
        os.environ["VITVIZ_HEADMAP_KERNEL"] = args.kernel

    import timm
    import torch
    from attention import command_line, versions
    from torch.utils.data import TensorDataset

    import vitviz
    from vitviz.analysis.attention_stats import AttentionStatsReduction
    from vitviz.analysis.distance import DistanceReduction
    from vitviz.core.datasets import RunningReduction, reduce_dataset
    from vitviz.core.io import atomic_write_json

    class PlainForward(RunningReduction):
        """The model's forward alone (its logits summed, so the work is used): the loader and autocast are
        reduce_dataset's, as for the reductions it is compared with."""

        name = "plain"

        def update(self, model, x, target=None):
            out = model(x).float().sum()
            self.sums["logits"] = self.sums["logits"] + out if "logits" in self.sums else out

        def result(self):
            return self.sums.get("logits")

    if args.threads:
        torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        cuda_run = args.device.startswith("cuda")
        if cuda_run:
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            torch.cuda.set_device(args.device)
        torch.distributed.init_process_group("nccl" if cuda_run else "gloo")
    try:
        model = vitviz.load_model(args.model)
    except Exception:  # noqa: BLE001 (not a zoo name: a timm architecture with random weights)
        model = timm.create_model(args.model, pretrained=False)
    model = model.eval().to(args.device)
    spec = vitviz.inspect(model)
    if args.folder:
        source = args.folder
    else:
        torch.manual_seed(0)  # the same images on every rank
        source = SyntheticImages(torch.randn(min(args.synthetic, args.pool), 3, *spec.img_size), args.synthetic)
    make = {"distance": DistanceReduction, "statistics": AttentionStatsReduction, "plain": lambda m: PlainForward()}
    reduction = make[args.reduction](model)
    cuda = args.device.startswith("cuda")
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": False}[args.autocast] if cuda else False
    if args.warmup:  # Triton compilation, cuDNN/cuBLAS autotuning and allocator growth stay out of the timing
        warm = TensorDataset(torch.randn(args.warmup * args.batch, 3, *spec.img_size))
        reduce_dataset(model, warm, make[args.reduction](model), batch_size=args.batch, num_workers=0, autocast=amp)
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    reduce_dataset(model, source, reduction, batch_size=args.batch, num_workers=args.workers, autocast=amp,
                   progress=rank == 0, checkpoint=args.checkpoint)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    synthetic = f"{args.synthetic} random images (a pool of {min(args.synthetic, args.pool)} in turn)"
    out = {"model": args.model, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "source": args.folder or synthetic, "reduction": args.reduction, "images": reduction.images,
           "processes": world, "batch": args.batch, "workers": args.workers, "threads": torch.get_num_threads(),
           "autocast": args.autocast if cuda else "off", "kernel": os.environ.get("VITVIZ_HEADMAP_KERNEL", "auto"),
           "wall_s": wall, "images_per_s": reduction.images / wall,
           "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else _hwm_mib(),
           "command": command_line(), "versions": versions()}
    if world > 1:
        torch.distributed.barrier()  # every rank done before any tears its group down (gloo aborted at exit without)
        torch.distributed.destroy_process_group()
    if rank:
        return 0
    print(json.dumps(out))
    if args.out:
        torch.save(reduction.result(), args.out)
    if args.json:  # atomically: a run cut by a time limit leaves no half-written file
        atomic_write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
