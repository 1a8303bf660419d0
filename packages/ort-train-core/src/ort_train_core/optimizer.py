"""Full training: the loss is inside the graph, and one session run per step does forward,
loss, backward and the update of weights and optimizer states (the fused step graph)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import ModelProto

from ._binding import CachedBinding, DeviceArray, make_session
from ._data import BatchStore
from ._fit_loop import TrainingState
from ._gradient import FusedStepSignature, build_fused_step_graph
from ._loss_trainer import LossGraphTrainer
from ._runtime import Device
from .callbacks import Callback
from .graph import (
    normalise_model,
    set_batch_dimension,
)
from .learning_rate import BaseLearningRate


class OrtGradientOptimizer(LossGraphTrainer):
    """Trains a graph that already computes its loss (see :func:`add_loss_output`).

    Every distinct batch size gets its own fused graph with a fixed batch dimension, which lets
    onnxruntime drop the run-time shape arithmetic of the gradient (about half the kernels).
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

    def _model_key(self) -> tuple[Any, ...]:
        return (id(self.model_onnx), self.loss_output_name)

    @property
    def _loss_name(self) -> str:
        return self.loss_output_name

    def _input_overrides(self) -> tuple[str | None, str | None]:
        return self.label_name, self.sample_weight_name

    def _build_loss_model(self) -> ModelProto:
        model = normalise_model(self.model_onnx)
        outputs = [o.name for o in model.graph.output]
        if self.loss_output_name not in outputs:
            raise ValueError(
                f"the model has no output {self.loss_output_name!r} (outputs: {outputs}); "
                "add one with add_loss_output(model, ...) or set loss_output_name"
            )
        return model

    def _fused(
        self, batch: int, device: Device, lr: BaseLearningRate
    ) -> tuple[ModelProto, FusedStepSignature, Any]:
        key = ("fused", batch, str(device), repr(lr))
        cache = self._graph_cache
        if key not in cache:
            weights, label, weight, features = self._names()
            data = [*features, label] + ([weight] if weight else [])
            model = set_batch_dimension(self._trainable_model(), data, batch)
            graph, sig = build_fused_step_graph(model, self.loss_output_name, weights, lr)
            cache[key] = (graph, sig, make_session(graph, device))
        value: tuple[ModelProto, FusedStepSignature, Any] = cache[key]
        return value

    def _evaluator(self, device: Device) -> Any:
        key = ("eval", str(device))
        if key not in self._graph_cache:
            self._graph_cache[key] = make_session(self._trainable_model(), device)
        return self._graph_cache[key]

    def _graphs_to_save(self) -> dict[str, ModelProto]:
        out = {"loss": self._model()}
        for key, value in self._graph_cache.items():
            if isinstance(key, tuple) and key[0] == "fused":
                out[f"fused_step_batch{key[1]}"] = value[0]
        return out

    def _make_runner(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
    ) -> _FusedRunner:
        sizes = sorted({e - s for s, e in store.bounds})
        graphs = {size: self._fused(size, device, lr) for size in sizes}
        evaluator = self._evaluator(device) if validation is not None else None
        _, label, weight, features = self._names()
        data_names = [*features, label] + ([weight] if weight else [])
        return _FusedRunner(
            store,
            state,
            device,
            lr,
            graphs,
            evaluator,
            validation,
            self.loss_output_name,
            data_names,
        )


#: above this many batches per epoch, data inputs are bound at each step instead of once
MAX_PREBOUND_BATCHES = 2048


