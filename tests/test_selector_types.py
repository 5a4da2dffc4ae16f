"""Selectors and sizes given as NumPy or torch scalars are read as the numbers they hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.core.batching import check_batch_size, iter_batches
from vitviz.errors import InputError, LayerSelectError


@pytest.mark.parametrize("layers", [torch.tensor(1), np.array(1), np.int64(1), torch.tensor([1])],
                         ids=["torch-0d", "numpy-0d", "numpy-int", "torch-1d"])
def test_zero_dim_layer_selectors_are_scalars(layers):
    model = tiny_timm_vit().eval()
    with torch.no_grad(), vitviz.capture_attention(model, layers=layers) as cap:
        model(torch.randn(1, 3, 32, 48))
    assert cap.layer_names == ["blocks.1.attn"]


@pytest.mark.parametrize("layers, kind", [(torch.tensor(True), "bool"), (np.array(1.5), "float"),
                                          (torch.tensor(7), "out of range")])
def test_zero_dim_bad_selectors_are_refused_by_value(layers, kind):
    with pytest.raises(LayerSelectError, match=kind):
        with vitviz.capture_attention(tiny_timm_vit(), layers=layers):
            pass


@pytest.mark.parametrize("size", [np.int64(2), np.int32(2), 2])
def test_numpy_integer_batch_sizes_are_accepted(size):
    check_batch_size(size)
    batches = list(iter_batches(tiny_timm_vit(), torch.rand(5, 3, 32, 48), batch_size=size))
    assert [b.shape[0] for b in batches] == [2, 2, 1]


@pytest.mark.parametrize("size", [np.bool_(True), True, 2.0, np.float64(2.0), 0, np.int64(-1)])
def test_bools_floats_and_non_positive_batch_sizes_are_refused(size):
    with pytest.raises(InputError, match="batch_size="):
        check_batch_size(size)
