"""Shared by every test folder: the ``cuda`` marker skips, with the reason and the fix, where
onnxruntime offers no CUDAExecutionProvider or the driver sees no GPU."""

from __future__ import annotations

import re
from typing import Any

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


#: the operator families issue 28 gives the ``onnx`` backend (convolution and pooling,
#: normalisation, recurrences, resizing): a test failing on the onnx backend only because one of
#: them is on its path reports as skipped, naming the operator, not as passed nor as failed
_ISSUE_28 = re.compile(
    r"has no gradient rule for operator (?:com\.microsoft\.)?("
    r"Conv|ConvTranspose|MaxPool|AveragePool|GlobalAveragePool|GlobalMaxPool|LpPool|"
    r"BatchNormalization|LayerNormalization|InstanceNormalization|GroupNormalization|"
    r"LpNormalization|LSTM|GRU|RNN|Resize|Upsample)\b"
)


def _issue_28_operator(exc: BaseException | None) -> str | None:
    from ort_train_core.exceptions import GraphNotDifferentiableError

    seen = 0
    while exc is not None and seen < 8:  # the error itself, or what it was raised from
        if isinstance(exc, GraphNotDifferentiableError):
            found = _ISSUE_28.search(str(exc))
            if found:
                return found.group(1)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    from ort_train_core._backends import default_backend

    if default_backend().name != "onnx":
        return
    op = _issue_28_operator(call.excinfo.value)
    if op is None:  # the command line prints the error (inspect's report, fit's exit 2)
        found = _ISSUE_28.search(f"{call.excinfo.value}\n{report.capstderr}\n{report.capstdout}")
        op = found.group(1) if found else None
    if op is not None:
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            f"Skipped: the onnx backend has no {op} rule yet (issue 28)",
        )
