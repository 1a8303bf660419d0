"""Exceptions and warnings raised by ort-train.

They live in a module that imports nothing from onnxruntime so that they can be caught
even when the runtime check of the package fails.
"""

from __future__ import annotations


class TrainingRuntimeError(ImportError):
    """No usable *training* build of onnxruntime is installed.

    It derives from ImportError because it is raised while ``ort_train_core`` is imported; the
    message names the pip commands that fix the installation.

    Parameters
    ----------
    *args
        As ImportError's: the message first.
    """


class _StepError(RuntimeError):
    """An error of a training step, with its epoch and batch (both from 0)."""

    def __init__(self, message: str, epoch: int, batch: int) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.batch = batch


class ConvergenceError(_StepError, ValueError):
    """The training loss became NaN or infinite.

    The trainer restored the weights and optimizer state of the last finite state (the end of
    the last complete epoch whose weights gave a finite loss) before raising, so the model
    stays usable. It is a ``RuntimeError`` and, as scikit-learn's SGD and MLP raise on such
    an overflow, a ``ValueError``.

    Parameters
    ----------
    message : str
        What diverged and what to try (a smaller learning rate, scaled features).
    epoch : int
        The epoch of the step that diverged, from 0.
    batch : int
        The batch of that step within its epoch, from 0.

    Attributes
    ----------
    epoch : int
        As the parameter.
    batch : int
        As the parameter.
    """


class TrainingStepError(_StepError):
    """onnxruntime failed while running a training step (a kernel refused a shape or a value).

    The message names the node or tensor onnxruntime named, in its words without the C++
    context; the trainer restored the weights and optimizer state of the end of the last
    complete epoch (the initial ones in the first epoch) before raising. The original
    onnxruntime exception is the ``__cause__``.

    Parameters
    ----------
    message : str
        What failed and what to try.
    epoch : int
        The epoch of the failing step, from 0.
    batch : int
        The batch of that step within its epoch, from 0.

    Attributes
    ----------
    epoch : int
        As the parameter.
    batch : int
        As the parameter.
    """


class ConvergenceWarning(UserWarning):
    """Training stopped at ``max_iter`` before the stopping criterion (``tol``) was met.

    Parameters
    ----------
    *args
        As UserWarning's: the message first.
    """


class TrainingInterruptedWarning(RuntimeWarning):
    """Ctrl-C ended a fit after its current step: the trainer holds the weights of that step,
    its history the completed epochs, and ``checkpoint_dir`` (when set) the end of the last
    completed epoch, for ``resume``.

    Parameters
    ----------
    *args
        As RuntimeWarning's: the message first.
    """


class ExportedGraphWarning(UserWarning):
    """The graph shows what a torch exporter does to parameters: several parameters merged
    into one tensor (training ties them), or BatchNorm layers possibly folded into Conv
    weights. The message names the tensors and the export settings that avoid it.

    A tensor shared on purpose (a tied embedding) is legitimate: silence the warning with
    ``warnings.filterwarnings('ignore', category=ExportedGraphWarning)``.

    Parameters
    ----------
    *args
        As UserWarning's: the message first.
    """


class GraphNotDifferentiableError(ValueError):
    """The gradient graph cannot be built: an operator on the path to the loss has no gradient.

    Parameters
    ----------
    message : str
        The operators (or the weight) in the way and, where one exists, the fix.
    weight : str, optional
        The trained initializer onnxruntime gives no gradient, when that is the cause.

    Attributes
    ----------
    weight : str or None
        As the parameter.
    """

    def __init__(self, message: str, weight: str | None = None) -> None:
        super().__init__(message)
        self.weight = weight


class CudaUnavailableError(RuntimeError):
    """A CUDA device was asked for but cannot be used.

    No NVIDIA driver, no GPU at that index, or CUDA 11.8 / cuDNN 8 libraries missing. The
    message names what is missing and the fix.

    Parameters
    ----------
    *args
        As RuntimeError's: the message first.
    """


class CheckpointMismatchError(ValueError):
    """``resume`` refused a checkpoint written with another setting or other data: continuing
    it would not end at the weights of the uninterrupted run.

    Parameters
    ----------
    message : str
        What differs and the fix.
    parameter : str
        The trainer parameter (``'batch_size'``, ``'shuffle'``, ``'random_state'``) or
        ``'data'`` / ``'validation_data'``.
    saved, given : object
        The checkpoint's value and this fit's (fingerprints for the data).

    Attributes
    ----------
    parameter : str
        As the parameter.
    saved, given : object
        As the parameters.
    """

    def __init__(self, message: str, parameter: str, saved: object, given: object) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.saved = saved
        self.given = given
