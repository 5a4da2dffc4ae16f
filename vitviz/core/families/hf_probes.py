"""The probes of the Hugging Face families: eager weights (``probe_hf``), and the stream probe (``probe_hf_stream``:
SDPA or flash attention kept, the maps recomputed from q and k).

Every Hugging Face vision transformer vitviz reads (ViT, DeiT, BEiT, DINOv2, CLIP, SigLIP, AIMv2, ViTMAE, ...; not
data2vec vision, below) computes its attention through transformers' attention interface: the module calls
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)`` with
``(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)``, query and key ``(B, H, N, d)``
after any normalisation, the mask already holding every additive bias (BEiT's relative position bias). Under
``capture_attention(heads="stream")`` the config the attention modules read is switched, for the capture only, to
an implementation vitviz registers under the name ``"vitviz_stream"`` (``transformers.AttentionInterface.register``:
the name is added once, nothing of transformers is replaced). For each call it

1. runs the implementation the model had (``"sdpa"`` by default, or a flash one): the forward's output is the
   plain forward's, bit for bit;
2. hands the capture a ``HeadMaps`` recomputed from that ``query``, ``key``, ``scaling`` and mask
   (``stream.recomputed_heads``), with SDPA's reading of the mask and of ``is_causal`` (the call's, else the
   module's; only without a mask); on CUDA its ``fuse`` and ``distance_sums`` run the Triton head-map kernels.
   Where ``kernels.forward_lse`` is on for the call (``forward_lse.enabled(query, B * H * N * N)``: by default a
   float32 CUDA ``query`` outside autocast, and a half-type one from ``forward_lse.HALF_MIN_SCORES`` scores), a
   ``"sdpa"`` call without a mask runs under ``forward_lse.ForwardLSE``: its one SDPA call is answered by the op
   that also returns the row log-sum-exp, which, once ``forward_lse.checked`` has accepted it, spares ``fuse``'s
   kernel its first pass.

It runs the model file's own ``eager_attention_forward`` instead (and hands on its weights) where recomputing does
not pay or does not apply: small maps with the kernels off (``stream.EXPLICIT_BELOW_BYTES``), grouped key heads,
``position_bias``, ``softcap`` or a cache in the call; and where a ``heads="full"`` capture of the same module is
open at the same time (``probe_hf`` registers here for the weights).

Captures may close in any order: the probes on one config are counted (``_use``), and the config reads
``"vitviz_stream"`` while a stream probe is installed, ``"eager"`` while only ``probe_hf`` probes are (a full capture
left open after the stream capture it was opened in has closed), and its own implementation again, exactly as it
was, once the last probe is gone.

A model whose implementation is already ``eager`` gets no stream probe: its eager weights are wrapped as they come.

data2vec vision still has the older layout (its attention module computes the softmax itself and returns the
weights when called with ``output_attentions=True``; no attention interface): ``probe_hf_per_call`` reads it, and
``probe_hf_per_call_stream`` recomputes its maps beside its SDPA forward.
"""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import vitviz.core.families.stream as stream
from vitviz.core.families.base import Emit, HeadMaps, Probe, Undo, chain_undos, held_attr
from vitviz.core.kernels import forward_lse
from vitviz.errors import CaptureError, UnsupportedModelError

__all__ = ["NAME", "active", "per_call_stream_probe_for", "probe_hf", "probe_hf_per_call", "probe_hf_per_call_stream",
           "probe_hf_stream", "stream_probe_for", "want_weights"]

NAME = "vitviz_stream"
_listeners: weakref.WeakKeyDictionary[nn.Module, list[Emit]] = weakref.WeakKeyDictionary()
_weights: weakref.WeakKeyDictionary[nn.Module, list[object]] = weakref.WeakKeyDictionary()
_original: dict[int, str] = {}  # id(config) -> the implementation it had before the switch, while NAME is on
_users: dict[int, dict[str, Any]] = {}  # id(config) -> the probes using it and the implementation they set


def config_attn_implementation(config: Any, name: str) -> Undo:
    """Switch a Hugging Face config to the attention implementation ``name``; the undo restores it."""
    key = "_attn_implementation_internal" if "_attn_implementation_internal" in vars(config) else None
    if key is not None:
        old = vars(config)[key]
        vars(config)[key] = name
        return lambda: vars(config).__setitem__(key, old)
    if getattr(config, "_attn_implementation", "eager") != name:
        old_impl = config._attn_implementation
        config._attn_implementation = name
        return lambda: setattr(config, "_attn_implementation", old_impl)
    return lambda: None


