"""``vitviz.inspect(model) -> ViTSpec``: the token layout every later step reads.

Nothing in vitviz guesses a grid from ``sqrt(N)`` or assumes one class token: the grid, the token stride, the
prefix tokens (class, distillation, registers) and whether the position embedding covers them are read off the
model by its family (``vitviz.core.families``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

from vitviz.core.contexts import inspect_memo, named_submodules, open_walk_window
from vitviz.core.families import Family, family_of
from vitviz.core.families.readout import Readout, default_readout
from vitviz.errors import UnsupportedModelError

_KIND_REASON = {
    "talking-heads": "CaiT's talking-heads weights are mixed across heads after the softmax: signed, rows do not "
                     "sum to 1, so they are not a flow of attention between tokens",
    "differential": "differential attention subtracts two softmax maps: signed, rows sum to 1 - lambda, so it is "
                    "not a distribution over tokens",
    "class-attention": "only the class token attends in these layers; patch queries have no attention to measure",
    "softmax": "",
}

COMPONENT_ORDER = ("patch_embed", "pos_embed", "prefix_tokens", "blocks", "norm", "head", "other")


@dataclass(frozen=True, repr=False)
class ViTSpec:
    """Token layout and size of a ViT.

    Attributes:
        name: model name (timm architecture, or the class name).
        family: ``timm``, ``torchvision``, ``huggingface``, ``open_clip``, ``tutorial`` or ``custom``.
        img_size: ``(H, W)`` input size in pixels the model was built for.
        patch_size: ``(sh, sw)`` pixels per token along h and w, i.e. the token stride; for hybrids the backbone
            reduction times the patch size.
        grid_size: ``(gh, gw)`` patch tokens along h and w.
        prefix_tokens: names of the tokens before the patch tokens, in order (``"cls"``, ``"dist"``, ``"reg"``).
        pos_embed_kind: what the position information is, read from what the table is (never from
            ``requires_grad``; see ``vitviz.core.families.pos_kind``): ``learned`` (an ``nn.Parameter`` table),
            ``sincos`` (a fixed 2-D sine-cosine table, buffer or parameter), ``fixed`` (a non-parameter table of
            another form), ``learned-2d`` (generated from row and column tables, concatenated),
            ``learned-factorized`` (row plus column tables, NaFlexVit ``factorized``), ``rotary`` (rotary
            embeddings, no absolute table), ``relative-bias`` (a relative position bias added to the attention
            logits, BEiT and timm ``vit_relpos_*``; no absolute table) or ``none``; parts joined by ``+``
            when a model has both (BEiT with an absolute table, timm or Hugging Face: ``learned+relative-bias``;
            EVA-02: ``learned+rotary``).
        pos_embed_covers_prefix: whether the absolute position embedding has rows for the prefix tokens.
        depth, num_heads, embed_dim: transformer size.
        hybrid: the patch embedding sits on a CNN backbone.
        dynamic_img_size: the model accepts other input sizes (timm ``dynamic_img_size=True``).
        params: parameter count per component (``patch_embed``, ``pos_embed``, ``prefix_tokens``, ``blocks``,
            ``norm``, ``head``, ``other``) and ``total``.
        attention_modules: names of the attention modules, in layer order (parallel blocks: one per branch,
            e.g. ``blocks.3.attns.0.attn`` and ``blocks.3.attns.1.attn``).
        attention_maps: per attention module, what its captured ``(B, H, N, N)`` map holds: ``softmax``
            (probabilities, rows sum to 1), ``talking-heads`` (CaiT: post-mixing, signed, rows sum to a per-head
            constant), ``class-attention`` (CaiT: only the class row attends; other rows identity) or
            ``differential`` (``S1 - lambda S2``, signed, rows sum to ``1 - lambda``); see
            ``vitviz.core.families.timm_probes``.
        attention_blocks: per attention module, the index of its residual block (equal indices: parallel
            branches whose outputs the residual adds).
        readout: which last-block token rows the model's head reads (``vitviz.core.families.readout.Readout``):
            the class token, the mean of the class and distillation tokens (DeiT-distilled), the mean of the patch
            tokens (average pooling), ``[class, patch mean]``, or an attention pool (no token row is the output).
            The row-reading explanations read these rows by default (``Readout.weights``). Default (a spec built
            by hand): the class token when there is one, else the patch mean.
    """

    name: str
    family: str
    img_size: tuple[int, int]
    patch_size: tuple[int, int]
    grid_size: tuple[int, int]
    prefix_tokens: tuple[str, ...]
    pos_embed_kind: str
    pos_embed_covers_prefix: bool
    depth: int
    num_heads: int
    embed_dim: int
    hybrid: bool = False
    dynamic_img_size: bool = False
    params: dict[str, int] = field(default_factory=dict)
    attention_modules: tuple[str, ...] = ()
    attention_maps: tuple[str, ...] = ()
    attention_blocks: tuple[int, ...] = ()
    readout: Readout | None = None

    def __post_init__(self) -> None:
        if self.readout is None:
            object.__setattr__(self, "readout", default_readout(self.prefix_tokens))

    @property
    def num_prefix_tokens(self) -> int:
        return len(self.prefix_tokens)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    @property
    def class_token_index(self) -> int | None:
        """Index of the class token in the sequence, or ``None`` when the model has none."""
        return self.prefix_tokens.index("cls") if "cls" in self.prefix_tokens else None

    @property
    def has_abs_pos_embed(self) -> bool:
        # a kind may combine parts with "+" (e.g. BEiT's "learned+relative-bias"); a relative bias is no table
        return any(k not in ("none", "rotary", "relative-bias") for k in self.pos_embed_kind.split("+"))

    def require_maps(self, method: str, kinds: tuple[str, ...], layers: list[int] | None = None,
                     hint: str = "") -> None:
        """Raise ``UnsupportedModelError`` unless every selected layer's map kind is one of ``kinds``.

        Args:
            method: the analysis asking (named in the message).
            kinds: the map kinds the method is defined for.
            layers: indices into ``attention_modules`` (default all).
            hint: what to do instead, appended to the message.
        """
        maps = self.attention_maps or ("softmax",) * len(self.attention_modules)
        idx = range(len(maps)) if layers is None else layers
        bad = [(self.attention_modules[i], maps[i]) for i in idx if maps[i] not in kinds]
        if bad:
            kinds_found = sorted({k for _, k in bad})
            raise UnsupportedModelError(
                f"{self.name}: {method} is defined for attention maps of kind {', '.join(kinds)}, but "
                f"{bad[0][0]}{f' and {len(bad) - 1} other layers' if len(bad) > 1 else ''} yield "
                f"{', '.join(kinds_found)} maps ({_KIND_REASON[kinds_found[0]]})" + (f"; {hint}" if hint else "")
            )

    def grid_for(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid for another input size (for ``dynamic_img_size`` models); the grid the model makes only
        where ``on_stride(img_size)`` holds."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def on_stride(self, img_size: tuple[int, int]) -> bool:
        """Whether an ``img_size`` input is a whole number of token strides high and wide: the sizes vitviz lets a
        model take besides its own (``core.images.check_size``) and resamples position embeddings to. At other
        sizes a plain ViT's patch projection drops the remainder and a hybrid's backbone rounds its own way (padded
        stride-2 convolutions round up), so ``grid_for`` would not be the model's grid."""
        return img_size[0] % self.patch_size[0] == 0 and img_size[1] % self.patch_size[1] == 0

    def takes(self, img_size: tuple[int, int]) -> bool:
        """Whether the model takes an ``img_size`` input: its own size, or (``dynamic_img_size``) any size
        ``on_stride``. ``core.images.check_size`` refuses the others, naming the fix."""
        return tuple(img_size) == tuple(self.img_size) or (self.dynamic_img_size and self.on_stride(img_size))

    def grid_for_input(self, x: Any) -> tuple[int, int]:
        """The patch grid of the tokens the model makes from the batch ``x`` ``(B, C, H, W)``.

        The one place this rule lives: models built with ``dynamic_img_size`` make a grid from the input's size;
        every other model always makes its built ``grid_size`` (``load_images`` resizes to it).
        """
        return self.grid_for((int(x.shape[-2]), int(x.shape[-1]))) if self.dynamic_img_size else self.grid_size

    def __repr__(self) -> str:
        def m(n: int) -> str:
            return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n:,}"

        prefix = ", ".join(self.prefix_tokens) or "none"
        cover = "covers prefix" if self.pos_embed_covers_prefix else "patches only"
        if not self.has_abs_pos_embed:
            cover = "no absolute table"
        lines = [
            f"ViTSpec({self.name}, family={self.family}{', hybrid' if self.hybrid else ''})",
            f"  image      {self.img_size[0]}x{self.img_size[1]} px"
            f"{' (dynamic size)' if self.dynamic_img_size else ''}",
            f"  tokens     {self.grid_size[0]}x{self.grid_size[1]} grid, stride "
            f"{self.patch_size[0]}x{self.patch_size[1]} px, prefix [{prefix}], N={self.num_tokens}",
            f"  pos_embed  {self.pos_embed_kind} ({cover})",
            f"  readout    {self.readout.describe(self.prefix_tokens)}",
            f"  depth {self.depth}, heads {self.num_heads}, embed_dim {self.embed_dim}"
            + (f" ({len(self.attention_modules)} attention modules)"
               if len(self.attention_modules) != self.depth else ""),
            "  params     " + ", ".join(f"{k} {m(v)}" for k, v in self.params.items() if k != "total" and v)
            + f" | total {m(self.params.get('total', 0))}",
        ]
        kinds = list(dict.fromkeys(self.attention_maps))
        if kinds and kinds != ["softmax"]:
            lines.insert(-1, "  attention  " + ", ".join(f"{k} x{self.attention_maps.count(k)}" for k in kinds))
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle: bool) -> None:  # IPython
        p.text(repr(self))


