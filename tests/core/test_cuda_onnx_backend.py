"""The onnx backend on onnxruntime's CUDA provider (issue 28, item 4), against the same steps on
the CPU provider: the fused step of the full loop (weights, optimizer state and batches on the
GPU, bound once) and the forward/backward pair, on an MLP and a small CNN, with TF32 off
(onnxruntime's CUDA default uses it: a ResNet-18 step's deep weight gradients moved by up to
0.44 relative from the CPU's). Marked ``cuda``: skipped, with the reason, where onnxruntime
offers no CUDA provider or the driver sees no GPU (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from core_models import build_mlp
from onnx import TensorProto, helper, numpy_helper

import ort_train_core
from ort_train_core import (
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

pytestmark = pytest.mark.cuda

RTOL, ATOL = 1e-4, 1e-6
#: the device compared with the CPU
GPU = "cuda"


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    ort_train_core.set_tf32(False)
    yield
    ort_train_core.set_tf32(None)


def build_cnn(channels: int = 3, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Y = Gemm(Flatten(relu(Conv_s2(relu(Conv_p1(X)))))): two 3x3 convolutions (padding 1;
    stride 2), then a dense layer to 2 outputs (float32, NCHW, free batch)."""
    rng = np.random.default_rng(seed)
    half = size // 2
    values = {
        "K1": rng.standard_normal((4, channels, 3, 3)) / np.sqrt(9 * channels),
        "c1": 0.1 * rng.standard_normal(4),
        "K2": rng.standard_normal((6, 4, 3, 3)) / 6.0,
        "c2": 0.1 * rng.standard_normal(6),
        "W": rng.standard_normal((6 * half * half, 2)) / np.sqrt(6 * half * half),
        "b": 0.1 * rng.standard_normal(2),
    }
    nodes = [
        helper.make_node("Conv", ["X", "K1", "c1"], ["a1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node(
            "Conv", ["h1", "K2", "c2"], ["a2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node("Relu", ["a2"], ["h2"]),
        helper.make_node("Flatten", ["h2"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "W", "b"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _data(model: onnx.ModelProto, n: int = 64, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    shape = (n, *(d.dim_value for d in list(dims)[1:]))
    n_out = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal((n, n_out)).astype(np.float32)


MODELS = {"mlp": lambda: build_mlp(8, 16, 2), "cnn": build_cnn}


def _fit(model: onnx.ModelProto, device: str, learning_rate: str) -> OrtGradientOptimizer:
    X, y = _data(model)
    trainer = OrtGradientOptimizer(
        add_loss_output(model),
        device=device,
        backend="onnx",
        max_iter=3,
        batch_size=16,
        learning_rate=learning_rate,
        shuffle=True,
        random_state=0,
    )
    return trainer.fit(X, y, X_val=X, y_val=y)


@pytest.mark.parametrize("learning_rate", ["SGD", "Adam"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_fused_step_on_cuda_matches_the_cpu_step(name: str, learning_rate: str) -> None:
    """Full loop, 3 epochs of 4 shuffled batches: the batches are gathered on the GPU, the
    weights and Adam's moments stay there between steps, the losses are read once an epoch."""
    model = MODELS[name]()
    cpu, cuda = _fit(model, "cpu", learning_rate), _fit(model, GPU, learning_rate)
    np.testing.assert_allclose(cuda.train_losses_, cpu.train_losses_, rtol=RTOL)
    np.testing.assert_allclose(cuda.validation_losses_, cpu.validation_losses_, rtol=RTOL)
    expected = cpu.get_state()
    got = cuda.get_state()
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL, err_msg=key)


def _fit_partial(model: onnx.ModelProto, device: str) -> OrtGradientForwardBackwardOptimizer:
    X, y = _data(model)
    trainer = OrtGradientForwardBackwardOptimizer(
        model, device=device, backend="onnx", max_iter=3, batch_size=16, learning_rate="SGD", random_state=0
    )
    return trainer.fit(X, y)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_partial_loop_on_cuda_matches_the_cpu_loop(name: str) -> None:
    """The forward/backward pair, the loss's gradient and the update as separate sessions,
    each bound on the GPU."""
    model = MODELS[name]()
    cpu, cuda = _fit_partial(model, "cpu"), _fit_partial(model, GPU)
    np.testing.assert_allclose(cuda.train_losses_, cpu.train_losses_, rtol=RTOL)
    expected, got = cpu.get_state(), cuda.get_state()
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_forward_backward_pair_on_cuda_matches_the_cpu_pair(name: str) -> None:
    """Outputs and gradients (the input's and every weight's) of one forward and backward; on
    CUDA the outputs, the gradients and the weights are OrtValues on the GPU."""
    model = MODELS[name]()
    X, _ = _data(model, n=8)
    results = {}
    for device in ("cpu", GPU):
        pair = OrtGradientForwardBackward(
            model, device=device, input_names_requiring_grad=["X"], backend="onnx"
        )
        (out,) = pair.forward([X])
        seed = np.linspace(-1.0, 1.0, out.numpy().size, dtype=np.float32).reshape(out.shape())
        grads = pair.backward([seed])
        if device == GPU:
            on_gpu = [out, *grads, *pair.weight_ortvalues()]
            assert {v.device_name().lower() for v in on_gpu} == {GPU}
        results[device] = [out.numpy(), *(g.numpy() for g in grads)]
    for got, expected in zip(results[GPU], results["cpu"]):
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_the_tf32_setting_reaches_the_cuda_provider() -> None:
    """``use_tf32`` as onnxruntime reads it back from the session's CUDA provider."""
    from ort_train_core._binding import make_session
    from ort_train_core._runtime import parse_device

    device = parse_device(GPU)
    model = build_mlp(4, 6, 1)
    for enabled, expected in ((False, "0"), (True, "1")):
        ort_train_core.set_tf32(enabled)
        session = make_session(model, device)
        assert session.get_providers()[0] == "CUDAExecutionProvider"
        assert session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"] == expected
