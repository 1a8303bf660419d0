"""BatchNormalization's running statistics: state, not parameters (issue 17, items 2 and 3).

A BatchNormalization node is torch's BatchNorm layer: its ``input_mean`` and ``input_var``
initializers are torch's running statistics. They get no gradient and are never trained. As in
torch, whatever mode the node was exported in (``training_mode=1`` from torch's TorchScript
exporter with ``training=TrainingMode.TRAINING``; 0 from an eval-mode export without constant
folding, which onnxruntime's module graph builder trains with batch statistics too):

- a training step normalises with the statistics of the batch, and updates the running ones
  with the node's momentum (ONNX's momentum is ``1 -`` torch's):
  ``running = momentum * running + (1 - momentum) * batch_statistic``, the variance being the
  unbiased one (``n / (n - 1)`` times the mean of squared deviations, ``n`` the values per
  channel), as torch keeps it (onnxruntime's ``BatchNormInternal`` keeps the biased one);
- prediction (the exported graph, ``OnnxModule.eval()``, the validation loss) normalises with
  them: the nodes are written in inference form (``training_mode=0``, one output), and so are
  the Dropout nodes of a training-mode export (the identity, as in torch's ``eval()``), by the one
  function every prediction route calls (:func:`inference_form`);
- a training batch leaving a node a single value per channel is refused before any step, as
  torch refuses it (:func:`check_training_batches`, :func:`single_value_channels`): its unbiased
  variance divides by zero.

The update is written here with standard operators, beside the node (:func:`with_updates`):
the same graph serves every route and any runtime. No gradient flows through it: the batch
statistics cross an int64 round trip (:func:`_without_gradient`), so the forward/backward pair
has no backward to build for the updated statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper

from ._builder import NodeBuilder, unique_name
from ._metadata import read_updates

#: the model metadata key under which :func:`with_updates` records the update outputs
UPDATES_KEY = "ort_train.running_statistics"


def _is_batch_norm(node: onnx.NodeProto) -> bool:
    return node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") and len(node.input) == 5


def _is_training(node: onnx.NodeProto) -> bool:
    return _is_batch_norm(node) and any(a.name == "training_mode" and a.i == 1 for a in node.attribute)


def running_statistics(model: ModelProto) -> list[str]:
    """The running means and variances (initializers) of the graph's BatchNormalization nodes,
    in node order, mean before variance.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    list of str
        The initializer names (none twice).
    """
    # a statistic fed as a graph input is the caller's to update
    inits = {i.name for i in model.graph.initializer}
    out: list[str] = []
    for node in model.graph.node:
        if _is_batch_norm(node):
            out.extend(n for n in node.input[3:5] if n in inits and n not in out)
    return out


def with_updates(model: ModelProto, statistics: Sequence[str]) -> tuple[ModelProto, dict[str, str]]:
    """A copy of ``model`` that also outputs the updated value of each running statistic of
    ``statistics`` (graph inputs or initializers) after one training step on the batch it is fed;
    their BatchNormalization nodes are set in training mode (batch statistics).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    statistics : sequence of str
        Running statistics (:func:`running_statistics`) to update.

    Returns
    -------
    (onnx.ModelProto, dict of str to str)
        The copy (the new outputs last, recorded in its metadata under :data:`UPDATES_KEY`) and
        the output of each statistic.
    """
    from .graph import all_names  # graph builds on this module

    wanted = set(statistics)
    if not wanted:
        return model, {}
    out = ModelProto()
    out.CopyFrom(model)
    types, dims = _types_and_dims(out)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 17)
    updates: dict[str, str] = {}
    outputs = []
    first: list[onnx.NodeProto] = []  # the constants the nodes read, before every node
    last: list[onnx.NodeProto] = []  # the updates, after every node
    b = NodeBuilder(onnx.TensorProto.FLOAT, opset, all_names(out), prefix="bn_stats_")
    for node in out.graph.node:
        if not _is_batch_norm(node) or not set(node.input[3:5]) & wanted:
            continue
        mean, var = node.input[3], node.input[4]
        b.elem_type = types.get(mean, onnx.TensorProto.FLOAT)
        b.np_dtype = helper.tensor_dtype_to_np_dtype(b.elem_type)
        new_mean, new_var = _updating_node(node, b, first, last)
        for name, new in ((mean, new_mean), (var, new_var)):
            if name in wanted and name not in updates:
                updates[name] = new
                outputs.append(helper.make_tensor_value_info(new, b.elem_type, dims.get(name)))
    nodes = [*first, *out.graph.node, *last]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.output.extend(outputs)
    out.metadata_props.add(key=UPDATES_KEY, value=";".join(f"{k}={v}" for k, v in updates.items()))
    return out, updates


def _types_and_dims(model: ModelProto) -> tuple[dict[str, int], dict[str, list[Any]]]:
    """The element type and the dimensions of each graph input and initializer."""
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    types.update((i.name, i.data_type) for i in model.graph.initializer)
    dims: dict[str, list[Any]] = {
        i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input
    }
    dims.update((i.name, list(i.dims)) for i in model.graph.initializer)
    return types, dims


def _updating_node(
    node: onnx.NodeProto, b: NodeBuilder, first: list[onnx.NodeProto], last: list[onnx.NodeProto]
) -> tuple[str, str]:
    """Sets the BatchNormalization ``node`` in training mode (in place) and builds the updated
    running mean and variance: the constants it reads go to ``first``, the update nodes to
    ``last``; returns the names of the updated mean and variance."""
    _training_mode(node, b)
    x, mean, var = node.input[0], node.input[3], node.input[4]
    # onnxruntime's training-mode kernels write their running statistics over their mean and
    # variance inputs (in place, constants and graph inputs included), which the update reads
    # (and onnxruntime shares a constant among the nodes that read equal ones): the node gets
    # zeros made at each run, which no other node reads (Y does not depend on them then)
    node.input[3] = b.op("Sub", [mean, mean], "unread_mean")
    node.input[4] = b.op("Sub", [var, var], "unread_var")
    first.extend(b.nodes)
    b.nodes = []
    momentum = next((a.f for a in node.attribute if a.name == "momentum"), 0.9)
    new_mean, new_var = _update_nodes(b, x, mean, var, momentum)
    last.extend(b.nodes)
    b.nodes = []
    return new_mean, new_var


def _training_mode(node: onnx.NodeProto, b: NodeBuilder) -> None:
    """Sets ``node`` (in place) in training mode, with the three outputs that mode requires."""
    kept = [a for a in node.attribute if a.name != "training_mode"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])
    while len(node.output) < 3:
        node.output.append(b.name("unread_running_statistic"))
    node.output[1:] = [o or b.name("unread_running_statistic") for o in node.output[1:]]


def _update_nodes(b: NodeBuilder, x: str, mean: str, var: str, momentum: float) -> tuple[str, str]:
    """The nodes of torch's update of one node's running mean and variance from its input x
    [N, C, ...]: statistics over every axis but the channel's, unbiased variance."""
    # the axes but 1, for the rank of x known at run time: Range(0, rank) without 1
    rank = b.op("Size", [b.op("Shape", [x], "x_shape")], "x_rank")
    zero, one = b.const(0, "zero", dtype="int64"), b.const(1, "one", dtype="int64")
    axes = b.op("Range", [zero, rank, one], "axes")
    axes = b.op("Compress", [axes, b.op("Not", [b.op("Equal", [axes, one])])], "stat_axes", axis=0)
    reduce_attrs = {"keepdims": 1}
    batch_mean = _mean(b, x, axes, reduce_attrs, "batch_mean")
    deviation = b.op("Sub", [x, batch_mean], "deviation")
    squares = b.op("Mul", [deviation, deviation], "squares")
    biased = _mean(b, squares, axes, reduce_attrs, "biased_var")
    # n values per channel: Size(x) / C, the correction n / (n - 1) in the statistics' type
    channels = b.op("Gather", [b.op("Shape", [x]), one], "channels", axis=0)
    count = b.cast(b.op("Div", [b.op("Size", [x]), channels], "count_int"), hint="count")
    correction = b.op("Div", [count, b.op("Sub", [count, b.const(1.0, "one_f")])], "correction")
    unbiased = b.op("Mul", [biased, correction], "unbiased_var")
    flat = b.int_const([-1], "flat")
    keep, take = b.const(momentum, "momentum"), b.const(1.0 - momentum, "one_minus_momentum")
    news = []
    for old, batch, hint in ((mean, batch_mean, "running_mean"), (var, unbiased, "running_var")):
        batch = _without_gradient(b, b.op("Reshape", [batch, flat], f"batch_{hint}"), hint)
        news.append(b.op("Add", [b.op("Mul", [old, keep]), b.op("Mul", [batch, take])], f"{hint}_new"))
    return news[0], news[1]


