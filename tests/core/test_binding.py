"""Both binding paths of the fused runner give the numpy SGD trajectory: per-batch bindings made
once (the default) and, past MAX_PREBOUND_BATCHES, data inputs bound again at each step."""

from __future__ import annotations

import numpy as np
import pytest
from core_models import initializers, linear_sgd_reference

import ort_train_core._runner as runner_module
import ort_train_core.optimizer as optimizer_module
from ort_train_core import OrtGradientOptimizer


@pytest.mark.parametrize("limit", [1, runner_module.MAX_PREBOUND_BATCHES])
@pytest.mark.parametrize("shuffle", [False, True])
def test_binding_paths_follow_numpy_sgd(monkeypatch, linear_loss_model, linear_data, limit, shuffle):
    monkeypatch.setattr(optimizer_module, "MAX_PREBOUND_BATCHES", limit)
    X, y = linear_data
    start = initializers(linear_loss_model)
    trainer = OrtGradientOptimizer(
        linear_loss_model, max_iter=4, batch_size=10, learning_rate=0.05, shuffle=shuffle, random_state=5
    )
    trainer.fit(X, y)
    rng = np.random.default_rng(5)
    orders = [rng.permutation(len(X)) for _ in range(4)] if shuffle else None
    expected, history = linear_sgd_reference(start, X, y, eta=0.05, batch_size=10, epochs=4, orders=orders)
    state = trainer.get_state()
    for name, value in expected.items():
        assert not np.allclose(value, start[name])
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=1e-4)
