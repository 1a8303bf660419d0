"""The trainers' record of their graphs follows the model's content: an edit of the proto in
place between two fits is seen (numpy SGD from the edited weights), and a fit of an unchanged
model with unchanged parameters reuses the graphs and sessions of the previous one."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from core_models import build_linear, initializers, linear_sgd_reference
from onnx import numpy_helper

import ort_train_core as otc

ETA, BATCH, EPOCHS = 0.05, 10, 3


def _trainer(partial: bool) -> Any:
    model = build_linear(3)
    lr = otc.LearningRateSGD(eta0=ETA, learning_rate="constant")
    common: dict[str, Any] = {"max_iter": EPOCHS, "batch_size": BATCH, "learning_rate": lr, "shuffle": False}
    if partial:
        return otc.OrtGradientForwardBackwardOptimizer(model, **common)
    return otc.OrtGradientOptimizer(otc.add_loss_output(model), **common)


def _assert_follows_numpy(trainer: Any, start: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray) -> None:
    expected, losses = linear_sgd_reference(start, X, y, eta=ETA, batch_size=BATCH, epochs=EPOCHS)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=1e-5)
    state = trainer.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6)


def _set_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    (init,) = [i for i in model.graph.initializer if i.name == name]
    init.CopyFrom(numpy_helper.from_array(value, name))


@pytest.mark.parametrize("partial", [False, True], ids=["fused", "partial"])
def test_an_edit_of_the_model_in_place_is_seen_by_the_next_fit(linear_data, partial: bool) -> None:
    X, y = linear_data
    trainer = _trainer(partial)
    trainer.fit(X, y)
    start = {k: v for k, v in initializers(trainer.model_onnx).items() if k in ("coef", "intercept")}
    _assert_follows_numpy(trainer, start, X, y)

    edited = {"coef": np.array([[0.5], [-1.5], [2.0]], dtype=np.float32), "intercept": start["intercept"]}
    _set_initializer(trainer.model_onnx, "coef", edited["coef"])  # same object, new content
    trainer.fit(X, y)
    _assert_follows_numpy(trainer, edited, X, y)


@pytest.mark.parametrize("partial", [False, True], ids=["fused", "partial"])
def test_an_unchanged_model_reuses_its_graphs(linear_data, partial: bool) -> None:
    X, y = linear_data
    trainer = _trainer(partial)
    trainer.fit(X, y)
    record = trainer._fit_graphs()
    trainer.fit(X, y)
    assert trainer._fit_graphs() is record
    trainer.set_params(max_iter=EPOCHS)  # set_params drops the graphs built for the old ones
    trainer.fit(X, y)
    assert trainer._fit_graphs() is not record
