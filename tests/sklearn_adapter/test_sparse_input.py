"""Sparse X (issue 18 item 7): the SGD and MLP drop-ins take scipy.sparse matrices as
scikit-learn's do, kept in CSR and densified one batch at a time (memory O(batch)), predictions
in chunks. References: scikit-learn's per-sample SGD steps on the same sparse matrix, and the
same estimator on the dense matrix (checked against scikit-learn elsewhere)."""

from __future__ import annotations

import tracemalloc
import warnings
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier, SGDRegressor

import ort_train_sklearn._base as base
from ort_train_sklearn import (
    OnnxModelRegressor,
    OrtMLPClassifier,
    OrtMLPRegressor,
    OrtSGDClassifier,
    OrtSGDRegressor,
)

TRAININGS = ["full", "partial"]


def _data(n: int = 120, d: int = 12, density: float = 0.3) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = sp.random(n, d, density=density, format="csr", random_state=1, dtype=np.float64)
    X.data = rng.standard_normal(X.nnz)
    y = X @ rng.standard_normal(d) + 0.1 * rng.standard_normal(n)
    return X, y, (y > np.median(y)).astype(int)


@pytest.mark.parametrize("training", TRAININGS)
@pytest.mark.parametrize(
    ("ours", "theirs", "target"),
    [(OrtSGDRegressor, SGDRegressor, "y"), (OrtSGDClassifier, SGDClassifier, "labels")],
)
def test_sgd_steps_on_sparse_x_as_scikit_learn(training: str, ours: Any, theirs: Any, target: str) -> None:
    """One row per step, rows in order, constant step, l2 penalty: scikit-learn's sparse path
    gives the same coefficients and intercept (whose steps both damp by 0.01 on sparse X)."""
    X, y, labels = _data()
    params: dict[str, Any] = dict(learning_rate="constant", eta0=0.01, max_iter=3, tol=None, shuffle=False)
    params.update(alpha=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        got = ours(batch_size=1, training=training, **params).fit(X, y if target == "y" else labels)
        ref = theirs(**params).fit(X, y if target == "y" else labels)
    np.testing.assert_allclose(got.coef_, ref.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.intercept_, ref.intercept_, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(got.predict(X), ref.predict(X), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("training", TRAININGS)
@pytest.mark.parametrize("estimator", [OrtSGDRegressor, OrtSGDClassifier, OrtMLPRegressor, OrtMLPClassifier])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_fit_equals_dense_fit(training: str, estimator: Any, fmt: str) -> None:
    """Shuffled batches and early stopping: the sparse matrix (any format) trains exactly as
    its dense array, and predicts the same (the SGD estimators without an intercept)."""
    X, y, labels = _data()
    target = labels if estimator in (OrtSGDClassifier, OrtMLPClassifier) else y
    params: dict[str, Any] = dict(random_state=0, max_iter=4, training=training, early_stopping=True)
    if estimator in (OrtMLPRegressor, OrtMLPClassifier):
        params["hidden_layer_sizes"] = (5,)
    else:  # the SGD estimators damp the intercept's steps on sparse X, as scikit-learn's
        params["fit_intercept"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        dense = estimator(**params).fit(X.toarray(), target)
        sparse = estimator(**params).fit(X.asformat(fmt), target)
    np.testing.assert_allclose(sparse.loss_curve_, dense.loss_curve_, rtol=1e-6)
    np.testing.assert_allclose(sparse.validation_scores_, dense.validation_scores_, rtol=1e-6)
    np.testing.assert_array_equal(sparse.predict(X.asformat(fmt)), dense.predict(X.toarray()))


def test_sparse_prediction_goes_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk of 7 rows (12 features): predictions over 120 rows equal the dense ones."""
    X, y, _ = _data()
    est = OrtSGDRegressor(random_state=0, max_iter=3, tol=None).fit(X, y)
    expected = est.predict(X.toarray())
    monkeypatch.setattr(base, "PREDICT_CHUNK_VALUES", 7 * 12)
    est._sessions = {}
    np.testing.assert_allclose(est.predict(X), expected, rtol=1e-6)
    assert np.isclose(est.score(X, y), est.score(X.toarray(), y))


def test_sparse_x_is_never_densified_whole() -> None:
    """20000 x 4000 at density 1e-4: 320 MB dense in float32, 1 MB sparse. Fit (batches of 625
    rows: 10 MB) and predict (chunks of 1048 rows: 16 MB) stay far below the dense size."""
    X = sp.random(20_000, 4_000, density=1e-4, format="csr", random_state=0, dtype=np.float32)
    y = np.asarray(X.sum(axis=1)).ravel()
    tracemalloc.start()
    try:
        est = OrtSGDRegressor(random_state=0, max_iter=2, tol=None).fit(X, y)
        predicted = est.predict(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert predicted.shape == (20_000,)
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_sparse_x_refused_where_densifying_is_not_offered() -> None:
    """A given ONNX model may take several inputs or other ranks: OnnxModel* keep dense X."""
    from sklearn.linear_model import LinearRegression

    X, y, _ = _data()
    est = OnnxModelRegressor(model=LinearRegression().fit(X.toarray(), y), max_iter=1)
    with pytest.raises(TypeError, match=r"[Ss]parse"):
        est.fit(X, y)
