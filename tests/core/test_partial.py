"""The partial loop (OrtGradientForwardBackwardOptimizer: forward/backward through TrainingAgent,
then a loss graph and a penalty+update graph) against independent references: the numpy
implementation of DESIGN.md's math contract (tests/core/reference.py), the full loop on the
equivalent add_loss_output graph, scikit-learn's LogisticRegression and plain onnxruntime."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import reference as ref
from core_models import IR_VERSION, OPSET, build_linear, build_mlp, initializers, linear_sgd_reference
from onnx import TensorProto, helper, numpy_helper

import ort_train_core as otc
from ort_train_core._backends import default_backend

N_ROWS, N_FEATURES, N_HIDDEN, N_OUT = 25, 4, 5, 2
BATCH_SIZE = 10  # batches of 10, 10, 5
N_EPOCHS = 3
RTOL, ATOL = 1e-4, 1e-6
PEN_L1, PEN_L2 = 0.01, 0.05
#: the weights of rank >= 2, the only ones ElasticLearningPenalty applies to
MATRICES = {"linear": ["coef"], "mlp": ["W1", "W2"]}

# key -> (the partial loop's learning_loss, add_loss_output's score_name, its kwargs)
LOSSES: dict[str, tuple[Callable[[], Any], str, dict[str, float]]] = {
    "square": (lambda: "square_error", "squared_error", {}),
    "absolute": (otc.AbsoluteLearningLoss, "absolute_error", {}),
    "elastic": (
        lambda: otc.ElasticLearningLoss(l1_weight=0.3, l2_weight=0.7),
        "elastic",
        {"l1_weight": 0.3, "l2_weight": 0.7},
    ),
}

# key -> (reference optimizer, the package's learning rate)
OPTIMIZERS: dict[str, tuple[Callable[[], ref.Optimizer], Callable[[], otc.BaseLearningRate]]] = {
    "sgd_constant": (
        lambda: ref.Optimizer("sgd", 0.05, "constant"),
        lambda: otc.LearningRateSGD(eta0=0.05, learning_rate="constant"),
    ),
    "sgd_invscaling": (
        lambda: ref.Optimizer("sgd", 0.05, "invscaling", power_t=0.5),
        lambda: otc.LearningRateSGD(eta0=0.05, power_t=0.5, learning_rate="invscaling"),
    ),
    "nesterov": (
        lambda: ref.Optimizer("nesterov", 0.02, "invscaling", power_t=0.3, momentum=0.7),
        lambda: otc.LearningRateSGDNesterov(eta0=0.02, power_t=0.3, momentum=0.7, nesterov=True),
    ),
    "adam": (
        lambda: ref.Optimizer("adam", 0.02, beta1=0.8, beta2=0.99, epsilon=1e-7),
        lambda: otc.LearningRateAdam(eta0=0.02, beta1=0.8, beta2=0.99, epsilon=1e-7),
    ),
}


# ---- models, data, the two references ----------------------------------------------------------
def make_model(kind: str, n_out: int = N_OUT) -> onnx.ModelProto:
    if kind == "linear":
        return build_linear(N_FEATURES, n_out, seed=3)
    return build_mlp(N_FEATURES, N_HIDDEN, n_out, seed=3)


def regression_data(
    n_rows: int = N_ROWS, noise: float = 0.3, seed: int = 42
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X, a linear target (plus noise) with N_OUT columns, positive sample weights."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, N_FEATURES)).astype(np.float32)
    true = rng.standard_normal((N_FEATURES, N_OUT))
    y = X @ true + 0.5 + noise * rng.standard_normal((n_rows, N_OUT))
    sample_weight = rng.uniform(0.2, 2.0, n_rows).astype(np.float32)
    return X, y.astype(np.float32), sample_weight


def ref_penalty(
    kind: str, penalized: bool, trained: list[str] | None = None
) -> dict[str, tuple[float, float]]:
    if not penalized:
        return {}
    return {w: (PEN_L1, PEN_L2) for w in MATRICES[kind] if trained is None or w in trained}


def numpy_fit(
    kind: str,
    score: ref.Score,
    opt_key: str,
    penalty: dict[str, tuple[float, float]],
    weights: dict[str, np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    sample_weight: np.ndarray | None = None,
    n_epochs: int = N_EPOCHS,
    head: str = "identity",
    weights_to_train: list[str] | None = None,
) -> tuple[dict[str, np.ndarray], list[float]]:
    problem = ref.Problem(kind, head, score, penalty)
    return ref.train(
        problem,
        OPTIMIZERS[opt_key][0](),
        weights,
        X,
        y,
        sample_weight,
        n_epochs,
        BATCH_SIZE,
        weights_to_train,
    )


def partial_trainer(model: onnx.ModelProto, loss: Any, opt_key: str, penalized: bool, **kwargs: Any) -> Any:
    kwargs.setdefault("max_iter", N_EPOCHS)
    kwargs.setdefault("batch_size", BATCH_SIZE)
    kwargs.setdefault("shuffle", False)
    return otc.OrtGradientForwardBackwardOptimizer(
        model,
        learning_rate=OPTIMIZERS[opt_key][1](),
        learning_loss=loss,
        learning_penalty=otc.ElasticLearningPenalty(l1=PEN_L1, l2=PEN_L2) if penalized else None,
        **kwargs,
    )


def full_trainer(full_model: onnx.ModelProto, opt_key: str) -> otc.OrtGradientOptimizer:
    """The full loop with the same schedule as :func:`partial_trainer`."""
    return otc.OrtGradientOptimizer(
        full_model,
        max_iter=N_EPOCHS,
        batch_size=BATCH_SIZE,
        learning_rate=OPTIMIZERS[opt_key][1](),
        shuffle=False,
    )


def assert_weights(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], start=None) -> None:
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].dtype == np.float32
        np.testing.assert_allclose(got[name], expected[name], rtol=RTOL, atol=ATOL, err_msg=name)
        if start is not None:  # the comparison is not between two unchanged copies
            moved = np.abs(np.asarray(expected[name]) - start[name]).max()
            assert moved > 1e-3, (name, moved)


# ---- 1. partial loop == full loop == numpy ---------------------------------------------------------
@pytest.mark.parametrize("penalized", [False, True], ids=["nopen", "pen"])
@pytest.mark.parametrize("loss_key", list(LOSSES))
@pytest.mark.parametrize("opt_key", list(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_partial_equals_full_loop_and_numpy(kind: str, opt_key: str, loss_key: str, penalized: bool) -> None:
    model = make_model(kind)
    start = initializers(model)
    X, y, _ = regression_data()
    make_loss, score_name, score_kwargs = LOSSES[loss_key]

    partial = partial_trainer(model, make_loss(), opt_key, penalized).fit(X, y)

    penalty = {w: {"l1": PEN_L1, "l2": PEN_L2} for w in MATRICES[kind]} if penalized else None
    full_model = otc.add_loss_output(model, score_name, penalty=penalty, **score_kwargs)
    full = full_trainer(full_model, opt_key).fit(X, y)

    expected, expected_losses = numpy_fit(
        kind, ref.Score(score_name, score_kwargs), opt_key, ref_penalty(kind, penalized), start, X, y
    )
    assert_weights(partial.get_state(), expected, start)
    assert_weights(full.get_state(), expected)
    for name in expected:
        np.testing.assert_allclose(
            partial.get_state()[name], full.get_state()[name], rtol=RTOL, atol=ATOL, err_msg=name
        )
    assert partial.n_iter_ == N_EPOCHS
    assert len(partial.train_losses_) == N_EPOCHS
    np.testing.assert_allclose(partial.train_losses_, expected_losses, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(partial.train_losses_, full.train_losses_, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opt_key", list(OPTIMIZERS))
def test_device_resident_path_matches_numpy(opt_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path CUDA takes (learning-rate scalars on the device, losses and penalties read once
    per epoch), run on CPU: both loops still give numpy's weights and epoch losses, for
    per-epoch scalars (SGD, Nesterov, invscaling) and per-step ones (Adam)."""
    from ort_train_core import _data

    monkeypatch.setattr(_data, "DEVICE_RESIDENT_KINDS", {"cpu", "cuda"})
    model = make_model("mlp")
    start = initializers(model)
    X, y, _ = regression_data()
    partial = partial_trainer(model, otc.SquareLearningLoss(), opt_key, True).fit(X, y)
    penalty = {w: {"l1": PEN_L1, "l2": PEN_L2} for w in MATRICES["mlp"]}
    full = full_trainer(otc.add_loss_output(model, "squared_error", penalty=penalty), opt_key).fit(X, y)
    expected, expected_losses = numpy_fit(
        "mlp", ref.Score("squared_error", {}), opt_key, ref_penalty("mlp", True), start, X, y
    )
    for trainer in (partial, full):
        assert_weights(trainer.get_state(), expected, start)
        np.testing.assert_allclose(trainer.train_losses_, expected_losses, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("kind", "loss_key", "opt_key", "weights_to_train"),
    [
        ("mlp", "elastic", "adam", ["W2", "b1"]),  # W1 frozen: not penalised; b1 trained: not penalised
        ("mlp", "square", "nesterov", ["b2", "W1"]),
        ("linear", "absolute", "sgd_invscaling", ["intercept"]),  # nothing of rank 2 is trained
    ],
)
def test_subset_of_weights_and_sample_weight(
    kind: str, loss_key: str, opt_key: str, weights_to_train: list[str]
) -> None:
    model = make_model(kind)
    start = initializers(model)
    X, y, sw = regression_data()
    make_loss, score_name, score_kwargs = LOSSES[loss_key]
    trainer = partial_trainer(model, make_loss(), opt_key, True, weights_to_train=weights_to_train)
    trainer.fit(X, y, sample_weight=sw)
    expected, losses = numpy_fit(
        kind,
        ref.Score(score_name, score_kwargs),
        opt_key,
        ref_penalty(kind, True, weights_to_train),
        start,
        X,
        y,
        sample_weight=sw,
        weights_to_train=weights_to_train,
    )
    assert_weights(trainer.get_state(), {w: expected[w] for w in weights_to_train}, start)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=RTOL, atol=ATOL)
    # the frozen weights keep their values in the exported graph
    exported = initializers(trainer.get_trained_onnx())
    for name in set(start) - set(weights_to_train):
        np.testing.assert_array_equal(exported[name], start[name])


