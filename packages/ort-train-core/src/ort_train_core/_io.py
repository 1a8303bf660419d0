"""Loading and checking ONNX models that may come from anywhere.

``onnx.load`` trusts its input: a truncated file can raise a bare protobuf ``DecodeError`` (or
parse into an empty model that fails much later, deep inside onnxruntime), and an external-data
``location`` such as ``../../secret`` or ``/etc/passwd`` makes it read any file the process can
read into the weights. :func:`load_model` turns each of these into an exception that names the
file and the problem, before any byte outside the model's folder is read.

:func:`validate_model` is the check every model passes on its way in (``graph.normalise_model``
calls it), whether it came from a file or in memory: it refuses external data (a model in memory
has no folder, and onnx and onnxruntime would read the file relative to the working directory),
control flow nested too deep, and malformed graphs (a cycle, a value read but never defined,
names defined twice, tensors whose data do not match their shape and type), each with a
``ValueError`` naming the defect, before onnx's checker or onnxruntime see the graph.
"""

from __future__ import annotations

import errno
import heapq
import math
import os
import stat
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import onnx

__all__ = ["load_model"]

#: protobuf refuses to serialize a message of 2 GiB or more, and the training path hands every
#: model to onnxruntime as serialized bytes; a module attribute so that tests can lower it.
MAX_MODEL_BYTES = 2**31 - 1

#: the deepest nesting of control-flow subgraphs (an ``If`` inside a ``Loop`` inside an ``If``...)
#: a model may have. onnxruntime's session creation takes about 1.8 times longer per level
#: (seconds at 16 levels, minutes at 25), so a file of a few kilobytes could hold a process for
#: hours; exported models nest a few levels. A module attribute so that a trusted deeper model
#: can pass.
MAX_SUBGRAPH_DEPTH = 8
#: the most nodes calls of model-local functions (FunctionProto) may expand to once inlined: a
#: function calling another k times per level expands k**depth times (10 calls over 5 levels:
#: 11 000 nodes, 8 s of session creation; 6 levels did not finish in 2 minutes).
MAX_FUNCTION_NODES = 100_000

_TensorType = onnx.TensorProto.DataType


def _too_big(path: str, size: int) -> ValueError:
    return ValueError(
        f"{path}: the model with its weights would take {size} bytes, more than the 2 GB a "
        f"protobuf message can hold ({MAX_MODEL_BYTES} bytes). onnxruntime sessions are created "
        "here from the serialized model, and weights kept as external data are not supported by "
        "the training path: reduce the model (fewer or smaller weights, or float16 weights)."
    )


# ---- regular files ---------------------------------------------------------------------------

_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _require_regular(path: str, what: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, f"expected a {what}, got a folder: {path}", path)
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")
        raise ValueError(
            f"{path}: the {what} is {kind}, not a regular file (symbolic links followed); "
            "reading it could block or never end: give the path of a regular file"
        )


def check_regular_file(path: str | os.PathLike[str], what: str = "file") -> str:
    """The path, as a ``str``, after checking that it names an existing regular file.

    Readers call it before they open a path: opening a FIFO blocks until a writer comes, and a
    device such as ``/dev/zero`` reads without end (``os.stat`` follows symbolic links and never
    blocks).

    Parameters
    ----------
    path : str or os.PathLike
        The file to check.
    what : str
        What the file is, for the messages (``"data file"``, ``"checkpoint"``).

    Returns
    -------
    str
        ``os.fspath(path)``.

    Raises
    ------
    FileNotFoundError
        Nothing exists at ``path`` (or a symbolic link there leads nowhere).
    IsADirectoryError
        ``path`` is a folder.
    ValueError
        ``path`` is a FIFO, a device, a socket: anything but a regular file.
    """
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{what} not found: {path}", path) from None
    _require_regular(path, what, mode)
    return path


