"""Hugging Face DINOv3 (``DINOv3ViTModel``; Siméoni et al., "DINOv3", 2025), transformers >= 5.

Layout (``DINOv3ViTEmbeddings``): ``[cls, reg * config.num_register_tokens, patches]``. There is no absolute
table: position is a 2-D rotary embedding (``DINOv3ViTRopePositionEmbedding``) applied inside every attention
module to the query and key of the patch tokens only (``apply_rotary_pos_emb``), so ``pos_embed_kind="rotary"`` and
``pos_embed_similarity`` refuses (no table to compare). The rotary angles are computed from the input's size on
every call, so the grid follows the input: ``dynamic_img_size=True``. In training mode the model jitters, shifts
and rescales the patch coordinates at random (``pos_embed_jitter``, ...), so the maps are read in eval mode.

The vision root is the model itself: its ``base_model_prefix`` (``"model"``) names the encoder, not a wrapper, and
the layers are ``model.layer[i].attention``. The captured maps are the softmax of the rotated queries and keys,
what ``output_attentions=True`` returns under the eager implementation. Readout: the class token (``pooler_output``
is the final-normed class token).

Patch removal: the rotary angles are laid over the last ``P`` tokens of the sequence, so a dropped patch would give
every later patch another's position; the pixels are filled instead.
"""

from __future__ import annotations

import torch
from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily, vision_config, vision_root


class HFDinov3Family(HFVisionFamily):
    model_types = ("dinov3_vit",)
    layer_paths = (("model.layer", "attention"),)
    pos_embed_kind = "rotary"
    dynamic_img_size = True
    patch_conv_path = "patch_embeddings"  # a Conv2d directly under the embeddings

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ("cls",) + ("reg",) * int(vision_config(model).num_register_tokens)

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        return None  # rotary: no table

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        comps["norm"] = comps["norm"] + (f"{vision_root(model)[1]}norm.",)
        return comps

    def _token_drop(self, model: nn.Module) -> tuple[nn.Module | None, str]:
        return None, (f"{type(model).__name__} (Hugging Face) places its rotary position embedding by sequence index "
                      "(a dropped patch would shift the positions of the ones after it)")
