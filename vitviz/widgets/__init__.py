"""Jupyter explorers (ipywidgets), imported on first use: ``vitviz.explore_attention``, ``vitviz.explore_pos_embed``.

Each explorer is an ``ipywidgets.VBox`` whose controls are plain ipywidgets attributes; it renders the one map on
screen as a PNG in the kernel and sends only those bytes (``explorer.image.value``) to the browser. Clicking a
patch needs ``ipyevents`` (in the ``notebooks`` extra); the sliders do the same without it.
"""

from __future__ import annotations

from vitviz.widgets._base import Explorer, clicks_supported
from vitviz.widgets.attention import AttentionExplorer, explore_attention
from vitviz.widgets.posembed import PosEmbedExplorer, explore_pos_embed

__all__ = ["AttentionExplorer", "Explorer", "PosEmbedExplorer", "clicks_supported", "explore_attention",
           "explore_pos_embed"]
