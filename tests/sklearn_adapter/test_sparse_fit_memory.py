"""A float64 sparse X of short rows trains the SGD estimators through the padded-row graph
without a float32 copy of its stored values (issue 30 item 8: the fit's extra memory): each
batch's rows are cast as they are gathered, to the same weights as a float32 copy of X gives."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from ort_train_sklearn import OrtSGDClassifier


def _short_rows(n: int = 10_000, d: int = 2_000, per_row: int = 40, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    columns = rng.integers(0, d, size=(n, per_row))
    indptr = np.arange(0, n * per_row + 1, per_row)
    return sp.csr_matrix((rng.standard_normal(n * per_row), columns.ravel(), indptr), shape=(n, d))


def test_padded_fit_makes_no_float32_copy_of_the_values() -> None:
    """The fit's peak of numpy allocations stays under half a float32 copy of the values
    (failing before: the copy, 1.6 MB here, was made first: a peak of 2.3 MB, 0.75 MB now),
    and the weights are those of a fit on the float32 matrix."""
    X = _short_rows()
    y = (X @ np.linspace(-1, 1, X.shape[1]) > 0).astype(int)
    make = lambda: OrtSGDClassifier(max_iter=2, tol=None, random_state=0)  # noqa: E731
    make().fit(X[:200], y[:200])  # imports, graphs and sessions built once outside the trace
    tracemalloc.start()
    try:
        est = make().fit(X, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < X.nnz * 4 / 2
    assert est._trains_padded
    reference = make().fit(X.astype(np.float32), y)
    # to float32's rounding (a float32 X fits 1e-6 apart from a float64 one before, too)
    np.testing.assert_allclose(est.coef_, reference.coef_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(est.intercept_, reference.intercept_, rtol=1e-5, atol=1e-5)


def test_padded_fit_refuses_values_beyond_float32() -> None:
    """A value that float32 cannot hold is refused as on dense X (it would train as inf)."""
    X = _short_rows(n=200)
    X.data[17] = 1e39
    with pytest.raises(ValueError, match=r"^X holds 1 value\(s\) beyond the range of float32"):
        OrtSGDClassifier(max_iter=1).fit(X, np.arange(200) % 2)
