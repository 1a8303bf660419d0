"""Early stopping ends at scikit-learn's epoch under the conditions docs/sklearn.rst states:
the same steps in the same order (``shuffle=False``; the SGD estimators with ``batch_size=1``
and no L2 share in the penalty, for a regressor or two classes; the MLPs)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, make_classification
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from ort_train_sklearn import OrtMLPClassifier, OrtSGDClassifier, OrtSGDRegressor


def _breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _two_classes() -> tuple[np.ndarray, np.ndarray]:
    return make_classification(600, 10, random_state=0)


def _diabetes() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), (y - y.mean()) / y.std()


def _assert_same_epochs(
    theirs: type, ours: type, X: np.ndarray, y: np.ndarray, ours_only: dict[str, object], **params: object
) -> None:
    for seed in (0, 1, 2):
        fitted = dict(early_stopping=True, random_state=seed, shuffle=False, **params)
        expected = theirs(**fitted).fit(X, y).n_iter_
        assert ours(**fitted, **ours_only).fit(X, y).n_iter_ == expected, seed


#: scikit-learn's SGD steps are per sample
PER_SAMPLE = {"batch_size": 1}


@pytest.mark.parametrize("penalty", [None, "l1"])
@pytest.mark.parametrize("data", [_breast_cancer, _two_classes])
def test_sgd_classifier_stops_at_scikit_learns_epoch(data, penalty):
    _assert_same_epochs(SGDClassifier, OrtSGDClassifier, *data(), PER_SAMPLE, penalty=penalty)


def test_sgd_regressor_stops_at_scikit_learns_epoch():
    _assert_same_epochs(SGDRegressor, OrtSGDRegressor, *_diabetes(), PER_SAMPLE, penalty=None)


def test_mlp_classifier_stops_at_scikit_learns_epoch():
    _assert_same_epochs(
        MLPClassifier, OrtMLPClassifier, *_breast_cancer(), {}, max_iter=300, hidden_layer_sizes=(20,)
    )
