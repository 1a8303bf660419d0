"""scikit-learn's SGD losses as graph losses (issue 18, item 7): hinge, perceptron,
squared_hinge, modified_huber (classification, one-vs-rest over columns) and huber,
epsilon_insensitive, squared_epsilon_insensitive (regression). Values and gradients equal
scikit-learn's own loss objects (``py_loss``/``py_dloss`` of ``sklearn.linear_model._sgd_fast``)
or, for Huber, the formula of scikit-learn's documentation."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output

sgd_fast = pytest.importorskip("sklearn.linear_model._sgd_fast")

N, F = 40, 3
rng = np.random.default_rng(5)


def _sklearn_loss(name: str) -> Any:
    return {
        "hinge": sgd_fast.Hinge(1.0),
        "perceptron": sgd_fast.Hinge(0.0),
        "squared_hinge": sgd_fast.SquaredHinge(1.0),
        "modified_huber": sgd_fast.ModifiedHuber(),
        "epsilon_insensitive": sgd_fast.EpsilonInsensitive(0.1),
        "squared_epsilon_insensitive": sgd_fast.SquaredEpsilonInsensitive(0.1),
    }[name]


def _huber(r: np.ndarray, eps: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's Huber: r^2/2 inside eps, eps |r| - eps^2/2 outside; and d/dr."""
    a = np.abs(r)
    return np.where(a <= eps, r * r / 2, eps * a - eps * eps / 2), np.where(a <= eps, r, eps * np.sign(r))


