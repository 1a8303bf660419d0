"""Dropout of a training-mode torch export (``training_mode`` input true): training drops at
random, as torch's ``train()``; every prediction (the trained graph, the validation loss, the
inference forward of the forward/backward pair) is the identity, as torch's ``eval()``.

The reference is torch itself: its ``eval()`` output with the same weights.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
nn = torch.nn

from batchnorm_support import export_training  # noqa: E402
from ort_train_core import (  # noqa: E402
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.graph import inference_form  # noqa: E402

N_ROWS = 16


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_ROWS, 4)).astype(np.float32)
    return X, (X[:, :1] - X[:, 1:2]).astype(np.float32)


@pytest.fixture(scope="module")
def exported() -> onnx.ModelProto:
    X, _ = _data()
    return export_training(_net(), torch.from_numpy(X[:4]))


def _torch_eval(weights: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    """torch's eval() prediction with ``weights`` (by torch parameter name)."""
    net = _net()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(np.array(weights[name])))
    net.eval()
    with torch.no_grad():
        out: np.ndarray = net(torch.from_numpy(X)).numpy()
    return out


def _run(model: onnx.ModelProto, X: np.ndarray) -> np.ndarray:
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"X": X})[0]
    return out


def _trainer(route: str, model: onnx.ModelProto, lr: float, max_iter: int = 2):
    common = dict(learning_rate=lr, batch_size=N_ROWS, max_iter=max_iter, shuffle=False)
    if route == "full":
        return OrtGradientOptimizer(add_loss_output(model), **common)
    return OrtGradientForwardBackwardOptimizer(model, **common)


def test_the_export_keeps_dropout_in_training_mode(exported) -> None:
    """What the other tests rely on: the export's Dropout takes a training_mode input."""
    (node,) = [n for n in exported.graph.node if n.op_type == "Dropout"]
    assert len(node.input) == 3
    assert node.input[2]


def test_inference_form_makes_dropout_the_identity_with_a_mask_of_ones() -> None:
    """A Dropout with training_mode true and ratio 0.9, whose mask is an output too: in
    inference form Y == X and the mask is all ones (ONNX's inference Dropout)."""
    nodes = [helper.make_node("Dropout", ["X", "ratio", "training"], ["Y", "mask"])]
    graph = helper.make_graph(
        nodes,
        "dropout",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [None, 3]),
        ],
        [
            helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.9]),
            helper.make_tensor("training", TensorProto.BOOL, [], [True]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    X = np.arange(1.0, 13.0, dtype=np.float32).reshape(4, 3)
    converted = inference_form(model)
    onnx.checker.check_model(converted, full_check=True)
    assert [i.name for i in converted.graph.initializer] == ["ratio"]  # training_mode is gone
    sess = onnxruntime.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    Y, mask = sess.run(None, {"X": X})
    np.testing.assert_array_equal(Y, X)
    assert mask.dtype == np.bool_
    assert mask.all()


@pytest.mark.parametrize("route", ["full", "partial"])
def test_trained_graph_predicts_as_torch_eval(route: str, exported) -> None:
    """get_trained_onnx() gives the same output at every run, torch's eval() output with the
    trained weights."""
    X, y = _data()
    trainer = _trainer(route, exported, lr=0.05).fit(X, y)
    trained = trainer.get_trained_onnx()
    first, second = _run(trained, X), _run(trained, X)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, _torch_eval(trainer.get_state(), X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("route", ["full", "partial"])
def test_validation_loss_is_deterministic_and_torch_eval(route: str, exported) -> None:
    """With a learning rate of about 0 the weights stay the initial ones: two fits give the
    same validation losses, the MSE of torch's eval() prediction (no dropout)."""
    X, y = _data()
    X_val, y_val = X[:8] * 0.5, y[:8]
    runs = [_trainer(route, exported, lr=1e-12).fit(X, y, X_val=X_val, y_val=y_val) for _ in range(2)]
    assert runs[0].validation_losses_ == runs[1].validation_losses_
    initial = {i.name: onnx.numpy_helper.to_array(i) for i in exported.graph.initializer}
    expected = float(np.mean((_torch_eval(initial, X_val) - y_val) ** 2))
    np.testing.assert_allclose(runs[0].validation_losses_, [expected, expected], rtol=1e-5)


def test_training_still_drops(exported) -> None:
    """Training is torch's train(): two training forwards of the pair differ and differ from
    its inference forward, which equals torch's eval()."""
    X, _ = _data()
    fb = OrtGradientForwardBackward(exported)
    (a,) = fb.forward([X], training=True)
    a_values = a.numpy().copy()
    fb.backward([np.ones((N_ROWS, 1), np.float32)])
    (b,) = fb.forward([X], training=True)
    fb.backward([np.ones((N_ROWS, 1), np.float32)])
    (c,) = fb.forward([X], training=False)
    (d,) = fb.forward([X], training=False)
    assert not np.array_equal(a_values, b.numpy())
    np.testing.assert_array_equal(c.numpy(), d.numpy())
    assert not np.allclose(a_values, c.numpy())
    initial = {i.name: onnx.numpy_helper.to_array(i) for i in exported.graph.initializer}
    np.testing.assert_allclose(c.numpy(), _torch_eval(initial, X), rtol=1e-5, atol=1e-6)


def test_fused_step_loss_is_the_dropout_loss(exported) -> None:
    """The fused step trains with dropout: its first loss (initial weights, one batch) is not
    the loss without dropout that the validation graph gives on the same rows."""
    X, y = _data()
    trainer = _trainer("full", exported, lr=1e-12, max_iter=1).fit(X, y, X_val=X, y_val=y)
    assert trainer.train_losses_[0] != pytest.approx(trainer.validation_losses_[0], rel=1e-3)
