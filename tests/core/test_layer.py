"""An ONNX graph as a layer (OrtGradientForwardBackward): gradients of inputs and weights against
torch autograd of the same function, inference against numpy; and the cached IOBinding."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
import reference as ref
from core_models import IR_VERSION, OPSET, build_linear, build_mlp, initializers
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import OrtGradientForwardBackward
from ort_train_core._binding import CachedBinding, make_session
from ort_train_core._runtime import ort_capi, parse_device

TOL = 1e-5
BATCH_SIZES = (5, 3, 8)  # the batch dimension changes between calls


def build_two_in_two_out(seed: int = 0) -> onnx.ModelProto:
    """Y1 = X @ A + Z @ B + c, Y2 = sigmoid(Y1) @ D: two inputs, two outputs, Y2 depends on Y1."""
    rng = np.random.default_rng(seed)
    values = {
        "A": rng.standard_normal((3, 4)).astype(np.float32),
        "B": rng.standard_normal((2, 4)).astype(np.float32),
        "c": rng.standard_normal(4).astype(np.float32),
        "D": rng.standard_normal((4, 2)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["X", "A"], ["xa"]),
        helper.make_node("MatMul", ["Z", "B"], ["zb"]),
        helper.make_node("Add", ["xa", "zb"], ["s"]),
        helper.make_node("Add", ["s", "c"], ["Y1"]),
        helper.make_node("Sigmoid", ["Y1"], ["g"]),
        helper.make_node("MatMul", ["g", "D"], ["Y2"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_in_two_out",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("Y1", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("Y2", TensorProto.FLOAT, ["N", 2]),
        ],
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _torch_linear(t: Any, inputs: list[Any], w: dict[str, Any]) -> list[Any]:
    return [inputs[0] @ w["coef"] + w["intercept"]]


def _torch_mlp(t: Any, inputs: list[Any], w: dict[str, Any]) -> list[Any]:
    return [t.relu(inputs[0] @ w["W1"] + w["b1"]) @ w["W2"] + w["b2"]]


def _torch_two(t: Any, inputs: list[Any], w: dict[str, Any]) -> list[Any]:
    y1 = inputs[0] @ w["A"] + inputs[1] @ w["B"] + w["c"]
    return [y1, t.sigmoid(y1) @ w["D"]]


def _numpy_two(w: dict[str, np.ndarray], inputs: list[np.ndarray]) -> list[np.ndarray]:
    X, Z = (np.asarray(a, dtype=np.float64) for a in inputs)
    y1 = X @ w["A"] + Z @ w["B"] + w["c"]
    return [y1, ref.head_forward("sigmoid", y1) @ w["D"]]


# name -> (model, weights_to_train in a non-alphabetical order, input widths, torch fn, numpy fn)
CASES: dict[str, tuple[Callable[[], onnx.ModelProto], list[str], list[int], Callable, Callable]] = {
    "linear": (
        lambda: build_linear(3, 2),
        ["intercept", "coef"],
        [3],
        _torch_linear,
        lambda w, inputs: [ref.forward("linear", w, np.asarray(inputs[0], dtype=np.float64))[0]],
    ),
    "mlp": (
        lambda: build_mlp(4, 6, 2),
        ["W2", "b1", "W1", "b2"],
        [4],
        _torch_mlp,
        lambda w, inputs: [ref.forward("mlp", w, np.asarray(inputs[0], dtype=np.float64))[0]],
    ),
    "two_inputs_two_outputs": (build_two_in_two_out, ["D", "c", "A", "B"], [3, 2], _torch_two, _numpy_two),
}


def _torch_gradients(
    fn: Callable, inputs: list[np.ndarray], weights: dict[str, np.ndarray], grad_outputs: list[np.ndarray]
) -> tuple[list[np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Outputs, the gradient of X (inputs[0] only) and of every weight, in float64."""
    torch = pytest.importorskip("torch")
    tin = [torch.tensor(a, dtype=torch.float64, requires_grad=(i == 0)) for i, a in enumerate(inputs)]
    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    outputs = fn(torch, tin, tw)
    torch.autograd.backward(outputs, [torch.tensor(g, dtype=torch.float64) for g in grad_outputs])
    return (
        [o.detach().numpy() for o in outputs],
        {k: v.grad.numpy() for k, v in tw.items()},
        tin[0].grad.numpy(),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_torch_autograd(case: str) -> None:
    pytest.importorskip("torch")
    make_model, order, widths, torch_fn, numpy_fn = CASES[case]
    model = make_model()
    start = initializers(model)
    layer = OrtGradientForwardBackward(model, weights_to_train=order, input_names_requiring_grad=["X"])
    assert layer.weights_to_train == order
    for name, value in layer.get_weights().items():
        np.testing.assert_array_equal(value, start[name])
    rng = np.random.default_rng(0)
    for batch in BATCH_SIZES:
        inputs = [rng.standard_normal((batch, d)).astype(np.float32) for d in widths]
        outputs = layer.forward(inputs, training=True)
        assert len(outputs) == len(layer.output_names)
        grad_outputs = [rng.standard_normal(tuple(o.shape())).astype(np.float32) for o in outputs]
        grads = layer.backward(grad_outputs)
        expected_out, expected_w, expected_x = _torch_gradients(torch_fn, inputs, start, grad_outputs)
        # read after the backward: the outputs forward returned still hold their values
        for got, want in zip(outputs, expected_out):
            np.testing.assert_allclose(got.numpy(), want, rtol=TOL, atol=TOL)
        # the input gradient first, then the weights in the order given
        assert len(grads) == 1 + len(order)
        np.testing.assert_allclose(grads[0].numpy(), expected_x, rtol=TOL, atol=TOL, err_msg="X")
        for name, got in zip(order, grads[1:]):
            np.testing.assert_allclose(got.numpy(), expected_w[name], rtol=TOL, atol=TOL, err_msg=name)
        # inference: numpy's forward
        inferred = layer.forward(inputs, training=False)
        w64 = {k: v.astype(np.float64) for k, v in start.items()}
        for got, want in zip(inferred, numpy_fn(w64, inputs)):
            np.testing.assert_allclose(got.numpy(), want, rtol=TOL, atol=TOL)


def test_weights_passed_to_forward_and_set_weights() -> None:
    """Weights given to forward (a torch module's parameters) or set with set_weights are used."""
    pytest.importorskip("torch")
    order = ["W2", "b1", "W1", "b2"]
    model = build_mlp(4, 6, 2)
    start = initializers(model)
    layer = OrtGradientForwardBackward(model, weights_to_train=order, input_names_requiring_grad=["X"])
    rng = np.random.default_rng(1)
    other = {k: (v + 0.3 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in start.items()}
    X = rng.standard_normal((7, 4)).astype(np.float32)
    g = rng.standard_normal((7, 2)).astype(np.float32)
    out = layer.forward([X], weights=[other[w] for w in order])
    grads = layer.backward([g])
    exp_out, exp_w, exp_x = _torch_gradients(_torch_mlp, [X], other, [g])
    np.testing.assert_allclose(out[0].numpy(), exp_out[0], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(grads[0].numpy(), exp_x, rtol=TOL, atol=TOL)
    for name, got in zip(order, grads[1:]):
        np.testing.assert_allclose(got.numpy(), exp_w[name], rtol=TOL, atol=TOL, err_msg=name)
    # the owned weights were not touched
    for name, value in layer.get_weights().items():
        np.testing.assert_array_equal(value, start[name])
    layer.set_weights(other)
    inferred = layer.forward([X], training=False)[0].numpy()
    w64 = {k: v.astype(np.float64) for k, v in other.items()}
    np.testing.assert_allclose(inferred, ref.forward("mlp", w64, X.astype(np.float64))[0], rtol=TOL, atol=TOL)
    with pytest.raises(ValueError, match="unknown weight"):
        layer.set_weights({"nope": np.zeros(1)})


def test_zero_gradient_for_an_output_given_as_none() -> None:
    pytest.importorskip("torch")
    make_model, order, widths, torch_fn, _ = CASES["two_inputs_two_outputs"]
    model = make_model()
    layer = OrtGradientForwardBackward(model, weights_to_train=order, input_names_requiring_grad=["X"])
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((4, d)).astype(np.float32) for d in widths]
    layer.forward(inputs)
    g2 = rng.standard_normal((4, 2)).astype(np.float32)
    grads = layer.backward([None, g2])
    _, exp_w, exp_x = _torch_gradients(torch_fn, inputs, initializers(model), [np.zeros((4, 4)), g2])
    np.testing.assert_allclose(grads[0].numpy(), exp_x, rtol=TOL, atol=TOL)
    for name, got in zip(order, grads[1:]):
        np.testing.assert_allclose(got.numpy(), exp_w[name], rtol=TOL, atol=TOL, err_msg=name)


def test_a_bool_output_takes_no_gradient() -> None:
    """Y = X @ W and M = Y > 0: onnxruntime's backward has no gradient input for M, so the one
    given for it (None or an array) is not fed; W's gradient is X^T dY (numpy)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"]), helper.make_node("Greater", ["Y", "zero"], ["M"])],
        "bool_out",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("M", TensorProto.BOOL, ["N", 3]),
        ],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    fb = OrtGradientForwardBackward(model, ["W"])
    assert fb.graphs.non_differentiable_outputs == {1}
    x = rng.standard_normal((5, 4)).astype(np.float32)
    dy = rng.standard_normal((5, 3)).astype(np.float32)
    for grad_m in (None, np.ones((5, 3), dtype=np.float32)):
        y, m = (o.numpy() for o in fb.forward([x]))
        np.testing.assert_allclose(y, x @ w, rtol=TOL, atol=TOL)
        np.testing.assert_array_equal(m, x @ w > 0)
        (dw,) = fb.backward([dy, grad_m])
        np.testing.assert_allclose(dw.numpy(), x.T @ dy, rtol=TOL, atol=TOL)


def test_two_pending_forwards_backward_in_reverse_order() -> None:
    """The layer used twice in one model: the second call's backward runs first."""
    pytest.importorskip("torch")
    make_model, order, widths, torch_fn, _ = CASES["two_inputs_two_outputs"]
    model = make_model()
    start = initializers(model)
    layer = OrtGradientForwardBackward(model, weights_to_train=order, input_names_requiring_grad=["X"])
    rng = np.random.default_rng(4)
    calls = []
    for batch in (6, 2):
        inputs = [rng.standard_normal((batch, d)).astype(np.float32) for d in widths]
        calls.append((inputs, layer.forward(inputs)))
    for inputs, outputs in reversed(calls):
        grad_outputs = [rng.standard_normal(tuple(o.shape())).astype(np.float32) for o in outputs]
        grads = layer.backward(grad_outputs)
        exp_out, exp_w, exp_x = _torch_gradients(torch_fn, inputs, start, grad_outputs)
        for got, want in zip(outputs, exp_out):
            np.testing.assert_allclose(got.numpy(), want, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(grads[0].numpy(), exp_x, rtol=TOL, atol=TOL)
        for name, got in zip(order, grads[1:]):
            np.testing.assert_allclose(got.numpy(), exp_w[name], rtol=TOL, atol=TOL, err_msg=name)


def test_backward_needs_a_training_forward() -> None:
    layer = OrtGradientForwardBackward(build_linear(3, 2), input_names_requiring_grad=["X"])
    g = np.ones((5, 2), dtype=np.float32)
    with pytest.raises(RuntimeError):
        layer.backward([g])
    X = np.ones((5, 3), dtype=np.float32)
    layer.forward([X], training=False)  # inference leaves nothing for a backward
    with pytest.raises(RuntimeError):
        layer.backward([g])
    layer.forward([X], training=True)
    layer.backward([g])
    with pytest.raises(RuntimeError):  # one backward per forward
        layer.backward([g])


def test_unknown_input_requiring_grad() -> None:
    with pytest.raises(ValueError, match="input_names_requiring_grad"):
        OrtGradientForwardBackward(build_linear(3, 2), input_names_requiring_grad=["nope"])


# ---- CachedBinding -----------------------------------------------------------------------------------
def test_cached_binding_rebinds_only_on_a_new_buffer() -> None:
    device = parse_device("cpu")
    model = build_linear(3, 2)
    w64 = {k: v.astype(np.float64) for k, v in initializers(model).items()}
    binding = CachedBinding(make_session(model, device))
    out = np.zeros((4, 2), dtype=np.float32)
    out_value = ort_capi.OrtValue.ortvalue_from_numpy(out, device.ort_device)
    binding.bind_output("Y", out_value)

    def check(X: np.ndarray) -> None:
        binding.run()
        np.testing.assert_allclose(
            out, ref.forward("linear", w64, X.astype(np.float64))[0], rtol=1e-5, atol=1e-6
        )

    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    a_value = ort_capi.OrtValue.ortvalue_from_numpy(a, device.ort_device)
    binding.bind_input("X", a_value)
    assert binding.n_binds == 1
    check(a)
    binding.bind_input("X", a_value)  # the same OrtValue
    assert binding.n_binds == 1
    same_buffer = ort_capi.OrtValue.ortvalue_from_numpy(a, device.ort_device)  # a new OrtValue, same memory
    binding.bind_input("X", same_buffer)
    assert binding.n_binds == 1
    a[:] = rng.standard_normal((4, 3))  # written in place: the bound buffer sees it
    check(a)
    b = rng.standard_normal((4, 3)).astype(np.float32)  # another buffer
    binding.bind_input("X", ort_capi.OrtValue.ortvalue_from_numpy(b, device.ort_device))
    assert binding.n_binds == 2
    check(b)


def test_training_forwards_left_without_a_backward_are_reported() -> None:
    """Each training forward holds its activations until its backward (a stack: the layer may
    serve twice in one model): forwards never followed by one warn once, at PENDING_WARNING,
    that inference forwards need no backward; a backward then still takes the last forward."""
    from ort_train_core.forward_backward import PENDING_WARNING

    layer = OrtGradientForwardBackward(build_linear(3, 2), input_names_requiring_grad=["X"])
    X = np.ones((5, 3), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(PENDING_WARNING - 1):
            layer.forward([X], training=True)
        for _ in range(3):
            layer.forward([X], training=False)  # nothing kept: no warning
    with pytest.warns(ResourceWarning, match=r"training forwards wait for their backward .* training=False"):
        layer.forward([2 * X], training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        layer.forward([X], training=True)
    grads = layer.backward([np.ones((5, 2), dtype=np.float32)])
    coef = initializers(build_linear(3, 2))["coef"]
    np.testing.assert_allclose(grads[0].numpy(), np.ones((5, 2)) @ coef.T, rtol=1e-6)
