"""Baselines by captum and pytorch-grad-cam: completeness, hand-written references, and Grad-CAM's token reshape
(prefix tokens, registers, non-square grids) against where the pixels are, and against the naive sqrt reshape."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from conftest import tiny_timm_vit

import vitviz
from vitviz.analysis.baselines import gradcam_layer, pool_to_patches, token_reshape
from vitviz.errors import InputError, MissingDependencyError

pytest.importorskip("captum")
pytest.importorskip("pytorch_grad_cam")


@pytest.fixture
def images():
    return torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(2))


def loop_pool(attr, gh, gw, s, absolute=False):
    out = torch.zeros(attr.shape[0], gh, gw, dtype=attr.dtype)
    for i in range(gh):
        for j in range(gw):
            patch = attr[:, :, i * s:(i + 1) * s, j * s:(j + 1) * s]
            out[:, i, j] = (patch.abs() if absolute else patch).sum(dim=(1, 2, 3))
    return out


def test_pool_to_patches_against_a_loop():
    attr = torch.randn(2, 3, 24, 32)
    assert torch.allclose(pool_to_patches(attr, (3, 4), (8, 8)), loop_pool(attr, 3, 4, 8), atol=1e-5)
    assert torch.allclose(pool_to_patches(attr, (3, 4), (8, 8), "abs"), loop_pool(attr, 3, 4, 8, True), atol=1e-5)
    with pytest.raises(InputError, match="pool"):
        pool_to_patches(attr, (3, 4), (8, 8), "mean")


def test_integrated_gradients_completeness(images):
    """Sundararajan et al. (2017) Prop. 1: attributions sum to F(x) - F(x'); the signed patch sum keeps it."""
    model = tiny_timm_vit()
    maps, delta = vitviz.integrated_gradients(model, images, return_delta=True, n_steps=64)
    assert maps.shape == (2, 4, 6)
    with torch.no_grad():
        logits, base = model(images), model(torch.zeros_like(images))
    c = logits.argmax(-1)
    gap = logits.gather(1, c[:, None])[:, 0] - base.gather(1, c[:, None])[:, 0]
    assert torch.allclose(maps.sum(dim=(1, 2)), gap, atol=2e-3 * float(gap.abs().max()) + 1e-5)
    # captum's own convergence delta says the same: sum(attr) - (F(x) - F(x'))
    assert torch.allclose(delta.float(), maps.sum(dim=(1, 2)) - gap, atol=1e-4)
    absmaps = vitviz.explain(model, images, "integrated_gradients", pool="abs", n_steps=64)
    assert (absmaps >= maps.abs() - 1e-6).all() and (absmaps >= 0).all()


def test_input_x_gradient_against_autograd(images):
    model = tiny_timm_vit()
    x = images.clone().requires_grad_(True)
    logits = model(x)
    target = torch.tensor([1, 3])
    (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), x)
    expect = loop_pool((x * grad).detach(), 4, 6, 8)
    got = vitviz.explain(model, images, "input_x_gradient", target=[1, 3])
    assert torch.allclose(got, expect, atol=1e-5)


def gradcam_reference(model, x, target):
    """Selvaraju et al. (2017) Eq. (1)-(2) by hand on the last block's norm1 tokens (1 prefix token)."""
    store = {}

    def hook(_m, _i, out):
        out.retain_grad()
        store["a"] = out

    h = model.blocks[-1].norm1.register_forward_hook(hook)
    try:
        logits = model(x)
    finally:
        h.remove()
    logits.gather(1, target[:, None]).sum().backward()
    a, g = store["a"][:, 1:].detach(), store["a"].grad[:, 1:]
    alpha = g.mean(dim=1)  # mean gradient per channel over the patch grid
    cam = torch.relu((a * alpha[:, None]).sum(-1)).reshape(len(x), 4, 6)  # row-major patches
    cam = cam - cam.flatten(1).min(1).values[:, None, None]
    return cam / (1e-7 + cam.flatten(1).max(1).values[:, None, None])


def test_gradcam_against_hand_reference_and_leaves_model_alone(images):
    model = tiny_timm_vit()
    model.train()
    model.head.weight.grad = torch.ones_like(model.head.weight)
    got = vitviz.explain(model, images, "gradcam", target=[0, 4])
    assert model.training and all(m.training for m in model.modules())  # grad-cam's model.eval() undone
    assert torch.equal(model.head.weight.grad, torch.ones_like(model.head.weight))  # its zero_grad() undone
    model.eval()
    model.zero_grad()
    ref = gradcam_reference(model, images, torch.tensor([0, 4]))
    assert got.shape == (2, 4, 6)
    assert torch.allclose(got, ref, atol=1e-4)  # float32 sums in numpy vs torch, then min-max scaled



