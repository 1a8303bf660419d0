"""The oracle of the ``onnx`` backend's gradient rules (tests/core/autodiff): a tiny graph, its
output(s) reduced to the scalar ``loss = sum_k ReduceSum(Y_k * R_k)`` with fixed random ``R_k``
(so that the seed of the rule is not all ones), differentiated by
``get_backend("onnx").gradient_graph`` and checked against two independent references:

* :func:`check_against_torch`: the float32 gradient graph run by onnxruntime against torch
  autograd of the same math in float64 (the forward outputs are compared too, so a torch
  function that does not say what the ONNX operator does fails loudly);
* :func:`check_against_finite_differences`: the float64 gradient graph (run by onnxruntime, or
  by ``onnx.reference`` where onnxruntime has no double kernel) against central differences of
  the float64 forward graph run by ``onnx.reference.ReferenceEvaluator``: no torch needed.

Every gradient graph must pass ``onnx.checker.check_model(full_check=True)`` and hold no dead
node (:func:`dead_nodes`). Tolerance: relative 1e-5 with an absolute floor of 1e-5 times the
largest reference gradient of the tensor (float32 cancellation near zero).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops._op import OpRunUnaryNum
from onnx.reference.ops.op_conv import Conv as RefConv
from onnx.reference.ops.op_conv_transpose import ConvTranspose as RefConvTranspose

from ort_train_core._backends import get_backend

#: (torch module, {input name: float64 tensor}) -> the graph's outputs, in order
TorchFn = Callable[[Any, dict[str, Any]], Sequence[Any]]

RTOL = 1e-5
ATOL_SCALE = 1e-5
#: the largest relative error seen per reference, over the session (reported by the suite)
MAX_ERRORS: dict[str, float] = {"torch": 0.0, "finite differences": 0.0}


@dataclass
class Graph:
    """One tiny graph: ``nodes`` reading the float ``inputs`` (differentiated, fed) and the
    initializers ``consts`` (indices, shapes, constant operands), writing ``outputs``."""

    name: str
    nodes: list[onnx.NodeProto]
    inputs: dict[str, np.ndarray]
    torch_fn: TorchFn | None
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=lambda: ["Y"])
    opset: int = 18
    #: the names differentiated (default: every input)
    wrt: list[str] | None = None
    #: the differentiated values are initializers (trained weights), not graph inputs
    weights_as_initializers: bool = False
    #: shapes of the float values onnx's shape inference leaves untyped (GroupNormalization's
    #: output), declared in the graph
    declared: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.inputs) if self.wrt is None else list(self.wrt)


def values(
    rng: np.random.Generator,
    shape: Sequence[int],
    lo: float = -1.5,
    hi: float = 1.5,
    avoid: Sequence[float] = (),
) -> np.ndarray:
    """Uniform values in [lo, hi], at least 0.05 away from each point of ``avoid`` (kinks and
    poles), exactly representable in float32."""
    out = rng.uniform(lo, hi, size=tuple(shape))
    for point in avoid:
        near = np.abs(out - point) < 0.05
        out[near] = point + np.where(out[near] >= point, 0.1, -0.1)
    return out.astype(np.float32).astype(np.float64)


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


class Erf(OpRunUnaryNum):
    """Erf in the input's precision (onnx.reference's own rounds it to float32, also inside
    Gelu's function body: finite differences in float64 would measure the rounding)."""

    op_domain = ""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (np.vectorize(math.erf, otypes=[x.dtype])(x),)


class Gelu(OpRun):
    """Gelu in the input's precision (onnx.reference expands it into its float32 Erf)."""

    op_domain = ""

    def _run(self, x: np.ndarray, approximate: str = "none") -> tuple[np.ndarray]:
        if approximate == "tanh":
            return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),)
        return (x * 0.5 * (1 + Erf._run(self, x / math.sqrt(2))[0]),)  # type: ignore[arg-type]


class Pad(OpRun):
    """Pad, negative pads included (onnx.reference's numpy.pad refuses them: they crop)."""

    op_domain = ""

    def _run(
        self,
        data: np.ndarray,
        pads: np.ndarray,
        constant_value: Any = None,
        axes: Any = None,
        mode: Any = None,
    ) -> tuple[np.ndarray]:
        rank = data.ndim
        axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        width, crop = [(0, 0)] * rank, [slice(None)] * rank
        for k, a in enumerate(axes):
            begin, end = int(pads[k]), int(pads[k + len(axes)])
            width[a] = (max(begin, 0), max(end, 0))
            crop[a] = slice(max(-begin, 0), data.shape[a] - max(-end, 0))
        value = 0 if constant_value is None else constant_value
        return (np.pad(data[tuple(crop)], width, constant_values=value).astype(data.dtype),)


class Mean(OpRun):
    """Mean with broadcasting (onnx.reference's adds in place into the first operand's shape)."""

    op_domain = ""

    def _run(self, *args: np.ndarray) -> tuple[np.ndarray]:
        return ((sum(args) / len(args)).astype(args[0].dtype),)