def _interface() -> Any:
    """transformers' ``ALL_ATTENTION_FUNCTIONS``, with vitviz's implementation registered under ``NAME``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    if NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, _attention)
    return ALL_ATTENTION_FUNCTIONS


def _eager(module: nn.Module) -> Callable[..., Any] | None:
    """The model file's own ``eager_attention_forward`` (the default its attention modules pass), or None."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if callable(fn) else None


def active(config: Any) -> bool:
    """Whether vitviz's stream implementation is switched on for ``config`` now."""
    return id(config) in _original


def stream_probe_for(module: nn.Module) -> Probe | None:
    """``probe_hf_stream`` for an attention module that calls transformers' attention interface with a fused
    implementation (SDPA, flash); None for an eager one (its weights are read as they are) or an unknown layout."""
    config = getattr(module, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if not isinstance(impl, str) or impl == "eager" or _eager(module) is None:
        return None
    if impl != NAME and impl not in _interface():
        return None
    return probe_hf_stream


def _use(config: Any, kind: str) -> Undo:
    """Count one probe of ``kind`` (``"full"``: ``probe_hf``, needs weights; ``"stream"``: ``probe_hf_stream``) on
    ``config``; the undo uncounts it (once). The config's attention implementation follows the counts, so captures
    may close in any order: ``NAME`` while a stream probe is installed (it hands full probes eager weights through
    ``want_weights``), else ``eager`` while a full probe is, else the implementation the model had, restored
    exactly when the last probe goes."""
    key = id(config)
    state = _users.get(key)
    if state is None:
        state = _users[key] = {"config": config, "original": config._attn_implementation, "full": 0, "stream": 0,
                               "now": None, "undo": None}
    state[kind] += 1
    _follow(state)
    done = False

    def undo() -> None:
        nonlocal done
        if not done:
            done = True
            state[kind] -= 1
            _follow(state)

    return undo


def _follow(state: dict[str, Any]) -> None:
    """Set the config's implementation to what its counts ask for (see ``_use``)."""
    want = NAME if state["stream"] else "eager" if state["full"] else None
    if want == state["now"]:
        return
    config, key = state["config"], id(state["config"])
    if state["undo"] is not None:
        state["undo"]()  # back to the model's own implementation before any other
    state["now"], state["undo"] = want, None
    _original.pop(key, None)
    if want is None:
        _users.pop(key, None)
        return
    if want == NAME:
        _interface()
        _original[key] = state["original"]
    state["undo"] = config_attn_implementation(config, want)


def _register(registry: weakref.WeakKeyDictionary, module: nn.Module, value: Any) -> Undo:
    """Add ``value`` to ``module``'s entries in ``registry``; the undo removes that one entry (once)."""
    registry.setdefault(module, []).append(value)

    def undo() -> None:
        entries = [e for e in registry.get(module, []) if e is not value]
        if entries:
            registry[module] = entries
        else:
            registry.pop(module, None)

    return undo


def probe_hf_stream(module: nn.Module, emit: Emit) -> Undo:
    """Hugging Face attention under ``heads="stream"``: emits a ``HeadMaps`` per call (see the module docstring)."""
    undos = [_use(module.config, "stream"), _register(_listeners, module, emit)]
    return chain_undos(undos)


def probe_hf(module: nn.Module, emit: Emit) -> Undo:
    """Hugging Face attention: the config switched to ``eager`` for the capture, the returned weights read. While
    a ``heads="stream"`` capture keeps the config on vitviz's stream implementation (below), that implementation
    hands this module eager weights instead; when the last stream probe goes first, the config turns ``eager``
    (one config serves every layer: counted per probe, ``_use``, restored when the last probe goes)."""
    config = getattr(module, "config", None)
    undos: list[Undo] = [want_weights(module)]
    if config is not None:
        undos.append(_use(config, "full"))

    def hook(_m: nn.Module, _inputs: Any, out: Any) -> None:
        weights = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        if weights is None:
            raise UnsupportedModelError(
                f"{type(module).__name__} returned no attention weights even with the eager implementation; "
                "this transformers version is not supported (please report it)"
            )
        emit(weights)

    undos.append(module.register_forward_hook(hook).remove)
    return chain_undos(undos)


def _eager_per_call(module: nn.Module) -> Callable[..., Any]:
    """The ``forward`` of the eager class of an attention module of the older layout (data2vec vision): the first
    class in its MRO, from the same model file, that defines ``forward(hidden_states, output_attentions, ...)`` and is
    not an SDPA one."""
    cls = type(module)
    own = vars(module).get("forward")
    if own is not None and not getattr(own, "__vitviz_probe__", False):
        raise UnsupportedModelError(
            f"{cls.__name__} has a forward of its own set on the instance; vitviz reads this attention layout by "
            "running its class's eager forward (or recomputing beside its SDPA forward), which would bypass it and "
            "read maps it does not compute; analyse the module without the forward set on it (del module.forward)"
        )
    eager = next((c for c in cls.__mro__ if "forward" in vars(c) and "Sdpa" not in c.__name__
                  and c.__module__ == cls.__module__), None)
    params = list(pyinspect.signature(eager.forward).parameters)[1:3] if eager is not None else []
    if params != ["hidden_states", "output_attentions"]:
        raise UnsupportedModelError(f"{cls.__name__}: no eager forward(hidden_states, output_attentions, ...) in its "
                                    "class hierarchy; this transformers version is not supported (please report it)")
    return eager.forward


def _weights_of(module: nn.Module, out: Any) -> torch.Tensor:
    if not isinstance(out, tuple) or len(out) < 2 or out[1] is None:
        raise UnsupportedModelError(f"{type(module).__name__} returned no attention weights from its eager forward; "
                                    "this transformers version is not supported (please report it)")
    return out[1]


def probe_hf_per_call(module: nn.Module, emit: Emit) -> Undo:
    """Hugging Face attention of the older layout (data2vec vision): the self-attention module takes
    ``output_attentions`` as its second argument and returns ``(context, probs)`` when it is true; its SDPA subclass
    (``...SdpaSelfAttention``, chosen when the model is built) returns no weights. For the capture the instance's
    ``forward`` runs its eager class's ``forward`` with ``output_attentions=True``, hands ``probs`` to ``emit`` and
    returns what the caller asked for (``_per_call_forward``, shared with ``probe_hf_per_call_stream``)."""
    _eager_per_call(module)  # refuses a forward of the user's set on the instance
    return _listen_per_call(module, "full", emit)


def per_call_stream_probe_for(module: nn.Module) -> Probe | None:
    """``probe_hf_per_call_stream`` for an SDPA attention module of the older layout; None for an eager one (its
    weights are read per call, as they are)."""
    return probe_hf_per_call_stream if "Sdpa" in type(module).__name__ else None


def probe_hf_per_call_stream(module: nn.Module, emit: Emit) -> Undo:
    """data2vec vision's SDPA self-attention under ``heads="stream"``: its own ``forward`` runs (the output is the
    plain forward's, bit for bit) and the maps are recomputed (``stream.recomputed_heads``; the Triton kernels on
    CUDA) from the outputs of its ``query`` and ``key`` projections, with the scale ``1 / sqrt(head size)`` and the
    bias it hands SDPA: its own ``relative_position_bias`` module's output plus the shared bias it is called with.
    Small maps with the kernels off (``stream.explicit_is_cheaper``), calls that ask for the weights, and calls
    while a ``heads="full"`` capture of the module is open (``probe_hf_per_call``) run the eager ``forward`` instead
    and hand on its weights."""
    _eager_per_call(module)
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str) -> Callable[..., None]:
        # cloned: the SDPA forward adds the shared bias to its own in place
        return lambda _m, _i, out: seen.__setitem__(key, out.detach().clone() if key == "bias" else out.detach())

    parts = [("q", module.query), ("k", module.key)]
    if getattr(module, "has_relative_position_bias", False):
        parts.append(("bias", module.relative_position_bias))
    undos: list[Undo] = [m.register_forward_hook(keep(key)).remove for key, m in parts]
    undos.append(_listen_per_call(module, "stream", (emit, seen)))
    return chain_undos(undos)


