"""onnx_derivative on the graphs and arguments an outside review found it mishandled: old opsets
(9, 10) and IR 3, inputs that carry no gradient, outputs that are also inputs or weights, and
argument errors. Gradients are checked against torch autograd, errors by their message."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import DerivativeOptions, onnx_derivative

D = DerivativeOptions
ROWS, N_IN, N_HID, N_OUT = 6, 4, 5, 3
FLOAT = TensorProto.FLOAT


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {
        "W1": rng.standard_normal((N_IN, N_HID)).astype(np.float32),
        "B1": rng.standard_normal(N_HID).astype(np.float32),
        "W2": rng.standard_normal((N_HID, N_OUT)).astype(np.float32),
        "B2": rng.standard_normal(N_OUT).astype(np.float32),
    }


def _mlp_nodes() -> list[onnx.NodeProto]:
    return [
        helper.make_node("MatMul", ["X", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z0"]),
        helper.make_node("Add", ["z0", "B2"], ["Y"]),
    ]


def _model(
    nodes: list[onnx.NodeProto] | None = None,
    extra_inputs: list[onnx.ValueInfoProto] | None = None,
    outputs: list[onnx.ValueInfoProto] | None = None,
    opset: int = 17,
    ir_version: int = 8,
    inits_as_inputs: bool = False,
) -> onnx.ModelProto:
    """The MLP ``Y = relu(X W1 + B1) W2 + B2``; ``inits_as_inputs`` lists the initializers
    among the graph inputs too, as IR 3 requires."""
    weights = _weights()
    inputs = [helper.make_tensor_value_info("X", FLOAT, [None, N_IN]), *(extra_inputs or [])]
    if inits_as_inputs:
        inputs += [helper.make_tensor_value_info(k, FLOAT, list(v.shape)) for k, v in weights.items()]
    graph = helper.make_graph(
        nodes or _mlp_nodes(),
        "g",
        inputs,
        outputs or [helper.make_tensor_value_info("Y", FLOAT, [None, N_OUT])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def _tensors(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    torch = pytest.importorskip("torch")  # the reference; the error tests need none
    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in arrays.items()}


def _torch_y(t: dict[str, Any]) -> Any:
    torch = pytest.importorskip("torch")  # the reference; the error tests need none
    return torch.relu(t["X"] @ t["W1"] + t["B1"]) @ t["W2"] + t["B2"]


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((ROWS, N_IN)).astype(np.float32),
        rng.standard_normal((ROWS, N_OUT)).astype(np.float32),
    )


def _expected(x: np.ndarray, dy: np.ndarray) -> dict[str, np.ndarray]:
    """torch's gradients of X and of every weight for the output gradient dy."""
    torch = pytest.importorskip("torch")  # the reference; the error tests need none
    t = _tensors({"X": x, **_weights()})
    _torch_y(t).backward(torch.tensor(dy, dtype=torch.float64))
    return {f"{k}_grad": v.grad.numpy() for k, v in t.items()}


