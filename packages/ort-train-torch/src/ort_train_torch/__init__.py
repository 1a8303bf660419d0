"""An ONNX graph as a ``torch.nn.Module``: its initializers are parameters that any torch
optimiser trains, forward and backward run in onnxruntime-training."""

# ort_train_core first: it checks for the training build and says how to install it
import ort_train_core  # noqa: F401

from ._version import __version__
from .module import OnnxModule, ortvalue_from_tensor, tensor_from_ortvalue

__all__ = ["OnnxModule", "__version__", "ortvalue_from_tensor", "tensor_from_ortvalue"]
