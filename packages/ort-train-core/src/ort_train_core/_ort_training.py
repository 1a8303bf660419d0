"""The onnxruntime-training 1.19.2 gradient backend: everything of the gradient room that is
specific to that runtime.

- the fused step and the partial loop's small graphs: ``GradientGraphBuilder``;
- the forward/backward pair: ``OrtModuleGraphBuilder``, run by a ``TrainingAgent`` with a
  ``PartialGraphExecutionState`` per forward and ``OrtValueVector`` feeds and fetches;
- the rewrites around them: forms it differentiates wrongly (``_grad_rewrites``, before), and
  after: its shape arithmetic folded for fixed batches, its com.microsoft gradient operators
  without a double kernel written with standard ones, and its slowest CPU kernels replaced.

Trainers reach it only through :class:`~._gradient.GradientBackend`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ._binding import make_session
from ._builder import NodeBuilder
from ._grad_rewrites import _constants, rewrite_for_gradient
from ._gradient import ForwardBackwardGraphs, FusedStepSignature, fused_step_from_gradients
from ._runtime import Device, ort_capi
from .exceptions import GraphNotDifferentiableError
from .graph import (
    MAX_IR_VERSION,
    all_names,
    check_differentiable,
    check_no_control_flow,
    control_flow_error,
    control_flow_weights,
    float_initializers,
    value_types,
)
from .learning_rate import BaseLearningRate


class OrtTrainingBackend:
    """onnxruntime-training's gradient builders behind :class:`~._gradient.GradientBackend`.

    Attributes
    ----------
    name : str
        ``'onnxruntime-training'``.
    """

    name: str = "onnxruntime-training"

    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        """``model`` plus one output ``<name>_grad`` per name (graph inputs), the loss kept
        (GradientGraphBuilder, whose graph holds com.microsoft gradient operators).

        Parameters
        ----------
        model : onnx.ModelProto
            The graph, ``names`` among its inputs.
        loss_name : str
            The scalar output to differentiate.
        names : sequence of str
            The inputs to differentiate with respect to.

        Returns
        -------
        onnx.ModelProto
            The gradient graph.

        Raises
        ------
        GraphNotDifferentiableError
            When an operator on the way has no gradient, naming it.
        """
        check_differentiable(model, names, loss_name)
        check_no_control_flow(model, names, loss_name)  # else raw C++ text or a process abort
        model = rewrite_for_gradient(model, names)  # forms onnxruntime differentiates wrongly
        seeded, seed = _float_loss_seed(model, loss_name)
        so = ort_capi.SessionOptions()
        so.log_severity_level = 3
        try:
            builder = ort_capi.GradientGraphBuilder(
                seeded.SerializeToString(), {loss_name, seed}, set(names), seed, so
            )
            builder.build()
        except Exception as exc:  # onnxruntime raises RuntimeError/Fail with C++ context
            text = str(exc)
            gap = _gradient_gap(text)
            if gap is None:
                raise GraphNotDifferentiableError(_build_failure(text, "the gradient graph")) from exc
            # GRU, LSTM: only the module graph builder has their gradients
            out = _module_gradient_graph(model, loss_name, names)
            if out is None:
                raise GraphNotDifferentiableError(gap) from exc
        else:
            out = onnx.load_from_string(builder.get_model())
            if seed != loss_name:
                kept = [o for o in out.graph.output if o.name != seed]
                del out.graph.output[:]
                out.graph.output.extend(kept)
        out.ir_version = min(out.ir_version, MAX_IR_VERSION)
        out = double_gradient_rewrites(shaped_max_pool_grads(out), _output_type(model, loss_name))
        return fold_unit_factors(fold_broadcast_gradients(fold_static_shapes(out)))

    def fused_step(
        self,
        loss_model: ModelProto,
        loss_name: str,
        weights: Sequence[str],
        learning_rate: BaseLearningRate,
        device: Device,
    ) -> tuple[ModelProto, FusedStepSignature]:
        """The fused step graph (:func:`~._gradient.fused_step_from_gradients`) of the gradient
        graph, with :func:`cpu_gradient_rewrites` on CPU.

        Parameters
        ----------
        loss_model : onnx.ModelProto
            The loss graph, weights as inputs (a fixed batch dimension lets the shape
            arithmetic of the gradient fold away).
        loss_name : str
            The loss output.
        weights : sequence of str
            The trained weights.
        learning_rate : BaseLearningRate
            Writes the update nodes.
        device : Device
            Where the graph will run.

        Returns
        -------
        (onnx.ModelProto, FusedStepSignature)
            The graph and the names of its inputs and outputs.
        """
        gradients = self.gradient_graph(loss_model, loss_name, weights)
        graph, sig = fused_step_from_gradients(gradients, loss_name, weights, learning_rate)
        if device.kind == "cpu":
            graph = cpu_gradient_rewrites(graph, _output_type(graph, loss_name))
        return graph, sig

    def forward_backward(
        self,
        model: ModelProto,
        weights: Sequence[str],
        inputs_requiring_grad: Sequence[str],
        device: Device,
        types: Mapping[str, int] | None = None,
        reuse_memory: bool = True,
        threads: int | None = None,
    ) -> TrainingAgentRunner:
        """The forward/backward pair of ``model`` (OrtModuleGraphBuilder) with its TrainingAgent.

        Parameters
        ----------
        model : onnx.ModelProto
            The graph, weights as initializers.
        weights : sequence of str
            The trained weights, fed after the inputs in this order.
        inputs_requiring_grad : sequence of str
            The inputs whose gradient the backward returns too.
        device : Device
            Where it runs; on CPU the gradient graph gets :func:`cpu_gradient_rewrites`.
        types : mapping of str to int or None, default=None
            :func:`graph.value_types` of ``model``, when the caller has them.
        reuse_memory : bool, default=True
            False when the forward's outputs outlive the backward (see
            :func:`~._binding.make_session`).
        threads : int or None, default=None
            The session's intra-op threads (None: onnxruntime's default).

        Returns
        -------
        TrainingAgentRunner
            The pair, ready to run.

        Raises
        ------
        GraphNotDifferentiableError
            When onnxruntime cannot build it; ``.weight`` names a weight without gradient.
        """
        types = value_types(model) if types is None else types
        graphs = _module_graphs(model, weights, inputs_requiring_grad, types)
        if device.kind == "cpu" and weights:
            elem_type = types.get(weights[0], onnx.TensorProto.FLOAT)
            graphs.gradient_model = cpu_gradient_rewrites(graphs.gradient_model, elem_type)
        session = make_session(graphs.gradient_model, device, threads=threads, reuse_memory=reuse_memory)
        return TrainingAgentRunner(graphs, session, device)


class TrainingAgentRunner:
    """A forward/backward pair run by onnxruntime-training's TrainingAgent
    (:class:`~._gradient.ForwardBackwardRunner`).

    Parameters
    ----------
    graphs : ForwardBackwardGraphs
        The pair.
    session : onnxruntime InferenceSession
        A session of ``graphs.gradient_model``.
    device : Device
        Where the forward's outputs and the gradients are placed.

    Attributes
    ----------
    graphs : ForwardBackwardGraphs
        The pair.
    session : onnxruntime InferenceSession
        Its session.
    new_state : callable
        A fresh ``PartialGraphExecutionState``, one per forward.
    run_backward : callable
        ``(output_grads, grads, state)``: the TrainingAgent's own backward.
    """

    def __init__(self, graphs: ForwardBackwardGraphs, session: Any, device: Device) -> None:
        dev = device.ort_device
        agent = ort_capi.TrainingAgent(
            session,
            [*graphs.input_names, *graphs.weights],
            [dev] * len(graphs.output_names),
            graphs.fetch_names,
            [dev] * len(graphs.fetch_names),
            0,
        )
        self.graphs = graphs
        self.session = session
        self._agent = agent
        self._forward = agent.run_forward
        # the agent's and the runtime's own callables: no Python frame of ours per step
        self.new_state: Callable[[], Any] = ort_capi.PartialGraphExecutionState
        self.run_backward: Callable[[Any, Any, Any], None] = agent.run_backward

    def run_forward(self, inputs: Any, outputs: Any, state: Any) -> None:
        """Fills ``outputs`` from ``inputs`` (the inputs, then the weights), keeping in
        ``state`` what the backward needs.

        Parameters
        ----------
        inputs, outputs : OrtValueVector
            From :meth:`vector`.
        state : PartialGraphExecutionState
            From :meth:`new_state`.
        """
        self._forward(inputs, outputs, state, None)

    @staticmethod
    def vector(values: Sequence[Any]) -> Any:
        """An ``OrtValueVector`` of ``values``.

        Parameters
        ----------
        values : sequence of OrtValue
            Its content (empty for an output vector the runner fills).

        Returns
        -------
        OrtValueVector
            The vector (which does not keep the values alive: the caller does).
        """
        vec = ort_capi.OrtValueVector()
        vec.reserve(len(values))
        for ov in values:
            vec.push_back(ov)
        return vec


def _output_type(model: ModelProto, name: str) -> int:
    return int(next(o.type.tensor_type.elem_type for o in model.graph.output if o.name == name))


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


def _module_gradient_graph(model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto | None:
    """The gradient graph of :meth:`OrtTrainingBackend.gradient_graph` built by the module graph
    builder, whose gradient registry has operators GradientGraphBuilder's lacks (GRU, LSTM);
    None when it cannot build it either.

    Its gradient model is a forward and a backward joined by a ``YieldOp`` that hands the
    forward's outputs to the caller and takes their gradients back. Here the YieldOp becomes
    the seed: ones for the loss, zeros for the other outputs (nothing is differentiated through
    them), each of its output's shape and type, so that one plain session run computes the
    outputs and the gradients ``<name>_grad`` (the training build's CPU kernels run the
    com.microsoft forward and gradient operators it holds: GRUTraining, GRUGrad, ...).
    """
    cfg = ort_capi.OrtModuleGraphBuilderConfiguration()
    cfg.initializer_names, cfg.initializer_names_to_train = [], []
    cfg.input_names_require_grad = list(names)  # the trained weights are graph inputs here
    builder = ort_capi.OrtModuleGraphBuilder()
    try:
        builder.initialize(model.SerializeToString(), cfg)
        builder.build(ort_capi.TrainingGraphTransformerConfiguration())
    except Exception:  # the caller names the operator GradientGraphBuilder had no gradient for
        return None
    out = onnx.load_from_string(builder.get_gradient_model())
    yields = [n for n in out.graph.node if n.op_type == "YieldOp" and n.domain == "com.microsoft"]
    if len(yields) != 1:
        return None
    (yield_node,) = yields
    skipped = {int(i) for a in yield_node.attribute if a.name == "non_differentiable_outputs" for i in a.ints}
    forward_outputs = [x for k, x in enumerate(yield_node.input) if k not in skipped]
    b = NodeBuilder(onnx.TensorProto.FLOAT, 17, all_names(out), prefix="seed_")
    for value, grad in zip(forward_outputs, yield_node.output):
        dtype = helper.tensor_dtype_to_np_dtype(_output_type(model, value))
        fill = np.array([1.0 if value == loss_name else 0.0], dtype=dtype)
        shape = b.op("Shape", [value], f"{value}_shape")
        b.nodes.append(
            helper.make_node(
                "ConstantOfShape", [shape], [grad], name=b.name("n_seed"), value=numpy_helper.from_array(fill)
            )
        )
    nodes = list(out.graph.node)
    at = nodes.index(yield_node)
    del out.graph.node[:]
    out.graph.node.extend([*nodes[:at], *b.nodes, *nodes[at + 1 :]])
    grads = list(out.graph.output)
    del out.graph.output[:]
    out.graph.output.extend([*model.graph.output, *grads])
    return out


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
    return GraphNotDifferentiableError(
        _build_failure(message or type(exc).__name__, "the forward/backward graphs")
    )


#: onnxruntime's own words after the C++ context of its exceptions
_ORT_WORDS = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : (.*)")
#: the C++ source location and function signature an ORT_ENFORCE message starts with
_CPP_PREFIX = re.compile(r"^\S+\.(?:cc|cpp|h):\d+ .*\) ")
#: the node an onnxruntime graph error is about, and the kind of error
_NODE_OP = re.compile(r"Node \(([^)]*)\) Op \(([^)]*)\)\s*(?:\[(\w+)\])?\s*")
_CHECK_MODEL = "check the model with onnx.checker.check_model(model, full_check=True)"


def _build_failure(text: str, what: str) -> str:
    """onnxruntime's failure to build ``what``, in its words without the C++ context: the node
    and operator it names, and what to do."""
    first = text.strip().splitlines()[0] if text.strip() else text
    words = _ORT_WORDS.search(text)
    detail = words.group(1).strip() if words else _CPP_PREFIX.sub("", first).strip()
    found = _NODE_OP.search(detail)
    if found is None:
        return f"onnxruntime could not build {what}: {detail}; {_CHECK_MODEL}"
    node, op, category = found.groups()
    where = f"node {node!r} (operator {op})" if node else f"operator {op}"
    problem = re.sub(r"(?<!^)(?=[A-Z])", " ", category).lower() if category else "error"
    rest = detail[found.end() :].strip().rstrip(".")
    return (
        f"onnxruntime could not build {what}: {where}: {problem}: {rest}; {_CHECK_MODEL} and fix "
        "that node, or leave the weights before it out of weights_to_train"
    )


def check_outputs_not_inputs(model: ModelProto) -> None:
    """Refuses a graph output that is also a graph input or an initializer, naming it.

    onnxruntime-training's module graph builder (partial loop, ``OrtGradientForwardBackward``,
    OnnxModule) fails on such an output with its bare "grad_node_arg != nullptr was false.", and
    the process dies (segmentation fault) when that input requires a gradient. The full loop's
    builder handles it.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph given to the forward/backward builder.

    Raises
    ------
    GraphNotDifferentiableError
        Naming the first such output.
    """
    g = model.graph
    sources = {i.name: "input" for i in g.input}
    sources.update((i.name, "initializer") for i in g.initializer if i.name not in sources)
    for out in g.output:
        if out.name in sources:
            raise GraphNotDifferentiableError(
                f"graph output {out.name!r} is also a graph {sources[out.name]}, which "
                "onnxruntime-training's forward/backward builder (partial loop, "
                "OrtGradientForwardBackward, OnnxModule) cannot differentiate: remove that output, or "
                f"output a copy (an Identity node reading {out.name!r} with a new name); the full loop "
                "(OrtGradientOptimizer) trains the graph as it is"
            )


def _module_graphs(
    model: ModelProto,
    weights: Sequence[str],
    inputs_requiring_grad: Sequence[str],
    types: Mapping[str, int],
) -> ForwardBackwardGraphs:
    """onnxruntime-training's OrtModuleGraphBuilder; the weight order is the caller's."""
    check_outputs_not_inputs(model)
    for out in model.graph.output:
        check_differentiable(model, weights, out.name, types)
    cfg = ort_capi.OrtModuleGraphBuilderConfiguration()
    cfg.initializer_names = list(weights)
    cfg.initializer_names_to_train = list(weights)
    cfg.input_names_require_grad = list(inputs_requiring_grad)
    # forms onnxruntime differentiates wrongly, rewritten (same names, values and weights)
    rewritten = rewrite_for_gradient(model, [*weights, *inputs_requiring_grad])
    builder = ort_capi.OrtModuleGraphBuilder()
    try:
        builder.initialize(rewritten.SerializeToString(), cfg)
        builder.build(ort_capi.TrainingGraphTransformerConfiguration())
    except Exception as exc:
        # a weight behind a Loop, a Scan or a non-constant If gets no gradient (by default
        # OrtGradientForwardBackward would drop it silently) or raw text: name what to do
        crossing = control_flow_weights(model, weights, types)
        error = _build_error(exc, weights)
        if crossing and (error.weight is None or error.weight in crossing):
            error = control_flow_error(crossing, "onnxruntime could not build the forward/backward graphs")
        raise error from exc
    info = builder.get_graph_info()
    grad_model = onnx.load_from_string(builder.get_gradient_model())
    grad_model.ir_version = min(grad_model.ir_version, MAX_IR_VERSION)
    if weights:
        grad_model = double_gradient_rewrites(grad_model, types.get(weights[0], onnx.TensorProto.FLOAT))
    return ForwardBackwardGraphs(
        gradient_model=grad_model,
        input_names=list(info.user_input_names),
        output_names=list(info.user_output_names),
        weights=list(weights),
        input_grad_names=[n for n in info.user_input_names if n in info.user_input_grad_names],
        fetch_names=[o.name for o in grad_model.graph.output],
        non_differentiable_outputs=frozenset(info.output_grad_indices_non_differentiable),
    )


def shaped_max_pool_grads(model: ModelProto) -> ModelProto:
    """Rewrites the MaxPoolGrad nodes whose output shape the graph does not fix as a scatter of
    the output gradient into zeros shaped like MaxPool's input (same values).

    onnxruntime-training's CPU MaxPoolGrad sizes its output from the shape recorded for that
    output when the session is created, not from its inputs: when the shape is not fully known
    (MaxPool's input comes after a Reshape whose shape is computed at run time, as in a resnet18
    exported in eval mode with its input reshaped), the kernel writes out of bounds and the
    process dies (segmentation fault). MaxPool's indices are flat offsets into its input
    (``storage_order=0``), so ``ScatterElements(zeros, indices, dY, reduction='add')`` on the
    flattened tensors, reshaped to the input's run-time shape, is the same gradient. Graphs
    whose opset has no ScatterElements reduction (before 16) are left as they are.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself when every MaxPoolGrad has a fixed output shape.
    """
    grads = {
        k: n
        for k, n in enumerate(model.graph.node)
        if n.op_type == "MaxPoolGrad" and n.domain in ("", "com.microsoft")
    }
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not grads or opset < 16:
        return model
    shapes, elem_types = _static_shapes(model)
    pooled = {
        n.output[1]: n.input[0] for n in model.graph.node if n.op_type == "MaxPool" and len(n.output) > 1
    }
    unsized = {k for k, n in grads.items() if n.output[0] not in shapes and n.input[1] in pooled}
    if not unsized:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    b = NodeBuilder(onnx.TensorProto.FLOAT, opset, all_names(out), prefix="maxpoolgrad_")
    flat = b.int_const([-1], "flat")
    nodes: list[onnx.NodeProto] = [*b.nodes]
    for k, node in enumerate(out.graph.node):
        if k not in unsized:
            nodes.append(node)
            continue
        b.nodes = []
        dtype = helper.tensor_dtype_to_np_dtype(elem_types.get(node.input[0], onnx.TensorProto.FLOAT))
        _scatter_max_pool_grad(b, node, pooled[node.input[1]], flat, dtype)
        nodes.extend(b.nodes)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _scatter_max_pool_grad(b: NodeBuilder, node: onnx.NodeProto, x: str, flat: str, dtype: Any) -> None:
    """MaxPoolGrad(dY, indices) as Reshape(ScatterElements(zeros, indices, dY, 'add'),
    Shape(x)) on the flattened tensors, ``x`` MaxPool's input, into ``b.nodes``."""
    dy, indices = node.input[0], node.input[1]
    x_flat = b.op("Reshape", [x, flat], "x_flat")
    zero = numpy_helper.from_array(np.zeros(1, dtype=dtype))
    zeros = b.op("ConstantOfShape", [b.op("Shape", [x_flat], "size")], "zeros", value=zero)
    rows = [b.op("Reshape", [name, flat], hint) for name, hint in ((indices, "indices"), (dy, "dy"))]
    dx_flat = b.op("ScatterElements", [zeros, *rows], "dx_flat", axis=0, reduction="add")
    shape = b.op("Shape", [x], "x_shape")
    b.nodes.append(helper.make_node("Reshape", [dx_flat, shape], [node.output[0]], name=b.name("n_Reshape")))


