"""Sparse X in the core trainers (issue 18 item 7): a scipy.sparse matrix is kept in CSR and
each batch is densified when it is gathered. Checked against numpy minibatch SGD on the dense
matrix, in row order and shuffled, on both loops; the other refusals name the fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from core_models import build_linear, initializers, linear_sgd_reference

from ort_train_core import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output


def _data() -> tuple[Any, np.ndarray]:
    X = sp.random(41, 3, density=0.4, format="csr", random_state=2, dtype=np.float64)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    return X, y


@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_sparse_batches_train_as_numpy_sgd(loop: str, shuffle: bool) -> None:
    X, y = _data()
    model = build_linear(seed=1)
    common: dict[str, Any] = dict(batch_size=8, learning_rate=0.05, max_iter=3, shuffle=shuffle)
    common["random_state"] = 4
    if loop == "full":
        trainer: Any = OrtGradientOptimizer(add_loss_output(model), **common)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, learning_loss="square_error", **common)
    trainer.fit(X.tocoo(), y)  # any format: COO becomes CSR
    rng = np.random.default_rng(4)
    orders = [rng.permutation(41) for _ in range(3)] if shuffle else None
    ref, history = linear_sgd_reference(
        initializers(model), X.toarray(), y, eta=0.05, batch_size=8, epochs=3, orders=orders
    )
    for name, value in ref.items():
        np.testing.assert_allclose(trainer.get_state()[name].ravel(), value.ravel(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=1e-5)


def test_sparse_validation_is_the_dense_one() -> None:
    X, y = _data()
    kwargs: dict[str, Any] = dict(batch_size=8, learning_rate=0.05, max_iter=2, shuffle=False)
    dense = OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), **kwargs)
    dense.fit(X.toarray(), y, X_val=X[:10].toarray(), y_val=y[:10])
    sparse = OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), **kwargs)
    sparse.fit(X, y, X_val=X[:10], y_val=y[:10])
    np.testing.assert_allclose(sparse.validation_losses_, dense.validation_losses_, rtol=1e-6)


def test_sparse_values_are_checked() -> None:
    X, y = _data()
    bad = X.copy()
    bad.data[0] = np.nan
    trainer = OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), max_iter=1)
    with pytest.raises(ValueError, match="NaN or infinite"):
        trainer.fit(bad, y)
    with pytest.raises(ValueError, match="4 features but the model expects 3"):
        trainer.fit(sp.random(41, 4, density=0.5, format="csr", random_state=0), y)


def test_the_callers_matrix_is_not_modified() -> None:
    """A float32 CSR matrix with unsorted column indices is trained on as it is: its values,
    indices and dtype stay the caller's (a float64 one is cast into new values)."""
    X, y = _data()
    X32 = X.astype(np.float32)
    data, indices = X32.data.copy(), X32.indices.copy()
    for row in range(X32.shape[0]):  # reverse each row's entries: the same matrix, unsorted
        s, e = X32.indptr[row], X32.indptr[row + 1]
        data[s:e], indices[s:e] = data[s:e][::-1].copy(), indices[s:e][::-1].copy()
    unsorted = sp.csr_matrix((data, indices, X32.indptr.copy()), shape=X32.shape)
    assert not unsorted.has_sorted_indices
    before = (unsorted.data.copy(), unsorted.indices.copy())
    trainer = OrtGradientOptimizer(
        add_loss_output(build_linear(seed=1)), batch_size=8, max_iter=2, shuffle=True, random_state=3
    )
    trainer.fit(unsorted, y)
    np.testing.assert_array_equal(unsorted.data, before[0])
    np.testing.assert_array_equal(unsorted.indices, before[1])
    np.testing.assert_array_equal(unsorted.toarray(), X32.toarray())
    dense = OrtGradientOptimizer(
        add_loss_output(build_linear(seed=1)), batch_size=8, max_iter=2, shuffle=True, random_state=3
    )
    dense.fit(X32.toarray(), y)
    np.testing.assert_allclose(trainer.get_state()["coef"], dense.get_state()["coef"], rtol=1e-6)
    X64 = X.copy()
    OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), max_iter=1).fit(X64, y)
    assert X64.dtype == np.float64
    np.testing.assert_array_equal(X64.toarray(), X.toarray())
