"""From a fitted scikit-learn estimator or an ONNX graph exported by skl2onnx to a *trainable*
prediction graph: one float32 input ``X`` [N, n_features], standard ONNX operators only on the
path to the output, and one output that a loss can follow.

- Regressors keep their prediction [N, n_outputs] as the output.
- Classifiers are cut at their logits: the output is the raw decision score the probabilities
  are computed from, [N, 1] for binary (``sigmoid(logit) == predict_proba[:, 1]``) and
  [N, n_classes] for multiclass (``softmax(logits) == predict_proba``), to be trained with the
  cross-entropy on logits. The label branch (ArgMax, ArrayFeatureExtractor, ZipMap) goes.

How each graph of skl2onnx (``to_onnx(..., black_op={'LinearRegressor', 'LinearClassifier'},
options={'zipmap': False})``) is cut, the cut being found from the probabilities output backwards
(the last Softmax / Sigmoid / ``1 / (1 + exp(-z))`` before it):

- LogisticRegression, binary: ``raw_scores = X @ coef + intercept`` with two columns ``[-z, z]``,
  then Sigmoid and an L1 normalisation. ``coef``/``intercept`` are cut to their second column, so
  the logit is ``z`` (= ``decision_function``), [N, 1], sigmoid.
- LogisticRegression, multiclass: Softmax(raw_scores); logits = raw_scores, softmax.
- SGDClassifier(loss='log_loss'), binary: Sigmoid(score), then ``[1 - p, p]``; logit = score.
- SGDClassifier(loss='log_loss'), multiclass (one-vs-rest): ``p_k = sigmoid(z_k) / sum_j
  sigmoid(z_j)``. That is ``softmax(log sigmoid(z))``: the logits are ``log sigmoid(z)`` (written
  ``-(relu(-z) + log(1 + exp(-|z|)))``, stable and differentiable; Softplus has no gradient in
  onnxruntime-training 1.19), not ``decision_function``, so that softmax(logits) is
  ``predict_proba`` and the cross-entropy is the log-loss of the one-vs-rest probabilities.
- MLPClassifier: Sigmoid (binary, one column) or Softmax (multiclass) on the last Add; the logits
  are that Add's output.
- Generic fallbacks: a Sigmoid on two columns that are not ``[-z, z]`` gives
  ``log sigmoid(z1) - log sigmoid(z0)``, a Softmax on two columns ``z1 - z0`` (binary is always
  one column).

Operators of ``ai.onnx.ml`` upstream of the cut are rewritten with standard ones: ``Scaler``
(StandardScaler) becomes ``Sub``/``Mul`` with **Constant nodes** (not initializers, so they are
never trained), ``LinearRegressor`` and ``LinearClassifier`` (two or more rows of coefficients)
become ``MatMul``/``Add`` with float initializers (trainable) and their post-transform; so
skl2onnx's default exports (no ``black_op``, with ZipMap) are accepted too. Operators after the
cut (Normalizer, ZipMap, the label branch) are dropped. Any other operator of another domain on
the path is refused (:class:`GraphNotDifferentiableError`, a ValueError).

Trainable weights: the float initializers the output depends on. Every constant this module adds
is a Constant node, and a Pipeline's StandardScaler steps become Constant nodes, so the weights
are exactly the final estimator's coefficients and intercepts; int64 shape tensors are never
weights.

Every result is checked numerically against the graph it came from (onnxruntime, CPU) on
``X_sample`` (or random rows): the prediction, or the probabilities from the logits.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from ort_train_core import (
    GraphNotDifferentiableError,
    describe_non_finite,
    load_model,
    onnxruntime_errors,
)
from ort_train_core.graph import (
    all_names,
    ancestors,
    check_output_size,
    default_weights_to_train,
    inference_form,
    initializer_values,
    normalise_model,
    nothing_to_train_error,
    output_shape,
    prune_to_outputs,
    rename_value,
    unique_name,
)

from ._graphs import copy_model, probabilities

__all__ = [
    "SUPPORTED_CLASSIFIERS",
    "SUPPORTED_REGRESSORS",
    "TARGET_OPSET",
    "TrainableGraph",
    "to_trainable_graph",
]

#: opsets given to skl2onnx (onnxruntime 1.19 runs both)
TARGET_OPSET = {"": 17, "ai.onnx.ml": 3}
SUPPORTED_REGRESSORS = ("LinearRegression", "Ridge", "SGDRegressor", "MLPRegressor")
SUPPORTED_CLASSIFIERS = ("LogisticRegression", "SGDClassifier(loss='log_loss')", "MLPClassifier")
INPUT_NAME = "X"
LOGITS_NAME = "logits"
BATCH_DIM = "N"
_STANDARD_DOMAINS = ("", "ai.onnx")
_ML = "ai.onnx.ml"
#: rows of random data used to check a graph when no X_sample is given
_N_CHECK_ROWS = 16
_PROBA_ATOL = 1e-4
_REG_RTOL = 1e-4


@dataclass
class TrainableGraph:
    """A prediction graph ready for :func:`ort_train_core.add_loss_output`.

    Parameters
    ----------
    model : onnx.ModelProto
        One float32 input ``X`` [N, n_features], IR <= 10, opset <= 21, only standard
        operators, one output ``output_name``: the prediction [N, n_outputs] of a regressor,
        or the logits of a classifier ([N, 1] binary, [N, n_classes] multiclass).
    kind : {'regressor', 'classifier'}
        What the graph predicts.
    output_name : str
        The name of its output.
    classes : ndarray or None, default=None
        A classifier's labels in the order of the logit columns; None for a regressor.
    probability : {'sigmoid', 'softmax'} or None, default=None
        How probabilities follow from the logits: ``'sigmoid'`` (binary) or ``'softmax'``
        (multiclass); None for a regressor.
    weights : list of str, default=[]
        The float initializers to train by default.
    output_rank : int, default=2
        The rank of the given graph's prediction: 1 for a regressor's [N], which ``model``
        predicts as [N, 1].
    input_name : str, default='X'
        The given graph's name for its 2-D float input, which ``model`` calls ``'X'``.

    Attributes
    ----------
    n_features : int
        The number of features of the input.
    loss : str
        The ``score_name`` of :func:`ort_train_core.add_loss_output` that fits the output.
    """

    model: ModelProto
    kind: str
    output_name: str
    classes: np.ndarray | None = None
    probability: str | None = None
    weights: list[str] = field(default_factory=list)
    output_rank: int = 2
    input_name: str = INPUT_NAME

    @property
    def n_features(self) -> int:
        """The number of features of the input."""
        dim = self.model.graph.input[0].type.tensor_type.shape.dim[1]
        return int(dim.dim_value)

    @property
    def loss(self) -> str:
        """The ``score_name`` of :func:`ort_train_core.add_loss_output` that fits this output."""
        return "cross_entropy" if self.kind == "classifier" else "squared_error"


def _parse_model(data: bytes | bytearray | memoryview) -> ModelProto:
    """A serialised ONNX model parsed, with a clear error for other bytes."""
    proto = ModelProto()
    try:
        proto.ParseFromString(bytes(data))
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"the bytes are not a serialised ONNX model ({exc})") from exc
    return proto


def to_trainable_graph(
    model: Any, X_sample: Any = None, *, kind: str | None = None, classes: Any = None
) -> TrainableGraph:
    """The trainable prediction graph of ``model``, checked numerically against it.

    Parameters
    ----------
    model : onnx.ModelProto, bytes, str, path or estimator
        An ONNX model, its serialised bytes, the path of a ``.onnx`` file, or a fitted
        scikit-learn estimator among :data:`SUPPORTED_REGRESSORS` and
        :data:`SUPPORTED_CLASSIFIERS`, possibly the last step of a Pipeline whose other steps
        are StandardScaler.
    X_sample : array-like of shape (n_samples, n_features), default=None
        A few rows of input: the first one converts an estimator, up to 64 check the result.
        Without it an estimator is converted from ``n_features_in_`` and random rows check
        the result.
    kind : {'regressor', 'classifier'} or None, default=None
        How to read an ONNX graph whose single output is a float tensor: None or
        ``'regressor'``, as a prediction; ``'classifier'``, as logits (a network cut before its
        softmax, as torch exports a classifier): [N, K] with K >= 2 gives K classes and their
        softmax, [N, 1] or [N] one binary logit (that of the second class) and its sigmoid.
        Graphs with probabilities (skl2onnx's classifiers) and estimators are read as they are.
    classes : array-like of shape (n_classes,), default=None
        The labels of the logit columns, in order; None gives the graph's own labels, else
        0 to n_classes - 1. Only for ONNX graphs read as classifiers.

    Returns
    -------
    TrainableGraph
        The graph, its kind, output, classes, probability function and default weights.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        For an unfitted estimator.
    TypeError
        For an unsupported estimator or ``model`` type.
    ValueError
        For a graph that cannot be made trainable (its subclass
        :class:`~ort_train_core.GraphNotDifferentiableError` for operators without gradient).
    """
    if kind not in (None, "regressor", "classifier"):
        raise ValueError(f"kind must be 'regressor', 'classifier' or None, got {kind!r}")
    labels = None if classes is None else _checked_classes(classes)
    as_logits = kind == "classifier"
    if isinstance(model, ModelProto):
        return _from_onnx(model, X_sample, classes=labels, as_logits=as_logits)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _from_onnx(_parse_model(model), X_sample, classes=labels, as_logits=as_logits)
    if isinstance(model, (str, os.PathLike)):
        # untrusted files: external data must stay in the model's folder, clear parse errors
        return _from_onnx(load_model(model), X_sample, classes=labels, as_logits=as_logits)
    if _is_sklearn_estimator(model):
        return _from_estimator(model, X_sample)
    raise TypeError(
        "model must be an onnx.ModelProto, bytes, a path to a .onnx file or a fitted scikit-learn "
        f"estimator, not {type(model).__name__}"
    )


# ---- scikit-learn estimators -------------------------------------------------------------------


def _is_sklearn_estimator(obj: Any) -> bool:
    try:
        from sklearn.base import BaseEstimator
    except ImportError:  # pragma: no cover - scikit-learn is a dependency
        return False
    return isinstance(obj, BaseEstimator)


def _supported_message() -> str:
    names = ", ".join(SUPPORTED_REGRESSORS + SUPPORTED_CLASSIFIERS)
    return f"supported: {names}, or a Pipeline of StandardScaler steps ending in one of them"


def _final_estimator(est: Any) -> tuple[Any, str]:
    """The estimator that predicts (the last step of a Pipeline) and its kind; TypeError for
    anything this module cannot convert."""
    from sklearn.linear_model import (
        LinearRegression,
        LogisticRegression,
        Ridge,
        SGDClassifier,
        SGDRegressor,
    )
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    final = est
    if isinstance(est, Pipeline):
        steps = list(est.steps)
        if not steps:
            raise TypeError(f"the Pipeline has no steps; {_supported_message()}")
        for name, step in steps[:-1]:
            if type(step) is not StandardScaler:
                what = repr(step) if isinstance(step, str) or step is None else type(step).__name__
                raise TypeError(
                    f"Pipeline step {name!r} ({what}) is not supported; only StandardScaler may "
                    f"precede the final estimator ({_supported_message()})"
                )
        final = steps[-1][1]
    kind_of = {
        LinearRegression: "regressor",
        Ridge: "regressor",
        SGDRegressor: "regressor",
        MLPRegressor: "regressor",
        LogisticRegression: "classifier",
        SGDClassifier: "classifier",
        MLPClassifier: "classifier",
    }
    kind = kind_of.get(type(final))
    if kind is None:
        raise TypeError(f"{type(final).__name__} is not supported; {_supported_message()}")
    if type(final) is SGDClassifier and final.loss != "log_loss":
        raise TypeError(
            f"SGDClassifier(loss={final.loss!r}) is not supported: only loss='log_loss' has "
            f"probabilities to train with the cross-entropy; {_supported_message()}"
        )
    return final, kind


def _from_estimator(est: Any, X_sample: Any) -> TrainableGraph:
    from sklearn.utils.validation import check_is_fitted

    final, kind = _final_estimator(est)
    check_is_fitted(est)
    check_is_fitted(final)
    if (
        type(final).__name__ == "MLPClassifier"
        and final.out_activation_ == "logistic"
        and final.n_outputs_ > 1
    ):
        raise TypeError(f"MLPClassifier on multilabel targets is not supported; {_supported_message()}")
    n_features = int(est.n_features_in_)
    sample = None if X_sample is None else _as_sample(X_sample, n_features)

    from skl2onnx import to_onnx

    kwargs: dict[str, Any] = {
        "target_opset": dict(TARGET_OPSET),
        "black_op": {"LinearRegressor", "LinearClassifier"},
    }
    if kind == "classifier":
        kwargs["options"] = {id(final): {"zipmap": False}}
    if sample is not None:
        onx = to_onnx(est, sample[:1], **kwargs)
    else:
        from skl2onnx.common.data_types import FloatTensorType

        onx = to_onnx(est, initial_types=[(INPUT_NAME, FloatTensorType([None, n_features]))], **kwargs)
    if kind == "regressor" and int(getattr(final, "n_outputs_", 1)) > 1:
        _keep_rows(onx, int(final.n_outputs_))
    classes = np.asarray(final.classes_) if kind == "classifier" else None
    return _from_onnx(onx, sample, classes=classes, expected_kind=kind)


def _keep_rows(onx: ModelProto, n_outputs: int) -> None:
    """skl2onnx ends a multi-output MLPRegressor with ``Reshape(., [-1, 1])``, which stacks the
    targets of all rows into one column ([4, 3] -> [12, 1]): the reshape keeps the rows instead."""
    out = onx.graph.output[0].name
    last = [n for n in onx.graph.node if out in n.output]
    if not last or last[0].op_type != "Reshape":
        return
    for init in onx.graph.initializer:
        if init.name == last[0].input[1] and numpy_helper.to_array(init).tolist() == [-1, 1]:
            init.CopyFrom(numpy_helper.from_array(np.array([-1, n_outputs], dtype=np.int64), init.name))


def _as_sample(X_sample: Any, n_features: int | None) -> np.ndarray:
    sample = np.asarray(X_sample, dtype=np.float32)
    if sample.ndim == 1:
        sample = sample.reshape(1, -1)
    if sample.ndim != 2 or sample.shape[0] == 0:
        raise ValueError(f"X_sample must be a non-empty 2-D array, got shape {sample.shape}")
    if n_features is not None and sample.shape[1] != n_features:
        raise ValueError(f"X_sample has {sample.shape[1]} features, the model expects {n_features}")
    return np.ascontiguousarray(sample)


# ---- ONNX graphs ---------------------------------------------------------------------------------


def _from_onnx(
    model: ModelProto,
    X_sample: Any,
    classes: np.ndarray | None = None,
    expected_kind: str | None = None,
    as_logits: bool = False,
) -> TrainableGraph:
    """``as_logits``: a graph with a single float output is a classifier's logits."""
    model = normalise_model(model)
    x_name, sample = _features_and_sample(model, X_sample)
    kind, target = _detect_kind(model)
    if target in {o.name for o in model.graph.output}:  # a ZipMap's input has no declared type
        check_output_size(target, output_shape(model, target)[1])
    n_rows = _n_rows(sample)
    if expected_kind is not None and kind != expected_kind:
        raise ValueError(f"the converted graph looks like a {kind}, expected a {expected_kind}")
    with onnxruntime_errors("on the first row of X, checking the conversion", ValueError):
        reference = _run(_deterministic(_select_outputs(model, [target])), sample)
    work = _rewrite_ml_ops(_select_outputs(model, [target]))
    probability: str | None = None
    if as_logits and kind == "regressor":
        kind = "classifier"
        work, probability, classes = _logits_classifier(work, target, reference, classes)
        # the probabilities the graph's own logits give: what the trainable graph must give
        reference = probabilities(reference.reshape(n_rows, -1))
    elif kind == "classifier":
        work, probability, classes = _classifier_logits(work, model, target, sample, classes)
    elif len(_output_shape(work, sample)) == 1:
        work = _reshape_output_2d(work)
    if x_name is not None:  # one 2-D float input: named INPUT_NAME, as the estimators feed it
        work = _rename(work, x_name, INPUT_NAME)
        sample = {INPUT_NAME: sample[x_name]}
    output_name = work.graph.output[0].name
    # before _finalise drops the value_info, whose metadata (dynamo's) tells folded constants
    # and buffers from parameters: the same default weights as the core trainers'
    weights = _weights_to_train(work, output_name)
    _finalise(work)
    _check_outputs(_deterministic(work), sample, reference, kind, probability)
    return TrainableGraph(
        model=work,
        kind=kind,
        output_name=output_name,
        classes=classes,
        probability=probability,
        weights=weights,
        output_rank=np.ndim(reference),
        input_name=x_name or INPUT_NAME,
    )


#: the inputs of a graph and rows to run it on, by input name
Feeds = dict[str, np.ndarray]


def _deterministic(model: ModelProto) -> ModelProto:
    """The graph as it predicts (the core's :func:`~ort_train_core.graph.inference_form`: Dropout
    the identity, BatchNormalization on its running statistics), so that the conversion check
    compares equal computations: a training-mode export (torch's TrainingMode.TRAINING) drops at
    random on every run."""
    return inference_form(model)


def _n_rows(feeds: Feeds) -> int:
    return int(next(iter(feeds.values())).shape[0])


def _features_and_sample(model: ModelProto, X_sample: Any) -> tuple[str | None, Feeds]:
    """The graph's batched inputs and the rows that check the conversion (up to 64 of
    X_sample, or random ones). A graph with one float32 [N, n_features] input (scikit-learn's
    and skl2onnx's) gives its name; any other (images, sequences, int64 ids, several inputs,
    as torch exports them) gives None and needs X_sample in the form fit takes it: an array,
    a dict by input name or a tuple in input order."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if not inputs:
        raise ValueError("the graph has no input to feed the features to")
    x_info = inputs[0]
    tt = x_info.type.tensor_type
    standard = (
        len(inputs) == 1
        and x_info.type.HasField("tensor_type")
        and tt.elem_type == TensorProto.FLOAT
        and len(tt.shape.dim) == 2
    )
    if not standard:
        return None, _general_sample(inputs, X_sample)
    n_features = tt.shape.dim[1].dim_value if tt.shape.dim[1].HasField("dim_value") else None
    if n_features is None and X_sample is None:
        raise ValueError(
            f"input {x_info.name!r} has an unknown number of features: pass X_sample to check the graph"
        )
    if X_sample is not None:
        return x_info.name, {x_info.name: _as_sample(X_sample, n_features)[:64]}
    rng = np.random.default_rng(0)
    return x_info.name, {
        x_info.name: rng.standard_normal((_N_CHECK_ROWS, int(n_features or 0))).astype(np.float32)
    }


def _general_sample(inputs: list[Any], X_sample: Any) -> Feeds:
    """Rows of a graph's inputs of any rank and type, checked as fit checks them."""
    from ort_train_core.extending import check_features, feature_spec

    names = [i.name for i in inputs]
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            raise ValueError(f"input {vi.name!r} is a {helper.printable_type(vi.type)}, not a tensor")
    if X_sample is None:
        raise ValueError(
            f"the graph's inputs {names} are not one float32 [N, n_features] matrix: pass X_sample "
            "(an array, a dict by input name or a tuple in input order) to check the graph"
        )
    arrays = check_features(tuple(feature_spec(vi) for vi in inputs), X_sample, "X_sample ")
    return {name: a[:64] for name, a in zip(names, arrays)}


def _classifier_logits(
    work: ModelProto,
    model: ModelProto,
    target: str,
    sample: Feeds,
    classes: np.ndarray | None,
) -> tuple[ModelProto, str, np.ndarray]:
    """``work`` cut at the logits of the probabilities ``target`` (output renamed
    LOGITS_NAME), 'sigmoid' or 'softmax', and the class labels: ``classes``, else those
    ``model`` lists, else 0 to n_classes - 1."""
    listed = _classes_from_graph(model)
    if classes is None:
        classes = listed
    elif listed is not None:
        # renaming the labels is fine; the same labels in another order would swap the
        # predictions of the columns
        check_not_reordered(classes, listed)
    work, probability = _cut_at_logits(work, target, sample)
    n_cols = _output_shape(work, sample)[1]
    n_classes = 2 if n_cols == 1 else n_cols
    if classes is None:
        classes = np.arange(n_classes, dtype=np.int64)
    if len(classes) != n_classes:
        raise ValueError(
            f"the logits have {n_cols} column(s), i.e. {n_classes} classes, but there are "
            f"{len(classes)} class labels"
        )
    return _rename(work, work.graph.output[0].name, LOGITS_NAME), probability, classes


def check_not_reordered(classes: Any, listed: np.ndarray) -> None:
    """Refuses ``classes`` that hold the model's labels ``listed`` in another order.

    Parameters
    ----------
    classes : array-like
        The labels a caller gave for the logit columns, in order.
    listed : numpy.ndarray
        The model's own labels, in the order of its columns.

    Raises
    ------
    ValueError
        When ``classes`` are ``listed`` permuted: that would swap the columns' predictions.
    """
    given, own = np.asarray(classes).tolist(), np.asarray(listed).tolist()
    if given != own and sorted(map(str, given)) == sorted(map(str, own)):
        raise ValueError(
            f"classes={given!r} lists the model's labels ({own!r}, one per logit column) in another "
            "order, which would swap its predictions: pass them in the model's order, or leave "
            "classes out"
        )


def _checked_classes(classes: Any) -> np.ndarray:
    """``classes`` as a 1-D array of distinct labels."""
    labels = np.asarray(classes)
    if labels.ndim != 1 or len(labels) < 2:
        raise ValueError(f"classes must list two labels or more, got {labels.tolist()!r}")
    if len(np.unique(labels)) != len(labels):
        raise ValueError(f"classes must be distinct labels, got {labels.tolist()!r}")
    return labels


def _logits_classifier(
    work: ModelProto, target: str, logits: np.ndarray, classes: np.ndarray | None
) -> tuple[ModelProto, str, np.ndarray]:
    """A graph whose single output is logits, as a classifier: [N, K] (K >= 3, softmax), [N, 2]
    (the difference of the two columns, a binary logit: softmax([z0, z1])[1] = sigmoid(z1 - z0)),
    [N, 1] or [N] (one binary logit, sigmoid). Output renamed LOGITS_NAME; the labels: ``classes``,
    else 0 to n_classes - 1."""
    if logits.ndim == 1:
        work = _reshape_output_2d(work)
        n_cols = 1
    elif logits.ndim == 2:
        n_cols = int(logits.shape[1])
    else:
        raise ValueError(
            f"the output {target!r} has shape {list(logits.shape)}: a classifier's logits are "
            "[N, n_classes], or [N] / [N, 1] for one binary logit"
        )
    n_classes = max(n_cols, 2)
    if classes is None:
        classes = np.arange(n_classes, dtype=np.int64)
    if len(classes) != n_classes:
        raise ValueError(
            f"the logits {target!r} have {n_cols} column(s), i.e. {n_classes} classes, but classes "
            f"lists {len(classes)}: {classes.tolist()!r}"
        )
    probability = "softmax" if n_cols > 2 else "sigmoid"
    if n_cols == 2:
        _append_difference(work, work.graph.output[0].name, _Namer(all_names(work)))
    return _rename(work, work.graph.output[0].name, LOGITS_NAME), probability, classes


def _weights_to_train(work: ModelProto, output_name: str) -> list[str]:
    """The float initializers ``output_name`` depends on, all finite."""
    weights = default_weights_to_train(work, output_name)
    if not weights:
        raise nothing_to_train_error(work, output_name)
    bad = describe_non_finite(initializer_values(work, weights))
    if bad:  # checked before the outputs are compared, which NaN would fail with no reason given
        raise ValueError(
            f"the model's weights {bad} hold NaN or inf, so its predictions do too: re-initialise "
            "them with finite values (or refit the scikit-learn model) before training"
        )
    return weights


def _detect_kind(model: ModelProto) -> tuple[str, str]:
    """('classifier', probabilities tensor) or ('regressor', prediction output)."""
    g = model.graph
    zipmaps = [n for n in g.node if n.op_type == "ZipMap"]
    if zipmaps:
        return "classifier", zipmaps[0].input[0]
    tensor_outs = [o for o in g.output if o.type.HasField("tensor_type")]
    floats = [o for o in tensor_outs if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    if len(g.output) == 1 and len(floats) == 1:
        return "regressor", floats[0].name
    labels = [
        o for o in tensor_outs if o.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.STRING)
    ]
    if len(floats) == 1 and len(labels) == 1 and len(g.output) == 2:
        return "classifier", floats[0].name
    half_types = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    half = [o.name for o in tensor_outs if o.type.tensor_type.elem_type in half_types]
    if half:
        raise TypeError(
            f"output(s) {half} are 16-bit floats: OnnxModelRegressor and OnnxModelClassifier train "
            "float32 graphs; convert the graph to float32 (onnxconverter_common.float16."
            "convert_float16_to_float32, or a float32 export), train it, then convert the result"
        )
    desc = [(o.name, helper.printable_type(o.type)) for o in g.output]
    raise ValueError(
        "cannot tell what the graph predicts: a regressor has one float output, a classifier "
        f"exported by skl2onnx a label and probabilities (or a ZipMap); outputs are {desc}"
    )


def _classes_from_graph(model: ModelProto) -> np.ndarray | None:
    for node in model.graph.node:
        if node.domain == _ML and node.op_type in ("ZipMap", "LinearClassifier"):
            for attr in node.attribute:
                if attr.name in ("classlabels_int64s", "classlabels_ints") and attr.ints:
                    return np.array(list(attr.ints), dtype=np.int64)
                if attr.name == "classlabels_strings" and attr.strings:
                    return np.array([s.decode("utf-8") for s in attr.strings])
    label_outs = [o.name for o in model.graph.output if o.type.tensor_type.elem_type != TensorProto.FLOAT]
    _, nodes = ancestors(model, label_outs)
    for idx in sorted(nodes):
        node = model.graph.node[idx]
        if node.op_type in ("ArrayFeatureExtractor", "Gather"):
            value = _const_value(model, node.input[0])
            if value is not None and value.ndim == 1:
                if value.dtype.kind in "iu":
                    return value.astype(np.int64)
                return np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value])
    return None


