"""Classifier probabilities and the ``classes`` of partial_fit, against scikit-learn.

- ``predict_proba`` of every classifier (binary and multiclass) is computed in float64 from the
  logits: for float64 input rows sum to 1 within 1e-12, ``log_loss`` and
  ``scoring='neg_log_loss'`` do not warn (float32 input too), and the values match
  scikit-learn's own estimators given the same weights;
- ``predict_log_proba`` is the log-softmax of the logits: finite where a float32 probability
  would round to 0;
- ``partial_fit(classes=...)`` validates as scikit-learn's SGDClassifier does (first call needs
  them, later calls must match, labels outside them are refused); OnnxModelClassifier refuses
  classes that are not its model's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression, SGDClassifier
from sklearn.metrics import log_loss
from sklearn.model_selection import cross_val_score
from sklearn.neural_network import MLPClassifier

from ort_train_sklearn import OnnxModelClassifier, OrtMLPClassifier, OrtSGDClassifier

SEED = 0
CLASSIFIERS = ["sgd", "mlp", "onnx"]


def _data(n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    if n_classes == 2:
        X, y = load_breast_cancer(return_X_y=True)
    else:
        X, y = load_iris(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), y


def _make(kind: str, X: np.ndarray, y: np.ndarray) -> Any:
    if kind == "sgd":
        return OrtSGDClassifier(
            loss="log_loss", multi_class="multinomial", max_iter=5, tol=None, random_state=SEED
        )
    if kind == "mlp":
        return OrtMLPClassifier(hidden_layer_sizes=(5,), max_iter=5, random_state=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a few lbfgs steps: a start, not an optimum
        start = LogisticRegression(max_iter=5).fit(X, y)
    return OnnxModelClassifier(start, max_iter=3, learning_rate_init=0.05, random_state=SEED)


def _quiet_fit(est: Any, X: np.ndarray, y: np.ndarray) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def _sklearn_twin(kind: str, est: Any, X: np.ndarray, y: np.ndarray) -> Any:
    """A scikit-learn estimator holding our fitted weights: the independent reference."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if kind == "mlp":
            twin = MLPClassifier(hidden_layer_sizes=(5,), max_iter=1, random_state=SEED).fit(X, y)
            twin.coefs_ = [c.copy() for c in est.coefs_]
            twin.intercepts_ = [b.copy() for b in est.intercepts_]
            return twin
        twin = LogisticRegression(max_iter=1).fit(X, y)
    if kind == "sgd":
        twin.coef_, twin.intercept_ = est.coef_.copy(), est.intercept_.copy()
    else:  # the ONNX graph of a LogisticRegression: X @ coef + intercept
        twin.coef_ = est.weights_["coef"].T.astype(np.float64)
        twin.intercept_ = est.weights_["intercept"].ravel().astype(np.float64)
    return twin


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """Reference log-probabilities from float64 logits (one column: the logits [0, z])."""
    z = np.column_stack([np.zeros(len(z)), z]) if z.ndim == 1 else z
    top = z.max(axis=1, keepdims=True)
    out: np.ndarray = z - top - np.log(np.exp(z - top).sum(axis=1, keepdims=True))
    return out


