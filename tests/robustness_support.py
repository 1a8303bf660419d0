"""What the three hypothesis robustness suites (core, sklearn, torch) share: one settings
profile, the per-kind count of outcomes each writes as JSON to ``$ROBUSTNESS_REPORT``, and the
check that a drawn case was refused or accepted as it must be."""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

#: kind -> outcome (an exception's class name, or "ok") -> count
Outcomes = dict[str, Counter[str]]


def robust_settings(examples: int) -> settings:
    """Reproducible (derandomized, no example database) and free of timing health checks: a
    fit's first call builds graphs and sessions."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def new_outcomes() -> Outcomes:
    return defaultdict(Counter)


def outcome_report(name: str, outcomes: Outcomes) -> Callable[[], Iterator[None]]:
    """A module-scoped autouse fixture that writes ``outcomes`` to ``$ROBUSTNESS_REPORT/<name>.json``
    after the module's tests (assign it to a module-level name)."""

    @pytest.fixture(scope="module", autouse=True)
    def _report_outcomes() -> Iterator[None]:
        yield
        folder = os.environ.get("ROBUSTNESS_REPORT")
        if folder:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{name}.json"), "w") as f:
                json.dump({k: dict(v) for k, v in sorted(outcomes.items())}, f, indent=1, sort_keys=True)

    return _report_outcomes


def raised_as_expected(case: Any, error: BaseException | None) -> bool:
    """Asserts that a drawn ``case`` (``kind``, ``error``: the exception type(s) it must raise or
    None, ``match``: a regex of the message) got the outcome it must: the expected error with a
    matching message, or acceptance. Returns whether an error was raised."""
    if error is not None:
        assert case.error is not None, f"{case.kind}: unexpected {type(error).__name__}: {error}"
        assert isinstance(error, case.error), f"{case.kind}: {type(error).__name__}: {error}"
        assert re.search(case.match, str(error)), f"{case.kind}: message {str(error)!r} !~ {case.match!r}"
        return True
    assert case.error is None, f"{case.kind}: accepted, expected {case.error} ({case.match})"
    return False