def open_regular_file(path: str | os.PathLike[str], what: str = "file") -> BinaryIO:
    """A regular file opened for binary reading; anything else is refused without blocking.

    The file is opened non-blocking (a FIFO's open returns at once instead of waiting for a
    writer) and checked on the open descriptor, so nothing can swap it between the check and
    the read. Read with a bound (``f.read(n)``): a regular file can still grow.

    Parameters
    ----------
    path : str or os.PathLike
        The file to open.
    what : str
        What the file is, for the messages.

    Returns
    -------
    BinaryIO
        The open file; the caller closes it (``with open_regular_file(...) as f``).

    Raises
    ------
    FileNotFoundError, IsADirectoryError, ValueError
        As :func:`check_regular_file`.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{what} not found: {path}", path) from None
    try:
        _require_regular(path, what, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


# ---- tensors ---------------------------------------------------------------------------------


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


#: bits per element of the fixed-size types whose data size is checked (strings and types newer
#: than onnxruntime 1.19 are left to onnxruntime); 4-bit types pack two elements in a byte
_BITS: dict[int, int] = {
    onnx.TensorProto.FLOAT: 32,
    onnx.TensorProto.DOUBLE: 64,
    onnx.TensorProto.FLOAT16: 16,
    onnx.TensorProto.BFLOAT16: 16,
    onnx.TensorProto.INT8: 8,
    onnx.TensorProto.UINT8: 8,
    onnx.TensorProto.INT16: 16,
    onnx.TensorProto.UINT16: 16,
    onnx.TensorProto.INT32: 32,
    onnx.TensorProto.UINT32: 32,
    onnx.TensorProto.INT64: 64,
    onnx.TensorProto.UINT64: 64,
    onnx.TensorProto.BOOL: 8,
    onnx.TensorProto.COMPLEX64: 64,
    onnx.TensorProto.COMPLEX128: 128,
    onnx.TensorProto.FLOAT8E4M3FN: 8,
    onnx.TensorProto.FLOAT8E4M3FNUZ: 8,
    onnx.TensorProto.FLOAT8E5M2: 8,
    onnx.TensorProto.FLOAT8E5M2FNUZ: 8,
    onnx.TensorProto.UINT4: 4,
    onnx.TensorProto.INT4: 4,
    onnx.TensorProto.FLOAT4E2M1: 4,
}


def _expected_nbytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of a tensor of a common fixed-size type (None otherwise). Python integers: dims
    such as ``(7378697629483820647, 5)`` wrap to 3 elements in int64."""
    bits = _BITS.get(tensor.data_type)
    if bits is None:
        return None
    return (int(math.prod(tensor.dims)) * bits + 7) // 8


def _expected_values(tensor: onnx.TensorProto) -> tuple[str, int] | None:
    """(field, count) of a tensor kept in its typed field instead of ``raw_data``."""
    n = int(math.prod(tensor.dims))
    if tensor.data_type == onnx.TensorProto.STRING:
        return "string_data", n
    bits = _BITS.get(tensor.data_type)
    if bits is None:
        return None
    field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        return field, 2 * n  # real and imaginary parts
    return field, (n + 1) // 2 if bits == 4 else n


def _check_tensor(tensor: onnx.TensorProto, source: str) -> None:
    """Shape, element type and data size of one tensor agree (external data: see load_model)."""
    where = f"{source}: tensor {tensor.name!r}"
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"{where} has a negative dimension in its shape {dims}; the model is malformed")
    if tensor.data_type == onnx.TensorProto.UNDEFINED or tensor.data_type not in _TensorType.values():
        name = _TensorType.Name(tensor.data_type) if tensor.data_type in _TensorType.values() else "unknown"
        raise ValueError(
            f"{where} has element type {name} ({tensor.data_type}), which is not a tensor element "
            "type; the model is malformed"
        )
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return
    type_name = _TensorType.Name(tensor.data_type)
    if tensor.HasField("raw_data"):
        expected = _expected_nbytes(tensor)
        held = len(tensor.raw_data)
        if expected is not None and held != expected:
            raise ValueError(
                f"{where} of type {type_name} and shape {dims} needs {expected} bytes but its "
                f"raw_data holds {held}; the model is malformed (truncated or edited)"
            )
        return
    values = _expected_values(tensor)
    if values is not None and len(getattr(tensor, values[0])) != values[1]:
        field, count = values
        raise ValueError(
            f"{where} of type {type_name} and shape {dims} needs {count} values in {field} but "
            f"holds {len(getattr(tensor, field))}; the model is malformed (truncated or edited)"
        )


