"""The ``onnx`` gradient backend: our reverse pass written in default-domain operators, run by
any onnxruntime (stock or training build, any execution provider).

- :meth:`OnnxBackend.gradient_graph`: the loss graph plus ``<name>_grad`` outputs;
- :meth:`OnnxBackend.fused_step`: that graph plus the learning rate's update nodes
  (:func:`~.._gradient.fused_step_from_gradients`);
- :meth:`OnnxBackend.forward_backward`: two plain inference sessions per input shapes, the
  forward exporting what the backward reads, run by :class:`TwoSessionRunner`.

Every graph it writes keeps the forward's opset (raised to 17 when lower) and IR <= 10, so that
onnxruntime-training 1.19.2 runs it too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import ModelProto, helper

from .._auto_pad import explicit_conv_pads
from .._binding import io_binding
from .._builder import NodeBuilder
from .._gradient import ForwardBackwardGraphs, FusedStepSignature, fused_step_from_gradients
from .._runtime import Device
from ..exceptions import GraphNotDifferentiableError
from ..graph import (
    MAX_IR_VERSION,
    all_names,
    check_differentiable,
    check_no_control_flow,
    check_precision,
    control_flow_error,
    control_flow_weights,
    value_types,
)
from ..learning_rate import BaseLearningRate
from ._context import StaticInfo
from ._sparse_update import sparse_embedding_updates
from ._walk import active_values, checked_path, live_nodes, reverse_pass, static_info
from .rules.recurrent import time_major

#: the lowest opset the rules write (ScatterND and ScatterElements with reduction='add': 16)
MIN_GRADIENT_OPSET = 17
#: input shape sets a pair keeps graphs and sessions for (least recently fed dropped first):
#: sequences of many lengths fed to one OnnxModule would otherwise hold a pair per length
MAX_SHAPE_SETS = 16


class OnnxBackend:
    """Reverse-mode differentiation into standard ONNX behind :class:`~.._gradient.GradientBackend`.

    Attributes
    ----------
    name : str
        ``'onnx'``.
    """

    name: str = "onnx"

    def gradient_graph(self, model: ModelProto, loss_name: str, names: Sequence[str]) -> ModelProto:
        """``model`` plus one output ``<name>_grad`` per name, the loss kept.

        Parameters
        ----------
        model : onnx.ModelProto
            The graph with static shapes, ``names`` among its inputs or initializers.
        loss_name : str
            The scalar output to differentiate.
        names : sequence of str
            The values to differentiate with respect to.

        Returns
        -------
        onnx.ModelProto
            The gradient graph, in default-domain operators.

        Raises
        ------
        GraphNotDifferentiableError
            Naming each operator on the way without a rule, or a name the loss does not reach
            (``.weight``), before any session is made.
        """
        check_no_control_flow(model, names, loss_name)
        out = with_gradient_opset(model)
        info = static_info(out, names)
        check_precision(list(names), info.types)
        loss_type = info.types.get(loss_name, onnx.TensorProto.FLOAT)
        b = NodeBuilder(loss_type, _opset(out), all_names(out), prefix="grad_")
        seed = b.const(np.ones(info.shapes.get(loss_name, ())), f"{loss_name}_seed")
        grads = reverse_pass(out, {loss_name: seed}, names, b, info)
        _check_reached(names, grads, loss_name)
        outputs = [f"{n}_grad" for n in names]
        b.nodes.extend(helper.make_node("Identity", [grads[n]], [o]) for n, o in zip(names, outputs))
        out.graph.node.extend(live_nodes(b.nodes, outputs))
        out.graph.output.extend(_value_info(o, n, info) for n, o in zip(names, outputs))
        return out

    def fused_step(
        self,
        loss_model: ModelProto,
        loss_name: str,
        weights: Sequence[str],
        learning_rate: BaseLearningRate,
        device: Device,
    ) -> tuple[ModelProto, FusedStepSignature]:
        """The fused step graph (:func:`~.._gradient.fused_step_from_gradients`) of
        :meth:`gradient_graph`: the same graph on every device."""
        gradients = self.gradient_graph(loss_model, loss_name, weights)
        step, signature = fused_step_from_gradients(gradients, loss_name, weights, learning_rate)
        sparse_embedding_updates(step, set(weights))  # embeddings' SGD: only the gathered rows
        return step, signature

    def forward_backward(
        self,
        model: ModelProto,
        weights: Sequence[str],
        inputs_requiring_grad: Sequence[str],
        device: Device,
        types: Mapping[str, int] | None = None,
        reuse_memory: bool = True,
        threads: int | None = None,
    ) -> TwoSessionRunner:
        """The forward/backward pair of ``model`` (weights as initializers) as two sessions per
        input shapes (see :class:`TwoSessionRunner`).

        Parameters
        ----------
        model : onnx.ModelProto
            The graph, weights as initializers.
        weights : sequence of str
            The trained weights, fed after the inputs in this order.
        inputs_requiring_grad : sequence of str
            The inputs whose gradient the backward returns too.
        device : Device
            Where it runs.
        types : mapping of str to int or None, default=None
            :func:`graph.value_types` of ``model``, when the caller has them.
        reuse_memory : bool, default=True
            Unused: the forward's outputs are its own buffers, never reused by the backward.
        threads : int or None, default=None
            The sessions' intra-op threads (None: onnxruntime's default).

        Returns
        -------
        TwoSessionRunner
            The pair, ready to run.

        Raises
        ------
        GraphNotDifferentiableError
            When an operator on the way has no rule, or a weight no gradient (``.weight``).
        """
        types = value_types(model) if types is None else types
        crossing = control_flow_weights(model, weights, types)
        if crossing:  # the same refusal as the training build's pair, naming weights and nodes
            raise control_flow_error(crossing, "onnxruntime could not build the forward/backward graphs")
        for out in model.graph.output:
            check_differentiable(model, weights, out.name, types)
            check_no_control_flow(model, [*weights, *inputs_requiring_grad], out.name)
        return TwoSessionRunner(model, list(weights), list(inputs_requiring_grad), device, threads, types)


def _opset(model: ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), MIN_GRADIENT_OPSET)


def with_gradient_opset(model: ModelProto) -> ModelProto:
    """A copy of ``model`` at opset 17 or more (onnx's version converter below it), IR <= 10,
    its batch-first recurrences time first (:func:`.rules.recurrent.time_major`), its SAME
    convolutions with explicit pads (onnxruntime 1.19 runs no SAME Conv with dilations)."""
    if _opset(model) < MIN_GRADIENT_OPSET:
        from onnx import version_converter

        out = version_converter.convert_version(model, MIN_GRADIENT_OPSET)
        _retype_converted_bounds(out, value_types(model))
    else:
        out = ModelProto()
        out.CopyFrom(model)
    out.ir_version = min(out.ir_version, MAX_IR_VERSION)
    time_major(out)
    return explicit_conv_pads(out)


def _retype_converted_bounds(model: ModelProto, types: Mapping[str, int]) -> None:
    """onnx's version converter writes Clip's bounds and Pad's value (attributes before opset
    11) as float32 Constants, in a float64 graph too (which then fails its checks): they take
    the type of the operand they bound."""
    constants = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    for node in model.graph.node:
        bounds = {"Clip": node.input[1:3], "Pad": node.input[2:3]}.get(node.op_type, [])
        wanted = types.get(node.input[0], onnx.TensorProto.FLOAT) if node.input else onnx.TensorProto.FLOAT
        for name in bounds:
            const = constants.get(name)
            if const is not None and const.attribute[0].t.data_type != wanted:
                value = onnx.numpy_helper.to_array(const.attribute[0].t)
                dtype = helper.tensor_dtype_to_np_dtype(wanted)
                const.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(value.astype(dtype), name))


def _check_reached(names: Sequence[str], grads: Mapping[str, str], target: str) -> None:
    for name in names:
        if name not in grads:
            raise GraphNotDifferentiableError(
                f"{name!r} gets no gradient: it reaches {target!r} only through values or "
                "operators that carry none (integers, comparisons, a Clip's bounds, indices); "
                "leave it out of weights_to_train",
                weight=name,
            )


def _value_info(name: str, like: str, info: StaticInfo) -> onnx.ValueInfoProto:
    """A value info typed and shaped as ``like`` (symbolic dimensions kept; onnx's checker wants
    a shape on graph inputs and outputs, a rank at least)."""
    dims = info.dims.get(like)
    return helper.make_tensor_value_info(
        name, info.types.get(like, onnx.TensorProto.FLOAT), None if dims is None else list(dims)
    )


@dataclass
class PairSpec:
    """The two graphs of one input shape set and where the backward's inputs come from.

    Attributes
    ----------
    forward, backward : onnx.ModelProto
        The forward (the model's outputs, then the saved values) and the backward (inputs: one
        gradient per differentiable output, then the saved values; outputs: the gradients).
    saved : list of (str, int)
        Per saved value after the seeds: ``('input', k)`` (the k-th feed), ``('output', k)``
        (the k-th forward output) or ``('saved', k)`` (the k-th extra forward output).
    """

    forward: ModelProto
    backward: ModelProto
    saved: list[tuple[str, int]]

    def __post_init__(self) -> None:
        # read once: a step's runs would otherwise walk the protobufs each time (25 us a step)
        self.forward_outputs = [o.name for o in self.forward.graph.output]
        self.backward_inputs = [i.name for i in self.backward.graph.input]
        self.backward_outputs = [o.name for o in self.backward.graph.output]


class TwoSessionRunner:
    """A forward/backward pair of plain inference sessions (:class:`~.._gradient.ForwardBackwardRunner`).

    The graphs are built, and their sessions made, per set of input shapes the first time it is
    fed: the reverse pass works on static shapes, so that a free batch dimension gets one pair per
    batch size seen, as the trainers' fixed batches do.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph, weights as initializers.
    weights, inputs_requiring_grad : list of str
        What the backward differentiates (fed after the inputs, in this order; inputs first).
    device : Device
        Where it runs.
    threads : int or None
        Intra-op threads of its sessions.
    types : mapping of str to int
        :func:`graph.value_types` of ``model``.

    Attributes
    ----------
    graphs : ForwardBackwardGraphs
        The pair's names; ``gradient_model`` is the joined graph (forward and backward, the
        outputs' gradients as inputs) of the first shapes built.
    session : onnxruntime InferenceSession
        The forward session of the first shapes built.
    """

    def __init__(
        self,
        model: ModelProto,
        weights: list[str],
        inputs_requiring_grad: list[str],
        device: Device,
        threads: int | None,
        types: Mapping[str, int],
    ) -> None:
        from ..graph import initializers_to_inputs

        self._model = with_gradient_opset(initializers_to_inputs(model, weights))
        self._device = device
        self._threads = threads
        self._differentiated = [*inputs_requiring_grad, *weights]
        inits = {i.name for i in model.graph.initializer}
        g = self._model.graph
        self._feed_names = [
            i.name for i in g.input if i.name not in weights and i.name not in inits
        ] + weights
        outputs = [o.name for o in g.output]
        # the outputs no differentiated value reaches take no gradient; the operators on the way
        # are checked here, before any session (the graphs themselves wait for fixed shapes)
        active = active_values(self._model, self._differentiated, outputs, types)
        checked_path(self._model, active)
        skipped = frozenset(k for k, o in enumerate(outputs) if o not in active)
        self.graphs = ForwardBackwardGraphs(
            gradient_model=self._model,
            input_names=self._feed_names[: len(self._feed_names) - len(weights)],
            output_names=outputs,
            weights=list(weights),
            input_grad_names=list(inputs_requiring_grad),
            fetch_names=[f"{n}_grad" for n in self._differentiated],
            non_differentiable_outputs=skipped,
        )
        self._specs: OrderedDict[tuple[tuple[int, ...], ...], tuple[PairSpec, object, object]] = OrderedDict()
        self.session: object = None
        declared = _declared_shapes(self._model, self._feed_names)
        if declared is not None:  # static already (the trainers' fixed batch): build now
            self._spec(declared)

    @property
    def sessions(self) -> list[object]:
        """The forward and backward sessions made so far (a pair per input shapes seen)."""
        return [s for _, forward, backward in self._specs.values() for s in (forward, backward)]

    # -- the protocol ------------------------------------------------------------------
    @staticmethod
    def new_state() -> dict[str, object]:
        """A fresh state: what a forward leaves for its backward."""
        return {}

    @staticmethod
    def vector(values: Sequence[object]) -> list[object]:
        """A list of ``values`` (OrtValues)."""
        return list(values)

    def run_forward(self, inputs: list[object], outputs: list[object], state: dict[str, object]) -> None:
        """Fills ``outputs`` (bound in place when it holds OrtValues already) from ``inputs``."""
        shapes = tuple(tuple(int(d) for d in v.shape()) for v in inputs)  # type: ignore[attr-defined]
        spec, forward, backward = self._spec(shapes)
        binding = io_binding(forward)
        for name, value in zip(self._feed_names, inputs):
            binding.bind_ortvalue_input(name, value)
        names = spec.forward_outputs
        n = len(self.graphs.output_names)
        for k, name in enumerate(names):
            if k < n and len(outputs) == n:
                binding.bind_ortvalue_output(name, outputs[k])
            else:
                binding.bind_output(name, self._device.ort_device)
        forward.run_with_iobinding(binding, None)  # type: ignore[attr-defined]
        got = binding.get_outputs()
        if len(outputs) != n:
            outputs[:] = [got[k] for k in range(n)]
        state.update(
            spec=spec,
            backward=backward,
            input=list(inputs),
            output=list(outputs),
            saved=[got[k] for k in range(n, len(names))],
        )

    def run_backward(self, output_grads: list[object], grads: list[object], state: dict[str, object]) -> None:
        """Fills ``grads`` (inputs requiring one, then weights) from one gradient per
        differentiable output, for the forward that left ``state``."""
        spec: PairSpec = state["spec"]  # type: ignore[assignment]
        backward = state["backward"]
        binding = io_binding(backward)
        names = spec.backward_inputs
        seeds = len(self.graphs.output_names) - len(self.graphs.non_differentiable_outputs)
        for name, value in zip(names[:seeds], output_grads):
            binding.bind_ortvalue_input(name, value)
        for name, (where, k) in zip(names[seeds:], spec.saved):
            binding.bind_ortvalue_input(name, state[where][k])  # type: ignore[index]
        fetches = spec.backward_outputs
        for k, name in enumerate(fetches):
            if len(grads) == len(fetches):
                binding.bind_ortvalue_output(name, grads[k])
            else:
                binding.bind_output(name, self._device.ort_device)
        backward.run_with_iobinding(binding, None)  # type: ignore[attr-defined]
        if len(grads) != len(fetches):
            got = binding.get_outputs()
            grads[:] = [got[k] for k in range(len(fetches))]

    # -- building ------------------------------------------------------------------------
    def _spec(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[PairSpec, object, object]:
        found = self._specs.get(shapes)
        if found is not None:
            self._specs.move_to_end(shapes)
        else:
            from .._binding import make_session

            spec, joined = split_pair(
                self._model, self._feed_names, shapes, self._differentiated, self.graphs
            )
            forward = make_session(spec.forward, self._device, threads=self._threads, reuse_memory=False)
            backward = make_session(spec.backward, self._device, threads=self._threads)
            found = self._specs[shapes] = (spec, forward, backward)
            while len(self._specs) > MAX_SHAPE_SETS:  # a pending backward keeps its own refs
                self._specs.popitem(last=False)
            if self.session is None:
                self.session = forward
                self.graphs.gradient_model = joined
        return found


def _declared_shapes(model: ModelProto, feeds: Sequence[str]) -> tuple[tuple[int, ...], ...] | None:
    declared = {i.name: i for i in model.graph.input}
    shapes = []
    for name in feeds:
        dims = declared[name].type.tensor_type.shape.dim
        if not all(d.HasField("dim_value") for d in dims):
            return None
        shapes.append(tuple(int(d.dim_value) for d in dims))
    return tuple(shapes)


def _fixed(model: ModelProto, feeds: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> ModelProto:
    """A copy of ``model`` whose feeds have ``shapes`` (the outputs' shapes left to inference)."""
    out = ModelProto()
    out.CopyFrom(model)
    by_name = dict(zip(feeds, shapes))
    for vi in out.graph.input:
        if vi.name in by_name:
            dims = vi.type.tensor_type.shape
            del dims.dim[:]
            for d in by_name[vi.name]:
                dims.dim.add().dim_value = d
    del out.graph.value_info[:]
    return out


def split_pair(
    model: ModelProto,
    feeds: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    differentiated: Sequence[str],
    graphs: ForwardBackwardGraphs,
) -> tuple[PairSpec, ModelProto]:
    """The forward and backward graphs of ``model`` for the feed ``shapes``, and the joined
    graph (forward and backward in one, the outputs' gradients as inputs)."""
    fwd = _fixed(model, feeds, shapes)
    info = static_info(fwd, differentiated)
    outputs = graphs.output_names
    seeded = [o for k, o in enumerate(outputs) if k not in graphs.non_differentiable_outputs]
    b = NodeBuilder(onnx.TensorProto.FLOAT, _opset(fwd), all_names(fwd), prefix="bw_")
    seeds = {o: b.name(f"{o}_grad_output") for o in seeded}
    grads = reverse_pass(fwd, seeds, differentiated, b, info)
    weights = set(graphs.weights)
    _check_reached([n for n in differentiated if n in weights], grads, "the outputs")
    fetches = graphs.fetch_names
    for name, fetch in zip(differentiated, fetches):
        if name in grads:
            b.nodes.append(helper.make_node("Identity", [grads[name]], [fetch], name=b.name("n_grad_out")))
        else:  # an input reaching no output: zeros, as torch's autograd.grad with allow_unused
            b.nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [fetch],
                    name=b.name("n_zero_grad"),
                    value=onnx.numpy_helper.from_array(
                        np.zeros(info.shapes[name], helper.tensor_dtype_to_np_dtype(info.types[name]))
                    ),
                )
            )
    nodes = live_nodes(b.nodes, fetches)
    seed_inputs = [_value_info(seeds[o], o, info) for o in seeded]
    grad_outputs = [_value_info(f, n, info) for n, f in zip(differentiated, fetches)]
    joined = ModelProto()
    joined.CopyFrom(fwd)
    joined.graph.node.extend(nodes)
    joined.graph.input.extend(seed_inputs)
    joined.graph.output.extend(grad_outputs)
    return _split(fwd, nodes, seed_inputs, grad_outputs, feeds, info), joined


