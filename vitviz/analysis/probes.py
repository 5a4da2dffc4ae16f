"""How good is a frozen representation: the ViT paper's few-shot linear probe and DINO's weighted k-NN probe.

Pure numpy on feature matrices (``X`` ``(M, D)``, integer labels ``(M,)``); ``vitviz.analysis.representations``
extracts the features from a model and a dataset and calls these.

**Few-shot linear** (Dosovitskiy et al., ICLR 2021, Sec. 4.1 "Metrics"): "a regularized least-squares regression
problem that maps the (frozen) representation of a subset of training images to ``{-1, 1}^K`` target vectors",
solved in closed form. Here, for ``n = K x shots`` examples:

1. the features are standardised with the few-shot examples' own per-dimension mean and standard deviation
   (+1e-5), as the authors' evaluator whitens them;
2. targets ``Y = 2 * onehot(y) - 1`` ``(n, K)``;
3. ``W = (Xc^T Xc + l2 I)^{-1} Xc^T Yc`` with ``Xc``, ``Yc`` centred on the examples' means, and an unpenalised
   intercept ``b = mean(Y) - mean(X) W``;
4. the prediction is ``argmax(X_test W + b)``.

The authors' evaluator is big_vision's ``big_vision/evaluators/fewshot_lsr.py``, configured by
``big_vision/configs/common_fewshot.py`` (``shots=[1, 5, 10, 25]``, ``num_seeds=3``, ``l2_reg=2.0 ** 10``). It
uses that ONE fixed ``l2_reg``, with no selection (its code notes it "currently used the fixed l2_reg constant"),
and instead of an intercept appends a constant feature ``100`` to the whitened features, penalised like the rest.
The whitened features have mean 0 over the examples, so that feature is orthogonal to them: ``W`` is the same as
ours and their intercept is ours times ``n / (n + l2 / 100^2)``. For class-balanced examples (every draw of
``fewshot_draws``) ``mean(Y) = 2 / K - 1`` for every class, so the two scores differ by one constant per image and
the predictions are the same: ``l2_reg=BIG_VISION_L2`` reproduces the evaluator's setting and accuracy
(``tests/test_probes.py`` checks this against a numpy re-write of ``fewshot_lsr``). ``fewshot_draws`` draws as it
does (per seed, one permutation of each class's indices, classes in order, the first ``shots``). ``K`` is
``max(label) + 1`` where the evaluator takes the dataset's class count; a class without training images gets a
constant score in both (never the prediction unless every trained class scores below it), and test images of such
a class are refused here (``_check_test_classes``).

vitviz's default differs: ``l2_reg=None`` chooses ``l2`` among ``2^-10 .. 2^10`` (21 values) as the one with the
smallest leave-one-out squared error of the ridge fit on the few-shot examples themselves (the PRESS statistic,
exact in closed form from the hat matrix: ``r_i / (1 - H_ii)``; the standardisation uses all ``n`` examples); ties
go to the larger ``l2``. No test image is looked at (``tests/test_probes.py`` checks that the choice is the same
whatever the test images, and not the best on them).

**Weighted k-NN** (Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021, Sec. 4.1
and their ``eval_knn.py``): L2-normalised features, cosine similarity to every training image, the ``k = 20``
most similar vote for their class with weight ``exp(sim / T)``, ``T = 0.07``; the class with the largest summed
weight wins (ties: the lowest class index). The weights are computed as ``exp((sim - sim_max) / T)``, ``sim_max``
the query's most similar neighbour's: the same vote (one factor per query), without the overflow of ``exp(sim / T)``
at a small ``T`` (``1 / T`` past ~700), where every weight became inf and the lowest class index won.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vitviz.core.util import class_indices, is_int, is_number
from vitviz.errors import InputError

L2_GRID = tuple(2.0 ** e for e in range(-10, 11))
BIG_VISION_L2 = 2.0 ** 10  # big_vision configs/common_fewshot.py: config.l2_reg, the fixed few-shot ridge penalty


def _check_xy(x: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise InputError(f"{what}: features must be (M, D) and labels (M,), got {x.shape} and {y.shape}")
    if len(x) == 0:
        raise InputError(f"{what}: no examples")
    if not np.isfinite(x).all():
        raise InputError(f"{what}: features hold NaN or inf; check the model's output (dtype, autocast)")
    return x, class_indices(y, what)


def _check_test_classes(y_train: np.ndarray, y_test: np.ndarray) -> None:
    """Refuses test labels that no training example has: the probe can never predict such a class (its target
    column is -1 for every example; no reference votes for it), so each of its images would count as an error."""
    unseen, counts = np.unique(y_test[~np.isin(y_test, y_train)], return_counts=True)
    if len(unseen):
        raise InputError(f"test: label(s) {unseen.tolist()} ({int(counts.sum())} images) have no training example, "
                         "so the probe can never predict them and every such image would count as an error; score "
                         "the test images of the training classes only, or add training images of those classes")


def _num_classes(num_classes: int | None, *labels: np.ndarray) -> int:
    """``num_classes``, or ``max(label) + 1`` over ``labels`` when None; refused below that (a label without a
    class) or when not a positive int."""
    need = int(max(y.max() for y in labels)) + 1
    if num_classes is None:
        return need
    if not is_int(num_classes) or num_classes < need:
        raise InputError(f"num_classes={num_classes!r} must be an int of at least {need}, one class per label "
                         f"(the labels reach {need - 1}); pass num_classes={need} or more, or None to count them")
    return int(num_classes)


def standardize(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Standardise every array with ``train``'s per-dimension mean and standard deviation (+1e-5)."""
    mean = train.mean(axis=0, keepdims=True)
    std = train.std(axis=0, keepdims=True) + 1e-5
    return [(a - mean) / std for a in (train, *others)]


