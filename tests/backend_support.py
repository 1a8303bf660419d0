"""Which gradient backend the suite runs on ($ORT_TRAIN_BACKEND, else what is installed), and the
marker of tests about onnxruntime-training's own behaviour (its refusals, its graph builders'
forms), which the ``onnx`` backend does not share."""

from __future__ import annotations

import pytest

from ort_train_core._backends import default_backend

#: the backend every trainer of this run uses when none is named
BACKEND = default_backend().name


def training_build_only(reason: str) -> pytest.MarkDecorator:
    """Skips the test on the ``onnx`` backend, saying why it does not apply there."""
    return pytest.mark.skipif(BACKEND != "onnxruntime-training", reason=f"onnx backend: {reason}")