# data2vec vision's attention modules -> {"full": [emit], "stream": [(emit, seen)]}: the probes reading each, all
# served by one forward set on the instance (``_per_call_forward``) while any is installed
_per_call: weakref.WeakKeyDictionary[nn.Module, dict[str, list[Any]]] = weakref.WeakKeyDictionary()


def _listen_per_call(module: nn.Module, kind: str, entry: Any) -> Undo:
    """Add ``entry`` to the ``kind`` probes of ``module`` and hold ``_per_call_forward`` on the instance; the undo
    removes that one entry and releases the hold. The forward is held (``held_attr``), not set by each probe:
    captures of both kinds open on the module may close in any order, and the instance comes back as it was when
    the last probe goes (each probe setting its own forward left the other's on the model when the first one
    opened closed first, and the forward set last ran alone, so the capture opened first saw no pass)."""
    listeners = _per_call.setdefault(module, {"full": [], "stream": []})
    listeners[kind].append(entry)

    def unlisten() -> None:
        now = _per_call.get(module)
        if now is None:
            return
        now[kind] = [e for e in now[kind] if e is not entry]
        if not now["full"] and not now["stream"]:
            _per_call.pop(module, None)

    return chain_undos([unlisten, held_attr(module, "forward", _per_call_forward(module))])