# ---- rewriting ai.onnx.ml operators -------------------------------------------------------------------


class _Namer:
    def __init__(self, taken: Iterable[str]) -> None:
        self._taken = set(taken)
        self._next_suffix: dict[str, int] = {}

    def __call__(self, hint: str) -> str:
        return unique_name(hint, self._taken, self._next_suffix)


def _constant(namer: _Namer, value: np.ndarray, hint: str) -> tuple[NodeProto, str]:
    out = namer(hint)
    node = helper.make_node(
        "Constant", [], [out], name=namer(f"n_{hint}"), value=numpy_helper.from_array(value, out)
    )
    return node, out


def _attrs(node: NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _rewrite_ml_ops(model: ModelProto) -> ModelProto:
    """Scaler, LinearRegressor and LinearClassifier replaced by standard operators."""
    model = copy_model(model)
    g = model.graph
    namer = _Namer(all_names(model))
    new_nodes: list[NodeProto] = []
    new_inits: list[TensorProto] = []
    consumed = {i for node in g.node for i in node.input} | {o.name for o in g.output}
    for node in g.node:
        if node.domain != _ML or node.op_type not in ("Scaler", "LinearRegressor", "LinearClassifier"):
            new_nodes.append(node)
        elif node.op_type == "Scaler":
            new_nodes += _scaler_nodes(node, namer)
        else:
            nodes, inits = _linear_nodes(node, namer, consumed)
            new_nodes += nodes
            new_inits += inits
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    return model


def _scaler_nodes(node: NodeProto, namer: _Namer) -> list[NodeProto]:
    """``(x - offset) * scale`` with Constant nodes, never trained."""
    attrs = _attrs(node)
    offset = np.asarray(attrs.get("offset", [0.0]), dtype=np.float32)
    scale = np.asarray(attrs.get("scale", [1.0]), dtype=np.float32)
    c_off, off = _constant(namer, offset, "scaler_offset")
    c_scale, sc = _constant(namer, scale, "scaler_scale")
    centred = namer("scaler_centred")
    return [
        c_off,
        c_scale,
        helper.make_node("Sub", [node.input[0], off], [centred], name=namer("n_scaler_sub")),
        helper.make_node("Mul", [centred, sc], [node.output[0]], name=namer("n_scaler_mul")),
    ]


def _linear_nodes(
    node: NodeProto, namer: _Namer, consumed: set[str]
) -> tuple[list[NodeProto], list[TensorProto]]:
    """A LinearRegressor or LinearClassifier as ``x @ coef + intercept`` with float
    initializers (trainable), then the classifier's post-transform; ``consumed``: the names
    the graph reads (a classifier's label output must not be one)."""
    attrs = _attrs(node)
    coefs = np.asarray(attrs.get("coefficients", []), dtype=np.float32)
    intercepts = np.asarray(attrs.get("intercepts", []), dtype=np.float32)
    post = attrs.get("post_transform", b"NONE")
    post = post.decode() if isinstance(post, bytes) else str(post)
    regressor = node.op_type == "LinearRegressor"
    if regressor:
        n_targets, out = _linear_regressor_output(node, attrs, post)
    else:
        n_targets, out = _linear_classifier_output(node, intercepts, consumed)
    if coefs.size % n_targets:
        raise ValueError(f"{node.op_type} {node.name!r}: coefficients do not split into {n_targets} rows")
    if intercepts.size == 0:
        intercepts = np.zeros(n_targets, dtype=np.float32)
    coef_name, bias_name = namer("coef"), namer("intercept")
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(coefs.reshape(n_targets, -1).T), coef_name),
        numpy_helper.from_array(intercepts.reshape(1, n_targets), bias_name),
    ]
    mm = namer("multiplied")
    scores = out if regressor else namer("raw_scores")
    nodes = [
        helper.make_node("MatMul", [node.input[0], coef_name], [mm], name=namer("n_matmul")),
        helper.make_node("Add", [mm, bias_name], [scores], name=namer("n_add")),
    ]
    if not regressor:
        nodes.append(_post_transform(node, post, scores, out, namer))
    return nodes, inits


