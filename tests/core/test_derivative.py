"""onnx_derivative (onnxcustom's gradient graph builder): every option combination onnxcustom
tests, the gradients of the inputs and weights against torch autograd."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core._backends import default_backend

torch = pytest.importorskip("torch")

import onnxruntime as ort  # noqa: E402

from ort_train_core import DerivativeOptions, onnx_derivative  # noqa: E402

D = DerivativeOptions
ROWS, N_IN, N_HID, N_OUT = 7, 5, 6, 3


def _model(
    nodes: list, inits: dict[str, np.ndarray], extra_inputs: list | None = None, outputs=None
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, N_IN]), *(extra_inputs or [])],
        outputs or [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, N_OUT])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weights(kind: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    if kind == "linear":
        return {
            "W": rng.standard_normal((N_IN, N_OUT)).astype(np.float32),
            "B": rng.standard_normal(N_OUT).astype(np.float32),
        }
    return {
        "W1": rng.standard_normal((N_IN, N_HID)).astype(np.float32),
        "B1": rng.standard_normal(N_HID).astype(np.float32),
        "W2": rng.standard_normal((N_HID, N_OUT)).astype(np.float32),
        "B2": rng.standard_normal(N_OUT).astype(np.float32),
    }


def _nodes(kind: str) -> list:
    if kind == "linear":
        return [helper.make_node("MatMul", ["X", "W"], ["t"]), helper.make_node("Add", ["t", "B"], ["Y"])]
    return [
        helper.make_node("MatMul", ["X", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z0"]),
        helper.make_node("Add", ["z0", "B2"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["Y"]),
    ]


def _torch_forward(kind: str, x, w: dict):
    if kind == "linear":
        return x @ w["W"] + w["B"]
    return torch.sigmoid(torch.relu(x @ w["W1"] + w["B1"]) @ w["W2"] + w["B2"])


def _torch_grads(kind: str, x: np.ndarray, weights: dict, dy: np.ndarray) -> tuple[np.ndarray, dict]:
    """The forward output and the gradients of x and every weight for output gradient dy."""
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    y = _torch_forward(kind, tx, tw)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    grads = {"X_grad": tx.grad.numpy(), **{f"{k}_grad": t.grad.numpy() for k, t in tw.items()}}
    return y.detach().numpy(), grads


def _run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


OPTIONS = [D.Zero, D.KeepOutputs, D.FillGrad | D.KeepOutputs]


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("options", OPTIONS)
def test_gradients_equal_torch(kind: str, options: DerivativeOptions) -> None:
    weights = _weights(kind)
    model = _model(_nodes(kind), weights)
    grad = onnx_derivative(model, options=options)
    assert grad.ir_version <= 10
    onnx.checker.check_model(grad)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    fill = bool(options & D.FillGrad)
    dy = np.ones((ROWS, N_OUT), np.float32) if fill else rng.standard_normal((ROWS, N_OUT)).astype(np.float32)
    feeds = {"X": x, **weights}
    input_names = [i.name for i in grad.graph.input]
    assert input_names == ["X", *weights, *([] if fill else ["Y_grad"])]
    if not fill:
        feeds["Y_grad"] = dy
    got = _run(grad, feeds)
    y, expected = _torch_grads(kind, x, weights, dy)
    keep = ["Y"] if options & D.KeepOutputs else []
    assert list(got) == [*keep, "X_grad", *(f"{k}_grad" for k in weights)]
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    if keep:
        np.testing.assert_allclose(got["Y"], y, rtol=1e-5, atol=1e-6)


def test_weights_and_inputs_subsets() -> None:
    weights = _weights("mlp")
    model = _model(_nodes("mlp"), weights)
    grad = onnx_derivative(model, weights=["W2"], inputs=[])
    assert [o.name for o in grad.graph.output] == ["W2_grad"]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    dy = rng.standard_normal((ROWS, N_OUT)).astype(np.float32)
    others = {k: v for k, v in weights.items() if k != "W2"}
    assert {i.name for i in grad.graph.initializer} >= set(others)
    got = _run(grad, {"X": x, "W2": weights["W2"], "Y_grad": dy})
    _, expected = _torch_grads("mlp", x, weights, dy)
    np.testing.assert_allclose(got["W2_grad"], expected["W2_grad"], rtol=1e-5, atol=1e-6)


def test_no_weights() -> None:
    model = _model(_nodes("linear"), _weights("linear"))
    grad = onnx_derivative(model, weights=[])
    assert [o.name for o in grad.graph.output] == ["X_grad"]
    dy = np.random.default_rng(4).standard_normal((ROWS, N_OUT)).astype(np.float32)
    got = _run(grad, {"X": np.zeros((ROWS, N_IN), np.float32), "Y_grad": dy})
    np.testing.assert_allclose(got["X_grad"], dy @ _weights("linear")["W"].T, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(
    default_backend().name != "onnxruntime-training", reason="YieldOp is onnxruntime-training's own operator"
)
def test_keep_yield_op() -> None:
    model = _model(_nodes("mlp"), _weights("mlp"))
    grad = onnx_derivative(model, options=D.KeepYieldOp)
    assert "YieldOp" in {n.op_type for n in grad.graph.node}


def test_loss_with_label() -> None:
    weights = _weights("linear")
    nodes = [
        *_nodes("linear"),
        helper.make_node("Sub", ["Y", "label"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    label = helper.make_tensor_value_info("label", TensorProto.FLOAT, [None, N_OUT])
    outputs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, N_OUT]),
        helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
    ]
    model = _model(nodes, weights, [label], outputs)
    grad = onnx_derivative(model, options=D.Loss, loss="loss", label="label")
    assert grad.ir_version <= 10
    rng = np.random.default_rng(5)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    y = rng.standard_normal((ROWS, N_OUT)).astype(np.float32)
    got = _run(grad, {"X": x, "label": y, **weights})
    assert list(got) == ["Y", "loss", "X_grad", "W_grad", "B_grad"]
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    loss = ((_torch_forward("linear", tx, tw) - torch.tensor(y, dtype=torch.float64)) ** 2).mean()
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-5)
    np.testing.assert_allclose(got["X_grad"], tx.grad.numpy(), rtol=1e-5, atol=1e-7)
    for k, t in tw.items():
        np.testing.assert_allclose(got[f"{k}_grad"], t.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=k)


def test_seed_name_collides_with_inner_gradient() -> None:
    """Y feeds another output: the backend's gradient of Y is an inner value, not the seed."""
    weights = _weights("linear")
    nodes = [*_nodes("linear"), helper.make_node("Mul", ["Y", "Y"], ["Z"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, N_OUT]) for n in ("Y", "Z")]
    grad = onnx_derivative(_model(nodes, weights, outputs=outputs))
    rng = np.random.default_rng(6)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    dy, dz = (rng.standard_normal((ROWS, N_OUT)).astype(np.float32) for _ in range(2))
    got = _run(grad, {"X": x, **weights, "Y_grad": dy, "Z_grad": dz})
    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    y = _torch_forward("linear", torch.tensor(x, dtype=torch.float64), tw)
    torch.autograd.backward(
        [y, y * y], [torch.tensor(dy, dtype=torch.float64), torch.tensor(dz, dtype=torch.float64)]
    )
    np.testing.assert_allclose(got["W_grad"], tw["W"].grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"options": 1}, TypeError, "DerivativeOptions"),
        ({"weights": ["nope"]}, ValueError, "'nope'"),
        ({"inputs": ["nope"]}, ValueError, "'nope'"),
        ({"options": D.FillGrad}, ValueError, "KeepOutputs"),
        ({"options": D.KeepYieldOp | D.KeepOutputs}, ValueError, "KeepYieldOp"),
        ({"options": D.Loss, "label": "X"}, ValueError, "loss="),
        ({"options": D.Loss, "loss": "Y"}, ValueError, "label="),
        ({"options": D.Loss, "loss": "nope", "label": "X"}, ValueError, "not an output"),
        ({"loss": "Y"}, ValueError, "only for"),
    ],
)
def test_bad_options(kwargs: dict, error: type, words: str) -> None:
    model = _model(_nodes("linear"), _weights("linear"))
    with pytest.raises(error, match=words):
        onnx_derivative(model, **kwargs)


