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


@pytest.mark.parametrize("penalty", [None, "l1"])
@pytest.mark.parametrize("data", [_breast_cancer, _two_classes])
def test_sgd_classifier_stops_at_scikit_learns_epoch(data, penalty):
    X, y = data()
    for seed in (0, 1, 2):
        params = dict(early_stopping=True, random_state=seed, shuffle=False, penalty=penalty)
        theirs = SGDClassifier(**params).fit(X, y)
        ours = OrtSGDClassifier(batch_size=1, **params).fit(X, y)
        assert ours.n_iter_ == theirs.n_iter_, seed


def test_sgd_regressor_stops_at_scikit_learns_epoch():
    X, y = _diabetes()
    for seed in (0, 1, 2):
        params = dict(early_stopping=True, random_state=seed, shuffle=False, penalty=None)
        theirs = SGDRegressor(**params).fit(X, y)
        ours = OrtSGDRegressor(batch_size=1, **params).fit(X, y)
        assert ours.n_iter_ == theirs.n_iter_, seed


def test_mlp_classifier_stops_at_scikit_learns_epoch():
    X, y = _breast_cancer()
    for seed in (0, 1, 2):
        params = dict(early_stopping=True, random_state=seed, shuffle=False, hidden_layer_sizes=(20,))
        theirs = MLPClassifier(max_iter=300, **params).fit(X, y)
        ours = OrtMLPClassifier(max_iter=300, **params).fit(X, y)
        assert ours.n_iter_ == theirs.n_iter_, seed