def _linear_regressor_output(node: NodeProto, attrs: dict[str, Any], post: str) -> tuple[int, str]:
    """(number of targets, the output to compute) of a LinearRegressor without post-transform."""
    if post != "NONE":
        raise GraphNotDifferentiableError(
            f"LinearRegressor {node.name!r} has post_transform={post!r}; only NONE is supported"
        )
    return int(attrs.get("targets", 1)), node.output[0]


def _linear_classifier_output(node: NodeProto, intercepts: np.ndarray, consumed: set[str]) -> tuple[int, str]:
    """(number of score columns, the scores output) of a LinearClassifier whose label output
    nothing reads."""
    n_targets = len(intercepts) if len(intercepts) else 1
    if node.output[0] in consumed:
        raise ValueError(
            f"the label output of LinearClassifier {node.name!r} is used on the path to the "
            "probabilities: cannot rewrite it"
        )
    if n_targets == 1:
        # onnxruntime 1.19 returns [1 - z, z] for post_transform LOGISTIC where the ONNX
        # specification says [s(-z), s(z)]
        raise ValueError(
            f"LinearClassifier {node.name!r} has a single row of coefficients, whose "
            "probabilities onnxruntime and the ONNX specification compute differently; "
            "export with skl2onnx.to_onnx(..., black_op={'LinearClassifier'})"
        )
    return n_targets, node.output[1]


