"""Hugging Face CLIP vision (``CLIPVisionModel``, ``CLIPVisionModelWithProjection``, and ``CLIPModel``).

Layout (``CLIPVisionEmbeddings``): ``[cls, patches]`` where the class token is the learned ``class_embedding``
vector; a learned absolute table (an ``nn.Embedding`` of ``1 + P`` rows, read as ``(1, 1 + P, D)``) covers it.
``pre_layrnorm`` normalises the embedded tokens before the first layer (CLIP's pre-LayerNorm); it does not change
the layout or the attention read-out. The config's ``image_size`` is one int, so the grid is square.

``CLIPModel``: ``inspect`` reads the vision tower ``model.vision_model``; ``capture_attention`` hooks the vision
layers only (the text tower's attention is not a map over image patches). ``CLIPModel.forward`` needs
``input_ids`` as well, so the vitviz calls that run ``model(images)`` (``attention_rollout``,
``mean_attention_distance``, ...) refuse it inside the capture with an ``InputError`` that says to pass
``model.vision_model`` (same weights) instead; inside your own ``capture_attention`` block call
``model.get_image_features(pixel_values=x)``.
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily
from vitviz.core.families.readout import PATCHES, Readout


class HFCLIPFamily(HFVisionFamily):
    model_types = ("clip", "clip_vision_model")
    layer_paths = (("encoder.layers", "self_attn"),)
    patch_conv_path = "patch_embedding"
    pos_attr = "position_embedding"
    processor_type = "clip"

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """``CLIPForImageClassification``: the mean of the patch tokens; the vision models: the class token."""
        if type(model).__name__ == "CLIPForImageClassification":
            return Readout("mean", ((PATCHES,),), "CLIPForImageClassification")
        return super().readout(model, prefix_tokens)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        comps = super().param_components(model)
        if type(model).__name__ == "CLIPModel":  # the text tower and projections are not part of the ViT
            comps["other"] = ("text_model.", "text_projection.", "visual_projection.", "logit_scale")
        return comps
