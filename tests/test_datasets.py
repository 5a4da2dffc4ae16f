"""Reductions over whole datasets: folder, Dataset and DataLoader equal the batch; resume; two gloo processes (vitviz's
shards and a user's padded DistributedSampler)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_timm_vit
from torch.utils.data import DataLoader, Dataset, TensorDataset

import vitviz
from vitviz.analysis.attention_stats import attention_statistics
from vitviz.analysis.distance import DistanceReduction, attention_distance_from_maps
from vitviz.core.datasets import ShardSampler, reduce_dataset
from vitviz.core.features import extract_features
from vitviz.errors import CheckpointError, ImagesLeftOutWarning, InputError


def images(n=7, seed=1):
    return torch.randn(n, 3, 32, 48, generator=torch.Generator().manual_seed(seed))


def test_folder_dataset_and_loader_equal_the_batch(tiny_folder):
    model = tiny_timm_vit()
    folder = tiny_folder / "test"
    files = sorted(p for p in folder.rglob("*.jpg"))[:: 5]  # 20 of the 100, to stay quick
    sub = tiny_folder / "sub"
    if not sub.exists():
        for p in files:
            (sub / p.parent.name).mkdir(parents=True, exist_ok=True)
            (sub / p.parent.name / p.name).write_bytes(p.read_bytes())
    want = vitviz.mean_attention_distance(model, [str(p) for p in sorted(sub.rglob("*.jpg"))])
    torch.testing.assert_close(vitviz.mean_attention_distance(model, sub, batch_size=6), want)
    x = images()
    want = vitviz.mean_attention_distance(model, x)
    ds = TensorDataset(x, torch.arange(len(x)))
    torch.testing.assert_close(vitviz.mean_attention_distance(model, ds, batch_size=3), want)
    torch.testing.assert_close(vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=4)), want)
    with pytest.raises(TypeError, match="checkpoint"):
        vitviz.mean_attention_distance(model, x, checkpoint="x.pt")


def test_attention_statistics_equal_the_maps_and_accept_a_dataset():
    model = tiny_timm_vit()
    x = images(5)
    with vitviz.capture_attention(model) as cap, torch.no_grad():
        model(x)
    stats = attention_statistics(model, x, batch_size=2)
    for layer, attn in enumerate(cap.attentions):
        torch.testing.assert_close(stats["mean_attention"][layer], attn.mean(dim=(0, 1)))
        ent = -(attn * attn.log()).sum(-1).mean(dim=(0, 2))
        torch.testing.assert_close(stats["entropy"][layer], ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats["mean_attention"].sum(-1), torch.ones(2, 25))
    again = attention_statistics(model, TensorDataset(x), batch_size=3)
    torch.testing.assert_close(again["mean_attention"], stats["mean_attention"])
    spec = vitviz.inspect(model)
    torch.testing.assert_close(vitviz.mean_attention_distance(model, x)[1],
                               attention_distance_from_maps(cap.attentions[1], spec))


class Sized(Dataset):
    """One image per item, each of its own size (a dynamic-size model takes them one per batch)."""

    def __init__(self, xs):
        self.xs = xs

    def __len__(self):
        return len(self.xs)

    def __getitem__(self, i):
        return self.xs[i], 0


def test_attention_statistics_refuse_images_whose_grids_differ_at_one_token_count():
    """32x48 and 48x32 images make as many tokens on transposed grids (4x6, 6x4): their maps index other patches,
    so a mean over them is no patch's mean map. Refused, naming both grids; one grid throughout still runs."""
    from vitviz.errors import ImageInputError

    model = tiny_timm_vit(dynamic_img_size=True)
    a, b = images(1)[0], torch.randn(3, 48, 32, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ImageInputError, match=r"6x4.*4x6|4x6.*6x4"):
        attention_statistics(model, Sized([a, b]), batch_size=1)
    one = attention_statistics(model, Sized([a, a.flip(-1)]), batch_size=1)
    torch.testing.assert_close(one["mean_attention"], attention_statistics(model, torch.stack([a, a.flip(-1)]))[
        "mean_attention"])


