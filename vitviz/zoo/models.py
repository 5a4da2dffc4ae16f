"""``vitviz.load_model``: a ViT by timm name, local weights file, model folder, Hugging Face Hub id, or vitviz
reference-model name.

Weights never come silently from the network: ``pretrained=True`` (and a Hub id not in the local cache) first
checks that the weight host answers (3 s), and fails at once with an error naming the model and the local-file fix
when it does not.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from vitviz.errors import CheckpointError, InputError, MissingDependencyError, WeightsUnavailableError
from vitviz.zoo.reference import REFERENCE_MODELS, build_reference
from vitviz.zoo.weights import (
    check_card_hash,
    check_npz,
    checkpoint_dir,
    read_state_dict,
    safetensors_metadata,
)

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
NETWORK_TIMEOUT_S = 3.0
HUB_ID = re.compile(r"^(hf-hub:)?([A-Za-z0-9][\w.-]*/[\w.-]+)$")  # "org/name" or timm's "hf-hub:org/name"
OPEN_CLIP_CONFIG = "open_clip_config.json"  # what open_clip's save_for_hf writes beside the weights
HUB_FILES = ["*.json", "*.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"]  # what a folder load reads



def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when available, else CPU. A device this machine lacks (``"cuda"`` without a GPU,
    ``"cuda:3"`` with one) is an ``InputError`` naming it, not torch's error from deep inside ``.to``."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"device={device!r} is not a torch device; pass 'auto' (CUDA when available), 'cpu', "
                         "'cuda', 'cuda:1', 'mps' or a torch.device") from None
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError) as e:  # AssertionError: a torch built without CUDA
        raise InputError(f"device={device!r} is not available on this machine ({(str(e).splitlines() or [''])[0]}); "
                         f"pass 'auto' (CUDA when available) or 'cpu'") from None
    return dev


def host_reachable(host: str, port: int = 443, timeout: float = NETWORK_TIMEOUT_S) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``timeout`` s (DNS included)."""
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(result and result[0])


def _hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids the Hugging Face Hub."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def _hub_repo(target: str) -> str | None:
    """The Hub repository ``target`` names (``"org/name"`` or ``"hf-hub:org/name"``), or None: a path that exists,
    or one ending in a weights suffix, stays a path."""
    hub = HUB_ID.match(target)
    if hub is None or Path(target).exists() or target.endswith(WEIGHT_SUFFIXES):
        return None
    return hub.group(2)


def _weights_host(pretrained_cfg: dict[str, Any]) -> str:
    if pretrained_cfg.get("hf_hub_id"):
        return urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    return urlparse(pretrained_cfg.get("url") or "").hostname or "huggingface.co"


def _cached_hub_file(pretrained_cfg: dict[str, Any]) -> str | None:
    repo = pretrained_cfg.get("hf_hub_id")
    if not repo:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in ("model.safetensors", "open_clip_pytorch_model.bin", "pytorch_model.bin"):
        hit = try_to_load_from_cache(repo, filename)
        if isinstance(hit, str):
            return hit
    return None


def _torch_hub_file(pretrained_cfg: dict[str, Any]) -> Path | None:
    """Where torch hub caches the weights of a pretrained config that timm fetches from a plain ``url`` (no
    ``hf_hub_id``): ``<torch.hub.get_dir()>/checkpoints/<the URL's file name>``, as timm's download writes it
    (``$TORCH_HOME/hub`` by default); None for a config read from the Hugging Face Hub or without a URL."""
    url = pretrained_cfg.get("url")
    if pretrained_cfg.get("hf_hub_id") or not url:
        return None
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


def _cached_file(pretrained_cfg: dict[str, Any]) -> str | None:
    """The pretrained weights of ``pretrained_cfg`` on this disk: the Hugging Face cache (``hf_hub_id``) or torch
    hub's (a plain ``url``), or None."""
    url_file = _torch_hub_file(pretrained_cfg)
    if url_file is not None:
        return str(url_file) if url_file.is_file() else None
    return _cached_hub_file(pretrained_cfg)


