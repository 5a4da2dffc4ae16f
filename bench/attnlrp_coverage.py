"""Which timm architectures AttnLRP covers, and that each covered one is exactly conservative.

Every name in timm's registry that matches the patterns is built with random weights and one block (two where a
model needs them, one per distinct setting where it sets one per block; a model that takes none of these is recorded
as unbuilt; ``build``) and grouped by architecture: its model, patch embedding, first block, attention and MLP
classes, its pooling and whether it has prefix tokens. One model per group is checked, in float64 with zero biases,
``epsilon=0`` and CP attention (every rule conservative): either vitviz refuses it with ``UnsupportedModelError``
(the reason is recorded), or its token relevances sum to the score (the sum of its outputs) to the relative error
recorded, and its output under the rules is its own bit for bit. Anything else is a failure. Each supported one is
also read at the pixels (``read_at="pixels"``, ``check_pixels``): refused with the reason, or each patch's pixels
sum to its token.

    PYTHONPATH=. python bench/attnlrp_coverage.py [--out bench/results/attnlrp_coverage.json]
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from collections import Counter

import timm
import torch

from vitviz.analysis.attnlrp import attnlrp_tokens
from vitviz.core.families.lrp import LRPRules, lrp_rules
from vitviz.core.io import atomic_write_json
from vitviz.core.spec import inspect
from vitviz.errors import UnsupportedModelError

PATTERNS = ("vit_*", "deit*", "eva*", "beit*", "aimv2*", "naflexvit*", "flexivit*", "cait*")


def signature(model: torch.nn.Module) -> str:
    block = model.blocks[0] if hasattr(model, "blocks") else None
    embed = getattr(model, "patch_embed", getattr(model, "embeds", None))
    parts = [type(model).__name__, type(embed).__name__, type(block).__name__,
             type(getattr(block, "attn", None)).__name__,
             type(getattr(block, "mlp", None)).__name__, str(getattr(model, "global_pool", "")),
             type(getattr(model, "attn_pool", None)).__name__, str(getattr(model, "num_prefix_tokens", 0) > 0)]
    return " / ".join(parts)


def check(model: torch.nn.Module) -> dict:
    torch.manual_seed(0)
    model = model.double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.3)
            if name.endswith("bias"):
                p.zero_()
    h, w = model.patch_embed.img_size if hasattr(model, "patch_embed") else (224, 224)
    x = torch.randn(2, 3, h, w, dtype=torch.float64)
    try:
        rel, score = attnlrp_tokens(model, x, lambda out: out.sum(-1), rules=LRPRules(epsilon=0.0, attention="cp"))
    except UnsupportedModelError as err:
        return {"status": "refused", "reason": str(err)}
    y0 = model(x)
    with lrp_rules(model):
        same = bool(torch.equal(model(x), y0))
    error = float(((rel.sum(1) - score).abs() / score.abs()).max())
    ok = same and error < 1e-9
    return {"status": "supported" if ok else "FAILED", "conservation_rel_error": error, "forward_unchanged": same,
            **check_pixels(model, x)}


POSITION_TABLES = ("pos_embed", "pos_embedding", "positional_embedding", "position_embeddings")


def check_pixels(model: torch.nn.Module, x: torch.Tensor) -> dict:
    """``read_at="pixels"``: with the position tables zeroed too (biases are already), each patch's pixels must sum
    to its token's relevance (the rules between them pass everything on); refused (hybrids) with the reason."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1] in POSITION_TABLES:
                p.zero_()
    target = lambda out: out.sum(-1)  # noqa: E731
    tokens, _ = attnlrp_tokens(model, x, target, rules=LRPRules(epsilon=0.0, attention="cp"))
    try:
        pixels, _ = attnlrp_tokens(model, x, target, rules=LRPRules(epsilon=0.0, attention="cp", read_at="pixels"))
    except UnsupportedModelError as err:
        return {"pixels": "refused", "pixels_reason": str(err)}
    spec = inspect(model)
    (gh, gw), (ph, pw) = spec.grid_for_input(x), spec.patch_size
    covered = pixels[:, :gh * ph, :gw * pw]
    per_patch = covered.reshape(len(x), gh, ph, gw, pw).sum((2, 4)).flatten(1)
    patches = tokens[:, spec.num_prefix_tokens:]
    error = float((per_patch - patches).abs().max() / patches.abs().max())
    lost = float((pixels.abs().sum() - covered.abs().sum()) / pixels.abs().sum())
    ok = error < 1e-9 and lost == 0
    return {"pixels": "supported" if ok else "FAILED", "pixels_rel_error": error}


def build(name: str) -> tuple[torch.nn.Module | None, str]:
    """``name`` with random weights and one block (two where a model needs them; never the full depth, a 7B model
    would not fit). A model with one setting per block (Sapiens2: key/value heads, grouped in the middle blocks
    only) gets one block per distinct setting, read from its full-depth build on the meta device (no memory), at
    224 px. Returns ``(None, the error)`` where neither builds."""
    reason = ""
    for depth in (1, 2):
        try:
            return timm.create_model(name, pretrained=False, depth=depth, num_classes=3), ""
        except Exception as err:  # noqa: BLE001 - any failure to build is recorded
            reason = repr(err)[:200]
    if "num_kv_heads" in reason:
        try:
            with torch.device("meta"):
                full = timm.create_model(name, pretrained=False, num_classes=3)
            kv = tuple(sorted({b.attn.num_kv_heads for b in full.blocks}))
            return timm.create_model(name, pretrained=False, depth=len(kv), num_kv_heads=kv, img_size=224,
                                     num_classes=3), ""
        except Exception as err:  # noqa: BLE001
            reason = repr(err)[:200]
    return None, reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/attnlrp_coverage.json")
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    names = sorted({n for p in PATTERNS for n in timm.list_models(p)})
    groups: dict[str, dict] = {}
    members: Counter = Counter()
    start = time.time()
    for name in names:
        model, reason = build(name)
        if model is None:
            groups[f"unbuilt: {name}"] = {"example": name, "status": "unbuilt", "reason": reason}
            continue
        key = signature(model)
        members[key] += 1
        if key not in groups:
            groups[key] = {"example": name, **check(model)}
            print(f"{groups[key]['status']:9s} {name}", flush=True)
    rows = [{"architecture": k, "models": members.get(k, 1), **v} for k, v in sorted(groups.items())]
    counts = Counter(r["status"] for r in rows)
    pixels = Counter(r.get("pixels", "not checked") for r in rows)
    models, pixel_models = Counter(), Counter()
    for r in rows:
        models[r["status"]] += r["models"]
        pixel_models[r.get("pixels", "not checked")] += r["models"]
    result = {"timm": timm.__version__, "torch": torch.__version__, "python": platform.python_version(),
              "patterns": PATTERNS, "seconds": round(time.time() - start), "architectures": dict(counts),
              "models": dict(models), "pixels": {"architectures": dict(pixels), "models": dict(pixel_models)},
              "rows": rows}
    atomic_write_json(a.out, result)
    print({"architectures": dict(counts), "models": dict(models), "pixels": result["pixels"]})


if __name__ == "__main__":
    main()
