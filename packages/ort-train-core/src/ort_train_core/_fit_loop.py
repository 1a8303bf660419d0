"""The fit loop both trainers share: epochs, batches, validation, early stopping, callbacks,
history, state, rollback on divergence, Ctrl-C, pickling. A trainer only says how one step runs
(:class:`StepRunner`)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import ModelProto

from ._data import BatchStore, DataSpec, check_fit_arrays
from ._params import ParamsMixin
from ._runtime import Device, parse_device
from .callbacks import Callback, EarlyStopping, EpochPrinter, ProgressBar
from .exceptions import ConvergenceError, ConvergenceWarning
from .learning_rate import BaseLearningRate, make_learning_rate


@dataclass
class TrainingState:
    """Everything a continued fit needs, on the host."""

    weights: dict[str, np.ndarray]
    optimizer: dict[str, list[np.ndarray]] = field(default_factory=dict)
    n_steps: int = 0

    def copy(self) -> TrainingState:
        return TrainingState(
            {k: v.copy() for k, v in self.weights.items()},
            {k: [a.copy() for a in v] for k, v in self.optimizer.items()},
            self.n_steps,
        )


class StepRunner(Protocol):
    """One fit's device-side machinery."""

    store: BatchStore
    has_validation: bool

    def set_epoch(self, epoch: int) -> None: ...

    def step(self, batch: int) -> float: ...

    def snapshot(self) -> TrainingState: ...

    def restore(self, state: TrainingState) -> None: ...

    def validation_loss(self) -> float: ...


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be an integer > 0, got {value!r}")
    return int(value)


