"""
Mean attention distance
=======================

The ViT paper's Fig. 7 (right) and Fig. 11: for every head, the distance in pixels between a query patch and
the patches it attends to, weighted by attention and averaged over queries and images; one dot per head per
layer. Here 32 images instead of the paper's 128, so that the example runs in seconds.
"""

import vitviz
from vitviz.zoo.samples import example_images

images = example_images(None, 32).images
vit = vitviz.load_model("cifar10-vit")
hybrid = vitviz.load_model("cifar10-hybrid")
distances = {"ViT": vitviz.mean_attention_distance(vit, images),
             "Hybrid": vitviz.mean_attention_distance(hybrid, images)}
for name, d in distances.items():
    print(f"{name}: first layer {float(d[0].mean()):.1f} px, last layer {float(d[-1].mean()):.1f} px (head means)")
fig = vitviz.plot_attention_distance_grid(distances)
