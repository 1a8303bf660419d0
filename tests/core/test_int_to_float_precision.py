"""Integers given to a float input (issue 26 item 18, one part): int64 values beyond 2**24 were
silently rounded when cast to float32 (16777217 trained as 16777216, neighbouring ids merged).
The cast now warns, naming the input, the largest value and the fix; integers float32 holds
exactly (2**30 included) pass without a word. Overflow to inf cannot happen from int64 (its
largest value, 9.2e18, is far inside float32's 3.4e38) and float64's is refused already."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from core_models import build_linear

from ort_train_core import LearningRateSGD, OrtGradientOptimizer, add_loss_output
from ort_train_core._data import cast_checked


def test_int64_beyond_float32_integers_warns() -> None:
    values = np.array([[1], [2**24 + 1], [-(2**40) - 3]], dtype=np.int64)
    with pytest.warns(UserWarning, match=r"X holds 2 integer\(s\) that float32 cannot hold exactly") as info:
        out = cast_checked("X", values, np.dtype(np.float32))
    text = str(info[0].message)
    assert "2**24" in text
    assert "16777217 becomes 16777216" in text
    np.testing.assert_array_equal(out, values.astype(np.float32))  # numpy's rounding, unchanged
    # integers float32 holds exactly, however large, pass without a word
    values = np.array([0, 2**24, 2**30, -(2**53)], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cast_checked("X", values, np.dtype(np.float32))
        cast_checked("X", np.array([2**52 + 1], dtype=np.int64), np.dtype(np.float64))


def test_float64_target_warns_beyond_2_53() -> None:
    with pytest.warns(UserWarning, match="float64 cannot hold exactly"):
        cast_checked("y", np.array([2**53 + 1], dtype=np.int64), np.dtype(np.float64))


def test_fit_names_the_input() -> None:
    X = np.arange(60, dtype=np.int64).reshape(20, 3) + 2**25 + 1
    y = np.ones(20, dtype=np.float32)
    lr = LearningRateSGD(1e-18, learning_rate="constant")  # the values are ~3e7: no divergence
    trainer = OrtGradientOptimizer(
        add_loss_output(build_linear(3, seed=1)), max_iter=1, learning_rate=lr, verbose=0
    )
    with pytest.warns(UserWarning, match=r"^X holds 45 integer\(s\) that float32 cannot hold exactly"):
        trainer.fit(X, y)


def test_sklearn_estimators_warn_on_fit_and_predict() -> None:
    """scikit-learn's validation makes int64 X float64 (exact to 2**53); the float32 cast after
    it rounds: the warning names the caller's integers."""
    from ort_train_sklearn import OrtSGDRegressor

    X = np.arange(60, dtype=np.int64).reshape(20, 3) + 2**25 + 1
    y = np.ones(20)
    est = OrtSGDRegressor(max_iter=1, tol=None, eta0=1e-18, learning_rate="constant")
    with pytest.warns(UserWarning, match=r"^X holds 45 integer\(s\) that float32 cannot hold exactly"):
        est.fit(X, y)
    with pytest.warns(UserWarning, match=r"^X holds 45 integer\(s\)"):
        est.predict(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.predict(X.astype(np.float64))  # floats are the caller's choice: nothing said