def _unavailable(name: str, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f"pretrained weights for {name!r} cannot be fetched: {why}. Download the weights file on a machine with "
        f"network access (e.g. the model.safetensors of its Hugging Face repo) and pass it: "
        f"vitviz.load_model({name!r}, checkpoint='path/to/model.safetensors'); or use pretrained=False for "
        "random weights"
    )


def _create_timm(name: str, pretrained: bool, checkpoint: Path | None, *, cached: bool = False,
                 **kwargs: Any) -> nn.Module:
    """A timm model: random weights, ``checkpoint``'s (which must fit whole), or timm's pretrained ones.

    ``cached``: ``checkpoint`` is timm's own pretrained file from the Hub cache, so ``pretrained=True``'s rule holds
    as it does online: a ``num_classes`` other than the weights' gets a new, random classifier."""
    import timm

    if not timm.is_model(name.split(".")[0]):
        close = timm.list_models(f"*{name.split('.')[0].split('_')[0]}*")[:5]
        raise InputError(
            f"{name!r} is neither a timm model, a local weights file nor a vitviz reference model "
            f"({', '.join(REFERENCE_MODELS)}). Similar timm names: {', '.join(close) or 'none'}. Pass one of "
            "those, a Hugging Face Hub id ('org/name'), a model folder or a weights file; a torchvision or open_clip "
            "ViT you build is passed to the analyses as the module itself"
        )
    if "." in name and name not in timm.list_pretrained(name):
        tags = timm.list_pretrained(f"{name.split('.')[0]}.*")
        raise InputError(f"{name!r} names a pretrained tag timm does not have for {name.split('.')[0]!r}; its tags: "
                         f"{tags or 'none'} (or drop the tag)")
    if checkpoint is not None:
        from timm.models import get_pretrained_cfg

        # timm's loader drops the file's classifier, and loads every other tensor non-strictly, when num_classes
        # differs from its pretrained config's; it also strips label_offset rows. A user's file is the config here: its
        # classifier must fit num_classes (as given, else the config's) and every tensor must fit, or it is refused.
        cfg = get_pretrained_cfg(name)
        cfg = cfg.to_dict() if cfg is not None else {}
        num_classes = kwargs.get("num_classes", cfg.get("num_classes", 1000))
        overlay = {"file": str(checkpoint), "custom_load": checkpoint.suffix == ".npz"}
        if not cached:
            overlay.update(num_classes=num_classes, label_offset=0)
        if checkpoint.suffix == ".npz":
            check_npz(checkpoint)
            head = None
        else:
            sd = read_state_dict(checkpoint)  # refuses a corrupt file with a clear message before timm sees it
            head = sd.get(f"{cfg.get('classifier') or 'head'}.weight")
        try:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
        except (RuntimeError, KeyError, ValueError, IndexError) as e:  # the others: an .npz timm reads only in part
            hint = ""
            if head is not None and head.ndim == 2 and head.shape[0] != num_classes:
                hint = (f"; its classifier has {head.shape[0]} classes, the model num_classes={num_classes}: pass "
                        f"num_classes={head.shape[0]}")
                if num_classes == 0:  # a feature extractor: load the file whole, then take the classifier off
                    hint += ", then model.reset_classifier(0) for the features without it"
            raise CheckpointError(
                f"the weights in {str(checkpoint)!r} do not fit timm model {name!r}: {str(e)[:600]}{hint}"
            ) from None
        if checkpoint.suffix == ".npz":
            _check_npz_fits(model, checkpoint, name)
        else:
            _check_pre_logits(model, sd, checkpoint, name)
        tokens, kernel = _file_layout(checkpoint, None if checkpoint.suffix == ".npz" else sd)
        _warn_if_resampled(model, tokens, checkpoint, name)
        _warn_if_kernel_resampled(model, kernel, checkpoint, name)
        return model
    if pretrained:
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(name)
        cfg = cfg.to_dict() if cfg is not None else {}
        hit = _cached_file(cfg)
        if hit:
            return _create_timm(name, False, Path(hit), cached=True, **kwargs)
        url_file = _torch_hub_file(cfg)
        where = "" if url_file is None else f" (torch hub's cache: {url_file})"
        if _hub_offline():
            raise _unavailable(name, f"HF_HUB_OFFLINE is set and the weights are not in the local cache{where}")
        host = _weights_host(cfg)
        if not host_reachable(host):
            raise _unavailable(name, f"{host} cannot be reached (offline?) and the weights are not cached{where}")
        try:
            return timm.create_model(name, pretrained=True, **kwargs)
        except Exception as e:
            raise _unavailable(name, f"{type(e).__name__}: {str(e)[:300]}") from None
    return timm.create_model(name, pretrained=False, **kwargs)


