"""``export_training_step`` (issue 29): one default-domain ONNX graph per training step that a
bare ``onnxruntime.InferenceSession`` loops over, training to the trainers' weights.

The reference is the trainer with the same settings on the ``onnx`` backend (``shuffle=False``,
the same consecutive batches, 20 steps): its weights after the fit against the weights the
exported step gives after 20 session runs fed by the contract alone (``<name>_new`` back as
``<name>``). The MLP here is written with onnx.helper, so this file runs on 3.13 too (no torch);
the CNN with BatchNorm and the GRU of the zoo are in tests/zoo/test_zoo_export_step.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose
from onnx import helper

from ort_train_core import (
    ElasticLearningPenalty,
    LearningRateAdam,
    LearningRateSGD,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    export_training_step,
    model_from_step_state,
    step_initial_state,
    step_initial_state_model,
    step_signature,
    step_without_defaults,
)
from step_support import BATCH, STEPS, WEIGHTS, digits, initializers, mlp, reference_fit

ATOL = 1e-6


def run_step(
    step: onnx.ModelProto, batches: list[dict[str, np.ndarray]]
) -> tuple[list[float], dict[str, Any]]:
    """The loop a user writes: data in, each ``<name>_new`` fed back as ``<name>``."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the warning that an initializer is also an input, by design
    sess = ort.InferenceSession(step.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    state: dict[str, np.ndarray] = {}
    losses = []
    for feeds in batches:
        loss, *new = sess.run(None, {**state, **feeds})
        losses.append(float(loss))
        state.update({n.removesuffix("_new"): v for n, v in zip(names[1:], new)})
    return losses, state


def batches_of(X: np.ndarray, y: np.ndarray, **extra: np.ndarray) -> list[dict[str, np.ndarray]]:
    out = []
    for s in range(0, len(X), BATCH):
        feeds = {"X": X[s : s + BATCH], "label": y[s : s + BATCH]}
        feeds.update({k: v[s : s + BATCH] for k, v in extra.items()})
        out.append(feeds)
    return out


def assert_same_weights(expected: onnx.ModelProto, got: onnx.ModelProto, names: list[str]) -> float:
    want, have = initializers(expected), initializers(got)
    worst = 0.0
    for name in names:
        assert_allclose(have[name], want[name], atol=ATOL, rtol=0, err_msg=name)
        worst = max(worst, float(np.abs(have[name] - want[name]).max()))
    return worst


OPTIMIZERS = {
    "sgd": lambda: LearningRateSGD(eta0=0.1, learning_rate="constant"),
    "momentum": lambda: LearningRateSGDNesterov(eta0=0.05, learning_rate="constant", nesterov=False),
    "nesterov": lambda: LearningRateSGDNesterov(eta0=0.05, learning_rate="constant"),
    "adam": lambda: LearningRateAdam(eta0=0.01),
}
STATES = {"sgd": (), "momentum": ("velocity",), "nesterov": ("velocity",), "adam": ("moment1", "moment2")}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_trains_to_the_full_loops_weights(optimizer: str) -> None:
    X, y = digits()
    loss_model = add_loss_output(mlp(), "cross_entropy")
    trainer = reference_fit(loss_model, OPTIMIZERS[optimizer](), X, y)
    step = export_training_step(loss_model, optimizer=OPTIMIZERS[optimizer](), batch_size=BATCH)
    losses, state = run_step(step, batches_of(X, y))
    assert_same_weights(trainer.get_trained_onnx(), model_from_step_state(loss_model, state), WEIGHTS)
    # the epoch's loss is the mean of the steps' losses (equal batches)
    assert np.mean(losses) == pytest.approx(trainer.train_losses_[0], rel=1e-6)
    if optimizer == "adam":
        assert int(state["step"]) == STEPS


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_the_naming_contract(optimizer: str) -> None:
    step = export_training_step(
        mlp(), loss="cross_entropy", optimizer=OPTIMIZERS[optimizer](), batch_size=BATCH
    )
    onnx.checker.check_model(step, full_check=True)
    assert step.ir_version <= 10
    assert {n.domain for n in step.graph.node} <= {"", "ai.onnx"}
    assert [o.domain for o in step.opset_import] == [""]
    weights = WEIGHTS
    states = [f"{w}_{s}" for w in weights for s in STATES[optimizer]]
    counted = ["step"] if optimizer == "adam" else []
    inputs = [i.name for i in step.graph.input]
    assert inputs == ["X", "label", "learning_rate", *counted, *weights, *states]
    assert [o.name for o in step.graph.output] == [
        "loss",
        *(n + "_new" for n in [*counted, *weights, *states]),
    ]
    # every input but the data has its initial value as an initializer of its name
    defaults = initializers(step)
    assert set(inputs[2:]) <= set(defaults)
    assert not {"X", "label"} & set(defaults)
    for w in weights:
        assert_allclose(defaults[w], initializers(mlp())[w])
    for s in states:
        assert not defaults[s].any()
    assert defaults["learning_rate"] == np.float32(OPTIMIZERS[optimizer]().eta0)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in step.graph.input}
    assert shapes["X"] == [BATCH, 64]
    assert shapes["label"] == [BATCH]
    sig = step_signature(step)
    assert sig.state == inputs[3:]
    assert sig.weights == weights
    assert sig.batch_size == BATCH


