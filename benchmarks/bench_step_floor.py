"""What one SGD step of a linear model can cost in onnxruntime, against what ours costs and what
scikit-learn pays for the same rows: the floor under the SGD drop-ins' fit time on small data.

Model: a linear classifier on breast_cancer-sized data (426 rows x 30 features, standardised
synthetic), hinge loss, l2 penalty, batches of 16 rows. Routes, each timed per step (one thread):

- ``ours``: the marginal cost of a step in ``OrtGradientOptimizer``'s fit loop (the fused step
  of ``add_loss_output(..., 'hinge')`` with its loss output, bindings and Python), from fits of
  1 and 21 epochs;
- ``hand-written step``: the same update written by hand in 17 standard operators (forward,
  hinge subgradient, l2 decay, SGD update; no loss output), one ``run_with_iobinding`` per step
  (inputs bound once, weights double-buffered, as the fit loop binds its step);
- ``hand-written epoch loop``: that step as the body of an ONNX ``Loop`` over the 27 batches of
  an epoch, one run per epoch;
- ``scikit-learn``: ``SGDClassifier``'s fit time per 16 rows (its per-sample steps), from fits
  of 1 and 21 epochs.

And what any onnxruntime run pays whatever its arithmetic: chains of 1 to 64 ``Add`` nodes on 30
floats, one ``run_with_iobinding`` each, give the fixed cost of a run and the cost of each
operator (a least-squares line through the chain lengths). With those, the rows per step at which
our step costs what scikit-learn pays for the same rows.

Run: ``python benchmarks/bench_step_floor.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>-step-floor[-quick].{json,md}``.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import _common as common

ROWS, FEATURES, BATCH = 426, 30, 16
ALPHA = 1e-4


def _best(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    y = (X @ rng.standard_normal(FEATURES) + 0.5 * rng.standard_normal(ROWS) > 0).astype(np.int64)
    return X, y


def _hand_nodes() -> tuple[list[Any], list[Any]]:
    """The step's nodes (X, Y in {-1, 1}, W, b -> W2, b2) and their constants."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes = [
        h.make_node("Gemm", ["X", "W", "b"], ["z"]),
        h.make_node("Mul", ["Y", "z"], ["margin"]),
        h.make_node("Less", ["margin", "one"], ["active"]),
        h.make_node("Where", ["active", "Y", "zero"], ["g"]),  # minus the hinge subgradient
        h.make_node("Gemm", ["X", "g"], ["gW"], transA=1),
        h.make_node("ReduceSum", ["g", "axis0"], ["gb1"], keepdims=0),
        h.make_node("Reshape", ["gb1", "bias_shape"], ["gb"]),
        h.make_node("Mul", ["W", "decay"], ["Wd"]),
        h.make_node("Mul", ["gW", "rate"], ["sW"]),
        h.make_node("Add", ["Wd", "sW"], ["W2"]),
        h.make_node("Mul", ["gb", "rate"], ["sb"]),
        h.make_node("Add", ["b", "sb"], ["b2"]),
    ]
    consts = [
        h.make_tensor("one", T.FLOAT, [1, 1], [1.0]),
        h.make_tensor("zero", T.FLOAT, [1, 1], [0.0]),
        h.make_tensor("axis0", T.INT64, [1], [0]),
        h.make_tensor("bias_shape", T.INT64, [1], [1]),
        h.make_tensor("decay", T.FLOAT, [1], [1.0 - 0.01 * ALPHA]),
        h.make_tensor("rate", T.FLOAT, [1], [0.01 / BATCH]),
    ]
    return nodes, consts