class _FusedRunner:
    """Double-buffered weights and states, and one cached binding per (batch size, parity):
    a step binds only the batch's data (pre-made OrtValues) and runs."""

    def __init__(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        graphs: dict[int, tuple[ModelProto, FusedStepSignature, Any]],
        evaluator: Any,
        validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
        loss_name: str,
        data_names: list[str],
    ) -> None:
        self.store = store
        self.lr = lr
        self.device = device
        any_sig = next(iter(graphs.values()))[1]
        self.weight_names = any_sig.weights
        dtype = next(iter(state.weights.values())).dtype
        self.buffers = {
            w: [DeviceArray(state.weights[w], device) for _ in range(2)] for w in self.weight_names
        }
        opt = state.optimizer
        self.states = {
            w: [
                [
                    DeviceArray(opt[w][j] if w in opt else np.zeros_like(state.weights[w]), device)
                    for _ in range(2)
                ]
                for j in range(len(lr.state_names))
            ]
            for w in self.weight_names
        }
        self.n_steps = state.n_steps
        self.scalar_host = [np.zeros((), dtype=dtype) for _ in lr.scalar_names]
        self.scalar_values = [C_ortvalue(a) for a in self.scalar_host]
        self.loss_host = np.zeros((), dtype=dtype)
        self.loss_value = C_ortvalue(self.loss_host)
        self.parity = 0
        self.data_names = data_names
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
        self.per_step_scalars = lr.scalars_change_every_step
        self.epoch = 0
        self.has_validation = validation is not None
        if validation is not None:
            self.eval_binding = CachedBinding(evaluator)
            names = self.data_names
            self.val_arrays = [DeviceArray(a, device, copy=False) for a in validation if a is not None]
            for name, arr in zip(names, self.val_arrays):
                self.eval_binding.bind_input(name, arr.ortvalue)
            self.val_loss_host = np.zeros((), dtype=dtype)
            self.val_loss_value = C_ortvalue(self.val_loss_host)
            self.eval_binding.bind_output(loss_name, self.val_loss_value)

    def _binding(self, sig: FusedStepSignature, sess: Any, parity: int) -> CachedBinding:
        """Reads weights and states of ``parity``, writes the other buffers (never the same one).

        Every OrtValue bound here is owned by this runner, which outlives the binding.
        """
        b = CachedBinding(sess)
        raw_in, raw_out = b.binding.bind_ortvalue_input, b.binding.bind_ortvalue_output
        for k, w in enumerate(sig.weights):
            raw_in(w, self.buffers[w][parity].ortvalue)
            raw_out(sig.new_weights[k], self.buffers[w][1 - parity].ortvalue)
            for j, (s_in, s_out) in enumerate(zip(sig.states[k], sig.new_states[k])):
                raw_in(s_in, self.states[w][j][parity].ortvalue)
                raw_out(s_out, self.states[w][j][1 - parity].ortvalue)
        for name, ov in zip(sig.scalars, self.scalar_values):
            raw_in(name, ov)
        raw_out(sig.loss, self.loss_value)
        return b

    def _step_binding(self, batch: int) -> tuple[Any, Any]:
        """(run, binding) for this batch at the current parity."""
        s, e = self.store.bounds[batch]
        _, sig, sess = self.graphs[e - s]
        if not self.prebound:
            b = self.shared[e - s, self.parity]
            for name, ov in zip(self.data_names, self.store.batches[batch]):
                b.bind_input(name, ov)
            return sess.run_with_iobinding, b.binding
        b = self._binding(sig, sess, self.parity)
        for name, ov in zip(self.data_names, self.store.batches[batch]):
            b.binding.bind_ortvalue_input(name, ov)
        entry = (sess.run_with_iobinding, b.binding)
        self.step_bindings[self.parity][batch] = entry
        return entry

    def _write_scalars(self) -> None:
        for host, value in zip(self.scalar_host, self.lr.scalar_values(self.epoch, self.n_steps + 1)):
            host[()] = value

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._write_scalars()

    def step(self, batch: int) -> float:
        run, b = self.step_bindings[self.parity][batch] or self._step_binding(batch)
        if self.per_step_scalars:
            self._write_scalars()
        run(b, None)
        self.parity ^= 1
        self.n_steps += 1
        return float(self.loss_host)

    def snapshot(self) -> TrainingState:
        p = self.parity
        return TrainingState(
            {w: self.buffers[w][p].read() for w in self.weight_names},
            {w: [s[p].read() for s in self.states[w]] for w in self.weight_names if self.states[w]},
            self.n_steps,
        )

    def restore(self, state: TrainingState) -> None:
        p = self.parity
        for w in self.weight_names:
            self.buffers[w][p].write(state.weights[w])
            for j, s in enumerate(self.states[w]):
                s[p].write(state.optimizer[w][j])
        self.n_steps = state.n_steps

    def validation_loss(self) -> float:
        for w in self.weight_names:
            self.eval_binding.bind_input(w, self.buffers[w][self.parity].ortvalue)
        self.eval_binding.run()
        return float(self.val_loss_host)


def C_ortvalue(host: np.ndarray) -> Any:
    """An OrtValue viewing a host array the caller keeps alive (0-d scalars, loss outputs)."""
    from ._runtime import C

    return C.OrtValue.ortvalue_from_numpy(
        host, C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    )
