"""open_clip vision towers: ``open_clip.transformer.VisionTransformer`` and the ``CLIP`` / ``CustomTextCLIP`` models
whose ``visual`` is one (``open_clip.create_model("ViT-B-32", pretrained=None)`` and friends).

Layout, read from the tower: ``conv1`` (the RGB patch projection), ``grid_size`` and ``patch_size`` as built,
``[cls, patches]`` (``class_embedding`` is always prepended, also with ``pool_type="avg"``), a ``(1 + P, D)``
``positional_embedding`` covering the class token (its kind read from the table's values, never from
``requires_grad``: ``pos_embed_type="learnable"`` gives ``learned``, ``"sin_cos_2d"`` gives ``sincos``), ``ln_pre``
before the first block (CLIP's pre-LayerNorm), ``transformer.resblocks`` of ``ResidualAttentionBlock`` whose
``attn`` is an ``nn.MultiheadAttention``.

Attention is read with ``probe_mha`` (as for torchvision): the module is called with ``need_weights=True`` and
per-head weights for the duration. Reductions (``heads="stream"``) use ``stream.probe_mha_stream``, also as for
torchvision: the forward untouched and the maps recomputed from ``q`` and ``k`` where the Triton kernels serve the
call (CUDA), the weights read otherwise. For a whole ``CLIP`` model only the vision tower's blocks are captured;
``model(images)`` runs ``encode_image`` only, so every analysis works on the whole model.

Patch removal (``vitviz.faithfulness``): tokens are dropped at ``patch_dropout`` (the positional embedding added,
before ``ln_pre``) when the tower reads out its class token (``pool_type="tok"``, no attentional pooler), as for
Hugging Face CLIP; ``pool_type="avg"`` and attentional poolers have their pixels filled.

AttnLRP (``lrp_families.open_clip_rules``) runs on the tower, its attentional poolers included; a whole CLIP model is
refused for it, naming ``model.visual`` (its forward takes text and L2-normalises the features).

Refused with ``UnsupportedModelError``: towers built with ``block_type="custom"``, ``qk_norm``,
``scaled_cosine_attn`` and similar (``CustomResidualAttentionBlock``: its ``Attention`` has no probe here), timm
trunks (``TimmModel``: analyse ``model.visual.trunk`` with the timm family instead), ModifiedResNet towers (not a
ViT), and a capture in training mode with ``patch_dropout > 0`` (the tokens would be a random subset). A capture in
training mode with attention dropout (an ``nn.MultiheadAttention`` with ``dropout > 0``) raises ``CaptureError``: the
weights it returns are the dropped-out ones.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Family, Layout, Undo
from vitviz.core.families.pooling import pool_tokens
from vitviz.core.families.pos_kind import table_kind
from vitviz.core.families.probes import probe_mha, probe_mha_pool, refuse_mha_dropout
from vitviz.core.families.readout import PATCHES, Readout, default_readout
from vitviz.core.families.stream import mha_stream_probe_for
from vitviz.errors import CaptureError, NotAViTError, UnsupportedModelError


def _is_open_clip(obj: Any) -> bool:
    return type(obj).__module__.startswith("open_clip.")


def tower(model: nn.Module) -> tuple[nn.Module, str]:
    """The vision tower and its name prefix (``"visual."`` inside a CLIP model, ``""`` for a bare tower)."""
    visual = getattr(model, "visual", None)
    return (visual, "visual.") if isinstance(visual, nn.Module) else (model, "")


class OpenCLIPFamily(Family):
    name = "open_clip"
    probe = staticmethod(probe_mha)
    stream_probe = staticmethod(mha_stream_probe_for)  # as torchvision: recomputed where the kernels serve the call

    def match(self, model: nn.Module) -> bool:
        return _is_open_clip(model) and _is_open_clip(tower(model)[0])

    def _check(self, model: nn.Module) -> nn.Module:
        visual = tower(model)[0]
        kind = type(visual).__name__
        where = f"{type(model).__name__} (open_clip, vision tower {kind})"
        if kind == "TimmModel":
            raise UnsupportedModelError(f"{where}: the tower is a timm trunk wrapped by open_clip; analyse "
                                        "model.visual.trunk, which vitviz reads as a timm model")
        if kind != "VisionTransformer" or not hasattr(visual, "transformer"):
            raise NotAViTError(f"{where} is not a Vision Transformer (open_clip ViT towers are "
                               "open_clip.transformer.VisionTransformer)")
        for i, block in enumerate(visual.transformer.resblocks):
            if not isinstance(getattr(block, "attn", None), nn.MultiheadAttention):
                raise UnsupportedModelError(
                    f"{where}: block {i} is a {type(block).__name__} whose attention is "
                    f"{type(getattr(block, 'attn', None)).__name__}, not nn.MultiheadAttention (towers built with "
                    "block_type='custom', qk_norm, scaled_cosine_attn or scale_heads); vitviz reads only "
                    "the standard ResidualAttentionBlock")
        return visual

    def layout(self, model: nn.Module) -> Layout:
        visual = self._check(model)
        gh, gw = (int(v) for v in visual.grid_size)
        img = tuple(int(v) for v in visual.image_size)
        patch = tuple(int(v) for v in visual.patch_size)
        pos = visual.positional_embedding
        if pos.ndim != 2 or pos.shape[0] != 1 + gh * gw:
            raise UnsupportedModelError(f"{type(model).__name__} (open_clip): positional_embedding has shape "
                                        f"{tuple(pos.shape)}, expected ({1 + gh * gw}, D) for a {gh}x{gw} grid")
        blocks = list(visual.transformer.resblocks)
        return Layout(
            img_size=(img[0], img[1]), patch_size=(patch[0], patch[1]), grid_size=(gh, gw), prefix_tokens=("cls",),
            pos_embed_kind=table_kind(pos, (gh, gw), 1), pos_embed_covers_prefix=True,
            depth=len(blocks), num_heads=int(blocks[0].attn.num_heads) if blocks else 0,
            embed_dim=int(visual.transformer.width),
        )

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        visual = self._check(model)
        prefix = tower(model)[1]
        return [(f"{prefix}transformer.resblocks.{i}.attn", b.attn) for i, b in enumerate(visual.transformer.resblocks)]

    def block_tokens(self, model: nn.Module, output: Any, batch: int) -> torch.Tensor:
        """Resblocks run ``(N, B, D)`` unless ``transformer.batch_first``; returned as ``(B, N, D)``."""
        if isinstance(output, (tuple, list)):
            output = output[0]
        if not getattr(tower(model)[0].transformer, "batch_first", True):
            output = output.transpose(0, 1)
        return super().block_tokens(model, output, batch)

    def pooled_token(self, model: nn.Module, tokens: torch.Tensor, prefix_tokens: tuple[str, ...]) -> torch.Tensor:
        """``pool_type="avg"``: the mean of the patch tokens (the tower's ``_global_pool``); ``"tok"`` and
        attentional poolers: the class token."""
        visual = tower(model)[0]
        if getattr(visual, "attn_pool", None) is None and getattr(visual, "pool_type", "tok") == "avg":
            return pool_tokens(tokens, "avg", len(prefix_tokens))
        return super().pooled_token(model, tokens, prefix_tokens)

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """An attentional pooler: attention pooling over every token (class token included); ``pool_type``
        ``"avg"``: the patch mean (``x[:, 1:].mean(1)``), ``"tok"``: the class token, ``"none"``: no pooling."""
        visual = tower(model)[0]
        pool = getattr(visual, "pool_type", "tok")
        if getattr(visual, "attn_pool", None) is not None:
            return Readout("attention-pool", ((0, PATCHES),), f"open_clip attentional pooler, pool_type={pool!r}",
                           self._pool_queries(visual) is not None)
        if pool == "avg":
            return Readout("mean", ((PATCHES,),), "open_clip pool_type='avg'")
        if pool == "tok":
            return default_readout(prefix_tokens, "open_clip pool_type='tok'")
        return Readout("none", default_readout(prefix_tokens).parts, f"open_clip pool_type={pool!r}")

    @staticmethod
    def _pool_queries(visual: nn.Module) -> str | None:
        """The attentional pooler's queries the output keeps (``pool_type`` ``"tok"``: query 0; ``"avg"``: the
        mean of the others), or ``None`` where vitviz does not read the pool (two poolers, ``"none"``)."""
        if getattr(visual, "attn_pool_contrastive", None) is not None:
            return None
        return {"tok": "first", "avg": "rest"}.get(getattr(visual, "pool_type", "tok"))

    def readout_attention(self, model: nn.Module, emit: Any) -> Undo | None:
        """The attentional pooler's ``nn.MultiheadAttention`` weights (``probes.probe_mha_pool``)."""
        visual = tower(model)[0]
        queries = self._pool_queries(visual) if getattr(visual, "attn_pool", None) is not None else None
        return None if queries is None else probe_mha_pool(visual.attn_pool.attn, queries, emit)

    def pre_logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The tower's image features (pooled token times ``proj``, what ``encode_image`` returns unnormalised)."""
        out = tower(model)[0](x)
        return out[0] if isinstance(out, tuple) else out

    def prepare(self, model: nn.Module) -> Undo:
        visual = tower(model)[0]
        drop = getattr(visual, "patch_dropout", None)
        if visual.training and float(getattr(drop, "prob", 0.0) or 0.0) > 0:
            raise CaptureError(f"{type(model).__name__} (open_clip) is in training mode with patch_dropout="
                               f"{drop.prob}: each forward keeps a random subset of the patch tokens; call "
                               "model.eval() before capturing")
        refuse_mha_dropout(model, self.attention_modules(model), self.name)
        return lambda: None

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        return tower(model)[0].positional_embedding[None]

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return tower(model)[0].conv1

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        p = tower(model)[1]
        return {
            "patch_embed": (f"{p}conv1.",),
            "pos_embed": (f"{p}positional_embedding",),
            "prefix_tokens": (f"{p}class_embedding",),
            "blocks": (f"{p}transformer.",),
            "norm": (f"{p}ln_pre.", f"{p}ln_post."),
            "head": (f"{p}proj", f"{p}attn_pool"),
        }

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

        visual = tower(model)[0]
        cfg = getattr(visual, "preprocess_cfg", None) or {}  # set by open_clip.create_model
        h, w = self.layout(model).img_size
        squash = cfg.get("resize_mode") == "squash"
        return {"input_size": (3, h, w), "interpolation": cfg.get("interpolation", "bicubic"),
                "mean": tuple(cfg.get("mean", OPENAI_DATASET_MEAN)), "std": tuple(cfg.get("std", OPENAI_DATASET_STD)),
                "crop_pct": 1.0, "crop_mode": "squash" if squash else "center"}

    def _token_drop(self, model: nn.Module) -> tuple[nn.Module | None, str]:
        visual = tower(model)[0]
        pool = getattr(visual, "pool_type", None)
        if getattr(visual, "attn_pool", None) is not None or pool != "tok":
            return None, (f"{type(model).__name__} (open_clip) pools its output over the patch tokens (pool_type="
                          f"{pool!r}{', attentional pooler' if getattr(visual, 'attn_pool', None) is not None else ''})")
        drop = getattr(visual, "patch_dropout", None)
        return (drop if isinstance(drop, nn.Module) else None), "open_clip tower without a patch_dropout module"

    def token_drop_module(self, model: nn.Module) -> nn.Module | None:
        return self._token_drop(model)[0]

    def token_drop_refusal(self, model: nn.Module) -> str:
        return self._token_drop(model)[1]

    def lrp_rules(self, model: nn.Module, rules: Any, emit: Any) -> Any:
        """AttnLRP on the vision tower (``lrp_families.open_clip_rules``); a whole CLIP model is refused, naming
        ``model.visual``."""
        from vitviz.core.families.lrp_families import open_clip_rules

        self._check(model)
        return open_clip_rules(model, rules, emit)
