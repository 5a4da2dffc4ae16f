"""Example images for the notebooks: a CIFAR-10 test folder when there is one, scikit-image's samples otherwise.

Your own images come in through ``images_from(path)`` (and ``example_images(data_dir)``, which the notebooks and
the report call): a single image file, a flat folder of images (sorted by file name), or a class-folder tree
(``<class>/<image>``, as ``torchvision.datasets.ImageFolder``), with ``.jpg``, ``.jpeg``, ``.png``, ``.webp`` or
``.bmp`` files.

Nothing is downloaded: the CIFAR-10 root is a parameter (or ``$VITVIZ_DATA``), and the natural images are the
ones scikit-image ships (Krizhevsky 2009 for CIFAR-10; ``skimage.data`` for the photographs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitviz.core.util import check_positive_int
from vitviz.errors import DataNotFoundError, InputError, MissingDependencyError

__all__ = ["NATURAL_IMAGES", "ImageSet", "class_labels", "example_images", "folder_images", "images_from",
           "natural_images", "resolve_test_folder"]

NATURAL_IMAGES = ("astronaut", "chelsea", "coffee", "rocket")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


DATA_ENV = "VITVIZ_DATA"


def resolve_data_root(root: str | os.PathLike | None = None) -> Path:
    """Return the dataset root: ``root`` if given, else ``$VITVIZ_DATA``; error when neither is usable."""
    if root is None:
        root = os.environ.get(DATA_ENV)
        if not root:
            raise DataNotFoundError(
                f"no dataset given: pass --data DIR (a folder with train/ and test/ ImageFolder trees) "
                f"or set the {DATA_ENV} environment variable"
            )
    path = Path(root).expanduser()
    if path.is_file() and path.suffix == ".npz":
        return path
    if not path.is_dir():
        raise DataNotFoundError(f"dataset root {str(path)!r} does not exist or is not a folder (or a .npz pack "
                                "from vitviz.experiments.data.pack_image_folder)")
    return path


@dataclass
class ImageSet:
    """Images (paths or ``HxWx3`` uint8 arrays), one label each, and a sentence saying where they come from."""

    images: list
    labels: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.images)

    def head(self, n: int) -> ImageSet:
        """The first ``n`` images (all of them where there are fewer).

        Raises:
            InputError: ``n`` is not a positive int (a slice by 0 or a negative ``n`` would silently keep none, or
                all but the last).
        """
        n = check_positive_int(n, "n", "the number of images to keep (e.g. 6)")
        return ImageSet(self.images[:n], self.labels[:n], self.source)


def natural_images(names: tuple[str, ...] = NATURAL_IMAGES) -> dict[str, np.ndarray]:
    """scikit-image's sample photographs as ``HxWx3`` uint8 arrays, by name (``astronaut``, ``chelsea``...)."""
    try:
        import skimage.data
    except ImportError:
        raise MissingDependencyError("natural_images needs scikit-image: pip install 'vitviz[notebooks]'") from None
    out = {}
    for name in names:
        fn = getattr(skimage.data, name, None)
        if fn is None:
            raise InputError(f"skimage.data has no image {name!r}; try one of {NATURAL_IMAGES}")
        img = np.asarray(fn())
        out[name] = img[..., :3] if img.ndim == 3 else np.repeat(img[..., None], 3, axis=-1)
    return out


def resolve_test_folder(data_dir: str | os.PathLike | None = None) -> Path | None:
    """Where the example images come from: ``data_dir``, else ``$VITVIZ_DATA/test``, else ``None``.

    ``data_dir`` may be a class-folder tree, a flat folder of images or a single image file (see ``images_from``).

    Raises:
        FileNotFoundError: ``data_dir`` is given but is neither a folder nor a file.
    """
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not (path.is_dir() or path.is_file()):
            raise DataNotFoundError(
                f"data_dir {str(path)!r} does not exist; pass an image file, a folder of images, or a folder of "
                "<class>/<image> files"
            )
        return path
    env = os.environ.get(DATA_ENV)
    if env and (Path(env).expanduser() / "test").is_dir():
        return Path(env).expanduser() / "test"
    return None


def _count(n: object, argument: str = "n") -> int | None:
    """``n`` as a positive int, or None (all images); else ``InputError``: a slice by 0 or a negative ``n`` would
    give no images, or all but the last few, without a word."""
    return None if n is None else check_positive_int(n, argument, "the number of images to take, or None for all")


def _image_files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
                  and not f.name.startswith("."))


