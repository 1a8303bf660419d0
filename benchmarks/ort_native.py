"""onnxruntime's own on-device training API as a benchmark route: "the onnxruntime-native peer".

What runs: ``onnxruntime.training.artifacts.generate_artifacts`` builds the training, eval and
optimizer graphs and the checkpoint from a MatMul/Add/Relu prediction graph written here with
``onnx.helper`` (opset 17, IR 8, input ``X`` [N, F] with a dynamic N, output ``pred`` [N, 1]);
``onnxruntime.training.api`` (``CheckpointState`` + ``Module`` + ``Optimizer``) trains it. A step
is ``loss = module(X_batch, y_batch)`` (numpy in, the 0-d loss read back each step),
``optimizer.step()``, ``module.lazy_reset_grad()``.

- Loss: ``regression`` is a custom onnxblock loss, MSE written as ``ReduceMean(Mul(d, d))`` with
  ``d = pred - target`` (the built-in ``LossType.MSELoss`` uses ``Pow`` and is slow);
  ``binary`` is a custom onnxblock loss too, the saturation-safe form of binary cross-entropy on
  logits ``mean(z * (0.5 - t) + 0.5 * |z| - log(sigmoid(|z|)))`` (= ``softplus(z) - z * t``,
  gradient ``sigmoid(z) - t`` at every ``z``, 0 included). The built-in ``LossType.BCEWithLogitsLoss``
  (``bce="builtin"``) computes ``-(t * log(sigmoid(z)) + (1 - t) * log(1 - sigmoid(z)))``: once
  a float32 logit passes about +17 (or -88), ``sigmoid`` rounds to 1 (or 0), ``log`` gives -inf,
  ``0 * -inf`` gives NaN and the weights turn NaN. It does on the bench case (binary MLP(50, 10),
  second epoch). ``Softplus`` would be shorter but has no registered gradient.
- Optimizer: ``OptimType.SGD`` (com.microsoft ``SGDOptimizerV2``: ``W <- W - lr * grad``, no
  momentum, no weight decay), learning rate set with ``Optimizer.set_learning_rate`` (the
  artifacts' default is 1e-3). ``python benchmarks/ort_native.py --check`` verifies that the
  trajectory equals plain minibatch SGD on the mean loss against a float64 numpy implementation.
- Batches: row order, no shuffle, the last one possibly shorter. One set of artifacts serves every
  batch size: the training graph keeps the dynamic batch dimension (its gradient graph computes
  the 1/N of the mean at run time), so no second graph is needed for the short last batch.

Traps handled here:

- ``generate_artifacts`` does not create its output folder: ``train`` creates ``workdir``.
- The optimizer model comes out with IR version 14 (onnx >= 1.18 writes its default IR in a fresh
  ``ModelProto``; the training and eval models keep the base model's IR 8) and onnxruntime 1.19
  refuses IR > 10 when ``Optimizer`` loads it: the ``.onnx`` artifacts are rewritten to IR 8.
  The optimizer graph declares its ``update_completed`` output as shape [1] where the op's shape
  inference says scalar: a harmless "MergeShapeInfo ... lenient merge" warning when ``Optimizer``
  loads it (clearing the declared shape is worse: the kernel does write [1], and a warning then
  comes every step). ``Module`` and ``Optimizer`` get ``log_severity_level = 3``.
- Gradients accumulate across ``Module`` calls (``InPlaceAccumulatorV2``) until
  ``lazy_reset_grad()`` is called: without it every step after the first one applies the sum of
  all gradients so far.
- The gradient-graph builder inside ``generate_artifacts`` logs at INFO level to stderr (dozens of
  "GraphTransformer ... modified" lines) with its default ``SessionOptions``: they are built with
  ``log_severity_level = 3`` while the artifacts are generated.
- ``import onnxruntime.training`` (needed by ``generate_artifacts`` and the Python API) imports
  torch: about 2 s, once per process, outside every timed region. ``import onnxruntime`` also
  probes ``onnxruntime.training.ortmodule``, whose import fails with torch 2.13 (``jit_utils``
  ImportError; the probe swallows it, and this route never needs ORTModule). ``ort_train_core``,
  imported first when installed, masks that probe.

Timing (``time.perf_counter``): ``setup_seconds`` covers building the prediction graph,
``generate_artifacts``, the IR rewrite, loading the checkpoint, ``Module`` and ``Optimizer``, and
setting the learning rate; ``train_seconds`` covers the epoch loop only, over batches pre-sliced
(numpy views) before it. onnxruntime session options are the defaults (intra-op threads: 0, one
per physical core, unless ``intra_op_threads`` says otherwise), as for the other onnxruntime
routes, but for the log level.

Run: ``python benchmarks/ort_native.py --check`` (self-check) or ``--bench`` (us/step).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("regression", "binary")
OPSET = 17
IR_VERSION = 8
#: onnxruntime 1.19 loads models up to this IR version
MAX_LOADABLE_IR = 10
INPUT_NAME = "X"
TARGET_NAME = "target"
OUTPUT_NAME = "pred"
CHECK_RTOL = 1e-4


# --------------------------------------------------------------------------------------- imports


def _import_training() -> tuple[Any, Any, Any, Any, Any]:
    """``artifacts, onnxblock, CheckpointState, Module, Optimizer`` of onnxruntime-training."""
    with contextlib.suppress(Exception):
        # masks onnxruntime's ORTModule probe (broken with torch 2.13) on the first onnxruntime import
        import ort_train_core  # noqa: F401
    from onnxruntime.training import artifacts, onnxblock
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    return artifacts, onnxblock, CheckpointState, Module, Optimizer


def unavailable_reason() -> str | None:
    """None when the route can run here, else a one-line reason (e.g. an import failure)."""
    try:
        _import_training()
        from onnxruntime.capi import _pybind_state as capi

        missing = [name for name in ("Module", "Optimizer", "CheckpointState") if not hasattr(capi, name)]
        if missing:
            try:
                from onnxruntime.capi.build_and_package_info import package_name
            except ImportError:
                package_name = "unknown"
            return f"onnxruntime build '{package_name}' lacks the training API ({', '.join(missing)})"
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return text[0] if text else type(exc).__name__
    return None


# ------------------------------------------------------------------------------------ the graphs


def _layer_names(weights: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """``[(W0, b0), (W1, b1), ...]``, checking names and shapes (MatMul layout, last layer -> 1)."""
    count = len(weights) // 2
    pairs = [(f"W{i}", f"b{i}") for i in range(count)]
    expected = {name for pair in pairs for name in pair}
    if count == 0 or set(weights) != expected:
        raise ValueError(f"weights must be W0, b0, ..., W{{L-1}}, b{{L-1}}; got {sorted(weights)}")
    fan_in = np.shape(weights["W0"])[0]
    for w_name, b_name in pairs:
        w_shape, b_shape = np.shape(weights[w_name]), np.shape(weights[b_name])
        if len(w_shape) != 2 or w_shape[0] != fan_in or b_shape != (w_shape[1],):
            raise ValueError(f"{w_name} {w_shape} / {b_name} {b_shape} do not chain (fan-in {fan_in})")
        fan_in = w_shape[1]
    if fan_in != 1:
        raise ValueError(f"the last layer must have 1 output, not {fan_in}")
    return pairs


def prediction_graph(weights: dict[str, np.ndarray]) -> Any:
    """MatMul/Add(/Relu between layers) graph, ``X`` [N, F] -> ``pred`` [N, 1], opset 17, IR 8."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    pairs = _layer_names(weights)
    n_features = int(np.shape(weights["W0"])[0])
    nodes = []
    initializers = []
    current = INPUT_NAME
    for i, (w_name, b_name) in enumerate(pairs):
        last = i == len(pairs) - 1
        initializers.append(numpy_helper.from_array(np.asarray(weights[w_name], dtype=np.float32), w_name))
        initializers.append(numpy_helper.from_array(np.asarray(weights[b_name], dtype=np.float32), b_name))
        nodes.append(helper.make_node("MatMul", [current, w_name], [f"matmul{i}"], name=f"MatMul{i}"))
        added = OUTPUT_NAME if last else f"add{i}"
        nodes.append(helper.make_node("Add", [f"matmul{i}", b_name], [added], name=f"Add{i}"))
        current = added
        if not last:
            current = f"relu{i}"
            nodes.append(helper.make_node("Relu", [added], [current], name=f"Relu{i}"))
    graph = helper.make_graph(
        nodes,
        "prediction",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["N", 1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _stable_bce_block(onnxblock: Any) -> Any:
    """BCE on logits, mean over rows, saturation-safe and with the right gradient at ``z == 0``.

    ``softplus(z) - z * t = z * (0.5 - t) + 0.5 * |z| - log(sigmoid(|z|))``. Its gradient is
    ``sigmoid(z) - t`` everywhere, ``z == 0`` included (``|z|``'s gradient is ``sign(z)``, 0 at 0):
    the shorter ``relu(z) - z * t - log(sigmoid(|z|))`` gets ``-t`` there instead of ``0.5 - t``,
    and a ReLU MLP hits ``z == 0`` exactly (rows whose last hidden layer is all zero give
    ``z = b_last``, 0 at the start).
    """
    blocks = onnxblock.blocks

    class StableBCEWithLogitsLoss(onnxblock.Block):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self._half = blocks.Constant(0.5)
            self._sub_target = blocks.Sub()
            self._mul_linear = blocks.Mul()
            self._abs = blocks.Abs()
            self._mul_abs = blocks.Mul()
            self._sigmoid = blocks.Sigmoid()
            self._log = blocks.Log()
            self._add = blocks.Add()
            self._sub_log = blocks.Sub()
            self._mean = blocks.ReduceMean(keepdims=False)

        def build(self, loss_input_name: str, target_name: str = TARGET_NAME) -> str:
            z = loss_input_name
            target = blocks.InputLike(z)(target_name)
            half = self._half()
            linear = self._mul_linear(z, self._sub_target(half, target))
            abs_z = self._abs(z)
            softplus_minus_zt = self._sub_log(
                self._add(linear, self._mul_abs(abs_z, half)), self._log(self._sigmoid(abs_z))
            )
            result: str = self._mean(softplus_minus_zt)
            return result

    return StableBCEWithLogitsLoss()


def _mul_mse_block(onnxblock: Any) -> Any:
    """The Mul-based MSE loss block: ``ReduceMean(Mul(d, d))``, ``d = pred - target`` (mean over rows)."""
    blocks = onnxblock.blocks

    class MulMSELoss(onnxblock.Block):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self._sub = blocks.Sub()
            self._mul = blocks.Mul()
            self._mean = blocks.ReduceMean(keepdims=False)

        def build(self, loss_input_name: str, target_name: str = TARGET_NAME) -> str:
            target = blocks.InputLike(loss_input_name)(target_name)
            diff = self._sub(loss_input_name, target)
            result: str = self._mean(self._mul(diff, diff))
            return result

    return MulMSELoss()


@contextlib.contextmanager
def _quiet_gradient_builder() -> Iterator[None]:
    """Builds the gradient graph with ``log_severity_level = 3`` (its default logs at INFO)."""
    try:
        from onnxruntime.training.onnxblock import _training_graph_utils as graph_utils

        original = graph_utils.SessionOptions
    except (ImportError, AttributeError):
        yield
        return

    def quiet_options() -> Any:
        options = original()
        options.log_severity_level = 3
        return options

    graph_utils.SessionOptions = quiet_options
    try:
        yield
    finally:
        graph_utils.SessionOptions = original


def _fix_artifacts(directory: Path) -> list[str]:
    """Rewrites the generated ``.onnx`` files onnxruntime 1.19 would refuse; says what it changed."""
    import onnx

    changes = []
    for path in sorted(directory.glob("*.onnx")):
        model = onnx.load(str(path))
        changed = []
        if model.ir_version > MAX_LOADABLE_IR:
            changed.append(f"IR {model.ir_version}->{IR_VERSION}")
            model.ir_version = IR_VERSION
        if changed:
            onnx.save(model, str(path))
            changes.append(f"{path.name}: {', '.join(changed)}")
    return changes


# -------------------------------------------------------------------------------------- training


def train(
    kind: str,
    weights: dict[str, np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    *,
    batch: int,
    epochs: int,
    lr: float,
    workdir: str | os.PathLike[str],
    bce: str = "stable",
    intra_op_threads: int = 0,
) -> dict[str, Any]:
    """Trains with onnxruntime's on-device training API (see the module docstring).

    kind: 'regression' (MSE, mean over rows; y float32 [N, 1]) or 'binary' (binary cross-entropy
    on logits, mean; y float32 [N, 1] of 0/1). weights: W0 [F, H0], b0 [H0], W1 [H0, H1], b1, ...,
    last layer to 1 output, ReLU between layers. Plain SGD, constant lr, batches in row order.
    bce ('binary' only): 'stable' (custom saturation-safe block, the default) or 'builtin'
    (``LossType.BCEWithLogitsLoss``, NaN once a logit saturates). intra_op_threads: onnxruntime's
    ``SessionOptions.intra_op_num_threads`` (0, the default: one per physical core). Returns setup_seconds,
    train_seconds, steps, epoch_losses (per epoch, per-batch losses weighted by batch rows),
    weights (final, float32) and note.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if bce not in ("stable", "builtin"):
        raise ValueError(f"bce must be 'stable' or 'builtin', not {bce!r}")
    if batch < 1 or epochs < 0:
        raise ValueError(f"batch must be >= 1 and epochs >= 0 (got {batch}, {epochs})")
    artifacts, onnxblock, checkpoint_state, module_cls, optimizer_cls = _import_training()
    from onnxruntime import SessionOptions as session_options_cls

    X = np.ascontiguousarray(X, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.float32).reshape(-1, 1)
    if X.ndim != 2 or X.shape[0] != y.shape[0] or X.shape[0] == 0:
        raise ValueError(f"X must be [N, F] and y [N, 1] with N > 0 (got {X.shape}, {y.shape})")
    if X.shape[1] != np.shape(weights.get("W0"))[0]:
        raise ValueError(f"X has {X.shape[1]} features but W0 is {np.shape(weights.get('W0'))}")
    names = [name for pair in _layer_names(weights) for name in pair]
    directory = Path(workdir)

    start = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    model = prediction_graph(weights)
    if kind == "regression":
        loss: Any = _mul_mse_block(onnxblock)
        loss_text = "Mul-based MSE block (ReduceMean(Mul(d, d)))"
    elif bce == "stable":
        loss = _stable_bce_block(onnxblock)
        loss_text = "saturation-safe BCE block (mean(z*(0.5-t) + 0.5*|z| - log(sigmoid(|z|))))"
    else:
        loss = artifacts.LossType.BCEWithLogitsLoss
        loss_text = "built-in BCEWithLogitsLoss"
    with _quiet_gradient_builder():
        artifacts.generate_artifacts(
            model,
            requires_grad=names,
            loss=loss,
            optimizer=artifacts.OptimType.SGD,
            artifact_directory=directory,
        )
    fixes = _fix_artifacts(directory)
    state = checkpoint_state.load_checkpoint(directory / "checkpoint")
    options = session_options_cls()
    # silences the one harmless load-time warning on the optimizer graph's update flag (see above)
    options.log_severity_level = 3
    options.intra_op_num_threads = intra_op_threads
    # the eval model is not needed; the Optimizer reuses the Module's session options
    module = module_cls(directory / "training_model.onnx", state, session_options=options)
    optimizer = optimizer_cls(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(lr)
    module.train()
    setup_seconds = time.perf_counter() - start
    if module.input_names() != [INPUT_NAME, TARGET_NAME]:
        raise RuntimeError(f"unexpected training inputs {module.input_names()}")

    n_rows = X.shape[0]
    batches = [(X[i : i + batch], y[i : i + batch]) for i in range(0, n_rows, batch)]
    rows = np.array([len(xb) for xb, _ in batches], dtype=np.float64)
    losses = np.empty((epochs, len(batches)), dtype=np.float64)

    start = time.perf_counter()
    for epoch in range(epochs):
        epoch_losses = losses[epoch]
        for i, (xb, yb) in enumerate(batches):
            epoch_losses[i] = module(xb, yb)  # 0-d numpy array, read back every step
            optimizer.step()
            module.lazy_reset_grad()
    train_seconds = time.perf_counter() - start

    final = {name: np.array(state.parameters[name].data, dtype=np.float32, copy=True) for name in names}
    note = (
        f"onnxruntime on-device training API: generate_artifacts({loss_text}, OptimType.SGD), "
        "Module(numpy feeds, dynamic batch: one artifact set for all batch sizes) + Optimizer.step "
        "(SGDOptimizerV2) + lazy_reset_grad per step; lr via set_learning_rate"
        + (f"; rewrote {'; '.join(fixes)}" if fixes else "")
    )
    return {
        "setup_seconds": setup_seconds,
        "train_seconds": train_seconds,
        "steps": epochs * len(batches),
        "epoch_losses": [float(v) for v in (losses @ rows) / n_rows],
        "weights": final,
        "note": note,
    }


# ------------------------------------------------------------------------------ numpy reference


def numpy_sgd(
    kind: str,
    weights: dict[str, np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    *,
    batch: int,
    epochs: int,
    lr: float,
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Plain minibatch SGD in float64 on the mean loss, same batches: final weights, epoch losses."""
    pairs = _layer_names(weights)
    params = [(weights[w].astype(np.float64), weights[b].astype(np.float64)) for w, b in pairs]
    X64 = np.asarray(X, dtype=np.float64)
    y64 = np.asarray(y, dtype=np.float64).reshape(-1, 1)
    epoch_losses = []
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(X64), batch):
            xb, yb = X64[start : start + batch], y64[start : start + batch]
            activations = [xb]
            pre = []
            for i, (w, b) in enumerate(params):
                z = activations[-1] @ w + b
                pre.append(z)
                if i < len(params) - 1:
                    activations.append(np.maximum(z, 0.0))
            out = pre[-1]
            if kind == "regression":
                diff = out - yb
                loss = float(np.mean(diff * diff))
                grad = 2.0 * diff / len(xb)
            else:
                loss = float(np.mean(np.maximum(out, 0.0) - out * yb + np.log1p(np.exp(-np.abs(out)))))
                grad = (1.0 / (1.0 + np.exp(-out)) - yb) / len(xb)
            total += loss * len(xb)
            grads = []
            for i in range(len(params) - 1, -1, -1):
                w, _ = params[i]
                grads.append((activations[i].T @ grad, grad.sum(axis=0)))
                if i > 0:
                    grad = (grad @ w.T) * (pre[i - 1] > 0)
            grads.reverse()
            params = [(w - lr * gw, b - lr * gb) for (w, b), (gw, gb) in zip(params, grads)]
        epoch_losses.append(total / len(X64))
    final = {}
    for (w_name, b_name), (w, b) in zip(pairs, params):
        final[w_name], final[b_name] = w, b
    return final, epoch_losses


def init_weights(n_features: int, hidden: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    """Glorot-uniform weights, zero biases, float32, in MatMul layout."""
    rng = np.random.default_rng(seed)
    sizes = [n_features, *hidden, 1]
    weights = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        weights[f"W{i}"] = rng.uniform(-bound, bound, size=(fan_in, fan_out)).astype(np.float32)
        weights[f"b{i}"] = np.zeros(fan_out, dtype=np.float32)
    return weights


def make_data(kind: str, n_rows: int, n_features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal features; a noisy linear target (regression) or its sign as 0/1 (binary)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, n_features)).astype(np.float32)
    coef = rng.standard_normal(n_features)
    signal = X.astype(np.float64) @ coef + 0.5 * rng.standard_normal(n_rows)
    y = signal if kind == "regression" else (signal > 0).astype(np.float64)
    return X, y.reshape(-1, 1).astype(np.float32)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(want))), 1e-12)
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want))) / scale


