"""Shape arithmetic folded to constants, for the walk's shape inference only.

An exporter computes a reshape's target from ``Shape`` outputs with ``Slice``, ``Concat`` and
arithmetic (TorchScript's ``nn.MultiheadAttention``: ``Mod`` of constants as a slice's end).
onnx's data propagation stops at operators it does not know (``Mod``): the reshaped value's rank
is then unknown although every input of that arithmetic is constant once the batch is fixed.
:func:`inferred_graph` evaluates such nodes (outputs of at most :data:`SMALL` elements: shapes,
indices, a Resize's scales concatenated from constants;
inputs all constant or the ``Shape`` of a value of static shape) with ``onnx.reference`` and
infers shapes again, until nothing more folds. The differentiated graph itself is not changed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: the largest value folded (shape vectors and indices, not weights)
SMALL = 64
#: rounds of folding and inferring (each round can make shapes static that the next one reads)
ROUNDS = 4
_NOT_FOLDED = frozenset(
    {
        "Dropout",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


def inferred_graph(model: onnx.ModelProto, excluded: Sequence[str] = ()) -> onnx.GraphProto:
    """onnx's shape inference (with data propagation) of ``model`` after folding its shape
    arithmetic; the folded values keep a value_info (type and shape).

    Parameters
    ----------
    model : onnx.ModelProto
        The forward graph.
    excluded : sequence of str
        Names never taken as constants (the differentiated initializers).

    Returns
    -------
    onnx.GraphProto
        The inferred graph.
    """
    known = _constants(model.graph, set(excluded))
    folded_all: dict[str, np.ndarray] = {}
    inferred = _infer(model)
    for _ in range(ROUNDS):
        folded = _fold_round(model, known, _static_shapes(inferred))
        if not folded:
            break
        if not folded_all:  # one copy, then changed in place (the caller's model is kept)
            model = _copy(model)
        known.update(folded)
        folded_all.update(folded)
        _replace_by_initializers(model, folded)
        inferred = _infer(model)
    for name, value in folded_all.items():
        dtype = helper.np_dtype_to_tensor_dtype(value.dtype)
        inferred.value_info.append(helper.make_tensor_value_info(name, dtype, value.shape))
    return inferred


def _infer(model: onnx.ModelProto) -> onnx.GraphProto:
    return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph


def _constants(graph: onnx.GraphProto, excluded: set[str]) -> dict[str, np.ndarray]:
    known = {
        t.name: numpy_helper.to_array(t)
        for t in graph.initializer
        if t.name not in excluded and int(np.prod(t.dims)) <= SMALL
    }
    for node in graph.node:
        if node.op_type != "Constant" or len(node.attribute) != 1:
            continue
        value = helper.get_attribute_value(node.attribute[0])
        if node.attribute[0].name == "value" and int(np.prod(value.dims)) <= SMALL:
            known[node.output[0]] = numpy_helper.to_array(value)
        elif node.attribute[0].name in ("value_int", "value_ints"):
            known[node.output[0]] = np.array(value, dtype=np.int64)
    return known


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    out = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    return out


def _fold_round(
    model: onnx.ModelProto, known: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The integer outputs of the nodes this round can evaluate, in graph order (a node reads
    what an earlier node of the round folded)."""
    folded: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        outputs = [o for o in node.output if o]
        if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDED or not outputs:
            continue
        if all(o in known or o in folded for o in outputs) or node.op_type == "Constant":
            continue
        values: list[np.ndarray | None]
        if node.op_type == "Shape" and node.input[0] in shapes:
            values = [_shape_value(node, shapes[node.input[0]])]
        elif node.input and all(not i or i in known or i in folded for i in node.input):
            values = _evaluate(node, {**known, **folded}, model.opset_import)
        else:
            continue
        for name, value in zip(outputs, values):
            if value is not None and value.dtype.kind in "iubf" and value.size <= SMALL:
                folded[name] = value
    return folded


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    attrs = {a.name: a.i for a in node.attribute}
    return np.array(shape, dtype=np.int64)[attrs.get("start", 0) : attrs.get("end", len(shape))]


def _evaluate(
    node: onnx.NodeProto, known: dict[str, np.ndarray], opsets: Sequence[onnx.OperatorSetIdProto]
) -> list[np.ndarray | None]:
    """``node``'s outputs computed by onnx.reference from the constant values of its inputs."""
    from onnx.reference import ReferenceEvaluator

    names = [i for i in dict.fromkeys(node.input) if i]
    inits = [numpy_helper.from_array(np.asarray(known[i]), i) for i in names]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    sub = helper.make_model(helper.make_graph([node], "fold", [], outputs, inits), opset_imports=list(opsets))
    try:
        return [np.asarray(v) for v in ReferenceEvaluator(sub).run(None, {})]
    except Exception:  # a node onnx.reference cannot run stays unfolded
        return [None for _ in outputs]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _replace_by_initializers(model: onnx.ModelProto, folded: dict[str, np.ndarray]) -> None:
    """Replaces (in place) the nodes whose outputs all folded by initializers of those values."""
    kept = [n for n in model.graph.node if not all(o in folded for o in n.output if o)]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in folded.items())
