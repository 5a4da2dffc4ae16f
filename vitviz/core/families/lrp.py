"""AttnLRP's propagation rules as modified backward passes, installed per family for the duration of one call.

Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML 2024, in the
gradient x input form (the relevance of a tensor ``t`` is ``t * dscore/dt`` under the modified backward; the
reformulation of Arras et al. 2025 that lxt's ``lxt.efficient`` uses). Each rule changes only a backward pass; every
forward is the module's own, so the model's output is unchanged:

- ``nn.Linear`` (and ``nn.MultiheadAttention``'s projections; read at the pixels, the patch ``nn.Conv2d``, a linear
  map too): the epsilon rule (paper Eq. 8),
  ``R_x = x * W^T (R_z / (z + eps sign z))``, as the gradient ``g_x = W^T (g_z * z / (z + eps sign z))``
  (``eps = 0``: the plain gradient, lxt.efficient's form); or the generalised gamma rule (Montavon et al. 2019,
  Andeol et al. 2021, exactly as ``zennit.rules.Gamma``: positive and negative parts of weights and inputs, the
  bias in the denominator); or ``"plain"`` (the plain gradient, for comparisons).
- softmax (paper Prop. 3.1, Taylor decomposition at the input with a bias term):
  ``R_in = x * (R_out - s * sum(R_out))``; in this form that *is* the softmax's plain gradient, so the attention
  kernel (fused or not) runs untouched.
- ``q k^T`` and ``attn @ v`` (paper Prop. 3.3, epsilon then the uniform rule of Prop. 3.2): each product's relevance
  is split equally between its two factors, i.e. the gradient reaching each factor is halved. ``q`` and ``k`` sit
  behind two such products, ``v`` behind one: their gradients are scaled by 1/4, 1/4 and 1/2 at the projection
  that makes them (every backward here is linear in the incoming gradient, so the scale may sit anywhere on the
  path; lxt.efficient scales q, k, v the same way). The ``"cp"`` variant (CP-LRP, Ali et al. 2022) scales them by
  0, 0, 1 instead: no relevance through the softmax.
- attention pooling with a learned query (timm's ``AttentionPoolLatent``, SigLIP's and AIMv2's pooling heads,
  open_clip's attentional pooler): the query is a parameter, not an input, so ``q k^T`` is a linear map of ``k``
  whose weight is ``q`` (the epsilon rule, Eq. 8): all of a score's relevance goes to ``k``; ``attn @ v`` takes the
  uniform rule as above. The gradients to ``k`` and ``v`` are scaled 1/2 and 1/2 (CP-LRP: 0 and 1); nothing is read
  at the query. (lxt's recipe for SigLIP 2's head stops the keys' gradient instead, dropping the scores' half;
  docs/explain.md.)
- differential attention (Ye et al., "Differential Transformer", ICLR 2025; timm's ``DiffAttention`` and
  ``DiffParallelScalingBlock``): each head's output is ``(A1 - lambda A2) @ v`` with ``lambda`` a function of the
  weights only (a constant): a sum of the products ``A1 v`` and ``-lambda A2 v``, each taking the uniform rule as
  above, so the half-width q and k heads behind ``A1`` and ``A2`` and the shared v keep the scales 1/4, 1/4, 1/2;
  the per-head RMS norm after it takes the norm rule below, the constant ``1 - lambda_init`` scale passes the
  relevance on. Parallel blocks (ViT-22B's ``ParallelScalingBlock``: one projection makes the MLP's input and q, k,
  v, whose MLP part keeps its gradient; ``ParallelThingsBlock``: summed branches) need no rule of their own: a sum
  is linear.
- gated MLPs (SwiGLU: ``down(act(gate(x)) * up(x))``; timm's ``SwiGLU`` and ``GluMlp``, AIMv2, DINOv3's gated MLP):
  the element-wise product takes the uniform rule (paper Prop. 3.2; lxt's ``gated_mlp_forward`` halves the
  product's gradient the same way), so the gradients to the gate and up projections are scaled 1/2; the activation
  on the gate takes the identity rule below. The ``"cp"`` variant holds the gate constant (scales 0 and 1), as
  lxt's ``cp_gated_mlp_forward`` does.
- gated attention (an output gate, ``proj(norm(o) * sigmoid(gate(x)))``: timm's ``Attention``, ``EvaAttention`` and
  ``AttentionRope`` built with ``gated=True``, as NaFlexVit's ``attn_gated``; Qiu et al., "Gated Attention for
  Large Language Models", NeurIPS 2025): the gate is held constant and the attention output takes all of the
  product's relevance, under both attention rules. The uniform rule would give the gate half, to be passed through
  the sigmoid by the identity rule below; but ``sigmoid(0) = 1/2``: near ``z = 0`` that half stays finite while
  ``z`` vanishes, and the gate projection's epsilon rule divides it by ``z`` (the activations the identity rule is
  used for vanish at 0, ``GELU(z) ~ z / 2``, which keeps the ratio bounded). Holding a sigmoid gate constant is
  LRP's rule for the gates of LSTMs ("signal-take-all", Arras et al., "Explaining Recurrent Neural Network
  Predictions in Sentiment Analysis", WASSA 2017), and what CP-LRP does to a gated MLP's gate
  (``install_output_gate``). The same for a gated MLP whose gate is a sigmoid (the original GLU, Dauphin et al.
  2017: timm's ``GluMlp`` or ``SwiGLU`` with ``act_layer=nn.Sigmoid``): scales 0 and 1.
- LayerNorm / RMSNorm (paper Prop. 3.4): the identity rule on the division, i.e. the standard deviation (RMS) is
  a constant in the backward; the centring and the affine weight are linear (epsilon rule, plain gradient). The
  backward runs in at least float32 (a half-precision model's norms too, as torch's own forward does).
- element-wise nonlinearities (GELU, SiLU, ReLU, tanh; paper Eq. 9): the identity rule ``R_in = R_out``, as the
  gradient ``g_in = g_out * f(x) / x`` (0 where ``x = 0``).

The relevance is read at the tokens entering the first block (``emit`` receives them, detached and made a leaf so
the backward stops there), or with ``LRPRules(read_at="pixels")`` at the image, the token embedding's modules
taking the rules too. Everything is installed on *instances* (``forward`` attributes, hooks) and undone by
the returned callable; no class and nothing in ``torch.nn`` or ``torch.nn.functional`` is patched.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitviz.core.families.base import Undo, chain_undos, plain_conv, plain_linear, set_attr
from vitviz.errors import InputError, UnsupportedModelError

LINEAR_RULES = ("epsilon", "gamma", "plain")
ATTENTION_RULES = ("attnlrp", "cp")
READ_AT = ("tokens", "pixels")
QKV_FACTORS = {"attnlrp": (0.25, 0.25, 0.5), "cp": (0.0, 0.0, 1.0)}
POOL_KV_FACTORS = {"attnlrp": (0.5, 0.5), "cp": (0.0, 1.0)}  # a learned query: q k^T is linear in k
# act(gate) * up, (gate, up): the uniform rule; CP-LRP holds the gate constant (lxt's cp_LRP for gated MLPs)
GATE_FACTORS = {"attnlrp": (0.5, 0.5), "cp": (0.0, 1.0)}
SIGMOID_GATE_FACTORS = (0.0, 1.0)  # a sigmoid gate held constant (signal-take-all), under both attention rules
ACTIVATIONS = ("GELU", "GELUActivation", "QuickGELU", "QuickGELUActivation", "GELUTanh", "SiLU",
               "SiLUActivation", "ReLU", "Tanh", "NewGELUActivation", "FastGELUActivation",
               "GELUPytorchTanh", "PytorchGELUTanh")
NORMS = ("LayerNorm", "RMSNorm", "RmsNorm", "LayerNorm2d")
PASS_THROUGH = ("Dropout", "Identity", "DropPath")
# in the token embedding (read at the pixels): a position table looked up by index (no gradient reaches an index)
# and a patch dropout, the identity in eval mode
EMBEDDING_PASS = ("Embedding", "PatchDropout")


@dataclass(frozen=True)
class LRPRules:
    """Which rule each layer type gets (see the module docstring).

    Attributes:
        linear: ``"epsilon"`` (default), ``"gamma"`` or ``"plain"``.
        epsilon: the epsilon rule's stabiliser (``z + epsilon * sign(z)``, sign 0 -> +1); 0 gives the plain gradient.
        gamma: the gamma rule's weight on the positive (negative) parts.
        gamma_stabilizer: the gamma rule's denominator stabiliser (zennit's default 1e-6).
        attention: ``"attnlrp"`` (softmax rule + uniform rule on both matmuls and on a gated MLP's product) or
            ``"cp"`` (CP-LRP: no relevance through the softmax, nor through a gated MLP's gate).
        plain: fnmatch patterns of linear-layer names left at the plain gradient whatever ``linear`` says (for
            comparisons with recipes that skip a layer; torchvision attention projections are named
            ``<attention>.in_proj`` and ``<attention>.out_proj``).
        read_at: ``"tokens"`` (the first block's input; the default) or ``"pixels"`` (the image: the rules also act
            on the token embedding, the patch convolution taking ``linear``'s rule; the position embedding and
            the prefix tokens, inputs of no pixel, keep their shares as biases do).
    """

    linear: str = "epsilon"
    epsilon: float = 1e-6
    gamma: float = 0.25
    gamma_stabilizer: float = 1e-6
    attention: str = "attnlrp"
    plain: tuple[str, ...] = ()
    read_at: str = "tokens"

    def __post_init__(self) -> None:
        if self.linear not in LINEAR_RULES:
            raise InputError(f"linear_rule={self.linear!r} is not one of {LINEAR_RULES}")
        if self.attention not in ATTENTION_RULES:
            raise InputError(f"attention_rule={self.attention!r} is not one of {ATTENTION_RULES}")
        if self.read_at not in READ_AT:
            raise InputError(f"read_at={self.read_at!r} is not one of {READ_AT}")
        if not self.epsilon >= 0 or not self.gamma >= 0:
            raise InputError(f"epsilon={self.epsilon!r} and gamma={self.gamma!r} must be non-negative numbers")

    def linear_for(self, name: str) -> str:
        return "plain" if any(fnmatch.fnmatchcase(name, p) for p in self.plain) else self.linear


def _stabilize(z: torch.Tensor, eps: float) -> torch.Tensor:
    return z + eps * torch.where(z >= 0, 1.0, -1.0).to(z.dtype)


@dataclass(frozen=True)
class _Affine:
    """An affine map ``z = op(x, w) + b``: ``F.linear`` (``conv=None``) or ``F.conv2d`` with ``conv``'s stride,
    padding, dilation and groups; ``back(g, w, x)`` is the transpose of ``op(., w)`` applied to ``g``."""

    conv: tuple | None = None

    def op(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, w, b) if self.conv is None else F.conv2d(x, w, b, *self.conv)

    def back(self, g: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return g @ w if self.conv is None else torch.nn.grad.conv2d_input(x.shape, w, g, *self.conv)

    def per_feature(self, t: torch.Tensor) -> torch.Tensor:
        """A per-output-feature vector shaped to broadcast against ``z`` (channels first for a convolution)."""
        return t if self.conv is None else t[:, None, None]


class _LinearRule(torch.autograd.Function):
    """``F.linear`` (or ``F.conv2d``) forward; the backward applies the chosen LRP rule (gradient x input form)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rule: str,
                rules: LRPRules, factor: torch.Tensor | None, affine: _Affine) -> torch.Tensor:
        z = affine.op(x, weight, bias)
        ctx.save_for_backward(x, weight, bias, z, factor)
        ctx.rule, ctx.rules, ctx.affine = rule, rules, affine
        return z

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, w, b, z, factor = ctx.saved_tensors
        rules: LRPRules = ctx.rules
        f: _Affine = ctx.affine
        none = (None,) * 6
        if factor is not None:
            g = g * f.per_feature(factor)
        if ctx.rule == "plain" or (ctx.rule == "epsilon" and rules.epsilon == 0):
            return f.back(g, w, x), *none
        if ctx.rule == "epsilon":  # z / (z + eps sign z) = |z| / (|z| + eps)
            a = z.abs()
            return f.back(g * a.div_(a + rules.epsilon), w, x), *none
        # generalised gamma rule (zennit.rules.Gamma): relevance R = g * z split by the sign of z
        gm = rules.gamma
        wp, wn = w + gm * w.clamp(min=0), w + gm * w.clamp(max=0)
        xp, xn = x.clamp(min=0), x.clamp(max=0)
        if b is None:
            zp = f.op(xp, wp) + f.op(xn, wn)
            zn = f.op(xp, wn) + f.op(xn, wp)
        else:
            zp = f.op(xp, wp, b + gm * b.clamp(min=0)) + f.op(xn, wn)
            zn = f.op(xp, wn, b + gm * b.clamp(max=0)) + f.op(xn, wp)
        r = g * z
        cp = torch.where(z > 0, r, 0) / _stabilize(zp, rules.gamma_stabilizer)
        cn = torch.where(z < 0, r, 0) / _stabilize(zn, rules.gamma_stabilizer)
        pos = f.back(cp, wp, x) + f.back(cn, wn, x)  # R_x / x where x > 0
        neg = f.back(cp, wn, x) + f.back(cn, wp, x)  # R_x / x where x < 0
        gx = torch.where(x > 0, pos, torch.where(x < 0, neg, torch.zeros_like(pos)))
        return gx, *none


LINEAR = _Affine()


def lrp_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rule: str, rules: LRPRules,
               factor: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose backward applies ``rule``; ``factor`` scales the incoming gradient
    per output feature (the uniform rule's 1/4, 1/4, 1/2 on q, k, v)."""
    return _LinearRule.apply(x, weight, bias, rule, rules, factor, LINEAR)


def install_conv(module: nn.Conv2d, rule: str, rules: LRPRules, copy: bool = False) -> Undo:
    """``rule`` on an ``nn.Conv2d`` instance (the patch embedding, read at the pixels): the same rules as a linear
    layer, a convolution being one (zero padding only: its forward is ``F.conv2d`` of its weights); ``copy`` as for
    ``install_linear``."""
    padding = (0, 0) if module.padding == "valid" else module.padding
    affine = _Affine((module.stride, padding, module.dilation, module.groups))

    def forward(x: torch.Tensor) -> torch.Tensor:
        z = _LinearRule.apply(x, module.weight, module.bias, rule, rules, None, affine)
        return z.clone() if copy else z

    return set_attr(module, "forward", forward)


class _IdentityRule(torch.autograd.Function):
    """``fn(x)`` forward; backward ``g * fn(x) / x`` (the identity rule ``R_in = R_out``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        y = fn(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, y = ctx.saved_tensors
        ratio = torch.where(x == 0, torch.zeros_like(y), y / torch.where(x == 0, torch.ones_like(x), x))
        return g * ratio, None


class _NormRule(torch.autograd.Function):
    """A LayerNorm / RMSNorm forward (the module's own); backward with the denominator held constant."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], dims: tuple[int, ...],
                weight: torch.Tensor | None, eps: float, centre: bool) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.dims, ctx.eps, ctx.centre = dims, eps, centre
        return fn(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        dims = ctx.dims
        if weight is not None and dims == (1,) and x.dim() > 2:  # a channel norm: (C,) weight over (B, C, ...)
            weight = weight.reshape(-1, *([1] * (x.dim() - 2)))
        # in at least float32, as torch's own norms compute: in half precision the mean of the squares overflows
        # once a feature passes about 256 (float16), the denominator is infinite and the token's relevance 0
        dtype = torch.promote_types(x.dtype, torch.float32)
        x = x.to(dtype)
        xf = x - x.mean(dim=dims, keepdim=True) if ctx.centre else x
        denom = (xf.pow(2).mean(dim=dims, keepdim=True) + ctx.eps).sqrt()
        gy = g.to(dtype) if weight is None else g.to(dtype) * weight.to(dtype)
        if ctx.centre:
            gy = gy - gy.mean(dim=dims, keepdim=True)
        return (gy / denom).to(g.dtype), None, None, None, None, None


def _norm_eps(module: nn.Module) -> float:
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if eps is None:  # torch.nn.RMSNorm(eps=None) uses the dtype's machine epsilon
        eps = torch.finfo(module.weight.dtype if getattr(module, "weight", None) is not None else torch.float32).eps
    return float(eps)


def install_norm(module: nn.Module) -> Undo:
    """The identity rule on a LayerNorm / RMSNorm instance (its own forward, the modified backward): over its
    ``normalized_shape``'s trailing axes, or, for timm's ``LayerNorm2d`` (a LayerNorm over the channels of a
    ``(B, C, H, W)`` map), over axis 1."""
    original = type(module).forward
    cls = type(module).__name__
    centre = isinstance(module, nn.LayerNorm) or cls in ("LayerNorm", "LayerNorm2d")
    shape = getattr(module, "normalized_shape", None)
    n = len(shape) if isinstance(shape, (tuple, list)) else 1
    dims = (1,) if cls == "LayerNorm2d" else tuple(range(-n, 0))
    eps = _norm_eps(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _NormRule.apply(x, lambda t: original(module, t), dims, getattr(module, "weight", None), eps, centre)

    return set_attr(module, "forward", forward)


def install_activation(module: nn.Module) -> Undo:
    """The identity rule on an element-wise activation instance."""
    original = type(module).forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _IdentityRule.apply(x, lambda t: original(module, t))

    return set_attr(module, "forward", forward)


def install_output_gate(attn: nn.Module) -> Undo:
    """The rule of a gated attention's output, ``proj(norm(o) * sigmoid(gate(x)))`` (timm's gated ``Attention``,
    ``EvaAttention``, ``AttentionRope``): a forward hook hands the module its gate projection's output detached, so the
    gate is a constant of the backward (its value unchanged) and the product passes all its relevance to ``o``: LRP's
    rule for sigmoid gates (signal-take-all, Arras et al. 2017), under both attention rules (module docstring)."""
    return attn.gate.register_forward_hook(lambda _m, _args, out: out.detach()).remove


def install_linear(module: nn.Linear, rule: str, rules: LRPRules, factor: torch.Tensor | None = None,
                   copy: bool = False) -> Undo:
    """``rule`` on an ``nn.Linear`` instance (optionally scaling its output's gradient by ``factor``); ``copy``
    hands on a copy of the output, for a caller that adds to it in place (the rule keeps the output it saved)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        z = lrp_linear(x, module.weight, module.bias, rule, rules, factor)
        return z.clone() if copy else z

    return set_attr(module, "forward", forward)


def scale_vector(widths: Iterable[int], scales: Iterable[float], like: torch.Tensor) -> torch.Tensor:
    """Per-feature gradient scales: ``scales[i]`` repeated ``widths[i]`` times, in ``like``'s dtype and device."""
    return torch.cat([torch.full((n,), f, dtype=like.dtype, device=like.device) for n, f in zip(widths, scales)])


def qkv_factor(rules: LRPRules, widths: tuple[int, int, int], like: torch.Tensor) -> torch.Tensor:
    """The per-feature gradient scale of a fused ``[q, k, v]`` projection output."""
    return scale_vector(widths, QKV_FACTORS[rules.attention], like)


def pool_kv_factor(rules: LRPRules, widths: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """The per-feature gradient scale of a fused ``[k, v]`` projection of an attention pool with a learned query."""
    return scale_vector(widths, POOL_KV_FACTORS[rules.attention], like)


def gate_up_factors(rules: LRPRules, gate: nn.Linear, up: nn.Linear,
                    sigmoid: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient scales of a gated MLP's separate gate and up projections (``GATE_FACTORS``; a ``sigmoid`` gate,
    as the original GLU's, held constant: ``SIGMOID_GATE_FACTORS``)."""
    fg, fu = SIGMOID_GATE_FACTORS if sigmoid else GATE_FACTORS[rules.attention]
    return (scale_vector((gate.out_features,), (fg,), gate.weight),
            scale_vector((up.out_features,), (fu,), up.weight))


def fused_gate_factor(rules: LRPRules, fc1: nn.Linear, gate_first: bool, sigmoid: bool = False) -> torch.Tensor:
    """The gradient scale of a fused ``[gate, up]`` (``gate_first``) or ``[up, gate]`` projection."""
    fg, fu = SIGMOID_GATE_FACTORS if sigmoid else GATE_FACTORS[rules.attention]
    half = fc1.out_features // 2
    return scale_vector((half, half), (fg, fu) if gate_first else (fu, fg), fc1.weight)


def input_hook(module: nn.Module, emit: Callable[[torch.Tensor], None], arg: str = "hidden_states",
               index: int = 0, leaf: bool = True) -> Undo:
    """A pre-hook on the first block: its input tokens ``(B, N, D)`` (positional argument ``index``, or keyword
    ``arg``) become a detached leaf that requires grad (the backward stops there), handed to ``emit``; the forward's
    values are unchanged. With ``leaf=False`` (relevance read at the pixels) the tokens are handed on as they are."""

    def pre(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if len(args) > index:
            x = args[index].detach().requires_grad_(True) if leaf else args[index]
            emit(x)
            return (*args[:index], x, *args[index + 1:]), kwargs
        x = kwargs[arg].detach().requires_grad_(True) if leaf else kwargs[arg]
        emit(x)
        return args, {**kwargs, arg: x}

    return module.register_forward_pre_hook(pre, with_kwargs=True).remove


def classify(modules: Iterable[tuple[str, nn.Module]], model_name: str, containers: set[str],
             skip: Callable[[str, nn.Module], bool] = lambda n, m: False,
             norms: Iterable[str] = ()) -> dict[str, list[tuple[str, nn.Module]]]:
    """Sort modules into linear / conv / norm / activation; any other class that is not a known container or a
    pass-through (dropout, identity; in the token embedding a position table's lookup and patch dropout) is
    refused: vitviz has no rule for what it computes. ``norms`` names further norm classes (a model file's own
    RMSNorm, ``weight * x / sqrt(mean(x^2) + eps)``)."""
    norms = set(NORMS) | set(norms)
    from torch.nn.utils import parametrize

    out: dict[str, list[tuple[str, nn.Module]]] = {"linear": [], "conv": [], "norm": [], "act": []}
    modules = list(modules)
    # what a parametrization computes from the weights (``<module>.parametrizations.*``) is off the tokens' path
    weights_only = tuple(f"{n}.parametrizations" for n, m in modules if parametrize.is_parametrized(m))
    for name, m in modules:
        if name in weights_only or name.startswith(tuple(f"{p}." for p in weights_only)):
            continue
        # a parametrized module (weight norm, spectral norm, your parametrization) computes its class's forward with
        # the parametrized weight, which the rules read: it is sorted by its class before the parametrization
        base = parametrize.type_before_parametrizations(m)
        cls = base.__name__
        if skip(name, m) or cls in PASS_THROUGH + EMBEDDING_PASS or isinstance(m, (nn.Dropout, nn.Identity)):
            continue
        if plain_linear(m):
            out["linear"].append((name, m))
        elif plain_conv(m):
            out["conv"].append((name, m))
        elif cls in norms:
            out["norm"].append((name, m))
        elif cls in ACTIVATIONS:
            out["act"].append((name, m))
        elif cls not in containers:
            adapter = (" It looks like an adapter layer (a LoRA): merge the adapters into the weights first (peft: "
                       "model.merge_and_unload()), or use" if base.__module__.split(".")[0] == "peft"
                       or isinstance(getattr(m, "base_layer", None), nn.Module) else " Use")
            raise UnsupportedModelError(
                f"{model_name}: AttnLRP has no rule for the module {name} ({base.__module__}.{base.__qualname__}); "
                "vitviz refuses rather than propagate through it with the plain gradient. Supported: nn.Linear "
                "(its own forward), nn.Conv2d (a patch embedding read at the pixels), LayerNorm/RMSNorm, "
                "GELU/SiLU/ReLU/tanh, softmax attention, attention pooling "
                "with a learned query, gated (SwiGLU) MLPs, gated attention outputs."
                f"{adapter} explain(method='chefer') for this model")
    return out


def install_generic(groups: dict[str, list[tuple[str, nn.Module]]], rules: LRPRules,
                    factors: dict[str, torch.Tensor] | None = None,
                    copy: Callable[[str], bool] = lambda name: False) -> Undo:
    """Install the rules on classified modules; ``factors`` maps a linear layer's name to its gradient scale;
    ``copy(name)``: the layer's caller changes its output in place (``install_linear``)."""
    factors = factors or {}
    undos: list[Undo] = []
    try:
        for name, m in groups["linear"]:
            undos.append(install_linear(m, rules.linear_for(name), rules, factors.get(name), copy(name)))
        for name, m in groups["conv"]:
            undos.append(install_conv(m, rules.linear_for(name), rules, copy(name)))
        for _name, m in groups["norm"]:
            undos.append(install_norm(m))
        for _name, m in groups["act"]:
            undos.append(install_activation(m))
    except BaseException:
        chain_undos(undos)()
        raise
    return chain_undos(undos)


class LRPSession:
    """What ``lrp_rules`` hands back: ``tokens`` is the ``(B, N, D)`` input of the first block from the most recent
    forward pass (a leaf that requires grad), or None before one; ``late_prefix`` the ``(B, P, D)`` prefix tokens
    of a model that adds them after the first block (CaiT's class token, entering its class-attention blocks), read
    where they enter, or None."""

    def __init__(self) -> None:
        self.tokens: torch.Tensor | None = None
        self.late_prefix: torch.Tensor | None = None

    def _emit(self, x: torch.Tensor, where: str = "tokens") -> None:
        if where == "late_prefix":
            self.late_prefix = x
        else:
            self.tokens = x


def linear_rule_names(model: nn.Module, rules: LRPRules | None = None) -> list[str]:
    """The names of the layers that take ``rules``'s linear rule in ``model`` (where its family installs them: its
    ``nn.Linear`` and, read at the pixels, patch ``nn.Conv2d`` modules, a fused projection vitviz computes itself,
    ``nn.MultiheadAttention``'s ``<name>.in_proj`` and ``<name>.out_proj``, open_clip's bare ``proj`` matrix): the
    names ``LRPRules.plain`` may match. The rules are installed and removed again to find out.

    Raises:
        UnsupportedModelError: the family has no AttnLRP rules for the model.
    """
    seen: list[str] = []

    class _Recording(LRPRules):  # every installer asks linear_for(name) for each layer it gives the linear rule
        def linear_for(self, name: str) -> str:
            seen.append(name)
            return super().linear_for(name)

    base = rules or LRPRules()
    with lrp_rules(model, _Recording(**{f.name: getattr(base, f.name) for f in fields(base)})):
        pass
    return list(dict.fromkeys(seen))


@contextmanager
def lrp_rules(model: nn.Module, rules: LRPRules | None = None) -> Iterator[LRPSession]:
    """Install AttnLRP's rules on ``model`` through its family for the duration of the block.

    On exit, also when the block raises, every ``forward`` attribute and hook is removed: the model's state dict,
    flags, hooks and outputs are as before.
    """
    from vitviz.core.contexts import refuse_quantized
    from vitviz.core.families import family_of

    family = family_of(model)
    refuse_quantized(model, "AttnLRP")  # before a rule reads a quantized layer's weight() method as a tensor
    session = LRPSession()
    undo = family.lrp_rules(model, rules or LRPRules(), session._emit)
    try:
        yield session
    finally:
        undo()
