"""Partial training: the graph's forward and backward run through TrainingAgent; the loss, the
penalty and the update are small ONNX graphs of their own, run on the same device. The fit loop
is the one the full loop uses; only the step differs."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import ModelProto, helper

from . import _batchnorm as batchnorm
from ._binding import (
    DeviceArray,
    count_input_values,
    count_weight_values,
    cpu_threads,
    io_binding,
    make_session,
)
from ._builder import unique_name
from ._cache import LRUCache, model_digest
from ._data import BatchStore
from ._gradient import (
    ForwardBackwardRunner,
    UpdateSignature,
    build_loss_gradient_graph,
    build_update_graph,
)
from ._loss_trainer import FitGraphs, LossGraphTrainer, validation_rows
from ._runner import DoubleBufferedRunner, host_ortvalue
from ._runtime import Device
from .callbacks import Callback
from .checkpoint import TrainingState
from .graph import (
    add_loss_output,
    all_names,
    check_output_size,
    default_penalized_weights,
    default_weights_to_train,
    initializers_to_inputs,
    normalise_model,
    output_shape,
    set_batch_dimension,
)
from .learning_rate import BaseLearningRate
from .losses import (
    BaseLearningLoss,
    BaseLearningPenalty,
    CrossEntropyLearningLoss,
    NegLogLearningLoss,
    NoLearningPenalty,
    make_loss,
)


class LossGradient(NamedTuple):
    """The learning loss's graph of one batch size: (prediction, label, weight) -> (loss,
    prediction_grad).

    Attributes
    ----------
    graph : onnx.ModelProto
        The graph.
    session : onnxruntime InferenceSession
        Its session.
    """

    graph: ModelProto
    session: Any


class Update(NamedTuple):
    """The penalty-and-update graph.

    Attributes
    ----------
    graph : onnx.ModelProto
        The graph.
    signature : UpdateSignature
        The names of its inputs and outputs.
    session : onnxruntime InferenceSession
        Its session.
    """

    graph: ModelProto
    signature: UpdateSignature
    session: Any


#: the partial loop's graphs built in this process, shared by every trainer over the same
#: architecture and settings (a refit from other initial weights builds none, issue 27 item 5):
#: forward/backward pairs by backend, graph structure (trained values left out: they are fed),
#: weights, device and threads; loss-gradient graphs by loss, prediction type and shape, batch,
#: reduction and backend; update graphs by weights, learning rate, penalty and backend. Their
#: sessions come from make_session's cache
MAX_CACHED_PARTIAL_GRAPHS = 32
_FORWARD_BACKWARD: LRUCache[ForwardBackwardRunner] = LRUCache(MAX_CACHED_PARTIAL_GRAPHS)
_LOSS_GRADIENTS: LRUCache[ModelProto] = LRUCache(MAX_CACHED_PARTIAL_GRAPHS)
_UPDATES: LRUCache[tuple[ModelProto, UpdateSignature]] = LRUCache(MAX_CACHED_PARTIAL_GRAPHS)


@dataclass
class PartialGraphs(FitGraphs):
    """:class:`FitGraphs` and the partial loop's graphs.

    Attributes
    ----------
    forward_backward : dict of (str, int, int or None) to ForwardBackwardRunner
        The model's forward/backward pair per device, batch size and ``threads`` setting.
    loss_gradients : dict of (int, str, int or None) to LossGradient
        The learning loss's graph per batch size, device and ``threads`` setting.
    updates : dict of (str, str, int or None) to Update
        The penalty-and-update graph per device, ``repr`` of the learning rate and ``threads``.
    """

    forward_backward: dict[tuple[str, int, int | None], ForwardBackwardRunner] = field(default_factory=dict)
    loss_gradients: dict[tuple[int, str, int | None], LossGradient] = field(default_factory=dict)
    updates: dict[tuple[str, str, int | None], Update] = field(default_factory=dict)

    @functools.cached_property
    def forward(self) -> tuple[ModelProto, dict[str, str]]:
        """The prediction graph the forward/backward pairs are built from: BatchNormalization's
        running statistics as inputs after the features, their updated values as outputs after
        the graph's (:func:`._batchnorm.with_updates`), with the output of each statistic."""
        stats = self.inputs.statistics
        if not stats:
            return self.prediction, {}
        return batchnorm.with_updates(initializers_to_inputs(self.prediction, stats), stats)


