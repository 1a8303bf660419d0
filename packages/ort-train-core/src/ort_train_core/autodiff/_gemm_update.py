"""The fused step's SGD update of a Gemm's weight written into the Gemm.

``W - lr * Gemm(A, B)`` reads and writes the weight-shaped gradient twice more after the product
(the Mul by the learning rate, the Sub): at the 784-512-512-10 MLP (batch 128) that was 15 % of
a one-thread step. ``Gemm(A, B, C=W, beta=1)`` with the smaller operand scaled by ``-lr`` first
writes the new weight in the product's own pass; chosen only where scaling the operand reads
fewer values than the two passes over the weight (batch rows below the weight's sizes).
"""

from __future__ import annotations

import math
from collections import Counter

import onnx
from onnx import helper

from ._sparse_update import _producers, _through_identities


def _numel(info: dict[str, onnx.ValueInfoProto], name: str) -> int | None:
    vi = info.get(name)
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = vi.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return int(math.prod(d.dim_value for d in dims))


def _plain_gemm(node: onnx.NodeProto | None) -> bool:
    return (
        node is not None
        and node.op_type == "Gemm"
        and node.domain in ("", "ai.onnx")
        and len(node.input) == 2
    )


def _match(
    sub: onnx.NodeProto, producers: dict[str, onnx.NodeProto], uses: Counter[str], weights: set[str]
) -> tuple[list[onnx.NodeProto], onnx.NodeProto] | None:
    """``([Mul(lr, grad), Identity...], Gemm(A, B))`` when ``sub`` is ``W - lr * grad`` of a
    weight whose gradient is only that two-operand Gemm, else None."""
    if sub.op_type != "Sub" or sub.domain not in ("", "ai.onnx") or sub.input[0] not in weights:
        return None
    mul = producers.get(sub.input[1])
    if mul is None or mul.op_type != "Mul" or uses[mul.output[0]] != 1 or len(mul.input) != 2:
        return None
    grad, chain = _through_identities(mul.input[1], producers, uses)
    gemm = producers.get(grad)
    if not _plain_gemm(gemm) or uses[grad] != 1:
        return None
    assert gemm is not None
    return [mul, *chain], gemm


def _scaled_operand(gemm: onnx.NodeProto, weight: str, info: dict[str, onnx.ValueInfoProto]) -> int | None:
    """Which operand of ``gemm`` to scale (0 or 1), or None where the two passes over the
    weight read fewer values (or a size is unknown)."""
    sizes = [_numel(info, gemm.input[0]), _numel(info, gemm.input[1]), _numel(info, weight)]
    if None in sizes:
        return None
    a, b, w = (int(s) for s in sizes)  # type: ignore[arg-type]
    k = 0 if a <= b else 1
    return k if min(a, b) < 2 * w else None


def gemm_weight_updates(model: onnx.ModelProto, weights: set[str]) -> int:
    """Rewrites, in place, every ``W - lr * Gemm(A, B)`` of a weight in ``weights`` as
    ``Gemm(A', B', W, beta=1)`` with ``A`` or ``B`` scaled by ``-lr`` (where it reads fewer
    values, :func:`_scaled_operand`); returns how many it rewrote."""
    g = model.graph
    producers = _producers(g)
    uses: Counter[str] = Counter(i for n in g.node for i in n.input)
    uses.update(o.name for o in g.output)
    info: dict[str, onnx.ValueInfoProto] | None = None
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for k, sub in enumerate(g.node):
        found = _match(sub, producers, uses, weights)
        if found is None:
            continue
        if info is None:  # inferred once, only where a candidate is found
            inferred = onnx.shape_inference.infer_shapes(model)
            info = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.input]}
        chain, gemm = found
        side = _scaled_operand(gemm, sub.input[0], info)
        if side is None:
            continue
        name = sub.output[0]
        neg = helper.make_node("Neg", [chain[0].input[0]], [f"{name}_neg_lr"], name=f"{sub.name}_neg_lr")
        scaled = helper.make_node(
            "Mul", [neg.output[0], gemm.input[side]], [f"{name}_scaled"], name=f"{sub.name}_scaled"
        )
        operands = list(gemm.input)
        operands[side] = scaled.output[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in gemm.attribute if a.name != "beta"}
        new = helper.make_node(
            "Gemm", [*operands, sub.input[0]], [name], name=f"{sub.name}_gemm", beta=1.0, **attrs
        )
        replaced[k] = [neg, scaled, new]
        dropped.update(id(n) for n in (*chain, gemm))
    if replaced:
        nodes = [m for k, n in enumerate(g.node) if id(n) not in dropped for m in replaced.get(k, [n])]
        del g.node[:]
        g.node.extend(nodes)
    return len(replaced)
