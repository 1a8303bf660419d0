"""Rewrites of normalisations and recurrent layers that onnxruntime-training 1.19.2 cannot
differentiate, for :func:`._grad_rewrites.rewrite_for_gradient` (its ``_REWRITERS`` table).

* ``InstanceNormalization`` (torch's GroupNorm and InstanceNorm export to it) and
  ``GroupNormalization`` (opset 18: scale and bias per group; 21: per channel) have no
  gradient: written with Reshape, ReduceMean, Sub, Mul, Sqrt, Div and Add, the statistics over
  the flattened ``[N, C or groups, -1]`` view (any rank, any dimension free), then the
  affine part, reshaped back to the input's shape.
* ``LSTM`` and ``GRU``: the training build's LSTMTraining/GRUTraining kernels and their
  gradients run only the forward direction with ``layout=0``, no ``sequence_lens``, the
  default activations, no ``clip`` (and ``input_forget=0``); and its gradient builder reads
  optional inputs by position, so a node without its trailing optional inputs (``[X, W, R,
  B]``) fails with a type error on the gradient node. The trailing inputs are added (empty); a
  ``reverse`` or ``bidirectional`` node becomes one forward node per direction, each on its
  slice of ``W``, ``R``, ``B``, ``initial_h``, ``initial_c``, ``P`` (axis 0), the reverse one on
  the sequence reversed along time (a Gather of ``Range(T - 1, -1, -1)``) with its ``Y``
  reversed back; ``Y`` is concatenated on the direction axis (``[T, D, N, H]``), ``Y_h`` and
  ``Y_c`` on axis 0, as ONNX defines them. ``layout=1`` is transposed to ``layout=0`` around
  the nodes. The weights keep their names and shapes: their gradients flow back through the
  slices. ``sequence_lens``, other activations, ``clip`` and ``input_forget`` are refused,
  naming the node.

This module imports nothing of ``_grad_rewrites`` at import time (that module imports this
one): the graph handed to the rewriters is only read through ``graph.model``,
``graph.elem_type``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from ._builder import NodeBuilder
from .exceptions import GraphNotDifferentiableError
from .graph import _opset

if TYPE_CHECKING:
    from ._grad_rewrites import _Graph


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes by name (strings as bytes, lists of ints as lists)."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _emit(b: NodeBuilder, op_type: str, inputs: Sequence[str], output: str, **attrs: Any) -> None:
    """A node writing the given (existing) output name."""
    b.nodes.append(helper.make_node(op_type, list(inputs), [output], name=b.name(f"n_{op_type}"), **attrs))


# ---- InstanceNormalization, GroupNormalization -------------------------------------------------
def _standardised(b: NodeBuilder, x: str, epsilon: float, opset: int, dtype: Any) -> str:
    """``(x - mean) / sqrt(var + epsilon)`` over the last axis of ``x`` (population variance, as
    ONNX and torch define the normalisations)."""

    def mean(value: str, hint: str) -> str:
        if opset >= 18:  # ReduceMean takes its axes as an input from opset 18
            return b.op("ReduceMean", [value, b.int_const([-1])], hint, keepdims=1)
        return b.op("ReduceMean", [value], hint, axes=[-1], keepdims=1)

    centred = b.op("Sub", [x, mean(x, "norm_mean")], "norm_centred")
    variance = mean(b.op("Mul", [centred, centred], "norm_squares"), "norm_variance")
    shifted = b.op("Add", [variance, b.const(epsilon, "norm_epsilon", dtype=dtype)], "norm_shifted")
    return b.op("Div", [centred, b.op("Sqrt", [shifted], "norm_std")], "norm_standardised")


def _affine(b: NodeBuilder, flat: str, scale: str, bias: str, shape: str, output: str) -> None:
    """``output = Reshape(flat * scale[:, None] + bias[:, None], shape)`` for a ``flat`` of
    shape ``[N, K, L]`` and a scale and bias of shape ``[K]``."""
    axis = b.int_const([1], "affine_axis")
    scaled = b.op("Mul", [flat, b.op("Unsqueeze", [scale, axis], "norm_scale")], "norm_scaled")
    shifted = b.op("Add", [scaled, b.op("Unsqueeze", [bias, axis], "norm_bias")], "norm_affine")
    _emit(b, "Reshape", [shifted, shape], output)


def _normalisation(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph, groups: int | None) -> None:
    """InstanceNormalization (``groups=None``) or GroupNormalization of ``groups`` groups."""
    x, scale, bias = node.input
    attrs = _attrs(node)
    opset = _opset(graph.model)
    dtype = helper.tensor_dtype_to_np_dtype(graph.elem_type(x))
    shape = b.op("Shape", [x], "norm_input_shape")
    view = b.int_const([0, groups or 0, -1], "norm_view")  # 0: the input's dimension
    standard = _standardised(
        b, b.op("Reshape", [x, view], "norm_flat"), attrs.get("epsilon", 1e-5), opset, dtype
    )
    if groups is not None and opset >= 21:  # scale and bias per channel: back to [N, C, -1]
        whole = b.op("Reshape", [standard, shape], "norm_grouped")
        standard = b.op("Reshape", [whole, b.int_const([0, 0, -1], "norm_channels")], "norm_flat")
    _affine(b, standard, scale, bias, shape, node.output[0])


def instance_norm(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """InstanceNormalization (no gradient in onnxruntime-training) with primitives: the
    statistics of each ``x[n, c]`` over its other axes, then ``* scale[c] + bias[c]``."""
    _normalisation(b, node, graph, None)


def group_norm(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """GroupNormalization (no gradient in onnxruntime-training) with primitives: the statistics
    of each group of ``C / num_groups`` channels, then the affine part per group (opset 18) or
    per channel (opset 21)."""
    _normalisation(b, node, graph, int(_attrs(node)["num_groups"]))


# ---- LSTM, GRU ---------------------------------------------------------------------------------
#: operator -> (its input count, the positions of its inputs with a direction axis 0: W, R, B,
#: initial_h (and initial_c, P), the number of its outputs, its default activations)
_RECURRENT = {
    "LSTM": (8, (1, 2, 3, 5, 6, 7), 3, ("sigmoid", "tanh", "tanh")),
    "GRU": (6, (1, 2, 3, 5), 2, ("sigmoid", "tanh")),
}
#: the positions of the per-direction inputs whose axis 1 is the batch in layout 0
_STATES = (5, 6)


#: the operators rewritten even where no differentiated value reaches them: onnxruntime's module
#: graph builder swaps every LSTM/GRU for its forward-only training kernel (a frozen
#: bidirectional layer failed at session creation on the partial loop and OnnxModule)
ALWAYS_REWRITTEN = frozenset(_RECURRENT)


def _unsupported(node: onnx.NodeProto, attrs: dict[str, Any]) -> list[str]:
    """What the training build's LSTM/GRU kernels do not compute, of what ``node`` uses."""
    defaults = _RECURRENT[node.op_type][3]
    names = [a.decode().lower() for a in attrs.get("activations", [])]
    return [
        what
        for what, bad in (
            ("sequence_lens (sequences of several lengths)", len(node.input) > 4 and bool(node.input[4])),
            (f"activations {names}", bool(names) and any(n != d for n, d in zip(names, defaults * 2))),
            ("clip", "clip" in attrs),
            ("input_forget=1", bool(attrs.get("input_forget", 0))),
        )
        if bad
    ]


