"""The fit loop both trainers share: epochs, batches, validation, early stopping, callbacks,
history, state, rollback on divergence, Ctrl-C, checkpoints, pickling. A trainer only says how
one step runs (:class:`StepRunner`)."""

from __future__ import annotations

import contextlib
import hashlib
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
from onnx import ModelProto, numpy_helper

from ._data import BatchStore, DataSpec, _count_non_finite, check_fit_arrays
from ._data import _all_finite as _array_finite
from ._params import ParamsMixin
from ._runtime import Device, parse_device
from .callbacks import Callback, EarlyStopping, EpochPrinter, ProgressBar
from .checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from .exceptions import CheckpointMismatchError, ConvergenceError, ConvergenceWarning
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
    #: step() returns 0.0 and epoch_losses() reads the epoch's losses at its end
    defer_losses: bool

    def set_epoch(self, epoch: int) -> None: ...

    def step(self, batch: int) -> float: ...

    def epoch_losses(self, n_done: int) -> np.ndarray: ...

    def snapshot(self) -> TrainingState: ...

    def restore(self, state: TrainingState) -> None: ...

    def validation_loss(self) -> float: ...


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be an integer > 0, got {value!r}")
    return int(value)


def _all_finite(state: TrainingState) -> bool:
    arrays = [*state.weights.values(), *(a for states in state.optimizer.values() for a in states)]
    return all(bool(np.isfinite(a).all()) for a in arrays)


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
    checkpoint_dir: str | os.PathLike[str] | None
    checkpoint_every: int

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

    def _fingerprint(self) -> str:
        """What a checkpoint must match: the hash of the graph being trained."""
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
        self._checkpoint_path()
        return device, lr

    def _checkpoint_path(self) -> str | None:
        """``checkpoint_dir/checkpoint.npz``, or None without checkpoint_dir (validates both
        checkpoint parameters)."""
        folder = getattr(self, "checkpoint_dir", None)
        if folder is None:
            return None
        if not isinstance(folder, (str, os.PathLike)):
            raise TypeError(f"checkpoint_dir must be None or a folder path, not {type(folder).__name__}")
        _positive_int("checkpoint_every", getattr(self, "checkpoint_every", 1))
        return os.path.join(os.fspath(folder), CHECKPOINT_FILE)

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
        """Trains ``max_iter`` epochs (fewer with early stopping); continues with ``warm_start``.

        With ``checkpoint_dir``, writes ``checkpoint_dir/checkpoint.npz`` every
        ``checkpoint_every`` completed epochs, at the end, and on Ctrl-C (see :meth:`resume`)."""
        return self._fit(X, y, sample_weight, X_val, y_val, sample_weight_val, resume=False)

    def resume(
        self,
        X: Any,
        y: Any,
        sample_weight: Any = None,
        X_val: Any = None,
        y_val: Any = None,
        sample_weight_val: Any = None,
    ) -> BaseOrtTrainer:
        """Continues the fit saved in ``checkpoint_dir`` up to ``max_iter`` epochs in all; starts a
        new fit when there is no checkpoint yet, so a job can always call ``resume``.

        Give the same data and settings: the weights, optimizer states, step count, shuffling
        RNG, loss history and early-stopping counters are restored, so the run ends with the
        weights an uninterrupted fit would have. A checkpoint holds the state at the end of a
        complete epoch (a Ctrl-C mid-epoch saves the previous epoch end): the steps of a partial
        epoch are done again.

        A checkpoint records what decides the final weights: ``batch_size``, ``shuffle``,
        ``random_state`` and a fingerprint of the data (shapes, dtypes and 64 evenly spaced rows
        of X, y and sample weights, and of the validation data). One written with other values
        is refused with :class:`~ort_train_core.exceptions.CheckpointMismatchError` (a
        ValueError naming the parameter) before anything is restored. A checkpoint of an
        earlier version, which recorded no seed nor data fingerprint, resumes with a
        UserWarning."""
        if self._checkpoint_path() is None:
            raise ValueError("resume reads checkpoint_dir/checkpoint.npz: set checkpoint_dir")
        return self._fit(X, y, sample_weight, X_val, y_val, sample_weight_val, resume=True)

    def prepare(
        self,
        X: Any,
        y: Any,
        sample_weight: Any = None,
        X_val: Any = None,
        y_val: Any = None,
        sample_weight_val: Any = None,
    ) -> BaseOrtTrainer:
        """Builds the graphs and sessions a fit of this data would use, without training.

        A later :meth:`fit` with data of the same shapes finds them built, so that a benchmark
        can time the training steps alone. The weights, history and state are left untouched.

        Parameters
        ----------
        X, y, sample_weight, X_val, y_val, sample_weight_val : array-like or None
            The arguments :meth:`fit` will receive (checked as fit checks them); the number of
            rows and ``batch_size`` decide which batch sizes get a graph.

        Returns
        -------
        BaseOrtTrainer
            ``self``.
        """
        device, lr = self._validate_params()
        self._prepare_graphs(device, lr)
        data, validation = self._checked_data(X, y, sample_weight, X_val, y_val, sample_weight_val)
        self._make_runner(self._batch_store(data, device), self._initial_state(), device, lr, validation)
        return self

    def _checked_data(
        self, X: Any, y: Any, sample_weight: Any, X_val: Any, y_val: Any, sample_weight_val: Any
    ) -> tuple[
        tuple[np.ndarray, np.ndarray, np.ndarray | None],
        tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
    ]:
        """The training and validation arrays as fit uses them (validated, converted)."""
        spec = self._data_spec()
        data = check_fit_arrays(spec, X, y, sample_weight)
        if (X_val is None) != (y_val is None):
            raise ValueError("give both X_val and y_val, or neither")
        if X_val is None:
            return data, None
        return data, check_fit_arrays(spec, X_val, y_val, sample_weight_val, prefix="validation ")

    def _batch_store(
        self, data: tuple[np.ndarray, np.ndarray, np.ndarray | None], device: Device
    ) -> BatchStore:
        arrays = [a for a in data if a is not None]
        return BatchStore(arrays, int(self.batch_size), device, bool(self.shuffle))

    def _fit(
        self,
        X: Any,
        y: Any,
        sample_weight: Any,
        X_val: Any,
        y_val: Any,
        sample_weight_val: Any,
        resume: bool,
    ) -> BaseOrtTrainer:
        device, lr = self._validate_params()
        self._prepare_graphs(device, lr)
        (Xc, yc, wc), validation = self._checked_data(X, y, sample_weight, X_val, y_val, sample_weight_val)
        # what resume must find in the checkpoint, and what this fit's checkpoints record
        record = self._resume_record((Xc, yc, wc), validation)
        path = self._checkpoint_path()
        resuming = resume and path is not None and os.path.exists(path)
        if resuming:
            assert path is not None
            self._load_checkpoint(path, expected=record)
        self._run_record = record
        continuing = resuming or (bool(self.warm_start) and getattr(self, "_state", None) is not None)
        previous_lr: str | None = getattr(self, "_lr_signature", None)
        if continuing and previous_lr is not None and previous_lr != repr(lr):
            raise ValueError(
                "continuing a fit (warm_start=True or resume) continues the optimizer state, but the "
                f"learning rate changed ({previous_lr} -> {lr!r}); fit with warm_start=False to restart"
            )
        if not continuing:
            initial = self._initial_state()
            bad = describe_non_finite(initial.weights)
            if bad:  # the loss would be NaN from the first step, whatever the learning rate
                raise ValueError(
                    f"the initial values of {bad} hold NaN or inf before any training step: "
                    "re-initialise these weights in the model with finite values (or, in Python, "
                    "give finite ones with set_state() and fit with warm_start=True)"
                )
            self._state = initial
            self._rng = np.random.default_rng(self.random_state)
            self.n_iter_ = 0
            self.train_losses_: list[float] = []
            self.validation_losses_: list[float] = []
        self._lr_signature = repr(lr)
        n_epochs = int(self.max_iter) - self.n_iter_ if resuming else int(self.max_iter)
        if n_epochs <= 0:
            return self
        store = self._batch_store((Xc, yc, wc), device)
        runner = self._make_runner(store, self._state, device, lr, validation)
        self._run_epochs(
            runner,
            store,
            wc if self._batches_weighted_by_sample_weight() else None,
            n_epochs,
            replay_history=resuming,
        )
        return self

    def _run_epochs(
        self,
        runner: StepRunner,
        store: BatchStore,
        weights: np.ndarray | None,
        n_epochs: int,
        replay_history: bool = False,
    ) -> None:
        callbacks, early = self._make_callbacks()
        for cb in callbacks:
            cb.on_train_begin(self, n_epochs)
        if replay_history and _replayed_stop(callbacks, self):
            for cb in callbacks:  # the checkpointed run had already stopped early
                cb.on_train_end(self)
            return
        ckpt = self._checkpoint_path()
        every = int(self.checkpoint_every) if ckpt is not None else 0
        written = -1
        n_batches = len(store.bounds)
        losses = np.empty(n_batches, dtype=np.float64)
        stopped_early = interrupted = False
        step, isfinite = runner.step, math.isfinite  # locals: the per-step path is a few us
        fill = store.fill if store.gathers else None
        # the weights at the end of the last complete epoch: what a divergence rolls back to
        snapshot = runner.snapshot()
        try:
            with _catch_sigint() as flag:
                stop_requested = flag.is_set
                for _ in range(n_epochs):
                    epoch = self.n_iter_
                    # the RNG as the last complete epoch left it: what a Ctrl-C checkpoint saves
                    rng_state = self._rng.bit_generator.state if ckpt is not None else None
                    order = self._rng.permutation(store.n) if self.shuffle else None
                    store.load(order)
                    totals = store.batch_totals(weights, order)
                    runner.set_epoch(epoch)
                    done = 0
                    for i in range(n_batches):
                        if fill is not None:
                            fill(i)
                        loss = step(i)
                        if not isfinite(loss):
                            raise self._rolled_back(
                                runner, snapshot, _loss_diverged(loss, epoch, i), epoch, i
                            )
                        losses[i] = loss
                        done += 1
                        if stop_requested():
                            break
                    if runner.defer_losses:  # one read-back per epoch, the same check
                        losses[:done] = runner.epoch_losses(done)
                        bad = np.flatnonzero(~np.isfinite(losses[:done]))
                        if bad.size:
                            i = int(bad[0])
                            raise self._rolled_back(
                                runner, snapshot, _loss_diverged(losses[i], epoch, i), epoch, i
                            )
                    if done < n_batches:  # Ctrl-C: keep the steps taken, record no epoch
                        interrupted = True
                        if ckpt is not None:  # the last epoch end, so that resume is exact
                            self._write_checkpoint(ckpt, snapshot, rng_state)
                            written = self.n_iter_
                        break
                    # a gradient can overflow while the loss it came from is finite: the
                    # epoch's last step would then hand back inf weights without an error
                    candidate = runner.snapshot()
                    if not _all_finite(candidate):
                        raise self._rolled_back(
                            runner,
                            snapshot,
                            f"the weights became infinite or NaN at epoch {epoch + 1} (a gradient "
                            "overflowed while the loss stayed finite): weights were restored to the end "
                            "of the last complete epoch; lower the learning rate or scale the data",
                            epoch,
                            n_batches - 1,
                        )
                    self.n_iter_ += 1
                    logs = {"train_loss": float(np.dot(losses, totals) / totals.sum())}
                    self.train_losses_.append(logs["train_loss"])
                    if runner.has_validation:
                        logs["validation_loss"] = runner.validation_loss()
                        self.validation_losses_.append(logs["validation_loss"])
                    if not math.isfinite(logs.get("validation_loss", 0.0)):
                        raise self._rolled_back(
                            runner,
                            snapshot,
                            f"the validation loss became {logs['validation_loss']} at epoch {epoch + 1}; "
                            "weights were restored to the end of the previous epoch",
                            epoch,
                            n_batches - 1,
                        )
                    # callbacks see this epoch's weights through get_state()
                    snapshot = candidate
                    self._state = snapshot
                    if ckpt is not None and self.n_iter_ % every == 0:
                        self._write_checkpoint(ckpt, snapshot, self._rng.bit_generator.state)
                        written = self.n_iter_
                    stop = False
                    for cb in callbacks:
                        stop = bool(cb.on_epoch_end(self, epoch, logs)) or stop
                    if stop:
                        stopped_early = True
                        break
            final = runner.snapshot()
            if not _all_finite(final):  # Ctrl-C after a step that overflowed
                runner.restore(snapshot)
                final = snapshot
            self._state = final
            if ckpt is not None and written != self.n_iter_:  # the end of the fit
                self._write_checkpoint(ckpt, snapshot, self._rng.bit_generator.state)
        finally:
            for cb in callbacks:
                cb.on_train_end(self)
        if interrupted:
            saved = f"; {ckpt} holds the end of epoch {self.n_iter_} for resume()" if ckpt else ""
            warnings.warn(
                f"training interrupted (Ctrl-C) during epoch {self.n_iter_ + 1}; the weights are "
                f"those after the last completed step{saved}",
                RuntimeWarning,
                stacklevel=4,
            )
        elif early is not None and not stopped_early:
            warnings.warn(
                f"max_iter={self.max_iter} reached before the loss stopped improving by tol={self.tol}",
                ConvergenceWarning,
                stacklevel=4,
            )

    def _rolled_back(
        self, runner: StepRunner, snapshot: TrainingState, message: str, epoch: int, batch: int
    ) -> ConvergenceError:
        """Every divergence: restores ``snapshot`` (the last complete epoch) on the device and
        as the trainer's state, and returns the error to raise."""
        runner.restore(snapshot)
        self._state = snapshot
        # at the very first step a NaN constant is the likelier cause than the learning rate
        nan = self._nan_constants(set(snapshot.weights)) if epoch == 0 and batch == 0 else ""
        if nan:
            message = (
                f"the loss is NaN from the first step: the initializers not trained {nan} hold NaN, "
                "whatever the learning rate; fix them in the model (the trained weights were "
                "restored to their initial values)"
            )
        return ConvergenceError(message, epoch=epoch, batch=batch)

    def _nan_constants(self, trained: set[str]) -> str:
        """The float initializers outside ``trained`` that hold NaN, described; only NaN: an inf
        constant is common and harmless (a mask added before a softmax)."""
        constants = {
            i.name: numpy_helper.to_array(i)
            for i in self._prediction_model().graph.initializer
            if i.name not in trained
            and i.data_type in _FLOAT_TYPES
            and i.data_location != onnx.TensorProto.EXTERNAL  # not in memory: not read here
        }
        return describe_non_finite({k: v for k, v in constants.items() if np.isnan(v).any()})

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

    # ---- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Writes the training state (weights, optimizer states, step and epoch counts, shuffling
        RNG, loss history, learning rate, model fingerprint) to ``path`` atomically, as an
        ``.npz`` without pickle. A fit resumed from it is exact when it was taken at the end of
        an epoch (as ``checkpoint_dir`` checkpoints are)."""
        if not hasattr(self, "n_iter_"):
            raise ValueError("nothing to save: fit the trainer (or set_state) first")
        self._write_checkpoint(os.fspath(path), self._current_state(), self._rng.bit_generator.state)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restores what :meth:`save_checkpoint` wrote; a following fit with ``warm_start=True``
        (or :meth:`resume`) continues from there. Refuses a checkpoint of another model or of
        other trained weights (ValueError)."""
        self._load_checkpoint(os.fspath(path))

    def _load_checkpoint(self, path: str, expected: Mapping[str, Any] | None = None) -> None:
        """load_checkpoint; with ``expected`` (resume), first refuses a checkpoint written with
        other settings or data (see :meth:`_resume_record`)."""
        arrays, meta = read_checkpoint(path)
        try:
            self._restore_checkpoint(path, arrays, meta, expected)
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path} is a malformed checkpoint: {exc!r}") from exc

    def _resume_record(
        self,
        data: tuple[np.ndarray, np.ndarray, np.ndarray | None],
        validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
    ) -> dict[str, Any]:
        """What decides the weights a fit ends at besides the model and learning rate (checked
        elsewhere): the batches' size, order and seed, and the (validated) data, fingerprinted
        cheaply. A checkpoint records it; resume refuses one that differs."""
        return {
            "batch_size": int(self.batch_size),
            "shuffle": bool(self.shuffle),
            "random_state": _seed_record(self.random_state),
            "data": data_fingerprint(data),
            "validation_data": None if validation is None else data_fingerprint(validation),
        }

    def _write_checkpoint(self, path: str, state: TrainingState, rng_state: Mapping[str, Any] | None) -> None:
        names = list(state.weights)
        arrays: dict[str, np.ndarray] = {}
        n_states = []
        for i, name in enumerate(names):
            arrays[f"w{i}"] = state.weights[name]
            opt = state.optimizer.get(name, [])
            n_states.append(len(opt))
            for j, value in enumerate(opt):
                arrays[f"s{i}_{j}"] = value
        meta = {
            "trainer": type(self).__name__,
            "fingerprint": self._fingerprint(),
            "weights": names,
            "n_states": n_states,
            "n_steps": int(state.n_steps),
            "n_iter_": int(self.n_iter_),
            "train_losses_": [float(v) for v in self.train_losses_],
            "validation_losses_": [float(v) for v in self.validation_losses_],
            "lr_signature": getattr(self, "_lr_signature", None),
            "rng": _jsonable(rng_state),
            "batch_size": int(self.batch_size),
            "shuffle": bool(self.shuffle),
        }
        # the seed and data fingerprints of the fit that wrote it (none after set_state alone)
        meta.update({k: v for k, v in getattr(self, "_run_record", {}).items() if k not in meta})
        write_checkpoint(path, arrays, meta)

    def _restore_checkpoint(
        self,
        path: str,
        arrays: dict[str, np.ndarray],
        meta: dict[str, Any],
        resume_record: Mapping[str, Any] | None = None,
    ) -> None:
        expected = self._fingerprint()
        if meta["fingerprint"] != expected:
            raise ValueError(
                f"{path} is a checkpoint of another model (trainer {meta.get('trainer')!r}, graph "
                f"fingerprint {str(meta['fingerprint'])[:12]}..., this one {expected[:12]}...): "
                "load it into a trainer built from the same graph and loss"
            )
        if resume_record is not None:
            _check_resume(path, meta, resume_record)
        initial = self._initial_state()
        names = list(meta["weights"])
        if names != list(initial.weights):
            raise ValueError(f"{path} holds weights {names} but this trainer trains {list(initial.weights)}")
        weights: dict[str, np.ndarray] = {}
        optimizer: dict[str, list[np.ndarray]] = {}
        for i, name in enumerate(names):
            ref = initial.weights[name]
            weights[name] = _checked(path, name, arrays[f"w{i}"], ref)
            states = [_checked(path, name, arrays[f"s{i}_{j}"], ref) for j in range(int(meta["n_states"][i]))]
            if states:
                optimizer[name] = states
        n_steps, n_iter = int(meta["n_steps"]), int(meta["n_iter_"])
        if n_steps < 0 or n_iter < 0:
            raise ValueError(f"{path} holds negative step or epoch counts")
        rng = np.random.default_rng(self.random_state)
        if meta.get("rng") is not None:
            state = _from_jsonable(meta["rng"])
            kind = state["bit_generator"]
            if kind not in _BIT_GENERATORS:  # the file names a class: never let it name any callable
                raise ValueError(f"{path}: unknown random bit generator {kind!r}")
            rng = np.random.Generator(getattr(np.random, kind)())
            try:
                rng.bit_generator.state = state
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}: invalid random generator state: {exc}") from exc
        self._state = TrainingState(weights, optimizer, n_steps)
        self._rng = rng
        self.n_iter_ = n_iter
        self.train_losses_ = [float(v) for v in meta["train_losses_"]]
        self.validation_losses_ = [float(v) for v in meta["validation_losses_"]]
        if meta.get("lr_signature") is not None:
            self._lr_signature = str(meta["lr_signature"])

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


