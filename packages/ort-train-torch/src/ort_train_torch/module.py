"""``OnnxModule``: an ONNX graph as a layer of a torch model.

Forward and backward run through ort-train-core's :class:`OrtGradientForwardBackward` (a
TrainingAgent over the graph onnxruntime-training builds); tensors cross over by DLPack without
copies. The module owns the trained initializers as ``nn.Parameter``s, so torch optimisers,
``state_dict``, ``.to(device)`` and DistributedDataParallel treat it like any other layer.
"""

from __future__ import annotations

import keyword
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
import torch
from onnx import ModelProto, TensorProto
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from ort_train_core import OrtGradientForwardBackward, describe_non_finite, load_model, ortvalue_from_dlpack
from ort_train_core.exceptions import GraphNotDifferentiableError
from ort_train_core.extending import DLPACK_BOOL_AS_UINT8
from ort_train_core.graph import (
    differentiable_ancestors,
    inference_form,
    initializer_values,
    inputs_to_initializers,
    normalise_model,
    nothing_to_train_error,
    unique_name,
    warn_exported_graph,
)

#: ONNX element types and the torch dtypes that carry them
_TORCH_DTYPES: dict[int, torch.dtype] = {
    TensorProto.FLOAT: torch.float32,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.INT64: torch.int64,
    TensorProto.INT32: torch.int32,
    TensorProto.INT16: torch.int16,
    TensorProto.INT8: torch.int8,
    TensorProto.UINT8: torch.uint8,
    TensorProto.BOOL: torch.bool,
}


#: torch.utils.dlpack.to_dlpack: Tensor.__dlpack__ runs Python checks that cost several times
#: more per tensor
_to_dlpack: Callable[[torch.Tensor], Any] = torch.utils.dlpack.to_dlpack  # type: ignore[attr-defined]


def ortvalue_from_tensor(tensor: torch.Tensor) -> Any:
    """An OrtValue over the tensor's memory (no copy; it keeps the storage alive).

    A non-contiguous tensor is made contiguous first (a copy), as onnxruntime reads dense
    row-major buffers. The training build refuses DLPack bool tensors: they go as uint8 flagged
    bool there (``DLPACK_BOOL_AS_UINT8``), as they are on stock onnxruntime.

    Parameters
    ----------
    tensor : torch.Tensor
        The tensor, on CPU or a CUDA device; it is detached.

    Returns
    -------
    onnxruntime.capi.onnxruntime_pybind11_state.OrtValue
        The OrtValue, on the tensor's device.
    """
    t = tensor.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    is_bool = t.dtype == torch.bool and DLPACK_BOOL_AS_UINT8
    if is_bool:
        t = t.to(torch.uint8)
    try:
        return ortvalue_from_dlpack(_to_dlpack(t), is_bool)
    except RuntimeError:
        if t.numel():
            raise
        # torch calls every empty tensor contiguous whatever its strides (the gradient of a sum
        # over an empty batch is an expanded one) but onnxruntime checks the strides: an empty
        # tensor has no data to keep, a fresh one with row-major strides does
        fresh = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return ortvalue_from_dlpack(_to_dlpack(fresh), is_bool)


def wait_for_torch(device: torch.device) -> None:
    """Blocks until torch's queued work on ``device`` is done (CUDA only).

    torch writes the inputs and output gradients on its current stream; onnxruntime reads them
    on its own stream, which knows nothing of torch's. Its runs end synchronised (onnxruntime's
    default), so what it hands back is ready for any torch stream.

    Parameters
    ----------
    device : torch.device
        The device; nothing happens for a CPU.
    """
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


#: torch's C-level DLPack import (torch.utils.dlpack.from_dlpack adds Python checks per tensor)
_from_dlpack: Callable[[Any], torch.Tensor] = torch._C._from_dlpack


def tensors_from_ortvalues(values: Any) -> list[torch.Tensor]:
    """Torch tensors over every OrtValue of an ``OrtValueVector`` (no copy), converted in one
    onnxruntime call instead of one Python round trip per value; a backend whose runner's
    vectors are plain lists of OrtValues (the onnx backend) gets one round trip per value.

    Parameters
    ----------
    values : OrtValueVector or sequence of OrtValue
        The values.

    Returns
    -------
    list of torch.Tensor
        One tensor per value, bool values as ``torch.bool``.
    """
    if not hasattr(values, "to_dlpacks"):
        return [tensor_from_ortvalue(v) for v in values]
    tensors: list[torch.Tensor] = values.to_dlpacks(_from_dlpack)
    # the training build's bool crosses DLPack as uint8; stock onnxruntime's as bool (its
    # vectors have no bool_tensor_indices)
    for k in values.bool_tensor_indices() if DLPACK_BOOL_AS_UINT8 else ():
        tensors[k] = tensors[k].to(torch.bool)
    return tensors


