"""``vitviz.core.digest``: a callable is known by its code and closure, a generic Dataset by some of its items."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from vitviz.core.digest import callable_digest, source_digest
from vitviz.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[1]


def column(k):
    return lambda out: out[:, k]


def pick(out, k):
    return out[:, k]


class Column:
    """A callable object with a default repr: told apart by its attributes."""

    def __init__(self, k, weights=None):
        self.k, self.weights = k, weights

    def __call__(self, out):
        return out[:, self.k]

    def score(self, out):
        return out[:, self.k]


class Opaque:
    """An object whose repr shows its memory address."""


def test_lambdas_closures_partials_and_objects_that_compute_other_things_differ():
    three, five = (lambda out: out[:, 3]), (lambda out: out[:, 5])
    assert three.__qualname__ == five.__qualname__  # the name alone cannot tell them apart
    assert callable_digest(three) != callable_digest(five)
    assert callable_digest(column(3)) != callable_digest(column(5))
    assert callable_digest(column(3)) == callable_digest(column(3))  # two closures over the same value
    assert callable_digest(functools.partial(pick, k=3)) != callable_digest(functools.partial(pick, k=5))
    assert callable_digest(functools.partial(pick, k=3)) == callable_digest(functools.partial(pick, k=3))
    assert callable_digest(Column(3)) != callable_digest(Column(5))
    assert callable_digest(Column(3).score) != callable_digest(Column(5).score)
    assert callable_digest(Column(3).score) != callable_digest(Column(3))
    w = torch.arange(4.0)
    assert callable_digest(Column(3, w)) == callable_digest(Column(3, w.clone()))
    assert callable_digest(Column(3, w)) != callable_digest(Column(3, w + 1))
    assert callable_digest(lambda out, k=3: out[:, k]) != callable_digest(lambda out, k=5: out[:, k])
    lin = torch.nn.Linear(2, 2)
    other = torch.nn.Linear(2, 2)
    assert callable_digest(lin) != callable_digest(other)  # a module: by its weights
    other.load_state_dict(lin.state_dict())
    assert callable_digest(lin) == callable_digest(other)


def test_the_digest_stays_while_a_function_runs_and_ignores_memory_addresses():
    fn = column(2)
    before = callable_digest(fn)
    for _ in range(200):  # Python specialises the bytecode of hot functions; the digest must not follow
        fn(torch.randn(2, 4))
    assert callable_digest(fn) == before != callable_digest(column(3))
    a, b = Opaque(), Opaque()  # known by their class only: their reprs differ in the address
    assert callable_digest(functools.partial(pick, a)) == callable_digest(functools.partial(pick, b))
    assert callable_digest(functools.partial(pick, a)) != callable_digest(functools.partial(pick, 3))


def test_the_same_source_has_the_same_digest_in_another_process():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_digest import examples
        from vitviz.core.digest import callable_digest
        print(" ".join(callable_digest(f) for f in examples()))
    """)
    outs = [subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}).stdout
            for seed in ("1", "2")]  # string hashing (a set's order) differs between the two processes
    digests = [callable_digest(f) for f in examples()]
    assert outs[0].split() == outs[1].split() == digests
    assert len(set(digests)) == len(digests)  # and they tell the examples apart


def in_set(s):
    return s in {"a", "b", "c", "d"}


SCALE = 2.5  # read by scaled: a module-level global counts by its value


def scaled(out):
    return np.sqrt(out) * SCALE


def fact(n):
    return 1 if n < 2 else n * fact(n - 1)


def even(n):
    return n == 0 or odd(n - 1)


def odd(n):
    return n != 0 and even(n - 1)


def examples():
    return [column(3), column(5), functools.partial(pick, k=5), functools.partial(pick, k=3),
            Column(3, torch.arange(4.0)), Column(3), Column(3).score, functools.partial(pick, Opaque()), in_set,
            lambda s: s in {"x", "y", "z"}, lambda s: s in {"x", "y"}, torch.argmax, scaled, fact, even, odd]


def defined(source, **scope):
    """The functions ``source`` defines, run in a fresh globals dict holding ``scope`` (no module state changes)."""
    scope = {"__name__": "digest_example", **scope}
    exec(source, scope)  # noqa: S102 (test code of our own)
    return scope


