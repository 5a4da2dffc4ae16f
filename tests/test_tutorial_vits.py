"""Hand-written ViTs read by the tutorial heuristics: qk-norm applied as the module applies it, register tokens in
the layout, and attention the qkv recomputation cannot reproduce (rotary, relative bias, masks) refused."""

from __future__ import annotations

import pytest
import torch
from test_capture import hooks_everywhere, record_inputs
from torch import nn
from tutorial_vit import Block, PatchEmbed

import vitviz
from vitviz.errors import CaptureError, UnsupportedModelError


class QKNormAttention(nn.Module):
    """timm-style attention with per-head q/k LayerNorms and no attn_drop (read by recomputing from qkv)."""

    def __init__(self, dim: int, heads: int, qk_norm: bool = True) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.q_norm = nn.LayerNorm(dim // heads) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(dim // heads) if qk_norm else nn.Identity()
        if qk_norm:
            with torch.no_grad():  # norms far from the identity, so leaving them out shows
                self.q_norm.weight.mul_(4.0)
                self.k_norm.bias.normal_()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        scores = (q * self.scale) @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores + mask
        return self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


class RegViT(nn.Module):
    """``[cls, registers, patches]``; the position table covers the class token and the patches only (DINOv2)."""

    def __init__(self, regs: int = 0, reg_attr: str = "reg_token", qk_norm: bool = False, dim: int = 32) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(32, 8, 3, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.reg_attr = reg_attr
        if regs:
            setattr(self, reg_attr, nn.Parameter(torch.randn(1, regs, dim)))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, dim))
        self.blocks = nn.ModuleList([Block(dim, 2, with_dropout_module=regs > 0) for _ in range(2)])
        if not regs:
            for block in self.blocks:
                block.attn = QKNormAttention(dim, 2, qk_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed
        reg = getattr(self, self.reg_attr, None)
        if reg is not None:
            x = torch.cat([x[:, :1], reg.expand(len(x), -1, -1), x[:, 1:]], 1)
        for block in self.blocks:
            x = block(x)
        return x


def true_attention(attn: QKNormAttention, x: torch.Tensor) -> torch.Tensor:
    b, n, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q).double(), attn.k_norm(k).double()
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1).float()


@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_is_applied_when_recomputing_from_qkv(qk_norm):
    model = RegViT(qk_norm=qk_norm).eval()
    assert vitviz.inspect(model).family == "tutorial"
    attns = [b.attn for b in model.blocks]
    with torch.no_grad(), record_inputs(attns) as seen, vitviz.capture_attention(model) as cap:
        model(torch.randn(2, 3, 32, 32))
    for a, x, got in zip(attns, seen, cap.attentions):
        torch.testing.assert_close(got, true_attention(a, x), atol=1e-5, rtol=1e-4)
    assert hooks_everywhere(model) == 0


@pytest.mark.parametrize("attr, value", [("rope", nn.Identity()), ("rotary_emb", nn.Identity()),
                                         ("relative_position_bias_table", nn.Parameter(torch.zeros(49, 2))),
                                         ("rel_pos_bias", nn.Identity()), ("alibi_slopes", torch.ones(2))])
def test_position_information_inside_attention_is_refused(attr, value):
    model = RegViT().eval()
    setattr(model.blocks[1].attn, attr, value)
    with pytest.raises(UnsupportedModelError, match=f"QKNormAttention has '{attr}'.*probe='qkv' cannot reproduce"):
        with vitviz.capture_attention(model):
            pass
    assert hooks_everywhere(model) == 0


def test_a_call_with_a_mask_is_refused():
    model = RegViT().eval()
    attn = model.blocks[0].attn
    with pytest.raises(CaptureError, match="QKNormAttention was called with argument 1 besides the tokens"):
        with vitviz.capture_attention(model, layers=0):
            attn(torch.randn(1, 17, 32), torch.zeros(17, 17))
    with torch.no_grad(), vitviz.capture_attention(model, layers=0) as cap:  # a mask of None is no mask
        attn(torch.randn(1, 17, 32), None)
    assert cap.attentions[0].shape == (1, 2, 17, 17)


def test_a_qk_norm_over_the_whole_width_is_refused():
    model = RegViT(qk_norm=True).eval()
    model.blocks[0].attn.q_norm = nn.LayerNorm(32)
    with pytest.raises(UnsupportedModelError, match="q_norm is a LayerNorm of width \\(32,\\).*head dimension 16"):
        with vitviz.capture_attention(model):
            pass


