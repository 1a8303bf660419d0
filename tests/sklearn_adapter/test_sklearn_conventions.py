"""scikit-learn conventions of the adapter (issue 30, item 12): the estimator tags say what
the estimators fit, as scikit-learn's own say."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import make_multilabel_classification
from sklearn.linear_model import SGDClassifier
from sklearn.neural_network import MLPClassifier

from ort_train_sklearn import OrtMLPClassifier, OrtSGDClassifier


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_mlp_classifier_multi_label_tag_as_scikit_learn() -> None:
    # the tag says what fit accepts: both fit the same (n, k) 0/1 indicator matrix
    X, Y = make_multilabel_classification(n_samples=40, n_features=4, n_classes=3, random_state=0)
    ours = OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=2, random_state=0).fit(X, Y)
    assert ours.predict(X).shape == Y.shape
    theirs = MLPClassifier().__sklearn_tags__().classifier_tags
    assert theirs.multi_label is True
    assert OrtMLPClassifier().__sklearn_tags__().classifier_tags == theirs
    # SGDClassifier takes no indicator matrix: neither tag claims one
    sgd = SGDClassifier().__sklearn_tags__().classifier_tags.multi_label
    assert OrtSGDClassifier().__sklearn_tags__().classifier_tags.multi_label is sgd is False
    assert np.isin(ours.predict(X), (0, 1)).all()
