"""SGD linear models: scikit-learn's SGDRegressor / SGDClassifier parameters, trained by
onnxruntime. ``batch_size=1`` (the default) is per-sample SGD as scikit-learn does it."""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
from onnx import ModelProto
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions

from ort_train_core import BaseLearningRate, LearningRateSGD
from ort_train_core.graph import initializer_values

from ._base import _COMMON_CONSTRAINTS, OrtClassifierMixin, OrtEstimatorMixin, OrtRegressorMixin
from ._docs import Entry, fill_doc
from ._graphs import dense_graph, layer_names

#: the parameters both SGD estimators document alike
_SGD_ENTRIES: dict[str, Entry] = {
    "penalty": (
        "{'l2', 'l1', 'elasticnet'} or None",
        "The penalty on the coefficients (not the intercept), as scikit-learn's: alpha times\n"
        "``||w||^2 / 2`` ('l2'), ``||w||_1`` ('l1') or their mix ('elasticnet'); None: none.",
    ),
    "alpha": ("float", "Multiplies the penalty; also the decay of ``learning_rate='optimal'``."),
    "l1_ratio": ("float", "The share of l1 in the 'elasticnet' penalty, in [0, 1]."),
    "fit_intercept": ("bool", "Whether to train the intercept (otherwise it stays 0)."),
    "learning_rate": (
        "{'constant', 'optimal', 'invscaling'}",
        "The step size at epoch t (from 0): ``eta0`` ('constant'), ``eta0 / (t + 1) ** power_t``\n"
        "('invscaling') or ``eta0 / (1 + alpha * eta0 * t)`` ('optimal').",
    ),
    "eta0": ("float", "The initial learning rate, for scikit-learn's loss scale."),
    "batch_size": (
        "int",
        "Rows per step; 1 is per-sample SGD as scikit-learn does it. A sample weight scales\nits row's step.",
    ),
    # in the signature's order, after loss
    "sgd_parameters": (
        "%(penalty)s\n%(alpha)s\n%(l1_ratio)s\n%(fit_intercept)s\n%(max_iter)s\n%(tol)s\n%(shuffle)s\n"
        "%(verbose)s\n%(random_state)s\n%(learning_rate)s\n%(eta0)s\n%(power_t)s\n%(early_stopping)s\n"
        "%(validation_fraction)s\n%(n_iter_no_change)s\n%(warm_start)s\n%(batch_size)s\n%(device)s\n"
        "%(training)s\n%(checkpoint_dir)s\n%(checkpoint_every)s"
    ),
}


