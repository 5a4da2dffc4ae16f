"""Head-averaged attention statistics over many images: the mean attention map and each head's entropy.

For each layer ``l`` the mean over images of the head-averaged post-softmax attention,
``M_l = mean_images mean_h A_lh`` ``(N, N)`` (rows sum to 1: each is a mean of distributions), the quantity the
ViT paper's rollout and attention figures fuse heads into (Dosovitskiy et al., ICLR 2021, App. D.8, with the
head mean of Abnar & Zuidema 2020); and each head's attention entropy in nats, ``-sum_k a_qk log a_qk`` (with ``0
log 0 = 0``) averaged over queries and images (low: focused heads; ``log N``: uniform). Both read every token,
prefix tokens (class, distillation, registers) included, as queries and as keys: ``N`` counts them. Reduced while
the forward runs, kept as running sums, so a folder, ``Dataset`` or ``DataLoader`` of any size (also under
``torchrun``) costs ``L N^2`` memory.

Shapes: ``B`` batch, ``L`` layers, ``H`` heads, ``N`` tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.batching import iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.capture import HeadMaps, capture_attention
from vitviz.core.datasets import (
    RunningReduction,
    autocast_context,
    autocast_dtype,
    is_dataset_source,
    reduce_dataset,
)
from vitviz.core.images import Images
from vitviz.core.spec import inspect
from vitviz.errors import CaptureError, ImageInputError, InputTypeError

__all__ = ["AttentionStatsReduction", "attention_statistics"]


class AttentionStatsReduction(RunningReduction):
    """Running sums of the head-averaged maps ``(L, N, N)`` and per-head entropies ``(L, H)``, over images."""

    name = "attention_statistics"

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.spec = inspect(model)
        # means of distributions and entropies need distributions: checked here, so on every input path
        self.spec.require_maps("attention_statistics", ("softmax",),
                               hint="the mean map averages and the entropy reads each query's attention "
                                    "distribution over all tokens")
        self.layers = len(self.spec.attention_modules)
        self.grid: tuple[int, int] | None = None  # the patch grid of the images summed so far

    def fingerprint(self) -> dict[str, Any]:
        return {"reduction": self.name, "vit": self.spec.name, "layers": self.layers, "heads": self.spec.num_heads}

    def _on_layer(self, position: int, attn: torch.Tensor | HeadMaps) -> None:
        b, h, n, _ = attn.shape
        if "mean_map" not in self.sums:
            self.sums["mean_map"] = torch.zeros(self.layers, n, n, dtype=torch.float64, device=attn.device)
            self.sums["entropy"] = torch.zeros(self.layers, h, dtype=torch.float64, device=attn.device)
        elif self.sums["mean_map"].shape[-1] != n:
            raise ImageInputError(f"attention_statistics needs one token count for all images: got {n} tokens after "
                              f"{self.sums['mean_map'].shape[-1]}; resize the images to one size")
        device = self.sums["mean_map"].device
        fused = torch.zeros(n, n, device=attn.device, dtype=torch.float32)  # sum over images and heads
        ent = torch.empty(h, device=attn.device, dtype=torch.float32)
        heads = attn if isinstance(attn, HeadMaps) else HeadMaps.of(attn)
        for head, m in heads.heads():  # one (B, N, N) map at a time
            fused += m.sum(dim=0, dtype=torch.float32)
            ent[head] = torch.special.entr(m.float()).sum(dim=-1).mean(dim=-1).sum()
        # in place on the rows (see ``DistanceReducer``): float32 added into float64 is cast first
        self.sums["mean_map"][position].add_(fused.mul_(1.0 / h).to(device))
        self.sums["entropy"][position].add_(ent.to(device))

    def update(self, model: nn.Module, x: torch.Tensor, target: Any = None) -> None:
        # a model of any input size makes as many tokens from 32x48 as from 48x32 images, on transposed grids: the
        # token count alone (checked per layer) would let maps that index other patches be summed
        grid = self.spec.grid_for_input(x)
        if self.grid is not None and grid != self.grid:
            (h, w), (gh, gw), (oh, ow) = x.shape[-2:], grid, self.grid
            raise ImageInputError(f"attention_statistics needs one patch grid for all images: {h}x{w} images make "
                                  f"a {gh}x{gw} grid after images of a {oh}x{ow} grid, whose maps index other "
                                  "patches; resize the images to one size")
        self.grid = grid
        with capture_attention(model, on_layer=self._on_layer, store=False, heads="stream"):
            model(x)

    def state_dict(self) -> dict[str, Any]:  # the grid too: a resumed run must sum maps of the same patches
        return {**super().state_dict(), "grid": None if self.grid is None else list(self.grid)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.grid = None if state.get("grid") is None else tuple(state["grid"])

    def result(self) -> dict[str, torch.Tensor]:
        """``{"mean_attention": (L, N, N), "entropy": (L, H)}`` float32 on the CPU."""
        if self.images == 0 or "mean_map" not in self.sums:
            raise CaptureError("attention_statistics saw no images")
        return {"mean_attention": (self.sums["mean_map"].cpu() / self.images).float(),
                "entropy": (self.sums["entropy"].cpu() / self.images).float()}


@in_eval_mode
def attention_statistics(
    model: nn.Module,
    images: Images | Any,
    *,
    batch_size: int = 32,
    progress: bool = False,
    autocast: torch.dtype | bool | None = None,
    **dataset_options: Any,
) -> dict[str, torch.Tensor]:
    """Mean head-averaged attention map per layer and each head's mean attention entropy, over ``images``.

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor, PIL images / arrays / paths; or a folder of images, a
            ``torch.utils.data.Dataset`` or a ``DataLoader`` (one image size throughout).
        batch_size: images per forward pass.
        progress: a progress bar over images.
        autocast: ``torch.autocast`` dtype, the same rule on every input path
            (``vitviz.core.datasets.autocast_dtype``): by default bfloat16 on CUDA and none on the CPU; ``False``
            for none; a dtype is used on any device.
        **dataset_options: for a dataset, the options of ``vitviz.core.datasets.reduce_dataset``.

    Returns:
        ``{"mean_attention": (L, N, N), "entropy": (L, H)}`` float32 on the CPU; rows of each mean map sum to 1,
        entropies are in nats.

    Raises:
        UnsupportedModelError: a layer's maps are not softmax distributions over all tokens (CaiT's talking-heads
            and class-attention layers, differential attention; ``ViTSpec.attention_maps``), on every input path.
        ImageInputError: images of another patch grid than those before them (a model of any input size).
    """
    reduction = AttentionStatsReduction(model)
    if is_dataset_source(images):
        return reduce_dataset(model, images, reduction, batch_size=batch_size, progress=progress,
                              autocast=autocast, **dataset_options).result()
    if dataset_options:
        raise InputTypeError(f"{sorted(dataset_options)} apply to a folder, Dataset or DataLoader, not to a batch")
    device = next(model.parameters()).device
    amp = autocast_dtype(autocast, device)
    for x in iter_batches(model, images, batch_size, progress=progress, desc="attention statistics"):
        with torch.no_grad(), autocast_context(amp, device):
            reduction.update(model, x)
        reduction.images += len(x)
    return reduction.result()
