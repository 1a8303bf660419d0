"""A training step as one standard ONNX graph that any onnxruntime executes (Python, C/C++,
Node.js, the browser): :func:`export_training_step`, and the helpers around it.

The step is the ``onnx`` backend's fused step (forward, loss, backward, optimizer update,
BatchNormalization statistics) with inputs and outputs named so that a loop needs none of our
code: feed the batch and the labels, then feed each output ``<name>_new`` back as the input
``<name>`` of the next step.

The contract:

- inputs, in this order: the batch (every model input, ``batch_size`` rows), the labels (named
  as :func:`~ort_train_core.add_loss_output` names them, ``label`` by default), the sample
  weights when asked, the 0-d ``learning_rate``, Adam's 0-d int64 ``step`` (the steps done),
  the trained weights (their own names), the optimizer's states (``<weight>_velocity``,
  ``<weight>_moment1``, ``<weight>_moment2``) and BatchNormalization's running statistics;
- outputs: ``loss`` (the objective of the batch, before the update), then ``<name>_new`` for
  each of ``step``, the weights, the states and the statistics, in the order of the inputs;
- every input other than the data has an initializer of the same name holding its initial
  value, so the first step needs only data. onnxruntime-node ignores a value fed for such an
  input and onnxruntime-web refuses it: their loops take :func:`step_without_defaults` and
  start from the outputs of :func:`step_initial_state_model`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ._backends import get_backend
from ._batchnorm import inference_form
from ._builder import NodeBuilder, unique_name
from ._runtime import parse_device
from .graph import (
    all_names,
    initializer_values,
    inputs_to_initializers,
    prediction_graph,
    prune_to_outputs,
    rename_value,
    set_batch_dimension,
)
from .learning_rate import BaseLearningRate, make_learning_rate
from .losses import BaseLearningLoss, BaseLearningPenalty

#: metadata key of an exported step: its :class:`StepSignature` as JSON
STEP_METADATA = "ort_train.training_step"
#: the highest IR version onnxruntime 1.19 (the oldest runtime we support) reads
MAX_IR_VERSION = 10
#: the suffix of the output that is the next step's value of an input
NEW = "_new"


@dataclass
class StepSignature:
    """The roles of an exported training step's inputs and outputs.

    Attributes
    ----------
    features : list of str
        The model's inputs (the batch).
    label : str
        The labels input.
    sample_weight : str or None
        The sample-weight input, None when the step takes none.
    learning_rate : str
        The 0-d learning-rate input.
    step : str or None
        The 0-d int64 count of the steps done (Adam), None for the SGD family.
    weights : list of str
        The trained weights.
    optimizer_states : list of str
        The optimizer's state per weight (velocities, Adam's moments), weight by weight.
    statistics : list of str
        BatchNormalization's running statistics.
    loss : str
        The loss output (the objective: the loss and its penalty).
    batch_size : int
        The rows of a batch (fixed in the graph).
    """

    features: list[str]
    label: str
    sample_weight: str | None
    learning_rate: str
    step: str | None
    weights: list[str] = field(default_factory=list)
    optimizer_states: list[str] = field(default_factory=list)
    statistics: list[str] = field(default_factory=list)
    loss: str = "loss"
    batch_size: int = 1

    @property
    def data(self) -> list[str]:
        """The inputs each step feeds from the data: features, label, sample weight."""
        return [*self.features, self.label, *([self.sample_weight] if self.sample_weight else [])]

    @property
    def state(self) -> list[str]:
        """The inputs each step reads from the previous one's ``<name>_new`` outputs."""
        return [*([self.step] if self.step else []), *self.weights, *self.optimizer_states, *self.statistics]


