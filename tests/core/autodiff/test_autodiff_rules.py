"""Every gradient rule of the ``onnx`` backend on fixed one-node graphs (each attribute form),
against torch autograd (float32 graph run by onnxruntime) and float64 finite differences of
onnx's reference evaluator (see autodiff_oracle). The shape-drawing families are in
test_autodiff_shapes.py, the conventions at kinks, Dropout and the walk in test_autodiff_walk.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from autodiff_oracle import Graph, check_against_finite_differences, check_against_torch, rng_for, values
from onnx import TensorProto, helper

I64 = np.int64
CASES: list[Graph] = []


def case(
    name: str,
    op: str,
    inputs: dict[str, np.ndarray],
    torch_fn: Callable[[Any, dict[str, Any]], Any],
    consts: dict[str, np.ndarray] | None = None,
    node_inputs: list[str] | None = None,
    outputs: int | list[str] = 1,
    opset: int = 18,
    **attrs: Any,
) -> None:
    """Registers the one-node graph ``op(node_inputs) -> Y`` (``node_inputs``: the inputs then
    the consts by default); ``torch_fn`` returns one tensor, or a list for several outputs."""
    consts = consts or {}
    names = node_inputs if node_inputs is not None else [*inputs, *consts]
    outs = (
        [f"Y{k}" for k in range(outputs)]
        if isinstance(outputs, int) and outputs > 1
        else (["Y"] if isinstance(outputs, int) else outputs)
    )
    node = helper.make_node(op, names, outs, name=f"{name}_node", **attrs)
    outs = [o for o in outs if not o.startswith("unused")]

    def fn(t: Any, v: dict[str, Any]) -> list[Any]:
        out = torch_fn(t, v)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    CASES.append(Graph(name, [node], inputs, fn, consts, outs, opset))


def x(name: str, shape: tuple[int, ...] = (3, 4), **kw: Any) -> np.ndarray:
    return values(rng_for(name), shape, **kw)


# ---- elementwise, one input -------------------------------------------------------------------
UNARY: list[tuple[str, str, dict[str, Any], dict[str, Any], Callable[[Any, Any], Any], int]] = [
    ("neg", "Neg", {}, {}, lambda t, a: -a, 18),
    ("abs", "Abs", {}, {"avoid": [0.0]}, lambda t, a: a.abs(), 18),
    ("sqrt", "Sqrt", {}, {"lo": 0.2, "hi": 2.0}, lambda t, a: a.sqrt(), 18),
    ("exp", "Exp", {}, {}, lambda t, a: a.exp(), 18),
    ("log", "Log", {}, {"lo": 0.2, "hi": 2.0}, lambda t, a: a.log(), 18),
    ("reciprocal", "Reciprocal", {}, {"avoid": [0.0]}, lambda t, a: 1 / a, 18),
    ("relu", "Relu", {}, {"avoid": [0.0]}, lambda t, a: t.relu(a), 18),
    (
        "leaky_relu_default",
        "LeakyRelu",
        {},
        {"avoid": [0.0]},
        lambda t, a: t.nn.functional.leaky_relu(a, 0.01),
        18,
    ),
    (
        "leaky_relu_alpha",
        "LeakyRelu",
        {"alpha": 0.3},
        {"avoid": [0.0]},
        lambda t, a: t.nn.functional.leaky_relu(a, 0.3),
        18,
    ),
    ("elu_default", "Elu", {}, {"avoid": [0.0]}, lambda t, a: t.nn.functional.elu(a), 18),
    ("elu_alpha", "Elu", {"alpha": 0.7}, {"avoid": [0.0]}, lambda t, a: t.nn.functional.elu(a, 0.7), 18),
    ("selu_default", "Selu", {}, {"avoid": [0.0]}, lambda t, a: t.nn.functional.selu(a), 18),
    (
        "selu_attrs",
        "Selu",
        {"alpha": 1.2, "gamma": 0.9},
        {"avoid": [0.0]},
        lambda t, a: 0.9 * t.where(a > 0, a, 1.2 * (a.exp() - 1)),
        18,
    ),
    ("sigmoid", "Sigmoid", {}, {"lo": -4, "hi": 4}, lambda t, a: a.sigmoid(), 18),
    ("tanh", "Tanh", {}, {"lo": -3, "hi": 3}, lambda t, a: a.tanh(), 18),
    ("erf", "Erf", {}, {"lo": -2.5, "hi": 2.5}, lambda t, a: t.erf(a), 18),
    ("gelu", "Gelu", {}, {"lo": -4, "hi": 4}, lambda t, a: t.nn.functional.gelu(a), 20),
    (
        "gelu_tanh",
        "Gelu",
        {"approximate": "tanh"},
        {"lo": -4, "hi": 4},
        lambda t, a: t.nn.functional.gelu(a, approximate="tanh"),
        20,
    ),
    (
        "hard_sigmoid_default",
        "HardSigmoid",
        {},
        {"lo": -4, "hi": 4, "avoid": [-2.5, 2.5]},
        lambda t, a: t.clamp(0.2 * a + 0.5, 0, 1),
        18,
    ),
    (
        "hard_sigmoid_attrs",
        "HardSigmoid",
        {"alpha": 0.5, "beta": 0.6},
        {"avoid": [-1.2, 0.8]},
        lambda t, a: t.clamp(0.5 * a + 0.6, 0, 1),
        18,
    ),
    (
        "hard_swish",
        "HardSwish",
        {},
        {"lo": -5, "hi": 5, "avoid": [-3.0, 3.0]},
        lambda t, a: t.nn.functional.hardswish(a),
        18,
    ),
    ("softplus", "Softplus", {}, {"lo": -4, "hi": 4}, lambda t, a: t.nn.functional.softplus(a), 18),
    ("softsign", "Softsign", {}, {"avoid": [0.0]}, lambda t, a: t.nn.functional.softsign(a), 18),
    ("identity", "Identity", {}, {}, lambda t, a: a, 18),
]
for _name, _op, _attrs, _domain, _fn, _opset in UNARY:
    case(
        _name,
        _op,
        {"X": x(_name, (3, 4), **_domain)},
        lambda t, v, f=_fn: f(t, v["X"]),
        opset=_opset,
        **_attrs,
    )

case("cast_to_double", "Cast", {"X": x("cast")}, lambda t, v: v["X"].double(), to=TensorProto.DOUBLE)

# Clip: the bounds as inputs (opset >= 11), each one absent in turn; values away from them
for _lo, _hi in [(-0.5, 0.7), (-0.5, None), (None, 0.7), (None, None)]:
    _consts = {k: np.array(b, np.float32) for k, b in (("lo", _lo), ("hi", _hi)) if b is not None}
    case(
        f"clip_{_lo}_{_hi}",
        "Clip",
        {"X": x(f"clip{_lo}{_hi}", avoid=[-0.5, 0.7])},
        lambda t, v, lo=_lo, hi=_hi: (
            t.clamp(v["X"], lo, hi) if lo is not None or hi is not None else v["X"] + 0
        ),
        _consts,
        ["X", "lo" if _lo is not None else "", "hi" if _hi is not None else ""],
    )

# PRelu: the slope broadcast (unidirectionally) to X, both differentiated
for _shape in [(4,), (1,), (3, 1), (3, 4)]:
    case(
        f"prelu_slope{_shape}",
        "PRelu",
        {"X": x(f"prelu{_shape}", avoid=[0.0]), "slope": x(f"slope{_shape}", _shape)},
        lambda t, v: t.where(v["X"] > 0, v["X"], v["slope"] * v["X"]),
    )

# Pow: a constant exponent (float, integer), and a differentiated broadcast exponent
case(
    "pow_const_float",
    "Pow",
    {"X": x("powc", lo=0.2, hi=2)},
    lambda t, v: v["X"] ** 2.5,
    {"p": np.array(2.5, np.float32)},
)
case("pow_const_int", "Pow", {"X": x("powi")}, lambda t, v: v["X"] ** 3, {"p": np.array(3, I64)})
case("pow_both", "Pow", {"X": x("powb", lo=0.2, hi=2), "p": x("powp", (4,))}, lambda t, v: v["X"] ** v["p"])
case(
    "pow_base_broadcast",
    "Pow",
    {"X": x("powbb", (4,), lo=0.2, hi=2), "p": x("powbp", (3, 4))},
    lambda t, v: v["X"] ** v["p"],
)

# ---- Gemm: every transA/transB, alpha/beta, C absent or of every broadcast shape -------------
M, K, N = 3, 4, 5
for _ta, _tb, (_alpha, _beta), _c in itertools.product(
    (0, 1), (0, 1), ((1.0, 1.0), (0.7, -1.3)), (None, (), (1,), (N,), (M, 1), (1, N), (M, N))
):
    _name = f"gemm_ta{_ta}_tb{_tb}_a{_alpha}_b{_beta}_c{_c}"
    _in = {"A": x(_name + "A", (K, M) if _ta else (M, K)), "B": x(_name + "B", (N, K) if _tb else (K, N))}
    if _c is not None:
        _in["C"] = x(_name + "C", _c)

    def _gemm(
        t: Any, v: dict[str, Any], ta: int = _ta, tb: int = _tb, alpha: float = _alpha, beta: float = _beta
    ) -> Any:
        a, b = (v["A"].T if ta else v["A"]), (v["B"].T if tb else v["B"])
        return alpha * a @ b + (beta * v["C"] if "C" in v else 0)

    case(_name, "Gemm", _in, _gemm, transA=_ta, transB=_tb, alpha=_alpha, beta=_beta)

# ---- Einsum: two operands, explicit and implicit outputs, an index only one operand has -------
for _eq, _sa, _sb in [
    ("ij,jk->ik", (3, 4), (4, 2)),
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 2)),
    ("ij,jk", (3, 4), (4, 2)),  # implicit: ik
    ("ij,kj->k", (3, 4), (2, 4)),  # i only in the first operand, summed
    ("ij,k->ijk", (3, 4), (2,)),  # an outer product
    ("ij,ij->", (3, 4), (3, 4)),  # a full contraction: a scalar
    ("bi,bj->ij", (2, 3), (2, 4)),
    ("ik,jk->ji", (3, 4), (2, 4)),
    ("ij,jk->i", (3, 4), (4, 2)),  # k only in the second operand, summed
]:
    case(
        f"einsum_{_eq}",
        "Einsum",
        {"A": x(_eq + "A", _sa), "B": x(_eq + "B", _sb)},
        lambda t, v, eq=_eq: t.einsum(eq, v["A"], v["B"]),
        equation=_eq,
    )

# ---- shape operators ---------------------------------------------------------------------------
X3 = (2, 3, 4)
case(
    "reshape",
    "Reshape",
    {"X": x("reshape", X3)},
    lambda t, v: v["X"].reshape(4, 6),
    {"s": np.array([4, -1], I64)},
)
case(
    "reshape_zero",
    "Reshape",
    {"X": x("reshape0", X3)},
    lambda t, v: v["X"].reshape(2, 12),
    {"s": np.array([0, 12], I64)},
)
for _axis in (0, 1, 2, -1):
    case(
        f"flatten_{_axis}",
        "Flatten",
        {"X": x(f"flatten{_axis}", X3)},
        lambda t, v, a=_axis: v["X"].reshape(math.prod(X3[: a % 3 if a >= 0 else 2]), -1),
        axis=_axis,
    )
case("transpose_default", "Transpose", {"X": x("transpose", X3)}, lambda t, v: v["X"].permute(2, 1, 0))
case(
    "squeeze_axes",
    "Squeeze",
    {"X": x("squeeze", (1, 3, 1, 4))},
    lambda t, v: v["X"].reshape(3, 4),
    {"a": np.array([0, -2], I64)},
)
case("squeeze_all", "Squeeze", {"X": x("squeeze_all", (1, 3, 1, 4))}, lambda t, v: v["X"].reshape(3, 4))
case(
    "unsqueeze",
    "Unsqueeze",
    {"X": x("unsqueeze")},
    lambda t, v: v["X"].reshape(1, 3, 4, 1),
    {"a": np.array([0, -1], I64)},
)
case(
    "expand_lead",
    "Expand",
    {"X": x("expand", (3, 1))},
    lambda t, v: v["X"].expand(2, 3, 4),
    {"s": np.array([2, 3, 4], I64)},
)
case(
    "expand_vector",
    "Expand",
    {"X": x("expandv", (4,))},
    lambda t, v: v["X"].expand(3, 4),
    {"s": np.array([3, 1], I64)},
)
case(
    "expand_noop",
    "Expand",
    {"X": x("expandn", (3, 4))},
    lambda t, v: v["X"] + 0,
    {"s": np.array([1, 4], I64)},
)
case("tile", "Tile", {"X": x("tile", (2, 3))}, lambda t, v: v["X"].repeat(2, 3), {"r": np.array([2, 3], I64)})
case(
    "tile_ones",
    "Tile",
    {"X": x("tile1", X3)},
    lambda t, v: v["X"].repeat(1, 2, 1),
    {"r": np.array([1, 2, 1], I64)},
)
case(
    "split_num_outputs",
    "Split",
    {"X": x("split3", (7, 2))},
    lambda t, v: list(v["X"].split([3, 3, 1])),
    outputs=3,
    axis=0,
    num_outputs=3,
)
case(
    "split_sizes_unused",
    "Split",
    {"X": x("split_unused", (2, 5))},
    lambda t, v: [v["X"][:, 2:]],
    {"s": np.array([2, 3], I64)},
    outputs=["unused", "Y"],
    axis=-1,
)
case(
    "concat_three",
    "Concat",
    {"A": x("ca", (2, 1)), "B": x("cb", (2, 3)), "C": x("cc", (2, 2))},
    lambda t, v: t.cat([v["A"], v["B"], v["C"]], 1),
    axis=-1,
)


def taken(t: Any, a: Any, index: tuple[slice, ...]) -> Any:
    """``a[index]`` for any steps (torch slices with positive steps only): the positions
    numpy's slicing reads, gathered."""
    where = np.arange(a.numel()).reshape(tuple(a.shape))[index]
    return a.reshape(-1)[t.tensor(where.ravel().copy())].reshape(where.shape)


