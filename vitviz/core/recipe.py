"""Which fields of a training recipe (``vitviz.experiments.config.TrainConfig``, a reference card's ``recipe``) say
where and how fast a run ran rather than what it computed; torch-free, for the command lines and the cards alike."""

from __future__ import annotations

__all__ = ["RUNTIME_KEYS"]

RUNTIME_KEYS = ("epochs", "out", "data", "device", "threads", "cache", "compile")
"""``TrainConfig`` fields a resume may change: where things are and how fast they run, not what is computed (the
number of epochs is checked against the schedule apart, the data by its fingerprint)."""
