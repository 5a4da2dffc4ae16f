"""Hugging Face ViTMAE encoder (``ViTMAEModel``; the encoder of ``ViTMAEForPreTraining``).

Layout (``ViTMAEEmbeddings``): ``[cls, patches]`` and a fixed 2-D sin-cos table ``(1, 1 + P, D)`` (its class row
is zeros), ``pos_embed_kind="sincos"``.

Random masking: on every call the embeddings shuffle the patch tokens by ``argsort(noise)`` (random noise unless
``noise=`` is passed) and keep the first ``int(P * (1 - config.mask_ratio))``, so the tokens the attention sees are
a random subset in a random order, different for every image. vitviz analyses the model **unmasked and in patch
order**: for the duration of ``capture_attention`` ``config.mask_ratio`` is 0 and, when no ``noise`` is given, the
noise is ``arange(P)`` in float32 (the identity shuffle, exact for any patch count, where the model's own bfloat16
or float16 would round consecutive integers to ties). A ``noise=`` that would reorder the patches is refused with
a ``CaptureError``. Both are restored on exit, so outside the capture the model masks as before. A ``forward`` set
on the embeddings instance, which that would bypass, is refused with ``UnsupportedModelError``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Undo, chain_undos, held_attr, shared_prepare
from vitviz.core.families.hf_base import HFVisionFamily, vision_config
from vitviz.core.families.readout import Readout, default_readout
from vitviz.errors import CaptureError, UnsupportedModelError


class HFViTMAEFamily(HFVisionFamily):
    model_types = ("vit_mae",)
    pos_embed_kind = "sincos"
    # the authors' code normalises with the ImageNet mean and std (timm IMAGENET_DEFAULT_MEAN / _STD)
    authors_mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        """No pooling: the encoder returns every token (explanations read the class token, the default)."""
        return Readout("none", default_readout(prefix_tokens).parts, "ViTMAEModel: no pooler")

    def prepare(self, model: nn.Module) -> Undo:
        """Unmasked and in patch order for the call (see the module's docstring): ``config.mask_ratio`` 0 and the
        embeddings' class forward run with identity noise.

        Raises:
            UnsupportedModelError: the embeddings have a ``forward`` of their own set on the instance, which the
                unmasked forward would bypass (refused before anything is changed).
        """
        emb = self.embeddings(model)
        name = type(model).__name__
        own = vars(emb).get("forward")
        if own is not None and not getattr(own, "__vitviz_probe__", False):  # vitviz's: an enclosing model's set-up
            where = next((n for n, m in model.named_modules() if m is emb), "embeddings")
            raise UnsupportedModelError(
                f"{name}: its {type(emb).__name__} has a forward of its own set on the instance; vitviz reads ViTMAE "
                "unmasked and in patch order by running the class's forward with identity noise, which would bypass "
                f"it and read a model that does not run your code; analyse the model without it (del model.{where}"
                ".forward)")
        undos = [super().prepare(model)]
        config = vision_config(model)
        # held_attr: the config and the embeddings may be another model's too (ViTMAEForPreTraining and its .vit),
        # prepared by a capture of its own that ends in any order
        undos.append(held_attr(config, "mask_ratio", 0.0))
        original = type(emb).forward

        def forward(pixel_values: torch.Tensor, noise: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
            p = emb.patch_embeddings.num_patches if not kwargs.get("interpolate_pos_encoding") else (
                (pixel_values.shape[-2] // emb.patch_embeddings.patch_size[0])
                * (pixel_values.shape[-1] // emb.patch_embeddings.patch_size[1]))
            order = torch.arange(p, device=pixel_values.device)
            if noise is None:
                # float32 whatever the model's dtype: transformers argsorts the noise as given, and in bfloat16
                # (> 256 patches) or float16 (> 2048) consecutive integers round to ties, which argsort reorders
                noise = order.to(torch.float32).expand(pixel_values.shape[0], p)
            elif not torch.equal(torch.argsort(noise, dim=1), order.expand(noise.shape[0], p)):
                raise CaptureError(f"{name}: the noise= passed would shuffle the patch tokens; vitviz reads ViTMAE "
                                   "unmasked and in patch order: call the model without noise= inside the capture")
            return original(emb, pixel_values, noise, *args, **kwargs)

        forward.__vitviz_probe__ = True  # type: ignore[attr-defined]  # vitviz's own, as the probes mark theirs
        undos.append(held_attr(emb, "forward", forward))
        return chain_undos(undos)

    def lrp_rules(self, model: nn.Module, rules: Any, emit: Any) -> Undo:
        """AttnLRP on the encoder read as the capture reads it: unmasked, in patch order (``prepare``), for the call.
        ``ViTMAEForPreTraining`` (its decoder reconstructs pixels) is refused: explain its encoder, ``model.vit``."""
        if isinstance(getattr(model, "decoder", None), nn.Module):
            raise UnsupportedModelError(f"{type(model).__name__}: AttnLRP is not available for the pre-training model "
                                        "(its decoder reconstructs the masked pixels); explain its encoder, model.vit "
                                        "(a ViTMAEModel, the same weights), with a callable target")
        unmasked = shared_prepare(self, model)
        try:
            return chain_undos([unmasked, super().lrp_rules(model, rules, emit)])
        except BaseException:
            unmasked()
            raise

    def token_drop_module(self, model: nn.Module) -> nn.Module | None:
        return None

    def token_drop_refusal(self, model: nn.Module) -> str:
        return f"{type(model).__name__} (Hugging Face) shuffles and masks its patch tokens at random on every call"
