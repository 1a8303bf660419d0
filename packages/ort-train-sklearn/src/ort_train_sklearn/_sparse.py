"""Sparse X for the linear models in O(stored values): the padded-row (ELL) graph.

A CSR matrix's row ``i`` becomes two rows of width ``M`` (the longest row's stored values):
its values then zeros, and their column indices then valid indices (core's
:func:`~ort_train_core.extending.padded_rows` makes them one batch at a time). The linear
model's product ``X W`` is then ``sum_j values[i, j] * W[columns[i, j]]``: a gather of the
batch's rows of ``W`` and a sum, whose gradient scatters into ``W`` (the gather's own
gradient, which both backends differentiate); the penalty and the update of the dense ``W``
are those of the dense path. ``W`` and ``b`` keep their names and shapes: the dense graph
(``coef_``, ``to_onnx()``, checkpoints, averaging) is the same model with the same weights.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper
from sklearn.utils.validation import check_is_fitted

from ort_train_core import cast_checked
from ort_train_core.extending import dense_rows, is_sparse, padded_rows
from ort_train_core.graph import MAX_IR_VERSION, inputs_to_initializers

from . import _base
from ._graphs import OPSET, layer_names

#: the inputs of the padded-row graph: each row's stored values, and their column indices
VALUES, COLUMNS = "X_values", "X_columns"
#: a padded slot costs about this many dense values of a densified batch (a gather, a
#: multiply and a scatter-add against a multiply-add): rows of more than
#: ``n_features / PADDED_SLOT_COST`` slots train faster densified
PADDED_SLOT_COST = 8


class PaddedForm(NamedTuple):
    """How a sparse X is fed to the padded-row graph: slots per row, column index type."""

    width: int
    index_dtype: str


def padded_form(X: Any) -> PaddedForm | None:
    """The padded-row form of a sparse X whose rows are short enough for it to train faster
    than densified batches: ``width`` is its longest row's stored values (at least 1). None
    for a dense X, or for rows longer than ``n_features / PADDED_SLOT_COST``.

    Parameters
    ----------
    X : numpy.ndarray or scipy.sparse CSR matrix
        The rows.

    Returns
    -------
    PaddedForm or None
        The form, or None for the dense path.
    """
    if not is_sparse(X) or X.shape[0] == 0:
        return None
    width = max(1, int(np.diff(X.indptr).max()))
    if width * PADDED_SLOT_COST > X.shape[1]:
        return None
    return PaddedForm(width, np.dtype(X.indices.dtype).name)


def _padded_nodes(coef: str, intercept: str, n_outputs: int) -> tuple[dict[str, list[int]], list[Any]]:
    """:func:`padded_graph`'s constants and nodes, ``raw`` their output."""
    if n_outputs == 1:
        # a 1-D GatherElements: onnxruntime's Gather copies each one-value row of W [F, 1]
        # through a generic block copy, 5x slower
        # b [1] as [1, 1]: onnxruntime 1.19 adds a [1] to [N, 1] element by element (70 us
        # at 5 000 rows), a [1, 1] as a scalar (under 1 us)
        consts = {"ell_flat": [-1], "ell_axis1": [1], "ell_one_by_one": [1, 1]}
        nodes = [
            helper.make_node("Reshape", [intercept, "ell_one_by_one"], ["ell_intercept"]),
            helper.make_node("Reshape", [coef, "ell_flat"], ["ell_coef_flat"]),
            helper.make_node("Reshape", [COLUMNS, "ell_flat"], ["ell_columns_flat"]),
            helper.make_node("GatherElements", ["ell_coef_flat", "ell_columns_flat"], ["ell_w_flat"], axis=0),
            helper.make_node("Shape", [VALUES], ["ell_shape"]),
            helper.make_node("Reshape", ["ell_w_flat", "ell_shape"], ["ell_w"]),
            helper.make_node("Mul", [VALUES, "ell_w"], ["ell_products"]),
            helper.make_node("ReduceSum", ["ell_products", "ell_axis1"], ["ell_sum"], keepdims=1),
        ]
    else:  # rows of W [F, K]: K values per gathered index
        consts = {"ell_axis1": [1], "ell_axis2": [2]}
        nodes = [
            helper.make_node("Gather", [coef, COLUMNS], ["ell_w"], axis=0),
            helper.make_node("Unsqueeze", [VALUES, "ell_axis2"], ["ell_values3"]),
            helper.make_node("Mul", ["ell_values3", "ell_w"], ["ell_products"]),
            helper.make_node("ReduceSum", ["ell_products", "ell_axis1"], ["ell_sum"], keepdims=0),
            helper.make_node("Identity", [intercept], ["ell_intercept"]),
        ]
    nodes.append(helper.make_node("Add", ["ell_sum", "ell_intercept"], ["raw"]))
    return consts, nodes


def padded_graph(model: ModelProto, index_dtype: str = "int64") -> ModelProto:
    """A one-layer :func:`~ort_train_sklearn._graphs.dense_graph` ``raw = X W + b`` on the
    padded-row form of X: inputs ``X_values`` and ``X_columns``, both ``[N, M]``.

    Parameters
    ----------
    model : onnx.ModelProto
        A one-layer ``dense_graph``.
    index_dtype : {'int32', 'int64'}, default='int64'
        The type of the column indices.

    Returns
    -------
    onnx.ModelProto
        ``raw[i] = sum_j X_values[i, j] * W[X_columns[i, j]] + b``.
    """
    coef, intercept = layer_names(1)[0]
    inits = {i.name: i for i in model.graph.initializer}
    n_outputs = int(inits[coef].dims[1])
    consts, nodes = _padded_nodes(coef, intercept, n_outputs)
    index_type = helper.np_dtype_to_tensor_dtype(np.dtype(index_dtype))
    # one named shape for both inputs: the onnx backend's walk then knows the products' two
    # factors have the same shape, and sums no broadcast axes back (a run-time search of them
    # and a ReduceSum copying the [rows, slots] gradient at each step)
    graph = helper.make_graph(
        nodes,
        "padded_rows",
        [
            helper.make_tensor_value_info(VALUES, TensorProto.FLOAT, ["rows", "slots"]),
            helper.make_tensor_value_info(COLUMNS, index_type, ["rows", "slots"]),
        ],
        [helper.make_tensor_value_info("raw", TensorProto.FLOAT, [None, n_outputs])],
        [
            inits[coef],
            inits[intercept],
            *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()),
        ],
    )
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    out.ir_version = MAX_IR_VERSION
    return out


