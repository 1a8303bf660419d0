"""Gradient rules of convolution and pooling: Conv, ConvTranspose, MaxPool, AveragePool,
GlobalAveragePool and GlobalMaxPool (1 to 3 spatial axes, static shapes).

The sliding window's transpose is the other operator of the pair: the input gradient of a
Conv is a ConvTranspose of ``dY`` by the same weight, and the other way round; an AveragePool's
is a grouped ConvTranspose by a constant kernel. Standard ONNX has no im2col, so the weight
gradient ``dW[m, c, k] = sum_{n, o} dY[n, m, o] X[n, c, o s + k d]`` is itself a convolution
(:func:`_weight_gradient`): of X by dY with the batch axis as the channels (strides and
dilations exchanged) when the weight has one group, of the rows of X by the rows of dY as
``N * C`` groups when it has several (depthwise: no copy). A MaxPool's gradient adds ``dY`` at
the positions its ``Indices`` output gives (``ScatterElements``, 2.5x faster than ScatterND).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from ..._auto_pad import same_pads
from ...exceptions import GraphNotDifferentiableError
from .._context import Context, attr, rule

Grads = list["str | None"]


class Window:
    """A sliding window's geometry on the spatial axes: kernel, strides, dilations, pads
    (``auto_pad`` resolved on the static input shape)."""

    def __init__(self, ctx: Context, node: onnx.NodeProto, kernel: Sequence[int]) -> None:
        rank = len(kernel)
        self.kernel = [int(k) for k in kernel]
        self.strides = [int(s) for s in attr(node, "strides", [1] * rank)]
        self.dilations = [int(d) for d in attr(node, "dilations", [1] * rank)]
        auto_pad = attr(node, "auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad in ("SAME_UPPER", "SAME_LOWER") and node.op_type != "ConvTranspose":
            w_dims = ctx.shape(node.input[1]) if node.op_type == "Conv" else None
            x_dims = [d if isinstance(d, int) else None for d in ctx.dims(node.input[0])]
            pads = same_pads(node, x_dims, w_dims)
            assert pads is not None  # static shapes
            self.pads = pads
        elif auto_pad == "VALID":
            self.pads = [0] * (2 * rank)
        else:
            self.pads = [int(p) for p in attr(node, "pads", [0] * (2 * rank))]
        self.begin, self.end = self.pads[:rank], self.pads[rank:]

    @property
    def attrs(self) -> dict[str, list[int]]:
        return {"strides": self.strides, "dilations": self.dilations, "pads": self.pads}

    def span(self, k: int) -> int:
        return (self.kernel[k] - 1) * self.dilations[k] + 1


def _spatial(ctx: Context, name: str) -> list[int]:
    """The static spatial sizes of ``name`` (the batch axis may be symbolic)."""
    sizes = ctx.dims(name)[2:]
    if not all(isinstance(d, int) for d in sizes):
        ctx.shape(name)  # refuses, naming the value
    return [int(d) for d in sizes]  # type: ignore[arg-type]


def _channels(ctx: Context, name: str) -> tuple[int | str | None, int]:
    """The batch size (maybe symbolic) and the static channel count of ``name``."""
    dims = ctx.dims(name)
    if not isinstance(dims[1], int):
        ctx.shape(name)
    return dims[0], int(dims[1])  # type: ignore[arg-type]


def _transposed_window(w: Window, sizes: Sequence[int], out_sizes: Sequence[int]) -> dict[str, Any]:
    """Attributes of the ConvTranspose that maps a window's outputs (``out_sizes``) back onto
    its inputs (``sizes``): the same strides, dilations and begin pads, the end pads and
    output padding that give exactly ``sizes`` (a last window may leave rows out)."""
    ends, extra = [], []
    for k, (n, o) in enumerate(zip(sizes, out_sizes)):
        full = (o - 1) * w.strides[k] + w.span(k) - w.begin[k]  # rows the windows reach
        ends.append(max(full - n, 0))
        extra.append(max(n - full, 0))
    return {
        "strides": w.strides,
        "dilations": w.dilations,
        "pads": [*w.begin, *ends],
        "output_padding": extra,
    }


#: the most kernel taps (``prod(kernel)``) whose weight gradient is one Gemm over the strided
#: slices of X (columns): measured on ResNet-18 shapes (batch 32, one thread, stock onnxruntime
#: 1.32), the columns' Gemm took 0.65-0.75x the swapped Conv's time for 3x3 kernels at stride 1
#: (64 ch 16x16: 12.3 against 18.2 ms; 512 ch 2x2: 10.5 against 15.2), the same at stride 2,
#: and 2x for the 7x7 stem (22.5 against 11.1 ms: 49 slices of few channels). Remeasured
#: (issue 28; one-Conv graph, forward + dW with dY a graph input, ms, best of 7, batch 32, one
#: thread, on a loaded 2-core VM: +-30%; onnxruntime 1.19.2 / stock 1.32 / torch fwd+dW):
#:   stem 3->64 7x7 s2 on 64x64   columns 58/57    swapped 47/57   torch 24/18
#:   3x3 64->64 on 16x16          columns 39/32    swapped 51/42   torch 25/17
#:   3x3 128->128 on 8x8          columns 23/22    swapped 37/33   torch 15/10
#:   3x3 s2 64->128 on 16x16      columns 18/17    swapped 14/18   torch  9/8
#:   1x1 s2 64->128 on 16x16      columns 1.7/2.1  swapped 11/14   torch 1.5/2.1
#:   depthwise 3x3 64 ch 16x16    taps 8-17/13     grouped 18-29/18  torch 2.1/2.3
#:   Conv1d depthwise k3 d4 L128  taps 1.9/2.0     grouped 2.8-5.4/4.0  torch 2.4/2.8
#: so: columns up to 9 taps (1x1 and 3x3), the swapped Conv above (the stem), the per-tap
#: products (:func:`_depthwise_by_taps`) for depthwise, the grouped Conv for other groups
COLUMNS_MAX_TAPS = 9


def _weight_gradient(
    ctx: Context, x: str, dy: str, like: tuple[str, str], w: Window, group: int, begin: Sequence[int]
) -> str:
    """``dW[m, c', k] = sum_{n, o} dY[n, m, o] Xpad[n, g(m) C/g + c', o s + k d]`` for X
    ``[N, C, *S]`` and dY ``[N, M, *O]``, X padded by ``begin`` (and as needed at the end), in
    the form measured fastest for the kernel (``like``: the forward values shaped as X and dY)."""
    sizes, outs = _spatial(ctx, like[0]), _spatial(ctx, like[1])
    ends = [max((o - 1) * w.strides[k] + w.span(k) - sizes[k] - begin[k], 0) for k, o in enumerate(outs)]
    if group == 1 and int(np.prod(w.kernel)) <= COLUMNS_MAX_TAPS:
        return _by_columns(ctx, x, dy, like, w, [*begin, *ends])
    if group == ctx.dims(like[0])[1] == ctx.dims(like[1])[1]:  # depthwise: a weight row a channel
        return _depthwise_by_taps(ctx, x, dy, w, [*begin, *ends], outs, group)
    if group == 1:
        grad = _by_swapped_conv(
            ctx, x, dy, len(sizes), {"strides": w.dilations, "dilations": w.strides, "pads": [*begin, *ends]}
        )
    else:
        grad = _by_groups(ctx, x, dy, like, w, group, [*begin, *ends])
    full = _full_sizes(sizes, outs, w, begin, ends)
    crop = [k for k in range(len(sizes)) if full[k] != w.kernel[k]]
    if not crop:
        return grad
    starts, stops = ctx.ints([0] * len(crop)), ctx.ints([w.kernel[k] for k in crop])
    return ctx.op("Slice", [grad, starts, stops, ctx.ints([k + 2 for k in crop])])


def _by_columns(ctx: Context, x: str, dy: str, like: tuple[str, str], w: Window, pads: Sequence[int]) -> str:
    """dW as one Gemm: dY ``[M, N P]`` by the columns ``[K C, N P]``, each tap's strided slice
    of the padded X (channels first)."""
    (_, c), (_, m) = _channels(ctx, like[0]), _channels(ctx, like[1])
    sizes, outs = _spatial(ctx, like[0]), _spatial(ctx, like[1])
    rank = len(sizes)
    first = [1, 0, *range(2, rank + 2)]
    taps = _taps(ctx, ctx.transpose(x, first), w, pads, outs)  # each [C, N, *O]
    columns = ctx.reshape(ctx.op("Concat", taps, axis=0) if len(taps) > 1 else taps[0], [len(taps) * c, -1])
    rows = ctx.reshape(ctx.transpose(dy, first), [m, -1])
    grad = ctx.op("Gemm", [rows, columns], transB=1)  # [M, K C]
    return ctx.transpose(ctx.reshape(grad, [m, *w.kernel, c]), [0, rank + 1, *range(1, rank + 1)])


def _taps(ctx: Context, x: str, w: Window, pads: Sequence[int], outs: Sequence[int]) -> list[str]:
    """Each kernel tap's strided slice of ``x`` (``[A, B, *S]``, padded by ``pads``): the
    inputs ``[A, B, *O]`` that the windows' outputs ``outs`` meet at that tap."""
    rank = len(outs)
    if any(pads):
        x = ctx.op("Pad", [x, ctx.ints([0, 0, *pads[:rank], 0, 0, *pads[rank:]])])
    axes, steps = ctx.ints(range(2, rank + 2)), ctx.ints(w.strides)
    taps = []
    for tap in np.ndindex(*w.kernel):
        lo = [t * d for t, d in zip(tap, w.dilations)]
        hi = [b + (o - 1) * s + 1 for b, o, s in zip(lo, outs, w.strides)]
        taps.append(ctx.op("Slice", [x, ctx.ints(lo), ctx.ints(hi), axes, steps]))
    return taps


