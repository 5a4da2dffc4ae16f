"""Baseline attributions users compare ViT-specific maps against, computed by the libraries made for them.

=========================  ======================================================================================
method                     what it is
=========================  ======================================================================================
``integrated_gradients``   Sundararajan, Taly & Yan, ICML 2017, Eq. (1): ``(x - x') * int_0^1 grad F(x' + a (x - x'))
                           da`` per pixel and channel, by ``captum.attr.IntegratedGradients`` (Gauss-Legendre
                           quadrature, ``n_steps=50`` points; the paper's Sec. 3 sums ``grad F`` at ``a = k/m``, a
                           right Riemann sum, which converges more slowly: the maps differ at few steps); the baseline ``x'`` is 0 in the model's normalised input
                           space, i.e. the normalisation mean (the training-set mean image), as ``vitviz.faithfulness``
                           fills removed patches. Completeness (their Prop. 1: the attributions sum to ``F(x) -
                           F(x')``) is checked on every image: an error above 5% of ``|F(x) - F(x')|`` (their Sec. 3:
                           20 to 300 steps stay within it) warns (``CompletenessWarning``) that ``n_steps`` is too few.
``input_x_gradient``       Shrikumar et al., "Not just a black box" (arXiv 2016) / DeepLIFT (ICML 2017, Sec. 2.2):
                           ``x * grad F(x)`` per pixel and channel, by ``captum.attr.InputXGradient``, ``x`` the
                           model's normalised input ``(p - m) / s``: in pixel units ``(p - m) * dF/dp``, the input
                           measured from the mean image (integrated gradients' baseline here), not captum's ``p *
                           dF/dp`` on a model that normalises its own [0, 1] pixels ``p``, which gives black pixels no
                           attribution.
``gradcam``                Selvaraju et al., ICCV 2017, Eq. (1)-(2): ``ReLU(sum_k alpha_k A^k)``, ``alpha_k`` the mean
                           gradient of channel ``k`` over the patch grid, by ``pytorch_grad_cam.GradCAM`` on the
                           tokens after the last block's first norm (``norm1`` in timm; the common recipe for
                           ViTs), which vitviz reshapes to ``(B, C, gh, gw)`` (``token_reshape``).
=========================  ======================================================================================

Every model is read as vitviz's attention methods read it (``Family.prepare`` for the call, as every analysis call
does: ``core.families.prepared``): a Hugging Face ViTMAE unmasked and in patch order (it otherwise masks 75% of its
patches at random on every call, so each map, and each integrated-gradients path point, would be of a different
random subset), and an image-text model's ``model(images)`` refused, naming its vision tower.

Pixel attributions are pooled to the patch grid by summing over each patch's pixels and the colour channels,
signed by default (``pool="sum"``): the signed sum keeps positive and negative evidence apart and keeps integrated
gradients' completeness at the patch level (the patch map sums to ``F(x) - F(x')``). ``pool="abs"`` sums
``|attribution|`` instead (the absolute-value maps of Adebayo et al. 2018). Grad-CAM is computed at the grid's
resolution directly (no up- and down-sampling) and comes min-max scaled to ``[0, 1]`` per image, as
pytorch-grad-cam returns it.

The libraries are optional: ``pip install 'vitviz[explain]'`` (captum, grad-cam).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitviz.core.batching import count_images, iter_batches
from vitviz.core.blocks import block_paths
from vitviz.core.calls import in_eval_mode
from vitviz.core.contexts import autograd, grad_leaf, normal_tensor
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.targets import Target, logits_of, resolve_target
from vitviz.core.util import check_bool, is_int, is_number, kept_grads, kept_rng
from vitviz.errors import CaptureError, CompletenessWarning, InputError, MissingDependencyError

__all__ = ["LIBRARIES", "gradcam", "gradcam_layer", "input_x_gradient", "installed", "integrated_gradients",
           "pool_to_patches", "token_reshape"]

POOLS = ("sum", "abs")
LIBRARIES = {"integrated_gradients": "captum", "input_x_gradient": "captum", "gradcam": "pytorch_grad_cam"}


def installed() -> tuple[str, ...]:
    """The baseline methods whose library is installed (``LIBRARIES``: method -> the module it imports)."""
    from importlib.util import find_spec

    return tuple(m for m, module in LIBRARIES.items() if find_spec(module) is not None)


def _need(module: str, package: str) -> Any:
    import importlib

    try:
        with kept_rng():  # a library may draw at import (rich, under pytorch-grad-cam, takes a random id)
            return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(f"this method needs {package}, which is not installed: pip install "
                                     f"'vitviz[explain]' (or pip install {package})") from err


class _Scores(nn.Module):
    """The model's output as a ``(B, K)`` tensor: its logits, or ``(B, 1)`` holding a callable target's score."""

    def __init__(self, model: nn.Module, target: Target) -> None:
        super().__init__()
        self.model, self.fn = model, target if callable(target) and not isinstance(target, torch.Tensor) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        if self.fn is not None:
            return resolve_target(self.fn, out).scores[:, None]
        return logits_of(out, self.model)


def _classes(model: nn.Module, x: torch.Tensor, target: Target, start: int, total: int) -> torch.Tensor:
    """The class (column of ``_Scores``) each image's attribution explains."""
    if callable(target) and not isinstance(target, torch.Tensor):
        return torch.zeros(len(x), dtype=torch.long, device=x.device)
    with torch.no_grad():
        return resolve_target(target, model(x), start=start, n_images=total, model=model).classes