def padded_training_data(X: Any, validation: Any, width: int) -> tuple[Any, Any]:
    """A fit's sparse X as the pair of padded-row arrays its batches are made from, and the
    validation rows' pair made whole (they are scored at once after each epoch).

    Parameters
    ----------
    X : scipy.sparse CSR matrix
        The training rows (float32, or float64 within float32's range: cast batch by batch).
    validation : tuple or None
        (X, y, sample_weight) of the validation rows, or None.
    width : int
        Slots per training row (:func:`padded_form`).

    Returns
    -------
    (tuple, tuple or None)
        ``(values, columns)`` for X; the validation arrays with their X as such a pair.
    """
    pair = padded_rows(X, width, np.float32)
    if validation is None:
        return pair, None
    X_val, *rest = validation
    whole = tuple(dense_rows(a, slice(None)) for a in padded_rows(X_val, dtype=np.float32))
    return pair, (whole, *rest)


def run_padded(session: Any, X: Any) -> list[np.ndarray]:
    """The session's outputs (a :func:`padded_graph`) on a sparse X, in chunks of about
    ``PREDICT_CHUNK_VALUES`` slots, the outputs concatenated.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The padded-row graph's session.
    X : scipy.sparse CSR matrix
        The rows (float32).

    Returns
    -------
    list of numpy.ndarray
        Each output over every row.
    """
    width = max(1, int(np.diff(X.indptr).max()))
    rows = max(1, _base.PREDICT_CHUNK_VALUES // width)  # read at each call: tests shrink it
    parts = []
    values, columns = padded_rows(X, width)
    for start in range(0, X.shape[0], rows):
        chunk = slice(start, start + rows)
        parts.append(
            session.run(None, {VALUES: dense_rows(values, chunk), COLUMNS: dense_rows(columns, chunk)})
        )
    return [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]


class PaddedRowsMixin(_base.OrtEstimatorMixin):
    """A one-layer linear estimator (the SGD ones) that trains and predicts on a sparse X of
    short rows through :func:`padded_graph`, over the weights of its dense graph: ``coef_``,
    ``to_onnx()``, checkpoints and averaging see the dense model as ever. A sparse X of long
    rows (:func:`padded_form`) is densified batch by batch as before."""

    def _fit_arrays(
        self, X: Any, y: Any, sample_weight: Any, first: bool, classes: Any
    ) -> tuple[Any, np.ndarray, np.ndarray | None, int]:
        X, y_enc, sw, n_outputs = super()._fit_arrays(X, y, sample_weight, first, classes)
        #: this fit's padded-row form, None for the dense path
        self._padded_form = padded_form(X)
        #: whether X is sparse (scikit-learn's SGD then damps the intercept's steps)
        self._sparse_fit = is_sparse(X)
        return X, y_enc, sw, n_outputs

    def _fit_input(self, X: Any, given: Any) -> Any:
        if padded_form(X) is None or X.dtype == np.float32:
            return super()._fit_input(X, given)
        # the batches cast their rows as they gather them (padded_rows' dtype): no float32 copy
        # of the stored values, the fit's largest allocation (4 bytes a stored value)
        limit = np.finfo(np.float32).max
        if X.nnz and (X.data.max() > limit or X.data.min() < -limit):
            cast_checked("X", X.data, np.dtype(np.float32))  # refuses them, with its message
        return X

    def _shaping_params(self) -> dict[str, Any]:
        # a trainer of one form cannot take another's data, nor a sparse fit's intercept
        # steps a dense one's: a change rebuilds it
        form = getattr(self, "_padded_form", None)
        return {
            **super()._shaping_params(),
            "_padded_index": None if form is None else form.index_dtype,
            "_sparse_fit": getattr(self, "_sparse_fit", False),
        }

    def _training_form(self, X: Any, validation: Any) -> tuple[Any, Any]:
        form = getattr(self, "_padded_form", None)
        return (X, validation) if form is None else padded_training_data(X, validation, form.width)

    def _training_graph(self, model: ModelProto) -> ModelProto:
        form = getattr(self, "_padded_form", None)
        #: whether the trainer trains the padded-row graph (its get_trained_onnx() is that one)
        self._trains_padded = form is not None
        return model if form is None else padded_graph(model, form.index_dtype)

    def _trained_graph(self) -> ModelProto:
        if not getattr(self, "_trains_padded", False):
            return super()._trained_graph()
        check_is_fitted(self, "_trainer")
        return inputs_to_initializers(self._raw_model, self._trainer.get_state())

    def _session_graph(self, kind: str) -> ModelProto:
        if kind.startswith("padded "):
            return padded_graph(self._trained_graph(), kind.split()[1])
        return super()._session_graph(kind)

    def _outputs(self, kind: str, X: Any) -> list[np.ndarray]:
        form = padded_form(X) if kind == "raw" else None
        if form is None:
            return super()._outputs(kind, X)
        return run_padded(self._session(f"padded {form.index_dtype}", X.shape[0]), X)
