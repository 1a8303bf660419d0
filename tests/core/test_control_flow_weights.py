"""Weights used inside or through If/Loop/Scan (issue 15, item 14): the fused loop's gradient
builder failed with raw C++ text ("GetIndexFromName ... was false") for a weight read inside a
subgraph, and aborted the whole process for a gradient through an If. It now refuses both with a
message that names the node and the fix; the fix it names (the partial loop) trains both graphs
to the numpy reference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backend_support import training_build_only
from ort_train_core import (
    GraphNotDifferentiableError,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.cli import main

W0 = np.array([[0.5], [-1.0], [2.0]], dtype=np.float32)
rng = np.random.default_rng(3)
X = rng.standard_normal((16, 3)).astype(np.float32)
Y = rng.standard_normal((16, 1)).astype(np.float32)


def _if_model(kind: str) -> onnx.ModelProto:
    """``inside``: Y = If(true, then: X@W + h, else: -h) with h = X@W (W read in the branch);
    ``through``: Y = If(true, then: Relu(h), else: -h) (the gradient of W crosses the If)."""
    out = helper.make_tensor_value_info
    if kind == "inside":
        then_nodes = [
            helper.make_node("MatMul", ["X", "W"], ["t0"]),
            helper.make_node("Add", ["t0", "h"], ["t"]),
        ]
    else:
        then_nodes = [helper.make_node("Relu", ["h"], ["t"])]
    then = helper.make_graph(then_nodes, "then", [], [out("t", TensorProto.FLOAT, ["N", 1])])
    other = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["e"])], "else", [], [out("e", TensorProto.FLOAT, ["N", 1])]
    )
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h"]),
        helper.make_node("If", ["cond"], ["Y"], name="branch", then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [out("X", TensorProto.FLOAT, ["N", 3])],
        [out("Y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(W0, "W"), numpy_helper.from_array(np.array(True), "cond")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _numpy_sgd(kind: str, lr: float, epochs: int) -> np.ndarray:
    """Full-batch SGD on mean((f - y)^2) with f = 2 X W (inside) or relu(X W) (through)."""
    W = W0.astype(np.float64)
    x = X.astype(np.float64)
    for _ in range(epochs):
        h = x @ W
        f = 2 * h if kind == "inside" else np.maximum(h, 0)
        df = 2 * (f - Y) / len(x)
        dh = 2 * df if kind == "inside" else df * (h > 0)
        W = W - lr * (x.T @ dh)
    return W


@pytest.mark.parametrize("kind", ["inside", "through"])
def test_fused_loop_names_the_control_flow_and_the_fix(kind: str) -> None:
    loss_model = add_loss_output(_if_model(kind))
    with pytest.raises(GraphNotDifferentiableError) as info:
        OrtGradientOptimizer(loss_model, max_iter=1).fit(X, Y)
    message = str(info.value)
    assert "node 'branch' (If)" in message
    if kind == "inside":
        assert "reads weight(s) ['W'] inside its subgraphs" in message
    assert "OrtGradientForwardBackwardOptimizer" in message
    assert "was false" not in message  # no raw onnxruntime text


@training_build_only(
    "no gradient through If (refused naming the node); the training build inlines a constant If"
)
@pytest.mark.parametrize("kind", ["inside", "through"])
def test_the_partial_loop_named_as_the_fix_trains_them(kind: str) -> None:
    trainer = OrtGradientForwardBackwardOptimizer(
        _if_model(kind), max_iter=3, batch_size=len(X), shuffle=False, learning_rate=0.05
    ).fit(X, Y)
    np.testing.assert_allclose(trainer.get_state()["W"], _numpy_sgd(kind, 0.05, 3), rtol=1e-5, atol=1e-6)


def test_cli_inspect_and_fit_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "if.onnx"
    path.write_bytes(_if_model("inside").SerializeToString())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gradient graph: no: the fused training loop cannot differentiate through control flow" in out
    data = tmp_path / "d.csv"
    np.savetxt(data, np.column_stack([X, Y]), delimiter=",", header="a,b,c,t", comments="")
    code = main(["fit", str(path), "--data", str(data), "--target", "t", "--out", str(tmp_path / "o.onnx")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "node 'branch' (If)" in err
    assert "Traceback" not in err


def _nested_weight_model() -> onnx.ModelProto:
    """Y = If(true, then: If(true, X@W, X@W), else: X): W is read two subgraph levels down only."""
    out = helper.make_tensor_value_info
    leaf = [
        helper.make_graph(
            [helper.make_node("MatMul", ["X", "W"], [n])], n, [], [out(n, TensorProto.FLOAT, ["N", 1])]
        )
        for n in ("a", "b")
    ]
    then = helper.make_graph(
        [helper.make_node("If", ["cond"], ["t"], then_branch=leaf[0], else_branch=leaf[1])],
        "then",
        [],
        [out("t", TensorProto.FLOAT, ["N", 1])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["e"])],
        "else",
        [],
        [out("e", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["Y"], name="outer", then_branch=then, else_branch=other)],
        "g",
        [out("X", TensorProto.FLOAT, ["N", 3])],
        [out("Y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(W0, "W"), numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@training_build_only("no gradient through If (refused naming the node); the training build inlines it")
def test_weight_read_two_subgraph_levels_down_is_trained() -> None:
    """It was left out of the default weights (only the first subgraph level was walked), and
    refused when named ("does not depend on weight 'W'")."""
    kwargs = {"max_iter": 3, "batch_size": len(X), "shuffle": False, "learning_rate": 0.05}
    for weights in (None, ["W"]):
        trainer = OrtGradientForwardBackwardOptimizer(
            _nested_weight_model(), weights_to_train=weights, **kwargs
        )
        trainer.fit(X, Y)
        # numpy SGD on mean((X W - y)^2)
        W = W0.astype(np.float64)
        for _ in range(3):
            W = W - 0.05 * X.T.astype(np.float64) @ (2 * (X @ W - Y) / len(X))
        np.testing.assert_allclose(trainer.get_state()["W"], W, rtol=1e-5, atol=1e-6)