def _logistic(f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's binomial log loss (CyHalfBinomialLoss) with y in {-1, +1} as 0/1."""
    from sklearn._loss.loss import HalfBinomialLoss

    y01 = (y + 1) / 2
    loss = HalfBinomialLoss()
    values = loss.loss(y01.ravel(), f.ravel()).reshape(f.shape)
    grads = loss.gradient(y01.ravel(), f.ravel()).reshape(f.shape)
    return values, grads


def _reference(name: str, f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-element loss and d loss / d f (classification: y in {-1, +1})."""
    if name == "huber":
        return _huber(f - y)
    if name == "logistic":
        return _logistic(f, y)
    loss = _sklearn_loss(name)
    values = np.array([loss.py_loss(p, t) for p, t in zip(f.ravel(), y.ravel())]).reshape(f.shape)
    grads = np.array([loss.py_dloss(p, t) for p, t in zip(f.ravel(), y.ravel())]).reshape(f.shape)
    return values, grads


CLASSIFICATION = ["hinge", "perceptron", "squared_hinge", "modified_huber", "logistic"]
REGRESSION = ["huber", "epsilon_insensitive", "squared_epsilon_insensitive"]


def _linear(n_out: int, zeros: bool = False) -> onnx.ModelProto:
    W = rng.standard_normal((F, n_out)).astype(np.float32) * (0 if zeros else 1)
    b = rng.standard_normal(n_out).astype(np.float32) * (0 if zeros else 0.1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["Y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", F])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_out])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _data(name: str, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X, the label fed to fit, and the targets of the reference, shaped like the prediction
    (classification: +-1 per column, one-vs-rest over several columns)."""
    X = rng.standard_normal((N, F)).astype(np.float32) * 2
    if name in CLASSIFICATION:
        classes = rng.integers(0, max(n_out, 2), size=N)
        target = (classes[:, None] == (np.arange(n_out) if n_out > 1 else np.array([1]))) * 2.0 - 1
        return X, classes, target
    y = rng.standard_normal((N, n_out)).astype(np.float32)
    return X, y, y


@pytest.mark.parametrize("zeros", [False, True], ids=["random", "zero-weights"])
@pytest.mark.parametrize("route", ["full", "partial"])
@pytest.mark.parametrize("n_out", [1, 3])
@pytest.mark.parametrize("name", CLASSIFICATION + REGRESSION)
def test_one_step_follows_scikit_learn_loss(name: str, n_out: int, route: str, zeros: bool) -> None:
    """The loss of a batch equals the mean over rows of the summed reference losses, and one
    SGD step moves the weights by the reference gradient; also from zero weights, where every
    margin is 0 (scikit-learn's perceptron and hinge step there)."""
    model = _linear(n_out, zeros)
    X, label, target = _data(name, n_out)
    W0 = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    b0 = numpy_helper.to_array(model.graph.initializer[1]).astype(np.float64)
    f = X @ W0 + b0
    values, dloss = _reference(name, f, target)
    lr = 0.01
    params = dict(max_iter=1, batch_size=N, learning_rate=lr, shuffle=False)
    if route == "full":
        trainer = OrtGradientOptimizer(add_loss_output(model, score_name=name), **params)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, learning_loss=name, **params)
    trainer.fit(X, label)
    assert trainer.train_losses_[0] == pytest.approx(values.sum(axis=1).mean(), rel=1e-5)
    g = dloss / N
    state = trainer.get_state()
    np.testing.assert_allclose(state["W"], W0 - lr * X.T @ g, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["b"], b0 - lr * g.sum(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("hinge", {"threshold": -1.0}, "threshold must be >= 0"),
        ("huber", {"epsilon": -0.1}, "epsilon must be >= 0"),
        ("epsilon_insensitive", {"epsilon": -0.1}, "epsilon must be >= 0"),
    ],
)
def test_bad_loss_parameters(name: str, kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OrtGradientOptimizer(add_loss_output(_linear(1), score_name=name, **kwargs)).fit(*_data(name, 1)[:2])


SEED_BEYOND_CLIP = 3


@pytest.mark.parametrize("route", ["full", "partial"])
def test_squared_hinge_derivative_stops_at_scikit_learns_clip(route: str) -> None:
    """scikit-learn's SGD clips each sample's d loss / d f to +-1e12 (``MAX_DLOSS`` of its
    ``_plain_sgd``): at margins far below the threshold the squared hinge's derivative
    2 (1 - y f) is clipped there, and the loss stays finite in float32 (the square would be
    inf); rows within the clip step as py_dloss says."""
    # the module's generator at a fixed state: the premise below (rows beyond the clip) must not
    # depend on which tests ran before in this process (pytest-xdist deals them out)
    rng.bit_generator.state = np.random.default_rng(SEED_BEYOND_CLIP).bit_generator.state
    model = _linear(1)
    X, label, target = _data("squared_hinge", 1)
    W0 = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64) * 1e12
    b0 = numpy_helper.to_array(model.graph.initializer[1]).astype(np.float64)
    f = X.astype(np.float64) @ W0 + b0
    X[:5] = X[:5] * 1e-12  # five rows of small margins, inside the clip
    f[:5] = X[:5].astype(np.float64) @ W0 + b0
    loss = _sklearn_loss("squared_hinge")
    dloss = np.array([[loss.py_dloss(p, t)] for p, t in zip(f.ravel(), target.ravel())])
    assert np.abs(dloss).max() > 1e13  # some rows beyond the clip
    assert (np.abs(dloss[:5]) < 1e12).all()
    clipped = np.clip(dloss, -1e12, 1e12)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(W0.astype(np.float32), "W"))
    lr = 1e-3
    params = dict(max_iter=1, batch_size=N, learning_rate=lr, shuffle=False)
    if route == "full":
        trainer = OrtGradientOptimizer(add_loss_output(model, score_name="squared_hinge"), **params)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, learning_loss="squared_hinge", **params)
    trainer.fit(X, label)
    assert np.isfinite(trainer.train_losses_[0])
    g = clipped / N
    state = trainer.get_state()
    np.testing.assert_allclose(state["W"], W0 - lr * X.T.astype(np.float64) @ g, rtol=1e-5)
    np.testing.assert_allclose(state["b"], b0 - lr * g.sum(axis=0), rtol=1e-5)
