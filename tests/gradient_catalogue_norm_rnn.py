"""Gradient oracle cases of issue 26 items 12 and 13, registered into tests/gradient_catalogue.py's
``CATALOGUE`` and ``PINNED_FORMS`` at the end of that module (import this module only through
it): normalisations and recurrent layers onnxruntime-training cannot differentiate, rewritten
before differentiation.

* ``normalization``: InstanceNormalization of rank 3 to 5 (no gradient in onnxruntime-training).
  GroupNormalization is checked in tests/core/test_norm_rnn_rewrites.py instead: onnx infers no
  type for its output, which the references need.
* ``recurrent``: LSTM and GRU in every direction, layout 0 or 1, with or without initial states,
  GRU's ``linear_before_reset`` 0 or 1, with or without the trailing optional inputs. The torch
  reference is ONNX's recurrence written step by step (gate orders i, o, f, c and z, r, h), not
  torch's nn.LSTM/nn.GRU, so that the ONNX weights are used as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from gradient_catalogue import Case, Draw, _dim, _form, _rng, _values, make_case


# ---- InstanceNormalization ---------------------------------------------------------------------
def normalization(draw: Draw) -> Case:
    """InstanceNormalization (rank 3 to 5) of the input, scale and bias weights (no weight before
    it: the normalisation is invariant to a per-channel scale, whose gradient is float32 noise)."""
    rng = _rng(draw)
    channels, n_spatial = _dim(draw, 1, 3), draw(st.integers(1, 3))
    # at least 4 values per channel: with 2, the normalised values are +-1 whatever the input
    spatial = [_dim(draw, 4 if n_spatial == 1 else 2, 6 if n_spatial == 1 else 3) for _ in range(n_spatial)]
    # the weights drawn first: output_gradient draws G from seed 0, and with seed 0 an X drawn
    # first would be 1.5 G, whose gradient the normalisation cancels
    weights = {"scale": _values(rng, [channels], True), "bias": _values(rng, [channels])}
    inputs = {"X": _values(rng, [_dim(draw, 1, 3), channels, *spatial])}
    eps = 2.0**-10  # a float32 attribute: the same value in the float64 references
    nodes = [helper.make_node("InstanceNormalization", ["X", "scale", "bias"], ["Y"], epsilon=eps)]

    def fn(t: Any, x: list[Any], w: dict[str, Any]) -> Any:
        return t.nn.functional.instance_norm(x[0], weight=w["scale"], bias=w["bias"], eps=eps)

    return make_case(draw, "instance_norm", nodes, inputs, weights, fn)


def _instance_norm_form() -> Case:
    """InstanceNormalization as torch's InstanceNorm2d(affine=True) exports it."""
    # not seed 0: output_gradient draws G from it, and G = X / 1.5 would cancel X's gradient
    rng = np.random.default_rng(1)
    inputs = {"X": _values(rng, [3, 4, 3, 5])}
    weights = {"scale": _values(rng, [4], True), "bias": _values(rng, [4])}
    node = helper.make_node("InstanceNormalization", ["X", "scale", "bias"], ["Y"], epsilon=1e-5)

    def fn(t: Any, x: list[Any], w: dict[str, Any]) -> Any:
        eps = float(np.float32(1e-5))  # the node's float32 attribute
        return t.nn.functional.instance_norm(x[0], weight=w["scale"], bias=w["bias"], eps=eps)

    return _form("instance_norm", [node], inputs, weights, fn)


# ---- LSTM, GRU ---------------------------------------------------------------------------------
def _torch_lstm_direction(
    t: Any, x: Any, w: list[Any], h: Any, c: Any, reverse: bool
) -> tuple[Any, Any, Any]:
    """ONNX's LSTM of one direction (gates i, o, f, c; default activations), x [T, N, I]."""
    weight, recurrence, bias = w
    half = bias.shape[0] // 2
    ys: list[Any] = [None] * x.shape[0]
    for step in reversed(range(x.shape[0])) if reverse else range(x.shape[0]):
        gates = x[step] @ weight.T + h @ recurrence.T + bias[:half] + bias[half:]
        i, o, f, g = gates.chunk(4, -1)
        c = t.sigmoid(f) * c + t.sigmoid(i) * t.tanh(g)
        h = t.sigmoid(o) * t.tanh(c)
        ys[step] = h
    return t.stack(ys), h, c


