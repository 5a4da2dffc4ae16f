"""Hugging Face SigLIP vision (``SiglipVisionModel``, and the vision tower of ``SiglipModel``).

Layout (``SiglipVisionEmbeddings``): patches only, **no class token** (``prefix_tokens=()``); a learned absolute
table (an ``nn.Embedding`` of ``P`` rows, read as ``(1, P, D)``) covers the patches. The image embedding comes
from the attention-pooling head (``head``, a ``MultiheadAttentionPoolingHead`` with its own probe query): it is
not a self-attention layer over the tokens, so ``capture_attention`` does not return it (``output_attentions``
does not either); it is the readout (``Family.readout``, ``readout_attention``: its probe query's attention over the
patch tokens, read during the forward pass).

What the class-token views use instead (documented in docs/families.md): ``attention_rollout``, ``grad_rollout``,
Chefer's relevance and flow weight the rows by the head's attention (``token=None``; ``token="patches"``: the mean
of the rollout rows of all patch queries; an int picks one patch query); ``plot_attention_heads_grid`` and the
attention explorer default to the mean over patch queries.
``mean_attention_distance`` and ``pos_embed_similarity`` never use a class token.
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.base import Emit, Undo
from vitviz.core.families.hf_base import HFVisionFamily, vision_root
from vitviz.core.families.probes import probe_mha_pool
from vitviz.core.families.readout import PATCHES, Readout


class HFSiglipFamily(HFVisionFamily):
    model_types = ("siglip", "siglip_vision_model")
    layer_paths = (("encoder.layers", "self_attn"),)
    patch_conv_path = "patch_embedding"
    pos_attr = "position_embedding"
    pos_embed_covers_prefix = False
    processor_type = "siglip"

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ()

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """The attention-pooling head over the patch tokens (``vision_use_head``), else the patch mean."""
        if getattr(vision_root(model)[0], "head", None) is not None:
            return Readout("attention-pool", ((PATCHES,),), "SiglipMultiheadAttentionPoolingHead", True)
        return super().readout(model, prefix_tokens)

    def readout_attention(self, model: nn.Module, emit: Emit) -> Undo | None:
        """The pooling head's ``nn.MultiheadAttention`` weights of its probe query (``probes.probe_mha_pool``)."""
        head = getattr(vision_root(model)[0], "head", None)
        return None if head is None else probe_mha_pool(head.attention, "first", emit)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        if type(model).__name__ == "SiglipModel":
            comps["other"] = ("text_model.", "logit_scale", "logit_bias")
        return comps
