"""Tiny random-weight Hugging Face and open_clip vision transformers, one per family vitviz reads.

Each builder returns a ``Case``: the model (eval mode, default attention implementation, i.e. SDPA), an input
batch, ``run(model, x)`` giving the tensor output the capture must leave unchanged, ``reference(model, x)`` giving
the independent per-layer ``(B, H, N, N)`` maps, and the layout ``inspect`` must report. Non-square grids wherever
the family's config allows them (ViT, ViTMSN, I-JEPA, DeiT, BEiT, data2vec vision, DINOv2 through its interpolated
table, DINOv3 through its rotary embedding, native AIMv2 through its sin-cos table; the CLIP-built towers (CLIP,
MetaCLIP 2, Chinese-CLIP, AltCLIP), SigLIP, fixed-size AIMv2 and ViTMAE configs take one square ``image_size``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

SMALL = dict(patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99,
            bos_token_id=0, eos_token_id=1, pad_token_id=1, max_position_embeddings=16)


@dataclass
class Case:
    model: nn.Module
    x: torch.Tensor
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    reference: Callable[[nn.Module, torch.Tensor], list[torch.Tensor]]
    grid: tuple[int, int]
    prefix: tuple[str, ...]
    pos_kind: str
    extra: dict = field(default_factory=dict)


def eager_copy(model: nn.Module) -> nn.Module:
    """A separate copy of ``model`` (same weights) switched to the eager attention implementation."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    return ref


def eager_rebuilt(model: nn.Module) -> nn.Module:
    """The same weights in a model built with the eager implementation (data2vec vision picks its attention class
    when it is built, so switching the implementation afterwards does not give it eager weights)."""
    ref = type(model)._from_config(copy.deepcopy(model.config), attn_implementation="eager")
    ref.load_state_dict(model.state_dict())
    return ref.eval()