def _assert_grads(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for name in got:
        if name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


# 1. opsets 9 and 10 (onnxruntime's MatMul gradient writes an opset-13 Gemm without C)


@pytest.mark.parametrize("opset", [9, 10])
def test_old_opset_graphs(opset: int) -> None:
    grad = onnx_derivative(_model(opset=opset, ir_version=5))
    x, dy = _data(1)
    got = _run(grad, {"X": x, **_weights(), "Y_grad": dy})
    assert list(got) == ["X_grad", "W1_grad", "B1_grad", "W2_grad", "B2_grad"]
    _assert_grads(got, _expected(x, dy))


# 2. IR 3: initializers listed among the inputs; the gradient builder adds initializers that are not


@pytest.mark.parametrize("options", [D.Zero, D.KeepOutputs])
def test_ir3_graph(options: DerivativeOptions) -> None:
    grad = onnx_derivative(_model(opset=8, ir_version=3, inits_as_inputs=True), options=options)
    onnx.checker.check_model(grad)  # IR 3 wants every initializer among the inputs
    assert [i.name for i in grad.graph.input] == ["X", *_weights(), "Y_grad"]
    x, dy = _data(2)
    got = _run(grad, {"X": x, **_weights(), "Y_grad": dy})
    keep = ["Y"] if options & D.KeepOutputs else []
    assert list(got) == [*keep, "X_grad", "W1_grad", "B1_grad", "W2_grad", "B2_grad"]
    _assert_grads(got, _expected(x, dy))


def test_ir3_graph_some_weights() -> None:
    """The initializers not differentiated stay inputs with a default value, as in the graph."""
    grad = onnx_derivative(_model(opset=8, ir_version=3, inits_as_inputs=True), weights=["W2"], inputs=[])
    onnx.checker.check_model(grad)
    x, dy = _data(3)
    got = _run(grad, {"X": x, **_weights(), "Y_grad": dy})
    assert list(got) == ["W2_grad"]
    _assert_grads(got, _expected(x, dy))


def test_ir3_weight_named_as_input_and_weight() -> None:
    model = _model(opset=8, ir_version=3, inits_as_inputs=True)
    with pytest.raises(ValueError, match=r"\['W1'\] named in both weights= and inputs="):
        onnx_derivative(model, weights=["W1"], inputs=["W1"])
    # an initializer named among inputs= is not a default weight as well
    grad = onnx_derivative(model, inputs=["W1"])
    assert [o.name for o in grad.graph.output] == ["W1_grad", "B1_grad", "W2_grad", "B2_grad"]


# 3. inputs that cannot carry a gradient


def _with_dead_inputs() -> onnx.ModelProto:
    """The MLP with an unused float input U and a float input Z that only feeds Shape."""
    nodes = [*_mlp_nodes(), helper.make_node("Shape", ["Z"], ["S"])]
    extra = [helper.make_tensor_value_info(n, FLOAT, [None, N_IN]) for n in ("U", "Z")]
    outputs = [
        helper.make_tensor_value_info("Y", FLOAT, [None, N_OUT]),
        helper.make_tensor_value_info("S", TensorProto.INT64, [2]),
    ]
    return _model(nodes, extra, outputs)


@pytest.mark.parametrize("options", [D.Zero, D.KeepOutputs, D.FillGrad | D.KeepOutputs])
def test_default_inputs_skip_those_without_gradient(options: DerivativeOptions) -> None:
    grad = onnx_derivative(_with_dead_inputs(), options=options)
    x, dy = _data(4)
    if options & D.FillGrad:
        dy = np.ones_like(dy)
    z = np.zeros((ROWS, N_IN), np.float32)
    got = _run(grad, {"X": x, "U": z, "Z": z, **_weights(), "Y_grad": dy})
    keep = ["Y", "S"] if options & D.KeepOutputs else []
    assert list(got) == [*keep, "X_grad", "W1_grad", "B1_grad", "W2_grad", "B2_grad"]
    _assert_grads(got, _expected(x, dy))


def test_default_inputs_skip_those_without_gradient_loss() -> None:
    torch = pytest.importorskip("torch")  # the reference; the error tests need none
    nodes = [
        *_mlp_nodes(),
        helper.make_node("Shape", ["Z"], ["S"]),
        helper.make_node("Sub", ["Y", "label"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    extra = [helper.make_tensor_value_info(n, FLOAT, [None, N_IN]) for n in ("U", "Z")]
    extra.append(helper.make_tensor_value_info("label", FLOAT, [None, N_OUT]))
    outputs = [helper.make_tensor_value_info("loss", FLOAT, [])]
    grad = onnx_derivative(_model(nodes, extra, outputs), options=D.Loss, loss="loss", label="label")
    x, y = _data(5)
    z = np.zeros((ROWS, N_IN), np.float32)
    got = _run(grad, {"X": x, "U": z, "Z": z, "label": y, **_weights()})
    assert list(got) == ["loss", "X_grad", "W1_grad", "B1_grad", "W2_grad", "B2_grad"]
    t = _tensors({"X": x, **_weights()})
    ((_torch_y(t) - torch.tensor(y, dtype=torch.float64)) ** 2).mean().backward()
    _assert_grads(got, {f"{k}_grad": v.grad.numpy() for k, v in t.items()})


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"inputs": ["U"]}, r"inputs \['U'\] carry no gradient: 'U' is used by no node"),
        ({"inputs": ["X", "Z"]}, r"inputs \['Z'\] carry no gradient: 'Z' reaches the outputs \['S'\] only"),
        (
            {"inputs": "Z"},
            r"'Z' reaches the outputs \['S'\] only through values or operators that carry no gradient",
        ),
    ],
)
def test_explicit_inputs_without_gradient(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        onnx_derivative(_with_dead_inputs(), **kwargs)


def test_explicit_weight_without_gradient() -> None:
    model = _model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "unused"))
    with pytest.raises(
        ValueError, match=r"weights \['unused'\] carry no gradient: 'unused' is used by no node"
    ):
        onnx_derivative(model, weights=["unused"])


# 4. outputs that are also a graph input or an initializer


@pytest.mark.parametrize("options", [D.Zero, D.KeepOutputs])
@pytest.mark.parametrize("extra", [["X"], ["X", "W2"], ["W2", "X"]])
def test_outputs_that_are_inputs_or_weights(extra: list[str], options: DerivativeOptions) -> None:
    torch = pytest.importorskip("torch")  # the reference; the error tests need none
    shapes = {"Y": [None, N_OUT], "X": [None, N_IN], "W2": [N_HID, N_OUT]}
    names = ["Y", *extra]
    outputs = [helper.make_tensor_value_info(n, FLOAT, shapes[n]) for n in names]
    grad = onnx_derivative(_model(outputs=outputs), options=options)
    seeds = {"Y": "Y_grad", "X": "X_output_grad", "W2": "W2_output_grad"}
    assert [i.name for i in grad.graph.input] == ["X", *_weights(), *(seeds[n] for n in names)]
    rng = np.random.default_rng(6)
    x, dy = _data(6)
    values = {"X": x, **_weights()}
    douts = {n: rng.standard_normal(values.get(n, dy).shape).astype(np.float32) for n in names}
    got = _run(grad, {**values, **{seeds[n]: d for n, d in douts.items()}})
    keep = names if options & D.KeepOutputs else []
    assert list(got) == [*keep, "X_grad", "W1_grad", "B1_grad", "W2_grad", "B2_grad"]
    t = _tensors(values)
    torch.autograd.backward(
        [_torch_y(t), *(t[n] for n in extra)], [torch.tensor(douts[n], dtype=torch.float64) for n in names]
    )
    _assert_grads(got, {f"{k}_grad": v.grad.numpy() for k, v in t.items()})


