"""Hugging Face DeiT (``DeiTModel``, ``DeiTForImageClassification``, ``DeiTForImageClassificationWithTeacher``).

Layout (``DeiTEmbeddings``): ``[cls, dist, patches]``, two prefix tokens, and a learned absolute table
``(1, 2 + P, D)`` that covers both. Readout (``Family.readout``): ``DeiTForImageClassificationWithTeacher``
returns ``(cls_classifier(x[:, 0]) + distillation_classifier(x[:, 1])) / 2``, so its output reads the mean of the
class and distillation tokens (the default of ``attention_rollout`` and the other row-reading explanations);
``DeiTForImageClassification`` and ``DeiTModel`` (pooler) read the class token. ``token=0`` / ``token=1`` pick one row.
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily
from vitviz.core.families.readout import Readout, default_readout, distilled_readout


class HFDeiTFamily(HFVisionFamily):
    model_types = ("deit",)
    # the authors' code normalises with the ImageNet mean and std (timm IMAGENET_DEFAULT_MEAN / _STD)
    authors_mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ("cls", "dist")

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        if type(model).__name__ == "DeiTForImageClassificationWithTeacher":
            return distilled_readout(prefix_tokens, "DeiTForImageClassificationWithTeacher: mean of the two heads")
        return default_readout(prefix_tokens)
