"""Sanity checks for relevance maps: Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018.

A map that explains *the model* must change when the model's learned parameters are destroyed. Each test compares
a method's maps on the trained model with its maps after a change, image by image:

==================  ===========================================================================================
test                what changes
==================  ===========================================================================================
``cascading``       Adebayo et al.'s cascading model-parameter randomisation: the parameters are re-initialised from
                    the top of the network down, cumulatively: ``head``, the final ``norm``, the last block, ...,
                    the first block, then the ``embeddings`` (patch embedding, position embedding, prefix
                    tokens, pre-norm). Step ``k`` has every layer up to the ``k``-th randomised.
``independent``     their independent (layer-by-layer) randomisation: one layer at a time, the others trained.
``random_logit``    the random-logit test of Sixt, Granz & Landgraf (ICML 2020, "When Explanations Lie"): the map
                    for each image's predicted class against the map for a random other class (seeded). Only for
                    class-specific methods (the gradient methods and any callable); other methods get ``nan``
                    values and ``"n/a"`` in the summary, never a pass. Not defined for a score function as
                    ``target`` (a headless model): every method gets ``nan`` and ``df.attrs["not_defined"]`` says so.
``repeat``          the method run twice on the unchanged model: a method whose maps differ from run to run (fresh
                    noise) would "pass" the randomisation tests without depending on the model, so the summary
                    calls it ``UNSTABLE`` (mean ``spearman_abs`` of the two runs below 0.99) instead.
==================  ===========================================================================================

Randomisation happens on a ``copy.deepcopy`` of the model (never the user's model). Each re-initialised parameter
is drawn i.i.d. from a truncated normal, mean 0, standard deviation ``std`` (default 0.02, cut at 2 standard
deviations): Adebayo et al. re-initialise the weights at random; vitviz uses the truncated normal with which timm
initialises a ViT's linear layers and position embedding (std 0.02). LayerNorm gains and biases are drawn the same way (their "own" init, ones and zeros,
would not be random). The draw for a layer depends only on ``seed`` and the layer's name, so a layer gets the same
random weights in the cascading and the independent test.

Similarity per image (``vitviz.analysis.similarity``): Spearman's rank correlation of the absolute-value maps
(``spearman_abs``) and of the signed maps (``spearman``), as Adebayo et al. report both, and SSIM of the maps
scaled to ``[0, 1]`` (``ssim``); not their HOG similarity. The target of gradient methods stays the class predicted
by the trained model at every step (so only the parameters change).

Where the popular implementations differ (each pinned by a test in ``tests/test_sanity.py``):

- Adebayo et al.'s code (``adebayoj/sanity_checks_saliency``) re-initialises each block with its variables' own
  initialisers and explains the arg-max of each *randomised* model, so its class can change from step to step;
  vitviz keeps the trained model's class.
- quantus's ``MPRT`` (``ModelParameterRandomisation``) calls ``reset_parameters()`` of every module that has one,
  one module per step (each ``Linear`` and ``LayerNorm`` a step of its own, not a block), so a LayerNorm is reset to
  ones and zeros (nothing random), and the parameters a ViT holds itself (timm's ``pos_embed``, ``cls_token``,
  ``reg_token``) are never re-initialised; quantus also explains the labels it is given, not the prediction. vitviz's
  steps are whole layers and every parameter of a step is drawn at random, the embeddings included.

Verdict (``sanity_summary``): a method FAILS the parameter test when, at any cascading step up to and including
the last block (head; head and final norm; head, final norm and last block), the mean over images of
``spearman_abs`` is at least ``threshold`` (default 0.5), i.e. its map is still largely the trained model's after
the layers that produce the output were destroyed. Justification: Spearman's rho between two maps of ``P``
patches that share nothing has standard deviation ``1 / sqrt(P - 1)`` (0.13 on an 8 x 8 grid, 0.07 on 14 x 14), so
0.5 is far above chance agreement, while a map that keeps rho >= 0.5 keeps most of its patch ordering. Rollout
and raw attention ignore the head and the final norm, so their rho is exactly 1 at the first two steps. The same
threshold decides the random-logit test (mean ``spearman_abs`` between the two classes' maps). The threshold is a
choice, not the paper's (Adebayo et al. judge the curves by eye): the table keeps the numbers, so another
threshold is one call away. The test is necessary, not sufficient: a map that changes with the weights can still
be wrong. A method no test decides (no cascading step in the table, and no random-logit test it can take) is
``UNTESTED``, never a pass. With a score function as ``target`` (a headless model), a step after which that score
is unchanged on every image does not count towards the verdict (``df.attrs["score_unchanged"]``): the score does
not read what was randomised (a Hugging Face ``ViTModel``'s pooler, for a score of ``last_hidden_state``), so every
method's map is unchanged there and the step would fail them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.analysis import explain as explain_module
from vitviz.analysis.perturbation import image_seed
from vitviz.analysis.similarity import spearman, ssim
from vitviz.core.batching import iter_batches
from vitviz.core.blocks import block_paths
from vitviz.core.calls import in_eval_mode
from vitviz.core.contexts import model_copy, quantized_layers, refuse_quantized
from vitviz.core.families import family_of
from vitviz.core.images import Images
from vitviz.core.spec import inspect
from vitviz.core.targets import Target, logits_of, resolve_target
from vitviz.core.util import is_int, is_number, name_list
from vitviz.errors import CaptureError, InputError, InputTypeError

__all__ = ["METRICS", "TESTS", "randomisation_layers", "randomise_", "sanity_checks", "sanity_summary"]

TESTS = ("cascading", "independent", "random_logit", "repeat")
METRICS = ("spearman_abs", "spearman", "ssim")
MapFn = Callable[[nn.Module, torch.Tensor, Any], torch.Tensor]


def randomisation_layers(model: nn.Module) -> list[tuple[str, list[str]]]:
    """The layers of the cascading test, top-down, each with the names of the parameters it re-initialises.

    Order: ``head``, ``norm`` (the final norm), ``block {depth-1}`` ... ``block 0``, ``embeddings`` (patch
    embedding, position embedding, prefix tokens and any pre-norm). Layers without parameters are left out;
    parameters in none of them (e.g. a shared relative-position table) are never randomised.

    Args:
        model: any ViT ``vitviz.inspect`` reads.

    Returns:
        ``[(layer name, [parameter names])]`` from the output to the input.
    """
    spec = inspect(model)
    refuse_quantized(model, "the randomisation tests",
                     "its weights are packed in a quantized kernel or held as quantized tensors, not float parameters "
                     "the randomisation tests can re-initialise, so those tests would keep them trained and understate "
                     "how much a map depends on them; run the randomisation tests on the float model it was quantized "
                     "from (the repeat test and, for class-agnostic maps, the random-logit test run on the quantized "
                     "model: tests=('repeat', 'random_logit'))")
    comps = family_of(model).param_components(model)
    params = [n for n, _ in model.named_parameters()]

    def under(prefixes: Sequence[str]) -> list[str]:
        return [p for p in params if p.startswith(tuple(prefixes))] if prefixes else []

    pre_norms = [p for p in under(comps.get("norm", ())) if _before_blocks(p)]
    norms = [p for p in under(comps.get("norm", ())) if p not in pre_norms]
    layers: list[tuple[str, list[str]]] = [("head", under(comps.get("head", ()))), ("norm", norms)]
    paths = block_paths(model)
    for i in sorted(set(spec.attention_blocks or range(len(spec.attention_modules))), reverse=True):
        layers.append((f"block {i}", under([paths[i] + "."]) if i in paths else []))
    embed = under([*comps.get("patch_embed", ()), *comps.get("pos_embed", ()), *comps.get("prefix_tokens", ())])
    layers.append(("embeddings", embed + pre_norms))
    return [(name, ps) for name, ps in layers if ps]


def _before_blocks(param: str) -> bool:
    """Whether a parameter of the ``norm`` component belongs to a norm that runs before the first block: one
    named a pre-norm (timm ``norm_pre``, open_clip ``ln_pre``, CLIP ``pre_layrnorm``) or held by the embeddings
    (AIMv2 ``embeddings.rms_norm``); the others are the final norm."""
    modules = param.split(".")[:-1]
    return bool(modules) and ("pre" in modules[-1] or any(m.startswith("embed") for m in modules))


def randomise_(model: nn.Module, names: Sequence[str], *, seed: int, layer: str, std: float = 0.02) -> None:
    """Re-initialise the parameters ``names`` of ``model`` in place: truncated normal (mean 0, ``std``, +-2 std).

    The draw depends on ``seed`` and ``layer`` only (a CPU generator seeded by ``perturbation.image_seed(seed,
    layer)``, any int ``seed``), whatever the device.
    """
    gen = torch.Generator().manual_seed(image_seed(seed, layer))
    named = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            p = named[n]
            new = torch.empty(p.shape, dtype=torch.float32)
            nn.init.trunc_normal_(new, std=std, a=-2 * std, b=2 * std, generator=gen)
            p.copy_(new.to(p.dtype))


def _available(method: str, model: nn.Module) -> bool:
    """Whether ``method`` can run on ``model`` by default: the optional library a baseline needs is installed, and
    ``attnlrp`` has rules for the model's family, and a gradient method has a backward pass (no quantized layer)."""
    from vitviz.analysis import baselines

    if method in explain_module.GRADIENT_METHODS and quantized_layers(model):
        return False  # quantized kernels have no backward pass
    if method == "attnlrp":
        from vitviz.analysis.attnlrp import attnlrp_supported

        return attnlrp_supported(model)
    return method not in baselines.LIBRARIES or method in baselines.installed()


