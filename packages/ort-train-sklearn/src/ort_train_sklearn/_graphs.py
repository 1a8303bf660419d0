"""ONNX graphs the estimators train and ship: dense layers from numpy weights, and the
classifier head on top of trained logits, in ONNX (probabilities and label, deployed) and in
numpy (the probabilities predict_proba returns and the conversion checks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ort_train_core.graph import MAX_IR_VERSION

OPSET = 17
ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid", "identity": None}


def copy_model(model: ModelProto) -> ModelProto:
    """A copy of ``model`` the caller may change (protobuf's CopyFrom, faster than deepcopy)."""
    out = ModelProto()
    out.CopyFrom(model)
    return out


def layer_names(n_layers: int) -> list[tuple[str, str]]:
    """(coefficient, intercept) initializer names of each dense layer, in order.

    Parameters
    ----------
    n_layers : int
        The number of dense layers.

    Returns
    -------
    list of (str, str)
        The names of each layer's weights.
    """
    return [(f"coefficient{i}", f"intercept{i}") for i in range(n_layers)]


def dense_graph(
    coefs: Sequence[np.ndarray], intercepts: Sequence[np.ndarray], activation: str = "identity"
) -> ModelProto:
    """X -> (X W0 + b0) -> act -> ... -> X Wn + bn: the raw output (scores or logits).

    Parameters
    ----------
    coefs : sequence of ndarray
        The coefficient matrix of each layer, of shape (fan_in, fan_out).
    intercepts : sequence of ndarray
        The intercept vector of each layer.
    activation : {'identity', 'relu', 'tanh', 'logistic'}, default='identity'
        The activation after each layer but the last.

    Returns
    -------
    onnx.ModelProto
        Input ``X`` [N, n_features], output ``raw`` [N, n_outputs], float32 weights named by
        :func:`layer_names`.
    """
    nodes = []
    inits = []
    current = "X"
    n_layers = len(coefs)
    for i, ((wname, bname), W, b) in enumerate(zip(layer_names(n_layers), coefs, intercepts)):
        inits += [
            numpy_helper.from_array(np.asarray(W, dtype=np.float32), wname),
            numpy_helper.from_array(np.asarray(b, dtype=np.float32).reshape(-1), bname),
        ]
        nodes.append(helper.make_node("MatMul", [current, wname], [f"mm{i}"]))
        last = i == n_layers - 1
        out = "raw" if last else f"z{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", bname], [out]))
        op = ACTIVATIONS[activation]
        if not last and op is not None:
            nodes.append(helper.make_node(op, [out], [f"a{i}"]))
            out = f"a{i}"
        current = out
    n_in = int(np.asarray(coefs[0]).shape[0])
    n_out = int(np.asarray(coefs[-1]).shape[1])
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_in])],
        [helper.make_tensor_value_info("raw", TensorProto.FLOAT, [None, n_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = MAX_IR_VERSION
    return model


#: how a classifier's decision values become its second output: 'softmax' (multinomial
#: logits; one column is the logit of classes[1]), 'ovr_logistic' (one-vs-rest logits:
#: sigmoids normalised per row), 'modified_huber' ((clip(d, -1, 1) + 1) / 2 normalised) or
#: 'decision' (the decision values themselves, output 'scores': no probability model),
#: 'multilabel' (a sigmoid per label; the label output is the int64 indicator matrix p > 0.5)
HEAD_KINDS = ("softmax", "ovr_logistic", "modified_huber", "decision", "multilabel")


def _binary_pair(nodes: list[Any], g: Any, p1: str, out: str, negate: bool = False) -> None:
    """[1 - p1, p1] (or [-d, d] with ``negate``) as ``out``."""
    if negate:
        nodes.append(helper.make_node("Neg", [p1], ["head_p0"]))
    else:
        nodes.append(helper.make_node("Sub", ["head_one", p1], ["head_p0"]))
        g.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), "head_one"))
    nodes.append(helper.make_node("Concat", ["head_p0", p1], [out], axis=1))