def pm1_targets(y: np.ndarray, num_classes: int) -> np.ndarray:
    """``{-1, 1}^K`` target vectors ``(n, K)``: +1 at the class, -1 elsewhere."""
    t = -np.ones((len(y), num_classes))
    t[np.arange(len(y)), y] = 1.0
    return t


class RidgeFit:
    """Closed-form ridge regression with an unpenalised intercept, for every ``l2`` at the cost of one eigh.

    Args:
        x: standardised features ``(n, D)``.
        t: targets ``(n, K)``.
    """

    def __init__(self, x: np.ndarray, t: np.ndarray) -> None:
        self.x_mean = x.mean(axis=0, keepdims=True)
        self.t_mean = t.mean(axis=0, keepdims=True)
        xc, self.tc = x - self.x_mean, t - self.t_mean
        n, d = xc.shape
        self.n = n
        if n <= d:  # dual: K = Xc Xc^T = U diag(s) U^T; W = Xc^T U diag(1/(s+l)) U^T Tc
            s, u = np.linalg.eigh(xc @ xc.T)
            self.s, self.left, self.rhs = np.clip(s, 0, None), xc.T @ u, u.T @ self.tc
            self.hat_basis = u * np.sqrt(self.s)[None, :]  # H = sum_j u_j u_j^T s_j / (s_j + l)
        else:  # primal: Xc^T Xc = V diag(s) V^T; W = V diag(1/(s+l)) V^T Xc^T Tc
            s, v = np.linalg.eigh(xc.T @ xc)
            self.s, self.left, self.rhs = np.clip(s, 0, None), v, v.T @ (xc.T @ self.tc)
            self.hat_basis = xc @ v  # H = sum_j (Xc v_j)(Xc v_j)^T / (s_j + l)
        self._xc = xc

    def weights(self, l2: float) -> tuple[np.ndarray, np.ndarray]:
        """``W`` ``(D, K)`` and intercept ``b`` ``(1, K)`` for ``l2``."""
        w = self.left @ (self.rhs / (self.s + l2)[:, None])
        return w, self.t_mean - self.x_mean @ w

    def loo_squared_error(self, l2: float) -> float:
        """Mean leave-one-out squared error over examples and target dimensions (PRESS / (n K))."""
        w, _ = self.weights(l2)
        resid = self.tc - self._xc @ w
        h = (self.hat_basis ** 2 / (self.s + l2)[None, :]).sum(axis=1) + 1.0 / self.n  # + the intercept's 1/n
        loo = resid / np.clip(1.0 - h, 1e-12, None)[:, None]
        return float((loo ** 2).mean())