def test_the_values_of_the_globals_a_function_reads_count():
    reads = (lambda out: out[:, CLASS]).__code__  # noqa: F821 (CLASS is given by each globals dict below)
    three, five = types.FunctionType(reads, {"CLASS": 3}), types.FunctionType(reads, {"CLASS": 5})
    assert callable_digest(three) != callable_digest(five)
    assert callable_digest(three) == callable_digest(types.FunctionType(reads, {"CLASS": 3, "OTHER": 1}))
    source = "def helper(out):\n    return out * SCALE\ndef target(out):\n    return helper(out)[:, CLASS]\n"
    one, two = defined(source, SCALE=1.0, CLASS=3), defined(source, SCALE=2.0, CLASS=3)
    assert callable_digest(one["target"]) != callable_digest(two["target"])  # through the global helper's global
    assert callable_digest(one["target"]) == callable_digest(defined(source, SCALE=1.0, CLASS=3)["target"])
    nested = "def target(out):\n    return [o[:, CLASS] for o in out]\n"  # read in a nested code object
    assert callable_digest(defined(nested, CLASS=3)["target"]) != callable_digest(defined(nested, CLASS=5)["target"])


def test_a_global_tensor_counts_by_its_values():
    source = "def target(out):\n    return out @ W\n"
    w = torch.arange(4.0)
    digest = callable_digest(defined(source, W=w)["target"])
    assert digest == callable_digest(defined(source, W=w.clone())["target"])
    assert digest != callable_digest(defined(source, W=w + 1)["target"])
    array = callable_digest(defined(source, W=w.numpy())["target"])  # an array by its values too
    assert array == callable_digest(defined(source, W=w.numpy().copy())["target"])
    assert array != callable_digest(defined(source, W=(w + 1).numpy())["target"])


def test_recursive_and_mutually_recursive_functions_hash_deterministically():
    source = ("def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n"
              "def even(n):\n    return n == 0 or odd(n - 1)\n"
              "def odd(n):\n    return n != 0 and even(n - 1)\n")
    one, two = defined(source), defined(source)
    digests = [callable_digest(one[name]) for name in ("fact", "even", "odd")]
    assert digests == [callable_digest(two[name]) for name in ("fact", "even", "odd")]  # other ids, same digests
    assert len(set(digests)) == 3
    edited = defined(source.replace("odd(n - 1)", "odd(n - 2)"))
    assert callable_digest(edited["odd"]) != callable_digest(one["odd"])  # even, which odd reads, changed


def test_a_global_module_counts_by_its_name_only():
    source = "def target(out):\n    return out * np.pi + lib.OFFSET\n"
    lib, other = types.ModuleType("lib"), types.ModuleType("lib")
    lib.OFFSET, other.OFFSET = torch.zeros(1000, 1000), torch.ones(3)
    start = time.perf_counter()
    digest = callable_digest(defined(source, np=np, lib=lib)["target"])
    assert time.perf_counter() - start < 1.0  # numpy's contents (and lib's big tensor) are not walked
    assert digest == callable_digest(defined(source, np=np, lib=other)["target"])  # seen only as the name "lib"
    assert digest != callable_digest(defined(source, np=np, lib=types.ModuleType("lib2"))["target"])


class Items(Dataset):
    """A plain map-style Dataset (no files, samples or data attributes); counts its reads."""

    def __init__(self, x, y, noise=0.0):
        self.x, self.y, self.noise, self.reads = x, y, noise, 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads += 1
        return self.x[i] + self.noise * torch.randn_like(self.x[i]), int(self.y[i])


def test_a_generic_dataset_is_known_by_its_items_and_a_random_one_is_refused():
    x, y = torch.randn(7, 3, 4, 4), torch.arange(7)
    ds = Items(x, y)
    assert source_digest(ds) == source_digest(Items(x.clone(), y))
    assert ds.reads == 4  # item 0 twice, then the middle and the last
    for other in (Items(x.flip(0), y), Items(torch.cat([x[:6], x[6:] + 1]), y), Items(x, y.flip(0))):
        assert source_digest(other) != source_digest(ds)
    assert source_digest(DataLoader(ds)) != source_digest(DataLoader(Items(x + 1, y)))
    assert source_digest(Subset(ds, [1, 2])) != source_digest(Subset(Items(x + 1, y), [1, 2]))
    state = torch.get_rng_state(), np.random.get_state()[1].copy()
    with pytest.raises(CheckpointError, match=r"out='c\.csv': the Dataset Items gives its item 0 other values each "
                                              r"time it is read \(a random transform.*deterministic transform.*"
                                              "or run without out="):
        source_digest(Items(x, y, noise=1.0), "out='c.csv'")
    assert torch.equal(torch.get_rng_state(), state[0])  # the loads drew nothing from the run's generators
    assert np.array_equal(np.random.get_state()[1], state[1])


