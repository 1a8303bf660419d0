"""Live estimators hold no idle thread pools: the prediction and validation sessions of small
models run on one thread (the training steps' rule, ``_binding.CPU_ONE_THREAD_MAX_WORK``), large
inputs get onnxruntime's pool."""

from __future__ import annotations

import gc
import os
import pathlib

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_regression
from sklearn.exceptions import ConvergenceWarning

from ort_train_core import _binding
from ort_train_sklearn import OrtMLPClassifier, OrtSGDClassifier, OrtSGDRegressor

TASKS = pathlib.Path("/proc/self/task")
needs_proc = pytest.mark.skipif(not TASKS.is_dir(), reason="counts threads through Linux's /proc")
# onnxruntime's default pool adds (cores - 1) threads: nothing to see on a one-core machine
needs_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a one-core pool has no extra thread")


def _threads() -> int:
    return len(list(TASKS.iterdir()))


@needs_proc
@needs_cores
def test_fitted_estimators_hold_no_thread_pools():
    # before: every fitted estimator's first predict made a session with a pool of
    # (cores - 1) threads, kept as long as the estimator (60 estimators: 63 threads on 2 cores)
    X, y = load_iris(return_X_y=True)
    # no cached session may close (and end its threads) while the fits run
    _binding._SESSIONS.clear()
    gc.collect()
    before = _threads()
    kept = []
    for i in range(6):
        # another feature count each time: new graphs and sessions, none from a cache
        Xi = X[:, : 1 + i % 4] if i < 4 else np.hstack([X, X[:, : i - 3]])
        model = OrtSGDClassifier(random_state=i).fit(Xi, y)
        model.predict(Xi)
        model.decision_function(Xi)
        kept.append(model)
    mlp = OrtMLPClassifier(hidden_layer_sizes=(7,), max_iter=5, early_stopping=True, random_state=0)
    with pytest.warns(ConvergenceWarning):  # 5 epochs
        mlp.fit(X, y)
    mlp.predict_proba(X)
    kept.append(mlp)
    assert _threads() == before


def test_large_inputs_get_the_default_pool_with_the_same_predictions(monkeypatch):
    X, y = make_regression(n_samples=300, n_features=6, random_state=0)
    model = OrtSGDRegressor(random_state=0).fit(X, y)
    expected = X @ model.coef_ + model.intercept_  # numpy's prediction from the fitted weights
    small = model.predict(X)
    # the cut-off below 300 rows x 7 weights: the same graph on onnxruntime's pool
    monkeypatch.setattr(_binding, "CPU_ONE_THREAD_MAX_WORK", 100)
    large = model.predict(X)
    np.testing.assert_allclose(small, expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(large, expected, rtol=1e-4, atol=1e-3)
    assert set(model._sessions["raw"].by_threads) == {1, None}
