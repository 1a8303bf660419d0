"""Gradient graphs behind one small interface.

onnxruntime-training is frozen at 1.19.2; a later backend that writes the reverse pass in plain
ONNX must slot in by implementing :class:`GradientBackend` without touching the trainers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ._builder import NodeBuilder
from ._grad_rewrites import rewrite_for_gradient
from ._runtime import C
from .exceptions import GraphNotDifferentiableError
from .graph import (
    MAX_IR_VERSION,
    MIN_OPSET,
    all_names,
    check_differentiable,
    check_no_control_flow,
    value_types,
)
from .learning_rate import BaseLearningRate
from .losses import BaseLearningLoss, BaseLearningPenalty


class GradientBackend(Protocol):
    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        """``model`` plus one output ``<name>_grad`` per name (graph inputs), the loss kept."""
        ...


class OrtGradientGraphBuilderBackend:
    """onnxruntime-training's GradientGraphBuilder (graph with com.microsoft gradient ops)."""

    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        check_differentiable(model, names, loss_name)
        check_no_control_flow(model, names, loss_name)  # else raw C++ text or a process abort
        model = rewrite_for_gradient(model, names)  # forms onnxruntime differentiates wrongly
        seeded, seed = _float_loss_seed(model, loss_name)
        so = C.SessionOptions()
        so.log_severity_level = 3
        try:
            builder = C.GradientGraphBuilder(
                seeded.SerializeToString(), {loss_name, seed}, set(names), seed, so
            )
            builder.build()
        except Exception as exc:  # onnxruntime raises RuntimeError/Fail with C++ context
            text = str(exc)
            gap = _gradient_gap(text)
            if gap:
                raise GraphNotDifferentiableError(gap) from exc
            raise GraphNotDifferentiableError(
                f"onnxruntime could not build the gradient graph: {text.splitlines()[0]}"
            ) from exc
        out = onnx.load_from_string(builder.get_model())
        out.ir_version = min(out.ir_version, MAX_IR_VERSION)
        if seed != loss_name:
            kept = [o for o in out.graph.output if o.name != seed]
            del out.graph.output[:]
            out.graph.output.extend(kept)
        loss_type = next(o.type.tensor_type.elem_type for o in model.graph.output if o.name == loss_name)
        return fold_static_shapes(double_gradient_rewrites(out, loss_type))


def _float_loss_seed(model: ModelProto, loss_name: str) -> tuple[ModelProto, str]:
    """``model`` and the name of the loss the gradient builder starts from.

    onnxruntime-training 1.19 seeds the gradient of the loss with a float tensor whatever the
    loss type, so a double loss fails to build ("Type (tensor(double)) of output arg
    (<loss>_grad) does not match expected type (tensor(float))"). A double (or half) loss gets
    a float copy, ``Cast(loss, float)``, to start from: the seed is 1 and the gradient of a Cast
    is a Cast back, so every gradient stays in the loss's own type, exactly.
    """
    loss_type = next(
        (o.type.tensor_type.elem_type for o in model.graph.output if o.name == loss_name),
        onnx.TensorProto.FLOAT,
    )
    if loss_type == onnx.TensorProto.FLOAT:
        return model, loss_name
    out = ModelProto()
    out.CopyFrom(model)
    b = NodeBuilder(onnx.TensorProto.FLOAT, 17, all_names(out), prefix="seed_")
    seed = b.cast(loss_name, hint=f"{loss_name}_float")
    out.graph.node.extend(b.nodes)
    out.graph.output.append(helper.make_tensor_value_info(seed, onnx.TensorProto.FLOAT, []))
    return out, seed


DEFAULT_BACKEND: GradientBackend = OrtGradientGraphBuilderBackend()


