"""OnnxModule on the onnx backend and onnxruntime's CUDA provider (issue 28, item 4): the
parameters, inputs and outputs cross between torch and onnxruntime by DLPack on the GPU, and
one SGD step matches the same torch network's step on the CPU (1e-4, TF32 off). Marked
``cuda``: skipped, with the reason, without a CUDA provider or a GPU (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from torch_models import onnx_from_torch_mlp, torch_mlp, torch_weights_as_onnx

import ort_train_core
from ort_train_torch import OnnxModule

pytestmark = pytest.mark.cuda

RTOL, ATOL = 1e-4, 1e-5
#: where the module runs, against torch on the CPU
GPU = "cuda"


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    ort_train_core.set_tf32(False)
    yield
    ort_train_core.set_tf32(None)


def torch_cnn(seed: int = 0) -> nn.Sequential:
    """Conv 3->4 (3x3, padding 1), ReLU, Conv 4->6 (3x3, stride 2, padding 1), ReLU, Flatten,
    Linear to 2: on 3x8x8 images."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, 2),
    )


def cnn_weights_as_onnx(net: nn.Sequential) -> dict[str, torch.Tensor]:
    """The CNN's parameters under the ONNX graph's names (Conv weights as they are, the
    Linear's as Gemm reads it with transB=1)."""
    conv1, conv2, linear = net[0], net[2], net[5]
    weights = {"K1": conv1.weight, "c1": conv1.bias, "K2": conv2.weight, "c2": conv2.bias}
    return {k: w.detach() for k, w in {**weights, "W": linear.weight, "b": linear.bias}.items()}


def onnx_from_torch_cnn(net: nn.Sequential) -> onnx.ModelProto:
    """The same network in ONNX, its weights copied."""
    weights = cnn_weights_as_onnx(net)
    nodes = [
        helper.make_node("Conv", ["X", "K1", "c1"], ["a1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node(
            "Conv", ["h1", "K2", "c2"], ["a2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node("Relu", ["a2"], ["h2"]),
        helper.make_node("Flatten", ["h2"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "W", "b"], ["Y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w.numpy().copy(), k) for k, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


CASES = {
    # the network, its graph, its parameters under the graph's names, a batch
    "mlp": (lambda: torch_mlp([6, 16, 2], seed=3), onnx_from_torch_mlp, torch_weights_as_onnx, (12, 6)),
    "cnn": (lambda: torch_cnn(seed=3), onnx_from_torch_cnn, cnn_weights_as_onnx, (12, 3, 8, 8)),
}


def _step(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step on ``sum(out**2)``: the output and the input's gradient."""
    x = x.clone().requires_grad_()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    out = module(x)
    out.pow(2).sum().backward()
    optimizer.step()
    return out.detach(), x.grad


@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_module_on_cuda_steps_as_torch_on_the_cpu(case: str) -> None:
    make_net, to_onnx, as_onnx, shape = CASES[case]
    net = make_net()
    module = OnnxModule(to_onnx(net), backend="onnx").to(GPU)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out, grad = _step(module, x.to(GPU))
    assert out.device.type == grad.device.type == GPU
    expected_out, expected_grad = _step(net, x)
    torch.testing.assert_close(out.cpu(), expected_out, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad.cpu(), expected_grad, rtol=RTOL, atol=ATOL)
    for name, want in as_onnx(net).items():  # after the step
        got = getattr(module, name)
        assert got.device.type == GPU, name
        torch.testing.assert_close(got.detach().cpu(), want, rtol=RTOL, atol=ATOL, msg=name)
    module.eval()
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(module(x.to(GPU)).cpu(), net(x), rtol=RTOL, atol=ATOL)
