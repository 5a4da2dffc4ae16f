"""vitviz.sanity_checks (Adebayo et al. 2018): the user's model untouched, what each step randomises, the
similarity measures against scipy / scikit-image / a direct computation, and the verdicts."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import tiny_timm_vit
from scipy.stats import spearmanr

import vitviz
from vitviz.analysis.sanity import (
    TESTS,
    _other_classes,
    randomisation_layers,
    randomise_,
    sanity_checks,
    sanity_summary,
)
from vitviz.analysis.similarity import scale_unit, spearman, ssim, ssim_reference
from vitviz.errors import InputError

LAYERS = ["head", "norm", "block 1", "block 0", "embeddings"]


@pytest.fixture
def model():
    return tiny_timm_vit()


@pytest.fixture
def images():
    return torch.randn(3, 3, 32, 48, generator=torch.Generator().manual_seed(1))


def fixed_map(model, x, target):
    """Ignores the weights (and the class): the same map for every model."""
    gh, gw = vitviz.inspect(model).grid_size
    return torch.arange(gh * gw, dtype=torch.float32).reshape(1, gh, gw).repeat(len(x), 1, 1)


def fresh_noise(model, x, target):
    """New noise on every call: passes a naive randomisation test without depending on the model."""
    gh, gw = vitviz.inspect(model).grid_size
    return torch.rand(len(x), gh, gw)


def test_user_model_is_untouched(model, images):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    nets = []

    def spy(net, x, target):
        nets.append(net)
        return fixed_map(net, x, target)

    sanity_checks(model, images, ["chefer", spy], tests=("cascading", "independent"))
    assert nets and all(net is not model for net in nets)  # every map is made on a copy
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [id(p) for p in model.parameters()] == params  # the same parameter objects, not copies put back
    assert not model._forward_hooks and all(not m._forward_hooks for m in model.modules())


def test_layers_top_down(model):
    layers = randomisation_layers(model)
    assert [n for n, _ in layers] == LAYERS
    names = dict(layers)
    assert names["head"] == ["head.weight", "head.bias"]
    assert all(p.startswith("blocks.1.") for p in names["block 1"])
    assert set(names["embeddings"]) == {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"}
    flat = [p for _, ps in layers for p in ps]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))  # each parameter in exactly one layer


@pytest.mark.parametrize("case", ["parallel", "differential-parallel"])
def test_layers_of_blocks_whose_attention_module_is_the_block(case):
    """timm's ParallelScalingBlock runs attention and MLP in one module, the attention module vitviz reads: no block
    was found, so the cascading test randomised head, norm and embeddings and never a block (the maps' dependence on
    every block went unmeasured, without a word). Each block is now a layer of its own."""
    from conftest import tiny_parallel

    model = tiny_parallel(case)
    layers = randomisation_layers(model)
    assert [n for n, _ in layers] == ["head", "norm", "block 1", "block 0", "embeddings"]
    assert all(p.startswith(f"blocks.{i}.") for i in (0, 1) for p in dict(layers)[f"block {i}"])
    flat = [p for _, ps in layers for p in ps]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))  # each parameter in exactly one layer


def test_what_each_step_randomises(model, images):
    """A spy method records which parameters differ from the trained model at every call."""
    trained = {k: v.clone() for k, v in model.named_parameters()}
    seen: list[frozenset[str]] = []

    def spy(net, x, target):
        seen.append(frozenset(n for n, p in net.named_parameters() if not torch.equal(p, trained[n])))
        return fixed_map(net, x, target)

    sanity_checks(model, images, [spy], tests=("independent", "cascading"))
    layers = randomisation_layers(model)
    ref, independent, cascading = seen[0], seen[1:1 + len(layers)], seen[1 + len(layers):]
    assert ref == frozenset()
    for changed, (_, names) in zip(independent, layers):
        assert changed == frozenset(names)  # one layer, all of its parameters
    done: set[str] = set()
    for changed, (_, names) in zip(cascading, layers):
        done |= set(names)
        assert changed == frozenset(done)  # cumulative, from the head down
    assert len(cascading) == len(layers)


def test_randomise_is_seeded_and_independent_of_order(model):
    a, b = tiny_timm_vit(), tiny_timm_vit()
    b.load_state_dict(a.state_dict())
    randomise_(a, ["head.weight"], seed=3, layer="head")
    randomise_(b, ["norm.weight"], seed=3, layer="norm")
    randomise_(b, ["head.weight"], seed=3, layer="head")
    assert torch.equal(a.head.weight, b.head.weight)
    w = a.head.weight.detach()
    assert w.abs().max() <= 0.04 + 1e-7 and 0.01 < float(w.std()) < 0.02  # trunc. normal, std 0.02, cut at 2 std


def test_weight_independent_methods_fail(model, images):
    df = sanity_checks(model, images, [fixed_map, "random", "chefer"], seed=0)
    s = sanity_summary(df)
    casc = df[(df.test == "cascading") & (df.metric == "spearman_abs")]
    assert np.allclose(casc[casc.method == "fixed_map"].value, 1.0)
    assert np.allclose(casc[casc.method == "random"].value, 1.0)  # seeded: the same map, whatever the weights
    assert s.loc["fixed_map", "parameter_test"] == "FAIL" and s.loc["fixed_map", "verdict"] == "FAIL"
    assert s.loc["fixed_map", "random_logit_test"] == "FAIL"  # a callable takes a target, so it is tested
    assert s.loc["random", "verdict"] == "FAIL"
    assert s.loc["random", "random_logit_test"] == "n/a"  # not class-specific: no fake pass
    rl = df[(df.test == "random_logit") & (df.method == "random")]
    assert len(rl) and rl.value.isna().all()
    assert s.loc["chefer", "parameter_test"] == "PASS"


def test_fresh_noise_is_unstable_not_a_pass(model, images):
    s = sanity_summary(sanity_checks(model, images, [fresh_noise], tests=("cascading", "repeat")))
    assert s.loc["fresh_noise", "parameter_test"] == "PASS"  # what a naive test would conclude
    assert s.loc["fresh_noise", "verdict"] == "UNSTABLE"


def test_a_method_no_test_decides_is_untested_not_a_pass(model, images):
    """Without the cascading test, a method that is not class-specific (rollout, the random baseline) has no test
    that can fail it: its verdict is UNTESTED, never PASS; a class-specific one is still decided by random-logit."""
    s = sanity_summary(sanity_checks(model, images, ["rollout", "random", "chefer"], tests=("random_logit", "repeat")))
    assert (s.loc[["rollout", "random"], "parameter_test"] == "n/a").all()
    assert (s.loc[["rollout", "random"], "random_logit_test"] == "n/a").all()
    assert (s.loc[["rollout", "random"], "verdict"] == "UNTESTED").all()
    assert s.loc["chefer", "random_logit_test"] in ("PASS", "FAIL")
    assert s.loc["chefer", "verdict"] == s.loc["chefer", "random_logit_test"]


def test_chefer_changes_with_top_block(model, images):
    df = sanity_checks(model, images, ["chefer", "rollout"], tests=("independent",), steps=["block 1", "head"])
    sub = df[df.metric == "spearman_abs"]
    ch = sub[(sub.method == "chefer") & (sub.layer == "block 1")].value
    assert (ch < 0.99).all()
    # rollout never reads the head: unchanged exactly when only the head is randomised
    ro = sub[(sub.method == "rollout") & (sub.layer == "head")].value
    assert np.allclose(ro, 1.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_spearman_against_scipy(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(4, 6))
    b = a + rng.normal(size=(4, 6))
    a[0, :3] = a[0, 0]  # ties share their mean rank
    assert spearman(a, b) == pytest.approx(spearmanr(a.ravel(), b.ravel()).statistic, abs=1e-12)
    assert spearman(np.abs(a), np.abs(b)) == pytest.approx(
        spearmanr(np.abs(a).ravel(), np.abs(b).ravel()).statistic, abs=1e-12)
    assert np.isnan(spearman(np.ones((4, 6)), b))


def direct_ssim(a, b, w):
    """Wang et al. (2004) Eq. (13), window by window, sample (co)variances."""
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    vals = []
    for i in range(a.shape[0] - w + 1):
        for j in range(a.shape[1] - w + 1):
            x, y = a[i:i + w, j:j + w].ravel(), b[i:i + w, j:j + w].ravel()
            mx, my = x.mean(), y.mean()
            vx, vy, cxy = x.var(ddof=1), y.var(ddof=1), np.cov(x, y, ddof=1)[0, 1]
            vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(vals))


@pytest.mark.parametrize("shape", [(8, 8), (9, 12), (4, 6)])
def test_ssim_against_direct_and_skimage(shape):
    rng = np.random.default_rng(0)
    a = rng.normal(size=shape)
    b = a + 0.5 * rng.normal(size=shape)
    ua, ub = scale_unit(a), scale_unit(b)
    w = min(7, *shape) - (1 - min(7, *shape) % 2)
    assert ssim_reference(ua, ub, win_size=w) == pytest.approx(direct_ssim(ua, ub, w), abs=1e-10)
    skimage = pytest.importorskip("skimage.metrics")
    assert ssim(a, b) == pytest.approx(skimage.structural_similarity(ua, ub, data_range=1.0, win_size=w), abs=1e-12)
    assert ssim_reference(ua, ub, win_size=w) == pytest.approx(ssim(a, b), abs=1e-10)
    assert ssim(a, a) == pytest.approx(1.0)


def test_random_logit_picks_another_class(model, images):
    pred = torch.arange(10) % 5
    for seed in range(20):
        other = _other_classes(pred, 5, seed)
        assert (other != pred).all() and ((other >= 0) & (other < 5)).all()
    drawn = torch.stack([_other_classes(torch.zeros(1, dtype=torch.long), 5, s) for s in range(200)]).ravel()
    assert set(drawn.tolist()) == {1, 2, 3, 4}  # every other class, never the predicted one
    targets = []

    def spy(net, x, target):
        targets.append(target.clone())
        return fixed_map(net, x, target)

    sanity_checks(model, images, [spy], tests=("random_logit",))
    assert torch.equal(targets[0], model(images).argmax(-1))
    assert (targets[1] != targets[0]).all()


def test_deterministic_with_seed(model, images):
    kw = dict(methods=["chefer", "random"], tests=("cascading", "random_logit"), steps=["head", "block 1"])
    a = sanity_checks(model, images, seed=5, **kw)
    b = sanity_checks(model, images, seed=5, **kw)
    c = sanity_checks(model, images, seed=6, **kw)
    assert a.equals(b)
    casc = (a.test == "cascading") & (a.method == "chefer")
    assert not np.allclose(a[casc].value, c[casc].value)


def test_tidy_columns_and_errors(model, images):
    df = sanity_checks(model, images, ["attention"], tests=("cascading",))
    assert list(df.columns) == ["test", "method", "step", "layer", "image", "metric", "value"]
    assert len(df) == len(LAYERS) * 3 * 3
    assert all(np.isscalar(v) for v in df.attrs.values())
    with pytest.raises(InputError, match="not one of"):
        sanity_checks(model, images, ["nope"])
    with pytest.raises(InputError, match="not layers"):
        sanity_checks(model, images, ["attention"], steps=["block 9"])
    with pytest.raises(InputError, match=r"steps=\['head'\] selects .* tests=\['repeat'\] runs neither"):
        sanity_checks(model, images, ["attention"], tests=("repeat",), steps=["head"])


def test_plot(model, images):
    from matplotlib.axes import Axes

    df = sanity_checks(model, images, ["attention", "chefer"], tests=("cascading",))
    ax = vitviz.plot_sanity_checks(df)
    assert isinstance(ax, Axes)
    # the table names model.blocks[i] "block i"; the figure counts blocks from 1, as every vitviz figure does
    assert list(dict.fromkeys(df["layer"])) == LAYERS
    assert [t.get_text() for t in ax.get_xticklabels()] == ["head", "norm", "block 2", "block 1", "embeddings"]
    assert ax.get_ylabel() == "Spearman rank correlation,\n|trained map| vs |randomised map|"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["attention", "chefer", "fail at or above 0.5"]  # the threshold named off the curves
    assert not ax.texts


def tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                             num_classes=3).eval()


def hf_vit():
    pytest.importorskip("transformers")
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, num_labels=3)
    return ViTForImageClassification(cfg).eval()


@pytest.mark.parametrize("build, blocks, head, norm", [
    (tv_vit, ["encoder.layers.encoder_layer_1.", "encoder.layers.encoder_layer_0."], "heads.", "encoder.ln."),
    (hf_vit, ["vit.layers.1.", "vit.layers.0."], "classifier.", "vit.layernorm."),  # transformers 5 names
])
def test_layers_of_other_families(build, blocks, head, norm):
    """The library's own module names (written out here), top-down; every parameter in exactly one layer."""
    model = build()
    layers = randomisation_layers(model)
    assert [n for n, _ in layers] == LAYERS
    d = dict(layers)
    assert d["head"] and all(p.startswith(head) for p in d["head"])
    assert d["norm"] and all(p.startswith(norm) for p in d["norm"])
    for name, prefix in zip(["block 1", "block 0"], blocks):
        own = [n for n, _ in model.named_parameters() if n.startswith(prefix)]
        assert sorted(d[name]) == sorted(own) and own
    flat = [p for _, ps in layers for p in ps]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))