def _method_name(m: str | MapFn, i: int) -> str:
    return m if isinstance(m, str) else getattr(m, "__name__", f"callable_{i}")


def _class_specific(m: str | MapFn) -> bool:
    return not isinstance(m, str) or m in explain_module.GRADIENT_METHODS


def _run(m: str | MapFn, model: nn.Module, x: torch.Tensor, classes: torch.Tensor, opts: Mapping[str, Any]
         ) -> np.ndarray:
    if isinstance(m, str):
        t = classes if m in explain_module.GRADIENT_METHODS else None
        maps = explain_module.explain(model, x, m, t, **opts)
    else:
        maps = m(model, x, classes)
    if not isinstance(maps, torch.Tensor) or maps.ndim != 3 or maps.shape[0] != len(x):
        got = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise InputError(f"method {_method_name(m, 0)!r} returned {got}; a map method must return a (B, gh, gw) "
                         f"tensor for a batch of B={len(x)} images")
    return maps.detach().float().cpu().numpy()


def _compare(rows: list[dict[str, Any]], ref: np.ndarray, new: np.ndarray, **keys: Any) -> None:
    for i, (a, b) in enumerate(zip(ref, new)):
        values = {"spearman_abs": spearman(np.abs(a), np.abs(b)), "spearman": spearman(a, b), "ssim": ssim(a, b)}
        for metric, v in values.items():
            rows.append({**keys, "image": i, "metric": metric, "value": v})


