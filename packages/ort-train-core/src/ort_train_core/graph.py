"""Pure ONNX graph building: the loss output, trainable weights, weights <-> inputs, pruning,
and the IR/opset normalisation that onnxruntime 1.19 needs. No session is created here.

The names in ``__all__`` are the public surface the adapters (ort-train-sklearn,
ort-train-torch) and users build on; the other functions serve core's trainers.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ._auto_pad import explicit_conv_pads
from ._batchnorm import inference_form, running_statistics
from ._builder import FLOAT_TYPES, NodeBuilder, unique_name
from ._exported import export_notes, exporter_constants, warn_exported_graph
from ._io import validate_model
from ._metadata import META_PREFIX, read_metadata
from ._opset_errors import conversion_error
from .exceptions import GraphNotDifferentiableError
from .losses import BaseLearningLoss, BaseLearningPenalty, ElasticLearningPenalty, make_loss, reduce_rows

__all__ = [
    "MAX_IR_VERSION",
    "MAX_OPSET",
    "MIN_OPSET",
    "add_loss_output",
    "all_names",
    "ancestors",
    "default_penalized_weights",
    "default_weights_to_train",
    "export_notes",
    "exporter_constants",
    "inference_form",
    "initializer_values",
    "initializers_to_inputs",
    "inputs_to_initializers",
    "normalise_model",
    "nothing_to_train_error",
    "prediction_graph",
    "prune_to_outputs",
    "rename_value",
    "unique_name",
    "warn_exported_graph",
]

#: The highest IR version onnxruntime 1.19 loads.
MAX_IR_VERSION = 10
#: the lowest IR version a normalised model keeps (IR 3 graphs are raised to it)
MIN_IR_VERSION = 4
#: The highest opset of the default domain onnxruntime 1.19 runs.
MAX_OPSET = 21
#: The lowest default-domain opset a model is kept at (older ones are converted up).
MIN_OPSET = 13

#: hints for operators that have no gradient, keyed by (domain, op_type)
_BLOCKING_HINTS = {
    (
        "ai.onnx.ml",
        "LinearRegressor",
    ): "convert with skl2onnx.to_onnx(..., black_op={'LinearRegressor'}) "
    "to get MatMul/Add with float initializers",
    (
        "ai.onnx.ml",
        "LinearClassifier",
    ): "convert with skl2onnx.to_onnx(..., black_op={'LinearClassifier'}, "
    "options={'zipmap': False}) and cut the graph at its logits",
    ("ai.onnx.ml", "ZipMap"): "convert with options={'zipmap': False}",
}


def _opset(model: ModelProto, domain: str = "") -> int:
    for op in model.opset_import:
        if op.domain in (domain, "ai.onnx" if domain == "" else domain):
            return int(op.version)
    return 0


def normalise_model(model: ModelProto) -> ModelProto:
    """A copy with IR version in [4, 10] and a default opset in [13, 21], as onnxruntime 1.19
    and its gradient builder need.

    Every model, from a file or in memory, enters here: :func:`._io.validate_model` refuses
    external data, control flow nested too deep and malformed graphs with a ValueError before
    onnx or onnxruntime see them. Nodes listed out of order are sorted (onnx's checker wants
    them sorted; onnxruntime sorts them itself).

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.

    Returns
    -------
    onnx.ModelProto
        The normalised copy (one opset import per domain, metadata kept).

    Raises
    ------
    ValueError
        For a malformed or untrusted model, or an opset that cannot be converted.
    """
    order = validate_model(model)
    model = _copy(model)
    if order != list(range(len(order))):
        nodes = [onnx.NodeProto() for _ in order]
        for node, i in zip(nodes, order, strict=True):
            node.CopyFrom(model.graph.node[i])
        model.graph.ClearField("node")
        model.graph.node.extend(nodes)
    # one import per domain, the highest (skl2onnx without target_opset writes one twice)
    versions: dict[str, int] = {}
    for op in model.opset_import:
        domain = "" if op.domain == "ai.onnx" else op.domain
        versions[domain] = max(versions.get(domain, 0), int(op.version))
    if len(versions) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in versions.items())
    opset = _opset(model)
    if opset and not MIN_OPSET <= opset <= MAX_OPSET:
        target = min(max(opset, MIN_OPSET), MAX_OPSET)
        try:
            from onnx import version_converter

            converted = version_converter.convert_version(model, target)
        except Exception as exc:  # in our words: the step and nodes, not onnx's C++ assertion
            raise conversion_error(model, opset, target, exc) from exc
        _copy_meta(model, converted)
        model = converted
    if model.ir_version > MAX_IR_VERSION or model.ir_version == 0:
        model.ir_version = MAX_IR_VERSION
    elif model.ir_version < MIN_IR_VERSION:
        # IR 3 wants every initializer listed as a graph input; those the gradient builder adds
        # are not ("Cannot find NodeArgs for [Add_Grad/ReduceAxes_for_b_grad]"). From IR 4 an
        # initializer listed as an input is an input with a default value: the same meaning
        model.ir_version = MIN_IR_VERSION
    return explicit_conv_pads(model)  # SAME pads: refused with dilations, wrong gradients


def _copy(model: ModelProto) -> ModelProto:
    out = ModelProto()
    out.CopyFrom(model)
    return out


def _copy_meta(src: ModelProto, dst: ModelProto) -> None:
    keep = {p.key for p in dst.metadata_props}
    for prop in src.metadata_props:
        if prop.key not in keep:
            dst.metadata_props.add(key=prop.key, value=prop.value)


def get_metadata(model: ModelProto, key: str) -> Any:
    """``ort_train.<key>`` when present and consistent with the graph, else None (a forged or
    stale value is ignored with a warning: :func:`._metadata.read_metadata`)."""
    return read_metadata(model, key)


def set_metadata(model: ModelProto, key: str, value: Any) -> None:
    for prop in model.metadata_props:
        if prop.key == META_PREFIX + key:
            prop.value = json.dumps(value)
            return
    model.metadata_props.add(key=META_PREFIX + key, value=json.dumps(value))


def all_names(model: ModelProto) -> set[str]:
    """Every name the top-level graph uses, so that a new node or value can avoid them.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    set of str
        The names of inputs, outputs, initializers, node inputs and outputs, and nodes.
    """
    g = model.graph
    names = {i.name for i in g.input} | {o.name for o in g.output} | {i.name for i in g.initializer}
    for node in g.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
    return names - {""}


def output_shape(model: ModelProto, name: str) -> tuple[int, list[Any]]:
    """Element type and shape (None for unknown dims) of a value, inferred where not declared."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference fails on some custom domains; use what is declared
        inferred = model
    g = inferred.graph
    for vi in [*g.output, *g.value_info, *g.input]:
        if vi.name == name and vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                return tt.elem_type, []
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            return tt.elem_type, dims
    raise ValueError(f"cannot find the type of {name!r} in the graph")


