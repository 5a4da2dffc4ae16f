"""Measuring a trained reference model: CIFAR-10 normalisation, top-1 accuracy, and the hardware it ran on.

Shared by training (``train``) and exporting cards (``export``), so neither imports the other.
"""

from __future__ import annotations

import torch
from torch import nn

from vitviz.core.util import eval_mode
from vitviz.experiments.data import TensorDataset
from vitviz.zoo.reference import CIFAR10_MEAN, CIFAR10_STD


def normalize(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
    return (images.to(device, non_blocking=True).float() / 255.0 - mean) / std


@torch.no_grad()
def evaluate(model: nn.Module, data: TensorDataset, device: torch.device, batch_size: int = 500) -> float:
    """Top-1 accuracy in percent on decoded uint8 images (CIFAR-10 normalisation); one host sync at the end."""
    correct = torch.zeros((), dtype=torch.long, device=device)
    labels = data.labels.to(device)
    with eval_mode(model):  # each module's own mode back afterwards, also when a batch raises
        for i in range(0, len(data), batch_size):
            x = normalize(data.images[i : i + batch_size], device)
            correct += (model(x).argmax(-1) == labels[i : i + batch_size]).sum()
    return 100.0 * correct.item() / max(1, len(data))


def device_description(device: torch.device) -> str:
    import platform

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import os

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    desc = f"CPU: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return desc
    return desc + (f", pinned to {allowed} of them" if allowed < (os.cpu_count() or allowed) else "")
