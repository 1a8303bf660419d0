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

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

torch = pytest.importorskip("torch")
nn = torch.nn

from batchnorm_support import (  # noqa: E402
    BATCH,
    EPOCHS,
    LR,
    N_ROWS,
    BatchNormMLP,
    FlatConvNet,
    batchnorm_data,
    export_training,
    start_from_export,
    torch_sgd,
)
from ort_train_core import (  # noqa: E402
    Callback,
    ConvergenceError,
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.cli import main as cli_main  # noqa: E402


class StepLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_batch_end(self, trainer, epoch: int, batch: int, loss: float) -> None:
        self.losses.append(loss)


def _trainer(route: str, model: onnx.ModelProto, steps: StepLosses):
    common = dict(learning_rate=LR, batch_size=BATCH, max_iter=EPOCHS, shuffle=False, callbacks=[steps])
    if route == "full":
        return OrtGradientOptimizer(add_loss_output(model), **common)
    return OrtGradientForwardBackwardOptimizer(model, **common)


@pytest.fixture(scope="module")
def trained_torch() -> tuple[onnx.ModelProto, nn.Module, list[float]]:
    torch.manual_seed(0)
    net = BatchNormMLP()
    X, y = batchnorm_data()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    start_from_export(net, model)
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
        _trainer(route, model, StepLosses()).set_params(weights_to_train=["bn1.running_mean"]).fit(
            *batchnorm_data()
        )


@pytest.mark.parametrize("route", ["full", "partial"])
def test_training_matches_torch(route: str, trained_torch) -> None:
    model, net, torch_losses = trained_torch
    check_training(route, model, net, torch_losses, *batchnorm_data())


@pytest.mark.parametrize("route", ["full", "partial"])
def test_conv_batchnorm2d_trains_as_torch(route: str) -> None:
    """Conv2d + BatchNorm2d (statistics over the batch and both spatial axes)."""
    torch.manual_seed(0)
    net = FlatConvNet()
    X, y = batchnorm_data(72)
    X, y = X / 4, y / 4  # 72 inputs per row: smaller values keep the SGD steps stable
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    start_from_export(net, model)
    check_training(route, model, net, torch_sgd(net, X, y), X, y)


def check_training(
    route: str,
    model: onnx.ModelProto,
    net: nn.Module,
    torch_losses: list[float],
    X: np.ndarray,
    y: np.ndarray,
) -> None:
    """The route's losses per step, parameters and running statistics equal torch's; the trained
    graph's outputs equal torch's eval() and do not depend on the batch."""
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


@pytest.mark.parametrize("route", ["full", "partial"])
def test_running_statistics_are_checkpointed_and_set(route: str, trained_torch, tmp_path) -> None:
    """Checkpoints hold the running statistics: a fit resumed from the first epoch's ends where
    the uninterrupted fit ends; set_state sets them and the trained graph uses them."""
    model, _, _ = trained_torch
    X, y = batchnorm_data()
    whole = _trainer(route, model, StepLosses()).fit(X, y)
    first = _trainer(route, model, StepLosses()).set_params(max_iter=1).fit(X, y)
    first.save_checkpoint(tmp_path / "epoch1.npz")
    resumed = _trainer(route, model, StepLosses())
    resumed.load_checkpoint(tmp_path / "epoch1.npz")
    resumed.set_params(warm_start=True, max_iter=1).fit(X, y)
    for name, value in whole.get_state().items():
        np.testing.assert_allclose(resumed.get_state()[name], value, atol=1e-6, err_msg=name)

    # set_state sets a running statistic; the trained graph holds it
    resumed.set_state({"bn1.running_var": np.full(8, 4.0, np.float32)})
    trained = resumed.get_trained_onnx()
    var = next(numpy_helper.to_array(i) for i in trained.graph.initializer if i.name == "bn1.running_var")
    np.testing.assert_array_equal(var, np.full(8, 4.0, np.float32))


@pytest.mark.parametrize("route", ["full", "partial"])
def test_inference_mode_batchnorm_trains_as_torch_batchnorm(route: str) -> None:
    """An eval-mode export without constant folding keeps BatchNormalization in inference mode:
    a node is torch's BatchNorm whatever the mode it was exported in (onnxruntime's module graph
    builder trains it with batch statistics too), so both loops train it as torch trains the
    network in train() (batch statistics, running statistics updated; the full loop's gradient
    builder had no gradient for it) and the trained graph predicts as torch's eval()."""
    torch.manual_seed(0)
    net = BatchNormMLP().eval()
    X, y = batchnorm_data()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]), training=False)
    modes = [
        a.i
        for n in model.graph.node
        if n.op_type == "BatchNormalization"
        for a in n.attribute
        if a.name == "training_mode"
    ]
    assert len([n for n in model.graph.node if n.op_type == "BatchNormalization"]) == 2
    assert not any(modes)
    check_training(route, model, net, torch_sgd(net, X, y), X, y)


