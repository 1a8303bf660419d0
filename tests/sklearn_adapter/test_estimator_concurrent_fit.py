"""One estimator, one fit at a time (issue 26 item 10): the scikit-learn estimators build a new
trainer at each fit, so the trainer's guard alone could not see two fits of one estimator; fit,
partial_fit and resume are refused while another runs (on another thread, or on this one from
inside a step callback). Deterministic: the second call is made from the first one's callback."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import SGDRegressor

from ort_train_core import Callback
from ort_train_sklearn import OrtSGDRegressor

PARAMS = dict(max_iter=3, tol=None, shuffle=False, learning_rate="invscaling", eta0=0.02, alpha=0.01)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    return X, X @ np.array([1.0, -0.5, 0.25]) + 0.1


class _CallsAgain(Callback):
    """At the first step's end, calls ``method`` of the estimator on another thread (joined
    here) or on this one; records what it raised."""

    def __init__(self, estimator: Any, method: str, on_thread: bool) -> None:
        self.estimator, self.method, self.on_thread = estimator, method, on_thread
        self.errors: list[BaseException | None] = []
        self.started = False

    def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
        if self.started:
            return
        self.started = True
        X, y = _data()

        def other() -> None:
            try:
                getattr(self.estimator, self.method)(X, y)
                self.errors.append(None)
            except BaseException as exc:  # recorded for the test thread
                self.errors.append(exc)

        if self.on_thread:
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
        else:
            other()


@pytest.mark.parametrize("on_thread", [True, False], ids=["other-thread", "callback"])
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_a_second_fit_of_one_estimator_is_refused(method: str, on_thread: bool) -> None:
    X, y = _data()
    est = OrtSGDRegressor(batch_size=1, **PARAMS)
    cb = _CallsAgain(est, method, on_thread)
    est._step_callback = lambda first: cb  # a step callback, as 'average' installs one
    est.fit(X, y)
    (error,) = cb.errors
    assert isinstance(error, RuntimeError)
    name = f"OrtSGDRegressor (id 0x{id(est):x})"
    if on_thread:
        assert f"{name}: fit is already running on another thread, so {method} is refused" in str(error)
    else:
        assert f"{name}: {method} was called from inside one of its own callbacks" in str(error)
    # the first fit ran on alone: scikit-learn's SGD with one row a step
    theirs = SGDRegressor(**PARAMS).fit(X, y)
    np.testing.assert_allclose(est.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)
    del est._step_callback
    est.partial_fit(X, y)  # and the estimator fits again afterwards
