"""Makes onnxruntime-training's CUDA provider loadable without LD_LIBRARY_PATH.

The CUDA wheel of onnxruntime-training 1.19.2 is built against CUDA 11.8 and cuDNN 8 and ships
none of their libraries. The ``[cuda]`` extra installs them as NVIDIA's ``nvidia-*-cu11``
wheels, each under ``site-packages/nvidia/<folder>/lib``, a place the dynamic loader never
looks. Loading them here by full path with ``RTLD_GLOBAL``, each after the libraries it needs,
makes them the ones the provider's ``dlopen`` finds by soname when the first CUDA session is made.
A library found in no wheel is looked up by soname (``LD_LIBRARY_PATH``, the ld cache): a system
install of CUDA 11.8 works too.

Stock onnxruntime-gpu (the ``[gpu]`` extra, CUDA 13 and cuDNN 9 in its current wheels, for
``backend='onnx'``) loads its libraries with its own ``onnxruntime.preload_dlls``
(:func:`preload_stock_cuda`), which is then checked by a one-node session on the GPU.

Nothing here runs for ``device='cpu'``, and nothing needs a GPU to be tested: the search roots,
the loader and the session check are parameters.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import site
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._runtime import PIP_FIX_CUDA, PIP_FIX_GPU
from .exceptions import CudaUnavailableError

#: the pip commands of the ``[cuda]`` and ``[gpu]`` extras' runtimes (the wheels they install)
CUDA_EXTRA_FIX = PIP_FIX_CUDA


@dataclass(frozen=True)
class CudaLibrary:
    """One library the CUDA provider links against, and the wheel that ships it."""

    soname: str
    folder: str  # site-packages/nvidia/<folder>/lib
    distribution: str
    #: the major version the provider needs, for the error when another one is installed
    family: str


#: in load order: each library after those it depends on (cuBLAS needs cuBLASLt; cuDNN's
#: sub-libraries, loaded lazily by libcudnn.so.8 from its own folder, need cuBLAS)
CUDA_LIBRARIES: tuple[CudaLibrary, ...] = (
    CudaLibrary("libcudart.so.11.0", "cuda_runtime", "nvidia-cuda-runtime-cu11", "libcudart.so.*"),
    CudaLibrary("libcublasLt.so.11", "cublas", "nvidia-cublas-cu11", "libcublasLt.so.*"),
    CudaLibrary("libcublas.so.11", "cublas", "nvidia-cublas-cu11", "libcublas.so.*"),
    CudaLibrary("libcufft.so.10", "cufft", "nvidia-cufft-cu11", "libcufft.so.*"),
    CudaLibrary("libcurand.so.10", "curand", "nvidia-curand-cu11", "libcurand.so.*"),
    CudaLibrary("libcudnn.so.8", "cudnn", "nvidia-cudnn-cu11 (8.x, not 9)", "libcudnn.so.*"),
)

#: the NVIDIA driver's library: installed with the driver, never by pip
DRIVER_LIBRARY = "libcuda.so.1"


def search_roots() -> list[Path]:
    """Folders that may hold ``nvidia/<folder>/lib``: sys.path, then the site folders."""
    roots: list[Path] = []
    candidates: list[str] = [p for p in sys.path if p]
    with contextlib.suppress(AttributeError):  # some embedded interpreters lack it
        candidates.extend(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    for entry in candidates:
        path = Path(entry)
        if path not in roots and (path / "nvidia").is_dir():
            roots.append(path)
    return roots


def find_cuda_libraries(roots: Iterable[Path]) -> dict[str, Path]:
    """soname -> path of each library found in the wheels' layout under ``roots`` (the first
    root that has it wins, as sys.path order decides imports)."""
    found: dict[str, Path] = {}
    roots = list(roots)
    for lib in CUDA_LIBRARIES:
        for root in roots:
            path = Path(root) / "nvidia" / lib.folder / "lib" / lib.soname
            if path.is_file():
                found[lib.soname] = path
                break
    return found


def _other_versions(roots: Sequence[Path], lib: CudaLibrary) -> list[str]:
    """Other major versions of ``lib`` in the wheels' layout (cuDNN 9 in place of 8...)."""
    names: set[str] = set()
    for root in roots:
        folder = Path(root) / "nvidia" / lib.folder / "lib"
        if folder.is_dir():
            names.update(p.name for p in folder.glob(lib.family) if p.name != lib.soname)
    return sorted(names)


Loader = Callable[[str], Any]


def _dlopen_global(path: str) -> Any:
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def preload_cuda_libraries(roots: Sequence[Path] | None = None, loader: Loader = _dlopen_global) -> list[str]:
    """Loads every library of :data:`CUDA_LIBRARIES`, from the wheels when they are there,
    else by soname; returns what was loaded (paths or sonames), in order.

    Raises :class:`CudaUnavailableError` naming each library that neither place has, the wheel
    that provides it and the pip command; a library found but not loadable is named with the
    loader's reason.
    """
    roots = search_roots() if roots is None else list(roots)
    in_wheels = find_cuda_libraries(roots)
    loaded: list[str] = []
    missing: list[str] = []
    broken: list[str] = []
    for lib in CUDA_LIBRARIES:
        target = str(in_wheels[lib.soname]) if lib.soname in in_wheels else lib.soname
        try:
            loader(target)
        except OSError as exc:
            if lib.soname in in_wheels:
                broken.append(f"{target}: {exc}")
                continue
            others = _other_versions(roots, lib)
            seen = f" (found {', '.join(others)}: the wrong major version)" if others else ""
            missing.append(f"{lib.soname} from {lib.distribution}{seen}")
            continue
        loaded.append(target)
    if missing or broken:
        lines = []
        if missing:
            where = ", ".join(str(Path(r) / "nvidia") for r in roots) or "no nvidia/ folder on sys.path"
            lines.append(
                "onnxruntime-training 1.19.2's CUDA provider needs CUDA 11.8 and cuDNN 8 libraries that "
                f"are not installed: {'; '.join(missing)}. Searched {where} and the system loader "
                f"(LD_LIBRARY_PATH, ldconfig). Install them with: {CUDA_EXTRA_FIX}"
            )
        if broken:
            lines.append("these CUDA libraries were found but do not load: " + "; ".join(broken))
        raise CudaUnavailableError("\n".join(lines))
    return loaded


