"""Gradient rules of the normalisations: BatchNormalization (training mode: batch statistics;
inference mode: an affine map of the running statistics), InstanceNormalization,
GroupNormalization (opset 18: scale and bias per group; 21: per channel) and
LayerNormalization (any axis; its saved Mean and InvStdDev read when they have X's type).

Every training-mode form normalises ``xc = X - mean`` by ``invstd = 1 / sqrt(var + eps)``
(biased variance) over some axes; with ``y = k * xc * invstd`` (``k`` constant over those
axes) the input's gradient is the classic

    dX = k * invstd * (dY - mean(dY) - xhat * mean(dY * xhat)),  xhat = xc * invstd,

written as ``dY * a - (xc * d + c)`` with per-group factors ``a = k * invstd``,
``c = a * sum(dY) / n`` and ``d = a * invstd^2 * sum(dY * xc) / n`` (:func:`_centred_grad`): four
passes over the tensor besides the two sums, which also give the scale's and the bias's
gradients (``sum(dY * xc) * invstd`` and ``sum(dY)``). A BatchNormalization's running
statistics (outputs 1 and 2, written beside the node by ``_batchnorm``) get no gradient, nor do
its mean and variance inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from ...exceptions import GraphNotDifferentiableError
from .._context import Context, attr, rule

Grads = list["str | None"]


def _inverse_count(ctx: Context, x: str, axes: Sequence[int]) -> str:
    """``1 / n``, ``n`` the number of elements of ``x`` over ``axes`` (a value of x's type)."""
    n = ctx.count(x, axes)
    if isinstance(n, float):
        return ctx.const(1.0 / n, like=x, hint="inv_count")
    return ctx.op("Reciprocal", [n])


def _moments(
    ctx: Context, x: str, axes: Sequence[int], eps: float, inv_n: str, like: str | None = None
) -> tuple[str, str]:
    """``(X - mean, 1 / sqrt(var + eps))`` over ``axes`` (kept), the biased variance, as the
    forward computed them (recomputed: the training-mode forward writes no batch statistics);
    ``like``: a forward value of x's type (x itself by default)."""
    mean = ctx.b.reduce("ReduceMean", x, list(axes), 1, "mean")
    xc = ctx.op("Sub", [x, mean], "centred")
    # Mul + ReduceMean: onnxruntime's ReduceSumSquare over axes (0, 2, 3) takes 1.8x the time
    var = ctx.b.reduce("ReduceMean", ctx.op("Mul", [xc, xc]), list(axes), 1, "var")
    std = ctx.op("Sqrt", [ctx.op("Add", [var, ctx.const(eps, like=like or x, hint="eps")])])
    return xc, ctx.op("Reciprocal", [std], "invstd")


def _factors(ctx: Context, invstd: str, s1: str, s2: str, inv_n: str, k: str | None) -> tuple[str, str, str]:
    """The per-group factors ``(a, c, d)`` of ``dX = dY * a - (xc * d + c)``."""
    a = invstd if k is None else ctx.op("Mul", [k, invstd])
    c = ctx.op("Mul", [ctx.op("Mul", [a, s1]), inv_n])
    d = ctx.op("Mul", [ctx.op("Mul", [ctx.op("Mul", [a, invstd]), invstd]), ctx.op("Mul", [s2, inv_n])])
    return a, c, d


def _centred_grad(
    ctx: Context, dy: str, xc: str, invstd: str, axes: Sequence[int], inv_n: str, k: str | None = None
) -> tuple[str, str, str]:
    """``(dX, sum(dY), sum(dY * xc))`` of ``y = k * xc * invstd`` (statistics over ``axes``,
    ``k`` constant over them, 1 when None), the sums kept over ``axes``."""
    s1 = ctx.reduce_sum(dy, axes, keepdims=1)
    s2 = ctx.reduce_sum(ctx.op("Mul", [dy, xc]), axes, keepdims=1)
    a, c, d = _factors(ctx, invstd, s1, s2, inv_n, k)
    dx = ctx.op("Sub", [ctx.op("Mul", [dy, a]), ctx.op("Add", [ctx.op("Mul", [xc, d]), c])])
    return dx, s1, s2


def _channel_affine(
    ctx: Context, x: str, scale: str | None, bias: str | None, mean: str | None, like: str
) -> str:
    """``scale * (x - mean) + bias`` with vectors [C] per channel (axis 1; None: 1, 0, 0), one
    pass over ``x``: an inference-mode BatchNormalization of variance ``1 - eps`` (onnxruntime
    broadcasts a [C, 1, 1] operand slowly: Sub, Mul and Add of 32x512x2x2 took 3x its time;
    epsilon not 0: cuDNN raises a smaller one to 1e-5); ``like``: a forward value of x's type,
    ``scale``, ``bias`` or ``mean`` given."""
    eps = float(np.float32(1e-5))
    given = next(v for v in (scale, bias, mean) if v is not None)
    zeros = ctx.op("Mul", [given, ctx.const(0.0, like=like)])
    ones = ctx.op("Add", [zeros, ctx.const(1.0, like=like)])
    var = ctx.op("Add", [zeros, ctx.const(1.0 - eps, like=like)])
    inputs = [x, scale or ones, bias or zeros, mean or zeros, var]
    return ctx.op("BatchNormalization", inputs, "affine", epsilon=eps)


def _per_channel(ctx: Context, v: str, rank: int) -> str:
    """A per-channel vector [C] shaped to broadcast on axis 1 of a rank-``rank`` tensor."""
    return ctx.reshape(v, [-1] + [1] * (rank - 2)) if rank > 2 else v


def _only_y(node: onnx.NodeProto, dys: Grads, what: str) -> str:
    """The gradient of output 0; refuses a loss reading the node's other outputs."""
    if any(d is not None for d in dys[1:]):
        raise GraphNotDifferentiableError(
            f"the onnx backend differentiates {node.op_type} node {node.name!r} through its output "
            f"Y only, but the loss reads its {what}: compute them with standard operators from "
            "the node's input, or use backend='onnxruntime-training'"
        )
    assert dys[0] is not None
    return dys[0]


@rule("BatchNormalization")
def _batch_norm(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    dy = _only_y(node, dys, "running statistics (state: they get no gradient)")
    x, scale, _, mean, var = node.input[:5]
    rank, eps = ctx.rank(x), float(attr(node, "epsilon", 1e-5))
    axes = [0, *range(2, rank)]
    if not int(attr(node, "training_mode", 0)):  # an affine map of the running statistics
        invstd = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, ctx.const(eps, like=x)])])])
        dx = ctx.op("Mul", [dy, _per_channel(ctx, ctx.op("Mul", [scale, invstd]), rank)])
        xc = ctx.op("Sub", [x, _per_channel(ctx, mean, rank)])
        dscale = ctx.op("Mul", [ctx.reduce_sum(ctx.op("Mul", [dy, xc]), axes, keepdims=0), invstd])
        return [dx, dscale, ctx.reduce_sum(dy, axes, keepdims=0), None, None]
    return _batch_norm_training(ctx, x, scale, dy, axes, eps)


