"""load_model: timm names, local weight files (safetensors, pth, bin, JAX npz), model folders (Hugging Face,
timm, open_clip), Hub ids from the local cache, fail-fast offline, bad files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

import vitviz
from vitviz.zoo.reference import build_reference

TINY = "vit_tiny_patch16_224"


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_timm_name_random_weights_eval_mode_and_kwargs():
    model = vitviz.load_model(TINY, device="cpu", img_size=(96, 64))
    assert not model.training and next(model.parameters()).device.type == "cpu"
    assert vitviz.inspect(model).grid_size == (6, 4)


def test_unknown_name_suggests():
    with pytest.raises(vitviz.VitvizError, match="neither a timm model"):
        vitviz.load_model("vit_tinyy_patch16_224")
    # with nothing similar it said "Similar timm names: []", and named no way on
    with pytest.raises(vitviz.VitvizError, match=r"Similar timm names: none\. Pass one of those, a Hugging Face "
                                                 r"Hub id .*torchvision or open_clip ViT you build"):
        vitviz.load_model("no-such-model")


@pytest.mark.parametrize("fmt", ["safetensors", "pth", "bin-wrapped"])
def test_local_state_dict_files(tmp_path, fmt):
    src = timm.create_model(TINY)
    sd = src.state_dict()
    if fmt == "safetensors":
        path = tmp_path / "w.safetensors"
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    elif fmt == "pth":
        path = tmp_path / "w.pth"
        torch.save(sd, path)
    else:  # training-loop style: {"state_dict": {"module.<key>": ...}}
        path = tmp_path / "w.bin"
        torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}, "epoch": 3}, path)
    model = vitviz.load_model(TINY, checkpoint=path, device="cpu")
    assert same_weights(model, src)


def jax_npz(model: torch.nn.Module, path) -> None:
    """Write ``model`` in the original JAX ViT .npz layout (what the paper's checkpoints use)."""
    heads = model.blocks[0].attn.num_heads
    d = model.embed_dim
    t = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    w = {
        "embedding/kernel": t["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": t["patch_embed.proj.bias"],
        "cls": t["cls_token"],
        "Transformer/posembed_input/pos_embedding": t["pos_embed"],
        "Transformer/encoder_norm/scale": t["norm.weight"],
        "Transformer/encoder_norm/bias": t["norm.bias"],
        "head/kernel": t["head.weight"].T,
        "head/bias": t["head.bias"],
    }
    for i in range(len(model.blocks)):
        b, p = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = p + "MultiHeadDotProductAttention_1/"
        q, k, v = np.split(t[b + "attn.qkv.weight"], 3)
        qb, kb, vb = np.split(t[b + "attn.qkv.bias"], 3)
        for name, wt, bs in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            w[f"{mha}{name}/kernel"] = wt.T.reshape(d, heads, d // heads)
            w[f"{mha}{name}/bias"] = bs.reshape(heads, d // heads)
        w[f"{mha}out/kernel"] = t[b + "attn.proj.weight"].reshape(d, heads, d // heads).transpose(1, 2, 0)
        w[f"{mha}out/bias"] = t[b + "attn.proj.bias"]
        w[p + "LayerNorm_0/scale"], w[p + "LayerNorm_0/bias"] = t[b + "norm1.weight"], t[b + "norm1.bias"]
        w[p + "LayerNorm_2/scale"], w[p + "LayerNorm_2/bias"] = t[b + "norm2.weight"], t[b + "norm2.bias"]
        for r in range(2):
            w[f"{p}MlpBlock_3/Dense_{r}/kernel"] = t[f"{b}mlp.fc{r + 1}.weight"].T
            w[f"{p}MlpBlock_3/Dense_{r}/bias"] = t[f"{b}mlp.fc{r + 1}.bias"]
    np.savez(path, **w)


def test_original_jax_npz_through_timm_loader(tmp_path):
    src = timm.create_model(TINY, depth=2)
    jax_npz(src, tmp_path / "ViT-Ti_16.npz")
    model = vitviz.load_model(TINY, depth=2, checkpoint=tmp_path / "ViT-Ti_16.npz", device="cpu")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), src.eval()(x), atol=1e-5, rtol=1e-5)


def tiny_weight_files(tmp_path):
    """One depth-1 ``TINY`` model's weights as a JAX ``.npz`` and as a ``.safetensors`` file."""
    src = timm.create_model(TINY, depth=1)
    jax_npz(src, tmp_path / "w.npz")
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "w.safetensors"))
    return tmp_path / "w.npz", tmp_path / "w.safetensors"


def test_npz_position_embedding_resampled_to_img_size(tmp_path):
    """timm resamples a file's position table to ``img_size``; vitviz says so (the figures would show an
    interpolated table as if trained) and names the ``img_size`` that reads it as trained."""
    import warnings

    from vitviz.errors import ResampledPositionsWarning

    for path in tiny_weight_files(tmp_path):
        with pytest.warns(ResampledPositionsWarning, match=r"trained for a 14x14 grid \(197 rows\).*img_size=\(288, "
                          r"288\) has a 18x18 grid.*pass img_size=224 to read it as trained") as caught:
            model = vitviz.load_model(TINY, depth=1, img_size=288, checkpoint=path)
        assert caught[0].filename == __file__  # it names the caller's line, not vitviz's
        assert model.pos_embed.shape == (1, 1 + 18 * 18, 192)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResampledPositionsWarning)  # the grid it was trained for: no word
            vitviz.load_model(TINY, depth=1, checkpoint=path)


