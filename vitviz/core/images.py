"""Images in: normalised tensors, PIL images, ``HxWx3`` uint8 arrays (or ``BxHxWx3`` batches of them) or file paths
-> ``(B, 3, H, W)``.

Raw images (PIL, arrays, paths) are preprocessed with the model's own data config (timm's
``resolve_data_config`` + ``create_transform``; torchvision and Hugging Face models get their usual
preprocessing); grayscale and RGBA are converted to RGB. Tensors are taken as already normalised. The batches of a
``Dataset`` or ``DataLoader`` are made and read here too (``collate_images``, ``read_batches``): items that make no
batch (PIL images, images of several shapes) are refused naming the fix.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import IterableDataset, default_collate

from vitviz.core.families import family_of
from vitviz.core.spec import ViTSpec, inspect
from vitviz.errors import ImageInputError, ImageRangeWarning, NotAViTError

ImageLike = Any  # torch.Tensor | PIL.Image.Image | np.ndarray | str | os.PathLike
Images = ImageLike | Sequence[ImageLike]

_CHANNELS = (1, 3, 4)


def image_list(images: Images, argument: str = "images") -> torch.Tensor | list[ImageLike]:
    """The one rule for what ``images`` holds: a ``(B, ...)`` tensor (a ``(3, H, W)`` tensor gains the batch
    axis) or a list of single images. A list or tuple is listed, a ``(B, H, W, C)`` array (``C`` 1, 3 or 4: the
    layout of ``np.stack(images)`` and of CIFAR's ``.data``) is its ``B`` images, anything else is one image.

    Raises:
        ImageInputError: a 4-D array laid out channel-first, ``(B, C, H, W)``, or with no channel axis vitviz
            knows (the message names the shape and the transpose that fixes it).
    """
    if isinstance(images, torch.Tensor):
        return images.unsqueeze(0) if images.ndim == 3 else images
    if isinstance(images, np.ndarray) and images.ndim == 4:
        if images.shape[-1] in _CHANNELS:
            return list(images)
        fix = (
            "it looks channel-first: pass arr.transpose(0, 2, 3, 1)" if images.shape[1] in _CHANNELS
            else "its last axis must be the colour channels (1, 3 or 4)"
        )
        raise ImageInputError(
            f"{argument}: a 4-D image array of shape {images.shape} is read as a (B, H, W, C) batch, and {fix}; "
            "normalised float batches go in as tensors (torch.from_numpy(arr))"
        )
    return list(images) if isinstance(images, (list, tuple)) else [images]


def spec_or_none(model: nn.Module) -> ViTSpec | None:
    """``inspect(model)``; ``None`` for a non-ViT with a timm-style ``pretrained_cfg`` (e.g. ``cifar10-resnet``).

    Raises:
        NotAViTError: any other model that is not a ViT vitviz recognises.
    """
    try:
        return inspect(model)
    except NotAViTError:
        cfg = getattr(model, "pretrained_cfg", None)
        if isinstance(cfg, dict) and cfg.get("input_size"):
            return None
        raise


def data_config(model: nn.Module) -> dict[str, Any]:
    """The preprocessing config of ``model`` (timm ``resolve_data_config`` keys).

    ``input_size`` is the size the model was built for (``inspect(model).img_size``), which can differ from its
    pretrained config's (e.g. ``create_model(..., img_size=384)``). A model that is not a ViT (such as the
    ``cifar10-resnet`` baseline) is preprocessed from its timm-style ``pretrained_cfg`` alone.
    """
    from timm.data import resolve_data_config

    spec = spec_or_none(model)
    if spec is None:
        return resolve_data_config(model=model)
    cfg = family_of(model).data_config(model)
    if cfg is None:
        cfg = resolve_data_config({"input_size": (3, *spec.img_size)})
    return {**cfg, "input_size": (3, *spec.img_size)}


def _check_finite_array(arr: np.ndarray, argument: str) -> None:
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        nan, inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        raise ImageInputError(
            f"{argument}: an image array of shape {arr.shape} has {nan} NaN and {inf} infinite values; vitviz "
            "refuses them rather than draw NaN maps or a black image. Fix the decoding step, or replace them "
            "(np.nan_to_num(arr, nan=0.0))"
        )


# float arrays whose largest value lies in (1, FLOAT_AMBIGUOUS_MAX] are refused: a 0..1 image that overshoots 1 a little
# would otherwise be read as 0..255 and come out nearly black
FLOAT_AMBIGUOUS_MAX = 2.0


def _array_to_uint8(arr: np.ndarray, argument: str) -> np.ndarray:
    """An image array as uint8: floats in [0, 1] are scaled by 255, floats and ints in [0, 255] are kept; floats
    whose maximum lies just above 1 (up to ``FLOAT_AMBIGUOUS_MAX``) are refused as ambiguous, naming the fix."""
    if arr.dtype == np.uint8 and arr.size:
        return arr
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ImageInputError(
            f"{argument}: an image array of dtype {arr.dtype} is not an image; pass uint8 (0..255) or float "
            "(0..1) arrays"
        )
    _check_finite_array(arr, argument)
    if not arr.size:
        raise ImageInputError(f"{argument}: an image array of shape {arr.shape} has no pixels")
    lo, hi = float(arr.min()), float(arr.max())
    if np.issubdtype(arr.dtype, np.floating) and lo >= 0 and hi <= 1:
        arr = arr * 255
    elif np.issubdtype(arr.dtype, np.floating) and lo >= 0 and hi <= FLOAT_AMBIGUOUS_MAX:
        # a 0..1 image that overshoots 1 (bicubic resizing, colour jitter) would be read as 0..255: nearly black
        raise ImageInputError(
            f"{argument}: a float image array with values from {lo:g} to {hi:g} is neither 0..1 (it exceeds 1) nor "
            f"plausibly 0..255 (its brightest pixel would be {hi:g} of 255); a 0..1 image that overshot 1 (resizing, "
            "augmentation): pass np.clip(arr, 0, 1); a 0..255 image: pass arr.astype(np.uint8)"
        )
    elif lo < 0 or hi > 255:
        raise ImageInputError(
            f"{argument}: an image array of dtype {arr.dtype} has values from {lo:g} to {hi:g}, outside 0..255 "
            "(and, for floats, outside 0..1); rescale it to uint8 0..255 or float 0..1 (e.g. 16-bit images: "
            "(arr / 257).astype(np.uint8); normalised tensors: pass the tensor itself)"
        )
    return np.round(arr).astype(np.uint8)


# PIL modes of more than 8 bits a channel (16-bit PNG and TIFF, 32-bit int and float): convert("RGB") clips them
# at 255, so a 16-bit photo would come out white; they take the checks of an array of their values instead
_WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


def _rgb(image: Image.Image, argument: str) -> Image.Image:
    """``image`` in RGB; one of more than 8 bits a channel is read as the array of its values (``_array_to_uint8``:
    refused outside 0..255 with the fix), as that array given directly would be, never clipped."""
    if image.mode in _WIDE_MODES:
        return Image.fromarray(_array_to_uint8(np.asarray(image), argument)).convert("RGB")
    return image.convert("RGB")


def to_pil(image: ImageLike, argument: str = "images") -> Image.Image:
    """Load a path, array or PIL image as an RGB PIL image (grayscale, palette and RGBA are converted).

    Raises:
        ImageInputError: a missing file, a folder, an unreadable file, an array that is not an image (shape,
            dtype, NaN/inf, values outside 0..255), or an object that is no image at all.
    """
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if path.is_dir():
            raise ImageInputError(
                f"{argument}: {str(path)!r} is a folder, not an image file; list its images with "
                "vitviz.zoo.samples.images_from(path) (a flat folder, class subfolders or one file)"
            )
        if not path.is_file():
            raise ImageInputError(f"{argument}: image file {str(path)!r} not found; check the path")
        try:
            with Image.open(path) as im:
                return _rgb(im, argument)
        except OSError as e:
            raise ImageInputError(f"{argument}: cannot read image {str(path)!r}: {e}") from None
    if isinstance(image, np.ndarray):
        arr = image
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (3, 4)):
            fix = (
                "channel-first arrays need arr.transpose(1, 2, 0)" if arr.ndim == 3 and arr.shape[0] in _CHANNELS
                else "a batch of images is a (B, H, W, 3) array or a list of arrays"
            )
            raise ImageInputError(
                f"{argument}: expected an HxW, HxWx3 or HxWx4 image array, got shape {arr.shape}; {fix}"
            )
        image = Image.fromarray(_array_to_uint8(arr, argument))
    if isinstance(image, Image.Image):
        if not (image.width and image.height):
            raise ImageInputError(f"{argument}: a PIL image of size {image.width}x{image.height} has no pixels")
        return _rgb(image, argument)
    raise ImageInputError(
        f"{argument}: cannot use {type(image).__name__} as an image; pass a tensor, PIL image, array or path"
    )


NORMALISED_LIMIT = 20.0
"""The largest magnitude ``check_tensor`` takes for a normalised image without a warning: a [0, 1] image normalised
by any usual mean and std lies within about 3 (ImageNet's: -2.1 to 2.6; CLIP's: -1.8 to 2.2; 0.5 and 0.5: -1 to 1),
a normal draw of a test batch within about 6; 0-255 pixels given as floats reach some hundreds."""


def value_range(x: torch.Tensor) -> tuple[float, float]:
    """The smallest and largest value of the floating tensor ``x``, in one reduction and one host read (NaN if
    it holds one: ``aminmax`` propagates NaN; an infinity is its own bound). On a GPU one reduction kernel that
    reads half types as they are and a two-value ``stack``, and no tensor the size of ``x``
    (``torch.isfinite(x).all()`` formed an ``x``-sized copy and three ``x``-sized boolean tensors)."""
    if x.numel() == 0:
        return 0.0, 0.0
    pair = torch.stack(torch.aminmax(x))
    lo, hi = (pair if pair.device.type == "cpu" else pair.cpu()).tolist()  # one read: a copy from a device
    return lo, hi


def check_tensor(x: torch.Tensor, argument: str = "images") -> tuple[float, float] | None:
    """Validate a ``(B, 3, H, W)`` batch: floating dtype, 3 channels (a channel-last ``(B, H, W, C)`` batch is named
    so, with its fix), at least one image, finite values; warn
    (``ImageRangeWarning``) when its values reach beyond ``NORMALISED_LIMIT`` (unnormalised pixels). Its values are
    read once (``value_range``).

    Returns:
        ``(lo, hi)``, the batch's smallest and largest value as read, for a caller that knows the model
        (``warn_unnormalised``); ``None`` where the values were not read (while ``recording()``, or a batch an
        enclosing ``input_checked`` holds).

    Raises:
        ImageInputError: the message names the argument, the shape or dtype found, and the fix.
    """
    if x.ndim != 4:
        raise ImageInputError(
            f"{argument}: expected a (B, 3, H, W) or (3, H, W) tensor, got shape {tuple(x.shape)}"
        )
    if x.shape[0] == 0:
        raise ImageInputError(f"{argument}: the tensor of shape {tuple(x.shape)} holds 0 images; pass at least one")
    if x.shape[1] not in _CHANNELS and x.shape[-1] in _CHANNELS:
        raise ImageInputError(
            f"{argument}: got a tensor of shape {tuple(x.shape)}, laid out channel-last (B, H, W, C); the model takes "
            "(B, 3, H, W): pass x.permute(0, 3, 1, 2) (after your normalisation), or the images as PIL images / "
            "arrays, which vitviz converts and normalises"
        )
    if x.shape[1] != 3:
        kind = {1: "grayscale", 4: "RGBA"}.get(x.shape[1], f"{x.shape[1]}-channel")
        raise ImageInputError(
            f"{argument}: got a {kind} tensor of shape {tuple(x.shape)}; the model takes 3 channels. Convert it "
            "(grayscale: x.expand(-1, 3, -1, -1); RGBA: x[:, :3]) or pass PIL images / arrays, which vitviz "
            "converts and normalises"
        )
    if x.dtype == torch.uint8:
        raise ImageInputError(
            f"{argument}: got a uint8 tensor; pass normalised float tensors, or PIL images / arrays (which vitviz "
            "normalises with the model's preprocessing)"
        )
    if not x.is_floating_point():
        raise ImageInputError(
            f"{argument}: got a {x.dtype} tensor; images are normalised float tensors (x.float() after your "
            "normalisation), or PIL images / arrays, which vitviz normalises"
        )
    from vitviz.core.contexts import checked_before, recording

    if recording():  # GraphedCall checked the batch before copying it in: a captured stream cannot wait for a read
        return None
    if checked_before(x):  # a caller checked this very batch, unwritten since (contexts.input_checked)
        return None
    lo, hi = value_range(x)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        raise ImageInputError(
            f"{argument}: the tensor of shape {tuple(x.shape)} has {nan} NaN and {inf} infinite values; the maps "
            "would be NaN. Fix the preprocessing, or replace them (torch.nan_to_num(x))"
        )
    if max(-lo, hi) > NORMALISED_LIMIT:
        warnings.warn(
            f"{argument}: values from {lo:.4g} to {hi:.4g}, far outside a normalised image's range (within about "
            f"3 for the usual means and stds; vitviz warns beyond {NORMALISED_LIMIT:g}): 0-255 pixels given as "
            "floats? The maps would describe another input. Normalise them ((x / 255 - mean) / std with the "
            "model's mean and std), or pass PIL images / arrays / paths, which vitviz normalises "
            "(vitviz.load_images). A model that normalises its own input can ignore this (ImageRangeWarning)",
            ImageRangeWarning, stacklevel=2)
    return lo, hi


def _rounded(values: Any) -> tuple[float, ...]:
    return tuple(round(float(v), 4) for v in values)


def warn_unnormalised(model: nn.Module, found: tuple[float, float] | None, argument: str = "images", *,
                      stacklevel: int = 3) -> bool:
    """Warn (``ImageRangeWarning``) when a batch for ``model`` holds pixels in [0, 1], not normalised: the model's
    preprocessing normalises (``data_config(model)``: a mean not all 0, or a std not all 1) and the batch has no
    negative value (``found``, its range as ``check_tensor`` read it: smallest >= 0, largest <= 1), the mark of
    ``torchvision.transforms.ToTensor()`` without ``Normalize``. A batch normalised by a non-zero mean has a
    negative value unless every pixel of every channel is brighter than the mean (ImageNet's 0.485 / 0.456 / 0.406;
    0.5 for Hugging Face's default), so a batch with none is almost surely unnormalised. ``found`` ``None`` (values
    not read) warns nothing. The model's config is read only for a batch in [0, 1].

    Returns:
        whether it warned.
    """
    if found is None:
        return False
    lo, hi = found
    if not (lo >= 0 and hi <= 1):
        return False
    cfg = data_config(model)
    mean, std = _rounded(cfg.get("mean", (0.0,))), _rounded(cfg.get("std", (1.0,)))
    if all(m == 0 for m in mean) and all(s == 1 for s in std):
        return False
    warnings.warn(
        f"{argument}: values from {lo:.4g} to {hi:.4g}, none negative: pixels in [0, 1] (torchvision's ToTensor() "
        f"without Normalize?), while {type(model).__name__}'s preprocessing normalises them with mean {mean} and "
        f"std {std}, which leaves a negative value in almost every batch. The maps would describe another input. "
        f"Normalise them (torchvision.transforms.Normalize(mean={mean}, std={std}) after ToTensor(), or "
        "(x - mean) / std), or pass PIL images / arrays / paths, which vitviz normalises (vitviz.load_images). A "
        "model that normalises its own input can ignore this (ImageRangeWarning)",
        ImageRangeWarning, stacklevel=stacklevel)
    return True


def _device(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ImageInputError(
            f"device={device!r} is not a torch device; pass 'cpu', 'cuda', 'cuda:1', 'mps' or a torch.device "
            "(default: the model's device)"
        ) from None


_BUILD_FOR = {  # how a model of each family is built for an h x w input (check_size's fix)
    "timm": "timm.create_model(..., img_size=({h}, {w})) or dynamic_img_size=True",
    "huggingface": "its config's image_size=({h}, {w}) when you build it",
    "torchvision": "torchvision's vit_*(image_size=N), square inputs only",
    "open_clip": "open_clip.create_model(..., force_image_size=({h}, {w}))",
}


def check_size(spec: ViTSpec, h: int, w: int, argument: str = "images") -> None:
    """Raise ``ImageInputError`` when the model cannot take an ``h x w`` input; the message names ``argument`` and
    how a model of its family is built for that size."""
    if spec.takes((h, w)):
        return
    if spec.dynamic_img_size:
        raise ImageInputError(
            f"{argument}: {spec.name} takes inputs whose sides are multiples of its {spec.patch_size[0]}x"
            f"{spec.patch_size[1]} token stride, got {h}x{w}; resize or crop them"
        )
    build = _BUILD_FOR.get(spec.family, "a model built for that size").format(h=h, w=w)
    raise ImageInputError(
        f"{argument}: {spec.name} takes {spec.img_size[0]}x{spec.img_size[1]} images, got {h}x{w}. Resize the "
        f"images (raw PIL images, arrays and paths are resized for you), or build the model for this size ({build})"
    )


def load_images(model: nn.Module, images: Images, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Turn ``images`` into a normalised ``(B, 3, H, W)`` batch on the model's device and dtype.

    Args:
        model: the ViT the batch is for (its data config drives preprocessing, its size the checks).
        images: a ``(B, 3, H, W)`` or ``(3, H, W)`` normalised tensor; or one or a list of PIL images,
            ``HxWx3`` / ``HxW`` / ``HxWx4`` arrays, or file paths; or a ``BxHxWx3`` array of ``B`` images. Arrays
            are uint8 (or ints) in 0..255 or floats in 0..1 (or in 0..255; a float array whose maximum lies in
            ``(1, FLOAT_AMBIGUOUS_MAX]`` is refused as ambiguous).
        device: override the device (default: the model's).

    A tensor on another device than the model is moved to the model's device (and cast to its dtype). A tensor
    with values beyond ``NORMALISED_LIMIT`` (0-255 pixels), or with no negative value and none above 1 for a model
    whose preprocessing normalises (``ToTensor()`` pixels without ``Normalize``: ``warn_unnormalised``), is warned
    about (``ImageRangeWarning``).

    Raises:
        ImageInputError: no images, a non-float or non-3-channel tensor, NaN or infinite pixels, an image
            array that is not an image, a missing file, or a size the model cannot take (the message names
            the argument, the value and the fix).
    """
    x, found = images_and_range(model, images, device=device)
    warn_unnormalised(model, found)  # ToTensor() pixels in [0, 1], not normalised
    return x


