"""Gradient rules of elementwise operators: arithmetic with broadcasting, activations, Clip,
Min/Max, Where, Cast, Dropout. Each reads like its derivative; broadcasts are undone by
:meth:`~.._context.Context.unbroadcast`."""

from __future__ import annotations

import math

import onnx

from .._context import Context, attr, rule

Grads = list["str | None"]


def _out_shape(ctx: Context, node: onnx.NodeProto) -> tuple[int | str | None, ...]:
    return ctx.dims(node.output[0])


def _to(ctx: Context, node: onnx.NodeProto, k: int, grad: str) -> str | None:
    """``grad`` (shaped like the output) summed back to input ``k``, if it needs a gradient."""
    x = node.input[k]
    return ctx.unbroadcast(grad, _out_shape(ctx, node), x) if ctx.needs(x) else None


@rule("Add")
def _add(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    return [_to(ctx, node, 0, dy), _to(ctx, node, 1, dy)]


@rule("Sub")
def _sub(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    db = ctx.op("Neg", [dy]) if ctx.needs(node.input[1]) else None
    return [_to(ctx, node, 0, dy), None if db is None else _to(ctx, node, 1, db)]


@rule("Mul")
def _mul(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    a, b = node.input
    assert dy is not None
    da = _to(ctx, node, 0, ctx.op("Mul", [dy, b])) if ctx.needs(a) else None  # dA = dY * B
    db = _to(ctx, node, 1, ctx.op("Mul", [dy, a])) if ctx.needs(b) else None  # dB = dY * A
    return [da, db]


@rule("Div")
def _div(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    a, b = node.input
    assert dy is not None
    da = _to(ctx, node, 0, ctx.op("Div", [dy, b])) if ctx.needs(a) else None  # dA = dY / B
    db = None
    if ctx.needs(b):  # dB = -dY * A / B^2 = -dY * Y / B
        db = _to(ctx, node, 1, ctx.op("Neg", [ctx.op("Div", [ctx.op("Mul", [dy, node.output[0]]), b])]))
    return [da, db]


@rule("Sum")
def _sum(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    return [_to(ctx, node, k, dy) for k in range(len(node.input))]


@rule("Mean")
def _mean(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    share = ctx.op("Mul", [dy, ctx.const(1.0 / len(node.input), like=node.output[0])])
    return [_to(ctx, node, k, share) for k in range(len(node.input))]


@rule("Neg")
def _neg(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    return [ctx.op("Neg", [dys[0]])]  # type: ignore[list-item]


@rule("Identity")
def _identity(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    return [dys[0]]


@rule("Cast")
def _cast(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (x,) = node.input
    return [ctx.op("Cast", [dys[0]], to=ctx.dtype(x))]  # type: ignore[list-item]


def _scaled(ctx: Context, dy: str | None, factor: str) -> Grads:
    """``[dY * factor]``: the rule of a unary operator whose derivative is ``factor``."""
    assert dy is not None
    return [ctx.op("Mul", [dy, factor])]


@rule("Abs")
def _abs(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    return _scaled(ctx, dys[0], ctx.op("Sign", [node.input[0]]))  # dX = dY * sign(X)


@rule("Pow")
def _pow(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    x, p = node.input
    assert dy is not None
    y = node.output[0]
    p_x = p if ctx.dtype(p) == ctx.dtype(x) else ctx.op("Cast", [p], to=ctx.dtype(x))
    zero = ctx.const(0.0, like=x)
    dx = None
    if ctx.needs(x):  # dX = dY * p * X^(p-1); 0 where p = 0 (torch: X^0 is constant, X = 0 too)
        power = ctx.op("Pow", [x, ctx.op("Sub", [p_x, ctx.const(1.0, like=x)])])
        slope = ctx.op("Mul", [p_x, power])
        if p not in ctx.values or bool((ctx.values[p] == 0).any()):
            slope = ctx.op("Where", [ctx.op("Equal", [p_x, zero]), zero, slope])
        dx = _to(ctx, node, 0, ctx.op("Mul", [dy, slope]))
    dp = None
    if ctx.needs(p):  # dp = dY * Y * log(X); 0 where X = 0 and p >= 0 (torch)
        at_zero = ctx.op("And", [ctx.op("Equal", [x, zero]), ctx.op("GreaterOrEqual", [p_x, zero])])
        slope = ctx.op("Where", [at_zero, zero, ctx.op("Mul", [y, ctx.op("Log", [x])])])
        dp = _to(ctx, node, 1, ctx.op("Mul", [dy, slope]))
    return [dx, dp]


@rule("Sqrt")
def _sqrt(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    y = node.output[0]  # dX = dY / (2 Y)
    return [ctx.op("Div", [dys[0], ctx.op("Add", [y, y])])]  # type: ignore[list-item]


@rule("Exp")
def _exp(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    return _scaled(ctx, dys[0], node.output[0])  # dX = dY * Y


@rule("Log")
def _log(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    return [ctx.op("Div", [dys[0], node.input[0]])]  # type: ignore[list-item]


@rule("Reciprocal")
def _reciprocal(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    y = node.output[0]  # dX = -dY * Y^2
    return [ctx.op("Neg", [ctx.op("Mul", [dys[0], ctx.op("Mul", [y, y])])])]  # type: ignore[list-item]


def _where_positive(ctx: Context, x: str, if_pos: str, if_not: str) -> str:
    zero = ctx.const(0.0, like=x)
    return ctx.op("Where", [ctx.op("Greater", [x, zero]), if_pos, if_not])


@rule("Relu")
def _relu(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None  # dX = dY where Y > 0 (0 at 0, as torch)
    # a product by the 0/1 mask, not Where(Y > 0, dY, 0): onnxruntime's Where against a scalar
    # took 460 us on 128x512 against 64 (1.19 and 1.32), 13 % of a 784-512-512-10 MLP's step
    y = node.output[0]
    mask = ctx.op("Cast", [ctx.op("Greater", [y, ctx.const(0.0, like=y)])], to=ctx.dtype(y))
    return [ctx.op("Mul", [dy, mask])]


@rule("LeakyRelu")
def _leaky_relu(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    slope = ctx.const(attr(node, "alpha", 0.01), like=x)
    return [_where_positive(ctx, x, dy, ctx.op("Mul", [dy, slope]))]


@rule("PRelu")
def _prelu(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, slope = node.input
    zero = ctx.const(0.0, like=x)
    positive = ctx.op("Greater", [x, zero])
    dx = ctx.op("Where", [positive, dy, ctx.op("Mul", [dy, slope])]) if ctx.needs(x) else None
    dslope = None
    if ctx.needs(slope):  # dSlope = dY * X where X <= 0
        dslope = _to(ctx, node, 1, ctx.op("Where", [positive, zero, ctx.op("Mul", [dy, x])]))
    return [dx, dslope]


@rule("Elu")
def _elu(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, y = node.input[0], node.output[0]
    alpha = ctx.const(attr(node, "alpha", 1.0), like=x)  # X <= 0: dY * (Y + alpha)
    return [_where_positive(ctx, x, dy, ctx.op("Mul", [dy, ctx.op("Add", [y, alpha])]))]


@rule("Selu")
def _selu(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x, y = node.input[0], node.output[0]
    alpha = attr(node, "alpha", 1.67326319217681884765625)
    gamma = attr(node, "gamma", 1.05070102214813232421875)
    pos = ctx.op("Mul", [dy, ctx.const(gamma, like=x)])  # X <= 0: dY * (Y + alpha * gamma)
    neg = ctx.op("Mul", [dy, ctx.op("Add", [y, ctx.const(alpha * gamma, like=x)])])
    return [_where_positive(ctx, x, pos, neg)]


@rule("Sigmoid")
def _sigmoid(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    y = node.output[0]  # dX = dY * Y * (1 - Y)
    return _scaled(ctx, dys[0], ctx.op("Mul", [y, ctx.op("Sub", [ctx.const(1.0, like=y), y])]))


@rule("Tanh")
def _tanh(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    y = node.output[0]  # dX = dY * (1 - Y^2)
    return _scaled(ctx, dys[0], ctx.op("Sub", [ctx.const(1.0, like=y), ctx.op("Mul", [y, y])]))


def _gaussian(ctx: Context, x: str, scale: float) -> str:
    """``scale * exp(-X^2 / 2)``."""
    half_sq = ctx.op("Mul", [ctx.op("Mul", [x, x]), ctx.const(-0.5, like=x)])
    return ctx.op("Mul", [ctx.op("Exp", [half_sq]), ctx.const(scale, like=x)])


@rule("Erf")
def _erf(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    x = node.input[0]  # dX = dY * 2/sqrt(pi) * exp(-X^2) = dY * exp(ln(2/sqrt(pi)) - X^2)
    square = ctx.op("Mul", [x, x])  # the factor in the exponent: one pass fewer (BERT's GELU)
    log_factor = ctx.const(math.log(2.0 / math.sqrt(math.pi)), like=x)
    return _scaled(ctx, dys[0], ctx.op("Exp", [ctx.op("Sub", [log_factor, square])]))


@rule("Gelu")
def _gelu(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    x = node.input[0]
    one, half = ctx.const(1.0, like=x), ctx.const(0.5, like=x)
    if attr(node, "approximate", b"none") in (b"tanh", "tanh"):
        # u = c (X + 0.044715 X^3), t = tanh(u):
        # dX = dY (0.5 (1 + t) + 0.5 X (1 - t^2) c (1 + 3 0.044715 X^2))
        c = math.sqrt(2.0 / math.pi)
        square = ctx.op("Mul", [x, x])
        cube = ctx.op("Mul", [square, x])
        inner = ctx.op("Add", [x, ctx.op("Mul", [cube, ctx.const(0.044715, like=x)])])
        t = ctx.op("Tanh", [ctx.op("Mul", [inner, ctx.const(c, like=x)])])
        du = ctx.op(
            "Mul",
            [
                ctx.op("Add", [one, ctx.op("Mul", [square, ctx.const(3 * 0.044715, like=x)])]),
                ctx.const(c, like=x),
            ],
        )
        sech2 = ctx.op("Sub", [one, ctx.op("Mul", [t, t])])
        left = ctx.op("Mul", [half, ctx.op("Add", [one, t])])
        right = ctx.op("Mul", [ctx.op("Mul", [half, x]), ctx.op("Mul", [sech2, du])])
        return _scaled(ctx, dys[0], ctx.op("Add", [left, right]))
    # exact: dX = dY (Phi(X) + X phi(X)), Phi(X) = 0.5 (1 + erf(X / sqrt 2))
    cdf = ctx.op(
        "Mul",
        [
            half,
            ctx.op("Add", [one, ctx.op("Erf", [ctx.op("Mul", [x, ctx.const(1 / math.sqrt(2), like=x)])])]),
        ],
    )
    pdf = _gaussian(ctx, x, 1.0 / math.sqrt(2.0 * math.pi))
    return _scaled(ctx, dys[0], ctx.op("Add", [cdf, ctx.op("Mul", [x, pdf])]))


@rule("HardSigmoid")
def _hard_sigmoid(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    y = node.output[0]  # dX = alpha dY where 0 < Y < 1
    inside = ctx.op(
        "And", [ctx.op("Greater", [y, ctx.const(0.0, like=y)]), ctx.op("Less", [y, ctx.const(1.0, like=y)])]
    )
    scaled = ctx.op("Mul", [dy, ctx.const(attr(node, "alpha", 0.2), like=y)])
    return [ctx.op("Where", [inside, scaled, ctx.const(0.0, like=y)])]


@rule("HardSwish")
def _hard_swish(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]  # torch: 0 up to -3 (included), dY (X/3 + 1/2) strictly inside, dY from 3
    slope = ctx.op("Add", [ctx.op("Mul", [x, ctx.const(1.0 / 3.0, like=x)]), ctx.const(0.5, like=x)])
    middle = ctx.op("Where", [ctx.op("Less", [x, ctx.const(3.0, like=x)]), ctx.op("Mul", [dy, slope]), dy])
    below = ctx.op("LessOrEqual", [x, ctx.const(-3.0, like=x)])
    return [ctx.op("Where", [below, ctx.const(0.0, like=x), middle])]


@rule("Softplus")
def _softplus(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    return _scaled(ctx, dys[0], ctx.op("Sigmoid", [node.input[0]]))  # dX = dY * sigmoid(X)


@rule("Softsign")
def _softsign(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    x = node.input[0]  # dX = dY / (1 + |X|)^2
    denom = ctx.op("Add", [ctx.const(1.0, like=x), ctx.op("Abs", [x])])
    return [ctx.op("Div", [dys[0], ctx.op("Mul", [denom, denom])])]  # type: ignore[list-item]


@rule("Clip")
def _clip(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    x = node.input[0]
    bounds = [(node.input[k] if len(node.input) > k and node.input[k] else None) for k in (1, 2)]
    for k, name in enumerate(("min", "max")):  # opset < 11: attributes
        value = attr(node, name)
        if value is not None and bounds[k] is None:
            bounds[k] = ctx.const(value, like=x)
    masks = []  # torch: the gradient passes where min <= X <= max
    if bounds[0] is not None:
        masks.append(ctx.op("GreaterOrEqual", [x, bounds[0]]))
    if bounds[1] is not None:
        masks.append(ctx.op("LessOrEqual", [x, bounds[1]]))
    if not masks:
        return [dy]
    inside = masks[0] if len(masks) == 1 else ctx.op("And", masks)
    return [ctx.op("Where", [inside, dy, ctx.const(0.0, like=x)])]


@rule("Min", "Max")
def _min_max(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    y = node.output[0]
    if len(node.input) == 1:
        return [dy]
    # each input equal to the result gets dY, shared evenly between ties (torch's rule)
    hits = [ctx.op("Cast", [ctx.op("Equal", [x, y])], to=ctx.dtype(y)) for x in node.input]
    share = ctx.op("Div", [dy, ctx.op("Sum", hits)])
    return [_to(ctx, node, k, ctx.op("Mul", [share, hit])) for k, hit in enumerate(hits)]


@rule("Where")
def _where(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    cond, a, b = node.input
    zero = ctx.const(0.0, like=node.output[0])
    da = _to(ctx, node, 1, ctx.op("Where", [cond, dy, zero])) if ctx.needs(a) else None
    db = _to(ctx, node, 2, ctx.op("Where", [cond, zero, dy])) if ctx.needs(b) else None
    return [None, da, db]


@rule("Dropout")
def _dropout(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    dy = dys[0]
    assert dy is not None
    training = ctx.optional_value(node, 2)
    ratio = ctx.optional_value(node, 1)
    rate = float(ratio) if ratio is not None else float(attr(node, "ratio", 0.5))
    if training is None or not bool(training) or rate == 0.0:
        return [dy]  # inference mode: the identity
    # training: the mask the forward drew (saved), scaled as the forward scaled: 1 / (1 - ratio)
    mask = ctx.output_of(node, 1, f"{node.output[0]}_mask")
    kept = ctx.op("Cast", [mask], to=ctx.dtype(node.input[0]))
    return [ctx.op("Mul", [ctx.op("Mul", [dy, kept]), ctx.const(1.0 / (1.0 - rate), like=node.input[0])])]
