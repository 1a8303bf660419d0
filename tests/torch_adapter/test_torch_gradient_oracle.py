"""The gradient oracle suite, OnnxModule: the gradients of its parameters and inputs against
torch autograd (float64) of the same math, for the catalogue of small graphs in
tests/gradient_catalogue.py (shapes, attributes and opsets drawn with hypothesis;
``ORT_TRAIN_ORACLE_EXAMPLES`` examples per case, 5 by default). Tolerance: relative 1e-5 with
an absolute floor of 1e-5 x the tensor's largest gradient (onnxruntime computes in float32).

Issue 15 item 1 (a 1-D weight of a MatMul got a wrong gradient) has its own end-to-end test:
:func:`test_rank1_weight_trains_as_torch`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from gradient_catalogue import (
    ATOL_SCALE,
    CATALOGUE,
    EXAMPLES,
    PINNED_FORMS,
    RTOL,
    Case,
    assert_gradients,
    oracle_settings,
    output_gradient,
    torch_vjp,
)
from ort_train_core.exceptions import GraphNotDifferentiableError
from ort_train_torch import OnnxModule

ORACLE = oracle_settings(EXAMPLES)


def module_vjp(case: Case, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """OnnxModule's output and the gradients of its inputs and parameters (ONNX names)."""
    module = OnnxModule(case.model, weights_to_train=list(case.weights))
    xs = [torch.tensor(v, requires_grad=k in case.grad_inputs) for k, v in case.inputs.items()]
    y = module(*xs)
    y.backward(torch.tensor(grad_output, dtype=torch.float32))
    grads = {k: x.grad.numpy() for k, x in zip(case.inputs, xs) if k in case.grad_inputs}
    for attr, name in module.onnx_names.items():
        param = getattr(module, attr)
        assert tuple(param.shape) == case.weights[name].shape, f"{case.name}: parameter {name} reshaped"
        grads[name] = param.grad.numpy()
    return y.detach().numpy(), grads


def check_module(case: Case) -> None:
    """OnnxModule's output and gradients equal torch autograd's, or the module refuses the
    case (at construction or at the first forward needing a gradient) as it must."""
    grad_output = output_gradient(case)
    if case.expected_refusal is not None:
        with pytest.raises(GraphNotDifferentiableError, match=case.expected_refusal):
            module_vjp(case, grad_output)
        return
    expected_out, expected = torch_vjp(case, grad_output)
    out, grads = module_vjp(case, grad_output)
    np.testing.assert_allclose(out, expected_out, rtol=RTOL, atol=ATOL_SCALE, err_msg=case.name)
    assert_gradients(grads, expected, case, "OnnxModule")


@pytest.mark.parametrize("name", sorted(CATALOGUE))
@ORACLE
@given(data=st.data())
def test_onnx_module_matches_torch_autograd(name: str, data: Any) -> None:
    check_module(CATALOGUE[name](data.draw))


@pytest.mark.parametrize("form", sorted(PINNED_FORMS))
def test_pinned_form(form: str) -> None:
    """The forms onnxruntime-training differentiates wrongly (rewritten) or not at all
    (refused with the operator and the fix), on every run."""
    check_module(PINNED_FORMS[form]())


# ---- issue 15 item 1: a 1-D weight trained end to end ------------------------------------------
def _rank1_model(coef: np.ndarray, weight_left: bool) -> onnx.ModelProto:
    """Y[N] = X[N, K] @ coef[K] + intercept, or Y[N] = coef[K] @ X[K, N] + intercept."""
    k = len(coef)
    pair, x_dims = (["coef", "X"], [k, "N"]) if weight_left else (["X", "coef"], ["N", k])
    nodes = [helper.make_node("MatMul", pair, ["mm"]), helper.make_node("Add", ["mm", "intercept"], ["Y"])]
    inits = [
        numpy_helper.from_array(coef, "coef"),
        numpy_helper.from_array(np.array([0.1], np.float32), "intercept"),
    ]
    graph = helper.make_graph(
        nodes,
        "rank1",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("weight_left", [False, True])
def test_rank1_weight_trains_as_torch(weight_left: bool) -> None:
    """Issue 15 item 1: an OnnxModule with a 1-D MatMul weight (either side), 4 steps of
    torch.optim.SGD on the mean squared error, ends with the weights (and the input's summed
    gradient) of the same model written in torch; its parameter keeps the 1-D shape."""
    rng = np.random.default_rng(0)
    coef = rng.standard_normal(3).astype(np.float32)
    X = rng.standard_normal((20, 3)).astype(np.float32)
    y = torch.tensor(X @ np.array([1.0, -2.0, 0.5]) + 0.3, dtype=torch.float32)
    # the input requires a gradient too (a layer inside a bigger model): onnxruntime failed on
    # it for a 1-D weight on the left
    x = torch.tensor(X.T.copy() if weight_left else X, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_(True)
    module = OnnxModule(_rank1_model(coef, weight_left))
    ref = {
        "coef": torch.tensor(coef, requires_grad=True),
        "intercept": torch.tensor([0.1], requires_grad=True),
    }
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(list(ref.values()), lr=0.05)
    for _ in range(4):
        for optimizer, pred in (
            (opt, lambda: module(x)),
            (
                ref_opt,
                lambda: (ref["coef"] @ ref_x if weight_left else ref_x @ ref["coef"]) + ref["intercept"],
            ),
        ):
            optimizer.zero_grad()
            loss = ((pred() - y) ** 2).mean()
            loss.backward()
            optimizer.step()
    assert tuple(module.coef.shape) == (3,)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.coef.detach(), ref["coef"].detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.intercept.detach(), ref["intercept"].detach(), rtol=1e-5, atol=1e-6)
