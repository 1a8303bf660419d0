"""The fused step's SGD update of an embedding table written sparse.

The Gather rule writes an embedding's gradient as ``ScatterND(zeros, ids, dY, add)``: a dense
table of zeros with the gathered rows added. The plain SGD update then reads the whole table
twice more (``W - lr * grad``): at BERT's 30522 x 256 table, the zeros, the scatter, the Mul and
the Sub were 20 ms of a 550 ms step on one thread. ``ScatterND(W, ids, (-lr) * dY, add)`` writes
the same new table in one copy of ``W`` (the rows an id repeats add in another order: rounding).
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper, numpy_helper


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


def _zero_fill(node: onnx.NodeProto | None) -> bool:
    """Whether ``node`` is a ConstantOfShape of zeros (its default value is a zero too)."""
    if node is None or node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
        return False
    value = next((a.t for a in node.attribute if a.name == "value"), None)
    return value is None or not numpy_helper.to_array(value).any()


def _scatter_add(node: onnx.NodeProto | None) -> bool:
    if node is None or node.op_type != "ScatterND" or node.domain not in ("", "ai.onnx"):
        return False
    return any(a.name == "reduction" and a.s == b"add" for a in node.attribute)


def _through_identities(
    name: str, producers: dict[str, onnx.NodeProto], uses: Counter[str]
) -> tuple[str, list[onnx.NodeProto]]:
    """The value behind ``name``'s chain of single-use Identity nodes (the gradient graph names
    each gradient by one), and those nodes."""
    chain = []
    while name in producers and producers[name].op_type == "Identity" and uses[name] == 1:
        chain.append(producers[name])
        name = producers[name].input[0]
    return name, chain


def _match(
    sub: onnx.NodeProto, producers: dict[str, onnx.NodeProto], uses: Counter[str], weights: set[str]
) -> tuple[list[onnx.NodeProto], onnx.NodeProto] | None:
    """``([Mul(lr, grad), Identity...], ScatterND(zeros, ids, dY))`` when ``sub`` is ``W - lr * grad`` of a
    weight whose gradient is only that scatter, else None."""
    if sub.op_type != "Sub" or sub.domain not in ("", "ai.onnx") or sub.input[0] not in weights:
        return None
    mul = producers.get(sub.input[1])
    if mul is None or mul.op_type != "Mul" or uses[mul.output[0]] != 1 or len(mul.input) != 2:
        return None
    grad, identities = _through_identities(mul.input[1], producers, uses)
    chain = [mul, *identities]
    scatter = producers.get(grad)
    if not _scatter_add(scatter) or uses[grad] != 1:
        return None
    assert scatter is not None
    return (chain, scatter) if _zero_fill(producers.get(scatter.input[0])) else None


def sparse_embedding_updates(model: onnx.ModelProto, weights: set[str]) -> int:
    """Rewrites, in place, every ``W - lr * ScatterND(zeros, ids, dY, add)`` of a weight in
    ``weights`` (a graph input of the zeros' shape: the Gather rule's axis-0 form) as
    ``ScatterND(W, ids, Neg(lr) * dY, add)``; returns how many it rewrote."""
    g = model.graph
    producers = _producers(g)
    uses: Counter[str] = Counter(i for n in g.node for i in n.input)
    uses.update(o.name for o in g.output)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    shapes: set[str] = set()  # the zeros' shape constants, dropped when nothing else reads them
    for k, sub in enumerate(g.node):
        found = _match(sub, producers, uses, weights)
        if found is None:
            continue
        chain, scatter = found
        mul = chain[0]
        neg = helper.make_node("Neg", [mul.input[0]], [f"{sub.output[0]}_neg_lr"], name=f"{sub.name}_neg_lr")
        rows = helper.make_node(
            "Mul", [neg.output[0], scatter.input[2]], [f"{sub.output[0]}_rows"], name=f"{sub.name}_rows"
        )
        new = helper.make_node(
            "ScatterND",
            [sub.input[0], scatter.input[1], rows.output[0]],
            list(sub.output),
            name=f"{sub.name}_sparse",
            reduction="add",
        )
        replaced[k] = [neg, rows, new]
        dropped.update(id(n) for n in (*chain, scatter))
        zeros = producers[scatter.input[0]]
        if uses[zeros.output[0]] == 1:
            dropped.add(id(zeros))
            shapes.update(zeros.input)
    if replaced:
        nodes = [m for k, n in enumerate(g.node) if id(n) not in dropped for m in replaced.get(k, [n])]
        del g.node[:]
        g.node.extend(nodes)
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        kept = [t for t in g.initializer if t.name in read or t.name not in shapes]
        del g.initializer[:]
        g.initializer.extend(kept)
    return len(replaced)