def test_a_patch_kernel_resized_to_another_patch_size_is_warned_about(tmp_path):
    """timm resizes a file's patch-embedding kernel to the model's patch_size (FlexiViT's resize) and the model
    runs: a patch-16 file loaded at patch_size=8 gave no word, its RGB filters shown as if trained. vitviz warns,
    naming both sizes and the patch_size that reads the kernel as trained, for a JAX .npz and a .safetensors file;
    at the trained size it says nothing."""
    import warnings

    from vitviz.errors import ResampledKernelWarning

    for path in tiny_weight_files(tmp_path):
        with pytest.warns(ResampledKernelWarning, match=r"trained for 16x16 patches, timm model .* has 8x8 patches.*"
                          r"pass patch_size=16 to read it as trained") as caught:
            model = vitviz.load_model(TINY, depth=1, patch_size=8, img_size=112, checkpoint=path)
        assert any(c.filename == __file__ for c in caught if c.category is ResampledKernelWarning)
        assert model.patch_embed.proj.weight.shape[-2:] == (8, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResampledKernelWarning)  # the size it was trained for: no word
            vitviz.load_model(TINY, depth=1, checkpoint=path)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".npz"])
def test_corrupt_checkpoint_is_refused(tmp_path, suffix):
    good = tmp_path / f"good{suffix}"
    src = timm.create_model(TINY, depth=1)
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(good))
    elif suffix == ".pth":
        torch.save(src.state_dict(), good)
    else:
        jax_npz(src, good)
    bad = tmp_path / f"bad{suffix}"
    blob = good.read_bytes()
    bad.write_bytes(blob[: len(blob) // 2])  # truncated download
    with pytest.raises(vitviz.CheckpointError, match=r"bad\.(safetensors|pth|npz).*corrupt"):
        vitviz.load_model(TINY, depth=1, checkpoint=bad)


def test_weights_for_another_model_are_refused(tmp_path):
    path = tmp_path / "small.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model("vit_small_patch16_224").state_dict().items()},
              str(path))
    with pytest.raises(vitviz.CheckpointError, match="do not fit timm model 'vit_tiny_patch16_224'"):
        vitviz.load_model(TINY, checkpoint=path)


def test_missing_checkpoint_file(tmp_path):
    with pytest.raises(vitviz.CheckpointError, match="not found"):
        vitviz.load_model(TINY, checkpoint=tmp_path / "nope.safetensors")


def test_pretrained_offline_fails_fast_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # empty cache
    monkeypatch.setenv("HF_ENDPOINT", "https://weights.vitviz-offline.invalid")  # unresolvable host
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.perf_counter()
    with pytest.raises(vitviz.WeightsUnavailableError) as err:
        vitviz.load_model(TINY, pretrained=True)
    assert time.perf_counter() - t0 < 10
    msg = str(err.value)
    assert "'vit_tiny_patch16_224'" in msg and "checkpoint=" in msg and "cannot be reached" in msg


def test_pretrained_with_hub_offline_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(vitviz.WeightsUnavailableError, match="HF_HUB_OFFLINE"):
        vitviz.load_model(TINY, pretrained=True)


def test_reference_model_missing_checkpoint_says_how_to_train(tmp_path, monkeypatch):
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path))
    with pytest.raises(vitviz.WeightsUnavailableError, match="python -m vitviz.experiments.train cifar10-vit"):
        vitviz.load_model("cifar10-vit")


def test_reference_checkpoint_roundtrip_by_name_and_by_file(tmp_path, monkeypatch):
    src = build_reference("cifar10-vit-2dpos")
    path = tmp_path / "cifar10-vit-2dpos.safetensors"
    save_file({k: v.half().contiguous() for k, v in src.state_dict().items()}, str(path),
              metadata={"vitviz.model": "cifar10-vit-2dpos"})
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path))
    by_name = vitviz.load_model("cifar10-vit-2dpos", device="cpu")
    by_file = vitviz.load_model(path, device="cpu")
    assert same_weights(by_name, by_file)
    torch.testing.assert_close(by_name.pos_embed, src.pos_embed.half().float())
    assert by_name.pretrained_cfg["input_size"] == (3, 32, 32) and len(by_name.pretrained_cfg["label_names"]) == 10


