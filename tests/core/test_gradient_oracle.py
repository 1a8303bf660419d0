"""The gradient oracle suite, core routes: the gradients onnxruntime-training gives through
both gradient builders, against torch autograd (float64) and float64 finite differences of
onnx's reference evaluator, for the catalogue of small graphs in tests/gradient_catalogue.py.

Routes: the forward/backward pair (OrtModuleGraphBuilder: ``OrtGradientForwardBackward``, the
partial loop, OnnxModule) and the fused step's gradient graph (GradientGraphBuilder: the full
loop), both with the CPU rewrites the trainers apply; then one SGD step of each loop, which
must move the weights by exactly ``-lr * gradient``. Tolerance: relative 1e-5 with an absolute
floor of 1e-5 x the tensor's largest gradient (float32 cancellation). Shapes, attributes and
opsets are drawn with hypothesis: ``ORT_TRAIN_ORACLE_EXAMPLES`` examples per case (5 by
default: the whole module runs in well under a minute on 2 cores).

Every form the oracle found onnxruntime getting wrong is pinned (``PINNED_FORMS``, checked
on every run against finite differences): rewritten ones must give the right gradients,
refused ones a GraphNotDifferentiableError naming the operator and the fix (also through the
CLI: exit 2, one line). ``KNOWN_LIMITS`` are strict xfails. Item 1 of issue 15
(``MatMul(X[N, K], coef[K])`` trained with a wrong gradient) has its own end-to-end test
against numpy: :func:`test_rank1_weight_trains_as_numpy`.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from core_models import linear_sgd_reference
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ort_train_core as otc
from gradient_catalogue import (
    ATOL_SCALE,
    CATALOGUE,
    EXAMPLES,
    KNOWN_LIMITS,
    PINNED_FORMS,
    RTOL,
    Case,
    assert_gradients,
    finite_difference_vjp,
    oracle_settings,
    output_gradient,
    torch_vjp,
)
from ort_train_core._backends import default_backend
from ort_train_core._ort_training import cpu_gradient_rewrites
from ort_train_core._runtime import ort_capi
from ort_train_core.cli import main as cli_main
from ort_train_core.exceptions import GraphNotDifferentiableError
from ort_train_core.graph import initializers_to_inputs

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
ORACLE = oracle_settings(EXAMPLES)
#: finite differences run the reference evaluator twice per value: fewer examples
FD_ORACLE = oracle_settings(max(1, EXAMPLES // 2))
#: catalogue entries that can draw a graph the loops train (2-D X, output rows = X rows)
LOOP_CASES = ["matmul", "gemm", "reshape_transpose", "concat", "slice", "activation"]


# ---- the two gradient routes -------------------------------------------------------------------
def forward_backward_vjp(case: Case, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The output and the gradients of the inputs and weights by ``OrtGradientForwardBackward``."""
    fb = otc.OrtGradientForwardBackward(
        case.model, weights_to_train=list(case.weights), input_names_requiring_grad=case.grad_inputs
    )
    (out,) = fb.forward(list(case.inputs.values()))
    grads = fb.backward([grad_output.astype(np.float32)])
    names = [*case.grad_inputs, *case.weights]
    return out.numpy(), {n: g.numpy() for n, g in zip(names, grads)}


