"""RGB embedding filters and their principal components (ViT paper, Fig. 7 left).

Dosovitskiy et al., ICLR 2021 (arXiv 2010.11929), Fig. 7 left: the top 28 principal components of the learned
linear embedding filters of ViT-L/32, shown as RGB patches; they resemble plausible basis functions for a
low-dimensional representation of the fine structure within each patch.

For plain ViTs the filters are the patch projection (a ``Conv2d`` with kernel = stride = patch size). Hybrids
project backbone features with a 1x1 conv, which has no RGB filters: the first RGB filters live in the backbone
stem, and those are returned instead (``vitviz.inspect(model).hybrid`` says which). A ViT whose patch projection is a
stack of convs (a conv stem: Xiao et al., "Early Convolutions Help Transformers See Better", NeurIPS 2021;
torchvision's ``conv_stem_configs``) has no patch-sized RGB filters either: its stem's first conv is returned.
``filter_origin`` says which of the three the filters are, so that figures do not title a stem's filters as the
patch-embedding filters of Fig. 7 left.

The filters are the weights the conv *applies* in ``forward``, which are not always its ``weight`` parameter:
timm's hybrid stems are ``StdConv2d`` / ``StdConv2dSame`` (Kolesnikov et al., "Big Transfer", ECCV 2020, weight
standardisation: each filter minus its mean, over its standard deviation), which standardise the weight on every
call. ``applied_weight`` reads the weight handed to ``conv2d`` while the module's own ``forward`` runs once, so
timm's standardisation code (and any other reparametrisation, such as ``ScaledStdConv2d`` or weight norm) is
reused rather than re-derived.

Pure compute (torch, numpy). Shapes: ``C_out`` filters, each ``(3, kh, kw)``; ``n`` components.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vitviz.core.families import family_of
from vitviz.core.spec import inspect
from vitviz.core.util import check_positive_int
from vitviz.errors import InputError, NoRGBFiltersError

__all__ = ["NoRGBFiltersError", "applied_weight", "embedding_filters", "filter_origin", "filter_pca"]


class _ConvWeightRecorder(torch.overrides.TorchFunctionMode):
    """Records the weight of the first ``conv2d`` call made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.weight: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self.weight is None and getattr(func, "__name__", "") == "conv2d":
            self.weight = args[1] if len(args) > 1 else kwargs.get("weight")
        return func(*args, **kwargs)


def applied_weight(conv: nn.Conv2d) -> torch.Tensor:
    """The ``(C_out, C_in, kh, kw)`` weight ``conv``'s ``forward`` passes to ``conv2d`` (detached).

    For a plain ``nn.Conv2d`` that is ``conv.weight``; for timm's ``StdConv2d`` / ``StdConv2dSame`` the
    standardised weight. Found by running ``forward`` once on a zero input of one kernel's size.
    """
    p = conv.weight
    x = torch.zeros(1, conv.in_channels, *conv.kernel_size, device=p.device, dtype=p.dtype)
    recorder = _ConvWeightRecorder()
    with torch.no_grad(), recorder:
        conv(x)
    w = recorder.weight
    if w is None or tuple(w.shape) != tuple(p.shape):
        return p.detach()
    return w.detach()



def embedding_filters(model: nn.Module) -> tuple[torch.Tensor, str]:
    """The first RGB filters of a ViT: the patch projection, or the hybrid backbone's stem conv.

    Args:
        model: a ViT vitviz can read.

    Returns:
        ``(weights, source)``: float32 CPU tensor ``(C_out, 3, kh, kw)``, the weights the conv applies in
        ``forward`` (standardised for timm's ``StdConv2d``; see ``applied_weight``), and the qualified name of the
        conv it came from (e.g. ``"patch_embed.proj"``, or ``"patch_embed.backbone.0.0"`` for a hybrid).

    Raises:
        NotAViTError: the model is not a ViT vitviz can read.
        NoRGBFiltersError: no ``Conv2d`` with 3 input channels (e.g. a linear patch projection, or a grey-scale
            model); the message names the model and the projection found.
    """
    spec = inspect(model)
    family = family_of(model)
    conv = family.stem_conv(model)
    if conv is None:
        proj = family.patch_proj(model)
        found = "nothing" if proj is None else type(proj).__name__
        if isinstance(proj, nn.Conv2d):
            found += f" with {proj.in_channels} input channels"
        raise NoRGBFiltersError(
            f"{spec.name} has no Conv2d over RGB pixels (its patch projection is {found}"
            f"{', and its backbone has no 3-channel conv' if spec.hybrid else ''}), so there are no RGB embedding "
            "filters to show. For a custom ViT whose projection lives elsewhere, describe it: "
            "vitviz.describe(model, patch_proj='<attribute path of the Conv2d>', ...)"
        )
    source = next((n for n, m in model.named_modules() if m is conv), type(conv).__name__)
    return applied_weight(conv).to("cpu", torch.float32).clone(), source


