"""The dynamo exporter's training-mode Dropout (issue 26, item 15): it writes Dropout with its
output only, and both gradient builders failed with onnxruntime's bare "was false." (the
gradient reads the optional mask output). The mask output is added before differentiation.

References: torch.optim.SGD on the same network with the Dropout ratio set to 1e-9 (a dropout
that keeps everything but is not removed as a ratio of 0 is, so the steps are deterministic),
and numpy's gradient with the mask the forward drew (ratio 0.5), read back from the dropped
values.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_train_core as otc

LR = 0.1
STEPS = 3


def _net(torch: Any) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)
    )


def _dynamo_export(torch: Any, ratio: float) -> onnx.ModelProto:
    """The dynamo export in training mode, its Dropout's ratio then set to ``ratio``."""
    net = _net(torch).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            net, (torch.zeros(6, 4),), dynamo=True, training=torch.onnx.TrainingMode.TRAINING
        )
    model = program.model_proto
    (dropout,) = [n for n in model.graph.node if n.op_type == "Dropout"]
    assert len(dropout.output) == 1  # the form this file is about
    for init in model.graph.initializer:
        if init.name == dropout.input[1]:
            init.CopyFrom(numpy_helper.from_array(np.array(ratio, np.float32), init.name))
    return model


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 1)).astype(np.float32)


@pytest.mark.parametrize("route", ["full", "partial", "OnnxModule"])
def test_dynamo_dropout_trains_as_torch(route: str) -> None:
    """Three SGD steps on the mean squared error end at torch's weights on every route (each
    failed with "was false." before)."""
    torch = pytest.importorskip("torch")
    X, y = _data()
    model = _dynamo_export(torch, ratio=1e-9)
    net = _net(torch)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net[3](net[1](net[0](torch.tensor(X)))), torch.tensor(y)).backward()
        opt.step()
    expected = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    weights = list(expected)
    kwargs = {"max_iter": STEPS, "batch_size": len(X), "learning_rate": LR, "shuffle": False}
    if route == "full":
        state = otc.OrtGradientOptimizer(otc.add_loss_output(model), weights, **kwargs).fit(X, y).get_state()
    elif route == "partial":
        state = otc.OrtGradientForwardBackwardOptimizer(model, weights, **kwargs).fit(X, y).get_state()
    else:
        from ort_train_torch import OnnxModule

        module = OnnxModule(model, weights_to_train=weights)
        module_opt = torch.optim.SGD(module.parameters(), lr=LR)
        for _ in range(STEPS):
            module_opt.zero_grad()
            torch.nn.functional.mse_loss(module(torch.tensor(X)), torch.tensor(y)).backward()
            module_opt.step()
        state = {name: getattr(module, attr).detach().numpy() for attr, name in module.onnx_names.items()}
    for name in weights:
        np.testing.assert_allclose(state[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def _dropout_graph() -> onnx.ModelProto:
    """Y = Dropout(Relu(X @ W1), 0.5, training) @ W2 with one Dropout output, as dynamo writes
    it; the dropped values D are a second output, to read the mask back."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal((8, 1)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
        numpy_helper.from_array(np.array(True), "training"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Dropout", ["r", "ratio", "training"], ["D"], name="drop"),
        helper.make_node("MatMul", ["D", "W2"], ["Y"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", k]) for n, k in (("Y", 1), ("D", 8))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_dropout_gradient_uses_the_forward_mask() -> None:
    """With ratio 0.5 the backward's gradient of W1 is the one of the mask its forward drew:
    numpy's X^T ((G W2^T) * mask / (1 - 0.5) * (X W1 > 0))."""
    model = _dropout_graph()
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    X = np.random.default_rng(2).standard_normal((20, 4)).astype(np.float32)
    G = np.random.default_rng(3).standard_normal((20, 1)).astype(np.float32)
    fb = otc.OrtGradientForwardBackward(model, weights_to_train=["W1", "W2"])
    _, D = (v.numpy() for v in fb.forward([X]))
    grad_w1, grad_w2 = (g.numpy() for g in fb.backward([G, np.zeros_like(D)]))
    h = X @ values["W1"]
    kept = D != 0
    assert 0 < kept[h > 0].mean() < 1  # some values dropped, some kept
    np.testing.assert_allclose(D[kept], 2.0 * h[kept], rtol=1e-6)
    upstream = (G @ values["W2"].T) * kept * 2.0 * (h > 0)
    np.testing.assert_allclose(grad_w1, X.T @ upstream, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad_w2, D.T @ G, rtol=1e-5, atol=1e-6)
