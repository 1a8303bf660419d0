"""What a CUDA session of the onnx backend gets, checked without a GPU (issue 28, item 4): the
TF32 setting and its resolution from torch's flags, the CUDA provider options a session is made
with, the OrtDevice of a GPU (as onnxruntime's own ``OrtDevice.make`` builds it), the check that
onnxruntime-gpu's CUDA provider really loaded, and the ``[gpu]`` extra's requirement."""

from __future__ import annotations

import pathlib
import sys
from types import SimpleNamespace
from typing import Any, ClassVar

import onnx
import pytest
from onnx import TensorProto, helper

import ort_train_core
from ort_train_core import CudaUnavailableError, _binding, _cuda, _runtime, _tf32
from ort_train_core._runtime import Device

packaging_requirements = pytest.importorskip("packaging.requirements")
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _follow_torch(monkeypatch):
    """Each test starts from the default (follow torch) and leaves it so."""
    monkeypatch.setattr(_tf32, "_SETTING", None)


def _torch(matmul: Any, cudnn: Any) -> dict[str, Any]:
    """A stand-in for ``sys.modules`` holding a torch with these two flags."""
    backends = SimpleNamespace(
        cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=matmul)),
        cudnn=SimpleNamespace(allow_tf32=cudnn),
    )
    return {"torch": SimpleNamespace(backends=backends)}


# ---- TF32: the setting and its resolution ----------------------------------------------------


@pytest.mark.parametrize(
    ("matmul", "cudnn", "expected"),
    [(False, True, False), (True, True, True), (True, False, False), (False, False, False)],
)
def test_following_torch_means_tf32_only_where_both_of_its_flags_allow_it(matmul, cudnn, expected):
    # (False, True) are torch's defaults: TF32 for cuDNN convolutions, not for matrix products
    assert _tf32.torch_tf32(_torch(matmul, cudnn)) is expected


def test_without_torch_imported_tf32_is_off_as_with_torch_s_defaults():
    assert _tf32.torch_tf32({}) is False


def test_the_real_torch_flags_are_read_when_torch_is_imported():
    torch = pytest.importorskip("torch")
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, True)
    assert ort_train_core.tf32_enabled() is False  # torch's defaults
    try:  # torch's flags are properties of its own modules: set and restored by hand
        matmul.allow_tf32 = True
        assert ort_train_core.tf32_enabled() is True
        cudnn.allow_tf32 = False
        assert ort_train_core.tf32_enabled() is False
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = False, True


def test_set_tf32_wins_over_torch_and_none_follows_torch_again():
    ort_train_core.set_tf32(True)
    assert ort_train_core.tf32_enabled() is True
    ort_train_core.set_tf32(False)
    assert ort_train_core.tf32_enabled() is False
    ort_train_core.set_tf32(None)
    assert ort_train_core.tf32_enabled() is _tf32.torch_tf32()


@pytest.mark.parametrize("value", [1, 0, "1", "on"])
def test_set_tf32_refuses_anything_but_a_bool_or_none(value):
    with pytest.raises(TypeError, match=r"set_tf32 takes True .*, False .* or None .*, got " + repr(value)):
        ort_train_core.set_tf32(value)
    assert _tf32._SETTING is None


# ---- the provider options a session is made with ----------------------------------------------


