"""Which rows of a propagation's matrix a map reads: the rows of the tokens the model's head reads.

``output_rows(spec, token, n)`` turns a call's ``token`` argument into the rows to read: by default those of
``ViTSpec.readout`` (``vitviz.core.families.readout``): one row (the class token of a class-token head), the mean
of the patch rows (``None``: average pooling, models without a class token), or an ``(N,)`` weighting of the rows
(the class and distillation tokens of DeiT-distilled, ``[class, patch mean]``); ``"class"``, ``"patches"`` and an
index pick rows explicitly. ``PoolRows`` reads, during the forward pass, an attention pool's own attention over the
tokens (``Family.readout_attention``), the ``(B, N)`` rows of a readout that depends on the image. Abnar & Zuidema
(2020) and Chefer et al. (2021) read the class row because their models' heads read the class token; these are the
rows of whatever tokens the head reads. ``vitviz.analysis.propagation`` uses them (``rollout_to_maps``,
``query_vectors``, ``propagated_output``).

Shapes: ``B`` batch, ``N`` tokens.
"""

from __future__ import annotations

import contextlib
import operator

import torch

from vitviz.core.families import family_of
from vitviz.core.spec import ViTSpec
from vitviz.errors import CaptureError, InputError, InputTypeError, OutOfRangeError

__all__ = ["TOKEN_NAMES", "PoolRows", "Rows", "output_rows", "output_token"]

Rows = int | torch.Tensor | None  # one row; a weighting (N,) or (B, N) of the rows; None: the mean of the patch rows


class PoolRows:
    """The rows an attention-pool readout reads, per image: its own attention over the tokens it pools.

    Use as a context manager around the forward passes: while open, ``Family.readout_attention`` hooks the pool
    (only for ``token`` ``None`` / ``"readout"`` and a readout with ``pool_attention``); after each forward,
    ``take(n)`` returns that pass's ``(B, N)`` row weights (zeros on the tokens the pool does not see), or ``None``
    when nothing is read (then ``output_rows`` applies).

    Args:
        model: the model.
        spec: ``inspect(model)``.
        token: the caller's ``token`` argument.
    """

    def __init__(self, model: torch.nn.Module, spec: ViTSpec, token: int | str | None) -> None:
        read = spec.readout
        named = token is None or (isinstance(token, str) and token == "readout")
        self.active = named and read.weights_by_pool
        self.model, self.spec = model, spec
        self.seen: list[torch.Tensor] = []
        self._undo = None

    def __enter__(self) -> PoolRows:
        if self.active:
            self._undo = family_of(self.model).readout_attention(self.model, self.seen.append)
            self.active = self._undo is not None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def take(self, n: int) -> torch.Tensor | None:
        """The last forward's ``(B, N)`` row weights (and forget them), or ``None`` when none were read."""
        if not self.active:
            return None
        if not self.seen:
            raise CaptureError(f"{self.spec.name}: the attention pool did not run during the forward pass; call the "
                               "model on images inside the block")
        a = self.seen[-1]
        self.seen.clear()
        idx = self.spec.readout.token_indices(0, n, self.spec.num_prefix_tokens)
        if a.shape[-1] != len(idx):
            raise CaptureError(f"{self.spec.name}: the attention pool attends over {a.shape[-1]} tokens, but the "
                               f"readout names {len(idx)} of the {n} tokens")
        rows = torch.zeros(a.shape[0], n, dtype=a.dtype, device=a.device)
        rows[:, idx] = a
        return rows


TOKEN_NAMES = ("readout", "class", "patches")


def output_rows(spec: ViTSpec, token: int | str | None, n: int) -> Rows:
    """The rows to read for ``token``, as ``rollout_to_maps`` and ``query_vectors`` take them.

    Args:
        spec: the model's layout (``spec.readout`` says which tokens its head reads).
        token: ``None`` or ``"readout"``: the rows the head reads (``ViTSpec.readout``): an int for one token (the
            class token of a class-token head), ``None`` for the mean of the patch rows (average pooling), else an
            ``(N,)`` float64 tensor of row weights (e.g. ``0.5`` on the class and distillation rows); ``"class"``:
            the class token's row whatever the head reads; ``"patches"``: the mean of the patch rows (``None``); an
            int: that token (negative counts from the end).
        n: tokens in the sequence.

    Raises:
        InputError: ``token="class"`` on a model without a class token, or a string that is not a token name.
        InputTypeError, OutOfRangeError: an index that is not an int, or out of range.
    """
    if token is None or (isinstance(token, str) and token == "readout"):
        readout = spec.readout
        if readout.single_token is not None:
            return readout.single_token
        if readout.patch_mean:
            return None
        return readout.weights(n, spec.num_prefix_tokens)
    if isinstance(token, str) and token == "patches":
        return None
    if isinstance(token, str):
        if token != "class":
            raise InputError(f"{spec.name}: token={token!r} is not one of {TOKEN_NAMES}; pass None (the rows the "
                             "head reads), 'class', 'patches' (the mean of the patch rows) or a token index")
        if spec.class_token_index is None:
            raise InputError(f"{spec.name}: token='class' but the model has no class token (prefix tokens: "
                             f"{spec.prefix_tokens or 'none'}); pass token=None for the rows its head reads")
        return spec.class_token_index
    return output_token(spec, token, n)


def output_token(spec: ViTSpec, token: int | str | None, n: int) -> Rows:
    """A single row index ``token`` checked (negative counts from the end); ``None`` or a name: ``output_rows``."""
    if token is None or isinstance(token, str):
        return output_rows(spec, token, n)
    index = None
    if not isinstance(token, bool):
        with contextlib.suppress(TypeError):
            index = operator.index(token)
    if index is None:
        raise InputTypeError(f"{spec.name}: token={token!r} is a {type(token).__name__}, not a token index; pass an "
                             f"integer in {-n} ... {n - 1} (prefix tokens first, then patches row-major), 'class' "
                             "or None")
    token = index
    if not -n <= token < n:
        raise OutOfRangeError(f"{spec.name}: token={token} is out of range for {n} tokens; pass an index in "
                               f"{-n} ... {n - 1} (prefix tokens first, then patches row-major) or None")
    return token % n
