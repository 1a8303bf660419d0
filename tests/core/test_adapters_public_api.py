"""The adapters build on core's public API only (issue 26, item 21): the scikit-learn package
imported ``ort_train_core._binding``, ``_cache``, ``_data``, ``_loss_trainer`` and ``_runtime``
and called a trainer's ``_current_state`` and ``_carry_progress``. Their needs have a public form
(:mod:`ort_train_core.extending`, ``training_state``/``continue_progress``), checked here on the
source and on a rebuilt trainer's progress against numpy's SGD."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import ort_train_core
from ort_train_core import OrtGradientOptimizer, add_loss_output, extending

ROOT = pathlib.Path(__file__).resolve().parents[2]
ADAPTERS = [ROOT / "packages" / name / "src" for name in ("ort-train-sklearn", "ort-train-torch")]
#: private attributes of core's trainers (methods and attributes they set on themselves)
CORE = pathlib.Path(ort_train_core.__file__).parent


def _adapter_files() -> list[pathlib.Path]:
    return sorted(p for src in ADAPTERS for p in src.rglob("*.py"))


def _core_private_names() -> set[str]:
    names: set[str] = set()
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef) and item.name.startswith("_"):
                        names.add(item.name)
                    is_self = isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name)
                    if is_self and item.value.id == "self" and item.attr.startswith("_"):  # type: ignore[attr-defined]
                        names.add(item.attr)  # type: ignore[attr-defined]
    return {n for n in names if not n.startswith("__")}


def test_adapters_import_no_private_core_module() -> None:
    found = []
    for path in _adapter_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            found += [f"{path.name}:{node.lineno} {m}" for m in modules if m.startswith("ort_train_core._")]
    assert found == []


def test_adapters_reach_into_no_core_object() -> None:
    """No ``obj._name`` where ``_name`` is a private member of a core class and ``obj`` is not
    the adapter's own ``self``/``cls``/``super()``."""
    private = _core_private_names()
    found = []
    for path in _adapter_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        own |= {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in private - own):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_extending_exports_what_it_lists() -> None:
    assert sorted(extending.__all__) == sorted(
        n for n in vars(extending) if not n.startswith("_") and n != "annotations"
    )
    assert extending.Device is ort_train_core.Device


def _linear(weight: np.ndarray) -> object:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return add_loss_output(model)


def test_progress_moves_between_trainers() -> None:
    """A trainer continuing another's training_state counts on from its steps and samples (the
    per-step schedules and Adam's bias corrections read them); its weights are its own."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 3)).astype(np.float32)
    y = (X @ np.array([[1.0], [-2.0], [0.5]])).astype(np.float32)
    w0 = np.zeros((3, 1), np.float32)
    kw = dict(max_iter=1, batch_size=8, shuffle=False, learning_rate=0.05, warm_start=True)
    first = OrtGradientOptimizer(_linear(w0), **kw).fit(X, y)
    progress = first.training_state()
    assert (progress.n_steps, progress.n_samples) == (1, 8)
    progress.weights["W"][:] = 123.0  # a copy: the first trainer's weights stay
    assert np.all(first.get_state()["W"] != 123.0)
    second = OrtGradientOptimizer(_linear(first.get_state()["W"]), **kw)
    second.continue_progress(progress)
    assert np.all(second.get_state()["W"] != 123.0)  # the weights stay this trainer's
    second.fit(X, y)
    # numpy: two SGD steps on the mean squared error
    W = w0.astype(np.float64)
    for _ in range(2):
        W = W - 0.05 * 2 * X.T.astype(np.float64) @ (X @ W - y) / len(X)
    np.testing.assert_allclose(second.get_state()["W"], W, rtol=1e-5, atol=1e-6)
    state = second.training_state()
    assert (state.n_steps, state.n_samples) == (2, 16)
