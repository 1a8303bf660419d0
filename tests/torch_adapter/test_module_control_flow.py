"""Weights behind a Loop (issue 26, item 3): torch.nn.EmbeddingBag exports a Loop with both
exporters (dynamo reads the gathered rows from the outer scope, TorchScript the weight itself).
onnxruntime-training differentiates no Loop: OnnxModule left the dynamo export's embedding out
of its parameters silently (it never trained) and gave raw onnxruntime text ("was false") for
the TorchScript one. It now refuses both, as the full and partial loops do, naming the weight,
the Loop node and the alternatives; the alternative it names (a frozen embedding through
weights_to_train) trains the rest as torch does.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from ort_train_core import (  # noqa: E402
    GraphNotDifferentiableError,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.graph import CONTROL_FLOW_FIXES, MAX_IR_VERSION  # noqa: E402
from ort_train_torch import OnnxModule  # noqa: E402

IDS = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 4, mode="mean")
        self.lin = nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lin(self.bag(ids))


def _export(net: nn.Module, exporter: str) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            model = torch.onnx.export(net, (IDS,), dynamo=True, verbose=False).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(net, (IDS,), buffer, dynamo=False, input_names=["ids"])
            model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


@pytest.fixture(scope="module")
def exports() -> tuple[Bag, dict[str, onnx.ModelProto]]:
    torch.manual_seed(0)
    net = Bag()
    return net, {e: _export(net, e) for e in ("dynamo", "torchscript")}


def _expected(model: onnx.ModelProto, who: str) -> str:
    """The refusal, written from the graph: the Loop node and the embedding (dynamo reads the
    gathered rows from the outer scope, TorchScript the weight inside the body)."""
    (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
    body = next(a.g for a in loop.attribute if a.name == "body")
    inside = "bag.weight" in {i for n in body.node for i in n.input}
    where = " (read inside its subgraphs)" if inside else ""
    return (
        f"{who}: the gradient cannot cross control flow: weight(s) ['bag.weight'] through node "
        f"{loop.name!r} (Loop){where}. {CONTROL_FLOW_FIXES}"
    )


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_onnx_module_refuses_an_embedding_bag(exports, exporter: str) -> None:
    _, models = exports
    model = models[exporter]
    with pytest.raises(GraphNotDifferentiableError) as info:
        OnnxModule(model)
    assert str(info.value) == _expected(model, "onnxruntime could not build the forward/backward graphs")
    assert info.value.weight is None  # not a weight to drop quietly


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_partial_loop_refuses_it_the_same_way(exports, exporter: str) -> None:
    _, models = exports
    model = models[exporter]
    X, y = IDS.numpy(), np.zeros((2, 1), np.float32)
    with pytest.raises(GraphNotDifferentiableError) as info:
        OrtGradientForwardBackwardOptimizer(model, max_iter=1, batch_size=2).fit(X, y)
    assert str(info.value) == _expected(model, "onnxruntime could not build the forward/backward graphs")
    # the full loop refuses before onnxruntime, naming the Loop and no route that fails too
    with pytest.raises(GraphNotDifferentiableError) as info:
        OrtGradientOptimizer(add_loss_output(model), max_iter=1, batch_size=2).fit(X, y)
    assert "(Loop)" in str(info.value)
    assert "OrtGradientForwardBackwardOptimizer" not in str(info.value)
    assert CONTROL_FLOW_FIXES in str(info.value)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_frozen_embedding_trains_the_rest_as_torch(exports, exporter: str) -> None:
    """The alternative the refusal names: the Linear trains, its gradients equal torch's with
    the embedding frozen."""
    net, models = exports
    module = OnnxModule(models[exporter], weights_to_train=["lin.weight", "lin.bias"])
    assert sorted(module.onnx_names.values()) == ["lin.bias", "lin.weight"]
    target = torch.tensor([[1.0], [-1.0]])
    loss = ((module(IDS) - target) ** 2).mean()
    loss.backward()
    net.zero_grad()
    ((net(IDS) - target) ** 2).mean().backward()
    grads = {module.onnx_names[a]: p.grad for a, p in module.named_parameters()}
    np.testing.assert_allclose(grads["lin.weight"], net.lin.weight.grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["lin.bias"], net.lin.bias.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_frozen_embedding_trains_on_the_full_loop(exports, exporter: str) -> None:
    """The TorchScript export aborted the process there (a C++ assertion in onnxruntime's
    gradient builder on the Loop, though nothing behind it was trained): three SGD steps now
    equal torch's."""
    net, models = exports
    target = torch.tensor([[1.0], [-1.0]])
    trainer = OrtGradientOptimizer(
        add_loss_output(models[exporter]),
        weights_to_train=["lin.weight", "lin.bias"],
        max_iter=3,
        batch_size=2,
        learning_rate=0.1,
    ).fit(IDS.numpy(), target.numpy())
    lin = nn.Linear(4, 1)
    lin.load_state_dict(net.lin.state_dict())
    features = net.bag(IDS).detach()
    for _ in range(3):
        lin.zero_grad()
        ((lin(features) - target) ** 2).mean().backward()
        with torch.no_grad():
            for p in lin.parameters():
                p -= 0.1 * p.grad
    state = trainer.get_state()
    np.testing.assert_allclose(state["lin.weight"], lin.weight.detach(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["lin.bias"], lin.bias.detach(), rtol=1e-5, atol=1e-6)
