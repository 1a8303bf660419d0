"""Reports the largest relative error the oracle measured against each reference (the figure
the coverage table in docs/autodiff.rst quotes)."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from autodiff_oracle import MAX_ERRORS

    if any(MAX_ERRORS.values()):
        worst = ", ".join(f"{ref} {err:.1e}" for ref, err in MAX_ERRORS.items())
        terminalreporter.write_line(f"onnx backend gradient oracle, largest relative error: {worst}")
