"""The claims of docs/migration_onnxcustom.rst about onnxcustom, checked against numpy (issue 18,
item 1): each reference loop below is onnxcustom's step as its source wrote it (onnxcustom no
longer runs), on batches taken in order (``shuffle=False`` here; onnxcustom drew random windows).

The guide's code blocks themselves run, in one namespace, with their asserts against numpy and
scikit-learn, in test_doc_blocks.py with every other page's."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import onnxruntime
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ort_train_core import (
    ElasticLearningPenalty,
    LearningRateSGD,
    LearningRateSGDNesterov,
    NegLogLearningLoss,
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

BS, EPOCHS = 10, 3


# ---- the claims, against numpy ------------------------------------------------------------------
def _model(nodes: list, out_cols: int, inits: dict[str, np.ndarray], out: str = "Y") -> ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 5])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [None, out_cols])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


W0 = (np.random.default_rng(0).standard_normal((5, 1)) * 0.1).astype(np.float32)
B0 = np.zeros(1, dtype=np.float32)
LINEAR = _model(
    [helper.make_node("MatMul", ["X", "W"], ["Z"]), helper.make_node("Add", ["Z", "b"], ["Y"])],
    1,
    {"W": W0, "b": B0},
)


def _data(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((n, 5)).astype(np.float32)
    return X, (X @ rng.standard_normal(5) + 0.3).astype(np.float32)


X, Y = _data()
YC = (np.median(Y) < Y).astype(np.int64)
SW = np.random.default_rng(3).uniform(0.2, 2.0, len(X)).astype(np.float32)

Grad = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, float]]


def _reference(
    grad: Grad, W: np.ndarray = W0, b: np.ndarray = B0, epochs: int = EPOCHS, X: np.ndarray = X
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """SGD in float64 over the batches in row order: ``grad(rows, W, b)`` returns the step of W
    and b (learning rate included) and the loss the trainer reports for the batch."""
    W, b = W.astype(np.float64), b.astype(np.float64)
    losses = []
    for _ in range(epochs):
        batch_losses = []
        for s in range(0, len(X), BS):
            rows = np.arange(s, min(s + BS, len(X)))
            sW, sb, loss = grad(rows, W, b, X)
            W, b = W - sW, b - sb
            batch_losses.append(loss)
        losses.append(float(np.mean(batch_losses)))
    return W, b, losses


def _lr(eta: float) -> LearningRateSGD:
    return LearningRateSGD(eta0=eta, learning_rate="constant")


def _full(model: ModelProto, eta: float, **kwargs: object) -> OrtGradientOptimizer:
    kwargs.setdefault("max_iter", EPOCHS)
    return OrtGradientOptimizer(model, batch_size=BS, shuffle=False, learning_rate=_lr(eta), **kwargs)


def _partial(eta: float | LearningRateSGD, **kwargs: object) -> OrtGradientForwardBackwardOptimizer:
    lr = _lr(eta) if isinstance(eta, float) else eta
    return OrtGradientForwardBackwardOptimizer(
        LINEAR, max_iter=EPOCHS, batch_size=BS, shuffle=False, learning_rate=lr, **kwargs
    )


def _oc_full(eta: float, loss: str, l1: float = 0.0, l2: float = 0.0) -> Grad:
    """onnxcustom's full loop: the graph's loss is the batch sum plus the penalty of W, the step
    ``eta / batch_size`` times its gradient, the reported loss the output over the batch size."""

    def grad(rows, W, b, X=X):
        d = X[rows] @ W + b - Y[rows, None]
        per_row, g = (d**2, 2 * d) if loss == "squared_error" else (np.abs(d), np.sign(d))
        pen = l1 * np.abs(W).sum() + l2 * (W**2).sum()
        gW = X[rows].T @ g + l1 * np.sign(W) + 2 * l2 * W
        return eta / BS * gW, eta / BS * g.sum(0), (per_row.sum() + pen) / BS

    return grad


@pytest.mark.parametrize("loss", ["squared_error", "absolute_error"])
def test_full_loop_mean_takes_onnxcustoms_steps(loss: str) -> None:
    """'The full loop's loss is a 0-d mean, and its steps are onnxcustom's.'"""
    eta = 0.05
    W, _, losses = _reference(_oc_full(eta, loss))
    mean = _full(add_loss_output(LINEAR, score_name=loss), eta).fit(X, Y)
    np.testing.assert_allclose(mean.get_state()["W"], W, atol=1e-5)
    np.testing.assert_allclose(mean.train_losses_, losses, rtol=1e-5)
    summed = _full(add_loss_output(LINEAR, score_name=loss, reduction="sum"), eta / BS).fit(X, Y)
    np.testing.assert_allclose(summed.get_state()["W"], W, atol=1e-5)
    np.testing.assert_allclose(summed.train_losses_, np.multiply(losses, BS), rtol=1e-5)
    too_far = _full(add_loss_output(LINEAR, score_name=loss, reduction="sum"), eta).fit(X, Y)
    assert not np.allclose(too_far.get_state()["W"], W, atol=1e-3)


def test_full_loop_log_needs_eta_over_batch_size() -> None:
    """onnxcustom's 'log' loss was a ReduceMean and its step still divided by the batch size."""
    probabilities = _model(
        [
            helper.make_node("MatMul", ["X", "W"], ["Z"]),
            helper.make_node("Add", ["Z", "b"], ["S"]),
            helper.make_node("Sigmoid", ["S"], ["P1"]),
            helper.make_node("Sub", ["one", "P1"], ["P0"]),
            helper.make_node("Concat", ["P0", "P1"], ["P"], axis=1),
        ],
        2,
        {"W": W0, "b": B0, "one": np.ones(1, np.float32)},
        out="P",
    )
    eta = 0.5

    def oc(rows, W, b, X=X):
        p = 1 / (1 + np.exp(-(X[rows] @ W + b)))
        g = (p - YC[rows, None]) / len(rows)  # the gradient of -mean(log p_true)
        return eta / BS * X[rows].T @ g, eta / BS * g.sum(0), 0.0

    W, _, _ = _reference(oc)
    loss = add_loss_output(probabilities, score_name="log")
    got = _full(loss, eta / BS, weights_to_train=["W", "b"]).fit(X, YC).get_state()["W"]
    np.testing.assert_allclose(got, W, atol=1e-6)
    same_eta = _full(loss, eta, weights_to_train=["W", "b"]).fit(X, YC).get_state()["W"]
    assert not np.allclose(same_eta, W, atol=1e-3)


