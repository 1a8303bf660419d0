"""GRU and LSTM in the full loop (issue 17, item 6).

onnxruntime-training's GradientGraphBuilder, which the fused step is built on, has no gradient
for GRU or LSTM; the module graph builder behind the partial loop has. The full loop builds
its gradient graph with the latter for such graphs and still runs one session per step: it must
train torch's nn.GRU / nn.LSTM regressors as torch's own SGD steps do.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from backend_support import training_build_only  # noqa: E402
from batchnorm_support import export_training  # noqa: E402
from ort_train_core import Callback, GraphNotDifferentiableError, OrtGradientOptimizer, add_loss_output  # noqa: E402
from ort_train_core._ort_training import OrtTrainingBackend  # noqa: E402

STEPS, BATCH, LR = 3, 4, 0.1
TIME, FEATURES, HIDDEN = 5, 3, 6


class Recurrent(nn.Module):
    """A GRU or LSTM over rows of TIME x FEATURES values (reshaped in the graph: the core
    trainers' fit takes 2-D inputs), then a Linear on the last step."""

    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cell(FEATURES, HIDDEN, batch_first=True)
        self.fc = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x.reshape(x.shape[0], TIME, FEATURES))
        return self.fc(out[:, -1])


class StepLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_batch_end(self, trainer, epoch: int, batch: int, loss: float) -> None:
        self.losses.append(loss)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(STEPS * BATCH, TIME * FEATURES)).astype(np.float32)
    y = (X[:, :1] - 0.5 * X[:, -1:]).astype(np.float32)
    return X, y


def _torch_sgd(net: nn.Module, X: np.ndarray, y: np.ndarray) -> list[float]:
    """torch's losses of each SGD step on the batches in row order."""
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for start in range(0, len(X), BATCH):
        xb, yb = torch.from_numpy(X[start : start + BATCH]), torch.from_numpy(y[start : start + BATCH])
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM], ids=["GRU", "LSTM"])
def test_full_loop_trains_recurrent_networks_as_torch(cell: type[nn.Module]) -> None:
    torch.manual_seed(0)
    net = Recurrent(cell)
    X, y = _data()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    assert cell.__name__ in {n.op_type for n in model.graph.node}
    torch_losses = _torch_sgd(net, X, y)

    steps = StepLosses()
    common = dict(learning_rate=LR, batch_size=BATCH, max_iter=1, shuffle=False, callbacks=[steps])
    trainer = OrtGradientOptimizer(add_loss_output(model), **common).fit(X, y)
    np.testing.assert_allclose(steps.losses, torch_losses, rtol=1e-4)
    state = trainer.get_state()
    for name, param in net.named_parameters():
        np.testing.assert_allclose(state[name], param.detach().numpy(), atol=1e-4, err_msg=name)


def test_recurrent_gradient_graph_is_one_plain_graph() -> None:
    """The gradient graph built by the module graph builder holds no YieldOp: one plain session
    computes the loss and every weight's gradient."""
    torch.manual_seed(0)
    X, _ = _data()
    loss_model = add_loss_output(export_training(Recurrent(nn.LSTM), torch.from_numpy(X[:BATCH])))
    weights = [i.name for i in loss_model.graph.initializer if i.name.startswith(("rnn.", "fc."))]
    as_inputs = onnx.ModelProto()
    as_inputs.CopyFrom(loss_model)
    kept = [i for i in as_inputs.graph.initializer if i.name not in weights]
    as_inputs.graph.input.extend(
        onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
        for i in as_inputs.graph.initializer
        if i.name in weights
    )
    del as_inputs.graph.initializer[:]
    as_inputs.graph.initializer.extend(kept)
    grad = OrtTrainingBackend().gradient_graph(as_inputs, "loss", weights)
    assert "YieldOp" not in {n.op_type for n in grad.graph.node}
    outputs = {o.name for o in grad.graph.output}
    assert {"loss", *(f"{w}_grad" for w in weights)} <= outputs


@training_build_only("the onnx backend differentiates RNN (tests/core/autodiff/test_autodiff_recurrent.py)")
def test_operator_without_gradient_in_either_builder_is_named() -> None:
    """nn.RNN (an RNN node) has a gradient in neither of onnxruntime's builders: the full loop's
    error names the operator and the node, without onnxruntime's C++ text."""
    torch.manual_seed(0)
    X, y = _data()
    model = export_training(Recurrent(nn.RNN), torch.from_numpy(X[:BATCH]))
    (node,) = [n.name for n in model.graph.node if n.op_type == "RNN"]
    trainer = OrtGradientOptimizer(add_loss_output(model), batch_size=BATCH, max_iter=1)
    with pytest.raises(
        GraphNotDifferentiableError, match=f"operator RNN \\(node '{node}'\\) has no gradient"
    ) as info:
        trainer.fit(X, y)
    assert ".cc:" not in str(info.value)
