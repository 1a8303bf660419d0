"""A graph output that is also a graph input or an initializer (issue 26, item 18): the
forward/backward builder failed with onnxruntime's bare "grad_node_arg != nullptr was false."
(partial loop, OrtGradientForwardBackward, OnnxModule), and the process died of a segmentation
fault when that input required a gradient. It is refused naming the value and the fix; the full
loop, whose builder handles it, trains the graph as numpy's gradient step does. The other bare
"was false." of the same builder, a weight read inside an If whose condition depends on the
data, is checked here too (named since 7a0d674)."""

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

W0 = np.arange(6, dtype=np.float32).reshape(3, 2) / 10


def _model(extra: str) -> onnx.ModelProto:
    """Y = X @ W, with ``extra`` (the input X or the weight W) as a second output."""
    shapes = {"X": ["N", 3], "W": [3, 2]}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info(extra, TensorProto.FLOAT, shapes[extra]),
        ],
        [numpy_helper.from_array(W0, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _message(extra: str) -> str:
    kind = "input" if extra == "X" else "initializer"
    return re.escape(
        f"graph output {extra!r} is also a graph {kind}, which onnxruntime-training's forward/backward "
        "builder (partial loop, OrtGradientForwardBackward, OnnxModule) cannot differentiate: remove "
        f"that output, or output a copy (an Identity node reading {extra!r} with a new name); the full "
        "loop (OrtGradientOptimizer) trains the graph as it is"
    )


X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
Y = np.ones((4, 2), np.float32)


def _run(route: str, model: onnx.ModelProto) -> None:
    """Builds and runs ``route``'s forward/backward pair on ``model``."""
    if route == "partial":
        otc.OrtGradientForwardBackwardOptimizer(model, ["W"], max_iter=1).fit(X, Y)
    elif route == "OnnxModule":
        torch: Any = pytest.importorskip("torch")
        from ort_train_torch import OnnxModule

        OnnxModule(model)(torch.tensor(X, requires_grad=True))[0].sum().backward()
    else:
        requiring = ["X"] if route == "pair requiring X" else []
        otc.OrtGradientForwardBackward(
            model, weights_to_train=["W"], input_names_requiring_grad=requiring
        ).forward([X])


@training_build_only("an output that is an input trains there (no module graph builder)")
@pytest.mark.parametrize("extra", ["X", "W"])
@pytest.mark.parametrize("route", ["pair", "pair requiring X", "partial", "OnnxModule"])
def test_output_that_is_an_input_is_refused(route: str, extra: str) -> None:
    with pytest.raises(GraphNotDifferentiableError, match=f"^{_message(extra)}$"):
        _run(route, _model(extra))


def test_full_loop_trains_it() -> None:
    """The fix the message gives: the full loop takes numpy's SGD step (the first output's
    squared error summed per row, mean over the rows)."""
    lr = 0.1
    trainer = otc.OrtGradientOptimizer(
        otc.add_loss_output(_model("X")), ["W"], max_iter=1, batch_size=4, learning_rate=lr
    )
    state = trainer.fit(X, Y).get_state()
    expected = W0 - lr * X.T @ (2 * (X @ W0 - Y) / len(X))  # squared error summed per row, mean over rows
    np.testing.assert_allclose(state["W"], expected, rtol=1e-5, atol=1e-7)


def _if_model() -> onnx.ModelProto:
    """Y = X @ W or -(X @ W), chosen by the sign of sum(X): the weight W is read inside both
    branches of an If whose condition depends on the data."""
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 2]) for n in ("t", "e")]
    then = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["t"])], "then", [], [out[0]])
    other = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["p"]), helper.make_node("Neg", ["p"], ["e"])],
        "else",
        [],
        [out[1]],
    )
    nodes = [
        helper.make_node("ReduceSum", ["X"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["Y"], name="branch", then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W0, "W"), numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("route", ["pair", "partial", "OnnxModule"])
def test_weight_inside_an_if_is_named(route: str) -> None:
    """Item 18: a weight read inside an If with a data-dependent condition gave the forward/
    backward builder's bare "was false."; the refusal names the weight and the If node."""
    with pytest.raises(GraphNotDifferentiableError) as info:
        _run(route, _if_model())
    message = str(info.value)
    assert "['W']" in message, message
    assert "node 'branch' (If)" in message, message
    assert "was false" not in message
