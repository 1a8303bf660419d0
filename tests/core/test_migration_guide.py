"""The code blocks of docs/migration_onnxcustom.rst run as written (issue 18, item 1): each
block runs after the previous ones, in one namespace, and its asserts compare with numpy or
scikit-learn."""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")

GUIDE = pathlib.Path(__file__).parents[2] / "docs" / "migration_onnxcustom.rst"


def _blocks(text: str) -> list[str]:
    """The bodies of the ``.. code-block:: python`` directives, dedented."""
    out = []
    for match in re.finditer(r"^\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", text, flags=re.MULTILINE):
        out.append(textwrap.dedent(match.group(1)))
    return out


def test_the_guide_runs_as_written() -> None:
    blocks = _blocks(GUIDE.read_text(encoding="utf-8"))
    assert len(blocks) == 5
    namespace: dict[str, object] = {}
    for k, code in enumerate(blocks):
        exec(compile(code, f"{GUIDE.name} block {k + 1}", "exec"), namespace)