def test_a_reference_checkpoint_damaged_inside_its_data_is_refused_by_its_cards_hash(tmp_path, monkeypatch):
    """Bytes damaged inside the tensor data still parse: the shipped cifar10-vit with 1,000 bytes set to 0xFF loaded
    and answered with broken (NaN) weights. The card beside the file records its SHA-256, which the loader checks."""
    import shutil

    from vitviz.zoo.weights import checkpoint_dir

    for suffix in (".safetensors", ".json"):
        shutil.copy(checkpoint_dir() / f"cifar10-vit{suffix}", tmp_path)
    path = tmp_path / "cifar10-vit.safetensors"
    blob = bytearray(path.read_bytes())
    blob[-5000:-4000] = b"\xff" * 1000
    path.write_bytes(bytes(blob))
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path))
    for load in (lambda: vitviz.load_model("cifar10-vit"), lambda: vitviz.load_model(path),
                 lambda: vitviz.load_model("cifar10-vit", checkpoint=path)):
        with pytest.raises(vitviz.CheckpointError, match=r"cifar10-vit\.safetensors' has SHA-256 .* its card .*records"):
            load()


def test_a_reference_checkpoint_that_does_not_fit_names_the_fix(tmp_path):
    """Was torch's size-mismatch list alone: the architecture arguments its card names, the arguments that changed
    the architecture, or the model the file holds, are named with what to pass instead."""
    import shutil

    from vitviz.zoo.weights import checkpoint_dir

    with pytest.raises(vitviz.CheckpointError, match=r"does not fit reference model 'cifar10-vit'; its card says it "
                                                     r"was built with no architecture arguments: "
                                                     r"vitviz.load_model\('cifar10-vit'\)"):
        vitviz.load_model("cifar10-vit", num_classes=100)
    vit = checkpoint_dir() / "cifar10-vit.safetensors"
    with pytest.raises(vitviz.CheckpointError, match=r"it holds 'cifar10-vit' \(its metadata\): "
                                                     r"vitviz.load_model\('cifar10-vit', checkpoint="):
        vitviz.load_model("cifar10-vit-nopos", checkpoint=vit)
    alone = tmp_path / "alone" / "cifar10-vit.safetensors"  # no card beside it
    alone.parent.mkdir()
    shutil.copy(vit, alone)
    with pytest.raises(vitviz.CheckpointError, match=r"the arguments num_classes=100 do not build the architecture"):
        vitviz.load_model(alone, num_classes=100)
    small = build_reference("cifar10-vit", depth=1)
    path = tmp_path / "cifar10-vit.safetensors"
    save_file(small.state_dict(), str(path), metadata={"vitviz.model": "cifar10-vit"})
    card = json.loads((checkpoint_dir() / "cifar10-vit.json").read_text())
    card["recipe"]["model_kwargs"] = {"depth": 1}
    del card["sha256"]
    (tmp_path / "cifar10-vit.json").write_text(json.dumps(card))
    with pytest.raises(vitviz.CheckpointError, match=r"its card says it was built with depth=1: "
                                                     r"vitviz.load_model\('cifar10-vit', depth=1\)"):
        vitviz.load_model(path)
    assert len(vitviz.load_model(path, depth=1).blocks) == 1


def test_safetensors_without_architecture_asks_for_a_name(tmp_path):
    path = tmp_path / "anon.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(vitviz.CheckpointError, match="does not say which architecture"):
        vitviz.load_model(path)


@pytest.mark.gpu
def test_auto_device_is_cuda_when_available():
    assert next(vitviz.load_model(TINY).parameters()).device.type == "cuda"


# ------------------------------------------------------------------------------ model folders and Hub ids

def _hf_vit():
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=5)
    return transformers.ViTForImageClassification(config).eval()


def _timm_folder(path):
    from timm.models._hub import save_for_hf

    model = timm.create_model(TINY, num_classes=7, img_size=32)
    save_for_hf(model, str(path), model_args={"img_size": 32})
    return model


def test_a_hugging_face_save_pretrained_folder_loads_as_its_class(tmp_path):
    model = _hf_vit()
    model.save_pretrained(tmp_path / "hf")
    loaded = vitviz.load_model(tmp_path / "hf", device="cpu")
    assert type(loaded) is type(model) and not loaded.training and same_weights(loaded, model)
    assert vitviz.inspect(loaded).grid_size == (4, 4)
    with pytest.raises(vitviz.CheckpointError, match=r"does not say which architecture.*or pass its folder"):
        vitviz.load_model(tmp_path / "hf" / "model.safetensors")  # the file alone: its folder names the model


