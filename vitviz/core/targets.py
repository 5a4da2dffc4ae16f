"""What a relevance map explains: ``target=``, resolved in one place for every gradient-based method.

``target`` may be

- ``None``: each image's predicted class (the arg-max of the model's logits);
- an ``int``: that class index for every image;
- a list / tuple / 1-D integer tensor or array of class indices, one per image (its length must equal the number
  of images);
- a callable ``f(output) -> (B,)``: any scalar per image computed from the model's *raw* output (a tensor, a
  tuple, or a Hugging Face ``ModelOutput``), for example the cosine similarity of a CLIP or DINOv2 embedding to a
  given embedding, or the norm of a feature. This is how headless models (``num_classes=0`` feature extractors,
  DINOv2, CLIP / SigLIP vision towers) are explained.

Class indices must be integers (``1.7`` and ``True`` are refused) in ``[0, classes)``. The logits are the model's
output tensor, or ``output.logits`` (Hugging Face), or the first element of a tuple output; a model without a
classifier head needs a callable target. A model known to be headless is refused for a class target even where its
output is a 2-D tensor (``logits_of``): timm with ``num_classes=0`` or a weightless classifier, open_clip towers and
CLIP models (the image embedding), torchvision ``VisionTransformer`` whose ``heads`` hold no Linear layer. Any other
2-D output, a hand-written model's included, is read as ``(B, classes)`` logits.

A score that is not finite (a callable's NaN, an infinite logit) is not read to be refused: the gradient methods
read no value between their forward and backward passes, so that on a GPU the host stays ahead
(``tests/test_gradient_host_path.py``). The maps follow its gradient: that image's map is NaN (and its whole
batch's where the callable lets the NaN into the other images' gradients, as ``torch.where(c, s * nan, s)`` does:
its backward multiplies the unused branch's NaN by 0), a map that cannot pass for a real one and that
``vitviz.faithfulness`` (the maps' ranks) and the sanity checks refuse or report as NaN. Return a finite score per
image.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.contexts import normal_tensor
from vitviz.errors import InputError

__all__ = ["Target", "ResolvedTarget", "logits_of", "resolve_target"]

Target = None | int | Sequence[int] | torch.Tensor | np.ndarray | Callable[[Any], torch.Tensor]


@dataclass
class ResolvedTarget:
    """``target`` applied to one batch of outputs.

    Attributes:
        scores: ``(b,)`` the scalar each image's map explains, still in the autograd graph (the target logit, or
            the callable's value).
        classes: ``(b,)`` long class indices, or ``None`` for a callable target.
        logits: ``(b, classes)`` logits, or ``None`` for a callable target.
    """

    scores: torch.Tensor
    classes: torch.Tensor | None
    logits: torch.Tensor | None


def _fix(value: Any) -> str:
    return ("pass target=None (each image's predicted class), an int class index, one int per image, or a "
            "callable f(output) -> (B,) scores (e.g. cosine similarity of an embedding to a given one)")


def _linear_like(module: nn.Module) -> bool:
    """An ``nn.Linear`` or a stand-in for one (``quantize_dynamic``'s ``Linear``, a ``NormLinear``...)."""
    return isinstance(module, nn.Linear) or type(module).__name__.endswith("Linear")


def _headless(model: nn.Module | None) -> str | None:
    """Why ``model`` is known to have no classifier head although its output may be a ``(B, D)`` tensor, or None.

    Recognised without importing the libraries: timm's ``num_classes=0`` (and a classifier replaced by a weightless
    module with no Linear layer, e.g. ``nn.Identity()``), every open_clip model (its vision tower ``VisionTransformer``
    returns the image embedding after ``proj``; a whole ``CLIP`` model's ``model(images)`` its image features), and
    a torchvision ``VisionTransformer`` whose ``heads`` hold no Linear layer (``nn.Identity()``, an empty
    ``nn.Sequential``: the output is the class token's feature)."""
    if model is None:
        return None
    if getattr(model, "num_classes", None) == 0:
        return "num_classes=0"
    mro = type(model).__mro__
    if any(c.__module__.split(".")[0] == "open_clip" for c in mro):
        dim = getattr(model, "output_dim", None) or getattr(getattr(model, "visual", None), "output_dim", None)
        return ("an open_clip model: its output is the " + (f"{dim}-dimensional " if dim else "") +
                "image embedding, not logits")
    if any(c.__name__ == "VisionTransformer" and c.__module__ == "torchvision.models.vision_transformer" for c in mro):
        heads = getattr(model, "heads", None)
        if isinstance(heads, nn.Module) and not any(_linear_like(m) for m in heads.modules()):
            return (f"torchvision's heads is {type(heads).__name__} with no Linear layer: its output is the "
                    "class token's feature, not logits")
    if type(model).__module__.split(".")[0] == "timm" and callable(getattr(model, "get_classifier", None)):
        try:
            heads = model.get_classifier()
        except (AttributeError, NotImplementedError):  # a get_classifier that cannot answer: read by its output
            return None
        heads = heads if isinstance(heads, (tuple, list)) else (heads,)
        if heads and all(isinstance(h, nn.Module) and next(h.parameters(), None) is None
                         and not any(_linear_like(m) for m in h.modules()) for h in heads):
            return (f"timm's classifier is {type(heads[0]).__name__} with no weights: its output is the pooled "
                    "feature, not logits")
    return None


def logits_of(output: Any, model: nn.Module | None = None, what: str = "target") -> torch.Tensor:
    """The ``(B, classes)`` logits in a model's output (tensor, ``.logits``, or a tuple's first element).

    A model vitviz knows to be headless is refused whatever its output's shape (``_headless``): timm with
    ``num_classes=0`` or a weightless classifier, open_clip towers and CLIP models (the image embedding), and
    torchvision ``VisionTransformer`` whose ``heads`` hold no Linear layer. Any other model whose output (or
    ``.logits``, or a tuple's first element) is 2-D, a hand-written model included, is read as ``(B, classes)``
    logits: vitviz cannot tell an embedding from logits by their shape, so a hand-written feature extractor needs a
    callable ``target``.

    Raises:
        InputError: the model has no classifier head (see above, or an output without logits); the message says to
            pass a callable ``target``.
    """
    name = type(model).__name__ if model is not None else "the model"
    why = _headless(model)
    if why is not None:
        raise InputError(f"{what} names a class, but {name} has no classifier head ({why}); pass a callable "
                         f"{what}=lambda out: ... returning one score per image (e.g. the cosine similarity of the "
                         "embedding to a given embedding), or use a model with a classifier head")
    logits = getattr(output, "logits", output)
    if isinstance(logits, (tuple, list)) and logits:
        logits = logits[0]
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(output).__name__
        raise InputError(f"{what} names a class, but the output of {name} holds no (B, classes) logits (got {got}); "
                         f"pass a callable {what}=lambda out: ... returning one score per image from the raw output "
                         "(e.g. cosine similarity of out.pooler_output or out.image_embeds to a given embedding)")
    return logits


def _class_indices(target: Any, n_images: int) -> torch.Tensor | None:
    """Validate class indices (not their range) and return them as ``(n,)`` long, or ``None`` for ``target=None``."""
    if target is None:
        return None
    if isinstance(target, (bool, np.bool_)):
        raise InputError(f"target={target!r} is a bool, not a class index; {_fix(target)}")
    if isinstance(target, numbers.Integral):
        return torch.full((n_images,), int(target), dtype=torch.long)
    if isinstance(target, numbers.Number):
        raise InputError(f"target={target!r} is not an integer class index; {_fix(target)}")
    if isinstance(target, (torch.Tensor, np.ndarray)):
        t = torch.as_tensor(target)
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise InputError(f"target must hold integer class indices, got a {t.dtype} tensor {t.tolist()!r}; "
                             f"{_fix(target)}")
        if t.ndim == 0:
            return torch.full((n_images,), int(t), dtype=torch.long)
        if t.ndim != 1:
            raise InputError(f"target must be 1-D (one class index per image), got shape {tuple(t.shape)}; "
                             f"{_fix(target)}")
        items = t.long()
    elif isinstance(target, (list, tuple)):
        bad = [v for v in target if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral)]
        if bad:
            raise InputError(f"target must hold integer class indices, but {bad[0]!r} in target={list(target)!r} is "
                             f"not one; {_fix(target)}")
        items = torch.tensor([int(v) for v in target], dtype=torch.long)
    else:
        raise InputError(f"target={target!r} ({type(target).__name__}) is not understood; {_fix(target)}")
    if len(items) != n_images:
        raise InputError(f"target holds {len(items)} class indices but there are {n_images} images; give one per "
                         "image, or a single int for all of them")
    return items


