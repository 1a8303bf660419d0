"""Resize and ConvTranspose have no CPU gradient kernel in onnxruntime-training 1.19.2 (issue 26,
item 16): every route refuses them naming the node, the missing kernel and the fix. Before,
onnxruntime's session error was read as an element-type gap ("convert the graph and the data
to float32") for graphs already in float32."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_train_core as otc
from backend_support import training_build_only
from ort_train_core.exceptions import GraphNotDifferentiableError

_DIFFERENTIATED = (
    "the onnx backend differentiates Resize and ConvTranspose (tests/core/autodiff, the zoo's UNet)"
)


def _model(op: str) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """A float32 graph with a weight before ``op`` (ConvTranspose, or Conv then Resize), its
    input and a target of its output's shape."""
    weights = [numpy_helper.from_array(np.full((2, 2, 3, 3), 0.1, np.float32), "W")]
    if op == "ConvTranspose":
        nodes = [helper.make_node("ConvTranspose", ["X", "W"], ["Y"], name="up", kernel_shape=[3, 3])]
        out = (2, 2, 6, 6)
    else:
        weights.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
        nodes = [
            helper.make_node("Conv", ["X", "W"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Resize", ["c", "", "scales"], ["Y"], name="up", mode="nearest"),
        ]
        out = (2, 2, 8, 8)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2, out[2], out[3]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, np.ones((2, 2, 4, 4), np.float32), np.zeros(out, np.float32)


def _expected(op: str) -> str:
    return re.escape(
        f"operator {op} (node 'up') has no gradient kernel on CPU in onnxruntime-training 1.19.2 "
        f"({op}Grad exists only for CUDA): train on a CUDA device, leave the weights before the "
        f"{op} out of weights_to_train, or write that step with other operators"
    )


def _train(route: str, model: onnx.ModelProto, X: np.ndarray, y: np.ndarray) -> None:
    """One step of ``route``: the full loop, the partial loop or the bare forward/backward."""
    if route == "full":
        otc.OrtGradientOptimizer(otc.add_loss_output(model), max_iter=1).fit(X, y)
    elif route == "partial":
        otc.OrtGradientForwardBackwardOptimizer(model, max_iter=1).fit(X, y)
    else:
        fb = otc.OrtGradientForwardBackward(model, weights_to_train=["W"])
        fb.forward([X])
        fb.backward([y])


@training_build_only(_DIFFERENTIATED)
@pytest.mark.parametrize("route", ["full", "partial", "forward_backward"])
@pytest.mark.parametrize("op", ["Resize", "ConvTranspose"])
def test_no_cpu_gradient_kernel_is_named(op: str, route: str) -> None:
    model, X, y = _model(op)
    with pytest.raises(GraphNotDifferentiableError, match=f"^{_expected(op)}$"):
        _train(route, model, X, y)


@training_build_only(_DIFFERENTIATED)
def test_onnx_module_names_the_missing_kernel() -> None:
    """OnnxModule (the forward/backward pair) says the same."""
    torch: Any = pytest.importorskip("torch")
    from ort_train_torch import OnnxModule

    model, X, _ = _model("Resize")

    def step() -> None:
        OnnxModule(model)(torch.tensor(X)).sum().backward()

    with pytest.raises(GraphNotDifferentiableError, match=f"^{_expected('Resize')}$"):
        step()
