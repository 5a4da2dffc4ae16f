"""Analyses: tensors in, tensors or arrays out, no matplotlib. Position-embedding similarity (``posembed``),
RGB patch filters (``filters``), attention rollout (``rollout``), gradient-based relevance: Chefer et al.'s rule and
gradient-weighted rollout (``relevance``), attention flow (``flow``), the ``explain`` entry point (``explain``),
perturbation faithfulness (``faithfulness``), mean attention distance (``distance``), FLOP counting (``flops``).
Each cites the paper and equation it implements.
"""
