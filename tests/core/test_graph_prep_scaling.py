"""Graph preparation stays linear in the number of nodes and initializers (issue 26, item 7).

A chain of 20 000 ``Add`` nodes, each with its own initializer, spent minutes in ort-train's
Python before onnxruntime saw it: ``unique_name`` probed ``hint_1``, ``hint_2``... from 1 for
every node a builder named (quadratic), and three comprehensions rebuilt ``set(names)`` for each
element they tested. The tests assert those structural properties (no timing): the probes a
builder makes per name, and that no comprehension in the packages builds a container in its
condition. The 20k chain itself goes through the Python preparation in the suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    _binding,
    _io,
    add_loss_output,
    initializers_to_inputs,
    load_model,
)
from ort_train_core._builder import NodeBuilder
from ort_train_core.cli import main
from ort_train_core.graph import default_weights_to_train, normalise_model

SRC = Path(__file__).resolve().parents[2] / "packages"


class _CountingSet(set[str]):
    """A set that counts membership tests (the probes of ``unique_name``)."""

    probes = 0

    def __contains__(self, item: object) -> bool:
        type(self).probes += 1
        return super().__contains__(item)


def chain_model(n: int) -> onnx.ModelProto:
    """``out = X + w0 + w1 + ... + w{n-1}``: n Add nodes, each with its own initializer."""
    inits = [numpy_helper.from_array(np.full((1,), 1e-3, np.float32), f"w{i}") for i in range(n)]
    names = ["X", *(f"h{i}" for i in range(n - 1)), "out"]
    nodes = [helper.make_node("Add", [names[i], f"w{i}"], [names[i + 1]], name=f"add{i}") for i in range(n)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_builder_names_one_hint_many_times_with_few_probes() -> None:
    # the fused step names one "n_Add" node per weight: 2 000 names of one hint probed
    # 1 + 2 + ... + 2 000 = 2 million candidates before (quadratic), a few per name now
    b = NodeBuilder(TensorProto.FLOAT, 17, taken={"opt_n_Add"}, prefix="opt_")
    b._taken = _CountingSet(b._taken)
    _CountingSet.probes = 0
    names = [b.name("n_Add") for _ in range(2000)]
    assert len(set(names)) == 2000
    assert "opt_n_Add" not in names
    assert names[:2] == ["opt_n_Add_1", "opt_n_Add_2"]
    assert _CountingSet.probes <= 3 * 2000


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _comprehension_conditions_building_containers(path: Path) -> list[str]:
    """Calls of set/list/dict/sorted in a comprehension's condition whose arguments do not
    depend on the comprehension's variables: the same container rebuilt for each element."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        bound = set().union(*(_names(gen.target) for gen in node.generators))
        for gen in node.generators:
            for cond in gen.ifs:
                for call in ast.walk(cond):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Name)
                        and call.func.id in ("set", "list", "dict", "sorted")
                        and call.args
                        and not set().union(*map(_names, call.args)) & bound
                    ):
                        found.append(f"{path.relative_to(SRC)}:{call.lineno}")
    return found


def test_no_comprehension_rebuilds_a_container_per_element() -> None:
    # `[i for i in g.initializer if i.name not in set(names)]` builds the set once per
    # initializer: 20 000 x 20 000 at the 20k chain
    found = [
        hit
        for path in sorted(SRC.glob("*/src/**/*.py"))
        for hit in _comprehension_conditions_building_containers(path)
    ]
    assert found == []


def test_20k_initializer_chain_prepares() -> None:
    model = chain_model(20_000)
    loss_model = add_loss_output(model)
    weights = default_weights_to_train(loss_model, "loss")
    assert weights == [f"w{i}" for i in range(20_000)]
    fed = initializers_to_inputs(loss_model, weights)
    assert len(fed.graph.initializer) == 0
    assert [i.name for i in fed.graph.input][-20_000:] == weights


# ---- functions calling functions (FunctionProto nesting) ------------------------------------


