"""``faithfulness(out=...)``: a killed run resumes to the uninterrupted result; files of other runs are refused."""

from __future__ import annotations

import copy
import json
import re

import pandas as pd
import pytest
import torch
from conftest import tiny_timm_vit
from torch.utils.data import IterableDataset, TensorDataset

import vitviz
from vitviz.analysis import faithfulness as fa
from vitviz.errors import CheckpointError, InputError

RUN = dict(modes=["deletion", "positive"], steps=0.5, progress=False, batch_size=2)


def killed(monkeypatch, model, images, out, **kw):
    """Run until the second batch raises (a kill): ``out`` holds the first batch's rows."""
    batch = fa._batch
    calls = []

    def dies(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return batch(*a, **k)

    monkeypatch.setattr(fa, "_batch", dies)
    with pytest.raises(KeyboardInterrupt):
        vitviz.faithfulness(model, images, out=out, **kw)
    monkeypatch.setattr(fa, "_batch", batch)


def killed_then_resumed(monkeypatch, model, images, out, n_images=None, **kw):
    """Run until the second batch raises (a kill), then rerun with the same arguments."""
    killed(monkeypatch, model, images, out, **kw)
    written = pd.read_csv(out, dtype=str)["image"].nunique()
    assert 0 < written < (len(images) if n_images is None else n_images)  # the first batch was written, the rest was not
    return vitviz.faithfulness(model, images, out=out, **kw)


CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
import torch
from conftest import tiny_timm_vit
import vitviz
torch.set_num_threads({threads})  # the parent's: CPU reductions over another thread count may round otherwise
torch.manual_seed(0)
model = tiny_timm_vit()
x = torch.randn(8, 3, 32, 48)
model.register_forward_hook(lambda *_: time.sleep(0.02))  # slow enough to be killed part-way
vitviz.faithfulness(model, x, out={out!r}, methods=["rollout", "random"], **{run!r})
"""


def test_a_run_killed_for_real_resumes_to_the_uninterrupted_frame(tmp_path):
    """SIGKILL at an arbitrary point after two images were written (mid-write included): the rerun continues from
    what the file holds and returns the uninterrupted run's frame to the bit."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "curves.csv"
    run = dict(RUN, batch_size=1)
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent), out=str(out), run=run,
                                   threads=torch.get_num_threads()))
    child = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL)
    try:
        while child.poll() is None and not (out.exists() and pd.read_csv(out, dtype=str)["image"].nunique() >= 2):
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL  # killed, not finished or failed
    assert 2 <= pd.read_csv(out, dtype=str)["image"].nunique() < 8
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = torch.randn(8, 3, 32, 48)
    resumed = vitviz.faithfulness(model, x, out=out, methods=["rollout", "random"], **run)
    plain = vitviz.faithfulness(model, x, methods=["rollout", "random"], **run)
    pd.testing.assert_frame_equal(resumed, plain, check_exact=True)


@pytest.mark.parametrize("ids", [None, ["001", "002", "010", "1e3", "7"], [10, 11, 12, 13, 14]])
def test_a_killed_run_resumes_to_the_uninterrupted_frame(tmp_path, monkeypatch, ids):
    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    kw = dict(RUN, methods={"random": "random", "7": "rollout"}, image_ids=ids)  # a method name that reads as a number
    plain = vitviz.faithfulness(model, x, **kw)
    for images in (x, TensorDataset(x)):
        out = tmp_path / f"curves_{type(images).__name__}.csv"
        resumed = killed_then_resumed(monkeypatch, model, images, out, **kw)
        pd.testing.assert_frame_equal(resumed, plain, check_exact=True)
        assert len(pd.read_csv(out)) == len(plain)
        again = vitviz.faithfulness(model, images, out=out, **kw)  # finished: nothing recomputed or appended
        pd.testing.assert_frame_equal(again, resumed)
    with pytest.raises(InputError, match="read the same as text"):
        vitviz.faithfulness(model, x[:2], image_ids=[1, "1"], **{k: v for k, v in kw.items() if k != "image_ids"})


@pytest.mark.parametrize("change, key", [
    (dict(seed=1), "seed"), (dict(steps=0.25), "steps"), (dict(target=[0, 1, 2, 3]), "target"),
    (dict(target=1), "target"), (dict(labels=[0, 1, 2, 3]), "labels"), (dict(removal="mean"), "removal"),
    (dict(methods=["rollout"]), "methods"), (dict(modes=["deletion"]), "modes"),
    (dict(method_options={"rollout": {"head_fusion": "max"}}), "method_options"),
])
def test_a_file_of_another_run_is_refused(tmp_path, change, key):
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random", "rollout"], out=out)
    vitviz.faithfulness(model, x[:2], **kw)
    with pytest.raises(CheckpointError, match=rf"out='{out}' holds another run \(differs in [^:]*\b{key}\b.*delete .* or "
                                              "pass another out="):
        vitviz.faithfulness(model, x, **{**kw, **change})


