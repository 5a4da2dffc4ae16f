"""FLOP counts: measured with ``torch.utils.flop_counter.FlopCounterMode``, and the analytic ViT formula.

FLOPs count a multiply-add as 2 (the convention of ``FlopCounterMode`` and of the ViT paper's exaFLOPs).

The count is the same on every attention kernel path and every supported torch. ``FlopCounterMode`` knows
formulas for some fused ``scaled_dot_product_attention`` kernels but not for others (torch 2.14 does not count
the CPU flash kernel ``aten._scaled_dot_product_flash_attention_for_cpu``; older versions miss more), so a count
taken on the fused path would depend on the device and the torch version. ``count_flops`` therefore runs the
pass with SDPA's math backend, which computes attention as the explicit ``Q K^T`` and ``A V`` matmuls that every
torch counts: fused, math and explicit (``fused_attn=False``) models all count ``2 N^2 D`` multiply-adds per block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from vitviz.core.contexts import (
    autograd,
    checkpointing_off,
    normal_tensor,
    parameter_hooks_off,
    refuse_quantized,
    without_autocast,
)
from vitviz.core.spec import inspect
from vitviz.core.util import is_int, kept_buffers, kept_grads, kept_rng, module_mode
from vitviz.errors import InputError, InputTypeError, NotAViTError


@contextlib.contextmanager
def sdpa_math_backend() -> Iterator[None]:
    """Run ``F.scaled_dot_product_attention`` with its math backend (explicit matmuls) on every device.

    ``torch.nn.attention.sdpa_kernel`` (torch >= 2.3) or the older ``torch.backends.cuda.sdp_kernel``; both set
    the global backend flags that the CPU and CUDA kernel choice read, and restore them on exit.
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        ctx = torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False)
    else:
        ctx = sdpa_kernel([SDPBackend.MATH])
    with ctx:
        yield


def _check_input(model: nn.Module, input_size: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """The ``(C, H, W)`` to count with: ``input_size``, or for ``None`` the size a ViT vitviz reads is built for.

    Refuses a non-module, an ``input_size`` that is not ``(C, H, W)`` positive ints, one the ViT cannot take, or
    ``None`` for a module vitviz cannot read (its input size is then unknown)."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"model={model!r} is a {type(model).__name__}, not a torch.nn.Module; pass the model "
                             "whose FLOPs to count")
    try:
        spec = inspect(model)
    except NotAViTError:
        spec = None
    if input_size is None:
        if spec is None:
            raise InputError(f"input_size=None: {type(model).__name__} is not a ViT vitviz reads, so the size of "
                             "its input is unknown; pass input_size=(C, H, W), e.g. (3, 224, 224)")
        channels = next((m.in_channels for m in model.modules() if isinstance(m, nn.Conv2d)), 3)
        return (int(channels), *spec.img_size)
    sizes = list(input_size) if isinstance(input_size, (tuple, list, torch.Size)) else None
    if sizes is None or len(sizes) != 3 or any(
            not is_int(v) or v < 1 for v in sizes):
        raise InputError(f"input_size={input_size!r} is not the (C, H, W) of one image; pass three positive ints, "
                         "e.g. (3, 224, 224), or None for the size the model is built for")
    if spec is not None and not spec.takes((sizes[1], sizes[2])):
        (h, w), (sh, sw) = spec.img_size, spec.patch_size
        other = f", or any multiple of its {sh}x{sw} token stride" if spec.dynamic_img_size else ""
        raise InputError(f"input_size={input_size!r} does not fit the model ({spec.name} takes {h}x{w} images"
                         f"{other}); pass ({sizes[0]}, {h}, {w})")
    return (int(sizes[0]), int(sizes[1]), int(sizes[2]))


def count_flops(model: nn.Module, input_size: tuple[int, int, int] | None = None, backward: bool = False) -> int:
    """FLOPs for one image: the forward pass, or forward + backward (one training step's compute).

    Attention runs on SDPA's math backend for the count (see the module docstring), so the result does not depend
    on which fused kernel the device and torch version would pick. The forward count runs the model in eval mode,
    the training step in training mode (dropout, BatchNorm on batch statistics, a training-only token drop count
    as in training). Either way the model is left exactly as it was, also when the pass raises: every module's own
    mode (``core.util.module_mode``), every parameter's ``.grad`` (``kept_grads``: the user's gradients neither
    receive this step's nor are cleared), every buffer (``kept_buffers``: BatchNorm's running statistics and
    ``num_batches_tracked`` do not take in the random input), and the global random generators (``kept_rng``; the
    input comes from a generator of its own, seeded 0).

    Args:
        model: any module taking ``(1, *input_size)``.
        input_size: ``(C, H, W)``; default ``None``: the size a ViT vitviz reads is built for
            (``vitviz.inspect(model).img_size``, with the input channels of its first convolution). Any other module
            needs it.
        backward: count the backward pass of ``output.sum()`` as well (``output_tensor``: the output, its
            ``logits``, or a tuple's first element), also inside ``torch.no_grad()``.

    Returns:
        The total FLOPs (multiply-add = 2) of one image's pass.

    Raises:
        InputTypeError: ``model`` is not a ``torch.nn.Module``.
        UnsupportedModelError: ``model`` has quantized layers (``vitviz.core.contexts.quantized_layers``), whose
            products the counter does not see.
        InputError: ``input_size`` is not three positive ints, or (for a ViT vitviz reads) its ``H x W`` is not a
            size the model takes, or it is ``None`` for a module vitviz does not read; or, with ``backward``, the
            output holds no tensor to start the backward pass from.
    """
    from torch.utils.flop_counter import FlopCounterMode

    input_size = _check_input(model, input_size)
    refuse_quantized(model, "count_flops", "torch.utils.flop_counter has no formula for quantized kernels (nor for "
                     "torchao's integer matmuls), so their multiply-adds would go uncounted, silently; count the "
                     "float model it was quantized from, which performs the same products")
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    # the values do not change the count: drawn from a generator of its own, never the user's global one
    # ... and a normal tensor also inside a caller's inference mode (torch 2.5's counter misses operations on an
    # inference tensor outside it)
    with torch.inference_mode(False):
        x = torch.randn(1, *input_size, generator=torch.Generator().manual_seed(0)).to(device)
    counter = FlopCounterMode(display=False)
    # a training step runs in training mode (dropout, BatchNorm on batch statistics, token dropping); the model
    # comes back as it was: each module's mode, its .grad, its buffers (BatchNorm folded the noise into its running
    # statistics), the random generators dropout drew from
    # a caller's autocast would count other kernels (open_clip's attention takes another path in bfloat16)
    with module_mode(model, backward), kept_grads(model), kept_buffers(model), kept_rng(device), \
            without_autocast(model), parameter_hooks_off(model), checkpointing_off(model):
        with sdpa_math_backend(), counter:
            if backward:
                with autograd(model, "count_flops(backward=True)", weights=True):
                    output_tensor(model(normal_tensor(x))).sum().backward()
            else:  # out of a caller's inference mode: torch 2.5's counter sees no operation inside it
                with torch.inference_mode(False), torch.no_grad():
                    model(x)
    return int(counter.get_total_flops())


def output_tensor(output: Any) -> torch.Tensor:
    """The tensor a training step's loss is computed from: ``output`` itself, its ``logits`` (Hugging Face), or the
    first element of a tuple."""
    out = getattr(output, "logits", output)
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise InputError(f"count_flops(backward=True): the model's output is a {type(output).__name__} with no "
                         "tensor, logits or tuple of tensors to run the backward pass from; count the forward pass "
                         "only (backward=False)")
    return out


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