def test_output_seed_name_taken_by_a_graph_value() -> None:
    """An input already named ``X_output_grad``: the seed of the output X is ``X_output_grad_1``."""
    taken = helper.make_tensor_value_info("X_output_grad", FLOAT, [None, N_IN])
    outputs = [
        helper.make_tensor_value_info("Y", FLOAT, [None, N_OUT]),
        helper.make_tensor_value_info("X", FLOAT, [None, N_IN]),
    ]
    grad = onnx_derivative(_model(extra_inputs=[taken], outputs=outputs))
    inputs = ["X", "X_output_grad", *_weights(), "Y_grad", "X_output_grad_1"]
    assert [i.name for i in grad.graph.input] == inputs
    x, dy = _data(7)
    dx = np.random.default_rng(7).standard_normal(x.shape).astype(np.float32)
    got = _run(grad, {"X": x, "X_output_grad": x, **_weights(), "Y_grad": dy, "X_output_grad_1": dx})
    assert list(got) == ["X_grad", "W1_grad", "B1_grad", "W2_grad", "B2_grad"]
    expected = _expected(x, dy)
    expected["X_grad"] = expected["X_grad"] + dx
    _assert_grads(got, expected)


# 5. argument errors


def test_single_string_weights_and_inputs() -> None:
    x, dy = _data(8)
    grad = onnx_derivative(_model(), weights="W1", inputs="X")
    got = _run(grad, {"X": x, **_weights(), "Y_grad": dy})
    assert list(got) == ["X_grad", "W1_grad"]
    _assert_grads(got, _expected(x, dy))


def _loss_model(loss_shape: list | None) -> onnx.ModelProto:
    """The MLP with a squared error ``sq`` per element and its mean ``loss``."""
    nodes = [
        *_mlp_nodes(),
        helper.make_node("Sub", ["Y", "label"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    label = helper.make_tensor_value_info("label", FLOAT, [None, N_OUT])
    outputs = [
        helper.make_tensor_value_info("sq", FLOAT, loss_shape),
        helper.make_tensor_value_info("loss", FLOAT, []),
    ]
    return _model(nodes, [label], outputs)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"weights": "W9"}, ValueError, r"weights \['W9'\] are not float initializers"),
        ({"weights": ["W1", "W1"]}, ValueError, r"weights= names 'W1' more than once"),
        ({"inputs": ["X", "X"]}, ValueError, r"inputs= names 'X' more than once"),
        ({"weights": ["W1", 3]}, TypeError, r"weights= must be a str or a sequence of str"),
        ({"weights": [], "inputs": []}, ValueError, "nothing to differentiate"),
        (
            {"options": D.Loss | D.KeepOutputs, "loss": "loss", "label": "label"},
            ValueError,
            r"Loss already keeps the graph's outputs: pass options=DerivativeOptions.Loss",
        ),
        ({"options": D.Loss | D.KeepOutputs}, ValueError, "Loss already keeps"),
        ({"options": D.KeepOutputs, "loss": "loss"}, ValueError, "loss= and label= are only for"),
        (
            {"options": D.Loss, "loss": "sq", "label": "label"},
            ValueError,
            r"loss must be a scalar output: 'sq' has the shape \[None, 3\]",
        ),
    ],
)
def test_argument_errors(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        onnx_derivative(_loss_model([None, N_OUT]), **kwargs)


def test_non_scalar_loss_found_by_inference() -> None:
    """The loss output declares no shape; onnx's shape inference finds it is not a scalar."""
    with pytest.raises(ValueError, match=r"loss must be a scalar output: 'sq' has the shape \[None, 3\]"):
        onnx_derivative(_loss_model(None), options=D.Loss, loss="sq", label="label")


def test_one_element_loss() -> None:
    """A loss of shape [1] (a single element, as some converters write it) is accepted."""
    torch = pytest.importorskip("torch")  # the reference; the error tests need none
    model = _loss_model([None, N_OUT])
    model.graph.node[-1].attribute[0].i = 1  # keepdims=1: shape [1, 1]
    model.graph.output[1].type.tensor_type.shape.CopyFrom(
        helper.make_tensor_type_proto(FLOAT, [1, 1]).tensor_type.shape
    )
    grad = onnx_derivative(model, options=D.Loss, loss="loss", label="label")
    x, y = _data(9)
    got = _run(grad, {"X": x, "label": y, **_weights()})
    t = _tensors({"X": x, **_weights()})
    ((_torch_y(t) - torch.tensor(y, dtype=torch.float64)) ** 2).mean().backward()
    _assert_grads(got, {f"{k}_grad": v.grad.numpy() for k, v in t.items()})
