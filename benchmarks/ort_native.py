"""onnxruntime's own on-device training API as a benchmark route: "the onnxruntime-native peer".

``onnxruntime.training.artifacts.generate_artifacts`` builds the training, eval and optimizer
graphs and the checkpoint from the benchmarks' prediction graph (:func:`routes.mlp_onnx`, input
``X`` [N, F] with a dynamic N, output ``pred`` [N, 1]); ``onnxruntime.training.api``
(``CheckpointState`` + ``Module`` + ``Optimizer``) trains it. A step is
``loss = module(X_batch, y_batch)`` (numpy in, the 0-d loss read back each step),
``optimizer.step()``, ``module.lazy_reset_grad()``.

- Loss: regression is a custom onnxblock loss, MSE as ``ReduceMean(Mul(d, d))``, ``d = pred -
  target`` (the built-in ``MSELoss`` uses ``Pow`` and is slow); binary is a custom block too,
  the saturation-safe binary cross-entropy on logits ``mean(z (0.5 - t) + 0.5 |z| -
  log(sigmoid(|z|)))`` (= ``softplus(z) - z t``, gradient ``sigmoid(z) - t`` everywhere, 0
  included). The built-in ``BCEWithLogitsLoss`` (``bce='builtin'``) computes
  ``-(t log(sigmoid(z)) + (1 - t) log(1 - sigmoid(z)))``: once a float32 logit passes about +17
  (or -88), ``log`` gives -inf, ``0 * -inf`` NaN, and the weights turn NaN (the binary MLP(50, 10)
  case does in its second epoch). ``Softplus`` would be shorter but has no registered gradient.
- Optimizer: ``OptimType.SGD`` (``SGDOptimizerV2``: ``W <- W - lr * grad``), the learning rate
  set with ``Optimizer.set_learning_rate``. ``--check`` verifies the trajectory against plain
  minibatch SGD in numpy (``routes.route_numpy``).
- One set of artifacts serves every batch size: the training graph keeps the dynamic batch
  dimension (its gradient computes the 1/N of the mean at run time).

Traps handled here: ``generate_artifacts`` does not create its output folder; the optimizer
model comes out with IR 14 (onnx >= 1.18 writes its default IR in a fresh ``ModelProto``), which
onnxruntime 1.19 refuses, so the artifacts are rewritten to IR 8 (its ``update_completed``
output then declares shape [1] where inference says scalar: a harmless "lenient merge" warning,
silenced with ``log_severity_level = 3``); gradients accumulate across ``Module`` calls until
``lazy_reset_grad()``; the gradient builder inside ``generate_artifacts`` logs at INFO level
unless its session options say otherwise; ``import onnxruntime.training`` imports torch (about
2 s, once, outside every timed region) and probes ORTModule, whose import fails with torch 2.13:
``ort_train_core``, imported first, masks that probe.

Timing (``time.perf_counter``): ``setup_seconds`` covers building the graph,
``generate_artifacts``, the IR rewrite, loading the checkpoint, ``Module`` and ``Optimizer``;
``train_seconds`` the epoch loop only, over batches pre-sliced before it. Session options are
the defaults (intra-op threads 0: one per physical core) but for the log level.

Run: ``python benchmarks/ort_native.py --check``; its timings are the ``ort_native`` route of
``python benchmarks/matrix.py --routes ort_native``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routes import Case, initial_weights, make_data, mlp_onnx, route_numpy

IR_VERSION = 8
#: onnxruntime 1.19 loads models up to this IR version
MAX_LOADABLE_IR = 10
TARGET_NAME = "target"
CHECK_RTOL = 1e-4


def _import_training() -> tuple[Any, Any, Any, Any, Any]:
    """``artifacts, onnxblock, CheckpointState, Module, Optimizer`` of onnxruntime-training."""
    with contextlib.suppress(Exception):
        import ort_train_core  # noqa: F401  (masks onnxruntime's ORTModule probe)
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
            return f"this onnxruntime build lacks the training API ({', '.join(missing)})"
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return text[0] if text else type(exc).__name__
    return None


def _stable_bce_block(onnxblock: Any) -> Any:
    """BCE on logits, mean over rows, saturation-safe and with the right gradient at ``z == 0``:
    ``z (0.5 - t) + 0.5 |z| - log(sigmoid(|z|))``, whose gradient is ``sigmoid(z) - t`` (``|z|``'s
    gradient is 0 at 0). The shorter ``relu(z) - z t - log(sigmoid(|z|))`` gets ``-t`` at 0, and
    a ReLU MLP hits ``z == 0`` exactly (rows whose last hidden layer is all zero)."""
    blocks = onnxblock.blocks

    class StableBCEWithLogitsLoss(onnxblock.Block):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self._half, self._sub_target, self._mul_linear = blocks.Constant(0.5), blocks.Sub(), blocks.Mul()
            self._abs, self._mul_abs, self._sigmoid, self._log = (
                blocks.Abs(),
                blocks.Mul(),
                blocks.Sigmoid(),
                blocks.Log(),
            )
            self._add, self._sub_log, self._mean = (
                blocks.Add(),
                blocks.Sub(),
                blocks.ReduceMean(keepdims=False),
            )

        def build(self, loss_input_name: str, target_name: str = TARGET_NAME) -> str:
            z = loss_input_name
            target = blocks.InputLike(z)(target_name)
            half = self._half()
            linear = self._mul_linear(z, self._sub_target(half, target))
            abs_z = self._abs(z)
            value = self._sub_log(
                self._add(linear, self._mul_abs(abs_z, half)), self._log(self._sigmoid(abs_z))
            )
            result: str = self._mean(value)
            return result

    return StableBCEWithLogitsLoss()


def _mul_mse_block(onnxblock: Any) -> Any:
    """The Mul-based MSE loss block: ``ReduceMean(Mul(d, d))``, ``d = pred - target``."""
    blocks = onnxblock.blocks

    class MulMSELoss(onnxblock.Block):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self._sub, self._mul, self._mean = blocks.Sub(), blocks.Mul(), blocks.ReduceMean(keepdims=False)

        def build(self, loss_input_name: str, target_name: str = TARGET_NAME) -> str:
            diff = self._sub(loss_input_name, blocks.InputLike(loss_input_name)(target_name))
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
        if model.ir_version > MAX_LOADABLE_IR:
            changes.append(f"{path.name}: IR {model.ir_version}->{IR_VERSION}")
            model.ir_version = IR_VERSION
            onnx.save(model, str(path))
    return changes


def _artifacts(
    binary: bool, layers: Sequence[tuple[np.ndarray, np.ndarray]], directory: Path, bce: str
) -> tuple[str, list[str]]:
    """Writes the training artifacts of the network into ``directory``; returns the loss's name
    and what was rewritten."""
    artifacts, onnxblock, *_ = _import_training()
    directory.mkdir(parents=True, exist_ok=True)
    model = mlp_onnx(layers, names=("W", "b"), output="pred", graph_name="prediction")
    if not binary:
        loss: Any = _mul_mse_block(onnxblock)
        loss_text = "Mul-based MSE block (ReduceMean(Mul(d, d)))"
    elif bce == "stable":
        loss = _stable_bce_block(onnxblock)
        loss_text = "saturation-safe BCE block (mean(z*(0.5-t) + 0.5*|z| - log(sigmoid(|z|))))"
    else:
        loss, loss_text = artifacts.LossType.BCEWithLogitsLoss, "built-in BCEWithLogitsLoss"
    names = [i.name for i in model.graph.initializer]
    with _quiet_gradient_builder():
        artifacts.generate_artifacts(
            model,
            requires_grad=names,
            loss=loss,
            optimizer=artifacts.OptimType.SGD,
            artifact_directory=directory,
        )
    return loss_text, _fix_artifacts(directory)


def train(
    binary: bool,
    layers: Sequence[tuple[np.ndarray, np.ndarray]],
    X: np.ndarray,
    y: np.ndarray,
    *,
    batch: int,
    epochs: int,
    lr: float,
    workdir: str | os.PathLike[str],
    bce: str = "stable",
) -> dict[str, Any]:
    """Trains with onnxruntime's on-device training API (see the module docstring).

    Parameters
    ----------
    binary : bool
        False: MSE (mean over rows, y float32 [N, 1]); True: binary cross-entropy on logits
        (mean, y float32 [N, 1] of 0/1).
    layers : sequence of (W, b)
        Initial weights in layer order (W [in, out], b [out]), ReLU between layers, to 1 output.
    X, y : ndarray
        The data; batches in row order, the last one possibly shorter.
    batch, epochs, lr : int, int, float
        Batch size, epochs and the constant learning rate of plain SGD.
    workdir : path
        Folder of the artifacts (created).
    bce : {'stable', 'builtin'}
        Binary loss: the saturation-safe custom block or ``LossType.BCEWithLogitsLoss``.

    Returns
    -------
    dict
        ``setup_seconds``, ``train_seconds``, ``steps``, ``epoch_losses`` (per epoch, per-batch
        losses weighted by batch rows), ``weights`` (final layers, float32) and ``note``.
    """
    if bce not in ("stable", "builtin"):
        raise ValueError(f"bce must be 'stable' or 'builtin', not {bce!r}")
    _, _, checkpoint_state, module_cls, optimizer_cls = _import_training()
    from onnxruntime import SessionOptions

    X = np.ascontiguousarray(X, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.float32).reshape(-1, 1)
    directory = Path(workdir)
    start = time.perf_counter()
    loss_text, fixes = _artifacts(binary, layers, directory, bce)
    state = checkpoint_state.load_checkpoint(directory / "checkpoint")
    options = SessionOptions()
    options.log_severity_level = 3  # the optimizer graph's harmless load-time warning (see above)
    # the eval model is not needed; the Optimizer reuses the Module's session options
    module = module_cls(directory / "training_model.onnx", state, session_options=options)
    optimizer = optimizer_cls(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(lr)
    module.train()
    setup_seconds = time.perf_counter() - start
    if module.input_names() != ["X", TARGET_NAME]:
        raise RuntimeError(f"unexpected training inputs {module.input_names()}")

    batches = [(X[i : i + batch], y[i : i + batch]) for i in range(0, len(X), batch)]
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

    params = state.parameters
    final = [
        (np.array(params[f"W{k}"].data, np.float32), np.array(params[f"b{k}"].data, np.float32))
        for k in range(len(layers))
    ]
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
        "epoch_losses": [float(v) for v in (losses @ rows) / len(X)],
        "weights": final,
        "note": note,
    }


def _reference(
    binary: bool, layers: Any, X: np.ndarray, y: np.ndarray, batch: int, lr: float
) -> dict[str, Any]:
    """2 epochs of the benchmarks' hand-written numpy minibatch SGD (``routes.route_numpy``)."""
    case = Case("check", "check", X, y, list(layers), batch, 2, lr, binary=binary)
    route = route_numpy(case)
    route.run()
    return route.finish()


