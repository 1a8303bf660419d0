"""Per-sample learning-rate schedules (``LearningRateSGD(per_sample=True)``, issue 18 item 6):
``t`` counts samples over all epochs, as scikit-learn's SGD; a batch of ``B`` rows after ``s``
samples steps with ``eta(s) + ... + eta(s + B - 1)`` times its mean gradient. Checked against
numpy minibatch SGD whose rates are written here from the formulas, on both loops, across
epochs whose last batch is short, and through a checkpoint and resume."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_models import build_linear, initializers, linear_sgd_reference

from ort_train_core import (
    EarlyStopping,
    LearningRateSGD,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

N_ROWS, BATCH, EPOCHS = 10, 4, 3  # batches of 4, 4, 2: the samples seen do not follow the steps


def _rate(schedule: str, i: int) -> float:
    """The rate of sample i (from 0), scikit-learn's formulas with t = i + 1."""
    eta0, alpha, power_t = 0.05, 0.5, 0.5
    if schedule == "constant":
        return eta0
    if schedule == "invscaling":
        return eta0 / (i + 1) ** power_t
    # scikit-learn: 1 / (alpha (t0 + t - 1)), t0 = 1 / (eta0 alpha)
    return 1.0 / (alpha * (1.0 / (eta0 * alpha) + i))


def _lr(schedule: str, **kwargs: Any) -> LearningRateSGD:
    return LearningRateSGD(
        eta0=0.05, alpha=0.5, power_t=0.5, learning_rate=schedule, per_sample=True, **kwargs
    )


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N_ROWS, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    return X, y


def _reference(model: Any, X: np.ndarray, y: np.ndarray, schedule: str) -> dict[str, np.ndarray]:
    """Minibatch SGD on the mean squared error, each batch's rate the sum of its rows' rates."""
    coef = initializers(model)["coef"].astype(np.float64)
    intercept = initializers(model)["intercept"].astype(np.float64)
    seen = 0
    for _ in range(EPOCHS):
        for start in range(0, N_ROWS, BATCH):
            xb, yb = X[start : start + BATCH].astype(np.float64), y[start : start + BATCH, None]
            lr = sum(_rate(schedule, i) for i in range(seen, seen + len(xb)))
            diff = xb @ coef + intercept - yb
            coef = coef - lr * 2.0 * xb.T @ diff / len(xb)
            intercept = intercept - lr * 2.0 * diff.sum(axis=0) / len(xb)
            seen += len(xb)
    return {"coef": coef, "intercept": intercept}


def _trainer(loop: str, model: Any, lr: Any, **kwargs: Any) -> Any:
    common: dict[str, Any] = dict(batch_size=BATCH, learning_rate=lr, shuffle=False, tol=None, **kwargs)
    if loop == "full":
        return OrtGradientOptimizer(add_loss_output(model), **common)
    return OrtGradientForwardBackwardOptimizer(model, learning_loss="square_error", **common)


@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize("schedule", ["constant", "invscaling", "optimal"])
def test_batch_steps_with_the_sum_of_its_rows_rates(loop: str, schedule: str) -> None:
    X, y = _data()
    model = build_linear(seed=1)
    trainer = _trainer(loop, model, _lr(schedule), max_iter=EPOCHS).fit(X, y)
    expected = _reference(model, X, y, schedule)
    state = trainer.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name].ravel(), value.ravel(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    ("loop", "path"), [("full", "shared"), ("full", "resident"), ("partial", "resident")]
)
def test_per_step_rates_on_the_other_binding_paths(
    monkeypatch: pytest.MonkeyPatch, loop: str, path: str
) -> None:
    """Where a step's binding cannot read its row of the rate table in place (one binding per
    batch size past MAX_PREBOUND_BATCHES; device-resident data, declared here for the CPU) the
    step copies its row first: the same numpy trajectory."""
    from ort_train_core import _data as data_module
    from ort_train_core import optimizer as optimizer_module

    if path == "shared":
        monkeypatch.setattr(optimizer_module, "MAX_PREBOUND_BATCHES", 1)
    else:
        monkeypatch.setattr(data_module, "DEVICE_RESIDENT_KINDS", {"cpu", "cuda"})
    X, y = _data()
    model = build_linear(seed=1)
    trainer = _trainer(loop, model, _lr("optimal"), max_iter=EPOCHS).fit(X, y)
    expected = _reference(model, X, y, "optimal")
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name].ravel(), value.ravel(), rtol=2e-5, atol=2e-6)