def test_shuffle_follows_default_rng_orders(linear_data: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = linear_data
    model = build_linear(3, 1)
    trainer = otc.OrtGradientForwardBackwardOptimizer(
        model, max_iter=4, batch_size=10, learning_rate=0.05, shuffle=True, random_state=11
    ).fit(X, y)
    rng = np.random.default_rng(11)
    orders = [rng.permutation(len(X)) for _ in range(4)]
    expected, history = linear_sgd_reference(
        initializers(model), X, y, eta=0.05, batch_size=10, epochs=4, orders=orders
    )
    assert_weights(trainer.get_state(), expected)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=RTOL)


def test_output_index_trains_the_chosen_output() -> None:
    """Two outputs, the loss on the second: the first gets a zero output gradient."""
    base = make_model("linear")
    start = initializers(base)
    nodes = [
        helper.make_node("MatMul", ["X", "coef"], ["mm"]),
        helper.make_node("Sigmoid", ["mm"], ["aux"]),
        helper.make_node("Add", ["mm", "intercept"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_outputs",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", N_FEATURES])],
        [
            helper.make_tensor_value_info("aux", TensorProto.FLOAT, ["N", N_OUT]),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", N_OUT]),
        ],
        [numpy_helper.from_array(v, k) for k, v in start.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    X, y, _ = regression_data()
    trainer = partial_trainer(model, "square_error", "adam", True, output_index=1).fit(X, y)
    expected, losses = numpy_fit(
        "linear", ref.Score("squared_error"), "adam", ref_penalty("linear", True), start, X, y
    )
    assert_weights(trainer.get_state(), expected, start)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("loss_key", ["absolute", "elastic"])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_robust_losses_decrease_on_noiseless_problem(kind: str, loss_key: str) -> None:
    X, y, _ = regression_data(n_rows=60, noise=0.0)
    trainer = partial_trainer(make_model(kind), LOSSES[loss_key][0](), "adam", False, max_iter=40)
    trainer.fit(X, y)
    losses = np.array(trainer.train_losses_)
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.25 * losses[0], losses
    # mostly downhill: no epoch much worse than the one before
    assert (np.diff(losses) < 0.05 * losses[0]).all(), losses
    # the exported graph's error on the data is the contract's loss, computed by numpy
    pred = ref.forward(kind, {k: v.astype(np.float64) for k, v in trainer.get_state().items()}, X)[0]
    rows, _ = ref.Score(LOSSES[loss_key][1], LOSSES[loss_key][2]).row_loss(pred, y.astype(np.float64))
    assert rows.mean() < 0.25 * losses[0]


# ---- classification losses on the raw scores ---------------------------------------------------------
@pytest.mark.parametrize(
    ("loss", "score", "head", "n_out"),
    [
        (otc.NegLogLearningLoss(), ref.Score("log", {"eps": 1e-5}), "sigmoid", 1),
        (
            otc.NegLogLearningLoss(eps=1e-4, probability_function="softmax"),
            ref.Score("log", {"eps": 1e-4}),
            "softmax",
            3,
        ),
        (otc.CrossEntropyLearningLoss(), ref.Score("cross_entropy"), "identity", 1),
        (otc.CrossEntropyLearningLoss(), ref.Score("cross_entropy"), "identity", 3),
    ],
    ids=["log_sigmoid", "log_softmax", "ce_binary", "ce_multiclass"],
)
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_classification_losses_match_numpy(
    kind: str, loss: Any, score: ref.Score, head: str, n_out: int
) -> None:
    model = make_model(kind, n_out)
    start = initializers(model)
    X, scores, sw = regression_data()
    y = (scores[:, 0] > 0.5).astype(np.int64) if n_out == 1 else (np.floor(scores[:, 0]) % 3).astype(np.int64)
    trainer = partial_trainer(model, loss, "adam", True).fit(X, y, sample_weight=sw)
    expected, losses = numpy_fit(
        kind, score, "adam", ref_penalty(kind, True), start, X, y, sample_weight=sw, head=head
    )
    assert_weights(trainer.get_state(), expected, start)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=RTOL, atol=ATOL)


