"""Training loop benchmark: ``OrtGradientOptimizer`` (full loop) and
``OrtGradientForwardBackwardOptimizer`` (partial loop) against their peers and the full loop's floor.

Cases: 100k x 10 float32 synthetic regression, a linear model and an MLP with one hidden layer
of 10 ReLU units, batch 100 and 1000, 10 epochs, constant learning rate, ``shuffle=False``,
squared error with mean reduction, the same initial weights everywhere.

Routes (per case):

- ``ort-train full loop``: ``OrtGradientOptimizer.fit`` end to end, one trainer per case. Its
  graphs and sessions (``setup``: loss graph -> fixed-batch gradient graph -> fused step graph ->
  session) are built and timed apart before the first fit, through the trainer's ``_fused``; the
  fits reuse them from the trainer's cache, as every fit after the first one does. The first
  (warm-up) fit is reported apart as well.
- ``ort-train partial loop``: ``OrtGradientForwardBackwardOptimizer.fit`` end to end, trained on
  the *prediction* graph (the same graph without its loss) with ``learning_loss='square_error'``
  and ``LearningRateSGD(eta0=lr, learning_rate='constant')``. A step runs forward through a
  TrainingAgent, a loss-gradient graph, backward, then a penalty/update graph. Its graphs,
  sessions and agent (``setup``: forward/backward graph + TrainingAgent, one loss-gradient graph
  per batch size, the update graph) are built and timed apart before the first fit, as for the
  full loop. It does the same work as the full loop (same loss, same SGD update), so its epoch
  loss and final MSE must equal the full loop's: the report checks it.
- ``floor (pre-bound fused graph)``: the trainer's own cached fused session, one IOBinding per
  (batch, weight parity) with the data, weights, new weights and a per-batch loss slot all bound
  before timing; the timed loop is only ``run_with_iobinding`` (no rebinding, no loss read).
- ``numpy``: hand-written forward / backward / update, preallocated buffers.
- ``torch``: ``nn.Linear`` / ``nn.Sequential``, ``MSELoss``, ``torch.optim.SGD``, pre-sliced
  batches, ``loss.item()`` each step (as the full loop reads its loss each step).
- ``sklearn SGDRegressor.partial_fit`` (linear only): one ``partial_fit`` per batch. It does
  per-sample SGD on 0.5 * squared error; ``eta0 = 2 * lr / batch_size`` makes one call move the
  weights about as much as one mini-batch step (same first-order update), so losses compare.
- ``sklearn MLPRegressor``: ``solver='sgd'``, ``momentum=0``, ``alpha=0``, ``batch_size``,
  ``shuffle=False``, ``tol=0``, ``n_iter_no_change > max_iter``. Its loss is 0.5 * MSE, so its
  gradient is half ours: ``learning_rate_init = 2 * lr`` gives the very same trajectory, and its
  ``loss_curve_`` is multiplied by 2 to read on our scale. For the linear case it runs with
  ``hidden_layer_sizes=()`` (a linear model).

us/step = (best total time of a fit) / (epochs * batches per epoch), time.perf_counter, best of
3 repeats (1 with ``--quick``) after one untimed warm-up run per route; the repeats go
round-robin over the routes of a case, so that a busy moment of a shared machine hits all alike.
Peers get their batches pre-sliced outside the timed region; the full and partial loops' times
include everything ``fit`` does (validation, device copies, bindings).

Losses: ``epoch loss`` is the last epoch's mean of the per-batch losses as the steps computed
them (before each update), on our scale (MSE); ``final MSE`` re-evaluates every route's final
weights on all rows in float64 with one numpy function.

Run: ``python benchmarks/bench_full.py [--quick] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from _common import fmt, machine_info, mlp_onnx, torch_sgd_loop

N_FEATURES = 10
HIDDEN = 10
LEARNING_RATE = 0.01
SEED = 0
#: the partial loop's epoch loss and final MSE must match the full loop's within this (relative)
SAME_WORK_RTOL = 1e-5

TARGETS = [
    # (name, case or None for every case, numerator route, denominator route, op, bound)
    ("full loop <= 1.25x the floor", None, "ort", "floor", "<=", 1.25),
    ("full loop <= 1.2x numpy (linear, batch 100)", "linear-b100", "ort", "numpy", "<=", 1.2),
    ("torch / full loop >= 5 (linear, batch 100)", "linear-b100", "torch", "ort", ">=", 5.0),
    ("MLPRegressor / full loop >= 2.5 (MLP, batch 100)", "mlp-b100", "mlpregressor", "ort", ">=", 2.5),
    ("partial loop <= 2.0x full loop (linear, batch 100)", "linear-b100", "partial", "ort", "<=", 2.0),
    ("partial loop <= 1.5x full loop (MLP, batch 1000)", "mlp-b1000", "partial", "ort", "<=", 1.5),
]

ROUTE_LABELS = {
    "ort": "ort-train full loop",
    "partial": "ort-train partial loop",
    "floor": "floor (pre-bound fused graph)",
    "numpy": "numpy (hand-written)",
    "torch": "torch CPU loop",
    "sgdregressor": "sklearn SGDRegressor.partial_fit",
    "mlpregressor": "sklearn MLPRegressor(sgd)",
}


# ---- data, weights, graphs ----------------------------------------------------------------
def make_data(n: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, N_FEATURES)).astype(np.float32)
    w = rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)
    y = X @ w + 0.5 + 0.5 * np.sin(2.0 * X[:, 0]) + 0.1 * rng.standard_normal(n)
    return X, y.astype(np.float32).reshape(n, 1)


def initial_weights(kind: str, seed: int = SEED) -> dict[str, np.ndarray]:
    """Glorot-uniform weights (scikit-learn's MLP rule), float32, in layer order."""
    rng = np.random.default_rng(seed + 1)
    units = [N_FEATURES, 1] if kind == "linear" else [N_FEATURES, HIDDEN, 1]
    out: dict[str, np.ndarray] = {}
    for k, (fan_in, fan_out) in enumerate(itertools.pairwise(units)):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        out[f"coef{k}"] = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        out[f"bias{k}"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return out


def layers(weights: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    n = len(weights) // 2
    return [(weights[f"coef{k}"], weights[f"bias{k}"]) for k in range(n)]


def predict(weights: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    h = X.astype(np.float64)
    pairs = layers(weights)
    for k, (W, b) in enumerate(pairs):
        h = h @ W.astype(np.float64) + b.astype(np.float64)
        if k < len(pairs) - 1:
            h = np.maximum(h, 0.0)
    return h


def full_mse(weights: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray) -> float:
    d = predict(weights, X) - y.astype(np.float64)
    return float(np.mean(np.sum(d * d, axis=1)))


def onnx_prediction_model(weights: dict[str, np.ndarray]) -> Any:
    """MatMul/Add(/Relu) prediction graph with the weights as initializers (output ``variable``)."""
    return mlp_onnx(layers(weights), graph_name="bench")


def onnx_loss_model(prediction_model: Any) -> Any:
    """The prediction graph plus the loss output (the full loop's model)."""
    from ort_train_core import add_loss_output

    return add_loss_output(prediction_model, "squared_error", reduction="mean")


def batch_bounds(n: int, batch: int) -> list[tuple[int, int]]:
    return [(s, min(s + batch, n)) for s in range(0, n, batch)]


def epoch_loss(losses: np.ndarray, bounds: list[tuple[int, int]]) -> float:
    sizes = np.array([e - s for s, e in bounds], dtype=np.float64)
    return float(np.dot(losses, sizes) / sizes.sum())


@dataclass
class Route:
    """One way to train a case: ``run()`` trains from the initial weights and returns the timed
    seconds; ``finish()`` reads the result of the last run (losses, weights, notes)."""

    run: Callable[[], float]
    finish: Callable[[], dict[str, Any]]
    #: what must outlive the runs (arrays that OrtValues view without owning them)
    keep: Any = None


# ---- routes -------------------------------------------------------------------------------
def route_ort(case: dict[str, Any]) -> tuple[Route, Any]:
    from ort_train_core import OrtGradientOptimizer

    trainer = OrtGradientOptimizer(
        case["model"],
        max_iter=case["epochs"],
        batch_size=case["batch"],
        learning_rate=LEARNING_RATE,
        shuffle=False,
    )
    # setup: graph build (loss graph -> fixed-batch gradient graph -> fused step) + session
    t0 = time.perf_counter()
    device, lr = trainer._validate_params()
    trainer._prepare_graphs(device, lr)
    for size in sorted({e - s for s, e in case["bounds"]}):
        trainer._fused(size, device, lr)
    setup = time.perf_counter() - t0
    X, y = case["X"], case["y"]

    def run() -> float:
        t = time.perf_counter()
        trainer.fit(X, y)
        return time.perf_counter() - t

    def finish() -> dict[str, Any]:
        return {
            "setup_seconds": setup,
            "epoch_loss": trainer.train_losses_[-1],
            "weights": trainer.get_state(),
            "note": "fit() end to end (validation, device copies, bindings, loop); graphs and "
            "sessions built before (setup) and cached, as for every fit after the first",
        }

    return Route(run, finish), trainer


def route_partial(case: dict[str, Any]) -> tuple[Route, Any]:
    from ort_train_core import LearningRateSGD, OrtGradientForwardBackwardOptimizer

    trainer = OrtGradientForwardBackwardOptimizer(
        case["prediction_model"],
        max_iter=case["epochs"],
        batch_size=case["batch"],
        learning_rate=LearningRateSGD(eta0=LEARNING_RATE, learning_rate="constant"),
        learning_loss="square_error",
        shuffle=False,
    )
    # setup: per batch size a forward/backward graph + session + TrainingAgent and a
    # loss-gradient graph, then the penalty/update graph
    t0 = time.perf_counter()
    device, lr = trainer._validate_params()
    trainer._prepare_graphs(device, lr)
    for size in sorted({e - s for s, e in case["bounds"]}):
        trainer._forward_backward(device, size)
        trainer._loss_gradient(size, device)
    trainer._update(device, lr)
    setup = time.perf_counter() - t0
    X, y = case["X"], case["y"]

    def run() -> float:
        t = time.perf_counter()
        trainer.fit(X, y)
        return time.perf_counter() - t

    def finish() -> dict[str, Any]:
        return {
            "setup_seconds": setup,
            "epoch_loss": trainer.train_losses_[-1],
            "weights": trainer.get_state(),
            "note": "fit() end to end on the prediction graph, learning_loss='square_error', "
            "LearningRateSGD(constant); per step: TrainingAgent forward, loss-gradient graph, "
            "TrainingAgent backward, penalty/update graph; graphs, sessions and agent built "
            "before (setup) and cached",
        }

    return Route(run, finish), trainer


def route_floor(case: dict[str, Any], trainer: Any) -> Route:
    from ort_train_core._runtime import C, parse_device
    from ort_train_core.learning_rate import make_learning_rate

    device = parse_device("cpu")
    lr = make_learning_rate(LEARNING_RATE)
    ort_dev = device.ort_device
    X, y, bounds, epochs = case["X"], case["y"], case["bounds"], case["epochs"]
    n_batches = len(bounds)
    keep: list[Any] = []  # every array an OrtValue views stays referenced here

    def ov(arr: np.ndarray) -> Any:
        keep.append(arr)
        return C.OrtValue.ortvalue_from_numpy(arr, ort_dev)

    init = case["weights"]
    buffers = {w: [np.array(v, copy=True) for _ in range(2)] for w, v in init.items()}
    buf_ov = {w: [ov(a) for a in pair] for w, pair in buffers.items()}
    lr_host = np.array(lr.scalar_values(0, 1)[0], dtype=np.float32)
    lr_ov = ov(lr_host)
    losses = np.zeros(n_batches, dtype=np.float32)
    loss_ov = [ov(losses[i : i + 1].reshape(())) for i in range(n_batches)]
    data_ov = [(ov(X[s:e]), ov(y[s:e])) for s, e in bounds]

    bindings: dict[tuple[int, int], Any] = {}
    for i, (s, e) in enumerate(bounds):
        _, sig, sess = trainer._fused(e - s, device, lr)
        assert not any(sig.states), "the floor handles stateless SGD only"
        for parity in (0, 1):
            b = C.SessionIOBinding(sess)
            for name, value in zip(sig.data_inputs, data_ov[i]):
                b.bind_ortvalue_input(name, value)
            for w, w_new in zip(sig.weights, sig.new_weights):
                b.bind_ortvalue_input(w, buf_ov[w][parity])
                b.bind_ortvalue_output(w_new, buf_ov[w][1 - parity])
            (scalar,) = sig.scalars
            b.bind_ortvalue_input(scalar, lr_ov)
            b.bind_ortvalue_output(sig.loss, loss_ov[i])
            bindings[i, parity] = (sess, b)
    # the steps of an epoch, by the parity the epoch starts with
    sequences = {p: [bindings[i, (p + i) % 2] for i in range(n_batches)] for p in (0, 1)}
    final = {"parity": 0}

    def run() -> float:
        for w, v in init.items():
            buffers[w][0][...] = v
        t = time.perf_counter()
        parity = 0
        for _ in range(epochs):
            for sess, b in sequences[parity]:
                sess.run_with_iobinding(b, None)
            parity = (parity + n_batches) % 2
        seconds = time.perf_counter() - t
        final["parity"] = parity
        return seconds

    def finish() -> dict[str, Any]:
        # each batch's loss slot is rewritten every epoch: it holds the last epoch's losses
        return {
            "epoch_loss": epoch_loss(losses.astype(np.float64), bounds),
            "weights": {w: pair[final["parity"]].copy() for w, pair in buffers.items()},
            "note": "the trainer's cached fused session; one IOBinding per (batch, weight "
            "parity) with data, weights, new weights, lr and a per-batch loss slot bound "
            "before timing; the timed loop only calls run_with_iobinding",
        }

    return Route(run, finish, keep=(keep, bindings))


def route_numpy(case: dict[str, Any]) -> Route:
    X, y, bounds, epochs = case["X"], case["y"], case["bounds"], case["epochs"]
    batches = [(X[s:e], y[s:e]) for s, e in bounds]
    init = case["weights"]
    f32 = np.float32
    mlp = case["kind"] == "mlp"
    losses = np.empty(len(bounds), dtype=np.float64)
    result: dict[str, np.ndarray] = {}

    def run() -> float:
        t = time.perf_counter()
        W = {k: v.copy() for k, v in init.items()}
        sizes = sorted({e - s for s, e in bounds})
        if mlp:
            W0, b0, W1, b1 = W["coef0"], W["bias0"], W["coef1"], W["bias1"]
            g0, gb0 = np.empty_like(W0), np.empty_like(b0)
            g1, gb1 = np.empty_like(W1), np.empty_like(b1)
            bufs = {
                n: (
                    np.empty((n, HIDDEN), f32),
                    np.empty((n, HIDDEN), f32),
                    np.empty((n, HIDDEN), dtype=bool),
                    np.empty((n, 1), f32),
                    np.empty((n, HIDDEN), f32),
                )
                for n in sizes
            }
            for _ in range(epochs):
                for i, (xb, yb) in enumerate(batches):
                    n = xb.shape[0]
                    h, a, mask, d, da = bufs[n]
                    np.matmul(xb, W0, out=h)
                    h += b0
                    np.maximum(h, 0, out=a)
                    np.matmul(a, W1, out=d)
                    d += b1
                    d -= yb
                    flat = d.reshape(-1)
                    losses[i] = float(np.dot(flat, flat)) / n
                    d *= f32(2.0 * LEARNING_RATE / n)
                    np.matmul(a.T, d, out=g1)
                    np.sum(d, axis=0, out=gb1)
                    np.matmul(d, W1.T, out=da)
                    np.greater(h, 0, out=mask)
                    da *= mask
                    np.matmul(xb.T, da, out=g0)
                    np.sum(da, axis=0, out=gb0)
                    W1 -= g1
                    b1 -= gb1
                    W0 -= g0
                    b0 -= gb0
        else:
            W0, b0 = W["coef0"], W["bias0"]
            g0, gb0 = np.empty_like(W0), np.empty_like(b0)
            bufs1 = {n: np.empty((n, 1), f32) for n in sizes}
            for _ in range(epochs):
                for i, (xb, yb) in enumerate(batches):
                    n = xb.shape[0]
                    d = bufs1[n]
                    np.matmul(xb, W0, out=d)
                    d += b0
                    d -= yb
                    flat = d.reshape(-1)
                    losses[i] = float(np.dot(flat, flat)) / n
                    d *= f32(2.0 * LEARNING_RATE / n)
                    np.matmul(xb.T, d, out=g0)
                    np.sum(d, axis=0, out=gb0)
                    W0 -= g0
                    b0 -= gb0
        seconds = time.perf_counter() - t
        result.clear()
        result.update(W)
        return seconds

    def finish() -> dict[str, Any]:
        return {
            "epoch_loss": epoch_loss(losses, bounds),
            "weights": dict(result),
            "note": "hand-written forward/backward/update, matmul/sum with out= buffers, lr folded "
            "into the residual, float32",
        }

    return Route(run, finish)


def route_torch(case: dict[str, Any], threads: int) -> Route:
    import torch

    torch.set_num_threads(threads)
    X, y, bounds, epochs = case["X"], case["y"], case["bounds"], case["epochs"]
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    batches = [(Xt[s:e], yt[s:e]) for s, e in bounds]
    pairs = layers(case["weights"])
    losses = np.empty(len(bounds), dtype=np.float64)
    holder: dict[str, Any] = {}

    def build() -> Any:
        mods: list[Any] = []
        for k, (W, b) in enumerate(pairs):
            lin = torch.nn.Linear(W.shape[0], W.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(W.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            mods.append(lin)
            if k < len(pairs) - 1:
                mods.append(torch.nn.ReLU())
        return mods[0] if len(mods) == 1 else torch.nn.Sequential(*mods)

    def run() -> float:
        model = build()
        loss_fn = torch.nn.MSELoss(reduction="mean")
        seconds = torch_sgd_loop(model, batches, loss_fn, LEARNING_RATE, epochs, losses)
        holder["model"] = model
        return seconds

    def finish() -> dict[str, Any]:
        lins = [m for m in holder["model"].modules() if isinstance(m, torch.nn.Linear)]
        weights = {}
        for k, lin in enumerate(lins):
            weights[f"coef{k}"] = lin.weight.detach().numpy().T.copy()
            weights[f"bias{k}"] = lin.bias.detach().numpy().copy()
        return {
            "epoch_loss": epoch_loss(losses, bounds),
            "weights": weights,
            "note": f"nn.Linear / nn.Sequential, MSELoss, optim.SGD, pre-sliced batches, "
            f"loss.item() each step, torch.set_num_threads({threads})",
        }

    return Route(run, finish)


def route_sgdregressor(case: dict[str, Any]) -> Route:
    from sklearn.linear_model import SGDRegressor

    X, y, bounds, epochs, batch = case["X"], case["y"], case["bounds"], case["epochs"], case["batch"]
    y1 = y.ravel()
    batches = [(X[s:e], y1[s:e]) for s, e in bounds]
    init = case["weights"]
    eta0 = 2.0 * LEARNING_RATE / batch
    holder: dict[str, Any] = {}

    def run() -> float:
        est = SGDRegressor(
            loss="squared_error",
            penalty=None,
            alpha=0.0,
            learning_rate="constant",
            eta0=eta0,
            shuffle=False,
            fit_intercept=True,
            tol=None,
        )
        # one call allocates the coefficients; then they are reset to the shared initial values
        est.partial_fit(*batches[0])
        est.coef_[...] = init["coef0"][:, 0]
        est.intercept_[...] = init["bias0"]
        t = time.perf_counter()
        for _ in range(epochs):
            for xb, yb in batches:
                est.partial_fit(xb, yb)
        seconds = time.perf_counter() - t
        holder["est"] = est
        return seconds

    def finish() -> dict[str, Any]:
        est = holder["est"]
        weights = {
            "coef0": np.asarray(est.coef_, dtype=np.float32).reshape(-1, 1),
            "bias0": np.asarray(est.intercept_, dtype=np.float32).reshape(1),
        }
        return {
            "epoch_loss": None,
            "weights": weights,
            "note": f"one partial_fit per batch = per-sample SGD on 0.5*squared error; "
            f"eta0 = 2*lr/batch_size ({eta0:g}) so one call moves the weights as one mini-batch "
            f"step does (to first order); {est.coef_.dtype}; partial_fit reports no loss",
        }

    return Route(run, finish)


def route_mlpregressor(case: dict[str, Any]) -> Route:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    class FixedInitMLPRegressor(MLPRegressor):
        """MLPRegressor whose first fit starts from given weights (layer order)."""

        def _init_coef(self, fan_in: int, fan_out: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
            W, b = self._fixed_init.pop(0)
            assert W.shape == (fan_in, fan_out)
            return W.astype(dtype, copy=True), b.astype(dtype, copy=True)

    X, y, epochs, batch = case["X"], case["y"], case["epochs"], case["batch"]
    y1 = y.ravel()
    hidden = (HIDDEN,) if case["kind"] == "mlp" else ()
    holder: dict[str, Any] = {}

    def run() -> float:
        est = FixedInitMLPRegressor(
            hidden_layer_sizes=hidden,
            activation="relu",
            solver="sgd",
            alpha=0.0,
            batch_size=batch,
            learning_rate="constant",
            learning_rate_init=2.0 * LEARNING_RATE,
            momentum=0.0,
            nesterovs_momentum=False,
            max_iter=epochs,
            shuffle=False,
            tol=0.0,
            n_iter_no_change=epochs + 1,
            early_stopping=False,
        )
        est._fixed_init = list(layers(case["weights"]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t = time.perf_counter()
            est.fit(X, y1)
            seconds = time.perf_counter() - t
        holder["est"] = est
        return seconds

    def finish() -> dict[str, Any]:
        est = holder["est"]
        assert est.n_iter_ == epochs, est.n_iter_
        weights = {}
        for k, (W, b) in enumerate(zip(est.coefs_, est.intercepts_)):
            weights[f"coef{k}"], weights[f"bias{k}"] = W, b
        return {
            "epoch_loss": 2.0 * est.loss_curve_[-1],
            "weights": weights,
            "note": f"fit(), hidden_layer_sizes={hidden}; its loss is 0.5*MSE, so "
            f"learning_rate_init = 2*lr gives our trajectory and loss_curve_ x 2 our scale; "
            f"{est.coefs_[0].dtype}",
        }

    return Route(run, finish)


# ---- machine ------------------------------------------------------------------------------
def evaluate_targets(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name = {c["name"]: c for c in cases}
    rows = []
    for name, case_name, num, den, op, bound in TARGETS:
        chosen = [by_name[case_name]] if case_name else cases
        for case in chosen:
            routes = case["routes"]
            if num not in routes or den not in routes:
                continue
            ratio = routes[num]["us_per_step"] / routes[den]["us_per_step"]
            ok = ratio <= bound if op == "<=" else ratio >= bound
            rows.append(
                {
                    "target": name,
                    "case": case["name"],
                    "ratio": ratio,
                    "op": op,
                    "bound": bound,
                    "pass": bool(ok),
                }
            )
    return rows


def check_same_work(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The partial loop does the full loop's work: its losses must equal the full loop's."""
    rows = []
    for case in cases:
        routes = case["routes"]
        if "ort" not in routes or "partial" not in routes:
            continue
        full, part = routes["ort"], routes["partial"]
        diffs = [abs(part[k] - full[k]) / max(abs(full[k]), 1e-30) for k in ("epoch_loss", "final_mse")]
        rows.append(
            {
                "case": case["name"],
                "epoch_loss": [full["epoch_loss"], part["epoch_loss"]],
                "final_mse": [full["final_mse"], part["final_mse"]],
                "max_rel_diff": max(diffs),
                "pass": bool(max(diffs) <= SAME_WORK_RTOL),
            }
        )
    return rows


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    v = m["versions"]
    cfg = report["config"]
    from ort_train_core.optimizer import CPU_ONE_THREAD_MAX_WORK as one_thread_max

    lines = [
        f"# Training loop benchmark ({report['date']}{', quick' if cfg['quick'] else ''})",
        "",
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs; Python {v['python']}, "
        f"numpy {v.get('numpy')}, onnxruntime {v.get('onnxruntime')}, torch {v.get('torch')}, "
        f"scikit-learn {v.get('scikit-learn')}; torch threads {m['torch_threads']}, "
        "onnxruntime intra-op threads: one for a fused step whose batch rows x trained values is "
        f"at most {one_thread_max:.1e} (every case here), the default for other sessions.",
        "",
        "1-minute load average around each case (other processes on the machine): "
        + ", ".join(
            f"{c['name']} {c['loadavg_1min'][0]:.1f}-{c['loadavg_1min'][1]:.1f}"
            for c in report["cases"]
            if None not in c["loadavg_1min"]
        )
        + ".",
        "",
        f"Data: {cfg['n_rows']} x {N_FEATURES} float32, {cfg['epochs']} epochs, constant "
        f"lr={LEARNING_RATE}, shuffle=False, MSE (mean). us/step = best of {cfg['repeats']} "
        "fit times / steps. Ratio = route us/step / full-loop us/step (> 1: slower than ours). "
        "Epoch loss: last epoch, mean of per-batch losses before each update (MSE scale). "
        "Final MSE: final weights re-evaluated on all rows (float64).",
        "",
        "| case | route | us/step | ratio vs full loop | epoch loss | final MSE |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case in report["cases"]:
        ours = case["routes"]["ort"]["us_per_step"]
        for key, r in case["routes"].items():
            lines.append(
                f"| {case['name']} | {ROUTE_LABELS[key]} | {r['us_per_step']:.2f} | "
                f"{r['us_per_step'] / ours:.2f} | {fmt(r['epoch_loss'])} | {fmt(r['final_mse'])} |"
            )
    lines += [
        "",
        "Setup of the full and partial loops (graph build + sessions, timed apart), first fit "
        "(warm-up) and best fit, in ms:",
        "",
        "| case | loop | steps | setup | first fit | best fit |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case in report["cases"]:
        for key in ("ort", "partial"):
            if key not in case["routes"]:
                continue
            r = case["routes"][key]
            lines.append(
                f"| {case['name']} | {ROUTE_LABELS[key]} | {case['steps']} | "
                f"{1e3 * r['setup_seconds']:.1f} | {1e3 * r['first_run_seconds']:.1f} | "
                f"{1e3 * r['seconds']:.1f} |"
            )
    lines += [
        "",
        "Targets (ratios of us/step from this run):",
        "",
        "| target | case | ratio | bound | result |",
        "|---|---|---:|---:|---|",
    ]
    for t in report["targets"]:
        lines.append(
            f"| {t['target']} | {t['case']} | {t['ratio']:.2f} | {t['op']} {t['bound']} | "
            f"{'PASS' if t['pass'] else 'MISS'} |"
        )
    if report.get("same_work"):
        lines += [
            "",
            f"Same work: the partial loop's epoch loss and final MSE against the full loop's "
            f"(relative difference, must be <= {SAME_WORK_RTOL:g}):",
            "",
            "| case | epoch loss full / partial | final MSE full / partial | max rel. diff | result |",
            "|---|---:|---:|---:|---|",
        ]
        for c in report["same_work"]:
            lines.append(
                f"| {c['case']} | {fmt(c['epoch_loss'][0], 8)} / {fmt(c['epoch_loss'][1], 8)} | "
                f"{fmt(c['final_mse'][0], 8)} / {fmt(c['final_mse'][1], 8)} | "
                f"{c['max_rel_diff']:.1e} | {'PASS' if c['pass'] else 'MISS'} |"
            )
    lines += ["", "Route notes:", ""]
    seen = set()
    for case in report["cases"]:
        for key, r in case["routes"].items():
            note = f"- {ROUTE_LABELS[key]} ({case['name']}): {r['note']}"
            if (key, r["note"]) not in seen:
                seen.add((key, r["note"]))
                lines.append(note)
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="20k rows, 2 epochs, 1 repeat")
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "results"),
        help="folder for the JSON and Markdown results",
    )
    parser.add_argument("--rows", type=int, default=None, help="override the number of rows")
    parser.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    parser.add_argument("--repeats", type=int, default=None, help="override the repeats")
    args = parser.parse_args(argv)

    n_rows = args.rows or (20_000 if args.quick else 100_000)
    epochs = args.epochs or (2 if args.quick else 10)
    repeats = args.repeats or (1 if args.quick else 3)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    import ort_train_core  # noqa: F401  (imports onnxruntime before torch, see _runtime.py)

    X, y = make_data(n_rows)
    cases = []
    for kind in ("linear", "mlp"):
        weights = initial_weights(kind)
        prediction_model = onnx_prediction_model(weights)
        model = onnx_loss_model(prediction_model)
        for batch in (100, 1000):
            bounds = batch_bounds(n_rows, batch)
            case = {
                "name": f"{kind}-b{batch}",
                "kind": kind,
                "batch": batch,
                "epochs": epochs,
                "X": X,
                "y": y,
                "bounds": bounds,
                "weights": weights,
                "model": model,
                "prediction_model": prediction_model,
            }
            steps = epochs * len(bounds)
            load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            print(f"[{case['name']}] {steps} steps", flush=True)
            routes: dict[str, Route] = {}
            routes["ort"], trainer = route_ort(case)
            routes["partial"], partial_trainer = route_partial(case)
            routes["floor"] = route_floor(case, trainer)
            routes["numpy"] = route_numpy(case)
            routes["torch"] = route_torch(case, threads)
            if kind == "linear":
                routes["sgdregressor"] = route_sgdregressor(case)
            routes["mlpregressor"] = route_mlpregressor(case)
            # one untimed warm-up run each (first-call costs), then the repeats round-robin so
            # that a slow moment of a shared machine hits every route alike
            first = {key: route.run() for key, route in routes.items()}
            times: dict[str, list[float]] = {key: [] for key in routes}
            for _ in range(repeats):
                for key, route in routes.items():
                    times[key].append(route.run())
            results: dict[str, dict[str, Any]] = {}
            for key, route in routes.items():
                r = route.finish()
                r["seconds"] = min(times[key])
                r["times"] = times[key]
                r["first_run_seconds"] = first[key]
                r["us_per_step"] = 1e6 * r["seconds"] / steps
                r["final_mse"] = full_mse(r.pop("weights"), X, y)
                results[key] = r
                print(
                    f"  {ROUTE_LABELS[key]:<36} {r['us_per_step']:9.2f} us/step  "
                    f"epoch loss {fmt(r['epoch_loss'])}  final MSE {fmt(r['final_mse'])}",
                    flush=True,
                )
            del trainer, partial_trainer, routes
            cases.append(
                {
                    "name": case["name"],
                    "kind": kind,
                    "batch": batch,
                    "epochs": epochs,
                    "n_rows": n_rows,
                    "steps": steps,
                    "routes": results,
                    "loadavg_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
                }
            )

    date = datetime.date.today().isoformat()
    report = {
        "date": date,
        "config": {
            "quick": args.quick,
            "n_rows": n_rows,
            "n_features": N_FEATURES,
            "hidden": HIDDEN,
            "epochs": epochs,
            "repeats": repeats,
            "learning_rate": LEARNING_RATE,
            "seed": SEED,
            "dtype": "float32",
            "shuffle": False,
            "loss": "squared_error, mean reduction",
        },
        "machine": machine_info(threads),
        "cases": cases,
    }
    report["targets"] = evaluate_targets(cases)
    report["same_work"] = check_same_work(cases)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9_.-]", "", socket.gethostname()) or "machine"
    stem = f"{host}-{date}{'-quick' if args.quick else ''}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(report))
    print()
    print(markdown(report))
    print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
