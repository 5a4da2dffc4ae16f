"""Hugging Face BEiT (``BeitModel``, ``BeitForImageClassification``, ``BeitForMaskedImageModeling``).

Layout (``BeitEmbeddings``): ``[cls, patches]``. Position information is read from the config:

- ``use_relative_position_bias`` (one table per layer) or ``use_shared_relative_position_bias`` (one for the
  model): a learned relative position bias added to the attention scores before the softmax; there is no
  absolute table, ``pos_embed_kind="relative-bias"`` and ``pos_embed_similarity`` refuses (no table to compare).
- ``use_absolute_position_embeddings``: a learned absolute table ``(1, 1 + P, D)`` covering the class token,
  ``pos_embed_kind="learned"`` (``"learned+relative-bias"`` when a relative bias is used as well).

The captured maps are the post-softmax probabilities, bias included (what multiplies the values), exactly what
``output_attentions=True`` returns under the eager implementation.
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily, vision_config, vision_root


class HFBeitFamily(HFVisionFamily):
    model_types = ("beit",)

    def pos_embed_kind_of(self, model: nn.Module) -> str:
        c = vision_config(model)
        kinds = []
        if getattr(c, "use_absolute_position_embeddings", False):
            kinds.append("learned")
        if getattr(c, "use_relative_position_bias", False) or getattr(c, "use_shared_relative_position_bias", False):
            kinds.append("relative-bias")
        return "+".join(kinds) or "none"

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        p = vision_root(model)[1]
        # relative position bias tables: per layer, or one shared by the model
        comps["pos_embed"] = comps["pos_embed"] + (f"{p}shared_position_bias.",)
        return comps
