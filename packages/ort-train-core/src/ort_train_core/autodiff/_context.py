"""What a gradient rule sees: the node builder it writes with, the forward graph's static shapes,
element types and constant values, and the helpers most rules share (undoing a broadcast,
typed constants). Rules register in :data:`RULES` by operator type with :func:`rule`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .._builder import NodeBuilder
from ..exceptions import GraphNotDifferentiableError

#: a rule: (context, forward node, one gradient per output or None) -> one gradient per input
#: (None where the input gets none, or needs none: see :meth:`Context.needs`)
Rule = Callable[["Context", onnx.NodeProto, list["str | None"]], Sequence["str | None"]]

#: operator type (default domain) -> its gradient rule
RULES: dict[str, Rule] = {}


def rule(*op_types: str) -> Callable[[Rule], Rule]:
    """Registers the decorated function as the gradient rule of ``op_types``."""

    def register(fn: Rule) -> Rule:
        for op in op_types:
            RULES[op] = fn
        return fn

    return register


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of ``node``'s attribute ``name`` (``default`` when absent)."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


@dataclass
class StaticInfo:
    """Shapes (complete ones only), element types and constant values of a graph's values."""

    shapes: dict[str, tuple[int, ...]]
    types: dict[str, int]
    values: Mapping[str, np.ndarray]
    #: every value of known rank: its dimensions, an int, a symbolic name or None
    dims: dict[str, tuple[int | str | None, ...]]


