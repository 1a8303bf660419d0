"""Parameters a torch exporter folded into copies or dropped, found in the graph (issue 26,
items 2 and 4).

- Folded copies: the dynamo exporter writes a tied weight (GPT-2's output layer, tied to the
  token embedding) as a second, pre-transposed initializer, and can fold a Slice or a Reshape
  of a parameter into another one. Trained, the copy and the original move apart where torch
  trains one tensor (:func:`folded_copies`). The values decide: a trained initializer equal to
  a Transpose, a Reshape or a leading Slice of another trained one. Equal values alone are not
  enough (deep-copied layers hold equal parameters): an exact copy counts only when the
  exporter made it (dynamo's ``folded_from`` tag, a TorchScript ``onnx::`` name).
- Dropped parameters: the dynamo exporter leaves out a bias that is all zeros (a fresh
  MultiheadAttention's ``out_proj.bias``, a zero-initialised Conv bias), which then stays zero
  where torch trains it (:func:`dropped_parameters`). Its graph signature (model metadata)
  lists torch's parameters and each node's ``fx_node`` metadata the parameters it read.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, numpy_helper

from ._builder import FLOAT_TYPES

INPUT_SPEC_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
_SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
_FX_NODE = "pkg.torch.onnx.fx_node"
#: a parameter line of the exported program's graph signature: placeholder and torch name
_SIGNATURE_PARAMETER = re.compile(r"^\s*(\w+): PARAMETER target='([^']+)'", re.MULTILINE)
_FX_ARGUMENT = re.compile(r"%(\w+)")
#: a tensor of fewer distinct values (zeros, ones, an identity matrix, a 0/-inf mask) equals
#: slices and transposes of many others by construction: no sign of a folded copy
_MIN_DISTINCT = 3
#: transposes of tensors up to this rank are tried (every axis permutation)
_MAX_TRANSPOSE_RANK = 4
#: tensors sharing a comparison key beyond this many are structured values, not copies
_MAX_GROUP = 64


def value_metadata(model: ModelProto, outputs: bool = True) -> dict[str, dict[str, str]]:
    """The metadata of each value the graph declares (inputs, value infos, and outputs unless
    ``outputs=False``): where the torch exporters write what they know of a tensor."""
    g = model.graph
    values = [*g.input, *g.value_info, *(g.output if outputs else [])]
    return {v.name: {p.key: p.value for p in v.metadata_props} for v in values}


def literal_list(text: str) -> list[str]:
    """A list the exporter wrote as Python text (``"['a', 'b']"``); [] when it is not one."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _exporter_made(name: str, tags: dict[str, str]) -> bool:
    """Whether the exporter created the tensor (folded it) rather than holding a parameter."""
    return FOLDED_FROM in tags or name.startswith("onnx::")


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _relation(copy: np.ndarray, original: np.ndarray) -> str | None:
    """How ``copy`` is made from ``original`` (same element type), or None."""
    if copy.size == original.size:
        if copy.shape == original.shape and np.array_equal(copy, original):
            return "an exact copy"
        if copy.ndim == original.ndim and copy.ndim <= _MAX_TRANSPOSE_RANK:
            for perm in itertools.permutations(range(original.ndim)):
                moved = tuple(original.shape[p] for p in perm)
                if (
                    perm != tuple(range(original.ndim))
                    and moved == copy.shape
                    and np.array_equal(copy, original.transpose(perm))
                ):
                    return f"transposed (perm={list(perm)})"
        if copy.shape != original.shape and np.array_equal(copy.ravel(), original.ravel()):
            return f"reshaped to {list(copy.shape)}"
        return None
    c, o = _squeezed(copy.shape), _squeezed(original.shape)
    if len(c) == len(o) and all(a <= b for a, b in zip(c, o)):
        block = original.reshape(o)[tuple(slice(0, a) for a in c)]
        if np.array_equal(block, copy.reshape(c)):
            return f"sliced to its leading {list(copy.shape)} block"
    return None


def _candidates(model: ModelProto, weights: Iterable[str]) -> dict[str, np.ndarray]:
    """The trained float initializers with enough elements to tell a copy from a coincidence."""
    names = set(weights)
    return {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if init.name in names and init.data_type in FLOAT_TYPES and math.prod(init.dims) >= _MIN_DISTINCT
    }


#: below this many elements, Python's min, max and set cost less than numpy's reductions
_SMALL = 64


