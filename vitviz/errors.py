"""Every error class vitviz raises, in one place.

All derive from ``VitvizError``; each also derives from the built-in exception a caller would expect
(``TypeError`` for a model of the wrong kind, ``ValueError`` for bad input, ``RuntimeError`` for a failure while
running), so ``except ValueError`` keeps working. Messages name the model or argument, the value, and the fix.
"""

from __future__ import annotations

import argparse


class VitvizError(Exception):
    """Base class of vitviz errors; messages name the model, what was found and the fix."""


class NotAViTError(VitvizError, TypeError):
    """The model is not a Vision Transformer vitviz can read."""


class UnsupportedModelError(NotAViTError):
    """A ViT vitviz recognises but cannot read correctly; the message names the model class and the reason.

    Raised instead of returning a silently wrong answer (for example windowed attention, or attention that is
    not a row-stochastic map over the tokens).
    """


class InputError(VitvizError, ValueError):
    """A bad argument to a public call; the message names the argument, the value and the fix."""


class ImageInputError(InputError):
    """An image the model cannot take; the message names the sizes and the fix."""


class LayerSelectError(InputError, IndexError):
    """A layer selector that picks no valid attention layer (a bool, a float, an empty list, an index out of
    range, a pattern that matches nothing); also an ``IndexError``, as ``list[index]`` would raise."""


class CaptureError(VitvizError, RuntimeError):
    """Attention could not be captured (no forward ran, or a layer produced no map)."""


class NoPositionEmbeddingError(VitvizError, ValueError):
    """The model has no absolute position embedding table (none at all, or rotary)."""


class NoRGBFiltersError(VitvizError, ValueError):
    """The model has no convolution over RGB pixels whose filters could be shown."""


class CheckpointError(VitvizError, ValueError):
    """A checkpoint file is missing, corrupt, or does not fit the model."""


class WeightsUnavailableError(VitvizError, RuntimeError):
    """Pretrained weights cannot be had (offline, or no such weights)."""


class MissingDependencyError(VitvizError, ImportError):
    """An optional package a call needs is not installed; the message names the pip extra that brings it."""


class RunInterrupted(VitvizError):
    """Raised by a training step callback to stop a run where it is (tests use it to simulate a kill mid-epoch);
    the last complete checkpoint stays, and ``--resume`` continues from it. Also raised by a parallel study
    (``vitviz.experiments.study.run_parallel``) when a worker did not finish: its finished runs are kept, and the
    same command run again resumes."""


class InputTypeError(InputError, TypeError):
    """An argument of the wrong type; also a ``TypeError``. The message names the argument, the type and the fix."""


class OutOfRangeError(InputError, IndexError):
    """An index (token, query patch, layer) outside its range; also an ``IndexError``."""


