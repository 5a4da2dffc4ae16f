"""The gradient methods read no value inside their forward and backward passes: on a GPU the host stays ahead.

``tests/test_cuda_host_path.py`` pins the host's side of rollout and distance on fake CUDA tensors; the gradient
methods cannot run there (autograd's engine asks the CUDA driver for a device to run a CUDA backward on). These
tests run them on the CPU instead and record every read of a value (``host_reads.ValueReads``: the reads a GPU
would wait for): ``grad_rollout``, ``chefer`` and ``attnlrp`` read the input's finiteness once per batch (the
checks every input path gets) and nothing else, in every family, with one batch or several; Grad-CAM reads the
explained classes once per batch (pytorch-grad-cam takes them as Python ints, and returns NumPy maps).
"""

from __future__ import annotations

import pytest
import torch
from conftest import EVA_CASES, tiny_eva, tiny_parallel, tiny_timm_vit
from host_reads import ValueReads
from test_stream_heads import tiny_torchvision_vit

import vitviz

CHECK = "core/images.py"  # the finiteness check of each batch (vitviz.core.images.check_tensor)


def hugging_face(name: str) -> torch.nn.Module:
    pytest.importorskip("transformers")
    from hf_models import hf_case

    return hf_case(name).model


def open_clip() -> torch.nn.Module:
    pytest.importorskip("open_clip")
    from hf_models import open_clip_tower

    return open_clip_tower()


FAMILIES = {
    "timm": (tiny_timm_vit, (4, 3, 32, 48)),
    "timm-eva02": (lambda: tiny_eva(**EVA_CASES["eva02"]), (4, 3, 32, 48)),
    "timm-parallel": (lambda: tiny_parallel("parallel"), (4, 3, 32, 48)),
    "torchvision": (tiny_torchvision_vit, (4, 3, 32, 32)),
    "huggingface": (lambda: hugging_face("vit"), (4, 3, 32, 48)),
    "huggingface-beit": (lambda: hugging_face("beit-relative"), (4, 3, 32, 48)),
    "huggingface-clip": (lambda: hugging_face("clip-vision"), (4, 3, 32, 32)),
    "open_clip": (open_clip, (4, 3, 32, 48)),
}


def _target(family: str, model: torch.nn.Module, x: torch.Tensor):
    """The predicted class where the model has a head, else a score per image from its features: the sum of the
    pooled features (Hugging Face towers), the norm of the image embedding (open_clip)."""
    if family == "open_clip":
        return lambda o: o.norm(dim=-1)
    with torch.no_grad():
        out = model(x[:1])
    if isinstance(out, torch.Tensor) or getattr(out, "logits", None) is not None:
        return None
    return lambda o: o.pooler_output.sum(-1)


@pytest.mark.parametrize("batch_size", [None, 2], ids=["one-batch", "two-batches"])
@pytest.mark.parametrize("method", ["grad_rollout", "chefer", "attnlrp"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_gradient_method_reads_only_its_inputs_check(family, method, batch_size, monkeypatch):
    make, shape = FAMILIES[family]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    target = _target(family, model, x)
    vitviz.explain(model, x, method, target, batch_size=batch_size)  # first call: what is read once per model
    with ValueReads(monkeypatch) as reads:
        maps = vitviz.explain(model, x, method, target, batch_size=batch_size)
    assert maps.shape[0] == shape[0]
    batches = 1 if batch_size is None else -(-shape[0] // batch_size)
    others = [r for r in reads.reads() if CHECK not in r]
    assert others == [], f"{method} on {family} reads values beside its input check: {others[:5]}"
    assert len(reads.reads()) == batches, reads.reads()


def test_the_recorder_sees_a_read_inside_the_backward_pass(monkeypatch):
    """A backward hook that reads a gradient's value (as a per-layer check would) is recorded, frames and all."""
    torch.manual_seed(0)
    model = tiny_timm_vit().eval()
    x = torch.randn(2, 3, 32, 48)
    vitviz.explain(model, x, "chefer")
    seen = []

    def check(module, grad_in, grad_out) -> None:  # the last block: its input's gradient reaches the earlier maps
        seen.append(float(grad_out[0].abs().max()))

    handle = model.blocks[-1].register_full_backward_hook(check)
    try:
        with ValueReads(monkeypatch) as reads:
            vitviz.explain(model, x, "chefer")
    finally:
        handle.remove()
    assert len(seen) == 1 and len([r for r in reads.reads() if CHECK not in r]) == 1, reads.reads()


def test_grad_cam_reads_the_classes_once_per_batch(monkeypatch):
    pytest.importorskip("pytorch_grad_cam")
    torch.manual_seed(0)
    model = tiny_timm_vit().eval()
    x = torch.randn(4, 3, 32, 48)
    vitviz.explain(model, x, "gradcam", batch_size=2)
    with ValueReads(monkeypatch) as reads:
        vitviz.explain(model, x, "gradcam", batch_size=2)
    ours = [r for r in reads.reads() if "analysis/baselines.py" in r.split(" < ")[0]]
    assert len([r for r in ours if r.startswith("Tensor.tolist")]) == 2, ours  # the classes, once per batch
    assert not [r for r in ours if "_local_scalar_dense" in r], ours  # not one int() per image
