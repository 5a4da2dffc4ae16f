"""``vitviz.faithfulness`` keeps the host ahead of the device: a batch's perturbed passes run back to back.

On a GPU, reading a tensor's value (``.item()``, ``bool(t)``, ``nonzero``, ``tolist``) waits until every kernel
queued so far has run, and the device then idles while the host prepares the next pass. A batch of a deletion
curve runs some 40 passes per method; one read between two of them costs a GPU the host's whole time of a pass.
``Perturbed.scores`` therefore reads every removed set on the host first (CPU masks), sends what the passes need
without waiting, queues the passes, and leaves the scores on the device for ``faithfulness`` to read once per batch.

These tests run on the CPU, where no op waits, and record every read of a value (``host_reads.ValueReads``; on a GPU
each would wait): between two passes of one method on one batch there is none, nor inside the passes (the families'
token drops). They failed on the former ``scores``, called once per set, which read each set's mask (``nonzero``)
before its pass and its scores (``cpu``, ``tolist``) after it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import tiny_timm_vit
from host_reads import ValueReads
from test_stream_heads import tiny_torchvision_vit

import vitviz
from vitviz.analysis import perturbation


def _recorded(model: torch.nn.Module, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> list:
    """The call's log: ``("read", where)``, ``("pass", "")`` per perturbed pass, and ``("method", name)`` where a
    method's maps are computed (after its batch's clean pass)."""
    from vitviz.analysis import faithfulness as fa

    events = ValueReads(monkeypatch)
    forward, explain, batch = perturbation.Perturbed._forward, fa.explain, fa._batch

    def logged_forward(self, x):
        events.log.append(("pass", ""))
        return forward(self, x)

    def logged_explain(model, images, method, *args, **kwargs):
        events.log.append(("method", method))
        return explain(model, images, method, *args, **kwargs)

    def logged_batch(*args, **kwargs):
        events.log.append(("batch", ""))
        return batch(*args, **kwargs)

    monkeypatch.setattr(perturbation.Perturbed, "_forward", logged_forward)
    monkeypatch.setattr(fa, "explain", logged_explain)
    monkeypatch.setattr(fa, "_batch", logged_batch)
    with events:
        vitviz.faithfulness(model, x, progress=False, **kwargs)
    return events.log


def _reads_among_passes(log: list) -> tuple[list[str], int]:
    """The reads between two passes of one method on one batch (inside the first of them too), and the number of
    passes."""
    reads, passes, since = [], 0, None  # since: the reads after the last pass, until the next event
    for kind, what in log:
        if kind == "pass":
            passes += 1
            reads += since or []
            since = []
        elif kind == "read":
            if since is not None:
                since.append(what)
        else:  # a new method or batch: what it reads is its own set-up
            since = None
    return reads, passes


def timm_beit() -> torch.nn.Module:  # a class-token readout: its patch tokens may be dropped
    import timm

    return timm.create_model("beit_base_patch16_224", pretrained=False, img_size=(32, 48), patch_size=8, depth=2,
                             embed_dim=32, num_heads=2, num_classes=5, global_pool="token")


def hugging_face(name: str) -> torch.nn.Module:
    T = pytest.importorskip("transformers")
    from hf_models import SMALL

    if name == "beit":  # relative position biases, gathered over the kept tokens; a class-token readout
        return T.BeitForImageClassification(T.BeitConfig(image_size=(32, 48), use_relative_position_bias=True,
                                                         use_mean_pooling=False, **SMALL))
    return T.ViTForImageClassification(T.ViTConfig(image_size=(32, 48), **SMALL))


MODELS = {  # each family's own token drop (timm's ViT and BEiT, torchvision, Hugging Face's ViT and BEiT)
    "timm": (tiny_timm_vit, (3, 3, 32, 48)),
    "timm-beit": (timm_beit, (3, 3, 32, 48)),
    "torchvision": (tiny_torchvision_vit, (3, 3, 32, 32)),
    "huggingface": (lambda: hugging_face("vit"), (3, 3, 32, 48)),
    "huggingface-beit": (lambda: hugging_face("beit"), (3, 3, 32, 48)),
}


@pytest.mark.parametrize("removal", ["drop", "mean"])
@pytest.mark.parametrize("family", list(MODELS))
def test_a_batchs_passes_run_without_reading_a_value_between_them(family, removal, monkeypatch):
    make, shape = MODELS[family]
    torch.manual_seed(0)
    model = make()
    log = _recorded(model, torch.randn(*shape), monkeypatch, methods=["rollout", "random"], removal=removal,
                    steps=0.25, batch_size=2)
    reads, passes = _reads_among_passes(log)
    assert passes >= 20, log  # 2 batches x 2 methods, deduplicated sets: the check has passes to look between
    assert reads == [], f"{len(reads)} reads among the passes (each waits for the device on a GPU): {reads[:5]}"
    assert any(kind == "read" for kind, _ in log)  # the recorder sees reads (the input's finiteness check)


def _set_up_reads(log: list) -> list[tuple[str, list[str]]]:
    """Per method and batch, the reads from its maps being asked for to its first perturbed pass: ``(method,
    reads)``."""
    out: list[tuple[str, list[str]]] = []
    current = None
    for kind, what in log:
        if kind == "method":
            current = []
            out.append((what, current))
        elif kind in ("pass", "batch"):
            current = None
        elif kind == "read" and current is not None:
            current.append(what)
    return out


def test_a_method_reads_the_device_once_before_its_passes(monkeypatch):
    """Between a method's call and its first perturbed pass, one read waits for the device: the ranks and the maps'
    finiteness copied to the host together (``perturbation.ranks_on_host``; the removed sets are made there). The
    batch is not checked again by the method (it was where it was loaded: ``contexts.input_checked``), a read that
    on a GPU waits for the last method's passes and leaves the device idle while the method sets itself up. Before,
    each method read three times there: the batch's finiteness, the maps' finiteness, the ranks. (The gradient
    methods' target check reads the classes too: not changed.)"""
    torch.manual_seed(0)
    log = _recorded(tiny_timm_vit(), torch.randn(4, 3, 32, 48), monkeypatch, methods=["rollout", "random", "chefer"],
                    steps=0.5, batch_size=2)
    checks = [what for kind, what in log if kind == "read" and "check_tensor" in what]
    assert len(checks) == 2, checks  # each batch once, where it is loaded
    set_ups = _set_up_reads(log)
    assert [m for m, _ in set_ups] == ["rollout", "random", "chefer"] * 2
    for method, reads in set_ups:
        device = [r for r in reads if "resolve_target" not in r]  # chefer's class check, outside this change
        assert device and "Tensor.cpu at analysis/perturbation.py" in device[0] and "ranks_on_host" in device[0], \
            (method, reads)  # the first read is the ranks' copy; every later one reads what it copied, or a CPU mask
        assert not any("check_tensor" in r for r in reads), (method, reads)
        assert sum(r.startswith("Tensor.cpu") for r in device) == 1, (method, reads)


def test_the_recorder_sees_a_read_between_two_passes(monkeypatch):
    """A ``scores`` that reads a score after each pass, as the former one did, is caught."""
    real = perturbation.score_output

    def reading(*args, **kwargs):
        out = real(*args, **kwargs)
        bool(next(iter(out.values())).sum() > -1)  # the value read right after its pass
        return out

    monkeypatch.setattr(perturbation, "score_output", reading)
    torch.manual_seed(0)
    log = _recorded(tiny_timm_vit(), torch.randn(2, 3, 32, 48), monkeypatch, methods=["random"], steps=0.5)
    reads, passes = _reads_among_passes(log)
    assert passes > 1 and len(reads) == passes - 1, reads  # one batch, one method: after every pass but the last


def test_scores_takes_cpu_masks_only():
    """The sets are read on the host: a mask on another device, of another dtype or shape is refused by name."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    spec = vitviz.inspect(model)
    pert = perturbation.Perturbed(model, spec, x, "mean", torch.zeros(3), None, torch.tensor([0, 1]))
    with pytest.raises(vitviz.InputError, match=r"\(2, 24\) bool mask on the CPU, got \(2, 24\) torch.int64"):
        pert.scores([torch.zeros(2, 24, dtype=torch.long)])
    with pytest.raises(vitviz.InputError, match=r"got \(2, 23\) torch.bool"):
        pert.scores([torch.zeros(2, 23, dtype=torch.bool)])
    first, again = pert.scores([torch.zeros(2, 24, dtype=torch.bool), torch.zeros(2, 24, dtype=torch.bool)])
    assert first is again  # one pass for identical sets
    assert set(first) == {"probability", "accuracy"} and first["probability"].shape == (2,)


def test_the_random_baseline_is_drawn_in_one_call_per_batch(monkeypatch):
    """One ``explain`` call per batch, not one per image (each call checks its input: a wait on a GPU), with the
    maps the per-image calls gave: each image's own, from its id."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = torch.randn(5, 3, 32, 48)
    log = _recorded(model, x, monkeypatch, methods=["random"], steps=0.5, batch_size=3, image_ids=list("abcde"))
    assert [what for kind, what in log if kind == "method"] == ["random", "random"]  # 2 batches
    from vitviz.analysis.perturbation import image_seed

    ids = list("abcde")
    one_call = vitviz.analysis.explain.random_baseline(model, x, offset=[image_seed(0, i) for i in ids], seed=3)
    each = torch.cat([vitviz.analysis.explain.random_baseline(model, x[k:k + 1], offset=image_seed(0, i), seed=3)
                      for k, i in enumerate(ids)])
    assert torch.equal(one_call, each)
    with pytest.raises(vitviz.InputError, match=r"offset holds 4 indices for at least 5 images"):
        vitviz.analysis.explain.random_baseline(model, x, offset=[1, 2, 3, 4])
    with pytest.raises(vitviz.InputError, match=r"offset holds 6 indices for 5 images"):
        vitviz.analysis.explain.random_baseline(model, x, offset=list(range(6)))
    with pytest.raises(vitviz.InputError, match=r"offset='ab' must be an int"):
        vitviz.analysis.explain.random_baseline(model, x, offset="ab")


def test_a_drop_set_that_removes_unequal_counts_is_refused_not_mixed_across_images():
    """Dropping keeps the same number of tokens per image: a set that removes 2, 1 and 3 patches of three images
    (6 = 3 x 2 kept indices short, so a reshape to (3, 22) would succeed) is refused by name, never scored with
    the kept patches of one image given to the next."""
    torch.manual_seed(0)
    model = tiny_timm_vit()
    x = torch.randn(3, 3, 32, 48)
    spec = vitviz.inspect(model)
    pert = perturbation.Perturbed(model, spec, x, "drop", torch.zeros(3), None, torch.tensor([0, 1, 2]))
    removed = torch.zeros(3, 24, dtype=torch.bool)
    removed[0, :2], removed[1, :1], removed[2, :3] = True, True, True
    with pytest.raises(vitviz.InputError, match=r"removes 2, 1, 3 patches of its images; 'drop' needs as many"):
        pert.scores([removed])
    equal = torch.zeros(3, 24, dtype=torch.bool)
    equal[0, :2], equal[1, 5:7], equal[2, 22:] = True, True, True
    (scores,) = pert.scores([equal])
    for i in range(3):  # each image as if alone
        alone = perturbation.Perturbed(model, spec, x[i:i + 1], "drop", torch.zeros(3), None, torch.tensor([i]))
        (one,) = alone.scores([equal[i:i + 1]])
        assert one["probability"].item() == pytest.approx(scores["probability"][i].item(), abs=1e-5)
