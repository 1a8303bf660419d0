"""``OnnxModelRegressor.loss_curve_`` on scikit-learn's scale, as its docstring says (issue 30
item 12): squared_error reported as ``MLPRegressor`` reports it, half the mean of ``(y - p) ** 2``
over rows and outputs (it reported the mean of the sum over outputs, twice that for one output);
``loss_`` and ``best_loss_`` follow; the other losses stay as written."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression
from sklearn.neural_network import MLPRegressor
from sklearn.neural_network._base import LOSS_FUNCTIONS
from sklearn.preprocessing import scale

from ort_train_sklearn import OnnxModelRegressor


def _fitted(n_outputs: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """An MLPRegressor for one output; LinearRegression for several (a multi-output
    MLPRegressor's converted graph has one label column: refused)."""
    X, y = make_regression(120, 4, n_targets=n_outputs, noise=5.0, random_state=0)
    X, y = scale(X).astype(np.float32), (scale(y) if n_outputs > 1 else y / y.std()).astype(np.float32)
    if n_outputs > 1:
        return LinearRegression().fit(X[::2], y[::2]), X, y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MLPRegressor(hidden_layer_sizes=(6,), max_iter=20, random_state=0).fit(X, y), X, y


@pytest.mark.parametrize("n_outputs", [1, 3])
def test_squared_error_is_reported_as_mlp_regressor_reports_it(n_outputs: int) -> None:
    fitted, X, y = _fitted(n_outputs)
    # one step of a vanishing rate over all rows: the epoch's loss is that of the fitted weights
    model = OnnxModelRegressor(fitted, learning_rate_init=1e-12, batch_size=len(X), max_iter=2, shuffle=False)
    model.fit(X, y)
    expected = LOSS_FUNCTIONS["squared_error"](y.reshape(len(y), -1), fitted.predict(X).reshape(len(y), -1))
    np.testing.assert_allclose(model.loss_curve_, [expected, expected], rtol=1e-5)
    assert model.loss_ == model.loss_curve_[-1]
    assert model.best_loss_ == min(model.loss_curve_)
    # scikit-learn's MLP has no absolute error: reported as written (mean over rows of the sum
    # over outputs)
    absolute = OnnxModelRegressor(
        fitted, loss="absolute_error", learning_rate_init=1e-12, batch_size=len(X), max_iter=1, shuffle=False
    ).fit(X, y)
    residual = y.reshape(len(y), -1) - fitted.predict(X).reshape(len(y), -1)
    np.testing.assert_allclose(absolute.loss_curve_, [np.abs(residual).sum(axis=1).mean()], rtol=1e-5)
