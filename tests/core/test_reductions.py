"""'row_mean' reduction (sum_i s_i l_i / n) and an l2-only penalty in the partial loop, both
against numpy SGD on a linear model."""

from __future__ import annotations

import numpy as np
import pytest
from core_models import build_linear, initializers

from ort_train_core import (
    ElasticLearningPenalty,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)


def _numpy_row_mean_sgd(start, X, y, w, eta, batch, epochs, l2=0.0):  # type: ignore[no-untyped-def]
    coef = start["coef"].astype(np.float64)
    intercept = start["intercept"].astype(np.float64)
    for _ in range(epochs):
        for s in range(0, len(X), batch):
            xb, yb, wb = X[s : s + batch], y[s : s + batch, None], w[s : s + batch, None]
            d = xb @ coef + intercept - yb
            g = 2 * d * wb / len(xb)
            coef = coef - eta * (xb.T @ g + 2 * l2 * coef)
            intercept = intercept - eta * g.sum(0)
    return coef, intercept


@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize("batch", [1, 4])
def test_row_mean_scales_each_row_by_its_weight(loop, batch):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((10, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 2.0]) + 0.5).astype(np.float32)
    w = rng.uniform(0.2, 3.0, 10).astype(np.float32)
    model = build_linear()
    start = initializers(model)
    if loop == "full":
        trainer = OrtGradientOptimizer(
            add_loss_output(model, weight_name="weight", reduction="row_mean"),
            max_iter=2,
            batch_size=batch,
            learning_rate=0.02,
            shuffle=False,
        )
    else:
        trainer = OrtGradientForwardBackwardOptimizer(
            model, max_iter=2, batch_size=batch, learning_rate=0.02, shuffle=False, reduction="row_mean"
        )
    trainer.fit(X, y, w)
    coef, intercept = _numpy_row_mean_sgd(start, X, y, w, 0.02, batch, 2)
    state = trainer.get_state()
    np.testing.assert_allclose(state["coef"], coef, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["intercept"], intercept, rtol=1e-4, atol=1e-6)
    # with one row per batch a weighted *mean* would cancel the weights: these must not
    unweighted, _ = _numpy_row_mean_sgd(start, X, y, np.ones_like(w), 0.02, batch, 2)
    assert not np.allclose(state["coef"], unweighted, rtol=1e-3)


def test_l2_only_penalty_in_the_partial_loop():
    """The penalty graph reads W only through its square: it must still differentiate."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((12, 3)).astype(np.float32)
    y = (X @ np.array([0.5, 1.0, -1.5])).astype(np.float32)
    model = build_linear()
    start = initializers(model)
    trainer = OrtGradientForwardBackwardOptimizer(
        model,
        max_iter=3,
        batch_size=12,
        learning_rate=0.05,
        shuffle=False,
        learning_penalty=ElasticLearningPenalty(l1=0.0, l2=0.1),
    )
    trainer.fit(X, y)
    coef, intercept = _numpy_row_mean_sgd(start, X, y, np.ones(12), 0.05, 12, 3, l2=0.1)
    np.testing.assert_allclose(trainer.get_state()["coef"], coef, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(trainer.get_state()["intercept"], intercept, rtol=1e-4, atol=1e-6)


def test_row_mean_epoch_loss_weighs_batches_by_rows():
    """train_losses_ with 'row_mean' is the objective sum_i s_i l_i / n, not re-weighted."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((8, 3)).astype(np.float32)
    y = rng.standard_normal(8).astype(np.float32)
    w = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    model = build_linear()
    start = initializers(model)
    trainer = OrtGradientOptimizer(
        add_loss_output(model, weight_name="weight", reduction="row_mean"),
        max_iter=1,
        batch_size=1,
        learning_rate=1e-6,
        shuffle=False,
    )
    trainer.fit(X, y, w)
    pred = X.astype(np.float64) @ start["coef"] + start["intercept"]
    expected = np.mean(w * (pred[:, 0] - y) ** 2)  # the steps are tiny: weights barely move
    assert trainer.train_losses_[0] == pytest.approx(expected, rel=1e-4)


def test_binary_cross_entropy_gradient_at_zero_logit():
    """From zero weights the logit is 0: the first step follows sigmoid(0) - y = 1/2 - y."""
    X = np.array([[1.0, 2.0, -1.0], [0.5, -1.0, 2.0]], dtype=np.float32)
    y = np.array([1, 0])
    model = build_linear(coef=np.zeros((3, 1), np.float32), intercept=np.zeros(1, np.float32))
    trainer = OrtGradientOptimizer(
        add_loss_output(model, "cross_entropy"), max_iter=1, batch_size=2, learning_rate=0.1, shuffle=False
    )
    trainer.fit(X, y)
    g = (0.5 - y)[:, None] / 2  # mean over the batch
    np.testing.assert_allclose(trainer.get_state()["coef"], -0.1 * X.T @ g, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(trainer.get_state()["intercept"], -0.1 * g.sum(0), rtol=1e-6, atol=1e-7)
    assert trainer.train_losses_[0] == pytest.approx(np.log(2.0), rel=1e-6)


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_a_batch_whose_weights_are_all_zero_steps_nothing(loop):
    """'mean' reduction, sum_i s_i l_i / sum_i s_i: a batch of zero weights has loss 0 and no
    gradient (not 0 / 0 = NaN and a ConvergenceError), and no weight in the epoch's mean;
    against numpy SGD on the other batches."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((10, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 2.0]) + 0.5).astype(np.float32)
    w = np.array([1, 2, 1, 1, 0, 0, 0, 0, 1, 1], np.float32)  # the second batch of 4 weighs 0
    model = build_linear()
    start = initializers(model)
    params = dict(max_iter=2, batch_size=4, learning_rate=0.05, shuffle=False)
    if loop == "full":
        trainer = OrtGradientOptimizer(add_loss_output(model, weight_name="weight"), **params)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, **params)
    trainer.fit(X, y, w)

    coef, intercept = start["coef"].astype(np.float64), start["intercept"].astype(np.float64)
    epoch_losses = []
    for _ in range(2):
        losses, totals = [], []
        for s in range(0, len(X), 4):
            xb, yb, wb = X[s : s + 4], y[s : s + 4, None], w[s : s + 4, None]
            d = xb @ coef + intercept - yb
            total = wb.sum()
            losses.append(float((wb * d**2).sum() / total) if total else 0.0)
            totals.append(total)
            if total:
                g = 2 * d * wb / total
                coef, intercept = coef - 0.05 * xb.T @ g, intercept - 0.05 * g.sum(0)
        epoch_losses.append(np.dot(losses, totals) / np.sum(totals))
    state = trainer.get_state()
    np.testing.assert_allclose(state["coef"], coef, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["intercept"], intercept, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.train_losses_, epoch_losses, rtol=1e-5)
