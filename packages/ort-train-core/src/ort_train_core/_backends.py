"""The one place that chooses the gradient backend.

The seam (:mod:`._gradient`) declares what a backend offers and imports none; trainers, adapters
and the command line ask this module for one (:func:`get_backend`) and never name a backend
class. A backend is registered here by name, as the module and class that implement
:class:`~._gradient.GradientBackend`, and is imported only when it is first chosen: a runtime
without the training build of onnxruntime can import everything else.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._gradient import GradientBackend

#: backend name -> (module, class) implementing :class:`~._gradient.GradientBackend`
BACKENDS: dict[str, tuple[str, str]] = {
    "onnxruntime-training": ("ort_train_core._ort_training", "OrtTrainingBackend"),
    "onnx": ("ort_train_core.autodiff.backend", "OnnxBackend"),
}
#: the environment variable that names the backend chosen when none is named
BACKEND_VARIABLE = "ORT_TRAIN_BACKEND"


def default_backend_name() -> str:
    """The backend chosen when none is named: ``$ORT_TRAIN_BACKEND`` when set, else the
    training build's when it is installed, else ``'onnx'``."""
    named = os.environ.get(BACKEND_VARIABLE, "").strip()
    if named:
        return named
    from ._runtime import is_training_build, ort_capi

    return "onnxruntime-training" if is_training_build(ort_capi) else "onnx"


def get_backend(name: str | None = None) -> GradientBackend:
    """The gradient backend registered as ``name`` (one instance per process).

    Parameters
    ----------
    name : str or None, default=None
        A key of :data:`BACKENDS`; None chooses :func:`default_backend_name`.

    Returns
    -------
    GradientBackend
        The backend.

    Raises
    ------
    ValueError
        When ``name`` (or ``$ORT_TRAIN_BACKEND`` for None) is not a registered backend.
    TrainingRuntimeError
        For ``'onnxruntime-training'`` when the loaded onnxruntime is not its training build:
        the message names the pip command, or says that this Python has no wheel of it.
    """
    key = default_backend_name() if name is None else name
    if key not in BACKENDS:
        source = f"${BACKEND_VARIABLE}={key!r}" if name is None else repr(name)
        raise ValueError(f"unknown gradient backend {source}: choose one of {sorted(BACKENDS)} (or None)")
    if key == "onnxruntime-training":
        from ._runtime import require_training_build

        require_training_build()
    return _instance(key)


@functools.cache
def _instance(key: str) -> GradientBackend:
    # cached per resolved name: None and the default's own name give the same instance
    module, cls = BACKENDS[key]
    backend: GradientBackend = getattr(importlib.import_module(module), cls)()
    return backend


def default_backend() -> GradientBackend:
    """The backend chosen when none is named: ``get_backend(None)``."""
    return get_backend(None)
