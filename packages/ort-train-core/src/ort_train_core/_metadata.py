"""ort-train's metadata (the ``ort_train.*`` keys :func:`~.graph.add_loss_output` and
:func:`~._batchnorm.with_updates` record) read from a model that may come from anywhere.

A model file is the user's: a forged or stale key must not change what is computed silently
(a ``data_loss_name`` naming a constant made the validation losses constant) nor fail deep in
onnxruntime or in the JSON parser. Each value read is checked against the graph (the names
exist, the data loss is a scalar the loss reads, computed from the label); one that fails is
ignored, as if the key were absent, with a warning naming the key.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

from onnx import ModelProto

from .losses import REDUCTIONS

META_PREFIX = "ort_train."


def _warn(key: str, reason: str) -> None:
    warnings.warn(
        f"ignoring the model's metadata {key!r}: {reason}; the model was edited or saved by "
        "another tool (ort-train goes on as without it: add_loss_output records it again)",
        UserWarning,
        stacklevel=4,
    )


def _inputs(model: ModelProto) -> set[str]:
    return {i.name for i in model.graph.input}


def _outputs(model: ModelProto) -> set[str]:
    return {o.name for o in model.graph.output}


def _name_in(kind: str, names: Callable[[ModelProto], set[str]]) -> Callable[[ModelProto, Any], str | None]:
    def check(model: ModelProto, value: Any) -> str | None:
        if not isinstance(value, str):
            return f"{value!r} is not a string"
        return None if value in names(model) else f"{value!r} is not an {kind} of the graph"

    return check


def _weight_name(model: ModelProto, value: Any) -> str | None:
    return None if value is None else _name_in("input", _inputs)(model, value)


def _prediction_outputs(model: ModelProto, value: Any) -> str | None:
    if not isinstance(value, list):
        return f"{value!r} is not a list of output names"
    return next(filter(None, (_name_in("output", _outputs)(model, v) for v in value)), None)


def _reduction(model: ModelProto, value: Any) -> str | None:
    return None if value in REDUCTIONS else f"{value!r} is not one of {list(REDUCTIONS)}"


def _n_classes(model: ModelProto, value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 2
    return None if ok else f"{value!r} is not an integer >= 2"


def _data_loss_name(model: ModelProto, value: Any) -> str | None:
    """A scalar computed by a node from the label, which the loss reads (the loss without its
    penalty, add_loss_output's)."""
    from .graph import ancestors, output_shape  # graph imports this module

    if not isinstance(value, str):
        return f"{value!r} is not a string"
    produced = {out for node in model.graph.node for out in node.output}
    if value not in produced:
        known = value in _inputs(model) | {i.name for i in model.graph.initializer}
        return f"{value!r} is {'not computed by a node' if known else 'not a value of the graph'}"
    loss = read_metadata(model, "loss_name") or model.graph.output[0].name
    label = read_metadata(model, "label_name") or "label"  # the trainers' default too
    if value not in ancestors(model, [loss])[0]:
        return f"the loss {loss!r} does not read {value!r}"
    if label not in ancestors(model, [value])[0]:
        return f"{value!r} does not depend on the label ({label!r})"
    try:
        _, shape = output_shape(model, value)
    except ValueError:  # onnx cannot type it (an operator of another domain): not checked
        return None
    return None if shape == [] else f"{value!r} is not a scalar (shape {shape})"


#: the check of each key's value: None when it may be used, else why not
_CHECKS: dict[str, Callable[[ModelProto, Any], str | None]] = {
    "loss_name": _name_in("output", _outputs),
    "label_name": _name_in("input", _inputs),
    "weight_name": _weight_name,
    "prediction_outputs": _prediction_outputs,
    "reduction": _reduction,
    "n_classes": _n_classes,
    "data_loss_name": _data_loss_name,
    "score_name": lambda model, value: None if isinstance(value, str) else f"{value!r} is not a string",
    "epoch_loss_weights": lambda model, value: None if value == "rows" else f"{value!r} is not 'rows'",
}


def read_metadata(model: ModelProto, key: str) -> Any:
    """The value of ``ort_train.<key>`` when it is valid JSON and fits the graph, else None
    (with a warning naming the key when it is present but unusable)."""
    text = next((p.value for p in model.metadata_props if p.key == META_PREFIX + key), None)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; nesting beyond the C stack
        _warn(META_PREFIX + key, f"not valid JSON ({type(exc).__name__}: {str(exc)[:80]})")
        return None
    check = _CHECKS.get(key)
    reason = check(model, value) if check is not None else None
    if reason is not None:
        _warn(META_PREFIX + key, reason)
        return None
    return value


def read_updates(model: ModelProto, key: str) -> dict[str, str]:
    """The ``statistic=output;...`` pairs of ``key`` whose statistic is an input or initializer
    of the graph and whose output a node computes; {} (with a warning) when any is not."""
    text = next((p.value for p in model.metadata_props if p.key == key), "")
    pairs = [pair.split("=", 1) for pair in text.split(";") if pair]
    fed = _inputs(model) | {i.name for i in model.graph.initializer}
    produced = {out for node in model.graph.node for out in node.output}
    for pair in pairs:
        if len(pair) != 2:
            _warn(key, f"{pair[0]!r} is not a 'statistic=output' pair")
            return {}
        if pair[0] not in fed or pair[1] not in produced:
            _warn(key, f"{pair[0]!r} or {pair[1]!r} is not a value of the graph")
            return {}
    return dict((s, o) for s, o in pairs)
