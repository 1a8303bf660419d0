"""A stream of ``partial_fit`` calls (issue 30 item 9) builds its trainer, its step runner and
their sessions on the first call only (the later calls took 4.7-11x scikit-learn's time, half
of it building them again), and trains exactly as when every call built its own runner; with one
step a call, as numpy's batch gradient step."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_classification, make_regression
from sklearn.preprocessing import scale
from sklearn.utils._param_validation import InvalidParameterError

from call_counts import count_calls
from ort_train_core import _binding, _fit_loop
from ort_train_sklearn import OrtSGDClassifier, OrtSGDRegressor, _base

ROWS = 40


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts of trainer, runner and onnxruntime session builds."""
    counts: collections.Counter[str] = collections.Counter()

    count_calls(monkeypatch, counts, _base.OrtEstimatorMixin, "_make_trainer")
    count_calls(monkeypatch, counts, _fit_loop.BaseOrtTrainer, "_new_runner")
    count_calls(monkeypatch, counts, _binding, "_new_session")
    return counts


def _stream(kind: str) -> tuple[Any, np.ndarray, np.ndarray, dict[str, Any]]:
    if kind == "regressor":
        X, y = make_regression(6 * ROWS, 5, noise=1.0, random_state=0)
        return OrtSGDRegressor, scale(X), y / y.std(), {}
    n_classes = 2 if kind == "binary" else 3
    X, y = make_classification(6 * ROWS, 5, n_informative=3, n_classes=n_classes, random_state=0)
    return OrtSGDClassifier, scale(X), y, {"classes": np.arange(n_classes)}


def _fit_stream(make: Any, X: np.ndarray, y: np.ndarray, extra: dict[str, Any], **params: Any) -> Any:
    est = make(random_state=0, **params)
    for start in range(0, len(X), ROWS):
        est.partial_fit(X[start : start + ROWS], y[start : start + ROWS], **extra)
    return est


@pytest.mark.parametrize("training", ["full", "partial"])
@pytest.mark.parametrize("kind", ["regressor", "binary", "ovr"])
def test_a_partial_fit_stream_builds_on_its_first_call_only(
    kind: str, training: str, builds: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make, X, y, extra = _stream(kind)
    est = make(random_state=0, training=training).partial_fit(X[:ROWS], y[:ROWS], **extra)
    assert builds["_make_trainer"] == 1
    assert builds["_new_runner"] == 1
    builds.clear()
    for start in range(ROWS, len(X), ROWS):
        est.partial_fit(X[start : start + ROWS], y[start : start + ROWS], **extra)
    assert dict(builds) == {}, f"later partial_fit calls built {dict(builds)}"
    # every call building its runner (none kept) trains the same, exactly
    monkeypatch.setattr(_fit_loop, "KEEP_RUNNER_MAX_BYTES", 0)
    rebuilt = _fit_stream(make, X, y, extra, training=training)
    assert builds["_new_runner"] == 6
    np.testing.assert_array_equal(est.coef_, rebuilt.coef_)
    np.testing.assert_array_equal(est.intercept_, rebuilt.intercept_)
    assert est.loss_curve_ == rebuilt.loss_curve_
    assert est.t_ == rebuilt.t_
    # the parameters, checked once while they stay the same, are checked again once changed
    est.alpha = -1.0
    with pytest.raises(InvalidParameterError, match="alpha"):
        est.partial_fit(X[:ROWS], y[:ROWS], **extra)


def test_one_step_a_call_is_numpys_batch_step(builds: collections.Counter[str]) -> None:
    """A batch of the whole chunk: each call is one step of eta0 times the sum of the rows'
    gradients of scikit-learn's (p - y)^2 / 2, whatever the shuffled order."""
    _, X, y, _ = _stream("regressor")
    eta0 = 0.01
    est = _fit_stream(
        OrtSGDRegressor, X, y, {}, batch_size=ROWS, learning_rate="constant", eta0=eta0, penalty=None
    )
    assert builds["_new_runner"] == 1
    coef, intercept = np.zeros(X.shape[1]), 0.0
    for start in range(0, len(X), ROWS):
        Xc, yc = X[start : start + ROWS], y[start : start + ROWS]
        residual = Xc @ coef + intercept - yc
        coef, intercept = coef - eta0 * Xc.T @ residual, intercept - eta0 * residual.sum()
    np.testing.assert_allclose(est.coef_, coef, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(est.intercept_, [intercept], rtol=1e-5, atol=1e-6)
