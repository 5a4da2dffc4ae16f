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
from vitviz.core.families.hf_base import HFAttentionPoolFamily
from vitviz.core.families.probes import probe_mha_pool


class HFSiglipFamily(HFAttentionPoolFamily):
    model_types = ("siglip", "siglip_vision_model")
    layer_paths = (("encoder.layers", "self_attn"),)
    patch_conv_path = "patch_embedding"
    pos_attr = "position_embedding"
    processor_type = "siglip"
    pool_class = "SiglipMultiheadAttentionPoolingHead"  # with vision_use_head

    def pool_probe(self, head: nn.Module, emit: Emit) -> Undo:
        """The pooling head's ``nn.MultiheadAttention`` weights of its probe query (``probes.probe_mha_pool``)."""
        return probe_mha_pool(head.attention, "first", emit)
