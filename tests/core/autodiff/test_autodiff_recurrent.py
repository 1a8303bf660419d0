"""The ``onnx`` backend's gradient rules of LSTM, GRU and RNN (rules/recurrent.py) on one-node
graphs in every supported form (direction, layout, initial states, bias, GRU's
linear_before_reset, the outputs the loss reads), against torch autograd through torch's own
nn.LSTM / nn.GRU / nn.RNN in float64 (the ONNX weights mapped into torch's gate order) and
float64 finite differences of onnx's reference evaluator; the unrolled and the Scan form;
the refusals; and a torch-exported LSTM regressor trained by the full loop against torch SGD.
"""

from __future__ import annotations

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

from ort_train_core._backends import get_backend
from ort_train_core.autodiff.rules import recurrent
from ort_train_core.exceptions import GraphNotDifferentiableError

torch = pytest.importorskip("torch")

from batchnorm_support import export_training  # noqa: E402

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: ONNX gate blocks in torch's order: LSTM i o f c -> i f g o; GRU z r h -> r z n
TORCH_ORDER = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}


def _to_torch_gates(t: Any, w: Any, op: str) -> Any:
    """ONNX's gate blocks (first axis) reordered as torch's."""
    blocks = t.chunk(w, GATES[op], 0)
    return t.cat([blocks[k] for k in TORCH_ORDER[op]], 0)


def _module(t: Any, op: str, features: int, hidden: int, count: int, layout: int) -> Any:
    cls = {"LSTM": t.nn.LSTM, "GRU": t.nn.GRU, "RNN": t.nn.RNN}[op]
    return cls(features, hidden, bidirectional=count == 2, batch_first=bool(layout)).double()


def torch_recurrence(t: Any, v: dict[str, Any], op: str, form: dict[str, Any]) -> list[Any]:
    """[Y, Y_h(, Y_c)] of the ONNX node by torch's module, the ONNX weights (in ``v``) mapped."""
    layout, direction = form["layout"], form["direction"]
    count = 2 if direction == "bidirectional" else 1
    (_, gh, features), hidden = v["W"].shape, v["R"].shape[-1]
    module = _module(t, op, features, hidden, count, layout)
    params: dict[str, Any] = {}
    for d in range(count):
        suffix = "_l0_reverse" if d == 1 else "_l0"
        params[f"weight_ih{suffix}"] = _to_torch_gates(t, v["W"][d], op)
        params[f"weight_hh{suffix}"] = _to_torch_gates(t, v["R"][d], op)
        bias = v["B"][d] if "B" in v else t.zeros(2 * gh, dtype=t.float64)
        params[f"bias_ih{suffix}"] = _to_torch_gates(t, bias[:gh], op)
        params[f"bias_hh{suffix}"] = _to_torch_gates(t, bias[gh:], op)
    x = v["X"]
    time_axis = 1 if layout else 0
    if direction == "reverse":
        x = t.flip(x, [time_axis])
    states = [v[k].transpose(0, 1) if layout else v[k] for k in ("initial_h", "initial_c") if k in v]
    zeros = t.zeros(count, x.shape[1 - time_axis], hidden, dtype=t.float64)
    if op == "LSTM":
        init: Any = (states[0] if states else zeros, states[1] if len(states) > 1 else zeros)
    else:
        init = states[0] if states else zeros
    out, final = t.func.functional_call(module, params, (x, init))
    if direction == "reverse":
        out = t.flip(out, [time_axis])
    finals = list(final) if op == "LSTM" else [final]
    if layout:  # [N, T, D H] -> [N, T, D, H]; states [D, N, H] -> [N, D, H]
        return [out.reshape(*out.shape[:2], count, hidden), *(f.transpose(0, 1) for f in finals)]
    y = out.reshape(out.shape[0], out.shape[1], count, hidden).permute(0, 2, 1, 3)
    return [y, *finals]


