"""Counting the calls of a builder in a test (a module of its own, imported by name like
``step_support``): how the warm-refit and partial_fit-stream tests prove that nothing is
rebuilt."""

from __future__ import annotations

import collections
from typing import Any

import pytest


def count_calls(
    monkeypatch: pytest.MonkeyPatch, counts: collections.Counter[str], owner: Any, name: str
) -> None:
    """Wraps ``owner.name`` for the test so that each call adds one to ``counts[name]``."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