def _split(loader: Callable[..., Any]) -> tuple[np.ndarray, ...]:
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = loader(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    return (
        scaler.transform(X_train).astype(np.float32),
        scaler.transform(X_test).astype(np.float32),
        y_train,
        y_test,
    )


@pytest.mark.parametrize(
    ("dataset", "epochs", "eta0", "batch_size", "label_dtype"),
    [
        ("breast_cancer", 30, 0.01, 32, np.int32),
        ("iris", 200, 0.02, 16, np.int64),
        ("digits", 30, 0.01, 32, np.int64),
    ],
)
def test_classifier_close_to_logistic_regression(
    dataset: str, epochs: int, eta0: float, batch_size: int, label_dtype: Any
) -> None:
    import sklearn.datasets
    from sklearn.linear_model import LogisticRegression

    X_train, X_test, y_train, y_test = _split(getattr(sklearn.datasets, f"load_{dataset}"))
    n_classes = len(np.unique(y_train))
    n_out = 1 if n_classes == 2 else n_classes
    d = X_train.shape[1]
    model = build_linear(d, n_out, coef=np.zeros((d, n_out)), intercept=np.zeros(n_out))
    loss = otc.NegLogLearningLoss() if n_out == 1 else otc.CrossEntropyLearningLoss()
    trainer = otc.OrtGradientForwardBackwardOptimizer(
        model,
        max_iter=epochs,
        batch_size=batch_size,
        learning_rate=otc.LearningRateAdam(eta0=eta0),
        learning_loss=loss,
        random_state=0,
    ).fit(X_train, y_train.astype(label_dtype))

    exported = trainer.get_trained_onnx(with_probability=True)
    sess = onnxruntime.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    (proba,) = sess.run(None, {"X": X_test})
    # probabilities: numpy's sigmoid/softmax of numpy's forward with the trained weights
    state = {k: v.astype(np.float64) for k, v in trainer.get_state().items()}
    logits = ref.forward("linear", state, X_test.astype(np.float64))[0]
    expected = ref.head_forward("sigmoid" if n_out == 1 else "softmax", logits)
    np.testing.assert_allclose(proba, expected, rtol=1e-4, atol=1e-6)
    # without the probability function, the export holds the logits
    raw = onnxruntime.InferenceSession(
        trainer.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"X": X_test})[0]
    np.testing.assert_allclose(raw, logits, rtol=1e-4, atol=1e-5)

    predicted = (proba[:, 0] > 0.5).astype(np.int64) if n_out == 1 else proba.argmax(axis=1)
    accuracy = float((predicted == y_test).mean())
    sk_accuracy = LogisticRegression(max_iter=2000).fit(X_train, y_train).score(X_test, y_test)
    assert abs(accuracy - sk_accuracy) <= 0.02 + 1e-9, (accuracy, sk_accuracy)


