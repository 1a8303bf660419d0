"""What both trainers derive from their loss graph: trained weights, input roles, the data
layout, initial state, the prediction graph, and the session that evaluates the loss, held in
one record per model content and graph-shaping parameters (:class:`FitGraphs`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto

from . import _batchnorm as batchnorm
from ._binding import count_input_values, cpu_threads, make_session
from ._cache import (
    MAX_CACHED_MODEL_BYTES,
    LRUCache,
    keeps_values,
    model_digest,
    with_values,
)
from ._data import DataSpec, check_fit_arrays, feature_spec
from ._exported import warn_exported_graph
from ._fit_loop import BaseOrtTrainer
from ._io import _check_tensor
from ._runtime import Device
from .checkpoint import TrainingState, model_fingerprint
from .graph import (
    check_weights,
    default_weights_to_train,
    float_initializers,
    get_metadata,
    initializer_values,
    initializers_to_inputs,
    nothing_to_train_error,
    prediction_graph,
    without_penalty,
)
from .learning_rate import BaseLearningRate


@dataclass(frozen=True)
class GraphInputs:
    """The roles of a loss graph's inputs and initializers.

    Attributes
    ----------
    parameters : list of str
        The trained initializers (``weights_to_train``, or the default ones).
    label : str
        The label input.
    sample_weight : str or None
        The sample-weight input, None when the loss takes none.
    features : list of str
        The feature inputs.
    statistics : list of str
        The running statistics of training-mode BatchNormalization nodes: state the steps
        update, not parameters (:mod:`._batchnorm`).
    """

    parameters: list[str]
    label: str
    sample_weight: str | None
    features: list[str]
    statistics: list[str] = field(default_factory=list)

    @property
    def data(self) -> list[str]:
        """The inputs a batch feeds, in the batch store's order: features, label, sample weight."""
        return [*self.features, self.label, *([self.sample_weight] if self.sample_weight else [])]


MAX_CACHED_FIT_GRAPHS = 16


def validation_rows(validation: Sequence[Any]) -> int:
    """The rows of checked validation arrays (features first; dense or sparse)."""
    return int(validation[0].shape[0])


#: metadata key of a loss graph: how the epoch's loss averages its batch losses, by their total
#: sample weight (absent, the default) or by their row count ('rows')
EPOCH_LOSS_WEIGHTS = "epoch_loss_weights"