def with_vjp_loss(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """``model`` with a float input ``G`` and the scalar output ``loss = sum(output * G)``,
    whose gradient is the vector-Jacobian product with G."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    elem = TensorProto.FLOAT
    declared = next((o.type for o in g.output if o.name == output), None)
    seed = helper.make_tensor_value_info("G", elem, None)
    if declared is not None:  # the output's shape: the onnx backend differentiates static ranks
        seed.type.CopyFrom(declared)
    g.input.append(seed)
    g.node.extend(
        [
            helper.make_node("Mul", [output, "G"], ["weighted"]),
            helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0),
        ]
    )
    g.output.insert(0, helper.make_tensor_value_info("loss", elem, []))
    return out


def fused_vjp(case: Case, grad_output: np.ndarray) -> dict[str, np.ndarray]:
    """The gradients of the fused step's gradient graph (the full loop's route), with the
    CPU rewrites the full loop applies."""
    names = [*case.weights, *case.grad_inputs]
    loss_model = initializers_to_inputs(with_vjp_loss(case.model, case.output_name), list(case.weights))
    graph = default_backend().gradient_graph(loss_model, "loss", names)
    if default_backend().name == "onnxruntime-training":
        graph = cpu_gradient_rewrites(graph, TensorProto.FLOAT)
    feeds = {**case.inputs, **case.weights, "G": grad_output.astype(np.float32)}
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    fetched = session.run([f"{n}_grad" for n in names], feeds)
    return dict(zip(names, fetched))


def partial_loop_vjp(case: Case, grad_output: np.ndarray) -> dict[str, np.ndarray]:
    """The gradients of the forward/backward pair with onnxruntime's memory pattern on, as the
    partial loop builds it (``OrtGradientForwardBackward`` turns it off: its forward's outputs
    outlive the backward). The partial loop also fixes the batch dimension: the fused route
    checks fixed shapes already."""
    names = [*case.grad_inputs, *case.weights]
    device = otc.parse_device("cpu")
    runner = default_backend().forward_backward(
        initializers_to_inputs(case.model, []), list(case.weights), case.grad_inputs, device
    )
    arrays = [
        np.require(a, requirements="C")  # an OrtValue reads the array's buffer (kept alive here)
        for a in [*case.inputs.values(), *case.weights.values(), np.asarray(grad_output, np.float32)]
    ]
    values = [ort_capi.OrtValue.ortvalue_from_numpy(a, device.ort_device) for a in arrays]
    outputs, grads, state = runner.vector([]), runner.vector([]), runner.new_state()
    runner.run_forward(runner.vector(values[:-1]), outputs, state)
    runner.run_backward(runner.vector(values[-1:]), grads, state)
    return {n: grads[k].numpy().copy() for k, n in enumerate(names)}


#: route name -> (case, output gradient) -> gradients by name
ROUTES: dict[str, Callable[[Case, np.ndarray], dict[str, np.ndarray]]] = {
    "forward/backward": lambda case, grad_output: forward_backward_vjp(case, grad_output)[1],
    "fused": fused_vjp,
    "partial loop": partial_loop_vjp,
}


def check_route(
    case: Case, route: str, reference: Callable[[Case, np.ndarray], dict[str, np.ndarray]]
) -> None:
    """The route's gradients equal the reference's, or the route refuses the case as it must."""
    grad_output = output_gradient(case)
    if case.expected_refusal is not None:
        with pytest.raises(GraphNotDifferentiableError, match=case.expected_refusal):
            ROUTES[route](case, grad_output)
        return
    assert_gradients(ROUTES[route](case, grad_output), reference(case, grad_output), case, route)


def _torch_reference(case: Case, grad_output: np.ndarray) -> dict[str, np.ndarray]:
    return torch_vjp(case, grad_output)[1]


def _draw(name: str, data: Any) -> Case:
    case: Case = CATALOGUE[name](data.draw)
    return case


# ---- against torch autograd --------------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("name", sorted(CATALOGUE))
@ORACLE
@given(data=st.data())
def test_gradients_match_torch(name: str, route: str, data: Any) -> None:
    check_route(_draw(name, data), route, _torch_reference)


@needs_torch
@pytest.mark.parametrize("name", sorted(CATALOGUE))
@ORACLE
@given(data=st.data())
def test_forward_output_matches_torch(name: str, data: Any) -> None:
    """The training forward's output (the graph the gradient rewrites changed) is the graph's."""
    case = _draw(name, data)
    assume(case.expected_refusal is None)
    grad_output = output_gradient(case)
    expected_out, _ = torch_vjp(case, grad_output)
    out, _ = forward_backward_vjp(case, grad_output)
    np.testing.assert_allclose(out, expected_out, rtol=RTOL, atol=ATOL_SCALE, err_msg=case.name)


# ---- against finite differences (no torch) -----------------------------------------------------
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("name", sorted(CATALOGUE))
@FD_ORACLE
@given(data=st.data())
def test_gradients_match_finite_differences(name: str, route: str, data: Any) -> None:
    case = _draw(name, data)
    assume(case.finite_differences)
    check_route(case, route, finite_difference_vjp)


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("form", sorted(PINNED_FORMS))
def test_pinned_form(form: str, route: str) -> None:
    """The forms onnxruntime-training differentiates wrongly (rewritten: the gradients are
    right) or not at all (refused with the operator and the fix), on every run."""
    check_route(PINNED_FORMS[form](), route, finite_difference_vjp)


@pytest.mark.xfail(
    default_backend().name == "onnxruntime-training",
    strict=True,
    reason="onnxruntime-training 1.19.2; not rewritten (see KNOWN_LIMITS)",
)
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("form", sorted(KNOWN_LIMITS))
def test_known_limit(form: str, route: str) -> None:
    """An input's gradient through a symbolic dimension that is 1 at run time and broadcasts
    (the onnx backend finds the broadcast axes when the graph runs)."""
    check_route(KNOWN_LIMITS[form](), route, finite_difference_vjp)


@pytest.mark.parametrize("form", ["cumsum", "pow_weight_exponent"])
def test_cli_names_the_operator_without_gradient(form: str, tmp_path: Path, capsys: Any) -> None:
    """``ort-train fit`` of a graph onnxruntime cannot differentiate exits 2 with one line
    naming the operator and the fix (it printed onnxruntime's C++ context before)."""
    if default_backend().name != "onnxruntime-training":
        pytest.skip("the onnx backend differentiates CumSum and Pow's exponent")
    case = PINNED_FORMS[form]()
    assert case.refused is not None
    onnx.save(case.model, tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", X=case.inputs["X"], y=np.zeros(output_gradient(case).shape))
    argv = ["fit", tmp_path / "model.onnx", "--data", tmp_path / "data.npz", "--target", "y"]
    code = cli_main([str(a) for a in [*argv, "--epochs", 1, "--out", tmp_path / "out.onnx"]])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(case.refused, err), err
    assert "onnxruntime_src" not in err


# ---- one SGD step of each loop -----------------------------------------------------------------
def _loop_target(case: Case) -> tuple[np.ndarray, np.ndarray] | None:
    """(X, y) when the loops can train ``case``: one 2-D float input, output rows = X rows."""
    if list(case.inputs) != ["X"] or case.inputs["X"].ndim != 2:
        return None
    X = case.inputs["X"]
    out = output_gradient(case)  # only its shape: the graph's output shape
    if out.ndim == 0 or out.shape[0] != X.shape[0]:
        return None
    y = np.random.default_rng(1).uniform(-1.0, 1.0, size=out.shape).astype(np.float32)
    return X, y


@needs_torch
@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize("name", LOOP_CASES)
@ORACLE
@given(data=st.data())
def test_one_sgd_step_matches_torch(loop: str, name: str, data: Any) -> None:
    """One full-batch step of plain SGD on the mean squared error moves each weight by
    -lr * its torch gradient."""
    case = _draw(name, data)
    target = _loop_target(case)
    assume(target is not None and case.expected_refusal is None)
    assert target is not None
    X, y = target
    lr = 0.1
    # d/dY of sum((Y - y)^2) / N: the VJP the loss feeds back
    ref_out, _ = torch_vjp(case, np.zeros(y.shape))
    grad_output = 2.0 * (ref_out - y.astype(np.float64)) / len(X)
    _, expected = torch_vjp(case, grad_output)
    kwargs = {"max_iter": 1, "batch_size": len(X), "learning_rate": lr, "shuffle": False}
    weights = list(case.weights)
    if loop == "full":
        trainer: Any = otc.OrtGradientOptimizer(otc.add_loss_output(case.model), weights, **kwargs)
    else:
        trainer = otc.OrtGradientForwardBackwardOptimizer(case.model, weights, **kwargs)
    state = trainer.fit(X, y).get_state()
    for w, start in case.weights.items():
        want = start.astype(np.float64) - lr * expected[w]
        scale = max(float(np.abs(start).max(initial=0.0)), float(np.abs(lr * expected[w]).max(initial=0.0)))
        np.testing.assert_allclose(
            state[w], want, rtol=RTOL, atol=ATOL_SCALE * scale, err_msg=f"{case.name} {w}"
        )


# ---- issue 15 item 1: a 1-D weight trained end to end ------------------------------------------
def _rank1_linear(coef: np.ndarray, intercept: np.ndarray) -> onnx.ModelProto:
    """Y[N] = X[N, K] @ coef[K] + intercept[1] (a linear regressor with a 1-D coefficient)."""
    nodes = [
        helper.make_node("MatMul", ["X", "coef"], ["mm"]),
        helper.make_node("Add", ["mm", "intercept"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rank1",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", len(coef)])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N"])],
        [numpy_helper.from_array(coef, "coef"), numpy_helper.from_array(intercept, "intercept")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_rank1_weight_trains_as_numpy(loop: str) -> None:
    """Issue 15 item 1: with a 1-D coef, 4 epochs of SGD give numpy's weights and losses (the
    loss fell to about a fifth; onnxruntime's own gradient made it rise), and the trained
    weight keeps its name and 1-D shape."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    coef, intercept = rng.standard_normal(3).astype(np.float32), np.array([0.1], dtype=np.float32)
    model = _rank1_linear(coef, intercept)
    start = {"coef": coef.reshape(3, 1), "intercept": intercept}  # numpy's column form, same math
    expected, history = linear_sgd_reference(start, X, y, eta=0.05, batch_size=5, epochs=4)
    kwargs = {"max_iter": 4, "batch_size": 5, "learning_rate": 0.05, "shuffle": False}
    if loop == "full":
        trainer: Any = otc.OrtGradientOptimizer(otc.add_loss_output(model), **kwargs)
    else:
        trainer = otc.OrtGradientForwardBackwardOptimizer(model, **kwargs)
    trainer.fit(X, y)
    state = trainer.get_state()
    assert state["coef"].shape == (3,)
    np.testing.assert_allclose(state["coef"], expected["coef"][:, 0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["intercept"], expected["intercept"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=1e-4)
    assert history[-1] < history[0] / 4
    trained = {i.name: numpy_helper.to_array(i) for i in trainer.get_trained_onnx().graph.initializer}
    np.testing.assert_array_equal(trained["coef"], state["coef"])
