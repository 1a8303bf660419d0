"""Callbacks start every fit afresh: a user's EarlyStopping (or any callback resetting in
``on_train_begin``) stops a repeated fit where it stopped the first one, a warm-started fit counts
its own epochs, and resume() replays the checkpointed run's history into it, as it does for the
built-in early stopping (``tol``). The stopping epochs are checked against the rule written out
in plain Python over the recorded losses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_models import build_linear

from ort_train_core import (
    Callback,
    EarlyStopping,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

TOL, PATIENCE = 1e-3, 3
LOOPS = ["full", "partial"]


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    X = rng.standard_normal((40, 3)).astype(np.float32)
    noise = 0.3 * rng.standard_normal(40)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3 + noise).astype(np.float32).reshape(-1, 1)
    return X, y


def _trainer(loop: str, **kwargs: Any) -> Any:
    common: dict[str, Any] = {"batch_size": 8, "learning_rate": 0.02, "shuffle": False, "max_iter": 60}
    common.update(kwargs)
    if loop == "full":
        return OrtGradientOptimizer(add_loss_output(build_linear()), **common)
    return OrtGradientForwardBackwardOptimizer(build_linear(), **common)


def _epochs_until_stop(losses: list[float], tol: float, patience: int) -> int:
    """scikit-learn's rule from a fresh start: the epoch count at which ``patience`` epochs in
    a row have not beaten the best loss so far by ``tol``; len(losses) if that never happens."""
    best, bad = float("inf"), 0
    for epoch, loss in enumerate(losses, start=1):
        bad = bad + 1 if loss > best - tol else 0
        best = min(best, loss)
        if bad >= patience:
            return epoch
    return len(losses)


@pytest.mark.parametrize("validation", [False, True])
@pytest.mark.parametrize("loop", LOOPS)
def test_user_early_stopping_restarts_with_each_fit(loop: str, validation: bool) -> None:
    X, y = _data()
    extra = dict(X_val=X[:10] + 0.05, y_val=y[:10]) if validation else {}
    stopper = EarlyStopping(TOL, PATIENCE)
    trainer = _trainer(loop, callbacks=[stopper])
    first = trainer.fit(X, y, **extra).n_iter_
    monitored = trainer.validation_losses_ if validation else trainer.train_losses_
    assert first == _epochs_until_stop(monitored, TOL, PATIENCE) < 60
    losses = list(trainer.train_losses_)
    second = trainer.fit(X, y, **extra).n_iter_  # the same fit again: the same run
    assert second == first
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=1e-6)


@pytest.mark.parametrize("loop", LOOPS)
def test_warm_start_fit_counts_its_own_epochs(loop: str) -> None:
    """A warm-started fit continues the weights and the history; the patience counts from
    that fit's first epoch (as the built-in early stopping and scikit-learn's SGD do)."""
    X, y = _data()
    trainer = _trainer(loop, callbacks=[EarlyStopping(TOL, PATIENCE)], warm_start=True)
    first = trainer.fit(X, y).n_iter_
    trainer.fit(X, y)
    second = trainer.n_iter_ - first
    assert second == _epochs_until_stop(trainer.train_losses_[first:], TOL, PATIENCE) >= PATIENCE


@pytest.mark.parametrize("loop", LOOPS)
def test_user_early_stopping_is_replayed_on_resume(tmp_path: Any, loop: str) -> None:
    """A fit cut at max_iter=k and resumed stops at the epoch the uninterrupted fit stops at:
    the user's EarlyStopping gets the checkpointed losses as the built-in one does."""
    X, y = _data()
    straight = _trainer(loop, callbacks=[EarlyStopping(TOL, PATIENCE)]).fit(X, y)
    expected = _epochs_until_stop(straight.train_losses_, TOL, PATIENCE)
    assert straight.n_iter_ == expected > 4
    _trainer(loop, max_iter=expected - 2, checkpoint_dir=tmp_path).fit(X, y)
    resumed = _trainer(loop, checkpoint_dir=tmp_path, callbacks=[EarlyStopping(TOL, PATIENCE)])
    assert resumed.resume(X, y).n_iter_ == expected
    np.testing.assert_allclose(resumed.train_losses_, straight.train_losses_, rtol=1e-6)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_callback_sees_each_fit_from_its_start(loop: str) -> None:
    """on_train_begin comes first in every fit, with that fit's epoch count, and on_epoch_end
    then numbers the epochs of the trainer's history (the documented lifecycle)."""
    events: list[tuple[str, int]] = []

    class Record(Callback):
        def on_train_begin(self, trainer: Any, n_epochs: int) -> None:
            events.append(("begin", n_epochs))

        def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, float]) -> bool:
            events.append(("epoch", epoch))
            return False

        def on_train_end(self, trainer: Any) -> None:
            events.append(("end", trainer.n_iter_))

    X, y = _data()
    trainer = _trainer(loop, max_iter=2, callbacks=[Record()], warm_start=True)
    trainer.fit(X, y)
    trainer.fit(X, y)
    expected = [("begin", 2), ("epoch", 0), ("epoch", 1), ("end", 2)]
    expected += [("begin", 2), ("epoch", 2), ("epoch", 3), ("end", 4)]
    assert events == expected
