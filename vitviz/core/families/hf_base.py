"""Shared reader for Hugging Face vision transformers (transformers >= 5): one subclass per model family.

Everything is read from the model and its config, never guessed:

- the *vision root*: the module that embeds the pixels (``model.vision_model`` for CLIP / SigLIP, the
  ``base_model_prefix`` attribute for task heads such as ``ViTForImageClassification.vit``, else the model);
- the attention modules: ``root.<layers>[i].<attention>`` in layer order, cross-checked against the class the
  model itself records for ``output_attentions`` (``_can_record_outputs["attentions"]``) and against
  ``config.num_hidden_layers``;
- the layout: ``image_size``, ``patch_size``, ``hidden_size``, ``num_attention_heads`` of the vision config, the
  prefix tokens each subclass states from its embedding code, and the position-table length checked against them;
- the preprocessing: the checkpoint's ``preprocessor_config.json`` when the model was loaded from a local
  folder that has one, else the defaults of the model type's image-processor class (with the mean and std of
  the authors' training code where the class defaults differ from it: DeiT, DINOv2, ViTMAE).

Attention is read with ``hf_probes.probe_hf``: the config's attention implementation is switched to ``eager`` for the
duration of the capture (SDPA and flash kernels return no weights) and restored afterwards. Reductions
(``heads="stream"``: rollout, distance, dataset statistics) use ``hf_probes.probe_hf_stream`` instead, which keeps
the model's SDPA or flash attention and recomputes the maps from its query and key (on CUDA through the Triton
head-map kernels).

Patch removal (``vitviz.faithfulness``): tokens are dropped at the embeddings' ``dropout`` (the position embedding
added; CLIP: the embeddings' output) when the model has a class token and reads its output from the prefix tokens;
models whose readout is a mean over patch tokens, and SigLIP (no class token) and ViTMAE (random masking), have
their pixels filled instead.

A layout that does not check out raises ``UnsupportedModelError`` naming the model class and the reason.
"""

from __future__ import annotations

import inspect as pyinspect
import os
from typing import Any

import torch
from torch import nn

from vitviz.core.families.base import Emit, Family, Layout, Undo, set_attr
from vitviz.core.families.hf_probes import probe_hf, stream_probe_for
from vitviz.core.families.readout import PATCHES, Readout
from vitviz.core.util import pair
from vitviz.errors import CaptureError, InputError, UnsupportedModelError

# PIL resample codes used by the image processors -> timm interpolation names
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def is_transformers_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") and hasattr(model, "config")


def vision_root(model: nn.Module) -> tuple[nn.Module, str]:
    """The module that embeds the pixels, and its name prefix in ``model`` (``""`` for the model itself)."""
    root, path = model, ""
    for _ in range(4):  # e.g. CLIPModel.vision_model (a CLIPVisionModel), older layouts nest one level more
        if isinstance(getattr(root, "embeddings", None), nn.Module):
            break  # it embeds the pixels (DINOv3ViTModel: its base_model_prefix names the encoder inside it)
        attr = "vision_model" if isinstance(getattr(root, "vision_model", None), nn.Module) else getattr(
            root, "base_model_prefix", "")
        sub = getattr(root, attr, None) if attr else None
        if not isinstance(sub, nn.Module) or sub is root:
            break
        root, path = sub, f"{path}{attr}."
    return root, path


def vision_config(model: nn.Module) -> Any:
    return vision_root(model)[0].config