def test_a_timm_hub_folder_loads_through_timm(tmp_path):
    model = _timm_folder(tmp_path / "timm")
    loaded = vitviz.load_model(tmp_path / "timm", device="cpu")
    assert isinstance(loaded, timm.models.VisionTransformer) and same_weights(loaded, model)
    assert loaded.num_classes == 7 and vitviz.inspect(loaded).img_size == (32, 32)


def _open_clip_folder(path):
    """An open_clip folder as ``open_clip.push_to_hf_hub`` writes it: ``open_clip_config.json`` (the model and
    preprocessing config) beside ``open_clip_model.safetensors``."""
    import json

    pytest.importorskip("open_clip")
    from hf_models import OPEN_CLIP_CFG, open_clip_model

    model = open_clip_model()
    path.mkdir(parents=True)
    save_file(model.state_dict(), str(path / "open_clip_model.safetensors"))
    preprocess = {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}
    (path / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_CFG, "preprocess_cfg": preprocess}))
    return model


def test_an_open_clip_folder_loads_with_its_weights_and_preprocessing(tmp_path):
    """An open_clip folder is built by open_clip's own ``local-dir:`` loader: the same weights, and the
    preprocessing its config names is the one vitviz applies to raw images."""
    from vitviz.core.images import data_config

    model = _open_clip_folder(tmp_path / "clip")
    loaded = vitviz.load_model(tmp_path / "clip", device="cpu")
    assert type(loaded) is type(model) and not loaded.training and same_weights(loaded, model)
    cfg = data_config(loaded)
    assert (cfg["mean"], cfg["std"]) == ((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    assert vitviz.inspect(loaded).grid_size == (4, 6)


def test_an_open_clip_folder_without_weights_is_refused_not_random(tmp_path):
    """open_clip alone logs a warning and returns random weights for a folder without them; vitviz refuses it."""
    _open_clip_folder(tmp_path / "clip")
    (tmp_path / "clip" / "open_clip_model.safetensors").unlink()
    with pytest.raises(vitviz.CheckpointError, match=r"open_clip cannot build the model in .*clip.*weights"):
        vitviz.load_model(tmp_path / "clip")


def test_an_open_clip_hub_id_loads_from_the_local_cache(tmp_path, monkeypatch):
    """A Hub repository that holds only an open_clip folder (no config.json) is found in the local cache too."""
    import huggingface_hub

    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny-clip"
    model = _open_clip_folder(repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert same_weights(vitviz.load_model("someone/tiny-clip", device="cpu"), model)


def test_a_folder_that_names_no_model_is_refused(tmp_path):
    with pytest.raises(vitviz.CheckpointError, match="without a config.json.*or an open_clip folder"):
        vitviz.load_model(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": 32}')
    with pytest.raises(vitviz.CheckpointError, match="names neither a timm architecture"):
        vitviz.load_model(tmp_path)


def test_a_hub_id_loads_from_the_local_cache_and_fails_fast_offline(tmp_path, monkeypatch):
    """A Hub id is read from the local cache (the layout huggingface_hub writes: refs/main names the snapshot);
    when it is not there and the Hub cannot be reached, the error names the folder fix within seconds."""
    import huggingface_hub

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny-vit" / "snapshots" / "0123abc"
    model = _timm_folder(snapshot)
    (cache / "models--someone--tiny-vit" / "refs").mkdir()
    (cache / "models--someone--tiny-vit" / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", "https://weights.vitviz-offline.invalid")  # never asked: the cache answers
    for name in ("someone/tiny-vit", "hf-hub:someone/tiny-vit"):
        assert same_weights(vitviz.load_model(name, device="cpu"), model)
        assert vitviz.load_model_or_random(name, verbose=False).vitviz_random_weights is False
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.perf_counter()
    with pytest.raises(vitviz.WeightsUnavailableError, match=r"'someone/absent'.*cannot be reached.*path/to/folder"):
        vitviz.load_model("someone/absent")
    assert time.perf_counter() - t0 < 10
    with pytest.raises(vitviz.WeightsUnavailableError):  # no architecture to build random weights from
        vitviz.load_model_or_random("someone/absent", verbose=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(vitviz.WeightsUnavailableError, match="HF_HUB_OFFLINE"):
        vitviz.load_model("someone/absent")
    with pytest.raises(vitviz.CheckpointError, match="not found"):  # a path that looks like an id stays a path
        vitviz.load_model("weights/absent.safetensors")


def test_a_checkpoint_head_is_loaded_or_refused_never_dropped(tmp_path):
    """timm's loader drops a file's classifier (and loads the rest non-strictly) when ``num_classes`` differs
    from its pretrained config's 1000: a 10-class checkpoint loaded with num_classes=10 kept a random head, and a
    file missing a whole block loaded. The file's head is loaded, or the file refused with the num_classes fix."""
    src = timm.create_model(TINY, depth=2, num_classes=10)
    path = tmp_path / "h10.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    assert same_weights(vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=path, device="cpu"), src)
    with pytest.raises(vitviz.CheckpointError, match=r"(?s)h10\.safetensors.*has 10 classes.*pass num_classes=10"):
        vitviz.load_model(TINY, depth=2, checkpoint=path)
    partial = tmp_path / "partial.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items() if not k.startswith("blocks.1.")},
              str(partial))
    with pytest.raises(vitviz.CheckpointError, match=r"(?s)partial\.safetensors.*Missing key.*blocks\.1\."):
        vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=partial)
    torch.save(timm.create_model(TINY, depth=2).state_dict(), tmp_path / "h1000.pth")
    with pytest.raises(vitviz.CheckpointError, match=r"(?s)h1000\.pth.*has 1000 classes.*pass num_classes=1000"):
        vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=tmp_path / "h1000.pth")
    with pytest.raises(vitviz.CheckpointError, match=r"(?s)h1000\.pth.*has 1000 classes.*pass num_classes=1000, "
                                                     r"then model\.reset_classifier\(0\)"):
        vitviz.load_model(TINY, depth=2, num_classes=0, checkpoint=tmp_path / "h1000.pth")


def test_a_jax_npz_timm_reads_only_in_part_is_refused(tmp_path):
    """timm's ``.npz`` reader skips a classifier of another class count, blocks beyond the model's depth and the
    original 21k checkpoints' pre_logits layer, and raises a bare KeyError for a missing tensor; vitviz refuses
    each with the fix."""
    src = timm.create_model(TINY, depth=2, num_classes=10)
    jax_npz(src, tmp_path / "w.npz")
    model = vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=tmp_path / "w.npz", device="cpu")
    assert same_weights(model, src)
    with pytest.raises(vitviz.CheckpointError, match=r"w\.npz.*classifier has 10 classes.*pass num_classes=10"):
        vitviz.load_model(TINY, depth=2, checkpoint=tmp_path / "w.npz")
    with pytest.raises(vitviz.CheckpointError, match=r"w\.npz.*has 2 blocks.*pass depth=2"):
        vitviz.load_model(TINY, depth=1, num_classes=10, checkpoint=tmp_path / "w.npz")
    w = dict(np.load(tmp_path / "w.npz"))
    np.savez(tmp_path / "pre.npz", **w, **{"pre_logits/kernel": np.zeros((192, 192)), "pre_logits/bias": np.zeros(192)})
    with pytest.raises(vitviz.CheckpointError, match=r"pre\.npz.*pre_logits.*num_classes=0"):
        vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=tmp_path / "pre.npz")
    del w["Transformer/encoderblock_1/LayerNorm_0/scale"]
    np.savez(tmp_path / "missing.npz", **w)
    with pytest.raises(vitviz.CheckpointError, match=r"missing\.npz.*encoderblock_1/LayerNorm_0/scale"):
        vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=tmp_path / "missing.npz")


