"""Attention flow (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, Sec. 3.2).

The layers form a directed graph: one node per token per layer (``L + 1`` layers of ``N`` nodes, layer 0 the
input), and an edge from token ``i`` of layer ``l + 1`` to token ``j`` of layer ``l`` with capacity ``A_l[i, j]``,
where ``A_l = rownorm(0.5 rownorm(W_l) + 0.5 I)`` is the same residual-augmented, head-fused attention as rollout's,
made by the same code (``vitviz.analysis.propagation``). With the head mean (the paper's, and the only fusion of the
authors' code) ``W_l``'s rows sum to 1 and this is their ``rownorm(W_l + I)``; with ``head_fusion="max"`` or
``"min"`` the fused rows are renormalised first (vitviz's choice, as rollout's), so the skip connection keeps half
of each row, not the ``1 / (1 + sum_j W_l[i, j])`` that ``rownorm(W_l + I)`` would leave it. One layer of the graph
per residual block, the branches of a parallel block averaged (``ViTSpec.attention_blocks``), and maps that are not
a flow between tokens (differential attention's signed ``S1 - lambda S2``, CaiT's talking heads) refused as rollout
refuses them. The flow from output token ``t`` to input token ``j`` is the value of the maximum flow from node ``(L,
t)`` to node ``(0, j)``. Where rollout multiplies weights along every path, flow is limited by the narrowest cut, so
the two differ whenever paths share a bottleneck.

Normalisation, as the authors' code does it (samiraabnar/attention_flow, ``attention_graph_util.compute_node_flow``
and ``compute_flows``, with ``input_nodes`` every token of layer 0): the max-flow values from ``(L, t)`` to all
``N`` input tokens, prefix tokens included, are divided by their sum. Each value is a separate max-flow problem,
so the raw values share capacity and do not add up to 1 (close to 2 on the two-layer test models); after the
division the row sums to 1 over the ``N`` input tokens, and the map, its patch columns, sums to 1 minus the prefix
tokens' share (as rollout's map). ``normalise=False`` returns the raw max-flow values instead (each at most 1).
The output row is the one the model's head reads (``ViTSpec.readout``; see ``vitviz.analysis.propagation``): the
class token for a class-token head, as in the paper; for a head that reads several tokens the normalised flows
from each of them, weighted as the readout weights their rows (the mean of the class and distillation tokens'
flows for DeiT-distilled; the mean over every patch token for average pooling and models without a class token,
``P`` times the work; vitviz's choice, the paper reads one row).

Max-flow needs integer capacities here (``scipy.sparse.csgraph.maximum_flow``): capacities are
``round(A * FLOW_SCALE)`` with ``FLOW_SCALE = 2**20``, and flows are divided back, so each raw value carries an error
below ``(edges on the minimum cut) / (2 FLOW_SCALE)``. The reference code runs networkx's Edmonds-Karp on a float
graph of one image; here the graph is solved per image with scipy's Dinic solver. Apart from that rounding the two
compute the same values (``tests/test_flow.py`` checks a re-written ``compute_node_flow``, with networkx when it is
installed).

Cost: ``P`` max-flow problems per image on ``(L + 1) N`` nodes and ``L N^2`` edges, so flow refuses more than
``max_tokens`` tokens (default ``FLOW_MAX_TOKENS``; counted for each input, so a model with a dynamic image size is
checked at the size it is given) and shows a progress bar with ``progress=True``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vitviz.analysis.propagation import LayerRule, PoolRows, Propagator, output_rows, require_flow_maps
from vitviz.core.batching import count_images, iter_batches
from vitviz.core.calls import in_eval_mode
from vitviz.core.capture import capture_attention
from vitviz.core.images import Images
from vitviz.core.spec import inspect
from vitviz.core.util import check_bool, check_positive_int
from vitviz.errors import InputError

__all__ = ["FLOW_MAX_TOKENS", "FLOW_SCALE", "attention_flow", "flow_from_layers"]

FLOW_SCALE = 2 ** 20
FLOW_MAX_TOKENS = 257  # a 16x16 grid plus a class token; ViT-B/16 at 224 px (197 tokens) fits


def flow_from_layers(layers: list[torch.Tensor], source: int, sinks: list[int]) -> np.ndarray:
    """Max-flow values from token ``source`` of the last layer to each token in ``sinks`` of the input.

    Args:
        layers: per layer, in forward order, one image's ``(N, N)`` layer matrix ``A_l`` (rows: queries).
        source: the output token.
        sinks: the input tokens.

    Returns:
        ``(len(sinks),)`` float64 flow values.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import maximum_flow

    n = layers[0].shape[-1]
    depth = len(layers)
    rows, cols, caps = [], [], []
    grid = np.arange(n)
    for depth_l, a in enumerate(layers):  # edge (l + 1, i) -> (l, j), capacity A_l[i, j]
        cap = np.rint(a.detach().double().cpu().numpy() * FLOW_SCALE).astype(np.int64)
        i, j = np.nonzero(cap > 0)
        rows.append((depth_l + 1) * n + grid[i])
        cols.append(depth_l * n + grid[j])
        caps.append(cap[i, j])
    size = (depth + 1) * n
    graph = coo_matrix((np.concatenate(caps).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))),
                       shape=(size, size)).tocsr()
    src = depth * n + source
    return np.array([maximum_flow(graph, src, j, method="dinic").flow_value for j in sinks]) / FLOW_SCALE