def test_fill_model_and_data_set_are_part_of_the_fingerprint(tmp_path):
    from vitviz.analysis.faithfulness_resume import sidecar

    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random"], removal="mean", out=out)
    vitviz.faithfulness(model, x[:2], **kw)
    with pytest.raises(CheckpointError, match="differs in fill"):
        vitviz.faithfulness(model, x, fill=[1.0, 0.0, 0.0], **kw)
    other = tiny_timm_vit()  # same class and shapes, other weights
    with pytest.raises(CheckpointError, match="differs in model"):
        vitviz.faithfulness(other, x, **kw)
    pooled = copy.deepcopy(model)
    pooled.global_pool = "avg"  # the same tensors, another readout: other scores
    assert not torch.equal(pooled(x), model(x))
    with pytest.raises(CheckpointError, match="differs in readout"):
        vitviz.faithfulness(pooled, x, **kw)
    data = tmp_path / "data.csv"
    vitviz.faithfulness(model, TensorDataset(x), **{**kw, "out": data})
    with pytest.raises(CheckpointError, match="differs in images"):
        vitviz.faithfulness(model, TensorDataset(x + 1), **{**kw, "out": data})
    assert json.loads(sidecar(data).read_text())["seed"] == 0


def test_a_file_without_fingerprint_is_refused(tmp_path):
    from vitviz.analysis.faithfulness_resume import sidecar

    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random"], out=out)
    vitviz.faithfulness(model, x, **kw)
    sidecar(out).unlink()  # as an older vitviz left it
    with pytest.raises(CheckpointError, match="has no fingerprint file .*delete .* or pass another out="):
        vitviz.faithfulness(model, x, **kw)
    out.unlink()  # no rows: a fresh run, whatever fingerprint was left
    assert len(vitviz.faithfulness(model, x, **kw)) == len(vitviz.faithfulness(model, x, **{**kw, "out": None}))


def test_other_pixels_under_ids_already_written_are_refused_and_more_images_resume(tmp_path, monkeypatch):
    """Tensor inputs are digested image by image: a rerun may add images (chunks), but an id whose rows out= holds
    must still name the same pixels."""
    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    kw = dict(RUN, methods=["random", "rollout"])
    out = tmp_path / "curves.csv"
    vitviz.faithfulness(model, x[:2], out=out, **kw)
    grown = vitviz.faithfulness(model, x, out=out, **kw)  # three more images: resumed, not refused
    pd.testing.assert_frame_equal(grown, vitviz.faithfulness(model, x, **kw), check_exact=True)
    with pytest.raises(CheckpointError, match=r"image id\(s\) \['0', '1'\] computed on other pixels"):
        vitviz.faithfulness(model, x[:2].flip(-1), out=out, **kw)
    other = torch.cat([x[:4], torch.randn(1, 3, 32, 48)])
    with pytest.raises(CheckpointError, match=r"\['4'\]"):
        vitviz.faithfulness(model, other, out=out, **kw)
    # ids of their own: the same file takes the new images
    more = vitviz.faithfulness(model, x[:2].flip(-1), out=out, image_offset=5, **kw)
    assert sorted(more["image"].unique()) == list(range(7))


def test_a_text_id_that_reads_as_a_number_is_not_taken_for_that_number(tmp_path):
    """A chunk numbered by image_ids= ("001") and the next by image_offset= (1): the id "001" read back from out= is
    the text it was written as, not the number 1, so the image with id 1 is scored on its own pixels, never answered
    from the rows of "001"."""
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    kw = dict(RUN, methods=["random", "rollout"])
    out = tmp_path / "curves.csv"
    first = vitviz.faithfulness(model, x[:1], image_ids=["001"], out=out, **kw)
    grown = vitviz.faithfulness(model, x[1:], image_offset=1, out=out, **kw)
    alone = vitviz.faithfulness(model, x[1:], image_offset=1, **kw)
    pd.testing.assert_frame_equal(grown, pd.concat([first, alone], ignore_index=True), check_exact=True)
    assert grown["image"].tolist().count("001") == len(first)


