"""Multi-layer perceptrons: scikit-learn's MLPRegressor / MLPClassifier parameters, trained by
onnxruntime."""

from __future__ import annotations

import itertools
import warnings
from numbers import Integral, Real
from typing import Any

import numpy as np
from onnx import ModelProto, helper
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from ort_train_core import (
    BaseLearningRate,
    DerivativeOptions,
    LearningRateAdam,
    LearningRateSGD,
    LearningRateSGDNesterov,
    add_loss_output,
    onnx_derivative,
    parse_device,
)
from ort_train_core.extending import dense_rows, is_sparse
from ort_train_core.graph import set_batch_dimension

from ._base import (
    _COMMON_CONSTRAINTS,
    OrtClassifierMixin,
    OrtEstimatorMixin,
    OrtRegressorMixin,
    inference_session,
)
from ._docs import Entry, fill_doc
from ._graphs import dense_graph, layer_names

#: the parameters and attributes both MLPs document alike
_MLP_ENTRIES: dict[str, Entry] = {
    "hidden_layer_sizes": ("array-like of int or int", "The width of each hidden layer."),
    "activation": (
        "{'identity', 'logistic', 'tanh', 'relu'}",
        "The activation of the hidden layers; the initial weights are scikit-learn's Glorot\n"
        "uniform draws for it.",
    ),
    "solver": (
        "{'sgd', 'adam', 'lbfgs'}",
        "The optimizer. 'lbfgs': scipy's L-BFGS-B over the whole training set, the loss and its\n"
        "gradient computed by onnxruntime from the graph (memory: the whole set's activations);\n"
        "``max_iter`` bounds its iterations, ``max_fun`` its loss evaluations, ``tol`` is its\n"
        "gradient tolerance; no batches, early stopping or checkpoints, as scikit-learn's.",
    ),
    "max_fun": ("int", "'lbfgs' only: the most loss and gradient evaluations."),
    "alpha": ("float", "The strength of the l2 penalty on the coefficient matrices, as scikit-learn's."),
    "batch_size": ("int or 'auto'", "Rows per step; 'auto' is ``min(200, n_samples)``."),
    "learning_rate": (
        "{'constant', 'invscaling', 'adaptive'}",
        "The step size of 'sgd' during an epoch, scikit-learn's: ``learning_rate_init``;\n"
        "``learning_rate_init / (t_ + 1) ** power_t`` with ``t_`` the samples seen before the\n"
        "epoch; or 'adaptive': ``learning_rate_init`` divided by 5 each time the stopping rule\n"
        "would stop the fit, which stops once the rate is <= 1e-6.",
    ),
    "learning_rate_init": ("float", "The initial learning rate, for scikit-learn's loss scale."),
    "momentum": ("float", "The momentum of 'sgd', in [0, 1]; 0 gives plain SGD."),
    "beta_1": ("float", "Adam's decay of the first moment, in [0, 1)."),
    "beta_2": ("float", "Adam's decay of the second moment, in [0, 1)."),
    "epsilon": ("float", "Adam's epsilon, for scikit-learn's loss scale."),
    "coefs_": ("list of ndarray", "The coefficient matrix of each layer, of shape (fan_in, fan_out)."),
    "intercepts_": ("list of ndarray", "The intercept vector of each layer."),
    "n_layers_": ("int", "Number of layers, input and output included."),
    "n_outputs_": ("int", "Number of outputs."),
    "mlp_attributes": "%(coefs_)s\n%(intercepts_)s\n%(n_layers_)s\n%(n_outputs_)s",
    # in the signature's order (after the regressor's loss)
    "mlp_parameters": (
        "%(hidden_layer_sizes)s\n%(activation)s\n%(solver)s\n%(alpha)s\n%(batch_size)s\n%(learning_rate)s\n"
        "%(learning_rate_init)s\n%(power_t)s\n%(max_iter)s\n%(shuffle)s\n%(random_state)s\n%(tol)s\n"
        "%(verbose)s\n%(warm_start)s\n%(momentum)s\n%(nesterovs_momentum)s\n%(early_stopping)s\n"
        "%(validation_fraction)s\n%(beta_1)s\n%(beta_2)s\n%(epsilon)s\n%(n_iter_no_change)s\n%(max_fun)s\n%(device)s\n"
        "%(training)s\n%(checkpoint_dir)s\n%(checkpoint_every)s\n%(threads)s\n%(backend)s"
    ),
}


