"""A fit without sample weights on a graph with a sample-weight input: the fused steps take the
ones as a constant (the batches carry no weight column) and the products by ones fold away
(:func:`~ort_train_core._ort_training.fold_unit_factors`). Checked against numpy SGD, weighted
and not, on one trainer that goes from one to the other."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from core_models import build_linear, initializers
from onnx import TensorProto, helper, numpy_helper

from backend_support import training_build_only
from ort_train_core import OrtGradientOptimizer, add_loss_output
from ort_train_core._binding import make_session
from ort_train_core._ort_training import fold_unit_factors
from ort_train_core._runtime import parse_device

ETA, BATCH, EPOCHS = 0.05, 4, 3


def _weighted_sgd(
    weights: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray, w: np.ndarray, epochs: int
) -> dict[str, np.ndarray]:
    """Minibatch SGD on sum(w (x coef + b - y)^2) / sum(w) over each batch (the 'mean'
    reduction), in float64."""
    coef = weights["coef"].astype(np.float64)
    intercept = weights["intercept"].astype(np.float64)
    for _ in range(epochs):
        for s in range(0, len(X), BATCH):
            xb, yb, wb = X[s : s + BATCH].astype(np.float64), y[s : s + BATCH, None], w[s : s + BATCH, None]
            g = 2.0 * wb * (xb @ coef + intercept - yb) / wb.sum()
            coef = coef - ETA * xb.T @ g
            intercept = intercept - ETA * g.sum(axis=0)
    return {"coef": coef, "intercept": intercept}


@training_build_only("the unit-factor folding is a rewrite of the training build's gradient graph")
def test_a_fit_without_weights_steps_on_constant_ones_then_a_weighted_fit_goes_on() -> None:
    rng = np.random.default_rng(2)
    X = rng.standard_normal((10, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    w = rng.uniform(0.2, 3.0, size=10).astype(np.float32)
    model = build_linear(seed=1)
    trainer = OrtGradientOptimizer(
        add_loss_output(model, weight_name="weight"),
        batch_size=BATCH,
        learning_rate=ETA,
        max_iter=EPOCHS,
        shuffle=False,
        tol=None,
        warm_start=True,
    )
    X_val = rng.standard_normal((6, 3)).astype(np.float32)
    y_val = (X_val @ np.array([1.0, -1.0, 0.0])).astype(np.float32)
    trainer.fit(X, y, X_val=X_val, y_val=y_val)  # the validation data keep their weight input
    expected = _weighted_sgd(initializers(model), X, y, np.ones(10), EPOCHS)
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
    val_loss = np.mean((X_val @ expected["coef"] + expected["intercept"] - y_val[:, None]) ** 2)
    assert trainer.validation_losses_[-1] == pytest.approx(val_loss, rel=1e-5)
    steps = trainer._graphs().steps
    assert steps
    assert all(unit for (_, _, _, unit, _) in steps)
    for step in steps.values():
        assert "weight" not in [i.name for i in step.graph.graph.input]

    trainer.fit(X, y, sample_weight=w)  # warm start: weighted steps from where it stopped
    expected = _weighted_sgd(expected, X, y, w, EPOCHS)
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
    steps = trainer._graphs().steps
    for (batch, device, lr, unit, threads), step in steps.items():
        if not unit:  # the weighting of the loss folded out of the unweighted step
            muls = [n.op_type for n in step.graph.graph.node].count("Mul")
            unit_graph = steps[batch, device, lr, True, threads].graph
            assert [n.op_type for n in unit_graph.graph.node].count("Mul") < muls
            assert "weight" in [i.name for i in step.graph.graph.input]
    assert any(not unit for (_, _, _, unit, _) in steps)


def test_explicit_ones_and_no_weights_train_alike() -> None:
    rng = np.random.default_rng(4)
    X = rng.standard_normal((9, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=9).astype(np.int64)
    penalty = {"coef": {"l2": 0.01}}
    loss = add_loss_output(build_linear(seed=3), "hinge", weight_name="weight", penalty=penalty)
    common = dict(batch_size=BATCH, learning_rate=0.1, max_iter=4, shuffle=True, random_state=0, tol=None)
    plain = OrtGradientOptimizer(loss, **common).fit(X, y)
    ones = OrtGradientOptimizer(loss, **common).fit(X, y, sample_weight=np.ones(9, dtype=np.float32))
    for name, value in ones.get_state().items():
        np.testing.assert_allclose(plain.get_state()[name], value, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(plain.train_losses_, ones.train_losses_, rtol=1e-6)


def _product_model() -> onnx.ModelProto:
    """Y = X * ones (same shape), Z = s * ones4 (broadcasts s), V = X * over (ones that an input
    of the same name can override), U = X * twos."""
    init = [
        numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "ones"),
        numpy_helper.from_array(np.ones(4, dtype=np.float32), "ones4"),
        numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "over"),
        numpy_helper.from_array(np.full((4, 3), 2.0, dtype=np.float32), "twos"),
    ]
    nodes = [
        helper.make_node("Mul", ["X", "ones"], ["Y"]),
        helper.make_node("Mul", ["s", "ones4"], ["Z"]),
        helper.make_node("Mul", ["X", "over"], ["V"]),
        helper.make_node("Mul", ["twos", "X"], ["U"]),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "products",
        [
            helper.make_tensor_value_info("X", f, [4, 3]),
            helper.make_tensor_value_info("s", f, [1]),
            helper.make_tensor_value_info("over", f, [4, 3]),
        ],
        [helper.make_tensor_value_info(n, f, None) for n in ("Y", "Z", "V", "U")],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_fold_unit_factors_keeps_broadcasts_overridable_ones_and_other_constants() -> None:
    model = _product_model()
    folded = fold_unit_factors(model)
    ops = {n.output[0]: n.op_type for n in folded.graph.node}
    assert ops == {"Y": "Identity", "Z": "Mul", "V": "Mul", "U": "Mul"}
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.normal(size=(4, 3)).astype(np.float32),
        "s": np.array([1.5], dtype=np.float32),
        "over": np.full((4, 3), 3.0, dtype=np.float32),
    }
    sess = make_session(folded, parse_device("cpu"))
    y, z, v, u = sess.run(["Y", "Z", "V", "U"], feeds, None)
    np.testing.assert_array_equal(y, feeds["X"])
    np.testing.assert_array_equal(z, np.full(4, 1.5, dtype=np.float32))
    np.testing.assert_array_equal(v, feeds["X"] * 3.0)
    np.testing.assert_array_equal(u, feeds["X"] * 2.0)


@pytest.mark.parametrize("value", [1.0, 0.5])
def test_fold_unit_factors_leaves_a_graph_without_ones_untouched(value: float) -> None:
    model = _product_model()
    for init in model.graph.initializer:
        if init.name == "ones":
            init.CopyFrom(numpy_helper.from_array(np.full((4, 3), value, dtype=np.float32), "ones"))
    del model.graph.initializer[1]  # ones4
    del model.graph.node[1]
    del model.graph.output[1]
    folded = fold_unit_factors(model)
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("Identity") == (1 if value == 1.0 else 0)