# ---- graphs ----------------------------------------------------------------------------------


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.name, attr.g
        for sub in attr.graphs:
            yield attr.name, sub


def _node_text(node: onnx.NodeProto) -> str:
    if node.name:
        return f"{node.name!r} ({node.op_type})"
    return f"{node.op_type} (output {node.output[0]!r})" if node.output else node.op_type


_FunctionKey = tuple[str, str, str]


def _called(node: onnx.NodeProto) -> _FunctionKey:
    return node.domain, node.op_type, node.overload


def _body(nodes: Iterable[onnx.NodeProto]) -> tuple[int, int, list[tuple[int, _FunctionKey]]]:
    """(nodes, subgraph depth, (level, function) of each call) of a graph or function body,
    its subgraphs included, walked without recursion: a model built in memory can nest deeper
    than Python's recursion limit."""
    count, deepest, calls = 0, 0, []
    stack: list[tuple[Iterable[onnx.NodeProto], int]] = [(nodes, 0)]
    while stack:
        block, depth = stack.pop()
        for node in block:
            count += 1
            calls.append((depth + 1, _called(node)))
            for _, sub in _subgraphs(node):
                deepest = max(deepest, depth + 1)
                stack.append((sub.node, depth + 1))
    return count, deepest, calls


def _function_costs(model: onnx.ModelProto, source: str) -> dict[_FunctionKey, tuple[int, int]]:
    """(depth, nodes once inlined) of each model-local function: a call is one more level of
    nesting, like a subgraph. A function calling itself, directly or not, is refused."""
    bodies = {(f.domain, f.name, f.overload): _body(f.node) for f in model.functions}
    costs: dict[_FunctionKey, tuple[int, int]] = {}
    for root in bodies:
        # depth-first without recursion, callees before callers; `open_` holds the functions
        # on the current path, so meeting one again is a cycle
        stack, open_ = [(root, False)], set()
        while stack:
            key, callees_done = stack.pop()
            count, deepest, calls = bodies[key]
            if callees_done:
                known = [(lvl + costs[k][0], costs[k][1]) for lvl, k in calls if k in bodies]
                # a call is replaced by the callee's nodes
                size = count - len(known) + sum(n for _, n in known)
                costs[key] = (max([deepest, *(d for d, _ in known)]), size)
                open_.discard(key)
                continue
            if key in costs:
                continue
            if key in open_:
                raise ValueError(
                    f"{source}: function {key[1]!r} (domain {key[0]!r}) calls itself, directly or "
                    "through other functions; ONNX functions cannot be recursive (the model is "
                    "malformed)"
                )
            open_.add(key)
            stack.append((key, True))
            callees = dict.fromkeys(k for _, k in calls if k in bodies and k not in costs)
            stack.extend((k, False) for k in callees)
    return costs


def nesting(model: onnx.ModelProto, source: str = "the model") -> tuple[int, int]:
    """(how deep control-flow subgraphs and calls of model-local functions nest, 0: none; how
    many nodes those calls expand to once inlined)."""
    costs = _function_costs(model, source)
    _, deepest, calls = _body(model.graph.node)
    called = [(lvl + costs[k][0], costs[k][1]) for lvl, k in calls if k in costs]
    depth = max([deepest, *(d for d, _ in called), *(d for d, _ in costs.values())])
    return depth, sum(n for _, n in called)  # the nodes the calls are replaced by