def _twin_logits(kind: str, twin: Any, X: np.ndarray) -> np.ndarray:
    if kind != "mlp":
        logits: np.ndarray = twin.decision_function(X)
        return logits
    hidden = np.maximum(X @ twin.coefs_[0] + twin.intercepts_[0], 0.0)
    out = hidden @ twin.coefs_[1] + twin.intercepts_[1]
    return out.ravel() if out.shape[1] == 1 else out


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("kind", CLASSIFIERS)
def test_predict_proba_sums_to_one_in_float64(kind: str, n_classes: int) -> None:
    X, y = _data(n_classes)
    est = _quiet_fit(_make(kind, X, y), X, y)
    proba = est.predict_proba(X)
    assert proba.dtype == np.float64
    assert np.abs(proba.sum(axis=1) - 1.0).max() < 1e-12
    expected = _sklearn_twin(kind, est, X, y).predict_proba(X)
    # our logits are computed in float32 by onnxruntime, the twin's in float64
    np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(est.predict(X), est.classes_[np.argmax(expected, axis=1)])


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("kind", CLASSIFIERS)
def test_log_loss_does_not_warn(kind: str, n_classes: int) -> None:
    X, y = _data(n_classes)
    est = _make(kind, X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "The y_prob values do not sum to one"
        warnings.simplefilter("ignore", ConvergenceWarning)
        scores = cross_val_score(est, X, y, cv=3, scoring="neg_log_loss", error_score="raise")
        log_loss(y, _quiet_fit(est, X, y).predict_proba(X))
        # float32 input gives float32 probabilities (as scikit-learn's MLPs), normalised in
        # float64 before the cast: log_loss checks them at float32's precision
        proba32 = est.predict_proba(X.astype(np.float32))
        log_loss(y, proba32)
    assert np.isfinite(scores).all()
    assert proba32.dtype == np.float32


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("kind", CLASSIFIERS)
def test_predict_log_proba_is_the_log_softmax_of_the_logits(kind: str, n_classes: int) -> None:
    """Far from the boundary a float32 probability rounds to 0 and its log is -inf; the
    log-softmax of the logits stays finite and exact."""
    X, y = _data(n_classes)
    est = _quiet_fit(_make(kind, X, y), X, y)
    far = X * 200.0
    got = est.predict_log_proba(far)
    expected = _log_softmax(_twin_logits(kind, _sklearn_twin(kind, est, X, y), far))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.exp(est.predict_log_proba(X)), est.predict_proba(X), rtol=1e-12, atol=0)


# ---- partial_fit(classes=...) ------------------------------------------------------------------

X_PF = np.random.RandomState(SEED).randn(12, 3)
Y_PF = np.array([0, 1, 2] * 4)


def _ours(kind: str) -> Any:
    if kind == "sgd":
        return OrtSGDClassifier(loss="log_loss", multi_class="multinomial", random_state=SEED)
    if kind == "mlp":
        return OrtMLPClassifier(hidden_layer_sizes=(3,), random_state=SEED)
    model = LogisticRegression(max_iter=200).fit(X_PF, Y_PF)
    return OnnxModelClassifier(model, random_state=SEED)


def _outcome(method: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    try:
        method(*args, **kwargs)
    except ValueError:
        return "ValueError"
    return "ok"


# (first call's classes, then the next call's y and classes); None skips that call
PARTIAL_FIT_CASES: list[tuple[Any, Any, Any]] = [
    (None, None, None),  # classes missing on the first call
    ([0, 1, 2], None, None),
    ([2, 0, 1, 1], None, None),  # any order, repeats: classes_ is their sorted set
    ([0, 1], None, None),  # y holds a label not in classes
    ([5, 6, 7], None, None),  # nonsense labels
    ([0, 1, 2], Y_PF, [0, 1]),  # later classes must be the same
    ([0, 1, 2], Y_PF, [2, 1, 0]),  # the same set in another order is the same
    ([0, 1, 2], np.array([0, 1, 3] * 4), None),  # a new label later
]


@pytest.mark.parametrize("case", range(len(PARTIAL_FIT_CASES)))
@pytest.mark.parametrize("kind", CLASSIFIERS)
def test_partial_fit_classes_as_sklearn(kind: str, case: int) -> None:
    first_classes, y_next, next_classes = PARTIAL_FIT_CASES[case]
    ours, reference = _ours(kind), SGDClassifier(random_state=SEED)
    got = [_outcome(ours.partial_fit, X_PF, Y_PF, classes=first_classes)]
    expected = [_outcome(reference.partial_fit, X_PF, Y_PF, classes=first_classes)]
    if y_next is not None and expected[0] == "ok":
        got.append(_outcome(ours.partial_fit, X_PF, y_next, classes=next_classes))
        expected.append(_outcome(reference.partial_fit, X_PF, y_next, classes=next_classes))
    assert got == expected
    if expected[0] == "ok":
        np.testing.assert_array_equal(ours.classes_, reference.classes_)


@pytest.mark.parametrize("kind", ["sgd", "mlp"])
def test_partial_fit_after_fit_checks_classes(kind: str) -> None:
    """scikit-learn: partial_fit after fit must give the classes fit found (or none)."""
    ours, reference = _ours(kind), SGDClassifier(max_iter=5, random_state=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X_PF, Y_PF)
        reference.fit(X_PF, Y_PF)
    for classes in ([0, 1, 2, 3], [0, 1, 2], None):
        got = _outcome(ours.partial_fit, X_PF, Y_PF, classes=classes)
        assert got == _outcome(reference.partial_fit, X_PF, Y_PF, classes=classes), classes


def test_onnx_model_classifier_refuses_classes_not_its_models() -> None:
    model = LogisticRegression(max_iter=200).fit(X_PF, np.array(["a", "b", "c"] * 4))
    est = OnnxModelClassifier(model, random_state=SEED)
    y = np.array(["a", "b", "c"] * 4)
    with pytest.raises(ValueError, match=r"classes=\['a', 'b'\].*model.*\['a', 'b', 'c'\]"):
        est.partial_fit(X_PF, y, classes=["a", "b"])
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        OnnxModelClassifier(model).partial_fit(X_PF, y)
    est.partial_fit(X_PF, y, classes=["c", "a", "b"])
    np.testing.assert_array_equal(est.classes_, ["a", "b", "c"])


def test_labels_encode_by_column_when_the_model_lists_classes_out_of_order() -> None:
    """An ONNX classifier whose classes are not sorted (column 0 is 'b'): a row labelled 'b'
    trains column 0, as the model's own prediction reads it."""
    from onnx import TensorProto, helper, numpy_helper

    W = np.array([[1.0, -1.0]], dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["z"]),
        helper.make_node("Softmax", ["z"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["probabilities"], ["index"], axis=1, keepdims=0),
        helper.make_node("Gather", ["labels", "index"], ["label"], axis=0),
    ]
    labels = numpy_helper.from_array(np.array(["b", "a"], dtype=object), "labels")
    graph = helper.make_graph(
        nodes,
        "unsorted",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])],
        [
            helper.make_tensor_value_info("label", TensorProto.STRING, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2]),
        ],
        [numpy_helper.from_array(W, "W"), labels],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    X = np.array([[1.0], [2.0], [-1.0], [-2.0]])
    y = np.array(["b", "b", "a", "a"])  # what the model already predicts
    est = OnnxModelClassifier(model, learning_rate_init=0.1, max_iter=20, shuffle=False).fit(X, y)
    np.testing.assert_array_equal(est.predict(X), y)
    # training on what it predicts makes it surer: each row's margin z_b - z_a grows in the
    # direction of its label (numpy reference; a label encoded by sorted position would shrink it)
    before = X[:, 0] * (W[0, 0] - W[0, 1])
    after = X[:, 0] * (est.weights_["W"][0, 0] - est.weights_["W"][0, 1])
    assert (np.sign(after) == np.sign(before)).all()
    assert (np.abs(after) > np.abs(before) + 0.1).all()