def _torch_gru_direction(
    t: Any, x: Any, w: list[Any], h: Any, reverse: bool, before_reset: bool
) -> tuple[Any, Any]:
    """ONNX's GRU of one direction (gates z, r, h; default activations), x [T, N, I]."""
    half = w[2].shape[0] // 2
    (wz, wr, wh), (rz, rr, rh) = w[0].chunk(3), w[1].chunk(3)
    (bz, br, bh), (cz, cr, ch) = w[2][:half].chunk(3), w[2][half:].chunk(3)
    ys: list[Any] = [None] * x.shape[0]
    for step in reversed(range(x.shape[0])) if reverse else range(x.shape[0]):
        xt = x[step]
        z = t.sigmoid(xt @ wz.T + h @ rz.T + bz + cz)
        r = t.sigmoid(xt @ wr.T + h @ rr.T + br + cr)
        if before_reset:
            candidate = t.tanh(xt @ wh.T + bh + r * (h @ rh.T + ch))
        else:
            candidate = t.tanh(xt @ wh.T + bh + (r * h) @ rh.T + ch)
        h = (1 - z) * candidate + z * h
        ys[step] = h
    return t.stack(ys), h


def _torch_recurrent(
    t: Any, op: str, x: Any, w: dict[str, Any], directions: list[str], lbr: bool
) -> list[Any]:
    """ONNX's LSTM/GRU (layout 0): [Y [T, D, N, H], Y_h [D, N, H] (, Y_c)]."""
    n, hidden = x.shape[1], w["R"].shape[-1]
    results: list[tuple[Any, ...]] = []
    for k, direction in enumerate(directions):
        zeros = t.zeros(n, hidden, dtype=x.dtype)
        h = w["initial_h"][k] if "initial_h" in w else zeros
        params = [w["W"][k], w["R"][k], w["B"][k]]
        if op == "LSTM":
            c = w["initial_c"][k] if "initial_c" in w else zeros
            results.append(_torch_lstm_direction(t, x, params, h, c, direction == "reverse"))
        else:
            results.append(_torch_gru_direction(t, x, params, h, direction == "reverse", lbr))
    y = t.stack([r[0] for r in results], 1)
    return [y, *(t.stack([r[j] for r in results]) for j in range(1, len(results[0])))]


def recurrent(draw: Draw) -> Case:
    """LSTM or GRU, any direction, layout 0 or 1, with or without initial states (weights),
    GRU's linear_before_reset 0 or 1, every output the node gives summed into Y (Y + Y_h [+ Y_c]
    broadcast): onnxruntime-training's gradients are forward-only, layout 0, and its builder
    read the optional inputs by position (a node without its trailing ones failed)."""
    rng = _rng(draw)
    op = draw(st.sampled_from(["LSTM", "GRU"]))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    layout, lbr = draw(st.sampled_from([0, 1])), draw(st.sampled_from([0, 1]))
    with_states, short_inputs = draw(st.booleans()), draw(st.booleans())
    dims = (_dim(draw, 1, 4), _dim(draw, 1, 3), _dim(draw, 1, 3), _dim(draw, 1, 3))
    return _recurrent_case(draw, rng, op, direction, layout, lbr, with_states, short_inputs, dims)


