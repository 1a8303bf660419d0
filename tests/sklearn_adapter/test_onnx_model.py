"""OnnxModelRegressor / OnnxModelClassifier fine-tune a given graph or scikit-learn model."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import onnxruntime
import pytest
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.metrics import log_loss, mean_squared_error
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ort_train_sklearn import OnnxModelClassifier, OnnxModelRegressor


@pytest.fixture(scope="module")
def diabetes() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    return X, ((y - y.mean()) / y.std()).astype(np.float32)


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X).astype(np.float32), y


def _session(model):  # type: ignore[no-untyped-def]
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_fine_tunes_a_fitted_mlp_on_new_data(diabetes):
    """Fitted by scikit-learn on one half, fine-tuned on the other: the loss starts where the
    fitted model is on that half and goes down."""
    X, y = diabetes
    half = len(X) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fitted = MLPRegressor(hidden_layer_sizes=(20,), max_iter=300, random_state=0).fit(X[:half], y[:half])
    start = mean_squared_error(y[half:], fitted.predict(X[half:]))
    model = OnnxModelRegressor(fitted, learning_rate_init=1e-3, max_iter=20, batch_size=16, random_state=0)
    model.fit(X[half:], y[half:])
    # the first epoch's average batch loss is within a few percent of the starting point, on
    # scikit-learn's MLPRegressor scale (half the mean squared error)
    assert model.loss_curve_[0] == pytest.approx(start / 2, rel=0.03)
    assert model.loss_curve_[-1] < 0.97 * model.loss_curve_[0]
    after = mean_squared_error(y[half:], model.predict(X[half:]))
    assert after < start
    # the scikit-learn model itself is untouched
    np.testing.assert_allclose(fitted.predict(X[half:]), fitted.predict(X[half:]))
    onx = model.to_onnx()
    pred = _session(onx).run(None, {"X": X[half:]})[0].ravel()
    np.testing.assert_allclose(pred, model.predict(X[half:]), rtol=1e-5, atol=1e-6)


def test_fine_tunes_a_logistic_regression(iris):
    X, y = iris
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fitted = LogisticRegression(max_iter=3).fit(X[::2], y[::2])
    start = log_loss(y[1::2], fitted.predict_proba(X[1::2]))
    model = OnnxModelClassifier(fitted, learning_rate_init=0.05, max_iter=30, random_state=0).fit(
        X[1::2], y[1::2]
    )
    np.testing.assert_array_equal(model.classes_, fitted.classes_)
    assert model.loss_curve_[0] < 1.05 * start
    assert log_loss(y[1::2], model.predict_proba(X[1::2])) < start
    label, proba = _session(model.to_onnx()).run(None, {"X": X[1::2]})
    np.testing.assert_array_equal(label, model.predict(X[1::2]))
    np.testing.assert_allclose(proba, model.predict_proba(X[1::2]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["proto", "bytes", "path"])
def test_onnx_model_inputs_start_from_the_same_weights(diabetes, tmp_path, form):
    X, y = diabetes
    fitted = LinearRegression().fit(X, y)
    onx = to_onnx(fitted, X[:1], black_op={"LinearRegressor"})
    path = tmp_path / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    source = {"proto": onx, "bytes": onx.SerializeToString(), "path": str(path)}[form]
    # one step with a tiny learning rate stays at scikit-learn's least-squares optimum
    model = OnnxModelRegressor(source, learning_rate_init=1e-9, max_iter=1, batch_size=len(X)).fit(X, y)
    np.testing.assert_allclose(model.predict(X), fitted.predict(X), rtol=1e-4, atol=1e-4)


def test_unfitted_estimator_gives_the_architecture(diabetes):
    X, y = diabetes
    model = OnnxModelRegressor(LinearRegression(), learning_rate_init=1e-9, max_iter=1).fit(X, y)
    np.testing.assert_allclose(
        model.predict(X), LinearRegression().fit(X, y).predict(X), rtol=1e-3, atol=1e-3
    )


def test_kind_mismatch_and_missing_model(diabetes, iris):
    X, y = iris
    fitted = LogisticRegression().fit(X, y)
    with pytest.raises(ValueError, match="OnnxModelClassifier"):
        OnnxModelRegressor(fitted).fit(X, y.astype(np.float32))
    with pytest.raises(ValueError, match="needs model="):
        OnnxModelRegressor().fit(*diabetes)


def test_pickle_continues_identically(diabetes):
    X, y = diabetes
    fitted = LinearRegression().fit(X[:200], y[:200])
    model = OnnxModelRegressor(fitted, warm_start=True, max_iter=2, shuffle=False, learning_rate_init=0.01)
    model.fit(X[200:], y[200:])
    copy = pickle.loads(pickle.dumps(model))
    model.fit(X[200:], y[200:])
    copy.fit(X[200:], y[200:])
    np.testing.assert_allclose(copy.predict(X), model.predict(X), rtol=1e-6)
    assert model.loss_curve_[-1] < model.loss_curve_[0]


def test_alpha_penalises_the_coefficients_not_the_intercepts(iris):
    """skl2onnx writes LogisticRegression's intercept as a (1, K) row: a bias all the same, which
    alpha leaves alone as scikit-learn does; the coefficients' step gains -lr 2 alpha W."""
    X, y = iris
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fitted = LogisticRegression(max_iter=300).fit(X, y)
    kw = dict(learning_rate_init=0.1, max_iter=1, batch_size=len(X), shuffle=False)
    plain = OnnxModelClassifier(fitted, alpha=0.0, **kw).fit(X, y)
    penalised = OnnxModelClassifier(fitted, alpha=1.0, **kw).fit(X, y)
    intercepts = penalised.weights_["intercept"], plain.weights_["intercept"]
    np.testing.assert_allclose(*intercepts, rtol=0, atol=1e-7)
    np.testing.assert_allclose(
        penalised.weights_["coef"] - plain.weights_["coef"], -0.1 * 2 * fitted.coef_.T, rtol=1e-4, atol=1e-6
    )


def test_classes_in_another_order_than_the_models_are_refused(iris):
    """classes= names the logit columns in order: the model's own labels permuted would swap its
    predictions, from the fitted estimator and from its skl2onnx export alike; new names for
    the columns are fine."""
    X, y = iris
    fitted = LogisticRegression(max_iter=300).fit(X, y)
    exported = to_onnx(fitted, X[:1], target_opset=17, options={"zipmap": False})
    exported.ir_version = min(exported.ir_version, 10)
    kw = dict(learning_rate_init=1e-12, max_iter=1)
    for model in (fitted, exported):
        with pytest.raises(ValueError, match=r"classes=\[2, 1, 0\] lists .* in another order"):
            OnnxModelClassifier(model, classes=[2, 1, 0], **kw).fit(X, y)
    names = np.array(["setosa", "versicolor", "virginica"])
    renamed = OnnxModelClassifier(exported, classes=names, **kw).fit(X, names[y])
    np.testing.assert_array_equal(renamed.classes_, names)
    np.testing.assert_array_equal(renamed.predict(X), names[fitted.predict(X)])
