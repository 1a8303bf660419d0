"""The ``onnx`` backend's rules on shapes drawn by hypothesis (small bounds, derandomized):
broadcasting elementwise operators, MatMul of ranks 1-4 with batch broadcasting, reductions over
random axes, Softmax/LogSoftmax axes, Transpose permutations, Concat/Split axes and Slice
parameters; each drawn graph against float64 finite differences and against torch autograd
(see autodiff_oracle)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from autodiff_oracle import Graph, check_against_finite_differences, check_against_torch, values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

I64 = np.int64
SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
Draw = Any


def _rng(draw: Draw) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**16)))


def _node(op: str, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> list[Any]:
    return [helper.make_node(op, inputs, outputs or ["Y"], name=f"{op.lower()}_node", **attrs)]


def _dims(draw: Draw, rank: int, lo: int = 1, hi: int = 3) -> list[int]:
    return [draw(st.integers(lo, hi)) for _ in range(rank)]


# ---- elementwise with broadcasting --------------------------------------------------------------
#: op -> (operand count range, torch function of the operand list, domain of operand k)
ELEMENTWISE: dict[str, tuple[tuple[int, int], Any]] = {
    "Add": ((2, 2), lambda t, a: a[0] + a[1]),
    "Sub": ((2, 2), lambda t, a: a[0] - a[1]),
    "Mul": ((2, 2), lambda t, a: a[0] * a[1]),
    "Div": ((2, 2), lambda t, a: a[0] / a[1]),
    "Pow": ((2, 2), lambda t, a: a[0] ** a[1]),
    "Min": ((1, 3), lambda t, a: functools.reduce(t.minimum, a)),
    "Max": ((1, 3), lambda t, a: functools.reduce(t.maximum, a)),
    "Sum": ((1, 3), lambda t, a: functools.reduce(lambda u, v: u + v, a) + 0),
    "Mean": ((1, 3), lambda t, a: functools.reduce(lambda u, v: u + v, a) / len(a)),
    "Where": ((2, 2), None),
}


@st.composite
def elementwise(draw: Draw) -> Graph:
    """An elementwise operator on operands of shapes broadcasting to a drawn output shape."""
    op = draw(st.sampled_from(sorted(ELEMENTWISE)))
    (lo, hi), fn = ELEMENTWISE[op]
    rng = _rng(draw)
    out = _dims(draw, draw(st.integers(0, 3)))

    def shape() -> list[int]:
        rank = draw(st.integers(0, len(out)))
        return [d if draw(st.booleans()) else 1 for d in out[len(out) - rank :]]

    names = [f"X{k}" for k in range(draw(st.integers(lo, hi)))]
    inputs = {}
    for k, name in enumerate(names):
        domain: dict[str, Any] = {}
        if op == "Pow" and k == 0:
            domain = {"lo": 0.2, "hi": 2.0}  # a positive base: real powers
        elif op == "Div" and k == 1:
            domain = {"avoid": [0.0]}
        inputs[name] = values(rng, shape(), **domain)
    if op == "Where":
        cond = rng.random(shape()) < 0.5
        return Graph(
            f"where{out}",
            _node("Where", ["cond", *names]),
            inputs,
            lambda t, v: [t.where(t.tensor(cond), v["X0"], v["X1"])],
            {"cond": cond},
        )
    return Graph(f"{op}{out}", _node(op, names), inputs, lambda t, v: [fn(t, [v[n] for n in names])])


# ---- MatMul ------------------------------------------------------------------------------------
@st.composite
def matmul(draw: Draw) -> Graph:
    """MatMul of ranks 1-4 either side; batch axes drawn, each side's set to 1 or dropped."""
    rng = _rng(draw)
    ra, rb = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    m, k, n = _dims(draw, 3, 1, 4)
    batch = _dims(draw, max(ra, rb) - 2, 1, 3) if max(ra, rb) > 2 else []

    def side(rank: int, last: list[int]) -> list[int]:
        mine = batch[len(batch) - (rank - 2) :] if rank > 2 else []
        return [*[d if draw(st.booleans()) else 1 for d in mine], *last]

    sa = [k] if ra == 1 else side(ra, [m, k])
    sb = [k] if rb == 1 else side(rb, [k, n])
    inputs = {"A": values(rng, sa), "B": values(rng, sb)}
    return Graph(
        f"matmul{sa}x{sb}", _node("MatMul", ["A", "B"]), inputs, lambda t, v: [t.matmul(v["A"], v["B"])]
    )


