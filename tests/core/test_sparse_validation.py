"""Malformed scipy.sparse X (issue 26 item 5): a CSR matrix with out-of-range column indices was
a segmentation fault, an inconsistent ``indptr`` a heap-corruption abort (scipy's row indexing
and ``toarray`` read them unchecked). Every entry point that takes a sparse X now checks its
structure first and raises a ValueError naming the problem.

All the cases run in one child process: without the check the child dies of a signal instead
of failing these tests one by one, and a regression can never kill the test run itself."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from ort_train_core._data import check_sparse_structure

#: (case, expected message fragment)
CASES = {
    "column_index_too_large": "column index 1000000 but it has 3 columns",
    "negative_column_index": "column index -1 but it has 3 columns",
    "indptr_decreasing": "indptr decreases at position 6",
    "indptr_too_short": "indptr has 40 entries but a CSR matrix of 41 rows needs 42",
    "indptr_past_nnz": "indptr ends at 500000 but it stores",
    "indptr_not_from_zero": "indptr starts at 1, not 0",
    "data_indices_lengths": "data has 3 values but indices has",
    "csc_row_index": "row index 99 but it has 41 rows",
    "coo_column_index": "column index 7 but it has 3 columns",
}

#: the entry points the child process calls for each case
ROUTES = [
    "core_full",
    "core_partial",
    "core_validation",
    "core_score",
    "sk_fit",
    "sk_partial_fit",
    "sk_predict",
    "sk_score",
    "mlp_fit",
]

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np, scipy.sparse as sp
    sys.path.insert(0, {tests!r})
    from core_models import build_linear
    from ort_train_core import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output
    from ort_train_sklearn import OrtMLPClassifier, OrtSGDRegressor

    def data():
        X = sp.random(41, 3, density=0.4, format="csr", random_state=2, dtype=np.float64)
        return X, (X @ np.array([1.0, -2.0, 0.5])).astype(np.float32)

    def broken(case):
        X, _ = data()
        if case == "column_index_too_large":
            X.indices[0] = 1000000
        elif case == "negative_column_index":
            X.indices[0] = -1
        elif case == "indptr_decreasing":
            X.indptr[5] = X.indptr[6] + 1
        elif case == "indptr_too_short":
            X.indptr = X.indptr[:-2].copy()
        elif case == "indptr_past_nnz":
            X.indptr[-1] = 500000
        elif case == "indptr_not_from_zero":
            X.indptr[0] = 1
        elif case == "data_indices_lengths":
            X.data = X.data[:3].copy()
        elif case == "csc_row_index":
            X = X.tocsc()
            X.indices[0] = 99
        elif case == "coo_column_index":
            X = X.tocoo()
            X.col[0] = 7
        return X

    def run(route, X):
        good, y = data()
        if route == "core_full":
            OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), max_iter=1, batch_size=8).fit(X, y)
        elif route == "core_partial":
            OrtGradientForwardBackwardOptimizer(
                build_linear(seed=1), learning_loss="square_error", max_iter=1, batch_size=8
            ).fit(X, y)
        elif route == "core_validation":
            OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), max_iter=1, batch_size=8).fit(
                good, y, X_val=X, y_val=y
            )
        elif route == "core_score":
            t = OrtGradientOptimizer(add_loss_output(build_linear(seed=1)), max_iter=1, batch_size=8)
            t.fit(good, y)
            t.score(X, y)
        elif route == "sk_fit":
            OrtSGDRegressor(max_iter=1, tol=None).fit(X, y)
        elif route == "sk_partial_fit":
            OrtSGDRegressor().partial_fit(X, y)
        elif route == "sk_predict":
            OrtSGDRegressor(max_iter=1, tol=None).fit(good, y).predict(X)
        elif route == "sk_score":
            OrtSGDRegressor(max_iter=1, tol=None).fit(good, y).score(X, y)
        elif route == "mlp_fit":
            OrtMLPClassifier(hidden_layer_sizes=(2,), max_iter=1).fit(X, (y > 0).astype(int))

    for case in {cases!r}:
        for route in {routes!r}:
            try:
                run(route, broken(case))
                result = "no error"
            except Exception as exc:
                result = type(exc).__name__ + ": " + str(exc)
            print(json.dumps([case, route, result]), flush=True)
    """
)


@pytest.fixture(scope="module")
def child_results() -> tuple[dict[tuple[str, str], str], str]:
    script = CHILD.format(tests=str(Path(__file__).parent), cases=list(CASES), routes=ROUTES)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            case, route, result = json.loads(line)
            results[case, route] = result
    how = f"the child process ended with return code {proc.returncode} (a negative code is a signal)"
    return results, how + "\n" + proc.stderr[-2000:]


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_sparse_x_is_refused_on_every_route(
    child_results: tuple[dict[tuple[str, str], str], str], case: str
) -> None:
    results, how = child_results
    for route in ROUTES:
        assert (case, route) in results, f"{case} on {route} never returned: {how}"
        result = results[case, route]
        assert result.startswith("ValueError: "), f"{case} on {route}: {result}"
        assert "malformed sparse" in result, f"{case} on {route}: {result}"
        assert CASES[case] in result, f"{case} on {route}: {result}"


def test_valid_matrices_pass_unchanged() -> None:
    X = sp.random(41, 3, density=0.4, format="csr", random_state=2, dtype=np.float64)
    for value in (X, X.tocsc(), X.tocoo(), sp.csr_array(X), X.tobsr(), X.tolil(), sp.csr_matrix((5, 4))):
        check_sparse_structure("X", value)  # no error


def test_message_names_the_input_and_the_fix() -> None:
    X: Any = sp.random(6, 3, density=0.5, format="csr", random_state=0)
    X.indices[-1] = 3
    with pytest.raises(ValueError, match=r"^X\['a'\] is a malformed sparse CSR matrix: .*column index 3"):
        check_sparse_structure("X['a']", X)
