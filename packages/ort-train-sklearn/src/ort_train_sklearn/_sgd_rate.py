"""The SGD estimators' plain update with scikit-learn's damped intercept on sparse X."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ort_train_core import LearningRateSGD

if TYPE_CHECKING:  # the builder core's learning rates write their nodes with
    from ort_train_core.extending import NodeBuilder

#: scikit-learn's SGD steps the intercept with this share of the rate when X is sparse (its
#: ``SPARSE_INTERCEPT_DECAY``): the intercept meets every row, each coefficient only the rows
#: that hold its feature
SPARSE_INTERCEPT_DECAY = 0.01


class LearningRateSGDIntercept(LearningRateSGD):
    """Plain SGD whose intercept steps with ``intercept_decay`` times the rate.

    Parameters
    ----------
    eta0, alpha, power_t, learning_rate, per_sample
        The schedule, as :class:`~ort_train_core.LearningRateSGD`'s.
    intercept : str or None, default=None
        The weight whose steps are damped (None: none is).
    intercept_decay : float, default=1.0
        Its share of the rate, in ``(0, 1]``: :data:`SPARSE_INTERCEPT_DECAY` on sparse X, as
        scikit-learn's SGD.
    """

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: str = "invscaling",
        per_sample: bool | str = False,
        intercept: str | None = None,
        intercept_decay: float = 1.0,
    ) -> None:
        super().__init__(eta0, alpha, power_t, learning_rate, per_sample)
        self.intercept = intercept
        self.intercept_decay = intercept_decay

    def validate(self) -> None:
        super().validate()
        if not 0 < self.intercept_decay <= 1:
            raise ValueError(f"intercept_decay must be in (0, 1], got {self.intercept_decay}")

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        if weight == self.intercept and self.intercept_decay != 1:
            rate = b.op(
                "Mul",
                [scalars["learning_rate"], b.const(self.intercept_decay, "intercept_decay")],
                f"{weight}_rate",
            )
            scalars = {**scalars, "learning_rate": rate}
        return super().update_nodes(b, weight, grad, states, scalars)
