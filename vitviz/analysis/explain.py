"""``vitviz.explain``: one entry point for every relevance map vitviz computes, each exactly what its name says.

==================  =====================================================================================================
method              what it is
==================  =====================================================================================================
``"attention"``     raw post-softmax attention of one layer (``layer=-1``, the last, by default), heads fused
                    (``head_fusion="mean"``), the rows of the tokens the model's head reads over the patch columns
                    (``ViTSpec.readout``: the class row; the mean of the patch rows for average pooling).
                    Jain & Wallace (NAACL 2019) and Abnar & Zuidema (2020, Sec. 2) call this "raw attention".
                    Every row-reading method (attention, rollout, flow, grad_rollout, chefer) reads by default
                    the rows of the tokens the head reads (``vitviz.analysis.propagation``); ``token="class"``
                    the class row, ``token=<int>`` one row.
``"rollout"``       attention rollout, Abnar & Zuidema, ACL 2020, Eq. (1): ``R_l = rownorm(0.5 W_l + 0.5 I) R_{l-1}``
                    (``vitviz.attention_rollout``; ``W_l``'s rows renormalised first, which max and min head
                    fusion need, and its ``discard_ratio`` is row-wise: both unlike vit-explain).
``"flow"``          attention flow, Abnar & Zuidema, ACL 2020, Sec. 3.2: max-flow over the layer graph, each output
                    row divided by its sum over all input tokens as in the authors' code (``vitviz.analysis.flow``;
                    refuses more than ``max_tokens`` tokens).
                    rollout, flow, grad_rollout and chefer share one layer rule and product
                    (``vitviz.analysis.propagation``): parallel branches averaged per block, signed maps refused.
``"grad_rollout"``  vitviz's gradient-weighted rollout: Chefer et al.'s head weighting ``mean_h (grad * A)^+`` fed
                    through rollout's row-renormalised ``0.5 W + 0.5 I`` product (``vitviz.analysis.relevance``).
                    Neither Chefer's rule nor vit-explain's ``vit_grad_rollout``.
``"chefer"``        Chefer, Gur & Wolf, ICCV 2021, Eq. (5)-(6): ``R = I``, ``R <- R + mean_h((grad * A)^+) R``,
                    the readout's rows over the patches (the class row for a class-token head) (``vitviz.analysis.relevance``).
``"attnlrp"``       AttnLRP, Achtibat et al., ICML 2024 (Prop. 3.1-3.4, Eq. 8-9): layer-wise relevance propagation
                    with the softmax, uniform (``q k^T``, ``attn @ v``), identity (norms, GELU) and epsilon
                    (``linear_rule="gamma"`` optional) rules, read at the first block's input tokens; signed
                    (``vitviz.analysis.attnlrp``; the families it covers are listed in docs/explain.md).
``"random"``        a seeded baseline: i.i.d. uniform ``[0, 1)`` per patch; image ``k`` of the set always gets the
                    same map for a given ``seed``, whatever the batching.
==================  =====================================================================================================

Baselines from the libraries made for them (``vitviz.analysis.baselines``; ``pip install 'vitviz[explain]'``):

==========================  ===================================================================================
method                      what it is
==========================  ===================================================================================
``"integrated_gradients"``  integrated gradients, Sundararajan, Taly & Yan, ICML 2017, Eq. (1), by ``captum`` on the
                            pixels (baseline: the normalisation mean, 0 in normalised space), summed over each
                            patch's pixels and channels, signed (so the patch map sums to ``F(x) - F(x')``).
``"input_x_gradient"``      input x gradient, Shrikumar et al. 2016 / DeepLIFT (ICML 2017, Sec. 2.2), by ``captum``,
                            pooled the same way.
``"gradcam"``               Grad-CAM, Selvaraju et al., ICCV 2017, Eq. (1)-(2), by ``pytorch-grad-cam`` on the tokens
                            after the last block's first norm, reshaped by vitviz (every prefix token dropped, the
                            ``(gh, gw)`` grid read from the model); in ``[0, 1]`` per image.
==========================  ===================================================================================

Memory: ``attention``, ``rollout`` and ``flow`` reduce each layer while the forward pass runs (``rollout`` and ``flow``
keep one ``(B, N, N)`` matrix per residual block); the gradient methods need every layer's map and gradient of one batch
at once (pass ``batch_size`` to bound it). Everything runs on the model's device.

``target`` (gradient methods only): ``None`` (predicted class), a class index, one per image, or a callable from
the model's raw output to one score per image (headless models); see ``vitviz.core.targets``. Methods that use no
gradient ignore ``target=None`` and refuse any other value rather than silently ignore it.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vitviz.analysis.perturbation import image_seed
from vitviz.analysis.propagation import FLOW_MAPS, PoolRows, fuse_heads, output_rows, rollout_to_maps
from vitviz.core.batching import iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.capture import capture_attention, check_layer_index
from vitviz.core.images import Images
from vitviz.core.spec import inspect
from vitviz.core.targets import Target
from vitviz.core.util import is_int
from vitviz.errors import InputError, InputTypeError

__all__ = ["BASELINE_METHODS", "GRADIENT_METHODS", "METHODS", "explain", "per_method_options", "raw_attention",
           "random_baseline"]

METHODS = ("attention", "rollout", "flow", "grad_rollout", "chefer", "attnlrp", "random", "integrated_gradients",
           "input_x_gradient", "gradcam")
GRADIENT_METHODS = ("grad_rollout", "chefer", "attnlrp", "integrated_gradients", "input_x_gradient", "gradcam")
BASELINE_METHODS = ("integrated_gradients", "input_x_gradient", "gradcam")  # vitviz.analysis.baselines


def raw_attention(
    model: nn.Module,
    images: Images,
    *,
    layer: int = -1,
    head_fusion: str = "mean",
    token: int | str | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Raw attention of one layer, heads fused, as ``(B, gh, gw)`` maps (the output token's row over the patches).

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor, or anything ``vitviz.load_images`` takes.
        layer: attention-layer index (negative counts from the end).
        head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over heads.
        token: the query rows: default the rows of the tokens the model's head reads (``ViTSpec.readout``: the
            class token; the mean of the class and distillation rows; the mean of the patch rows for average
            pooling or no class token); ``"class"``: the class token's row; an int: that token's row.
        batch_size, progress: as in ``vitviz.attention_rollout``.

    Returns:
        ``(B, gh, gw)`` float32 on the model's device, non-negative. With ``head_fusion="mean"`` or ``"min"`` a
        map sums to at most 1 (part of a row of a stochastic matrix, or less); with ``"max"`` it can exceed 1.
    """
    spec = inspect(model)
    # one layer: a selector of several (None, a list, a name pattern) would be read at its first layer alone
    index = check_layer_index(layer, len(spec.attention_modules), "layer", spec.name)
    spec.require_maps("explain(method='attention')", FLOW_MAPS, [index],
                      hint="pass layer= naming a layer whose maps are post-softmax attention between the tokens "
                           "(on CaiT, a class-attention layer such as layer=-1)")
    out: list[torch.Tensor] = []
    for x in iter_batches(model, images, batch_size, progress=progress, desc="attention"):
        with torch.no_grad(), capture_attention(model, layers=[index]) as cap, PoolRows(model, spec, token) as pool:
            model(x)
        w = fuse_heads(cap.attentions[0], head_fusion)
        row = pool.take(w.shape[-1])
        row = output_rows(spec, token, w.shape[-1]) if row is None else row
        out.append(rollout_to_maps(w, spec.grid_for_input(x), spec.num_prefix_tokens, row))
    return torch.cat(out)