def add_loss_output(
    onx: ModelProto,
    score_name: str | BaseLearningLoss = "squared_error",
    loss_name: str = "loss",
    label_name: str | None = None,
    weight_name: str | None = None,
    penalty: Mapping[str, float | Mapping[str, float] | BaseLearningPenalty] | None = None,
    output_index: int | str = 0,
    reduction: str = "mean",
    **kwargs: Any,
) -> ModelProto:
    """The prediction graph with a scalar loss output, for the fused training loop.

    Adds the label input (and the sample-weight input when ``weight_name`` is set) and the loss
    as the first output; the names it adds are recorded in the model's metadata for the trainers.

    Parameters
    ----------
    onx : onnx.ModelProto
        The prediction graph; it is not modified.
    score_name : str or BaseLearningLoss, default='squared_error'
        A name of :func:`~ort_train_core.losses.make_loss` (``'log'``: probabilities) or a loss
        object. Classification losses take int64 class indices: one per row of a prediction
        ``[N]`` or ``[N, C]`` (``'cross_entropy'``: logits, sigmoid or softmax; SGD losses:
        decision values, one-vs-rest), one per position ``[N, d1, ...]`` of logits
        ``[N, C, d1, ...]`` (``'cross_entropy'``, ``'log'``: torch's class axis 1, a row's loss
        the mean of its positions, :class:`~ort_train_core.losses.CrossEntropyLearningLoss`).
    loss_name : str, default='loss'
        The name of the loss output.
    label_name : str, optional
        The label input's name (``'label'`` by default, ``'label_1'``... when taken), of the
        loss's ``label_shape``; recorded in the metadata (``label_name``).
    weight_name : str, optional
        The name of a sample-weight input (shape ``[N]``) to add; none by default.
    penalty : dict, optional
        By initializer name: ``{'l1': a, 'l2': b}``, a float (L2 only) or a penalty object.
    output_index : int or str, default=0
        The output the loss reads: its position, or its name.
    reduction : {'mean', 'sum', 'row_mean'}, default='mean'
        How the rows' losses combine (:func:`~ort_train_core.losses.reduce_rows`).
    **kwargs
        The loss's parameters: ``l1_weight``, ``l2_weight`` (elastic), ``eps`` (log).

    Returns
    -------
    onnx.ModelProto
        A new model: the loss (a scalar) first, then the original outputs.

    Raises
    ------
    TypeError
        ``onx`` is not a ModelProto, or the loss does not take ``kwargs``.
    ValueError
        A name already used, an output index, penalty or loss parameter out of range, a
        prediction that is not a float tensor, or a graph that breaks a rule of ONNX.
    """
    if not isinstance(onx, ModelProto):
        raise TypeError(f"onx must be an onnx.ModelProto, not {type(onx).__name__}")
    names = (loss_name, label_name, weight_name)
    return _loss_model(onx, score_name, kwargs, names, penalty, output_index, reduction)


def _loss_model(
    onx: ModelProto,
    score_name: str | BaseLearningLoss,
    kwargs: dict[str, Any],
    names: tuple[str, str | None, str | None],
    penalty: Mapping[str, float | Mapping[str, float] | BaseLearningPenalty] | None,
    output_index: int | str,
    reduction: str,
) -> ModelProto:
    """:func:`add_loss_output` past its type check: the loss checked, then the graph."""
    loss = _checked_loss(score_name, kwargs)
    model = normalise_model(onx)
    output_position = _output_position(model, output_index)
    loss_name, label_name, weight_name = names
    if label_name is None:
        label_name = _free_name(all_names(model), "label")
    chosen = (loss_name, label_name, weight_name)
    pred_shape, data_loss = _append_loss(model, loss, chosen, penalty, output_position, reduction)
    _record_loss(model, score_name, loss, chosen, pred_shape, reduction)
    if data_loss is not None:
        # score and the validation losses measure the fit to data, without the penalty (as
        # scikit-learn's scores and onnxcustom's): a penalty term would make a model selection
        # over penalty strengths prefer the weakest
        set_metadata(model, "data_loss_name", data_loss)
    _check_onnx_rules(model)
    return model


def _checked_loss(score_name: str | BaseLearningLoss, kwargs: dict[str, Any]) -> BaseLearningLoss:
    if score_name == "log":  # here the graph's output already holds probabilities
        kwargs.setdefault("probability_function", "none")
    loss = make_loss(score_name, **kwargs)
    loss.validate()
    return loss


