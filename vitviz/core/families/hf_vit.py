"""Hugging Face ``ViTModel`` and its task heads (``ViTForImageClassification``, ...), transformers >= 5; and
``ViTMSNModel`` / ``ViTMSNForImageClassification`` (Assran et al., "Masked Siamese Networks", 2022), the same
modules under other names.

Layout (``ViTEmbeddings``): ``[cls, patches]``; a learned absolute table ``(1, 1 + P, D)`` that covers the class
token; the grid is ``config.image_size // config.patch_size`` (``(h, w)`` pairs allowed). The model interpolates
the table only when called with ``interpolate_pos_encoding=True``, so it is read at its built size; the table
at another size (``pos_embed_similarity(img_size=)``) is the one that call adds (``HFVisionFamily.pos_embed_at``).
"""

from __future__ import annotations

from torch import nn

from vitviz.core.families.hf_base import HFVisionFamily


class HuggingFaceFamily(HFVisionFamily):
    model_types = ("vit",)


class HFViTMSNFamily(HFVisionFamily):
    model_types = ("vit_msn",)
    # the MSN checkpoints were converted with ViTImageProcessor(image_mean=IMAGENET_DEFAULT_MEAN, image_std=
    # IMAGENET_DEFAULT_STD) (transformers' convert_msn_to_pytorch.py); the class's own defaults are 0.5
    authors_mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class HFIJepaFamily(HFVisionFamily):
    model_types = ("ijepa",)
    # I-JEPA's training code normalises with the ImageNet mean and std; ViTImageProcessor's defaults are 0.5
    authors_mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ()