_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def describe_non_finite(weights: Mapping[str, np.ndarray]) -> str:
    """``"'W' (2 of 6 values), 'b' (1 of 3 values)"`` for the float arrays holding NaN or inf;
    an empty string when there is none.

    Parameters
    ----------
    weights : mapping of str to ndarray
        Arrays by name.

    Returns
    -------
    str
        The names and counts, for an error or warning message.
    """
    bad = [
        f"{name!r} ({_count_non_finite(value)} of {value.size} values)"
        for name, value in weights.items()
        if np.issubdtype(value.dtype, np.floating) and not _array_finite(value)
    ]
    return ", ".join(bad)


def _loss_diverged(loss: float, epoch: int, batch: int) -> str:
    return (
        f"the training loss became {loss} at epoch {epoch + 1}, batch {batch + 1}: "
        "weights were restored to the end of the last complete epoch; lower "
        "the learning rate or scale the data"
    )


def _replay(early: EarlyStopping, trainer: BaseOrtTrainer) -> bool:
    """Feeds a restored loss history to a new early-stopping callback, as the checkpointed run
    fed it; True when there was a history."""
    val = trainer.validation_losses_
    for epoch, loss in enumerate(trainer.train_losses_):
        logs = {"train_loss": loss}
        if epoch < len(val):
            logs["validation_loss"] = val[epoch]
        early.on_epoch_end(trainer, epoch, logs)
    return bool(trainer.train_losses_)


