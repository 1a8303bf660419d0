"""OrtMLPClassifier on multilabel indicator targets (issue 18, item 7), as scikit-learn's
MLPClassifier: one logit per label trained with the binary cross-entropy of each; the same
Glorot start and, rows in order with a constant step, the same weights and losses as
MLPClassifier; predict the indicator matrix, predict_proba a sigmoid per label, a deployable
graph that predicts the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from sklearn.datasets import make_multilabel_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import scale

from ort_train_sklearn import OrtMLPClassifier

PARAMS: dict[str, Any] = dict(
    hidden_layer_sizes=(6,),
    solver="sgd",
    momentum=0.0,
    learning_rate_init=0.1,
    alpha=0.01,
    batch_size=20,
    max_iter=3,
    shuffle=False,
    random_state=0,
)


def _data() -> tuple[np.ndarray, np.ndarray]:
    X, Y = make_multilabel_classification(n_samples=80, n_features=5, n_classes=4, random_state=0)
    return scale(X), Y


@pytest.mark.parametrize("training", ["full", "partial"])
def test_multilabel_steps_like_scikit_learn(training: str) -> None:
    X, Y = _data()
    ours = OrtMLPClassifier(training=training, tol=None, **PARAMS).fit(X, Y)
    with pytest.warns(ConvergenceWarning):  # scikit-learn: max_iter reached
        theirs = MLPClassifier(**PARAMS).fit(X, Y)
    for got, expected in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-4)
    np.testing.assert_array_equal(ours.classes_, theirs.classes_)
    assert ours.out_activation_ == theirs.out_activation_ == "logistic"
    np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.exp(ours.predict_log_proba(X)), ours.predict_proba(X), rtol=1e-6)
    assert ours.score(X, Y) == pytest.approx(accuracy_score(Y, theirs.predict(X)))


def test_deployed_multilabel_graph() -> None:
    X, Y = _data()
    est = OrtMLPClassifier(tol=None, **PARAMS).fit(X, Y)
    model = est.to_onnx()
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    label, proba = sess.run(None, {sess.get_inputs()[0].name: X.astype(np.float32)})
    np.testing.assert_array_equal(label, est.predict(X))
    np.testing.assert_allclose(proba, est.predict_proba(X), rtol=1e-5, atol=1e-6)


def test_multilabel_early_stopping_scores_subset_accuracy() -> None:
    X, Y = _data()
    params = {**PARAMS, "max_iter": 30}
    est = OrtMLPClassifier(early_stopping=True, **params).fit(X, Y)
    n_val = int(np.ceil(0.1 * len(X)))
    scores = np.array(est.validation_scores_)
    np.testing.assert_allclose(scores * n_val, np.round(scores * n_val), atol=1e-9)


def test_later_fits_keep_the_multilabel_layout() -> None:
    X, Y = _data()
    est = OrtMLPClassifier(tol=None, warm_start=True, **PARAMS).fit(X, Y)
    with pytest.raises(ValueError, match="multilabel"):
        est.fit(X, Y[:, 0])