class GatherElements(OpRun):
    """GatherElements with indices smaller than the data on the other axes (onnx.reference
    refuses them)."""

    op_domain = ""

    def _run(self, data: np.ndarray, indices: np.ndarray, axis: int = 0) -> tuple[np.ndarray]:
        axis = axis % data.ndim
        grid = list(np.indices(indices.shape, sparse=True))
        grid[axis] = np.where(indices < 0, indices + data.shape[axis], indices)
        return (data[tuple(grid)],)


class Conv(RefConv):
    """Conv by groups (onnx.reference's fails to reshape some grouped convolutions)."""

    op_domain = ""

    def _run(self, X: np.ndarray, W: np.ndarray, B: Any = None, **attrs: Any) -> tuple[np.ndarray]:
        return (_by_groups(super()._run, X, W, B, 0, attrs),)


class ConvTranspose(RefConvTranspose):
    """ConvTranspose by groups (as :class:`Conv`)."""

    op_domain = ""

    def _run(self, X: np.ndarray, W: np.ndarray, B: Any = None, **attrs: Any) -> tuple[np.ndarray]:
        return (_by_groups(super()._run, X, W, B, 1, attrs),)


def _by_groups(
    run: Any, X: np.ndarray, W: np.ndarray, B: Any, w_axis: int, attrs: dict[str, Any]
) -> np.ndarray:
    """``run`` (a one-group reference kernel) on each group of channels, outputs concatenated;
    ``w_axis``: W's axis of the output channels (0 for Conv, 1 for ConvTranspose)."""
    group = int(attrs.pop("group", None) or 1)
    xs = np.split(X, group, axis=1)
    ws = np.split(W, group, axis=0)
    n_out = W.shape[1] if w_axis else W.shape[0] // group
    bs = [None] * group if B is None else [B[k * n_out : (k + 1) * n_out] for k in range(group)]
    return np.concatenate([run(x, w, b, group=1, **attrs)[0] for x, w, b in zip(xs, ws, bs)], axis=1)


class GlobalMaxPool(OpRun):
    """GlobalMaxPool over every spatial axis (onnx.reference's reduces the wrong axes off 2-D)."""

    op_domain = ""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(
        model, new_ops=[Conv, ConvTranspose, Erf, GatherElements, Gelu, GlobalMaxPool, Mean, Pad]
    )


# ---- building ----------------------------------------------------------------------------------
def _float(arr: np.ndarray, np_type: Any) -> np.ndarray:
    return arr.astype(np_type) if arr.dtype.kind == "f" else arr