def _output_position(model: ModelProto, output: int | str) -> int:
    """The position of an output given by position or by name."""
    names = [o.name for o in model.graph.output]
    if isinstance(output, str):
        if output not in names:
            raise ValueError(f"output_index={output!r} is not an output of the graph; outputs: {names}")
        return names.index(output)
    if isinstance(output, bool) or not isinstance(output, (int, np.integer)):
        raise TypeError(f"output_index must be an output's position or name, not {type(output).__name__}")
    return int(output)


def _free_name(taken: set[str], base: str) -> str:
    """``base``, or ``base_1``, ``base_2``... the first one ``taken`` does not hold."""
    if base not in taken:
        return base
    k = 1
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def _prediction(model: ModelProto, output_index: int) -> tuple[str, int, list[Any]]:
    """(name, element type, shape) of the output a loss reads; it must be a float tensor."""
    g = model.graph
    if not 0 <= output_index < len(g.output):
        raise ValueError(f"output_index={output_index} but the graph has {len(g.output)} output(s)")
    pred = g.output[output_index].name
    pred_type, pred_shape = output_shape(model, pred)
    if pred_type not in FLOAT_TYPES:
        raise ValueError(f"output {pred!r} is not a float tensor: it cannot be the prediction of a loss")
    check_output_size(pred, pred_shape)
    return pred, pred_type, pred_shape


def check_output_size(name: str, shape: Sequence[Any]) -> None:
    """Refuses an output with a dimension 0: it holds no values, so there is nothing to fit (the
    gradient builder's Reshape fails on it at the first step)."""
    if 0 in shape:
        dims = "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
        raise ValueError(
            f"output {name!r} has shape {dims}: a dimension is 0, so it holds no values and there "
            "is nothing to fit; check the model's last layer (its number of outputs)"
        )


def _check_new_names(taken: set[str], names: Sequence[str | None]) -> None:
    """The loss, label and weight names are free in the graph and differ from each other."""
    for name in names:
        if name is not None and name in taken:
            raise ValueError(f"name {name!r} is already used in the graph; choose another one")
    new_names = [n for n in names if n is not None]
    if len(set(new_names)) != len(new_names):
        loss_name, label_name, weight_name = names
        raise ValueError(
            f"loss_name, label_name and weight_name must differ, got {loss_name!r}, "
            f"{label_name!r}, {weight_name!r}"
        )


def _append_loss(
    model: ModelProto,
    loss: BaseLearningLoss,
    names: tuple[str, str, str | None],
    penalty: Mapping[str, float | Mapping[str, float] | BaseLearningPenalty] | None,
    output_index: int,
    reduction: str,
) -> tuple[list[Any], str | None]:
    """Adds the objective's nodes, the label (and weight) inputs and the loss as the first
    output to ``model`` in place; returns the prediction's shape and the name of the loss
    without its penalty (None: no penalty term)."""
    g = model.graph
    loss_name, label_name, weight_name = names
    pred, pred_type, pred_shape = _prediction(model, output_index)
    taken = all_names(model)
    _check_new_names(taken, names)
    penalties = parse_penalty(penalty)
    inits = {i.name for i in g.initializer}
    for wname in penalties:
        if wname not in inits:
            raise ValueError(f"penalty names {wname!r}, which is not an initializer of the graph")
    b = NodeBuilder(pred_type, _opset(model), taken, prefix="loss_")
    total = data_loss = reduce_rows(b, loss.row_loss(b, pred, label_name, pred_shape), weight_name, reduction)
    for wname, pen in penalties.items():
        term = pen.penalty_nodes(b, wname)
        if term is not None:
            total = b.op("Add", [total, term], "objective")
    b.nodes.append(helper.make_node("Identity", [total], [loss_name], name=b.name("n_loss")))
    g.node.extend(b.nodes)
    label_type = loss.label_elem_type(pred_type)
    g.input.append(helper.make_tensor_value_info(label_name, label_type, loss.label_shape(pred_shape)))
    if weight_name is not None:
        g.input.append(helper.make_tensor_value_info(weight_name, pred_type, ["N"]))
    outputs = list(g.output)
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(loss_name, pred_type, []))
    g.output.extend(outputs)
    return pred_shape, (data_loss if total != data_loss else None)


def _record_loss(
    model: ModelProto,
    score_name: str | BaseLearningLoss,
    loss: BaseLearningLoss,
    names: tuple[str, str, str | None],
    pred_shape: list[Any],
    reduction: str,
) -> None:
    """Records in the metadata what :func:`add_loss_output` added, where the trainers read it."""
    loss_name, label_name, weight_name = names
    set_metadata(model, "loss_name", loss_name)
    set_metadata(model, "label_name", label_name)
    set_metadata(model, "weight_name", weight_name)
    set_metadata(model, "prediction_outputs", [o.name for o in model.graph.output[1:]])
    set_metadata(model, "reduction", reduction)
    if loss.integer_labels:
        # the class axis is 1, also for logits with labels per position [N, C, d1, ...]
        n_cols = pred_shape[1] if len(pred_shape) >= 2 else 1
        set_metadata(model, "n_classes", 2 if n_cols == 1 else n_cols)
    set_metadata(
        model,
        "score_name",
        score_name if isinstance(score_name, str) else type(score_name).__name__,
    )


