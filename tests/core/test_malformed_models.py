"""Malformed graphs (issue 15, items 8 and 9): each is refused by a ``ValueError`` that names the
defect, before onnx's checker or onnxruntime see the graph, on every route a model takes (a file,
bytes or a ModelProto; both trainers, the forward/backward pair, ``add_loss_output``, the CLI).

The reference for each defect is the ONNX rule it breaks, written out here (the byte count of a
tensor is the product of its dims, in Python integers, times its element size), never the code
under test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from core_models import build_linear
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    _io,
    add_loss_output,
    load_model,
)
from ort_train_core.cli import main


def _set_coef(
    model: onnx.ModelProto, dims: list[int], raw: bytes, data_type: int = TensorProto.FLOAT
) -> None:
    coef = next(t for t in model.graph.initializer if t.name == "coef")
    coef.ClearField("float_data")
    del coef.dims[:]
    coef.dims.extend(dims)
    coef.raw_data = raw
    coef.data_type = data_type


def _cycle(m: onnx.ModelProto) -> None:
    # Add(mm, back) -> Y and Relu(Y) -> back: Y waits for itself
    m.graph.node[1].input[1] = "back"
    m.graph.node.append(helper.make_node("Relu", ["Y"], ["back"], name="relu_back"))


def _missing_input(m: onnx.ModelProto) -> None:
    m.graph.node[1].input[1] = "nowhere"


def _duplicate_initializer(m: onnx.ModelProto) -> None:
    m.graph.initializer.append(numpy_helper.from_array(np.zeros((3, 1), np.float32), "coef"))


def _overflowing_dims(m: onnx.ModelProto) -> None:
    # 7378697629483820647 * 5 wraps to 3 in int64: 3 floats, 12 bytes
    assert int(np.prod([7378697629483820647, 5], dtype=np.int64)) * 4 == 12
    _set_coef(m, [7378697629483820647, 5], b"\x00" * 12)


def _huge_declared(m: onnx.ModelProto) -> None:
    _set_coef(m, [10**6, 10**6], b"\x00" * 12)


def _wrong_raw_size(m: onnx.ModelProto) -> None:
    _set_coef(m, [3, 1], b"\x00" * 8)


def _negative_dims(m: onnx.ModelProto) -> None:
    # the product is 3, as the 12 bytes would fit: the sign alone is wrong
    _set_coef(m, [-1, -3], b"\x00" * 12)


def _undefined_type(m: onnx.ModelProto) -> None:
    _set_coef(m, [3, 1], b"\x00" * 12, data_type=TensorProto.UNDEFINED)


def _wrong_typed_count(m: onnx.ModelProto) -> None:
    coef = next(t for t in m.graph.initializer if t.name == "coef")
    coef.ClearField("raw_data")
    coef.float_data[:] = [1.0, 2.0]  # 2 values for shape [3, 1]


def _produced_twice(m: onnx.ModelProto) -> None:
    m.graph.node.append(helper.make_node("Identity", ["X"], ["mm"], name="again"))


#: defect -> (how to make it, what the message must say)
CASES: dict[str, tuple[Callable[[onnx.ModelProto], None], str]] = {
    "cycle": (_cycle, r"cycle"),
    "missing input": (_missing_input, r"'nowhere'.*no node, graph input or initializer"),
    "duplicate initializer": (_duplicate_initializer, r"initializer 'coef' is defined twice"),
    "int64 overflow": (
        _overflowing_dims,
        r"tensor 'coef'.*7378697629483820647, 5.*needs 147573952589676412940 bytes.*holds 12",
    ),
    "1e12 elements": (_huge_declared, r"tensor 'coef'.*needs 4000000000000 bytes.*holds 12"),
    "raw size": (_wrong_raw_size, r"tensor 'coef'.*\[3, 1\].*needs 12 bytes.*holds 8"),
    "negative dims": (_negative_dims, r"tensor 'coef'.*negative dimension"),
    "undefined type": (_undefined_type, r"tensor 'coef'.*element type.*UNDEFINED"),
    "typed count": (_wrong_typed_count, r"tensor 'coef'.*needs 3 values.*holds 2"),
    "produced twice": (_produced_twice, r"'mm' is produced twice"),
}


def _malformed(case: str) -> onnx.ModelProto:
    model = build_linear(n_features=3, n_outputs=1)
    CASES[case][0](model)
    return model


X = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
Y = X.sum(axis=1, keepdims=True)


def _routes(model: onnx.ModelProto, tmp_path: Path) -> dict[str, Callable[[], object]]:
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString())
    return {
        "load_model(path)": lambda: load_model(path),
        "load_model(bytes)": lambda: load_model(model.SerializeToString()),
        "load_model(proto)": lambda: load_model(model),
        "add_loss_output": lambda: add_loss_output(model),
        "partial fit": lambda: OrtGradientForwardBackwardOptimizer(model, max_iter=1).fit(X, Y),
        "forward/backward": lambda: OrtGradientForwardBackward(model),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_graph_is_a_value_error_naming_the_defect(case: str, tmp_path: Path) -> None:
    model = _malformed(case)
    for route, call in _routes(model, tmp_path).items():
        with pytest.raises(ValueError, match=CASES[case][1]) as info:
            call()
        assert not isinstance(info.value, onnx.checker.ValidationError), route
        assert "was false" not in str(info.value), route  # no raw onnxruntime text


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_graph_cli_exits_2_without_traceback(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(_malformed(case).SerializeToString())
    data = tmp_path / "d.csv"
    np.savetxt(data, np.column_stack([X, Y]), delimiter=",", header="a,b,c,t", comments="")
    for argv in (
        ["inspect", str(path)],
        ["fit", str(path), "--data", str(data), "--target", "t", "--out", str(tmp_path / "o.onnx")],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv[0], err)
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.onnx").exists()


def test_fit_of_the_fused_loop_refuses_a_malformed_graph(tmp_path: Path) -> None:
    """The fused loop takes a loss graph: one made elsewhere, broken after add_loss_output."""
    loss_model = add_loss_output(build_linear(n_features=3, n_outputs=1))
    loss_model.graph.initializer.append(numpy_helper.from_array(np.zeros((3, 1), np.float32), "coef"))
    with pytest.raises(ValueError, match=r"initializer 'coef' is defined twice"):
        OrtGradientOptimizer(loss_model, max_iter=1).fit(X, Y)


def test_expected_nbytes_uses_python_integers() -> None:
    tensor = TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[7378697629483820647, 5])
    assert _io._expected_nbytes(tensor) == 7378697629483820647 * 5 * 4


def test_unsorted_graph_is_sorted_not_refused() -> None:
    """ONNX wants nodes in topological order; a graph listed backwards but acyclic trains the same
    as the sorted one (onnx's checker refused it inside add_loss_output)."""
    model = build_linear(n_features=3, n_outputs=1, seed=4)
    backwards = onnx.ModelProto()
    backwards.CopyFrom(model)
    nodes = list(backwards.graph.node)[::-1]
    del backwards.graph.node[:]
    backwards.graph.node.extend(nodes)
    kwargs = {"max_iter": 2, "batch_size": 4, "shuffle": False, "learning_rate": 0.1}
    got = OrtGradientForwardBackwardOptimizer(backwards, **kwargs).fit(X, Y).get_state()
    # reference: numpy SGD on the squared error, W <- W - eta * grad of mean((XW + b - y)^2)
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    W, b = inits["coef"], inits["intercept"]
    for _ in range(2):
        for start in range(0, len(X), 4):
            xb, yb = X[start : start + 4].astype(np.float64), Y[start : start + 4]
            d = xb @ W + b - yb
            W, b = W - 0.1 * 2 * xb.T @ d / len(xb), b - 0.1 * 2 * d.sum(0) / len(xb)
    np.testing.assert_allclose(got["coef"], W, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["intercept"], b, rtol=1e-5, atol=1e-6)


# ---- item 8: control flow nested too deep ------------------------------------------------------


def _nested_if(depth: int) -> onnx.ModelProto:
    """Y = X through ``depth`` nested If nodes (the then-branch holds the next If)."""
    cond = numpy_helper.from_array(np.array(True), "cond")
    out = helper.make_tensor_value_info
    inner = helper.make_graph(
        [helper.make_node("Identity", ["X"], [f"y{depth}"])],
        f"leaf{depth}",
        [],
        [out(f"y{depth}", TensorProto.FLOAT, None)],
    )
    for level in range(depth - 1, -1, -1):
        other = helper.make_graph(
            [helper.make_node("Identity", ["X"], [f"e{level}"])],
            f"else{level}",
            [],
            [out(f"e{level}", TensorProto.FLOAT, None)],
        )
        node = helper.make_node("If", ["cond"], [f"y{level}"], then_branch=inner, else_branch=other)
        if level == 0:
            break
        inner = helper.make_graph([node], f"then{level}", [], [out(f"y{level}", TensorProto.FLOAT, None)])
    node.output[0] = "Y"
    graph = helper.make_graph(
        [node],
        "nested",
        [out("X", TensorProto.FLOAT, ["N", 3])],
        [out("Y", TensorProto.FLOAT, ["N", 3])],
        [cond],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _depth(graph: onnx.GraphProto) -> int:
    subs = [a.g for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    return 1 + max((_depth(g) for g in subs), default=0) if subs else 0


def test_nested_if_builder_has_the_depth_asked() -> None:
    assert _depth(_nested_if(3).graph) == 3
    assert len(_nested_if(25).SerializeToString()) < 8000  # the "3 KB file" of the issue


def test_control_flow_nested_too_deep_is_refused(tmp_path: Path) -> None:
    limit = _io.MAX_SUBGRAPH_DEPTH
    path = tmp_path / "deep.onnx"
    for depth in (limit + 1, 25):
        path.write_bytes(_nested_if(depth).SerializeToString())
        with pytest.raises(ValueError, match=rf"deep\.onnx.*nested {depth} levels deep.*at most {limit}"):
            load_model(path)
    # the in-memory routes refuse it too (before onnxruntime spends minutes creating a session)
    with pytest.raises(ValueError, match=rf"nested {limit + 1} levels deep"):
        OrtGradientForwardBackward(_nested_if(limit + 1))


def test_control_flow_at_the_limit_loads(tmp_path: Path) -> None:
    model = _nested_if(_io.MAX_SUBGRAPH_DEPTH)
    path = tmp_path / "ok.onnx"
    path.write_bytes(model.SerializeToString())
    assert load_model(path) == model
