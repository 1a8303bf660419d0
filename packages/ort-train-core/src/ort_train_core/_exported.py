"""What torch's ONNX exporters leave in a graph, read from the graph alone (issue 17, item 8).

- Exporter constants among the float initializers: the dynamo exporter keeps the attention
  mask's fill value and the attention scale as 0-d initializers, and folds constant arithmetic
  into one-element tensors; torch buffers it tags as such. None is a parameter: defaults leave
  them out (:func:`exporter_constants`).
- Merged parameters: both exporters keep one tensor for parameters of equal values (freshly
  initialised LayerNorm gammas, zero biases, the layers of a deep-copied TransformerEncoder),
  tied through Identity nodes (TorchScript) or read by several nodes (dynamo). Training then
  ties them (:func:`shared_parameters`).
- BatchNorm folded into Conv: an eval-mode export, and the dynamo exporter even in training
  mode, fold it (:func:`batchnorm_maybe_folded`).

The dynamo exporter records where values come from in metadata: ``InputSpec.kind`` on the
graph inputs and value infos of torch parameters and buffers, ``folded_from`` on folded
constants, ``name_scopes`` (the module path) on nodes; the TorchScript exporter writes the module
path into node names (``/encoder/layers.0/self_attn/Add``) and names an Identity after the
parameter it stands for.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence

import numpy as np
from onnx import ModelProto, NodeProto

from ._artefacts import (
    FOLDED_FROM,
    INPUT_SPEC_KIND,
    artefact_notes,
    folded_constants,
    literal_list,
    value_metadata,
)
from ._builder import FLOAT_TYPES
from .exceptions import ExportedGraphWarning

_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
#: the names the dynamo exporter gives the values it creates
_EXPORTER_VALUE = re.compile(r"val_\d+")
#: the export settings that keep every torch parameter an initializer of its own
ONE_TO_ONE_EXPORT = (
    "torch.onnx.export(..., dynamo=False, training=torch.onnx.TrainingMode.TRAINING, "
    "do_constant_folding=False)"
)
_SILENCE = "warnings.filterwarnings('ignore', category=ort_train_core.ExportedGraphWarning) silences this"


def exporter_constants(model: ModelProto) -> dict[str, str]:
    """The float initializers that are constants of the exporter, not parameters, with why.

    A tensor dynamo tags as a torch parameter is one, whatever its shape. Otherwise: a torch
    buffer (torch does not train it either), a 0-d tensor (a mask fill value, a scale; a 0-d
    parameter exported by TorchScript is one too and must be named in ``weights_to_train``), or
    a one-element tensor dynamo folded from its own constants only (an attention scale).

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.

    Returns
    -------
    dict of str to str
        Initializer name -> the reason it is not a parameter.
    """
    meta = value_metadata(model, outputs=False)
    out: dict[str, str] = {}
    for init in model.graph.initializer:
        if init.data_type not in FLOAT_TYPES:
            continue
        tags = meta.get(init.name, {})
        kind = tags.get(INPUT_SPEC_KIND)
        if kind == "PARAMETER":
            continue
        if kind is not None:
            out[init.name] = f"a torch {kind.lower().replace('_', ' ')}, not a parameter"
        elif not init.dims:
            out[init.name] = "a 0-d constant (name it in weights_to_train to train it)"
        elif int(np.prod(init.dims)) == 1 and _folded_from_constants(tags):
            out[init.name] = "a constant the exporter folded from its own constants"
    # larger ones too, where dynamo's graph signature names the parameters (issue 26, item 2)
    for name, why in folded_constants(model).items():
        out.setdefault(name, why)
    return out


def _folded_from_constants(tags: dict[str, str]) -> bool:
    sources = literal_list(tags.get(FOLDED_FROM, ""))
    return bool(sources) and all(_EXPORTER_VALUE.fullmatch(s) for s in sources)


def _consumers(model: ModelProto) -> dict[str, list[NodeProto]]:
    out: dict[str, list[NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name:
                out.setdefault(name, []).append(node)
    return out


def _module_path(node: NodeProto) -> str | None:
    """The torch module a node was exported from: dynamo's ``name_scopes`` metadata, or the
    TorchScript node name ``/a/b.0/Op``; None when the graph does not say."""
    for prop in node.metadata_props:
        if prop.key == _NAME_SCOPES:
            scopes = literal_list(prop.value)
            return scopes[-2] if len(scopes) >= 2 else None
    if node.name.startswith("/") and node.name.count("/") >= 2:
        return node.name[1:].rsplit("/", 1)[0].replace("/", ".")
    return None


def _readers(name: str, consumers: dict[str, list[NodeProto]]) -> list[str]:
    """The distinct originals behind the places that read the initializer ``name``: an
    Identity's output stands for the parameter it is named after (TorchScript); a node reading
    the tensor itself, for the module it belongs to. Readers of unknown module count as one."""
    found: dict[str, None] = {}
    stack, seen = [name], {name}
    while stack:
        value = stack.pop()
        for node in consumers.get(value, []):
            if node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
                if node.output[0] not in seen:
                    seen.add(node.output[0])
                    stack.append(node.output[0])
            elif value != name:
                found.setdefault(value, None)
            else:
                module = _module_path(node)
                found.setdefault(name if module is None else f"{module or 'the top module'} ({node.op_type})")
    return list(found)


def shared_parameters(model: ModelProto, weights: Iterable[str]) -> dict[str, list[str]]:
    """The trained initializers read in place of several distinct torch parameters.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.
    weights : iterable of str
        The trained initializers.

    Returns
    -------
    dict of str to list of str
        Initializer name -> what reads it: the parameters its Identity aliases are named
        after, the modules of the nodes reading it. Empty for a graph not exported by torch.
    """
    out: dict[str, list[str]] = {}
    if not _from_torch(model):  # the signs read here are those of torch's exporters
        return out
    consumers = _consumers(model)
    for name in weights:
        readers = _readers(name, consumers)
        if len(readers) >= 2:
            out[name] = readers
    return out


def _from_torch(model: ModelProto) -> bool:
    return model.producer_name.startswith("pytorch")


def _first(readers: list[str], shown: int = 4) -> str:
    """The first ``shown`` readers, and how many in all when there are more."""
    text = ", ".join(readers[:shown])
    return text if len(readers) <= shown else f"{text}... ({len(readers)} in all)"


#: BatchNorm, and the normalisations a network uses instead (GroupNorm and InstanceNorm export to
#: InstanceNormalization): a network normalised otherwise most likely had no BatchNorm to fold
_NORMALISATIONS = frozenset(
    {
        "BatchNormalization",
        "BatchNormInternal",
        "InstanceNormalization",
        "GroupNormalization",
        "LayerNormalization",
    }
)


def batchnorm_maybe_folded(model: ModelProto) -> bool:
    """Whether a graph from torch has convolutions but no BatchNormalization: the exporter may
    have folded BatchNorm layers into them (or the network had none).

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.

    Returns
    -------
    bool
        True for a graph whose producer is pytorch with Conv/ConvTranspose and no normalisation
        (BatchNorm, InstanceNorm, GroupNorm or LayerNorm).
    """
    if not _from_torch(model):
        return False
    ops = {node.op_type for node in model.graph.node}
    return bool(ops & {"Conv", "ConvTranspose"}) and not ops & _NORMALISATIONS


def export_notes(model: ModelProto, weights: Sequence[str]) -> list[str]:
    """What :func:`shared_parameters` and :func:`batchnorm_maybe_folded` find, as sentences
    with the export settings that avoid it; [] for a graph with neither.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.
    weights : sequence of str
        The trained initializers.

    Returns
    -------
    list of str
        One note per finding.
    """
    notes = []
    shared = shared_parameters(model, weights)
    if shared:
        listed = "; ".join(f"{name!r} is read as {_first(readers)}" for name, readers in shared.items())
        notes.append(
            f"trained initializers stand for several parameters ({listed}): the exporter may have "
            "merged parameters of equal values into one tensor (fresh LayerNorm weights, zero "
            "biases, copies of a layer), which training then ties where torch trains them apart. "
            f"Export with {ONE_TO_ONE_EXPORT} to keep each parameter its own tensor; a tensor "
            f"shared on purpose (a tied embedding) is fine: {_SILENCE}."
        )
    # parameters folded into copies, or dropped (issue 26, items 2 and 4)
    notes.extend(artefact_notes(model, weights, ONE_TO_ONE_EXPORT, _SILENCE))
    if batchnorm_maybe_folded(model):
        notes.append(
            "the graph comes from torch with Conv nodes and no BatchNormalization: if the network "
            "had BatchNorm layers, the exporter may have folded them into the Conv weights (an "
            "eval-mode export does, the dynamo exporter even in training mode, and it drops zero "
            "conv biases), so training would use no batch statistics and update no running "
            f"statistics. Export with {ONE_TO_ONE_EXPORT} to keep them; {_SILENCE}."
        )
    return notes


def warn_exported_graph(model: ModelProto, weights: Sequence[str], who: str) -> None:
    """Warns :class:`~ort_train_core.exceptions.ExportedGraphWarning` with every note of
    :func:`export_notes`, in one warning.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.
    weights : sequence of str
        The trained initializers.
    who : str
        The trainer, named at the start of the message.
    """
    notes = export_notes(model, weights)
    if notes:
        warnings.warn(f"{who}: " + " Also, ".join(notes), ExportedGraphWarning, stacklevel=3)
