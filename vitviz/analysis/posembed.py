"""Position-embedding similarity and locality (ViT paper, Fig. 7 center and Fig. 10).

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale", ICLR 2021
(arXiv 2010.11929), Fig. 7 center: for ViT-L/32 (a 7x7 grid), tile ``(r, c)`` shows the cosine similarity between
the position embedding of patch ``(r, c)`` and those of all patches; nearby patches have similar embeddings, and
row/column structure appears. Fig. 10 repeats this for other models; Table 8 ablates the kind of embedding.

Pure compute: torch, numpy and scipy, no matplotlib. Shapes: ``L`` embedding rows (prefix + patches, or patches
only), ``D`` width, ``P = gh * gw`` patch tokens in row-major order, ``(gh, gw, gh, gw)`` similarities with index
``[r, c, i, j] = cos(E_rc, E_ij)``. The grid and the prefix rows are read from ``vitviz.inspect``; nothing here
guesses a grid from ``sqrt(L)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from vitviz.core.families import family_of
from vitviz.core.spec import inspect
from vitviz.core.util import is_int, pair
from vitviz.errors import InputError, NoPositionEmbeddingError

if TYPE_CHECKING:
    pass

__all__ = [
    "NoPositionEmbeddingError", "grid_distances", "patch_pos_embed", "pos_embed_locality", "pos_embed_similarity",
    "sincos_pos_embed", "sincos_vit", "with_sincos_pos_embed",
]

Size = int | tuple[int, int]





def _tensor_rows(
    pos: torch.Tensor, grid_size: Size | None, num_prefix_tokens: int | None
) -> tuple[torch.Tensor, tuple[int, int]]:
    if grid_size is None:
        raise InputError(
            f"a raw position-embedding tensor of shape {tuple(pos.shape)} needs grid_size=(gh, gw): vitviz never "
            "guesses the grid from sqrt(L). Pass the model instead, or grid_size= and num_prefix_tokens="
        )
    gh, gw = pair(grid_size, "grid_size", positive=True)
    if num_prefix_tokens is not None and (not is_int(num_prefix_tokens) or num_prefix_tokens < 0):
        raise InputError(f"num_prefix_tokens={num_prefix_tokens!r} must be an int >= 0, the leading rows (class, "
                         "distillation, register tokens) to drop, or None for L - gh * gw")
    if pos.ndim == 3 and pos.shape[0] == 1:
        pos = pos[0]
    if pos.ndim != 2:
        raise InputError(f"expected a (1, L, D) or (L, D) position embedding, got shape {tuple(pos.shape)}")
    rows = pos.shape[0]
    prefix = rows - gh * gw if num_prefix_tokens is None and rows >= gh * gw else num_prefix_tokens
    if prefix is None or prefix < 0 or rows != prefix + gh * gw:
        raise InputError(
            f"the embedding has {rows} rows but a {gh}x{gw} grid has {gh * gw} patches"
            + (f" and num_prefix_tokens={num_prefix_tokens}" if num_prefix_tokens is not None else "")
            + "; check grid_size= and num_prefix_tokens="
        )
    if num_prefix_tokens is None and prefix >= gh * gw:
        raise InputError(
            f"grid_size={grid_size!r} does not fit the embedding's {rows} rows: it would leave {prefix} leading rows "
            f"as prefix tokens, no fewer than the {gh * gw} patches of a {gh}x{gw} grid. Pass the grid of the table "
            "(the model's input size over its patch size), or num_prefix_tokens= to drop that many rows on purpose"
        )
    rows_out = pos[prefix:]
    if not bool(torch.isfinite(rows_out).all()):  # else a NaN similarity table, and locality NaN as for a flat one
        raise InputError(f"the patch position embeddings ({tuple(rows_out.shape)}) hold "
                         f"{int(torch.isnan(rows_out).sum())} NaN and {int(torch.isinf(rows_out).sum())} infinite "
                         "values, so they have no cosine similarities; check the checkpoint (a diverged run?) or "
                         "replace them (torch.nan_to_num)")
    return rows_out, (gh, gw)


def patch_pos_embed(
    model_or_tensor: nn.Module | torch.Tensor,
    *,
    img_size: Size | None = None,
    grid_size: Size | None = None,
    num_prefix_tokens: int | None = None,
) -> tuple[torch.Tensor, tuple[int, int]]:
    """The position embeddings of the patch tokens, prefix rows dropped, as a float32 CPU tensor.

    Args:
        model_or_tensor: a ViT vitviz can read, or a ``(1, L, D)`` / ``(L, D)`` tensor.
        img_size: models only: resample the embedding to this input size (int or ``(H, W)`` pixels) the way timm
            does (``timm.layers.resample_abs_pos_embed``, bicubic, prefix rows kept), or, for a model that makes
            its table for another size its own way, take the table it adds there (``Family.pos_embed_at``: Hugging
            Face ViTs' own ``interpolate_pos_encoding``, bicubic without antialiasing (ViT, DeiT, CLIP, SigLIP,
            DINOv2, ...; a Hugging Face ViT built for a non-square grid cannot run at another size and is
            refused), native AIMv2's sin-cos table built for the grid, NaFlexViT's row and column tables resampled
            apart); the new grid is ``img_size // patch_size``. It
            must be a multiple of the token stride (``InputError`` otherwise), the rule images follow: other
            sizes give another grid (a hybrid's backbone rounds them its own way).
        grid_size: tensors only: the patch grid ``(gh, gw)`` (or an int for a square grid).
        num_prefix_tokens: tensors only: leading rows to drop (default: ``L - gh * gw``, when that is fewer than
            the ``gh * gw`` patches).

    Returns:
        ``(E, (gh, gw))``: ``E`` of shape ``(gh * gw, D)``, patches in row-major order.

    Raises:
        NoPositionEmbeddingError: the model has no absolute position embedding (``none`` or ``rotary``).
        NotAViTError: the model is not a ViT vitviz can read.
        ValueError: inconsistent shapes or arguments (the message says which).
    """
    if isinstance(model_or_tensor, torch.Tensor | np.ndarray):
        if img_size is not None:
            raise InputError(
                "img_size= needs the model's patch size; pass the model, or resample the tensor first with "
                "timm.layers.resample_abs_pos_embed"
            )
        pos = torch.as_tensor(model_or_tensor).detach().to("cpu", torch.float32)
        return _tensor_rows(pos, grid_size, num_prefix_tokens)
    if grid_size is not None or num_prefix_tokens is not None:
        raise InputError("grid_size= and num_prefix_tokens= are read from the model; pass them only with a tensor")
    spec = inspect(model_or_tensor)
    if not spec.has_abs_pos_embed:
        raise NoPositionEmbeddingError(
            f"{spec.name} has no absolute position embedding (pos_embed_kind={spec.pos_embed_kind!r}), so there is "
            "no table of per-patch embeddings to compare. Fig. 7 center applies to models with a learned or fixed "
            "(sincos) absolute embedding"
        )
    pos = family_of(model_or_tensor).pos_embed(model_or_tensor)
    if pos is None:  # pragma: no cover - the family said there is one
        raise NoPositionEmbeddingError(f"{spec.name}: the family found no position embedding tensor")
    pos = pos.detach().to("cpu", torch.float32)
    if pos.ndim == 2:
        pos = pos[None]
    prefix = spec.num_prefix_tokens if spec.pos_embed_covers_prefix else 0
    grid = spec.grid_size
    if img_size is not None:
        from timm.layers import resample_abs_pos_embed

        (h, w), (sh, sw) = pair(img_size), spec.patch_size
        new_grid = spec.grid_for((h, w))
        if min(new_grid) < 1:
            raise InputError(f"img_size={img_size} is smaller than one {spec.patch_size} patch of {spec.name}")
        if not spec.on_stride((h, w)):  # the rule images follow (vitviz.core.images.check_size)
            raise InputError(
                f"img_size={img_size}: {h}x{w} is not a multiple of the {sh}x{sw} token stride of {spec.name}, "
                "so the grid the model makes is not img_size // stride (a hybrid's backbone rounds its own way); "
                f"pass a multiple, e.g. ({max(1, h // sh) * sh}, {max(1, w // sw) * sw})"
            )
        own = None if new_grid == tuple(grid) else family_of(model_or_tensor).pos_embed_at(model_or_tensor, new_grid)
        if own is not None:  # the model makes its table for another grid its own way (Family.pos_embed_at)
            pos = own.detach().to("cpu", torch.float32)
            pos = pos[None] if pos.ndim == 2 else pos
        else:
            pos = resample_abs_pos_embed(pos, new_size=list(new_grid), old_size=list(grid), num_prefix_tokens=prefix)
        grid = new_grid
    return _tensor_rows(pos, grid, prefix)


def pos_embed_similarity(
    model_or_tensor: nn.Module | torch.Tensor,
    *,
    img_size: Size | None = None,
    grid_size: Size | None = None,
    num_prefix_tokens: int | None = None,
) -> torch.Tensor:
    """Cosine similarity of every patch's position embedding with every other patch's (Fig. 7 center, Fig. 10).

    Prefix rows (class, distillation, register tokens) are dropped when the embedding covers them, as read from
    ``vitviz.inspect``. Fixed (sincos) embeddings work like learned ones.

    Args:
        model_or_tensor: a ViT, or a ``(1, L, D)`` / ``(L, D)`` position-embedding tensor.
        img_size: models only: resample to this input size first (timm's bicubic resampling, or the table the
            model itself makes for that size where it makes it its own way); the grid becomes
            ``img_size // patch_size``; a multiple of the token stride (``patch_pos_embed``).
        grid_size: tensors only: the patch grid ``(gh, gw)``; required for tensors.
        num_prefix_tokens: tensors only: leading rows to drop (default ``L - gh * gw``, refused when that is not
            fewer than the ``gh * gw`` patches: the grid is then most likely not the table's).

    Returns:
        float32 tensor of shape ``(gh, gw, gh, gw)``; ``[r, c, i, j] = cos(E_rc, E_ij)``, symmetric under
        ``(r, c) <-> (i, j)``, in ``[-1, 1]``, with ones on the diagonal (zeros for an all-zero embedding row).

    Raises:
        NoPositionEmbeddingError: the model has no absolute position embedding.
        InputError: a tensor without ``grid_size``, a ``grid_size`` that is not positive, or shapes that do not fit
            (with the default ``num_prefix_tokens``, a grid that leaves as many prefix rows as patches or more).
    """
    emb, (gh, gw) = patch_pos_embed(
        model_or_tensor, img_size=img_size, grid_size=grid_size, num_prefix_tokens=num_prefix_tokens
    )
    unit = torch.nn.functional.normalize(emb.double(), dim=-1)
    sim = (unit @ unit.T).clamp_(-1.0, 1.0)
    return sim.float().reshape(gh, gw, gh, gw)


def grid_distances(grid_size: Size) -> torch.Tensor:
    """Euclidean distance between patch positions, in patches.

    Args:
        grid_size: ``(gh, gw)`` (or an int for a square grid).

    Returns:
        float32 tensor ``(gh, gw, gh, gw)``; ``[r, c, i, j] = sqrt((r - i)**2 + (c - j)**2)``.
    """
    gh, gw = pair(grid_size)
    rr, cc = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64),
                            indexing="ij")
    coords = torch.stack([rr.flatten(), cc.flatten()], dim=-1)  # (P, 2)
    return torch.cdist(coords, coords).float().reshape(gh, gw, gh, gw)


def pos_embed_locality(
    model_or_tensor: nn.Module | torch.Tensor,
    *,
    img_size: Size | None = None,
    grid_size: Size | None = None,
    num_prefix_tokens: int | None = None,
) -> float:
    """How much nearer patches have more similar position embeddings: a rank correlation.

    Spearman's rho between the cosine similarity of two patches' embeddings and the negative Euclidean distance
    of the patches on the grid, over all unordered pairs of distinct patches. Near 1 when similarity falls
    monotonically with distance (the structure of Fig. 7 center), near 0 for an unstructured (random) table.

    Args:
        model_or_tensor, img_size, grid_size, num_prefix_tokens: as for ``pos_embed_similarity``.

    Returns:
        rho in ``[-1, 1]`` (``nan`` when all similarities are equal).

    Raises:
        NoPositionEmbeddingError: the model has no absolute position embedding.
        ValueError: the grid has a single patch, so there are no pairs.
    """
    from scipy.stats import spearmanr

    sim = pos_embed_similarity(
        model_or_tensor, img_size=img_size, grid_size=grid_size, num_prefix_tokens=num_prefix_tokens
    )
    gh, gw = sim.shape[:2]
    if gh * gw < 2:
        raise InputError(f"a {gh}x{gw} grid has no pairs of distinct patches to correlate")
    iu = np.triu_indices(gh * gw, k=1)
    # rounded so that float noise does not break ties between equally similar pairs (e.g. a sincos table)
    s = np.round(sim.reshape(gh * gw, gh * gw).numpy()[iu].astype(np.float64), 6)
    d = grid_distances((gh, gw)).reshape(gh * gw, gh * gw).numpy()[iu]
    if np.ptp(s) == 0:
        return float("nan")
    return float(spearmanr(s, -d).statistic)


def sincos_pos_embed(
    grid_size: Size, dim: int, *, num_prefix_tokens: int = 0, temperature: float = 10000.0
) -> torch.Tensor:
    """The fixed 2-D sine-cosine position embedding (timm ``build_sincos2d_pos_embed``, as in MoCo v3 / MAE).

    Args:
        grid_size: ``(gh, gw)`` patch grid.
        dim: embedding width ``D``, a multiple of 4.
        num_prefix_tokens: zero rows to put first, for prefix tokens the embedding covers.
        temperature: the frequency base.

    Returns:
        float32 tensor ``(1, num_prefix_tokens + gh * gw, D)``, patches in row-major order.
    """
    from timm.layers import build_sincos2d_pos_embed

    if dim % 4:
        raise InputError(f"a 2-D sincos embedding needs a width divisible by 4, got {dim}")
    grid = build_sincos2d_pos_embed(list(pair(grid_size)), dim=dim, temperature=temperature)
    return torch.cat([torch.zeros(num_prefix_tokens, dim), grid], dim=0)[None]


def with_sincos_pos_embed(model: nn.Module) -> nn.Module:
    """Replace the model's learned position embedding by a fixed 2-D sincos one, in place; returns ``model``.

    The new ``pos_embed`` is a frozen ``nn.Parameter`` (``requires_grad=False``), so ``vitviz.inspect`` reports
    ``pos_embed_kind == "sincos"``; prefix rows (when the embedding covers them) are zeros.

    Args:
        model: a timm-style ViT with an ``nn.Parameter`` ``pos_embed`` attribute of shape ``(1, L, D)``.

    Returns:
        the same model.
    """
    spec = inspect(model)
    old = getattr(model, "pos_embed", None)
    if not isinstance(old, nn.Parameter):
        raise NoPositionEmbeddingError(
            f"{spec.name} has no pos_embed parameter to replace (found {type(old).__name__}); build it with a "
            "learned absolute embedding (timm pos_embed='learn')"
        )
    prefix = spec.num_prefix_tokens if spec.pos_embed_covers_prefix else 0
    new = sincos_pos_embed(spec.grid_size, old.shape[-1], num_prefix_tokens=prefix)
    model.pos_embed = nn.Parameter(new.to(old.device, old.dtype), requires_grad=False)
    return model


def sincos_vit(name: str = "vit_tiny_patch16_224", **kwargs: Any) -> nn.Module:
    """A timm ViT (random weights) with a fixed 2-D sincos position embedding, in eval mode.

    Args:
        name: timm model name.
        **kwargs: passed to ``timm.create_model`` (e.g. ``img_size=``); ``pretrained`` is always False.

    Returns:
        the model; ``vitviz.inspect(model).pos_embed_kind == "sincos"``.
    """
    import timm

    kwargs.pop("pretrained", None)
    return with_sincos_pos_embed(timm.create_model(name, pretrained=False, **kwargs)).eval()
