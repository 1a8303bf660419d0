"""scikit-learn conventions of the adapter (issue 30, item 12): the estimator tags say what
the estimators fit, as scikit-learn's own say; a y in the graph's own [N, 1] shape is taken
without a DataConversionWarning."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_iris, make_multilabel_classification
from sklearn.exceptions import DataConversionWarning
from sklearn.linear_model import LinearRegression, SGDClassifier
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ort_train_core import LearningRateAdam
from ort_train_sklearn import (
    OnnxModelClassifier,
    OnnxModelRegressor,
    OrtMLPClassifier,
    OrtSGDClassifier,
    OrtSGDRegressor,
)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_mlp_classifier_multi_label_tag_as_scikit_learn() -> None:
    # the tag says what fit accepts: both fit the same (n, k) 0/1 indicator matrix
    X, Y = make_multilabel_classification(n_samples=40, n_features=4, n_classes=3, random_state=0)
    ours = OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=2, random_state=0).fit(X, Y)
    assert ours.predict(X).shape == Y.shape
    theirs = MLPClassifier().__sklearn_tags__().classifier_tags
    assert theirs.multi_label is True
    assert OrtMLPClassifier().__sklearn_tags__().classifier_tags == theirs
    # SGDClassifier takes no indicator matrix: neither tag claims one
    sgd = SGDClassifier().__sklearn_tags__().classifier_tags.multi_label
    assert OrtSGDClassifier().__sklearn_tags__().classifier_tags.multi_label is sgd is False
    assert np.isin(ours.predict(X), (0, 1)).all()


def _linear_graph(n_features: int, out_dims: list[Any], input_name: str = "x") -> onnx.ModelProto:
    """y = x @ W + b, the output declared with out_dims."""
    W = numpy_helper.from_array(np.random.RandomState(0).randn(n_features, 1).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(1, np.float32), "b")
    nodes = [helper.make_node("Gemm", [input_name, "W", "b"], ["z"])]
    if len(out_dims) == 1:
        nodes.append(helper.make_node("Squeeze", ["z", "axis1"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["z"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)],
        [W, b, numpy_helper.from_array(np.array([1], np.int64), "axis1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.filterwarnings("error")
def test_onnx_regressor_takes_y_of_the_graphs_column_shape() -> None:
    # the graph predicts [N, 1]: a y of that shape is its own, taken as LinearRegression takes
    # a column y (no DataConversionWarning, predictions of the same shape)
    rng = np.random.RandomState(0)
    X = rng.randn(40, 3).astype(np.float32)
    y = (X @ np.array([[1.0], [2.0], [3.0]])).astype(np.float32)
    params: dict[str, Any] = dict(max_iter=3, learning_rate_init=0.05, shuffle=False, random_state=0)
    column = OnnxModelRegressor(_linear_graph(3, ["N", 1]), **params).fit(X, y)
    assert column.predict(X).shape == LinearRegression().fit(X, y).predict(X).shape == (40, 1)
    # the same training as with the raveled y
    flat = OnnxModelRegressor(_linear_graph(3, ["N", 1]), **params).fit(X, y.ravel())
    assert flat.predict(X).shape == (40,)
    np.testing.assert_array_equal(column.predict(X).ravel(), flat.predict(X))
    np.testing.assert_array_equal(column.loss_curve_, flat.loss_curve_)
    assert column.score(X, y) == pytest.approx(flat.score(X, y.ravel()), rel=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_onnx_regressor_fine_tunes_a_multi_output_mlp_regressor() -> None:
    # skl2onnx ends a 3-target MLPRegressor with Reshape(., [-1, 1]): its graph gives 3N rows
    # of one value, and y of shape (N, 3) was refused ("the model's label expects (n, 1)")
    rng = np.random.RandomState(0)
    X = rng.randn(120, 5)
    Y = X @ rng.randn(5, 3)
    mlp = MLPRegressor(hidden_layer_sizes=(8,), max_iter=30, random_state=0).fit(X, Y)
    still = OnnxModelRegressor(mlp, max_iter=1, learning_rate_init=1e-12, shuffle=False).fit(X, Y)
    assert still.predict(X).shape == mlp.predict(X).shape == (120, 3)
    np.testing.assert_allclose(still.predict(X), mlp.predict(X), rtol=1e-4, atol=1e-5)
    tuned = OnnxModelRegressor(mlp, max_iter=30, random_state=0).fit(X, Y)
    assert tuned.score(X, Y) > mlp.score(X, Y)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_onnx_regressor_warns_for_a_column_y_of_a_flat_graph() -> None:
    # a graph predicting [N] keeps scikit-learn's warning for a column y, as MLPRegressor's
    rng = np.random.RandomState(0)
    X = rng.randn(40, 3).astype(np.float32)
    y = X[:, :1].copy()
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        MLPRegressor(max_iter=1).fit(X, y)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        OnnxModelRegressor(_linear_graph(3, ["N"]), max_iter=1).fit(X, y)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_messages_show_plain_numbers_not_numpy_reprs() -> None:
    X = np.random.RandomState(0).randn(20, 3)
    with pytest.raises(ValueError, match="only one class") as one_class:
        OrtMLPClassifier(max_iter=1).fit(X, np.full(20, 3.0))
    assert str(one_class.value).endswith("only one class: 3.0")
    # a learning rate from np.logspace (as a grid search gives it) shows as the float typed
    # in: the repr the trainers compare on a warm fit and key their graph caches with
    rate = np.logspace(-3, -2, 3)[1]
    assert repr(LearningRateAdam(eta0=rate)) == repr(LearningRateAdam(eta0=float(rate)))
    assert repr(LearningRateAdam(eta0=np.float32(0.002))) == "LearningRateAdam(eta0=0.002)"
    with pytest.raises(ValueError, match="learning rate") as invalid:
        LearningRateAdam(eta0=np.float64(np.nan)).validate()
    assert str(invalid.value).endswith("got nan")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_to_onnx_keeps_the_given_input_name() -> None:
    # the deployed graph takes the input the user's graph took: {"x": X}, not {"X": X}
    rng = np.random.RandomState(0)
    X = rng.randn(30, 3).astype(np.float32)
    regressor = OnnxModelRegressor(_linear_graph(3, ["N", 1]), max_iter=2).fit(X, X[:, 0])
    classifier = OnnxModelClassifier(_linear_graph(3, ["N", 1], "features"), max_iter=2)
    classifier.fit(X, (X[:, 0] > 0).astype(int))
    for model, name, expected in [(regressor, "x", regressor.predict(X)), (classifier, "features", None)]:
        onx = model.to_onnx()
        assert [i.name for i in onx.graph.input] == [name]
        sess = onnxruntime.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
        outputs = sess.run(None, {name: X})
        if expected is not None:
            np.testing.assert_allclose(outputs[0].ravel(), expected, rtol=1e-6)
        else:
            np.testing.assert_array_equal(outputs[0], classifier.predict(X))
            np.testing.assert_allclose(outputs[1], classifier.predict_proba(X), rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_to_onnx_takes_float64_on_request() -> None:
    # float64 in, float64 out, as the estimators' predict for float64 X (computed in float32)
    X, y = load_iris(return_X_y=True)
    classifier = OrtMLPClassifier(hidden_layer_sizes=(5,), max_iter=5, random_state=0).fit(X, y)
    regressor = OrtSGDRegressor(max_iter=5, random_state=0).fit(X, X[:, 0])
    column = OnnxModelRegressor(_linear_graph(4, ["N", 1]), max_iter=2).fit(X, X[:, :1])
    for model, name in [(classifier, "X"), (regressor, "X"), (column, "x")]:
        onx = model.to_onnx(dtype=np.float64)
        sess = onnxruntime.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
        assert [(i.name, i.type) for i in sess.get_inputs()] == [(name, "tensor(double)")]
        outputs = sess.run(None, {name: X})
        expected = model.predict(X)
        assert outputs[0].dtype == expected.dtype
        np.testing.assert_allclose(outputs[0].reshape(expected.shape), expected, rtol=1e-6)
    np.testing.assert_allclose(outputs[0], column.predict(X), rtol=1e-6)
    probabilities = onnxruntime.InferenceSession(
        classifier.to_onnx(dtype=np.float64).SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"X": X})[1]
    assert probabilities.dtype == np.float64
    np.testing.assert_allclose(probabilities, classifier.predict_proba(X), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"dtype must be numpy\.float32 or numpy\.float64, got int32"):
        regressor.to_onnx(dtype=np.int32)