def resolve_target(
    target: Target,
    output: Any,
    *,
    start: int = 0,
    n_images: int | None = None,
    model: nn.Module | None = None,
) -> ResolvedTarget:
    """The scalar per image that a gradient-based map explains, for one batch of the model's output.

    Args:
        target: see the module docstring.
        output: the model's raw output for a batch of ``b`` images.
        start: the batch's offset in the whole image set (a per-image list is sliced ``[start:start + b]``).
        n_images: the size of the whole image set (a per-image list must have this length); default ``b``.
        model: the model (its class name goes into messages; a model known to be headless, see ``logits_of``, is
            refused for class targets).

    Returns:
        ``ResolvedTarget`` with ``scores`` ``(b,)`` in the autograd graph, and ``classes`` / ``logits`` for class
        targets.

    Raises:
        InputError: a non-integer or out-of-range class, a list of the wrong length, a callable that does not
            return one scalar per image, or a class target on a model without logits.
    """
    if callable(target) and not isinstance(target, (torch.Tensor, np.ndarray)):
        scores = target(output)
        name = getattr(target, "__name__", type(target).__name__)
        if not isinstance(scores, torch.Tensor):
            raise InputError(f"target={name} returned {type(scores).__name__}; a callable target must return a "
                             "(B,) tensor, one score per image, computed from the model output with torch ops")
        b = _batch_size(output)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if scores.ndim != 1 or (b is not None and scores.shape[0] != b):
            raise InputError(f"target={name} returned shape {tuple(scores.shape)}; a callable target must return "
                             f"one score per image, shape ({b if b is not None else 'B'},)")
        return ResolvedTarget(scores=scores, classes=None, logits=None)
    logits = logits_of(output, model)
    b, classes = logits.shape
    total = b if n_images is None else n_images
    chosen = _class_indices(target, total)
    if chosen is None:
        idx = logits.detach().argmax(dim=-1)
    else:
        if int(chosen.min()) < 0 or int(chosen.max()) >= classes:
            bad = chosen[(chosen < 0) | (chosen >= classes)][0].item()
            name = type(model).__name__ if model is not None else "the model"
            raise InputError(f"target={bad} is out of range: {name} has {classes} classes; give class indices in "
                             f"0 ... {classes - 1}")
        idx = chosen[start:start + b]
        if len(idx) != b:
            raise InputError(f"target has {len(chosen)} class indices but the batch at image {start} has {b} images")
        idx = normal_tensor(idx.to(logits.device))  # a target made in inference mode: gather saves it for backward
    scores = logits.gather(1, idx[:, None])[:, 0]
    return ResolvedTarget(scores=scores, classes=idx, logits=logits)


def _batch_size(output: Any) -> int | None:
    for value in ([output] if isinstance(output, torch.Tensor) else
                  list(output.values()) if hasattr(output, "values") else
                  list(output) if isinstance(output, (tuple, list)) else []):
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            return int(value.shape[0])
    return None
