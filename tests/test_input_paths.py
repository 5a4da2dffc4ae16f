"""Every input path of the functions that read images (a batch, a list of paths, a folder, a ``Dataset``, a
``DataLoader``) gives the same result on the same images, and the same clear error on the same bad images."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit
from PIL import Image
from torch.utils.data import DataLoader, Dataset, TensorDataset

import vitviz
from vitviz.analysis.attention_stats import attention_statistics
from vitviz.core.features import extract_features
from vitviz.errors import ImageInputError


class Items(Dataset):
    """A map-style dataset of the given items."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _faithfulness(model, source, **kw):
    df = vitviz.faithfulness(model, source, ["random", "rollout"], steps=0.5, progress=False, **kw)
    rows = df.sort_values(["method", "mode", "metric", "fraction"], kind="stable")  # images in the order read
    return torch.tensor(rows["score"].to_numpy())


def _features(model, source, **kw):
    if isinstance(source, torch.Tensor):  # the tensor path of features is (images, labels)
        source = (source, torch.tensor([0, 0, 0, 1, 1, 1]))
    f = extract_features(model, source, **kw)
    assert f.labels.tolist() == [0, 0, 0, 1, 1, 1]
    return f.feats[next(iter(f.feats))]


FUNCTIONS = {
    "mean_attention_distance": lambda m, s, **kw: vitviz.mean_attention_distance(m, s, **kw),
    "attention_statistics": lambda m, s, **kw: attention_statistics(m, s, **kw)["entropy"],
    "faithfulness": _faithfulness,
    "extract_features": _features,
}
PATHS = ["batch", "paths", "folder", "Dataset", "DataLoader"]


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory):
    """Six 32x48 PNGs in two class folders, and their files in the order every path reads them."""
    root = tmp_path_factory.mktemp("paths")
    rng = np.random.default_rng(0)
    files = []
    for c in range(2):
        (root / f"c{c}").mkdir()
        for i in range(3):
            files.append(root / f"c{c}" / f"{i}.png")
            Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(files[-1])
    return root, files


@pytest.mark.parametrize("name, path", [(n, p) for n in sorted(FUNCTIONS) for p in PATHS
                                        if (n, p) != ("extract_features", "paths")])  # features take no path list
def test_every_input_path_gives_the_result_of_the_batch(name, path, two_classes):
    """The same six images as a preprocessed batch, their paths, their folder, a Dataset and a DataLoader of the
    batch (a batch size that does not divide the count) give the same numbers."""
    fn, model = FUNCTIONS[name], tiny_timm_vit()
    root, files = two_classes
    x = vitviz.load_images(model, [str(p) for p in files])
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    source = {"batch": x, "paths": [str(p) for p in files], "folder": root, "Dataset": TensorDataset(x, labels),
              "DataLoader": DataLoader(TensorDataset(x, labels), batch_size=4)}[path]
    want = fn(model, x, batch_size=6)
    assert want.isfinite().all() and want.abs().sum() > 0
    torch.testing.assert_close(fn(model, source, batch_size=4), want, rtol=1e-5, atol=1e-6)


def _pil(i):
    return Image.fromarray(np.full((32, 48, 3), 40 * i, np.uint8))


BAD_ITEMS = {  # items that make no batch, and the message each gets
    "PIL images": ([(_pil(i), i % 2) for i in range(4)],
                   r"images: the Dataset yields PIL images \(item 0 of a batch: a RGB image of 48x32\).*"
                   r"transform=timm\.data\.create_transform\(\*\*vitviz\.core\.images\.data_config\(model\)\).*"
                   "pass the folder"),
    "images of two sizes": ([(torch.randn(3, 32, 48 if i else 40), i % 2) for i in range(4)],
                            r"images: one batch of the Dataset holds images of shapes \(3, 32, 40\) and "
                            r"\(3, 32, 48\).*resize them.*batch_size=1"),
    "grayscale (H, W) items": ([(torch.randn(32, 48), i % 2) for i in range(4)],
                               r"images: a batch of the Dataset / DataLoader has shape \(3, 32, 48\), not "
                               r"\(B, 3, H, W\).*x\.expand\(3, -1, -1\)"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ITEMS))
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_dataset_whose_items_make_no_batch_is_refused_naming_the_fix(name, kind):
    """A Dataset without its transform yields PIL images; torch's collation raised a bare TypeError ("default_collate:
    batch must contain tensors...") on the Dataset and DataLoader paths of every function, where a list of the same
    PIL images is preprocessed; images of two sizes raised torch.stack's RuntimeError; (H, W) grayscale items, batched
    three at a time, were refused as not "(B, 3, H, W) or (3, H, W)", though the batch was (3, H, W)."""
    fn, model = FUNCTIONS[name], tiny_timm_vit()
    items, match = BAD_ITEMS[kind]
    for source in (Items(items), DataLoader(Items(items), batch_size=3)):
        with pytest.raises(ImageInputError, match=match):
            fn(model, source, batch_size=3)


def test_a_loader_that_reads_single_items_is_refused_naming_batch_size():
    """``DataLoader(batch_size=None)`` hands over each (3, H, W) image unbatched."""
    model = tiny_timm_vit()
    loader = DataLoader(TensorDataset(torch.randn(2, 3, 32, 48)), batch_size=None)
    with pytest.raises(ImageInputError, match=r"has shape \(3, 32, 48\), not \(B, 3, H, W\).*batch_size=None reads "
                                              "single items: pass batch_size=1 or more"):
        vitviz.mean_attention_distance(model, loader)


def test_a_loader_with_a_collate_fn_of_its_own_keeps_its_own_error():
    """Only torch's default collation is explained: another collate_fn's error is raised as it is."""
    def collate(items):
        raise RuntimeError("the user's collate failed")

    loader = DataLoader(Items([(_pil(0), 0)] * 2), batch_size=2, collate_fn=collate)
    with pytest.raises(RuntimeError, match="the user's collate failed"):
        vitviz.mean_attention_distance(tiny_timm_vit(), loader)
