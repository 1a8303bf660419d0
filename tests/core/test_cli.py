"""The ``ort-train`` command: fit writes a model that a plain InferenceSession runs with the
trainer's (and numpy's) predictions; inspect names the blocking operator; exit codes 0/1/2;
``--resume`` after a stop, or after SIGKILL of a running process, ends at the weights of an
uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from core_models import build_linear, linear_sgd_reference
from onnx import numpy_helper

from ort_train_core import (
    LearningRateAdam,
    LearningRateSGD,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.checkpoint import CHECKPOINT_FILE, checkpoint_info
from ort_train_core.cli import main

sklearn_datasets = pytest.importorskip("sklearn.datasets")
skl2onnx = pytest.importorskip("skl2onnx")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """load_diabetes standardised as .csv (and unscaled), the demo's linear model (MatMul/Add,
    zero weights), a default LinearRegression export, and an MLP as scikit-learn starts it."""
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPRegressor

    folder = tmp_path_factory.mktemp("cli")
    X, y = sklearn_datasets.load_diabetes(return_X_y=True)
    Xs, ys = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    names = [f"f{i}" for i in range(X.shape[1])]
    header = ",".join([*names[:4], "target", *names[4:]])  # the target need not be last
    for name, (a, b) in {"data.csv": (Xs, ys), "raw.csv": (X * 100, y)}.items():
        table = np.column_stack([a[:, :4], b, a[:, 4:]])
        np.savetxt(folder / name, table, delimiter=",", header=header, comments="")
    X32 = Xs.astype(np.float32)
    lin = LinearRegression().fit(X32, ys)
    (folder / "default_lr.onnx").write_bytes(skl2onnx.to_onnx(lin, X32[:1]).SerializeToString())
    lin.coef_[:] = 0
    lin.intercept_ = np.zeros(())
    (folder / "lin.onnx").write_bytes(
        skl2onnx.to_onnx(lin, X32[:1], black_op={"LinearRegressor"}).SerializeToString()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPRegressor(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(X32, ys)
    (folder / "mlp.onnx").write_bytes(skl2onnx.to_onnx(mlp, X32[:1]).SerializeToString())
    return {"dir": folder, "X": X32, "y": ys.astype(np.float32)}


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _predict(path: Path, X: np.ndarray) -> np.ndarray:
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {sess.get_inputs()[0].name: X})[0])


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert sorted(wa) == sorted(wb)
    for name in wa:
        np.testing.assert_allclose(wa[name], wb[name], rtol=0, atol=1e-6, err_msg=name)


def test_fit_linear_model_matches_numpy_sgd_and_the_trainer(files, tmp_path, capsys):
    d = files["dir"]
    out = tmp_path / "trained.onnx"
    code, stdout, err = _run(
        capsys, "fit", d / "lin.onnx", "--data", d / "data.csv", "--target", "target", "--epochs", 4,
        "--batch-size", 16, "--lr", 0.005, "--no-shuffle", "--quiet", "--out", out,
    )  # fmt: skip
    assert code == 0, err
    assert "epochs: 4" in stdout
    assert f"wrote: {out}" in stdout
    pred = _predict(out, files["X"])
    zeros = {"coef": np.zeros((10, 1)), "intercept": np.zeros(1)}
    ref, history = linear_sgd_reference(zeros, files["X"], files["y"], eta=0.005, batch_size=16, epochs=4)
    np.testing.assert_allclose(pred[:, 0], files["X"] @ ref["coef"][:, 0] + ref["intercept"], atol=1e-4)
    values = dict(line.split(": ", 1) for line in stdout.strip().splitlines())
    np.testing.assert_allclose(float(values["final training loss"]), history[-1], rtol=1e-4)
    trainer = OrtGradientOptimizer(
        add_loss_output(onnx.load(str(d / "lin.onnx"))),
        max_iter=4,
        batch_size=16,
        learning_rate=LearningRateSGD(eta0=0.005, learning_rate="constant"),
        shuffle=False,
    ).fit(files["X"], files["y"])
    np.testing.assert_allclose(pred, _predict_model(trainer.get_trained_onnx(), files["X"]), atol=1e-6)


def _predict_model(model: onnx.ModelProto, X: np.ndarray) -> np.ndarray:
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {sess.get_inputs()[0].name: X})[0])


def test_fit_mlp_with_adam_validation_and_eval(files, tmp_path, capsys):
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    d = files["dir"]
    out = tmp_path / "mlp_trained.onnx"
    code, stdout, err = _run(
        capsys, "fit", d / "mlp.onnx", "--data", d / "data.csv", "--target", "target", "--epochs", 3,
        "--optimizer", "adam", "--lr", 0.01, "--batch-size", 32, "--validation-fraction", 0.25,
        "--seed", 3, "--out", out,
    )  # fmt: skip
    assert code == 0, err
    assert "epoch 3/3: train_loss=" in err  # the progress: stderr is no terminal here, one line an epoch
    X, y = files["X"], files["y"]
    held = np.zeros(len(X), dtype=bool)
    held[np.random.default_rng(3).permutation(len(X))[: round(0.25 * len(X))]] = True
    trainer = OrtGradientOptimizer(
        add_loss_output(onnx.load(str(d / "mlp.onnx"))),
        max_iter=3,
        batch_size=32,
        learning_rate=LearningRateAdam(eta0=0.01),
        random_state=3,
    ).fit(X[~held], y[~held], X_val=X[held], y_val=y[held])
    pred = _predict(out, X)
    np.testing.assert_allclose(pred, _predict_model(trainer.get_trained_onnx(), X), atol=1e-6)
    assert f"final validation loss: {trainer.validation_losses_[-1]:.6g}" in stdout

    code, stdout, err = _run(capsys, "eval", out, "--data", d / "data.csv", "--target", "target")
    assert code == 0, err
    values = dict(line.split(": ") for line in stdout.strip().splitlines())
    assert int(values["rows"]) == len(X)
    p = pred[:, 0].astype(np.float64)
    np.testing.assert_allclose(float(values["mse"]), mean_squared_error(y, p), rtol=1e-5)
    np.testing.assert_allclose(float(values["loss"]), mean_squared_error(y, p), rtol=1e-5)
    np.testing.assert_allclose(float(values["mae"]), mean_absolute_error(y, p), rtol=1e-5)
    np.testing.assert_allclose(float(values["r2"]), r2_score(y, p), rtol=1e-5)


def test_npz_with_named_arrays_or_X_trains_as_the_csv(files, tmp_path, capsys):
    d, X, y = files["dir"], files["X"], files["y"]
    np.savez(tmp_path / "cols.npz", **{f"f{i}": X[:, i] for i in range(10)}, target=y)
    np.savez(tmp_path / "x.npz", X=X, target=y)
    common = ["--target", "target", "--epochs", 2, "--batch-size", 16, "--quiet"]
    for name in ("data.csv", "cols.npz", "x.npz"):
        data = d / name if name.endswith(".csv") else tmp_path / name
        code, _, err = _run(
            capsys, "fit", d / "lin.onnx", "--data", data, *common, "--out", tmp_path / f"{name}.onnx"
        )
        assert code == 0, err
    _assert_same_weights(tmp_path / "data.csv.onnx", tmp_path / "cols.npz.onnx")
    _assert_same_weights(tmp_path / "data.csv.onnx", tmp_path / "x.npz.onnx")


def test_inspect_names_the_blocking_operator(files, capsys):
    code, stdout, err = _run(capsys, "inspect", files["dir"] / "default_lr.onnx")
    assert code == 0, err
    assert "X: float32 [?, 10]" in stdout
    assert "gradient graph: no" in stdout
    assert "LinearRegressor" in stdout.split("gradient graph:")[1]
    code, stdout, err = _run(capsys, "inspect", files["dir"] / "lin.onnx")
    assert code == 0, err
    assert "coef: float32 (10, 1)" in stdout
    assert "intercept: float32 (1,)" in stdout
    assert "gradient graph: yes" in stdout


def _fit_argv(files: dict[str, Any], out: Path) -> list[Any]:
    """``fit`` of the zero-weight linear model on the standardised .csv, written to ``out``."""
    d = files["dir"]
    return ["fit", d / "lin.onnx", "--data", d / "data.csv", "--target", "target", "--out", out]


def test_bad_input_exits_2_without_traceback(files, tmp_path, capsys):
    d = files["dir"]
    base = _fit_argv(files, tmp_path / "o.onnx")
    cases = {
        "missing model": ["fit", tmp_path / "nope.onnx", *base[2:]],
        "missing data": [*base[:3], tmp_path / "nope.csv", *base[4:]],
        "unknown target": [*base[:5], "label", *base[6:]],
        "lr not a number": [*base, "--lr", "abc"],
        "negative lr": [*base, "--lr", "-1"],
        "zero lr": [*base, "--lr", "0"],
        "unknown loss": [*base, "--loss", "hinge"],
        "resume without checkpoint": [*base, "--resume"],
        "checkpoint-every without checkpoint": [*base, "--checkpoint-every", "2"],
        "momentum without nesterov": [*base, "--momentum", "0.5"],
        "tol without early stopping": [*base, "--tol", "0.01"],
        "patience without early stopping": [*base, "--optimizer", "adam", "--patience", "3"],
        "bad data suffix": [*base[:3], d / "lin.onnx", *base[4:]],
        "missing eval data": ["eval", d / "lin.onnx", "--data", tmp_path / "x.csv", "--target", "t"],
    }
    for what, argv in cases.items():
        code, _, err = _run(capsys, *argv)
        assert code == 2, what
        assert "Traceback" not in err, what
        assert err.strip(), what
    assert not (tmp_path / "o.onnx").exists()
    _, _, err = _run(capsys, *[*base[:5], "label", *base[6:]])
    assert "no column 'label'" in err
    _, _, err = _run(capsys, *base, "--momentum", "0.5")
    assert "--momentum acts only with --optimizer nesterov" in err


def test_cuda_that_cannot_run_exits_2_with_the_fix(files, tmp_path, capsys, monkeypatch):
    """The CPU build (here), or a CUDA build without a GPU (faked): a setup problem, exit 2."""
    from ort_train_core import CudaUnavailableError, _cuda, _runtime

    argv = _fit_argv(files, tmp_path / "o.onnx")
    code, _, err = _run(capsys, *argv, "--device", "cuda")
    assert code == 2
    assert "pip install onnxruntime-training==1.19.2 nvidia-cuda-runtime-cu11==11.8.89 " in err
    monkeypatch.setattr(_runtime.ort_capi, "get_available_providers", lambda: ["CUDAExecutionProvider"])

    def no_gpu(index: int) -> None:
        raise CudaUnavailableError(f"device 'cuda:{index}': the NVIDIA driver sees no GPU")

    monkeypatch.setattr(_cuda, "ensure_cuda", no_gpu)
    code, _, err = _run(capsys, *argv, "--device", "cuda:1")
    assert code == 2
    assert "ort-train: error: device 'cuda:1': the NVIDIA driver sees no GPU" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_diverging_run_exits_1(files, tmp_path, capsys):
    d = files["dir"]
    code, _, err = _run(
        capsys, "fit", d / "lin.onnx", "--data", d / "raw.csv", "--target", "target", "--lr", 10,
        "--quiet", "--out", tmp_path / "o.onnx",
    )  # fmt: skip
    assert code == 1
    assert "training failed" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_help_and_entry_point(capsys):
    code, out, _ = _run(capsys, "--help")
    assert code == 0
    assert "examples:" in out
    assert "exit codes" in out
    code, out, _ = _run(capsys, "fit", "--help")
    assert code == 0
    assert "--resume" in out
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("ort-train") == "_ort_train_cli:main"  # the launcher beside the package


def test_resume_ends_at_the_uninterrupted_weights(files, tmp_path, capsys):
    d = files["dir"]
    common = [d / "mlp.onnx", "--data", d / "data.csv", "--target", "target", "--optimizer", "nesterov"]
    common += ["--lr", 0.01, "--batch-size", 20, "--seed", 5, "--quiet"]
    code, _, err = _run(capsys, "fit", *common, "--epochs", 5, "--out", tmp_path / "straight.onnx")
    assert code == 0, err
    ckpt = tmp_path / "ckpt"
    code, _, err = _run(
        capsys, "fit", *common, "--epochs", 2, "--checkpoint", ckpt, "--out", tmp_path / "a.onnx"
    )
    assert code == 0, err
    assert checkpoint_info(ckpt / CHECKPOINT_FILE)["n_iter_"] == 2
    code, stdout, err = _run(
        capsys, "fit", *common, "--epochs", 5, "--checkpoint", ckpt, "--resume", "--out", tmp_path / "b.onnx"
    )
    assert code == 0, err
    assert "epochs: 5" in stdout
    _assert_same_weights(tmp_path / "straight.onnx", tmp_path / "b.onnx")
    # another --lr cannot continue that optimizer state: named in the CLI's words
    again = [0.5 if v == 0.01 else v for v in common]
    code, _, err = _run(
        capsys, "fit", *again, "--epochs", 6, "--checkpoint", ckpt, "--resume", "--out", tmp_path / "c.onnx"
    )
    assert code == 2
    assert "optimizer state of --optimizer, --lr and --momentum other than this run's" in err
    assert "warm_start" not in err


def test_eval_classifier_logits(tmp_path, capsys):
    from sklearn.metrics import accuracy_score, log_loss

    rng = np.random.default_rng(0)
    model = build_linear(4, 3, seed=1)  # three logits
    onnx.save(model, tmp_path / "clf.onnx")
    X = rng.standard_normal((50, 4)).astype(np.float32)
    y = rng.integers(0, 3, 50)
    np.savez(tmp_path / "clf.npz", X=X, label=y)
    code, stdout, err = _run(
        capsys, "eval", tmp_path / "clf.onnx", "--data", tmp_path / "clf.npz", "--target", "label",
        "--loss", "cross_entropy",
    )  # fmt: skip
    assert code == 0, err
    values = dict(line.split(": ") for line in stdout.strip().splitlines())
    z = _predict(tmp_path / "clf.onnx", X).astype(np.float64)
    probs = np.exp(z - z.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    np.testing.assert_allclose(float(values["accuracy"]), accuracy_score(y, probs.argmax(1)), rtol=1e-6)
    np.testing.assert_allclose(float(values["log_loss"]), log_loss(y, probs, labels=[0, 1, 2]), rtol=1e-5)
    np.testing.assert_allclose(float(values["loss"]), log_loss(y, probs, labels=[0, 1, 2]), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killed_run_resumes_to_the_uninterrupted_weights(files, tmp_path, capsys, sig):
    """A process killed with SIGKILL (no handler runs) leaves the checkpoint of a complete
    epoch, as does Ctrl-C (exit 130, the partial epoch not saved); ``--resume`` from it ends
    where an uninterrupted run ends."""
    d = files["dir"]
    common = [d / "lin.onnx", "--data", d / "data.csv", "--target", "target", "--optimizer", "adam"]
    common += ["--lr", 0.001, "--batch-size", 1, "--epochs", 60, "--quiet"]
    ckpt = tmp_path / "ckpt"
    path = ckpt / CHECKPOINT_FILE
    argv = [sys.executable, "-m", "ort_train_core", "fit", *map(str, common)]
    proc = subprocess.Popen(
        [*argv, "--checkpoint", str(ckpt), "--out", str(tmp_path / "killed.onnx")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        epochs = 0
        while epochs < 2 and proc.poll() is None and time.monotonic() < deadline:
            if path.exists():
                epochs = checkpoint_info(path)["n_iter_"]  # atomic writes: never a partial file
            time.sleep(0.005)
        assert proc.poll() is None, f"the run ended before it could be stopped: {proc.stderr.read()!r}"
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 130, err
        assert "interrupted" in err
        assert "Traceback" not in err
    stopped_at = checkpoint_info(path)["n_iter_"]
    assert 2 <= stopped_at < 60
    assert not (tmp_path / "killed.onnx").exists()
    code, stdout, err = _run(
        capsys, "fit", *common, "--checkpoint", ckpt, "--resume", "--out", tmp_path / "resumed.onnx"
    )
    assert code == 0, err
    assert "epochs: 60" in stdout
    code, _, err = _run(capsys, "fit", *common, "--out", tmp_path / "straight.onnx")
    assert code == 0, err
    _assert_same_weights(tmp_path / "straight.onnx", tmp_path / "resumed.onnx")


def test_eval_metrics_of_extreme_logits_are_finite_without_warnings() -> None:
    """Binary logits of +-1000: the sigmoid overflowed (RuntimeWarning, an error under the suite's
    filterwarnings) before it was written with tanh; the log loss is scikit-learn's."""
    from sklearn.metrics import log_loss

    from ort_train_core.cli import classification_metrics

    logits = np.array([[-1000.0], [1000.0], [-2.0], [3.0]])
    y = np.array([0, 1, 1, 0])
    got = classification_metrics(logits, y, "cross_entropy")
    p1 = np.array([0.0, 1.0, 1 / (1 + np.exp(2.0)), 1 / (1 + np.exp(-3.0))])
    assert got["accuracy"] == 0.5
    np.testing.assert_allclose(got["log_loss"], log_loss(y, np.clip(p1, 1e-15, 1 - 1e-15)), rtol=1e-12)