def _check_l2(l2: object, what: str, fix: str = "") -> None:
    """Refuses a ridge penalty that is not a finite positive number (0: a singular system for fewer examples than
    dimensions); ``what`` names it in the message (``"l2_reg=0"``)."""
    if not (is_number(l2) and 0 < l2 < math.inf):  # type: ignore[operator]
        raise InputError(f"{what} must be a finite positive number, e.g. 2.0 ** 10{fix}")


def select_l2(fit: RidgeFit, grid: Sequence[float] = L2_GRID) -> float:
    """The ``l2`` of ``grid`` with the smallest leave-one-out squared error (ties: the larger ``l2``).

    Raises:
        InputError: ``grid`` empty, or holding a value that is not a finite positive number.
    """
    if not len(grid):
        raise InputError("grid=() holds no l2 to choose from; pass e.g. vitviz.analysis.probes.L2_GRID")
    for l2 in grid:
        _check_l2(l2, f"grid: l2={l2!r}", " (every penalty of the grid)")
    errors = [(round(fit.loo_squared_error(l2), 12), -l2) for l2 in grid]
    return -min(errors)[1]


def _shown(values: Sequence) -> str:
    """A sequence as its argument would read: ``(0, 0)`` for a tuple, a list or a range alike."""
    return repr(tuple(v.item() if isinstance(v, np.generic) else v for v in values))


def fewshot_draws(labels: np.ndarray, shots: Sequence[int], seeds: Sequence[int],
                  classes: Sequence[int] | None = None) -> dict[tuple[int, int], np.ndarray]:
    """Indices of the few-shot examples for every ``(shots, seed)``: ``shots`` per class, drawn without replacement.

    For one seed the draws are nested (each class's images are permuted once and the first ``shots`` taken), so
    the 5-shot examples are among the 10-shot ones.

    Raises:
        InputError: ``shots`` or ``seeds`` empty (or a bare int; ``shots`` a string), a shot count below 1 or
            above the images of some class, a seed that is not a non-negative int, or a seed given twice (its draw
            would count once).
    """
    labels = class_indices(labels, "fewshot_draws")
    classes = sorted(set(labels.tolist())) if classes is None else list(classes)
    if isinstance(shots, (int, np.integer)):
        raise InputError(f"shots={shots!r} is one number, not a sequence of shot counts; pass shots=({shots!r},)")
    if isinstance(shots, (str, bytes)):  # e.g. papermill's `-p shots "[1, 5]"`, a string, read letter by letter
        raise InputError(f"shots={shots!r} is a string, not a sequence of shot counts; pass ints, e.g. "
                         "shots=(1, 5) (with papermill, -y 'shots: [1, 5]' passes a list)")
    if not len(shots):
        raise InputError("shots=() draws nothing; pass e.g. shots=(1, 5, 10, 25)")
    if is_int(seeds):
        raise InputError(f"seeds={seeds!r} is one number, not a sequence of seeds (one draw each); pass "
                         f"seeds=range({seeds!r}) for {seeds!r} draws, or seeds=({seeds!r},) for that one seed")
    if not len(seeds):
        raise InputError("seeds=() draws nothing; pass e.g. seeds=range(10)")
    bad = [s for s in seeds if not is_int(s) or s < 0]
    if bad:
        raise InputError(f"seeds={_shown(seeds)}: {bad[0]!r} is not a non-negative int (numpy's generator seed); "
                         "pass ints, e.g. seeds=range(10)")
    if len(set(int(s) for s in seeds)) < len(seeds):
        raise InputError(f"seeds={_shown(seeds)} repeat a seed, whose draw would count once; pass distinct seeds, e.g. "
                         f"seeds=range({len(seeds)})")
    counts = {c: int((labels == c).sum()) for c in classes}
    for k in shots:
        if not is_int(k) or k < 1:
            raise InputError(f"shots={k!r}: each must be a positive int (images per class)")
        short = {c: n for c, n in counts.items() if n < k}
        if short:
            raise InputError(f"shots={k} exceeds the training images of class(es) {short} (class: images); pass "
                             "fewer shots or more training images")
    out = {}
    for seed in seeds:
        rng = np.random.default_rng(int(seed))
        perms = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
        for k in shots:
            out[(int(k), int(seed))] = np.sort(np.concatenate([perms[c][:k] for c in classes]))
    return out


