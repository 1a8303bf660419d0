"""Gradient rules of reductions along axes: ReduceSum/Mean/Max/Min/L1/L2/SumSquare/LogSumExp,
Softmax, LogSoftmax and CumSum."""

from __future__ import annotations

import onnx

from .._context import Context, attr, rule

Grads = list["str | None"]


def _axes(ctx: Context, node: onnx.NodeProto) -> list[int]:
    """The reduced axes (non-negative), from the attribute or the input (opset 13/18+)."""
    rank = ctx.rank(node.input[0])
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.value(node.input[1], "axes")]
    if not axes:
        return [] if attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted(int(a) % rank for a in axes)


def _kept(ctx: Context, node: onnx.NodeProto, value: str) -> str:
    """``value`` (shaped like the reduction's output) with the reduced axes kept as size 1."""
    if int(attr(node, "keepdims", 1)):
        return value
    return ctx.op("Unsqueeze", [value, ctx.ints(_axes(ctx, node))])


def _spread(ctx: Context, node: onnx.NodeProto, dy: str) -> str:
    """``dY`` broadcast back over the reduced axes: X's shape."""
    return ctx.op("Expand", [_kept(ctx, node, dy), ctx.shape_of(node.input[0])])


def _no_axes_grad(node: onnx.NodeProto, grad: str) -> Grads:
    return [grad, *([None] * (len(node.input) - 1))]


@rule("ReduceSum")
def _reduce_sum(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    if not _axes(ctx, node):
        return _no_axes_grad(node, dys[0])
    return _no_axes_grad(node, _spread(ctx, node, dys[0]))


@rule("ReduceMean")
def _reduce_mean(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    x = node.input[0]
    axes = _axes(ctx, node)
    if not axes:
        return _no_axes_grad(node, dys[0])
    count = ctx.count(x, axes)
    if isinstance(count, float):
        scaled = ctx.op("Mul", [dys[0], ctx.const(1.0 / count, like=x)])
    else:
        scaled = ctx.op("Div", [dys[0], count])
    return _no_axes_grad(node, _spread(ctx, node, scaled))


@rule("ReduceMax", "ReduceMin")
def _reduce_extreme(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    x = node.input[0]
    if not _axes(ctx, node):
        return _no_axes_grad(node, dys[0])
    # dY shared evenly between the elements equal to the extreme (torch's amax/amin)
    hit = ctx.op("Cast", [ctx.op("Equal", [x, _kept(ctx, node, node.output[0])])], to=ctx.dtype(x))
    ties = ctx.reduce_sum(hit, _axes(ctx, node), keepdims=1)
    share = ctx.op("Div", [_kept(ctx, node, dys[0]), ties])
    return _no_axes_grad(node, ctx.op("Mul", [hit, share]))


@rule("ReduceSumSquare")
def _reduce_sum_square(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    x = node.input[0]  # dX = 2 X dY
    twice = ctx.op("Add", [x, x])
    return _no_axes_grad(node, ctx.op("Mul", [twice, _kept(ctx, node, dys[0])]))


@rule("ReduceL1")
def _reduce_l1(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    x = node.input[0]  # dX = sign(X) dY
    return _no_axes_grad(node, ctx.op("Mul", [ctx.op("Sign", [x]), _kept(ctx, node, dys[0])]))


@rule("ReduceL2")
def _reduce_l2(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    x = node.input[0]  # dX = X dY / Y, 0 where Y is 0 (torch's norm)
    norm = _kept(ctx, node, node.output[0])
    zero = ctx.const(0.0, like=x)
    ratio = ctx.op("Div", [_kept(ctx, node, dys[0]), norm])
    safe = ctx.op("Where", [ctx.op("Equal", [norm, zero]), zero, ratio])
    return _no_axes_grad(node, ctx.op("Mul", [x, safe]))


@rule("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    x = node.input[0]  # dX = dY exp(X - Y)
    weights = ctx.op("Exp", [ctx.op("Sub", [x, _kept(ctx, node, node.output[0])])])
    return _no_axes_grad(node, ctx.op("Mul", [weights, _kept(ctx, node, dys[0])]))


def _softmax_axis(ctx: Context, node: onnx.NodeProto) -> int:
    rank = ctx.rank(node.input[0])
    return int(attr(node, "axis", -1)) % rank


@rule("Softmax")
def _softmax(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    y = node.output[0]  # dX = Y (dY - sum(dY Y))
    dot = ctx.reduce_sum(ctx.op("Mul", [dys[0], y]), [_softmax_axis(ctx, node)], keepdims=1)
    return [ctx.op("Mul", [y, ctx.op("Sub", [dys[0], dot])])]


@rule("LogSoftmax")
def _log_softmax(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    y = node.output[0]  # dX = dY - exp(Y) sum(dY)
    total = ctx.reduce_sum(dys[0], [_softmax_axis(ctx, node)], keepdims=1)
    return [ctx.op("Sub", [dys[0], ctx.op("Mul", [ctx.op("Exp", [y]), total])])]


@rule("CumSum")
def _cumsum(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    assert dys[0] is not None
    # dX = the cumulative sum of dY the other way round (same exclusivity)
    reverse = 1 - int(attr(node, "reverse", 0))
    grad = ctx.op(
        "CumSum", [dys[0], node.input[1]], reverse=reverse, exclusive=int(attr(node, "exclusive", 0))
    )
    return [grad, None]
