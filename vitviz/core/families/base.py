"""What vitviz needs to know about one kind of ViT, and the probes that read attention out of it.

A ``Family`` answers, for the models it ``match``es: where the attention modules are, how to read their
post-softmax probabilities (a *probe*), where the position embedding and the RGB patch projection live, and the
token layout. Probes are the only code that touches hooks or flags; each returns an ``undo`` callable that puts the
module back exactly as it was. ``Family.prepare(model)`` does the same for model-level set-up a capture needs
(ViTMAE runs unmasked; ``CLIPModel`` refuses an image batch in ``forward``); ``capture_attention`` undoes it on exit.

Probes emit ``(B, H, N, N)`` post-softmax probabilities. The generic ones live in
``vitviz.core.families.probes`` (``probe_attn_drop`` for timm-style modules, ``probe_qkv`` for hand-written ones,
``probe_mha`` for ``torch.nn.MultiheadAttention``); ``hf_probes.probe_hf`` reads Hugging Face attention modules
with the config on the eager implementation for the duration (SDPA and flash kernels return no weights).

Reductions that only need one head at a time (rollout, mean attention distance, dataset statistics) open the capture
with ``heads="stream"``: their ``on_layer`` then receives a ``HeadMaps``, which hands out each head's ``(B, N, N)``
map in turn. A family may give such captures a *stream probe* (``Family.stream_probe``) that leaves the model's own
fused attention running and recomputes the probabilities head by head from the module's ``q`` and ``k``
(``stream.recomputed_heads``; timm's ``Attention``, ``EvaAttention``, ``AttentionRope``, ``RelPosAttention``, BEiT
``Attention``, ``ParallelScalingBlock`` and differential attention: ``timm_probes.probe_timm_stream``; Hugging Face
attention on SDPA or flash: ``hf_probes.probe_hf_stream``); every other probe's maps are wrapped as they are
(``HeadMaps.of``).
"""

from __future__ import annotations

import fnmatch
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitviz.core.contexts import once_per_window
from vitviz.core.families.pooling import pool_tokens
from vitviz.core.families.readout import Readout, default_readout
from vitviz.core.families.token_drop import keep_token_hook, token_index
from vitviz.errors import CaptureError, InputError, NotImplementedInVitviz, UnsupportedModelError

Emit = Callable[[Any], None]
Undo = Callable[[], None]
Probe = Callable[[nn.Module, Emit], Undo]