def random_baseline(model: nn.Module, images: Images, *, seed: int = 0, batch_size: int | None = None,
                    offset: int | Sequence[int] = 0) -> torch.Tensor:
    """A seeded random map per image, ``(B, gh, gw)`` uniform in ``[0, 1)``; image ``k`` (its index in the set,
    ``offset + k``, or its own index from ``offset``) gets the map of the generator seeded ``seed * 1_000_003 + k``
    modulo ``2**63`` (``vitviz.analysis.perturbation.image_seed``, the seed of the patch ranking's ties too), so the
    maps of one seed are distinct for sets of up to 1,000,003 images (beyond, seed ``s`` at index ``k + 1_000_003``
    repeats seed ``s + 1`` at ``k``), and any int seed is taken.

    ``offset`` is the index of the first image in a larger set (so a batch gets the maps the whole set would), or
    one index per image (``vitviz.faithfulness``: each image's id), so that any images get their own maps in one
    call.
    """
    if not is_int(seed):
        raise InputError(f"seed={seed!r} must be an int (the seed of the random maps), e.g. seed=0")
    spec = inspect(model)
    out: list[torch.Tensor] = []
    per_image = not isinstance(offset, numbers.Integral)
    if per_image:
        offsets = list(offset) if isinstance(offset, Sequence) and not isinstance(offset, str) else None
        if offsets is None or not all(isinstance(k, numbers.Integral) for k in offsets):
            raise InputError(f"offset={offset!r} must be an int (the index of the first image) or a sequence of "
                             "ints, one per image")
    k = 0
    for x in iter_batches(model, images, batch_size):
        if per_image and k + len(x) > len(offsets):
            raise InputError(f"offset holds {len(offsets)} indices for at least {k + len(x)} images; pass one per "
                             "image")
        gh, gw = spec.grid_for_input(x)
        for _ in range(len(x)):
            index = offsets[k] if per_image else int(offset) + k
            gen = torch.Generator().manual_seed(image_seed(seed, int(index)))
            out.append(torch.rand(gh, gw, generator=gen))
            k += 1
    if per_image and k != len(offsets):
        raise InputError(f"offset holds {len(offsets)} indices for {k} images; pass one per image")
    return torch.stack(out).to(x.device)