def build(
    g: Graph, float_type: int = TensorProto.FLOAT, fed: bool = False
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The loss graph of ``g`` in ``float_type`` (outputs: ``loss``, then ``g.outputs``) and its
    feeds; ``fed``: the differentiated values are graph inputs even where ``g`` makes them
    initializers (finite differences feed them)."""
    np_type = helper.tensor_dtype_to_np_dtype(float_type)
    feeds = {k: v.astype(np_type) for k, v in g.inputs.items()}
    consts = [numpy_helper.from_array(_float(v, np_type), k) for k, v in g.consts.items()]
    if g.weights_as_initializers and not fed:
        consts += [numpy_helper.from_array(v, k) for k, v in feeds.items()]
        feeds = {}
    vis = [helper.make_tensor_value_info(k, float_type, list(v.shape)) for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in g.outputs]
    declared = [helper.make_tensor_value_info(k, float_type, list(v)) for k, v in g.declared.items()]
    bare = _model(helper.make_graph(g.nodes, g.name, vis, outs, consts, value_info=declared), g.opset)
    inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=True).graph
    found = {o.name: o.type.tensor_type for o in [*inferred.output, *inferred.value_info]}
    rng = rng_for(g.name + "/R")
    nodes, parts, seeds = list(g.nodes), [], []
    for o in g.outputs:
        shape = [d.dim_value for d in found[o].shape.dim]
        r = numpy_helper.from_array(
            values(rng, shape, 0.5, 1.5).astype(helper.tensor_dtype_to_np_dtype(found[o].elem_type)), f"R_{o}"
        )
        seeds.append(r)
        nodes.append(helper.make_node("Mul", [o, r.name], [f"{o}_times_R"]))
        nodes.append(helper.make_node("ReduceSum", [f"{o}_times_R"], [f"{o}_loss"], keepdims=0))
        parts.append(
            f"{o}_loss" if found[o].elem_type == float_type else _cast(nodes, f"{o}_loss", float_type)
        )
    nodes.append(helper.make_node("Sum", parts, ["loss"]))
    outputs = [helper.make_tensor_value_info("loss", float_type, [])]
    outputs += [
        helper.make_tensor_value_info(o, found[o].elem_type, [d.dim_value for d in found[o].shape.dim])
        for o in g.outputs
    ]
    model = _model(helper.make_graph(nodes, g.name, vis, outputs, [*consts, *seeds]), g.opset)
    onnx.checker.check_model(model, full_check=True)
    return model, feeds


def _cast(nodes: list[onnx.NodeProto], name: str, to: int) -> str:
    nodes.append(helper.make_node("Cast", [name], [f"{name}_cast"], to=to))
    return f"{name}_cast"


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


# ---- the gradient graph and its checks -------------------------------------------------------
def gradient_model(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """The onnx backend's gradient graph, checked (full check) and free of dead nodes."""
    grad = get_backend("onnx").gradient_graph(model, "loss", list(names))
    onnx.checker.check_model(grad, full_check=True)
    dead = dead_nodes(grad)
    assert not dead, f"dead nodes emitted: {[(n.op_type, n.name) for n in dead]}"
    return grad


def dead_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes none of whose outputs a node (or a node of a subgraph: a Scan's body) or a
    graph output reads."""

    def reads(graph: onnx.GraphProto) -> set[str]:
        found = {i for n in graph.node for i in n.input}
        for n in graph.node:
            for a in n.attribute:
                for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    found |= reads(g)
        return found

    read = reads(model.graph) | {o.name for o in model.graph.output}
    return [n for n in model.graph.node if not any(o in read for o in n.output if o)]


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of ``model``: onnxruntime, or onnx.reference where onnxruntime has no
    kernel (stock onnxruntime has no double kernel for some operators; its LSTM and GRU say so
    only when they run)."""
    names = [o.name for o in model.graph.output]
    try:
        sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's NOT_IMPLEMENTED: no kernel for this type
        if "NOT_IMPLEMENTED" not in str(exc) and type(exc).__name__ != "NotImplemented":
            raise
        got = evaluator(model).run(None, dict(feeds))
    else:
        try:
            got = sess.run(None, dict(feeds))
        except Exception as exc:  # stock onnxruntime's LSTM/GRU refuse double when they run
            if "does not support double" not in str(exc):
                raise
            got = evaluator(model).run(None, dict(feeds))
    return dict(zip(names, (np.asarray(v) for v in got)))


def onnx_gradients(g: Graph, float_type: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(outputs, gradients) of ``g`` by the onnx backend, in ``float_type``."""
    model, feeds = build(g, float_type)
    got = run(gradient_model(model, g.names), feeds)
    for name in g.names:
        assert got[f"{name}_grad"].dtype == helper.tensor_dtype_to_np_dtype(float_type)
        assert got[f"{name}_grad"].shape == g.inputs[name].shape, name
    return got, {n: got[f"{n}_grad"] for n in g.names}


def assert_close(got: np.ndarray, want: np.ndarray, what: str, reference: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    floor = ATOL_SCALE * max(float(np.max(np.abs(want), initial=0.0)), 1e-3)
    err = np.abs(got - want) / (np.abs(want) + floor / RTOL) if want.size else np.zeros(0)
    worst = float(np.max(err, initial=0.0))
    MAX_ERRORS[reference] = max(MAX_ERRORS[reference], worst)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=floor, err_msg=f"{what} against {reference}")


# ---- the references ----------------------------------------------------------------------------
def check_against_finite_differences(g: Graph, h: float = 1e-6) -> None:
    """The float64 gradients against central differences of the float64 forward graph run by
    onnx's reference evaluator (by onnxruntime below opset 13: onnx.reference gives Softmax-1/11
    the semantics of Softmax-13)."""
    _, grads = onnx_gradients(g, TensorProto.DOUBLE)
    model, feeds = build(g, TensorProto.DOUBLE, fed=True)
    forward = evaluator(model)

    def loss(values: dict[str, np.ndarray]) -> float:
        if g.opset < 13:
            return float(run(model, values)["loss"])
        return float(forward.run(["loss"], values)[0])

    for name in g.names:
        base = feeds[name]
        fd = np.zeros_like(base)
        for pos in np.ndindex(base.shape):
            sides = []
            for sign in (1.0, -1.0):
                moved = base.copy()
                moved[pos] += sign * h
                sides.append(loss({**feeds, name: moved}))
            fd[pos] = (sides[0] - sides[1]) / (2 * h)
        assert_close(grads[name], fd, f"{g.name}: d loss / d {name}", "finite differences")


def check_against_torch(g: Graph) -> None:
    """The float32 gradients by onnxruntime against torch autograd in float64 (outputs too)."""
    import torch

    assert g.torch_fn is not None, f"{g.name} has no torch function"
    got, grads = onnx_gradients(g, TensorProto.FLOAT)
    model, _ = build(g, TensorProto.FLOAT)
    seeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.startswith("R_")}
    tensors = {
        k: torch.tensor(v, dtype=torch.float64, requires_grad=k in g.names) for k, v in g.inputs.items()
    }
    outputs = g.torch_fn(torch, tensors)
    loss = 0
    for o, y in zip(g.outputs, outputs):
        assert_close(got[o], y.detach().numpy(), f"{g.name}: output {o}", "torch")
        loss = loss + (y.double() * torch.tensor(seeds[f"R_{o}"], dtype=torch.float64)).sum()
    wanted = torch.autograd.grad(loss, [tensors[n] for n in g.names], allow_unused=True)
    for name, want in zip(g.names, wanted):
        ref = np.zeros(g.inputs[name].shape) if want is None else want.numpy()
        assert_close(grads[name], ref, f"{g.name}: d loss / d {name}", "torch")
