"""Hugging Face DeiT (``DeiTModel``, ``DeiTForImageClassification``, ``DeiTForImageClassificationWithTeacher``).

Layout (``DeiTEmbeddings``): ``[cls, dist, patches]``, two prefix tokens, and a learned absolute table
``(1, 2 + P, D)`` that covers both. The class token is the output token of ``attention_rollout``; the
distillation token is an ordinary prefix token (its row can be picked with ``token=1``).
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily


class HFDeiTFamily(HFVisionFamily):
    model_types = ("deit",)
    # the authors' code normalises with the ImageNet mean and std (timm IMAGENET_DEFAULT_MEAN / _STD)
    authors_mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ("cls", "dist")