def test_a_resumed_attention_statistics_run_keeps_the_grid_of_the_images_before_the_kill(tmp_path, monkeypatch):
    """The grid check held in memory only: a run killed after images of one grid and resumed on images of the
    transposed grid (as many tokens) summed both, where the unbroken run refuses. The checkpoint keeps the grid."""
    from vitviz.errors import ImageInputError

    model = tiny_timm_vit(dynamic_img_size=True)
    a, b = images(1)[0], torch.randn(3, 48, 32, generator=torch.Generator().manual_seed(2))
    data, ckpt = Sized([a, a.flip(-1), b, b]), tmp_path / "stats.pt"
    with pytest.raises(ImageInputError, match=r"4x6"):  # the unbroken run
        attention_statistics(model, data, batch_size=1)

    import vitviz.core.datasets as datasets

    save = datasets.atomic_save

    def killed_after_two(state, path):  # killed right after the checkpoint of the two 32x48 images
        save(state, path)
        if state["state"]["images"] == 2:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(datasets, "atomic_save", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        attention_statistics(model, data, batch_size=1, checkpoint=ckpt, checkpoint_every=1)
    monkeypatch.setattr(datasets, "atomic_save", save)
    assert torch.load(ckpt, weights_only=True)["state"]["images"] == 2
    seen = []
    handle = model.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape[-2:])))
    try:
        with pytest.raises(ImageInputError, match=r"6x4 grid after images of a 4x6 grid"):
            attention_statistics(model, data, batch_size=1, checkpoint=ckpt)
    finally:
        handle.remove()
    assert seen == []  # refused at the first image after the checkpoint, before its forward pass


class Failing(Dataset):
    """Items of ``x``; raises at item ``fail_at`` (a run killed part-way)."""

    def __init__(self, x, fail_at=None):
        self.x, self.fail_at = x, fail_at

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyboardInterrupt("killed")
        return self.x[i]


def test_a_killed_run_resumes_from_its_checkpoint(tmp_path):
    model = tiny_timm_vit()
    x = images(9)
    want = vitviz.mean_attention_distance(model, x)
    ckpt = tmp_path / "distance.pt"
    with pytest.raises(KeyboardInterrupt):
        vitviz.mean_attention_distance(model, Failing(x, fail_at=7), batch_size=2, checkpoint=ckpt,
                                       checkpoint_every=1)
    saved = torch.load(ckpt, weights_only=True)
    assert saved["state"]["images"] == 6  # three whole batches were written before the kill
    seen = []
    handle = model.register_forward_pre_hook(lambda _m, args: seen.append(len(args[0])))
    got = vitviz.mean_attention_distance(model, Failing(x), batch_size=2, checkpoint=ckpt)
    handle.remove()
    assert sum(seen) == 3  # only the images after the checkpoint
    torch.testing.assert_close(got, want)
    # a finished checkpoint answers at once; another reduction or dataset size is refused
    torch.testing.assert_close(vitviz.mean_attention_distance(model, Failing(x), checkpoint=ckpt), want)
    with pytest.raises(CheckpointError, match="another run"):
        vitviz.mean_attention_distance(model, Failing(x[:5]), checkpoint=ckpt)
    with pytest.raises(CheckpointError, match="another run"):
        attention_statistics(model, Failing(x), checkpoint=ckpt)