def test_an_unknown_pretrained_tag_lists_the_tags(tmp_path):
    """A tag timm does not have was a bare RuntimeError, or, with a checkpoint, 'the weights do not fit'."""
    torch.save(timm.create_model(TINY, depth=1).state_dict(), tmp_path / "w.pth")
    for kwargs in ({}, {"pretrained": True}, {"checkpoint": tmp_path / "w.pth", "depth": 1}):
        with pytest.raises(vitviz.InputError, match=r"'vit_tiny_patch16_224\.bogus'.*tags: .*augreg_in21k"):
            vitviz.load_model(f"{TINY}.bogus", **kwargs)


def test_a_checkpoint_beside_a_model_folder_or_file_is_refused_not_ignored(tmp_path):
    """``name_or_path`` that holds weights of its own (a folder, a weights file, a Hub id) took no checkpoint:
    the file passed as ``checkpoint=`` was silently ignored."""
    _timm_folder(tmp_path / "timm")
    torch.save(timm.create_model(TINY, depth=1).state_dict(), tmp_path / "w.pth")
    for target in (tmp_path / "timm", tmp_path / "w.pth", "someone/tiny-vit"):
        with pytest.raises(vitviz.InputError, match=r"checkpoint=.*w\.pth.*name_or_path=.*holds weights of its own"):
            vitviz.load_model(target, checkpoint=tmp_path / "w.pth")