def _per_call_forward(module: nn.Module) -> Callable[..., tuple]:
    """The ``forward`` set on a data2vec vision attention instance while a probe reads it: the eager class's
    ``forward`` with ``output_attentions=True`` where a ``heads="full"`` probe is installed, the call asks for the
    weights or recomputing does not pay (its weights to every probe); else, for the stream probes of an SDPA
    module, its own ``forward`` and the maps recomputed from its ``q`` and ``k`` (``probe_hf_per_call_stream``)."""
    eager, own = _eager_per_call(module), type(module).forward
    sdpa = per_call_stream_probe_for(module) is not None
    h, d = int(module.num_attention_heads), int(module.attention_head_size)

    def call(hidden_states: torch.Tensor, output_attentions: bool = False,
             relative_position_bias: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> tuple:
        listeners = _per_call.get(module, {"full": [], "stream": []})
        full, streams = list(listeners["full"]), list(listeners["stream"])
        b, n, _ = hidden_states.shape
        kernel = stream.use_kernel_for(hidden_states.new_empty(0, d))
        if full or not sdpa or output_attentions or stream.explicit_is_cheaper(b, h, n, kernel):
            out = eager(module, hidden_states, True, relative_position_bias, *args, **kwargs)
            if full or streams:
                weights = _weights_of(module, out)
                for emit in full:
                    emit(weights)
                maps = HeadMaps.of(weights.detach()) if streams else None
                for emit, seen in streams:
                    seen.clear()
                    emit(maps)
            return out if output_attentions else (out[0], *out[2:])
        for _emit, seen in streams:
            seen.clear()
        out = own(module, hidden_states, output_attentions, relative_position_bias, *args, **kwargs)
        for emit, seen in streams:
            q, k = (seen.pop(key).view(b, n, h, d).transpose(1, 2) for key in ("q", "k"))
            biases = [t for t in (seen.pop("bias", None), relative_position_bias) if t is not None]
            mask = None if not biases else biases[0].detach() if len(biases) == 1 else biases[0] + biases[1].detach()
            emit(stream.recomputed_heads(q, k, d ** -0.5, lambda _scores, m=mask: m, kernel=kernel, attn_mask=mask))
        return out

    call.__vitviz_probe__ = True  # type: ignore[attr-defined]  # vitviz's own: _eager_per_call lets it through
    return call


def want_weights(module: nn.Module) -> Undo:
    """While the stream implementation serves ``module``'s config, make it return eager weights (for ``probe_hf``,
    a ``heads="full"`` capture opened inside a stream capture)."""
    return _register(_weights, module, object())


def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention implementation registered as ``NAME`` (see the module docstring)."""
    functions = _interface()
    eager = _eager(module)
    original = _original.get(id(getattr(module, "config", None)), "sdpa")
    listeners = list(_listeners.get(module, ()))
    weights = bool(_weights.get(module))
    if not listeners and not weights:  # a layer this capture does not read
        return functions.get_interface(original, eager)(module, query, key, value, attention_mask, **kwargs)
    b, h, n, _ = query.shape
    kernel = stream.use_kernel_for(query)
    plain = (key.shape == query.shape and all(kwargs.get(k) is None for k in ("position_bias", "softcap", "cache"))
             and original != "eager")
    if weights or not plain or stream.explicit_is_cheaper(b, h, n, kernel):
        if eager is None:
            raise CaptureError(f"{type(module).__name__}: its model file has no eager_attention_forward, so vitviz "
                               "cannot read its attention weights")
        out, w = eager(module, query, key, value, attention_mask, **kwargs)
        maps = HeadMaps.of(w.detach())
        for emit in listeners:
            emit(maps)
        return out, (w if weights else None)
    run = functions.get_interface(original, eager)
    recorder = None
    if kernel and original == "sdpa" and attention_mask is None and forward_lse.enabled(query, b * h * n * n):
        recorder = forward_lse.ForwardLSE()  # answers its SDPA call, keeping the row log-sum-exp
    with recorder if recorder is not None else contextlib.nullcontext():
        out, _ = run(module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling")
    scaling = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)  # as transformers' SDPA reads it
    causal = n > 1 and attention_mask is None and causal
    mask = attention_mask.detach() if attention_mask is not None else None
    query, key = query.detach(), key.detach()
    lse = None
    if recorder is not None and recorder.calls == 1:
        lse = forward_lse.checked(recorder.lse, query, key, scaling, causal, owner=module, config=recorder.config)
    maps = stream.recomputed_heads(query, key, scaling,
                                   lambda scores: stream.sdpa_bias(n, scores.dtype, scores.device, mask, causal),
                                   kernel=kernel, attn_mask=mask, is_causal=causal, lse=lse)
    for emit in listeners:
        emit(maps)
    return out, None