def export_training_step(
    model: ModelProto,
    loss: str | BaseLearningLoss | None = None,
    optimizer: Any = "SGD",
    batch_size: int = 32,
    weights_to_train: Sequence[str] | None = None,
    penalty: BaseLearningPenalty | None = None,
    *,
    sample_weight: bool = False,
    reduction: str = "mean",
    output_index: int = 0,
    loss_output_name: str = "loss",
) -> ModelProto:
    """One ONNX graph that trains ``model`` by one step in any onnxruntime.

    Forward, loss, backward, update and running statistics in default-domain operators, IR
    <= 10; inputs and outputs as the contract of the module's documentation says.

    Parameters
    ----------
    model : onnx.ModelProto
        The prediction graph; with ``loss=None``, a graph of :func:`add_loss_output`.
    loss : str, BaseLearningLoss or None, default=None
        The partial loop's ``learning_loss``; None: ``model`` computes its loss.
    optimizer : str, float or BaseLearningRate, default='SGD'
        As the trainers' ``learning_rate``. The first step's rate is the ``learning_rate``
        input's default; a schedule is the loop's to follow by feeding that input.
    batch_size : int, default=32
        The rows of every batch, fixed in the graph.
    weights_to_train : sequence of str, optional
        The initializers to train; default: as the trainers choose them.
    penalty : BaseLearningPenalty, optional
        With ``loss``: the partial loop's ``learning_penalty``.
    sample_weight : bool, default=False
        Whether the step takes a sample-weight input (one weight per row).
    reduction, output_index
        With ``loss``: as the partial loop's.
    loss_output_name : str, default='loss'
        With ``loss=None``: the loss output of ``model``.

    Returns
    -------
    onnx.ModelProto
        The step, checked by ``onnx.checker.check_model(full_check=True)``; its metadata
        holds the :class:`StepSignature` (:func:`step_signature`).

    Raises
    ------
    ValueError
        A bad argument, or a step that needs an operator outside the default domain.
    GraphNotDifferentiableError
        An operator of the graph has no gradient rule.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1 (the rows of every batch), got {batch_size!r}")
    lr = make_learning_rate(optimizer)
    trainer = _trainer(model, loss, lr, weights_to_train, penalty, reduction, output_index, loss_output_name)
    step = _named_step(*_fused_step(trainer, lr, batch_size, sample_weight), lr)
    _check_exported(step)
    return step


def _fused_step(
    trainer: Any, lr: BaseLearningRate, batch_size: int, sample_weight: bool
) -> tuple[ModelProto, Any, StepSignature, dict[str, np.ndarray]]:
    """The ``onnx`` backend's fused step of the trainer's loss graph at ``batch_size`` rows, its
    :class:`~._gradient.FusedStepSignature`, the exported step's signature (names to come) and
    the initial values of its weights and statistics."""
    graphs = trainer._fit_graphs()
    inputs = graphs.inputs
    stepping = set_batch_dimension(graphs.stepping, inputs.data, batch_size)
    if sample_weight and not inputs.sample_weight:
        raise ValueError(
            "sample_weight=True but the loss graph takes no sample weights: add them with "
            "add_loss_output(model, ..., weight_name='sample_weight'), or pass loss=..."
        )
    if inputs.sample_weight and not sample_weight:
        from .optimizer import _unit_weights  # the full loop's fold of constant weights

        stepping = _unit_weights(stepping, inputs.sample_weight)
    step, fused = get_backend("onnx").fused_step(
        stepping, graphs.loss_name, inputs.parameters, lr, parse_device("cpu")
    )
    sig = StepSignature(
        list(inputs.features),
        inputs.label,
        inputs.sample_weight if sample_weight else None,
        "",
        None,
        list(inputs.parameters),
        loss=graphs.loss_name,
        batch_size=batch_size,
    )
    initial = initializer_values(graphs.loss_model, [*inputs.parameters, *inputs.statistics])
    return step, fused, sig, initial


def _trainer(
    model: ModelProto,
    loss: str | BaseLearningLoss | None,
    lr: BaseLearningRate,
    weights: Sequence[str] | None,
    penalty: BaseLearningPenalty | None,
    reduction: str,
    output_index: int,
    loss_output_name: str,
) -> Any:
    """The trainer whose graph record builds the loss graph the step differentiates: the full
    loop's for a graph with its loss, the partial loop's for a loss (and penalty) to add."""
    lr.validate()
    if loss is None:
        if penalty is not None:
            raise ValueError(
                "penalty needs loss=...: a graph that computes its loss carries its penalty "
                "(add_loss_output(model, ..., penalty={...}))"
            )
        from .optimizer import OrtGradientOptimizer

        full = OrtGradientOptimizer(model, weights, loss_output_name=loss_output_name, learning_rate=lr)
        full._caller = "export_training_step"  # the name the exporter-artefact warning gives
        return full
    from .partial import OrtGradientForwardBackwardOptimizer

    trainer = OrtGradientForwardBackwardOptimizer(
        model,
        weights,
        learning_rate=lr,
        learning_loss=loss,
        learning_penalty=penalty,
        output_index=output_index,
        reduction=reduction,
    )
    trainer._caller = "export_training_step"
    trainer._loss()  # validates the loss and penalty with the trainer's messages
    trainer._penalty()
    return trainer


def _named_step(
    step: ModelProto,
    fused: Any,
    sig: StepSignature,
    initial: dict[str, np.ndarray],
    lr: BaseLearningRate,
) -> ModelProto:
    """The fused step with the contract's names, scalars computed in the graph, defaults as
    initializers, dead nodes dropped and the signature in its metadata."""
    g = step.graph
    taken = all_names(step)
    types = {i.name: i.type for i in g.input}
    elem_type = types[sig.weights[0]].tensor_type.elem_type if sig.weights else onnx.TensorProto.FLOAT
    b = NodeBuilder(elem_type, _opset(step), taken, prefix="export_")
    sig.learning_rate = _fresh("learning_rate", taken)
    sig.step = _fresh("step", taken) if lr.needs_step_count else None
    scalars = lr.step_scalar_nodes(b, sig.learning_rate, sig.step)
    first = lr.eta(0) if lr.needs_step_count else lr.scalar_values(0, 1, 0, sig.batch_size)[0]
    defaults = {sig.learning_rate: np.array(first, dtype=b.np_dtype)}
    if sig.step:
        one = b.const(1, "one", dtype=np.int64)
        b.nodes.append(helper.make_node("Add", [sig.step, one], [sig.step + NEW], name=b.name("n_Add")))
        g.input.append(helper.make_tensor_value_info(sig.step, onnx.TensorProto.INT64, []))
        g.output.append(helper.make_tensor_value_info(sig.step + NEW, onnx.TensorProto.INT64, []))
        defaults[sig.step] = np.array(0, dtype=np.int64)
    # the fused step's scalar inputs become the outputs of these nodes, which read inputs only
    for name, graph_name in zip(lr.scalar_names, fused.scalars):
        rename_value(step, graph_name, scalars[name])
    nodes = [*b.nodes, *g.node]
    del g.node[:]
    g.node.extend(nodes)
    scalar_inputs = set(fused.scalars)
    kept = [i for i in g.input if i.name not in scalar_inputs]
    del g.input[:]
    g.input.extend(kept)
    g.input.append(helper.make_tensor_value_info(sig.learning_rate, elem_type, []))
    weight_of_state = _contract_names(step, fused, sig, taken)
    defaults.update(initial)
    for state, weight in zip(sig.optimizer_states, weight_of_state):
        defaults[state] = np.zeros_like(initial[weight])
    return _finish(step, sig, defaults)


def _contract_names(step: ModelProto, fused: Any, sig: StepSignature, taken: set[str]) -> list[str]:
    """Renames the states' inputs ``<weight>_<state>`` and every updated value's output
    ``<input>_new`` (a value of the graph that had that name is renamed first)."""
    weight_of_state: list[str] = []
    pairs: list[tuple[str, str]] = []  # (input, output): output becomes input_new
    for w, w_new, states, new_states in zip(fused.weights, fused.new_weights, fused.states, fused.new_states):
        pairs.append((w, w_new))
        for s, s_new in zip(states, new_states):
            public = _fresh(s.removeprefix("opt_"), taken)
            rename_value(step, s, public)
            sig.optimizer_states.append(public)
            weight_of_state.append(w)
            pairs.append((public, s_new))
    sig.statistics = list(fused.statistics)
    pairs.extend(zip(fused.statistics, fused.new_statistics))
    for name, out in pairs:
        wanted = name + NEW
        if wanted != out:
            if wanted in taken:
                rename_value(step, wanted, unique_name(f"{wanted}_inner", taken))
            rename_value(step, out, wanted)
            taken.add(wanted)
    return weight_of_state


def _finish(step: ModelProto, sig: StepSignature, defaults: dict[str, np.ndarray]) -> ModelProto:
    """Orders the inputs and outputs as the contract lists them, drops what no output needs,
    adds the defaults and records the signature."""
    g = step.graph
    inputs = {i.name: i for i in g.input}
    outputs = {o.name: o for o in g.output}
    order = [*sig.data, sig.learning_rate, *sig.state]
    out_order = [sig.loss, *(n + NEW for n in sig.state)]
    del g.input[:], g.output[:]
    g.input.extend(inputs[n] for n in order)
    g.output.extend(outputs[n] for n in out_order)
    pruned = prune_to_outputs(step, out_order)
    # an input nothing reads stays: the contract lists every one (a frozen statistic, a label)
    del pruned.graph.input[:]
    pruned.graph.input.extend(inputs[n] for n in order)
    pruned.graph.initializer.extend(numpy_helper.from_array(defaults[n], n) for n in order if n in defaults)
    pruned.ir_version = min(pruned.ir_version, MAX_IR_VERSION)
    kept = [p for p in pruned.metadata_props if not p.key.startswith("ort_train")]
    del pruned.metadata_props[:]
    pruned.metadata_props.extend(kept)
    pruned.metadata_props.add(key=STEP_METADATA, value=json.dumps(asdict(sig)))
    pruned.graph.name = f"{pruned.graph.name}_training_step"
    return pruned


def _check_exported(step: ModelProto) -> None:
    """Raises ValueError naming the nodes outside the default domain; runs onnx's full check."""
    nodes = _all_nodes(step.graph)
    foreign = sorted({f"{n.op_type} ({n.domain})" for n in nodes if n.domain not in ("", "ai.onnx")})
    if foreign:
        raise ValueError(
            f"the training step needs operators outside the default ONNX domain: {', '.join(foreign)}; "
            "an exported step must run on any onnxruntime: replace them in the model (or leave "
            "their part out of the trained graph)"
        )
    used = {n.domain for n in nodes}
    kept = [o for o in step.opset_import if o.domain in ("", "ai.onnx") or o.domain in used]
    del step.opset_import[:]
    step.opset_import.extend(kept)
    onnx.checker.check_model(step, full_check=True)


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                out.extend(_all_nodes(sub))
    return out