class BaseOrtTrainer(ParamsMixin):
    """Shared parameters and the fit loop. Subclasses implement the abstract hooks."""

    model_onnx: ModelProto
    weights_to_train: Sequence[str] | None
    max_iter: int
    batch_size: int
    learning_rate: Any
    device: str
    warm_start: bool
    verbose: int
    shuffle: bool
    random_state: int | None
    tol: float | None
    n_iter_no_change: int
    callbacks: Sequence[Callback] | None

    # ---- hooks of a concrete trainer -------------------------------------------------
    def _prepare_graphs(self, device: Device, lr: BaseLearningRate) -> None:
        """Builds (or reuses) the graphs that do not depend on the data."""
        raise NotImplementedError

    def _data_spec(self) -> DataSpec:
        raise NotImplementedError

    def _initial_state(self) -> TrainingState:
        raise NotImplementedError

    def _make_runner(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
    ) -> StepRunner:
        raise NotImplementedError

    def _prediction_model(self) -> ModelProto:
        """The prediction graph (initial weights); trained weights are set on a copy."""
        raise NotImplementedError

    def _graphs_to_save(self) -> dict[str, ModelProto]:
        raise NotImplementedError

    def _batches_weighted_by_sample_weight(self) -> bool:
        """Whether the epoch loss weighs each batch by its total sample weight (a weighted-mean
        batch loss) rather than by its row count."""
        return True

    # ---- shared -----------------------------------------------------------------------
    def _on_params_changed(self) -> None:
        self._cache: dict[Any, Any] = {}

    @property
    def _graph_cache(self) -> dict[Any, Any]:
        if not hasattr(self, "_cache"):
            self._cache = {}
        return self._cache

    def _validate_params(self) -> tuple[Device, BaseLearningRate]:
        _positive_int("max_iter", self.max_iter)
        _positive_int("batch_size", self.batch_size)
        _positive_int("n_iter_no_change", self.n_iter_no_change)
        if self.tol is not None and not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"tol must be None or a number >= 0, got {self.tol!r}")
        if self.verbose not in (0, 1, 2, False, True):
            raise ValueError(
                f"verbose must be 0, 1 (progress bar) or 2 (one line per epoch), got {self.verbose!r}"
            )
        lr = make_learning_rate(self.learning_rate)
        lr.validate()
        device = parse_device(self.device)
        return device, lr

    def _make_callbacks(self) -> tuple[list[Callback], EarlyStopping | None]:
        cbs: list[Callback] = []
        if self.verbose == 1:
            cbs.append(ProgressBar())
        elif self.verbose == 2:
            cbs.append(EpochPrinter())
        early = None
        if self.tol is not None:
            early = EarlyStopping(float(self.tol), int(self.n_iter_no_change))
            cbs.append(early)
        cbs.extend(self.callbacks or ())
        return cbs, early

    def fit(
        self,
        X: Any,
        y: Any,
        sample_weight: Any = None,
        X_val: Any = None,
        y_val: Any = None,
        sample_weight_val: Any = None,
    ) -> BaseOrtTrainer:
        """Trains ``max_iter`` epochs (fewer with early stopping); continues with ``warm_start``."""
        device, lr = self._validate_params()
        self._prepare_graphs(device, lr)
        spec = self._data_spec()
        Xc, yc, wc = check_fit_arrays(spec, X, y, sample_weight)
        validation = None
        if (X_val is None) != (y_val is None):
            raise ValueError("give both X_val and y_val, or neither")
        if X_val is not None:
            validation = check_fit_arrays(spec, X_val, y_val, sample_weight_val, prefix="validation ")
        continuing = bool(self.warm_start) and getattr(self, "_state", None) is not None
        previous_lr: str | None = getattr(self, "_lr_signature", None)
        if continuing and previous_lr is not None and previous_lr != repr(lr):
            raise ValueError(
                "warm_start=True continues the optimizer state, but the learning rate changed "
                f"({previous_lr} -> {lr!r}); fit with warm_start=False to restart"
            )
        if not continuing:
            self._state = self._initial_state()
            self._rng = np.random.default_rng(self.random_state)
            self.n_iter_ = 0
            self.train_losses_: list[float] = []
            self.validation_losses_: list[float] = []
        self._lr_signature = repr(lr)
        arrays = [a for a in (Xc, yc, wc) if a is not None]
        store = BatchStore(arrays, int(self.batch_size), device, bool(self.shuffle))
        runner = self._make_runner(store, self._state, device, lr, validation)
        self._run_epochs(runner, store, wc if self._batches_weighted_by_sample_weight() else None)
        return self

    def _run_epochs(self, runner: StepRunner, store: BatchStore, weights: np.ndarray | None) -> None:
        callbacks, early = self._make_callbacks()
        n_epochs = int(self.max_iter)
        for cb in callbacks:
            cb.on_train_begin(self, n_epochs)
        n_batches = len(store.bounds)
        losses = np.empty(n_batches, dtype=np.float64)
        stopped_early = interrupted = False
        step, isfinite = runner.step, math.isfinite  # locals: the per-step path is a few us
        # the weights at the end of the last complete epoch: what a divergence rolls back to
        snapshot = runner.snapshot()
        try:
            with _catch_sigint() as flag:
                stop_requested = flag.is_set
                for _ in range(n_epochs):
                    epoch = self.n_iter_
                    order = self._rng.permutation(store.n) if self.shuffle else None
                    store.load(order)
                    totals = store.batch_totals(weights, order)
                    runner.set_epoch(epoch)
                    done = 0
                    for i in range(n_batches):
                        loss = step(i)
                        if not isfinite(loss):
                            runner.restore(snapshot)
                            self._state = snapshot
                            raise ConvergenceError(
                                f"the training loss became {loss} at epoch {epoch + 1}, batch {i + 1}: "
                                "weights were restored to the end of the last complete epoch; lower "
                                "the learning rate or scale the data",
                                epoch=epoch,
                                batch=i,
                            )
                        losses[i] = loss
                        done += 1
                        if stop_requested():
                            break
                    if done < n_batches:  # Ctrl-C: keep the steps taken, record no epoch
                        interrupted = True
                        break
                    self.n_iter_ += 1
                    logs = {"train_loss": float(np.dot(losses, totals) / totals.sum())}
                    self.train_losses_.append(logs["train_loss"])
                    if runner.has_validation:
                        logs["validation_loss"] = runner.validation_loss()
                        self.validation_losses_.append(logs["validation_loss"])
                    if not math.isfinite(logs.get("validation_loss", 0.0)):
                        runner.restore(snapshot)
                        self._state = snapshot
                        raise ConvergenceError(
                            f"the validation loss became {logs['validation_loss']} at epoch {epoch + 1}; "
                            "weights were restored to the end of the previous epoch",
                            epoch=epoch,
                            batch=n_batches - 1,
                        )
                    # callbacks see this epoch's weights through get_state()
                    snapshot = runner.snapshot()
                    self._state = snapshot
                    stop = False
                    for cb in callbacks:
                        stop = bool(cb.on_epoch_end(self, epoch, logs)) or stop
                    if stop:
                        stopped_early = True
                        break
            self._state = runner.snapshot()
        finally:
            for cb in callbacks:
                cb.on_train_end(self)
        if interrupted:
            warnings.warn(
                f"training interrupted (Ctrl-C) during epoch {self.n_iter_ + 1}; the weights are "
                "those after the last completed step",
                RuntimeWarning,
                stacklevel=3,
            )
        elif early is not None and not stopped_early:
            warnings.warn(
                f"max_iter={self.max_iter} reached before the loss stopped improving by tol={self.tol}",
                ConvergenceWarning,
                stacklevel=3,
            )

    # ---- state -----------------------------------------------------------------------
    def _current_state(self) -> TrainingState:
        state = getattr(self, "_state", None)
        return state if state is not None else self._initial_state()

    def get_state(self) -> dict[str, np.ndarray]:
        """Copies of the trained weights (the initial ones before any fit)."""
        return {k: v.copy() for k, v in self._current_state().weights.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replaces weights (all or some); a following fit with ``warm_start=True`` starts there."""
        current = self._current_state().copy()
        for name, value in state.items():
            if name not in current.weights:
                raise ValueError(f"unknown weight {name!r}; trained weights are {sorted(current.weights)}")
            ref = current.weights[name]
            arr = np.asarray(value)
            if arr.shape != ref.shape:
                raise ValueError(f"weight {name!r} must have shape {ref.shape}, got {arr.shape}")
            if not np.issubdtype(arr.dtype, np.number) or not np.isfinite(arr).all():
                raise ValueError(f"weight {name!r} must hold finite numbers")
            current.weights[name] = arr.astype(ref.dtype, copy=True)
        self._state = current
        if not hasattr(self, "n_iter_"):
            self.n_iter_ = 0
            self.train_losses_ = []
            self.validation_losses_ = []
            self._rng = np.random.default_rng(self.random_state)

    def get_trained_onnx(self) -> ModelProto:
        """The prediction graph with the current weights as initializers."""
        from .graph import inputs_to_initializers

        model = inputs_to_initializers(self._prediction_model(), self._current_state().weights)
        onnx.checker.check_model(model)
        return model

    def save_onnx_graph(self, folder: str | os.PathLike[str]) -> dict[str, str]:
        """Writes the trained model and every graph the trainer uses; returns name -> path."""
        os.makedirs(folder, exist_ok=True)
        graphs = {"trained": self.get_trained_onnx(), **self._graphs_to_save()}
        paths = {}
        for name, model in graphs.items():
            path = os.path.join(os.fspath(folder), f"{name}.onnx")
            onnx.save(model, path)
            paths[name] = path
        return paths

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_cache", None)  # sessions and graphs are rebuilt lazily
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class _Flag:
    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@contextlib.contextmanager
def _catch_sigint() -> Iterator[_Flag]:
    """Ctrl-C during a fit ends it after the current step instead of mid-update."""
    flag = _Flag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():  # a second Ctrl-C stops at once
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        flag.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