def test_gradcam_is_pytorch_grad_cams_map_before_its_resize(images):
    """pytorch-grad-cam's GradCAM with the usual ViT reshape_transform returns the map at the input's size: the
    grid map min-max scaled, resized bilinearly (cv2), scaled again. vitviz keeps the grid map, so the library's
    output is vitviz's, resized and scaled (the difference the module docstring states)."""
    cv2 = pytest.importorskip("cv2")
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model = tiny_timm_vit()

    def reshape(t):  # the pytorch-grad-cam tutorial's ViT transform, here with the 4x6 grid
        return t[:, 1:].reshape(t.shape[0], 4, 6, t.shape[2]).permute(0, 3, 1, 2)

    cam = GradCAM(model, [model.blocks[-1].norm1], reshape_transform=reshape)
    try:
        library = cam(input_tensor=images, targets=[ClassifierOutputTarget(c) for c in (0, 4)])
    finally:
        cam.activations_and_grads.release()
    got = vitviz.explain(model, images, "gradcam", target=[0, 4]).numpy()
    assert library.shape == (2, 32, 48) and got.shape == (2, 4, 6)
    for lib, g in zip(library, got):
        up = cv2.resize(g, (48, 32))
        up = (up - up.min()) / (1e-7 + (up - up.min()).max())
        assert abs(lib - up).max() < 1e-5


def test_gradcam_of_a_model_with_frozen_weights(images):
    """Frozen weights (``requires_grad_(False)``, how pretrained models are often loaded for analysis): Grad-CAM
    still gets the tokens' gradient, the same map as the hand reference on the trainable model."""
    model = tiny_timm_vit()
    ref = gradcam_reference(model, images, torch.tensor([0, 4]))
    model.zero_grad()
    model.requires_grad_(False)
    got = vitviz.explain(model, images, "gradcam", target=[0, 4])
    assert torch.allclose(got, ref, atol=1e-4)
    assert not any(p.requires_grad for p in model.parameters())  # left frozen
    assert all(p.grad is None for p in model.parameters())

