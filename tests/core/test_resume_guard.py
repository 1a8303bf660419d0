"""``resume`` (and ``ort-train fit --resume``) continues only the run it was written by: another
batch size, shuffling, seed or data would end at other weights than the uninterrupted run, so
they are refused with the option's name; a checkpoint of an earlier version (without the data
fingerprint and seed) resumes with a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from core_models import build_linear, build_mlp, linear_sgd_reference

from ort_train_core import (
    LearningRateAdam,
    LearningRateSGD,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from ort_train_core.cli import main


def _data(n: int = 37) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, 4)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]).astype(np.float32)
    return X, y


def _trainer(loop: str = "full", weighted: bool = False, **kwargs: Any) -> Any:
    common: dict[str, Any] = dict(
        batch_size=8, learning_rate=LearningRateAdam(eta0=0.01), shuffle=True, random_state=11
    )
    common.update(kwargs)
    if loop == "full":
        model = add_loss_output(build_mlp(4, 5, seed=2), weight_name="weight" if weighted else None)
        return OrtGradientOptimizer(model, **common)
    return OrtGradientForwardBackwardOptimizer(build_mlp(4, 5, seed=2), **common)


@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        ({"batch_size": 5}, "batch_size"),
        ({"shuffle": False}, "shuffle"),
        ({"random_state": 12}, "random_state"),
    ],
)
def test_resume_refuses_other_settings(tmp_path, loop, change, parameter):
    X, y = _data()
    _trainer(loop, max_iter=2, checkpoint_dir=tmp_path).fit(X, y)
    before = (tmp_path / CHECKPOINT_FILE).read_bytes()
    other = _trainer(loop, max_iter=4, checkpoint_dir=tmp_path, **change)
    with pytest.raises(ValueError, match=parameter):
        other.resume(X, y)
    assert not hasattr(other, "n_iter_")  # nothing restored, nothing trained
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == before


def test_resume_refuses_other_data(tmp_path):
    X, y = _data()
    w = np.linspace(0.5, 2.0, len(X))
    _trainer(weighted=True, max_iter=2, checkpoint_dir=tmp_path).fit(X, y, sample_weight=w)
    X_edit = X.copy()
    X_edit[len(X) // 2, 1] += 1.0
    y_edit = y.copy()
    y_edit[0] = -y_edit[0]
    X_more, y_more = _data(40)
    cases = {
        "another row of X": (X_edit, y, w),
        "another target": (X, y_edit, w),
        "other sample weights": (X, y, w[::-1]),
        "no sample weights": (X, y, None),
        "more rows": (X_more, y_more, np.ones(40)),
    }
    for what, (Xc, yc, wc) in cases.items():
        other = _trainer(weighted=True, max_iter=4, checkpoint_dir=tmp_path)
        with pytest.raises(ValueError, match="other data") as info:
            other.resume(Xc, yc, sample_weight=wc)
        assert str(tmp_path) in str(info.value), what
        assert not hasattr(other, "n_iter_"), what


def test_resume_refuses_other_validation_data(tmp_path):
    X, y = _data()
    _trainer(max_iter=2, checkpoint_dir=tmp_path).fit(X[:30], y[:30], X_val=X[30:], y_val=y[30:])
    with pytest.raises(ValueError, match="X_val"):
        _trainer(max_iter=4, checkpoint_dir=tmp_path).resume(X[:30], y[:30], X_val=X[29:], y_val=y[29:])
    with pytest.raises(ValueError, match="X_val"):
        _trainer(max_iter=4, checkpoint_dir=tmp_path).resume(X[:30], y[:30])


def test_same_data_in_another_dtype_resumes_to_the_uninterrupted_fit(tmp_path):
    """The fingerprint is of the data as trained (cast to the graph's float32): float64 copies
    of the same values resume, and end at the weights of a fit without interruption."""
    X, y = _data()
    straight = _trainer(max_iter=4).fit(X, y)
    _trainer(max_iter=2, checkpoint_dir=tmp_path).fit(X, y)
    resumed = _trainer(max_iter=4, checkpoint_dir=tmp_path).resume(X.astype(np.float64), y.tolist())
    for name, value in straight.get_state().items():
        np.testing.assert_allclose(resumed.get_state()[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_checkpoint_of_an_earlier_version_resumes_with_a_warning(tmp_path, linear_data):
    """No data fingerprint or seed recorded: resumed (same data given) with a warning that
    says they could not be checked; the weights are numpy's SGD on the same batches."""
    X, y = linear_data
    model = build_linear(3, coef=np.zeros((3, 1), np.float32), intercept=np.zeros(1, np.float32))
    make = lambda **kw: OrtGradientOptimizer(  # noqa: E731
        add_loss_output(model),
        batch_size=5,
        learning_rate=LearningRateSGD(0.05, learning_rate="constant"),
        shuffle=False,
        **kw,
    )
    make(max_iter=2, checkpoint_dir=tmp_path).fit(X, y)
    path = tmp_path / CHECKPOINT_FILE
    arrays, meta = read_checkpoint(path)
    old = {k: v for k, v in meta.items() if k not in ("random_state", "data", "validation_data")}
    write_checkpoint(path, arrays, old)
    with pytest.warns(UserWarning, match="earlier version"):
        resumed = make(max_iter=5, checkpoint_dir=tmp_path).resume(X, y)
    zeros = {"coef": np.zeros((3, 1)), "intercept": np.zeros(1)}
    ref, _ = linear_sgd_reference(zeros, X, y, eta=0.05, batch_size=5, epochs=5)
    state = resumed.get_state()
    np.testing.assert_allclose(state["coef"], ref["coef"], atol=1e-5)
    np.testing.assert_allclose(state["intercept"], ref["intercept"], atol=1e-5)


# ---- the command line ---------------------------------------------------------------------------
def _csv(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    np.savetxt(path, np.column_stack([y, X]), delimiter=",", header="y,a,b,c,d", comments="")
    return path


def test_cli_resume_names_the_option_that_changed(tmp_path, capsys):
    X, y = _data()
    onnx.save(build_mlp(4, 5, seed=2), tmp_path / "mlp.onnx")
    data = _csv(tmp_path / "d.csv", X, y)
    other = _csv(tmp_path / "other.csv", X[::-1], y[::-1])
    ckpt = tmp_path / "ckpt"
    common = [
        tmp_path / "mlp.onnx",
        "--target",
        "y",
        "--quiet",
        "--checkpoint",
        ckpt,
        "--out",
        tmp_path / "o.onnx",
    ]
    args = ["--batch-size", 8, "--seed", 3]
    assert main([str(a) for a in ["fit", *common, "--data", data, *args, "--epochs", 2]]) == 0
    before = (ckpt / CHECKPOINT_FILE).read_bytes()
    capsys.readouterr()
    cases = {
        "--batch-size": ["--data", data, "--batch-size", 9, "--seed", 3],
        "--no-shuffle": ["--data", data, *args, "--no-shuffle"],
        "--seed": ["--data", data, "--batch-size", 8, "--seed", 4],
        "--data": ["--data", other, *args],
        "--validation-fraction": ["--data", data, *args, "--validation-fraction", 0.2],
    }
    for option, argv in cases.items():
        code = main([str(a) for a in ["fit", *common, *argv, "--epochs", 4, "--resume"]])
        err = capsys.readouterr().err
        assert code == 2, (option, err)
        assert option in err, (option, err)
        assert str(ckpt) in err, (option, err)
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
        assert (ckpt / CHECKPOINT_FILE).read_bytes() == before, option
