"""``ort-train`` on bad input files and outputs: every problem is exit 2 with one line naming the
file and the fix (never a traceback, never a large allocation, never a silent wrong result);
``eval`` validates its data as ``fit`` does; ``--out`` is checked before training; written files
follow the umask; stale temporaries of a killed run are cleaned; Ctrl-C during the imports of
the console script is exit 130 and one line."""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from core_models import build_linear
from onnx import TensorProto, helper, numpy_helper

from ort_train_core.checkpoint import CHECKPOINT_FILE
from ort_train_core.cli import load_table, main

#: the numpy reference of the model below: y = X @ COEF + INTERCEPT
COEF = np.array([[1.5], [-2.0], [0.5]], dtype=np.float32)
INTERCEPT = np.array([0.25], dtype=np.float32)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "lin.onnx"
    onnx.save(build_linear(3, coef=COEF, intercept=INTERCEPT), path)
    return path


def _xy(n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 3))
    return X, X @ COEF[:, 0].astype(np.float64) + 0.25


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_error(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)


# ---- item 10: broken .npz data files ------------------------------------------------------------
def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _huge_header() -> bytes:
    """A valid .npy header declaring 10**12 float64 values (8 TB), followed by 16 bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    return buf.getvalue() + bytes(16)


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_broken_npz_data_exits_2_naming_the_file_without_allocating(model, tmp_path, capsys):
    X, y = _xy()
    good = tmp_path / "good.npz"
    np.savez(good, X=X, y=y)
    cases = {
        "truncated": tmp_path / "truncated.npz",
        "no npy header": _zip(tmp_path / "raw.npz", {"X.npy": _npy_bytes(X), "y.npy": b"hello world"}),
        "no .npy suffix": _zip(tmp_path / "plain.npz", {"X.npy": _npy_bytes(X), "y": b"hello world"}),
        "huge header": _zip(tmp_path / "huge.npz", {"X.npy": _npy_bytes(X), "y.npy": _huge_header()}),
        "object array": _zip(
            tmp_path / "obj.npz", {"X.npy": _npy_bytes(X), "y.npy": _npy_bytes(np.array([None, 1]))}
        ),
    }
    cases["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    for what, path in cases.items():
        for command in ("fit", "eval"):
            argv = [command, model, "--data", path, "--target", "y"]
            if command == "fit":
                argv += ["--quiet", "--out", tmp_path / "o.onnx"]
            code, _, err = _run(capsys, *argv)
            _assert_one_line_error(code, err, str(path))
        # the reader refuses before allocating what a header claims (the model's loading is
        # not measured: it reads the model file)
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match=re.escape(str(path))):
                load_table(str(path), "y")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 50 * 2**20, (what, peak)
    assert not (tmp_path / "o.onnx").exists()


# ---- item 12: CSV header and encoding -----------------------------------------------------------
def test_csv_with_a_duplicate_column_is_refused(model, tmp_path, capsys):
    X, y = _xy()
    table = np.column_stack([y, X[:, :2], y])  # the target again as the last "feature"
    path = tmp_path / "dup.csv"
    np.savetxt(path, table, delimiter=",", header="y,f0,f1,y", comments="")
    for command in ("fit", "eval"):
        argv = [command, model, "--data", path, "--target", "y"]
        if command == "fit":
            argv += ["--quiet", "--out", tmp_path / "o.onnx"]
        code, _, err = _run(capsys, *argv)
        _assert_one_line_error(code, err, str(path), "'y'", "duplicate")
    assert not (tmp_path / "o.onnx").exists()


def test_csv_that_is_not_utf8_is_named(model, tmp_path, capsys):
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"y,f0,f1,f2\n1,2,3,4\n" + "5,6,7,8 \u00e9\n".encode("latin-1"))
    code, _, err = _run(capsys, "eval", model, "--data", path, "--target", "y")
    _assert_one_line_error(code, err, str(path), "UTF-8")


def test_csv_with_a_byte_order_mark_reads_its_first_column(model, tmp_path, capsys):
    """Spreadsheets write a UTF-8 BOM: the first column is still named 'y', and eval's mse is
    numpy's on the same rows."""
    X, y = _xy()
    path = tmp_path / "bom.csv"
    text = "y,f0,f1,f2\n" + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in np.c_[y, X])
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    code, out, err = _run(capsys, "eval", model, "--data", path, "--target", "y")
    assert code == 0, err
    values = dict(line.split(": ") for line in out.strip().splitlines())
    pred = X.astype(np.float32).astype(np.float64) @ COEF.astype(np.float64)[:, 0] + 0.25
    np.testing.assert_allclose(float(values["mse"]), np.mean((pred - y) ** 2), atol=1e-10)


