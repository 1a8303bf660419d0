"""``ort_train_core.load_model`` on files that may be broken or hostile.

Every case checks the exception type *and* that its message names what is wrong (the file, the
tensor, the location), since these errors are read by people who did not write the model. The
good cases compare the loaded weights with the arrays the files were written from.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from core_models import build_linear, build_mlp, initializers
from onnx import numpy_helper

import ort_train_core
from ort_train_core import _io, load_model


def _save_external(model: onnx.ModelProto, folder: Path, data_name: str = "weights.bin") -> Path:
    """Saves a copy of ``model`` with every initializer in ``folder/data_name`` (threshold 0: all
    external); a copy because ``onnx.save_model`` rewrites the tensors it moves out."""
    path = folder / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(
        copy,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data_name,
        size_threshold=0,
    )
    return path


def _rewrite_locations(path: Path, location: str, only: str | None = None) -> None:
    """Edits the saved (external-data) model's ``location`` fields, as an attacker would."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        if only is not None and tensor.name != only:
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(model.SerializeToString())


def test_exported_from_package() -> None:
    assert ort_train_core.load_model is load_model
    assert "load_model" in ort_train_core.__all__


def test_plain_model_roundtrip(tmp_path: Path) -> None:
    model = build_mlp()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_model(path)
    assert loaded.SerializeToString() == model.SerializeToString()
    loaded_str = load_model(str(path))  # str and PathLike both accepted
    assert loaded_str == loaded


def test_external_data_inside_folder_is_loaded(tmp_path: Path) -> None:
    model = build_linear(n_features=5, n_outputs=2, seed=3)
    expected = initializers(model)
    path = _save_external(model, tmp_path)
    # the file written really keeps its weights outside (else the test proves nothing)
    raw = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in raw.graph.initializer)
    loaded = load_model(path)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in loaded.graph.initializer)
    got = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value)


def test_external_data_in_subfolder_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    model = build_linear(seed=1)
    expected = initializers(model)
    path = _save_external(model, tmp_path, data_name="data/w.bin")
    got = {t.name: numpy_helper.to_array(t) for t in load_model(path).graph.initializer}
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match=r"nope\.onnx"):
        load_model(path)


def test_folder_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="folder"):
        load_model(tmp_path)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.99])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    data = build_mlp(hidden=16).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"cut\.onnx is not a valid ONNX model"):
        load_model(path)


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00" * 64, b"hello, this is not an onnx file\n", bytes(range(256)) * 8, b"\x08\x07"],
    ids=["empty", "zeros", "text", "bytes", "ir-only"],
)
def test_garbage_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"garbage\.onnx is not a valid ONNX model"):
        load_model(path)


def test_flipped_bytes_never_crash(tmp_path: Path) -> None:
    """Corruption in the middle: either a clean ValueError or a parse that still has a graph."""
    data = bytearray(build_mlp().SerializeToString())
    rng = np.random.default_rng(0)
    path = tmp_path / "flip.onnx"
    outcomes = {"ValueError": 0, "parsed": 0}
    for _ in range(40):
        bad = bytearray(data)
        for i in rng.integers(0, len(bad), size=4):
            bad[i] ^= 0xFF
        path.write_bytes(bytes(bad))
        try:
            model = load_model(path)
        except ValueError as exc:
            message = str(exc)
            outcomes["ValueError"] += 1
            assert "flip.onnx" in message
        else:
            assert model.HasField("graph")
            outcomes["parsed"] += 1
    assert outcomes["ValueError"] > 0  # the corruptions do reach the error path


@pytest.mark.parametrize("location", ["../x.bin", "sub/../../x.bin", "..\\x.bin"])
def test_external_location_escaping_with_dotdot(tmp_path: Path, location: str) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    path = _save_external(build_linear(), inner)
    # a real file at the target: the refusal must not depend on the file being absent
    (tmp_path / "x.bin").write_bytes(b"\x00" * 1024)
    _rewrite_locations(path, location, only="coef")
    with pytest.raises(ValueError, match=r"tensor 'coef'.*\.\..*out of the model's folder") as info:
        load_model(path)
    assert location.replace("\\", "\\\\") in str(info.value)