def fold_static_shapes(model: ModelProto) -> ModelProto:
    """Turns the gradient builder's run-time shape arithmetic into constants where the batch
    dimension is fixed, so that onnxruntime's constant folding removes it.

    The builder differentiates reductions with ``Shape``/``Size`` -> ``Scale`` -> ``Expand``
    chains even when every shape is known. onnxruntime folds ``Shape`` of a static tensor but
    neither ``Size`` nor the com.microsoft ``Scale``, so the chain ran as three to five kernels
    per step. Here ``Shape``/``Size`` of fully known shapes become ``Constant`` nodes and
    ``Scale`` becomes ``Cast`` + ``Div``/``Mul`` (standard ops, same values): the whole chain
    then folds into one constant. Graphs with a dynamic batch dimension only get the ``Scale``
    rewrite.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself when there is nothing to rewrite.
    """
    wanted = {("", "Shape"), ("", "Size"), ("ai.onnx", "Shape"), ("ai.onnx", "Size")}
    wanted.add(("com.microsoft", "Scale"))
    if not any((n.domain, n.op_type) in wanted for n in model.graph.node):
        return model
    shapes, elem_types = _static_shapes(model)
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


def fold_broadcast_gradients(model: ModelProto) -> ModelProto:
    """Removes the broadcasting arithmetic of the gradient builder where every shape is known.

    The builder differentiates each broadcasting binary operator with a com.microsoft
    ``BroadcastGradientArgs`` (the axes to sum), then ``ReduceSum`` over those axes and a
    ``Reshape`` back to the operand's shape, and each reduction with an ``Expand`` back to the
    input's shape, whether or not anything broadcasts. onnxruntime cannot fold
    ``BroadcastGradientArgs``, so in a fixed-batch graph (after :func:`fold_static_shapes`) the
    chain still ran as three kernels per operator: a quarter of a linear model's fused step.
    Here, with both shapes constant:

    - ``BroadcastGradientArgs`` becomes two constant axis lists (the axes where the operand is
      missing or 1 and the broadcast shape is not);
    - ``ReduceSum`` over no axis (``noop_with_empty_axes=1``) or over axes of size 1 with
      ``keepdims=1``, ``Reshape`` and ``Expand`` to the shape their input already has become
      ``Identity`` (onnxruntime removes those);
    - a broadcasting ``Mul``/``Add``/``Sub``/``Div`` that reads an ``Expand`` reads its input
      instead where its output shape stays the same (it broadcasts the same values); an
      ``Expand`` nothing reads any more is dropped by onnxruntime.

    Values are unchanged; graphs with a dynamic batch dimension keep their run-time arithmetic.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself when it has no ``BroadcastGradientArgs``.
    """
    if not any(n.op_type == "BroadcastGradientArgs" for n in model.graph.node):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = _constants(out)  # the shapes and axes: integer initializers, Constant nodes
    _fold_broadcast_args(g, consts)
    _drop_shape_preserving(out, consts)
    return out


