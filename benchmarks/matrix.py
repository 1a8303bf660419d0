"""Benchmark matrix: every way this machine can train the same small models, over a grid of
data sizes, feature counts and batch sizes.

Kinds (float32 synthetic data, fixed seeds):

- ``linear``: linear regression, squared error (mean over rows);
- ``mlp``: MLP(50, 10) regression: two hidden ReLU layers of 50 then 10 units, squared error;
- ``binary``: binary classification with a linear logistic model, cross-entropy on the logit
  (softplus(z) - y z, mean over rows).

Grid: N in {1e3, 1e4, 1e5} rows x {10, 100} features x batch {10, 100, 1000} (``--quick``: a
subset, see :data:`QUICK_GRID`). Within a case every route trains the same epochs from the same
initial weights (Glorot uniform, float32) with the same constant learning rate, plain SGD, no
penalty, ``shuffle=False`` (consecutive batches in row order).

Routes (a route that does not apply, or whose library is missing, is skipped with its reason):

- ``full``: ``ort_train_core.OrtGradientOptimizer`` on ``add_loss_output(prediction graph,
  'squared_error' | 'cross_entropy', reduction='mean')``, a float learning rate (constant SGD);
- ``partial``: ``OrtGradientForwardBackwardOptimizer`` on the prediction graph,
  ``learning_loss='square_error' | 'cross_entropy'``, ``LearningRateSGD(eta0=lr, 'constant')``;
- ``ort_sklearn``: ``OrtSGDRegressor`` (linear), ``OrtSGDClassifier`` (binary) or
  ``OrtMLPRegressor`` (mlp, ``solver='sgd'``, ``momentum=0``), ``penalty=None``/``alpha=0``,
  ``learning_rate='constant'``, ``batch_size`` = the case's batch, ``max_iter`` = epochs,
  ``tol=None``, ``shuffle=False``, started from the shared weights (``_initial_graph``
  overridden). scikit-learn's squared error is (y - p)^2 / 2: these estimators take
  ``eta0 = learning_rate_init = 2 lr`` to make our step and report half our loss
  (``loss_curve_`` x 2 here);
- ``ort_torch``: ``ort_train_torch.OnnxModule`` of the prediction graph, ``torch.optim.SGD``,
  the loss in torch (``mse_loss`` / ``binary_cross_entropy_with_logits``);
- ``ort_native``: onnxruntime's own on-device training API through ``benchmarks/ort_native.py``
  (``unavailable_reason()`` and ``train(...)``), imported lazily;
- ``numpy``: hand-written minibatch SGD (forward, backward, update with ``out=`` buffers);
- ``torch``: ``nn.Linear`` / ``nn.Sequential``, ``MSELoss`` / ``BCEWithLogitsLoss``,
  ``torch.optim.SGD``, ``torch.set_num_threads(usable CPUs)``;
- ``sk_sgd``: scikit-learn ``SGDRegressor`` / ``SGDClassifier``, one ``partial_fit`` per batch
  (per-sample SGD inside the call); ``eta0 = 2 lr / batch`` (regression: its loss is half ours)
  or ``lr / batch`` (log loss) makes one call move the weights as one mini-batch step does, to
  first order, so the losses compare but are not identical;
- ``sk_mlp``: scikit-learn ``MLPRegressor`` / ``MLPClassifier`` (``hidden_layer_sizes=()`` for
  the linear kinds), ``solver='sgd'``, ``momentum=0``, ``alpha=0``, ``learning_rate_init = 2 lr``
  (regression) or ``lr`` (log loss), ``tol=0`` with ``n_iter_no_change > max_iter``,
  started from the shared weights (``_init_coef`` overridden); ``loss_curve_`` x 2 (regression).

Measures per case and route:

- ``us/step`` = best timed run / (epochs x batches per epoch) and ``epoch`` = best run / epochs,
  ``time.perf_counter``; one untimed warm-up run per route, then the timed runs going
  round-robin over the routes of the case: as many as give :data:`FULL_TARGET_STEPS` timed steps
  (``--quick``: :data:`QUICK_TARGET_STEPS`), at least 1 and at most :data:`FULL_MAX_REPEATS`
  (:data:`QUICK_MAX_REPEATS`), unless ``--repeats`` fixes the number. The timed run is the
  training loop only; data are converted and pre-sliced before it where the route allows (the
  ort-train and scikit-learn estimators' ``fit`` include their own input checks and device
  copies);
- ``setup``: graph building, sessions, module construction, timed apart where the route has
  one (before the warm-up). ort-train's process-wide graph and session caches are emptied at
  the start of each case, so that its setups are first ones (a fit of ``ort_sklearn`` builds
  its graphs in the warm-up and takes them from those caches in the timed fits);
- ``first run``: the warm-up run (first-call costs);
- ``peak memory``: see :class:`_common.RssSampler` (setup + warm-up run);
- ``epoch loss``: the last epoch's mean of the per-batch losses each step computed before its
  update (on one scale: MSE / mean cross-entropy); ``final loss``: the final weights
  re-evaluated on all rows by one numpy function in float64 (:func:`full_loss`), the proof of
  equal work. A route whose final loss differs from the full loop's by more than
  :data:`AGREEMENT_RTOL` is flagged.

Run alone: ``python benchmarks/matrix.py [--quick] [--device cpu|cuda] [--out DIR]``; the usual
entry point is ``benchmarks/run.py``, which also runs the target benchmarks.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import itertools
import math
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as common  # noqa: E402  (the benchmarks folder, whatever the working directory)

SEED = 0
KINDS = ("linear", "mlp", "binary")
KIND_TITLES = {
    "linear": "linear regression",
    "mlp": "MLP(50, 10) regression",
    "binary": "binary classification (linear logistic)",
}
HIDDEN: dict[str, tuple[int, ...]] = {"linear": (), "mlp": (50, 10), "binary": ()}
LEARNING_RATE = {"linear": 0.01, "mlp": 0.01, "binary": 0.05}
#: add_loss_output's score name and the partial loop's learning loss, per kind
SCORE_NAME = {"linear": "squared_error", "mlp": "squared_error", "binary": "cross_entropy"}
LEARNING_LOSS = {"linear": "square_error", "mlp": "square_error", "binary": "cross_entropy"}
#: a route whose final loss differs from the full loop's by more than this (relative) is flagged
AGREEMENT_RTOL = 0.05

FULL_GRID = [(n, f, b) for n in (1_000, 10_000, 100_000) for f in (10, 100) for b in (10, 100, 1000)]
QUICK_GRID = [(1_000, 10, 100), (10_000, 10, 10), (10_000, 10, 100), (10_000, 10, 1000), (10_000, 100, 100)]
FULL_EPOCHS, QUICK_EPOCHS = 3, 2
#: timed runs per route: enough for this many timed steps, within [1, max repeats]: short cases
#: get several runs (cheap), the long ones one (already thousands of steps)
FULL_TARGET_STEPS, FULL_MAX_REPEATS = 30_000, 5
QUICK_TARGET_STEPS, QUICK_MAX_REPEATS = 2_000, 3
#: the cases the plots use: epoch time against N at (features, batch); step time against batch
#: at (N, features), N falling back to the largest N run; loss curves at (N, features, batch)
PLOT_EPOCH_VS_N = (10, 100)
PLOT_STEP_VS_BATCH = (10_000, 10)
PLOT_LOSS_CASE = (10_000, 10, 100)

ROUTES = ("full", "partial", "ort_sklearn", "ort_torch", "ort_native", "numpy", "torch", "sk_sgd", "sk_mlp")
ROUTE_LABELS = {
    "full": "ort-train full loop",
    "partial": "ort-train partial loop",
    "ort_sklearn": "ort-train-sklearn",
    "ort_torch": "ort-train-torch OnnxModule",
    "ort_native": "onnxruntime training API",
    "numpy": "numpy",
    "torch": "torch loop",
    "sk_sgd": "sklearn SGD partial_fit",
    "sk_mlp": "sklearn MLP(sgd)",
    "plots": "plots",
}
#: routes that are ort-train itself (the others are its peers)
OURS = ("full", "partial", "ort_sklearn", "ort_torch")
#: (ours, peer) pairs that do the same job with the same API style
PAIRS = [("ort_sklearn", "sk_mlp"), ("ort_sklearn", "sk_sgd"), ("ort_torch", "torch")]


class Skip(Exception):
    """The route does not apply to this case or cannot run here; the message says why."""


# ---- data, weights, graphs ----------------------------------------------------------------
@dataclass
class Case:
    kind: str
    n: int
    features: int
    batch: int
    epochs: int
    lr: float
    X: np.ndarray  # (n, F) float32
    y: np.ndarray  # (n, 1) float32 (0/1 for binary)
    labels: np.ndarray | None  # (n,) int64 class index for binary, else None
    weights: list[tuple[np.ndarray, np.ndarray]]  # (W [in, out], b [out]) per layer, float32
    device: str = "cpu"
    threads: int = 1
    bounds: list[tuple[int, int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.kind}-n{self.n}-f{self.features}-b{self.batch}"

    @property
    def steps(self) -> int:
        return self.epochs * len(self.bounds)

    @property
    def target(self) -> np.ndarray:
        """What the ort-train trainers take as y: float (n, 1) or int64 class indices (n,)."""
        return self.labels if self.labels is not None else self.y


def make_data(kind: str, n: int, features: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 (n, F), y float32 (n, 1)); regression: a linear part, an offset, a sine and
    noise; binary: labels drawn from a logistic model with the same kind of score."""
    rng = np.random.default_rng(seed + features + (7 if kind == "binary" else 0))
    X = rng.standard_normal((n, features)).astype(np.float32)
    x = X.astype(np.float64)
    w = rng.standard_normal(features) / np.sqrt(features)
    score = x @ w + 0.5 + 0.5 * np.sin(2.0 * x[:, 0])
    if kind == "binary":
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-2.0 * score))).astype(np.float32)
    else:
        y = (score + 0.1 * rng.standard_normal(n)).astype(np.float32)
    return X, y.reshape(n, 1)