def filter_origin(model: nn.Module) -> str:
    """What ``embedding_filters(model)`` returns the filters of.

    Args:
        model: a ViT vitviz can read.

    Returns:
        ``"patch projection"`` (the filters of Fig. 7 left: the conv that makes the patch tokens from pixels),
        ``"hybrid backbone stem"`` (the first RGB conv of a hybrid's CNN backbone), or ``"conv stem"`` (the first
        conv of a patch projection made of several convs, such as torchvision's ``conv_stem_configs``).

    Raises:
        NotAViTError: the model is not a ViT vitviz can read.
        NoRGBFiltersError: as ``embedding_filters``.
    """
    spec = inspect(model)
    embedding_filters(model)  # the same refusal for a model without RGB filters
    family = family_of(model)
    if family.stem_conv(model) is family.patch_proj(model):
        return "patch projection"
    return "hybrid backbone stem" if spec.hybrid else "conv stem"


def filter_pca(
    weights: torch.Tensor | np.ndarray, n_components: int = 28
) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of flattened filters (centred over the filters, SVD).

    Components are unit vectors ordered by explained variance; each is signed so that its entry of largest
    magnitude is positive (deterministic, like scikit-learn's ``svd_flip``). At most
    ``min(C_out - 1, 3 * kh * kw)`` components exist after centring; fewer than ``n_components`` are returned
    when the conv has fewer filters or inputs.

    Args:
        weights: ``(C_out, C_in, kh, kw)`` filters (``C_in`` is 3 for RGB).
        n_components: how many components to return (the paper shows 28).

    Returns:
        ``(components, explained_variance_ratio)``: float32 tensors ``(n, C_in, kh, kw)`` and ``(n,)``; the ratio is
        each component's share of the total variance of all filters.

    Raises:
        InputError: not ``(C_out, C_in, kh, kw)`` filters, fewer than two filters, NaN or infinite weights, or
            ``n_components`` not a positive int.
    """
    w = torch.as_tensor(weights).detach().to("cpu", torch.float64)
    if w.ndim != 4:
        raise InputError(f"expected filters of shape (C_out, C_in, kh, kw), got {tuple(w.shape)}")
    check_positive_int(n_components, "n_components", "how many principal components to return (e.g. 28)")
    if not bool(torch.isfinite(w).all()):
        raise InputError(f"weights: the filters of shape {tuple(w.shape)} hold {int(torch.isnan(w).sum())} NaN and "
                         f"{int(torch.isinf(w).sum())} infinite values, so they have no principal components; check "
                         "the checkpoint (a diverged run?) or replace them (torch.nan_to_num)")
    c_out = w.shape[0]
    if c_out < 2:
        raise InputError(f"PCA needs at least two filters, got {c_out}")
    x = w.reshape(c_out, -1)
    x = x - x.mean(dim=0, keepdim=True)
    _u, s, vh = torch.linalg.svd(x, full_matrices=False)
    n = min(n_components, c_out - 1, x.shape[1])
    comps = vh[:n]
    flip = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))
    comps = comps * torch.where(flip == 0, torch.ones_like(flip), flip)
    var = s**2
    total = var.sum()
    ratio = var[:n] / total if total > 0 else torch.zeros(n, dtype=var.dtype)
    return comps.reshape(n, *w.shape[1:]).float(), ratio.float()