def torch_gru_after_reset(t: Any, v: dict[str, Any], form: dict[str, Any]) -> list[Any]:
    """ONNX's GRU with linear_before_reset=0 (torch's GRU resets after the product: it has no
    such module), written with torch operators, layout 0 or 1."""
    layout, direction = form["layout"], form["direction"]
    x = v["X"].transpose(0, 1) if layout else v["X"]
    count, hidden = v["W"].shape[0], v["R"].shape[-1]
    h0 = v["initial_h"].transpose(0, 1) if "initial_h" in v and layout else v.get("initial_h")
    ys, finals = [], []
    for d in range(count):
        (wz, wr, wh), (rz, rr, rh) = v["W"][d].chunk(3), v["R"][d].chunk(3)
        bias = v["B"][d] if "B" in v else t.zeros(6 * hidden, dtype=t.float64)
        (bz, br, bh), (cz, cr, ch) = bias[: 3 * hidden].chunk(3), bias[3 * hidden :].chunk(3)
        h = h0[d] if h0 is not None else t.zeros(x.shape[1], hidden, dtype=t.float64)
        steps: list[Any] = [None] * x.shape[0]
        backwards = direction == "reverse" or d == 1
        for s in reversed(range(x.shape[0])) if backwards else range(x.shape[0]):
            z = t.sigmoid(x[s] @ wz.T + h @ rz.T + bz + cz)
            r = t.sigmoid(x[s] @ wr.T + h @ rr.T + br + cr)
            n = t.tanh(x[s] @ wh.T + bh + (r * h) @ rh.T + ch)
            h = (1 - z) * n + z * h
            steps[s] = h
        ys.append(t.stack(steps))
        finals.append(h)
    y, y_h = t.stack(ys, 1), t.stack(finals)  # [T, D, N, H], [D, N, H]
    return [y.permute(2, 0, 1, 3), y_h.transpose(0, 1)] if layout else [y, y_h]


def recurrent_graph(
    op: str,
    direction: str = "forward",
    layout: int = 0,
    states: bool = True,
    bias: bool = True,
    lbr: int = 1,
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"),
    dims: tuple[int, int, int, int] = (4, 3, 2, 3),
    lens: int | None = None,
) -> Graph:
    """One ``op`` node; dims (time, batch, features, hidden); the loss reads ``outputs``;
    ``lens``: every sequence_lens (layout 0)."""
    time, n, features, hidden = dims
    count, gates = (2 if direction == "bidirectional" else 1), GATES[op]
    name = f"{op}_{direction}_layout{layout}_states{int(states)}_bias{int(bias)}_lbr{lbr}_{'_'.join(outputs)}"
    name += "" if lens is None else f"_lens{lens}"
    rng = rng_for(name)
    inputs = {
        "X": values(rng, [n, time, features] if layout else [time, n, features]),
        "W": values(rng, [count, gates * hidden, features], -0.8, 0.8),
        "R": values(rng, [count, gates * hidden, hidden], -0.8, 0.8),
    }
    if bias:
        inputs["B"] = values(rng, [count, 2 * gates * hidden], -0.8, 0.8)
    state_names = ["initial_h", "initial_c"][: 2 if op == "LSTM" else 1] if states else []
    for s in state_names:
        inputs[s] = values(rng, [n, count, hidden] if layout else [count, n, hidden])
    node_inputs = ["X", "W", "R", "B" if bias else "", "" if lens is None else "lens", *state_names]
    while node_inputs[-1] == "":
        node_inputs.pop()
    all_outputs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    node_outputs = [o if o in outputs else "" for o in all_outputs]
    while node_outputs[-1] == "":
        node_outputs.pop()
    attrs: dict[str, Any] = {"hidden_size": hidden, "direction": direction, "layout": layout}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, node_inputs, node_outputs, name=f"{op.lower()}_node", **attrs)
    form = {"layout": layout, "direction": direction}
    wanted = [o for o in all_outputs if o in outputs]

    def fn(t: Any, v: dict[str, Any]) -> list[Any]:
        run = v if lens is None else {**v, "X": v["X"][:lens]}  # the steps the node runs
        if op == "GRU" and not lbr:
            got = torch_gru_after_reset(t, run, form)
        else:
            got = torch_recurrence(t, run, op, form)
        if lens is not None:  # Y is zero after the sequences' length
            got[0] = t.cat([got[0], t.zeros(time - lens, *got[0].shape[1:], dtype=t.float64)])
        return [got[all_outputs.index(o)] for o in wanted]

    consts = {} if lens is None else {"lens": np.full(n, lens, np.int32)}
    return Graph(name, [node], inputs, fn, consts, outputs=wanted, opset=17)


