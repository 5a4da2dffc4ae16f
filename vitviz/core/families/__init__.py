"""Model families vitviz reads, and the lookup from a model to its family.

Lookup order: a description registered for this model instance with ``vitviz.describe``, then families
registered with ``register_family`` (newest first), then timm, torchvision, Hugging Face (ViT, ViTMSN, I-JEPA, DeiT,
BEiT, data2vec vision, DINOv2, DINOv2 with registers, DINOv3, CLIP vision and the towers built from its code, SigLIP
vision, AIMv2 vision, ViTMAE; other image models refused), open_clip vision towers and the tutorial layout.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

from torch import nn

from vitviz.core.contexts import submodules
from vitviz.core.families.base import Family, Layout, shared_prepare
from vitviz.core.families.custom import LIBRARIES, CustomFamily, TutorialFamily
from vitviz.core.families.hf_aimv2 import HFAimv2Family
from vitviz.core.families.hf_base import HFUnsupportedFamily
from vitviz.core.families.hf_beit import HFBeitFamily, HFData2VecVisionFamily
from vitviz.core.families.hf_clip import HFCLIPFamily
from vitviz.core.families.hf_deit import HFDeiTFamily
from vitviz.core.families.hf_dinov2 import HFDinov2Family, HFDinov2RegistersFamily
from vitviz.core.families.hf_dinov3 import HFDinov3Family
from vitviz.core.families.hf_siglip import HFSiglipFamily
from vitviz.core.families.hf_vit import HFIJepaFamily, HFViTMSNFamily, HuggingFaceFamily
from vitviz.core.families.hf_vit_mae import HFViTMAEFamily
from vitviz.core.families.open_clip_vit import OpenCLIPFamily
from vitviz.core.families.timm_naflex import NaFlexVitFamily
from vitviz.core.families.timm_vit import TimmFamily
from vitviz.core.families.torchvision_vit import TorchvisionFamily
from vitviz.errors import InputTypeError, NotAViTError, UnsupportedModelError, VitvizError

__all__ = ["Family", "Layout", "NotAViTError", "VitvizError", "CustomFamily", "describe", "family_of",
           "register_family"]

# Hugging Face: one family per model type (docs/families.md); any other transformers model with an image config
# is refused by HFUnsupportedFamily with the reason, never misread.
HF_FAMILIES: list[Family] = [HuggingFaceFamily(), HFViTMSNFamily(), HFIJepaFamily(), HFDeiTFamily(), HFBeitFamily(),
                             HFData2VecVisionFamily(), HFDinov2Family(), HFDinov2RegistersFamily(), HFDinov3Family(),
                             HFCLIPFamily(), HFSiglipFamily(), HFAimv2Family(), HFViTMAEFamily()]
_FAMILIES: list[Family] = [TimmFamily(), NaFlexVitFamily(), TorchvisionFamily(), *HF_FAMILIES, HFUnsupportedFamily(), OpenCLIPFamily(),
                           TutorialFamily()]
_DESCRIBED: weakref.WeakKeyDictionary[nn.Module, Family] = weakref.WeakKeyDictionary()


def register_family(family: Family) -> None:
    """Teach vitviz a new kind of ViT (checked before the built-in families).

    Raises:
        InputTypeError: ``family`` is not a ``Family`` instance (a class is refused too: pass ``MyFamily()``).
    """
    if not isinstance(family, Family):
        fix = f"pass an instance, {family.__name__}()" if isinstance(family, type) and issubclass(family, Family) \
            else "pass an instance of a vitviz.core.families.Family subclass"
        raise InputTypeError(f"family={family!r} is not a Family; {fix}")
    _FAMILIES.insert(0, family)


def describe(model: nn.Module, **layout: Any) -> nn.Module:
    """Describe a custom ViT so every vitviz call can read it; returns ``model`` (unchanged) for chaining.

    Every layout argument is a keyword.

    Args:
        attention: fnmatch pattern of the attention modules' names, in layer order (default ``"blocks.*.attn"``).
        probe: how to read the probabilities: ``"attn_drop"`` (hook the dropout that receives the softmax
            output; fused paths are switched off), ``"qkv"`` (recompute ``softmax(q k^T * scale)`` from a ``qkv``
            Linear, after per-head ``q_norm`` / ``k_norm``; modules with rotary or relative-position attributes
            are refused), ``"mha"`` (``nn.MultiheadAttention``), ``"hf"``, ``"auto"`` (default) or a callable
            ``probe(module, emit) -> undo``.
        img_size, patch_size: input size and token stride in pixels (int or ``(h, w)``).
        prefix_tokens: names of the tokens before the patches, e.g. ``("cls", "dist")``, or their count.
        pos_embed: attribute path of the ``(1, L, D)`` absolute position embedding, or ``None``.
        pos_embed_kind: override the detected kind (``learned``, ``sincos``, ``none``, ``rotary``, ...).
        patch_proj: attribute path of the patch projection conv (default ``"patch_embed.proj"``).
        num_heads, embed_dim: when the modules do not say.
        readout: which of the last block's tokens the head reads, whose rows the row-reading explanations (rollout,
            flow, Chefer, gradient rollout, attention) read and as which the probes pool every block: default the
            class token (the first prefix token named ``"cls"``), else the mean of the patch tokens; ``"avg"``: the
            mean of the patch tokens (global average pooling beside a class token); prefix-token names, e.g.
            ``("cls", "dist")``: the mean of those tokens; or a ``vitviz.core.families.readout.Readout``.

    The description is kept in a weak registry beside the model, not on it: the model is not modified.
    """
    family = CustomFamily(**layout)
    family.layout(model)  # validate now, with a clear error, rather than at first use
    _DESCRIBED[model] = family
    return model


def _wrapper_refusal(model: nn.Module) -> str | None:
    """Why ``model`` is a wrapper vitviz does not read through, naming the model it wraps and how to pass that; or
    None. Each wraps a ViT vitviz reads, but runs it in a way the hooks cannot follow or hides its layout."""
    name = type(model).__name__
    wrapped = getattr(model, "_orig_mod", None)
    if name == "OptimizedModule" and isinstance(wrapped, nn.Module):
        return (f"{name} is torch.compile's wrapper of a {type(wrapped).__name__}: vitviz reads attention with hooks "
                "and module patches on the eager modules, which a compiled graph does not run; pass the model it "
                "wraps (model._orig_mod, the same weights) to vitviz")
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return (f"{name} is a wrapper of a {type(model.module).__name__} for training on several devices: it runs "
                "copies of the model (one per device, in threads) that vitviz's hooks would read out of order; pass "
                "the model it wraps (model.module, the same weights) to vitviz")
    tuner = next((c.__name__ for c in type(model).__mro__
                  if c.__module__.split(".")[0] == "peft" and c.__name__ in ("PeftModel", "BaseTuner")), None)
    if tuner is not None:
        inner, how = ((model.get_base_model(), "model.get_base_model()") if tuner == "PeftModel"
                      else (getattr(model, "model", None), "model.model"))
        return (f"{name} is peft's wrapper of a {type(inner).__name__}: pass the model it adapts ({how}, whose "
                "adapter layers vitviz reads as they compute), or the adapters merged into the weights "
                "(model.merge_and_unload(), which AttnLRP needs)")
    inner = getattr(model, "model", None)
    if type(model).__module__.startswith("timm.") and name == "FeatureGetterNet" and isinstance(inner, nn.Module):
        return (f"{name} is timm's features_only wrapper of a {type(inner).__name__}: it returns a list of feature "
                "maps, not the model's output; pass the model it wraps (model.model: its blocks up to the last "
                "feature taken, classifier head removed), or build the model without features_only")
    return None


_FULL_WEIGHTS = ("gather the full weights into the same model built without sharding and pass that: on every rank "
                 "sd = torch.distributed.checkpoint.state_dict.get_model_state_dict(model, options=StateDictOptions("
                 "full_state_dict=True, cpu_offload=True)) (a collective; rank 0 receives the full tensors), then on "
                 "rank 0 plain.load_state_dict(sd)")


@functools.cache
def _distributed_bases(cls: type) -> frozenset[str]:
    """The names of torch.distributed's classes among ``cls``'s bases, read from the class hierarchy (FSDP and
    DTensor are never imported for a model that does not use them); cached per class."""
    return frozenset(c.__name__ for c in cls.__mro__ if c.__module__.startswith("torch.distributed"))


def _is_distributed(obj: Any, names: tuple[str, ...]) -> bool:
    """Whether ``obj``'s class is, or derives from, one of torch.distributed's classes ``names``."""
    return not _distributed_bases(type(obj)).isdisjoint(names)


def _sharding_refusal(model: nn.Module) -> str | None:
    """Why ``model`` holds sharded weights vitviz cannot read, naming the sharded module or parameter and the fix;
    or None. FSDP (``FullyShardedDataParallel``, and ``fully_shard``'s in-place ``FSDP<Class>``) keeps each rank's
    shard of the weights and all-gathers them only inside its forward, a collective every rank must join; tensor
    parallelism (``DTensor`` parameters) leaves each rank only its share of the heads. Reading such a model on one
    rank would read shards (or hang in a collective), and its attention maps would miss the other ranks' heads."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):  # sharding needs a process group (FSDP, a device mesh)
        return None
    name = type(model).__name__
    fsdp = dtensor = None  # one pass over the modules' own tensors, names looked up only on a hit: family_of runs often
    for module in model.modules():
        if _is_distributed(module, ("FullyShardedDataParallel", "FSDPModule")):
            fsdp = module
            break
        tensor = next((k for k, t in (*module._parameters.items(), *module._buffers.items())
                       if t is not None and _is_distributed(t, ("DTensor",))), None)
        if tensor is not None:
            dtensor = (module, tensor)
            break
    names = {id(m): n for n, m in model.named_modules()} if fsdp is not None or dtensor is not None else {}
    if fsdp is not None:
        fsdp1 = _is_distributed(fsdp, ("FullyShardedDataParallel",))
        inner = (type(fsdp.module) if fsdp1 else
                 next(c for c in type(fsdp).__mro__ if not c.__module__.startswith("torch.distributed")))
        kind = "FullyShardedDataParallel" if fsdp1 else "fully_shard"
        at = f"its submodule {names[id(fsdp)]!r}" if names[id(fsdp)] else "the model"
        return (f"{name}: {at} is sharded with FSDP ({kind}, over a {inner.__name__}): each rank holds a "
                "shard of the weights, gathered only inside the forward, a collective every rank must join; "
                "vitviz reads weights outside the forward (position embeddings, filters, AttnLRP's rules) and "
                f"runs forwards on the rank that calls it, so it would read shards or wait forever; {_FULL_WEIGHTS}")
    if dtensor is not None:
        where = ".".join(n for n in (names[id(dtensor[0])], dtensor[1]) if n)
        return (f"{name}: {where!r} is a DTensor (sharded over a device mesh, as tensor parallelism leaves it): "
                "each rank computes only its share of the heads and holds only its share of the weights, so a "
                f"capture on one rank would miss the other ranks' heads; {_FULL_WEIGHTS}")
    return None


@contextlib.contextmanager
def prepared(model: nn.Module) -> Iterator[None]:
    """``model`` set up by its family for the block (``Family.prepare``), undone on the way out, also when the block
    raises: a Hugging Face ViTMAE unmasked and in patch order (it masks 75% of its patches at random on every call
    otherwise), an image-text model's ``model(images)`` refused naming its vision tower, training mode with attention
    dropout refused. Every analysis call runs in it (``core.calls.in_eval_mode``), so every forward pass an analysis
    makes, captured or not (a faithfulness pass, a baseline's gradients, a feature read), sees the model the
    attention methods see. A module vitviz does not read passes through: the analysis refuses it with its own
    error."""
    try:
        family = family_of(model)
    except VitvizError:
        family = None
    undo = shared_prepare(family, model) if family is not None else None
    try:
        yield
    finally:
        if undo is not None:
            undo()


def family_of(model: nn.Module) -> Family:
    """The family that reads ``model``; raises ``NotAViTError`` naming the model and the fix."""
    if not isinstance(model, nn.Module):
        raise NotAViTError(f"expected a torch.nn.Module ViT, got {type(model).__name__}")
    refusal = _wrapper_refusal(model) or _sharding_refusal(model)
    if refusal is not None:
        raise UnsupportedModelError(refusal)
    # getattr: nn.Module.__init__ puts the attribute in every instance's dict (a module unpickled from an older
    # torch lacks it, and reads None)
    compiled = next((m for m in submodules(model) if getattr(m, "_compiled_call_impl", None) is not None), None)
    if compiled is not None:  # named only on a hit: family_of runs in every analysis call
        compiled = next(name for name, m in model.named_modules() if m is compiled) or "the model"
        raise UnsupportedModelError(
            f"{type(model).__name__}: {compiled} was compiled in place (module.compile()); TorchDynamo reuses a "
            "graph compiled without vitviz's hooks, so the attention would not be read; analyse an uncompiled "
            "instance with the same weights (build the model again and load_state_dict(model.state_dict()))")
    if model in _DESCRIBED:
        return _DESCRIBED[model]
    for family in _FAMILIES:
        if family.match(model):
            return family
    library = type(model).__module__.split(".")[0]
    attention = next((type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__
                      or "Attn" in type(m).__name__), None)
    if library in LIBRARIES and attention is not None:
        raise UnsupportedModelError(
            f"{type(model).__name__} ({library}) has attention modules ({attention}) but none of vitviz's {library} "
            f"families recognises its layout in this version of {library} (they read each model from its own "
            "attributes and never fall back to guessing); upgrade the library, or describe the model with "
            "vitviz.describe(model, ...)"
        )
    raise NotAViTError(
        f"{type(model).__name__} is not a Vision Transformer vitviz recognises: it is neither a timm, torchvision "
        "nor Hugging Face ViT, and it lacks the tutorial layout (patch_embed.proj conv, pos_embed, blocks[i].attn "
        "with a qkv Linear). If it is a ViT, describe it once: vitviz.describe(model, attention='<pattern of the "
        "attention modules>', img_size=..., patch_size=..., prefix_tokens=('cls',))"
    )