def _fold_broadcast_args(g: onnx.GraphProto, consts: dict[str, np.ndarray]) -> None:
    """Replaces each ``BroadcastGradientArgs`` of two constant shapes by two constant axis
    lists (also recorded in ``consts``)."""
    folded: list[onnx.NodeProto] = []
    for node in g.node:
        if node.op_type == "BroadcastGradientArgs" and all(i in consts for i in node.input):
            shape_a, shape_b = (tuple(int(d) for d in consts[i]) for i in node.input)
            for name, axes in zip(node.output, _broadcast_reduce_axes(shape_a, shape_b), strict=True):
                if name:
                    value = numpy_helper.from_array(np.array(axes, dtype=np.int64))
                    folded.append(
                        helper.make_node("Constant", [], [name], name=f"{name}_folded", value=value)
                    )
                    consts[name] = np.array(axes, dtype=np.int64)
        else:
            folded.append(node)
    del g.node[:]
    g.node.extend(folded)


def _drop_shape_preserving(out: ModelProto, consts: Mapping[str, np.ndarray]) -> None:
    """Turns the ReduceSum/Reshape/Expand nodes that keep their input's shape into Identity,
    and feeds an Expand's input straight to the broadcasting readers that give the same shape."""
    g = out.graph
    shapes, _ = _static_shapes(out)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in g.output}
    for node in g.node:  # topological order: an Identity's output shape is known to its readers
        same = _shape_preserving(node, consts, shapes)
        if same:
            if node.input[0] in shapes:  # a no-op ReduceSum may not know its input's shape
                shapes[node.output[0]] = shapes[node.input[0]]
            kept_input = node.input[0]
            del node.input[:]
            node.input.append(kept_input)
            del node.attribute[:]
            node.op_type, node.domain = "Identity", ""
        elif node.op_type == "Expand" and node.output[0] not in graph_outputs:
            _bypass_expand(node, readers.get(node.output[0], []), shapes)