# ---- item 13: eval validates like fit -----------------------------------------------------------
def test_eval_refuses_what_fit_refuses_with_the_same_message(model, tmp_path, capsys):
    X, y = _xy()
    X_nan = X.copy()
    X_nan[3, 1] = np.nan
    y_inf = y.copy()
    y_inf[5] = np.inf
    cases = {
        "NaN": (X_nan, y),
        "inf": (X, y_inf),
        "complex": (X + 1j, y),
        "datetime": (np.datetime64("2020-01-01") + X.astype("timedelta64[D]"), y),
        "timedelta": (X.astype("timedelta64[s]"), y),
    }
    for what, (Xb, yb) in cases.items():
        path = tmp_path / f"{what}.npz"
        np.savez(path, X=Xb, y=yb)
        code, out, err_eval = _run(capsys, "eval", model, "--data", path, "--target", "y")
        _assert_one_line_error(code, err_eval)
        assert "r2" not in out, what
        code, _, err_fit = _run(
            capsys, "fit", model, "--data", path, "--target", "y", "--quiet", "--out", tmp_path / "o.onnx"
        )
        _assert_one_line_error(code, err_fit)
        assert err_eval == err_fit, what


def test_eval_refuses_a_feature_count_the_model_does_not_take(model, tmp_path, capsys):
    X, y = _xy()
    path = tmp_path / "wide.npz"
    np.savez(path, X=np.c_[X, X], y=y)
    code, _, err = _run(capsys, "eval", model, "--data", path, "--target", "y")
    _assert_one_line_error(code, err, "6 features", "expects 3")