def _relative_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want|."""
    diff = np.abs(np.asarray(got, dtype=np.float64) - want)
    return float(np.max(diff)) / max(float(np.max(np.abs(want))), 1e-12)


def _weights_error(got: Sequence[tuple[np.ndarray, ...]], want: Sequence[tuple[np.ndarray, ...]]) -> float:
    """The largest :func:`_relative_error` over the arrays of the layers."""
    return max(_relative_error(g, w) for gl, wl in zip(got, want) for g, w in zip(gl, wl))


def run_check(workdir: Path) -> bool:
    """ORT-native final weights and epoch losses against :func:`_reference`: 2 epochs, a short
    last batch."""
    n_rows, n_features, batch, epochs, lr = 53, 5, 8, 2, 0.05
    ok = True
    print(f"self-check: N={n_rows} F={n_features} batch={batch} (last batch {n_rows % batch} rows) ", end="")
    print(
        f"epochs={epochs} lr={lr}; max |ort - numpy| / max |numpy| per weight (numpy: float32), "
        f"tolerance {CHECK_RTOL:g}"
    )
    for binary in (False, True):
        X, y = make_data(n_rows, n_features, binary, seed=1)
        for hidden in ((), (6,), (6, 4)):
            layers = initial_weights(n_features, hidden, seed=2)
            result = train(
                binary, layers, X, y, batch=batch, epochs=epochs, lr=lr, workdir=workdir / str(binary)
            )
            ref = _reference(binary, layers, X, y, batch, lr)
            want = ref["weights"]
            weight_err = _weights_error(result["weights"], want)
            loss_err = _relative_error(result["epoch_losses"], np.array(ref["epoch_losses"]))
            moved = max(
                float(np.max(np.abs(w - w0))) for wl, l0 in zip(want, layers) for w, w0 in zip(wl, l0)
            )
            passed = weight_err <= CHECK_RTOL and loss_err <= CHECK_RTOL and moved > 1e-2
            ok = ok and passed
            kind, losses = "binary" if binary else "regression", [round(v, 6) for v in result["epoch_losses"]]
            print(
                f"  {'PASS' if passed else 'FAIL'} {kind:10s} MLP{hidden!s:8s} steps={result['steps']:3d} "
                f"weights rel err {weight_err:.2e}  epoch-loss rel err {loss_err:.2e}  "
                f"(max |change| from init {moved:.2f})  losses {losses}"
            )
    # saturated logits: the stable block stays exact, the built-in one NaNs
    X, y = make_data(n_rows, n_features, True, seed=1)
    layers = [(20.0 * W, 20.0 * b) for W, b in initial_weights(n_features, (), seed=2)]
    want = _reference(True, layers, X, y, batch, lr)["weights"]
    logit_max = float(np.max(np.abs(X @ layers[0][0] + layers[0][1])))
    for bce in ("stable", "builtin"):
        result = train(True, layers, X, y, batch=batch, epochs=epochs, lr=lr, workdir=workdir / bce, bce=bce)
        weight_err = _weights_error(result["weights"], want)
        passed = weight_err <= CHECK_RTOL
        ok = ok and (passed or bce == "builtin")
        verdict = ("PASS" if passed else "FAIL") if bce == "stable" else "info"
        print(
            f"  {verdict} binary     linear, |logit| up to {logit_max:.0f}, bce={bce:7s} "
            f"weights rel err {weight_err:.2e}  losses {[round(v, 6) for v in result['epoch_losses']]}"
        )
    print("self-check", "PASSED" if ok else "FAILED")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare against numpy SGD (both losses)")
    parser.add_argument("--workdir", help="artifact folder (default: a temporary one)")
    args = parser.parse_args(argv)
    if not args.check:
        parser.error("give --check (the timings are matrix.py --routes ort_native)")
    reason = unavailable_reason()
    if reason is not None:
        print(f"onnxruntime-native route unavailable: {reason}")
        return 2
    with tempfile.TemporaryDirectory(prefix="ort_native_") as tmp:
        return 0 if run_check(Path(args.workdir or tmp) / "check") else 1


if __name__ == "__main__":
    sys.exit(main())