def fold_static_shapes(model: ModelProto) -> ModelProto:
    """Turns the gradient builder's run-time shape arithmetic into constants where the batch
    dimension is fixed, so that onnxruntime's constant folding removes it.

    The builder differentiates reductions with ``Shape``/``Size`` -> ``Scale`` -> ``Expand``
    chains even when every shape is known. onnxruntime folds ``Shape`` of a static tensor but
    neither ``Size`` nor the com.microsoft ``Scale``, so the chain ran as three to five kernels
    per step. Here ``Shape``/``Size`` of fully known shapes become ``Constant`` nodes and
    ``Scale`` becomes ``Cast`` + ``Div``/``Mul`` (standard ops, same values): the whole chain
    then folds into one constant. Linear model, batch 100: 17 kernels -> 13, 10.5 -> 9.3 us per
    step. Graphs with a dynamic batch dimension only get the ``Scale`` rewrite.
    """
    wanted = {("", "Shape"), ("", "Size"), ("ai.onnx", "Shape"), ("ai.onnx", "Size")}
    wanted.add(("com.microsoft", "Scale"))
    if not any((n.domain, n.op_type) in wanted for n in model.graph.node):
        return model
    # onnx's shape inference: about 0.4 ms for a linear model; com.microsoft outputs stay unknown
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    shapes: dict[str, list[int]] = {i.name: list(i.dims) for i in inferred.initializer}
    elem_types: dict[str, int] = {i.name: i.data_type for i in inferred.initializer}
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        tt = vi.type.tensor_type
        if tt.elem_type:
            elem_types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
    out = ModelProto()
    out.CopyFrom(model)
    names = NodeBuilder(onnx.TensorProto.FLOAT, 17, all_names(out), prefix="static_")
    nodes: list[onnx.NodeProto] = []
    for node in out.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.domain in ("", "ai.onnx") and node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            dims = shapes[node.input[0]]
            if node.op_type == "Size":
                value = np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
            else:
                start, end = int(attrs.get("start", 0)), attrs.get("end")
                value = np.array(dims[start : None if end is None else int(end)], dtype=np.int64)
            const = numpy_helper.from_array(value)
            nodes.append(helper.make_node("Constant", [], list(node.output), name=node.name, value=const))
        elif node.domain == "com.microsoft" and node.op_type == "Scale" and node.input[0] in elem_types:
            factor, to = names.name("scale_factor"), elem_types[node.input[0]]
            cast = helper.make_node("Cast", [node.input[1]], [factor], name=names.name("n_Cast"), to=to)
            nodes.append(cast)
            op = "Div" if attrs.get("scale_down", 0) else "Mul"
            nodes.append(helper.make_node(op, [node.input[0], factor], list(node.output), name=node.name))
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


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


@dataclass
class ForwardBackwardGraphs:
    """The graph a TrainingAgent runs: forward until a yield, then backward.

    Feeds are the user inputs then the weights; fetches are the gradients of the inputs that
    require one, then of the weights, in the configured order.
    """

    gradient_model: ModelProto
    input_names: list[str]
    output_names: list[str]
    weights: list[str]
    input_grad_names: list[str]
    fetch_names: list[str]
    #: indices of the outputs without a gradient (bool, integer, or not reached by any weight or
    #: input requiring a gradient): the backward takes no gradient for them
    non_differentiable_outputs: frozenset[int] = frozenset()


#: how onnxruntime-training 1.19 says that a trained initializer gets no gradient
_NO_GRADIENT_MESSAGES = (
    re.compile(r"Cannot compute the partial derivative for '([^']+)'"),
    re.compile(r"failed to find NodeArg by name: (\S+)_grad\b"),
)


#: onnxruntime-training's words for an operator it has no gradient for (the node name is empty
#: for an unnamed node)
_NOT_REGISTERED = re.compile(r"has not been registered: (\S+) for node ?(\S*)")


def _gradient_gap(text: str) -> str | None:
    """The message, naming the operator and the fix, for an onnxruntime error that says an
    operator on the path to the loss has no gradient; None for other errors."""
    missing = _NOT_REGISTERED.findall(text)
    if missing:
        named = [f"operator {op}" + (f" (node {node!r})" if node else "") for op, node in missing]
        detail = "; ".join(f"{what} has no gradient in onnxruntime-training" for what in named)
        return (
            f"the gradient graph cannot be built; {detail}: leave the weights before it out of "
            "weights_to_train, or write that step with operators that have one"
        )
    return None


