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
- prediction (the exported graph, ``OnnxModule.eval()``) normalises with them: the nodes are
  written in inference form (``training_mode=0``, one output).

The update is written here with standard operators, beside the node (:func:`with_updates`):
the same graph serves every route and any runtime. No gradient flows through it: the batch
statistics cross an int64 round trip (:func:`_without_gradient`), so the forward/backward pair
has no backward to build for the updated statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import ModelProto, helper

from ._builder import NodeBuilder

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
    types = {i.name: i.type.tensor_type.elem_type for i in out.graph.input}
    types.update((i.name, i.data_type) for i in out.graph.initializer)
    dims = {
        i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in out.graph.input
    }
    dims.update((i.name, list(i.dims)) for i in out.graph.initializer)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 17)
    updates: dict[str, str] = {}
    outputs = []
    first: list[onnx.NodeProto] = []  # the constants the nodes read, before every node
    last: list[onnx.NodeProto] = []  # the updates, after every node
    b = NodeBuilder(onnx.TensorProto.FLOAT, opset, all_names(out), prefix="bn_stats_")
    for node in out.graph.node:
        if not _is_batch_norm(node) or not set(node.input[3:5]) & wanted:
            continue
        _training_mode(node, b)
        x, mean, var = node.input[0], node.input[3], node.input[4]
        b.elem_type = types.get(mean, onnx.TensorProto.FLOAT)
        b.np_dtype = helper.tensor_dtype_to_np_dtype(b.elem_type)
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
    text = next((p.value for p in model.metadata_props if p.key == UPDATES_KEY), "")
    return dict(pair.split("=", 1) for pair in text.split(";") if pair)


def inference_form(model: ModelProto) -> ModelProto:
    """``model`` with its training-mode BatchNormalization nodes normalising with their running
    statistics, as torch's ``eval()`` does: ``training_mode`` 0, the optional outputs dropped
    where nothing reads them. Returns ``model`` itself when it has none.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    onnx.ModelProto
        A copy in inference form, or ``model``.
    """
    if not any(_is_training(n) for n in model.graph.node):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    read = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    for node in out.graph.node:
        if not _is_training(node):
            continue
        kept = [a for a in node.attribute if a.name != "training_mode"]
        del node.attribute[:]
        node.attribute.extend(kept)
        if not any(o in read for o in node.output[1:]):
            del node.output[1:]
    return out
