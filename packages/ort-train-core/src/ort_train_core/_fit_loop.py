"""The fit loop both trainers share: epochs, batches, validation, early stopping, callbacks,
history, state, rollback on divergence, Ctrl-C, checkpoints, pickling. A trainer only says how
one step runs (:class:`StepRunner`)."""

from __future__ import annotations

import contextlib
import enum
import math
import os
import signal
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np
import onnx
from onnx import ModelProto, numpy_helper

from ._backends import BACKEND_VARIABLE, get_backend
from ._binding import check_threads
from ._data import BatchStore, DataSpec, _count_non_finite, check_fit_arrays, is_sparse
from ._data import _all_finite as _array_finite
from ._ort_errors import is_onnxruntime_error, run_failure
from ._params import ParamsMixin, plain_repr, same_values
from ._runtime import Device, parse_device
from .callbacks import Callback, EarlyStopping, EpochPrinter, ProgressBar
from .checkpoint import (
    CHECKPOINT_FILE,
    CheckpointWriter,
    TrainingProgress,
    TrainingState,
    check_checkpoint,
    load_training,
    read_checkpoint,
    resume_record,
    save_training,
    warn_unchecked,
)
from .exceptions import (
    CheckpointMismatchError,
    ConvergenceError,
    ConvergenceWarning,
    TrainingInterruptedWarning,
    TrainingStepError,
)
from .learning_rate import BaseLearningRate, make_learning_rate

if TYPE_CHECKING:
    from ._gradient import GradientBackend


class StepRunner(Protocol):
    """One fit's device-side machinery."""

    store: BatchStore
    has_validation: bool
    #: the data and each batch's loss stay on the device (CUDA): step() returns 0.0 and
    #: epoch_losses() reads the epoch's losses at its end
    device_resident: bool

    def set_epoch(self, epoch: int) -> None: ...

    def step(self, batch: int) -> float: ...

    def epoch_losses(self, n_done: int, first: int = 0) -> np.ndarray: ...

    def weights(self) -> dict[str, np.ndarray]: ...

    def snapshot(self) -> TrainingState: ...

    def restore(self, state: TrainingState) -> None: ...

    def validation_loss(self) -> float: ...

    def reduce_learning_rate(self, epoch: int) -> bool: ...

    def continue_fit(self, lr: BaseLearningRate) -> None: ...


class _Outcome(enum.Enum):
    """How the epochs of a fit ended, when no error ended them."""

    COMPLETED = "max_iter epochs"
    STOPPED = "a callback stopped the fit"
    INTERRUPTED = "Ctrl-C"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be an integer > 0, got {value!r}")
    return int(value)


#: a fit's runner is kept for the next fit to continue with (a stream of partial_fit calls) when
#: the buffers its batches view hold at most this many bytes: 4 MiB is 20,000 rows of 50 float32
#: features, whose epoch takes far longer than building a runner (0.2-0.5 ms)
KEEP_RUNNER_MAX_BYTES = 4 << 20

#: the fit lock of each object being fitted and the thread holding it: a dict beside the object
#: rather than an attribute, so that pickling and deep copies never meet a lock
_FIT_LOCKS: weakref.WeakKeyDictionary[Any, tuple[threading.Lock, list[int | None]]] = (
    weakref.WeakKeyDictionary()
)
_FIT_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def exclusive_fit(owner: Any, action: str = "fit") -> Iterator[None]:
    """Runs the body as ``owner``'s only fit: a fit already running on another thread, or one
    running on this thread (a callback of it started this one), is refused at once.

    Two threads fitting one object would interleave their steps over the same weights and
    history and return without error; a callback fitting its own trainer would restart the
    state the running fit goes on stepping. The lock is taken without waiting.

    Parameters
    ----------
    owner : object
        The trainer or estimator being fitted (weak-referenceable).
    action : str, default='fit'
        The method called, for the message (``'fit'``, ``'resume'``, ``'partial_fit'``...).

    Yields
    ------
    None
        While the body runs, ``owner`` is marked as fitting on this thread.

    Raises
    ------
    RuntimeError
        ``owner`` is being fitted on another thread, or on this one (from a callback).
    """
    with _FIT_LOCKS_GUARD:
        lock, holder = _FIT_LOCKS.setdefault(owner, (threading.Lock(), [None]))
    if not lock.acquire(blocking=False):
        who = f"{type(owner).__name__} (id 0x{id(owner):x})"
        if holder[0] == threading.get_ident():
            raise RuntimeError(
                f"{who}: {action} was called from inside one of its own callbacks while its fit "
                "runs on this thread; a callback may read the trainer (get_state) or stop the fit "
                "(return True from on_epoch_end), not fit it again"
            )
        raise RuntimeError(
            f"{who}: fit is already running on another thread, so {action} is refused (one "
            "instance trains one fit at a time); wait for that thread (join it), or fit a copy "
            "(clone) of the instance on this one"
        )
    holder[0] = threading.get_ident()
    try:
        yield
    finally:
        holder[0] = None
        lock.release()


def _all_finite(state: TrainingState) -> bool:
    arrays = [*state.weights.values(), *(a for states in state.optimizer.values() for a in states)]
    return all(bool(np.isfinite(a).all()) for a in arrays)