def linear_fewshot_accuracy(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                            *, l2_reg: float | None = None, num_classes: int | None = None,
                            grid: Sequence[float] = L2_GRID) -> tuple[float, float]:
    """Top-1 accuracy (%) of the closed-form least-squares probe (module docstring), and the ``l2`` used.

    Args:
        x_train, y_train: the few-shot examples' features ``(n, D)`` and labels ``(n,)``.
        x_test, y_test: the evaluation images' features ``(M, D)`` and labels ``(M,)``.
        l2_reg: the ridge penalty; ``None`` chooses it by leave-one-out error on the examples (``select_l2``);
            ``BIG_VISION_L2`` (``2^10``) is the authors' evaluator's fixed setting (module docstring).
        num_classes: ``K`` (default: ``max(label) + 1`` over both sets; fewer is refused).

    Raises:
        InputError: a test label no training example has (the probe could never predict it), among others.
    """
    x_train, y_train = _check_xy(x_train, y_train, "train")
    x_test, y_test = _check_xy(x_test, y_test, "test")
    if x_train.shape[1] != x_test.shape[1]:
        raise InputError(f"train features have {x_train.shape[1]} dimensions, test {x_test.shape[1]}")
    _check_test_classes(y_train, y_test)
    if l2_reg is not None:
        _check_l2(l2_reg, f"l2_reg={l2_reg!r}", " (or None to choose it)")
    k = _num_classes(num_classes, y_train, y_test)
    xs, xt = standardize(x_train, x_test)
    fit = RidgeFit(xs, pm1_targets(y_train, k))
    l2 = select_l2(fit, grid) if l2_reg is None else float(l2_reg)
    w, b = fit.weights(l2)
    pred = (xt @ w + b).argmax(axis=1)
    return 100.0 * float((pred == y_test).mean()), l2


def knn_accuracy(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *,
                 k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
                 chunk: int = 1024) -> float:
    """Top-1 accuracy (%) of DINO's weighted k-NN classifier (module docstring).

    Args:
        x_train, y_train: reference features ``(M, D)`` and labels.
        x_test, y_test: query features ``(Q, D)`` and labels.
        k: neighbours (DINO: 20). temperature: ``T`` of the weights ``exp(sim / T)`` (DINO: 0.07).
        num_classes: classes voted for (default: ``max(label) + 1`` over both sets; fewer is refused).
        chunk: queries per similarity block (memory).

    Raises:
        InputError: a test label no reference image has (no neighbour could vote for it), among others.
    """
    x_train, y_train = _check_xy(x_train, y_train, "train")
    x_test, y_test = _check_xy(x_test, y_test, "test")
    _check_test_classes(y_train, y_test)
    if not is_int(k) or not 1 <= k <= len(x_train):
        raise InputError(f"k={k!r} must be an int in 1..{len(x_train)} (the training images)")
    if not (is_number(temperature) and 0 < temperature < math.inf):
        raise InputError(f"temperature={temperature!r} must be a finite positive number, e.g. 0.07 (DINO's)")
    k = int(k)
    ncls = _num_classes(num_classes, y_train, y_test)
    tr = x_train / np.clip(np.linalg.norm(x_train, axis=1, keepdims=True), 1e-12, None)
    te = x_test / np.clip(np.linalg.norm(x_test, axis=1, keepdims=True), 1e-12, None)
    correct = 0
    for i in range(0, len(te), chunk):
        sim = te[i: i + chunk] @ tr.T
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        near = np.take_along_axis(sim, top, axis=1)
        # exp(sim / T) over the query's most similar neighbour's: one factor per query (the same vote), no overflow
        w = np.exp((near - near.max(axis=1, keepdims=True)) / temperature)
        votes = np.zeros((len(sim), ncls))
        np.add.at(votes, (np.arange(len(sim))[:, None].repeat(k, 1), y_train[top]), w)
        correct += int((votes.argmax(axis=1) == y_test[i: i + chunk]).sum())
    return 100.0 * correct / len(te)