def _build_error(exc: Exception, weights: Sequence[str]) -> GraphNotDifferentiableError:
    """onnxruntime's build failure as a GraphNotDifferentiableError; one that comes down to a
    weight without gradient names it (``.weight``) and the fix."""
    message = str(exc)
    for pattern in _NO_GRADIENT_MESSAGES:
        found = pattern.search(message)
        if found and found.group(1) in weights:
            weight = found.group(1)
            return GraphNotDifferentiableError(
                f"onnxruntime gives weight {weight!r} no gradient: it reaches the outputs only through "
                "inputs onnxruntime does not differentiate (a BatchNormalization's statistics, a Clip's "
                "bounds, a comparison); leave it out of weights_to_train",
                weight=weight,
            )
    gap = _gradient_gap(message)
    if gap:
        return GraphNotDifferentiableError(gap)
    first = message.splitlines()[0] if message else type(exc).__name__
    return GraphNotDifferentiableError(f"onnxruntime could not build the forward/backward graphs: {first}")


def build_forward_backward(
    model: ModelProto,
    weights: Sequence[str],
    inputs_requiring_grad: Sequence[str],
    types: Mapping[str, int] | None = None,
) -> ForwardBackwardGraphs:
    """onnxruntime-training's OrtModuleGraphBuilder; the weight order is the caller's.
    ``types``: :func:`graph.value_types` of ``model``, when the caller has them."""
    outputs = [o.name for o in model.graph.output]
    types = value_types(model) if types is None else types
    for out in outputs:
        check_differentiable(model, weights, out, types)
    cfg = C.OrtModuleGraphBuilderConfiguration()
    cfg.initializer_names = list(weights)
    cfg.initializer_names_to_train = list(weights)
    cfg.input_names_require_grad = list(inputs_requiring_grad)
    # forms onnxruntime differentiates wrongly, rewritten (same names, values and weights)
    rewritten = rewrite_for_gradient(model, [*weights, *inputs_requiring_grad])
    builder = C.OrtModuleGraphBuilder()
    try:
        builder.initialize(rewritten.SerializeToString(), cfg)
        builder.build(C.TrainingGraphTransformerConfiguration())
    except Exception as exc:
        raise _build_error(exc, weights) from exc
    info = builder.get_graph_info()
    grad_model = onnx.load_from_string(builder.get_gradient_model())
    grad_model.ir_version = min(grad_model.ir_version, MAX_IR_VERSION)
    if weights:
        grad_model = double_gradient_rewrites(grad_model, types.get(weights[0], onnx.TensorProto.FLOAT))
    input_grads = [n for n in info.user_input_names if n in info.user_input_grad_names]
    return ForwardBackwardGraphs(
        gradient_model=grad_model,
        input_names=list(info.user_input_names),
        output_names=list(info.user_output_names),
        weights=list(weights),
        input_grad_names=input_grads,
        fetch_names=[o.name for o in grad_model.graph.output],
        non_differentiable_outputs=frozenset(info.output_grad_indices_non_differentiable),
    )


def build_loss_gradient_graph(
    loss: BaseLearningLoss,
    pred_type: int,
    pred_shape: list[Any],
    batch: int | None,
    reduction: str = "mean",
    backend: GradientBackend = DEFAULT_BACKEND,
) -> ModelProto:
    """(prediction, label, weight) -> (loss, prediction_grad), from the same loss nodes as
    :func:`add_loss_output`, differentiated with respect to the prediction."""
    from .graph import add_loss_output, set_batch_dimension

    dims = ["N", *pred_shape[1:]]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["prediction"], ["prediction_out"])],
        "learning_loss",
        [helper.make_tensor_value_info("prediction", pred_type, dims)],
        [helper.make_tensor_value_info("prediction_out", pred_type, dims)],
    )
    opset = max(17, MIN_OPSET)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = MAX_IR_VERSION
    with_loss = add_loss_output(model, loss, weight_name="weight", reduction=reduction)
    with_loss = set_batch_dimension(with_loss, ["prediction", "label", "weight"], batch)
    grad = backend.gradient_graph(with_loss, "loss", ["prediction"])
    kept = [o for o in grad.graph.output if o.name in ("loss", "prediction_grad")]
    del grad.graph.output[:]
    grad.graph.output.extend(kept)
    return grad


