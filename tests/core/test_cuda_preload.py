"""The CUDA library preload, on a fake ``site-packages/nvidia`` tree laid out as NVIDIA's
``*-cu11`` wheels install it (checked against the wheels' file lists on PyPI: e.g.
nvidia_cudnn_cu11-8.9.6.50 holds nvidia/cudnn/lib/libcudnn.so.8). No GPU is needed: the loader
is a recorder."""

from __future__ import annotations

import ctypes
import importlib.metadata
import re
from pathlib import Path

import pytest

from ort_train_core import CudaUnavailableError, _cuda
from ort_train_core._cuda import (
    CUDA_LIBRARIES,
    count_gpus,
    ensure_cuda,
    find_cuda_libraries,
    preload_cuda_libraries,
)

#: what the wheels install, written out independently of CUDA_LIBRARIES
WHEEL_FILES = {
    "nvidia-cuda-runtime-cu11": [
        "nvidia/cuda_runtime/lib/libcudart.so.11.0",
        "nvidia/cuda_runtime/lib/libOpenCL.so.1",
    ],
    "nvidia-cublas-cu11": [
        "nvidia/cublas/lib/libcublas.so.11",
        "nvidia/cublas/lib/libcublasLt.so.11",
        "nvidia/cublas/lib/libnvblas.so.11",
    ],
    "nvidia-cudnn-cu11": [
        "nvidia/cudnn/lib/libcudnn.so.8",
        "nvidia/cudnn/lib/libcudnn_ops_infer.so.8",
        "nvidia/cudnn/lib/libcudnn_cnn_infer.so.8",
    ],
    "nvidia-curand-cu11": ["nvidia/curand/lib/libcurand.so.10"],
    "nvidia-cufft-cu11": ["nvidia/cufft/lib/libcufft.so.10", "nvidia/cufft/lib/libcufftw.so.10"],
}
#: the sonames onnxruntime-training 1.19.2's CUDA provider needs (see ORT_FACTS.md)
NEEDED = {
    "libcudart.so.11.0",
    "libcublas.so.11",
    "libcublasLt.so.11",
    "libcudnn.so.8",
    "libcurand.so.10",
    "libcufft.so.10",
}