def one_patch_model(kind):
    """Depth 1, zero position embedding, prefix tokens and patch bias: at the last block's norm1 only the tokens
    of patches with non-zero pixels are non-zero (LayerNorm of a zero token is its zero bias)."""
    if kind == "registers":
        from timm.models.vision_transformer import VisionTransformer

        m = VisionTransformer(img_size=(24, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3,
                              reg_tokens=4)
    else:
        from timm.models.deit import VisionTransformerDistilled

        m = VisionTransformerDistilled(img_size=(24, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2,
                                       num_classes=3)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name in ("pos_embed", "cls_token", "reg_token", "dist_token", "patch_embed.proj.bias"):
                p.zero_()
    return m.eval()


@pytest.mark.parametrize("kind, prefix", [("registers", 5), ("distilled", 2)])
@pytest.mark.parametrize("patch", [(1, 2), (2, 0)])
def test_reshape_puts_patch_where_the_pixels_are(kind, prefix, patch):
    model = one_patch_model(kind)
    spec = vitviz.inspect(model)
    assert spec.num_prefix_tokens == prefix and spec.grid_size == (3, 4)  # non-square grid
    i, j = patch
    x = torch.zeros(1, 3, 24, 32)
    x[..., i * 8:(i + 1) * 8, j * 8:(j + 1) * 8] = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(0))
    store = {}
    h = model.get_submodule(gradcam_layer(model)).register_forward_hook(lambda _m, _i, o: store.update(t=o))
    with torch.no_grad():
        model(x)
    h.remove()
    act = token_reshape(spec, (3, 4))(store["t"]).abs().sum(1)[0]  # (gh, gw) activation magnitude
    assert act[i, j] > 0 and (act > 0).sum() == 1
    # every class's Grad-CAM is zero off the patch (ReLU of zero activations), and some class lights it up
    maps = torch.stack([vitviz.explain(model, x, "gradcam", target=c)[0] for c in range(3)])
    assert (maps.flatten(1).max(1).values > 0).any()
    off = torch.ones(3, 4, dtype=torch.bool)
    off[i, j] = False
    assert torch.all(maps[:, off] == 0)
    if kind == "registers":
        # the naive reshape (drop 1 token, sqrt(N - 1) square) runs silently here (16 = 4 x 4) and is wrong
        t = store["t"][:, 1:]
        s = math.isqrt(t.shape[1])
        assert s * s == t.shape[1]
        naive = t.reshape(1, s, s, -1).abs().sum(-1)[0]
        k = prefix - 1 + i * 4 + j  # the patch's index after dropping only the class token
        assert naive[k // s, k % s] > 0 and (naive > 0).sum() == 1
        assert (k // s, k % s) != (i, j)  # pinned: e.g. patch (1, 2) lands at (2, 0), patch (2, 0) at (3, 0)


def test_reshape_refuses_a_wrong_token_count():
    spec = vitviz.inspect(tiny_timm_vit())
    with pytest.raises(vitviz.CaptureError, match="prefix"):
        token_reshape(spec, (4, 6))(torch.zeros(1, 24, 8))


def test_missing_library_names_the_extra(monkeypatch, images):
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    with pytest.raises(MissingDependencyError, match=r"vitviz\[explain\]"):
        vitviz.explain(tiny_timm_vit(), images, "integrated_gradients")
    monkeypatch.setitem(sys.modules, "pytorch_grad_cam", None)
    with pytest.raises(MissingDependencyError, match="grad-cam"):
        vitviz.explain(tiny_timm_vit(), images, "gradcam")


@pytest.mark.filterwarnings("ignore::vitviz.errors.CompletenessWarning")  # few steps, for speed: not converged
def test_callable_target_explains_the_same_score(images):
    """A callable target (headless models) gives the map of the score it returns: here the logit of class 2."""
    model = tiny_timm_vit()
    for method, opts in (("integrated_gradients", {"n_steps": 8}), ("input_x_gradient", {}), ("gradcam", {})):
        by_class = vitviz.explain(model, images, method, target=2, **opts)
        by_callable = vitviz.explain(model, images, method, target=lambda out: out[:, 2], **opts)
        torch.testing.assert_close(by_callable, by_class, atol=1e-5, rtol=1e-4)


@pytest.mark.filterwarnings("ignore::vitviz.errors.CompletenessWarning")  # few steps, for speed: not converged
def test_baselines_read_vit_mae_unmasked_in_patch_order():
    """ViTMAE masks 75% of its patches at random on every call; the baselines read it as every other vitviz method
    does (``Family.prepare``: unmasked, in patch order), so the maps are the model's and the same on every call
    (was: input x gradient and integrated gradients of a randomly masked model, different on every call, and
    Grad-CAM refused)."""
    pytest.importorskip("transformers")
    from hf_models import hf_case

    case = hf_case("vit-mae")
    model, x = case.model, case.x
    ratio = model.config.mask_ratio

    def score(out):
        return out.last_hidden_state[:, 0, :3].sum(-1) + out.last_hidden_state[:, 1:, 1].mean(-1)

    xx = x.clone().requires_grad_(True)
    model.config.mask_ratio = 0.0
    try:  # by hand: unmasked, the identity shuffle
        (grad,) = torch.autograd.grad(score(model(pixel_values=xx, noise=case.extra["noise"])).sum(), xx)
    finally:
        model.config.mask_ratio = ratio
    expect = loop_pool((x * grad).detach(), 4, 4, 8)
    got = vitviz.explain(model, x, "input_x_gradient", target=score)
    torch.testing.assert_close(got, expect, atol=1e-6, rtol=1e-5)
    ig = [vitviz.explain(model, x, "integrated_gradients", target=score, n_steps=4) for _ in range(2)]
    torch.testing.assert_close(ig[0], ig[1], atol=0, rtol=0)
    cam = vitviz.explain(model, x, "gradcam", target=score)
    assert cam.shape == (2, 4, 4)
    assert model.config.mask_ratio == ratio  # masks again after the call


def test_baselines_on_an_image_text_model_name_the_vision_tower():
    """A whole CLIPModel: ``model(images)`` would read the pixels as token ids; the baselines say to pass
    ``model.vision_model`` as the attention methods do (was: AttributeError deep in the text tower)."""
    pytest.importorskip("transformers")
    from hf_models import hf_case

    case = hf_case("clip-model")
    for method in ("input_x_gradient", "gradcam"):
        with pytest.raises(InputError, match=r"model\.vision_model"):
            vitviz.explain(case.model, case.x, method, target=lambda out: out[0][:, 0])


def test_gradcam_on_a_layer_whose_output_is_a_tuple_names_the_layer_and_the_fix():
    """pytorch-grad-cam saves a gradient for a tensor output only: given a Hugging Face attention module (its output
    a tuple) it failed later on a None gradient ('NoneType' object has no attribute 'shape'). The layer is refused
    by name, with the default layer as the fix, and no hook is left on the model."""
    pytest.importorskip("transformers")
    pytest.importorskip("pytorch_grad_cam")
    from hf_models import hf_case

    case = hf_case("vit")
    model, x = case.model, case.x
    kinds = {}

    def note(name):
        def hook(_m, _args, out):
            kinds.setdefault(name, type(out))  # returns None: the output is left as it is
        return hook

    handles = [m.register_forward_hook(note(n)) for n, m in model.named_modules() if n]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    layer = next(n for n, kind in kinds.items() if kind is tuple)  # an attention module: (output, weights)
    with pytest.raises(InputError, match=rf"layer='{layer}' \(\w+\) returns a tuple, not a tensor.*the default: "
                                         rf"'{gradcam_layer(model)}'"):
        vitviz.explain(model, x, "gradcam", layer=layer)
    assert all(not m._forward_hooks for m in model.modules())
    assert vitviz.explain(model, x, "gradcam").shape == (2, *case.grid)


@pytest.mark.parametrize("layer", ["", -1, "blocks.9.norm1"])
def test_gradcam_refuses_a_layer_that_names_no_module_naming_the_default(layer):
    """``layer=""`` fell back to the default layer without a word and ``layer=-1`` was called "not a module" without
    a fix: each is refused, naming the value and the default layer; ``None`` reads the default."""
    model = tiny_timm_vit()
    x = torch.randn(2, 3, 32, 48)
    with pytest.raises(InputError, match=rf"layer={layer!r} is not a module.*e\.g\. '{gradcam_layer(model)}'"):
        vitviz.explain(model, x, "gradcam", layer=layer)
    torch.testing.assert_close(vitviz.explain(model, x, "gradcam", layer=None),
                               vitviz.explain(model, x, "gradcam", layer=gradcam_layer(model)))


def test_gradcam_has_no_default_layer_on_parallel_branches_and_reads_a_parallel_scaling_blocks_one_norm():
    """timm's ParallelThingsBlock reads its input through one norm per branch: the default layer was branch 0's
    attention norm, a map of one branch passed off as the block's; it is refused, naming the branches, their norms
    and the previous block, and layer= still reads any. ParallelScalingBlock (one in_norm feeding attention and MLP)
    was refused as having no residual block: it reads that norm."""
    import re

    import timm
    from conftest import tiny_parallel

    model = timm.create_model("vit_small_patch16_18x2_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                              embed_dim=32, num_heads=2, num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    match = (r"the last block 'blocks\.1' \(ParallelThingsBlock\) runs 2 attention branches in parallel "
             r"\('blocks\.1\.attns\.0\.attn', 'blocks\.1\.attns\.1\.attn'\).*'blocks\.1\.attns\.0\.norm', "
             r"'blocks\.1\.attns\.1\.norm', 'blocks\.1\.ffns\.0\.norm', 'blocks\.1\.ffns\.1\.norm'\).*one branch only"
             r".*layer='blocks\.1\.attns\.0\.norm', or layer='blocks\.0', the previous block")
    with pytest.raises(InputError, match=match):
        gradcam_layer(model)
    with pytest.raises(InputError, match=match):
        vitviz.explain(model, x, "gradcam")
    assert vitviz.explain(model, x, "gradcam", layer="blocks.0").shape == (2, 4, 4)
    with pytest.raises(InputError, match=re.escape("layer='' is not a module name") + ".*no default"):
        vitviz.explain(model, x, "gradcam", layer="")
    scaling = tiny_parallel("parallel")
    assert gradcam_layer(scaling) == "blocks.1.in_norm"
    x = torch.randn(2, 3, 32, 48)
    torch.testing.assert_close(vitviz.explain(scaling, x, "gradcam", target=[0, 2]),
                               vitviz.explain(scaling, x, "gradcam", target=[0, 2], layer="blocks.1.in_norm"))


def test_integrated_gradients_warns_when_the_path_integral_is_not_converged(images):
    """Sundararajan et al. (2017), Sec. 3: the quadrature must be checked against completeness, the attributions
    summing to F(x) - F(x') (their 20 to 300 steps keep it within 5%). With too few steps the maps came back with
    no word: on this model 2 steps miss F(x) - F(x') by about 30% and 5 steps by about 10%. A call whose error
    exceeds 5% of F(x) - F(x') on some image now warns, naming the error, the image and the fix; enough steps stay
    silent."""
    import warnings

    from vitviz.errors import CompletenessWarning

    torch.manual_seed(0)
    model = tiny_timm_vit(reg_tokens=2)
    x = torch.randn(4, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vitviz.integrated_gradients(model, x, n_steps=50)
    with pytest.warns(CompletenessWarning) as record:
        few, delta = vitviz.integrated_gradients(model, x, n_steps=2, return_delta=True, batch_size=2)
    assert len(record) == 1  # one warning for the call, not one per batch
    with torch.no_grad():
        logits, base = model(x), model(torch.zeros_like(x))
    c = logits.argmax(-1)
    gap = (logits.gather(1, c[:, None]) - base.gather(1, c[:, None]))[:, 0].double()
    error = (few.double().sum(dim=(1, 2)) - gap).abs() / gap.abs()
    torch.testing.assert_close(error, delta.double().abs() / gap.abs(), atol=1e-4, rtol=1e-3)
    worst = int(error.argmax())
    assert error[worst] > 0.2
    msg = str(record[0].message)
    assert "n_steps=2" in msg and f"image {worst}" in msg and "increase n_steps" in msg
    assert f"off by {float(error[worst]):.0%}" in msg
    with pytest.warns(CompletenessWarning):  # also when the maps are pooled to |attribution|
        vitviz.explain(model, x, "integrated_gradients", n_steps=2, pool="abs", batch_size=2)


def test_input_x_gradient_multiplies_the_normalised_input_not_the_raw_pixels():
    """Pinned difference: vitviz takes the gradient with respect to the model's normalised input ``(x - m) / s``, so
    its input x gradient is ``(x - m) * dF/dx`` in pixel units (input x gradient against the mean image, one
    Riemann step of integrated gradients from vitviz's baseline), while captum's ``InputXGradient`` on a model that
    normalises its own [0, 1] pixels gives ``x * dF/dx``: another map, whose black pixels get no attribution."""
    from captum.attr import InputXGradient

    model = tiny_timm_vit()
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]

    class Normalising(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, raw):
            return self.model((raw - mean) / std)

    raw = torch.rand(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([1, 3])
    captum_raw = loop_pool(InputXGradient(Normalising()).attribute(raw.clone().requires_grad_(True), target=target).detach(), 4, 6, 8)
    r = raw.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(Normalising()(r).gather(1, target[:, None]).sum(), r)
    got = vitviz.input_x_gradient(model, (raw - mean) / std, target=target)
    torch.testing.assert_close(got, loop_pool((raw - mean) * grad, 4, 6, 8), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got, captum_raw, atol=1e-3)


@pytest.mark.parametrize("value", ["no", "False", None])
def test_return_delta_must_be_a_bool(images, value):
    """``return_delta="no"`` is truthy: the call returned a (maps, deltas) tuple where maps were asked for. It is
    refused, naming the argument and the value."""
    from vitviz.errors import InputTypeError

    with pytest.raises(InputTypeError, match=rf"^return_delta={value!r} is not a bool; pass True or False"):
        vitviz.integrated_gradients(tiny_timm_vit(), images, n_steps=20, return_delta=value)


@pytest.mark.filterwarnings("ignore::vitviz.errors.CompletenessWarning")  # 4 steps on purpose
def test_integrated_gradients_is_gauss_legendre_not_the_papers_riemann_sum(images):
    """Pinned difference: Sundararajan et al. (2017), Sec. 3 approximate Eq. (1) by the right Riemann sum
    ``(x - x') / m * sum_k grad F(x' + k/m (x - x'))``; vitviz (captum's default) uses ``m``-point Gauss-Legendre
    quadrature on [0, 1], which converges faster: at 4 points the two differ, and vitviz's is Gauss-Legendre."""
    import numpy as np

    model = tiny_timm_vit()
    target = torch.tensor([1, 3])

    def path(alphas, weights):
        total = torch.zeros_like(images)
        for a, w in zip(alphas, weights):
            xa = (a * images).clone().requires_grad_(True)  # baseline x' = 0
            (g,) = torch.autograd.grad(model(xa).gather(1, target[:, None]).sum(), xa)
            total += w * g
        return loop_pool(images * total, 4, 6, 8)

    nodes, weights = np.polynomial.legendre.leggauss(4)
    gauss = path((nodes + 1) / 2, weights / 2)
    riemann = path([k / 4 for k in range(1, 5)], [1 / 4] * 4)
    got = vitviz.integrated_gradients(model, images, target=target, n_steps=4)
    torch.testing.assert_close(got, gauss, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got, riemann, atol=1e-4)