# Slice: steps, negative steps, negative starts, bounds past the ends, negative axes
BIG = np.iinfo(np.int64).max
for _name, (_st, _en, _ax, _sp), _index in [
    ("slice_plain", ([1, 0], [3, 3], [0, 1], [1, 1]), (slice(1, 3), slice(0, 3))),
    ("slice_negative_start", ([-2], [BIG], [1], [1]), (slice(None), slice(-2, None))),
    ("slice_step2", ([0, 1], [BIG, 4], [0, 1], [2, 2]), (slice(0, None, 2), slice(1, 4, 2))),
    ("slice_negative_step", ([-1], [-BIG], [-1], [-1]), (slice(None), slice(None, None, -1))),
    ("slice_negative_step2", ([3, 2], [0, -5], [0, 1], [-2, -1]), (slice(3, 0, -2), slice(2, None, -1))),
]:
    case(
        _name,
        "Slice",
        {"X": x(_name, (5, 4))},
        lambda t, v, i=_index: taken(t, v["X"], i),
        {
            "st": np.array(_st, I64),
            "en": np.array(_en, I64),
            "ax": np.array(_ax, I64),
            "sp": np.array(_sp, I64),
        },
    )
case(
    "slice_no_axes",
    "Slice",
    {"X": x("slice_no_axes", (5, 4))},
    lambda t, v: v["X"][1:-1, :2],
    {"st": np.array([1, 0], I64), "en": np.array([-1, 2], I64)},
)