def test_a_learning_rate_fed_each_step_follows_a_schedule() -> None:
    """invscaling per epoch: the loop feeds the schedule's value; the default is the first."""
    X, y = digits()
    lr = LearningRateSGD(eta0=0.2, learning_rate="invscaling", power_t=0.5)
    loss_model = add_loss_output(mlp(), "cross_entropy")
    half = BATCH * STEPS // 2
    trainer = OrtGradientOptimizer(
        loss_model, max_iter=2, batch_size=BATCH, learning_rate=lr, shuffle=False, backend="onnx"
    )
    trainer.fit(X[:half], y[:half])
    step = export_training_step(loss_model, optimizer=lr, batch_size=BATCH)
    assert step_initial_state(step)["learning_rate"] == np.float32(0.2)
    feeds = batches_of(X[:half], y[:half])
    schedule = [
        {**f, "learning_rate": np.array(lr.eta(epoch), np.float32)} for epoch in (0, 1) for f in feeds
    ]
    _, state = run_step(step, schedule)
    assert_same_weights(trainer.get_trained_onnx(), model_from_step_state(loss_model, state), ["W1", "W2"])


@pytest.mark.parametrize(
    ("loss", "penalty"),
    [
        ("cross_entropy", None),
        ("log", ElasticLearningPenalty(l1=0.001, l2=0.01)),
        ("squared_error", ElasticLearningPenalty(l1=0.0, l2=0.05)),
    ],
)
def test_trains_to_the_partial_loops_weights(loss: str, penalty: Any) -> None:
    """The partial loop's loss and penalty, exported: the same objective in one graph."""
    X, y = digits()
    labels: np.ndarray = y
    model = mlp(n_out=10)
    if loss == "squared_error":
        labels = np.eye(10, dtype=np.float32)[y]
    if loss == "log":
        model = mlp(n_out=1)
        labels = (y % 2).astype(np.int64)
    lr = LearningRateSGDNesterov(eta0=0.05, learning_rate="constant")
    trainer = OrtGradientForwardBackwardOptimizer(
        model,
        max_iter=1,
        batch_size=BATCH,
        learning_rate=lr,
        learning_loss=loss,
        learning_penalty=penalty,
        shuffle=False,
        backend="onnx",
    )
    trainer.fit(X, labels)
    step = export_training_step(model, loss=loss, optimizer=lr, batch_size=BATCH, penalty=penalty)
    losses, state = run_step(step, batches_of(X, labels))
    assert_same_weights(trainer.get_trained_onnx(), model_from_step_state(model, state), WEIGHTS)
    # the step's loss is the objective: the loss and its penalty, as the partial loop's
    assert np.mean(losses) == pytest.approx(trainer.train_losses_[0], rel=1e-5)


