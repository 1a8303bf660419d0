"""``export_training_step`` on the zoo (issue 29): the CNN with BatchNorm (the tiny ResNet:
Conv, BatchNorm, MaxPool, residual adds, global pooling), the 1-D CNN with BatchNorm and the GRU
regressor train in a bare ``onnxruntime.InferenceSession`` loop to the weights and running
statistics that ``OrtGradientOptimizer`` (``backend='onnx'``, same settings) reaches, within
1e-6 over 20 steps, with SGD with momentum and with Adam."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import onnx
import onnxruntime as ort
import zoo_models as zm
from numpy.testing import assert_allclose
from onnx import numpy_helper
from test_zoo import N_ROWS, as_fit_input, exported, training_data

from ort_train_core import (
    LearningRateAdam,
    LearningRateSGDNesterov,
    OrtGradientOptimizer,
    add_loss_output,
    export_training_step,
    model_from_step_state,
    step_signature,
)

BATCH = 8
STEPS = 20
EPOCHS = STEPS * BATCH // N_ROWS
ATOL = 1e-6

#: weights whose gradient is zero in exact arithmetic: a bias a training-mode BatchNorm removes
#: with the batch mean. Adam divides their rounding noise (~1e-9) by its own size, so they move
#: by +-lr in a direction two sessions of the same step need not agree on; left out with Adam,
#: with the running mean that follows that bias (nothing else reads it: the rest is compared).
NOISE_ONLY = {"conv1d": {"conv1.bias", "bn1.running_mean"}}

OPTIMIZERS = {
    "momentum": lambda: LearningRateSGDNesterov(eta0=0.05, learning_rate="constant", nesterov=False),
    "adam": lambda: LearningRateAdam(eta0=0.005),
}


def _loop(
    step: onnx.ModelProto, inputs: dict[str, np.ndarray], y: np.ndarray
) -> tuple[list[float], dict[str, Any]]:
    """The user's loop: consecutive batches, epoch after epoch; ``<name>_new`` fed back."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # initializers that are inputs too: by design
    sess = ort.InferenceSession(step.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    label = step_signature(step).label
    state: dict[str, np.ndarray] = {}
    losses = []
    for _ in range(EPOCHS):
        for s in range(0, N_ROWS, BATCH):
            feeds = {k: v[s : s + BATCH] for k, v in inputs.items()}
            loss, *new = sess.run(None, {**state, **feeds, label: y[s : s + BATCH]})
            losses.append(float(loss))
            state.update({n.removesuffix("_new"): v for n, v in zip(names[1:], new)})
    return losses, state


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("name", ["resnet", "conv1d", "gru"])
def test_exported_step_trains_like_the_full_loop(name: str, optimizer: str) -> None:
    _, model = exported(name, "torchscript")
    inputs, y = training_data(name)
    score = "squared_error" if zm.ALL_CASES[name].task == "regression" else "cross_entropy"
    loss_model = add_loss_output(model, score_name=score)
    trainer = OrtGradientOptimizer(
        loss_model,
        max_iter=EPOCHS,
        batch_size=BATCH,
        learning_rate=OPTIMIZERS[optimizer](),
        shuffle=False,
        backend="onnx",
    )
    trainer.fit(as_fit_input(inputs), y)
    step = export_training_step(loss_model, optimizer=OPTIMIZERS[optimizer](), batch_size=BATCH)
    onnx.checker.check_model(step, full_check=True)
    assert {n.domain for n in step.graph.node} <= {""}
    assert step.ir_version <= 10
    sig = step_signature(step)
    assert bool(sig.statistics) == zm.ALL_CASES[name].has_batchnorm
    losses, state = _loop(step, inputs, y)
    expected = {t.name: numpy_helper.to_array(t) for t in trainer.get_trained_onnx().graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in model_from_step_state(model, state).graph.initializer}
    skipped = NOISE_ONLY.get(name, set()) if optimizer == "adam" else set()
    for name_ in [n for n in [*sig.weights, *sig.statistics] if n not in skipped]:
        assert_allclose(got[name_], expected[name_], atol=ATOL, rtol=0, err_msg=name_)
    assert np.mean(losses[-2:]) == pytest.approx(trainer.train_losses_[-1], rel=1e-5)
    assert losses[-1] < losses[0]
