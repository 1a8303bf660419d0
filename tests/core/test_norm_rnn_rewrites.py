"""GroupNorm/InstanceNorm CNNs and bidirectional LSTM/GRU trained as torch trains them (issue 26,
items 12 and 13), on the core routes: the full loop (``OrtGradientOptimizer``), the partial loop
(``OrtGradientForwardBackwardOptimizer``) and the forward/backward pair
(``OrtGradientForwardBackward``). OnnxModule: tests/torch_adapter/test_norm_rnn_module.py.

onnxruntime-training 1.19.2 has no gradient for InstanceNormalization (both torch exporters
write GroupNorm and InstanceNorm with it) nor GroupNormalization, and its LSTM/GRU gradients are
forward-only: every route refused these graphs. They are rewritten before differentiation
(``_grad_rewrites_norm_rnn``); the gradient oracle (tests/gradient_catalogue_norm_rnn.py) checks
the rewritten operators one by one against torch autograd and finite differences.

References: torch's own SGD steps on the same network (losses at every step within 1e-4
relative, parameters after 6 steps within 1e-5 absolute) and torch autograd in float64 (the
pair's gradients within 1e-4 relative).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from backend_support import training_build_only  # noqa: E402
from norm_rnn_support import BATCH, LR, data, export, make_net, torch_sgd  # noqa: E402
from ort_train_core import (  # noqa: E402
    Callback,
    GraphNotDifferentiableError,
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    onnx_derivative,
)

KINDS = ["norm_cnn", "bilstm", "bigru"]
EXPORTERS = ["torchscript", "dynamo"]
#: the operator each network exports to, which onnxruntime-training cannot differentiate
OPERATORS = {"norm_cnn": "InstanceNormalization", "bilstm": "LSTM", "bigru": "GRU"}


class StepLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
        self.losses.append(loss)


_EXPORTS: dict[tuple[str, str], onnx.ModelProto] = {}


def _setup(kind: str, exporter: str) -> tuple[torch.nn.Module, onnx.ModelProto, np.ndarray, np.ndarray]:
    """The seeded network, its export (cached: the dynamo export takes seconds), X and y."""
    net = make_net(kind)
    X, y = data(net.n_features)
    if (kind, exporter) not in _EXPORTS:
        _EXPORTS[kind, exporter] = export(copy.deepcopy(net), torch.from_numpy(X[:BATCH]), exporter)
    return net, _EXPORTS[kind, exporter], X, y


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_exports_hold_the_operators_without_gradient(kind: str, exporter: str) -> None:
    """The premise: both exporters write InstanceNormalization for GroupNorm and InstanceNorm2d,
    and bidirectional LSTM/GRU nodes (GRU with linear_before_reset=1)."""
    _, model, _, _ = _setup(kind, exporter)
    nodes = [n for n in model.graph.node if n.op_type == OPERATORS[kind]]
    attrs = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
    if kind == "norm_cnn":
        assert len(nodes) == 2
    else:
        assert len(nodes) == (2 if kind == "bilstm" else 1)
        assert all(a["direction"] == b"bidirectional" for a in attrs)
    if kind == "bigru":
        assert attrs[0]["linear_before_reset"] == 1


# the trainers warn that a torch CNN without BatchNormalization may have had it folded (this one
# has none: GroupNorm and InstanceNorm instead)
@pytest.mark.filterwarnings("ignore::ort_train_core.ExportedGraphWarning")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("route", ["full", "partial"])
@pytest.mark.parametrize("kind", KINDS)
def test_trains_as_torch(kind: str, route: str, exporter: str) -> None:
    """6 SGD steps of both loops give torch's loss at every step and (TorchScript export, which
    keeps torch's parameter names) torch's parameters. The dynamo export trains folded copies of
    some parameters (reordered LSTM/GRU weights, reshaped GroupNorm scales): one-to-one images of
    torch's parameters, so the losses are torch's too."""
    net, model, X, y = _setup(kind, exporter)
    torch_losses = torch_sgd(net, X, y)
    steps = StepLosses()
    common = dict(learning_rate=LR, batch_size=BATCH, max_iter=2, shuffle=False, callbacks=[steps])
    if route == "full":
        trainer: Any = OrtGradientOptimizer(add_loss_output(model), **common)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, **common)
    trainer.fit(X, y)
    np.testing.assert_allclose(steps.losses, torch_losses, rtol=1e-4)
    if exporter == "torchscript":
        state = trainer.get_state()
        for name, param in net.named_parameters():
            assert state[name].shape == tuple(param.shape), name
            np.testing.assert_allclose(state[name], param.detach().numpy(), atol=1e-5, err_msg=name)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("route", ["full", "partial"])
@pytest.mark.parametrize("kind", ["bilstm", "bigru"])
def test_frozen_bidirectional_layer_under_a_trained_head(kind: str, route: str, exporter: str) -> None:
    """Only the Linear head trained: onnxruntime's module graph builder swaps every LSTM/GRU for
    its forward-only training kernel, gradient or not, so a frozen bidirectional layer failed at
    session creation on the partial loop ('only supports the forward direction'); both loops
    now take torch's steps."""
    net, model, X, y = _setup(kind, exporter)
    torch_losses = torch_sgd(net, X, y, only="fc.")
    head = [n for n in model.graph.node if n.op_type == "Gemm"][-1].input[1:]  # fc's weight and bias
    steps = StepLosses()
    common = dict(learning_rate=LR, batch_size=BATCH, max_iter=2, shuffle=False, callbacks=[steps])
    if route == "full":
        trainer: Any = OrtGradientOptimizer(add_loss_output(model), list(head), **common)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, list(head), **common)
    trainer.fit(X, y)
    np.testing.assert_allclose(steps.losses, torch_losses, rtol=1e-4)


