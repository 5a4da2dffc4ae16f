"""Hugging Face CLIP vision (``CLIPVisionModel``, ``CLIPVisionModelWithProjection``, ``CLIPForImageClassification``,
and ``CLIPModel``), and the vision towers built from the same code: MetaCLIP 2 (``MetaClip2VisionModel``, ...,
``MetaClip2Model``; Chuang et al., "Meta CLIP 2", 2025), Chinese-CLIP (``ChineseCLIPVisionModel``,
``ChineseCLIPModel``; Yang et al., 2022) and AltCLIP (``AltCLIPVisionModel``, ``AltCLIPModel``; Chen et al., 2022).
transformers generates their vision embeddings, attention and encoder layers from CLIP's ("Copied from
transformers.models.clip"); ``tests/test_families_hf.py`` checks each against its own ``output_attentions``.

Layout (``CLIPVisionEmbeddings``): ``[cls, patches]`` where the class token is the learned ``class_embedding``
vector; a learned absolute table (an ``nn.Embedding`` of ``1 + P`` rows, read as ``(1, 1 + P, D)``) covers it.
``pre_layrnorm`` normalises the embedded tokens before the first layer (CLIP's pre-LayerNorm); it does not change
the layout or the attention read-out. The config's ``image_size`` is one int, so the grid is square.

The image-text models (``CLIPModel``, ``MetaClip2Model``, ``ChineseCLIPModel``, ``AltCLIPModel``): ``inspect`` reads
the vision tower ``model.vision_model``; ``capture_attention`` hooks the vision layers only (the text tower's
attention is not a map over image patches). Their ``forward`` needs ``input_ids`` as well, so the vitviz calls that
run ``model(images)`` (``attention_rollout``, ``mean_attention_distance``, ...) refuse them inside the capture with
an ``InputError`` that says to pass ``model.vision_model`` (same weights) instead; inside your own
``capture_attention`` block call ``model.get_image_features(pixel_values=x)``.

Preprocessing without the checkpoint's ``preprocessor_config.json``: the defaults of the model type's image
processor (``CLIPImageProcessor`` for CLIP, MetaCLIP 2 and AltCLIP, ``ChineseCLIPImageProcessor`` for Chinese-CLIP;
all with CLIP's mean and std).
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily, vision_config
from vitviz.core.families.readout import PATCHES, Readout

# model type of a CLIP-built model (or of its vision config) -> the model type its image processor is filed under
CLIP_MODEL_TYPES = {"clip": "clip", "clip_vision_model": "clip", "metaclip_2": "metaclip_2",
                    "metaclip_2_vision_model": "metaclip_2", "chinese_clip": "chinese_clip",
                    "chinese_clip_vision_model": "chinese_clip", "altclip": "altclip",
                    "altclip_vision_model": "altclip"}


class HFCLIPFamily(HFVisionFamily):
    model_types = tuple(CLIP_MODEL_TYPES)
    layer_paths = (("encoder.layers", "self_attn"),)
    patch_conv_path = "patch_embedding"
    pos_attr = "position_embedding"

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """``CLIPForImageClassification`` and ``MetaClip2ForImageClassification``: the mean of the patch tokens
        (``last_hidden_state[:, 1:].mean(1)``); the vision models: the class token."""
        if type(model).__name__.endswith("ForImageClassification"):
            return Readout("mean", ((PATCHES,),), type(model).__name__)
        return super().readout(model, prefix_tokens)

    def processor_key(self, model: nn.Module) -> str:
        return CLIP_MODEL_TYPES.get(vision_config(model).model_type, "clip")