def _other_classes(pred: torch.Tensor, num_classes: int, seed: int) -> torch.Tensor:
    """One class per image, uniform over the classes other than ``pred`` (seeded)."""
    if num_classes < 2:
        raise InputError(f"the random-logit test needs at least 2 classes, the model has {num_classes}")
    rng = np.random.default_rng(seed)
    draw = torch.as_tensor(rng.integers(0, num_classes - 1, size=len(pred)), dtype=torch.long)
    return draw + (draw >= pred.cpu()).long()


def _refuse_open_capture(model: nn.Module) -> None:
    """Raise ``CaptureError`` when a ``capture_attention`` block is open on ``model`` (``sanity_checks`` says why)."""
    from vitviz.core.capture import open_probes

    probed = open_probes(model)
    if probed:
        raise CaptureError(
            f"sanity_checks: a vitviz.capture_attention block is open on this {type(model).__name__} ({probed} "
            "attention modules probed); the copies sanity_checks randomises would carry its probes, which compute "
            "with the original model's weights and hand the copies' maps to your capture. Call sanity_checks "
            "outside the capture_attention block (after it closes)")


@in_eval_mode
def sanity_checks(
    model: nn.Module,
    images: Images,
    methods: Sequence[str | MapFn] | None = None,
    target: Target = None,
    *,
    steps: Sequence[str] | None = None,
    tests: Sequence[str] = ("cascading", "independent", "random_logit", "repeat"),
    seed: int = 0,
    std: float = 0.02,
    method_options: Mapping[str, Mapping[str, Any]] | None = None,
    batch_size: int | None = None,
) -> Any:
    """Adebayo et al.'s parameter-randomisation tests and the random-logit test, as a tidy table (module docstring).

    Args:
        model: any ViT ``vitviz.inspect`` reads; it is never modified (the tests run on a deep copy).
        images: a normalised ``(B, 3, H, W)`` tensor or anything ``vitviz.core.batching.iter_batches`` takes.
        methods: ``vitviz.explain`` method names (default: every one in ``vitviz.analysis.explain.METHODS``, read at
            call time, but ``flow``, which is slow, and baselines whose library is not installed) and/or callables
            ``f(model, images (b, 3, H, W), target (b,) classes) -> (b, gh, gw)`` (``target`` is the callable itself
            where ``target=`` is one, ``None`` where no method explains a class), each under a name of its own (a
            callable's ``__name__``; two of one name are refused); one name alone is that method.
        target: what the class-specific methods explain: ``None`` (each image's prediction on the trained model),
            an int, or one per image, kept at every randomisation step; or a callable ``f(output) -> (B,)`` (one
            score per image from the raw output, ``vitviz.core.targets``), the same function at every step: how a
            headless model (``num_classes=0``, an image tower, a Hugging Face ``ViTModel``) is tested. With a
            callable, the random-logit test is not defined (no other class): its rows are ``nan``, the summary says
            ``"n/a"``, and ``df.attrs["not_defined"]`` says why. Methods that explain no class (``rollout``,
            ``attention``, ...) need no target, so a headless model runs them with ``target=None``; a class target
            on a headless model is refused, naming both ways out.
        steps: layer names (``randomisation_layers``) the cascading and independent tests randomise, in top-down
            order (one name: that layer alone); default all.
        tests: any of ``cascading``, ``independent``, ``random_logit``, ``repeat`` (one name: that test alone).
        seed: seeds the random weights, the random other class, and ``random``'s maps; an int in ``[0, 2**32)``.
        std: standard deviation of the re-initialised parameters.
        method_options: per method name, options for ``vitviz.explain``; a name that is neither in ``methods`` nor
            a ``vitviz.explain`` method is refused (options for a known method not run are unused).
        batch_size: images per pass.

    Returns:
        DataFrame with columns ``test``, ``method``, ``step`` (0-based position of the layer top-down; the
        random-logit and repeat tests: 0), ``layer`` (layer name; ``"random class"``, ``"repeat"``), ``image``
        (index in ``images``), ``metric`` (``spearman_abs``, ``spearman``, ``ssim``) and ``value`` (``nan`` where
        a test does not apply or a map is constant). ``df.attrs``: ``seed``, ``std``, ``not_defined`` (``"test:
        why"`` for each test not defined for this ``target``; ``""`` when every test asked for is) and
        ``score_unchanged`` (with a score function as target: the top cascading steps after which it is unchanged
        on every image, comma-separated; ``sanity_summary`` does not judge a method on them).

    Raises:
        CaptureError: a ``vitviz.capture_attention`` block is open on ``model``: the copy randomised here would
            carry its probes, which compute with the original model's weights (before: torchvision's attention
            in the randomised copies was the trained model's) and hand the copies' maps to that capture.
    """
    import pandas as pd

    _refuse_open_capture(model)

    tests = name_list(tests, "tests", TESTS)
    bad = [t for t in tests if t not in TESTS]
    if bad or not tests:
        raise InputError(f"tests={tests!r}: each must be one of {TESTS}")
    if not is_int(seed) or not 0 <= seed < 2 ** 32:  # NumPy takes no negative seed; random's maps overflow above
        raise InputError(f"seed={seed!r} must be an int in [0, 2**32) (it seeds the random weights, classes and "
                         "maps), e.g. seed=0")
    if not is_number(std) or not 0 < std < math.inf:
        raise InputError(f"std={std!r} must be a positive finite number, the standard deviation of the "
                         "re-initialised parameters (e.g. 0.02)")
    if methods is None:
        methods = [m for m in explain_module.METHODS if m != "flow" and _available(m, model)]
    if isinstance(methods, str):
        methods = [methods]  # one method, as in vitviz.faithfulness
    if isinstance(methods, (bytes, Mapping)) or not isinstance(methods, Iterable):
        raise InputTypeError(f"methods={methods!r} is a {type(methods).__name__}, not a list of methods; pass "
                             "vitviz.explain method names (e.g. ['rollout', 'chefer']) or callables f(model, images, "
                             "target), or None for the default set")
    methods = list(methods)
    if not methods:
        raise InputError("methods is empty; pass vitviz.explain method names (e.g. ['rollout', 'chefer']) or "
                         "callables f(model, images, target), or None for the default set")
    for m in methods:
        if isinstance(m, str) and m not in explain_module.METHODS:
            raise InputError(f"methods holds {m!r}, which is not one of {explain_module.METHODS} nor a callable "
                             "f(model, images, target) -> (B, gh, gw)")
        if not isinstance(m, str) and not callable(m):
            raise InputError(f"methods holds {m!r}; give method names or callables f(model, images, target)")
    names = [_method_name(m, i) for i, m in enumerate(methods)]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:  # its rows would be merged with the other's, one verdict for two methods
        raise InputError(f"methods holds two methods named {twice!r}: their rows would share that name and "
                         "sanity_summary would judge them as one method; give each method once, and each callable "
                         "a name of its own (def my_map(model, images, target): ..., not two lambdas)")
    randomising = bool({"cascading", "independent"} & set(tests))
    if steps is not None:
        steps = name_list(steps, "steps", lambda: [n for n, _ in randomisation_layers(model)])
    if steps is not None and not randomising:
        raise InputError(f"steps={list(steps)!r} selects the layers the cascading and independent tests randomise, "
                         f"but tests={list(tests)!r} runs neither; add one of them to tests, or drop steps")
    layers = randomisation_layers(model) if randomising else []
    if steps is not None:
        known = [n for n, _ in layers]
        missing = [s for s in steps if s not in known]
        if missing:
            raise InputError(f"steps={list(steps)!r}: {missing} are not layers of this model; it has {known}")
        if not list(steps):
            raise InputError(f"steps=[] selects no layer to randomise; pass some of {known}, or None for all")
        layers = [(n, ps) for n, ps in layers if n in steps]
    options = explain_module.per_method_options(method_options, [m for m in methods if isinstance(m, str)])
    for m in methods:
        if m == "random":
            options.setdefault("random", {}).setdefault("seed", seed)

    work = model_copy(model)  # normal tensors: the gradient methods run on it under a caller's inference mode
    xs = [x for x in iter_batches(work, images, batch_size)]
    with torch.no_grad():
        outs = [work(x) for x in xs]
    scored = callable(target) and not isinstance(target, (torch.Tensor, np.ndarray))  # a score, not a class
    class_methods = [n for m, n in zip(methods, names) if _class_specific(m)]
    classes: list[Any] = []
    not_defined: dict[str, str] = {}
    if scored:
        start, total = 0, sum(len(x) for x in xs)
        for x, out in zip(xs, outs):  # refuses a callable that does not give one score per image
            resolve_target(target, out, start=start, n_images=total, model=work)
            start += len(x)
        classes = [target] * len(xs)  # the same score function on the trained and on every randomised model
        not_defined["random_logit"] = ("target is a score function, not a class: there is no other class to explain "
                                       "(Sixt et al.'s test needs a classifier's classes)")
    elif target is None and not class_methods:
        classes = [None] * len(xs)  # no method explains a class: none is needed (a headless model runs too)
    else:
        _need_classes(outs[0], work, target, class_methods)
        start, total = 0, sum(len(x) for x in xs)
        for x, out in zip(xs, outs):
            classes.append(resolve_target(target, out, start=start, n_images=total, model=work).classes)
            start += len(x)
    num_classes = logits_of(outs[0], work).shape[-1] if classes and isinstance(classes[0], torch.Tensor) else 0

    def maps_of(m: str | MapFn, net: nn.Module, cls: Sequence[torch.Tensor] | None = None) -> np.ndarray:
        opts = options.get(m, {}) if isinstance(m, str) else {}
        cls = classes if cls is None else cls
        parts, offset = [], 0
        for x, c in zip(xs, cls):
            o = dict(opts)
            if m == "random":
                o.setdefault("offset", offset)
            parts.append(_run(m, net, x, c, o))
            offset += len(x)
        return np.concatenate(parts)

    unread = _unread_steps(work, xs, outs, target, layers, seed, std) if scored and "cascading" in tests else []
    rows: list[dict[str, Any]] = []
    for m, name in zip(methods, names):
        ref = maps_of(m, work)
        if "repeat" in tests:
            _compare(rows, ref, maps_of(m, work), test="repeat", method=name, step=0, layer="repeat")
        if "random_logit" in tests:
            if _class_specific(m) and not scored:
                drawn = _other_classes(torch.cat([c.cpu() for c in classes]), num_classes, seed)
                others = [d.to(c.device) for d, c in zip(drawn.split([len(c) for c in classes]), classes)]
                _compare(rows, ref, maps_of(m, work, others), test="random_logit", method=name, step=0,
                         layer="random class")
            else:
                for i in range(len(ref)):
                    for metric in METRICS:
                        rows.append({"test": "random_logit", "method": name, "step": 0, "layer": "random class",
                                     "image": i, "metric": metric, "value": float("nan")})
        if "independent" in tests:
            for step, (layer, names) in enumerate(layers):
                saved = {n: p.detach().clone() for n, p in work.named_parameters() if n in set(names)}
                randomise_(work, names, seed=seed, layer=layer, std=std)
                try:
                    _compare(rows, ref, maps_of(m, work), test="independent", method=name, step=step, layer=layer)
                finally:
                    with torch.no_grad():
                        for n, p in work.named_parameters():
                            if n in saved:
                                p.copy_(saved[n])
        if "cascading" in tests:
            net = model_copy(work)
            for step, (layer, names) in enumerate(layers):
                randomise_(net, names, seed=seed, layer=layer, std=std)
                _compare(rows, ref, maps_of(m, net), test="cascading", method=name, step=step, layer=layer)
            del net
    df = pd.DataFrame.from_records(rows, columns=["test", "method", "step", "layer", "image", "metric", "value"])
    df.attrs["seed"] = int(seed)
    df.attrs["std"] = float(std)
    # strings, as every attr (a tidy table hides no table in its attrs)
    df.attrs["not_defined"] = "; ".join(f"{t}: {why}" for t, why in not_defined.items() if t in tests)
    df.attrs["score_unchanged"] = ", ".join(unread)
    return df


