"""OrtSGDClassifier / OrtSGDRegressor with scikit-learn's SGD losses (issue 18, item 7): the
same per-sample SGD steps as SGDClassifier / SGDRegressor (constant step, no penalty, no
shuffling: the weights are then a deterministic function of the data), one-vs-rest for more
than two classes, scikit-learn's probability models and class weights."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnxruntime
import pytest
from sklearn.datasets import load_iris, make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.preprocessing import scale

from ort_train_sklearn import OrtSGDClassifier, OrtSGDRegressor

COMMON = dict(penalty=None, learning_rate="constant", eta0=0.01, shuffle=False, max_iter=3, tol=None)
#: scikit-learn's per-sample steps: one row per step (the default 'auto' takes several)
ONE = dict(batch_size=1)


def _fit_both(ours: Any, theirs: Any, X: np.ndarray, y: np.ndarray, **fit: Any) -> tuple[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return ours.fit(X, y, **fit), theirs.fit(X, y, **fit)


def _binary() -> tuple[np.ndarray, np.ndarray]:
    X, y = make_classification(n_samples=120, n_features=5, random_state=0)
    return scale(X), y


def _three_classes() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_iris(return_X_y=True)
    return scale(X), y


@pytest.mark.parametrize("loss", ["hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron"])
@pytest.mark.parametrize("data", [_binary, _three_classes], ids=["binary", "ovr"])
def test_classifier_steps_as_scikit_learn(loss: str, data: Any) -> None:
    X, y = data()
    ours, theirs = _fit_both(
        OrtSGDClassifier(loss=loss, **ONE, **COMMON), SGDClassifier(loss=loss, **COMMON), X, y
    )
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=2e-4, atol=2e-5)
    np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))
    np.testing.assert_allclose(ours.decision_function(X), theirs.decision_function(X), rtol=1e-3, atol=1e-4)
    assert hasattr(ours, "predict_proba") == hasattr(theirs, "predict_proba")
    if hasattr(theirs, "predict_proba"):
        np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("loss", ["huber", "epsilon_insensitive", "squared_epsilon_insensitive"])
def test_regressor_steps_as_scikit_learn(loss: str) -> None:
    X, y = make_regression(n_samples=100, n_features=4, noise=5.0, random_state=1)
    X, y = scale(X), y / y.std()
    params = dict(loss=loss, epsilon=0.2, **COMMON)
    ours, theirs = _fit_both(OrtSGDRegressor(**ONE, **params), SGDRegressor(**params), X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("class_weight", [{0: 3.0, 1: 0.5, 2: 1.0}, "balanced"])
def test_class_weight_as_scikit_learn(class_weight: Any) -> None:
    X, y = _three_classes()
    keep = np.r_[0:50, 50:70, 100:150]  # unbalanced: 'balanced' differs from equal weights
    X, y = X[keep], y[keep]
    params = dict(loss="hinge", class_weight=class_weight, **COMMON)
    ours, theirs = _fit_both(OrtSGDClassifier(**ONE, **params), SGDClassifier(**params), X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize(
    ("estimator", "reference", "params"),
    [
        (OrtSGDRegressor, SGDRegressor, dict(learning_rate="invscaling", eta0=0.02, power_t=0.3)),
        (OrtSGDRegressor, SGDRegressor, dict(learning_rate="optimal", alpha=0.05)),
        (OrtSGDClassifier, SGDClassifier, dict(loss="hinge", learning_rate="optimal", alpha=0.05)),
        (OrtSGDClassifier, SGDClassifier, dict(loss="log_loss", learning_rate="invscaling", eta0=0.1)),
    ],
    ids=["regressor-invscaling", "regressor-optimal", "hinge-optimal", "log_loss-invscaling"],
)
def test_schedules_count_samples_as_scikit_learn(estimator: Any, reference: Any, params: Any) -> None:
    """scikit-learn's schedules decay per sample over the epochs (t from 1), and 'optimal' starts
    at its heuristic rate 1 / alpha ** 0.25, not at eta0: the per-sample steps with the l2
    penalty give scikit-learn's weights after 4 epochs, on two and three classes."""
    common = dict(penalty="l2", shuffle=False, max_iter=4, tol=None, **params)
    if estimator is OrtSGDRegressor:
        X, y = make_regression(n_samples=60, n_features=4, noise=5.0, random_state=1)
        datasets = [(scale(X), y / y.std())]
    else:
        datasets = [_binary(), _three_classes()]
    for X, y in datasets:
        ours, theirs = _fit_both(estimator(**ONE, **common), reference(**common), X, y)
        np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=2e-4, atol=2e-5)
        assert ours.t_ == theirs.t_


def test_multinomial_needs_the_log_loss() -> None:
    X, y = _three_classes()
    with pytest.raises(ValueError, match="multi_class='multinomial' is the softmax cross-entropy"):
        OrtSGDClassifier(loss="hinge", multi_class="multinomial").fit(X, y)


