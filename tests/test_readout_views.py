"""The one-layer views read the queries the model's head reads, as the explanations do (``ViTSpec.readout``):
``plot_attention_heads_grid``'s default query and the attention explorer's "(output)" query.

Expected values come from attention written out from each block's ``qkv`` weights (``tests/test_readout.py``) and
an attention pool's attention written out from its own weights (``tests/test_readout_pools.py``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from test_readout import explicit_timm, images, rollout_matrix, timm_deit_distilled, timm_vit
from test_readout_pools import latent_pool_attention

import vitviz

pytest.importorskip("timm")
pytest.importorskip("ipywidgets")


def pool_rows(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``(B, N)``: timm ``global_pool="map"``'s attention over the patch tokens (heads averaged), zero on the class
    token, written out from the pool's weights."""
    _, _, last = explicit_timm(m, x)
    a = latent_pool_attention(m.attn_pool, m.norm(last)[:, 1:])[:, :, 0].mean(dim=1)
    return torch.cat([torch.zeros(len(x), 1), a], dim=1).detach()


def no_hooks(m: torch.nn.Module) -> bool:
    return not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())


def sharp(m: torch.nn.Module) -> torch.nn.Module:
    """The blocks' queries scaled up: attention far from uniform, so rows weighted otherwise give other maps."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for blk in m.blocks:  # the query and key rows of qkv
            w = blk.attn.qkv.weight[: 2 * blk.attn.qkv.in_features]
            w.copy_(torch.randn(w.shape, generator=g) * 0.5)
    return m


def sharp_map_pool() -> torch.nn.Module:
    m = sharp(timm_vit(global_pool="map"))
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():  # a sharper pool query: its attention far from uniform
        m.attn_pool.latent.mul_(30)
        m.attn_pool.q.weight.copy_(torch.randn(m.attn_pool.q.weight.shape, generator=g) * 0.5)
    return m


def grid_maps(fig) -> torch.Tensor:
    """The ``(H, gh, gw)`` numbers drawn in the "Head k" panels."""
    panels = sorted((ax for ax in fig.axes if ax.get_title().startswith("Head ")),
                    key=lambda ax: int(ax.get_title().split()[1]))
    return torch.stack([torch.as_tensor(ax.images[0].get_array().data) for ax in panels]).float()


def expected(m: torch.nn.Module, x: torch.Tensor, rows: torch.Tensor, p: int) -> torch.Tensor:
    """``(H, gh, gw)``: each head of the last layer's explicit attention, its rows weighted by ``rows`` ``(N,)``."""
    _, attns, _ = explicit_timm(m, x)
    a = attns[-1][0].detach()  # (H, N, N)
    return (rows.float() @ a)[:, p:].reshape(len(a), 4, 4)


# ------------------------------------------------------------------------------------ plot_attention_heads_grid
def test_heads_grid_reads_the_patch_mean_of_an_avg_pool_head():
    m, x = sharp(timm_vit(global_pool="avg")), images(n=1)
    rows = torch.cat([torch.zeros(1), torch.full((16,), 1 / 16)])
    fig = vitviz.plot_attention_heads_grid(m, x)
    try:
        torch.testing.assert_close(grid_maps(fig), expected(m, x, rows, 1), atol=1e-6, rtol=1e-5)
        assert "mean over patch queries" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    fig = vitviz.plot_attention_heads_grid(m, x, query=0)  # the class token's row: another map
    try:
        assert (grid_maps(fig) - expected(m, x, rows, 1)).abs().max() > 1e-3
    finally:
        plt.close(fig)


def test_heads_grid_reads_the_mean_of_the_class_and_distillation_queries_of_deit_distilled():
    m, x = sharp(timm_deit_distilled()), images(n=1)
    rows = torch.zeros(18)
    rows[:2] = 0.5
    fig = vitviz.plot_attention_heads_grid(m, x)
    try:
        torch.testing.assert_close(grid_maps(fig), expected(m, x, rows, 2), atol=1e-6, rtol=1e-5)
        title = fig._suptitle.get_text()
        assert title.endswith("attention of the mean of the class and distillation queries"), title
    finally:
        plt.close(fig)


def test_heads_grid_weights_the_queries_by_an_attention_pools_own_attention():
    m, x = sharp_map_pool(), images(n=1)
    rows = pool_rows(m, x)[0]
    fig = vitviz.plot_attention_heads_grid(m, x)
    try:
        got = grid_maps(fig)
        torch.testing.assert_close(got, expected(m, x, rows, 1), atol=1e-6, rtol=1e-5)
        uniform = torch.cat([torch.zeros(1), torch.full((16,), 1 / 16)])
        assert (got - expected(m, x, uniform, 1)).abs().max() > 1e-3  # not the patch mean
        assert "weighted by the attention pool" in fig._suptitle.get_text()
        assert no_hooks(m)  # the pool was hooked for the forward only
    finally:
        plt.close(fig)


def test_heads_grid_of_a_class_token_head_is_the_class_row():
    m, x = timm_vit(), images(n=1)
    figs = [vitviz.plot_attention_heads_grid(m, x, query=q) for q in (None, 0)]
    try:
        assert torch.equal(grid_maps(figs[0]), grid_maps(figs[1]))
        assert figs[0]._suptitle.get_text().endswith("attention of the class token")
    finally:
        for f in figs:
            plt.close(f)


# ---------------------------------------------------------------------------------------- the attention explorer
def test_explorer_offers_and_shows_the_distilled_heads_readout():
    m, x = sharp(timm_deit_distilled()), images(n=1)
    ex = vitviz.explore_attention(m, x)
    assert ex.query.options[0] == ("queries the head reads (output)", "readout")
    assert ex.query.value == "readout"
    _, attns, _ = explicit_timm(m, x)
    fused = attns[-1][0].detach().mean(dim=0)  # (N, N), the head mean
    want = ((fused[0] + fused[1]) / 2)[2:].reshape(4, 4)
    torch.testing.assert_close(torch.as_tensor(ex.map()), want, atol=1e-6, rtol=1e-5)
    assert "query: queries the head reads (output)" in ex.status.value


def test_explorer_weights_the_rows_by_the_pool_and_follows_a_weight_change():
    m, x = sharp_map_pool(), images(n=1)
    ex = vitviz.explore_attention(m, x)
    assert ex.query.value == "readout"
    for _ in range(2):
        _, attns, _ = explicit_timm(m, x)
        fused = attns[-1][0].detach().mean(dim=0)
        want = (pool_rows(m, x)[0] @ fused)[1:].reshape(4, 4)
        torch.testing.assert_close(torch.as_tensor(ex.map()), want, atol=1e-6, rtol=1e-5)
        with torch.no_grad():  # another pool query: the rows read must follow it, not stay cached
            m.attn_pool.latent.mul_(-1.5)
    ex.set(rollout=True)  # the weights changed once more since the last view: rollout reads the new pool too
    _, attns, _ = explicit_timm(m, x)
    r = rollout_matrix(attns)[0]
    want = (pool_rows(m, x)[0].double() @ r)[1:].reshape(4, 4).float()
    torch.testing.assert_close(torch.as_tensor(ex.map()), want, atol=1e-6, rtol=1e-5)
    assert no_hooks(m)


def test_explorer_of_a_class_token_head_offers_no_weighted_readout():
    ex = vitviz.explore_attention(timm_vit(), images(n=1))
    assert "readout" not in [v for _, v in ex.query.options]
    assert ex.query.options[0] == ("class token (output)", 0) and ex.query.value == 0
