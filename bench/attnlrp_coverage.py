"""Which timm architectures AttnLRP covers, and that each covered one is exactly conservative.

Every name in timm's registry that matches the patterns is built with random weights and one block (two where a
model needs them; a model that takes neither is recorded as unbuilt) and grouped by architecture: the set of its module classes, its attention, MLP and block classes
and its pooling. One model per group is checked, in float64 with zero biases, ``epsilon=0`` and CP attention (every
rule conservative): either vitviz refuses it with ``UnsupportedModelError`` (the reason is recorded), or its token
relevances sum to the score (the sum of its outputs) to the relative error recorded, and its output under the rules
is its own bit for bit. Anything else is a failure.

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
from vitviz.errors import UnsupportedModelError

PATTERNS = ("vit_*", "deit*", "eva*", "beit*", "aimv2*", "naflexvit*", "flexivit*", "cait*")


def signature(model: torch.nn.Module) -> str:
    block = model.blocks[0] if hasattr(model, "blocks") else None
    parts = [type(model).__name__, type(block).__name__, type(getattr(block, "attn", None)).__name__,
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
    return {"status": "supported" if ok else "FAILED", "conservation_rel_error": error, "forward_unchanged": same}


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
        model = None
        for depth in (1, 2):  # a few need two blocks; never the full depth (a 7B model would not fit)
            try:
                model = timm.create_model(name, pretrained=False, depth=depth, num_classes=3)
                break
            except Exception as err:  # noqa: BLE001 - any failure to build is recorded
                reason = repr(err)[:200]
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
    models = Counter()
    for r in rows:
        models[r["status"]] += r["models"]
    result = {"timm": timm.__version__, "torch": torch.__version__, "python": platform.python_version(),
              "patterns": PATTERNS, "seconds": round(time.time() - start), "architectures": dict(counts),
              "models": dict(models), "rows": rows}
    atomic_write_json(a.out, result)
    print({"architectures": dict(counts), "models": dict(models)})


if __name__ == "__main__":
    main()
