"""Gradient rule of Resize (modes ``nearest`` and ``linear``; every coordinate transformation
but ``tf_crop_and_resize``; every ``nearest_mode``; scales or sizes, ``axes`` and
``keep_aspect_ratio_policy``; any number of resized axes). An older Upsample reaches the rule
as the Resize onnx's version converter writes for it.

Such a Resize is linear in X and separable: along each resized axis, ``Y = M X`` with an
interpolation matrix ``M`` (output size x input size) that depends on the sizes and attributes
only, built here in numpy (:func:`axis_matrix`, ONNX's semantics: the source coordinate of
each output index, computed as onnxruntime does, clamped neighbours). So ``dX`` applies each
``M^T`` to ``dY``: one MatMul per resized axis, the tensor viewed as ``[rows, out, after]``
(no transposes). Where every resized axis repeats each input value ``f`` times in a row
(integer-factor nearest upsampling, the usual torch export) and an axis has 64 inputs or more,
``dX`` is one Reshape and one ReduceSum over the factors instead: onnxruntime's strided
ReduceSum is slower than the MatMuls below that (2x upsampling, one thread, forward and
backward: 32x64x16x16 7.4 ms against 5.0, 8x16x64x64 6.4 against 6.7, 2x16x128x128 6.5 against
9.4; onnxruntime 1.19).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ...exceptions import GraphNotDifferentiableError
from .._context import Context, attr, rule

Grads = list["str | None"]


def _round_up(nearest_mode: str, frac: np.ndarray) -> np.ndarray:
    """Where a nearest-mode source coordinate (fractional part ``frac``) takes the index above
    its floor."""
    if nearest_mode == "round_prefer_floor":
        return np.asarray(frac > 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.asarray(frac >= 0.5)
    return np.asarray(frac > 0) if nearest_mode == "ceil" else np.zeros(frac.shape, dtype=bool)


_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coordinates(coordinate_mode: str, in_size: int, out_size: int, scale: float) -> np.ndarray:
    """The input coordinate each output index of an axis reads, as onnxruntime computes it:
    in float32 (a nearest index depends on it, 3 / 0.6f is 5 there, 4.99... in float64), and
    with the integer output size where onnx.reference takes scale x input size (align_corners,
    pytorch_half_pixel)."""
    f = np.float32
    y, s = np.arange(out_size, dtype=f), f(scale)
    if coordinate_mode == "align_corners":
        x = np.zeros(out_size, f) if out_size == 1 else y * f(in_size - 1) / f(out_size - 1)
    elif coordinate_mode == "asymmetric":
        x = y / s
    elif coordinate_mode == "pytorch_half_pixel" and out_size == 1:
        x = np.zeros(1, f)
    elif coordinate_mode == "half_pixel_symmetric":  # onnxruntime's order of operations
        offset = f(in_size) / f(2) * (f(1) - f(out_size) / (s * f(in_size)))
        x = offset + (y + f(0.5)) / s - f(0.5)
    else:  # half_pixel, pytorch_half_pixel
        x = (y + f(0.5)) / s - f(0.5)
    return np.asarray(x, dtype=np.float64)


def axis_matrix(
    mode: str, coordinate_mode: str, nearest_mode: str, in_size: int, out_size: int, scale: float
) -> np.ndarray:
    """The interpolation matrix ``M`` (out_size x in_size, float64) of one axis: ``Y = M X``.

    Parameters
    ----------
    mode : str
        ``'nearest'`` or ``'linear'``.
    coordinate_mode : str
        The node's ``coordinate_transformation_mode`` (not ``tf_crop_and_resize``).
    nearest_mode : str
        How a nearest-mode coordinate is rounded.
    in_size, out_size : int
        The axis' sizes.
    scale : float
        The axis' scale (``out_size / in_size`` where the node gives sizes), taken in float32.

    Returns
    -------
    numpy.ndarray
        The matrix; neighbours outside the axis are clamped to its ends (ONNX's edge padding).
    """
    x = source_coordinates(coordinate_mode, in_size, out_size, scale)
    low = np.floor(x)
    frac = x - low
    rows = np.arange(out_size)
    m = np.zeros((out_size, in_size))
    if mode == "nearest":
        index = low.astype(np.int64) + _round_up(nearest_mode, frac)
        m[rows, np.clip(index, 0, in_size - 1)] = 1.0
        return m
    base = low.astype(np.int64)
    np.add.at(m, (rows, np.clip(base, 0, in_size - 1)), 1.0 - frac)
    np.add.at(m, (rows, np.clip(base + 1, 0, in_size - 1)), frac)
    return m


def _refuse(node: onnx.NodeProto, what: str, fix: str) -> GraphNotDifferentiableError:
    return GraphNotDifferentiableError(
        f"the onnx backend differentiates Resize in modes nearest and linear only; node "
        f"{node.name!r} has {what}: {fix}, or use backend='onnxruntime-training'"
    )


def _check_supported(node: onnx.NodeProto) -> tuple[str, str, str]:
    """``(mode, coordinate mode, nearest mode)``; refuses what the rule does not write."""
    text = {k: attr(node, k, d) for k, d in _TEXT_DEFAULTS.items()}
    text = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in text.items()}
    mode, coordinate = text["mode"], text["coordinate_transformation_mode"]
    if mode not in ("nearest", "linear"):
        raise _refuse(node, f"mode={mode!r}", "export the upsampling as mode 'linear' or 'nearest'")
    if int(attr(node, "antialias", 0)):
        raise _refuse(node, "antialias=1", "resize without antialiasing (antialias=False in torch)")
    if coordinate == "tf_crop_and_resize":
        raise _refuse(node, "coordinate_transformation_mode='tf_crop_and_resize' (a roi)", "crop with Slice")
    if text["nearest_mode"] not in _NEAREST_MODES:
        raise _refuse(node, f"nearest_mode={text['nearest_mode']!r}", "use one of ONNX's nearest modes")
    return mode, coordinate, text["nearest_mode"]


_TEXT_DEFAULTS = {
    "mode": "nearest",
    "coordinate_transformation_mode": "half_pixel",
    "nearest_mode": "round_prefer_floor",
    "keep_aspect_ratio_policy": "stretch",
}


def _axis_sizes(ctx: Context, node: onnx.NodeProto) -> dict[int, tuple[int, int, float]]:
    """Each resized axis -> (input size, output size, scale), ONNX's rules for scales, sizes,
    ``axes`` and ``keep_aspect_ratio_policy``."""
    x = node.input[0]
    dims = ctx.dims(x)
    rank = len(dims)
    scales = ctx.optional_value(node, 2)
    sizes = ctx.optional_value(node, 3)
    axes = [int(a) % rank for a in attr(node, "axes", range(rank))]
    ins = []
    for a in axes:
        if not isinstance(dims[a], int):
            ctx.shape(x)  # refuses, naming the value
        ins.append(int(dims[a]))  # type: ignore[arg-type]
    if sizes is not None and sizes.size:
        outs = [int(s) for s in sizes]
        ratios = [o / i for o, i in zip(outs, ins)]
        policy = attr(node, "keep_aspect_ratio_policy", b"stretch")
        policy = policy.decode() if isinstance(policy, bytes) else str(policy)
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(ins)
            outs = [int(common * i + 0.5) for i in ins]
    elif scales is not None and scales.size:
        ratios = [float(s) for s in scales]
        outs = [math.floor(r * i) for r, i in zip(ratios, ins)]
    else:
        raise _refuse(node, "neither scales nor sizes", "give the node constant scales or sizes")
    return {a: (i, o, r) for a, i, o, r in zip(axes, ins, outs, ratios)}


def _repeat_factor(m: np.ndarray) -> int:
    """``f`` where ``m`` repeats each input ``f`` times in a row (``Y[i] = X[i // f]``), else 0."""
    out_size, in_size = m.shape
    if out_size % in_size:
        return 0
    f = out_size // in_size
    return f if np.array_equal(m, np.repeat(np.eye(in_size), f, axis=0)) else 0


@rule("Resize")
def _resize(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    mode, coordinate, nearest = _check_supported(node)
    matrices = {}
    for a, (i, o, r) in _axis_sizes(ctx, node).items():
        m = axis_matrix(mode, coordinate, nearest, i, o, r)
        if m.shape != (i, i) or not np.array_equal(m, np.eye(i)):
            matrices[a] = m
    if not matrices:
        dx = dy
    elif (
        all(_repeat_factor(m) for m in matrices.values()) and max(m.shape[1] for m in matrices.values()) >= 64
    ):
        dx = _summed_repeats(ctx, x, dy, {a: _repeat_factor(m) for a, m in matrices.items()})
    else:
        dx = _transposed_products(ctx, x, dy, matrices)
    return [dx, *([None] * (len(node.input) - 1))]


def _summed_repeats(ctx: Context, x: str, dy: str, factors: dict[int, int]) -> str:
    """dX of a repeat by ``factors`` (axis -> f): dY viewed with each resized axis split as
    (input size, f), summed over the factors."""
    dims = ctx.dims(x)
    first = min(factors)
    view: list[int] = [-1]
    summed = []
    for a in range(first, len(dims)):
        view.append(int(dims[a]))  # type: ignore[arg-type]
        if a in factors:
            view.append(factors[a])
            summed.append(len(view) - 1)
    return ctx.reshape_like(ctx.reduce_sum(ctx.reshape(dy, view), summed, keepdims=0), x)


def _transposed_products(ctx: Context, x: str, dy: str, matrices: dict[int, np.ndarray]) -> str:
    """dX = dY with each axis' ``M^T`` applied, the last axis first: ``dY @ M`` on the last
    axis, ``M^T @ view`` on the ``[rows, out, after]`` view of any other."""
    dims = list(ctx.dims(x))
    for a, m in matrices.items():
        dims[a] = m.shape[0]
    cur, reshaped = dy, False
    for a in sorted(matrices, reverse=True):
        m = matrices[a]
        after = int(np.prod([int(d) for d in dims[a + 1 :]]))  # type: ignore[arg-type]
        if after == 1:
            cur = ctx.op("MatMul", [cur, ctx.const(m, like=x, hint="resize_matrix")])
        else:
            view = ctx.reshape(cur, [-1, m.shape[0], after])
            cur = ctx.op("MatMul", [ctx.const(m.T, like=x, hint="resize_matrix_t"), view])
            reshaped = True
        dims[a] = m.shape[1]
    return ctx.reshape_like(cur, x) if reshaped else cur
