"""Mean attention distance per head and layer (ViT paper Fig. 7 right and Fig. 11, App. D.7).

Dosovitskiy et al., ICLR 2021 (arXiv 2010.11929): for each head, the distance in pixels between a query patch and
every other patch, weighted by the attention weight, averaged over queries and over 128 images, the analogue of a
CNN's receptive field size. Here queries and keys are the patch tokens only: prefix keys (class, distillation,
register tokens) are dropped and each query's remaining weights renormalised, so the distance is that of the
attention a query pays to patches. The paper does not say how it treats the class token (its code for the figure is
not published). The widely copied implementation (the Keras example "Investigating Vision Transformer
representations", probing-vits) slices the prefix rows and columns away without renormalising: each query's weighted
sum is then scaled by its weight on patch keys (one minus that on the prefix tokens), and a head that puts half its
attention on the class token comes out at half the distance (``tests/test_distance.py`` pins the difference with
such a head). A query that puts no measurable weight on patch keys (less than float32's smallest normal number,
1.2e-38: it attends to prefix tokens alone) has no distance: it is left out of its image's mean over queries, rather
than counted as 0 px (which would make its head look local); an image in which every patch query of a head is such
gives NaN for that head. Patch centres sit at ``((r + 0.5) sh, (c + 0.5) sw)`` pixels with ``(sh, sw)`` the token
stride from ``vitviz.inspect`` (16 for ViT-B/16, 32 for a hybrid whose backbone reduces 16x before a 2x2 patch), so
non-square grids and strides are exact.

Shapes: ``B`` batch, ``L`` layers, ``H`` heads, ``N`` tokens, ``P = gh * gw`` patch tokens.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from vitviz.core.batching import iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.capture import HeadMaps, capture_attention
from vitviz.core.contexts import recording, to_host
from vitviz.core.datasets import (
    RunningReduction,
    autocast_context,
    autocast_dtype,
    is_dataset_source,
    reduce_dataset,
)
from vitviz.core.graphs import graphable
from vitviz.core.images import Images
from vitviz.core.kernels.forward_lse import use_forward_lse
from vitviz.core.spec import ViTSpec, inspect
from vitviz.core.util import is_int, is_number, pair
from vitviz.errors import CaptureError, InputError, InputTypeError

__all__ = [
    "DistanceReducer", "DistanceReduction", "TokenLayout", "attention_distance_from_maps", "distance_by_block",
    "distance_observations", "mean_attention_distance", "patch_distance_matrix", "per_image_attention_distance",
]

Pair = int | tuple[int, int]


class TokenLayout(NamedTuple):
    """The part of a ``ViTSpec`` the distance needs: grid ``(gh, gw)``, stride ``(sh, sw)`` px, prefix count."""

    grid_size: tuple[int, int]
    patch_size: tuple[int, int]
    num_prefix_tokens: int = 1




def _layout(spec_or_layout: ViTSpec | TokenLayout | Any) -> TokenLayout:
    """The layout of ``spec_or_layout``. A ``ViTSpec`` of a model that takes any input size (``dynamic_img_size``)
    is refused: its grid follows each input, its built grid says nothing of the maps' (a 32x48 and a 48x32 input
    make as many tokens, on transposed grids), and ``N`` alone cannot tell them apart."""
    if isinstance(spec_or_layout, ViTSpec) and spec_or_layout.dynamic_img_size:
        (gh, gw) = pair(spec_or_layout.grid_size)
        raise InputError(
            f"spec_or_layout: {spec_or_layout.name} takes inputs of any size (dynamic_img_size), so its patch grid "
            f"follows each input and its built {gh}x{gw} grid need not be the maps'; pass the layout of the images "
            "the maps came from: vitviz.analysis.distance.TokenLayout(spec.grid_for_input(x), spec.patch_size, "
            "spec.num_prefix_tokens)")
    try:
        prefix = spec_or_layout.num_prefix_tokens  # not int(): that read 1.5 as 1 and True as 1
        return TokenLayout(pair(spec_or_layout.grid_size), pair(spec_or_layout.patch_size),
                           int(prefix) if is_int(prefix) else prefix)  # per_image_attention_distance refuses the rest
    except AttributeError:
        raise InputTypeError("expected a ViTSpec (vitviz.inspect(model)) or a TokenLayout(grid_size, patch_size, "
                        f"num_prefix_tokens), got {type(spec_or_layout).__name__}") from None


def patch_distance_matrix(grid_size: Pair, patch_size: Pair, *, device: torch.device | str | None = None,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches.

    Args:
        grid_size: ``(gh, gw)`` patches (an int for square grids).
        patch_size: ``(sh, sw)`` token stride in pixels along h and w (an int for square strides).

    Returns:
        ``(P, P)`` with ``P = gh * gw``, patches in row-major order (as tokens are laid out).
    """
    (gh, gw), (sh, sw) = pair(grid_size, "grid_size", positive=True), pair(patch_size, "patch_size", positive=True)
    # a distance depends only on the row and column offsets: a gh x gw table of square roots, correctly rounded,
    # gathered into the matrix on the target device (on a GPU no CPU work and no copy: a call recorded as a CUDA
    # graph forms it in the recording). On the CPU the table is Python's math.sqrt: torch's float64 sqrt there goes
    # through MKL, whose AVX-512 code path gives sqrt(2048) 1 ulp low; elsewhere torch's (IEEE sqrt on CUDA). So
    # the values are the same on every machine and device.
    if torch.device(device if device is not None else "cpu").type == "cpu":
        table = torch.tensor([[math.sqrt((dy * sh) ** 2 + (dx * sw) ** 2) for dx in range(gw)] for dy in range(gh)],
                             dtype=torch.float64)
    else:
        dy = torch.arange(gh, dtype=torch.float64, device=device) * sh
        dx = torch.arange(gw, dtype=torch.float64, device=device) * sw
        table = torch.sqrt(dy[:, None] ** 2 + dx[None] ** 2)  # squares of integers and their sums: exact
    patch = torch.arange(gh * gw, device=device, dtype=torch.int32)  # int32 offsets: half the memory of int64
    rows, cols = patch // gw, patch % gw
    d = table[(rows[:, None] - rows[None]).abs(), (cols[:, None] - cols[None]).abs()]
    return d.to(dtype=dtype)