def _check_depth(model: onnx.ModelProto, source: str) -> None:
    depth, inlined = nesting(model, source)
    if depth > MAX_SUBGRAPH_DEPTH:
        raise ValueError(
            f"{source}: its control flow (If/Loop/Scan subgraphs) and calls of its functions "
            f"(FunctionProto) are nested {depth} levels deep; at most {MAX_SUBGRAPH_DEPTH} are "
            "accepted, because onnxruntime's session creation takes about 1.8 times longer per "
            "level (minutes at 25). Flatten the control flow or inline the functions "
            "(onnx.inliner.inline_local_functions); for a model you trust, raise "
            "ort_train_core._io.MAX_SUBGRAPH_DEPTH"
        )
    if inlined > MAX_FUNCTION_NODES:
        raise ValueError(
            f"{source}: its function calls expand to {inlined} nodes once inlined (functions "
            f"calling functions several times each); at most {MAX_FUNCTION_NODES} are accepted, "
            "because onnxruntime's session creation would take hours. For a model you trust, "
            "raise ort_train_core._io.MAX_FUNCTION_NODES"
        )


def _defined_names(graph: onnx.GraphProto, source: str, where: str) -> tuple[set[str], dict[str, int]]:
    """(graph inputs and initializers, node index by output); a name defined twice is refused."""
    defined: set[str] = set()
    for name in [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]:
        if name in defined:
            raise ValueError(
                f"{source}: initializer {name!r} is defined twice{where}; initializer names must be "
                "unique (the model is malformed: export it again)"
            )
        defined.add(name)
    inputs = [i.name for i in graph.input]
    if len(set(inputs)) != len(inputs):
        twice = sorted({n for n in inputs if inputs.count(n) > 1})
        raise ValueError(f"{source}: graph inputs {twice} are declared twice{where}; the model is malformed")
    defined.update(inputs)
    producer: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue  # an optional output left out
            if out in producer or out in defined:
                first = (
                    _node_text(graph.node[producer[out]]) if out in producer else "an input or initializer"
                )
                raise ValueError(
                    f"{source}: value {out!r} is produced twice{where}, by {first} and by node "
                    f"{_node_text(node)}; each value of an ONNX graph has one producer (the model is "
                    "malformed: export it again)"
                )
            producer[out] = idx
    return defined, producer


def _check_graph(
    graph: onnx.GraphProto, source: str, outer: set[str], where: str = ""
) -> tuple[list[int], set[str]]:
    """(a topological order of the nodes, names the graph reads from outer scopes).

    Every name a node reads is defined (in this graph or an enclosing one), every name is
    defined once, and the nodes form no cycle; subgraphs are checked the same way."""
    defined, producer = _defined_names(graph, source, where)
    visible = outer | defined | producer.keys()
    free: set[str] = set()
    deps: list[set[int]] = []
    for node in graph.node:
        reads = {name for name in node.input if name}
        for attr_name, sub in _subgraphs(node):
            _, sub_reads = _check_graph(
                sub, source, visible, f" in the {attr_name} of node {_node_text(node)}"
            )
            reads |= sub_reads  # a control-flow node depends on what its subgraphs read
        for name in reads:
            if name not in visible:
                raise ValueError(
                    f"{source}: node {_node_text(node)}{where} reads {name!r}, which no node, graph "
                    "input or initializer defines (the model is malformed: export it again)"
                )
        free |= reads
        deps.append({producer[name] for name in reads if name in producer})
    for out in graph.output:
        if out.name not in visible:
            raise ValueError(
                f"{source}: graph output {out.name!r}{where} is produced by no node; the model is malformed"
            )
        free.add(out.name)
    return _topological_order(graph, deps, source, where), free - defined - producer.keys()