def test_add_loss_output_penalty_is_batch_size_times_stronger() -> None:
    eta, l1, l2 = 0.05, 0.3, 0.5
    W, _, losses = _reference(_oc_full(eta, "squared_error", l1, l2))
    same = _full(add_loss_output(LINEAR, penalty={"W": {"l1": l1, "l2": l2}}), eta).fit(X, Y)
    assert not np.allclose(same.get_state()["W"], W, atol=1e-3)
    scaled = add_loss_output(LINEAR, penalty={"W": {"l1": l1 / BS, "l2": l2 / BS}})
    got = _full(scaled, eta).fit(X, Y)
    np.testing.assert_allclose(got.get_state()["W"], W, atol=1e-5)
    np.testing.assert_allclose(got.train_losses_, losses, rtol=1e-5)
    summed = add_loss_output(LINEAR, penalty={"W": {"l1": l1, "l2": l2}}, reduction="sum")
    np.testing.assert_allclose(_full(summed, eta / BS).fit(X, Y).get_state()["W"], W, atol=1e-5)


def _ours_square(eta: float, X: np.ndarray = X) -> Grad:
    def grad(rows, W, b, X=X):
        d = X[rows] @ W + b - Y[rows, None]
        return eta * 2 * X[rows].T @ d / len(rows), eta * 2 * d.sum(0) / len(rows), 0.0

    return grad


@pytest.mark.parametrize("cls", ["full", "partial"])
def test_drawn_weights_need_warm_start(cls: str) -> None:
    """The guide's recipe: set_state, then fit with warm_start=True; warm_start=False ignores it."""
    rng = np.random.default_rng(0)
    drawn = {
        "W": rng.standard_normal((5, 1)).astype(np.float32),
        "b": rng.standard_normal(1).astype(np.float32),
    }
    for warm, start in ((True, drawn), (False, {"W": W0, "b": B0})):
        if cls == "full":
            trainer = _full(add_loss_output(LINEAR), 0.05, warm_start=warm)
        else:
            trainer = _partial(0.05, warm_start=warm)
        trainer.set_state(drawn)
        trainer.fit(X, Y)
        W, _, _ = _reference(_ours_square(0.05), start["W"], start["b"])
        np.testing.assert_allclose(trainer.get_state()["W"], W, atol=1e-5)