def _range(a: np.ndarray) -> tuple[float, float] | None:
    """The minimum and maximum, None for fewer than three distinct values (zeros, ones, an
    identity matrix, a 0/-inf mask) or NaN; linear time."""
    if a.size <= _SMALL:
        values = a.ravel().tolist()
        low, high = min(values), max(values)
        return (low, high) if low < high and len(set(values)) >= _MIN_DISTINCT else None
    low, high = a.min(), a.max()
    if not (low < high and bool(np.any((a > low) & (a < high)))):
        return None
    return float(low), float(high)


def _groups(arrays: dict[str, np.ndarray]) -> list[list[str]]:
    """Groups of tensors worth comparing pairwise: same element count, minimum and maximum
    (Transpose, Reshape, copy), or same squeezed rank and leading two values (a leading Slice).
    A large group (structured values) is split by its sorted values, and left out where it
    stays large (slices, a hundred copies of one tensor): the comparisons must stay linear."""
    by_stats: dict[tuple[object, ...], list[str]] = {}
    by_head: dict[tuple[object, ...], list[str]] = {}
    for name, a in arrays.items():
        bounds = _range(a)
        if bounds is None:
            continue
        by_stats.setdefault((a.dtype.str, a.size, *bounds), []).append(name)
        by_head.setdefault((a.dtype.str, len(_squeezed(a.shape)), a.ravel()[:2].tobytes()), []).append(name)
    groups = [g for g in by_head.values() if 1 < len(g) <= _MAX_GROUP]
    for group in by_stats.values():
        if len(group) <= _MAX_GROUP:
            groups.append(group)
            continue
        split: dict[bytes, list[str]] = {}
        for name in group:
            split.setdefault(np.sort(arrays[name], axis=None).tobytes(), []).append(name)
        groups.extend(g for g in split.values() if len(g) <= _MAX_GROUP)
    return [g for g in groups if len(g) > 1]


def _pairs(arrays: dict[str, np.ndarray]) -> Iterable[tuple[str, str]]:
    """Each pair of a group of :func:`_groups` once, the smaller tensor (a slice) first, else
    the one the exporter made."""
    seen: set[frozenset[str]] = set()
    for group in _groups(arrays):
        for a, b in itertools.combinations(group, 2):
            if frozenset((a, b)) not in seen:
                seen.add(frozenset((a, b)))
                yield (a, b) if arrays[a].size <= arrays[b].size else (b, a)


def folded_copies(model: ModelProto, weights: Sequence[str]) -> list[tuple[str, str, str]]:
    """Trained float initializers that hold a Transpose, Reshape or leading Slice of another
    trained one (or an exporter-made copy of it): training moves the two apart.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.
    weights : sequence of str
        The trained initializers.

    Returns
    -------
    list of (str, str, str)
        ``(copy, original, how)`` for each pair found.
    """
    arrays = _candidates(model, weights)
    tags = value_metadata(model)
    found = []
    for a, b in _pairs(arrays):
        ta, tb = tags.get(a, {}), tags.get(b, {})
        if ta.get(INPUT_SPEC_KIND) == tb.get(INPUT_SPEC_KIND) == "PARAMETER":
            continue  # two torch parameters: equal by the user's choice
        # the smaller is the slice; of equal sizes, the one the exporter made, else the later
        first = arrays[a].size < arrays[b].size or (_exporter_made(a, ta) and not _exporter_made(b, tb))
        copy, original = (a, b) if first else (b, a)
        how = _relation(arrays[copy], arrays[original])
        if how is None:
            continue
        if how == "an exact copy" and not _exporter_made(copy, tags.get(copy, {})):
            continue  # deep-copied layers hold equal, distinct parameters
        found.append((copy, original, how))
    return found


def _folded_sources(model: ModelProto) -> dict[str, set[str]]:
    """The values dynamo folded from others (``folded_from``), with their sources."""
    out: dict[str, set[str]] = {}
    for name, tags in value_metadata(model).items():
        try:
            value = ast.literal_eval(tags.get(FOLDED_FROM, "None"))
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, list):
            out[name] = {str(v) for v in value}
    return out