def _post_transform(node: NodeProto, post: str, scores: str, out: str, namer: _Namer) -> NodeProto:
    """The node applying a LinearClassifier's post_transform to its scores."""
    if post == "NONE":
        return helper.make_node("Identity", [scores], [out], name=namer("n_identity"))
    if post == "LOGISTIC":
        return helper.make_node("Sigmoid", [scores], [out], name=namer("n_sigmoid"))
    if post == "SOFTMAX":
        return helper.make_node("Softmax", [scores], [out], name=namer("n_softmax"), axis=-1)
    raise GraphNotDifferentiableError(
        f"LinearClassifier {node.name!r} has post_transform={post!r}; supported: NONE, LOGISTIC, SOFTMAX"
    )


# ---- cutting a classifier at its logits ---------------------------------------------------------------


def _cut_at_logits(model: ModelProto, proba: str, sample: Feeds) -> tuple[ModelProto, str]:
    """The graph whose only output is the logits, and 'sigmoid' or 'softmax'."""
    activation, z = _find_activation(model, proba)
    cut = _select_outputs(model, [z])
    shape = _output_shape(cut, sample)
    if len(shape) == 1:  # [N] scores: one column
        cut = _reshape_output_2d(cut)
    elif len(shape) != 2:
        raise ValueError(f"the scores {z!r} have shape {shape}, expected [N, n_columns]")
    n_cols = 1 if len(shape) == 1 else shape[1]
    namer = _Namer(all_names(cut))
    if activation == "softmax":
        if n_cols < 2:
            raise ValueError(f"the Softmax before {proba!r} has {n_cols} column(s): expected two or more")
        if n_cols == 2:  # binary: softmax([z0, z1])[1] = sigmoid(z1 - z0)
            _append_difference(cut, z, namer)
            return cut, "sigmoid"
        return cut, "softmax"
    # a logistic function on each column
    if n_cols == 1:
        return cut, "sigmoid"
    if n_cols == 2:
        # p1 = s(z1) / (s(z0) + s(z1)): for skl2onnx's [-z, z] that is s(z), otherwise
        # sigmoid(log s(z1) - log s(z0))
        if _slice_antisymmetric_linear(cut, z):
            return cut, "sigmoid"
        logsig = _append_log_sigmoid(cut, z, namer)
        _append_difference(cut, logsig, namer)
        return cut, "sigmoid"
    # one-vs-rest: p_k = s(z_k) / sum_j s(z_j) = softmax(log s(z))_k
    _append_log_sigmoid(cut, z, namer)
    return cut, "softmax"


