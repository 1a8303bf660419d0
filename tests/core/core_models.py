"""Small ONNX models built by hand with ``onnx.helper`` (opset 17, IR 8, float32), their numpy
forward passes and a numpy SGD reference: what the core tests import by name.

A module of its own (not conftest.py) so that test folders of other packages, each with its
conftest, never shadow it when pytest runs them together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    opset: int,
    ir_version: int,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test_graph", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    onnx.checker.check_model(model)
    return model


def build_linear(
    n_features: int = 3,
    n_outputs: int = 1,
    *,
    coef: np.ndarray | None = None,
    intercept: np.ndarray | None = None,
    coef_name: str = "coef",
    intercept_name: str = "intercept",
    activation: str | None = None,
    opset: int = OPSET,
    ir_version: int = IR_VERSION,
    seed: int = 0,
) -> onnx.ModelProto:
    """Y = act(X @ coef + intercept); X float32 [N, n_features], Y float32 [N, n_outputs].

    ``activation``: None, 'sigmoid' or 'softmax' (probabilities for the 'log' loss).
    """
    rng = np.random.default_rng(seed)
    if coef is None:
        coef = rng.standard_normal((n_features, n_outputs)).astype(np.float32)
    if intercept is None:
        intercept = rng.standard_normal(n_outputs).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", coef_name], ["mm"])]
    last = "Y" if activation is None else "scores"
    nodes.append(helper.make_node("Add", ["mm", intercept_name], [last]))
    if activation == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", [last], ["Y"]))
    elif activation == "softmax":
        nodes.append(helper.make_node("Softmax", [last], ["Y"], axis=1))
    elif activation is not None:
        raise ValueError(activation)
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_outputs])],
        [
            numpy_helper.from_array(np.asarray(coef, dtype=np.float32), coef_name),
            numpy_helper.from_array(np.asarray(intercept, dtype=np.float32), intercept_name),
        ],
        opset,
        ir_version,
    )


MLP_WEIGHTS = ("W1", "b1", "W2", "b2")


def build_mlp(n_features: int = 4, hidden: int = 6, n_outputs: int = 1, *, seed: int = 0) -> onnx.ModelProto:
    """Y = relu(X @ W1 + b1) @ W2 + b2 (float32)."""
    rng = np.random.default_rng(seed)
    values = {
        "W1": (rng.standard_normal((n_features, hidden)) / np.sqrt(n_features)).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "W2": (rng.standard_normal((hidden, n_outputs)) / np.sqrt(hidden)).astype(np.float32),
        "b2": (0.1 * rng.standard_normal(n_outputs)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["o0"]),
        helper.make_node("Add", ["o0", "b2"], ["Y"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_outputs])],
        [numpy_helper.from_array(values[k], k) for k in MLP_WEIGHTS],
        OPSET,
        IR_VERSION,
    )


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer of ``model`` as a numpy array (the reference's starting point)."""
    return {i.name: numpy_helper.to_array(i).copy() for i in model.graph.initializer}


def linear_forward(
    weights: dict[str, np.ndarray], X: np.ndarray, names: Sequence[str] = ("coef", "intercept")
) -> np.ndarray:
    coef, intercept = (np.asarray(weights[n], dtype=np.float64) for n in names)
    return np.asarray(X, dtype=np.float64) @ coef + intercept


def mlp_forward(weights: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    W1, b1, W2, b2 = (np.asarray(weights[n], dtype=np.float64) for n in MLP_WEIGHTS)
    return np.maximum(np.asarray(X, dtype=np.float64) @ W1 + b1, 0.0) @ W2 + b2


def linear_sgd_reference(
    weights: dict[str, np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    *,
    eta: Callable[[int], float] | float,
    batch_size: int,
    epochs: int,
    orders: Sequence[np.ndarray] | None = None,
    names: Sequence[str] = ("coef", "intercept"),
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Plain SGD on the mean squared error of the linear model, in float64.

    ``orders[e]`` is the row order of epoch e (None: row order). Returns the final weights and
    the per-epoch objective (batch losses before each update, averaged with batch sizes).
    """
    cn, bn = names
    coef = np.asarray(weights[cn], dtype=np.float64).copy()
    intercept = np.asarray(weights[bn], dtype=np.float64).copy()
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(len(X), -1)
    history = []
    for epoch in range(epochs):
        lr = eta(epoch) if callable(eta) else float(eta)
        order = np.arange(len(X)) if orders is None else orders[epoch]
        losses, sizes = [], []
        for start in range(0, len(X), batch_size):
            idx = order[start : start + batch_size]
            xb, yb = X[idx], y[idx]
            diff = xb @ coef + intercept - yb
            losses.append(float(np.mean(np.sum(diff**2, axis=1))))
            sizes.append(len(idx))
            coef -= lr * 2.0 * xb.T @ diff / len(idx)
            intercept -= lr * 2.0 * diff.sum(axis=0) / len(idx)
        history.append(float(np.dot(losses, sizes) / np.sum(sizes)))
    return {cn: coef, bn: intercept}, history