# ---- reductions --------------------------------------------------------------------------------
REDUCTIONS: dict[str, Any] = {
    "ReduceSum": lambda t, a, d, k: a.sum(d, keepdim=k),
    "ReduceMean": lambda t, a, d, k: a.mean(d, keepdim=k),
    "ReduceMax": lambda t, a, d, k: a.amax(d, keepdim=k),
    "ReduceMin": lambda t, a, d, k: a.amin(d, keepdim=k),
    "ReduceL1": lambda t, a, d, k: a.abs().sum(d, keepdim=k),
    "ReduceL2": lambda t, a, d, k: (a * a).sum(d, keepdim=k).sqrt(),
    "ReduceSumSquare": lambda t, a, d, k: (a * a).sum(d, keepdim=k),
    "ReduceLogSumExp": lambda t, a, d, k: t.logsumexp(a, d, keepdim=k),
}


@st.composite
def reduction(draw: Draw) -> Graph:
    """A reduction over drawn axes (none: all), keepdims drawn; the axes an attribute (opset 17,
    ReduceSum excepted) or an input (opset 18)."""
    op = draw(st.sampled_from(sorted(REDUCTIONS)))
    rng = _rng(draw)
    shape = _dims(draw, draw(st.integers(1, 3)), 1, 4)
    rank = len(shape)
    axes = draw(st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank, max_size=rank))
    keepdims, opset = draw(st.integers(0, 1)), draw(st.sampled_from([17, 18]))
    x = values(rng, shape, avoid=[0.0] if op == "ReduceL1" else ())
    dims = tuple(a % rank for a in axes) if axes else tuple(range(rank))
    fn = REDUCTIONS[op]
    consts, attrs, inputs = {}, {}, ["X"]
    if axes and (opset == 18 or op == "ReduceSum"):
        consts, inputs = {"axes": np.array(axes, I64)}, ["X", "axes"]
    elif axes:
        attrs = {"axes": axes}
    return Graph(
        f"{op}{shape}{axes}k{keepdims}",
        _node(op, inputs, keepdims=keepdims, **attrs),
        {"X": x},
        lambda t, v: [fn(t, v["X"], dims, bool(keepdims))],
        consts,
        opset=opset,
    )


@st.composite
def softmax(draw: Draw) -> Graph:
    op = draw(st.sampled_from(["Softmax", "LogSoftmax"]))
    shape = _dims(draw, draw(st.integers(1, 3)), 1, 4)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    fn = "softmax" if op == "Softmax" else "log_softmax"
    return Graph(
        f"{op}{shape}a{axis}",
        _node(op, ["X"], axis=axis),
        {"X": values(_rng(draw), shape, -3, 3)},
        lambda t, v: [getattr(t.nn.functional, fn)(v["X"], axis)],
    )


@st.composite
def transpose(draw: Draw) -> Graph:
    shape = _dims(draw, draw(st.integers(1, 4)), 1, 3)
    perm = draw(st.permutations(range(len(shape))))
    return Graph(
        f"transpose{shape}{perm}",
        _node("Transpose", ["X"], perm=perm),
        {"X": values(_rng(draw), shape)},
        lambda t, v: [v["X"].permute(*perm)],
    )


