"""The static-shape rewrite of gradient graphs: same values as numpy, no run-time shape kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backend_support import training_build_only
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


def _fixed_batch_step(
    loss_model: onnx.ModelProto, names: list[str], batch: int, rate: float
) -> onnx.ModelProto:
    """The CPU fused step of ``loss_model`` training ``names`` at a fixed batch, constant SGD."""
    from ort_train_core._backends import default_backend
    from ort_train_core.graph import initializers_to_inputs, set_batch_dimension
    from ort_train_core.learning_rate import make_learning_rate

    model = initializers_to_inputs(loss_model, names)
    data = [i.name for i in model.graph.input if i.name not in names]
    model = set_batch_dimension(model, data, batch)
    graph, _ = default_backend().fused_step(
        model, "loss", names, make_learning_rate(rate), parse_device("cpu")
    )
    return graph


def test_fused_step_graph_has_no_shape_arithmetic(linear_loss_model):
    from ort_train_core.graph import default_weights_to_train

    names = default_weights_to_train(linear_loss_model, "loss")
    graph = _fixed_batch_step(linear_loss_model, names, 16, 0.01)
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


def _broadcasting_loss(batch: int | str) -> onnx.ModelProto:
    """loss = sum((((X + b) * c - d) * s)^2) over X [batch, 3, 4], with b [4], c [3, 1],
    d [1, 3, 4] and s [] as inputs: every broadcast pattern the gradient sums back."""
    nodes = [
        helper.make_node("Add", ["X", "b"], ["y1"]),
        helper.make_node("Mul", ["y1", "c"], ["y2"]),
        helper.make_node("Sub", ["y2", "d"], ["y3"]),
        helper.make_node("Mul", ["y3", "s"], ["y4"]),
        helper.make_node("Mul", ["y4", "y4"], ["y5"]),
        helper.make_node("ReduceSum", ["y5"], ["loss"], keepdims=0),
    ]
    shapes = {"X": [batch, 3, 4], "b": [4], "c": [3, 1], "d": [1, 3, 4], "s": []}
    graph = helper.make_graph(
        nodes,
        "broadcasting",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@training_build_only("checks the training build's BroadcastGradientArgs folding")
@pytest.mark.parametrize("batch", [5, 1, "N"])
def test_broadcast_gradients_keep_numpy_values(batch):
    """Every broadcast pattern at a fixed batch (of 5, or of 1, where the broadcast shape has
    leading axes of size 1) and at a free one: after the folds, the gradients are numpy's."""
    from ort_train_core._ort_training import OrtTrainingBackend

    names = ["b", "c", "d", "s"]
    grads = OrtTrainingBackend().gradient_graph(_broadcasting_loss(batch), "loss", names)
    if batch != "N":
        assert "BroadcastGradientArgs" not in [n.op_type for n in grads.graph.node]
    rng = np.random.default_rng(2)
    rows = 5 if batch == "N" else batch
    feeds = {
        "X": rng.normal(size=(rows, 3, 4)),
        "b": rng.normal(size=4),
        "c": rng.normal(size=(3, 1)),
        "d": rng.normal(size=(1, 3, 4)),
        "s": np.array(rng.normal()),
    }
    sess = make_session(grads, parse_device("cpu"))
    wanted = [f"{n}_grad" for n in names]
    got = sess.run(wanted, {k: v.astype(np.float32) for k, v in feeds.items()}, None)
    X, b, c, d, s = (feeds[k] for k in ("X", "b", "c", "d", "s"))
    y1 = X + b
    y3 = y1 * c - d
    g3 = 2 * y3 * s * s  # d loss / d y3
    expected = {
        "b": (g3 * c).sum(axis=(0, 1)),
        "c": (g3 * y1).sum(axis=(0, 2))[:, None],
        "d": -g3.sum(axis=0, keepdims=True),
        "s": np.array((2 * y3 * y3 * s).sum()),
    }
    for name, value in zip(names, got, strict=True):
        assert np.shape(value) == expected[name].shape, name
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


