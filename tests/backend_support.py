"""Which gradient backend the suite runs on ($ORT_TRAIN_BACKEND, else what is installed), and
what the tests of both backends share: whether the training build is loaded, the marker of tests
about onnxruntime-training's own behaviour (its refusals, its graph builders' forms), the
parameters of a test run on each backend, and the fixture that makes each the default."""

from __future__ import annotations

import pytest

from ort_train_core._backends import default_backend
from ort_train_core._runtime import is_training_build, ort_capi

#: the backend every trainer of this run uses when none is named
BACKEND = default_backend().name
#: whether the loaded onnxruntime is the training build (the onnxruntime-training backend's)
TRAINING_BUILD = is_training_build(ort_capi)
needs_training = pytest.mark.skipif(
    not TRAINING_BUILD, reason="the training build of onnxruntime is not loaded"
)
#: a test's ``backend`` parameter on each backend (the training build's skipped without it)
BOTH = ["onnx", pytest.param("onnxruntime-training", marks=needs_training)]
#: the backends this onnxruntime runs
AVAILABLE = ["onnxruntime-training", "onnx"] if TRAINING_BUILD else ["onnx"]


def training_build_only(reason: str) -> pytest.MarkDecorator:
    """Skips the test on the ``onnx`` backend, saying why it does not apply there."""
    return pytest.mark.skipif(BACKEND != "onnxruntime-training", reason=f"onnx backend: {reason}")


@pytest.fixture(name="backend", params=AVAILABLE)
def each_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each backend this onnxruntime runs in turn, made the default (``backend=None`` of the
    trainers and estimators) through ``$ORT_TRAIN_BACKEND``. Import it as a fixture."""
    monkeypatch.setenv("ORT_TRAIN_BACKEND", request.param)
    return str(request.param)
