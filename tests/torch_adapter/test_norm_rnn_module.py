"""OnnxModule on GroupNorm/InstanceNorm CNNs and bidirectional LSTM/GRU (issue 26, items 12 and
13): the networks of tests/norm_rnn_support.py, exported by both torch exporters, trained with
torch's SGD through OnnxModule and compared with the same steps of the torch network itself
(losses within 1e-4 relative at every step; parameters within 1e-5 absolute after 6 steps and
the input's gradient within 1e-4 relative for the TorchScript export, which keeps torch's
names). onnxruntime-training has no gradient for InstanceNormalization and only forward
LSTM/GRU gradients: OnnxModule refused these graphs before they were rewritten.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from norm_rnn_support import BATCH, data, export, make_net, torch_sgd  # noqa: E402
from ort_train_torch import OnnxModule  # noqa: E402


# OnnxModule warns that a torch CNN without BatchNormalization may have had it folded (this one
# has none: GroupNorm and InstanceNorm instead)
@pytest.mark.filterwarnings("ignore::ort_train_core.ExportedGraphWarning")
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("kind", ["norm_cnn", "bilstm", "bigru"])
def test_onnx_module_trains_as_torch(kind: str, exporter: str) -> None:
    net = make_net(kind)
    X, y = data(net.n_features)
    module = OnnxModule(export(copy.deepcopy(net), torch.from_numpy(X[:BATCH]), exporter))

    # the input's gradient through the module (a layer of a bigger model) is torch's
    x_ours, x_ref = (torch.tensor(X[:BATCH], requires_grad=True) for _ in range(2))
    module(x_ours).sum().backward()
    net(x_ref).sum().backward()
    np.testing.assert_allclose(x_ours.grad.numpy(), x_ref.grad.numpy(), rtol=1e-4, atol=1e-6)
    module.zero_grad()
    net.zero_grad()

    np.testing.assert_allclose(torch_sgd(module, X, y), torch_sgd(net, X, y), rtol=1e-4)
    if exporter == "torchscript":
        ours = {module.onnx_names[attr]: p.detach().numpy() for attr, p in module.named_parameters()}
        for name, param in net.named_parameters():
            np.testing.assert_allclose(ours[name], param.detach().numpy(), atol=1e-5, err_msg=name)


@pytest.mark.parametrize("kind", ["bilstm", "bigru"])
def test_frozen_bidirectional_layer_under_a_trained_head(kind: str) -> None:
    """Only the head trained: onnxruntime swapped the frozen bidirectional layer for its
    forward-only training kernel, and OnnxModule failed at its first forward."""
    net = make_net(kind)
    X, y = data(net.n_features)
    model = export(copy.deepcopy(net), torch.from_numpy(X[:BATCH]), "torchscript")
    module = OnnxModule(model, weights_to_train=["fc.weight", "fc.bias"])
    np.testing.assert_allclose(torch_sgd(module, X, y), torch_sgd(net, X, y, only="fc."), rtol=1e-4)