#: constants up to this many values are read to find those of ones (fold_unit_factors)
_UNIT_CONSTANT_MAX_SIZE = 1 << 16


def fold_unit_factors(model: ModelProto) -> ModelProto:
    """``Mul`` by a constant of ones that keeps the other factor's shape becomes ``Identity``.

    A fit without sample weights steps on a graph whose weight input is a constant of ones
    (``OrtGradientOptimizer``): the loss's weighting ``row_loss * w`` and its gradient
    ``grad * w`` then multiply by ones. onnxruntime folds what reads constants only (the sum of
    the weights), not these products: here they go, two kernels fewer per step. Values are
    unchanged; a product that broadcasts the other factor to a larger shape stays.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph (after :func:`fold_static_shapes`).

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself when no ``Mul`` reads a constant of ones.
    """
    g = model.graph
    overridable = {i.name for i in g.input}
    ones = {
        name
        for name, i in float_initializers(model).items()
        if name not in overridable
        and 0 < int(np.prod(i.dims)) <= _UNIT_CONSTANT_MAX_SIZE
        and bool(np.all(numpy_helper.to_array(i) == 1))
    }
    ones |= {name for name, v in _constants(model).items() if v.size and bool(np.all(v == 1))}
    if not any(n.op_type == "Mul" and ones.intersection(n.input) for n in g.node):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    shapes, _ = _static_shapes(out)
    for node in out.graph.node:
        if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        a, b = node.input
        other = b if a in ones else a if b in ones else None
        if other is None or shapes.get(other) is None or shapes.get(other) != shapes.get(node.output[0]):
            continue
        del node.input[:]
        node.input.append(other)
        node.op_type = "Identity"
    return out


