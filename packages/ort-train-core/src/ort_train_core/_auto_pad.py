"""Conv's ``auto_pad='SAME_UPPER'``/``'SAME_LOWER'`` written as the explicit ``pads`` it
means (ONNX's definition), for two faults of onnxruntime 1.19 with those attributes:

* with dilations it refuses the node even for inference ("Dilation not supported for
  AutoPadType::SAME_UPPER"), and torch's TorchScript exporter writes ``auto_pad='SAME_UPPER'``
  for every ``padding='same'`` (dilated TCNs);
* onnxruntime-training's ``ConvGrad`` ignores ``auto_pad`` and reads the image without
  padding into a buffer sized for the padded output: the weight gradient is read partly from
  uninitialised memory, wrong on every route (off by 1.6 to 1e29 relative against torch,
  different from one call to the next), grouped and depthwise convolutions included.

Explicit pads give the same output (onnxruntime computes SAME pads by the same formula) and
right gradients. With stride 1 on an axis the pads do not depend on the image size
(``(kernel - 1) * dilation`` in all); with a larger stride they need the input's size on that
axis, which the graph must fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx
from onnx import ModelProto, helper

_SAME = (b"SAME_UPPER", b"SAME_LOWER")


def is_same_conv(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a standard Conv with ``auto_pad`` SAME_UPPER or SAME_LOWER."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return False
    return any(a.name == "auto_pad" and a.s in _SAME for a in node.attribute)


def same_pads(
    node: onnx.NodeProto, x_dims: Sequence[int | None] | None, w_dims: Sequence[int | None] | None
) -> list[int] | None:
    """The explicit pads ``[begin..., end...]`` of a SAME Conv ``node`` whose input and weight
    have the dimensions ``x_dims`` and ``w_dims`` (None where not known); None when they
    depend on a size that is not known (a stride above 1 on an axis of unknown size, or a
    kernel shape neither the node nor the weight gives).

    Total padding on an axis: ``max(0, (ceil(n / s) - 1) * s + (k - 1) * d + 1 - n)``, the
    extra unit at the end (SAME_UPPER) or at the beginning (SAME_LOWER).
    """
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kernel = list(attrs.get("kernel_shape", w_dims[2:] if w_dims is not None else []))
    if not kernel or any(k is None for k in kernel):
        return None
    rank = len(kernel)
    strides = list(attrs.get("strides", [1] * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    sizes = list(x_dims[2:]) if x_dims is not None and len(x_dims) == rank + 2 else [None] * rank
    begins, ends = [], []
    for k, s, d, n in zip(kernel, strides, dilations, sizes, strict=True):
        span = (k - 1) * d + 1
        if s == 1:
            total = span - 1
        elif n is None:
            return None
        else:
            total = max(0, (math.ceil(n / s) - 1) * s + span - n)
        small, large = total // 2, total - total // 2
        begin, end = (small, large) if attrs["auto_pad"] == b"SAME_UPPER" else (large, small)
        begins.append(begin)
        ends.append(end)
    return begins + ends


def with_pads(node: onnx.NodeProto, pads: Sequence[int]) -> onnx.NodeProto:
    """A copy of the Conv ``node`` with ``pads`` in place of its ``auto_pad``."""
    new = onnx.NodeProto()
    new.CopyFrom(node)
    kept = [a for a in new.attribute if a.name not in ("auto_pad", "pads")]
    del new.attribute[:]
    new.attribute.extend([*kept, helper.make_attribute("pads", list(pads))])
    return new


def explicit_conv_pads(model: ModelProto) -> ModelProto:
    """``model``, or a copy whose top-level SAME Convs carry explicit pads instead (see the
    module's docstring); those whose pads depend on a size the graph does not fix stay.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when no Conv has a SAME ``auto_pad``.
    """
    found = [k for k, n in enumerate(model.graph.node) if is_same_conv(n)]
    if not found:
        return model
    dims = _dims(model, {i for k in found for i in model.graph.node[k].input[:2]})
    out = ModelProto()
    out.CopyFrom(model)
    for k in found:
        node = out.graph.node[k]
        pads = same_pads(node, dims.get(node.input[0]), dims.get(node.input[1]))
        if pads is not None:
            node.CopyFrom(with_pads(node, pads))
    return out


def _dims(model: ModelProto, names: set[str]) -> dict[str, list[int | None]]:
    """The dimensions (None where not fixed) of ``names``: initializers', then those the graph
    declares or onnx infers (inference only when some name is not known otherwise)."""
    g = model.graph
    dims: dict[str, list[int | None]] = {i.name: list(i.dims) for i in g.initializer if i.name in names}
    values = [*g.input, *g.value_info]
    if not names <= {*dims, *(v.name for v in values)}:
        from .graph import infer_without_data  # here: graph.normalise_model imports this module

        inferred = infer_without_data(model)
        values += list(inferred.value_info) if inferred is not None else []
    for vi in values:
        tt = vi.type.tensor_type
        if vi.name in names and vi.name not in dims and tt.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return dims
