"""torch networks with GroupNorm/InstanceNorm (no BatchNorm) and bidirectional LSTM/GRU, their
exports by both torch exporters, data, and torch's own SGD steps: the references of issue 26
items 12 and 13 on every route (tests/core/test_norm_rnn_rewrites.py,
tests/torch_adapter/test_norm_rnn_module.py). Needs torch.

The core trainers' ``fit`` takes 2-D inputs: each network reshapes its rows in the graph.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import torch
from torch import nn

from ort_train_core.graph import MAX_IR_VERSION

LR = 0.05
N_ROWS, BATCH, EPOCHS = 12, 4, 2  # 3 batches of 4 rows, 2 epochs: 6 steps
TIME, FEATURES, HIDDEN = 5, 3, 4


class NormCNN(nn.Module):
    """Conv2d -> GroupNorm(4 groups) -> ReLU -> Conv2d -> InstanceNorm2d(affine) -> ReLU ->
    spatial mean -> Linear, on [N, 3, 6, 6] images given as rows of 108 values. The affine
    parameters are drawn away from torch's ones and zeros (which would hide a wrong scale or
    shift)."""

    n_features = 3 * 6 * 6

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.gn = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8)
        self.conv2, self.inorm = nn.Conv2d(8, 6, 3), nn.InstanceNorm2d(6, affine=True)
        self.fc = nn.Linear(6, 1)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for norm in (self.gn, self.inorm):
                norm.weight.uniform_(0.5, 1.5, generator=gen)
                norm.bias.uniform_(-0.5, 0.5, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.gn(self.conv1(x.reshape(-1, 3, 6, 6))))
        h = torch.relu(self.inorm(self.conv2(h)))
        return self.fc(h.mean((2, 3)))


class BiRecurrent(nn.Module):
    """A bidirectional LSTM (2 layers) or GRU (1 layer) on [N, TIME, FEATURES] sequences given as
    rows, then a Linear of every output the node gives: the mean of ``Y`` over time (every step
    of both directions), the last layer's final hidden state of both directions (``Y_h``) and,
    for the LSTM, its final cell state (``Y_c``)."""

    n_features = TIME * FEATURES

    def __init__(self, cell: str) -> None:
        super().__init__()
        self.cell = cell
        layers = 2 if cell == "lstm" else 1
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(FEATURES, HIDDEN, num_layers=layers, bidirectional=True, batch_first=True)
        self.fc = nn.Linear((6 if cell == "lstm" else 4) * HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        out, state = self.rnn(x.reshape(n, TIME, FEATURES))
        finals = state if self.cell == "lstm" else (state,)
        # the last layer's two directions, batch first
        last = [s[-2:].transpose(0, 1).reshape(n, 2 * HIDDEN) for s in finals]
        return self.fc(torch.cat([out.mean(1), *last], 1))


def make_net(kind: str) -> nn.Module:
    """``'norm_cnn'``, ``'bilstm'`` or ``'bigru'``, seeded."""
    torch.manual_seed(0)
    return NormCNN() if kind == "norm_cnn" else BiRecurrent(kind[2:])


def export(net: nn.Module, example: torch.Tensor, exporter: str) -> onnx.ModelProto:
    """The graph of ``net`` with input ``X`` (batch dimension free) and output ``Y``:
    ``exporter='torchscript'`` keeps every parameter under its torch name; ``'dynamo'`` folds
    some into new initializers (reordered LSTM/GRU weights, reshaped GroupNorm affine
    parameters), each the image of one parameter under a permutation or a reshape, so SGD on them
    takes torch's steps."""
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated; dynamo is verbose
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim("N", min=2)
            program = torch.onnx.export(
                net,
                (example,),
                dynamo=True,
                input_names=["X"],
                output_names=["Y"],
                dynamic_shapes=({0: batch},),
                verbose=False,
            )
            model = program.model_proto
        else:
            f = io.BytesIO()
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


def data(n_features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_ROWS, n_features)).astype(np.float32)
    y = (X[:, :1] - 0.5 * X[:, -1:] + 0.3).astype(np.float32)
    return X, y


def torch_sgd(net: nn.Module, X: np.ndarray, y: np.ndarray, only: str | None = None) -> list[float]:
    """torch's losses of each SGD step on the mean squared error, batches in row order;
    ``only``: the prefix of the parameters trained (the others frozen)."""
    params = [p for name, p in net.named_parameters() if only is None or name.startswith(only)]
    opt = torch.optim.SGD(params, lr=LR)
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
