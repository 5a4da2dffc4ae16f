"""A hand-written float64 AttnLRP for pre-norm ViTs: the forward and the explicit LRP backward, layer by layer.

No autograd: every relevance is computed from the paper's rule as written (ratios of contributions), so it checks
vitviz's gradient x input implementation independently. Parameters are read from timm, torchvision or Hugging Face
models into one plain description (``params_timm`` / ``params_torchvision`` / ``params_hf`` / ``params_siglip`` /
``params_open_clip`` / ``params_cait``).
Besides the plain GELU MLP and class-token / average readouts it covers parallel blocks (timm's
``ParallelThingsBlock`` and ViT-22B's ``ParallelScalingBlock``), differential attention, CaiT (talking heads, class
attention), gated MLPs (``act(gate) * up``, the uniform
rule on the product; a sigmoid gate held constant), gated attention (``proj(o * sigmoid(gate(x)))``: the gate a
constant, all relevance to ``o``) and attention pooling with a learned query (timm's ``global_pool="map"``, SigLIP's head), whose
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
        return dict(fc1=(_t(w), _t(b)), fc2=_lin(mlp.fc2), act=mlp.act, glu="first",
                    held=isinstance(mlp.act, torch.nn.Sigmoid))
    if kind == "GluMlp":  # x1, x2 = fc1(x).chunk(2): act(x1) * x2, or x1 * act(x2) with gate_last
        return dict(fc1=_lin(mlp.fc1), fc2=_lin(mlp.fc2), act=mlp.act, glu="last" if mlp.gate_last else "first",
                    held=isinstance(mlp.act, torch.nn.Sigmoid))
    assert kind == "Mlp"
    return dict(fc1=_lin(mlp.fc1), fc2=_lin(mlp.fc2), act=mlp.act, glu=None)


def _gamma(ls) -> torch.Tensor | None:
    return _t(getattr(ls, "gamma", None))


def _core_timm(a) -> dict:
    """The attention between the q/k/v projection and the output projection: plain softmax, or differential (two
    half-width heads per head, ``A1 - lambda A2``, then the per-head RMS ``sub_norm`` and the ``1 - lambda_init``
    scale)."""
    if not hasattr(a, "sub_norm"):
        return dict(heads=a.num_heads, diff=None)
    return dict(heads=a.num_heads, diff=dict(lam=_t(a._compute_lambda()), init=a.lambda_init,
                                             w=_t(a.sub_norm.weight), eps=float(a.sub_norm.eps)))


def _block_timm(b) -> dict:
    kind = type(b).__name__
    if kind in ("ParallelScalingBlock", "DiffParallelScalingBlock"):  # one in_proj: [mlp hidden, q, k, v]
        fused = b.out_proj is not None
        return dict(kind="scaling", ln1=_ln(b.in_norm), in_proj=_lin(b.in_proj), split=list(b.in_split),
                    mlp_bias=_t(b.mlp_bias), act=b.mlp_act, ls=_gamma(b.ls), **_core_timm(b),
                    out=_lin(b.out_proj) if fused else None,
                    attn_out=None if fused else _lin(b.attn_out_proj), mlp_out=None if fused else _lin(b.mlp_out_proj))
    if kind == "ParallelThingsBlock":  # x + sum_j attn_j(x), then + sum_j ffn_j(.)
        return dict(kind="things",
                    attns=[dict(ln1=_ln(br.norm), qkv=_lin(br.attn.qkv), proj=_lin(br.attn.proj), ls1=_gamma(br.ls),
                                **_core_timm(br.attn)) for br in b.attns],
                    ffns=[dict(ln2=_ln(br.norm), ls2=_gamma(br.ls), **_mlp_timm(br.mlp)) for br in b.ffns])
    gate = getattr(b.attn, "gate", None)  # an output gate: proj(o * sigmoid(gate(x)))
    return dict(kind="block", ln1=_ln(b.norm1), qkv=_lin(b.attn.qkv), proj=_lin(b.attn.proj), ln2=_ln(b.norm2),
                ls1=_gamma(b.ls1), ls2=_gamma(b.ls2), gate=None if gate is None else _lin(gate),
                **_core_timm(b.attn), **_mlp_timm(b.mlp))


def params_timm(model) -> dict:
    blocks = [_block_timm(b) for b in model.blocks]
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


def params_cait(model) -> dict:
    """timm ``Cait`` (class-token readout): talking-heads blocks over the patches, then class-attention blocks that
    update the class token alone (its query; keys and values over the class token and the patches); the final norm
    on every token. ``reference`` returns the class token's relevance first, read where it enters."""
    blocks = [dict(ln1=_ln(b.norm1), qkv=_lin(b.attn.qkv), proj=_lin(b.attn.proj), ln2=_ln(b.norm2),
                   ls1=_t(b.gamma_1), ls2=_t(b.gamma_2), heads=b.attn.num_heads,
                   talking=dict(l=_lin(b.attn.proj_l), w=_lin(b.attn.proj_w)), **_mlp_timm(b.mlp))
              for b in model.blocks]
    late = [dict(ln1=_ln(b.norm1), q=_lin(b.attn.q), k=_lin(b.attn.k), v=_lin(b.attn.v), proj=_lin(b.attn.proj),
                 ln2=_ln(b.norm2), ls1=_t(b.gamma_1), ls2=_t(b.gamma_2), heads=b.attn.num_heads, **_mlp_timm(b.mlp))
            for b in model.blocks_token_only]
    assert model.global_pool == "token"
    return dict(blocks=blocks, class_blocks=late, cls=_t(model.cls_token), norm=_ln(model.norm),
                head=_lin(model.head), pool="token", prefix=1)


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
    then the bare ``proj`` matrix as a bias-free head; or CoCa's (``attentional_pool=True``, ``pool_type="tok"``):
    its attentional pooler's first query over every token, ``ln_post``, ``proj``."""
    blocks = []
    for block in visual.transformer.resblocks:
        a = block.attn
        blocks.append(dict(ln1=_ln(block.ln_1), qkv=(_t(a.in_proj_weight), _t(a.in_proj_bias)),
                           proj=_lin(a.out_proj), ln2=_ln(block.ln_2), fc1=_lin(block.mlp.c_fc),
                           fc2=_lin(block.mlp.c_proj), act=block.mlp.gelu, glu=None, heads=a.num_heads,
                           ls1=_t(getattr(block.ls_1, "gamma", None)), ls2=_t(getattr(block.ls_2, "gamma", None))))
    w = _t(visual.proj).T
    head = (w, torch.zeros(w.shape[0], dtype=D))
    if visual.attn_pool is None:
        return dict(blocks=blocks, norm=_ln(visual.ln_post), head=head, pool="token", prefix=1)
    # CoCa: ln_k on every token, the attentional pooler's learned queries (the first is read), ln_post, proj
    ap = visual.attn_pool
    mha, e = ap.attn, ap.attn.embed_dim
    ws = ((mha.in_proj_weight[:e], mha.in_proj_weight[e:2 * e], mha.in_proj_weight[2 * e:]) if mha._qkv_same_embed_dim
          else (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight))
    wq, wk, wv = (_t(x) for x in ws)
    b = _t(mha.in_proj_bias)
    pool = dict(q=_t(ap.ln_q(ap.query))[0] @ wq.T + b[:e], kv=(torch.cat([wk, wv]), b[e:]), proj=_lin(mha.out_proj),
                heads=mha.num_heads, mlp=None, post=_ln(visual.ln_post))
    return dict(blocks=blocks, norm=_ln(ap.ln_k), head=head, pool="map", map=pool, prefix=0)


