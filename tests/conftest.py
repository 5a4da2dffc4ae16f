"""Shared fixtures: small models of every family vitviz reads, built with random weights on the CPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("VITVIZ_TEST_THREADS"):  # e.g. 1 on a machine busy with a training run
    torch.set_num_threads(int(os.environ["VITVIZ_TEST_THREADS"]))


def pytest_collection_modifyitems(config, items):
    if "zoo" not in (config.option.markexpr or ""):  # the whole registry runs only when asked: -m zoo
        skip_zoo = pytest.mark.skip(reason="timm registry run: make test-zoo (pytest -m zoo)")
        for item in items:
            if "zoo" in item.keywords:
                item.add_marker(skip_zoo)
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def skip_or_fail(why: str | None) -> None:
    """For the browser tests: nothing when ``why`` is None; else fail under ``VITVIZ_REQUIRE_BROWSER`` (``make
    test-browser``), skip otherwise."""
    if why:
        if os.environ.get("VITVIZ_REQUIRE_BROWSER"):
            pytest.fail(why)
        pytest.skip(why)


def tiny_study_runs():
    """Study rows of two families, three seeds and three budgets each (as ``data/study/hybrid_vs_pure.csv``)."""
    import pandas as pd

    rows = []
    for seed in (0, 1, 2):
        rows += [{"family": "Hybrid", "model": "hybrid-S", "epochs": e, "seed": seed, "train_images": 100,
                  "train_pflops": 2.0 * e, "test_acc": 40 + e + seed} for e in (1, 2, 4)]
        rows += [{"family": "Transformer (ViT)", "model": "vit-S", "epochs": e, "seed": seed, "train_images": 100,
                  "train_pflops": 1.0 * e, "test_acc": 35 + e - seed} for e in (1, 2, 4)]
    return pd.DataFrame(rows)


def tiny_timm_vit(**kwargs):
    """A 2-block timm VisionTransformer (non-square 32x48 input, 8 px patches -> 4x6 grid by default)."""
    from timm.models.vision_transformer import VisionTransformer

    args = dict(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    args.update(kwargs)
    return VisionTransformer(**args).eval()


def with_gated_attention(model, seed: int = 3):
    """``model`` (a timm ``VisionTransformer``) with each block's attention replaced by timm's ``Attention`` with an
    output gate (``gated=True``; Qiu et al., NeurIPS 2025: ``proj(o * sigmoid(gate(x)))``), seeded; skips a timm whose
    ``Attention`` has none."""
    import timm

    torch.manual_seed(seed)
    try:
        for b in model.blocks:
            b.attn = timm.layers.Attention(model.embed_dim, num_heads=b.attn.num_heads, qkv_bias=True, gated=True)
    except TypeError as err:
        pytest.skip(f"this timm's Attention has no output gate: {err}")
    return model.eval()


EVA_CASES = {
    "eva02": dict(use_abs_pos_emb=True, use_rot_pos_emb=True, qkv_fused=False, swiglu_mlp=True, scale_mlp=True,
                  ref_feat_shape=(4, 6)),
    "rope-half-registers": dict(use_abs_pos_emb=False, use_rot_pos_emb=True, rope_rotate_half=True,
                                num_reg_tokens=2, ref_feat_shape=(4, 6)),
    "rope-mixed": dict(use_abs_pos_emb=False, use_rot_pos_emb=True, rope_type="mixed", num_reg_tokens=1),
    "rope-dinov3": dict(use_abs_pos_emb=False, use_rot_pos_emb=True, rope_type="dinov3", rope_rotate_half=True,
                        num_reg_tokens=4),
    "attention-rope": dict(use_rot_pos_emb=True, attn_type="rope", ref_feat_shape=(4, 6)),
    "grouped-key-heads": dict(use_rot_pos_emb=True, attn_type="rope", num_heads=4, num_kv_heads=2, qkv_fused=False,
                              ref_feat_shape=(4, 6)),  # timm >= 1.0.28
    "no-rope": dict(use_rot_pos_emb=False, use_abs_pos_emb=True),
}


def tiny_eva(**kwargs):
    """A 2-block timm ``Eva`` on a non-square 4x6 grid (32x48 px, 8 px patches); skips what this timm lacks."""
    from timm.models.eva import Eva

    args = dict(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    args.update(kwargs)
    torch.manual_seed(0)
    try:
        return Eva(**args).eval()
    except (TypeError, ValueError, KeyError) as err:
        pytest.skip(f"this timm's Eva does not build {kwargs}: {err}")


PARALLEL_CASES = {  # timm's parallel and differential attention (the stream probe's "parallel" and "differential")
    "parallel": dict(block_fn="ParallelScalingBlock"),
    "parallel-qk-norm-registers": dict(block_fn="ParallelScalingBlock", qk_norm=True, reg_tokens=2),
    "differential": dict(attn_layer="diff"),
    "differential-qk-norm-gap": dict(attn_layer="diff", qk_norm=True, class_token=False, reg_tokens=1,
                                     global_pool="avg"),
    "differential-parallel": dict(block_fn="DiffParallelScalingBlock"),
}


def tiny_parallel(case: str, **kwargs):
    """A 2-block timm VisionTransformer with ``ParallelScalingBlock``, ``DiffAttention`` or
    ``DiffParallelScalingBlock`` (``PARALLEL_CASES``) on a non-square 4x6 grid, seeded."""
    from timm.models import vision_transformer as vt

    args = dict(PARALLEL_CASES[case], **kwargs)
    if "block_fn" in args:
        args["block_fn"] = getattr(vt, args["block_fn"])
    torch.manual_seed(0)
    return tiny_timm_vit(**args)


RELATIVE_CASES = {  # timm's relative-position attention: BEiT ``Attention`` and ``RelPosAttention``
    "beit": ("beit", dict(use_rel_pos_bias=True, use_abs_pos_emb=False)),
    "beit-shared-bias": ("beit", dict(use_shared_rel_pos_bias=True, use_abs_pos_emb=True)),
    "beit-without-qkv-bias": ("beit", dict(use_rel_pos_bias=True, qkv_bias=False)),
    "relpos-mlp": ("relpos", dict(rel_pos_type="mlp", class_token=True, global_pool="token")),
    "relpos-table": ("relpos", dict(rel_pos_type="bias", class_token=False, global_pool="avg")),
    "relpos-shared": ("relpos", dict(rel_pos_type="mlp", shared_rel_pos=True, class_token=False, global_pool="avg")),
}


def tiny_relative(case: str):
    """A 2-block timm ``Beit`` or ``VisionTransformerRelPos`` (``RELATIVE_CASES``) on a non-square 4x6 grid, its
    zero-initialised bias tables and ``q_bias`` / ``v_bias`` given random values (``randomise_zero_biases``)."""
    from conformance import randomise_zero_biases
    from timm.models.beit import Beit
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    arch, kwargs = RELATIVE_CASES[case]
    torch.manual_seed(0)
    cls = Beit if arch == "beit" else VisionTransformerRelPos
    model = cls(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3, **kwargs).eval()
    randomise_zero_biases(model)
    return model


@pytest.fixture
def timm_vit():
    return tiny_timm_vit()


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """An ImageFolder tree of 10 colour classes: 30 train and 10 test 32x32 JPEGs per class."""
    root = tmp_path_factory.mktemp("tinydata")
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("test", 10)):
        for c in range(10):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            colour = np.array([25 * c, 255 - 25 * c, (70 * c) % 256])
            for i in range(n):
                img = np.clip(colour + rng.normal(0, 40, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(folder / f"{i:04d}.jpg")
    return root


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    """Execute ``notebooks/<name>`` headless with papermill; return the executed notebook and its outputs.

    The kernel inherits the environment: ``MPLBACKEND`` is removed so it picks Jupyter's inline backend.
    """
    papermill = pytest.importorskip("papermill")
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")

    def run(name: str, **parameters):
        out = tmp_path / f"executed_{name}"
        papermill.execute_notebook(os.path.join(root, name), str(out), parameters=parameters, kernel_name="python3",
                                   cwd=root, progress_bar=False)
        nb = nbformat.read(out, as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
        text = "".join(o.get("text", "") for o in outputs)
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        return nb, text, images

    return run
