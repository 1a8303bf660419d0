"""The ``onnx`` backend beyond one smooth rule at a time: torch's conventions at kinks and ties,
Dropout (the mask saved in training mode, the identity in inference), several consumers of one
value, trained initializers, only the gradients needed, and the refusals
(GraphNotDifferentiableError naming the operator and the node, before any session is made)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from autodiff_oracle import (
    Graph,
    build,
    check_against_finite_differences,
    check_against_torch,
    gradient_model,
    rng_for,
    run,
    values,
)
from onnx import TensorProto, helper

from ort_train_core._backends import get_backend
from ort_train_core.exceptions import GraphNotDifferentiableError

I64 = np.int64
F32 = np.float32


def one_node(
    name: str,
    op: str,
    inputs: dict[str, np.ndarray],
    fn: Any,
    consts: dict[str, np.ndarray] | None = None,
    **attrs: Any,
) -> Graph:
    node = helper.make_node(op, [*inputs, *(consts or {})], ["Y"], name=f"{name}_node", **attrs)
    return Graph(name, [node], inputs, lambda t, v: [fn(t, v)], consts or {})


# ---- torch's conventions where the derivative jumps or ties --------------------------------------
KINK = np.array([[-1.0, 0.0, 0.0, 2.0], [0.5, -0.0, 3.0, -3.0]])
TIES_A = np.array([[1.0, 2.0, -1.0], [0.5, 0.5, 4.0]])
TIES_B = np.array([[1.0, 3.0, -1.0], [0.5, 0.2, 4.0]])
TIES_C = np.array([[1.0, 0.0, -1.0], [-2.0, 0.5, 1.0]])
BOUNDARY = [
    one_node("relu_at_0", "Relu", {"X": KINK}, lambda t, v: t.relu(v["X"])),
    one_node(
        "leaky_relu_at_0",
        "LeakyRelu",
        {"X": KINK},
        lambda t, v: t.nn.functional.leaky_relu(v["X"], 0.1),
        alpha=0.1,
    ),
    one_node(
        "prelu_at_0",
        "PRelu",
        {"X": KINK, "s": np.array([0.3, -0.2, 0.5, 0.1])},
        lambda t, v: t.where(v["X"] > 0, v["X"], v["s"] * v["X"]),
    ),
    one_node("elu_at_0", "Elu", {"X": KINK}, lambda t, v: t.nn.functional.elu(v["X"], 0.7), alpha=0.7),
    one_node("selu_at_0", "Selu", {"X": KINK}, lambda t, v: t.nn.functional.selu(v["X"])),
    one_node("abs_at_0", "Abs", {"X": KINK}, lambda t, v: v["X"].abs()),
    one_node("hard_swish_at_3", "HardSwish", {"X": KINK}, lambda t, v: t.nn.functional.hardswish(v["X"])),
    one_node(
        "clip_at_bounds",
        "Clip",
        {"X": KINK},
        lambda t, v: t.clamp(v["X"], -1.0, 2.0),
        {"lo": np.array(-1.0, F32), "hi": np.array(2.0, F32)},
    ),
    one_node("max_ties", "Max", {"A": TIES_A, "B": TIES_B}, lambda t, v: t.maximum(v["A"], v["B"])),
    one_node("min_ties", "Min", {"A": TIES_A, "B": TIES_B}, lambda t, v: t.minimum(v["A"], v["B"])),
    one_node(
        "max3_ties",
        "Max",
        {"A": TIES_A, "B": TIES_B, "C": TIES_C},
        lambda t, v: t.stack([v["A"], v["B"], v["C"]]).amax(0),
    ),
    one_node(
        "reduce_max_ties",
        "ReduceMax",
        {"X": TIES_A},
        lambda t, v: v["X"].amax(1),
        {"a": np.array([1], I64)},
        keepdims=0,
    ),
    one_node(
        "reduce_min_ties",
        "ReduceMin",
        {"X": TIES_B},
        lambda t, v: v["X"].amin(0, keepdim=True),
        {"a": np.array([0], I64)},
    ),
    one_node(
        "reduce_l2_zero_row",
        "ReduceL2",
        {"X": np.array([[0.0, 0.0], [3.0, -4.0]])},
        lambda t, v: t.linalg.vector_norm(v["X"], 2, 1),
        {"a": np.array([1], I64)},
        keepdims=0,
    ),
    one_node("pow_zero_base", "Pow", {"X": KINK}, lambda t, v: v["X"] ** 2, {"p": np.array(2.0, F32)}),
    one_node("pow_zero_exponent", "Pow", {"X": KINK}, lambda t, v: v["X"] ** 0.0, {"p": np.array(0.0, F32)}),
    one_node(
        "pow_both_at_zero",
        "Pow",
        {"X": np.abs(KINK), "p": np.array([2.0, 0.0, 1.5, 1.0])},
        lambda t, v: v["X"] ** v["p"],
    ),
]


@pytest.mark.parametrize("graph", BOUNDARY, ids=[g.name for g in BOUNDARY])
def test_kinks_and_ties_as_torch(graph: Graph) -> None:
    pytest.importorskip("torch")
    check_against_torch(graph)


# ---- several consumers, trained initializers -----------------------------------------------------
def _mlp() -> Graph:
    rng = rng_for("mlp")
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "W2", "b2"], ["z"]),
        helper.make_node("LogSoftmax", ["z"], ["Y"], axis=1),
    ]
    weights = {
        "W1": values(rng, (5, 3)),
        "b1": values(rng, (5,)),
        "W2": values(rng, (5, 4)),
        "b2": values(rng, (4,)),
    }
    x = values(rng, (6, 3))
    # the hidden values stay away from Relu's kink: finite differences do not straddle it
    x[np.abs(x @ weights["W1"].T + weights["b1"]).min(axis=1) < 0.05] *= 1.5

    def fn(t: Any, v: dict[str, Any]) -> list[Any]:
        r = t.relu(t.tensor(x) @ v["W1"].T + v["b1"])
        return [t.log_softmax(r @ v["W2"] + v["b2"], 1)]

    return Graph("mlp_initializers", nodes, weights, fn, {"X": x}, weights_as_initializers=True)


def _fan_out() -> Graph:
    """X read by four nodes (one reading it twice): its contributions summed."""
    nodes = [
        helper.make_node("Mul", ["X", "X"], ["sq"]),
        helper.make_node("Exp", ["X"], ["e"]),
        helper.make_node("Add", ["sq", "e"], ["s"]),
        helper.make_node("MatMul", ["s", "X"], ["Y"]),
    ]
    x = values(rng_for("fan"), (3, 3))
    return Graph("fan_out", nodes, {"X": x}, lambda t, v: [(v["X"] * v["X"] + v["X"].exp()) @ v["X"]])


@pytest.mark.parametrize("make", [_mlp, _fan_out])
def test_graphs_against_finite_differences(make: Any) -> None:
    check_against_finite_differences(make())


@pytest.mark.parametrize("make", [_mlp, _fan_out])
def test_graphs_against_torch(make: Any) -> None:
    pytest.importorskip("torch")
    check_against_torch(make())


def test_only_the_gradients_needed() -> None:
    """Differentiating with respect to W1 writes no node for the branch only W2 reaches."""
    rng = rng_for("two_branches")
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["a"]),
        helper.make_node("Tanh", ["a"], ["ta"]),
        helper.make_node("Mul", ["X", "W2"], ["m"]),
        helper.make_node("Exp", ["m"], ["em"]),
        helper.make_node("ReduceSum", ["em"], ["sm"], keepdims=1),
        helper.make_node("Add", ["ta", "sm"], ["Y"]),
    ]
    inputs = {"W1": values(rng, (3, 2)), "W2": values(rng, (4, 3))}
    g = Graph("two_branches", nodes, inputs, None, {"X": values(rng, (4, 3))}, wrt=["W1"])
    model, _ = build(g)
    grad = gradient_model(model, ["W1"])
    backward = grad.graph.node[len(model.graph.node) :]
    other = {"W2", "m", "em", "sm"}
    assert [n for n in backward if other & set(n.input)] == []
    both = gradient_model(model, ["W1", "W2"]).graph.node[len(model.graph.node) :]
    assert any("em" in n.input for n in both)
    check_against_finite_differences(g)


# ---- Dropout -------------------------------------------------------------------------------------
def _dropout(
    training: Any, ratio: float = 0.3, outputs: int = 1, float_type: int = TensorProto.FLOAT
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    """A Dropout graph (writing the mask or not), its feeds and the loss's seed of Y."""
    x = values(rng_for("dropout"), (6, 50), avoid=[0.0])
    consts = {"ratio": np.array(ratio, F32)}
    names = ["X", "ratio"]
    if training is not None:
        consts["training"] = np.array(training)
        names.append("training")
    node = helper.make_node("Dropout", names, ["Y", "mask"][:outputs], name="drop", seed=3)
    model, feeds = build(Graph("dropout", [node], {"X": x}, None, consts), float_type)
    seed = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "R_Y"))
    return model, feeds, seed


