"""
AttnLRP at the tokens and at the pixels
=======================================

``vitviz.attnlrp`` reads the relevance where the tokens enter the first block (one value per patch, the maps
``vitviz.explain`` and the faithfulness tests use) or, with ``read_at="pixels"``, carries it on through the patch
convolution to the image (``linear_rule="gamma"`` there, lxt's recommendation for ViTs). AttnLRP is signed:
``signed=True`` draws each map alone on a diverging scale, red for evidence for the class, blue against it.
"""

import vitviz
from vitviz.zoo.samples import example_images

model = vitviz.load_model("cifar10-vit")
few = example_images(None, 3)
maps = {
    "tokens": vitviz.attnlrp(model, few.images),
    "pixels": vitviz.attnlrp(model, few.images, read_at="pixels"),
    "pixels, gamma": vitviz.attnlrp(model, few.images, read_at="pixels", linear_rule="gamma"),
}
fig = vitviz.plot_explanations_grid(model, few.images, maps, labels=few.labels, signed=True)
