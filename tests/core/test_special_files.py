"""Paths that are not regular files (issue 15, item 7): a model symlinked to ``/dev/zero`` passed
the 2 GB guard (its size is 0) and read without bound; a FIFO given as model, data or checkpoint
blocked every command. Each is now refused at once with a ValueError (the CLI: exit 2, one
line), and every read of a model is bounded.

A call that blocks would hang the suite: each runs in a thread that the test joins with a
deadline, and on a timeout a writer opened on the FIFO releases the blocked reader.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from core_models import build_linear

from ort_train_core import _io, load_model
from ort_train_core.checkpoint import read_checkpoint
from ort_train_core.cli import main

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev (POSIX)")

#: generous: the calls refused return in milliseconds
DEADLINE_S = 60.0


def _fifo(folder: Path, name: str) -> Path:
    path = folder / name
    os.mkfifo(path)
    return path


def _outcome(call: Callable[[], object], fifo: Path | None = None) -> BaseException | object:
    """What ``call`` raised (or returned); fails the test if it is still blocked at the deadline."""
    box: list[BaseException | object] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        if fifo is not None:  # a writer appears and leaves: the blocked open/read returns
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(DEADLINE_S)
        pytest.fail(f"the call blocked for {DEADLINE_S} s")
    return box[0]


def test_model_symlinked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "model.onnx"
    link.symlink_to("/dev/zero")
    result = _outcome(lambda: load_model(link))
    assert isinstance(result, ValueError)
    assert "model.onnx" in str(result)
    assert "character device, not a regular file" in str(result)


def test_model_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path, "model.onnx")
    result = _outcome(lambda: load_model(fifo), fifo)
    assert isinstance(result, ValueError)
    assert "FIFO (named pipe), not a regular file" in str(result)


def test_model_read_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc files are regular files that report size 0 whatever they hold: the read itself
    must stop at the limit, not only the size check before it."""
    source = Path("/proc/self/status")
    if not source.is_file():
        pytest.skip("needs /proc")
    link = tmp_path / "proc.onnx"
    link.symlink_to(source)
    assert link.stat().st_size == 0
    monkeypatch.setattr(_io, "MAX_MODEL_BYTES", 64)  # /proc/self/status holds about 1 KB
    with pytest.raises(ValueError, match=r"proc\.onnx.*more than the 2 GB"):
        load_model(link)


def test_external_data_fifo_is_refused(tmp_path: Path) -> None:
    """Already held (the location must be a regular file); kept so that it stays so."""
    import onnx

    model = build_linear()
    coef = model.graph.initializer[0]
    coef.ClearField("raw_data")
    coef.ClearField("float_data")
    coef.data_location = onnx.TensorProto.EXTERNAL
    coef.external_data.add(key="location", value="w.bin")
    fifo = _fifo(tmp_path, "w.bin")
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    result = _outcome(lambda: load_model(path), fifo)
    assert isinstance(result, ValueError)
    assert "not a regular file" in str(result)


def _cli(argv: list[object], fifo: Path, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    code = _outcome(lambda: main([str(a) for a in argv]), fifo)
    return code, capsys.readouterr().err


def _data_csv(folder: Path) -> Path:
    X = np.arange(12, dtype=np.float64).reshape(4, 3)
    path = folder / "d.csv"
    np.savetxt(path, np.column_stack([X, X.sum(1)]), delimiter=",", header="a,b,c,t", comments="")
    return path


def test_cli_model_fifo_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = _fifo(tmp_path, "m.onnx")
    data = _data_csv(tmp_path)
    for argv in (
        ["inspect", fifo],
        ["fit", fifo, "--data", data, "--target", "t", "--out", tmp_path / "o.onnx"],
    ):
        code, err = _cli(argv, fifo, capsys)
        assert code == 2, err
        assert "FIFO" in err
        assert "Traceback" not in err


@pytest.mark.parametrize("suffix", [".csv", ".npz"])
def test_cli_data_fifo_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(build_linear().SerializeToString())
    fifo = _fifo(tmp_path, "d" + suffix)
    for argv in (
        ["fit", model, "--data", fifo, "--target", "t", "--out", tmp_path / "o.onnx"],
        ["eval", model, "--data", fifo, "--target", "t"],
    ):
        code, err = _cli(argv, fifo, capsys)
        assert code == 2, err
        assert "FIFO" in err
        assert "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_checkpoint_fifo_is_refused(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path, "checkpoint.npz")
    result = _outcome(lambda: read_checkpoint(fifo), fifo)
    assert isinstance(result, ValueError)
    assert "checkpoint.npz" in str(result)
    assert "FIFO" in str(result)


def test_regular_file_helpers(tmp_path: Path) -> None:
    regular = tmp_path / "r.bin"
    regular.write_bytes(b"abc")
    assert _io.check_regular_file(regular) == str(regular)
    with _io.open_regular_file(regular) as f:
        assert f.read() == b"abc"
    with pytest.raises(FileNotFoundError, match=r"data file not found: .*nope"):
        _io.check_regular_file(tmp_path / "nope", "data file")
    with pytest.raises(IsADirectoryError, match="folder"):
        _io.check_regular_file(tmp_path)
    with pytest.raises(ValueError, match="character device"):
        _io.open_regular_file("/dev/null")


def test_a_model_read_allocates_its_own_size_not_the_limit(tmp_path: Path) -> None:
    """The bounded read asks for the file's size plus one byte: reading up to the 2 GB limit at
    once made Python allocate 2 GB for every model (tracemalloc saw it)."""
    import tracemalloc

    import onnx

    path = tmp_path / "linear.onnx"
    onnx.save(build_linear(4, 1), path)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        load_model(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the model's bytes, its parsed copy and onnx's working memory: far below a 16 MB chunk
    assert peak < 100 * size + 1_000_000, peak