def _refusal(node: onnx.NodeProto, unsupported: list[str]) -> GraphNotDifferentiableError:
    """The error naming the node and what its kernels do not compute."""
    from ._grad_rewrites import _operator  # that module imports this one

    defaults = _RECURRENT[node.op_type][3]
    return GraphNotDifferentiableError(
        f"{_operator(node)}: onnxruntime-training's {node.op_type} gradient does not compute "
        f"{' and '.join(unsupported)}; export the layer without them (pad the sequences to one "
        f"length; default activations {', '.join(defaults)}), or leave the weights before the node "
        "out of weights_to_train"
    )


def recurrent(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """LSTM or GRU as forward-only, ``layout=0`` nodes with every optional input present (see
    the module's docstring). Leaves ``b.nodes`` empty for a node already of that form."""
    arity, _, n_outputs, _ = _RECURRENT[node.op_type]
    attrs = _attrs(node)
    unsupported = _unsupported(node, attrs)
    if unsupported:
        if any(i in graph.reached for i in node.input if i):
            raise _refusal(node, unsupported)
        return  # frozen: no gradient runs through it, and rewritten it would compute other values
    direction = attrs.get("direction", b"forward").decode()
    layout = int(attrs.get("layout", 0))
    inputs = list(node.input) + [""] * (arity - len(node.input))
    if direction == "forward" and layout == 0:
        if len(node.input) < arity:
            b.nodes.append(_forward_node(node, inputs, list(node.output), node.name or b.name("n_rnn")))
        return
    if layout:  # X [N, T, I] -> [T, N, I]; initial states [N, D, H] -> [D, N, H]
        inputs = [
            b.op("Transpose", [v], "seq_major", perm=[1, 0, 2]) if v and (k == 0 or k in _STATES) else v
            for k, v in enumerate(inputs)
        ]
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    parts = [
        _one_direction(b, node, inputs, k, len(directions), d == "reverse") for k, d in enumerate(directions)
    ]
    outputs = list(node.output) + [""] * (n_outputs - len(node.output))
    for position, output in enumerate(outputs):
        if not output:
            continue
        pieces = [p[position] for p in parts]  # Y on the direction axis 1, Y_h and Y_c on axis 0
        joined = (
            pieces[0] if len(pieces) == 1 else b.op("Concat", pieces, "directions", axis=int(position == 0))
        )
        if layout:  # Y [T, D, N, H] -> [N, T, D, H], Y_h and Y_c [D, N, H] -> [N, D, H]
            _emit(b, "Transpose", [joined], output, perm=[2, 0, 1, 3] if position == 0 else [1, 0, 2])
        else:
            _emit(b, "Identity", [joined], output)


def _one_direction(
    b: NodeBuilder, node: onnx.NodeProto, inputs: list[str], k: int, count: int, reverse: bool
) -> list[str]:
    """The outputs (Y, Y_h[, Y_c]) of direction ``k`` of ``count``, computed by a forward node on
    its slice of the per-direction inputs; ``reverse``: on the sequence reversed along time, its
    Y reversed back (Y_h, Y_c: the state after the first step, as ONNX's reverse direction)."""
    _, per_direction, n_outputs, _ = _RECURRENT[node.op_type]
    ins = list(inputs)
    if count > 1:
        starts, ends, axes = (
            b.int_const([k], "direction"),
            b.int_const([k + 1], "direction_end"),
            b.int_const([0]),
        )
        for position in per_direction:
            if ins[position]:
                ins[position] = b.op("Slice", [ins[position], starts, ends, axes], "direction_slice")
    if reverse:
        length = b.op(
            "Gather", [b.op("Shape", [ins[0]], "seq_shape"), b.const(0, "zero", dtype=np.int64)], "seq_len"
        )
        last = b.op("Sub", [length, b.const(1, "one", dtype=np.int64)], "seq_last")
        minus_one = b.const(-1, "minus_one", dtype=np.int64)
        backwards = b.op("Range", [last, minus_one, minus_one], "seq_backwards")
        ins[0] = b.op("Gather", [ins[0], backwards], "seq_reversed", axis=0)
    outs = [b.name(f"{node.op_type.lower()}_{hint}") for hint in ("y", "y_h", "y_c")[:n_outputs]]
    b.nodes.append(_forward_node(node, ins, outs, b.name(f"n_{node.op_type}")))
    if reverse:
        outs[0] = b.op("Gather", [outs[0], backwards], "y_reversed", axis=0)
    return outs


def _forward_node(node: onnx.NodeProto, inputs: list[str], outputs: list[str], name: str) -> onnx.NodeProto:
    """``node`` on other inputs and outputs: forward, layout 0, its other attributes kept (the
    activations, default ones after :func:`_unsupported`, left out: they are listed per
    direction)."""
    new = helper.make_node(node.op_type, inputs, outputs, name=name)
    skipped = {"direction", "layout", "activations", "activation_alpha", "activation_beta"}
    new.attribute.extend(a for a in node.attribute if a.name not in skipped)
    return new
