"""The small CIFAR-10 models vitviz trains itself and ships as its embedded defaults.

Every model is built from timm parts (``VisionTransformer``, ``HybridEmbed``, ``BasicBlock``), so every vitviz
analysis applies to them unchanged. Shapes: ``B`` batch, ``N`` tokens, ``D`` embedding width.

==================  ==========================================================================================
name                architecture
==================  ==========================================================================================
cifar10-vit         ViT, 32x32 input, patch 4 (8x8 grid), class token, learned 1-D position embedding
cifar10-vit-1dpos   the same architecture, trained with the ablation's shared recipe and budget: the 1-D control
                    of the two models below (so cifar10-vit itself can be trained for longer)
cifar10-vit-nopos   the same ViT without any position embedding (paper Table 8, "No Pos. Emb.")
cifar10-vit-2dpos   the same ViT with a 2-D embedding: row and column tables of width D/2, concatenated
                    (paper App. D.4); exposed as a full ``(1, N, D)`` ``pos_embed`` tensor
cifar10-hybrid      a small ResNet stem (stride 4, 8x8 feature map) feeding the same transformer at patch 1
cifar10-resnet      a ResNet baseline of similar compute, for the hybrid-versus-pure study
==================  ==========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from timm.layers import HybridEmbed, trunc_normal_
from timm.models.resnet import BasicBlock
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vitviz.errors import InputError, NoSuchAttributeError, UnknownNameError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_INPUT = (3, 32, 32)  # (C, H, W) of every reference model's input


def cifar10_pretrained_cfg(name: str) -> dict[str, Any]:
    """A timm-style ``pretrained_cfg`` so ``resolve_data_config`` preprocesses images for the CIFAR-10 models."""
    return {
        "architecture": name,
        "input_size": CIFAR10_INPUT,
        "fixed_input_size": True,
        "interpolation": "bilinear",
        "crop_pct": 1.0,
        "crop_mode": "center",
        "mean": CIFAR10_MEAN,
        "std": CIFAR10_STD,
        "num_classes": 10,
        "label_names": list(CIFAR10_CLASSES),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }


class VisionTransformer2DPos(VisionTransformer):
    """timm ``VisionTransformer`` with the paper's 2-D position embedding (App. D.4).

    Patch (r, c) gets ``concat(row_embed[r], col_embed[c])``, each of width ``D/2``; the class token gets its own
    learned ``D``-wide vector. ``pos_embed`` is a read-only property that assembles the full ``(1, N, D)`` tensor
    (prefix first, row-major patches), so timm's forward and every vitviz analysis see an ordinary embedding.
    """

    pos_embed_kind = "learned-2d"

    def __init__(self, **kwargs: Any) -> None:
        kwargs["pos_embed"] = "none"
        super().__init__(**kwargs)
        embed_dim = self.embed_dim
        if embed_dim % 2:
            raise InputError(f"2-D position embedding needs an even embed_dim, got {embed_dim}")
        gh, gw = self.patch_embed.grid_size
        self.pos_embed_prefix = nn.Parameter(torch.zeros(1, self.num_prefix_tokens, embed_dim))
        self.pos_embed_row = nn.Parameter(torch.zeros(1, gh, embed_dim // 2))
        self.pos_embed_col = nn.Parameter(torch.zeros(1, gw, embed_dim // 2))
        for p in (self.pos_embed_prefix, self.pos_embed_row, self.pos_embed_col):
            trunc_normal_(p, std=0.02)

    @property
    def pos_embed(self) -> torch.Tensor | None:  # type: ignore[override]
        row = self.__dict__.get("_parameters", {}).get("pos_embed_row")
        if row is None:  # during VisionTransformer.__init__, before the tables exist
            return None
        col = self._parameters["pos_embed_col"]
        gh, gw = row.shape[1], col.shape[1]
        grid = torch.cat(
            [row[:, :, None, :].expand(-1, gh, gw, -1), col[:, None, :, :].expand(-1, gh, gw, -1)], dim=-1
        ).reshape(1, gh * gw, -1)
        return torch.cat([self._parameters["pos_embed_prefix"], grid], dim=1)

    @pos_embed.setter
    def pos_embed(self, value: Any) -> None:
        if value is not None:
            raise NoSuchAttributeError("VisionTransformer2DPos.pos_embed is derived from pos_embed_row/pos_embed_col")

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed_prefix", "pos_embed_row", "pos_embed_col", "cls_token"}


def _conv_bn_relu(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


def _stage(cin: int, cout: int, blocks: int, stride: int) -> nn.Sequential:
    layers = []
    for i in range(blocks):
        downsample = None
        if i == 0 and (stride != 1 or cin != cout):
            downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        layers.append(BasicBlock(cin if i == 0 else cout, cout, stride=stride if i == 0 else 1, downsample=downsample))
    return nn.Sequential(*layers)


class ResNetStem(nn.Sequential):
    """CIFAR ResNet stem: a 3x3 conv then residual stages (timm ``BasicBlock``); stride ``2 ** (len(widths) - 1)``.

    ``widths=(32, 64, 128)`` maps ``(B, 3, 32, 32)`` to ``(B, 128, 8, 8)``. The first module is the RGB conv
    whose filters ``plot_embedding_filters`` shows for hybrids.
    """

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), blocks: int = 1) -> None:
        layers: list[nn.Module] = [_conv_bn_relu(3, widths[0], 1)]
        layers.append(_stage(widths[0], widths[0], blocks, 1))
        for cin, cout in zip(widths[:-1], widths[1:]):
            layers.append(_stage(cin, cout, blocks, 2))
        super().__init__(*layers)
        self.num_features = widths[-1]


class CifarResNet(nn.Module):
    """ResNet baseline for 32x32 inputs: ``ResNetStem`` then global average pooling and a linear classifier."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), blocks: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = ResNetStem(widths, blocks)
        self.num_classes = num_classes
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x).mean(dim=(2, 3)))