def _check_tokens(name: str, n: int, grid: tuple[int, int], depth: int, max_tokens: int) -> None:
    if n > max_tokens:
        raise InputError(f"attention flow of {name} on a {grid[0]}x{grid[1]}-patch input would solve "
                         f"{grid[0] * grid[1]} max-flow problems per image on graphs of {n} tokens x {depth + 1} "
                         f"layers; that is more than max_tokens={max_tokens} tokens. Pass max_tokens={n} to run it "
                         "anyway (slow), pass smaller images, or use method='rollout'")


@in_eval_mode
def attention_flow(
    model: nn.Module,
    images: Images,
    *,
    head_fusion: str = "mean",
    token: int | str | None = None,
    max_tokens: int = FLOW_MAX_TOKENS,
    normalise: bool = True,
    batch_size: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Attention flow (Abnar & Zuidema 2020) from the output token to every patch; see the module docstring.

    Args:
        model: any ViT ``vitviz.inspect`` reads.
        images: a normalised ``(B, 3, H, W)`` tensor, or anything ``vitviz.load_images`` takes.
        head_fusion: ``"mean"`` (the paper), ``"max"`` or ``"min"`` (the fused rows renormalised before the
            residual is added, as rollout's; see the module docstring).
        token: the output token: default (``None``) the tokens the model's head reads (``ViTSpec.readout``: the
            class token; the mean of the flows from the class and distillation tokens; the mean of the flows from
            every patch token for average pooling or no class token, ``P`` times the work); ``"class"``: the class
            token whatever the head reads; an int: that token.
        max_tokens: refuse inputs of more tokens than this (cost grows like ``N^3`` per image).
        normalise: divide the flows of each output token by their sum over all ``N`` input tokens, as the
            reference code does (default); ``False``: the raw max-flow values.
        batch_size: images per forward pass.
        progress: show a progress bar over images.

    Returns:
        ``(B, gh, gw)`` float32, non-negative, on the model's device: the normalised flows (a map sums to 1 minus the
        prefix tokens' share), or with ``normalise=False`` the raw max-flow values (each at most 1).

    Raises:
        InputError: an input has more than ``max_tokens`` tokens.
        UnsupportedModelError: a layer's maps are not a flow between tokens (differential attention, CaiT talking
            heads).
    """
    check_bool(normalise, "normalise", "divide each output token's flows by their sum, or keep the raw flows")
    check_positive_int(max_tokens, "max_tokens", "the most tokens an input may have (the cost grows like N^3), e.g. "
                                                 f"{FLOW_MAX_TOKENS}")
    spec = inspect(model)
    require_flow_maps(spec, list(range(len(spec.attention_modules))), "attention_flow", suggest_start=False)
    rule = LayerRule("rollout", num_prefix_tokens=spec.num_prefix_tokens)
    reducer = Propagator(rule, head_fusion=head_fusion, blocks=spec.attention_blocks or None, assume_stochastic=True)
    p = spec.num_prefix_tokens
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=count_images(images), desc="attention flow", unit="img")
    out: list[torch.Tensor] = []
    try:
        for x in iter_batches(model, images, batch_size):
            gh, gw = spec.grid_for_input(x)
            _check_tokens(spec.name, p + gh * gw, (gh, gw), spec.depth, max_tokens)
            # each block reduced to its (b, N, N) matrix as the forward pass runs
            with torch.no_grad(), capture_attention(model, on_layer=reducer, store=False, heads="stream"), \
                    PoolRows(model, spec, token) as pool:
                model(x)
            mats = reducer.matrices
            n = mats[0].shape[-1]
            per_image = pool.take(n)
            sinks = list(range(n)) if normalise else list(range(p, n))  # normalised over every input token
            for b in range(len(x)):
                rows_read = output_rows(spec, token, n) if per_image is None else per_image[b].cpu()
                if isinstance(rows_read, torch.Tensor):  # a weighting of several rows: its tokens and their weights
                    sources = [int(i) for i in torch.nonzero(rows_read).flatten()]
                    weights = rows_read[sources].double().numpy()
                else:
                    sources = [rows_read] if rows_read is not None else list(range(p, n))
                    weights = None
                layers = [m[b] for m in mats]
                rows = [flow_from_layers(layers, s, sinks) for s in sources]
                if normalise:
                    rows = [f[p:] / f.sum() for f in rows]
                flows = np.mean(rows, axis=0) if weights is None else np.tensordot(weights, np.stack(rows), 1)
                out.append(torch.as_tensor(flows, dtype=torch.float32).reshape(gh, gw))
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    device = next(model.parameters()).device
    return torch.stack(out).to(device)