class Paths(Dataset):
    """A map-style Dataset of image files, its paths and labels in attributes of its own names (not ``files`` or
    ``samples``), or in a pandas table."""

    def __init__(self, paths, labels, table=False):
        if table:
            import pandas as pd

            self.table = pd.DataFrame({"path": [str(p) for p in paths], "label": labels})
        else:
            self.image_paths, self.classes_of = list(paths), list(labels)

    def __len__(self):
        return len(self.table) if hasattr(self, "table") else len(self.image_paths)

    def __getitem__(self, i):
        path, label = ((self.table.path[i], int(self.table.label[i])) if hasattr(self, "table")
                       else (self.image_paths[i], self.classes_of[i]))
        return torch.from_numpy(np.load(path)), label


@pytest.mark.parametrize("table", [False, True], ids=["lists", "pandas"])
def test_a_generic_dataset_is_known_by_the_paths_and_labels_it_holds(tmp_path, table):
    """Items 0, 2 and 4 of five are read; an image replaced at 1 or one label changed there was not seen."""
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.npy")
        np.save(paths[-1], np.full((3, 4, 4), i, dtype=np.float32))
    labels = [0, 1, 2, 3, 4]
    before = source_digest(Paths(paths, labels, table))
    assert source_digest(Paths(paths, labels, table)) == before
    assert source_digest(Paths(paths, [0, 9, 2, 3, 4], table)) != before  # a label no read item shows
    np.save(paths[1], np.full((3, 4, 4), 7, dtype=np.float32))  # another image at a position no read item shows
    os.utime(paths[1], ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a new time, as an edit gives
    assert source_digest(Paths(paths, labels, table)) != before


def test_a_transform_is_known_by_what_it_computes():
    """A plain function as a transform resumes (no memory address in the digest); two Lambdas differ."""
    import subprocess
    import sys

    from torchvision import transforms

    from vitviz.core.digest import source_digest

    class Files(torch.utils.data.Dataset):
        files = ["a.jpg", "b.jpg"]  # a folder-style dataset: its items are not read for the digest

        def __init__(self, transform):
            self.transform = transform

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return self.transform(torch.zeros(3, 4, 4))

    def scale(x):
        return x * 2

    one = transforms.Compose([transforms.Lambda(lambda x: x * 2)])
    two = transforms.Compose([transforms.Lambda(lambda x: x * 3)])
    assert repr(one) == repr(two)
    assert source_digest(Files(one)) != source_digest(Files(two))
    assert source_digest(Files(one)) == source_digest(Files(transforms.Compose([transforms.Lambda(lambda x: x * 2)])))
    code = ("import torch\nfrom vitviz.core.digest import source_digest\n"
            "class Files(torch.utils.data.Dataset):\n    files = ['a.jpg', 'b.jpg']\n"
            "    def __init__(self, transform):\n        self.transform = transform\n"
            "    def __len__(self):\n        return 2\n"
            "def scale(x):\n    return x * 2\n"
            "print(source_digest(Files(scale)))\n")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(runs) == 1  # a function's repr shows its address; its digest does not
    assert source_digest(Files(scale)) != source_digest(Files(lambda x: x * 2))


def test_a_target_transform_counts_so_cached_features_keep_their_labels(tmp_path, tiny_folder):
    """torchvision's ImageFolder is known by its files, so its items are never read for the digest: the labels its
    ``target_transform`` makes must count, or features cached with other labels come back as this run's."""
    from conftest import tiny_timm_vit
    from torchvision import datasets, transforms

    from vitviz.core.features import extract_features

    tf = transforms.Compose([transforms.Resize((32, 48)), transforms.ToTensor()])
    plain = datasets.ImageFolder(str(tiny_folder / "test"), tf)
    shifted = datasets.ImageFolder(str(tiny_folder / "test"), tf, target_transform=lambda y: (y + 1) % 10)
    assert source_digest(plain) != source_digest(shifted)
    assert source_digest(shifted) == source_digest(
        datasets.ImageFolder(str(tiny_folder / "test"), tf, target_transform=lambda y: (y + 1) % 10))
    model = tiny_timm_vit()
    few = torch.utils.data.Subset(plain, [0, 50])
    ckpt = tmp_path / "features.pt"
    labels = extract_features(model, few, checkpoint=ckpt).labels
    with pytest.raises(CheckpointError, match="another run"):
        extract_features(model, torch.utils.data.Subset(shifted, [0, 50]), checkpoint=ckpt)
    assert extract_features(model, torch.utils.data.Subset(shifted, [0, 50])).labels.tolist() == [
        (y + 1) % 10 for y in labels.tolist()]
