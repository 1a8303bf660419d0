"""The gradient room's seam: what trainers ask of a gradient backend, and the graphs built on top
of any backend's gradients.

A backend offers the two forms the trainers use: the fused step (loss, gradients and the
optimizer's update in one graph: one session run per step) and the forward/backward pair with
its runner (forward now, backward later with the gradients of the outputs). Trainers, the torch
adapter and the command line name only :class:`GradientBackend` and the records here, and get a
backend from :mod:`._backends`, the one place that chooses it. This module imports no backend:
everything specific to onnxruntime-training lives in ``_ort_training``; a backend that writes the
reverse pass in plain ONNX implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx
from onnx import ModelProto, helper

from ._backends import default_backend  # the chooser, not a backend
from ._batchnorm import update_outputs
from ._builder import NodeBuilder
from ._runtime import Device
from .graph import MAX_IR_VERSION, MIN_OPSET, all_names
from .learning_rate import BaseLearningRate
from .losses import BaseLearningLoss, BaseLearningPenalty


@dataclass
class FusedStepSignature:
    """Names of the fused step graph's inputs and outputs.

    Attributes
    ----------
    data_inputs : list of str
        The inputs fed with batches (features, label, sample weight).
    weights, new_weights : list of str
        The trained weights read, and the outputs their updated values go to (index-wise).
    states, new_states : list of list of str
        Per weight, the optimizer states read and their updated outputs.
    scalars : list of str
        The learning rate's 0-d inputs (its rate, bias corrections).
    loss : str
        The loss output.
    statistics, new_statistics : list of str
        BatchNormalization's running statistics read, and the outputs their updated values go
        to (index-wise; see :mod:`._batchnorm`).
    """

    data_inputs: list[str]
    weights: list[str]
    new_weights: list[str]
    states: list[list[str]] = field(default_factory=list)
    new_states: list[list[str]] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    loss: str = "loss"
    statistics: list[str] = field(default_factory=list)
    new_statistics: list[str] = field(default_factory=list)


@dataclass
class ForwardBackwardGraphs:
    """The graphs of a forward/backward pair and the order of what its runner takes and gives.

    Attributes
    ----------
    gradient_model : onnx.ModelProto
        The graph the runner's session holds (forward, then backward).
    input_names, output_names : list of str
        The user inputs fed first (weights follow), and the outputs of the forward.
    weights : list of str
        The trained weights, fed after the inputs, in this order.
    input_grad_names : list of str
        The inputs that get a gradient: the backward gives theirs first, then the weights'.
    fetch_names : list of str
        The backward's outputs, in order.
    non_differentiable_outputs : frozenset of int
        Indices of the outputs without a gradient (bool, integer, or not reached by any weight
        or input requiring a gradient): the backward takes no gradient for them.
    """

    gradient_model: ModelProto
    input_names: list[str]
    output_names: list[str]
    weights: list[str]
    input_grad_names: list[str]
    fetch_names: list[str]
    non_differentiable_outputs: frozenset[int] = frozenset()


class ForwardBackwardRunner(Protocol):
    """Runs a forward/backward pair on OrtValues: a state per forward, at most one backward each.

    Attributes
    ----------
    graphs : ForwardBackwardGraphs
        What the pair computes, and the order of its feeds and fetches.
    session : onnxruntime InferenceSession
        The session that holds the pair's graph.
    """

    graphs: ForwardBackwardGraphs
    session: Any

    def new_state(self) -> Any:
        """A fresh execution state, one per forward, read by its backward."""
        ...

    def vector(self, values: Sequence[Any]) -> Any:
        """The runner's sequence type (indexable, ``len``) holding ``values`` (OrtValues)."""
        ...

    def run_forward(self, inputs: Any, outputs: Any, state: Any) -> None:
        """Fills ``outputs`` (a :meth:`vector`) from ``inputs`` (a vector of the inputs, then
        the weights); the buffers of a filled vector are written in place."""
        ...

    def run_backward(self, output_grads: Any, grads: Any, state: Any) -> None:
        """Fills ``grads`` (inputs requiring one, then weights) from one gradient per
        differentiable output, for the forward that left ``state``."""
        ...