def _check_onnx_rules(model: ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:  # a rule validate_model does not check
        raise ValueError(
            f"the model breaks a rule of ONNX ({str(exc).splitlines()[0]}); "
            "check it with onnx.checker.check_model and export it again"
        ) from exc


def parse_penalty(
    penalty: Mapping[str, float | Mapping[str, float] | BaseLearningPenalty] | None,
) -> dict[str, BaseLearningPenalty]:
    """``{'coef': {'l1': a, 'l2': b}}``, ``{'coef': b}`` (l2 only) or penalty objects, by weight."""
    out: dict[str, BaseLearningPenalty] = {}
    for wname, coefs in (penalty or {}).items():
        if isinstance(coefs, BaseLearningPenalty):
            pen = coefs
        elif isinstance(coefs, Mapping):
            unknown = set(coefs) - {"l1", "l2"}
            if unknown:
                raise ValueError(f"penalty for {wname!r} takes keys 'l1' and 'l2', not {sorted(unknown)}")
            pen = ElasticLearningPenalty(l1=float(coefs.get("l1", 0.0)), l2=float(coefs.get("l2", 0.0)))
        else:
            pen = ElasticLearningPenalty(l1=0.0, l2=float(coefs))
        try:
            pen.validate()
        except ValueError as exc:
            raise ValueError(f"penalty for {wname!r}: {exc}") from exc
        out[wname] = pen
    return out


def _producers(model: ModelProto) -> dict[str, int]:
    return {out: i for i, node in enumerate(model.graph.node) for out in node.output}


def ancestors(model: ModelProto, outputs: Iterable[str]) -> tuple[set[str], set[int]]:
    """Names and node indices the given outputs depend on (subgraph inputs included).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    outputs : iterable of str
        The values to walk back from (graph outputs or intermediate values).

    Returns
    -------
    names : set of str
        The values reached, ``outputs`` included.
    nodes : set of int
        The indices in ``model.graph.node`` of the nodes computing them.
    """
    return _walk_back(model, outputs, lambda node, k, name: bool(name))


def _walk_back(
    model: ModelProto,
    outputs: Iterable[str],
    follow: Callable[[onnx.NodeProto | None, int | None, str], bool],
) -> tuple[set[str], set[int]]:
    """The names and node indices reached walking back from ``outputs`` along the edges
    ``follow(node, input index, name)`` accepts (node None for an output, index None for a
    name a subgraph reads from the outer scope)."""
    producers = _producers(model)
    seen: set[str] = set()
    nodes: set[int] = set()
    stack = [o for o in outputs if follow(None, None, o)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        idx = producers.get(name)
        if idx is None or idx in nodes:
            continue
        nodes.add(idx)
        node = model.graph.node[idx]
        stack.extend(i for k, i in enumerate(node.input) if follow(node, k, i))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                stack.extend(i for i in _outer_names(attr.g) if follow(node, None, i))
    return seen, nodes


#: float inputs onnxruntime-training's gradient builder gives no gradient: statistics, bounds,
#: scales (training one fails with "failed to find NodeArg by name: <name>_grad")
NO_GRADIENT_INPUTS: dict[str, frozenset[int]] = {
    "BatchNormalization": frozenset({3, 4}),
    "Clip": frozenset({1, 2}),
    "Dropout": frozenset({1}),
    "Pad": frozenset({2}),
    "Resize": frozenset({1, 2}),
    "Upsample": frozenset({1}),
    # shapes, masks and indices: integer or bool in the standard, named here so that a value
    # onnx cannot type (past an operator of another domain) does not make a tensor a weight
    "ConstantOfShape": frozenset({0}),
    "Expand": frozenset({1}),
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "GatherND": frozenset({1}),
    "Reshape": frozenset({1}),
    "ScatterElements": frozenset({1}),
    "ScatterND": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Tile": frozenset({1}),
    "Where": frozenset({0}),
}

#: operators whose outputs carry no gradient to any input: comparisons, masks, shapes, indices
NO_GRADIENT_OPS = frozenset(
    {
        *("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor"),
        *("IsNaN", "IsInf", "Shape", "Size", "NonZero", "ArgMax", "ArgMin", "Range", "EyeLike"),
        *("RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"),
    }
)


def infer_without_data(model: ModelProto) -> onnx.GraphProto | None:
    """onnx's shape inference of ``model``, run on a copy without the initializers' data (their
    types and shapes declared as graph inputs): a model zoo graph's weights need not be
    serialised for it. None when onnx cannot infer the graph."""
    g = model.graph
    light = ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    light.graph.node.extend(g.node)
    light.graph.input.extend(g.input)
    light.graph.output.extend(g.output)
    light.graph.value_info.extend(g.value_info)
    declared = {i.name for i in g.input}
    light.graph.input.extend(
        helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
        for i in g.initializer
        if i.name not in declared
    )
    try:
        return onnx.shape_inference.infer_shapes(light, strict_mode=False).graph
    except Exception:  # a graph onnx cannot infer
        return None


def value_types(model: ModelProto) -> dict[str, int]:
    """The element type of every tensor value onnx declares or infers; values it cannot type
    (operators of domains it has no schema for) are left out.

    Inference runs on a copy without the initializers' data (their types and shapes stay as
    graph inputs): a model zoo graph's weights need not be serialised for it."""
    g = model.graph
    inferred = infer_without_data(model) or g
    types = {i.name: i.data_type for i in g.initializer}
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return types


def differentiable_ancestors(
    model: ModelProto, outputs: Iterable[str], types: Mapping[str, int] | None = None
) -> tuple[set[str], set[int]]:
    """Like :func:`ancestors`, along float values only: no gradient flows through an integer
    or bool value (ArgMax's indices, Greater's mask, a Shape), so a float initializer that
    reaches the outputs only through one (the threshold of a label, a classifier's classes) has
    none, and the operators past it (ai.onnx.ml's ArrayFeatureExtractor on a label path) need
    no gradient. Nor does it flow into the inputs of :data:`NO_GRADIENT_INPUTS` (a
    BatchNormalization's running mean, a Where's condition) or of :data:`NO_GRADIENT_OPS` (a
    comparison, a Range). A value of unknown type counts as float. ``types``:
    :func:`value_types`."""
    known = value_types(model) if types is None else types

    return _walk_back(model, outputs, lambda node, k, name: carries_gradient(node, k, name, known))


def carries_gradient(node: onnx.NodeProto | None, k: int | None, name: str, types: Mapping[str, int]) -> bool:
    """Whether a gradient flows along ``name``, input ``k`` of ``node`` (node None: a graph
    output; k None: a name a subgraph reads from the outer scope): a float value (or of unknown
    type), not into a comparison, a shape or an index (:data:`NO_GRADIENT_OPS`,
    :data:`NO_GRADIENT_INPUTS`). ``types``: :func:`value_types`."""
    if not name or types.get(name, TensorProto.FLOAT) not in FLOAT_TYPES:
        return False
    if node is None or k is None or node.domain not in ("", "ai.onnx"):
        return True
    if node.op_type in NO_GRADIENT_OPS:
        return False
    return k not in NO_GRADIENT_INPUTS.get(node.op_type, ())


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    # nested subgraphs included: a weight read two levels down is still a dependency
    return sorted(_reads(graph))


def float_initializers(model: ModelProto) -> dict[str, onnx.TensorProto]:
    """The float initializers of ``model`` by name: every weight it may train.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    dict of str to onnx.TensorProto
        The initializers of a float element type, in graph order.
    """
    return {i.name: i for i in model.graph.initializer if i.data_type in FLOAT_TYPES}


def nothing_to_train_error(model: ModelProto, output: str) -> ValueError:
    """The error for an ``output`` that depends on no float initializer. Operators of other
    domains (ai.onnx.ml's LinearRegressor...) hold their coefficients in attributes: name them
    (those on its float paths: the ArrayFeatureExtractor of a label path is not in the way).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    output : str
        The output that has nothing to train.

    Returns
    -------
    ValueError
        A :class:`~ort_train_core.GraphNotDifferentiableError` naming the operators in the
        way, or a plain ValueError; to raise.
    """
    _, needed = differentiable_ancestors(model, [output])
    blocking = [
        node
        for i, node in enumerate(model.graph.node)
        if i in needed and node.domain not in ("", "ai.onnx", "com.microsoft")
    ]
    if blocking:
        return GraphNotDifferentiableError(_blocking_message(blocking))
    sparse = sorted({s.values.name for s in model.graph.sparse_initializer} & ancestors(model, [output])[0])
    if sparse:
        why = _sparse_not_trained(sparse)
        return ValueError(f"output {output!r} depends on no dense float initializer: {why}")
    return ValueError(f"output {output!r} depends on no float initializer: there is nothing to train")


def _sparse_not_trained(names: Sequence[str]) -> str:
    return (
        f"{', '.join(map(repr, names))} are sparse initializers, which are not trained (onnxruntime "
        "updates dense tensors only); store them as dense initializers "
        "(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(sparse)...)) to train them"
    )


def default_weights_to_train(
    model: ModelProto, loss_name: str | Iterable[str], types: Mapping[str, int] | None = None
) -> list[str]:
    """The float initializers the loss (or any of several outputs) depends on through float
    values (those with a gradient: :func:`differentiable_ancestors`), in the graph's
    initializer order: the parameters. Exporter constants are left out (0-d scalars such as an
    attention mask's fill value, torch buffers, one-element constants folded by the dynamo
    exporter: :func:`exporter_constants`); name one in ``weights_to_train`` to train it.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    loss_name : str or iterable of str
        The output (or outputs) to differentiate.
    types : mapping of str to int, optional
        The element type of each value (:func:`value_types`), when the caller has it already.

    Returns
    -------
    list of str
        The initializer names.
    """
    names = [loss_name] if isinstance(loss_name, str) else loss_name
    deps, _ = differentiable_ancestors(model, names, types)
    constants = exporter_constants(model)
    weights = [name for name in float_initializers(model) if name in deps and name not in constants]
    sparse = sorted({s.values.name for s in model.graph.sparse_initializer} & deps)
    if sparse and weights:  # with no dense weight, nothing_to_train_error says it
        why = _sparse_not_trained(sparse)
        warnings.warn(f"only the dense weights train: {why}", UserWarning, stacklevel=2)
    return weights


def default_penalized_weights(model: ModelProto, weights: Iterable[str]) -> list[str]:
    """The weights a penalty applies to by default: those of rank >= 2 (matrices, kernels), not
    the biases and scales. A bias stored as a row, shape ``(1, ..., 1, K)`` and read only by
    ``Add`` or ``Sub`` (skl2onnx writes the intercepts of ``LogisticRegression`` and of the MLPs
    so), is a bias too.

    Parameters
    ----------
    model : onnx.ModelProto
        The model whose initializers hold the weights.
    weights : iterable of str
        The trained weights.

    Returns
    -------
    list of str
        Those of ``weights`` that are initializers of rank 2 or more and no bias row, in the
        order given.
    """
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)

    def bias_row(name: str) -> bool:
        shape = shapes[name]
        return all(d == 1 for d in shape[:-1]) and bool(readers.get(name)) and readers[name] <= {"Add", "Sub"}

    return [w for w in weights if len(shapes.get(w, ())) >= 2 and not bias_row(w)]


def check_weights(
    model: ModelProto, weights: Sequence[str], output: str, types: Mapping[str, int] | None = None
) -> None:
    """Every name is a float initializer that ``output`` depends on through float values."""
    if isinstance(weights, str):
        raise TypeError(f"weights_to_train must be a list of names, not the string {weights!r}")
    if len(set(weights)) != len(weights):
        raise ValueError(f"weights_to_train has duplicates: {list(weights)}")
    inits = {i.name: i for i in model.graph.initializer}
    deps, _ = differentiable_ancestors(model, [output], types)
    statistics = set(running_statistics(model))
    for name in weights:
        if name in statistics:
            raise ValueError(
                f"{name!r} is a BatchNormalization's running statistic: state that training updates "
                "with the node's momentum (as torch does), not a parameter; leave it out of "
                "weights_to_train"
            )
        if name not in inits and name in {s.values.name for s in model.graph.sparse_initializer}:
            raise ValueError(f"weight {name!r} cannot be trained: {_sparse_not_trained([name])}")
        if name not in inits:
            raise ValueError(
                f"weight {name!r} is not an initializer of the graph; initializers are {sorted(inits)}"
            )
        if inits[name].data_type not in FLOAT_TYPES:
            kind = TensorProto.DataType.Name(inits[name].data_type)
            raise ValueError(f"weight {name!r} is a {kind} tensor; only float tensors can be trained")
        if name in deps:
            continue
        if name in ancestors(model, [output])[0]:
            raise ValueError(
                f"output {output!r} depends on weight {name!r} only through values without a gradient "
                "(integer or bool values such as a comparison's, a BatchNormalization's statistics, a "
                "Clip's bounds): it has no gradient; leave it out of weights_to_train"
            )
        raise ValueError(f"output {output!r} does not depend on weight {name!r}: it has no gradient")


def check_differentiable(
    model: ModelProto, weights: Sequence[str], output: str, types: Mapping[str, int] | None = None
) -> None:
    """Raises naming each operator between the weights and ``output`` that has no gradient
    (on a path of float values: one past an integer or bool value needs none), and refuses
    16-bit float weights (TypeError)."""
    types = value_types(model) if types is None else types
    check_precision(weights, types)
    _, needed = differentiable_ancestors(model, [output], types)
    # values that depend on a weight
    reached = set(weights)
    blocking = []
    for idx, node in enumerate(model.graph.node):
        if not any(i in reached for i in node.input):
            continue
        reached.update(node.output)
        if idx in needed and node.domain not in ("", "ai.onnx", "com.microsoft"):
            blocking.append(node)
    if blocking:
        raise GraphNotDifferentiableError(_blocking_message(blocking))


#: element types the trainers update in place; 16-bit floats would need mixed precision (float32
#: master weights and loss scaling), which ort-train does not do yet
_HALF_TYPES: dict[int, str] = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}


