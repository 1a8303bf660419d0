"""SGD linear models: scikit-learn's SGDRegressor / SGDClassifier parameters, trained by
onnxruntime. Schedules count samples as scikit-learn's; ``batch_size=1`` is per-sample SGD as
scikit-learn does it, the default ``'auto'`` about 32 steps per epoch (16 to 1024 rows)."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np
from onnx import ModelProto
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.metaestimators import available_if

from ort_train_core import (
    BaseLearningRate,
    Callback,
    EpsilonInsensitiveLearningLoss,
    HuberLearningLoss,
)
from ort_train_core.graph import initializer_values, inputs_to_initializers
from ort_train_core.losses import make_loss

from ._base import _COMMON_CONSTRAINTS, OrtClassifierMixin, OrtEstimatorMixin, OrtRegressorMixin
from ._docs import Entry, fill_doc
from ._graphs import dense_graph, layer_names, ovr_probabilities
from ._l1 import LearningRateSGDTruncatedL1, SparseCoefMixin
from ._sgd_rate import SPARSE_INTERCEPT_DECAY, LearningRateSGDIntercept
from ._sparse import PaddedRowsMixin

#: batch_size='auto': about this many steps per epoch, within [AUTO_BATCH_MIN, AUTO_BATCH_MAX]
#: rows (and at most the data)
AUTO_BATCH_STEPS = 32
#: the same with learning_rate='optimal', whose rates are large: the last iterates move by about
#: B / (n alpha epochs), and against scikit-learn's test accuracy on make_classification(n, 20)
#: (benchmarks/bench_datasets.py, 12 seeds at 3000 rows) 32 steps an epoch lost 0.01 to 0.04 on
#: 3000 to 30000 rows, 64 steps 0.020 +- 0.007 on 3000, 100 steps none (-0.002 +- 0.009)
AUTO_BATCH_STEPS_OPTIMAL = 100
AUTO_BATCH_MIN = 16
#: the same with an L1 share in the penalty ('l1', 'elasticnet') and learning_rate='optimal': the
#: truncated L1 step after each batch of 17 rows left 20% fewer exact zeros in coef_ than
#: scikit-learn's after each sample on digits (alpha=1e-3, 3 seeds), batches of 8 6-12% fewer
AUTO_BATCH_STEPS_L1 = 256
AUTO_BATCH_MIN_L1 = 8
AUTO_BATCH_MAX = 1024
#: the same on sparse X of short rows (the padded-row path), whose steps pay passes over the whole
#: ``coef_`` however few rows they hold: on text-like CSR 20k x 50k (density 1e-3, hinge,
#: 'optimal', 3 seeds) batches of 800 rows took 20-23 epochs against scikit-learn's 19-21, the
#: same test accuracy (within 0.004), and half the time of batches of 200
AUTO_BATCH_STEPS_SPARSE = 25

#: scikit-learn's SGDRegressor losses
_REGRESSION_LOSSES = (
    "squared_error",
    "absolute_error",
    "huber",
    "epsilon_insensitive",
    "squared_epsilon_insensitive",
)

#: scikit-learn's SGDClassifier losses (its regression losses on a classifier are not offered)
_CLASSIFICATION_LOSSES = ("hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron")

#: the parameters both SGD estimators document alike
_SGD_ENTRIES: dict[str, Entry] = {
    "penalty": (
        "{'l2', 'l1', 'elasticnet'} or None",
        "The penalty on the coefficients (not the intercept), as scikit-learn's: alpha times\n"
        "``||w||^2 / 2`` ('l2'), ``||w||_1`` ('l1') or their mix ('elasticnet'); None: none.\n"
        "The L1 share is applied as scikit-learn's cumulative truncated gradient (Tsuruoka et\n"
        "al. 2009), after each batch instead of each sample: it leaves exact zeros in ``coef_``\n"
        "(on digits with alpha=1e-3, 6-12% fewer than scikit-learn's; the same with\n"
        "``batch_size=1``); see :meth:`sparsify`. Its running totals go on over ``partial_fit``\n"
        "calls, where scikit-learn's restart at each call (which leaves it fewer zeros).",
    ),
    "alpha": ("float", "Multiplies the penalty; also the decay of ``learning_rate='optimal'``."),
    "l1_ratio": ("float", "The share of l1 in the 'elasticnet' penalty, in [0, 1]."),
    "fit_intercept": ("bool", "Whether to train the intercept (otherwise it stays 0)."),
    "learning_rate": (
        "{'constant', 'optimal', 'invscaling', 'adaptive'}",
        "The step size of sample t (from 1, counted over epochs as scikit-learn's ``t_``):\n"
        "``eta0`` ('constant'), ``eta0 / t ** power_t`` ('invscaling') or\n"
        "``1 / (alpha (t0 + t - 1))`` ('optimal', ``t0`` from scikit-learn's heuristic, ``eta0``\n"
        "unused), or 'adaptive': ``eta0`` divided by 5 each time ``n_iter_no_change`` epochs fail\n"
        "to improve by ``tol`` (the fit stops only once it is <= 1e-6). A batch of ``B`` rows steps\n"
        "with the sum of its rows' step sizes times its mean gradient: scikit-learn's ``B``\n"
        "per-sample steps to first order, the same steps for ``B = 1``.",
    ),
    "eta0": ("float", "The initial learning rate, for scikit-learn's loss scale."),
    "average": (
        "bool or int",
        "Averaged SGD, as scikit-learn's: ``coef_``, ``intercept_`` and the predictions are the\n"
        "mean of the weights over the samples seen from sample ``average`` on (True: 1), each\n"
        "sample counting the weights after its batch's step (scikit-learn's exactly with\n"
        "``batch_size=1``). Reads the weights after every step; not with ``checkpoint_dir``.",
    ),
    "batch_size": (
        "int or 'auto'",
        "Rows per step. 1 is per-sample SGD, scikit-learn's steps exactly (one onnxruntime run per\n"
        "row: slow). 'auto' (the default) takes ``n_samples // 32`` rows (``n_samples // 100`` with\n"
        "``learning_rate='optimal'``, whose large rates make the last steps of big batches noisy),\n"
        "at least 16 and at most 1024 (and the data), which reached scikit-learn's test scores on its\n"
        "datasets (``benchmarks/bench_datasets.py``); with 'optimal' and an L1 share in the penalty\n"
        "``n_samples // 256``, at least 8, whose truncated L1 steps leave about scikit-learn's zeros.\n"
        "A sample weight scales its row's step.",
    ),
    # in the signature's order, after loss
    "sgd_parameters": (
        "%(penalty)s\n%(alpha)s\n%(l1_ratio)s\n%(fit_intercept)s\n%(max_iter)s\n%(tol)s\n%(shuffle)s\n"
        "%(verbose)s\n%(random_state)s\n%(learning_rate)s\n%(eta0)s\n%(power_t)s\n%(early_stopping)s\n"
        "%(validation_fraction)s\n%(n_iter_no_change)s\n%(warm_start)s\n%(average)s\n%(batch_size)s\n%(device)s\n"
        "%(training)s\n%(checkpoint_dir)s\n%(checkpoint_every)s\n%(threads)s\n%(backend)s"
    ),
}


class _Averaging(Callback):
    """scikit-learn's averaged SGD (``average``): after each step, the running mean of the
    weights over the samples seen from sample ``start`` on (``t`` from 1), each sample counting
    the weights after its batch's step (with one row per batch, scikit-learn's average
    exactly). The mean lives in ``estimator._average_weights`` across warm starts and
    ``partial_fit``."""

    def __init__(self, estimator: _OrtSGDBase, start: int) -> None:
        self.estimator = estimator
        self.start = start
        self.seen = 0

    def on_train_begin(self, trainer: Any, n_epochs: int) -> None:
        self.seen = trainer.samples_seen_

    def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
        seen = trainer.samples_seen_  # samples t = 1..seen have been stepped on
        rows, self.seen = seen - self.seen, seen
        new = min(rows, seen - self.start + 1)  # this batch's samples with t >= start
        if new <= 0:
            return
        before = seen - rows - self.start + 1  # samples averaged so far
        average = self.estimator._average_weights
        assert average is not None  # made with the callback
        weights = trainer.get_state()  # after this batch's step
        for name in average:
            current = weights[name]
            if before <= 0:
                average[name] = current.astype(np.float64)
            else:
                average[name] += (current - average[name]) * (new / (before + new))


class _OrtSGDBase(SparseCoefMixin, PaddedRowsMixin, OrtEstimatorMixin):
    # scikit-learn's SGD and MLP estimators take sparse X: trained on its padded rows
    # (PaddedRowsMixin), or batches densified one at a time where its rows are long
    _accepts_sparse = True
    # scikit-learn's SGD scales each sample's step by its weight
    _rows_weighted = True
    # its early stopping keeps the last epoch's weights; t_ counts updates from 1
    _keeps_best_epoch = False
    _t_start = 1.0  # a float, as scikit-learn's
    _t_restarts = True
    _parameter_constraints: dict[str, list[Any]] = {
        **_COMMON_CONSTRAINTS,
        "penalty": [StrOptions({"l2", "l1", "elasticnet"}), None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "l1_ratio": [Interval(Real, 0, 1, closed="both")],
        "fit_intercept": ["boolean"],
        "learning_rate": [StrOptions({"constant", "optimal", "invscaling", "adaptive"})],
        "eta0": [Interval(Real, 0, None, closed="neither")],
        # negative values grow the rate: deprecated in scikit-learn 1.8, an error from 1.10
        "power_t": [Interval(Real, 0, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "average": ["boolean", Interval(Integral, 0, None, closed="neither")],  # as scikit-learn: not 0
    }

    def _average_start(self) -> int:
        """The sample (t from 1) from which the weights are averaged; 0: no averaging."""
        return int(self.average)

    def _step_callback(self, first: bool) -> Callback | None:
        start = self._average_start()
        if start <= 0:
            return None
        if self.checkpoint_dir is not None:
            raise ValueError(
                "average with checkpoint_dir: the averaged weights are not in the checkpoints; "
                "use one or the other"
            )
        if first or getattr(self, "_average_weights", None) is None:
            self._average_weights: dict[str, np.ndarray] | None = {
                name: np.zeros(0) for name in self._trained_weights(self._raw_model)
            }
        return _Averaging(self, start)

    def _averaging(self) -> bool:
        """Whether coef_ and the predictions use the averaged weights: averaging has begun,
        ``average`` <= the samples stepped on (scikit-learn: ``average <= t_ - 1``)."""
        start = self._average_start()
        if start <= 0 or getattr(self, "_average_weights", None) is None:
            return False
        return bool(start <= self._trainer.samples_seen_)

    def _trained_graph(self) -> ModelProto:
        model = super()._trained_graph()
        if not self._averaging():
            return model
        average = self._average_weights or {}
        current = initializer_values(model, list(average))
        return inputs_to_initializers(model, {n: a.astype(current[n].dtype) for n, a in average.items()})

    def _initial_graph(self, n_features: int, n_outputs: int, rng: np.random.RandomState) -> ModelProto:
        # scikit-learn starts SGD from zeros
        return dense_graph([np.zeros((n_features, n_outputs))], [np.zeros(n_outputs)])

    def _validation_indices(
        self, y_enc: np.ndarray, rng: np.random.RandomState
    ) -> tuple[np.ndarray, np.ndarray]:
        """scikit-learn's SGD split: (Stratified)ShuffleSplit seeded with ``random_state``
        itself, rows kept in their order (a mask over the data)."""
        splitter = StratifiedShuffleSplit if self._is_classifier else ShuffleSplit
        cv = splitter(test_size=self.validation_fraction, random_state=self.random_state)
        train, test = next(cv.split(np.zeros((len(y_enc), 1)), y_enc if self._is_classifier else None))
        return np.sort(train), np.sort(test)

    def _trained_weights(self, model: ModelProto) -> list[str]:
        coef, intercept = layer_names(1)[0]
        return [coef, intercept] if self.fit_intercept else [coef]

    def _penalized_weights(self, model: ModelProto) -> list[str]:
        return [layer_names(1)[0][0]]

    def _initial_eta(self) -> float:
        """The learning rate of the first sample, scikit-learn's: ``eta0``, or for 'optimal' its
        heuristic ``typw / max(1, dloss(1, -typw))``, ``typw = alpha ** -0.25``; ``dloss`` is
        <= 0 there for each of its losses, so that is ``typw``."""
        if self.learning_rate != "optimal":
            return float(self.eta0)
        if self.alpha == 0:
            raise ValueError("alpha must be > 0 with learning_rate='optimal' (its step is 1 / (alpha t))")
        return math.pow(float(self.alpha), -0.25)

    def _learning_rate(self, scale: float) -> BaseLearningRate:
        # scikit-learn's schedules count samples (t_ from 1): per_sample, whatever the batch;
        # our gradient is `scale` times scikit-learn's: the same step needs eta0 / scale
        schedule: dict[str, Any] = dict(
            eta0=self._initial_eta() / scale,
            alpha=self.alpha * scale,
            power_t=self.power_t,
            learning_rate=self.learning_rate,
            per_sample=True,
        )
        if self.fit_intercept and getattr(self, "_sparse_fit", False):
            # scikit-learn damps the intercept's steps on sparse X
            schedule.update(intercept=layer_names(1)[0][1], intercept_decay=SPARSE_INTERCEPT_DECAY)
        l1, _ = self._penalty(scale, 1.0)
        if l1:  # scikit-learn's truncated L1 step, which leaves exact zeros in coef_
            penalized = self._penalized_weights(self._raw_model)
            return LearningRateSGDTruncatedL1(**schedule, l1=l1, penalized=penalized)
        return LearningRateSGDIntercept(**schedule)

    def _penalty(self, scale: float, batch_weight: float) -> tuple[float, float]:
        """scikit-learn adds alpha * R(w), R = ||w||^2 / 2 (l2), ||w||_1 (l1) or their mix."""
        if self.penalty is None or self.alpha == 0:
            return 0.0, 0.0
        ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": self.l1_ratio}[self.penalty]
        return scale * self.alpha * ratio, scale * self.alpha * (1 - ratio) / 2

    def _batch_size(self, n_samples: int) -> int:
        if self.batch_size == "auto":
            # a step costs tens of microseconds whatever its rows: few steps; but batches much
            # larger than 1/32 of the data need more epochs to reach scikit-learn's tol (measured
            # in benchmarks/bench_datasets.py), which costs more than the steps save
            steps = AUTO_BATCH_STEPS_OPTIMAL if self.learning_rate == "optimal" else AUTO_BATCH_STEPS
            smallest = AUTO_BATCH_MIN
            if self.learning_rate == "optimal" and self._penalty(1.0, 1.0)[0]:
                steps, smallest = AUTO_BATCH_STEPS_L1, AUTO_BATCH_MIN_L1
            elif getattr(self, "_padded_form", None) is not None:
                steps = min(steps, AUTO_BATCH_STEPS_SPARSE)
            return min(n_samples, AUTO_BATCH_MAX, max(smallest, n_samples // steps))
        return min(int(self.batch_size), n_samples)

    def _store_weights(self, weights: dict[str, np.ndarray]) -> None:
        coef_name, intercept_name = layer_names(1)[0]
        if self._averaging():
            weights = {**weights, **(self._average_weights or {})}
        coef = weights[coef_name].T
        # the graph's intercept is read only where it is not trained (fit_intercept=False)
        intercept = weights[intercept_name] if intercept_name in weights else self._raw_intercept()
        self._store_linear(coef, intercept)

    def _raw_intercept(self) -> np.ndarray:
        _, intercept_name = layer_names(1)[0]
        return initializer_values(self._raw_model, [intercept_name])[intercept_name]

    def _store_linear(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        raise NotImplementedError


@fill_doc(_SGD_ENTRIES)
class OrtSGDRegressor(OrtRegressorMixin, RegressorMixin, _OrtSGDBase):
    """Linear regression by minibatch SGD in onnxruntime.

    Takes the parameters of scikit-learn's ``SGDRegressor`` and sets its fitted attributes.

    Parameters
    ----------
    loss : {'squared_error', 'absolute_error', 'huber', 'epsilon_insensitive', \
'squared_epsilon_insensitive'}, default='squared_error'
        The loss of each sample, with ``r = y - p``: ``r^2 / 2``, ``|r|``, Huber's (``r^2 / 2``
        within ``epsilon``, linear beyond), ``max(0, |r| - epsilon)`` or its square, as
        scikit-learn's.
    epsilon : float, default=0.1
        The ``epsilon`` of the Huber and epsilon-insensitive losses.
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
        "loss": [
            StrOptions(
                {
                    "squared_error",
                    "absolute_error",
                    "huber",
                    "epsilon_insensitive",
                    "squared_epsilon_insensitive",
                }
            )
        ],
        "epsilon": [Interval(Real, 0, None, closed="left")],
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
        epsilon: float = 0.1,
        random_state: Any = None,
        learning_rate: str = "invscaling",
        eta0: float = 0.01,
        power_t: float = 0.25,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 5,
        warm_start: bool = False,
        average: bool | int = False,
        batch_size: int | str = "auto",
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        threads: int | None = None,
        backend: str | None = None,
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
        self.epsilon = epsilon
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.average = average
        self.batch_size = batch_size
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    def _loss(self, n_outputs: int) -> tuple[Any, Any, float]:
        # scikit-learn's squared_error is (y - p)^2 / 2, ours (y - p)^2
        if self.loss == "squared_error":
            return "squared_error", "square_error", 2.0
        if self.loss == "absolute_error":
            return "absolute_error", "absolute_error", 1.0
        if self.loss == "huber":
            return HuberLearningLoss(self.epsilon), HuberLearningLoss(self.epsilon), 1.0
        squared = self.loss == "squared_epsilon_insensitive"
        loss = EpsilonInsensitiveLearningLoss(self.epsilon, squared=squared)
        return loss, loss, 1.0

    def _store_linear(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        self.coef_ = coef.ravel().astype(self._fitted_dtype())
        self.intercept_ = np.asarray(intercept, dtype=np.float64).reshape(-1)  # float64 as scikit-learn


@fill_doc(_SGD_ENTRIES)
class OrtSGDClassifier(OrtClassifierMixin, ClassifierMixin, _OrtSGDBase):
    """Linear classification by SGD in onnxruntime, with scikit-learn's ``SGDClassifier`` losses:
    one decision value for two classes; for more, one per class, each the binary classifier of
    its class (one-vs-rest, scikit-learn's scheme), or a softmax over them
    (``multi_class='multinomial'``, log loss only).

    Takes the parameters of scikit-learn's ``SGDClassifier`` and sets its fitted attributes.

    Parameters
    ----------
    loss : {'hinge', 'log_loss', 'modified_huber', 'squared_hinge', 'perceptron'}, default='hinge'
        The loss of each sample's margin ``z = y f`` (``y`` in {-1, +1}): ``max(0, 1 - z)``,
        ``log(1 + exp(-z))``, the modified Huber loss, ``max(0, 1 - z)^2``, ``max(0, -z)``.
        ``predict_proba`` exists for 'log_loss' and 'modified_huber' only, as scikit-learn's.
    multi_class : {'ovr', 'multinomial'}, default='ovr'
        For more than two classes: one-vs-rest (scikit-learn's), or the multinomial log loss
        (softmax cross-entropy, ``loss='log_loss'`` only).
    class_weight : dict, 'balanced' or None, default=None
        Weights of the classes, multiplying each sample's weight, as scikit-learn's.
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

    _parameter_constraints = {
        **_OrtSGDBase._parameter_constraints,
        "loss": [StrOptions(set(_CLASSIFICATION_LOSSES))],
        "multi_class": [StrOptions({"ovr", "multinomial"})],
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }

    def __init__(
        self,
        loss: str = "hinge",
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
        average: bool | int = False,
        batch_size: int | str = "auto",
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        multi_class: str = "ovr",
        class_weight: Any = None,
        threads: int | None = None,
        backend: str | None = None,
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
        self.average = average
        self.batch_size = batch_size
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.multi_class = multi_class
        self.class_weight = class_weight
        self.threads = threads
        self.backend = backend

    def _loss(self, n_outputs: int) -> tuple[Any, Any, float]:
        # scikit-learn's dloss of each of these is the gradient of ours: scale 1
        if self.loss == "log_loss" and (n_outputs == 1 or self.multi_class == "multinomial"):
            return "cross_entropy", "cross_entropy", 1.0
        name = "logistic" if self.loss == "log_loss" else self.loss
        if n_outputs == 1 or getattr(self, "_column_weights", None) is None:
            return name, name, 1.0
        # one-vs-rest class weights weigh each binary problem's positive rows (scikit-learn's)
        loss = make_loss(name, class_weight=[float(w) for w in self._column_weights])  # type: ignore[union-attr]
        return loss, loss, 1.0

    def _fit_arrays(
        self, X: Any, y: Any, sample_weight: Any, first: bool, classes: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        if self.multi_class == "multinomial" and self.loss != "log_loss":
            raise ValueError(
                f"multi_class='multinomial' is the softmax cross-entropy: it needs loss='log_loss', "
                f"not {self.loss!r}; use multi_class='ovr' for {self.loss!r}"
            )
        X, y_enc, sw, n_outputs = super()._fit_arrays(X, y, sample_weight, first, classes)
        self._column_weights: np.ndarray | None = None
        if self.class_weight is None:
            return X, y_enc, sw, n_outputs
        weights = compute_class_weight(self.class_weight, classes=self.classes_, y=self.classes_[y_enc])
        if n_outputs > 1 and self.multi_class == "ovr":
            # each column's loss weighs its class's rows (the loss holds them): not per row
            self._column_weights = weights
            return X, y_enc, sw, n_outputs
        # two classes (or the multinomial loss): each row's weight times its class's weight
        per_row = weights[y_enc].astype(np.float32)
        return X, y_enc, per_row if sw is None else sw * per_row, n_outputs

    def _tol_columns(self, n_outputs: int) -> int:
        # scikit-learn fits one binary problem per class, each stopping when its own mean loss
        # stops improving by tol; the one-vs-rest loss here sums the classes' losses
        return n_outputs if self.multi_class == "ovr" else 1

    def _probability_kind(self) -> str | None:
        """scikit-learn's probability model of the loss, None where it has none."""
        if self.loss == "log_loss":
            return "softmax" if self.multi_class == "multinomial" else "ovr_logistic"
        return "modified_huber" if self.loss == "modified_huber" else None

    def _head_kind(self) -> str:
        return self._probability_kind() or "decision"

    def _check_proba(self) -> bool:
        if self._probability_kind() is None:
            raise AttributeError(f"probability estimates are not available for loss={self.loss!r}")
        return True

    @available_if(_check_proba)
    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``, as scikit-learn's
        ``SGDClassifier`` computes them: for 'log_loss', the sigmoid of each one-vs-rest decision
        value normalised per row (the softmax with ``multi_class='multinomial'``); for
        'modified_huber', ``(clip(d, -1, 1) + 1) / 2`` normalised.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Probabilities, in X's float type.
        """
        kind = self._probability_kind()
        if kind == "softmax":
            return super().predict_proba(X)
        (scores,) = self._run("raw", X)
        out: np.ndarray = ovr_probabilities(scores, str(kind)).astype(scores.dtype, copy=False)
        return out

    @available_if(_check_proba)
    def predict_log_proba(self, X: Any) -> np.ndarray:
        """The logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Log-probabilities, in X's float type.
        """
        kind = self._probability_kind()
        if kind == "softmax" or (kind == "ovr_logistic" and len(self.classes_) == 2):
            # two classes: the sigmoid is the softmax of [0, z], whose log-softmax stays finite
            return super().predict_log_proba(X)
        proba = self.predict_proba(X)
        with np.errstate(divide="ignore"):
            out: np.ndarray = np.log(proba)
        return out

    def predict(self, X: Any) -> np.ndarray:
        """The class of the largest decision value (for two classes, ``classes_[1]`` where the
        decision value is > 0), as scikit-learn's.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,)
            Labels from ``classes_``.
        """
        (scores,) = self._run("raw", X)
        index = (scores[:, 0] > 0).astype(np.int64) if scores.shape[1] == 1 else np.argmax(scores, axis=1)
        labels: np.ndarray = self.classes_[index]
        return labels

    def _store_linear(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        self.coef_ = np.atleast_2d(coef).astype(self._fitted_dtype())
        self.intercept_ = np.asarray(intercept, dtype=np.float64).reshape(-1)  # float64 as scikit-learn