def pool_to_patches(attr: torch.Tensor, grid: tuple[int, int], stride: tuple[int, int], pool: str = "sum"
                    ) -> torch.Tensor:
    """Sum a pixel attribution ``(B, C, H, W)`` over each patch's pixels and channels: ``(B, gh, gw)``.

    Args:
        attr: pixel attributions.
        grid: ``(gh, gw)`` patches.
        stride: ``(sh, sw)`` pixels per patch (pixels past ``gh * sh``, ``gw * sw`` belong to no patch).
        pool: ``"sum"`` (signed) or ``"abs"`` (sum of absolute values).
    """
    if pool not in POOLS:
        raise InputError(f"pool={pool!r} must be one of {POOLS}")
    (gh, gw), (sh, sw) = grid, stride
    a = attr[..., :gh * sh, :gw * sw]
    a = a.abs() if pool == "abs" else a
    return a.reshape(a.shape[0], a.shape[1], gh, sh, gw, sw).sum(dim=(1, 3, 5))


def _pixel_method(kind: str, model: nn.Module, images: Images, target: Target, *, pool: str, n_steps: int,
                  baseline: float, internal_batch_size: int | None, batch_size: int | None,
                  return_delta: bool) -> Any:
    attr_mod = _need("captum.attr", "captum")
    if pool not in POOLS:
        raise InputError(f"pool={pool!r} must be one of {POOLS}")
    spec = inspect(model)
    scores = _Scores(model, target)
    algo = attr_mod.IntegratedGradients(scores) if kind == "ig" else attr_mod.InputXGradient(scores)
    total, start = count_images(images), 0
    maps, deltas, sums = [], [], []
    for x in iter_batches(model, images, batch_size, desc=kind):
        cls = _classes(model, x, target, start, total)
        with autograd(model, f"{'integrated_gradients' if kind == 'ig' else 'input_x_gradient'} on {spec.name}"):
            x = grad_leaf(x)
            if kind == "ig":
                attr, delta = algo.attribute(x, baselines=float(baseline), target=normal_tensor(cls), n_steps=n_steps,
                                             internal_batch_size=internal_batch_size, return_convergence_delta=True)
                deltas.append(delta.detach())
                sums.append(attr.detach().double().sum(dim=(1, 2, 3)))
            else:
                attr = algo.attribute(x, target=normal_tensor(cls))
        maps.append(pool_to_patches(attr.detach().float(), spec.grid_for_input(x), spec.patch_size, pool))
        start += len(x)
    out = torch.cat(maps)
    if kind == "ig":
        _check_completeness(torch.cat(sums), torch.cat(deltas), n_steps)
    return (out, torch.cat(deltas)) if return_delta else out


COMPLETENESS_TOLERANCE = 0.05  # Sundararajan et al. (2017), Sec. 3: 20 to 300 steps approximate it within 5%