def check_precision(weights: Sequence[str], types: Mapping[str, int]) -> None:
    """Refuses 16-bit float weights: plain SGD in float16 loses small updates to rounding and
    onnxruntime-training has half gradient kernels for few operators."""
    half = {w: _HALF_TYPES[types[w]] for w in weights if types.get(w) in _HALF_TYPES}
    if half:
        listed = ", ".join(f"{w!r} ({kind})" for w, kind in half.items())
        raise TypeError(
            f"weights {listed} are 16-bit floats: ort-train trains float32 and float64 graphs only "
            "(mixed precision is not supported yet); convert the graph to float32 (for example "
            "onnxconverter_common.float16.convert_float16_to_float32 or a float32 export), "
            "train it, then convert the trained graph back to float16"
        )


#: operators whose subgraphs onnxruntime-training's single-graph gradient builder cannot
#: differentiate: a weight read inside one is "not found" (GetIndexFromName), a gradient through
#: one aborts the process; its forward/backward builder (the partial loop) handles them
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def _reads(graph: onnx.GraphProto) -> set[str]:
    """Every name the nodes of a graph and of its nested subgraphs read."""
    names = {i for node in graph.node for i in node.input if i}
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                names |= _reads(sub)
    return names


def _node_reads(node: onnx.NodeProto) -> tuple[set[str], set[str]]:
    """The names a node reads as inputs, and those its subgraphs read."""
    subgraph_reads: set[str] = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            subgraph_reads |= _reads(sub)
    return {i for i in node.input if i}, subgraph_reads