def test_a_map_of_the_wrong_shape_is_refused(model, images):
    with pytest.raises(InputError, match=r"\(B, gh, gw\)"):
        sanity_checks(model, images, [lambda m, x, t: torch.zeros(len(x), 24)], tests=("repeat",))


@pytest.mark.parametrize("shape", [(2, 6), (1, 8), (6, 2)])
def test_ssim_refuses_maps_smaller_than_its_smallest_window(shape):
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match=rf"{re.escape(str(shape))}.*at least 3x3"):
        ssim(rng.random(shape), rng.random(shape))
    with pytest.raises(InputError, match="win_size=7"):
        ssim_reference(rng.random((4, 6)), rng.random((4, 6)), win_size=7)  # larger than the map
    with pytest.raises(InputError, match=r"\(4, 6\) and \(4, 5\)"):
        ssim(rng.random((4, 6)), rng.random((4, 5)))
    assert np.isfinite(ssim(rng.random((3, 5)), rng.random((3, 5))))  # the smallest window, 3x3, fits


def test_one_test_method_or_step_given_as_a_string_is_that_one(model, images):
    one = sanity_checks(model, images, "attention", tests="cascading", steps="head")
    listed = sanity_checks(model, images, ["attention"], tests=["cascading"], steps=["head"])
    assert set(one["test"]) == {"cascading"} and set(one["layer"]) == {"head"} and set(one["method"]) == {"attention"}
    assert one.equals(listed)
    with pytest.raises(InputError, match=r"^tests=\['cascade'\]: each must be one of"):
        sanity_checks(model, images, "attention", tests="cascade")