@dataclass
class UpdateSignature:
    weights: list[str]
    grads: list[str]
    new_weights: list[str]
    states: list[list[str]] = field(default_factory=list)
    new_states: list[list[str]] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    penalty: str | None = None


def build_update_graph(
    weights: Sequence[tuple[str, int, Sequence[int]]],
    learning_rate: BaseLearningRate,
    penalty: BaseLearningPenalty,
    penalized: Sequence[str],
    backend: GradientBackend = DEFAULT_BACKEND,
) -> tuple[ModelProto, UpdateSignature]:
    """(weights, gradients, states, scalars) -> (penalty, new weights, new states).

    The penalty's gradient comes from differentiating the same penalty nodes the evaluation
    graph uses; the update nodes are the learning rate's, as in the fused graph.
    """
    names = [w for w, _, _ in weights]
    elem_type = weights[0][1]
    inputs = [helper.make_tensor_value_info(w, t, list(shape)) for w, t, shape in weights]
    b = NodeBuilder(elem_type, 17, names, prefix="pen_")
    terms = [t for t in (penalty.penalty_nodes(b, w) for w in penalized) if t is not None]
    if terms:
        total = terms[0]
        for term in terms[1:]:  # Add, not Sum: Sum has no gradient in onnxruntime-training
            total = b.op("Add", [total, term], "penalty_sum")
        b.nodes.append(helper.make_node("Identity", [total], ["penalty"], name=b.name("n_penalty")))
        pen_graph = helper.make_graph(
            b.nodes, "penalty", inputs, [helper.make_tensor_value_info("penalty", elem_type, [])]
        )
        pen_model = helper.make_model(pen_graph, opset_imports=[helper.make_opsetid("", 17)])
        pen_model.ir_version = MAX_IR_VERSION
        with_terms = [w for w in penalized if w in set(names)]
        model = backend.gradient_graph(pen_model, "penalty", with_terms)
        pen_grads = {w: f"{w}_grad" for w in with_terms}
    else:
        graph = helper.make_graph([], "update", inputs, [])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = MAX_IR_VERSION
        pen_grads = {}
    g = model.graph
    ub = NodeBuilder(elem_type, 17, all_names(model), prefix="upd_")
    scalars = {s: ub.name(s) for s in learning_rate.scalar_names}
    sig = UpdateSignature(names, [], [], scalars=list(scalars.values()), penalty="penalty" if terms else None)
    new_inputs, outputs = [], []
    if terms:
        outputs.append(helper.make_tensor_value_info("penalty", elem_type, []))
    for w, t, shape in weights:
        grad_in = ub.name(f"grad_{w}")
        sig.grads.append(grad_in)
        new_inputs.append(helper.make_tensor_value_info(grad_in, t, list(shape)))
        grad = ub.op("Add", [grad_in, pen_grads[w]], f"{w}_total_grad") if w in pen_grads else grad_in
        states = [ub.name(f"{w}_{s}") for s in learning_rate.state_names]
        new_inputs.extend(helper.make_tensor_value_info(s, t, list(shape)) for s in states)
        w_new, new_states = learning_rate.update_nodes(ub, w, grad, states, scalars)
        sig.new_weights.append(w_new)
        sig.states.append(states)
        sig.new_states.append(new_states)
        outputs.extend(helper.make_tensor_value_info(n, t, list(shape)) for n in [w_new, *new_states])
    new_inputs.extend(helper.make_tensor_value_info(s, elem_type, []) for s in scalars.values())
    g.node.extend(ub.nodes)
    g.input.extend(new_inputs)
    del g.output[:]
    g.output.extend(outputs)
    return model, sig


def cpu_gradient_rewrites(model: ModelProto, elem_type: int) -> ModelProto:
    """The rewrites every CPU gradient graph gets (fused step, forward/backward, either batch
    dimension): ReLU gradients (:func:`cpu_relu_grad`) and bias-gradient sums
    (:func:`cpu_row_sums`), onnxruntime's slowest CPU kernels in those graphs."""
    return cpu_row_sums(cpu_relu_grad(model, elem_type), elem_type)