#: the batch statistics cross int64 as multiples of 2**-32 (see :func:`_without_gradient`)
_FIXED_POINT = 2.0**32


def _without_gradient(b: NodeBuilder, value: str, hint: str) -> str:
    """``value`` through an int64 round trip in multiples of 2**-32: onnxruntime differentiates
    no integer value, so the updated statistics are outputs without gradient and the backward
    of the forward/backward pair does not carry the statistics' computation (about a sixth of
    a small CNN's step). Exact for values of magnitude 2**-9 to 2**31, within 2**-32 below."""
    scale = b.const(_FIXED_POINT, "fixed_point")
    fixed = b.op(
        "Cast", [b.op("Mul", [value, scale], f"{hint}_scaled")], f"{hint}_fixed", to=onnx.TensorProto.INT64
    )
    return b.op("Div", [b.cast(fixed, hint=f"{hint}_float"), scale], f"{hint}_stopped")


def _mean(b: NodeBuilder, x: str, axes: str, attrs: dict[str, int], hint: str) -> str:
    """ReduceMean over run-time axes: an input from opset 18, else ReduceSum (axes an input
    from opset 13) divided by the count of values reduced."""
    if b.opset >= 18:
        return b.op("ReduceMean", [x, axes], hint, **attrs)
    total = b.op("ReduceSum", [x, axes], f"{hint}_sum", **attrs)
    count = b.cast(b.op("Div", [b.op("Size", [x]), b.op("Size", [total])], f"{hint}_count_int"))
    return b.op("Div", [total, count], hint)


