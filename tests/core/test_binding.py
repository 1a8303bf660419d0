"""Both binding paths of the fused runner give the numpy SGD trajectory: per-batch bindings made
once (the default) and, past MAX_PREBOUND_BATCHES, data inputs bound again at each step; and
both ways of gathering shuffled batches: the whole epoch at once (small data) or batch by
batch (past EPOCH_GATHER_MAX_BYTES)."""

from __future__ import annotations

import numpy as np
import pytest
from core_models import initializers, linear_sgd_reference

import ort_train_core._data as data_module
import ort_train_core._runner as runner_module
import ort_train_core.optimizer as optimizer_module
from ort_train_core import OrtGradientOptimizer


@pytest.mark.parametrize("limit", [1, runner_module.MAX_PREBOUND_BATCHES])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("epoch_gather", [0, data_module.EPOCH_GATHER_MAX_BYTES])
def test_binding_paths_follow_numpy_sgd(
    monkeypatch, linear_loss_model, linear_data, limit, shuffle, epoch_gather
):
    monkeypatch.setattr(optimizer_module, "MAX_PREBOUND_BATCHES", limit)
    monkeypatch.setattr(data_module, "EPOCH_GATHER_MAX_BYTES", epoch_gather)
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


def test_trainers_of_one_architecture_share_fused_graphs(monkeypatch, make_linear, linear_data):
    """A second trainer over the same architecture (other initial weights) reuses the fused
    graphs of the first without building them again, and still follows its own numpy
    trajectory."""
    import ort_train_core
    from ort_train_core._backends import default_backend
    from ort_train_core._cache import LRUCache, clear_caches

    clear_caches()  # the structural caches of earlier tests' fits hold this architecture already
    built: list[int] = []
    backend_type = type(default_backend())
    original = backend_type.fused_step

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(backend_type, "fused_step", counting)
    monkeypatch.setattr(optimizer_module, "_FUSED_GRAPHS", LRUCache(optimizer_module.MAX_CACHED_FUSED_GRAPHS))
    X, y = linear_data
    for seed, expected_builds in ((0, 2), (1, 2)):  # batch 10 and the last batch of 3
        model = ort_train_core.add_loss_output(make_linear(seed=seed))
        start = initializers(model)
        trainer = OrtGradientOptimizer(model, max_iter=3, batch_size=10, learning_rate=0.05, shuffle=False)
        trainer.fit(X, y)
        assert len(built) == expected_builds
        expected, _ = linear_sgd_reference(start, X, y, eta=0.05, batch_size=10, epochs=3)
        for name, value in expected.items():
            np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("trainer_class", ["full", "partial"])
def test_callbacks_read_each_epochs_weights(linear_loss_model, linear_data, trainer_class):
    """get_state() inside on_epoch_end gives the weights after that epoch (numpy SGD)."""
    from ort_train_core import OrtGradientForwardBackwardOptimizer
    from ort_train_core.callbacks import Callback
    from ort_train_core.graph import prediction_graph

    seen: list[dict[str, np.ndarray]] = []

    class Record(Callback):
        def on_epoch_end(self, trainer, epoch, logs):  # type: ignore[no-untyped-def]
            seen.append(trainer.get_state())

    X, y = linear_data
    start = initializers(linear_loss_model)
    common = dict(max_iter=3, batch_size=10, shuffle=False, callbacks=[Record()])
    if trainer_class == "full":
        trainer = OrtGradientOptimizer(linear_loss_model, learning_rate=0.05, **common)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(
            prediction_graph(linear_loss_model, "loss"), learning_rate=0.05, **common
        )
    trainer.fit(X, y)
    assert len(seen) == 3
    for epochs, state in enumerate(seen, start=1):
        expected, _ = linear_sgd_reference(start, X, y, eta=0.05, batch_size=10, epochs=epochs)
        for name, value in expected.items():
            np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-6)
