"""Full training: the loss is inside the graph, and one session run per step does forward,
loss, backward and the update of weights and optimizer states (the fused step graph)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from onnx import ModelProto, helper

from ._backends import default_backend
from ._binding import CachedBinding, count_input_values, cpu_threads, make_session
from ._cache import LRUCache, model_digest
from ._data import BatchStore
from ._gradient import FusedStepSignature, GradientBackend
from ._loss_trainer import FitGraphs, LossGraphTrainer, validation_rows
from ._runner import MAX_PREBOUND_BATCHES, DoubleBufferedRunner, host_ortvalue
from ._runtime import Device
from .callbacks import Callback
from .checkpoint import TrainingState
from .graph import (
    inputs_to_initializers,
    normalise_model,
    set_batch_dimension,
)
from .learning_rate import BaseLearningRate

MAX_CACHED_FUSED_GRAPHS = 32
#: fused graphs built in this process, by (trainable graph, loss, weights, batch, learning rate,
#: device, backend): a new trainer over the same architecture (a scikit-learn fit, a grid-search
#: candidate) skips the gradient builder, the slow part of building one; the sessions are cached
#: apart (by graph and threads), and the threads are chosen at each call: a trainer with another
#: ``threads`` setting reused the first one's
_FUSED_GRAPHS: LRUCache[tuple[ModelProto, FusedStepSignature]] = LRUCache(MAX_CACHED_FUSED_GRAPHS)
#: fused steps (graph, signature, session) each graph record keeps for its trainers
MAX_SHARED_STEPS = 8


def fused_step_graph(
    model: ModelProto,
    loss_name: str,
    weights: Sequence[str],
    batch: int,
    device: Device,
    lr: BaseLearningRate,
    backend: GradientBackend | None = None,
    threads: int | None = None,
) -> tuple[ModelProto, FusedStepSignature, int | None]:
    """The fused step graph of ``model`` for ``device``, with the intra-op thread count its
    session should use.

    Parameters
    ----------
    model : onnx.ModelProto
        The loss graph, trained weights as inputs, batch dimension fixed to ``batch``.
    loss_name : str
        Its loss output.
    weights : sequence of str
        The trained weights.
    batch : int
        The batch size.
    device : Device
        Where it runs.
    lr : BaseLearningRate
        The learning rate, whose nodes update the weights.
    backend : GradientBackend or None, default=None
        The gradient backend (None: :func:`~._backends.default_backend`).
    threads : int or None, default=None
        The trainer's ``threads`` setting (None: :func:`~._binding.cpu_threads`' policy).

    Returns
    -------
    (onnx.ModelProto, FusedStepSignature, int or None)
        The graph, its signature and the session's intra-op threads (None: the default).
    """
    backend = backend or default_backend()
    key = (model_digest(model), loss_name, tuple(weights), batch, str(device), repr(lr), backend.name)

    graph, sig = _FUSED_GRAPHS.get_or_build(
        key, lambda: backend.fused_step(model, loss_name, weights, lr, device)
    )
    return graph, sig, cpu_threads(device, batch, count_input_values(graph, sig.weights), threads)


class FusedStep(NamedTuple):
    """The fused step of one batch size.

    Attributes
    ----------
    graph : onnx.ModelProto
        Loss, gradients and update in one graph.
    signature : FusedStepSignature
        The names of its inputs and outputs.
    session : onnxruntime InferenceSession
        Its session.
    """

    graph: ModelProto
    signature: FusedStepSignature
    session: Any


@dataclass
class FusedGraphs(FitGraphs):
    """:class:`FitGraphs` and the fused steps.

    Attributes
    ----------
    steps : dict of (int, str, str, bool, int or None) to FusedStep
        The fused step per batch size, device, ``repr`` of the learning rate, whether its
        sample weights are the constant ones (a fit without them) and ``threads`` setting.
    shared_steps : LRUCache of FusedStep
        The same for every trainer of the process's record (one structure and settings, the
        weights fed): a warm refit takes its steps without copying, hashing or serialising a
        graph (0.2-0.4 ms per batch size).
    """

    steps: dict[tuple[int, str, str, bool, int | None], FusedStep] = field(default_factory=dict)
    shared_steps: LRUCache[FusedStep] = field(default_factory=lambda: LRUCache(MAX_SHARED_STEPS))


class OrtGradientOptimizer(LossGraphTrainer):
    """Trains a graph that already computes its loss (see :func:`add_loss_output`).

    Every distinct batch size gets its own fused graph with a fixed batch dimension, which lets
    onnxruntime drop the run-time shape arithmetic of the gradient (about half the kernels).

    Parameters
    ----------
    model_onnx : onnx.ModelProto
        The graph with its loss output (:func:`add_loss_output`).
    weights_to_train : list of str, optional
        The initializers to train; default: every float initializer with a gradient to the
        loss (constants that only feed shapes, masks, indices or BatchNormalization statistics
        are left out).
    loss_output_name : str, default 'loss'
        The scalar output to minimise.
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
    shuffle : bool, default True
        A new permutation of the rows each epoch (``numpy.random.default_rng(random_state)``);
        False takes consecutive slices in row order.
    random_state : int, optional
        Seed of the shuffling.
    label_name, sample_weight_name : str, optional
        The label and sample-weight inputs of the graph; default: the names
        :func:`add_loss_output` recorded in the model's metadata.
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
        The gradient backend that builds the fused steps: ``'onnx'`` (our reverse pass in
        standard operators, any onnxruntime) or ``'onnxruntime-training'`` (the training
        build's gradient builder); None: ``$ORT_TRAIN_BACKEND``, else the training build when
        it is installed, else ``'onnx'``. Checked at :meth:`fit`.

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
        loss_output_name: str = "loss",
        max_iter: int = 100,
        batch_size: int = 10,
        learning_rate: Any = "SGD",
        device: str = "cpu",
        warm_start: bool = False,
        verbose: int = 0,
        shuffle: bool = True,
        random_state: int | None = None,
        label_name: str | None = None,
        sample_weight_name: str | None = None,
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
        self.loss_output_name = loss_output_name
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.shuffle = shuffle
        self.random_state = random_state
        self.label_name = label_name
        self.sample_weight_name = sample_weight_name
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.callbacks = callbacks
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    _graphs_type = FusedGraphs
    _folds_unit_weights = True

    def _graph_params(self) -> tuple[Any, ...]:
        return (*super()._graph_params(), self.loss_output_name)

    def _input_overrides(self) -> tuple[str | None, str | None]:
        return self.label_name, self.sample_weight_name

    def _build_loss_model(self) -> tuple[ModelProto, str]:
        model = normalise_model(self.model_onnx)
        outputs = [o.name for o in model.graph.output]
        if self.loss_output_name not in outputs:
            raise ValueError(
                f"the model has no output {self.loss_output_name!r} (outputs: {outputs}); "
                "add one with add_loss_output(model, ...) or set loss_output_name"
            )
        return model, self.loss_output_name

    def _graphs(self) -> FusedGraphs:
        graphs = self._fit_graphs()
        assert isinstance(graphs, FusedGraphs)
        return graphs

    def _fused(
        self, batch: int, device: Device, lr: BaseLearningRate, unit_weights: bool = False
    ) -> FusedStep:
        """The fused step of ``batch`` rows; ``unit_weights``: its sample weights are the
        constant ones (not an input), for fits without sample weights."""
        graphs = self._graphs()
        setting = self._threads()
        key = (batch, str(device), repr(lr), unit_weights, setting)
        if key not in graphs.steps:
            graphs.steps[key] = graphs.shared_steps.get_or_build(
                key, lambda: self._new_fused(graphs, batch, device, lr, unit_weights)
            )
        return graphs.steps[key]

    def _new_fused(
        self, graphs: FusedGraphs, batch: int, device: Device, lr: BaseLearningRate, unit_weights: bool
    ) -> FusedStep:
        inputs = graphs.inputs
        model = set_batch_dimension(graphs.stepping, inputs.data, batch)
        if unit_weights:
            model = _unit_weights(model, str(inputs.sample_weight))
        setting = self._threads()
        graph, sig, threads = fused_step_graph(
            model, graphs.loss_name, inputs.parameters, batch, device, lr, self._backend(), setting
        )
        return FusedStep(graph, sig, make_session(graph, device, threads=threads))

    def _graphs_to_save(self) -> dict[str, ModelProto]:
        graphs = self._graphs()
        out = {"loss": graphs.loss_model}
        out.update(
            {
                f"fused_step_batch{batch}{'_unweighted' if unit else ''}": step.graph
                for (batch, _, _, unit, _), step in graphs.steps.items()
            }
        )
        return out

    def _make_runner(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: Sequence[np.ndarray | None] | None,
        unit_weights: bool = False,
    ) -> _FusedRunner:
        sizes = sorted({e - s for s, e in store.bounds})
        graphs = {size: self._fused(size, device, lr, unit_weights) for size in sizes}
        evaluator = self._evaluator(device, validation_rows(validation)) if validation is not None else None
        fit_graphs = self._graphs()
        inputs = fit_graphs.inputs
        # the batches carry no weight column then; the validation data keep theirs
        step_names = [n for n in inputs.data if not (unit_weights and n == inputs.sample_weight)]
        return _FusedRunner(
            store,
            state,
            device,
            lr,
            graphs,
            evaluator,
            validation,
            fit_graphs.loss_name,
            inputs.data,
            step_names,
        )


def _unit_weights(model: ModelProto, weight: str) -> ModelProto:
    """``model`` (fixed batch) whose sample-weight input ``weight`` is a constant of ones (a
    dimension other than the batch's that the graph leaves free is 1: one weight per row)."""
    (vi,) = [i for i in model.graph.input if i.name == weight]
    tt = vi.type.tensor_type
    shape = [max(d.dim_value, 1) for d in tt.shape.dim]
    ones = np.ones(shape, dtype=helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return inputs_to_initializers(model, {weight: ones})


class _FusedRunner(DoubleBufferedRunner):
    """One session run per step: a binding per (parity, batch) holds everything, data included."""

    def __init__(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        graphs: dict[int, FusedStep],
        evaluator: Any,
        validation: Sequence[np.ndarray | None] | None,
        loss_name: str,
        data_names: list[str],
        step_names: list[str],
    ) -> None:
        weights = next(iter(graphs.values())).signature.weights
        super().__init__(store, state, device, lr, weights, evaluator, validation, loss_name, data_names)
        #: the inputs the batches feed the steps (data_names less unit sample weights)
        self.step_names = step_names
        self.loss_host = np.zeros((), dtype=self.dtype)
        self.loss_value = host_ortvalue(self.loss_host)
        # One binding per (parity, batch) with the batch's data bound too, made on first use: a
        # step is then a bare run. Past MAX_PREBOUND_BATCHES, one binding per (parity, batch
        # size) whose data inputs are bound again at each step.
        self.graphs = graphs
        self.prebound = len(store.bounds) <= MAX_PREBOUND_BATCHES
        self.shared = {
            (size, parity): self._binding(sig, sess, parity)
            for size, (_, sig, sess) in graphs.items()
            for parity in (0, 1)
            if not self.prebound
        }
        n = len(store.bounds)
        self.step_bindings: list[list[tuple[Any, Any] | None]] = [[None] * n, [None] * n]
        # a binding per batch on the host reads its step's scalars in place (bind_update)
        self.rows_bound = self.prebound and not self.device_resident

    def _binding(
        self, sig: FusedStepSignature, sess: Any, parity: int, batch: int | None = None
    ) -> CachedBinding:
        """A binding of the fused step: for batch ``batch`` alone, or shared (None)."""
        b = CachedBinding(sess)
        self.bind_update(b.binding, sig, parity, batch)
        b.binding.bind_ortvalue_output(sig.loss, self.loss_output(batch or 0, self.loss_value))
        return b

    def _step_binding(self, batch: int) -> tuple[Any, Any]:
        """(run, binding) for this batch at the current parity."""
        s, e = self.store.bounds[batch]
        _, sig, sess = self.graphs[e - s]
        if not self.prebound:
            b = self.shared[e - s, self.parity]
            for name, ov in zip(self.step_names, self.store.batches[batch]):
                b.bind_input(name, ov)
            if self.device_resident:
                b.binding.bind_ortvalue_output(sig.loss, self.batch_losses[batch].ortvalue)
            return sess.run_with_iobinding, b.binding
        b = self._binding(sig, sess, self.parity, batch)
        for name, ov in zip(self.step_names, self.store.batches[batch]):
            b.binding.bind_ortvalue_input(name, ov)
        entry = (sess.run_with_iobinding, b.binding)
        self.step_bindings[self.parity][batch] = entry
        return entry

    def step(self, batch: int) -> float:
        run, b = self.step_bindings[self.parity][batch] or self._step_binding(batch)
        self.before_step(batch)
        run(b, None)
        self.parity ^= 1
        self.after_step(batch)
        return 0.0 if self.device_resident else float(self.loss_host)
