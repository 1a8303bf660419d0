"""Conv with ``auto_pad='SAME_UPPER'``/``'SAME_LOWER'`` (issue 26, items 1 and 14).

torch's TorchScript exporter writes ``auto_pad='SAME_UPPER'`` for ``padding='same'``.
onnxruntime-training 1.19.2's ConvGrad ignores ``auto_pad``: the weight gradient of such a
Conv came partly from uninitialised memory, on every route (a grouped Conv1d's weight was off by
1.6 relative on the partial loop and by 8e29 on the full loop against torch, different from one
run to the next), and with dilations onnxruntime refused the node even for inference. Every
model now enters with explicit pads (``graph.normalise_model``), and the gradient builders'
rewrites write them too (``_grad_rewrites``). References: torch autograd and torch.optim.SGD on
the same network.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_train_core as otc
from backend_support import training_build_only
from ort_train_core.exceptions import GraphNotDifferentiableError
from ort_train_core.graph import normalise_model

torch = pytest.importorskip("torch")
# a torch Conv network without BatchNorm: the exported-graph note is not what is tested here
pytestmark = pytest.mark.filterwarnings("ignore::ort_train_core.exceptions.ExportedGraphWarning")

LR = 0.05
STEPS = 3


def _tcn(padding: str | int = "same") -> Any:
    """A small TCN: a grouped dilated Conv1d and a depthwise Conv1d, padding='same' (or
    explicit: ``padding`` on the depthwise one, the dilation on the grouped one)."""
    torch.manual_seed(0)
    kernel = 4 if padding == "same" else 3
    return torch.nn.Sequential(
        torch.nn.Conv1d(4, 8, 3, padding="same" if padding == "same" else 2, dilation=2, groups=4),
        torch.nn.Tanh(),
        torch.nn.Conv1d(8, 8, kernel, padding=padding, groups=8),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 10, 1),
    )


def _export(net: Any, x: Any) -> onnx.ModelProto:
    """TorchScript export in training mode (parameters one to one), batch dimension free."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (x,),
            buf,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "N"}},
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
        )
    return onnx.load_from_string(buf.getvalue())


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((6, 4, 10)).astype(np.float32), rng.standard_normal((6, 1)).astype(np.float32)


def _torch_steps(net: Any, X: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """STEPS full-batch steps of torch.optim.SGD on the mean squared error."""
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(torch.tensor(X)), torch.tensor(y)).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}


