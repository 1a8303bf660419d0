"""A BatchNorm network of torch, its TorchScript training-mode export, data, and torch's own SGD
steps: the reference of the BatchNorm tests of every route (tests/core/test_batchnorm.py,
tests/sklearn_adapter/test_onnx_model_batchnorm.py). Needs torch."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from ort_train_core.graph import MAX_IR_VERSION

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


class FlatConvNet(nn.Module):
    """Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d -> Linear on images [N, 2, 6, 6] given as rows
    of 72 features (reshaped in the graph: the core trainers' fit takes 2-D inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.2)
        self.out = nn.Linear(4 * 3 * 3, 1)
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1.0, 1.0, generator=gen)
            self.bn.running_var.uniform_(0.5, 2.0, generator=gen)
            self.bn.weight.uniform_(0.5, 1.5, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x.reshape(-1, 2, 6, 6))))
        return self.out(torch.nn.functional.max_pool2d(h, 2).flatten(1))


def export_training(net: nn.Module, example: torch.Tensor, training: bool = True) -> onnx.ModelProto:
    """The TorchScript export that keeps BatchNorm in training mode and every parameter;
    ``training=False``: in inference mode (running statistics fixed), still not folded."""
    f = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated; it keeps BatchNorm
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (example,),
            f,
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL,
            do_constant_folding=False,
            opset_version=17,
            input_names=["X"],
            output_names=["Y"],
            dynamic_axes={"X": {0: "N"}, "Y": {0: "N"}},
        )
    model = onnx.load_from_string(f.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def torch_sgd(net: nn.Module, X: np.ndarray, y: np.ndarray, training: bool = True) -> list[float]:
    """torch's losses of each SGD step, batches in row order (shuffle off); ``training=False``
    trains in eval() mode (BatchNorm with its running statistics, not updated)."""
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    net.train(training)
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


def batchnorm_data(n_features: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(1.0, 2.0, size=(N_ROWS, n_features)).astype(np.float32)
    y = (X[:, :1] ** 2 - X[:, 1:2]).astype(np.float32)
    return X, y


def start_from_export(net: nn.Module, model: onnx.ModelProto) -> None:
    """Sets the torch network's buffers to the exported ones: the export traces a training-mode
    forward, which moves the running statistics it then writes."""
    exported = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with torch.no_grad():
        for name, buffer in net.named_buffers():
            if name in exported:
                buffer.copy_(torch.from_numpy(exported[name].copy()))
