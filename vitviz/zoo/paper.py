"""Tables from the ViT paper shipped with vitviz (``vitviz/zoo/tables``), as pandas DataFrames.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale", ICLR 2021,
arXiv 2010.11929 v2. Provenance of each file: ``vitviz/zoo/tables/README.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from vitviz.errors import DataNotFoundError

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

PAPER_DATA_DIR = Path(__file__).resolve().parent / "tables"

# vitviz pos_embed_kind -> the row of Table 8 that trained this kind of embedding (sincos and rotary: none)
TABLE8_ROW_FOR_KIND = {
    "none": "No Pos. Emb.",
    "learned": "1-D Pos. Emb.",
    "learned-2d": "2-D Pos. Emb.",
}


def paper_table(filename: str) -> pd.DataFrame:
    """Read ``vitviz/zoo/tables/<filename>``; ``N/A`` cells become ``NaN``.

    Raises:
        FileNotFoundError: the file is not there (the message lists the files that are).
    """
    from vitviz.core.io import read_csv_exact

    path = PAPER_DATA_DIR / filename
    if not path.is_file():
        have = sorted(p.name for p in PAPER_DATA_DIR.glob("*.csv")) if PAPER_DATA_DIR.is_dir() else []
        raise DataNotFoundError(f"paper table {str(path)!r} not found; {PAPER_DATA_DIR} holds {have}")
    return read_csv_exact(path, na_values=["N/A"])


def posemb_ablation() -> pd.DataFrame:
    """Table 8: position-embedding ablation, ViT-B/16, ImageNet 5-shot linear accuracy (fraction in ``[0, 1]``).

    Returns:
        DataFrame with columns ``pos_emb`` (``"No Pos. Emb."``, ``"1-D Pos. Emb."``, ``"2-D Pos. Emb."``,
        ``"Rel. Pos. Emb."``), ``default_stem``, ``every_layer``, ``every_layer_shared`` (``NaN`` where the paper
        has N/A).
    """
    return paper_table("vit_table8_posemb_ablation.csv")


FAMILIES = ("Transformer (ViT)", "ResNet (BiT)", "Hybrid")
AVG5_DATASETS = ("imagenet", "cifar10", "cifar100", "pets", "flowers")


def paper_results() -> pd.DataFrame:
    """Table 6: the scaling study, 18 models (ViT, ResNet/BiT, hybrids) with transfer accuracy and compute.

    Returns:
        DataFrame, one row per model and pre-training length: ``family``, ``model``, ``epochs`` (JFT-300M
        pre-training epochs), accuracies in % (``imagenet``, ``imagenet_real``, ``cifar10``, ``cifar100``,
        ``pets``, ``flowers``), ``avg5`` (mean of ImageNet, CIFAR-10, CIFAR-100, Pets and Flowers, the paper's
        "Average-5", as its Table 7 defines it; the paper prints no such column) and ``exaflops`` (total
        pre-training compute).
    """
    df = paper_table("vit_table6_scaling.csv")
    df["avg5"] = df[list(AVG5_DATASETS)].mean(axis=1)
    return df.drop(columns=["avg5_derived"])


def locality_table(models: Mapping[str, nn.Module]) -> pd.DataFrame:
    """Locality of each model's position embedding beside the paper's Table 8 row for its kind of embedding.

    Args:
        models: label -> model.

    Returns:
        DataFrame, one row per model: ``model``, ``pos_embed_kind``, ``grid`` (``"ghxgw"``), ``locality``
        (``pos_embed_locality``; ``nan`` without an absolute embedding), ``paper_row`` (the Table 8 row of this
        kind; missing (NA) when the paper has none) and ``paper_5shot`` (that row's ImageNet 5-shot linear accuracy of ViT-B/16, default
        stem; ``nan`` when the paper has no such row).
    """
    import pandas as pd

    from vitviz.analysis.posembed import pos_embed_locality
    from vitviz.core.spec import inspect

    paper = posemb_ablation().set_index("pos_emb")["default_stem"]
    rows = []
    for label, model in models.items():
        spec = inspect(model)
        rho = pos_embed_locality(model) if spec.has_abs_pos_embed else float("nan")
        paper_row = TABLE8_ROW_FOR_KIND.get(spec.pos_embed_kind)
        rows.append({
            "model": label,
            "pos_embed_kind": spec.pos_embed_kind,
            "grid": f"{spec.grid_size[0]}x{spec.grid_size[1]}",
            "locality": rho,
            "paper_row": paper_row,
            "paper_5shot": float(paper[paper_row]) if paper_row in paper.index else float("nan"),
        })
    return pd.DataFrame(rows)


def model_variants() -> pd.DataFrame:
    """Table 1: ViT-Base/Large/Huge (``model``, ``layers``, ``hidden_size_D``, ``mlp_size``, ``heads``,
    ``params``)."""
    return paper_table("vit_table1_variants.csv")


def scale_comparison(models: Mapping[str, nn.Module], variant: str = "ViT-Large", img_size: int = 224,
                     patch_size: int = 16) -> pd.DataFrame:
    """The paper's model (a Table 1 variant at ``img_size`` px with ``patch_size`` px patches; Fig. 6, 7 and 11
    use ViT-L/16 at 224 px) beside the given models, read with ``vitviz.inspect``: image size, token stride,
    grid, layers, heads, width, parameters, and the largest and the uniform-attention mean distance between patch
    centres in pixels (what "global" means on that grid).

    Returns:
        DataFrame, one row per model, the paper's first.
    """
    import pandas as pd

    from vitviz.analysis.distance import patch_distance_matrix
    from vitviz.core.spec import inspect

    row = model_variants().set_index("model").loc[variant]
    grid = (img_size // patch_size, img_size // patch_size)
    d = patch_distance_matrix(grid, patch_size)
    rows = [{"model": f"{variant} /{patch_size} (paper)", "image_px": f"{img_size}x{img_size}",
             "stride_px": patch_size, "grid": f"{grid[0]}x{grid[1]}", "layers": int(row["layers"]),
             "heads": int(row["heads"]), "width": int(row["hidden_size_D"]), "params": row["params"],
             "max_distance_px": round(float(d.max()), 1), "uniform_distance_px": round(float(d.mean()), 1)}]
    for label, model in models.items():
        s = inspect(model)
        d = patch_distance_matrix(s.grid_size, s.patch_size)
        rows.append({"model": label, "image_px": f"{s.img_size[0]}x{s.img_size[1]}",
                     "stride_px": s.patch_size[0] if s.patch_size[0] == s.patch_size[1] else s.patch_size,
                     "grid": f"{s.grid_size[0]}x{s.grid_size[1]}", "layers": s.depth, "heads": s.num_heads,
                     "width": s.embed_dim, "params": f"{s.params.get('total', 0) / 1e6:.2f}M",
                     "max_distance_px": round(float(d.max()), 1), "uniform_distance_px": round(float(d.mean()), 1)})
    return pd.DataFrame(rows)