def _broadcast_reduce_axes(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """The axes of the broadcast shape of ``a op b`` that the gradient of each operand sums."""
    rank = max(len(shape_a), len(shape_b))
    a = (1,) * (rank - len(shape_a)) + shape_a
    b = (1,) * (rank - len(shape_b)) + shape_b
    full = [max(x, y) for x, y in zip(a, b, strict=True)]
    axes_a = [i for i in range(rank) if (i < rank - len(shape_a) or a[i] == 1) and full[i] != 1]
    axes_b = [i for i in range(rank) if (i < rank - len(shape_b) or b[i] == 1) and full[i] != 1]
    # an operand of lower rank also loses its leading axes of size 1 (Reshape restores them)
    axes_a += [i for i in range(rank - len(shape_a)) if full[i] == 1]
    axes_b += [i for i in range(rank - len(shape_b)) if full[i] == 1]
    return sorted(axes_a), sorted(axes_b)


def _shape_preserving(
    node: onnx.NodeProto, consts: Mapping[str, np.ndarray], shapes: Mapping[str, list[int]]
) -> bool:
    """Whether ``node`` (ReduceSum, Reshape, Expand) gives its input's values and shape."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("ReduceSum", "Reshape", "Expand"):
        return False
    if len(node.input) < 2 or node.input[1] not in consts or consts[node.input[1]].dtype != np.int64:
        return False
    shape, arg = shapes.get(node.input[0]), [int(v) for v in consts[node.input[1]].ravel()]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "ReduceSum":
        if not arg:
            return bool(attrs.get("noop_with_empty_axes", 0))
        return (
            shape is not None
            and bool(attrs.get("keepdims", 1))
            and all(-len(shape) <= a < len(shape) and shape[a] == 1 for a in arg)
        )
    if node.op_type in ("Reshape", "Expand"):
        return shape is not None and shape == arg
    return False


def _bypass_expand(
    node: onnx.NodeProto, readers: Sequence[onnx.NodeProto], shapes: Mapping[str, list[int]]
) -> None:
    """Feeds ``node``'s input straight to its broadcasting readers whose output shape stays."""
    source, expanded = node.input[0], node.output[0]
    if source not in shapes:
        return
    for reader in readers:
        if reader.domain not in ("", "ai.onnx") or reader.op_type not in ("Mul", "Add", "Sub", "Div"):
            continue
        others = [shapes.get(i) for i in reader.input if i != expanded]
        target = shapes.get(reader.output[0])
        if target is None or any(o is None for o in others):
            continue
        try:
            shape = np.broadcast_shapes(tuple(shapes[source]), *(tuple(o) for o in others if o is not None))
        except ValueError:
            continue
        if list(shape) == target:
            for k, name in enumerate(reader.input):
                if name == expanded:
                    reader.input[k] = source


def _static_shapes(model: ModelProto) -> tuple[dict[str, list[int]], dict[str, int]]:
    """(fully known shapes, element types) of the values onnx's shape inference types;
    com.microsoft outputs stay unknown."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    shapes: dict[str, list[int]] = {i.name: list(i.dims) for i in inferred.initializer}
    elem_types: dict[str, int] = {i.name: i.data_type for i in inferred.initializer}
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        tt = vi.type.tensor_type
        if tt.elem_type:
            elem_types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
    return shapes, elem_types


def cpu_gradient_rewrites(model: ModelProto, elem_type: int) -> ModelProto:
    """The rewrites every CPU gradient graph gets (fused step, forward/backward, either batch
    dimension): ReLU gradients (:func:`cpu_relu_grad`) and bias-gradient sums
    (:func:`cpu_row_sums`), onnxruntime's slowest CPU kernels in those graphs.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.
    elem_type : int
        The ONNX element type of its weights.

    Returns
    -------
    onnx.ModelProto
        The rewritten graph (``model`` itself when nothing applies).
    """
    check_cpu_gradient_kernels(model)
    return cpu_row_sums(cpu_relu_grad(model, elem_type), elem_type)


#: gradient operators onnxruntime-training 1.19.2 writes but has no CPU kernel for, by the
#: forward operator they differentiate
_NO_CPU_GRADIENT_KERNEL = {"ResizeGrad": "Resize", "ConvTransposeGrad": "ConvTranspose"}


def check_cpu_gradient_kernels(model: ModelProto) -> None:
    """Refuses a gradient graph holding a gradient operator without a CPU kernel (Resize's,
    ConvTranspose's), naming the forward node: onnxruntime's own error, at session creation,
    blamed the element type and advised converting an already-float32 graph to float32.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph to run on CPU.

    Raises
    ------
    GraphNotDifferentiableError
        For the first such operator.
    """
    for node in model.graph.node:
        forward = _NO_CPU_GRADIENT_KERNEL.get(node.op_type)
        if forward is None or node.domain not in ("", "com.microsoft"):
            continue
        # the builder names a gradient node '<forward node>_Grad/<op>_<k>'
        name = node.name.split("_Grad/")[0] if "_Grad/" in node.name else ""
        where = f"operator {forward}" + (f" (node {name!r})" if name else "")
        raise GraphNotDifferentiableError(
            f"{where} has no gradient kernel on CPU in onnxruntime-training 1.19.2 ({node.op_type} "
            f"exists only for CUDA): train on a CUDA device, leave the weights before the {forward} "
            "out of weights_to_train, or write that step with other operators"
        )


def cpu_relu_grad(model: ModelProto, elem_type: int) -> ModelProto:
    """Replaces com.microsoft ReluGrad(dY, X) with Mul(dY, Ceil(Clip(X, 0, 1))).

    The mask is exactly 1 where X > 0 (subnormals too) and 0 elsewhere, as ReluGrad's, for X of
    any sign. onnxruntime's CPU ReluGrad branches per element, which is slow on activations of
    mixed signs; Clip and Ceil are faster than the Cast(Greater(X, 0)) form, whose Cast and
    Greater are slow CPU kernels too (benchmarks/results).

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.
    elem_type : int
        The ONNX element type of the activations.

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself without ReluGrad.
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

    onnxruntime's CPU ReduceSum over a strided leading axis is several times slower than the
    MatMul. With N = 1 the sum is contiguous and ReduceSum is faster: those stay, as does any
    sum whose input shape the graph does not record. A fixed B gets constant ones; a free B
    (``OrtGradientForwardBackward``, whose batch varies) gets ones made at run time from the
    shape of the graph input that carries the same batch dimension (Shape, Gather,
    ConstantOfShape, once per step).

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.
    elem_type : int
        The ONNX element type of its weights (float or double; others are left alone).

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself when no sum qualifies.
    """
    g = model.graph
    sums = {k: n for k, n in enumerate(g.node) if n.op_type == "ReduceSum"}
    if elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) or not sums:
        return model
    rows_of = _RowSums(g, sums.values(), elem_type)
    found = {k: r for k, n in sums.items() if (r := rows_of(n))}
    if not found:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    b = NodeBuilder(elem_type, 17, all_names(out), prefix="rowsum_")
    ones: dict[tuple[int | str, int], str] = {}
    nodes = list(out.graph.node)
    for k, (rows, keepdims) in found.items():
        if (rows, keepdims) not in ones:
            ones[rows, keepdims] = _ones(b, rows, keepdims, rows_of.batch_source)
        node = nodes[k]
        matmul = [ones[rows, keepdims], node.input[0]]
        nodes[k] = helper.make_node("MatMul", matmul, list(node.output), name=b.name("n_MatMul"))
    del out.graph.node[:]
    out.graph.node.extend([*b.nodes, *nodes])  # b.nodes: the ones (from graph inputs only), first
    return out


class _RowSums:
    """Tells which ReduceSum nodes of a gradient graph sum a [B, N] over its first axis, from
    the shapes onnxruntime's gradient builder recorded (onnx's shape inference would cost
    more than the rewrite saves on small graphs). A dimension is its size, or its symbol when
    free; a free batch dimension is read from a graph input whose first dimension has that
    symbol (``batch_source``)."""

    def __init__(self, g: onnx.GraphProto, sums: Any, elem_type: int) -> None:
        sums = list(sums)
        wanted = {n.input[0] for n in sums}
        self.shapes: dict[str, list[int | str]] = {
            vi.name: [
                d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim
            ]
            for vi in [*g.input, *g.value_info]
            if vi.name in wanted and vi.type.tensor_type.elem_type == elem_type
        }
        self.batch_source: dict[str, str] = {}
        for vi in g.input:
            dims = vi.type.tensor_type.shape.dim
            if dims and dims[0].dim_param and not dims[0].HasField("dim_value"):
                self.batch_source.setdefault(dims[0].dim_param, vi.name)
        axes_inputs = {n.input[1] for n in sums if len(n.input) > 1}
        self.consts = {i.name: numpy_helper.to_array(i) for i in g.initializer if i.name in axes_inputs}
        self.consts.update(
            (n.output[0], numpy_helper.to_array(n.attribute[0].t))
            for n in g.node
            if n.op_type == "Constant" and n.output[0] in axes_inputs and n.attribute[0].name == "value"
        )

    def __call__(self, node: onnx.NodeProto) -> tuple[int | str, int] | None:
        """(B or its symbol, keepdims) when ``node`` sums a [B, N] over its first axis."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if len(node.input) > 1:
            if node.input[1] not in self.consts:
                return None
            axes = [int(a) for a in np.atleast_1d(self.consts[node.input[1]])]
        else:
            axes = list(attrs.get("axes", []))
        shape = self.shapes.get(node.input[0])
        if axes not in ([0], [-2]) or not shape or len(shape) != 2:
            return None
        rows, cols = shape
        if not isinstance(cols, int) or cols < 2:
            return None
        if rows in (0, "") or (isinstance(rows, str) and rows not in self.batch_source):
            return None
        return rows, int(attrs.get("keepdims", 1))


def _ones(b: NodeBuilder, rows: int | str, keepdims: int, batch_source: Mapping[str, str]) -> str:
    """ones(1, B) (keepdims) or ones(B): a constant for a fixed B, else made from the shape of
    the graph input that carries the batch dimension ``rows``."""
    if isinstance(rows, int):
        return b.const(np.ones((1, rows) if keepdims else (rows,)), "ones")
    size = b.op("Gather", [b.op("Shape", [batch_source[rows]]), b.int_const([0], "first")], "rows")
    if keepdims:
        size = b.op("Concat", [b.int_const([1], "one_row"), size], "rows", axis=0)
    one = numpy_helper.from_array(np.ones(1, dtype=b.np_dtype), "one")
    return b.op("ConstantOfShape", [size], "ones", value=one)


def double_gradient_rewrites(model: ModelProto, elem_type: int) -> ModelProto:
    """In a double gradient graph, the com.microsoft gradient operators onnxruntime-training 1.19
    has no double CPU kernel for, written with standard operators (same math):

    - ``SoftmaxGrad_13(dY, Y)``: ``Y * (dY - ReduceSum(dY * Y, axis))``;
    - ``LogSoftmaxGrad_13(dY, Y)``: ``dY - Exp(Y) * ReduceSum(dY, axis)``;
    - ``LeakyReluGrad(dY, Y)``: ``Where(Y > 0, dY, alpha * dY)``.

    Float graphs keep onnxruntime's kernels. Operators without a double kernel at all (``Erf``,
    ``Cos``) are named by :func:`~._binding.make_session` when the session is created.

    Parameters
    ----------
    model : onnx.ModelProto
        A gradient graph.
    elem_type : int
        The ONNX element type of its weights: only double graphs are rewritten.

    Returns
    -------
    onnx.ModelProto
        A rewritten copy, or ``model`` itself.
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
        b.nodes = []
        op_type, inputs = _standard_gradient(b, node)
        b.nodes.append(helper.make_node(op_type, inputs, [node.output[0]], name=b.name(f"n_{node.op_type}")))
        nodes.extend(b.nodes)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _standard_gradient(b: NodeBuilder, node: onnx.NodeProto) -> tuple[str, list[str]]:
    """The last operator and its inputs of ``node``'s math in standard operators (the nodes
    before it go to ``b``)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    dy, y = node.input[0], node.input[1]
    if node.op_type == "SoftmaxGrad_13":
        axis = int(attrs.get("axis", -1))
        dot = b.reduce("ReduceSum", b.op("Mul", [dy, y], "dy_y"), [axis], 1, "dy_y_sum")
        return "Mul", [y, b.op("Sub", [dy, dot], "centred")]
    if node.op_type == "LogSoftmaxGrad_13":
        axis = int(attrs.get("axis", -1))
        total = b.reduce("ReduceSum", dy, [axis], 1, "dy_sum")
        return "Sub", [dy, b.op("Mul", [b.op("Exp", [y], "softmax"), total], "spread")]
    alpha = b.const(float(attrs.get("alpha", 0.01)), "alpha")
    positive = b.op("Greater", [y, b.const(0.0, "zero")], "positive")
    return "Where", [positive, dy, b.op("Mul", [dy, alpha], "dy_alpha")]
