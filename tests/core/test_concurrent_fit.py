"""One trainer, one fit at a time (issue 26 item 10): two threads fitting one trainer returned
without error and weights unlike a sequential fit, and a callback could start a fit of its own
trainer. Both are refused with a RuntimeError; the tests are deterministic: the second fit is
started from inside the first one's callback (on another thread, joined there, or re-entrantly)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from core_models import build_linear, initializers, linear_sgd_reference

from ort_train_core import (
    Callback,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    SquareLearningLoss,
    add_loss_output,
)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((12, 3)).astype(np.float32)
    return X, (X @ np.array([0.5, -1.0, 2.0]) + 0.1).astype(np.float32)


def _trainer(kind: str, callbacks: list[Callback]) -> Any:
    common: dict[str, Any] = dict(
        max_iter=3, batch_size=4, learning_rate=0.05, shuffle=False, callbacks=callbacks
    )
    if kind == "full":
        return OrtGradientOptimizer(add_loss_output(build_linear(seed=5)), **common)
    return OrtGradientForwardBackwardOptimizer(
        build_linear(seed=5), learning_loss=SquareLearningLoss(), **common
    )


class _StartsAnotherFit(Callback):
    """At the first batch's end, fits the same trainer: on another thread (joined before the
    callback returns) or on this one (re-entrantly); records what that fit raised."""

    def __init__(self, on_thread: bool, method: str = "fit") -> None:
        self.on_thread = on_thread
        self.method = method
        self.errors: list[BaseException | None] = []
        self.started = False

    def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
        if self.started:  # once: the other fit (if it runs) calls this callback too
            return
        self.started = True
        X, y = _data()

        def other() -> None:
            try:
                getattr(trainer, self.method)(X, y)
                self.errors.append(None)
            except BaseException as exc:  # recorded for the test thread
                self.errors.append(exc)

        if self.on_thread:
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
        else:
            other()


def _check_weights(trainer: Any) -> None:
    """The trainer's weights are numpy's SGD on the same batches: the first fit ran on alone."""
    X, y = _data()
    expected, _ = linear_sgd_reference(
        initializers(build_linear(seed=5)), X, y, eta=0.05, batch_size=4, epochs=3
    )
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["full", "partial"])
def test_a_fit_from_another_thread_is_refused_and_the_running_one_is_unchanged(kind: str) -> None:
    cb = _StartsAnotherFit(on_thread=True)
    trainer = _trainer(kind, [cb])
    X, y = _data()
    trainer.fit(X, y)
    (error,) = cb.errors
    assert isinstance(error, RuntimeError)
    name = type(trainer).__name__
    assert f"{name} (id 0x{id(trainer):x})" in str(error)
    assert "fit is already running on another thread" in str(error)
    _check_weights(trainer)
    # and the trainer fits again once the first fit has ended
    trainer.callbacks = None
    trainer.fit(X, y)


@pytest.mark.parametrize("kind", ["full", "partial"])
@pytest.mark.parametrize("method", ["fit", "resume", "prepare"])
def test_a_fit_from_inside_its_own_callback_is_refused(kind: str, method: str, tmp_path: Any) -> None:
    cb = _StartsAnotherFit(on_thread=False, method=method)
    trainer = _trainer(kind, [cb])
    trainer.checkpoint_dir = tmp_path  # resume needs one
    X, y = _data()
    trainer.fit(X, y)
    (error,) = cb.errors
    assert isinstance(error, RuntimeError)
    assert "from inside one of its own callbacks" in str(error)
    _check_weights(trainer)
