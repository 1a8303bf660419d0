"""The batch buffers hold real rows before the first load (found during issue 26): the partial
loop sizes its outputs with one forward of batch 0 before the epoch's rows are gathered, and the
shuffled epoch copies were ``np.empty``: int64 ids read from that memory failed a Gather ("indices
element out of data bounds") whenever the allocator handed back a dirty block."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import OrtGradientForwardBackwardOptimizer, _data
from ort_train_core._runtime import Device


@pytest.mark.parametrize("path", ["epoch copy", "gathered", "gathered sparse"])
def test_batches_hold_data_rows_before_the_first_load(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 10, size=(32, 4)).astype(np.int64)
    X = rng.standard_normal((32, 3)).astype(np.float32)
    if path != "epoch copy":  # data above the epoch-copy bound are gathered batch by batch
        monkeypatch.setattr(_data, "EPOCH_GATHER_MAX_BYTES", 0)
    source = sp.csr_matrix(X) if path == "gathered sparse" else X
    # dirty the allocator with values no id takes, so that empty memory would show them
    junk = [np.full(n, -(2**40), dtype=np.int64) for n in (128, 96, 64)]
    del junk
    store = _data.BatchStore([ids, source], 8, Device("cpu"), shuffle=True)
    first_ids, first_x = (v.numpy() for v in store.batches[0])
    np.testing.assert_array_equal(first_ids, ids[:8])
    np.testing.assert_array_equal(first_x, X[:8])


def test_partial_loop_with_int64_ids_trains_as_numpy() -> None:
    """An embedding sum trained by the partial loop, shuffled batches, against numpy's SGD on the
    same batch order."""
    table = np.random.default_rng(1).standard_normal((10, 1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "X"], ["g"]),
            helper.make_node("ReduceSum", ["g", "axes"], ["Y"], keepdims=0),
        ],
        "embedding_sum",
        [helper.make_tensor_value_info("X", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(table, "E"), numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    X = np.array([[1, 2, 4, 5], [4, 3, 2, 9], [0, 0, 7, 8], [9, 9, 1, 6]], dtype=np.int64)
    y = np.array([[1.0], [-1.0], [0.5], [2.0]], dtype=np.float32)
    trainer = OrtGradientForwardBackwardOptimizer(
        model, max_iter=2, batch_size=2, learning_rate=0.1, random_state=3, shuffle=True
    ).fit(X, y)
    E = table.astype(np.float64)
    rng = np.random.default_rng(3)
    for _ in range(2):
        order = rng.permutation(len(X))
        for s in range(0, len(X), 2):
            rows = order[s : s + 2]
            d = E[X[rows]].sum(axis=1) - y[rows]  # [2, 1]
            grad = np.zeros_like(E)
            np.add.at(grad, X[rows], np.broadcast_to((2 * d / len(rows))[:, None, :], (len(rows), 4, 1)))
            E -= 0.1 * grad
    np.testing.assert_allclose(trainer.get_state()["E"], E, rtol=1e-5, atol=1e-6)