class _OrtMLPBase(OrtEstimatorMixin):
    # scikit-learn's SGD and MLP estimators take sparse X: batches densified one at a time
    _accepts_sparse = True
    _parameter_constraints: dict[str, list[Any]] = {
        **_COMMON_CONSTRAINTS,
        "hidden_layer_sizes": ["array-like", Interval(Integral, 1, None, closed="left")],
        "activation": [StrOptions({"identity", "logistic", "tanh", "relu"})],
        "solver": [StrOptions({"sgd", "adam", "lbfgs"})],
        "max_fun": [Interval(Integral, 1, None, closed="left")],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "batch_size": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "learning_rate": [StrOptions({"constant", "invscaling", "adaptive"})],
        "learning_rate_init": [Interval(Real, 0, None, closed="neither")],
        "power_t": [Interval(Real, 0, None, closed="left")],
        "momentum": [Interval(Real, 0, 1, closed="both")],
        "nesterovs_momentum": ["boolean"],
        "beta_1": [Interval(Real, 0, 1, closed="left")],
        "beta_2": [Interval(Real, 0, 1, closed="left")],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
    }

    def _layer_sizes(self, n_features: int, n_outputs: int) -> list[int]:
        hidden = self.hidden_layer_sizes
        hidden = [hidden] if np.isscalar(hidden) else list(hidden)
        if any(int(h) < 1 for h in hidden):
            raise ValueError(f"hidden_layer_sizes must be > 0, got {self.hidden_layer_sizes}")
        return [n_features, *(int(h) for h in hidden), n_outputs]

    def _initial_graph(self, n_features: int, n_outputs: int, rng: np.random.RandomState) -> ModelProto:
        """Glorot uniform, as scikit-learn initialises its MLPs."""
        sizes = self._layer_sizes(n_features, n_outputs)
        factor = 2.0 if self.activation == "logistic" else 6.0
        coefs, intercepts = [], []
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = np.sqrt(factor / (fan_in + fan_out))
            coefs.append(rng.uniform(-bound, bound, (fan_in, fan_out)))
            intercepts.append(rng.uniform(-bound, bound, fan_out))
        return dense_graph(coefs, intercepts, self.activation)

    def _check_warm_structure(self) -> None:
        fitted = [self.coefs_[0].shape[0], *(c.shape[1] for c in self.coefs_)]
        wanted = self._layer_sizes(fitted[0], fitted[-1])
        if wanted != fitted:
            raise ValueError(
                f"warm_start=True and partial_fit continue from the fitted weights, whose hidden "
                f"layers are {tuple(fitted[1:-1])}, not hidden_layer_sizes={self.hidden_layer_sizes!r}: "
                "set warm_start=False (or fit a new estimator) to start from new weights"
            )

    def _n_layers(self) -> int:
        return len(self._layer_sizes(1, 1)) - 1

    def _trained_weights(self, model: ModelProto) -> list[str]:
        return [name for pair in layer_names(self._n_layers()) for name in pair]

    def _penalized_weights(self, model: ModelProto) -> list[str]:
        return [coef for coef, _ in layer_names(self._n_layers())]

    def _penalty(self, scale: float, batch_weight: float) -> tuple[float, float]:
        # scikit-learn adds alpha / 2 * ||W||^2 / (the batch's total sample weight) to each
        # batch's loss; ours is fixed: the nominal batch size times the mean sample weight
        return 0.0, scale * self.alpha / (2.0 * batch_weight)

    def _batch_size(self, n_samples: int) -> int:
        if self.batch_size == "auto":
            return min(200, n_samples)
        if int(self.batch_size) > n_samples and self.solver != "lbfgs":
            warnings.warn(
                "Got `batch_size` less than 1 or larger than sample size. It is going to be clipped",
                UserWarning,
                stacklevel=5,
            )
        return min(int(self.batch_size), n_samples)

    def _learning_rate(self, scale: float) -> BaseLearningRate:
        if self.solver == "adam":
            # Adam's step does not grow with the gradient's scale; only epsilon does
            return LearningRateAdam(
                eta0=self.learning_rate_init,
                beta1=self.beta_1,
                beta2=self.beta_2,
                epsilon=self.epsilon * scale,
            )
        eta0 = self.learning_rate_init / scale
        # scikit-learn's MLP sets the rate at each epoch's start from the samples seen, t_
        if self.momentum > 0:
            return LearningRateSGDNesterov(
                eta0=eta0,
                power_t=self.power_t,
                learning_rate=self.learning_rate,
                momentum=self.momentum,
                nesterov=self.nesterovs_momentum,
                per_sample="epoch",
            )
        return LearningRateSGD(
            eta0=eta0, power_t=self.power_t, learning_rate=self.learning_rate, per_sample="epoch"
        )

    def _full_batch(self) -> bool:
        return bool(self.solver == "lbfgs")

    def _fit_full_batch(
        self, trainer: Any, X: Any, y_enc: np.ndarray, sw: np.ndarray | None, n_outputs: int
    ) -> None:
        """scikit-learn's 'lbfgs': scipy's L-BFGS-B on the mean loss over the whole set plus
        ``alpha / 2 ||W||^2 / sum(sample_weight)``, in scikit-learn's scale; onnxruntime
        computes the loss and its gradient (the gradient graph of the loss graph, weights as
        inputs). The weights start from the trainer's (Glorot, or the current ones with
        ``warm_start``) and end in it."""
        from scipy.optimize import minimize

        objective = self._lbfgs_objective(trainer.get_state(), X, y_enc, sw, n_outputs)
        result = minimize(
            objective.loss_and_gradient,
            objective.x0,
            method="L-BFGS-B",
            jac=True,
            options={
                "maxfun": int(self.max_fun),
                "maxiter": int(self.max_iter),
                "gtol": 0.0 if self.tol is None else float(self.tol),
            },
        )
        if not result.success:
            warnings.warn(
                f"{type(self).__name__}: lbfgs failed to converge after {result.nit} iteration(s) "
                f"({result.message}); increase max_iter or max_fun, or scale the data",
                ConvergenceWarning,
                stacklevel=4,
            )
        if not np.isfinite(result.x).all():
            raise ValueError(
                "Solver produced non-finite parameter weights. The input data may contain large "
                "values and need to be preprocessed."
            )
        trainer.set_state(objective.unpack(result.x))
        self._store_weights(trainer.get_state())
        self.n_iter_ = min(int(result.nit), int(self.max_iter))
        self.loss_ = float(result.fun) if objective.per_output == 1 else objective.reported_loss(result.x)
        self._sessions = {}

    def _lbfgs_objective(
        self, state: dict[str, np.ndarray], X: Any, y_enc: np.ndarray, sw: np.ndarray | None, n_outputs: int
    ) -> _FlatObjective:
        """The whole set's loss and gradient as functions of the flat weight vector."""
        model = self._raw_model
        score, _, scale = self._loss(n_outputs)
        names = self._trained_weights(model)
        n = int(X.shape[0])
        total_weight = float(n if sw is None else np.sum(sw, dtype=np.float64))
        _, l2 = self._penalty(scale, total_weight)
        penalty = {w: {"l2": l2} for w in self._penalized_weights(model)} if l2 else None
        loss_model = add_loss_output(
            model, score, weight_name="sample_weight", penalty=penalty, reduction="mean"
        )
        data_inputs = {i.name for i in model.graph.input}
        labels = [i for i in loss_model.graph.input if i.name not in data_inputs and i.name not in names]
        # the whole set is one batch: its size fixed (the onnx backend differentiates static shapes)
        loss_model = set_batch_dimension(loss_model, [*data_inputs, *(i.name for i in labels)], n)
        grad_model = onnx_derivative(
            loss_model,
            weights=names,
            inputs=[],
            options=DerivativeOptions.Loss,
            loss="loss",
            label=[i.name for i in labels],
            backend=self.backend,
        )
        # threads=None: onnxruntime's default pool, as before the setting
        sess = inference_session(grad_model.SerializeToString(), parse_device(self.device), self.threads)
        feeds: dict[str, Any] = {model.graph.input[0].name: dense_rows(X, slice(None)) if is_sparse(X) else X}
        for vi in labels:
            dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            if vi.name == "sample_weight":
                feeds[vi.name] = np.ones(n, dtype=dtype) if sw is None else sw.astype(dtype)
                continue
            rank = len(vi.type.tensor_type.shape.dim)
            y = y_enc.reshape(n, -1) if rank == 2 else y_enc.reshape(n)
            feeds[vi.name] = y.astype(dtype)
        penalized = [names.index(w) for w in self._penalized_weights(model)] if l2 else []
        return _FlatObjective(
            sess, feeds, {w: state[w] for w in names}, scale, self._report_scale / scale, l2, penalized
        )

    def _store_weights(self, weights: dict[str, np.ndarray]) -> None:
        names = layer_names(self._n_layers())
        dtype = self._fitted_dtype()
        self.coefs_ = [weights[c].astype(dtype) for c, _ in names]
        self.intercepts_ = [weights[b].astype(dtype).reshape(-1) for _, b in names]
        self.n_layers_ = len(self.coefs_) + 1
        self.n_outputs_ = self.coefs_[-1].shape[1]
        if not self._is_classifier:
            self.out_activation_ = "identity"
        else:
            multilabel = getattr(self, "_multilabel", False)
            self.out_activation_ = "logistic" if self.n_outputs_ == 1 or multilabel else "softmax"