# model -> (structure, components, counts): the last count of each model read inside an analysis call
# (``inspect``), kept while the model lives; a count depends on nothing else (no quantized layer: never kept)
_COUNTS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, dict, dict[str, int]]] = weakref.WeakKeyDictionary()


def count_params(model: nn.Module, family: Family, structure: tuple | None = None) -> dict[str, int]:
    """Parameters per component (each parameter counted once, shared ones too) and ``total``. A quantized layer's
    weight and bias (``vitviz.core.contexts.quantized_layers``), packed inside its kernel and returned by its
    ``weight()`` / ``bias()`` methods rather than held as parameters, count as its parameters.

    ``structure`` (``model_structure(model)``, which ``inspect`` has at hand inside an analysis call): the count of an
    earlier call is returned when the model has the same structure (the same named submodules, and parameters and
    buffers of the same names and shapes) and ``family`` the same components; a model with quantized layers, whose
    packed tensors the structure does not describe, is always counted. Counting a ViT-B's some 150 parameters took
    0.9 ms of every call on an H200 machine's CPU (docs/benchmarks.md)."""
    from vitviz.core.contexts import is_quantized

    components = family.param_components(model)
    if structure is not None:
        hit = _COUNTS.get(model)
        if hit is not None and hit[0] == structure and hit[1] == components:
            return dict(hit[2])
    counts = dict.fromkeys(COMPONENT_ORDER, 0)
    # model.named_parameters() (each tensor once, under its first name) and the quantized layers' packed tensors
    # (quantized_layers), read in one walk: every analysis call counts the parameters once
    named: list[tuple[str, Any]] = []
    packed: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for prefix, module in named_submodules(model):
        table = module._parameters
        if table:
            dot = f"{prefix}." if prefix else ""
            for key, p in table.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    named.append((dot + key, p))
        if is_quantized(module):
            packed += [(f"{prefix}.{attr}", getattr(module, attr)()) for attr in ("weight", "bias")
                       if callable(getattr(module, attr, None))]
    for name, p in [*named, *((n, t) for n, t in packed if t is not None)]:
        comp = "other"
        for c, prefixes in components.items():  # a loop, not next(genexpr): every call counts ~150 parameters
            if name.startswith(prefixes):
                comp = c
                break
        counts[comp] = counts.get(comp, 0) + p.numel()
    counts["total"] = sum(counts.values())
    if structure is not None and not packed:
        _COUNTS[model] = (structure, components, dict(counts))
    return counts


