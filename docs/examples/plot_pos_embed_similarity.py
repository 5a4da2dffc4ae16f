"""
Position-embedding similarity
=============================

The ViT paper's Fig. 7 (center): tile ``(r, c)`` shows the cosine similarity between the position embedding of
patch ``(r, c)`` and those of every patch. ``vitviz.plot_pos_embed`` is axes-level: it returns the ``Axes``.
"""

import vitviz

model = vitviz.load_model("cifar10-vit")
print(vitviz.inspect(model))
ax = vitviz.plot_pos_embed(model)

# %%
# One tile, large: the similarity of patch (row 4, column 4) to all patches. Nearby patches are most similar.
ax = vitviz.plot_pos_embed_similarity(vitviz.pos_embed_similarity(model), query=(3, 3))