def test_a_hugging_face_folder_missing_weights_is_refused_not_random(tmp_path):
    """transformers logs the tensors a folder lacks and initialises them at random; vitviz refuses the folder."""
    from safetensors.torch import load_file

    _hf_vit().save_pretrained(tmp_path / "hf")
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    del sd["vit.encoder.layer.1.attention.attention.key.bias"]
    save_file(sd, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(vitviz.CheckpointError, match=r"'.*hf' lack 1 tensors of ViTForImageClassification"):
        vitviz.load_model(tmp_path / "hf")


def test_a_model_folder_with_a_cut_off_safetensors_file_names_the_file(tmp_path):
    """A cut-off download in a model folder: each library raised its own SafetensorError (no CheckpointError, no
    file named); vitviz reads the folder's .safetensors headers first, as it does a checkpoint= file's."""
    _hf_vit().save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(vitviz.CheckpointError, match=r"cannot read checkpoint '.*hf/model.safetensors'.*truncated"):
        vitviz.load_model(tmp_path / "hf")


def test_a_timm_folder_with_another_num_classes_is_refused_not_given_a_random_head(tmp_path):
    """timm's ``local-dir:`` loader drops the folder's classifier, and loads the rest non-strictly, when
    ``num_classes`` differs from its config's; vitviz loads the folder strictly."""
    model = _timm_folder(tmp_path / "timm")
    assert same_weights(vitviz.load_model(tmp_path / "timm", num_classes=7, device="cpu"), model)
    with pytest.raises(vitviz.CheckpointError, match=r"(?s)'.*timm'.*size mismatch for head\.weight"):
        vitviz.load_model(tmp_path / "timm", num_classes=10)


def test_cached_pretrained_weights_keep_timms_new_head_rule(tmp_path, monkeypatch):
    """``pretrained=True`` from the Hub cache loads timm's file as timm does online: whole, resampled to
    ``img_size`` as timm resamples it, and with a new classifier for another ``num_classes``."""
    import huggingface_hub

    cache = tmp_path / "hub"
    repo = cache / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    src = timm.create_model(TINY, depth=1)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(repo / "snapshots" / "abc" / "model.safetensors"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert same_weights(vitviz.load_model(TINY, pretrained=True, depth=1, device="cpu"), src)
    with pytest.warns(vitviz.errors.ResampledPositionsWarning, match="14x14 grid"):  # the cached file, resampled
        model = vitviz.load_model(TINY, pretrained=True, depth=1, img_size=288, device="cpu")
    own = timm.create_model(TINY, pretrained=True, depth=1, img_size=288)
    assert same_weights(model, own)
    model = vitviz.load_model(TINY, pretrained=True, depth=1, num_classes=10, device="cpu")
    assert model.head.out_features == 10 and torch.equal(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)


def test_a_reference_model_with_a_missing_checkpoint_file_is_not_found_not_random(tmp_path, monkeypatch):
    """An explicit checkpoint that is absent was 'train and export it' (WeightsUnavailableError), so
    load_model_or_random fell back to random weights, and then failed passing checkpoint= to the builder."""
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path))
    for load in (vitviz.load_model, vitviz.load_model_or_random):
        with pytest.raises(vitviz.CheckpointError, match=r"'.*typo\.safetensors' not found"):
            load("cifar10-vit", checkpoint=tmp_path / "typo.safetensors")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_an_input_error():
    with pytest.raises(vitviz.InputError, match=r"device='cuda:1' is not available on this machine.*'cpu'"):
        vitviz.load_model(TINY, depth=1, device="cuda:1")


def test_a_big_vision_npz_with_stacked_blocks_loads_or_is_refused_by_depth(tmp_path):
    """big_vision stacks the blocks' tensors on a leading axis; a model deeper than the file was timm's bare
    IndexError, a shallower one loaded the first blocks only."""
    src = timm.create_model(TINY, depth=2, num_classes=10)
    jax_npz(src, tmp_path / "w.npz")
    rename = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0", "MlpBlock_3": "MlpBlock_0",
              "LayerNorm_2": "LayerNorm_1"}
    flat, blocks = {}, {}
    for key, value in np.load(tmp_path / "w.npz").items():
        if key.startswith("Transformer/encoderblock_"):
            i, sub = key.removeprefix("Transformer/encoderblock_").split("/", 1)
            for old, new in rename.items():
                sub = sub.replace(old, new)
            blocks.setdefault(sub, {})[int(i)] = value
        else:
            flat[key.replace("Transformer/posembed_input/pos_embedding", "pos_embedding")] = value
    stacked = {f"Transformer/encoderblock/{sub}": np.stack([v[i] for i in sorted(v)]) for sub, v in blocks.items()}
    # under "params/", as big_vision writes them (every timm since 1.0 reads the stacked layout there)
    np.savez(tmp_path / "bv.npz", **{f"params/{k}": v for k, v in {**flat, **stacked}.items()})
    assert same_weights(vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=tmp_path / "bv.npz"), src)
    for depth in (1, 3):
        with pytest.raises(vitviz.CheckpointError, match=r"bv\.npz"):
            vitviz.load_model(TINY, depth=depth, num_classes=10, checkpoint=tmp_path / "bv.npz")