@dataclass
class FitGraphs:
    """A trainer's graphs for one model content and one set of graph-shaping parameters, built
    once and reused by every fit with the same ones. Trainers add their step graphs (by device,
    batch size, learning rate) in subclasses.

    Attributes
    ----------
    params : tuple
        The graph-shaping parameters it was built for.
    digest : bytes
        sha256 of the serialised ``model_onnx`` it was built from.
    loss_model : onnx.ModelProto
        The loss graph (the objective), trained weights as initializers.
    loss_name : str
        Its loss output.
    inputs : GraphInputs
        The roles of its inputs.
    trainable : onnx.ModelProto
        The loss graph with the trained weights as inputs.
    evaluators : dict of (str, int or None) to session
        The loss graph's session per device (the validation loss).
    fixed : bytes or None
        :func:`._cache.model_digest` of the source model without the values of the trained
        weights and running statistics (:attr:`fed`): another model with the same one may reuse
        the record with its own values; None when the build changed those initializers.
    """

    params: tuple[Any, ...]
    digest: bytes
    loss_model: ModelProto
    loss_name: str
    inputs: GraphInputs
    trainable: ModelProto
    evaluators: dict[tuple[str, int | None], Any] = field(default_factory=dict)
    fixed: bytes | None = None

    @property
    def fed(self) -> list[str]:
        """The initializers whose values the steps take as inputs: trained weights, statistics."""
        return [*self.inputs.parameters, *self.inputs.statistics]

    def fits(self, model: ModelProto) -> bool:
        """Whether ``model`` differs from the source only in the values of :attr:`fed` (checked
        as :func:`graph.normalise_model` checks tensors), so that the record serves it."""
        if self.fixed is None or model_digest(model, self.fed) != self.fixed:
            return False
        fed = set(self.fed)
        for tensor in model.graph.initializer:
            if tensor.name in fed:
                _check_tensor(tensor, "the model")
        return True

    def for_trainer(self, model: ModelProto | None = None, digest: bytes | None = None) -> FitGraphs:
        """A copy for one trainer: the graphs (and the properties computed so far) shared,
        the records of its step graphs and sessions (the dict fields) its own and empty. The
        step graphs and sessions themselves come from the process caches. ``model`` (of
        content ``digest``, :meth:`fits`): the copy's graphs hold its initial values."""
        out = copy.copy(self)
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), dict):
                setattr(out, f.name, {})
        if model is not None and digest is not None and digest != self.digest:
            out.digest = digest
            out.loss_model = with_values(self.loss_model, model, self.fed)
            out.__dict__.pop("forward", None)  # the partial loop's: from the prediction graph
            # pruned once per record (self's), each trainer's copy with its own values
            out.__dict__["prediction"] = with_values(self.prediction, model, self.fed)
        return out

    @functools.cached_property
    def prediction(self) -> ModelProto:
        """The prediction graph inside the loss graph, initial weights as initializers."""
        return prediction_graph(self.loss_model, self.loss_name)

    @functools.cached_property
    def stepping(self) -> ModelProto:
        """The loss graph the training steps run: trained weights and running statistics as
        inputs, the updated statistics as outputs (``trainable`` itself without statistics)."""
        stats = self.inputs.statistics
        if not stats:
            return self.trainable
        model = initializers_to_inputs(self.loss_model, [*self.inputs.parameters, *stats])
        return batchnorm.with_updates(model, stats)[0]

    @functools.cached_property
    def evaluating(self) -> ModelProto:
        """The loss graph of the validation loss (and of ``score``): the loss without its
        penalty, trained weights and running statistics as inputs, in inference form as
        torch's eval() (BatchNormalization normalising with the running statistics, Dropout the
        identity), so that it is deterministic."""
        stats = self.inputs.statistics
        model = (
            initializers_to_inputs(self.loss_model, [*self.inputs.parameters, *stats])
            if stats
            else self.trainable
        )
        return batchnorm.inference_form(without_penalty(model, self.loss_name))

    @functools.cached_property
    def data_spec(self) -> DataSpec:
        """What a fit's arrays must be, read from the loss graph's inputs once per record (a
        fit checks its arrays against it: reading it took a third of that check)."""
        model, inputs = self.loss_model, self.inputs
        by_name = {i.name: i for i in model.graph.input}
        label = feature_spec(by_name[inputs.label])
        weight_dtype = np.dtype(np.float32)
        if inputs.sample_weight is not None:
            weight_dtype = feature_spec(by_name[inputs.sample_weight]).dtype
        return DataSpec(
            features=tuple(feature_spec(by_name[n]) for n in inputs.features),
            label_dtype=label.dtype,
            label_tail=tuple(label.dims[1:]) if label.dims else (),
            has_weight=inputs.sample_weight is not None,
            n_classes=get_metadata(model, "n_classes"),
            weight_dtype=weight_dtype,
        )

    @functools.cached_property
    def fingerprint(self) -> str:
        """What a checkpoint must match: :func:`checkpoint.model_fingerprint` of ``trainable``."""
        return model_fingerprint(self.trainable)


#: the graph records built in this process, by trainer type, model structure (the values of its
#: float initializers left out) and graph-shaping parameters: a new trainer over the same
#: architecture (each scikit-learn fit, cross-validation fold or grid-search candidate makes
#: one, from other initial weights) skips building the loss graph (1.7-2.7 ms for an MLP); its
#: step graphs and sessions come from their own process caches
_FIT_GRAPHS: LRUCache[FitGraphs] = LRUCache(MAX_CACHED_FIT_GRAPHS)