def _walk(graph: GraphProto) -> Iterable[GraphProto]:
    """The graph and its nested subgraphs."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _walk(sub)


def _by_fx_node(graphs: Sequence[GraphProto]) -> dict[str, list[NodeProto]]:
    """The ONNX nodes made from each torch operation (the arguments of its ``fx_node`` text)."""
    out: dict[str, list[NodeProto]] = {}
    for graph in graphs:
        for node in graph.node:
            for prop in node.metadata_props:
                if prop.key == _FX_NODE and "](args" in prop.value:
                    out.setdefault(prop.value.split("](args", 1)[1], []).append(node)
    return out


def dropped_parameters(model: ModelProto) -> list[str]:
    """The torch parameters a dynamo export read but holds nowhere: a torch operation (node
    metadata ``fx_node``) took them, yet no initializer, input or folded tensor comes from them
    and its nodes read no other tensor in their place (a merged parameter, which
    :func:`~._exported.shared_parameters` reports). [] for graphs without the metadata.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.

    Returns
    -------
    list of str
        torch's names of the parameters, in the order the graph reads them.
    """
    signature = _signature(model)
    if not signature:
        return []
    params = dict(_SIGNATURE_PARAMETER.findall(signature))
    graphs = list(_walk(model.graph))
    folded = _folded_sources(model)
    held = {v.name for g in graphs for v in [*g.initializer, *g.input]} | set().union(*folded.values())
    floats = {i.name for g in graphs for i in g.initializer if i.data_type in FLOAT_TYPES}
    dropped: dict[str, None] = {}
    for arguments, nodes in _by_fx_node(graphs).items():
        own = {params[a] for a in _FX_ARGUMENT.findall(arguments) if a in params}
        missing = [p for p in own if p not in held]
        # tensors read in place of the operation's own parameters: merged ones
        others = {
            i
            for n in nodes
            for i in n.input
            if i in floats and i not in own and not folded.get(i, set()) & own
        }
        if len(missing) > len(others):
            dropped.update(dict.fromkeys(sorted(missing)))
    return list(dropped)


def _signature(model: ModelProto) -> str | None:
    """The exported program's graph signature dynamo writes into the metadata, if any."""
    props = [*model.graph.metadata_props, *model.metadata_props]
    return {p.key: p.value for p in props}.get(_SIGNATURE)


def folded_constants(model: ModelProto) -> dict[str, str]:
    """The float initializers dynamo folded from values none of which is a torch parameter (a
    causal attention mask, EmbeddingBag's per-sample weights of ones): constants, not
    parameters, though as large as one. {} for graphs without dynamo's graph signature.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.

    Returns
    -------
    dict of str to str
        Initializer name -> the reason it is not a parameter.
    """
    signature = _signature(model)
    if not signature:
        return {}
    parameters = {target for _, target in _SIGNATURE_PARAMETER.findall(signature)}
    folded = _folded_sources(model)

    def from_parameter(name: str, seen: frozenset[str]) -> bool:
        # a source may be a folded value itself: follow it, once
        return name in parameters or any(
            from_parameter(s, seen | {name}) for s in folded.get(name, ()) if s not in seen
        )

    return {
        init.name: "a constant the exporter folded from values that are no torch parameter"
        for init in model.graph.initializer
        if init.data_type in FLOAT_TYPES
        and init.name in folded
        and not from_parameter(init.name, frozenset())
    }


def artefact_notes(model: ModelProto, weights: Sequence[str], fix: str, silence: str) -> list[str]:
    """What :func:`folded_copies` and :func:`dropped_parameters` find, as sentences naming the
    tensors and the fix; [] when neither finds anything.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.
    weights : sequence of str
        The trained initializers.
    fix : str
        The export call that keeps every parameter its own tensor.
    silence : str
        How to silence the warning.

    Returns
    -------
    list of str
        One note per kind of finding.
    """
    notes = []
    copies = folded_copies(model, weights)
    if copies:
        listed = "; ".join(f"{c!r} holds {o!r} {how}" for c, o, how in copies)
        notes.append(
            f"trained initializers are copies of other trained initializers ({listed}): the "
            "exporter folded a parameter into a second tensor (the dynamo exporter writes a tied "
            "output weight, as GPT-2's, pre-transposed and a position embedding pre-sliced), and "
            "training updates the copy apart from the original where torch trains one tensor. "
            "The TorchScript exporter keeps a tie as one initializer read by both nodes "
            f"({fix}); or name the weights to train with weights_to_train (leave the copy out to "
            f"keep its exported value); {silence}."
        )
    dropped = dropped_parameters(model)
    if dropped:
        notes.append(
            f"torch parameters {dropped} appear dropped: the export read them but the graph holds "
            "no tensor for them. The dynamo exporter drops a bias that is all zeros (a fresh "
            "MultiheadAttention's out_proj.bias, a zero-initialised Conv bias), which then stays "
            f"zero where torch trains it. Export with {fix} (training mode without constant "
            f"folding keeps it); {silence}."
        )
    return notes
