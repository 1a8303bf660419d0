"""An ONNX graph as one layer of a bigger model: forward now, backward later with the gradient
of the outputs, through onnxruntime-training's TrainingAgent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto

from ._binding import DeviceArray, make_session
from ._gradient import ForwardBackwardGraphs, build_forward_backward, cpu_gradient_rewrites
from ._runtime import C, Device, parse_device
from .exceptions import GraphNotDifferentiableError
from .graph import (
    ancestors,
    check_weights,
    default_weights_to_train,
    differentiable_ancestors,
    float_initializers,
    initializer_values,
    initializers_to_inputs,
    normalise_model,
    value_types,
)


@dataclass
class PendingForward:
    """What one training forward leaves for its backward: the execution state and every buffer
    onnxruntime may still read (inputs, weights), kept alive until the backward ran."""

    state: Any
    keep: list[Any]
    outputs: Any  # the forward's OrtValueVector

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        """Read on demand: only a backward given None for an output needs them."""
        return [tuple(self.outputs[i].shape()) for i in range(len(self.outputs))]


def to_ortvalue(value: Any, device: Device, keep: list[Any]) -> Any:
    """An OrtValue for a numpy array (CPU, zero copy; the array joins ``keep``) or an OrtValue."""
    if isinstance(value, C.OrtValue):
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
    return C.OrtValue.ortvalue_from_numpy(arr, device.ort_device)


class OrtGradientForwardBackward:
    """Forward and backward of a graph as two calls, gradients for the weights and for the
    inputs named in ``input_names_requiring_grad``.

    Weights are owned by this object (``get_weights``/``set_weights``) unless the caller passes
    its own to :meth:`forward` (a torch module passes its parameters).
    """

    def __init__(
        self,
        model_onnx: ModelProto,
        weights_to_train: Sequence[str] | None = None,
        device: str = "cpu",
        input_names_requiring_grad: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(model_onnx, ModelProto):
            raise TypeError(f"model_onnx must be an onnx.ModelProto, not {type(model_onnx).__name__}")
        self.model_onnx = model_onnx
        self.device = parse_device(device)
        model = normalise_model(model_onnx)
        outputs = [o.name for o in model.graph.output]
        types = value_types(model)
        if weights_to_train is None:
            weights = default_weights_to_train(model, outputs, types)
        else:
            weights = list(weights_to_train)
            # each weight must be a float initializer that some output depends on (through
            # float values: a weight reaching them only through a comparison has no gradient)
            with_gradient = {o: differentiable_ancestors(model, [o], types)[0] for o in outputs}
            for w in weights:
                reaching = (
                    [o for o in outputs if w in with_gradient[o]]
                    or [o for o in outputs if w in ancestors(model, [o])[0]]
                    or outputs
                )
                check_weights(model, [w], reaching[0], types)
            if len(set(weights)) != len(weights):
                raise ValueError(f"weights_to_train has duplicates: {weights}")
        inits = {i.name for i in model.graph.initializer}
        inputs = [i.name for i in model.graph.input if i.name not in inits]
        requiring = list(input_names_requiring_grad or [])
        unknown = [n for n in requiring if n not in inputs]
        if unknown:
            raise ValueError(f"input_names_requiring_grad names {unknown}, not inputs of the graph {inputs}")
        graph = initializers_to_inputs(model, [])
        while True:
            try:
                self.graphs: ForwardBackwardGraphs = build_forward_backward(graph, weights, requiring, types)
                break
            except GraphNotDifferentiableError as exc:
                # by default, a float initializer onnxruntime finds no gradient for (an input of
                # an operator it does not differentiate there) is a constant, not a weight
                if weights_to_train is not None or exc.weight not in weights:
                    raise
                weights.remove(exc.weight)
        self.weights_to_train = weights
        self.input_names_requiring_grad = requiring
        self._model = model
        self._trainable = initializers_to_inputs(model, weights)
        if self.device.kind == "cpu" and weights:
            # onnxruntime's CPU kernels of ReluGrad and of the bias gradients' ReduceSum (over a
            # strided leading axis) are several times slower than the rewritten forms
            elem_type = float_initializers(model)[weights[0]].data_type
            self.graphs.gradient_model = cpu_gradient_rewrites(self.graphs.gradient_model, elem_type)
        self.input_names = self.graphs.input_names
        self.output_names = self.graphs.output_names
        values = initializer_values(model, weights)
        self._weights = {w: DeviceArray(v, self.device) for w, v in values.items()}
        # the outputs forward returns must survive the backward
        self._session = make_session(self.graphs.gradient_model, self.device, reuse_memory=False)
        dev = self.device.ort_device
        self._agent = C.TrainingAgent(
            self._session,
            [*self.input_names, *weights],
            [dev] * len(self.output_names),
            self.graphs.fetch_names,
            [dev] * len(self.graphs.fetch_names),
            0,
        )
        self._inference: Any = None
        self._pending: list[PendingForward] = []

    # ---- weights ------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Sessions and the agent do not pickle: the graphs are rebuilt from the model."""
        return {
            "model_onnx": self.model_onnx,
            "weights_to_train": self.weights_to_train,
            "device": str(self.device),
            "input_names_requiring_grad": self.input_names_requiring_grad,
            "weights": self.get_weights(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        weights = state.pop("weights")
        self.__init__(**state)  # type: ignore[misc]
        self.set_weights(weights)

    def get_weights(self) -> dict[str, np.ndarray]:
        return {w: a.read() for w, a in self._weights.items()}

    def set_weights(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            if name not in self._weights:
                raise ValueError(f"unknown weight {name!r}; trained weights are {self.weights_to_train}")
            arr = np.asarray(value)
            ref = self._weights[name]
            shape = tuple(ref.ortvalue.shape())
            if arr.shape != shape:
                raise ValueError(f"weight {name!r} must have shape {shape}, got {arr.shape}")
            ref.write(arr.astype(ref.dtype, copy=False))

    def weight_ortvalues(self) -> list[Any]:
        return [self._weights[w].ortvalue for w in self.weights_to_train]

    # ---- forward / backward ----------------------------------------------------------------
    def _feeds(self, inputs: Sequence[Any], weights: Sequence[Any] | None, keep: list[Any]) -> list[Any]:
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"the graph takes {len(self.input_names)} input(s) {self.input_names}, got {len(inputs)}"
            )
        feeds = [to_ortvalue(x, self.device, keep) for x in inputs]
        if weights is None:
            feeds.extend(self.weight_ortvalues())
            keep.extend(self._weights.values())
        else:
            if len(weights) != len(self.weights_to_train):
                raise ValueError(f"expected {len(self.weights_to_train)} weights, got {len(weights)}")
            feeds.extend(to_ortvalue(w, self.device, keep) for w in weights)
        return feeds

    def forward(
        self, inputs: Sequence[Any], training: bool = True, weights: Sequence[Any] | None = None
    ) -> list[Any]:
        """Runs the graph; returns OrtValues on the device (``.numpy()`` to read on CPU).

        ``training=True`` keeps the state for one :meth:`backward`; ``False`` runs an inference
        session and keeps nothing.
        """
        keep: list[Any] = []
        feeds = self._feeds(inputs, weights, keep)
        if not training:
            return self._infer(feeds)
        out, pending = self.run_forward(feeds, keep)
        self._pending.append(pending)
        return [out[i] for i in range(len(out))]

    def run_forward(self, feeds: Sequence[Any], keep: list[Any]) -> tuple[Any, PendingForward]:
        """The training forward on ready OrtValues (inputs, then weights): the raw
        ``OrtValueVector`` of outputs (a caller converts them all in one call, e.g.
        ``to_dlpacks``) and the state for :meth:`run_backward`; ``keep`` holds what onnxruntime
        may still read."""
        vin = C.OrtValueVector()
        vin.reserve(len(feeds))
        for ov in feeds:
            vin.push_back(ov)
        out = C.OrtValueVector()
        state = C.PartialGraphExecutionState()
        self._agent.run_forward(vin, out, state, None)
        keep.append(vin)
        return out, PendingForward(state, keep, out)

    def _infer(self, feeds: list[Any]) -> list[Any]:
        if self._inference is None:
            self._inference = make_session(self._trainable, self.device)
        binding = C.SessionIOBinding(self._inference)
        for name, ov in zip([*self.input_names, *self.weights_to_train], feeds):
            binding.bind_ortvalue_input(name, ov)
        for name in self.output_names:
            binding.bind_output(name, self.device.ort_device)
        self._inference.run_with_iobinding(binding, None)
        vec = binding.get_outputs()
        return [vec[i] for i in range(len(vec))]

    def pop_pending(self) -> PendingForward:
        """Takes the state of the last training forward (for callers that hold it themselves)."""
        if not self._pending:
            raise RuntimeError("backward needs a forward(..., training=True) first")
        return self._pending.pop()

    def backward(self, grad_outputs: Sequence[Any], pending: PendingForward | None = None) -> list[Any]:
        """Gradients of the inputs requiring one, then of the weights, for the last forward
        (or for ``pending``). ``grad_outputs`` holds one gradient per output (None: zeros)."""
        pending = pending or self.pop_pending()
        if len(grad_outputs) != len(self.output_names):
            raise ValueError(
                f"backward needs one gradient per output ({len(self.output_names)}), got {len(grad_outputs)}"
            )
        keep: list[Any] = []
        skip = self.graphs.non_differentiable_outputs
        values = [
            None
            if k in skip
            else to_ortvalue(np.zeros(shape, dtype=np.float32) if g is None else g, self.device, keep)
            for k, (g, shape) in enumerate(zip(grad_outputs, pending.output_shapes))
        ]
        out = self.run_backward(values, pending)
        return [out[i] for i in range(len(out))]

    def run_backward(self, grad_values: Sequence[Any], pending: PendingForward) -> Any:
        """The backward of ``pending`` on ready OrtValues, one per output (those of outputs
        without a gradient, ``graphs.non_differentiable_outputs``, are ignored and may be
        None): the raw ``OrtValueVector`` of gradients (inputs requiring one, then weights)."""
        skip = self.graphs.non_differentiable_outputs
        vin = C.OrtValueVector()
        vin.reserve(len(grad_values))
        for k, ov in enumerate(grad_values):
            if k not in skip:
                vin.push_back(ov)
        out = C.OrtValueVector()
        self._agent.run_backward(vin, out, pending.state)
        return out