def _file_layout(path: Path, state_dict: dict | None) -> tuple[int | None, tuple[int, int] | None]:
    """The rows of the position table in a weights file (prefix tokens included) and the ``(kh, kw)`` of its patch
    embedding's kernel, each ``None`` when it has none (a JAX ``.npz`` opened once for both)."""
    if state_dict is not None:
        table, proj = state_dict.get("pos_embed"), state_dict.get("patch_embed.proj.weight")
        return (None if table is None or table.ndim != 3 else int(table.shape[1]),
                None if proj is None or proj.ndim != 4 else (int(proj.shape[2]), int(proj.shape[3])))
    import numpy as np

    with np.load(path) as w:
        key = next((k for k in w.files if k.endswith("posembed_input/pos_embedding")), None)
        tokens = None if key is None else int(w[key].shape[1])
        kernel = w["embedding/kernel"].shape if "embedding/kernel" in w.files else None  # (kh, kw, C, D)
    return tokens, None if kernel is None or len(kernel) != 4 else (int(kernel[0]), int(kernel[1]))


def _warn_if_kernel_resampled(model: nn.Module, kernel: tuple[int, int] | None, path: Path, name: str) -> None:
    """Warn (``ResampledKernelWarning``) when timm's loader resized the file's patch-embedding kernel to the model's
    ``patch_size``: the model's kernel is then a resampled one, and the RGB filters are not those trained."""
    import warnings

    from vitviz.errors import ResampledKernelWarning

    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    weight = getattr(proj, "weight", None)
    if kernel is None or not isinstance(weight, torch.Tensor) or weight.ndim != 4 or \
            tuple(weight.shape[-2:]) == kernel:
        return
    own = tuple(weight.shape[-2:])
    warnings.warn(ResampledKernelWarning(
        f"the patch-embedding kernel in {str(path)!r} was trained for {kernel[0]}x{kernel[1]} patches, timm model "
        f"{name!r} has {own[0]}x{own[1]} patches: timm resized the kernel (FlexiViT's pseudo-inverse resize), so "
        "the model computes an approximation of the trained embedding and the RGB filters figure shows the resized "
        f"kernel; pass patch_size={kernel[0] if kernel[0] == kernel[1] else kernel} to read it as trained"),
        stacklevel=_outside_vitviz())


def _warn_if_resampled(model: nn.Module, tokens: int | None, path: Path, name: str) -> None:
    """Warn (``ResampledPositionsWarning``) when timm's loader resampled the file's position table to the model's
    grid: the model's table is then an interpolation, and a figure of it is not the table that was trained."""
    import math
    import warnings

    from vitviz.errors import ResampledPositionsWarning

    table, embed = getattr(model, "pos_embed", None), getattr(model, "patch_embed", None)
    if tokens is None or not isinstance(table, torch.Tensor) or table.ndim != 3 or table.shape[1] == tokens or \
            not all(hasattr(embed, a) for a in ("grid_size", "img_size", "patch_size")):
        return
    prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 1))
    side = math.isqrt(max(tokens - prefix, 0))
    grid = tuple(embed.grid_size)
    trained = f"a {side}x{side} grid" if side * side == tokens - prefix else f"{tokens - prefix} patches"
    fix = f"; pass img_size={side * embed.patch_size[0]} to read it as trained" if side * side == tokens - prefix else ""
    warnings.warn(ResampledPositionsWarning(
        f"the position table in {str(path)!r} was trained for {trained} ({tokens} rows), timm model {name!r} at "
        f"img_size={tuple(embed.img_size)} has a {grid[0]}x{grid[1]} grid: timm resampled it, so the "
        f"position-embedding figures show the resampled table, not the trained one{fix}"), stacklevel=_outside_vitviz())