def _oc_partial(eta: float, l2: float = 0.0, momentum: float | None = None, weights: bool = False) -> Grad:
    """onnxcustom's partial loop, SquareLearningLoss (0.5 sum d^2, gradient f - y, times the
    sample weight) and ElasticLearningPenalty(0, l2) on W: the penalty's update of the weights,
    then the gradient step ``eta / batch_size`` (through the velocity with Nesterov)."""
    velocity = {"W": np.zeros((5, 1)), "b": np.zeros(1)}

    def grad(rows, W, b, X=X):
        d = X[rows] @ W + b - Y[rows, None]
        if weights:
            d = d * SW[rows, None]
        gW, gb = eta / BS * X[rows].T @ d, eta / BS * d.sum(0)
        shrink = 2 * l2 * W
        if momentum is None:
            return shrink + gW, gb, float(0.5 * (d**2).sum() / BS)
        velocity["W"] = momentum * velocity["W"] - gW
        velocity["b"] = momentum * velocity["b"] - gb
        return shrink - momentum * velocity["W"] + gW, -momentum * velocity["b"] + gb, 0.0

    return grad


def test_partial_square_error_and_penalty_steps() -> None:
    """learning rate eta / 2 and ElasticLearningPenalty(l2=l2 / (eta / 2)) take onnxcustom's
    steps with plain SGD (biases no longer penalised); train_losses_ are twice onnxcustom's,
    score is minus the mean squared error as onnxcustom's (its losses() dropped the 0.5)."""
    eta, l2 = 0.05, 1e-2
    W, b, _ = _reference(_oc_partial(eta, l2))
    rate = eta / 2
    got = _partial(rate, learning_penalty=ElasticLearningPenalty(l1=0.0, l2=l2 / rate)).fit(X, Y)
    np.testing.assert_allclose(got.get_state()["W"], W, atol=1e-5)
    np.testing.assert_allclose(got.get_state()["b"], b, atol=1e-5)
    _, _, losses = _reference(_oc_partial(eta))
    plain = _partial(rate).fit(X, Y)
    np.testing.assert_allclose(plain.train_losses_, np.multiply(losses, 2), rtol=1e-5)
    state = got.get_state()
    residual = X @ state["W"] + state["b"] - Y[:, None]
    np.testing.assert_allclose(got.score(X, Y), -(residual**2).mean(), rtol=1e-5)


def test_partial_penalty_with_nesterov_goes_through_the_velocity() -> None:
    eta, l2, mu = 0.05, 1e-2, 0.9
    rate = eta / 2
    lr = LearningRateSGDNesterov(eta0=rate, learning_rate="constant", momentum=mu)
    got = _partial(lr, learning_penalty=ElasticLearningPenalty(l1=0.0, l2=l2 / rate)).fit(X, Y)
    onnxcustom, _, _ = _reference(_oc_partial(eta, l2, momentum=mu))
    assert not np.allclose(got.get_state()["W"], onnxcustom, atol=1e-2)
    # here: the penalty's gradient 2 (l2 / rate) W joins the data's in the velocity
    v = {"W": np.zeros((5, 1)), "b": np.zeros(1)}

    def ours(rows, W, b, X=X):
        d = X[rows] @ W + b - Y[rows, None]
        gW = 2 * X[rows].T @ d / len(rows) + 2 * (l2 / rate) * W
        gb = 2 * d.sum(0) / len(rows)
        v["W"], v["b"] = mu * v["W"] - rate * gW, mu * v["b"] - rate * gb
        return -(mu * v["W"] - rate * gW), -(mu * v["b"] - rate * gb), 0.0

    W, _, _ = _reference(ours)
    np.testing.assert_allclose(got.get_state()["W"], W, atol=1e-5)


def test_row_mean_weighs_samples_as_onnxcustom() -> None:
    eta = 0.05
    W, _, _ = _reference(_oc_partial(eta, weights=True))
    got = _partial(eta / 2, reduction="row_mean").fit(X, Y, sample_weight=SW)
    np.testing.assert_allclose(got.get_state()["W"], W, atol=1e-5)
    default = _partial(eta / 2).fit(X, Y, sample_weight=SW)
    assert not np.allclose(default.get_state()["W"], W, atol=1e-3)

    def per_row(rows, W, b, X=X):
        g = 2 * (X[rows] @ W + b - Y[rows, None]) * SW[rows, None]
        return eta / BS * X[rows].T @ g, eta / BS * g.sum(0), 0.0

    W, _, _ = _reference(per_row)
    full = _full(add_loss_output(LINEAR, weight_name="weight", reduction="row_mean"), eta)
    np.testing.assert_allclose(full.fit(X, Y, sample_weight=SW).get_state()["W"], W, atol=1e-5)


