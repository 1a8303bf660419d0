"""Forms of the ``onnx`` backend's gradients chosen for onnxruntime's speed (issue 27 item 6;
benchmarks/bench_backends.py), each still equal to a numpy reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core.autodiff.backend import OnnxBackend


def test_relu_gradient_is_a_product_by_its_mask_not_a_where() -> None:
    # onnxruntime's Where(Y > 0, dY, 0) against a scalar zero took 7x the time of dY * Cast(Y > 0)
    # (1.19 and 1.32, 128x512): 13 % of a 784-512-512-10 MLP's step
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 4)).astype(np.float32)
    X[0] = 0.0  # a pre-activation exactly 0: gradient 0 there, as torch
    W = rng.standard_normal((4, 5)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["Z"]),
        helper.make_node("Relu", ["Z"], ["Y"]),
        helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "relu",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6, 4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(W, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    grad = OnnxBackend().gradient_graph(model, "loss", ["W"])
    assert "Where" not in [n.op_type for n in grad.graph.node]
    sess = ort.InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["W_grad"], {"X": X})
    expected = X.T.astype(np.float64) @ (X.astype(np.float64) @ W > 0)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def _sgd_step(
    first: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], R: np.ndarray
) -> tuple[onnx.ModelProto, Any]:
    """The onnx backend's fused SGD step (lr 0.1) of ``loss = sum(first's output * R)``,
    training the input ``W``."""
    from ort_train_core._runtime import parse_device
    from ort_train_core.learning_rate import LearningRateSGD

    nodes = [
        first,
        helper.make_node("Mul", [first.output[0], "R"], ["P"]),
        helper.make_node("ReduceSum", ["P"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "step",
        inputs,
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(R, "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lr = LearningRateSGD(eta0=0.1, learning_rate="constant")
    return OnnxBackend().fused_step(model, "loss", ["W"], lr, parse_device("cpu"))


def test_embedding_sgd_update_scatters_the_gathered_rows_into_the_table() -> None:
    # W - lr * ScatterND(zeros, ids, dY) read and wrote BERT's 30522 x 256 table four times a
    # step (zeros, scatter, Mul, Sub: 20 ms of 550 on one thread); the fused step writes
    # ScatterND(W, ids, -lr * dY) instead. Repeated ids add up, as torch's dense embedding grad
    rng = np.random.default_rng(0)
    W = rng.standard_normal((50, 8)).astype(np.float32)
    ids = np.array([[3, 7, 3], [49, 0, 3]], dtype=np.int64)  # 3 three times
    R = rng.standard_normal((2, 3, 8)).astype(np.float32)
    step, sig = _sgd_step(
        helper.make_node("Gather", ["W", "ids"], ["E"]),
        [
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [50, 8]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3]),
        ],
        R,
    )
    ops = [n.op_type for n in step.graph.node]
    assert "ConstantOfShape" not in ops
    assert "Sub" not in ops
    assert any(n.op_type == "ScatterND" and n.input[0] == "W" for n in step.graph.node)
    sess = ort.InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"W": W, "ids": ids, sig.scalars[0]: np.array(0.1, dtype=np.float32)}
    (got,) = sess.run([sig.new_weights[0]], feeds)
    dense = np.zeros((50, 8))
    np.add.at(dense, ids.ravel(), R.reshape(-1, 8).astype(np.float64))
    np.testing.assert_allclose(got, W - 0.1 * dense, rtol=1e-6, atol=1e-6)


def test_erf_gradient_puts_its_factor_in_the_exponent() -> None:
    # dY * exp(ln(2/sqrt(pi)) - X^2): four passes over X, not five (Neg and the factor's Mul
    # become one Sub); BERT-mini's exported GELU runs it on 16x128x1024 per layer
    torch = pytest.importorskip("torch")

    rng = np.random.default_rng(0)
    X = rng.uniform(-3.0, 3.0, (7, 5)).astype(np.float32)
    R = rng.standard_normal((7, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Erf", ["X"], ["E"]),
        helper.make_node("Mul", ["E", "R"], ["P"]),
        helper.make_node("ReduceSum", ["P"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "erf",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [7, 5])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(R, "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    grad = OnnxBackend().gradient_graph(model, "loss", ["X"])
    ops = [n.op_type for n in grad.graph.node]
    assert "Neg" not in ops
    assert ops.count("Mul") == 4
    sess = ort.InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["X_grad"], {"X": X})
    x = torch.tensor(X, dtype=torch.float64, requires_grad=True)
    (torch.erf(x) * torch.tensor(R, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=2e-6, atol=1e-7)
