"""Rewrites of the forms whose gradient onnxruntime-training 1.19.2 gets wrong, applied to a
graph just before either gradient builder sees it (:func:`rewrite_for_gradient`).

Each rewrite computes the same values (AveragePool's up to float rounding) with operators
whose gradients are right. They only
change the graph handed to the gradient builder: the user's graph, its weight names and
shapes (``get_state``, ``get_trained_onnx``, OnnxModule's parameters) stay as they were, and
the gradient of a weight comes out in the weight's own shape. The gradient oracle suite
(tests/core/test_gradient_oracle.py, tests/torch_adapter/test_torch_gradient_oracle.py)
checks every route against torch autograd and finite differences; what it found wrong is
listed here:

* ``MatMul`` with a rank-1 operand: onnxruntime's gradient of a 1-D ``W`` in ``X[N, K] @
  W[K]`` is ``X.reshape(K, N).sum(1)`` instead of ``X.sum(0)`` (silently wrong), and the
  other rank-1 forms fail at run time in a Reshape. The 1-D operand is made 2-D
  (``Unsqueeze``), multiplied, and the added axis squeezed out of the product.
* ``Gemm`` with a 0-d ``C``: its gradient comes out with shape ``[1]``, which the update
  would broadcast into the weight. ``C`` is unsqueezed to ``[1]`` (same broadcast), so its
  gradient is reduced back to ``[]``.
* ``LeakyRelu`` with a negative ``alpha``: onnxruntime's gradient tests the sign of the
  output, which is positive for negative inputs then. Written as
  ``Relu(x) - alpha * Relu(-x)`` (the same values, exactly), whose gradient tests ``x``.
* ``Slice`` with negative steps: onnxruntime's SliceGrad fails at run time. The reversed axes
  become Gathers of the indices the same Slice picks from ``Range(0, dim)``.
* ``AveragePool`` of an input with a dimension not fixed (the batch of OnnxModule and
  ``OrtGradientForwardBackward``): onnxruntime's backward kills the process (SIGFPE). Written
  as a depthwise ``Conv`` with a kernel of ones, divided by the window's element count. Where
  that cannot be written (channels not known, ``ceil_mode``, ``auto_pad='SAME_*'``) the graph is
  refused with :class:`GraphNotDifferentiableError`.
* ``Pow`` with a broadcast base: the base's gradient was not summed over the broadcast axes
  (a ``[K]`` weight under an ``[N, K]`` exponent got an ``[N, K]`` gradient). The base is
  expanded to the output's shape first. An exponent that needs a gradient (onnxruntime has
  none) is refused, naming the weights that reach it.

* ``Where`` with a broadcast value: the same, for a ``[3]`` or ``[1]`` weight as either
  value under a ``[5, 3]`` condition (the update then failed: "Invalid rank for output"). The
  differentiated values are expanded to the output's shape first.

* ``HardSigmoid`` and ``HardSwish`` (no gradient in onnxruntime-training): written as
  ``Clip(alpha * x + beta, 0, 1)`` and ``x * Clip(x / 6 + 1 / 2, 0, 1)``.
* ``LayerNormalization`` without its optional ``Mean``/``InvStdDev`` outputs (both torch
  exporters leave them out): onnxruntime's gradient reads them and fails an assertion that
  names neither node nor operator. The two outputs are added.
* ``Dropout`` without its optional ``mask`` output (the dynamo exporter's, in training mode): the
  gradient builders failed with onnxruntime's bare "was false." (its gradient reads the mask).
  The output is added.
* ``BatchNormalization`` in training mode: ``GradientGraphBuilder`` (the fused step) has no
  gradient for it; onnxruntime's ``com.microsoft.BatchNormInternal`` (what its module graph
  builder writes itself) computes the same ``Y`` and has one. Its running statistics are
  state, updated apart (``_batchnorm``): the rewritten node's own ones go nowhere. A node in
  inference mode (an eval-mode export) is rewritten the same way, as the module graph builder
  does: a BatchNormalization is trained as torch's BatchNorm, with batch statistics.

* ``InstanceNormalization``/``GroupNormalization`` (no gradient), and ``LSTM``/``GRU`` (the
  training build's gradients are forward-only, ``layout=0``, and read the optional inputs by
  position): written with primitives, and as one forward node per direction with every
  optional input (``_grad_rewrites_norm_rnn``).

* ``Conv`` with ``auto_pad='SAME_UPPER'``/``'SAME_LOWER'`` (torch's TorchScript exporter writes it
  for ``padding='same'``): onnxruntime-training's ConvGrad ignores ``auto_pad``, so the weight
  gradient came partly from uninitialised memory (off by 1.6 to 1e29 relative, grouped and
  depthwise convolutions included, different on each call). Written with explicit pads
  (``_auto_pad``); refused where they depend on a size the graph does not fix.
* ``Conv`` with ``group > 1`` (grouped and depthwise): onnxruntime-training's grouped ConvGrad
  (CPU) gave a two-block depthwise-separable net with residual adds wrong gradients, the same on
  each call, but which tensors depended on the buffers' layout: a depthwise bias gradient 0
  (torch's up to 0.16), the first layer's weight 40 % off; preallocated gradient outputs moved
  the damage to the head's weight gradient, also 0. Written as one Conv per group (Split of the
  input, weight and bias on the channel axis, Concat of the outputs): every route equals torch.

Operators onnxruntime has no gradient for at all (CumSum, Softplus, GlobalMaxPool, ReduceMax,
...) are refused by the gradient builders with the operator's name and the fix.

Only the nodes a differentiated value (a trained weight, an input requiring a gradient)
reaches are rewritten: onnxruntime builds no gradient for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ._auto_pad import is_same_conv, same_pads, with_pads
from ._builder import NodeBuilder
from ._grad_rewrites_norm_rnn import ALWAYS_REWRITTEN, group_norm, instance_norm, recurrent
from .exceptions import GraphNotDifferentiableError
from .graph import all_names, ancestors, cut_frozen_control_flow, infer_without_data

#: (element type, dimensions: a size, or None when not fixed) of a value
ValueInfo = tuple[int, list[int | None]]


@dataclass
class _Graph:
    """What the rewrites read about the graph: the type and shape of the inputs of the nodes
    to rewrite (declared or inferred), the integer constants (when a Slice is to rewrite),
    and which values the differentiated names reach."""

    model: ModelProto
    #: the weights and inputs whose gradient is wanted, in the caller's order
    differentiated: list[str]
    infos: dict[str, ValueInfo]
    consts: dict[str, np.ndarray]
    #: values a differentiated name reaches
    reached: set[str]

    def rank(self, name: str) -> int | None:
        info = self.infos.get(name)
        return None if info is None else len(info[1])

    def elem_type(self, name: str) -> int:
        return self.infos.get(name, (onnx.TensorProto.FLOAT, []))[0]


Rewriter = Callable[[NodeBuilder, onnx.NodeProto, _Graph], None]


def rewrite_for_gradient(model: ModelProto, differentiated: Sequence[str]) -> ModelProto:
    """``model``, or a copy with the forms above rewritten where a value of ``differentiated``
    (the weights and inputs whose gradient is wanted) reaches them: the same outputs, values
    and weights; node outputs keep their names. Raises GraphNotDifferentiableError for a form
    that crashes onnxruntime and cannot be rewritten."""
    model = cut_frozen_control_flow(model, differentiated)  # else a Loop aborts the builders
    nodes = model.graph.node
    reached = set(differentiated)
    found = set()
    for k, node in enumerate(nodes):
        if any(i in reached for i in node.input):
            reached.update(node.output)
            if node.op_type in _REWRITERS and node.domain in ("", "ai.onnx"):
                found.add(k)
        elif node.op_type in ALWAYS_REWRITTEN and node.domain in ("", "ai.onnx"):
            found.add(k)  # the module graph builder swaps every LSTM/GRU for its training kernel
    if not found:
        return model
    infos = _value_infos(model, {i for k in found for i in nodes[k].input if i})
    consts = _constants(model) if any(nodes[k].op_type == "Slice" for k in found) else {}
    graph = _Graph(model, list(differentiated), infos, consts, reached)
    b = NodeBuilder(onnx.TensorProto.FLOAT, 13, all_names(model), prefix="gradfix_")
    new_nodes: list[onnx.NodeProto] = []
    changed = False
    for k, node in enumerate(nodes):
        b.nodes = []
        if k in found:
            _REWRITERS[node.op_type](b, node, graph)
            changed = changed or bool(b.nodes)
        new_nodes.extend(b.nodes or [node])
    if not changed:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    uses_ms = any(n.domain == "com.microsoft" for n in new_nodes)
    if uses_ms and not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


def _rank1_matmul(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """MatMul(a[K], B[..., K, M]) = Squeeze(MatMul(Unsqueeze(a, 0), B), -2), and
    MatMul(A[..., N, K], b[K]) = Squeeze(MatMul(A, Unsqueeze(b, -1)), -1): what ONNX's MatMul
    means (numpy's matmul), with only operands of rank >= 2. Leaves ``b.nodes`` empty when
    neither operand has rank 1 (or a rank onnx cannot infer)."""
    left, right = node.input
    squeeze: list[int] = []
    if graph.rank(left) == 1:
        left = b.op("Unsqueeze", [left, b.int_const([0], "row_axis")], "row")
        squeeze.append(-2)
    if graph.rank(right) == 1:
        right = b.op("Unsqueeze", [right, b.int_const([-1], "col_axis")], "col")
        squeeze.append(-1)
    if not squeeze:
        return
    product = b.op("MatMul", [left, right], "product")
    axes = b.int_const(sorted(squeeze), "squeeze_axes")
    b.nodes.append(helper.make_node("Squeeze", [product, axes], list(node.output), name=b.name("n_Squeeze")))


def _gemm_scalar_c(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """Gemm(A, B, C[]) = Gemm(A, B, Unsqueeze(C, 0)): C of shape [1] broadcasts the same."""
    if len(node.input) < 3 or not node.input[2] or graph.rank(node.input[2]) != 0:
        return
    c1 = b.op("Unsqueeze", [node.input[2], b.int_const([0], "c_axis")], "c")
    gemm = helper.make_node("Gemm", [node.input[0], node.input[1], c1], list(node.output), name=node.name)
    gemm.attribute.extend(node.attribute)
    b.nodes.append(gemm)


def _operator(node: onnx.NodeProto) -> str:
    """How messages name a node: its operator, and its name when it has one."""
    return f"operator {node.op_type}" + (f" (node {node.name!r})" if node.name else "")


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """An attribute's value (lists of ints as lists, strings as bytes), or ``default``."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _leaky_relu(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """LeakyRelu(x) = Relu(x) - alpha * Relu(-x) for a negative alpha: exactly the same
    values (one term is 0), infinities included, and the gradient masks with the sign of x,
    not of the output."""
    alpha = float(_attr(node, "alpha", 0.01))
    if alpha >= 0:
        return
    (x,) = node.input
    positive = b.op("Relu", [x], "positive")
    negative = b.op("Relu", [b.op("Neg", [x], "minus_x")], "negative")
    dtype = helper.tensor_dtype_to_np_dtype(graph.elem_type(x))
    scaled = b.op("Mul", [negative, b.const(alpha, "alpha", dtype=dtype)], "scaled")
    b.nodes.append(helper.make_node("Sub", [positive, scaled], list(node.output), name=b.name("n_Sub")))


def _reversing_slice(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """A Slice with negative (constant) steps as a Slice of the other axes, then one Gather per
    reversed axis, of the indices ``Slice(Range(0, dim), start, end, step)``: the same
    elements (Slice picks the indices as it would the values), whose gradient onnxruntime
    computes (its SliceGrad fails at run time on negative steps). Leaves ``b.nodes`` empty when
    the steps are positive, absent, or not constants (nothing to rewrite, or nothing known)."""
    consts = graph.consts
    data, starts, ends, *rest = node.input
    axes_name = rest[0] if rest else ""
    steps_name = rest[1] if len(rest) > 1 else ""
    steps = consts.get(steps_name)
    if steps is None or (steps >= 0).all() or (axes_name and axes_name not in consts):
        return
    axes = consts[axes_name] if axes_name else np.arange(len(steps))
    # Slice's index inputs share one type (int32 or int64): the new ones are int64
    starts, ends = (
        b.op("Cast", [name], hint, to=onnx.TensorProto.INT64)
        for name, hint in ((starts, "starts64"), (ends, "ends64"))
    )
    forward = [j for j in range(len(steps)) if steps[j] > 0]
    current = data
    if forward:
        picks = b.int_const(forward, "forward_positions")
        bounds = [b.op("Gather", [name, picks], hint) for name, hint in ((starts, "starts"), (ends, "ends"))]
        kept = [
            b.int_const([int(axes[j]) for j in forward], "axes"),
            b.int_const([int(steps[j]) for j in forward], "steps"),
        ]
        current = b.op("Slice", [data, *bounds, *kept], "forward_slice")
    shape = b.op("Shape", [data], "shape")
    zero, one = b.const(0, "zero", dtype=np.int64), b.const(1, "one", dtype=np.int64)
    reversed_axes = [j for j in range(len(steps)) if steps[j] < 0]
    for k, j in enumerate(reversed_axes):
        dim = b.op("Gather", [shape, b.const(int(axes[j]), "axis", dtype=np.int64)], "dim")
        bound = [
            b.op("Slice", [name, b.int_const([j]), b.int_const([j + 1])], hint)
            for name, hint in ((starts, "start"), (ends, "end"))
        ]
        positions = b.op("Range", [zero, dim, one], "positions")
        indices = b.op(
            "Slice", [positions, *bound, b.int_const([0]), b.int_const([int(steps[j])])], "indices"
        )
        out = node.output[0] if k == len(reversed_axes) - 1 else b.name("reversed")
        b.nodes.append(
            helper.make_node("Gather", [current, indices], [out], name=b.name("n_Gather"), axis=int(axes[j]))
        )
        current = out


def _constants(model: ModelProto) -> dict[str, np.ndarray]:
    """Integer initializers and Constant nodes' tensors, by name."""
    consts = {
        i.name: numpy_helper.to_array(i)
        for i in model.graph.initializer
        if i.data_type in (onnx.TensorProto.INT32, onnx.TensorProto.INT64)
    }
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return consts


def _average_pool(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """AveragePool(x) of an x with a dimension not fixed = Conv(x, ones, group=C) / count,
    count = the window's element count (prod(kernel), or with count_include_pad=0 and pads, a
    Conv of ones over a ones image: the elements each window holds inside the image). Leaves
    ``b.nodes`` empty when x's shape is fixed (onnxruntime's own gradient is right then)."""
    (x,) = node.input
    elem_type, dims = graph.infos.get(x, (onnx.TensorProto.FLOAT, [None]))
    if all(d is not None for d in dims):
        return
    kernel = list(_attr(node, "kernel_shape", []))
    auto_pad = _attr(node, "auto_pad", b"NOTSET")
    channels = dims[1] if len(dims) > 2 else None
    if channels is None or _attr(node, "ceil_mode", 0) or auto_pad not in (b"NOTSET", b"VALID"):
        raise GraphNotDifferentiableError(
            f"{_operator(node)}: onnxruntime-training's gradient crashes the "
            "process when its input has a dimension that is not fixed, and it cannot be rewritten as "
            "a convolution here (channel count not known, ceil_mode or auto_pad SAME): fix the input's "
            "shape (the batch size too), or export the pooling with ceil_mode=0 and explicit pads"
        )
    pads = [0] * 2 * len(kernel) if auto_pad == b"VALID" else list(_attr(node, "pads", [0] * 2 * len(kernel)))
    conv_attrs = {
        "kernel_shape": kernel,
        "strides": list(_attr(node, "strides", [1] * len(kernel))),
        "pads": pads,
        "dilations": list(_attr(node, "dilations", [1] * len(kernel))),
    }
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    ones = b.const(np.ones([channels, 1, *kernel]), "ones_kernel", dtype=dtype)
    sums = b.op("Conv", [x, ones], "window_sums", group=channels, **conv_attrs)
    if _attr(node, "count_include_pad", 0) or not any(pads):
        count = b.const(float(np.prod(kernel)), "window_size", dtype=dtype)
    else:  # the elements inside the image: the same windows over an image of ones [1, 1, ...]
        spatial = b.op("Slice", [b.op("Shape", [x]), b.int_const([2]), b.int_const([len(dims)])], "spatial")
        image_shape = b.op("Concat", [b.int_const([1, 1], "one_one"), spatial], "image_shape", axis=0)
        one = numpy_helper.from_array(np.ones(1, dtype=dtype), "one")
        image = b.op("ConstantOfShape", [image_shape], "ones_image", value=one)
        one_kernel = b.const(np.ones([1, 1, *kernel]), "one_kernel", dtype=dtype)
        count = b.op("Conv", [image, one_kernel], "window_counts", **conv_attrs)
    b.nodes.append(helper.make_node("Div", [sums, count], list(node.output), name=b.name("n_Div")))


def _pow(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """Pow(a, b): onnxruntime has no gradient for the exponent (refused, naming the weight that
    reaches it so that a default choice of weights can leave it out), and does not reduce the
    base's gradient over broadcast axes (a [K] base under a [N, K] exponent got an [N, K]
    gradient). The base is expanded to the output's shape first, Expand(a, Shape(b)), whose
    gradient sums back over the broadcast axes."""
    base, exponent = node.input
    if exponent in graph.reached:
        reaching = ancestors(graph.model, [exponent])[0]
        culprits = [n for n in graph.differentiated if n in reaching]
        raise GraphNotDifferentiableError(
            f"{_operator(node)} has no gradient for its exponent in onnxruntime-training, and the "
            f"exponent depends on {', '.join(repr(n) for n in culprits)}: write a ** b as "
            "Exp(b * Log(a)) for a positive base a, or leave those out of weights_to_train (and of "
            "the inputs requiring a gradient)",
            weight=culprits[0] if culprits else None,
        )
    base_info = graph.infos.get(base)
    fixed_and_equal = (
        base_info is not None and base_info == graph.infos.get(exponent) and None not in base_info[1]
    )
    if base not in graph.reached or fixed_and_equal:
        return
    expanded = b.op("Expand", [base, b.op("Shape", [exponent], "exponent_shape")], "base")
    b.nodes.append(helper.make_node("Pow", [expanded, exponent], list(node.output), name=node.name))


def _where(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """Where(c, x, y): onnxruntime does not reduce the gradient of a broadcast ``x`` or ``y``
    over the broadcast axes (a [3] or [1] weight under a [5, 3] output got a [5, 3] gradient,
    which the update then refused). A differentiated operand is expanded to the output's shape
    first, Expand(x, Shape(Where(c, x, y))), whose gradient sums back; the Where giving the
    shape passes no gradient (Shape has none)."""
    cond, x, y = node.input
    infos = [graph.infos.get(n) for n in (cond, x, y)]
    known = [i[1] for i in infos if i is not None and None not in i[1]]
    if len(known) == 3 and known[0] == known[1] == known[2]:
        return
    if x not in graph.reached and y not in graph.reached:
        return
    shape = b.op("Shape", [b.op("Where", [cond, x, y], "where_for_shape")], "where_shape")
    x, y = (b.op("Expand", [v, shape], "where_value") if v in graph.reached else v for v in (x, y))
    b.nodes.append(helper.make_node("Where", [cond, x, y], list(node.output), name=node.name))


def _hard_sigmoid_of(b: NodeBuilder, x: str, alpha: float, beta: float, dtype: Any, out: str) -> None:
    """``out = Clip(alpha * x + beta, 0, 1)``, HardSigmoid's definition."""
    scaled = b.op("Add", [b.op("Mul", [x, b.const(alpha, "alpha", dtype)]), b.const(beta, "beta", dtype)])
    bounds = [b.const(0.0, "zero", dtype), b.const(1.0, "one", dtype)]
    b.nodes.append(helper.make_node("Clip", [scaled, *bounds], [out], name=b.name("n_Clip")))


def _hard_sigmoid(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """HardSigmoid (no gradient in onnxruntime-training) as Clip(alpha * x + beta, 0, 1)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    dtype = helper.tensor_dtype_to_np_dtype(graph.elem_type(node.input[0]))
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    _hard_sigmoid_of(b, node.input[0], alpha, beta, dtype, node.output[0])


def _hard_swish(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """HardSwish (no gradient in onnxruntime-training) as x * Clip(x / 6 + 1 / 2, 0, 1)."""
    x = node.input[0]
    dtype = helper.tensor_dtype_to_np_dtype(graph.elem_type(x))
    gate = b.name("hard_sigmoid")
    _hard_sigmoid_of(b, x, 1.0 / 6.0, 0.5, dtype, gate)
    b.nodes.append(helper.make_node("Mul", [x, gate], list(node.output), name=b.name("n_Mul")))


def _layer_norm_outputs(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """LayerNormalization with its optional Mean and InvStdDev outputs: onnxruntime's gradient
    reads them and fails an assertion (naming neither node nor operator) when the exporter
    left them out, as both torch exporters do."""
    outputs = list(node.output) + [""] * (3 - len(node.output))
    if all(outputs):
        return
    hints = ["layer_norm_y", "layer_norm_mean", "layer_norm_inv_std_dev"]
    outputs = [out or b.name(hint) for out, hint in zip(outputs, hints)]
    new = helper.make_node(node.op_type, list(node.input), outputs, name=node.name or b.name("n_LayerNorm"))
    new.attribute.extend(node.attribute)
    b.nodes.append(new)


def _dropout_mask(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """Dropout with its optional ``mask`` output, which onnxruntime's gradient reads: the
    dynamo exporter writes a training-mode Dropout with its output only, and both gradient
    builders then failed an assertion whose whole text is "was false."."""
    if len(node.output) > 1 and node.output[1]:
        return
    outputs = [node.output[0], b.name("dropout_mask")]
    new = helper.make_node("Dropout", list(node.input), outputs, name=node.name or b.name("n_Dropout"))
    new.attribute.extend(node.attribute)
    b.nodes.append(new)


def _batch_norm(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """BatchNormalization as com.microsoft.BatchNormInternal in training mode (inputs X, scale,
    B, input_mean, input_var; outputs Y, running_mean, running_var, saved_mean,
    saved_inv_std): Y normalised with the batch's statistics, as torch's BatchNorm in train
    mode, and a gradient in both of onnxruntime's builders."""
    if len(node.input) != 5:
        return
    hints = ["bn_running_mean", "bn_running_var", "bn_saved_mean", "bn_saved_inv_std"]
    outputs = [node.output[0], *(b.name(h) for h in hints)]
    name = node.name or b.name("n_BatchNorm")
    new = helper.make_node("BatchNormInternal", list(node.input), outputs, name=name, domain="com.microsoft")
    new.attribute.extend(a for a in node.attribute if a.name != "training_mode")
    new.attribute.append(helper.make_attribute("training_mode", 1))
    b.nodes.append(new)


def _same_conv(node: onnx.NodeProto, graph: _Graph) -> onnx.NodeProto:
    """Conv with ``auto_pad`` SAME_UPPER/SAME_LOWER as the same Conv with explicit pads: the
    training build's ConvGrad ignores ``auto_pad`` and computes the weight gradient partly from
    uninitialised memory (``_auto_pad``). Refused when the pads depend on a size the graph does
    not fix (a stride above 1). ``node`` itself when it has no SAME ``auto_pad``."""
    if not is_same_conv(node):
        return node
    dims = [graph.infos[n][1] if n in graph.infos else None for n in node.input[:2]]
    pads = same_pads(node, *dims)
    if pads is None:
        raise GraphNotDifferentiableError(
            f"{_operator(node)} has auto_pad SAME_UPPER/SAME_LOWER, whose weight gradient "
            "onnxruntime-training computes wrongly, and its pads cannot be written out: the input's "
            "spatial size is not fixed and a stride is above 1; fix the input's shape, or export the "
            "convolution with explicit pads"
        )
    return with_pads(node, pads)


def _conv(b: NodeBuilder, node: onnx.NodeProto, graph: _Graph) -> None:
    """A Conv with explicit pads (:func:`_same_conv`), split per group when grouped
    (:func:`_split_groups`)."""
    conv = _same_conv(node, graph)
    if _attr(conv, "group", 1) > 1 and _split_groups(b, conv, graph):
        return
    if conv is not node:
        b.nodes.append(conv)


def _split_groups(b: NodeBuilder, conv: onnx.NodeProto, graph: _Graph) -> bool:
    """``Conv(X, W, B, group=g)`` as ``Concat_i Conv(X_i, W_i, B_i)`` over the g channel groups
    (the same values, exactly): onnxruntime-training's grouped ConvGrad is wrong (module
    docstring). False, nothing written, when the weight's first two dimensions are not known."""
    groups = int(_attr(conv, "group", 1))
    dims = graph.infos.get(conv.input[1], (0, []))[1]
    if len(dims) < 2 or dims[0] is None or dims[1] is None:
        return False

    def split(value: str, size: int, hint: str, axis: int) -> list[str]:
        parts = [b.name(f"{hint}{i}") for i in range(groups)]
        sizes = b.int_const([size] * groups, f"{hint}_sizes")
        b.nodes.append(
            helper.make_node(
                "Split", [value, sizes], parts, name=b.name("n_Split"), axis=1 if hint == "x" else 0
            )
        )
        return parts

    xs, ws = split(conv.input[0], dims[1], "x", 1), split(conv.input[1], dims[0] // groups, "w", 0)
    bs = split(conv.input[2], dims[0] // groups, "b", 0) if len(conv.input) > 2 and conv.input[2] else None
    attrs = [a for a in conv.attribute if a.name != "group"]
    ys = []
    for i in range(groups):
        y = b.name(f"group_out{i}")
        part = helper.make_node("Conv", [xs[i], ws[i], *([bs[i]] if bs else [])], [y], name=b.name("n_Conv"))
        part.attribute.extend(attrs)
        b.nodes.append(part)
        ys.append(y)
    b.nodes.append(
        helper.make_node("Concat", ys, [conv.output[0]], name=conv.name or b.name("n_Concat"), axis=1)
    )
    return True


_REWRITERS: dict[str, Rewriter] = {
    "BatchNormalization": _batch_norm,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "LayerNormalization": _layer_norm_outputs,
    "MatMul": _rank1_matmul,
    "Gemm": _gemm_scalar_c,
    "LeakyRelu": _leaky_relu,
    "Slice": _reversing_slice,
    "AveragePool": _average_pool,
    "Pow": _pow,
    "Where": _where,
    "Conv": _conv,
    "Dropout": _dropout_mask,
    "InstanceNormalization": instance_norm,
    "GroupNormalization": group_norm,
    "LSTM": recurrent,
    "GRU": recurrent,
}


def _value_infos(model: ModelProto, names: set[str]) -> dict[str, ValueInfo]:
    """The type and shape of each of ``names`` that the graph declares or onnx infers.

    Inference runs only when some value is not declared, on a copy without the initializers'
    data (their types and shapes are declared as graph inputs instead)."""
    g = model.graph
    infos: dict[str, ValueInfo] = {
        i.name: (i.data_type, list(i.dims)) for i in g.initializer if i.name in names
    }
    infos.update(_declared([*g.input, *g.value_info, *g.output], names))
    if names <= set(infos):
        return infos
    inferred = infer_without_data(model)
    if inferred is None:  # a graph onnx cannot infer: what it declares
        return infos
    for name, info in _declared(inferred.value_info, names).items():
        infos.setdefault(name, info)
    return infos


def _declared(value_infos: Sequence[onnx.ValueInfoProto], names: set[str]) -> dict[str, ValueInfo]:
    """The (type, dims) of the tensor values of ``names`` whose shape is recorded."""
    out: dict[str, ValueInfo] = {}
    for vi in value_infos:
        tt = vi.type.tensor_type
        if vi.name in names and vi.type.HasField("tensor_type") and tt.HasField("shape"):
            out[vi.name] = (
                tt.elem_type,
                [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim],
            )
    return out