@pytest.mark.parametrize("kw, match", [
    (dict(tests=None), r"^tests=None is a NoneType, not a list of names; pass one of \('cascading', .*\) or a list "
                       r"of them, e.g. tests=\['cascading'\]"),
    (dict(methods=3), r"^methods=3 is a int, not a list of methods; pass vitviz.explain method names"),
    (dict(steps=3), r"^steps=3 is a int, not a list of names; pass one of \('head', .*\) or a list of them"),
], ids=["tests-none", "methods-int", "steps-int"])
def test_arguments_of_the_wrong_type_are_refused_with_the_argument_named(model, images, kw, match):
    from vitviz.errors import InputTypeError

    with pytest.raises(InputTypeError, match=match):
        sanity_checks(model, images, **{"methods": ["attention"], "tests": ["cascading"], **kw})


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_ssim_of_a_map_with_a_non_finite_value_is_nan_as_spearman_is(bad):
    """A map holding NaN was min-max scaled to all zeros (its max is NaN): SSIM then compared a blank map, near 0
    against any other map and 1 against itself, numbers a sanity check would read as a verdict. It is NaN, as
    Spearman's correlation of such a map is."""
    rng = np.random.default_rng(0)
    a = rng.random((8, 8))
    b = a.copy()
    b[2, 3] = bad
    assert np.isnan(spearman(a, np.where(np.isfinite(b), b, np.nan)))
    for x, y in ((a, b), (b, a), (b, b.copy())):
        assert np.isnan(ssim(x, y))
    assert ssim(a, a.copy()) == pytest.approx(1.0)


