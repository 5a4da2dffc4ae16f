"""Where each residual block of a ViT lives: one rule for every family (sanity checks, Grad-CAM's target layer)."""

from __future__ import annotations

from torch import nn

from vitviz.core.families import family_of
from vitviz.core.spec import inspect

__all__ = ["block_paths"]


def block_paths(model: nn.Module) -> dict[int, str]:
    """The module path of each residual block, by block index (``ViTSpec.attention_blocks``).

    A block's path is the largest module that holds the attention modules of that block only and parameters of
    the ``blocks`` component only (``vitviz.core.families.Family.param_components``): ``blocks.3`` (timm),
    ``encoder.layers.encoder_layer_3`` (torchvision), ``vit.encoder.layer.3`` (Hugging Face),
    ``visual.transformer.resblocks.3`` (open_clip); parallel branches of one block share it. An attention module that
    is a whole residual block itself (timm ``ParallelScalingBlock``, whose one forward runs attention and MLP) is its
    own block's path. A block no such module can be found for is left out.

    Args:
        model: any ViT ``vitviz.inspect`` reads.

    Returns:
        ``{block index: module path}`` (no trailing dot), in block order.
    """
    spec = inspect(model)
    family = family_of(model)
    real = {id(m): n for n, m in model.named_modules()}  # vitviz's names may index a Sequential by position
    names = [real.get(id(m), n) for n, m in family.attention_modules(model)]
    blocks = list(spec.attention_blocks or range(len(names)))
    block_prefixes = tuple(family.param_components(model).get("blocks", ()))
    params = [n for n, _ in model.named_parameters()]
    out: dict[int, str] = {}
    modules = dict(model.named_modules())
    for i in sorted(set(blocks)):
        parts = names[blocks.index(i)].split(".")
        for k in range(1, len(parts) + 1):
            cand = ".".join(parts[:k]) + "."
            if k == len(parts) and not type(modules.get(cand[:-1])).__name__.endswith("Block"):
                break  # the attention module itself is the block only where it is one (ParallelScalingBlock)
            inside = {b for n, b in zip(names, blocks) if (n + ".").startswith(cand)}
            own = [p for p in params if p.startswith(cand)]
            if inside == {i} and own and block_prefixes and all(p.startswith(block_prefixes) for p in own):
                out[i] = cand[:-1]
                break
    return out
