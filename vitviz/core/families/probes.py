"""The generic probes: reading post-softmax attention out of a timm-style module, a hand-written one, or
``torch.nn.MultiheadAttention`` (see ``vitviz.core.families.base`` for what a probe is and returns).

- ``probe_attn_drop``: timm-style modules (``qkv``, ``scale``, ``attn_drop``, optional ``fused_attn``). Switches
  ``fused_attn`` off, whose fused ``scaled_dot_product_attention`` path never materialises the probabilities, and
  hooks ``attn_drop``, whose input is the softmax output.
- ``probe_qkv``: recomputes ``softmax(q k^T * scale)`` from the ``qkv`` Linear's output (after the module's
  per-head ``q_norm`` / ``k_norm``), for modules that compute attention without an ``attn_drop`` module
  (hand-written ViTs); modules with rotary or relative-position attributes, calls with a mask, and a fused
  ``scaled_dot_product_attention`` call that scales otherwise than ``scale`` are refused.
- ``probe_mha``: ``torch.nn.MultiheadAttention`` (torchvision, open_clip), called with ``need_weights=True`` and
  per-head weights for the duration; ``mha_dropout_error`` refuses one that would return dropped-out weights.
- ``probe_latent_pool``, ``probe_mha_pool``: an attention pool's attention over the tokens it pools, for the
  readout (``Family.readout_attention``, ``vitviz.core.families.readout``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from vitviz.core.families.base import Emit, Undo, chain_undos, held_attr, set_attr
from vitviz.core.families.readout import query_mean
from vitviz.errors import CaptureError, UnsupportedModelError

__all__ = ["mha_dropout_error", "probe_attn_drop", "probe_mha", "probe_qkv", "refuse_mha_dropout"]


def probe_attn_drop(module: nn.Module, emit: Emit) -> Undo:
    """Read attention where the module's ``attn_drop`` receives it (``emit`` gets the input of ``attn_drop``; a
    family's probe may pass a transform that embeds or combines the maps before emitting them); turns timm's
    ``fused_attn`` off for the duration."""
    drop = getattr(module, "attn_drop", None)
    if not isinstance(drop, nn.Module):
        raise UnsupportedModelError(
            f"{type(module).__name__} has no attn_drop module to read attention from; describe the model with "
            "vitviz.describe(model, probe='qkv') to recompute attention from its qkv projection"
        )
    undos: list[Undo] = []
    if hasattr(module, "fused_attn"):
        # held, not set: a stream probe's call (``timm_probes.probe_timm_stream``) also switches it off, and one
        # stopped by an error keeps it off until its next call; holds released in any order restore the first value
        undos.append(held_attr(module, "fused_attn", False))
    handle = drop.register_forward_hook(lambda _m, inputs, _out: emit(inputs[0]))
    undos.append(handle.remove)
    return chain_undos(undos)


def _inside_attention_position(name: str) -> bool:
    """Whether an attribute name says position information applied inside attention (rotary embeddings, a
    relative position bias, ALiBi): ``rope``, ``rotary_emb``, ``freqs_cis``, ``rel_pos_bias``,
    ``relative_position_bias_table``, ``pos_bias``, ``alibi_slopes`` ..."""
    t = set(name.lower().split("_"))
    return bool(t & {"rope", "rotary", "freqs", "alibi", "relative", "relpos"}) or (
        "rel" in t and "pos" in t) or ("pos" in t and "bias" in t) or ("rot" in t and ("emb" in t or "embed" in t))


def _qkv_norm(module: nn.Module, attr: str, head_dim: int) -> nn.Module | None:
    """``module.q_norm`` / ``k_norm`` when it is a module applied per head (``(B, H, N, d)``), None when absent or
    an identity; refused when its width is not the head dimension (where it applies cannot be told)."""
    norm = getattr(module, attr, None)
    if not isinstance(norm, nn.Module) or isinstance(norm, nn.Identity):
        return None
    shape = getattr(norm, "normalized_shape", None)
    width = tuple(shape) if isinstance(shape, (tuple, list, torch.Size)) else (shape,)
    if shape is None or width != (head_dim,):
        raise UnsupportedModelError(
            f"{type(module).__name__}.{attr} is a {type(norm).__name__} of width {shape}, not a norm over the head "
            f"dimension {head_dim}, so probe='qkv' cannot tell where it applies; describe the model with "
            "probe='attn_drop' (an nn.Dropout on the post-softmax attention) or a probe function of your own"
        )
    return norm


class _FusedCallWatch(TorchFunctionMode):
    """Held open around one call of a module read by ``probe_qkv``: its ``F.scaled_dot_product_attention`` calls (a
    fused path) must compute what the recomputation reads, ``softmax(q k^T * scale)``. SDPA called without
    ``scale=`` scales by ``head_dim ** -0.5`` whatever the module's ``scale`` says; with a mask or ``is_causal`` it
    applies what the recomputation leaves out: ``CaptureError`` either way, raised inside the module's forward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            named = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"), args))
            named.update(kwargs)
            cls, head_dim = type(self.module).__name__, named["query"].shape[-1]
            used, wanted = named.get("scale"), _qkv_scale(self.module, head_dim)
            if not math.isclose(head_dim ** -0.5 if used is None else float(used), float(wanted), rel_tol=1e-6):
                shown = f"None (head_dim ** -0.5 = {head_dim ** -0.5:.6g})" if used is None else f"{float(used):.6g}"
                raise CaptureError(
                    f"{cls} calls scaled_dot_product_attention with scale {shown}, but its scale is "
                    f"{float(wanted):.6g}, which probe='qkv' recomputes softmax(q k^T * scale) with: the maps would "
                    "not be the ones the model computes; pass scale=self.scale to scaled_dot_product_attention, set "
                    "scale to the one the kernel uses, or describe the model with a probe function of your own")
            if named.get("attn_mask") is not None or named.get("is_causal"):
                raise CaptureError(
                    f"{cls} calls scaled_dot_product_attention with a mask (attn_mask or is_causal), which "
                    "probe='qkv' cannot apply when it recomputes softmax(q k^T * scale); describe the model with "
                    "probe='attn_drop' or a probe function of your own")
        return func(*args, **kwargs)