def _find_activation(model: ModelProto, proba: str) -> tuple[str, str]:
    """The last Softmax, Sigmoid or ``1 / (1 + exp(-z))`` before ``proba``: ('softmax' or
    'sigmoid', its input)."""
    _, nodes = ancestors(model, [proba])
    for idx in sorted(nodes, reverse=True):
        node = model.graph.node[idx]
        if node.domain not in _STANDARD_DOMAINS:
            continue
        if node.op_type == "Softmax":
            axis = int(_attrs(node).get("axis", -1))
            if axis not in (-1, 1):
                raise ValueError(f"Softmax {node.name!r} normalises axis {axis}, expected the last one")
            return "softmax", node.input[0]
        if node.op_type == "Sigmoid":
            return "sigmoid", node.input[0]
        if node.op_type == "Reciprocal":
            z = _match_logistic(model, node)
            if z is not None:
                return "sigmoid", z
    foreign = sorted(
        {
            f"{model.graph.node[i].domain}.{model.graph.node[i].op_type}"
            for i in nodes
            if model.graph.node[i].domain not in _STANDARD_DOMAINS
        }
    )
    if foreign:
        raise GraphNotDifferentiableError(
            f"the probabilities {proba!r} come from operators without a gradient ({', '.join(foreign)}); "
            f"{_supported_message()}"
        )
    raise ValueError(
        f"cannot find the logits of {proba!r}: no Softmax, Sigmoid or 1 / (1 + exp(-z)) computes it "
        "(raw scores are not supported; export probabilities)"
    )