FORMS = [
    recurrent_graph(op, direction, layout)
    for op in ("LSTM", "GRU", "RNN")
    for direction in ("forward", "reverse", "bidirectional")
    for layout in (0, 1)
]
FORMS += [
    recurrent_graph("GRU", direction, layout, lbr=0)
    for direction in ("forward", "bidirectional")
    for layout in (0, 1)
]
FORMS += [recurrent_graph(op, "bidirectional", states=False, bias=False) for op in ("LSTM", "GRU", "RNN")]
FORMS += [recurrent_graph("GRU", "reverse", states=False, bias=False, lbr=0)]
# the loss reads only the final states: the rule adds Y to the node and reads it
FORMS += [recurrent_graph(op, "bidirectional", outputs=("Y_h",)) for op in ("LSTM", "GRU", "RNN")]
FORMS += [recurrent_graph("LSTM", "forward", layout=1, outputs=("Y_c",))]
FORMS += [recurrent_graph("LSTM", "reverse", outputs=("Y", "Y_c"), dims=(1, 2, 3, 2))]
# sequence_lens all the full length: the node runs every step
FORMS += [recurrent_graph("GRU", "bidirectional", lens=4)]


@pytest.mark.parametrize("g", FORMS, ids=lambda g: g.name)
def test_recurrent_against_torch(g: Graph) -> None:
    check_against_torch(g)


@pytest.mark.parametrize("g", FORMS, ids=lambda g: g.name)
def test_recurrent_against_finite_differences(g: Graph) -> None:
    check_against_finite_differences(g)


SCAN_FORMS = [recurrent_graph(op, "bidirectional") for op in ("LSTM", "GRU", "RNN")]
SCAN_FORMS += [recurrent_graph("GRU", "reverse", lbr=0), recurrent_graph("LSTM", "forward", outputs=("Y_h",))]


@pytest.fixture
def scan_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every static length above the unrolling threshold: the steps run in a Scan."""
    monkeypatch.setattr(recurrent, "UNROLL_MAX_STEPS", 0)


@pytest.mark.parametrize("g", SCAN_FORMS, ids=lambda g: g.name)
def test_scan_form_against_torch_and_finite_differences(g: Graph, scan_only: None) -> None:
    model, _ = build(g)
    grad = gradient_model(model, g.names)
    assert "Scan" in {n.op_type for n in grad.graph.node}
    check_against_torch(g)
    check_against_finite_differences(g)


#: sequence_lens all shorter than the sequence: the node runs the first steps (onnx's reference
#: evaluator ignores sequence_lens: against torch only)
SHORTER = [
    recurrent_graph("LSTM", "bidirectional", lens=3),
    recurrent_graph("GRU", "reverse", lens=2),
    recurrent_graph("RNN", "forward", outputs=("Y_h",), lens=1),
]


@pytest.mark.parametrize("g", SHORTER, ids=lambda g: g.name)
def test_uniform_shorter_sequence_lens_against_torch(g: Graph) -> None:
    check_against_torch(g)


def _refused_graph(op: str, change: str) -> Graph:
    g = recurrent_graph(op, "forward", dims=(3, 2, 2, 2))
    node = g.nodes[0]
    if change == "activations":
        node.attribute.append(helper.make_attribute("activations", ["Relu"] * (3 if op == "LSTM" else 2)))
    elif change == "clip":
        node.attribute.append(helper.make_attribute("clip", 3.0))
    elif change == "input_forget":
        node.attribute.append(helper.make_attribute("input_forget", 1))
    elif change == "peepholes":
        node.input[4:] = ["", "initial_h", "initial_c", "P"]
        g.inputs["P"] = values(rng_for("P"), [1, 6])
    else:  # sequence_lens of two lengths
        node.input[4] = "lens"
        g.consts["lens"] = np.array([3, 2], np.int32)
    return g


REFUSALS = [
    (
        "LSTM",
        "activations",
        r"node 'lstm_node' has activations=\['Relu', 'Relu', 'Relu'\]: export it with the default",
    ),
    ("GRU", "clip", r"node 'gru_node' has clip=3.0: leave the clip attribute out"),
    ("LSTM", "input_forget", r"node 'lstm_node' has input_forget=1: set input_forget to 0"),
    ("LSTM", "peepholes", r"node 'lstm_node' has peepholes P='P': leave the peephole input P out"),
    ("RNN", "lens", r"node 'rnn_node' has sequence_lens=\[3, 2\] \(sequence length 3\): pad the sequences"),
]


@pytest.mark.parametrize(("op", "change", "message"), REFUSALS, ids=[f"{o}-{c}" for o, c, _ in REFUSALS])
def test_refusals_name_node_attribute_and_fix(op: str, change: str, message: str) -> None:
    g = _refused_graph(op, change)
    model, _ = build(g)
    with pytest.raises(GraphNotDifferentiableError, match=message + ".*out of weights_to_train"):
        get_backend("onnx").gradient_graph(model, "loss", g.names)


# ---- a torch-exported recurrent regressor trained by the full loop -------------------------------
class Regressor(torch.nn.Module):
    """A recurrence (batch first) on [N, T, F], its last step's output, Linear to one value."""

    def __init__(self, cell: str, layers: int, bidirectional: bool) -> None:
        super().__init__()
        cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[cell]
        self.rnn = cls(3, 5, num_layers=layers, bidirectional=bidirectional, batch_first=True)
        self.head = torch.nn.Linear(10 if bidirectional else 5, 1)

    def forward(self, x: Any) -> Any:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


