"""Gradient rules of the recurrences LSTM, GRU and RNN (default activations).

The forward operator is kept. The backward reads the sequence output Y (added to the node
when it writes only its final states) and recomputes every gate over all time steps at once,
``gates = [X, H_prev] @ [W, R]^T + biases`` with ``H_prev = [h0, Y[:-1]]``; the LSTM's cell
states follow from the cheap elementwise recurrence ``c_t = f_t c_{t-1} + i_t g_t``. Only the
hidden-state gradient is sequential (per step: elementwise math and one MatMul by R); dW, dR,
the bias and input gradients are single MatMuls and ReduceSums over all steps after it.

Each direction runs in its processing order (a reverse direction reads its sequences
reversed). The steps are unrolled when the sequence length is static (see
:data:`UNROLL_MAX_STEPS`), else they run in a ``Scan`` with the same body. ``layout=1`` nodes
are rewritten time first before the walk (:func:`time_major`); ``sequence_lens`` of one length
L runs the first L steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ..._builder import NodeBuilder
from ...exceptions import GraphNotDifferentiableError
from ...graph import all_names
from .._context import Context, attr, rule

Grads = list["str | None"]
#: (op, one time step of each sequence, states) -> (new states, one step of each output)
Step = Callable[[Callable[..., str], list[str], list[str]], tuple[list[str], list[str]]]

#: longest static sequence whose backward is unrolled; longer or symbolic ones run in a Scan.
#: No finite threshold: the Scan never beat the unrolled form (2-layer LSTM, hidden 256, batch
#: 32, stock onnxruntime 1.32 on 2 cores: equal within noise at T 25-200 on one thread, 1.33x
#: against 0.97x torch at T 50 and 1.42x against 1.31x at T 100 on two threads)
UNROLL_MAX_STEPS = 1 << 30

_DEFAULT_ACTIVATIONS = {
    "LSTM": ["Sigmoid", "Tanh", "Tanh"],
    "GRU": ["Sigmoid", "Tanh"],
    "RNN": ["Tanh"],
}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _refuse(node: onnx.NodeProto, what: str, fix: str) -> GraphNotDifferentiableError:
    return GraphNotDifferentiableError(
        f"the onnx backend differentiates {node.op_type} with the default activations, no clip, "
        f"no input_forget, no peepholes and sequences of one length; node {node.name!r} has {what}: "
        f"{fix}, or leave the weights before the node out of weights_to_train"
    )


def _check_supported(node: onnx.NodeProto) -> None:
    """Refuses what the rule does not differentiate, naming the node, attribute and fix."""
    directions = 2 if attr(node, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attr(node, "activations", [])]
    if acts and [a.lower() for a in acts] != [
        a.lower() for a in _DEFAULT_ACTIVATIONS[node.op_type] * directions
    ]:
        raise _refuse(node, f"activations={acts}", "export it with the default activations")
    if int(attr(node, "layout", 0)):  # the backend's graphs are rewritten by time_major first
        raise _refuse(node, "layout=1", "rewrite it with rules.recurrent.time_major")
    if attr(node, "clip") is not None:
        raise _refuse(node, f"clip={attr(node, 'clip')}", "leave the clip attribute out")
    if int(attr(node, "input_forget", 0)):
        raise _refuse(node, "input_forget=1", "set input_forget to 0")
    if node.op_type == "LSTM" and len(node.input) > 7 and node.input[7]:
        raise _refuse(node, f"peepholes P={node.input[7]!r}", "leave the peephole input P out")


def _steps(ctx: Context, node: onnx.NodeProto, time: int | str | None) -> int | str | None:
    """The number of steps the node runs: its sequence length, or the one length all its
    ``sequence_lens`` give (refused when they differ)."""
    lens = ctx.optional_value(node, 4)
    if lens is None:
        return time
    if lens.size == 0 or np.any(lens != lens.flat[0]) or (isinstance(time, int) and lens.flat[0] > time):
        raise _refuse(
            node,
            f"sequence_lens={lens.tolist()} (sequence length {time})",
            "pad the sequences to one length and leave sequence_lens out",
        )
    return int(lens.flat[0])


def _first(ctx: Context, x: str, steps: int | str | None, time: int | str | None) -> str:
    """The first ``steps`` steps of the sequence ``x`` (all of them when ``steps`` is ``time``)."""
    if steps == time:
        return x
    return ctx.op("Slice", [x, ctx.ints([0]), ctx.ints([int(steps)]), ctx.ints([0])])  # type: ignore[arg-type]


def _padded_back(ctx: Context, dx: str, x: str, steps: int | str | None, time: int | str | None) -> str:
    """The gradient of the first ``steps`` steps of ``x``, zeros after them (``time`` steps)."""
    if steps == time:
        return dx
    if isinstance(time, int):
        after = ctx.ints([time - int(steps)])  # type: ignore[arg-type]
    else:
        after = ctx.op("Sub", [ctx.op("Shape", [x], start=0, end=1), ctx.ints([int(steps)])])  # type: ignore[arg-type]
    pads = ctx.op("Concat", [ctx.ints([0, 0, 0]), after, ctx.ints([0, 0])], axis=0)
    return ctx.op("Pad", [dx, pads])


# ---- small node helpers ----------------------------------------------------------------------
def _multi(ctx: Context, op_type: str, inputs: Sequence[str], n: int, **attrs: Any) -> list[str]:
    """A node with ``n`` outputs."""
    outs = [ctx.b.name(op_type.lower()) for _ in range(n)]
    ctx.b.nodes.append(
        helper.make_node(op_type, list(inputs), outs, name=ctx.b.name(f"n_{op_type}"), **attrs)
    )
    return outs


def _split(ctx: Context, x: str, sizes: Sequence[int], axis: int = -1) -> list[str]:
    return _multi(ctx, "Split", [x, ctx.ints(sizes, "split")], len(sizes), axis=axis)


def _reversed(ctx: Context, x: str) -> str:
    """``x`` reversed along its first (time) axis."""
    last = np.iinfo(np.int64).min
    return ctx.op("Slice", [x, ctx.ints([-1]), ctx.ints([last]), ctx.ints([0]), ctx.ints([-1])])


def _pick(ctx: Context, x: str, d: int, directions: int, axis: int = 0) -> str:
    """Direction ``d`` of ``x`` (its axis ``axis`` dropped)."""
    if directions == 1:
        return ctx.op("Squeeze", [x, ctx.ints([axis])])
    index = ctx.b.const(np.array(d, dtype=np.int64), "direction", dtype=np.int64)
    return ctx.op("Gather", [x, index], axis=axis)


def _zeros_state(ctx: Context, seq: str, dtype: int) -> str:
    """Zeros shaped as one time step of the sequence ``seq`` ([T, N, H] -> [N, H])."""
    zero = helper.make_tensor("zero", dtype, [1], [0])
    return ctx.op("ConstantOfShape", [ctx.op("Shape", [seq], start=1)], "zero_state", value=zero)


def _zeros_like(ctx: Context, x: str) -> str:
    zero = helper.make_tensor("zero", ctx.dtype(x), [1], [0])
    return ctx.op("ConstantOfShape", [ctx.op("Shape", [x])], "zeros", value=zero)


def _one_minus(ctx: Context, x: str, like: str) -> str:
    return ctx.op("Sub", [ctx.const(1.0, like=like), x])


def _sigmoid_slope(ctx: Context, s: str, like: str) -> str:
    """s (1 - s): the derivative of the sigmoid whose value is ``s``."""
    return ctx.op("Mul", [s, _one_minus(ctx, s, like)])


def _tanh_slope(ctx: Context, t: str, like: str) -> str:
    """1 - t^2: the derivative of the tanh whose value is ``t``."""
    return _one_minus(ctx, ctx.op("Mul", [t, t]), like)


def _flat(ctx: Context, x: str, width: int) -> str:
    return ctx.reshape(x, (-1, width))


def _weight_grad(ctx: Context, dg: str, x: str, gates: int, width: int) -> str:
    """sum over time and batch of dG^T x: one Gemm of the flattened steps, [gates, width]."""
    return ctx.op("Gemm", [_flat(ctx, dg, gates), _flat(ctx, x, width)], transA=1)


# ---- running the steps -----------------------------------------------------------------------
def run_steps(
    ctx: Context,
    step: Step,
    seqs: Sequence[str],
    states: Sequence[str],
    n_out: int,
    time: int | str | None,
    backward: bool,
    dtype: int,
) -> tuple[list[str], list[str]]:
    """``step`` over time (last step first when ``backward``): the final states ([N, .]) and
    each output stacked over time ([T, N, .], in time order). Unrolled when ``time`` is static
    and at most :data:`UNROLL_MAX_STEPS`, else one ``Scan`` whose body is ``step``."""
    if isinstance(time, int) and time <= UNROLL_MAX_STEPS:
        return _unrolled(ctx, step, seqs, states, n_out, time, backward)
    return _scan(ctx, step, seqs, states, n_out, backward, dtype)


def _unrolled(
    ctx: Context,
    step: Step,
    seqs: Sequence[str],
    states: Sequence[str],
    n_out: int,
    time: int,
    backward: bool,
) -> tuple[list[str], list[str]]:
    pieces = [_split(ctx, s, [1] * time, axis=0) if time > 1 else [s] for s in seqs]
    axis0 = ctx.ints([0])
    carried = [ctx.op("Unsqueeze", [s, axis0]) for s in states]  # [1, N, .] like the pieces
    outs: list[list[str]] = [[] for _ in range(n_out)]
    for t in reversed(range(time)) if backward else range(time):
        carried, ys = step(ctx.op, [p[t] for p in pieces], carried)
        for k, y in enumerate(ys):
            outs[k].append(y)
    if backward:
        outs = [o[::-1] for o in outs]
    stacked = [ctx.op("Concat", o, axis=0) if len(o) > 1 else o[0] for o in outs]
    return [ctx.op("Squeeze", [s, axis0]) for s in carried], stacked


def _scan(
    ctx: Context,
    step: Step,
    seqs: Sequence[str],
    states: Sequence[str],
    n_out: int,
    backward: bool,
    dtype: int,
) -> tuple[list[str], list[str]]:
    """One Scan: the body is written by ``step`` with the same builder (unique names), then
    moved out of the main graph. A backward run reverses its sequences around a forward Scan
    (onnx's reference evaluator runs no reverse Scan)."""
    if backward:
        seqs = [_reversed(ctx, s) for s in seqs]
    start = len(ctx.b.nodes)
    state_in = [ctx.b.name("scan_state") for _ in states]
    seq_in = [ctx.b.name("scan_step") for _ in seqs]
    new_states, ys = step(ctx.op, seq_in, state_in)
    outs = [ctx.op("Identity", [v], "scan_out") for v in [*new_states, *ys]]
    body_nodes = ctx.b.nodes[start:]
    del ctx.b.nodes[start:]
    body = helper.make_graph(
        body_nodes,
        ctx.b.name("scan_body"),
        [helper.make_tensor_value_info(n, dtype, None) for n in [*state_in, *seq_in]],
        [helper.make_tensor_value_info(n, dtype, None) for n in outs],
    )
    results = _multi(ctx, "Scan", [*states, *seqs], len(states) + n_out, body=body, num_scan_inputs=len(seqs))
    stacked = results[len(states) :]
    return results[: len(states)], [_reversed(ctx, y) for y in stacked] if backward else stacked


# ---- one direction, in its processing order ----------------------------------------------------
@dataclass
class _Direction:
    """One direction's values, time first, in processing order."""

    x: str  # [T, N, I]
    y: str  # [T, N, H]
    h_prev: str  # [T, N, H]: h0, then y[:-1]
    dy: str  # [T, N, H]
    dh_last: str  # [N, H]: the final state's gradient (zeros when none)
    w: str  # [G H, I]
    r: str  # [G H, H]
    wb: str | None  # [G H]
    rb: str | None  # [G H]
    c0: str | None  # [N, H] (LSTM)
    dc_last: str | None  # [N, H] (LSTM)
    like: str  # a forward value of the element type (for constants)
    features: int  # I


@dataclass
class _Grads:
    """One direction's gradients (None where not computed)."""

    dgx: str  # [T, N, G H]: the gradient of the input-side pre-activations (for W, Wb, X)
    dgh: str  # [T, N, G H]: of the recurrent-side ones (for Rb)
    dr: str  # [G H, H]
    dh0: str  # [N, H]
    dc0: str | None = None
    dw: str | None = None  # [G H, I] where the rule computed it with dR (one Gemm)


def _previous(ctx: Context, first: str, seq: str) -> str:
    """[first, seq[:-1]]: the value each step starts from ([N, H] and [T, N, H])."""
    head = ctx.op("Unsqueeze", [first, ctx.ints([0])])
    return ctx.op(
        "Concat", [head, ctx.op("Slice", [seq, ctx.ints([0]), ctx.ints([-1]), ctx.ints([0])])], axis=0
    )


def _cell_step(op: Callable[..., str], seq: list[str], states: list[str]) -> tuple[list[str], list[str]]:
    """The LSTM cell state: c_t = f_t c_{t-1} + (i g)_t."""
    f, ig = seq
    c = op("Add", [op("Mul", [f, states[0]]), ig])
    return [c], [c]


def _lstm_step(r: str) -> Step:
    def step(op: Callable[..., str], seq: list[str], states: list[str]) -> tuple[list[str], list[str]]:
        dy, slope, k, f = seq  # slope = o (1 - tanh(c)^2); k: dG = [dc, dh, dc, dc] * k
        rec, carry = states  # dh from step t+1 through R, dc from step t+1 through f_{t+1}
        dh = op("Add", [dy, rec])
        dc = op("Add", [carry, op("Mul", [dh, slope])])
        dg = op("Mul", [op("Concat", [dc, dh, dc, dc], axis=-1), k])
        return [op("MatMul", [dg, r]), op("Mul", [dc, f])], [dg]

    return step


def _lstm(ctx: Context, d: _Direction, hidden: int, time: int | str | None, dtype: int) -> _Grads:
    """LSTM gates i, o, f, c (ONNX order): recomputed, then the sequential dh, dc."""
    h, like = hidden, d.like
    xh = ctx.op("Concat", [d.x, d.h_prev], axis=-1)
    gates = ctx.op("MatMul", [xh, _transposed(ctx, d.w, d.r)])
    if d.wb is not None and d.rb is not None:
        gates = ctx.op("Add", [gates, ctx.op("Add", [d.wb, d.rb])])
    sig, cand = _split(ctx, gates, [3 * h, h])
    i, o, f = _split(ctx, ctx.op("Sigmoid", [sig]), [h, h, h])
    g = ctx.op("Tanh", [cand])
    c0 = d.c0 if d.c0 is not None else _zeros_state(ctx, d.y, dtype)
    _, (c,) = run_steps(ctx, _cell_step, [f, ctx.op("Mul", [i, g])], [c0], 1, time, False, dtype)
    tc = ctx.op("Tanh", [c])
    slope = ctx.op("Mul", [o, _tanh_slope(ctx, tc, like)])
    k = [
        ctx.op("Mul", [g, _sigmoid_slope(ctx, i, like)]),  # d/d i_pre = dc g i (1 - i)
        ctx.op("Mul", [tc, _sigmoid_slope(ctx, o, like)]),  # d/d o_pre = dh tanh(c) o (1 - o)
        ctx.op("Mul", [_previous(ctx, c0, c), _sigmoid_slope(ctx, f, like)]),  # dc c_{t-1} f (1 - f)
        ctx.op("Mul", [i, _tanh_slope(ctx, g, like)]),  # d/d g_pre = dc i (1 - g^2)
    ]
    dc_last = d.dc_last if d.dc_last is not None else _zeros_state(ctx, d.y, dtype)
    seqs = [d.dy, slope, ctx.op("Concat", k, axis=-1), f]
    (dh0, dc0), (dg,) = run_steps(ctx, _lstm_step(d.r), seqs, [d.dh_last, dc_last], 1, time, True, dtype)
    # [dW, dR] = dG^T [X, H_prev]: one Gemm over every step
    dw, dr = _split(ctx, _weight_grad(ctx, dg, xh, 4 * h, d.features + h), [d.features, h], axis=1)
    return _Grads(dg, dg, dr, dh0, dc0, dw)


def _transposed(ctx: Context, *blocks: str) -> str:
    """[blocks...]^T: the matrices side by side (along their columns), transposed."""
    joined = ctx.op("Concat", list(blocks), axis=1) if len(blocks) > 1 else blocks[0]
    return ctx.transpose(joined, [1, 0])


def _rnn_step(r: str) -> Step:
    def step(op: Callable[..., str], seq: list[str], states: list[str]) -> tuple[list[str], list[str]]:
        dy, slope = seq  # slope = 1 - y^2
        da = op("Mul", [op("Add", [dy, states[0]]), slope])
        return [op("MatMul", [da, r])], [da]

    return step


def _rnn(ctx: Context, d: _Direction, hidden: int, time: int | str | None, dtype: int) -> _Grads:
    """RNN: y = tanh(pre-activation), read from Y itself."""
    slope = _tanh_slope(ctx, d.y, d.like)
    (dh0,), (dg,) = run_steps(ctx, _rnn_step(d.r), [d.dy, slope], [d.dh_last], 1, time, True, dtype)
    return _Grads(dg, dg, _weight_grad(ctx, dg, d.h_prev, hidden, hidden), dh0)


def _gru_step_after_reset(r_zr: str, r_h: str) -> Step:
    """linear_before_reset=0: n = tanh(Xh + (r h_prev) Rh^T + b): two MatMuls a step."""

    def step(op: Callable[..., str], seq: list[str], states: list[str]) -> tuple[list[str], list[str]]:
        dy, kz, kh, kr, z, rr = seq  # kz, kh: d/d z_pre, n_pre per dh; kr = h_prev r (1 - r)
        dh = op("Add", [dy, states[0]])
        dah = op("Mul", [dh, kh])
        drh = op("MatMul", [dah, r_h])  # the gradient of r h_prev
        dzr = op("Concat", [op("Mul", [dh, kz]), op("Mul", [drh, kr])], axis=-1)
        rec = op("Add", [op("Add", [op("Mul", [dh, z]), op("Mul", [drh, rr])]), op("MatMul", [dzr, r_zr])])
        return [rec], [op("Concat", [dzr, dah], axis=-1)]

    return step


def _gru_step_before_reset(r: str) -> Step:
    """linear_before_reset=1 (torch): n = tanh(Xh + r (h_prev Rh^T + b)): one MatMul a step."""

    def step(op: Callable[..., str], seq: list[str], states: list[str]) -> tuple[list[str], list[str]]:
        dy, k, z = seq  # k: dG_recurrent = [dh, dh, dh] * k
        dh = op("Add", [dy, states[0]])
        dgh = op("Mul", [op("Concat", [dh, dh, dh], axis=-1), k])
        return [op("Add", [op("Mul", [dh, z]), op("MatMul", [dgh, r])])], [dh]

    return step


def _gru(
    ctx: Context, d: _Direction, hidden: int, time: int | str | None, dtype: int, before_reset: bool
) -> _Grads:
    """GRU gates z, r, h (ONNX order), recomputed, then the sequential dh."""
    h, like = hidden, d.like
    gx = ctx.op("MatMul", [d.x, _transposed(ctx, d.w)])
    gx = gx if d.wb is None else ctx.op("Add", [gx, d.wb])
    gx_zr, gx_h = _split(ctx, gx, [2 * h, h])
    r_zr, r_h = _split(ctx, d.r, [2 * h, h], axis=0)
    rb_zr, rb_h = _split(ctx, d.rb, [2 * h, h]) if d.rb is not None else (None, None)
    pre = _matmul_add(ctx, d.h_prev, r_zr if not before_reset else d.r, rb_zr if not before_reset else d.rb)
    gh_zr, gh_h = _split(ctx, pre, [2 * h, h]) if before_reset else (pre, "")
    z, r = _split(ctx, ctx.op("Sigmoid", [ctx.op("Add", [gx_zr, gh_zr])]), [h, h])
    if before_reset:
        n = ctx.op("Tanh", [ctx.op("Add", [gx_h, ctx.op("Mul", [r, gh_h])])])
    else:
        rh = ctx.op("Mul", [r, d.h_prev])
        n = ctx.op("Tanh", [ctx.op("Add", [gx_h, _matmul_add(ctx, rh, r_h, rb_h)])])
    kz = ctx.op("Mul", [ctx.op("Sub", [d.h_prev, n]), _sigmoid_slope(ctx, z, like)])
    kh = ctx.op("Mul", [_one_minus(ctx, z, like), _tanh_slope(ctx, n, like)])
    if not before_reset:
        kr = ctx.op("Mul", [d.h_prev, _sigmoid_slope(ctx, r, like)])
        step = _gru_step_after_reset(r_zr, r_h)
        (dh0,), (dg,) = run_steps(ctx, step, [d.dy, kz, kh, kr, z, r], [d.dh_last], 1, time, True, dtype)
        dg_zr, dg_h = _split(ctx, dg, [2 * h, h])
        dr_parts = [_weight_grad(ctx, dg_zr, d.h_prev, 2 * h, h), _weight_grad(ctx, dg_h, rh, h, h)]
        return _Grads(dg, dg, ctx.op("Concat", dr_parts, axis=0), dh0)
    kr = ctx.op("Mul", [ctx.op("Mul", [kh, gh_h]), _sigmoid_slope(ctx, r, like)])
    k = ctx.op("Concat", [kz, kr, ctx.op("Mul", [kh, r])], axis=-1)
    (dh0,), (dh,) = run_steps(
        ctx, _gru_step_before_reset(d.r), [d.dy, k, z], [d.dh_last], 1, time, True, dtype
    )
    dh3 = ctx.op("Concat", [dh, dh, dh], axis=-1)
    dgx = ctx.op("Mul", [dh3, ctx.op("Concat", [kz, kr, kh], axis=-1)])
    dgh = ctx.op("Mul", [dh3, k])
    return _Grads(dgx, dgh, _weight_grad(ctx, dgh, d.h_prev, 3 * h, h), dh0)


def _matmul_add(ctx: Context, x: str, w: str, b: str | None) -> str:
    """x @ w^T (+ b)."""
    y = ctx.op("MatMul", [x, _transposed(ctx, w)])
    return y if b is None else ctx.op("Add", [y, b])


# ---- the node: layout, directions, assembly ------------------------------------------------------
def time_major(model: onnx.ModelProto) -> None:
    """Rewrites, in place, every LSTM, GRU and RNN node of ``model`` with ``layout=1`` (batch
    first) as a ``layout=0`` node between Transposes: onnxruntime's kernels run no layout 1."""
    g = model.graph
    if not any(n.op_type in _GATES and int(attr(n, "layout", 0)) for n in g.node):
        return
    b = NodeBuilder(onnx.TensorProto.FLOAT, 17, all_names(model))
    nodes: list[onnx.NodeProto] = []
    for node in g.node:
        if node.op_type not in _GATES or not int(attr(node, "layout", 0)):
            nodes.append(node)
            continue
        start = len(b.nodes)
        ins = list(node.input)  # X [N, T, I] -> [T, N, I]; states [N, D, H] -> [D, N, H]
        for k in (0, 5, 6):
            if k < len(ins) and ins[k]:
                ins[k] = b.op("Transpose", [ins[k]], f"{ins[k]}_time_major", perm=[1, 0, 2])
        outs = [b.name(f"{o}_time_major") if o else "" for o in node.output]
        inner = helper.make_node(node.op_type, ins, outs, name=node.name or b.name(f"n_{node.op_type}"))
        inner.attribute.extend(a for a in node.attribute if a.name != "layout")
        b.nodes.append(inner)
        for k, (out, mine) in enumerate(zip(node.output, outs)):  # Y [T, D, N, H] -> [N, T, D, H]
            if out:
                perm = [2, 0, 1, 3] if k == 0 else [1, 0, 2]
                b.nodes.append(
                    helper.make_node("Transpose", [mine], [out], name=b.name("n_Transpose"), perm=perm)
                )
        nodes.extend(b.nodes[start:])
    del g.node[:]
    g.node.extend(nodes)


def _direction(
    ctx: Context, node: onnx.NodeProto, seqs: list[str], dys: Grads, d: int, count: int, reverse: bool
) -> _Direction:
    """Direction ``d`` of ``count``, in its processing order (``seqs``: the steps the node runs
    of X, Y and dY)."""
    x, y, dy = seqs
    dtype = ctx.dtype(node.input[0])
    inputs = [*node.input, *[""] * (8 - len(node.input))]
    grads = [*dys, None, None]

    def pick(v: str | None, axis: int = 0) -> str | None:
        return None if v is None else _pick(ctx, v, d, count, axis)

    def timed(v: str) -> str:
        return _reversed(ctx, v) if reverse else v

    y_d = timed(pick(y, 1) or "")
    h0 = pick(inputs[5] or None) or _zeros_state(ctx, y_d, dtype)
    bias = pick(inputs[3] or None)
    gates = ctx.shape(node.input[1])[1]
    wb, rb = _split(ctx, bias, [gates, gates]) if bias is not None else (None, None)
    dh_last, dc_last = pick(grads[1]), pick(grads[2])
    return _Direction(
        x=timed(x),
        y=y_d,
        h_prev=_previous(ctx, h0, y_d),
        dy=timed(pick(dy, 1) or ""),
        dh_last=dh_last if dh_last is not None else _zeros_state(ctx, y_d, dtype),
        w=pick(node.input[1]) or "",
        r=pick(node.input[2]) or "",
        wb=wb,
        rb=rb,
        c0=pick(inputs[6] or None) if node.op_type == "LSTM" else None,
        dc_last=dc_last,
        like=node.input[0],
        features=int(ctx.shape(node.input[1])[-1]),
    )


def _stack(ctx: Context, parts: list[str]) -> str:
    """[D, ...] from one value per direction."""
    axis0 = ctx.ints([0])
    stacked = [ctx.op("Unsqueeze", [p, axis0]) for p in parts]
    return ctx.op("Concat", stacked, axis=0) if len(stacked) > 1 else stacked[0]


@rule("LSTM", "GRU", "RNN")
def _recurrent(ctx: Context, node: onnx.NodeProto, dys: Grads) -> Grads:
    """The gradients of X, W, R, B, initial_h (and initial_c), layout 0 (see :func:`time_major`)."""
    time, n, _ = ctx.dims(node.input[0])
    _check_supported(node)
    steps = _steps(ctx, node, time)
    direction = attr(node, "direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    count = 2 if direction == "bidirectional" else 1
    hidden = int(ctx.shape(node.input[2])[-1])
    gates = _GATES[node.op_type] * hidden
    dtype = ctx.dtype(node.input[0])
    y = ctx.output_of(node, 0, f"{node.name or node.op_type}_Y", dtype, (time, count, n, hidden))
    dy = dys[0] if dys[0] is not None else _zeros_like(ctx, y)
    seqs = [_first(ctx, v, steps, time) for v in (node.input[0], y, dy)]
    dw, dr, db, dx, dh0, dc0 = [], [], [], [], [], []
    for d in range(count):
        reverse = direction == "reverse" or d == 1
        one = _direction(ctx, node, seqs, dys, d, count, reverse)
        if node.op_type == "LSTM":
            g = _lstm(ctx, one, hidden, steps, dtype)
        elif node.op_type == "GRU":
            g = _gru(ctx, one, hidden, steps, dtype, bool(attr(node, "linear_before_reset", 0)))
        else:
            g = _rnn(ctx, one, hidden, steps, dtype)
        dw.append(g.dw or _weight_grad(ctx, g.dgx, one.x, gates, one.features))
        dr.append(g.dr)
        bias_x = ctx.reduce_sum(g.dgx, [0, 1], 0)
        bias_h = bias_x if g.dgh == g.dgx else ctx.reduce_sum(g.dgh, [0, 1], 0)
        db.append(ctx.op("Concat", [bias_x, bias_h], axis=0))
        x_grad = ctx.op("MatMul", [g.dgx, one.w])
        dx.append(_reversed(ctx, x_grad) if reverse else x_grad)
        dh0.append(g.dh0)
        dc0.append(g.dc0)
    grads: Grads = [
        _padded_back(ctx, ctx.op("Sum", dx) if count > 1 else dx[0], node.input[0], steps, time),
        _stack(ctx, dw),
        _stack(ctx, dr),
        _stack(ctx, db),
        None,
        _stack(ctx, dh0),
        _stack(ctx, [c for c in dc0 if c is not None]) if node.op_type == "LSTM" else None,
        None,
    ]
    return grads[: len(node.input)]
