"""An ONNX graph as one layer of a bigger model: forward now, backward later with the gradient
of the outputs, through the gradient backend's forward/backward pair."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto

from . import _batchnorm as batchnorm
from ._backends import get_backend
from ._binding import DeviceArray, check_threads, io_binding, make_session, to_ortvalue
from ._gradient import ForwardBackwardGraphs, ForwardBackwardRunner, GradientBackend
from ._ort_errors import onnxruntime_errors
from ._runtime import Device, parse_device
from .exceptions import GraphNotDifferentiableError
from .graph import (
    ancestors,
    check_weights,
    default_weights_to_train,
    differentiable_ancestors,
    initializer_values,
    initializers_to_inputs,
    normalise_model,
    value_types,
)

#: training forwards waiting for a backward at which :meth:`OrtGradientForwardBackward.forward`
#: warns that they hold their activations
PENDING_WARNING = 100


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


class OrtGradientForwardBackward:
    """Forward and backward of a graph as two calls, gradients for the weights and for the
    inputs named in ``input_names_requiring_grad``.

    Weights are owned by this object (``get_weights``/``set_weights``) unless the caller passes
    its own to :meth:`forward` (a torch module passes its parameters).

    Parameters
    ----------
    model_onnx : onnx.ModelProto
        The graph (a prediction graph: no loss needed).
    weights_to_train : sequence of str or None, default=None
        The float initializers to differentiate, in the order the weights are fed and their
        gradients returned. None: those the outputs depend on with a gradient (an initializer
        the gradient builder finds no gradient for stays a constant).
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.
    input_names_requiring_grad : sequence of str or None, default=None
        Inputs whose gradient :meth:`backward` returns too (before the weights').
    threads : int or None, default=None
        onnxruntime's intra-op threads of its sessions (the pair and the inference session);
        None: onnxruntime's default pool.
    backend : {'onnx', 'onnxruntime-training'} or None, default=None
        The gradient backend that builds the pair: ``'onnx'`` (our reverse pass in standard
        operators: two inference sessions) or ``'onnxruntime-training'`` (TrainingAgent);
        None: ``$ORT_TRAIN_BACKEND``, else the training build when it is installed, else
        ``'onnx'``.

    Attributes
    ----------
    graphs : ForwardBackwardGraphs
        The gradient graph and the order of its feeds and fetches;
        ``graphs.non_differentiable_outputs`` lists the outputs without a gradient.
    weights_to_train : list of str
        The trained weights.
    input_names_requiring_grad : list of str
        The inputs whose gradient is returned.
    input_names, output_names : list of str
        The graph's inputs (weights excluded) and outputs, in order.
    statistics : list of str
        The running statistics of its training-mode BatchNormalization nodes: state, not
        weights. The pair takes them after the inputs (``graphs.input_names``) and gives their
        updated values after the outputs (``graphs.output_names``); :meth:`forward` updates the
        ones this object owns (:meth:`get_statistics`) in training, and normalises with them
        otherwise, as torch's ``eval()`` does.
    device : Device
        Where it runs.

    Raises
    ------
    GraphNotDifferentiableError
        When a weight has no gradient or an operator on the way has none.
    ValueError
        When ``backend`` names no registered backend (the message lists them).
    """

    def __init__(
        self,
        model_onnx: ModelProto,
        weights_to_train: Sequence[str] | None = None,
        device: str = "cpu",
        input_names_requiring_grad: Sequence[str] | None = None,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        if not isinstance(model_onnx, ModelProto):
            raise TypeError(f"model_onnx must be an onnx.ModelProto, not {type(model_onnx).__name__}")
        self.model_onnx = model_onnx
        self.device = parse_device(device)
        self.threads = check_threads(threads)
        self.backend = backend
        gradients = get_backend(backend)  # an unknown name is refused before any work
        model = normalise_model(model_onnx)
        types = value_types(model)
        weights = _checked_weights(model, weights_to_train, types)
        requiring = _checked_inputs_requiring_grad(model, input_names_requiring_grad)
        self.statistics = [n for n in batchnorm.running_statistics(model) if n not in weights]
        forward, updates = batchnorm.with_updates(
            initializers_to_inputs(model, self.statistics), self.statistics
        )
        # the outputs forward returns must survive the backward: no memory reuse
        self._pair = _forward_backward_pair(
            forward, weights, requiring, self.device, types, weights_to_train, self.threads, gradients
        )
        self.graphs: ForwardBackwardGraphs = self._pair.graphs
        self.weights_to_train = list(self.graphs.weights)
        self.input_names_requiring_grad = requiring
        self._model = model
        self._trainable = batchnorm.inference_form(
            initializers_to_inputs(model, [*self.statistics, *self.weights_to_train])
        )
        self.input_names = self.graphs.input_names[: len(self.graphs.input_names) - len(self.statistics)]
        self.output_names = self.graphs.output_names[: len(self.graphs.output_names) - len(updates)]
        values = initializer_values(model, [*self.weights_to_train, *self.statistics])
        self._weights = {w: DeviceArray(values[w], self.device) for w in self.weights_to_train}
        self._statistics = {s: DeviceArray(values[s], self.device) for s in self.statistics}
        self._inference: Any = None
        self._pending: list[PendingForward] = []
        # whether a training forward can normalise over a batch's statistics, and the check of
        # each input shapes seen (the error's text, "" when they are fine)
        self._batch_norms = bool(batchnorm.training_batch_norms(model, self.statistics))
        self._checked_shapes: dict[tuple[tuple[int, ...], ...], str] = {}

    # ---- weights ------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Sessions and the agent do not pickle: the graphs are rebuilt from the model."""
        return {
            "model_onnx": self.model_onnx,
            "weights_to_train": self.weights_to_train,
            "device": str(self.device),
            "input_names_requiring_grad": self.input_names_requiring_grad,
            "threads": self.threads,
            "backend": self.backend,
            "weights": self.get_weights(),
            "statistics": self.get_statistics(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        weights = state.pop("weights")
        statistics = state.pop("statistics", {})
        self.__init__(**state)  # type: ignore[misc]
        self.set_weights(weights)
        for name, value in statistics.items():
            self._statistics[name].write(np.asarray(value, dtype=self._statistics[name].dtype))

    def get_statistics(self) -> dict[str, np.ndarray]:
        """Copies of the running statistics this object owns (see :attr:`statistics`).

        Returns
        -------
        dict of str to numpy.ndarray
            The values by name.
        """
        return {s: a.read() for s, a in self._statistics.items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        """A copy of the trained weights, read from the device.

        Returns
        -------
        dict of str to numpy.ndarray
            The values by weight name (``weights_to_train``).
        """
        return {w: a.read() for w, a in self._weights.items()}

    def set_weights(self, values: Mapping[str, Any]) -> None:
        """Writes new values of trained weights into their device buffers.

        Parameters
        ----------
        values : mapping of str to array-like
            New values by weight name; weights not named keep theirs. Each value is cast to
            the weight's dtype.

        Raises
        ------
        ValueError
            For a name that is not a trained weight, or a value of another shape.
        """
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
    def _feeds(
        self,
        inputs: Sequence[Any],
        weights: Sequence[Any] | None,
        keep: list[Any],
        statistics: Sequence[Any] | None = None,
    ) -> list[Any]:
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"the graph takes {len(self.input_names)} input(s) {self.input_names}, got {len(inputs)}"
            )
        feeds = [to_ortvalue(x, self.device, keep) for x in inputs]
        if statistics is None:
            feeds.extend(self._statistics[s].ortvalue for s in self.statistics)
            keep.extend(self._statistics.values())
        else:
            feeds.extend(to_ortvalue(v, self.device, keep) for v in statistics)
        if weights is None:
            feeds.extend(self.weight_ortvalues())
            keep.extend(self._weights.values())
        else:
            if len(weights) != len(self.weights_to_train):
                raise ValueError(f"expected {len(self.weights_to_train)} weights, got {len(weights)}")
            feeds.extend(to_ortvalue(w, self.device, keep) for w in weights)
        return feeds

    def forward(
        self,
        inputs: Sequence[Any],
        training: bool = True,
        weights: Sequence[Any] | None = None,
        statistics: Sequence[Any] | None = None,
    ) -> list[Any]:
        """Runs the graph; returns OrtValues on the device (``.numpy()`` to read on CPU).

        ``training=True`` keeps the state for one :meth:`backward` (several wait on a stack, the
        last forward's backward first, as when the layer is used twice in one model; each holds
        its activations until its backward, and a warning says when
        :data:`PENDING_WARNING` of them wait) and, when ``statistics`` is None, updates the
        running statistics this object owns; ``False`` runs an inference
        session (BatchNormalization with the running statistics) and keeps nothing.
        ``statistics``: the running statistics to read instead of the owned ones (not updated).
        A training forward that would leave a training-mode BatchNormalization node a single
        value per channel (1 row, no spatial size) raises ValueError, as torch does, and
        changes nothing.
        """
        keep: list[Any] = []
        feeds = self._feeds(inputs, weights, keep, statistics)
        if not training:
            return self._infer(feeds)
        out, pending = self.run_forward(feeds, keep)
        self._pending.append(pending)
        if len(self._pending) == PENDING_WARNING:
            # forwards never followed by a backward (a look at the outputs mid-training, an
            # error in between) hold their activations: say so once, before memory runs out
            warnings.warn(
                f"{PENDING_WARNING} training forwards wait for their backward and hold their "
                "activations; run forward(..., training=False) for outputs that need no gradient",
                ResourceWarning,
                stacklevel=2,
            )
        n = len(self.output_names)
        if statistics is None:
            for k, s in enumerate(self.statistics):
                self._statistics[s].write(np.asarray(out[n + k].numpy()))
        return [out[i] for i in range(n)]

    def run_forward(self, feeds: Sequence[Any], keep: list[Any]) -> tuple[Any, PendingForward]:
        """The training forward on ready OrtValues.

        Parameters
        ----------
        feeds : sequence of OrtValue
            The inputs, then the weights.
        keep : list
            What onnxruntime may still read until the backward; the input vector joins it.

        Returns
        -------
        (OrtValueVector, PendingForward)
            The outputs in the backend's vector (a caller converts them all in one call, e.g.
            ``to_dlpacks``) and the state for :meth:`run_backward`.

        Raises
        ------
        ValueError
            When the inputs would leave a training-mode BatchNormalization node a single value
            per channel (torch's rule: rows times spatial size is 1); nothing ran.
        """
        if self._batch_norms:
            self._check_batch_statistics(feeds)
        pair = self._pair
        vin = pair.vector(feeds)
        out = pair.vector(())
        state = pair.new_state()
        with onnxruntime_errors("in the training forward"):  # not its raw C++ text
            pair.run_forward(vin, out, state)
        keep.append(vin)
        return out, PendingForward(state, keep, out)

    def _check_batch_statistics(self, feeds: Sequence[Any]) -> None:
        """Refuses a training forward that would leave a BatchNormalization node a single value
        per channel, as torch does, before it writes a negative running variance (the caller's
        statistics too: the torch module's buffers)."""
        n = len(self.input_names)
        shapes = tuple(tuple(int(d) for d in f.shape()) for f in feeds[:n])
        # 2 rows or more give every node 2 values per channel or more: only 1-row inputs are checked
        if not any(s and s[0] == 1 for s in shapes):
            return
        message = self._checked_shapes.get(shapes)
        if message is None:
            by_name = dict(zip(self.input_names, shapes))
            bad = batchnorm.single_value_channels(
                self._model,
                self.statistics,
                by_name,
                lambda: {name: np.asarray(f.numpy()) for name, f in zip(self.input_names, feeds)},
            )
            message = str(batchnorm.single_row_forward_error(bad, by_name)) if bad else ""
            self._checked_shapes[shapes] = message
        if message:
            raise ValueError(message)

    def _infer(self, feeds: list[Any]) -> list[Any]:
        if self._inference is None:
            self._inference = make_session(self._trainable, self.device, threads=self.threads)
        binding = io_binding(self._inference)
        for name, ov in zip([*self.input_names, *self.statistics, *self.weights_to_train], feeds):
            binding.bind_ortvalue_input(name, ov)
        for name in self.output_names:
            binding.bind_output(name, self.device.ort_device)
        with onnxruntime_errors("in the inference forward"):
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
        # the updated running statistics get no gradient: zeros
        grad_outputs = [*grad_outputs, *[None] * (len(self.graphs.output_names) - len(self.output_names))]
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
        """The backward of ``pending`` on ready OrtValues.

        Parameters
        ----------
        grad_values : sequence of OrtValue or None
            One gradient per output; those of outputs without a gradient
            (``graphs.non_differentiable_outputs``) are ignored and may be None.
        pending : PendingForward
            What the forward left (:meth:`run_forward`).

        Returns
        -------
        OrtValueVector
            The gradients (inputs requiring one, then weights), in the backend's vector.
        """
        skip = self.graphs.non_differentiable_outputs
        pair = self._pair
        vin = pair.vector([ov for k, ov in enumerate(grad_values) if k not in skip] if skip else grad_values)
        out = pair.vector(())
        with onnxruntime_errors("in the backward"):
            pair.run_backward(vin, out, pending.state)
        return out


def _checked_weights(
    model: ModelProto, weights_to_train: Sequence[str] | None, types: Mapping[str, int]
) -> list[str]:
    """``weights_to_train`` checked (float initializers some output depends on, no duplicates),
    or the default weights: the float initializers the outputs depend on with a gradient."""
    outputs = [o.name for o in model.graph.output]
    if weights_to_train is None:
        return default_weights_to_train(model, outputs, types)
    weights = list(weights_to_train)
    # each weight must be a float initializer that some output depends on (through float
    # values: a weight reaching them only through a comparison has no gradient)
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
    return weights


def _checked_inputs_requiring_grad(model: ModelProto, names: Sequence[str] | None) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    requiring = list(names or [])
    unknown = [n for n in requiring if n not in inputs]
    if unknown:
        raise ValueError(f"input_names_requiring_grad names {unknown}, not inputs of the graph {inputs}")
    return requiring


def _forward_backward_pair(
    model: ModelProto,
    weights: list[str],
    requiring: list[str],
    device: Device,
    types: Mapping[str, int],
    weights_to_train: Sequence[str] | None,
    threads: int | None = None,
    backend: GradientBackend | None = None,
) -> ForwardBackwardRunner:
    """The backend's pair; by default (``weights_to_train`` None), a float initializer the
    backend finds no gradient for (an input of an operator it does not differentiate there) is
    a constant, not a weight: it is dropped from ``weights`` and the pair built again."""
    graph = initializers_to_inputs(model, [])
    backend = backend or get_backend()
    while True:
        try:
            return backend.forward_backward(
                graph, weights, requiring, device, types, reuse_memory=False, threads=threads
            )
        except GraphNotDifferentiableError as exc:
            if weights_to_train is not None or exc.weight not in weights:
                raise
            weights.remove(exc.weight)