# Gather (as an embedding and on other axes; repeated and negative ids), GatherElements
_ids = np.array([[0, 2, -1], [2, 2, 0]], I64)
for _axis, _shape in [(0, (4, 3)), (1, (2, 4, 3)), (-1, (2, 3, 4))]:
    case(
        f"gather_axis{_axis}",
        "Gather",
        {"X": x(f"gather{_axis}", _shape)},
        lambda t, v, a=_axis: t.index_select(
            v["X"], a, t.tensor(np.where(_ids < 0, _ids + v["X"].shape[a], _ids).ravel())
        ).reshape(*v["X"].shape[: a % v["X"].ndim], 2, 3, *v["X"].shape[a % v["X"].ndim + 1 :]),
        {"i": _ids},
        axis=_axis,
    )
case(
    "gather_scalar_id",
    "Gather",
    {"X": x("gather_scalar", (4, 3))},
    lambda t, v: v["X"][:, -1],
    {"i": np.array(-1, I64)},
    axis=1,
)
case(
    "gather_int32_ids",
    "Gather",
    {"X": x("gather32", (4, 3))},
    lambda t, v: v["X"][[1, 1, 3]],
    {"i": np.array([1, 1, 3], np.int32)},
)
_ge = np.array([[0, 2, 2], [-1, 0, 0]], I64)
# (indices may be smaller than the data on the other axes too)
for _axis, _shape in [(0, (3, 3)), (1, (2, 4)), (0, (4, 5)), (-1, (3, 4))]:
    case(
        f"gather_elements_axis{_axis}{_shape}",
        "GatherElements",
        {"X": x(f"ge{_axis}", _shape)},
        lambda t, v, a=_axis: t.gather(v["X"], a, t.tensor(np.where(_ge < 0, _ge + v["X"].shape[a], _ge))),
        {"i": _ge},
        axis=_axis,
    )