def test_path_name(tmp_path) -> None:
    model = _model(_nodes("linear"), _weights("linear"))
    path = tmp_path / "grad.onnx"
    grad = onnx_derivative(model, path_name=path)
    assert onnx.load(str(path)) == grad


def test_onnxcustom_graphs() -> None:
    """onnxcustom's own test graphs: Y = X + [1] (the constant is a weight), Y = X * X."""
    cst = np.array([1], dtype=np.float32)
    add = _model([helper.make_node("Add", ["X", "one"], ["Y"])], {"one": cst}, outputs=None)
    mul = _model(
        [helper.make_node("Identity", ["X"], ["xi"]), helper.make_node("Mul", ["xi", "xi"], ["Y"])], {}
    )
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    dy = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    for model in (add, mul):
        model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = N_IN
    got = _run(onnx_derivative(add), {"X": x, "one": cst, "Y_grad": dy})
    assert list(got) == ["X_grad", "one_grad"]
    np.testing.assert_allclose(got["X_grad"], dy, rtol=1e-6)
    np.testing.assert_allclose(got["one_grad"], [dy.sum()], rtol=1e-5)
    got = _run(onnx_derivative(mul), {"X": x, "Y_grad": dy})
    np.testing.assert_allclose(got["X_grad"], 2 * x * dy, rtol=1e-5, atol=1e-6)


def test_skl2onnx_graphs() -> None:
    """onnxcustom's Loss workflow (a skl2onnx linear regression with add_loss_output), and a
    classifier whose int64 label output gets no gradient input but is kept by KeepOutputs."""
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression, LogisticRegression

    from ort_train_core import add_loss_output

    rng = np.random.default_rng(8)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = (x @ [1.0, -2.0, 0.5, 3.0] + 0.3 + rng.standard_normal(40)).astype(np.float32)
    reg = LinearRegression().fit(x, y)
    reg.coef_ = reg.coef_.reshape((1, -1)) + 0.5  # away from the optimum: gradients not ~0
    onx = add_loss_output(to_onnx(reg, x[:1], target_opset=17, black_op={"LinearRegressor"}))
    grad = onnx_derivative(onx, options=D.Loss, loss="loss", label="label")
    w, b = reg.coef_.T.astype(np.float32), np.array([reg.intercept_], np.float32)
    got = _run(grad, {"X": x, "label": y[:, None], "coef": w, "intercept": b})
    residual = x.astype(np.float64) @ w + b - y[:, None]
    np.testing.assert_allclose(got["loss"], (residual**2).mean(), rtol=1e-5)
    np.testing.assert_allclose(got["coef_grad"], 2 * x.T @ residual / len(x), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["intercept_grad"], [2 * residual.mean()], rtol=1e-4, atol=1e-6)

    clf = LogisticRegression().fit(x, y > 0)
    onx = to_onnx(clf, x[:1], target_opset=17, options={"zipmap": False}, black_op={"LinearClassifier"})
    grad = onnx_derivative(onx, options=D.KeepOutputs)
    assert [i.name for i in grad.graph.input][-1] == "probabilities_grad"
    assert [o.name for o in grad.graph.output][:2] == ["label", "probabilities"]