def test_with_probability_needs_a_probability_function() -> None:
    X, y, _ = regression_data()
    trainer = partial_trainer(make_model("linear"), "square_error", "sgd_constant", False, max_iter=1)
    trainer.fit(X, y)
    with pytest.raises(ValueError, match="probability"):
        trainer.get_trained_onnx(with_probability=True)


# ---- 5. parameters, pickling ---------------------------------------------------------------------
def test_set_params_learning_rate_then_fit(linear_data: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = linear_data
    model = build_linear(3, 1)
    start = initializers(model)
    trainer = otc.OrtGradientForwardBackwardOptimizer(model, max_iter=1, learning_rate="Adam", shuffle=False)
    trainer.fit(X, y)  # builds and caches Adam's graphs
    assert trainer.set_params(learning_rate=0.05) is trainer
    assert trainer.get_params()["learning_rate"] == 0.05
    trainer.fit(X, y)
    expected, history = linear_sgd_reference(start, X, y, eta=0.05, batch_size=10, epochs=1)
    assert_weights(trainer.get_state(), expected, start)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=RTOL)


def test_get_params_holds_loss_and_penalty() -> None:
    loss = otc.ElasticLearningLoss(l1_weight=0.3, l2_weight=0.7)
    penalty = otc.ElasticLearningPenalty(l1=PEN_L1, l2=PEN_L2)
    trainer = otc.OrtGradientForwardBackwardOptimizer(
        make_model("mlp"), learning_loss=loss, learning_penalty=penalty, max_iter=N_EPOCHS, shuffle=False
    )
    params = trainer.get_params()
    assert params["learning_loss"] is loss
    assert params["learning_penalty"] is penalty
    assert params["learning_loss__l1_weight"] == 0.3
    assert params["learning_loss__l2_weight"] == 0.7
    assert params["learning_penalty__l1"] == PEN_L1
    assert params["learning_penalty__l2"] == PEN_L2
    assert "weight_name" in params
    assert params["batch_size"] == 10

    # a nested parameter set through the trainer changes the fit
    X, y, _ = regression_data()
    trainer.set_params(learning_rate=OPTIMIZERS["adam"][1](), batch_size=BATCH_SIZE)
    trainer.fit(X, y)
    trainer.set_params(learning_loss__l1_weight=0.9, learning_penalty__l2=0.2)
    assert loss.l1_weight == 0.9
    trainer.fit(X, y)
    start = initializers(make_model("mlp"))
    expected, losses = numpy_fit(
        "mlp",
        ref.Score("elastic", {"l1_weight": 0.9, "l2_weight": 0.7}),
        "adam",
        {w: (PEN_L1, 0.2) for w in MATRICES["mlp"]},
        start,
        X,
        y,
    )
    assert_weights(trainer.get_state(), expected, start)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=RTOL, atol=ATOL)

    # scikit-learn's clone rebuilds it from get_params
    from sklearn.base import clone

    copy = clone(trainer)
    assert copy is not trainer
    assert repr(copy.learning_loss) == repr(loss)
    assert copy.learning_loss is not loss
    assert not hasattr(copy, "train_losses_")