def per_image_attention_distance(attn: torch.Tensor | HeadMaps, distances: torch.Tensor,
                                 num_prefix_tokens: int) -> torch.Tensor:
    """Mean attention distance of each image and head: ``(B, H, N, N)`` maps -> ``(B, H)`` pixels.

    Args:
        attn: post-softmax attention, rows over keys; or a ``HeadMaps`` (``capture_attention(heads="stream")``).
        distances: ``(P, P)`` from ``patch_distance_matrix`` for this grid.
        num_prefix_tokens: leading tokens dropped from queries and keys.

    A query with no measurable weight on patch keys (on prefix tokens alone) is left out of its image's mean; NaN
    for an image and head none of whose queries is kept (module docstring).
    """
    p = num_prefix_tokens
    if not isinstance(attn, (torch.Tensor, HeadMaps)):
        raise InputTypeError(f"attn: expected a (B, H, N, N) torch.Tensor, got {type(attn).__name__}; pass "
                             "torch.as_tensor(a) for a NumPy array")
    if not is_int(p) or p < 0:
        raise InputError(f"num_prefix_tokens={p!r} must be an int >= 0, the leading tokens (class, distillation, "
                         "register) before the patches; read it from vitviz.inspect(model).num_prefix_tokens")
    if attn.ndim == 4 and attn.shape[-2] != attn.shape[-1]:
        raise InputError(f"attn: expected square (B, H, N, N) maps, every token's query row over every key, got "
                         f"{tuple(attn.shape)}; pass the layer's whole map")
    if attn.ndim != 4 or attn.shape[-1] - p != distances.shape[0]:
        raise InputError(f"attention of shape {tuple(attn.shape)} does not fit {p} prefix tokens and "
                         f"{distances.shape[0]} patches; expected (B, H, {p + distances.shape[0]}, "
                         f"{p + distances.shape[0]})")
    d = distances.to(device=attn.device, dtype=torch.float32)
    tiny = torch.finfo(torch.float32).tiny
    if isinstance(attn, torch.Tensor) and attn.requires_grad and torch.is_grad_enabled():
        a = attn[:, :, p:, p:]  # differentiable (out= buffers are not)
        weight = a.sum(dim=-1, dtype=torch.float32)
        # the clamp keeps the gradient of a query left out finite (where's other branch is differentiated too)
        per_query = (a.float() * d).sum(dim=-1) / weight.clamp_min(tiny)
    else:  # one head at a time (HeadMaps.distance_sums; the stream probe's kernel on CUDA, vitviz.core.kernels)
        heads = attn if isinstance(attn, HeadMaps) else HeadMaps.of(attn)
        weighted, weight = heads.distance_sums(d, p)
        per_query = weighted / weight
    # a query with no measurable weight on patch keys (all on prefix tokens: 0, or below the smallest normal float,
    # where the division loses its digits) has no distance: left out of the mean over queries, not counted as 0 px.
    # sum / count, as CPU's mean divides its sum: with every query kept, the mean's bits
    kept = weight >= tiny
    return torch.where(kept, per_query, 0.0).sum(dim=-1) / kept.sum(dim=-1)