@pytest.mark.filterwarnings("ignore::ort_train_core.ExportedGraphWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_forward_backward_gradients_match_torch_autograd(kind: str) -> None:
    """OrtGradientForwardBackward (the pair behind the partial loop and OnnxModule): the output,
    the input's gradient and every parameter's gradient equal torch autograd's in float64."""
    net, model, X, _ = _setup(kind, "torchscript")
    grad_out = np.random.default_rng(1).uniform(-1.0, 1.0, size=(BATCH, 1)).astype(np.float32)
    names = [name for name, _ in net.named_parameters()]
    fb = OrtGradientForwardBackward(model, weights_to_train=names, input_names_requiring_grad=["X"])
    (out,) = fb.forward([X[:BATCH]])
    grads = dict(zip(["X", *names], (g.numpy() for g in fb.backward([grad_out]))))

    net64 = copy.deepcopy(net).double()
    x64 = torch.tensor(X[:BATCH], dtype=torch.float64, requires_grad=True)
    y64 = net64(x64)
    y64.backward(torch.tensor(grad_out, dtype=torch.float64))
    expected = {"X": x64.grad.numpy(), **{n: p.grad.numpy() for n, p in net64.named_parameters()}}
    np.testing.assert_allclose(out.numpy(), y64.detach().numpy(), rtol=1e-4, atol=1e-6)
    # the absolute floor: 1e-5 of the largest gradient (conv2.bias, before an InstanceNorm,
    # has a gradient of exactly zero, which float32 computes as a few 1e-8)
    atol = 1e-5 * max(float(np.abs(ref).max()) for ref in expected.values())
    for name, ref in expected.items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-4, atol=atol, err_msg=name)