# Pad (constant mode): pads, a pad value, negative pads (cropping), axes (opset 18)
case(
    "pad",
    "Pad",
    {"X": x("pad")},
    lambda t, v: t.nn.functional.pad(v["X"], (2, 3, 1, 0), value=0.5),
    {"p": np.array([1, 2, 0, 3], I64), "c": np.array(0.5, np.float32)},
)
case(
    "pad_negative",
    "Pad",
    {"X": x("padn", (4, 5))},
    lambda t, v: t.nn.functional.pad(v["X"], (1, -2, -1, 2)),
    {"p": np.array([-1, 1, 2, -2], I64)},
)
case(
    "pad_axes",
    "Pad",
    {"X": x("pada", X3)},
    lambda t, v: t.nn.functional.pad(v["X"], (2, 1)),
    {"p": np.array([2, 1], I64), "a": np.array([-1], I64)},
    ["X", "p", "", "a"],
)

# CumSum: each exclusive/reverse form, on a positive and a negative axis
for (_ex, _rev), _axis in itertools.product(itertools.product((0, 1), (0, 1)), (1, -2)):

    def _cumsum(t: Any, v: dict[str, Any], ex: int = _ex, rev: int = _rev, axis: int = _axis) -> Any:
        a = v["X"].flip(axis) if rev else v["X"]
        y = a.cumsum(axis) - (a if ex else 0)
        return y.flip(axis) if rev else y

    case(
        f"cumsum_ex{_ex}_rev{_rev}_axis{_axis}",
        "CumSum",
        {"X": x(f"cs{_ex}{_rev}{_axis}")},
        _cumsum,
        {"a": np.array(_axis, I64)},
        exclusive=_ex,
        reverse=_rev,
    )