def folder_images(root: str | os.PathLike, n: int | None = None) -> ImageSet:
    """The first ``n`` images of an ImageFolder tree, taken in turn from each class (deterministic).

    Only paths are listed; the images are decoded when used, so a 10,000-image test set costs nothing here.

    Raises:
        InputError: ``n`` is not a positive int or None.
    """
    n = _count(n)
    root = Path(root)
    classes = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    files = {c.name: _image_files(c) for c in classes}
    files = {k: v for k, v in files.items() if v}
    if not files:
        raise DataNotFoundError(f"no images under {str(root)!r} (expected <class>/<image> files)")
    limit = sum(len(v) for v in files.values()) if n is None else n
    images, labels = [], []
    for i in range(max(len(v) for v in files.values())):
        for name, paths in files.items():
            if i < len(paths) and len(images) < limit:
                images.append(paths[i])
                labels.append(name)
    return ImageSet(images, labels, f"{len(images)} images from {root} ({len(files)} classes, taken in turn)")


def class_labels(path: str | os.PathLike | None, images: ImageSet) -> tuple[list[str], list[int] | None]:
    """The classes of a class-folder tree and the class index of each of ``images`` taken from it (``images_from``).

    The classes are the tree's sub-folders that hold images, sorted by name (torchvision ``ImageFolder``'s order,
    the order CIFAR-10's labels have); hidden folders (``.ipynb_checkpoints``) are no class. A flat folder, a single
    file or no folder (``None``, the photographs) has no classes: its images are labelled by file name.

    Args:
        path: what ``images`` were read from (``resolve_test_folder``'s answer).
        images: the images, as ``images_from`` or ``example_images`` labelled them.

    Returns:
        ``(class_names, labels)``: the sorted class names and one index per image, or ``([], None)`` when the
        images have no classes.
    """
    root = None if path is None else Path(path).expanduser()
    if root is None or not root.is_dir() or _image_files(root):
        return [], None
    names = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and _image_files(d))
    unknown = sorted(set(images.labels) - set(names))
    if unknown:
        raise InputError(f"images: labels {unknown[:3]} are no class folder of {str(root)!r} (classes: {names[:10]}); "
                         "pass the images read from that folder (vitviz.zoo.samples.images_from)")
    return names, [names.index(label) for label in images.labels]


def images_from(path: str | os.PathLike, n: int | None = None) -> ImageSet:
    """Your images, from any of three layouts; only paths are listed (decoded when used).

    - a single image file: that image, labelled with its file name;
    - a flat folder of images: the first ``n`` by file name, labelled with their file names (subfolders
      without images are ignored);
    - a class-folder tree (``<class>/<image>``): the first ``n``, taken in turn from each class (see
      ``folder_images``), labelled with their class. A folder with images at the top level is read as flat.

    Args:
        path: a file or a folder.
        n: at most this many images (default: all).

    Raises:
        FileNotFoundError: ``path`` does not exist, or holds no ``.jpg``/``.jpeg``/``.png``/``.webp``/``.bmp``.
        InputError: ``n`` is not a positive int or None.
    """
    n = _count(n)
    root = Path(path).expanduser()
    if root.is_file():
        if root.suffix.lower() not in IMAGE_SUFFIXES:
            raise DataNotFoundError(f"{str(root)!r} is not an image file (expected one of {IMAGE_SUFFIXES})")
        return ImageSet([root], [root.stem], f"1 image: {root}")
    if not root.is_dir():
        raise DataNotFoundError(
            f"{str(root)!r} does not exist; pass an image file, a folder of images or a folder of <class>/<image>"
        )
    flat = _image_files(root)
    if flat:
        chosen = flat if n is None else flat[:n]
        return ImageSet(chosen, [f.stem for f in chosen],
                        f"{len(chosen)} images from {root} (a flat folder, sorted by file name)")
    try:
        return folder_images(root, n)
    except FileNotFoundError:
        raise DataNotFoundError(
            f"no images in {str(root)!r}: expected image files ({', '.join(IMAGE_SUFFIXES)}) in it, or in "
            "<class> subfolders"
        ) from None


def example_images(data_dir: str | os.PathLike | None = None, n: int = 128) -> ImageSet:
    """``n`` images from ``data_dir`` (a file, a flat folder or a class tree; see ``images_from``), else from the
    CIFAR-10 test folder ``$VITVIZ_DATA/test``, else scikit-image's photographs.

    The fallback holds the four ``NATURAL_IMAGES`` only, whatever ``n``; ``source`` says which set was used.

    Raises:
        InputError: ``n`` is not a positive int.
    """
    n = check_positive_int(n, "n", "the number of images to take (e.g. 128)")
    root = resolve_test_folder(data_dir)
    if root is not None:
        return images_from(root, n)
    photos = natural_images()
    names = list(photos)[:n]
    return ImageSet([photos[k] for k in names], names,
                    f"no CIFAR-10 test folder (data_dir or ${DATA_ENV}); using scikit-image's {len(names)} photographs")
