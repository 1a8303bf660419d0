"""The ``onnx`` backend's gradient rules of the normalisations (rules/norm.py) on one-node
graphs in each attribute form: BatchNormalization in training mode (batch statistics, the
running statistics written but given no gradient) and inference mode, InstanceNormalization,
GroupNormalization (opset 18: scale per group; 21: per channel) and LayerNormalization (axes,
epsilon, the optional Mean/InvStdDev outputs written and unread), against torch autograd
(F.batch_norm, F.instance_norm, F.group_norm, F.layer_norm in float64) and float64 finite
differences of onnx's reference evaluator; the refusal of a loss reading the running
statistics; and a Gemm-BatchNormalization-Relu-Gemm network trained by the full loop on
backend='onnx' against torch SGD (losses and running statistics).
"""

from __future__ import annotations

import copy
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
from onnx import TensorProto, helper

from ort_train_core.exceptions import GraphNotDifferentiableError

CASES: list[Graph] = []
EPS = float(np.float32(1e-3))  # a float32 attribute: the same value in the float64 references


def _x(name: str, shape: tuple[int, ...], **kw: Any) -> np.ndarray:
    return values(rng_for(name), shape, **kw)


def case(name: str, op: str, inputs: dict[str, np.ndarray], fn: Any, consts: Any = None, **kw: Any) -> None:
    """One ``op`` node reading ``inputs`` then ``consts``; ``outputs`` (keyword) names its
    outputs, the loss reading only ``Y``; ``opset``; the rest are attributes."""
    outs, opset = kw.pop("outputs", ["Y"]), kw.pop("opset", 18)
    consts = consts or {}
    node = helper.make_node(op, [*inputs, *consts], outs, name=f"{name}_node", **kw)
    # onnx infers no type for GroupNormalization's output: declared, as exporters write it
    declared = {"Y": inputs["X"].shape} if op == "GroupNormalization" else {}
    CASES.append(
        Graph(name, [node], inputs, lambda t, v: [fn(t, v)], consts, ["Y"], opset, declared=declared)
    )


# ---- BatchNormalization ------------------------------------------------------------------------
for shape in [(6, 3), (4, 3, 5), (3, 2, 3, 4), (2, 2, 3, 2, 2)]:
    tag = "x".join(map(str, shape))
    channels = shape[1]
    stats = {"mean": _x(f"m{tag}", (channels,)), "var": _x(f"v{tag}", (channels,), lo=0.5, hi=2.0)}
    case(
        f"batch_norm_training_{tag}",
        "BatchNormalization",
        {"X": _x(f"bn{tag}", shape), "scale": _x(f"s{tag}", (channels,)), "B": _x(f"b{tag}", (channels,))},
        lambda t, v: t.nn.functional.batch_norm(v["X"], None, None, v["scale"], v["B"], True, eps=EPS),
        stats,
        outputs=["Y", "running_mean", "running_var"],
        training_mode=1,
        epsilon=EPS,
        momentum=0.9,
    )
    case(
        f"batch_norm_inference_{tag}",
        "BatchNormalization",
        {"X": _x(f"bi{tag}", shape), "scale": _x(f"si{tag}", (channels,)), "B": _x(f"bi{tag}", (channels,))},
        lambda t, v, s=stats: t.nn.functional.batch_norm(
            v["X"], t.tensor(s["mean"]), t.tensor(s["var"]), v["scale"], v["B"], False, eps=EPS
        ),
        stats,
        epsilon=EPS,
    )
case(
    "batch_norm_training_default_eps",
    "BatchNormalization",
    {"X": _x("bnd", (5, 2, 3)), "scale": _x("bnds", (2,)), "B": _x("bndb", (2,))},
    lambda t, v: t.nn.functional.batch_norm(
        v["X"], None, None, v["scale"], v["B"], True, eps=float(np.float32(1e-5))
    ),
    {"mean": np.zeros(2), "var": np.ones(2)},
    outputs=["Y", "running_mean", "running_var"],
    training_mode=1,
)