def nested_functions(depth: int, calls: int = 1) -> onnx.ModelProto:
    """``out = f0(X) @ W`` where f{k} calls f{k+1} ``calls`` times (and sums the results) and
    the last one doubles its input: ``depth`` levels of function calls, ``calls**(depth-1)``
    copies of the last function once inlined."""
    domain = "local"
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    functions = []
    for k in range(depth):
        if k == depth - 1:
            body = [helper.make_node("Add", ["x", "x"], ["y"])]
        else:
            body = [helper.make_node(f"f{k + 1}", ["x"], [f"t{j}"], domain=domain) for j in range(calls)]
            body.append(helper.make_node("Sum", [f"t{j}" for j in range(calls)], ["y"]))
        functions.append(helper.make_function(domain, f"f{k}", ["x"], ["y"], body, opsets))
    nodes = [
        helper.make_node("f0", ["X"], ["h"], domain=domain, name="call_f0"),
        helper.make_node("MatMul", ["h", "W"], ["out"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "nested_functions",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(np.ones((3, 1), np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=opsets, functions=functions)
    model.ir_version = 9
    return model


def test_functions_nested_30_deep_are_refused_on_every_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: onnxruntime's session creation ran past 180 s (eval, the trainers, the estimators)
    model = nested_functions(30, calls=2)
    limit = _io.MAX_SUBGRAPH_DEPTH
    message = rf"nested 30 levels deep; at most {limit} are accepted.*inline_local_functions"
    path = tmp_path / "deep_functions.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ValueError, match=r"deep_functions\.onnx: .*calls of its functions.*" + message):
        load_model(path)
    with pytest.raises(ValueError, match=message):
        add_loss_output(model)
    X, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    with pytest.raises(ValueError, match=message):
        OrtGradientOptimizer(model, max_iter=1).fit(X, y)
    with pytest.raises(ValueError, match=message):
        OrtGradientForwardBackwardOptimizer(model, max_iter=1).fit(X, y)
    data = tmp_path / "data.csv"
    data.write_text("a,b,c,target\n1,2,3,4\n5,6,7,8\n")
    assert main(["eval", str(path), "--data", str(data), "--target", "target"]) == 2
    assert "nested 30 levels deep" in capsys.readouterr().err
    sklearn_route = pytest.importorskip("ort_train_sklearn")
    with pytest.raises(ValueError, match=message):
        sklearn_route.OnnxModelRegressor(model, max_iter=1).fit(np.ones((4, 3), np.float32), np.ones(4))


def test_functions_at_the_depth_limit_load_and_give_numpy_values() -> None:
    model = nested_functions(_io.MAX_SUBGRAPH_DEPTH, calls=2)
    # 2**7 Add and 2**7 - 1 Sum nodes once inlined
    assert _io.nesting(model) == (_io.MAX_SUBGRAPH_DEPTH, 2**_io.MAX_SUBGRAPH_DEPTH - 1)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = ort.InferenceSession(load_model(model).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )[0]
    # f{depth-1} doubles, each other level sums 2 calls: x * 2**depth, then @ ones
    np.testing.assert_allclose(got, (x * 2**_io.MAX_SUBGRAPH_DEPTH).sum(axis=1, keepdims=True))


def test_functions_expanding_beyond_the_node_limit_are_refused() -> None:
    # 6 levels, 10 calls each: 111 111 inlined copies (onnxruntime did not finish in 2 minutes)
    with pytest.raises(ValueError, match=r"expand to 111111 nodes once inlined.*at most 100000"):
        normalise_model(nested_functions(6, calls=10))


def test_recursive_function_is_refused() -> None:
    model = nested_functions(2)
    model.functions[1].node[0].op_type = "f0"  # f1 calls f0, which calls f1
    model.functions[1].node[0].domain = "local"
    with pytest.raises(
        ValueError, match=r"function 'f[01]' \(domain 'local'\) calls itself.*cannot be recursive"
    ):
        normalise_model(model)


def _wide_model(n: int) -> onnx.ModelProto:
    """n outputs ``X + w_i``: as wide as a fused step of n weights."""
    nodes = [helper.make_node("Add", ["X", f"w{i}"], [f"y{i}"]) for i in range(n)]
    inits = [numpy_helper.from_array(np.full((1,), i, np.float32), f"w{i}") for i in range(n)]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [None, 1]) for i in range(n)]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])
    graph = helper.make_graph(nodes, "wide", [x], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_wide_graphs_get_basic_optimisations_only() -> None:
    """onnxruntime's extended optimisations take super-linear time in a graph's width (6,000
    outputs: 29.7 s against 6.7 s basic; a 5,000-weight chain's first fit 36.7 s against 15.8 s):
    sessions of graphs wider than WIDE_GRAPH_VALUES skip them, others keep every optimisation;
    the outputs are the same."""
    from ort_train_core._runtime import Device

    level = _binding.ort_capi.GraphOptimizationLevel
    narrow, wide = _wide_model(10), _wide_model(_binding.WIDE_GRAPH_VALUES // 2 + 1)
    assert (
        _binding.make_session(narrow, Device("cpu")).session_options.graph_optimization_level
        == level.ORT_ENABLE_ALL
    )
    sess = _binding.make_session(wide, Device("cpu"))
    assert sess.session_options.graph_optimization_level == level.ORT_ENABLE_BASIC
    x = np.array([[1.5]], np.float32)
    names = [o.name for o in wide.graph.output]
    outs = sess.run(names, {"X": x}, _binding.ort_capi.RunOptions())
    np.testing.assert_array_equal(np.concatenate(outs).ravel(), 1.5 + np.arange(len(names), dtype=np.float32))