def count_gpus(loader: Loader = _dlopen_global) -> int:
    """The number of GPUs the NVIDIA driver reports (``cuInit`` + ``cuDeviceGetCount``).

    Raises :class:`CudaUnavailableError` when the driver library is missing or fails to start:
    no wheel provides it.
    """
    try:
        driver = loader(DRIVER_LIBRARY)
    except OSError as exc:
        raise CudaUnavailableError(
            f"device 'cuda' needs the NVIDIA driver, but {DRIVER_LIBRARY} cannot be loaded ({exc}). "
            "Install the NVIDIA driver (pip cannot); in a container, run it with GPU access "
            "(e.g. docker run --gpus all)."
        ) from exc
    status = driver.cuInit(0)
    count = ctypes.c_int(0)
    if status == 0:
        status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status == 100:  # CUDA_ERROR_NO_DEVICE
        return 0
    if status != 0:
        raise CudaUnavailableError(
            f"the NVIDIA driver failed to start (cuInit/cuDeviceGetCount returned CUDA error {status}); "
            "check nvidia-smi, and CUDA_VISIBLE_DEVICES if it is set"
        )
    return int(count.value)


_READY: set[int] = set()


def ensure_cuda(index: int, roots: Sequence[Path] | None = None, loader: Loader = _dlopen_global) -> None:
    """Checks driver and GPU ``index``, and preloads the libraries once per process."""
    if index in _READY:
        return
    n = count_gpus(loader)
    if n == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r} hides them?)" if visible is not None else ""
        raise CudaUnavailableError(f"device 'cuda:{index}': the NVIDIA driver sees no GPU{hint}")
    if index >= n:
        raise CudaUnavailableError(
            f"device 'cuda:{index}' does not exist: the NVIDIA driver sees {n} GPU(s), cuda:0 to cuda:{n - 1}"
        )
    if not _READY:
        if uses_cuda11_libraries():
            preload_cuda_libraries(roots, loader)
        else:
            preload_stock_cuda(index)
    _READY.add(index)


def uses_cuda11_libraries() -> bool:
    """Whether the loaded onnxruntime is the training build, whose CUDA provider links against
    CUDA 11.8 and cuDNN 8 (the ``[cuda]`` extra's wheels); onnxruntime-gpu (``[gpu]``) brings its
    own CUDA 13 dependencies."""
    from ._runtime import is_training_build, ort_capi

    return is_training_build(ort_capi)


GPU_EXTRA_FIX = PIP_FIX_GPU


def preload_stock_cuda(index: int = 0, probe: Callable[[int], list[str]] | None = None) -> None:
    """Loads onnxruntime-gpu's CUDA and cuDNN libraries with its own loader
    (``onnxruntime.preload_dlls``, onnxruntime 1.21+, from the ``nvidia-*`` wheels that
    ``onnxruntime-gpu[cuda,cudnn]`` installs, else from the system), then checks that a session
    on GPU ``index`` gets the CUDA provider.

    ``preload_dlls`` prints what it cannot load instead of raising, and a session whose CUDA
    provider cannot load its libraries falls back to the CPU provider with only a log line:
    without this check a fit on ``'cuda'`` would run on the CPU.

    Parameters
    ----------
    index : int, default=0
        The GPU the check's session runs on.
    probe : callable, optional
        ``probe(index)`` -> the providers of a session made on that GPU (a one-node graph;
        the parameter lets tests run without a GPU).

    Raises
    ------
    CudaUnavailableError
        Naming the providers the session got, what ``preload_dlls`` printed, and the fix.
    """
    import onnxruntime

    preload = getattr(onnxruntime, "preload_dlls", None)
    printed = io.StringIO()
    if preload is not None:
        with contextlib.redirect_stdout(printed):
            preload()
    providers = (probe or _session_providers)(index)
    if "CUDAExecutionProvider" in providers:
        return
    said = " ".join(printed.getvalue().split())
    raise CudaUnavailableError(
        f"onnxruntime-gpu's CUDA provider does not load on cuda:{index} (a session there got only "
        f"{providers}): its CUDA 13 / cuDNN 9 libraries are missing or of another major version"
        + (f" (onnxruntime.preload_dlls said: {said})" if said else "")
        + f". Install them with: {GPU_EXTRA_FIX} (onnxruntime-gpu and NVIDIA's wheels of them), "
        "or a system CUDA and cuDNN of the majors onnxruntime.get_build_info() names"
    )


def _session_providers(index: int) -> list[str]:
    """The providers of a one-node session made on GPU ``index`` with the CUDA provider first."""
    from onnx import TensorProto, helper

    from ._runtime import ort_capi

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "cuda_check",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    # IR 7: every onnxruntime this runs on reads it (onnx's newest may be past the build's)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    so = ort_capi.SessionOptions()
    so.log_severity_level = 4  # the fallback's log line: our error says it
    sess = ort_capi.InferenceSession(so, model.SerializeToString(), False, False)
    sess.initialize_session(
        ["CUDAExecutionProvider", "CPUExecutionProvider"], [{"device_id": str(index)}, {}], set()
    )
    return list(sess.get_providers())