def _qkv_scale(module: nn.Module, head_dim: int) -> Any:
    """The scale ``probe_qkv`` recomputes with: the module's ``scale``, else ``head_dim ** -0.5``."""
    return getattr(module, "scale", head_dim ** -0.5)


def probe_qkv(module: nn.Module, emit: Emit) -> Undo:
    """Recompute ``softmax(q_n k_n^T * scale)`` from the ``qkv`` Linear's output, with ``q_n``/``k_n`` the heads
    after the module's ``q_norm`` / ``k_norm`` when it has them (per-head norms, as timm's ``Attention``), and
    ``scale`` the module's ``scale`` attribute (``head_dim ** -0.5`` without one).

    Refused (``UnsupportedModelError``, naming the class and the attribute) when the module holds position
    information applied inside attention (rotary embeddings, a relative position bias, ALiBi: attributes named
    ``rope``, ``rel_pos``, ``relative_position_bias_table``, ...); a call with any argument besides the tokens (an
    attention mask, a rotary table) raises ``CaptureError``: the recomputation would leave them out.

    What is checked of the module's own computation, and what is assumed: a fused path, a call of
    ``F.scaled_dot_product_attention`` inside the module's forward, is checked on every call (``CaptureError`` when
    it scales otherwise than ``scale``, e.g. called without ``scale=`` while ``scale`` was changed, or applies a
    mask). An explicit path cannot be read from outside: it is *assumed* to compute ``softmax(q k^T * scale)`` with
    the module's ``scale`` (a forward that divides by ``sqrt(head_dim)`` and never reads a changed ``scale`` is read
    with ``scale``, not as it computes); give such a module an ``attn_drop`` module on its softmax output and use
    ``probe='attn_drop'``, which reads the maps it computes.
    """
    qkv = getattr(module, "qkv", None)
    heads = getattr(module, "num_heads", None)
    if not isinstance(qkv, nn.Linear) or not heads:
        raise UnsupportedModelError(
            f"{type(module).__name__} needs a qkv Linear and num_heads for probe='qkv' "
            f"(found qkv={type(qkv).__name__}, num_heads={heads})"
        )
    found = [(n, v) for n, v in vars(module).items() if not n.startswith("_")]
    found += [item for d in (module._modules, module._parameters, module._buffers) for item in d.items()]
    odd = [n for n, v in found if v is not None and v is not False and _inside_attention_position(n)]
    if odd:
        raise UnsupportedModelError(
            f"{type(module).__name__} has {odd[0]!r}: position information applied inside attention (rotary "
            "embeddings or a relative position bias) that probe='qkv' cannot reproduce from the qkv projection; "
            "describe the model with probe='attn_drop' (an nn.Dropout on the post-softmax attention) or a probe "
            "function of your own"
        )
    head_dim = qkv.out_features // (3 * int(heads))
    q_norm, k_norm = (_qkv_norm(module, a, head_dim) for a in ("q_norm", "k_norm"))

    def check_call(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        extra = [f"argument {i}" for i, a in enumerate(args[1:], 1) if a is not None]
        extra += [k for k, v in kwargs.items() if v is not None and not isinstance(v, bool)]
        if extra:
            raise CaptureError(
                f"{type(module).__name__} was called with {extra[0]} besides the tokens (an attention mask or a "
                "position table?), which probe='qkv' cannot apply when it recomputes softmax(q k^T * scale); "
                "describe the model with probe='attn_drop' or a probe function of your own"
            )

    def hook(_m: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        b, n, three_d = out.shape
        q, k, _v = out.reshape(b, n, 3, heads, three_d // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)
        q = q if q_norm is None else q_norm(q)
        k = k if k_norm is None else k_norm(k)
        scores = (q.float() * _qkv_scale(module, q.shape[-1])) @ k.float().transpose(-2, -1)
        emit(scores.softmax(dim=-1).to(out.dtype))

    watches: list[_FusedCallWatch] = []

    def watch(_m: nn.Module, _args: tuple) -> None:
        watches.append(_FusedCallWatch(module))
        watches[-1].__enter__()

    def unwatch(_m: nn.Module, _args: tuple, _out: Any) -> None:  # always_call: also when the forward raised
        if watches:
            watches.pop().__exit__(None, None, None)

    def drain() -> None:  # a call stopped by a BaseException (Ctrl-C) skips even always_call hooks
        while watches:
            watches.pop().__exit__(None, None, None)

    handles = [module.register_forward_pre_hook(check_call, with_kwargs=True), qkv.register_forward_hook(hook),
               module.register_forward_pre_hook(watch), module.register_forward_hook(unwatch, always_call=True)]
    return chain_undos([*(h.remove for h in handles), drain])


def mha_dropout_error(owner: str, module: nn.Module) -> CaptureError | None:
    """The ``CaptureError`` for an ``nn.MultiheadAttention`` in training mode with attention dropout (it returns
    its weights after dropout: rows do not sum to 1), or None when its weights are the probabilities."""
    p = float(getattr(module, "dropout", 0.0) or 0.0)
    if not (isinstance(module, nn.MultiheadAttention) and module.training and p > 0):
        return None
    return CaptureError(f"{owner} is in training mode with attention dropout {p}: nn.MultiheadAttention returns "
                        "its attention weights after dropout (rows do not sum to 1); call model.eval() before "
                        "capturing")


def refuse_mha_dropout(model: nn.Module, modules: list[tuple[str, nn.Module]], family: str) -> None:
    """``Family.prepare`` of the ``nn.MultiheadAttention`` families (torchvision, open_clip): raise ``CaptureError``
    when an attention module is in training mode with attention dropout (its weights would be the dropped-out ones,
    rows not summing to 1; the Hugging Face families refuse the same in their ``prepare``)."""
    for name, module in modules:
        error = mha_dropout_error(f"{type(model).__name__} ({family}, {name})", module)
        if error is not None:
            raise error


def probe_mha(module: nn.Module, emit: Emit) -> Undo:
    """``nn.MultiheadAttention``: called with ``need_weights=True`` and per-head weights for the duration; a call
    in training mode with attention dropout raises ``CaptureError`` (the weights would be the dropped-out ones). A
    ``forward`` set on the instance keeps running (called with those arguments; what it returns is read), never
    bypassed for the class's."""
    if not isinstance(module, nn.MultiheadAttention):
        raise UnsupportedModelError(f"probe_mha needs nn.MultiheadAttention, got {type(module).__name__}")
    original = type(module).forward
    own = vars(module).get("forward")  # a forward set on the instance: it is what the model runs, so it runs here

    def forward(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        error = mha_dropout_error(type(module).__name__, module)
        if error is not None:
            raise error
        kwargs["need_weights"] = True
        kwargs["average_attn_weights"] = False
        out, weights = own(*args, **kwargs) if own is not None else original(module, *args, **kwargs)
        if not isinstance(weights, torch.Tensor):
            raise CaptureError(
                f"{type(module).__name__}: the forward set on this instance returned no attention weights when "
                "called with need_weights=True, average_attn_weights=False, so vitviz cannot read what it computes; "
                "pass those arguments on to nn.MultiheadAttention.forward, or analyse the module without its own "
                "forward"
            )
        emit(weights)
        return out, weights

    return set_attr(module, "forward", forward)


def probe_latent_pool(pool: nn.Module, queries: str, emit: Emit) -> Undo:
    """timm ``AttentionPoolLatent``: each call emits its attention ``(B, N')`` (``query_mean``), recomputed as
    ``softmax(q k^T * scale)`` from the ``q`` and ``k`` its ``q_norm`` and ``k_norm`` return (the fused kernel keeps
    running); returns the undo. A call with an ``attn_mask`` raises ``CaptureError``."""
    seen: dict[str, torch.Tensor] = {}

    def after(module: nn.Module, args: Any, kwargs: Any, _out: Any) -> None:
        if kwargs.get("attn_mask") is not None or len(args) > 1:
            raise CaptureError(f"{type(module).__name__}: called with an attention mask; vitviz reads the pool's "
                               "attention only without one")
        q, k = seen.pop("q"), seen.pop("k")
        dtype = torch.promote_types(q.dtype, torch.float32)
        logits = (q.to(dtype) * module.scale) @ k.to(dtype).transpose(-2, -1)
        emit(query_mean(torch.softmax(logits, dim=-1), queries))

    handles = [pool.q_norm.register_forward_hook(lambda _m, _i, out: seen.__setitem__("q", out)),
               pool.k_norm.register_forward_hook(lambda _m, _i, out: seen.__setitem__("k", out)),
               pool.register_forward_hook(after, with_kwargs=True)]

    def undo() -> None:
        for h in handles:
            h.remove()

    return undo


def probe_mha_pool(mha: nn.Module, queries: str, emit: Emit) -> Undo:
    """An attention pool's ``nn.MultiheadAttention`` (Hugging Face SigLIP's head, open_clip's ``AttentionalPooler``):
    its per-head weights ``(B, H, L, N')`` read with ``need_weights=True`` (``probes.probe_mha``), emitted as
    ``query_mean``; returns the undo."""
    return probe_mha(mha, lambda w: emit(query_mean(w, queries)))
