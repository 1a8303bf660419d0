"""The one-thread rule of the full loop on CPU: which intra-op thread count a fused step gets
for a given graph and batch (issue 18 item 9; the cut-off comes from benchmarks/bench_threads.py)."""

from __future__ import annotations

import gc
import os
import pathlib

import numpy as np
import onnx
import pytest
from core_models import build_mlp

import ort_train_core
from ort_train_core import _binding, optimizer
from ort_train_core._runtime import parse_device
from ort_train_core.graph import default_weights_to_train, initializers_to_inputs, set_batch_dimension
from ort_train_core.learning_rate import make_learning_rate


def _threads(loss_model: onnx.ModelProto, batch: int) -> int | None:
    names = default_weights_to_train(loss_model, "loss")
    model = initializers_to_inputs(loss_model, names)
    data = [i.name for i in model.graph.input if i.name not in names]
    model = set_batch_dimension(model, data, batch)
    _, _, threads = optimizer.fused_step_graph(
        model, "loss", names, batch, parse_device("cpu"), make_learning_rate(0.01)
    )
    return threads


def _n_weights(n_features: int, hidden: int, n_outputs: int) -> int:
    # W1, b1, W2, b2 of build_mlp, counted by hand (the reference the rule is checked against)
    return n_features * hidden + hidden + hidden * n_outputs + n_outputs


def test_digits_mlp_runs_on_one_thread():
    # issue 18 item 9: digits' MLP(100) at batch 200 (1.502e6 batch x weights) was given the
    # thread pool, which made its fit about 2x slower than one thread
    loss_model = ort_train_core.add_loss_output(build_mlp(64, 100, 10))
    assert 200 * _n_weights(64, 100, 10) == 1_502_000
    assert _threads(loss_model, 200) == 1


@pytest.mark.parametrize("extra", [0, 1])
def test_cut_off_is_batch_times_trained_weights(extra):
    # a batch whose batch x weights is exactly the cut-off keeps one thread; one row more does not
    n_weights = _n_weights(8, 50, 1)
    batch = _binding.CPU_ONE_THREAD_MAX_WORK // n_weights
    loss_model = ort_train_core.add_loss_output(build_mlp(8, 50, 1))
    batch += extra
    expected = 1 if batch * n_weights <= _binding.CPU_ONE_THREAD_MAX_WORK else None
    assert _threads(loss_model, batch) == expected
    assert expected == (1 if extra == 0 else None)


def test_large_step_gets_the_default_threads():
    loss_model = ort_train_core.add_loss_output(build_mlp(256, 512, 10))
    batch = 2048
    assert batch * _n_weights(256, 512, 10) > _binding.CPU_ONE_THREAD_MAX_WORK
    assert _threads(loss_model, batch) is None


TASKS = pathlib.Path("/proc/self/task")


@pytest.mark.skipif(not TASKS.is_dir(), reason="counts threads through Linux's /proc")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a one-core pool has no extra thread")
@pytest.mark.parametrize("hidden", [5, 6, 7])
def test_small_fits_with_validation_start_no_thread_pool(hidden):
    # the validation loss session and the partial loop's forward/backward, loss-gradient and
    # update sessions followed onnxruntime's default (a pool of cores - 1 threads each, cached
    # for the process)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 4)).astype(np.float32)
    y = X.sum(axis=1, keepdims=True).astype(np.float32)
    loss_model = ort_train_core.add_loss_output(build_mlp(4, hidden, 1))
    # no cached session may close (and end its threads) while the fits run
    _binding._SESSIONS.clear()
    gc.collect()
    before = len(list(TASKS.iterdir()))
    full = ort_train_core.OrtGradientOptimizer(loss_model, max_iter=2, batch_size=16)
    full.fit(X, y, X_val=X, y_val=y)
    partial = ort_train_core.OrtGradientForwardBackwardOptimizer(
        build_mlp(4, hidden, 1), max_iter=2, batch_size=16
    )
    partial.fit(X, y, X_val=X, y_val=y)
    full.score(X, y)
    assert len(list(TASKS.iterdir())) == before