# ---- item 14: inputs fit cannot feed -----------------------------------------------------------
def _cast_input_model(elem_type: int, extra_input: bool = False) -> onnx.ModelProto:
    """S (elem_type) -> Cast to float -> MatMul/Add; with ``extra_input`` a second input T
    added to the result. The gradient graph builds: nothing is differentiated through S or T."""
    nodes = [
        helper.make_node("Cast", ["S"], ["X"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["X", "coef"], ["mm"]),
        helper.make_node("Add", ["mm", "intercept"], ["Z" if extra_input else "Y"]),
    ]
    inputs = [helper.make_tensor_value_info("S", elem_type, ["N", 3])]
    if extra_input:
        nodes.append(helper.make_node("Add", ["Z", "T"], ["Y"]))
        inputs.append(helper.make_tensor_value_info("T", TensorProto.FLOAT, ["N", 1]))
    graph = helper.make_graph(
        nodes,
        "inputs",
        inputs,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(COEF, "coef"), numpy_helper.from_array(INTERCEPT, "intercept")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_string_inputs_are_reported_as_not_trainable(tmp_path, capsys):
    """inspect says "gradient graph: no" with the reason and the fix; fit and eval exit 2 with
    the same reason (fit exited 1 with onnxruntime's "Unexpected input data type")."""
    words = ["'S'", "string"]
    path = tmp_path / "inputs.onnx"
    onnx.save(_cast_input_model(TensorProto.STRING), path)
    code, out, err = _run(capsys, "inspect", path)
    assert code == 0, err
    verdict = out.split("gradient graph:")[1]
    assert verdict.startswith(" no"), out
    for word in words:
        assert word in verdict, (word, verdict)
    X, y = _xy()
    np.savez(tmp_path / "d.npz", X=X, y=y)
    for command in ("fit", "eval"):
        argv = [command, path, "--data", tmp_path / "d.npz", "--target", "y"]
        if command == "fit":
            argv += ["--quiet", "--out", tmp_path / "o.onnx"]
        code, _, err = _run(capsys, *argv)
        _assert_one_line_error(code, err, *words)
    assert not (tmp_path / "o.onnx").exists()


def _numpy_prediction(path: Path, S: np.ndarray, T: np.ndarray | None) -> np.ndarray:
    """y = S @ coef + intercept (+ T) with the weights of the model file at ``path``."""
    weights = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    pred = S.astype(np.float64) @ weights["coef"] + weights["intercept"]
    return pred if T is None else pred + T


@pytest.mark.parametrize(
    ("elem_type", "extra_input"),
    [(TensorProto.INT64, False), (TensorProto.BOOL, False), (TensorProto.FLOAT, True)],
    ids=["int64", "bool", "two inputs"],
)
def test_integer_boolean_and_several_inputs_train_from_named_npz_arrays(
    tmp_path, capsys, elem_type, extra_input
):
    """Issue 17, item 1: an .npz with one array per input, named after it, feeds int64 and bool
    inputs as they are and several inputs by name; fit trains (the loss falls), and eval's loss
    is numpy's mean squared error of the trained weights."""
    path = tmp_path / "inputs.onnx"
    onnx.save(_cast_input_model(elem_type, extra_input), path)
    code, out, err = _run(capsys, "inspect", path)
    assert code == 0, err
    assert "gradient graph: yes" in out, out
    rng = np.random.default_rng(1)
    S = rng.integers(0, 2, size=(40, 3)) if elem_type != TensorProto.FLOAT else rng.standard_normal((40, 3))
    S = S.astype(bool) if elem_type == TensorProto.BOOL else S
    T = rng.standard_normal((40, 1)) if extra_input else None
    y = S.astype(np.float64) @ np.array([0.5, -1.0, 2.0]) + 1.0 + (T[:, 0] if T is not None else 0)
    arrays = {"S": S, "y": y, **({"T": T} if T is not None else {})}
    np.savez(tmp_path / "d.npz", **arrays)
    trained = tmp_path / "o.onnx"
    common = ["--data", tmp_path / "d.npz", "--target", "y"]
    code, out, err = _run(
        capsys, "fit", path, *common, "--quiet", "--out", trained, "--epochs", "30", "--lr", "0.05"
    )
    assert code == 0, err
    code, out, err = _run(capsys, "eval", trained, *common)
    assert code == 0, err
    values = dict(line.split(": ") for line in out.strip().splitlines())
    expected = float(((_numpy_prediction(trained, S, T)[:, 0] - y) ** 2).mean())
    assert float(values["loss"]) == pytest.approx(expected, rel=1e-4)
    initial = float(((_numpy_prediction(path, S, T)[:, 0] - y) ** 2).mean())
    assert expected < initial / 4  # it trained


def test_several_inputs_need_named_npz_arrays(tmp_path, capsys):
    path = tmp_path / "two.onnx"
    onnx.save(_cast_input_model(TensorProto.FLOAT, extra_input=True), path)
    X, y = _xy()
    np.savez(tmp_path / "d.npz", S=X, y=y)
    code, _, err = _run(
        capsys,
        "fit",
        path,
        "--data",
        tmp_path / "d.npz",
        "--target",
        "y",
        "--quiet",
        "--out",
        tmp_path / "o.onnx",
    )
    _assert_one_line_error(code, err, "2 inputs ['S', 'T']", "missing ['T']")
    (tmp_path / "d.csv").write_text("a,b,c,y\n1,2,3,4\n")
    code, _, err = _run(capsys, "eval", path, "--data", tmp_path / "d.csv", "--target", "y")
    _assert_one_line_error(code, err, "2 inputs ['S', 'T']", "np.savez(path, S=..., T=..., y=...)")


# ---- item 15: --out, file modes, stale temporaries ----------------------------------------------
def test_unwritable_out_is_refused_before_training(model, tmp_path, capsys):
    X, y = _xy()
    data = tmp_path / "d.npz"
    np.savez(data, X=X, y=y)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "folder").mkdir()
    cases = {
        "a folder": tmp_path / "folder",
        "below a file": tmp_path / "a_file" / "m.onnx",
        "a read-only file system": Path("/proc/ort-train-test.onnx"),
    }
    ckpt = tmp_path / "ckpt"
    checkpoints = {
        "a file": tmp_path / "a_file",
        "below a file": tmp_path / "a_file" / "ckpt",
        "/proc": "/proc/ckpt",
    }
    for what, folder in checkpoints.items():
        code, _, err = _run(
            capsys, "fit", model, "--data", data, "--target", "y", "--quiet", "--checkpoint", folder,
            "--out", tmp_path / "m.onnx",
        )  # fmt: skip
        _assert_one_line_error(code, err, "--checkpoint", str(folder))
        assert not (tmp_path / "m.onnx").exists(), what
    for what, out in cases.items():
        code, _, err = _run(
            capsys, "fit", model, "--data", data, "--target", "y", "--quiet", "--checkpoint", ckpt,
            "--out", out,
        )  # fmt: skip
        _assert_one_line_error(code, err, "--out", str(out))
        assert not ckpt.exists(), what  # refused before the first epoch
    # a folder that does not exist yet is created, as before
    code, _, err = _run(
        capsys, "fit", model, "--data", data, "--target", "y", "--quiet", "--epochs", 1,
        "--out", tmp_path / "new" / "m.onnx",
    )  # fmt: skip
    assert code == 0, err


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_written_files_follow_the_umask(model, tmp_path, capsys, umask):
    X, y = _xy()
    np.savez(tmp_path / "d.npz", X=X, y=y)
    previous = os.umask(umask)
    try:
        code, _, err = _run(
            capsys, "fit", model, "--data", tmp_path / "d.npz", "--target", "y", "--quiet", "--epochs", 1,
            "--checkpoint", tmp_path / "ckpt", "--out", tmp_path / "m.onnx",
        )  # fmt: skip
    finally:
        os.umask(previous)
    assert code == 0, err
    assert _mode(tmp_path / "m.onnx") == 0o666 & ~umask
    assert _mode(tmp_path / "ckpt" / CHECKPOINT_FILE) == 0o666 & ~umask


def test_stale_temporaries_of_a_killed_run_are_cleaned(model, tmp_path, capsys):
    """Temporaries older than this process (a killed writer's) go at the next write; newer
    ones (a writer running beside this one) and other files stay."""
    X, y = _xy()
    np.savez(tmp_path / "d.npz", X=X, y=y)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    old = time.time() - 24 * 3600
    stale = [tmp_path / ".ort-train-0123456789ab.tmp", ckpt / ".checkpoint-0123456789ab.tmp"]
    kept = [
        tmp_path / ".ort-train-running.tmp",
        ckpt / ".checkpoint-running.tmp",
        tmp_path / ".ort-train-x.txt",
    ]
    for path in [*stale, *kept]:
        path.write_bytes(b"partial")
    for path in [*stale, kept[2]]:
        os.utime(path, (old, old))
    code, _, err = _run(
        capsys, "fit", model, "--data", tmp_path / "d.npz", "--target", "y", "--quiet", "--epochs", 1,
        "--checkpoint", ckpt, "--out", tmp_path / "m.onnx",
    )  # fmt: skip
    assert code == 0, err
    assert [p for p in stale if p.exists()] == []
    assert [p for p in kept if not p.exists()] == []


# ---- item 15: Ctrl-C while the console script imports -------------------------------------------
def test_ctrl_c_during_imports_exits_130_with_one_line(tmp_path):
    """A SIGINT while ``import onnx`` runs (a stand-in package that sends it to its own process
    shadows onnx) ends the console script with exit 130 and one line, no traceback."""
    script = Path(sys.executable).parent / "ort-train"
    if not script.exists():
        pytest.skip("the ort-train console script is not installed beside this interpreter")
    fake = tmp_path / "shadow" / "onnx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nraise RuntimeError('SIGINT not delivered')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    proc = subprocess.run(
        [str(script), "inspect", "m.onnx"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        # a suite started in the background inherits SIGINT ignored: the child must receive it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "ort-train: interrupted", proc.stderr


def test_missing_training_runtime_at_start_is_exit_2_with_the_fix(tmp_path):
    """A stand-in onnxruntime without the training classes: the console script says what is
    installed and the pip command that fixes it, without a traceback."""
    script = Path(sys.executable).parent / "ort-train"
    if not script.exists():
        pytest.skip("the ort-train console script is not installed beside this interpreter")
    fake = tmp_path / "shadow" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    proc = subprocess.run(
        [str(script), "inspect", "m.onnx"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ort-train: error: onnxruntime cannot be imported"), proc.stderr
    from ort_train_core._runtime import has_training_wheel

    # the runtime itself: ort-train-core is installed (from a clone: it is not on PyPI)
    fix = "onnxruntime-training-cpu==1.19.2" if has_training_wheel() else '"onnxruntime>=1.20"'
    assert f"pip install {fix}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_onnxruntime_errors_are_one_line(tmp_path, capsys):
    """A graph exported with a fixed batch of 4 rows, fed 20: onnxruntime's message spans
    three lines; the command prints it on one."""
    graph = build_linear(3, coef=COEF, intercept=INTERCEPT).graph
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    graph.output[0].type.tensor_type.shape.dim[0].dim_value = 4
    path = tmp_path / "batch4.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    X, y = _xy()
    np.savez(tmp_path / "d.npz", X=X, y=y)
    code, _, err = _run(capsys, "eval", path, "--data", tmp_path / "d.npz", "--target", "y")
    _assert_one_line_error(code, err, "Expected: 4")