@pytest.mark.parametrize("opt_key", ["adam", "nesterov"])
def test_pickled_trainer_continues_identically(opt_key: str) -> None:
    model = make_model("mlp")
    start = initializers(model)
    X, y, sw = regression_data()
    trainer = partial_trainer(
        model, LOSSES["elastic"][0](), opt_key, True, max_iter=2, warm_start=True, weight_name="w"
    )
    trainer.fit(X, y, sample_weight=sw)
    blob = pickle.dumps(trainer)
    trainer.fit(X, y, sample_weight=sw)  # continued without pickling
    restored = pickle.loads(blob)
    assert restored.n_iter_ == 2
    restored.fit(X, y, sample_weight=sw)
    assert restored.n_iter_ == trainer.n_iter_ == 4
    a, b = trainer.get_state(), restored.get_state()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert restored.train_losses_ == pytest.approx(trainer.train_losses_, rel=1e-6)
    # and both are the 4-epoch numpy trajectory (optimizer state and epoch count carried over)
    expected, losses = numpy_fit(
        "mlp",
        ref.Score("elastic", LOSSES["elastic"][2]),
        opt_key,
        ref_penalty("mlp", True),
        start,
        X,
        y,
        sample_weight=sw,
        n_epochs=4,
    )
    assert_weights(b, expected, start)
    np.testing.assert_allclose(restored.train_losses_, losses, rtol=RTOL, atol=ATOL)


