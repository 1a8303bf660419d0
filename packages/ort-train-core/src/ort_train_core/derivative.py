"""The gradient graph of an ONNX graph as an ONNX model: onnxcustom's ``onnx_derivative``.

Built on the gradient room's seam (:func:`~._backends.get_backend`): the gradients of the
outputs weighted by their output gradients are the gradients of one scalar,
``sum_k ReduceSum(Y_k * Y_k_grad)``, which the backend differentiates like any loss (a
vector-Jacobian product). Only ``KeepYieldOp`` returns a form specific to onnxruntime-training
(its forward/backward graph joined by a ``YieldOp``).

Names, as in onnxcustom so that code written for it runs:

* the gradient of an input or weight ``A`` is the output ``A_grad``;
* the gradient fed for a float output ``O`` (``Zero``, ``KeepOutputs``) is the input ``O_grad``,
  or ``O_output_grad`` when ``O`` is also a graph input or an initializer (an output that passes
  an input or a weight through: ``O_grad`` names the gradient of that input or weight); when the
  name is already a value of the graph, ``_1``, ``_2``... is appended
  (:func:`~ort_train_core.graph.unique_name`). onnxruntime's gradient builder names the
  gradient of every value ``v`` on the way ``v_grad`` and refuses a graph that already has a
  value of that name.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from pathlib import Path

import onnx
from onnx import ModelProto, helper

from ._backends import get_backend
from ._builder import FLOAT_TYPES, NodeBuilder, unique_name
from ._gradient import GradientBackend
from ._runtime import Device
from .graph import (
    MAX_IR_VERSION,
    MIN_IR_VERSION,
    _copy,
    _opset,
    all_names,
    ancestors,
    differentiable_ancestors,
    float_initializers,
    infer_without_data,
    initializers_to_inputs,
    normalise_model,
    rename_value,
    value_types,
)


class DerivativeOptions(enum.IntFlag):
    """How :func:`onnx_derivative` builds the gradient graph (onnxcustom's names and values)."""

    #: Inputs are the graph's inputs, the weights and one gradient per float output (named as
    #: :func:`onnx_derivative` says); outputs are the gradients ``<name>_grad`` of the inputs
    #: and weights.
    Zero = 0
    #: onnxruntime-training's forward/backward graph, a ``YieldOp`` (com.microsoft) between
    #: the forward and the backward; not combinable.
    KeepYieldOp = 1
    #: The forward's outputs come first among the outputs.
    KeepOutputs = 2
    #: Every output gradient is ones (no gradient inputs); needs ``KeepOutputs``.
    FillGrad = 4
    #: The graph has a scalar loss output (``loss=``) and a label input (``label=``); outputs
    #: are the graph's outputs, then the gradients of the inputs (label excepted) and of the
    #: weights. Its value, 5, equals ``KeepYieldOp | FillGrad`` as in onnxcustom, and it
    #: combines with no other option (it keeps the outputs already).
    Loss = 5


def onnx_derivative(
    onx: ModelProto,
    weights: str | Sequence[str] | None = None,
    inputs: str | Sequence[str] | None = None,
    options: DerivativeOptions = DerivativeOptions.Zero,
    loss: str | None = None,
    label: str | Iterable[str] | None = None,
    path_name: str | Path | None = None,
    backend: str | None = None,
) -> ModelProto:
    """The gradient graph of an ONNX graph, as onnxcustom's function of the same name.

    A valid ONNX model: com.microsoft gradient operators with the ``'onnxruntime-training'``
    backend (an onnxruntime-training session runs it), default-domain ones with ``'onnx'`` (any
    onnxruntime runs it). The graph is normalised first, as for the trainers (opset 9 or 10 and
    IR 3 work). Names are onnxcustom's (see the module's notes): ``A_grad`` is the gradient of ``A``.

    Parameters
    ----------
    onx : onnx.ModelProto
        The graph.
    weights, inputs : str, sequence of str or None, default=None
        The initializers (inputs after the graph's own) and graph inputs to differentiate; a
        string is one name. None: every float initializer, and input but the label, that a
        differentiated output depends on through float values and operators with a gradient.
    options : DerivativeOptions, default=DerivativeOptions.Zero
        What the graph takes and gives (see :class:`DerivativeOptions`).
    loss, label : str, optional
        With ``options=DerivativeOptions.Loss`` only: the loss output (one element) and the
        label input(s).
    path_name : str or Path, optional
        Where to save the result too (onnxcustom required it for ``Loss``).
    backend : {'onnx', 'onnxruntime-training'} or None, default=None
        The gradient backend that writes the reverse pass; None: ``$ORT_TRAIN_BACKEND``, else
        the training build when it is installed, else ``'onnx'``.

    Returns
    -------
    onnx.ModelProto
        The gradient graph.

    Raises
    ------
    TypeError
        ``options`` is not a :class:`DerivativeOptions`, ``weights``/``inputs`` not strings.
    ValueError
        Unknown, repeated or gradient-less names (or in both lists), nothing to differentiate,
        incompatible options or ``Loss`` arguments, a loss that is not a scalar; an operator
        without a gradient on the way (:class:`~ort_train_core.GraphNotDifferentiableError`).

    Examples
    --------
    >>> grad = onnx_derivative(model)  # doctest: +SKIP
    >>> sess = onnxruntime.InferenceSession(grad.SerializeToString())  # doctest: +SKIP
    """
    result = _derivative(onx, weights, inputs, options, loss, label, backend)
    if path_name is not None:
        onnx.save(result, str(path_name))
    return result


def _derivative(
    onx: ModelProto,
    weights: str | Sequence[str] | None,
    inputs: str | Sequence[str] | None,
    options: DerivativeOptions,
    loss: str | None,
    label: str | Iterable[str] | None,
    backend: str | None,
) -> ModelProto:
    """:func:`onnx_derivative`'s graph: the arguments checked, the backend chosen."""
    _check_options(options, loss, label)
    gradients = get_backend(backend)
    weight_names, input_names = _name_list(weights, "weights"), _name_list(inputs, "inputs")
    model = normalise_model(onx)
    if options == DerivativeOptions.Loss:
        return _loss_derivative(model, weight_names, input_names, loss, label, gradients)
    return _output_derivative(model, weight_names, input_names, options, gradients)


def _name_list(names: str | Sequence[str] | None, what: str) -> list[str] | None:
    """``weights=``/``inputs=`` as a list of distinct names: a string is one name (iterating
    it would give its letters), a repeated name is refused (onnxruntime would fail on a
    duplicate definition of its gradient)."""
    if names is None:
        return None
    listed = [names] if isinstance(names, str) else list(names)
    wrong = [n for n in listed if not isinstance(n, str)]
    if wrong:
        raise TypeError(f"{what}= must be a str or a sequence of str; got {wrong!r} among them")
    seen: set[str] = set()
    for name in listed:
        if name in seen:
            raise ValueError(f"{what}= names {name!r} more than once; name each once")
        seen.add(name)
    return listed


def _check_options(options: DerivativeOptions, loss: str | None, label: str | Iterable[str] | None) -> None:
    """Refuses what is not a DerivativeOptions and the combinations onnxcustom refuses, with
    the reason."""
    if not isinstance(options, DerivativeOptions):
        raise TypeError(
            f"options must be a DerivativeOptions (e.g. DerivativeOptions.Zero), not {type(options).__name__}"
        )
    if options == DerivativeOptions.Loss:
        return
    loss_bits = int(DerivativeOptions.Loss)  # ints: mypy reads the members as disjoint literals
    if int(options) & loss_bits == loss_bits:
        # Loss = KeepYieldOp | FillGrad (onnxcustom's values), so Loss | KeepOutputs (7) is
        # KeepYieldOp | KeepOutputs | FillGrad: onnxcustom takes it for the latter and refuses it
        # (KeepYieldOp combines with nothing); Loss keeps the outputs already, so nothing is lost
        raise ValueError(
            f"options={int(options)} (DerivativeOptions.Loss | KeepOutputs, the same value as "
            "KeepYieldOp | KeepOutputs | FillGrad) is not valid: Loss combines with no other option "
            "and KeepYieldOp neither. Loss already keeps the graph's outputs: pass "
            "options=DerivativeOptions.Loss"
        )
    if loss is not None or label is not None:
        raise ValueError(
            f"loss= and label= are only for options=DerivativeOptions.Loss (alone); got options={options!r}"
        )
    if options & DerivativeOptions.KeepYieldOp and options != DerivativeOptions.KeepYieldOp:
        raise ValueError("DerivativeOptions.KeepYieldOp cannot be combined with other options")
    if options & DerivativeOptions.FillGrad and not options & DerivativeOptions.KeepOutputs:
        raise ValueError(
            "DerivativeOptions.FillGrad needs DerivativeOptions.KeepOutputs (FillGrad | KeepOutputs)"
        )


def _float_outputs(model: ModelProto) -> list[str]:
    return [o.name for o in model.graph.output if o.type.tensor_type.elem_type in FLOAT_TYPES]


def _names(
    model: ModelProto,
    weights: list[str] | None,
    inputs: list[str] | None,
    outputs: list[str],
    skip: set[str],
) -> tuple[list[str], list[str]]:
    """The checked inputs and weights to differentiate (defaults: see :func:`onnx_derivative`)."""
    types = value_types(model)
    floats = float_initializers(model)
    deps, _ = differentiable_ancestors(model, outputs, types)
    graph_inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    if inputs is not None:
        bad = [n for n in inputs if graph_inputs.get(n) not in FLOAT_TYPES or n in skip]
        if bad:
            raise ValueError(
                f"inputs {bad} are not float inputs of the graph (label excepted); pick among "
                f"{sorted(n for n, t in graph_inputs.items() if t in FLOAT_TYPES and n not in skip)}"
            )
        _check_reachable(model, inputs, deps, outputs, "inputs")
    if weights is None:
        # an IR-3 initializer is a graph input too: one named in inputs= is not a weight as well
        taken = set(inputs or ())
        weights = [name for name in floats if name in deps and name not in taken]
    else:
        unknown = [w for w in weights if w not in floats]
        if unknown:
            raise ValueError(
                f"weights {unknown} are not float initializers of the graph; pick among {sorted(floats)}"
            )
        both = [w for w in weights if w in (inputs or ())]
        if both:
            raise ValueError(f"{both} named in both weights= and inputs=; name each in one of them")
        _check_reachable(model, weights, deps, outputs, "weights")
    if inputs is None:
        inputs = [
            n
            for n, t in graph_inputs.items()
            if t in FLOAT_TYPES and n not in skip and n not in floats and n in deps
        ]
    if not inputs and not weights:
        raise ValueError(
            f"nothing to differentiate: no input and no weight carries a gradient to the outputs "
            f"{outputs} (weights={weights}, inputs={inputs})"
        )
    return inputs, weights


def _check_reachable(
    model: ModelProto, names: list[str], deps: set[str], outputs: list[str], what: str
) -> None:
    """Refuses names with no gradient (onnxruntime's own errors, "U couldn't find the consumer
    node" or "'Z' is unreachable", name neither the argument nor the reason)."""
    dead = [n for n in names if n not in deps]
    if not dead:
        return
    read = {x for node in model.graph.node for x in node.input}
    # which outputs (float or not) each name reaches at all, to tell "unused" from "no gradient"
    every = [o.name for o in model.graph.output]
    reach = {o: ancestors(model, [o])[0] for o in every}
    reasons = []
    for name in dead:
        reached = [o for o in every if name in reach[o]]
        if name not in read and not reached:
            reasons.append(f"{name!r} is used by no node")
        elif not reached:
            reasons.append(f"{name!r} reaches no output")
        else:
            reasons.append(
                f"{name!r} reaches the outputs {reached} only through values or operators that carry "
                "no gradient (integers, Shape, comparisons, indices...)"
            )
    raise ValueError(f"{what} {dead} carry no gradient: {'; '.join(reasons)}; leave them out")


def _output_derivative(
    model: ModelProto,
    weights: list[str] | None,
    inputs: list[str] | None,
    options: DerivativeOptions,
    backend: GradientBackend,
) -> ModelProto:
    outputs = _float_outputs(model)
    if not outputs:
        raise ValueError("the graph has no float output to differentiate")
    names, weights = _names(model, weights, inputs, outputs, set())
    if options == DerivativeOptions.KeepYieldOp:
        runner = backend.forward_backward(model, weights, names, Device("cpu"))
        return runner.graphs.gradient_model
    grads = [f"{n}_grad" for n in [*names, *weights]]
    fill = bool(options & DerivativeOptions.FillGrad)
    public = {} if fill else _seed_names(model, outputs, grads)
    moved = initializers_to_inputs(model, weights)
    seeded, loss_name, seeds = _seeded_sum(moved, outputs, public)
    grad = backend.gradient_graph(seeded, loss_name, [*names, *weights])
    kept = [o.name for o in model.graph.output] if options & DerivativeOptions.KeepOutputs else []
    return _finish(grad, grads, kept, seeds, [i.name for i in seeded.graph.input])


def _seed_names(model: ModelProto, outputs: list[str], grads: list[str]) -> dict[str, str]:
    """The public name of each output's gradient input (the rule :func:`onnx_derivative`
    documents): ``<O>_grad``, ``<O>_output_grad`` when ``O`` is a graph input or an initializer,
    numbered when a value of the graph or a gradient output has the name already."""
    sources = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    taken = all_names(model) | set(grads)
    return {o: unique_name(f"{o}_output_grad" if o in sources else f"{o}_grad", taken) for o in outputs}


def _seeded_sum(
    model: ModelProto, outputs: list[str], public: dict[str, str]
) -> tuple[ModelProto, str, dict[str, str]]:
    """``model`` with a scalar output whose gradient is the vector-Jacobian product: the sum of
    ``ReduceSum(Y * seed)`` over the float outputs (``ReduceSum(Y)`` when ``public`` is empty,
    the seed being ones), the seeds new inputs; the map {public name: seed input}."""
    model = _copy(model)
    types = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    elem = types[outputs[0]]
    b = NodeBuilder(elem, _opset(model), all_names(model), prefix="vjp_")
    seeds: dict[str, str] = {}
    terms = []
    for name in outputs:
        value = name
        if public:
            seed = b.name(f"{name}_seed")
            out = next(o for o in model.graph.output if o.name == name)
            model.graph.input.append(helper.make_value_info(seed, out.type))
            seeds[public[name]] = seed
            value = b.op("Mul", [name, seed], f"{name}_weighted")
        total = b.sum_all(value, f"{name}_sum")
        terms.append(total if types[name] == elem else b.cast(total))
    loss = terms[0]
    for term in terms[1:]:
        loss = b.op("Add", [loss, term], "vjp_total")
    model.graph.node.extend(b.nodes)
    model.graph.output.append(helper.make_tensor_value_info(loss, elem, []))
    return model, loss, seeds


def _finish(
    grad: ModelProto, grads: list[str], kept: list[str], seeds: dict[str, str], graph_inputs: list[str]
) -> ModelProto:
    """The gradient graph with the outputs ``kept + grads``, only the nodes they need, every
    graph input kept (in order) and the seeds given their public names."""
    out = _copy(grad)
    g = out.graph
    wanted = [*kept, *grads]
    _, nodes = ancestors(out, wanted)
    by_name = {o.name: o for o in g.output}
    inputs = {i.name: i for i in g.input}
    kept_nodes = [n for k, n in enumerate(g.node) if k in nodes]
    del g.node[:], g.output[:], g.input[:]
    g.node.extend(kept_nodes)
    g.output.extend(by_name[o] for o in wanted)
    g.input.extend(inputs[i] for i in graph_inputs)
    taken = all_names(out) | set(wanted)
    for public, seed in seeds.items():
        # a public name is never a gradient output nor a value of the forward graph (see
        # _seed_names), only the backend's own gradient of an output that feeds another one
        if public in taken:
            rename_value(out, public, unique_name(f"{public}_inner", taken))
        rename_value(out, seed, public)
    used = {x for n in g.node for x in n.input}
    kept_inits = [i for i in g.initializer if i.name in used]
    del g.initializer[:], g.value_info[:]
    g.initializer.extend(kept_inits)
    out.ir_version = min(max(out.ir_version, MIN_IR_VERSION), MAX_IR_VERSION)
    return out


def _loss_derivative(
    model: ModelProto,
    weights: list[str] | None,
    inputs: list[str] | None,
    loss: str | None,
    label: str | Iterable[str] | None,
    backend: GradientBackend,
) -> ModelProto:
    outputs = [o.name for o in model.graph.output]
    if loss is None or not isinstance(loss, str):
        raise ValueError("options=DerivativeOptions.Loss needs loss=<the name of the loss output>")
    if loss not in outputs:
        raise ValueError(f"loss {loss!r} is not an output of the graph; its outputs: {outputs}")
    if label is None:
        raise ValueError("options=DerivativeOptions.Loss needs label=<the name of the label input>")
    labels = {label} if isinstance(label, str) else set(label)
    graph_inputs = [i.name for i in model.graph.input]
    missing = sorted(labels - set(graph_inputs))
    if missing:
        raise ValueError(f"label {missing} is not an input of the graph; its inputs: {graph_inputs}")
    _check_scalar(model, loss)
    names, weights = _names(model, weights, inputs, [loss], labels)
    moved = initializers_to_inputs(model, weights)
    grads = [f"{n}_grad" for n in [*names, *weights]]
    grad = backend.gradient_graph(moved, loss, [*names, *weights])
    return _finish(grad, grads, outputs, {}, [i.name for i in moved.graph.input])


def _check_scalar(model: ModelProto, loss: str) -> None:
    """Refuses a loss output onnx declares or infers with more than one element: onnxruntime
    would differentiate the sum of its elements, or fail later on a shape ("FusedMatMul")."""
    inferred = infer_without_data(model)
    declared = next(o for o in model.graph.output if o.name == loss)
    candidates = [declared, *(o for o in (inferred.output if inferred else []) if o.name == loss)]
    for value in candidates:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue  # rank unknown: onnxruntime decides
        # None for a dimension without a value (onnx's inference names them unk__0, unk__1...)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if any(d != 1 for d in dims):
            raise ValueError(
                f"loss must be a scalar output: {loss!r} has the shape {dims}; reduce it "
                "(ReduceMean, ReduceSum) or name the scalar output in loss="
            )
