"""Initial weights holding NaN or inf are refused before any step, with the weights named and
the fix, instead of a ConvergenceError that blames the learning rate; a NaN in a constant (not
trained) initializer is named when the first step's loss is NaN. Finite weights given through
set_state then train as numpy SGD does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_models import build_linear, linear_sgd_reference

from ort_train_core import (
    ConvergenceError,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

LOOPS = ["full", "partial"]


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((20, 3)).astype(np.float32)
    return X, (X @ np.array([[1.0], [-1.0], [0.5]])).astype(np.float32)


def _trainer(loop: str, model: Any, **kwargs: Any) -> Any:
    common: dict[str, Any] = {"max_iter": 2, "batch_size": 5, "learning_rate": 0.05, "shuffle": False}
    common.update(kwargs)
    if loop == "full":
        return OrtGradientOptimizer(add_loss_output(model), **common)
    return OrtGradientForwardBackwardOptimizer(model, **common)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("loop", LOOPS)
def test_non_finite_initial_weights_are_named(loop: str, bad: float) -> None:
    coef = np.array([[1.0], [bad], [bad]], dtype=np.float32)
    X, y = _data()
    trainer = _trainer(loop, build_linear(coef=coef))
    with pytest.raises(ValueError, match=r"'coef' \(2 of 3 values\).*before any training step") as info:
        trainer.fit(X, y)
    message = str(info.value)
    assert "intercept" not in message  # only the weights at fault
    assert "learning rate" not in message.split(":")[0]
    assert "set_state" in message
    assert "re-initialise" in message


@pytest.mark.parametrize("loop", LOOPS)
def test_set_state_with_finite_weights_then_trains_as_numpy(loop: str) -> None:
    coef = np.full((3, 1), np.nan, dtype=np.float32)
    X, y = _data()
    trainer = _trainer(loop, build_linear(coef=coef), warm_start=True)
    start = {"coef": np.array([[0.1], [0.2], [0.3]], dtype=np.float32), "intercept": np.zeros(1, np.float32)}
    trainer.set_state(start)
    trainer.fit(X, y)
    expected, history = linear_sgd_reference(start, X, y, eta=0.05, batch_size=5, epochs=2)
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=1e-5)


@pytest.mark.parametrize("loop", LOOPS)
def test_nan_in_a_constant_initializer_is_named(loop: str) -> None:
    """coef is frozen (weights_to_train=['intercept']) and holds a NaN: the loss is NaN at the
    first step; the error names the constant rather than only the learning rate."""
    coef = np.array([[1.0], [np.nan], [0.5]], dtype=np.float32)
    X, y = _data()
    trainer = _trainer(loop, build_linear(coef=coef), weights_to_train=["intercept"])
    with pytest.raises(ConvergenceError, match=r"not trained.*'coef' \(1 of 3 values\) hold NaN"):
        trainer.fit(X, y)