def initial_weights(kind: str, features: int, seed: int = SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    """Glorot-uniform weights (scikit-learn's MLP rule), float32, in layer order."""
    rng = np.random.default_rng(seed + 1000 + features)
    units = [features, *HIDDEN[kind], 1]
    out = []
    for fan_in, fan_out in itertools.pairwise(units):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        W = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        b = rng.uniform(-bound, bound, fan_out).astype(np.float32)
        out.append((W, b))
    return out


def forward(layers: Sequence[tuple[np.ndarray, np.ndarray]], X: np.ndarray) -> np.ndarray:
    """The network's output (scores or logits) in float64."""
    h = X.astype(np.float64)
    for k, (W, b) in enumerate(layers):
        h = h @ np.asarray(W, np.float64) + np.asarray(b, np.float64).reshape(-1)
        if k < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h


def full_loss(
    kind: str, layers: Sequence[tuple[np.ndarray, np.ndarray]], X: np.ndarray, y: np.ndarray
) -> float:
    """The objective of every route on all rows, float64: mean squared error (summed over the
    one output column) or mean binary cross-entropy on the logit, softplus(z) - y z."""
    z = forward(layers, X)
    t = y.astype(np.float64).reshape(z.shape)
    if kind == "binary":
        return float(np.mean(np.logaddexp(0.0, z) - t * z))
    d = z - t
    return float(np.mean(np.sum(d * d, axis=1)))


def prediction_model(layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> Any:
    """MatMul/Add(/Relu) prediction graph, weights ``coef{k}``/``bias{k}`` as initializers,
    input ``X`` [N, F], output ``variable`` [N, 1] (opset 17, IR 8)."""
    return common.mlp_onnx(layers, graph_name="matrix")


def batch_bounds(n: int, batch: int) -> list[tuple[int, int]]:
    return [(s, min(s + batch, n)) for s in range(0, n, batch)]


def epoch_mean(losses: np.ndarray, bounds: Sequence[tuple[int, int]]) -> float:
    """Mean of per-batch losses weighted by batch rows (as the trainers' ``train_losses_``)."""
    sizes = np.array([e - s for s, e in bounds], dtype=np.float64)
    return float(np.dot(losses, sizes) / sizes.sum())


def state_layers(state: dict[str, np.ndarray], n_layers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(state[f"coef{k}"], state[f"bias{k}"]) for k in range(n_layers)]


def clear_ort_caches() -> None:
    """Empties ort-train-core's process-wide caches of fused graphs and sessions, so that the
    next setup builds everything (as the first fit of a process does)."""
    with contextlib.suppress(ImportError, AttributeError):
        from ort_train_core import _binding, optimizer

        optimizer._FUSED_GRAPHS.clear()
        _binding._SESSIONS.clear()


# ---- routes -------------------------------------------------------------------------------
@dataclass
class Route:
    """``run()`` trains from the initial weights and returns the timed seconds; ``finish()``
    reads the last run: ``epoch_losses`` (list, our scale, or None), ``weights`` (layers)."""

    run: Callable[[], float]
    finish: Callable[[], dict[str, Any]]
    setup_seconds: float | None
    note: str
    device: str = "cpu"
    keep: Any = None
    #: called once the case is done (e.g. to remove temporary files)
    cleanup: Callable[[], None] | None = None


def _ort_setup(trainer: Any, case: Case, partial: bool) -> str:
    """Builds the trainer's graphs and sessions before the first fit (private methods, as
    bench_full.py does); returns a note when they changed and setup stays inside the first fit."""
    try:
        device, lr = trainer._validate_params()
        trainer._prepare_graphs(device, lr)
        for size in sorted({e - s for s, e in case.bounds}):
            if partial:
                trainer._forward_backward(device, size)
                trainer._loss_gradient(size, device)
            else:
                trainer._fused(size, device, lr)
        if partial:
            trainer._update(device, lr)
    except (AttributeError, TypeError) as exc:
        return f" (graphs not built apart: {type(exc).__name__}: {exc}; they are in the first run)"
    return ""


def route_full(case: Case) -> Route:
    from ort_train_core import OrtGradientOptimizer, add_loss_output

    t0 = time.perf_counter()
    model = add_loss_output(prediction_model(case.weights), SCORE_NAME[case.kind], reduction="mean")
    trainer = OrtGradientOptimizer(
        model,
        max_iter=case.epochs,
        batch_size=case.batch,
        learning_rate=case.lr,
        shuffle=False,
        device=case.device,
    )
    extra = _ort_setup(trainer, case, partial=False)
    setup = time.perf_counter() - t0

    note = (
        f"OrtGradientOptimizer.fit end to end on add_loss_output(graph, '{SCORE_NAME[case.kind]}', "
        "reduction='mean'), learning_rate=lr (constant SGD); setup = graph building (loss graph, "
        "fixed-batch fused step graphs) and sessions" + extra
    )
    return _trainer_route(trainer, case, setup, note)


def route_partial(case: Case) -> Route:
    from ort_train_core import LearningRateSGD, OrtGradientForwardBackwardOptimizer

    t0 = time.perf_counter()
    trainer = OrtGradientForwardBackwardOptimizer(
        prediction_model(case.weights),
        max_iter=case.epochs,
        batch_size=case.batch,
        learning_rate=LearningRateSGD(eta0=case.lr, learning_rate="constant"),
        learning_loss=LEARNING_LOSS[case.kind],
        shuffle=False,
        device=case.device,
    )
    extra = _ort_setup(trainer, case, partial=True)
    setup = time.perf_counter() - t0

    note = (
        "OrtGradientForwardBackwardOptimizer.fit end to end on the prediction graph, "
        f"learning_loss='{LEARNING_LOSS[case.kind]}', LearningRateSGD(eta0=lr, 'constant'); "
        "setup = forward/backward graphs + TrainingAgent per batch size, loss-gradient and "
        "update graphs, sessions" + extra
    )
    return _trainer_route(trainer, case, setup, note)


def _trainer_route(trainer: Any, case: Case, setup: float, note: str) -> Route:
    """A route timing ``trainer.fit`` end to end (either loop of ort-train-core)."""
    X, y = case.X, case.target

    def run() -> float:
        t = time.perf_counter()
        trainer.fit(X, y)
        return time.perf_counter() - t

    def finish() -> dict[str, Any]:
        return {
            "epoch_losses": list(trainer.train_losses_),
            "weights": state_layers(trainer.get_state(), len(case.weights)),
        }

    return Route(run, finish, setup, note, case.device, keep=trainer)


def _fixed_init_estimator(base: type, layers: list[tuple[np.ndarray, np.ndarray]], **params: Any) -> Any:
    """An ort-train-sklearn estimator whose first fit starts from ``layers``."""
    from ort_train_sklearn._graphs import dense_graph

    class FixedInit(base):  # type: ignore[misc, valid-type]
        def _initial_graph(self, n_features: int, n_outputs: int, rng: Any) -> Any:
            if layers[0][0].shape[0] != n_features or layers[-1][0].shape[1] != n_outputs:
                raise ValueError(f"initial weights do not fit {n_features} features, {n_outputs} outputs")
            activation = getattr(self, "activation", "identity")
            return dense_graph([W for W, _ in layers], [b for _, b in layers], activation)

    FixedInit.__name__ = base.__name__
    FixedInit.__qualname__ = base.__qualname__
    return FixedInit(**params)


def route_ort_sklearn(case: Case) -> Route:
    try:
        from ort_train_sklearn import OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor
    except ImportError as exc:
        raise Skip(f"ort-train-sklearn is not installed ({exc})") from exc
    common_params: dict[str, Any] = dict(
        max_iter=case.epochs,
        tol=None,
        shuffle=False,
        batch_size=case.batch,
        early_stopping=False,
        learning_rate="constant",
        random_state=SEED,
        device=case.device,
    )
    if case.kind == "mlp":
        scale = 2.0
        est = _fixed_init_estimator(
            OrtMLPRegressor,
            case.weights,
            hidden_layer_sizes=HIDDEN["mlp"],
            activation="relu",
            solver="sgd",
            alpha=0.0,
            momentum=0.0,
            nesterovs_momentum=False,
            learning_rate_init=scale * case.lr,
            **common_params,
        )
        what = "OrtMLPRegressor(solver='sgd', momentum=0, alpha=0, learning_rate_init=2*lr)"
    else:
        scale = 2.0 if case.kind == "linear" else 1.0
        base = OrtSGDRegressor if case.kind == "linear" else OrtSGDClassifier
        est = _fixed_init_estimator(
            base, case.weights, penalty=None, alpha=0.0, eta0=scale * case.lr, **common_params
        )
        what = f"{base.__name__}(penalty=None, alpha=0, eta0={'2*' if scale == 2 else ''}lr)"
    X = case.X
    y = case.labels if case.labels is not None else case.y.ravel()

    def run() -> float:
        t = time.perf_counter()
        est.fit(X, y)
        return time.perf_counter() - t

    def finish() -> dict[str, Any]:
        assert est.n_iter_ == case.epochs, est.n_iter_
        if case.kind == "mlp":
            layers = [(W, b) for W, b in zip(est.coefs_, est.intercepts_)]
        else:
            layers = [(np.asarray(est.coef_).reshape(-1, 1), np.asarray(est.intercept_).reshape(1))]
        return {"epoch_losses": [scale * v for v in est.loss_curve_], "weights": layers}

    note = (
        f"{what}, constant lr, batch_size, max_iter=epochs, tol=None, shuffle=False; fit() end to "
        "end (input validation, initial graph, trainer; graphs and sessions from the process "
        "caches after the first fit, so setup is inside the first run)"
        + ("; loss_curve_ is half our loss: x 2" if scale == 2 else "")
    )
    return Route(run, finish, None, note, case.device, keep=est)


def _torch_device(case: Case) -> Any:
    import torch

    if case.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise Skip(f"torch {torch.__version__} has no CUDA here")
    return torch.device(case.device)


def _torch_loss(case: Case) -> Any:
    import torch

    if case.kind == "binary":
        return torch.nn.functional.binary_cross_entropy_with_logits
    return torch.nn.functional.mse_loss


def _torch_batches(case: Case, dev: Any) -> list[tuple[Any, Any]]:
    """The case's batches as torch tensors on ``dev``, sliced once (views)."""
    import torch

    Xt, yt = torch.from_numpy(case.X).to(dev), torch.from_numpy(case.y).to(dev)
    return [(Xt[s:e], yt[s:e]) for s, e in case.bounds]


def _torch_sgd(
    case: Case, model: Any, batches: list[tuple[Any, Any]], loss_fn: Any
) -> tuple[float, list[float]]:
    """The timed loop of both torch routes: torch.optim.SGD over the batches for the case's
    epochs, ``loss.item()`` each step; (seconds, epoch losses)."""
    losses = np.empty(len(batches), dtype=np.float64)
    history: list[float] = []
    seconds = common.torch_sgd_loop(
        model,
        batches,
        loss_fn,
        case.lr,
        case.epochs,
        losses,
        after_epoch=lambda: history.append(epoch_mean(losses, case.bounds)),
    )
    return seconds, history


def route_ort_torch(case: Case) -> Route:
    try:
        import torch

        from ort_train_torch import OnnxModule
    except ImportError as exc:
        raise Skip(f"ort-train-torch or torch is not installed ({exc})") from exc
    dev = _torch_device(case)
    torch.set_num_threads(case.threads)
    t0 = time.perf_counter()
    module = OnnxModule(prediction_model(case.weights)).to(dev)
    setup = time.perf_counter() - t0
    init = {f"coef{k}": W for k, (W, _) in enumerate(case.weights)}
    init.update({f"bias{k}": b for k, (_, b) in enumerate(case.weights)})
    params = {onnx_name: getattr(module, attr) for attr, onnx_name in module.onnx_names.items()}
    batches = _torch_batches(case, dev)
    history: list[float] = []
    loss_fn = _torch_loss(case)

    def run() -> float:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(torch.from_numpy(init[name]))
        module.train()
        seconds, history[:] = _torch_sgd(case, module, batches, loss_fn)
        return seconds

    def finish() -> dict[str, Any]:
        state = {name: p.detach().cpu().numpy().copy() for name, p in params.items()}
        return {"epoch_losses": list(history), "weights": state_layers(state, len(case.weights))}

    note = (
        "OnnxModule(prediction graph) with torch.optim.SGD(lr), loss in torch "
        f"({loss_fn.__name__}), loss.item() each step; setup = OnnxModule construction "
        "(forward/backward graph and session)"
    )
    return Route(run, finish, setup, note, str(dev), keep=module)


def load_native() -> Any:
    """``benchmarks/ort_native.py`` as a module (Skip when absent or unavailable)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    try:
        module = importlib.import_module("ort_native")
    except ModuleNotFoundError as exc:
        if exc.name == "ort_native":
            raise Skip("benchmarks/ort_native.py is not there yet") from exc
        raise Skip(f"ort_native cannot be imported: {exc}") from exc
    reason = module.unavailable_reason()
    if reason is not None:
        raise Skip(f"ort_native: {reason}")
    return module


def route_ort_native(case: Case) -> Route:
    native = load_native()
    kwargs: dict[str, Any] = {}
    if case.device != "cpu":
        if "device" not in inspect.signature(native.train).parameters:
            raise Skip("ort_native.train() takes no device: CPU only")
        kwargs["device"] = case.device
    workdir = tempfile.mkdtemp(prefix=f"matrix-native-{case.name}-")
    native_kind = "binary" if case.kind == "binary" else "regression"
    holder: dict[str, Any] = {}

    def run() -> float:
        result = native.train(
            native_kind,
            {
                name: a.copy()
                for k, (W, b) in enumerate(case.weights)
                for name, a in ((f"W{k}", W), (f"b{k}", b))
            },
            case.X,
            case.y,
            batch=case.batch,
            epochs=case.epochs,
            lr=case.lr,
            workdir=workdir,
            **kwargs,
        )
        holder["result"] = result
        holder.setdefault("first_setup", result.get("setup_seconds"))
        if int(result.get("steps", case.steps)) != case.steps:
            raise RuntimeError(f"ort_native ran {result.get('steps')} steps, expected {case.steps}")
        return float(result["train_seconds"])

    def finish() -> dict[str, Any]:
        result = holder["result"]
        weights = result["weights"]
        layers = [
            (np.asarray(weights[f"W{k}"]), np.asarray(weights[f"b{k}"])) for k in range(len(weights) // 2)
        ]
        return {
            "epoch_losses": [float(v) for v in result.get("epoch_losses") or []] or None,
            "weights": layers,
            "setup_seconds": holder.get("first_setup"),
            "native_note": result.get("note"),
        }

    note = (
        f"ort_native.train('{native_kind}', {{W0, b0, ...}}, X, y float32 (n, 1), batch, epochs, lr): "
        "onnxruntime's on-device training API; time = its train_seconds, setup = its "
        "setup_seconds of the first call"
    )
    return Route(
        run, finish, None, note, case.device, cleanup=lambda: shutil.rmtree(workdir, ignore_errors=True)
    )


def route_numpy(case: Case) -> Route:
    f32 = np.float32
    batches = [(case.X[s:e], case.y[s:e]) for s, e in case.bounds]
    sizes = sorted({e - s for s, e in case.bounds})
    units = [case.features, *HIDDEN[case.kind], 1]
    n_layers = len(units) - 1
    binary = case.kind == "binary"
    # per batch size: pre-activations z, activations a, deltas d, ReLU masks
    bufs = {
        n: (
            [np.empty((n, u), f32) for u in units[1:]],
            [np.empty((n, u), f32) for u in units[1:-1]],
            [np.empty((n, u), f32) for u in units[1:]],
            [np.empty((n, u), dtype=bool) for u in units[1:-1]],
        )
        for n in sizes
    }
    losses = np.empty(len(batches), dtype=np.float64)
    result: dict[str, Any] = {}

    def run() -> float:
        t = time.perf_counter()
        Ws = [W.copy() for W, _ in case.weights]
        bs = [b.copy() for _, b in case.weights]
        gW = [np.empty_like(W) for W in Ws]
        gb = [np.empty_like(b) for b in bs]
        history = []
        for _ in range(case.epochs):
            for i, (xb, yb) in enumerate(batches):
                n = xb.shape[0]
                z, a, d, mask = bufs[n]
                h = xb
                for k in range(n_layers):
                    np.matmul(h, Ws[k], out=z[k])
                    z[k] += bs[k]
                    if k < n_layers - 1:
                        np.maximum(z[k], 0, out=a[k])
                        h = a[k]
                out, dout = z[-1], d[-1]
                if binary:
                    losses[i] = float(np.mean(np.logaddexp(0, out) - yb * out))
                    # sigmoid(z) - y, as 0.5 (1 + tanh(z / 2)) - y (no overflow)
                    np.multiply(out, f32(0.5), out=dout)
                    np.tanh(dout, out=dout)
                    dout *= f32(0.5)
                    dout += f32(0.5)
                    dout -= yb
                    dout *= f32(case.lr / n)
                else:
                    np.subtract(out, yb, out=dout)
                    flat = dout.reshape(-1)
                    losses[i] = float(np.dot(flat, flat)) / n
                    dout *= f32(2.0 * case.lr / n)
                for k in range(n_layers - 1, -1, -1):
                    np.matmul((xb if k == 0 else a[k - 1]).T, d[k], out=gW[k])
                    np.sum(d[k], axis=0, out=gb[k])
                    if k > 0:
                        np.matmul(d[k], Ws[k].T, out=d[k - 1])
                        np.greater(z[k - 1], 0, out=mask[k - 1])
                        d[k - 1] *= mask[k - 1]
                    Ws[k] -= gW[k]
                    bs[k] -= gb[k]
            history.append(epoch_mean(losses, case.bounds))
        seconds = time.perf_counter() - t
        result["weights"] = list(zip(Ws, bs))
        result["history"] = history
        return seconds

    def finish() -> dict[str, Any]:
        return {"epoch_losses": list(result["history"]), "weights": result["weights"]}

    note = (
        "hand-written forward/backward/update, float32, matmul/sum with out= buffers per batch "
        "size, lr folded into the output delta"
    )
    return Route(run, finish, 0.0, note)


def route_torch(case: Case) -> Route:
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from exc
    dev = _torch_device(case)
    torch.set_num_threads(case.threads)
    batches = _torch_batches(case, dev)
    holder: dict[str, Any] = {}
    loss_fn = _torch_loss(case)

    def build() -> Any:
        mods: list[Any] = []
        for k, (W, b) in enumerate(case.weights):
            lin = torch.nn.Linear(W.shape[0], W.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(W.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            mods.append(lin)
            if k < len(case.weights) - 1:
                mods.append(torch.nn.ReLU())
        model = mods[0] if len(mods) == 1 else torch.nn.Sequential(*mods)
        return model.to(dev)

    def run() -> float:
        model = build()
        seconds, history = _torch_sgd(case, model, batches, loss_fn)
        holder["model"], holder["history"] = model, history
        return seconds

    def finish() -> dict[str, Any]:
        lins = [m for m in holder["model"].modules() if isinstance(m, torch.nn.Linear)]
        layers = [
            (lin.weight.detach().cpu().numpy().T.copy(), lin.bias.detach().cpu().numpy().copy())
            for lin in lins
        ]
        return {"epoch_losses": holder["history"], "weights": layers}

    note = (
        f"nn.Linear / nn.Sequential, {loss_fn.__name__}, optim.SGD, pre-sliced batches, loss.item() "
        f"each step, torch.set_num_threads({case.threads})"
    )
    return Route(run, finish, 0.0, note, str(dev))


def route_sk_sgd(case: Case) -> Route:
    if case.kind == "mlp":
        raise Skip("SGDRegressor/SGDClassifier train linear models only")
    from sklearn.linear_model import SGDClassifier, SGDRegressor

    binary = case.kind == "binary"
    y1 = case.labels if binary else case.y.ravel()
    batches = [(case.X[s:e], y1[s:e]) for s, e in case.bounds]
    # its squared loss is half ours: 2 lr; per-sample steps: / batch
    eta0 = (1.0 if binary else 2.0) * case.lr / case.batch
    W0, b0 = case.weights[0]
    holder: dict[str, Any] = {}

    def run() -> float:
        params = dict(penalty=None, alpha=0.0, learning_rate="constant", eta0=eta0, shuffle=False, tol=None)
        if binary:
            est = SGDClassifier(loss="log_loss", **params)
            est.partial_fit(*batches[0], classes=np.array([0, 1]))
            est.coef_[...] = W0[:, 0]
        else:
            est = SGDRegressor(loss="squared_error", **params)
            est.partial_fit(*batches[0])
            est.coef_[...] = W0[:, 0]
        # one call allocated the coefficients; reset them to the shared initial values
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
        layers = [(np.asarray(est.coef_).reshape(-1, 1), np.asarray(est.intercept_).reshape(1))]
        return {"epoch_losses": None, "weights": layers}

    name = "SGDClassifier(log_loss)" if binary else "SGDRegressor(squared_error)"
    note = (
        f"{name}, one partial_fit per batch = per-sample SGD in float64; eta0 = "
        f"{'lr' if binary else '2*lr'}/batch so one call moves the weights as one mini-batch step "
        "(to first order); partial_fit reports no loss"
    )
    return Route(run, finish, 0.0, note)


def route_sk_mlp(case: Case) -> Route:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    binary = case.kind == "binary"
    base = MLPClassifier if binary else MLPRegressor
    layers = case.weights

    class FixedInit(base):  # type: ignore[misc, valid-type]
        """scikit-learn's MLP whose fit starts from given weights (layer order)."""

        def _init_coef(self, fan_in: int, fan_out: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
            W, b = self._fixed_init.pop(0)
            assert W.shape == (fan_in, fan_out), (W.shape, fan_in, fan_out)
            return W.astype(dtype, copy=True), b.astype(dtype, copy=True)

    scale = 1.0 if binary else 2.0
    y1 = case.labels if binary else case.y.ravel()
    holder: dict[str, Any] = {}

    def run() -> float:
        est = FixedInit(
            hidden_layer_sizes=HIDDEN[case.kind],
            activation="relu",
            solver="sgd",
            alpha=0.0,
            batch_size=case.batch,
            learning_rate="constant",
            learning_rate_init=scale * case.lr,
            momentum=0.0,
            nesterovs_momentum=False,
            max_iter=case.epochs,
            shuffle=False,
            tol=0.0,
            n_iter_no_change=case.epochs + 1,
            early_stopping=False,
        )
        est._fixed_init = list(layers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t = time.perf_counter()
            est.fit(case.X, y1)
            seconds = time.perf_counter() - t
        holder["est"] = est
        return seconds

    def finish() -> dict[str, Any]:
        est = holder["est"]
        assert est.n_iter_ == case.epochs, est.n_iter_
        return {
            "epoch_losses": [scale * v for v in est.loss_curve_],
            "weights": list(zip(est.coefs_, est.intercepts_)),
        }

    note = (
        f"{base.__name__}(hidden_layer_sizes={HIDDEN[case.kind]}, solver='sgd', momentum=0, alpha=0, "
        f"learning_rate_init={'2*' if scale == 2 else ''}lr, tol=0, n_iter_no_change > max_iter), "
        "fit() end to end"
        + ("; its loss is 0.5*MSE: loss_curve_ x 2" if scale == 2 else "; its log loss is ours")
    )
    return Route(run, finish, 0.0, note)


FACTORIES: dict[str, Callable[[Case], Route]] = {
    "full": route_full,
    "partial": route_partial,
    "ort_sklearn": route_ort_sklearn,
    "ort_torch": route_ort_torch,
    "ort_native": route_ort_native,
    "numpy": route_numpy,
    "torch": route_torch,
    "sk_sgd": route_sk_sgd,
    "sk_mlp": route_sk_mlp,
}
#: routes that run on the CPU whatever --device says
CPU_ONLY = ("numpy", "sk_sgd", "sk_mlp")


# ---- one case -----------------------------------------------------------------------------
def run_case(case: Case, routes: Sequence[str], repeats: int) -> dict[str, Any]:
    load_before = common.loadavg()
    t_case = time.perf_counter()
    print(f"[{case.name}] {case.steps} steps ({case.epochs} epochs x {len(case.bounds)} batches)", flush=True)
    # every case starts cold: its setups build their graphs and sessions (clearing between the
    # routes would make the ort-train-sklearn fits after the warm-up rebuild theirs)
    clear_ort_caches()
    built: dict[str, Route] = {}
    first: dict[str, float] = {}
    peaks: dict[str, int | None] = {}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}

    def fail(key: str, exc: Exception, route: Route | None) -> None:
        failed[key] = f"{type(exc).__name__}: {exc}"
        print(f"  {ROUTE_LABELS[key]}: FAILED {failed[key]}", flush=True)
        traceback.print_exc()
        if route is not None and route.cleanup is not None:
            route.cleanup()

    for key in routes:
        sampler = common.RssSampler()
        sampler.start()
        route: Route | None = None
        try:
            route = FACTORIES[key](case)
            first[key] = route.run()
        except Skip as exc:
            skipped[key] = str(exc)
            continue
        except Exception as exc:
            fail(key, exc, route)
            continue
        finally:
            peaks[key] = sampler.stop()
        built[key] = route
    times: dict[str, list[float]] = {key: [] for key in built}
    for _ in range(repeats):
        for key in list(built):
            try:
                times[key].append(built[key].run())
            except Exception as exc:
                fail(key, exc, built.pop(key))
                del times[key]
    results: dict[str, dict[str, Any]] = {}
    for key, route in built.items():
        try:
            out = route.finish()
        except Exception as exc:
            fail(key, exc, None)
            continue
        best = min(times[key]) if times[key] else first[key]
        losses = out.get("epoch_losses")
        setup = out.get("setup_seconds", route.setup_seconds)
        note = route.note + (f"; ort_native says: {out['native_note']}" if out.get("native_note") else "")
        results[key] = {
            "seconds": best,
            "times": times[key],
            "first_run_seconds": first[key],
            "setup_seconds": setup,
            "us_per_step": 1e6 * best / case.steps,
            "epoch_seconds": best / case.epochs,
            "peak_rss_bytes": peaks.get(key),
            "epoch_losses": None if losses is None else [float(v) for v in losses],
            "epoch_loss": None if not losses else float(losses[-1]),
            "final_loss": full_loss(case.kind, out["weights"], case.X, case.y),
            "device": "cpu" if key in CPU_ONLY else route.device,
            "note": note,
        }
    for route in built.values():
        if route.cleanup is not None:
            route.cleanup()
    full = results.get("full")
    for r in results.values():
        if full is None:
            r["rel_diff_final"] = r["rel_diff_epoch"] = None
            r["agrees"] = None
            continue
        r["rel_diff_final"] = abs(r["final_loss"] - full["final_loss"]) / max(abs(full["final_loss"]), 1e-30)
        r["rel_diff_epoch"] = (
            None
            if r["epoch_loss"] is None or full["epoch_loss"] is None
            else abs(r["epoch_loss"] - full["epoch_loss"]) / max(abs(full["epoch_loss"]), 1e-30)
        )
        r["agrees"] = bool(r["rel_diff_final"] <= AGREEMENT_RTOL)
        r["ratio_vs_full"] = r["us_per_step"] / full["us_per_step"]
    for key, r in results.items():
        ratio = "" if r.get("ratio_vs_full") is None else f" x{r['ratio_vs_full']:.2f}"
        flag = "" if r["agrees"] in (True, None) else f"  DIFFERS {r['rel_diff_final']:.1%}"
        print(
            f"  {ROUTE_LABELS[key]:<28} {r['us_per_step']:9.1f} us/step{ratio:<8} final loss "
            f"{r['final_loss']:.6g}{flag}",
            flush=True,
        )
    for key, reason in skipped.items():
        print(f"  {ROUTE_LABELS[key]:<28} skipped: {reason}", flush=True)
    return {
        "name": case.name,
        "kind": case.kind,
        "n_rows": case.n,
        "n_features": case.features,
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


# ---- the whole matrix ---------------------------------------------------------------------
def cuda_unavailable_reason() -> str | None:
    """Why ``--device cuda`` cannot run here (None when it can)."""
    try:
        import ort_train_core  # noqa: F401
        from ort_train_core._runtime import C, parse_device
    except ImportError as exc:
        return f"ort-train-core cannot be imported: {exc}"
    from ort_train_core import CudaUnavailableError

    try:
        parse_device("cuda")  # also checks the driver and the GPU, and preloads CUDA 11.8
    except (ValueError, CudaUnavailableError) as exc:
        return str(exc)
    providers = C.get_available_providers()
    if "CUDAExecutionProvider" not in providers:  # pragma: no cover - parse_device said so
        return f"onnxruntime offers {providers}, no CUDAExecutionProvider"
    return None


def preload() -> None:
    """Imports every route's libraries before the first case, so that no route's setup, first
    run or peak memory includes an import."""
    for name in (
        "torch",
        "sklearn.linear_model",
        "sklearn.neural_network",
        "ort_train_sklearn",
        "ort_train_torch",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    with contextlib.suppress(Skip):
        load_native()  # its unavailable_reason() imports onnxruntime.training


def run_matrix(
    quick: bool = False,
    device: str = "cpu",
    out: str | Path = common.RESULTS_DIR,
    kinds: Sequence[str] = KINDS,
    routes: Sequence[str] = ROUTES,
    epochs: int | None = None,
    repeats: int | None = None,
    grid: Sequence[tuple[int, int, int]] | None = None,
    plots: bool = True,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Runs the matrix, writes ``<host>-<date>-matrix[-cuda][-quick].{json,md}`` and the PNG
    plots into ``out``, returns the report (``report['failed']`` lists routes that raised)."""
    import ort_train_core  # noqa: F401  (imports onnxruntime before torch, see _runtime.py)

    t_start = time.perf_counter()
    threads = torch_threads or common.usable_cpus()
    epochs = epochs or (QUICK_EPOCHS if quick else FULL_EPOCHS)
    target_steps, max_repeats = (
        (QUICK_TARGET_STEPS, QUICK_MAX_REPEATS) if quick else (FULL_TARGET_STEPS, FULL_MAX_REPEATS)
    )
    grid = list(grid or (QUICK_GRID if quick else FULL_GRID))
    preload()
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)
    data: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    max_n = max(n for n, _, _ in grid)
    cases = []
    for kind in kinds:
        family = "binary" if kind == "binary" else "regression"
        for n, features, batch in grid:
            if (family, features) not in data:
                data[family, features] = make_data(kind, max_n, features)
            X_all, y_all = data[family, features]
            X, y = X_all[:n], y_all[:n]
            case = Case(
                kind=kind,
                n=n,
                features=features,
                batch=batch,
                epochs=epochs,
                lr=LEARNING_RATE[kind],
                X=X,
                y=y,
                labels=y[:, 0].astype(np.int64) if kind == "binary" else None,
                weights=initial_weights(kind, features),
                device=device,
                threads=threads,
                bounds=batch_bounds(n, batch),
            )
            runs = repeats or min(max_repeats, max(1, math.ceil(target_steps / case.steps)))
            cases.append(run_case(case, routes, runs))
    elapsed = time.perf_counter() - t_start
    date = common.today()
    report: dict[str, Any] = {
        "date": date,
        "config": {
            "quick": quick,
            "device": device,
            "kinds": list(kinds),
            "hidden": {k: list(HIDDEN[k]) for k in kinds},
            "grid": [list(g) for g in grid],
            "epochs": epochs,
            "repeats": repeats,
            "target_steps": target_steps,
            "max_repeats": max_repeats,
            "learning_rate": {k: LEARNING_RATE[k] for k in kinds},
            "seed": SEED,
            "dtype": "float32",
            "shuffle": False,
            "agreement_rtol": AGREEMENT_RTOL,
            "memory_method": common.RssSampler().method,
            "routes": {k: ROUTE_LABELS[k] for k in routes},
        },
        "machine": common.machine_info(threads, device=device),
        "max_loadavg_1min": max((v for c in cases for v in c["loadavg_1min"] if v is not None), default=None),
        "cases": cases,
        "elapsed_seconds": elapsed,
    }
    report["summary"] = summarise(cases)
    report["failed"] = [
        {"case": c["name"], "route": key, "error": err} for c in cases for key, err in c["failed"].items()
    ]
    outdir = Path(out)
    stem = common.result_stem("matrix" + ("" if device == "cpu" else f"-{device.split(':')[0]}"), quick, date)
    if plots:
        try:
            report["plots"] = write_plots(report, outdir, stem)
        except Exception as exc:  # the tables matter more than the pictures
            traceback.print_exc()
            report["failed"].append({"case": "-", "route": "plots", "error": f"{type(exc).__name__}: {exc}"})
    common.write_json(outdir / f"{stem}.json", report)
    common.write_text(outdir / f"{stem}.md", markdown(report))
    report["files"] = [str(outdir / f"{stem}.json"), str(outdir / f"{stem}.md"), *report.get("plots", [])]
    print(f"matrix: {len(cases)} cases in {elapsed:.1f} s; wrote {outdir / stem}.json, .md", flush=True)
    return report


# ---- summary, Markdown, plots -------------------------------------------------------------
def _geomean(values: Sequence[float]) -> float:
    return float(math.exp(sum(math.log(v) for v in values) / len(values)))


def summarise(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: each route's us/step over the full loop's (geometric mean, min, max over the
    cases) and the cases where its final loss differs by more than the tolerance; the same for
    the (ours, peer) pairs."""
    speed: list[dict[str, Any]] = []
    agreement: list[dict[str, Any]] = []
    kinds = list(dict.fromkeys(c["kind"] for c in cases))
    for kind in kinds:
        mine = [c for c in cases if c["kind"] == kind]
        pairs = [("full", key) for key in ROUTES if key != "full"] + PAIRS
        for ours, peer in pairs:
            ratios = [
                (c["routes"][peer]["us_per_step"] / c["routes"][ours]["us_per_step"], c["name"])
                for c in mine
                if ours in c["routes"] and peer in c["routes"]
            ]
            if not ratios:
                continue
            values = [r for r, _ in ratios]
            speed.append(
                {
                    "kind": kind,
                    "ours": ours,
                    "peer": peer,
                    "cases": len(values),
                    "geomean": _geomean(values),
                    "min": min(ratios),
                    "max": max(ratios),
                    "ours_faster_in": sum(v > 1 for v in values),
                }
            )
        for key in ROUTES:
            rows = [c for c in mine if key in c["routes"] and c["routes"][key].get("agrees") is not None]
            if not rows or key == "full":
                continue
            bad = [c for c in rows if not c["routes"][key]["agrees"]]
            diffs = [c["routes"][key]["rel_diff_final"] for c in rows]
            agreement.append(
                {
                    "kind": kind,
                    "route": key,
                    "cases": len(rows),
                    "max_rel_diff": max(diffs),
                    "differ_in": [c["name"] for c in bad],
                }
            )
    return {"speed": speed, "agreement": agreement}


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1e3 * seconds:.1f}"


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:.1f}"


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    cases = report["cases"]
    lines = [
        f"# Benchmark matrix ({report['date']}, device {cfg['device']}{', quick' if cfg['quick'] else ''})",
        "",
        common.machine_line(report["machine"]),
        "",
        "1-minute load average before/after each case (this run's own threads included): "
        + ", ".join(
            f"{c['name']} {c['loadavg_1min'][0]:.1f}/{c['loadavg_1min'][1]:.1f}"
            for c in cases
            if None not in c["loadavg_1min"]
        )
        + ".",
        "",
        f"Every route of a case: the same data (float32), the same initial weights (Glorot uniform), "
        f"{cfg['epochs']} epochs, plain SGD with a constant learning rate "
        f"({', '.join(f'{k} {v:g}' for k, v in cfg['learning_rate'].items())}), no penalty, "
        "consecutive batches (no shuffling). us/step = best timed run / steps (runs: after one "
        "untimed warm-up, round-robin over the routes, "
        + (
            f"{cfg['repeats']} per route"
            if cfg["repeats"]
            else f"as many as give {cfg['target_steps']} timed steps, 1 to {cfg['max_repeats']}: "
            "column 'runs'"
        )
        + "); in brackets: that over the full loop's us/step (> 1: slower than the full loop). "
        "Epoch = best run / epochs. Setup = graph building and sessions, timed apart where the "
        "route has one (ort-train's process-wide graph and session caches are emptied at the start of "
        "each case); first run = the warm-up. "
        f"Peak memory: {cfg['memory_method']}.",
        "",
        "Losses on one scale (MSE for regression, mean cross-entropy on the logit for binary): "
        "epoch loss = the last epoch's mean of per-batch losses before each update; final loss = "
        "the final weights re-evaluated on all rows in float64 by one numpy function. Flag "
        f"DIFFERS: the final loss is more than {cfg['agreement_rtol']:.0%} away from the full loop's.",
        "",
        f"Run time of the matrix: {report['elapsed_seconds']:.1f} s.",
    ]
    usable = report["machine"]["usable_cpus"] or 1
    load = report.get("max_loadavg_1min")
    if load is not None and load > usable:
        lines += [
            "",
            f"**Busy machine**: the 1-minute load average reached {load:.1f} on {usable} usable CPUs "
            "(this run counts for about 1): other processes competed for the cores. Multi-threaded "
            "routes suffer most (torch with several threads can wait milliseconds per step at its "
            "thread barriers while another process holds a core): prefer timings from an idle "
            "machine, or run with --torch-threads 1 to see torch without that effect.",
        ]
    for kind in cfg["kinds"]:
        mine = [c for c in cases if c["kind"] == kind]
        present = [k for k in ROUTES if any(k in c["routes"] for c in mine)]
        lines += ["", f"## {KIND_TITLES[kind]}", "", "us/step (ratio vs the full loop):", ""]
        rows = []
        for c in mine:
            row = [
                str(c["n_rows"]),
                str(c["n_features"]),
                str(c["batch"]),
                str(c["steps"]),
                str(c["timed_runs"]),
            ]
            for key in present:
                r = c["routes"].get(key)
                if r is None:
                    row.append("skip" if key in c["skipped"] else ("FAIL" if key in c["failed"] else "—"))
                else:
                    ratio = "" if r.get("ratio_vs_full") is None else f" ({r['ratio_vs_full']:.2f})"
                    row.append(f"{r['us_per_step']:.1f}{ratio}")
            rows.append(row)
        lines += common.markdown_table(
            ["N", "F", "batch", "steps", "runs", *(ROUTE_LABELS[k] for k in present)], rows
        )
        lines += ["", "Details:", ""]
        rows = []
        for c in mine:
            for key, r in c["routes"].items():
                diff = "—" if r["rel_diff_final"] is None else f"{r['rel_diff_final']:.1e}"
                flag = "" if r["agrees"] in (True, None) else " DIFFERS"
                rows.append(
                    [
                        str(c["n_rows"]),
                        str(c["n_features"]),
                        str(c["batch"]),
                        ROUTE_LABELS[key] + ("" if r["device"] == "cpu" else f" ({r['device']})"),
                        f"{r['us_per_step']:.1f}",
                        _ms(r["epoch_seconds"]),
                        _ms(r["setup_seconds"]),
                        _ms(r["first_run_seconds"]),
                        _mib(r["peak_rss_bytes"]),
                        common.fmt(r["epoch_loss"]),
                        common.fmt(r["final_loss"]),
                        diff + flag,
                    ]
                )
        lines += common.markdown_table(
            [
                "N",
                "F",
                "batch",
                "route",
                "us/step",
                "epoch ms",
                "setup ms",
                "first run ms",
                "peak MiB",
                "epoch loss",
                "final loss",
                "final vs full",
            ],
            rows,
            ["r", "r", "r", "l", "r", "r", "r", "r", "r", "r", "r", "r"],
        )
        reasons: dict[str, set[str]] = {}
        for c in mine:
            for key, why in c["skipped"].items():
                reasons.setdefault(key, set()).add(why)
            for key, why in c["failed"].items():
                reasons.setdefault(key, set()).add(f"FAILED in {c['name']}: {why}")
        if reasons:
            lines += ["", "Skipped or failed:", ""]
            lines += [f"- {ROUTE_LABELS[k]}: {'; '.join(sorted(v))}" for k, v in reasons.items()]
    summary = report["summary"]
    lines += [
        "",
        "## Speed: peer us/step over ort-train's (> 1: ort-train faster)",
        "",
        "Geometric mean, min and max over the cases of a kind; 'faster in' counts the cases where "
        "the ort-train route is faster.",
        "",
    ]
    rows = [
        [
            KIND_TITLES[s["kind"]].split(" (")[0],
            ROUTE_LABELS[s["ours"]],
            ROUTE_LABELS[s["peer"]],
            f"{s['geomean']:.2f}",
            f"{s['min'][0]:.2f} ({s['min'][1]})",
            f"{s['max'][0]:.2f} ({s['max'][1]})",
            f"{s['ours_faster_in']}/{s['cases']}",
        ]
        for s in summary["speed"]
    ]
    lines += common.markdown_table(
        ["kind", "ours", "peer", "peer / ours", "min", "max", "faster in"],
        rows,
        ["l", "l", "l", "r", "r", "r", "r"],
    )
    lines += ["", f"## Agreement of the final loss with the full loop's (<= {cfg['agreement_rtol']:.0%})", ""]
    rows = [
        [
            KIND_TITLES[a["kind"]].split(" (")[0],
            ROUTE_LABELS[a["route"]],
            str(a["cases"]),
            f"{a['max_rel_diff']:.1e}",
            "all agree" if not a["differ_in"] else "DIFFERS in " + ", ".join(a["differ_in"]),
        ]
        for a in summary["agreement"]
    ]
    lines += common.markdown_table(
        ["kind", "route", "cases", "max rel. diff", "result"], rows, ["l", "l", "r", "r", "l"]
    )
    lines += ["", "## Routes", ""]
    seen: set[tuple[str, str]] = set()
    for c in cases:
        for key, r in c["routes"].items():
            if (key, r["note"]) not in seen:
                seen.add((key, r["note"]))
                lines.append(f"- {ROUTE_LABELS[key]} ({c['kind']}): {r['note']}")
    if report.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


def write_plots(report: dict[str, Any], outdir: Path, stem: str) -> list[str]:
    """Three PNG files (matplotlib, Agg backend); none when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"matrix: no plots ({exc}); pip install matplotlib", flush=True)
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    cases = report["cases"]
    kinds = report["config"]["kinds"]
    device = report["config"]["device"]
    files = []
    markers = dict(zip(ROUTES, "os^vDP*xX"))
    colors = {key: f"C{i}" for i, key in enumerate(ROUTES)}  # the same color per route in every plot

    def figure(title: str) -> tuple[Any, Any]:
        fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.4), squeeze=False)
        fig.suptitle(f"{title} ({report['date']}, {device}{', quick' if report['config']['quick'] else ''})")
        return fig, axes[0]

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = outdir / f"{stem}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(str(path))

    # epoch time against N
    features, batch = PLOT_EPOCH_VS_N
    fig, axes = figure(f"Time per epoch against N (F={features}, batch={batch})")
    for ax, kind in zip(axes, kinds):
        sel = sorted(
            (c for c in cases if c["kind"] == kind and c["n_features"] == features and c["batch"] == batch),
            key=lambda c: c["n_rows"],
        )
        for key in ROUTES:
            pts = [(c["n_rows"], 1e3 * c["routes"][key]["epoch_seconds"]) for c in sel if key in c["routes"]]
            if pts:
                ax.plot(*zip(*pts), marker=markers[key], color=colors[key], label=ROUTE_LABELS[key])
        ax.set(xscale="log", yscale="log", xlabel="N (rows)", ylabel="ms per epoch", title=KIND_TITLES[kind])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, "epoch-vs-n")

    # step time against batch
    n_wanted, features = PLOT_STEP_VS_BATCH
    fig, axes = figure(f"Time per step against batch size (F={features})")
    for ax, kind in zip(axes, kinds):
        ns = {c["n_rows"] for c in cases if c["kind"] == kind and c["n_features"] == features}
        n = n_wanted if n_wanted in ns else max(ns, default=n_wanted)
        sel = sorted(
            (c for c in cases if c["kind"] == kind and c["n_features"] == features and c["n_rows"] == n),
            key=lambda c: c["batch"],
        )
        for key in ROUTES:
            pts = [(c["batch"], c["routes"][key]["us_per_step"]) for c in sel if key in c["routes"]]
            if pts:
                ax.plot(*zip(*pts), marker=markers[key], color=colors[key], label=ROUTE_LABELS[key])
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="batch size",
            ylabel="us per step",
            title=f"{KIND_TITLES[kind]}, N={n}",
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, "step-vs-batch")

    # loss curves, and how far each route's final loss is from the full loop's
    n, features, batch = PLOT_LOSS_CASE
    fig, grid_axes = plt.subplots(
        2, len(kinds), figsize=(5.2 * len(kinds), 8.0), squeeze=False, height_ratios=[3, 2]
    )
    quick = ", quick" if report["config"]["quick"] else ""
    fig.suptitle(
        f"Epoch loss of every route (N={n}, F={features}, batch={batch}) and final loss against the "
        f"full loop's ({report['date']}, {device}{quick})"
    )
    for k, kind in enumerate(kinds):
        ax, bar_ax = grid_axes[0][k], grid_axes[1][k]
        wanted = (n, features, batch)
        sel = [c for c in cases if c["kind"] == kind and (c["n_rows"], c["n_features"], c["batch"]) == wanted]
        sel = sel or [c for c in cases if c["kind"] == kind][:1]
        if not sel:
            continue
        c = sel[0]
        names, diffs, bar_colors = [], [], []
        for key in ROUTES:
            r = c["routes"].get(key)
            if r is None:
                continue
            curve = r["epoch_losses"]
            (line,) = ax.plot(
                range(1, len(curve or []) + 1),
                curve or [],
                marker=markers[key],
                color=colors[key],
                label=ROUTE_LABELS[key],
                alpha=0.8,
            )
            if r["rel_diff_final"] is not None and key != "full":
                names.append(ROUTE_LABELS[key])
                diffs.append(max(r["rel_diff_final"], 1e-10))
                bar_colors.append(line.get_color())
        ax.set(
            title=f"{KIND_TITLES[kind]}\n{c['name']}",
            xlabel="epoch",
            ylabel="epoch loss (MSE / cross-entropy)",
        )
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
        bar_ax.barh(names, diffs, color=bar_colors)
        bar_ax.axvline(AGREEMENT_RTOL, color="red", lw=1, ls="--", label=f"{AGREEMENT_RTOL:.0%}")
        bar_ax.set(xscale="log", xlabel="|final loss - full loop's| / full loop's (floor 1e-10)")
        bar_ax.tick_params(axis="y", labelsize=7)
        bar_ax.grid(True, axis="x", alpha=0.3)
        bar_ax.legend(fontsize=7)
    grid_axes[0][0].legend(fontsize=7)
    save(fig, "loss-curves")
    return files


# ---- main ---------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="a subset of the grid, 2 epochs, fewer timed runs"
    )
    parser.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"), help="device of the ort and torch routes"
    )
    parser.add_argument("--out", default=str(common.RESULTS_DIR), help="folder for JSON, Markdown and PNG")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads (default: the usable CPUs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_arguments(parser)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    parser.add_argument("--repeats", type=int, default=None, help="override the timed repeats")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        reason = cuda_unavailable_reason()
        if reason is not None:
            print(f"--device cuda cannot run here: {reason}", file=sys.stderr)
            return 2
    t = time.perf_counter()
    report = run_matrix(
        args.quick,
        args.device,
        args.out,
        args.kinds,
        args.routes,
        args.epochs,
        args.repeats,
        torch_threads=args.torch_threads,
    )
    print(markdown(report))
    print(f"elapsed {time.perf_counter() - t:.1f} s")
    for f in report["failed"]:
        print(f"FAILED: {f['case']} {ROUTE_LABELS[f['route']]}: {f['error']}", file=sys.stderr)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