def _reached_nodes(model: ModelProto, names: Iterable[str]) -> set[int]:
    """The indices of the nodes that read one of ``names`` or a value computed from one."""
    reached, found = set(names), set()
    for idx, node in enumerate(model.graph.node):
        reads, subgraph_reads = _node_reads(node)
        if (reads | subgraph_reads) & reached:
            reached.update(node.output)
            found.add(idx)
    return found


def _control_flow_nodes(
    model: ModelProto, weights: Sequence[str], needed: set[int]
) -> list[tuple[onnx.NodeProto, list[str]]]:
    """The control-flow nodes among ``needed`` that read a weight or a value computed from one,
    each with the weights it reads inside its subgraphs."""
    found = []
    for idx in sorted(_reached_nodes(model, weights) & needed):
        node = model.graph.node[idx]
        if node.domain in ("", "ai.onnx") and node.op_type in CONTROL_FLOW_OPS:
            found.append((node, sorted(_node_reads(node)[1] & set(weights))))
    return found


#: what to do about a weight whose gradient would cross a Loop, a Scan or a non-constant If
CONTROL_FLOW_FIXES = (
    "onnxruntime-training differentiates no Loop or Scan, and an If only when its condition is "
    "a constant (the branch is then inlined), on every route: the full and partial loops and "
    "OnnxModule alike. Leave those weights out of weights_to_train to keep them frozen, or export "
    "the model without the control flow: the TorchScript exporter (dynamo=False) traces Python "
    "branches and loops into plain operators, but torch.nn.EmbeddingBag exports a Loop with both "
    "exporters (nn.Embedding followed by a sum or mean over the bag axis exports Gather and "
    "ReduceSum/ReduceMean instead)"
)