def params_hf(model) -> dict:
    """Hugging Face ``ViTForImageClassification`` (its classifier on the class token), or ``ViTModel`` /
    ``ViTMAEModel`` (the score is the sum of the final-normed class token's features: no head)."""
    root = getattr(model, "vit", model)
    blocks = []
    for layer in root.layers:
        a = layer.attention
        blocks.append(dict(ln1=_ln(layer.layernorm_before), qkv=_stacked_qkv(a), proj=_lin(a.o_proj),
                           ln2=_ln(layer.layernorm_after), fc1=_lin(layer.mlp.fc1), fc2=_lin(layer.mlp.fc2),
                           act=F.gelu, glu=None, heads=a.num_attention_heads if hasattr(a, "num_attention_heads") else
                           model.config.num_attention_heads, ls1=None, ls2=None))
    head = _lin(model.classifier) if hasattr(model, "classifier") else None
    return dict(blocks=blocks, norm=_ln(root.layernorm), head=head, pool="token", prefix=1)


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
    else:  # act(gate) * up: the uniform rule gives each factor half (CP-LRP, or a sigmoid gate: the gate is a
        # constant, up gets all); the identity rule then passes act's share on to the gate
        hold = attention == "cp" or mp.get("held", False)
        r_gate, r_up = (0 * r_g, r_g) if hold else (r_g / 2, r_g / 2)
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
    c = dict(x=x, zkv=zkv, k=k, v=v, qs=qs, s=s, att=att, o=o, oc=oc, zp=zp, out=zp)
    if mp["mlp"] is not None:
        ln, c["cl"] = _ln_forward(zp, *mp["ln"])
        c["f2"], c["cm"] = _mlp_forward(mp["mlp"], ln)
        c["out"] = zp + c["f2"]
    if mp.get("post") is None:
        return c["out"][:, 0], c
    y, c["post"] = _ln_forward(c["out"][:, 0], *mp["post"])  # open_clip's ln_post after its attentional pooler
    return y, c


