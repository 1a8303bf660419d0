"""The sparse text benchmark's floor (benchmarks/bench_datasets.py, issue 30 item 8): its one
hand-written onnxruntime step is the hinge SGD step it stands for, against numpy's math, so
its time is the cost of the whole step and not of a shortcut."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from onnx import helper

from ort_train_core.extending import padded_rows

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_datasets")


def test_the_floor_step_is_numpys_hinge_sgd_step(bench: Any) -> None:
    rng = np.random.default_rng(0)
    X = sp.random(30, 40, density=0.15, format="csr", random_state=1, dtype=np.float32)
    y = np.where(rng.random(30) > 0.5, 1.0, -1.0).astype(np.float32)
    W, b = rng.normal(size=40).astype(np.float32), np.array([0.2], np.float32)
    lr, decay = 0.05, 1 - 0.05 * 1e-2
    values, columns = padded_rows(X, dtype=np.float32)
    session = bench._floor_session(helper.np_dtype_to_tensor_dtype(columns.dtype))
    W2, b2 = session.run(
        None,
        {
            "values": values.rows(slice(None)),
            "columns": columns.rows(slice(None)),
            "y": y,
            "W": W,
            "b": b,
            "rate": np.array(lr / 30, np.float32),
            "decay": np.array(decay, np.float32),
        },
    )
    # mean hinge loss max(0, 1 - y f): its gradient in f is -y where y f < 1, over the rows
    Xd = X.toarray().astype(np.float64)
    f = Xd @ W + b[0]
    grad_f = np.where(y * f < 1, -y, 0.0) / 30
    assert 0 < np.count_nonzero(grad_f) < 30  # both branches of the hinge are exercised
    np.testing.assert_allclose(W2, W * decay - lr * (Xd.T @ grad_f), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b2, b - lr * grad_f.sum(), rtol=1e-5, atol=1e-6)
