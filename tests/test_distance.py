"""Mean attention distance: planted patterns with known answers, an independent loop reference, every layout."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.analysis.distance import (
    DistanceReducer,
    TokenLayout,
    attention_distance_from_maps,
    distance_by_block,
    distance_observations,
    patch_distance_matrix,
)
from vitviz.errors import InputTypeError
from vitviz.zoo.reference import build_reference


def centres(grid, stride):
    gh, gw = grid
    sh, sw = stride
    return [((r + 0.5) * sh, (c + 0.5) * sw) for r in range(gh) for c in range(gw)]


def ref_distance(attn: torch.Tensor, grid, stride, p: int) -> list[float]:
    """Per head: sum_k a_qk d(q, k) / sum_k a_qk over patch keys, averaged over queries and images (loops)."""
    pts = centres(grid, stride)
    b, h = attn.shape[:2]
    out = []
    for k in range(h):
        total = 0.0
        for bi in range(b):
            for qi, (qy, qx) in enumerate(pts):
                row = attn[bi, k, p + qi, p:].double()
                total += sum(float(row[j]) * math.hypot(qy - ky, qx - kx) for j, (ky, kx) in enumerate(pts)) / float(
                    row.sum())
        out.append(total / (b * len(pts)))
    return out


def test_patch_distance_matrix_is_a_distance_in_pixels():
    d = patch_distance_matrix((3, 4), (5, 7))
    assert d.shape == (12, 12)
    torch.testing.assert_close(d, d.T)
    assert (d.diagonal() == 0).all()
    assert d[0, 11].item() == pytest.approx(math.hypot(2 * 5, 3 * 7))  # patch (0, 0) to (2, 3)
    assert d[0, 1].item() == pytest.approx(7) and d[0, 4].item() == pytest.approx(5)


def test_self_only_attention_has_distance_zero():
    n = 2 + 12
    attn = torch.eye(n).expand(3, 4, n, n)
    got = attention_distance_from_maps(attn, TokenLayout((3, 4), (16, 16), 2))
    torch.testing.assert_close(got, torch.zeros(4))


def test_uniform_attention_gives_the_mean_pairwise_distance():
    grid, stride, p = (3, 5), (8, 8), 1
    n = p + 15
    attn = torch.full((2, 3, n, n), 1.0 / n)  # prefix keys get weight too: dropped and renormalised
    pts = centres(grid, stride)
    mean_pairwise = sum(math.dist(a, b) for a in pts for b in pts) / len(pts) ** 2
    got = attention_distance_from_maps(attn, TokenLayout(grid, stride, p))
    torch.testing.assert_close(got.double(), torch.full((3,), mean_pairwise, dtype=torch.float64), atol=1e-4,
                               rtol=1e-5)


def test_distance_scales_with_the_stride():
    attn = torch.softmax(torch.randn(2, 3, 13, 13) * 2, dim=-1)
    small = attention_distance_from_maps(attn, TokenLayout((3, 4), (8, 8), 1))
    large = attention_distance_from_maps(attn, TokenLayout((3, 4), (16, 16), 1))
    torch.testing.assert_close(large, 2 * small)


def test_non_square_grid_and_stride_planted_neighbours():
    """Head 0 attends one patch to the right, head 1 one patch down: distances sw and sh, never swapped. Half of
    every query's weight is on the class token: renormalised over patch keys, not halved (sw / 2, sh / 2) as by
    the widely copied implementation that slices the prefix away without renormalising (module docstring)."""
    gh, gw, sh, sw, p = 3, 4, 5, 7, 1
    n = p + gh * gw
    attn = torch.zeros(1, 2, n, n)
    attn[:, :, :p, 0] = 1.0
    for r in range(gh):
        for c in range(gw):
            q = p + r * gw + c
            attn[0, 0, q, p + r * gw + (c + 1 if c + 1 < gw else c - 1)] = 0.5
            attn[0, 1, q, p + (r + 1 if r + 1 < gh else r - 1) * gw + c] = 0.5
            attn[0, :, q, 0] = 0.5  # half the weight on the class token: dropped, the rest renormalised
    got = attention_distance_from_maps(attn, TokenLayout((gh, gw), (sh, sw), p))
    torch.testing.assert_close(got, torch.tensor([float(sw), float(sh)]))
    spec_like = vitviz.inspect(tiny_timm_vit())  # a ViTSpec works as the layout too (4x6 grid, stride 8)
    with pytest.raises(ValueError, match="does not fit"):
        attention_distance_from_maps(attn, spec_like)


def deit_distilled():
    return timm.create_model("deit_tiny_distilled_patch16_224", img_size=(48, 64), depth=2).eval()


MODELS = {
    "cls-4x6": lambda: tiny_timm_vit(),
    "no-cls": lambda: tiny_timm_vit(class_token=False, global_pool="avg"),
    "registers": lambda: tiny_timm_vit(reg_tokens=4, no_embed_class=True),
    "deit-distilled": deit_distilled,
    "hybrid-stride32": lambda: timm.create_model("vit_tiny_r_s16_p8_224", img_size=(64, 96), depth=2).eval(),
    "cifar10-hybrid": lambda: build_reference("cifar10-hybrid", depth=2).eval(),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_mean_attention_distance_of_models_equals_the_reference(name):
    model = MODELS[name]()
    spec = vitviz.inspect(model)
    x = torch.randn(3, 3, *spec.img_size)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    want = torch.tensor([ref_distance(a, spec.grid_size, spec.patch_size, spec.num_prefix_tokens)
                         for a in cap.attentions])
    got = vitviz.mean_attention_distance(model, x, batch_size=2)  # streamed in two chunks
    assert got.shape == (len(spec.attention_modules), spec.num_heads)
    torch.testing.assert_close(got.double(), want.double(), atol=1e-4, rtol=1e-5)
    if name == "hybrid-stride32":
        assert spec.patch_size == (32, 32)
        assert float(got.max()) > 32 * 0.5  # in pixels of the input, not in patches


def test_streaming_equals_store_everything():
    model = tiny_timm_vit(depth=3)
    spec = vitviz.inspect(model)
    x = torch.randn(5, 3, 32, 48)
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    stored = torch.stack([attention_distance_from_maps(a, spec) for a in cap.attentions])
    for bs in (1, 2, 32):
        torch.testing.assert_close(vitviz.mean_attention_distance(model, x, batch_size=bs), stored, atol=1e-5,
                                   rtol=1e-5)


@pytest.mark.parametrize("failing", ["blocks.1", "blocks.2.mlp"])
def test_a_reducer_retried_after_a_failed_pass_counts_each_image_once(failing):
    """The first layers of a forward that raised were added to the running sums; capture_attention hands the
    failure to the reducer's on_abort, which takes them back out, so the retry leaves the sums of clean passes."""
    model = tiny_timm_vit(depth=3)
    spec = vitviz.inspect(model)
    x = torch.randn(4, 3, 32, 48)

    def reducer():
        red = DistanceReducer(3, spec.num_heads, spec.num_prefix_tokens)
        red.distances = patch_distance_matrix(spec.grid_size, spec.patch_size)
        return red

    clean = reducer()
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=clean, store=False, heads="stream"):
        model(x[:2])
        model(x[2:])
    calls = {"n": 0}

    def fail_once(_m, _args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("out of memory (simulated)")

    red = reducer()
    with torch.no_grad(), vitviz.capture_attention(model, on_layer=red, store=False, heads="stream"):
        model(x[:2])
        handle = model.get_submodule(failing).register_forward_pre_hook(fail_once)
        with pytest.raises(RuntimeError, match="simulated"):
            model(x[2:])
        model(x[2:])
    handle.remove()
    assert red.counts.tolist() == [4.0, 4.0, 4.0]
    torch.testing.assert_close(red.sums, clean.sums, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(red.result(), clean.result())


def test_reducer_needs_distances_and_a_pass():
    red = DistanceReducer(2, 3, 1)
    with pytest.raises(vitviz.VitvizError, match="distances"):
        red(0, torch.rand(1, 3, 5, 5))
    with pytest.raises(vitviz.VitvizError, match="forward pass"):
        red.result()


def test_distance_observations_read_the_paper_checks():
    vit = torch.tensor([[5.0, 60.0], [20.0, 40.0], [50.0, 55.0], [70.0, 72.0]])  # grows, mixed early
    hyb = torch.tensor([[30.0, 50.0], [35.0, 45.0], [50.0, 56.0], [70.0, 71.0]])
    table = distance_observations(vit, hyb)
    assert list(table["holds"]) == [True, True, True, True, True]
    flat = torch.full((4, 2), 10.0)
    assert not distance_observations(flat)["holds"].any()


def test_distance_observations_refuse_windows_and_tables_that_mean_nothing():
    """early_layers=0 made the late window the whole table (d[-0:]), -1 compared the first L-1 layers with the
    last L-1 and held, more than L // 2 made the two windows overlap; each is refused, as are a table that is not
    (L, H), values that are not finite and a negative min_effect."""
    d = torch.tensor([[5.0, 60.0], [20.0, 40.0], [50.0, 55.0], [70.0, 72.0]])
    for bad in (0, -1, 3, 2.5, True):
        with pytest.raises(vitviz.InputError, match=rf"early_layers={bad!r} must be an int in \[1, L // 2\] = "
                                                    r"\[1, 2\] for the 4 layers of vit"):
            distance_observations(d, early_layers=bad)
    assert len(distance_observations(d, early_layers=2)) == 2
    with pytest.raises(vitviz.InputError, match=r"early_layers=2 .* = \[1, 1\] for the 3 layers of hybrid"):
        distance_observations(d, d[:3])
    for table in (d[0], d[None], torch.zeros(0, 2)):
        with pytest.raises(vitviz.InputError, match=r"vit: expected finite \(L, H\) distances"):
            distance_observations(table)
    with pytest.raises(vitviz.InputError, match=r"hybrid: .* not finite"):
        distance_observations(d, torch.where(d > 60, float("nan"), d))
    for bad in (-1, float("nan"), "0.1"):
        with pytest.raises(vitviz.InputError, match=r"min_effect=.* must be a number >= 0"):
            distance_observations(d, min_effect=bad)


def test_local_and_global_heads_are_judged_against_the_uniform_distance_when_it_is_given():
    # heads that all sit near a uniform 16.5 px, a few px apart in the first layers (as a small ViT trained from
    # scratch ends up): a spread above 10% of the mean, yet no head is local
    near = torch.tensor([[15.0, 15.3, 15.9], [12.0, 16.0, 15.6], [14.5, 14.7, 14.2], [16.7, 16.0, 16.8]])
    mix = "early layers mix local and global heads"

    def holds(d, **kw):
        t = distance_observations(d, **kw)
        return bool(t.set_index("observation").loc[mix, "holds"]), t.set_index("observation").loc[mix, "measured"]

    weak, words = holds(near)
    assert weak and "no uniform_px" in words  # the relative test passes them, and says what it compared
    strict, words = holds(near, uniform_px=16.5)
    assert not strict and "uniform 16.5 px" in words
    # a first layer with a head at 2 px and one at 15 px, on the same grid: local and global
    paper_like = torch.tensor([[2.0, 15.0, 9.0], [4.0, 16.0, 12.0], [14.0, 15.0, 15.5], [16.0, 16.2, 16.4]])
    assert holds(paper_like, uniform_px=16.5)[0]
    both = distance_observations(paper_like, near, uniform_px=(16.5, 16.5)).set_index(["observation", "model"])
    assert bool(both.loc[(mix, "ViT"), "holds"]) and not bool(both.loc[(mix, "Hybrid"), "holds"])
    for bad in (0.0, -3.0, float("nan"), "16.5", (16.5, 16.5), True):
        with pytest.raises(vitviz.InputError, match="uniform_px"):
            distance_observations(near, uniform_px=bad)


def test_dynamic_image_size_uses_the_grid_of_each_batch():
    model = tiny_timm_vit(dynamic_img_size=True)
    x = torch.randn(2, 3, 40, 56)  # 5x7 grid of 8-px patches
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    want = torch.tensor([ref_distance(a, (5, 7), (8, 8), 1) for a in cap.attentions])
    torch.testing.assert_close(vitviz.mean_attention_distance(model, x).double(), want.double(), atol=1e-4,
                               rtol=1e-5)


def test_distance_of_maps_that_need_gradients_is_differentiable():
    attn = torch.randn(2, 3, 1 + 6, 1 + 6).softmax(-1).requires_grad_(True)
    layout = TokenLayout((2, 3), (16, 8), 1)
    got = attention_distance_from_maps(attn, layout)
    got.sum().backward()
    assert attn.grad is not None and bool(attn.grad.abs().sum() > 0)
    torch.testing.assert_close(got.detach(), attention_distance_from_maps(attn.detach(), layout))


def _prefix_only_query(weight_on_patches: float, heads: int = 1) -> torch.Tensor:
    """A 2x2 grid with a class token: patch 0 puts all but ``weight_on_patches`` on the class key (the rest on
    patch 1, 16 px away), patches 1, 2, 3 attend to a neighbour 16 px away."""
    a = torch.zeros(1, heads, 5, 5)
    a[:, :, 0, 0] = 1.0
    a[:, :, 1, 0], a[:, :, 1, 2] = 1.0 - weight_on_patches, weight_on_patches
    for q, k in [(2, 1), (3, 4), (4, 3)]:
        a[:, :, q, k] = 1.0
    return a


@pytest.mark.parametrize("weight", [1e-3, 1e-30, 1e-44, 0.0])
@pytest.mark.parametrize("grad", [False, True])
def test_a_query_with_no_measurable_patch_weight_is_left_out_not_counted_as_zero(weight, grad):
    """A patch query that attends to prefix tokens alone has no distance over patch keys: it is left out of the
    mean over queries (every other query is 16 px from its key, so the head's distance is 16 px whatever its weight
    on patches), not counted as 0 px (12 px for the head, the former result below float32's smallest normal
    weight, 1.2e-38). On both paths: the streamed sums and the differentiable one, whose gradient stays finite."""
    layout = TokenLayout((2, 2), (16, 16), 1)
    attn = _prefix_only_query(weight).requires_grad_(grad)
    got = attention_distance_from_maps(attn, layout)
    assert got.item() == pytest.approx(16.0, rel=1e-6)
    if grad:
        got.sum().backward()
        assert bool(torch.isfinite(attn.grad).all())


def test_a_head_whose_every_query_attends_to_prefix_tokens_alone_has_no_distance():
    """An image in which no patch query of a head puts measurable weight on patch keys gives NaN for that head
    (undefined, not 0 px); the other heads keep their distances."""
    attn = _prefix_only_query(0.5, heads=2)
    attn[:, 1, 1:, :] = 0.0
    attn[:, 1, 1:, 0] = 1.0  # head 1: every patch query on the class token
    got = attention_distance_from_maps(attn, TokenLayout((2, 2), (16, 16), 1))
    assert got[0].item() == pytest.approx(16.0) and math.isnan(got[1].item())


def test_distance_equals_timms_own_explicit_attention_on_a_non_square_stride():
    """Maps read from timm's explicit path (``fused_attn = False``, the input of ``attn_drop``), not from vitviz's
    capture; a 4x8 px stride on an 8x6 grid with two registers, sharpened so that h/w mix-ups show."""
    torch.manual_seed(0)
    model = tiny_timm_vit(patch_size=(4, 8), reg_tokens=2)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(20)
    x = torch.randn(3, 3, 32, 48)
    got = vitviz.mean_attention_distance(model, x, batch_size=2)
    maps = []
    hooks = [blk.attn.attn_drop.register_forward_pre_hook(lambda _m, a: maps.append(a[0].detach())) for blk in
             model.blocks]
    for blk in model.blocks:
        blk.attn.fused_attn = False
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    want = torch.tensor([ref_distance(a, (8, 6), (4, 8), 3) for a in maps])
    assert float(want.max() - want.min()) > 0.5  # not uniform attention
    torch.testing.assert_close(got.double(), want.double(), atol=1e-4, rtol=1e-5)


def test_patch_distance_matrix_is_formed_on_the_device_it_is_asked_for():
    """The matrix is formed where it is used (on a GPU no CPU work and no copy: ``test_cuda_host_path.py``): asked
    for on the meta device, nothing is computed. On the CPU every float64 entry is the Euclidean distance rounded
    once (as ``math.hypot`` gives it), on any CPU: torch's own float64 sqrt, through MKL's AVX-512 code path, gives
    ``sqrt(2048)`` (``[0, 14]`` here) 1 ulp low."""
    d = patch_distance_matrix((3, 5), (16, 8), device="meta")
    assert d.is_meta and d.shape == (15, 15) and d.dtype == torch.float32
    cpu = patch_distance_matrix((3, 5), (16, 8), dtype=torch.float64)
    assert cpu[0, 14] == math.hypot(2 * 16, 4 * 8)
    want = [[math.hypot((i // 5 - j // 5) * 16, (i % 5 - j % 5) * 8) for j in range(15)] for i in range(15)]
    assert cpu.tolist() == want


@pytest.mark.gpu
def test_patch_distance_matrix_on_cuda_is_the_cpu_one_bit_for_bit():
    for grid, stride in [((28, 28), (16, 16)), ((37, 23), (14, 16))]:
        cpu = patch_distance_matrix(grid, stride)
        cuda = patch_distance_matrix(grid, stride, device="cuda")
        assert cuda.device.type == "cuda" and torch.equal(cuda.cpu(), cpu)


def test_a_spec_whose_grid_follows_the_input_is_refused_as_a_layout():
    """A ``dynamic_img_size`` model's built grid says nothing of its maps' grid: a 32x48 and a 48x32 input make as
    many tokens on transposed grids, so the maps of the 48x32 input read on the spec's 4x6 grid gave another
    distance without a word. Its ``ViTSpec`` is refused, naming the layout to pass, and that layout is right."""
    model = tiny_timm_vit(dynamic_img_size=True)
    spec = vitviz.inspect(model)
    x = torch.randn(2, 3, 48, 32)  # a 6x4 grid: N = 25, as the built 4x6 grid
    with torch.no_grad(), vitviz.capture_attention(model) as cap:
        model(x)
    with pytest.raises(vitviz.InputError, match=r"spec_or_layout: .*dynamic_img_size.*built 4x6 grid.*TokenLayout\("
                                                r"spec\.grid_for_input\(x\)"):
        attention_distance_from_maps(cap.attentions[0], spec)
    layout = TokenLayout(spec.grid_for_input(x), spec.patch_size, spec.num_prefix_tokens)
    assert layout.grid_size == (6, 4)
    got = torch.stack([attention_distance_from_maps(a, layout) for a in cap.attentions])
    torch.testing.assert_close(vitviz.mean_attention_distance(model, x), got, atol=1e-5, rtol=1e-5)
    wrong = torch.stack([attention_distance_from_maps(a, TokenLayout((4, 6), (8, 8), 1)) for a in cap.attentions])
    assert not torch.allclose(wrong, got, atol=1e-3)  # what the built grid gave


def test_maps_and_layouts_that_are_not_a_distance_problem_are_refused_naming_the_argument():
    """A NumPy map raised AttributeError or torch.sum's TypeError; maps with fewer queries than keys raised an
    error about the distance matrix; a negative prefix count ran into a broadcasting error; an empty grid raised
    IndexError. Each is refused, naming the argument and the fix; a tensor of the same values still runs."""
    attn = torch.softmax(torch.randn(2, 3, 14, 14), -1)
    layout = TokenLayout((3, 4), (16, 16), 2)
    for bad in (attn.numpy(), attn[0].numpy()):
        with pytest.raises(InputTypeError, match=r"attn: .*ndarray.*torch\.as_tensor"):
            attention_distance_from_maps(bad, layout)
    with pytest.raises(vitviz.InputError, match=r"attn: expected square .*\(2, 3, 13, 14\)"):
        attention_distance_from_maps(attn[:, :, 1:], layout)
    with pytest.raises(vitviz.InputError, match=r"num_prefix_tokens=-2.*int >= 0"):
        attention_distance_from_maps(attn, TokenLayout((4, 4), (16, 16), -2))
    with pytest.raises(vitviz.InputError, match=r"grid_size=\(0, 3\)"):
        patch_distance_matrix((0, 3), 16)
    with pytest.raises(vitviz.InputError, match=r"patch_size=-16"):
        patch_distance_matrix((3, 3), -16)
    torch.testing.assert_close(attention_distance_from_maps(torch.as_tensor(attn.numpy()), layout),
                               torch.tensor(ref_distance(attn, (3, 4), (16, 16), 2), dtype=torch.float32))


@pytest.mark.parametrize("bad", [1.5, 2.9, True])
def test_a_layout_prefix_count_that_is_not_an_int_is_refused_not_truncated(bad):
    """TokenLayout's prefix count went through int(): 1.5 and 2.9 were read as 1 and 2 prefix tokens and True as 1,
    so a map whose N fits that count was measured with the wrong tokens dropped, without a word."""
    n = int(bad) + 12  # the count int() made of it, and a 3x4 grid
    attn = torch.softmax(torch.randn(1, 2, n, n), -1)
    with pytest.raises(vitviz.InputError, match=rf"num_prefix_tokens={bad!r}.*int >= 0"):
        attention_distance_from_maps(attn, TokenLayout((3, 4), (16, 16), bad))


def test_distance_by_block_lays_a_blocks_branches_side_by_side_and_refuses_unequal_blocks():
    d = torch.arange(12.0).reshape(6, 2)  # 6 modules of 2 heads
    table, branches = distance_by_block(d, (0, 0, 1, 1, 2, 2))
    assert branches == 2 and table.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    same, one = distance_by_block(d, tuple(range(6)))
    assert one == 1 and same.shape == (6, 2)
    with pytest.raises(vitviz.InputError, match=r"blocks=\(0, 0, 1, 2, 2, 2\).*\[2, 1, 3\]"):
        distance_by_block(d, (0, 0, 1, 2, 2, 2))
    with pytest.raises(vitviz.InputError, match="5 block indices for 6 rows"):
        distance_by_block(d, (0, 0, 1, 1, 2))


def test_distance_observations_count_a_parallel_models_blocks_as_its_layers():
    """mean_attention_distance gives a parallel block's branches separate rows: early_layers=2 then compared the
    first block's two branches with the last block's, and "distance grows with depth" read one branch of the first
    and last blocks. With blocks= (ViTSpec.attention_blocks) the checks read the blocks, each with all its
    branches' heads (distance_by_block), for the hybrid comparison too; blocks that do not fit are refused."""
    g = torch.Generator().manual_seed(0)
    vit, hyb = torch.rand(8, 2, generator=g) * 100, torch.rand(8, 2, generator=g) * 100
    blocks = (0, 0, 1, 1, 2, 2, 3, 3)

    def by_hand(d):  # block b: its first branch's heads, then its second's
        return torch.cat([d[0::2], d[1::2]], dim=1)

    for early in (1, 2):
        got = distance_observations(vit, hyb, early_layers=early, blocks=blocks, hybrid_blocks=blocks)
        want = distance_observations(by_hand(vit), by_hand(hyb), early_layers=early)
        assert got.equals(want)
    assert "layer 4:" in distance_observations(vit, blocks=blocks)["measured"].iloc[0]
    with pytest.raises(vitviz.InputError, match=r"early_layers=3 .* = \[1, 2\] for the 4 layers of vit"):
        distance_observations(vit, early_layers=3, blocks=blocks)
    with pytest.raises(vitviz.InputError, match=r"blocks: 4 block indices for 8 rows"):
        distance_observations(vit, blocks=blocks[:4])


def test_distance_observations_names_hybrid_blocks_when_the_hybrids_blocks_do_not_fit():
    """The hybrid rows' blocks went through the check that names ``blocks``: hybrid_blocks=(0, 0, 1, 1) for 8
    hybrid rows was refused as "blocks: 4 block indices for 8 rows", pointing at the ViT's argument, which fit."""
    v = torch.rand(8, 2, generator=torch.Generator().manual_seed(0)) * 100
    fine = (0, 0, 1, 1, 2, 2, 3, 3)
    with pytest.raises(vitviz.InputError, match=r"^hybrid_blocks: 4 block indices for 8 rows"):
        distance_observations(v, v, blocks=fine, hybrid_blocks=fine[:4])
    with pytest.raises(vitviz.InputError, match=r"^hybrid_blocks=\(0, 0, 1, 2, 2, 2, 3, 3\): .*\[2, 1, 3, 2\]"):
        distance_observations(v, v, blocks=fine, hybrid_blocks=(0, 0, 1, 2, 2, 2, 3, 3))
    with pytest.raises(vitviz.InputError, match=r"^blocks: 4 block indices for 8 rows"):
        distance_observations(v, v, blocks=fine[:4], hybrid_blocks=fine)


def test_distance_observations_of_a_real_parallel_model_read_one_row_per_block():
    """End to end on timm's ParallelThingsBlock (vit_small_patch16_18x2_224's layout, random weights, 4 blocks of
    2 branches): mean_attention_distance gives 8 module rows, and distance_observations with the model's
    attention_blocks reads its 4 blocks, each with both branches' heads, as distance_by_block lays them out."""
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_18x2_224", depth=4, img_size=(32, 48), patch_size=8, embed_dim=32,
                              num_heads=2).eval()
    blocks = vitviz.inspect(model).attention_blocks
    assert blocks == (0, 0, 1, 1, 2, 2, 3, 3)
    dist = vitviz.mean_attention_distance(model, torch.randn(2, 3, 32, 48))
    assert dist.shape == (8, 2)
    table, branches = distance_by_block(dist, blocks)
    assert branches == 2 and table.shape == (4, 4)
    got = distance_observations(dist, dist, early_layers=2, blocks=blocks, hybrid_blocks=blocks)
    assert got.equals(distance_observations(table, table, early_layers=2))
    m = table.mean(dim=1)
    assert got["measured"].iloc[0].startswith(f"layer 1: {m[0]:.1f} px -> layer 4: {m[-1]:.1f} px")
    # without blocks the rows are branches: 8 "layers", and the first of them one branch's heads only
    assert "layer 8:" in distance_observations(dist)["measured"].iloc[0]