def _head_nodes(g: Any, output: str, n_cols: int, kind: str) -> tuple[list[Any], str]:
    nodes: list[Any] = []
    name = "scores" if kind == "decision" else "probabilities"
    if kind == "decision":
        if n_cols == 1:
            _binary_pair(nodes, g, output, name, negate=True)
        else:
            nodes.append(helper.make_node("Identity", [output], [name]))
        return nodes, name
    if kind == "softmax" and n_cols > 1:
        nodes.append(helper.make_node("Softmax", [output], [name], axis=1))
        return nodes, name
    if kind == "modified_huber":
        g.initializer.extend(
            [
                numpy_helper.from_array(np.array(v, dtype=np.float32), n)
                for v, n in ((-1, "head_m1"), (0.5, "head_half"))
            ]
        )
        nodes += [
            helper.make_node("Clip", [output, "head_m1", "head_one_c"], ["head_clip"]),
            helper.make_node("Add", ["head_clip", "head_one_c"], ["head_shift"]),
            helper.make_node("Mul", ["head_shift", "head_half"], ["head_p"]),
        ]
        g.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), "head_one_c"))
    elif n_cols > 1:
        # sigmoids normalised per row are the softmax of the log-sigmoids, -softplus(-d): in
        # float32 the sigmoids of a row of large negative decision values underflow to 0 (and
        # their ratios with them), the softmax keeps them
        nodes += [
            helper.make_node("Neg", [output], ["head_neg"]),
            helper.make_node("Softplus", ["head_neg"], ["head_softplus"]),
            helper.make_node("Neg", ["head_softplus"], ["head_log_sigmoid"]),
            helper.make_node("Softmax", ["head_log_sigmoid"], [name], axis=1),
        ]
        return nodes, name
    else:  # a sigmoid
        nodes.append(helper.make_node("Sigmoid", [output], ["head_p"]))
    if n_cols == 1:
        _binary_pair(nodes, g, "head_p", name)
        return nodes, name
    # normalised per row; a row of zeros (modified Huber) becomes uniform, as scikit-learn's
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], dtype=np.int64), "head_axis"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "head_zero"),
            numpy_helper.from_array(np.array(1.0 / n_cols, dtype=np.float32), "head_uniform"),
        ]
    )
    nodes += [
        helper.make_node("ReduceSum", ["head_p", "head_axis"], ["head_sum"], keepdims=1),
        helper.make_node("Equal", ["head_sum", "head_zero"], ["head_none"]),
        helper.make_node("Div", ["head_p", "head_sum"], ["head_norm"]),
        helper.make_node("Where", ["head_none", "head_uniform", "head_norm"], [name]),
    ]
    return nodes, name


def _multilabel_head(out: ModelProto, output: str, n_labels: int) -> ModelProto:
    """'label' (int64 indicators, logit > 0) and 'probabilities' (a sigmoid per label)."""
    g = out.graph
    g.initializer.append(numpy_helper.from_array(np.array(0.0, dtype=np.float32), "head_zero"))
    g.node.extend(
        [
            helper.make_node("Sigmoid", [output], ["probabilities"]),
            helper.make_node("Greater", [output, "head_zero"], ["head_on"]),
            helper.make_node("Cast", ["head_on"], ["label"], to=TensorProto.INT64),
        ]
    )
    del g.output[:]
    g.output.extend(
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None, n_labels]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, n_labels]),
        ]
    )
    onnx.checker.check_model(out)
    return out


def classifier_head(model: ModelProto, output: str, classes: np.ndarray, kind: str = "softmax") -> ModelProto:
    """Appends probabilities (or scores) and the label (classes[argmax]) to a graph of decision
    values; outputs 'label' then 'probabilities' ('scores' for ``kind='decision'``), as
    skl2onnx does.

    Parameters
    ----------
    model : onnx.ModelProto
        The logits graph; it is not modified.
    output : str
        Its logits (decision values) output.
    classes : ndarray of shape (n_classes,)
        The labels, in the order of the probability columns.
    kind : {'softmax', 'ovr_logistic', 'modified_huber', 'decision'}, default='softmax'
        How decision values become probabilities (:data:`HEAD_KINDS`).

    Returns
    -------
    onnx.ModelProto
        The deployable classifier.
    """
    if kind not in HEAD_KINDS:
        raise ValueError(f"kind must be one of {HEAD_KINDS}, got {kind!r}")
    out = copy_model(model)
    g = out.graph
    if kind == "multilabel":
        return _multilabel_head(out, output, len(classes))
    n_cols = 1 if len(classes) == 2 else len(classes)
    nodes, second = _head_nodes(g, output, n_cols, kind)
    # the label from the decision values, as predict: probabilities saturate in float32 (two
    # classes at 1.0, clipped modified Huber scores) and their ArgMax would break the tie
    if n_cols == 1:
        g.initializer.append(numpy_helper.from_array(np.array(0.0, dtype=np.float32), "head_threshold"))
        g.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "head_column"))
        nodes += [
            helper.make_node("Greater", [output, "head_threshold"], ["head_positive"]),
            helper.make_node("Squeeze", ["head_positive", "head_column"], ["head_positive_1d"]),
            helper.make_node("Cast", ["head_positive_1d"], ["head_index"], to=TensorProto.INT64),
        ]
    else:
        nodes.append(helper.make_node("ArgMax", [output], ["head_index"], axis=1, keepdims=0))
    cls, label_type = _class_table(classes)
    g.initializer.append(cls)
    nodes.append(helper.make_node("Gather", ["head_classes", "head_index"], ["label"], axis=0))
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend(
        [
            helper.make_tensor_value_info("label", label_type, [None]),
            helper.make_tensor_value_info(second, TensorProto.FLOAT, [None, len(classes)]),
        ]
    )
    onnx.checker.check_model(out)
    return out


