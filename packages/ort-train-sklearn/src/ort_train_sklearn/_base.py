"""The fit/predict machinery every estimator of this package shares.

An estimator builds (or receives) a prediction graph, trains it with one of ort-train-core's
loops, and keeps the trained weights on the host. Sessions are rebuilt lazily and never pickled.
"""

from __future__ import annotations

import math
import os
import warnings
from numbers import Integral, Real
from typing import Any, NamedTuple, TypeVar

import numpy as np
from onnx import ModelProto
from sklearn.base import BaseEstimator, _fit_context
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets, type_of_target, unique_labels
from sklearn.utils.validation import (
    _check_sample_weight,
    assert_all_finite,
    check_is_fitted,
    validate_data,
)

import ort_train_core
from ort_train_core import (
    BaseLearningRate,
    Callback,
    ElasticLearningPenalty,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    cast_checked,
    exclusive_fit,
    initializers_to_inputs,
    parse_device,
)
from ort_train_core.extending import (
    BACKENDS,
    EPOCH_LOSS_WEIGHTS,
    MAX_CACHED_MODEL_BYTES,
    Device,
    LRUCache,
    check_sparse_structure,
    count_weight_values,
    cpu_threads,
    dense_rows,
    float_initializers,
    is_sparse,
    keeps_values,
    model_digest,
    same_values,
    sparse_as,
    warn_inexact_integers,
    with_values,
)
from ort_train_core.graph import initializer_values, inputs_to_initializers, set_metadata

from ._graphs import classifier_head, copy_model, probabilities, with_float_type

_Estimator = TypeVar("_Estimator", bound="OrtEstimatorMixin")


class _Sessions(NamedTuple):
    """A graph's sessions by intra-op thread count (None: onnxruntime's default pool)."""

    model: bytes
    weight_values: float
    by_threads: dict[int | None, Any]