class BaseOrtTrainer(ParamsMixin):
    """Shared parameters and the fit loop of both trainers; subclasses implement the hooks
    that build their graphs and say how one step runs.

    The parameters are those of :class:`~ort_train_core.OrtGradientOptimizer` and
    :class:`~ort_train_core.OrtGradientForwardBackwardOptimizer`, which document them.

    Attributes
    ----------
    n_iter_ : int
        Completed epochs (over warm starts and resumes).
    train_losses_ : list of float
        The training objective of each epoch.
    validation_losses_ : list of float
        The validation loss of each epoch (empty without validation data), without the
        penalty :func:`add_loss_output` or ``learning_penalty`` adds.
    """

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
    threads: int | None
    backend: str | None

    # ---- hooks of a concrete trainer -------------------------------------------------
    def _prepare_graphs(self, device: Device, lr: BaseLearningRate) -> None:
        """Builds (or reuses) the graphs that do not depend on the data."""
        raise NotImplementedError

    def _data_spec(self) -> DataSpec:
        raise NotImplementedError

    def _initial_state(self) -> TrainingState:
        raise NotImplementedError

    #: whether the steps can take a fit's unit sample weights as a constant (fused steps)
    _folds_unit_weights: bool = False

    def _make_runner(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: Sequence[np.ndarray | None] | None,
        unit_weights: bool = False,
    ) -> StepRunner:
        raise NotImplementedError

    def _new_runner(
        self,
        data: list[np.ndarray | None],
        sample_weight: Any,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: Sequence[np.ndarray | None] | None,
    ) -> StepRunner:
        """The runner of a fit of ``data``. Without sample weights (the graph's weight input
        then reads ones), fused steps take the ones as a constant: the batches carry no weight
        column and the weighting folds out of the step (a hinge step on 16 x 30: 30 -> 27
        kernels)."""
        unit = self._unit_weights(data, sample_weight)
        store = self._batch_store([*data[:-1], None] if unit else data, device)
        return self._make_runner(store, state, device, lr, validation, unit_weights=unit)

    def _unit_weights(self, data: list[np.ndarray | None], sample_weight: Any) -> bool:
        """Whether the steps take the fit's unit sample weights as a constant."""
        return self._folds_unit_weights and sample_weight is None and data[-1] is not None

    def _runner_key(
        self, data: list[np.ndarray | None], sample_weight: Any, device: Device, lr: BaseLearningRate
    ) -> Any:
        """What the runner of a fit without validation data was made for: the graphs' record
        (kept alive beside it, so its id stays its own), the arrays' shapes and types, the unit
        weights, and the settings of the steps and batches."""
        arrays = tuple(None if a is None else (a.shape, a.dtype, is_sparse(a)) for a in data)
        # the record's parameters name the backend: a change of backend is a change of record;
        # _start_or_continue has just recorded repr(lr) (a repr of every parameter: 10 us)
        signature = self.__dict__.get("_lr_signature") or self._lr_repr(lr)
        settings = (str(device), signature, self.batch_size, bool(self.shuffle), self._threads())
        return id(self.__dict__.get("_graph_record")), arrays, sample_weight is None, settings

    def _runner_for(
        self,
        data: list[np.ndarray | None],
        sample_weight: Any,
        device: Device,
        lr: BaseLearningRate,
        validation: Sequence[np.ndarray | None] | None,
        key: Any,
    ) -> StepRunner:
        """This fit's runner: the previous fit's when this one continues it (warm_start, as each
        scikit-learn partial_fit does: nothing changed the state since) with data of the same
        shapes and the same settings, its sessions and bindings made once serving every call
        (building them took half of a 200-row partial_fit); a new one otherwise."""
        kept = self.__dict__.pop("_kept_runner", None)
        if kept is not None and key is not None and kept[0] == key and kept[3] is self._state:
            runner: StepRunner = kept[2]
            if runner.store.take_sources(
                [*data[:-1], None] if self._unit_weights(data, sample_weight) else data
            ):
                runner.continue_fit(lr)
                return runner
        return self._new_runner(data, sample_weight, self._state, device, lr, validation)

    def _keep_runner(self, runner: StepRunner, key: Any, outcome: _Outcome) -> None:
        """Keeps a fit's runner for the next fit to continue with (see _runner_for) where its
        batches view buffers of its own of at most KEEP_RUNNER_MAX_BYTES (shuffled dense data on
        the host), the fit's arrays released; a larger fit's steps outweigh building one."""
        if key is None or outcome is _Outcome.INTERRUPTED:
            return
        if runner.store.release_sources(KEEP_RUNNER_MAX_BYTES):
            self._kept_runner = (key, self.__dict__.get("_graph_record"), runner, self._state)

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
        """set_params: the record of the graphs and sessions built for the previous parameters
        (``_graph_record``, kept by the concrete trainer) is dropped."""
        self.__dict__.pop("_graph_record", None)
        self.__dict__.pop("_graph_seen", None)
        self.__dict__.pop("_kept_runner", None)
        self.__dict__.pop("_validated", None)

    def _validate_params(self) -> tuple[Device, BaseLearningRate]:
        """The device and a copy of the learning rate, every setting checked; the same pair
        again while no setting changed (a stream of partial fits: copying, checking and
        printing the learning rate took a twentieth of a 1000-row call)."""
        key = self._settings_key()
        memo = self.__dict__.get("_validated")
        if memo is not None and same_values(memo[0], key):
            return memo[1], memo[2]
        device, lr = self._checked_params()
        self._validated = (key, device, lr, repr(lr))
        return device, lr

    #: the settings :meth:`_checked_params` reads besides ``learning_rate`` (the memo's key;
    #: tests/core/test_runner_reuse.py fails when a check reads a setting not listed here)
    _CHECKED_SETTINGS = (
        "max_iter",
        "batch_size",
        "n_iter_no_change",
        "tol",
        "verbose",
        "device",
        "checkpoint_dir",
        "checkpoint_every",
        "threads",
        "backend",
    )

    def _settings_key(self) -> tuple[Any, ...]:
        """What :meth:`_checked_params` reads, for :func:`same_values`: the settings' values (a
        learning-rate object's by identity and parameter values, so an edit in place is seen)
        and the default backend's variable."""
        lr = self.learning_rate
        if isinstance(lr, BaseLearningRate):
            lr = (id(lr), type(lr), tuple(getattr(lr, n) for n in lr._param_names()))
        # getattr with a default: a trainer pickled before a setting existed lacks it
        return (
            lr,
            *(getattr(self, n, None) for n in self._CHECKED_SETTINGS),
            os.environ.get(BACKEND_VARIABLE),
        )

    def _lr_repr(self, lr: BaseLearningRate) -> str:
        """``repr(lr)``, kept with the learning rate :meth:`_validate_params` returned."""
        memo = self.__dict__.get("_validated")
        return memo[3] if memo is not None and memo[2] is lr else repr(lr)

    def _checked_params(self) -> tuple[Device, BaseLearningRate]:
        _positive_int("max_iter", self.max_iter)
        _positive_int("batch_size", self.batch_size)
        _positive_int("n_iter_no_change", self.n_iter_no_change)
        if self.tol is not None and not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"tol must be None or a number >= 0, got {plain_repr(self.tol)}")
        if self.verbose not in (0, 1, 2, False, True):
            raise ValueError(
                f"verbose must be 0, 1 (progress bar) or 2 (one line per epoch), got {self.verbose!r}"
            )
        lr = make_learning_rate(self.learning_rate)
        lr.validate()
        device = parse_device(self.device)
        self._checkpoint_path()
        self._threads()
        self._backend()
        return device, lr

    def _threads(self) -> int | None:
        """The ``threads`` setting, checked (None for a trainer pickled before it existed)."""
        return check_threads(getattr(self, "threads", None))

    def _backend(self) -> GradientBackend:
        """The gradient backend the ``backend`` setting names (None: the default; also for a
        trainer pickled before the setting existed); an unknown name raises ValueError. During a
        fit, the one it found at its start (:meth:`_one_backend`)."""
        found: GradientBackend | None = self.__dict__.get("_fit_backend")
        if found is None:
            found = get_backend(getattr(self, "backend", None))
            if "_fit_backend" in self.__dict__:  # in a fit: kept for its other look-ups
                self.__dict__["_fit_backend"] = found
        return found

    @contextlib.contextmanager
    def _one_backend(self) -> Iterator[None]:
        """A fit resolves its backend (and ``$ORT_TRAIN_BACKEND``) once, at its first look-up:
        the graphs' record asks at each of its own, 10 us each, half a dozen times a fit."""
        self.__dict__["_fit_backend"] = None
        try:
            yield
        finally:
            self.__dict__.pop("_fit_backend", None)

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

    def _make_callbacks(self) -> list[Callback]:
        """This fit's callbacks: the checkpoint writer first (the others then find the epoch's
        checkpoint written), the verbose output, the early stopping of ``tol``, the user's."""
        cbs: list[Callback] = []
        path = self._checkpoint_path()
        if path is not None:
            cbs.append(CheckpointWriter(path, int(self.checkpoint_every)))
        if self.verbose == 1:
            cbs.append(ProgressBar())
        elif self.verbose == 2:
            cbs.append(EpochPrinter())
        if self.tol is not None:
            cbs.append(EarlyStopping(float(self.tol), int(self.n_iter_no_change)))
        cbs.extend(self.callbacks or ())
        return cbs

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
        ``checkpoint_every`` completed epochs and when the fit ends, however it ends (the last
        epoch, early stopping, Ctrl-C, an error): it holds the end of the last completed epoch
        (see :meth:`resume`). Ctrl-C ends the fit after the current step with a
        :class:`~ort_train_core.exceptions.TrainingInterruptedWarning`; a second one stops at
        once (KeyboardInterrupt).

        Parameters
        ----------
        X : array-like, dict of array-like, or tuple of array-like
            The features: an array of the graph input's rank (``(n_samples, n_features)``,
            images ``(n_samples, C, H, W)``, int64 token ids ``(n_samples, T)``...) in its
            element type (float data is cast to a float input's type, integer inputs take
            integers, bool ones booleans). A graph with several batched inputs takes a dict
            ``{input name: array}`` or a tuple of arrays in the graph's input order, all with
            the same number of rows. Batches slice the first axis.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            The labels (class indices for a cross-entropy loss).
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the rows (the model needs a sample-weight input).
        X_val, y_val : array-like, optional
            Validation data: its loss is computed after each epoch
            (``validation_losses_``) and is the one early stopping watches.
        sample_weight_val : array-like of shape (n_val_samples,), optional
            Weights of the validation rows.

        Returns
        -------
        BaseOrtTrainer
            ``self``.

        Raises
        ------
        ConvergenceError
            The loss, the weights or the validation loss became NaN or inf; the weights, the
            optimizer state and the history are those of the last completed epoch.
        ValueError, TypeError
            Invalid parameters or data.
        """
        with exclusive_fit(self, "fit"), self._one_backend():
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
        ``random_state`` and a fingerprint of the data (a sha256 of the shapes, dtypes and every
        value of X, y and sample weights, and of the validation data). One written with other
        values is refused with :class:`~ort_train_core.exceptions.CheckpointMismatchError` (a
        ValueError naming the parameter) before anything is restored. A checkpoint of an
        earlier version, which recorded no seed nor data fingerprint or one of 64 sampled rows,
        resumes with a UserWarning saying what could not be checked.

        Parameters
        ----------
        X, y, sample_weight, X_val, y_val, sample_weight_val : array-like or None
            As :meth:`fit`'s: the data the interrupted fit was given.

        Returns
        -------
        BaseOrtTrainer
            ``self``.

        Raises
        ------
        CheckpointMismatchError
            The checkpoint was written with other settings or data.
        ValueError
            No ``checkpoint_dir``, or a checkpoint of another model or a damaged one.
        """
        if self._checkpoint_path() is None:
            raise ValueError("resume reads checkpoint_dir/checkpoint.npz: set checkpoint_dir")
        with exclusive_fit(self, "resume"), self._one_backend():
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
        with exclusive_fit(self, "prepare"):
            device, lr = self._validate_params()
            self._prepare_graphs(device, lr)
            data, validation = self._checked_data(X, y, sample_weight, X_val, y_val, sample_weight_val)
            self._new_runner(data, sample_weight, self._initial_state(), device, lr, validation)
        return self

    def _checked_data(
        self, X: Any, y: Any, sample_weight: Any, X_val: Any, y_val: Any, sample_weight_val: Any
    ) -> tuple[list[np.ndarray | None], list[np.ndarray | None] | None]:
        """The training and validation arrays as fit uses them (validated, converted): the
        batched inputs in graph order, the labels, the sample weights (None without)."""
        spec = self._data_spec()
        data = check_fit_arrays(spec, X, y, sample_weight)
        if (X_val is None) != (y_val is None):
            raise ValueError("give both X_val and y_val, or neither")
        if X_val is None:
            return data, None
        return data, check_fit_arrays(spec, X_val, y_val, sample_weight_val, prefix="validation ")

    def _batch_store(self, data: Sequence[np.ndarray | None], device: Device) -> BatchStore:
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
        """fit or resume, with no other fit of this trainer running."""
        device, lr = self._validate_params()
        self._prepare_graphs(device, lr)
        data, validation = self._checked_data(X, y, sample_weight, X_val, y_val, sample_weight_val)
        # what resume must find in the checkpoint, and what this fit's checkpoints record
        # the data's digest reads every value (about 35 ms per 20 MB): only a fit that writes
        # or resumes checkpoints (checkpoint_dir) pays it
        hashed = self._checkpoint_path() is not None
        record = resume_record(
            self.batch_size, self.shuffle, self.random_state, data if hashed else None, validation
        )
        resuming = resume and self._resume_from_checkpoint(record)
        self._run_record = record
        warm = bool(self.warm_start) and getattr(self, "_state", None) is not None
        self._start_or_continue(lr, continuing=resuming or warm)
        n_epochs = int(self.max_iter) - self.n_iter_ if resuming else int(self.max_iter)
        if n_epochs <= 0:
            return self
        key = self._runner_key(data, sample_weight, device, lr) if validation is None else None
        try:
            runner = self._runner_for(data, sample_weight, device, lr, validation, key)
        except Exception as exc:  # the partial loop runs a first forward to size its buffers
            if not is_onnxruntime_error(exc):
                raise
            text = run_failure(exc)
            raise TrainingStepError(
                f"onnxruntime failed at epoch {self.n_iter_ + 1}, batch 1, before any step: {text}; "
                f"the weights are unchanged. {_step_failure_hint(text)}",
                epoch=self.n_iter_,
                batch=0,
            ) from exc
        # unit weights (none given) weigh each batch by its row count, as no weights do: the
        # store's row totals, without a weighted sum over the batches at each epoch
        weighted = sample_weight is not None and self._batches_weighted_by_sample_weight()
        weights = data[-1] if weighted else None
        outcome = self._train(runner, weights, n_epochs, resuming)
        self._keep_runner(runner, key, outcome)
        self._warn_outcome(outcome)
        return self

    def _resume_from_checkpoint(self, record: Mapping[str, Any]) -> bool:
        """Restores ``checkpoint_dir``'s checkpoint when there is one, after checking that it was
        written by a run with this ``record``; False when there is none (a new fit)."""
        path = self._checkpoint_path()
        if path is None or not os.path.exists(path):
            return False
        unchecked = self._load_checkpoint(path, expected=record)
        warn_unchecked(path, unchecked, stacklevel=4)  # the caller of resume()
        return True

    def _start_or_continue(self, lr: BaseLearningRate, continuing: bool) -> None:
        """Starts the history and state afresh, or checks that a continued fit keeps its
        learning rate (the optimizer states belong to it)."""
        previous_lr: str | None = getattr(self, "_lr_signature", None)
        signature = self._lr_repr(lr)
        if continuing and previous_lr is not None and previous_lr != signature:
            # a CheckpointMismatchError (a ValueError) names the setting, for the CLI's words
            raise CheckpointMismatchError(
                "continuing a fit (warm_start=True or resume) continues the optimizer state, but the "
                f"learning rate changed ({previous_lr} -> {lr!r}); fit with warm_start=False to restart",
                parameter="learning_rate",
                saved=previous_lr,
                given=repr(lr),
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
            self._new_history()
        self._lr_signature = signature

    def _new_history(self) -> None:
        self._rng = np.random.default_rng(self.random_state)
        self.n_iter_ = 0
        self.train_losses_: list[float] = []
        self.validation_losses_: list[float] = []

    def _train(
        self, runner: StepRunner, weights: np.ndarray | None, n_epochs: int, resuming: bool
    ) -> _Outcome:
        """Runs the epochs between the callbacks' on_train_begin and on_train_end, which every
        exit calls (the end, early stopping, Ctrl-C, a divergence, any error)."""
        callbacks = self._make_callbacks()
        # the stopping rules reach the learning rate through it ('adaptive'), during this fit
        self._runner: StepRunner | None = runner
        for cb in callbacks:
            cb.on_train_begin(self, n_epochs)
        try:
            # on_train_begin has just reset every EarlyStopping: a resumed one is fed the
            # checkpointed history, and the run it continues may have stopped already
            if resuming and _replayed_stop(callbacks, self):
                return _Outcome.STOPPED
            return self._run_epochs(runner, weights, n_epochs, callbacks)
        finally:
            try:
                _end_callbacks(callbacks, self)
            finally:
                self._runner = None

    def reduce_learning_rate(self, epoch: int) -> bool:
        """What a stopping rule (a callback's ``on_epoch_end``) calls at its plateau: with
        ``learning_rate='adaptive'`` the rate is divided by 5 from the next epoch (once, however
        many rules reach a plateau at ``epoch``) and the fit should go on.

        Parameters
        ----------
        epoch : int
            The epoch whose end reached the plateau (``on_epoch_end``'s ``epoch``).

        Returns
        -------
        bool
            True: the rate was divided, the fit goes on; False (other schedules, a rate already
            <= 1e-6, or no fit running): the rule should stop the fit.
        """
        runner = getattr(self, "_runner", None)
        return runner is not None and runner.reduce_learning_rate(epoch)

    @property
    def samples_seen_(self) -> int:
        """Rows stepped on so far, over epochs, warm starts and resumes (the ``t`` of the
        per-sample schedules); inside a callback during a fit, up to the last step."""
        runner = getattr(self, "_runner", None)
        if runner is not None:
            return int(runner.n_samples)
        return int(self._current_state().n_samples)

    def _run_epochs(
        self, runner: StepRunner, weights: np.ndarray | None, n_epochs: int, callbacks: list[Callback]
    ) -> _Outcome:
        """Up to ``n_epochs`` epochs; each complete one goes into the history and the state, and
        then to the callbacks' on_epoch_end."""
        store = runner.store
        losses = np.empty(len(store.bounds), dtype=np.float64)
        hooks = [cb.on_batch_end for cb in callbacks if type(cb).on_batch_end is not Callback.on_batch_end]
        # the weights at the end of the last complete epoch: what a divergence rolls back to;
        # and those of the epoch before it, kept while that epoch is in this fit's history, for a
        # loss that is already not finite at the last epoch's end weights
        snapshot = runner.snapshot()
        previous: TrainingState | None = None
        with _catch_sigint() as ctrl_c:
            for _ in range(n_epochs):
                epoch = self.n_iter_
                order = self._rng.permutation(store.n) if self.shuffle else None
                store.load(order)
                runner.set_epoch(epoch)
                step = _notifying(runner, hooks, self, epoch) if hooks else runner.step
                try:
                    done = _run_epoch(runner, losses, step, ctrl_c.is_set)
                except _FailedStep as failed:
                    cause = failed.__cause__ or failed
                    raise self._step_failed(runner, snapshot, cause, epoch, failed.batch) from cause
                totals = store.batch_totals(weights, order)
                end = self._end_of_epoch(runner, (snapshot, previous), done, totals, epoch)
                if end is None:  # Ctrl-C: keep the steps taken, record no epoch
                    self._keep_steps_taken(runner, snapshot)
                    return _Outcome.INTERRUPTED
                previous = snapshot
                snapshot, logs = end
                self.n_iter_ += 1
                self.train_losses_.append(logs["train_loss"])
                if "validation_loss" in logs:
                    self.validation_losses_.append(logs["validation_loss"])
                self._state = snapshot  # callbacks see this epoch's weights through get_state()
                if _stop_requested(callbacks, self, epoch, logs):
                    return _Outcome.STOPPED
        return _Outcome.COMPLETED

    def _end_of_epoch(
        self,
        runner: StepRunner,
        snapshots: tuple[TrainingState, TrainingState | None],
        losses: np.ndarray,
        totals: np.ndarray,
        epoch: int,
    ) -> tuple[TrainingState, dict[str, float]] | None:
        """Every divergence check of an epoch: each raises ConvergenceError after rolling back to
        the last state whose loss was seen finite. Returns the epoch's weights and logs, or None
        when Ctrl-C cut the epoch short.

        ``snapshots`` are the states at the end of the previous epoch and of the one before it
        (None when that one is not in this fit's history); ``losses`` those of the batches run,
        ``totals`` each batch's weight in the epoch's mean."""
        snapshot, previous = snapshots
        if not np.isfinite(losses).all():
            i = int(np.flatnonzero(~np.isfinite(losses))[0])
            if i == 0 and previous is not None:
                # the first loss is that of the previous epoch's end weights: those are no finite
                # state (with one batch an epoch they always diverge first); the epoch before's
                # gave the finite first loss of the previous epoch
                self._forget_last_epoch()
                message = _loss_diverged(losses[i], epoch, i, restored="the end of the epoch before the last")
                raise self._rolled_back(runner, previous, message, epoch, i)
            raise self._rolled_back(runner, snapshot, _loss_diverged(losses[i], epoch, i), epoch, i)
        last = len(totals) - 1
        if len(losses) <= last:
            return None
        # a gradient can overflow while the loss it came from is finite: the epoch's last step
        # would then hand back inf weights without an error
        weights = runner.snapshot()
        if not _all_finite(weights):
            raise self._rolled_back(
                runner,
                snapshot,
                f"the weights became infinite or NaN at epoch {epoch + 1} (a gradient "
                "overflowed while the loss stayed finite): weights were restored to the end "
                "of the last complete epoch; lower the learning rate or scale the data",
                epoch,
                last,
            )
        logs = {"train_loss": float(np.dot(losses, totals) / totals.sum())}
        if runner.has_validation:
            logs["validation_loss"] = value = runner.validation_loss()
            if not math.isfinite(value):
                raise self._rolled_back(
                    runner,
                    snapshot,
                    f"the validation loss became {value} at epoch {epoch + 1}; "
                    "weights were restored to the end of the previous epoch",
                    epoch,
                    last,
                )
        return weights, logs

    def _forget_last_epoch(self) -> None:
        """Drops the last epoch from the history (a divergence rolled its weights back too)."""
        self.n_iter_ -= 1
        del self.train_losses_[-1]
        if len(self.validation_losses_) > self.n_iter_:
            del self.validation_losses_[-1]

    def _keep_steps_taken(self, runner: StepRunner, snapshot: TrainingState) -> None:
        """After Ctrl-C: the weights of the last step, unless that step overflowed."""
        final = runner.snapshot()
        if not _all_finite(final):
            runner.restore(snapshot)
            final = snapshot
        self._state = final

    def _warn_outcome(self, outcome: _Outcome) -> None:
        """Tells the caller of fit or resume that Ctrl-C or max_iter ended the fit."""
        if outcome is _Outcome.INTERRUPTED:
            path = self._checkpoint_path()
            saved = f"; {path} holds the end of epoch {self.n_iter_} for resume()" if path else ""
            warnings.warn(
                f"training interrupted (Ctrl-C) during epoch {self.n_iter_ + 1}; the weights are "
                f"those after the last completed step{saved}",
                TrainingInterruptedWarning,
                stacklevel=4,
            )
        elif outcome is _Outcome.COMPLETED and self.tol is not None:
            warnings.warn(
                f"max_iter={self.max_iter} reached before the loss stopped improving by tol={self.tol}",
                ConvergenceWarning,
                stacklevel=4,
            )

    def _step_failed(
        self, runner: StepRunner, snapshot: TrainingState, exc: BaseException, epoch: int, batch: int
    ) -> TrainingStepError:
        """onnxruntime failed in step ``batch`` of ``epoch``: restores ``snapshot`` (the end of the
        last complete epoch) and returns the error to raise, in onnxruntime's words without C++."""
        runner.restore(snapshot)
        self._state = snapshot
        text = run_failure(exc)
        return TrainingStepError(
            f"onnxruntime failed at epoch {epoch + 1}, batch {batch + 1}: {text}; the weights were "
            f"restored to the end of the last complete epoch. {_step_failure_hint(text)}",
            epoch=epoch,
            batch=batch,
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
        """Copies of the trained weights and of BatchNormalization's running statistics (the
        initial ones before any fit; inside a callback during a fit, those after the last step).

        Returns
        -------
        dict of str to numpy.ndarray
            The values by name.
        """
        runner: StepRunner | None = getattr(self, "_runner", None)
        if runner is not None:  # a callback during a fit: the runner's buffers, read (copied)
            return runner.weights()
        return {k: v.copy() for k, v in self._current_state().weights.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replaces weights or running statistics (all or some); a following fit with
        ``warm_start=True`` starts there.

        Parameters
        ----------
        state : mapping of str to array-like
            New values by weight name, each of the weight's shape (cast to its dtype).

        Raises
        ------
        ValueError
            An unknown name, another shape, or values that are not finite numbers.
        """
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
            self._new_history()

    def training_state(self) -> TrainingState:
        """A copy of where training stands: the weights, the optimizer's states and the step
        and sample counts (the initial weights and zero counts before any fit).

        Returns
        -------
        TrainingState
            New arrays; :meth:`continue_progress` of another trainer takes it.
        """
        return self._current_state().copy()

    def continue_progress(self, state: TrainingState) -> None:
        """Continues the step and sample counts of ``state`` (another trainer's
        :meth:`training_state`, of the same weights), and its optimizer states where this
        trainer's have the same names and shapes; the weights stay this trainer's. The
        scikit-learn estimators' ``partial_fit`` after a parameter change rebuilds its trainer
        with it.

        Parameters
        ----------
        state : TrainingState
            The progress to continue.
        """
        current = self._current_state().copy()
        mine = {k: [a.shape for a in v] for k, v in current.optimizer.items()}
        theirs = {k: [a.shape for a in v] for k, v in state.optimizer.items()}
        optimizer = current.optimizer
        if mine == theirs:
            optimizer = {k: [a.copy() for a in v] for k, v in state.optimizer.items()}
        self._state = TrainingState(current.weights, optimizer, state.n_steps, state.n_samples)
        if not hasattr(self, "n_iter_"):
            self._new_history()

    # ---- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Writes the training state (weights, optimizer states, step and epoch counts, shuffling
        RNG, loss history, learning rate, model fingerprint) to ``path`` atomically, as an
        ``.npz`` without pickle. A fit resumed from it is exact when it was taken at the end of
        an epoch (as ``checkpoint_dir`` checkpoints are).

        Parameters
        ----------
        path : str or os.PathLike
            The file to write (its folder is created).

        Raises
        ------
        ValueError
            The trainer was neither fitted nor given a state.
        """
        if not hasattr(self, "n_iter_"):
            raise ValueError("nothing to save: fit the trainer (or set_state) first")
        progress = TrainingProgress(
            self._current_state(),
            self.n_iter_,
            self.train_losses_,
            self.validation_losses_,
            getattr(self, "_lr_signature", None),
            self._rng,
        )
        save_training(os.fspath(path), progress, self._checkpoint_identity())

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restores what :meth:`save_checkpoint` wrote; a following fit with ``warm_start=True``
        (or :meth:`resume`) continues from there. Refuses a checkpoint of another model or of
        other trained weights.

        Parameters
        ----------
        path : str or os.PathLike
            A file :meth:`save_checkpoint` (or a fit with ``checkpoint_dir``) wrote.

        Raises
        ------
        ValueError
            Not a checkpoint, a damaged one, or one of another model or other weights.
        """
        self._load_checkpoint(os.fspath(path))

    def _load_checkpoint(self, path: str, expected: Mapping[str, Any] | None = None) -> list[str]:
        """load_checkpoint; with ``expected`` (resume), first refuses a checkpoint written with
        other settings or data (see :func:`~ort_train_core.checkpoint.resume_record`) and
        returns what it could not check (a checkpoint of an earlier version)."""
        arrays, meta = read_checkpoint(path)
        try:
            unchecked = check_checkpoint(path, meta, self._fingerprint(), expected)
            progress = load_training(path, arrays, meta, self._initial_state())
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path} is a malformed checkpoint: {exc!r}") from exc
        self._state = progress.state
        self._rng = progress.rng if progress.rng is not None else np.random.default_rng(self.random_state)
        self.n_iter_ = progress.n_iter
        self.train_losses_ = progress.train_losses
        self.validation_losses_ = progress.validation_losses
        if progress.lr_signature is not None:
            self._lr_signature = progress.lr_signature
        return unchecked

    def _checkpoint_identity(self) -> dict[str, Any]:
        """What a checkpoint records of the model and the run, for check_checkpoint."""
        identity = {
            "trainer": type(self).__name__,
            "fingerprint": self._fingerprint(),
            "batch_size": int(self.batch_size),
            "shuffle": bool(self.shuffle),
        }
        # the seed and data fingerprints of the fit that wrote it (none after set_state alone)
        identity.update({k: v for k, v in getattr(self, "_run_record", {}).items() if k not in identity})
        return identity

    def get_trained_onnx(self) -> ModelProto:
        """The prediction graph with the current weights (and BatchNormalization's running
        statistics) as initializers, in inference form as torch's ``eval()``: BatchNormalization
        normalises with its running statistics, a training-mode Dropout is the identity.

        Returns
        -------
        onnx.ModelProto
            A new model, checked by ``onnx.checker``.
        """
        from ._batchnorm import inference_form
        from .graph import inputs_to_initializers

        model = inputs_to_initializers(self._prediction_model(), self._current_state().weights)
        model = inference_form(model)
        onnx.checker.check_model(model)
        return model

    def save_onnx_graph(
        self, folder: str | os.PathLike[str] | dict[str, bytes] | IO[bytes]
    ) -> dict[str, Any]:
        """Writes the trained model and every graph the trainer uses.

        Parameters
        ----------
        folder : str, os.PathLike, dict or binary file object
            A folder: ``<name>.onnx`` files are written there (it is created when missing). A
            dict: it receives the serialised bytes of each graph by name (as onnxcustom's
            ``save_onnx_graph`` filled one). A binary stream (``io.BytesIO``, an open file):
            the trained model is written to it.

        Returns
        -------
        dict
            By graph name (``'trained'`` first, then ``'loss'`` and the fused steps of the full
            loop, ``fused_step_batch<B>``, with ``_unweighted`` for a fit without sample
            weights, or the partial loop's graphs): the path written (a folder), the bytes (a
            dict, the one given), or the stream (``'trained'`` only).
        """
        if hasattr(folder, "write"):
            folder.write(self.get_trained_onnx().SerializeToString())
            return {"trained": folder}
        graphs = {"trained": self.get_trained_onnx(), **self._graphs_to_save()}
        if isinstance(folder, dict):
            for name, model in graphs.items():
                folder[name] = model.SerializeToString()
            return folder
        os.makedirs(folder, exist_ok=True)
        paths = {}
        for name, model in graphs.items():
            path = os.path.join(os.fspath(folder), f"{name}.onnx")
            onnx.save(model, path)
            paths[name] = path
        return paths

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_graph_record", None)  # sessions and graphs are rebuilt lazily
        state.pop("_graph_seen", None)
        state.pop("_kept_runner", None)
        state.pop("_validated", None)  # holds the learning rate's id
        state.pop("_fit_backend", None)
        state.pop("_weighted_by", None)  # the loss graph's reading, made again from the record
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("backend", None)  # pickled before the setting: get_params reads it
        self.__dict__.update(state)


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


def _step_failure_hint(text: str) -> str:
    """What to check when onnxruntime failed in a step with ``text``."""
    if "out of data bounds" in text or "out of bounds" in text:
        return (
            "An integer input holds an index outside the table it reads: check the data's ids "
            "against the graph's tables (a table of N rows takes ids 0 to N - 1)"
        )
    return (
        "A kernel refused the values or shapes of this graph: leave the weights feeding that "
        "node out of weights_to_train, or check the data's shapes against the graph's inputs"
    )


def _loss_diverged(
    loss: float, epoch: int, batch: int, restored: str = "the end of the last complete epoch"
) -> str:
    return (
        f"the training loss became {loss} at epoch {epoch + 1}, batch {batch + 1}: "
        f"weights were restored to {restored}; lower the learning rate or scale the data"
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


def _run_epoch(
    runner: StepRunner, losses: np.ndarray, step: Callable[[int], float], stop: Callable[[], bool]
) -> np.ndarray:
    """Runs the steps of one epoch (``runner.step`` or :func:`_notifying`'s); returns the losses
    of the batches run: all of them, or up to the first that is not finite or to Ctrl-C
    (``stop``). ``losses`` is the buffer they are written to."""
    store = runner.store
    fill = store.fill if store.gathers else None
    isfinite = math.isfinite  # a local: read at every step
    n = len(losses)
    for i in range(n):
        try:
            if fill is not None:
                fill(i)
            loss = step(i)
        except Exception as exc:  # a callback's own errors pass through unchanged
            if is_onnxruntime_error(exc):
                raise _FailedStep(i) from exc
            raise
        losses[i] = loss
        if not isfinite(loss) or stop():
            n = i + 1
            break
    if runner.device_resident:  # the losses stayed on the device: one read-back per epoch
        losses[:n] = runner.epoch_losses(n)
    return losses[:n]


class _FailedStep(Exception):
    """onnxruntime failed in step ``batch`` (its exception is the ``__cause__``)."""

    def __init__(self, batch: int) -> None:
        super().__init__(batch)
        self.batch = batch


def _notifying(
    runner: StepRunner,
    hooks: Sequence[Callable[[BaseOrtTrainer, int, int, float], None]],
    trainer: BaseOrtTrainer,
    epoch: int,
) -> Callable[[int], float]:
    """``runner.step`` followed by the callbacks' on_batch_end (the loop uses it only when one
    of them overrides it)."""
    step, resident = runner.step, runner.device_resident

    def step_and_notify(batch: int) -> float:
        loss = step(batch)
        if resident:  # this step's loss is on the device: read it now
            loss = float(runner.epoch_losses(batch + 1, first=batch)[0])
        for hook in hooks:
            hook(trainer, epoch, batch, loss)
        return loss

    return step_and_notify


def _stop_requested(
    callbacks: Sequence[Callback], trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]
) -> bool:
    """Calls every callback's on_epoch_end; True when one of them asks to stop."""
    stop = False
    for cb in callbacks:
        stop = bool(cb.on_epoch_end(trainer, epoch, logs)) or stop
    return stop


def _end_callbacks(callbacks: Sequence[Callback], trainer: BaseOrtTrainer) -> None:
    """Calls every callback's on_train_end, also after one of them raised (the first error is
    raised once all have run: a checkpoint that cannot be written still closes the bar)."""
    error: Exception | None = None
    for cb in callbacks:
        try:
            cb.on_train_end(trainer)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


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