class GradientBackend(Protocol):
    """What a gradient backend provides: the trainers' two forms of a gradient, and the raw
    gradient graph both are built from.

    Attributes
    ----------
    name : str
        Identifies the backend (in cache keys).
    """

    name: str

    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        """``model`` plus one output ``<name>_grad`` per name (graph inputs), the loss kept."""
        ...

    def fused_step(
        self,
        loss_model: ModelProto,
        loss_name: str,
        weights: Sequence[str],
        learning_rate: BaseLearningRate,
        device: Device,
    ) -> tuple[ModelProto, FusedStepSignature]:
        """The fused step graph of ``loss_model`` (weights as inputs) for ``device``: see
        :func:`fused_step_from_gradients`."""
        ...

    def forward_backward(
        self,
        model: ModelProto,
        weights: Sequence[str],
        inputs_requiring_grad: Sequence[str],
        device: Device,
        types: Mapping[str, int] | None = None,
        reuse_memory: bool = True,
        threads: int | None = None,
    ) -> ForwardBackwardRunner:
        """The forward/backward pair of ``model`` (weights as initializers, in the caller's
        order) on ``device``, ready to run. ``types``: :func:`graph.value_types` of ``model``
        when the caller has them; ``reuse_memory=False`` when the forward's outputs outlive the
        backward (see :func:`_binding.make_session`); ``threads``: its intra-op threads (None:
        onnxruntime's default)."""
        ...


def fused_step_from_gradients(
    grad_model: ModelProto, loss_name: str, weights: Sequence[str], learning_rate: BaseLearningRate
) -> tuple[ModelProto, FusedStepSignature]:
    """One graph that computes the loss, the gradients and the updated weights and states.

    Parameters
    ----------
    grad_model : onnx.ModelProto
        A backend's :meth:`~GradientBackend.gradient_graph` of the loss for ``weights`` (graph
        inputs), which it modifies.
    loss_name : str
        The loss output.
    weights : sequence of str
        The trained weights.
    learning_rate : BaseLearningRate
        Writes the update nodes.

    Returns
    -------
    (onnx.ModelProto, FusedStepSignature)
        The graph, whose outputs are the loss and, per weight, its new value and new states
        (separate outputs: the caller binds them to other buffers than the inputs), and its
        signature.
    """
    g = grad_model.graph
    updates = update_outputs(grad_model)  # running statistics, fed and output like weights
    trained = set(weights)  # once: per input it made the 20k-weight step quadratic
    data_inputs = [i.name for i in g.input if i.name not in trained and i.name not in updates]
    elem_type = next(o.type.tensor_type.elem_type for o in g.output if o.name == loss_name)
    opset = next((o.version for o in grad_model.opset_import if o.domain in ("", "ai.onnx")), 17)
    b = NodeBuilder(elem_type, opset, all_names(grad_model), prefix="opt_")
    scalars = {s: b.name(s) for s in learning_rate.scalar_names}
    sig = FusedStepSignature(data_inputs, list(weights), [], scalars=list(scalars.values()), loss=loss_name)
    sig.statistics, sig.new_statistics = list(updates), list(updates.values())
    weight_types = {i.name: i.type for i in g.input}
    new_inputs: list[onnx.ValueInfoProto] = []
    shaped: dict[int, dict[str, str]] = {}
    for w in weights:
        states = [b.name(f"{w}_{s}") for s in learning_rate.state_names]
        shape = weight_types[w].tensor_type.shape.dim
        w_scalars = column_scalars(
            b, scalars, [d.dim_value if d.HasField("dim_value") else None for d in shape], shaped
        )
        w_new, new_states = learning_rate.update_nodes(b, w, f"{w}_grad", states, w_scalars)
        sig.new_weights.append(w_new)
        sig.states.append(states)
        sig.new_states.append(new_states)
        new_inputs.extend(_typed_like(s, weight_types[w]) for s in states)
    g.node.extend(b.nodes)
    new_inputs.extend(helper.make_tensor_value_info(s, elem_type, []) for s in scalars.values())
    g.input.extend(new_inputs)
    outputs = [next(o for o in g.output if o.name == loss_name)]
    for w, w_new, new_states in zip(weights, sig.new_weights, sig.new_states):
        outputs.extend(_typed_like(name, weight_types[w]) for name in [w_new, *new_states])
    outputs.extend(_typed_like(updates[s], weight_types[s]) for s in sig.statistics)
    del g.output[:]
    g.output.extend(outputs)
    return grad_model, sig