def images_and_range(model: nn.Module, images: Images, *,
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, tuple[float, float] | None]:
    """``load_images``'s batch, and the range ``check_tensor`` read of a tensor given (``None`` for images vitviz
    normalised itself), for ``warn_unnormalised``; without that warning, which a caller that loads one call's
    images in chunks (``core.batching.iter_batches``) gives once per call."""
    spec = spec_or_none(model)
    param = next(model.parameters(), None)
    device = _device(device) or (param.device if param is not None else None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    items = image_list(images)
    if isinstance(items, torch.Tensor):
        x = items
        found = check_tensor(x)
    else:
        from timm.data import create_transform

        if not items:
            kind = "array" if isinstance(images, np.ndarray) else "list"
            raise ImageInputError(f"images: an empty {kind} holds 0 images; pass at least one image")
        if all(isinstance(im, torch.Tensor) for im in items):
            raise ImageInputError(
                "images: a list of tensors; stack them into one (B, 3, H, W) tensor (torch.stack(images))"
            )
        transform = create_transform(**data_config(model), is_training=False)
        x, found = torch.stack([transform(to_pil(im)) for im in items]), None
    if spec is not None:  # a CNN takes any size its pooling allows
        check_size(spec, x.shape[-2], x.shape[-1])
    # the batch goes where the model is (a CUDA tensor for a CPU model, and back): moved, not refused
    return x.to(device=device, dtype=dtype), found


def denormalise(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """Undo the model's input normalisation for display: ``(B, 3, H, W)`` -> ``(B, H, W, 3)`` RGB in ``[0, 1]``."""
    cfg = data_config(model)
    mean = torch.tensor(cfg.get("mean", (0.0, 0.0, 0.0)), dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(cfg.get("std", (1.0, 1.0, 1.0)), dtype=torch.float32).view(1, 3, 1, 1)
    return (x.detach().float().cpu() * std + mean).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def _item_image(item: Any) -> Any:
    """The image of one item of a ``Dataset``: the item itself, or the first entry of an ``(image, target, ...)``."""
    return item[0] if isinstance(item, (list, tuple)) and item else item


def check_items(items: Sequence[Any], argument: str = "images") -> None:
    """Refuse the items of one batch of a ``Dataset`` that no batch of normalised images can be made of, before
    ``default_collate`` stacks them: PIL images (a dataset without its ``transform``: torch's collation raised a bare
    ``TypeError``) and image tensors of different shapes (a ``RuntimeError`` of ``torch.stack``). Anything else is
    left to the collation and to ``check_tensor``, which checks the batch made of them.

    Raises:
        ImageInputError: the message names ``argument``, what the items hold, and the fix.
    """
    images = [_item_image(item) for item in items]
    pil = next((i for i, im in enumerate(images) if isinstance(im, Image.Image)), None)
    if pil is not None:
        raise ImageInputError(
            f"{argument}: the Dataset yields PIL images (item {pil} of a batch: a {images[pil].mode} image of "
            f"{images[pil].width}x{images[pil].height}), which cannot be batched; a Dataset or DataLoader must yield normalised (3, H, W) tensors (or (image, label) pairs of "
            "them). Give the dataset the model's preprocessing as its transform (transform=timm.data."
            "create_transform(**vitviz.core.images.data_config(model))), or pass the folder of images itself, "
            "which vitviz preprocesses"
        )
    shapes = [tuple(im.shape) for im in images if isinstance(im, (torch.Tensor, np.ndarray))]
    if len(set(shapes)) > 1:
        first = shapes[0]
        other = next(s for s in shapes if s != first)
        raise ImageInputError(
            f"{argument}: one batch of the Dataset holds images of shapes {first} and {other}, which cannot be "
            "stacked into a batch; resize them all to the size the model takes in the dataset's transform (the "
            "model's own: timm.data.create_transform(**vitviz.core.images.data_config(model))), or, for a model "
            "that takes several sizes, read them with batch_size=1"
        )


def collate_images(items: list[Any]) -> Any:
    """``default_collate`` of the items of one batch of a loader vitviz builds, after ``check_items``: a
    ``Dataset`` of PIL images or of images of several shapes is refused naming the fix, not with torch's bare
    ``TypeError`` or ``RuntimeError``."""
    check_items(items)
    return default_collate(items)


def read_batches(loader: Any) -> Iterator[Any]:
    """The batches of ``loader``. A ``DataLoader`` of the user's that batches with torch's ``default_collate`` and
    fails to (a ``TypeError`` or ``RuntimeError``: a dataset of PIL images, or of images of several shapes) has the
    first items of its dataset looked at (``check_items``), so that such a dataset gets the error it gets when
    passed itself, through ``collate_images`` (``ImageInputError``, naming the fix); any other failure is raised as
    it is."""
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (TypeError, RuntimeError) as err:
            _explain_collate_failure(loader, err)
            raise
        yield batch


def _explain_collate_failure(loader: Any, err: Exception) -> None:
    dataset = getattr(loader, "dataset", None)
    if getattr(loader, "collate_fn", None) is not default_collate or isinstance(dataset, IterableDataset):
        return
    try:
        items = [dataset[i] for i in range(min(len(dataset), loader.batch_size or 1))]  # type: ignore[index, arg-type]
    except Exception:  # noqa: BLE001 (a dataset that cannot be read so: the loader's own error stands)
        return
    try:
        check_items(items)
    except ImageInputError as bad:
        raise bad from err