@st.composite
def concat_split(draw: Draw) -> Graph:
    """Concat of 1-3 parts, or Split into 1-3 parts (sizes given, or num_outputs at opset 18),
    along a drawn (maybe negative) axis."""
    rng = _rng(draw)
    shape = _dims(draw, draw(st.integers(1, 3)), 1, 3)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = _dims(draw, draw(st.integers(1, 3)), 1, 3)
    if draw(st.booleans()):
        parts = {
            f"X{k}": values(rng, [*shape[: axis % len(shape)], s, *shape[axis % len(shape) + 1 :]])
            for k, s in enumerate(sizes)
        }
        return Graph(
            f"concat{next(iter(parts.values())).shape}{sizes}a{axis}",
            _node("Concat", list(parts), axis=axis),
            parts,
            lambda t, v: [t.cat([v[n] for n in parts], axis)],
        )
    shape[axis % len(shape)] = sum(sizes)
    outs = [f"Y{k}" for k in range(len(sizes))]
    if draw(st.booleans()):
        sizes = [-(-sum(sizes) // len(sizes))] * len(sizes)
        sizes[-1] = shape[axis % len(shape)] - sum(sizes[:-1])
        if sizes[-1] <= 0:
            return draw(concat_split())
        nodes, consts = _node("Split", ["X"], outs, axis=axis, num_outputs=len(outs)), {}
    else:
        nodes, consts = _node("Split", ["X", "split"], outs, axis=axis), {"split": np.array(sizes, I64)}
    return Graph(
        f"split{shape}{sizes}a{axis}",
        nodes,
        {"X": values(rng, shape)},
        lambda t, v: list(v["X"].split(sizes, axis)),
        consts,
        outs,
    )


@st.composite
def slice_(draw: Draw) -> Graph:
    """Slice of some axes (axes input given or not, negative or not) with drawn starts, ends
    (past the bounds too) and steps (negative too), non-empty."""
    rng = _rng(draw)
    shape = _dims(draw, draw(st.integers(1, 3)), 1, 5)
    rank = len(shape)
    axes = draw(st.lists(st.integers(0, rank - 1), unique=True, min_size=1, max_size=rank))
    params = [
        (draw(st.integers(-6, 6)), draw(st.integers(-7, 7)), draw(st.sampled_from([1, 1, 2, 3, -1, -2])))
        for _ in axes
    ]
    index = [slice(None)] * rank
    for a, (start, stop, step) in zip(axes, params):
        index[a] = slice(start, stop, step)
    where = np.arange(int(np.prod(shape))).reshape(shape)[tuple(index)]
    if where.size == 0:
        return draw(slice_())
    consts = {k: np.array([p[j] for p in params], I64) for j, k in enumerate(("starts", "ends", "steps"))}
    names = ["X", "starts", "ends"]
    if draw(st.booleans()) or any(step != 1 for _, _, step in params) or axes != list(range(len(axes))):
        consts["axes"] = np.array([a - rank if draw(st.booleans()) else a for a in axes], I64)
        names += ["axes", "steps"]
    return Graph(
        f"slice{shape}{axes}{params}",
        _node("Slice", names),
        {"X": values(rng, shape)},
        lambda t, v: [v["X"].reshape(-1)[t.tensor(where.ravel().copy())].reshape(where.shape)],
        {k: consts[k] for k in names[1:]},
    )


FAMILIES = {
    "elementwise": elementwise(),
    "matmul": matmul(),
    "reduction": reduction(),
    "softmax": softmax(),
    "transpose": transpose(),
    "concat_split": concat_split(),
    "slice": slice_(),
}


def _drawn(family: str, data: st.DataObject) -> Graph:
    """A graph of ``family``, differentiated with respect to all its inputs or some of them
    (a rule then writes the gradients of those only)."""
    g = data.draw(FAMILIES[family])
    names = list(g.inputs)
    if len(names) > 1 and data.draw(st.booleans()):
        g.wrt = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names) - 1, unique=True))
    return g


@pytest.mark.parametrize("family", list(FAMILIES))
@SETTINGS
@given(data=st.data())
def test_drawn_against_finite_differences(family: str, data: st.DataObject) -> None:
    check_against_finite_differences(_drawn(family, data))


@pytest.mark.parametrize("family", list(FAMILIES))
@SETTINGS
@given(data=st.data())
def test_drawn_against_torch(family: str, data: st.DataObject) -> None:
    pytest.importorskip("torch")
    check_against_torch(_drawn(family, data))
