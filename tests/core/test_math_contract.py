"""The full-training loop (OrtGradientOptimizer) against a numpy implementation of DESIGN.md's
math contract (tests/core/reference.py): weights after 3 epochs and train_losses_, for every
learning rate, every score of add_loss_output, with and without sample weights and penalties,
on a linear model and on a 2-layer MLP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_train_core as otc

try:  # tests/core as a package or as a plain folder on sys.path
    from . import reference as ref
except ImportError:
    import reference as ref  # type: ignore[no-redef]

N_ROWS, N_FEATURES, N_HIDDEN = 25, 4, 5
MLP_INIT_SCALE = 0.3
BATCH_SIZE = 10  # batches of 10, 10, 5
N_EPOCHS = 3
RTOL, ATOL = 1e-4, 1e-6


# ---- cases -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoreCase:
    """A score of add_loss_output, the head the graph ends with, and the label layout."""

    score: str
    head: str  # 'identity', 'sigmoid', 'softmax'
    n_out: int
    kwargs: tuple[tuple[str, Any], ...] = ()
    #: scale of the linear model's initial weights (larger: more spread probabilities);
    #: the MLP's are always MLP_INIT_SCALE
    init_scale: float = 0.3
    #: the learning rate is multiplied by this (losses have different gradient scales)
    lr_scale: float = 1.0

    @property
    def classification(self) -> bool:
        return self.score in ("log", "cross_entropy")


SCORES = {
    "squared_error": ScoreCase("squared_error", "identity", 2, lr_scale=0.5),
    "squared_error_1col": ScoreCase("squared_error", "identity", 1, lr_scale=0.5),
    "absolute_error": ScoreCase("absolute_error", "identity", 2),
    "elastic": ScoreCase("elastic", "identity", 2, (("l1_weight", 0.3), ("l2_weight", 0.7)), lr_scale=0.5),
    "log_binary": ScoreCase("log", "sigmoid", 1, lr_scale=2.0),
    "log_multiclass": ScoreCase("log", "softmax", 3, lr_scale=2.0),
    # eps large enough that some probabilities are clipped (their gradient is 0)
    "log_binary_clipped": ScoreCase("log", "sigmoid", 1, (("eps", 0.3),), init_scale=1.0),
    "log_multiclass_clipped": ScoreCase("log", "softmax", 3, (("eps", 0.2),), init_scale=1.0),
    "cross_entropy_binary": ScoreCase("cross_entropy", "identity", 1, lr_scale=2.0),
    "cross_entropy_multiclass": ScoreCase("cross_entropy", "identity", 3, lr_scale=2.0),
}

# name -> (reference optimizer, a factory of the package's learning rate); eta0 scaled per score
OPTIMIZERS = {
    "sgd_constant": (
        lambda eta: ref.Optimizer("sgd", eta, "constant"),
        lambda eta: otc.LearningRateSGD(eta0=eta, learning_rate="constant"),
    ),
    "sgd_invscaling": (
        lambda eta: ref.Optimizer("sgd", eta, "invscaling", power_t=0.5),
        lambda eta: otc.LearningRateSGD(eta0=eta, power_t=0.5, learning_rate="invscaling"),
    ),
    "sgd_optimal": (
        lambda eta: ref.Optimizer("sgd", eta, "optimal", alpha=3.0),
        lambda eta: otc.LearningRateSGD(eta0=eta, alpha=3.0, learning_rate="optimal"),
    ),
    "momentum": (
        lambda eta: ref.Optimizer("momentum", eta / 4, "constant", momentum=0.8),
        lambda eta: otc.LearningRateSGDNesterov(
            eta0=eta / 4, learning_rate="constant", momentum=0.8, nesterov=False
        ),
    ),
    "nesterov": (
        lambda eta: ref.Optimizer("nesterov", eta / 4, "invscaling", power_t=0.3, momentum=0.7),
        lambda eta: otc.LearningRateSGDNesterov(
            eta0=eta / 4, power_t=0.3, learning_rate="invscaling", momentum=0.7, nesterov=True
        ),
    ),
    "adam": (
        lambda eta: ref.Optimizer("adam", eta / 5, beta1=0.8, beta2=0.99, epsilon=1e-7),
        lambda eta: otc.LearningRateAdam(eta0=eta / 5, beta1=0.8, beta2=0.99, epsilon=1e-7),
    ),
}
BASE_ETA = 0.1

PENALTIES = {
    "linear": {"coef": {"l1": 0.01, "l2": 0.05}},
    "mlp": {"W1": {"l1": 0.02, "l2": 0.03}, "W2": 0.05},
}


# ---- models and data ---------------------------------------------------------------------------
def _initial_weights(model: str, n_out: int, scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234 + n_out)
    if model == "linear":
        shapes = {"coef": (N_FEATURES, n_out), "intercept": (n_out,)}
    else:
        shapes = {"W1": (N_FEATURES, N_HIDDEN), "b1": (N_HIDDEN,), "W2": (N_HIDDEN, n_out), "b2": (n_out,)}
    weights = {
        name: (rng.standard_normal(shape) * scale).astype(np.float32) for name, shape in shapes.items()
    }
    if model == "mlp":  # keep most hidden units alive
        weights["b1"] = (np.abs(weights["b1"]) + 0.1).astype(np.float32)
    return weights


def make_model(model: str, head: str, n_out: int, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """X(N, d) -> linear or MatMul/Add/Relu/MatMul/Add -> optional Sigmoid/Softmax -> Y(N, n_out)."""
    nodes = []
    if model == "linear":
        nodes += [
            helper.make_node("MatMul", ["X", "coef"], ["xw"]),
            helper.make_node("Add", ["xw", "intercept"], ["z"]),
        ]
    else:
        nodes += [
            helper.make_node("MatMul", ["X", "W1"], ["xw1"]),
            helper.make_node("Add", ["xw1", "b1"], ["a1"]),
            helper.make_node("Relu", ["a1"], ["h1"]),
            helper.make_node("MatMul", ["h1", "W2"], ["hw2"]),
            helper.make_node("Add", ["hw2", "b2"], ["z"]),
        ]
    if head == "identity":
        nodes.append(helper.make_node("Identity", ["z"], ["Y"]))
    elif head == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["z"], ["Y"]))
    else:
        nodes.append(helper.make_node("Softmax", ["z"], ["Y"], axis=1))
    graph = helper.make_graph(
        nodes,
        f"{model}_{head}",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", N_FEATURES])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_out])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onx.ir_version = 8
    onnx.checker.check_model(onx)
    return onx


def make_data(case: ScoreCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    X = rng.standard_normal((N_ROWS, N_FEATURES)).astype(np.float32)
    sample_weight = rng.uniform(0.2, 2.0, N_ROWS).astype(np.float32)
    true = rng.standard_normal((N_FEATURES, max(case.n_out, 2)))
    scores = X @ true + 0.3 * rng.standard_normal((N_ROWS, true.shape[1]))
    if not case.classification:
        y = (scores[:, : case.n_out] + 0.5).astype(np.float32)
    elif case.n_out == 1:
        y = (scores[:, 0] > 0).astype(np.int64)
    else:
        y = scores[:, : case.n_out].argmax(axis=1).astype(np.int64)
    return X, y, sample_weight


# ---- one comparison ----------------------------------------------------------------------------
def run_case(
    model: str,
    score_key: str,
    opt_key: str,
    weighted: bool,
    penalized: bool,
    reduction: str = "mean",
    weights_to_train: list[str] | None = None,
    lr_factor: float = 1.0,
    batch_size: int = BATCH_SIZE,
    feed_weights: bool = True,
) -> None:
    """Trains N_EPOCHS with the package and with the reference, compares weights and losses.

    ``weighted``: the graph has a sample-weight input; ``feed_weights=False`` then fits without
    sample_weight (every s_i is 1).
    """
    case = SCORES[score_key]
    scale = case.init_scale if model == "linear" else MLP_INIT_SCALE
    weights = _initial_weights(model, case.n_out, scale)
    X, y, sw = make_data(case)
    penalty = PENALTIES[model] if penalized else None
    kwargs = dict(case.kwargs)
    onx = otc.add_loss_output(
        make_model(model, case.head, case.n_out, weights),
        score_name=case.score,
        weight_name="weight" if weighted else None,
        penalty=penalty,
        reduction=reduction,
        **kwargs,
    )
    make_ref_opt, make_lr = OPTIMIZERS[opt_key]
    eta = BASE_ETA * case.lr_scale * lr_factor
    fed = sw if weighted and feed_weights else None
    trainer = otc.OrtGradientOptimizer(
        onx,
        weights_to_train=weights_to_train,
        max_iter=N_EPOCHS,
        batch_size=batch_size,
        learning_rate=make_lr(eta),
        shuffle=False,
    )
    trainer.fit(X, y, fed)
    got = trainer.get_state()

    score = ref.Score(case.score, kwargs)
    problem = ref.Problem(model, case.head, score, ref.normalise_penalty(penalty), reduction)
    expected, expected_losses = ref.train(
        problem,
        make_ref_opt(eta),
        weights,
        X,
        y,
        fed,
        N_EPOCHS,
        batch_size,
        weights_to_train,
    )
    if "clipped" in score_key:  # the case is there to exercise the clip's zero gradient
        assert score.n_clipped > 0
        assert score.n_inside > 0

    trained = list(weights) if weights_to_train is None else weights_to_train
    assert sorted(got) == sorted(trained)
    for name in set(weights) - set(trained):  # frozen weights: the reference leaves them alone
        np.testing.assert_array_equal(expected[name], weights[name])
    for name in trained:
        assert got[name].dtype == np.float32
        np.testing.assert_allclose(got[name], expected[name], rtol=RTOL, atol=ATOL, err_msg=name)
        # the weights moved substantially (the comparison is not between two unchanged copies)
        moved = np.abs(expected[name] - weights[name]).max()
        assert moved > 0.01 * max(0.1, float(np.abs(weights[name]).max())), (name, moved)
        assert np.isfinite(expected[name]).all()
    assert len(trainer.train_losses_) == N_EPOCHS
    np.testing.assert_allclose(trainer.train_losses_, expected_losses, rtol=RTOL, atol=ATOL)
    assert all(np.isfinite(expected_losses))


MODELS = ["linear", "mlp"]


@pytest.mark.parametrize("penalized", [False, True], ids=["nopen", "pen"])
@pytest.mark.parametrize("weighted", [False, True], ids=["nosw", "sw"])
@pytest.mark.parametrize("score_key", list(SCORES))
@pytest.mark.parametrize("opt_key", list(OPTIMIZERS))
@pytest.mark.parametrize("model", MODELS)
def test_full_loop_matches_reference(
    model: str, opt_key: str, score_key: str, weighted: bool, penalized: bool
) -> None:
    run_case(model, score_key, opt_key, weighted, penalized)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("score_key", "opt_key"),
    [("squared_error", "sgd_constant"), ("cross_entropy_multiclass", "adam"), ("absolute_error", "nesterov")],
)
def test_reduction_sum(model: str, score_key: str, opt_key: str) -> None:
    # 'sum': L = sum_i s_i l_i, about batch_size times the mean, hence the smaller step
    run_case(model, score_key, opt_key, weighted=True, penalized=True, reduction="sum", lr_factor=0.1)


@pytest.mark.parametrize(
    ("model", "score_key", "opt_key", "weights_to_train"),
    [
        ("mlp", "squared_error", "momentum", ["W1", "b2"]),
        ("mlp", "log_multiclass", "adam", ["W2"]),
        ("linear", "cross_entropy_binary", "sgd_invscaling", ["coef"]),
    ],
)
def test_subset_of_weights(model: str, score_key: str, opt_key: str, weights_to_train: list[str]) -> None:
    run_case(model, score_key, opt_key, weighted=True, penalized=True, weights_to_train=weights_to_train)


@pytest.mark.parametrize(
    ("model", "score_key", "opt_key", "batch_size"),
    [
        ("linear", "elastic", "adam", 7),  # 7, 7, 7, 4
        ("mlp", "cross_entropy_multiclass", "nesterov", 25),  # one batch per epoch
        ("mlp", "log_binary", "sgd_optimal", 5),
    ],  # equal batches
)
def test_other_batch_sizes(model: str, score_key: str, opt_key: str, batch_size: int) -> None:
    run_case(model, score_key, opt_key, weighted=True, penalized=True, batch_size=batch_size)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("score_key", ["squared_error", "cross_entropy_binary"])
def test_weight_input_without_sample_weight(model: str, score_key: str) -> None:
    # the graph has a weight input but fit gets no sample_weight: every s_i is 1
    run_case(model, score_key, "sgd_constant", weighted=True, penalized=False, feed_weights=False)


# ---- the reference checks itself: its hand-written gradients against finite differences --------
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("penalized", [False, True], ids=["nopen", "pen"])
@pytest.mark.parametrize("weighted", [False, True], ids=["nosw", "sw"])
@pytest.mark.parametrize("score_key", list(SCORES))
@pytest.mark.parametrize("model", MODELS)
def test_reference_gradients(
    model: str, score_key: str, weighted: bool, penalized: bool, reduction: str
) -> None:
    case = SCORES[score_key]
    scale = case.init_scale if model == "linear" else MLP_INIT_SCALE
    params = {k: v.astype(np.float64) for k, v in _initial_weights(model, case.n_out, scale).items()}
    X, y, sw = make_data(case)
    X, s = X[:BATCH_SIZE].astype(np.float64), sw[:BATCH_SIZE].astype(np.float64)
    y = y[:BATCH_SIZE].astype(np.float64) if not case.classification else y[:BATCH_SIZE]
    penalty = ref.normalise_penalty(PENALTIES[model] if penalized else None)
    problem = ref.Problem(model, case.head, ref.Score(case.score, dict(case.kwargs)), penalty, reduction)
    if not weighted:
        s = np.ones_like(s)
    _, grads = problem.objective(params, X, y, s)
    h = 1e-6
    for name, W in params.items():
        numeric = np.zeros_like(W)
        for idx in np.ndindex(W.shape):
            plus = {**params, name: W.copy()}
            minus = {**params, name: W.copy()}
            plus[name][idx] += h
            minus[name][idx] -= h
            numeric[idx] = (problem.objective(plus, X, y, s)[0] - problem.objective(minus, X, y, s)[0]) / (
                2 * h
            )
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)