def _unread_steps(work: nn.Module, xs: Sequence[torch.Tensor], outs: Sequence[Any], score: Callable[[Any], Any],
                  layers: Sequence[tuple[str, list[str]]], seed: int, std: float) -> list[str]:
    """The cascading steps after which a score function gives every image the value it gives on the trained model:
    the score does not read the layers randomised so far (a Hugging Face ``ViTModel``'s pooler, for a score of
    ``last_hidden_state``), so every map is unchanged there whatever the method, and the step cannot fail one."""
    net = model_copy(work)
    unread = []
    with torch.no_grad():
        base = [score(o).detach() for o in outs]
        for layer, names in layers:
            randomise_(net, names, seed=seed, layer=layer, std=std)
            if all(torch.equal(score(net(x)).detach(), b) for x, b in zip(xs, base)):
                unread.append(layer)
            else:
                break  # cumulative: once the score has changed, a later step cannot restore it
    return unread


def _need_classes(output: Any, model: nn.Module, target: Target, class_methods: Sequence[str]) -> None:
    """Refuse a class target (``None``: the prediction; an int; one per image) on a model without a classifier
    head, naming what runs instead: a score function as ``target``, or the methods that explain no class."""
    try:
        logits_of(output, model)
    except InputError:
        uses = (f"methods {list(class_methods)} explain a class" if class_methods else
                f"target={target!r} names a class")
        raise InputError(
            f"sanity_checks: {uses}, but {type(model).__name__} has no classifier head (num_classes=0, an open_clip "
            "image tower, a torchvision ViT whose heads hold no Linear layer, or an output without (B, classes) "
            "logits). Pass "
            "target=lambda out: ... returning one score per image from the model's raw output (e.g. the cosine "
            "similarity of the embedding to a given embedding): the cascading, independent and repeat tests then "
            "run on the maps of that score, and the random-logit test, which needs classes, is reported as not "
            "defined (df.attrs['not_defined']); or keep target=None and pass methods that explain no class (e.g. "
            "methods=['rollout', 'attention'])") from None


