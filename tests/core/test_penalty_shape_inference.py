"""The elastic penalty's flattened weights are ``[1, n]``, never a 1-D tensor of the weights'
length: onnx's shape inference with data propagation (the ``onnx`` backend's walk runs it at each
graph build) holds a 1-D tensor of known length n as n unknown values, about 130 bytes and
0.2 us each per call (a 784-2000-10 MLP's penalty took +200 MiB and +1.2 s to build its step).
The penalty's value stays numpy's here (training with it is checked against numpy in
test_backend_param)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from core_models import build_linear

import ort_train_core as otc

N_FEATURES = 5_000
L1, L2 = 0.01, 0.02


def test_no_tensor_of_the_weights_length_is_one_dimensional() -> None:
    model = build_linear(N_FEATURES, 1)
    penalized = otc.add_loss_output(model, penalty={"coef": {"l1": L1, "l2": L2}})
    graph = onnx.shape_inference.infer_shapes(penalized, strict_mode=False, data_prop=True).graph
    long_1d = [
        vi.name
        for vi in graph.value_info
        if [d.dim_value for d in vi.type.tensor_type.shape.dim] == [N_FEATURES]
    ]
    assert long_1d == []
    # the penalty does read the weights: a [1, n] view of them is there
    assert any(
        [d.dim_value for d in vi.type.tensor_type.shape.dim] == [1, N_FEATURES] for vi in graph.value_info
    )


def test_the_penalty_is_numpys_elastic_term() -> None:
    rng = np.random.default_rng(0)
    model = build_linear(N_FEATURES, 1, seed=1)
    coef = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "coef"))
    base = otc.add_loss_output(model)
    penalized = otc.add_loss_output(model, penalty={"coef": {"l1": L1, "l2": L2}})
    X = rng.standard_normal((8, N_FEATURES)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)
    losses = []
    for m in (base, penalized):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {i.name: v for i, v in zip(sess.get_inputs(), (X, y))}
        losses.append(float(sess.run(["loss"], feeds)[0]))
    expected = L1 * np.abs(coef.astype(np.float64)).sum() + L2 * np.square(coef.astype(np.float64)).sum()
    np.testing.assert_allclose(losses[1] - losses[0], expected, rtol=1e-4)