def _map_lrp(mp: dict, c: dict, r: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    r_out = torch.zeros_like(c["out"])
    r_out[:, 0] = r if mp.get("post") is None else _ln_lrp(c["post"], r)
    if mp["mlp"] is None:
        r_zp = r_out
    else:
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


def _affine(x: torch.Tensor, wb: tuple) -> torch.Tensor:
    return x @ wb[0].T + (0 if wb[1] is None else wb[1])


def _core_forward(blk: dict, zqkv: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``[q; k; v]`` ``(B, N, 3E)`` -> the heads' concatenated output ``(B, N, E)``. Softmax attention, or
    differential attention (Ye et al. 2024): q and k hold two half-width heads per head, the map is
    ``A1 - lambda A2``, each head's output is RMS-normed (``sub_norm``) and scaled by ``1 - lambda_init``."""
    b_, n_, _ = zqkv.shape
    h, diff = blk["heads"], blk.get("diff")
    zq, zk, zv = zqkv.chunk(3, -1)
    q, k = (t.reshape(b_, n_, 2 * h if diff else h, -1).transpose(1, 2) for t in (zq, zk))
    v = zv.reshape(b_, n_, h, -1).transpose(1, 2)
    qs = q * q.shape[-1] ** -0.5
    s = qs @ k.transpose(-1, -2)
    th = blk.get("talking")
    if th:  # talking heads (CaiT): a linear map across the heads before the softmax and one after it
        mix = _heads_affine(s, th["l"])
        att = mix.softmax(-1)
        out = _heads_affine(att, th["w"])
        o = out @ v
        return o.transpose(1, 2).reshape(b_, n_, -1), dict(qs=qs, k=k, v=v, s=s, mix=mix, att=att, mixed=out, o=o)
    att = s.softmax(-1)
    if diff:  # the summands of each output: A1 v and -lambda A2 v
        pair = att.reshape(b_, h, 2, n_, n_)
        terms = torch.stack([pair[:, :, 0], -diff["lam"] * pair[:, :, 1]], 2)
    else:
        terms = att[:, :, None]
    o = terms.sum(2) @ v
    out = o
    if diff:
        out = o / (o.pow(2).mean(-1, keepdim=True) + diff["eps"]).sqrt() * diff["w"] * (1 - diff["init"])
    return out.transpose(1, 2).reshape(b_, n_, -1), dict(qs=qs, k=k, v=v, s=s, att=att, terms=terms, o=o)


def _core_lrp(blk: dict, c: dict, r_oc: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    """The relevance of ``[q; k; v]`` from that of the heads' output."""
    b_, n_, _ = r_oc.shape
    # differential: the RMS sub-norm (identity rule) and the constant scale pass the relevance on unchanged
    r_o = r_oc.reshape(b_, n_, blk["heads"], -1).transpose(1, 2)
    wa, wv = (0.5, 0.5) if attention == "attnlrp" else (0.0, 1.0)
    th = blk.get("talking")
    if th:
        share = torch.einsum("bhji,bhip,bhjp->bhjip", c["mixed"], c["v"], r_o / c["o"])
        r_v = wv * share.sum(2)
        r_att = _heads_lrp(c["att"], th["w"], c["mixed"], wa * share.sum(-1), eps)  # epsilon rule across the heads
        r_mix = c["mix"] * (r_att - c["att"] * r_att.sum(-1, keepdim=True))
        return torch.cat([*map(_flat, _qk_lrp(c, _heads_lrp(c["s"], th["l"], c["mix"], r_mix, eps))), _flat(r_v)], -1)
    # O_jp = sum_t sum_i T_tji v_ip (T: A; or A1 and -lambda A2): epsilon (eps=0) over the sum, then each product
    # split in half (uniform rule)
    share = torch.einsum("bhtji,bhip,bhjp->bhtjip", c["terms"], c["v"], r_o / c["o"])
    r_att = (wa * share.sum(-1)).reshape(c["att"].shape)  # -lambda A2 passes its relevance to A2 (a constant factor)
    r_v = wv * share.sum((2, 3))
    # softmax, Prop. 3.1: R_in = s_in * (R_out - A * sum R_out)
    r_q, r_k = _qk_lrp(c, c["s"] * (r_att - c["att"] * r_att.sum(-1, keepdim=True)))
    return torch.cat([_flat(r_q), _flat(r_k), _flat(r_v)], -1)


def _qk_lrp(c: dict, r_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S_ji = sum_d qs_jd k_id: epsilon (eps=0) over the sum, then the uniform rule; q's and k's relevance."""
    share = torch.einsum("bhjd,bhid,bhji->bhjid", c["qs"], c["k"], r_s / c["s"])
    return 0.5 * share.sum(3), 0.5 * share.sum(2)  # q: identity through the constant scale


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``(B, H, N, d)`` heads -> ``(B, N, H d)``."""
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


def _heads_affine(t: torch.Tensor, wb: tuple) -> torch.Tensor:
    """A linear map across the heads of ``(B, H, N, M)`` maps (CaiT's ``proj_l`` / ``proj_w``)."""
    return torch.einsum("gh,bhij->bgij", wb[0], t) + wb[1][None, :, None, None]


def _heads_lrp(x: torch.Tensor, wb: tuple, z: torch.Tensor, r: torch.Tensor, eps: float) -> torch.Tensor:
    """The epsilon rule for ``_heads_affine``."""
    return x * torch.einsum("gh,bgij->bhij", wb[0], r / _stab(z, eps))


def _attn_forward(br: dict, e: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """norm, qkv, attention, (an output gate,) proj, layer scale."""
    a, c1 = _ln_forward(e, *br["ln1"])
    zqkv = _affine(a, br["qkv"])
    oc, core = _core_forward(br, zqkv)
    zg = og = None
    if br.get("gate") is not None:
        zg = _affine(a, br["gate"])
        og = oc * torch.sigmoid(zg)
    zp = _affine(oc if og is None else og, br["proj"])
    return (zp * br["ls1"] if br["ls1"] is not None else zp), dict(a=a, c1=c1, zqkv=zqkv, core=core, oc=oc, zp=zp,
                                                                   zg=zg, og=og)


def _attn_lrp(br: dict, c: dict, r_p: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    # layer scale: identity (one input, one output); an output gate o * sigmoid(z): the gate is a constant weight
    # (signal-take-all), o takes all of the product's relevance, under both attention rules
    r_oc = _lrp_linear(c["oc"] if c["og"] is None else c["og"], br["proj"][0], c["zp"], r_p, eps)
    r_a = _lrp_linear(c["a"], br["qkv"][0], c["zqkv"], _core_lrp(br, c["core"], r_oc, eps, attention), eps)
    return _ln_lrp(c["c1"], r_a)


def _ffn_forward(br: dict, e: torch.Tensor) -> tuple[torch.Tensor, dict]:
    cc, c2 = _ln_forward(e, *br["ln2"])
    f2, cm = _mlp_forward(br, cc)
    return (f2 * br["ls2"] if br["ls2"] is not None else f2), dict(c2=c2, cm=cm)


def _ffn_lrp(br: dict, c: dict, r_f: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    return _ln_lrp(c["c2"], _mlp_lrp(br, c["cm"], r_f, eps, attention))


def _scaling_forward(blk: dict, e: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """ViT-22B's parallel block: ``x + ls(out_proj([attention(q, k, v), act(m + mlp_bias)]))`` with
    ``[m, q, k, v] = in_proj(norm(x))`` (or separate output projections, summed)."""
    a, c1 = _ln_forward(e, *blk["ln1"])
    z = _affine(a, blk["in_proj"])
    zm, zqkv = z.split([blk["split"][0], sum(blk["split"][1:])], -1)
    m = zm + blk["mlp_bias"] if blk["mlp_bias"] is not None else zm
    xm = blk["act"](m)
    oc, core = _core_forward(blk, zqkv)
    if blk["out"] is not None:
        cat = torch.cat([oc, xm], -1)
        y, parts = _affine(cat, blk["out"]), None
    else:
        parts = (_affine(oc, blk["attn_out"]), _affine(xm, blk["mlp_out"]))
        y, cat = parts[0] + parts[1], None
    p = y * blk["ls"] if blk["ls"] is not None else y
    return e + p, dict(e=e, a=a, c1=c1, z=z, zm=zm, m=m, xm=xm, oc=oc, core=core, cat=cat, parts=parts, y=y, p=p,
                       out=e + p)


def _scaling_lrp(blk: dict, c: dict, r_out: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    r_e, r_y = _lrp_add([c["e"], c["p"]], c["out"], r_out)  # layer scale: identity
    if c["cat"] is not None:
        r_oc, r_xm = _lrp_linear(c["cat"], blk["out"][0], c["y"], r_y, eps).split([c["oc"].shape[-1],
                                                                                   c["xm"].shape[-1]], -1)
    else:
        r_ya, r_ym = _lrp_add(list(c["parts"]), c["y"], r_y)
        r_oc = _lrp_linear(c["oc"], blk["attn_out"][0], c["parts"][0], r_ya, eps)
        r_xm = _lrp_linear(c["xm"], blk["mlp_out"][0], c["parts"][1], r_ym, eps)
    r_zm = c["zm"] / c["m"] * r_xm  # identity rule on the activation, then the bias's share dropped (eps=0)
    r_z = torch.cat([r_zm, _core_lrp(blk, c["core"], r_oc, eps, attention)], -1)
    return r_e + _ln_lrp(c["c1"], _lrp_linear(c["a"], blk["in_proj"][0], c["z"], r_z, eps))


def _block_forward(blk: dict, e: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """One block: ``block`` (pre-norm, ``x + attn(x)`` then ``+ mlp``), ``things`` (``x + sum_j attn_j(x)`` then
    ``+ sum_j ffn_j``, Touvron et al. 2022) or ``scaling`` (ViT-22B's parallel block)."""
    kind = blk.get("kind", "block")
    if kind == "scaling":
        return _scaling_forward(blk, e)
    attns = blk["attns"] if kind == "things" else [blk]
    ffns = blk["ffns"] if kind == "things" else [blk]
    ps, cas = zip(*(_attn_forward(br, e) for br in attns))
    hh = e + sum(ps)
    fs, cfs = zip(*(_ffn_forward(br, hh) for br in ffns))
    out = hh + sum(fs)
    return out, dict(e=e, ps=ps, cas=cas, hh=hh, fs=fs, cfs=cfs, out=out, attns=attns, ffns=ffns)


def _block_lrp(blk: dict, c: dict, r_out: torch.Tensor, eps: float, attention: str) -> torch.Tensor:
    if blk.get("kind", "block") == "scaling":
        return _scaling_lrp(blk, c, r_out, eps, attention)
    r_h, *r_fs = _lrp_add([c["hh"], *c["fs"]], c["out"], r_out)
    r_h = r_h + sum(_ffn_lrp(br, cf, r, eps, attention) for br, cf, r in zip(c["ffns"], c["cfs"], r_fs))
    r_e, *r_ps = _lrp_add([c["e"], *c["ps"]], c["hh"], r_h)
    return r_e + sum(_attn_lrp(br, ca, r, eps, attention) for br, ca, r in zip(c["attns"], c["cas"], r_ps))


def _class_block_forward(cb: dict, cls: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """CaiT's class attention: ``cls + ls1 * attn(norm1([cls, x]))`` with the class token's query alone, then
    ``+ ls2 * mlp(norm2(.))``."""
    a, c1 = _ln_forward(torch.cat([cls, x], 1), *cb["ln1"])
    zq, zk, zv = _affine(a[:, :1], cb["q"]), _affine(a, cb["k"]), _affine(a, cb["v"])
    q, k, v = (t.reshape(t.shape[0], t.shape[1], cb["heads"], -1).transpose(1, 2) for t in (zq, zk, zv))
    qs = q * q.shape[-1] ** -0.5
    s = qs @ k.transpose(-1, -2)
    att = s.softmax(-1)
    o = att @ v
    oc = _flat(o)
    zp = _affine(oc, cb["proj"])
    cls1 = cls + zp * cb["ls1"]
    f, cf = _ffn_forward(cb, cls1)
    return cls1 + f, dict(cls=cls, a=a, c1=c1, zq=zq, zk=zk, zv=zv, qs=qs, k=k, v=v, s=s, att=att, o=o, oc=oc, zp=zp,
                          p=zp * cb["ls1"], cls1=cls1, f=f, cf=cf, out=cls1 + f)


def _class_block_lrp(cb: dict, c: dict, r_out: torch.Tensor, eps: float,
                     attention: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The relevance of the class token entering the block and of the patch tokens (its keys and values)."""
    r_cls1, r_f = _lrp_add([c["cls1"], c["f"]], c["out"], r_out)
    r_cls1 = r_cls1 + _ffn_lrp(cb, c["cf"], r_f, eps, attention)
    r_cls, r_p = _lrp_add([c["cls"], c["p"]], c["cls1"], r_cls1)
    r_oc = _lrp_linear(c["oc"], cb["proj"][0], c["zp"], r_p, eps)
    r_o = r_oc.reshape(r_oc.shape[0], 1, cb["heads"], -1).transpose(1, 2)
    share = torch.einsum("bhji,bhip,bhjp->bhjip", c["att"], c["v"], r_o / c["o"])
    wa, wv = (0.5, 0.5) if attention == "attnlrp" else (0.0, 1.0)
    r_att, r_v = wa * share.sum(-1), wv * share.sum(2)
    r_q, r_k = _qk_lrp(c, c["s"] * (r_att - c["att"] * r_att.sum(-1, keepdim=True)))
    r_a = _lrp_linear(c["a"], cb["k"][0], c["zk"], _flat(r_k), eps) + _lrp_linear(c["a"], cb["v"][0], c["zv"],
                                                                                 _flat(r_v), eps)
    r_a[:, :1] += _lrp_linear(c["a"][:, :1], cb["q"][0], c["zq"], _flat(r_q), eps)
    r_u = _ln_lrp(c["c1"], r_a)
    return r_cls + r_u[:, :1], r_u[:, 1:]


def pixels_timm(model, x: torch.Tensor, r_tokens: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The relevance of a timm ``VisionTransformer``'s pixels ``(B, H, W)`` from its tokens' ``(B, N, D)``
    (``reference(..., per_feature=True)``): the tokens are the patch convolution's output plus the position table
    (and the class token, an input of no pixel), so the sum passes each its share (epsilon 0: the table keeps its
    own, as a bias), then the epsilon rule on the convolution written as a linear map of the unfolded patches."""
    conv = model.patch_embed.proj
    w, b = _t(conv.weight).flatten(1), _t(conv.bias)
    cols = F.unfold(x.to(D), conv.kernel_size, stride=conv.stride)  # (B, C k k, P)
    proj = cols.transpose(1, 2) @ w.T + b  # (B, P, D)
    p = model.num_prefix_tokens
    tokens = proj + _t(model.pos_embed)[:, -proj.shape[1]:]
    r_proj = proj / tokens * r_tokens[:, p:]
    r_cols = _lrp_linear(cols.transpose(1, 2), w, proj, r_proj, eps)  # (B, P, C k k)
    r_x = F.fold(r_cols.transpose(1, 2), x.shape[-2:], conv.kernel_size, stride=conv.stride)
    return r_x.sum(1)


def reference(params: dict, tokens: torch.Tensor, classes: torch.Tensor, eps: float = 1e-6,
              attention: str = "attnlrp", per_feature: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token relevance ``(B, N)`` (``(B, N, D)`` with ``per_feature``) and the explained logits ``(B,)``; ``tokens``
    is the first block's input."""
    e = tokens.to(D)
    caches = []
    for blk in params["blocks"]:
        e, c = _block_forward(blk, e)
        caches.append(c)
    late = params.get("class_blocks", [])  # CaiT: the class token joins here
    cls, late_caches = (params["cls"].expand(len(e), -1, -1), []) if late else (None, [])
    for cb in late:
        cls, c = _class_block_forward(cb, cls, e)
        late_caches.append(c)
    patches = e
    if late:
        e = torch.cat([cls, e], 1)
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
    if late:
        r_cls, r_e = r_e[:, :1], r_e[:, 1:]
        for cb, c in zip(reversed(late), reversed(late_caches)):
            r_cls, r_x = _class_block_lrp(cb, c, r_cls, eps, attention)
            r_e = r_e + r_x
    assert r_e.shape == patches.shape
    for blk, c in zip(reversed(params["blocks"]), reversed(caches)):
        r_e = _block_lrp(blk, c, r_e, eps, attention)
    r = torch.cat([r_cls, r_e], 1) if late else r_e
    return (r if per_feature else r.sum(-1)), scores
