"""OnnxModelRegressor / OnnxModelClassifier on graphs whose inputs are not one float32
[N, n_features] matrix (issue 17, item 1): images, int64 token ids, several inputs given as a
dict by input name or a tuple in input order. References: numpy's SGD and forward pass."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score

from ort_train_sklearn import OnnxModelClassifier, OnnxModelRegressor

N, LR, EPOCHS = 24, 0.05, 3
rng = np.random.default_rng(0)


def _model(inputs: list[Any], nodes: list[Any], inits: dict[str, np.ndarray], n_out: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_out])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def two_inputs(n_out: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A [N, 3], B [N, 2] -> Concat -> MatMul W + b."""
    w = {
        "W": rng.standard_normal((5, n_out)).astype(np.float32) * 0.3,
        "b": np.zeros(n_out, dtype=np.float32),
    }
    nodes = [
        helper.make_node("Concat", ["A", "B"], ["cat"], axis=1),
        helper.make_node("MatMul", ["cat", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["Y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("A", TensorProto.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("B", TensorProto.FLOAT, ["N", 2]),
    ]
    return _model(inputs, nodes, w, n_out), w


def ids_images() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ids int64 [N, 4] -> Gather(E) -> mean over tokens [N, 3]; images [N, 1, 2, 2] -> flatten
    [N, 4]; Concat -> MatMul W + b."""
    w = {
        "E": rng.standard_normal((10, 3)).astype(np.float32),
        "W": rng.standard_normal((7, 1)).astype(np.float32) * 0.3,
        "b": np.zeros(1, dtype=np.float32),
    }
    consts = {"axes": np.array([1], dtype=np.int64), "shape": np.array([-1, 4], dtype=np.int64)}
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["emb"]),
        helper.make_node("ReduceMean", ["emb", "axes"], ["pooled"], keepdims=0),
        helper.make_node("Reshape", ["img", "shape"], ["flat"]),
        helper.make_node("Concat", ["pooled", "flat"], ["cat"], axis=1),
        helper.make_node("MatMul", ["cat", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["Y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4]),
        helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 1, 2, 2]),
    ]
    return _model(inputs, nodes, {**w, **consts}, 1), w


def _sgd(
    features: np.ndarray, y: np.ndarray, w: dict[str, np.ndarray], ids: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Full-batch SGD on the mean squared error (the estimators' objective, no 1/2) in float64;
    with ``ids``, the embedding's mean over tokens is prepended to ``features``."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    for _ in range(EPOCHS):
        h = features if ids is None else np.hstack([w["E"][ids].mean(axis=1), features])
        g = 2 * (h @ w["W"] + w["b"] - y.reshape(len(y), -1)) / len(y)
        if ids is not None:
            dh = g @ w["W"][:3].T / ids.shape[1]
            dE = np.zeros_like(w["E"])
            for j in range(ids.shape[1]):
                np.add.at(dE, ids[:, j], dh)
            w["E"] -= LR * dE
        w["W"] -= LR * (h.T @ g)
        w["b"] -= LR * g.sum(axis=0)
    return w


PARAMS: dict[str, Any] = dict(
    solver="sgd", learning_rate_init=LR, momentum=0.0, batch_size=N, max_iter=EPOCHS, shuffle=False, tol=None
)


@pytest.mark.parametrize("form", ["dict", "tuple"])
def test_two_inputs_train_as_numpy(form: str) -> None:
    model, w = two_inputs()
    A, B = rng.standard_normal((N, 3)), rng.standard_normal((N, 2))
    y = rng.standard_normal(N)
    X = {"B": B, "A": A} if form == "dict" else (A, B)
    est = OnnxModelRegressor(model, **PARAMS).fit(X, y)
    expected = _sgd(np.hstack([A, B]), y, w)
    for name in ("W", "b"):
        np.testing.assert_allclose(est.weights_[name], expected[name], rtol=1e-4, atol=1e-5)
    pred = np.hstack([A, B]) @ expected["W"] + expected["b"]
    np.testing.assert_allclose(est.predict(X), pred.ravel(), rtol=1e-4, atol=1e-5)
    assert not hasattr(est, "n_features_in_")  # no single feature matrix


def test_int64_ids_and_images() -> None:
    model, w = ids_images()
    ids = rng.integers(0, 10, size=(N, 4))
    img = rng.standard_normal((N, 1, 2, 2))
    y = rng.standard_normal(N)
    est = OnnxModelRegressor(model, **PARAMS).fit({"ids": ids, "img": img}, y)
    expected = _sgd(img.reshape(N, 4), y, w, ids=ids)
    for name in ("E", "W", "b"):
        np.testing.assert_allclose(est.weights_[name], expected[name], rtol=1e-4, atol=1e-5)
    h = np.hstack([expected["E"][ids].mean(axis=1), img.reshape(N, 4)])
    pred = (h @ expected["W"] + expected["b"]).ravel()
    assert est.score({"ids": ids, "img": img}, y) == pytest.approx(r2_score(y, pred), abs=1e-4)


# random labels: 20 epochs may end without the validation score settling, which is not what
# this test checks; its own generator, as the module's draws depend on which tests ran before
# in the same worker
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_logits_classifier_on_two_inputs_with_early_stopping() -> None:
    model, _ = two_inputs(n_out=3)
    own = np.random.default_rng(1)
    A, B = own.standard_normal((60, 3)), own.standard_normal((60, 2))
    y = own.integers(0, 3, size=60)
    params = {**PARAMS, "max_iter": 20, "batch_size": 10, "tol": 1e-4}
    est = OnnxModelClassifier(model, early_stopping=True, **params).fit((A, B), y)
    proba = est.predict_proba((A, B))
    np.testing.assert_allclose(proba.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_array_equal(est.predict((A, B)), est.classes_[proba.argmax(axis=1)])
    assert all(0 <= s <= 1 for s in est.validation_scores_)


def test_pickled_estimator_predicts_the_same() -> None:
    model, _ = two_inputs()
    A, B = rng.standard_normal((N, 3)), rng.standard_normal((N, 2))
    est = OnnxModelRegressor(model, **PARAMS).fit((A, B), rng.standard_normal(N))
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.predict((A, B)), est.predict((A, B)))


@pytest.mark.parametrize(
    ("X", "error", "message"),
    [
        (lambda A, B: {"A": A}, ValueError, r"missing \['B'\]"),
        (lambda A, B: (A, B[:, :1]), ValueError, r"X\['B'\] has 1 features but the model expects 2"),
        (lambda A, B: A, TypeError, r"the model has 2 batched inputs \['A', 'B'\]"),
    ],
)
def test_bad_inputs_at_predict(X: Any, error: type, message: str) -> None:
    model, _ = two_inputs()
    A, B = rng.standard_normal((N, 3)), rng.standard_normal((N, 2))
    est = OnnxModelRegressor(model, **PARAMS).fit((A, B), rng.standard_normal(N))
    with pytest.raises(error, match=message):
        est.predict(X(A, B))


def test_fractional_ids_are_refused_at_fit() -> None:
    model, _ = ids_images()
    ids = rng.integers(0, 10, size=(N, 4)).astype(float)
    ids[0, 0] = 0.5
    with pytest.raises(ValueError, match=r"integer input 'ids'.*fractions"):
        OnnxModelRegressor(model, **PARAMS).fit({"ids": ids, "img": np.zeros((N, 1, 2, 2))}, np.zeros(N))


def test_a_scikit_learn_model_needs_a_matrix() -> None:
    with pytest.raises(ValueError, match="a scikit-learn model takes a 2-D X"):
        OnnxModelRegressor(LinearRegression(), **PARAMS).fit(np.zeros((N, 2, 2)), np.zeros(N))
