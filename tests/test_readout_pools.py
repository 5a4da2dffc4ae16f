"""Attention-pool readouts (timm ``global_pool="map"``, Hugging Face SigLIP's head, open_clip's attentional pooler):
the maps weight the rows by the pool's own attention over the tokens, checked against that attention written out
from the pool's weights and the rollout written out from each block's weights (``tests/test_readout.py``)."""

from __future__ import annotations

import pytest
import torch
from test_readout import explicit_timm, images, patch_cols, rollout_matrix, timm_vit

import vitviz

pytest.importorskip("timm")


def latent_pool_attention(pool: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm ``AttentionPoolLatent``'s attention ``(B, H, L, N')`` written out from its ``q`` / ``kv`` weights."""
    b, n, c = x.shape
    h, d = pool.num_heads, c // pool.num_heads
    q = pool.q(pool.latent.expand(b, -1, -1)).reshape(b, -1, h, d).transpose(1, 2)
    k = pool.kv(x)[..., :c].reshape(b, n, h, d).transpose(1, 2)
    return ((pool.q_norm(q) * pool.scale) @ pool.k_norm(k).transpose(-2, -1)).softmax(dim=-1)


def test_map_pool_weights_the_rows_by_its_own_attention():
    m, x = timm_vit(global_pool="map"), images()
    with torch.no_grad():  # a sharper pool query: its attention far from uniform
        m.attn_pool.latent.mul_(30)
    spec = vitviz.inspect(m)
    assert spec.readout.how == "attention-pool" and spec.readout.pool_attention and spec.readout.exact
    logits, attns, last = explicit_timm(m, x)
    feats = m.norm(last)[:, 1:]  # the pool sees the patch tokens (pool_include_prefix=False)
    pool = m.attn_pool
    a = latent_pool_attention(pool, feats)
    v = pool.kv(feats)[..., 32:].reshape(2, 16, 2, 16).transpose(1, 2)
    pooled = pool.proj((a @ v).transpose(1, 2).reshape(2, 1, 32))
    pooled = (pooled + pool.mlp(pool.norm(pooled)))[:, 0]
    torch.testing.assert_close(m.head(m.fc_norm(pooled)), m(x), atol=1e-5, rtol=1e-5)  # the recomputation is timm's
    w = a[:, :, 0].mean(dim=1).detach().double()  # (B, P): heads averaged, query 0
    r = rollout_matrix(attns)
    want = (w[:, None] @ r[:, 1:, 1:])[:, 0].reshape(2, 4, 4).float()
    got = vitviz.attention_rollout(m, x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    uniform = patch_cols(r[:, 1:].mean(dim=1), 1, (4, 4))
    assert (got - uniform).abs().max() > 1e-4  # not the patch mean
    # the other row-reading methods weight their rows the same way
    for method in ("chefer", "attention", "flow"):
        full = {"chefer": lambda: vitviz.chefer_relevance(m, x, return_full=True)}.get(method)
        if full is not None:
            want_m = (w[:, None].float() @ full()[:, 1:, 1:])[:, 0].reshape(2, 4, 4)
            torch.testing.assert_close(vitviz.explain(m, x, method), want_m, atol=1e-6, rtol=1e-5)
        else:
            rows = torch.stack([vitviz.explain(m, x, method, token=1 + j) for j in range(16)], dim=1)  # (B, P, gh, gw)
            want_m = (w.float()[:, :, None, None] * rows).sum(dim=1)
            torch.testing.assert_close(vitviz.explain(m, x, method), want_m, atol=1e-6, rtol=1e-4)


def test_siglip_head_weights_the_rows_by_its_probe_attention():
    from hf_models import _eager_attentions, hf_case

    case = hf_case("siglip-vision")
    m, x = case.model, case.x
    assert vitviz.inspect(m).readout.pool_attention
    hidden = m(pixel_values=x).last_hidden_state.detach()  # what the head reads
    head = m.head  # SiglipVisionModel (transformers 5) holds the vision transformer's modules itself
    mha = head.attention
    c, h = mha.embed_dim, mha.num_heads
    wq, wk = mha.in_proj_weight[:c], mha.in_proj_weight[c:2 * c]
    bq, bk = mha.in_proj_bias[:c], mha.in_proj_bias[c:2 * c]
    q = (head.probe @ wq.T + bq).reshape(1, 1, h, c // h).transpose(1, 2)
    k = (hidden @ wk.T + bk).reshape(2, -1, h, c // h).transpose(1, 2)
    a = ((q @ k.transpose(-2, -1)) / (c // h) ** 0.5).softmax(dim=-1)[:, :, 0].mean(dim=1).double()  # (B, P)
    r = rollout_matrix(_eager_attentions(m, x))
    want = (a.detach()[:, None] @ r)[:, 0].reshape(2, 4, 4).float()
    got = vitviz.attention_rollout(m, x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert (got - r.mean(dim=1).reshape(2, 4, 4).float()).abs().max() > 1e-5


@pytest.mark.parametrize("pool_type", ["tok", "avg"])
def test_open_clip_attentional_pooler_weights_the_rows_by_its_queries(pool_type):
    from hf_models import mha_reference, open_clip_tower

    torch.manual_seed(0)
    m = open_clip_tower(attentional_pool=True, attn_pooler_queries=4, pool_type=pool_type)
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    assert vitviz.inspect(m).readout.pool_attention
    seen = {}
    blocks = list(m.transformer.resblocks)
    handles = [b.register_forward_pre_hook(lambda _m, args, i=i, b=b: seen.__setitem__(i, b.ln_1(args[0])))
               for i, b in enumerate(blocks)]
    handles.append(m.attn_pool.register_forward_pre_hook(lambda _m, args: seen.__setitem__("pool", args[0])))
    with torch.no_grad():
        m(x)
    for h in handles:
        h.remove()
    attns = mha_reference([b.attn for b in blocks], [seen[i] for i in range(len(blocks))])
    pool, mha = m.attn_pool, m.attn_pool.attn
    c, h = mha.embed_dim, mha.num_heads
    with torch.no_grad():  # the pooler written out: ln_q(query) against ln_k(tokens) (kdim != embed_dim)
        q = (pool.ln_q(pool.query) @ mha.q_proj_weight.T + mha.in_proj_bias[:c]).reshape(1, -1, h, c // h)
        k = (pool.ln_k(seen["pool"]) @ mha.k_proj_weight.T + mha.in_proj_bias[c:2 * c])
        k = k.reshape(2, -1, h, c // h)
        a = ((q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) / (c // h) ** 0.5).softmax(dim=-1)  # (B, H, L, N)
    a = (a[:, :, :1] if pool_type == "tok" else a[:, :, 1:]).mean(dim=(1, 2)).double()  # the queries kept
    r = rollout_matrix(attns)
    want = patch_cols((a[:, None] @ r)[:, 0], 1, (4, 6))
    got = vitviz.attention_rollout(m, x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert (got - patch_cols(r.mean(dim=1), 1, (4, 6))).abs().max() > 1e-5


def test_aimv2_head_weights_the_rows_by_its_query_attention():
    """AIMv2's pooling head: a learned query (no projection) against its k_proj keys at SDPA's default scale,
    written out here from the weights; the written-out head gives the model's pooler_output, so the attention that
    weights the rows is the one the output is computed with."""
    from hf_models import _eager_attentions, hf_case

    case = hf_case("aimv2-vision")
    m, x = case.model, case.x
    spec = vitviz.inspect(m)
    assert spec.readout.how == "attention-pool" and spec.readout.pool_attention
    with torch.no_grad():
        out = m(pixel_values=x)
        hidden, head = out.last_hidden_state, m.head  # the final-normed patch tokens the head reads
        h, c = head.num_heads, hidden.shape[-1]
        q = head.cls_token.reshape(1, h, 1, c // h)
        k = head.k_proj(hidden).reshape(2, -1, h, c // h).transpose(1, 2)
        v = head.v_proj(hidden).reshape(2, -1, h, c // h).transpose(1, 2)
        a = ((q @ k.transpose(-2, -1)) / (c // h) ** 0.5).softmax(dim=-1)  # (B, H, 1, P)
        torch.testing.assert_close(head.output_proj((a @ v).transpose(1, 2).reshape(2, c)), out.pooler_output,
                                   atol=1e-5, rtol=1e-5)
    w = a[:, :, 0].mean(dim=1).double()  # (B, P): heads averaged
    r = rollout_matrix(_eager_attentions(m, x))
    want = (w[:, None] @ r)[:, 0].reshape(2, 4, 4).float()
    got = vitviz.attention_rollout(m, x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert (got - r.mean(dim=1).reshape(2, 4, 4).float()).abs().max() > 1e-5  # not the patch mean


def test_a_map_pool_scale_its_fused_kernel_ignores_is_refused():
    """timm's ``AttentionPoolLatent`` with ``fused_attn`` on scales by ``head_dim ** -0.5`` and never reads
    ``scale``: its attention, recomputed with a changed ``scale``, would not be the one that pools the tokens. The
    row-weighting explanations refuse it, naming the model, the pool and the fix; with ``fused_attn=False`` the pool
    computes with its scale and is read with it."""
    m, x = timm_vit(global_pool="map"), images()
    pool = m.attn_pool
    pool.fused_attn = True
    pool.scale = pool.scale * 4
    with pytest.raises(vitviz.UnsupportedModelError, match=r"VisionTransformer \(timm\): attn_pool "
                                                             r"\(AttentionPoolLatent, timm\) has scale=.*fused_attn"):
        vitviz.attention_rollout(m, x)
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())
    pool.fused_attn = False
    vitviz.attention_rollout(m, x)