def attention_distance_from_maps(attn: torch.Tensor, spec_or_layout: ViTSpec | TokenLayout) -> torch.Tensor:
    """Mean attention distance of one layer's maps, averaged over queries and images.

    Args:
        attn: ``(B, H, N, N)`` (or ``(H, N, N)``) post-softmax attention.
        spec_or_layout: ``vitviz.inspect(model)``, or ``TokenLayout(grid_size, patch_size, num_prefix_tokens)``;
            for a model that takes any input size (``dynamic_img_size``) the layout of the maps' input,
            ``TokenLayout(spec.grid_for_input(x), spec.patch_size, spec.num_prefix_tokens)`` (its ``ViTSpec`` is
            refused: the grid follows the input, and ``N`` alone does not tell a grid from its transpose).

    Returns:
        ``(H,)`` float32 distances in pixels.

    Raises:
        InputTypeError: ``attn`` is not a torch.Tensor (``torch.as_tensor`` a NumPy array first).
        InputError: maps that are not square ``(B, H, N, N)`` with ``N`` the layout's prefix and patch tokens; a
            ``num_prefix_tokens`` that is not an int >= 0; a grid or stride below 1.
    """
    lay = _layout(spec_or_layout)
    if not isinstance(attn, torch.Tensor):
        raise InputTypeError(f"attn: expected a (B, H, N, N) or (H, N, N) torch.Tensor, got {type(attn).__name__}; "
                             "pass torch.as_tensor(a) for a NumPy array")
    attn = attn.unsqueeze(0) if attn.ndim == 3 else attn
    d = patch_distance_matrix(lay.grid_size, lay.patch_size, device=attn.device)
    return per_image_attention_distance(attn, d, lay.num_prefix_tokens).mean(dim=0)


def require_softmax_maps(spec: ViTSpec) -> None:
    """Refuse models whose maps are not softmax distributions (``UnsupportedModelError``), on every input path."""
    spec.require_maps("mean_attention_distance", ("softmax",),
                      hint="the distance averages each patch query's attention distribution over patch keys")


