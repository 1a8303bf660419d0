"""Fine-tune a given ONNX graph, or a fitted scikit-learn model, with the scikit-learn API."""

from __future__ import annotations

import warnings
from numbers import Integral, Real
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils import check_array, check_consistent_length
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from ort_train_core import (
    BaseLearningRate,
    LearningRateAdam,
    LearningRateSGD,
    LearningRateSGDNesterov,
    cast_checked,
    load_model,
)
from ort_train_core.extending import check_features, feature_spec
from ort_train_core.graph import default_penalized_weights

from ._base import (
    _COMMON_CONSTRAINTS,
    OrtClassifierMixin,
    OrtEstimatorMixin,
    OrtRegressorMixin,
    _same_classes,
)
from ._convert import INPUT_NAME, TrainableGraph, _rename, check_not_reordered, to_trainable_graph
from ._docs import Entry, fill_doc

#: the parameters and attributes both estimators document alike
_ONNX_MODEL_ENTRIES: dict[str, Entry] = {
    "weights_to_train": (
        "list of str or None",
        "The initializers to train; None: every float initializer the output depends on.",
    ),
    "alpha": (
        "float",
        "An l2 penalty ``alpha * sum(W ** 2)`` on the trained weight matrices (rank >= 2), not on\n"
        "the biases (skl2onnx's ``(1, K)`` intercept rows included).",
    ),
    "solver": ("{'sgd', 'adam'}", "The optimizer: SGD (with ``momentum``) or Adam."),
    "learning_rate_init": ("float", "The learning rate (constant)."),
    "momentum": ("float", "The momentum of 'sgd', in [0, 1); 0 gives plain SGD."),
    "batch_size": ("int", "Rows per step."),
    "weights_": ("dict of str to ndarray", "The trained weights, by initializer name."),
    # in the signature's order, after loss
    "training_parameters": (
        "%(alpha)s\n%(solver)s\n%(learning_rate_init)s\n%(momentum)s\n%(nesterovs_momentum)s\n"
        "%(batch_size)s\n%(max_iter)s\n%(tol)s\n%(n_iter_no_change)s\n%(shuffle)s\n%(random_state)s\n"
        "%(early_stopping)s\n%(validation_fraction)s\n%(warm_start)s\n%(verbose)s\n%(device)s\n"
        "%(training)s\n%(checkpoint_dir)s\n%(checkpoint_every)s\n%(threads)s\n%(backend)s"
    ),
}


