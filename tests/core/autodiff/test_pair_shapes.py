"""The onnx backend's forward/backward pair over a free batch dimension: graphs and sessions per
input shapes fed, at most ``MAX_SHAPE_SETS`` kept (least recently fed dropped), every gradient
equal to numpy's whichever shape set is built, dropped or built again."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core._backends import get_backend
from ort_train_core._runtime import Device, ort_capi
from ort_train_core.autodiff import backend as onnx_backend

W = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)


def _linear():  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _gradients(runner, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 3)).astype(np.float32)
    g = rng.standard_normal((rows, 2)).astype(np.float32)
    dev = Device("cpu").ort_device
    values = [ort_capi.OrtValue.ortvalue_from_numpy(a, dev) for a in (x, W.copy(), g)]
    outputs, grads, state = runner.vector([]), runner.vector([]), runner.new_state()
    runner.run_forward(runner.vector(values[:2]), outputs, state)
    runner.run_backward(runner.vector(values[2:]), grads, state)
    return x, g, grads[0].numpy(), grads[1].numpy()


def test_a_pair_per_shape_set_at_most_max_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_backend, "MAX_SHAPE_SETS", 2)
    runner = get_backend("onnx").forward_backward(_linear(), ["W"], ["X"], Device("cpu"))
    assert runner.sessions == []  # a free batch: nothing built before the first forward
    for rows in (2, 3, 4, 2):  # the last one was dropped (2 kept): built again
        x, g, dx, dw = _gradients(runner, rows)
        np.testing.assert_allclose(dx, g @ W.T, rtol=1e-5, atol=1e-6)  # dX = dY W^T
        np.testing.assert_allclose(dw, x.T @ g, rtol=1e-5, atol=1e-6)  # dW = X^T dY
        assert len(runner.sessions) <= 4  # two shape sets, a forward and a backward each
    assert sorted(shapes[0][0] for shapes in runner._specs) == [2, 4]