def test_shard_sampler_splits_without_padding_and_skips():
    ds = list(range(7))
    shards = [list(ShardSampler(ds, num_replicas=3, rank=r)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert list(ShardSampler(ds, num_replicas=3, rank=0, skip=1)) == [3, 6]
    with pytest.raises(InputError, match="folder"):
        reduce_dataset(tiny_timm_vit(), "/nonexistent/folder", DistanceReduction(tiny_timm_vit()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, tests_dir: str) -> None:
    sys.path.insert(0, tests_dir)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        from conftest import tiny_timm_vit as build

        torch.manual_seed(0)
        model = build()
        ds = TensorDataset(images(7), torch.arange(7))
        got = vitviz.mean_attention_distance(model, ds, batch_size=2)
        stats = attention_statistics(model, ds, batch_size=3)
        # a user's loader: DistributedSampler pads 7 images to 8 with a repeat, which must not count twice
        padded = DataLoader(ds, batch_size=3, sampler=torch.utils.data.DistributedSampler(ds, shuffle=True))
        torch.save({"distance": got, "mean_attention": stats["mean_attention"],
                    "loader": vitviz.mean_attention_distance(model, padded)}, f"{out}.{rank}")
        # every rank done before any tears its group down: without it, a rank that destroyed its group and exited
        # while the other was still finishing aborted at exit now and then (torch 2.14.1's gloo: "terminate called
        # without an active exception", 5 of 16 runs; 2 of 74 with the barrier)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    # the results are saved and the group destroyed: leave without the interpreter's teardown, where torch's gloo
    # threads could still abort the process (after everything this test checks; 0 of 60 runs failed so)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.timeout(300)
def test_two_gloo_processes_equal_one(tmp_path):
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = images(7)
    want = vitviz.mean_attention_distance(model, x)
    want_stats = attention_statistics(model, x)
    out = str(tmp_path / "result")
    # spawn, not fork: a fork of this process, whose OpenMP thread pool earlier tests have used, can deadlock in
    # the child (seen with torch 2.5); spawned children import torch anew (seconds each) but are always safe
    torch.multiprocessing.start_processes(_worker, args=(2, _free_port(), out, str(Path(__file__).parent)),
                                          nprocs=2, start_method="spawn")
    for rank in range(2):  # every rank holds the whole dataset's result after the all-reduce
        got = torch.load(f"{out}.{rank}", weights_only=True)
        torch.testing.assert_close(got["distance"], want)
        torch.testing.assert_close(got["mean_attention"], want_stats["mean_attention"])
        torch.testing.assert_close(got["loader"], want)


@pytest.mark.gpu
def test_dataset_path_on_cuda_with_workers_pinned_memory_and_autocast():
    model = tiny_timm_vit()
    x = images(9)
    want = vitviz.mean_attention_distance(model, x)
    gpu = model.cuda()
    ds = TensorDataset(x)
    exact = vitviz.mean_attention_distance(gpu, ds, batch_size=4, num_workers=2, autocast=False)
    torch.testing.assert_close(exact, want, atol=1e-4, rtol=1e-4)
    half = vitviz.mean_attention_distance(gpu, ds, batch_size=4, num_workers=2)  # bfloat16 autocast by default
    torch.testing.assert_close(half, want, atol=0.5, rtol=0.05)


@pytest.mark.gpu
def test_a_batch_and_a_dataset_give_the_same_numbers_on_cuda_by_default():
    """One autocast rule for every input path: bfloat16 on CUDA by default for the tensor path as well."""
    model = tiny_timm_vit().cuda()
    x = images(6)
    for fn in (vitviz.mean_attention_distance, lambda m, s, **k: attention_statistics(m, s, **k)["entropy"]):
        torch.testing.assert_close(fn(model, x.cuda()), fn(model, TensorDataset(x), batch_size=32))
        torch.testing.assert_close(fn(model, x.cuda(), autocast=False), fn(model, TensorDataset(x), autocast=False))


def test_autocast_is_resolved_by_one_rule():
    from vitviz.core.datasets import autocast_dtype

    bf16, fp16 = torch.bfloat16, torch.float16
    want = {(None, "cuda"): bf16, (None, "cpu"): None, (True, "cuda"): bf16, (True, "cpu"): None,
            (False, "cuda"): None, (False, "cpu"): None, (fp16, "cuda"): fp16, (bf16, "cpu"): bf16}
    for (value, device), dtype in want.items():
        assert autocast_dtype(value, torch.device(device)) is dtype, (value, device)
    assert autocast_dtype(None, "cuda", default=None) is None  # faithfulness: none unless asked
    for bad in ("bf16", torch.float32, 1):
        with pytest.raises(InputError, match=r"autocast=.*torch\.bfloat16"):
            autocast_dtype(bad, "cpu")


def test_a_batch_and_a_dataset_run_under_the_same_autocast():
    """``autocast=`` means the same on a tensor as on a Dataset: the two agree to the bit, and differ from float32."""
    model = tiny_timm_vit()
    x = images(5)
    for fn in (vitviz.mean_attention_distance, lambda m, s, **k: attention_statistics(m, s, **k)["entropy"]):
        half = fn(model, x, autocast=torch.bfloat16)
        torch.testing.assert_close(fn(model, TensorDataset(x), autocast=torch.bfloat16), half, atol=0, rtol=0)
        full = fn(model, x)
        torch.testing.assert_close(fn(model, TensorDataset(x)), full, atol=0, rtol=0)
        assert (half - full).abs().max() > 1e-4  # bfloat16 did run
        torch.testing.assert_close(half, full, atol=0.5, rtol=0.05)


def test_dataset_batches_of_a_reduction_get_the_checks_of_a_tensor(tmp_path):
    """reduce_dataset (distance, statistics, features) checks every batch as the tensor path does."""
    from vitviz.errors import ImageInputError

    model = tiny_timm_vit()
    x = images(4)
    bad = {"NaN": x.clone().index_put_((torch.tensor([1]),), torch.tensor(float("nan"))),
           "one channel": x[:, :1], "uint8": (x * 50).clamp(0, 255).to(torch.uint8), "size": images(4)[..., :40]}
    for b in bad.values():
        for src in (TensorDataset(b), DataLoader(TensorDataset(b), batch_size=2)):
            with pytest.raises(ImageInputError, match="images"):
                vitviz.mean_attention_distance(model, src)
            with pytest.raises(ImageInputError, match="images"):
                attention_statistics(model, src)
    # float64 batches are cast to the model's dtype, as tensors are
    torch.testing.assert_close(vitviz.mean_attention_distance(model, TensorDataset(x.double())),
                               vitviz.mean_attention_distance(model, x))


def test_a_shuffled_loader_is_refused_only_where_order_matters(tmp_path):
    model = tiny_timm_vit()
    x = images(6)
    want = vitviz.mean_attention_distance(model, x)
    shuffled = DataLoader(TensorDataset(x), batch_size=2, shuffle=True)
    torch.testing.assert_close(vitviz.mean_attention_distance(model, shuffled), want)  # sums: order is irrelevant
    with pytest.raises(InputError, match=r"images= is a DataLoader with a RandomSampler.*shuffle=False"):
        vitviz.mean_attention_distance(model, shuffled, checkpoint=tmp_path / "d.pt")  # resuming skips by position
    assert not (tmp_path / "d.pt").exists()


class Noisy(Dataset):
    """Items of ``x`` plus fresh noise on every read (a random augmentation); counts its reads."""

    def __init__(self, x):
        self.x, self.reads = x, 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads += 1
        return self.x[i] + 0.1 * torch.randn_like(self.x[i])


def test_a_generic_dataset_of_the_same_class_and_length_with_other_images_is_refused(tmp_path):
    model = tiny_timm_vit()
    x = images(5)
    ckpt = tmp_path / "distance.pt"
    want = vitviz.mean_attention_distance(model, Failing(x), checkpoint=ckpt)
    for other in (x.flip(-1), torch.cat([x[:4], images(1) + 1])):  # every image, or only the last one, differs
        with pytest.raises(CheckpointError, match=r"differs in data \(the images read\)"):
            vitviz.mean_attention_distance(model, Failing(other), checkpoint=ckpt)
    torch.testing.assert_close(vitviz.mean_attention_distance(model, Failing(x.clone()), checkpoint=ckpt), want)


def test_a_randomly_augmenting_dataset_runs_but_cannot_be_checkpointed(tmp_path):
    model = tiny_timm_vit()
    noisy = Noisy(images(4))
    vitviz.mean_attention_distance(model, noisy, batch_size=2)  # no checkpoint: runs, reading each image once
    assert noisy.reads == 4
    ckpt = tmp_path / "distance.pt"
    with pytest.raises(CheckpointError, match=rf"checkpoint='{ckpt}': the Dataset Noisy gives its item 0 other "
                                              r"values each time it is read \(a random transform.*give the dataset "
                                              "a deterministic transform .*or run without checkpoint="):
        vitviz.mean_attention_distance(model, noisy, checkpoint=ckpt)
    assert not ckpt.exists()


def test_a_checkpoint_of_another_shard_or_a_dropped_tail_is_refused_and_a_batch_size_is_not(tmp_path):
    """A loader's checkpoint names the positions it reads: rank 1's loader must not be answered with rank 0's
    finished sums, nor a drop_last loader with the sums over the tail it leaves out."""
    model = tiny_timm_vit()
    ds = TensorDataset(images(7), torch.arange(7))

    def shard(rank, **kw):
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=False)
        return DataLoader(ds, batch_size=2, sampler=sampler, **kw)

    ckpt = tmp_path / "distance.pt"
    vitviz.mean_attention_distance(model, shard(0), checkpoint=ckpt)
    with pytest.raises(CheckpointError, match=r"differs in data \(the images read\)"):
        vitviz.mean_attention_distance(model, shard(1), checkpoint=ckpt)
    ckpt.unlink()
    vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=3), checkpoint=ckpt)
    with pytest.raises(CheckpointError, match=r"differs in data \(the images read\)"), \
            pytest.warns(ImagesLeftOutWarning):
        vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=3, drop_last=True), checkpoint=ckpt)
    # without drop_last the loader's batch size does not change which images it reads: the checkpoint resumes
    torch.testing.assert_close(vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=2), checkpoint=ckpt),
                               vitviz.mean_attention_distance(model, ds))
    # the features of rank 1's shard are rank 1's images, not rank 0's from the same checkpoint path
    feats = tmp_path / "features.pt"
    assert extract_features(model, shard(0), checkpoint=feats).labels.tolist() == [0, 2, 4, 6]
    with pytest.raises(CheckpointError, match="another run"):
        extract_features(model, shard(1), checkpoint=feats)


