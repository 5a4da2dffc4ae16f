"""AttnLRP: Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML 2024.

The explained score ``s`` (a class logit, or a callable's value; ``target=``) is redistributed backwards layer by
layer with the paper's rules, written as modified backward passes (gradient x input form, as lxt's
``lxt.efficient``; the rules are in ``vitviz.core.families.lrp`` and installed per family for the call only):

==========================  ==================================================================================
operation                   rule (paper)
==========================  ==================================================================================
softmax                     Prop. 3.1: ``R_in = x * (R_out - s * sum R_out)`` (its plain gradient in this form)
``q k^T`` and ``attn @ v``  Prop. 3.3: epsilon over the sum, then the uniform rule (Prop. 3.2): half of each
                            product's relevance to each factor (gradients to q, k, v scaled 1/4, 1/4, 1/2)
attention pool (a learned   the query is a weight: ``q k^T`` takes the epsilon rule (Eq. 8) in ``k``, all to k;
query; timm ``map``,        ``attn @ v`` as above (gradients to k, v scaled 1/2, 1/2). lxt's recipe for SigLIP 2's
SigLIP, AIMv2 heads)        head stops the keys' gradient (the scores' half is dropped); vitviz passes it on
differential attention      ``(A1 - lambda A2) @ v``, lambda a constant of the weights: the uniform rule on each
(``DiffAttention``)         of the two products (gradients to q, k, v scaled 1/4, 1/4, 1/2 as above)
gated MLP ``act(g) * u``    Prop. 3.2: uniform rule on the product (gradients to gate and up scaled 1/2), as lxt
sigmoid gates (a GLU's,     none in the paper (``sigmoid(0) = 1/2``: no identity rule): the gate is held constant,
an attention output gate)   all relevance to the other factor (signal-take-all, Arras et al. 2017; ``lrp``)
LayerNorm / RMSNorm         Prop. 3.4: identity rule on the normalisation (the standard deviation is a constant)
GELU, SiLU, ReLU, tanh      Eq. 9: identity rule ``R_in = R_out``
Linear layers               Eq. 8: epsilon rule (``linear_rule="epsilon"``, ``epsilon=1e-6``; default), or the
                            gamma rule (``linear_rule="gamma"``, ``gamma=0.25``; zennit's generalised gamma)
==========================  ==================================================================================

Linear layers, ViTs: the paper's rule for linear layers is the epsilon rule (Eq. 8). For ViTs its library (lxt's
quickstart, "Vision Transformer") says epsilon-rule heatmaps are noisy ("gradient shattering") and recommends the
gamma rule on the linear and patch-convolution layers, gamma tuned by looking at the heatmaps; lxt's torchvision-ViT
recipe (``examples/vit_torch.py``) also uses CP-LRP inside the attention. vitviz uses the epsilon rule by default
(the derivation, no free parameter, conservation testable) and offers ``linear_rule="gamma"`` and
``attention_rule="cp"``; ``plain=`` leaves named linear layers at the plain gradient (for comparisons).

Where the relevance is read: at the tokens entering the first block (patch embedding + position embedding, after
any pre-norm), summed over the embedding dimension, ``R_t = sum_d e_td * ds/de_td``: one relevance per token, the
way the paper reads LLM inputs (its token embeddings). The patch tokens give the ``(B, gh, gw)`` map, the prefix
tokens (class, distillation, registers) their own relevance (``attnlrp_tokens``; CaiT's class token joins after the
patch blocks, and is read where it enters its first class-attention block). vitviz reads tokens rather than
pixels by default because its maps, sanity checks and faithfulness are per patch, and because at the pixel level the
patch convolution needs a rule of its own (the paper's library uses gamma there) and the position embedding absorbs
relevance like a bias; at the tokens none of that enters. ``read_at="pixels"`` goes on to the image: the token
embedding's modules take the rules too (the patch convolution ``linear_rule``'s, as the linear layer it is; a norm
before the first block the norm rule), the position table and the prefix tokens keep their shares as biases do, and
the map is ``(B, H, W)``, summed over the colour channels (hybrids, whose CNN backbone has no rules, are refused).

Conservation: every rule but two passes on exactly the relevance it receives; (1) biases (and the epsilon
stabiliser) absorb part of it, (2) the softmax rule's Taylor bias term absorbs
``sum R_out - sum R_in = sum_i s_i g_i - sum_i x_i s_i (g_i - s.g)`` per attention row. With zero biases,
``epsilon=0`` and the softmax's share added back, the token relevances sum to the score up to float rounding
(tests/test_attnlrp.py checks it).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence

import torch
from torch import nn

from vitviz.core.batching import count_images, iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.contexts import autograd, grad_leaf, normal_tensor
from vitviz.core.families.lrp import LRPRules, linear_rule_names, lrp_rules
from vitviz.core.images import Images
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.targets import Target, resolve_target
from vitviz.core.util import check_bool, is_number
from vitviz.errors import CaptureError, InputError, UnsupportedModelError

__all__ = ["LRPRules", "attnlrp", "attnlrp_supported", "attnlrp_tokens", "lrp_rules"]

# the map kinds (ViTSpec.attention_maps) the rules are derived for: softmax; differential (timm's DiffAttention,
# softmax(S1) - lambda softmax(S2) with a constant lambda); CaiT's talking heads (linear maps across the heads
# before and after the softmax) and class attention (the class token's query over every token). The family's rules
# decide which models they cover; a map of any other kind is refused here.
LRP_MAP_KINDS = {"softmax", "differential", "talking-heads", "class-attention"}


def _check_model(model: nn.Module, spec: ViTSpec) -> None:
    if model.training:
        raise InputError(f"{spec.name} is in training mode (dropout would make the relevance random); call "
                         "model.eval() first")
    kinds = set(spec.attention_maps) - LRP_MAP_KINDS
    if kinds:
        raise UnsupportedModelError(f"{spec.name}: AttnLRP's rules are derived for the map kinds "
                                    f"{sorted(LRP_MAP_KINDS)}, but this model's maps are also {sorted(kinds)}")


def attnlrp_supported(model: nn.Module) -> bool:
    """Whether ``attnlrp`` can explain ``model``: softmax attention maps and a family whose AttnLRP rules cover every
    module (the rules are installed and removed again to find out; the model is left as it was)."""
    try:
        spec = inspect(model)
        if set(spec.attention_maps) - LRP_MAP_KINDS:
            return False
        with lrp_rules(model):
            pass
    except UnsupportedModelError:
        return False
    return True


def attnlrp_tokens(
    model: nn.Module,
    x: torch.Tensor,
    target: Target = None,
    *,
    rules: LRPRules | None = None,
    start: int = 0,
    n_images: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AttnLRP relevance of every input token for one batch (one forward, one backward).

    Args:
        model: a ViT whose family has AttnLRP rules (those of ``attnlrp``), in eval mode.
        x: a normalised ``(b, 3, H, W)`` batch on the model's device.
        target: ``None`` (predicted class), a class index, one per image, or a callable ``f(output) -> (b,)``.
        rules: ``LRPRules`` (default: epsilon rule, AttnLRP attention).
        start, n_images: the batch's offset and the image set's size (for per-image targets).

    Returns:
        ``(relevance, scores)``: ``(b, N)`` token relevance (prefix tokens first, then patches in raster order; with
        ``rules.read_at="pixels"`` the ``(b, H, W)`` pixel relevance, summed over the colour channels) and the
        ``(b,)`` explained scores, both detached, in the model's float dtype promoted to at least float32.
    """
    spec = inspect(model)
    _check_model(model, spec)
    pixels = rules is not None and rules.read_at == "pixels"
    with autograd(model, f"AttnLRP on {spec.name}"), lrp_rules(model, rules) as session:
        image = grad_leaf(x) if pixels else normal_tensor(x)
        out = model(image)
        tokens = session.tokens
        if tokens is None:
            raise CaptureError(f"{spec.name}: the first block did not run in this forward pass")
        resolved = resolve_target(target, out, start=start, n_images=n_images, model=model)
        if not resolved.scores.requires_grad:
            raise InputError(f"{spec.name}: the target score does not depend on the input tokens (no gradient); a "
                              "callable target must compute its score from the model output with torch ops")
        leaves = [image] if pixels else [t for t in (session.late_prefix, tokens) if t is not None]  # prefix first
        grads = torch.autograd.grad(resolved.scores.sum(), leaves, allow_unused=True)  # a prefix the head never reads
    dtype = torch.promote_types(tokens.dtype, torch.float32)
    dim = 1 if pixels else -1  # the colour channels, or the embedding
    relevance = torch.cat([(t.detach().to(dtype) * (torch.zeros_like(t) if g is None else g).to(dtype)).sum(dim=dim)
                           for t, g in zip(leaves, grads)], dim=1)
    return relevance, resolved.scores.detach().to(dtype)


