"""A model given in memory (ModelProto or bytes) never reads external data from the working
directory (issue 15, item 6): a service that fine-tunes uploaded models and returns them would
hand back local files. Each route refuses such a model with a ValueError that names the tensor
and the fix, unless the caller names the folder (``load_model(model, external_data_dir=...)``),
which gets the checks a model file gets.

The "secret" written in the working directory is the reference: it must never appear in any
weight, and with an explicit folder the weights must be exactly the bytes written there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from core_models import build_linear
from onnx import numpy_helper

from ort_train_core import (
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    _binding,
    _io,
    add_loss_output,
    load_model,
)
from ort_train_core._runtime import parse_device

SECRET = np.array([[100.0], [101.0], [102.0]], dtype=np.float32)  # coef is [3, 1]
X = np.random.default_rng(1).standard_normal((10, 3)).astype(np.float32)
Y = X.sum(axis=1, keepdims=True)


def _external(model: onnx.ModelProto, location: str, offset: int = 4) -> onnx.ModelProto:
    """``model`` with ``coef`` pointing at ``location`` (offset/length as an attacker sets them)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    coef = next(t for t in out.graph.initializer if t.name == "coef")
    coef.ClearField("raw_data")
    coef.ClearField("float_data")
    coef.data_location = onnx.TensorProto.EXTERNAL
    coef.external_data.add(key="location", value=location)
    coef.external_data.add(key="offset", value=str(offset))
    coef.external_data.add(key="length", value=str(SECRET.nbytes))
    return out


@pytest.fixture
def in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory holds ``w.bin`` and ``sub/notes.txt`` with the secret at offset 4."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    for name in ("w.bin", "sub/notes.txt"):
        (tmp_path / name).write_bytes(b"HEAD" + SECRET.tobytes() + b"TAIL")
    return tmp_path


def _route(route: str, model: onnx.ModelProto) -> object:
    kwargs = {"max_iter": 1, "learning_rate": 1e-9}
    if route == "load_model(proto)":
        return load_model(model)
    if route == "load_model(bytes)":
        return load_model(model.SerializeToString())
    if route == "add_loss_output":
        return add_loss_output(model)
    if route == "OrtGradientOptimizer":
        return OrtGradientOptimizer(add_loss_output(model), **kwargs).fit(X, Y)
    if route == "OrtGradientForwardBackwardOptimizer":
        return OrtGradientForwardBackwardOptimizer(model, **kwargs).fit(X, Y)
    assert route == "OrtGradientForwardBackward"
    return OrtGradientForwardBackward(model)


ROUTES = [
    "load_model(proto)",
    "load_model(bytes)",
    "add_loss_output",
    "OrtGradientOptimizer",
    "OrtGradientForwardBackwardOptimizer",
    "OrtGradientForwardBackward",
]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("location", ["w.bin", "sub/notes.txt"])
def test_in_memory_external_data_is_refused_on_every_route(in_cwd: Path, location: str, route: str) -> None:
    model = _external(build_linear(), location)
    with pytest.raises(ValueError, match=r"tensor 'coef' keeps its data in an external file") as info:
        _route(route, model)
    message = str(info.value)
    assert location in message
    assert "load_model(path)" in message
    assert "external_data_dir=" in message


def test_fused_loop_on_a_loss_graph_made_elsewhere(in_cwd: Path) -> None:
    """External data put in after add_loss_output (a loss graph from elsewhere)."""
    loss_model = _external(add_loss_output(build_linear()), "w.bin")
    with pytest.raises(ValueError, match=r"tensor 'coef' keeps its data in an external file"):
        OrtGradientOptimizer(loss_model, max_iter=1).fit(X, Y)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("location", ["../w.bin", "/etc/passwd", "sub/../../w.bin"])
def test_escaping_locations_are_a_value_error(in_cwd: Path, location: str, route: str) -> None:
    """Before, only onnx's own check stopped them (onnx.checker.ValidationError)."""
    model = _external(build_linear(), location)
    with pytest.raises(ValueError, match=r"tensor 'coef'") as info:
        _route(route, model)
    assert not isinstance(info.value, onnx.checker.ValidationError)


def test_explicit_folder_reads_the_data_with_the_file_checks(in_cwd: Path, tmp_path: Path) -> None:
    model = _external(build_linear(seed=2), "sub/notes.txt")
    loaded = load_model(model, external_data_dir=in_cwd)
    got = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    np.testing.assert_array_equal(got["coef"], SECRET)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in loaded.graph.initializer)
    # the caller's model is left as it was
    assert model.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    # bytes too, and the loaded model trains
    loaded_bytes = load_model(model.SerializeToString(), external_data_dir=str(in_cwd))
    assert loaded_bytes == loaded
    OrtGradientForwardBackwardOptimizer(loaded, max_iter=1).fit(X, Y)

    # the same checks as a file's external data: no escape from the named folder
    inner = in_cwd / "sub"
    for location in ("../w.bin", "/etc/passwd"):
        with pytest.raises(ValueError, match=r"tensor 'coef' has external data location"):
            load_model(_external(build_linear(), location), external_data_dir=inner)
    with pytest.raises(ValueError, match=r"external_data_dir=.*is not a folder"):
        load_model(model, external_data_dir=in_cwd / "w.bin")


def test_sessions_are_never_created_from_bytes_with_external_data(in_cwd: Path) -> None:
    """The last gate before onnxruntime: a graph built past the checks still cannot read the
    working directory (onnxruntime resolves external data of bytes relative to it)."""
    model = _external(build_linear(), "w.bin")
    with pytest.raises(ValueError, match=r"tensor 'coef' keeps its data in an external file"):
        _binding.make_session(model, parse_device("cpu"))


def test_check_no_external_data_walks_subgraphs(in_cwd: Path) -> None:
    """A Constant inside an If branch may hold external data too."""
    from onnx import TensorProto, helper

    const = numpy_helper.from_array(SECRET, "hidden")
    const.ClearField("raw_data")
    const.data_location = TensorProto.EXTERNAL
    const.external_data.add(key="location", value="w.bin")
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=const)],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 1])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 1])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ValueError, match=r"tensor 'hidden' keeps its data in an external file"):
        _io.validate_model(model)