def _topological_order(graph: onnx.GraphProto, deps: list[set[int]], source: str, where: str) -> list[int]:
    """Node indices, each after those it reads; the given order when it already is one (the
    lowest ready index goes first). A cycle leaves nodes that never become ready."""
    users: list[list[int]] = [[] for _ in deps]
    pending = [len(d) for d in deps]
    for idx, needed in enumerate(deps):
        for producer in needed:
            users[producer].append(idx)
    ready = [idx for idx, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        idx = heapq.heappop(ready)
        order.append(idx)
        for user in users[idx]:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(deps):
        stuck = [_node_text(graph.node[i]) for i, count in enumerate(pending) if count > 0]
        raise ValueError(
            f"{source}: the graph has a cycle{where}: nodes {', '.join(stuck[:6])} wait, directly or "
            "through others, for their own outputs (the model is malformed: export it again)"
        )
    return order


def _graph_texts(graph: onnx.GraphProto) -> Iterator[tuple[str, str | bytes]]:
    """(what, text) of the names of a graph and of its nodes (not of its subgraphs)."""
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        yield "value name", vi.name
    for tensor in graph.initializer:
        yield "initializer name", tensor.name
    for sparse in graph.sparse_initializer:
        yield "initializer name", sparse.values.name
    for node in graph.node:
        yield from (("node name", node.name), ("operator", node.op_type), ("domain", node.domain))
        yield from (("value name", name) for name in [*node.input, *node.output])


def _check_utf8(model: onnx.ModelProto, source: str) -> None:
    """Every name is UTF-8 text: protobuf hands an invalid one to Python as bytes, which fails
    later as a UnicodeDecodeError far from the cause."""
    texts = [("metadata", t) for p in model.metadata_props for t in (p.key, p.value)]
    texts += [("domain", op.domain) for op in model.opset_import]
    graphs = [model.graph]
    for function in model.functions:
        texts += [("function name", function.name), ("domain", function.domain)]
        texts += [("value name", name) for name in [*function.input, *function.output]]
        graphs.append(onnx.GraphProto(node=function.node))
    while graphs:  # without recursion: the nesting is checked, but this runs first on load
        graph = graphs.pop()
        graphs.extend(sub for node in graph.node for _, sub in _subgraphs(node))
        for what, text in [*texts, *_graph_texts(graph)]:
            if isinstance(text, bytes):
                raise ValueError(
                    f"{source}: the {what} {text!r} is not valid UTF-8 text, which ONNX names must "
                    "be: the file is corrupted or was written by a tool that does not follow ONNX; "
                    "rename it and save the model again"
                )
        texts = []


def _check_inputs(graph: onnx.GraphProto, source: str) -> None:
    """The graph's inputs have a type, an element type and no negative dimension."""
    for vi in graph.input:
        if vi.type.WhichOneof("value") is None:
            raise ValueError(
                f"{source}: graph input {vi.name!r} has no type; declare its element type and shape "
                "(onnx.helper.make_tensor_value_info(name, TensorProto.FLOAT, ['N', 3])) and save "
                "the model again"
            )
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if tt.elem_type == onnx.TensorProto.UNDEFINED or tt.elem_type not in _TensorType.values():
            raise ValueError(
                f"{source}: graph input {vi.name!r} has no valid element type ({tt.elem_type}); "
                "the model is malformed"
            )
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in tt.shape.dim):
            raise ValueError(
                f"{source}: graph input {vi.name!r} has a negative dimension; the model is malformed"
            )


def external_data_error(tensor: onnx.TensorProto, source: str = "the model") -> ValueError:
    """The refusal of a tensor kept as external data in a model given in memory."""
    location = {e.key: e.value for e in tensor.external_data}.get("location", "")
    return ValueError(
        f"{source}: tensor {tensor.name!r} keeps its data in an external file ({location!r}), and a "
        "model given in memory (an onnx.ModelProto or bytes) has no folder to read it from: the "
        "working directory would be used, which could copy local files into the trained model. "
        "Load the model from its file with ort_train_core.load_model(path), or name the folder of "
        "its data: ort_train_core.load_model(model, external_data_dir=folder)"
    )


