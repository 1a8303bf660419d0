"""to_trainable_graph: fitted scikit-learn estimators and skl2onnx graphs -> a trainable
prediction graph (regressors: the prediction; classifiers: the logits), checked against
scikit-learn's predict / decision_function / predict_proba, and trained for one step."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
from sklearn.ensemble import RandomForestRegressor
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import (
    LinearRegression,
    LogisticRegression,
    Ridge,
    SGDClassifier,
    SGDRegressor,
)
from sklearn.metrics import log_loss
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from ort_train_core import GraphNotDifferentiableError, OrtGradientOptimizer, add_loss_output
from ort_train_sklearn._convert import TrainableGraph, to_trainable_graph

LINEAR = ["coef", "intercept"]
MLP = ["coefficient", "intercepts", "coefficient1", "intercepts1"]
ML_OPSET = {"": 17, "ai.onnx.ml": 3}


# ---- data and fitted estimators -------------------------------------------------------------------


def _standardise(X: np.ndarray) -> np.ndarray:
    return ((X - X.mean(axis=0)) / X.std(axis=0)).astype(np.float32)


DATA: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    # standardised features (and target for the regressors)
    "diabetes": lambda: (
        _standardise(load_diabetes(return_X_y=True)[0]),
        _standardise(load_diabetes(return_X_y=True)[1].reshape(-1, 1)).ravel(),
    ),
    "diabetes2": lambda: (
        _standardise(load_diabetes(return_X_y=True)[0]),
        _standardise(np.c_[load_diabetes(return_X_y=True)[1], load_diabetes(return_X_y=True)[0][:, 2]]),
    ),
    "iris": lambda: (_standardise(load_iris(return_X_y=True)[0]), load_iris(return_X_y=True)[1]),
    "cancer": lambda: (
        _standardise(load_breast_cancer(return_X_y=True)[0]),
        load_breast_cancer(return_X_y=True)[1],
    ),
    # raw features, for the pipelines that scale them
    "raw_diabetes": lambda: (
        load_diabetes(return_X_y=True)[0].astype(np.float32),
        _standardise(load_diabetes(return_X_y=True)[1].reshape(-1, 1)).ravel(),
    ),
    "raw_iris": lambda: (load_iris(return_X_y=True)[0].astype(np.float32), load_iris(return_X_y=True)[1]),
    "raw_cancer": lambda: (
        load_breast_cancer(return_X_y=True)[0].astype(np.float32),
        load_breast_cancer(return_X_y=True)[1],
    ),
}

#: name -> (data, estimator factory, expected weights)
REGRESSORS: dict[str, tuple[str, Callable[[], Any], list[str]]] = {
    "LinearRegression": ("diabetes", LinearRegression, LINEAR),
    "Ridge": ("diabetes", lambda: Ridge(alpha=1.0), LINEAR),
    "Ridge-2-outputs": ("diabetes2", lambda: Ridge(alpha=1.0), LINEAR),
    "SGDRegressor": ("diabetes", lambda: SGDRegressor(random_state=0), LINEAR),
    "MLPRegressor": (
        "diabetes",
        lambda: MLPRegressor(hidden_layer_sizes=(8,), max_iter=50, random_state=0),
        MLP,
    ),
    "Pipeline-Ridge": ("raw_diabetes", lambda: make_pipeline(StandardScaler(), Ridge()), LINEAR),
    "Pipeline-2-scalers-MLPRegressor": (
        "raw_diabetes",
        lambda: make_pipeline(
            StandardScaler(),
            StandardScaler(),
            MLPRegressor(hidden_layer_sizes=(8,), max_iter=50, random_state=0),
        ),
        MLP,
    ),
}
CLASSIFIERS: dict[str, tuple[str, Callable[[], Any], list[str]]] = {
    "LogisticRegression-binary": ("cancer", LogisticRegression, LINEAR),
    "LogisticRegression-multiclass": ("iris", LogisticRegression, LINEAR),
    "SGDClassifier-binary": ("cancer", lambda: SGDClassifier(loss="log_loss", random_state=0), LINEAR),
    "SGDClassifier-multiclass": ("iris", lambda: SGDClassifier(loss="log_loss", random_state=0), LINEAR),
    "MLPClassifier-binary": (
        "cancer",
        lambda: MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0),
        MLP,
    ),
    "MLPClassifier-multiclass": (
        "iris",
        lambda: MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0),
        MLP,
    ),
    "Pipeline-LogisticRegression-binary": (
        "raw_cancer",
        lambda: make_pipeline(StandardScaler(), LogisticRegression()),
        LINEAR,
    ),
    "Pipeline-SGDClassifier-multiclass": (
        "raw_iris",
        lambda: make_pipeline(StandardScaler(), SGDClassifier(loss="log_loss", random_state=0)),
        LINEAR,
    ),
    "Pipeline-MLPClassifier-multiclass": (
        "raw_iris",
        lambda: make_pipeline(
            StandardScaler(), MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0)
        ),
        MLP,
    ),
}
CASES = {**REGRESSORS, **CLASSIFIERS}


@pytest.fixture(scope="module")
def fitted() -> Callable[[str], tuple[Any, np.ndarray, np.ndarray]]:
    """name -> (fitted estimator, X, y), each fitted once per module."""
    data_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cache: dict[str, tuple[Any, np.ndarray, np.ndarray]] = {}

    def get(name: str) -> tuple[Any, np.ndarray, np.ndarray]:
        if name not in cache:
            data, factory, _ = CASES[name]
            if data not in data_cache:
                data_cache[data] = DATA[data]()
            X, y = data_cache[data]
            with warnings.catch_warnings():
                # short MLP fits stop before convergence on purpose
                warnings.simplefilter("ignore", ConvergenceWarning)
                cache[name] = (factory().fit(X, y), X, y)
        return cache[name]

    return get


# ---- helpers -----------------------------------------------------------------------------------------


def _run(model: onnx.ModelProto, X: np.ndarray) -> np.ndarray:
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {"X": X})
    return np.asarray(out, dtype=np.float64)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-z)))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def _proba(tg: TrainableGraph, logits: np.ndarray) -> np.ndarray:
    if tg.probability == "sigmoid":
        p1 = _sigmoid(logits[:, 0])
        return np.stack([1 - p1, p1], axis=1)
    return _softmax(logits)


def _assert_trainable_graph(tg: TrainableGraph, n_features: int) -> None:
    model = tg.model
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10
    opsets = {op.domain: op.version for op in model.opset_import}
    assert set(opsets) == {""}, opsets
    assert opsets[""] <= 21
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    (x,) = model.graph.input
    assert x.name == "X"
    assert x.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in x.type.tensor_type.shape.dim][1:] == [n_features]
    (out,) = model.graph.output
    assert out.name == tg.output_name
    assert out.type.tensor_type.elem_type == TensorProto.FLOAT
    inits = {i.name: i for i in model.graph.initializer}
    assert all(inits[w].data_type == TensorProto.FLOAT for w in tg.weights)
    assert not [n for n, i in inits.items() if i.data_type == TensorProto.FLOAT and n not in tg.weights]


def _labels(tg: TrainableGraph, y: np.ndarray) -> np.ndarray:
    assert tg.classes is not None
    return np.searchsorted(tg.classes, y).astype(np.int64)


def _first_loss(tg: TrainableGraph, X: np.ndarray, y: np.ndarray) -> float:
    """One full-batch epoch: train_losses_[0] is the loss of the converted weights."""
    loss_model = add_loss_output(tg.model, tg.loss)
    target = _labels(tg, y) if tg.kind == "classifier" else y.astype(np.float32)
    t = OrtGradientOptimizer(
        loss_model, tg.weights, max_iter=1, batch_size=len(X), shuffle=False, learning_rate=1e-3
    )
    t.fit(X, target)
    assert list(t.get_state()) == tg.weights
    return float(t.train_losses_[0])


# ---- scikit-learn estimators ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(REGRESSORS))
def test_regressor_graph_predicts_like_sklearn(fitted, name):
    est, X, _ = fitted(name)
    tg = to_trainable_graph(est, X)
    _assert_trainable_graph(tg, X.shape[1])
    assert tg.kind == "regressor"
    assert tg.probability is None
    assert tg.classes is None
    assert tg.loss == "squared_error"
    assert tg.weights == REGRESSORS[name][2]
    expected = est.predict(X).reshape(len(X), -1)
    got = _run(tg.model, X)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("name", list(CLASSIFIERS))
def test_classifier_graph_outputs_logits(fitted, name):
    est, X, _ = fitted(name)
    tg = to_trainable_graph(est, X)
    _assert_trainable_graph(tg, X.shape[1])
    assert tg.kind == "classifier"
    assert tg.output_name == "logits"
    assert tg.loss == "cross_entropy"
    assert tg.weights == CLASSIFIERS[name][2]
    np.testing.assert_array_equal(tg.classes, est.classes_)
    n_classes = len(est.classes_)
    logits = _run(tg.model, X)
    proba = est.predict_proba(X)
    if n_classes == 2:
        assert tg.probability == "sigmoid"
        assert logits.shape == (len(X), 1)
        np.testing.assert_allclose(_sigmoid(logits[:, 0]), proba[:, 1], atol=1e-5)
    else:
        assert tg.probability == "softmax"
        assert logits.shape == (len(X), n_classes)
        np.testing.assert_allclose(_softmax(logits), proba, atol=1e-5)
    np.testing.assert_allclose(_proba(tg, logits), proba, atol=1e-5)
    if hasattr(est, "decision_function"):
        decision = est.decision_function(X).reshape(len(X), -1)
        if name.startswith(("SGDClassifier-multiclass", "Pipeline-SGDClassifier-multiclass")):
            # one-vs-rest: p_k is proportional to sigmoid(d_k); the logits are log sigmoid(d)
            decision = -np.logaddexp(0.0, -decision)
        np.testing.assert_allclose(logits, decision, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_graph_trains_and_starts_from_sklearn_loss(fitted, name):
    """The gradient graph builds, and the loss before the first update is scikit-learn's:
    mean squared error for regressors, log-loss of predict_proba for classifiers."""
    est, X, y = fitted(name)
    tg = to_trainable_graph(est, X)
    loss = _first_loss(tg, X, y)
    if tg.kind == "regressor":
        pred = est.predict(X).reshape(len(X), -1)
        expected = float(np.mean(np.sum((pred - y.reshape(len(X), -1)) ** 2, axis=1)))
    else:
        expected = float(log_loss(y, est.predict_proba(X), labels=est.classes_))
    assert loss == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(
    "name", ["Pipeline-Ridge", "Pipeline-LogisticRegression-binary", "Pipeline-2-scalers-MLPRegressor"]
)
def test_pipeline_scaler_is_frozen(fitted, name):
    """StandardScaler steps become Sub/Mul with Constant nodes: part of the graph, not weights."""
    est, X, _ = fitted(name)
    tg = to_trainable_graph(est, X)
    ops = [n.op_type for n in tg.model.graph.node]
    n_scalers = len(est.steps) - 1
    assert ops.count("Sub") >= n_scalers
    assert ops.count("Mul") >= n_scalers
    floats = [i.name for i in tg.model.graph.initializer if i.data_type == TensorProto.FLOAT]
    assert sorted(floats) == sorted(tg.weights)
    final = est.steps[-1][1]
    inits = {i.name: numpy_helper.to_array(i) for i in tg.model.graph.initializer}
    if hasattr(final, "coef_"):
        coef = np.asarray(final.coef_).reshape(X.shape[1], -1) if final.coef_.ndim == 1 else final.coef_
        if coef.shape[0] == 1:  # binary: one column of logits
            np.testing.assert_allclose(inits["coef"].ravel(), coef.ravel(), rtol=1e-6)
        else:
            np.testing.assert_allclose(inits["coef"], coef.reshape(X.shape[1], -1), rtol=1e-6)
    else:
        np.testing.assert_allclose(inits["coefficient"], final.coefs_[0], rtol=1e-6)


def test_without_x_sample_uses_n_features_in(fitted):
    for name in ["Ridge", "SGDClassifier-multiclass", "MLPClassifier-binary"]:
        est, X, _ = fitted(name)
        with_sample = to_trainable_graph(est, X)
        without = to_trainable_graph(est)
        assert without.weights == with_sample.weights
        assert without.probability == with_sample.probability
        np.testing.assert_allclose(_run(without.model, X), _run(with_sample.model, X), rtol=1e-6, atol=1e-6)


def test_string_class_labels():
    X, y = DATA["cancer"]()
    labels = np.array(["benign", "malignant"])[1 - y]
    est = LogisticRegression().fit(X, labels)
    tg = to_trainable_graph(est, X)
    np.testing.assert_array_equal(tg.classes, est.classes_)
    np.testing.assert_allclose(_proba(tg, _run(tg.model, X)), est.predict_proba(X), atol=1e-5)
    # the label indices the cross-entropy expects follow the order of classes
    assert _first_loss(tg, X, labels) == pytest.approx(log_loss(labels, est.predict_proba(X)), rel=1e-4)


# ---- ONNX graphs ------------------------------------------------------------------------------------


def _skl2onnx(est: Any, X: np.ndarray, **kwargs: Any) -> onnx.ModelProto:
    from skl2onnx import to_onnx

    return to_onnx(est, X[:1], **kwargs)


def _black_op_export(est: Any, X: np.ndarray) -> onnx.ModelProto:
    final = est.steps[-1][1] if hasattr(est, "steps") else est
    options = {id(final): {"zipmap": False}} if hasattr(final, "classes_") else None
    return _skl2onnx(
        est, X, target_opset=ML_OPSET, black_op={"LinearRegressor", "LinearClassifier"}, options=options
    )


@pytest.mark.parametrize(
    "name",
    [
        "MLPRegressor",
        "Pipeline-Ridge",
        "LogisticRegression-binary",
        "SGDClassifier-multiclass",
        "Pipeline-MLPClassifier-multiclass",
    ],
)
def test_model_bytes_and_path_give_the_same_graph(fitted, name, tmp_path):
    est, X, _ = fitted(name)
    onx = _black_op_export(est, X)
    before = onx.SerializeToString()
    path = tmp_path / "model.onnx"
    onnx.save(onx, str(path))
    from_proto = to_trainable_graph(onx)
    assert onx.SerializeToString() == before, "the caller's model must not change"
    from_bytes = to_trainable_graph(before)
    from_path = to_trainable_graph(path)
    from_str = to_trainable_graph(str(path))
    from_est = to_trainable_graph(est, X)
    for tg in (from_bytes, from_path, from_str):
        assert tg.model.SerializeToString() == from_proto.model.SerializeToString()
    for tg in (from_proto, from_bytes, from_path, from_est):
        assert tg.kind == from_est.kind
        assert tg.output_name == from_est.output_name
        assert tg.probability == from_est.probability
        assert tg.weights == from_est.weights
        np.testing.assert_array_equal(tg.classes, from_est.classes)  # classes read from the graph
    np.testing.assert_allclose(_run(from_proto.model, X), _run(from_est.model, X), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "weights"),
    [
        ("LinearRegression", LINEAR),
        ("Pipeline-Ridge", LINEAR),
        ("LogisticRegression-binary", LINEAR),
        ("LogisticRegression-multiclass", LINEAR),
        ("Pipeline-LogisticRegression-binary", LINEAR),
        ("SGDClassifier-binary", LINEAR),
        ("Pipeline-SGDClassifier-multiclass", LINEAR),
        ("MLPClassifier-multiclass", MLP),
    ],
)
def test_default_skl2onnx_export(fitted, name, weights):
    """skl2onnx's defaults (ai.onnx.ml LinearRegressor / LinearClassifier / Scaler / Normalizer,
    ZipMap, its newest opset): the ml operators on the path are rewritten, the rest cut."""
    est, X, y = fitted(name)
    onx = _skl2onnx(est, X)
    assert any(n.domain == "ai.onnx.ml" for n in onx.graph.node)
    tg = to_trainable_graph(onx)
    _assert_trainable_graph(tg, X.shape[1])
    assert tg.weights == weights
    out = _run(tg.model, X)
    if tg.kind == "regressor":
        expected = est.predict(X).reshape(out.shape)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    else:
        np.testing.assert_array_equal(tg.classes, est.classes_)
        np.testing.assert_allclose(_proba(tg, out), est.predict_proba(X), atol=1e-5)
    _first_loss(tg, X, y)


def test_string_classes_are_read_from_the_graph():
    X, y = DATA["iris"]()
    labels = np.array(["setosa", "versicolor", "virginica"])[y]
    est = LogisticRegression().fit(X, labels)
    tg = to_trainable_graph(_skl2onnx(est, X, target_opset=ML_OPSET))
    np.testing.assert_array_equal(tg.classes, est.classes_)
    np.testing.assert_allclose(_softmax(_run(tg.model, X)), est.predict_proba(X), atol=1e-5)


# hand-built graphs for the fallbacks of the cut


def _graph(
    nodes: list[onnx.NodeProto],
    outputs: list[onnx.ValueInfoProto],
    inits: dict[str, np.ndarray],
    input_name: str = "X",
    n_features: int = 3,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [None, n_features])],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
        ir_version=8,
    )


def _label_branch(proba: str) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto]]:
    nodes = [helper.make_node("ArgMax", [proba], ["label"], axis=1, keepdims=0)]
    outs = [
        helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
        helper.make_tensor_value_info(proba, TensorProto.FLOAT, [None, None]),
    ]
    return nodes, outs


RNG = np.random.default_rng(0)
X3 = RNG.standard_normal((40, 3)).astype(np.float32)
W2 = RNG.standard_normal((3, 2)).astype(np.float32)
B2 = RNG.standard_normal(2).astype(np.float32)


def _linear(out: str = "z", w: np.ndarray = W2, b: np.ndarray = B2) -> tuple[list[onnx.NodeProto], dict]:
    nodes = [helper.make_node("MatMul", ["X", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], [out])]
    return nodes, {"W": w, "B": b}


def test_binary_softmax_becomes_one_logit_column():
    nodes, inits = _linear()
    nodes.append(helper.make_node("Softmax", ["z"], ["probabilities"], axis=1))
    label_nodes, outs = _label_branch("probabilities")
    tg = to_trainable_graph(_graph(nodes + label_nodes, outs, inits))
    assert tg.probability == "sigmoid"
    np.testing.assert_array_equal(tg.classes, [0, 1])
    logits = _run(tg.model, X3)
    z = X3.astype(np.float64) @ W2 + B2
    assert logits.shape == (len(X3), 1)
    np.testing.assert_allclose(logits[:, 0], z[:, 1] - z[:, 0], rtol=1e-5, atol=1e-5)
    _first_loss(tg, X3, (z[:, 1] > z[:, 0]).astype(np.int64))


def test_normalised_sigmoids_of_two_columns():
    """p1 = s(z1) / (s(z0) + s(z1)) with columns that are not [-z, z]."""
    nodes, inits = _linear()
    nodes += [
        helper.make_node("Sigmoid", ["z"], ["s"]),
        helper.make_node("ReduceSum", ["s", "axes"], ["tot"], keepdims=1),
        helper.make_node("Div", ["s", "tot"], ["probabilities"]),
    ]
    inits["axes"] = np.array([1], dtype=np.int64)
    label_nodes, outs = _label_branch("probabilities")
    tg = to_trainable_graph(_graph(nodes + label_nodes, outs, inits))
    assert tg.probability == "sigmoid"
    assert tg.weights == ["W", "B"]
    s = _sigmoid(X3.astype(np.float64) @ W2 + B2)
    logits = _run(tg.model, X3)
    np.testing.assert_allclose(_sigmoid(logits[:, 0]), s[:, 1] / s.sum(axis=1), atol=1e-6)
    _first_loss(tg, X3, RNG.integers(0, 2, len(X3)))


def test_linear_classifier_with_one_coefficient_row_is_refused():
    """ai.onnx.ml LinearClassifier, binary with one row of coefficients: onnxruntime 1.19 gives
    [1 - z, z] for post_transform LOGISTIC (the ONNX reference [s(-z), s(z)])."""
    node = helper.make_node(
        "LinearClassifier",
        ["X"],
        ["label", "probabilities"],
        domain="ai.onnx.ml",
        coefficients=[0.5, -1.0, 2.0],
        intercepts=[0.25],
        classlabels_ints=[0, 1],
        post_transform="LOGISTIC",
    )
    outs = [
        helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
        helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2]),
    ]
    with pytest.raises(ValueError, match="single row of coefficients"):
        to_trainable_graph(_graph([node], outs, {}))


def test_regressor_input_renamed_and_rank_1_output_reshaped():
    nodes = [
        helper.make_node("MatMul", ["float_input", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "B"], ["y2"]),
        helper.make_node("Reshape", ["y2", "shape"], ["prediction"]),
    ]
    inits = {"W": W2[:, :1].copy(), "B": B2[:1].copy(), "shape": np.array([-1], dtype=np.int64)}
    outs = [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, [None])]
    tg = to_trainable_graph(_graph(nodes, outs, inits, input_name="float_input"))
    assert tg.kind == "regressor"
    assert tg.output_name == "prediction"
    assert tg.weights == ["W", "B"]  # the int64 shape tensor is not a weight
    out = _run(tg.model, X3)
    assert out.shape == (len(X3), 1)
    np.testing.assert_allclose(out, X3 @ W2[:, :1] + B2[:1], rtol=1e-5, atol=1e-5)
    _first_loss(tg, X3, RNG.standard_normal(len(X3)))


# ---- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "est",
    [
        LinearRegression(),
        MLPClassifier(),
        SGDClassifier(loss="log_loss"),
        make_pipeline(StandardScaler(), LogisticRegression()),
    ],
    ids=lambda e: type(e).__name__,
)
def test_unfitted_estimator(est):
    with pytest.raises(NotFittedError):
        to_trainable_graph(est)


def test_unsupported_estimators():
    X, y = DATA["diabetes"]()
    for est, name in [
        (RandomForestRegressor(n_estimators=2), "RandomForestRegressor"),
        (RandomForestRegressor(n_estimators=2).fit(X, y), "RandomForestRegressor"),
        (make_pipeline(MinMaxScaler(), Ridge()).fit(X, y), "MinMaxScaler"),
        (make_pipeline(StandardScaler(), DecisionTreeRegressor()).fit(X, y), "DecisionTreeRegressor"),
    ]:
        with pytest.raises(TypeError, match=name) as info:
            to_trainable_graph(est)
        assert "LinearRegression" in str(info.value)  # the message lists what is supported
    Xc, yc = DATA["cancer"]()
    with pytest.raises(TypeError, match=r"SGDClassifier\(loss='hinge'\)"):
        to_trainable_graph(SGDClassifier(loss="hinge").fit(Xc, yc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        multilabel = MLPClassifier(hidden_layer_sizes=(4,), max_iter=5).fit(Xc, np.c_[yc, 1 - yc])
    with pytest.raises(TypeError, match="multilabel"):
        to_trainable_graph(multilabel)
    with pytest.raises(TypeError, match="ModelProto"):
        to_trainable_graph(42)


def test_graphs_without_gradient_are_refused():
    X, y = DATA["diabetes"]()
    with pytest.raises(GraphNotDifferentiableError, match="TreeEnsembleRegressor"):
        to_trainable_graph(_skl2onnx(DecisionTreeRegressor(max_depth=2).fit(X, y), X))
    Xc, yc = DATA["cancer"]()
    tree = DecisionTreeClassifier(max_depth=2).fit(Xc, yc)
    with pytest.raises(GraphNotDifferentiableError, match="TreeEnsembleClassifier"):
        to_trainable_graph(_skl2onnx(tree, Xc, options={id(tree): {"zipmap": False}}))


def test_bad_inputs(fitted, tmp_path):
    est, X, _ = fitted("Ridge")
    with pytest.raises(ValueError, match="features"):
        to_trainable_graph(est, X[:, :3])
    with pytest.raises(ValueError, match="not a serialised ONNX model"):
        to_trainable_graph(b"certainly not onnx")
    with pytest.raises(FileNotFoundError):
        to_trainable_graph(tmp_path / "missing.onnx")
    nodes, inits = _linear("y")
    two_outputs = _graph(
        [*nodes, helper.make_node("Relu", ["y"], ["r"])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [None, 2]),
        ],
        inits,
    )
    with pytest.raises(ValueError, match="cannot tell what the graph predicts"):
        to_trainable_graph(two_outputs)
    raw_scores = _graph(*_add_label(_linear("scores")))
    with pytest.raises(ValueError, match="cannot find the logits"):
        to_trainable_graph(raw_scores)


def _add_label(
    linear: tuple[list[onnx.NodeProto], dict],
) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto], dict]:
    nodes, inits = linear
    label_nodes, outs = _label_branch("scores")
    return nodes + label_nodes, outs, inits


# ---- ai.onnx.ml nodes and inputs the conversion refuses --------------------------------------------

_ML_COEFS = {
    "coefficients": list(np.arange(9.0) / 9),
    "intercepts": [0.1, 0.2, 0.3],
    "classlabels_ints": [0, 1, 2],
}
_CLF_OUTS = [
    helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
    helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3]),
]


def _refused_graph(case: str) -> onnx.ModelProto:
    ml = "ai.onnx.ml"
    if case == "regressor_post_transform":
        node = helper.make_node(
            "LinearRegressor",
            ["X"],
            ["y"],
            domain=ml,
            coefficients=[0.5, -1.0, 2.0],
            post_transform="SOFTMAX",
        )
        return _graph([node], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])], {})
    if case == "classifier_post_transform":
        node = helper.make_node(
            "LinearClassifier",
            ["X"],
            ["label", "probabilities"],
            domain=ml,
            post_transform="PROBIT",
            **_ML_COEFS,
        )
        return _graph([node], _CLF_OUTS, {})
    if case == "classifier_label_read":  # the probabilities depend on the label output
        nodes = [
            helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ml, **_ML_COEFS),
            helper.make_node("Cast", ["label"], ["label_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["label_f", "axis"], ["label_col"]),
            helper.make_node("Add", ["scores", "label_col"], ["shifted"]),
            helper.make_node("Softmax", ["shifted"], ["probabilities"], axis=1),
        ]
        return _graph(nodes, _CLF_OUTS, {"axis": np.array([1], dtype=np.int64)})
    nodes, inits = _linear("y")
    model = _graph(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])], inits)
    model.graph.input.append(helper.make_tensor_value_info("X2", TensorProto.FLOAT, [None, 3]))
    return model  # two inputs


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("regressor_post_transform", GraphNotDifferentiableError, "post_transform='SOFTMAX'; only NONE"),
        ("classifier_post_transform", GraphNotDifferentiableError, "supported: NONE, LOGISTIC, SOFTMAX"),
        ("classifier_label_read", ValueError, "label output of LinearClassifier"),
        # several inputs train (issue 17, item 1), given rows to check the graph with
        ("two_inputs", ValueError, r"the graph's inputs \['X', 'X2'\] are not one float32 .* pass X_sample"),
    ],
)
def test_refused_ml_nodes_and_inputs(case: str, error: type[Exception], message: str) -> None:
    """onnxruntime runs each graph (so the reference exists); the conversion refuses it with
    a message naming why."""
    with pytest.raises(error, match=message):
        to_trainable_graph(_refused_graph(case))
