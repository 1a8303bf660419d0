"""Pure-torch references and the same networks as ONNX graphs built with ``onnx.helper``
(opset 17, IR 8): what the torch adapter tests import by name."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn


def torch_mlp(sizes: Sequence[int], seed: int = 0) -> nn.Sequential:
    """Linear -> ReLU -> ... -> Linear with torch's default initialisation under ``seed``."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for k, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if k < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def onnx_from_torch_mlp(net: nn.Sequential, input_name: str = "X", output_name: str = "Y") -> onnx.ModelProto:
    """The same network as MatMul/Add/Relu nodes; initializers ``W{k}`` (in x out, the transpose
    of torch's weight) and ``b{k}`` hold copies of the torch parameters."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    nodes, inits = [], []
    current = input_name
    for k, lin in enumerate(linears):
        W = lin.weight.detach().numpy().T.copy()
        b = lin.bias.detach().numpy().copy()
        inits += [numpy_helper.from_array(W, f"W{k}"), numpy_helper.from_array(b, f"b{k}")]
        last = k == len(linears) - 1
        nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"mm{k}"]))
        out = output_name if last else f"z{k}"
        nodes.append(helper.make_node("Add", [f"mm{k}", f"b{k}"], [out]))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"a{k}"]))
            out = f"a{k}"
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", linears[0].in_features])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["N", linears[-1].out_features])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def torch_weights_as_onnx(net: nn.Sequential) -> dict[str, torch.Tensor]:
    """The torch network's parameters under the ONNX module's parameter names."""
    out = {}
    for k, lin in enumerate(m for m in net if isinstance(m, nn.Linear)):
        out[f"W{k}"] = lin.weight.detach().T
        out[f"b{k}"] = lin.bias.detach()
    return out