# ---- GroupNormalization (no exporter writes it; onnx infers no type for its output) -----------
def _group_norm_model(opset: int, groups: int, channels: int, affine: int) -> onnx.ModelProto:
    """Y = GroupNormalization(X, scale, bias), X [N, C, 3, 2] with N free."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, affine).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, affine).astype(np.float32), "bias"),
    ]
    node = helper.make_node(
        "GroupNormalization", ["X", "scale", "bias"], ["Y"], num_groups=groups, epsilon=1e-3
    )
    graph = helper.make_graph(
        [node],
        "group_norm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", channels, 3, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", channels, 3, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_gradients_match_torch(opset: int) -> None:
    """GroupNormalization (opset 18: scale and bias per group; 21: per channel) on the pair and
    in the full loop's gradient graph, against torch's group_norm in float64."""
    groups, channels = 2, 4
    affine = groups if opset < 21 else channels
    model = _group_norm_model(opset, groups, channels, affine)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3, channels, 3, 2)).astype(np.float32)
    G = rng.uniform(-1.0, 1.0, size=X.shape).astype(np.float32)
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    x = torch.tensor(X, dtype=torch.float64, requires_grad=True)
    w = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in init.items()}
    repeat = channels // affine  # opset 18: each group's scale over its channels
    scale, bias = (torch.repeat_interleave(w[k], repeat) for k in ("scale", "bias"))
    y = torch.nn.functional.group_norm(x, groups, scale, bias, eps=float(np.float32(1e-3)))
    y.backward(torch.tensor(G, dtype=torch.float64))
    expected = {"X": x.grad.numpy(), "scale": w["scale"].grad.numpy(), "bias": w["bias"].grad.numpy()}

    fb = OrtGradientForwardBackward(
        model, weights_to_train=["scale", "bias"], input_names_requiring_grad=["X"]
    )
    (out,) = fb.forward([X])
    got = dict(zip(["X", "scale", "bias"], (g.numpy() for g in fb.backward([G]))))
    np.testing.assert_allclose(out.numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-5)
    for name, ref in expected.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)

    # the full loop's gradient builder (GradientGraphBuilder), through onnx_derivative
    graph = onnx_derivative(model, weights=["scale", "bias"], inputs=["X"])
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    fetched = session.run(["X_grad", "scale_grad", "bias_grad"], {"X": X, "Y_grad": G, **init})
    for (name, ref), value in zip(expected.items(), fetched):
        np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5, err_msg=f"{name} (full loop)")


# ---- refusals ----------------------------------------------------------------------------------
def _lstm(**attrs: Any) -> onnx.ModelProto:
    """A bidirectional LSTM, X [T=4, N, 2], hidden 3, given sequence_lens [N] as a graph input."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
        for name, shape in (("W", [2, 12, 2]), ("R", [2, 12, 3]), ("B", [2, 24]))
    ]
    node = helper.make_node(
        "LSTM",
        ["X", "W", "R", "B", "lens"],
        ["Y"],
        name="lstm",
        hidden_size=3,
        direction="bidirectional",
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "lstm",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, "N", 2]),
            helper.make_tensor_value_info("lens", TensorProto.INT32, ["N"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 2, "N", 3])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


_REFUSALS = {
    "sequence_lens": ({}, "sequence_lens (sequences of several lengths)"),
    "clip": ({"clip": 2.0}, "clip"),
    "activations": (
        {"activations": ["Sigmoid", "Tanh", "Relu"] * 2},
        "activations ['sigmoid', 'tanh', 'relu', 'sigmoid', 'tanh', 'relu']",
    ),
}


@training_build_only("the training build's kernels; the onnx backend's refusals: test_autodiff_recurrent.py")
@pytest.mark.parametrize("route", ["forward/backward", "full"])
@pytest.mark.parametrize("what", sorted(_REFUSALS))
def test_what_the_training_kernels_do_not_compute_is_refused(what: str, route: str) -> None:
    """sequence_lens, clip and other activations: the training build's LSTM/GRU kernels
    do not compute them (they failed at the first step with onnxruntime's C++ text); refused
    before, naming the node and what to do."""
    attrs, named = _REFUSALS[what]
    model = _lstm(**attrs)
    if what != "sequence_lens":  # the other refusals without sequence_lens
        model.graph.node[0].input[4] = ""
        del model.graph.input[1]
    expected = re.escape(
        f"operator LSTM (node 'lstm'): onnxruntime-training's LSTM gradient does not compute {named}; "
        "export the layer without them"
    )
    with pytest.raises(GraphNotDifferentiableError, match=expected):
        _differentiate(model, route)


def _differentiate(model: onnx.ModelProto, route: str) -> None:
    """The full loop's gradient graph (``onnx_derivative``), or a forward of the pair."""
    if route == "full":
        onnx_derivative(model, weights=["W", "R", "B"], inputs=[])
        return
    fb = OrtGradientForwardBackward(model, weights_to_train=["W", "R", "B"])
    feeds = [np.zeros((4, 2, 2), np.float32)]
    if len(model.graph.input) > 1:  # sequence_lens
        feeds.append(np.array([4, 3], np.int32))
    fb.forward(feeds)
