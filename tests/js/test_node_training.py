"""The JavaScript loop ``js/train_step.mjs`` (issue 29): an exported training step trained in
Node.js by onnxruntime-node and by onnxruntime-web's WebAssembly backend, to the weights of
``OrtGradientOptimizer`` with the same settings.

The reference is the trainer on the ``onnx`` backend (``shuffle=False``, one epoch of 20
consecutive batches of the digits, a constant learning rate); the loop gets the same 20 batches
as raw little-endian files and knows nothing of ort_train but the naming contract. The MLP is
written with onnx.helper, so the file runs without torch (Python 3.13 too).

Skipped where ``node`` is not on PATH or ``js/node_modules`` lacks the packages: ``nox -s
tests_js`` installs them (``npm ci`` with ``ONNXRUNTIME_NODE_INSTALL=skip``).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    LearningRateAdam,
    LearningRateSGD,
    add_loss_output,
    export_training_step,
    model_from_step_state,
    step_initial_state_model,
    step_without_defaults,
)
from step_support import BATCH, STEPS, WEIGHTS, digits, initializers, mlp, reference_fit

JS = pathlib.Path(__file__).resolve().parents[2] / "js"
NODE = shutil.which("node")
PACKAGES = ("onnxruntime-node", "onnxruntime-web")
BACKENDS = ("node", "web")
TOL = 1e-5


def _why_skip() -> str | None:
    if NODE is None:
        return "node is not on PATH (Node.js >= 18 runs js/train_step.mjs)"
    missing = [p for p in PACKAGES if not (JS / "node_modules" / p / "package.json").exists()]
    if missing:
        return (
            f"js/node_modules lacks {', '.join(missing)}: run `ONNXRUNTIME_NODE_INSTALL=skip npm ci` "
            "in js/ (or `nox -s tests_js`)"
        )
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))

OPTIMIZERS = {
    "sgd": lambda: LearningRateSGD(eta0=0.1, learning_rate="constant"),
    "adam": lambda: LearningRateAdam(eta0=0.01),
}


def write_data(folder: pathlib.Path, **inputs: np.ndarray) -> pathlib.Path:
    """The loop's data format: per input a raw little-endian file holding every batch, and
    manifest.json with its type and dims (batches first)."""
    folder.mkdir()
    manifest = {}
    for name, values in inputs.items():
        batches = values.reshape(STEPS, BATCH, *values.shape[1:])
        batches.astype(batches.dtype.newbyteorder("<")).tofile(folder / f"{name}.bin")
        manifest[name] = {"file": f"{name}.bin", "type": str(values.dtype), "dims": list(batches.shape)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run_loop(
    tmp: pathlib.Path, step: onnx.ModelProto, initial: onnx.ModelProto, data: pathlib.Path, backend: str
) -> subprocess.CompletedProcess[str]:
    onnx.save(step, tmp / "step.onnx")
    onnx.save(initial, tmp / "initial.onnx")
    command = [
        str(NODE),
        str(JS / "train_step.mjs"),
        str(tmp / "step.onnx"),
        str(tmp / "initial.onnx"),
        str(data),
        str(STEPS),
        backend,
        str(tmp / "out.json"),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def read_output(path: pathlib.Path) -> tuple[list[float], dict[str, np.ndarray]]:
    out = json.loads(path.read_text())
    state = {
        name: np.array(v["data"], dtype=v["type"]).reshape(v["dims"]) for name, v in out["state"].items()
    }
    return out["losses"], state


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_trains_to_the_python_trainers_weights(tmp_path: pathlib.Path, backend: str, optimizer: str) -> None:
    X, y = digits()
    loss_model = add_loss_output(mlp(hidden=32), "cross_entropy")
    trainer = reference_fit(loss_model, OPTIMIZERS[optimizer](), X, y)
    step = export_training_step(loss_model, optimizer=OPTIMIZERS[optimizer](), batch_size=BATCH)
    data = write_data(tmp_path / "data", X=X, label=y)
    done = run_loop(tmp_path, step_without_defaults(step), step_initial_state_model(step), data, backend)
    assert done.returncode == 0, done.stderr
    losses, state = read_output(tmp_path / "out.json")
    want, have = (
        initializers(trainer.get_trained_onnx()),
        initializers(model_from_step_state(loss_model, state)),
    )
    for name in WEIGHTS:
        assert_allclose(have[name], want[name], atol=TOL, rtol=TOL, err_msg=name)
    assert not np.allclose(have["W1"], initializers(mlp(hidden=32))["W1"], atol=1e-3)  # it did train
    assert len(losses) == STEPS
    assert np.mean(losses) == pytest.approx(trainer.train_losses_[0], rel=TOL)
    if optimizer == "adam":
        assert state["step"].dtype == np.int64
        assert int(state["step"]) == STEPS


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_with_defaults_is_refused(tmp_path: pathlib.Path, backend: str) -> None:
    """The step as exported (defaults as initializers): onnxruntime-node would silently train
    nothing, so the loop refuses it and names the fix."""
    X, y = digits()
    step = export_training_step(mlp(), loss="cross_entropy", optimizer=OPTIMIZERS["sgd"](), batch_size=BATCH)
    data = write_data(tmp_path / "data", X=X, label=y)
    done = run_loop(tmp_path, step, step_initial_state_model(step), data, backend)
    assert done.returncode != 0
    assert "the inputs W1, B1, W2, B2, learning_rate have a default value (an initializer)" in done.stderr
    assert "ort_train_core.step_without_defaults(step)" in done.stderr
    assert not (tmp_path / "out.json").exists()


# feeds w to Add(x, w) where w is an input with an initializer (the default)
_PROBE = """
const ort = await import(process.argv[1] === 'web' ? 'onnxruntime-web' : 'onnxruntime-node');
const session = await ort.InferenceSession.create(process.argv[2]);
const x = new ort.Tensor('float32', Float32Array.from([1, 2]), [2]);
const w = new ort.Tensor('float32', Float32Array.from([100, 200]), [2]);
try {
  const { y } = await session.run({ x, w });
  console.log(JSON.stringify({ y: Array.from(y.data) }));
} catch (e) {
  console.log(JSON.stringify({ error: e.message }));
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_why_the_loop_refuses_defaults(tmp_path: pathlib.Path, backend: str) -> None:
    """onnxruntime-node 1.30 ignores a value fed for an input that has an initializer;
    onnxruntime-web refuses it: the reason for step_without_defaults."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "probe",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "w")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([10, 20], dtype=np.float32), "w")],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
        tmp_path / "p.onnx",
    )
    command = [str(NODE), "--input-type=module", "-e", _PROBE, backend, str(tmp_path / "p.onnx")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=JS)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if backend == "node":
        assert result == {"y": [11.0, 22.0]}  # x + the initializer, not x + the fed [100, 200]
    else:
        assert "invalid input 'w'" in result["error"]