OBJECTS = [
    (otc.SquareLearningLoss(), [], []),
    (otc.AbsoluteLearningLoss(), [], []),
    (otc.ElasticLearningLoss(l1_weight=0.2), ["l1_weight=0.2"], ["l2_weight"]),
    (
        otc.NegLogLearningLoss(eps=0.01, probability_function="softmax"),
        ["eps=0.01", "probability_function='softmax'"],
        [],
    ),
    (otc.CrossEntropyLearningLoss(), [], []),
    (otc.NoLearningPenalty(), [], []),
    (otc.ElasticLearningPenalty(l2=0.25), ["l2=0.25"], ["l1="]),
    (
        otc.LearningRateSGD(eta0=0.3, learning_rate="constant"),
        ["eta0=0.3", "learning_rate='constant'"],
        ["alpha"],
    ),
    (otc.LearningRateSGDNesterov(momentum=0.5, nesterov=False), ["momentum=0.5", "nesterov=False"], ["eta0"]),
    (otc.LearningRateAdam(beta2=0.95), ["beta2=0.95"], ["beta1", "eta0"]),
]


@pytest.mark.parametrize(("obj", "shown", "hidden"), OBJECTS, ids=lambda v: type(v).__name__)
def test_objects_repr_params_pickle(obj: Any, shown: list[str], hidden: list[str]) -> None:
    text = repr(obj)
    assert text.startswith(type(obj).__name__ + "(")
    for part in shown:
        assert part in text
    for part in hidden:
        assert part not in text
    if not shown:
        assert text == f"{type(obj).__name__}()"
    copy = pickle.loads(pickle.dumps(obj))
    assert type(copy) is type(obj)
    assert copy.get_params() == obj.get_params()
    assert repr(copy) == text
    with pytest.raises(ValueError, match="invalid parameter"):
        obj.set_params(no_such_parameter=1)


