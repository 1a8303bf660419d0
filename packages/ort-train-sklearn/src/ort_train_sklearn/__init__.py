"""scikit-learn estimators trained by onnxruntime-training, shipped as ONNX."""

from ._version import __version__
from .linear import OrtSGDClassifier, OrtSGDRegressor
from .mlp import OrtMLPClassifier, OrtMLPRegressor

__all__ = [
    "OrtMLPClassifier",
    "OrtMLPRegressor",
    "OrtSGDClassifier",
    "OrtSGDRegressor",
    "__version__",
]