def test_a_loader_that_drops_its_last_batch_is_warned_about_on_both_dataset_paths(tmp_path):
    """A ``DataLoader(drop_last=True)`` whose last batch is short leaves images out of a result: the running sums
    (``reduce_dataset``: distance) and the per-image path (``iter_dataset``: features, faithfulness) warn, naming how
    many; the result is over the images read. A loader that reads every image does not warn."""
    import warnings

    model = tiny_timm_vit()
    x = images(7)
    ds = TensorDataset(x, torch.arange(7))
    dropping = DataLoader(ds, batch_size=3, drop_last=True)
    left_out = r"of the 7 images its sampler gives it reads 6 \(2 batches of 3\) and leaves the last 1 out.*drop_last=False"
    with pytest.warns(ImagesLeftOutWarning, match=left_out):
        got = vitviz.mean_attention_distance(model, dropping)
    torch.testing.assert_close(got, vitviz.mean_attention_distance(model, x[:6]))
    with pytest.warns(ImagesLeftOutWarning, match=left_out):
        assert extract_features(model, dropping).labels.tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.warns(ImagesLeftOutWarning, match=left_out):
        rows = vitviz.faithfulness(model, dropping, methods=["random"], steps=0.5)
    assert sorted(rows["image"].unique().tolist()) == [0, 1, 2, 3, 4, 5]
    sampled = DataLoader(ds, batch_size=2, drop_last=True, sampler=torch.utils.data.SequentialSampler(range(5)))
    with pytest.warns(ImagesLeftOutWarning, match=r"of the 5 images its sampler gives it reads 4 \(2 batches of 2\)"):
        vitviz.mean_attention_distance(model, sampled)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImagesLeftOutWarning)
        vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=3))  # reads every image
        vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=7, drop_last=True))  # no short batch
        extract_features(model, DataLoader(ds, batch_size=1, drop_last=True))


