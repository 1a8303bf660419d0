"""Shared by the tests of the exported training step (issue 29: Python, the CLI, Node.js, C++):
the MLP they train, its data and the reference, ``OrtGradientOptimizer``'s fit with the same
settings on the ``onnx`` backend (one epoch of consecutive batches, ``shuffle=False``).

A module of its own (not conftest.py), imported by name like ``batchnorm_support``; it needs no
torch, so the tests that use it run on 3.13 too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from ort_train_core import OrtGradientOptimizer

#: rows a step, and steps of a test: one epoch over BATCH * STEPS rows
BATCH = 8
STEPS = 20
WEIGHTS = ["W1", "B1", "W2", "B2"]


def mlp(
    n_in: int = 64, hidden: int = 16, n_out: int = 10, seed: int = 0, activation: str = "Relu"
) -> onnx.ModelProto:
    """Gemm-activation-Gemm with a free batch dimension (input ``X``, output ``Y``, weights
    ``W1, B1, W2, B2``), drawn like torch's Linear."""
    rng = np.random.default_rng(seed)

    def uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        bound = 1 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    inits = [
        numpy_helper.from_array(uniform((hidden, n_in), n_in), "W1"),
        numpy_helper.from_array(uniform((hidden,), n_in), "B1"),
        numpy_helper.from_array(uniform((n_out, hidden), hidden), "W2"),
        numpy_helper.from_array(uniform((n_out,), hidden), "B2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "B1"], ["H"], transB=1),
        helper.make_node(activation, ["H"], ["R"], name="act"),
        helper.make_node("Gemm", ["R", "W2", "B2"], ["Y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def digits(rows: int = BATCH * STEPS) -> tuple[np.ndarray, np.ndarray]:
    """The first ``rows`` digits: features scaled to [0, 1] (float32), int64 classes."""
    X, y = load_digits(return_X_y=True)
    return (X[:rows] / 16).astype(np.float32), y[:rows].astype(np.int64)


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The model's initializers by name."""
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def reference_fit(loss_model: onnx.ModelProto, lr: Any, X: Any, y: Any, **fit: Any) -> OrtGradientOptimizer:
    """The full loop the exported steps are compared with: one epoch of consecutive batches of
    :data:`BATCH` rows, the learning rate ``lr``, the ``onnx`` backend."""
    trainer = OrtGradientOptimizer(
        loss_model, max_iter=1, batch_size=BATCH, learning_rate=lr, shuffle=False, backend="onnx"
    )
    trainer.fit(X, y, **fit)
    return trainer
