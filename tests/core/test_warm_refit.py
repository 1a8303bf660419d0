"""No rebuild for a refit (issue 27 item 5): a trainer over an architecture already trained in
this process, from other initial weights, builds no graph and no session on either backend (the
caches are keyed by the graph's structure, the weights fed as values); it trains exactly as a
trainer on empty caches (and as numpy's SGD); another batch size, loss, architecture or backend
builds its own graphs."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
from core_models import build_linear, build_mlp, initializers, linear_sgd_reference, mlp_forward

from backend_support import AVAILABLE, each_backend, training_build_only  # noqa: F401  (the backend fixture)
from call_counts import count_calls
from ort_train_core import (
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    _binding,
    _loss_trainer,
    add_loss_output,
    optimizer,
    partial,
)
from ort_train_core._backends import get_backend
from ort_train_core._cache import LRUCache


def _empty_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process cache of graphs and sessions, empty (restored after the test)."""
    for module, name in _CACHES:
        old = getattr(module, name)
        monkeypatch.setattr(module, name, LRUCache(old.maxsize))


_CACHES = [
    (_loss_trainer, "_FIT_GRAPHS"),
    (optimizer, "_FUSED_GRAPHS"),
    (_binding, "_SESSIONS"),
    *[(partial, n) for n in ("_FORWARD_BACKWARD", "_LOSS_GRADIENTS", "_UPDATES") if hasattr(partial, n)],
]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts of every builder call (graph records, fused steps, forward/backward pairs, loss
    and update graphs, onnxruntime sessions), on empty caches."""
    _empty_caches(monkeypatch)
    counts: collections.Counter[str] = collections.Counter()

    count_calls(monkeypatch, counts, _loss_trainer.LossGraphTrainer, "_new_fit_graphs")
    count_calls(monkeypatch, counts, _binding, "_new_session")
    count_calls(monkeypatch, counts, partial, "build_loss_gradient_graph")
    count_calls(monkeypatch, counts, partial, "build_update_graph")
    for name in AVAILABLE:
        cls = type(get_backend(name))
        count_calls(monkeypatch, counts, cls, "fused_step")
        count_calls(monkeypatch, counts, cls, "forward_backward")
    return counts


def _data(n_features: int = 4, rows: int = 30) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((rows, n_features)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] - 0.5 * X[:, -1]).astype(np.float32)
    return X, y


def _full(model: Any, **kw: Any) -> OrtGradientOptimizer:
    params: dict[str, Any] = dict(batch_size=8, learning_rate=0.05, max_iter=3, shuffle=False)
    return OrtGradientOptimizer(add_loss_output(model), **{**params, **kw})


def _partial(model: Any, **kw: Any) -> OrtGradientForwardBackwardOptimizer:
    params: dict[str, Any] = dict(batch_size=8, learning_rate=0.05, max_iter=3, shuffle=False)
    params.update(learning_loss="square_error")
    return OrtGradientForwardBackwardOptimizer(model, **{**params, **kw})


MAKERS = {"full": _full, "partial": _partial}


@pytest.mark.parametrize("loop", sorted(MAKERS))
def test_a_refit_from_other_weights_builds_nothing(
    loop: str, backend: str, builds: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    X, y = _data()
    make = MAKERS[loop]
    make(build_mlp(seed=1)).fit(X, y)  # the first fit of the architecture builds
    assert builds["_new_fit_graphs"] == 1
    assert builds["_new_session"] >= 1
    builds.clear()
    warm = make(build_mlp(seed=2)).fit(X, y)  # other initial weights, same architecture
    assert dict(builds) == {}, f"a warm refit built {dict(builds)}"
    _empty_caches(monkeypatch)
    cold = make(build_mlp(seed=2)).fit(X, y)
    assert builds["_new_fit_graphs"] == 1  # (the cold fit did build)
    for name, value in cold.get_state().items():
        np.testing.assert_array_equal(warm.get_state()[name], value, err_msg=name)


def test_a_warm_refit_trains_as_numpy_sgd(backend: str, builds: collections.Counter[str]) -> None:
    """The values fed to the reused graphs are the new model's: the linear steps equal numpy's
    SGD from the second model's weights, on both loops."""
    X, y = _data(n_features=3)
    for make in (_full, _partial):
        make(build_linear(seed=1)).fit(X, y)
        start = build_linear(seed=2)
        builds.clear()
        warm = make(start).fit(X, y)
        assert builds["_new_fit_graphs"] == 0
        expected, _ = linear_sgd_reference(initializers(start), X, y, eta=0.05, batch_size=8, epochs=3)
        for name, value in expected.items():
            np.testing.assert_allclose(warm.get_state()[name], value, rtol=1e-5, atol=1e-6)


