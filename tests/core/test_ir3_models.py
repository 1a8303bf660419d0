"""IR-3 models (initializers also listed among the graph inputs, as IR 3 requires; opset 8)
train in both loops: onnxruntime's gradient builder adds initializers that are not graph inputs,
which IR 3 forbids ("Cannot find NodeArgs for [Add_Grad/ReduceAxes_for_b_grad]")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_train_core

W0 = np.array([[0.5, 0.2], [-1.0, 0.3], [0.25, -0.4]], np.float32)
B0 = np.array([0.1, -0.2], np.float32)
LR = 0.1


def _ir3_linear() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["Y"])],
        "ir3",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [3, 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(W0, "W"), numpy_helper.from_array(B0, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_ir3_model_trains_like_numpy(loop):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3)).astype(np.float32)
    y = rng.standard_normal((20, 2)).astype(np.float32)
    common = dict(max_iter=1, batch_size=20, learning_rate=LR, shuffle=False)
    if loop == "full":
        trainer = ort_train_core.OrtGradientOptimizer(ort_train_core.add_loss_output(_ir3_linear()), **common)
    else:
        trainer = ort_train_core.OrtGradientForwardBackwardOptimizer(_ir3_linear(), **common)
    trainer.fit(X, y)
    # one full-batch step on the mean over rows of the squared error summed over outputs
    d = X.astype(np.float64) @ W0 + B0 - y
    state = trainer.get_state()
    np.testing.assert_allclose(state["W"], W0 - LR * 2 * X.T @ d / len(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["b"], B0 - LR * 2 * d.mean(axis=0), rtol=1e-5, atol=1e-6)
