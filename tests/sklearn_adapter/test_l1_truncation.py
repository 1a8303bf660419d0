"""The SGD estimators' L1 penalty as scikit-learn applies it (the cumulative truncated gradient
of Tsuruoka et al. 2009, which leaves exact zeros in ``coef_``), and ``sparsify`` /
``densify`` as scikit-learn's ``SparseCoefMixin``; scikit-learn is the reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.preprocessing import StandardScaler

from backend_support import BOTH
from ort_train_sklearn import OrtSGDClassifier, OrtSGDRegressor


def _scaled(load) -> tuple[np.ndarray, np.ndarray]:
    X, y = load(return_X_y=True)
    return StandardScaler().fit_transform(X), y


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("training", ["full", "partial"])
@pytest.mark.parametrize("penalty", ["l1", "elasticnet"])
def test_per_sample_l1_steps_are_scikit_learns(penalty, training, backend):
    # one row per step in row order: scikit-learn's per-sample SGD and truncation, step for step;
    # the subgradient step before left no coefficient at exactly zero here
    X, y = _scaled(load_breast_cancer)
    params = dict(penalty=penalty, alpha=1e-2, l1_ratio=0.5, random_state=0, shuffle=False)
    params.update(max_iter=5, tol=None)
    theirs = SGDClassifier(**params).fit(X, y)
    ours = OrtSGDClassifier(batch_size=1, training=training, backend=backend, **params).fit(X, y)
    assert (theirs.coef_ == 0).sum() >= 9
    np.testing.assert_array_equal(ours.coef_ == 0, theirs.coef_ == 0)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-5 * np.abs(theirs.coef_).max())
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("penalty", "low"), [("l1", 200), ("elasticnet", 85)])
def test_zero_count_and_score_near_scikit_learns_on_digits(penalty, low):
    # default parameters (batch_size='auto'): 30 zeros against scikit-learn's 227 before (seed 0)
    X, y = _scaled(load_digits)
    ours_zeros, theirs_zeros = [], []
    for seed in (0, 1):
        params = dict(penalty=penalty, alpha=1e-3, random_state=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            theirs = SGDClassifier(**params).fit(X, y)
        ours = OrtSGDClassifier(**params).fit(X, y)
        ours_zeros.append(int((ours.coef_ == 0).sum()))
        theirs_zeros.append(int((theirs.coef_ == 0).sum()))
        assert abs(ours.score(X, y) - theirs.score(X, y)) < 0.01
    assert min(theirs_zeros) >= low  # the reference itself is sparse
    ratio = np.mean(ours_zeros) / np.mean(theirs_zeros)
    assert 0.85 <= ratio <= 1.15, (ours_zeros, theirs_zeros)


@pytest.mark.parametrize(
    ("Ours", "Theirs", "load"),
    [
        (OrtSGDClassifier, SGDClassifier, load_breast_cancer),  # one row of coefficients
        (OrtSGDClassifier, SGDClassifier, load_digits),  # one per class
        (OrtSGDRegressor, SGDRegressor, load_breast_cancer),  # a 1-d coef_
    ],
)
def test_sparsify_and_densify_as_scikit_learns(Ours, Theirs, load):
    X, y = _scaled(load)
    params = dict(penalty="l1", alpha=1e-2, random_state=0, max_iter=5, tol=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours, theirs = Ours(**params).fit(X, y), Theirs(**params).fit(X, y)
    dense = ours.coef_.copy()
    predicted = ours.predict(X)
    assert ours.sparsify() is ours
    assert theirs.sparsify() is theirs
    assert sp.issparse(ours.coef_)
    assert type(ours.coef_) is type(theirs.coef_)
    assert ours.coef_.shape == theirs.coef_.shape
    assert ours.coef_.nnz == np.count_nonzero(dense)
    np.testing.assert_array_equal(ours.predict(X), predicted)
    assert ours.densify() is ours
    assert theirs.densify() is theirs
    assert isinstance(ours.coef_, np.ndarray)
    assert ours.coef_.shape == theirs.coef_.shape
    np.testing.assert_array_equal(ours.coef_.reshape(dense.shape), dense)
    np.testing.assert_array_equal(ours.predict(X), predicted)
    assert ours.densify().coef_.shape == theirs.densify().coef_.shape  # dense: no change


@pytest.mark.parametrize("method", ["sparsify", "densify"])
def test_sparsify_and_densify_refuse_an_unfitted_estimator_as_scikit_learn(method):
    with pytest.raises(NotFittedError) as theirs:
        getattr(SGDClassifier(), method)()
    with pytest.raises(NotFittedError) as ours:
        getattr(OrtSGDClassifier(), method)()
    assert str(ours.value) == str(theirs.value).replace("SGDClassifier", "OrtSGDClassifier")
