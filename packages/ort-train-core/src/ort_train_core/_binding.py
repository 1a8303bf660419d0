"""OrtValues on a device and a cached IOBinding.

Trap (ORT_FACTS.md): ``OrtValue.ortvalue_from_numpy`` neither copies a contiguous array nor keeps
it alive, so every OrtValue made here is stored beside the array it views.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from typing import Any

import numpy as np
from onnx import ModelProto

from ._io import check_no_external_data
from ._runtime import C, Device


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
            self.ortvalue = C.OrtValue.ortvalue_from_numpy(arr, device.ort_device)
        else:
            self.host = None
            self.ortvalue = C.OrtValue.ortvalue_from_shape_and_type(
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


class CachedBinding:
    """A SessionIOBinding that binds an input again only when its data pointer changed."""

    __slots__ = ("_bound", "binding", "n_binds", "session")

    def __init__(self, session: Any) -> None:
        self.session = session
        self.binding = C.SessionIOBinding(session)
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


#: sessions by (graph bytes, device, options): a graph whose weights are inputs is the same for
#: every fit of the same architecture and settings (cross-validation folds, grid searches, refits),
#: and building a session costs milliseconds. onnxruntime sessions run concurrently.
_SESSIONS: OrderedDict[tuple[bytes, str, int | None, bool], Any] = OrderedDict()
MAX_CACHED_SESSIONS = 32


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


def make_session(
    model: ModelProto, device: Device, threads: int | None = None, reuse_memory: bool = True
) -> Any:
    """A C-level inference session (the training build registers the gradient ops).

    ``reuse_memory=False`` (no memory pattern, no buffer reuse, as ORTModule sets them) for a
    TrainingAgent whose forward outputs are handed to a caller: otherwise the backward writes
    its own tensors into the buffers of those outputs.
    """
    data = model.SerializeToString()
    key = (hashlib.sha256(data).digest(), str(device), threads, reuse_memory)
    if key in _SESSIONS:
        _SESSIONS.move_to_end(key)
        return _SESSIONS[key]
    # bytes have no folder: onnxruntime would resolve external data against the working directory
    check_no_external_data(model)
    so = C.SessionOptions()
    so.log_severity_level = 3
    so.enable_mem_pattern = reuse_memory
    so.enable_mem_reuse = reuse_memory
    if threads:
        so.intra_op_num_threads = threads
    sess = C.InferenceSession(so, data, False, False)
    providers = [p if isinstance(p, str) else p[0] for p in device.providers]
    options = [{} if isinstance(p, str) else p[1] for p in device.providers]
    try:
        sess.initialize_session(providers, options, set())
    except Exception as exc:
        missing = _missing_kernel(str(exc))
        if missing is None:
            raise
        raise TypeError(f"{missing} on {device}; {_MISSING_KERNEL_FIX}") from exc
    _SESSIONS[key] = sess
    if len(_SESSIONS) > MAX_CACHED_SESSIONS:
        _SESSIONS.popitem(last=False)
    return sess
