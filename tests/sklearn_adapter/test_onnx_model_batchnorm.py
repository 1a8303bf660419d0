"""OnnxModelRegressor on a BatchNorm graph (issue 17, items 2 and 3): a BatchNorm1d MLP exported
by torch's TorchScript exporter in training mode, fitted by both training loops, predicts what
the torch network predicts in ``eval()`` after the same SGD steps, and its ``to_onnx()`` graph
normalises with the running statistics (predictions do not depend on the batch)."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime
import pytest

torch = pytest.importorskip("torch")

from batchnorm_support import (  # noqa: E402
    BATCH,
    EPOCHS,
    LR,
    BatchNormMLP,
    batchnorm_data,
    export_training,
    start_from_export,
    torch_sgd,
)
from ort_train_sklearn import OnnxModelRegressor  # noqa: E402


@pytest.mark.parametrize("training", ["full", "partial"])
def test_onnx_model_regressor_trains_batchnorm_as_torch(training: str) -> None:
    torch.manual_seed(0)
    net = BatchNormMLP()
    X, y = batchnorm_data()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    start_from_export(net, model)
    torch_sgd(net, X, y)
    net.eval()
    with torch.no_grad():
        expected = net(torch.from_numpy(X)).numpy().ravel()

    est = OnnxModelRegressor(
        model, learning_rate_init=LR, batch_size=BATCH, max_iter=EPOCHS, shuffle=False, training=training
    ).fit(X, y.ravel())
    np.testing.assert_allclose(est.predict(X).ravel(), expected, atol=1e-5)
    onx = est.to_onnx()
    session = onnxruntime.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    (deployed,) = session.run(None, {name: X})
    (half,) = session.run(None, {name: X[: len(X) // 2]})
    np.testing.assert_allclose(deployed.ravel(), expected, atol=1e-5)
    np.testing.assert_allclose(half.ravel(), deployed.ravel()[: len(X) // 2], atol=1e-6)
