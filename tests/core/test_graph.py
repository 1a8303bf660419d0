"""Graph building: add_loss_output (layout, metadata, IR/opset, loss values against numpy),
default_weights_to_train, and the graphs scikit-learn exports through skl2onnx."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    GraphNotDifferentiableError,
    OrtGradientOptimizer,
    add_loss_output,
    default_weights_to_train,
)

N_ROWS = 17


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _opset(model: onnx.ModelProto) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _input(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    (vi,) = [i for i in model.graph.input if i.name == name]
    return vi


def _dims(vi: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def _metadata(model: onnx.ModelProto) -> dict[str, object]:
    return {p.key: json.loads(p.value) for p in model.metadata_props if p.key.startswith("ort_train.")}


def _assert_loadable(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10
    assert _opset(model) <= 21


def _two_output_model(make_linear) -> onnx.ModelProto:
    """The linear model with a second output Z = Relu(Y) @ other."""
    model = make_linear()
    g = model.graph
    g.node.append(helper.make_node("Relu", ["Y"], ["r"]))
    g.node.append(helper.make_node("MatMul", ["r", "other"], ["Z"]))
    g.initializer.append(numpy_helper.from_array(np.ones((1, 2), dtype=np.float32), "other"))
    g.output.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 2]))
    onnx.checker.check_model(model)
    return model


# ---- layout ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("output_index", [0, 1])
def test_loss_output_comes_first_then_the_original_outputs(make_linear, output_index):
    model = _two_output_model(make_linear)
    before = model.SerializeToString()
    out = add_loss_output(model, output_index=output_index)
    assert [o.name for o in out.graph.output] == ["loss", "Y", "Z"]
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert _dims(out.graph.output[0]) == []  # a scalar
    assert model.SerializeToString() == before  # the input model is not modified
    _assert_loadable(out)
    label = _input(out, "label")
    assert _dims(label) == [None, 1 if output_index == 0 else 2]


@pytest.mark.parametrize(
    ("score", "elem_type", "rank"),
    [
        ("squared_error", TensorProto.FLOAT, 2),
        ("absolute_error", TensorProto.FLOAT, 2),
        ("elastic", TensorProto.FLOAT, 2),
        ("log", TensorProto.INT64, 1),
        ("cross_entropy", TensorProto.INT64, 1),
    ],
)
def test_label_and_weight_inputs_have_the_right_type(make_linear, score, elem_type, rank):
    out = add_loss_output(make_linear(n_outputs=3), score, weight_name="sw")
    assert [i.name for i in out.graph.input] == ["X", "label", "sw"]
    label = _input(out, "label")
    assert label.type.tensor_type.elem_type == elem_type
    assert len(_dims(label)) == rank
    if rank == 2:
        assert _dims(label)[1] == 3
    weight = _input(out, "sw")
    assert weight.type.tensor_type.elem_type == TensorProto.FLOAT
    assert len(_dims(weight)) == 1
    _assert_loadable(out)


def test_metadata_records_the_names(make_linear):
    out = add_loss_output(
        _two_output_model(make_linear),
        "absolute_error",
        loss_name="objective",
        label_name="target",
        weight_name="sw",
    )
    meta = _metadata(out)
    assert meta["ort_train.loss_name"] == "objective"
    assert meta["ort_train.label_name"] == "target"
    assert meta["ort_train.weight_name"] == "sw"
    assert meta["ort_train.prediction_outputs"] == ["Y", "Z"]
    assert [o.name for o in out.graph.output] == ["objective", "Y", "Z"]
    assert {"target", "sw"} <= {i.name for i in out.graph.input}
    no_weight = _metadata(add_loss_output(make_linear()))
    assert no_weight["ort_train.weight_name"] is None
    assert no_weight["ort_train.label_name"] == "label"


def test_trainer_finds_the_recorded_names(make_linear, linear_data, ref):
    """A trainer needs no label/weight names for a graph from add_loss_output: a zero sample
    weight on half the rows must give the gradient of the other half only."""
    X, y = linear_data
    out = add_loss_output(make_linear(), loss_name="objective", label_name="target", weight_name="sw")
    sw = (np.arange(len(X)) % 2).astype(np.float32)
    t = OrtGradientOptimizer(
        out,
        loss_output_name="objective",
        max_iter=1,
        batch_size=len(X),
        shuffle=False,
        learning_rate=0.1,
    )
    t.fit(X, y, sample_weight=sw)
    keep = sw > 0
    expected, losses = ref.linear_sgd(
        ref.initializers(make_linear()), X[keep], y[keep], eta=0.1, batch_size=len(X), epochs=1
    )
    np.testing.assert_allclose(t.train_losses_, losses, rtol=1e-5)
    for name, value in expected.items():
        np.testing.assert_allclose(t.get_state()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("opset", "ir_version"), [(22, 11), (23, 12), (21, 10), (13, 7)])
def test_ir_and_opset_are_normalised(make_linear, opset, ir_version):
    model = make_linear(opset=opset, ir_version=ir_version)
    out = add_loss_output(model)
    _assert_loadable(out)
    assert _opset(out) == min(opset, 21)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N_ROWS, 3)).astype(np.float32)
    label = rng.standard_normal((N_ROWS, 1)).astype(np.float32)
    loss, pred = _run(out, {"X": X, "label": label})
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    expected = X.astype(np.float64) @ w["coef"] + w["intercept"]
    np.testing.assert_allclose(pred, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, np.mean((expected - label) ** 2), rtol=1e-5)


# ---- loss values against numpy ----------------------------------------------------------------


def _np_row_loss(score: str, pred: np.ndarray, label: np.ndarray, **kw: float) -> np.ndarray:
    p = pred.astype(np.float64)
    if score in ("squared_error", "l2"):
        return ((p - label) ** 2).sum(axis=1)
    if score in ("absolute_error", "l1"):
        return np.abs(p - label).sum(axis=1)
    if score == "elastic":
        d = p - label
        return (kw["l1_weight"] * np.abs(d) + kw["l2_weight"] * d**2).sum(axis=1)
    if score == "log":
        eps = kw.get("eps", 1e-5)
        q = np.clip(p, eps, 1 - eps)
        if q.shape[1] == 1:  # the probability of class 1
            return -np.log(np.where(label == 1, q[:, 0], 1 - q[:, 0]))
        return -np.log(q[np.arange(len(q)), label])
    if score == "cross_entropy":
        if p.shape[1] == 1:
            z = p[:, 0]
            return np.logaddexp(0.0, z) - label * z
        m = p.max(axis=1)
        lse = m + np.log(np.exp(p - m[:, None]).sum(axis=1))
        return lse - p[np.arange(len(p)), label]
    raise AssertionError(score)


LOSS_CASES = [
    pytest.param("squared_error", 1, None, {}, id="squared-1"),
    pytest.param("squared_error", 3, None, {}, id="squared-3"),
    pytest.param("l2", 2, None, {}, id="l2-alias"),
    pytest.param("absolute_error", 3, None, {}, id="absolute-3"),
    pytest.param("l1", 1, None, {}, id="l1-alias"),
    pytest.param("elastic", 2, None, {"l1_weight": 0.3, "l2_weight": 0.7}, id="elastic"),
    pytest.param("log", 1, "sigmoid", {}, id="log-binary"),
    pytest.param("log", 4, "softmax", {}, id="log-multiclass"),
    pytest.param("log", 1, "sigmoid", {"eps": 0.05}, id="log-eps"),
    pytest.param("cross_entropy", 1, None, {}, id="cross-entropy-binary"),
    pytest.param("cross_entropy", 4, None, {}, id="cross-entropy-multiclass"),
]


def _loss_feeds(score: str, n_outputs: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = (2 * rng.standard_normal((N_ROWS, 3))).astype(np.float32)
    if score in ("log", "cross_entropy"):
        label = rng.integers(0, max(n_outputs, 2), N_ROWS).astype(np.int64)
    else:
        label = rng.standard_normal((N_ROWS, n_outputs)).astype(np.float32)
    sw = rng.uniform(0.0, 2.0, N_ROWS).astype(np.float32)
    return X, label, sw


@pytest.mark.parametrize(("score", "n_outputs", "activation", "kwargs"), LOSS_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_loss_value_matches_numpy(make_linear, score, n_outputs, activation, kwargs, reduction, weighted):
    model = make_linear(n_outputs=n_outputs, activation=activation, seed=n_outputs)
    out = add_loss_output(model, score, reduction=reduction, weight_name="sw" if weighted else None, **kwargs)
    _assert_loadable(out)
    X, label, sw = _loss_feeds(score, n_outputs)
    feeds = {"X": X, "label": label}
    if weighted:
        feeds["sw"] = sw
    loss, pred = _run(out, feeds)
    assert loss.shape == ()
    (pred_only,) = _run(model, {"X": X})
    np.testing.assert_array_equal(pred, pred_only)
    rows = _np_row_loss(score, pred_only, label, **kwargs)
    s = sw.astype(np.float64) if weighted else np.ones(N_ROWS)
    expected = (s * rows).sum() / (s.sum() if reduction == "mean" else 1.0)
    np.testing.assert_allclose(loss, expected, rtol=2e-5)


def test_log_loss_clips_probabilities(make_linear):
    """Probabilities of exactly 0 and 1 give a finite loss -log(eps)."""
    model = make_linear(
        n_outputs=1, coef=np.full((3, 1), 1000.0), intercept=np.zeros(1), activation="sigmoid"
    )
    out = add_loss_output(model, "log", eps=1e-3)
    X = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=np.float32)
    loss, _ = _run(out, {"X": X, "label": np.array([0, 1], dtype=np.int64)})
    np.testing.assert_allclose(loss, -np.log(1e-3), rtol=1e-4)


@pytest.mark.parametrize(
    ("penalty", "l1", "l2"),
    [
        pytest.param({"coef": 0.1}, 0.0, 0.1, id="l2-only"),
        pytest.param({"coef": {"l1": 0.2, "l2": 0.05}}, 0.2, 0.05, id="elastic"),
        pytest.param({"coef": {"l1": 0.3}}, 0.3, 0.0, id="l1-only"),
    ],
)
def test_penalty_is_added_to_the_loss(make_linear, penalty, l1, l2):
    model = make_linear(n_outputs=2, seed=5)
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    X, label, _ = _loss_feeds("squared_error", 2)
    plain, _ = _run(add_loss_output(model), {"X": X, "label": label})
    loss, _ = _run(add_loss_output(model, penalty=penalty), {"X": X, "label": label})
    data = np.mean(((X @ w["coef"] + w["intercept"]) - label) ** 2 @ np.ones(2))
    np.testing.assert_allclose(plain, data, rtol=1e-5)
    expected = data + l1 * np.abs(w["coef"]).sum() + l2 * (w["coef"] ** 2).sum()
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    # the penalty does not depend on the batch: 'sum' adds it once, not per row
    total, _ = _run(add_loss_output(model, penalty=penalty, reduction="sum"), {"X": X, "label": label})
    np.testing.assert_allclose(total, data * N_ROWS + (expected - data), rtol=1e-5)


def test_penalty_on_two_weights(make_linear):
    model = make_linear(n_outputs=1, seed=2)
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    X, label, _ = _loss_feeds("squared_error", 1)
    out = add_loss_output(model, penalty={"coef": {"l1": 0.1, "l2": 0.2}, "intercept": 0.5})
    loss, _ = _run(out, {"X": X, "label": label})
    data = np.mean(((X @ w["coef"] + w["intercept"]) - label) ** 2)
    expected = (
        data
        + 0.1 * np.abs(w["coef"]).sum()
        + 0.2 * (w["coef"] ** 2).sum()
        + 0.5 * (w["intercept"] ** 2).sum()
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param({"score_name": "nope"}, ValueError, r"unknown loss 'nope'", id="unknown-score"),
        pytest.param({"label_name": "X"}, ValueError, r"name 'X' is already used", id="label-is-input"),
        pytest.param({"loss_name": "Y"}, ValueError, r"name 'Y' is already used", id="loss-is-output"),
        pytest.param(
            {"weight_name": "coef"}, ValueError, r"name 'coef' is already used", id="weight-is-init"
        ),
        pytest.param(
            {"loss_name": "mm"}, ValueError, r"name 'mm' is already used", id="loss-is-intermediate"
        ),
        pytest.param({"loss_name": "t", "label_name": "t"}, ValueError, r"'t'", id="loss-equals-label"),
        pytest.param({"label_name": "t", "weight_name": "t"}, ValueError, r"'t'", id="label-equals-weight"),
        pytest.param({"penalty": {"nope": 0.1}}, ValueError, r"penalty names 'nope'", id="penalty-unknown"),
        pytest.param({"penalty": {"coef": {"l3": 1.0}}}, ValueError, r"'l1' and 'l2'", id="penalty-key"),
        pytest.param({"penalty": {"coef": -1.0}}, ValueError, r"must be >= 0", id="penalty-negative"),
        pytest.param(
            {"reduction": "max"},
            ValueError,
            r"reduction must be one of \('mean', 'sum', 'row_mean'\)",
            id="reduction",
        ),
        pytest.param(
            {"output_index": 1}, ValueError, r"output_index=1 but the graph has 1 output", id="index"
        ),
        pytest.param(
            {"score_name": "squared_error", "eps": 0.1}, TypeError, r"does not take", id="bad-kwarg"
        ),
        pytest.param({"score_name": "log", "eps": 0.7}, ValueError, r"eps must be in", id="bad-eps"),
    ],
)
def test_add_loss_output_errors(make_linear, kwargs, error, match):
    with pytest.raises(error, match=match):
        add_loss_output(make_linear(), **kwargs)


def test_add_loss_output_needs_a_model_proto(make_linear):
    with pytest.raises(TypeError, match=r"onnx.ModelProto"):
        add_loss_output(make_linear().SerializeToString())


# ---- which weights are trained --------------------------------------------------------------------


def _weights_model() -> onnx.ModelProto:
    """Initializers in the graph order zeta, shape (int64), alpha, unused, other, mid:
    Y = Reshape(relu(X @ zeta + alpha) @ mid, shape), Z = X @ other."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "zeta"),
        numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "shape"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "alpha"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "unused"),
        numpy_helper.from_array(rng.standard_normal((3, 2)).astype(np.float32), "other"),
        numpy_helper.from_array(rng.standard_normal((4, 1)).astype(np.float32), "mid"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "zeta"], ["h0"]),
        helper.make_node("Add", ["h0", "alpha"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "mid"], ["o"]),
        helper.make_node("Reshape", ["o", "shape"], ["Y"]),
        helper.make_node("MatMul", ["X", "other"], ["Z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "weights",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 2]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def test_default_weights_to_train_are_the_float_initializers_of_the_loss():
    model = _weights_model()
    assert default_weights_to_train(add_loss_output(model), "loss") == ["zeta", "alpha", "mid"]
    assert default_weights_to_train(add_loss_output(model, output_index=1), "loss") == ["other"]
    penalised = add_loss_output(model, output_index=1, penalty={"unused": 0.1})
    assert default_weights_to_train(penalised, "loss") == ["unused", "other"]


def test_trainer_uses_the_default_weights(linear_data):
    X, y = linear_data
    model = _weights_model()
    t = OrtGradientOptimizer(add_loss_output(model), max_iter=2, learning_rate=0.01)
    t.fit(X, y)
    state = t.get_state()
    assert list(state) == ["zeta", "alpha", "mid"]
    trained = {i.name: numpy_helper.to_array(i) for i in t.get_trained_onnx().graph.initializer}
    initial = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for name in ("shape", "other"):  # not trained, kept as they were
        np.testing.assert_array_equal(trained[name], initial[name])
    assert "unused" not in trained  # pruned with the loss branch
    for name in ("zeta", "alpha", "mid"):
        np.testing.assert_array_equal(trained[name], state[name])
        assert not np.array_equal(state[name], initial[name])


@pytest.mark.parametrize("order", [["zeta", "alpha"], ["alpha", "zeta"]])
@pytest.mark.parametrize(("batch_size", "epochs"), [(23, 1), (10, 3)])
def test_named_weights_in_any_order_follow_numpy_sgd(
    make_linear, linear_data, ref, order, batch_size, epochs
):
    X, y = linear_data
    model = make_linear(coef_name="zeta", intercept_name="alpha")
    t = OrtGradientOptimizer(
        add_loss_output(model),
        weights_to_train=order,
        max_iter=epochs,
        batch_size=batch_size,
        shuffle=False,
        learning_rate=0.1,
    )
    t.fit(X, y)
    expected, losses = ref.linear_sgd(
        ref.initializers(model),
        X,
        y,
        eta=0.1,
        batch_size=batch_size,
        epochs=epochs,
        names=("zeta", "alpha"),
    )
    state = t.get_state()
    assert sorted(state) == ["alpha", "zeta"]
    for name in ("zeta", "alpha"):
        np.testing.assert_allclose(state[name], expected[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.train_losses_, losses, rtol=1e-5)


def test_training_only_one_weight_keeps_the_other(make_linear, linear_data, ref):
    X, y = linear_data
    model = make_linear(coef_name="zeta", intercept_name="alpha")
    t = OrtGradientOptimizer(
        add_loss_output(model),
        weights_to_train=["alpha"],
        max_iter=1,
        batch_size=len(X),
        shuffle=False,
        learning_rate=0.1,
    )
    t.fit(X, y)
    init = ref.initializers(model)
    diff = ref.linear_forward(init, X, ("zeta", "alpha")) - y.reshape(-1, 1)
    expected_alpha = init["alpha"] - 0.1 * 2.0 * diff.mean(axis=0)
    assert list(t.get_state()) == ["alpha"]
    np.testing.assert_allclose(t.get_state()["alpha"], expected_alpha, rtol=1e-5)
    trained = {i.name: numpy_helper.to_array(i) for i in t.get_trained_onnx().graph.initializer}
    np.testing.assert_array_equal(trained["zeta"], init["zeta"])


# ---- scikit-learn graphs (skl2onnx) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def diabetes() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    y = (y - y.mean()) / y.std()
    return X.astype(np.float32), y.astype(np.float32)


def test_linear_regressor_op_is_not_differentiable(diabetes):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    X, y = diabetes
    onx = to_onnx(LinearRegression().fit(X, y), X[:1])
    assert "LinearRegressor" in [n.op_type for n in onx.graph.node]
    t = OrtGradientOptimizer(add_loss_output(onx), max_iter=1)
    with pytest.raises(GraphNotDifferentiableError, match=r"LinearRegressor") as info:
        t.fit(X, y)
    assert isinstance(info.value, ValueError)
    assert "black_op" in str(info.value)


def test_linear_regression_with_black_op_matches_sklearn(diabetes):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    X, y = diabetes
    skl = LinearRegression().fit(X, y)
    onx = to_onnx(skl, X[:1], black_op={"LinearRegressor"})
    assert "LinearRegressor" not in [n.op_type for n in onx.graph.node]
    loss_model = add_loss_output(onx)
    _assert_loadable(loss_model)
    assert default_weights_to_train(loss_model, "loss") == ["coef", "intercept"]
    # full-batch gradient descent from zero weights (the export holds the fitted ones; set_state
    # is where a warm fit starts). The smallest eigenvalue of X'X/n is 0.0086: eta=0.2 needs a
    # few thousand steps (0.2 s) to get the ill-conditioned directions (s1, s2) right.
    t = OrtGradientOptimizer(
        loss_model,
        max_iter=3000,
        batch_size=len(X),
        shuffle=False,
        learning_rate=0.2,
        warm_start=True,
    )
    t.set_state({"coef": np.zeros((X.shape[1], 1)), "intercept": np.zeros(1)})
    t.fit(X, y)
    state = t.get_state()
    np.testing.assert_allclose(state["coef"].ravel(), skl.coef_, atol=1e-3)
    np.testing.assert_allclose(state["intercept"], [skl.intercept_], atol=1e-4)
    assert t.train_losses_[0] == pytest.approx(np.mean(y.astype(np.float64) ** 2), rel=1e-5)
    assert t.train_losses_[-1] == pytest.approx(np.mean((skl.predict(X) - y) ** 2), rel=1e-4)


def test_mlp_regressor_export_trains_with_default_weights(mlp_data):
    from skl2onnx import to_onnx
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    X, y = mlp_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(5,), max_iter=3, random_state=0).fit(X, y)
    onx = to_onnx(skl, X[:1])
    inits = {i.name: i for i in onx.graph.initializer}
    assert inits["shape_tensor"].data_type == TensorProto.INT64
    loss_model = add_loss_output(onx)
    weights = default_weights_to_train(loss_model, "loss")
    assert weights == ["coefficient", "intercepts", "coefficient1", "intercepts1"]
    t = OrtGradientOptimizer(loss_model, max_iter=30, batch_size=len(X), shuffle=False, learning_rate=0.05)
    t.fit(X, y)
    # the first epoch's loss is sklearn's squared error before any update
    assert t.train_losses_[0] == pytest.approx(np.mean((skl.predict(X) - y) ** 2), rel=1e-5)
    assert t.train_losses_[-1] < 0.8 * t.train_losses_[0]
    state = t.get_state()
    assert list(state) == weights
    # the exported graph predicts what numpy computes from the trained weights
    (pred,) = _run(t.get_trained_onnx(), {"X": X})
    hidden = np.maximum(X @ state["coefficient"] + state["intercepts"], 0)
    np.testing.assert_allclose(
        pred, hidden @ state["coefficient1"] + state["intercepts1"], rtol=1e-5, atol=1e-5
    )


def test_default_penalized_weights_leave_out_biases_stored_as_rows():
    """Rank >= 2, except a bias row (1, ..., 1, K) that only Add/Sub read (skl2onnx's
    intercepts); a (1, 1) matrix a MatMul reads, a (1, T, D) table added and a row also
    multiplied stay penalised."""
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from ort_train_core.graph import default_penalized_weights

    def init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return nh.from_array(np.ones(shape, np.float32), name)

    nodes = [
        h.make_node("MatMul", ["X", "coef"], ["z"]),
        h.make_node("Add", ["z", "bias_row"], ["z1"]),
        h.make_node("MatMul", ["z1", "one_by_one"], ["z2"]),
        h.make_node("Add", ["z2", "bias_vector"], ["z3"]),
        h.make_node("Mul", ["z3", "scale_row"], ["z4"]),
        h.make_node("Add", ["z4", "scale_row"], ["z5"]),
        h.make_node("Unsqueeze", ["z5", "axes"], ["z6"]),
        h.make_node("Add", ["z6", "positions"], ["Y"]),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("X", TensorProto.FLOAT, [5, 4])],
        [h.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 5, 1])],
        [
            init("coef", (4, 1)),
            init("bias_row", (1, 1)),
            init("one_by_one", (1, 1)),
            init("bias_vector", (1,)),
            init("scale_row", (1, 1)),
            init("positions", (1, 5, 1)),
            nh.from_array(np.array([0], np.int64), "axes"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    names = ["coef", "bias_row", "one_by_one", "bias_vector", "scale_row", "positions"]
    assert default_penalized_weights(model, names) == ["coef", "one_by_one", "scale_row", "positions"]
