"""Where a timm block keeps its attention: one module (``blocks.{i}.attn``), one per parallel branch
(``ParallelThingsBlock``: ``blocks.{i}.attns.{j}.attn``), or the block itself (ViT-22B's ``ParallelScalingBlock``
and ``DiffParallelScalingBlock``, whose one ``in_proj`` makes the MLP's input and q, k, v). Read by the timm families
(capture) and by timm's AttnLRP installer."""

from __future__ import annotations

from torch import nn

SCALING_BLOCKS = ("ParallelScalingBlock", "DiffParallelScalingBlock")


def attention_of(block: nn.Module, i: int) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of each attention in ``blocks.{i}`` (none for a block without one)."""
    if hasattr(block, "attns"):  # ParallelThingsBlock: nn.Sequential(norm, attn, ls, drop_path) per branch
        return [(f"blocks.{i}.attns.{j}.attn", branch.attn) for j, branch in enumerate(block.attns)]
    if type(block).__name__ in SCALING_BLOCKS:
        return [(f"blocks.{i}", block)]
    attn = getattr(block, "attn", None)
    return [(f"blocks.{i}.attn", attn)] if isinstance(attn, nn.Module) else []
