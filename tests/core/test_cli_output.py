"""What ``ort-train`` prints (issue 30 item 7): one line per epoch when stderr is no terminal (a
log, CI, a pipe) and the bar on one; Ctrl-C gives the ``--resume`` command line; an early stop
and a resumed run say so; ``eval --help`` keeps its epilog's lines; ``inspect`` names each
opset once."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from ort_train_core import Callback, LearningRateSGD, OrtGradientOptimizer, add_loss_output, cli
from ort_train_core.checkpoint import CHECKPOINT_FILE
from step_support import mlp

sklearn_datasets = pytest.importorskip("sklearn.datasets")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The step tests' MLP (64 -> 16 -> 10 logits) and 300 digits as a .csv."""
    folder = tmp_path_factory.mktemp("cli_output")
    X, y = sklearn_datasets.load_digits(return_X_y=True)
    X, y = (X[:300] / 16).astype(np.float32), y[:300]
    header = ",".join([*(f"f{i}" for i in range(64)), "label"])
    np.savetxt(folder / "digits.csv", np.column_stack([X, y]), delimiter=",", header=header, comments="")
    onnx.save(mlp(), folder / "mlp.onnx")
    return {"dir": folder, "X": X, "y": y}


pytestmark = pytest.mark.usefixtures("sigint_delivered")


def _argv(files: dict[str, Any], *extra: Any) -> list[str]:
    d = files["dir"]
    base = ["fit", d / "mlp.onnx", "--data", d / "digits.csv", "--target", "label"]
    return [str(a) for a in [*base, "--loss", "cross_entropy", "--batch-size", 20, *extra]]


def _reference_losses(files: dict[str, Any], epochs: int) -> list[float]:
    """The training losses of the CLI's fit (its defaults: SGD 0.01, shuffled with seed 0)."""
    trainer = OrtGradientOptimizer(
        add_loss_output(mlp(), score_name="cross_entropy"),
        max_iter=epochs,
        batch_size=20,
        learning_rate=LearningRateSGD(eta0=0.01, learning_rate="constant"),
        random_state=0,
    ).fit(files["X"], files["y"])
    return list(trainer.train_losses_)


def _epoch_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "epoch " in line and "train_loss=" in line]