def test_one_row_batches_are_per_sample_sgd() -> None:
    """batch_size=1: every step has its own sample's rate (no sum), the epoch-counting
    schedule would keep one rate per epoch."""
    X, y = _data()
    model = build_linear(seed=1)
    rates = [_rate("invscaling", i) for i in range(N_ROWS * 2)]
    ours = _trainer("full", model, _lr("invscaling"), max_iter=2)
    ours.batch_size = 1
    ours.fit(X, y)
    coef = initializers(model)["coef"].astype(np.float64)
    intercept = initializers(model)["intercept"].astype(np.float64)
    for i in range(N_ROWS * 2):
        x_i, y_i = X[i % N_ROWS].astype(np.float64), float(y[i % N_ROWS])
        d = x_i @ coef + intercept - y_i
        coef = coef - rates[i] * 2.0 * np.outer(x_i, d)
        intercept = intercept - rates[i] * 2.0 * d
    np.testing.assert_allclose(ours.get_state()["coef"], coef, rtol=2e-5, atol=2e-6)
    # the epoch schedule differs: a test that could not tell them apart would prove nothing
    per_epoch, _ = linear_sgd_reference(
        initializers(model), X, y, eta=lambda e: 0.05 / (e + 1) ** 0.5, batch_size=1, epochs=2
    )
    assert np.abs(per_epoch["coef"] - coef).max() > 1e-3


def test_the_sample_count_survives_a_checkpoint(tmp_path: Any) -> None:
    """Resumed after epoch 1, the rates go on from the samples seen (10), not from 0."""
    X, y = _data()
    model = build_linear(seed=1)
    lr = LearningRateSGDNesterov(
        eta0=0.05, alpha=0.5, power_t=0.5, learning_rate="invscaling", momentum=0.5, per_sample=True
    )
    straight = _trainer("full", model, lr, max_iter=EPOCHS).fit(X, y)
    _trainer("full", model, lr, max_iter=1, checkpoint_dir=tmp_path).fit(X, y)
    resumed = _trainer("full", model, lr, max_iter=EPOCHS, checkpoint_dir=tmp_path).resume(X, y)
    for name, value in straight.get_state().items():
        np.testing.assert_allclose(resumed.get_state()[name], value, rtol=1e-6, atol=1e-7)


def test_scalar_values_are_the_sums() -> None:
    lr = _lr("optimal")
    assert lr.scalars_change_every_step
    assert not LearningRateSGD(learning_rate="optimal").scalars_change_every_step
    (value,) = lr.scalar_values(epoch=4, step=9, first_sample=7, n_rows=3)
    assert value == pytest.approx(sum(_rate("optimal", i) for i in (7, 8, 9)), rel=1e-12)
    assert _lr("constant").scalar_values(0, 1, first_sample=100, n_rows=8) == pytest.approx((0.4,))


@pytest.mark.parametrize("schedule", ["constant", "optimal", "invscaling"])
def test_scalar_table_rows_are_the_batch_sums(schedule: str) -> None:
    """The table a fit computes once an epoch: row k is the sum of the rates of batch k's
    rows, counted on from the first sample, for batches of any length (one longer than the
    rest, a short last one) and an epoch that starts far into the fit (a resume)."""
    lr = _lr(schedule)
    rows = np.array([5, 5, 7, 40, 3, 16, 1])
    for first in (0, 1000):
        table = lr.scalar_table(epoch=3, first_step=9, first_sample=first, rows=rows)
        assert table.shape == (len(rows), 1)
        start = first
        for k, n in enumerate(rows):
            expected = sum(_rate(schedule, t) for t in range(start, start + n))
            assert table[k, 0] == pytest.approx(expected, rel=1e-12)
            start += n


def test_adam_table_is_the_bias_corrected_step() -> None:
    """Adam's two scalars per step k (from first_step): eta sqrt(1 - b2^k) / (1 - b1^k) and
    eps sqrt(1 - b2^k), as the update's docstring derives them."""
    from ort_train_core import LearningRateAdam

    lr = LearningRateAdam(eta0=0.01, beta1=0.8, beta2=0.95, epsilon=1e-6)
    table = lr.scalar_table(epoch=0, first_step=4, first_sample=0, rows=np.full(5, 16))
    for k, (step_size, eps_hat) in zip(range(4, 9), table):
        c = (1 - 0.95**k) ** 0.5
        assert step_size == pytest.approx(0.01 * c / (1 - 0.8**k), rel=1e-12)
        assert eps_hat == pytest.approx(1e-6 * c, rel=1e-12)
    assert lr.scalar_values(0, 6) == pytest.approx(tuple(table[2]), rel=1e-12)


