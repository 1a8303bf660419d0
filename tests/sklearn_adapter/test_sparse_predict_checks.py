"""A sparse X's values are checked once when predicted (on their float32 cast, issue 30 item 8):
NaN and inf are refused with scikit-learn's own message, a finite value beyond float32 with
ours, for float64 and float32 matrices."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import SGDClassifier

from ort_train_sklearn import OrtSGDClassifier


def _fitted(X: sp.csr_matrix) -> tuple[OrtSGDClassifier, SGDClassifier]:
    y = np.arange(X.shape[0]) % 2
    return OrtSGDClassifier(max_iter=2, tol=None).fit(X, y), SGDClassifier(max_iter=2, tol=None).fit(X, y)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_values_refused_as_scikit_learn(value: float, dtype: type) -> None:
    X = sp.random(60, 400, density=0.02, format="csr", random_state=0, dtype=dtype)
    ours, theirs = _fitted(X)
    bad = X.copy()
    bad.data[5] = value
    with pytest.raises(ValueError, match=r"^Input X contains") as expected:
        theirs.decision_function(bad)
    message = str(expected.value).replace(type(theirs).__name__, type(ours).__name__)
    for method in (ours.decision_function, ours.predict):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            method(bad)


def test_values_beyond_float32_refused() -> None:
    X = sp.random(60, 400, density=0.02, format="csr", random_state=0)
    ours, _ = _fitted(X)
    bad = X.copy()
    bad.data[5] = -1e39
    with pytest.raises(ValueError, match=r"^X holds 1 value\(s\) beyond the range of float32"):
        ours.predict(bad)
    # the padded rows and the dense product sum in other orders (float32): 9e-6 relative on a
    # value of 3e-3 with stock onnxruntime 1.32
    dense = ours.decision_function(X.toarray())
    np.testing.assert_allclose(ours.decision_function(X), dense, rtol=1e-5, atol=1e-6 * np.abs(dense).max())
