"""The licence each distribution declares and ships (issue 30, item 6).

A build of ``packages/<dist>`` sees that folder only, so each holds a copy of the repository's
LICENSE; these tests keep the copies identical and the metadata consistent with them.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("ort-train-core", "ort-train-sklearn", "ort-train-torch")


def test_root_license_is_mit() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 ort-train developers" in text


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_distribution_ships_the_root_license(dist: str) -> None:
    folder = ROOT / "packages" / dist
    project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (folder / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