def test_a_schedule_of_its_own_gets_its_table_from_scalar_values() -> None:
    """A learning rate written by a user defines scalar_values only: the default table calls
    it once per step with that step's number, first sample and rows."""
    calls: list[tuple[int, int, int, int]] = []

    class Logged(LearningRateSGD):
        @property
        def scalars_change_every_step(self) -> bool:
            return True

        def scalar_values(
            self, epoch: int, step: int, first_sample: int = 0, n_rows: int = 1
        ) -> tuple[float, ...]:
            calls.append((epoch, step, first_sample, n_rows))
            return (0.001 * step + first_sample,)

    table = Logged().scalar_table(epoch=2, first_step=7, first_sample=30, rows=np.array([4, 4, 2]))
    assert calls == [(2, 7, 30, 4), (2, 8, 34, 4), (2, 9, 38, 2)]
    np.testing.assert_allclose(table[:, 0], [30.007, 34.008, 38.009])


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_a_rate_divided_within_an_epoch_applies_from_the_next_step(loop: str) -> None:
    """reduce_learning_rate() called from on_batch_end (mid-epoch) divides the rate of the
    epoch's remaining steps, although they were computed at its start: numpy's minibatch SGD
    with the rate divided by 5 after the second batch of the first epoch."""
    from ort_train_core import Callback

    class Divide(Callback):
        def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
            if (epoch, batch) == (0, 1):
                assert trainer.reduce_learning_rate(epoch)

    X, y = _data()
    model = build_linear(seed=1)
    trainer = _trainer(loop, model, _lr("adaptive"), max_iter=2, callbacks=[Divide()]).fit(X, y)
    weights = {k: v.astype(np.float64) for k, v in initializers(model).items()}
    rate = 0.05
    for epoch in range(2):
        for k, start in enumerate(range(0, N_ROWS, BATCH)):
            rows = slice(start, start + BATCH)
            # per-sample constant: a batch of B rows steps with B eta on its mean gradient
            eta = rate * len(X[rows])
            weights, _ = linear_sgd_reference(weights, X[rows], y[rows], eta=eta, batch_size=BATCH, epochs=1)
            if (epoch, k) == (0, 1):
                rate /= 5
    for name, value in weights.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n_stoppers", [1, 2])
def test_adaptive_divides_once_per_plateau_whatever_the_stopping_rules(n_stoppers: int) -> None:
    """learning_rate='adaptive': at each plateau (tol, n_iter_no_change) the rate is divided
    by 5 and the count restarts; two EarlyStopping callbacks with the same rule divide once,
    as one does: numpy's SGD with the same rule."""
    rng, n = np.random.default_rng(5), 64
    X = rng.standard_normal((n, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.normal(scale=0.7, size=n)).astype(np.float32)
    model = build_linear()
    eta0, tol, patience, epochs = 0.05, 0.05, 2, 25
    lr = LearningRateSGD(eta0=eta0, learning_rate="adaptive")
    stoppers = [EarlyStopping(tol, patience) for _ in range(n_stoppers)]
    trainer = _trainer("full", model, lr, max_iter=epochs, callbacks=stoppers).fit(X, y)

    weights = {k: v.astype(np.float64) for k, v in initializers(model).items()}
    rate, best, bad, divisions, n_iter = eta0, np.inf, 0, 0, 0
    for _ in range(epochs):
        weights, (loss,) = linear_sgd_reference(weights, X, y, eta=rate, batch_size=BATCH, epochs=1)
        n_iter += 1
        bad = bad + 1 if loss > best - tol else 0
        best = min(best, loss)
        if bad >= patience:
            if rate <= 1e-6:
                break
            rate, bad, divisions = rate / 5, 0, divisions + 1
    assert divisions >= 2, "the data must reach two plateaus for this test to check anything"
    assert trainer.n_iter_ == n_iter
    for name, value in weights.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_callbacks_see_the_weights_and_samples_after_each_step(loop: str) -> None:
    """Inside on_batch_end, get_state() holds the weights after that batch's step and
    samples_seen_ the rows stepped on so far (over epochs): numpy's minibatch SGD batch by
    batch. After the fit both hold the end of the fit."""
    from ort_train_core import Callback

    X, y = _data()
    model = build_linear()
    seen: list[tuple[int, dict[str, np.ndarray]]] = []

    class Record(Callback):
        def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
            seen.append((trainer.samples_seen_, trainer.get_state()))

    trainer = _trainer(loop, model, 0.05, max_iter=EPOCHS, callbacks=[Record()]).fit(X, y)
    weights = {k: v.astype(np.float64) for k, v in initializers(model).items()}
    count, k = 0, 0
    for _ in range(EPOCHS):
        for start in range(0, N_ROWS, BATCH):
            rows = slice(start, start + BATCH)
            weights, _ = linear_sgd_reference(weights, X[rows], y[rows], eta=0.05, batch_size=BATCH, epochs=1)
            count += len(X[rows])
            samples, state = seen[k]
            assert samples == count
            for name, value in weights.items():
                np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6)
            k += 1
    assert k == len(seen)
    assert trainer.samples_seen_ == EPOCHS * N_ROWS
    for name, value in weights.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