def model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    name = cfg.get("architecture") if isinstance(cfg, dict) else None
    if not name:
        name = getattr(getattr(model, "config", None), "name_or_path", None) or type(model).__name__
    return str(name)


def model_structure(model: nn.Module, memory: bool = False) -> tuple:
    """What ``contexts.inspect_once`` and ``count_params`` compare: the names and identities of the submodules, and
    the names, identities and shapes of their parameters and buffers; with ``memory``, also each tensor's dtype,
    device, storage address and strides (what a CUDA graph's recording reads, ``core.graphs``: a tensor given other
    strides in place, ``w.t_()``, is read in another order)."""
    out: list[Any] = []
    keep = out.append
    for path, m in named_submodules(model):  # the dicts themselves: parameters() and buffers() cost 3x as much
        keep(path)
        keep(id(m))
        for table in (m._parameters, m._buffers):
            if table:
                for name, t in table.items():
                    if t is not None:
                        keep(name)
                        keep(id(t))
                        keep(t.shape)
                        if memory:
                            keep((t.dtype, t.device, t.data_ptr(), t.stride()))
    return tuple(out)


def inspect(model: nn.Module) -> ViTSpec:
    """Read the token layout of ``model`` (any supported family; see ``vitviz.describe`` for custom ViTs).

    Inside ``vitviz.core.contexts.inspect_once`` (every analysis call), a model read before in the block with the
    same structure is not read again.

    Raises:
        NotAViTError: the model is not a ViT vitviz can read (the message says how to describe it).
    """
    memo = inspect_memo()
    if memo is None or not isinstance(model, nn.Module):
        return _inspect(model)
    window = open_walk_window()
    hit = memo.get(id(model))
    if hit is not None and hit[0] is not model:
        hit = None
    if hit is not None and window is not None and hit[3] is window:  # read in this set-up: nothing replaced since
        return hit[2]
    structure = model_structure(model)
    spec = hit[2] if hit is not None and hit[1] == structure else _inspect(model, structure)
    memo[id(model)] = (model, structure, spec, window)
    return spec


def _inspect(model: nn.Module, structure: tuple | None = None) -> ViTSpec:
    family = family_of(model)
    lay = family.layout(model)
    return ViTSpec(
        name=model_name(model),
        family=family.name,
        **{f.name: getattr(lay, f.name) for f in fields(lay)},
        params=count_params(model, family, structure),
        attention_modules=tuple(n for n, _ in family.attention_modules(model)),
        attention_maps=tuple(family.attention_maps(model)),
        attention_blocks=tuple(family.attention_blocks(model)),
        readout=family.readout(model, lay.prefix_tokens),
    )
