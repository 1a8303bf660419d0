"""Sparse X of short rows (text-like data, issue 30 item 8): the SGD estimators train and
predict on its padded-row form (ort_train_sklearn._sparse), a gather of the rows' weights
and a scatter of their gradients, over the same weights as the dense graph. References: the
same estimator on the dense array (the densifying path, checked against scikit-learn
elsewhere), and scikit-learn's per-sample SGD on the same sparse matrix. Both gradient
backends run each case (``backend=``)."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier, SGDRegressor

import ort_train_sklearn._base as base
from backend_support import BOTH
from ort_train_sklearn import OrtSGDClassifier, OrtSGDRegressor


def _wide(n: int = 240, d: int = 300, density: float = 0.02, seed: int = 0) -> tuple[Any, np.ndarray]:
    """Rows of about 6 stored values among 300 columns (the longest about 14): padded rows."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=seed + 1, dtype=np.float64)
    X.data = rng.standard_normal(X.nnz)
    y = X @ rng.standard_normal(d) + 0.1 * rng.standard_normal(n)
    return X, y


def _labels(y: np.ndarray, n_classes: int) -> np.ndarray:
    out: np.ndarray = np.digitize(y, np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1]))
    return out


def _fit(make: Any, X: Any, y: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return make().fit(X, y)


CASES = [
    (OrtSGDRegressor, {}, 0),
    (OrtSGDClassifier, {}, 2),
    # 'optimal' rates drive the log loss into margins of 20, where other roundings of the same
    # sums part trajectories by 1e-2: compared at a constant rate
    (OrtSGDClassifier, {"loss": "log_loss", "learning_rate": "constant", "eta0": 0.01}, 3),
    (OrtSGDRegressor, {"average": True, "early_stopping": True}, 0),
    (OrtSGDClassifier, {"training": "partial", "penalty": "elasticnet"}, 2),
    (OrtSGDClassifier, {"training": "partial", "early_stopping": True}, 3),
]


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize(("estimator", "params", "n_classes"), CASES)
def test_padded_fit_equals_dense_fit(
    backend: str, estimator: Any, params: dict[str, Any], n_classes: int
) -> None:
    """Shuffled batches, every step on the padded rows: the coefficients, loss curve and
    validation scores of the dense array's fit (to float32 rounding of other sums). Without an
    intercept: on sparse X its steps are damped, as scikit-learn's (test below)."""
    X, y = _wide()
    target = _labels(y, n_classes) if n_classes else y
    kwargs = dict(random_state=0, max_iter=5, backend=backend, fit_intercept=False, **params)
    sparse = _fit(lambda: estimator(**kwargs), X, target)
    dense = _fit(lambda: estimator(**kwargs), X.toarray(), target)
    assert sparse._trains_padded
    assert not dense._trains_padded
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sparse.intercept_, dense.intercept_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sparse.loss_curve_, dense.loss_curve_, rtol=1e-5)
    if params.get("early_stopping"):
        np.testing.assert_allclose(sparse.validation_scores_, dense.validation_scores_, atol=1e-9)


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize(
    ("ours", "theirs", "n_classes"),
    [(OrtSGDRegressor, SGDRegressor, 0), (OrtSGDClassifier, SGDClassifier, 2)],
)
def test_padded_steps_as_scikit_learn(backend: str, ours: Any, theirs: Any, n_classes: int) -> None:
    """One row per step in order, constant rate, l2: scikit-learn's sparse SGD gives the same
    coefficients and intercept, whose steps it damps by 0.01 on sparse X."""
    X, y = _wide(n=120)
    target = _labels(y, n_classes) if n_classes else y
    params: dict[str, Any] = dict(learning_rate="constant", eta0=0.01, max_iter=3, tol=None, shuffle=False)
    params.update(alpha=0.01)
    got = _fit(lambda: ours(batch_size=1, backend=backend, **params), X, target)
    ref = _fit(lambda: theirs(**params), X, target)
    assert got._trains_padded
    np.testing.assert_allclose(got.coef_, ref.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.intercept_, ref.intercept_, rtol=1e-4, atol=1e-7)


def test_padded_defaults_reach_scikit_learns_accuracy() -> None:
    """Default parameters on 1500 x 2000 rows of 8 stored values: test accuracy within 0.03 of
    SGDClassifier's."""
    X, y = _wide(n=2000, d=2000, density=0.004, seed=3)
    labels = (y > 0).astype(int)
    ours = _fit(lambda: OrtSGDClassifier(random_state=0), X[:1500], labels[:1500])
    ref = _fit(lambda: SGDClassifier(random_state=0), X[:1500], labels[:1500])
    assert ours._trains_padded
    assert ours.score(X[1500:], labels[1500:]) >= ref.score(X[1500:], labels[1500:]) - 0.03