def _check_completeness(sums: torch.Tensor, deltas: torch.Tensor, n_steps: int) -> None:
    """Warn (``CompletenessWarning``, once per call) where integrated gradients miss completeness: the pixel
    attributions of an image sum to ``F(x) - F(x')`` up to captum's convergence delta ``sum(attr) - (F(x) - F(x'))``;
    an error above ``COMPLETENESS_TOLERANCE`` of ``|F(x) - F(x')|`` (and above float rounding, 1e-5) means the
    quadrature has not converged."""
    deltas = deltas.detach().double().cpu()
    gaps = (sums.cpu() - deltas).abs()
    errors = deltas.abs()
    bad = (errors > COMPLETENESS_TOLERANCE * gaps) & (errors > 1e-5)
    if not bool(bad.any()):
        return
    relative = torch.where(bad, errors / gaps.clamp_min(1e-30), torch.zeros_like(errors))
    i = int(relative.argmax())
    warnings.warn(CompletenessWarning(
        f"integrated_gradients with n_steps={n_steps}: the attributions of image {i} sum to "
        f"{float(sums[i]):.4g}, but F(x) - F(x') is {float(sums[i] - deltas[i]):.4g}, off by {float(relative[i]):.0%} "
        f"({int(bad.sum())} of {len(bad)} images beyond {COMPLETENESS_TOLERANCE:.0%}): the path integral has not "
        "converged (completeness, Sundararajan et al. 2017, Prop. 1); increase n_steps (e.g. "
        f"n_steps={max(4 * n_steps, 50)})"), stacklevel=5)


@in_eval_mode
def integrated_gradients(model: nn.Module, images: Images, target: Target = None, *, pool: str = "sum",
                         n_steps: int = 50, baseline: float = 0.0, internal_batch_size: int | None = None,
                         batch_size: int | None = None, return_delta: bool = False) -> Any:
    """Integrated gradients (Sundararajan et al., ICML 2017) by captum, pooled to patches; see the module docstring.

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor or anything ``iter_batches`` takes.
        target: ``None`` (predicted class), a class index, one per image, or a callable ``f(output) -> (B,)``.
        pool: ``"sum"`` (signed; default) or ``"abs"``.
        n_steps: quadrature points along the path.
        baseline: the baseline ``x'`` in normalised input space (0: the normalisation mean).
        internal_batch_size: captum's chunking of the ``B * n_steps`` path points (memory).
        batch_size: images per call.
        return_delta: also return captum's convergence delta ``(B,)``: ``sum(attr) - (F(x) - F(x'))``.

    Returns:
        ``(B, gh, gw)`` float32 maps on the model's device (and the deltas).

    Warns:
        CompletenessWarning: once per call, where the delta of some image exceeds 5% of ``|F(x) - F(x')|`` (the
            quadrature has not converged; more ``n_steps`` fix it).

    Raises:
        InputError: ``n_steps`` or ``internal_batch_size`` is not a positive int, ``baseline`` is not a finite
            number, or ``return_delta`` is not a bool.
    """
    if not is_int(n_steps) or n_steps < 1:
        raise InputError(f"n_steps={n_steps!r} must be a positive int, the quadrature points along the path "
                         "(e.g. 50)")
    if internal_batch_size is not None and (not is_int(internal_batch_size) or internal_batch_size < 1):
        raise InputError(f"internal_batch_size={internal_batch_size!r} must be a positive int (path points per "
                         "forward pass, e.g. 64) or None for all at once")
    return_delta = check_bool(return_delta, "return_delta", "also return captum's convergence deltas")
    if not is_number(baseline) or not math.isfinite(baseline):
        raise InputError(f"baseline={baseline!r} must be a finite number, the baseline input in normalised space "
                         "(0.0: the normalisation mean)")
    return _pixel_method("ig", model, images, target, pool=pool, n_steps=n_steps, baseline=baseline,
                         internal_batch_size=internal_batch_size, batch_size=batch_size, return_delta=return_delta)


@in_eval_mode
def input_x_gradient(model: nn.Module, images: Images, target: Target = None, *, pool: str = "sum",
                     batch_size: int | None = None) -> torch.Tensor:
    """Input x gradient (Shrikumar et al. 2016/2017) by captum, pooled to patches; see the module docstring.

    Args: as ``integrated_gradients``. Returns ``(B, gh, gw)`` float32 maps on the model's device.
    """
    return _pixel_method("ixg", model, images, target, pool=pool, n_steps=0, baseline=0.0,
                         internal_batch_size=None, batch_size=batch_size, return_delta=False)