def cpu_relu_grad(model: ModelProto, elem_type: int) -> ModelProto:
    """Replaces com.microsoft ReluGrad(dY, X) with Mul(dY, Ceil(Clip(X, 0, 1))).

    The mask is exactly 1 where X > 0 (subnormals too) and 0 elsewhere, as ReluGrad's, for X of
    any sign. onnxruntime's CPU ReluGrad branches per element: on activations of mixed signs it
    ran 36 us for a 200x50 tensor against 11 us for Mul(dY, Cast(Greater(X, 0))), and 500 us
    for 1000x100 against 85 for that form and 65 for this one (Cast and Greater are onnxruntime's
    slow kernels here: 66 us together against 45 for Clip and Ceil). In the MLP(100, 100)
    forward/backward at batch 1000 this form saves 60-70 us a step over the Greater form
    (paired rounds, AMD EPYC, 2 threads).
    """
    if not any(n.op_type == "ReluGrad" for n in model.graph.node):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    b = NodeBuilder(elem_type, 17, all_names(out), prefix="relugrad_")
    zero, one = b.const(0.0, "zero"), b.const(1.0, "one")
    nodes = list(b.nodes)
    for node in g.node:
        if node.op_type != "ReluGrad" or node.domain != "com.microsoft":
            nodes.append(node)
            continue
        dy, x = node.input
        b.nodes = []
        mask = b.op("Ceil", [b.op("Clip", [x, zero, one], "clipped")], "mask")
        b.nodes.append(helper.make_node("Mul", [dy, mask], [node.output[0]], name=b.name("n_Mul")))
        nodes.extend(b.nodes)
    del g.node[:]
    g.node.extend(nodes)
    return out