class HFVisionFamily(Family):
    """Base of the Hugging Face families; subclasses set the class attributes and override what differs."""

    name = "huggingface"
    probe = staticmethod(probe_hf)
    stream_probe = staticmethod(stream_probe_for)  # SDPA kept, maps recomputed from q and k (hf_probes)
    model_types: tuple[str, ...] = ()
    # candidate (layers path, attention attribute) pairs on the vision root, newest transformers layout first
    layer_paths: tuple[tuple[str, str], ...] = (("layers", "attention"), ("encoder.layer", "attention"))
    pos_embed_kind = "learned"
    pos_embed_covers_prefix = True
    dynamic_img_size = False
    embeddings_attr = "embeddings"
    patch_conv_path = "patch_embeddings.projection"  # under the embeddings module
    pos_attr = "position_embeddings"  # under the embeddings module: a (1, L, D) Parameter or an nn.Embedding
    processor_type: str | None = None  # image-processor key when it differs from the model type
    # (mean, std) the authors' training code normalised with, where the image-processor class's defaults differ
    # from it; used only when the checkpoint's own preprocessor_config.json is not at hand
    authors_mean_std: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    # ------------------------------------------------------------------ matching
    def match(self, model: nn.Module) -> bool:
        if not is_transformers_model(model):
            return False
        return getattr(vision_config(model), "model_type", None) in self.model_types or getattr(
            model.config, "model_type", None) in self.model_types

    # ------------------------------------------------------------------ per-family facts
    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ("cls",)

    # ------------------------------------------------------------------ helpers
    def _fail(self, model: nn.Module, reason: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{type(model).__name__} (Hugging Face, model_type="
                                     f"{getattr(vision_config(model), 'model_type', '?')!r}): {reason}")

    def embeddings(self, model: nn.Module) -> nn.Module:
        return _get(vision_root(model)[0], self.embeddings_attr)

    def _layers(self, model: nn.Module) -> tuple[str, list[nn.Module], str]:
        root = vision_root(model)[0]
        for path, attn in self.layer_paths:
            layers = _get(root, path)
            if isinstance(layers, nn.ModuleList):
                return path, list(layers), attn
        raise self._fail(model, f"found none of the layer lists {[p for p, _ in self.layer_paths]} on "
                                f"{type(root).__name__}; this transformers version lays the model out differently")

    def pre_logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The input of the task head (``classifier``) when there is one, else the vision root's
        ``pooler_output`` (e.g. DINOv2's and CLIP's final-normed class token, SigLIP's attention pool), else
        ``last_hidden_state`` pooled as the readout pools it (``pooled_token``: the class token, or the patch
        mean of a model without one, e.g. I-JEPA)."""
        if isinstance(getattr(model, "classifier", None), nn.Module):
            return super().pre_logits(model, x)
        out = vision_root(model)[0](pixel_values=x)
        pooled = getattr(out, "pooler_output", None)
        if pooled is not None:
            return pooled
        return self.pooled_token(model, out.last_hidden_state, self.prefix_tokens(model))

    # ------------------------------------------------------------------ Family API
    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        path, layers, attn = self._layers(model)
        prefix = vision_root(model)[1]
        modules = [(f"{prefix}{path}.{i}.{attn}", getattr(layer, attn, None)) for i, layer in enumerate(layers)]
        recorded = (getattr(type(model), "_can_record_outputs", None) or {}).get("attentions")
        out = []
        for name, module in modules:
            if not isinstance(module, nn.Module):
                raise self._fail(model, f"{name} is missing")
            if isinstance(recorded, type) and not isinstance(module, recorded):
                # older transformers (5.0, 5.1): XAttention wraps the XSelfAttention that returns the weights
                inner = [(n, m) for n, m in module.named_children() if isinstance(m, recorded)]
                if len(inner) != 1:
                    raise self._fail(model, f"{name} is a {type(module).__name__}, but the model records its "
                                            f"attentions from {recorded.__name__}")
                name, module = f"{name}.{inner[0][0]}", inner[0][1]
            out.append((name, module))
        return out

    def layout(self, model: nn.Module) -> Layout:
        c = vision_config(model)
        img, patch = pair(c.image_size, "config.image_size"), pair(c.patch_size, "config.patch_size")
        grid = (img[0] // patch[0], img[1] // patch[1])
        prefix = self.prefix_tokens(model)
        depth = len(self.attention_modules(model))
        if depth != int(c.num_hidden_layers):
            raise self._fail(model, f"{depth} attention modules but config.num_hidden_layers={c.num_hidden_layers}")
        pos = self.stored_pos_table(model)
        if pos is not None:
            want = (len(prefix) if self.pos_embed_covers_prefix else 0) + grid[0] * grid[1]
            if pos.ndim != 3 or pos.shape[1] != want:
                raise self._fail(model, f"its position table has shape {tuple(pos.shape)}, expected (1, {want}, D) "
                                        f"for prefix {prefix} and a {grid[0]}x{grid[1]} grid")
        return Layout(
            img_size=img, patch_size=patch, grid_size=grid, prefix_tokens=prefix,
            pos_embed_kind=self.pos_embed_kind_of(model), pos_embed_covers_prefix=self.pos_embed_covers_prefix,
            depth=depth, num_heads=int(c.num_attention_heads), embed_dim=int(c.hidden_size),
            dynamic_img_size=self.dynamic_img_size,
        )

    def pos_embed_kind_of(self, model: nn.Module) -> str:
        return self.pos_embed_kind

    def stored_pos_table(self, model: nn.Module) -> torch.Tensor | None:
        """The position table the model stores, whose length ``layout`` checks against the prefix and the grid
        (``pos_embed``); None for a table the model builds for every input (nothing stored to disagree)."""
        return self.pos_embed(model)

    def prepare(self, model: nn.Module) -> Undo:
        """Refuse training mode with attention dropout; guard image-text models whose forward takes ``input_ids``.

        In training mode with attention dropout the eager weights are the dropped-out ones (rows do not sum to 1):
        refused with a ``CaptureError``.

        ``CLIPModel`` and ``SiglipModel``: vitviz's analyses call ``model(images)``; on these models that would read
        the pixels as token ids and fail deep inside the text tower. For the duration of the capture such a call
        raises an ``InputError`` that says to pass ``model.vision_model`` instead (calls with ``input_ids`` pass
        through unchanged).
        """
        root = vision_root(model)[0]
        c = vision_config(model)
        dropout = max(float(getattr(c, a, 0.0) or 0.0) for a in ("attention_probs_dropout_prob", "attention_dropout"))
        if model.training and dropout > 0:
            # eager attention returns the weights after dropout: rows would not sum to 1
            raise CaptureError(f"{type(model).__name__} is in training mode with attention dropout {dropout}: the "
                               "attention weights it returns are the dropped-out ones; call model.eval() first")
        params = list(pyinspect.signature(type(model).forward).parameters)[1:2]
        if root is model or params != ["input_ids"]:
            return super().prepare(model)
        original = type(model).forward
        name = type(model).__name__

        def forward(*args: Any, **kwargs: Any) -> Any:
            if args and getattr(args[0], "ndim", 0) == 4 and "input_ids" not in kwargs:
                raise InputError(
                    f"{name}.forward takes input_ids first, but it was called with an image batch of shape "
                    f"{tuple(args[0].shape)}; for image-only analyses pass model.vision_model (the same weights), "
                    "or call model.get_image_features(pixel_values=x) inside capture_attention")
            return original(model, *args, **kwargs)

        return set_attr(model, "forward", forward)

    def lrp_rules(self, model: nn.Module, rules: Any, emit: Any) -> Undo:
        from vitviz.core.families.lrp_families import hf_rules

        return hf_rules(model, rules, emit, self._layers(model)[1], self.attention_modules(model))

    def pos_embed(self, model: nn.Module) -> torch.Tensor | None:
        table = getattr(self.embeddings(model), self.pos_attr, None)
        if isinstance(table, nn.Embedding):
            return table.weight[None]
        return table if isinstance(table, torch.Tensor) else None

    def pos_embed_at(self, model: nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
        """The table the model adds to an input whose patch grid is ``grid``: a Hugging Face ViT runs at another
        size only through its embeddings' own ``interpolate_pos_encoding`` (``interpolate_pos_encoding=True`` on
        the call; ViT, ViT-MSN, I-JEPA, DeiT, CLIP, SigLIP, ViTMAE, BEiT's absolute table), which resamples the
        stored table bicubically without antialiasing, so unlike timm's resampling; that table, laid out as
        ``pos_embed``. ``None`` for embeddings without it (the default then: timm's resampling).

        Raises:
            InputError: a model built for a non-square grid, whose ``interpolate_pos_encoding`` reads the table as
                a square ``sqrt(P) x sqrt(P)`` grid and so cannot run at another size.
        """
        emb, table = self.embeddings(model), self.pos_embed(model)
        interpolate = getattr(emb, "interpolate_pos_encoding", None)
        if not callable(interpolate) or table is None or table.ndim != 3:
            return None
        built = self.layout(model).grid_size
        (ph, pw), (gh, gw) = pair(vision_config(model).patch_size, "config.patch_size"), grid
        if built[0] != built[1]:
            raise InputError(
                f"img_size: {type(model).__name__} is built for a {built[0]}x{built[1]} grid, and its "
                f"{type(emb).__name__}.interpolate_pos_encoding reads the table as a square grid, so the model "
                f"cannot run at another size and has no table for a {gh}x{gw} grid; pass img_size=None (the built "
                "size), or build the model with config.image_size set to the size you need")
        prefix_rows = table.shape[1] - built[0] * built[1]
        tokens = torch.zeros(1, prefix_rows + gh * gw, table.shape[-1], dtype=table.dtype, device=table.device)
        with torch.no_grad():
            full = interpolate(tokens, gh * ph, gw * pw)
        if full.ndim != 3 or full.shape[1] != prefix_rows + gh * gw:
            raise CaptureError(f"{type(emb).__name__}.interpolate_pos_encoding gave a table of shape "
                               f"{tuple(full.shape)} for a {gh}x{gw} grid, expected (1, {prefix_rows + gh * gw}, D); "
                               "this transformers version resamples the table another way")
        return full

    def patch_proj(self, model: nn.Module) -> nn.Module | None:
        return _get(self.embeddings(model), self.patch_conv_path)

    def param_components(self, model: nn.Module) -> dict[str, tuple[str, ...]]:
        p = vision_root(model)[1]
        e = f"{p}{self.embeddings_attr}."
        conv = self.patch_conv_path.split(".")[0]
        layers = tuple(f"{p}{path}." for path, _ in self.layer_paths)
        return {
            "patch_embed": (f"{e}{conv}.",),
            "pos_embed": (f"{e}{self.pos_attr}",),
            "prefix_tokens": (f"{e}cls_token", f"{e}class_embedding", f"{e}distillation_token",
                              f"{e}register_tokens", f"{e}mask_token"),
            "blocks": layers,
            "norm": (f"{p}layernorm.", f"{p}post_layernorm.", f"{p}pre_layrnorm."),
            "head": ("classifier.", "cls_classifier.", "distillation_classifier.", f"{p}pooler.", f"{p}head."),
        }

    # ------------------------------------------------------------------ patch removal
    def pools_patches(self, model: nn.Module) -> bool:
        """Whether the model's output reads a mean over patch tokens (empty when every patch is dropped)."""
        return False

    def _token_drop(self, model: nn.Module) -> tuple[nn.Module | None, str]:
        name = f"{type(model).__name__} (Hugging Face)"
        if not self.prefix_tokens(model):
            return None, f"{name} has no class token or registers (the readout would be empty with every patch dropped)"
        if self.pools_patches(model):
            return None, f"{name} reads out a mean over patch tokens (empty with every patch dropped)"
        emb = self.embeddings(model)
        drop = getattr(emb, "dropout", None)  # after the position embedding; CLIP has none: its embeddings' output
        return (drop if isinstance(drop, nn.Module) else emb), ""

    def token_drop_module(self, model: nn.Module) -> nn.Module | None:
        return self._token_drop(model)[0]

    def token_drop_refusal(self, model: nn.Module) -> str:
        return self._token_drop(model)[1]

    def processor_key(self, model: nn.Module) -> str:
        """The model type the image-processor class is filed under (``processor_type``, else the vision config's)."""
        return self.processor_type or vision_config(model).model_type

    def data_config(self, model: nn.Module) -> dict[str, Any] | None:
        """The checkpoint's ``preprocessor_config.json`` (local folder), else the processor class's defaults.

        With the class defaults, ``authors_mean_std`` (when set) replaces the class's mean and std.
        """
        processor, own = _image_processor(model, self.processor_key(model))
        if processor is None:
            return None
        cfg = processor_data_config(processor, self.layout(model).img_size)
        if not own and self.authors_mean_std is not None:
            cfg["mean"], cfg["std"] = self.authors_mean_std
        return cfg


class HFAttentionPoolFamily(HFVisionFamily):
    """A Hugging Face vision model without a class token whose image embedding comes from an attention-pooling
    ``head`` on the vision root (SigLIP, AIMv2): the readout is that head over the patch tokens, the rows weighted by
    its own attention (``pool_probe``); without a head, the patch mean. Position tables cover the patches only."""

    pos_embed_covers_prefix = False
    pool_class = ""  # the head's class, named in the readout's description

    def prefix_tokens(self, model: nn.Module) -> tuple[str, ...]:
        return ()

    def pool_probe(self, head: nn.Module, emit: Emit) -> Undo:
        """Hook ``head`` so each call emits its attention over the tokens ``(B, N)``; returns the undo. Each
        subclass gives its head's probe; a family that gives none reads no pool attention."""
        raise UnsupportedModelError(f"{type(self).__name__} gives no probe for the pooling head "
                                    f"{type(head).__name__}; define pool_probe(head, emit)")

    def readout(self, model: nn.Module, prefix_tokens: tuple[str, ...]) -> Readout:
        if getattr(vision_root(model)[0], "head", None) is not None:
            return Readout("attention-pool", ((PATCHES,),), self.pool_class, True)
        return super().readout(model, prefix_tokens)

    def readout_attention(self, model: nn.Module, emit: Emit) -> Undo | None:
        head = getattr(vision_root(model)[0], "head", None)
        return None if head is None else self.pool_probe(head, emit)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _image_processor(model: nn.Module, model_type: str) -> tuple[Any, bool]:
    """``(processor, own)``: the checkpoint's own image processor when the model was loaded from a local folder
    that has a ``preprocessor_config.json`` (``own=True``), else the model type's processor class with its
    defaults; ``(None, False)`` when there is none."""
    try:
        from transformers.models.auto import image_processing_auto as auto
    except ImportError:  # pragma: no cover - transformers is present whenever a transformers model is
        return None, False
    path = getattr(model.config, "_name_or_path", "") or ""
    if path and os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        return auto.AutoImageProcessor.from_pretrained(path, local_files_only=True), True
    names = auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    name = (names.get("torchvision") or names.get("pil")) if isinstance(names, dict) else names
    if not name:
        return None, False
    import transformers

    cls = getattr(transformers, name, None)
    return (cls() if cls is not None else None), False


def processor_data_config(processor: Any, img_size: tuple[int, int]) -> dict[str, Any]:
    """timm ``resolve_data_config`` keys from a Hugging Face image processor's settings."""
    size = getattr(processor, "size", None)
    crop = getattr(processor, "crop_size", None) if getattr(processor, "do_center_crop", False) else None
    short = getattr(size, "shortest_edge", None) if size is not None else None
    if crop is not None and getattr(crop, "height", None):
        resized = short or getattr(size, "height", None) or crop.height
        crop_pct, mode = float(crop.height) / float(resized), "center"
    elif short:
        crop_pct, mode = 1.0, "center"
    else:
        crop_pct, mode = 1.0, "squash"
    return {"input_size": (3, *img_size), "interpolation": _RESAMPLE.get(int(getattr(processor, "resample", 2) or 2),
                                                                         "bilinear"),
            "mean": tuple(float(v) for v in processor.image_mean), "std": tuple(float(v) for v in processor.image_std),
            "crop_pct": crop_pct, "crop_mode": mode}


class HFUnsupportedFamily(Family):
    """Any other Hugging Face model with an image config: refused with the reason instead of being misread."""

    name = "huggingface"
    probe = staticmethod(probe_hf)

    def match(self, model: nn.Module) -> bool:
        if not is_transformers_model(model):
            return False
        c = vision_config(model)
        return hasattr(c, "patch_size") or hasattr(getattr(model.config, "vision_config", None), "patch_size")

    def layout(self, model: nn.Module) -> Layout:
        raise UnsupportedModelError(
            f"{type(model).__name__} (Hugging Face, model_type={getattr(model.config, 'model_type', '?')!r}) is "
            "not a model vitviz reads: its token layout and attention are not described by any vitviz family "
            "(supported: ViT, ViTMSN, I-JEPA, DeiT, BEiT, data2vec vision, DINOv2, DINOv2 with registers, DINOv3, CLIP "
            "vision, MetaCLIP 2, Chinese-CLIP, AltCLIP, SigLIP vision, AIMv2 vision, ViTMAE; see docs/families.md). "
            "Describe it with vitviz.describe(model, ...) if it is a plain ViT."
        )

    def attention_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        self.layout(model)
        return []