def _depthwise_by_taps(
    ctx: Context, x: str, dy: str, w: Window, pads: Sequence[int], outs: Sequence[int], channels: int
) -> str:
    """Depthwise dW (one weight row a channel): per tap, its slice of X times dY summed per
    channel (channels first, ``[C, N P]``), the taps' ``[C, 1]`` concatenated. A batched MatMul
    per tap (``[C, 1, N P] @ [C, N P, 1]``) took 3x longer, one Mul of all taps stacked 2x."""
    first = [1, 0, *range(2, len(outs) + 2)]
    rows = ctx.reshape(ctx.transpose(dy, first), [channels, -1])
    dots = [
        ctx.reduce_sum(ctx.op("Mul", [ctx.reshape(tap, [channels, -1]), rows]), [1])
        for tap in _taps(ctx, ctx.transpose(x, first), w, pads, outs)
    ]
    grad = ctx.op("Concat", dots, axis=1) if len(dots) > 1 else dots[0]
    return ctx.reshape(grad, [channels, 1, *w.kernel])


def _by_swapped_conv(ctx: Context, x: str, dy: str, rank: int, swapped: dict[str, Any]) -> str:
    """dW as a Conv with the batch axis as the channels: [C, N, *S] by [M, N, *O] -> [C, M, *K']."""
    first = [1, 0, *range(2, rank + 2)]
    full = ctx.op("Conv", [ctx.transpose(x, first), ctx.transpose(dy, first)], **swapped)
    return ctx.transpose(full, first)