def _match_logistic(model: ModelProto, recip: NodeProto) -> str | None:
    """z when ``recip`` computes 1 / (1 + exp(-z)) (skl2onnx's one-vs-rest SGDClassifier)."""
    producers = _producers(model)
    add = producers.get(recip.input[0])
    if add is None or add.op_type != "Add":
        return None
    exp_in = None
    for a, b in (add.input, reversed(add.input)):
        value = _const_value(model, b)
        if value is not None and np.all(value == 1) and a in producers and producers[a].op_type == "Exp":
            exp_in = producers[a].input[0]
    if exp_in is None or exp_in not in producers:
        return None
    neg = producers[exp_in]
    if neg.op_type == "Neg":
        return str(neg.input[0])
    if neg.op_type == "Mul":
        for a, b in (neg.input, reversed(neg.input)):
            value = _const_value(model, b)
            if value is not None and np.all(value == -1):
                return str(a)
    return None


def _slice_antisymmetric_linear(model: ModelProto, z: str) -> bool:
    """When ``z = h @ W + b`` with W [F, 2], b [..., 2] initializers whose columns are [-w, w]
    and [-c, c], keep the second columns (in place): z becomes the binary logit [N, 1]."""
    producers = _producers(model)
    add = producers.get(z)
    if add is None or add.op_type != "Add":
        return False
    inits = {i.name: i for i in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for mm_out, bias in (add.input, reversed(add.input)):
        mm = producers.get(mm_out)
        if bias not in inits or mm is None or mm.op_type != "MatMul" or mm.input[1] not in inits:
            continue
        wname = mm.input[1]
        if uses.get(wname) != 1 or uses.get(bias) != 1:
            return False
        W = numpy_helper.to_array(inits[wname])
        b = numpy_helper.to_array(inits[bias])
        if W.ndim != 2 or W.shape[1] != 2 or b.shape[-1:] != (2,):
            return False
        if not (np.array_equal(W[:, 0], -W[:, 1]) and np.array_equal(b[..., 0], -b[..., 1])):
            return False
        inits[wname].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(W[:, 1:]), wname))
        inits[bias].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(b[..., 1:]), bias))
        return True
    return False


