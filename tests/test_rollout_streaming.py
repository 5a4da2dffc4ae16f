"""The streaming rollout: rows pushed through the kept layers equal rows of the product, and no product is formed
while streaming."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.analysis.propagation import LayerRule, Propagator
from vitviz.analysis.rollout import RolloutReducer, query_vectors, rollout_from_attentions, rollout_to_maps


def maps(layers=4, b=3, h=2, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, n, generator=g).mul(3).softmax(-1) for _ in range(layers)]


@pytest.mark.parametrize("discard", [0.0, 0.4])
def test_rows_through_kept_layers_equal_rows_of_the_product(discard):
    attns = maps()
    kept = RolloutReducer(num_prefix_tokens=2, discard_ratio=discard)
    bmm = torch.bmm
    calls = []
    torch.bmm = lambda *a: calls.append(a) or bmm(*a)  # count products while streaming
    try:
        for i, a in enumerate(attns):
            kept(i, a)
    finally:
        torch.bmm = bmm
    assert not calls and len(kept.matrices) == len(attns)  # no N x N x N product was formed
    want = rollout_from_attentions(attns, num_prefix_tokens=2, discard_ratio=discard)
    torch.testing.assert_close(kept.rollout, want)
    v = torch.rand(3, 5, 7)
    torch.testing.assert_close(kept.rows(v), v @ want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kept.rows(v[:, 0]), (v @ want)[:, 0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("fusion", "discard"), [("mean", 0.0), ("mean", 0.4), ("max", 0.0), ("min", 0.3)])
def test_kept_layers_in_one_block_equal_the_product(fusion, discard):
    attns = maps()
    kept = RolloutReducer(num_prefix_tokens=1, head_fusion=fusion, discard_ratio=discard, num_layers=len(attns))
    for _ in range(2):  # the block is reused by the next pass
        for i, a in enumerate(attns):
            kept(i, a)
    block = kept._block
    assert block is not None and block.shape == (4, 3, 7, 7)
    assert [a.data_ptr() for a in kept.matrices] == [block[i].data_ptr() for i in range(4)]
    want = rollout_from_attentions(attns, head_fusion=fusion, discard_ratio=discard)
    torch.testing.assert_close(kept.rollout, want)
    v = torch.rand(3, 7)
    torch.testing.assert_close(kept.rows(v), (v[:, None] @ want)[:, 0], atol=1e-6, rtol=1e-5)


def test_query_vectors_select_the_rows_rollout_to_maps_reads():
    r = rollout_from_attentions(maps(n=2 + 6), num_prefix_tokens=2)
    for token in (0, 1, 5, None):
        v = query_vectors(3, 8, 2, token)
        row = torch.bmm(v[:, None], r)[:, 0]
        torch.testing.assert_close(row[:, 2:].reshape(3, 2, 3), rollout_to_maps(r, (2, 3), 2, token))


def test_attention_rollout_maps_equal_the_full_product_row():
    model = tiny_timm_vit().eval()
    x = torch.randn(2, 3, 32, 48)
    full = vitviz.attention_rollout(model, x, return_full=True)
    spec = vitviz.inspect(model)
    want = rollout_to_maps(full, spec.grid_for_input(x), spec.num_prefix_tokens, spec.class_token_index)
    torch.testing.assert_close(vitviz.attention_rollout(model, x), want, atol=1e-6, rtol=1e-5)


def test_rule_kind_must_be_known():
    from vitviz.analysis.propagation import LayerRule

    with pytest.raises(ValueError, match="rule kind"):
        LayerRule("everything")
    with pytest.raises(ValueError, match="discard_ratio"):
        LayerRule("chefer", discard_ratio=0.5)


@pytest.mark.gpu
def test_streaming_rollout_and_distance_on_cuda_equal_the_cpu_results():
    model = tiny_timm_vit().eval()
    x = torch.randn(3, 3, 32, 48)
    maps = vitviz.attention_rollout(model, x)
    dist = vitviz.mean_attention_distance(model, x)
    gpu = model.cuda()
    got = vitviz.attention_rollout(gpu, x.cuda())
    assert got.is_cuda
    torch.testing.assert_close(got.cpu(), maps, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(vitviz.mean_attention_distance(gpu, x.cuda(), autocast=False), dist, atol=1e-4, rtol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # half-precision maps, float32 reductions
        half = vitviz.attention_rollout(gpu, x.cuda())
    torch.testing.assert_close(half.float().cpu(), maps, atol=2e-2, rtol=5e-2)


@pytest.mark.parametrize("return_full", [True, False])
@pytest.mark.parametrize("depth", [1, 3])  # start_layer=depth-1: one layer in the product; depth=1: a one-block model
def test_one_layer_products_do_not_alias_the_kept_block_across_batches(depth, return_full):
    """With one layer in the product, R is that layer's matrix: it must be a copy, not the reused (L, B, N, N)
    block that the next batch of the same size overwrites."""
    torch.manual_seed(0)
    model = tiny_timm_vit(depth=depth)
    x = torch.randn(4, 3, 32, 48)
    kw = dict(start_layer=depth - 1, return_full=return_full)
    whole = vitviz.attention_rollout(model, x, **kw)
    for bs in (1, 2):
        torch.testing.assert_close(vitviz.attention_rollout(model, x, batch_size=bs, **kw), whole, atol=1e-6, rtol=1e-5)
    assert not torch.equal(whole[0], whole[2])


def test_propagator_result_is_not_a_view_of_a_kept_matrix():
    prop = Propagator(LayerRule("rollout"), num_layers=1, assume_stochastic=True)
    prop(0, torch.randn(2, 3, 5, 5).softmax(-1))
    r = prop.result()
    assert r.data_ptr() != prop.matrices[0].data_ptr()