class _Stream(IterableDataset):
    """An iterable data set (no length: its ids are counted as its images come)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __iter__(self):
        return iter(self.x)


@pytest.mark.parametrize("ids", [None, [10, 11, 12, 13], ["a", "b", "c", "d"]])
def test_a_killed_run_over_an_iterable_data_set_resumes_to_the_uninterrupted_frame(tmp_path, monkeypatch, ids):
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    kw = dict(RUN, methods=["random", "rollout"], image_ids=ids)
    plain = vitviz.faithfulness(model, _Stream(x), **kw)
    resumed = killed_then_resumed(monkeypatch, model, _Stream(x), tmp_path / "curves.csv", len(x), **kw)
    pd.testing.assert_frame_equal(resumed, plain, check_exact=True)


def test_a_callable_target_or_method_is_known_by_its_code_and_closure(tmp_path):
    """Two lambdas, or two closures of one factory, share a qualified name; the fingerprint tells them apart."""
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random"], out=out)
    first = vitviz.faithfulness(model, x[:2], target=lambda o: o[:, 3], **kw)
    with pytest.raises(CheckpointError, match=r"differs in target\b"):
        vitviz.faithfulness(model, x, target=lambda o: o[:, 1], **kw)

    def column(k):
        return lambda o: o[:, k]

    out2 = tmp_path / "closure.csv"
    vitviz.faithfulness(model, x[:2], target=column(3), **{**kw, "out": out2})
    with pytest.raises(CheckpointError, match=r"differs in target\b"):
        vitviz.faithfulness(model, x, target=column(1), **{**kw, "out": out2})
    resumed = vitviz.faithfulness(model, x, target=column(3), **{**kw, "out": out2})  # the same closure resumes
    pd.testing.assert_frame_equal(resumed[resumed["image"] < 2], first, check_exact=True)

    def attention_of(layer):
        return lambda m, images, target: vitviz.explain(m, images, "attention", layer=layer)

    out3 = tmp_path / "methods.csv"
    vitviz.faithfulness(model, x[:2], **{**kw, "methods": {"r": attention_of(-1)}, "out": out3})
    with pytest.raises(CheckpointError, match=r"differs in methods\b"):
        vitviz.faithfulness(model, x, **{**kw, "methods": {"r": attention_of(0)}, "out": out3})


def test_a_file_of_an_older_vitviz_without_the_removed_column_is_refused(tmp_path):
    """Files written before the column ``removed`` (the fraction of patches actually removed) existed: their rows
    cannot be continued by rows that have it, and the error says what to do."""
    from vitviz.analysis.faithfulness_resume import sidecar

    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random"])
    vitviz.faithfulness(model, x[:2], out=out, **kw)
    # as the older vitviz wrote them: no "removed" in the rows nor in the fingerprint's columns
    pd.read_csv(out, dtype=str).drop(columns="removed", errors="ignore").to_csv(out, index=False)
    fp = json.loads(sidecar(out).read_text())
    sidecar(out).write_text(json.dumps({**fp, "columns": [c for c in fp["columns"] if c != "removed"]}))
    with pytest.raises(CheckpointError, match=rf"out='{out}' was written by another version of vitviz: its rows have "
                                              r"the columns \['image', 'method', 'mode', 'fraction', 'score', .*"
                                              r"lacks \['removed'\].*delete .* or pass another out="):
        vitviz.faithfulness(model, x, out=out, **kw)
    fresh = vitviz.faithfulness(model, x, out=tmp_path / "new.csv", **kw)  # the fix the error names
    pd.testing.assert_frame_equal(fresh, vitviz.faithfulness(model, x, **kw), check_exact=True)
    assert "removed" in pd.read_csv(tmp_path / "new.csv").columns


def _cut(text: str) -> str:
    return "".join(text.splitlines(keepends=True)[:-3])[:-10]  # a copy cut off mid-line


def _garble(line: str, column: str, value: str) -> str:
    from vitviz.analysis.faithfulness_resume import COLUMNS

    fields = line.rstrip("\n").split(",")
    fields[COLUMNS.index(column)] = value
    return ",".join(fields) + "\n"


@pytest.mark.parametrize("damage, why", [
    (lambda t: "".join(t.splitlines(keepends=True)[:-3]), r"incomplete rows for image id\(s\) \['2', '3'\] \('2': 5 "
                                                          r"rows, '3': 4 rows\), where this run writes 6 per image"),
    (_cut, r"holds removal '' at line \d+"),
    (lambda t: t[:t.rindex("\n", 0, -1) + 1] + _garble(t.splitlines()[-1], "metric", "accu"),
     r"holds metric 'accu' at line 25, where this run writes 'accuracy' for mode 'positive'"),
    (lambda t: t + "3,random,positive,1,2,3,4,5,6,7\n", r"cannot be read as a vitviz.faithfulness table \(.*fields"),
    (lambda t: t + t.splitlines(keepends=True)[-1], r"incomplete rows for image id\(s\) \['3'\] \('3': 7 rows \(1 "
                                                    r"repeated\)\)"),
    (lambda t: t[:t.rindex("\n", 0, -1) + 1] + _garble(t.splitlines()[-1], "mode", "x"), r"holds mode 'x' at line 25"),
    (lambda t: t[:t.rindex("\n", 0, -1) + 1] + _garble(t.splitlines()[-1], "method", "rollout"),
     r"holds method 'rollout' at line 25"),
    (lambda t: t[:t.rindex("\n", 0, -1) + 1] + _garble(t.splitlines()[-1], "score", "0.5x"),
     r"holds score '0.5x' at line 25, not a number"),
    (lambda t: t[:t.rindex("\n", 0, -1) + 1] + _garble(t.splitlines()[-1], "fraction", "0.25"),
     r"holds fraction 0.25 at line 25, which is not a step of this run"),
    (lambda t: t.replace(",", ",,", 1), r"cannot be read|is not a vitviz.faithfulness table"),
    (lambda t: "", r"cannot be read as a vitviz.faithfulness table"),
])
def test_a_cut_off_or_garbled_file_is_refused_not_resumed(tmp_path, damage, why):
    """vitviz writes out= whole, but a copy cut off or a file edited by hand may lack rows of an image or hold values
    no run writes: refused, naming the file, what is wrong and the fix, never continued as if the image were done."""
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random"], out=out)
    whole = vitviz.faithfulness(model, x, **kw)
    assert len(whole) == 4 * 6  # one method x two modes x three steps per image
    out.write_text(damage(out.read_text()))
    with pytest.raises(CheckpointError, match=rf"out='{out}' .*{why}.*delete .* or pass another out="):
        vitviz.faithfulness(model, x, **kw)
    out.unlink()  # the fix the error names: the run starts over and gives the whole table
    pd.testing.assert_frame_equal(vitviz.faithfulness(model, x, **kw), whole, check_exact=True)


@pytest.mark.parametrize("arg", ["labels", "target"])
def test_per_image_labels_or_targets_grow_a_chunked_run_but_never_change_for_a_written_image(tmp_path, arg):
    """Per-image labels= / target= are kept id by id: a rerun over more images resumes (the new images bring their
    own classes), but an id whose rows out= holds must keep the class its rows were scored with."""
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    out = tmp_path / "curves.csv"
    kw = dict(RUN, methods=["random", "rollout"])
    classes = torch.tensor([0, 1, 2, 3])
    vitviz.faithfulness(model, x[:2], out=out, **{arg: classes[:2]}, **kw)
    grown = vitviz.faithfulness(model, x, out=out, **{arg: classes}, **kw)  # resumed, not refused
    pd.testing.assert_frame_equal(grown, vitviz.faithfulness(model, x, **{arg: classes}, **kw), check_exact=True)
    with pytest.raises(CheckpointError, match=rf"out='{out}' holds rows for image id\(s\) \['0', '3'\] scored with "
                                              rf"other per-image {arg}= than given now \('0': 0 there, 4 now, '3': 3 "
                                              r"there, 0 now\).*delete .* or pass another out="):
        vitviz.faithfulness(model, x, out=out, **{arg: torch.tensor([4, 1, 2, 0])}, **kw)
    # a later chunk under ids of its own, with classes of its own
    more = vitviz.faithfulness(model, x[:2].flip(-1), out=out, image_offset=4, **{arg: [1, 0]}, **kw)
    assert sorted(more["image"].unique()) == list(range(6))
    again = vitviz.faithfulness(model, x, out=out, **{arg: classes}, **kw)  # nothing to score: the written rows
    pd.testing.assert_frame_equal(again[again["image"] < 4].reset_index(drop=True), grown, check_exact=True)



@pytest.mark.parametrize("first, then, column", [
    (dict(modes=["positive", "deletion"]), dict(modes=["deletion", "positive"]), "modes"),
    (dict(methods=["rollout", "random"]), dict(methods=["random", "rollout"]), "methods")])
def test_a_rerun_with_the_modes_or_methods_in_another_order_is_refused(tmp_path, monkeypatch, first, then, column):
    # the fingerprint compares modes (sorted) and methods (a dict) regardless of their order, so a rerun given them
    # in another order continued the file: its table held the old images' rows in the old order and the new ones in
    # the new, equal to no fresh run; it is refused, naming the order that continues the file
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    kw = {**RUN, "methods": ["random"], **first}
    out = tmp_path / "curves.csv"
    killed(monkeypatch, model, x, out, **kw)
    with pytest.raises(CheckpointError, match=rf"out='{out}' was written with the {column} in the order "
                                              rf"{re.escape(repr(first[column]))}, this run gives "
                                              rf"{re.escape(repr(then[column]))}"):
        vitviz.faithfulness(model, x, out=out, **{**kw, **then})
    resumed = vitviz.faithfulness(model, x, out=out, **kw)  # the order that wrote it continues it
    pd.testing.assert_frame_equal(resumed, vitviz.faithfulness(model, x, **kw), check_exact=True)
