"""Hooks the shared fit loop calls: progress, printing and early stopping are callbacks, not
branches in the loop."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._fit_loop import BaseOrtTrainer


class Callback:
    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        pass

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        """Returns True to stop training after this epoch."""
        return False

    def on_train_end(self, trainer: BaseOrtTrainer) -> None:
        pass


class ProgressBar(Callback):
    """A tqdm bar over epochs with the running losses (``verbose=1``)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        from tqdm.auto import tqdm

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
    """One line per epoch on stdout (``verbose=2``)."""

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        text = " ".join(f"{k}={v:.6g}" for k, v in logs.items() if k != "epoch")
        print(f"[{type(trainer).__name__}] epoch {epoch + 1}: {text}", file=sys.stdout, flush=True)
        return False


class EarlyStopping(Callback):
    """Stops when the monitored loss has not improved by ``tol`` for ``n_iter_no_change`` epochs
    (scikit-learn's rule), on the validation loss when there is one."""

    def __init__(self, tol: float, n_iter_no_change: int) -> None:
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.best = math.inf
        self.bad_epochs = 0
        self.stopped = False

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        self.stopped = False

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        value = logs.get("validation_loss", logs["train_loss"])
        if value > self.best - self.tol:
            self.bad_epochs += 1
        else:
            self.bad_epochs = 0
        self.best = min(self.best, value)
        self.stopped = self.bad_epochs >= self.n_iter_no_change
        return self.stopped
