"""A model with parametrized weights (``torch.nn.utils.parametrize``: a parametrization of the user's, weight norm,
spectral norm with its power-iteration buffers) comes out of every vitviz call as it went in: the parametrizations
(modules, tensors, classes, order), their ``original`` tensors and buffers, the parametrize cache, and everything
``untouched.unchanged`` compares (``test_model_unchanged.py``); and the calls give the maps of the weights the
parametrizations compute. A ``torch.compile``d model (wrapped, or compiled in place) is refused with the fix
named."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from test_model_unchanged import CALLS
from torch import nn
from torch.nn.utils import parametrizations, parametrize
from untouched import MODELS, images, needs, roughen, unchanged
from untouched import parametrizations as listed

import vitviz


class Scale(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 1.5 * w


def parametrized() -> nn.Module:
    model = MODELS["timm"][0]()
    parametrize.register_parametrization(model.blocks[0].attn.qkv, "weight", Scale())
    parametrizations.weight_norm(model.head)
    parametrizations.spectral_norm(model.blocks[1].mlp.fc1)
    return model


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_keeps_the_parametrizations(name):
    needs(name)
    model = parametrized()
    roughen(model)
    assert [n for n, _ in listed(model)] == ["blocks.0.attn.qkv", "blocks.1.mlp.fc1", "head"]
    with unchanged(model):
        try:
            CALLS[name](model, images(MODELS["timm"][1]))
        finally:
            plt.close("all")


def test_the_maps_are_those_of_the_parametrized_weights():
    """The same weights written into a plain model give the same rollout, Chefer and AttnLRP maps (AttnLRP sorts a
    parametrized ``Linear`` as a ``Linear``)."""
    model = parametrized().eval()
    plain = MODELS["timm"][0]().eval()
    with torch.no_grad():
        missing, _ = plain.load_state_dict(_effective(model), strict=False)
    assert not missing
    x = images(MODELS["timm"][1])
    for method, target in (("rollout", None), ("chefer", 1), ("attnlrp", 1)):
        torch.testing.assert_close(vitviz.explain(model, x, method, target=target),
                                   vitviz.explain(plain, x, method, target=target), rtol=1e-5, atol=1e-6)


def _effective(model: nn.Module) -> dict:
    """The state dict of the weights the parametrizations compute, under the plain model's names."""
    out = {}
    for name, m in model.named_modules():
        for key, value in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]:
            out[f"{name}.{key}" if name else key] = value.detach()
        if parametrize.is_parametrized(m):
            for key in m.parametrizations:
                out[f"{name}.{key}"] = getattr(m, key).detach()
    return out


def test_a_compiled_model_is_refused_with_the_model_it_wraps_named():
    """``torch.compile`` wraps the model (compiling lazily, at the first forward, which never runs here)."""
    model = MODELS["timm"][0]().eval()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(vitviz.UnsupportedModelError, match="_orig_mod"):
        vitviz.explain(compiled, images(MODELS["timm"][1]), "rollout")
    torch.testing.assert_close(vitviz.explain(compiled._orig_mod, images(MODELS["timm"][1]), "rollout"),
                               vitviz.explain(model, images(MODELS["timm"][1]), "rollout"), rtol=0, atol=0)



@pytest.mark.parametrize("where", ["model", "block"])
def test_a_model_compiled_in_place_is_refused(where):
    """``module.compile()`` compiles in place; once it has run, TorchDynamo reuses its graph without vitviz's hooks
    (seen: rollout then found no map). Refused before any forward, with the module and the fix named."""
    model = MODELS["timm"][0]().eval()
    (model if where == "model" else model.blocks[1]).compile(backend="eager")
    with unchanged(model), pytest.raises(vitviz.UnsupportedModelError, match="compiled in place.*load_state_dict"):
        vitviz.explain(model, images(MODELS["timm"][1]), "rollout")
    fresh = MODELS["timm"][0]().eval()
    fresh.load_state_dict(model.state_dict())
    vitviz.explain(fresh, images(MODELS["timm"][1]), "rollout")