# ---- (a) one line per epoch without a terminal ---------------------------------------------------
def test_fit_into_a_pipe_prints_one_line_per_epoch(files, tmp_path):
    """stderr a pipe (a log, CI): no carriage return, one line per epoch with its loss."""
    proc = subprocess.run(
        [sys.executable, "-m", "ort_train_core", *_argv(files, "--epochs", 4, "--out", tmp_path / "t.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = _epoch_lines(proc.stderr)
    expected = _reference_losses(files, 4)
    assert len(lines) == 4, proc.stderr
    for k, (line, loss) in enumerate(zip(lines, expected)):
        assert line.startswith(f"epoch {k + 1}/4: "), line
        np.testing.assert_allclose(float(line.split("train_loss=")[1].split()[0]), loss, rtol=1e-5)
    assert "epochs: 4" in proc.stdout  # the summary stays on stdout, the progress on stderr
    assert "train_loss" not in proc.stdout


def test_fit_on_a_terminal_keeps_the_bar(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code = cli.main(_argv(files, "--epochs", 3, "--out", tmp_path / "t.onnx"))
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "\r" in err
    assert "3/3" in err
    assert _epoch_lines(err) == []


def test_quiet_prints_no_progress(files, tmp_path, capsys):
    code = cli.main(_argv(files, "--epochs", 2, "--quiet", "--out", tmp_path / "t.onnx"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    assert "epochs: 2" in out


# ---- (b) Ctrl-C, early stopping, resume ---------------------------------------------------------
class _InterruptAfterEpoch(Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, trainer, epoch, logs):  # type: ignore[no-untyped-def]
        if epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the fit stops after the next step
        return False


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, epoch: int) -> None:
    """The CLI's trainer, given a callback that sends SIGINT at the end of ``epoch``."""
    build = cli._fit_trainer

    def with_interrupt(args, loss_model):  # type: ignore[no-untyped-def]
        trainer = build(args, loss_model)
        trainer.callbacks = [*(trainer.callbacks or ()), _InterruptAfterEpoch(epoch)]
        return trainer

    monkeypatch.setattr(cli, "_fit_trainer", with_interrupt)


def test_ctrl_c_gives_the_resume_command_that_continues(files, tmp_path, capsys, monkeypatch):
    ckpt = tmp_path / "ckpt"
    argv = _argv(files, "--epochs", 5, "--checkpoint", ckpt, "--out", tmp_path / "t.onnx")
    _interrupt_after(monkeypatch, 1)
    code = cli.main(argv)
    _, err = capsys.readouterr()
    assert code == cli.EXIT_INTERRUPTED
    assert "ort-train: interrupted (Ctrl-C) during epoch 3; no model written" in err
    assert f"ort-train: {ckpt / CHECKPOINT_FILE} holds the end of epoch 2; continue with:" in err
    command = shlex.join(["ort-train", *argv, "--resume"])
    assert f"  {command}" in err.splitlines()
    assert "resume()" not in err  # the Python API's words
    monkeypatch.undo()
    code = cli.main(shlex.split(command)[1:])  # the command as printed continues the run
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epochs: 5" in out
    assert f"ort-train: note: resumed from {ckpt / CHECKPOINT_FILE} at the end of epoch 2 (of 5)" in err
    lines = _epoch_lines(err)
    assert [line.split(":")[0] for line in lines] == ["epoch 3/5", "epoch 4/5", "epoch 5/5"]
    assert err.index("resumed from") < err.index("epoch 3/5")


def test_ctrl_c_without_checkpoint_says_what_would_have_resumed(files, tmp_path, capsys, monkeypatch):
    _interrupt_after(monkeypatch, 0)
    code = cli.main(_argv(files, "--epochs", 5, "--out", tmp_path / "t.onnx"))
    _, err = capsys.readouterr()
    assert code == cli.EXIT_INTERRUPTED
    assert "ort-train: interrupted (Ctrl-C) during epoch 2; no model written" in err
    assert (
        "ort-train: without --checkpoint there is nothing to resume: with --checkpoint DIR, "
        "--resume would have continued from the last complete epoch"
    ) in err


def test_early_stop_says_at_which_epoch_and_why(files, tmp_path, capsys):
    """tol=10 is never met after the first epoch: scikit-learn's rule stops after 1 + 2 epochs."""
    argv = _argv(files, "--epochs", 20, "--early-stopping", "--tol", 10, "--patience", 2)
    code = cli.main([*argv, "--out", str(tmp_path / "t.onnx")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epochs: 3" in out
    assert (
        "ort-train: note: stopped early at epoch 3: the training loss did not improve by tol=10 "
        "for 2 epochs" in err.splitlines()
    )


def test_validation_early_stop_names_the_validation_loss(files, tmp_path, capsys):
    argv = _argv(files, "--epochs", 20, "--early-stopping", "--tol", 10, "--patience", 1)
    code = cli.main([*argv, "--validation-fraction", "0.2", "--out", str(tmp_path / "t.onnx")])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "stopped early at epoch 2: the validation loss did not improve by tol=10 for 1 epoch" in err


# ---- (c) eval --help, (d) inspect ---------------------------------------------------------------
def test_eval_help_keeps_the_epilog_lines(capsys):
    code = cli.main(["eval", "--help"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "example: ort-train eval trained.onnx --data test.csv --target y" in out.splitlines()
    assert all(len(line) <= 100 for line in out.splitlines())


def test_inspect_names_each_opset_once(tmp_path, capsys):
    """skl2onnx writes ('', 22) twice for a LinearRegression; '' and 'ai.onnx' are one domain."""
    model = mlp()
    model.opset_import.extend(
        [
            helper.make_opsetid("", 17),
            helper.make_opsetid("ai.onnx.ml", 3),
            helper.make_opsetid("ai.onnx", 17),
        ]
    )
    path = Path(tmp_path / "dup.onnx")
    onnx.save(model, path)
    code = cli.main(["inspect", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0] == f"model: {path} (IR 8; opsets: ai.onnx 17, ai.onnx.ml 3)"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(files):
    """``ort-train inspect m.onnx | head -1``: the reader gone, the command stops with the exit
    code of a process SIGPIPE ends (128 + 13), without 'error: Broken pipe'. The read end is
    closed before the first line is written, so every write fails."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ort_train_core", "inspect", str(files["dir"] / "mlp.onnx")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert err == ""
    assert proc.returncode == 128 + signal.SIGPIPE


def test_epochs_spent_before_the_stop_is_said_in_the_options_words(files, tmp_path, capsys):
    """--early-stopping that never stops: the trainer's 'max_iter=3 reached...' warning names
    the option the CLI user gave, --epochs."""
    argv = _argv(files, "--epochs", 3, "--early-stopping", "--tol", 1e-9, "--patience", 50)
    code = cli.main([*argv, "--out", str(tmp_path / "t.onnx")])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "ort-train: warning: --epochs 3 reached before the loss stopped improving by tol=1e-09" in err
    assert "max_iter" not in err
    assert "stopped early" not in err
