"""What the step runners of both loops share: weights and optimizer states double-buffered on
the device, the per-step scalars of the learning rate, snapshots for rollback, and the
validation loss. A runner differs only in :meth:`step`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._binding import CachedBinding, DeviceArray
from ._data import BatchStore, dense_rows, device_resident, is_sparse
from ._padded import is_padded
from ._runtime import Device, ort_capi
from .checkpoint import TrainingState
from .learning_rate import ADAPTIVE_DIVISOR, ADAPTIVE_MIN_RATE, BaseLearningRate

#: above this many batches per epoch, data inputs are bound at each step instead of once
MAX_PREBOUND_BATCHES = 2048


def host_ortvalue(host: np.ndarray) -> Any:
    """An OrtValue viewing a host array the caller keeps alive (0-d scalars, loss outputs)."""
    return ort_capi.OrtValue.ortvalue_from_numpy(
        host, ort_capi.OrtDevice(ort_capi.OrtDevice.cpu(), ort_capi.OrtDevice.default_memory(), 0)
    )


class DoubleBufferedRunner:
    """Parity p holds the current weights and states; an update reads p and writes 1 - p (never
    the same buffer as input and output), then the parity flips."""

    def __init__(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        weight_names: Sequence[str],
        evaluator: Any,
        validation: Sequence[np.ndarray | None] | None,
        loss_name: str,
        data_names: list[str],
    ) -> None:
        self.store = store
        self.lr = lr
        self.device = device
        self.weight_names = list(weight_names)
        self.data_names = data_names
        dtype = next(iter(state.weights.values())).dtype
        self.dtype = dtype
        #: BatchNormalization's running statistics: state beside the weights (in
        #: ``state.weights``), double-buffered like them but updated by the step's outputs
        trained = set(self.weight_names)
        self.statistic_names = [n for n in state.weights if n not in trained]
        self.buffers = {
            w: [DeviceArray(state.weights[w], device) for _ in range(2)]
            for w in [*self.weight_names, *self.statistic_names]
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
        #: rows read by the steps so far, and the rows of each batch (per-sample schedules)
        self.n_samples = state.n_samples
        self.batch_rows = [e - s for s, e in store.bounds]
        #: the data and each batch's loss stay on the device (CUDA): a batch's loss waits in its
        #: own device scalar until epoch_losses() reads them all at the end of the epoch, so a
        #: step never waits for the device to hand a number back; step() then returns 0.0
        self.device_resident = device_resident(device)
        n = len(store.bounds) if self.device_resident else 0
        self.batch_losses = [DeviceArray.zeros((), dtype, device) for _ in range(n)]
        #: 'adaptive': what the plateaus of this fit have divided the rate by (each fit starts at
        #: 1, as scikit-learn's; resume replays the plateaus of the checkpointed history)
        self.lr_scale = 1.0
        #: the epochs whose plateau divided it: two stopping rules at the same epoch divide once
        self.reduced_epochs: set[int] = set()
        self._init_scalars(lr)
        self.parity = 0
        self.epoch = 0
        self.has_validation = validation is not None
        if validation is not None:
            self._init_validation(evaluator, validation, loss_name)

    def _init_scalars(self, lr: BaseLearningRate) -> None:
        """The learning rate's scalars: host values on CPU; device scalars where resident, so
        that a step does not copy them from pageable host memory (which waits for the stream)
        when they change once per epoch."""
        self.scalar_host = [np.zeros((), dtype=self.dtype) for _ in lr.scalar_names]
        self.scalar_device = (
            [DeviceArray(a, self.device) for a in self.scalar_host] if self.device_resident else []
        )
        self.scalar_values = (
            [a.ortvalue for a in self.scalar_device]
            if self.device_resident
            else [host_ortvalue(a) for a in self.scalar_host]
        )
        self.per_step_scalars = lr.scalars_change_every_step
        #: per-step scalars: every update's values of the epoch, computed at its start (one
        #: vectorised call, not a Python call per step: a third of a small model's step)
        self.scalar_table = np.zeros(
            (len(self.batch_rows) if self.per_step_scalars else 0, len(lr.scalar_names)), dtype=self.dtype
        )
        #: True once the steps' bindings read their own row of the table in place (CPU
        #: bindings per batch: see batch_scalars); else each step copies its row first
        self.rows_bound = False
        self._row_values: dict[int, list[Any]] = {}
        self.epoch_first_step = self.n_steps

    def _init_validation(
        self, evaluator: Any, validation: Sequence[np.ndarray | None], loss_name: str
    ) -> None:
        """The validation data on the device, bound once to the evaluator with a host loss."""
        self.eval_binding = CachedBinding(evaluator)
        # a sparse validation X is densified whole: it is run at once after every epoch
        self.val_arrays = [
            DeviceArray(
                dense_rows(a, slice(None)) if is_sparse(a) or is_padded(a) else a, self.device, copy=False
            )
            for a in validation
            if a is not None
        ]
        for name, arr in zip(self.data_names, self.val_arrays):
            self.eval_binding.bind_input(name, arr.ortvalue)
        self.val_loss_host = np.zeros((), dtype=self.dtype)
        self.val_loss_value = host_ortvalue(self.val_loss_host)
        self.eval_binding.bind_output(loss_name, self.val_loss_value)

    def loss_output(self, batch: int, host_value: Any) -> Any:
        """The OrtValue a step's loss is written to: the batch's device scalar when resident,
        else ``host_value`` (a host scalar read right after the step)."""
        return self.batch_losses[batch].ortvalue if self.device_resident else host_value

    def epoch_losses(self, n_done: int, first: int = 0) -> np.ndarray:
        """The losses a resident fit left on the device for batches ``first`` to ``n_done - 1``
        of the epoch (one read each)."""
        return np.array([float(a.read()) for a in self.batch_losses[first:n_done]], dtype=np.float64)

    def batch_scalars(self, batch: int) -> list[Any]:
        """OrtValues viewing batch ``batch``'s row of the scalar table (host memory): a binding
        made for that batch alone reads the values of its step there, written at set_epoch."""
        if batch not in self._row_values:
            row = self.scalar_table[batch]
            self._row_values[batch] = [host_ortvalue(row[j, ...]) for j in range(len(row))]
        return self._row_values[batch]

    def bind_update(self, binding: Any, sig: Any, parity: int, batch: int | None = None) -> None:
        """Binds weights, states and scalars of an update (fused or standalone): reads
        ``parity``, writes the other buffers. The runner owns every OrtValue bound here.
        ``batch``: the binding serves that batch only and reads its row of the scalar table
        (per-step scalars on the host; the caller then sets ``rows_bound``)."""
        raw_in, raw_out = binding.bind_ortvalue_input, binding.bind_ortvalue_output
        for k, w in enumerate(sig.weights):
            raw_in(w, self.buffers[w][parity].ortvalue)
            raw_out(sig.new_weights[k], self.buffers[w][1 - parity].ortvalue)
            for j, (s_in, s_out) in enumerate(zip(sig.states[k], sig.new_states[k])):
                raw_in(s_in, self.states[w][j][parity].ortvalue)
                raw_out(s_out, self.states[w][j][1 - parity].ortvalue)
        scalars = self.scalar_values
        if batch is not None and self.per_step_scalars and not self.device_resident:
            scalars = self.batch_scalars(batch)
        for name, ov in zip(sig.scalars, scalars):
            raw_in(name, ov)
        for s_in, s_out in zip(getattr(sig, "statistics", ()), getattr(sig, "new_statistics", ())):
            raw_in(s_in, self.buffers[s_in][parity].ortvalue)
            raw_out(s_out, self.buffers[s_in][1 - parity].ortvalue)

    def _write_scalars(self, values: Sequence[float] | np.ndarray) -> None:
        for host, value in zip(self.scalar_host, values):
            host[()] = value
        for dev, host in zip(self.scalar_device, self.scalar_host):
            dev.write(host)

    def _fill_table(self) -> None:
        """The per-step scalars of the whole epoch, from its first step and sample on."""
        table = self.lr.scalar_table(self.epoch, self.n_steps + 1, self.n_samples, self.store.rows_per_batch)
        table[:, 0] *= self.lr_scale  # the first scalar is proportional to eta0: 'adaptive'
        self.scalar_table[...] = table

    def before_step(self, batch: int) -> None:
        """Copies the coming step's row of the scalar table into the shared scalars where they
        change at every step and its binding does not read the row in place."""
        if self.per_step_scalars and not self.rows_bound:
            self._write_scalars(self.scalar_table[batch])

    def after_step(self, batch: int) -> None:
        """Counts the step and its rows."""
        self.n_steps += 1
        self.n_samples += self.batch_rows[batch]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epoch_first_step = self.n_steps
        if self.per_step_scalars:
            self._fill_table()
            return
        values = self.lr.scalar_values(epoch, self.n_steps + 1, self.n_samples)
        # the first scalar of every learning rate is proportional to eta0: 'adaptive' scales it
        self._write_scalars((values[0] * self.lr_scale, *values[1:]))

    def reduce_learning_rate(self, epoch: int) -> bool:
        """``learning_rate='adaptive'`` at the plateau of ``epoch``: divides the rate by
        ADAPTIVE_DIVISOR from the next epoch and returns True; False (the fit stops) for other
        schedules or once the rate is <= ADAPTIVE_MIN_RATE. A second stopping rule reaching its
        plateau at the same epoch gets True without a second division."""
        if epoch in self.reduced_epochs:
            return True
        if not self.lr.adaptive or float(self.lr.eta0) * self.lr_scale <= ADAPTIVE_MIN_RATE:
            return False
        self.lr_scale /= ADAPTIVE_DIVISOR
        self.reduced_epochs.add(epoch)
        if self.per_step_scalars:  # from the next step on, also when called within an epoch
            self.scalar_table[self.n_steps - self.epoch_first_step :, 0] /= ADAPTIVE_DIVISOR
        return True

    def continue_fit(self, lr: BaseLearningRate) -> None:
        """Readies a kept runner for a fit that continues from its weights (the fit loop's
        _runner_for): the fit's learning rate, its 'adaptive' divisions starting afresh as in
        a new runner."""
        self.lr = lr
        self.lr_scale = 1.0
        self.reduced_epochs = set()

    def weights(self) -> dict[str, np.ndarray]:
        """Host copies of the current weights and running statistics (no optimizer states)."""
        p = self.parity
        return {w: buffers[p].read() for w, buffers in self.buffers.items()}

    def snapshot(self) -> TrainingState:
        p = self.parity
        return TrainingState(
            self.weights(),
            {w: [s[p].read() for s in self.states[w]] for w in self.weight_names if self.states[w]},
            self.n_steps,
            self.n_samples,
        )

    def restore(self, state: TrainingState) -> None:
        p = self.parity
        for w, buffers in self.buffers.items():
            buffers[p].write(state.weights[w])
        for w in self.weight_names:
            for j, s in enumerate(self.states[w]):
                s[p].write(state.optimizer[w][j])
        self.n_steps = state.n_steps
        self.n_samples = state.n_samples

    def validation_loss(self) -> float:
        for w, buffers in self.buffers.items():
            self.eval_binding.bind_input(w, buffers[self.parity].ortvalue)
        self.eval_binding.run()
        return float(self.val_loss_host)