class DistanceReducer:
    """Streaming mean attention distance: usable as ``capture_attention(on_layer=reducer, store=False)``.

    Each layer's ``(B, H, N, N)`` map is reduced to per-image sums as it is produced; ``result()`` is ``(L, H)``.
    Set ``distances`` (``patch_distance_matrix`` of the current grid) before each forward pass.

    The running sums live on ``device`` (give the model's): sums made on the CPU move to the maps' device at the
    first layer, inside the forward, where on a GPU a copy from the CPU waits for every kernel queued so far.

    A forward that raises part-way (out of memory in a late block) has added its first layers to the sums:
    ``on_abort`` (which ``capture_attention`` calls) takes that pass's additions back out, so a retry inside the
    same capture counts each image once.
    """

    def __init__(self, num_layers: int, num_heads: int, num_prefix_tokens: int,
                 distances: torch.Tensor | None = None, device: torch.device | str | None = None) -> None:
        self.num_prefix_tokens = num_prefix_tokens
        self.distances = distances
        self.sums = torch.zeros(num_layers, num_heads, dtype=torch.float64, device=device)
        self.counts = torch.zeros(num_layers, dtype=torch.float64, device=device)
        self.reduced: set[int] = set()  # the layers reduced by this object (known on the host)
        self._pass: dict[int, torch.Tensor] = {}  # what the running pass added to each layer's sums (for on_abort)
        self._pass_images = 0

    def __call__(self, position: int, attn: torch.Tensor | HeadMaps) -> None:
        if self.distances is None:
            raise CaptureError("DistanceReducer.distances is not set (patch_distance_matrix of the grid)")
        per_image = per_image_attention_distance(attn, self.distances, self.num_prefix_tokens)
        if per_image.shape[1] != self.sums.shape[1]:
            raise InputError(f"layer {position} has {per_image.shape[1]} heads, expected {self.sums.shape[1]}")
        if self.sums.device != per_image.device:  # the running sums live where the maps are: no sync per layer
            self.sums, self.counts = self.sums.to(per_image.device), self.counts.to(per_image.device)
        # in place on the rows: ``a[i] += b`` would also write the row back onto itself (a copy per layer, and on a
        # GPU a launch); float32 added into float64 is cast first, the bits of ``.double()`` before the add
        if position == 0 or position in self._pass:  # a new pass
            self._pass = {}
        self._pass[position] = added = per_image.sum(dim=0)
        self._pass_images = per_image.shape[0]
        self.sums[position].add_(added)
        self.counts[position].add_(per_image.shape[0])
        self.reduced.add(position)

    def on_abort(self, layers: int) -> None:
        """Take back what the pass that raised added (``layers`` of them: ``capture_attention``'s ``on_abort``)."""
        for position, added in self._pass.items():
            self.sums[position].sub_(added)
            self.counts[position].sub_(self._pass_images)
        self._pass = {}

    def result(self) -> torch.Tensor:
        """``(L, H)`` float32 mean distances in pixels (averaged over queries, then images), on the CPU."""
        if recording():  # a GraphedCall's recording: the layers reduced counted on the host, the result copied after
            if len(self.reduced) < self.counts.shape[0]:  # each replay (float64 division: the same bits on any device)
                raise CaptureError("no attention was reduced for some layers; did the forward pass run?")
            return to_host((self.sums / self.counts[:, None]).float())
        sums, counts = self.sums.cpu(), self.counts.cpu()
        if not bool((counts > 0).all()):
            raise CaptureError("no attention was reduced for some layers; did the forward pass run?")
        return (sums / counts[:, None]).float()


class DistanceReduction(RunningReduction):
    """Mean attention distance as running sums over a dataset (for ``vitviz.core.datasets.reduce_dataset``).

    ``sums["distance"]`` ``(L, H)`` adds each image's per-head distance, ``sums["images"]`` ``(L,)`` the images
    seen per layer; ``result()`` is their ratio, ``(L, H)`` pixels, exactly what ``mean_attention_distance``
    returns for a batch.
    """

    name = "mean_attention_distance"
    version = 2  # 2: a query on prefix tokens alone is left out of its image's mean (counted as 0 px in 1)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.spec = inspect(model)
        require_softmax_maps(self.spec)  # every input path builds this reduction: the check runs for each
        layers = len(self.spec.attention_modules)
        param = next(model.parameters(), None)
        self.reducer = DistanceReducer(layers, self.spec.num_heads, self.spec.num_prefix_tokens,
                                       device=None if param is None else param.device)
        self.sums = {"distance": self.reducer.sums, "images": self.reducer.counts}
        self._cache: dict[tuple[int, int], torch.Tensor] = {}

    def fingerprint(self) -> dict[str, Any]:
        return {"reduction": self.name, "vit": self.spec.name, "layers": len(self.spec.attention_modules),
                "heads": self.spec.num_heads}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.reducer.sums, self.reducer.counts = self.sums["distance"], self.sums["images"]

    def update(self, model: nn.Module, x: torch.Tensor, target: Any = None) -> None:
        grid = self.spec.grid_for_input(x)
        if grid not in self._cache:
            self._cache[grid] = patch_distance_matrix(grid, self.spec.patch_size, device=x.device)
        self.reducer.distances = self._cache[grid]
        with _stream_capture(model, self.reducer):
            model(x)
        self.sums = {"distance": self.reducer.sums, "images": self.reducer.counts}

    def result(self) -> torch.Tensor:
        self.reducer.sums, self.reducer.counts = self.sums["distance"], self.sums["images"]
        return self.reducer.result()


