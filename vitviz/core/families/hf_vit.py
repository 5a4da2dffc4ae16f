"""Hugging Face ``ViTModel`` and its task heads (``ViTForImageClassification``, ...), transformers >= 5.

Layout (``ViTEmbeddings``): ``[cls, patches]``; a learned absolute table ``(1, 1 + P, D)`` that covers the class
token; the grid is ``config.image_size // config.patch_size`` (``(h, w)`` pairs allowed). The model interpolates
the table only when called with ``interpolate_pos_encoding=True``, so it is read at its built size.
"""

from __future__ import annotations

from vitviz.core.families.hf_base import HFVisionFamily


class HuggingFaceFamily(HFVisionFamily):
    model_types = ("vit",)