def update_outputs(model: ModelProto) -> dict[str, str]:
    """The running statistic -> update output pairs :func:`with_updates` recorded in the
    model's metadata (empty for a model without them).

    Parameters
    ----------
    model : onnx.ModelProto
        A model :func:`with_updates` made, or a graph built from one that kept its metadata.

    Returns
    -------
    dict of str to str
        The output of each statistic.
    """
    return read_updates(model, UPDATES_KEY)  # checked: the model file may be forged


def _is_training_dropout(node: onnx.NodeProto) -> bool:
    """A Dropout (opset 12 on) given a ``training_mode`` input: absent or empty, it is the
    identity already."""
    return (
        node.op_type == "Dropout"
        and node.domain in ("", "ai.onnx")
        and len(node.input) > 2
        and bool(node.input[2])
    )


def inference_form(model: ModelProto) -> ModelProto:
    """``model`` as torch's ``eval()`` runs it, for every prediction (the trained graph, the
    validation loss, inference sessions): its training-mode BatchNormalization nodes normalise
    with their running statistics (``training_mode`` 0, the optional outputs dropped where
    nothing reads them), and its Dropout nodes with a ``training_mode`` input are the identity
    (that input dropped: ONNX's Dropout then gives ``Y = X`` and, to a reader of its optional
    ``mask`` output, a mask of ones). Returns ``model`` itself when it has neither.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    onnx.ModelProto
        A copy in inference form, or ``model``.
    """
    if not any(_is_training(n) or _is_training_dropout(n) for n in model.graph.node):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    dropped: set[str] = set()
    for node in g.node:
        if _is_training_dropout(node):
            # whatever feeds training_mode (a constant true, a graph input), absent means false
            dropped.add(node.input[2])
            del node.input[2:]
            if not node.input[1]:  # no ratio either: no trailing empty optional input
                del node.input[1:]
            continue
        if not _is_training(node):
            continue
        kept = [a for a in node.attribute if a.name != "training_mode"]
        del node.attribute[:]
        node.attribute.extend(kept)
        if not any(o in read for o in node.output[1:]):
            del node.output[1:]
    _drop_unread_constants(out, dropped)
    return out


def _drop_unread_constants(model: ModelProto, names: set[str]) -> None:
    """Removes (in place) the initializers and Constant nodes of ``names`` that nothing reads
    any more (onnxruntime warns of an unused initializer); a graph input stays."""
    g = model.graph
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    unread = names - read
    if not unread:
        return
    kept_inits = [i for i in g.initializer if i.name not in unread]
    gone = {i.name for i in g.initializer} - {i.name for i in kept_inits}
    kept_inputs = [i for i in g.input if i.name not in gone]
    kept_nodes = [n for n in g.node if not (n.op_type == "Constant" and set(n.output) <= unread)]
    for field, kept in ((g.initializer, kept_inits), (g.input, kept_inputs), (g.node, kept_nodes)):
        if len(kept) != len(field):
            del field[:]
            field.extend(kept)


# ---- a batch BatchNormalization cannot normalise ---------------------------------------------