@pytest.mark.parametrize("location", ["/etc/passwd", "/dev/zero"])
def test_external_location_absolute(tmp_path: Path, location: str) -> None:
    path = _save_external(build_linear(), tmp_path)
    _rewrite_locations(path, location, only="intercept")
    with pytest.raises(ValueError, match=rf"tensor 'intercept'.*{location}.*absolute path"):
        load_model(path)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_external_location_symlink_escaping(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    model = build_linear()
    path = _save_external(model, inner)
    # the weights file moves out of the folder and a link inside points at it
    outside = tmp_path / "outside.bin"
    (inner / "weights.bin").rename(outside)
    try:
        (inner / "weights.bin").symlink_to(outside)
    except OSError as exc:  # pragma: no cover - e.g. Windows without the privilege
        pytest.skip(f"cannot create a symbolic link: {exc}")
    with pytest.raises(ValueError, match=r"tensor '(coef|intercept)'.*symbolic link"):
        load_model(path)


def test_external_symlink_inside_folder_is_fine(tmp_path: Path) -> None:
    model = build_linear(seed=5)
    expected = initializers(model)
    path = _save_external(model, tmp_path)
    (tmp_path / "real.bin").write_bytes((tmp_path / "weights.bin").read_bytes())
    (tmp_path / "weights.bin").unlink()
    (tmp_path / "weights.bin").symlink_to(tmp_path / "real.bin")
    got = {t.name: numpy_helper.to_array(t) for t in load_model(path).graph.initializer}
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value)


def test_external_file_missing(tmp_path: Path) -> None:
    path = _save_external(build_linear(), tmp_path)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ValueError, match=r"weights\.bin.*does not exist"):
        load_model(path)


def test_external_file_truncated(tmp_path: Path) -> None:
    path = _save_external(build_linear(n_features=8), tmp_path)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"beyond the end of its external data file"):
        load_model(path)


def test_external_length_not_matching_shape(tmp_path: Path) -> None:
    path = _save_external(build_linear(n_features=4), tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.name == "coef":
            for entry in tensor.external_data:
                if entry.key == "length":
                    entry.value = str(int(entry.value) - 4)
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ValueError, match=r"tensor 'coef' of shape \[4, 1\] needs 16 bytes.* holds 12"):
        load_model(path)


@pytest.mark.parametrize(("key", "value"), [("offset", "-5"), ("length", "abc")])
def test_external_bad_offset_or_length(tmp_path: Path, key: str, value: str) -> None:
    path = _save_external(build_linear(), tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    tensor = model.graph.initializer[0]
    entries = {e.key: e for e in tensor.external_data}
    if key in entries:
        entries[key].value = value
    else:
        tensor.external_data.add(key=key, value=value)
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ValueError, match=rf"tensor '{tensor.name}'.*(negative|not integers)"):
        load_model(path)


def test_too_big_plain_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2 GB limit, checked with a lowered limit instead of a 2 GB file."""
    model = build_mlp(hidden=32)
    path = tmp_path / "big.onnx"
    path.write_bytes(model.SerializeToString())
    monkeypatch.setattr(_io, "MAX_MODEL_BYTES", model.ByteSize() - 1)
    with pytest.raises(ValueError, match=r"big\.onnx.*more than the 2 GB.*reduce the model"):
        load_model(path)
    monkeypatch.setattr(_io, "MAX_MODEL_BYTES", model.ByteSize())
    assert load_model(path) == model


def test_too_big_with_external_data_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sum of the external sizes trips the limit before any external byte is read."""
    model = build_linear(n_features=64, n_outputs=8)
    weights_bytes = sum(v.nbytes for v in initializers(model).values())
    path = _save_external(model, tmp_path)
    header = path.stat().st_size
    assert header < weights_bytes  # the weights really are outside
    monkeypatch.setattr(_io, "MAX_MODEL_BYTES", header + weights_bytes // 2)

    opened: list[str] = []
    real_open = open

    def spy_open(file: object, *args: object, **kwargs: object) -> object:
        opened.append(os.fspath(file))  # type: ignore[arg-type]
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", spy_open)
    with pytest.raises(ValueError, match=r"model\.onnx.*2 GB.*external data are not supported"):
        load_model(path)
    assert not any(p.endswith("weights.bin") for p in opened)


def test_external_attribute_tensor_escaping(tmp_path: Path) -> None:
    """A Constant node's tensor can live outside too (convert_attribute=True): checked the same."""
    from onnx import TensorProto, helper

    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("Constant", [], ["Y"], value=numpy_helper.from_array(value, "const_value"))
    graph = helper.make_graph(
        [node], "g", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "const.onnx"
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        location="c.bin",
        size_threshold=0,
        convert_attribute=True,
    )
    loaded = load_model(path)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.node[0].attribute[0].t), value)

    raw = onnx.load(str(path), load_external_data=False)
    tensor = raw.graph.node[0].attribute[0].t
    assert tensor.data_location == onnx.TensorProto.EXTERNAL
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = "../c.bin"
    path.write_bytes(raw.SerializeToString())
    with pytest.raises(ValueError, match=r"tensor 'const_value' has external data location '\.\./c\.bin'"):
        load_model(path)
