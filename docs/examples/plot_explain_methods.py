"""
Explanation methods side by side
================================

``vitviz.explain`` runs every method through one interface: attention rollout, gradient-weighted rollout,
Chefer et al.'s relevance, and a random baseline. Each map is divided by its maximum;
``vitviz.plot_explanations_grid`` draws one row per image.
"""

import vitviz
from vitviz.zoo.samples import example_images

model = vitviz.load_model("cifar10-vit")
few = example_images(None, 3)
methods = ("rollout", "grad_rollout", "chefer", "random")
maps = {m: vitviz.explain(model, few.images, m) for m in methods}
fig = vitviz.plot_explanations_grid(model, few.images, maps, labels=few.labels)