def tensor_from_ortvalue(value: Any) -> torch.Tensor:
    """A torch tensor over an OrtValue's memory (no copy).

    Parameters
    ----------
    value : onnxruntime.capi.onnxruntime_pybind11_state.OrtValue
        The value, on CPU or a CUDA device.

    Returns
    -------
    torch.Tensor
        The tensor, on the value's device; a bool value gives a ``torch.bool`` tensor.
    """
    tensor = torch.utils.dlpack.from_dlpack(value.to_dlpack())
    # bool crosses DLPack as uint8; ask onnxruntime only then (data_type() is a call into it)
    if tensor.dtype == torch.uint8 and value.data_type() == "tensor(bool)":
        tensor = tensor.to(torch.bool)
    return tensor


def _load(model_onnx: Any) -> ModelProto:
    if isinstance(model_onnx, ModelProto):
        return model_onnx
    if isinstance(model_onnx, bytes | bytearray):
        model = ModelProto()
        try:
            model.ParseFromString(bytes(model_onnx))
        except Exception as exc:  # protobuf's DecodeError
            raise ValueError(f"model_onnx: the bytes are not a valid ONNX model: {exc}") from exc
        if not model.HasField("graph"):
            raise ValueError("model_onnx: the bytes are not a valid ONNX model (no graph)")
        return model
    if isinstance(model_onnx, str | os.PathLike):
        # a file may be truncated or hostile (external data pointing out of its folder)
        return load_model(model_onnx)
    raise TypeError(
        f"model_onnx must be an onnx.ModelProto, serialized bytes or a path, not {type(model_onnx).__name__}"
    )


def _attribute_names(onnx_names: Sequence[str], reserved: set[str]) -> list[str]:
    """Valid, distinct Python identifiers for parameter attributes (ONNX allows '.', '/', ':'),
    none in ``reserved`` (the names the module already uses)."""
    taken = set(reserved)
    out = []
    for name in onnx_names:
        base = re.sub(r"\W", "_", name) or "weight"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = f"w_{base}"
        out.append(unique_name(base, taken))
    return out