#: what torch says of a training batch leaving one value per channel
_TORCH_REFUSES = "torch's BatchNorm raises 'Expected more than 1 value per channel when training'"

#: initializers of at most this many values stay in the copy that shape inference reads (shape
#: and axes tensors, which data propagation needs); the larger ones go in as typed inputs
_SMALL_INITIALIZER = 64


def training_batch_norms(model: ModelProto, statistics: Sequence[str]) -> list[onnx.NodeProto]:
    """The BatchNormalization nodes that normalise with the batch's statistics in a training
    step: those exported in training mode, and those whose running statistics the step updates
    (:func:`with_updates` sets them in training mode).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    statistics : sequence of str
        The running statistics the training steps update.

    Returns
    -------
    list of onnx.NodeProto
        The nodes, in graph order.
    """
    wanted = set(statistics)
    return [
        n
        for n in model.graph.node
        if _is_batch_norm(n) and (_is_training(n) or bool(set(n.input[3:5]) & wanted))
    ]


def single_value_channels(
    model: ModelProto,
    statistics: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    feeds: Callable[[], Mapping[str, np.ndarray]] | None = None,
) -> list[str]:
    """The training-mode BatchNormalization nodes (:func:`training_batch_norms`) that a
    training step fed inputs of ``shapes`` would normalise over a single value per channel,
    which torch refuses: their input X [N, C, ...] has ``N * prod(spatial dims) == 1``.

    A batch variance of one value is 0 and its unbiased running update divides by ``n - 1 = 0``:
    onnxruntime writes a huge negative running variance, and later predictions are NaN.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (trained weights and running statistics as initializers or inputs).
    statistics : sequence of str
        The running statistics the training steps update.
    shapes : mapping of str to sequence of int
        The shape of each graph input of the step.
    feeds : callable or None, default=None
        Gives the inputs as arrays (of ``shapes``), to run the graph up to the nodes when ONNX
        shape inference cannot tell their input shapes; None: such nodes are not reported.

    Returns
    -------
    list of str
        Each such node, named with its input's shape (empty when there is none).
    """
    nodes = training_batch_norms(model, statistics)
    if not nodes:
        return []
    xs = list(dict.fromkeys(n.input[0] for n in nodes))
    found = _inferred_shapes(model, shapes, xs)
    unknown = [x for x in xs if found[x] is None]
    if unknown and feeds is not None:
        found.update(_probed_shapes(model, unknown, feeds))
    out = []
    for node in nodes:
        shape = found.get(node.input[0])
        if shape is not None and len(shape) >= 2 and shape[0] * math.prod(shape[2:]) == 1:
            out.append(f"{node.name or node.input[0]!r} (input {list(shape)})")
    return out


def _inferred_shapes(
    model: ModelProto, shapes: Mapping[str, Sequence[int]], names: Sequence[str]
) -> dict[str, tuple[int, ...] | None]:
    """The static shape of each value of ``names`` (None where unknown) by ONNX shape inference,
    the graph inputs set to ``shapes``."""
    light = ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.node.extend(model.graph.node)
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in shapes:
            elem = vi.type.tensor_type.elem_type
            g.input.append(helper.make_tensor_value_info(vi.name, elem, list(shapes[vi.name])))
        elif vi.name not in inits:
            g.input.append(vi)
    # the weights' values are not needed, only their shapes: a large model is not copied
    for init in model.graph.initializer:
        if math.prod(init.dims) <= _SMALL_INITIALIZER:
            g.initializer.append(init)
        else:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    g.output.extend(model.graph.output)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # onnx's inference errors have no common base class: shapes unknown
        return dict.fromkeys(names)
    known: dict[str, tuple[int, ...]] = {}
    ig = inferred.graph
    for vi in [*ig.input, *ig.value_info, *ig.output]:
        tt = vi.type.tensor_type
        known_dims = tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)
        if vi.type.HasField("tensor_type") and known_dims:
            known[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    return {n: known.get(n) for n in names}


def _probed_shapes(
    model: ModelProto, names: Sequence[str], feeds: Callable[[], Mapping[str, np.ndarray]]
) -> dict[str, tuple[int, ...] | None]:
    """The shape of each value of ``names`` in a run of the graph on ``feeds()`` (onnxruntime,
    CPU), only the nodes they depend on; None for all when it cannot run."""
    from .graph import all_names, prune_to_outputs  # graph builds on this module

    work = ModelProto()
    work.CopyFrom(model)
    taken = all_names(work)
    outputs = []
    for x in names:
        out = unique_name(f"{x}_shape", taken)
        work.graph.node.append(helper.make_node("Shape", [x], [out]))
        work.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.INT64, [None]))
        outputs.append(out)
    try:
        import onnxruntime

        work = inference_form(prune_to_outputs(work, outputs))
        inits = {i.name for i in work.graph.initializer}
        values = feeds()
        needed = {i.name: values[i.name] for i in work.graph.input if i.name not in inits}
        session = onnxruntime.InferenceSession(work.SerializeToString(), providers=["CPUExecutionProvider"])
        got = session.run(outputs, needed)
    except Exception:  # a graph the CPU cannot run here: the shapes stay unknown
        return dict.fromkeys(names)
    return {x: tuple(int(d) for d in np.asarray(v)) for x, v in zip(names, got)}


