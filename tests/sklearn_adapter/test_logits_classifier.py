"""OnnxModelClassifier on a graph whose single output is logits (issue 17, item 7), without
torch: the classes it takes, the labels it refuses, and probabilities against numpy's softmax.
The comparison with torch's training is in test_logits_classifier_torch.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ort_train_sklearn import OnnxModelClassifier, OnnxModelRegressor
from ort_train_sklearn._graphs import dense_graph

RNG = np.random.default_rng(0)
X = RNG.standard_normal((30, 4)).astype(np.float32)
W0 = RNG.standard_normal((4, 6)).astype(np.float32)
W1 = RNG.standard_normal((6, 3)).astype(np.float32)


def _logits_graph(n_cols: int = 3) -> object:
    return dense_graph([W0, W1[:, :n_cols]], [np.zeros(6), np.zeros(n_cols)], activation="relu")


def _numpy_logits(n_cols: int = 3) -> np.ndarray:
    return np.maximum(X.astype(np.float64) @ W0, 0) @ W1[:, :n_cols]


def _fit(clf: OnnxModelClassifier, y: np.ndarray) -> OnnxModelClassifier:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=Warning)  # ConvergenceWarning
        return clf.fit(X, y)


def test_logits_default_classes_and_softmax() -> None:
    y = np.arange(len(X)) % 3
    clf = _fit(OnnxModelClassifier(_logits_graph(), max_iter=1, learning_rate_init=1e-12), y)
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    z = _numpy_logits()
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(clf.predict_proba(X), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(clf.predict(X), np.argmax(z, axis=1))
    np.testing.assert_allclose(clf.decision_function(X), z, rtol=1e-5, atol=1e-5)


def test_one_logit_column_is_binary_with_sigmoid() -> None:
    y = np.array(["no", "yes"])[np.arange(len(X)) % 2]
    clf = _fit(
        OnnxModelClassifier(_logits_graph(1), classes=["no", "yes"], max_iter=1, learning_rate_init=1e-12), y
    )
    z = _numpy_logits(1)[:, 0]
    p1 = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(clf.predict_proba(X), np.column_stack([1 - p1, p1]), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(clf.predict(X), np.where(z > 0, "yes", "no"))


def test_labels_outside_the_logit_classes_are_refused() -> None:
    y = np.arange(len(X)) % 4  # label 3 has no logit column
    with pytest.raises(ValueError, match=r"y holds labels \[3\] not in classes=\[0, 1, 2\]"):
        _fit(OnnxModelClassifier(_logits_graph(), max_iter=1), y)


def test_classes_must_match_the_logit_columns() -> None:
    y = np.arange(len(X)) % 2
    with pytest.raises(ValueError, match=r"3 column\(s\), i\.e\. 3 classes, but classes lists 2"):
        _fit(OnnxModelClassifier(_logits_graph(), classes=[0, 1], max_iter=1), y)
    with pytest.raises(ValueError, match="classes must be distinct labels"):
        _fit(OnnxModelClassifier(_logits_graph(), classes=[0, 1, 1], max_iter=1), y)


def test_regressor_still_refuses_a_classifier_and_reads_logits_as_values() -> None:
    """OnnxModelRegressor keeps reading a single float output as a prediction."""
    y = _numpy_logits().astype(np.float32)
    reg = OnnxModelRegressor(_logits_graph(), max_iter=1, learning_rate_init=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=Warning)
        reg.fit(X, y)
    np.testing.assert_allclose(reg.predict(X), y, rtol=1e-5, atol=1e-5)
