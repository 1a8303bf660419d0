"""No rebuild for a refit (issue 27 item 5), as GridSearchCV fits: a clone of a drop-in fitted
on a same-shaped set, from other random initial weights, builds no graph and no session on either
backend and either loop; its weights equal those of a fit on empty caches exactly; another
architecture, penalty or batch size builds its own."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_classification, make_regression
from sklearn.linear_model import SGDRegressor

from backend_support import AVAILABLE, each_backend  # noqa: F401  (the backend fixture)
from call_counts import count_calls
from ort_train_core import _binding, _loss_trainer, optimizer, partial
from ort_train_core._backends import get_backend
from ort_train_core._cache import LRUCache
from ort_train_sklearn import (
    OrtMLPClassifier,
    OrtMLPRegressor,
    OrtSGDClassifier,
    OrtSGDRegressor,
    _base,
)

_CACHES = [
    (_base, "_LOSS_GRAPHS"),
    (_loss_trainer, "_FIT_GRAPHS"),
    (optimizer, "_FUSED_GRAPHS"),
    (_binding, "_SESSIONS"),
    *[(partial, n) for n in ("_FORWARD_BACKWARD", "_LOSS_GRADIENTS", "_UPDATES") if hasattr(partial, n)],
]


def _empty_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    for module, name in _CACHES:
        monkeypatch.setattr(module, name, LRUCache(getattr(module, name).maxsize))


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts of the builders' calls (loss graphs, graph records, fused steps, forward/backward
    pairs, loss and update graphs, training sessions), on empty caches."""
    _empty_caches(monkeypatch)
    counts: collections.Counter[str] = collections.Counter()

    count_calls(monkeypatch, counts, _base, "add_loss_output")
    count_calls(monkeypatch, counts, _loss_trainer.LossGraphTrainer, "_new_fit_graphs")
    count_calls(monkeypatch, counts, _binding, "_new_session")
    count_calls(monkeypatch, counts, partial, "build_loss_gradient_graph")
    count_calls(monkeypatch, counts, partial, "build_update_graph")
    for name in AVAILABLE:
        count_calls(monkeypatch, counts, type(get_backend(name)), "fused_step")
        count_calls(monkeypatch, counts, type(get_backend(name)), "forward_backward")
    return counts


def _classification(seed: int) -> tuple[np.ndarray, np.ndarray]:
    X, y = make_classification(90, 5, n_informative=3, n_classes=3, random_state=seed)
    return X.astype(np.float32), y


def _regression(seed: int) -> tuple[np.ndarray, np.ndarray]:
    X, y = make_regression(90, 5, noise=5.0, random_state=seed)
    return X.astype(np.float32), y / 50


ESTIMATORS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "sgd_classifier": (OrtSGDClassifier, _classification, {"max_iter": 5, "tol": None}),
    "sgd_regressor": (OrtSGDRegressor, _regression, {"max_iter": 5, "tol": None}),
    "mlp_classifier": (OrtMLPClassifier, _classification, {"max_iter": 5, "hidden_layer_sizes": (7,)}),
    "mlp_regressor": (OrtMLPRegressor, _regression, {"max_iter": 5, "hidden_layer_sizes": (7,)}),
}


def _coefs(est: Any) -> list[np.ndarray]:
    if hasattr(est, "coefs_"):
        return [*est.coefs_, *est.intercepts_]
    return [est.coef_, est.intercept_]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("training", ["full", "partial"])
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_a_grid_search_refit_builds_nothing_and_equals_a_cold_fit(
    name: str, training: str, backend: str, builds: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, data, params = ESTIMATORS[name]
    base = cls(**params, training=training, random_state=0)
    clone(base).fit(*data(0))  # the first fit of this architecture builds
    assert builds["_new_fit_graphs"] == 1
    builds.clear()
    X, y = data(1)  # another fold: same shape, other rows
    warm = clone(base).set_params(random_state=5).fit(X, y)  # other initial weights (MLPs)
    assert dict(builds) == {}, f"a warm refit built {dict(builds)}"
    _empty_caches(monkeypatch)
    cold = clone(base).set_params(random_state=5).fit(X, y)
    assert builds["_new_fit_graphs"] == 1  # (the cold fit did build)
    for got, expected in zip(_coefs(warm), _coefs(cold), strict=True):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(warm.predict(X), cold.predict(X))


def test_a_warm_refit_takes_scikit_learns_steps(builds: collections.Counter[str]) -> None:
    """Independent reference: per-sample SGD of a refit equals SGDRegressor's."""
    params: dict[str, Any] = dict(shuffle=False, max_iter=4, tol=None, alpha=0.01)
    OrtSGDRegressor(**params, batch_size=1).fit(*_regression(0))
    X, y = _regression(1)
    builds.clear()
    warm = OrtSGDRegressor(**params, batch_size=1).fit(X, y)
    assert builds["_new_fit_graphs"] == 0
    reference = SGDRegressor(**params).fit(X, y)
    np.testing.assert_allclose(warm.coef_, reference.coef_, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(warm.intercept_, reference.intercept_, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(
    "change",
    [{"hidden_layer_sizes": (8,)}, {"alpha": 0.01}, {"batch_size": 16}, {"activation": "tanh"}],
    ids=["architecture", "penalty", "batch", "activation"],
)
def test_another_setting_builds(change: dict[str, Any], builds: collections.Counter[str]) -> None:
    """No wrong reuse: each of these settings gets graphs of its own."""
    X, y = _classification(0)
    params: dict[str, Any] = dict(max_iter=3, hidden_layer_sizes=(7,), random_state=0)
    OrtMLPClassifier(**params).fit(X, y)
    builds.clear()
    OrtMLPClassifier(**{**params, **change}).fit(X, y)
    assert builds["fused_step"] >= 1
