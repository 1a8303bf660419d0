"""scikit-learn estimators trained by onnxruntime-training, shipped as ONNX."""

from ._skl2onnx import register_when_imported
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

# skl2onnx.to_onnx converts Pipelines holding these estimators (registered once skl2onnx is imported)
register_when_imported()