def test_multinomial_log_loss_is_the_softmax() -> None:
    """multi_class='multinomial': softmax probabilities of the decision values."""
    X, y = _three_classes()
    est = OrtSGDClassifier(loss="log_loss", multi_class="multinomial", **COMMON).fit(X, y)
    d = est.decision_function(X).astype(np.float64)
    e = np.exp(d - d.max(axis=1, keepdims=True))
    np.testing.assert_allclose(est.predict_proba(X), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("loss", ["hinge", "log_loss", "modified_huber"])
@pytest.mark.parametrize("data", [_binary, _three_classes], ids=["binary", "ovr"])
def test_deployed_graph_predicts_as_the_estimator(loss: str, data: Any) -> None:
    X, y = data()
    est = OrtSGDClassifier(loss=loss, **COMMON).fit(X, y)
    model = est.to_onnx()
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    label, second = sess.run(None, {sess.get_inputs()[0].name: X.astype(np.float32)})
    np.testing.assert_array_equal(label, est.predict(X))
    if loss == "hinge":
        assert model.graph.output[1].name == "scores"
        d = est.decision_function(X)
        expected = np.column_stack([-d, d]) if d.ndim == 1 else d
        np.testing.assert_allclose(second, expected, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(second, est.predict_proba(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("average", [True, 7])
@pytest.mark.parametrize("estimator", ["regressor", "classifier"])
def test_average_as_scikit_learn(average: Any, estimator: str) -> None:
    """Averaged SGD with one row per step: scikit-learn's averaged coef_ and intercept_ (the
    mean of the weights after each sample from sample `average` on), its predictions, and on
    through partial_fit."""
    params = dict(penalty="l2", alpha=0.01, shuffle=False, max_iter=3, tol=None, average=average)
    if estimator == "regressor":
        X, y = make_regression(n_samples=60, n_features=4, noise=5.0, random_state=1)
        X, y = scale(X), y / y.std()
        params.update(learning_rate="invscaling", eta0=0.02)
        ours, theirs = _fit_both(OrtSGDRegressor(**ONE, **params), SGDRegressor(**params), X, y)
    else:
        X, y = _three_classes()
        params.update(loss="log_loss", learning_rate="optimal")
        ours, theirs = _fit_both(OrtSGDClassifier(**ONE, **params), SGDClassifier(**params), X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(ours.predict(X), theirs.predict(X), rtol=1e-3, atol=1e-4)
    ours.partial_fit(X, y)
    theirs.partial_fit(X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=2e-4, atol=2e-5)
    # the averaged weights differ from the last ones: a test that could not tell proves nothing
    plain = OrtSGDRegressor if estimator == "regressor" else OrtSGDClassifier
    last = plain(**ONE, **{**params, "average": False}).fit(X, y)
    assert np.abs(last.coef_ - ours.coef_).max() > 1e-3


@pytest.mark.parametrize(
    ("estimator", "learning_rate", "n_rows", "rows_per_step"),
    [
        (OrtSGDClassifier, "optimal", 100, 16),  # at least 16 rows
        (OrtSGDClassifier, "optimal", 6400, 64),  # 100 steps an epoch: 'optimal''s large rates
        (OrtSGDClassifier, "invscaling", 6400, 200),  # 32 steps an epoch
        (OrtSGDRegressor, "invscaling", 6400, 200),
        (OrtSGDRegressor, "invscaling", 40000, 1024),  # at most 1024 rows
        (OrtSGDRegressor, "invscaling", 10, 10),  # at most the data
    ],
)
def test_auto_batch_size_as_documented(
    estimator: Any, learning_rate: str, n_rows: int, rows_per_step: int
) -> None:
    """batch_size='auto': n_samples // 32 rows a step (n_samples // 100 with 'optimal'), 16 to
    1024 and at most the data; an epoch then takes ceil(n / rows) steps."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, 3)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) if estimator is OrtSGDClassifier else X[:, 0] + 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = estimator(learning_rate=learning_rate, eta0=0.01, max_iter=1, tol=None, random_state=0).fit(
            X, y
        )
    # t_ counts the rows stepped on from 1; the steps of the epoch are the batches
    assert est.t_ == n_rows + 1
    assert est._trainer.batch_size == rows_per_step


@pytest.mark.parametrize("batch_size", ["auto", 1])
def test_squared_hinge_at_default_rates_fits_like_scikit_learn(batch_size: Any) -> None:
    """The squared hinge at the default 'optimal' rates: scikit-learn's per-sample steps run to
    margins of 1e13, which only its clip of d loss at 1e12 keeps finite; ours clips there too
    (the float32 square overflowed) and scores as scikit-learn's on standardised breast_cancer."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = scale(X)
    ours = OrtSGDClassifier(loss="squared_hinge", batch_size=batch_size, random_state=0).fit(X, y)
    theirs = SGDClassifier(loss="squared_hinge", random_state=0).fit(X, y)
    assert ours.score(X, y) == pytest.approx(theirs.score(X, y), abs=0.01)


def test_huber_with_zero_epsilon_fits_as_scikit_learn():
    # the parameter check took epsilon=0 (as scikit-learn's) and fit then raised core's
    # "epsilon must be > 0"; every gradient is 0 then, in both libraries
    X, y = make_regression(n_samples=100, n_features=4, noise=5, random_state=0)
    X, y = scale(X), (y - y.mean()) / y.std()
    kw = dict(loss="huber", epsilon=0.0, random_state=0, shuffle=False, max_iter=3, tol=None)
    ours, theirs = _fit_both(OrtSGDRegressor(**kw, **ONE), SGDRegressor(**kw), X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, atol=1e-6)


@pytest.mark.parametrize("Ours", [OrtSGDClassifier, OrtSGDRegressor])
def test_negative_power_t_is_refused_by_the_parameter_check(Ours):
    # power_t < 0 passed the parameter check and fit then raised "alpha and power_t must be
    # >= 0", naming alpha's internal scaled value; scikit-learn deprecated negative values
    # in 1.8 (FutureWarning: an error from 1.10): refused up front, naming power_t
    X, y = _binary()
    with pytest.raises(
        ValueError, match=r"The 'power_t' parameter of Ort\w+ must be a float in the range \[0"
    ):
        Ours(learning_rate="invscaling", power_t=-0.3).fit(X, y)
