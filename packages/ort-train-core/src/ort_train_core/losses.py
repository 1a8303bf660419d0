"""Losses and penalties of the math contract (DESIGN.md), each written once as ONNX nodes.

``add_loss_output`` puts them inside a graph for the fused loop; the partial loop runs the same
nodes as small standalone graphs. A loss emits the per-row loss ``l_i`` (shape ``[N]``; with
labels per position, the mean of the row's positions); the reduction with sample weights is
shared (:func:`reduce_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from ._builder import NodeBuilder
from ._params import ParamsMixin

#: scikit-learn's SGD clips the derivative of each sample's loss to [-MAX_DLOSS, MAX_DLOSS]
MAX_DLOSS = 1e12


class BaseLearningLoss(ParamsMixin):
    """A loss between a prediction ``f`` and a target ``y``, summed over output columns.

    A subclass writes the per-row loss ``l_i`` once, as ONNX nodes (:meth:`row_loss`); the
    fused loop puts them in its step graph (:func:`~ort_train_core.add_loss_output`), the
    partial loop runs them as a small graph of their own. Subclasses store their constructor
    arguments under the same names (scikit-learn's ``get_params``/``set_params`` protocol).

    A custom loss declares its label by :attr:`integer_labels` and :meth:`label_shape`: the
    graph's label input gets that element type and shape, and ``fit`` checks ``y`` against
    them (integer labels: class indices of that shape; float labels: values of that shape);
    batches slice the label's first axis as they slice the features'.

    Attributes
    ----------
    integer_labels : bool
        True when the label holds integer class indices (int64: shape ``[N]`` for a prediction
        ``[N]`` or ``[N, C]``, one per position ``[N, d1, ...]`` for logits ``[N, C, d1, ...]``)
        rather than a float target shaped like the prediction.
    """

    integer_labels = False

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        """Emits the nodes of the per-row loss.

        Parameters
        ----------
        b : NodeBuilder
            The builder that collects the nodes (element type, opset, unique names).
        pred : str
            The name of the prediction, shape ``pred_shape``.
        label : str
            The name of the label (see :meth:`label_shape` and :meth:`label_elem_type`).
        pred_shape : list of int or None
            The prediction's shape, None for a dimension unknown before run time.

        Returns
        -------
        str
            The name of the per-row loss, shape ``[N]``.
        """
        raise NotImplementedError

    def validate(self) -> None:
        """Raises ValueError when a parameter is out of range; the trainers call it at fit time."""

    def label_shape(self, pred_shape: list[Any]) -> list[Any]:
        """The shape of the label input for a prediction of shape ``pred_shape``.

        A custom loss overrides it to declare another shape (the first dimension stays the
        rows, ``'N'``): ``fit`` then checks ``y`` against it instead of the default.

        Parameters
        ----------
        pred_shape : list
            The prediction's shape (ints, None or symbolic names).

        Returns
        -------
        list
            Integer labels: ``['N', *pred_shape[2:]]``, one class index per row (``['N']``)
            for a prediction of rank 1 or 2, one per position for logits ``[N, C, d1, ...]``
            (the class axis is 1, as torch's ``cross_entropy``). Float labels:
            ``['N', *pred_shape[1:]]``.
        """
        return ["N", *pred_shape[2:]] if self.integer_labels else ["N", *pred_shape[1:]]

    def label_elem_type(self, pred_elem_type: int) -> int:
        """The ONNX element type of the label input.

        Parameters
        ----------
        pred_elem_type : int
            The prediction's ``onnx.TensorProto`` element type.

        Returns
        -------
        int
            ``TensorProto.INT64`` for integer labels, else ``pred_elem_type``.
        """
        return TensorProto.INT64 if self.integer_labels else pred_elem_type


def _sum_columns(b: NodeBuilder, x: str, pred_shape: list[int | None]) -> str:
    """Sums the output columns of a rank-2 prediction; a rank-1 prediction is one column."""
    if len(pred_shape) <= 1:
        return x
    return b.reduce("ReduceSum", x, list(range(1, len(pred_shape))), 0, "row_loss")


class _ElementwiseLoss(BaseLearningLoss):
    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        raise NotImplementedError

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        diff = b.op("Sub", [pred, label], "diff")
        return _sum_columns(b, self.element_loss(b, diff), pred_shape)


class SquareLearningLoss(_ElementwiseLoss):
    """Squared error ``l = sum_k (f - y)^2`` (the name ``'square_error'``).

    It takes no parameter.

    Attributes
    ----------
    integer_labels : bool
        False: the label is a float target shaped like the prediction.
    """

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        return b.op("Mul", [diff, diff], "sq")


class AbsoluteLearningLoss(_ElementwiseLoss):
    """Absolute error ``l = sum_k |f - y|`` (the name ``'absolute_error'``).

    It takes no parameter.

    Attributes
    ----------
    integer_labels : bool
        False: the label is a float target shaped like the prediction.
    """

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        return b.op("Abs", [diff], "abs")


class ElasticLearningLoss(_ElementwiseLoss):
    """Elastic error ``l = sum_k (l1_weight |d| + l2_weight d^2)``, ``d = f - y`` (``'elastic'``).

    Parameters
    ----------
    l1_weight : float, default=0.5
        The weight of the absolute error, >= 0.
    l2_weight : float, default=0.5
        The weight of the squared error, >= 0.

    Attributes
    ----------
    integer_labels : bool
        False: the label is a float target shaped like the prediction.
    """

    def __init__(self, l1_weight: float = 0.5, l2_weight: float = 0.5) -> None:
        self.l1_weight = l1_weight
        self.l2_weight = l2_weight

    def validate(self) -> None:
        if not (self.l1_weight >= 0 and self.l2_weight >= 0):
            raise ValueError(f"l1_weight and l2_weight must be >= 0, got {self.l1_weight}, {self.l2_weight}")

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        a = b.op("Mul", [b.op("Abs", [diff]), b.const(self.l1_weight, "l1_weight")], "l1_part")
        sq = b.op("Mul", [diff, diff], "sq")
        c = b.op("Mul", [sq, b.const(self.l2_weight, "l2_weight")], "l2_part")
        return b.op("Add", [a, c], "elastic")


def _n_columns(pred_shape: list[int | None]) -> int | None:
    """The columns of a prediction of rank 1 or 2 (the margin losses: one decision value per
    class and row)."""
    if len(pred_shape) <= 1:
        return 1
    if len(pred_shape) != 2:
        raise ValueError(
            f"this loss needs a prediction of rank 1 or 2, got shape {pred_shape}; logits with "
            "per-position labels ([N, C, d1, ...] with int64 labels [N, d1, ...]) train with "
            "'cross_entropy' or 'log'"
        )
    return pred_shape[1]


def _n_classes(pred_shape: list[int | None]) -> int | None:
    """The classes of a prediction ``[N]`` (one logit), ``[N, C]`` or ``[N, C, d1, ...]``: the
    class axis is 1, as in torch's ``cross_entropy``."""
    return 1 if len(pred_shape) <= 1 else pred_shape[1]


def _position_mean(b: NodeBuilder, x: str, pred_shape: list[int | None]) -> str:
    """Each row's loss from a per-position loss ``[N, d1, ...]`` (logits ``[N, C, d1, ...]``):
    the mean over the positions, ``l_i = mean_p l_ip``; a per-row loss ``[N]`` as it is."""
    if len(pred_shape) <= 2:
        return x
    return b.reduce("ReduceMean", x, list(range(1, len(pred_shape) - 1)), 0, "row_loss")


def _label_positions(b: NodeBuilder, label: str, pred: str, pred_shape: list[int | None]) -> str:
    """The labels ``[N, d1, ...]``, refused at run time unless their shape is the positions of
    the prediction ``[N, C, d1, ...]``, when a position dimension is unknown before run time
    (``fit`` checks the known ones): labels of another shape would broadcast silently (a
    ``[N, H, 1]`` map against ``[N, C, H, W]`` logits) or mix positions up (``[N, W, H]``)."""
    if len(pred_shape) <= 2 or all(isinstance(d, int) for d in pred_shape[2:]):
        return label
    positions = b.int_const([0, *range(2, len(pred_shape))], "position_axes")
    wanted = b.op("Gather", [b.op("Shape", [pred], "logits_shape"), positions], "logits_positions", axis=0)
    # Max(label shape, wanted) is the label's own shape when they are equal; otherwise it holds
    # more values than the label, and the Reshape fails naming both shapes
    target = b.op("Max", [b.op("Shape", [label], "label_shape"), wanted], "label_shape_checked")
    out = b.name("label_positions")
    node = b.name("labels_must_have_the_shape_of_the_logits_positions")
    b.nodes.append(helper.make_node("Reshape", [label, target], [out], name=node))
    return out


def _float_label_like(b: NodeBuilder, label: str, pred_shape: list[int | None]) -> str:
    """An integer 0/1 label cast to float and shaped like a one-column prediction (the column
    on axis 1: ``[N, 1]``, or ``[N, 1, d1, ...]`` for labels per position)."""
    y = b.cast(label, hint="label_float")
    if len(pred_shape) >= 2:
        y = b.op("Unsqueeze", [y, b.int_const([1])], "label_col")
    return y


def _one_hot(b: NodeBuilder, label: str, n_cols: int) -> str:
    """The 0/1 indicator of the labels ``[N, d1, ...]`` on a class axis 1: ``[N, C, d1, ...]``."""
    depth = b.int_const([n_cols], "depth")
    if b.elem_type == TensorProto.FLOAT:
        values = b.const([0.0, 1.0], "onehot_values")
        return b.op("OneHot", [label, depth, values], "onehot", axis=1)
    # onnxruntime has OneHot kernels for float, int64 and int32 values only (none for double):
    # build the 0/1 matrix in float and cast it, which is exact
    values = b.const([0.0, 1.0], "onehot_values", dtype=np.float32)
    hot = b.op("OneHot", [label, depth, values], "onehot_f32", axis=1)
    return b.cast(hot, hint="onehot")


class NegLogLearningLoss(BaseLearningLoss):
    """Log loss ``l = -log p``, ``p`` the probability of the true class (the name ``'log'``).

    With ``probability_function='sigmoid'`` or ``'softmax'`` it is computed from the scores
    (log-sigmoid, log-softmax): exact at any score, with the gradient ``p - y`` of
    onnxcustom's. With ``'none'`` (probabilities given), ``p`` is clipped to
    ``[eps, 1 - eps]`` first; a row whose true-class probability is under ``eps`` then gives no
    gradient.

    A prediction of one column holds the probability of class 1; one of several columns, a
    probability per class. The label holds class indices (int64). A prediction
    ``[N, C, d1, ...]`` takes labels per position ``[N, d1, ...]`` (class axis 1), each row's
    loss being the mean over its positions, as :class:`CrossEntropyLearningLoss`.

    Parameters
    ----------
    eps : float, default=1e-5
        The clipping bound of probabilities (``probability_function='none'``), in ``(0, 0.5)``.
    probability_function : {'sigmoid', 'softmax', 'none'}, default='sigmoid'
        How the loss turns the prediction into probabilities first: raw scores go through
        ``'sigmoid'`` or ``'softmax'``; ``'none'`` reads probabilities as they are
        (:func:`~ort_train_core.add_loss_output` uses it for ``'log'``).

    Attributes
    ----------
    integer_labels : bool
        True: the label holds class indices (int64, shape ``[N]``, or ``[N, d1, ...]`` for a
        prediction ``[N, C, d1, ...]``).
    """

    integer_labels = True

    def __init__(self, eps: float = 1e-5, probability_function: str = "sigmoid") -> None:
        self.eps = eps
        self.probability_function = probability_function

    def validate(self) -> None:
        if not 0 < self.eps < 0.5:
            raise ValueError(f"eps must be in (0, 0.5), got {self.eps}")
        if self.probability_function not in ("sigmoid", "softmax", "none"):
            raise ValueError(
                "probability_function must be 'sigmoid', 'softmax' or 'none', "
                f"got {self.probability_function!r}"
            )

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        n_cols = _n_classes(pred_shape)
        if self.probability_function == "softmax" or (self.probability_function == "sigmoid" and n_cols == 1):
            # from the scores, as log-softmax: clipping the probability zeroed the gradient of
            # every row whose true-class probability fell under eps (|score| > 11.5 at eps=1e-5),
            # so confidently wrong rows stopped teaching; onnxcustom's gradient was p - y there
            return CrossEntropyLearningLoss().row_loss(b, pred, label, pred_shape)
        if n_cols is None:
            raise ValueError("the 'log' loss needs the number of classes (the prediction's dim 1)")
        label = _label_positions(b, label, pred, pred_shape)
        if self.probability_function == "sigmoid":
            nll = self._sigmoid_per_class(b, pred, label, n_cols)
        else:
            nll = self._clipped(b, pred, label, pred_shape, n_cols)
        return _position_mean(b, nll, pred_shape)

    @staticmethod
    def _sigmoid_per_class(b: NodeBuilder, pred: str, label: str, n_cols: int) -> str:
        """``-log sigmoid(z_y) = -log_softmax([0, z_y])[1]`` per position, ``[N, d1, ...]``."""
        z_true = b.reduce("ReduceSum", b.op("Mul", [_one_hot(b, label, n_cols), pred]), [1], 1, "z_true")
        logp = b.op("LogSoftmax", [_binary_logits(b, z_true)], "log_sigmoid", axis=1)
        column = b.const(np.array(1, dtype=np.int64), "true_column", dtype=np.int64)
        picked = b.op("Gather", [logp, column], "log_p_true", axis=1)
        return b.op("Neg", [picked], "nll")

    def _clipped(
        self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None], n_cols: int
    ) -> str:
        """``-log clip(p_y, eps, 1 - eps)`` per position from probabilities, ``[N, d1, ...]``."""
        p = b.op("Clip", [pred, b.const(self.eps, "eps"), b.const(1.0 - self.eps, "one_m_eps")], "p")
        if n_cols == 1:
            y = _float_label_like(b, label, pred_shape)
            one_m_y = b.op("Sub", [b.const(1.0, "one"), y], "one_m_y")
            one_m_p = b.op("Sub", [b.const(1.0, "one"), p], "one_m_p")
            pt = b.op("Add", [b.op("Mul", [y, p]), b.op("Mul", [one_m_y, one_m_p])], "p_true")
            if len(pred_shape) >= 2:  # the one column, axis 1
                pt = b.reduce("ReduceSum", pt, [1], 0, "p_true_col")
        else:
            pt = b.reduce("ReduceSum", b.op("Mul", [_one_hot(b, label, n_cols), p]), [1], 0, "p_true")
        return b.op("Neg", [b.op("Log", [pt])], "nll")


class CrossEntropyLearningLoss(BaseLearningLoss):
    """Cross-entropy on logits ``z`` (the name ``'cross_entropy'``).

    One column (binary): ``l = softplus(z) - y z``; several: ``l = logsumexp(z) - z_y``. Both
    are computed as ``-log_softmax(logits)[y]``, a single column as the logits ``[0, z]``. The
    label holds class indices (int64). It takes no parameter.

    Per-position labels (segmentation, language models): logits ``[N, C, d1, ...]`` with
    labels ``[N, d1, ...]``, the class axis 1 as in torch's ``cross_entropy``. Each position
    ``p`` of row ``i`` has ``l_ip = logsumexp_c(z_icp) - z_{i y_ip p}`` (one logit channel,
    ``C = 1``: the binary form), and the row's loss is the mean over its ``P = d1 * ...``
    positions, ``l_i = (1 / P) sum_p l_ip``. With sample weights ``s_i`` the batch loss of
    ``reduction='mean'`` is ``L = sum_i s_i l_i / sum_i s_i``: every position of a row weighs
    ``s_i``, and without weights ``L`` is torch's ``cross_entropy(z, y)`` (the mean over every
    position, all rows having ``P`` positions), with them
    ``(cross_entropy(z, y, reduction='none') * s[:, None, ...]).sum() / (P * s.sum())``.
    ``'sum'`` adds the rows' means, ``sum_i s_i l_i``: torch's ``reduction='sum'`` divided
    by ``P``. torch's ``ignore_index`` has no counterpart: negative labels are refused.

    Attributes
    ----------
    integer_labels : bool
        True: the label holds class indices (int64, shape ``[N]``, or ``[N, d1, ...]`` for
        logits ``[N, C, d1, ...]``).
    """

    integer_labels = True

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        n_cols = _n_classes(pred_shape)
        label = _label_positions(b, label, pred, pred_shape)
        if n_cols == 1:
            # binary: the two-class softmax of logits [0, z] (gradient sigmoid(z) - y)
            z = pred if len(pred_shape) >= 2 else b.op("Unsqueeze", [pred, b.int_const([1])], "logit_col")
            pred, n_cols = _binary_logits(b, z), 2
        if n_cols is None:
            raise ValueError("'cross_entropy' needs the number of classes (the prediction's dim 1)")
        logp = b.op("LogSoftmax", [pred], "log_softmax", axis=1)
        picked = b.reduce("ReduceSum", b.op("Mul", [_one_hot(b, label, n_cols), logp]), [1], 0)
        return _position_mean(b, b.op("Neg", [picked], "ce"), pred_shape)


def _binary_logits(b: NodeBuilder, z: str) -> str:
    """The two-class logits ``[0, z]`` of a score column ``z`` ([N, 1]): their log-softmax is
    ``[log(1 - sigmoid(z)), log(sigmoid(z))]``, smooth everywhere (``max(z, 0) + log(1 +
    exp(-|z|))`` has a kink at z = 0, where SGD from zero weights starts)."""
    return b.op("Concat", [b.op("Sub", [z, z], "zero_logit"), z], "binary_logits", axis=1)


def _relu(b: NodeBuilder, x: str, hint: str) -> str:
    return b.op("Relu", [x], hint)


def _cell(b: NodeBuilder, value: float, hint: str) -> str:
    """A ``[1, 1]`` constant for the 2-D tensors of the margin losses: onnxruntime's CPU
    broadcast of a 0-d constant against ``[N, 1]`` walks N spans of one element (about 10 us
    per 1000 rows and node), against ``[1, 1]`` one span."""
    return b.const(np.full((1, 1), value), hint)


def _signed_labels(b: NodeBuilder, label: str, pred_shape: list[int | None]) -> str:
    """Class indices as scikit-learn's SGD targets ``y`` in {-1, +1}, shaped like the
    prediction: one column (binary: +1 for class 1), or one per class (one-vs-rest: +1 in the
    true class's column). One ``Gather`` of the label's row of a constant table: the training
    step runs it every batch, and a cast or one-hot then ``2 y - 1`` took three to four kernels."""
    n_cols = _n_columns(pred_shape)
    if n_cols is None:
        raise ValueError("a one-vs-rest loss needs the number of classes (the prediction's dim 1)")
    return _label_rows(b, label, 2.0 * _indicator_table(n_cols, pred_shape) - 1.0, "y_pm1")


def _indicator_table(n_cols: int, pred_shape: list[int | None]) -> np.ndarray:
    """Row k: the 0/1 target of class k shaped like a prediction row (binary: one column, or
    a scalar for a 1-D prediction; one-vs-rest: the k-th row of the identity)."""
    if n_cols == 1:
        table = np.array([0.0, 1.0])
        return table[:, None] if len(pred_shape) == 2 else table
    return np.eye(n_cols)


def _label_rows(b: NodeBuilder, label: str, table: np.ndarray, hint: str) -> str:
    """Row ``label[i]`` of the constant ``table`` for each row i (labels are checked class
    indices)."""
    return b.op("Gather", [b.const(table, f"{hint}_table"), label], hint, axis=0)


class _MarginLoss(BaseLearningLoss):
    """A loss of the margin ``z = y f`` (``y`` in {-1, +1}), summed over the prediction's
    columns: one logit for two classes, one per class otherwise (one-vs-rest, as scikit-learn's
    SGDClassifier: each column is the binary classifier of its class).

    ``class_weight`` (one value per column, one-vs-rest only) weighs each column's loss on the
    rows of its own class, the other rows by 1: scikit-learn's one-vs-rest class weights (the
    positive samples of each binary problem)."""

    integer_labels = True

    def __init__(self, class_weight: Sequence[float] | None = None) -> None:
        self.class_weight = class_weight

    def margin_loss(self, b: NodeBuilder, z: str) -> str:
        raise NotImplementedError

    def validate(self) -> None:
        if self.class_weight is not None and not all(w >= 0 for w in self.class_weight):
            raise ValueError(f"class_weight must hold values >= 0, got {list(self.class_weight)}")

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        z = b.op("Mul", [_signed_labels(b, label, pred_shape), pred], "margin")
        loss = self.margin_loss(b, z)
        n_cols = _n_columns(pred_shape)
        if self.class_weight is not None:
            if n_cols != len(self.class_weight) or n_cols == 1:
                raise ValueError(
                    f"class_weight has {len(self.class_weight)} values: one-vs-rest needs one per "
                    f"column of the prediction (shape {pred_shape}), and two columns or more"
                )
            # row k: the class weight in column k, 1 in the others
            factors = 1.0 + np.eye(n_cols) * (np.asarray(self.class_weight, dtype=np.float64) - 1.0)
            weight = _label_rows(b, label, factors, "column_weight")
            loss = b.op("Mul", [loss, weight], "weighted_margin_loss")
        return _sum_columns(b, loss, pred_shape)


class HingeLearningLoss(_MarginLoss):
    """Hinge loss ``l = max(0, threshold - y f)`` with ``y`` in {-1, +1} (``'hinge'``; the
    perceptron's is ``threshold=0``, ``'perceptron'``), scikit-learn's SGDClassifier losses.

    Parameters
    ----------
    threshold : float, default=1.0
        The margin below which a sample costs, >= 0.
    class_weight : sequence of float, optional
        One-vs-rest class weights, one per column (see the module's margin losses).

    Attributes
    ----------
    integer_labels : bool
        True: the label is a class index (int64, shape ``[N]``).
    """

    def __init__(self, threshold: float = 1.0, class_weight: Sequence[float] | None = None) -> None:
        self.threshold = threshold
        self.class_weight = class_weight

    def validate(self) -> None:
        super().validate()
        if not self.threshold >= 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")

    def margin_loss(self, b: NodeBuilder, z: str) -> str:
        # h * [h >= 0] rather than Relu(h): scikit-learn steps on a margin equal to the
        # threshold (z <= threshold), and per-sample SGD from zero weights starts there (the
        # perceptron's z = 0); Relu's gradient at 0 would never move the weights. The mask is a
        # comparison, a constant for the gradient.
        h = b.op("Sub", [_cell(b, self.threshold, "threshold"), z], "below")
        active = b.cast(b.op("GreaterOrEqual", [h, _cell(b, 0.0, "zero")], "active_bool"), hint="active")
        return b.op("Mul", [h, active], "hinge")


class SquaredHingeLearningLoss(HingeLearningLoss):
    """Squared hinge ``l = max(0, threshold - y f)^2`` (``'squared_hinge'``), continued by its
    tangent beyond ``h = threshold - y f = MAX_DLOSS / 2`` so that the derivative stops at
    ``MAX_DLOSS`` (1e12), as scikit-learn's SGD clips it.

    Parameters
    ----------
    threshold : float, default=1.0
        The margin below which a sample costs, >= 0.
    class_weight : sequence of float, optional
        One-vs-rest class weights, one per column.

    Attributes
    ----------
    integer_labels : bool
        True: the label is a class index (int64, shape ``[N]``).
    """

    def margin_loss(self, b: NodeBuilder, z: str) -> str:
        h = _relu(b, b.op("Sub", [_cell(b, self.threshold, "threshold"), z]), "hinge")
        # h_c (2 h - h_c), h_c = min(h, c): h^2 up to c, then its tangent, so that the
        # derivative 2 h stops at MAX_DLOSS as scikit-learn clips it (its SGD on the squared
        # hinge runs to margins of 1e13 at the default rates; h^2 would overflow float32)
        clipped = b.op("Min", [h, _cell(b, MAX_DLOSS / 2, "half_max_dloss")], "hinge_clipped")
        twice = b.op("Add", [h, h], "twice_hinge")
        return b.op("Mul", [clipped, b.op("Sub", [twice, clipped])], "squared_hinge")


class ModifiedHuberLearningLoss(_MarginLoss):
    """Modified Huber ``l = max(0, 1 - y f)^2`` for ``y f >= -1``, ``-4 y f`` below
    (``'modified_huber'``), written ``v^2 + 4 max(0, u - 2)`` with ``u = max(0, 1 - y f)``,
    ``v = min(u, 2)``: the same values, a gradient defined everywhere.

    Parameters
    ----------
    class_weight : sequence of float, optional
        One-vs-rest class weights, one per column.

    Attributes
    ----------
    integer_labels : bool
        True: the label is a class index (int64, shape ``[N]``).
    """

    def margin_loss(self, b: NodeBuilder, z: str) -> str:
        u = _relu(b, b.op("Sub", [_cell(b, 1.0, "one"), z]), "hinge")
        excess = _relu(b, b.op("Sub", [u, _cell(b, 2.0, "two")]), "beyond")
        v = b.op("Sub", [u, excess], "hinge_capped")
        linear = b.op("Mul", [excess, _cell(b, 4.0, "four")], "linear_part")
        return b.op("Add", [b.op("Mul", [v, v]), linear], "modified_huber")


class LogisticLearningLoss(_MarginLoss):
    """Binary log loss of each column ``l = sum_k log(1 + exp(-y_k f_k))``, ``y_k`` in
    {-1, +1}: one logistic regression per class (one-vs-rest, scikit-learn's SGDClassifier
    ``loss='log_loss'``); ``'logistic'``. On one column it equals ``'cross_entropy'``. Each
    term is ``-log_softmax([0, y f])[1]``, whose gradient is smooth at ``y f = 0`` where SGD
    from zero weights starts.

    Parameters
    ----------
    class_weight : sequence of float, optional
        One-vs-rest class weights, one per column.

    Attributes
    ----------
    integer_labels : bool
        True: the label is a class index (int64, shape ``[N]``).
    """

    def margin_loss(self, b: NodeBuilder, z: str) -> str:
        col = b.op("Unsqueeze", [z, b.int_const([-1])], "margin_pair")
        pair = b.op("Concat", [b.op("Sub", [col, col], "zero_margin"), col], "pair", axis=-1)
        logp = b.op("LogSoftmax", [pair], "log_pair", axis=-1)
        picked = b.op("Gather", [logp, b.int_const([1], "second")], "log_p", axis=-1)
        return b.op("Neg", [b.op("Squeeze", [picked, b.int_const([-1])])], "logistic")


class BinaryCrossEntropyLearningLoss(BaseLearningLoss):
    """Binary cross-entropy on logits, column by column, with float targets in [0, 1] shaped
    like the prediction (multilabel indicators): ``l = sum_k softplus(z_k) - y_k z_k``
    (``'binary_cross_entropy'``, scikit-learn's MLPClassifier loss for multilabel targets).
    Each term is ``-[1 - y, y] . log_softmax([0, z])``: smooth at ``z = 0``. It takes no
    parameter.

    Attributes
    ----------
    integer_labels : bool
        False: the label is a float target shaped like the prediction.
    """

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        z = b.op("Unsqueeze", [pred, b.int_const([-1])], "logit_pair")
        logp = b.op(
            "LogSoftmax", [b.op("Concat", [b.op("Sub", [z, z]), z], "pair", axis=-1)], "log_pair", axis=-1
        )
        y = b.op("Unsqueeze", [label, b.int_const([-1])], "target_pair")
        weights = b.op("Concat", [b.op("Sub", [b.const(1.0, "one"), y]), y], "target_weights", axis=-1)
        picked = b.reduce("ReduceSum", b.op("Mul", [weights, logp]), [-1], 0, "log_likelihood")
        return _sum_columns(b, b.op("Neg", [picked], "bce"), pred_shape)


class HuberLearningLoss(_ElementwiseLoss):
    """Huber loss ``l = sum_k h(f - y)``, ``h(r) = r^2 / 2`` for ``|r| <= epsilon``,
    ``epsilon |r| - epsilon^2 / 2`` beyond (``'huber'``, scikit-learn's SGDRegressor loss),
    written ``c (|r| - c / 2)`` with ``c = min(|r|, epsilon)``.

    Parameters
    ----------
    epsilon : float, default=0.1
        Where the loss turns from quadratic to linear, > 0.

    Attributes
    ----------
    integer_labels : bool
        False: the label is a float target shaped like the prediction.
    """

    def __init__(self, epsilon: float = 0.1) -> None:
        self.epsilon = epsilon

    def validate(self) -> None:
        # 0 is allowed, as scikit-learn's SGDRegressor allows it: every gradient is then 0
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        a = b.op("Abs", [diff], "abs")
        c = b.op("Sub", [a, _relu(b, b.op("Sub", [a, b.const(self.epsilon, "epsilon")]), "beyond")], "capped")
        half = b.op("Mul", [c, b.const(0.5, "half")], "half_c")
        return b.op("Mul", [c, b.op("Sub", [a, half])], "huber")


class EpsilonInsensitiveLearningLoss(_ElementwiseLoss):
    """Epsilon-insensitive loss ``l = sum_k max(0, |f - y| - epsilon)`` (``'epsilon_insensitive'``),
    squared with ``squared=True`` (``'squared_epsilon_insensitive'``), as scikit-learn's.

    Parameters
    ----------
    epsilon : float, default=0.1
        The error that costs nothing, >= 0.
    squared : bool, default=False
        Whether the excess is squared.

    Attributes
    ----------
    integer_labels : bool
        False: the label is a float target shaped like the prediction.
    """

    def __init__(self, epsilon: float = 0.1, squared: bool = False) -> None:
        self.epsilon = epsilon
        self.squared = squared

    def validate(self) -> None:
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        a = b.op("Abs", [diff], "abs")
        excess = _relu(b, b.op("Sub", [a, b.const(self.epsilon, "epsilon")]), "excess")
        return b.op("Mul", [excess, excess], "sq_excess") if self.squared else excess


def _perceptron(**kwargs: Any) -> BaseLearningLoss:
    return HingeLearningLoss(threshold=0.0, **kwargs)


def _squared_epsilon_insensitive(**kwargs: Any) -> BaseLearningLoss:
    return EpsilonInsensitiveLearningLoss(squared=True, **kwargs)


LOSSES: dict[str, type[BaseLearningLoss]] = {
    "squared_error": SquareLearningLoss,
    "square_error": SquareLearningLoss,
    "l2": SquareLearningLoss,
    "absolute_error": AbsoluteLearningLoss,
    "l1": AbsoluteLearningLoss,
    "elastic": ElasticLearningLoss,
    "log": NegLogLearningLoss,
    "cross_entropy": CrossEntropyLearningLoss,
    "hinge": HingeLearningLoss,
    "logistic": LogisticLearningLoss,
    "binary_cross_entropy": BinaryCrossEntropyLearningLoss,
    "perceptron": _perceptron,  # type: ignore[dict-item]
    "squared_hinge": SquaredHingeLearningLoss,
    "modified_huber": ModifiedHuberLearningLoss,
    "huber": HuberLearningLoss,
    "epsilon_insensitive": EpsilonInsensitiveLearningLoss,
    "squared_epsilon_insensitive": _squared_epsilon_insensitive,  # type: ignore[dict-item]
}


def make_loss(loss: str | BaseLearningLoss, **kwargs: Any) -> BaseLearningLoss:
    """A loss object from its name (with its keyword arguments) or an instance.

    Parameters
    ----------
    loss : str or BaseLearningLoss
        A name of :data:`LOSSES` (``'squared_error'``, ``'square_error'``, ``'l2'``,
        ``'absolute_error'``, ``'l1'``, ``'elastic'``, ``'log'``, ``'cross_entropy'``, and
        scikit-learn's SGD losses ``'hinge'``, ``'perceptron'``, ``'squared_hinge'``,
        ``'modified_huber'``, ``'huber'``, ``'epsilon_insensitive'``,
        ``'squared_epsilon_insensitive'``) or a loss object, returned as it is.
    **kwargs
        The loss's constructor arguments (``l1_weight``, ``eps``...), for a name only.

    Returns
    -------
    BaseLearningLoss
        The loss.

    Raises
    ------
    ValueError
        An unknown name.
    TypeError
        Keyword arguments with a loss object, or arguments the loss does not take.
    """
    if isinstance(loss, BaseLearningLoss):
        if kwargs:
            raise TypeError(f"keyword arguments {sorted(kwargs)} only apply to a loss given by name")
        return loss
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {sorted(LOSSES)} or a BaseLearningLoss")
    try:
        return LOSSES[loss](**kwargs)
    except TypeError as exc:
        raise TypeError(f"loss {loss!r} does not take these arguments {sorted(kwargs)}: {exc}") from exc


REDUCTIONS = ("mean", "sum", "row_mean")


def reduce_rows(b: NodeBuilder, row_loss: str, weight: str | None, reduction: str) -> str:
    """Emits the batch loss from the per-row losses and the sample weights.

    Parameters
    ----------
    b : NodeBuilder
        The builder that collects the nodes.
    row_loss : str
        The name of the per-row loss ``l``, shape ``[N]``.
    weight : str or None
        The name of the sample weights ``s``, shape ``[N]``; None for weights of 1.
    reduction : {'mean', 'sum', 'row_mean'}
        ``L = sum_i s_i l_i / sum_i s_i`` (``'mean'``; 0 for a batch whose weights are all
        0), ``sum_i s_i l_i`` (``'sum'``), or
        ``sum_i s_i l_i / n`` (``'row_mean'``: each row's step scales with its weight, as
        per-sample SGD weighs samples; in a batch of one row, ``'mean'`` would cancel the
        weight).

    Returns
    -------
    str
        The name of the scalar batch loss.

    Raises
    ------
    ValueError
        An unknown ``reduction``.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if weight is None:
        op = "ReduceSum" if reduction == "sum" else "ReduceMean"
        return b.reduce(op, row_loss, [0], 0, "data_loss")
    weighted = b.op("Mul", [row_loss, weight], "weighted_loss")
    if reduction == "row_mean":
        return b.reduce("ReduceMean", weighted, [0], 0, "data_loss")
    total = b.sum_all(weighted)
    if reduction == "sum":
        return total
    # a batch whose weights are all 0 has loss 0 and no gradient (not 0 / 0): the weighted
    # epoch mean gives it no weight either; any positive total is at least the smallest normal
    tiny = np.finfo(helper.tensor_dtype_to_np_dtype(b.elem_type)).tiny
    weight_sum = b.op("Max", [b.sum_all(weight, "weight_sum"), b.const(tiny, "tiny")], "weight_sum_pos")
    return b.op("Div", [total, weight_sum], "data_loss")


class BaseLearningPenalty(ParamsMixin):
    """A penalty on weights added to the objective.

    A subclass writes its term as ONNX nodes (:meth:`penalty_nodes`) and stores its
    constructor arguments under the same names (``get_params``/``set_params``).
    """

    def penalty_nodes(self, b: NodeBuilder, weight: str) -> str | None:
        """Emits the penalty of one weight.

        Parameters
        ----------
        b : NodeBuilder
            The builder that collects the nodes.
        weight : str
            The name of the weight.

        Returns
        -------
        str or None
            The name of the scalar penalty, or None when it is zero.
        """
        raise NotImplementedError

    def validate(self) -> None:
        """Raises ValueError when a parameter is out of range; the trainers call it at fit time."""


class NoLearningPenalty(BaseLearningPenalty):
    """No penalty: the objective is the loss alone. It takes no parameter."""

    def penalty_nodes(self, b: NodeBuilder, weight: str) -> str | None:
        return None


class ElasticLearningPenalty(BaseLearningPenalty):
    """``P = l1 * sum |W| + l2 * sum W^2`` for each penalised weight.

    The gradient of the objective gains ``l1 sign(W) + 2 l2 W``.

    Parameters
    ----------
    l1 : float, default=0.5
        The coefficient of the L1 term, >= 0.
    l2 : float, default=0.5
        The coefficient of the L2 term, >= 0.
    """

    def __init__(self, l1: float = 0.5, l2: float = 0.5) -> None:
        self.l1 = l1
        self.l2 = l2

    def validate(self) -> None:
        if not (self.l1 >= 0 and self.l2 >= 0):
            raise ValueError(f"penalty coefficients l1 and l2 must be >= 0, got {self.l1}, {self.l2}")

    def penalty_nodes(self, b: NodeBuilder, weight: str) -> str | None:
        return penalty_term(b, weight, self.l1, self.l2)


def penalty_term(b: NodeBuilder, weight: str, l1: float, l2: float) -> str | None:
    """Emits ``l1 * sum|W| + l2 * sum W^2`` as a scalar.

    Parameters
    ----------
    b : NodeBuilder
        The builder that collects the nodes.
    weight : str
        The name of the weight ``W``.
    l1, l2 : float
        The coefficients.

    Returns
    -------
    str or None
        The name of the penalty, or None when both coefficients are zero.
    """
    parts = []
    if l1 or l2:
        # the terms of W flattened: their gradients multiply W by scalars, which onnxruntime's
        # CPU kernels broadcast over a [F, 1] weight one element at a time (20x slower than over
        # [1, F] or [F]; a binary linear model of 50 000 features: 1 ms a step). [1, F], not
        # [F]: onnx's shape inference with data propagation (the onnx backend's) holds a 1-D
        # tensor of known length n as n unknown values, about 130 bytes and 0.2 us each at each
        # call (a 784-2000-10 MLP's penalty: +200 MiB and +1.2 s to build its step)
        weight = b.op("Reshape", [weight, b.int_const([1, -1], "pen_flat_shape")], "pen_flat")
    if l1:
        parts.append(b.op("Mul", [b.sum_all(b.op("Abs", [weight])), b.const(l1, "pen_l1")], "pen_l1_term"))
    if l2:
        # W * Identity(W): when nothing else reads W (the partial loop's penalty graph),
        # onnxruntime's gradient builder defines W_grad twice for Mul(W, W)
        square = b.op("Mul", [weight, b.op("Identity", [weight], "pen_w")], "pen_square")
        parts.append(b.op("Mul", [b.sum_all(square), b.const(l2, "pen_l2")], "pen_l2_term"))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else b.op("Add", parts, "penalty")