def check_no_external_data(model: onnx.ModelProto, source: str = "the model") -> None:
    """Raises :func:`external_data_error` for the first tensor kept as external data.

    Whatever is handed to onnxruntime as bytes passes here: onnxruntime would read such a
    tensor's file relative to the working directory."""
    for tensor in _model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise external_data_error(tensor, source)


def validate_model(model: onnx.ModelProto, source: str = "the model") -> list[int]:
    """Checks a model before onnx's checker or onnxruntime see it.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.
    source : str
        How messages name the model (a path, ``"the model"``).

    Returns
    -------
    list of int
        The main graph's node indices in a topological order: ``range(len(nodes))`` when the
        nodes are already sorted, as ONNX asks (onnxruntime sorts them itself).

    Raises
    ------
    ValueError
        Control flow nested deeper than :data:`MAX_SUBGRAPH_DEPTH`; a tensor kept as external
        data (load it with :func:`load_model`); a negative dimension, an undefined element type
        or data whose size does not match the shape; a name defined twice; a value read but
        defined nowhere; a cycle.
    """
    _check_depth(model, source)
    return _validate_nested(model, source)


def _validate_nested(model: onnx.ModelProto, source: str) -> list[int]:
    """:func:`validate_model` once the nesting depth has been checked."""
    _check_utf8(model, source)
    for tensor in _model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise external_data_error(tensor, source)
        _check_tensor(tensor, source)
    _check_inputs(model.graph, source)
    order, _ = _check_graph(model.graph, source, set())
    return order


# ---- loading ---------------------------------------------------------------------------------