def _replayed_stop(callbacks: Sequence[Callback], trainer: BaseOrtTrainer) -> bool:
    """Replays the restored history into every EarlyStopping, the built-in one and the user's
    (on_train_begin has just reset them); True when one of them stops at its last epoch."""
    stoppers = [cb for cb in callbacks if isinstance(cb, EarlyStopping)]
    return any([_replay(cb, trainer) and cb.stopped for cb in stoppers])  # a list: replay all


def _checked(path: str, name: str, value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    if value.shape != ref.shape or value.dtype != ref.dtype:
        raise ValueError(
            f"{path}: weight {name!r} has shape {value.shape} and dtype {value.dtype}, the model's "
            f"{ref.shape} and {ref.dtype}"
        )
    if not np.isfinite(value).all():
        raise ValueError(f"{path}: weight {name!r} or its optimizer state holds NaN or inf")
    return np.array(value, copy=True)


#: rows of each array hashed into a data fingerprint: evenly spaced from the first to the last,
#: so that another file, split or order is caught at a cost independent of the data's size (an
#: edit confined to rows between them is not)
FINGERPRINT_ROWS = 64


def data_fingerprint(arrays: Sequence[np.ndarray | None]) -> str:
    """sha256 of each array's shape, dtype and FINGERPRINT_ROWS evenly spaced rows.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray or None
        X, y and sample weights as the fit trains on them (validated and cast), None for an
        absent one.

    Returns
    -------
    str
        A hex digest; equal data give equal digests in any process.
    """
    digest = hashlib.sha256()
    for a in arrays:
        if a is None:
            digest.update(b"none;")
            continue
        n = a.shape[0] if a.ndim else 1
        rows = np.unique(np.linspace(0, n - 1, num=min(n, FINGERPRINT_ROWS)).round().astype(np.int64))
        digest.update(f"{a.shape};{a.dtype.str};".encode())
        digest.update(np.ascontiguousarray(a[rows] if a.ndim else a).tobytes())
    return digest.hexdigest()


def _seed_record(random_state: Any) -> int | str | None:
    """random_state as JSON: an int or None as is; a Generator or SeedSequence by its type
    (not comparable across processes: only its kind is checked)."""
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return None if random_state is None else int(random_state)
    return f"<{type(random_state).__name__}>"


#: how a resume mismatch is told: the parameter, and the fix
_RESUME_FIXES = {
    "batch_size": "resume with the same batch_size",
    "shuffle": "resume with the same shuffle",
    "random_state": "resume with the same random_state",
    "data": "resume with the same X, y and sample_weight",
    "validation_data": "resume with the same X_val, y_val and sample_weight_val",
}


def _check_resume(path: str, meta: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """Refuses (CheckpointMismatchError) a checkpoint whose run differs from this fit in what
    decides the final weights; one of an earlier version, which did not record the seed and
    data, resumes with a warning."""
    for key, given in record.items():
        if key not in meta or meta[key] == given:
            continue
        saved = meta[key]
        if key in ("data", "validation_data"):
            what = "other data" if key == "data" else "other validation data (X_val, y_val)"
            problem = f"was written by a fit on {what} than this one"
        else:
            problem = f"was written with {key}={saved!r}, this fit has {key}={given!r}"
        raise CheckpointMismatchError(
            f"{path} {problem}: resuming would not end at the weights of the interrupted run; "
            f"{_RESUME_FIXES[key]}, or fit() to start over",
            key,
            saved,
            given,
        )
    missing = [k for k in record if k not in meta]
    if missing:
        warnings.warn(
            f"{path} was written by an earlier version of ort-train, which did not record {missing}: "
            "resuming without checking them; give the interrupted run's data and settings",
            UserWarning,
            stacklevel=6,  # the caller of resume()
        )


def _jsonable(value: Any) -> Any:
    """A bit generator's state as JSON (PCG64's is ints already; MT19937's holds an array)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    return value


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        return {k: _from_jsonable(v) for k, v in value.items()}
    return value


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