def test_a_distributed_sampler_that_drops_the_datasets_tail_is_warned_about():
    """DistributedSampler(drop_last=True) leaves the dataset's last images in no rank's shard: a result over one rank's
    loader (its batches all full) misses them and nothing said so; it warns on both dataset paths, naming how many.
    With drop_last=False (vitviz leaves the padding out) or a length that the ranks divide, it does not warn."""
    import warnings

    from torch.utils.data.distributed import DistributedSampler

    model = tiny_timm_vit()
    ds = TensorDataset(images(7), torch.arange(7))
    rank1 = DataLoader(ds, batch_size=1, sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False,
                                                                    drop_last=True))
    assert [int(y) for _, y in rank1] == [1, 3, 5]  # image 6 is in neither rank's shard
    left_out = r"DistributedSampler has drop_last=True, so of the dataset's 7 images its 2 ranks read 6 and leave " \
               r"the last 1 out.*drop_last=False"
    with pytest.warns(ImagesLeftOutWarning, match=left_out):
        vitviz.mean_attention_distance(model, rank1)
    with pytest.warns(ImagesLeftOutWarning, match=left_out):
        assert extract_features(model, rank1).labels.tolist() == [1, 3, 5]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImagesLeftOutWarning)
        vitviz.mean_attention_distance(model, DataLoader(ds, batch_size=1, sampler=DistributedSampler(
            ds, num_replicas=2, rank=1, shuffle=False)))
        even = TensorDataset(images(6), torch.arange(6))
        vitviz.mean_attention_distance(model, DataLoader(even, batch_size=1, sampler=DistributedSampler(
            even, num_replicas=2, rank=1, shuffle=False, drop_last=True)))


