"""``prepare``: both trainers build every session a fit of the data uses, without training, so
that the fit after it creates none; the fit's result is that of a fit without ``prepare``
(numpy SGD reference)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime.capi._pybind_state as pybind
import pytest
from core_models import build_linear, initializers, linear_sgd_reference

import ort_train_core as otc
from ort_train_core import _binding, _cache

N_ROWS, N_FEATURES, BATCH = 25, 3, 10  # batches of 10, 10, 5: two batch sizes
ETA = 0.05


def _trainer(partial: bool) -> Any:
    model = build_linear(N_FEATURES)
    lr = otc.LearningRateSGD(eta0=ETA, learning_rate="constant")
    common: dict[str, Any] = {"max_iter": 3, "batch_size": BATCH, "learning_rate": lr, "shuffle": False}
    if partial:
        return otc.OrtGradientForwardBackwardOptimizer(model, learning_loss="square_error", **common)
    return otc.OrtGradientOptimizer(otc.add_loss_output(model), **common)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N_ROWS, N_FEATURES)).astype(np.float32)
    return X, rng.standard_normal((N_ROWS, 1)).astype(np.float32)


def _count_sessions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    # an empty session cache: earlier tests of the process may have built these very sessions
    monkeypatch.setattr(_binding, "_SESSIONS", _cache.LRUCache(_binding.MAX_CACHED_SESSIONS))
    made = [0]
    real = pybind.InferenceSession

    def counting(*args: Any) -> Any:
        made[0] += 1
        return real(*args)

    monkeypatch.setattr(pybind, "InferenceSession", counting)
    return made


@pytest.mark.parametrize("partial", [False, True], ids=["fused", "partial"])
def test_prepare_builds_what_fit_uses(monkeypatch: pytest.MonkeyPatch, partial: bool) -> None:
    X, y = _data()
    made = _count_sessions(monkeypatch)
    trainer = _trainer(partial)
    assert trainer.prepare(X, y, X_val=X[:7], y_val=y[:7]) is trainer
    assert made[0] > 0
    assert not hasattr(trainer, "n_iter_")  # nothing trained, no history
    built = made[0]
    trainer.fit(X, y, X_val=X[:7], y_val=y[:7])
    assert made[0] == built

    model = build_linear(N_FEATURES)
    expected, losses = linear_sgd_reference(initializers(model), X, y, eta=ETA, batch_size=BATCH, epochs=3)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=1e-5)
    state = trainer.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6)


def test_prepare_checks_data_as_fit_does() -> None:
    X, y = _data()
    with pytest.raises(ValueError, match="X_val and y_val"):
        _trainer(False).prepare(X, y, X_val=X)
