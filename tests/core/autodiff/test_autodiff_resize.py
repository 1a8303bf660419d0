"""The ``onnx`` backend's gradient rule of Resize (rules/resize.py): each axis' interpolation
matrix against onnx's reference Resize (every mode, coordinate transformation and nearest
mode, up and down); one-node graphs (1-D to 3-D spatial, scales or sizes, ``axes``,
``keep_aspect_ratio_policy``, Upsample) against torch autograd through F.interpolate where
torch has the form, and against float64 finite differences of onnx's reference evaluator for
all; the repeat form of integer-factor nearest upsampling; the refusals.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnxruntime
import pytest
from autodiff_oracle import (
    Graph,
    build,
    check_against_finite_differences,
    check_against_torch,
    gradient_model,
    rng_for,
    values,
)
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ort_train_core.autodiff.rules.resize import axis_matrix, source_coordinates
from ort_train_core.exceptions import GraphNotDifferentiableError

F32 = np.float32
CASES: list[Graph] = []


def case(
    name: str,
    shape: tuple[int, ...],
    torch_fn: Any,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    opset: int = 19,
    **attrs: Any,
) -> None:
    """One Resize node of X (``shape``) by constant ``scales`` or ``sizes`` (Constant nodes:
    the oracle's initializers take the graph's float type, Resize's scales are float32)."""
    consts = {"roi": np.zeros(0, F32), "scales": np.array(scales or [], F32)}
    if sizes is not None:
        consts["sizes"] = np.array(sizes, np.int64)
    nodes = [
        helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k)) for k, v in consts.items()
    ]
    nodes.append(helper.make_node("Resize", ["X", *consts], ["Y"], name=f"{name}_node", **attrs))
    inputs = {"X": values(rng_for(name), shape)}
    fn = None if torch_fn is None else (lambda t, v: [torch_fn(t, v["X"])])
    CASES.append(Graph(name, nodes, inputs, fn, {}, ["Y"], opset))


def interpolate(mode: str, align_corners: bool | None = None, **kw: Any) -> Any:
    return lambda t, x: t.nn.functional.interpolate(x, mode=mode, align_corners=align_corners, **kw)


# ---- the forms torch has ------------------------------------------------------------------------
# torch 'nearest': asymmetric, floor; 'nearest-exact': half_pixel, round_prefer_ceil
NEAREST = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor", "mode": "nearest"}
EXACT = {
    "coordinate_transformation_mode": "half_pixel",
    "nearest_mode": "round_prefer_ceil",
    "mode": "nearest",
}
case("nearest_2x_2d", (2, 3, 4, 5), interpolate("nearest", scale_factor=2.0), [1, 1, 2, 2], **NEAREST)
case("nearest_3x_1d", (2, 2, 4), interpolate("nearest", scale_factor=3.0), [1, 1, 3], **NEAREST)
case("nearest_2x_3d", (1, 2, 2, 3, 2), interpolate("nearest", scale_factor=2.0), [1, 1, 2, 2, 2], **NEAREST)
case("nearest_sizes_2d", (2, 2, 4, 5), interpolate("nearest", size=(7, 3)), sizes=[2, 2, 7, 3], **NEAREST)
case("nearest_exact_2d", (2, 2, 4, 5), interpolate("nearest-exact", size=(6, 7)), sizes=[2, 2, 6, 7], **EXACT)
case(
    "nearest_exact_down", (1, 2, 6, 5), interpolate("nearest-exact", size=(4, 3)), sizes=[1, 2, 4, 3], **EXACT
)
for mode, torch_mode, shape in [
    ("linear", "linear", (2, 3, 5)),
    ("linear", "bilinear", (2, 2, 4, 5)),
    ("linear", "trilinear", (1, 2, 3, 4, 5)),
]:
    spatial = len(shape) - 2
    for align in (False, True):
        coord = "align_corners" if align else "pytorch_half_pixel"
        up = [s * 2 + 1 for s in shape[2:]]
        fn = interpolate(torch_mode, align, size=tuple(up))
        case(
            f"{torch_mode}_{coord}_up",
            shape,
            fn,
            sizes=[*shape[:2], *up],
            mode=mode,
            coordinate_transformation_mode=coord,
        )
        down = [max(2, s - 2) for s in shape[2:]]  # torch and ONNX differ at size 1
        fn = interpolate(torch_mode, align, size=tuple(down))
        case(
            f"{torch_mode}_{coord}_down",
            shape,
            fn,
            sizes=[*shape[:2], *down],
            mode=mode,
            coordinate_transformation_mode=coord,
        )
    fn = interpolate(torch_mode, False, scale_factor=2.0)
    case(f"{torch_mode}_half_pixel_2x", shape, fn, [1, 1, *([2.0] * spatial)], mode=mode)
