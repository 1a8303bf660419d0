"""The gradient graph of an ONNX graph as an ONNX model: onnxcustom's ``onnx_derivative``.

Built on the gradient room's seam (:func:`~._gradient.default_backend`): the gradients of the
outputs weighted by their output gradients are the gradients of one scalar,
``sum_k ReduceSum(Y_k * Y_k_grad)``, which the backend differentiates like any loss (a
vector-Jacobian product). Only ``KeepYieldOp`` returns a form specific to onnxruntime-training
(its forward/backward graph joined by a ``YieldOp``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from pathlib import Path

import onnx
from onnx import ModelProto, helper

from ._builder import FLOAT_TYPES, NodeBuilder, unique_name
from ._gradient import default_backend
from ._runtime import Device
from .graph import (
    MAX_IR_VERSION,
    _copy,
    _opset,
    all_names,
    ancestors,
    differentiable_ancestors,
    float_initializers,
    initializers_to_inputs,
    value_types,
)


class DerivativeOptions(enum.IntFlag):
    """How :func:`onnx_derivative` builds the gradient graph (onnxcustom's names and values).

    * ``Zero``: inputs are the graph's inputs, the weights and one gradient ``<output>_grad``
      per float output; outputs are the gradients ``<name>_grad`` of the inputs and weights.
    * ``KeepYieldOp``: onnxruntime-training's forward/backward graph, a ``YieldOp``
      (com.microsoft) between the forward and the backward; not combinable.
    * ``KeepOutputs``: the forward's outputs come first among the outputs.
    * ``FillGrad``: every output gradient is ones (no gradient inputs); needs ``KeepOutputs``.
    * ``Loss``: the graph has a scalar loss output (``loss=``) and a label input (``label=``);
      outputs are the graph's outputs, then the gradients of the inputs (label excepted) and
      of the weights. Its value, 5, equals ``KeepYieldOp | FillGrad`` as in onnxcustom.
    """

    Zero = 0
    KeepYieldOp = 1
    KeepOutputs = 2
    FillGrad = 4
    Loss = 5


def onnx_derivative(
    onx: ModelProto,
    weights: Sequence[str] | None = None,
    inputs: Sequence[str] | None = None,
    options: DerivativeOptions = DerivativeOptions.Zero,
    loss: str | None = None,
    label: str | Iterable[str] | None = None,
    path_name: str | Path | None = None,
) -> ModelProto:
    """The gradient graph of an ONNX graph, as onnxcustom's function of the same name.

    The result is a valid ONNX model (IR version <= 10) that an onnxruntime-training
    ``InferenceSession`` runs; it holds com.microsoft gradient operators (``SoftmaxGrad``,
    ``ReluGrad``...), so stock onnxruntime may not run it. Gradient outputs are named
    ``<name>_grad`` after their input or weight, and the gradient inputs of ``Zero``
    ``<output>_grad`` after their output, as in onnxcustom, so code written for it runs.

    Parameters
    ----------
    onx : onnx.ModelProto
        The graph.
    weights : sequence of str or None, default=None
        The initializers to differentiate (they become inputs, after the graph's own); None:
        every float initializer a float output depends on through float values.
    inputs : sequence of str or None, default=None
        The graph inputs to differentiate; None: every float input (the label excepted).
    options : DerivativeOptions, default=DerivativeOptions.Zero
        What the graph takes and gives (see :class:`DerivativeOptions`).
    loss, label : str, optional
        With ``options=DerivativeOptions.Loss`` only: the loss output and the label input(s).
    path_name : str or Path, optional
        Where to save the result as well (onnxcustom required it for ``Loss``).

    Returns
    -------
    onnx.ModelProto
        The gradient graph.

    Raises
    ------
    TypeError
        When ``options`` is not a :class:`DerivativeOptions`.
    ValueError
        For an unknown weight or input name, incompatible options, ``Loss`` without ``loss``
        or ``label``, or ``loss``/``label`` without ``Loss``.
    GraphNotDifferentiableError
        When an operator on the way has no gradient.

    Examples
    --------
    >>> grad = onnx_derivative(model)  # doctest: +SKIP
    >>> sess = onnxruntime.InferenceSession(grad.SerializeToString())  # doctest: +SKIP
    >>> x_grad, w_grad = sess.run(None, {"X": x, "W": w, "Y_grad": dy})  # doctest: +SKIP
    """
    if not isinstance(options, DerivativeOptions):
        raise TypeError(
            f"options must be a DerivativeOptions (e.g. DerivativeOptions.Zero), not {type(options).__name__}"
        )
    if options == DerivativeOptions.Loss:
        result = _loss_derivative(onx, weights, inputs, loss, label)
    else:
        if loss is not None or label is not None:
            raise ValueError("loss= and label= are only for options=DerivativeOptions.Loss")
        if options & DerivativeOptions.KeepYieldOp and options != DerivativeOptions.KeepYieldOp:
            raise ValueError("DerivativeOptions.KeepYieldOp cannot be combined with other options")
        if options & DerivativeOptions.FillGrad and not options & DerivativeOptions.KeepOutputs:
            raise ValueError(
                "DerivativeOptions.FillGrad needs DerivativeOptions.KeepOutputs (FillGrad | KeepOutputs)"
            )
        result = _output_derivative(onx, weights, inputs, options)
    if path_name is not None:
        onnx.save(result, str(path_name))
    return result


def _float_outputs(model: ModelProto) -> list[str]:
    return [o.name for o in model.graph.output if o.type.tensor_type.elem_type in FLOAT_TYPES]


def _names(
    model: ModelProto,
    weights: Sequence[str] | None,
    inputs: Sequence[str] | None,
    outputs: list[str],
    skip: set[str],
) -> tuple[list[str], list[str]]:
    """The checked inputs and weights to differentiate (defaults: see :func:`onnx_derivative`)."""
    types = value_types(model)
    floats = float_initializers(model)
    if weights is None:
        deps, _ = differentiable_ancestors(model, outputs, types)
        weights = [name for name in floats if name in deps]
    unknown = [w for w in weights if w not in floats]
    if unknown:
        raise ValueError(
            f"weights {unknown} are not float initializers of the graph; pick among {sorted(floats)}"
        )
    graph_inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    if inputs is None:
        inputs = [
            n for n, t in graph_inputs.items() if t in FLOAT_TYPES and n not in skip and n not in floats
        ]
    bad = [n for n in inputs if graph_inputs.get(n) not in FLOAT_TYPES or n in skip]
    if bad:
        raise ValueError(
            f"inputs {bad} are not float inputs of the graph (label excepted); pick among "
            f"{sorted(n for n, t in graph_inputs.items() if t in FLOAT_TYPES and n not in skip)}"
        )
    return list(inputs), list(weights)


def _output_derivative(
    onx: ModelProto, weights: Sequence[str] | None, inputs: Sequence[str] | None, options: DerivativeOptions
) -> ModelProto:
    outputs = _float_outputs(onx)
    if not outputs:
        raise ValueError("the graph has no float output to differentiate")
    names, weights = _names(onx, weights, inputs, outputs, set())
    if options == DerivativeOptions.KeepYieldOp:
        runner = default_backend().forward_backward(onx, weights, names, Device("cpu"))
        return runner.graphs.gradient_model
    model = initializers_to_inputs(onx, weights)
    fill = bool(options & DerivativeOptions.FillGrad)
    seeded, loss_name, seeds = _seeded_sum(model, outputs, fill)
    grad = default_backend().gradient_graph(seeded, loss_name, [*names, *weights])
    kept = [o.name for o in onx.graph.output] if options & DerivativeOptions.KeepOutputs else []
    return _finish(grad, [*names, *weights], kept, seeds, [i.name for i in seeded.graph.input])


def _seeded_sum(model: ModelProto, outputs: list[str], fill: bool) -> tuple[ModelProto, str, dict[str, str]]:
    """``model`` with a scalar output whose gradient is the vector-Jacobian product: the sum of
    ``ReduceSum(Y * seed)`` over the float outputs (``ReduceSum(Y)`` when ``fill``, the seed
    being ones), the seeds new inputs; the map {public name ``<Y>_grad``: seed input}."""
    model = _copy(model)
    types = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    elem = types[outputs[0]]
    b = NodeBuilder(elem, _opset(model), all_names(model), prefix="vjp_")
    seeds: dict[str, str] = {}
    terms = []
    for name in outputs:
        value = name
        if not fill:
            seed = b.name(f"{name}_seed")
            out = next(o for o in model.graph.output if o.name == name)
            model.graph.input.append(helper.make_value_info(seed, out.type))
            seeds[f"{name}_grad"] = seed
            value = b.op("Mul", [name, seed], f"{name}_weighted")
        total = b.sum_all(value, f"{name}_sum")
        terms.append(total if types[name] == elem else b.cast(total))
    loss = terms[0]
    for term in terms[1:]:
        loss = b.op("Add", [loss, term], "vjp_total")
    model.graph.node.extend(b.nodes)
    model.graph.output.append(helper.make_tensor_value_info(loss, elem, []))
    return model, loss, seeds


def _rename(model: ModelProto, old: str, new: str) -> None:
    """Renames a value of the main graph (node inputs and outputs, graph inputs and outputs)."""
    g = model.graph
    for node in g.node:
        node.input[:] = [new if x == old else x for x in node.input]
        node.output[:] = [new if x == old else x for x in node.output]
    for v in [*g.input, *g.output, *g.value_info]:
        if v.name == old:
            v.name = new


def _finish(
    grad: ModelProto, names: list[str], kept: list[str], seeds: dict[str, str], graph_inputs: list[str]
) -> ModelProto:
    """The gradient graph with the outputs ``kept + <name>_grad``, only the nodes they need,
    every graph input kept (in order) and the seeds renamed ``<output>_grad``."""
    out = _copy(grad)
    g = out.graph
    wanted = [*kept, *(f"{n}_grad" for n in names)]
    _, nodes = ancestors(out, wanted)
    by_name = {o.name: o for o in g.output}
    inputs = {i.name: i for i in g.input}
    kept_nodes = [n for k, n in enumerate(g.node) if k in nodes]
    del g.node[:], g.output[:], g.input[:]
    g.node.extend(kept_nodes)
    g.output.extend(by_name[o] for o in wanted)
    g.input.extend(inputs[i] for i in graph_inputs)
    taken = all_names(out)
    for public, seed in seeds.items():
        if public in taken:  # the backend's own gradient of that output: a fresh name
            _rename(out, public, unique_name(f"{public}_inner", taken))
        _rename(out, seed, public)
    used = {x for n in g.node for x in n.input}
    kept_inits = [i for i in g.initializer if i.name in used]
    del g.initializer[:], g.value_info[:]
    g.initializer.extend(kept_inits)
    out.ir_version = min(out.ir_version, MAX_IR_VERSION)
    return out


def _loss_derivative(
    onx: ModelProto,
    weights: Sequence[str] | None,
    inputs: Sequence[str] | None,
    loss: str | None,
    label: str | Iterable[str] | None,
) -> ModelProto:
    outputs = [o.name for o in onx.graph.output]
    if loss is None or not isinstance(loss, str):
        raise ValueError("options=DerivativeOptions.Loss needs loss=<the name of the loss output>")
    if loss not in outputs:
        raise ValueError(f"loss {loss!r} is not an output of the graph; its outputs: {outputs}")
    if label is None:
        raise ValueError("options=DerivativeOptions.Loss needs label=<the name of the label input>")
    labels = {label} if isinstance(label, str) else set(label)
    graph_inputs = [i.name for i in onx.graph.input]
    missing = sorted(labels - set(graph_inputs))
    if missing:
        raise ValueError(f"label {missing} is not an input of the graph; its inputs: {graph_inputs}")
    names, weights = _names(onx, weights, inputs, [loss], labels)
    model = initializers_to_inputs(onx, weights)
    grad = default_backend().gradient_graph(model, loss, [*names, *weights])
    return _finish(grad, [*names, *weights], outputs, {}, [i.name for i in model.graph.input])
