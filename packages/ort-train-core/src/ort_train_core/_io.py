"""Loading ONNX files that may come from anywhere.

``onnx.load`` trusts its input: a truncated file can raise a bare protobuf ``DecodeError`` (or
parse into an empty model that fails much later, deep inside onnxruntime), and an external-data
``location`` such as ``../../secret`` or ``/etc/passwd`` makes it read any file the process can
read into the weights. :func:`load_model` turns each of these into an exception that names the
file and the problem, before any byte outside the model's folder is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import numpy as np
import onnx

__all__ = ["load_model"]

#: protobuf refuses to serialize a message of 2 GiB or more, and the training path hands every
#: model to onnxruntime as serialized bytes; a module attribute so that tests can lower it.
MAX_MODEL_BYTES = 2**31 - 1


def _too_big(path: str, size: int) -> ValueError:
    return ValueError(
        f"{path}: the model with its weights would take {size} bytes, more than the 2 GB a "
        f"protobuf message can hold ({MAX_MODEL_BYTES} bytes). onnxruntime sessions are created "
        "here from the serialized model, and weights kept as external data are not supported by "
        "the training path: reduce the model (fewer or smaller weights, or float16 weights)."
    )


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph that may carry external data, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            for sparse in attr.sparse_tensors:
                yield sparse.values
                yield sparse.indices
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def _model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def _external_info(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    """(location, offset, length) of an external tensor; ValueError when they make no sense."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    try:
        offset = int(entries.get("offset", "0") or "0")
        length = int(entries["length"]) if entries.get("length") else None
    except ValueError:
        raise ValueError(
            f"tensor {tensor.name!r}: external data offset/length are not integers: {entries}"
        ) from None
    if offset < 0 or (length is not None and length < 0):
        raise ValueError(f"tensor {tensor.name!r}: negative external data offset or length: {entries}")
    return location, offset, length


def _resolve_location(path: str, base_dir: str, tensor: onnx.TensorProto, location: str) -> str:
    """The real path of an external-data file, which must lie inside the model's folder.

    Absolute paths, ``..`` components and symbolic links leading out of the folder are refused:
    an untrusted model must not be able to read arbitrary files into its weights.
    """
    problem = ""
    if not location or "\x00" in location:
        problem = "is empty or holds a NUL character"
    elif os.path.isabs(location) or os.path.splitdrive(location)[0] or location.startswith(("/", "\\")):
        problem = "is an absolute path"
    elif ".." in location.replace("\\", "/").split("/"):
        problem = "goes up out of the model's folder ('..')"
    if not problem:
        real_base = os.path.realpath(base_dir)
        target = os.path.realpath(os.path.join(real_base, location))
        if os.path.commonpath([real_base, target]) != real_base:
            problem = "resolves outside the model's folder (through a symbolic link)"
        elif not os.path.isfile(target):
            problem = "does not exist next to the model (or is not a regular file)"
    if problem:
        raise ValueError(
            f"{path}: tensor {tensor.name!r} has external data location {location!r} which {problem}; "
            "external data must be a file inside the model's folder"
        )
    return target


#: element sizes of the types whose byte count is checked (packed 4-bit and 8-bit float types
#: and strings are left to onnxruntime)
_ITEMSIZE: dict[int, int] = {
    onnx.TensorProto.FLOAT: 4,
    onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT8: 1,
    onnx.TensorProto.INT16: 2,
    onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.INT32: 4,
    onnx.TensorProto.UINT32: 4,
    onnx.TensorProto.INT64: 8,
    onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.BOOL: 1,
}


def _expected_nbytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of a tensor of a common fixed-size type (None otherwise)."""
    itemsize = _ITEMSIZE.get(tensor.data_type)
    if itemsize is None:
        return None
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Loads an ONNX file that may be corrupted or malicious, with clear errors.

    * a missing file raises :class:`FileNotFoundError` naming it;
    * bytes that are not an ONNX model (truncated, corrupted, another format) raise
      :class:`ValueError` naming the file;
    * external data must lie in files inside the model's folder (no absolute path, no ``..``,
      no symbolic link out of it), within those files' bounds and of the tensor's size, or
      :class:`ValueError` names the tensor and its location;
    * a model whose weights would exceed protobuf's 2 GB limit raises :class:`ValueError` before
      the external data are read.

    The returned model holds all its weights in memory (no external data left).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(2, f"ONNX model file not found: {path}", path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, f"expected an ONNX model file, got a folder: {path}", path)
    file_size = os.path.getsize(path)
    if file_size > MAX_MODEL_BYTES:
        raise _too_big(path, file_size)
    with open(path, "rb") as f:
        data = f.read()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    # protobuf's DecodeError (a plain Exception subclass; google.protobuf has no type stubs here)
    except Exception as exc:
        raise ValueError(
            f"{path} is not a valid ONNX model (the file is corrupted or truncated): {exc}"
        ) from exc
    if not model.HasField("graph") or not model.ir_version:
        raise ValueError(
            f"{path} is not a valid ONNX model: it holds no graph or no IR version "
            "(the file is corrupted, truncated or not an ONNX file)"
        )

    base_dir = os.path.dirname(os.path.abspath(path))
    external: list[tuple[onnx.TensorProto, str, int, int]] = []
    total = model.ByteSize()
    for tensor in _model_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location, offset, length = _external_info(tensor)
        target = _resolve_location(path, base_dir, tensor, location)
        available = os.path.getsize(target) - offset
        if available < 0 or (length is not None and length > available):
            raise ValueError(
                f"{path}: tensor {tensor.name!r} asks for bytes beyond the end of its external data "
                f"file {location!r} (offset {offset}, length {length}, file size {available + offset})"
            )
        nbytes = available if length is None else length
        expected = _expected_nbytes(tensor)
        if expected is not None and expected != nbytes:
            raise ValueError(
                f"{path}: tensor {tensor.name!r} of shape {list(tensor.dims)} needs {expected} bytes but "
                f"its external data {location!r} holds {nbytes}"
            )
        total += nbytes
        external.append((tensor, target, offset, nbytes))
    if total > MAX_MODEL_BYTES:
        raise _too_big(path, total)

    for tensor, target, offset, nbytes in external:
        with open(target, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(nbytes)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    if external and model.ByteSize() > MAX_MODEL_BYTES:  # the count above is a lower bound
        raise _too_big(path, model.ByteSize())
    return model
