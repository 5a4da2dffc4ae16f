"""``iter_dataset``: positions that name the right images, the checks of a tensor input, iterable datasets."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
)

import vitviz
from vitviz.core.datasets import ShardSampler, iter_dataset
from vitviz.errors import ImageInputError, InputError


def numbered(n: int) -> TensorDataset:
    """Images whose every pixel is their dataset position, so a batch says which images it holds."""
    x = torch.arange(n, dtype=torch.float32)[:, None, None, None].expand(n, 3, 32, 48).clone()
    return TensorDataset(x, torch.arange(n))


def read(model, source, **kw):
    return [(x[:, 0, 0, 0].long().tolist(), pos) for x, _, pos in iter_dataset(model, source, **kw)]


@pytest.mark.parametrize("loader", [
    lambda ds: DataLoader(ds, batch_size=3, shuffle=True),
    lambda ds: DataLoader(ds, batch_size=3, sampler=RandomSampler(ds)),
    lambda ds: DataLoader(ds, batch_size=3, sampler=SubsetRandomSampler(list(range(7)))),
    lambda ds: DataLoader(ds, batch_size=3, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)),
])
def test_a_loader_in_an_unknown_order_is_refused(loader):
    model = tiny_timm_vit()
    with pytest.raises(InputError, match=r"images= is a DataLoader with a \w+Sampler.*pass the Dataset itself, or a "
                                         r"DataLoader with shuffle=False"):
        read(model, loader(numbered(7)))
    with pytest.raises(InputError, match="shuffle=False"):
        vitviz.faithfulness(model, loader(numbered(7)), {"pre": torch.rand(7, 4, 6)}, modes=["deletion"],
                            steps=0.5, progress=False)


def test_ordered_loaders_give_each_image_its_own_position():
    model = tiny_timm_vit()
    ds = numbered(7)
    for source in (ds, DataLoader(ds, batch_size=3), DataLoader(ds, batch_size=3, sampler=ShardSampler(ds, 1, 0)),
                   DataLoader(ds, batch_size=3, sampler=DistributedSampler(ds, num_replicas=1, rank=0,
                                                                           shuffle=False))):
        got = read(model, source, batch_size=2)
        assert all(images == pos for images, pos in got)
        assert sum((pos for _, pos in got), []) == list(range(7))
    # a shard of a DistributedSampler: the sampler's indices, its padding (image 0 again, rank 0's) dropped
    shard = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False))
    got = read(model, shard)
    assert all(images == pos for images, pos in got) and sum((p for _, p in got), []) == [1, 3, 5]
    padded = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False))
    assert sum((p for _, p in read(model, padded)), []) == [0, 2, 4, 6]
    picked = read(model, DataLoader(ds, batch_size=3), positions=[1, 5, 6])
    assert all(images == pos for images, pos in picked) and sum((p for _, p in picked), []) == [1, 5, 6]


class Stream(IterableDataset):
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __iter__(self):
        for i, image in enumerate(self.x):
            yield image, i % 5


def test_a_bare_iterable_dataset_is_read_and_counted_as_it_comes():
    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    got = list(iter_dataset(model, Stream(x), batch_size=2))
    assert [pos for _, _, pos in got] == [[0, 1], [2, 3], [4]]
    torch.testing.assert_close(torch.cat([b for b, _, _ in got]), x)
    run = dict(methods=["random"], modes=["deletion"], steps=0.5, progress=False)
    want = vitviz.faithfulness(model, x, **run)
    for source in (Stream(x), DataLoader(Stream(x), batch_size=2)):
        got = vitviz.faithfulness(model, source, batch_size=2, **run)
        key = ["image", "fraction"]
        pd_got, pd_want = got.sort_values(key).reset_index(drop=True), want.sort_values(key).reset_index(drop=True)
        assert pd_got["image"].tolist() == pd_want["image"].tolist()
        assert pd_got["score"].to_numpy() == pytest.approx(pd_want["score"].to_numpy(), abs=1e-6)


@pytest.mark.parametrize("bad, match", [
    (torch.randint(0, 255, (2, 3, 32, 48), dtype=torch.uint8), "images: got a uint8 tensor"),
    (torch.randn(2, 1, 32, 48), "images: got a grayscale tensor"),
    (torch.randn(2, 3, 32, 48).index_fill_(3, torch.tensor([0]), float("nan")), "images: .* NaN"),
    (torch.randn(2, 3, 24, 24), "takes 32x48 images, got 24x24"),
])
def test_dataset_batches_get_the_checks_of_a_tensor(bad, match):
    model = tiny_timm_vit()
    for source in (TensorDataset(bad), DataLoader(TensorDataset(bad), batch_size=2), Stream(bad)):
        with pytest.raises(ImageInputError, match=match):
            next(iter_dataset(model, source))
        with pytest.raises(ImageInputError, match=match):
            vitviz.faithfulness(model, source, {"pre": torch.rand(2, 4, 6)}, modes=["deletion"], steps=0.5,
                                progress=False)


def test_dataset_batches_are_cast_to_the_model_dtype():
    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48, dtype=torch.float64)
    for source in (TensorDataset(x), DataLoader(TensorDataset(x), batch_size=2)):
        assert {b.dtype for b, _, _ in iter_dataset(model, source)} == {torch.float32}
    double = tiny_timm_vit().double()
    assert {b.dtype for b, _, _ in iter_dataset(double, TensorDataset(x.float()))} == {torch.float64}


def test_an_iterable_dataset_with_loader_workers_is_refused_as_reduce_dataset_refuses_it():
    """Each loader worker reads the whole of an IterableDataset that does not shard itself: with two workers every
    image came twice, at positions past the dataset's end. iter_dataset (faithfulness) refuses it, as reduce_dataset
    does; without workers every image comes once."""
    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    with pytest.raises(InputError, match=r"images=Stream\(\) is an IterableDataset, which vitviz cannot shard "
                                         r"between loader workers.*num_workers=0"):
        list(iter_dataset(model, Stream(x), batch_size=2, num_workers=2))
    with pytest.raises(InputError, match="cannot shard between loader workers"):
        vitviz.faithfulness(model, Stream(x), methods=["random"], modes=["deletion"], steps=0.5, num_workers=2,
                            progress=False)
    got = list(iter_dataset(model, Stream(x), batch_size=2, num_workers=0))
    assert sum((pos for _, _, pos in got), []) == list(range(len(x)))


def test_a_loaders_list_of_labels_is_taken_with_its_images():
    """A DataLoader whose collate_fn gives the labels as a list (one per image) read at some positions (faithfulness
    resuming, or positions=): the images were picked but the list kept every label, so label i no longer belonged
    to image i. The list is taken at the same places as the images; labels of another length than the batch reach
    faithfulness as an error naming labels=, never a shifted class."""
    model = tiny_timm_vit()
    ds = numbered(7)

    def as_list(items):
        return torch.stack([x for x, _ in items]), [int(y) for _, y in items]

    loader = DataLoader(ds, batch_size=3, collate_fn=as_list)
    got = list(iter_dataset(model, loader, positions=[1, 5, 6]))
    for x, target, pos in got:
        assert x[:, 0, 0, 0].long().tolist() == pos == target
    assert sum((t for _, t, _ in got), []) == [1, 5, 6]

    def padded(items):  # a label list that is not one per image
        return torch.stack([x for x, _ in items]), [int(y) for _, y in items] + [0]

    with pytest.raises(InputError, match=r"labels='dataset': got 4 labels for a batch of 3 images"):
        vitviz.faithfulness(model, DataLoader(ds, batch_size=3, collate_fn=padded), methods=["random"],
                            modes=["deletion"], steps=0.5, labels="dataset", progress=False)