@dataclass(frozen=True)
class ReferenceModel:
    """A named model definition: ``build()`` returns a fresh, randomly initialised module."""

    name: str
    description: str
    factory: Callable[..., nn.Module]
    kwargs: dict[str, Any] = field(default_factory=dict)
    # CIFAR-10 test top-1 (%) the shipped checkpoint is meant to reach; None for the ablation models, which are held
    # to their control's budget instead of an accuracy.
    floor: float | None = None
    # The model whose recipe and budget this one must share for a fair comparison (the 1-D control of the ablation).
    control: str | None = None

    def build(self, **overrides: Any) -> nn.Module:
        model = self.factory(**{**self.kwargs, **overrides})
        model.pretrained_cfg = cifar10_pretrained_cfg(self.name)
        model.default_cfg = model.pretrained_cfg
        return model


# The transformer every CIFAR-10 ViT variant shares (0.46M parameters with the 8x8 grid).
VIT_SMALL = dict(img_size=32, num_classes=10, embed_dim=96, depth=6, num_heads=3, mlp_ratio=2.0)


def cifar_vit(*, patch_size: int = 4, pos: str = "learn", **kwargs: Any) -> nn.Module:
    """Pure ViT for 32x32 inputs. ``pos`` is ``"learn"`` (1-D), ``"none"`` or ``"2d"``."""
    args = {**VIT_SMALL, **kwargs, "patch_size": patch_size}
    if pos == "2d":
        return VisionTransformer2DPos(**args)
    return VisionTransformer(pos_embed=pos, **args)


def cifar_hybrid(*, stem_widths: tuple[int, ...] = (32, 64, 128), stem_blocks: int = 1, **kwargs: Any) -> nn.Module:
    """ResNet stem (stride 4, 8x8 features) + the transformer at patch 1, through timm's ``HybridEmbed``."""
    args = {**VIT_SMALL, **kwargs, "patch_size": 1}
    embed = partial(HybridEmbed, backbone=ResNetStem(stem_widths, stem_blocks))
    return VisionTransformer(embed_layer=embed, **args)


REFERENCE_MODELS: dict[str, ReferenceModel] = {
    m.name: m
    for m in [
        ReferenceModel("cifar10-vit", "ViT, patch 4 (8x8 grid), class token, learned 1-D position embedding",
                       cifar_vit, floor=78.0),
        ReferenceModel("cifar10-vit-1dpos", "cifar10-vit's architecture trained with the ablation's shared recipe "
                       "and budget: the 1-D control of cifar10-vit-nopos and cifar10-vit-2dpos", cifar_vit),
        ReferenceModel("cifar10-vit-nopos", "cifar10-vit without a position embedding", cifar_vit, {"pos": "none"},
                       control="cifar10-vit-1dpos"),
        ReferenceModel("cifar10-vit-2dpos", "cifar10-vit with a learned 2-D (row/column) position embedding",
                       cifar_vit, {"pos": "2d"}, control="cifar10-vit-1dpos"),
        ReferenceModel("cifar10-hybrid", "ResNet stem (stride 4) + the cifar10-vit transformer at patch 1",
                       cifar_hybrid, floor=82.0),
        ReferenceModel("cifar10-resnet", "ResNet baseline (4 stages, widths 32-256)", CifarResNet, floor=82.0),
    ]
}


def build_reference(name: str, **overrides: Any) -> nn.Module:
    """Build the reference architecture ``name`` with random weights (see ``REFERENCE_MODELS``)."""
    try:
        return REFERENCE_MODELS[name].build(**overrides)
    except KeyError:
        known = ", ".join(REFERENCE_MODELS)
        raise UnknownNameError(f"unknown reference model {name!r}; known: {known}") from None


# reference architecture -> family label used in every figure (the study's and the cards' tables draw alike)
FAMILY_LABELS: dict[str, str] = {
    "cifar10-vit": "Transformer (ViT)",
    "cifar10-hybrid": "Hybrid",
    "cifar10-resnet": "ResNet",
}
