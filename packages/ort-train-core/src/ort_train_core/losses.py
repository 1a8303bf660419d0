"""Losses and penalties of the math contract (DESIGN.md), each written once as ONNX nodes.

``add_loss_output`` puts them inside a graph for the fused loop; the partial loop runs the same
nodes as small standalone graphs. A loss emits the per-row loss ``l_i`` (shape ``[N]``); the
reduction with sample weights is shared (:func:`reduce_rows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from ._builder import NodeBuilder
from ._params import ParamsMixin


class BaseLearningLoss(ParamsMixin):
    """A loss between a prediction ``f`` and a target ``y``, summed over output columns."""

    #: the label is an integer class index (int64, shape [N]) rather than a float target
    integer_labels = False

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        raise NotImplementedError

    def validate(self) -> None:
        """Raises ValueError on parameters out of range (called at fit time)."""

    def label_shape(self, pred_shape: list[Any]) -> list[Any]:
        return ["N"] if self.integer_labels else ["N", *pred_shape[1:]]

    def label_elem_type(self, pred_elem_type: int) -> int:
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
    """l = sum_k (f - y)^2."""

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        return b.op("Mul", [diff, diff], "sq")


class AbsoluteLearningLoss(_ElementwiseLoss):
    """``l = sum_k |f - y|``."""

    def element_loss(self, b: NodeBuilder, diff: str) -> str:
        return b.op("Abs", [diff], "abs")


class ElasticLearningLoss(_ElementwiseLoss):
    """``l = sum_k (l1_weight |d| + l2_weight d^2)``."""

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
    if len(pred_shape) <= 1:
        return 1
    if len(pred_shape) != 2:
        raise ValueError(f"classification losses need a prediction of rank 1 or 2, got shape {pred_shape}")
    return pred_shape[1]


def _float_label_like(b: NodeBuilder, label: str, pred_shape: list[int | None]) -> str:
    """An integer 0/1 label cast to float and shaped like a one-column prediction."""
    y = b.cast(label, hint="label_float")
    if len(pred_shape) == 2:
        y = b.op("Unsqueeze", [y, b.int_const([1])], "label_col")
    return y


def _one_hot(b: NodeBuilder, label: str, n_cols: int) -> str:
    depth = b.int_const([n_cols], "depth")
    if b.elem_type == TensorProto.FLOAT:
        values = b.const([0.0, 1.0], "onehot_values")
        return b.op("OneHot", [label, depth, values], "onehot", axis=-1)
    # onnxruntime has OneHot kernels for float, int64 and int32 values only (none for double):
    # build the 0/1 matrix in float and cast it, which is exact
    values = b.const([0.0, 1.0], "onehot_values", dtype=np.float32)
    hot = b.op("OneHot", [label, depth, values], "onehot_f32", axis=-1)
    return b.cast(hot, hint="onehot")


class NegLogLearningLoss(BaseLearningLoss):
    """l = -log p, p the probability of the true class clipped to [eps, 1 - eps].

    One column holds the probability of class 1. In the partial loop, ``probability_function``
    ('sigmoid', 'softmax' or 'none') turns raw scores into probabilities first.
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
        n_cols = _n_columns(pred_shape)
        if self.probability_function == "sigmoid":
            pred = b.op("Sigmoid", [pred], "proba")
        elif self.probability_function == "softmax":
            pred = b.op("Softmax", [pred], "proba", axis=1)
        p = b.op("Clip", [pred, b.const(self.eps, "eps"), b.const(1.0 - self.eps, "one_m_eps")], "p")
        if n_cols == 1:
            y = _float_label_like(b, label, pred_shape)
            one_m_y = b.op("Sub", [b.const(1.0, "one"), y], "one_m_y")
            one_m_p = b.op("Sub", [b.const(1.0, "one"), p], "one_m_p")
            pt = b.op("Add", [b.op("Mul", [y, p]), b.op("Mul", [one_m_y, one_m_p])], "p_true")
            return _sum_columns(b, b.op("Neg", [b.op("Log", [pt])], "nll"), pred_shape)
        if n_cols is None:
            raise ValueError("the 'log' loss needs the number of classes (the prediction's dim 1)")
        pt = b.reduce("ReduceSum", b.op("Mul", [_one_hot(b, label, n_cols), p]), [1], 0, "p_true")
        return b.op("Neg", [b.op("Log", [pt])], "nll")


