"""Early stopping as scikit-learn's (issue 18, item 8): ``validation_scores_`` and
``best_validation_score_`` hold the validation *score* (accuracy for a classifier, R² for a
regressor) of each epoch, the fit stops by scikit-learn's rule on that score and the MLPs keep
the weights of the best epoch; ``loss_`` and ``t_`` as scikit-learn's.

References: scikit-learn's metrics on the validation rows the estimator held out (recorded from
its split) and scikit-learn's documented stopping rule, replayed here; the split itself against
scikit-learn's estimators."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import (
    load_breast_cancer,
    load_diabetes,
    load_iris,
    make_classification,
    make_regression,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.metrics import accuracy_score, r2_score
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.preprocessing import scale

import ort_train_sklearn._base as base
from ort_train_sklearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor


@pytest.fixture
def held_out(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The validation rows of the next fit, as the estimator split them off."""
    record: dict[str, Any] = {}
    real = base.OrtEstimatorMixin._split_validation

    def spy(self: Any, *args: Any) -> Any:
        (_, y, _), (X_val, y_val, _) = out = real(self, *args)
        record["X_val"], record["y_val"], record["n_train"] = X_val, y_val, len(y)
        return out

    monkeypatch.setattr(base.OrtEstimatorMixin, "_split_validation", spy)
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


SPLIT_CASES = {
    "sgd-binary": (OrtSGDClassifier, SGDClassifier, "binary", dict(batch_size=1)),
    "sgd-regressor": (OrtSGDRegressor, SGDRegressor, "regression", dict(batch_size=1)),
    "mlp-binary": (OrtMLPClassifier, MLPClassifier, "binary", {}),
    "mlp-multiclass": (OrtMLPClassifier, MLPClassifier, "multiclass", {}),
    "mlp-regressor": (OrtMLPRegressor, MLPRegressor, "regression", {}),
}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_early_stopping_holds_out_scikit_learns_rows(case: str, weighted: bool) -> None:
    # the split was train_test_split(random_state=rng.randint(...)), stratified for every
    # classifier: other validation rows than scikit-learn's, so another stopping epoch (SGD
    # binary: 14 epochs for SGDClassifier's 8). scikit-learn's SGD uses (Stratified)ShuffleSplit
    # seeded with random_state and keeps the row order; its MLPs train_test_split with their
    # random state after the initial weights, stratified for a single label column only
    Ours, Theirs, kind, extra = SPLIT_CASES[case]
    if kind == "regression":
        X, y = make_regression(n_samples=150, n_features=5, noise=3.0, random_state=0)
        y = y / y.std()
    elif kind == "binary":
        X, y = make_classification(n_samples=150, n_features=5, random_state=0)
    else:
        X, y = load_iris(return_X_y=True)
        X = scale(X)
    sw = np.random.default_rng(1).uniform(0.5, 2.0, len(y)) if weighted else None
    kw: dict[str, Any] = dict(early_stopping=True, shuffle=False, random_state=0)
    if Ours in (OrtMLPClassifier, OrtMLPRegressor):
        kw.update(hidden_layer_sizes=(8,), max_iter=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = Ours(**kw, **extra).fit(X, y, sample_weight=sw)
        theirs = Theirs(**kw).fit(X, y, sample_weight=sw)
    assert ours.n_iter_ == theirs.n_iter_
    if hasattr(theirs, "best_validation_score_"):
        np.testing.assert_allclose(ours.best_validation_score_, theirs.best_validation_score_, atol=1e-6)
    if hasattr(theirs, "coef_"):
        np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("max_iter", [5, 40])
def test_warm_fits_continue_the_validation_scores_as_scikit_learn(max_iter: int) -> None:
    # a warm fit started validation_scores_, their best and the no-improvement count afresh
    # (13 -> 15 scores while loss_curve_ grew to 28); scikit-learn's MLP goes on with them:
    # 5 epochs each -> 5, 10, 15 scores; 37 epochs, then one epoch per warm fit (the count
    # carried over is already past n_iter_no_change)
    X, y = _breast_cancer()
    kw: dict[str, Any] = dict(
        early_stopping=True,
        warm_start=True,
        max_iter=max_iter,
        random_state=0,
        hidden_layer_sizes=(8,),
        shuffle=False,
    )
    ours, theirs = OrtMLPClassifier(**kw), MLPClassifier(**kw)
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            ours.fit(X, y)
            theirs.fit(X, y)
        assert ours.n_iter_ == theirs.n_iter_
        np.testing.assert_allclose(ours.validation_scores_, theirs.validation_scores_, atol=1e-9)
        assert ours.best_validation_score_ == theirs.best_validation_score_
        assert len(ours.loss_curve_) == len(theirs.loss_curve_)