class Stream(torch.utils.data.IterableDataset):
    """The images of ``x`` (labelled 0) read in order, with no length: an ``IterableDataset``."""

    def __init__(self, x):
        self.x = x

    def __iter__(self):
        return iter([(img, 0) for img in self.x])


ANALYSES = {"mean_attention_distance": vitviz.mean_attention_distance, "attention_statistics": attention_statistics}


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_a_dataset_gets_the_argument_checks_of_a_batch(name, tmp_path):
    """On a Dataset or DataLoader the arguments are checked as on a tensor, each error naming the argument, its value
    and the fix (before: bare TypeErrors and torch's ValueError); no images at all is the tensor path's error, not
    an error about the forward pass; an IterableDataset is read as it yields (its result that of the batch), refused
    only where vitviz cannot shard it (loader workers) and when it yields nothing."""
    from vitviz.errors import ImageInputError, InputTypeError

    fn, model, x = ANALYSES[name], tiny_timm_vit(), images(5)
    ds = TensorDataset(x, torch.zeros(5))
    for bad in (2.5, True, "4", 0):
        with pytest.raises(InputError, match=rf"batch_size={bad!r} is not a positive number"):
            fn(model, ds, batch_size=bad)
    with pytest.raises(InputError, match=r"batch_size=None .* pass an integer"):
        fn(model, ds, batch_size=None)
    with pytest.raises(InputError, match=r"checkpoint_every='5' is not a positive number of batches"):
        fn(model, ds, checkpoint=tmp_path / "run.pt", checkpoint_every="5")
    with pytest.raises(InputTypeError, match=r"checkpoint=5 is not a file path"):
        fn(model, ds, checkpoint=5)
    with pytest.raises(InputError, match=r"is a folder; pass a file path in it"):
        fn(model, ds, checkpoint=tmp_path)
    for empty in (TensorDataset(x[:0], torch.zeros(0)), DataLoader(TensorDataset(x[:0], torch.zeros(0))),
                  Stream(x[:0])):
        with pytest.raises(ImageInputError, match=r"images: 0 images|yielded 0 images"):
            fn(model, empty, batch_size=2)
    want, got = fn(model, x), fn(model, Stream(x), batch_size=2)
    for key in (want if isinstance(want, dict) else [None]):
        w, g = (want, got) if key is None else (want[key], got[key])
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match=r"IterableDataset, which vitviz cannot shard between loader workers"):
        fn(model, Stream(x), batch_size=2, num_workers=1)
    with pytest.raises(InputTypeError, match=r"reduction=None is not a RunningReduction"):
        reduce_dataset(model, ds, None)


def test_a_dataset_of_dicts_is_refused_naming_its_keys_and_the_fix():
    """Hugging Face datasets yield dicts; the message once named neither images= nor the keys nor the fix."""
    from torch.utils.data import DataLoader, Dataset

    class Dicts(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"pixel_values": torch.zeros(3, 32, 48), "label": i}

    model = tiny_timm_vit()
    for source in (Dicts(), DataLoader(Dicts(), batch_size=2)):
        with pytest.raises(vitviz.InputError, match=r"images: a batch of the Dataset / DataLoader .* got a dict with "
                                                    r"keys \['label', 'pixel_values'\].*item\['pixel_values'\]"):
            vitviz.mean_attention_distance(model, source)