@contextlib.contextmanager
def _stream_capture(model: nn.Module, reducer: DistanceReducer) -> Iterator[None]:
    """The stream capture the distance reads each layer through, without the forward's log-sum-exp
    (``kernels.forward_lse``, on by default for float32 CUDA calls): ``distance_sums`` makes its one pass over the
    keys with a softmax of its own and never reads it, so taking it would cost the host the mode's work on every
    layer (and a check per module) for nothing."""
    with use_forward_lse(False), capture_attention(model, on_layer=reducer, store=False, heads="stream"):
        yield


@graphable
@in_eval_mode
def mean_attention_distance(
    model: nn.Module,
    images: Images | Any,
    *,
    batch_size: int = 32,
    progress: bool = False,
    autocast: torch.dtype | bool | None = None,
    **dataset_options: Any,
) -> torch.Tensor:
    """Mean attention distance per head and layer, in input pixels (ViT Fig. 7 right, Fig. 11; App. D.7).

    The paper averages over 128 images. Each layer is reduced while the forward runs, so only one layer's maps
    exist at a time; over a dataset only the running ``(L, H)`` sums are kept.

    Args:
        model: any ViT ``vitviz.inspect`` reads (hybrids use their token stride, e.g. 32 px).
        images: a normalised ``(B, 3, H, W)`` tensor, or PIL images / arrays / paths; or a whole dataset: a
            folder of images, a ``torch.utils.data.Dataset`` or a ``DataLoader`` (also under ``torchrun``).
        batch_size: images per forward pass.
        progress: show a progress bar over images.
        autocast: ``torch.autocast`` dtype, the same rule on every input path
            (``vitviz.core.datasets.autocast_dtype``): by default bfloat16 on CUDA and none on the CPU; ``False``
            for none; a dtype is used on any device.
        **dataset_options: for a dataset, the options of ``vitviz.core.datasets.reduce_dataset``
            (``num_workers``, ``pin_memory``, ``checkpoint``, ``checkpoint_every``).

    Returns:
        ``(L, H)`` float32 on the CPU: for each layer and head, the attention-weighted distance between query and
        key patch centres, averaged over queries and images. ``L`` counts attention modules
        (``spec.attention_modules``): a parallel block's branches are separate rows. A query that attends to
        prefix tokens alone is left out of its image's mean; NaN where, in some image, every patch query of a head
        does (module docstring).

    Raises:
        UnsupportedModelError: a layer's maps are not softmax distributions (CaiT's talking-heads and
            class-attention layers, differential attention; ``ViTSpec.attention_maps``).
    """
    if is_dataset_source(images):  # DistanceReduction runs the same map-kind check as the batch path below
        return reduce_dataset(model, images, DistanceReduction(model), batch_size=batch_size, progress=progress,
                              autocast=autocast, **dataset_options).result()
    if dataset_options:
        raise InputTypeError(f"{sorted(dataset_options)} apply to a folder, Dataset or DataLoader, not to a batch")
    spec = inspect(model)
    require_softmax_maps(spec)
    device = next(model.parameters()).device
    amp = autocast_dtype(autocast, device)
    layers = len(spec.attention_modules)
    reducer = DistanceReducer(layers, spec.num_heads, spec.num_prefix_tokens, device=device)
    cache: dict[tuple[int, int], torch.Tensor] = {}
    for x in iter_batches(model, images, batch_size, progress=progress, desc="attention distance"):
        grid = spec.grid_for_input(x)
        if grid not in cache:
            cache[grid] = patch_distance_matrix(grid, spec.patch_size, device=x.device)
        reducer.distances = cache[grid]
        with torch.no_grad(), autocast_context(amp, device), _stream_capture(model, reducer):
            model(x)
    return reducer.result()


def distance_by_block(distances: torch.Tensor, blocks: tuple[int, ...] | list[int]) -> tuple[torch.Tensor, int]:
    """``mean_attention_distance``'s rows, one per attention module, as one row per residual block.

    A parallel block (timm's ``ParallelThingsBlock``, Touvron et al., "Three things everyone should know about
    Vision Transformers", ECCV 2022) runs several attention modules side by side at one depth; the paper's x axis,
    "Network depth (layer)", counts blocks, so a block's heads are one layer's, its branches' heads side by side.

    Args:
        distances: ``(M, H)`` distances of ``M`` attention modules.
        blocks: the residual block of each module (``ViTSpec.attention_blocks``), ascending.

    Returns:
        ``(table, branches)``: ``(depth, branches * H)``, each block's first branch's heads, then its second's, ...;
        ``distances`` itself and 1 when every block has one module (or ``blocks`` is empty).

    Raises:
        InputError: ``blocks`` does not give one block per row, or the blocks have unequal numbers of branches.
    """
    return _by_block(distances, blocks, "blocks")


