"""Hooks the shared fit loop calls: progress, printing and early stopping are callbacks, not
branches in the loop."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._fit_loop import BaseOrtTrainer


class Callback:
    """A hook of the fit loop (``callbacks=[...]`` of both trainers).

    Lifecycle: every call of ``fit`` or ``resume`` (a warm-started fit and each ``partial_fit``
    of an estimator included) calls :meth:`on_train_begin` first, then :meth:`on_batch_end`
    after each step and :meth:`on_epoch_end` after each completed epoch, then
    :meth:`on_train_end` whatever ends the fit: the last epoch, early stopping, Ctrl-C, a
    divergence (:class:`~ort_train_core.exceptions.ConvergenceError`) or any other error.

    The trainer uses the instances it is given, not copies, so that a callback's results stay
    readable after the fit. A callback that accumulates state during a fit must therefore
    reset all of it in :meth:`on_train_begin` (as skorch's ``initialize()`` and Keras'
    callbacks do): the same fit run twice must then behave the same. The built-in callbacks
    do. On :meth:`~ort_train_core.OrtGradientOptimizer.resume`, every :class:`EarlyStopping`
    gets the checkpointed loss history again after that reset, so that it stops where the
    uninterrupted fit would have.

    During a fit, ``trainer.get_state()`` holds the weights after the last step and
    ``trainer.samples_seen_`` the rows stepped on so far (scikit-learn's averaged SGD is such a
    callback); a stopping rule of its own calls ``trainer.reduce_learning_rate(epoch)`` at its
    plateau, which divides an ``'adaptive'`` rate and says whether the fit should go on.
    """

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        """Starts a fit of ``n_epochs`` epochs at most; resets what a previous fit left.

        Parameters
        ----------
        trainer : BaseOrtTrainer
            The trainer being fitted.
        n_epochs : int
            The epochs this call may run.
        """

    def on_batch_end(self, trainer: BaseOrtTrainer, epoch: int, batch: int, loss: float) -> None:
        """After each training step.

        The loop calls it only when a callback overrides it, so that a fit without one keeps
        its per-step cost. Where the losses stay on the device until the end of the epoch
        (CUDA), each one is read when it is needed here, which waits for the device at every
        step.

        Parameters
        ----------
        trainer : BaseOrtTrainer
            The trainer being fitted.
        epoch : int
            The epoch's 0-based index in the trainer's history.
        batch : int
            The batch's 0-based index in the epoch.
        loss : float
            The batch's objective, computed before its update (NaN or inf when the fit is
            about to raise ConvergenceError).
        """

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        """After each completed epoch; ``trainer.get_state()`` holds its weights.

        Parameters
        ----------
        trainer : BaseOrtTrainer
            The trainer being fitted.
        epoch : int
            The epoch's 0-based index in the trainer's history (it goes on over warm starts).
        logs : dict of str to float
            ``train_loss``, and ``validation_loss`` when there is validation data.

        Returns
        -------
        bool
            True to stop training after this epoch.
        """
        return False

    def on_train_end(self, trainer: BaseOrtTrainer) -> None:
        """At the end of every fit, also one that raised.

        Parameters
        ----------
        trainer : BaseOrtTrainer
            The trainer being fitted.
        """


class ProgressBar(Callback):
    """A tqdm bar over epochs with the running losses (``verbose=1``)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        from tqdm.auto import tqdm

        self.on_train_end(trainer)  # a bar a previous fit left open (never, unless called by hand)
        self._bar = tqdm(total=n_epochs, desc=type(trainer).__name__, unit="epoch")

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.5g}" for k, v in logs.items() if k != "epoch"})
            self._bar.update(1)
        return False

    def on_train_end(self, trainer: BaseOrtTrainer) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_bar": None}  # a bar does not pickle; the trainer must


class EpochPrinter(Callback):
    """One line per epoch, ``epoch 3/20: train_loss=...`` (``verbose=2``; the ``ort-train``
    command's output where stderr is no terminal, a log or CI, instead of a redrawn bar).

    Parameters
    ----------
    stream : {'stdout', 'stderr'}, default 'stdout'
        Where the lines go: looked up in :mod:`sys` at each line (a name, not the file, so that
        the callback pickles and follows a redirection).
    prefix : bool, default True
        Whether each line starts with the trainer's class, ``[OrtGradientOptimizer]``.
    """

    def __init__(self, stream: str = "stdout", prefix: bool = True) -> None:
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be 'stdout' or 'stderr', got {stream!r}")
        self.stream = stream
        self.prefix = prefix
        self._last = 0

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        # the epochs go on over resumes and warm starts: the last one this fit may reach
        self._last = trainer.n_iter_ + n_epochs

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        text = " ".join(f"{k}={v:.6g}" for k, v in logs.items() if k != "epoch")
        total = f"/{self._last}" if self._last > epoch else ""
        head = f"[{type(trainer).__name__}] " if self.prefix else ""
        print(f"{head}epoch {epoch + 1}{total}: {text}", file=getattr(sys, self.stream), flush=True)
        return False


class EarlyStopping(Callback):
    """Stops when the monitored loss has not improved by ``tol`` for ``n_iter_no_change`` epochs
    (scikit-learn's rule), on the validation loss when there is one.

    The count starts afresh with every fit (a warm-started one too, as scikit-learn's SGD
    counts per call), except that ``resume`` replays the checkpointed history first.

    Parameters
    ----------
    tol : float
        The improvement of the best loss that counts as one.
    n_iter_no_change : int
        Epochs in a row without such an improvement that stop the fit.

    Attributes
    ----------
    tol, n_iter_no_change
        As given.
    best : float
        The best monitored loss of this fit so far.
    bad_epochs : int
        Epochs in a row that have not improved on ``best`` by ``tol``.
    stopped : bool
        Whether the last epoch stopped the fit.
    """

    def __init__(self, tol: float, n_iter_no_change: int) -> None:
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self._reset()

    def _reset(self) -> None:
        self.best = math.inf
        self.bad_epochs = 0
        self.stopped = False

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        # the previous fit's best loss and count would otherwise stop this one after an epoch
        self._reset()

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        value = logs.get("validation_loss", logs["train_loss"])
        if value > self.best - self.tol:
            self.bad_epochs += 1
        else:
            self.bad_epochs = 0
        self.best = min(self.best, value)
        if self.bad_epochs >= self.n_iter_no_change and trainer.reduce_learning_rate(epoch):
            # learning_rate='adaptive': the rate is divided instead, the count starts again
            self.bad_epochs = 0
        self.stopped = self.bad_epochs >= self.n_iter_no_change
        return self.stopped
