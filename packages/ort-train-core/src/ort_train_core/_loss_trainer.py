"""What both trainers derive from their loss graph: trained weights, input roles, the data
layout, initial state, the prediction graph, and the session that evaluates the loss."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import ModelProto, helper

from ._binding import make_session
from ._data import DataSpec
from ._fit_loop import BaseOrtTrainer
from ._runtime import Device
from .checkpoint import TrainingState, model_fingerprint
from .graph import (
    check_weights,
    default_weights_to_train,
    get_metadata,
    initializer_values,
    initializers_to_inputs,
    nothing_to_train_error,
    prediction_graph,
)
from .learning_rate import BaseLearningRate


class LossGraphTrainer(BaseOrtTrainer):
    """A trainer whose objective is a loss graph: the model itself for the full loop, the model
    with the learning loss and penalty appended for the partial loop (used to evaluate)."""

    def _build_loss_model(self) -> ModelProto:
        raise NotImplementedError

    def _model_key(self) -> tuple[Any, ...]:
        """What the loss graph depends on besides set_params (which clears the cache)."""
        return (id(self.model_onnx),)

    @property
    def _loss_name(self) -> str:
        return "loss"

    def _batches_weighted_by_sample_weight(self) -> bool:
        # 'row_mean' batch losses are means over rows already: batches weigh by their row count
        return bool(get_metadata(self._model(), "reduction") != "row_mean")

    def _input_overrides(self) -> tuple[str | None, str | None]:
        """Label and sample-weight input names given by the user (None: from metadata)."""
        return None, None

    # ---- graph inspection -------------------------------------------------------------
    def _model(self) -> ModelProto:
        cache = self._graph_cache
        key = ("model", *self._model_key())
        if key not in cache:
            if not isinstance(self.model_onnx, ModelProto):
                raise TypeError(
                    f"model_onnx must be an onnx.ModelProto, not {type(self.model_onnx).__name__}"
                )
            cache[key] = self._build_loss_model()
        cached: ModelProto = cache[key]
        return cached

    def _names(self) -> tuple[list[str], str, str | None, list[str]]:
        """Trained weights, label input, weight input, feature inputs."""
        key = (
            "names",
            *self._model_key(),
            *self._input_overrides(),
            None if self.weights_to_train is None else tuple(self.weights_to_train),
        )
        if key not in self._graph_cache:
            self._graph_cache[key] = self._find_names()
        names: tuple[list[str], str, str | None, list[str]] = self._graph_cache[key]
        return names

    def _find_names(self) -> tuple[list[str], str, str | None, list[str]]:
        model = self._model()
        label_name, weight_name = self._input_overrides()
        label = label_name or get_metadata(model, "label_name") or "label"
        weight = weight_name or get_metadata(model, "weight_name")
        inputs = [i.name for i in model.graph.input]
        for role, name in (("label", label), ("sample weight", weight)):
            if name is not None and name not in inputs:
                raise ValueError(f"the {role} input {name!r} is not an input of the model (inputs: {inputs})")
        weights = (
            list(self.weights_to_train)
            if self.weights_to_train is not None
            else default_weights_to_train(model, self._loss_name)
        )
        if self.weights_to_train is not None:
            check_weights(model, self.weights_to_train, self._loss_name)
        if not weights:
            raise nothing_to_train_error(model, self._loss_name)
        inits = {i.name for i in model.graph.initializer}
        features = [n for n in inputs if n not in {label, weight} and n not in inits]
        if len(features) != 1:
            raise ValueError(f"fit feeds one feature input, but the model has {len(features)}: {features}")
        return weights, label, weight, features

    def _data_spec(self) -> DataSpec:
        model = self._model()
        _, label, weight, (feature,) = self._names()
        by_name = {i.name: i for i in model.graph.input}

        def info(name: str) -> tuple[np.dtype, list[int | None]]:
            tt = by_name[name].type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            return np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), dims

        fdtype, fdims = info(feature)
        ldtype, ldims = info(label)
        return DataSpec(
            n_features=fdims[1] if len(fdims) == 2 else None,
            feature_dtype=fdtype if np.issubdtype(fdtype, np.floating) else np.dtype(np.float32),
            label_dtype=ldtype,
            label_tail=tuple(ldims[1:]),
            has_weight=weight is not None,
            n_classes=get_metadata(model, "n_classes"),
        )

    def _initial_state(self) -> TrainingState:
        weights, *_ = self._names()
        return TrainingState(initializer_values(self._model(), weights))

    def _prediction_model(self) -> ModelProto:
        return prediction_graph(self._model(), self._loss_name)

    def _prepare_graphs(self, device: Device, lr: BaseLearningRate) -> None:
        # A loss or penalty object changed in place (its own set_params) since the last fit: the
        # graphs and sessions cached under keys that do not spell the model out are stale.
        model_key = self._model_key()
        if self._graph_cache.get("model_key", model_key) != model_key:
            self._graph_cache.clear()
        self._graph_cache["model_key"] = model_key
        weights, *_ = self._names()
        key = ("trainable", tuple(weights))
        if key not in self._graph_cache:
            self._graph_cache[key] = initializers_to_inputs(self._model(), weights)

    def _trainable_model(self) -> ModelProto:
        weights, *_ = self._names()
        model: ModelProto = self._graph_cache[("trainable", tuple(weights))]
        return model

    def _fingerprint(self) -> str:
        """Hashed once per graph (each checkpoint written would otherwise serialize it again)."""
        weights, *_ = self._names()
        key = ("fingerprint", tuple(weights))
        cache = self._graph_cache
        if key not in cache:
            model = cache.get(("trainable", tuple(weights)))
            if model is None:
                model = initializers_to_inputs(self._model(), weights)
            cache[key] = model_fingerprint(model)
        fingerprint: str = cache[key]
        return fingerprint

    def _evaluator(self, device: Device) -> Any:
        key = ("eval", str(device))
        if key not in self._graph_cache:
            self._graph_cache[key] = make_session(self._trainable_model(), device)
        return self._graph_cache[key]
