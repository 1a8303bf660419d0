"""Details where the drop-ins followed scikit-learn loosely (found by a scikit-learn user's
review): the fitted weights' float type (coef_ as X, the SGD intercept_ float64 as
scikit-learn's), partial_fit with early_stopping."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ort_train_sklearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor

PAIRS = [
    (OrtSGDClassifier, SGDClassifier),
    (OrtSGDRegressor, SGDRegressor),
    (OrtMLPClassifier, MLPClassifier),
    (OrtMLPRegressor, MLPRegressor),
]


def _data(dtype: type) -> tuple[np.ndarray, np.ndarray]:
    X, y = make_classification(n_samples=60, n_features=4, random_state=0)
    return X.astype(dtype), y


def _weights(est: object) -> list[np.ndarray]:
    if hasattr(est, "coefs_"):
        return [*est.coefs_, *est.intercepts_]
    return [est.coef_, est.intercept_]  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("Ours", "Theirs"), PAIRS)
def test_fitted_weights_keep_the_float_type_of_x(Ours, Theirs, dtype):
    # ours were float64 whatever X; scikit-learn keeps float32 data in float32
    X, y = _data(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = Ours(max_iter=3, random_state=0).fit(X, y)
        theirs = Theirs(max_iter=3, random_state=0).fit(X, y)
    assert [w.dtype for w in _weights(ours)] == [w.dtype for w in _weights(theirs)]
    assert _weights(theirs)[0].dtype == dtype


@pytest.mark.parametrize(("Ours", "Theirs"), PAIRS)
def test_partial_fit_with_early_stopping_is_refused_as_scikit_learn(Ours, Theirs):
    # ours trained one epoch silently (n_iter_ 1) where scikit-learn raises a ValueError
    X, y = _data(np.float64)
    kwargs = {"classes": np.unique(y)} if "Classifier" in Ours.__name__ else {}
    with pytest.raises(ValueError, match="early_stopping"):
        Theirs(early_stopping=True).partial_fit(X, y, **kwargs)
    with pytest.raises(ValueError, match=r"partial_fit does not support early_stopping=True"):
        Ours(early_stopping=True).partial_fit(X, y, **kwargs)


@pytest.mark.parametrize("training", ["full", "partial"])
@pytest.mark.parametrize(("Ours", "Theirs"), PAIRS[2:])
def test_mlp_loss_curve_with_sample_weights_averages_batches_by_rows(Ours, Theirs, training):
    # scikit-learn's MLPs average each batch's weighted-mean loss by its row count; ours
    # weighed the batches by their total sample weight: loss_curve_ 1.3678, 0.8928, ... for
    # scikit-learn's 1.4094, 0.8969, ... (the same weights), so tol stopped at other epochs
    X, y = make_classification(n_samples=128, n_features=6, n_informative=4, n_classes=3, random_state=0)
    if Ours is OrtMLPRegressor:
        y = X[:, :2] @ np.array([1.0, -0.5])
    sw = np.random.RandomState(1).uniform(0.1, 3.0, len(y))
    kw = dict(hidden_layer_sizes=(7,), random_state=0, shuffle=False, batch_size=32, solver="sgd")
    kw |= dict(learning_rate_init=0.05, max_iter=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = Ours(**kw, training=training).fit(X, y, sample_weight=sw)
        theirs = Theirs(**kw).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-5)
    # partial_fit: one epoch a call, the same average
    kwargs = {"classes": np.unique(y)} if Ours is OrtMLPClassifier else {}
    ours, theirs = Ours(**kw, training=training), Theirs(**kw)
    for _ in range(2):
        ours.partial_fit(X, y, sample_weight=sw, **kwargs)
        theirs.partial_fit(X, y, sample_weight=sw, **kwargs)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-5)


@pytest.mark.parametrize(("Ours", "Theirs"), PAIRS[:2])
def test_average_zero_is_refused_as_scikit_learn(Ours, Theirs):
    # ours took average=0 (scikit-learn's constraint is an integer > 0 or a boolean)
    X, y = _data(np.float64)
    with pytest.raises(ValueError, match="'average' parameter"):
        Theirs(average=0).fit(X, y)
    with pytest.raises(ValueError, match="'average' parameter"):
        Ours(average=0).fit(X, y)


@pytest.mark.parametrize(("Ours", "Theirs"), [PAIRS[0], PAIRS[2]])
def test_object_string_labels_give_scikit_learns_classes_dtype(Ours, Theirs):
    # classes_ and predict were of dtype object for object-dtype string labels; scikit-learn's
    # unique_labels makes them '<U3'
    X, y = _data(np.float64)
    labels = np.array(["abc", "de"], dtype=object)[y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = Ours(max_iter=3, random_state=0).fit(X, labels)
        theirs = Theirs(max_iter=3, random_state=0).fit(X, labels)
    assert ours.classes_.dtype == theirs.classes_.dtype == np.dtype("<U3")
    assert ours.predict(X).dtype == theirs.predict(X).dtype
    np.testing.assert_array_equal(ours.classes_, theirs.classes_)
