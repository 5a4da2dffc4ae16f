"""vitviz's AttnLRP against lxt's shipped torchvision-ViT recipe, on the same random-weight ViT and images.

lxt (the paper's library) needs transformers < 5 and patches ``torch.nn`` classes for the whole process, so this
runs in a venv of its own, and computes every vitviz result *before* lxt patches anything:

    python -m venv /tmp/attnlrp-venv
    echo /work/main/.venv/lib/python3.11/site-packages > /tmp/attnlrp-venv/lib/python3.11/site-packages/shared.pth
    /tmp/attnlrp-venv/bin/pip install --no-deps lxt==2.1 'transformers<5' zennit 'tokenizers<=0.23.0' \
        'huggingface-hub<1.0'
    PYTHONPATH=. /tmp/attnlrp-venv/bin/python bench/attnlrp_lxt.py --data ../shared/data/cifar10/test

lxt's recipe (``lxt/efficient/models/vit_torch.py`` + ``examples/vit_torch.py``): identity rule on GELU and
LayerNorm, CP-LRP inside ``nn.MultiheadAttention`` (the gradient is stopped at the query and key inputs, so no
relevance passes the softmax), and zennit's gamma rule on every ``nn.Linear`` and ``nn.Conv2d`` (here
``gamma=--gamma`` on the linear layers). ``nn.MultiheadAttention`` computes its projections in
``F.multi_head_attention_forward`` from the weights, never calling ``out_proj`` (a module) or an ``in_proj`` module,
so zennit's rule never reaches them: they get the plain gradient.

Both are read at the same place: the tokens entering the first encoder block, summed over the embedding
dimension. Configurations compared with lxt (per image: Pearson correlation, max |difference| / max |lxt|):

- ``vitviz default``: epsilon rule, AttnLRP attention (the paper's rules): a different method from the recipe;
- ``vitviz gamma + cp``: the recipe's rules, gamma on every linear layer, including the attention projections;
- ``vitviz gamma + cp, in_proj plain``: as the recipe on the input projection only;
- ``vitviz gamma + cp, in_proj and out_proj plain``: exactly the recipe (the difference should vanish).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch


def images(folder: str | None, n: int, dtype: torch.dtype) -> torch.Tensor:
    if folder is None:
        return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=dtype)
    from PIL import Image

    every = sorted(Path(folder).rglob("*.jpg"))
    if not every:
        raise SystemExit(f"no JPEGs under {folder}")
    files = every[:: max(1, len(every) // n)][:n]
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    x = [(torch.from_numpy(np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255).permute(2, 0, 1)
          - mean) / std for f in files]
    return torch.stack(x).to(dtype)


def model(dtype: torch.dtype) -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    m = VisionTransformer(image_size=32, patch_size=4, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128,
                          num_classes=10)
    with torch.no_grad():  # random weights, biases and norms included
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.to(dtype).eval()


def lxt_tokens(m: torch.nn.Module, x: torch.Tensor, classes: torch.Tensor, gamma: float, conv_gamma: float):
    """The recipe of lxt's examples/vit_torch.py, read at the first block's input tokens."""
    import zennit.rules as z_rules
    from lxt.efficient import monkey_patch, monkey_patch_zennit
    from torchvision.models import vision_transformer
    from zennit.composites import LayerMapComposite

    monkey_patch(vision_transformer, verbose=False)
    monkey_patch_zennit(verbose=False)
    for p in m.parameters():
        p.requires_grad = False
    comp = LayerMapComposite([(torch.nn.Conv2d, z_rules.Gamma(conv_gamma)), (torch.nn.Linear, z_rules.Gamma(gamma))])
    comp.register(m)
    store = {}

    def pre(_mod, args):
        t = args[0].detach().requires_grad_(True)
        store["t"] = t
        return (t,)

    handle = m.encoder.layers[0].register_forward_pre_hook(pre)
    y = m(x.clone().requires_grad_(True))
    y[torch.arange(len(x)), classes].sum().backward()
    handle.remove()
    comp.remove()
    t = store["t"]
    return (t * t.grad).sum(-1).detach(), y[torch.arange(len(x)), classes].detach()


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Per image over the patch tokens: Pearson r (mean, min) and max |a - b| / max |b| (max over images)."""
    a, b = a[:, 1:].double(), b[:, 1:].double()
    ac, bc = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    r = (ac * bc).sum(1) / (ac.norm(dim=1) * bc.norm(dim=1))
    rel = ((a - b).abs().amax(1) / b.abs().amax(1))
    return {"pearson_mean": float(r.mean()), "pearson_min": float(r.min()), "max_abs_diff_rel": float(rel.max()),
            "max_abs_diff": float((a - b).abs().max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="folder of CIFAR-10 JPEGs (default: random images)")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=0.05, help="gamma of the linear layers (lxt example: 0...1)")
    ap.add_argument("--conv-gamma", type=float, default=0.25)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--out", default="bench/results/attnlrp_lxt.json")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    from vitviz.analysis.attnlrp import attnlrp

    m = model(dtype)
    x = images(a.data, a.n, dtype)
    classes = m(x).argmax(-1)
    g = {"linear_rule": "gamma", "gamma": a.gamma, "attention_rule": "cp"}
    configs = {
        "vitviz default (epsilon, attnlrp)": {},
        "vitviz gamma + cp": g,
        "vitviz gamma + cp, in_proj plain": {**g, "plain": ("*.in_proj",)},
        "vitviz gamma + cp, in_proj and out_proj plain": {**g, "plain": ("*.in_proj", "*.out_proj")},
    }
    ours = {k: attnlrp(m, x, classes, return_tokens=True, **v) for k, v in configs.items()}  # before lxt patches
    theirs, scores = lxt_tokens(m, x, classes, a.gamma, a.conv_gamma)
    rows = {k: compare(v, theirs) for k, v in ours.items()}
    # the remaining difference of the matched configuration: lxt's zennit patch divides the relevance by the
    # input stabilised with 1e-10 (vitviz divides exactly); without that stabiliser the two agree to ~1e-10
    import lxt.efficient.zennit_patches as zp

    zp.stabilize = lambda t, epsilon=0.0: t
    exact, _ = lxt_tokens(m, x, classes, a.gamma, a.conv_gamma)
    matched = "vitviz gamma + cp, in_proj and out_proj plain"
    rows[f"{matched} (lxt without its 1e-10 input stabiliser)"] = compare(ours[matched], exact)
    from importlib.metadata import version

    import torchvision
    import transformers

    result = {
        "model": "torchvision VisionTransformer, 32 px, patch 4, 4 layers, 4 heads, dim 64, random weights",
        "images": a.n, "data": a.data or "random", "dtype": a.dtype, "gamma_linear": a.gamma,
        "read_at": "tokens entering the first encoder block, summed over the embedding dimension",
        "lxt_recipe": "lxt.efficient monkey_patch(vision_transformer) [GELU, LayerNorm identity; CP-LRP in "
                      "MultiheadAttention] + monkey_patch_zennit + zennit Gamma on Linear and Conv2d",
        "comparisons": rows,
        "cause": "nn.MultiheadAttention computes in_proj and out_proj inside F.multi_head_attention_forward from the "
                 "weights, so the recipe's gamma rule never reaches them (plain gradient there); with vitviz told to "
                 "leave both plain the two agree to 1e-7 of the peak, the rest being the 1e-10 stabiliser lxt's zennit patch adds to the input before dividing by it (without it: 1e-10). vitviz's default is the paper's AttnLRP (epsilon rule, "
                 "relevance through the softmax), a different method from the recipe's CP-LRP + gamma.",
        "versions": {"lxt": version("lxt"), "zennit": version("zennit"),
                     "transformers": transformers.__version__, "torch": torch.__version__,
                     "torchvision": torchvision.__version__, "python": platform.python_version()},
        "lxt_scores_equal_logits": bool(torch.allclose(scores, m(x)[torch.arange(len(x)), classes].detach())),
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