class _FlatObjective:
    """L-BFGS's view of a loss graph's gradient session: the loss and gradient of the flat
    weight vector, in scikit-learn's scale.

    scikit-learn's gradient is that of the loss summed over the outputs, its reported value the
    mean over rows and outputs plus the penalty: the same for one output. For several
    (``per_output`` != 1), the optimiser gets the objective of the gradient (their pair is
    inconsistent, and the line search stops early on it in float32) and ``loss_`` is reported
    in scikit-learn's scale (:meth:`reported_loss`)."""

    def __init__(
        self,
        sess: Any,
        feeds: dict[str, Any],
        start: dict[str, np.ndarray],
        scale: float,
        per_output: float,
        l2: float,
        penalized: list[int],
    ) -> None:
        self.sess, self.feeds, self.names = sess, feeds, list(start)
        self.shapes = [start[w].shape for w in self.names]
        self.bounds = np.cumsum([int(np.prod(shape)) for shape in self.shapes])[:-1]
        self.outputs = ["loss", *(f"{w}_grad" for w in self.names)]
        self.scale, self.per_output, self.l2, self.penalized = scale, per_output, l2, penalized
        self.x0 = np.concatenate([np.asarray(start[w], dtype=np.float64).ravel() for w in self.names])

    def unpack(self, x: np.ndarray) -> dict[str, np.ndarray]:
        parts = np.split(x, self.bounds)
        return {w: p.reshape(shape).astype(np.float32) for w, p, shape in zip(self.names, parts, self.shapes)}

    def loss_and_gradient(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        loss, *grads = self.sess.run(self.outputs, {**self.feeds, **self.unpack(x)})
        gradient = np.concatenate([np.asarray(g, dtype=np.float64).ravel() for g in grads])
        return float(loss) / self.scale, gradient / self.scale

    def reported_loss(self, x: np.ndarray) -> float:
        loss = float(self.sess.run(["loss"], {**self.feeds, **self.unpack(x)})[0])
        parts = np.split(x, self.bounds)
        pen = self.l2 * sum(float(np.sum(np.square(parts[k], dtype=np.float64))) for k in self.penalized)
        return (loss - pen) / (self.scale * self.per_output) + pen / self.scale


@fill_doc(_MLP_ENTRIES)
class OrtMLPRegressor(OrtRegressorMixin, RegressorMixin, _OrtMLPBase):
    """An MLP regressor (identity output, squared error) trained by onnxruntime.

    Takes the parameters of scikit-learn's ``MLPRegressor`` and sets its fitted attributes.

    Parameters
    ----------
    loss : {'squared_error'}, default='squared_error'
        The loss: ``(y - p)^2 / 2`` summed over the outputs.
    %(mlp_parameters)s

    Attributes
    ----------
    %(mlp_attributes)s
    %(fit_attributes)s
    out_activation_ : str
        'identity'.
    """

    _parameter_constraints = {**_OrtMLPBase._parameter_constraints, "loss": [StrOptions({"squared_error"})]}

    def __init__(
        self,
        loss: str = "squared_error",
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        solver: str = "adam",
        alpha: float = 0.0001,
        batch_size: Any = "auto",
        learning_rate: str = "constant",
        learning_rate_init: float = 0.001,
        power_t: float = 0.5,
        max_iter: int = 200,
        shuffle: bool = True,
        random_state: Any = None,
        tol: float | None = 1e-4,
        verbose: int = 0,
        warm_start: bool = False,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        n_iter_no_change: int = 10,
        max_fun: int = 15000,
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.loss = loss
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.max_fun = max_fun
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        # scikit-learn backpropagates (p - y) per output: the gradient of sum_k (p - y)^2 / 2
        return "squared_error", "square_error", 2.0

    def _reported_scale(self, n_outputs: int, scale: float) -> float:
        # ...but reports mean((y - p)^2) / 2 over rows and outputs. (Its reported penalty is not
        # divided by n_outputs, ours is: loss_curve_ differs there when n_outputs > 1.)
        return scale * n_outputs


@fill_doc(_MLP_ENTRIES)
class OrtMLPClassifier(OrtClassifierMixin, ClassifierMixin, _OrtMLPBase):
    """An MLP classifier (one logit + sigmoid for two classes, softmax for more) trained by
    onnxruntime on the cross-entropy of its logits. Multilabel targets (an indicator matrix
    ``y`` of shape (n_samples, n_labels)) train one logit per label with the binary
    cross-entropy of each; ``predict`` then returns the indicator matrix of ``p > 0.5`` and
    ``predict_proba`` the probability of each label, as scikit-learn's.

    Takes the parameters of scikit-learn's ``MLPClassifier`` and sets its fitted attributes.

    Parameters
    ----------
    %(mlp_parameters)s

    Attributes
    ----------
    %(classes_)s
    %(mlp_attributes)s
    %(fit_attributes)s
    out_activation_ : str
        'logistic' for two classes and multilabel targets, 'softmax' for more.
    """

    # scikit-learn's MLPClassifier takes multilabel indicator matrices
    _multi_output = True
    _supports_multilabel = True

    def __init__(
        self,
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        solver: str = "adam",
        alpha: float = 0.0001,
        batch_size: Any = "auto",
        learning_rate: str = "constant",
        learning_rate_init: float = 0.001,
        power_t: float = 0.5,
        max_iter: int = 200,
        shuffle: bool = True,
        random_state: Any = None,
        tol: float | None = 1e-4,
        verbose: int = 0,
        warm_start: bool = False,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        n_iter_no_change: int = 10,
        max_fun: int = 15000,
        device: str = "cpu",
        training: str = "full",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.max_fun = max_fun
        self.device = device
        self.training = training
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.threads = threads
        self.backend = backend

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        if getattr(self, "_multilabel", False):  # an indicator matrix: one binary loss per label
            return "binary_cross_entropy", "binary_cross_entropy", 1.0
        return "cross_entropy", "cross_entropy", 1.0
