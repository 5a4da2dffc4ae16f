"""A hand-written float64 AttnLRP for pre-norm ViTs: the forward and the explicit LRP backward, layer by layer.

No autograd: every relevance is computed from the paper's rule as written (ratios of contributions), so it checks
vitviz's gradient x input implementation independently. Parameters are read from timm, torchvision or Hugging Face
models into one plain description (``params_timm`` / ``params_torchvision`` / ``params_hf`` / ``params_siglip`` /
``params_open_clip``).
Besides the plain GELU MLP and class-token / average readouts it covers gated MLPs (``act(gate) * up``, the uniform
rule on the product) and attention pooling with a learned query (timm's ``global_pool="map"``, SigLIP's head), whose
query is a weight: the scores pass all their relevance to the keys.
"""

from __future__ import annotations

import torch

D = torch.float64
F = torch.nn.functional


def _t(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.detach().to(D).clone()


def _lin(m) -> tuple:
    return _t(m.weight), _t(m.bias)


def _stacked_qkv(a) -> tuple:
    """Separate ``q_proj`` / ``k_proj`` / ``v_proj`` as one ``[q; k; v]`` projection."""
    parts = (a.q_proj, a.k_proj, a.v_proj)
    return _t(torch.cat([p.weight for p in parts])), _t(torch.cat([p.bias for p in parts]))


def _ln(m) -> tuple:
    return _t(m.weight), _t(m.bias), float(m.eps)


def _mlp_timm(mlp) -> dict:
    """fc1 (for a gated MLP: ``[gate; up]`` stacked), fc2, the activation (the module's own, a function of its
    input) and where the gate sits."""
    kind = type(mlp).__name__
    if kind == "SwiGLU":
        w = torch.cat([mlp.fc1_g.weight, mlp.fc1_x.weight])
        b = torch.cat([mlp.fc1_g.bias, mlp.fc1_x.bias])
        return dict(fc1=(_t(w), _t(b)), fc2=_lin(mlp.fc2), act=mlp.act, glu="first")
    if kind == "GluMlp":  # x1, x2 = fc1(x).chunk(2): act(x1) * x2, or x1 * act(x2) with gate_last
        return dict(fc1=_lin(mlp.fc1), fc2=_lin(mlp.fc2), act=mlp.act, glu="last" if mlp.gate_last else "first")
    assert kind == "Mlp"
    return dict(fc1=_lin(mlp.fc1), fc2=_lin(mlp.fc2), act=mlp.act, glu=None)


def params_timm(model) -> dict:
    blocks = [dict(ln1=_ln(b.norm1), qkv=_lin(b.attn.qkv), proj=_lin(b.attn.proj), ln2=_ln(b.norm2),
                   heads=b.attn.num_heads, ls1=_t(getattr(b.ls1, "gamma", None)),
                   ls2=_t(getattr(b.ls2, "gamma", None)), **_mlp_timm(b.mlp))
              for b in model.blocks]
    if model.global_pool == "map":  # norm on every token, then the attention pool (its latent through q)
        ap = model.attn_pool
        q = ap.q(ap.latent)
        pool = dict(q=_t(q), kv=_lin(ap.kv), proj=_lin(ap.proj), ln=_ln(ap.norm), heads=ap.num_heads,
                    mlp=_mlp_timm(ap.mlp))
        skip = 0 if model.pool_include_prefix else model.num_prefix_tokens  # timm pools the patches by default
        return dict(blocks=blocks, norm=_ln(model.norm), head=_lin(model.head), pool="map", map=pool, prefix=skip)
    pool = "avg" if model.global_pool == "avg" else "token"
    norm = model.fc_norm if pool == "avg" else model.norm
    return dict(blocks=blocks, norm=_ln(norm), head=_lin(model.head), pool=pool, prefix=model.num_prefix_tokens)


def params_siglip(model) -> dict:
    """``SiglipVisionModel``: post-norm on every token, then the head's probe attention; the explained score is the
    sum of ``pooler_output`` (no classifier: ``head=None``)."""
    gelu_tanh = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    blocks = []
    for layer in model.encoder.layers:
        a = layer.self_attn
        blocks.append(dict(ln1=_ln(layer.layer_norm1), qkv=_stacked_qkv(a), proj=_lin(a.out_proj),
                           ln2=_ln(layer.layer_norm2), fc1=_lin(layer.mlp.fc1), fc2=_lin(layer.mlp.fc2),
                           act=gelu_tanh, glu=None, heads=model.config.num_attention_heads, ls1=None, ls2=None))
    head = model.head
    mha, e = head.attention, head.attention.embed_dim
    w, b = _t(mha.in_proj_weight), _t(mha.in_proj_bias)
    pool = dict(q=head.probe.detach().to(D) @ w[:e].T + b[:e], kv=(w[e:], b[e:]), proj=_lin(mha.out_proj),
                ln=_ln(head.layernorm), heads=mha.num_heads,
                mlp=dict(fc1=_lin(head.mlp.fc1), fc2=_lin(head.mlp.fc2), act=gelu_tanh, glu=None))
    return dict(blocks=blocks, norm=_ln(model.post_layernorm), head=None, pool="map", map=pool, prefix=0)


def params_torchvision(model) -> dict:
    blocks = []
    for layer in model.encoder.layers:
        a = layer.self_attention
        blocks.append(dict(ln1=_ln(layer.ln_1), qkv=(_t(a.in_proj_weight), _t(a.in_proj_bias)),
                           proj=_lin(a.out_proj), ln2=_ln(layer.ln_2), fc1=_lin(layer.mlp[0]),
                           fc2=_lin(layer.mlp[3]), act=F.gelu, glu=None, heads=a.num_heads, ls1=None, ls2=None))
    return dict(blocks=blocks, norm=_ln(model.encoder.ln), head=_lin(model.heads.head), pool="token", prefix=1)


def params_open_clip(visual) -> dict:
    """An open_clip ``VisionTransformer`` tower reading its class token (``pool_type="tok"``): ``ln_post`` on it,
    then the bare ``proj`` matrix as a bias-free head."""
    blocks = []
    for block in visual.transformer.resblocks:
        a = block.attn
        blocks.append(dict(ln1=_ln(block.ln_1), qkv=(_t(a.in_proj_weight), _t(a.in_proj_bias)),
                           proj=_lin(a.out_proj), ln2=_ln(block.ln_2), fc1=_lin(block.mlp.c_fc),
                           fc2=_lin(block.mlp.c_proj), act=block.mlp.gelu, glu=None, heads=a.num_heads,
                           ls1=_t(getattr(block.ls_1, "gamma", None)), ls2=_t(getattr(block.ls_2, "gamma", None))))
    w = _t(visual.proj).T
    return dict(blocks=blocks, norm=_ln(visual.ln_post), head=(w, torch.zeros(w.shape[0], dtype=D)), pool="token",
                prefix=1)


def params_hf(model) -> dict:
    blocks = []
    for layer in model.vit.layers:
        a = layer.attention
        blocks.append(dict(ln1=_ln(layer.layernorm_before), qkv=_stacked_qkv(a), proj=_lin(a.o_proj),
                           ln2=_ln(layer.layernorm_after), fc1=_lin(layer.mlp.fc1), fc2=_lin(layer.mlp.fc2),
                           act=F.gelu, glu=None, heads=a.num_attention_heads if hasattr(a, "num_attention_heads") else
                           model.config.num_attention_heads, ls1=None, ls2=None))
    return dict(blocks=blocks, norm=_ln(model.vit.layernorm), head=_lin(model.classifier), pool="token", prefix=1)


def _stab(z: torch.Tensor, eps: float) -> torch.Tensor:
    return z + eps * torch.where(z >= 0, 1.0, -1.0).to(D)


def _lrp_linear(x, w, z, r, eps):
    """Epsilon rule: R_x_j = sum_k x_j w_kj R_k / (z_k + eps sign z_k)."""
    return torch.einsum("...j,kj,...k->...j", x, w, r / _stab(z, eps))


def _lrp_add(parts, total, r):
    """Epsilon rule (eps=0) on a sum: each summand gets its share."""
    return [p / total * r for p in parts]


def _ln_forward(x, w, b, eps):
    xc = x - x.mean(-1, keepdim=True)
    sd = (xc.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    n = xc / sd
    y = n * w + b
    return y, dict(x=x, xc=xc, n=n, w=w, y=y)


def _ln_lrp(c, r):
    """Identity on 1/sd and on the weight, epsilon (eps=0) on the bias addition and on x - mean(x)."""
    r_nw = c["n"] * c["w"] / c["y"] * r  # bias share dropped
    r_xc = r_nw  # identity rule: weight multiplication and division by the (constant) sd
    dim = c["x"].shape[-1]
    ratio = r_xc / c["xc"]
    return c["x"] * (ratio - ratio.sum(-1, keepdim=True) / dim)  # x_j sum_i (delta_ij - 1/D) R_i / xc_i


def _mlp_forward(mp: dict, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    f1 = x @ mp["fc1"][0].T + mp["fc1"][1]
    if mp["glu"] is None:
        g = mp["act"](f1)
        c = dict(x=x, f1=f1, g=g)
    else:
        gate, up = f1.chunk(2, -1) if mp["glu"] == "first" else reversed(f1.chunk(2, -1))
        g = mp["act"](gate) * up
        c = dict(x=x, f1=f1, g=g)
    f2 = g @ mp["fc2"][0].T + mp["fc2"][1]
    c["f2"] = f2
    return f2, c


def _mlp_lrp(mp: dict, c: dict, r: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    r_g = _lrp_linear(c["g"], mp["fc2"][0], c["f2"], r, eps)
    if mp["glu"] is None:
        r_f1 = r_g  # identity rule on the activation
    else:  # act(gate) * up: the uniform rule gives each factor half (CP-LRP: the gate is a constant, up gets all);
        # the identity rule then passes act's share on to the gate
        r_gate, r_up = (r_g / 2, r_g / 2) if attention == "attnlrp" else (0 * r_g, r_g)
        r_f1 = torch.cat([r_gate, r_up] if mp["glu"] == "first" else [r_up, r_gate], -1)
    return _lrp_linear(c["x"], mp["fc1"][0], c["f1"], r_f1, eps)


def _map_forward(mp: dict, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Attention pooling with a constant query ``q`` ``(1, 1, E)``, then ``y + mlp(ln(y))``; the first latent."""
    b_, n_, _ = x.shape
    h = mp["heads"]
    zkv = x @ mp["kv"][0].T + mp["kv"][1]
    k, v = (t.reshape(b_, n_, h, -1).transpose(1, 2) for t in zkv.chunk(2, -1))
    qs = mp["q"].reshape(1, 1, h, -1).transpose(1, 2) * k.shape[-1] ** -0.5  # (1, h, 1, d)
    s = qs @ k.transpose(-1, -2)  # (B, h, 1, N)
    att = s.softmax(-1)
    o = att @ v
    oc = o.transpose(1, 2).reshape(b_, 1, -1)
    zp = oc @ mp["proj"][0].T + mp["proj"][1]
    ln, cl = _ln_forward(zp, *mp["ln"])
    f2, cm = _mlp_forward(mp["mlp"], ln)
    out = zp + f2
    return out[:, 0], dict(x=x, zkv=zkv, k=k, v=v, qs=qs, s=s, att=att, o=o, oc=oc, zp=zp, cl=cl, cm=cm, f2=f2,
                           out=out)


def _map_lrp(mp: dict, c: dict, r: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    r_out = torch.zeros_like(c["out"])
    r_out[:, 0] = r
    r_zp, r_f2 = _lrp_add([c["zp"], c["f2"]], c["out"], r_out)
    r_zp = r_zp + _ln_lrp(c["cl"], _mlp_lrp(mp["mlp"], c["cm"], r_f2, eps, attention))
    r_oc = _lrp_linear(c["oc"], mp["proj"][0], c["zp"], r_zp, eps)
    b_, _, _ = r_oc.shape
    h = mp["heads"]
    r_o = r_oc.reshape(b_, 1, h, -1).transpose(1, 2)
    share = torch.einsum("bhji,bhip,bhjp->bhjip", c["att"], c["v"], r_o / c["o"])
    wa, wv = (0.5, 0.5) if attention == "attnlrp" else (0.0, 1.0)
    r_att, r_v = wa * share.sum(-1), wv * share.sum(2)
    r_s = c["s"] * (r_att - c["att"] * r_att.sum(-1, keepdim=True))
    # S_ji = sum_d qs_jd k_id with q a constant (a weight): epsilon (eps=0) over the sum, all of it to k
    share = torch.einsum("xhjd,bhid,bhji->bhjid", c["qs"], c["k"], r_s / c["s"])
    r_k = share.sum(2)
    n_ = r_k.shape[2]
    r_kv = torch.cat([t.transpose(1, 2).reshape(b_, n_, -1) for t in (r_k, r_v)], -1)
    return _lrp_linear(c["x"], mp["kv"][0], c["zkv"], r_kv, eps)


def reference(params: dict, tokens: torch.Tensor, classes: torch.Tensor, eps: float = 1e-6,
              attention: str = "attnlrp") -> tuple[torch.Tensor, torch.Tensor]:
    """Token relevance ``(B, N)`` and the explained logits ``(B,)``; ``tokens`` is the first block's input."""
    e = tokens.to(D)
    caches = []
    for blk in params["blocks"]:
        a, c1 = _ln_forward(e, *blk["ln1"])
        wq, bq = blk["qkv"]
        zqkv = a @ wq.T + bq
        b_, n_, _ = zqkv.shape
        h = blk["heads"]
        q, k, v = (t.reshape(b_, n_, h, -1).transpose(1, 2) for t in zqkv.chunk(3, -1))
        scale = q.shape[-1] ** -0.5
        qs = q * scale
        s = qs @ k.transpose(-1, -2)
        att = s.softmax(-1)
        o = att @ v
        oc = o.transpose(1, 2).reshape(b_, n_, -1)
        zp = oc @ blk["proj"][0].T + blk["proj"][1]
        p = zp * blk["ls1"] if blk["ls1"] is not None else zp
        hh = e + p
        cc, c2 = _ln_forward(hh, *blk["ln2"])
        f2z, cm = _mlp_forward(blk, cc)
        f2 = f2z * blk["ls2"] if blk["ls2"] is not None else f2z
        out = hh + f2
        caches.append(dict(e=e, a=a, c1=c1, zqkv=zqkv, qs=qs, k=k, v=v, s=s, att=att, o=o, oc=oc, zp=zp, p=p, hh=hh,
                           cc=cc, c2=c2, cm=cm, f2=f2, out=out))
        e = out
    if params["pool"] == "map":  # every token normed, then the attention pool
        y_all, cn = _ln_forward(e, *params["norm"])
        y, cp = _map_forward(params["map"], y_all[:, params["prefix"]:])
    else:
        pooled = e[:, params["prefix"]:].mean(1) if params["pool"] == "avg" else e[:, 0]
        y, cn = _ln_forward(pooled, *params["norm"])
    if params["head"] is None:  # the score is the sum of the features: each feature's relevance is its value
        r_y, scores = y, y.sum(-1)
    else:
        logits = y @ params["head"][0].T + params["head"][1]
        r = torch.zeros_like(logits)
        idx = torch.arange(len(classes))
        r[idx, classes] = logits[idx, classes]
        r_y, scores = _lrp_linear(y, params["head"][0], logits, r, eps), logits[idx, classes]
    if params["pool"] == "map":
        r_pooled = torch.zeros_like(e)
        r_pooled[:, params["prefix"]:] = _map_lrp(params["map"], cp, r_y, eps, attention)
        r_e = _ln_lrp(cn, r_pooled)
    else:
        r_pool = _ln_lrp(cn, r_y)
        r_e = torch.zeros_like(e)
        if params["pool"] == "avg":
            pt = e[:, params["prefix"]:]
            r_e[:, params["prefix"]:] = pt / pt.shape[1] / pooled[:, None] * r_pool[:, None]
        else:
            r_e[:, 0] = r_pool
    for blk, c in zip(reversed(params["blocks"]), reversed(caches)):
        r_h, r_f2 = _lrp_add([c["hh"], c["f2"]], c["out"], r_e)
        r_f2z = r_f2  # layer scale: identity (one input, one output)
        r_cc = _mlp_lrp(blk, c["cm"], r_f2z, eps, attention)
        r_h = r_h + _ln_lrp(c["c2"], r_cc)
        r_e_res, r_p = _lrp_add([c["e"], c["p"]], c["hh"], r_h)
        r_oc = _lrp_linear(c["oc"], blk["proj"][0], c["zp"], r_p, eps)
        b_, n_, _ = r_oc.shape
        h = blk["heads"]
        r_o = r_oc.reshape(b_, n_, h, -1).transpose(1, 2)
        # O_jp = sum_i A_ji v_ip: epsilon (eps=0) over the sum, then each product split in half (uniform rule)
        share = torch.einsum("bhji,bhip,bhjp->bhjip", c["att"], c["v"], r_o / c["o"])
        wa, wv = (0.5, 0.5) if attention == "attnlrp" else (0.0, 1.0)
        r_att = wa * share.sum(-1)
        r_v = wv * share.sum(2)
        # softmax, Prop. 3.1: R_in = s_in * (R_out - A * sum R_out)
        r_s = c["s"] * (r_att - c["att"] * r_att.sum(-1, keepdim=True))
        # S_ji = sum_d qs_jd k_id: epsilon (eps=0) then uniform
        share = torch.einsum("bhjd,bhid,bhji->bhjid", c["qs"], c["k"], r_s / c["s"])
        r_q = 0.5 * share.sum(3)  # identity through the constant scale
        r_k = 0.5 * share.sum(2)
        r_qkv = torch.cat([t.transpose(1, 2).reshape(b_, n_, -1) for t in (r_q, r_k, r_v)], -1)
        r_a = _lrp_linear(c["a"], blk["qkv"][0], c["zqkv"], r_qkv, eps)
        r_e = r_e_res + _ln_lrp(c["c1"], r_a)
    return r_e.sum(-1), scores