# reductions with their axes as an attribute (opset 17) and noop_with_empty_axes (opset 18)
case(
    "reduce_l1_attr",
    "ReduceL1",
    {"X": x("rl1", X3, avoid=[0.0])},
    lambda t, v: v["X"].abs().sum(1),
    opset=17,
    axes=[1],
    keepdims=0,
)
case(
    "reduce_mean_noop",
    "ReduceMean",
    {"X": x("rmn")},
    lambda t, v: v["X"] + 0,
    {"a": np.zeros(0, I64)},
    noop_with_empty_axes=1,
)
case("reduce_sum_all", "ReduceSum", {"X": x("rsa", X3)}, lambda t, v: v["X"].sum().reshape(1, 1, 1))

# opsets below 17 (the backend converts them up first): attributes where inputs came later,
# Softmax's old semantics (the trailing axes flattened from ``axis`` on)
case(
    "softmax_opset11",
    "Softmax",
    {"X": x("sm11", X3)},
    lambda t, v: v["X"].reshape(2, 12).softmax(1).reshape(X3),
    opset=11,
    axis=1,
)
case(
    "log_softmax_opset11",
    "LogSoftmax",
    {"X": x("lsm11", X3)},
    lambda t, v: v["X"].reshape(2, 12).log_softmax(1).reshape(X3),
    opset=11,
    axis=1,
)
case(
    "reduce_sum_opset11",
    "ReduceSum",
    {"X": x("rs11", X3)},
    lambda t, v: v["X"].sum(1),
    opset=11,
    axes=[1],
    keepdims=0,
)
case(
    "clip_opset10",
    "Clip",
    {"X": x("clip10", avoid=[-0.5, 0.7])},
    lambda t, v: v["X"].clamp(-0.5, 0.7),
    opset=10,
    min=-0.5,
    max=0.7,
)
case(
    "unsqueeze_opset11",
    "Unsqueeze",
    {"X": x("unsq11")},
    lambda t, v: v["X"].reshape(3, 1, 4),
    opset=11,
    axes=[1],
)
case(
    "squeeze_opset11",
    "Squeeze",
    {"X": x("sq11", (3, 1, 4))},
    lambda t, v: v["X"].reshape(3, 4),
    opset=11,
    axes=[1],
)
case(
    "split_opset11",
    "Split",
    {"X": x("split11", (5, 2))},
    lambda t, v: list(v["X"].split([2, 3])),
    outputs=2,
    opset=11,
    split=[2, 3],
)
case(
    "pad_opset10",
    "Pad",
    {"X": x("pad10")},
    lambda t, v: t.nn.functional.pad(v["X"], (0, 2, 1, 0)),
    opset=10,
    pads=[1, 0, 0, 2],
)

IDS = [g.name for g in CASES]


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_rule_against_finite_differences(graph: Graph) -> None:
    check_against_finite_differences(graph)


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_rule_against_torch(graph: Graph) -> None:
    pytest.importorskip("torch")
    check_against_torch(graph)
