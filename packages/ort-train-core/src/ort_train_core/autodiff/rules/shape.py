"""Gradient rules of operators that move values without arithmetic: reshapes, transposes,
concatenation and splitting, slicing, gathering, expanding, tiling, padding."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from ...exceptions import GraphNotDifferentiableError
from .._context import Context, attr, rule

Grads = list["str | None"]


def _reshaped_back(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    return [ctx.reshape_like(dy, x), *([None] * (len(node.input) - 1))]


for _op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
    rule(_op)(_reshaped_back)  # dX = dY reshaped as X


@rule("Transpose")
def _transpose(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    rank = ctx.rank(node.input[0])
    perm = attr(node, "perm", list(range(rank))[::-1])
    return [ctx.transpose(dys[0], list(np.argsort(perm)))]  # type: ignore[arg-type]


def _axis(node: onnx.NodeProto, rank: int, default: int = 0) -> int:
    axis = int(attr(node, "axis", default))
    return axis + rank if axis < 0 else axis


@rule("Concat")
def _concat(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    axis = _axis(node, ctx.rank(node.output[0]))
    dims = [ctx.dims(x)[axis] for x in node.input]
    if all(isinstance(d, int) for d in dims):
        sizes = ctx.ints([int(d) for d in dims])  # type: ignore[arg-type]
    else:  # sizes read when it runs
        parts = [ctx.op("Gather", [ctx.op("Shape", [x]), ctx.ints([axis])]) for x in node.input]
        sizes = ctx.op("Concat", parts, axis=0)
    names = [ctx.b.name(f"{x}_grad_part") for x in node.input]
    ctx.b.nodes.append(
        onnx.helper.make_node("Split", [dy, sizes], names, name=ctx.b.name("n_Split"), axis=axis)
    )
    return [name if ctx.needs(x) else None for x, name in zip(node.input, names)]


@rule("Split")
def _split(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    axis = _axis(node, ctx.rank(node.input[0]))
    parts = [d if d is not None else ctx.zeros_like(o) for o, d in zip(node.output, dys)]
    return [ctx.op("Concat", parts, axis=axis), None]


def _slice_params(ctx: Context, node: onnx.NodeProto, shape: tuple[Any, ...]) -> list[tuple[Any, Any, int]]:
    """Per axis of the input: (start, stop, step) as Python's ``slice.indices`` gives them
    (``(0, d, 1)`` on an axis not sliced, ``d`` possibly symbolic; a sliced axis must be static)."""
    starts, ends = ctx.optional_value(node, 1), ctx.optional_value(node, 2)
    axes, steps = ctx.optional_value(node, 3), ctx.optional_value(node, 4)
    assert starts is not None
    assert ends is not None
    axes_list = list(range(len(starts))) if axes is None else [int(a) % len(shape) for a in axes]
    steps_list = [1] * len(starts) if steps is None else [int(s) for s in steps]
    full = [(0, d, 1) for d in shape]
    for a, st, en, sp in zip(axes_list, starts, ends, steps_list):
        size = shape[a]
        if not isinstance(size, int):
            size = ctx.shape(node.input[0])[a]  # refuses: a sliced axis must be static
        full[a] = slice(int(st), int(en), sp).indices(size)
    return full


@rule("Slice")
def _slice(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    params = _slice_params(ctx, node, ctx.dims(x))
    if all(step == 1 for _, _, step in params):  # dX = dY padded with zeros back to X's shape
        before = [start for start, _, _ in params]
        after = [0 if stop == d else d - stop for (_, stop, _), d in zip(params, ctx.dims(x))]
        grad = ctx.op("Pad", [dy, ctx.ints([*before, *after], "pads")], mode="constant")
    else:
        shape = ctx.shape(x)  # strided: scattered to the positions it read (ranges, not slices: a stop of -1
        # from slice.indices means "past index 0" with a negative step, not "the last")
        positions = np.ix_(*[np.arange(*p, dtype=np.int64) for p in params])
        taken = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[positions]
        flat = ctx.reshape(dy, (-1,))
        zeros = ctx.zeros([int(np.prod(shape))], like=x)
        grad = ctx.reshape(
            ctx.op("ScatterElements", [zeros, ctx.ints(taken.ravel(), "taken"), flat], axis=0), shape
        )
    return [grad, *([None] * (len(node.input) - 1))]


@rule("Gather")
def _gather(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, indices = node.input
    rank = ctx.rank(x)
    axis = _axis(node, rank)
    # ScatterND reads negative indices from the end as Gather does (the ONNX spec): only
    # the int64 cast it requires, no Where/Less/Add pass over them
    idx = ctx.op("Cast", [indices], to=onnx.TensorProto.INT64)
    # dX = zeros with dY added at the gathered rows (repeated ids add up): ScatterND on axis 0
    perm = [axis, *[k for k in range(rank) if k != axis]]
    idx_rank = ctx.rank(indices)
    dy_perm = (
        list(range(axis, axis + idx_rank))
        + list(range(axis))
        + list(range(axis + idx_rank, ctx.rank(node.output[0])))
    )
    dy_moved = ctx.transpose(dy, dy_perm) if axis else dy
    if ctx.is_static(x):
        zeros = ctx.zeros([ctx.shape(x)[k] for k in perm], like=x)
    else:
        zeros = ctx.transpose(ctx.zeros_like(x), perm) if axis else ctx.zeros_like(x)
    scattered = ctx.op(
        "ScatterND", [zeros, ctx.op("Unsqueeze", [idx, ctx.ints([-1])]), dy_moved], reduction="add"
    )
    grad = ctx.transpose(scattered, list(np.argsort(perm))) if axis else scattered
    return [grad, None]


@rule("GatherElements")
def _gather_elements(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, indices = node.input
    axis = _axis(node, ctx.rank(x))
    # ScatterElements reads negative indices from the end as GatherElements does (the ONNX
    # spec): no Where/Less/Add pass over them (a third of the scatter's own time in a sparse
    # linear fit's step)
    return [ctx.op("ScatterElements", [ctx.zeros_like(x), indices, dy], axis=axis, reduction="add"), None]


@rule("Expand")
def _expand(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    return [ctx.unbroadcast(dy, ctx.dims(node.output[0]), node.input[0]), None]


@rule("Tile")
def _tile(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    shape = ctx.shape(node.input[0])
    repeats = [int(r) for r in ctx.value(node.input[1], "repeats")]
    # Y viewed as (r0, d0, r1, d1, ...): dX sums over the r axes
    interleaved = [v for r, d in zip(repeats, shape) for v in (r, d)]
    summed = ctx.reduce_sum(ctx.reshape(dy, interleaved), list(range(0, 2 * len(shape), 2)), keepdims=0)
    return [summed, None]


@rule("Pad")
def _pad(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    mode = attr(node, "mode", b"constant")
    if mode not in (b"constant", "constant"):
        raise GraphNotDifferentiableError(
            f"the onnx backend differentiates Pad in constant mode only; node {node.name!r} pads "
            f"in {mode!r} mode: use backend='onnxruntime-training', or pad with zeros"
        )
    x = node.input[0]
    rank = ctx.rank(x)
    pads = attr(node, "pads") if len(node.input) < 2 else ctx.value(node.input[1], "pads")
    axes_value = ctx.optional_value(node, 3)
    axes = list(range(rank)) if axes_value is None else [int(a) % rank for a in axes_value]
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = int(pads[k]), int(pads[k + len(axes)])
    if all(b >= 0 and e >= 0 for b, e in zip(begin, end)):  # dX = dY without the padding
        ends = [-e if e else np.iinfo(np.int64).max for e in end]
        return [ctx.op("Slice", [dy, ctx.ints(begin), ctx.ints(ends)]), *([None] * (len(node.input) - 1))]
    # a negative pad cropped: the cropped places get zeros back
    shape = ctx.shape(x)
    grad = ctx.op(
        "Slice",
        [
            dy,
            ctx.ints([max(b, 0) for b in begin]),
            ctx.ints([max(b, 0) + d + min(b, 0) + min(e, 0) for b, e, d in zip(begin, end, shape)]),
        ],
    )
    if any(b < 0 or e < 0 for b, e in zip(begin, end)):
        grad = ctx.op(
            "Pad", [grad, ctx.ints([max(-b, 0) for b in begin] + [max(-e, 0) for e in end], "pads")]
        )
    return [grad, *([None] * (len(node.input) - 1))]