def test_onnx_model_classifier_resumes(tmp_path: Any) -> None:
    """resume() converts the model as fit() does (it raised AttributeError) and ends where an
    uninterrupted fit ends, classes_ in the model's order."""
    X, y = _data(3)
    model = LogisticRegression(max_iter=200).fit(X, y)
    params: dict[str, Any] = dict(learning_rate_init=0.05, shuffle=False, random_state=SEED)
    straight = OnnxModelClassifier(model, max_iter=4, **params).fit(X, y)
    OnnxModelClassifier(model, max_iter=2, checkpoint_dir=tmp_path, **params).fit(X, y)
    resumed = OnnxModelClassifier(model, max_iter=4, checkpoint_dir=tmp_path, **params).resume(X, y)
    np.testing.assert_array_equal(resumed.classes_, model.classes_)
    for name, value in straight.weights_.items():
        np.testing.assert_allclose(resumed.weights_[name], value, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_onnx_model_with_nan_weights_is_named(kind: str) -> None:
    """A model whose weights hold NaN: the error names them (it said the conversion did not
    reproduce the model's prediction)."""
    from onnx import numpy_helper

    from ort_train_sklearn import OnnxModelRegressor
    from ort_train_sklearn._convert import to_trainable_graph

    X, y = _data(3)
    if kind == "regressor":
        est: Any = OnnxModelRegressor
        fitted: Any = LinearRegression().fit(X, y.astype(np.float64))
    else:
        est = OnnxModelClassifier
        fitted = LogisticRegression(max_iter=200).fit(X, y)
    model = to_trainable_graph(fitted, X[:1]).model
    coef = next(i for i in model.graph.initializer if i.name == "coef")
    values = numpy_helper.to_array(coef).copy()
    values.flat[0] = np.nan
    coef.CopyFrom(numpy_helper.from_array(values, "coef"))
    with pytest.raises(ValueError, match=r"'coef' \(1 of \d+ values\).*NaN or inf"):
        est(model).fit(X, y)