def _site(root: Path, skip: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> Path:
    for dist, files in WHEEL_FILES.items():
        if dist in skip:
            continue
        for rel in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(b"\x7fELF")
    for rel in extra:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\x7fELF")
    (root / "nvidia" / "__init__.py").write_text("")
    return root


class Recorder:
    """A loader: records what it is asked to load; refuses names in ``absent``."""

    def __init__(self, absent: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[str] = []
        self.absent = absent

    def __call__(self, target: str) -> object:
        if Path(target).name in self.absent or target in self.absent:
            raise OSError(f"{target}: cannot open shared object file: No such file or directory")
        self.calls.append(target)
        return object()


def test_finds_every_needed_library_in_the_wheels_layout(tmp_path):
    site = _site(tmp_path / "site-packages")
    found = find_cuda_libraries([tmp_path / "elsewhere", site])
    assert set(found) == NEEDED
    for soname, path in found.items():
        assert path.is_file()
        assert path.name == soname
        assert path.parent.parent.parent == site / "nvidia"


def test_preload_loads_each_by_full_path_dependencies_first(tmp_path):
    site = _site(tmp_path / "site-packages")
    loader = Recorder()
    loaded = preload_cuda_libraries([site], loader)
    assert loaded == loader.calls
    assert {Path(p).name for p in loaded} == NEEDED
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in loaded)
    order = [Path(p).name for p in loaded]
    # the runtime first; cuBLASLt before cuBLAS (its NEEDED); cuDNN, whose sub-libraries need
    # cuBLAS, last
    assert order[0] == "libcudart.so.11.0"
    assert order.index("libcublasLt.so.11") < order.index("libcublas.so.11") < order.index("libcudnn.so.8")
    assert order[-1] == "libcudnn.so.8"


def test_first_root_wins_as_on_sys_path(tmp_path):
    first, second = _site(tmp_path / "a"), _site(tmp_path / "b")
    found = find_cuda_libraries([first, second])
    assert all(str(p).startswith(str(first)) for p in found.values())


def test_a_library_in_no_wheel_is_loaded_by_soname(tmp_path):
    """A system CUDA 11.8 (LD_LIBRARY_PATH, ld cache) serves what the wheels lack."""
    site = _site(tmp_path / "site-packages", skip=("nvidia-curand-cu11",))
    loader = Recorder()
    loaded = preload_cuda_libraries([site], loader)
    assert "libcurand.so.10" in loaded  # the bare soname: the system loader searches
    assert len(loaded) == len(NEEDED)


def test_missing_library_names_the_wheel_and_the_fix(tmp_path):
    site = _site(tmp_path / "site-packages", skip=("nvidia-cufft-cu11", "nvidia-curand-cu11"))
    loader = Recorder(absent={"libcufft.so.10", "libcurand.so.10"})
    with pytest.raises(CudaUnavailableError) as info:
        preload_cuda_libraries([site], loader)
    msg = str(info.value)
    assert "libcufft.so.10 from nvidia-cufft-cu11" in msg
    assert "libcurand.so.10 from nvidia-curand-cu11" in msg
    assert "pip install onnxruntime-training==1.19.2 nvidia-cuda-runtime-cu11==11.8.89 " in msg
    assert str(site / "nvidia") in msg


def test_cudnn_9_in_place_of_8_is_named(tmp_path):
    """pip may resolve nvidia-cudnn-cu11 to 9.x, whose libcudnn.so.9 the provider cannot use."""
    site = _site(
        tmp_path / "site-packages", skip=("nvidia-cudnn-cu11",), extra=("nvidia/cudnn/lib/libcudnn.so.9",)
    )
    with pytest.raises(
        CudaUnavailableError,
        match=r"libcudnn\.so\.8 from nvidia-cudnn-cu11 \(8\.x, not 9\) "
        r"\(found libcudnn\.so\.9: the wrong major version\)",
    ):
        preload_cuda_libraries([site], Recorder(absent={"libcudnn.so.8"}))


def test_found_but_unloadable_library_gives_the_loader_reason(tmp_path):
    site = _site(tmp_path / "site-packages")
    with pytest.raises(
        CudaUnavailableError, match=r"found but do not load: .*libcublas\.so\.11: .*No such file"
    ):
        preload_cuda_libraries([site], Recorder(absent={"libcublas.so.11"}))


def test_cuda_extra_requires_the_wheels_that_hold_the_libraries():
    """The [cuda] extra of ort-train-core pulls onnxruntime-training and every wheel above,
    cuDNN below 9."""
    requires = importlib.metadata.requires("ort-train-core") or []
    cuda = [r for r in requires if re.search(r"""extra\s*==\s*["']cuda["']""", r)]
    names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in cuda}
    assert names == {"onnxruntime-training", *WHEEL_FILES}
    assert {lib.distribution.split()[0] for lib in CUDA_LIBRARIES} == set(WHEEL_FILES)
    cudnn = next(r for r in cuda if r.lower().startswith("nvidia-cudnn-cu11"))
    assert "<9" in cudnn.replace(" ", "")
    training = next(r for r in cuda if r.lower().startswith("onnxruntime-training"))
    assert "==1.19.2" in training.replace(" ", "")


class FakeDriver:
    """libcuda's cuInit/cuDeviceGetCount with a chosen answer."""

    def __init__(self, count: int, init_status: int = 0) -> None:
        self.count, self.init_status = count, init_status

    def cuInit(self, flags: int) -> int:
        return self.init_status

    def cuDeviceGetCount(self, ref: object) -> int:
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = self.count  # type: ignore[arg-type]
        return 0


