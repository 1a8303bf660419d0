"""OnnxModule given a model in memory (ModelProto or bytes) whose weights point at external data
(issue 15, item 6): refused with the tensor and the fix named, never read from the working
directory; with the folder named through ``load_model(model, external_data_dir=...)`` its
parameters are the bytes written there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import load_model
from ort_train_torch import OnnxModule

SECRET = np.array([[100.0], [101.0], [102.0]], dtype=np.float32)


def _linear_external(location: str) -> onnx.ModelProto:
    coef = numpy_helper.from_array(np.zeros((3, 1), np.float32), "coef")
    coef.ClearField("raw_data")
    coef.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "4"), ("length", str(SECRET.nbytes))):
        coef.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "coef"], ["Y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [coef],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_bytes(b"HEAD" + SECRET.tobytes())
    return tmp_path


@pytest.mark.parametrize("as_bytes", [False, True], ids=["proto", "bytes"])
def test_in_memory_external_data_is_refused(in_cwd: Path, as_bytes: bool) -> None:
    model = _linear_external("sub/notes.txt")
    given = model.SerializeToString() if as_bytes else model
    with pytest.raises(ValueError, match=r"tensor 'coef' keeps its data in an external file") as info:
        OnnxModule(given)
    assert "external_data_dir=" in str(info.value)


def test_named_folder_gives_the_bytes_written_there(in_cwd: Path) -> None:
    module = OnnxModule(load_model(_linear_external("sub/notes.txt"), external_data_dir=in_cwd))
    (param,) = module.parameters()
    np.testing.assert_array_equal(param.detach().numpy(), SECRET)
    x = torch.ones(2, 3)
    torch.testing.assert_close(module(x), x @ torch.from_numpy(SECRET))