def _opset(model: ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)


def _fresh(hint: str, taken: set[str]) -> str:
    """A name free in ``taken`` whose ``<name>_new`` is free too (both joined)."""
    i = 0
    while (name := hint if i == 0 else f"{hint}_{i}") in taken or name + NEW in taken:
        i += 1
    taken.update((name, name + NEW))
    return name


def step_signature(step: ModelProto) -> StepSignature:
    """The roles of an exported step's inputs and outputs, from its metadata.

    Parameters
    ----------
    step : onnx.ModelProto
        A graph :func:`export_training_step` made.

    Returns
    -------
    StepSignature
        Its signature.

    Raises
    ------
    ValueError
        The graph is not an exported step.
    """
    for prop in step.metadata_props:
        if prop.key == STEP_METADATA:
            return StepSignature(**json.loads(prop.value))
    raise ValueError(
        "this graph is not a training step made by export_training_step (its metadata has no "
        f"{STEP_METADATA!r}); export one with ort_train_core.export_training_step"
    )


def step_initial_state(
    step: ModelProto, defaults: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """The values the first step reads for ``learning_rate`` and the state inputs.

    Parameters
    ----------
    step : onnx.ModelProto
        An exported step (with its defaults).
    defaults : mapping of str to ndarray, optional
        Values that replace some of them.

    Returns
    -------
    dict of str to ndarray
        By input name, in the order of the inputs.
    """
    sig = step_signature(step)
    names = [sig.learning_rate, *sig.state]
    have = {t.name for t in step.graph.initializer}
    missing = [n for n in names if n not in have and not (defaults and n in defaults)]
    if missing:
        raise ValueError(
            f"the step carries no initial value of {missing[:5]} (step_without_defaults "
            "dropped them): pass the step export_training_step returned, or those values as defaults="
        )
    values = initializer_values(step, [n for n in names if n in have])
    values.update(defaults or {})
    return {n: values[n] for n in names}


def step_without_defaults(step: ModelProto) -> ModelProto:
    """The step whose ``learning_rate`` and state inputs are required: no initializer holds
    their initial values.

    onnxruntime-node ignores a value fed for an input that has an initializer (the step would
    train nothing), and onnxruntime-web refuses it ("invalid input"): their loops take this
    form and start from :func:`step_initial_state_model`.

    Parameters
    ----------
    step : onnx.ModelProto
        An exported step.

    Returns
    -------
    onnx.ModelProto
        A new model.
    """
    sig = step_signature(step)
    out = ModelProto()
    out.CopyFrom(step)
    fed = {sig.learning_rate, *sig.state}
    kept = [t for t in out.graph.initializer if t.name not in fed]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def step_initial_state_model(
    step: ModelProto, defaults: Mapping[str, np.ndarray] | None = None
) -> ModelProto:
    """A graph without inputs whose outputs, named as the step's inputs, are the initial
    ``learning_rate`` and state: the start of a loop in a runtime that cannot feed an input
    that has an initializer (onnxruntime-node, onnxruntime-web), with the step of
    :func:`step_without_defaults`.

    Parameters
    ----------
    step : onnx.ModelProto
        An exported step (with its defaults).
    defaults : mapping of str to ndarray, optional
        Values that replace some of them.

    Returns
    -------
    onnx.ModelProto
        The graph (Constant nodes), IR and opset as the step's.
    """
    values = step_initial_state(step, defaults)
    nodes, outputs = [], []
    for name, value in values.items():
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        outputs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        )
    graph = helper.make_graph(nodes, "initial_state", [], outputs)
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _opset(step))])
    out.ir_version = step.ir_version
    onnx.checker.check_model(out, full_check=True)
    return out