class UnknownNameError(InputError, KeyError):
    """A name (reference model, column, method) vitviz does not know; also a ``KeyError``. The message lists the
    known names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class DataNotFoundError(InputError, FileNotFoundError):
    """A data file or folder that is not there (a dataset root, a paper table, a card); also a
    ``FileNotFoundError``. The message names the path and where the data is expected."""


class ComputeError(VitvizError, RuntimeError):
    """A computation that cannot go on in the state it finds (an unfinished training run, a score without a
    gradient)."""


class NotImplementedInVitviz(VitvizError, NotImplementedError):
    """An abstract method a subclass (a ``Family``, a dataset reduction, a widget) must implement."""


class NoSuchAttributeError(VitvizError, AttributeError):
    """An attribute that does not exist (``vitviz.<name>``, a widget control); also an ``AttributeError``, so
    ``hasattr`` and ``getattr(..., default)`` keep working."""


class InferenceTensorError(InputError, RuntimeError):
    """A gradient analysis of a model whose parameters or buffers are inference tensors (made or loaded inside
    ``torch.inference_mode()``): autograd cannot save them for a backward pass. The message names the tensor and
    the fix (load the model outside inference mode, or clone its tensors)."""


class OptionValueError(InputError, argparse.ArgumentTypeError):
    """A command-line option's value that is not valid (``--epochs 0``, ``--seeds a,b``), raised by an argparse
    ``type``; also an ``argparse.ArgumentTypeError``, so argparse prints it after the option's name and exits with
    its usage error, and a ``ValueError`` for a caller of the parser function itself."""


class ImageRangeWarning(VitvizError, UserWarning):
    """Images whose values lie far outside a normalised image's range (0-255 pixels given as floats, say), or that
    hold no negative value and none above 1 for a model whose preprocessing normalises (pixels in [0, 1] from
    ``ToTensor()`` without ``Normalize``): the maps would describe another input. A warning, not an error: a model
    that normalises its own input takes such values. The message names the range found and the fix."""


class ResampledPositionsWarning(VitvizError, UserWarning):
    """A weights file whose position table was trained for another grid than the model's ``img_size``: timm's loader
    resampled it (bicubic), so the model runs, and the position-embedding figures show the resampled table, not the
    trained one. A warning, not an error: fine-tuning at a new resolution does just this. The message names both grids
    and the ``img_size`` that reads the table as trained."""


class ResampledKernelWarning(VitvizError, UserWarning):
    """A weights file whose patch-embedding kernel was trained for another patch size than the model's: timm's loader
    resized it (FlexiViT's pseudo-inverse resize, Beyer et al., CVPR 2023), so the model runs, but its patch
    embedding approximates the trained one and the RGB filters figure shows the resized kernel. A warning, not an
    error: FlexiViT-style models are loaded so on purpose. The message names both patch sizes and the
    ``patch_size`` that reads the kernel as trained."""


class ImagesLeftOutWarning(VitvizError, UserWarning):
    """A ``DataLoader`` that leaves some of its dataset's images unread (``drop_last=True`` and a last batch short of
    its batch size): a dataset result over it covers fewer images than the dataset holds. A warning, not an error:
    the loader may be meant so. The message names how many images are left out and the fix."""


class CompletenessWarning(VitvizError, UserWarning):
    """Integrated gradients whose quadrature has not converged: on some image the attributions miss ``F(x) - F(x')``
    (completeness, Sundararajan et al., ICML 2017, Prop. 1) by more than 5% of it. A warning, not an error: the maps
    are the requested approximation. The message names the error, the image, ``n_steps`` and the fix (more steps)."""


class UncheckedImagesWarning(VitvizError, UserWarning):
    """Two results paired image by image (few-shot draws of two models at one seed) from tables that do not say
    which images they were computed on (no ``train_digest``/``test_digest``: tables written before vitviz recorded
    them, or images vitviz cannot name): they are paired by their image counts, which cannot tell two sets of one
    size apart. The message names the models and the fix (measure them again to record the digests)."""


class ForwardStopped(VitvizError):
    """Raised by a vitviz hook to end a forward pass once it has read what it needs (the input of a model's
    classifier, ``read_input_of``); caught where it is raised, never seen by callers."""


__all__ = [
    "CaptureError", "CheckpointError", "CompletenessWarning", "ComputeError", "DataNotFoundError", "ForwardStopped",
    "ImageInputError", "ImageRangeWarning", "ImagesLeftOutWarning", "InferenceTensorError", "InputError",
    "InputTypeError", "LayerSelectError", "MissingDependencyError",
    "NoPositionEmbeddingError", "NoRGBFiltersError", "NoSuchAttributeError", "NotAViTError",
    "NotImplementedInVitviz", "OptionValueError", "OutOfRangeError", "ResampledKernelWarning",
    "ResampledPositionsWarning", "RunInterrupted", "UncheckedImagesWarning",
    "UnknownNameError",
    "UnsupportedModelError", "VitvizError", "WeightsUnavailableError",
]
