"""
Attention rollout
=================

Attention rollout (Abnar & Zuidema 2020), as in the ViT paper's Fig. 6: per layer the heads' mean attention
``W`` becomes ``0.5 W + 0.5 I`` (rows renormalised), the layers are multiplied, and the class token's row over
the patches is drawn over each input. ``vitviz.plot_rollout`` is figure-level: it returns the ``Figure``.
"""

import vitviz
from vitviz.zoo.samples import example_images

model = vitviz.load_model("cifar10-vit")
few = example_images(None, 4)  # CIFAR-10 test images from $VITVIZ_DATA, else scikit-image's photographs
maps = vitviz.attention_rollout(model, few.images)
print(tuple(maps.shape), "= (images, grid rows, grid columns)")
fig = vitviz.plot_rollout(model, few.images, maps=maps, labels=few.labels)