def column_scalars(
    b: NodeBuilder, scalars: dict[str, str], dims: Sequence[Any], shaped: dict[int, dict[str, str]]
) -> dict[str, str]:
    """The update's 0-d scalars as they multiply a weight of shape ``dims``: reshaped to
    ``[1] * rank`` for a weight of rank >= 2 whose last dimension is 1 (one reshape per rank,
    kept in ``shaped``), as they are otherwise. onnxruntime 1.19's CPU kernels broadcast a 0-d
    operand over ``[F, 1]`` one element at a time, 35x slower than over ``[F]`` or ``[F, 2]``
    (a binary linear model of 50 000 features: 1 ms a step); ``[1, 1]`` takes the fast path and
    gives the same values and shape."""
    rank = len(dims)
    if rank < 2 or dims[-1] != 1:
        return scalars
    if rank not in shaped:
        ones = b.int_const([1] * rank, "scalar_shape")
        shaped[rank] = {k: b.op("Reshape", [v, ones], f"{v}_shaped") for k, v in scalars.items()}
    return shaped[rank]


def _typed_like(name: str, value_type: onnx.TypeProto) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto()
    vi.name = name
    vi.type.CopyFrom(value_type)
    return vi


def build_loss_gradient_graph(
    loss: BaseLearningLoss,
    pred_type: int,
    pred_shape: list[Any],
    batch: int | None,
    reduction: str = "mean",
    backend: GradientBackend | None = None,
) -> ModelProto:
    """(prediction, label, weight) -> (loss, prediction_grad), from the same loss nodes as
    :func:`add_loss_output`, differentiated with respect to the prediction.

    Parameters
    ----------
    loss : BaseLearningLoss
        The learning loss.
    pred_type : int
        The prediction's ONNX element type.
    pred_shape : list
        The prediction's shape (its first dimension is replaced by ``batch``).
    batch : int or None
        The fixed batch dimension (None: free).
    reduction : str, default='mean'
        How the rows' losses make the batch loss (see :func:`add_loss_output`).
    backend : GradientBackend or None, default=None
        The gradient backend (None: :func:`._backends.default_backend`).

    Returns
    -------
    onnx.ModelProto
        The loss and its gradient with respect to ``prediction``.
    """
    from .graph import add_loss_output, set_batch_dimension

    dims = ["N", *pred_shape[1:]]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["prediction"], ["prediction_out"])],
        "learning_loss",
        [helper.make_tensor_value_info("prediction", pred_type, dims)],
        [helper.make_tensor_value_info("prediction_out", pred_type, dims)],
    )
    model = _model(graph, max(17, MIN_OPSET))
    with_loss = add_loss_output(model, loss, weight_name="weight", reduction=reduction)
    with_loss = set_batch_dimension(with_loss, ["prediction", "label", "weight"], batch)
    grad = (backend or default_backend()).gradient_graph(with_loss, "loss", ["prediction"])
    kept = [o for o in grad.graph.output if o.name in ("loss", "prediction_grad")]
    del grad.graph.output[:]
    grad.graph.output.extend(kept)
    return grad


def _model(graph: onnx.GraphProto, opset: int = 17) -> ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = MAX_IR_VERSION
    return model


@dataclass
class UpdateSignature:
    """Names of the penalty-and-update graph's inputs and outputs (see :func:`build_update_graph`).

    Attributes
    ----------
    weights, grads, new_weights : list of str
        Per weight: the input read, its gradient input, and the output of its new value.
    states, new_states : list of list of str
        Per weight, the optimizer states read and their updated outputs.
    scalars : list of str
        The learning rate's 0-d inputs.
    penalty : str or None
        The penalty output (None without a penalty term).
    """

    weights: list[str]
    grads: list[str]
    new_weights: list[str]
    states: list[list[str]] = field(default_factory=list)
    new_states: list[list[str]] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    penalty: str | None = None