def _parse(data: bytes, source: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    # protobuf's DecodeError (a plain Exception subclass; google.protobuf has no type stubs here)
    except Exception as exc:
        raise ValueError(f"{source} is not a valid ONNX model (corrupted or truncated): {exc}") from exc
    if not model.HasField("graph") or not model.ir_version:
        raise ValueError(
            f"{source} is not a valid ONNX model: it holds no graph or no IR version "
            "(corrupted, truncated or not ONNX)"
        )
    return model


def _read_bounded(f: BinaryIO, size: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``f`` (one more than allowed tells the caller it is too big).

    ``size`` is the file's st_size: a file read once at that size allocates just its bytes
    (``f.read(limit + 1)`` would allocate the whole limit, 2 GB, for any model). st_size is 0
    for /proc files and may be stale for a growing file: the rest is read in bounded chunks.
    """
    first = f.read(min(size, limit) + 1)
    if len(first) <= size:  # end of file reached before the one extra byte asked for
        return first
    chunks, total = [first], len(first)
    while chunks[-1] and total <= limit:
        chunks.append(f.read(min(1 << 24, limit + 1 - total)))
        total += len(chunks[-1])
    return b"".join(chunks)


def _read_model_file(path: str) -> bytes:
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, f"ONNX model file not found: {path}", path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"expected an ONNX model file, got a folder: {path}", path)
    with open_regular_file(path, "ONNX model file") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_MODEL_BYTES:
            raise _too_big(path, size)
        data = _read_bounded(f, size, MAX_MODEL_BYTES)
    if len(data) > MAX_MODEL_BYTES:
        raise _too_big(path, len(data))
    return data


def _inline_external_data(model: onnx.ModelProto, source: str, base_dir: str) -> None:
    """Reads every external tensor of ``model`` (files inside ``base_dir`` only) into it."""
    external: list[tuple[onnx.TensorProto, str, int, int]] = []
    total = model.ByteSize()
    for tensor in _model_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location, offset, length = _external_info(tensor)
        target = _resolve_location(source, base_dir, tensor, location)
        available = os.path.getsize(target) - offset
        if available < 0 or (length is not None and length > available):
            raise ValueError(
                f"{source}: tensor {tensor.name!r} asks for bytes beyond the end of its external data "
                f"file {location!r} (offset {offset}, length {length}, file size {available + offset})"
            )
        nbytes = available if length is None else length
        expected = _expected_nbytes(tensor)
        if expected is not None and expected != nbytes:
            raise ValueError(
                f"{source}: tensor {tensor.name!r} of shape {list(tensor.dims)} needs {expected} bytes but "
                f"its external data {location!r} holds {nbytes}"
            )
        total += nbytes
        external.append((tensor, target, offset, nbytes))
    if total > MAX_MODEL_BYTES:
        raise _too_big(source, total)

    for tensor, target, offset, nbytes in external:
        with open_regular_file(target, "external data file") as f:
            f.seek(offset)
            data = f.read(nbytes)
        if len(data) != nbytes:  # the file shrank since its size was read
            raise ValueError(f"{source}: the external data file of tensor {tensor.name!r} changed while read")
        tensor.raw_data = data
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    if external and model.ByteSize() > MAX_MODEL_BYTES:  # the count above is a lower bound
        raise _too_big(source, model.ByteSize())


def _read_any(
    model: str | os.PathLike[str] | onnx.ModelProto | bytes,
) -> tuple[onnx.ModelProto, str, str | None]:
    """(a new ModelProto, how messages name the model, the folder of its file or None)."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto, "the model", None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "the model bytes"), "the model bytes", None
    if isinstance(model, (str, os.PathLike)):
        source = os.fspath(model)
        folder = os.path.dirname(os.path.abspath(source))
        return _parse(_read_model_file(source), source), source, folder
    raise TypeError(f"model must be a path, an onnx.ModelProto or bytes, not {type(model).__name__}")


def load_model(
    model: str | os.PathLike[str] | onnx.ModelProto | bytes,
    *,
    external_data_dir: str | os.PathLike[str] | None = None,
) -> onnx.ModelProto:
    """Loads an ONNX model that may be corrupted or malicious, with clear errors.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto or bytes
        The path of an ``.onnx`` file, or a model already in memory (serialized or not).
    external_data_dir : str or os.PathLike, optional
        The folder the model's external-data locations are relative to. Default: the model
        file's folder; a model given in memory has none, and one with external data is refused
        unless this names the folder (its files are then checked as a file's are).

    Returns
    -------
    onnx.ModelProto
        A new model holding all its weights in memory (no external data left).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        The file is missing, or is a folder.
    ValueError
        * the path is not a regular file (a FIFO, ``/dev/zero`` or a link to them);
        * the bytes are not an ONNX model (truncated, corrupted, another format);
        * external data lie outside the folder (absolute path, ``..``, symbolic link out of it),
          beyond their files' ends or do not match the tensor's size; in a model given in
          memory, external data without ``external_data_dir``;
        * the model with its weights would exceed protobuf's 2 GB limit (checked before the
          external data are read, and every read is bounded);
        * control flow (If/Loop/Scan subgraphs) nested more than :data:`MAX_SUBGRAPH_DEPTH`
          (8) levels deep: onnxruntime's session creation time grows about 1.8 times per level;
        * a malformed graph: a cycle, a value read but defined nowhere, a name defined twice, a
          tensor with a negative dimension, an undefined element type or data whose size does
          not match its shape and type (dims are multiplied in Python integers, no overflow).
    TypeError
        ``model`` is none of the accepted types.
    """
    base_dir = None if external_data_dir is None else os.fspath(external_data_dir)
    if base_dir is not None and not os.path.isdir(base_dir):
        raise ValueError(f"external_data_dir={base_dir!r} is not a folder")
    proto, source, model_dir = _read_any(model)
    base_dir = model_dir if base_dir is None else base_dir
    _check_depth(proto, source)  # first: the walks below recurse into subgraphs
    if base_dir is not None:
        _inline_external_data(proto, source, base_dir)
    _validate_nested(proto, source)  # the depth was checked above
    return proto
