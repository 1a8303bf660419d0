"""The ``onnx`` backend's gradient rules of convolution and pooling (rules/conv.py) on one-node
graphs in each attribute form (1-3 spatial axes, groups and depthwise, strides that do not
divide, dilations, symmetric and asymmetric pads, auto_pad, output_padding, ceil_mode,
count_include_pad), against torch autograd (F.conv*, F.conv_transpose*, F.max_pool*,
F.avg_pool* in float64) and float64 finite differences of onnx's reference evaluator; and a
small CNN trained by the full loop on backend='onnx' against torch SGD.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
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
from onnx import helper

CASES: list[Graph] = []


def _x(name: str, shape: tuple[int, ...], **kw: Any) -> np.ndarray:
    return values(rng_for(name), shape, **kw)


def case(name: str, op: str, inputs: dict[str, np.ndarray], fn: Any, **kw: Any) -> None:
    """One ``op`` node reading ``inputs`` (in order); ``outputs`` (keyword) names its outputs,
    the loss reading only ``Y``; the rest are attributes."""
    outs = kw.pop("outputs", ["Y"])
    node = helper.make_node(op, list(inputs), outs, name=f"{name}_node", **kw)
    CASES.append(Graph(name, [node], inputs, lambda t, v: [fn(t, v)], {}, ["Y"], 18))


def _fn(t: Any, kind: str, rank: int) -> Any:
    return getattr(t.nn.functional, f"{kind}{rank}d")


def _padded(t: Any, x: Any, pads: list[int], value: float = 0.0) -> Any:
    """``x`` padded as ONNX's ``pads`` ([begin..., end...]) say: torch's F.pad wants the last
    axis first."""
    rank = len(pads) // 2
    torch_pads: list[int] = []
    for k in reversed(range(rank)):
        torch_pads += [pads[k], pads[k + rank]]
    return t.nn.functional.pad(x, torch_pads, value=value)


# ---- Conv -----------------------------------------------------------------------------------------
#: (tag, X shape, W shape, group, strides, pads, dilations, bias, auto_pad)
CONVS: list[tuple[Any, ...]] = [
    ("3x3_pad1", (2, 3, 5, 5), (4, 3, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1], True, None),
    ("stride2_asym", (2, 3, 6, 5), (4, 3, 3, 3), 1, [2, 2], [0, 1, 1, 0], [1, 1], True, None),
    ("stride2_not_dividing", (2, 2, 6, 6), (3, 2, 3, 3), 1, [2, 2], [0, 0, 0, 0], [1, 1], False, None),
    ("dilation2", (2, 3, 7, 6), (2, 3, 3, 2), 1, [1, 2], [2, 1, 2, 1], [2, 2], True, None),
    ("groups2", (2, 4, 5, 5), (6, 2, 3, 3), 2, [1, 1], [1, 1, 1, 1], [1, 1], True, None),
    ("depthwise", (2, 3, 6, 6), (6, 1, 3, 3), 3, [2, 2], [1, 1, 1, 1], [1, 1], True, None),
    ("depthwise_s2_asym", (2, 3, 7, 6), (3, 1, 3, 3), 3, [2, 2], [1, 0, 0, 1], [1, 1], True, None),
    ("depthwise_dilated", (2, 4, 7, 7), (4, 1, 3, 2), 4, [1, 1], [2, 1, 2, 1], [2, 2], False, None),
    ("stem_7x7_s2", (2, 3, 9, 9), (4, 3, 7, 7), 1, [2, 2], [3, 3, 3, 3], [1, 1], False, None),
    ("1x1_s2", (2, 4, 5, 5), (3, 4, 1, 1), 1, [2, 2], [0, 0, 0, 0], [1, 1], False, None),
    ("1d", (3, 2, 9), (4, 2, 3), 1, [2], [1, 2], [1], True, None),
    ("1d_depthwise_dilated", (2, 4, 12), (4, 1, 3), 4, [1], [4, 4], [4], True, None),
    ("3d", (2, 2, 4, 4, 3), (3, 2, 2, 3, 2), 1, [1, 2, 1], [0, 1, 1, 1, 0, 0], [1, 1, 1], True, None),
    ("same_upper_s2", (2, 2, 7, 6), (3, 2, 3, 3), 1, [2, 2], None, [1, 1], True, "SAME_UPPER"),
    ("same_lower", (2, 2, 5, 6), (3, 2, 2, 3), 1, [1, 1], None, [1, 1], True, "SAME_LOWER"),
    ("valid", (2, 2, 5, 6), (3, 2, 3, 2), 1, [1, 1], None, [1, 1], True, "VALID"),
]


def _same_pads(sizes: tuple[int, ...], kernel: tuple[int, ...], strides: list[int], upper: bool) -> list[int]:
    begins, ends = [], []
    for n, k, s in zip(sizes, kernel, strides):
        total = max(0, (-(-n // s) - 1) * s + k - n)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


for tag, xs, ws, group, strides, pads, dilations, bias, auto_pad in CONVS:
    rank = len(xs) - 2
    inputs = {"X": _x(f"cx{tag}", xs), "W": _x(f"cw{tag}", ws)}
    if bias:
        inputs["B"] = _x(f"cb{tag}", (ws[0],))
    attrs: dict[str, Any] = {"group": group, "strides": strides, "dilations": dilations}
    if auto_pad is None:
        attrs["pads"] = pads
        torch_pads = pads
    else:
        attrs["auto_pad"] = auto_pad
        torch_pads = (
            [0] * (2 * rank)
            if auto_pad == "VALID"
            else _same_pads(xs[2:], ws[2:], strides, auto_pad == "SAME_UPPER")
        )

    def conv(
        t: Any, v: dict[str, Any], r: int = rank, p: list[int] = torch_pads, a: dict[str, Any] = attrs
    ) -> Any:
        return _fn(t, "conv", r)(
            _padded(t, v["X"], p),
            v["W"],
            v.get("B"),
            stride=a["strides"],
            dilation=a["dilations"],
            groups=a["group"],
        )

    case(f"conv_{tag}", "Conv", inputs, conv, **attrs)

# ---- ConvTranspose --------------------------------------------------------------------------------
#: (tag, X shape, W shape, group, strides, pads (symmetric, torch's padding), output_padding,
#: dilations, bias)
CONV_TRANSPOSES: list[tuple[Any, ...]] = [
    ("s2_k2", (2, 3, 4, 4), (3, 2, 2, 2), 1, [2, 2], [0, 0], [0, 0], [1, 1], True),
    ("s2_k3_p1_op1", (2, 3, 4, 3), (3, 2, 3, 3), 1, [2, 2], [1, 1], [1, 1], [1, 1], True),
    ("groups2_dilated", (2, 4, 3, 4), (4, 3, 3, 2), 2, [1, 2], [1, 0], [0, 1], [2, 1], True),
    ("depthwise_s2", (2, 3, 4, 4), (3, 1, 3, 3), 3, [2, 2], [1, 1], [1, 1], [1, 1], True),
    ("1d_depthwise_dilated", (2, 4, 6), (4, 1, 3), 4, [1], [2], [0], [2], False),
    ("1d", (2, 3, 5), (3, 2, 4), 1, [3], [1], [2], [1], False),
    ("3d", (1, 2, 2, 3, 2), (2, 2, 2, 2, 2), 1, [2, 1, 2], [0, 0, 1], [1, 0, 0], [1, 1, 1], True),
]
for tag, xs, ws, group, strides, pads, out_pad, dilations, bias in CONV_TRANSPOSES:
    rank = len(xs) - 2
    inputs = {"X": _x(f"tx{tag}", xs), "W": _x(f"tw{tag}", ws)}
    if bias:
        inputs["B"] = _x(f"tb{tag}", (ws[1] * group,))

    def conv_t(
        t: Any,
        v: dict[str, Any],
        r: int = rank,
        s: list[int] = strides,
        p: list[int] = pads,
        op: list[int] = out_pad,
        d: list[int] = dilations,
        g: int = group,
    ) -> Any:
        return _fn(t, "conv_transpose", r)(
            v["X"], v["W"], v.get("B"), stride=s, padding=p, output_padding=op, groups=g, dilation=d
        )

    case(
        f"conv_transpose_{tag}",
        "ConvTranspose",
        inputs,
        conv_t,
        group=group,
        strides=strides,
        pads=pads + pads,
        output_padding=out_pad,
        dilations=dilations,
    )

# ---- MaxPool and AveragePool ----------------------------------------------------------------------
#: (tag, X shape, kernel, strides, pads (symmetric), dilations, ceil_mode, with Indices)
MAX_POOLS: list[tuple[Any, ...]] = [
    ("2x2_s2", (2, 3, 6, 6), [2, 2], [2, 2], [0, 0], [1, 1], 0, False),
    ("3x3_s2_p1", (2, 2, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], 0, True),
    ("ceil", (2, 2, 7, 6), [2, 3], [2, 2], [0, 1], [1, 1], 1, False),
    ("dilated", (1, 2, 7, 7), [2, 2], [1, 2], [0, 0], [2, 2], 0, False),
    ("1d", (3, 2, 9), [3], [2], [1], [1], 0, False),
    ("3d", (1, 2, 4, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], 0, False),
]
for tag, xs, kernel, strides, pads, dilations, ceil, indices in MAX_POOLS:
    rank = len(xs) - 2

    def max_pool(
        t: Any,
        v: dict[str, Any],
        r: int = rank,
        k: list[int] = kernel,
        s: list[int] = strides,
        p: list[int] = pads,
        d: list[int] = dilations,
        c: int = ceil,
    ) -> Any:
        return _fn(t, "max_pool", r)(v["X"], k, s, p, d, ceil_mode=bool(c))

    case(
        f"max_pool_{tag}",
        "MaxPool",
        {"X": _x(f"mx{tag}", xs)},
        max_pool,
        outputs=["Y", "Indices"] if indices else ["Y"],
        kernel_shape=kernel,
        strides=strides,
        pads=pads + pads,
        dilations=dilations,
        ceil_mode=ceil,
    )

#: (tag, X shape, kernel, strides, pads (symmetric), ceil_mode, count_include_pad)
AVERAGE_POOLS: list[tuple[Any, ...]] = [
    ("2x2_s2", (2, 3, 6, 6), [2, 2], [2, 2], [0, 0], 0, 0),
    ("3x3_p1_exclude", (2, 2, 5, 6), [3, 3], [1, 1], [1, 1], 0, 0),
    ("3x3_s2_p1_include", (2, 2, 7, 6), [3, 3], [2, 2], [1, 1], 0, 1),
    ("ceil_exclude", (2, 2, 7, 6), [2, 3], [2, 2], [0, 1], 1, 0),
    ("1d", (3, 2, 9), [3], [2], [1], 0, 1),
    ("3d", (1, 2, 4, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], 0, 0),
]
for tag, xs, kernel, strides, pads, ceil, include in AVERAGE_POOLS:
    rank = len(xs) - 2

    def avg_pool(
        t: Any,
        v: dict[str, Any],
        r: int = rank,
        k: list[int] = kernel,
        s: list[int] = strides,
        p: list[int] = pads,
        c: int = ceil,
        i: int = include,
    ) -> Any:
        return _fn(t, "avg_pool", r)(v["X"], k, s, p, ceil_mode=bool(c), count_include_pad=bool(i))

    case(
        f"average_pool_{tag}",
        "AveragePool",
        {"X": _x(f"ax{tag}", xs)},
        avg_pool,
        kernel_shape=kernel,
        strides=strides,
        pads=pads + pads,
        ceil_mode=ceil,
        count_include_pad=include,
    )

for shape in [(2, 3, 4, 5), (3, 2, 6), (1, 2, 2, 3, 2)]:
    tag = "x".join(map(str, shape))
    axes = list(range(2, len(shape)))
    case(
        f"global_average_pool_{tag}",
        "GlobalAveragePool",
        {"X": _x(f"ga{tag}", shape)},
        lambda t, v, a=axes: v["X"].mean(dim=a, keepdim=True),
    )
    case(
        f"global_max_pool_{tag}",
        "GlobalMaxPool",
        {"X": _x(f"gm{tag}", shape)},
        lambda t, v, a=axes: v["X"].amax(dim=a, keepdim=True),
    )

IDS = [g.name for g in CASES]


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_conv_rule_against_torch(graph: Graph) -> None:
    pytest.importorskip("torch")
    check_against_torch(graph)


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_conv_rule_against_finite_differences(graph: Graph) -> None:
    check_against_finite_differences(graph)


@pytest.mark.parametrize(
    ("op", "attrs", "message"),
    [
        ("LpPool", {"kernel_shape": [2, 2]}, "no gradient rule for operator LpPool (node 'refused_node')"),
        (
            "MaxPool",
            {"kernel_shape": [2, 2], "storage_order": 1},
            "MaxPool with storage_order=0; node 'refused_node' has storage_order=1",
        ),
    ],
)
def test_unsupported_pool_forms_are_refused_naming_the_node(
    op: str, attrs: dict[str, Any], message: str
) -> None:
    from ort_train_core.exceptions import GraphNotDifferentiableError

    node = helper.make_node(op, ["X"], ["Y"], name="refused_node", **attrs)
    model, _ = build(Graph("refused", [node], {"X": _x("refused", (1, 2, 4, 4))}, None))
    with pytest.raises(GraphNotDifferentiableError, match=re.escape(message)):
        gradient_model(model, ["X"])


def test_small_cnn_trains_as_torch_on_the_onnx_backend() -> None:
    """torch's Conv-ReLU-MaxPool-Conv-AdaptiveAvgPool-Linear (TorchScript export: Conv, Relu,
    MaxPool, Conv, GlobalAveragePool, Flatten, Gemm) trained by the full loop on backend='onnx'
    for 6 SGD steps (a last batch of 4 rows): torch SGD's losses (1e-4) and parameters (1e-5)."""
    torch = pytest.importorskip("torch")
    from batchnorm_support import BATCH, EPOCHS, LR, export_training, torch_sgd
    from ort_train_core import Callback, ExportedGraphWarning, OrtGradientOptimizer, add_loss_output

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 6, 3, stride=2),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(6, 1),
    )
    rng = np.random.default_rng(0)
    X = rng.normal(0.0, 1.0, size=(20, 2, 9, 9)).astype(np.float32)
    y = (X[:, 0].mean(axis=(1, 2)) - X[:, 1, :3, :3].sum(axis=(1, 2)))[:, None].astype(np.float32)
    model = export_training(net, torch.from_numpy(X[:BATCH]))
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    assert ops[:5] == ["Conv", "Relu", "MaxPool", "Conv", "GlobalAveragePool"], ops
    losses: list[float] = []

    class StepLosses(Callback):
        def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
            losses.append(loss)

    with pytest.warns(ExportedGraphWarning, match="no BatchNormalization"):  # none to fold here
        trainer = OrtGradientOptimizer(
            add_loss_output(model),
            learning_rate=LR,
            batch_size=BATCH,
            max_iter=EPOCHS,
            shuffle=False,
            callbacks=[StepLosses()],
            backend="onnx",
        ).fit(X, y)
    torch_losses = torch_sgd(net, X, y)
    assert len(losses) == 6
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-4)
    state = trainer.get_state()
    for name, value in net.named_parameters():
        np.testing.assert_allclose(state[name], value.detach().numpy(), atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("strides", "transposed"), [([1, 1], False), ([2, 2], True)])
def test_input_gradient_at_stride_1_is_a_flipped_conv(strides: list[int], transposed: bool) -> None:
    """At stride 1 (one group) dX is a Conv by the swapped, reversed weight (onnxruntime runs it
    in 0.65-0.85x a ConvTranspose's time), else the ConvTranspose; both equal torch's (the
    oracle cases above)."""
    node = helper.make_node("Conv", ["X", "W"], ["Y"], pads=[1, 1, 1, 1], strides=strides)
    g = Graph("flip", [node], {"X": _x("fx", (2, 3, 6, 6)), "W": _x("fw", (4, 3, 3, 3))}, None)
    model, _ = build(g)
    ops = [n.op_type for n in gradient_model(model, ["X"]).graph.node]
    assert ("ConvTranspose" in ops) is transposed, ops
