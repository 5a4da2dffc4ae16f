"""A model set up for training or feature extraction is read as the plain model, or refused naming the one to pass.

Activation checkpointing, multi-device wrappers (``DataParallel``, ``DistributedDataParallel``) and timm's
``features_only`` wrapper.

A checkpointed block runs its forward again in the backward pass. vitviz switches the libraries' checkpointing
flags off while a capture is open (and back on after), and drops the maps a probe reads during a backward pass
(a model's own ``torch.utils.checkpoint``). Each result here is compared with the same weights without
checkpointing.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from tutorial_vit import TutorialViT
from untouched import MODELS, images

import vitviz
from vitviz.core.capture import capture_attention
from vitviz.errors import UnsupportedModelError


class CheckpointedViT(TutorialViT):
    """A hand-written ViT that checkpoints each block itself, as training scripts do."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(self.norm(x)[:, 0])


def _flags(model: nn.Module) -> dict[str, bool]:
    return {f"{name}.{attr}": getattr(m, attr) for name, m in model.named_modules()
            for attr in ("grad_checkpointing", "gradient_checkpointing") if isinstance(getattr(m, attr, None), bool)}


def _checkpointed(family: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(the model with checkpointing on, the same weights without, input), in eval mode."""
    if family == "tutorial":
        torch.manual_seed(0)
        plain = TutorialViT().eval()
        model = CheckpointedViT(reentrant=False).eval()
        model.load_state_dict(plain.state_dict())
        return model, plain, images((32, 32))
    build, size = MODELS[family]
    torch.manual_seed(0)
    plain = build().eval()
    model = copy.deepcopy(plain)
    model.set_grad_checkpointing(True)
    assert any(_flags(model).values()) and not any(_flags(plain).values())
    return model, plain, images(size)


@pytest.mark.parametrize("family", ["timm", "open_clip", "tutorial"])
def test_a_capture_around_a_training_step_reads_the_forward_once(family):
    model, plain, x = _checkpointed(family)
    before = _flags(model)
    with capture_attention(plain) as want:
        plain(x)
    with capture_attention(model) as cap:
        if before:
            assert not any(_flags(model).values()), "checkpointing is off while the capture is open"
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    assert cap.forwards == 1
    assert len(cap.attentions) == len(want.attentions)
    for got, ref in zip(cap.attentions, want.attentions):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    assert _flags(model) == before


@pytest.mark.parametrize("method", ["chefer", "grad_rollout"])
@pytest.mark.parametrize("family", ["timm", "open_clip", "tutorial"])
def test_gradient_explanations_of_a_checkpointed_model_are_the_plain_models(family, method):
    model, plain, x = _checkpointed(family)
    before = _flags(model)
    # an open_clip tower returns its image embedding, not logits: a score per image, the embedding's norm
    target = (lambda out: out.norm(dim=-1)) if family == "open_clip" else None
    got = vitviz.explain(model, x, method=method, target=target)
    torch.testing.assert_close(got, vitviz.explain(plain, x, method=method, target=target), rtol=0, atol=1e-6)
    assert _flags(model) == before


def test_a_reentrant_checkpoint_is_refused_for_gradients_with_the_fix():
    torch.manual_seed(0)
    model = CheckpointedViT(reentrant=True).eval()
    x = images((32, 32))
    with pytest.raises(UnsupportedModelError, match="CheckpointedViT.*outside autograd.*use_reentrant=False"):
        vitviz.explain(model, x, method="chefer")
    assert vitviz.explain(model, x, method="rollout").shape == (2, 4, 4)  # no gradient needed: read as is


def test_checkpointing_comes_back_when_the_last_capture_exits_in_any_order():
    build, size = MODELS["timm"]
    model = build().eval()
    model.set_grad_checkpointing(True)
    before = _flags(model)
    first = capture_attention(model)
    second = capture_attention(model)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not any(_flags(model).values()), "the second capture is still open"
    second.__exit__(None, None, None)
    assert _flags(model) == before
    with pytest.raises(RuntimeError, match="boom"), capture_attention(model):
        raise RuntimeError("boom")
    assert _flags(model) == before
    model.set_grad_checkpointing(False)  # a flag that was off stays off
    with capture_attention(model):
        pass
    assert not any(_flags(model).values())


def test_hugging_face_gradient_checkpointing_is_off_in_a_capture_and_back_after():
    build, size = MODELS["huggingface"]
    model = build().eval()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()  # transformers 5.24 renamed it; both set each layer's gradient_checkpointing
    before = _flags(model)
    assert any(before.values())
    with capture_attention(model) as cap:
        assert not any(_flags(model).values())
        model(images(size))
    assert cap.forwards == 1 and _flags(model) == before


@pytest.mark.parametrize("wrapper", ["DataParallel", "DistributedDataParallel"])
def test_multi_device_wrappers_are_refused_naming_the_model_they_wrap(wrapper):
    build, _size = MODELS["timm"]
    model = build().eval()
    if wrapper == "DataParallel":
        wrapped = nn.DataParallel(model)
    else:  # built without a process group: only its class and .module matter to vitviz
        wrapped = nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel)
        nn.Module.__init__(wrapped)
        wrapped.module = model
    with pytest.raises(UnsupportedModelError, match=f"{wrapper} is a wrapper of a VisionTransformer.*model.module"):
        vitviz.inspect(wrapped)
    assert vitviz.inspect(wrapped.module).depth == vitviz.inspect(model).depth


def test_timm_features_only_is_refused_naming_the_model_it_wraps():
    """``features_only`` returns a list of feature maps; the ViT it wraps (``model.model``, pruned to the blocks up
    to the last feature taken) is read as usual."""
    import timm

    features = timm.create_model("vit_tiny_patch16_224", img_size=32, features_only=True, out_indices=(0,)).eval()
    with pytest.raises(UnsupportedModelError, match=r"FeatureGetterNet is timm's features_only wrapper of a "
                                                    r"VisionTransformer.*model\.model"):
        vitviz.explain(features, images((32, 32)), method="rollout")
    assert vitviz.inspect(features.model).depth == 1
    assert vitviz.explain(features.model, images((32, 32)), method="rollout").shape == (2, 2, 2)


def test_count_flops_counts_the_models_compute_not_the_recomputation():
    """``count_flops(backward=True)`` of a checkpointed model is the plain model's: the recomputation in the backward
    pass is the training set-up's memory-for-compute trade, not the model's compute. Also: without ``input_size``
    it counts at the size the model is built for."""
    model, plain, x = _checkpointed("timm")
    before = _flags(model)
    size = (3, *x.shape[-2:])
    step = vitviz.count_flops(plain, size, backward=True)
    assert vitviz.count_flops(model, size, backward=True) == step
    assert _flags(model) == before
    assert vitviz.count_flops(plain) == vitviz.count_flops(plain, size)
    assert vitviz.count_flops(plain, backward=True) == step
