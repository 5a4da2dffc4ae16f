"""Arguments of ``vitviz.faithfulness``: labels, fill, the ranking of float64 maps, the axis label of labelled runs."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit
from PIL import Image

import vitviz
from vitviz.analysis.perturbation import rank_patches
from vitviz.errors import InputError

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
