"""A fit that continues the previous one (``warm_start=True``, as each scikit-learn
``partial_fit`` does) on data of the same shapes reuses that fit's runner: its step bindings are
made once for a stream of fits (issue 30 item 9), and it trains as numpy's SGD over the chunks
(the trainer's shuffling orders). A state set between fits, other shapes, unshuffled data (the
batches view the caller's arrays) or a pickled trainer get a new runner, still training as
numpy's SGD."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from core_models import build_linear, initializers, linear_sgd_reference

from ort_train_core import (
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    _backends,
    _fit_loop,
    add_loss_output,
)
from ort_train_core._fit_loop import BaseOrtTrainer

ETA = 0.05
BATCH = 8


def _trainer(loop: str, shuffle: bool = True) -> Any:
    params: dict[str, Any] = dict(
        batch_size=BATCH, learning_rate=ETA, max_iter=1, shuffle=shuffle, warm_start=True, random_state=0
    )
    if loop == "full":
        return OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), **params)
    return OrtGradientForwardBackwardOptimizer(build_linear(seed=1), learning_loss="square_error", **params)


def _chunks(rows: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    out = []
    for n in rows:
        X = rng.standard_normal((n, 3)).astype(np.float32)
        out.append((X, (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)))
    return out


def _numpy_stream(
    start: dict[str, np.ndarray],
    chunks: list[tuple[np.ndarray, np.ndarray]],
    shuffle: bool,
    restarts: dict[int, dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """numpy's SGD over the chunks, one epoch each, in the trainer's orders (one generator
    seeded with random_state, a permutation per epoch); ``restarts[k]``: the weights set before
    chunk k."""
    rng = np.random.default_rng(0)
    weights = start
    for k, (X, y) in enumerate(chunks):
        weights = restarts.get(k, weights)
        orders = [rng.permutation(len(X))] if shuffle else None
        weights, _ = linear_sgd_reference(weights, X, y, eta=ETA, batch_size=BATCH, epochs=1, orders=orders)
    return weights


@pytest.fixture
def runners(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runners built (one entry each)."""
    made: list[int] = []
    original = BaseOrtTrainer._new_runner

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BaseOrtTrainer, "_new_runner", counting)
    return made


