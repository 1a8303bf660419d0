"""NegLogLearningLoss on scores ('sigmoid', 'softmax'): the gradient is ``p - y`` at any score.
Clipping the probability to ``[eps, 1 - eps]`` gave no gradient to rows whose true-class
probability fell under eps (|score| > 11.5), so confidently wrong rows stopped teaching."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    NegLogLearningLoss,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

LR = 0.1


def _model(W0: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "scores",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, W0.shape[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, W0.shape[1]])],
        [numpy_helper.from_array(W0, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _numpy_gradient(kind: str, X: np.ndarray, W: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d mean(-log p_true) / dW, written out with numpy in float64."""
    z = X.astype(np.float64) @ W.astype(np.float64)
    n = len(X)
    if kind == "sigmoid-binary":
        return X.T @ (_sigmoid(z[:, 0]) - y)[:, None] / n
    onehot = np.eye(W.shape[1])[y]
    if kind == "softmax":
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return X.T @ (e / e.sum(axis=1, keepdims=True) - onehot) / n
    # a sigmoid per class, the true class's probability: d/dz_y of -log sigmoid(z_y)
    return X.T @ (onehot * (_sigmoid(z) - 1.0)) / n


CASES = {"sigmoid-binary": ("sigmoid", 1), "softmax": ("softmax", 3), "sigmoid-per-class": ("sigmoid", 3)}


@pytest.mark.parametrize("loop", ["partial", "full"])
@pytest.mark.parametrize("kind", list(CASES))
def test_confidently_wrong_rows_still_give_their_gradient(kind, loop):
    function, n_cols = CASES[kind]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8, 3)).astype(np.float32)
    W0 = (20.0 * rng.normal(size=(3, n_cols))).astype(np.float32)
    y = rng.integers(0, max(n_cols, 2), size=8)
    z = X @ W0
    # the case of the review: scores far beyond the clip (a true-class probability < 1e-5)
    assert np.abs(z).max() > 20
    loss = NegLogLearningLoss(probability_function=function)
    common = dict(max_iter=1, batch_size=8, learning_rate=LR, shuffle=False)
    if loop == "partial":
        trainer = OrtGradientForwardBackwardOptimizer(_model(W0), learning_loss=loss, **common)
    else:
        trainer = OrtGradientOptimizer(add_loss_output(_model(W0), score_name=loss), **common)
    trainer.fit(X, y.astype(np.int64))
    expected = W0 - LR * _numpy_gradient(kind, X, W0, y)
    np.testing.assert_allclose(trainer.get_state()["W"], expected, rtol=1e-4, atol=1e-5)
    assert np.abs(expected - W0).max() > 1e-2


def test_probabilities_given_are_still_clipped():
    # 'none' reads probabilities: -log clip(p, eps, 1 - eps), as documented
    from ort_train_core._builder import NodeBuilder

    b = NodeBuilder(TensorProto.FLOAT, 17, set(), prefix="t_")
    out = NegLogLearningLoss(eps=1e-3, probability_function="none").row_loss(b, "P", "label", [None, 2])
    graph = helper.make_graph(
        b.nodes,
        "g",
        [
            helper.make_tensor_value_info("P", TensorProto.FLOAT, [None, 2]),
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
        ],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    P = np.array([[0.9999, 0.0001], [0.3, 0.7]], np.float32)
    got = sess.run(None, {"P": P, "label": np.array([1, 1], np.int64)})[0]
    np.testing.assert_allclose(got, -np.log(np.clip(P[:, 1], 1e-3, 1 - 1e-3)), rtol=1e-5)
