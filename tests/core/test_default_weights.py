"""Which float initializers become weights by default: those with a gradient. An initializer that
reaches the outputs only through a comparison, a label lookup or a BatchNormalization's running
statistics is a constant; gradients of the rest against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from core_models import IR_VERSION, OPSET
from onnx import TensorProto, helper, numpy_helper

import ort_train_core.graph as graph_module
from backend_support import training_build_only
from ort_train_core import OrtGradientForwardBackward

TOL = 1e-5
EPS = 1e-5


def _model(nodes, outputs, values) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def test_a_threshold_compared_with_is_no_weight() -> None:
    """Y = X @ W + b, M = Y > thr: W and b train, thr (a float initializer M depends on) does
    not; naming it is refused before onnxruntime is asked."""
    rng = np.random.default_rng(0)
    values = {
        "W": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
        "thr": np.array(0.5, np.float32),
    }
    model = _model(
        [
            helper.make_node("MatMul", ["X", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["Y"]),
            helper.make_node("Greater", ["Y", "thr"], ["M"]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("M", TensorProto.BOOL, ["N", 3]),
        ],
        values,
    )
    fb = OrtGradientForwardBackward(model)
    assert fb.weights_to_train == ["W", "b"]
    x = rng.standard_normal((6, 4)).astype(np.float32)
    dy = rng.standard_normal((6, 3)).astype(np.float32)
    y, m = (o.numpy() for o in fb.forward([x]))
    np.testing.assert_allclose(y, x @ values["W"] + values["b"], rtol=TOL, atol=TOL)
    np.testing.assert_array_equal(m, x @ values["W"] + values["b"] > 0.5)
    dw, db = (g.numpy() for g in fb.backward([dy, None]))
    np.testing.assert_allclose(dw, x.T @ dy, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(db, dy.sum(axis=0), rtol=TOL, atol=TOL)
    with pytest.raises(ValueError, match=r"depends on weight 'thr' only through values without a gradient"):
        OrtGradientForwardBackward(model, ["W", "thr"])


def _batchnorm_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Y = BatchNormalization(X @ W, s, c, mean, var), running statistics as initializers."""
    values = {
        "W": rng.standard_normal((4, 3)).astype(np.float32),
        "s": rng.uniform(0.5, 2, 3).astype(np.float32),
        "c": rng.standard_normal(3).astype(np.float32),
        "mean": rng.standard_normal(3).astype(np.float32),
        "var": rng.uniform(0.5, 2, 3).astype(np.float32),
    }
    model = _model(
        [
            helper.make_node("MatMul", ["X", "W"], ["Z"]),
            helper.make_node("BatchNormalization", ["Z", "s", "c", "mean", "var"], ["Y"], epsilon=EPS),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        values,
    )
    return model, values


@pytest.mark.parametrize(
    "known_to_the_graph_check",
    [
        True,
        pytest.param(
            False,
            marks=training_build_only(
                "its BatchNormalization rule reads the graph check's table (no gradient for the "
                "running statistics): it has no refusal of its own that names them"
            ),
        ),
    ],
    ids=["table", "onnxruntime-says"],
)
def test_batchnorm_statistics_are_constants(monkeypatch, known_to_the_graph_check) -> None:
    """The running mean and variance get no gradient from onnxruntime: by default they stay out,
    whether the graph check knows BatchNormalization or onnxruntime's refusal names them (the
    check's table emptied); W, s and c match numpy's gradients. Naming one is refused as a
    running statistic, with the fix."""
    if not known_to_the_graph_check:
        monkeypatch.setattr(graph_module, "NO_GRADIENT_INPUTS", {})
    rng = np.random.default_rng(1)
    model, v = _batchnorm_model(rng)
    fb = OrtGradientForwardBackward(model)
    assert fb.weights_to_train == ["W", "s", "c"]
    x = rng.standard_normal((7, 4)).astype(np.float32)
    dy = rng.standard_normal((7, 3)).astype(np.float32)
    z = x @ v["W"]
    # inference normalises with the running statistics; the training forward (onnxruntime's
    # BatchNormInternal), like torch in train mode, with the batch's
    (y,) = (o.numpy() for o in fb.forward([x], training=False))
    np.testing.assert_allclose(
        y, v["s"] * (z - v["mean"]) / np.sqrt(v["var"] + EPS) + v["c"], rtol=TOL, atol=TOL
    )
    std = np.sqrt(z.var(axis=0) + EPS)
    norm = (z - z.mean(axis=0)) / std
    (y,) = (o.numpy() for o in fb.forward([x]))
    np.testing.assert_allclose(y, v["s"] * norm + v["c"], rtol=TOL, atol=TOL)
    dw, ds, dc = (g.numpy() for g in fb.backward([dy]))
    dz = v["s"] / std * (dy - dy.mean(axis=0) - norm * (dy * norm).mean(axis=0))
    np.testing.assert_allclose(dw, x.T @ dz, rtol=1e-4, atol=TOL)
    np.testing.assert_allclose(ds, (dy * norm).sum(axis=0), rtol=1e-4, atol=TOL)
    np.testing.assert_allclose(dc, dy.sum(axis=0), rtol=TOL, atol=TOL)
    # naming one is refused as state (issue 17, item 3: training updates it as torch does)
    with pytest.raises(ValueError, match=r"'var' is a BatchNormalization's running statistic.*leave it out"):
        OrtGradientForwardBackward(model, ["W", "var"])


def test_a_converted_sklearn_classifier_trains_through_its_probabilities() -> None:
    """skl2onnx's MLPClassifier graph has a label path (ArgMax, then ai.onnx.ml's
    ArrayFeatureExtractor over the classes, which has no gradient) beside the probabilities:
    the layer builds, its weights are the four coefficient arrays, and their gradients for a
    gradient on the probabilities match numpy's backward of the same network."""
    datasets = pytest.importorskip("sklearn.datasets")
    neural_network = pytest.importorskip("sklearn.neural_network")
    skl2onnx = pytest.importorskip("skl2onnx")
    X, y = datasets.load_iris(return_X_y=True)
    X = X.astype(np.float32)
    clf = neural_network.MLPClassifier(hidden_layer_sizes=(5,), max_iter=30, random_state=0)
    with pytest.warns(Warning, match="Maximum iterations"):  # a few iterations are enough here
        clf.fit(X, y)
    model = skl2onnx.to_onnx(clf, X[:1], options={"zipmap": False}, target_opset=OPSET)
    model.ir_version = IR_VERSION
    assert "ArrayFeatureExtractor" in {n.op_type for n in model.graph.node}
    fb = OrtGradientForwardBackward(model)
    assert len(fb.weights_to_train) == 4
    rng = np.random.default_rng(2)
    x = X[rng.choice(len(X), 9)]
    label, proba = (o.numpy() for o in fb.forward([x]))
    hidden = np.maximum(x @ clf.coefs_[0] + clf.intercepts_[0], 0)
    logits = hidden @ clf.coefs_[1] + clf.intercepts_[1]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(proba, p, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(label, clf.classes_[p.argmax(axis=1)])
    g = rng.standard_normal(p.shape).astype(np.float32)
    dlogits = p * (g - (g * p).sum(axis=1, keepdims=True))
    dhidden = dlogits @ clf.coefs_[1].T * (hidden > 0)
    expected = {
        "coefs0": x.T @ dhidden,
        "intercepts0": dhidden.sum(axis=0),
        "coefs1": hidden.T @ dlogits,
        "intercepts1": dlogits.sum(axis=0),
    }
    # the four arrays have distinct sizes (20, 5, 15, 3): pair each gradient with its array by
    # size, whatever skl2onnx names them
    by_size = {gr.size: gr for gr in (o.numpy() for o in fb.backward([None, g]))}
    assert sorted(by_size) == sorted(w.size for w in expected.values())
    for name, want in expected.items():
        got = by_size[want.size].reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
