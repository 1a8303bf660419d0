"""Gradient graphs behind one small interface.

onnxruntime-training is frozen at 1.19.2; a later backend that writes the reverse pass in plain
ONNX must slot in by implementing :class:`GradientBackend` without touching the trainers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import onnx
from onnx import ModelProto, helper

from ._builder import NodeBuilder
from ._runtime import C
from .exceptions import GraphNotDifferentiableError
from .graph import MAX_IR_VERSION, all_names, check_differentiable
from .learning_rate import BaseLearningRate


class GradientBackend(Protocol):
    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        """``model`` plus one output ``<name>_grad`` per name (graph inputs), the loss kept."""
        ...


class OrtGradientGraphBuilderBackend:
    """onnxruntime-training's GradientGraphBuilder (graph with com.microsoft gradient ops)."""

    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        check_differentiable(model, names, loss_name)
        so = C.SessionOptions()
        so.log_severity_level = 3
        try:
            builder = C.GradientGraphBuilder(
                model.SerializeToString(), {loss_name}, set(names), loss_name, so
            )
            builder.build()
        except Exception as exc:  # onnxruntime raises RuntimeError/Fail with C++ context
            text = str(exc)
            ops = re.findall(r"op_type[=: ]+'?(\w+)", text)
            detail = f" (operators: {', '.join(sorted(set(ops)))})" if ops else ""
            raise GraphNotDifferentiableError(
                f"onnxruntime could not build the gradient graph{detail}: {text.splitlines()[0]}"
            ) from exc
        out = onnx.load_from_string(builder.get_model())
        out.ir_version = min(out.ir_version, MAX_IR_VERSION)
        return out


DEFAULT_BACKEND: GradientBackend = OrtGradientGraphBuilderBackend()


@dataclass
class FusedStepSignature:
    """Names of the fused graph's inputs and outputs; ``weights``/``states`` pair index-wise."""

    data_inputs: list[str]
    weights: list[str]
    new_weights: list[str]
    states: list[list[str]] = field(default_factory=list)
    new_states: list[list[str]] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    loss: str = "loss"


def build_fused_step_graph(
    loss_model: ModelProto,
    loss_name: str,
    weights: Sequence[str],
    learning_rate: BaseLearningRate,
    backend: GradientBackend = DEFAULT_BACKEND,
) -> tuple[ModelProto, FusedStepSignature]:
    """One graph that computes the loss, the gradients and the updated weights and states.

    ``loss_model`` has the weights as inputs. New weights and states are separate outputs: the
    caller binds them to other buffers than the inputs (double buffering).
    """
    grad_model = backend.gradient_graph(loss_model, loss_name, weights)
    g = grad_model.graph
    data_inputs = [i.name for i in g.input if i.name not in set(weights)]
    elem_type = next(o.type.tensor_type.elem_type for o in g.output if o.name == loss_name)
    opset = next((o.version for o in grad_model.opset_import if o.domain in ("", "ai.onnx")), 17)
    b = NodeBuilder(elem_type, opset, all_names(grad_model), prefix="opt_")
    scalars = {s: b.name(s) for s in learning_rate.scalar_names}
    sig = FusedStepSignature(data_inputs, list(weights), [], scalars=list(scalars.values()), loss=loss_name)
    inits = {i.name: i for i in g.input}
    new_inputs = []
    for w in weights:
        states = [b.name(f"{w}_{s}") for s in learning_rate.state_names]
        w_new, new_states = learning_rate.update_nodes(b, w, f"{w}_grad", states, scalars)
        sig.new_weights.append(w_new)
        sig.states.append(states)
        sig.new_states.append(new_states)
        w_type = inits[w].type
        for s in states:
            vi = onnx.ValueInfoProto()
            vi.name = s
            vi.type.CopyFrom(w_type)
            new_inputs.append(vi)
    g.node.extend(b.nodes)
    for s in scalars.values():
        new_inputs.append(helper.make_tensor_value_info(s, elem_type, []))
    g.input.extend(new_inputs)
    loss_out = next(o for o in g.output if o.name == loss_name)
    outputs = [loss_out]
    for w, w_new, new_states in zip(weights, sig.new_weights, sig.new_states):
        w_type = inits[w].type
        for name in [w_new, *new_states]:
            vi = onnx.ValueInfoProto()
            vi.name = name
            vi.type.CopyFrom(w_type)
            outputs.append(vi)
    del g.output[:]
    g.output.extend(outputs)
    return grad_model, sig
