"""Arguments of ``vitviz.faithfulness``: labels, fill, the ranking of float64 maps, the axis label of labelled runs;
arguments of the wrong type, one mode given as a string, steps finer than one patch, no images, a folder as ``out=``."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import tiny_timm_vit
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import vitviz
from vitviz.analysis.perturbation import rank_patches
from vitviz.errors import ImageInputError, InputError, InputTypeError

RUN = dict(modes=["positive"], steps=0.5, progress=False)


def test_a_bad_label_is_reported_as_a_label():
    model = tiny_timm_vit()  # 5 classes
    x = torch.randn(2, 3, 32, 48)
    with pytest.raises(InputError, match=r"labels: the label 12 is out of range: .* 5 classes; give labels in 0 \.\.\. 4"):
        vitviz.faithfulness(model, x, ["random"], labels=[3, 12], **RUN)
    with pytest.raises(InputError, match="labels: got torch.float"):
        vitviz.faithfulness(model, x, ["random"], labels=[0.5, 1.0], **RUN)
    with pytest.raises(InputError, match=r"^target=9 is out of range"):  # the target keeps its own message
        vitviz.faithfulness(model, x, ["random"], target=9, **RUN)


def test_labels_from_a_flat_folder_are_refused(tmp_path):
    for i in range(2):
        Image.new("RGB", (32, 48), (40 * i, 90, 200)).save(tmp_path / f"{i}.png")
    model = tiny_timm_vit()
    with pytest.raises(InputError, match="labels='dataset': the folder .* has its images directly in it, not in one "
                                         "sub-folder per class"):
        vitviz.faithfulness(model, tmp_path, ["random"], labels="dataset", **RUN)


def test_fill_is_validated_and_refused_where_unused():
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    for bad in ([0.0, 0.0], [0.0, float("nan"), 0.0], "grey"):
        with pytest.raises(InputError, match="fill="):
            vitviz.faithfulness(model, x, ["random"], removal="mean", fill=bad, **RUN)
    with pytest.raises(InputError, match=r"fill=\[5.0, 5.0, 5.0\] is used only when pixels are filled .* "
                                         "removal='auto' drops this model's tokens"):
        vitviz.faithfulness(model, x, ["random"], fill=[5.0, 5.0, 5.0], **RUN)
    grey = vitviz.faithfulness(model, x, ["random"], removal="mean", fill=0.5, **RUN)
    same = vitviz.faithfulness(model, x, ["random"], removal="mean", fill=[0.5] * 3, **RUN)
    assert grey["score"].tolist() == same["score"].tolist()


def test_float64_maps_keep_their_order():
    m = torch.full((10, 2, 2), 1.0, dtype=torch.float64)
    m[:, 1, 1] += 1e-12  # strictly the largest, below float32's resolution
    assert (rank_patches(m, list(range(10)))[:, 3] == 0).all()


def test_labelled_accuracy_is_labelled_top_1(tmp_path):
    model = tiny_timm_vit()
    x = torch.randn(4, 3, 32, 48)
    with torch.no_grad():
        labels = ((model(x).argmax(-1) + 1) % 5).tolist()
    df = vitviz.faithfulness(model, x, ["random", "rollout"], labels=labels, modes=["positive", "deletion"],
                             steps=0.5, progress=False)
    assert df.attrs["labels"] is True
    fig = vitviz.plot_faithfulness_grid(df)
    assert [a.get_ylabel() for a in fig.axes] == ["Top-1 accuracy vs. labels [%]", "Target-class probability"]
    fig.savefig(tmp_path / "labelled.png")
    plain = vitviz.faithfulness(model, x, ["random"], **RUN)
    assert plain.attrs["labels"] is False
    assert vitviz.plot_faithfulness(plain).get_ylabel() == "Target-class accuracy [%]"


@pytest.mark.parametrize("kw, match", [
    (dict(modes=None), r"^modes=None is a NoneType, not a list of names; pass one of \('positive', .*\) or a list "
                       r"of them, e.g. modes=\['positive'\]"),
    (dict(methods=3), r"^methods=3 is a int, not a list of methods; pass method names .* or None for "
                      r"default_methods\(model\)"),
    (dict(image_ids=5), r"^image_ids=5 is a int, not one id per image; pass a list of ids .* e.g. image_ids=\[0, 1\]"),
    (dict(image_ids="ab"), r"^image_ids='ab' is a str, not one id per image"),
    (dict(method_options=3), r"^method_options=3 is a int, not a dict; pass method name -> options, e.g. "
                             r"\{'attention': \{'layer': -1\}\}"),
    (dict(method_options={"random": 3}), r"^method_options\['random'\]=3 is a int, not a dict of options"),
    (dict(steps="0.1"), r"^steps='0.1' is a str, not a number; pass a fraction such as 0.1"),
    (dict(out=5), r"^out=5 is a int, not a file path; pass the path of a CSV file"),
], ids=["modes-none", "methods-int", "image-ids-int", "image-ids-str", "method-options-int",
        "method-options-value-int", "steps-str", "out-int"])
def test_arguments_of_the_wrong_type_are_refused_with_the_argument_named(kw, match):
    model = tiny_timm_vit()
    run = {**RUN, "methods": ["random"], **kw}
    with pytest.raises(InputTypeError, match=match):
        vitviz.faithfulness(model, torch.randn(2, 3, 32, 48), **run)


def test_one_mode_given_as_a_string_is_that_mode():
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    one = vitviz.faithfulness(model, x, "random", modes="deletion", steps=0.5, progress=False)
    listed = vitviz.faithfulness(model, x, ["random"], modes=["deletion"], steps=0.5, progress=False)
    assert set(one["mode"]) == {"deletion"}
    assert one.equals(listed)
    with pytest.raises(InputError, match=r"^modes=\['delete'\]: each must be one of"):
        vitviz.faithfulness(model, x, "random", modes="delete", steps=0.5, progress=False)


def test_steps_finer_than_one_patch_are_refused():
    model = tiny_timm_vit()  # a 4x6 grid: 24 patches
    x = torch.randn(1, 3, 32, 48)
    finest = vitviz.faithfulness(model, x, ["random"], modes=["deletion"], steps=1 / 24, progress=False)
    assert len(finest) == 25 and finest["removed"].nunique() == 25  # one more patch at every step
    for steps in (1 / 25, 1e-4, 1e-9):  # 1e-9 would build a billion steps
        with pytest.raises(InputError, match=rf"^steps={steps!r} is finer than one patch: the model's 4x6 grid has 24 "
                                             r"patches, .* pass steps=1/24 \(0.04167, one patch per step\) or a "
                                             "coarser value"):
            vitviz.faithfulness(model, x, ["random"], modes=["deletion"], steps=steps, progress=False)
    dynamic = tiny_timm_vit(dynamic_img_size=True)
    small = torch.randn(2, 3, 32, 32)  # a 4x4 grid: 16 patches
    for source in (small, TensorDataset(small)):  # a tensor's grid is known up front, a data set's at its batches
        with pytest.raises(InputError, match=r"^steps=0.05 is finer than one patch: the model's 4x4 grid has 16 "
                                             r"patches, .* pass steps=1/16 \(0.0625"):
            vitviz.faithfulness(dynamic, source, ["random"], modes=["deletion"], steps=0.05, progress=False)
    df = vitviz.faithfulness(dynamic, small, ["random"], modes=["deletion"], steps=1 / 16, progress=False)
    assert df["removed"].nunique() == 17


class _Empty(IterableDataset):
    def __iter__(self):
        return iter(())


def test_no_images_are_refused_on_every_input_path(tmp_path):
    model = tiny_timm_vit()
    none = torch.randn(0, 3, 32, 48)
    (tmp_path / "cat").mkdir()  # a class folder without images
    sources = [(none, r"^images: 0 images given; pass at least one image"),
               ([], r"^images: 0 images given; pass at least one image"),
               (TensorDataset(none), r"^images: the TensorDataset holds 0 images; pass at least one image"),
               (DataLoader(TensorDataset(none)), r"^images: the DataLoader's TensorDataset holds 0 images; pass at "
                                                 "least one image"),
               (_Empty(), r"^images: the _Empty yielded 0 images; pass at least one image"),
               (DataLoader(_Empty()), r"^images: the DataLoader's _Empty yielded 0 images; pass at least one image"),
               (tmp_path, rf"^images: the folder {re.escape(repr(str(tmp_path)))} holds 0 images \(\.jpg, .*\); "
                          "pass a folder with at least one image")]
    for source, match in sources:
        with pytest.raises(ImageInputError, match=match):
            vitviz.faithfulness(model, source, ["random"], **RUN)


def test_a_folder_as_out_is_refused_as_not_a_file(tmp_path):
    model = tiny_timm_vit()
    folder = tmp_path / "runs"
    folder.mkdir()
    want = str(folder / "faithfulness.csv")
    with pytest.raises(InputError, match=rf"^out={re.escape(repr(str(folder)))} is a folder; out= must be a file "
                                         rf"path, the CSV file the rows are written to, not a folder: pass e.g. "
                                         rf"out={re.escape(repr(want))}") as err:
        vitviz.faithfulness(model, torch.randn(2, 3, 32, 48), ["random"], out=folder, **RUN)
    assert "delete" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no fingerprint written beside it
    df = vitviz.faithfulness(model, torch.randn(2, 3, 32, 48), ["random"], out=want, **RUN)
    assert len(df) == 2 * 3


class _Stream(IterableDataset):
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __iter__(self):
        return iter(self.x)


def test_too_few_image_ids_for_an_iterable_data_set_name_image_ids():
    # an iterable data set is counted as its images come: the id its third image lacks is refused when it comes,
    # as for a counted input, naming image_ids= (not an IndexError)
    model = tiny_timm_vit()
    with pytest.raises(InputError, match=r"^image_ids holds 2 ids but the data set yields more images"):
        vitviz.faithfulness(model, _Stream(torch.randn(3, 3, 32, 48)), ["random"], image_ids=[7, 8], **RUN)


def test_a_repeated_mode_is_refused_as_a_repeated_method_is():
    # its rows would be written twice, and faithfulness_auc / compare_methods refuse the frame as repeated image ids
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    with pytest.raises(InputError, match=r"^modes names 'deletion' twice"):
        vitviz.faithfulness(model, x, ["random"], modes=["deletion", "positive", "deletion"], steps=0.5,
                            progress=False)
    df = vitviz.faithfulness(model, x, ["random"], modes=("deletion", "positive"), steps=0.5, progress=False)
    assert len(vitviz.faithfulness_auc(df)) == 2


@pytest.mark.parametrize("extra, what", [(dict(target=[0, 1]), r"target holds 2 class indices"),
                                         (dict(labels=[0, 1]), r"labels holds 2 class indices"),
                                         (dict(methods={"m": torch.rand(2, 4, 6)}), r"methods\['m'\] holds 2 maps")])
def test_too_few_per_image_values_for_an_iterable_data_set_name_the_argument(extra, what):
    # a counted input refuses another number of per-image values up front; an iterable data set, counted as its
    # images come, when its first image without one comes (not an IndexError)
    model = tiny_timm_vit()
    kw = {"methods": ["random"], **RUN, "batch_size": 2, **extra}
    with pytest.raises(InputError, match=rf"^{what} but the data set yields more images; give one per image"):
        vitviz.faithfulness(model, _Stream(torch.randn(3, 3, 32, 48)), **kw)


def test_more_per_image_labels_than_image_ids_for_an_iterable_data_set_name_both(tmp_path):
    # out= keeps the classes id by id: a class index without an id is refused naming labels= and image_ids=,
    # not as a data set that yields more images than image_ids holds (it yields 3)
    model = tiny_timm_vit()
    with pytest.raises(InputError, match=r"^labels holds 4 class indices but image_ids holds fewer ids \(3\)"):
        vitviz.faithfulness(model, _Stream(torch.randn(3, 3, 32, 48)), ["random"], labels=[0, 1, 2, 3],
                            image_ids=[5, 6, 7], out=tmp_path / "curves.csv", **RUN)


@pytest.mark.parametrize("extra, what", [(dict(image_ids=[5, 6, 7, 8]), r"image_ids holds 4 ids"),
                                         (dict(target=[0, 1, 2, 3]), r"target holds 4 class indices"),
                                         (dict(labels=[0, 1, 2, 3]), r"labels holds 4 class indices"),
                                         (dict(methods={"m": torch.rand(4, 4, 6)}), r"methods\['m'\] holds 4 maps")])
def test_too_many_per_image_values_for_an_iterable_data_set_are_refused_when_it_ends(extra, what, tmp_path):
    # a counted input refuses another number of per-image values up front; extra values for an iterable data set
    # were accepted silently (matched to no image): they are refused once its images are counted, the rows of the
    # images it yielded kept in out=
    model = tiny_timm_vit()
    out = tmp_path / "curves.csv"
    kw = {"methods": ["random"], **RUN, "batch_size": 2, **extra}
    with pytest.raises(InputError, match=rf"^{what} but the data set yielded 3 images; give one per image"):
        vitviz.faithfulness(model, _Stream(torch.randn(3, 3, 32, 48)), out=out, **kw)
    import pandas as pd

    assert pd.read_csv(out)["image"].nunique() == 3
    exact = {k: (v[:3] if isinstance(v, list) else {n: m[:3] for n, m in v.items()}) for k, v in extra.items()}
    df = vitviz.faithfulness(model, _Stream(torch.randn(3, 3, 32, 48)), **{**kw, **exact})
    assert df["image"].nunique() == 3