def _model_name(hidden: tuple[int, ...]) -> str:
    return f"MLP{hidden}".replace(",)", ")") if hidden else "linear"


def run_check(workdir: Path) -> bool:
    """ORT-native final weights and epoch losses against ``numpy_sgd``: 2 epochs, short last batch."""
    n_rows, n_features, batch, epochs, lr = 53, 5, 8, 2, 0.05
    ok = True
    print(f"self-check: N={n_rows} F={n_features} batch={batch} (last batch {n_rows % batch} rows) ", end="")
    print(f"epochs={epochs} lr={lr}; max |ort - numpy| / max |numpy| per weight, tolerance {CHECK_RTOL:g}")
    for kind in KINDS:
        X, y = make_data(kind, n_rows, n_features, seed=1)
        for hidden in ((), (6,), (6, 4)):
            weights = init_weights(n_features, hidden, seed=2)
            result = train(kind, weights, X, y, batch=batch, epochs=epochs, lr=lr, workdir=workdir / kind)
            want, want_losses = numpy_sgd(kind, weights, X, y, batch=batch, epochs=epochs, lr=lr)
            weight_err = max(_relative_error(result["weights"][name], want[name]) for name in want)
            loss_err = _relative_error(np.array(result["epoch_losses"]), np.array(want_losses))
            moved = max(float(np.max(np.abs(want[name] - weights[name]))) for name in want)
            passed = weight_err <= CHECK_RTOL and loss_err <= CHECK_RTOL and moved > 1e-2
            ok = ok and passed
            verdict = "PASS" if passed else "FAIL"
            losses = [round(v, 6) for v in result["epoch_losses"]]
            print(
                f"  {verdict} {kind:10s} {_model_name(hidden):10s} steps={result['steps']:3d} "
                f"weights rel err {weight_err:.2e}  epoch-loss rel err {loss_err:.2e}  "
                f"(max |change| from init {moved:.2f})  losses {losses}"
            )
    # saturated logits (|z| up to about 60): the stable block stays exact, the built-in one NaNs
    X, y = make_data("binary", n_rows, n_features, seed=1)
    weights = {name: 20.0 * value for name, value in init_weights(n_features, (), seed=2).items()}
    want, _ = numpy_sgd("binary", weights, X, y, batch=batch, epochs=epochs, lr=lr)
    logit_max = float(np.max(np.abs(X @ weights["W0"])))
    for bce in ("stable", "builtin"):
        result = train(
            "binary", weights, X, y, batch=batch, epochs=epochs, lr=lr, workdir=workdir / bce, bce=bce
        )
        weight_err = max(_relative_error(result["weights"][name], want[name]) for name in want)
        passed = weight_err <= CHECK_RTOL
        if bce == "stable":
            ok = ok and passed
        verdict = ("PASS" if passed else "FAIL") if bce == "stable" else "info"
        print(
            f"  {verdict} binary     linear, |logit| up to {logit_max:.0f}, bce={bce:7s} "
            f"weights rel err {weight_err:.2e}  losses {[round(v, 6) for v in result['epoch_losses']]}"
        )
    print("self-check", "PASSED" if ok else "FAILED")
    return ok


