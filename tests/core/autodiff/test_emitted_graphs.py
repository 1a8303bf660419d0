"""Every graph the onnx backend writes for the trainers passes onnx's full check (types and
shapes inferred strictly), keeps IR <= 10 and holds default-domain operators only: the fused
step of every loss with each learning rate, the partial loop's loss gradient and penalty
update graphs, and the forward/backward pair (forward, backward, and the joined graph)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import add_loss_output
from ort_train_core._backends import get_backend
from ort_train_core._gradient import build_loss_gradient_graph, build_update_graph
from ort_train_core._runtime import Device
from ort_train_core.graph import initializers_to_inputs, set_batch_dimension
from ort_train_core.learning_rate import LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov
from ort_train_core.losses import LOSSES, ElasticLearningPenalty

BATCH, FEATURES, HIDDEN = 8, 5, 6
#: outputs per loss: one column for the margin and binary losses, three classes for the rest
ONE_COLUMN = {
    "hinge",
    "logistic",
    "perceptron",
    "squared_hinge",
    "modified_huber",
    "binary_cross_entropy",
    "log",
}


def _mlp(outputs: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "B1"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, outputs)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "B1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", outputs])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _assert_standard(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}


@pytest.mark.parametrize("lr", [LearningRateSGD(), LearningRateSGDNesterov(), LearningRateAdam()], ids=str)
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_fused_step_of_every_loss_passes_the_full_check(loss: str, lr: object) -> None:
    model = _mlp(1 if loss in ONE_COLUMN else 3)
    weights = ["W1", "B1", "W2"]
    with_loss = add_loss_output(model, loss, weight_name="weight")
    with_loss = set_batch_dimension(with_loss, ["X", "label", "weight"], BATCH)
    step, signature = get_backend("onnx").fused_step(
        initializers_to_inputs(with_loss, weights),
        "loss",
        weights,
        lr,
        Device("cpu"),  # type: ignore[arg-type]
    )
    _assert_standard(step)
    assert len(signature.new_weights) == len(weights)


def test_partial_loop_graphs_pass_the_full_check() -> None:
    backend = get_backend("onnx")
    loss_graph = build_loss_gradient_graph(
        LOSSES["cross_entropy"](), TensorProto.FLOAT, ["N", 3], BATCH, backend=backend
    )
    _assert_standard(loss_graph)
    shapes = [("W1", TensorProto.FLOAT, [FEATURES, HIDDEN]), ("B1", TensorProto.FLOAT, [HIDDEN])]
    update, _ = build_update_graph(
        shapes, LearningRateAdam(), ElasticLearningPenalty(0.1, 0.2), ["W1"], backend=backend
    )
    _assert_standard(update)


def test_forward_backward_graphs_pass_the_full_check() -> None:
    model = set_batch_dimension(_mlp(3), ["X"], BATCH)
    runner = get_backend("onnx").forward_backward(model, ["W1", "B1", "W2"], ["X"], Device("cpu"))
    assert runner.graphs.gradient_model.graph.node  # built at construction: the shapes are static
    _assert_standard(runner.graphs.gradient_model)
    spec = next(iter(runner._specs.values()))[0]
    _assert_standard(spec.forward)
    _assert_standard(spec.backward)