case(
    "bilinear_axes",
    (2, 2, 4, 5),
    interpolate("bilinear", False, size=(6, 3)),
    sizes=[6, 3],
    mode="linear",
    axes=[2, 3],
)

# ---- the other forms: finite differences only -------------------------------------------------
for coord, nearest in itertools.product(
    ["half_pixel", "asymmetric", "align_corners", "half_pixel_symmetric"],
    ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
):
    # scale x size exact in float32: onnx.reference's align_corners divides by it, onnxruntime
    # by the output size (the floor of a product like 0.6 x 5 = 3.0000001 tells them apart)
    case(
        f"nearest_{coord}_{nearest}",
        (1, 2, 4, 4),
        None,
        [1, 1, 1.5, 0.75],
        mode="nearest",
        coordinate_transformation_mode=coord,
        nearest_mode=nearest,
    )
for coord in ["half_pixel", "asymmetric", "half_pixel_symmetric"]:
    case(
        f"linear_{coord}_scales",
        (1, 2, 4, 5),
        None,
        [1, 1, 1.7, 0.6],
        mode="linear",
        coordinate_transformation_mode=coord,
    )
for policy in ["not_larger", "not_smaller"]:
    case(
        f"linear_{policy}",
        (1, 2, 4, 6),
        None,
        sizes=[5, 5],
        axes=[2, 3],
        mode="linear",
        keep_aspect_ratio_policy=policy,
    )
case("nearest_default_attributes", (2, 2, 3, 3), None, [1, 1, 2, 2])
case(
    "linear_opset_13",
    (2, 2, 3, 4),
    interpolate("bilinear", False, scale_factor=2.0),
    [1, 1, 2, 2],
    opset=13,
    mode="linear",
)
CASES.append(
    Graph(
        "upsample_opset_9",
        [
            helper.make_node(
                "Constant", [], ["scales"], value=numpy_helper.from_array(np.array([1, 1, 2, 2], F32))
            ),
            helper.make_node("Upsample", ["X", "scales"], ["Y"], mode="nearest"),
        ],
        {"X": values(rng_for("upsample"), (2, 2, 3, 4))},
        lambda t, v: [t.nn.functional.interpolate(v["X"], scale_factor=2.0, mode="nearest")],
        opset=9,
    )
)

case("nearest_2x_large", (1, 2, 3, 64), interpolate("nearest", scale_factor=2.0), [1, 1, 2, 2], **NEAREST)
LARGE = [CASES.pop()]  # against torch only: finite differences of 384 inputs take long

IDS = [g.name for g in CASES]


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_resize_rule_against_finite_differences(graph: Graph) -> None:
    check_against_finite_differences(graph)


@pytest.mark.parametrize("graph", [g for g in CASES + LARGE if g.torch_fn is not None], ids=lambda g: g.name)
def test_resize_rule_against_torch(graph: Graph) -> None:
    pytest.importorskip("torch")
    check_against_torch(graph)