# ---- InstanceNormalization ---------------------------------------------------------------------
for shape in [(2, 3, 5), (2, 2, 3, 4), (1, 2, 2, 3, 2)]:
    tag = "x".join(map(str, shape))
    case(
        f"instance_norm_{tag}",
        "InstanceNormalization",
        {
            "X": _x(f"in{tag}", shape),
            "scale": _x(f"ins{tag}", (shape[1],)),
            "B": _x(f"inb{tag}", (shape[1],)),
        },
        lambda t, v: t.nn.functional.instance_norm(v["X"], weight=v["scale"], bias=v["B"], eps=EPS),
        epsilon=EPS,
    )


# ---- GroupNormalization ------------------------------------------------------------------------
def _group_norm_18(t: Any, v: dict[str, Any], groups: int) -> Any:
    """Opset 18: scale and bias per group, repeated over the group's channels."""
    per = v["X"].shape[1] // groups
    scale, bias = v["scale"].repeat_interleave(per), v["B"].repeat_interleave(per)
    return t.nn.functional.group_norm(v["X"], groups, scale, bias, eps=EPS)


# opset 21 (scale and bias per channel); the per-group form of opset 18 is the one where each
# group is one channel (onnx's checker refuses GroupNormalization-18 as deprecated)
for shape, groups in [
    ((2, 6, 4), 3),
    ((2, 4, 3, 3), 2),
    ((3, 4, 2, 2, 2), 4),
    ((2, 6, 5), 1),
    ((2, 3, 4), 3),
]:
    tag = "x".join(map(str, shape)) + f"_g{groups}"
    channels = shape[1]
    case(
        f"group_norm_21_{tag}",
        "GroupNormalization",
        {"X": _x(f"G{tag}", shape), "scale": _x(f"Gs{tag}", (channels,)), "B": _x(f"Gb{tag}", (channels,))},
        lambda t, v, g=groups: t.nn.functional.group_norm(v["X"], g, v["scale"], v["B"], eps=EPS),
        num_groups=groups,
        epsilon=EPS,
        opset=21,
    )

# ---- LayerNormalization ------------------------------------------------------------------------
for shape, axis, outputs in [
    ((4, 6), -1, ["Y"]),
    ((3, 4, 5), -1, ["Y", "Mean", "InvStdDev"]),
    ((3, 4, 5), 1, ["Y", "", "InvStdDev"]),
    ((2, 3, 2, 4), -2, ["Y"]),
    ((2, 3, 4), 0, ["Y", "Mean"]),
]:
    tag = "x".join(map(str, shape)) + f"_axis{axis}_{len(outputs)}"
    normalised = shape[axis % len(shape) :]
    case(
        f"layer_norm_{tag}",
        "LayerNormalization",
        {"X": _x(f"l{tag}", shape), "scale": _x(f"ls{tag}", normalised), "B": _x(f"lb{tag}", normalised)},
        lambda t, v, n=normalised: t.nn.functional.layer_norm(v["X"], n, v["scale"], v["B"], eps=EPS),
        outputs=outputs,
        axis=axis,
        epsilon=EPS,
    )
case(
    "layer_norm_no_bias_default_eps",
    "LayerNormalization",
    {"X": _x("lnb", (3, 5)), "scale": _x("lnbs", (5,))},
    lambda t, v: t.nn.functional.layer_norm(v["X"], (5,), v["scale"], None, eps=float(np.float32(1e-5))),
)

IDS = [g.name for g in CASES]


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_norm_rule_against_finite_differences(graph: Graph) -> None:
    graph = copy.deepcopy(graph)
    for node in graph.nodes:  # GroupNormalization-21 computes in float32 by default (stash_type)
        if node.op_type == "GroupNormalization":
            node.attribute.append(helper.make_attribute("stash_type", TensorProto.DOUBLE))
    check_against_finite_differences(graph)


@pytest.mark.parametrize("graph", CASES, ids=IDS)
def test_norm_rule_against_torch(graph: Graph) -> None:
    pytest.importorskip("torch")
    check_against_torch(graph)