@pytest.mark.parametrize("float_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("outputs", [1, 2])
def test_dropout_training_uses_the_saved_mask(float_type: int, outputs: int) -> None:
    """dX = dY * mask / (1 - ratio), with the mask the forward drew (kept entries: Y != 0)."""
    model, feeds, seed = _dropout(True, 0.3, outputs, float_type)
    got = run(gradient_model(model, ["X"]), feeds)
    kept = got["Y"] != 0
    assert 0.5 < kept.mean() < 0.9  # a real draw: about 70 % kept
    np.testing.assert_allclose(got["Y"][kept], feeds["X"][kept] / 0.7, rtol=1e-6)
    np.testing.assert_allclose(got["X_grad"], seed * kept / 0.7, rtol=1e-6)


@pytest.mark.parametrize(("training", "ratio"), [(None, 0.3), (False, 0.3), (True, 0.0)])
def test_dropout_inference_is_the_identity(training: Any, ratio: float) -> None:
    model, feeds, seed = _dropout(training, ratio)
    grad = gradient_model(model, ["X"])
    assert [n.op_type for n in grad.graph.node].count("Dropout") == 1  # the forward's only
    got = run(grad, feeds)
    np.testing.assert_array_equal(got["X_grad"], seed)


# ---- refusals --------------------------------------------------------------------------------------
def _chain(op: str, domain: str = "", extra: dict[str, np.ndarray] | None = None, **attrs: Any) -> Graph:
    """``Y = op(Tanh(X), ...)`` then ``Exp``: the operator sits on the path from X to the loss."""
    extra = extra or {}
    nodes = [
        helper.make_node("Tanh", ["X"], ["t"]),
        helper.make_node(op, ["t", *extra], ["u"], name="the_node", domain=domain, **attrs),
        helper.make_node("Exp", ["u"], ["Y"]),
    ]
    return Graph(op, nodes, {"X": values(rng_for(op), (3, 4))}, None, extra)


def _no_session(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a session was made before the refusal")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)


@pytest.mark.parametrize("op", ["Sin", "Round", "Hardmax"])
def test_operator_without_rule_is_refused_naming_it(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build(_chain(op), TensorProto.FLOAT)
    _no_session(monkeypatch)
    with pytest.raises(GraphNotDifferentiableError, match=rf"operator {op} \(node 'the_node'\)"):
        get_backend("onnx").gradient_graph(model, "loss", ["X"])
    weights = onnx.helper.make_graph(
        list(model.graph.node),
        "w",
        [],
        list(model.graph.output),
        [
            *model.graph.initializer,
            onnx.numpy_helper.from_array(values(rng_for("w"), (3, 4)).astype(F32), "X"),
        ],
    )
    with pytest.raises(GraphNotDifferentiableError, match=rf"operator {op} \(node 'the_node'\)"):
        get_backend("onnx").forward_backward(
            helper.make_model(weights, opset_imports=model.opset_import), ["X"], [], None
        )  # type: ignore[arg-type]


def test_operator_of_another_domain_is_refused_naming_it() -> None:
    g = _chain("FusedMatMul", "com.microsoft", {"B": values(rng_for("b"), (4, 4))})
    nodes = [*g.nodes, helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0)]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    b = onnx.numpy_helper.from_array(g.consts["B"].astype(F32), "B")
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(helper.make_graph(nodes, "ms", [x], [loss], [b]), opset_imports=opsets)
    with pytest.raises(
        GraphNotDifferentiableError, match=r"operator com\.microsoft\.FusedMatMul \(node 'the_node'\)"
    ):
        get_backend("onnx").gradient_graph(model, "loss", ["X"])


def test_operator_without_rule_off_the_path_is_accepted() -> None:
    """Sin of a constant, not of anything differentiated: no gradient goes through it."""
    nodes = [
        helper.make_node("Sin", ["C"], ["s"], name="sin_of_constant"),
        helper.make_node("Mul", ["X", "s"], ["Y"]),
    ]
    rng = rng_for("off_path")
    check_against_finite_differences(
        Graph("off_path", nodes, {"X": values(rng, (3,))}, None, {"C": values(rng, (3,))})
    )


@pytest.mark.parametrize(
    ("g", "match"),
    [
        (
            _chain("Pad", extra={"p": np.array([1, 1, 1, 1], I64)}, mode="reflect"),
            r"Pad in constant mode only; node 'the_node' pads in b?'reflect'",
        ),
        (
            _chain(
                "Einsum",
                extra={"B": values(rng_for("e3"), (4, 4)), "C": values(rng_for("e3c"), (4,))},
                equation="ij,jk,k->ik",
            ),
            r"Einsum with two operands.*node 'the_node' has 'ij,jk,k->ik'",
        ),
        (
            _chain("Einsum", extra={"B": values(rng_for("e1"), (4, 4))}, equation="ii,jk->jk"),
            r"repeated index.*'ii,jk->jk'",
        ),
    ],
    ids=["pad_reflect", "einsum_three_operands", "einsum_diagonal"],
)
def test_forms_without_rule_are_refused(g: Graph, match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build(g)
    _no_session(monkeypatch)
    with pytest.raises(GraphNotDifferentiableError, match=match):
        get_backend("onnx").gradient_graph(model, "loss", ["X"])


def test_computed_slice_bounds_are_refused() -> None:
    """Bounds computed from X's values are refused (bounds from the Shape of a static value are
    folded to constants: the zoo's UNet computes its Resize scales so)."""
    nodes = [
        helper.make_node("ArgMax", ["X"], ["argmax"], axis=0, keepdims=0),
        helper.make_node("Slice", ["argmax", "zero1", "two"], ["ends"]),
        helper.make_node("Slice", ["X", "zero", "ends"], ["Y"], name="the_slice"),
    ]
    consts = {"zero": np.array([0, 0], I64), "zero1": np.array([0], I64), "two": np.array([2], I64)}
    g = Graph("computed_slice", nodes, {"X": values(rng_for("cs"), (3, 4))}, None, consts)
    model, _ = build(g)
    with pytest.raises(
        GraphNotDifferentiableError, match=r"input 2 of Slice node 'the_slice'.*to be a constant"
    ):
        get_backend("onnx").gradient_graph(model, "loss", ["X"])


def test_value_reaching_the_loss_without_gradient_is_refused() -> None:
    """W reaches the loss only as a Clip bound: it gets no gradient, and the backend says so."""
    nodes = [helper.make_node("Clip", ["X", "", "W"], ["Y"], name="clip")]
    rng = rng_for("no_gradient")
    g = Graph("no_gradient", nodes, {"X": values(rng, (3, 4)), "W": values(rng, ())}, None)
    model, _ = build(g)
    with pytest.raises(GraphNotDifferentiableError, match=r"'W' gets no gradient.*a Clip's bounds"):
        get_backend("onnx").gradient_graph(model, "loss", ["X", "W"])