def test_dilated_same_conv_predicts_as_torch() -> None:
    """Item 14: onnxruntime 1.19 refused the exported graph ("Dilation not supported for
    AutoPadType::SAME_UPPER"); normalised, it runs and gives torch's output."""
    net = _tcn()
    X, _ = _data()
    model = _export(net, torch.tensor(X))
    normalised = normalise_model(model)
    assert all(a.name != "auto_pad" for n in normalised.graph.node for a in n.attribute)
    session = onnxruntime.InferenceSession(normalised.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": X})
    np.testing.assert_allclose(out, net(torch.tensor(X)).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_same_conv_trains_as_torch(loop: str) -> None:
    """Items 1 and 14: three SGD steps of both loops end at torch's weights (the grouped Conv's
    weight gradient was read from uninitialised memory; with dilations the fit failed), and
    predict gives torch's output."""
    X, y = _data()
    model = _export(_tcn(), torch.tensor(X))
    pads = [a.s for n in model.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "auto_pad"]
    assert pads == [b"SAME_UPPER", b"SAME_UPPER"]  # torch's padding='same'
    expected = _torch_steps(_tcn(), X, y)
    kwargs = {"max_iter": STEPS, "batch_size": len(X), "learning_rate": LR, "shuffle": False}
    if loop == "full":
        trainer: Any = otc.OrtGradientOptimizer(otc.add_loss_output(model), **kwargs)
    else:
        trainer = otc.OrtGradientForwardBackwardOptimizer(model, **kwargs)
    state = trainer.fit(X, y).get_state()
    assert set(state) == set(expected)
    for name, want in expected.items():
        np.testing.assert_allclose(state[name], want, rtol=1e-4, atol=1e-6, err_msg=f"{loop}: {name}")


def test_grouped_conv_partial_loop_trains_as_torch() -> None:
    """Item 1: with explicit pads, the partial loop's depthwise Conv1d after a Tanh had a
    weight gradient read from a buffer onnxruntime's memory pattern had reused (the first
    layer's weight ended 3e-4 relative from torch's after one step; the full loop and a
    groups=1 network were exact): three steps now end at torch's weights."""
    X, y = _data()
    model = _export(_tcn(padding=1), torch.tensor(X))
    expected = _torch_steps(_tcn(padding=1), X, y)
    kwargs = {"max_iter": STEPS, "batch_size": len(X), "learning_rate": LR, "shuffle": False}
    state = otc.OrtGradientForwardBackwardOptimizer(model, **kwargs).fit(X, y).get_state()
    for name, want in expected.items():
        np.testing.assert_allclose(state[name], want, rtol=1e-4, atol=1e-6, err_msg=name)


def test_same_conv_onnx_module_trains_as_torch() -> None:
    """Items 1 and 14 through OnnxModule: its parameters after three torch.optim.SGD steps are
    those of the torch network."""
    from ort_train_torch import OnnxModule

    X, y = _data()
    module = OnnxModule(_export(_tcn(), torch.tensor(X)))
    expected = _torch_steps(_tcn(), X, y)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(module(torch.tensor(X)), torch.tensor(y)).backward()
        opt.step()
    for attr, name in module.onnx_names.items():
        got = getattr(module, attr).detach().numpy()
        np.testing.assert_allclose(got, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)


def _strided_same_conv(size: int | str) -> onnx.ModelProto:
    """Conv(X[N, 2, size], W[2, 2, 3]) with stride 2 and auto_pad SAME_UPPER."""
    w = numpy_helper.from_array(np.ones((2, 2, 3), np.float32), "W")
    node = helper.make_node(
        "Conv", ["X", "W"], ["Y"], name="strided", auto_pad="SAME_UPPER", strides=[2], kernel_shape=[3]
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2, "M"])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_strided_same_conv_pads_follow_the_size() -> None:
    """Stride 2 over 7 values: 4 outputs, 2 padding values, one each side (SAME_UPPER puts an
    odd one at the end); over 8 values: 1 padding value, at the end. A size that is not fixed
    leaves the node as it is (onnxruntime computes those pads itself for inference)."""
    pads = {
        size: next(
            list(a.ints)
            for a in normalise_model(_strided_same_conv(size)).graph.node[0].attribute
            if a.name == "pads"
        )
        for size in (7, 8)
    }
    assert pads == {7: [1, 1], 8: [0, 1]}
    free = normalise_model(_strided_same_conv("L")).graph.node[0]
    assert [a.s for a in free.attribute if a.name == "auto_pad"] == [b"SAME_UPPER"]


@training_build_only(
    "its pair builds per fed shape (the pads written out); its full loop refuses an open spatial size"
)
def test_strided_same_conv_of_free_size_is_refused() -> None:
    """A SAME Conv with a stride above 1 on an axis whose size is not fixed cannot get its pads
    written out: differentiating it is refused on both loops, naming the node and the fix (its
    gradient was silently wrong)."""
    X, y = np.ones((2, 2, 7), np.float32), np.zeros((2, 2, 4), np.float32)
    match = r"operator Conv \(node 'strided'\) has auto_pad SAME_UPPER/SAME_LOWER.*export the convolution"
    with pytest.raises(GraphNotDifferentiableError, match=match):
        otc.OrtGradientForwardBackward(_strided_same_conv("L"), weights_to_train=["W"]).forward([X])
    with pytest.raises(GraphNotDifferentiableError, match=match):
        otc.OrtGradientOptimizer(otc.add_loss_output(_strided_same_conv("L")), max_iter=1).fit(X, y)


class _SeparableBlocks(torch.nn.Module):
    """The zoo's TCN shape: a 1x1 Conv, then depthwise (dilated, padding='same') - pointwise -
    ReLU twice with residual adds, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.inp = torch.nn.Conv1d(3, 8, 1)
        self.depthwise1 = torch.nn.Conv1d(8, 8, 3, padding="same", dilation=2, groups=8)
        self.pointwise1 = torch.nn.Conv1d(8, 8, 1)
        self.depthwise2 = torch.nn.Conv1d(8, 8, 3, padding="same", dilation=4, groups=8)
        self.pointwise2 = torch.nn.Conv1d(8, 8, 1)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: Any) -> Any:
        h = self.inp(x)
        h = h + torch.relu(self.pointwise1(self.depthwise1(h)))
        h = h + torch.relu(self.pointwise2(self.depthwise2(h)))
        return self.head(h.mean(dim=2))


def test_depthwise_separable_blocks_get_torchs_gradients_from_the_pair() -> None:
    """OrtGradientForwardBackward (so OnnxModule) on depthwise-separable blocks with residual
    adds: onnxruntime-training's grouped ConvGrad gave depthwise2.bias a zero gradient (torch's
    up to 0.16) and the first layer's weight 40 % off, the same on each call; grouped Convs are
    now differentiated one group at a time."""
    net = _SeparableBlocks()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 3, 16)).astype(np.float32)
    g_out = rng.standard_normal((8, 1)).astype(np.float32)
    model = _export(net, torch.tensor(x))
    names = {init.name for init in model.graph.initializer}
    weights = [name for name, _ in net.named_parameters() if name in names]
    assert len(weights) == len(list(net.parameters()))  # one to one
    fb = otc.OrtGradientForwardBackward(model, weights_to_train=weights)
    fb.forward([x])
    grads = [np.asarray(g.numpy()) for g in fb.backward([g_out])]
    out = net(torch.tensor(x))
    out.backward(torch.tensor(g_out))
    for name, got in zip(weights, grads):
        expected = net.get_parameter(name).grad.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max(), err_msg=name)