class _OnnxModelBase(OrtEstimatorMixin):
    """The model's own weights are the starting point: fit continues from them."""

    _parameter_constraints: dict[str, Any] = {
        **_COMMON_CONSTRAINTS,
        "model": "no_validation",
        "weights_to_train": [list, tuple, None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions({"sgd", "adam"})],
        "learning_rate_init": [Interval(Real, 0, None, closed="neither")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
        "nesterovs_momentum": ["boolean"],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
    }
    _expected_kind = "regressor"

    def _graph(self, X: Any, y: Any) -> TrainableGraph:
        if self.model is None:
            raise ValueError(
                f"{type(self).__name__} needs model=: an ONNX model, its bytes or path, "
                "or a scikit-learn estimator"
            )
        model = self.model
        if isinstance(model, BaseEstimator) and not _is_fitted(model):
            # an unfitted estimator gives the architecture: scikit-learn fits it first, then
            # onnxruntime trains from there
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model = clone(model).fit(X, y)
        graph = to_trainable_graph(model, _first_rows(X, 1), **self._reading())
        if graph.kind != self._expected_kind:
            raise ValueError(
                f"{type(self).__name__} trains a {self._expected_kind}, but the model is a {graph.kind}; "
                f"use OnnxModel{graph.kind.capitalize()}"
            )
        return graph

    def _reading(self) -> dict[str, Any]:
        """How :func:`to_trainable_graph` reads the model (the classifier reads logits)."""
        return {}

    def _initial_graph(self, n_features: int, n_outputs: int, rng: np.random.RandomState) -> ModelProto:
        return self._graph_.model

    def _trained_weights(self, model: ModelProto) -> list[str]:
        return (
            list(self.weights_to_train) if self.weights_to_train is not None else list(self._graph_.weights)
        )

    def _penalized_weights(self, model: ModelProto) -> list[str]:
        return default_penalized_weights(model, self._trained_weights(model))

    def _penalty(self, scale: float, batch_weight: float) -> tuple[float, float]:
        return 0.0, float(self.alpha)

    def _batch_size(self, n_samples: int) -> int:
        return min(int(self.batch_size), n_samples)

    def _learning_rate(self, scale: float) -> BaseLearningRate:
        if self.solver == "adam":
            return LearningRateAdam(eta0=self.learning_rate_init)
        if self.momentum > 0:
            return LearningRateSGDNesterov(
                eta0=self.learning_rate_init,
                learning_rate="constant",
                momentum=self.momentum,
                nesterov=self.nesterovs_momentum,
            )
        return LearningRateSGD(eta0=self.learning_rate_init, learning_rate="constant")

    def _store_weights(self, weights: dict[str, np.ndarray]) -> None:
        self.weights_ = weights

    def to_onnx(self, dtype: Any = np.float32) -> ModelProto:
        """A deployable model for any onnxruntime InferenceSession, its input named as the
        given model's (``x`` stays ``x``).

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
        model = super().to_onnx(dtype)
        graph = getattr(self, "_graph_", None)
        if graph is None or getattr(self, "_inputs_", None) is not None:  # inputs kept as given
            return model
        # the trainable graph calls a 2-D input INPUT_NAME, as the estimators feed it
        return _rename(model, INPUT_NAME, graph.input_name)

    def _start_fit(self, X: Any, y: Any) -> None:
        """Converts the model (resume too: the graph the checkpoint's weights belong to).

        A model whose inputs are not one float32 [N, n_features] matrix (images, sequences,
        int64 ids, several inputs, as torch exports them) takes X as the core trainers do: an
        array of the input's rank, a dict by input name or a tuple in input order."""
        self._inputs_ = None
        if _takes_general_inputs(self.model, X):
            if isinstance(self.model, BaseEstimator):
                raise ValueError(
                    f"a scikit-learn model takes a 2-D X (n_samples, n_features), got {_describe(X)}"
                )
            self._graph_ = self._graph(X, y)
            graph = self._graph_.model
            inits = {i.name for i in graph.graph.initializer}
            self._inputs_ = tuple(feature_spec(vi) for vi in graph.graph.input if vi.name not in inits)
            return
        Xc, yc = validate_data(self, X, y, dtype=(np.float32, np.float64), multi_output=True)
        self._graph_ = self._graph(Xc.astype(np.float32), yc)

    def _fit_arrays(
        self, X: Any, y: Any, sample_weight: Any, first: bool, classes: Any
    ) -> tuple[Any, np.ndarray, np.ndarray | None, int]:
        specs = getattr(self, "_inputs_", None)
        if specs is None:
            return super()._fit_arrays(X, y, sample_weight, first, classes)
        # the graph's own inputs: checked and cast as the core trainers check them
        features = tuple(check_features(specs, X))
        n = features[0].shape[0]
        y = check_array(y, ensure_2d=False, dtype=None, input_name="y")
        check_consistent_length(features[0], y)
        y_enc, n_outputs = self._prepare_targets(y, first, classes)
        sw = None
        if sample_weight is not None:
            sw = _check_sample_weight(sample_weight, features[0], dtype=np.float64, ensure_non_negative=True)
            sw = cast_checked("sample_weight", sw, np.dtype(np.float32))
        if n == 0:
            raise ValueError("X has no rows")
        return (features if len(features) > 1 else features[0]), y_enc, sw, n_outputs

    def _run(self, kind: str, X: Any) -> list[np.ndarray]:
        specs = getattr(self, "_inputs_", None)
        if specs is None:
            return super()._run(kind, X)
        check_is_fitted(self, "_trainer")
        arrays = check_features(specs, X)
        feeds = {spec.name: a for spec, a in zip(specs, arrays)}
        outputs: list[np.ndarray] = self._session(kind, arrays[0].shape[0]).run(None, feeds)
        return outputs


@fill_doc(_ONNX_MODEL_ENTRIES)
class OnnxModelRegressor(OrtRegressorMixin, RegressorMixin, _OnnxModelBase):
    """Trains (fine-tunes) a regression graph: an ONNX model, its bytes or path, or a fitted
    scikit-learn regressor (converted with skl2onnx into a trainable graph).

    A ``y`` of shape (n_samples, 1) fits a graph whose output is [N, 1] as given, without
    scikit-learn's ``DataConversionWarning``, and ``predict`` then returns that shape (as
    ``LinearRegression`` does for a column ``y``).

    Parameters
    ----------
    model : onnx.ModelProto, bytes, str, path or estimator, default=None
        The model to train, from its weights: an ONNX graph with one float input and one float
        output (or its bytes, or the path of a ``.onnx`` file), or a scikit-learn
        LinearRegression, Ridge, SGDRegressor or MLPRegressor, fitted or not (scikit-learn fits
        it first), possibly the last step of a Pipeline of StandardScaler steps.
    %(weights_to_train)s
    loss : {'squared_error', 'absolute_error', 'elastic'}, default='squared_error'
        The loss of each sample, over the outputs of d = p - y: ``sum(d ** 2)``,
        ``sum(|d|)`` or ``sum(0.5 * |d| + 0.5 * d ** 2)``. ``loss_curve_``, ``loss_``,
        ``best_loss_`` and ``tol`` read 'squared_error' on scikit-learn's ``MLPRegressor``
        scale, half the mean of ``d ** 2`` over rows and outputs; the other losses (which
        scikit-learn's MLP lacks) as written here, averaged over the rows.
    %(training_parameters)s

    Attributes
    ----------
    %(weights_)s
    %(fit_attributes)s
    """

    _parameter_constraints = {
        **_OnnxModelBase._parameter_constraints,
        "loss": [StrOptions({"squared_error", "absolute_error", "elastic"})],
    }

    def __init__(
        self,
        model: Any = None,
        *,
        weights_to_train: Any = None,
        loss: str = "squared_error",
        alpha: float = 0.0,
        solver: str = "sgd",
        learning_rate_init: float = 0.001,
        momentum: float = 0.0,
        nesterovs_momentum: bool = True,
        batch_size: int = 32,
        max_iter: int = 10,
        tol: float | None = None,
        n_iter_no_change: int = 5,
        shuffle: bool = True,
        random_state: Any = None,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        warm_start: bool = False,
        verbose: int = 0,
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.model = model
        self.weights_to_train = weights_to_train
        self.loss = loss
        self.alpha = alpha
        self.solver = solver
        self.learning_rate_init = learning_rate_init
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.shuffle = shuffle
        self.random_state = random_state
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.warm_start = warm_start
        self.verbose = verbose
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        partial = {"squared_error": "square_error"}.get(self.loss, self.loss)
        return self.loss, partial, 1.0

    def _reported_scale(self, n_outputs: int, scale: float) -> float:
        # scikit-learn's MLPRegressor reports mean((y - p) ** 2) / 2 over rows and outputs; the
        # objective trained here sums d ** 2 over the outputs
        return 2.0 * n_outputs if self.loss == "squared_error" else scale

    def _predicts_column(self) -> bool:
        # y in the graph's own [N, 1] shape is what the graph predicts: no DataConversionWarning
        graph = getattr(self, "_graph_", None)
        return graph is not None and graph.output_rank == 2 and _is_column(graph.model, graph.output_name)


@fill_doc(_ONNX_MODEL_ENTRIES)
class OnnxModelClassifier(OrtClassifierMixin, ClassifierMixin, _OnnxModelBase):
    """Trains (fine-tunes) a classifier's logits with the cross-entropy: an ONNX model cut at
    its logits, or a fitted scikit-learn classifier (converted with skl2onnx).

    Parameters
    ----------
    model : onnx.ModelProto, bytes, str, path or estimator, default=None
        The model to train, from its weights, cut at its logits: an ONNX graph whose single
        output is the logits (a network exported before its softmax, as torch classifiers are),
        an ONNX classifier exported by skl2onnx (cut at its logits here), or their bytes or the
        path of a ``.onnx`` file; or a scikit-learn LogisticRegression,
        SGDClassifier(loss='log_loss') or MLPClassifier, fitted or not (scikit-learn fits it
        first), possibly the last step of a Pipeline of StandardScaler steps. Logits of shape
        [N, K] (K >= 2) give K classes: the softmax cross-entropy, ``predict_proba`` is their
        softmax and ``predict`` their argmax; one logit column ([N, 1] or [N]) is a binary
        model whose logit is that of the second class (the sigmoid cross-entropy, as torch's
        ``BCEWithLogitsLoss``). ``to_onnx()`` appends the softmax (or sigmoid) and the label.
    classes : array-like of shape (n_classes,), default=None
        The labels of the logit columns, in order (two for one binary logit column). None: the
        model's own labels (a skl2onnx classifier lists them), else 0 to K - 1. ``y`` may hold
        only these labels. New names for a model's labels are taken; its own labels in another
        order are refused (they would swap its predictions), as is a fitted estimator's
        ``classes_`` in another order.
    %(weights_to_train)s
    loss : {'cross_entropy'}, default='cross_entropy'
        The cross-entropy of the logits.
    %(training_parameters)s

    Attributes
    ----------
    %(weights_)s
    classes_ : ndarray of shape (n_classes,)
        The model's class labels, in the order of its logit columns.
    %(fit_attributes)s
    """

    _expected_kind = "classifier"
    _parameter_constraints = {
        **_OnnxModelBase._parameter_constraints,
        "classes": ["array-like", None],
        "loss": [StrOptions({"cross_entropy"})],
    }

    def __init__(
        self,
        model: Any = None,
        *,
        classes: Any = None,
        weights_to_train: Any = None,
        loss: str = "cross_entropy",
        alpha: float = 0.0,
        solver: str = "sgd",
        learning_rate_init: float = 0.001,
        momentum: float = 0.0,
        nesterovs_momentum: bool = True,
        batch_size: int = 32,
        max_iter: int = 10,
        tol: float | None = None,
        n_iter_no_change: int = 5,
        shuffle: bool = True,
        random_state: Any = None,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        warm_start: bool = False,
        verbose: int = 0,
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.model = model
        self.classes = classes
        self.weights_to_train = weights_to_train
        self.loss = loss
        self.alpha = alpha
        self.solver = solver
        self.learning_rate_init = learning_rate_init
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.shuffle = shuffle
        self.random_state = random_state
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.warm_start = warm_start
        self.verbose = verbose
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        return "cross_entropy", "cross_entropy", 1.0

    def _reading(self) -> dict[str, Any]:
        # a graph whose single output is float is read as logits; an estimator has its classes
        if isinstance(self.model, BaseEstimator):
            return {"kind": "classifier"}
        return {"kind": "classifier", "classes": self.classes}

    def _initial_classes(self, y: np.ndarray, classes: Any) -> np.ndarray:
        """The model's labels, in the order of its logit columns; ``classes`` (of partial_fit,
        or the parameter) must name them."""
        own = self._graph_.classes
        assert own is not None  # a classifier's graph always lists its classes
        for given in (classes, self.classes):
            if given is not None and not _same_classes(given, own):
                raise ValueError(
                    f"classes={np.asarray(given).tolist()!r} are not the classes of the model "
                    f"({own.tolist()!r}, one per logit column): pass those, or train a model on "
                    "these classes"
                )
        # the parameter names the logit columns in order (partial_fit's, as scikit-learn's, is a
        # set): a fitted estimator's columns are its classes_, in their order
        if self.classes is not None:
            check_not_reordered(self.classes, own)
        return own


def _is_column(model: ModelProto, output: str) -> bool:
    """Whether the graph's output is declared [N, 1]."""
    for value in model.graph.output:
        if value.name == output:
            dims = value.type.tensor_type.shape.dim
            return len(dims) == 2 and dims[1].HasField("dim_value") and dims[1].dim_value == 1
    return False


def _is_fitted(estimator: Any) -> bool:
    try:
        check_is_fitted(estimator)
    except NotFittedError:
        return False
    return True


def _takes_general_inputs(model: Any, X: Any) -> bool:
    """Whether X (a dict, a tuple of arrays, an array not 2-D) or the model (an ONNX graph
    whose inputs are not one float32 [N, n_features] matrix) asks for the core trainers'
    inputs rather than scikit-learn's 2-D X."""
    if _is_sparse(X):  # scikit-learn's checks refuse it with their message (a DOK matrix is a dict)
        return False
    if isinstance(X, dict) or (isinstance(X, tuple) and all(hasattr(a, "shape") for a in X)):
        return True
    if hasattr(X, "ndim") and X.ndim != 2 and not hasattr(X, "columns"):
        return True
    if isinstance(model, BaseEstimator) or model is None:
        return False
    proto = model if isinstance(model, ModelProto) else load_model(model)
    inits = {i.name for i in proto.graph.initializer}
    inputs = [vi for vi in proto.graph.input if vi.name not in inits]
    if len(inputs) != 1:
        return True
    tt = inputs[0].type.tensor_type
    return not (tt.elem_type == TensorProto.FLOAT and len(tt.shape.dim) == 2)


def _is_sparse(X: Any) -> bool:
    return type(X).__module__.startswith("scipy.sparse")


def _first_rows(X: Any, n: int) -> Any:
    """The first n rows of X: an array, a dict of arrays or a tuple of arrays."""
    if isinstance(X, dict):
        return {k: v[:n] for k, v in X.items()}
    if isinstance(X, tuple):
        return tuple(a[:n] for a in X)
    return X[:n]


def _describe(X: Any) -> str:
    if isinstance(X, dict):
        return f"a dict of {sorted(X)}"
    if isinstance(X, tuple):
        return f"a tuple of {len(X)} arrays"
    return f"shape {getattr(X, 'shape', '?')}"