def _split(
    fwd: ModelProto,
    nodes: Sequence[onnx.NodeProto],
    seed_inputs: Sequence[onnx.ValueInfoProto],
    grad_outputs: Sequence[onnx.ValueInfoProto],
    feeds: Sequence[str],
    info: StaticInfo,
) -> PairSpec:
    """The backward graph of ``nodes``: what they read from the forward becomes its inputs
    (feeds and forward outputs passed along, other values added as forward outputs), its
    constants and initializers copied."""
    made = {o for n in nodes for o in n.output} | {s.name for s in seed_inputs}
    read = [i for n in nodes for i in n.input if i and i not in made]
    inits = {i.name: i for i in fwd.graph.initializer}
    constants = {n.output[0]: n for n in fwd.graph.node if n.op_type == "Constant" and not n.input}
    outputs = [o.name for o in fwd.graph.output]
    feed_index = {f: k for k, f in enumerate(feeds)}
    copied_inits: list[onnx.TensorProto] = []
    copied_nodes: list[onnx.NodeProto] = []
    saved: list[tuple[str, int]] = []
    saved_inputs: list[onnx.ValueInfoProto] = []
    extra: list[str] = []
    for name in dict.fromkeys(read):
        if name in feed_index:
            saved.append(("input", feed_index[name]))
        elif name in outputs:
            saved.append(("output", outputs.index(name)))
        elif name in inits:
            copied_inits.append(inits[name])
            continue
        elif name in constants:
            copied_nodes.append(constants[name])
            continue
        else:
            saved.append(("saved", len(extra)))
            extra.append(name)
        saved_inputs.append(_value_info(name, name, info))
    forward = ModelProto()
    forward.CopyFrom(fwd)
    forward.graph.output.extend(_value_info(e, e, info) for e in extra)
    backward = helper.make_model(
        helper.make_graph(
            [*copied_nodes, *nodes],
            "backward",
            [*seed_inputs, *saved_inputs],
            list(grad_outputs),
            list(copied_inits),
        ),
        opset_imports=list(fwd.opset_import),
    )
    backward.ir_version = min(fwd.ir_version, MAX_IR_VERSION)
    return PairSpec(forward, backward, saved)