def constant_map(model, x, target):
    """The same flat map for every image, model and class: Spearman's rho is undefined (nan) at every step."""
    gh, gw = vitviz.inspect(model).grid_size
    return torch.zeros(len(x), gh, gw)


def test_a_constant_map_is_untested_not_a_pass(model, images):
    """Every similarity of a constant map is nan: no step decides the parameter test, so it must not read PASS."""
    df = sanity_checks(model, images, [constant_map], tests=("cascading", "random_logit", "repeat"))
    sub = df[df.metric == "spearman_abs"]
    assert sub.value.isna().all()
    s = sanity_summary(df)
    assert s.loc["constant_map", "parameter_test"] == "n/a"
    assert s.loc["constant_map", "verdict"] == "UNTESTED"


@pytest.mark.parametrize("seed", [2 ** 62, -(2 ** 62), 2 ** 70])
def test_a_large_seed_seeds_the_random_weights(seed):
    """``randomise_`` takes any int ``seed``: the weights' generator seed was ``seed * 1_000_003 + crc32(layer)``,
    which overflowed torch's 64-bit seed from about 2**44 on (a raw ValueError, "Overflow when unpacking long
    long"); it is now made as every per-item seed of vitviz is (``perturbation.image_seed``), reduced into range,
    and still depends on the seed."""
    a, b = tiny_timm_vit(), tiny_timm_vit()
    randomise_(a, ["head.weight"], seed=seed, layer="head")
    randomise_(b, ["head.weight"], seed=seed + 1, layer="head")
    assert not torch.equal(a.head.weight, b.head.weight)


