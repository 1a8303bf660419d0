"""``OnnxModule(..., backend=)`` (issue 27, items 3, 4 and 7): the module's forward/backward pairs
come from the backend it names. With each, gradients equal torch autograd and 20 optimizer steps
equal torch's; where the training build is loaded, both backends give the same weights after the
same 20 steps within 1e-5. The training build's cases skip on stock onnxruntime."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from torch_models import onnx_from_torch_mlp, torch_mlp, torch_weights_as_onnx

from backend_support import BOTH, needs_training
from ort_train_torch import OnnxModule

AGREE = 1e-5
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def _training_build_nodes(module: OnnxModule) -> list[str]:
    """Nodes of the module's pairs that only the training build's backend writes (see
    tests/core/test_backend_param.py): com.microsoft operators, ``<node>_Grad/`` names."""
    found = []
    for key, fb in module._graphs.items():
        nodes = fb.graphs.gradient_model.graph.node
        found += [f"{key}:{n.name}" for n in nodes if n.domain == "com.microsoft" or "_Grad/" in n.name]
    return found


def _train(module: nn.Module, opt: str, steps: int = 20) -> None:
    """``steps`` steps of mean squared error, batches of 16 rows of 60 (the last one 12)."""
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(60, 4, generator=gen)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    optimizer = OPTIMIZERS[opt](module.parameters())
    bounds = [(s, s + 16) for s in range(0, 60, 16)]
    for k in range(steps):
        s, e = bounds[k % len(bounds)]
        optimizer.zero_grad()
        nn.functional.mse_loss(module(X[s:e]), y[s:e]).backward()
        optimizer.step()


@pytest.mark.parametrize("backend", BOTH)
def test_gradients_equal_torch_autograd(backend: str) -> None:
    net = torch_mlp([6, 8, 2], seed=1)
    module = OnnxModule(onnx_from_torch_mlp(net), backend=backend)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 6, generator=gen)
    target = torch.randn(16, 2, generator=gen)
    x_ours, x_ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    nn.functional.mse_loss(module(x_ours), target).backward()
    nn.functional.mse_loss(net(x_ref), target).backward()
    for k, lin in enumerate(m for m in net if isinstance(m, nn.Linear)):
        torch.testing.assert_close(getattr(module, f"W{k}").grad, lin.weight.grad.T, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(getattr(module, f"b{k}").grad, lin.bias.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-6, rtol=1e-5)
    assert module.backend == backend
    assert all(fb.backend == backend for fb in module._graphs.values())
    assert bool(_training_build_nodes(module)) == (backend == "onnxruntime-training")


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("backend", BOTH)
def test_20_steps_equal_torchs(backend: str, opt: str) -> None:
    net = torch_mlp([4, 10, 1], seed=2)
    module = OnnxModule(onnx_from_torch_mlp(net), backend=backend)
    _train(module, opt)
    _train(net, opt)
    for name, value in torch_weights_as_onnx(net).items():
        torch.testing.assert_close(getattr(module, name).detach(), value, atol=1e-5, rtol=1e-4)


@needs_training
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_both_backends_give_the_same_weights_after_20_steps(opt: str) -> None:
    model = onnx_from_torch_mlp(torch_mlp([4, 10, 1], seed=2))
    ours, theirs = OnnxModule(model, backend="onnx"), OnnxModule(model, backend="onnxruntime-training")
    _train(ours, opt)
    _train(theirs, opt)
    for (name, got), expected in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(got, expected, atol=AGREE, rtol=AGREE, msg=name)


def test_copies_keep_the_backend_and_an_unknown_one_is_refused() -> None:
    net = torch_mlp([4, 3], seed=5)
    module = OnnxModule(onnx_from_torch_mlp(net), backend="onnx")
    x = torch.randn(8, 4)
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert other.backend == "onnx"
        torch.testing.assert_close(other(x), module(x))
        other(x).sum().backward()  # pairs built again on first use, with the same backend
        assert _training_build_nodes(other) == []
    with pytest.raises(
        ValueError, match=r"unknown gradient backend 'autodiff'.*'onnx', 'onnxruntime-training'"
    ):
        OnnxModule(onnx_from_torch_mlp(net), backend="autodiff")


@needs_training
def test_a_set_backend_builds_its_own_pairs() -> None:
    """The pairs are keyed by the backend setting: setting another never reuses the first's."""
    module = OnnxModule(onnx_from_torch_mlp(torch_mlp([4, 3], seed=6)), backend="onnxruntime-training")
    x = torch.randn(8, 4, requires_grad=True)
    module(x).sum().backward()
    assert _training_build_nodes(module)
    before = set(module._graphs)
    module.backend = "onnx"
    module(x).sum().backward()
    new = {k: fb for k, fb in module._graphs.items() if k not in before}
    assert [k[2] for k in new] == ["onnx"]
    assert [fb.backend for fb in new.values()] == ["onnx"]
    assert all(
        n.domain != "com.microsoft" for fb in new.values() for n in fb.graphs.gradient_model.graph.node
    )


@pytest.mark.parametrize("backend", BOTH)
def test_bool_tensors_cross_dlpack_on_either_runtime(backend: str) -> None:
    """A bool mask in, a bool output out: the training build takes them as uint8 flagged bool,
    stock onnxruntime (1.20+) as DLPack bool, without the flag its from_dlpack no longer takes."""
    W = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["XW"]),
            helper.make_node("Where", ["M", "XW", "zero"], ["Y"]),
            helper.make_node("Greater", ["Y", "zero"], ["P"]),
        ],
        "masked",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("M", TensorProto.BOOL, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("P", TensorProto.BOOL, ["N", 2]),
        ],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.zeros((), np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    module = OnnxModule(model, weights_to_train=["W"], backend=backend)
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[True, False], [False, True], [True, True], [False, False], [True, False]])
    y, positive = module(x, mask)
    w = torch.from_numpy(W).requires_grad_(True)
    expected = torch.where(mask, x @ w, torch.zeros(()))
    torch.testing.assert_close(y, expected.detach())
    assert positive.dtype == torch.bool
    assert torch.equal(positive, expected.detach() > 0)
    y.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(module.W.grad, w.grad)
