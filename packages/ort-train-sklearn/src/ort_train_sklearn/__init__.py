"""scikit-learn estimators trained by onnxruntime-training, shipped as ONNX."""

from ._version import __version__
from .linear import OrtSGDClassifier, OrtSGDRegressor
from .mlp import OrtMLPClassifier, OrtMLPRegressor
from .onnx_model import OnnxModelClassifier, OnnxModelRegressor

__all__ = [
    "OnnxModelClassifier",
    "OnnxModelRegressor",
    "OrtMLPClassifier",
    "OrtMLPRegressor",
    "OrtSGDClassifier",
    "OrtSGDRegressor",
    "__version__",
]
