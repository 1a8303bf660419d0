"""The static-shape rewrite of gradient graphs: same values as numpy, no run-time shape kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core._binding import make_session
from ort_train_core._gradient import fold_static_shapes
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
    from ort_train_core._gradient import build_fused_step_graph
    from ort_train_core.graph import default_weights_to_train, initializers_to_inputs, set_batch_dimension
    from ort_train_core.learning_rate import make_learning_rate

    names = default_weights_to_train(linear_loss_model, "loss")
    model = initializers_to_inputs(linear_loss_model, names)
    data = [i.name for i in model.graph.input if i.name not in names]
    model = set_batch_dimension(model, data, 16)
    graph, _ = build_fused_step_graph(model, "loss", names, make_learning_rate(0.01))
    ops = {(n.domain, n.op_type) for n in graph.graph.node}
    assert not ops & {("", "Shape"), ("", "Size"), ("com.microsoft", "Scale")}, sorted(ops)