def per_method_options(method_options: Mapping[str, Mapping[str, Any]] | None,
                       named: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``method_options`` (method name -> ``explain`` options) as a dict of dicts, for a call that runs the methods
    ``named``.

    Raises:
        InputError: a key that names neither a method in ``named`` nor an ``explain`` method (a typo would be
            ignored silently); options for a known method that this call does not run are allowed.
        InputTypeError: ``method_options``, or the options of one method, is not a mapping.
    """
    if method_options is not None and not isinstance(method_options, Mapping):
        raise InputTypeError(f"method_options={method_options!r} is a {type(method_options).__name__}, not a dict; "
                             "pass method name -> options, e.g. {'attention': {'layer': -1}}, or None")
    for k, v in (method_options or {}).items():
        if not isinstance(v, Mapping):
            raise InputTypeError(f"method_options[{k!r}]={v!r} is a {type(v).__name__}, not a dict of options; pass "
                                 f"option name -> value, e.g. {{{k!r}: {{...}}}} (help(vitviz.explain) lists each "
                                 "method's options)")
    options = {k: dict(v) for k, v in (method_options or {}).items()}
    named = list(named)
    stray = [k for k in options if k not in named and k not in METHODS]
    if stray:
        raise InputError(f"method_options={dict(method_options or {})!r} has options for {stray}, neither among the "
                         f"methods {named} nor a vitviz.explain method; key the options by a method's name")
    return options


def _check(method: str, target: Target, opts: dict[str, Any]) -> None:
    if method not in METHODS:
        raise InputError(f"method={method!r} is not one of {METHODS}; e.g. vitviz.explain(model, images, "
                         "method='chefer')")
    if method not in GRADIENT_METHODS and target is not None:
        raise InputError(f"method={method!r} uses no gradient, so target={target!r} would be ignored; pass "
                         f"target=None, or a gradient method {GRADIENT_METHODS}")


@in_eval_mode
def explain(
    model: nn.Module,
    images: Images,
    method: str = "chefer",
    target: Target = None,
    *,
    batch_size: int | None = None,
    progress: bool = False,
    **opts: Any,
) -> torch.Tensor:
    """Relevance maps ``(B, gh, gw)`` of ``images`` by ``method`` (see the module docstring for each).

    Args:
        model: any ViT ``vitviz.inspect`` reads (gradient methods need attention that feeds the output: timm,
            Hugging Face, torchvision).
        images: a normalised ``(B, 3, H, W)`` tensor, a list, or anything ``vitviz.core.batching.iter_batches``
            takes.
        method: one of ``METHODS``: ``"attention"``, ``"rollout"``, ``"flow"``, ``"grad_rollout"``, ``"chefer"``,
            ``"attnlrp"``, ``"random"``, ``"integrated_gradients"``, ``"input_x_gradient"`` or ``"gradcam"``.
        target: what a gradient method explains (``None``: predicted class; an int; one per image; or a callable
            ``f(output) -> (B,)``).
        batch_size: images per pass (default all at once).
        progress: show a progress bar.
        **opts: passed to the method: ``layer``, ``head_fusion``, ``token`` (attention); ``head_fusion``,
            ``discard_ratio``, ``residual``, ``start_layer``, ``token`` (rollout); ``head_fusion``, ``token``,
            ``max_tokens``, ``normalise`` (flow); ``discard_ratio``, ``start_layer``, ``token`` (grad_rollout);
            ``start_layer``, ``token`` (chefer); ``linear_rule``, ``epsilon``, ``gamma``, ``attention_rule``,
            ``plain``, ``read_at``, ``return_tokens`` (attnlrp; ``read_at="pixels"`` gives ``(B, H, W)`` maps of the
            image, ``return_tokens=True`` ``(B, N)`` token relevances); ``seed``, ``offset`` (random); ``pool``,
            ``n_steps``, ``baseline``, ``internal_batch_size`` (integrated_gradients); ``pool`` (input_x_gradient);
            ``layer`` (gradcam).

    Returns:
        ``(B, gh, gw)`` float32 maps on the model's device, for every method and every model dtype (a float64
        model's maps are computed in float64 where the method does so, then cast; call the method's own function,
        e.g. ``vitviz.chefer_relevance`` or ``vitviz.analysis.attnlrp.attnlrp``, to keep them in float64).
    """
    _check(method, target, opts)
    return _dispatch(model, images, method, target, batch_size, progress, opts).to(torch.float32)


def _dispatch(model: nn.Module, images: Images, method: str, target: Target, batch_size: int | None,
              progress: bool, opts: dict[str, Any]) -> torch.Tensor:
    common = {"batch_size": batch_size}
    try:
        if method == "attention":
            return raw_attention(model, images, progress=progress, **common, **opts)
        if method == "rollout":
            from vitviz.analysis.rollout import attention_rollout

            return attention_rollout(model, images, progress=progress, **common, **opts)
        if method == "flow":
            from vitviz.analysis.flow import attention_flow

            return attention_flow(model, images, progress=progress, **common, **opts)
        if method == "random":
            return random_baseline(model, images, **common, **opts)
        if method == "attnlrp":
            from vitviz.analysis.attnlrp import attnlrp

            return attnlrp(model, images, target, progress=progress, **common, **opts)
        if method in BASELINE_METHODS:
            from vitviz.analysis import baselines

            if "return_delta" in opts:  # explain returns maps only: the deltas would make a tuple of the result
                raise InputError(f"explain(method={method!r}) returns the maps only, so it takes no return_delta; "
                                 "call vitviz.integrated_gradients(model, images, target, return_delta=True) for "
                                 "captum's convergence deltas")

            return getattr(baselines, method)(model, images, target, **common, **opts)
        from vitviz.analysis import relevance

        fn = relevance.chefer_relevance if method == "chefer" else relevance.grad_rollout
        return fn(model, images, target, progress=progress, **common, **opts)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        raise InputError(f"explain(method={method!r}) got an option it does not take ({err}); see "
                         "help(vitviz.explain) for each method's options") from err

