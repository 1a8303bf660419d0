"""OnnxModelRegressor/Classifier given a model in memory (ModelProto or bytes) whose weights
point at external data (issue 15, item 6): refused with the tensor and the fix named, never read
from the working directory (``to_onnx()`` would hand the local file back). With the folder named
through ``ort_train_core.load_model(model, external_data_dir=...)`` the model trains from the
bytes written there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import load_model
from ort_train_sklearn import OnnxModelClassifier, OnnxModelRegressor

SECRET = np.array([[100.0], [101.0], [102.0]], dtype=np.float32)
X = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)


def _linear_external(location: str) -> onnx.ModelProto:
    """Y = X @ coef + intercept, coef kept in ``location`` at offset 4 (as an attacker writes it)."""
    coef = numpy_helper.from_array(np.zeros((3, 1), np.float32), "coef")
    coef.ClearField("raw_data")
    coef.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "4"), ("length", str(SECRET.nbytes))):
        coef.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "coef"], ["mm"]),
            helper.make_node("Add", ["mm", "intercept"], ["Y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [coef, numpy_helper.from_array(np.zeros(1, np.float32), "intercept")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"HEAD" + SECRET.tobytes())
    return tmp_path


@pytest.mark.parametrize("as_bytes", [False, True], ids=["proto", "bytes"])
@pytest.mark.parametrize("estimator", [OnnxModelRegressor, OnnxModelClassifier])
def test_in_memory_external_data_is_refused(in_cwd: Path, estimator: type, as_bytes: bool) -> None:
    model = _linear_external("w.bin")
    given = model.SerializeToString() if as_bytes else model
    y = X.sum(1) if estimator is OnnxModelRegressor else (X.sum(1) > 0).astype(np.int64)
    with pytest.raises(
        ValueError, match=r"tensor 'coef' keeps its data in an external file \('w\.bin'\)"
    ) as info:
        estimator(model=given, max_iter=1).fit(X, y)
    assert "external_data_dir=" in str(info.value)


def test_named_folder_trains_from_its_bytes(in_cwd: Path) -> None:
    loaded = load_model(_linear_external("w.bin"), external_data_dir=in_cwd)
    y = X @ SECRET[:, 0]
    reg = OnnxModelRegressor(model=loaded, max_iter=1, learning_rate_init=1e-12, shuffle=False).fit(X, y)
    coef = {t.name: numpy_helper.to_array(t) for t in reg.to_onnx().graph.initializer}["coef"]
    np.testing.assert_allclose(coef, SECRET, rtol=1e-6)