def _assert_numpy(trainer: Any, expected: dict[str, np.ndarray]) -> None:
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_a_stream_of_warm_fits_builds_one_runner(loop: str, runners: list[int]) -> None:
    trainer = _trainer(loop)
    start = initializers(build_linear(seed=1))
    chunks = _chunks([24] * 5)
    for X, y in chunks:
        trainer.fit(X, y)
    assert len(runners) == 1
    assert trainer.n_iter_ == 5
    _assert_numpy(trainer, _numpy_stream(start, chunks, True, {}))


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_a_set_state_other_rows_a_pickle_or_unshuffled_data_build_new_runners(
    loop: str, runners: list[int]
) -> None:
    trainer = _trainer(loop)
    start = initializers(build_linear(seed=1))
    chunks = _chunks([24, 24, 24, 16, 24, 24])
    zeros = {"coef": np.zeros((3, 1), np.float32), "intercept": np.zeros(1, np.float32)}
    trainer.fit(*chunks[0])
    trainer.fit(*chunks[1])
    trainer.set_state(zeros)  # the kept runner holds the previous weights: not reused
    trainer.fit(*chunks[2])
    trainer.fit(*chunks[3])  # 16 rows
    trainer = pickle.loads(pickle.dumps(trainer))  # the kept runner is not pickled
    trainer.fit(*chunks[4])
    trainer.fit(*chunks[5])
    assert len(runners) == 4  # chunks 0, 2, 3, 4
    _assert_numpy(trainer, _numpy_stream(start, chunks, True, {2: zeros}))
    # without shuffling the batches view the caller's arrays themselves: nothing to keep
    unshuffled = _trainer(loop, shuffle=False)
    for X, y in chunks[:3]:
        unshuffled.fit(X, y)
    assert len(runners) == 7
    _assert_numpy(unshuffled, _numpy_stream(start, chunks[:3], False, {}))


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_a_fit_resolves_its_backend_once(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graphs' record asks for the backend at each look-up: a fit resolves it (and
    $ORT_TRAIN_BACKEND) once, then every look-up of that fit gets the same one."""
    trainer = _trainer(loop)
    X, y = _chunks([24])[0]
    trainer.fit(X, y)
    calls: list[Any] = []
    original = _backends.get_backend

    def counting(name: Any = None) -> Any:
        calls.append(name)
        return original(name)

    monkeypatch.setattr(_fit_loop, "get_backend", counting)
    trainer.fit(X, y)
    assert len(calls) == 1
    assert trainer._backend() is original(None)  # outside a fit: looked up again
    assert len(calls) == 2


# ---- the settings a continuing fit checks again ----------------------------------------------
# _validate_params keeps its checked pair while no setting changed (a stream of partial fits):
# every change made between two fits, also in place or through the environment, is still seen


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_learning_rate_edited_in_place_between_fits_is_checked(loop: str) -> None:
    from ort_train_core import LearningRateSGD

    trainer = _trainer(loop)
    trainer.learning_rate = rate = LearningRateSGD(eta0=ETA, learning_rate="constant")
    (X, y), (X2, y2) = _chunks([32, 32])
    trainer.fit(X, y)
    rate.eta0 = -1.0
    with pytest.raises(ValueError, match=r"eta0 .*must be a finite number > 0, got -1\.0"):
        trainer.fit(X2, y2)
    rate.eta0 = 2 * ETA
    # a continued fit keeps its optimizer state: a changed rate is refused, by its new value
    with pytest.raises(ValueError, match=r"learning rate changed .*eta0=0\.1"):
        trainer.fit(X2, y2)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("max_iter", 0, "max_iter must be"),
        ("batch_size", -3, "batch_size must be"),
        ("verbose", 7, "verbose must be 0, 1"),
        ("tol", -1.0, "tol must be None or a number >= 0"),
        ("threads", 0, "threads"),
    ],
)
def test_setting_changed_between_fits_is_checked(name: str, value: Any, message: str) -> None:
    trainer = _trainer("full")
    (X, y), (X2, y2) = _chunks([32, 32])
    trainer.fit(X, y)
    setattr(trainer, name, value)  # an attribute set directly, as scikit-learn allows
    with pytest.raises(ValueError, match=message):
        trainer.fit(X2, y2)


def test_backend_variable_changed_between_fits_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _trainer("full")
    (X, y), (X2, y2) = _chunks([32, 32])
    trainer.fit(X, y)
    monkeypatch.setenv("ORT_TRAIN_BACKEND", "no-such-backend")
    with pytest.raises(ValueError, match=r"unknown gradient backend .*no-such-backend"):
        trainer.fit(X2, y2)


def _unkeyed_settings(trainer: Any) -> set[str]:
    """The settings ``_checked_params`` reads that the memo's key leaves out: each attribute it
    reads on the trainer is recorded (a subclass's ``__getattribute__``, for that call only)."""
    read: list[str] = []
    cls = type(trainer)

    class Recording(cls):  # type: ignore[valid-type, misc]
        def __getattribute__(self, name: str) -> Any:
            read.append(name)
            return super().__getattribute__(name)

    trainer.__class__ = Recording
    try:
        trainer._checked_params()
    finally:
        trainer.__class__ = cls
    keyed = {"learning_rate", *cls._CHECKED_SETTINGS}
    return (set(read) & set(trainer.get_params(deep=False))) - keyed


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_the_memo_keys_every_setting_the_checks_read(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a new check of another setting must join the key, or a continued fit would skip it
    trainer = _trainer(loop)
    assert _unkeyed_settings(trainer) == set()
    monkeypatch.setattr(
        BaseOrtTrainer, "_CHECKED_SETTINGS", tuple(n for n in BaseOrtTrainer._CHECKED_SETTINGS if n != "tol")
    )
    assert _unkeyed_settings(trainer) == {"tol"}  # the recorder sees a setting left out
