"""The record of a trainer's graphs is built once per process for a model content and its
graph-shaping parameters (``_loss_trainer._FIT_GRAPHS``): a new trainer over the same graph
skips building the loss graph, trains as a fresh one would (numpy SGD), keeps its own record of
step graphs, and a changed model or parameter gets its own record."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_models import build_linear, initializers, linear_sgd_reference
from onnx import numpy_helper

from ort_train_core import (
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    _loss_trainer,
    add_loss_output,
)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The trainer types whose loss graph record was built, in order (an empty cache first)."""
    monkeypatch.setattr(
        _loss_trainer, "_FIT_GRAPHS", _loss_trainer.LRUCache(_loss_trainer.MAX_CACHED_FIT_GRAPHS)
    )
    built: list[str] = []
    original = _loss_trainer.LossGraphTrainer._new_fit_graphs

    def counting(self: Any, params: Any, digest: bytes) -> Any:
        built.append(type(self).__name__)
        return original(self, params, digest)

    monkeypatch.setattr(_loss_trainer.LossGraphTrainer, "_new_fit_graphs", counting)
    return built


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((12, 3)).astype(np.float32)
    return X, (X @ np.array([0.5, -1.0, 2.0]) + 0.1).astype(np.float32)


def test_trainers_over_one_graph_build_its_record_once_and_train_alike(builds: list[str]) -> None:
    X, y = _data()
    model = build_linear(seed=4)
    loss = add_loss_output(model)
    expected, _ = linear_sgd_reference(initializers(model), X, y, eta=0.05, batch_size=5, epochs=3)
    for batch_size in (5, 5, 4):
        trainer = OrtGradientOptimizer(
            add_loss_output(model), batch_size=batch_size, learning_rate=0.05, max_iter=3, shuffle=False
        )
        trainer.fit(X, y)
        if batch_size == 5:
            for name, value in expected.items():
                np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
        # its own record of step graphs: the batch sizes it ran, not the others'
        assert sorted({key[0] for key in trainer._graphs().steps}) == sorted(
            {batch_size, 12 % batch_size} - {0}
        )
    assert builds == ["OrtGradientOptimizer"]  # three trainers (three model objects), one build
    # another graph-shaping parameter, another trainer type, another model structure: new
    # records (other initial values alone share the record: tests/core/test_warm_refit.py)
    OrtGradientOptimizer(loss, weights_to_train=["coef"], max_iter=1).fit(X, y)
    OrtGradientForwardBackwardOptimizer(model, learning_loss="square_error", max_iter=1).fit(X, y)
    OrtGradientOptimizer(add_loss_output(build_linear(seed=5, intercept_name="bias")), max_iter=1).fit(X, y)
    kinds = ["OrtGradientOptimizer", "OrtGradientForwardBackwardOptimizer"]
    assert builds == [kinds[0], kinds[0], kinds[1], kinds[0]]


def test_a_model_edited_in_place_gets_a_new_record(builds: list[str]) -> None:
    """The record is keyed by the model's content: an initializer changed in place between two
    fits is trained from its new value (a weight's value is fed: the graphs are not built
    again)."""
    X, y = _data()
    model = build_linear(seed=4)
    loss = add_loss_output(model)
    trainer = OrtGradientOptimizer(loss, batch_size=4, learning_rate=0.05, max_iter=2, shuffle=False)
    trainer.fit(X, y)
    for init in loss.graph.initializer:
        if init.name == "intercept":
            init.CopyFrom(numpy_helper.from_array(np.array([3.0], dtype=np.float32), "intercept"))
    trainer.fit(X, y)
    start = {**initializers(model), "intercept": np.array([3.0], dtype=np.float32)}
    expected, _ = linear_sgd_reference(start, X, y, eta=0.05, batch_size=4, epochs=2)
    for name, value in expected.items():
        np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
    assert builds == ["OrtGradientOptimizer"]


def test_large_models_are_not_kept(builds: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cached record holds copies of the model's weights: models above
    MAX_CACHED_MODEL_BYTES are built per trainer and not kept (here with the bound lowered under
    the linear model's size); they train as the cached ones."""
    X, y = _data()
    model = build_linear(seed=4)
    monkeypatch.setattr(_loss_trainer, "MAX_CACHED_MODEL_BYTES", add_loss_output(model).ByteSize() - 1)
    expected, _ = linear_sgd_reference(initializers(model), X, y, eta=0.05, batch_size=5, epochs=3)
    for _ in range(2):
        trainer = OrtGradientOptimizer(
            add_loss_output(model), batch_size=5, learning_rate=0.05, max_iter=3, shuffle=False
        )
        trainer.fit(X, y)
        for name, value in expected.items():
            np.testing.assert_allclose(trainer.get_state()[name], value, rtol=1e-5, atol=1e-6)
    assert builds == ["OrtGradientOptimizer", "OrtGradientOptimizer"]  # built twice, kept never
    assert len(_loss_trainer._FIT_GRAPHS._entries) == 0
