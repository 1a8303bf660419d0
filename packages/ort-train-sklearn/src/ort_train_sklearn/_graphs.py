"""ONNX graphs the estimators train and ship: dense layers from numpy weights, and the
classifier head on top of trained logits, in ONNX (probabilities and label, deployed) and in
numpy (the probabilities predict_proba returns and the conversion checks)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ort_train_core.graph import MAX_IR_VERSION

OPSET = 17
ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid", "identity": None}


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


def classifier_head(model: ModelProto, output: str, classes: np.ndarray) -> ModelProto:
    """Appends probabilities (sigmoid of one logit column, softmax of several) and the label
    (classes[argmax]) to a logits graph; outputs 'label' then 'probabilities', as skl2onnx does.

    Parameters
    ----------
    model : onnx.ModelProto
        The logits graph; it is not modified.
    output : str
        Its logits output.
    classes : ndarray of shape (n_classes,)
        The labels, in the order of the probability columns.

    Returns
    -------
    onnx.ModelProto
        The deployable classifier.
    """
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    n_cols = 1 if len(classes) == 2 else len(classes)
    nodes = []
    if n_cols == 1:
        nodes += [
            helper.make_node("Sigmoid", [output], ["head_p1"]),
            helper.make_node("Sub", ["head_one", "head_p1"], ["head_p0"]),
            helper.make_node("Concat", ["head_p0", "head_p1"], ["probabilities"], axis=1),
        ]
        g.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), "head_one"))
    else:
        nodes.append(helper.make_node("Softmax", [output], ["probabilities"], axis=1))
    nodes.append(helper.make_node("ArgMax", ["probabilities"], ["head_index"], axis=1, keepdims=0))
    if classes.dtype.kind in "iu":
        cls = numpy_helper.from_array(classes.astype(np.int64), "head_classes")
        label_type = TensorProto.INT64
    elif classes.dtype.kind == "b":
        cls = numpy_helper.from_array(classes.astype(np.bool_), "head_classes")
        label_type = TensorProto.BOOL
    elif classes.dtype.kind == "f":
        cls = numpy_helper.from_array(classes.astype(np.float64), "head_classes")
        label_type = TensorProto.DOUBLE
    else:
        cls = numpy_helper.from_array(np.array([str(c) for c in classes], dtype=object), "head_classes")
        label_type = TensorProto.STRING
    g.initializer.append(cls)
    nodes.append(helper.make_node("Gather", ["head_classes", "head_index"], ["label"], axis=0))
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend(
        [
            helper.make_tensor_value_info("label", label_type, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, len(classes)]),
        ]
    )
    onnx.checker.check_model(out)
    return out


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