def token_reshape(spec: ViTSpec, grid: tuple[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The ``reshape_transform`` for pytorch-grad-cam: tokens ``(B, N, C)`` -> ``(B, C, gh, gw)`` in float32.

    Drops every prefix token (class, distillation, registers: ``spec.num_prefix_tokens``, never a guessed 1) and
    lays the patch tokens out row by row on the ``(gh, gw)`` grid (never ``sqrt(N - 1)``: non-square grids work).
    pytorch-grad-cam applies it to the layer's activations and to their gradients before it reads both as NumPy
    arrays, which have no bfloat16: the float32 cast lets a bfloat16 (or float16) model's Grad-CAM be computed, in
    float32, from the activations and gradients the model formed in its own dtype.
    """
    p, (gh, gw) = spec.num_prefix_tokens, grid

    def reshape(tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(tokens, (tuple, list)):
            tokens = tokens[0]
        if tokens.ndim != 3 or tokens.shape[1] != p + gh * gw:
            raise CaptureError(f"{spec.name}: Grad-CAM's layer gave shape {tuple(tokens.shape)}, expected (B, "
                               f"{p + gh * gw}, C) = {p} prefix + {gh}x{gw} patch tokens; pass layer= naming a "
                               "module whose output is the token sequence")
        return tokens[:, p:].reshape(tokens.shape[0], gh, gw, tokens.shape[2]).permute(0, 3, 1, 2).float()

    return reshape


def gradcam_layer(model: nn.Module) -> str:
    """The module Grad-CAM reads by default: the first norm layer of the last residual block (timm ``norm1``), the
    norm whose output the block's attention reads.

    A block whose attention module is the block itself (timm ``ParallelScalingBlock``: one ``in_norm`` feeds both
    its attention and its MLP) reads that norm. A block of several attention branches side by side (timm
    ``ParallelThingsBlock``, ``ViTSpec.attention_blocks`` repeating the block's index), each reading the block's
    input through a norm of its own, is refused: its first norm feeds one branch, whose map would pass for the
    block's; ``layer=`` chooses what to read.

    Raises:
        InputError: no residual block or no norm in the last one; or the last block runs parallel branches (the
            message names their norms and the previous block, whose output every branch reads).
    """
    spec = inspect(model)
    paths = block_paths(model)
    if not paths:
        raise InputError(f"{type(model).__name__}: no residual block found for Grad-CAM's default layer; pass "
                         "layer='<module name>' (a module whose output is the (B, N, C) token sequence)")
    last = paths[max(paths)]
    norms = [name for name, mod in model.named_modules()  # module order: the block's first norm (LayerNorm, ...)
             if name.startswith(last + ".") and "norm" in type(mod).__name__.lower()]
    if not norms:
        raise InputError(f"{type(model).__name__}: the last block {last!r} has no norm layer; pass layer='<module "
                         "name>' (a module whose output is the (B, N, C) token sequence)")
    branches = [a for a, b in zip(spec.attention_modules, spec.attention_blocks or ()) if b == max(paths)]
    if len(branches) > 1:  # each branch's own norm reads the block's input: the first feeds branch 0 only
        inputs = [n for n in norms if not any(n.startswith(a + ".") for a in branches)]  # not q/k norms
        previous = paths.get(max(paths) - 1)
        raise InputError(f"{type(model).__name__}: the last block {last!r} "
                         f"({type(model.get_submodule(last)).__name__}) runs {len(branches)} attention branches in "
                         f"parallel ({', '.join(map(repr, branches))}), whose branches read the block's input each "
                         f"through a norm of its own ({', '.join(map(repr, inputs))}); Grad-CAM's default layer, a "
                         "block's first norm, would show one branch only; pass layer= naming the module to read: one "
                         "branch's norm, "
                         f"e.g. layer={inputs[0]!r}"
                         + (f", or layer={previous!r}, the previous block, whose output every branch reads"
                            if previous else ""))
    return norms[0]


def _default_layer_hint(model: nn.Module, form: str = "e.g. {} (the default, layer=None)") -> str:
    """``gradcam_layer(model)`` in ``form`` for an error message about another ``layer=``; a model without a default
    (parallel branches) is told what to pass instead, not refused for the default it did not ask for."""
    try:
        return form.format(repr(gradcam_layer(model)))
    except InputError:
        return "e.g. one branch's norm layer (this model's blocks run parallel branches: no default)"


@in_eval_mode
def gradcam(model: nn.Module, images: Images, target: Target = None, *, layer: str | None = None,
            batch_size: int | None = None) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al., ICCV 2017) by pytorch-grad-cam on a ViT's tokens; see the module docstring.

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor or anything ``iter_batches`` takes.
        target: ``None`` (predicted class), a class index, one per image, or a callable ``f(output) -> (B,)``.
        layer: the module whose output tokens are used (default ``gradcam_layer(model)``: the last block's first
            norm; a block of parallel attention branches has no default and needs ``layer=``).
        batch_size: images per call.

    Returns:
        ``(B, gh, gw)`` float32 maps in ``[0, 1]`` on the model's device.
    """
    cam_mod = _need("pytorch_grad_cam", "grad-cam")
    targets_mod = _need("pytorch_grad_cam.utils.model_targets", "grad-cam")
    spec = inspect(model)
    if layer is not None and (not isinstance(layer, str) or not layer):
        raise InputError(f"layer={layer!r} is not a module name; pass the dotted name of a module whose output is "
                         f"the (B, N, C) token sequence, {_default_layer_hint(model)}")
    name = layer or gradcam_layer(model)
    try:
        module = model.get_submodule(name)
    except AttributeError as err:
        raise InputError(f"layer={name!r} is not a module of {type(model).__name__}; pass the dotted name of a "
                         f"module whose output is the (B, N, C) token sequence, {_default_layer_hint(model)}") from err
    total, start = count_images(images), 0
    out = []

    def tensor_output(_m: nn.Module, _args: Any, output: Any) -> None:
        # pytorch-grad-cam hooks a gradient onto a tensor output only: for a tuple (a Hugging Face attention or
        # layer module) it saves none, and fails later on a None gradient, naming neither the layer nor the fix
        if not isinstance(output, torch.Tensor):
            raise InputError(f"layer={name!r} ({type(module).__name__}) returns a {type(output).__name__}, not a "
                             "tensor: Grad-CAM weighs a module's output tensor by its gradient; pass layer= naming a "
                             "module whose output is the (B, N, C) token sequence, such as a norm layer "
                             f"({_default_layer_hint(model, 'the default: {}')})")

    # pytorch-grad-cam calls model.eval() (in_eval_mode puts the modes back), model.zero_grad() and backward() on
    # the parameters (kept_grads sets the user's .grad aside for the call and puts them back)
    handle = module.register_forward_hook(tensor_output)
    try:
        with kept_grads(model):
            for x in iter_batches(model, images, batch_size, desc="gradcam"):
                out.append(_gradcam_batch(cam_mod, targets_mod, model, spec, module, x, target, start, total))
                start += len(x)
    finally:
        handle.remove()
    return torch.cat(out)


def _gradcam_batch(cam_mod: Any, targets_mod: Any, model: nn.Module, spec: ViTSpec, module: nn.Module,
                   x: torch.Tensor, target: Target, start: int, total: int) -> torch.Tensor:
    grid = spec.grid_for_input(x)

    class _GridCAM(cam_mod.GradCAM):  # the map at the grid's resolution: no resize by the library
        def get_target_width_height(self, input_tensor: torch.Tensor) -> tuple[int, int]:
            return grid[1], grid[0]

    cls = _classes(model, x, target, start, total)
    cam = _GridCAM(_Scores(model, target), [module], reshape_transform=token_reshape(spec, grid))
    try:
        with autograd(model, f"Grad-CAM on {spec.name}"):
            # the input a leaf that requires grad: the tokens stay in the graph also when every weight is frozen
            maps = cam(input_tensor=grad_leaf(x),
                       targets=[targets_mod.ClassifierOutputTarget(c) for c in cls.tolist()])  # one read
    finally:
        cam.activations_and_grads.release()
    return torch.as_tensor(maps, dtype=torch.float32, device=x.device)