@pytest.mark.parametrize("seed", [-1, 2 ** 32, 2 ** 62])
def test_a_seed_the_generators_cannot_take_is_refused_by_name(model, images, seed):
    """The random-logit test draws the other class with NumPy, which takes no negative seed, and the ``random``
    method seeds torch with ``seed * 1_000_003 + image``, which overflows from about 2**43: ``seed=-1`` failed in
    the random-logit test with NumPy's bare "expected non-negative integer", ``seed=2**62`` in ``random``'s maps with
    torch's "Overflow when unpacking long long". A seed outside [0, 2**32) is refused up front, naming it; the
    largest one taken runs every test."""
    with pytest.raises(InputError, match=rf"^seed={seed} must be an int in \[0, 2\*\*32\)"):
        sanity_checks(model, images, ["chefer"], tests="random_logit", seed=seed)
    df = sanity_checks(model, images, ["chefer", "random"], tests=TESTS, steps="head", seed=2 ** 32 - 1)
    assert set(df["test"]) == set(TESTS)


@pytest.mark.parametrize("case", ["aimv2-vision", "aimv2-model"])
def test_a_norm_inside_the_embeddings_is_randomised_with_them_not_with_the_final_norm(case):
    """AIMv2 normalises its patch embedding (``embeddings.rms_norm``, before the first block): the cascading test's
    ``norm`` step, the second from the top, re-initialised it with the final norm, so that step destroyed the
    input side of the network too (not top-down). It belongs to the ``embeddings`` step, as timm's ``norm_pre``,
    open_clip's ``ln_pre`` and CLIP's ``pre_layrnorm`` do."""
    pytest.importorskip("transformers")
    from hf_models import hf_case

    model = hf_case(case).model
    p = "vision_model." if case == "aimv2-model" else ""
    layers = dict(randomisation_layers(model))
    assert layers["norm"] == [f"{p}rms_norm.weight"]
    assert f"{p}embeddings.rms_norm.weight" in layers["embeddings"]
    assert list(layers)[-1] == "embeddings"


def test_the_explained_class_stays_the_trained_models_prediction_at_every_step(model, images):
    """Pinned difference: Adebayo et al.'s code (``src/randomize_inceptionv3.py``) explains the argmax of each
    randomised model, quantus the labels it is given; vitviz explains the trained model's prediction at every step
    (module docstring), also where the randomised model predicts another class."""
    trained = model(images).argmax(-1)
    seen = []

    def spy(net, x, target):
        with torch.no_grad():
            seen.append((target.clone(), net(x).argmax(-1)))
        return fixed_map(net, x, target)

    sanity_checks(model, images, [spy], tests="cascading", seed=0)
    assert len(seen) == 1 + len(LAYERS)
    assert all(torch.equal(t, trained) for t, _ in seen)
    assert any(not torch.equal(own, trained) for _, own in seen[1:])  # the randomised models predict otherwise