@in_eval_mode
def attnlrp(
    model: nn.Module,
    images: Images,
    target: Target = None,
    *,
    linear_rule: str = "epsilon",
    epsilon: float = 1e-6,
    gamma: float = 0.25,
    attention_rule: str = "attnlrp",
    plain: Sequence[str] = (),
    read_at: str = "tokens",
    return_tokens: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """AttnLRP relevance maps (Achtibat et al., ICML 2024; rules in the module docstring).

    Args:
        model: a ViT whose family has AttnLRP rules (timm ``VisionTransformer`` with class token, registers or none,
            average or attention pooling, gated MLPs, gated attention, parallel blocks, differential attention;
            ``NaFlexVit``, also with Eva's blocks; timm ``Eva``: EVA-02,
            DINOv3, PE, Sapiens2, rotary ViTs; timm CaiT, BEiT and relative-position ViTs (every ViT architecture in
            timm's registry); torchvision ``VisionTransformer``; open_clip towers; Hugging Face ViT, ViTMSN,
            ViTMAE, I-JEPA, DeiT, BEiT, data2vec vision, DINOv2, DINOv3, SigLIP, AIMv2 and the CLIP vision towers;
            the list in docs/explain.md), run in eval mode. Others are refused with ``UnsupportedModelError``
            naming the class and the reason.
        images: a normalised ``(B, 3, H, W)`` tensor, or anything ``vitviz.load_images`` takes.
        target: ``None`` (predicted class), a class index, one per image, or a callable ``f(output) -> (B,)``.
        linear_rule: ``"epsilon"`` (paper Eq. 8; default), ``"gamma"`` (lxt's ViT recommendation) or ``"plain"``.
        epsilon: the epsilon rule's stabiliser (0: the plain gradient on linear layers, as lxt.efficient).
        gamma: the gamma rule's parameter.
        attention_rule: ``"attnlrp"`` (paper Prop. 3.1-3.3) or ``"cp"`` (CP-LRP: no relevance through the softmax,
            nor through a gated MLP's gate).
        plain: fnmatch patterns of linear layers left at the plain gradient (comparisons only); each must match
            a layer that takes the linear rule where the relevance is read (``lrp.linear_rule_names``; a norm, an
            activation or a whole block is refused, it would change nothing).
        read_at: ``"tokens"`` (default: where the patch and prefix tokens enter the first block; a ``(B, gh, gw)``
            map) or ``"pixels"`` (through the token embedding to the image, the patch convolution under
            ``linear_rule``: a ``(B, H, W)`` map, summed over the colour channels; the position embedding and the
            prefix tokens keep their shares, as biases do). Hybrids (a CNN backbone) are read at the tokens only.
        return_tokens: return ``(B, N)`` token relevances (prefix tokens first) instead of the maps.
        batch_size: images per forward/backward pass (default all at once).
        progress: show a progress bar.

    Returns:
        ``(B, gh, gw)`` signed relevance (``(B, H, W)`` with ``read_at="pixels"``; float32, float64 for a float64
        model, which ``vitviz.explain`` casts to float32) on the model's device; the patch and prefix relevances of
        an image sum to its explained score minus what biases and the softmax absorb.
    """
    if isinstance(plain, str):
        raise InputError(f"plain={plain!r} is a string, not a collection of patterns; pass plain=({plain!r},)")
    for name, value in (("epsilon", epsilon), ("gamma", gamma)):
        if not is_number(value) or not 0 <= value < math.inf:
            raise InputError(f"{name}={value!r} is not a non-negative finite number; pass e.g. epsilon=1e-6, "
                             "gamma=0.25 (the defaults)")
    return_tokens = check_bool(return_tokens, "return_tokens", "return (B, N) token relevances instead of the maps")
    rules = LRPRules(linear=linear_rule, epsilon=float(epsilon), gamma=float(gamma), attention=attention_rule,
                     plain=tuple(plain), read_at=read_at)
    if read_at == "pixels" and return_tokens:
        raise InputError("return_tokens=True reads the tokens, read_at='pixels' the image: pass one of them")
    spec = inspect(model)
    # a pattern that matched a norm, an activation or a whole block would leave the map as it is, silently
    names = linear_rule_names(model, rules) if plain else []
    unmatched = [pat for pat in plain if not any(fnmatch.fnmatchcase(n, pat) for n in names)]
    if unmatched:
        raise InputError(f"plain={tuple(plain)!r}: {unmatched} match no layer that takes the linear rule in "
                         f"{spec.name} (read at the {read_at}); pass fnmatch patterns of those layers' names, e.g. "
                         f"plain=({names[-1]!r},) (vitviz.core.families.lrp.linear_rule_names lists them)")
    total = count_images(images)
    out: list[torch.Tensor] = []
    done = 0
    for x in iter_batches(model, images, batch_size, progress=progress, desc="attnlrp"):
        relevance, _ = attnlrp_tokens(model, x, target, rules=rules, start=done, n_images=total)
        if return_tokens or read_at == "pixels":
            out.append(relevance)
        else:
            gh, gw = spec.grid_for_input(x)
            p = spec.num_prefix_tokens
            if relevance.shape[1] != p + gh * gw:
                raise CaptureError(f"{spec.name}: {relevance.shape[1]} tokens do not fit {p} prefix tokens and a "
                                   f"{gh}x{gw} grid")
            out.append(relevance[:, p:].reshape(len(x), gh, gw))
        done += len(x)
    return torch.cat(out)
