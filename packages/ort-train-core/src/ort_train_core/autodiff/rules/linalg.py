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
    sa, sb = ctx.dims(a), ctx.dims(b)
    # 1-D operands as matrices: A (k) -> (1, k), B (k) -> (k, 1); dY gets the axis back
    a2 = ctx.op("Unsqueeze", [a, ctx.ints([0])]) if len(sa) == 1 else a
    b2 = ctx.op("Unsqueeze", [b, ctx.ints([1])]) if len(sb) == 1 else b
    sa2 = (1, sa[0]) if len(sa) == 1 else sa
    sb2 = (sb[0], 1) if len(sb) == 1 else sb
    batch = _batch_dims(sa2, sb2)
    sy2 = (*batch, sa2[-2], sb2[-1])
    added = ([-2] if len(sa) == 1 else []) + ([-1] if len(sb) == 1 else [])
    dy2 = ctx.op("Unsqueeze", [dy, ctx.ints(added)]) if added else dy
    da = db = None
    if ctx.needs(a) and len(sa2) == len(sb2) == 2:  # dA = dY @ B^T, one Gemm
        grad = ctx.op("Gemm", [dy2, b2], transB=1)
        da = _back_to(ctx, grad, (sa2[-2], sa2[-1]), a, len(sa))
    elif ctx.needs(a):  # dA = dY @ B^T
        grad = ctx.op("MatMul", [dy2, _swap_last(ctx, b2, len(sb2))])
        da = _back_to(ctx, grad, (*batch, sa2[-2], sa2[-1]), a, len(sa))
    if ctx.needs(b):  # dB = A^T @ dY; a 2-D B against batched A: one (rows, k)^T @ (rows, n)
        k, n = sa2[-1], sy2[-1]
        if len(sa2) == len(sb2) == 2:  # dB = A^T @ dY, one Gemm
            grad = ctx.op("Gemm", [a2, dy2], transA=1)
            db = ctx.op("Squeeze", [grad, ctx.ints([1])]) if len(sb) == 1 else grad
        elif len(sb2) == 2 and len(sa2) > 2 and isinstance(k, int) and isinstance(n, int):
            rows_a = ctx.reshape(a2, (-1, k))  # B has no batch axes: A's are the rows
            grad = ctx.op("Gemm", [rows_a, ctx.reshape(dy2, (-1, n))], transA=1)
            db = ctx.op("Squeeze", [grad, ctx.ints([1])]) if len(sb) == 1 else grad
        else:
            grad = ctx.op("MatMul", [_swap_last(ctx, a2, len(sa2)), dy2])
            db = _back_to(ctx, grad, (*batch, sb2[-2], sb2[-1]), b, len(sb))
    return [da, db]


Dims = tuple["int | str | None", ...]


def _batch_dims(sa: Dims, sb: Dims) -> Dims:
    """The broadcast batch dimensions of two matrix operands (symbolic where not static)."""
    n = max(len(sa), len(sb)) - 2
    ones: list[int | str | None] = [1] * n
    left = (ones + list(sa[:-2]))[-n:] if n else []
    right = (ones + list(sb[:-2]))[-n:] if n else []
    return tuple(
        y if x == 1 else x if y == 1 else (x if isinstance(x, int) else y) for x, y in zip(left, right)
    )


def _back_to(ctx: Context, grad: str, grad_dims: Dims, x: str, rank: int) -> str:
    """The product's gradient (batch axes broadcast) summed and shaped back to operand ``x``."""
    if rank == 1:  # the matrix form had an extra axis of size 1, at -2 for A, at -1 for B
        lead = list(range(len(grad_dims) - 2))
        summed = ctx.reduce_sum(grad, lead, keepdims=0) if lead else grad
        return ctx.reshape_like(summed, x)
    return ctx.unbroadcast(grad, grad_dims, x)


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
        dc = ctx.unbroadcast(scaled, ctx.dims(node.output[0]), c)
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