def run_bench(workdir: Path, repeats: int, kinds: tuple[str, ...], bce: str, threads: int) -> None:
    n_rows, n_features, batch, epochs, lr = 100_000, 10, 100, 2, 0.01
    print(
        f"bench: N={n_rows} F={n_features} batch={batch} epochs={epochs} lr={lr}, bce={bce}, "
        f"intra-op threads={threads or 'default'}, "
        f"best of {repeats} (train time; setup: best as well)"
    )
    header = ("kind", "model", "steps", "setup s", "train s", "us/step")
    print(
        f"  {header[0]:10s} {header[1]:12s} " + " ".join(f"{h:>8s}" for h in header[2:]) + "  last epoch loss"
    )
    for kind in kinds:
        X, y = make_data(kind, n_rows, n_features, seed=0)
        for hidden in ((), (50, 10)):
            weights = init_weights(n_features, hidden, seed=0)
            results = [
                train(
                    kind,
                    weights,
                    X,
                    y,
                    batch=batch,
                    epochs=epochs,
                    lr=lr,
                    workdir=workdir / kind,
                    bce=bce,
                    intra_op_threads=threads,
                )
                for _ in range(repeats)
            ]
            best = min(results, key=lambda r: r["train_seconds"])
            setup = min(r["setup_seconds"] for r in results)
            us = 1e6 * best["train_seconds"] / best["steps"]
            print(
                f"  {kind:10s} {_model_name(hidden):12s} {best['steps']:8d} {setup:8.3f} "
                f"{best['train_seconds']:8.3f} {us:8.2f}  {best['epoch_losses'][-1]:.6f}"
            )
        print(f"  note ({kind}): {best['note']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare against numpy SGD (both kinds)")
    parser.add_argument("--bench", action="store_true", help="us/step, 100k x 10, linear and MLP(50, 10)")
    parser.add_argument("--repeats", type=int, default=3, help="bench repeats (best train time)")
    parser.add_argument("--kind", choices=[*KINDS, "both"], default="both", help="bench kinds")
    parser.add_argument("--bce", choices=["stable", "builtin"], default="stable", help="binary loss block")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime's default)")
    parser.add_argument("--workdir", help="artifact folder (default: a temporary one)")
    args = parser.parse_args(argv)
    if not (args.check or args.bench):
        parser.error("give --check and/or --bench")
    reason = unavailable_reason()
    if reason is not None:
        print(f"onnxruntime-native route unavailable: {reason}")
        return 2
    ok = True
    with tempfile.TemporaryDirectory(prefix="ort_native_") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        if args.check:
            ok = run_check(workdir / "check")
        if args.bench:
            kinds = KINDS if args.kind == "both" else (args.kind,)
            run_bench(workdir / "bench", max(1, args.repeats), kinds, args.bce, args.threads)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
