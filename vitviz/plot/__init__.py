"""vitviz figures (matplotlib): each function draws finished arrays, or a model for the one-call helpers; none
calls ``plt.show()`` or saves (``save_figure`` does).

Seaborn's split: axes-level ``plot_<thing>(data, *, ax=None, ...)`` draw into one ``Axes`` and return it;
figure-level functions lay out several and return the ``Figure``; their names end in ``_grid``, except the ViT
paper's multi-panel ``plot_rollout`` and ``plot_compute_curves`` (``vitviz.plot_level(name)`` says which).
"""

from vitviz.plot.filters import plot_embedding_filters, plot_filter_variance
from vitviz.plot.posembed import plot_pos_embed, plot_pos_embed_similarity
from vitviz.plot.style import plot_level, save_figure, vitviz_style

__all__ = ["plot_embedding_filters", "plot_filter_variance", "plot_level", "plot_pos_embed",
           "plot_pos_embed_similarity", "save_figure", "vitviz_style"]