def test_onnxcustom_weighted_loss_broadcast() -> None:
    """onnxcustom's add_loss_output(weight_name=...): Sub, Mul, Mul by the [N] weights, ReduceSum
    on a [N, 1] prediction computes sum(w) * sum(d^2)."""
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["variable", "label"], ["d"]),
            helper.make_node("Mul", ["d", "d"], ["d2"]),
            helper.make_node("Mul", ["d2", "weight"], ["dw"]),
            helper.make_node("ReduceSum", ["dw"], ["loss"]),
        ],
        "onnxcustom_l2_weighted",
        [
            helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info("label", TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info("weight", TensorProto.FLOAT, [None]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [1, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    f = np.array([[1.0], [2.0], [4.0]], np.float32)
    w = np.array([1.0, 0.0, 0.0], np.float32)
    (loss,) = sess.run(None, {"variable": f, "label": np.zeros_like(f), "weight": w})
    assert float(loss.ravel()[0]) == pytest.approx(w.sum() * (f**2).sum())  # 21, not sum(w d^2) = 1


def test_partial_absolute_and_log_losses() -> None:
    """absolute_error steps toward the target (onnxcustom's sign(y - f) stepped away); 'log'
    (sigmoid of raw scores) takes onnxcustom's steps: gradient p - y, step eta / batch_size."""
    one = np.ones((1, 5), np.float32)
    before = (one @ W0 + B0).item()
    t = OrtGradientForwardBackwardOptimizer(
        LINEAR, max_iter=1, batch_size=1, learning_loss="absolute_error", learning_rate=0.01
    ).fit(one, np.array([10.0], np.float32))
    assert (one @ t.get_state()["W"] + t.get_state()["b"]).item() > before
    eta = 0.5

    def oc(rows, W, b, X=X):
        g = 1 / (1 + np.exp(-(X[rows] @ W + b))) - YC[rows, None]
        return eta / BS * X[rows].T @ g, eta / BS * g.sum(0), 0.0

    W, _, _ = _reference(oc)
    got = _partial(eta, learning_loss="log").fit(X, YC)
    np.testing.assert_allclose(got.get_state()["W"], W, atol=1e-5)


def test_schedules_run_one_epoch_ahead() -> None:
    eta0, power, alpha = 0.1, 0.25, 1e-4
    # onnxcustom: eta0, then after epoch t: eta0 / (t + 1)^p
    onnxcustom = [eta0] + [eta0 / (t + 1) ** power for t in range(5)]
    ours = LearningRateSGD(eta0=eta0, power_t=power)
    np.testing.assert_allclose([ours.eta(t) for t in range(5)], onnxcustom[1:])
    # 'optimal': onnxcustom's heuristic h; alpha * h / eta0 gives its decay
    a = np.sqrt(1.0 / np.sqrt(alpha))
    h = a / max(1.0, (1 + a) * 2)
    assert h == pytest.approx(0.4545, abs=1e-4)
    init = 1.0 / (h * alpha)
    onnxcustom = [eta0] + [eta0 / h / (alpha * (init + t)) for t in range(5)]
    ours = LearningRateSGD(eta0=eta0, alpha=alpha * h / eta0, learning_rate="optimal")
    np.testing.assert_allclose([ours.eta(t) for t in range(5)], onnxcustom[1:])
    # warm_start=True continues the schedule: 2 + 2 epochs step as 4
    four = _full(add_loss_output(LINEAR), 0.05, max_iter=4)
    four.learning_rate = LearningRateSGD(eta0=0.05)
    four.fit(X, Y)
    twice = _full(add_loss_output(LINEAR), 0.05, max_iter=2, warm_start=True)
    twice.learning_rate = LearningRateSGD(eta0=0.05)
    twice.fit(X, Y).fit(X, Y)
    np.testing.assert_allclose(twice.get_state()["W"], four.get_state()["W"], atol=1e-6)


def test_batches_and_random_state() -> None:
    """Each epoch: batches in row order with shuffle=False, the last one shorter; random_state,
    not numpy.random.seed, makes a shuffled run reproducible."""
    X25 = X[:25]
    W, _, _ = _reference(_ours_square(0.05, X25), epochs=1, X=X25)
    got = _full(add_loss_output(LINEAR), 0.05, max_iter=1).fit(X25, Y[:25])
    np.testing.assert_allclose(got.get_state()["W"], W, atol=1e-6)

    def run(**kwargs: object) -> np.ndarray:
        trainer = OrtGradientOptimizer(
            add_loss_output(LINEAR), max_iter=2, batch_size=5, learning_rate=0.05, **kwargs
        )
        return trainer.fit(X25, Y[:25]).get_state()["W"]

    np.testing.assert_array_equal(run(random_state=0), run(random_state=0))
    np.random.seed(0)  # noqa: NPY002 - the legacy global seed, which onnxcustom's batches followed
    first = run()
    np.random.seed(0)  # noqa: NPY002
    assert not np.array_equal(first, run())


def test_log_loss_clips_at_1e5_without_renormalising() -> None:
    assert NegLogLearningLoss().eps == 1e-5
    identity = helper.make_graph(
        [helper.make_node("Identity", ["P0"], ["P"])],
        "p",
        [helper.make_tensor_value_info("P0", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("P", TensorProto.FLOAT, [None, 2])],
    )
    model = helper.make_model(identity, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for eps in (None, 1e-6):
        loss = add_loss_output(model, score_name="log", **({} if eps is None else {"eps": eps}))
        sess = onnxruntime.InferenceSession(loss.SerializeToString(), providers=["CPUExecutionProvider"])

        def run(p: list[float], label: int, sess: onnxruntime.InferenceSession = sess) -> float:
            return float(sess.run(["loss"], {"P0": np.array([p], np.float32), "label": np.array([label])})[0])

        assert run([0.2, 0.2], 1) == pytest.approx(-np.log(0.2))  # renormalised: -log(0.5)
        assert run([0.0, 1.0], 0) == pytest.approx(-np.log(eps or 1e-5), rel=1e-4)


def test_removed_names() -> None:
    for alias in ("square", "absolute", "elastic_error", "neglog", "logloss"):
        with pytest.raises(ValueError, match="unknown loss"):
            OrtGradientForwardBackwardOptimizer(LINEAR, max_iter=1, learning_loss=alias).fit(X, Y)
    with pytest.raises(TypeError):
        OrtGradientForwardBackwardOptimizer(LINEAR, loss_output_name="loss")  # type: ignore[call-arg]
    partial = _partial(0.05).fit(X, Y)
    full = _full(add_loss_output(LINEAR), 0.05).fit(X, Y)
    for trainer in (partial, full):
        assert trainer.validation_losses_ == []
        assert not hasattr(trainer, "trained_coef_")
        assert not hasattr(trainer, "losses")
    assert [o.name for o in full.get_trained_onnx().graph.output] == ["Y"]  # the prediction graph
    # no onnx_rename_weights: initializers named out of order train
    unsorted = _model(
        [helper.make_node("MatMul", ["X", "zW"], ["Z"]), helper.make_node("Add", ["Z", "ab"], ["Y"])],
        1,
        {"zW": W0, "ab": B0},
    )
    got = OrtGradientForwardBackwardOptimizer(unsorted, max_iter=1, learning_rate=0.05).fit(X, Y)
    assert sorted(got.get_state()) == ["ab", "zW"]


def test_forward_backward_defaults() -> None:
    assert inspect.signature(OrtGradientForwardBackward.forward).parameters["training"].default is True
    dY = np.ones((4, 1), np.float32)
    fb = OrtGradientForwardBackward(LINEAR)
    fb.forward([X[:4]])
    assert [tuple(g.shape()) for g in fb.backward([dY])] == [(5, 1), (1,)]  # the weights' only
    fb = OrtGradientForwardBackward(LINEAR, input_names_requiring_grad=[i.name for i in LINEAR.graph.input])
    fb.forward([X[:4]])
    assert [tuple(g.shape()) for g in fb.backward([dY])] == [(4, 5), (5, 1), (1,)]
    with pytest.raises(ValueError, match="input"):
        fb.forward([X[:4], W0, B0])  # onnxcustom's inputs followed by the weights
