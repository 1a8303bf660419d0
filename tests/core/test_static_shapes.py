"""The static-shape rewrite of gradient graphs: same values as numpy, no run-time shape kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core._binding import make_session
from ort_train_core._ort_training import cpu_relu_grad, cpu_row_sums, fold_static_shapes
from ort_train_core._runtime import parse_device


def _model(batch: int | str) -> onnx.ModelProto:
    """Shape (sliced), Size and both Scale directions over X of shape [batch, 3, 4]."""
    nodes = [
        helper.make_node("Shape", ["X"], ["shape_all"]),
        helper.make_node("Shape", ["X"], ["shape_tail"], start=1),
        helper.make_node("Shape", ["X"], ["shape_mid"], start=-2, end=-1),
        helper.make_node("Size", ["X"], ["size"]),
        helper.make_node("Scale", ["X", "size"], ["down"], domain="com.microsoft", scale_down=1),
        helper.make_node("Scale", ["X", "two"], ["up"], domain="com.microsoft"),
    ]
    outputs = [
        helper.make_tensor_value_info("shape_all", TensorProto.INT64, [3]),
        helper.make_tensor_value_info("shape_tail", TensorProto.INT64, [2]),
        helper.make_tensor_value_info("shape_mid", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("size", TensorProto.INT64, []),
        helper.make_tensor_value_info("down", TensorProto.FLOAT, [batch, 3, 4]),
        helper.make_tensor_value_info("up", TensorProto.FLOAT, [batch, 3, 4]),
    ]
    graph = helper.make_graph(
        nodes,
        "shapes",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 3, 4])],
        outputs,
        [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, X: np.ndarray) -> list[np.ndarray]:
    sess = make_session(model, parse_device("cpu"))
    return [np.asarray(v) for v in sess.run([o.name for o in model.graph.output], {"X": X}, None)]


@pytest.mark.parametrize("batch", [5, "N"])
def test_folded_graph_computes_numpy_values(batch):
    X = np.random.default_rng(0).normal(size=(5, 3, 4)).astype(np.float32)
    folded = fold_static_shapes(_model(batch))
    shape_all, shape_tail, shape_mid, size, down, up = _run(folded, X)
    np.testing.assert_array_equal(shape_all, [5, 3, 4])
    np.testing.assert_array_equal(shape_tail, [3, 4])
    np.testing.assert_array_equal(shape_mid, [3])
    assert int(size) == 60
    np.testing.assert_allclose(down, X / 60, rtol=1e-6)
    np.testing.assert_allclose(up, X * 2, rtol=1e-6)
    ops = [n.op_type for n in folded.graph.node]
    assert "Scale" not in ops, "Scale must become standard ops"
    if batch == 5:
        assert "Shape" not in ops, ops
        assert "Size" not in ops, ops
    else:  # a dynamic batch dimension keeps the run-time shape of X
        assert ops.count("Shape") == 3
        assert ops.count("Size") == 1


def test_fused_step_graph_has_no_shape_arithmetic(linear_loss_model):
    from ort_train_core._gradient import default_backend
    from ort_train_core.graph import default_weights_to_train, initializers_to_inputs, set_batch_dimension
    from ort_train_core.learning_rate import make_learning_rate

    names = default_weights_to_train(linear_loss_model, "loss")
    model = initializers_to_inputs(linear_loss_model, names)
    data = [i.name for i in model.graph.input if i.name not in names]
    model = set_batch_dimension(model, data, 16)
    graph, _ = default_backend().fused_step(
        model, "loss", names, make_learning_rate(0.01), parse_device("cpu")
    )
    ops = {(n.domain, n.op_type) for n in graph.graph.node}
    assert not ops & {("", "Shape"), ("", "Size"), ("com.microsoft", "Scale")}, sorted(ops)


def _row_sum_model(batch: int | str, keepdims: int, cols: int) -> onnx.ModelProto:
    """ReduceSum over the first axis of X [batch, cols] (axes as an input, as the gradient
    builder writes them), and the same sum of X * 2 (a tensor the graph does not take)."""
    nodes = [
        helper.make_node("ReduceSum", ["X", "axes"], ["S"], keepdims=keepdims),
        helper.make_node("Mul", ["X", "two"], ["X2"]),
        helper.make_node("ReduceSum", ["X2", "axes"], ["S2"], keepdims=keepdims),
    ]
    out_shape = [1, cols] if keepdims else [cols]
    graph = helper.make_graph(
        nodes,
        "rowsums",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, cols])],
        [
            helper.make_tensor_value_info("S", TensorProto.FLOAT, out_shape),
            helper.make_tensor_value_info("S2", TensorProto.FLOAT, out_shape),
        ],
        [
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
            numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
        ],
        value_info=[helper.make_tensor_value_info("X2", TensorProto.FLOAT, [batch, cols])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("batch", [6, "N"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_row_sums_become_matmuls_with_numpy_sums(batch, keepdims):
    """Fixed batch: constant ones; free batch: ones sized at run time from the input's shape,
    so the same graph answers every batch size."""
    rewritten = cpu_row_sums(_row_sum_model(batch, keepdims, 4), TensorProto.FLOAT)
    assert [n.op_type for n in rewritten.graph.node].count("ReduceSum") == 0
    rng = np.random.default_rng(1)
    for rows in [6] if batch == 6 else [1, 6, 1000]:
        X = rng.normal(size=(rows, 4)).astype(np.float32)
        S, S2 = _run(rewritten, X)
        expected = X.astype(np.float64).sum(axis=0, keepdims=bool(keepdims))
        np.testing.assert_allclose(S, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(S2, 2 * expected, rtol=1e-5, atol=1e-5)


def test_row_sums_left_alone_without_a_known_shape_or_for_one_column():
    """One column sums contiguously (ReduceSum is faster); an unnamed free batch has no input
    to read its size from."""
    for model in (_row_sum_model("N", 0, 1), _row_sum_model("", 0, 4)):
        assert cpu_row_sums(model, TensorProto.FLOAT) is model


@pytest.mark.parametrize(
    ("elem_type", "dtype"), [(TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64)]
)
def test_relu_gradient_rewrite_masks_exactly_where_numpy_does(elem_type, dtype):
    """ReluGrad(dY, X) is dY where X > 0, else 0: for X of both signs, exact zeros, +-0.0,
    subnormal positives (mask 1) and large values, whatever the rewrite's arithmetic."""
    graph = helper.make_graph(
        [helper.make_node("ReluGrad", ["dY", "X"], ["dX"], domain="com.microsoft")],
        "relugrad",
        [helper.make_tensor_value_info(n, elem_type, ["N", 5]) for n in ("dY", "X")],
        [helper.make_tensor_value_info("dX", elem_type, ["N", 5])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    rewritten = cpu_relu_grad(model, elem_type)
    assert "ReluGrad" not in [n.op_type for n in rewritten.graph.node]
    tiny = np.finfo(dtype).smallest_subnormal
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 5)).astype(dtype)
    X[0] = [0.0, -0.0, tiny, -tiny, np.finfo(dtype).max]
    X[1] = [1.0, 1.5, 0.5, -1.0, -np.finfo(dtype).max]
    dY = rng.normal(size=(40, 5)).astype(dtype)
    session = make_session(rewritten, parse_device("cpu"))
    (dX,) = session.run(["dX"], {"dY": dY, "X": X}, None)
    np.testing.assert_array_equal(dX, np.where(X > 0, dY, 0).astype(dtype))