class _OrtSGDBase(OrtEstimatorMixin):
    # scikit-learn's SGD scales each sample's step by its weight
    _rows_weighted = True
    # its early stopping keeps the last epoch's weights; t_ counts updates from 1
    _keeps_best_epoch = False
    _t_start = 1
    _parameter_constraints: dict[str, list[Any]] = {
        **_COMMON_CONSTRAINTS,
        "penalty": [StrOptions({"l2", "l1", "elasticnet"}), None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "l1_ratio": [Interval(Real, 0, 1, closed="both")],
        "fit_intercept": ["boolean"],
        "learning_rate": [StrOptions({"constant", "optimal", "invscaling"})],
        "eta0": [Interval(Real, 0, None, closed="neither")],
        "power_t": [Interval(Real, None, None, closed="neither")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
    }

    def _initial_graph(self, n_features: int, n_outputs: int, rng: np.random.RandomState) -> ModelProto:
        # scikit-learn starts SGD from zeros
        return dense_graph([np.zeros((n_features, n_outputs))], [np.zeros(n_outputs)])

    def _trained_weights(self, model: ModelProto) -> list[str]:
        coef, intercept = layer_names(1)[0]
        return [coef, intercept] if self.fit_intercept else [coef]

    def _penalized_weights(self, model: ModelProto) -> list[str]:
        return [layer_names(1)[0][0]]

    def _learning_rate(self, scale: float) -> BaseLearningRate:
        # our gradient is `scale` times scikit-learn's: the same step needs eta0 / scale
        return LearningRateSGD(
            eta0=self.eta0 / scale,
            alpha=self.alpha * scale,
            power_t=self.power_t,
            learning_rate=self.learning_rate,
        )

    def _penalty(self, scale: float, batch_weight: float) -> tuple[float, float]:
        """scikit-learn adds alpha * R(w), R = ||w||^2 / 2 (l2), ||w||_1 (l1) or their mix."""
        if self.penalty is None or self.alpha == 0:
            return 0.0, 0.0
        ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": self.l1_ratio}[self.penalty]
        return scale * self.alpha * ratio, scale * self.alpha * (1 - ratio) / 2

    def _batch_size(self, n_samples: int) -> int:
        return min(int(self.batch_size), n_samples)

    def _store_weights(self, weights: dict[str, np.ndarray]) -> None:
        coef_name, intercept_name = layer_names(1)[0]
        coef = weights[coef_name].T
        intercept = weights.get(intercept_name, self._raw_intercept())
        self._store_linear(coef, intercept)

    def _raw_intercept(self) -> np.ndarray:
        _, intercept_name = layer_names(1)[0]
        return initializer_values(self._raw_model, [intercept_name])[intercept_name]

    def _store_linear(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        raise NotImplementedError


@fill_doc(_SGD_ENTRIES)
class OrtSGDRegressor(OrtRegressorMixin, RegressorMixin, _OrtSGDBase):
    """Linear regression by minibatch SGD in onnxruntime (squared or absolute error).

    Takes the parameters of scikit-learn's ``SGDRegressor`` and sets its fitted attributes.

    Parameters
    ----------
    loss : {'squared_error', 'absolute_error'}, default='squared_error'
        The loss of each sample: ``(y - p)^2 / 2`` or ``|y - p|``.
    %(sgd_parameters)s

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        The coefficients.
    intercept_ : ndarray of shape (1,)
        The intercept.
    %(fit_attributes)s
    """

    _multi_output = False

    _parameter_constraints = {
        **_OrtSGDBase._parameter_constraints,
        "loss": [StrOptions({"squared_error", "absolute_error"})],
    }

    def __init__(
        self,
        loss: str = "squared_error",
        *,
        penalty: str | None = "l2",
        alpha: float = 0.0001,
        l1_ratio: float = 0.15,
        fit_intercept: bool = True,
        max_iter: int = 1000,
        tol: float | None = 1e-3,
        shuffle: bool = True,
        verbose: int = 0,
        random_state: Any = None,
        learning_rate: str = "invscaling",
        eta0: float = 0.01,
        power_t: float = 0.25,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 5,
        warm_start: bool = False,
        batch_size: int = 1,
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
    ) -> None:
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.batch_size = batch_size
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        # scikit-learn's squared_error is (y - p)^2 / 2, ours (y - p)^2
        if self.loss == "squared_error":
            return "squared_error", "square_error", 2.0
        return "absolute_error", "absolute_error", 1.0

    def _store_linear(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        self.coef_ = coef.ravel().astype(np.float64)
        self.intercept_ = np.asarray(intercept, dtype=np.float64).reshape(-1)


@fill_doc(_SGD_ENTRIES)
class OrtSGDClassifier(OrtClassifierMixin, ClassifierMixin, _OrtSGDBase):
    """Linear classification by minibatch SGD on the log loss in onnxruntime: one logit and a
    sigmoid for two classes, one logit per class and a softmax for more (not one-vs-rest).

    Takes the parameters of scikit-learn's ``SGDClassifier`` and sets its fitted attributes.

    Parameters
    ----------
    loss : {'log_loss'}, default='log_loss'
        The log loss (cross-entropy) of the probabilities.
    %(sgd_parameters)s

    Attributes
    ----------
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        The coefficients: one row (that of ``classes_[1]``) for two classes, one per class
        otherwise.
    intercept_ : ndarray of shape (1,) or (n_classes,)
        The intercepts.
    %(classes_)s
    %(fit_attributes)s
    """

    _parameter_constraints = {**_OrtSGDBase._parameter_constraints, "loss": [StrOptions({"log_loss"})]}

    def __init__(
        self,
        loss: str = "log_loss",
        *,
        penalty: str | None = "l2",
        alpha: float = 0.0001,
        l1_ratio: float = 0.15,
        fit_intercept: bool = True,
        max_iter: int = 1000,
        tol: float | None = 1e-3,
        shuffle: bool = True,
        verbose: int = 0,
        random_state: Any = None,
        learning_rate: str = "optimal",
        eta0: float = 0.01,
        power_t: float = 0.5,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 5,
        warm_start: bool = False,
        batch_size: int = 1,
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
    ) -> None:
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.batch_size = batch_size
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        return "cross_entropy", "cross_entropy", 1.0

    def _store_linear(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        self.coef_ = np.atleast_2d(coef).astype(np.float64)
        self.intercept_ = np.asarray(intercept, dtype=np.float64).reshape(-1)