def test_a_warm_refit_exports_its_own_weights(builds: collections.Counter[str]) -> None:
    """The trained graph of a warm refit holds its own weights, not the first model's: its
    prediction equals numpy's forward pass with them."""
    X, y = _data()
    first = _partial(build_mlp(seed=1)).fit(X, y)
    second = _partial(build_mlp(seed=2), max_iter=1).fit(X, y)
    assert builds["_new_fit_graphs"] == 1
    import onnxruntime

    for trainer in (first, second):
        sess = onnxruntime.InferenceSession(trainer.get_trained_onnx().SerializeToString())
        got = sess.run(None, {"X": X})[0]
        np.testing.assert_allclose(got, mlp_forward(trainer.get_state(), X), rtol=1e-5, atol=1e-6)


@training_build_only("switches between the two backends")
@pytest.mark.parametrize("loop", sorted(MAKERS))
def test_another_batch_loss_architecture_or_backend_builds(
    loop: str, builds: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No wrong reuse: each of these changes builds its own graphs."""
    X, y = _data()
    make = MAKERS[loop]
    make(build_mlp(seed=1)).fit(X, y)
    loss = {"learning_loss": "absolute_error"} if loop == "partial" else {}
    changes: list[tuple[str, Any, dict[str, Any]]] = [
        ("batch", build_mlp(seed=2), {"batch_size": 5}),
        ("architecture", build_mlp(seed=2, hidden=7), {}),
        ("learning rate", build_mlp(seed=2), {"learning_rate": "Adam"}),
    ]
    if loop == "partial":
        changes.append(("loss", build_mlp(seed=2), loss))
    for what, model, kw in changes:
        builds.clear()
        make(model, **kw).fit(X, y)
        built = sum(builds.values())
        assert built > 0, f"another {what} reused the graphs of the first fit"
    if len(AVAILABLE) == 2:
        builds.clear()
        monkeypatch.setenv("ORT_TRAIN_BACKEND", "onnx")
        make(build_mlp(seed=2)).fit(X, y)
        monkeypatch.setenv("ORT_TRAIN_BACKEND", "onnxruntime-training")
        assert builds["fused_step" if loop == "full" else "forward_backward"] >= 1


def test_another_constant_value_builds() -> None:
    """A float initializer that is not trained (here the intercept, frozen) keeps its value in
    the graphs: a model that differs in it is not served a record built with another value."""
    X, y = _data(n_features=3)
    fits = []
    for intercept in (0.0, 2.0):
        model = build_linear(seed=1, intercept=np.array([intercept], dtype=np.float32))
        fits.append(_full(model, weights_to_train=["coef"]).fit(X, y))
    start = initializers(build_linear(seed=1, intercept=np.array([2.0], dtype=np.float32)))
    pred = fits[1].get_trained_onnx()
    import onnxruntime

    got = onnxruntime.InferenceSession(pred.SerializeToString()).run(None, {"X": X})[0]
    expected = X @ fits[1].get_state()["coef"] + start["intercept"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loop", sorted(MAKERS))
def test_trainers_sharing_graphs_fit_at_once_as_one_after_the_other(loop: str, backend: str) -> None:
    """Four trainers of one architecture on four threads share the process's step graphs,
    forward/backward pairs and sessions: each ends with the weights it gets alone."""
    import threading

    X, y = _data(rows=64)
    make = MAKERS[loop]
    alone = [make(build_mlp(seed=s), max_iter=30).fit(X, y).get_state() for s in range(4)]
    trainers = [make(build_mlp(seed=s), max_iter=30) for s in range(4)]
    threads = [threading.Thread(target=t.fit, args=(X, y)) for t in trainers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for trainer, expected in zip(trainers, alone, strict=True):
        for name, value in expected.items():
            np.testing.assert_array_equal(trainer.get_state()[name], value, err_msg=name)
