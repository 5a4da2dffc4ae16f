"""How much the default maps of the row-reading explanations move when they read the rows the head reads.

Run it once with an older vitviz on ``PYTHONPATH`` (one that read the class row whenever a model had a class token,
e.g. ``git archive da151ee vitviz | tar -x -C /tmp/old``) and once with this one, then compare::

    PYTHONPATH=/tmp/old python bench/readout_maps.py save /tmp/old.pt
    PYTHONPATH=.        python bench/readout_maps.py save /tmp/new.pt
    PYTHONPATH=.        python bench/readout_maps.py compare /tmp/old.pt /tmp/new.pt

Tiny random-weight models (2 blocks, 32 px, 2 images, seed 0), ``vitviz.explain`` with every default. The table
gives, per model and method, ``equal`` (bit for bit) or the largest absolute difference over the new map's peak.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

METHODS = ("attention", "rollout", "flow", "grad_rollout", "chefer")
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def models():
    import timm
    from torchvision.models import VisionTransformer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hf_models import hf_case

    timm_models = {
        "timm token": ("vit_tiny_patch16_224", {}),
        "timm no class token, avg": ("vit_tiny_patch16_224", {"class_token": False, "global_pool": "avg"}),
        "timm avg": ("vit_tiny_patch16_224", {"global_pool": "avg"}),
        "timm distilled": ("deit_tiny_distilled_patch16_224", {}),
        "timm map": ("vit_tiny_patch16_224", {"global_pool": "map"}),
        "timm beit (avg)": ("beit_base_patch16_224", {}),
    }
    for name, (arch, kw) in timm_models.items():
        torch.manual_seed(0)
        yield name, timm.create_model(arch, **TINY, **kw).eval(), torch.randn(2, 3, 32, 32)
    torch.manual_seed(0)
    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                           num_classes=5).eval()
    yield "torchvision", tv, torch.randn(2, 3, 32, 32)
    for name in ("vit", "deit-distilled", "beit-shared-abs", "siglip-vision", "clip-vision"):
        torch.manual_seed(0)
        case = hf_case(name)
        yield f"hf {name}", case.model, case.x


def save(path: str) -> None:
    import vitviz

    out = {}
    for name, model, x in models():
        for method in METHODS:
            try:
                out[(name, method)] = vitviz.explain(model, x, method)
            except vitviz.VitvizError as err:  # headless models refuse a class target
                out[(name, method)] = type(err).__name__
    torch.save(out, path)


def compare(old_path: str, new_path: str) -> None:
    old, new = torch.load(old_path), torch.load(new_path)
    print("| model | " + " | ".join(METHODS) + " |")
    print("| --- |" + " --- |" * len(METHODS))
    for name in dict.fromkeys(k[0] for k in old):
        cells = []
        for method in METHODS:
            a, b = old[(name, method)], new[(name, method)]
            if isinstance(a, str) or isinstance(b, str):
                cells.append("n/a")
            elif torch.equal(a, b):
                cells.append("equal")
            else:
                cells.append(f"{float((a - b).abs().max() / b.abs().max()):.3g}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    {"save": save, "compare": compare}[sys.argv[1]](*sys.argv[2:])
