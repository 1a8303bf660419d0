"""Cheap compatibility for code migrating from onnxcustom (issue 18, item 2): an output given by
name, sample weights as a column, a free label name beside skl2onnx's 'label' output,
save_onnx_graph into a dict or a stream. References: numpy and onnxruntime."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime
import pytest
from core_models import build_linear

from ort_train_core import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output
from ort_train_core.graph import get_metadata


def _data(n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 3)).astype(np.float32)
    return X, (X @ np.array([1.5, -2.0, 0.5]) + 0.25).astype(np.float32)


def test_output_index_by_name_is_the_same_graph() -> None:
    model = build_linear()
    name = model.graph.output[0].name
    by_name, by_index = add_loss_output(model, output_index=name), add_loss_output(model, output_index=0)
    assert by_name.SerializeToString() == by_index.SerializeToString()
    with pytest.raises(ValueError, match=r"output_index='nope' is not an output of the graph; outputs: \["):
        add_loss_output(model, output_index="nope")


def test_sample_weight_as_a_column_equals_a_vector() -> None:
    X, y = _data()
    w = np.linspace(0.5, 2.0, len(X))
    model = add_loss_output(build_linear(), weight_name="weight")
    column = OrtGradientOptimizer(model, max_iter=2, shuffle=False).fit(
        X, y.reshape(-1, 1), sample_weight=w[:, None]
    )
    vector = OrtGradientOptimizer(model, max_iter=2, shuffle=False).fit(X, y, sample_weight=w)
    for name, value in vector.get_state().items():
        np.testing.assert_array_equal(column.get_state()[name], value)
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(30,\)"):
        OrtGradientOptimizer(model).fit(X, y, sample_weight=np.ones((30, 2)))


def test_default_label_name_avoids_the_classifier_label_output() -> None:
    """skl2onnx's classifiers output 'label': the loss's label input becomes 'label_1'."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.linear_model import LinearRegression

    X, y = _data()
    onx = skl2onnx.to_onnx(LinearRegression().fit(X, y), X[:1], target_opset=17, black_op={"LinearRegressor"})
    onx.graph.output[0].name = "label"  # a graph whose output is named 'label'
    for node in onx.graph.node:
        node.output[:] = ["label" if o == "variable" else o for o in node.output]
    onx.ir_version = min(onx.ir_version, 10)
    model = add_loss_output(onx)
    assert get_metadata(model, "label_name") == "label_1"
    trainer = OrtGradientOptimizer(model, max_iter=2).fit(X, y)
    assert np.isfinite(trainer.train_losses_).all()
    with pytest.raises(ValueError, match="name 'label' is already used in the graph"):
        add_loss_output(onx, label_name="label")  # a name given on purpose stays an error


@pytest.mark.parametrize("partial", [False, True])
def test_save_onnx_graph_into_a_dict_or_a_stream(tmp_path, partial: bool) -> None:
    X, y = _data()
    trainer = (
        OrtGradientForwardBackwardOptimizer(build_linear(), max_iter=1)
        if partial
        else OrtGradientOptimizer(add_loss_output(build_linear()), max_iter=1)
    ).fit(X, y)
    store: dict[str, bytes] = {}
    assert trainer.save_onnx_graph(store) is store
    files = trainer.save_onnx_graph(tmp_path)
    assert list(store) == list(files)
    for name, data in store.items():
        with open(files[name], "rb") as f:
            assert onnx.load_from_string(data) == onnx.load_from_string(f.read()), name
    stream = io.BytesIO()
    trainer.save_onnx_graph(stream)
    sess = onnxruntime.InferenceSession(stream.getvalue(), providers=["CPUExecutionProvider"])
    state = trainer.get_state()
    expected = X @ state["coef"] + state["intercept"]
    np.testing.assert_allclose(
        sess.run(None, {sess.get_inputs()[0].name: X})[0], expected, rtol=1e-5, atol=1e-6
    )
