"""The one-thread rule of the full loop on CPU: which intra-op thread count a fused step gets
for a given graph and batch (issue 18 item 9; the cut-off comes from benchmarks/bench_threads.py)."""

from __future__ import annotations

import onnx
import pytest
from core_models import build_mlp

import ort_train_core
from ort_train_core import optimizer
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
    batch = optimizer.CPU_ONE_THREAD_MAX_WORK // n_weights
    loss_model = ort_train_core.add_loss_output(build_mlp(8, 50, 1))
    batch += extra
    expected = 1 if batch * n_weights <= optimizer.CPU_ONE_THREAD_MAX_WORK else None
    assert _threads(loss_model, batch) == expected
    assert expected == (1 if extra == 0 else None)


def test_large_step_gets_the_default_threads():
    loss_model = ort_train_core.add_loss_output(build_mlp(256, 512, 10))
    batch = 2048
    assert batch * _n_weights(256, 512, 10) > optimizer.CPU_ONE_THREAD_MAX_WORK
    assert _threads(loss_model, batch) is None