def test_batch_norm_running_statistics_read_by_the_loss_are_refused() -> None:
    """The running statistics are state: a loss reading them is refused, naming the node."""
    g = copy.deepcopy(next(c for c in CASES if c.name == "batch_norm_training_6x3"))
    g.outputs = ["Y", "running_mean"]
    model, _ = build(g)
    with pytest.raises(
        GraphNotDifferentiableError, match="BatchNormalization node 'batch_norm_training_6x3_node'"
    ):
        gradient_model(model, g.names)


def test_gemm_batchnorm_relu_gemm_trains_as_torch_on_the_onnx_backend() -> None:
    """torch's Linear-BatchNorm1d-ReLU-Linear (TorchScript training export: Gemm,
    BatchNormalization in training mode, Relu, Gemm) trained by the full loop on
    backend='onnx': torch SGD's losses (1e-4), running statistics and parameters (1e-5)."""
    torch = pytest.importorskip("torch")
    from batchnorm_support import (
        BATCH,
        EPOCHS,
        LR,
        batchnorm_data,
        export_training,
        start_from_export,
        torch_sgd,
    )
    from ort_train_core import Callback, OrtGradientOptimizer, add_loss_output

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    with torch.no_grad():  # running statistics and affine parameters far from their defaults
        net[1].running_mean.uniform_(-1.0, 1.0)
        net[1].running_var.uniform_(0.5, 2.0)
        net[1].weight.uniform_(0.5, 1.5)
    X, y = batchnorm_data()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:BATCH]))
    assert [n.op_type for n in model.graph.node if n.op_type != "Constant"] == [
        "Gemm",
        "BatchNormalization",
        "Relu",
        "Gemm",
    ]
    start_from_export(net, model)
    torch_losses = torch_sgd(net, X, y)
    losses: list[float] = []

    class StepLosses(Callback):
        def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
            losses.append(loss)

    trainer = OrtGradientOptimizer(
        add_loss_output(model),
        learning_rate=LR,
        batch_size=BATCH,
        max_iter=EPOCHS,
        shuffle=False,
        callbacks=[StepLosses()],
        backend="onnx",
    ).fit(X, y)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-4)
    state = trainer.get_state()
    for name, value in [*net.named_buffers(), *net.named_parameters()]:
        if not name.endswith("num_batches_tracked"):
            np.testing.assert_allclose(state[name], value.detach().numpy(), atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("shape", "groups"), [((2, 6, 5), 3), ((2, 4, 3, 2), 2)])
def test_group_norm_18_scale_per_group_against_torch(shape: tuple[int, ...], groups: int) -> None:
    """GroupNormalization-18 (scale and bias per group; onnx's checker refuses it as deprecated,
    so not through the oracle): the gradients against torch's group_norm with the group's
    scale repeated over its channels (float64)."""
    torch = pytest.importorskip("torch")
    import onnxruntime
    from onnx import numpy_helper

    from ort_train_core.autodiff.backend import OnnxBackend

    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.standard_normal(shape).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, groups).astype(np.float32),
        "B": rng.standard_normal(groups).astype(np.float32),
    }
    seed = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    nodes = [
        helper.make_node("GroupNormalization", ["X", "scale", "B"], ["Y"], num_groups=groups, epsilon=EPS),
        helper.make_node("Mul", ["Y", "R"], ["YR"]),
        helper.make_node("ReduceSum", ["YR"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "group_norm_18",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(seed, "R")],
        value_info=[helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    grad = OnnxBackend().gradient_graph(model, "loss", list(feeds))
    session = onnxruntime.InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run([f"{k}_grad" for k in feeds], feeds)
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in feeds.items()}
    per = shape[1] // groups
    y = torch.nn.functional.group_norm(
        t["X"], groups, t["scale"].repeat_interleave(per), t["B"].repeat_interleave(per), eps=EPS
    )
    (y * torch.tensor(seed, dtype=torch.float64)).sum().backward()
    for (name, tensor), value in zip(t.items(), got):
        np.testing.assert_allclose(value, tensor.grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