def test_every_parameter_is_drawn_at_random_where_quantus_resets_modules(model):
    """Pinned difference from quantus's ``MPRT`` (``get_random_layer_generator``): quantus calls
    ``reset_parameters()`` of every module that has one, one module per step, so a LayerNorm is reset to ones and
    zeros (nothing random) and the parameters a ViT holds itself (position embedding, class token) are never
    touched, as ``VisionTransformer`` has no ``reset_parameters``. vitviz's steps are whole layers and draw every
    parameter from the truncated normal, LayerNorm gains and the embeddings included."""
    resettable = {f"{m}.{p}" if m else p for m, mod in model.named_modules() if hasattr(mod, "reset_parameters")
                  for p, _ in mod.named_parameters(recurse=False)}
    assert {"pos_embed", "cls_token"} - resettable == {"pos_embed", "cls_token"}  # out of quantus's reach
    layers = dict(randomisation_layers(model))
    assert {"pos_embed", "cls_token"} <= set(layers["embeddings"])
    net = tiny_timm_vit()
    net.load_state_dict(model.state_dict())
    for name, names in randomisation_layers(net):
        randomise_(net, names, seed=0, layer=name)
    trained = dict(model.named_parameters())
    for n, p in net.named_parameters():
        assert not torch.equal(p, trained[n]), n
    gain = net.norm.weight.detach()
    assert not torch.equal(gain, torch.ones_like(gain)) and float(gain.abs().max()) <= 0.04 + 1e-7


def test_two_methods_of_one_name_are_refused_not_merged(model, images):
    """Two callables of one name (two lambdas are both ``<lambda>``) wrote their rows under that one name, so
    ``sanity_summary`` averaged two different methods into one verdict: here a map that ignores the weights and
    Chefer's relevance, a FAIL and a PASS, read as one method. Methods of one name are refused, as
    ``vitviz.faithfulness`` refuses them."""
    same = lambda net, x, t: fixed_map(net, x, t)  # noqa: E731
    chefer = lambda net, x, t: vitviz.explain(net, x, "chefer", t)  # noqa: E731
    with pytest.raises(InputError, match=r"methods holds two methods named '<lambda>'.*def "):
        sanity_checks(model, images, [same, chefer], tests="cascading")
    with pytest.raises(InputError, match=r"methods holds two methods named 'attention'"):
        sanity_checks(model, images, ["attention", "attention"], tests="repeat")


def test_a_headless_model_is_tested_through_a_score_target():
    """A headless ViT (num_classes=0) with a score function as target: the cascading, independent and repeat tests
    run on the maps of that score, a weight-ignoring map fails the parameter test as on a headed model, and the
    random-logit test (no classes) is not defined: nan rows, n/a, and the reason in the table's attrs."""
    torch.manual_seed(0)
    model = tiny_timm_vit(num_classes=0)
    x = torch.randn(3, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x[:1])[0]
    seen = []

    def cosine(out):
        return torch.nn.functional.cosine_similarity(out, ref[None], dim=-1)

    def fixed_score_map(net, images, target):
        seen.append(target)
        return fixed_map(net, images, target)

    df = sanity_checks(model, x, ["chefer", fixed_score_map, "rollout"], target=cosine, seed=0)
    casc = df[(df.test == "cascading") & (df.metric == "spearman_abs")]
    assert list(dict.fromkeys(casc.sort_values("step").layer)) == LAYERS[1:]  # no head to randomise
    assert seen and all(t is cosine for t in seen)  # a callable method is given the score function
    s = sanity_summary(df)
    assert s.loc["fixed_score_map", "parameter_test"] == "FAIL" and s.loc["fixed_score_map", "verdict"] == "FAIL"
    assert s.loc["rollout", "verdict"] == "FAIL"
    assert s.loc["chefer", "parameter_test"] == "PASS"
    assert (s["random_logit_test"] == "n/a").all()
    assert df[df.test == "random_logit"].value.isna().all() and len(df[df.test == "random_logit"])
    assert "random_logit" in df.attrs["not_defined"] and "random_logit" in s.attrs["not_defined"]
    rep = df[(df.test == "repeat") & (df.method == "chefer") & (df.metric == "spearman")]
    assert len(rep) == 3 and np.allclose(rep.value, 1.0)


def test_a_headless_model_runs_class_agnostic_methods_without_a_target_and_names_the_fix_otherwise():
    model = tiny_timm_vit(num_classes=0)
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    df = sanity_checks(model, x, ["rollout"], tests=("cascading",))
    assert sanity_summary(df).loc["rollout", "verdict"] == "FAIL" and df.attrs["not_defined"] == ""
    with pytest.raises(InputError, match=r"methods \['chefer'\] explain a class.*target=lambda out.*"
                                         r"methods=\['rollout', 'attention'\]"):
        sanity_checks(model, x, ["chefer", "rollout"])
    with pytest.raises(InputError, match=r"target=2 names a class.*no classifier head"):
        sanity_checks(model, x, ["rollout"], target=2)


