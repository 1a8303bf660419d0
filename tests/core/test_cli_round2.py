"""``ort-train`` on inputs tried in issue 26 item 19: ``--out`` naming the model, the data or the
checkpoint file was overwritten (exit 0); checkpoints holding inf, huge or string counters gave
tracebacks; an .npz whose arrays need more memory than there is gave a MemoryError; the
stale-temporary cleaner removed any ``.ort-train-*.tmp``, a user's file included. Each is now
exit 2 (or left alone) with one line naming the file."""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from core_models import build_linear

from ort_train_core import _npz
from ort_train_core.checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from ort_train_core.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def _one_line_error(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    onnx.save(build_linear(3, seed=1), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", X=X, y=X.sum(axis=1))
    return {"model": tmp_path / "m.onnx", "data": tmp_path / "d.npz", "ckpt": tmp_path / "ck"}


def _fit(files: dict[str, Path], *extra: Any) -> list[Any]:
    return ["fit", files["model"], "--data", files["data"], "--target", "y", "--quiet", *extra]


# ---- --out must not name an input ----------------------------------------------------------------
@pytest.mark.parametrize("which", ["model", "data", "checkpoint", "data via a symlink"])
def test_out_naming_an_input_is_refused(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], which: str
) -> None:
    ckpt_file = files["ckpt"] / CHECKPOINT_FILE
    first = _fit(
        files, "--epochs", 1, "--checkpoint", files["ckpt"], "--out", files["model"].with_suffix(".o")
    )
    assert _run(capsys, *first)[0] == 0
    out = {"model": files["model"], "data": files["data"], "checkpoint": ckpt_file}.get(which)
    if out is None:
        out = files["data"].parent / "link.npz"
        out.symlink_to(files["data"])
    before = {
        k: p.read_bytes()
        for k, p in [("model", files["model"]), ("data", files["data"]), ("ckpt", ckpt_file)]
    }
    code, err = _run(capsys, *_fit(files, "--epochs", 1, "--checkpoint", files["ckpt"], "--out", out))
    _one_line_error(code, err, "--out", str(out))
    after = {
        k: p.read_bytes()
        for k, p in [("model", files["model"]), ("data", files["data"]), ("ckpt", ckpt_file)]
    }
    assert after == before


# ---- checkpoints with damaged counters -----------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("n_iter_", float("inf")),
        ("n_iter_", 10**30),
        ("n_iter_", "1"),
        ("n_steps", float("nan")),
        ("n_steps", 2.5),
        ("n_samples", "many"),
        ("n_states", [10**30]),
        ("train_losses_", ["x"]),
        ("n_iter_", True),
        ("rng", {"bit_generator": "PCG64", "state": {"state": 10**100, "inc": 1}}),
    ],
)
def test_checkpoint_with_bad_counters_exits_2(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], key: str, value: Any
) -> None:
    out = files["model"].with_suffix(".o")
    assert _run(capsys, *_fit(files, "--epochs", 1, "--checkpoint", files["ckpt"], "--out", out))[0] == 0
    path = files["ckpt"] / CHECKPOINT_FILE
    arrays, meta = read_checkpoint(path)
    meta = dict(meta)
    meta[key] = value
    write_checkpoint(path, arrays, json.loads(json.dumps(meta)))  # as a file would hold it
    code, err = _run(
        capsys, *_fit(files, "--epochs", 3, "--checkpoint", files["ckpt"], "--out", out, "--resume")
    )
    _one_line_error(code, err, str(path), key)


# ---- an .npz that needs more memory than there is ------------------------------------------------
def test_npz_declaring_more_than_the_memory_exits_2(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressed .npz of 64 MiB of zeros is 64 KiB: its headers declare the size, which is
    refused when the memory cannot hold it (here made 16 MiB: the first array takes 48 MiB)
    before anything is allocated."""
    big = files["data"].parent / "big.npz"
    with zipfile.ZipFile(big, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, shape in [("X", (1 << 21, 3)), ("y", (1 << 21,))]:
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(
                    member, {"descr": "<f8", "fortran_order": False, "shape": shape}
                )
                zeros = bytes(1 << 20)
                for _ in range(int(np.prod(shape)) * 8 >> 20):
                    member.write(zeros)
    assert big.stat().st_size < 1 << 20
    monkeypatch.setattr(_npz, "memory_available", lambda: 16 << 20, raising=False)
    allocated: list[int] = []
    real_frombuffer = np.frombuffer
    monkeypatch.setattr(
        np, "frombuffer", lambda b, **kw: allocated.append(len(b)) or real_frombuffer(b, **kw)
    )
    argv = ["fit", files["model"], "--data", big, "--target", "y", "--out", files["model"].with_suffix(".o")]
    code, err = _run(capsys, *argv)
    _one_line_error(code, err, str(big), "'X'", "48.0 MiB", "16.0 MiB")
    assert allocated == []


def test_npz_memory_error_is_exit_2(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory that runs out while reading (another process took it) is exit 2 naming the file."""

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(np, "frombuffer", no_memory)
    code, err = _run(capsys, *_fit(files, "--out", files["model"].with_suffix(".o")))
    _one_line_error(code, err, str(files["data"]), "memory")


# ---- stale temporaries: only ort-train's own ---------------------------------------------------
def test_stale_cleaner_removes_only_its_own_names(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = files["data"].parent
    files["ckpt"].mkdir()
    ours = [folder / ".ort-train-0123456789ab.tmp", files["ckpt"] / ".checkpoint-a1b2c3d4e5f6.tmp"]
    users = [
        folder / ".ort-train-notes.tmp",
        folder / ".ort-train-0123456789ab.tmp.bak",
        folder / ".ort-train-0123456789abc.tmp",
        files["ckpt"] / ".checkpoint-mine.tmp",
    ]
    old = time.time() - 24 * 3600
    for path in [*ours, *users]:
        path.write_bytes(b"partial")
        os.utime(path, (old, old))
    out = folder / "out.onnx"
    assert _run(capsys, *_fit(files, "--epochs", 1, "--checkpoint", files["ckpt"], "--out", out))[0] == 0
    assert [p.name for p in ours if p.exists()] == []
    assert [p.name for p in users if not p.exists()] == []


def test_memory_error_anywhere_is_exit_2(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data that fit on disk but not in memory once cast or split: one line, exit 2."""
    import ort_train_core.cli as cli

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(cli, "add_loss_output", no_memory)
    code, err = _run(capsys, *_fit(files, "--out", files["model"].with_suffix(".o")))
    _one_line_error(code, err, "not enough memory")
