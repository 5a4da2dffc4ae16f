"""Models to analyse: loading by name or weights file (``models``, ``weights``), the reference architectures
(``reference``) and their shipped checkpoints and cards (``checkpoints/``, ``cards``), the ViT paper's tables
(``tables/``, ``paper``) and sample images (``samples``). The data files travel inside the wheel.
"""
