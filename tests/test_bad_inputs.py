"""Every public entry refuses bad input with an error naming the argument, the value and the fix.

One row per bad input: (id, call, error class, message fragment). Each call goes through a public vitviz function
on a tiny random-weight timm ViT (32x48 input, 8 px patches, 2 layers, 5 classes): pixels, dtypes, shapes,
sources, batch sizes, devices, layer selectors and ``target=``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_study_runs, tiny_timm_vit

import vitviz
from vitviz.analysis.attnlrp import attnlrp_tokens
from vitviz.core.families import CustomFamily
from vitviz.errors import ImageInputError, InputError, InputTypeError, LayerSelectError, OutOfRangeError

M = tiny_timm_vit()  # eval mode; built once: no row changes it (test_model_is_untouched checks)
GOOD = torch.randn(2, 3, 32, 48)


def with_value(value: float) -> torch.Tensor:
    x = GOOD.clone()
    x[1, 2, 5, 7] = value
    return x


def array(dtype, low, high, shape=(32, 48, 3)) -> np.ndarray:
    return np.linspace(low, high, int(np.prod(shape))).reshape(shape).astype(dtype)


def nan_array() -> np.ndarray:
    a = np.full((32, 48, 3), 0.5, np.float32)
    a[3, 4, 1] = np.nan
    return a


def capture(layers=None, **kw) -> None:
    with torch.no_grad(), vitviz.capture_attention(M, layers, **kw):
        M(GOOD)


def rollout(images=GOOD, **kw) -> object:
    return vitviz.attention_rollout(M, images, **kw)


AVG = tiny_timm_vit(global_pool="avg")  # a class token, but the readout averages the patch tokens


def faith(methods=("random",), model=M, **kw) -> object:
    return vitviz.faithfulness(model, GOOD, methods, modes=["deletion"], steps=0.5, progress=False, **kw)


RUN = faith({"random": "random", "mine": torch.rand(2, 4, 6)})
MAPS = [torch.softmax(torch.randn(2, 2, 25, 25), -1) for _ in range(2)]
NAN_MAP = MAPS[1].clone()
NAN_MAP[0, 1, 3, 4] = float("nan")
TRAIN = torch.utils.data.TensorDataset(torch.randn(6, 3, 32, 48), torch.arange(6) % 2)
TEST = torch.utils.data.TensorDataset(torch.randn(4, 3, 32, 48), torch.arange(4) % 2)
PROBES = pd.DataFrame({"model": "m", "layer": "0", "depth": 1, "probe": "linear", "shots": 2, "seed": [0, 1],
                       "accuracy": [50.0, 60.0]})


def sanity(**kw) -> object:
    return vitviz.sanity_checks(M, GOOD, methods=["random"], **{"tests": ["cascading"], **kw})


SANITY = sanity()


def explore(name: str, **kw) -> object:
    pytest.importorskip("ipywidgets")
    args = (M, GOOD[:1]) if name == "explore_attention" else (M,)
    return getattr(vitviz, name)(*args, **kw)


def save(**kw) -> object:
    import matplotlib.pyplot as plt

    fig = plt.figure()
    try:
        return vitviz.save_figure(fig, Path(tempfile.mkdtemp()) / "fig", **kw)
    finally:
        plt.close(fig)

Row = tuple[str, Callable[[], object], type[Exception], str]

ROWS: list[Row] = [
    # pixels: non-finite values, in tensors and float arrays
    ("tensor-nan", lambda: vitviz.load_images(M, with_value(float("nan"))), ImageInputError, "1 NaN and 0 infinite"),
    ("tensor-inf", lambda: vitviz.load_images(M, with_value(float("inf"))), ImageInputError, "0 NaN and 1 infinite"),
    ("tensor-neg-inf", lambda: rollout(with_value(float("-inf"))), ImageInputError, "torch.nan_to_num"),
    ("tensor-nan-batched", lambda: rollout(with_value(float("nan")), batch_size=1), ImageInputError, "NaN"),
    ("array-nan", lambda: vitviz.load_images(M, nan_array()), ImageInputError, "np.nan_to_num"),
    ("array-inf", lambda: vitviz.load_images(M, np.full((32, 48, 3), np.inf)), ImageInputError, "infinite values"),
    ("array-nan-in-list", lambda: vitviz.mean_attention_distance(M, [nan_array()]), ImageInputError,
     "rather than draw NaN maps or a black image"),
    # pixels: dtypes and value ranges
    ("tensor-uint8", lambda: vitviz.load_images(M, (GOOD * 50).clamp(0, 255).to(torch.uint8)), ImageInputError,
     "uint8 tensor"),
    ("tensor-int64", lambda: vitviz.load_images(M, GOOD.long()), ImageInputError, "torch.int64 tensor"),
    ("tensor-bool", lambda: vitviz.load_images(M, GOOD > 0), ImageInputError, "torch.bool tensor"),
    ("array-bool", lambda: vitviz.load_images(M, np.zeros((32, 48, 3), bool)), ImageInputError, "dtype bool"),
    ("array-float-negative", lambda: vitviz.load_images(M, array(np.float32, -1, 1)), ImageInputError,
     "values from -1 to 1, outside 0..255"),
    ("array-uint16", lambda: vitviz.load_images(M, array(np.uint16, 0, 65535)), ImageInputError, "arr / 257"),
    # pixels: channels and shapes
    ("tensor-grayscale", lambda: vitviz.load_images(M, GOOD[:, :1]), ImageInputError, "grayscale tensor"),
    ("tensor-rgba", lambda: vitviz.load_images(M, torch.randn(2, 4, 32, 48)), ImageInputError, "RGBA: x[:, :3]"),
    ("tensor-2-channel", lambda: vitviz.load_images(M, torch.randn(1, 2, 32, 48)), ImageInputError,
     "2-channel tensor"),
    ("tensor-5d", lambda: vitviz.load_images(M, GOOD[None]), ImageInputError, "got shape (1, 2, 3, 32, 48)"),
    ("tensor-wrong-size", lambda: vitviz.load_images(M, torch.randn(1, 3, 32, 32)), ImageInputError,
     "takes 32x48 images, got 32x32"),
    ("array-channel-first", lambda: vitviz.load_images(M, np.zeros((3, 32, 48), np.uint8)), ImageInputError,
     "arr.transpose(1, 2, 0)"),
    ("array-batch-channel-first", lambda: vitviz.load_images(M, np.zeros((2, 3, 32, 48), np.uint8)), ImageInputError,
     "arr.transpose(0, 2, 3, 1)"),
    ("array-batch-no-channels", lambda: vitviz.load_images(M, np.zeros((2, 32, 48, 5), np.uint8)), ImageInputError,
     "last axis must be the colour channels"),
    ("array-5d", lambda: vitviz.load_images(M, np.zeros((1, 2, 32, 48, 3), np.uint8)), ImageInputError,
     "a (B, H, W, 3) array or a list of arrays"),
    ("array-batch-empty", lambda: vitviz.load_images(M, np.zeros((0, 32, 48, 3), np.uint8)), ImageInputError,
     "an empty array holds 0 images"),
    ("list-of-tensors", lambda: vitviz.load_images(M, [GOOD[0], GOOD[1]]), ImageInputError, "torch.stack(images)"),
    ("none", lambda: vitviz.load_images(M, None), ImageInputError, "cannot use NoneType as an image"),
    ("dict", lambda: vitviz.load_images(M, {"a": 1}), ImageInputError, "cannot use dict as an image"),
    ("missing-file", lambda: vitviz.load_images(M, "/nonexistent/cat.jpg"), ImageInputError,
     "'/nonexistent/cat.jpg' not found"),
    ("folder-path", lambda: vitviz.load_images(M, "/"), ImageInputError, "is a folder, not an image file"),
    # batch sizes: no images, bad batch_size
    ("zero-images-tensor", lambda: vitviz.load_images(M, GOOD[:0]), ImageInputError, "holds 0 images"),
    ("zero-images-list", lambda: rollout([]), ImageInputError, "0 images"),
    ("dataset-to-a-batch-analysis", lambda: rollout(torch.utils.data.TensorDataset(GOOD)), ImageInputError,
     "a TensorDataset is a dataset; this analysis takes a batch"),
    ("loader-to-a-batch-analysis", lambda: rollout(torch.utils.data.DataLoader(GOOD)), ImageInputError,
     "a DataLoader is a dataset; this analysis takes a batch"),
    ("batch-size-0", lambda: rollout(batch_size=0), InputError, "batch_size=0 is not a positive number"),
    ("batch-size-negative", lambda: vitviz.mean_attention_distance(M, GOOD, batch_size=-4), InputError,
     "batch_size=-4"),
    ("batch-size-float", lambda: rollout(batch_size=2.5), InputError, "batch_size=2.5"),
    ("batch-size-bool", lambda: rollout(batch_size=True), InputError, "batch_size=True"),
    # devices and dtypes
    ("device-unknown", lambda: vitviz.load_images(M, GOOD, device="gpu"), ImageInputError,
     "device='gpu' is not a torch device"),
    ("capture-dtype-int", lambda: capture(dtype=torch.int64), InputError, "dtype=torch.int64 is not a floating"),
    ("capture-dtype-string", lambda: capture(dtype="float32"), InputError, "dtype='float32'"),
    # layer selectors
    ("layers-true", lambda: capture(True), LayerSelectError, "layers=True is a bool, not a layer index"),
    ("layers-false", lambda: capture(False), LayerSelectError, "layers=False is a bool"),
    ("layers-float", lambda: capture(1.0), LayerSelectError, "layers=1.0 is a float, not a layer index; pass an integer such as 1"),
    ("layers-float-fraction", lambda: capture(0.5), LayerSelectError, "layers=0.5 is a float"),
    ("layers-empty-list", lambda: capture([]), LayerSelectError, "layers=[] selects no layer"),
    ("layers-empty-tuple", lambda: capture(()), LayerSelectError, "selects no layer"),
    ("layers-out-of-range", lambda: capture(7), LayerSelectError, "layers=7 is out of range: VisionTransformer has 2"),
    ("layers-negative-out-of-range", lambda: capture(-3), LayerSelectError, "pass an index from -2 to 1"),
    ("layers-unknown-pattern", lambda: capture("encoder.*"), LayerSelectError,
     "layers='encoder.*' matches no attention module"),
    ("layers-mixed-bad-item", lambda: capture([0, 1.5]), LayerSelectError, "layers=1.5 is a float"),
    ("layers-bool-in-list", lambda: capture([True]), LayerSelectError, "layers=True is a bool"),
    ("layers-object", lambda: capture({"blocks": 1}), LayerSelectError, "is not a layer selector"),
    ("start-layer-bool", lambda: rollout(start_layer=True), LayerSelectError, "start_layer=True is a bool"),
    ("start-layer-out-of-range", lambda: rollout(start_layer=5), LayerSelectError, "start_layer=5 is out of range"),
    ("discard-ratio-string", lambda: rollout(discard_ratio="0.5"), InputError,
     "discard_ratio='0.5' is not a fraction in [0, 1]"),
    ("discard-ratio-bool", lambda: rollout(discard_ratio=True), InputError, "discard_ratio=True is not a fraction"),
    ("discard-ratio-above-1", lambda: rollout(discard_ratio=1.5), InputError, "discard_ratio=1.5 is not a fraction"),
    ("residual-string", lambda: rollout(residual="no"), InputTypeError, "residual='no' is not True or False"),
    ("heads-layer-float", lambda: vitviz.plot_attention_heads_grid(M, GOOD[:1], 1.0), LayerSelectError,
     "layer=1.0 is a float"),
    # targets (grad_rollout / explain target=...): count equals the batch, integers in range only, callables
    ("target-too-many", lambda: vitviz.grad_rollout(M, GOOD, target=[0, 1, 2]), InputError,
     "target holds 3 class indices but there are 2 images"),
    ("target-too-few", lambda: vitviz.grad_rollout(M, GOOD, target=[0]), InputError,
     "target holds 1 class indices but there are 2 images"),
    ("target-float", lambda: vitviz.grad_rollout(M, GOOD, target=1.7), InputError,
     "target=1.7 is not an integer class index"),
    ("target-bool", lambda: vitviz.grad_rollout(M, GOOD, target=True), InputError,
     "target=True is a bool, not a class index"),
    ("target-out-of-range", lambda: vitviz.grad_rollout(M, GOOD, target=7), InputError,
     "target=7 is out of range: VisionTransformer has 5 classes"),
    ("target-float-in-list", lambda: vitviz.grad_rollout(M, GOOD, target=[0, 2.5]), InputError,
     "in target=[0, 2.5] is"),
    ("target-float-tensor", lambda: vitviz.explain(M, GOOD, method="chefer", target=torch.tensor([0.0, 1.0])),
     InputError, "target must hold integer class indices, got a torch.float32 tensor"),
    ("target-2d", lambda: vitviz.explain(M, GOOD, method="chefer", target=torch.zeros(2, 1, dtype=torch.long)),
     InputError, "target must be 1-D (one class index per image)"),
    ("target-string", lambda: vitviz.grad_rollout(M, GOOD, target="cat"), InputError,
     "target='cat' (str) is not understood"),
    ("target-callable-bad-shape", lambda: vitviz.grad_rollout(M, GOOD, target=lambda out: out), InputError,
     "a callable target must return"),
    ("target-class-on-headless", lambda: vitviz.grad_rollout(tiny_timm_vit(num_classes=0), GOOD, target=1),
     InputError, "has no classifier head (num_classes=0); pass a callable"),
    # faithfulness: methods, ids, labels, removal; its tables
    ("faith-method-unknown", lambda: faith(["lime"]), InputError, "or pass a callable (model, images, target)"),
    ("faith-methods-empty", lambda: faith([]), InputError, "methods is empty"),
    ("faith-maps-wrong-count", lambda: faith({"mine": torch.ones(3, 4, 6)}), InputError,
     "precomputed maps must be (2, gh, gw)"),
    ("faith-maps-not-a-map", lambda: faith({"mine": 0.5}), InputError, "methods['mine'] is a float"),
    ("faith-callable-bad-shape", lambda: faith([lambda m, x, t: torch.ones(len(x), 24)]), InputError,
     "must return (2, 4, 6), one (gh, gw) map per image"),
    ("faith-map-nan", lambda: faith({"nan": torch.full((2, 4, 6), float("nan"))}), InputError,
     "hold NaN or infinite values"),
    ("faith-image-ids-repeat", lambda: faith(image_ids=[3, 3]), InputError, "image_ids repeats 3"),
    ("faith-image-ids-count", lambda: faith(image_ids=[1, 2, 3]), InputError, "image_ids holds 3 ids but there are 2"),
    ("faith-image-offset-negative", lambda: faith(image_offset=-2), InputError, "image_offset=-2 must be"),
    ("faith-labels-dataset-on-batch", lambda: faith(labels="dataset"), InputError, "labels='dataset' with a Dataset"),
    ("faith-removal-unknown", lambda: faith(removal="blur"), InputError, "removal='blur' must be"),
    ("faith-removal-drop-avg-pool", lambda: faith(model=AVG, removal="drop"), InputError,
     "mean over patch tokens, so vitviz cannot drop its patch tokens; use removal='mean'"),
    ("auc-duplicated-runs", lambda: vitviz.faithfulness_auc(pd.concat([RUN, RUN])), InputError,
     "image_offset=<images in the earlier runs>"),
    ("auc-not-a-curve-table", lambda: vitviz.faithfulness_auc(RUN.drop(columns="score")), InputError,
     "lacks the columns ['score']"),
    ("compare-baseline-unknown", lambda: vitviz.compare_methods(RUN, baseline="chefer"), InputError,
     "baseline='chefer' is not among the methods of df (['random', 'mine'])"),
    ("explain-rollout-token-out-of-range", lambda: vitviz.explain(M, GOOD, "rollout", token=999), OutOfRangeError,
     "token=999 is out of range for 25 tokens"),
    ("explain-flow-token-out-of-range", lambda: vitviz.explain(M, GOOD, "flow", token=999), OutOfRangeError,
     "token=999 is out of range for 25 tokens"),
    ("explain-attention-token-out-of-range", lambda: vitviz.explain(M, GOOD, "attention", token=999),
     OutOfRangeError, "token=999 is out of range for 25 tokens"),
    ("posembed-query-outside-grid", lambda: vitviz.plot_pos_embed_similarity(vitviz.pos_embed_similarity(M), (9, 9)),
     OutOfRangeError, "query (9, 9) is outside the 4x6 grid"),
    ("sanity-method-unknown", lambda: vitviz.sanity_checks(M, GOOD, methods=["lime"]), InputError,
     "methods holds 'lime'"),
    ("attnlrp-tokens-training-mode", lambda: attnlrp_tokens(tiny_timm_vit().train(), GOOD, 0), InputError,
     "training mode"),  # the one-batch function; vitviz.attnlrp and explain run the model in eval mode
    ("gradcam-layer-unknown", lambda: vitviz.explain(M, GOOD, "gradcam", layer="nope"), InputError,
     "layer='nope' is not a module"),
    ("load-model-unknown-name", lambda: vitviz.load_model("no_such_vit_xyz"), InputError,
     "'no_such_vit_xyz' is neither a timm model"),
    ("load-model-device-unknown", lambda: vitviz.load_model("cifar10-vit", device="gpu"), InputError,
     "device='gpu' is not a torch device"),
    # figures: formats and dpi are checked before anything is written
    ("save-figure-format-unknown", lambda: save(formats=("png", "bmpx")), InputError,
     "formats=('png', 'bmpx'): ['bmpx'] not supported by matplotlib; pass formats among"),
    ("save-figure-format-string", lambda: save(formats="png"), InputError, "formats='png' is a string"),
    ("save-figure-format-not-str", lambda: save(formats=(3,)), InputError, "[3] not supported"),
    ("save-figure-dpi-negative", lambda: save(formats=("png",), dpi=-5), InputError, "dpi=-5 is not a positive"),
    ("save-figure-not-a-figure", lambda: vitviz.save_figure(None, Path(tempfile.mkdtemp()) / "x"), InputError,
     "fig=None is not a matplotlib Figure or Axes"),
    ("saver-format-unknown", lambda: vitviz.Saver(tempfile.mkdtemp(), formats=("bmpx",)), InputError,
     "formats=('bmpx',): ['bmpx'] not supported"),
    # families and capture
    ("register-family-none", lambda: vitviz.register_family(None), InputTypeError, "family=None is not a Family"),
    ("register-family-class", lambda: vitviz.register_family(CustomFamily), InputTypeError,
     "pass an instance, CustomFamily()"),
    ("capture-on-layer-not-callable", lambda: capture(on_layer=3), InputTypeError, "on_layer=3 is not callable"),
    # token indices: integers only
    ("rollout-token-float", lambda: rollout(token=1.5), InputTypeError, "token=1.5 is a float, not a token index"),
    ("rollout-token-bool", lambda: rollout(token=True), InputTypeError, "token=True is a bool"),
    ("explain-chefer-token-float", lambda: vitviz.explain(M, GOOD, "chefer", token=2.0), InputTypeError,
     "token=2.0 is a float"),
    ("flow-token-float", lambda: vitviz.attention_flow(M, GOOD, token=0.5), InputTypeError, "token=0.5 is a float"),
    # propagation building blocks
    ("fuse-heads-numpy", lambda: vitviz.fuse_heads(np.ones((1, 2, 3, 3))), InputTypeError,
     "expected a (B, H, N, N) torch.Tensor, got ndarray"),
    ("fuse-heads-int-dtype", lambda: vitviz.fuse_heads(torch.rand(1, 2, 3, 3), dtype=torch.int64), InputError,
     "dtype=torch.int64 is not a floating torch dtype"),
    ("layer-rule-prefix-negative", lambda: vitviz.LayerRule(num_prefix_tokens=-1), InputError,
     "num_prefix_tokens=-1 is not a count of tokens"),
    ("rollout-from-attentions-prefix-float", lambda: vitviz.rollout_from_attentions(MAPS, num_prefix_tokens=1.5),
     InputError, "num_prefix_tokens=1.5"),
    ("propagate-rule-string", lambda: vitviz.propagate(MAPS, "rollout"), InputTypeError,
     "rule='rollout' is not a LayerRule"),
    # integrated gradients
    ("ig-n-steps-zero", lambda: vitviz.integrated_gradients(M, GOOD, n_steps=0), InputError,
     "n_steps=0 must be a positive int"),
    ("ig-n-steps-float", lambda: vitviz.integrated_gradients(M, GOOD, n_steps=2.5), InputError, "n_steps=2.5"),
    ("ig-internal-batch-size-zero", lambda: vitviz.integrated_gradients(M, GOOD, internal_batch_size=0), InputError,
     "internal_batch_size=0 must be a positive int"),
    ("ig-baseline-nan", lambda: vitviz.integrated_gradients(M, GOOD, baseline=float("nan")), InputError,
     "baseline=nan must be a finite number"),
    ("ig-baseline-string", lambda: vitviz.explain(M, GOOD, "integrated_gradients", baseline="black"), InputError,
     "baseline='black'"),
    ("explain-ig-return-delta", lambda: vitviz.explain(M, GOOD, "integrated_gradients", return_delta=True),
     InputError, "vitviz.integrated_gradients(model, images, target, return_delta=True)"),
    # attnlrp
    ("attnlrp-plain-string", lambda: vitviz.attnlrp(M, GOOD, plain="head"), InputError,
     "plain='head' is a string"),
    ("attnlrp-plain-no-match", lambda: vitviz.attnlrp(M, GOOD, plain=["blocks.*.mlp.fc9"]), InputError,
     "['blocks.*.mlp.fc9'] match no layer that takes the linear rule in VisionTransformer"),
    # faithfulness: options, batch size, workers, seed
    ("faith-method-options-unknown", lambda: faith(method_options={"rolout": {"head_fusion": "max"}}), InputError,
     "has options for ['rolout'], neither among the methods ['random'] nor a vitviz.explain method"),
    ("faith-batch-size-0", lambda: faith(batch_size=0), InputError, "batch_size=0 is not a positive number"),
    ("faith-num-workers-negative", lambda: faith(num_workers=-1), InputError, "num_workers=-1 is not a number"),
    ("faith-seed-string", lambda: faith(seed="x"), InputError, "seed='x' must be an int"),
    # sanity checks and their summary
    ("sanity-std-negative", lambda: sanity(std=-0.1), InputError, "std=-0.1 must be a positive finite number"),
    ("sanity-std-zero", lambda: sanity(std=0), InputError, "std=0 must be a positive"),
    ("sanity-seed-string", lambda: sanity(seed="x"), InputError, "seed='x' must be an int"),
    ("sanity-methods-empty", lambda: vitviz.sanity_checks(M, GOOD, methods=[]), InputError, "methods is empty"),
    ("sanity-steps-empty", lambda: sanity(steps=[]), InputError, "steps=[] selects no layer"),
    ("sanity-method-options-unknown", lambda: sanity(method_options={"chefr": {"start_layer": 1}}), InputError,
     "has options for ['chefr'], neither among the methods ['random'] nor a vitviz.explain method"),
    ("sanity-summary-threshold", lambda: vitviz.sanity_summary(SANITY, threshold=2), InputError,
     "threshold=2 must lie in [0, 1]"),
    ("sanity-summary-step-unknown", lambda: vitviz.sanity_summary(SANITY, decision_step="block 9"), InputError,
     "decision_step='block 9' is not a cascading step of df; pass one of ['head'"),
    ("sanity-summary-empty", lambda: vitviz.sanity_summary(SANITY.iloc[:0]), InputError, "df holds no rows"),
    ("sanity-summary-not-a-table", lambda: vitviz.sanity_summary([1]), InputError,
     "needs the table of vitviz.sanity_checks"),
    # probes
    ("fewshot-shots-empty", lambda: vitviz.linear_fewshot(M, TRAIN, TEST, shots=()), InputError,
     "shots=() draws nothing"),
    ("fewshot-shots-int", lambda: vitviz.linear_fewshot(M, TRAIN, TEST, shots=2), InputError,
     "shots=2 is one number"),
    ("features-num-workers-negative", lambda: vitviz.extract_features(M, TRAIN, num_workers=-1), InputError,
     "num_workers=-1 is not a number of loader worker processes"),
    ("per-class-subset-zero", lambda: vitviz.per_class_subset(M, TRAIN, 0), InputError,
     "per_class=0 must be a positive int"),
    ("per-class-subset-float", lambda: vitviz.per_class_subset(M, TRAIN, 2.5), InputError, "per_class=2.5"),
    ("summarize-probes-level-percent", lambda: vitviz.summarize_probes(PROBES, level=95), InputError,
     "level=95 must lie in (0, 1)"),
    ("summarize-probes-by-string", lambda: vitviz.summarize_probes(PROBES, by="model"), InputError,
     "by='model' is a string"),
    ("plot-layer-probes-level", lambda: vitviz.plot_layer_probes(PROBES, level=2), InputError,
     "level=2 must lie in (0, 1)"),
    # FLOPs
    ("flops-input-size-two", lambda: vitviz.count_flops(M, (32, 48)), InputError,
     "input_size=(32, 48) is not the (C, H, W) of one image"),
    ("flops-input-size-negative", lambda: vitviz.count_flops(M, (3, -32, 48)), InputError, "input_size=(3, -32, 48)"),
    ("flops-input-size-wrong-for-model", lambda: vitviz.count_flops(M, (3, 32, 32)), InputError,
     "input_size=(3, 32, 32) does not fit the model (VisionTransformer takes 32x48 images"),
    ("flops-model-none", lambda: vitviz.count_flops(None), InputTypeError, "model=None is a NoneType, not a torch"),
    ("flops-input-size-none-not-a-vit", lambda: vitviz.count_flops(torch.nn.Linear(3, 3)), InputError,
     "input_size=None: Linear is not a ViT vitviz reads"),
    # pixels: an array without pixels
    ("array-zero-size", lambda: vitviz.load_images(M, np.zeros((0, 48, 3), np.uint8)), ImageInputError,
     "an image array of shape (0, 48, 3) has no pixels"),
    # embedding filters
    ("filter-pca-n-components-float", lambda: vitviz.filter_pca(torch.randn(8, 3, 4, 4), 2.5), InputError,
     "n_components=2.5 must be a positive int"),
    ("filter-pca-nan", lambda: vitviz.filter_pca(torch.full((8, 3, 4, 4), float("nan"))), InputError,
     "hold 384 NaN and 0 infinite values"),
    ("plot-filter-variance-n-components-0", lambda: vitviz.plot_filter_variance(M, n_components=0), InputError,
     "n_components=0 must be a positive int"),
    ("plot-filter-variance-n-components-negative", lambda: vitviz.plot_filter_variance(M, n_components=-2),
     InputError, "n_components=-2"),
    # tables and trends
    ("distance-table-patch-size-string", lambda: vitviz.distance_table(np.ones((2, 3)), patch_size="8"), InputError,
     "patch_size='8' is neither an int nor an (h, w) pair"),
    ("distance-table-patch-size-zero", lambda: vitviz.distance_table(np.ones((2, 3)), patch_size=(0, 8)), InputError,
     "patch_size=(0, 8) has a side below 1"),
    ("distance-table-patch-size-negative", lambda: vitviz.distance_table(np.ones((2, 3)), patch_size=-8),
     InputError, "patch_size=-8 has a side below 1"),
    ("depth-trend-string", lambda: vitviz.depth_trend("abc"), InputTypeError,
     "depth_trend: values='abc' does not hold numbers only"),
    ("depth-trend-nan", lambda: vitviz.depth_trend(np.full((3, 2), np.nan)), InputError,
     "values holds 6 NaN or infinite values of 6"),
    ("bootstrap-ci-string", lambda: vitviz.bootstrap_ci("abc"), InputTypeError,
     "bootstrap_ci: values='abc' does not hold numbers only"),
    # faithfulness and sanity tables: not a table
    ("auc-not-a-dataframe", lambda: vitviz.faithfulness_auc([1, 2]), InputTypeError,
     "df=[1, 2] is not a DataFrame; pass the DataFrame of vitviz.faithfulness"),
    ("plot-faithfulness-not-a-dataframe", lambda: vitviz.plot_faithfulness([1]), InputTypeError,
     "df=[1] is not a DataFrame"),
    ("plot-sanity-checks-not-a-table", lambda: vitviz.plot_sanity_checks("x"), InputError,
     "plot_sanity_checks needs the table of vitviz.sanity_checks"),
    ("plot-level-not-a-string", lambda: vitviz.plot_level(3), InputTypeError, "name=3 (int) is not a function name"),
    # propagation and rollout of maps in hand
    ("propagate-rows-wrong-shape", lambda: vitviz.propagate(MAPS, vitviz.LayerRule(), rows=torch.ones(3, 3)),
     InputError, "rows of shape (3, 3) do not fit maps of 2 images and 25 tokens"),
    ("rollout-from-attentions-nan", lambda: vitviz.rollout_from_attentions([MAPS[0], NAN_MAP]), InputError,
     "attentions[1] (layer 1, 0-based) holds 1 NaN"),
    ("rollout-from-attentions-prefix-all-tokens", lambda: vitviz.rollout_from_attentions(MAPS, num_prefix_tokens=25),
     InputError, "num_prefix_tokens=25 leaves no patch token of the 25 tokens"),
    # position embeddings
    ("posembed-tensor-grid-too-small", lambda: vitviz.pos_embed_similarity(torch.randn(25, 8), grid_size=(3, 3)),
     InputError, "grid_size=(3, 3) does not fit the embedding's 25 rows"),
    ("plot-pos-embed-max-tiles-0", lambda: vitviz.plot_pos_embed(M, max_tiles=0), InputError,
     "max_tiles=0 must be a positive int"),
    ("plot-pos-embed-max-tiles-negative", lambda: vitviz.plot_pos_embed(M, max_tiles=-1), InputError,
     "max_tiles=-1"),
    ("posembed-query-float", lambda: vitviz.plot_pos_embed_similarity(vitviz.pos_embed_similarity(M), 1.5),
     InputTypeError, "query=1.5 is not a (row, column) patch"),
    # attention figures
    ("plot-rollout-maps-other-grid", lambda: vitviz.plot_rollout(M, GOOD, maps=torch.rand(2, 3, 3)), InputError,
     "maps of 3x3 do not fit these images, whose token grid is 4x6"),
    ("plot-rollout-ncols-0", lambda: vitviz.plot_rollout(M, GOOD, maps=torch.rand(2, 4, 6), ncols=0), InputError,
     "ncols=0 must be a positive int"),
    ("plot-rollout-ncols-negative", lambda: vitviz.plot_rollout(M, GOOD, maps=torch.rand(2, 4, 6), ncols=-2),
     InputError, "ncols=-2"),
    ("heads-grid-ncols-0", lambda: vitviz.plot_attention_heads_grid(M, GOOD[:1], ncols=0), InputError,
     "ncols=0 must be a positive int"),
    ("heads-grid-ncols-negative", lambda: vitviz.plot_attention_heads_grid(M, GOOD[:1], ncols=-1), InputError,
     "ncols=-1"),
    ("heads-grid-query-float", lambda: vitviz.plot_attention_heads_grid(M, GOOD[:1], query=1.5), InputTypeError,
     "query=1.5 is a float, not a token index"),
    ("explanations-grid-maps-other-grid", lambda: vitviz.plot_explanations_grid(M, GOOD, {"a": torch.rand(2, 3, 3)}),
     InputError, "maps['a']: maps of 3x3 do not fit these images"),
    ("explanations-grid-labels-count", lambda: vitviz.plot_explanations_grid(M, GOOD, {"a": torch.rand(2, 4, 6)},
                                                                            labels=["x"]),
     InputError, "labels holds 1 captions for 2 images"),
    # compute figures
    ("matched-gap-n-0", lambda: vitviz.plot_matched_gap(tiny_study_runs(), n=0), InputError,
     "n=0 must be a positive int"),
    ("matched-gap-n-negative", lambda: vitviz.plot_matched_gap(tiny_study_runs(), n=-3), InputError, "n=-3"),
    ("compute-curves-metrics-empty", lambda: vitviz.plot_compute_curves(metrics=()), InputError,
     "metrics=() selects no column to plot"),
    # explorers (no front-end needed: refused before any widget is built)
    ("explore-attention-size-0", lambda: explore("explore_attention", size=0), InputError,
     "size=0 must be a positive int"),
    ("explore-attention-alpha", lambda: explore("explore_attention", alpha=1.5), InputError,
     "alpha=1.5 must lie in [0, 1]"),
    ("explore-attention-alpha-negative", lambda: explore("explore_attention", alpha=-0.1), InputError,
     "alpha=-0.1"),
    ("explore-pos-embed-size-negative", lambda: explore("explore_pos_embed", size=-5), InputError,
     "size=-5 must be a positive int"),
]


def test_the_table_has_at_least_30_rows_with_distinct_ids():
    ids = [r[0] for r in ROWS]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


@pytest.mark.parametrize(("call", "error", "fragment"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_refused_with_a_clear_message(call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value), f"message {str(info.value)!r} lacks {fragment!r}"
    assert isinstance(info.value, vitviz.VitvizError)


def test_the_model_is_untouched_and_good_input_still_works():
    from vitviz.core.capture import open_probes

    assert open_probes(M) == 0 and all(b.attn.fused_attn for b in M.blocks)
    assert not M.training
    maps = rollout()
    assert maps.shape == (2, 4, 6) and torch.isfinite(maps).all()


def test_a_tensor_on_another_device_is_moved_to_the_models():
    x = vitviz.load_images(M, GOOD.to(torch.float64), device="meta")
    assert x.device.type == "meta" and x.dtype == torch.float32


def test_save_figure_writes_nothing_when_a_format_is_unsupported(tmp_path):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    with pytest.raises(InputError, match="bmpx"):
        vitviz.save_figure(fig, tmp_path / "fig", formats=("png", "pdf", "bmpx"))
    plt.close(fig)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_family_leaves_the_lookup_working():
    with pytest.raises(InputTypeError):
        vitviz.register_family(None)
    assert vitviz.inspect(M).depth == 2


def test_good_sizes_and_maps_are_still_taken():
    a = vitviz.distance_table(np.ones((2, 3)), patch_size=8)
    b = vitviz.distance_table(np.ones((2, 3)), patch_size=(8, 8))
    pd.testing.assert_frame_equal(a, b)
    # a non-square stride: the unit is the geometric mean sqrt(sh * sw), the side of a square patch of its area
    c = vitviz.distance_table(np.arange(6.0).reshape(2, 3), patch_size=(8, 32))
    np.testing.assert_allclose(c["distance_patches"], np.arange(6.0) / 16)
    fig = vitviz.plot_rollout(M, GOOD, maps=torch.rand(2, 32, 48))  # one value per pixel still draws
    assert len(fig.axes) >= 4
    sim = vitviz.pos_embed_similarity(torch.randn(1, 25, 8), grid_size=5)  # a table without prefix rows
    assert sim.shape == (5, 5, 5, 5)
