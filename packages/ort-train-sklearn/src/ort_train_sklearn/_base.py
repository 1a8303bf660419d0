"""The fit/predict machinery every estimator of this package shares.

An estimator builds (or receives) a prediction graph, trains it with one of ort-train-core's
loops, and keeps the trained weights on the host. Sessions are rebuilt lazily and never pickled.
"""

from __future__ import annotations

import math
import warnings
from numbers import Integral, Real
from typing import Any

import numpy as np
from onnx import ModelProto
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

import ort_train_core
from ort_train_core import (
    BaseLearningRate,
    ElasticLearningPenalty,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

from ._graphs import classifier_head

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
}


class OrtEstimatorMixin(BaseEstimator):
    """Subclasses provide the graph, the loss and the learning rate; this class trains."""

    _is_classifier = False

    # ---- what a subclass says -----------------------------------------------------------
    def _initial_graph(self, n_features: int, n_outputs: int, rng: np.random.RandomState) -> ModelProto:
        raise NotImplementedError

    def _trained_weights(self, model: ModelProto) -> list[str]:
        """Weights to train, in order."""
        raise NotImplementedError

    def _penalized_weights(self, model: ModelProto) -> list[str]:
        return []

    def _loss(self, n_outputs: int) -> tuple[str, str, float]:
        """(score name for add_loss_output, learning-loss name, scale): our objective is
        ``scale`` times scikit-learn's for the same estimator (ours has no 1/2 factor)."""
        raise NotImplementedError

    def _learning_rate(self, scale: float) -> BaseLearningRate:
        raise NotImplementedError

    def _penalty(self, scale: float, batch_size: int) -> tuple[float, float]:
        """(l1, l2) of our penalty, matching scikit-learn's alpha in our objective's scale."""
        return 0.0, 0.0

    def _batch_size(self, n_samples: int) -> int:
        raise NotImplementedError

    def _store_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Sets the fitted attributes scikit-learn names (coef_, coefs_, ...)."""
        raise NotImplementedError

    # ---- fit ----------------------------------------------------------------------------
    def _prepare_targets(self, y: np.ndarray, first: bool, classes: Any = None) -> tuple[np.ndarray, int]:
        if not self._is_classifier:
            y = np.asarray(y, dtype=np.float32)
            n_outputs = 1 if y.ndim == 1 else y.shape[1]
            if first:
                self._y_ndim = y.ndim
            return (y.reshape(-1, 1) if y.ndim == 1 else y), n_outputs
        check_classification_targets(y)
        if first:
            self.classes_ = np.unique(y) if classes is None else np.asarray(classes)
            if classes is not None and not np.isin(np.unique(y), self.classes_).all():
                raise ValueError(f"y holds labels not in classes={list(self.classes_)}")
            if len(self.classes_) < 2:
                raise ValueError(
                    f"{type(self).__name__} needs at least 2 classes in y, got {len(self.classes_)}: "
                    f"{list(self.classes_)}"
                )
        elif not np.isin(np.unique(y), self.classes_).all():
            raise ValueError(f"y holds labels not seen in the first fit: classes are {list(self.classes_)}")
        index = np.searchsorted(self.classes_, y).astype(np.int64)
        n_outputs = 1 if len(self.classes_) == 2 else len(self.classes_)
        return index, n_outputs

    def _fit(
        self, X: Any, y: Any, sample_weight: Any = None, incremental: bool = False, classes: Any = None
    ) -> OrtEstimatorMixin:
        first = not ((incremental or self.warm_start) and hasattr(self, "_trainer"))
        multi = not self._is_classifier
        X, y = validate_data(
            self, X, y, reset=first, dtype=(np.float32, np.float64), multi_output=multi, y_numeric=multi
        )
        X = X.astype(np.float32, copy=False)
        y_enc, n_outputs = self._prepare_targets(y, first, classes)
        sw = None if sample_weight is None else _check_sample_weight(sample_weight, X, dtype=np.float32)
        rng = check_random_state(self.random_state)
        if first:
            model = self._initial_graph(X.shape[1], n_outputs, rng)
            self._trainer = self._make_trainer(model, X.shape[0], n_outputs, rng)
        trainer = self._trainer
        trainer.max_iter = 1 if incremental else self.max_iter
        trainer.tol = None if incremental or self.tol is None else self.tol * self._scale
        trainer.n_iter_no_change = self.n_iter_no_change
        trainer.shuffle = self.shuffle
        X_val = y_val = None
        if self.early_stopping and not incremental:
            stratify = y_enc if self._is_classifier else None
            split = train_test_split(
                X,
                y_enc,
                *([] if sw is None else [sw]),
                test_size=self.validation_fraction,
                random_state=rng.randint(2**31 - 1),
                stratify=stratify,
            )
            X, X_val, y_enc, y_val = split[:4]
            sw = split[4] if sw is not None else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ort_train_core.ConvergenceWarning)
            trainer.fit(X, y_enc, sw, X_val, y_val)
        for w in caught:
            if issubclass(w.category, ort_train_core.ConvergenceWarning):
                warnings.warn(
                    f"{type(self).__name__}: maximum iterations ({self.max_iter}) reached and the "
                    "optimization hasn't converged yet.",
                    ConvergenceWarning,
                    stacklevel=3,
                )
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self._store_weights(trainer.get_state())
        self.n_iter_ = trainer.n_iter_
        self.loss_curve_ = [float(v) / self._scale for v in trainer.train_losses_]
        self.best_loss_ = min(self.loss_curve_) if self.loss_curve_ else math.inf
        self.validation_scores_ = (
            [-float(v) / self._scale for v in trainer.validation_losses_]
            if trainer.validation_losses_
            else None
        )
        self._sessions: dict[str, Any] = {}
        return self

    def _make_trainer(
        self, model: ModelProto, n_samples: int, n_outputs: int, rng: np.random.RandomState
    ) -> Any:
        score, learning_loss, scale = self._loss(n_outputs)
        self._scale = scale
        self._raw_model = model
        weights = self._trained_weights(model)
        batch = self._batch_size(n_samples)
        l1, l2 = self._penalty(scale, batch)
        penalized = self._penalized_weights(model)
        common = dict(
            weights_to_train=weights,
            max_iter=self.max_iter,
            batch_size=batch,
            learning_rate=self._learning_rate(scale),
            device=self.device,
            warm_start=True,
            verbose=int(self.verbose) if self.verbose in (0, 1, 2) else 0,
            shuffle=self.shuffle,
            random_state=int(rng.randint(2**31 - 1)),
            n_iter_no_change=self.n_iter_no_change,
        )
        if self.training == "full":
            penalty = {w: {"l1": l1, "l2": l2} for w in penalized} if (l1 or l2) else None
            loss_model = add_loss_output(model, score, weight_name="sample_weight", penalty=penalty)
            return OrtGradientOptimizer(loss_model, **common)
        return OrtGradientForwardBackwardOptimizer(
            model,
            learning_loss=learning_loss,
            weight_name="sample_weight",
            learning_penalty=ElasticLearningPenalty(l1=l1, l2=l2) if (l1 or l2) else None,
            **common,
        )

    # ---- predict ------------------------------------------------------------------------
    def _trained_graph(self) -> ModelProto:
        """The raw prediction graph (scores or logits) with the trained weights."""
        check_is_fitted(self, "_trainer")
        model: ModelProto = self._trainer.get_trained_onnx()
        return model

    def to_onnx(self) -> ModelProto:
        """A deployable model for any onnxruntime InferenceSession. Regressors output the
        prediction; classifiers output 'label' then 'probabilities'."""
        raw = self._trained_graph()
        if not self._is_classifier:
            return raw
        return classifier_head(raw, raw.graph.output[0].name, self.classes_)

    def _run(self, kind: str, X: Any) -> list[np.ndarray]:
        check_is_fitted(self, "_trainer")
        X = validate_data(self, X, reset=False, dtype=(np.float32, np.float64))
        X = np.ascontiguousarray(X, dtype=np.float32)
        sessions = self.__dict__.setdefault("_sessions", {})
        if kind not in sessions:
            import onnxruntime

            from ort_train_core._runtime import parse_device

            model = self.to_onnx() if kind == "deploy" else self._trained_graph()
            sessions[kind] = onnxruntime.InferenceSession(
                model.SerializeToString(), providers=parse_device(self.device).providers
            )
        sess = sessions[kind]
        outputs: list[np.ndarray] = sess.run(None, {sess.get_inputs()[0].name: X})
        return outputs

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state.pop("_sessions", None)
        return state


class OrtRegressorMixin(OrtEstimatorMixin):
    def predict(self, X: Any) -> np.ndarray:
        (pred,) = self._run("raw", X)
        out: np.ndarray = pred.ravel() if getattr(self, "_y_ndim", 1) == 1 else pred
        return out


class OrtClassifierMixin(OrtEstimatorMixin):
    _is_classifier = True

    def decision_function(self, X: Any) -> np.ndarray:
        (scores,) = self._run("raw", X)
        out: np.ndarray = scores.ravel() if scores.shape[1] == 1 else scores
        return out

    def predict_proba(self, X: Any) -> np.ndarray:
        proba: np.ndarray = self._run("deploy", X)[1]
        return proba

    def predict_log_proba(self, X: Any) -> np.ndarray:
        out: np.ndarray = np.log(self.predict_proba(X))
        return out

    def predict(self, X: Any) -> np.ndarray:
        proba = self.predict_proba(X)
        labels: np.ndarray = self.classes_[np.argmax(proba, axis=1)]
        return labels