@pytest.mark.parametrize("reg_attr", ["reg_token", "register_tokens"])
def test_register_tokens_are_prefix_tokens(reg_attr):
    model = RegViT(regs=4, reg_attr=reg_attr).eval()
    spec = vitviz.inspect(model)
    assert spec.prefix_tokens == ("cls", "reg", "reg", "reg", "reg") and spec.num_tokens == 21
    assert not spec.pos_embed_covers_prefix and spec.pos_embed_kind == "learned"
    torch.testing.assert_close(vitviz.core.families.family_of(model).pos_embed(model), model.pos_embed[:, 1:])
    assert spec.params["prefix_tokens"] == 32 + 4 * 32
    attns = [b.attn for b in model.blocks]
    with torch.no_grad(), record_inputs(attns) as seen, vitviz.capture_attention(model) as cap:
        model(torch.randn(2, 3, 32, 32))
    for a, x, got in zip(attns, seen, cap.attentions):
        q, k, _ = a.qkv(x).reshape(2, 21, 3, 2, 16).permute(2, 0, 3, 1, 4)
        torch.testing.assert_close(got, ((q * a.scale) @ k.transpose(-2, -1)).softmax(-1), atol=1e-5, rtol=1e-4)
    heat = vitviz.attention_rollout(model, torch.randn(1, 3, 32, 32))
    assert heat.shape == (1, 4, 4)


class FusedAttention(QKNormAttention):
    """A hand-written fused path: ``F.scaled_dot_product_attention`` with ``scale=`` passed on or not."""

    def __init__(self, dim: int, heads: int, pass_scale: bool) -> None:
        super().__init__(dim, heads, qk_norm=False)
        self.pass_scale = pass_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        kwargs = {"scale": self.scale} if self.pass_scale else {}
        out = nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


def fused_vit(pass_scale: bool, scale: float | None = None) -> RegViT:
    model = RegViT().eval()
    for block in model.blocks:
        block.attn = FusedAttention(32, 2, pass_scale)
        if scale is not None:
            block.attn.scale = scale
    return model


def test_probe_qkv_refuses_a_fused_path_that_scales_otherwise_than_scale():
    """``probe='qkv'`` recomputes ``softmax(q k^T * module.scale)``; a hand-written fused path that calls
    ``scaled_dot_product_attention`` without ``scale=`` scales by ``head_dim ** -0.5`` whatever ``scale`` says:
    with a changed ``scale`` the maps read were not the model's, without a word."""
    x = torch.randn(2, 3, 32, 32)
    model = fused_vit(pass_scale=False, scale=0.1)
    with pytest.raises(CaptureError, match=r"FusedAttention calls scaled_dot_product_attention with scale None "
                                           r"\(head_dim \*\* -0.5 = 0.25\), but its scale is 0.1.*pass scale=self.scale"):
        with torch.no_grad(), vitviz.capture_attention(model):
            model(x)
    assert hooks_everywhere(model) == 0 and torch._C._len_torch_function_stack() == 0  # no mode left behind
    with torch.no_grad():
        model(x)  # the model runs as before outside the capture
    for model in (fused_vit(pass_scale=False), fused_vit(pass_scale=True, scale=0.1)):  # the scale it computes with
        attns = [b.attn for b in model.blocks]
        with torch.no_grad(), record_inputs(attns) as seen, vitviz.capture_attention(model) as cap:
            model(x)
        for a, inp, got in zip(attns, seen, cap.attentions):
            torch.testing.assert_close(got, true_attention(a, inp), atol=1e-5, rtol=1e-4)


class HardCodedScale(QKNormAttention):
    """An explicit path that divides by ``sqrt(head_dim)`` and never reads ``scale``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


def test_probe_qkv_assumes_an_explicit_path_multiplies_by_scale():
    """Documented (``probe_qkv``, docs/families.md): an explicit path is read as ``softmax(q k^T * scale)``; one
    that ignores ``scale`` cannot be told apart from the outside, so its maps follow ``scale``, not the model."""
    model = RegViT().eval()
    for block in model.blocks:
        block.attn = HardCodedScale(32, 2, qk_norm=False)
        block.attn.scale = 0.1
    attns = [b.attn for b in model.blocks]
    with torch.no_grad(), record_inputs(attns) as seen, vitviz.capture_attention(model) as cap:
        model(torch.randn(2, 3, 32, 32))
    for a, inp, got in zip(attns, seen, cap.attentions):
        torch.testing.assert_close(got, true_attention(a, inp), atol=1e-5, rtol=1e-4)  # scale 0.1, not 0.25
