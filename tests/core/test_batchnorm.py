"""BatchNormalization trained as torch trains it (issue 17, items 2 and 3), on a BatchNorm1d MLP
exported by torch's TorchScript exporter in training mode (``training_mode=1`` nodes):

- the full loop trains it (onnxruntime's GradientGraphBuilder has no BatchNormalization
  gradient; it is rewritten into com.microsoft.BatchNormInternal) and both loops match torch's
  SGD loss at every step;
- the running statistics are state: not trained, updated at every step with the node's
  momentum and the unbiased batch variance as torch does, part of get_state/set_state;
- the trained graph normalises with them, as torch's ``eval()``: its predictions equal torch's
  and do not depend on the batch.
"""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

torch = pytest.importorskip("torch")
nn = torch.nn

from ort_train_core import (  # noqa: E402
    Callback,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.graph import MAX_IR_VERSION  # noqa: E402

LR = 0.05
N_ROWS, BATCH, EPOCHS = 20, 8, 2  # batches of 8, 8 and 4 rows


class BatchNormMLP(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear -> BatchNorm1d (another momentum) -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn1 = nn.Linear(5, 8), nn.BatchNorm1d(8)
        self.fc2, self.bn2 = nn.Linear(8, 6), nn.BatchNorm1d(6, momentum=0.3)
        self.out = nn.Linear(6, 1)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # running statistics and affine parameters far from their defaults
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-1.0, 1.0, generator=gen)
                bn.running_var.uniform_(0.5, 2.0, generator=gen)
                bn.weight.uniform_(0.5, 1.5, generator=gen)
                bn.bias.uniform_(-0.5, 0.5, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.fc1(x)))
        return self.out(torch.relu(self.bn2(self.fc2(h))))


def export_training(net: nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    """The TorchScript export that keeps BatchNorm in training mode and every parameter."""
    f = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated; it keeps BatchNorm
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (example,),
            f,
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            opset_version=17,
            input_names=["X"],
            output_names=["Y"],
            dynamic_axes={"X": {0: "N"}, "Y": {0: "N"}},
        )
    model = onnx.load_from_string(f.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def torch_sgd(net: nn.Module, X: np.ndarray, y: np.ndarray) -> list[float]:
    """torch's losses of each SGD step, batches in row order (shuffle off)."""
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    net.train()
    losses = []
    for _ in range(EPOCHS):
        for start in range(0, len(X), BATCH):
            xb, yb = torch.from_numpy(X[start : start + BATCH]), torch.from_numpy(y[start : start + BATCH])
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return losses


class StepLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_batch_end(self, trainer, epoch: int, batch: int, loss: float) -> None:
        self.losses.append(loss)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(1.0, 2.0, size=(N_ROWS, 5)).astype(np.float32)
    y = (X[:, :1] ** 2 - X[:, 1:2]).astype(np.float32)
    return X, y


def _trainer(route: str, model: onnx.ModelProto, steps: StepLosses):
    common = dict(learning_rate=LR, batch_size=BATCH, max_iter=EPOCHS, shuffle=False, callbacks=[steps])
    if route == "full":
        return OrtGradientOptimizer(add_loss_output(model), **common)
    return OrtGradientForwardBackwardOptimizer(model, **common)


@pytest.fixture(scope="module")
def trained_torch() -> tuple[onnx.ModelProto, nn.Module, list[float]]:
    torch.manual_seed(0)
    net = BatchNormMLP()
    X, y = _data()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    # the export traces a training-mode forward, which moves the running statistics it then
    # writes: torch starts from the exported values
    exported = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with torch.no_grad():
        for name, buffer in net.named_buffers():
            if name in exported:
                buffer.copy_(torch.from_numpy(exported[name].copy()))
    losses = torch_sgd(net, X, y)
    return model, net, losses


def test_the_export_keeps_batchnorm_in_training_mode(trained_torch) -> None:
    model, _, _ = trained_torch
    modes = [
        onnx.helper.get_attribute_value(a)
        for n in model.graph.node
        if n.op_type == "BatchNormalization"
        for a in n.attribute
        if a.name == "training_mode"
    ]
    assert modes == [1, 1]


@pytest.mark.parametrize("route", ["full", "partial"])
def test_running_statistics_are_state_not_parameters(route: str, trained_torch) -> None:
    model, _, _ = trained_torch
    trainer = _trainer(route, model, StepLosses())
    state = trainer.get_state()
    assert {"bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"} <= set(state)
    trained = trainer._inputs().parameters
    assert not [n for n in trained if "running" in n]
    with pytest.raises(ValueError, match="running statistic"):
        _trainer(route, model, StepLosses()).set_params(weights_to_train=["bn1.running_mean"]).fit(*_data())


@pytest.mark.parametrize("route", ["full", "partial"])
def test_training_matches_torch(route: str, trained_torch) -> None:
    model, net, torch_losses = trained_torch
    X, y = _data()
    steps = StepLosses()
    trainer = _trainer(route, model, steps).fit(X, y)
    np.testing.assert_allclose(steps.losses, torch_losses, rtol=1e-4)
    state = trainer.get_state()
    for name, buffer in net.named_buffers():
        if name.endswith("num_batches_tracked"):
            continue
        np.testing.assert_allclose(state[name], buffer.numpy(), atol=1e-5, err_msg=name)
    for name, param in net.named_parameters():
        np.testing.assert_allclose(state[name], param.detach().numpy(), atol=1e-5, err_msg=name)

    # the trained graph normalises with the running statistics, as torch's eval()
    trained = trainer.get_trained_onnx()
    assert all(len(n.output) == 1 for n in trained.graph.node if n.op_type == "BatchNormalization")
    session = onnxruntime.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    net.eval()
    with torch.no_grad():
        expected = net(torch.from_numpy(X)).numpy()
    (got,) = session.run(None, {"X": X})
    np.testing.assert_allclose(got, expected, atol=1e-5)
    (half,) = session.run(None, {"X": X[: N_ROWS // 2]})
    np.testing.assert_allclose(half, got[: N_ROWS // 2], atol=1e-6)