class CrossEntropyLearningLoss(BaseLearningLoss):
    """Cross-entropy on logits z: one column softplus(z) - y z, several logsumexp(z) - z_y
    (both as -log_softmax(logits)[y], the one column as the logits [0, z])."""

    integer_labels = True

    def row_loss(self, b: NodeBuilder, pred: str, label: str, pred_shape: list[int | None]) -> str:
        n_cols = _n_columns(pred_shape)
        if n_cols == 1:
            # binary: the two-class softmax of logits [0, z], whose gradient sigmoid(z) - y is
            # smooth everywhere (max(z, 0) + log(1 + exp(-|z|)) has a kink at z = 0, where SGD
            # from zero weights starts)
            z = pred if len(pred_shape) == 2 else b.op("Unsqueeze", [pred, b.int_const([1])], "logit_col")
            zeros = b.op("Sub", [z, z], "zero_logit")
            pred, n_cols = b.op("Concat", [zeros, z], "binary_logits", axis=1), 2
        if n_cols is None:
            raise ValueError("'cross_entropy' needs the number of classes (the prediction's dim 1)")
        logp = b.op("LogSoftmax", [pred], "log_softmax", axis=1)
        picked = b.reduce("ReduceSum", b.op("Mul", [_one_hot(b, label, n_cols), logp]), [1], 0)
        return b.op("Neg", [picked], "ce")


LOSSES: dict[str, type[BaseLearningLoss]] = {
    "squared_error": SquareLearningLoss,
    "square_error": SquareLearningLoss,
    "l2": SquareLearningLoss,
    "absolute_error": AbsoluteLearningLoss,
    "l1": AbsoluteLearningLoss,
    "elastic": ElasticLearningLoss,
    "log": NegLogLearningLoss,
    "cross_entropy": CrossEntropyLearningLoss,
}


def make_loss(loss: str | BaseLearningLoss, **kwargs: Any) -> BaseLearningLoss:
    """A loss object from a name of DESIGN.md (with its keyword arguments) or an instance."""
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
    """L = sum_i s_i l_i / sum_i s_i ('mean'), sum_i s_i l_i ('sum'), or sum_i s_i l_i / n
    ('row_mean': each row's step scales with its weight, as per-sample SGD weighs samples; in a
    batch of one row, 'mean' would cancel the weight)."""
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
    return b.op("Div", [total, b.sum_all(weight, "weight_sum")], "data_loss")


class BaseLearningPenalty(ParamsMixin):
    """A penalty on weights added to the objective."""

    def penalty_nodes(self, b: NodeBuilder, weight: str) -> str | None:
        raise NotImplementedError

    def validate(self) -> None:
        pass


class NoLearningPenalty(BaseLearningPenalty):
    def penalty_nodes(self, b: NodeBuilder, weight: str) -> str | None:
        return None


class ElasticLearningPenalty(BaseLearningPenalty):
    """``P = l1 * sum |W| + l2 * sum W^2`` for each penalised weight."""

    def __init__(self, l1: float = 0.5, l2: float = 0.5) -> None:
        self.l1 = l1
        self.l2 = l2

    def validate(self) -> None:
        if not (self.l1 >= 0 and self.l2 >= 0):
            raise ValueError(f"penalty coefficients l1 and l2 must be >= 0, got {self.l1}, {self.l2}")

    def penalty_nodes(self, b: NodeBuilder, weight: str) -> str | None:
        return penalty_term(b, weight, self.l1, self.l2)


def penalty_term(b: NodeBuilder, weight: str, l1: float, l2: float) -> str | None:
    """l1 * sum|W| + l2 * sum W^2 as a scalar, or None when both coefficients are zero."""
    parts = []
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
