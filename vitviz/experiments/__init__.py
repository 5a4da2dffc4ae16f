"""Training experiments, a separate corner: CIFAR-10 loading (``data``), the training loop of the reference
models (``train``), exporting their checkpoints and cards (``export``) and the hybrid-versus-pure study
(``study``). Nothing outside this package imports it, except the command line and the report (to read results).
"""
