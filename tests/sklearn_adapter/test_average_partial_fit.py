"""``average`` through ``partial_fit`` (issue 26 item 11): averaging starts once ``average``
samples were seen in total, counted across partial_fit calls (t_ carries over), as scikit-learn's
ASGD. Measured: our coef_ equals scikit-learn's to ~1e-7 over three calls whenever scikit-learn's
own state is consistent (every regressor, classifiers without intercept); with an intercept,
scikit-learn's classifiers restart the non-averaged intercept of each call from a stale value
once averaging has begun (binary: ``_fit_binary`` stores it only while not averaging; more than
two classes: ``intercept_`` aliases ``_average_intercept``, which the per-class loop then
overwrites), so their later steps differ (0.034 relative after 3 calls, binary). That is not
reproduced here; the last test pins scikit-learn's behaviour so a fix there is noticed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_classification, make_regression
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.preprocessing import scale

from ort_train_sklearn import OrtSGDClassifier, OrtSGDRegressor

COMMON = dict(penalty="l2", alpha=0.01, shuffle=False, max_iter=3, tol=None, average=10)


def _binary() -> tuple[np.ndarray, np.ndarray]:
    X, y = make_classification(n_samples=60, n_features=4, random_state=0)
    return scale(X), y


def _three_classes() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_iris(return_X_y=True)
    rows = np.random.default_rng(0).permutation(len(y))[:60]  # every class in each call
    return scale(X)[rows], y[rows]


def _regression() -> tuple[np.ndarray, np.ndarray]:
    X, y = make_regression(n_samples=60, n_features=4, noise=5.0, random_state=1)
    return scale(X), y / y.std()


CASES = [
    (OrtSGDRegressor, SGDRegressor, _regression, dict(learning_rate="invscaling", eta0=0.02), {}),
    (
        OrtSGDClassifier,
        SGDClassifier,
        _binary,
        dict(loss="log_loss", learning_rate="optimal", fit_intercept=False),
        dict(classes=[0, 1]),
    ),
    (
        OrtSGDClassifier,
        SGDClassifier,
        _three_classes,
        dict(loss="hinge", learning_rate="optimal", fit_intercept=False),
        dict(classes=[0, 1, 2]),
    ),
]


@pytest.mark.parametrize("rows", [8, 20], ids=["averaging-from-call-2", "averaging-from-call-1"])
@pytest.mark.parametrize(("Ours", "Theirs", "data", "params", "fit"), CASES, ids=["reg", "bin", "ovr"])
def test_three_partial_fits_average_as_scikit_learn(
    Ours: Any, Theirs: Any, data: Any, params: dict[str, Any], fit: dict[str, Any], rows: int
) -> None:
    X, y = data()
    ours, theirs = Ours(batch_size=1, **COMMON, **params), Theirs(**COMMON, **params)
    for call in range(3):
        part = slice(call * rows, (call + 1) * rows)
        ours.partial_fit(X[part], y[part], **fit)
        theirs.partial_fit(X[part], y[part], **fit)
        assert ours.t_ == theirs.t_
        np.testing.assert_allclose(ours.coef_, theirs.coef_.reshape(ours.coef_.shape), rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(ours.predict(X), theirs.predict(X), rtol=1e-4, atol=1e-5)
    # the averaged weights are not the last ones: a test that could not tell proves nothing
    last = Ours(batch_size=1, **{**COMMON, "average": False}, **params)
    for call in range(3):
        last.partial_fit(X[call * rows : (call + 1) * rows], y[call * rows : (call + 1) * rows], **fit)
    assert np.abs(last.coef_ - ours.coef_).max() > 1e-3


def test_scikit_learns_binary_classifier_freezes_its_standard_intercept_once_averaging() -> None:
    """What keeps the classifiers with an intercept apart: scikit-learn's non-averaged intercept
    does not move between partial_fit calls once averaging has begun. If this fails, scikit-learn
    changed it: compare OrtSGDClassifier's partial_fit with an intercept again."""
    X, y = _binary()
    theirs = SGDClassifier(**COMMON, loss="log_loss", learning_rate="optimal")
    theirs.partial_fit(X[:20], y[:20], classes=[0, 1])  # averaging from sample 10 on
    frozen = theirs._standard_intercept.copy()
    theirs.partial_fit(X[20:40], y[20:40])
    np.testing.assert_array_equal(theirs._standard_intercept, frozen)