def test_a_hugging_face_folder_without_a_pooler_names_add_pooling_layer(tmp_path):
    """A ViTModel saved without its pooler (as DINO's are) would get a random one, whose pooler_output vitviz
    reads as the features; the refusal names the fix, and with it the weights load whole."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)
    model = transformers.ViTModel(config, add_pooling_layer=False)
    model.save_pretrained(tmp_path / "dino")
    with pytest.raises(vitviz.CheckpointError, match=r"lack 2 tensors of ViTModel \(pooler.*add_pooling_layer=False"):
        vitviz.load_model(tmp_path / "dino")
    loaded = vitviz.load_model(tmp_path / "dino", add_pooling_layer=False, device="cpu")
    assert loaded.pooler is None and same_weights(loaded, model)


def test_the_command_line_inspect_prints_what_inspect_returns(tmp_path, capsys):
    """``vitviz inspect`` for a Hugging Face ``save_pretrained`` folder and a reference model's weights file; a
    name it cannot load is one line on stderr and exit status 2."""
    from transformers import ViTConfig, ViTModel

    from vitviz.__main__ import main
    from vitviz.zoo.weights import checkpoint_dir

    ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=(32, 48), patch_size=8)).save_pretrained(tmp_path / "hf")
    for target in (str(tmp_path / "hf"), str(checkpoint_dir() / "cifar10-hybrid.safetensors")):
        assert main(["inspect", target]) == 0
        expected = str(vitviz.inspect(vitviz.load_model(target, device="cpu")))
        assert capsys.readouterr().out == expected + "\n"
    assert "4x6 grid" in str(vitviz.inspect(vitviz.load_model(tmp_path / "hf")))
    capsys.readouterr()  # transformers' loading bars
    assert main(["inspect", str(tmp_path / "missing.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vitviz: error: checkpoint file") and "not found" in err


def test_a_reference_checkpoint_built_with_other_shape_free_arguments_is_refused_not_loaded(tmp_path):
    """``num_heads=4`` (96 = 4 x 24) gives every tensor the shape ``num_heads=3`` gives it, so the strict load passed
    and a 4-head checkpoint answered as a 3-head model without a word, though its card records ``num_heads=4``. The
    card's architecture arguments are what the file is loaded with, or the load is refused naming them; a tuple
    argument given as the card's JSON list reads back is the same argument."""
    src = build_reference("cifar10-vit", num_heads=4).eval()
    plain = build_reference("cifar10-vit").state_dict()
    assert {k: v.shape for k, v in src.state_dict().items()} == {k: v.shape for k, v in plain.items()}
    path = tmp_path / "cifar10-vit.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path),
              metadata={"vitviz.model": "cifar10-vit"})
    card = {"format": "vitviz-reference-card-v1", "name": "cifar10-vit", "recipe": {"model_kwargs": {"num_heads": 4}}}
    (tmp_path / "cifar10-vit.json").write_text(json.dumps(card))
    for load in (lambda: vitviz.load_model(path, device="cpu"),
                 lambda: vitviz.load_model("cifar10-vit", checkpoint=path, device="cpu"),
                 lambda: vitviz.load_model(path, num_heads=6, device="cpu")):
        with pytest.raises(vitviz.CheckpointError, match=r"its card says it was built with num_heads=4: "
                                                         r"vitviz.load_model\('cifar10-vit', num_heads=4\)"):
            load()
    loaded = vitviz.load_model(path, num_heads=4, device="cpu")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), src(x), rtol=0, atol=0)
    # an argument the card's model already has (the default num_classes=10, the card's num_heads given again)
    # builds the same model: loaded
    same = vitviz.load_model(path, num_heads=4, num_classes=10, device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(same(x), src(x), rtol=0, atol=0)

    hybrid = build_reference("cifar10-hybrid", stem_widths=(8, 16, 32))
    hpath = tmp_path / "cifar10-hybrid.safetensors"
    save_file({k: v.contiguous() for k, v in hybrid.state_dict().items()}, str(hpath),
              metadata={"vitviz.model": "cifar10-hybrid"})
    card = {"format": "vitviz-reference-card-v1", "name": "cifar10-hybrid",
            "recipe": {"model_kwargs": {"stem_widths": (8, 16, 32)}}}
    (tmp_path / "cifar10-hybrid.json").write_text(json.dumps(card))  # the tuple reads back as a list
    assert same_weights(vitviz.load_model(hpath, stem_widths=(8, 16, 32), device="cpu"), hybrid)
    # dropout changes training only: the weights load with it, to be fine-tuned, and compute the same in eval mode
    tuned = vitviz.load_model(hpath, stem_widths=(8, 16, 32), drop_path_rate=0.1, drop_rate=0.1, device="cpu")
    assert same_weights(tuned, hybrid)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(tuned.eval()(x), hybrid.eval()(x), rtol=0, atol=0)


def test_a_state_dict_whose_classifier_sits_on_a_pre_logits_layer_is_refused_not_loaded_without_it(tmp_path):
    """timm's ViT filter drops a file's ``pre_logits.*`` tensors (the original ImageNet-21k checkpoints' layer),
    and the strict load then passes: the classifier was fed the features without the layer it was trained on, so
    the logits were wrong without a word (the ``.npz`` of the same checkpoint is refused). Refused the same way;
    the features alone (num_classes=0) load."""
    src = timm.create_model(TINY, depth=2, num_classes=10)
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    sd["pre_logits.fc.weight"], sd["pre_logits.fc.bias"] = torch.randn(192, 192), torch.randn(192)
    assert not any(k.startswith("pre_logits.") for k in src.state_dict())  # the model has no such layer
    for name in ("pl.pth", "pl.safetensors"):
        path = tmp_path / name
        torch.save(sd, path) if name.endswith(".pth") else save_file(sd, str(path))
        with pytest.raises(vitviz.CheckpointError, match=rf"(?s){name}.*pre_logits layer.*pass num_classes=0"):
            vitviz.load_model(TINY, depth=2, num_classes=10, checkpoint=path, device="cpu")
    features = {k: v for k, v in sd.items() if not k.startswith("head.")}
    save_file(features, str(tmp_path / "features.safetensors"))
    model = vitviz.load_model(TINY, depth=2, num_classes=0, checkpoint=tmp_path / "features.safetensors",
                              device="cpu")
    assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())