def check_no_control_flow(
    model: ModelProto, weights: Sequence[str], output: str, types: Mapping[str, int] | None = None
) -> None:
    """Raises when a control-flow node (:data:`CONTROL_FLOW_OPS`) reads a weight, or a value
    computed from one, on the way to ``output``: the single-graph gradient builder fails there
    with raw C++ text or aborts the process, while the partial loop trains an If whose
    condition is a constant."""
    _, needed = differentiable_ancestors(model, [output], types)
    found = _control_flow_nodes(model, weights, needed)
    between = "lies between the weights and the loss"
    blocking = [
        f"node {node.name or node.output[0]!r} ({node.op_type}) "
        + (f"reads weight(s) {inside} inside its subgraphs" if inside else between)
        for node, inside in found
    ]
    if not blocking:
        return
    fix = (
        "its forward/backward builder inlines an If whose condition is a constant: train this graph "
        "with the partial loop (OrtGradientForwardBackwardOptimizer, training='partial' in the "
        "scikit-learn estimators, or OnnxModule), or leave those weights out of weights_to_train"
        if any(node.op_type == "If" for node, _ in found)
        else CONTROL_FLOW_FIXES
    )
    raise GraphNotDifferentiableError(
        f"the fused training loop cannot differentiate through control flow: {'; '.join(blocking)}. "
        f"onnxruntime-training's single-graph gradient builder has no gradient for If/Loop/Scan "
        f"subgraphs; {fix}"
    )


def control_flow_weights(
    model: ModelProto, weights: Sequence[str], types: Mapping[str, int] | None = None
) -> dict[str, str]:
    """The weights whose gradient would cross a control-flow node on the way to the outputs,
    each with that node described (for :func:`control_flow_error`).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    weights : sequence of str
        The weights to train.
    types : mapping of str to int, optional
        :func:`value_types` of ``model``, when the caller has them.

    Returns
    -------
    dict of str to str
        Weight -> ``"node 'name' (Loop)"``, with where it reads the weight; empty when none.
    """
    _, needed = differentiable_ancestors(model, [o.name for o in model.graph.output], types)
    out: dict[str, str] = {}
    for node, inside in _control_flow_nodes(model, weights, needed):
        where = " (read inside its subgraphs)" if inside else ""
        through = inside or sorted(set(weights) & ancestors(model, list(node.output))[0])
        for w in through:
            out.setdefault(w, f"node {node.name or node.output[0]!r} ({node.op_type}){where}")
    return out


def control_flow_error(found: Mapping[str, str], who: str) -> GraphNotDifferentiableError:
    """The refusal for the weights :func:`control_flow_weights` found, naming each weight, its
    node and the alternatives.

    Parameters
    ----------
    found : mapping of str to str
        What :func:`control_flow_weights` returned (not empty).
    who : str
        What cannot be built, at the start of the message.

    Returns
    -------
    GraphNotDifferentiableError
        The error to raise; its ``.weight`` is None, as it is no weight to leave out quietly.
    """
    nodes: dict[str, list[str]] = {}
    for weight, node in found.items():
        nodes.setdefault(node, []).append(weight)
    listed = "; ".join(f"weight(s) {weights} through {node}" for node, weights in nodes.items())
    return GraphNotDifferentiableError(
        f"{who}: the gradient cannot cross control flow: {listed}. {CONTROL_FLOW_FIXES}"
    )


def cut_frozen_control_flow(model: ModelProto, differentiated: Sequence[str]) -> ModelProto:
    """``model``, or a copy where each float output of a control-flow node that no value of
    ``differentiated`` reaches passes through ``SequenceAt(SequenceConstruct(.), 0)``: the same
    values, but the gradient builders stop there. onnxruntime-training's builders abort the
    process (a C++ assertion) on a Loop whose float output reaches the loss even when nothing
    behind it is trained (a frozen TorchScript EmbeddingBag); they stop at sequence operators,
    which have no gradient, as on the dynamo export's Loop.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    differentiated : sequence of str
        The weights and inputs whose gradient is wanted.

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when there is nothing to cut.
    """
    nodes = model.graph.node
    flow = {k for k, n in enumerate(nodes) if n.op_type in CONTROL_FLOW_OPS and n.domain in ("", "ai.onnx")}
    frozen = flow - _reached_nodes(model, differentiated)
    if not frozen or _opset(model) < 11:
        return model
    types = value_types(model)
    cuts = {o for k in frozen for o in nodes[k].output if types.get(o) in FLOAT_TYPES}
    if not cuts:
        return model
    out = _copy(model)
    taken = all_names(model)
    zero = unique_name("cut_index", taken)
    out.graph.initializer.append(numpy_helper.from_array(np.array(0, dtype=np.int64), zero))
    del out.graph.node[:]
    for original in nodes:
        node = out.graph.node.add()
        node.CopyFrom(original)
        for j, name in enumerate(original.output):
            if name in cuts:
                inner, seq = unique_name(f"{name}_cf", taken), unique_name(f"{name}_seq", taken)
                node.output[j] = inner
                out.graph.node.append(helper.make_node("SequenceConstruct", [inner], [seq]))
                out.graph.node.append(helper.make_node("SequenceAt", [seq, zero], [name]))
    return out


def _blocking_message(nodes: Sequence[onnx.NodeProto]) -> str:
    parts = []
    for node in nodes:
        hint = _BLOCKING_HINTS.get((node.domain, node.op_type))
        desc = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        parts.append(f"operator {desc} (node {node.name!r}) has no gradient" + (f": {hint}" if hint else ""))
    return "the gradient graph cannot be built; " + "; ".join(parts)


def initializers_to_inputs(model: ModelProto, names: Sequence[str]) -> ModelProto:
    """A copy where the named initializers are graph inputs (in the given order), so that they
    can be fed and differentiated.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.
    names : sequence of str
        Initializers of ``model``.

    Returns
    -------
    onnx.ModelProto
        The copy, without those initializers and with one input each.
    """
    model = _copy(model)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    moved = set(names)  # built once: per initializer it was quadratic (20k weights: minutes)
    keep = [i for i in g.initializer if i.name not in moved]
    del g.initializer[:]
    g.initializer.extend(keep)
    existing = {i.name for i in g.input}
    for name in names:
        if name not in existing:
            t = inits[name]
            g.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    return model