class _OnnxFunction(torch.autograd.Function):
    """Forward through the TrainingAgent; backward hands it the output gradients."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        fb: OrtGradientForwardBackward,
        needs_grad: tuple[bool, ...],
        weight_values: list[Any],
        reach: tuple[list[frozenset[int]], list[frozenset[int]]] | None,
        *args: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """``args``: the inputs then the parameters (autograd tracks them); ``weight_values``:
        the parameters as OrtValues, made by the module; ``reach``: the outputs each input and
        each parameter reaches (None: unknown)."""
        n_inputs = len(needs_grad)
        if args and args[0].is_cuda:
            wait_for_torch(args[0].device)
        keep: list[Any] = []
        feeds = [ortvalue_from_tensor(t) for t in args[:n_inputs]]
        feeds.extend(weight_values)
        out, pending = fb.run_forward(feeds, keep)
        results = tuple(tensors_from_ortvalues(out))
        c: Any = ctx
        c.state = (fb, pending, needs_grad, [(r.shape, r.dtype, r.device) for r in results], reach)
        # onnxruntime's backward reads these buffers (inputs and weights cross without a copy,
        # outputs may be reused): torch's version counters then refuse an in-place change
        # before the backward, as for its own operators, instead of wrong gradients
        ctx.save_for_backward(*args, *results)
        # an output the loss does not use comes as None: the parameters only it reaches get None
        ctx.set_materialize_grads(False)
        frozen = [r for r in results if not r.is_floating_point()]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return results

    @staticmethod
    def backward(ctx: FunctionCtx, *grad_outputs: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if torch.is_grad_enabled():
            # create_graph=True: onnxruntime's gradients have no graph of their own, so their
            # results must refuse a second differentiation instead of giving wrong zeros
            return _backward_once_differentiable(ctx, *grad_outputs)
        return _backward(ctx, *grad_outputs)


def _backward(ctx: FunctionCtx, *grad_outputs: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    c: Any = ctx
    fb, pending, needs_grad, output_meta, reach = c.state
    if pending is None:
        raise RuntimeError(
            "OnnxModule: backward ran twice through the same forward; onnxruntime frees its "
            "state after one backward (retain_graph is not supported)"
        )
    c.saved_tensors  # noqa: B018  (unpacking checks that nothing changed them in place)
    c.state = (fb, None, needs_grad, output_meta, reach)
    skip = fb.graphs.non_differentiable_outputs
    grads: list[Any] = []
    for k, (g, (shape, dtype, device)) in enumerate(zip(grad_outputs, output_meta)):
        if k in skip:
            grads.append(None)
            continue
        if g is None or not dtype.is_floating_point:
            g = torch.zeros(shape, dtype=dtype if dtype.is_floating_point else torch.float32, device=device)
        grads.append(ortvalue_from_tensor(g))
    if output_meta and output_meta[0][2].type == "cuda":
        wait_for_torch(output_meta[0][2])
    results: list[torch.Tensor | None] = list(tensors_from_ortvalues(fb.run_backward(grads, pending)))
    n_input_grads = len(fb.input_names_requiring_grad)
    if reach is not None:
        # as torch: no gradient (None, not zeros) for what reaches only unused outputs, so that
        # momentum or weight decay does not move a parameter the loss did not reach
        unused = {k for k, g in enumerate(grad_outputs) if g is None}
        input_reach, param_reach = reach
        requiring = [r for r, needed in zip(input_reach, needs_grad) if needed]
        for j, outputs in enumerate([*requiring, *param_reach]):
            if outputs <= unused:
                results[j] = None
    out: list[torch.Tensor | None] = [None, None, None, None]
    if not n_input_grads:  # a first layer: only the parameters get gradients
        return (*out, *[None] * len(needs_grad), *results)
    input_grads = iter(results[:n_input_grads])
    out.extend(next(input_grads) if needed else None for needed in needs_grad)
    out.extend(results[n_input_grads:])
    return tuple(out)


_backward_once_differentiable = once_differentiable(_backward)


class OnnxModule(nn.Module):
    """An ONNX graph as a ``torch.nn.Module``.

    The float initializers the outputs depend on with a gradient (or ``weights_to_train``)
    become ``nn.Parameter``s: not a threshold a comparison reads, nor a BatchNormalization's
    running statistics, which are buffers (``onnx_buffer_names``). As torch's BatchNorm, a
    forward in ``train()`` mode normalises with the batch's statistics and updates the running
    ones, whatever the grad mode; ``eval()`` normalises with the running ones. The attribute
    names are the ONNX names made valid Python identifiers, renamed (``forward_1``,
    ``training_1``) where ``nn.Module`` or this class already uses the name (``onnx_names``
    maps them back). ``forward(*tensors)`` takes the graph's inputs in order and returns its
    output, or a tuple when the graph has several.

    In ``train()`` mode the forward is the training forward (batch statistics, running
    statistics updated, dropout active). With gradients enabled and some input or parameter
    requiring one, it also keeps onnxruntime's state for the backward, which returns gradients
    for the inputs that require them and for the parameters; otherwise (``torch.no_grad()``,
    everything frozen) nothing is kept. In ``eval()`` mode an inference session runs and
    nothing is kept. One forward/backward graph is built per device and per set of inputs
    requiring a gradient, on first use. The graph fixes the dtypes: ``.to(device)`` moves the
    module, but a forward after ``.double()`` or ``.half()`` on a float32 graph raises a
    ``TypeError`` (``.float()`` undoes it).

    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes, str or os.PathLike
        The ONNX graph, in memory (serialized or not) or as a file (read by
        :func:`ort_train_core.load_model`); it is not modified.
    weights_to_train : sequence of str, optional
        The initializers to train, by ONNX name; by default every float initializer the
        outputs depend on through values with a gradient.
    threads : int, optional
        onnxruntime's intra-op threads of every session the module makes (forward/backward,
        inference); None: onnxruntime's default pool.
    backend : {'onnx', 'onnxruntime-training'} or None, default=None
        The gradient backend of the forward/backward pairs: ``'onnx'`` (our reverse pass in
        standard operators, two inference sessions, any onnxruntime) or
        ``'onnxruntime-training'`` (TrainingAgent); None: ``$ORT_TRAIN_BACKEND``, else the
        training build when it is installed, else ``'onnx'``. Kept by pickling and copies.

    Attributes
    ----------
    input_names : list of str
        The graph's inputs, in the order ``forward`` takes them.
    output_names : list of str
        The graph's outputs, in the order ``forward`` returns them.
    onnx_names : dict of str to str
        The ONNX name of each parameter, by attribute name.
    onnx_buffer_names : dict of str to str
        The ONNX name of each buffer, by attribute name: the running statistics of training-mode
        BatchNormalization nodes, updated by each forward in ``train()`` as torch's BatchNorm
        does (node momentum, unbiased batch variance) and used in ``eval()`` and ``to_onnx()``.

    Raises
    ------
    GraphNotDifferentiableError
        An operator between the weights and the outputs has no gradient.
    ValueError, TypeError
        A malformed model, an unknown weight name, a ``model_onnx`` of another type.
    """

    #: the instance attributes this class sets besides nn.Module's: a parameter may not take
    #: their names (nn.Module refuses it, or the parameter would hide the attribute)
    _INSTANCE_ATTRIBUTES: ClassVar[frozenset[str]] = frozenset(
        {
            "_model",
            "input_names",
            "output_names",
            "_input_dtypes",
            "_input_shapes",
            "onnx_names",
            "onnx_buffer_names",
            "_onnx_dtypes",
            "_graphs",
            "_weight_values",
            "_output_reach",
            "threads",
            "backend",
        }
    )

    def __init__(
        self,
        model_onnx: ModelProto | bytes | str | os.PathLike[str],
        weights_to_train: Sequence[str] | None = None,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        # the names in use: the class's attributes and methods (a subclass's too), and the
        # instance attributes nn.Module.__init__ just set (whatever this torch version sets)
        reserved = {*dir(type(self)), *vars(self), *self._INSTANCE_ATTRIBUTES}
        model = normalise_model(_load(model_onnx))
        # built on CPU with no input gradient: checks the graph and the weights now, not at the
        # first forward; it also serves that common case later
        probe = OrtGradientForwardBackward(
            model, weights_to_train, device="cpu", threads=threads, backend=backend
        )
        self.threads = probe.threads
        self.backend = backend
        self._model = model
        self.input_names: list[str] = list(probe.input_names)
        self.output_names: list[str] = list(probe.output_names)
        weights = list(probe.weights_to_train)
        if not weights and weights_to_train is None:
            _check_something_to_train(model, self.output_names)
        graph_inputs = {i.name: i for i in model.graph.input}
        self._input_dtypes = [
            _TORCH_DTYPES.get(graph_inputs[n].type.tensor_type.elem_type) for n in self.input_names
        ]
        self._input_shapes = [_declared_shape(graph_inputs[n]) for n in self.input_names]
        attrs = _attribute_names([*weights, *probe.statistics], reserved)
        self.onnx_names: dict[str, str] = dict(zip(attrs, weights))
        #: BatchNormalization's running statistics: torch buffers, updated by training forwards
        self.onnx_buffer_names: dict[str, str] = dict(zip(attrs[len(weights) :], probe.statistics))
        warn_exported_graph(model, weights, "OnnxModule")
        self._register_tensors(model, weights, probe)
        #: the dtype the graph computes each parameter and buffer in: ``.double()`` converts
        #: the tensors but not the graph, which onnxruntime would refuse in C++ terms
        self._onnx_dtypes: dict[str, torch.dtype] = {
            attr: t.dtype for attr, t in [*self._parameters.items(), *self._buffers.items()] if t is not None
        }
        #: the pairs by device, inputs requiring a gradient and backend setting (a module whose
        #: ``backend`` is set again builds its own pairs, never reusing the other backend's)
        self._graphs: dict[tuple[str, tuple[str, ...], str | None], OrtGradientForwardBackward] = {
            ("cpu", (), backend): probe
        }
        # the outputs (indices) each input and each parameter reaches with a gradient, which the
        # backward reads at every step
        self._output_reach = _output_reach(model, self.output_names, self.input_names, weights)
        self._weight_values: dict[str, tuple[tuple[Any, ...], Any]] = {}

    def _register_tensors(
        self, model: ModelProto, weights: list[str], probe: OrtGradientForwardBackward
    ) -> None:
        """The trained initializers as parameters, the running statistics as buffers."""
        values = initializer_values(model, weights)
        bad = describe_non_finite(values)
        if bad:  # not an error: torch modules are often built first and initialised after
            warnings.warn(
                f"OnnxModule: the initializers {bad} hold NaN or inf: outputs and gradients will be "
                "NaN; load finite values (load_state_dict) or re-initialise the parameters "
                "(torch.nn.init) before training",
                RuntimeWarning,
                stacklevel=3,  # the caller of __init__
            )
        for attr, name in self.onnx_names.items():
            self.register_parameter(attr, nn.Parameter(torch.from_numpy(np.array(values[name], copy=True))))
        for attr, name in self.onnx_buffer_names.items():
            self.register_buffer(attr, torch.from_numpy(probe.get_statistics()[name]))

    # ---- pickling / copying: onnxruntime objects are rebuilt on first use --------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_graphs"] = {}
        state["_weight_values"] = {}
        return state

    def extra_repr(self) -> str:
        """The inputs, outputs and parameters (ONNX names) shown in the module's ``repr``.

        Returns
        -------
        str
            One line.
        """
        names = list(self.onnx_names.values())
        return f"inputs={self.input_names}, outputs={self.output_names}, parameters={names}"

    # ---- forward --------------------------------------------------------------------------
    def _forward_backward(
        self, device: torch.device, requiring: tuple[str, ...]
    ) -> OrtGradientForwardBackward:
        backend = getattr(self, "backend", None)  # None: pickled before the setting
        key = (_ort_device(device), requiring, backend)
        if key not in self._graphs:
            self._graphs[key] = OrtGradientForwardBackward(
                self._model,
                list(self.onnx_names.values()),
                device=key[0],
                input_names_requiring_grad=list(requiring),
                threads=self.threads,
                backend=backend,
            )
        return self._graphs[key]

    def _params(self) -> list[nn.Parameter]:
        """The parameters in ONNX order, read from ``_parameters``: nn.Module.__getattr__ would
        add a noticeable share of a small step's overhead per parameter."""
        parameters = self._parameters
        dtypes = getattr(self, "_onnx_dtypes", None)  # None: unpickled from an older version
        params: list[nn.Parameter] = []
        for attr, name in self.onnx_names.items():
            p = parameters[attr]
            if p is None:
                raise RuntimeError(
                    f"OnnxModule: parameter {attr!r} ({name!r}) was set to None; the graph needs it"
                )
            if dtypes is not None and p.dtype != dtypes[attr]:
                raise _dtype_error("parameter", attr, name, p.dtype, dtypes[attr])
            params.append(p)
        return params

    def _parameter_values(self, params: Sequence[nn.Parameter] | None = None) -> list[Any]:
        """The parameters as OrtValues over their memory, made again only when a parameter's
        storage changed (``.to()``, assigning ``.data``); optimisers update in place. A cached
        OrtValue keeps its storage alive, so a new tensor cannot reuse that address."""
        values = []
        for attr, p in zip(self.onnx_names, self._params() if params is None else params):
            key = (p.data_ptr(), p.shape, p.dtype, p.device)
            cached = self._weight_values.get(attr)
            if cached is None or cached[0] != key:
                cached = (key, ortvalue_from_tensor(p))
                self._weight_values[attr] = cached
            values.append(cached[1])
        return values

    def _buffer_values(self) -> tuple[list[torch.Tensor], list[Any]]:
        """The running statistics (buffers, in ONNX order) and OrtValues over their memory."""
        names: dict[str, str] = getattr(self, "onnx_buffer_names", {})
        dtypes = getattr(self, "_onnx_dtypes", None)  # None: unpickled from an older version
        tensors: list[torch.Tensor] = []
        for attr, name in names.items():
            b = self._buffers[attr]
            if b is None:
                raise RuntimeError(
                    "OnnxModule: a running-statistics buffer was set to None; the graph needs it"
                )
            if dtypes is not None and b.dtype != dtypes[attr]:
                raise _dtype_error("buffer", attr, name, b.dtype, dtypes[attr])
            tensors.append(b)
        return tensors, [ortvalue_from_tensor(b) for b in tensors]

    def _check_inputs(self, inputs: Sequence[Any], device: torch.device) -> None:
        if len(inputs) != len(self.input_names):
            raise TypeError(
                f"OnnxModule.forward takes {len(self.input_names)} tensor(s) {self.input_names}, "
                f"got {len(inputs)}"
            )
        for k, (name, t, dtype) in enumerate(zip(self.input_names, inputs, self._input_dtypes)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"input {k} ({name!r}) must be a torch.Tensor, not {type(t).__name__}")
            if dtype is not None and t.dtype != dtype:
                raise TypeError(
                    f"input {k} ({name!r}) must be {dtype}, got {t.dtype}; convert it (e.g. x.to({dtype}))"
                )
            if t.device != device:
                raise ValueError(
                    f"input {k} ({name!r}) is on {t.device} but the module's parameters are on {device}; "
                    "move one of them (module.to(device) or x.to(device))"
                )
            # the training graph does not check shapes: a (3,) input where the graph declares
            # (N, 3) would run as one row and answer (1, k) instead of an error
            shapes = getattr(self, "_input_shapes", None)  # None: unpickled from an older version
            shape = shapes[k] if shapes is not None else None
            if shape is not None and (
                t.dim() != len(shape) or [n for d, n in zip(shape, t.shape) if d is not None and d != n]
            ):
                want = ", ".join("?" if d is None else str(d) for d in shape)
                raise ValueError(
                    f"input {k} ({name!r}) has shape {tuple(t.shape)} but the model expects ({want})"
                )

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Runs the graph.

        Parameters
        ----------
        *inputs : torch.Tensor
            The graph's inputs in the order of :attr:`input_names`, with the dtypes and shapes
            it declares, on the parameters' device.

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            The output, or a tuple when the graph has several.

        Raises
        ------
        TypeError
            Not as many tensors as inputs, or a tensor of another dtype; a parameter or buffer
            converted to a dtype the graph does not compute in (``.double()``).
        ValueError
            A tensor on another device or of another shape; an empty batch in training with a
            gradient to compute.
        """
        # the parameters' and buffers' dtypes first: after .double() an input of the graph's
        # dtype is right and the module is what to convert back
        params = self._params()
        buffers, buffer_values = self._buffer_values()
        device = params[0].device if params else (inputs[0].device if inputs else torch.device("cpu"))
        self._check_inputs(inputs, device)
        if self.training:
            outputs = self._train_forward(inputs, params, buffers, buffer_values, device)
        else:
            fb = self._forward_backward(device, ())
            wait_for_torch(device)
            feeds = [ortvalue_from_tensor(t) for t in inputs]
            weights = self._parameter_values(params)
            results = fb.forward(feeds, training=False, weights=weights, statistics=buffer_values)
            outputs = tuple(tensor_from_ortvalue(o) for o in results)
        return outputs[0] if len(outputs) == 1 else outputs

    def _train_forward(
        self,
        inputs: Sequence[torch.Tensor],
        params: list[nn.Parameter],
        buffers: list[torch.Tensor],
        buffer_values: list[Any],
        device: torch.device,
    ) -> tuple[torch.Tensor, ...]:
        """As torch's train(): the training forward (batch statistics, running statistics
        updated, dropout) whatever the grad mode; only the backward's state is optional."""
        needs_grad = tuple([t.requires_grad and t.is_floating_point() for t in inputs])
        with_grad = torch.is_grad_enabled() and (
            True in needs_grad or True in [p.requires_grad for p in params]
        )
        requiring: tuple[str, ...] = ()
        if with_grad:
            self._check_not_empty(inputs)
            requiring = tuple([n for n, needed in zip(self.input_names, needs_grad) if needed])
        fb = self._forward_backward(device, requiring)
        values = [*buffer_values, *self._parameter_values(params)]
        outputs: tuple[torch.Tensor, ...]
        if with_grad:
            reach = getattr(self, "_output_reach", None)  # None: unpickled from an older version
            outputs = _OnnxFunction.apply(  # type: ignore[no-untyped-call]
                fb, needs_grad, values, reach, *inputs, *params
            )
        else:
            # nothing to differentiate: the same forward outside autograd, its state for a
            # backward dropped at once
            wait_for_torch(device)
            feeds = [ortvalue_from_tensor(t) for t in inputs]
            feeds.extend(values)
            out, _ = fb.run_forward(feeds, [])
            outputs = tuple(tensors_from_ortvalues(out))
        n = len(self.output_names)
        # the updated running statistics follow the outputs, as in torch's train(); an empty
        # batch (possible without a gradient) has no statistics: torch keeps the running ones,
        # where the graph's would be garbage
        if buffers and 0 not in [t.numel() for t in inputs]:
            with torch.no_grad():
                for buffer, new in zip(buffers, outputs[n:]):
                    buffer.copy_(new)
        return outputs[:n]

    def _check_not_empty(self, inputs: Sequence[torch.Tensor]) -> None:
        """Refuses an empty input to differentiate: its backward would fail in onnxruntime's
        gradient kernels."""
        for k, t in enumerate(inputs):
            if t.numel() == 0:
                raise ValueError(
                    f"input {k} ({self.input_names[k]!r}) is empty (shape {tuple(t.shape)}): "
                    "onnxruntime cannot differentiate an empty batch; skip it, or run it in "
                    "eval() mode or under torch.no_grad()"
                )

    # ---- export -----------------------------------------------------------------------------
    def to_onnx(self) -> ModelProto:
        """The graph with the current parameter values and running statistics as its
        initializers, in inference form as torch's ``eval()``: BatchNormalization normalising
        with the running statistics, a training-mode Dropout the identity.

        Returns
        -------
        onnx.ModelProto
            A new model.
        """
        self._params()  # a float64 value in a float32 graph would make an invalid model
        self._buffer_values()
        names = {**self.onnx_names, **getattr(self, "onnx_buffer_names", {})}
        values = {name: getattr(self, attr).detach().cpu().numpy() for attr, name in names.items()}
        model: ModelProto = inference_form(inputs_to_initializers(self._model, values))
        return model

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`to_onnx` to ``path``.

        Parameters
        ----------
        path : str or os.PathLike
            The ``.onnx`` file to write.
        """
        onnx.save(self.to_onnx(), os.fspath(path))


def _check_something_to_train(model: ModelProto, outputs: Sequence[str]) -> None:
    """Raises GraphNotDifferentiableError, saying why, when the default weights of ``model`` are
    none because no output has a gradient: a graph whose coefficients sit in attributes
    (ai.onnx.ml's LinearClassifier) would give a module with nothing to train."""
    for out in outputs:
        error = nothing_to_train_error(model, out)
        if isinstance(error, GraphNotDifferentiableError):
            raise GraphNotDifferentiableError(f"OnnxModule: no parameter to train; {error}")


def _output_reach(
    model: ModelProto, outputs: Sequence[str], inputs: Sequence[str], weights: Sequence[str]
) -> tuple[list[frozenset[int]], list[frozenset[int]]]:
    """The outputs (indices) each input and each weight reaches with a gradient."""
    reached = [differentiable_ancestors(model, [name])[0] for name in outputs]

    def reach(names: Sequence[str]) -> list[frozenset[int]]:
        return [frozenset(k for k, found in enumerate(reached) if name in found) for name in names]

    return reach(inputs), reach(weights)


#: the module method that converts a module's floating tensors to the dtype
_DTYPE_METHODS = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
}


def _dtype_error(kind: str, attr: str, name: str, dtype: torch.dtype, expected: torch.dtype) -> TypeError:
    """The error for a parameter or buffer converted away from the dtype the graph computes in.

    Parameters
    ----------
    kind : str
        ``'parameter'`` or ``'buffer'``.
    attr, name : str
        Its attribute name and its ONNX name.
    dtype, expected : torch.dtype
        Its dtype and the graph's.

    Returns
    -------
    TypeError
        The error to raise, naming the fix.
    """
    method = _DTYPE_METHODS.get(expected)
    fix = f"module.{method}()" if method else f"module.to({expected})"
    graph_dtype, new_dtype = str(expected).removeprefix("torch."), str(dtype).removeprefix("torch.")
    return TypeError(
        f"OnnxModule: {kind} {attr!r} ({name!r}) is {dtype} but the ONNX graph computes it in "
        f"{graph_dtype}: OnnxModule cannot change the graph's dtype; call {fix} (or convert the "
        f"ONNX graph to {new_dtype} before wrapping it)"
    )


def _declared_shape(value_info: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    """The input's declared shape, None for a free dimension; None when the graph gives none."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim
    )


def _ort_device(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    raise ValueError(f"OnnxModule runs on cpu or cuda devices, not {device}")
