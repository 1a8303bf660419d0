"""In-place changes between an OnnxModule's forward and its backward: onnxruntime's backward
reads the inputs, weights and outputs it was given (they cross by DLPack, without copies), so
a change in place gave wrong gradients silently. torch's own operators refuse it through the
version counters of what they saved; OnnxModule's forward saves its tensors the same way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_train_torch import OnnxModule

INPLACE = "modified by an inplace operation"


def _sigmoid_layer() -> tuple[OnnxModule, torch.nn.Module]:
    """Y = Sigmoid(X @ W) as an OnnxModule and in torch, with the same W."""
    W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Z"]), helper.make_node("Sigmoid", ["Z"], ["Y"])],
        "sigmoid",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8

    class Reference(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = torch.nn.Parameter(torch.tensor(W))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(x @ self.W)

    return OnnxModule(model), Reference()


def test_an_output_changed_in_place_before_backward_is_refused_as_torch_does() -> None:
    x = torch.randn(8, 4)
    for module in _sigmoid_layer():
        y = module(x)
        y.mul_(2.0)
        with pytest.raises(RuntimeError, match=INPLACE):
            y.sum().backward()


def test_an_input_changed_in_place_before_backward_is_refused_as_torch_does() -> None:
    """An in-place residual (h += layer(h)) over a layer's input, as torch refuses it."""
    for module in _sigmoid_layer():
        lin = torch.nn.Linear(4, 4)
        h = lin(torch.randn(8, 4))
        y = module(h)
        h += y.sum(dim=1, keepdim=True)
        with pytest.raises(RuntimeError, match=INPLACE):
            h.sum().backward()


def test_changes_after_backward_and_out_of_place_ones_are_fine() -> None:
    """What torch allows stays allowed, with torch's gradients."""
    x = torch.randn(8, 4)
    ours, reference = _sigmoid_layer()
    for module in (ours, reference):
        y = module(x)
        (2.0 * y).sum().backward()
        y.mul_(2.0)  # after the backward
    torch.testing.assert_close(ours.W.grad, reference.W.grad, rtol=1e-5, atol=1e-6)