class LossGraphTrainer(BaseOrtTrainer):
    """A trainer whose objective is a loss graph: the model itself for the full loop, the model
    with the learning loss and penalty appended for the partial loop (used to evaluate)."""

    #: the record type of the trainer's graphs
    _graphs_type: type[FitGraphs] = FitGraphs
    #: who the exporter-artefact warning names (None: the class; export_training_step sets it)
    _caller: str | None = None

    def _build_loss_model(self) -> tuple[ModelProto, str]:
        """The loss graph and its loss output, from ``model_onnx`` and the parameters."""
        raise NotImplementedError

    def _graph_params(self) -> tuple[Any, ...]:
        """The parameters the graphs depend on besides the model (set_params drops the graphs;
        a loss object changed in place changes its repr). The backend's name is one: the step
        graphs and sessions recorded under them come from that backend, never the other's."""
        weights = None if self.weights_to_train is None else tuple(self.weights_to_train)
        return (weights, *self._input_overrides(), self._backend().name)

    def _batches_weighted_by_sample_weight(self) -> bool:
        # 'row_mean' batch losses are means over rows already: batches weigh by their row count;
        # a graph may also ask for it (EPOCH_LOSS_WEIGHTS 'rows': scikit-learn's MLPs average
        # their weighted-mean batch losses by row count)
        model = self._model()
        # read once per loss graph (two metadata reads: 20 us of each partial_fit call); the
        # graph object itself is kept with the answer, so another graph is never taken for it
        known = self.__dict__.get("_weighted_by")
        if known is not None and known[0] is model:
            return bool(known[1])
        weighted = bool(
            get_metadata(model, "reduction") != "row_mean"
            and get_metadata(model, EPOCH_LOSS_WEIGHTS) != "rows"
        )
        self.__dict__["_weighted_by"] = (model, weighted)
        return weighted

    def _input_overrides(self) -> tuple[str | None, str | None]:
        """Label and sample-weight input names given by the user (None: from metadata)."""
        return None, None

    # ---- scikit-learn's estimator protocol ----------------------------------------------
    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Minus the mean loss of the current weights on ``(X, y)``: higher is better, as
        scikit-learn's model selection (``GridSearchCV``, ``cross_val_score``) expects.

        The loss is the loss graph's output without the penalty that :func:`add_loss_output`
        (or the partial loop's ``learning_penalty``) adds, as scikit-learn's scores and
        onnxcustom's measure the fit to data only (a penalty term would make a search over
        penalty strengths prefer the weakest); a penalty built into the graph by hand stays.
        It is computed over all rows at once; with ``reduction='sum'`` it is
        divided by the number of rows (or the total sample weight). Before any fit, the
        graph's initial weights are scored.

        Parameters
        ----------
        X : array-like, dict or tuple
            The features, as :meth:`fit` takes them.
        y : array-like
            The labels.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the rows (the model needs a sample-weight input).

        Returns
        -------
        float
            ``-loss``.
        """
        from ._runtime import parse_device

        graphs = self._fit_graphs(refresh=True)
        data = check_fit_arrays(self._data_spec(), X, y, sample_weight)
        inputs = graphs.inputs
        feeds: dict[str, np.ndarray] = {n: a for n, a in zip(inputs.data, data) if a is not None}
        state = self._current_state()
        for name in [*inputs.parameters, *inputs.statistics]:
            feeds[name] = state.weights[name]
        session = self._evaluator(parse_device(self.device), validation_rows(data))
        loss = float(np.asarray(session.run([graphs.loss_name], feeds, None)[0]))
        if get_metadata(graphs.loss_model, "reduction") == "sum":
            weights = data[-1] if inputs.sample_weight is not None else None
            loss /= float(weights.sum()) if weights is not None else float(len(data[0]))  # type: ignore[arg-type]
        return -loss

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (read by ``clone``, ``GridSearchCV`` and the estimator checks):
        a supervised estimator (y required) without a scikit-learn estimator type, since the
        loss graph decides between regression and classification."""
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True))

    # ---- the record of the graphs -------------------------------------------------------
    def _fit_graphs(self, refresh: bool = False) -> FitGraphs:
        """The record of this trainer's graphs, built again when the model or a graph-shaping
        parameter changed.

        ``refresh`` (once per fit) hashes the model's content, so an edit of the proto in place
        is seen; between refreshes, another model object or parameter value is.
        """
        model = self.model_onnx
        if not isinstance(model, ModelProto):
            raise TypeError(f"model_onnx must be an onnx.ModelProto, not {type(model).__name__}")
        current: FitGraphs | None = getattr(self, "_graph_record", None)
        params = self._graph_params()
        seen = (id(model), params)
        if current is not None and getattr(self, "_graph_seen", None) == seen and not refresh:
            return current
        digest = model_digest(model)
        if current is None or current.params != params or current.digest != digest:
            shared = self._shared_fit_graphs(model, params, digest)
            current = self._graph_record = shared.for_trainer(model, digest)
            # once per graph and trainer, on the model without the loss (whose penalty reads
            # the weights too): parameters an exporter merged or BatchNorm it folded
            who = self._caller or type(self).__name__
            warn_exported_graph(current.prediction, current.inputs.parameters, who)
        self._graph_seen = seen
        return current

    def _shared_fit_graphs(self, model: ModelProto, params: tuple[Any, ...], digest: bytes) -> FitGraphs:
        """The process's record for ``model``'s structure (its float initializers' values left
        out: the trained ones are fed to the steps), built when absent or when ``model``'s
        other values differ from those it was built with."""
        if model.ByteSize() > MAX_CACHED_MODEL_BYTES:
            return self._new_fit_graphs(params, digest)
        key = (type(self), model_digest(model, float_initializers(model)), params)
        shared = _FIT_GRAPHS.get_or_build(key, lambda: self._new_fit_graphs(params, digest))
        if shared.digest == digest or shared.fits(model):
            return shared
        return _FIT_GRAPHS.put(key, self._new_fit_graphs(params, digest))

    def _new_fit_graphs(self, params: tuple[Any, ...], digest: bytes) -> FitGraphs:
        loss_model, loss_name = self._build_loss_model()
        inputs = self._find_inputs(loss_model, loss_name)
        trainable = initializers_to_inputs(loss_model, inputs.parameters)
        graphs = self._graphs_type(params, digest, loss_model, loss_name, inputs, trainable)
        if keeps_values(self.model_onnx, loss_model, graphs.fed):
            graphs.fixed = model_digest(self.model_onnx, graphs.fed)
        return graphs

    def _model(self) -> ModelProto:
        return self._fit_graphs().loss_model

    def _inputs(self) -> GraphInputs:
        return self._fit_graphs().inputs

    def _find_inputs(self, model: ModelProto, loss_name: str) -> GraphInputs:
        label_name, weight_name = self._input_overrides()
        label = label_name or get_metadata(model, "label_name") or "label"
        weight = weight_name or get_metadata(model, "weight_name")
        inputs = [i.name for i in model.graph.input]
        for role, name in (("label", label), ("sample weight", weight)):
            if name is not None and name not in inputs:
                raise ValueError(f"the {role} input {name!r} is not an input of the model (inputs: {inputs})")
        if self.weights_to_train is not None:
            if not isinstance(self.weights_to_train, str) and not len(self.weights_to_train):
                raise ValueError(
                    "weights_to_train is empty: a trainer needs a weight to train; name some "
                    "initializers, or pass None to train every float initializer the loss depends on"
                )
            check_weights(model, self.weights_to_train, loss_name)
            parameters = list(self.weights_to_train)
        else:
            parameters = default_weights_to_train(model, loss_name)
        if not parameters:
            raise nothing_to_train_error(model, loss_name)
        statistics = [n for n in batchnorm.running_statistics(model) if n not in parameters]
        inits = {i.name for i in model.graph.initializer}
        features = [n for n in inputs if n not in {label, weight} and n not in inits]
        if not features:
            raise ValueError(f"the model has no input to feed the data to (inputs: {inputs})")
        return GraphInputs(parameters, label, weight, features, statistics)

    def _data_spec(self) -> DataSpec:
        return self._fit_graphs().data_spec

    def _checked_data(
        self, X: Any, y: Any, sample_weight: Any, X_val: Any, y_val: Any, sample_weight_val: Any
    ) -> tuple[list[np.ndarray | None], list[np.ndarray | None] | None]:
        """The fit's arrays (:meth:`BaseOrtTrainer._checked_data`), refused before any step
        (weights and history untouched) when a batch of ``batch_size`` rows would leave a
        training-mode BatchNormalization a single value per channel; the validation loss
        normalises with the running statistics, any batch of it is fine."""
        data, validation = super()._checked_data(X, y, sample_weight, X_val, y_val, sample_weight_val)
        graphs = self._fit_graphs()
        inputs = graphs.inputs
        features = {name: a for name, a in zip(inputs.features, data) if a is not None}
        batchnorm.check_training_batches(graphs.loss_model, inputs.statistics, features, int(self.batch_size))
        return data, validation

    def _initial_state(self) -> TrainingState:
        inputs = self._inputs()
        return TrainingState(initializer_values(self._model(), [*inputs.parameters, *inputs.statistics]))

    def _prediction_model(self) -> ModelProto:
        return self._fit_graphs().prediction

    def _prepare_graphs(self, device: Device, lr: BaseLearningRate) -> None:
        self._fit_graphs(refresh=True)

    def _trainable_model(self) -> ModelProto:
        return self._fit_graphs().trainable

    def _fingerprint(self) -> str:
        return self._fit_graphs().fingerprint

    def _evaluator(self, device: Device, rows: int) -> Any:
        """The loss session for ``rows`` rows (one thread for small work, as the steps)."""
        graphs = self._fit_graphs()
        values = count_input_values(graphs.evaluating, graphs.inputs.parameters)
        threads = cpu_threads(device, rows, values, self._threads())
        key = (str(device), threads)
        if key not in graphs.evaluators:
            graphs.evaluators[key] = make_session(graphs.evaluating, device, threads=threads)
        return graphs.evaluators[key]