def _recurrent_case(
    draw: Draw,
    rng: np.random.Generator,
    op: str,
    direction: str,
    layout: int,
    lbr: int,
    with_states: bool,
    short_inputs: bool,
    dims: tuple[int, int, int, int],
) -> Case:
    """The graph of :func:`recurrent`; dims: (time, batch, features, hidden)."""
    time, n, features, hidden = dims
    d, gates = (2 if direction == "bidirectional" else 1), (4 if op == "LSTM" else 3)
    inputs = {"X": _values(rng, [n, time, features] if layout else [time, n, features])}
    weights = {
        "W": _values(rng, [d, gates * hidden, features]),
        "R": _values(rng, [d, gates * hidden, hidden]),
        "B": _values(rng, [d, 2 * gates * hidden]),
    }
    states = ["initial_h", "initial_c"][: 2 if op == "LSTM" else 1] if with_states else []
    for name in states:
        weights[name] = _values(rng, [n, d, hidden] if layout else [d, n, hidden])
    node_inputs = ["X", "W", "R", "B", *(["", *states] if states else [])]
    if not short_inputs:
        node_inputs += [""] * ((8 if op == "LSTM" else 6) - len(node_inputs))
    outputs = ["y", "y_h", "y_c"][: 3 if op == "LSTM" else 2]
    attrs: dict[str, Any] = {"hidden_size": hidden, "direction": direction, "layout": layout}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    nodes = [helper.make_node(op, node_inputs, outputs, **attrs), *_sum_of_states(outputs, layout)]
    consts = {"state_axis": np.array([1], dtype=np.int64)} if layout else {}
    directions = ["forward", "reverse"] if d == 2 else [direction]

    def fn(t: Any, x: list[Any], w: dict[str, Any]) -> Any:
        seq = x[0].transpose(0, 1) if layout else x[0]
        ws = {k: v.transpose(0, 1) if layout and k in states else v for k, v in w.items()}
        y, *finals = _torch_recurrent(t, op, seq, ws, directions, bool(lbr))
        if layout:  # Y [N, T, D, H] + Y_h [N, 1, D, H]
            return y.permute(2, 0, 1, 3) + sum(f.transpose(0, 1).unsqueeze(1) for f in finals)
        return y + sum(finals)

    return make_case(draw, f"{op.lower()}_{direction}", nodes, inputs, weights, fn, consts)


def _sum_of_states(outputs: list[str], layout: int) -> list[onnx.NodeProto]:
    """Nodes adding the final states to the sequence output into ``Y``."""
    nodes, total = [], outputs[0]
    for k, state in enumerate(outputs[1:]):
        if layout:  # [N, D, H] -> [N, 1, D, H]
            nodes.append(helper.make_node("Unsqueeze", [state, "state_axis"], [f"{state}_4d"]))
            state = f"{state}_4d"
        out = "Y" if k == len(outputs) - 2 else f"sum{k}"
        nodes.append(helper.make_node("Add", [total, state], [out]))
        total = out
    return nodes


def _recurrent_form(op: str, direction: str, **kwargs: Any) -> Callable[[], Case]:
    """A pinned :func:`_recurrent_case` at opset 17, the first dimension symbolic: layout 0,
    initial states, every optional input, GRU's linear_before_reset=1 (as torch exports them),
    unless ``kwargs`` say otherwise."""
    params: dict[str, Any] = {"layout": 0, "lbr": 1, "with_states": True, "short_inputs": False}
    params.update(kwargs)

    def build() -> Case:
        pinned = iter([17, True])
        rng = np.random.default_rng(0)
        return _recurrent_case(lambda s: next(pinned), rng, op, direction, dims=(4, 3, 2, 3), **params)

    return build


def _lstm_sequence_lens() -> Case:
    """An LSTM given sequence_lens: the training build's kernels take none; refused."""
    case = _recurrent_form("LSTM", "bidirectional", with_states=False)()
    for model in (case.model, case.model64):
        model.graph.node[0].input[4] = "lens"
        model.graph.initializer.append(numpy_helper.from_array(np.full(3, 4, np.int32), "lens"))
    case.refused = "operator LSTM: onnxruntime-training's LSTM gradient does not compute sequence_lens"
    return case


NORM_RNN_CATALOGUE: dict[str, Callable[[Draw], Case]] = {
    "normalization": normalization,
    "recurrent": recurrent,
}

NORM_RNN_FORMS: dict[str, Callable[[], Case]] = {
    # no gradient in onnxruntime-training: rewritten into primitives
    "instance_norm": _instance_norm_form,
    # LSTMGrad/GRUGrad are forward-only: one forward node per direction
    "lstm_bidirectional": _recurrent_form("LSTM", "bidirectional"),
    "gru_bidirectional": _recurrent_form("GRU", "bidirectional"),
    "gru_reverse_layout_1": _recurrent_form("GRU", "reverse", layout=1, lbr=0),
    # the training kernels ignore layout=1 (batch first): silently wrong on the forward/backward
    # routes (the output off by 2.1, W's gradient by 1.5); transposed to layout 0 around the node
    "lstm_forward_layout_1": _recurrent_form("LSTM", "forward", layout=1),
    # the trailing optional inputs left out: the builder failed with a type error
    "lstm_forward_short_inputs": _recurrent_form("LSTM", "forward", with_states=False, short_inputs=True),
    # the training build's kernels take no sequence_lens: refused
    "lstm_sequence_lens": _lstm_sequence_lens,
}