@pytest.mark.parametrize("chunk", [5, 70])
@pytest.mark.parametrize("n_classes", [0, 2, 3])
def test_sparse_predictions_equal_dense_ones(
    monkeypatch: pytest.MonkeyPatch, n_classes: int, chunk: int
) -> None:
    """Predictions on the sparse matrix run the padded-row graph in chunks of about ``chunk``
    slots (5: one row a chunk): they equal the dense array's, and the decision values from
    coef_ in float64."""
    X, y = _wide()
    target = _labels(y, n_classes) if n_classes else y
    est = _fit(
        lambda: (OrtSGDClassifier if n_classes else OrtSGDRegressor)(random_state=0, max_iter=3), X, target
    )
    monkeypatch.setattr(base, "PREDICT_CHUNK_VALUES", chunk)
    est._sessions = {}
    dense = X.toarray()
    if n_classes:
        np.testing.assert_array_equal(est.predict(X), est.predict(dense))
    else:
        np.testing.assert_allclose(est.predict(X), est.predict(dense), rtol=1e-5, atol=1e-6)
    reference = dense @ np.atleast_2d(est.coef_).T + est.intercept_
    if n_classes:
        np.testing.assert_allclose(
            est.decision_function(X), est.decision_function(dense), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(est.decision_function(X), reference.squeeze(), rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_allclose(est.predict(X), reference.ravel(), rtol=1e-4, atol=1e-5)
    assert any(kind.startswith("padded") for kind in est._sessions)


def test_long_rows_take_the_densifying_path() -> None:
    """Rows of more than n_features / PADDED_SLOT_COST stored values train faster densified: a
    12-column matrix of 4-value rows does, and still equals the dense fit (without the intercept,
    damped on sparse X)."""
    X, y = _wide(n=120, d=12, density=0.3)
    sparse = _fit(lambda: OrtSGDRegressor(random_state=0, max_iter=3, fit_intercept=False), X, y)
    dense = _fit(lambda: OrtSGDRegressor(random_state=0, max_iter=3, fit_intercept=False), X.toarray(), y)
    assert not sparse._trains_padded
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=1e-6)


def test_partial_fit_switches_between_forms() -> None:
    """A stream of sparse, dense, sparse chunks continues one optimisation, as the dense
    stream does (the trainer is rebuilt, its progress kept, at each change of form; rows in
    order: a rebuilt trainer draws its own shuffling; no intercept, damped on sparse X)."""
    X, y = _wide(n=300)
    labels = _labels(y, 2)
    chunks = [slice(0, 100), slice(100, 200), slice(200, 300)]
    params = dict(shuffle=False, fit_intercept=False)
    mixed, dense = OrtSGDClassifier(**params), OrtSGDClassifier(**params)
    for k, rows in enumerate(chunks):
        mixed.partial_fit(X[rows] if k != 1 else X[rows].toarray(), labels[rows], classes=[0, 1])
        dense.partial_fit(X[rows].toarray(), labels[rows], classes=[0, 1])
    assert mixed._trains_padded
    np.testing.assert_allclose(mixed.coef_, dense.coef_, rtol=1e-5, atol=1e-6)
    assert mixed.t_ == dense.t_


def test_pickled_padded_estimator_predicts() -> None:
    """The padded-trained estimator pickles without its sessions and predicts the same."""
    X, y = _wide()
    est = _fit(lambda: OrtSGDRegressor(random_state=0, max_iter=3), X, y)
    expected = est.predict(X)
    np.testing.assert_allclose(pickle.loads(pickle.dumps(est)).predict(X), expected, rtol=1e-6)


def test_padded_fit_resumes_from_its_checkpoint(tmp_path: Any) -> None:
    """Three epochs checkpointed, then resume() to six: the weights of an uninterrupted six-epoch
    fit; other rows are refused (the checkpoint's fingerprint is the CSR matrix's)."""
    X, y = _wide()
    labels = _labels(y, 2)
    params: dict[str, Any] = dict(random_state=0, tol=None)
    full = _fit(lambda: OrtSGDClassifier(max_iter=6, **params), X, labels)
    _fit(lambda: OrtSGDClassifier(max_iter=3, checkpoint_dir=str(tmp_path), **params), X, labels)
    resumed = OrtSGDClassifier(max_iter=6, checkpoint_dir=str(tmp_path), **params).resume(X, labels)
    assert resumed._trains_padded
    np.testing.assert_array_equal(resumed.coef_, full.coef_)
    with pytest.raises(ValueError, match="other data"):
        OrtSGDClassifier(max_iter=6, checkpoint_dir=str(tmp_path), **params).resume(X[:100], labels[:100])
