"""Shared by every test folder: the ``cuda`` marker skips, with the reason and the fix, where
onnxruntime offers no CUDAExecutionProvider or the driver sees no GPU."""

from __future__ import annotations

import pytest

# Imported before anything else touches onnxruntime: the package masks the torch-importing
# probe of ``import onnxruntime`` (a second of start-up saved).
import ort_train_core  # noqa: F401

#: the distribution whose ``[cuda]`` extra a test folder needs
_PACKAGES = {
    "core": "ort-train-core",
    "sklearn_adapter": "ort-train-sklearn",
    "torch_adapter": "ort-train-torch",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import onnxruntime

    providers = list(onnxruntime.get_available_providers())
    if "CUDAExecutionProvider" in providers:
        from ort_train_core import CudaUnavailableError
        from ort_train_core._cuda import count_gpus

        try:
            n_gpus = count_gpus()
            why = "the NVIDIA driver sees no GPU"
        except CudaUnavailableError as exc:
            n_gpus, why = 0, str(exc)
        if n_gpus:
            return
        reason = f"needs a GPU: {why}"
    else:
        reason = f"needs CUDAExecutionProvider; the installed onnxruntime offers {providers}"
    for item in items:
        if item.get_closest_marker("cuda") is None:
            continue
        folder = item.path.parent.name
        package = _PACKAGES.get(folder, "ort-train-core")
        item.add_marker(
            pytest.mark.skip(
                reason=f"{reason} (install {package}[gpu] (onnxruntime-gpu) or {package}[cuda] "
                "(the training build's CUDA 11.8 route) on a machine with a GPU)"
            )
        )