def _unit_responses(mode: str, coord: str, nearest: str, in_size: int, scale: float) -> list[np.ndarray]:
    """What onnxruntime's and onnx.reference's Resize (last axis, by ``scale``) do to the unit
    vectors of the axis: the transposed interpolation matrix, by each."""
    node = helper.make_node(
        "Resize",
        ["X", "", "scales"],
        ["Y"],
        mode=mode,
        coordinate_transformation_mode=coord,
        nearest_mode=nearest,
    )
    graph = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, in_size, in_size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [helper.make_tensor("scales", TensorProto.FLOAT, [3], [1, 1, scale])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    feeds = {"X": np.eye(in_size, dtype=F32)[None]}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, feeds)[0][0].T, ReferenceEvaluator(model).run(None, feeds)[0][0].T]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize(
    "coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
)
def test_axis_matrix_is_onnx_resize(mode: str, coord: str) -> None:
    """Each axis' matrix is what onnxruntime's Resize does to the unit vectors of the axis (row
    j of X = e_j: row j of Y is M e_j), every nearest mode, scales up and down, size 1 included;
    and what onnx.reference's does, but where it differs: it takes scale x size for the output
    size (align_corners, pytorch_half_pixel), and computes the coordinates in float64, which
    moves nearest indices (0.6 is 0.6000000238 in float32: 3 / 0.6 is 5 in float32 and 4.99...
    in float64) and half_pixel_symmetric's offset where scale x size is not the size."""
    nearest_modes = (
        ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] if mode == "nearest" else ["floor"]
    )
    for nearest, in_size, scale in itertools.product(
        nearest_modes, [1, 3, 4, 7], [0.25, 0.6, 1.0, 1.5, 2.0, 3.0]
    ):
        out_size = int(np.floor(F32(scale) * in_size))
        if out_size == 0:
            continue
        got = axis_matrix(mode, coord, nearest, in_size, out_size, float(F32(scale)))
        by_ort, by_reference = _unit_responses(mode, coord, nearest, in_size, scale)
        what = f"{mode} {coord} {nearest} {in_size} x{scale}"
        frac = np.mod(source_coordinates(coord, in_size, out_size, float(F32(scale))), 1.0)
        tie = mode == "nearest" and nearest.startswith("round") and np.any(np.abs(frac - 0.5) < 1e-5)
        if not (tie and coord == "half_pixel_symmetric"):  # a rounding of the offset decides a tie:
            # onnxruntime 1.19 and 1.32 round it apart (7 x 0.6: 0.5000001 and 0.5)
            np.testing.assert_allclose(got, by_ort, atol=1e-6, err_msg=f"{what}: onnxruntime")
        exact = float(F32(scale)) * in_size == out_size
        dyadic = mode == "linear" or (scale * 4).is_integer()  # else float32 and 64 round apart
        if dyadic and (exact or coord not in ("align_corners", "pytorch_half_pixel", "half_pixel_symmetric")):
            np.testing.assert_allclose(got, by_reference, atol=1e-6, err_msg=f"{what}: onnx.reference")


def _ops(name: str) -> list[str]:
    g = next(c for c in CASES + LARGE if c.name == name)
    model, _ = build(g)
    grad = gradient_model(model, g.names)
    return [n.op_type for n in grad.graph.node[len(model.graph.node) :]]


def test_integer_nearest_upsampling_form_by_size() -> None:
    """dX of a 2x nearest upsampling sums dY's repeats by one Reshape + ReduceSum from 64 inputs
    on an axis (faster there), by MatMuls below (faster there); linear: MatMuls."""
    assert _ops("nearest_2x_2d").count("MatMul") == 2
    assert "MatMul" not in _ops("nearest_2x_large")
    assert "ReduceSum" in _ops("nearest_2x_large")
    assert _ops("bilinear_pytorch_half_pixel_up").count("MatMul") == 2


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"mode": "cubic"}, "mode='cubic'"),
        ({"mode": "linear", "antialias": 1}, "antialias=1"),
        (
            {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"},
            "coordinate_transformation_mode='tf_crop_and_resize'",
        ),
    ],
)
def test_refusals_name_node_attribute_and_fix(attrs: dict[str, Any], message: str) -> None:
    case("refused", (1, 1, 3, 3), None, [1, 1, 2, 2], **attrs)
    g = CASES.pop()
    g.nodes[0] = helper.make_node(
        "Constant", [], ["roi"], value_floats=[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    )
    model, _ = build(g)
    with pytest.raises(GraphNotDifferentiableError, match=f"node 'refused_node' has {message}.*backend="):
        gradient_model(model, g.names)