def test_a_headed_model_says_every_test_asked_for_is_defined(model, images):
    df = sanity_checks(model, images, ["chefer"], tests=("random_logit",))
    assert df.attrs["not_defined"] == "" and df[df.test == "random_logit"].value.notna().all()


def test_a_step_the_score_function_does_not_read_decides_no_verdict():
    """A Hugging Face ViTModel's pooler is its 'head' step; a score of last_hidden_state does not read it, so every
    map is unchanged there (rho 1): counting that step would fail every method, Chefer's relevance included."""
    pytest.importorskip("transformers")
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32)
    model = ViTModel(cfg).eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))

    def cls_norm(out):
        return out.last_hidden_state[:, 0].norm(dim=-1)

    df = sanity_checks(model, x, ["chefer", "rollout"], target=cls_norm, tests=("cascading",))
    assert df.attrs["score_unchanged"] == "head"
    casc = df[(df.metric == "spearman_abs") & (df.layer == "head")]
    assert np.allclose(casc.value, 1.0)  # nothing the score reads was randomised
    s = sanity_summary(df)
    assert s.loc["chefer", "parameter_test"] == "PASS"
    assert s.loc["chefer", "cascading_rho"] < 0.5
    assert s.loc["rollout", "parameter_test"] == "FAIL"  # unchanged after the final norm, which the score reads
    # a score that reads the pooler: its step counts
    df = sanity_checks(model, x, ["chefer"], target=lambda out: out.pooler_output.norm(dim=-1), tests=("cascading",))
    assert df.attrs["score_unchanged"] == ""


def test_spearman_refuses_maps_of_two_grids_that_hold_as_many_patches():
    """A 4x6 and a 6x4 map have 24 patches each, but patch k is not at one place in both: no correlation of them
    means anything, so they are refused as ssim refuses them."""
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 6)), rng.random((6, 4))
    for f in (spearman, ssim):
        with pytest.raises(InputError, match=r"\(4, 6\) and \(6, 4\)"):
            f(a, b)


def test_spearman_and_ssim_take_half_precision_tensors():
    rng = np.random.default_rng(1)
    a, b = (np.round(rng.random((5, 7)) * 64) / 64 for _ in range(2))  # exact in bfloat16 and float16
    for dtype in (torch.bfloat16, torch.float16):
        ta, tb = torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)
        assert spearman(ta, tb) == pytest.approx(spearmanr(a.ravel(), b.ravel()).statistic, rel=1e-12)
        assert ssim(ta, tb) == pytest.approx(ssim(a, b), rel=1e-12)


@pytest.mark.parametrize("family", ["timm", "torchvision"])
def test_sanity_checks_inside_an_open_capture_is_refused_and_touches_neither(family):
    """The copies sanity_checks randomises are deep copies, which would carry an open capture's probes: on
    torchvision they compute attention with the original model's weights (seen: the cascading rows of block 0 and
    the embeddings moved by up to 0.76 from the plain call's), and on every family the copies' maps reach the
    capture in place of the user's. Refused before anything runs; the capture keeps its maps, and the call outside
    the block gives the plain result."""
    from untouched import MODELS
    from untouched import images as make_images

    from vitviz.errors import CaptureError

    build, size = MODELS[family]
    torch.manual_seed(0)
    net, x = build().eval(), make_images(size)
    kw = dict(methods=["rollout"], tests=("cascading",))
    plain = vitviz.sanity_checks(net, x, **kw)
    with vitviz.capture_attention(net) as cap:
        with torch.no_grad():
            net(x)
        mine = [a.clone() for a in cap.attentions]
        with pytest.raises(CaptureError, match=r"capture_attention block is open.*outside the capture_attention"):
            vitviz.sanity_checks(net, x, **kw)
        assert all(torch.equal(a, b) for a, b in zip(cap.attentions, mine, strict=True))
    after = vitviz.sanity_checks(net, x, **kw)
    np.testing.assert_array_equal(after["value"].to_numpy(), plain["value"].to_numpy())
