"""Gradient rules of matrix products: MatMul (any rank, broadcast batch axes), Gemm (every
attribute) and two-operand Einsum."""

from __future__ import annotations

import onnx

from ...exceptions import GraphNotDifferentiableError
from .._context import Context, attr, rule

Grads = list["str | None"]


def _swap_last(ctx: Context, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return ctx.transpose(x, perm)


@rule("MatMul")
def _matmul(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    a, b = node.input
    sa, sb, sy = ctx.shape(a), ctx.shape(b), ctx.shape(node.output[0])
    # 1-D operands as matrices: A (k) -> (1, k), B (k) -> (k, 1); dY gets the axis back
    a2 = ctx.reshape(a, (1, sa[0])) if len(sa) == 1 else a
    b2 = ctx.reshape(b, (sb[0], 1)) if len(sb) == 1 else b
    sa2 = (1, sa[0]) if len(sa) == 1 else sa
    sb2 = (sb[0], 1) if len(sb) == 1 else sb
    batch = _batch_shape(sa2, sb2)
    sy2 = (*batch, sa2[-2], sb2[-1])
    dy2 = ctx.reshape(dy, sy2) if tuple(sy2) != tuple(sy) else dy
    da = db = None
    if ctx.needs(a):  # dA = dY @ B^T
        grad = ctx.op("MatMul", [dy2, _swap_last(ctx, b2, len(sb2))])
        da = _back_to(ctx, grad, (*batch, sa2[-2], sa2[-1]), a, sa)
    if ctx.needs(b):  # dB = A^T @ dY; a 2-D B against batched A: one (rows, k)^T @ (rows, n)
        if len(sb2) == 2 and len(sa2) > 2:
            rows = 1
            for d in sy2[:-1]:
                rows *= d
            a_rows = ctx.reshape(a2, (rows, sa2[-1]))  # B has no batch axes: A's are the batch
            grad = ctx.op("Gemm", [a_rows, ctx.reshape(dy2, (rows, sy2[-1]))], transA=1)
            db = ctx.reshape(grad, sb) if len(sb) == 1 else grad
        else:
            grad = ctx.op("MatMul", [_swap_last(ctx, a2, len(sa2)), dy2])
            db = _back_to(ctx, grad, (*batch, sb2[-2], sb2[-1]), b, sb)
    return [da, db]


def _batch_shape(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, ...]:
    left, right = list(sa[:-2]), list(sb[:-2])
    n = max(len(left), len(right))
    left = [1] * (n - len(left)) + left
    right = [1] * (n - len(right)) + right
    return tuple(max(x, y) for x, y in zip(left, right))


def _back_to(ctx: Context, grad: str, grad_shape: tuple[int, ...], x: str, shape: tuple[int, ...]) -> str:
    """The product's gradient (batch axes broadcast) summed and shaped back to operand ``x``."""
    if len(shape) == 1:  # the matrix form had an extra axis of size 1
        lead = list(range(len(grad_shape) - 2))
        summed = ctx.reduce_sum(grad, lead, keepdims=0) if lead else grad
        return ctx.reshape(summed, shape)
    return ctx.unbroadcast(grad, grad_shape, x)


@rule("Gemm")
def _gemm(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    a, b = node.input[:2]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    ta, tb = int(attr(node, "transA", 0)), int(attr(node, "transB", 0))
    da = db = dc = None
    if ctx.needs(a):  # A' = op(A): dA' = alpha dY @ B'^T, transposed back when transA
        if ta:
            da = ctx.op("Gemm", [b, dy], alpha=alpha, transA=tb, transB=1)
        else:
            da = ctx.op("Gemm", [dy, b], alpha=alpha, transB=1 - tb)
    if ctx.needs(b):  # dB' = alpha A'^T @ dY, transposed back when transB
        if tb:
            db = ctx.op("Gemm", [dy, a], alpha=alpha, transA=1, transB=ta)
        else:
            db = ctx.op("Gemm", [a, dy], alpha=alpha, transA=1 - ta)
    if c is not None and ctx.needs(c):  # dC = beta dY, summed over its broadcast axes
        scaled = dy if beta == 1.0 else ctx.op("Mul", [dy, ctx.const(beta, like=c)])
        dc = ctx.unbroadcast(scaled, ctx.shape(node.output[0]), c)
    return [da, db, dc]


def _einsum_terms(node: onnx.NodeProto, ctx: Context) -> tuple[str, str, str]:
    equation = attr(node, "equation")
    text = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    inputs, arrow, out = text.partition("->")
    terms = inputs.split(",")
    if len(terms) != 2 or "." in text or any(len(set(t)) != len(t) for t in terms):
        raise GraphNotDifferentiableError(
            f"the onnx backend differentiates Einsum with two operands, no ellipsis and no "
            f"repeated index in an operand; node {node.name!r} has {text!r}: write it with "
            "MatMul and Transpose, or use backend='onnxruntime-training'"
        )
    if not arrow:  # implicit output: the indices seen once, sorted
        joined = "".join(terms)
        out = "".join(sorted(ch for ch in set(joined) if joined.count(ch) == 1))
    return terms[0], terms[1], out


@rule("Einsum")
def _einsum(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    (dy,) = dys
    assert dy is not None
    ta, tb, out = _einsum_terms(node, ctx)
    grads: Grads = [None, None]
    for k, (mine, other) in enumerate(((ta, tb), (tb, ta))):
        x = node.input[k]
        if not ctx.needs(x):
            continue
        # dX = einsum(dY, other -> X's indices); indices only X has are broadcast back
        seen = [ch for ch in mine if ch in out or ch in other]
        grad = ctx.op("Einsum", [dy, node.input[1 - k]], equation=f"{out},{other}->{''.join(seen)}")
        if len(seen) != len(mine):
            sizes = dict(zip(mine, ctx.shape(x)))
            axes = [p for p, ch in enumerate(mine) if ch not in seen]
            grad = ctx.op("Unsqueeze", [grad, ctx.ints(axes)])
            grad = ctx.op("Expand", [grad, ctx.ints([sizes[ch] for ch in mine])])
        grads[k] = grad
    return grads
