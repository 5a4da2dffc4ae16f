"""Adapted models (LoRA, quantisation-aware training): read as they compute, or refused where a rule or a
recomputation would read the layer's weights alone.

A LoRA layer computes ``W x + b + s B A x``; its ``weight`` is ``W``. vitviz reads attention where the model computes
it, so an adapted model's maps are its own; the one recomputation that projects q and k from the weights again
(timm BEiT's stream probe) and AttnLRP's linear rule take a layer only when it is a plain ``nn.Linear``
(``vitviz.core.families.base.plain_linear``). Each map here is checked against attention written out from the
projection *called* (adapter included).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conformance import check_model
from conftest import tiny_relative, tiny_timm_vit
from torch import nn

import vitviz
from vitviz.errors import UnsupportedModelError


class LoRALinear(nn.Linear):
    """LoRA as training scripts often write it: an ``nn.Linear`` subclass with a forward of its own."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None)
        self.load_state_dict(base.state_dict())
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) * 0.5)
        self.lora_b = nn.Parameter(torch.randn(base.out_features, rank) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + (x @ self.lora_a.T) @ self.lora_b.T


def ref_called_projection(m: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """``softmax(q k^T * scale + relative bias)`` with q and k from ``m.qkv`` called, so its adapter counts."""
    x = args[0]
    b, n, _ = x.shape
    q, k, _v = m.qkv(x).reshape(b, n, 3, m.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k = getattr(m, "q_norm", nn.Identity())(q), getattr(m, "k_norm", nn.Identity())(k)
    logits = (q * m.scale) @ k.transpose(-2, -1)
    table = getattr(m, "relative_position_bias_table", None)
    if table is not None:
        bias = table[m.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        logits = logits + bias[None]
    return logits.softmax(dim=-1)


def _adapted(model: nn.Module) -> nn.Module:
    for block in model.blocks:
        block.attn.qkv = LoRALinear(block.attn.qkv)
    return model.eval()


@pytest.mark.parametrize("arch", ["vit", "beit-without-qkv-bias"])
def test_a_lora_written_as_a_linear_subclass_is_read_as_it_computes(arch):
    """Captured, streamed (recomputed and explicit) and analysed maps equal attention from the called projection.
    timm's BEiT streams by projecting q and k again from ``qkv``'s weights: before ``plain_linear`` it did so for
    any ``nn.Linear`` subclass and missed the adapter (maps off by up to 0.96 on this model)."""
    torch.manual_seed(0)
    model = _adapted(tiny_timm_vit() if arch == "vit" else tiny_relative(arch))
    check_model(model, torch.randn(2, 3, 32, 48), reference=ref_called_projection)


def test_plain_linear_is_what_computes_f_linear_of_its_weights():
    from timm.layers import Linear as TimmLinear
    from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
    from torch.nn.utils import parametrizations

    from vitviz.core.families.base import plain_linear

    assert plain_linear(nn.Linear(4, 3))
    assert plain_linear(NonDynamicallyQuantizableLinear(4, 3))
    assert plain_linear(TimmLinear(4, 3))
    assert plain_linear(parametrizations.weight_norm(nn.Linear(4, 3)))
    assert not plain_linear(LoRALinear(nn.Linear(4, 3)))
    assert not plain_linear(nn.Conv2d(3, 3, 1))
    qat = torch.ao.nn.qat.Linear(4, 3, qconfig=torch.ao.quantization.get_default_qat_qconfig())
    assert type(qat).__name__ == "Linear" and not plain_linear(qat)  # fake-quantises its weight in forward


def test_attnlrp_refuses_a_linear_that_is_not_plain_even_when_named_linear():
    """Quantisation-aware training's ``Linear`` is an ``nn.Linear`` subclass named ``Linear`` whose forward
    fake-quantises the weight. AttnLRP's linear rule computes ``F.linear(x, weight, bias)``: it once took every
    class named ``Linear`` and would have run this layer without its quantisation, changing the model's output."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    fc1 = model.blocks[0].mlp.fc1
    qconfig = torch.ao.quantization.get_default_qat_qconfig()
    qat = torch.ao.nn.qat.Linear(fc1.in_features, fc1.out_features, qconfig=qconfig)
    qat.load_state_dict(fc1.state_dict(), strict=False)
    model.blocks[0].mlp.fc1 = qat.eval()
    x = torch.randn(2, 3, 32, 48)
    with pytest.raises(UnsupportedModelError, match=r"no rule for the module blocks\.0\.mlp\.fc1 \(torch\.ao\.nn\.qat"):
        vitviz.explain(model, x, method="attnlrp")
    assert vitviz.explain(model, x, method="chefer").shape == (2, 4, 6)


# ------------------------------------------------------------------------------------------------ peft's LoRA

def _peft_vit():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = tiny_timm_vit()
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["qkv", "fc1"], init_lora_weights=False)
    return peft.get_peft_model(base, config).eval()


def test_peft_lora_is_read_as_it_computes_and_explained_as_the_merged_model():
    wrapped = _peft_vit()
    model = wrapped.get_base_model()
    x = torch.randn(2, 3, 32, 48)
    check_model(model, x, reference=ref_called_projection)
    merged = copy.deepcopy(wrapped).merge_and_unload().eval()
    for method in ("rollout", "chefer"):
        got, want = vitviz.explain(model, x, method=method), vitviz.explain(merged, x, method=method)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    with pytest.raises(UnsupportedModelError, match=r"\(peft\.tuners\.lora\.layer\.Linear\).*merge_and_unload"):
        vitviz.explain(model, x, method="attnlrp")
    assert vitviz.explain(merged, x, method="attnlrp").shape == (2, 4, 6)


def test_peft_wrappers_are_refused_naming_the_model_they_adapt():
    wrapped = _peft_vit()
    with pytest.raises(UnsupportedModelError, match=r"PeftModel is peft's wrapper of a VisionTransformer.*"
                                                    r"model\.get_base_model\(\)"):
        vitviz.inspect(wrapped)
    with pytest.raises(UnsupportedModelError,
                       match=r"LoraModel is peft's wrapper of a VisionTransformer.*model\.model"):
        vitviz.inspect(wrapped.base_model)