def _rebuilt_attentions(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(eager_rebuilt(model)(pixel_values=x, output_attentions=True).attentions)


def _hidden(model: nn.Module, x: torch.Tensor, **kw) -> torch.Tensor:
    out = model(pixel_values=x, **kw)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _eager_attentions(model: nn.Module, x: torch.Tensor, **kw) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(eager_copy(model)(pixel_values=x, output_attentions=True, **kw).attentions)


def hf_case(name: str) -> Case:
    """The tiny model of family ``name`` (one of ``HF_CASES``) with its input and references."""
    case = _build(name)
    with torch.no_grad():  # several families initialise tokens and tables to zeros: give them random weights
        for pname, p in case.model.named_parameters():
            # (BEiT's relative position bias tables too: at zeros, a bias dropped or misplaced would go unseen)
            if p.requires_grad and not p.any() and any(s in pname for s in ("embeddings", "token", "relative_pos")):
                p.normal_(std=0.5)
    return case


def _build(name: str) -> Case:
    import transformers as T

    x32x48 = torch.randn(2, 3, 32, 48)
    x32 = torch.randn(2, 3, 32, 32)
    dino = dict(SMALL, mlp_ratio=2)
    dino.pop("intermediate_size")
    if name == "vit":
        m = T.ViTForImageClassification(T.ViTConfig(image_size=(32, 48), num_labels=3, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls",), "learned")
    if name == "deit-distilled":
        m = T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(image_size=(32, 48), num_labels=3, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls", "dist"), "learned")
    if name == "beit-relative":
        m = T.BeitModel(T.BeitConfig(image_size=(32, 48), use_relative_position_bias=True, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls",), "relative-bias")
    if name == "beit-shared-abs":
        # square: BeitEmbeddings interpolates its absolute table (as a square) whenever height != width
        m = T.BeitForImageClassification(T.BeitConfig(
            image_size=32, use_shared_relative_position_bias=True, use_absolute_position_embeddings=True,
            num_labels=3, **SMALL))
        return Case(m.eval(), x32, _hidden, _eager_attentions, (4, 4), ("cls",), "learned+relative-bias")
    if name == "data2vec-relative":  # BEiT's layout in the older module layout: weights only per call
        m = T.Data2VecVisionModel(T.Data2VecVisionConfig(image_size=(32, 48), use_relative_position_bias=True, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _rebuilt_attentions, (4, 6), ("cls",), "relative-bias",
                    {"per_call": True})
    if name == "data2vec-shared-abs":
        m = T.Data2VecVisionForImageClassification(T.Data2VecVisionConfig(
            image_size=32, use_shared_relative_position_bias=True, use_absolute_position_embeddings=True,
            num_labels=3, **SMALL))
        return Case(m.eval(), x32, _hidden, _rebuilt_attentions, (4, 4), ("cls",), "learned+relative-bias",
                    {"per_call": True})
    if name == "dinov2":
        m = T.Dinov2Model(T.Dinov2Config(image_size=32, **dino))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls",), "learned")
    if name == "dinov2-registers":
        m = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(image_size=32, num_register_tokens=3, **dino))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls", "reg", "reg", "reg"), "learned")
    if name == "dinov3":
        # rotary positions and two registers; the grid follows the input (non-square here)
        m = T.DINOv3ViTModel(T.DINOv3ViTConfig(image_size=32, num_register_tokens=2, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls", "reg", "reg"), "rotary")
    if name == "vit-msn":
        m = T.ViTMSNForImageClassification(T.ViTMSNConfig(image_size=(32, 48), num_labels=3, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls",), "learned")
    if name == "ijepa":  # no class token: the readout is the patch mean
        m = T.IJepaForImageClassification(T.IJepaConfig(image_size=(32, 48), num_labels=3, **SMALL))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), (), "learned")
    if name == "auto-dinov2":
        m = T.AutoModel.from_config(T.Dinov2Config(image_size=32, **dino))
        return Case(m.eval(), x32x48, _hidden, _eager_attentions, (4, 6), ("cls",), "learned")
    if name == "clip-vision":
        m = T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, **SMALL))
        return Case(m.eval(), x32, _hidden, _eager_attentions, (4, 4), ("cls",), "learned")
    if name in ("clip-model", "chinese-clip-model", "aimv2-model"):  # image-text models: the vision tower is read
        if name == "clip-model":
            m = T.CLIPModel(T.CLIPConfig(vision_config=dict(image_size=32, **SMALL), text_config=TEXT,
                                         projection_dim=16))
        elif name == "aimv2-model":  # no class token: an attention-pooling head
            m = T.Aimv2Model(T.Aimv2Config(vision_config=dict(image_size=32, **SMALL), text_config=TEXT,
                                           projection_dim=16))
        else:  # a BERT text tower
            m = T.ChineseCLIPModel(T.ChineseCLIPConfig(vision_config=dict(image_size=32, **SMALL), text_config=TEXT,
                                                       projection_dim=16))

        def run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return model.get_image_features(pixel_values=x).pooler_output

        def reference(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
            with torch.no_grad():
                return list(eager_copy(model).vision_model(pixel_values=x, output_attentions=True).attentions)

        return Case(m.eval(), x32, run, reference, (4, 4), () if name == "aimv2-model" else ("cls",), "learned")
    if name == "metaclip2-classifier":  # CLIP's vision code; the head reads the patch mean
        m = T.MetaClip2ForImageClassification(T.MetaClip2Config(vision_config=dict(image_size=32, **SMALL),
                                                                 text_config=TEXT, num_labels=3))
        return Case(m.eval(), x32, _hidden, _eager_attentions, (4, 4), ("cls",), "learned")
    if name == "altclip-vision":
        m = T.AltCLIPVisionModel(T.AltCLIPVisionConfig(image_size=32, **SMALL))
        return Case(m.eval(), x32, _hidden, _eager_attentions, (4, 4), ("cls",), "learned")
    if name == "siglip-vision":
        m = T.SiglipVisionModel(T.SiglipVisionConfig(image_size=32, **SMALL))
        return Case(m.eval(), x32, _hidden, _eager_attentions, (4, 4), (), "learned")
    if name == "auto-siglip":
        m = T.AutoModel.from_config(T.SiglipVisionConfig(image_size=32, **SMALL))
        return Case(m.eval(), x32, _hidden, _eager_attentions, (4, 4), (), "learned")
    if name in ("aimv2-vision", "aimv2-native"):  # no class token, RMSNorm, SwiGLU, an attention-pooling head
        native = name == "aimv2-native"  # the sin-cos table built for every input: a non-square grid
        m = T.Aimv2VisionModel(T.Aimv2VisionConfig(image_size=32, is_native=native, **SMALL))
        return Case(m.eval(), x32x48 if native else x32, _hidden, _eager_attentions, (4, 6) if native else (4, 4),
                    (), "sincos" if native else "learned")
    if name == "vit-mae":
        m = T.ViTMAEModel(T.ViTMAEConfig(image_size=32, **SMALL))
        from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding

        with torch.no_grad():  # built from a config, transformers 5 leaves the fixed sin-cos table at zeros
            m.embeddings.position_embeddings.copy_(
                build_2d_sinusoidal_position_embedding(4, 4, 32, cls_token=True)[None])
        identity = torch.arange(16.0).expand(2, 16)

        def run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return model(pixel_values=x).last_hidden_state

        def reference(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
            ref = eager_copy(model)
            ref.config.mask_ratio = 0.0  # unmasked, and the identity shuffle: the tokens in patch order
            with torch.no_grad():
                return list(ref(pixel_values=x, noise=identity, output_attentions=True).attentions)

        return Case(m.eval(), x32, run, reference, (4, 4), ("cls",), "sincos", {"noise": identity})
    raise KeyError(name)


HF_CASES = ["vit", "vit-msn", "ijepa", "deit-distilled", "beit-relative", "beit-shared-abs",
            "data2vec-relative", "data2vec-shared-abs", "dinov2", "dinov2-registers",
            "auto-dinov2", "dinov3", "clip-vision", "clip-model", "metaclip2-classifier",
            "chinese-clip-model", "altclip-vision", "siglip-vision", "auto-siglip", "aimv2-vision",
            "aimv2-native", "aimv2-model", "vit-mae"]


def mha_reference(attns: list[nn.MultiheadAttention], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``softmax(q k^T / sqrt(d))`` recomputed in float64 from each ``nn.MultiheadAttention``'s ``in_proj``."""
    out = []
    for mha, inp in zip(attns, inputs):
        inp = inp.detach()
        q, k, _ = nn.functional.linear(inp.double(), mha.in_proj_weight.detach().double(),
                                       mha.in_proj_bias.detach().double()).chunk(3, dim=-1)
        b, n, d = q.shape
        h = mha.num_heads
        q, k = (t.reshape(b, n, h, d // h).transpose(1, 2) for t in (q, k))
        out.append(torch.softmax(q @ k.transpose(-2, -1) * (d // h) ** -0.5, dim=-1).float())
    return out


def open_clip_tower(**kwargs) -> nn.Module:
    """A 2-block open_clip ``VisionTransformer`` (32x48 input, 8 px patches -> 4x6 grid by default)."""
    from open_clip.transformer import VisionTransformer

    args = dict(image_size=(32, 48), patch_size=8, width=32, layers=2, heads=2, mlp_ratio=2.0, output_dim=16)
    args.update(kwargs)
    return VisionTransformer(**args).eval()


OPEN_CLIP_CFG = {  # open_clip's model_cfg of open_clip_model(), as an open_clip_config.json holds it
    "embed_dim": 16,
    "vision_cfg": dict(image_size=[32, 48], patch_size=8, width=32, layers=2, head_width=16, mlp_ratio=2.0),
    "text_cfg": dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1),
}


def open_clip_model() -> nn.Module:
    """A whole open_clip ``CLIP`` (vision tower as above, 1-layer text tower), built from ``OPEN_CLIP_CFG``."""
    import open_clip

    return open_clip.CLIP(**OPEN_CLIP_CFG).eval()