@pytest.mark.parametrize(
    ("cell", "layers", "bidirectional"), [("lstm", 2, False), ("gru", 1, True), ("rnn", 1, False)]
)
def test_exported_regressor_trains_like_torch_sgd(cell: str, layers: int, bidirectional: bool) -> None:
    """torch.onnx.export (TorchScript) of a batch-first recurrence + Linear, trained by the full
    loop on backend='onnx': every step's loss equals torch SGD's (1e-4)."""
    from ort_train_core import Callback, LearningRateSGD, OrtGradientOptimizer, add_loss_output

    class Losses(Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
            self.losses.append(float(loss))

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 6, 3)).astype(np.float32)
    y = rng.standard_normal((16, 1)).astype(np.float32)
    net = Regressor(cell, layers, bidirectional)
    model = export_training(net, torch.from_numpy(x))
    assert sum(n.op_type == cell.upper() for n in model.graph.node) == layers
    record = Losses()
    trainer = OrtGradientOptimizer(
        add_loss_output(model, score_name="squared_error"),
        max_iter=2,
        batch_size=8,
        learning_rate=LearningRateSGD(eta0=0.05, learning_rate="constant"),
        shuffle=False,
        callbacks=[record],
        backend="onnx",
    )
    trainer.fit(x, y)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    expected = []
    for batch in [slice(0, 8), slice(8, 16)] * 2:
        opt.zero_grad()
        loss = ((net(torch.from_numpy(x[batch])) - torch.from_numpy(y[batch])) ** 2).sum(1).mean()
        loss.backward()
        opt.step()
        expected.append(float(loss.detach()))
    np.testing.assert_allclose(record.losses, expected, rtol=1e-4, atol=1e-6)


def test_pair_saves_the_added_sequence_output() -> None:
    """The forward/backward pair (backend='onnx') of an LSTM writing only Y_h: the forward
    exports the Y the backward reads; gradients of X and the weights equal torch's."""
    import onnx
    from onnx import TensorProto, numpy_helper

    import ort_train_core as otc

    g = recurrent_graph("LSTM", "bidirectional", states=False, outputs=("Y_h",))
    weights = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in g.inputs.items() if k != "X"]
    x = g.inputs["X"].astype(np.float32)
    graph = helper.make_graph(
        g.nodes,
        "lstm_y_h",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [2, 3, 3])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    pair = otc.OrtGradientForwardBackward(
        onnx.shape_inference.infer_shapes(model),
        weights_to_train=["W", "R", "B"],
        input_names_requiring_grad=["X"],
        backend="onnx",
    )
    (out,) = pair.forward([x])
    seed = values(rng_for("seed"), out.numpy().shape).astype(np.float32)
    grads = pair.backward([seed])
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in g.inputs.items()}
    assert g.torch_fn is not None
    (y_h,) = g.torch_fn(torch, tensors)
    np.testing.assert_allclose(out.numpy(), y_h.detach().numpy(), rtol=1e-5, atol=1e-6)
    (y_h * torch.tensor(seed, dtype=torch.float64)).sum().backward()
    for name, got in zip(["X", "W", "R", "B"], grads):
        want = tensors[name].grad.numpy()
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=name)