def test_load_model_refuses_a_pretrained_that_is_no_bool():
    """``pretrained="False"`` (a notebook's ``pretrained`` parameter passed by ``papermill -r``, or read from a
    config) is a truthy string: timm was asked for the pretrained weights, and ``load_model_or_random`` fell back to
    random weights with a note about the network, not about the argument."""
    from vitviz.errors import InputError

    for loader in (vitviz.load_model, vitviz.load_model_or_random):
        with pytest.raises(InputError, match=r"pretrained='False' is not a bool; pass True or False"):
            loader("vit_tiny_patch16_224", pretrained="False", img_size=32, patch_size=8, depth=1)


IJEPA = "vit_huge_patch14_gap_224.in1k_ijepa"  # timm's weights at a plain URL (no hf_hub_id), read by torch hub
SMALL_IJEPA = dict(depth=1, embed_dim=32, num_heads=2, img_size=28)


def test_pretrained_weights_of_a_plain_url_are_read_from_torch_hubs_cache(tmp_path, monkeypatch):
    """timm fetches a pretrained config with a ``url`` and no ``hf_hub_id`` through torch hub, which caches it as
    ``<torch hub dir>/checkpoints/<file name>``; offline only the Hugging Face cache was looked up, and such weights
    were refused though they were on the disk."""
    import timm
    import torch
    from timm.models import get_pretrained_cfg

    import vitviz.zoo.models as models

    cfg = get_pretrained_cfg(IJEPA).to_dict()
    assert cfg["url"] and not cfg.get("hf_hub_id")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hugging Face cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "host_reachable", lambda *a, **k: pytest.fail("the network was asked"))
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(cfg["url"]).name
    with pytest.raises(vitviz.WeightsUnavailableError, match=rf"(?s)not in the local cache.*{cached.name}"):
        vitviz.load_model(IJEPA, pretrained=True, **SMALL_IJEPA)  # absent: refused, naming where it looked
    saved = timm.create_model(IJEPA, pretrained=False, **SMALL_IJEPA)
    cached.parent.mkdir(parents=True)
    torch.save(saved.state_dict(), cached)
    model = vitviz.load_model(IJEPA, pretrained=True, device="cpu", **SMALL_IJEPA)
    assert same_weights(model, saved)
    assert vitviz.load_model_or_random(IJEPA, pretrained=True, verbose=False,
                                       **SMALL_IJEPA).vitviz_random_weights is False