@training_build_only("BroadcastGradientArgs is the training build's operator")
def test_fused_hinge_step_loses_its_broadcast_arithmetic(monkeypatch):
    """A linear model with scikit-learn's hinge loss, sample weights and an l2 penalty at a
    fixed batch: the builder writes BroadcastGradientArgs (although every shape is known), the
    fold removes them and the no-op chains after them, and the step computes what the unfolded
    one does."""
    from core_models import build_linear

    import ort_train_core
    from ort_train_core import _ort_training

    loss_model = ort_train_core.add_loss_output(
        build_linear(), "hinge", weight_name="weight", penalty={"coef": {"l2": 0.01}}
    )
    names = ["coef", "intercept"]

    def step() -> onnx.ModelProto:
        return _fixed_batch_step(loss_model, names, 8, 0.1)

    folded = step()
    with monkeypatch.context() as m:
        m.setattr(_ort_training, "fold_broadcast_gradients", lambda model: model)
        unfolded = step()
    count = [n.op_type for n in unfolded.graph.node].count
    assert count("BroadcastGradientArgs") > 0, "the builder no longer writes them: this test checks nothing"
    assert "BroadcastGradientArgs" not in [n.op_type for n in folded.graph.node]
    kernels = [n.op_type for n in folded.graph.node if n.op_type not in ("Identity", "Constant")]
    assert len(kernels) < len([n for n in unfolded.graph.node if n.op_type not in ("Identity", "Constant")])
    rng = np.random.default_rng(3)
    feeds = {
        "X": rng.normal(size=(8, 3)).astype(np.float32),
        "label": rng.integers(0, 2, size=8).astype(np.int64),
        "weight": rng.uniform(0.5, 2, size=8).astype(np.float32),
        "coef": rng.normal(size=(3, 1)).astype(np.float32),
        "intercept": rng.normal(size=1).astype(np.float32),
    }
    results = []
    for graph in (folded, unfolded):
        sess = make_session(graph, parse_device("cpu"))
        names_in = {i.name for i in graph.graph.input}
        inputs = {k: v for k, v in feeds.items() if k in names_in}
        inputs.update(
            {i.name: np.array(0.1, dtype=np.float32) for i in graph.graph.input if i.name not in feeds}
        )
        results.append(sess.run([o.name for o in graph.graph.output], inputs, None))
    for got, expected in zip(*results, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def _broadcast_grad_model(shape_a: list[int], shape_b: list[int], known_g: bool = True) -> onnx.ModelProto:
    """The builder's form of the gradient of ``a op b`` with run-time axes: the gradient G of
    the broadcast shape summed over BroadcastGradientArgs' axes, reshaped to each operand
    (``known_g=False``: G's shape is not declared, as after a com.microsoft gradient op)."""
    full = list(np.broadcast_shapes(tuple(shape_a), tuple(shape_b)))
    const = lambda name, v: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=numpy_helper.from_array(np.array(v, dtype=np.int64))
    )
    nodes = [
        const("shape_a", shape_a),
        const("shape_b", shape_b),
        helper.make_node(
            "BroadcastGradientArgs", ["shape_a", "shape_b"], ["axes_a", "axes_b"], domain="com.microsoft"
        ),
    ]
    for k in ("a", "b"):
        nodes.append(
            helper.make_node("ReduceSum", ["G", f"axes_{k}"], [f"s_{k}"], keepdims=1, noop_with_empty_axes=1)
        )
        nodes.append(helper.make_node("Reshape", [f"s_{k}", f"shape_{k}"], [f"g_{k}"]))
    graph = helper.make_graph(
        nodes,
        "broadcast_grad",
        [helper.make_tensor_value_info("G", TensorProto.FLOAT, full if known_g else None)],
        [
            helper.make_tensor_value_info("g_a", TensorProto.FLOAT, shape_a),
            helper.make_tensor_value_info("g_b", TensorProto.FLOAT, shape_b),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ([5, 3, 4], [3, 1]),
        ([5, 3, 4], [4]),
        ([5, 3, 4], []),
        ([1, 4], [5, 1]),
        ([5, 1], [1, 1]),
        ([2, 3], [2, 3]),
    ],
)
@pytest.mark.parametrize("known_g", [True, False])
def test_folded_broadcast_gradient_args_sum_as_numpy(shape_a, shape_b, known_g):
    """BroadcastGradientArgs with constant shapes becomes constant axes (no com.microsoft node
    left), and each operand's gradient is numpy's sum of G back to that operand's shape, whether
    or not G's shape is known."""
    from ort_train_core._ort_training import fold_broadcast_gradients

    model = _broadcast_grad_model(shape_a, shape_b, known_g)
    folded = fold_broadcast_gradients(model)
    assert "BroadcastGradientArgs" not in [n.op_type for n in folded.graph.node]
    full = np.broadcast_shapes(tuple(shape_a), tuple(shape_b))
    G = np.random.default_rng(4).normal(size=full).astype(np.float32)
    sess = make_session(folded, parse_device("cpu"))
    g_a, g_b = sess.run(["g_a", "g_b"], {"G": G}, None)
    for got, shape in ((g_a, shape_a), (g_b, shape_b)):
        lead = len(full) - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(shape) if d == 1 and full[lead + i] != 1
        )
        expected = G.astype(np.float64).sum(axis=axes).reshape(shape)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