def _by_groups(
    ctx: Context, x: str, dy: str, like: tuple[str, str], w: Window, group: int, pads: Sequence[int]
) -> str:
    """dW as a Conv of the rows ``[1, N C, *S]`` as ``N C`` groups by dY repeated over each
    group's ``C/g`` channels (depthwise: no copy)."""
    (n, c), (_, m) = _channels(ctx, like[0]), _channels(ctx, like[1])
    sizes, outs = _spatial(ctx, like[0]), _spatial(ctx, like[1])
    rank = len(sizes)
    per_in, per_out = c // group, m // group
    if not isinstance(n, int):  # a free batch: one swapped Conv per group
        return _by_group_split(ctx, (x, c), (dy, m), group, rank, w, pads)
    rows = ctx.reshape(x, [1, n * c, *sizes])
    dyg = ctx.reshape(dy, [n, group, 1, per_out, *outs])
    if per_in > 1:
        dyg = ctx.op("Expand", [dyg, ctx.ints([n, group, per_in, per_out, *outs])])
    kernels = ctx.reshape(dyg, [n * c * per_out, 1, *outs])
    swapped: dict[str, Any] = {"strides": w.dilations, "dilations": w.strides, "pads": list(pads)}
    full = ctx.op("Conv", [rows, kernels], group=n * c, **swapped)
    spans = _full_sizes(sizes, outs, w, pads[:rank], pads[rank:])
    summed = ctx.reduce_sum(ctx.reshape(full, [n, group, per_in, per_out, *spans]), [0], keepdims=0)
    return ctx.reshape(ctx.transpose(summed, [0, 2, 1, *range(3, rank + 3)]), [m, per_in, *spans])


def _full_sizes(
    sizes: Sequence[int], outs: Sequence[int], w: Window, begin: Sequence[int], ends: Sequence[int]
) -> list[int]:
    """The spatial sizes of :func:`_weight_gradient`'s uncropped convolution."""
    return [
        (sizes[k] + begin[k] + ends[k] - ((outs[k] - 1) * w.strides[k] + 1)) // w.dilations[k] + 1
        for k in range(len(sizes))
    ]


