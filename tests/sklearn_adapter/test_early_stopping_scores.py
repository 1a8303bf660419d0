"""Early stopping as scikit-learn's (issue 18, item 8): ``validation_scores_`` and
``best_validation_score_`` hold the validation *score* (accuracy for a classifier, R² for a
regressor) of each epoch, the fit stops by scikit-learn's rule on that score and the MLPs keep
the weights of the best epoch; ``loss_`` and ``t_`` as scikit-learn's.

References: scikit-learn's metrics on the validation rows the estimator held out (recorded from
its call to ``train_test_split``) and scikit-learn's documented stopping rule, replayed here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, r2_score
from sklearn.preprocessing import scale

import ort_train_sklearn._base as base
from ort_train_sklearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor


@pytest.fixture
def held_out(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The validation rows of the next fit, as train_test_split returned them."""
    record: dict[str, Any] = {}
    real = base.train_test_split

    def spy(*arrays: Any, **kwargs: Any) -> Any:
        out = real(*arrays, **kwargs)
        record["X_val"], record["y_val"] = out[1], out[3]
        record["n_train"] = len(out[0])
        return out

    monkeypatch.setattr(base, "train_test_split", spy)
    return record


def _mlp_rule_stop(scores: list[float], tol: float, n_iter_no_change: int) -> int:
    """scikit-learn's MLP: the count grows when a score is below best + tol, resets otherwise;
    the fit stops after the epoch where the count exceeds n_iter_no_change."""
    best, count = -np.inf, 0
    for epoch, s in enumerate(scores):
        count = count + 1 if s < best + tol else 0
        best = max(best, s)
        if count > n_iter_no_change:
            return epoch + 1
    return len(scores)


def _breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_breast_cancer(return_X_y=True)
    return scale(X), y


def test_mlp_classifier_scores_are_validation_accuracies(held_out: dict[str, Any]) -> None:
    X, y = _breast_cancer()
    est = OrtMLPClassifier(early_stopping=True, random_state=0, max_iter=300).fit(X, y)
    X_val, y_val = held_out["X_val"], held_out["y_val"]
    n_val = len(y_val)
    scores = est.validation_scores_
    assert len(scores) == est.n_iter_
    # accuracies: multiples of 1/n_val in [0, 1]
    assert all(0 <= s <= 1 for s in scores)
    np.testing.assert_allclose(np.array(scores) * n_val, np.round(np.array(scores) * n_val), atol=1e-9)
    assert est.best_validation_score_ == max(scores)
    # the MLP keeps the best epoch's weights: its accuracy on the held-out rows is the best score
    assert accuracy_score(est.classes_[y_val], est.predict(X_val)) == pytest.approx(
        est.best_validation_score_
    )
    # it stopped where scikit-learn's rule on those scores stops
    assert est.n_iter_ == _mlp_rule_stop(scores, est.tol, est.n_iter_no_change) < 300
    assert est.best_loss_ is None


def test_mlp_regressor_scores_are_validation_r2(held_out: dict[str, Any]) -> None:
    X, y = load_diabetes(return_X_y=True)
    X, y = scale(X), (y - y.mean()) / y.std()
    est = OrtMLPRegressor(early_stopping=True, random_state=0, max_iter=300, learning_rate_init=0.01).fit(
        X, y
    )
    X_val, y_val = held_out["X_val"], held_out["y_val"]
    assert r2_score(y_val.ravel(), est.predict(X_val)) == pytest.approx(est.best_validation_score_, abs=1e-5)
    assert est.n_iter_ == _mlp_rule_stop(est.validation_scores_, est.tol, est.n_iter_no_change)
    assert max(est.validation_scores_) > 0.3  # R², not a negated loss


def test_mlp_loss_and_t(held_out: dict[str, Any]) -> None:
    X, y = _breast_cancer()
    est = OrtMLPClassifier(early_stopping=True, random_state=0, max_iter=300).fit(X, y)
    assert est.loss_ == est.loss_curve_[-1]
    assert est.t_ == est.n_iter_ * held_out["n_train"]
    with pytest.warns(ConvergenceWarning):
        plain = OrtMLPClassifier(random_state=0, max_iter=5).fit(X, y)
    assert plain.t_ == 5 * len(X)
    assert plain.loss_ == plain.loss_curve_[-1]


@pytest.mark.parametrize("cls", [OrtSGDRegressor, OrtSGDClassifier])
def test_sgd_t_counts_updates_as_scikit_learn(cls: Any) -> None:
    """SGD's t_ = n_iter_ * n_samples + 1 (scikit-learn's definition)."""
    X, y = _breast_cancer()
    est = cls(max_iter=3, tol=None, random_state=0).fit(X[:100], y[:100])  # tol=None: no warning
    assert est.t_ == 3 * 100 + 1


def test_sgd_early_stopping_monitors_the_score(held_out: dict[str, Any]) -> None:
    """SGDClassifier's rule (count >= n_iter_no_change stops) on validation accuracies."""
    X, y = _breast_cancer()
    est = OrtSGDClassifier(early_stopping=True, random_state=0, max_iter=200).fit(X, y)
    scores = est.validation_scores_
    n_val = len(held_out["y_val"])
    np.testing.assert_allclose(np.array(scores) * n_val, np.round(np.array(scores) * n_val), atol=1e-9)
    best, count, stop = -np.inf, 0, len(scores)
    for epoch, s in enumerate(scores):
        count = count + 1 if s < best + est.tol else 0
        best = max(best, s)
        if count >= est.n_iter_no_change:
            stop = epoch + 1
            break
    assert est.n_iter_ == stop
