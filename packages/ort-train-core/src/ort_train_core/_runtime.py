"""Loads onnxruntime (the training build or a stock one), says which, and turns device strings
into onnxruntime devices.

Every onnxruntime distribution installs the same folder ``onnxruntime/``: two of them in one
environment overwrite each other's files, which the import detects and reports (a warning, with
the pip commands that leave one). Which one the ``[cpu]`` extra installs where is the
``cpu`` extra's marker in ``ort-train-core``'s pyproject; :func:`has_training_wheel` says the same.

``import onnxruntime`` probes ``onnxruntime.training.ortmodule``, which imports torch (a second
of start-up, and torch in ``sys.modules``). Core never needs ORTModule, so that probe is masked
while onnxruntime is imported the first time; ``onnxruntime.training`` stays importable later.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .exceptions import TrainingRuntimeError

TRAINING_PACKAGES = ("onnxruntime-training", "onnxruntime-training-cpu")
_OTHER_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino")
# The fixes the messages give install the runtime itself, what each extra of ort-train-core's
# pyproject names: ort-train-core is already installed (from a clone: it is not on PyPI, so
# `pip install "ort-train-core[cpu]"` would fail) and only its onnxruntime is missing.
# tests/install/test_install_lines.py checks them against the pyproject's extras.
#: the ``[cpu]`` extra where onnxruntime-training-cpu has a wheel (:func:`has_training_wheel`)
PIP_FIX_CPU = "pip install onnxruntime-training-cpu==1.19.2"
#: the ``[stock]`` extra, and ``[cpu]`` elsewhere
PIP_FIX_STOCK = 'pip install "onnxruntime>=1.20"'
#: the ``[gpu]`` extra
PIP_FIX_GPU = 'pip install "onnxruntime-gpu[cuda,cudnn]>=1.20"'
#: the ``[cuda]`` extra: the training build's CUDA wheel and the CUDA 11.8 / cuDNN 8 libraries
PIP_FIX_CUDA = (
    "pip install onnxruntime-training==1.19.2 nvidia-cuda-runtime-cu11==11.8.89 "
    "nvidia-cublas-cu11==11.11.3.6 nvidia-cufft-cu11==10.9.0.58 nvidia-curand-cu11==10.3.0.86 "
    '"nvidia-cudnn-cu11>=8.9,<9"'
)
#: the CPython versions with a wheel of onnxruntime-training-cpu 1.19.2, its last release
TRAINING_WHEEL_PYTHONS = ((3, 10), (3, 11), (3, 12))
_TRAINING_WHEEL_TEXT = "CPython 3.10-3.12 on Linux x86-64, macOS and Windows x86-64"


def installed_onnxruntime_distributions() -> dict[str, str]:
    """Names and versions of every installed distribution that provides ``onnxruntime/``."""
    found: dict[str, str] = {}
    for name in (*TRAINING_PACKAGES, *_OTHER_PACKAGES):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def has_training_wheel(
    version: tuple[int, int] | None = None, system: str | None = None, machine: str | None = None
) -> bool:
    """Whether onnxruntime-training-cpu 1.19.2 has a wheel for this interpreter and platform
    (the ``cpu`` extra's marker, in Python: where it is False that extra installs stock onnxruntime).

    Parameters
    ----------
    version : tuple of int, optional
        ``(major, minor)`` of CPython; this interpreter's when None (and False for another
        implementation than CPython).
    system : str, optional
        ``sys.platform`` (``'linux'``, ``'darwin'``, ``'win32'``); this one's when None.
    machine : str, optional
        ``platform.machine()`` (``'x86_64'``, ``'AMD64'``, ``'aarch64'``); this one's when None.

    Returns
    -------
    bool
        True where the ``[cpu]`` extra of ort-train-core installs the training build.
    """
    if version is None and sys.implementation.name != "cpython":
        return False
    version = sys.version_info[:2] if version is None else version
    system = sys.platform if system is None else system
    machine = platform.machine() if machine is None else machine
    platform_ok = (system == "linux" and machine == "x86_64") or system == "darwin"
    return version in TRAINING_WHEEL_PYTHONS and (platform_ok or (system == "win32" and machine == "AMD64"))


def _here() -> str:
    return f"Python {sys.version_info[0]}.{sys.version_info[1]} on {sys.platform} {platform.machine()}"


def _uninstall_all(installed: dict[str, str]) -> str:
    return "pip uninstall -y " + " ".join(installed) + " && " if installed else ""


def _fix_message(installed: dict[str, str]) -> str:
    if has_training_wheel():
        cpu, fix = "the training build", PIP_FIX_CPU
    else:
        cpu, fix = f"stock onnxruntime: no training build for {_here()}", PIP_FIX_STOCK
    what = ", ".join(f"{k}=={v}" for k, v in installed.items()) or "no onnxruntime package"
    return (
        f"Installed: {what}. All onnxruntime builds share the folder 'onnxruntime/', so the last "
        f"one installed wins. Fix with one of:\n    {_uninstall_all(installed)}{fix}   ({cpu})"
        f"\n    {_uninstall_all(installed)}{PIP_FIX_GPU}   (onnxruntime-gpu, CUDA)"
    )


def loaded_build() -> str:
    """The distribution name and version of the onnxruntime that is loaded, as one string
    (``"'onnxruntime' 1.32.0"``)."""
    name, version = _package_info()
    return f"'{name}' {version}".rstrip()


def _package_info() -> tuple[str, str]:
    """The loaded onnxruntime's distribution name and version, as its build recorded them
    (``('unknown', '')`` for a build without that record)."""
    try:
        from onnxruntime.capi import build_and_package_info as info
    except ImportError:
        return "unknown", ""
    return str(getattr(info, "package_name", "unknown")), str(getattr(info, "__version__", ""))


def training_build_fix(installed: dict[str, str] | None = None) -> str:
    """How to install the training build of onnxruntime here, or why it cannot be.

    Parameters
    ----------
    installed : dict, optional
        :func:`installed_onnxruntime_distributions` (read when None): what the commands
        uninstall first, as two builds in one environment overwrite each other.

    Returns
    -------
    str
        A sentence with the pip commands, or saying that no wheel exists for this Python.
    """
    if not has_training_wheel():
        return (
            f"onnxruntime-training has no wheel for {_here()}: its last release (1.19.2) has them "
            f"for {_TRAINING_WHEEL_TEXT} only."
        )
    installed = installed_onnxruntime_distributions() if installed is None else installed
    others = {k: v for k, v in installed.items() if k not in TRAINING_PACKAGES}
    return f"To install it: {_uninstall_all(others)}{PIP_FIX_CPU}"


def check_one_runtime(installed: dict[str, str] | None = None) -> None:
    """Warns when several onnxruntime distributions are installed: they share the folder
    ``onnxruntime/``, so the loaded files may be a mix of both, and uninstalling one breaks
    the other.

    Parameters
    ----------
    installed : dict, optional
        :func:`installed_onnxruntime_distributions` (read when None).

    Warns
    -----
    RuntimeWarning
        Naming every installed distribution, the loaded one, and the commands that keep one.
    """
    installed = installed_onnxruntime_distributions() if installed is None else installed
    if len(installed) < 2:
        return
    names = ", ".join(f"{k}=={v}" for k, v in installed.items())
    warnings.warn(
        f"{names} are installed together: every onnxruntime build installs the same folder "
        f"'onnxruntime/', so they overwrote each other's files (the loaded one says it is "
        f"{loaded_build()}) and uninstalling one breaks the other. {_fix_message(installed)}",
        RuntimeWarning,
        stacklevel=2,
    )


def require_training_build() -> None:
    """Raises unless the loaded onnxruntime is the training build (what the
    ``onnxruntime-training`` backend needs).

    Raises
    ------
    TrainingRuntimeError
        Naming the loaded build, that ``backend='onnx'`` trains with it, and how to install the
        training build (or that it has no wheel for this Python).
    """
    if is_training_build(ort_capi):
        return
    raise TrainingRuntimeError(
        "backend 'onnxruntime-training' needs the training build of onnxruntime "
        f"(onnxruntime-training-cpu or onnxruntime-training 1.19.2), but the loaded onnxruntime is "
        f"{loaded_build()}: backend='onnx' trains with it. " + training_build_fix()
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
    if not all(hasattr(capi, n) for n in ("InferenceSession", "OrtValue", "SessionIOBinding")):
        raise TrainingRuntimeError(
            f"the imported onnxruntime ('{_package_info()[0]}') lacks its compiled bindings. "
            + _fix_message(installed_onnxruntime_distributions())
        )
    return capi


def is_training_build(capi: Any) -> bool:
    """Whether ``capi`` (onnxruntime's bindings) is the training build, with its gradient
    builders (the ``onnxruntime-training`` backend needs them; the ``onnx`` backend does not)."""
    return _package_info()[0] in TRAINING_PACKAGES and hasattr(capi, "GradientGraphBuilder")


#: onnxruntime's compiled Python bindings (``onnxruntime.capi._pybind_state``), of the training
#: build or a stock one: OrtValue, OrtDevice, InferenceSession, SessionIOBinding, and the
#: training classes where the training build is loaded (:func:`is_training_build`). Only
#: the modules that hold OrtValues and sessions (_binding, _data, _runner) and the gradient
#: backend (_ort_training) use it; the trainers and the adapters go through them.
ort_capi = load_capi()
check_one_runtime()


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
        if self.kind == "cpu":
            return ort_capi.OrtDevice(ort_capi.OrtDevice.cpu(), ort_capi.OrtDevice.default_memory(), 0)
        return cuda_ort_device(self.index)

    @property
    def providers(self) -> list[Any]:
        if self.kind == "cpu":
            return ["CPUExecutionProvider"]
        from ._tf32 import cuda_provider_options

        return [("CUDAExecutionProvider", cuda_provider_options(self.index)), "CPUExecutionProvider"]


#: NVIDIA's PCI vendor id: stock onnxruntime's OrtDevice carries a vendor (1.31.1 and 1.32 read),
#: its own ``OrtDevice.make('cuda', n)`` sets this one ("allocators are keyed by vendor-specific
#: OrtDevice values"), and its CUDA data transfers refuse a GPU device of another vendor
NVIDIA_VENDOR_ID = 0x10DE


def cuda_ort_device(index: int, capi: Any = None) -> Any:
    """The OrtDevice of GPU ``index``, as onnxruntime's own ``OrtDevice.make('cuda', index)``
    builds it: with NVIDIA's vendor id where the build's OrtDevice has one (stock onnxruntime),
    without it in the training build (1.19), whose OrtDevice takes none."""
    capi = ort_capi if capi is None else capi
    kind, memory = capi.OrtDevice.cuda(), capi.OrtDevice.default_memory()
    if hasattr(capi.OrtDevice, "vendor_id"):
        return capi.OrtDevice(kind, memory, NVIDIA_VENDOR_ID, index)
    return capi.OrtDevice(kind, memory, index)


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
        For an unknown device, or CUDA without a CUDA build of onnxruntime.
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
        uninstall = _uninstall_all(installed_onnxruntime_distributions())
        raise ValueError(
            f"device {device!r} needs a CUDA build of onnxruntime, but the loaded one ({loaded_build()}) "
            f"only offers {ort_capi.get_available_providers()}. Install one with "
            f"'{uninstall}{PIP_FIX_GPU}' (onnxruntime-gpu, CUDA 13, backend='onnx') or "
            f"'{uninstall}{PIP_FIX_CUDA}' (the training build's, CUDA 11.8, Linux x86-64, Python 3.10/3.11)."
        )
    from ._cuda import ensure_cuda  # ctypes and the library search: CUDA users only

    ensure_cuda(int(index or 0))
    return Device("cuda", int(index or 0))


def check_device(device: str) -> str:
    """Checks that ``device`` can train here and returns its canonical name (``'cuda:0'``).

    For CUDA: a CUDA build, the NVIDIA driver, the GPU index, and the CUDA and cuDNN libraries
    (CUDA 13 / cuDNN 9 for onnxruntime-gpu, whose CUDA provider it checks a session gets;
    CUDA 11.8 / cuDNN 8 for the training build), which it loads (what the first fit on that
    device would do). Raises
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
