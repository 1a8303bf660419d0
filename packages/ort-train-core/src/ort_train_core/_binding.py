"""OrtValues on a device, onnxruntime sessions (cached), and IOBindings: the generic runtime
code every trainer and the gradient backend share.

Trap (ORT_FACTS.md): ``OrtValue.ortvalue_from_numpy`` neither copies a contiguous array nor keeps
it alive, so every OrtValue made here is stored beside the array it views.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto

from ._builder import FLOAT_TYPES
from ._cache import LRUCache
from ._io import check_no_external_data
from ._ort_errors import is_onnxruntime_error, run_failure
from ._runtime import Device, ort_capi


class DeviceArray:
    """A tensor that lives on a device, owned by this object.

    On CPU the OrtValue views ``self.host`` (zero copy, writes visible to onnxruntime at once).
    """

    __slots__ = ("_dtype", "device", "host", "ortvalue")

    def __init__(self, value: np.ndarray, device: Device, copy: bool = True) -> None:
        self.device = device
        arr = (
            np.array(value, copy=True, order="C") if copy else np.asarray(value, order="C")
        )  # (ascontiguousarray makes 0-d arrays 1-d)
        self._dtype = arr.dtype
        if device.kind == "cpu":
            self.host: np.ndarray | None = arr
            self.ortvalue = ort_capi.OrtValue.ortvalue_from_numpy(arr, device.ort_device)
        else:
            self.host = None
            self.ortvalue = ort_capi.OrtValue.ortvalue_from_shape_and_type(
                list(arr.shape), arr.dtype, device.ort_device
            )
            self.ortvalue.update_inplace(arr)

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: Any, device: Device) -> DeviceArray:
        return cls(np.zeros(shape, dtype=dtype), device, copy=False)

    def read(self) -> np.ndarray:
        """A host copy."""
        if self.host is not None:
            copied: np.ndarray = self.host.copy()
            return copied
        out: np.ndarray = np.asarray(self.ortvalue.numpy())
        return out

    def write(self, value: np.ndarray) -> None:
        """Overwrites the content in place: bindings that hold this buffer stay valid."""
        if self.host is not None:
            np.copyto(self.host, value, casting="same_kind")
        else:
            self.ortvalue.update_inplace(np.asarray(value, dtype=self.dtype, order="C"))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.ortvalue.shape())

    @property
    def dtype(self) -> np.dtype:
        """Known from construction: asking a device OrtValue means copying it to the host."""
        return self._dtype


def to_ortvalue(value: Any, device: Device, keep: list[Any]) -> Any:
    """An OrtValue for a value, made without copying where it can.

    Parameters
    ----------
    value : OrtValue, DeviceArray or array-like
        An OrtValue is used as is; a numpy array on CPU is viewed (zero copy); on another device
        it is copied there.
    device : Device
        Where the OrtValue must live.
    keep : list
        Receives what must stay alive as long as onnxruntime may read the OrtValue.

    Returns
    -------
    OrtValue
        The value on ``device``.
    """
    if isinstance(value, ort_capi.OrtValue):
        keep.append(value)
        return value
    if isinstance(value, DeviceArray):
        keep.append(value)
        return value.ortvalue
    arr = np.asarray(value)
    if device.kind != "cpu":
        dev = DeviceArray(arr, device)
        keep.append(dev)
        return dev.ortvalue
    arr = np.asarray(arr, order="C")  # ascontiguousarray makes 0-d arrays 1-d
    keep.append(arr)
    return ort_capi.OrtValue.ortvalue_from_numpy(arr, device.ort_device)


#: whether a bool tensor crosses DLPack into onnxruntime as uint8 flagged bool: the training
#: build (1.19) refuses DLPack bool tensors and its ``OrtValue.from_dlpack`` takes the flag, as
#: onnxruntime-gpu 1.31.1's does; stock CPU onnxruntime 1.32 reads DLPack bool tensors and takes
#: no flag. Read from the loaded build's signature, not its version
DLPACK_BOOL_AS_UINT8: bool = "is_bool_tensor" in (ort_capi.OrtValue.from_dlpack.__doc__ or "")


def ortvalue_from_dlpack(capsule: Any, is_bool: bool = False) -> Any:
    """An OrtValue over the memory a DLPack capsule describes (no copy; the OrtValue keeps the
    producer's buffer alive).

    Parameters
    ----------
    capsule : PyCapsule
        What ``torch.utils.dlpack.to_dlpack(tensor)`` (or any DLPack producer) returns; passing
        the tensor itself crashes onnxruntime.
    is_bool : bool, default=False
        True for a bool tensor sent as uint8, where :data:`DLPACK_BOOL_AS_UINT8` (the training
        build refuses DLPack bool tensors); elsewhere a bool tensor crosses as it is and the
        flag is not used.

    Returns
    -------
    OrtValue
        An onnxruntime OrtValue on the producer's device.
    """
    if not DLPACK_BOOL_AS_UINT8:  # stock onnxruntime: the capsule alone
        return ort_capi.OrtValue.from_dlpack(capsule)
    return ort_capi.OrtValue.from_dlpack(capsule, is_bool)


def io_binding(session: Any) -> Any:
    """A new IOBinding of ``session``: OrtValues bound once, then ``run_with_iobinding`` runs.

    Parameters
    ----------
    session : onnxruntime InferenceSession
        A session from :func:`make_session`.

    Returns
    -------
    onnxruntime SessionIOBinding
        An empty binding.
    """
    return ort_capi.SessionIOBinding(session)


class CachedBinding:
    """A SessionIOBinding that binds an input again only when its data pointer changed."""

    __slots__ = ("_bound", "binding", "n_binds", "session")

    def __init__(self, session: Any) -> None:
        self.session = session
        self.binding = io_binding(session)
        self._bound: dict[str, Any] = {}
        self.n_binds = 0

    def bind_input(self, name: str, ortvalue: Any) -> None:
        last = self._bound.get(name)
        if last is ortvalue:
            return
        if last is not None and last.data_ptr() == ortvalue.data_ptr() and last.shape() == ortvalue.shape():
            self._bound[name] = ortvalue  # keep the new owner alive
            return
        self.binding.bind_ortvalue_input(name, ortvalue)
        self._bound[name] = ortvalue
        self.n_binds += 1

    def bind_output(self, name: str, ortvalue: Any) -> None:
        self.binding.bind_ortvalue_output(name, ortvalue)
        self._bound["->" + name] = ortvalue

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding, None)


MAX_CACHED_SESSIONS = 32
#: sessions by (graph bytes, device, options): a graph whose weights are inputs is the same for
#: every fit of the same architecture and settings (cross-validation folds, grid searches, refits),
#: and building a session costs milliseconds. onnxruntime sessions run concurrently.
_SESSIONS: LRUCache[Any] = LRUCache(MAX_CACHED_SESSIONS)


_MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")
_MISSING_KERNEL_FIX = (
    "onnxruntime-training 1.19.2 has kernels for float32 for every operator it trains, but not "
    "for every other type (float64 lacks Erf, Cos, ...): convert the graph and the data to "
    "float32, or replace the operator"
)


def _missing_kernel(message: str) -> str | None:
    """onnxruntime's "Could not find an implementation" as "no kernel for operator X (node N)"."""
    found = _MISSING_KERNEL.search(message)
    if found is None:
        return None
    op, _, node = found.groups()
    op = re.sub(r"_\d+$", "", op)  # onnxruntime's internal names such as SoftmaxGrad_13
    where = f" (node {node!r})" if node else ""
    return f"onnxruntime has no kernel for operator {op}{where} with the graph's element types"


#: On CPU, a fused graph whose batch x trained weight values is at most this runs on one
#: intra-op thread: its step is dozens of small kernels, and splitting them costs more than it
#: saves. benchmarks/bench_threads.py (MLPs and small CNNs, docs/benchmarks.md): one thread was
#: as fast or faster at every size up to 9.2e6 (MLPs) and for every CNN; the thread pool first
#: won at 2.7e7. Batch x weights stays the measure: a FLOP count makes convolutions look large,
#: and they gained least from the threads
CPU_ONE_THREAD_MAX_WORK = 10_000_000


def check_threads(threads: Any) -> int | None:
    """The ``threads`` setting of a trainer, a module or an estimator, checked.

    Parameters
    ----------
    threads : int or None
        onnxruntime's intra-op threads for every session the object makes; None: the policy
        of :func:`cpu_threads`.

    Returns
    -------
    int or None
        ``threads`` as an int, or None.

    Raises
    ------
    ValueError
        Anything but None or an integer >= 1.
    """
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(
            f"threads must be None (one thread for small work, else onnxruntime's default pool) "
            f"or an integer >= 1 (onnxruntime's intra-op threads of every session), got {threads!r}"
        )
    return int(threads)


def cpu_threads(device: Device, rows: int, weight_values: float, threads: int | None = None) -> int | None:
    """The intra-op threads of a session running ``rows`` rows through ``weight_values``
    weights: ``threads`` when given (a user's setting), else 1 on CPU up to
    :data:`CPU_ONE_THREAD_MAX_WORK` and onnxruntime's default pool above.

    A session's pool holds (cores - 1) threads for as long as the session lives, so this also
    keeps the sessions of small models (a fitted estimator's prediction, a validation loss)
    from holding idle threads by the hundred on a many-core machine.

    Parameters
    ----------
    device : Device
        Where the session runs.
    rows : int
        The rows of one run.
    weight_values : float
        How many weight values the graph holds (inf: unknown).
    threads : int or None, default=None
        The object's ``threads`` setting (:func:`check_threads`), which wins.

    Returns
    -------
    int or None
        ``threads``, 1, or None for onnxruntime's default.
    """
    if threads is not None:
        return threads
    return 1 if device.kind == "cpu" and rows * weight_values <= CPU_ONE_THREAD_MAX_WORK else None


def count_input_values(model: ModelProto, names: Sequence[str]) -> float:
    """How many values the graph inputs ``names`` hold together (inf if a dimension is unknown)."""
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    if any(d < 1 for n in names for d in dims[n]):
        return math.inf
    return float(sum(math.prod(dims[n]) for n in names))


def count_weight_values(model: ModelProto, names: Collection[str] | None = None) -> float:
    """How many values the float initializers of ``model`` hold together (its weights), or
    those of them named in ``names``."""
    return float(
        sum(
            math.prod(i.dims)
            for i in model.graph.initializer
            if i.data_type in FLOAT_TYPES and (names is None or i.name in names)
        )
    )


#: graphs with more inputs, outputs and initializers than this get onnxruntime's basic
#: optimisations only: its extended ones take super-linear time in the graph's width (an Add per
#: output, session creation: 3,000 outputs 5.5 s extended against 2.5 s basic, 6,000 outputs
#: 29.7 s against 6.7 s), far more than they save; a fused step has an input and an output per
#: weight, and the models people train have a few hundred (a ResNet-50 or BERT-base: ~200-300)
WIDE_GRAPH_VALUES = 2000


def is_wide_graph(model: ModelProto) -> bool:
    """Whether ``model`` has more than :data:`WIDE_GRAPH_VALUES` inputs, outputs and
    initializers: its sessions skip onnxruntime's extended optimisations."""
    g = model.graph
    return len(g.input) + len(g.output) + len(g.initializer) > WIDE_GRAPH_VALUES


def grouped_conv_grad(model: ModelProto) -> bool:
    """Whether the graph holds a ``ConvGrad`` of a grouped Conv (``group > 1``): its sessions
    run without onnxruntime's memory pattern and buffer reuse.

    With them on, such a ConvGrad whose input is an activation (not a graph input) reads it from
    a buffer already reused: a depthwise Conv1d's weight gradient was off by 1.0 relative
    against torch in the partial loop, and a dilated depthwise TCN's fused step 7.1e-3 after one
    step (1.8e-7 without), different from run to run.
    """
    return any(
        n.op_type == "ConvGrad" and any(a.name == "group" and a.i > 1 for a in n.attribute)
        for n in model.graph.node
    )


def make_session(
    model: ModelProto, device: Device, threads: int | None = None, reuse_memory: bool = True
) -> Any:
    """A C-level inference session (the training build registers the gradient ops), shared by
    every caller asking for the same graph and options.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph, without external data.
    device : Device
        Where it runs.
    threads : int or None, default=None
        Intra-op threads (None: onnxruntime's default).
    reuse_memory : bool, default=True
        False (no memory pattern, no buffer reuse, as ORTModule sets them) for a forward/backward
        pair whose forward outputs are handed to a caller: otherwise the backward writes its own
        tensors into the buffers of those outputs.

    Returns
    -------
    onnxruntime InferenceSession
        The C-level session (``run_with_iobinding``).

    Raises
    ------
    TypeError
        When an operator has no kernel for the graph's element types.
    """
    data = model.SerializeToString()
    # the providers' options too: a session made with TF32 serves no fit that turned it off
    key = (hashlib.sha256(data).digest(), str(device), repr(device.providers), threads, reuse_memory)
    return _SESSIONS.get_or_build(key, lambda: _new_session(model, data, device, threads, reuse_memory))


#: onnxruntime's fusions into com.microsoft operators that have a float kernel only (a
#: Transpose feeding a MatMul becomes FusedMatMul: a double graph then has no kernel)
_FLOAT_ONLY_FUSIONS = frozenset({"MatmulTransposeFusion"})


def _disabled_optimizers(model: ModelProto) -> set[str]:
    g = model.graph
    doubles = any(i.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE for i in g.input) or any(
        i.data_type == onnx.TensorProto.DOUBLE for i in g.initializer
    )
    return set(_FLOAT_ONLY_FUSIONS) if doubles else set()


def _new_session(
    model: ModelProto, data: bytes, device: Device, threads: int | None, reuse_memory: bool
) -> Any:
    # bytes have no folder: onnxruntime would resolve external data against the working directory
    check_no_external_data(model)
    so = ort_capi.SessionOptions()
    so.log_severity_level = 4  # errors reach the caller as exceptions, in our words; not logged twice
    # a grouped ConvGrad reads its input after the memory pattern gave that buffer away (only
    # left where _grad_rewrites could not split the Conv per group: its weight's shape unknown)
    reuse_memory = reuse_memory and not grouped_conv_grad(model)
    so.enable_mem_pattern = reuse_memory
    so.enable_mem_reuse = reuse_memory
    if threads:
        so.intra_op_num_threads = threads
    if is_wide_graph(model):
        so.graph_optimization_level = ort_capi.GraphOptimizationLevel.ORT_ENABLE_BASIC
    providers = [p if isinstance(p, str) else p[0] for p in device.providers]
    options = [{} if isinstance(p, str) else p[1] for p in device.providers]
    try:
        sess = ort_capi.InferenceSession(so, data, False, False)
        sess.initialize_session(providers, options, _disabled_optimizers(model))
    except Exception as exc:
        missing = _missing_kernel(str(exc))
        if missing is not None:
            raise TypeError(f"{missing} on {device}; {_MISSING_KERNEL_FIX}") from exc
        if not is_onnxruntime_error(exc):
            raise
        # onnxruntime's words without its C++ context (a shape inference or graph error)
        raise ValueError(
            f"onnxruntime could not create a session on {device}: {run_failure(exc)}; check the model "
            "with onnx.checker.check_model(model, full_check=True)"
        ) from exc
    return sess
