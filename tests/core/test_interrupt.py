"""Ctrl-C during fit ends training after the current step, with a warning and weights equal to
those of an uninterrupted run stopped at the same step (computed by numpy SGD here)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import Callback, OrtGradientOptimizer, add_loss_output
from ort_train_core.exceptions import TrainingInterruptedWarning


def _linear(coef: np.ndarray, intercept: np.ndarray):
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "coef"], ["mm"]),
            helper.make_node("Add", ["mm", "intercept"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, coef.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(coef, "coef"), numpy_helper.from_array(intercept, "intercept")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


pytestmark = pytest.mark.usefixtures("sigint_delivered")


class _InterruptAfterEpoch(Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, trainer, epoch, logs):  # type: ignore[no-untyped-def]
        if epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGINT)
        return False


def _numpy_sgd(X, y, coef, intercept, eta, batch, n_steps):  # type: ignore[no-untyped-def]
    coef, intercept = coef.astype(np.float64), intercept.astype(np.float64)
    bounds = [(s, min(s + batch, len(X))) for s in range(0, len(X), batch)]
    for k in range(n_steps):
        s, e = bounds[k % len(bounds)]
        d = X[s:e] @ coef + intercept - y[s:e, None]
        g = 2 * d / (e - s)
        coef = coef - eta * X[s:e].T @ g
        intercept = intercept - eta * g.sum(0)
    return coef, intercept


def test_ctrl_c_stops_after_the_current_step():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5], dtype=np.float32) + 0.3).astype(np.float32)
    coef0 = rng.standard_normal((3, 1)).astype(np.float32) * 0.1
    b0 = np.zeros(1, dtype=np.float32)
    trainer = OrtGradientOptimizer(
        add_loss_output(_linear(coef0, b0)),
        max_iter=10,
        batch_size=10,
        learning_rate=0.05,
        shuffle=False,
        callbacks=[_InterruptAfterEpoch(epoch=1)],
    )
    # its own category, a RuntimeWarning as the warning always was
    assert issubclass(TrainingInterruptedWarning, RuntimeWarning)
    with pytest.warns(TrainingInterruptedWarning, match="interrupted"):
        trainer.fit(X, y)
    # two full epochs (4 steps each) then one step of the third before the loop noticed
    assert trainer.n_iter_ == 2
    assert len(trainer.train_losses_) == 2
    coef, intercept = _numpy_sgd(X, y, coef0, b0, 0.05, 10, n_steps=2 * 4 + 1)
    state = trainer.get_state()
    np.testing.assert_allclose(state["coef"], coef, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["intercept"], intercept, rtol=1e-4, atol=1e-6)
    # the handler is gone after fit: the default one raises KeyboardInterrupt again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
