"""A small helper to append nodes to an ONNX graph: unique names, typed constants, and the
opset-dependent forms of reductions. Losses, penalties and optimizer updates all emit their
math through it, so the same code writes the fused step graph and the small standalone graphs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper


def unique_name(hint: str, taken: set[str], next_suffix: dict[str, int] | None = None) -> str:
    """The first of ``hint``, ``hint_1``, ``hint_2``, ... not in ``taken``, which it joins.

    Parameters
    ----------
    hint : str
        The preferred name.
    taken : set of str
        The names in use; the returned one is added.
    next_suffix : dict of str to int, optional
        Where to start probing for each hint, updated: a caller naming many values of one hint
        passes one dict for all its calls, so that the k-th name costs a few probes instead of
        k (a fused step names one node per weight: quadratic at 20 000 weights).

    Returns
    -------
    str
        A name not in ``taken`` before the call.
    """
    i = 0 if next_suffix is None else next_suffix.get(hint, 0)
    candidate = hint if i == 0 else f"{hint}_{i}"
    while candidate in taken:
        i += 1
        candidate = f"{hint}_{i}"
    taken.add(candidate)
    if next_suffix is not None:
        next_suffix[hint] = i + 1
    return candidate


class NodeBuilder:
    """Collects ONNX nodes with unique output names: what a learning rate's
    :meth:`~ort_train_core.BaseLearningRate.update_nodes` writes its update with.

    Every name it makes is unique among ``taken`` and its own names.

    Parameters
    ----------
    elem_type : int
        The graph's float type (an ``onnx.TensorProto`` code): :meth:`const` and :meth:`cast`
        use it.
    opset : int
        The default domain's opset (chooses how :meth:`reduce` passes its axes).
    taken : iterable of str, default=()
        Names already used in the graph.
    prefix : str, default=""
        Prepended to every name made.

    Attributes
    ----------
    nodes : list of onnx.NodeProto
        The nodes made so far, in order.
    """

    def __init__(self, elem_type: int, opset: int, taken: Iterable[str] = (), prefix: str = "") -> None:
        self.elem_type = elem_type
        self.np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        self.opset = opset
        self.nodes: list[NodeProto] = []
        self._taken = set(taken)
        self._prefix = prefix
        self._next_suffix: dict[str, int] = {}

    def name(self, hint: str) -> str:
        """A fresh name from ``hint`` (prefixed, suffixed with a number when taken)."""
        return unique_name(f"{self._prefix}{hint}", self._taken, self._next_suffix)

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, **attrs: Any) -> str:
        """Adds a default-domain node ``op_type(*inputs, **attrs)``; returns its output's name
        (made from ``hint``)."""
        out = self.name(hint or op_type.lower())
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [out], name=self.name(f"n_{op_type}"), **attrs)
        )
        return out

    def const(self, value: float | Sequence[float] | np.ndarray, hint: str = "cst", dtype: Any = None) -> str:
        """A Constant node (not an initializer, so it is never taken for a trainable weight).

        Values are rounded to the graph's float type from double precision: ``1 - beta2`` must
        be computed before the cast, not after.
        """
        arr = np.asarray(value, dtype=np.float64 if dtype is None else dtype)
        if dtype is None:
            arr = arr.astype(self.np_dtype)
        out = self.name(hint)
        self.nodes.append(
            helper.make_node(
                "Constant",
                [],
                [out],
                name=self.name("n_Constant"),
                value=numpy_helper.from_array(arr, out),
            )
        )
        return out

    def int_const(self, values: Sequence[int], hint: str = "axes") -> str:
        """A Constant int64 vector (axes, shapes)."""
        return self.const(np.array(values, dtype=np.int64), hint, dtype=np.int64)

    def reduce(
        self,
        op_type: str,
        x: str,
        axes: Sequence[int] | None,
        keepdims: int = 0,
        hint: str | None = None,
    ) -> str:
        """ReduceSum/ReduceMean with axes as an input (opset >= 13/18) or an attribute."""
        axes_as_input = self.opset >= (13 if op_type == "ReduceSum" else 18)
        if axes is None:
            return self.op(op_type, [x], hint, keepdims=keepdims)
        if axes_as_input:
            return self.op(op_type, [x, self.int_const(axes)], hint, keepdims=keepdims)
        return self.op(op_type, [x], hint, keepdims=keepdims, axes=list(axes))

    def sum_all(self, x: str, hint: str | None = None) -> str:
        """The 0-d sum of every element of ``x``."""
        return self.reduce("ReduceSum", x, None, 0, hint)

    def cast(self, x: str, to: int | None = None, hint: str | None = None) -> str:
        """``x`` cast to ``to`` (an ``onnx.TensorProto`` code), the graph's float type by default."""
        return self.op("Cast", [x], hint, to=self.elem_type if to is None else to)


def tensor_elem_type(dtype: np.dtype) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