def _by_group_split(
    ctx: Context,
    x: tuple[str, int],
    dy: tuple[str, int],
    group: int,
    rank: int,
    w: Window,
    pads: Sequence[int],
) -> str:
    """dW of a grouped weight with a free batch: the swapped Conv of each group's channels,
    the groups' gradients concatenated (``x``, ``dy``: a value and its channel count)."""
    swapped: dict[str, Any] = {"strides": w.dilations, "dilations": w.strides, "pads": list(pads)}
    parts = zip(_split(ctx, x, group), _split(ctx, dy, group))
    return ctx.op("Concat", [_by_swapped_conv(ctx, a, b, rank, swapped) for a, b in parts], axis=0)


def _split(ctx: Context, x: tuple[str, int], parts: int) -> list[str]:
    """``x`` (a value and its channel count) split in ``parts`` equal parts along the channels."""
    names = [ctx.b.name(f"{x[0]}_part") for _ in range(parts)]
    sizes = ctx.ints([x[1] // parts] * parts)
    ctx.b.nodes.append(onnx.helper.make_node("Split", [x[0], sizes], names, axis=1))
    return names


def _bias_gradient(ctx: Context, dy: str, rank: int) -> str:
    return ctx.reduce_sum(dy, [0, *range(2, rank)], keepdims=0)


def _input_gradient(ctx: Context, node: onnx.NodeProto, dy: str, w: Window, group: int) -> str:
    """dX of a Conv: the window's transpose, ConvTranspose(dY, W); at stride 1 with one group,
    the same as a Conv of dY by W with its channel axes swapped and its taps reversed, which
    onnxruntime runs in 0.65-0.85x the ConvTranspose's time (3x3, 64-256 channels, batch 32,
    one thread, 1.19 and 1.32)."""
    x, weight = node.input[0], node.input[1]
    rank = len(w.kernel)
    # the flipped Conv's pads: span - 1 - the forward's (negative when a pad exceeds the span)
    pads = [w.span(k % rank) - 1 - p for k, p in enumerate(w.pads)]
    if group == 1 and set(w.strides) == {1} and min(pads) >= 0:
        swapped = ctx.transpose(weight, [1, 0, *range(2, rank + 2)])
        ends = ctx.ints([-(2**62)] * rank)
        flipped = ctx.op(
            "Slice",
            [swapped, ctx.ints([-1] * rank), ends, ctx.ints(range(2, rank + 2)), ctx.ints([-1] * rank)],
        )
        return ctx.op("Conv", [dy, flipped], dilations=w.dilations, pads=pads)
    t = _transposed_window(w, _spatial(ctx, x), _spatial(ctx, node.output[0]))
    return ctx.op("ConvTranspose", [dy, weight], group=group, **t)


@rule("Conv")
def _conv(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, weight = node.input[0], node.input[1]
    group = int(attr(node, "group", 1))
    w = Window(ctx, node, _spatial(ctx, weight))
    dx = dw = db = None
    if ctx.needs(x):
        dx = _input_gradient(ctx, node, dy, w, group)
    if ctx.needs(weight):
        dw = _weight_gradient(ctx, x, dy, (x, node.output[0]), w, group, w.begin)
    if len(node.input) > 2 and ctx.needs(node.input[2]):
        db = _bias_gradient(ctx, dy, ctx.rank(x))
    return [dx, dw, db]


def _conv_transpose_begin(ctx: Context, node: onnx.NodeProto, w: Window) -> list[int]:
    """The begin pads of a ConvTranspose (its ``output_shape`` or ``auto_pad`` resolved)."""
    shape = attr(node, "output_shape")
    auto_pad = attr(node, "auto_pad", b"NOTSET")
    if shape is None and auto_pad in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return w.begin
    sizes, outs = _spatial(ctx, node.input[0]), _spatial(ctx, node.output[0])
    extra = [int(p) for p in attr(node, "output_padding", [0] * len(sizes))]
    begins = []
    for k, (n, o) in enumerate(zip(sizes, outs)):
        total = w.strides[k] * (n - 1) + extra[k] + w.span(k) - o
        upper = auto_pad in (b"SAME_UPPER", "SAME_UPPER")
        begins.append(total // 2 if upper else total - total // 2)
    if any(b < 0 for b in begins):
        raise GraphNotDifferentiableError(
            f"the onnx backend differentiates ConvTranspose with non-negative pads; node "
            f"{node.name!r} has an output_shape larger than its windows reach: give explicit pads "
            "and output_padding instead"
        )
    return begins


@rule("ConvTranspose")
def _conv_transpose(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, weight = node.input[0], node.input[1]
    group = int(attr(node, "group", 1))
    w = Window(ctx, node, _spatial(ctx, weight))
    begin = _conv_transpose_begin(ctx, node, w)
    sizes, outs = _spatial(ctx, x), _spatial(ctx, node.output[0])
    dx = dw = db = None
    if ctx.needs(x):  # dX = Conv(dY, W) over the padded output
        ends = [max((n - 1) * w.strides[k] + w.span(k) - outs[k] - begin[k], 0) for k, n in enumerate(sizes)]
        dx = ctx.op(
            "Conv", [dy, weight], group=group, strides=w.strides, dilations=w.dilations, pads=[*begin, *ends]
        )
    if ctx.needs(weight):  # the Conv's weight gradient with the roles of X and dY exchanged
        dw = _weight_gradient(ctx, dy, x, (node.output[0], x), w, group, begin)
    if len(node.input) > 2 and ctx.needs(node.input[2]):
        db = _bias_gradient(ctx, dy, ctx.rank(x))
    return [dx, dw, db]


def _pool_window(ctx: Context, node: onnx.NodeProto) -> Window:
    w = Window(ctx, node, attr(node, "kernel_shape"))
    if int(attr(node, "storage_order", 0)):
        raise GraphNotDifferentiableError(
            f"the onnx backend differentiates MaxPool with storage_order=0; node {node.name!r} has "
            "storage_order=1: export it with the default (row major) order"
        )
    return w


@rule("MaxPool")
def _max_pool(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    dy = dys[0]
    assert dy is not None
    x = node.input[0]
    _pool_window(ctx, node)
    y_dims = ctx.dims(node.output[0])
    indices = ctx.output_of(node, 1, f"{node.output[0]}_indices", onnx.TensorProto.INT64, y_dims)
    # dX: dY added at each window's maximum (Indices: flat positions in the whole of X)
    flat = ctx.op(
        "ScatterElements",
        [ctx.reshape(ctx.zeros_like(x), [-1]), ctx.reshape(indices, [-1]), ctx.reshape(dy, [-1])],
        axis=0,
        reduction="add",
    )
    return [ctx.reshape_like(flat, x)]


def _window_counts(w: Window, sizes: Sequence[int], outs: Sequence[int], include_pad: bool) -> np.ndarray:
    """The number of values each AveragePool window averages (``[*O]``): the inputs it covers,
    with the pads when ``include_pad`` (never beyond them: ceil_mode's last windows)."""
    per_axis = []
    for k, (n, o) in enumerate(zip(sizes, outs)):
        lo, hi = (-w.begin[k], n + w.end[k]) if include_pad else (0, n)
        starts = np.arange(o) * w.strides[k] - w.begin[k]
        taps = starts[:, None] + np.arange(w.kernel[k])[None, :] * w.dilations[k]
        per_axis.append(((taps >= lo) & (taps < hi)).sum(axis=1))
    counts = per_axis[0]
    for axis in per_axis[1:]:
        counts = np.multiply.outer(counts, axis)
    return np.asarray(counts, dtype=np.float64)


@rule("AveragePool")
def _average_pool(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    w = _pool_window(ctx, node)
    (_, c), sizes = _channels(ctx, x), _spatial(ctx, x)
    outs = _spatial(ctx, node.output[0])
    counts = _window_counts(w, sizes, outs, bool(attr(node, "count_include_pad", 0)))
    # dX = ConvTranspose(dY / count, ones) per channel (group = C)
    scaled = ctx.op("Mul", [dy, ctx.const((1.0 / counts)[None, None], like=x)])
    ones = ctx.const(np.ones([c, 1, *w.kernel]), like=x)
    t = _transposed_window(w, sizes, outs)
    return [ctx.op("ConvTranspose", [scaled, ones], group=c, **t)]


@rule("GlobalAveragePool")
def _global_average_pool(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    count = ctx.count(x, list(range(2, ctx.rank(x))))
    scale = ctx.const(1.0 / count, like=x) if isinstance(count, float) else ctx.op("Reciprocal", [count])
    return [ctx.op("Expand", [ctx.op("Mul", [dy, scale]), ctx.shape_of(x)])]


@rule("GlobalMaxPool")
def _global_max_pool(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    # dY to the positions holding the maximum, ties sharing it evenly (as ReduceMax's rule)
    hit = ctx.op("Cast", [ctx.op("Equal", [x, node.output[0]])], to=ctx.dtype(x))
    ties = ctx.reduce_sum(hit, list(range(2, ctx.rank(x))), keepdims=1)
    return [ctx.op("Mul", [hit, ctx.op("Div", [dy, ties])])]