def _session(graph: Any) -> Any:
    import onnx
    import onnxruntime

    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def hand_written(X: np.ndarray, y: np.ndarray, repeats: int) -> dict[str, float]:
    """Seconds per step of the hand-written step, one run per step and in an epoch Loop."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes, consts = _hand_nodes()
    f = lambda n, s: h.make_tensor_value_info(n, T.FLOAT, s)  # noqa: E731
    step = _session(
        h.make_graph(
            nodes,
            "step",
            [f("X", [BATCH, FEATURES]), f("Y", [BATCH, 1]), f("W", [FEATURES, 1]), f("b", [1])],
            [f("W2", [FEATURES, 1]), f("b2", [1])],
            initializer=consts,
        )
    )
    n_batches = ROWS // BATCH
    Xe = X[: n_batches * BATCH]
    Ye = (2.0 * y[: n_batches * BATCH] - 1.0).astype(np.float32).reshape(-1, 1)
    W, b = np.zeros((FEATURES, 1), np.float32), np.zeros(1, np.float32)

    # as the fit loop runs its step: inputs bound once, weights double-buffered, no conversion
    import onnxruntime

    value = onnxruntime.OrtValue.ortvalue_from_numpy
    weights = [(value(W.copy()), value(b.copy())) for _ in range(2)]
    batches = [
        (value(Xe[i * BATCH : (i + 1) * BATCH]), value(Ye[i * BATCH : (i + 1) * BATCH]))
        for i in range(n_batches)
    ]
    bindings = []
    for i in range(n_batches):
        per_parity = []
        for p in range(2):
            binding = step.io_binding()
            binding.bind_ortvalue_input("X", batches[i][0])
            binding.bind_ortvalue_input("Y", batches[i][1])
            binding.bind_ortvalue_input("W", weights[p][0])
            binding.bind_ortvalue_input("b", weights[p][1])
            binding.bind_ortvalue_output("W2", weights[1 - p][0])
            binding.bind_ortvalue_output("b2", weights[1 - p][1])
            per_parity.append(binding)
        bindings.append(per_parity)

    def one_run_per_step() -> None:
        for i in range(n_batches):
            step.run_with_iobinding(bindings[i][i % 2])

    slicing = [
        h.make_node("Mul", ["i", "batch"], ["start"]),
        h.make_node("Add", ["start", "batch"], ["end"]),
        h.make_node("Slice", ["Xall", "start", "end", "axis0"], ["X"]),
        h.make_node("Slice", ["Yall", "start", "end", "axis0"], ["Y"]),
    ]
    body = h.make_graph(
        [*slicing, *nodes, h.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("cond", T.BOOL, []),
            f("W", [FEATURES, 1]),
            f("b", [1]),
        ],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), f("W2", [FEATURES, 1]), f("b2", [1])],
    )
    loop = _session(
        h.make_graph(
            [h.make_node("Loop", ["n", "", "W0", "b0"], ["W_end", "b_end"], body=body)],
            "epoch",
            [
                h.make_tensor_value_info("n", T.INT64, []),
                f("Xall", [None, FEATURES]),
                f("Yall", [None, 1]),
                f("W0", [FEATURES, 1]),
                f("b0", [1]),
            ],
            [f("W_end", [FEATURES, 1]), f("b_end", [1])],
            initializer=[*consts, h.make_tensor("batch", T.INT64, [1], [BATCH])],
        )
    )
    feeds = {"n": np.array(n_batches, np.int64), "Xall": Xe, "Yall": Ye, "W0": W, "b0": b}
    return {
        "hand-written step": _best(one_run_per_step, repeats) / n_batches,
        "hand-written epoch loop": _best(lambda: loop.run(None, feeds), repeats) / n_batches,
    }


#: the chain lengths of the operator-cost measurement
CHAIN_LENGTHS = (1, 4, 16, 64)


def operator_cost(repeats: int) -> dict[str, float]:
    """Seconds of one onnxruntime run's fixed cost and of each further tiny operator."""
    import onnxruntime
    from onnx import TensorProto as T
    from onnx import helper as h

    runs = 200
    seconds = []
    for n in CHAIN_LENGTHS:
        nodes = [h.make_node("Add", [f"x{i}", "c"], [f"x{i + 1}"]) for i in range(n)]
        vi = lambda name: h.make_tensor_value_info(name, T.FLOAT, [FEATURES, 1])  # noqa: E731
        graph = h.make_graph(
            nodes, "chain", [vi("x0")], [vi(f"x{n}")], initializer=[h.make_tensor("c", T.FLOAT, [1], [1.0])]
        )
        session = _session(graph)
        binding = session.io_binding()
        zeros = np.zeros((FEATURES, 1), np.float32)
        binding.bind_ortvalue_input("x0", onnxruntime.OrtValue.ortvalue_from_numpy(zeros))
        binding.bind_ortvalue_output(f"x{n}", onnxruntime.OrtValue.ortvalue_from_numpy(zeros.copy()))

        def many(session: Any = session, binding: Any = binding) -> None:
            for _ in range(runs):
                session.run_with_iobinding(binding)

        seconds.append(_best(many, repeats) / runs)
    per_node, fixed = np.polyfit(np.array(CHAIN_LENGTHS, float), np.array(seconds), 1)
    return {"fixed cost of a run": float(fixed), "each operator": float(per_node)}