def cpu_row_sums(model: ModelProto, elem_type: int) -> ModelProto:
    """Replaces ReduceSum(X, axes=[0]) of a 2-D X, [B, N] with N > 1, by MatMul(ones(B), X)
    (ones(1, B) with keepdims): the bias gradients. Same sums.

    onnxruntime's CPU ReduceSum over a strided leading axis is slow: 8.2 us against 3.6 for
    200x50, 25 against 5 for 200x200, 8.1 against 4.9 for 1000x10 (one thread), about 65
    against 15 for 1000x100 (two threads). With N = 1 the sum is contiguous and ReduceSum is
    about 1 us faster: those stay, as does any sum whose input shape the graph does not record.
    A fixed B gets constant ones; a free B (``OrtGradientForwardBackward``, whose batch varies)
    gets ones made at run time from the shape of the graph input that carries the same batch
    dimension (Shape, Gather, ConstantOfShape: about 2 us, once per step).
    """
    g = model.graph
    sums = {k: n for k, n in enumerate(g.node) if n.op_type == "ReduceSum"}
    if elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) or not sums:
        return model
    # the shapes onnxruntime's gradient builder recorded (onnx's shape inference costs ~2 ms);
    # a dimension is its size, or its symbol when free
    wanted = {n.input[0] for n in sums.values()}
    shapes: dict[str, list[int | str]] = {
        vi.name: [
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim
        ]
        for vi in [*g.input, *g.value_info]
        if vi.name in wanted and vi.type.tensor_type.elem_type == elem_type
    }
    # a free batch dimension is read from a graph input whose first dimension has that symbol
    batch_source: dict[str, str] = {}
    for vi in g.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].dim_param and not dims[0].HasField("dim_value"):
            batch_source.setdefault(dims[0].dim_param, vi.name)
    axes_inputs = {n.input[1] for n in sums.values() if len(n.input) > 1}
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer if i.name in axes_inputs}
    consts.update(
        (n.output[0], numpy_helper.to_array(n.attribute[0].t))
        for n in g.node
        if n.op_type == "Constant" and n.output[0] in axes_inputs and n.attribute[0].name == "value"
    )

    def batch_rows(node: onnx.NodeProto) -> tuple[int | str, int] | None:
        """(B or its symbol, keepdims) when ``node`` sums a [B, N] over its first axis."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if len(node.input) > 1:
            if node.input[1] not in consts:
                return None
            axes = [int(a) for a in np.atleast_1d(consts[node.input[1]])]
        else:
            axes = list(attrs.get("axes", []))
        shape = shapes.get(node.input[0])
        if axes not in ([0], [-2]) or not shape or len(shape) != 2:
            return None
        rows, cols = shape
        if not isinstance(cols, int) or cols < 2:
            return None
        if rows in (0, "") or (isinstance(rows, str) and rows not in batch_source):
            return None
        return rows, int(attrs.get("keepdims", 1))

    found = {k: r for k, n in sums.items() if (r := batch_rows(n))}
    if not found:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    b = NodeBuilder(elem_type, 17, all_names(out), prefix="rowsum_")
    ones: dict[tuple[int | str, int], str] = {}
    nodes = list(out.graph.node)
    for k, (rows, keepdims) in found.items():
        if (rows, keepdims) not in ones:
            if isinstance(rows, int):
                ones[rows, keepdims] = b.const(np.ones((1, rows) if keepdims else (rows,)), "ones")
            else:
                size = b.op(
                    "Gather", [b.op("Shape", [batch_source[rows]]), b.int_const([0], "first")], "rows"
                )
                if keepdims:
                    size = b.op("Concat", [b.int_const([1], "one_row"), size], "rows", axis=0)
                ones[rows, keepdims] = b.op(
                    "ConstantOfShape",
                    [size],
                    "ones",
                    value=numpy_helper.from_array(np.ones(1, dtype=b.np_dtype), "one"),
                )
        node = nodes[k]
        matmul = [ones[rows, keepdims], node.input[0]]
        nodes[k] = helper.make_node("MatMul", matmul, list(node.output), name=b.name("n_MatMul"))
    del out.graph.node[:]
    out.graph.node.extend([*b.nodes, *nodes])  # b.nodes: the ones (from graph inputs only), first
    return out


def double_gradient_rewrites(model: ModelProto, elem_type: int) -> ModelProto:
    """In a double gradient graph, the com.microsoft gradient operators onnxruntime-training 1.19
    has no double CPU kernel for, written with standard operators (same math):

    - ``SoftmaxGrad_13(dY, Y)``: ``Y * (dY - ReduceSum(dY * Y, axis))``;
    - ``LogSoftmaxGrad_13(dY, Y)``: ``dY - Exp(Y) * ReduceSum(dY, axis)``;
    - ``LeakyReluGrad(dY, Y)``: ``Where(Y > 0, dY, alpha * dY)``.

    Float graphs keep onnxruntime's kernels. Operators without a double kernel at all (``Erf``,
    ``Cos``) are named by :func:`_binding.make_session` when the session is created.
    """
    wanted = {"SoftmaxGrad_13", "LogSoftmaxGrad_13", "LeakyReluGrad"}
    if elem_type != onnx.TensorProto.DOUBLE or not any(
        n.domain == "com.microsoft" and n.op_type in wanted for n in model.graph.node
    ):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 17)
    b = NodeBuilder(elem_type, opset, all_names(out), prefix="f64grad_")
    nodes: list[onnx.NodeProto] = []
    for node in out.graph.node:
        if node.domain != "com.microsoft" or node.op_type not in wanted:
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dy, y = node.input[0], node.input[1]
        b.nodes = []
        if node.op_type == "SoftmaxGrad_13":
            axis = int(attrs.get("axis", -1))
            dot = b.reduce("ReduceSum", b.op("Mul", [dy, y], "dy_y"), [axis], 1, "dy_y_sum")
            result = ("Mul", [y, b.op("Sub", [dy, dot], "centred")])
        elif node.op_type == "LogSoftmaxGrad_13":
            axis = int(attrs.get("axis", -1))
            total = b.reduce("ReduceSum", dy, [axis], 1, "dy_sum")
            result = ("Sub", [dy, b.op("Mul", [b.op("Exp", [y], "softmax"), total], "spread")])
        else:
            alpha = b.const(float(attrs.get("alpha", 0.01)), "alpha")
            positive = b.op("Greater", [y, b.const(0.0, "zero")], "positive")
            result = ("Where", [positive, dy, b.op("Mul", [dy, alpha], "dy_alpha")])
        b.nodes.append(
            helper.make_node(result[0], result[1], [node.output[0]], name=b.name(f"n_{node.op_type}"))
        )
        nodes.extend(b.nodes)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
