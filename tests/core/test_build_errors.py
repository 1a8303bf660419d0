"""Every failure to build the gradient graphs names the operator and the node, says what to do,
and shows none of onnxruntime's C++ context (issue 17, item 10), on each route: the fused step
(OrtGradientOptimizer), the forward/backward pair of the partial loop
(OrtGradientForwardBackwardOptimizer) and of a layer (OrtGradientForwardBackward)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    GraphNotDifferentiableError,
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core._backends import default_backend

X = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
#: what onnxruntime's messages carry before their own words: the C++ source and signature
CPP_CONTEXT = re.compile(r"onnxruntime_src|\.cc:\d+|pybind11|std::|\[ONNXRuntimeError\]")


def _model(op: str, node_name: str) -> onnx.ModelProto:
    """X @ W, then ``op``: Softplus (no gradient in onnxruntime-training) or Mod of [N, 3] by a
    [2] tensor (shapes onnxruntime's graph builder refuses)."""
    inits = [numpy_helper.from_array(np.full((3, 3), 0.3, np.float32), "W")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"], name="matmul")]
    if op == "Mod":
        inits.append(numpy_helper.from_array(np.ones(2, np.float32), "divisor"))
        nodes.append(helper.make_node("Mod", ["h", "divisor"], ["Y"], name=node_name, fmod=1))
    else:
        nodes.append(helper.make_node(op, ["h"], ["Y"], name=node_name))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _build(route: str, model: onnx.ModelProto) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if route == "full":
            OrtGradientOptimizer(add_loss_output(model), max_iter=1, batch_size=4).fit(X, X)
        elif route == "partial":
            OrtGradientForwardBackwardOptimizer(model, max_iter=1, batch_size=4).fit(X, X)
        else:
            OrtGradientForwardBackward(model)


ROUTES = ["full", "partial", "layer"]


#: an operator the default backend has no gradient for (the onnx backend differentiates Softplus)
NO_GRADIENT_OP = "Softplus" if default_backend().name == "onnxruntime-training" else "Sin"
TRAINING_BUILD_WORDS = pytest.mark.skipif(
    default_backend().name != "onnxruntime-training", reason="onnxruntime-training's own failure"
)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("node_name", ["act", ""], ids=["named", "unnamed"])
def test_operator_without_gradient_is_named_with_its_node(route: str, node_name: str) -> None:
    with pytest.raises(GraphNotDifferentiableError) as info:
        _build(route, _model(NO_GRADIENT_OP, node_name))
    message = str(info.value)
    assert f"operator {NO_GRADIENT_OP}" in message
    assert "has no gradient" in message
    if node_name:
        assert "node 'act'" in message
    assert "weights_to_train" in message  # what to do
    assert not CPP_CONTEXT.search(message), message


@TRAINING_BUILD_WORDS
@pytest.mark.parametrize("route", ROUTES)
def test_graph_builder_failure_names_node_and_operator(route: str) -> None:
    """A failure that is not a missing gradient (here onnxruntime's shape inference) still says
    which node, which operator and what to do, in onnxruntime's words without its C++ context."""
    with pytest.raises(GraphNotDifferentiableError) as info:
        _build(route, _model("Mod", "bad_mod"))
    message = str(info.value)
    assert "node 'bad_mod'" in message
    assert "operator Mod" in message
    assert "Incompatible dimensions" in message
    assert "check_model" in message
    assert not CPP_CONTEXT.search(message), message


def test_a_session_that_onnxruntime_refuses_is_one_clean_error() -> None:
    """make_session's failures other than a missing kernel: onnxruntime's words (the node and
    the operator it could not find) without its C++ context, and the check to run."""
    from ort_train_core import parse_device
    from ort_train_core._binding import make_session

    graph = helper.make_graph(
        [helper.make_node("Addd", ["X", "X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    expected = r"could not create a session on cpu: .*No Op registered for Addd"
    with pytest.raises(ValueError, match=expected) as info:
        make_session(model, parse_device("cpu"))
    assert "[ONNXRuntimeError]" not in str(info.value)
    assert "check_model" in str(info.value)
