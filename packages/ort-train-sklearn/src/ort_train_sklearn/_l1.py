"""scikit-learn's L1 penalty for the SGD estimators: the cumulative truncated gradient of
Tsuruoka, Tsujii and Ananiadou (2009), which leaves exact zeros in ``coef_``, written as the
update nodes of the training step; and scikit-learn's ``sparsify`` / ``densify``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_is_fitted

from ._sgd_rate import LearningRateSGDIntercept

if TYPE_CHECKING:  # the builder core's learning rates write their nodes with
    from ort_train_core.extending import NodeBuilder


class LearningRateSGDTruncatedL1(LearningRateSGDIntercept):
    """Plain SGD whose L1 penalty is scikit-learn's cumulative truncated gradient.

    After each step, every penalised weight moves toward zero by at most ``u - q``, without
    crossing it: ``u`` is the L1 penalty every weight could have received so far (the sum of
    ``l1`` times each step's learning rate) and ``q`` what this weight did receive. A weight
    the data gradient keeps near zero is clipped to exactly zero, as scikit-learn's
    ``l1penalty`` does after each sample (here after each batch, whose learning rate is the
    sum of its samples' rates). The loss graph keeps the term ``l1 * sum|W|`` in the objective
    (the loss and ``tol`` see it, as scikit-learn's objective does) but its subgradient
    ``l1 sign(W)`` is taken out of the step: the truncation applies the penalty instead.

    Parameters
    ----------
    eta0, alpha, power_t, learning_rate, per_sample
        The schedule, as :class:`~ort_train_core.LearningRateSGD`'s.
    intercept, intercept_decay
        The damped intercept, as :class:`LearningRateSGDIntercept`'s.
    l1 : float, default=0.0
        The coefficient of ``sum|W|`` in the objective, > 0, in the objective's scale.
    penalized : sequence of str, default=()
        The weights the L1 penalty applies to; the others take plain SGD steps.

    Attributes
    ----------
    state_names : tuple of str
        ``('l1_total', 'l1_applied')``: ``u`` (the same value in every entry) and ``q``, per
        weight, zero at the start of each fit.
    """

    state_names = ("l1_total", "l1_applied")

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: str = "invscaling",
        per_sample: bool | str = False,
        intercept: str | None = None,
        intercept_decay: float = 1.0,
        l1: float = 0.0,
        penalized: Sequence[str] = (),
    ) -> None:
        super().__init__(eta0, alpha, power_t, learning_rate, per_sample, intercept, intercept_decay)
        self.l1 = l1
        self.penalized = tuple(penalized)

    def validate(self) -> None:
        super().validate()
        if not self.l1 > 0:
            raise ValueError(f"l1 must be > 0 for the truncated L1 penalty, got {self.l1}")

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        total, applied = states
        if weight not in self.penalized:  # the intercept: plain SGD, its states unused
            new, _ = super().update_nodes(b, weight, grad, [], scalars)
            return new, [b.op("Identity", [total]), b.op("Identity", [applied])]
        lr = scalars["learning_rate"]
        # no 0-d operand over the weight (the scalars come shaped for it: onnxruntime's slow
        # broadcast over [F, 1]) and no Where: a few elementwise kernels over the coefficients
        l1_step = b.op("Mul", [b.const(self.l1, "l1"), lr], f"{weight}_l1_step")
        # the gradient holds the objective's l1 sign(W) (Abs's gradient in both backends): the
        # step leaves it out, the truncation below applies the penalty instead
        stepped = b.op("Sub", [weight, b.op("Mul", [lr, grad])], f"{weight}_stepped")
        moved = b.op("Add", [stepped, b.op("Mul", [l1_step, b.op("Sign", [weight])])], f"{weight}_moved")
        u = b.op("Add", [total, l1_step], f"{weight}_l1_total_new")
        # scikit-learn's l1penalty: w > 0 -> max(0, w - (u + q)); w < 0 -> min(0, w + (u - q));
        # with s = sign(w) both are s * max(0, |w| - u - s q), and 0 stays 0
        sign = b.op("Sign", [moved])
        room = b.op("Sub", [b.op("Sub", [b.op("Abs", [moved]), u]), b.op("Mul", [sign, applied])])
        new = b.op("Mul", [sign, b.op("Relu", [room])], f"{weight}_new")
        q_new = b.op("Add", [applied, b.op("Sub", [new, moved])], f"{weight}_l1_applied_new")
        return new, [u, q_new]


class SparseCoefMixin:
    """scikit-learn's ``sparsify`` / ``densify`` of ``coef_`` (its ``SparseCoefMixin``).

    The predictions come from the trained graph, not from ``coef_``: they are the same with
    either form.
    """

    coef_: Any

    def densify(self) -> Any:
        """Converts a sparse ``coef_`` back to a numpy array (the default form after a fit).

        Returns
        -------
        self
            The estimator, ``coef_`` dense.
        """
        check_is_fitted(self, msg="Estimator, %(name)s, must be fitted before densifying.")
        if sp.issparse(self.coef_):
            self.coef_ = self.coef_.toarray()
        return self

    def sparsify(self) -> Any:
        """Converts ``coef_`` to a ``scipy.sparse`` CSR matrix, which stores only its non-zero
        entries (worth it where most are zero: an L1 or elastic-net penalty).

        Returns
        -------
        self
            The estimator, ``coef_`` a CSR matrix (scikit-learn's ``sparse_interface``
            setting chooses ``csr_matrix`` or ``csr_array``, as for its own estimators);
            :meth:`densify` converts it back, and a later fit sets a dense ``coef_`` again.
        """
        check_is_fitted(self, msg="Estimator, %(name)s, must be fitted before sparsifying.")
        self.coef_ = _sparse_interface(self.coef_)
        return self


def _sparse_interface(coef: np.ndarray) -> Any:
    """``coef`` as scikit-learn's ``sparsify`` makes it: from 1.9 a ``csr_array`` (1-D for a
    regressor's 1-D ``coef_``) in the interface its ``sparse_interface`` setting names (a
    ``csr_matrix`` by default); before, a ``csr_matrix`` of the array (2-D: ``(1, F)``)."""
    try:
        from sklearn.utils import _align_api_if_sparse
    except ImportError:  # scikit-learn < 1.9
        return sp.csr_matrix(coef)
    return _align_api_if_sparse(sp.csr_array(coef))
