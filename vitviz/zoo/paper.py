"""Tables from the ViT paper shipped with vitviz (``vitviz/zoo/tables``), as pandas DataFrames.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale", ICLR 2021,
arXiv 2010.11929 v2. Provenance of each file: ``vitviz/zoo/tables/README.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

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
    import pandas as pd

    path = PAPER_DATA_DIR / filename
    if not path.is_file():
        have = sorted(p.name for p in PAPER_DATA_DIR.glob("*.csv")) if PAPER_DATA_DIR.is_dir() else []
        raise FileNotFoundError(f"paper table {str(path)!r} not found; {PAPER_DATA_DIR} holds {have}")
    return pd.read_csv(path, na_values=["N/A"])


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
