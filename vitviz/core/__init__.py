"""Model access: the token layout of a model (``spec``), the families that read each kind of ViT
(``families``), attention capture (``capture``), image loading (``images``) and batching (``batching``).

The only layer that touches hooks, flags and devices. Imports nothing from ``analysis``, ``plot``, ``widgets``,
``report``, ``zoo`` or ``experiments``.
"""
