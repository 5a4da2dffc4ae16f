"""vitviz figures (matplotlib): each function draws finished arrays, or a model for the one-call helpers, and
returns the ``Figure`` or ``Axes``; none calls ``plt.show()`` or saves (``save_figure`` does)."""

from vitviz.plot.filters import plot_embedding_filters, plot_filter_variance
from vitviz.plot.posembed import plot_pos_embed, plot_pos_embed_similarity
from vitviz.plot.style import save_figure, vitviz_style

__all__ = ["plot_embedding_filters", "plot_filter_variance", "plot_pos_embed", "plot_pos_embed_similarity",
           "save_figure", "vitviz_style"]