def test_a_cuda_device_asks_the_cuda_provider_for_its_gpu_and_the_tf32_setting():
    ort_train_core.set_tf32(False)
    assert Device("cuda", 1).providers == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0"}),
        "CPUExecutionProvider",
    ]
    ort_train_core.set_tf32(True)
    assert Device("cuda", 0).providers[0] == ("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "1"})
    assert Device("cpu").providers == ["CPUExecutionProvider"]


class _RecordingSession:
    """Stands for onnxruntime's C-level InferenceSession: records the providers it was given."""

    made: ClassVar[list[tuple[list[str], list[dict[str, str]]]]] = []

    def __init__(self, options: Any, data: bytes, *flags: bool) -> None:
        pass

    def initialize_session(self, providers: list[str], options: list[dict[str, str]], disabled: set) -> None:
        self.made.append((list(providers), [dict(o) for o in options]))


def _identity_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def test_sessions_get_use_tf32_and_one_made_with_tf32_is_not_reused_without(monkeypatch):
    monkeypatch.setattr(_runtime.ort_capi, "InferenceSession", _RecordingSession)
    monkeypatch.setattr(_binding, "_SESSIONS", _binding.LRUCache(4))
    monkeypatch.setattr(_RecordingSession, "made", [])
    model = _identity_model()
    ort_train_core.set_tf32(False)
    off = _binding.make_session(model, Device("cuda", 0))
    assert _binding.make_session(model, Device("cuda", 0)) is off  # cached
    ort_train_core.set_tf32(True)
    on = _binding.make_session(model, Device("cuda", 0))
    assert on is not off
    assert _RecordingSession.made == [
        (["CUDAExecutionProvider", "CPUExecutionProvider"], [{"device_id": "0", "use_tf32": "0"}, {}]),
        (["CUDAExecutionProvider", "CPUExecutionProvider"], [{"device_id": "0", "use_tf32": "1"}, {}]),
    ]


# ---- the OrtDevice of a GPU --------------------------------------------------------------------


def test_the_gpu_ortdevice_is_the_one_onnxruntime_s_own_make_builds():
    """Stock onnxruntime keys the CUDA provider's allocators by NVIDIA's vendor id too: an
    OrtValue on an OrtDevice without it is not on the session's device."""
    from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

    for index in (0, 1):
        reference = OrtDevice.make("cuda", index)._get_c_device()
        ours = Device("cuda", index).ort_device
        for attribute in ("device_type", "device_id", "vendor_id", "mem_type"):
            if hasattr(reference, attribute):  # the training build's OrtDevice has no vendor
                assert getattr(ours, attribute)() == getattr(reference, attribute)(), attribute


# ---- onnxruntime-gpu's libraries: loaded, then checked -----------------------------------------


def test_a_cuda_provider_that_fell_back_to_cpu_is_an_error_naming_what_preload_said(monkeypatch):
    """onnxruntime-gpu without its CUDA 13 libraries makes a CPU-only session with a log line
    (what onnxruntime-gpu 1.31.1 does on a machine without them), and preload_dlls prints
    instead of raising: a fit on 'cuda' would run on the CPU."""
    import onnxruntime

    def preload() -> None:
        print("Failed to load libcublasLt.so.13: cannot open shared object file")

    monkeypatch.setattr(onnxruntime, "preload_dlls", preload, raising=False)
    with pytest.raises(CudaUnavailableError) as info:
        _cuda.preload_stock_cuda(1, probe=lambda index: ["CPUExecutionProvider"])
    message = str(info.value)
    assert "does not load on cuda:1 (a session there got only ['CPUExecutionProvider'])" in message
    assert "(onnxruntime.preload_dlls said: Failed to load libcublasLt.so.13: cannot open" in message
    assert 'pip install "onnxruntime-gpu[cuda,cudnn]>=1.20"' in message


def test_a_loaded_cuda_provider_passes_the_check(monkeypatch):
    import onnxruntime

    calls: list[int] = []
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: calls.append(0), raising=False)
    asked: list[int] = []

    def probe(index: int) -> list[str]:
        asked.append(index)
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    _cuda.preload_stock_cuda(2, probe=probe)
    assert (calls, asked) == ([0], [2])


def test_the_check_s_session_asks_for_the_cuda_provider_on_that_gpu(monkeypatch):
    monkeypatch.setattr(_runtime.ort_capi, "InferenceSession", _RecordingSession)
    monkeypatch.setattr(_RecordingSession, "made", [])
    monkeypatch.setattr(
        _RecordingSession, "get_providers", lambda self: ["CPUExecutionProvider"], raising=False
    )
    assert _cuda._session_providers(3) == ["CPUExecutionProvider"]
    assert _RecordingSession.made == [
        (["CUDAExecutionProvider", "CPUExecutionProvider"], [{"device_id": "3"}, {}])
    ]


def test_the_check_s_session_runs_on_this_build():
    """The one-node graph is valid for the loaded onnxruntime (here without a GPU: CPU only)."""
    providers = _cuda._session_providers(0)
    assert providers[-1] == "CPUExecutionProvider"
    assert ("CUDAExecutionProvider" in providers) == bool(
        "CUDAExecutionProvider" in _runtime.ort_capi.get_available_providers() and _gpus()
    )


def _gpus() -> int:
    try:
        return _cuda.count_gpus()
    except CudaUnavailableError:
        return 0


# ---- the extras --------------------------------------------------------------------------------


def _extra(package: str, extra: str) -> list[Any]:
    with open(ROOT / "packages" / package / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return [packaging_requirements.Requirement(r) for r in extras[extra]]


def test_the_gpu_extra_installs_onnxruntime_gpu_with_its_nvidia_wheels():
    """onnxruntime-gpu's own extras ``cuda`` and ``cudnn`` (1.21 and later) install NVIDIA's
    CUDA runtime, cuFFT, cuRAND, NVRTC and cuDNN wheels (cuBLAS through cuDNN's), of the CUDA
    major it is built for (13 for 1.31.1, as its metadata on the registry lists them), where
    ``preload_dlls`` finds them: nothing to install by hand but the driver."""
    (req,) = _extra("ort-train-core", "gpu")
    assert (req.name, req.extras, req.marker) == ("onnxruntime-gpu", {"cuda", "cudnn"}, None)
    assert req.specifier.contains("1.31.1")
    assert not req.specifier.contains("1.19.2")
    for adapter in ("ort-train-sklearn", "ort-train-torch"):
        (through,) = _extra(adapter, "gpu")
        assert (through.name, through.extras) == ("ort-train-core", {"gpu"})


def test_the_cuda_extra_stays_the_training_build_s_cuda_11_route():
    names = {r.name: str(r.specifier) for r in _extra("ort-train-core", "cuda")}
    assert names["onnxruntime-training"] == "==1.19.2"
    assert all(n.endswith("-cu11") for n in names if n.startswith("nvidia-"))