def _append_log_sigmoid(model: ModelProto, z: str, namer: _Namer) -> str:
    """log sigmoid(z) = -(relu(-z) + log(1 + exp(-|z|))): the new output of ``model``."""
    c_one, one = _constant(namer, np.array(1.0, dtype=np.float32), "one")
    n = {k: namer(f"logsig_{k}") for k in ("neg", "relu", "abs", "nabs", "exp", "exp1", "log", "sp", "out")}
    model.graph.node.extend(
        [
            c_one,
            helper.make_node("Neg", [z], [n["neg"]], name=namer("n_logsig_neg")),
            helper.make_node("Relu", [n["neg"]], [n["relu"]], name=namer("n_logsig_relu")),
            helper.make_node("Abs", [z], [n["abs"]], name=namer("n_logsig_abs")),
            helper.make_node("Neg", [n["abs"]], [n["nabs"]], name=namer("n_logsig_nabs")),
            helper.make_node("Exp", [n["nabs"]], [n["exp"]], name=namer("n_logsig_exp")),
            helper.make_node("Add", [n["exp"], one], [n["exp1"]], name=namer("n_logsig_add")),
            helper.make_node("Log", [n["exp1"]], [n["log"]], name=namer("n_logsig_log")),
            helper.make_node("Add", [n["relu"], n["log"]], [n["sp"]], name=namer("n_logsig_sp")),
            helper.make_node("Neg", [n["sp"]], [n["out"]], name=namer("n_logsig_out")),
        ]
    )
    _set_single_output(model, n["out"])
    return n["out"]