def _penalty_gradient_graph(
    weights: Sequence[tuple[str, int, Sequence[int]]],
    penalty: BaseLearningPenalty,
    penalized: Sequence[str],
    backend: GradientBackend,
) -> tuple[ModelProto, dict[str, str]]:
    """(weights) -> (penalty, its gradient per penalised weight): the same penalty nodes as the
    evaluation graph, differentiated; a graph without nodes when no weight has a term. Also
    returns the gradient output of each penalised weight."""
    names = [w for w, _, _ in weights]
    elem_type = weights[0][1]
    inputs = [helper.make_tensor_value_info(w, t, list(shape)) for w, t, shape in weights]
    b = NodeBuilder(elem_type, 17, names, prefix="pen_")
    terms = [t for t in (penalty.penalty_nodes(b, w) for w in penalized) if t is not None]
    if not terms:
        return _model(helper.make_graph([], "update", inputs, [])), {}
    total = terms[0]
    for term in terms[1:]:  # Add, not Sum: Sum has no gradient in onnxruntime-training
        total = b.op("Add", [total, term], "penalty_sum")
    b.nodes.append(helper.make_node("Identity", [total], ["penalty"], name=b.name("n_penalty")))
    penalty_output = helper.make_tensor_value_info("penalty", elem_type, [])
    pen_model = _model(helper.make_graph(b.nodes, "penalty", inputs, [penalty_output]))
    known = set(names)
    with_terms = [w for w in penalized if w in known]
    return backend.gradient_graph(pen_model, "penalty", with_terms), {w: f"{w}_grad" for w in with_terms}


def build_update_graph(
    weights: Sequence[tuple[str, int, Sequence[int]]],
    learning_rate: BaseLearningRate,
    penalty: BaseLearningPenalty,
    penalized: Sequence[str],
    backend: GradientBackend | None = None,
) -> tuple[ModelProto, UpdateSignature]:
    """(weights, gradients, states, scalars) -> (penalty, new weights, new states).

    Parameters
    ----------
    weights : sequence of (str, int, sequence of int)
        Name, ONNX element type and shape of each trained weight.
    learning_rate : BaseLearningRate
        Writes the update nodes, as in the fused graph.
    penalty : BaseLearningPenalty
        The penalty; its gradient comes from differentiating the same penalty nodes the
        evaluation graph uses.
    penalized : sequence of str
        The weights the penalty applies to.
    backend : GradientBackend or None, default=None
        The gradient backend (None: :func:`._backends.default_backend`).

    Returns
    -------
    (onnx.ModelProto, UpdateSignature)
        The graph and the names of its inputs and outputs.
    """
    model, pen_grads = _penalty_gradient_graph(weights, penalty, penalized, backend or default_backend())
    elem_type = weights[0][1]
    g = model.graph
    ub = NodeBuilder(elem_type, 17, all_names(model), prefix="upd_")
    scalars = {s: ub.name(s) for s in learning_rate.scalar_names}
    has_penalty = any(o.name == "penalty" for o in g.output)
    sig = UpdateSignature([w for w, _, _ in weights], [], [], scalars=list(scalars.values()))
    sig.penalty = "penalty" if has_penalty else None
    new_inputs = []
    shaped: dict[int, dict[str, str]] = {}
    outputs = [helper.make_tensor_value_info("penalty", elem_type, [])] if has_penalty else []
    for w, t, shape in weights:
        grad_in = ub.name(f"grad_{w}")
        sig.grads.append(grad_in)
        new_inputs.append(helper.make_tensor_value_info(grad_in, t, list(shape)))
        grad = ub.op("Add", [grad_in, pen_grads[w]], f"{w}_total_grad") if w in pen_grads else grad_in
        states = [ub.name(f"{w}_{s}") for s in learning_rate.state_names]
        new_inputs.extend(helper.make_tensor_value_info(s, t, list(shape)) for s in states)
        w_scalars = column_scalars(ub, scalars, list(shape), shaped)
        w_new, new_states = learning_rate.update_nodes(ub, w, grad, states, w_scalars)
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