class Context:
    """The forward graph as the rules read it, and the builder they write the backward with.

    Parameters
    ----------
    builder : NodeBuilder
        Where the rules' nodes go (its names are unique in the whole graph).
    info : StaticInfo
        Dimensions, element types and constant values of the forward values (see
        :func:`._walk.static_info`).
    active : set of str
        The values a gradient is computed for (depending on a differentiated name, and reaching
        a seed): a rule emits an input's gradient only when :meth:`needs` it.
    """

    def __init__(self, builder: NodeBuilder, info: StaticInfo, active: set[str]) -> None:
        self.b = builder
        self.info = info
        self.shapes = info.shapes
        self.types = info.types
        self.values = info.values
        self.active = active

    # -- reading the forward graph -------------------------------------------------------
    def needs(self, name: str) -> bool:
        """Whether ``name`` (a node input) gets a gradient."""
        return bool(name) and name in self.active

    def shape(self, name: str) -> tuple[int, ...]:
        """The static shape of ``name``; refuses a value onnx could not infer fully."""
        found = self.shapes.get(name)
        if found is None:
            raise GraphNotDifferentiableError(
                f"the onnx backend needs the static shape of {name!r}, which onnx's shape inference "
                "could not find: fix the batch size (the trainers do) and give the graph's inputs "
                "full shapes, or use backend='onnxruntime-training'"
            )
        return found

    def dims(self, name: str) -> tuple[int | str | None, ...]:
        """The dimensions of ``name``: an int where static, a symbolic name or None elsewhere."""
        found = self.info.dims.get(name)
        if found is None:
            raise GraphNotDifferentiableError(
                f"the onnx backend needs the rank of {name!r}, which onnx's shape inference could "
                "not find: give the graph's inputs full shapes, or use backend='onnxruntime-training'"
            )
        return found

    def rank(self, name: str) -> int:
        return len(self.dims(name))

    def is_static(self, name: str) -> bool:
        return name in self.shapes

    def shape_of(self, name: str) -> str:
        """A value holding the shape of ``name``: a constant where static, else ``Shape(name)``."""
        if name in self.shapes:
            return self.ints(self.shapes[name], "shape")
        return self.op("Shape", [name], f"{name}_shape")

    def reshape_like(self, x: str, like: str) -> str:
        """``x`` reshaped as the forward value ``like``."""
        return self.op("Reshape", [x, self.shape_of(like)])

    def count(self, name: str, axes: Sequence[int]) -> str | float:
        """The number of elements of ``name`` over ``axes``: a float when static, else a value
        of ``name``'s type (computed from its Shape)."""
        dims = self.dims(name)
        if all(isinstance(dims[a], int) for a in axes):
            total = 1
            for a in axes:
                total *= int(dims[a])  # type: ignore[arg-type]
            return float(total)
        picked = self.op("Gather", [self.op("Shape", [name]), self.ints(list(axes))])
        size = self.b.reduce("ReduceProd", picked, None, 0)
        return self.op("Cast", [size], to=self.dtype(name))

    def dtype(self, name: str) -> int:
        return int(self.types.get(name, onnx.TensorProto.FLOAT))

    def value(self, name: str, what: str = "input") -> np.ndarray:
        """The constant value of ``name`` (a shape, axes, pads...): refused when computed."""
        if name not in self.values:
            raise GraphNotDifferentiableError(
                f"the onnx backend needs the {what} {name!r} to be a constant (an initializer or a "
                "Constant node), but the graph computes it: fold it (onnx's constant folding, or "
                "export with constant folding on), or use backend='onnxruntime-training'"
            )
        return self.values[name]

    def optional_value(self, node: onnx.NodeProto, index: int) -> np.ndarray | None:
        """The constant value of input ``index`` of ``node``; None when the input is absent."""
        if index >= len(node.input) or not node.input[index]:
            return None
        return self.value(node.input[index], f"input {index} of {node.op_type} node {node.name!r},")

    # -- writing the backward ------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, **attrs: Any) -> str:
        return self.b.op(op_type, inputs, hint, **attrs)

    def const(self, value: Any, like: str, hint: str = "cst") -> str:
        """A Constant of ``like``'s element type."""
        dtype = helper.tensor_dtype_to_np_dtype(self.dtype(like))
        return self.b.const(np.asarray(value, dtype=dtype), hint, dtype=dtype)

    def ints(self, values: Sequence[int], hint: str = "ints") -> str:
        return self.b.int_const([int(v) for v in values], hint)

    def zeros_like(self, name: str, hint: str = "zeros") -> str:
        if name in self.shapes:
            return self.zeros(self.shapes[name], like=name, hint=hint)
        zero = helper.make_tensor("zero", self.dtype(name), [1], [0])
        return self.op("ConstantOfShape", [self.op("Shape", [name])], hint, value=zero)

    def zeros(self, shape: Sequence[int], like: str, hint: str = "zeros") -> str:
        """Zeros of the static ``shape`` in ``like``'s element type: a ConstantOfShape where
        a constant would put a large tensor of zeros in the graph (an embedding table's)."""
        if int(np.prod(shape)) <= 64:
            return self.const(np.zeros(shape), like=like, hint=hint)
        zero = helper.make_tensor("zero", self.dtype(like), [1], [0])
        return self.op("ConstantOfShape", [self.ints(shape, "shape")], hint, value=zero)

    def reduce_sum(self, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        return self.b.reduce("ReduceSum", x, list(axes), keepdims)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Reshape", [x, self.ints(shape, "shape")])

    def unbroadcast(self, grad: str, grad_dims: Sequence[int | str | None], target: str) -> str:
        """``grad`` (of the broadcast result, of dimensions ``grad_dims``) summed back to the
        shape of ``target``: over the leading axes ``target`` lacks and the axes where it has
        size 1 (static dimensions; a symbolic one is the same as the result's)."""
        dims = self.dims(target)
        grad_dims = tuple(grad_dims)
        lead = len(grad_dims) - len(dims)
        if lead == 0 and all(d == g and d is not None for d, g in zip(dims, grad_dims)):
            return grad
        axes = list(range(lead))
        for k, d in enumerate(dims):
            g = grad_dims[lead + k]
            if d == 1 and g != 1:  # g symbolic or unknown: summing over a 1 is harmless
                axes.append(lead + k)
            elif not isinstance(d, int) and g != 1 and (d is None or d != g):
                # a symbolic dimension may be 1 at run time and broadcast: decided when it runs
                return self._unbroadcast_at_run_time(grad, len(grad_dims), target)
        if not axes:
            return grad
        out = self.reduce_sum(grad, axes, keepdims=1)
        return self.op("Squeeze", [out, self.ints(list(range(lead)))]) if lead else out

    def _unbroadcast_at_run_time(self, grad: str, grad_rank: int, target: str) -> str:
        """:meth:`unbroadcast` with the axes found when the graph runs: where ``target``'s
        shape (1-padded on the left) is 1 and ``grad``'s is not."""
        lead = grad_rank - self.rank(target)
        shape = self.op("Shape", [target], f"{target}_shape")
        if lead:
            shape = self.op("Concat", [self.ints([1] * lead), shape], axis=0)
        one = self.ints([1])
        broadcast = self.op(
            "And",
            [
                self.op("Equal", [shape, one]),
                self.op("Not", [self.op("Equal", [self.op("Shape", [grad]), one])]),
            ],
        )
        axes = self.op("Reshape", [self.op("NonZero", [broadcast]), self.ints([-1])])
        summed = self.op("ReduceSum", [grad, axes], keepdims=1, noop_with_empty_axes=1)
        return self.op("Reshape", [summed, self.op("Shape", [target])])

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        """``x`` transposed; ``x`` itself for the identity permutation (onnxruntime 1.19's
        Gemm/Transpose fusion takes a Transpose after a Gemm for a swap, whatever its perm)."""
        if [int(p) for p in perm] == list(range(len(perm))):
            return x
        return self.op("Transpose", [x], perm=[int(p) for p in perm])

    def output_of(
        self,
        node: onnx.NodeProto,
        index: int,
        hint: str,
        elem_type: int | None = None,
        dims: Sequence[int | str | None] | None = None,
    ) -> str:
        """Output ``index`` of the forward ``node``, added when the node does not write it (a
        Dropout's mask, a MaxPool's Indices, a recurrence's Y): the backward reads it as a saved
        value. ``elem_type`` and ``dims`` describe an added output (default for Dropout: its
        bool mask, shaped as the data)."""
        if index < len(node.output) and node.output[index]:
            return str(node.output[index])
        name = self.b.name(hint)
        if node.op_type == "Dropout" and elem_type is None:  # its mask: bool, shaped as the data
            elem_type = onnx.TensorProto.BOOL
            dims = self.info.dims.get(node.input[0])
        if elem_type is not None:
            self.info.types[name] = elem_type
        if dims is not None:
            self.info.dims[name] = tuple(dims)
            if all(isinstance(d, int) for d in dims):
                self.info.shapes[name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
        while len(node.output) < index:
            node.output.append("")
        if index < len(node.output):
            node.output[index] = name
        else:
            node.output.append(name)
        return name
