"""Hand-written ViTs: the common tutorial layout, and ``describe`` for any other layout.

Tutorial layout (matched automatically): ``patch_embed.proj`` (Conv2d) with ``patch_embed.img_size``,
``cls_token`` (optionally ``dist_token`` and register tokens, ``reg_token`` or ``register_tokens``, in that order
before the patches), ``pos_embed`` (rows for every prefix token, for the class token only, or for the patches
only), and ``blocks[i].attn`` holding a ``qkv`` Linear, ``num_heads`` (or ``n_heads``), ``scale`` and, usually,
``attn_drop``. ``capture_attention`` checks that every map has the layout's ``N`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Family, Layout, Probe, named_children_of
from vitviz.core.families.hf_probes import probe_hf
from vitviz.core.families.pos_kind import table_kind
from vitviz.core.families.probes import probe_attn_drop, probe_mha, probe_qkv
from vitviz.core.families.readout import PATCHES, Readout, default_readout
from vitviz.core.util import pair
from vitviz.errors import InputError, NotAViTError

PROBES: dict[str, Probe] = {"attn_drop": probe_attn_drop, "qkv": probe_qkv, "mha": probe_mha, "hf": probe_hf}




def _get(model: nn.Module, path: str | None) -> Any:
    obj: Any = model
    for part in (path or "").split("."):
        if not part:
            continue
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _heads(attn: nn.Module) -> int:
    return int(getattr(attn, "num_heads", 0) or getattr(attn, "n_heads", 0) or getattr(attn, "heads", 0))


def _auto_probe(module: nn.Module, emit: Any) -> Any:
    if isinstance(module, nn.MultiheadAttention):
        return probe_mha(module, emit)
    if isinstance(getattr(module, "attn_drop", None), nn.Module):
        return probe_attn_drop(module, emit)
    if not hasattr(module, "num_heads") and hasattr(module, "n_heads"):
        raise NotAViTError(
            f"{type(module).__name__} names its head count n_heads; describe the model with "
            "vitviz.describe(model, probe='attn_drop') or give the module a num_heads attribute"
        )
    return probe_qkv(module, emit)


# attribute names of register tokens (Darcet et al. 2024) in hand-written ViTs: timm's, DINOv2's and HF's
REGISTER_ATTRS = ("reg_token", "reg_tokens", "register_tokens")

# libraries whose models have families of their own (never read by the tutorial heuristics)
LIBRARIES = ("timm", "transformers", "torchvision", "open_clip")


class CustomFamily(Family):
    """A ViT described by hand. See ``vitviz.describe`` for the arguments."""

    name = "custom"

    def __init__(
        self,
        *,
        attention: str = "blocks.*.attn",
        probe: str | Probe = "auto",
        img_size: int | Sequence[int] | None = None,
        patch_size: int | Sequence[int] | None = None,
        prefix_tokens: Sequence[str] | int = ("cls",),
        pos_embed: str | None = "pos_embed",
        pos_embed_kind: str | None = None,
        patch_proj: str | None = "patch_embed.proj",
        num_heads: int | None = None,
        embed_dim: int | None = None,
        readout: str | Sequence[str] | Readout | None = None,
    ) -> None:
        self.attention = attention
        self.probe = _auto_probe if probe == "auto" else (PROBES[probe] if isinstance(probe, str) else probe)
        self.img_size = img_size
        self.patch_size = patch_size
        self.prefix = ("prefix",) * prefix_tokens if isinstance(prefix_tokens, int) else tuple(prefix_tokens)
        self.pos_path = pos_embed
        self.kind = pos_embed_kind
        self.proj_path = patch_proj
        self.num_heads = num_heads
        self.embed_dim = embed_dim
        self.head_reads = self._readout(readout)

    def _readout(self, readout: str | Sequence[str] | Readout | None) -> Readout:
        """``describe(readout=...)`` as a ``Readout``: ``None`` the default (the class token, else the patch mean),
        ``"avg"`` the mean of the patch tokens, a tuple of prefix-token names the mean of those tokens (e.g.
        ``("cls", "dist")``), or a ``Readout``."""
        source = "vitviz.describe"
        if readout is None:
            return default_readout(self.prefix, source)
        if isinstance(readout, Readout):
            return readout
        if readout == "avg":
            return Readout("mean", ((PATCHES,),), source)
        names = (readout,) if isinstance(readout, str) else tuple(readout) if isinstance(readout, Sequence) else ()
        missing = [n for n in names if not isinstance(n, str) or n not in self.prefix]
        if not names or missing:
            raise InputError(
                f"readout={readout!r} is not a readout vitviz.describe takes; pass 'avg' (the head reads the mean "
                f"of the patch tokens), the names of the prefix tokens whose mean it reads (of prefix_tokens="
                f"{self.prefix}, e.g. ('cls', 'dist')), or a vitviz.core.families.readout.Readout")
        parts = tuple((self.prefix.index(n),) for n in dict.fromkeys(names))
        return Readout("token" if len(parts) == 1 else "mean", parts, source)

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """As described (``readout=``), else the default: the class token, or the patch mean without one."""
        return self.head_reads

    def match(self, model: nn.Module) -> bool:
        return True

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        mods = named_children_of(model, self.attention)
        if not mods:
            raise NotAViTError(
                f"{type(model).__name__}: no module name matches the attention pattern {self.attention!r}; "
                "pass attention='<pattern>' matching e.g. 'encoder.layers.*.attn' (see model.named_modules())"
            )
        return mods

    def _table(self, model: nn.Module) -> torch.Tensor | None:
        pos = _get(model, self.pos_path)
        return pos if isinstance(pos, torch.Tensor) else None

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        """The table; its patch rows only when it covers the class (and distillation) token but not the registers
        (``pos_embed_covers_prefix`` is then False, as for DINOv2 with registers)."""
        pos = self._table(model)
        if pos is None:
            return None
        grid = self._geometry(model)[2]
        lead = pos.shape[-2] - grid[0] * grid[1]
        return pos[..., lead:, :] if 0 < lead < len(self.prefix_tokens(model)) else pos

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return _get(model, self.proj_path)

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return self.prefix

    def _geometry(self, model: nn.Module) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """``(img_size, patch_size, grid_size)``."""
        proj = self.patch_proj(model)
        patch = self.patch_size
        if patch is None and isinstance(proj, nn.Conv2d):
            patch = proj.stride
        img = self.img_size
        if img is None:
            img = getattr(_get(model, self.proj_path.rsplit(".", 1)[0]) if self.proj_path else None, "img_size", None)
        if img is None or patch is None:
            raise NotAViTError(
                f"{type(model).__name__}: cannot tell the image size or patch stride; pass them: "
                "vitviz.describe(model, img_size=224, patch_size=16, ...)"
            )
        img, patch = pair(img), pair(patch)
        return img, patch, (img[0] // patch[0], img[1] // patch[1])

    def layout(self, model: nn.Module) -> Layout:
        prefix = self.prefix_tokens(model)
        proj = self.patch_proj(model)
        img, patch, grid = self._geometry(model)
        mods = self.attention_modules(model)
        pos = self._table(model)
        p = grid[0] * grid[1]
        lead = len(prefix) - prefix.count("reg")  # the class and distillation tokens: registers may have no row
        covers = pos is not None and pos.shape[-2] == p + len(prefix) and len(prefix) > 0
        partial = pos is not None and not covers and 0 < lead < len(prefix) and pos.shape[-2] == p + lead
        if pos is not None and not covers and not partial and pos.shape[-2] != p:
            raise NotAViTError(
                f"{type(model).__name__}: pos_embed has {pos.shape[-2]} rows, but a {grid[0]}x{grid[1]} grid with "
                f"{len(prefix)} prefix tokens needs {p} or {p + len(prefix)}"
                + (f" (or {p + lead}: rows for the class token only)" if 0 < lead < len(prefix) else "")
                + "; check img_size, patch_size and prefix_tokens"
            )
        prefix_rows = len(prefix) if covers else lead if partial else 0
        kind = self.kind or ("none" if pos is None else table_kind(pos, grid, prefix_rows))
        dim = self.embed_dim or (pos.shape[-1] if pos is not None else getattr(proj, "out_channels", 0))
        return Layout(
            img_size=img,
            patch_size=patch,
            grid_size=grid,
            prefix_tokens=prefix,
            pos_embed_kind=kind,
            pos_embed_covers_prefix=covers,
            depth=len(mods),
            num_heads=int(self.num_heads or _heads(mods[0][1])),
            embed_dim=int(dim),
        )

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        blocks = self.attention.split("*", 1)[0] if "*" in self.attention else self.attention
        comps: dict[str, tuple[str, ...]] = {"blocks": (blocks,)}
        if self.proj_path:
            comps["patch_embed"] = (self.proj_path.rsplit(".", 1)[0] + ".",)
        if self.pos_path:
            comps["pos_embed"] = (self.pos_path,)
        comps["prefix_tokens"] = ("cls_token", "dist_token") + REGISTER_ATTRS
        comps["norm"] = ("norm.",)
        comps["head"] = ("head.", "fc.")
        return comps


class TutorialFamily(CustomFamily):
    """The layout most from-scratch ViT tutorials use (see module docstring)."""

    name = "tutorial"

    def __init__(self) -> None:
        super().__init__()

    def match(self, model: nn.Module) -> bool:
        if type(model).__module__.split(".")[0] in LIBRARIES:  # a library's model is read by its own family or
            return False  # refused; the tutorial heuristics never guess a library layout
        pe = getattr(model, "patch_embed", None)
        blocks = getattr(model, "blocks", None)
        if not isinstance(getattr(pe, "proj", None), nn.Conv2d) or blocks is None:
            return False
        if not isinstance(getattr(model, "pos_embed", None), torch.Tensor):
            return False
        first = next(iter(blocks), None)
        attn = getattr(first, "attn", None)
        return isinstance(getattr(attn, "qkv", None), nn.Linear) and _heads(attn) > 0

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        """``cls`` (``cls_token``), ``dist`` (``dist_token``), then one ``reg`` per register token (``reg_token``
        as timm names them, ``register_tokens`` as DINOv2 and Hugging Face do; ``(1, R, D)`` or ``(R, D)``),
        in that order, as timm and DINOv2 lay them out."""
        tokens = tuple(t for t, attr in (("cls", "cls_token"), ("dist", "dist_token"))
                       if isinstance(getattr(model, attr, None), torch.Tensor))
        for attr in REGISTER_ATTRS:
            reg = getattr(model, attr, None)
            if isinstance(reg, torch.Tensor) and reg.ndim >= 2:
                tokens += ("reg",) * int(reg.shape[-2])
        return tokens
