"""Analyses: tensors in, tensors or arrays out, no matplotlib. Position-embedding similarity (``posembed``),
RGB patch filters (``filters``), attention rollout and gradient rollout (``rollout``), mean attention distance
(``distance``), FLOP counting (``flops``). Each cites the paper and equation it implements.
"""
