"""skl2onnx converts Pipelines that hold this package's estimators (issue 30 item 12): a
converter is registered for each (their own ``to_onnx()`` graphs), on import when skl2onnx is
imported, else once it is (importing ort_train_sklearn does not import skl2onnx). The converted
Pipeline's labels, probabilities and values equal the Pipeline's own on held-out rows."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import onnxruntime
import pytest
import skl2onnx
from sklearn.base import is_classifier
from sklearn.datasets import load_diabetes, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import ort_train_sklearn
from ort_train_sklearn import (
    OnnxModelClassifier,
    OnnxModelRegressor,
    OrtMLPClassifier,
    OrtMLPRegressor,
    OrtSGDClassifier,
    OrtSGDRegressor,
)

#: onnxruntime 1.19 loads opsets up to 21; skl2onnx's default is newer
OPSET = 21

ESTIMATORS = [
    OrtSGDClassifier(loss="log_loss", max_iter=30, random_state=0),
    OrtSGDClassifier(loss="hinge", max_iter=30, random_state=0),
    OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0),
    OnnxModelClassifier(LogisticRegression(max_iter=50), max_iter=3, random_state=0),
    OrtSGDRegressor(max_iter=30, random_state=0),
    OrtMLPRegressor(hidden_layer_sizes=(8,), max_iter=50, random_state=0),
    OnnxModelRegressor(LinearRegression(), max_iter=3, random_state=0),
]


def _fitted_pipeline(estimator: Any) -> tuple[Any, np.ndarray]:
    """StandardScaler + the estimator fitted on even rows; the odd rows are held out."""
    X, y = load_iris(return_X_y=True) if is_classifier(estimator) else load_diabetes(return_X_y=True)
    if not is_classifier(estimator):
        y = (y - y.mean()) / y.std()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pipeline = make_pipeline(StandardScaler(), estimator).fit(X[::2], y[::2])
    return pipeline, X[1::2]


def _run(model: Any, X: np.ndarray) -> list[Any]:
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: list[Any] = sess.run(None, {sess.get_inputs()[0].name: X})
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "estimator", ESTIMATORS, ids=lambda e: f"{type(e).__name__}-{e.get_params().get('loss')}"
)
def test_a_pipeline_holding_ours_converts_with_skl2onnx(estimator: Any, dtype: Any) -> None:
    pipeline, X = _fitted_pipeline(estimator)
    X = X.astype(dtype)
    classifier = is_classifier(estimator)
    options = {"zipmap": False} if classifier else None
    outputs = _run(skl2onnx.to_onnx(pipeline, X[:1], options=options, target_opset=OPSET), X)
    if not classifier:
        assert outputs[0].dtype == dtype
        np.testing.assert_allclose(outputs[0].ravel(), pipeline.predict(X), rtol=1e-4, atol=1e-5)
        return
    label, scores = outputs
    np.testing.assert_array_equal(label, pipeline.predict(X))
    # a hinge classifier has no probabilities: skl2onnx's second output is then its decision values
    expected = (
        pipeline.predict_proba(X) if hasattr(pipeline, "predict_proba") else pipeline.decision_function(X)
    )
    np.testing.assert_allclose(scores.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)


def test_the_default_zipmap_gives_a_dict_per_row() -> None:
    pipeline, X = _fitted_pipeline(OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0))
    X = X.astype(np.float32)
    label, rows = _run(skl2onnx.to_onnx(pipeline, X[:1], target_opset=OPSET), X)
    np.testing.assert_array_equal(label, pipeline.predict(X))
    proba = np.array([[row[c] for c in pipeline.classes_] for row in rows])
    np.testing.assert_allclose(proba, pipeline.predict_proba(X), rtol=1e-5, atol=1e-6)


def test_every_public_estimator_has_a_converter() -> None:
    from skl2onnx._supported_operators import sklearn_operator_name_map

    public = [getattr(ort_train_sklearn, n) for n in ort_train_sklearn.__all__ if n != "__version__"]
    assert len(public) == 6
    assert all(cls in sklearn_operator_name_map for cls in public)


@pytest.mark.parametrize("first", ["ort_train_sklearn", "skl2onnx"])
def test_registered_whichever_is_imported_first_without_importing_skl2onnx(first: str) -> None:
    """In a fresh interpreter: importing ort_train_sklearn alone leaves skl2onnx unimported
    (0.2 s); importing skl2onnx before or after it registers the converters."""
    second = "skl2onnx" if first == "ort_train_sklearn" else "ort_train_sklearn"
    code = (
        f"import sys, {first}\n"
        "alone = 'skl2onnx' in sys.modules\n"
        f"import {second}\n"
        "from skl2onnx._supported_operators import sklearn_operator_name_map as m\n"
        "from ort_train_sklearn import OrtSGDClassifier, OnnxModelRegressor\n"
        "print(alone, OrtSGDClassifier in m, OnnxModelRegressor in m)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(first == "skl2onnx"), "True", "True"]
