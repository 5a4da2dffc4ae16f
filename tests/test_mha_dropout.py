"""``nn.MultiheadAttention`` in training mode with attention dropout returns its weights after dropout (rows do not
sum to 1): torchvision and open_clip captures refuse it with a ``CaptureError`` (as the Hugging Face families do),
full and stream, and leave the model as it was; in eval mode the same model is captured exactly."""

from __future__ import annotations

import pytest
import torch
from hf_models import mha_reference, open_clip_tower
from test_capture import hooks_everywhere, instance_forwards, record_inputs

import vitviz
from vitviz.core.families import stream
from vitviz.errors import CaptureError


def torchvision_vit(dropout: float) -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             attention_dropout=dropout)


def open_clip_with_dropout(dropout: float) -> torch.nn.Module:
    pytest.importorskip("open_clip")
    tower = open_clip_tower()
    for block in tower.transformer.resblocks:
        block.attn.dropout = dropout
    return tower


MODELS = {"torchvision": (torchvision_vit, "VisionTransformer \\(torchvision, encoder.layers.0.self_attention\\)"),
          "open_clip": (open_clip_with_dropout, "VisionTransformer \\(open_clip, transformer.resblocks.0.attn\\)")}


def image(model: torch.nn.Module) -> torch.Tensor:
    size = getattr(model, "image_size", 32)
    return torch.randn(2, 3, *((size, size) if isinstance(size, int) else size))


def mhas(model: torch.nn.Module) -> list[torch.nn.MultiheadAttention]:
    return [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)]


@pytest.mark.parametrize("heads", ["full", "stream"])
@pytest.mark.parametrize("which", MODELS)
def test_training_mode_with_attention_dropout_is_refused(which, heads, monkeypatch):
    monkeypatch.setattr(stream, "REPROJECT_WITHOUT_KERNEL", True)  # the stream probe's recomputing path on CPU too
    make, owner = MODELS[which]
    model = make(0.5).train()
    kwargs = dict(heads="stream", store=False, on_layer=lambda i, a: None) if heads == "stream" else {}
    with pytest.raises(CaptureError, match=f"{owner} is in training mode with attention dropout 0.5.*model.eval"):
        with vitviz.capture_attention(model, **kwargs):
            model(image(model))
    assert model.training and hooks_everywhere(model) == 0 and instance_forwards(model) == 0


@pytest.mark.parametrize("heads", ["full", "stream"])
@pytest.mark.parametrize("which", MODELS)
def test_switching_to_training_inside_the_capture_is_refused_at_the_call(which, heads):
    make, _ = MODELS[which]
    model = make(0.5).eval()
    kwargs = dict(heads="stream", store=False, on_layer=lambda i, a: None) if heads == "stream" else {}
    with pytest.raises(CaptureError, match="MultiheadAttention is in training mode with attention dropout 0.5"):
        with vitviz.capture_attention(model, **kwargs):
            model.train()
            model(image(model))
    assert hooks_everywhere(model) == 0 and instance_forwards(model) == 0


@pytest.mark.parametrize("which", MODELS)
def test_the_same_model_in_eval_mode_is_captured_exactly(which):
    make, _ = MODELS[which]
    model = make(0.5).eval()
    x = image(model)
    with torch.no_grad(), record_inputs(mhas(model)) as seen, vitviz.capture_attention(model) as cap:
        model(x)
    for got, want in zip(cap.attentions, mha_reference(mhas(model), seen)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
