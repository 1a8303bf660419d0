"""``backend=`` on the six estimators (issue 27, items 3, 4 and 7): a constructor parameter kept as
given (get_params, set_params, clone, pickle), checked at fit, handed to the trainer. With the
backend each names, the drop-ins step as scikit-learn's estimators do; where the training build is
loaded, both backends give the same fitted weights within 1e-5, and scikit-learn's estimator
checks pass with ``backend='onnx'`` too. The training build's cases skip on stock onnxruntime."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression, SGDClassifier, SGDRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.utils.estimator_checks import parametrize_with_checks
from test_estimators import CHECKED, _expected_failed_checks

from backend_support import BOTH, TRAINING_BUILD, needs_training
from ort_train_sklearn import (
    OnnxModelClassifier,
    OnnxModelRegressor,
    OrtMLPClassifier,
    OrtMLPRegressor,
    OrtSGDClassifier,
    OrtSGDRegressor,
)

SEED = 0
TRAININGS = ["full", "partial"]
AGREE = 1e-5
MLP: dict[str, Any] = dict(hidden_layer_sizes=(5,), max_iter=4, tol=None, random_state=SEED, shuffle=False)
#: a constant step: the default 'optimal' schedule's first steps (eta ~ 1 / alpha) take the
#: log-loss weights to ~100, where float32 rounding differs in the fifth digit whatever the backend
SGD: dict[str, Any] = dict(learning_rate="constant", eta0=0.01, max_iter=4, tol=None, random_state=SEED)

#: name -> (a factory of the estimator, whether it classifies)
ESTIMATORS: dict[str, tuple[Callable[..., BaseEstimator], bool]] = {
    "sgd_regressor": (lambda **kw: OrtSGDRegressor(**SGD, **kw), False),
    "sgd_classifier": (lambda **kw: OrtSGDClassifier(loss="log_loss", **SGD, **kw), True),
    "mlp_regressor": (lambda **kw: OrtMLPRegressor(**MLP, **kw), False),
    "mlp_classifier": (lambda **kw: OrtMLPClassifier(**MLP, **kw), True),
    "onnx_regressor": (
        lambda **kw: OnnxModelRegressor(
            LinearRegression(), learning_rate_init=0.01, max_iter=4, random_state=SEED, **kw
        ),
        False,
    ),
    "onnx_classifier": (
        lambda **kw: OnnxModelClassifier(LogisticRegression(), max_iter=4, random_state=SEED, **kw),
        True,
    ),
}


def _data(classify: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.RandomState(SEED)
    X = rng.randn(60, 4)
    z = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 + 0.1 * rng.randn(60)
    y = ((z > 0.3).astype(int) + (X[:, 0] > 0.5)) if classify else z
    return X, y, rng.uniform(0.2, 3, 60)


def _fitted(est: BaseEstimator) -> list[np.ndarray]:
    """The fitted weights, whatever the estimator calls them."""
    if hasattr(est, "coefs_"):
        return [*est.coefs_, *est.intercepts_]
    if hasattr(est, "coef_"):
        return [est.coef_, est.intercept_]
    return [est.weights_[k] for k in sorted(est.weights_)]


def _training_build_nodes(est: BaseEstimator) -> list[str]:
    """Nodes of the trainer's graphs that only the training build's backend writes (see
    tests/core/test_backend_param.py): com.microsoft operators, ``<node>_Grad/`` names."""
    found = []
    for name, data in est._trainer.save_onnx_graph({}).items():
        nodes = onnx.load_from_string(data).graph.node
        found += [f"{name}:{n.name}" for n in nodes if n.domain == "com.microsoft" or "_Grad/" in n.name]
    return found


# ---- both backends: the same weights -----------------------------------------------------------
@needs_training
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("training", TRAININGS)
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_both_backends_fit_the_same_weights(name: str, training: str) -> None:
    make, classify = ESTIMATORS[name]
    X, y, sw = _data(classify)
    ours = make(training=training, backend="onnx").fit(X, y, sample_weight=sw)
    theirs = make(training=training, backend="onnxruntime-training").fit(X, y, sample_weight=sw)
    assert ours._trainer.backend == "onnx"
    assert _training_build_nodes(ours) == []
    for got, expected in zip(_fitted(ours), _fitted(theirs), strict=True):
        np.testing.assert_allclose(got, expected, rtol=AGREE, atol=AGREE)
    np.testing.assert_allclose(ours.predict(X[:5]), theirs.predict(X[:5]), rtol=AGREE, atol=AGREE)


@needs_training
def test_mlp_lbfgs_backends_agree() -> None:
    X, y, sw = _data(False)
    params: dict[str, Any] = dict(solver="lbfgs", hidden_layer_sizes=(5,), max_iter=4, random_state=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtMLPRegressor(backend="onnx", **params).fit(X, y, sample_weight=sw)
        theirs = OrtMLPRegressor(backend="onnxruntime-training", **params).fit(X, y, sample_weight=sw)
    for got, expected in zip(_fitted(ours), _fitted(theirs), strict=True):
        np.testing.assert_allclose(got, expected, rtol=AGREE, atol=AGREE)


# ---- each backend steps as scikit-learn --------------------------------------------------------
@pytest.mark.parametrize("training", TRAININGS)
@pytest.mark.parametrize("backend", BOTH)
def test_sgd_steps_like_sklearn(backend: str, training: str) -> None:
    X, y, sw = _data(False)
    params: dict[str, Any] = dict(
        learning_rate="constant", eta0=0.01, max_iter=3, tol=None, shuffle=False, penalty="l2", alpha=0.01
    )
    ours = OrtSGDRegressor(training=training, batch_size=1, backend=backend, **params).fit(
        X, y, sample_weight=sw
    )
    reference = SGDRegressor(**params).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(ours.coef_, reference.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, reference.intercept_, rtol=1e-5, atol=1e-6)
    labels = (y > 0.3).astype(int)
    ours_c = OrtSGDClassifier(loss="log_loss", training=training, batch_size=1, backend=backend, **params)
    reference_c = SGDClassifier(loss="log_loss", **params).fit(X, labels, sample_weight=sw)
    np.testing.assert_allclose(
        ours_c.fit(X, labels, sample_weight=sw).coef_, reference_c.coef_, rtol=1e-5, atol=1e-6
    )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("solver", ["sgd", "nesterov", "adam"])
@pytest.mark.parametrize("classify", [False, True], ids=["regressor", "classifier"])
@pytest.mark.parametrize("backend", BOTH)
def test_mlp_steps_like_sklearn(backend: str, classify: bool, solver: str) -> None:
    """One batch of all rows, three epochs (test_estimators.py::test_mlp_steps_like_sklearn's
    tolerances: Adam's sqrt(v) magnifies float32 rounding)."""
    X, y, _ = _data(classify)
    params: dict[str, Any] = dict(
        hidden_layer_sizes=(5,), learning_rate_init=0.05, alpha=0.1, batch_size=60, max_iter=3,
        shuffle=False, random_state=SEED, solver="adam" if solver == "adam" else "sgd",
        momentum=0.9 if solver == "nesterov" else 0.0,
    )  # fmt: skip
    ours_class, reference_class = (
        (OrtMLPClassifier, MLPClassifier) if classify else (OrtMLPRegressor, MLPRegressor)
    )
    ours = ours_class(tol=None, backend=backend, **params).fit(X, y)
    reference = reference_class(**params).fit(X, y)
    atol = 1e-4 if solver == "adam" else 1e-6
    for got, expected in zip(_fitted(ours), [*reference.coefs_, *reference.intercepts_], strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("backend", BOTH)
def test_mlp_lbfgs_like_sklearn(backend: str) -> None:
    """solver='lbfgs' differentiates the whole set with onnx_derivative (its batch fixed for
    the onnx backend, which differentiates static shapes): scikit-learn's first iterations."""
    X, y, sw = _data(False)
    params: dict[str, Any] = dict(
        solver="lbfgs", hidden_layer_sizes=(5,), alpha=0.1, max_iter=4, random_state=SEED
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtMLPRegressor(backend=backend, **params).fit(X, y, sample_weight=sw)
        reference = MLPRegressor(**params).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(ours.loss_, reference.loss_, rtol=1e-4)
    for got, expected in zip(_fitted(ours), [*reference.coefs_, *reference.intercepts_], strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


# ---- the parameter's protocol ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_backend_is_a_parameter_checked_at_fit(name: str) -> None:
    make, classify = ESTIMATORS[name]
    est = make()
    assert est.get_params()["backend"] is None
    assert clone(est.set_params(backend="onnx")).get_params()["backend"] == "onnx"
    X, y, _ = _data(classify)
    bad = make(backend="autodiff")  # stored as given: scikit-learn checks it at fit
    assert bad.backend == "autodiff"
    with pytest.raises(ValueError, match=r"The 'backend' parameter of \w+ must be a str among") as refused:
        bad.fit(X, y)
    assert all(name in str(refused.value) for name in ("'onnx'", "'onnxruntime-training'", "'autodiff'"))
    assert not hasattr(bad, "_trainer")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_pickle_and_partial_fit_keep_the_backend() -> None:
    X, y, _ = _data(False)
    est = OrtSGDRegressor(backend="onnx", random_state=SEED).partial_fit(X, y)
    copy = pickle.loads(pickle.dumps(est))
    assert copy.backend == copy._trainer.backend == "onnx"
    np.testing.assert_array_equal(copy.partial_fit(X, y).coef_, est.partial_fit(X, y).coef_)
    assert _training_build_nodes(copy) == []
    if TRAINING_BUILD:  # a changed backend rebuilds the trainer, from the fitted weights
        coef = est.coef_.copy()
        est.set_params(backend="onnxruntime-training").partial_fit(X[:10], y[:10])
        assert est._trainer.backend == "onnxruntime-training"
        assert not np.array_equal(est.coef_, coef)


# ---- scikit-learn's estimator checks with backend='onnx' --------------------------------------
ONNX_CHECKED = [clone(est).set_params(backend="onnx") for est in CHECKED]


@pytest.mark.sklearn_checks
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@parametrize_with_checks(ONNX_CHECKED, expected_failed_checks=_expected_failed_checks)
def test_sklearn_compatible_with_backend_onnx(estimator: BaseEstimator, check: Callable[..., None]) -> None:
    check(estimator)
