"""FLOP counts: measured with ``torch.utils.flop_counter.FlopCounterMode``, and the analytic ViT formula.

FLOPs count a multiply-add as 2 (the convention of ``FlopCounterMode`` and of the ViT paper's exaFLOPs).
"""

from __future__ import annotations

import torch
from torch import nn


def count_flops(model: nn.Module, input_size: tuple[int, int, int] = (3, 32, 32), backward: bool = False) -> int:
    """FLOPs for one image: the forward pass, or forward + backward (one training step's compute).

    Args:
        model: any module taking ``(1, *input_size)``.
        input_size: ``(C, H, W)``.
        backward: count the backward pass of ``output.sum()`` as well.

    Returns:
        The count, with attention counted through PyTorch's math SDPA backend on every device.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    x = torch.randn(1, *input_size, device=device)
    was_training = model.training
    model.train(backward)
    counter = FlopCounterMode(display=False)
    try:
        # The math backend spells attention out as matmuls, which every torch counts; a fused kernel is counted
        # only where FlopCounterMode has a formula registered for it (not for CPU flash attention in torch 2.14).
        with counter, sdpa_kernel(SDPBackend.MATH):
            if backward:
                model(x).sum().backward()
            else:
                with torch.no_grad():
                    model(x)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return int(counter.get_total_flops())


def vit_forward_flops(*, img_size: tuple[int, int], patch_size: int, embed_dim: int, depth: int,
                      mlp_ratio: float = 4.0, num_prefix_tokens: int = 1, num_classes: int = 1000,
                      in_chans: int = 3) -> int:
    """Analytic forward FLOPs of a plain ViT for one image (matmuls and the patch conv; norms etc. ignored).

    Per block with ``N`` tokens and width ``D``: qkv ``3ND^2``, projection ``ND^2``, MLP ``2 r N D^2`` and attention
    ``2 N^2 D`` (``QK^T`` and ``AV``) multiply-adds; patch embedding ``P * C p^2 D``; head ``D * classes``.
    """
    gh, gw = img_size[0] // patch_size, img_size[1] // patch_size
    p = gh * gw
    n = p + num_prefix_tokens
    d = embed_dim
    per_block = n * (3 * d * d + d * d + 2 * mlp_ratio * d * d) + 2 * n * n * d
    macs = depth * per_block + p * in_chans * patch_size**2 * d + d * num_classes
    return int(2 * macs)
