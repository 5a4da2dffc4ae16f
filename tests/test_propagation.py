"""The one propagation rule: each LayerRule against its equation written out by hand, rows pushed from the top
equal rows of the full product, branch averaging, and attention flow reading the same layer graph as rollout
(parallel branches averaged per block, signed and mixed maps refused)."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

import vitviz
from vitviz.analysis.flow import flow_from_layers
from vitviz.analysis.propagation import LayerRule, Propagator, propagate, query_vectors
from vitviz.errors import UnsupportedModelError


def stochastic(b=2, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n, n, generator=g).mul(2).softmax(-1)


def weights(b=2, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, n, n, generator=g) * 0.3  # non-negative, rows not normalised (gradient-weighted)


def rownorm(m):
    return m / m.sum(-1, keepdim=True)


def test_each_rule_is_its_equation():
    w, eye = weights(), torch.eye(6)
    torch.testing.assert_close(LayerRule("rollout")(w.clone()), rownorm(0.5 * rownorm(w) + 0.5 * eye))
    torch.testing.assert_close(LayerRule("grad_rollout")(w.clone()), rownorm(0.5 * w + 0.5 * eye))
    torch.testing.assert_close(LayerRule("rollout", residual=False)(w.clone()), rownorm(w))
    assert torch.equal(LayerRule("chefer")(w.clone()), w) and LayerRule("chefer").skip  # A = I + W, applied in R


@pytest.mark.parametrize("kind", ["rollout", "grad_rollout", "chefer"])
def test_full_product_and_rows_from_the_top_equal_the_hand_product(kind):
    ws = [weights(seed=s) for s in range(3)]
    eye = torch.eye(6)
    mats = {"rollout": lambda w: rownorm(0.5 * rownorm(w) + 0.5 * eye),
            "grad_rollout": lambda w: rownorm(0.5 * w + 0.5 * eye),
            "chefer": lambda w: eye + w}[kind]
    want = eye.expand(2, 6, 6).double()
    for w in ws:  # R_l = A_l R_{l-1}
        want = mats(w).double() @ want
    rule = LayerRule(kind, num_prefix_tokens=1)
    full = propagate(ws, rule)
    torch.testing.assert_close(full.double(), want, atol=1e-6, rtol=1e-5)
    v = query_vectors(2, 6, 1, None)
    torch.testing.assert_close(propagate(ws, rule, rows=v).double(), (v.double()[:, None] @ want)[:, 0],
                               atol=1e-6, rtol=1e-5)


def test_branches_of_a_block_are_averaged_once_and_blocks_chain():
    maps = [torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(s)).softmax(-1) for s in range(3)]
    rule = LayerRule("rollout")
    got = propagate(maps, rule, blocks=[0, 0, 1])
    eye = torch.eye(6)
    a0 = rownorm(0.5 * (maps[0].mean(1) + maps[1].mean(1)) / 2 + 0.5 * eye)
    a1 = rownorm(0.5 * maps[2].mean(1) + 0.5 * eye)
    torch.testing.assert_close(got, a1 @ a0)
    prop = Propagator(rule, blocks=[0, 0, 1]).feed(maps)
    assert len(prop.matrices) == 2  # one matrix per residual block, not per branch


def build(name: str, depth: int = 2) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, img_size=64, depth=depth).eval()


def test_flow_averages_the_branches_of_a_parallel_block_like_rollout():
    """One layer of the flow graph per residual block, its branches averaged (was: the branches chained)."""
    model = build("vit_small_patch16_18x2_224")  # 2 blocks of 2 parallel attention branches, 17 tokens
    spec = vitviz.inspect(model)
    assert spec.attention_blocks == (0, 0, 1, 1)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    eye = torch.eye(17)
    got = vitviz.attention_flow(model, x)
    for b in range(2):
        blocks = [0.5 * (cap.attentions[i][b].mean(0) + cap.attentions[i + 1][b].mean(0)) / 2 + 0.5 * eye
                  for i in (0, 2)]
        flows = flow_from_layers(blocks, 0, list(range(17)))
        want = flows[1:] / flows.sum()  # normalised over every input token, as the reference
        np.testing.assert_allclose(got[b].flatten().numpy(), want, atol=1e-5)
        series = [0.5 * a[b].mean(0) + 0.5 * eye for a in cap.attentions]
        chained = flow_from_layers(series, 0, list(range(17)))
        assert np.abs(chained[1:] / chained.sum() - want).max() > 1e-3


@pytest.mark.parametrize(("name", "kind"), [("vit_dwee_patch16_reg1_gap_256", "differential"),
                                            ("cait_xxs24_224", "talking-heads")])
def test_flow_refuses_signed_and_mixed_maps_like_rollout(name, kind):
    model = build(name)
    x = torch.randn(1, 3, 64, 64)
    with pytest.raises(UnsupportedModelError, match=kind):
        vitviz.attention_rollout(model, x)
    with pytest.raises(UnsupportedModelError, match=rf"attention_flow.*{kind}"):
        vitviz.attention_flow(model, x)
    with pytest.raises(UnsupportedModelError, match=kind):
        vitviz.explain(model, x, "flow")


@pytest.mark.parametrize("bad", ["numpy", "2-D", "non-square"])
def test_maps_that_are_not_batched_square_tensors_are_refused_naming_the_shape(bad):
    """A NumPy map, one image's (N, N) map without the batch axis, or a (B, N, M) map gets vitviz's error (it raised
    AttributeError, or ran on the 2-D map and returned an (N, N) "product" of no batch)."""
    from vitviz.analysis.relevance import chefer_from_attentions
    from vitviz.analysis.rollout import rollout_from_attentions
    from vitviz.errors import InputError

    m = stochastic()
    m = {"numpy": m.numpy(), "2-D": m[0], "non-square": m[..., :-1]}[bad]
    with pytest.raises(InputError, match="attn"):
        rollout_from_attentions([m])
    with pytest.raises(InputError, match="attn"):
        propagate([m], LayerRule("chefer"))
    attn = torch.rand(2, 3, 6, 6)
    with pytest.raises(InputError, match="gradient"):
        chefer_from_attentions([attn], [attn.numpy() if bad == "numpy" else attn[0]])


def test_a_start_layer_inside_a_parallel_block_is_refused_naming_the_block_boundaries():
    """Two attention branches share each residual block: a block's step is their average, so starting at the second
    branch kept it alone and propagated it as the whole block, without a word. Rollout, Chefer, grad-rollout (model
    and maps) refuse it, naming the block's first module and the next block's; a block's first module is accepted
    and equals rolling out the kept maps."""
    from vitviz.analysis.relevance import grad_rollout_from_attentions
    from vitviz.analysis.rollout import rollout_from_attentions
    from vitviz.errors import InputError

    model = build("vit_small_patch16_18x2_224", depth=3)  # blocks (0, 0, 1, 1, 2, 2)
    spec = vitviz.inspect(model)
    x = torch.randn(2, 3, 64, 64)
    for start, fix in ((1, r"start_layer=0 \(the block's first attention module\) or 2 \(the next block's\)"),
                       (-1, r"start_layer=4 \(the block's first attention module\)\.?$")):
        for fn in (vitviz.attention_rollout, vitviz.chefer_relevance, vitviz.grad_rollout):
            with pytest.raises(InputError, match=rf"start_layer={start}: attention module \d of .* later branch of "
                                                 rf"residual block \d.*{fix}"):
                fn(model, x, start_layer=start)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    maps, blocks = list(cap.attentions), list(spec.attention_blocks)
    with pytest.raises(InputError, match=r"start_layer=3: .*residual block 1"):
        rollout_from_attentions(maps, start_layer=3, blocks=blocks)
    with pytest.raises(InputError, match=r"start_layer=-3: .*residual block 1"):
        grad_rollout_from_attentions(maps, maps, start_layer=-3, blocks=blocks)
    got = vitviz.attention_rollout(model, x, start_layer=2, return_full=True)
    torch.testing.assert_close(got, rollout_from_attentions(maps, start_layer=2, blocks=blocks), atol=1e-6, rtol=1e-5)
