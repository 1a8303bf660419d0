"""The per-call bookkeeping of a partial_fit stream (issue 30 item 9): what a call that goes
on with its trainer's graphs no longer reads again, and that the stream's results stay
scikit-learn's (the stream tests compare them step by step; here the fitted values after
the calls that skip the reads are checked against a per-sample numpy SGD)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import ort_train_core._batchnorm as batchnorm
import ort_train_core._loss_trainer as loss_trainer
from call_counts import count_calls
from ort_train_sklearn import OrtSGDRegressor


def _numpy_sgd(
    chunks: list[tuple[np.ndarray, np.ndarray]], eta0: float, rows: int
) -> tuple[np.ndarray, float]:
    """Squared-loss SGD without penalty at a constant rate, ``rows`` rows a step: each step
    moves by eta0 times the sum of its rows' gradients (scikit-learn's per-sample steps taken
    at the batch's first weights)."""
    w, b = np.zeros(chunks[0][0].shape[1]), 0.0
    for X, y in chunks:
        for k in range(0, len(y), rows):
            x = X[k : k + rows].astype(np.float64)
            r = x @ w + b - y[k : k + rows]
            w, b = w - eta0 * x.T @ r, b - eta0 * r.sum()
    return w, b


def test_a_continuing_partial_fit_reads_no_graph_metadata_nor_batchnorm_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(0)
    chunks = [(rng.normal(size=(40, 5)).astype(np.float32), rng.normal(size=40)) for _ in range(4)]
    est = OrtSGDRegressor(
        penalty=None, learning_rate="constant", eta0=0.01, batch_size=4, shuffle=False, random_state=0
    )
    for X, y in chunks[:2]:
        est.partial_fit(X, y)
    counts: collections.Counter[str] = collections.Counter()
    count_calls(monkeypatch, counts, loss_trainer, "get_metadata")
    count_calls(monkeypatch, counts, batchnorm, "training_batch_norms")
    for X, y in chunks[2:]:
        est.partial_fit(X, y)
    # before: two metadata reads (the epoch loss's weighting) and a scan of the graph's nodes
    # for training-mode BatchNormalization (needed only where a batch has 1 row) at every call
    assert (counts["get_metadata"], counts["training_batch_norms"]) == (0, 0)
    w, b = _numpy_sgd(chunks, 0.01, 4)
    np.testing.assert_allclose(est.coef_, w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(est.intercept_, [b], rtol=1e-4, atol=1e-5)