def test_objects_set_params_change_the_fit() -> None:
    """Loss, penalty and learning rate changed in place (their own set_params) after a fit: the
    next fit follows the new values, as numpy computes them."""
    model = make_model("linear")
    start = initializers(model)
    X, y, _ = regression_data()
    loss = otc.ElasticLearningLoss(l1_weight=0.3, l2_weight=0.7)
    penalty = otc.ElasticLearningPenalty(l1=PEN_L1, l2=PEN_L2)
    lr = otc.LearningRateSGD(eta0=0.05, learning_rate="constant")
    trainer = otc.OrtGradientForwardBackwardOptimizer(
        model,
        max_iter=2,
        learning_rate=lr,
        learning_loss=loss,
        learning_penalty=penalty,
        shuffle=False,
    )

    def check(l1_weight: float, l2_weight: float, l1: float, l2: float, eta: float) -> None:
        trainer.fit(X, y)
        problem = ref.Problem(
            "linear",
            "identity",
            ref.Score("elastic", {"l1_weight": l1_weight, "l2_weight": l2_weight}),
            {"coef": (l1, l2)},
        )
        expected, losses = ref.train(problem, ref.Optimizer("sgd", eta), start, X, y, None, 2, BATCH_SIZE)
        assert_weights(trainer.get_state(), expected, start)
        np.testing.assert_allclose(trainer.train_losses_, losses, rtol=RTOL, atol=ATOL)

    check(0.3, 0.7, PEN_L1, PEN_L2, 0.05)
    assert loss.set_params(l1_weight=0.9, l2_weight=0.1) is loss
    check(0.9, 0.1, PEN_L1, PEN_L2, 0.05)
    penalty.set_params(l1=0.2, l2=0.3)
    check(0.9, 0.1, 0.2, 0.3, 0.05)
    lr.set_params(eta0=0.02)
    check(0.9, 0.1, 0.2, 0.3, 0.02)
    # the unpickled objects train the same way
    trainer.set_params(
        learning_loss=pickle.loads(pickle.dumps(loss)),
        learning_penalty=pickle.loads(pickle.dumps(penalty)),
        learning_rate=pickle.loads(pickle.dumps(lr)),
    )
    check(0.9, 0.1, 0.2, 0.3, 0.02)


