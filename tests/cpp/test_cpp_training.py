"""The C++ loop ``examples/cpp/train_step.cpp`` (issue 29): an exported training step trained
with the onnxruntime C++ API, to the weights of ``OrtGradientOptimizer`` with the same settings.

The reference is the trainer on the ``onnx`` backend (``shuffle=False``, one epoch of 20
consecutive batches of the digits, a constant learning rate). The loop gets the step as
exported (the state's defaults are initializers, which the C/C++ API lets a run override) and
the batches as raw little-endian files, and knows nothing of ort_train but the naming contract.

Skipped where no C++ compiler, no onnxruntime C++ headers or no ``libonnxruntime.so.1`` is
found. The headers: ``ONNXRUNTIME_INCLUDE_DIR``, else ``/usr/include/onnxruntime`` (Debian 13's
``libonnxruntime-dev``; ``examples/cpp/onnxruntime_headers.sh DIR`` extracts them elsewhere);
the library: ``ONNXRUNTIME_LIB``, else the one in the installed onnxruntime wheel (stock wheels
ship ``onnxruntime/capi/libonnxruntime.so.1.*``; the training build's does not), Debian 13's
``libonnxruntime1.21``, or onnxruntime-node's (``js/node_modules``, which ``npm ci`` in js/ installs).
Any library at least as new as the headers will do: the C API is versioned.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose

from ort_train_core import (
    LearningRateAdam,
    LearningRateSGDNesterov,
    add_loss_output,
    export_training_step,
    model_from_step_state,
    step_initial_state,
)
from step_support import BATCH, STEPS, WEIGHTS, digits, initializers, mlp, reference_fit

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "cpp" / "train_step.cpp"
SYSTEM_LIB = pathlib.Path("/usr/lib/x86_64-linux-gnu/libonnxruntime.so.1")
NODE_LIB = (
    ROOT
    / "js"
    / "node_modules"
    / "onnxruntime-node"
    / "bin"
    / "napi-v6"
    / "linux"
    / "x64"
    / "libonnxruntime.so.1"
)
CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
TOL = 1e-5
OPTIMIZERS = {
    "nesterov": lambda: LearningRateSGDNesterov(eta0=0.05, learning_rate="constant", momentum=0.9),
    "adam": lambda: LearningRateAdam(eta0=0.01),
}


def _include_dir() -> pathlib.Path | None:
    for folder in (os.environ.get("ONNXRUNTIME_INCLUDE_DIR"), "/usr/include/onnxruntime"):
        if folder and (pathlib.Path(folder) / "onnxruntime_cxx_api.h").exists():
            return pathlib.Path(folder)
    return None


def _library() -> pathlib.Path | None:
    if os.environ.get("ONNXRUNTIME_LIB"):
        return pathlib.Path(os.environ["ONNXRUNTIME_LIB"])
    import onnxruntime

    found = sorted((pathlib.Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so.1*"))
    # the training build's wheel has none: Debian 13's libonnxruntime1.21, or onnxruntime-node's
    found += [p for p in (SYSTEM_LIB, NODE_LIB) if p.exists()]
    return found[0] if found else None


def _why_skip() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the build command here is Linux's (g++ and libonnxruntime.so)"
    if CXX is None:
        return "no C++ compiler (g++ or clang++, or $CXX)"
    if _include_dir() is None:
        return (
            "no onnxruntime_cxx_api.h in $ONNXRUNTIME_INCLUDE_DIR or /usr/include/onnxruntime: "
            "run `bash examples/cpp/onnxruntime_headers.sh DIR` and set ONNXRUNTIME_INCLUDE_DIR=DIR"
        )
    if _library() is None:
        return (
            "no libonnxruntime.so.1: not in $ONNXRUNTIME_LIB, the onnxruntime wheel (a stock one), "
            "/usr/lib/x86_64-linux-gnu nor js/node_modules/onnxruntime-node (npm ci in js/)"
        )
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))


@pytest.fixture(scope="module")
def train_step(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The loop, compiled: the library is linked through its soname, libonnxruntime.so.1."""
    build = tmp_path_factory.mktemp("cpp")
    library, include = _library(), _include_dir()
    assert library is not None
    assert include is not None
    (build / "libonnxruntime.so").symlink_to(library)
    (build / "libonnxruntime.so.1").symlink_to(library)
    command = [str(CXX), "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{include}", str(SOURCE)]
    command += ["-o", str(build / "train_step"), f"-L{build}", "-lonnxruntime", f"-Wl,-rpath,{build}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return build / "train_step"


def run_loop(
    folder: pathlib.Path, binary: pathlib.Path, step: onnx.ModelProto, **data: np.ndarray
) -> list[float]:
    """Writes the step and the data files, runs the loop, returns its losses."""
    (folder / "data").mkdir()
    (folder / "out").mkdir()
    onnx.save(step, folder / "step.onnx")
    for name, values in data.items():
        values.astype(values.dtype.newbyteorder("<")).tofile(folder / "data" / f"{name}.bin")
    command = [str(binary), str(folder / "step.onnx"), str(folder / "data"), str(STEPS), str(folder / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return [float(line.split()[-1]) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_trains_to_the_python_trainers_weights(
    tmp_path: pathlib.Path, train_step: pathlib.Path, optimizer: str
) -> None:
    X, y = digits()
    loss_model = add_loss_output(mlp(activation="Tanh"), "cross_entropy")
    trainer = reference_fit(loss_model, OPTIMIZERS[optimizer](), X, y)
    step = export_training_step(loss_model, optimizer=OPTIMIZERS[optimizer](), batch_size=BATCH)

    losses = run_loop(tmp_path, train_step, step, X=X, label=y)

    initial = step_initial_state(step)
    state = {
        name: np.fromfile(tmp_path / "out" / f"{name}.bin", dtype=v.dtype).reshape(v.shape)
        for name, v in initial.items()
        if name != "learning_rate"  # an input the loop never feeds: no _new output
    }
    want = initializers(trainer.get_trained_onnx())
    have = initializers(model_from_step_state(loss_model, state))
    for name in WEIGHTS:
        assert_allclose(have[name], want[name], atol=TOL, rtol=TOL, err_msg=name)
        assert not np.allclose(have[name], initial[name], atol=1e-3), name  # the fed state was used
    assert len(losses) == STEPS
    assert np.mean(losses) == pytest.approx(trainer.train_losses_[0], rel=TOL)
    if optimizer == "adam":
        assert int(state["step"]) == STEPS