def inference_session(model: bytes, device: Device, threads: int | None) -> Any:
    """An onnxruntime InferenceSession of ``model`` on ``device`` with ``threads`` intra-op
    threads (None: onnxruntime's default)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(model, options, providers=device.providers)


#: X (an array, or a tuple of the arrays of several inputs), y and the sample weights (None:
#: all 1) of a fit
_Arrays = tuple[Any, np.ndarray, np.ndarray | None]

#: the parameters a fit reads itself; the others build the trainer, which a warm fit or a
#: partial_fit rebuilds when they changed
_READ_AT_EACH_FIT = frozenset(
    {"max_iter", "tol", "shuffle", "early_stopping", "validation_fraction", "n_iter_no_change", "warm_start"}
)


#: parameter values whose validity cannot change while the estimator holds them
_IMMUTABLE_PARAMS = (str, int, float, type(None), np.generic)

_COMMON_CONSTRAINTS: dict[str, list[Any]] = {
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "tol": [Interval(Real, 0, None, closed="left"), None],
    "shuffle": ["boolean"],
    "random_state": ["random_state"],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "warm_start": ["boolean"],
    "verbose": ["verbose"],
    "device": [str],
    "training": [StrOptions({"full", "partial"})],
    "checkpoint_dir": [str, os.PathLike, None],
    "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
    "threads": [Interval(Integral, 1, None, closed="left"), None],
    "backend": [StrOptions(set(BACKENDS)), None],
}


def _to_float32(name: str, values: Any, given: Any = None) -> np.ndarray:
    """``values`` as a C-contiguous float32 array, the type the graphs compute in; values beyond
    its range are refused (core's cast: a float64 1e39 would otherwise become inf). A sparse
    matrix stays sparse (CSR), its stored values cast. ``given``, the caller's array before
    scikit-learn's validation made it float64, is warned about when it holds integers that
    float32 rounds (beyond 2**24)."""
    if is_sparse(values):
        # scikit-learn's validation made it CSR of finite floats, its index arrays checked
        # before (check_sparse_structure): only the cast is left
        out: np.ndarray = sparse_as(name, values, np.dtype(np.float32), checked=True)
        return out
    out = cast_checked(name, np.asarray(values), np.dtype(np.float32))
    if isinstance(given, np.ndarray) and given.shape == out.shape:
        warn_inexact_integers(name, given, out)
    return out


def _sparse_float32(estimator: Any, X: Any) -> Any:
    """A validated CSR X whose values were not checked yet, in float32: the cast's own check
    (a NaN, an inf or a value beyond float32 is not finite once cast, cast_checked) finds them
    in one pass over the values instead of two (0.09 ms of a 5 000-row sparse predict's 1.9);
    NaN and inf get scikit-learn's message, as its validation gives."""
    if X.dtype == np.float32:  # no cast: scikit-learn's check
        assert_all_finite(X.data, estimator_name=type(estimator).__name__, input_name="X")
        return X
    try:
        return sparse_as("X", X, np.dtype(np.float32), checked=True)
    except ValueError:
        assert_all_finite(X.data, estimator_name=type(estimator).__name__, input_name="X")
        raise  # finite, beyond float32's range


#: values (rows x features) densified at once when a sparse X is predicted: 16 MiB of float32
PREDICT_CHUNK_VALUES = 1 << 22


def _run_dense(sess: Any, X: Any) -> list[np.ndarray]:
    """The session's outputs on X; a sparse X runs in chunks of densified rows of about
    PREDICT_CHUNK_VALUES values (memory O(chunk)), the outputs concatenated."""
    name = sess.get_inputs()[0].name
    if not is_sparse(X):
        out: list[np.ndarray] = sess.run(None, {name: X})
        return out
    rows = max(1, PREDICT_CHUNK_VALUES // max(1, X.shape[1]))
    parts = [sess.run(None, {name: dense_rows(X, slice(s, s + rows))}) for s in range(0, X.shape[0], rows)]
    return [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]


def _raveled_column(y: np.ndarray) -> np.ndarray:
    """A column vector y [n, 1] as [n], with scikit-learn's DataConversionWarning."""
    if y.ndim != 2 or y.shape[1] != 1:
        return y
    warnings.warn(
        "A column-vector y was passed when a 1d array was expected. Please change the "
        "shape of y to (n_samples,), for example using ravel().",
        DataConversionWarning,
        stacklevel=6,
    )
    return y[:, 0]


def _n_rows(X: Any) -> int:
    """Rows of X: an array, or a tuple of the arrays of several inputs."""
    return int(X[0].shape[0] if isinstance(X, tuple) else X.shape[0])


#: loss graphs built in this process, by initial graph structure (its weights' values left out)
#: and loss settings, with whether the build kept the weights as they were: every fit of a
#: drop-in of one architecture (an MLP from other random weights too) reuses one, and
#: add_loss_output (normalisation, checks, shape inference) takes 1.2-2.6 ms of each fit
_LOSS_GRAPHS: LRUCache[tuple[ModelProto, bool]] = LRUCache(16)


def _loss_graph(
    model: ModelProto, score: Any, penalty: dict[str, dict[str, float]] | None, reduction: str
) -> ModelProto:
    """``add_loss_output(model, score, ...)`` for the full loop, from the cache when a graph of
    the same structure and settings was seen (a copy with ``model``'s weights: the trainer owns
    its model)."""
    floats = float_initializers(model)

    def build() -> tuple[ModelProto, bool]:
        weight = "sample_weight"
        graph = add_loss_output(model, score, weight_name=weight, penalty=penalty, reduction=reduction)
        return graph, keeps_values(model, graph, floats)

    if model.ByteSize() > MAX_CACHED_MODEL_BYTES:
        return build()[0]
    settings = (type(score), repr(score), repr(penalty), reduction)
    graph, fed = _LOSS_GRAPHS.get_or_build((model_digest(model, floats), *settings), build)
    if fed:
        return with_values(graph, model, floats)
    # the build changed a weight's tensor: only a model of the same values may reuse it
    return copy_model(_LOSS_GRAPHS.get_or_build((model_digest(model), *settings), build)[0])


#: the parameter names of each estimator class (BaseEstimator's inspection, once)
_PARAM_NAMES: dict[type, tuple[str, ...]] = {}


def _n_features(X: Any) -> int:
    """Columns of a 2-D X; 0 for the inputs of other graphs (a given model ignores it)."""
    return int(X.shape[1]) if (isinstance(X, np.ndarray) and X.ndim == 2) or is_sparse(X) else 0


#: label types that scikit-learn's type_of_target always finds binary or multiclass in a 1-D
#: array (integers, booleans, strings): what check_classification_targets and unique_labels accept
_CLASS_LABEL_KINDS = "iubU"


def _same_classes(classes: Any, fitted: np.ndarray) -> bool:
    """Whether ``classes`` names the same labels as ``fitted``, in any order. The same labels in
    the same order and type (each call of a partial_fit stream passes them) are seen at once:
    scikit-learn's unique_labels takes 0.2 ms a call."""
    given = np.asarray(classes)
    kind = fitted.dtype.kind
    if given.dtype == fitted.dtype and kind in _CLASS_LABEL_KINDS and np.array_equal(given, fitted):
        return True
    return bool(np.array_equal(unique_labels(classes), unique_labels(fitted)))


def _check_class_labels(y: Any, fitted: np.ndarray | None) -> bool:
    """scikit-learn's check_classification_targets (0.2 ms a call), skipped where it can only
    pass without a word: a 1-D array of integers, booleans or strings, after a fit of ``fitted``
    classes too few for its warning on more than half the rows' labels unique, if all of y's
    labels are among them. Returns whether it was skipped (the caller runs it before refusing
    unknown labels)."""
    skip = (
        fitted is not None
        and isinstance(y, np.ndarray)
        and y.ndim == 1
        and y.dtype.kind in _CLASS_LABEL_KINDS
        and (len(y) <= 20 or len(fitted) <= round(0.5 * len(y)))
    )
    if not skip:
        check_classification_targets(y)
    return skip


def _unknown_labels(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The labels of y not in ``classes``, sorted, as ``np.setdiff1d(np.unique(y), classes)``;
    numbers by a search in the sorted classes instead of sorting y (a fifth of the time)."""
    if y.ndim != 1 or y.dtype.kind not in "iubf" or classes.dtype.kind not in "iubf":
        out: np.ndarray = np.setdiff1d(np.unique(y), classes)
        return out
    known = np.sort(classes)
    found = known[np.minimum(np.searchsorted(known, y), len(known) - 1)] == y
    return y[:0] if found.all() else np.unique(y[~found])


def _encode(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Each label's column in ``classes`` (every label is in it), int64. ``classes`` may be in
    any order (an ONNX model lists its labels in the order of its logit columns), so a sorted
    search goes through the sorting permutation."""
    order = np.argsort(classes, kind="stable")
    index: np.ndarray = order[np.searchsorted(classes[order], y)].astype(np.int64)
    return index


class _ValidationScore(Callback):
    """scikit-learn's early stopping: after each epoch, the validation score of the epoch's
    weights (the estimator's ``score``: accuracy or R², weighted by the validation sample
    weights); the count of epochs whose score is below the best + ``tol`` stops the fit once
    it exceeds ``n_iter_no_change`` (MLPs) or reaches it (SGD); ``tol=None`` never stops. The
    best epoch's weights are kept in ``best_state``."""

    def __init__(
        self,
        estimator: OrtEstimatorMixin,
        validation: _Arrays,
        tol: float | None,
        n_iter_no_change: int,
        carried: tuple[list[float], float, int] | None = None,
    ) -> None:
        self.estimator = estimator
        self.X, self.y, self.sample_weight = validation
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        #: a warm fit of the MLPs goes on with the earlier fit's scores, best and count, as
        #: scikit-learn's (the best weights: those the fit starts from, which it kept)
        self.carried = carried
        self._session: Any = None
        self.on_train_begin(None, 0)

    def on_train_begin(self, trainer: Any, n_epochs: int) -> None:
        scores, best, count = self.carried or ([], -math.inf, 0)
        self.scores: list[float] = list(scores)
        self.best = best
        self.count = count
        self.best_state: dict[str, np.ndarray] | None = (
            trainer.get_state() if self.carried is not None and trainer is not None else None
        )
        self.stopped = False

    def _outputs(self, trainer: Any, state: dict[str, np.ndarray]) -> np.ndarray:
        """The raw outputs (scores or logits) of ``state``'s weights on the validation rows; the
        session (weights as inputs) is built at the first epoch of a fit and then reused."""
        if self._session is None:
            graph = initializers_to_inputs(trainer.get_trained_onnx(), list(state))
            device = parse_device(self.estimator.device)
            rows = (self.X[0] if isinstance(self.X, tuple) else self.X).shape[0]
            values = float(sum(v.size for v in state.values()))
            self._session = inference_session(
                graph.SerializeToString(), device, cpu_threads(device, rows, values, self.estimator.threads)
            )
        names = [i.name for i in self._session.get_inputs()]
        if isinstance(self.X, tuple):
            data = dict(zip(names, self.X))
        else:  # a sparse validation X is densified whole once, as core does for its loss
            if is_sparse(self.X):
                self.X = self.X.toarray()
            data = {names[0]: self.X}
        return np.asarray(self._session.run(None, {**data, **state})[0])

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, float]) -> bool:
        state = trainer.get_state()
        score = self.estimator._score_outputs(self._outputs(trainer, state), self.y, self.sample_weight)
        self.scores.append(score)
        self.count = self.count + 1 if self.tol is None or score < self.best + self.tol else 0
        if score > self.best:
            self.best, self.best_state = score, state
        if self.tol is None:
            return False
        limit = self.n_iter_no_change
        stopped = self.count > limit if self.estimator._keeps_best_epoch else self.count >= limit
        if stopped and trainer.reduce_learning_rate(epoch):
            # learning_rate='adaptive': the rate is divided by 5 instead, the count restarts
            self.count, stopped = 0, False
        self.stopped = stopped
        return self.stopped


class OrtEstimatorMixin(BaseEstimator):
    """Subclasses provide the graph, the loss and the learning rate; this class trains."""

    _is_classifier = False
    #: fits several targets (y of shape (n, k)): regressors unless they say otherwise
    _multi_output = False
    #: sample weights scale each row's step (batch objective mean_i s_i l_i, the 'row_mean'
    #: reduction: SGD) instead of weighting the batch mean (sum_i s_i l_i / sum_i s_i, 'mean':
    #: scikit-learn's MLP; with one row per batch it would cancel the weight)
    _rows_weighted = False
    #: early stopping as scikit-learn's MLP (stop when the count exceeds n_iter_no_change, keep
    #: the best epoch's weights), or as its SGD (stop when it reaches it, keep the last ones)
    _keeps_best_epoch = True
    #: t_ before the first epoch: scikit-learn's MLPs count samples from 0, its SGD from 1
    _t_start: float = 0
    #: whether every fit (a warm one too) starts t_ again (scikit-learn's SGD) or only the first
    #: (its MLPs)
    _t_restarts = False
    #: whether y may be a multilabel indicator matrix (scikit-learn's MLPClassifier)
    _supports_multilabel = False
    #: whether X may be a scipy.sparse matrix (scikit-learn's SGD and MLP estimators): kept in
    #: CSR, each batch densified when it is gathered, predictions in chunks
    _accepts_sparse = False

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """scikit-learn's, read once per class: it inspects ``__init__``'s signature at every
        ``get_params`` (0.13 ms, where a fit reads its parameters two or three times)."""
        names = _PARAM_NAMES.get(cls)
        if names is None:
            names = _PARAM_NAMES[cls] = tuple(super()._get_param_names())
        return list(names)

    # ---- what a subclass says -----------------------------------------------------------
    def _initial_graph(self, n_features: int, n_outputs: int, rng: np.random.RandomState) -> ModelProto:
        raise NotImplementedError

    def _trained_weights(self, model: ModelProto) -> list[str]:
        """Weights to train, in order."""
        raise NotImplementedError

    def _penalized_weights(self, model: ModelProto) -> list[str]:
        return []

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        """(score name for add_loss_output, learning-loss name, scale): our gradient is
        ``scale`` times the one scikit-learn steps with (ours has no 1/2 factor)."""
        raise NotImplementedError

    def _reported_scale(self, n_outputs: int, scale: float) -> float:
        """Our objective over the loss scikit-learn reports (``loss_curve_``, ``tol``)."""
        return scale

    def _step_callback(self, first: bool) -> Callback | None:
        """A callback of every step (the SGD estimators' ``average``), None without."""
        return None

    def _full_batch(self) -> bool:
        """Whether the fit is a full-batch optimisation (the MLPs' 'lbfgs'), not epochs."""
        return False

    def _validate_params_once(self) -> None:
        """scikit-learn's parameter validation, skipped while the parameters hold the values it
        last passed, where these are all immutable (numbers, strings, None): a stream of
        partial_fit calls checks them once (0.13 ms a call, a tenth of a 200-row call)."""
        params = self.get_params(deep=False)
        validated = self.__dict__.pop("_validated_params", None)
        if validated is not None and same_values(validated, params):
            self._validated_params = validated
            return
        self._validate_params()
        if all(isinstance(v, _IMMUTABLE_PARAMS) for v in params.values()):
            self._validated_params = params

    def _check_partial_fit(self) -> bool:
        """partial_fit exists for the stochastic solvers only, as scikit-learn's."""
        if self._full_batch():
            raise AttributeError(
                f"partial_fit is only available for stochastic optimizers; {self.solver!r} "
                "is not stochastic (use solver='sgd' or 'adam')"
            )
        return True

    def _fit_full_batch(
        self, trainer: Any, X: Any, y_enc: np.ndarray, sw: np.ndarray | None, n_outputs: int
    ) -> None:
        raise NotImplementedError

    def _tol_columns(self, n_outputs: int) -> int:
        """How many problems of scikit-learn's the loss sums, each stopping on ``tol`` on its
        own (one-vs-rest SGD: one per class); the trainer stops on ``tol`` times that."""
        return 1

    def _learning_rate(self, scale: float) -> BaseLearningRate:
        raise NotImplementedError

    def _penalty(self, scale: float, batch_weight: float) -> tuple[float, float]:
        """(l1, l2) of our penalty, matching scikit-learn's alpha in our objective's scale;
        ``batch_weight`` is the expected total sample weight of a batch."""
        return 0.0, 0.0

    def _batch_size(self, n_samples: int) -> int:
        raise NotImplementedError

    def _fitted_dtype(self) -> np.dtype[Any]:
        """The float type of the fitted weights: the last fit's X (float64 before any)."""
        return np.dtype(getattr(self, "_weights_dtype", np.float64))

    def _store_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Sets the fitted attributes scikit-learn names (coef_, coefs_, ...)."""
        raise NotImplementedError

    # ---- fit ----------------------------------------------------------------------------
    def _predicts_column(self) -> bool:
        """Whether the prediction is a column [N, 1], so that a y of that shape is kept as
        given (and predicted so) instead of raveled with a DataConversionWarning."""
        return False

    def _prepare_targets(self, y: np.ndarray, first: bool, classes: Any = None) -> tuple[np.ndarray, int]:
        if not self._is_classifier:
            y = _to_float32("y", y)
            y = y if self._predicts_column() else _raveled_column(y)
            n_outputs = 1 if y.ndim == 1 else y.shape[1]
            if first:
                self._y_ndim = y.ndim
            return (y.reshape(-1, 1) if y.ndim == 1 else y), n_outputs
        if self._supports_multilabel:  # a column of labels is not a multilabel matrix
            y = _raveled_column(y)
        skipped = _check_class_labels(y, None if first else self.classes_)
        if self._supports_multilabel and (first or getattr(self, "_multilabel", False)):
            multilabel = type_of_target(y) == "multilabel-indicator"
            if y.ndim == 2 and not multilabel:
                raise ValueError(
                    f"y should be a 1d array of labels or a multilabel indicator matrix of 0/1, got "
                    f"shape {y.shape} with values {np.unique(y)[:5].tolist()}"
                )
            if first:
                self._multilabel = multilabel
            elif not multilabel:
                raise ValueError("the first fit had multilabel targets: y must be an indicator matrix")
            if multilabel:
                return self._multilabel_targets(y, first)
        return self._class_indices(y, first, classes, skipped)

    def _class_indices(
        self, y: np.ndarray, first: bool, classes: Any, skipped: bool
    ) -> tuple[np.ndarray, int]:
        """Each label's column in ``classes_`` (set by a first fit) and n_outputs; refuses
        labels outside it. ``skipped``: check_classification_targets was skipped (y's labels
        were expected among the fitted classes)."""
        if first:
            self.classes_ = self._initial_classes(y, classes)
            if len(self.classes_) < 2:
                raise ValueError(
                    f"{type(self).__name__} needs samples of at least 2 classes in the data, but the "
                    f"data contains only one class: {self.classes_[:1].tolist()[0]!r}"
                )
        elif classes is not None and not _same_classes(classes, self.classes_):
            if skipped:  # its warning (more than half the labels unique) comes first, as before
                check_classification_targets(y)
            # scikit-learn's rule: the model has one output per class of the first call
            raise ValueError(
                f"classes={np.asarray(classes).tolist()!r} is not the same as on the first call to "
                f"partial_fit (or fit), which set classes_={self.classes_.tolist()!r}; pass those "
                "classes or none"
            )
        unknown = _unknown_labels(y, self.classes_)
        if unknown.size:
            if skipped:  # its warning (more than half the labels unique) comes first, as before
                check_classification_targets(y)
            if first:
                raise ValueError(
                    f"y holds labels {unknown.tolist()!r} not in classes={self.classes_.tolist()!r}: "
                    "classes must include every label y can hold"
                )
            raise ValueError(
                f"y holds labels {unknown.tolist()!r} not seen in the first fit: classes are "
                f"{self.classes_.tolist()!r}; a new class needs a new fit"
            )
        n_outputs = 1 if len(self.classes_) == 2 else len(self.classes_)
        return _encode(y, self.classes_), n_outputs

    def _multilabel_targets(self, y: np.ndarray, first: bool) -> tuple[np.ndarray, int]:
        """An indicator matrix y [n, k]: one logit per label, trained with the binary
        cross-entropy of each (scikit-learn's MLPClassifier); classes_ = 0..k-1."""
        if first:
            self.classes_ = np.arange(y.shape[1])
        elif y.shape[1] != len(self.classes_):
            raise ValueError(f"y has {y.shape[1]} labels, the first fit had {len(self.classes_)}")
        return np.ascontiguousarray(y, dtype=np.float32), y.shape[1]

    def _initial_classes(self, y: np.ndarray, classes: Any) -> np.ndarray:
        """``classes_`` of a first fit: ``classes`` (partial_fit) as their sorted set, else the
        labels in y, as scikit-learn's unique_labels gives them (object strings as str). The logit
        columns follow this order."""
        return np.asarray(unique_labels(y if classes is None else classes))

    def _start_fit(self, X: Any, y: Any) -> None:
        """What a fit from scratch does before reading the data (estimators that train a given
        model convert it here)."""

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self: _Estimator, X: Any, y: Any, sample_weight: Any = None) -> _Estimator:
        """Trains on (X, y) for ``max_iter`` epochs (fewer with ``tol``), from the initial
        weights, or from the current ones with ``warm_start=True``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training samples (computed in float32).
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets: class labels for a classifier.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples (non-negative, not all zero); None gives each weight 1.

        Returns
        -------
        self
            The fitted estimator.
        """
        return self._fit(X, y, sample_weight)

    def resume(self: _Estimator, X: Any, y: Any, sample_weight: Any = None) -> _Estimator:
        """Continues the fit saved in ``checkpoint_dir`` (same model, data and parameters) up to
        ``max_iter`` epochs in all, ending at the weights an uninterrupted ``fit`` reaches; a
        plain fit when no checkpoint exists yet.

        Parameters
        ----------
        X, y, sample_weight
            The arguments of the interrupted :meth:`fit`.

        Returns
        -------
        self
            The fitted estimator.

        Raises
        ------
        ValueError
            Without ``checkpoint_dir``, or when the checkpoint belongs to other data or
            parameters (``ort_train_core.exceptions.CheckpointMismatchError``).
        """
        if self.checkpoint_dir is None:
            raise ValueError("resume() needs checkpoint_dir, the folder fit() writes its checkpoints to")
        return self._fit(X, y, sample_weight, resume=True)

    def _fit(
        self: _Estimator,
        X: Any,
        y: Any,
        sample_weight: Any = None,
        incremental: bool = False,
        classes: Any = None,
        resume: bool = False,
    ) -> _Estimator:
        """fit, partial_fit (``incremental``: one epoch, no validation split) and resume, one at
        a time: each builds or rebuilds the trainer, so the trainer's own guard cannot see a
        second call on this estimator."""
        action = "resume" if resume else "partial_fit" if incremental else "fit"
        with exclusive_fit(self, action):
            self._fit_alone(X, y, sample_weight, incremental, classes, resume)
        return self

    def _fit_input(self, X: Any, given: Any) -> Any:
        """A fit's validated X in float32, the type the graphs compute in (sparse: CSR)."""
        return _to_float32("X", X, given)

    def _training_form(self, X: Any, validation: _Arrays | None) -> tuple[Any, _Arrays | None]:
        """X and the validation arrays in the form the trainer's graph takes (as they are here;
        the SGD estimators' padded rows of a sparse X)."""
        return X, validation

    def _training_graph(self, model: ModelProto) -> ModelProto:
        """The graph the trainer trains, over ``model``'s weights (``model`` itself here)."""
        return model

    def _check_fit_call(self, incremental: bool, resume: bool) -> None:
        """The combinations of parameters and calls refused before anything changes."""
        if incremental and self.early_stopping:
            # as scikit-learn's: one epoch over the given rows has no validation split to watch
            raise ValueError("partial_fit does not support early_stopping=True; set early_stopping=False")
        if self._full_batch() and (self.checkpoint_dir is not None or resume):
            raise ValueError("checkpoint_dir and resume() need a stochastic solver ('sgd' or 'adam')")
        if self.early_stopping and not incremental and (self.checkpoint_dir is not None or resume):
            raise ValueError(
                "early_stopping with checkpoint_dir: the validation scores, their count and the best "
                "epoch's weights are not in the checkpoints, so resume() would not end where an "
                "uninterrupted fit does; use one or the other (the core trainers' validation-loss "
                "early stopping resumes exactly)"
            )

    def _fit_alone(
        self, X: Any, y: Any, sample_weight: Any, incremental: bool, classes: Any, resume: bool
    ) -> None:
        """_fit's work, with no other fit of this estimator running."""
        first = not ((incremental or self.warm_start) and hasattr(self, "_trainer")) or resume
        self._check_fit_call(incremental, resume)
        if first:
            self._start_fit(X, y)
        X, y_enc, sw, n_outputs = self._fit_arrays(X, y, sample_weight, first, classes)
        rebuild = not first and (
            not incremental or not same_values(self._built_with(), self._shaping_params())
        )
        # a partial_fit that goes on with its trainer draws nothing: no random state made
        # (check_random_state of a seed builds a RandomState: a tenth of a 200-row call); each
        # use below is on a path where it was made
        rng: Any = check_random_state(self.random_state) if first or rebuild else None
        if first:  # the initial weights take the first draws, as in scikit-learn
            model = self._initial_graph(_n_features(X), n_outputs, rng)
        validation = None
        if self.early_stopping and not incremental:
            (X, y_enc, sw), validation = self._split_validation(X, y_enc, sw, rng)
        X, validation = self._training_form(X, validation)
        mean_weight = 1.0 if sw is None or self._rows_weighted else float(np.mean(sw, dtype=np.float64))
        if first:
            self._trainer = self._make_trainer(model, _n_rows(X), n_outputs, rng, mean_weight)
            self._curve_before: list[float] = []
        elif rebuild:
            # scikit-learn reads every parameter at each call: a warm fit starts a new
            # optimisation (schedule, optimizer state) from the fitted weights, a partial_fit
            # continues the schedule with the current parameters
            self._remake_trainer(_n_rows(X), n_outputs, rng, mean_weight, keep_progress=incremental)
        scoring = self._configure_trainer(incremental, first, validation)
        restart_t = first or (not incremental and self._t_restarts)
        if self._full_batch():  # scikit-learn's L-BFGS: no epochs, no early stopping
            if restart_t:
                self.t_ = self._t_start
            self._fit_full_batch(self._trainer, X, y_enc, sw, n_outputs)
            return
        self._fit_epochs((X, y_enc, sw), validation, scoring, resume)
        if restart_t:
            self.t_ = self._t_start
        n_total = _n_rows(X) + (0 if validation is None else _n_rows(validation[0]))
        # samples seen (MLP: training rows) or updates (SGD: every row of X, as scikit-learn)
        self.t_ = self.t_ + self.n_iter_ * (_n_rows(X) if self._keeps_best_epoch else n_total)

    def _configure_trainer(
        self, incremental: bool, first: bool, validation: _Arrays | None
    ) -> _ValidationScore | None:
        """Sets this call's epochs, stopping rule, shuffling and callbacks on the trainer;
        returns the validation scoring callback (early stopping), None without."""
        trainer = self._trainer
        trainer.max_iter = 1 if incremental else self.max_iter
        trainer.tol = (
            None if incremental or self.tol is None else self.tol * self._report_scale * self._tol_scale
        )
        # scikit-learn's MLP stops when the count exceeds n_iter_no_change, its SGD when the
        # count reaches it (core's rule)
        trainer.n_iter_no_change = self.n_iter_no_change + (1 if self._keeps_best_epoch else 0)
        trainer.shuffle = self.shuffle
        scoring = None
        if validation is not None:
            # scikit-learn stops on the validation score, not on a loss: the trainer records
            # the validation loss (and checkpoints it) but this callback decides
            carried = None
            previous = getattr(self, "validation_scores_", None)
            if not first and self._keeps_best_epoch and previous:
                count = int(getattr(self, "_no_improvement_count", 0))
                carried = (list(previous), max(previous), count)
            scoring = _ValidationScore(self, validation, self.tol, self.n_iter_no_change, carried)
            trainer.tol = None
        callbacks = [cb for cb in (scoring, self._step_callback(first or not incremental)) if cb is not None]
        trainer.callbacks = callbacks or None
        return scoring

    def _fit_epochs(
        self, data: _Arrays, validation: _Arrays | None, scoring: _ValidationScore | None, resume: bool
    ) -> None:
        """The stochastic solvers' epochs (the trainer's fit or resume), then the history."""
        trainer = self._trainer
        epochs_before = int(getattr(trainer, "n_iter_", 0))
        try:
            self._train(trainer.resume if resume else trainer.fit, data, validation)
        except ort_train_core.ConvergenceError:
            # the trainer rolled back to its last finite state: the fitted attributes and the
            # predictions follow it, as a pickled copy or to_onnx() would
            self._store_history(trainer, epochs_before)
            raise
        if scoring is not None:
            self._end_early_stopping(trainer, scoring)
        self._store_history(trainer, epochs_before, scoring)

    def _end_early_stopping(self, trainer: Any, scoring: _ValidationScore) -> None:
        """The MLPs keep the best epoch's weights; a fit that ran max_iter epochs warns."""
        if self._keeps_best_epoch and scoring.best_state is not None:
            trainer.set_state(scoring.best_state)
        if self.tol is not None and not scoring.stopped and len(scoring.scores) >= self.max_iter:
            warnings.warn(
                f"{type(self).__name__}: maximum iterations ({self.max_iter}) reached and the "
                "optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=4,
            )

    def _score_outputs(self, raw: np.ndarray, y_enc: np.ndarray, sample_weight: np.ndarray | None) -> float:
        """The estimator's ``score`` from the graph's raw outputs: accuracy of the logits'
        classes for a classifier (y_enc: class indices), R² for a regressor."""
        if self._is_classifier:
            multilabel = getattr(self, "_multilabel", False)
            predicted = (raw > 0).astype(np.float32) if multilabel else np.argmax(probabilities(raw), axis=1)
            return float(accuracy_score(y_enc, predicted, sample_weight=sample_weight))
        return float(r2_score(y_enc, raw.reshape(y_enc.shape), sample_weight=sample_weight))

    def _fit_arrays(
        self, X: Any, y: Any, sample_weight: Any, first: bool, classes: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """X in float32, y encoded (labels as class indices), the sample weights in float32
        (zero-weight rows dropped where the batch loss is a weighted mean) and n_outputs."""
        # a sparse X's index arrays checked before scikit-learn's validation converts it (a CSC
        # or COO matrix becomes CSR in native code that trusts them: malformed ones crash)
        check_sparse_structure("X", X)
        given = X
        X, y = validate_data(
            self,
            X,
            y,
            reset=first,
            accept_sparse="csr" if self._accepts_sparse else False,
            dtype=(np.float32, np.float64),
            multi_output=self._multi_output,
            y_numeric=not self._is_classifier,
        )
        # the fitted weights take X's float type, as scikit-learn's SGD and MLP estimators keep
        # float32 data in float32 (the training itself runs in float32 either way)
        self._weights_dtype = X.dtype
        X = self._fit_input(X, given)
        y_enc, n_outputs = self._prepare_targets(y, first, classes)
        if sample_weight is None:
            return X, y_enc, None, n_outputs
        # checked in float64, then cast: a weight beyond float32 is refused by _to_float32
        # (scikit-learn's own cast would overflow with a RuntimeWarning first)
        sw = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        sw = _to_float32("sample_weight", sw)
        if not sw.any():
            raise ValueError("sample_weight is all zeros: there is nothing to learn from")
        if not self._rows_weighted and not sw.all():
            # a weighted batch mean ignores zero-weight rows: drop them rather than let a batch
            # of zero weights divide 0 by 0
            keep = sw > 0
            X, y_enc, sw = X[keep], y_enc[keep], sw[keep]
        return X, y_enc, sw, n_outputs

    def _split_validation(
        self, X: Any, y_enc: np.ndarray, sw: np.ndarray | None, rng: np.random.RandomState
    ) -> tuple[_Arrays, _Arrays]:
        """(training, validation) rows for early stopping: ``validation_fraction`` of them,
        stratified for classifiers, drawn from ``rng``."""
        features = list(X) if isinstance(X, tuple) else [X]  # several inputs: a tuple of arrays
        idx_train, idx_val = self._validation_indices(y_enc, rng)
        arrays = [*features, y_enc, *([] if sw is None else [sw])]
        train, test = [a[idx_train] for a in arrays], [a[idx_val] for a in arrays]  # dense or CSR
        k = len(features)
        X, X_val = (tuple(train[:k]), tuple(test[:k])) if isinstance(X, tuple) else (train[0], test[0])
        y_enc, y_val = train[k], test[k]
        if len(y_val) < 2:
            # scikit-learn's MLP rule: a validation score (R2 above all) needs two rows
            raise ValueError(
                f"The validation set is too small: validation_fraction={self.validation_fraction} "
                f"of {len(y_enc) + len(y_val)} samples leaves {len(y_val)}. Increase "
                "'validation_fraction' or the size of your dataset, or set early_stopping=False."
            )
        sw, sw_val = (train[k + 1], test[k + 1]) if sw is not None else (None, None)
        return (X, y_enc, sw), (X_val, y_val, sw_val)

    def _validation_indices(
        self, y_enc: np.ndarray, rng: np.random.RandomState
    ) -> tuple[np.ndarray, np.ndarray]:
        """(training, validation) row indices, as scikit-learn's MLPs draw them:
        ``train_test_split`` with the estimator's random state after the initial weights took
        their draws, stratified for a single label column (binary: not for a one-hot
        multiclass or multilabel target, which scikit-learn's MLP splits)."""
        stratify = self._is_classifier and y_enc.ndim == 1 and len(np.unique(y_enc)) <= 2
        train, test = train_test_split(
            np.arange(len(y_enc)),
            test_size=self.validation_fraction,
            random_state=rng,
            stratify=y_enc if stratify else None,
        )
        return train, test

    def _train(self, run: Any, data: _Arrays, validation: _Arrays | None) -> None:
        """Runs the trainer's fit (or resume) with scikit-learn's ConvergenceWarning in place of
        core's; other warnings pass through unchanged."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ort_train_core.ConvergenceWarning)
            run(*data, *(validation or (None, None, None)))
        for w in caught:
            if issubclass(w.category, ort_train_core.ConvergenceWarning):
                warnings.warn(
                    f"{type(self).__name__}: maximum iterations ({self.max_iter}) reached and the "
                    "optimization hasn't converged yet.",
                    ConvergenceWarning,
                    stacklevel=4,
                )
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def _store_history(
        self, trainer: Any, epochs_before: int, scoring: _ValidationScore | None = None
    ) -> None:
        """The fitted attributes: weights, ``n_iter_``, ``loss_curve_``, ``loss_``,
        ``best_loss_`` and the validation scores, in scikit-learn's scale."""
        self._store_weights(trainer.get_state())
        # scikit-learn's n_iter_ counts the epochs of this call; loss_curve_ goes on over warm
        # starts and partial fits
        self.n_iter_ = int(trainer.n_iter_) - epochs_before
        before: list[float] = getattr(self, "_curve_before", [])
        losses = trainer.train_losses_
        new = [float(v) / self._report_scale for v in losses[epochs_before:]]
        curve: list[float] | None = getattr(self, "loss_curve_", None)
        # a call that continues the curve appends this call's epochs: a stream of partial_fit
        # calls would otherwise rebuild the whole history at each call (quadratic)
        extend = curve is not None and len(curve) == len(before) + epochs_before
        previous_best = getattr(self, "best_loss_", None)
        if curve is None or not extend:
            curve = [*before, *(float(v) / self._report_scale for v in losses[:epochs_before])]
        curve.extend(new)
        self.loss_curve_ = curve
        if self.loss_curve_:
            self.loss_ = self.loss_curve_[-1]
        # with early stopping, scikit-learn's MLP sets best_loss_ to None and records the
        # validation score (accuracy or R2) of each epoch
        self.validation_scores_ = list(scoring.scores) if scoring is not None and scoring.scores else None
        self._no_improvement_count = scoring.count if scoring is not None else 0
        self.best_loss_: float | None
        if self.validation_scores_ is None:
            if extend and isinstance(previous_best, float):
                self.best_loss_ = min([previous_best, *new])
            else:
                self.best_loss_ = min(self.loss_curve_) if self.loss_curve_ else math.inf
            self.best_validation_score_ = None
        else:
            self.best_loss_ = None
            self.best_validation_score_ = max(self.validation_scores_)
        self._sessions: dict[str, Any] = {}

    def _shaping_params(self) -> dict[str, Any]:
        """The parameters a trainer is built with: all but those read at each fit."""
        params = self.get_params(deep=False)
        return {k: v for k, v in params.items() if k not in _READ_AT_EACH_FIT}

    def _built_with(self) -> dict[str, Any]:
        """The shaping parameters the current trainer was built with (none known: rebuild)."""
        return dict(getattr(self, "_trainer_params", {}))

    def _check_warm_structure(self) -> None:
        """Raises ValueError when the parameters ask for other weights than the fitted ones."""

    def _remake_trainer(
        self,
        n_samples: int,
        n_outputs: int,
        rng: np.random.RandomState,
        mean_weight: float,
        keep_progress: bool,
    ) -> None:
        """A trainer with the current parameters from the fitted weights (as ``coef_`` holds
        them); ``keep_progress``: with the old one's step counts and optimizer states."""
        self._check_warm_structure()
        progress = self._trainer.training_state()
        weights = initializer_values(self._trained_graph(), list(progress.weights))
        self._curve_before = list(getattr(self, "loss_curve_", []))
        self._trainer = self._make_trainer(
            inputs_to_initializers(self._raw_model, weights), n_samples, n_outputs, rng, mean_weight
        )
        if keep_progress:
            self._trainer.continue_progress(progress)

    def _make_trainer(
        self,
        model: ModelProto,
        n_samples: int,
        n_outputs: int,
        rng: np.random.RandomState,
        mean_weight: float = 1.0,
    ) -> Any:
        score, learning_loss, scale = self._loss(n_outputs)
        self._scale = scale
        self._report_scale = self._reported_scale(n_outputs, scale)
        self._tol_scale = self._tol_columns(n_outputs)
        self._raw_model = model
        model = self._training_graph(model)
        weights = self._trained_weights(model)
        batch = self._batch_size(n_samples)
        l1, l2 = self._penalty(scale, batch * mean_weight)
        penalized = self._penalized_weights(model)
        common = dict(
            weights_to_train=weights,
            max_iter=self.max_iter,
            batch_size=batch,
            learning_rate=self._learning_rate(scale),
            device=self.device,
            threads=self.threads,
            backend=self.backend,
            warm_start=True,
            checkpoint_dir=None if self.checkpoint_dir is None else os.fspath(self.checkpoint_dir),
            checkpoint_every=self.checkpoint_every,
            verbose=int(self.verbose) if self.verbose in (0, 1, 2) else 0,
            shuffle=self.shuffle,
            random_state=int(rng.randint(2**31 - 1)),
            n_iter_no_change=self.n_iter_no_change,
        )
        self._trainer_params = self._shaping_params()
        reduction = "row_mean" if self._rows_weighted else "mean"
        if not self._rows_weighted:
            # scikit-learn's MLPs: each batch's weighted-mean loss counts by its rows in
            # loss_curve_ (and so in tol), not by its total sample weight
            model = copy_model(model)
            set_metadata(model, EPOCH_LOSS_WEIGHTS, "rows")
        if self.training == "full":
            penalty = {w: {"l1": l1, "l2": l2} for w in penalized} if (l1 or l2) else None
            return OrtGradientOptimizer(_loss_graph(model, score, penalty, reduction), **common)
        return OrtGradientForwardBackwardOptimizer(
            model,
            learning_loss=learning_loss,
            weight_name="sample_weight",
            reduction=reduction,
            learning_penalty=ElasticLearningPenalty(l1=l1, l2=l2) if (l1 or l2) else None,
            **common,
        )

    # ---- predict ------------------------------------------------------------------------
    def _trained_graph(self) -> ModelProto:
        """The raw prediction graph (scores or logits) with the trained weights."""
        check_is_fitted(self, "_trainer")
        model: ModelProto = self._trainer.get_trained_onnx()
        return model

    def to_onnx(self, dtype: Any = np.float32) -> ModelProto:
        """A deployable model for any onnxruntime InferenceSession.

        Parameters
        ----------
        dtype : numpy.float32 or numpy.float64, default=numpy.float32
            The float type the model takes and returns; float64 casts the input to float32
            and the float outputs back (it computes in float32, as the training did).

        Returns
        -------
        onnx.ModelProto
            The trained graph: a regressor's outputs its prediction, a classifier's 'label'
            then 'probabilities' (as skl2onnx exports them).
        """
        raw = self._trained_graph()
        if self._is_classifier:
            raw = classifier_head(raw, raw.graph.output[0].name, self.classes_, self._head_kind())
        return with_float_type(raw, dtype)

    def _head_kind(self) -> str:
        """How the decision values become the deployed graph's probabilities (HEAD_KINDS)."""
        return "multilabel" if getattr(self, "_multilabel", False) else "softmax"

    def _run(self, kind: str, X: Any) -> list[np.ndarray]:
        """The graph's outputs on X; float outputs in X's float type (computed in float32),
        as scikit-learn keeps float32 inputs in float32 and returns float64 otherwise."""
        check_is_fitted(self, "_trainer")
        # a sparse X's index arrays checked before scikit-learn's validation converts it (a CSC
        # or COO matrix becomes CSR in native code that trusts them: malformed ones crash)
        check_sparse_structure("X", X)
        given = X
        sparse = is_sparse(X)
        X = validate_data(
            self,
            X,
            reset=False,
            accept_sparse="csr" if self._accepts_sparse else False,
            dtype=(np.float64, np.float32),
            # a sparse X's values are checked once, on their float32 cast (_sparse_float32)
            ensure_all_finite=not sparse,
        )
        dtype = X.dtype
        X = _sparse_float32(self, X) if sparse else _to_float32("X", X, given)
        outputs = self._outputs(kind, X)
        return [o.astype(dtype) if o.dtype == np.float32 else o for o in outputs]

    def _outputs(self, kind: str, X: Any) -> list[np.ndarray]:
        """``kind``'s graph run on the validated float32 X (sparse: densified in chunks)."""
        return _run_dense(self._session(kind, X.shape[0]), X)

    def _session_graph(self, kind: str) -> ModelProto:
        """The graph a session of ``kind`` runs: the deployed one, or the raw trained one."""
        return self.to_onnx() if kind == "deploy" else self._trained_graph()

    def _session(self, kind: str, rows: int) -> Any:
        """The session computing ``kind``'s graph on ``rows`` rows, made at first use: on one
        thread where the work is small (the training steps' rule), so that live estimators do
        not each hold a pool of (cores - 1) idle threads."""
        sessions = self.__dict__.setdefault("_sessions", {})
        if kind not in sessions:
            model = self._session_graph(kind)
            sessions[kind] = _Sessions(model.SerializeToString(), count_weight_values(model), {})
        entry = sessions[kind]
        device = parse_device(self.device)
        threads = cpu_threads(device, rows, entry.weight_values, self.threads)
        if threads not in entry.by_threads:
            entry.by_threads[threads] = inference_session(entry.model, device, threads)
        return entry.by_threads[threads]

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = self._accepts_sparse
        return tags

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state.pop("_sessions", None)
        return state


class OrtRegressorMixin(OrtEstimatorMixin):
    """The regressors' partial_fit and predict."""

    _multi_output = True

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = self._multi_output
        return tags

    @available_if(lambda est: est._check_partial_fit())
    def partial_fit(self: _Estimator, X: Any, y: Any, sample_weight: Any = None) -> _Estimator:
        """One epoch over (X, y), continuing the current weights (from the initial ones on
        the first call).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training samples.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples; None gives each weight 1.

        Returns
        -------
        self
            The updated estimator.
        """
        self._validate_params_once()
        return self._fit(X, y, sample_weight, incremental=True)

    def predict(self, X: Any) -> np.ndarray:
        """The trained graph's prediction.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
            Predictions, in X's float type; the shape of the fitted y.
        """
        (pred,) = self._run("raw", X)
        out: np.ndarray = pred.ravel() if getattr(self, "_y_ndim", 1) == 1 else pred
        return out


class OrtClassifierMixin(OrtEstimatorMixin):
    """The classifiers' partial_fit and predictions from the logits."""

    _is_classifier = True

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # a classifier that fits indicator matrices says so, as scikit-learn's MLPClassifier
        tags.classifier_tags.multi_label = self._supports_multilabel
        return tags

    @available_if(lambda est: est._check_partial_fit())
    def partial_fit(
        self: _Estimator, X: Any, y: Any, classes: Any = None, sample_weight: Any = None
    ) -> _Estimator:
        """One epoch over (X, y), continuing the current weights (from the initial ones on
        the first call).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training samples.
        y : array-like of shape (n_samples,)
            Class labels, all in ``classes``.
        classes : array-like of shape (n_classes,), default=None
            Every label y may hold: required on the first call (the model has one output per
            class), the same set or None later. A classifier of a given model takes that
            model's classes, in any order.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples; None gives each weight 1.

        Returns
        -------
        self
            The updated estimator.
        """
        self._validate_params_once()
        # scikit-learn's rule: the first partial_fit names every class, since the model has one
        # output per class and a later batch may hold a label the first one lacks
        if classes is None and not hasattr(self, "_trainer"):
            raise ValueError(
                "classes must be passed on the first call to partial_fit: every label y may hold"
            )
        return self._fit(X, y, sample_weight, incremental=True, classes=classes)

    def decision_function(self, X: Any) -> np.ndarray:
        """The logits.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
            One logit per sample for two classes (that of ``classes_[1]``), one per class
            otherwise; in X's float type.
        """
        (scores,) = self._run("raw", X)
        out: np.ndarray = scores.ravel() if scores.shape[1] == 1 else scores
        return out

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``.

        The softmax of the logits (the sigmoid of a binary model's one logit), computed in
        float64 so that each row sums to 1 within the rounding of the returned type (scikit-
        learn's ``log_loss`` checks it): X's float type, as scikit-learn's MLPs return (float64
        input: within 1e-15; float32 input: float32, within 1e-7).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Probabilities, in X's float type.
        """
        (scores,) = self._run("raw", X)
        if getattr(self, "_multilabel", False):  # one sigmoid per label
            out: np.ndarray = (0.5 * (1 + np.tanh(scores.astype(np.float64) / 2))).astype(scores.dtype)
            return out
        out = probabilities(scores).astype(scores.dtype, copy=False)
        return out

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Log of :meth:`predict_proba`, as the log-softmax of the logits: finite where a
        probability rounds to 0 (``np.log(predict_proba(X))`` would be -inf there).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Log-probabilities, in X's float type.
        """
        (scores,) = self._run("raw", X)
        if getattr(self, "_multilabel", False):  # log sigmoid = -softplus(-z), finite
            out: np.ndarray = (-np.logaddexp(0.0, -scores.astype(np.float64))).astype(scores.dtype)
            return out
        out = probabilities(scores, log=True).astype(scores.dtype, copy=False)
        return out

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,)
            Labels from ``classes_``.
        """
        if getattr(self, "_multilabel", False):  # the indicator matrix of the labels with p > 0.5
            (scores,) = self._run("raw", X)
            indicators: np.ndarray = (scores > 0).astype(np.int64)
            return indicators
        proba = self.predict_proba(X)
        labels: np.ndarray = self.classes_[np.argmax(proba, axis=1)]
        return labels