def inputs_to_initializers(model: ModelProto, values: Mapping[str, np.ndarray]) -> ModelProto:
    """A copy where the named inputs (or initializers) become initializers holding ``values``.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.
    values : mapping of str to ndarray
        The value of each input or initializer to set.

    Returns
    -------
    onnx.ModelProto
        The copy, those names being initializers only.
    """
    model = _copy(model)
    g = model.graph
    keep_inputs = [i for i in g.input if i.name not in values]
    del g.input[:]
    g.input.extend(keep_inputs)
    keep_inits = [i for i in g.initializer if i.name not in values]
    del g.initializer[:]
    g.initializer.extend(keep_inits)
    for name, arr in values.items():
        g.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
    return model


def initializer_values(model: ModelProto, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The values of the named initializers, as numpy arrays the caller owns.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    names : sequence of str
        Initializers of ``model``.

    Returns
    -------
    dict of str to ndarray
        A copy of each value, in the order of ``names``.
    """
    inits = {i.name: i for i in model.graph.initializer}
    return {n: numpy_helper.to_array(inits[n]).copy() for n in names}


def without_penalty(model: ModelProto, loss_name: str) -> ModelProto:
    """``model`` whose loss output is the loss without the penalty :func:`add_loss_output`
    added (``model`` itself when it has none): what a score measures.

    Parameters
    ----------
    model : onnx.ModelProto
        A graph made by :func:`add_loss_output` (or any graph: without its metadata, unchanged).
    loss_name : str
        Its loss output.

    Returns
    -------
    onnx.ModelProto
        A copy with the loss output read from the unpenalised loss (the penalty's nodes stay,
        unused; onnxruntime drops them), or ``model``.
    """
    data_loss = get_metadata(model, "data_loss_name")
    if data_loss is None:
        return model
    out = copy.deepcopy(model)
    for node in out.graph.node:
        if loss_name in node.output:
            del node.output[:]
            # the penalised total stays computed under another name; the loss is the data loss
            node.output.append(unique_name(f"{loss_name}_penalised", all_names(out)))
            break
    name = unique_name(f"{loss_name}_unpenalised", {n.name for n in out.graph.node})
    out.graph.node.append(helper.make_node("Identity", [data_loss], [loss_name], name=name))
    return out


def rename_value(model: ModelProto, old: str, new: str) -> None:
    """Renames the value ``old`` to ``new`` in place, everywhere it appears: the nodes of the
    graph and of its subgraphs (which may read it from the outer scope), the graph's inputs,
    outputs, initializers and shapes.

    Parameters
    ----------
    model : onnx.ModelProto
        The model, modified.
    old, new : str
        The names; ``new`` must not name another value (the caller checks).
    """
    _rename_in(model.graph, old, new)


def _rename_in(g: onnx.GraphProto, old: str, new: str) -> None:
    for node in g.node:
        if old in node.input:
            node.input[:] = [new if x == old else x for x in node.input]
        if old in node.output:
            node.output[:] = [new if x == old else x for x in node.output]
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                _rename_in(sub, old, new)
    for v in [*g.input, *g.output, *g.value_info, *g.initializer]:
        if v.name == old:
            v.name = new


def prune_to_outputs(model: ModelProto, outputs: Sequence[str]) -> ModelProto:
    """A copy that keeps only the given outputs and what they need (nodes, inputs, initializers).

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.
    outputs : sequence of str
        Outputs of ``model`` to keep, in this order.

    Returns
    -------
    onnx.ModelProto
        The pruned copy.
    """
    model = _copy(model)
    g = model.graph
    deps, nodes = ancestors(model, outputs)
    kept_nodes = [n for i, n in enumerate(g.node) if i in nodes]
    out_map = {o.name: o for o in g.output}
    kept_outputs = [out_map[o] for o in outputs]
    kept_inputs = [i for i in g.input if i.name in deps]
    kept_inits = [i for i in g.initializer if i.name in deps]
    kept_vi = [v for v in g.value_info if v.name in deps]
    del g.node[:], g.output[:], g.input[:], g.initializer[:], g.value_info[:]
    g.node.extend(kept_nodes)
    g.output.extend(kept_outputs)
    g.input.extend(kept_inputs)
    g.initializer.extend(kept_inits)
    g.value_info.extend(kept_vi)
    return model


def prediction_graph(loss_model: ModelProto, loss_name: str) -> ModelProto:
    """The prediction graph inside a loss graph: its original outputs, no label or weight input.

    Parameters
    ----------
    loss_model : onnx.ModelProto
        A graph made by :func:`add_loss_output` (or any graph with a loss output).
    loss_name : str
        Its loss output, dropped when the metadata does not list the prediction outputs.

    Returns
    -------
    onnx.ModelProto
        The pruned copy, without ort-train's metadata.
    """
    outputs = get_metadata(loss_model, "prediction_outputs")
    if outputs is None:
        outputs = [o.name for o in loss_model.graph.output if o.name != loss_name]
    model = prune_to_outputs(loss_model, outputs)
    kept = [p for p in model.metadata_props if not p.key.startswith(META_PREFIX)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model


def set_batch_dimension(model: ModelProto, names: Iterable[str], batch: int | None) -> ModelProto:
    """A copy where the first dimension of the named inputs is fixed (or symbolic when None).

    A fixed batch dimension lets the gradient builder drop its run-time shape arithmetic.
    """
    model = _copy(model)
    wanted = set(names)
    for vi in model.graph.input:
        if vi.name in wanted and vi.type.tensor_type.shape.dim:
            dim = vi.type.tensor_type.shape.dim[0]
            if batch is None:
                dim.dim_param = "N"
            else:
                dim.dim_value = batch
    # stale intermediate shapes would contradict the fixed ones
    del model.graph.value_info[:]
    return model
