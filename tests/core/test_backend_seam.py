"""The gradient room's seam imports no backend, and one module chooses the backend (issue 26,
item 20): ``_gradient`` and ``_ort_training`` imported each other, so a second backend could not
be added without the training build being imported by everything."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import ort_train_core
from ort_train_core import _backends
from ort_train_core._gradient import GradientBackend

PACKAGE = pathlib.Path(ort_train_core.__file__).parent
#: each backend's modules, by their dotted names (a backend's modules may import each other)
BACKEND_MODULES = {
    "onnxruntime-training": {
        "ort_train_core._ort_training",
        "ort_train_core._grad_rewrites",
        "ort_train_core._grad_rewrites_norm_rnn",
    },
    "onnx": {"ort_train_core.autodiff"},  # the subpackage and everything in it
}
ALL_BACKEND_MODULES = set().union(*BACKEND_MODULES.values())
#: what the seam's protocol declares (it is not runtime-checkable: its attributes, then)
PROTOCOL = {name for name in vars(GradientBackend) if not name.startswith("_")} | {"name"}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module of the package that ``path`` imports, at the top or inside a function, by
    its dotted name (relative imports resolved; ``from . import x`` counts ``x``)."""
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _backend_of(module: str) -> str | None:
    for backend, modules in BACKEND_MODULES.items():
        if any(module == m or module.startswith(m + ".") for m in modules):
            return backend
    return None


def test_the_seam_imports_no_backend() -> None:
    imported = _imported_modules(PACKAGE / "_gradient.py")
    assert {_backend_of(m) for m in imported} == {None}, imported


def test_only_a_backend_names_its_own_modules() -> None:
    """Trainers, adapters and the command line get a backend from ``_backends`` only, and
    neither backend imports the other."""
    offenders = {
        (path.name, module)
        for path in PACKAGE.rglob("*.py")
        for module in _imported_modules(path)
        if _backend_of(module) not in (None, _backend_of(_module_name(path)))
    }
    assert offenders == set()


def test_both_backends_are_registered_and_declare_the_seam() -> None:
    assert set(_backends.BACKENDS) == set(BACKEND_MODULES)
    for name, (module, cls) in _backends.BACKENDS.items():
        assert _backend_of(module) == name
        backend_class = getattr(importlib.import_module(module), cls)
        assert all(hasattr(backend_class, attr) for attr in PROTOCOL), (name, PROTOCOL)


def test_the_variable_names_the_default_backend(monkeypatch) -> None:
    monkeypatch.setenv("ORT_TRAIN_BACKEND", "onnx")
    assert _backends.default_backend_name() == "onnx"
    backend = _backends.get_backend()
    assert backend is _backends.get_backend("onnx") is _backends.default_backend()
    assert backend.name  # part of the graph caches' keys
    monkeypatch.setenv("ORT_TRAIN_BACKEND", " onnxruntime-training ")
    assert _backends.default_backend_name() == "onnxruntime-training"


def test_without_the_variable_what_is_installed_chooses(monkeypatch) -> None:
    from onnxruntime.capi.build_and_package_info import package_name

    monkeypatch.delenv("ORT_TRAIN_BACKEND", raising=False)
    expected = "onnxruntime-training" if package_name.startswith("onnxruntime-training") else "onnx"
    assert _backends.default_backend_name() == expected
    assert _backends.default_backend() is _backends.get_backend(expected)


def test_an_unknown_backend_names_the_choices(monkeypatch) -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown gradient backend 'autodiff': choose one of \['onnx', 'onnxruntime-training'\]",
    ):
        _backends.get_backend("autodiff")
    monkeypatch.setenv("ORT_TRAIN_BACKEND", "torch")
    with pytest.raises(
        ValueError, match=r"unknown gradient backend \$ORT_TRAIN_BACKEND='torch': choose one of"
    ):
        _backends.get_backend()