def ours(X: np.ndarray, y: np.ndarray, repeats: int) -> float:
    """Seconds per step of the fit loop's marginal step (fits of 21 and 1 epochs)."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    from ort_train_core import LearningRateSGD, OrtGradientOptimizer, add_loss_output

    graph = h.make_graph(
        [h.make_node("MatMul", ["X", "coef"], ["mm"]), h.make_node("Add", ["mm", "intercept"], ["scores"])],
        "linear",
        [h.make_tensor_value_info("X", T.FLOAT, [None, FEATURES])],
        [h.make_tensor_value_info("scores", T.FLOAT, [None, 1])],
        [
            numpy_helper.from_array(np.zeros((FEATURES, 1), np.float32), "coef"),
            numpy_helper.from_array(np.zeros(1, np.float32), "intercept"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    loss_model = add_loss_output(model, "hinge", penalty={"coef": {"l2": ALPHA / 2}})

    def fit(epochs: int) -> Callable[[], Any]:
        lr = LearningRateSGD(eta0=0.01, learning_rate="constant")
        return lambda: OrtGradientOptimizer(
            loss_model, batch_size=BATCH, max_iter=epochs, learning_rate=lr, random_state=0
        ).fit(X, y)

    steps = 20 * -(-ROWS // BATCH)
    return (_best(fit(21), repeats) - _best(fit(1), repeats)) / steps


def sklearn(X: np.ndarray, y: np.ndarray, repeats: int) -> float:
    """Seconds per BATCH rows of SGDClassifier's fit (fits of 21 and 1 epochs)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier

    def fit(epochs: int) -> Callable[[], Any]:
        return lambda: SGDClassifier(max_iter=epochs, tol=None, random_state=0).fit(X, y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return (_best(fit(21), repeats) - _best(fit(1), repeats)) / (20 * ROWS) * BATCH


def run(quick: bool) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    repeats = 3 if quick else 10
    X, y = _data()
    undo = common.force_session_threads(1)
    try:
        with threadpool_limits(1):
            per_step = {"ours (fit loop, fused step with loss)": ours(X, y, repeats)}
            per_step.update(hand_written(X, y, repeats))
            per_step["scikit-learn (16 per-sample steps)"] = sklearn(X, y, repeats)
            per_run = operator_cost(repeats)
    finally:
        undo()
    return {
        "date": common.today(),
        "config": {"quick": quick, "rows": ROWS, "features": FEATURES, "batch": BATCH, "threads": 1},
        "machine": common.machine_info(),
        "per_step_s": per_step,
        "per_run_s": per_run,
        # the batch at which a step of ours (its cost grows little with the rows at this size)
        # costs what scikit-learn pays for as many rows
        "break_even_rows": per_step["ours (fit loop, fused step with loss)"]
        / (per_step["scikit-learn (16 per-sample steps)"] / BATCH),
    }


def markdown_lines(report: dict[str, Any]) -> list[str]:
    rows = [[name, f"{s * 1e6:.1f}"] for name, s in report["per_step_s"].items()]
    c = report["config"]
    return [
        f"### One SGD step of a linear hinge classifier ({c['rows']} x {c['features']}, batches of "
        f"{c['batch']}, one thread)",
        "",
        *common.markdown_table(["route", "us per step"], rows, ["l", "r"]),
        "",
        f"Rows per step at which our step costs what scikit-learn pays for them: "
        f"{report['break_even_rows']:.0f}.",
        "",
        "### What an onnxruntime run costs whatever its arithmetic (chains of tiny Add nodes, one thread)",
        "",
        *common.markdown_table(
            ["part", "us"], [[k, f"{v * 1e6:.2f}"] for k, v in report["per_run_s"].items()], ["l", "r"]
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, "3 repeats instead of 10")
    args = parser.parse_args(argv)
    report = run(args.quick)
    text = "\n".join(
        ["# Step floor", "", common.machine_line(report["machine"]), "", *markdown_lines(report)]
    )
    print(text)
    common.write_report(args.out, "step-floor", args.quick, report, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
