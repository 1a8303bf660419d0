"""onnx's version converter failures in our words: the opset step and the nodes it stops at,
without the C++ assertion text (``helper.cc:68: assertNotParams: Assertion `dim.is_int`
failed: ...``)."""

from __future__ import annotations

import re

import onnx
from onnx import ModelProto, version_converter

#: onnx's C++ context: "/project/onnx/version_converter/helper.cc:68: assertNotParams: Assertion
#: `dim.is_int` failed: " (or an adapter's "file.h:12: adapt: ")
_ASSERTION = re.compile(r"^\S+\.(?:cc|cpp|h):\d+: \w+: (?:Assertion `[^`]*` failed: )?")
_SYMBOLIC = re.compile(r"^(\S+) Dimension is a param instead of an int\.?$")


def _reason(exc: BaseException) -> str:
    text = _ASSERTION.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    symbolic = _SYMBOLIC.match(text)
    if symbolic:
        return (
            f"it needs dimension {symbolic.group(1)!r} as a number and the graph leaves it symbolic "
            "(the converter's adapters handle fixed shapes only)"
        )
    return text.rstrip(".")


def _changed_nodes(model: ModelProto, old: int, new: int) -> list[str]:
    """The default-domain nodes whose operator changes between opsets ``old`` and ``new``."""
    low, high = min(old, new), max(old, new)
    names = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            changed = onnx.defs.get_schema(node.op_type, high).since_version > low
        except onnx.defs.SchemaError:  # not an operator of the default domain at that opset
            changed = True
        if changed:
            names.append(f"{node.name or node.output[0]!r} ({node.op_type})")
    return names


def conversion_error(model: ModelProto, opset: int, target: int, exc: BaseException) -> ValueError:
    """The error for a model onnx's version converter cannot take from ``opset`` to ``target``
    (``exc``): the step it stops at, found by converting one opset at a time, and the nodes
    whose operator changes at that step.

    Parameters
    ----------
    model : onnx.ModelProto
        The model, at ``opset``.
    opset, target : int
        The default-domain opset of the model and the one it was converted to.
    exc : BaseException
        The converter's exception.

    Returns
    -------
    ValueError
        To raise from ``exc``.
    """
    step, current, reason = opset, model, _reason(exc)
    direction = 1 if target > opset else -1
    for version in range(opset + direction, target + direction, direction):
        try:
            current = version_converter.convert_version(current, version)
        except Exception as step_exc:  # onnx raises RuntimeError or its C++ errors
            reason = _reason(step_exc)
            break
        step = version
    nodes = _changed_nodes(model, step, step + direction)
    where = f" at node(s) {', '.join(nodes[:5])}" if nodes else ""
    return ValueError(
        f"the model uses opset {opset} of the default domain; onnxruntime 1.19 runs opsets 13 to 21 "
        f"and onnx's version converter cannot take it to {target}: it stops going from opset {step} "
        f"to {step + direction}{where}: {reason}. Export the model again with target_opset={target}"
    )
