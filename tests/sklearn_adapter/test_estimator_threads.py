"""The estimators' ``threads`` (issue 26 item 23): onnxruntime's intra-op threads of every
session an estimator makes (its trainer's steps and validation loss, its predictions); None
keeps the one-thread rule for small work. A scikit-learn parameter: get_params, set_params,
clone and pickling keep it; anything but None or an integer >= 1 is refused."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from sklearn.base import clone

from ort_train_core import OrtGradientOptimizer
from ort_train_sklearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

ESTIMATORS = [
    (OrtSGDRegressor, dict(max_iter=2, tol=None)),
    (OrtSGDClassifier, dict(max_iter=2, tol=None)),
    (OrtMLPRegressor, dict(hidden_layer_sizes=(4,), max_iter=2, solver="sgd")),
    (OrtMLPClassifier, dict(hidden_layer_sizes=(4,), max_iter=2, solver="sgd")),
]


def _data(classifier: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    X = rng.standard_normal((40, 3))
    y = X @ np.array([1.0, -0.5, 0.25])
    return X, (y > 0).astype(int) if classifier else y


def _threads_of(session: Any) -> int:
    """onnxruntime's intra-op threads (0: its default pool); C-level or Python sessions."""
    options = (
        session.session_options if hasattr(session, "session_options") else session.get_session_options()
    )
    return int(options.intra_op_num_threads)


def _training_sessions(trainer: Any) -> list[Any]:
    graphs = trainer._graphs()
    sessions = list(graphs.evaluators.values())
    if isinstance(trainer, OrtGradientOptimizer):
        return [*sessions, *(step.session for step in graphs.steps.values())]
    sessions.extend(pair.session for pair in graphs.forward_backward.values())
    sessions.extend(g.session for g in graphs.loss_gradients.values())
    return [*sessions, *(u.session for u in graphs.updates.values())]


def _all_threads(est: Any) -> set[int]:
    est.predict(est._fit_X)
    predicting = [s for entry in est._sessions.values() for s in entry.by_threads.values()]
    return {_threads_of(s) for s in [*_training_sessions(est._trainer), *predicting]}


@pytest.mark.parametrize("training", ["full", "partial"])
@pytest.mark.parametrize(("Estimator", "params"), ESTIMATORS)
def test_the_estimators_sessions_take_threads(Estimator: Any, params: dict[str, Any], training: str) -> None:
    X, y = _data(Estimator in (OrtSGDClassifier, OrtMLPClassifier))
    for threads, expected in [(2, {2}), (None, {1}), (3, {3})]:
        est = Estimator(**params, training=training, threads=threads)
        est._fit_X = X
        est.fit(X, y)
        assert _all_threads(est) == expected, threads
    est.set_params(threads=2)
    est.partial_fit(X, y, **({"classes": [0, 1]} if est._is_classifier else {}))
    est._sessions.clear()
    assert _all_threads(est) == {2}


@pytest.mark.parametrize(("Estimator", "params"), ESTIMATORS)
def test_threads_is_a_scikit_learn_parameter(Estimator: Any, params: dict[str, Any]) -> None:
    est = Estimator(**params, threads=2)
    assert est.get_params()["threads"] == 2
    assert clone(est).threads == 2
    assert Estimator().threads is None
    X, y = _data(Estimator in (OrtSGDClassifier, OrtMLPClassifier))
    est.fit(X, y)
    again = pickle.loads(pickle.dumps(est))
    assert again.threads == 2
    np.testing.assert_array_equal(again.predict(X), est.predict(X))


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2"])
def test_invalid_threads_are_refused(bad: Any) -> None:
    X, y = _data(False)
    with pytest.raises(ValueError, match=r"The 'threads' parameter of OrtSGDRegressor must be"):
        OrtSGDRegressor(threads=bad).fit(X, y)


def test_onnx_model_regressor_takes_threads() -> None:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    from ort_train_sklearn import OnnxModelRegressor

    X, y = _data(False)
    fitted = to_onnx(LinearRegression().fit(X, y), X[:1].astype(np.float32))
    est = OnnxModelRegressor(fitted, max_iter=2, batch_size=8, threads=2)
    assert clone(est).get_params()["threads"] == 2
    est._fit_X = X
    est.fit(X, y)
    assert _all_threads(est) == {2}
    with pytest.raises(ValueError, match=r"The 'threads' parameter of OnnxModelRegressor must be"):
        OnnxModelRegressor(fitted, threads=0).fit(X, y)


def test_lbfgs_gradient_session_takes_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from ort_train_sklearn import mlp

    made: list[Any] = []
    original = mlp.inference_session

    def recording(model: bytes, device: Any, threads: Any) -> Any:
        made.append(original(model, device, threads))
        return made[-1]

    monkeypatch.setattr(mlp, "inference_session", recording)
    X, y = _data(False)
    OrtMLPRegressor(hidden_layer_sizes=(4,), solver="lbfgs", max_iter=3, threads=2).fit(X, y)
    assert [_threads_of(s) for s in made] == [2]
