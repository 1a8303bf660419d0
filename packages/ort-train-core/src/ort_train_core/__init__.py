"""Train ONNX graphs with onnxruntime-training.

Importing this package checks that the *training* build of onnxruntime is installed and raises
:class:`TrainingRuntimeError` (an ImportError) with the pip commands that fix it otherwise.
"""

from ._binding import ortvalue_from_dlpack
from ._data import cast_checked
from ._fit_loop import describe_non_finite, exclusive_fit
from ._io import load_model
from ._ort_errors import onnxruntime_errors
from ._runtime import Device, check_device, parse_device  # importing it checks the runtime
from ._tf32 import set_tf32, tf32_enabled
from ._version import __version__
from .callbacks import Callback, EarlyStopping, EpochPrinter, ProgressBar
from .derivative import DerivativeOptions, onnx_derivative
from .exceptions import (
    ConvergenceError,
    ConvergenceWarning,
    CudaUnavailableError,
    ExportedGraphWarning,
    GraphNotDifferentiableError,
    TrainingRuntimeError,
    TrainingStepError,
)
from .export import (
    StepSignature,
    export_training_step,
    model_from_step_state,
    step_initial_state,
    step_initial_state_model,
    step_signature,
    step_without_defaults,
)
from .forward_backward import OrtGradientForwardBackward
from .graph import (
    add_loss_output,
    default_weights_to_train,
    initializers_to_inputs,
    inputs_to_initializers,
    prediction_graph,
)
from .learning_rate import (
    BaseLearningRate,
    LearningRateAdam,
    LearningRateSGD,
    LearningRateSGDNesterov,
)
from .losses import (
    AbsoluteLearningLoss,
    BaseLearningLoss,
    BaseLearningPenalty,
    BinaryCrossEntropyLearningLoss,
    CrossEntropyLearningLoss,
    ElasticLearningLoss,
    ElasticLearningPenalty,
    EpsilonInsensitiveLearningLoss,
    HingeLearningLoss,
    HuberLearningLoss,
    LogisticLearningLoss,
    ModifiedHuberLearningLoss,
    NegLogLearningLoss,
    NoLearningPenalty,
    SquaredHingeLearningLoss,
    SquareLearningLoss,
)
from .optimizer import OrtGradientOptimizer
from .partial import OrtGradientForwardBackwardOptimizer

__all__ = [
    "AbsoluteLearningLoss",
    "BaseLearningLoss",
    "BaseLearningPenalty",
    "BaseLearningRate",
    "BinaryCrossEntropyLearningLoss",
    "Callback",
    "ConvergenceError",
    "ConvergenceWarning",
    "CrossEntropyLearningLoss",
    "CudaUnavailableError",
    "DerivativeOptions",
    "Device",
    "EarlyStopping",
    "ElasticLearningLoss",
    "ElasticLearningPenalty",
    "EpochPrinter",
    "EpsilonInsensitiveLearningLoss",
    "ExportedGraphWarning",
    "GraphNotDifferentiableError",
    "HingeLearningLoss",
    "HuberLearningLoss",
    "LearningRateAdam",
    "LearningRateSGD",
    "LearningRateSGDNesterov",
    "LogisticLearningLoss",
    "ModifiedHuberLearningLoss",
    "NegLogLearningLoss",
    "NoLearningPenalty",
    "OrtGradientForwardBackward",
    "OrtGradientForwardBackwardOptimizer",
    "OrtGradientOptimizer",
    "ProgressBar",
    "SquareLearningLoss",
    "SquaredHingeLearningLoss",
    "StepSignature",
    "TrainingRuntimeError",
    "TrainingStepError",
    "__version__",
    "add_loss_output",
    "cast_checked",
    "check_device",
    "default_weights_to_train",
    "describe_non_finite",
    "exclusive_fit",
    "export_training_step",
    "initializers_to_inputs",
    "inputs_to_initializers",
    "load_model",
    "model_from_step_state",
    "onnx_derivative",
    "onnxruntime_errors",
    "ortvalue_from_dlpack",
    "parse_device",
    "prediction_graph",
    "set_tf32",
    "step_initial_state",
    "step_initial_state_model",
    "step_signature",
    "step_without_defaults",
    "tf32_enabled",
]
