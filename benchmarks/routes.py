"""The routes of the training benchmarks: every way this machine can train one small network on
one data set (a :class:`Case`), built by :data:`FACTORIES`, and :func:`run_case`, which times
them alike. ``bench_full.py`` runs them over its targets' cases.

A case: float32 synthetic data, a MatMul/Add(/Relu) network (:func:`mlp_onnx`) from fixed initial
weights (Glorot uniform), the same epochs, a constant learning rate, plain SGD, no penalty,
``shuffle=False``; regression trains the mean squared error, binary the mean cross-entropy on the
logit(s) (ort-train and torch routes only). Each route's note (in the reports) says what it runs;
where its library scales the loss differently (scikit-learn's squared error is half ours), its
learning rate makes our step and its losses are put on our scale. A route that does not apply, or
whose library is missing, raises :class:`Skip`. ``bench_full.py --only backends`` runs the
ort-train loops on each gradient backend (``full-onnx``, ``partial-onnxruntime-training``...).

Measures (:func:`run_case`), per route: ``setup`` (graphs, sessions, modules, timed apart where
the route has one: the ort-train trainers' ``prepare``), a first untimed run (first-call costs)
with the peak memory of both (:class:`_common.RssSampler`), then the timed runs, round-robin over
the routes of the case so that a busy moment of a shared machine hits all alike; ``us/step`` =
best timed run / steps. Each case's graphs carry the case's name, so that ort-train's process-wide
graph and session caches (keyed by graph content) hold none of them when the case starts.
``epoch loss``: the last epoch's mean of the per-batch losses each step computed before its
update; ``final loss``: the final weights re-evaluated on all rows by one numpy function in
float64 (:func:`full_loss`), the proof of equal work.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as common  # noqa: E402  (the benchmarks folder, whatever the working directory)

Layers = list[tuple[np.ndarray, np.ndarray]]


class Skip(Exception):
    """The route does not apply to this case or cannot run here; the message says why."""


# ---- graphs, data, weights ----------------------------------------------------------------
def mlp_onnx(
    layers: Sequence[tuple[np.ndarray, np.ndarray]],
    names: tuple[str, str] = ("coef", "bias"),
    output: str = "variable",
    graph_name: str = "mlp",
) -> Any:
    """The benchmarks' graph builder: MatMul/Add(/Relu between layers), opset 17, IR 8.

    Parameters
    ----------
    layers : sequence of (W, b)
        Weights in layer order, W (in, out) and b (out,); copied as float32 initializers
        ``{names[0]}{k}`` and ``{names[1]}{k}``.
    names : (str, str)
        Prefixes of the weight and bias initializers.
    output : str
        The graph's output, [N, out]; its input is ``X`` [N, F].
    graph_name : str
        The graph's name (part of its content, hence of ort-train's cache keys).

    Returns
    -------
    onnx.ModelProto
        The prediction graph.
    """
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    current = "X"
    w_name, b_name = names
    for k, (W, b) in enumerate(layers):
        W32, b32 = np.array(W, dtype=np.float32), np.array(b, dtype=np.float32).reshape(-1)
        inits += [numpy_helper.from_array(W32, f"{w_name}{k}"), numpy_helper.from_array(b32, f"{b_name}{k}")]
        last = k == len(layers) - 1
        nodes.append(helper.make_node("MatMul", [current, f"{w_name}{k}"], [f"mm{k}"]))
        out = output if last else f"pre{k}"
        nodes.append(helper.make_node("Add", [f"mm{k}", f"{b_name}{k}"], [out]))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"act{k}"]))
            out = f"act{k}"
        current = out
    n_in, n_out = np.shape(layers[0][0])[0], np.shape(layers[-1][0])[1]
    graph = helper.make_graph(
        nodes,
        graph_name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def make_data(n: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 (n, F), y float32 (n, 1)) from ``default_rng(seed)``: y is a linear part, an
    offset, a sine and noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, features)).astype(np.float32)
    x = X.astype(np.float64)
    w = rng.standard_normal(features) / np.sqrt(features)
    y = x @ w + 0.5 + 0.5 * np.sin(2.0 * x[:, 0]) + 0.1 * rng.standard_normal(n)
    return X, y.astype(np.float32).reshape(n, 1)


def initial_weights(features: int, hidden: Sequence[int], seed: int, outputs: int = 1) -> Layers:
    """Glorot-uniform weights (scikit-learn's MLP rule) from ``default_rng(seed)``, float32, in
    layer order, to ``outputs`` outputs."""
    rng = np.random.default_rng(seed)
    out = []
    for fan_in, fan_out in itertools.pairwise([features, *hidden, outputs]):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        W = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        out.append((W, rng.uniform(-bound, bound, fan_out).astype(np.float32)))
    return out


def full_loss(
    binary: bool, layers: Sequence[tuple[np.ndarray, np.ndarray]], X: np.ndarray, y: np.ndarray
) -> float:
    """The objective of every route on all rows, float64: mean squared error (summed over the
    output columns) or mean cross-entropy on the logit, softplus(z) - y z (on several logits:
    logsumexp(z) - z_y, y the class index)."""
    z = X.astype(np.float64)
    for k, (W, b) in enumerate(layers):
        z = z @ np.asarray(W, np.float64) + np.asarray(b, np.float64).reshape(-1)
        z = np.maximum(z, 0.0) if k < len(layers) - 1 else z
    if binary and z.shape[1] > 1:
        return float(np.mean(np.logaddexp.reduce(z, axis=1) - z[np.arange(len(z)), y[:, 0].astype(int)]))
    t = y.astype(np.float64).reshape(z.shape)
    return float(np.mean(np.logaddexp(0.0, z) - t * z if binary else np.sum((z - t) ** 2, axis=1)))


def batch_bounds(n: int, batch: int) -> list[tuple[int, int]]:
    return [(s, min(s + batch, n)) for s in range(0, n, batch)]


def epoch_mean(losses: np.ndarray, bounds: Sequence[tuple[int, int]]) -> float:
    """Mean of per-batch losses weighted by batch rows (as the trainers' ``train_losses_``)."""
    sizes = np.array([e - s for s, e in bounds], dtype=np.float64)
    return float(np.dot(losses, sizes) / sizes.sum())


def state_layers(state: Mapping[str, np.ndarray], n_layers: int) -> Layers:
    return [(state[f"coef{k}"], state[f"bias{k}"]) for k in range(n_layers)]


@dataclass
class Case:
    """One training job every route does: data, initial weights and settings.

    Parameters
    ----------
    name, kind : str
        The case's name (also its graphs' name) and kind (a label of the reports).
    X, y : ndarray
        float32 data, (n, F) and (n, 1) (0/1 when ``binary``).
    weights : list of (W, b)
        Initial weights in layer order, float32.
    batch, epochs : int
        Batch size (consecutive batches in row order) and epochs.
    lr : float
        The constant learning rate of plain SGD.
    binary : bool
        Cross-entropy on the logit (several outputs: on the logits, y the class index) instead of
        the squared error.
    device : str
        Device of the ort-train and torch routes.
    threads : int
        torch's thread count.
    ort_threads : int or None
        The ort-train trainers' ``threads`` (None: their policy).

    Attributes
    ----------
    bounds : list of (int, int)
        The batches' row ranges.
    labels : ndarray or None
        (n,) int64 class indices when ``binary``.
    """

    name: str
    kind: str
    X: np.ndarray
    y: np.ndarray
    weights: Layers
    batch: int
    epochs: int
    lr: float
    binary: bool = False
    device: str = "cpu"
    threads: int = 1
    ort_threads: int | None = None
    bounds: list[tuple[int, int]] = field(init=False)
    labels: np.ndarray | None = field(init=False)

    def __post_init__(self) -> None:
        self.bounds = batch_bounds(len(self.X), self.batch)
        self.labels = self.y[:, 0].astype(np.int64) if self.binary else None

    @property
    def steps(self) -> int:
        return self.epochs * len(self.bounds)

    @property
    def hidden(self) -> tuple[int, ...]:
        return tuple(int(W.shape[1]) for W, _ in self.weights[:-1])

    @property
    def named_weights(self) -> dict[str, np.ndarray]:
        """The initial weights under the graph's initializer names (``coef{k}``, ``bias{k}``)."""
        return {f"{p}{k}": a for k, wb in enumerate(self.weights) for p, a in zip(("coef", "bias"), wb)}

    @property
    def target(self) -> np.ndarray:
        """What the ort-train trainers take as y: float (n, 1) or int64 class indices (n,)."""
        return self.labels if self.labels is not None else self.y

    @property
    def flat_target(self) -> np.ndarray:
        """What scikit-learn's estimators take as y: (n,) floats or class indices."""
        return self.labels if self.labels is not None else self.y.ravel()


# ---- routes -------------------------------------------------------------------------------
@dataclass
class Route:
    """One way to train a case, built by a factory of :data:`FACTORIES`.

    Parameters
    ----------
    run : callable
        Trains from the initial weights; returns the timed seconds.
    finish : callable
        Reads the last run: ``epoch_losses`` (list on our scale, or None), ``weights`` (layers),
        optionally ``epoch_loss``, ``setup_seconds``.
    setup_seconds : float or None
        Graphs, sessions and modules built before the first run, where the route has them.
    note : str
        What the route runs, for the reports.
    device : str
        Where it trains.
    keep : object
        What must outlive the runs (arrays that OrtValues view without owning them).
    """

    run: Callable[[], float]
    finish: Callable[[], dict[str, Any]]
    setup_seconds: float | None
    note: str
    device: str = "cpu"
    keep: Any = None


def prediction_model(case: Case, backend: str | None = None) -> Any:
    # one graph name per backend: no graph or session cache of one backend serves the other
    return mlp_onnx(case.weights, graph_name=f"{case.name}-{backend}" if backend else case.name)


def _trainer(case: Case, partial: bool, backend: str | None = None) -> Any:
    """The full loop's trainer (the loss in the graph) or the partial loop's, for the case."""
    import ort_train_core as otc

    loop = dict(
        max_iter=case.epochs, batch_size=case.batch, shuffle=False, device=case.device, backend=backend
    )
    loop["threads"] = case.ort_threads
    if partial:
        lr = otc.LearningRateSGD(eta0=case.lr, learning_rate="constant")
        loss = "cross_entropy" if case.binary else "square_error"
        return otc.OrtGradientForwardBackwardOptimizer(
            prediction_model(case, backend), learning_rate=lr, learning_loss=loss, **loop
        )
    loss = "cross_entropy" if case.binary else "squared_error"
    model = otc.add_loss_output(prediction_model(case, backend), loss)
    return otc.OrtGradientOptimizer(model, learning_rate=case.lr, **loop)


def _trainer_route(case: Case, partial: bool, backend: str | None = None) -> Route:
    """A route timing ``fit`` end to end, either loop of ort-train-core, on ``backend`` (None:
    the default); setup: its ``prepare``."""
    from ort_train_core._runtime import is_training_build, ort_capi

    if backend == "onnxruntime-training" and not is_training_build(ort_capi):
        raise Skip("this onnxruntime is not the training build")
    t0 = time.perf_counter()
    trainer = _trainer(case, partial, backend).prepare(case.X, case.target)
    setup = time.perf_counter() - t0

    def run() -> float:
        t = time.perf_counter()
        trainer.fit(case.X, case.target)
        return time.perf_counter() - t

    def finish() -> dict[str, Any]:
        weights = state_layers(trainer.get_state(), len(case.weights))
        return {"epoch_losses": list(trainer.train_losses_), "weights": weights}

    if partial:
        loss = "cross_entropy" if case.binary else "square_error"
        note = (
            "OrtGradientForwardBackwardOptimizer.fit end to end on the prediction graph, learning_loss="
            f"'{loss}', LearningRateSGD(eta0=lr, 'constant'); per step: forward, loss-gradient graph, "
            "backward (a TrainingAgent, or two inference sessions on backend 'onnx'), update graph; setup = "
            "trainer and prepare(X, y) (forward/backward pair per batch size, loss-gradient and update "
            "graphs, sessions)"
        )
    else:
        note = (
            "OrtGradientOptimizer.fit end to end on add_loss_output(graph, "
            f"'{'cross_entropy' if case.binary else 'squared_error'}', reduction='mean'), learning_rate=lr "
            "(constant SGD); setup = loss graph, trainer and prepare(X, y) (fixed-batch fused step graphs "
            "and sessions)"
        )
    note += f"; backend {backend!r}" if backend else ""
    return Route(run, finish, setup, note, case.device, keep=trainer)


def _prepared_fused_step(trainer: Any, batch: int) -> tuple[Any, Any, Any, float]:
    """(signature, session, OrtDevice, learning rate value) of the fused step a prepared
    trainer runs for ``batch`` rows. ort-train-core has no public accessor for them: this reads
    the trainer's private members (the one place the benchmarks do)."""
    device, lr = trainer._validate_params()
    _, sig, sess = trainer._fused(batch, device, lr)
    return sig, sess, device.ort_device, float(lr.scalar_values(0, 1)[0])


def route_floor(case: Case) -> Route:
    from onnxruntime.capi import _pybind_state as ort_c

    if case.device != "cpu":
        raise Skip("the floor binds host arrays: CPU only")
    trainer = _trainer(case, partial=False).prepare(case.X, case.target)  # the full route's session
    X, y, bounds, n_batches = case.X, case.target, case.bounds, len(case.bounds)
    steps = {n: _prepared_fused_step(trainer, n) for n in sorted({e - s for s, e in bounds})}
    if any(any(sig.states) or len(sig.scalars) != 1 for sig, *_ in steps.values()):
        raise Skip("the floor handles stateless SGD only")
    ort_device = next(iter(steps.values()))[2]
    keep: list[Any] = []  # every array an OrtValue views stays referenced here

    def ov(arr: np.ndarray) -> Any:
        keep.append(arr)
        return ort_c.OrtValue.ortvalue_from_numpy(arr, ort_device)

    init = case.named_weights
    buffers = {w: [np.array(v, copy=True) for _ in range(2)] for w, v in init.items()}
    buffer_values = {w: [ov(a) for a in pair] for w, pair in buffers.items()}
    losses = np.zeros(n_batches, dtype=np.float32)
    bindings: dict[tuple[int, int], Any] = {}
    for i, (s, e) in enumerate(bounds):
        sig, sess, _, lr = steps[e - s]
        data = [ov(X[s:e]), ov(y[s:e])]
        lr_value, loss_value = ov(np.array(lr, dtype=np.float32)), ov(losses[i : i + 1].reshape(()))
        for parity in (0, 1):
            b = ort_c.SessionIOBinding(sess)
            for name, value in zip(sig.data_inputs, data):
                b.bind_ortvalue_input(name, value)
            for w, w_new in zip(sig.weights, sig.new_weights):
                b.bind_ortvalue_input(w, buffer_values[w][parity])
                b.bind_ortvalue_output(w_new, buffer_values[w][1 - parity])
            b.bind_ortvalue_input(sig.scalars[0], lr_value)
            b.bind_ortvalue_output(sig.loss, loss_value)
            bindings[i, parity] = (sess, b)
    # the steps of an epoch, by the parity the epoch starts with
    sequences = {p: [bindings[i, (p + i) % 2] for i in range(n_batches)] for p in (0, 1)}
    final = {"parity": 0}

    def run() -> float:
        for w, v in init.items():
            buffers[w][0][...] = v
        t = time.perf_counter()
        parity = 0
        for _ in range(case.epochs):
            for sess, b in sequences[parity]:
                sess.run_with_iobinding(b, None)
            parity = (parity + n_batches) % 2
        seconds = time.perf_counter() - t
        final["parity"] = parity
        return seconds

    def finish() -> dict[str, Any]:
        # each batch's loss slot is rewritten every epoch: it holds the last epoch's losses
        state = {w: pair[final["parity"]].copy() for w, pair in buffers.items()}
        return {
            "epoch_losses": None,
            "epoch_loss": epoch_mean(losses.astype(np.float64), bounds),
            "weights": state_layers(state, len(case.weights)),
        }

    note = (
        "the full loop's cached fused session (after prepare); one IOBinding per (batch, weight parity) "
        "with data, weights, new weights, lr and a per-batch loss slot bound before timing; the timed "
        "loop only calls run_with_iobinding"
    )
    return Route(run, finish, None, note, keep=(keep, bindings, trainer))


def _torch_parts(case: Case) -> tuple[Any, list[tuple[Any, Any]], Any]:
    """(device, the case's batches as tensors on it sliced once (views), the loss function),
    with ``torch.set_num_threads(case.threads)``."""
    import torch

    dev = torch.device(case.device)
    torch.set_num_threads(case.threads)
    multi = case.binary and case.weights[-1][0].shape[1] > 1  # several logits: class indices
    Xt, yt = torch.from_numpy(case.X).to(dev), torch.from_numpy(case.labels if multi else case.y).to(dev)
    batches = [(Xt[s:e], yt[s:e]) for s, e in case.bounds]
    functional = torch.nn.functional
    binary = functional.cross_entropy if multi else functional.binary_cross_entropy_with_logits
    loss_fn = binary if case.binary else functional.mse_loss
    return dev, batches, loss_fn


def _torch_sgd(
    case: Case, model: Any, batches: list[tuple[Any, Any]], loss_fn: Any
) -> tuple[float, list[float]]:
    """The timed loop of both torch routes: ``torch.optim.SGD`` (no momentum) over the batches
    for the case's epochs, ``loss.item()`` each step; (seconds, epoch losses)."""
    import torch

    losses = np.empty(len(batches), dtype=np.float64)
    history: list[float] = []
    t = time.perf_counter()
    opt = torch.optim.SGD(model.parameters(), lr=case.lr, momentum=0.0)
    for _ in range(case.epochs):
        for i, (xb, yb) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            losses[i] = loss.item()
        history.append(epoch_mean(losses, case.bounds))
    return time.perf_counter() - t, history


def _numpy_plan(case: Case) -> list[tuple[Any, ...]]:
    """Per batch: (n, x, y, transposed inputs of each layer, pre-activations, activations,
    deltas, ReLU masks, step factor), the buffers shared by the batches of one size."""
    f32 = np.float32
    units = [W.shape[1] for W, _ in case.weights]
    factor = 2.0 * case.lr
    per_size = {}
    for n in sorted({e - s for s, e in case.bounds}):
        a = [np.empty((n, u), f32) for u in units[:-1]]
        masks = [np.empty((n, u), dtype=bool) for u in units[:-1]]
        per_size[n] = (
            [a_.T for a_ in a],
            [np.empty((n, u), f32) for u in units],
            a,
            [np.empty((n, u), f32) for u in units],
            masks,
            f32(factor / n),
        )
    plan = []
    for s, e in case.bounds:
        aT, z, a, d, masks, step = per_size[e - s]
        plan.append((e - s, case.X[s:e], case.y[s:e], [case.X[s:e].T, *aT], z, a, d, masks, step))
    return plan


def route_numpy(case: Case) -> Route:
    if case.binary:
        raise Skip("the hand-written loop trains the squared error only")
    plan = _numpy_plan(case)
    last = len(case.weights) - 1
    losses = np.empty(len(plan), dtype=np.float64)
    result: dict[str, Any] = {}

    def run() -> float:
        t = time.perf_counter()
        Ws = [W.copy() for W, _ in case.weights]
        bs = [b.copy() for _, b in case.weights]
        gW = [np.empty_like(W) for W in Ws]
        gb = [np.empty_like(b) for b in bs]
        history = []
        for _ in range(case.epochs):
            for i, (n, xb, yb, inputsT, z, a, d, masks, step) in enumerate(plan):
                h = xb
                for k in range(last):
                    np.matmul(h, Ws[k], out=z[k])
                    z[k] += bs[k]
                    h = np.maximum(z[k], 0, out=a[k])
                out, dout = z[last], d[last]
                np.matmul(h, Ws[last], out=out)
                out += bs[last]
                np.subtract(out, yb, out=dout)
                flat = dout.reshape(-1)
                losses[i] = float(np.dot(flat, flat)) / n
                dout *= step  # lr / n (and the 2 of the squared error) folded into the output delta
                for k in range(last, -1, -1):
                    np.matmul(inputsT[k], d[k], out=gW[k])
                    np.sum(d[k], axis=0, out=gb[k])
                    if k:
                        np.matmul(d[k], Ws[k].T, out=d[k - 1])
                        np.greater(z[k - 1], 0, out=masks[k - 1])
                        d[k - 1] *= masks[k - 1]
                    Ws[k] -= gW[k]
                    bs[k] -= gb[k]
            history.append(epoch_mean(losses, case.bounds))
        seconds = time.perf_counter() - t
        result["weights"], result["history"] = list(zip(Ws, bs)), history
        return seconds

    def finish() -> dict[str, Any]:
        return {"epoch_losses": list(result["history"]), "weights": result["weights"]}

    note = (
        "hand-written forward/backward/update, float32, matmul/sum with out= buffers per batch size, "
        "lr folded into the output delta"
    )
    return Route(run, finish, 0.0, note)


def route_torch(case: Case) -> Route:
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from exc
    dev, batches, loss_fn = _torch_parts(case)
    holder: dict[str, Any] = {}

    def build() -> Any:
        mods: list[Any] = []
        for k, (W, b) in enumerate(case.weights):
            lin = torch.nn.Linear(W.shape[0], W.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(W.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            mods += [lin] if k == len(case.weights) - 1 else [lin, torch.nn.ReLU()]
        return (mods[0] if len(mods) == 1 else torch.nn.Sequential(*mods)).to(dev)

    def run() -> float:
        model = build()
        seconds, history = _torch_sgd(case, model, batches, loss_fn)
        holder["model"], holder["history"] = model, history
        return seconds

    def finish() -> dict[str, Any]:
        lins = [m for m in holder["model"].modules() if isinstance(m, torch.nn.Linear)]
        layers = [
            (m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy().copy()) for m in lins
        ]
        return {"epoch_losses": holder["history"], "weights": layers}

    note = (
        f"nn.Linear / nn.Sequential, {loss_fn.__name__}, optim.SGD, pre-sliced batches, loss.item() "
        f"each step, torch.set_num_threads({case.threads})"
    )
    return Route(run, finish, 0.0, note, str(dev))


def route_sk_sgd(case: Case) -> Route:
    if case.hidden or case.binary:
        raise Skip("SGDRegressor trains linear regressions only")
    from sklearn.linear_model import SGDRegressor

    y1 = case.flat_target
    batches = [(case.X[s:e], y1[s:e]) for s, e in case.bounds]
    # its squared loss is half ours: 2 lr; per-sample steps: / batch
    eta0 = 2.0 * case.lr / case.batch
    (W0, b0), holder = case.weights[0], {}

    def run() -> float:
        params = dict(penalty=None, alpha=0.0, learning_rate="constant", eta0=eta0, shuffle=False, tol=None)
        est = SGDRegressor(loss="squared_error", **params)
        est.partial_fit(*batches[0])
        # one call allocated the coefficients; reset them to the shared initial values
        est.coef_[...] = W0[:, 0]
        est.intercept_[...] = b0
        t = time.perf_counter()
        for _ in range(case.epochs):
            for xb, yb in batches:
                est.partial_fit(xb, yb)
        seconds = time.perf_counter() - t
        holder["est"] = est
        return seconds

    def finish() -> dict[str, Any]:
        est = holder["est"]
        return {"epoch_losses": None, "weights": [(est.coef_.reshape(-1, 1), est.intercept_.reshape(1))]}

    note = (
        "SGDRegressor(squared_error), one partial_fit per batch = per-sample SGD in float64; "
        "eta0 = 2*lr/batch so one call moves the weights as one mini-batch step (to first order); "
        "partial_fit reports no loss"
    )
    return Route(run, finish, 0.0, note)


def route_sk_mlp(case: Case) -> Route:
    if case.binary:
        raise Skip("MLPRegressor trains regressions only")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    layers = case.weights

    class FixedInit(MLPRegressor):  # type: ignore[misc]
        """scikit-learn's MLP whose fit starts from given weights (layer order)."""

        def _init_coef(self, fan_in: int, fan_out: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
            W, b = self._fixed_init.pop(0)
            assert W.shape == (fan_in, fan_out), (W.shape, fan_in, fan_out)
            return W.astype(dtype, copy=True), b.astype(dtype, copy=True)

    holder: dict[str, Any] = {}
    params = dict(activation="relu", solver="sgd", alpha=0.0, learning_rate="constant", momentum=0.0)

    def run() -> float:
        est = FixedInit(
            hidden_layer_sizes=case.hidden,
            batch_size=case.batch,
            learning_rate_init=2.0 * case.lr,
            nesterovs_momentum=False,
            max_iter=case.epochs,
            shuffle=False,
            tol=0.0,
            n_iter_no_change=case.epochs + 1,
            early_stopping=False,
            **params,
        )
        est._fixed_init = list(layers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t = time.perf_counter()
            est.fit(case.X, case.flat_target)
            seconds = time.perf_counter() - t
        holder["est"] = est
        return seconds

    def finish() -> dict[str, Any]:
        est = holder["est"]
        assert est.n_iter_ == case.epochs, est.n_iter_
        return {
            "epoch_losses": [2.0 * v for v in est.loss_curve_],
            "weights": list(zip(est.coefs_, est.intercepts_)),
        }

    note = (
        f"MLPRegressor(hidden_layer_sizes={case.hidden}, solver='sgd', momentum=0, alpha=0, "
        "learning_rate_init=2*lr, tol=0, n_iter_no_change > max_iter), fit() end to end; its loss "
        "is 0.5*MSE: loss_curve_ x 2"
    )
    return Route(run, finish, 0.0, note)


FACTORIES: dict[str, Callable[[Case], Route]] = {
    "full": lambda case: _trainer_route(case, partial=False),
    "partial": lambda case: _trainer_route(case, partial=True),
    "floor": route_floor,
    "numpy": route_numpy,
    "torch": route_torch,
    "sk_sgd": route_sk_sgd,
    "sk_mlp": route_sk_mlp,
}
for _name in ("onnx", "onnxruntime-training"):  # the loops on a named backend (bench_full.py --only backends)
    FACTORIES[f"full-{_name}"] = functools.partial(_trainer_route, partial=False, backend=_name)
    FACTORIES[f"partial-{_name}"] = functools.partial(_trainer_route, partial=True, backend=_name)


def preload() -> None:
    """Imports every route's libraries before the first case, so that no route's setup, first
    run or peak memory includes an import."""
    import ort_train_core  # noqa: F401  (imports onnxruntime before torch)

    for name in (
        "torch",
        "sklearn.linear_model",
        "sklearn.neural_network",
        "ort_train_sklearn",
        "ort_train_torch",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


# ---- one case -----------------------------------------------------------------------------
def _build_and_warm(
    case: Case, routes: Mapping[str, str], labels: Mapping[str, str]
) -> tuple[dict[str, Route], dict[str, Any], dict[str, str], dict[str, str]]:
    """Builds every route and runs it once untimed: (routes, their first runs and peak memory,
    skipped, failed)."""
    built: dict[str, Route] = {}
    first: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    for key, factory in routes.items():
        sampler = common.RssSampler().start()
        try:
            route = FACTORIES[factory](case)
            seconds = route.run()
        except Skip as exc:
            skipped[key] = str(exc)
            sampler.stop()
            continue
        except Exception as exc:
            _fail(failed, key, exc, labels)
            sampler.stop()
            continue
        first[key] = (seconds, sampler.stop())
        built[key] = route
    return built, first, skipped, failed


def _fail(failed: dict[str, str], key: str, exc: Exception, labels: Mapping[str, str]) -> None:
    failed[key] = f"{type(exc).__name__}: {exc}"
    print(f"  {labels[key]}: FAILED {failed[key]}", flush=True)
    traceback.print_exc()


def _result(
    case: Case, route: Route, out: dict[str, Any], times: list[float], first: tuple[float, Any]
) -> dict[str, Any]:
    best = min(times) if times else first[0]
    losses = out.get("epoch_losses")
    epoch_loss = out.get("epoch_loss", None if not losses else losses[-1])
    return {
        "seconds": best,
        "times": times,
        "first_run_seconds": first[0],
        "setup_seconds": out.get("setup_seconds", route.setup_seconds),
        "us_per_step": 1e6 * best / case.steps,
        "epoch_seconds": best / case.epochs,
        "peak_rss_bytes": first[1],
        "epoch_losses": None if losses is None else [float(v) for v in losses],
        "epoch_loss": None if epoch_loss is None else float(epoch_loss),
        "final_loss": full_loss(case.binary, out["weights"], case.X, case.y),
        "device": route.device,
        "note": route.note,
    }


def _compare(results: dict[str, dict[str, Any]], reference: str, rtol: float) -> None:
    """Each route's final and epoch loss and us/step against the reference route's."""
    ref = results.get(reference)
    for r in results.values():
        if ref is None:
            r["rel_diff_final"] = r["rel_diff_epoch"] = r["agrees"] = None
            continue
        r["rel_diff_final"] = abs(r["final_loss"] - ref["final_loss"]) / max(abs(ref["final_loss"]), 1e-30)
        r["rel_diff_epoch"] = (
            None
            if r["epoch_loss"] is None or ref["epoch_loss"] is None
            else abs(r["epoch_loss"] - ref["epoch_loss"]) / max(abs(ref["epoch_loss"]), 1e-30)
        )
        r["agrees"] = bool(r["rel_diff_final"] <= rtol)
        r["ratio_vs_full"] = r["us_per_step"] / ref["us_per_step"]


def run_case(
    case: Case,
    routes: Mapping[str, str],
    labels: Mapping[str, str],
    repeats: int,
    reference: str = "full",
    rtol: float = 0.05,
) -> dict[str, Any]:
    """Times routes of one case: setup and a first untimed run each, then timed runs round-robin.

    Parameters
    ----------
    case : Case
        The training job.
    routes : mapping of str to str
        Result key -> route name in :data:`FACTORIES`.
    labels : mapping of str to str
        Result key -> the route's label in the reports.
    repeats : int
        Timed runs per route.
    reference : str
        The result key every route is compared with (us/step ratio, final and epoch loss).
    rtol : float
        A final loss more than this (relative) away from the reference's is flagged.

    Returns
    -------
    dict
        The case's record: its settings, ``routes`` (result key -> measures), ``skipped`` and
        ``failed`` (result key -> why), the load average around it.
    """
    load_before, t_case = common.loadavg(), time.perf_counter()
    print(f"[{case.name}] {case.steps} steps ({case.epochs} epochs x {len(case.bounds)} batches)", flush=True)
    built, first, skipped, failed = _build_and_warm(case, routes, labels)
    times: dict[str, list[float]] = {key: [] for key in built}
    for _ in range(repeats):
        for key in list(built):
            try:
                times[key].append(built[key].run())
            except Exception as exc:
                built.pop(key)
                _fail(failed, key, exc, labels)
    results: dict[str, dict[str, Any]] = {}
    for key, route in built.items():
        try:
            results[key] = _result(case, route, route.finish(), times[key], first[key])
        except Exception as exc:
            _fail(failed, key, exc, labels)
    _compare(results, reference, rtol)
    for key, r in results.items():
        ratio = "" if r.get("ratio_vs_full") is None else f" x{r['ratio_vs_full']:.2f}"
        flag = "" if r["agrees"] in (True, None) else f"  DIFFERS {r['rel_diff_final']:.1%}"
        print(
            f"  {labels[key]:<32} {r['us_per_step']:9.1f} us/step{ratio:<8} "
            f"final loss {r['final_loss']:.6g}{flag}",
            flush=True,
        )
    for key, reason in skipped.items():
        print(f"  {labels[key]:<32} skipped: {reason}", flush=True)
    return {
        "name": case.name,
        "kind": case.kind,
        "n_rows": len(case.X),
        "n_features": case.X.shape[1],
        "batch": case.batch,
        "epochs": case.epochs,
        "learning_rate": case.lr,
        "batches_per_epoch": len(case.bounds),
        "steps": case.steps,
        "timed_runs": repeats,
        "routes": results,
        "skipped": skipped,
        "failed": failed,
        "loadavg_1min": [load_before, common.loadavg()],
        "case_seconds": time.perf_counter() - t_case,
    }