def _append_difference(model: ModelProto, z: str, namer: _Namer) -> str:
    """z[:, 1:2] - z[:, 0:1] (as a MatMul with [[-1], [1]]): the new output of ``model``."""
    c_diff, diff = _constant(namer, np.array([[-1.0], [1.0]], dtype=np.float32), "column_difference")
    out = namer("binary_logit")
    model.graph.node.extend(
        [c_diff, helper.make_node("MatMul", [z, diff], [out], name=namer("n_difference"))]
    )
    _set_single_output(model, out)
    return out


def _reshape_output_2d(model: ModelProto) -> ModelProto:
    """A copy where the rank-1 output [N] becomes [N, 1] (same name)."""
    out = model.graph.output[0]
    model = copy_model(model)
    namer = _Namer(all_names(model))
    c_shape, shape = _constant(namer, np.array([-1, 1], dtype=np.int64), "shape_2d")
    flat = namer(f"{out.name}_1d")
    _rename_in_nodes(model, out.name, flat)
    model.graph.node.extend(
        [c_shape, helper.make_node("Reshape", [flat, shape], [out.name], name=namer("n_reshape_2d"))]
    )
    _set_single_output(model, out.name)
    return model


# ---- small graph utilities -------------------------------------------------------------------------------


def _producers(model: ModelProto) -> dict[str, NodeProto]:
    return {out: node for node in model.graph.node for out in node.output if out}


def _const_value(model: ModelProto, name: str) -> np.ndarray | None:
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            attrs = _attrs(node)
            if "value" in attrs:
                return numpy_helper.to_array(attrs["value"])
            for key in ("value_float", "value_int"):
                if key in attrs:
                    return np.asarray(attrs[key])
            for key in ("value_floats", "value_ints"):
                if key in attrs:
                    return np.asarray(list(attrs[key]))
    return None


def _set_single_output(model: ModelProto, name: str) -> None:
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))


def _select_outputs(model: ModelProto, names: Sequence[str]) -> ModelProto:
    """A copy whose outputs are ``names`` (graph outputs or intermediate float tensors) and
    only what they need."""
    model = copy_model(model)
    declared = {o.name: o for o in model.graph.output}
    outs = [declared.get(n) or helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]
    del model.graph.output[:]
    model.graph.output.extend(outs)
    return prune_to_outputs(model, list(names))


def _rename_in_nodes(model: ModelProto, old: str, new: str) -> None:
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new


def _rename(model: ModelProto, old: str, new: str) -> ModelProto:
    """A copy where the value ``old`` is called ``new`` (unchanged when ``new`` is taken)."""
    if old == new or new in all_names(model):
        return model
    model = copy_model(model)
    rename_value(model, old, new)
    return model


def _finalise(model: ModelProto) -> None:
    """Dims [N, n_features] -> [N, n_outputs], no stale shapes, no unused opset, standard
    operators only, and onnx's checker."""
    g = model.graph
    for vi in (g.input[0],):
        vi.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    out = g.output[0]
    dims: list[str | int | None] = [BATCH_DIM, None]
    inferred = _infer_output_dims(model)
    if inferred is not None:
        dims = [BATCH_DIM, inferred]
    g.output[0].CopyFrom(helper.make_tensor_value_info(out.name, TensorProto.FLOAT, dims))
    del g.value_info[:]
    blocking = [n for n in g.node if n.domain not in _STANDARD_DOMAINS]
    if blocking:
        ops = ", ".join(sorted({f"{n.domain}.{n.op_type}" for n in blocking}))
        raise GraphNotDifferentiableError(
            f"operators without a gradient on the path to the output: {ops} (of ai.onnx.ml, only "
            f"Scaler, LinearRegressor and LinearClassifier are rewritten); {_supported_message()}"
        )
    used = {n.domain for n in g.node} | {""}
    keep = [op for op in model.opset_import if op.domain in used or op.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    onnx.checker.check_model(model)


def _infer_output_dims(model: ModelProto) -> int | None:
    """The output's width from the graph's shapes, not from its declaration: skl2onnx declares
    ``[None, 1]`` for a multi-output MLPRegressor whose graph gives ``[N, 3]``."""
    undeclared = ModelProto()
    undeclared.CopyFrom(model)
    undeclared.graph.output[0].type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(undeclared, strict_mode=False)
    except Exception:
        return None
    name = model.graph.output[0].name
    for vi in [*inferred.graph.output, *inferred.graph.value_info]:
        if vi.name == name:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 2 and dims[1].HasField("dim_value"):
                return int(dims[1].dim_value)
    return None


# ---- numeric checks with onnxruntime -------------------------------------------------------------------


def _run(model: ModelProto, feeds: Feeds) -> np.ndarray:
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.log_severity_level = 3
    sess = onnxruntime.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, feeds)
    return np.asarray(out)


def _output_shape(model: ModelProto, sample: Feeds) -> tuple[int, ...]:
    return tuple(int(d) for d in _run(model, sample).shape)


def _check_outputs(
    model: ModelProto, sample: Feeds, reference: np.ndarray, kind: str, probability: str | None
) -> None:
    """The trainable graph computes what the original one did (the probabilities from the
    logits for a classifier)."""
    got = _run(model, sample).astype(np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if kind == "regressor":
        ref = ref.reshape(got.shape)
        scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
        if not np.allclose(got, ref, rtol=_REG_RTOL, atol=_REG_RTOL * scale):
            raise ValueError("the trainable graph does not reproduce the model's prediction")
        return
    ref = ref.reshape(_n_rows(sample), -1)
    expected = probabilities(got)
    if ref.shape[1] == 1 and probability == "sigmoid":  # a graph giving P(class 1) only
        expected = expected[:, 1:]
    if expected.shape != ref.shape or not np.allclose(expected, ref, rtol=0, atol=_PROBA_ATOL):
        raise ValueError(
            f"the {probability} of the logits found in the graph does not reproduce its probabilities"
        )