def _batch_norm_training(ctx: Context, x: str, scale: str, dy: str, axes: list[int], eps: float) -> Grads:
    """The batch statistics recomputed per channel (vectors [C]), ``dX = dY * a - (d * (X -
    mean) + c)`` with the second term one affine pass over X. (Reading xhat and the statistics
    from a second training-mode BatchNormalization gave wrong values on onnxruntime 1.19: its
    kernel writes over its inputs.)"""
    inv_n = _inverse_count(ctx, x, axes)
    mean = ctx.b.reduce("ReduceMean", x, axes, 0, "mean")
    xc = _channel_affine(ctx, x, None, None, mean, x)
    var = ctx.b.reduce("ReduceMean", ctx.op("Mul", [xc, xc]), axes, 0, "var")
    invstd = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, ctx.const(eps, like=x)])])], "invstd")
    s1 = ctx.reduce_sum(dy, axes, keepdims=0)
    s2 = ctx.reduce_sum(ctx.op("Mul", [dy, xc]), axes, keepdims=0)
    a, c, d = _factors(ctx, invstd, s1, s2, inv_n, scale)
    dx = ctx.op("Sub", [_channel_affine(ctx, dy, a, None, None, x), _channel_affine(ctx, x, d, c, mean, x)])
    return [dx, ctx.op("Mul", [s2, invstd]), s1, None, None]