@pytest.mark.parametrize("route", ["full", "partial"])
def test_validation_loss_uses_the_running_statistics(route: str, trained_torch) -> None:
    """The validation loss is the loss of torch's eval() predictions after the epoch (running
    statistics of the end of the epoch, not the validation batch's statistics)."""
    model, _, _ = trained_torch
    X, y = batchnorm_data()
    torch.manual_seed(0)
    net = BatchNormMLP()
    start_from_export(net, model)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    net.train()
    for start in range(0, len(X), BATCH):
        loss = torch.nn.functional.mse_loss(
            net(torch.from_numpy(X[start : start + BATCH])), torch.from_numpy(y[start : start + BATCH])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    X_val, y_val = X[:6] * 0.5, y[:6]
    with torch.no_grad():
        expected = float(torch.nn.functional.mse_loss(net(torch.from_numpy(X_val)), torch.from_numpy(y_val)))
    trainer = _trainer(route, model, StepLosses()).set_params(max_iter=1)
    trainer.fit(X, y, X_val=X_val, y_val=y_val)
    np.testing.assert_allclose(trainer.validation_losses_, [expected], rtol=1e-5)


def test_forward_backward_owns_and_updates_the_running_statistics(trained_torch) -> None:
    """OrtGradientForwardBackward: the statistics are not inputs nor weights for the caller; a
    training forward updates them as torch's train() forward does, an inference forward
    normalises with them as torch's eval() does, and backward needs no gradient for them."""
    model, _, _ = trained_torch
    X, _ = batchnorm_data()
    torch.manual_seed(0)
    net = BatchNormMLP()
    start_from_export(net, model)
    fb = OrtGradientForwardBackward(model)
    assert fb.input_names == ["X"]
    assert fb.output_names == ["Y"]
    assert not [w for w in fb.weights_to_train if "running" in w]
    assert sorted(fb.statistics) == sorted(n for n, _ in net.named_buffers() if "running" in n)

    (out,) = fb.forward([X[:BATCH]], training=True)
    net.train()
    expected = net(torch.from_numpy(X[:BATCH]))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), atol=1e-5)
    grads = fb.backward([np.ones((BATCH, 1), np.float32)])
    assert len(grads) == len(fb.weights_to_train)
    for name, value in fb.get_statistics().items():
        np.testing.assert_allclose(value, net.get_buffer(name).numpy(), atol=1e-6, err_msg=name)

    net.eval()
    (inferred,) = fb.forward([X], training=False)
    with torch.no_grad():
        np.testing.assert_allclose(inferred.numpy(), net(torch.from_numpy(X)).numpy(), atol=1e-5)


@pytest.mark.parametrize("route", ["full", "partial"])
def test_divergence_rolls_the_running_statistics_back(route: str, trained_torch) -> None:
    """A fit that diverges in its first epoch restores the running statistics with the weights
    (the steps before the divergence had updated them)."""
    model, _, _ = trained_torch
    X, y = batchnorm_data()
    steps = StepLosses()
    trainer = _trainer(route, model, steps).set_params(learning_rate=1e6)
    initial = trainer.get_state()
    with pytest.raises(ConvergenceError):
        trainer.fit(X, y)
    assert len(steps.losses) >= 2  # steps ran (and updated the statistics) before the divergence
    for name, value in trainer.get_state().items():
        np.testing.assert_array_equal(value, initial[name], err_msg=name)


def test_inspect_lists_the_running_statistics(trained_torch, tmp_path, capsys) -> None:
    """``ort-train inspect`` lists the running statistics apart from the trained weights."""
    model, _, _ = trained_torch
    onnx.save(model, tmp_path / "bn.onnx")
    assert cli_main(["inspect", str(tmp_path / "bn.onnx")]) == 0
    out = capsys.readouterr().out
    trained, _, rest = out.partition("running statistics")
    assert "fc1.weight" in trained
    assert "running" not in trained.split("trainable float initializers")[1]
    for name in ("bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"):
        assert f"  {name}: float32" in rest
    assert "gradient graph: yes" in rest


@pytest.mark.parametrize("route", ["full", "partial"])
def test_conv_batchnorm2d_on_images_trains_as_torch(route: str) -> None:
    """Conv2d + BatchNorm2d fed images [N, 2, 6, 6] (the network of
    test_conv_batchnorm2d_trains_as_torch without the graph's reshape)."""
    torch.manual_seed(0)
    flat = FlatConvNet()
    net = nn.Sequential(flat.conv, flat.bn, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), flat.out)
    X, y = batchnorm_data(72)
    X, y = (X / 4).reshape(-1, 2, 6, 6), y / 4
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    start_from_export(net, model)
    check_training(route, model, net, torch_sgd(net, X, y), X, y)