def check_training_batches(
    model: ModelProto,
    statistics: Sequence[str],
    features: Mapping[str, Any],
    batch_size: int,
) -> None:
    """Refuses, before any step, a fit whose batches would leave a training-mode
    BatchNormalization node a single value per channel (:func:`single_value_channels`), as
    torch does: a batch of 1 row, when the node's input has no spatial size to make up for it.

    Parameters
    ----------
    model : onnx.ModelProto
        The loss graph the steps run.
    statistics : sequence of str
        The running statistics the steps update.
    features : mapping of str to array-like
        The training arrays of the graph's feature inputs (rows first; scipy.sparse allowed).
    batch_size : int
        The fit's batch size: batches of ``batch_size`` rows, the last one of the rest.

    Raises
    ------
    ValueError
        When some batch would normalise a single value per channel, with the batch sizes
        that fix it.
    """
    if not features:
        return
    n_rows = int(next(iter(features.values())).shape[0])
    # a batch of 2 rows or more gives every node at least 2 values per channel (its input keeps
    # the batch's rows first, as torch's BatchNorm layers see them): only a 1-row batch is checked
    # (tested before the scan of the graph's nodes, which took 15 us of each partial_fit call)
    if min(batch_size, n_rows) != 1 and n_rows % batch_size != 1:
        return
    if not training_batch_norms(model, statistics):
        return
    from ._data import dense_rows

    shapes = {name: (1, *a.shape[1:]) for name, a in features.items()}
    bad = single_value_channels(
        model, statistics, shapes, lambda: {name: dense_rows(a, slice(0, 1)) for name, a in features.items()}
    )
    if not bad:
        return
    if n_rows == 1:
        why, fix = "the training data has a single row", "train on 2 rows or more"
    elif batch_size == 1:
        why, fix = "batch_size=1 gives batches of 1 row", "choose a batch_size of 2 or more"
    else:
        why = f"batch_size={batch_size} leaves a last batch of 1 row ({n_rows} rows)"
        sizes = _batch_sizes_without_one_row(n_rows, batch_size)
        fix = f"choose a batch_size that leaves no 1-row batch ({sizes}), or train on one row fewer or more"
    raise ValueError(
        f"{why}: BatchNormalization in training mode needs more than 1 value per channel, and node "
        f"{', '.join(bad)} would normalise a single one ({_TORCH_REFUSES}; onnxruntime would write a "
        f"negative running variance); {fix}"
    )


def _batch_sizes_without_one_row(n_rows: int, batch_size: int) -> str:
    """The nearest batch sizes below and above ``batch_size`` that leave no 1-row batch."""
    below = next((b for b in range(batch_size - 1, 1, -1) if n_rows % b != 1), None)
    above = next((b for b in range(batch_size + 1, n_rows + 1) if n_rows % b != 1), None)
    found = [str(b) for b in (below, above) if b is not None]
    return "e.g. " + " or ".join(found) if found else f"e.g. {n_rows}"


def single_row_forward_error(bad: Sequence[str], shapes: Mapping[str, Sequence[int]]) -> ValueError:
    """The error of a training forward that :func:`single_value_channels` found ``bad``.

    Parameters
    ----------
    bad : sequence of str
        The nodes, as :func:`single_value_channels` names them.
    shapes : mapping of str to sequence of int
        The shape of each input fed.

    Returns
    -------
    ValueError
        The error to raise.
    """
    fed = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    return ValueError(
        f"a training forward of {fed}: BatchNormalization in training mode needs more than 1 value "
        f"per channel, and node {', '.join(bad)} would normalise a single one ({_TORCH_REFUSES}; "
        "onnxruntime would write a negative running variance); feed 2 rows or more, or run this "
        "batch in inference (forward(..., training=False) or OnnxModule.eval())"
    )
