"""The core trainers are scikit-learn estimators, as onnxcustom's were (issue 18, item 4):
``score`` is minus the mean loss, ``__sklearn_tags__`` exists, ``clone`` and ``GridSearchCV``
over nested learning-rate parameters work. References: numpy's squared error of the trained
weights on each held-out fold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_models import build_linear, build_mlp, mlp_forward

from ort_train_core import (
    LearningRateSGD,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import GridSearchCV, KFold  # noqa: E402
from sklearn.utils import get_tags  # noqa: E402


def _data(n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((n, 3)).astype(np.float32)
    return X, (X @ np.array([1.5, -2.0, 0.5]) + 0.25).astype(np.float32)


def _mse(state: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    pred = X.astype(np.float64) @ state["coef"].astype(np.float64) + state["intercept"]
    rows = (pred[:, 0] - y) ** 2
    return float(np.average(rows, weights=w))


def _trainers() -> list[Any]:
    params = dict(max_iter=4, batch_size=10, learning_rate=LearningRateSGD(eta0=0.05), random_state=0)
    return [
        OrtGradientOptimizer(add_loss_output(build_linear()), **params),
        OrtGradientForwardBackwardOptimizer(build_linear(), **params),
    ]


@pytest.mark.parametrize("trainer", _trainers(), ids=["full", "partial"])
def test_score_is_minus_the_mean_loss(trainer: Any) -> None:
    X, y = _data()
    trainer.fit(X, y)
    assert trainer.score(X, y) == pytest.approx(-_mse(trainer.get_state(), X, y), rel=1e-5)
    held_out = X[:20] + 1
    assert trainer.score(held_out, y[:20]) == pytest.approx(
        -_mse(trainer.get_state(), held_out, y[:20]), rel=1e-5
    )


def test_score_weighs_rows_by_sample_weight() -> None:
    X, y = _data()
    w = np.linspace(0.1, 2.0, len(X))
    trainer = OrtGradientOptimizer(add_loss_output(build_linear(), weight_name="weight"), max_iter=2)
    trainer.fit(X, y, sample_weight=w)
    expected = -_mse(trainer.get_state(), X, y, w)
    assert trainer.score(X, y, sample_weight=w) == pytest.approx(expected, rel=1e-5)


def test_score_of_an_mlp_uses_its_trained_weights() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4)).astype(np.float32)
    y = np.sin(X[:, 0]).astype(np.float32)
    trainer = OrtGradientForwardBackwardOptimizer(build_mlp(), max_iter=3, learning_rate=0.05).fit(X, y)
    pred = mlp_forward(trainer.get_state(), X)
    assert trainer.score(X, y) == pytest.approx(-float(((pred.reshape(-1) - y) ** 2).mean()), rel=1e-5)


@pytest.mark.parametrize("trainer", _trainers(), ids=["full", "partial"])
def test_tags_and_clone(trainer: Any) -> None:
    tags = get_tags(trainer)
    assert tags.target_tags.required
    copy = clone(trainer)
    assert type(copy) is type(trainer)
    assert copy.get_params()["learning_rate__eta0"] == 0.05
    assert copy.learning_rate is not trainer.learning_rate
    assert not hasattr(copy, "n_iter_")


@pytest.mark.parametrize("trainer", _trainers(), ids=["full", "partial"])
def test_grid_search_over_the_learning_rate(trainer: Any) -> None:
    """onnxcustom's workflow: GridSearchCV(trainer, {'learning_rate__eta0': [...]}); each
    candidate's test score is minus numpy's squared error of a fit on the training folds."""
    X, y = _data()
    grid = [1e-4, 0.05]
    cv = KFold(3)
    search = GridSearchCV(trainer, {"learning_rate__eta0": grid}, cv=cv).fit(X, y)
    for k, eta0 in enumerate(grid):
        scores = []
        for train, test in cv.split(X):
            fitted = clone(trainer).set_params(learning_rate__eta0=eta0).fit(X[train], y[train])
            scores.append(-_mse(fitted.get_state(), X[test], y[test]))
        assert search.cv_results_["mean_test_score"][k] == pytest.approx(np.mean(scores), rel=1e-4)
    assert search.best_params_ == {"learning_rate__eta0": 0.05}  # 1e-4 barely moves in 4 epochs
    assert search.best_estimator_.score(X, y) == pytest.approx(
        -_mse(search.best_estimator_.get_state(), X, y), rel=1e-5
    )


def test_score_of_a_summed_loss_is_still_a_mean() -> None:
    """reduction='sum' (onnxcustom's loss magnitude) trains on sums; score stays comparable
    across fold sizes: minus the mean."""
    X, y = _data()
    trainer = OrtGradientOptimizer(
        add_loss_output(build_linear(), reduction="sum"), max_iter=2, learning_rate=1e-3
    )
    trainer.fit(X, y)
    assert trainer.score(X, y) == pytest.approx(-_mse(trainer.get_state(), X, y), rel=1e-5)