# ---- 6. saved graphs --------------------------------------------------------------------------------
def test_save_onnx_graph_writes_loadable_graphs(tmp_path: Any) -> None:
    model = make_model("mlp")
    X, y, sw = regression_data()
    trainer = partial_trainer(model, LOSSES["elastic"][0](), "adam", True, max_iter=2)
    trainer.fit(X, y, sample_weight=sw)
    paths = trainer.save_onnx_graph(tmp_path / "graphs")
    expected_names = {
        "trained",
        "evaluation_loss",
        "forward_backward_batch10",
        "forward_backward_batch5",
        "loss_gradient_batch10",
        "loss_gradient_batch5",
        "penalty_and_update",
    }
    assert set(paths) == expected_names
    loaded = {}
    for name, path in paths.items():
        assert os.path.basename(path) == f"{name}.onnx"
        assert os.path.dirname(path) == os.fspath(tmp_path / "graphs")
        loaded[name] = onnx.load(path)
        onnx.checker.check_model(loaded[name], full_check=False)
        assert loaded[name].ir_version <= 10
    for batch in (10, 5):
        fb = loaded[f"forward_backward_batch{batch}"].graph
        if default_backend().name == "onnxruntime-training":  # the onnx backend: default domain
            assert any(n.domain == "com.microsoft" for n in fb.node)
        assert fb.input[0].type.tensor_type.shape.dim[0].dim_value == batch

    # what each holds, run by onnxruntime and checked with numpy
    state64 = {k: v.astype(np.float64) for k, v in trainer.get_state().items()}
    cpu = ["CPUExecutionProvider"]
    trained = onnxruntime.InferenceSession(loaded["trained"].SerializeToString(), providers=cpu)
    np.testing.assert_allclose(
        trained.run(None, {"X": X})[0],
        ref.forward("mlp", state64, X.astype(np.float64))[0],
        rtol=1e-5,
        atol=1e-6,
    )

    score = ref.Score("elastic", LOSSES["elastic"][2])
    rng = np.random.default_rng(3)
    pred = rng.standard_normal((10, N_OUT)).astype(np.float32)
    label = rng.standard_normal((10, N_OUT)).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, 10).astype(np.float32)
    lg = onnxruntime.InferenceSession(loaded["loss_gradient_batch10"].SerializeToString(), providers=cpu)
    got = dict(
        zip(
            [o.name for o in lg.get_outputs()],
            lg.run(None, {"prediction": pred, "label": label, "weight": weight}),
        )
    )
    rows, drows = score.row_loss(pred.astype(np.float64), label.astype(np.float64))
    scale = weight.astype(np.float64) / weight.sum()
    np.testing.assert_allclose(got["loss"], (scale * rows).sum(), rtol=1e-5)
    np.testing.assert_allclose(got["prediction_grad"], drows * scale[:, None], rtol=1e-5, atol=1e-7)
    for size in (10, 5):  # one graph per batch size, its batch dimension fixed
        inputs = {i.name: i for i in loaded[f"loss_gradient_batch{size}"].graph.input}
        assert inputs["prediction"].type.tensor_type.shape.dim[0].dim_value == size

    # the objective (loss + penalty) at the weights the graph holds
    ev = onnxruntime.InferenceSession(loaded["evaluation_loss"].SerializeToString(), providers=cpu)
    feeds = {"X": X, "label": y, "sample_weight": sw}
    assert sorted(i.name for i in ev.get_inputs()) == sorted(feeds)
    outputs = dict(zip([o.name for o in ev.get_outputs()], ev.run(None, feeds)))
    held = {k: v.astype(np.float64) for k, v in initializers(loaded["evaluation_loss"]).items()}
    problem = ref.Problem("mlp", "identity", score, ref_penalty("mlp", True))
    objective, _ = problem.objective(held, X.astype(np.float64), y.astype(np.float64), sw.astype(np.float64))
    np.testing.assert_allclose(outputs["loss"], objective, rtol=1e-5)

    assert "penalty" in [o.name for o in loaded["penalty_and_update"].graph.output]


# ---- 7. validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("weighted_validation", [False, True])
def test_validation_losses_are_the_numpy_loss_without_penalty(weighted_validation: bool) -> None:
    # the trainer is penalised; its validation losses measure the fit to data only (as score)
    model = make_model("mlp")
    start = initializers(model)
    X, y, _ = regression_data()
    X_val, y_val, sw_val = regression_data(n_rows=17, seed=5)
    trainer = partial_trainer(model, LOSSES["elastic"][0](), "nesterov", True)
    trainer.fit(X, y, X_val=X_val, y_val=y_val, sample_weight_val=sw_val if weighted_validation else None)
    score = ref.Score("elastic", LOSSES["elastic"][2])
    problem = ref.Problem("mlp", "identity", score)
    s_val = sw_val.astype(np.float64) if weighted_validation else np.ones(len(X_val))
    expected = []
    for epochs in range(1, N_EPOCHS + 1):
        params, _ = numpy_fit(
            "mlp", score, "nesterov", ref_penalty("mlp", True), start, X, y, n_epochs=epochs
        )
        expected.append(
            problem.objective(params, X_val.astype(np.float64), y_val.astype(np.float64), s_val)[0]
        )
    assert len(trainer.validation_losses_) == N_EPOCHS
    np.testing.assert_allclose(trainer.validation_losses_, expected, rtol=RTOL, atol=ATOL)
    # the validation set differs from the training set: the two histories differ
    assert not np.allclose(trainer.validation_losses_, trainer.train_losses_, rtol=1e-3)