def _outside_vitviz() -> int:
    """The ``stacklevel`` of the first frame outside the vitviz package, counted from this function's caller: a
    warning then names the user's line, however deep in vitviz it was raised."""
    import sys

    import vitviz

    root = str(Path(vitviz.__file__).resolve().parent)
    level, frame = 2, sys._getframe(2)  # stacklevel 1 is the caller (who warns), 2 the frame that called it
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level


def _check_npz_fits(model: nn.Module, path: Path, name: str) -> None:
    """Refuse a JAX ``.npz`` that timm's ``_load_weights`` read only in part into ``model`` (a timm ViT).

    timm's reader copies what the model asks for and skips the rest without a word: the classifier when its class
    count differs (or the file has none), blocks beyond the model's depth, the ``pre_logits`` layer of the original
    ImageNet-21k checkpoints. The model would then hold random weights there, or a head fed without its layer."""
    import numpy as np

    if not isinstance(getattr(model, "blocks", None), nn.Sequential) or not hasattr(model, "head"):
        return
    with np.load(path) as w:
        keys = set(w.files)
        prefix = next((p for p in ("", "opt/target/", "params/", "params/img/") if f"{p}embedding/kernel" in keys), "")
        head_bias = w[f"{prefix}head/bias"].shape[-1] if f"{prefix}head/bias" in keys else None
        stacked = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"
        depth = w[stacked].shape[0] if stacked in keys else sum(
            f"{prefix}Transformer/encoderblock_{i}/LayerNorm_0/scale" in keys for i in range(len(keys)))
    n_head = model.head.out_features if isinstance(model.head, nn.Linear) else 0
    where = f"the weights in {str(path)!r} do not fit timm model {name!r}"
    if depth != len(model.blocks):
        raise CheckpointError(f"{where}: the file has {depth} blocks, the model depth={len(model.blocks)}: pass "
                              f"depth={depth} (or name the timm model of that depth)")
    if (head_bias or 0) != n_head:
        raise CheckpointError(f"{where}: the file's classifier has {head_bias or 0} classes, the model "
                              f"num_classes={n_head}: pass num_classes={head_bias or 0}")
    if n_head and any(k.startswith(f"{prefix}pre_logits/") for k in keys):
        raise CheckpointError(f"{where}: the file's classifier sits on a pre_logits layer that timm's ViT does not "
                              "have, so its logits would be wrong: pass num_classes=0 to load the features only")


