"""The gradient room's seam imports no backend, and one module chooses the backend (issue 26,
item 20): ``_gradient`` and ``_ort_training`` imported each other, so a second backend could not
be added without the training build being imported by everything."""

from __future__ import annotations

import ast
import pathlib

import pytest

import ort_train_core
from ort_train_core import _backends
from ort_train_core._gradient import GradientBackend

PACKAGE = pathlib.Path(ort_train_core.__file__).parent
#: the modules that make up onnxruntime-training's backend (they may import each other)
BACKEND_MODULES = {"_ort_training", "_grad_rewrites", "_grad_rewrites_norm_rnn"}


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function, relative ones by their
    last component (``from ._ort_training import x`` -> ``_ort_training``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.module:
                found.add(node.module.rsplit(".", 1)[-1])
            found.update(alias.name for alias in node.names if node.module is None)
        elif isinstance(node, ast.Import):
            found.update(alias.name.rsplit(".", 1)[-1] for alias in node.names)
    return found


def test_the_seam_imports_no_backend() -> None:
    assert not _imported_modules(PACKAGE / "_gradient.py") & BACKEND_MODULES


def test_only_the_backend_names_its_own_modules() -> None:
    """Trainers, adapters and the command line get a backend from ``_backends`` only."""
    offenders = {
        path.name
        for path in PACKAGE.rglob("*.py")
        if path.stem not in BACKEND_MODULES and _imported_modules(path) & BACKEND_MODULES
    }
    assert offenders == set()


def test_one_module_registers_and_chooses_backends() -> None:
    backend = _backends.get_backend()
    # what the seam's protocol declares (it is not runtime-checkable: its attributes, then)
    protocol = {name for name in vars(GradientBackend) if not name.startswith("_")} | {"name"}
    assert all(hasattr(backend, name) for name in protocol)
    assert backend is _backends.get_backend(_backends.DEFAULT_BACKEND) is _backends.default_backend()
    assert backend.name  # part of the graph caches' keys


def test_an_unknown_backend_names_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"unknown gradient backend 'autodiff': choose one of \['onnxruntime-training'\]"
    ):
        _backends.get_backend("autodiff")
