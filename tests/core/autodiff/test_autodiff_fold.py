"""The ``onnx`` backend's walk reads the shapes of values whose reshape target an exporter
computes with arithmetic onnx's data propagation does not follow (TorchScript's
``nn.MultiheadAttention``: ``Mod`` of constants as a slice's end): the walk folds that
arithmetic (``autodiff._fold``) before inferring shapes; the gradient equals torch's and float64
finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from autodiff_oracle import Graph, check_against_finite_differences, check_against_torch, rng_for, values
from onnx import helper

I64 = np.int64


def _mod_reshape_graph() -> Graph:
    """``Y = Reshape(X, [Shape(X)[0:Mod(7, 6)], -1])[1]``: the reshape target's length is 2 only
    once ``Mod`` is evaluated; Gather's rule needs the rank of what it reads."""
    nodes = [
        helper.make_node("Shape", ["X"], ["s"]),
        helper.make_node("Mod", ["seven", "six"], ["end"]),
        helper.make_node("Slice", ["s", "zero", "end"], ["lead"]),
        helper.make_node("Concat", ["lead", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["X", "target"], ["Z"]),
        helper.make_node("Gather", ["Z", "one"], ["Y"], axis=0),
    ]
    consts = {
        "seven": np.array([7], I64),
        "six": np.array([6], I64),
        "zero": np.array([0], I64),
        "minus_one": np.array([-1], I64),
        "one": np.array(1, I64),
    }
    x = values(rng_for("fold"), (2, 3, 4))
    return Graph(
        "fold_mod_reshape",
        nodes,
        {"X": x},
        lambda torch, t: [t["X"].reshape(2, 12)[1]],
        consts=consts,
        declared={"Y": (12,)},
    )


def test_reshape_target_through_mod_against_torch() -> None:
    pytest.importorskip("torch")
    check_against_torch(_mod_reshape_graph())


def test_reshape_target_through_mod_against_finite_differences() -> None:
    check_against_finite_differences(_mod_reshape_graph())