def model_from_step_state(
    model: ModelProto, state: Mapping[str, np.ndarray], loss_output_name: str = "loss"
) -> ModelProto:
    """The inference graph of ``model`` holding the trained values of an exported step's state.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph given to :func:`export_training_step` (a loss graph loses its loss part).
    state : mapping of str to ndarray
        Values by input name of the step (weights and running statistics; other entries, the
        optimizer's states, are left out); the outputs of the last step may be passed with
        their ``_new`` suffix.
    loss_output_name : str, default='loss'
        The loss output of a loss graph.

    Returns
    -------
    onnx.ModelProto
        A new model: those initializers replaced, in inference form as torch's ``eval()``
        (BatchNormalization normalises with its running statistics), checked by onnx.checker.

    Raises
    ------
    ValueError
        No entry of ``state`` names an initializer of ``model``, or a value has another shape
        or type than the initializer it replaces.
    """
    values = {k.removesuffix(NEW) if k.endswith(NEW) else k: np.asarray(v) for k, v in state.items()}
    if any(o.name == loss_output_name for o in model.graph.output):
        model = prediction_graph(model, loss_output_name)
    inits = {t.name: t for t in model.graph.initializer}
    known = {k: v for k, v in values.items() if k in inits}
    if not known:
        raise ValueError(
            f"no entry of the state names an initializer of the model (state: {sorted(values)[:8]}); "
            "pass the model given to export_training_step and the step's outputs or inputs"
        )
    for name, value in known.items():
        expected = numpy_helper.to_array(inits[name])
        if value.shape != expected.shape or value.dtype != expected.dtype:
            raise ValueError(
                f"state value {name!r} has shape {value.shape} and dtype {value.dtype}, the "
                f"model's initializer {expected.shape} and {expected.dtype}"
            )
    out = inference_form(inputs_to_initializers(model, known))
    onnx.checker.check_model(out)
    return out
