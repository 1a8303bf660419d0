"""Finds the onnxruntime *training* build and turns device strings into onnxruntime devices.

``import onnxruntime`` probes ``onnxruntime.training.ortmodule``, which imports torch (a second
of start-up, and torch in ``sys.modules``). Core never needs ORTModule, so that probe is masked
while onnxruntime is imported the first time; ``onnxruntime.training`` stays importable later.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .exceptions import TrainingRuntimeError

TRAINING_PACKAGES = ("onnxruntime-training", "onnxruntime-training-cpu")
_OTHER_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino")
PIP_FIX_CPU = 'pip install "ort-train-core[cpu]"'
PIP_FIX_CUDA = 'pip install "ort-train-core[cuda]"'


def installed_onnxruntime_distributions() -> dict[str, str]:
    """Names and versions of every installed distribution that provides ``onnxruntime/``."""
    found: dict[str, str] = {}
    for name in (*TRAINING_PACKAGES, *_OTHER_PACKAGES):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _fix_message(installed: dict[str, str]) -> str:
    others = [name for name in installed if name not in TRAINING_PACKAGES]
    steps = []
    if others:
        steps.append("pip uninstall -y " + " ".join(others + list(TRAINING_PACKAGES)))
    steps.append(f"{PIP_FIX_CPU}   (CPU)   or   {PIP_FIX_CUDA}   (CUDA)")
    what = ", ".join(f"{k}=={v}" for k, v in installed.items()) or "no onnxruntime package"
    return (
        f"Installed: {what}. All onnxruntime builds share the folder 'onnxruntime/', so the last "
        "one installed wins. Fix with:\n    " + "\n    ".join(steps)
    )


def _import_onnxruntime() -> ModuleType:
    if "onnxruntime" in sys.modules:
        loaded: ModuleType = sys.modules["onnxruntime"]
        return loaded
    masked = "onnxruntime.training.ortmodule"
    had = masked in sys.modules
    if not had and "torch" not in sys.modules:
        sys.modules[masked] = None  # type: ignore[assignment]
    try:
        import onnxruntime
    finally:
        if not had and sys.modules.get(masked, 0) is None:
            del sys.modules[masked]
    module: ModuleType = onnxruntime
    return module


def load_capi() -> Any:
    """Returns ``onnxruntime.capi._pybind_state`` of a training build or raises."""
    try:
        _import_onnxruntime()
        from onnxruntime.capi import _pybind_state as capi
    except ImportError as exc:
        raise TrainingRuntimeError(
            f"onnxruntime cannot be imported ({exc}). " + _fix_message(installed_onnxruntime_distributions())
        ) from exc
    try:
        from onnxruntime.capi.build_and_package_info import package_name
    except ImportError:
        package_name = "unknown"
    if not all(hasattr(capi, n) for n in ("InferenceSession", "OrtValue", "SessionIOBinding")):
        raise TrainingRuntimeError(
            f"the imported onnxruntime ('{package_name}') lacks its compiled bindings. "
            + _fix_message(installed_onnxruntime_distributions())
        )
    return capi


def is_training_build(capi: Any) -> bool:
    """Whether ``capi`` (onnxruntime's bindings) is the training build, with its gradient
    builders (the ``onnxruntime-training`` backend needs them; the ``onnx`` backend does not)."""
    try:
        from onnxruntime.capi.build_and_package_info import package_name
    except ImportError:
        package_name = "unknown"
    return package_name in TRAINING_PACKAGES and hasattr(capi, "GradientGraphBuilder")


#: onnxruntime's compiled Python bindings (``onnxruntime.capi._pybind_state``) of the training
#: build: OrtValue, OrtDevice, InferenceSession, SessionIOBinding, and the training classes. Only
#: the modules that hold OrtValues and sessions (_binding, _data, _runner) and the gradient
#: backend (_ort_training) use it; the trainers and the adapters go through them.
ort_capi = load_capi()


@dataclass(frozen=True)
class Device:
    """A parsed device string: ``'cpu'``, ``'cuda'`` or ``'cuda:N'`` (see :func:`parse_device`).

    Parameters
    ----------
    kind : {'cpu', 'cuda'}
        The device type.
    index : int, default=0
        The GPU index (0 for the CPU).

    Attributes
    ----------
    ort_device : onnxruntime OrtDevice
        The device onnxruntime allocates OrtValues on.
    providers : list
        The execution providers of an ``onnxruntime.InferenceSession`` running there.
    """

    kind: str
    index: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"

    @functools.cached_property
    def ort_device(self) -> Any:
        kind = ort_capi.OrtDevice.cpu() if self.kind == "cpu" else ort_capi.OrtDevice.cuda()
        return ort_capi.OrtDevice(kind, ort_capi.OrtDevice.default_memory(), self.index)

    @property
    def providers(self) -> list[Any]:
        if self.kind == "cpu":
            return ["CPUExecutionProvider"]
        return [("CUDAExecutionProvider", {"device_id": str(self.index)}), "CPUExecutionProvider"]


def parse_device(device: str | Device) -> Device:
    """Validates a device string and checks that the installed build can run on it.

    Parameters
    ----------
    device : str or Device
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'`` (any case, surrounding spaces ignored).

    Returns
    -------
    Device
        The parsed device.

    Raises
    ------
    TypeError
        When ``device`` is not a string.
    ValueError
        For an unknown device, or CUDA without the CUDA build of onnxruntime-training.
    CudaUnavailableError
        For CUDA when the driver, the GPU or the CUDA libraries are missing.
    """
    if isinstance(device, Device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', not {device!r}")
    text = device.strip().lower()
    if text == "cpu":
        return Device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N' (N >= 0)")
    if "CUDAExecutionProvider" not in ort_capi.get_available_providers():
        raise ValueError(
            f"device {device!r} needs the CUDA build of onnxruntime-training, but the installed "
            f"build only offers {ort_capi.get_available_providers()}. Install it with "
            f"'pip uninstall -y onnxruntime-training-cpu && {PIP_FIX_CUDA}'."
        )
    from ._cuda import ensure_cuda  # ctypes and the library search: CUDA users only

    ensure_cuda(int(index or 0))
    return Device("cuda", int(index or 0))


def check_device(device: str) -> str:
    """Checks that ``device`` can train here and returns its canonical name (``'cuda:0'``).

    For CUDA: the CUDA build, the NVIDIA driver, the GPU index, and the CUDA 11.8 / cuDNN 8
    libraries, which it loads (what the first fit on that device would do). Raises
    ``ValueError`` or :class:`~ort_train_core.CudaUnavailableError` with the fix, so a script
    can choose its device before it builds anything.

    Parameters
    ----------
    device : str
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.

    Returns
    -------
    str
        The canonical name of the device.

    Raises
    ------
    ValueError
        ``device`` is not a device name.
    CudaUnavailableError
        A CUDA device cannot run here (no CUDA build, driver, GPU or libraries).
    """
    return str(parse_device(device))
