"""OnnxModule on BatchNorm graphs (issue 17, items 2 and 3): a Conv2d + BatchNorm2d + ReLU +
pool + Linear network and a BatchNorm1d MLP, exported by torch's TorchScript exporter in training
mode, trained with torch's SGD through OnnxModule and compared with the same steps of the torch
network itself:

- the running statistics are torch buffers (``named_buffers``, ``state_dict``), updated in
  ``train()`` as torch updates them (node momentum, unbiased batch variance);
- ``eval()`` and ``to_onnx()`` normalise with them: outputs equal torch's ``eval()`` and do not
  depend on the batch.
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

from ort_train_core.graph import MAX_IR_VERSION  # noqa: E402
from ort_train_torch import OnnxModule  # noqa: E402

LR, BATCH, STEPS = 0.05, 8, 6


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 3),
    )


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(5, 8),
        nn.BatchNorm1d(8, momentum=0.3),
        nn.ReLU(),
        nn.Linear(8, 6),
        nn.BatchNorm1d(6),
        nn.Linear(6, 3),
    )


NETS = {"conv": (conv_net, (2, 6, 6)), "mlp": (mlp, (5,))}


def _export(net: nn.Module, example: torch.Tensor) -> onnx.ModelProto:
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


def _setup(kind: str) -> tuple[nn.Module, onnx.ModelProto, torch.Tensor, torch.Tensor]:
    make, shape = NETS[kind]
    torch.manual_seed(0)
    net = make()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # running statistics and affine parameters away from their defaults
        for m in net.modules():
            if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
                m.running_mean.uniform_(-1.0, 1.0, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.weight.uniform_(0.5, 1.5, generator=gen)
    X = torch.randn(STEPS * BATCH, *shape, generator=gen) * 2 + 1
    y = torch.randn(STEPS * BATCH, 3, generator=gen)
    model = _export(copy.deepcopy(net), X[:BATCH])
    # the export traces a training-mode forward, which moves the running statistics it writes:
    # the torch network starts from the exported values
    exported = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in model.graph.initializer}
    with torch.no_grad():
        for name, buffer in net.named_buffers():
            if name in exported:
                buffer.copy_(exported[name])
    return net, model, X, y


def _train(module: nn.Module, X: torch.Tensor, y: torch.Tensor) -> list[float]:
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    module.train()
    losses = []
    for k in range(STEPS):
        loss = torch.nn.functional.mse_loss(
            module(X[k * BATCH : (k + 1) * BATCH]), y[k * BATCH : (k + 1) * BATCH]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("kind", sorted(NETS))
def test_onnx_module_trains_batchnorm_as_torch(kind: str) -> None:
    net, model, X, y = _setup(kind)
    module = OnnxModule(model)
    buffers = dict(module.named_buffers())
    assert len(buffers) == 2 * sum(isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d) for m in net.modules())
    assert not [n for n, _ in module.named_parameters() if "running" in n]
    assert set(buffers) <= set(module.state_dict())

    np.testing.assert_allclose(_train(module, X, y), _train(net, X, y), rtol=1e-4)
    ours = {module.onnx_buffer_names[attr]: value for attr, value in module.named_buffers()}
    for name, buffer in net.named_buffers():
        if not name.endswith("num_batches_tracked"):
            np.testing.assert_allclose(ours[name].numpy(), buffer.numpy(), atol=1e-5, err_msg=name)

    # eval() and the exported graph normalise with the running statistics, as torch's eval()
    net.eval()
    module.eval()
    with torch.no_grad():
        expected = net(X).numpy()
        got = module(X).numpy()
        half = module(X[: len(X) // 2]).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(half, got[: len(X) // 2], atol=1e-6)
    exported = module.to_onnx()
    session = onnxruntime.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    (deployed,) = session.run(None, {"X": X.numpy()})
    np.testing.assert_allclose(deployed, expected, atol=1e-5)
    assert all(len(n.output) == 1 for n in exported.graph.node if n.op_type == "BatchNormalization")


def test_running_statistics_are_loaded_with_the_state_dict() -> None:
    """Buffers round-trip through state_dict: a copy normalises with the loaded statistics."""
    _, model, X, _ = _setup("mlp")
    module = OnnxModule(model)
    state = {k: v + 0.5 if "running_mean" in k else v for k, v in module.state_dict().items()}
    other = OnnxModule(model)
    other.load_state_dict(state)
    other.eval()
    module.eval()
    with torch.no_grad():
        assert not torch.allclose(other(X), module(X))
        with torch.no_grad():
            for attr, name in module.onnx_buffer_names.items():
                if "running_mean" in name:
                    module.get_buffer(attr).add_(0.5)
        torch.testing.assert_close(other(X), module(X))
