"""Training experiments, a separate corner: CIFAR-10 loading (``data``), the training loop of the reference
models (``train``), exporting their checkpoints and cards (``export``), the hybrid-versus-pure study (``study``)
and its statistics (``compare``). Outside this package only the study figures (``vitviz.plot.compute``, which
draw ``compare``'s curves), the command line and the report import it.
"""