class HeadMaps:
    """One layer's ``(B, H, N, N)`` attention, handed out one head at a time (``capture_attention(heads="stream")``).

    ``heads()`` yields ``(h, map_h)`` with ``map_h`` of shape ``(B, N, N)``; a map may live in a buffer that the next
    head overwrites, so use it (or copy it) before advancing. ``full()`` returns the ``(B, H, N, N)`` tensor.
    ``fuse(how)`` (head mean, max or min, ``(B, N, N)``) and ``distance_sums(distances, p)`` (each head's
    distance-weighted patch sums, ``(B, H, P)``) are what rollout and mean attention distance need; by default
    they fold the heads in turn, and a probe may supply faster ones (the stream probe's Triton kernels on CUDA,
    ``vitviz.core.kernels``) that give the same values.

    Args:
        shape: ``(B, H, N, N)``.
        dtype, device: of the maps handed out.
        head: ``head(h) -> (B, N, N)`` map of head ``h`` (called in order ``0 .. H-1``, once each per pass).
        full: ``full() -> (B, H, N, N)`` when there is a cheaper way than stacking the heads.
        fuse: ``fuse(how, dtype, out) -> (B, N, N)``, replacing the default of ``fuse``.
        distance_sums: ``distance_sums(distances, num_prefix_tokens) -> (weighted, weight)``, replacing the default.
    """

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device,
                 head: Callable[[int], torch.Tensor], full: Callable[[], torch.Tensor] | None = None,
                 fuse: Callable[..., torch.Tensor] | None = None,
                 distance_sums: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] | None = None,
                 ) -> None:
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.device = device
        self._head = head
        self._full = full
        self._fuse = fuse
        self._distance_sums = distance_sums

    @classmethod
    def of(cls, attn: torch.Tensor) -> HeadMaps:
        """Wrap a ``(B, H, N, N)`` tensor (heads are views of it)."""
        if attn.ndim != 4:
            raise InputError(f"expected attention of shape (B, H, N, N), got {tuple(attn.shape)}")
        return cls(tuple(attn.shape), attn.dtype, attn.device, lambda h: attn[:, h], lambda: attn)

    @property
    def num_heads(self) -> int:
        return self.shape[1]

    @property
    def ndim(self) -> int:
        return 4

    def heads(self) -> Iterator[tuple[int, torch.Tensor]]:
        for h in range(self.num_heads):
            yield h, self._head(h)

    def full(self) -> torch.Tensor:
        if self._full is not None:
            return self._full()
        return torch.stack([m.clone() for _, m in self.heads()], dim=1)

    def to(self, dtype: torch.dtype) -> HeadMaps:
        """The same maps cast to ``dtype`` as they are handed out."""
        if dtype == self.dtype:
            return self
        full = self._full
        return HeadMaps(tuple(self.shape), dtype, self.device, lambda h: self._head(h).to(dtype),
                        (lambda: full().to(dtype)) if full is not None else None, self._fuse, self._distance_sums)

    def fuse(self, how: str = "mean", dtype: torch.dtype = torch.float32,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """The heads fused into one ``(B, N, N)`` map of ``dtype``: their ``"mean"``, ``"max"`` or ``"min"``.

        ``out``: a ``(B, N, N)`` tensor of ``dtype`` to write into (returned).
        """
        folds = {"mean": torch.add, "max": torch.maximum, "min": torch.minimum}
        if how not in folds:
            raise InputError(f"how must be one of {tuple(folds)}, got {how!r}")
        if self._fuse is not None:
            return self._fuse(how, dtype, out)
        b, h, n, _ = self.shape
        acc = out if out is not None else torch.empty(b, n, n, dtype=dtype, device=self.device)
        for i, m in self.heads():
            if i == 0:
                acc.copy_(m)
            else:
                folds[how](acc, m.to(dtype), out=acc)
        return acc.mul_(1.0 / h) if how == "mean" else acc

    def distance_sums(self, distances: torch.Tensor, num_prefix_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's distance-weighted sums over the patch keys, per patch query (the ViT paper's mean attention
        distance, App. D.7, before renormalising; ``vitviz.analysis.distance``).

        With ``A`` the maps and ``p = num_prefix_tokens`` (prefix tokens have no position: neither queries nor keys):
        ``weighted[b, h, i] = sum_j A[b, h, p + i, p + j] * distances[i, j]`` and
        ``weight[b, h, i] = sum_j A[b, h, p + i, p + j]``.

        Args:
            distances: ``(P, P)`` pixels between patch centres, ``P = N - p``.
            num_prefix_tokens: ``p``.

        Returns:
            ``(weighted, weight)``, each ``(B, H, P)`` float32.
        """
        b, h, n, _ = self.shape
        p = num_prefix_tokens
        if tuple(distances.shape) != (n - p, n - p):
            raise InputError(f"distances must be (P, P) = ({n - p}, {n - p}) for N = {n} tokens and {p} prefix "
                             f"tokens; got {tuple(distances.shape)}")
        if self._distance_sums is not None:
            return self._distance_sums(distances, p)
        # one head at a time through one (B, P, P) buffer: a (B, H, P, P) temporary costs a fresh allocation (page
        # faults on CPU) and H times the memory; the sums are the same
        d = distances.to(device=self.device, dtype=torch.float32)
        weighted = torch.empty(b, h, n - p, device=self.device, dtype=torch.float32)
        weight = torch.empty(b, h, n - p, device=self.device, dtype=torch.float32)
        buf = torch.empty(b, n - p, n - p, device=self.device, dtype=torch.float32)
        for head, m in self.heads():
            a = m[:, p:, p:]
            torch.sum(a, dim=-1, dtype=torch.float32, out=weight[:, head])  # the patch keys' share of each row
            torch.mul(a, d, out=buf)
            torch.sum(buf, dim=-1, out=weighted[:, head])
        return weighted, weight

    def __repr__(self) -> str:
        return f"HeadMaps(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


@dataclass(frozen=True)
class Layout:
    """Token layout fields a family reads off a model (``inspect`` adds parameter counts and names)."""

    img_size: tuple[int, int]
    patch_size: tuple[int, int]  # token stride in input pixels
    grid_size: tuple[int, int]
    prefix_tokens: tuple[str, ...]  # e.g. ("cls",), ("cls", "dist"), ("cls", "reg", "reg", "reg", "reg")
    pos_embed_kind: str  # see ViTSpec.pos_embed_kind
    pos_embed_covers_prefix: bool
    depth: int
    num_heads: int
    embed_dim: int
    hybrid: bool = False
    dynamic_img_size: bool = False


class Family:
    """One kind of ViT. Subclasses override ``match`` and the layout accessors.

    A subclass's own ``attention_modules`` is computed once per ``walk_once`` window for one model
    (``contexts.once_per_window``): a call's set-up asks it some six times (``inspect``'s layout, maps and blocks, the
    capture), and it reads only the module tree, which the set-up never changes."""

    name = "base"
    probe: Probe

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("attention_modules")
        if own is not None and not hasattr(own, "__wrapped__"):
            cls.attention_modules = once_per_window(own)

    def match(self, model: nn.Module) -> bool:
        raise NotImplementedInVitviz

    def layout(self, model: nn.Module) -> Layout:
        raise NotImplementedInVitviz

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        raise NotImplementedInVitviz

    def attention_maps(self, model: nn.Module) -> list[str]:
        """Per attention module, what its captured map holds (``vitviz.core.families.timm_probes``); default all
        ``"softmax"`` (post-softmax probabilities, rows sum to 1)."""
        return ["softmax"] * len(self.attention_modules(model))

    def attention_blocks(self, model: nn.Module) -> list[int]:
        """Per attention module, the index of the residual block it sits in (parallel blocks hold several)."""
        return list(range(len(self.attention_modules(model))))

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        """The absolute position embedding ``(1, L, D)``: ``L = P`` or ``prefix + P``; ``None`` if there is none."""
        return None

    def pos_embed_at(self, model: nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
        """The position embedding the model itself adds to an input whose patch grid is ``grid``, laid out as
        ``pos_embed`` (prefix rows where it has them); ``None`` (the default) when the model resamples its table as
        timm does (``timm.layers.resample_abs_pos_embed``, which ``analysis.posembed.patch_pos_embed`` applies then).
        A family whose model makes its table for another grid its own way (another interpolation, a table built for
        the grid, row and column tables resampled apart) returns that table, so the similarity at another size is
        that of the table the model uses there."""
        return None

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        """The module that projects pixels (or, for hybrids, backbone features) to tokens."""
        return None

    def stem_conv(self, model: nn.Module) -> nn.Conv2d | None:
        """The first convolution that sees RGB pixels (the patch projection, or the hybrid backbone's stem)."""
        proj = self.patch_proj(model)
        return proj if isinstance(proj, nn.Conv2d) and proj.in_channels == 3 else None

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        """Component name -> parameter-name prefixes, for the per-component parameter table."""
        return {}

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        """Preprocessing (timm ``resolve_data_config`` keys) when the family knows it better than the defaults."""
        return None

    def stream_probe(self, module: nn.Module) -> Probe | None:
        """A probe that emits ``HeadMaps`` for ``capture_attention(heads="stream")``, or None (default): the
        regular ``probe``'s maps are then wrapped with ``HeadMaps.of``."""
        return None

    def prepare(self, model: nn.Module) -> Undo:
        """Model-level set-up for the duration of a capture (e.g. ViTMAE runs unmasked); returns its undo."""
        return lambda: None

    # ------------------------------------------------------------------ patch removal (vitviz.faithfulness)
    def token_drop_module(self, model: nn.Module) -> nn.Module | None:
        """Where patch tokens can be taken out of the sequence, or ``None`` (patches are then removed by filling
        their pixels).

        The module's output is the token sequence ``(B, N, D)`` (or a tuple starting with it) right after the
        position embedding is added: a token dropped there leaves every other token with its own position. A family
        returns it only when the model's output stays defined with every patch dropped: a class token or registers
        and a readout from the prefix tokens (not a mean over patch tokens, which is empty at 100% removed), and
        positions that do not depend on the sequence (absolute tables or a relative bias the family gathers; not
        rotary). ``token_drop_refusal`` says why not.
        """
        return None

    def token_drop_refusal(self, model: nn.Module) -> str:
        """Why ``token_drop_module`` is ``None`` for ``model`` (for error messages)."""
        return f"vitviz has no token-dropping point for {type(model).__name__} (family {self.name})"

    def drop_tokens(self, model: nn.Module, keep: torch.Tensor, num_prefix_tokens: int) -> Undo:
        """Until the undo is called, ``model`` sees only its prefix tokens and the patches ``keep``.

        Args:
            model: a model of this family whose ``token_drop_module`` is not ``None``.
            keep: ``(B, k)`` patch indices (0-based over the patches, row-major) kept per image, in sequence order.
            num_prefix_tokens: leading tokens always kept (``ViTSpec.num_prefix_tokens``).

        Returns:
            the undo (removes the hooks). Families with a relative position bias also gather the bias over the
            kept tokens, so each kept pair keeps the bias of its positions.
        """
        module = self.token_drop_module(model)
        if module is None:
            raise UnsupportedModelError(f"cannot drop tokens: {self.token_drop_refusal(model)}")
        return keep_token_hook(module, token_index(num_prefix_tokens, keep))

    def lrp_rules(self, model: nn.Module, rules: Any, emit: Emit) -> Undo:
        """Install AttnLRP's rules (``vitviz.core.families.lrp.LRPRules``) on ``model`` and hook the first block's
        input tokens (``emit`` receives them); returns the undo. Default: refused."""
        from vitviz.errors import UnsupportedModelError

        raise UnsupportedModelError(f"{type(model).__name__} ({self.name} family): vitviz has no AttnLRP rules for "
                                    "this family; use explain(method='chefer')")

    # -- representations (linear / k-NN probes) -------------------------------------------------------------------

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The residual blocks in depth order, each the module whose output is the token sequence after it.

        Default: for each attention module, its nearest ancestor that is an item of an ``nn.ModuleList`` or
        ``nn.Sequential`` (timm ``blocks.i``, Hugging Face ``encoder.layer.i``, torchvision
        ``encoder.layers.encoder_layer_i``, open_clip ``transformer.resblocks.i``); parallel branches of one block
        give that block once.
        """
        modules = dict(model.named_modules())
        real = {id(m): n for n, m in modules.items()}  # a family may name modules by index, not by attribute
        out: list[tuple[str, nn.Module]] = []
        for name, module in self.attention_modules(model):
            name = real.get(id(module), name)
            parts = name.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                parent = modules.get(".".join(parts[: cut - 1]), model) if cut > 1 else model
                if isinstance(parent, (nn.ModuleList, nn.Sequential)):
                    block = ".".join(parts[:cut])
                    if not out or out[-1][0] != block:
                        out.append((block, modules[block]))
                    break
            else:
                raise UnsupportedModelError(f"{type(model).__name__}: no block (item of a ModuleList/Sequential) holds the "
                                  f"attention module {name!r}; override Family.blocks for this family")
        return out

    def block_tokens(self, model: nn.Module, output: Any, batch: int) -> torch.Tensor:
        """A block's forward output as tokens ``(B, N, D)`` (the first item of a tuple; batch-first)."""
        if isinstance(output, (tuple, list)):
            output = output[0]
        if not isinstance(output, torch.Tensor) or output.ndim != 3 or output.shape[0] != batch:
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise UnsupportedModelError(f"{type(model).__name__}: a block returned {shape}, expected tokens ({batch}, N, D); "
                              "override Family.block_tokens for this family")
        return output

    def pooled_token(self, model: nn.Module, tokens: torch.Tensor, prefix_tokens: tuple[str, ...]) -> torch.Tensor:
        """One block's image representation ``(B, D)`` from its tokens ``(B, N, D)``, pooled as the model's readout
        pools its last block. This default: the class token when the model has one (the first prefix token), else
        the mean of the patch tokens (global average pooling). Families whose readout reduces over the tokens
        override it (``vitviz.core.families.pooling``: timm ``global_pool``, BEiT mean pooling, DINOv2's
        classifier, open_clip ``pool_type="avg"``). A readout that averages prefix tokens (DeiT-distilled: the class
        and distillation tokens, ``Readout`` from ``self.readout``) pools every block that way, as timm's
        ``forward_head(..., pre_logits=True)`` does: ``(x[:, 0] + x[:, 1]) / 2``; a readout of one token or of the
        patch mean (e.g. ``vitviz.describe(..., readout="avg")``) likewise. Other readouts (attention pools, a head
        on every token): the default above."""
        readout = self.readout(model, prefix_tokens)
        read = readout.prefix_parts
        if readout.how in ("token", "mean") and read is not None:
            return tokens[:, list(read)].mean(dim=1)  # one token, or the mean of prefix tokens
        if readout.how == "mean" and readout.patch_mean:
            return pool_tokens(tokens, "avg", len(prefix_tokens))
        return pool_tokens(tokens, "token" if prefix_tokens and prefix_tokens[0] == "cls" else "avg",
                           len(prefix_tokens))

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """Which last-block token rows the model's head reads (``vitviz.core.families.readout``). This default: the
        class token when the model has one, else the mean of the patch tokens; families whose head reads other
        tokens (average pooling, distillation heads, attention pools) override it."""
        return default_readout(prefix_tokens)

    def readout_attention(self, model: nn.Module, emit: Emit) -> Undo | None:
        """For an attention-pool readout read exactly (``Readout.pool_attention``): hook the pool so that each
        forward emits its attention over the tokens it pools, ``(B, N')`` (heads averaged over the queries the
        output keeps; the tokens of ``readout.parts[0]`` in sequence order); returns the undo. Default ``None``."""
        return None

    def pre_logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The representation the classifier reads ``(B, D)`` for images ``x`` ``(B, 3, H, W)``.

        timm: ``forward_head(forward_features(x), pre_logits=True)``. Otherwise the input of the model's linear
        classifier (``head``, ``heads``, ``classifier``) read with a forward pre-hook during ``model(x)``.
        """
        if hasattr(model, "forward_head") and hasattr(model, "forward_features"):
            return model.forward_head(model.forward_features(x), pre_logits=True)
        for attr in ("heads", "head", "classifier"):
            head = getattr(model, attr, None)
            if isinstance(head, nn.Module):
                return read_input_of(model, head, x)
        raise UnsupportedModelError(f"{type(model).__name__} has no forward_head and no head/heads/classifier module whose "
                          "input is the pre-logits representation; pass layer= to read a block's token instead")


def read_input_of(model: nn.Module, module: nn.Module, x: torch.Tensor, call: Callable[[], Any] | None = None
                  ) -> torch.Tensor:
    """The first positional input of ``module`` during ``model(x)`` (or ``call()``), read by a forward pre-hook.

    The hook stops the forward there (nothing after the module runs) and is removed, also when the call raises.
    """
    from vitviz.errors import ForwardStopped

    seen: list[torch.Tensor] = []

    def hook(_m: nn.Module, inputs: Any) -> None:
        seen.append(inputs[0])
        raise ForwardStopped

    handle = module.register_forward_pre_hook(hook)
    try:
        (call or (lambda: model(x)))()
    except ForwardStopped:
        pass
    finally:
        handle.remove()
    if not seen:
        raise CaptureError(f"{type(module).__name__} was not called during {type(model).__name__}'s forward")
    return seen[0]


def named_children_of(model: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """Modules whose names match the fnmatch ``prefix`` pattern, in registration order."""
    return [(n, m) for n, m in model.named_modules() if n and fnmatch.fnmatchcase(n, prefix)]


def chain_undos(undos: list[Undo]) -> Undo:
    """One undo that runs ``undos`` in reverse order (the last change undone first). Every one runs, also when an
    earlier one raises (a ``KeyboardInterrupt`` arriving while a capture ends): the first error is raised after the
    last undo, so no change is left on the model behind it."""
    def undo() -> None:
        error: BaseException | None = None
        for u in reversed(undos):
            try:
                u()
            except BaseException as exc:  # noqa: BLE001 (raised below, once every undo has run)
                error = error or exc
        if error is not None:
            raise error

    return undo


# model -> [open holders, the undo of its family's prepare]: an entry lives while a holder has it prepared
_PREPARED: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()
# (id(obj), name) -> [open holders, the undo of held_attr's change]: the undo holds obj, so its id is not reused
_HELD: dict[tuple[int, str], list[Any]] = {}
_PREPARED_LOCK = threading.RLock()


def _hold(registry: Any, key: Any, change: Callable[[], Undo]) -> Undo:
    """``change()`` for the first holder of ``key`` in ``registry`` only; its undo when the last holder releases.

    Returns:
        ``release()``, idempotent.
    """
    with _PREPARED_LOCK:
        entry = registry.get(key)
        if entry is None:
            entry = [0, change()]
            registry[key] = entry
        entry[0] += 1
    released = False

    def release() -> None:
        nonlocal released
        with _PREPARED_LOCK:
            if released:
                return
            released = True
            entry[0] -= 1
            if entry[0]:
                return
            if registry.get(key) is entry:
                del registry[key]
        entry[1]()

    return release


def shared_prepare(family: Family, model: nn.Module) -> Undo:
    """``family.prepare(model)`` for the first holder only (a capture, an analysis call, AttnLRP's rules); its undo
    when the last holder releases. Holders may nest, overlap and release in any order (two captures open at once,
    the first closed first): the model stays prepared while any holder is open and comes back exactly when the
    last one closes, where each holder's own undo, run in another order than it was made, would restore a state
    another holder had set (a wrapper left on the model, ViTMAE's mask ratio left at 0). State that another model
    shares (a config, a module of both) is changed with ``held_attr``.

    Returns:
        ``release()``, idempotent.
    """
    return _hold(_PREPARED, model, lambda: family.prepare(model))


def held_attr(obj: Any, name: str, value: Any) -> Undo:
    """``set_attr`` for state that two models share (ViTMAEForPreTraining and its ``.vit``: the config and the
    embeddings), each prepared by a holder of its own (``shared_prepare`` counts holders per model) that may
    release in any order: the first holder of ``(obj, name)`` sets ``value`` and the last release restores what the
    first found. ``value`` must mean the same for every holder (the same setting, or a wrapper doing the same).

    Returns:
        ``release()``, idempotent.
    """
    return _hold(_HELD, (id(obj), name), lambda: set_attr(obj, name, value))


def set_attr(obj: Any, name: str, value: Any) -> Undo:
    """Set an instance attribute; the returned undo restores the old instance value or removes it."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)

    def undo() -> None:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    return undo


# Linear classes besides nn.Linear whose forward is F.linear(x, weight, bias) (timm's: a cast under TorchScript only)
_PLAIN_LINEAR_CLASSES = ("timm.layers.linear.Linear",)


def plain_conv(module: Any) -> bool:
    """Whether ``module`` is an ``nn.Conv2d`` computing ``F.conv2d`` of its weights with explicit zero padding or
    ``"valid"`` (its class keeps ``nn.Conv2d.forward``; a parametrization's weight counts): a linear map a rule may
    read."""
    from torch.nn.utils import parametrize

    if not isinstance(module, nn.Conv2d) or module.padding_mode != "zeros" or module.padding == "same":
        return False
    return parametrize.type_before_parametrizations(module).forward is nn.Conv2d.forward


def plain_linear(module: Any) -> bool:
    """Whether ``module`` computes ``F.linear(x, module.weight, module.bias)``, so that a rule or a recomputation
    may read its weights in place of calling it: an ``nn.Linear`` whose class keeps ``nn.Linear.forward`` (with a
    parametrization's weight, which ``weight`` returns), or timm's ``Linear``. A subclass with a forward of its own
    (a LoRA layer written as an ``nn.Linear`` subclass, quantisation-aware training's fake-quantised weight) or a
    wrapper that only shares the name (peft's ``lora.Linear``) computes something its weights do not say."""
    from torch.nn.utils import parametrize

    if not isinstance(module, nn.Linear):
        return False
    cls = parametrize.type_before_parametrizations(module)
    return cls.forward is nn.Linear.forward or f"{cls.__module__}.{cls.__qualname__}" in _PLAIN_LINEAR_CLASSES
