"""The ``cuda`` marker's skip logic for this folder."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of this folder marked ``cuda`` are skipped, with the reason, where onnxruntime
    offers no CUDAExecutionProvider."""
    import onnxruntime

    providers = list(onnxruntime.get_available_providers())
    if "CUDAExecutionProvider" in providers:
        return
    skip = pytest.mark.skip(
        reason=f"needs CUDAExecutionProvider; the installed onnxruntime offers {providers} "
        "(install ort-train-sklearn[cuda] on a machine with a GPU)"
    )
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("cuda") is not None and here in item.path.parents:
            item.add_marker(skip)