def _check_pre_logits(model: nn.Module, state_dict: dict[str, torch.Tensor], path: Path, name: str) -> None:
    """Refuse a state dict whose ``pre_logits`` layer timm's ViT filter dropped (the model has none) when the model
    keeps a classifier: the head, trained on that layer's output, would be fed the features without it."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear) or not head.out_features:
        return
    own = model.state_dict()
    dropped = [k for k in state_dict if "pre_logits" in k and k not in own]
    if dropped:
        raise CheckpointError(f"the weights in {str(path)!r} do not fit timm model {name!r}: the file's classifier "
                              f"sits on a pre_logits layer ({', '.join(dropped[:2])}) that timm's model does not have, "
                              "so its logits would be wrong: pass num_classes=0 to load the features only")


def _load_folder(folder: Path, **kwargs: Any) -> nn.Module:
    """A model saved as a folder with a ``config.json``: a Hugging Face ``save_pretrained`` folder (its ``model_type``;
    the class its ``architectures`` names, else ``AutoModel``) or a timm Hub folder (its ``architecture``, read by
    timm's ``local-dir:`` loader); without a ``config.json``, an open_clip folder (``_load_open_clip_folder``).
    ``kwargs`` go to ``from_pretrained``, ``timm.create_model`` or ``open_clip.create_model``."""
    for weights in sorted(folder.glob("*.safetensors")):  # a damaged file (a cut-off download) named as such,
        safetensors_metadata(weights)  # where each library would raise its own SafetensorError
    config_file = folder / "config.json"
    if not config_file.is_file():
        if (folder / OPEN_CLIP_CONFIG).is_file():
            return _load_open_clip_folder(folder, **kwargs)
        raise CheckpointError(
            f"{str(folder)!r} is a folder without a config.json: vitviz reads a Hugging Face save_pretrained folder, "
            "a timm Hub folder (config.json beside model.safetensors or pytorch_model.bin) or an open_clip folder "
            f"({OPEN_CLIP_CONFIG} beside the weights); pass a weights file "
            "with the architecture named instead: vitviz.load_model('<timm model name>', checkpoint='path/to/file')")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{str(config_file)!r} is not readable JSON: {e}") from None
    if isinstance(config, dict) and isinstance(config.get("architecture"), str):  # timm's save_for_hf / push_to_hf_hub
        import timm

        if "num_classes" in kwargs:  # else timm drops the folder's classifier and loads the rest non-strictly
            kwargs = {**kwargs, "pretrained_cfg_overlay": {"num_classes": kwargs["num_classes"]}}
        try:
            return timm.create_model(f"local-dir:{folder}", pretrained=True, **kwargs)
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"timm cannot build the model in {str(folder)!r} "
                                  f"({config['architecture']}): {type(e).__name__}: {str(e)[:400]}") from None
    if isinstance(config, dict) and isinstance(config.get("model_type"), str):  # transformers' save_pretrained
        try:
            import transformers
        except ImportError:
            raise MissingDependencyError(f"{str(folder)!r} holds a Hugging Face model "
                                         f"({config['model_type']}): pip install 'vitviz[hf]'") from None
        names = config.get("architectures") or []
        cls = getattr(transformers, names[0], None) if names else None
        cls = cls if cls is not None else transformers.AutoModel
        try:
            model, info = cls.from_pretrained(str(folder), local_files_only=True, output_loading_info=True, **kwargs)
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"transformers cannot load {cls.__name__} from {str(folder)!r}: "
                                  f"{type(e).__name__}: {str(e)[:400]}") from None
        missing = sorted(info["missing_keys"])
        if missing:  # transformers logs them and initialises them at random
            fix = ("pass add_pooling_layer=False (vitviz then pools the class token)"  # e.g. DINO's ViTModel
                   if all(k.split(".")[-3:-2] == ["pooler"] for k in missing) else
                   "save the model again with save_pretrained, or set config.json's 'architectures' to the class it "
                   "was saved from")
            raise CheckpointError(f"the weights in {str(folder)!r} lack {len(missing)} tensors of {cls.__name__} "
                                  f"({', '.join(missing[:5])}), which transformers would leave random; {fix}")
        return model
    raise CheckpointError(
        f"{str(config_file)!r} names neither a timm architecture ('architecture') nor a Hugging Face model "
        "('model_type'); load the model with its own library and pass the module to vitviz")


def _load_open_clip_folder(folder: Path, **kwargs: Any) -> nn.Module:
    """An open_clip folder (``open_clip.save_for_hf`` / ``push_to_hf_hub``: ``open_clip_config.json`` beside the
    weights), read by open_clip's ``local-dir:`` loader with ``require_pretrained=True``: a folder without weights is
    refused, where open_clip alone would log a warning and return random weights."""
    try:
        import open_clip
    except ImportError:
        raise MissingDependencyError(f"{str(folder)!r} holds an open_clip model ({OPEN_CLIP_CONFIG}): "
                                     "pip install 'vitviz[clip]'") from None
    try:
        return open_clip.create_model(f"local-dir:{folder}", require_pretrained=True, **kwargs)
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"open_clip cannot build the model in {str(folder)!r}: "
                              f"{type(e).__name__}: {str(e)[:400]}") from None


def _hub_folder(repo: str) -> Path:
    """The local folder of Hugging Face Hub repository ``repo``: from the local cache when its ``config.json`` (or an
    open_clip repository's ``open_clip_config.json``) is there; else downloaded (``HUB_FILES`` only) after the host
    answered; else ``WeightsUnavailableError``."""
    try:
        import huggingface_hub
    except ImportError:
        raise _hub_unavailable(repo, "huggingface_hub is not installed (pip install 'vitviz[hf]')") from None
    for config in ("config.json", OPEN_CLIP_CONFIG):
        cached = huggingface_hub.try_to_load_from_cache(repo, config)
        if isinstance(cached, str):
            return Path(cached).parent
    if _hub_offline():
        raise _hub_unavailable(repo, "HF_HUB_OFFLINE is set and the repository is not in the local cache")
    host = _weights_host({"hf_hub_id": repo})
    if not host_reachable(host):
        raise _hub_unavailable(repo, f"{host} cannot be reached (offline?) and the repository is not in the local "
                                     "cache")
    try:
        return Path(huggingface_hub.snapshot_download(repo, allow_patterns=HUB_FILES))
    except Exception as e:
        raise _hub_unavailable(repo, f"{type(e).__name__}: {str(e)[:300]}") from None


def _hub_unavailable(repo: str, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f"the Hugging Face Hub repository {repo!r} cannot be fetched (and no local folder of that name exists): {why}. "
        "Download its folder (config.json and the weights) on a machine with network access and pass the folder: "
        "vitviz.load_model('path/to/folder')")


def _card_model_kwargs(path: Path, name: str) -> dict[str, Any] | None:
    """The architecture arguments the card beside ``path`` (``<stem>.json``, a card of ``name``) was built with."""
    try:
        card = json.loads(path.with_suffix(".json").read_text())
        return dict(card["recipe"]["model_kwargs"]) if card.get("name") == name else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _architecture(model: nn.Module) -> list[tuple[str, str, dict[str, Any]]]:
    """What a model computes, as far as its modules' plain attributes say (``num_heads``, ``global_pool``, the
    attention's scale...): per module its path, class and attributes that are numbers, strings or tuples of them
    (a list read as a tuple: a card's JSON list builds the model its tuple builds). Dropout modules (``nn.Dropout``,
    timm's ``DropPath`` and ``PatchDropout``: identities in eval mode) and ``nn.Identity`` (which timm puts where a
    rate is 0) are left out, so the rates, which fine-tuning sets, do not count."""
    def plain(v: Any) -> Any:
        v = tuple(v) if isinstance(v, list) else v
        return v if isinstance(v, (int, float, str, tuple, type(None))) else plain  # plain: not compared

    return [(path, type(m).__name__, {k: v for k, v in ((k, plain(v)) for k, v in vars(m).items())
                                      if not k.startswith("_") and k != "training" and v is not plain})
            for path, m in model.named_modules()
            if "Drop" not in type(m).__name__ and not isinstance(m, nn.Identity)]


def _load_reference(name: str, checkpoint: Path | None, **kwargs: Any) -> nn.Module:
    model = build_reference(name, **kwargs)
    if checkpoint is not None and not checkpoint.is_file():  # a file named but absent: no reason to train
        raise CheckpointError(f"checkpoint file {str(checkpoint)!r} not found")
    path = checkpoint or checkpoint_dir() / f"{name}.safetensors"
    if not path.is_file():
        raise WeightsUnavailableError(
            f"the reference checkpoint for {name!r} is not at {str(path)!r}. Train and export it with "
            f"`python -m vitviz.experiments.train {name} --data DIR --export vitviz/zoo/checkpoints`, or set $VITVIZ_CHECKPOINTS "
            "to the folder that holds it"
        )
    sd = read_state_dict(path)
    check_card_hash(path, name)  # bytes damaged inside the tensor data still parse
    built = _card_model_kwargs(path, name)
    # refused even when every tensor fits: num_heads, global_pool... change the model, not the shapes (the card's
    # model built only where the arguments differ in their spelling)
    if built is not None and built != kwargs and \
            _architecture(build_reference(name, **built)) != _architecture(model):
        args = "".join(f", {k}={v!r}" for k, v in built.items())
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no architecture arguments"
        raise CheckpointError(f"{str(path)!r} does not fit reference model {name!r}; its card says it was built with "
                              f"{args[2:] or 'no architecture arguments'}: vitviz.load_model({name!r}{args}). "
                              f"It was asked for with {given}")
    try:
        model.load_state_dict(sd)
    except RuntimeError as e:
        holds = safetensors_metadata(path).get("vitviz.model") if path.suffix == ".safetensors" else None
        if holds and holds != name:
            fix = f"it holds {holds!r} (its metadata): vitviz.load_model({holds!r}, checkpoint={str(path)!r})"
        elif kwargs:
            given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            fix = (f"the arguments {given} do not build the architecture it was trained with: pass its card's "
                   "architecture kwargs instead (none for the shipped checkpoints), or "
                   f"vitviz.zoo.reference.build_reference({name!r}, {given}) for random weights")
        else:
            fix = f"export it again (`python -m vitviz.experiments.train {name} --resume --export DIR`)"
        raise CheckpointError(f"{str(path)!r} does not fit reference model {name!r}; {fix}. {str(e)[:600]}") from None
    return model


def load_model(
    name_or_path: str | os.PathLike,
    *,
    pretrained: bool = False,
    checkpoint: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
    **kwargs: Any,
) -> nn.Module:
    """Load a ViT in eval mode on ``device``.

    Args:
        name_or_path: a timm model name (``"vit_base_patch16_224"``), a vitviz reference model
            (``"cifar10-vit"``, see ``vitviz.zoo.reference.REFERENCE_MODELS``), a ``.safetensors`` file exported
            by vitviz (its metadata names the architecture), a model folder (a Hugging Face ``save_pretrained``
            folder, a timm Hub folder: ``config.json`` beside the weights, or an open_clip folder:
            ``open_clip_config.json`` beside them; the whole ``CLIP``, read through its ``visual`` tower), or a
            Hugging Face Hub id
            (``"google/vit-base-patch16-224"``, ``"hf-hub:timm/vit_base_patch16_224.augreg_in21k"``), read from
            the local cache, else downloaded when the Hub answers.
        pretrained: fetch the timm model's pretrained weights (fails within seconds when offline); with a
            ``num_classes`` other than theirs, timm gives the model a new, random classifier.
        checkpoint: a local weights file: ``.safetensors``, ``.pth``/``.pt``/``.bin`` state dict, or the original
            JAX ``.npz`` (read by timm's loader, which also resamples position embeddings to ``img_size``; vitviz
            then warns, ``ResampledPositionsWarning``: a figure of the table shows the resampled one).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda:1"``...
        **kwargs: passed to ``timm.create_model`` (e.g. ``img_size=384``, ``dynamic_img_size=True``), or to
            ``from_pretrained`` for a Hugging Face folder, or to ``open_clip.create_model`` for an open_clip one.

    Raises:
        WeightsUnavailableError: pretrained weights cannot be fetched; the message says how to pass a file.
        InputTypeError: ``pretrained`` is not a bool (a string ``"False"`` would read as True).
        CheckpointError: the weights file is missing, corrupt, or does not fit the model; a folder has no readable
            ``config.json`` naming a timm or Hugging Face model (nor an ``open_clip_config.json``), or no weights.
    """
    from vitviz.core.util import check_bool

    pretrained = check_bool(pretrained, "pretrained", "fetch the timm model's pretrained weights")  # "False" is truthy
    ckpt = Path(checkpoint) if checkpoint is not None else None
    target = str(name_or_path)
    repo = _hub_repo(target)
    if ckpt is not None and target not in REFERENCE_MODELS and (
            repo is not None or Path(target).exists() or target.endswith(WEIGHT_SUFFIXES)):
        raise InputError(  # the weights would come from name_or_path, and checkpoint be ignored
            f"checkpoint={str(ckpt)!r} with name_or_path={target!r}, which holds weights of its own: pass the "
            f"architecture's name with the file, vitviz.load_model('<timm model name>', checkpoint={str(ckpt)!r}), "
            f"or {target!r} alone")
    if target in REFERENCE_MODELS:
        model = _load_reference(target, ckpt, **kwargs)
    elif Path(target).is_dir():
        model = _load_folder(Path(target), **kwargs)
    elif repo is not None:
        model = _load_folder(_hub_folder(repo), **kwargs)
    elif target.endswith(WEIGHT_SUFFIXES) or Path(target).is_file():
        path = Path(target)
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {target!r} not found")
        arch = safetensors_metadata(path).get("vitviz.model") if path.suffix == ".safetensors" else None
        if arch in REFERENCE_MODELS:
            model = _load_reference(arch, path, **kwargs)
        elif arch:
            model = _create_timm(arch, False, path, **kwargs)
        else:
            beside = (f"; or pass its folder, whose config.json names the model: vitviz.load_model("
                      f"{str(path.parent)!r})" if (path.parent / "config.json").is_file() else "")
            raise CheckpointError(
                f"{target!r} does not say which architecture it holds; name it: "
                f"vitviz.load_model('<timm model name>', checkpoint={target!r}){beside}"
            )
    else:
        model = _create_timm(target, pretrained, ckpt, **kwargs)
    return model.to(resolve_device(device)).eval()


def load_model_or_random(
    name: str,
    *,
    pretrained: bool = False,
    checkpoint: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    verbose: bool = True,
    **kwargs: Any,
) -> nn.Module:
    """``load_model``, falling back to random weights (and saying so) when the weights cannot be had.

    For a vitviz reference model (``"cifar10-vit"``...) the trained checkpoint is used when it exists; for a timm
    name with ``pretrained=True``, timm's weights when they can be fetched or are cached. Otherwise the same
    architecture is built with random weights, and with ``verbose`` a note saying so is printed, so figures drawn
    from it are not mistaken for a trained model's. A ``checkpoint`` given (``load_model``'s: a weights file for
    ``name``'s architecture) never falls back: a file that cannot be read is an error.

    Returns:
        the model in eval mode on ``device``; ``model.vitviz_random_weights`` is True for the fallback.
    """
    try:
        model = load_model(name, pretrained=pretrained, checkpoint=checkpoint, device=device, **kwargs)
        from_file = checkpoint is not None or str(name).endswith(WEIGHT_SUFFIXES)
        saved = Path(name).exists() or _hub_repo(str(name)) is not None  # a file, a folder, a Hub repository
        random = not (pretrained or from_file or name in REFERENCE_MODELS or saved)
    except WeightsUnavailableError as err:
        if checkpoint is not None or _hub_repo(str(name)) is not None:
            raise  # the file asked for, or a Hub repository (its architecture is in its config.json): no stand-in
        if verbose:
            print(f"NOTE: no trained weights for {name!r}, so it has RANDOM weights: its figures show the "
                  f"initialisation, not what training learns.\n  ({err})")
        if name in REFERENCE_MODELS:
            model = build_reference(name, **kwargs).to(resolve_device(device)).eval()
        else:
            model = load_model(name, pretrained=False, device=device, **kwargs)
        random = True
    else:
        if random and verbose:
            print(f"NOTE: {name!r} has RANDOM weights (pretrained=False).")
    model.vitviz_random_weights = random
    return model
