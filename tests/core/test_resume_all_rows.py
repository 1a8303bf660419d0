"""``resume`` checks every value of the data (issue 26 item 9): the fingerprint hashed 64 evenly
spaced rows, so an edit between them resumed silently although ``fit --help`` says another
``--data`` is refused. It now hashes all the bytes, streamed in 1 MiB chunks (sha256). A
checkpoint whose fingerprint was written by the sampling scheme still resumes, with a warning
that the data could not be checked."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from core_models import build_linear

from ort_train_core import LearningRateSGD, OrtGradientOptimizer, add_loss_output
from ort_train_core.checkpoint import CHECKPOINT_FILE, data_fingerprint, read_checkpoint, write_checkpoint
from ort_train_core.cli import main

N = 1000  # rows 0, 16, 32, ... were the sampled ones: row 7 was never looked at


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, 3)).astype(np.float32)
    return X, (X @ np.array([1.0, -2.0, 0.5], dtype=np.float32)).astype(np.float32)


def _trainer(tmp_path: Path, epochs: int) -> OrtGradientOptimizer:
    return OrtGradientOptimizer(
        add_loss_output(build_linear(3, seed=1)),
        batch_size=50,
        max_iter=epochs,
        learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        checkpoint_dir=tmp_path,
        verbose=0,
    )


@pytest.mark.parametrize("array", ["X", "y"])
def test_edit_between_sampled_rows_is_refused(tmp_path: Path, array: str) -> None:
    X, y = _data()
    _trainer(tmp_path, 1).fit(X, y)
    X2, y2 = X.copy(), y.copy()
    (X2 if array == "X" else y2)[7] += 1.0
    other = _trainer(tmp_path, 2)
    with pytest.raises(ValueError, match="other data"):
        other.resume(X2, y2)
    assert not hasattr(other, "n_iter_")


def test_fingerprint_is_sha256_of_every_byte() -> None:
    X, y = _data()
    ref = hashlib.sha256()
    for a in (X, y):
        ref.update(f"{a.shape};{a.dtype.str};".encode())
        ref.update(a.tobytes())
    ref.update(b"none;")
    assert data_fingerprint([X, y, None]) == "sha256-all:" + ref.hexdigest()


def test_sparse_fingerprint_sees_every_row_not_the_index_order() -> None:
    X = sp.random(N, 6, density=0.5, format="csr", random_state=0, dtype=np.float32)
    shuffled = X.copy()
    for r in range(X.shape[0]):  # the same matrix with each row's entries in reverse order
        s, e = shuffled.indptr[r], shuffled.indptr[r + 1]
        shuffled.indices[s:e] = shuffled.indices[s:e][::-1].copy()
        shuffled.data[s:e] = shuffled.data[s:e][::-1].copy()
    shuffled.has_sorted_indices = False
    assert data_fingerprint([shuffled]) == data_fingerprint([X])
    edited = X.copy()
    edited.data[edited.indptr[7]] += 1  # a value of row 7, which the sampling never read
    assert data_fingerprint([edited]) != data_fingerprint([X])


def test_checkpoint_with_a_sampled_fingerprint_resumes_with_a_warning(tmp_path: Path) -> None:
    X, y = _data()
    _trainer(tmp_path, 1).fit(X, y)
    path = tmp_path / CHECKPOINT_FILE
    arrays, meta = read_checkpoint(path)
    meta: dict[str, Any] = dict(meta)
    meta["data"] = hashlib.sha256(b"the 64-row scheme").hexdigest()  # what an earlier version wrote
    write_checkpoint(path, arrays, meta)
    with pytest.warns(
        UserWarning, match=r"'data \(its fingerprint of 64 sampled rows\)'.*could not be checked"
    ):
        resumed = _trainer(tmp_path, 2).resume(X, y)
    assert resumed.n_iter_ == 2


def test_cli_resume_refuses_an_edited_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    X, y = _data()
    onnx.save(build_linear(3, seed=1), tmp_path / "m.onnx")
    csv = tmp_path / "d.csv"
    np.savetxt(csv, np.column_stack([X, y]), delimiter=",", header="a,b,c,y", comments="")
    common = ["fit", str(tmp_path / "m.onnx"), "--data", str(csv), "--target", "y", "--quiet"]
    common += ["--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "o.onnx")]
    assert main([*common, "--epochs", "1"]) == 0
    lines = csv.read_text().splitlines()
    lines[8] = "0,0,0,0"  # data row 7
    csv.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main([*common, "--epochs", "2", "--resume"]) == 2
    assert "other rows than --data" in capsys.readouterr().err
