"""The padded-row form of a CSR matrix (ort_train_core.extending.padded_rows), made batch by
batch by the fit's batch store: scattering each row's values back to their columns gives
scipy's dense rows; a graph reading the pair trains as on the dense matrix."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ort_train_core import OrtGradientOptimizer, add_loss_output
from ort_train_core.extending import PaddedRows, dense_rows, padded_rows


def _matrix(n: int = 50, d: int = 40, seed: int = 0) -> sp.csr_matrix:
    X = sp.random(n, d, density=0.1, format="lil", random_state=seed, dtype=np.float32)
    X[3] = 0  # an empty row
    return X.tocsr()


def _densified(values: np.ndarray, columns: np.ndarray, d: int) -> np.ndarray:
    out = np.zeros((values.shape[0], d))
    np.add.at(out, (np.arange(values.shape[0])[:, None], columns), values)
    return out


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("rows", [slice(None), slice(5, 17), np.array([7, 3, 49, 0, 7])])
def test_pair_scatters_back_to_the_dense_rows(rows: slice | np.ndarray, wide: bool) -> None:
    """Any rows, in any order (repeated too), and the last rows (whose windows would read past
    the data); ``wide``: more slots than stored values (no window fits): values at their
    columns are scipy's rows; padding holds 0 at a valid column."""
    X = _matrix()
    if wide:
        X = sp.csr_matrix(X.multiply(np.arange(50)[:, None] % 20 == 7), dtype=np.float32)
    width = X.nnz + 3 if wide else int(np.diff(X.indptr).max())
    values, columns = padded_rows(X, width)
    assert values.shape == columns.shape == (50, width)
    assert columns.dtype == X.indices.dtype
    assert values.dtype == np.float32
    v, c = dense_rows(values, rows), dense_rows(columns, rows)
    np.testing.assert_allclose(_densified(v, c, X.shape[1]), X[rows].toarray())
    assert c.min() >= 0
    assert c.max() < X.shape[1]
    lengths = np.diff(X.indptr)[np.arange(50)[rows]]
    assert (v[np.arange(v.shape[1]) >= lengths[:, None]] == 0).all()


def test_width_and_part_are_checked() -> None:
    X = _matrix()
    with pytest.raises(ValueError, match="below the longest row"):
        padded_rows(X, width=1)
    with pytest.raises(ValueError, match="part must be"):
        PaddedRows(X, "rows", padded_rows(X)[0]._slots)


def _padded_linear(d: int) -> ModelProto:
    """raw = sum_j values[:, j] * w[columns[:, j]]: a linear model on the padded rows."""
    nodes = [
        helper.make_node("Gather", ["w", "columns"], ["g"], axis=0),
        helper.make_node("Mul", ["values", "g"], ["p"]),
        helper.make_node("ReduceSum", ["p", "axis"], ["raw"], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "padded",
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info("columns", TensorProto.INT32, [None, None]),
        ],
        [helper.make_tensor_value_info("raw", TensorProto.FLOAT, [None, 1])],
        [
            numpy_helper.from_array(np.zeros(d, np.float32), "w"),
            numpy_helper.from_array(np.array([1]), "axis"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shuffle", [False, True])
def test_trains_as_the_dense_matrix(shuffle: bool) -> None:
    """Shuffled batches of 8 gathered from the pair: the weights a dense MatMul graph reaches on
    the dense matrix (numpy's least-squares steps as the reference)."""
    X = _matrix(n=64)
    y = (X @ np.arange(40, dtype=np.float32)).astype(np.float32).reshape(-1, 1)
    padded = OrtGradientOptimizer(
        add_loss_output(_padded_linear(40)),
        weights_to_train=["w"],
        max_iter=3,
        batch_size=8,
        learning_rate=0.05,
        shuffle=shuffle,
        random_state=0,
        tol=None,
    )
    padded.fit(padded_rows(X), y)
    # the same steps in numpy: mean squared error, rows in the trainer's order
    w = np.zeros(40)
    dense = X.toarray().astype(np.float64)
    rng = np.random.default_rng(0)
    for _ in range(3):
        order = rng.permutation(64) if shuffle else np.arange(64)
        for s in range(0, 64, 8):
            rows = order[s : s + 8]
            residual = dense[rows] @ w - y[rows, 0]
            w -= 0.05 * 2 * dense[rows].T @ residual / len(rows)
    np.testing.assert_allclose(padded.get_state()["w"], w, rtol=1e-4, atol=1e-5)
