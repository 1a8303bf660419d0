"""OnnxModule built from a graph whose trainable initializers hold NaN or inf warns, naming
them and the fix (torch lets a module be built and re-initialised afterwards, so not an error);
after load_state_dict with finite values it computes what torch computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_train_torch import OnnxModule


def _linear(weight: np.ndarray) -> object:
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W", "b"], ["Y"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.zeros(2, np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_nan_initializers_warn_with_their_names() -> None:
    weight = np.ones((2, 3), dtype=np.float32)
    weight[0, 1] = np.nan
    weight[1, 2] = np.inf
    with pytest.warns(RuntimeWarning, match=r"'W' \(2 of 6 values\).*load_state_dict"):
        module = OnnxModule(_linear(weight))
    finite = torch.nn.Linear(3, 2)
    module.load_state_dict({"W": finite.weight.detach().clone(), "b": finite.bias.detach().clone()})
    x = torch.randn(4, 3)
    torch.testing.assert_close(module(x), finite(x))
