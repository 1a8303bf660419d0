"""The ``threads`` setting (issue 26 item 23): onnxruntime's intra-op threads of every session
a trainer, a forward/backward pair or a module makes; None keeps the one-thread rule for small
work. The fused-step graph cache kept the thread count of the first trainer that built a graph,
so a second trainer over the same model with another setting ran the first one's threads: the
tests read ``intra_op_num_threads`` from the session options of the sessions actually run."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
from core_models import build_linear

from backend_support import training_build_only
from ort_train_core import (
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    SquareLearningLoss,
    add_loss_output,
)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    X = rng.standard_normal((12, 3)).astype(np.float32)
    return X, (X @ np.array([0.5, -1.0, 2.0]) + 0.1).astype(np.float32)


def _threads_of(session: Any) -> int:
    """onnxruntime's intra-op threads of a session (0: its default pool)."""
    return int(session.session_options.intra_op_num_threads)


def _trainer(kind: str, threads: Any) -> Any:
    common: dict[str, Any] = dict(max_iter=1, batch_size=4, learning_rate=0.05, threads=threads)
    if kind == "full":
        return OrtGradientOptimizer(add_loss_output(build_linear(seed=8)), **common)
    return OrtGradientForwardBackwardOptimizer(
        build_linear(seed=8), learning_loss=SquareLearningLoss(), **common
    )


def _sessions(trainer: Any) -> list[Any]:
    """Every session the trainer's last fit ran: the steps and the validation loss."""
    graphs = trainer._graphs()
    sessions = list(graphs.evaluators.values())
    if isinstance(trainer, OrtGradientOptimizer):
        return [*sessions, *(step.session for step in graphs.steps.values())]
    sessions.extend(pair.session for pair in graphs.forward_backward.values())
    sessions.extend(g.session for g in graphs.loss_gradients.values())
    return [*sessions, *(u.session for u in graphs.updates.values())]


@pytest.mark.parametrize("kind", ["full", "partial"])
def test_each_setting_gets_its_own_sessions_on_one_model(kind: str) -> None:
    X, y = _data()
    # one model content: the process caches (graph record, fused graphs, sessions) are shared
    for threads, expected in [(None, 1), (2, 2), (1, 1), (3, 3), (None, 1)]:
        trainer = _trainer(kind, threads)
        trainer.fit(X, y, X_val=X, y_val=y)
        found = {_threads_of(s) for s in _sessions(trainer)}
        assert found == {expected}, (threads, found)


@pytest.mark.parametrize("kind", ["full", "partial"])
def test_set_params_changes_the_sessions_of_the_next_fit(kind: str) -> None:
    X, y = _data()
    trainer = _trainer(kind, 1)
    trainer.fit(X, y)
    trainer.set_params(threads=2)
    trainer.fit(X, y)
    assert {_threads_of(s) for s in _sessions(trainer)} == {2}
    trainer.threads = 3  # an attribute set directly is read at the next fit too
    trainer.fit(X, y)
    sessions = _sessions(trainer)
    assert 3 in {_threads_of(s) for s in sessions}


@pytest.mark.parametrize("kind", ["full", "partial"])
def test_threads_is_a_parameter_kept_by_clone_and_pickle(kind: str) -> None:
    trainer = _trainer(kind, 2)
    assert trainer.get_params()["threads"] == 2
    assert trainer.clone().threads == 2
    assert "threads=2" in repr(trainer)
    X, y = _data()
    trainer.fit(X, y)
    again = pickle.loads(pickle.dumps(trainer))
    assert again.threads == 2
    again.fit(X, y)
    assert {_threads_of(s) for s in _sessions(again)} == {2}
    assert copy.deepcopy(trainer).threads == 2


@pytest.mark.parametrize("kind", ["full", "partial"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_invalid_threads_are_refused_before_any_step(kind: str, bad: Any) -> None:
    trainer = _trainer(kind, bad)
    X, y = _data()
    with pytest.raises(ValueError, match=rf"threads must be None .* or an integer >= 1 .*got {bad!r}"):
        trainer.fit(X, y)
    assert not hasattr(trainer, "n_iter_")


@training_build_only("its sessions are made per input shapes, at the first forward")
def test_forward_backward_pair_and_its_inference_session_take_threads() -> None:
    model = build_linear(seed=8)
    X, _ = _data()
    default = OrtGradientForwardBackward(model)
    assert _threads_of(default._pair.session) == 0  # today's behaviour: onnxruntime's pool
    fb = OrtGradientForwardBackward(model, threads=2)
    assert _threads_of(fb._pair.session) == 2
    out = fb.forward([X], training=False)[0]
    assert _threads_of(fb._inference) == 2
    np.testing.assert_allclose(
        np.asarray(out.numpy()).ravel(), np.asarray(default.forward([X], training=False)[0].numpy()).ravel()
    )
    again = pickle.loads(pickle.dumps(fb))
    assert again.threads == 2
    assert _threads_of(again._pair.session) == 2
    with pytest.raises(ValueError, match="threads must be None"):
        OrtGradientForwardBackward(model, threads=0)