def _by_block(distances: torch.Tensor, blocks: tuple[int, ...] | list[int], arg: str) -> tuple[torch.Tensor, int]:
    """``distance_by_block``, its errors naming the argument ``arg`` the caller was given ``blocks`` as."""
    if not blocks:
        return distances, 1
    if len(blocks) != distances.shape[0]:
        raise InputError(f"{arg}: {len(blocks)} block indices for {distances.shape[0]} rows of distances; pass "
                         "ViTSpec.attention_blocks of the model the distances came from")
    counts = [list(blocks).count(b) for b in sorted(set(blocks))]
    if len(set(counts)) > 1 or list(blocks) != sorted(blocks):
        raise InputError(f"{arg}={tuple(blocks)}: the blocks have {counts} attention modules each, so their heads "
                         "make no one table; plot the (modules, heads) distances as they are")
    return distances.reshape(len(counts), -1), counts[0]


def distance_observations(vit: torch.Tensor, hybrid: torch.Tensor | None = None, *, early_layers: int = 2,
                          min_effect: float = 0.1, uniform_px: float | tuple[float, float] | None = None,
                          blocks: tuple[int, ...] | None = None,
                          hybrid_blocks: tuple[int, ...] | None = None) -> Any:
    """Check the paper's three observations on ``(L, H)`` distances; a pandas DataFrame, one row per check.

    A layer is a row of the table: ``mean_attention_distance`` gives one per attention module, so for a model with
    parallel blocks (timm's ``ParallelThingsBlock``: several attention modules per block) pass ``blocks=`` (its
    ``ViTSpec.attention_blocks``) for the layers to be its blocks, each with all its branches' heads
    (``distance_by_block``); without it the first ``early_layers`` rows are the first block's branches.

    An observation ``holds`` only when the effect exceeds ``min_effect`` (a fraction), so near-uniform attention
    (random weights) holds none of them:

    - distance grows with depth: the head mean of the last layer exceeds that of the first by ``min_effect``
      (Spearman's rho of layer index against head-mean distance is reported too);
    - early layers mix local and global heads: the spread between the most and the least local head, averaged
      over the first ``early_layers`` layers, exceeds that of the last ``early_layers`` layers and a threshold.
      With ``uniform_px`` (the distance uniform attention gives on the model's grid, the mean distance between
      patch centres: ``scale_comparison``'s ``uniform_distance_px``) the threshold is half of it, so a model
      holds it only when a head of its first layers sits far below the uniform value while another sits near it,
      as in the paper's Fig. 7 (right), where the first layers' heads span from a few pixels to about the
      uniform value; a spread of a few pixels among heads that are all near uniform does not hold. Without
      ``uniform_px`` the threshold is ``min_effect`` times the mean distance, and ``measured`` says so: a weaker
      test, which such near-uniform heads can pass;
    - hybrids attend less locally early: the hybrid's most local head in the first ``early_layers`` layers lies
      ``min_effect`` farther than the ViT's (meaningful for models of equal image size).

    Args:
        vit: ``(L, H)`` distances of the ViT; hybrid: those of the hybrid (optional).
        early_layers: how many first (and last) layers the spread compares.
        min_effect: the smallest effect, as a fraction, that counts.
        uniform_px: the uniform-attention distance in pixels of the ViT's grid, or ``(vit, hybrid)`` for two.
        blocks, hybrid_blocks: the residual block of each row of ``vit`` / ``hybrid`` (``ViTSpec.attention_blocks``;
            needed for parallel blocks only): the checks then count blocks as layers.

    Returns:
        DataFrame with columns ``observation``, ``model``, ``measured`` (in words) and ``holds``.

    Raises:
        InputError: ``uniform_px`` not a positive number, or a pair where there is no hybrid; distances that are
            not a finite ``(L, H)`` table; ``early_layers`` not an int in ``[1, L // 2]`` (the first and the last
            ``early_layers`` layers would overlap); ``min_effect`` negative; ``blocks`` (or ``hybrid_blocks``, named
            so) that do not give one block per row, or blocks of unequal branch counts (``distance_by_block``).
    """
    import pandas as pd
    from scipy.stats import spearmanr

    models = {"ViT": vit} if hybrid is None else {"ViT": vit, "Hybrid": hybrid}
    uniform = _uniform_by_model(uniform_px, list(models))
    if not is_number(min_effect) or not 0 <= min_effect < math.inf:
        raise InputError(f"min_effect={min_effect!r} must be a number >= 0, the smallest effect that counts as a "
                         "fraction (e.g. 0.1)")
    for name, d in list(models.items()):
        arg = "vit" if name == "ViT" else "hybrid"
        d = torch.as_tensor(d)
        if d.ndim == 2:  # else refused below
            d = _by_block(d, (blocks if name == "ViT" else hybrid_blocks) or (),
                          "blocks" if name == "ViT" else "hybrid_blocks")[0]
        if d.ndim != 2 or min(d.shape) < 1 or not bool(torch.isfinite(d.float()).all()):
            raise InputError(f"{arg}: expected finite (L, H) distances (mean_attention_distance's result), got "
                             f"shape {tuple(d.shape)}" + ("" if d.ndim != 2 or min(d.shape) < 1 else
                                                          " with values that are not finite"))
        if not is_int(early_layers) or not 1 <= early_layers <= len(d) // 2:
            raise InputError(f"early_layers={early_layers!r} must be an int in [1, L // 2] = [1, {len(d) // 2}] for "
                             f"the {len(d)} layers of {arg}, so that the first and the last early_layers layers "
                             "do not overlap (e.g. early_layers=2 for 12 layers)")
        models[name] = d

    def grows(d: torch.Tensor, _: float | None) -> tuple[str, bool]:
        m = d.mean(dim=1)
        rho = spearmanr(range(len(m)), m.numpy()).statistic if len(m) > 1 and float(m.std()) > 0 else float("nan")
        return (f"layer 1: {m[0]:.1f} px -> layer {len(m)}: {m[-1]:.1f} px (rho {rho:.2f})",
                bool(m[-1] > (1 + min_effect) * m[0]))

    def spread(d: torch.Tensor, u: float | None) -> tuple[str, bool]:
        e, late = d[:early_layers], d[-early_layers:]
        se, sl = float((e.amax(1) - e.amin(1)).mean()), float((late.amax(1) - late.amin(1)).mean())
        words = f"head spread early {se:.1f} px vs late {sl:.1f} px"
        if u is None:
            return f"{words} (against {min_effect:g} of the mean distance; no uniform_px given)", bool(
                se > sl and se > min_effect * float(d.mean()))
        return f"{words}, against half the uniform {u:.1f} px", bool(se > sl and se > 0.5 * u)

    rows = []
    for name, d in models.items():
        d = torch.as_tensor(d).float().cpu()
        for check, fn in (("distance grows with depth", grows), ("early layers mix local and global heads", spread)):
            value, holds = fn(d, uniform[name])
            rows.append({"observation": check, "model": name, "measured": value, "holds": holds})
    if hybrid is not None:
        v = float(models["ViT"].float()[:early_layers].amin())
        h = float(models["Hybrid"].float()[:early_layers].amin())
        rows.append({"observation": "hybrid less local early", "model": "Hybrid vs ViT",
                     "measured": f"most local early head: hybrid {h:.1f} px vs ViT {v:.1f} px",
                     "holds": h > (1 + min_effect) * v})
    return pd.DataFrame(rows)


def _uniform_by_model(uniform_px: Any, names: list[str]) -> dict[str, float | None]:
    """``distance_observations``' ``uniform_px`` as one value (or ``None``) per model name, checked."""
    if uniform_px is None:
        return dict.fromkeys(names)
    values = list(uniform_px) if isinstance(uniform_px, (tuple, list)) else [uniform_px] * len(names)
    ok = len(values) == len(names) and all(
        isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u) and u > 0 for u in values)
    if not ok:
        raise InputError(f"uniform_px must be a positive number (the uniform-attention distance in px, "
                         f"scale_comparison's uniform_distance_px), or one per model ({', '.join(names)}); "
                         f"got {uniform_px!r}")
    return {n: float(u) for n, u in zip(names, values)}