@rule("InstanceNormalization")
def _instance_norm(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, scale = node.input[:2]
    rank, eps = ctx.rank(x), float(attr(node, "epsilon", 1e-5))
    axes = list(range(2, rank))
    inv_n = _inverse_count(ctx, x, axes)
    xc, invstd = _moments(ctx, x, axes, eps, inv_n)
    dx, s1, s2 = _centred_grad(ctx, dy, xc, invstd, axes, inv_n, _per_channel(ctx, scale, rank))
    dscale = ctx.reduce_sum(ctx.op("Mul", [s2, invstd]), [0, *axes], keepdims=0)
    return [dx, dscale, ctx.reduce_sum(s1, [0, *axes], keepdims=0)]


@rule("GroupNormalization")
def _group_norm(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, scale = node.input[:2]
    dims, groups = ctx.dims(x), int(attr(node, "num_groups"))
    if not all(isinstance(d, int) for d in dims[1:]) or not isinstance(ctx.dims(scale)[0], int):
        ctx.shape(x)  # refuses, naming the value
    rank, eps = len(dims), float(attr(node, "epsilon", 1e-5))
    per_value = 1
    for d in dims[1:]:
        per_value *= int(d)  # type: ignore[arg-type]
    inv_n = ctx.const(groups / per_value, like=x, hint="inv_count")
    view = ctx.op("Reshape", [x, ctx.ints([0, groups, -1])], "grouped")
    xc, invstd = _moments(ctx, view, [2], eps, inv_n, like=x)
    spatial = list(range(2, rank))
    if ctx.dims(scale)[0] == groups:  # opset 18 (or as many groups as channels)
        k = ctx.reshape(scale, [groups, 1])
        dyv = ctx.op("Reshape", [dy, ctx.ints([0, groups, -1])])
        dxv, s1, s2 = _centred_grad(ctx, dyv, xc, invstd, [2], inv_n, k)
        dscale = ctx.reduce_sum(ctx.op("Mul", [s2, invstd]), [0, 2], keepdims=0)
        return [ctx.reshape_like(dxv, x), dscale, ctx.reduce_sum(s1, [0, 2], keepdims=0)]
    g = ctx.op("Mul", [dy, _per_channel(ctx, scale, rank)])  # opset 21: scale per channel
    gv = ctx.op("Reshape", [g, ctx.ints([0, groups, -1])])
    dxv, _, _ = _centred_grad(ctx, gv, xc, invstd, [2], inv_n)
    xhat = ctx.reshape_like(ctx.op("Mul", [xc, invstd]), x)
    dscale = ctx.reduce_sum(ctx.op("Mul", [dy, xhat]), [0, *spatial], keepdims=0)
    return [ctx.reshape_like(dxv, x), dscale, ctx.reduce_sum(dy, [0, *spatial], keepdims=0)]


def _layer_stats(ctx: Context, node: onnx.NodeProto, axes: list[int], inv_n: str) -> tuple[str, str]:
    """``(X - mean, invstd)`` of a LayerNormalization: its Mean and InvStdDev outputs (added
    when absent) where they have X's type (``stash_type``), else recomputed."""
    x = node.input[0]
    stash = int(attr(node, "stash_type", onnx.TensorProto.FLOAT))
    if stash != ctx.dtype(x):
        return _moments(ctx, x, axes, float(attr(node, "epsilon", 1e-5)), inv_n)
    dims = [*ctx.dims(x)[: axes[0]], *([1] * len(axes))]
    mean = ctx.output_of(node, 1, "ln_mean", stash, dims)
    invstd = ctx.output_of(node, 2, "ln_invstd", stash, dims)
    return ctx.op("Sub", [x, mean], "centred"), invstd


@rule("LayerNormalization")
def _layer_norm(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    dy = _only_y(node, dys, "Mean or InvStdDev output")
    x, scale = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    dims = ctx.dims(x)
    axis = int(attr(node, "axis", -1)) % len(dims)
    axes, lead = list(range(axis, len(dims))), list(range(axis))
    inv_n = _inverse_count(ctx, x, axes)
    xc, invstd = _layer_stats(ctx, node, axes, inv_n)
    dx, _, _ = _centred_grad(ctx, ctx.op("Mul", [dy, scale]), xc, invstd, axes, inv_n)
    weighted = ctx.op("Mul", [dy, ctx.op("Mul", [xc, invstd], "xhat")])
    dscale = ctx.reduce_sum(weighted, lead, keepdims=0) if lead else weighted
    dscale = ctx.unbroadcast(dscale, dims[axis:], scale)
    dbias = None
    if bias is not None and ctx.needs(bias):
        dbias = ctx.unbroadcast(ctx.reduce_sum(dy, lead, keepdims=0) if lead else dy, dims[axis:], bias)
    return [dx, dscale, dbias]
