"""Callbacks start every fit afresh: a user's EarlyStopping (or any callback resetting in
``on_train_begin``) stops a repeated fit where it stopped the first one, a warm-started fit counts
its own epochs, and resume() replays the checkpointed run's history into it, as it does for the
built-in early stopping (``tol``). The stopping epochs are checked against the rule written out
in plain Python over the recorded losses. on_batch_end gets each step's loss (checked against
numpy SGD) and on_train_end ends every fit, however it ends."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest
from core_models import build_linear, initializers, linear_sgd_reference

from ort_train_core import (
    Callback,
    ConvergenceError,
    EarlyStopping,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core import _data as data_module
from ort_train_core.exceptions import TrainingInterruptedWarning

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


class _BatchLosses(Callback):
    def on_train_begin(self, trainer: Any, n_epochs: int) -> None:
        self.seen: list[tuple[int, int, float]] = []

    def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
        self.seen.append((epoch, batch, loss))


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("loop", LOOPS)
def test_on_batch_end_gets_each_step_loss(loop: str, resident: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step's objective before its update, in order, also where the losses stay on the
    device until the epoch's end (the CUDA path, run here on CPU)."""
    if resident:
        monkeypatch.setattr(data_module, "DEVICE_RESIDENT_KINDS", {"cpu", "cuda"})
    X, y = _data()  # 40 rows: four batches of 10
    hook = _BatchLosses()
    trainer = _trainer(loop, max_iter=2, batch_size=10, callbacks=[hook]).fit(X, y)
    assert [(e, b) for e, b, _ in hook.seen] == [(e, b) for e in range(2) for b in range(4)]
    # numpy SGD over the rows twice in a row (the two epochs); the reference returns the mean
    # loss of the first k batches, so batch k's loss is the difference of two running sums
    w0, X2, y2 = initializers(build_linear()), np.concatenate([X, X]), np.concatenate([y, y])
    sums = [
        10 * k * linear_sgd_reference(w0, X2[: 10 * k], y2[: 10 * k], eta=0.02, batch_size=10, epochs=1)[1][0]
        for k in range(1, 9)
    ]
    np.testing.assert_allclose([loss for *_, loss in hook.seen], np.diff([0.0, *sums]) / 10, rtol=2e-5)
    epoch_means = [np.mean([loss for e, _, loss in hook.seen if e == epoch]) for epoch in range(2)]
    np.testing.assert_allclose(trainer.train_losses_, epoch_means, rtol=1e-6)


class _Events(Callback):
    def __init__(self, events: list[str], fail_at: int | None = None, stop_at: int | None = None) -> None:
        self.events, self.fail_at, self.stop_at = events, fail_at, stop_at

    def on_train_begin(self, trainer: Any, n_epochs: int) -> None:
        self.events.append("begin")

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, float]) -> bool:
        self.events.append("epoch")
        if epoch == self.fail_at:
            raise RuntimeError("a callback failed")
        if epoch == 0 and self.stop_at == -1:
            os.kill(os.getpid(), signal.SIGINT)
        return epoch == self.stop_at

    def on_train_end(self, trainer: Any) -> None:
        self.events.append("end")


@pytest.fixture
def _sigint_delivered():  # type: ignore[no-untyped-def]
    """Python's own SIGINT handler (a suite started in the background inherits it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("_sigint_delivered")
@pytest.mark.parametrize("end", ["max_iter", "early stop", "ctrl-c", "divergence", "callback error"])
@pytest.mark.parametrize("loop", LOOPS)
def test_on_train_end_ends_every_fit(loop: str, end: str) -> None:
    """on_train_end is called once, last, whatever ends the fit; Ctrl-C is told by its own
    warning category (a RuntimeWarning, as before)."""
    events: list[str] = []
    X, y = _data()
    settings: dict[str, Any] = {
        "max_iter": {},
        "early stop": {"stop_at": 1},
        "ctrl-c": {"stop_at": -1},
        "divergence": {},
        "callback error": {"fail_at": 1},
    }
    callback = _Events(events, **settings[end])
    trainer = _trainer(loop, max_iter=3, batch_size=10, callbacks=[callback])
    if end == "divergence":
        with pytest.raises(ConvergenceError):
            trainer.fit(X * np.float32(1e18), y)
    elif end == "callback error":
        with pytest.raises(RuntimeError, match="a callback failed"):
            trainer.fit(X, y)
    elif end == "ctrl-c":
        with pytest.warns(TrainingInterruptedWarning, match="interrupted"):
            trainer.fit(X, y)
        assert issubclass(TrainingInterruptedWarning, RuntimeWarning)
    else:
        trainer.fit(X, y)
    n_epochs = {"max_iter": 3, "early stop": 2, "ctrl-c": 1, "divergence": 0, "callback error": 2}[end]
    assert events == ["begin", *["epoch"] * n_epochs, "end"]