def test_sample_weights_when_asked() -> None:
    X, y = digits()
    w = np.random.default_rng(0).uniform(0.2, 2.0, len(X)).astype(np.float32)
    loss_model = add_loss_output(mlp(), "cross_entropy", weight_name="sample_weight")
    lr = LearningRateSGD(eta0=0.1, learning_rate="constant")
    trainer = reference_fit(loss_model, lr, X, y, sample_weight=w)
    step = export_training_step(loss_model, optimizer=lr, batch_size=BATCH, sample_weight=True)
    assert [i.name for i in step.graph.input][:3] == ["X", "label", "sample_weight"]
    _, state = run_step(step, batches_of(X, y, sample_weight=w))
    assert_same_weights(trainer.get_trained_onnx(), model_from_step_state(loss_model, state), ["W1", "W2"])
    # without sample_weight=True, the weights are ones folded into the graph
    unweighted = export_training_step(loss_model, optimizer=lr, batch_size=BATCH)
    assert "sample_weight" not in [i.name for i in unweighted.graph.input]


def test_runtimes_that_cannot_feed_initializers_start_from_the_initial_state_model() -> None:
    X, y = digits()
    step = export_training_step(mlp(), loss="cross_entropy", optimizer="Adam", batch_size=BATCH)
    bare = step_without_defaults(step)
    assert {t.name for t in bare.graph.initializer}.isdisjoint([*step_signature(step).state, "learning_rate"])
    init = ort.InferenceSession(
        step_initial_state_model(step).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    start = dict(zip([o.name for o in init.get_outputs()], init.run(None, {})))
    expected = step_initial_state(step)
    assert list(start) == list(expected)
    for name, value in expected.items():
        assert_allclose(start[name], value)
        assert start[name].dtype == value.dtype
    # learning_rate has no output: fed with every batch (a schedule's value)
    feeds = [{**f, "learning_rate": start["learning_rate"]} for f in batches_of(X, y)]
    feeds[0] = {**feeds[0], **start}
    _, with_defaults = run_step(step, batches_of(X, y))
    _, without = run_step(bare, feeds)
    for name in with_defaults:
        assert_allclose(without[name], with_defaults[name], atol=0, rtol=0)


def test_the_trained_model_is_an_inference_graph() -> None:
    X, y = digits()
    model = mlp()
    step = export_training_step(model, loss="cross_entropy", optimizer="SGD", batch_size=BATCH)
    _, state = run_step(step, batches_of(X, y))
    trained = model_from_step_state(model, {f"{k}_new": v for k, v in state.items()})
    sess = ort.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    (pred,) = sess.run(None, {"X": X})
    w = {k: state[k] for k in ("W1", "B1", "W2", "B2")}
    expected = np.maximum(X @ w["W1"].T + w["B1"], 0) @ w["W2"].T + w["B2"]
    assert_allclose(pred, expected, atol=1e-5)
    assert [i.name for i in trained.graph.input] == ["X"]


def test_refusals_name_the_problem() -> None:
    model = mlp()
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        export_training_step(model, loss="cross_entropy", batch_size=0)
    with pytest.raises(ValueError, match="penalty needs loss="):
        export_training_step(add_loss_output(model, "cross_entropy"), penalty=ElasticLearningPenalty())
    with pytest.raises(ValueError, match="sample_weight=True but the loss graph takes no sample weights"):
        export_training_step(add_loss_output(model, "cross_entropy"), sample_weight=True)
    with pytest.raises(ValueError, match="not a training step made by export_training_step"):
        step_signature(model)
    with pytest.raises(ValueError, match="no entry of the state names an initializer"):
        model_from_step_state(model, {"other": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="state value 'W1' has shape"):
        model_from_step_state(model, {"W1": np.zeros(2, np.float32)})


def test_an_operator_outside_the_default_domain_is_refused() -> None:
    model = mlp()
    # an ai.onnx.ml node on the path of the loss: the step could not run on a bare runtime
    model.graph.node.append(helper.make_node("Normalizer", ["Y"], ["Yn"], domain="ai.onnx.ml", norm="L2"))
    model.graph.output[0].name = "Yn"
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    with pytest.raises(Exception, match="Normalizer"):
        export_training_step(model, loss="squared_error", batch_size=BATCH)
