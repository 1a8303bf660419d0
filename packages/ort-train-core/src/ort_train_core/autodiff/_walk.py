"""The reverse walk: from seeds (the loss, or the gradients of a forward's outputs) back to the
differentiated names, one rule per node, over a static-shape graph.

The walk knows no operator by name: it finds the nodes between what is differentiated and the
seeds, visits them in reverse order, sums the gradient contributions of each value (one ``Sum``)
and hands them to the node's rule (:data:`._context.RULES`). What no seed reaches, and what no
differentiated name reaches, gets no node; what the rules wrote but nothing reads is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from .._builder import FLOAT_TYPES, NodeBuilder
from ..exceptions import GraphNotDifferentiableError
from ..graph import carries_gradient, differentiable_ancestors
from . import rules as _rules  # noqa: F401  (registers every rule family)
from ._context import RULES, Context, StaticInfo
from ._fold import inferred_graph


class _LazyValues(Mapping[str, np.ndarray]):
    """Constant values of a graph, converted to numpy only when a rule reads one (a model zoo
    graph's weights are never converted)."""

    def __init__(self, graph: onnx.GraphProto, excluded: set[str]) -> None:
        self._tensors: dict[str, onnx.TensorProto] = {
            i.name: i for i in graph.initializer if i.name not in excluded
        }
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.attribute:
                a = node.attribute[0]
                if a.name == "value":
                    self._tensors[node.output[0]] = a.t
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = numpy_helper.to_array(self._tensors[name])
        return self._cache[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def static_info(model: onnx.ModelProto, differentiated: Sequence[str]) -> StaticInfo:
    """What onnx's shape inference (with data propagation, the shape arithmetic folded:
    :mod:`._fold`) finds about ``model``'s values."""
    g = model.graph
    try:
        inferred = inferred_graph(model, differentiated)
    except Exception:  # a graph onnx cannot infer: the declared shapes only
        inferred = g
    dims: dict[str, tuple[int | str | None, ...]] = {}
    types: dict[str, int] = {}
    for init in g.initializer:
        dims[init.name] = tuple(int(d) for d in init.dims)
        types[init.name] = init.data_type
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        if tt.elem_type:
            types.setdefault(vi.name, tt.elem_type)
        if tt.HasField("shape"):
            dims.setdefault(vi.name, tuple(_dim(d) for d in tt.shape.dim))
    # the inferred graph's constants: the original ones and the shape arithmetic folded
    values = _LazyValues(inferred, set(differentiated))
    for name in values:  # constants onnx left without a value_info
        if name not in dims:
            dims[name] = tuple(values[name].shape)
            types.setdefault(name, int(onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype)))
    shapes = {k: tuple(int(d) for d in v) for k, v in dims.items() if all(isinstance(d, int) for d in v)}  # type: ignore[arg-type]
    return StaticInfo(shapes, types, values, dims)


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    return d.dim_param or None


def active_values(
    model: onnx.ModelProto, names: Sequence[str], seeds: Sequence[str], types: Mapping[str, int]
) -> set[str]:
    """The float values that depend on ``names`` and that a seed depends on, along the edges a
    gradient flows on (:func:`graph.carries_gradient`, both ways)."""
    reached = set(names)
    for node in model.graph.node:
        if any(x in reached and carries_gradient(node, k, x, types) for k, x in enumerate(node.input)):
            reached.update(
                o for o in node.output if o and types.get(o, onnx.TensorProto.FLOAT) in FLOAT_TYPES
            )
    needed, _ = differentiable_ancestors(model, seeds, types)
    return reached & needed


def checked_path(model: onnx.ModelProto, active: set[str]) -> list[onnx.NodeProto]:
    """The nodes computing an ``active`` value, in graph order, after refusing (naming them)
    those without a rule."""
    path = [n for n in model.graph.node if any(o in active for o in n.output)]
    missing = [n for n in path if n.domain not in ("", "ai.onnx") or n.op_type not in RULES]
    if missing:
        listed = "; ".join(f"operator {_qualified(n)} (node {n.name!r})" for n in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise GraphNotDifferentiableError(
            f"the onnx backend has no gradient rule for {listed}{more}, on the way from the trained "
            "weights to the loss: leave the weights before it out of weights_to_train, write that "
            "step with operators that have one, or use backend='onnxruntime-training' where it is "
            "installed"
        )
    return path


def _qualified(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def reverse_pass(
    model: onnx.ModelProto,
    seeds: Mapping[str, str],
    names: Sequence[str],
    builder: NodeBuilder,
    info: StaticInfo,
) -> dict[str, str]:
    """Writes, with ``builder``, the gradients of ``names`` given the gradients of the seeds.

    Parameters
    ----------
    model : onnx.ModelProto
        The forward graph (topologically sorted). A rule may add outputs to its nodes (a
        Dropout's mask): pass a copy the caller owns.
    seeds : mapping of str to str
        Forward value -> the value holding its gradient (a constant 1 for a loss, a graph input
        for a forward's output).
    names : sequence of str
        The values (graph inputs or initializers) to differentiate with respect to.
    builder : NodeBuilder
        Writes the backward nodes (``builder.nodes``).
    info : StaticInfo
        :func:`static_info` of ``model``.

    Returns
    -------
    dict of str to str
        The gradient value of each name that a seed reaches.

    Raises
    ------
    GraphNotDifferentiableError
        Naming every operator on the way that has no rule, before any node is written.
    """
    ctx = Context(builder, info, active_values(model, names, list(seeds), info.types))
    path = checked_path(model, ctx.active)
    contributions: dict[str, list[str]] = {s: [g] for s, g in seeds.items()}
    for node in reversed(path):
        dys = [_total(ctx, o, contributions.get(o)) for o in node.output]
        if all(d is None for d in dys):
            continue
        dxs = RULES[node.op_type](ctx, node, dys)
        for x, dx in zip(node.input, dxs):
            if dx is not None and ctx.needs(x):
                contributions.setdefault(x, []).append(dx)
    grads = {}
    for name in names:
        total = _total(ctx, name, contributions.get(name))
        if total is not None:
            grads[name] = total
    return grads


def _total(ctx: Context, name: str, parts: list[str] | None) -> str | None:
    if not parts:
        return None
    if len(parts) > 1:  # several consumers: one Sum, and the list holds it from now on
        parts[:] = [ctx.op("Sum", parts, f"{name}_grad_sum")]
    return parts[0]


def live_nodes(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nothing in ``outputs`` depends on (order kept)."""
    wanted = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in wanted for o in node.output):
            kept.append(node)
            wanted.update(_reads(node))
    kept.reverse()
    return kept


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads: its inputs, and those its subgraphs (a Scan's body) read from
    the outer scope (a superset: names the body defines itself match no outer node)."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            for inner in g.node:
                names |= _reads(inner)
    return names
