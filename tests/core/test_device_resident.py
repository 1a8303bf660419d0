"""The device-resident fit path that CUDA takes (data uploaded once, shuffled batches gathered
on the device, losses read back once per epoch), run here on CPU by declaring CPU resident:
the same code, checked against numpy. The tests marked ``cuda`` run it on a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_models import build_linear, initializers, linear_sgd_reference

import ort_train_core as otc
from ort_train_core import _data, optimizer
from ort_train_core._data import BatchStore
from ort_train_core._runtime import parse_device

SEED = 1234


@pytest.fixture
def resident_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_data, "DEVICE_RESIDENT_KINDS", {"cpu", "cuda"})


def _orders(seed: int, n: int, epochs: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(n) for _ in range(epochs)]


def _assert_close(state: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(state) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(state[name], expected[name], rtol=2e-5, atol=2e-6, err_msg=name)


def _trainer(kind: str, model: Any, **params: Any) -> Any:
    """The full loop (over the model with its squared-error loss) or the partial loop."""
    if kind == "full":
        return otc.OrtGradientOptimizer(otc.add_loss_output(model), **params)
    return otc.OrtGradientForwardBackwardOptimizer(model, **params)


def test_device_gather_gives_the_rows_of_the_order(resident_cpu: None) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((23, 3)).astype(np.float32)
    y = rng.integers(0, 5, 23).astype(np.int64)
    w = rng.random(23).astype(np.float32)
    store = BatchStore([X, y, w], 10, parse_device("cpu"), shuffle=True)
    assert store.gathers
    for order in _orders(3, 23, 2):
        store.load(order)
        for i, (s, e) in enumerate(store.bounds):
            store.fill(i)
            got = [np.asarray(v.numpy()) for v in store.batches[i]]
            for arr, ref in zip(got, (X, y, w)):
                np.testing.assert_array_equal(arr, ref[order[s:e]])


@pytest.mark.parametrize("kind", ["full", "partial"])
@pytest.mark.parametrize("prebound", [True, False])
def test_resident_fit_matches_numpy_sgd(
    resident_cpu: None, monkeypatch: pytest.MonkeyPatch, kind: str, prebound: bool, linear_data
) -> None:
    """Shuffled minibatch SGD with losses read once per epoch: numpy's weights and epoch losses.
    ``prebound=False``: past MAX_PREBOUND_BATCHES the full loop binds each batch's loss output
    at its step."""
    if not prebound:
        monkeypatch.setattr(optimizer, "MAX_PREBOUND_BATCHES", 1)
    X, y = linear_data
    model = build_linear(3, 1)
    trainer = _trainer(kind, model, max_iter=3, batch_size=10, learning_rate=0.05, random_state=SEED)
    trainer.fit(X, y, X_val=X, y_val=y)
    expected, losses = linear_sgd_reference(
        initializers(model), X, y, eta=0.05, batch_size=10, epochs=3, orders=_orders(SEED, len(X), 3)
    )
    state = trainer.get_state()
    _assert_close({k: state[k] for k in expected}, expected)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=1e-4)
    pred = X.astype(np.float64) @ expected["coef"] + expected["intercept"]
    val = float(np.mean((pred.ravel() - y) ** 2))
    assert trainer.validation_losses_[-1] == pytest.approx(val, rel=1e-4)


def test_resident_penalty_joins_the_epoch_loss(resident_cpu: None, linear_data) -> None:
    """The partial loop's penalty output goes to its own device scalar per batch; the epoch loss
    is loss + penalty, as numpy computes it."""
    X, y = linear_data
    model = build_linear(3, 1)
    l2 = 0.1
    trainer = otc.OrtGradientForwardBackwardOptimizer(
        model,
        max_iter=1,
        batch_size=10,
        learning_rate=1e-9,  # the weights barely move: each batch sees the initial ones
        shuffle=False,
        learning_penalty=otc.ElasticLearningPenalty(l1=0.0, l2=l2),
    ).fit(X, y)
    w = initializers(model)
    pred = X.astype(np.float64) @ w["coef"] + w["intercept"]
    batch_losses = [float(np.mean((pred[s : s + 10].ravel() - y[s : s + 10]) ** 2)) for s in (0, 10, 20)]
    penalty = l2 * float(np.sum(w["coef"].astype(np.float64) ** 2))
    expected = float(np.dot(np.array(batch_losses) + penalty, [10, 10, 3]) / 23)
    assert trainer.train_losses_[0] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["full", "partial"])
def test_resident_divergence_rolls_back_and_names_the_batch(resident_cpu: None, kind: str) -> None:
    """A loss that overflows mid-epoch is only seen at the epoch's end; the weights still go
    back to the end of the last complete epoch (here: the initial ones) and the error names
    the first batch whose loss was not finite."""
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((40, 3)) * 1e18).astype(np.float32)
    y = rng.standard_normal(40).astype(np.float32)
    model = build_linear(3, 1)
    trainer = _trainer(kind, model, max_iter=2, batch_size=10, learning_rate=1.0, shuffle=False)
    # numpy, float32: the first batch whose loss is not finite
    w = initializers(model)
    coef, intercept = w["coef"].astype(np.float32), w["intercept"].astype(np.float32)
    first_bad = None
    with np.errstate(all="ignore"):
        for b in range(4):
            xb, yb = X[b * 10 : b * 10 + 10], y[b * 10 : b * 10 + 10]
            diff = xb @ coef + intercept - yb.reshape(-1, 1)
            loss = np.float32(np.mean(diff.astype(np.float32) ** 2))
            if not np.isfinite(loss):
                first_bad = b
                break
            coef = coef - np.float32(2.0) * xb.T @ diff / np.float32(10)
            intercept = intercept - np.float32(2.0) * diff.sum(axis=0) / np.float32(10)
    assert first_bad is not None
    with pytest.raises(otc.ConvergenceError, match=rf"epoch 1, batch {first_bad + 1}:") as info:
        trainer.fit(X, y)
    assert info.value.batch == first_bad
    state = trainer.get_state()
    for name, value in w.items():
        np.testing.assert_array_equal(state[name], value)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["full", "partial"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_cuda_fit_matches_numpy_sgd(kind: str, shuffle: bool, linear_data) -> None:
    """On the GPU: uploaded once, gathered there when shuffled, losses read once per epoch."""
    X, y = linear_data
    model = build_linear(3, 1)
    trainer = _trainer(
        kind,
        model,
        device="cuda",
        max_iter=3,
        batch_size=10,
        learning_rate=0.05,
        random_state=SEED,
        shuffle=shuffle,
    )
    trainer.fit(X, y)
    orders = _orders(SEED, len(X), 3) if shuffle else None
    expected, losses = linear_sgd_reference(
        initializers(model), X, y, eta=0.05, batch_size=10, epochs=3, orders=orders
    )
    state = trainer.get_state()
    _assert_close({k: state[k] for k in expected}, expected)
    np.testing.assert_allclose(trainer.train_losses_, losses, rtol=1e-4)


@pytest.mark.cuda
def test_installed_cuda_wheels_are_found() -> None:
    """Where the [cuda] extra is installed, every library comes from its wheel."""
    from ort_train_core._cuda import CUDA_LIBRARIES, find_cuda_libraries, search_roots, uses_cuda11_libraries

    if not uses_cuda11_libraries():
        pytest.skip("onnxruntime-gpu ([gpu]) loads its own CUDA 13 wheels: the [cuda] extra's are not needed")

    found = find_cuda_libraries(search_roots())
    assert sorted(found) == sorted(lib.soname for lib in CUDA_LIBRARIES)