def check_sanity_table(df: Any, what: str) -> None:
    """Refuse anything but a DataFrame with the columns of ``sanity_checks``; ``what`` names the caller."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame) or not {"test", "method", "layer", "step", "metric", "value"} <= set(
            df.columns):
        raise InputError(f"{what} needs the table of vitviz.sanity_checks (columns test, method, step, layer, image, "
                         f"metric, value), got {type(df).__name__}")


def sanity_summary(df: Any, *, threshold: float = 0.5, decision_step: str | None = None) -> Any:
    """Per method: the verdict of the parameter and random-logit tests (module docstring), with the numbers.

    Args:
        df: the table of ``sanity_checks``.
        threshold: a method fails a test when the mean ``spearman_abs`` over images is at least this.
        decision_step: the last cascading layer the parameter test looks at (default: the first block step, so
            the steps head, norm and the last block; the last step when there is no block).

    Returns:
        DataFrame indexed by method with ``cascading_rho`` (the largest mean ``spearman_abs`` over the steps up to
        ``decision_step``, leaving out the steps ``df.attrs["score_unchanged"]`` names: those after which a score
        function as target gave every image its trained value), ``parameter_test``, ``random_logit_rho``,
        ``random_logit_test`` (``"n/a"`` for non-class-specific methods, and for every method where
        ``df.attrs["not_defined"]`` names the test: a score function as target; the summary's
        ``attrs["not_defined"]`` keeps it), ``repeat_rho`` and ``verdict``: ``UNSTABLE`` when the repeat test says
        so, else ``FAIL`` when either test fails, ``PASS`` when at least one passes and none fails, and ``UNTESTED``
        when neither decides (``df`` has no cascading step up to ``decision_step``, or only ``nan`` values there
        (constant maps), and no random-logit test of a class-specific method, e.g. ``tests=("independent",
        "repeat")``, or the random-logit test alone on a method that is not class-specific): a method nothing tested
        never reads as a pass.
    """
    import pandas as pd

    if not is_number(threshold) or not 0 <= threshold <= 1:
        raise InputError(f"threshold={threshold!r} must lie in [0, 1], a mean |Spearman| correlation (e.g. 0.5)")
    check_sanity_table(df, "sanity_summary")
    if df.empty:
        raise InputError("df holds no rows; run vitviz.sanity_checks(model, images) first and pass its result")
    sub = df[df["metric"] == "spearman_abs"]
    casc = sub[sub["test"] == "cascading"]
    layers = list(dict.fromkeys(casc.sort_values("step")["layer"]))
    if decision_step is not None and layers and decision_step not in layers:
        raise InputError(f"decision_step={decision_step!r} is not a cascading step of df; pass one of {layers}, or "
                         "None for the first block step")
    if decision_step is None and layers:
        blocks = [n for n in layers if n.startswith("block ")]
        decision_step = blocks[0] if blocks else layers[-1]
    unread = set(filter(None, str(df.attrs.get("score_unchanged", "")).split(", ")))  # not read by the score
    top = [n for n in (layers[:layers.index(decision_step) + 1] if decision_step in layers else []) if n not in unread]
    out = []
    for method in dict.fromkeys(df["method"]):
        rec: dict[str, Any] = {"method": method}
        c = casc[(casc["method"] == method) & casc["layer"].isin(top)].groupby("layer")["value"].mean()
        rec["cascading_rho"] = float(c.max()) if c.notna().any() else float("nan")
        # all nan (constant maps: no rank correlation): nothing decided, as for the random-logit test
        rec["parameter_test"] = ("n/a" if not c.notna().any() else
                                 "FAIL" if rec["cascading_rho"] >= threshold else "PASS")
        r = sub[(sub["test"] == "random_logit") & (sub["method"] == method)]["value"]
        rec["random_logit_rho"] = float(r.mean()) if r.notna().any() else float("nan")
        rec["random_logit_test"] = ("n/a" if not r.notna().any() else
                                    "FAIL" if rec["random_logit_rho"] >= threshold else "PASS")
        rep = sub[(sub["test"] == "repeat") & (sub["method"] == method)]["value"]
        rec["repeat_rho"] = float(rep.mean()) if len(rep) else float("nan")
        unstable = bool(len(rep)) and rec["repeat_rho"] < 0.99
        tests = [rec["parameter_test"], rec["random_logit_test"]]
        rec["verdict"] = ("UNSTABLE" if unstable else "FAIL" if "FAIL" in tests else
                          "PASS" if "PASS" in tests else "UNTESTED")
        out.append(rec)
    summary = pd.DataFrame(out).set_index("method")
    summary.attrs["threshold"] = float(threshold)
    summary.attrs["decision_step"] = str(decision_step)
    summary.attrs["not_defined"] = str(df.attrs.get("not_defined", ""))
    return summary