def _class_table(classes: np.ndarray) -> tuple[onnx.TensorProto, int]:
    """The initializer 'head_classes' the label is gathered from, and its element type: int64,
    bool, double or string labels, as skl2onnx writes them."""
    if classes.dtype.kind in "iu":
        return numpy_helper.from_array(classes.astype(np.int64), "head_classes"), TensorProto.INT64
    if classes.dtype.kind == "b":
        return numpy_helper.from_array(classes.astype(np.bool_), "head_classes"), TensorProto.BOOL
    if classes.dtype.kind == "f":
        return numpy_helper.from_array(classes.astype(np.float64), "head_classes"), TensorProto.DOUBLE
    names = np.array([str(c) for c in classes], dtype=object)
    return numpy_helper.from_array(names, "head_classes"), TensorProto.STRING


def probabilities(logits: np.ndarray, log: bool = False) -> np.ndarray:
    """The softmax of the logits in float64, one column per class: a binary model's one
    logit z is the pair [0, z], so its columns are [1 - sigmoid(z), sigmoid(z)].

    Parameters
    ----------
    logits : ndarray of shape (n_samples, 1) or (n_samples, n_classes)
        The logits.
    log : bool, default=False
        Whether to return the log-softmax instead, finite where a probability rounds to 0.

    Returns
    -------
    ndarray of shape (n_samples, n_classes)
        Probabilities (or their logarithms) in float64.
    """
    # float32 logits are exact in float64; an inf (an overflowed float32 sum) becomes the
    # largest float32 so that the differences below stay numbers instead of NaN
    bound = float(np.finfo(np.float32).max)
    z = np.clip(np.asarray(logits, dtype=np.float64), -bound, bound)
    if z.shape[1] == 1:
        z = np.column_stack([np.zeros(len(z)), z])
    # minus each row's largest, so that exp() cannot overflow
    shifted = z - z.max(axis=1, keepdims=True)
    if log:
        out: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return out
    e = np.exp(shifted)
    proba: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return proba


def ovr_probabilities(decision: np.ndarray, kind: str) -> np.ndarray:
    """scikit-learn's SGDClassifier probabilities from one-vs-rest decision values, in float64:
    the sigmoid of each column (``'ovr_logistic'``, log_loss) or ``(clip(d, -1, 1) + 1) / 2``
    (``'modified_huber'``), normalised per row (a row of zeros becomes uniform; the sigmoids
    through the softmax of their logarithms, which stays finite where they underflow); a binary
    model's one column ``p`` is the pair ``[1 - p, p]``.

    Parameters
    ----------
    decision : ndarray of shape (n_samples, 1) or (n_samples, n_classes)
        The decision values.
    kind : {'ovr_logistic', 'modified_huber'}
        The probability model.

    Returns
    -------
    ndarray of shape (n_samples, n_classes)
        Probabilities.
    """
    d = np.asarray(decision, dtype=np.float64)
    if kind != "modified_huber" and d.shape[1] > 1:
        # the normalised sigmoids as the softmax of the log-sigmoids (the graph's formula): the
        # same values, and no 0 / 0 where every sigmoid of a row underflows
        return probabilities(-np.logaddexp(0.0, -d))
    p = (np.clip(d, -1, 1) + 1) / 2 if kind == "modified_huber" else 0.5 * (1 + np.tanh(d / 2))
    if p.shape[1] == 1:
        return np.column_stack([1 - p[:, 0], p[:, 0]])
    total = p.sum(axis=1, keepdims=True)
    out: np.ndarray = np.where(total == 0, 1.0 / p.shape[1], p / np.where(total == 0, 1, total))
    return out


def with_float_type(model: ModelProto, dtype: Any) -> ModelProto:
    """The model taking and returning ``dtype`` (float32 or float64) where it takes and returns
    float32: a float64 graph casts its inputs to float32 and its float outputs back (the
    computation stays float32), as scikit-learn predicts float64 for float64 X."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return model
    if dtype != np.float64:
        raise ValueError(f"dtype must be numpy.float32 or numpy.float64, got {dtype}")
    out = copy_model(model)
    g = out.graph
    inits = {i.name for i in g.initializer}
    head, tail = [], []
    inputs = [(v, True) for v in g.input if v.name not in inits]
    for vi, is_input in [*inputs, *((v, False) for v in g.output)]:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = f"{vi.name}_float32"
        for node in g.node:  # the float32 value keeps flowing inside under a new name
            node.input[:] = [inner if n == vi.name else n for n in node.input]
            node.output[:] = [inner if n == vi.name else n for n in node.output]
        if is_input:
            head.append(helper.make_node("Cast", [vi.name], [inner], to=TensorProto.FLOAT))
        else:
            tail.append(helper.make_node("Cast", [inner], [vi.name], to=TensorProto.DOUBLE))
        vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    nodes = [*head, *g.node, *tail]
    del g.node[:]
    g.node.extend(nodes)
    return out
