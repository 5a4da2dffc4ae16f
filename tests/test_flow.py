"""Attention flow (Abnar & Zuidema, ACL 2020, Sec. 3.2): max-flow against closed forms on two layers and against a
re-written reference (the authors' compute_node_flow, networkx) on three, the normalisation over every input token,
and the token limit counted on the input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.analysis.flow import flow_from_layers
from vitviz.errors import InputError


def test_flow_on_two_layers_is_the_sum_of_bottlenecks():
    # two layers: the paths t -> m -> j are disjoint, so max-flow = sum_m min(A2[t, m], A1[m, j]),
    # where rollout multiplies: sum_m A2[t, m] A1[m, j]
    gen = torch.Generator().manual_seed(0)
    a1, a2 = (torch.rand(5, 5, generator=gen).softmax(-1) for _ in range(2))
    got = flow_from_layers([a1, a2], source=0, sinks=list(range(1, 5)))
    want = np.array([torch.minimum(a2[0], a1[:, j]).sum().item() for j in range(1, 5)])
    np.testing.assert_allclose(got, want, atol=5 * 5 / 2 ** 20)
    product = (a2 @ a1)[0, 1:].numpy()
    assert np.abs(got - product).max() > 0.01


def test_attention_flow_on_a_model_matches_the_closed_form():
    """Two layers: max-flow from the class token to every input token j (the class token too) in closed form,
    divided by its sum over all 17 input tokens (the reference's compute_node_flow), read at the patches."""
    model = tiny_timm_vit(img_size=32, depth=2)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    got = vitviz.explain(model, x, "flow", progress=False)
    raw = vitviz.attention_flow(model, x, normalise=False)
    for b in range(2):
        mats = []
        for a in cap.attentions:
            w = 0.5 * a[b].mean(0) + 0.5 * torch.eye(17)
            mats.append(w / w.sum(-1, keepdim=True))
        flows = np.array([torch.minimum(mats[1][0], mats[0][:, j]).sum().item() for j in range(17)])
        assert flows.sum() > 1.5  # max-flows to different inputs share capacity: their sum is not 1
        np.testing.assert_allclose(got[b].flatten().numpy(), flows[1:] / flows.sum(), atol=1e-5)
        np.testing.assert_allclose(raw[b].flatten().numpy(), flows[1:], atol=17 * 2 / 2 ** 20)
        assert got[b].sum() < 1  # the class token's own share is not on the map


def reference_node_flow(layers, source):
    """samiraabnar/attention_flow's compute_node_flow, re-written: networkx max-flow on float capacities from
    node (L, source) to every input node, divided by the sum over all input nodes."""
    nx = pytest.importorskip("networkx")
    n, depth = layers[0].shape[0], len(layers)
    g = nx.DiGraph()
    for lay, a in enumerate(layers):
        for i in range(n):
            for j in range(n):
                g.add_edge((lay + 1, i), (lay, j), capacity=float(a[i, j]))
    flows = np.array([nx.maximum_flow_value(g, (depth, source), (0, j)) for j in range(n)])
    return flows / flows.sum()


def test_attention_flow_is_the_reference_node_flow_on_three_layers():
    model = tiny_timm_vit(img_size=(16, 24), depth=3)  # a 2x3 grid, 7 tokens
    x = torch.randn(1, 3, 16, 24)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    layers = [rownorm(0.5 * a[0].double().mean(0) + 0.5 * torch.eye(7, dtype=torch.float64)) for a in cap.attentions]
    want = reference_node_flow(layers, 0)
    got = vitviz.attention_flow(model, x)[0].flatten().double().numpy()
    np.testing.assert_allclose(got, want[1:], atol=1e-5)


def rownorm(m):
    return m / m.sum(-1, keepdim=True)


@pytest.mark.parametrize("fusion", ["max", "min"])
def test_flow_with_max_or_min_fusion_renormalises_the_fused_rows_before_the_residual(fusion):
    """One layer: the flow from the class token to input j is the one edge's capacity A[0, j], so the map is the
    class row of A = rownorm(0.5 rownorm(W) + 0.5 I) (the module docstring), not of rownorm(W + I), which
    vit-explain's max fusion uses and the authors' mean-only code would give for such a W."""
    torch.manual_seed(0)
    model = tiny_timm_vit(img_size=(16, 24), depth=1, reg_tokens=2)  # 3 prefix tokens, a 2x3 grid: 9 tokens
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(6)  # peaked heads (random weights attend near uniformly)
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    got = vitviz.attention_flow(model, x, head_fusion=fusion).double()
    a = cap.attentions[0].double()
    w = a.amax(dim=1) if fusion == "max" else a.amin(dim=1)
    eye = torch.eye(9, dtype=torch.float64)
    want = rownorm(0.5 * rownorm(w) + 0.5 * eye)[:, 0, 3:].reshape(2, 2, 3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    unnormalised = rownorm(w + eye)[:, 0, 3:].reshape(2, 2, 3)
    assert (got - unnormalised).abs().max() > 0.005  # 500 times the tolerance above


def test_flow_refuses_too_many_tokens_naming_the_limit():
    with pytest.raises(InputError, match="max_tokens=10"):
        vitviz.explain(tiny_timm_vit(), torch.randn(1, 3, 32, 48), "flow", max_tokens=10)


def test_flow_counts_the_tokens_of_the_input_not_of_the_built_size():
    model = tiny_timm_vit(img_size=32, dynamic_img_size=True)  # built for 17 tokens
    assert vitviz.attention_flow(model, torch.randn(1, 3, 32, 32), max_tokens=17).shape == (1, 4, 4)
    with pytest.raises(InputError, match=r"37 tokens.*max_tokens=17"):  # a 6x6 grid: 37 tokens
        vitviz.attention_flow(model, torch.randn(1, 3, 48, 48), max_tokens=17)