class OrtGradientForwardBackwardOptimizer(LossGraphTrainer):
    """Trains a prediction graph with a pluggable loss, penalty and learning rate.

    ``learning_penalty`` applies to every trained weight of rank >= 2 (not biases).
    ``weight_name`` names the sample-weight input of the loss graphs it builds.

    Parameters
    ----------
    model_onnx : onnx.ModelProto
        The prediction graph; the loss is computed by ``learning_loss``.
    weights_to_train : list of str, optional
        The initializers to train; default: every float initializer with a gradient to the
        loss (constants that only feed shapes, masks, indices or BatchNormalization statistics
        are left out).
    max_iter : int, default 100
        Epochs of a fit.
    batch_size : int, default 10
        Rows per step; the last batch of an epoch is shorter when the rows do not divide.
    learning_rate : str, float or BaseLearningRate, default 'SGD'
        ``'SGD'``, ``'SGDNesterov'`` (``'Nesterov'``), ``'Adam'``, a learning-rate object
        (:class:`LearningRateSGD`, :class:`LearningRateSGDNesterov`, :class:`LearningRateAdam`)
        or a float, which means ``LearningRateSGD(eta0=value, learning_rate='constant')``.
    device : str, default 'cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'`` (see :func:`check_device`).
    warm_start : bool, default False
        Continue from the current weights, optimizer state and random generator instead of the
        graph's initializers.
    verbose : int, default 0
        1 shows a progress bar, 2 prints each epoch's losses.
    learning_loss : str or BaseLearningLoss, default 'square_error'
        ``'square_error'``, ``'absolute_error'``, ``'elastic'``, ``'log'``,
        ``'cross_entropy'`` or a loss object (:class:`SquareLearningLoss`, ...).
    learning_penalty : BaseLearningPenalty, optional
        :class:`ElasticLearningPenalty` on the trained weights of rank >= 2; default none.
    weight_name : str, optional
        Name of the sample-weight input of the loss graphs it builds.
    shuffle : bool, default True
        A new permutation of the rows each epoch (``numpy.random.default_rng(random_state)``);
        False takes consecutive slices in row order.
    random_state : int, optional
        Seed of the shuffling.
    output_index : int, default 0
        The graph output the loss applies to.
    reduction : {'mean', 'sum', 'row_mean'}, default 'mean'
        The batch loss: the sample-weighted mean (``sum(w l) / sum(w)``) or sum of the row
        losses, or ``'row_mean'``: ``sum(w l) / rows`` (each weight scales its row's step, as
        onnxcustom's partial loop and scikit-learn's SGD).
    tol : float, optional
        Stop when the loss (validation loss if any, else training) has not improved by ``tol``
        for ``n_iter_no_change`` epochs; None trains ``max_iter`` epochs.
    n_iter_no_change : int, default 5
        Epochs without improvement before stopping (with ``tol``).
    callbacks : list of Callback, optional
        Called at the start and end of the fit, after each epoch and (when they override it)
        after each batch; :class:`EarlyStopping` and the others reset at every fit.
    checkpoint_dir : str or path, optional
        Folder where the training state is written every ``checkpoint_every`` epochs and at the
        end of the fit; :meth:`resume` continues from it exactly.
    checkpoint_every : int, default 1
        Epochs between checkpoints.
    threads : int, optional
        onnxruntime's intra-op threads in every session the trainer makes (steps, validation
        loss, score); None: one thread where a step's work (batch x trained weight values) is
        at most ``_binding.CPU_ONE_THREAD_MAX_WORK``, else onnxruntime's default pool.
    backend : {'onnx', 'onnxruntime-training'} or None, default=None
        The gradient backend that builds the forward/backward pairs and the loss and penalty
        gradients: ``'onnx'`` (our reverse pass in standard operators, two inference sessions)
        or ``'onnxruntime-training'`` (the training build's TrainingAgent); None:
        ``$ORT_TRAIN_BACKEND``, else the training build when it is installed, else ``'onnx'``.
        Checked at :meth:`fit`.

    Attributes
    ----------
    n_iter_ : int
        Completed epochs (over warm starts and resumes).
    train_losses_ : list of float
        The objective of each epoch: each batch's objective before its update, averaged with
        the batches' total sample weights.
    validation_losses_ : list of float
        The validation loss of each epoch (empty without validation data).
    """

    def __init__(
        self,
        model_onnx: ModelProto,
        weights_to_train: Sequence[str] | None = None,
        max_iter: int = 100,
        batch_size: int = 10,
        learning_rate: Any = "SGD",
        device: str = "cpu",
        warm_start: bool = False,
        verbose: int = 0,
        learning_loss: str | BaseLearningLoss = "square_error",
        learning_penalty: BaseLearningPenalty | None = None,
        weight_name: str | None = None,
        shuffle: bool = True,
        random_state: int | None = None,
        output_index: int = 0,
        reduction: str = "mean",
        tol: float | None = None,
        n_iter_no_change: int = 5,
        callbacks: Sequence[Callback] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.learning_loss = learning_loss
        self.learning_penalty = learning_penalty
        self.weight_name = weight_name
        self.shuffle = shuffle
        self.random_state = random_state
        self.output_index = output_index
        self.reduction = reduction
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.callbacks = callbacks
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    # ---- the pieces ------------------------------------------------------------------------
    def _loss(self) -> BaseLearningLoss:
        loss = make_loss(self.learning_loss)
        loss.validate()
        return loss

    def _penalty(self) -> BaseLearningPenalty:
        penalty = NoLearningPenalty() if self.learning_penalty is None else self.learning_penalty
        if not isinstance(penalty, BaseLearningPenalty):
            raise TypeError(
                "learning_penalty must be None, NoLearningPenalty() or ElasticLearningPenalty(l1, l2), "
                f"not {penalty!r}"
            )
        penalty.validate()
        return penalty

    _graphs_type = PartialGraphs

    def _graph_params(self) -> tuple[Any, ...]:
        return (
            *super()._graph_params(),
            self.reduction,
            repr(self.learning_loss),
            repr(self.learning_penalty),
            self.weight_name,
            self.output_index,
        )

    def _build_loss_model(self) -> tuple[ModelProto, str]:
        """The evaluation graph: prediction, learning loss and penalty (the objective), and its
        loss output."""
        model = normalise_model(self.model_onnx)
        outputs = model.graph.output
        if not 0 <= self.output_index < len(outputs):
            raise ValueError(f"output_index={self.output_index} but the graph has {len(outputs)} output(s)")
        weights = (
            list(self.weights_to_train)
            if self.weights_to_train is not None
            else default_weights_to_train(model, outputs[self.output_index].name)
        )
        penalty = self._penalty()
        taken = all_names(model)
        loss_name = unique_name("loss", taken)
        with_loss = add_loss_output(
            model,
            self._loss(),
            loss_name=loss_name,
            label_name=unique_name("label", taken),
            weight_name=unique_name(self.weight_name or "sample_weight", taken),
            penalty={w: penalty for w in default_penalized_weights(model, weights)},
            output_index=self.output_index,
            reduction=self.reduction,
        )
        return with_loss, loss_name

    def _graphs(self) -> PartialGraphs:
        graphs = self._fit_graphs()
        assert isinstance(graphs, PartialGraphs)
        return graphs

    def _forward_backward(self, device: Device, batch: int) -> ForwardBackwardRunner:
        """The forward/backward pair of one batch size: with the batch dimension fixed,
        onnxruntime drops the run-time shape arithmetic of the backward, as in the full loop."""
        graphs = self._graphs()
        key = (str(device), batch, self._threads())
        if key not in graphs.forward_backward:
            model = set_batch_dimension(graphs.forward[0], graphs.inputs.features, batch)
            weights = graphs.inputs.parameters
            threads = cpu_threads(device, batch, count_weight_values(model, set(weights)), key[2])
            backend = self._backend()
            # the pair takes the weights as inputs: keyed by the graph without their values
            shared = (backend.name, model_digest(model, graphs.fed), tuple(weights), str(device), threads)
            graphs.forward_backward[key] = _FORWARD_BACKWARD.get_or_build(
                shared, lambda: backend.forward_backward(model, weights, [], device, threads=threads)
            )
        return graphs.forward_backward[key]

    def _loss_gradient(self, batch: int, device: Device) -> LossGradient:
        graphs = self._graphs()
        key = (batch, str(device), self._threads())
        if key not in graphs.loss_gradients:
            pred = graphs.prediction.graph.output[self.output_index].name
            pred_type, pred_shape = output_shape(graphs.prediction, pred)
            check_output_size(pred, pred_shape)
            loss, backend, reduction = self._loss(), self._backend(), self.reduction
            model = _LOSS_GRADIENTS.get_or_build(
                (repr(loss), pred_type, tuple(pred_shape), batch, reduction, backend.name),
                lambda: build_loss_gradient_graph(loss, pred_type, pred_shape, batch, reduction, backend),
            )
            # elementwise work on the predictions: the steps' one-thread rule, outputs as weights
            per_row = pred_shape[1:]
            outputs = math.prod(per_row) if all(isinstance(d, int) and d > 0 for d in per_row) else math.inf
            threads = cpu_threads(device, batch, outputs, key[2])
            graphs.loss_gradients[key] = LossGradient(model, make_session(model, device, threads=threads))
        return graphs.loss_gradients[key]

    def _update(self, device: Device, lr: BaseLearningRate) -> Update:
        graphs = self._graphs()
        key = (str(device), repr(lr), self._threads())
        if key not in graphs.updates:
            weights = graphs.inputs.parameters
            inits = {i.name: i for i in graphs.loss_model.graph.initializer}
            spec = [(w, inits[w].data_type, list(inits[w].dims)) for w in weights]
            penalty = self._penalty()
            penalized = (
                []
                if isinstance(penalty, NoLearningPenalty)
                else default_penalized_weights(graphs.loss_model, weights)
            )
            backend = self._backend()
            model, sig = _UPDATES.get_or_build(
                (repr(spec), repr(lr), repr(penalty), tuple(penalized), backend.name),
                lambda: build_update_graph(spec, lr, penalty, penalized, backend),
            )
            threads = cpu_threads(device, 1, count_input_values(model, weights), key[2])
            graphs.updates[key] = Update(model, sig, make_session(model, device, threads=threads))
        return graphs.updates[key]

    def get_trained_onnx(self, with_probability: bool = False) -> ModelProto:
        """The prediction graph with the trained weights; ``with_probability=True`` appends the
        probability function the loss applied to the raw scores (sigmoid or softmax), so the
        exported output holds probabilities."""
        model = super().get_trained_onnx()
        if not with_probability:
            return model
        loss = self._loss()
        pred = model.graph.output[self.output_index]
        _, shape = output_shape(model, pred.name)
        # the class axis is 1, also for logits with labels per position [N, C, d1, ...]
        n_cols = shape[1] if len(shape) >= 2 else 1
        if isinstance(loss, NegLogLearningLoss):
            function = loss.probability_function
        elif isinstance(loss, CrossEntropyLearningLoss):
            function = "sigmoid" if n_cols == 1 else "softmax"
        else:
            function = "none"
        if function == "none":
            raise ValueError(
                f"{type(loss).__name__} applies no probability function; export without with_probability"
            )
        raw = unique_name(f"{pred.name}_raw", all_names(model))
        for node in model.graph.node:
            node.output[:] = [raw if o == pred.name else o for o in node.output]
            node.input[:] = [raw if i == pred.name else i for i in node.input]
        attrs: dict[str, Any] = {"axis": 1} if function == "softmax" else {}
        op = "Sigmoid" if function == "sigmoid" else "Softmax"
        model.graph.node.append(helper.make_node(op, [raw], [pred.name], name=f"{op}_probability", **attrs))
        onnx.checker.check_model(model)
        return model

    def _graphs_to_save(self) -> dict[str, ModelProto]:
        graphs = self._graphs()
        out = {"evaluation_loss": graphs.loss_model}
        for (_, batch, _), pair in graphs.forward_backward.items():
            out[f"forward_backward_batch{batch}"] = pair.graphs.gradient_model
        for (batch, _, _), loss_gradient in graphs.loss_gradients.items():
            out[f"loss_gradient_batch{batch}"] = loss_gradient.graph
        for update in graphs.updates.values():
            out["penalty_and_update"] = update.graph
        return out

    def _make_runner(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: Sequence[np.ndarray | None] | None,
        unit_weights: bool = False,
    ) -> _PartialRunner:
        sizes = sorted({e - s for s, e in store.bounds})
        graphs = self._graphs()
        return _PartialRunner(
            store,
            state,
            device,
            lr,
            {size: self._forward_backward(device, size) for size in sizes},
            graphs.forward[1],
            {size: self._loss_gradient(size, device).session for size in sizes},
            self._update(device, lr),
            self.output_index,
            self._evaluator(device, validation_rows(validation)) if validation is not None else None,
            validation,
            graphs.loss_name,
            graphs.inputs.data,
        )


class _PartialRunner(DoubleBufferedRunner):
    """forward -> loss graph -> backward -> penalty and update graph."""

    def __init__(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        forward_backward: dict[int, ForwardBackwardRunner],
        statistic_updates: dict[str, str],
        loss_sessions: dict[int, Any],
        update: Update,
        output_index: int,
        evaluator: Any,
        validation: Sequence[np.ndarray | None] | None,
        loss_name: str,
        data_names: list[str],
    ) -> None:
        graphs = next(iter(forward_backward.values())).graphs
        self.pairs = forward_backward
        super().__init__(
            store, state, device, lr, graphs.weights, evaluator, validation, loss_name, data_names
        )
        # the forward's inputs: features, running statistics, weights; its outputs: the graph's,
        # then the updated statistics, written to the statistics' other buffers
        self.statistic_updates = statistic_updates
        self.n_inputs = len(graphs.input_names) - len(statistic_updates)
        self.n_outputs = len(graphs.output_names)
        self.output_index = output_index
        self.loss_sessions = loss_sessions
        self.loss_host = np.zeros((), dtype=self.dtype)
        self.loss_value = host_ortvalue(self.loss_host)
        self.penalty_host = np.zeros((), dtype=self.dtype)
        self.penalty_value = host_ortvalue(self.penalty_host)
        self.batch_penalties = [DeviceArray.zeros((), self.dtype, device) for _ in self.batch_losses]
        n = len(store.bounds)
        self.sizes = [e - s for s, e in store.bounds]
        self.forward_inputs: list[list[Any]] = [[None] * n, [None] * n]
        self.loss_entries: list[Any] = [None] * n
        # Forward outputs, their gradients and the weight gradients land in fixed buffers that
        # onnxruntime writes in place: each is bound once, not at every step.
        self.outputs: dict[int, list[DeviceArray]] = {}
        self.output_vectors: dict[tuple[int, int], Any] = {}
        self.output_grads: dict[int, Any] = {}
        self.output_grad_buffers: dict[int, list[DeviceArray]] = {}
        for size in sorted(set(self.sizes)):
            self._allocate_outputs(size)
        self.weight_grads = [
            DeviceArray.zeros(self.buffers[w][0].shape, self.dtype, device) for w in self.weight_names
        ]
        self.weight_grad_vector = self.pairs[self.sizes[0]].vector([g.ortvalue for g in self.weight_grads])
        self._bind_updates(update)

    def _bind_updates(self, update: Update) -> None:
        """One binding of the update graph per parity, with everything bound: the weights'
        gradients (the backward's fixed outputs), weights, states, scalars, the penalty."""
        self.update_sig = update.signature
        self.update_bindings = []
        for parity in (0, 1):
            b = io_binding(update.session)
            self.bind_update(b, self.update_sig, parity)
            if self.update_sig.penalty is not None:
                b.bind_ortvalue_output(self.update_sig.penalty, self.penalty_value)
            for name, g in zip(self.update_sig.grads, self.weight_grads):
                b.bind_ortvalue_input(name, g.ortvalue)
            self.update_bindings.append((update.session.run_with_iobinding, b))

    def _allocate_outputs(self, size: int) -> None:
        """Output shapes come from one forward of the first batch of that size (its state is
        dropped without a backward)."""
        batch = self.sizes.index(size)
        pair = self.pairs[size]
        probe = pair.vector([])
        pair.run_forward(self._forward_inputs(batch), probe, pair.new_state())
        shapes = [tuple(probe[k].shape()) for k in range(len(probe))]
        dtypes = [np.asarray(probe[k].numpy()).dtype for k in range(len(probe))]
        self.outputs[size] = [DeviceArray.zeros(sh, dt, self.device) for sh, dt in zip(shapes, dtypes)]
        names = pair.graphs.output_names
        statistic_of = {out: stat for stat, out in self.statistic_updates.items()}
        for parity in (0, 1):
            self.output_vectors[size, parity] = pair.vector(
                [
                    self.buffers[statistic_of[name]][1 - parity].ortvalue
                    if name in statistic_of
                    else a.ortvalue
                    for name, a in zip(names, self.outputs[size])
                ]
            )
        self.output_grad_buffers[size] = [
            DeviceArray.zeros(shape, self.dtype, self.device) for shape in shapes
        ]
        skip = pair.graphs.non_differentiable_outputs
        self.output_grads[size] = pair.vector(
            [a.ortvalue for k, a in enumerate(self.output_grad_buffers[size]) if k not in skip]
        )

    def _forward_inputs(self, batch: int) -> Any:
        data = self.store.batches[batch]
        stats = (self.buffers[s][self.parity].ortvalue for s in self.statistic_updates)
        weights = (self.buffers[w][self.parity].ortvalue for w in self.weight_names)
        vec = self.pairs[self.sizes[batch]].vector([*data[: self.n_inputs], *stats, *weights])
        self.forward_inputs[self.parity][batch] = vec
        return vec

    def _loss_entry(self, batch: int) -> tuple[Any, Any]:
        """The loss graph's binding for this batch: prediction, label and weight in, the loss and
        the prediction's gradient (the backward's output gradient) out, all bound once."""
        size = self.sizes[batch]
        sess = self.loss_sessions[size]
        b = io_binding(sess)
        data = self.store.batches[batch]
        b.bind_ortvalue_input("prediction", self.outputs[size][self.output_index].ortvalue)
        b.bind_ortvalue_input("label", data[self.n_inputs])
        b.bind_ortvalue_input("weight", data[self.n_inputs + 1])
        b.bind_ortvalue_output("loss", self.loss_output(batch, self.loss_value))
        b.bind_ortvalue_output("prediction_grad", self.output_grad_buffers[size][self.output_index].ortvalue)
        entry = (sess.run_with_iobinding, b)
        self.loss_entries[batch] = entry
        return entry

    def step(self, batch: int) -> float:
        size = self.sizes[batch]
        pair = self.pairs[size]
        state = pair.new_state()
        vin = self.forward_inputs[self.parity][batch] or self._forward_inputs(batch)
        pair.run_forward(vin, self.output_vectors[size, self.parity], state)
        run_loss, loss_binding = self.loss_entries[batch] or self._loss_entry(batch)
        run_loss(loss_binding, None)
        pair.run_backward(self.output_grads[size], self.weight_grad_vector, state)
        run_update, update_binding = self.update_bindings[self.parity]
        self.before_step(batch)
        if self.device_resident and self.update_sig.penalty is not None:
            update_binding.bind_ortvalue_output(self.update_sig.penalty, self.batch_penalties[batch].ortvalue)
        run_update(update_binding, None)
        self.parity ^= 1
        self.after_step(batch)
        if self.device_resident:
            return 0.0
        return float(self.loss_host) + float(self.penalty_host)

    def epoch_losses(self, n_done: int, first: int = 0) -> np.ndarray:
        losses = super().epoch_losses(n_done, first)
        if self.update_sig.penalty is not None:
            losses += [float(a.read()) for a in self.batch_penalties[first:n_done]]
        return losses