def test_gpu_count_from_the_driver():
    assert count_gpus(lambda name: FakeDriver(3)) == 3
    assert count_gpus(lambda name: FakeDriver(0, init_status=100)) == 0  # CUDA_ERROR_NO_DEVICE


def test_missing_driver_says_pip_cannot_fix_it():
    def no_driver(name: str) -> object:
        raise OSError(f"{name}: cannot open shared object file")

    with pytest.raises(
        CudaUnavailableError, match=r"needs the NVIDIA driver, but libcuda\.so\.1 cannot be loaded"
    ):
        count_gpus(no_driver)


def test_driver_error_is_reported():
    with pytest.raises(CudaUnavailableError, match="CUDA error 999"):
        count_gpus(lambda name: FakeDriver(0, init_status=999))


def test_ensure_cuda_checks_the_index_then_preloads_once(tmp_path, monkeypatch):
    monkeypatch.setattr(_cuda, "_READY", set())
    monkeypatch.setattr(_cuda, "uses_cuda11_libraries", lambda: True)  # the training build's
    site = _site(tmp_path / "site-packages")
    libs = Recorder()

    def loader(name: str) -> object:
        return FakeDriver(2) if name == "libcuda.so.1" else libs(name)

    with pytest.raises(
        CudaUnavailableError, match=r"'cuda:2' does not exist: .* 2 GPU\(s\), cuda:0 to cuda:1"
    ):
        ensure_cuda(2, [site], loader)
    assert libs.calls == []
    ensure_cuda(1, [site], loader)
    ensure_cuda(0, [site], loader)
    ensure_cuda(1, [site], loader)
    assert len(libs.calls) == len(NEEDED)  # loaded once per process


def test_onnxruntime_gpu_loads_its_own_libraries_not_cuda_11(tmp_path, monkeypatch):
    """With stock onnxruntime-gpu (CUDA 13), the CUDA 11.8 wheels of the training build are not
    required: onnxruntime's own preload_dlls loads what it links against."""
    import onnxruntime

    monkeypatch.setattr(_cuda, "_READY", set())
    monkeypatch.setattr(_cuda, "uses_cuda11_libraries", lambda: False)
    preloaded: list[int] = []
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: preloaded.append(1), raising=False)
    # the check that the CUDA provider then loads: a session on the GPU gets it
    monkeypatch.setattr(_cuda, "_session_providers", lambda index: ["CUDAExecutionProvider"])
    libs = Recorder()

    def loader(name: str) -> object:
        return FakeDriver(1) if name == "libcuda.so.1" else libs(name)

    ensure_cuda(0, [tmp_path], loader)  # no nvidia/ folder there: the 11.8 preload would raise
    assert libs.calls == []
    assert preloaded == [1]


def test_no_gpu_names_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(_cuda, "_READY", set())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(CudaUnavailableError, match=r"sees no GPU .*CUDA_VISIBLE_DEVICES=''"):
        ensure_cuda(0, [], lambda name: FakeDriver(0))


def test_check_device_prepares_cuda_through_the_preload(monkeypatch):
    """With a CUDA build (faked here), choosing 'cuda:N' checks driver and GPU and preloads the
    libraries before anything is built; its error reaches the caller as it is."""
    from ort_train_core import _runtime, check_device

    monkeypatch.setattr(
        _runtime.ort_capi,
        "get_available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    asked: list[int] = []
    monkeypatch.setattr(_cuda, "ensure_cuda", asked.append)
    assert check_device("CUDA:1") == "cuda:1"
    assert check_device("cuda") == "cuda:0"
    assert asked == [1, 0]
    assert check_device("cpu") == "cpu"
    assert asked == [1, 0]  # nothing for the CPU

    def no_gpu(index: int) -> None:
        raise CudaUnavailableError("device 'cuda:0': the NVIDIA driver sees no GPU")

    monkeypatch.setattr(_cuda, "ensure_cuda", no_gpu)
    with pytest.raises(CudaUnavailableError, match="sees no GPU"):
        check_device("cuda")
