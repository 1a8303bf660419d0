"""skl2onnx converters for the estimators of this package, so that ``skl2onnx.to_onnx`` converts a
Pipeline holding them: each estimator's part of the converted graph is its own ``to_onnx()``
graph (in the input's float type), its names prefixed to stay apart from the other steps'.

They are registered when skl2onnx is imported: at once if it is already, else by an import hook
that waits for it (importing skl2onnx here would add about 0.2 s to every import of this
package, which converts with it only on request).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, compose, version_converter

from ort_train_core.graph import rename_value

#: the options a classifier declares, as skl2onnx's own classifiers: its parser then appends the
#: ZipMap (or not) and the class labels on request
CLASSIFIER_OPTIONS = {
    "zipmap": [True, False, "columns"],
    "nocl": [True, False],
    "output_class_labels": [False, True],
}


def register() -> None:
    """Registers a converter, a shape calculator and (classifiers) skl2onnx's options for every
    public estimator of ``ort_train_sklearn`` (skl2onnx's ``update_registered_converter``)."""
    from skl2onnx import update_registered_converter

    import ort_train_sklearn

    for name in ort_train_sklearn.__all__:
        cls = getattr(ort_train_sklearn, name)
        if not isinstance(cls, type):
            continue
        options = CLASSIFIER_OPTIONS if getattr(cls, "_is_classifier", False) else None
        update_registered_converter(cls, f"OrtTrain{name}", _shape, _convert, options=options)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers the converters once skl2onnx is imported: it wraps skl2onnx's loader so that
    :func:`register` runs right after the module has run, then leaves ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != "skl2onnx":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _register_or_warn()

        loader.exec_module = exec_module
        return spec


def register_when_imported() -> None:
    """Registers the converters now if skl2onnx is imported, else when it is; nothing when it
    is not installed."""
    if "skl2onnx" in sys.modules:
        _register_or_warn()
    elif importlib.util.find_spec("skl2onnx") is not None:
        sys.meta_path.insert(0, _RegisterOnImport())


def _register_or_warn() -> None:
    # a registration that fails must not break the import of skl2onnx: the Pipelines holding
    # these estimators then fail to convert, and this says why
    try:
        register()
    except Exception as exc:  # any change of skl2onnx's registration API
        warnings.warn(
            f"ort_train_sklearn could not register its skl2onnx converters ({exc!r}): skl2onnx.to_onnx "
            "will not convert Pipelines holding its estimators; convert each with its to_onnx()",
            RuntimeWarning,
            stacklevel=2,
        )


def _deployed(operator: Any) -> ModelProto:
    """The estimator's ``to_onnx()`` graph in the float type of the operator's input."""
    from skl2onnx.common.data_types import DoubleTensorType

    estimator = operator.raw_operator
    dtype = np.float64 if isinstance(operator.inputs[0].type, DoubleTensorType) else np.float32
    model: ModelProto = estimator.to_onnx(dtype)
    inits = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1 or len(model.graph.output) != len(operator.outputs):
        raise ValueError(
            f"{type(estimator).__name__}'s graph takes {inputs} and gives "
            f"{[o.name for o in model.graph.output]}: a Pipeline step converts with one input and "
            f"{len(operator.outputs)} output(s); convert the estimator with its to_onnx() instead"
        )
    return model


def _tensor_type(value: Any) -> Any:
    """skl2onnx's type of a graph output (element type and shape, free dims as None)."""
    from skl2onnx.common import data_types as dt

    types = {
        TensorProto.FLOAT: dt.FloatTensorType,
        TensorProto.DOUBLE: dt.DoubleTensorType,
        TensorProto.INT64: dt.Int64TensorType,
        TensorProto.STRING: dt.StringTensorType,
        TensorProto.BOOL: dt.BooleanTensorType,
    }
    tensor = value.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    return types[tensor.elem_type](shape)


def _shape(operator: Any) -> None:
    """skl2onnx's shape calculator: the outputs' types are those of the estimator's graph."""
    for variable, value in zip(operator.outputs, _deployed(operator).graph.output):
        variable.type = _tensor_type(value)


def _convert(scope: Any, operator: Any, container: Any) -> None:
    """skl2onnx's converter: the estimator's graph, its names prefixed (subgraphs included), its
    input and outputs renamed to the operator's, at the opset of the rest of the graph."""
    model = _at_opset(_deployed(operator), container.target_opset_onnx, operator.raw_operator)
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    edges = [next(i.name for i in graph.input if i.name not in inits), *(o.name for o in graph.output)]
    prefix = scope.get_unique_variable_name(f"{type(operator.raw_operator).__name__}_")
    model = compose.add_prefix(model, prefix + "_")
    for old, variable in zip(edges, [operator.inputs[0], *operator.outputs]):
        rename_value(model, prefix + "_" + old, variable.full_name)
    container.initializers.extend(model.graph.initializer)
    versions = {o.domain: o.version for o in model.opset_import}
    for node in model.graph.node:
        container.nodes.append(node)
        container.node_domain_version_pair_sets.add((node.domain, versions.get(node.domain)))


def _at_opset(model: ModelProto, target: int | None, estimator: Any) -> ModelProto:
    """``model`` converted to the default-domain opset ``target`` of the skl2onnx conversion
    (an operator's meaning may change between opsets: ReduceMean's axes became an input in 18)."""
    own = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if target is None or own is None or own == target:
        return model
    if own > target:
        raise ValueError(
            f"{type(estimator).__name__}'s graph needs opset {own}: convert with skl2onnx.to_onnx(..., "
            f"target_opset={own}) or higher (got {target})"
        )
    converted: ModelProto = version_converter.convert_version(model, target)
    return converted
