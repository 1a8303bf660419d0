"""Graph preparation time at 20 000 and 100 000 initializers (issue 26, item 7).

The model is a chain ``out = X + w0 + ... + w{n-1}``: n Add nodes, each with its own
initializer. Each stage the full loop runs before its first step is timed: normalisation,
``add_loss_output``, the default weights, weights to inputs, and the fused step graph (the
gradient builder's graph, then ort-train's update nodes and rewrites). onnxruntime's session
creation is left out: it is onnxruntime's own cost (superlinear in the graph's outputs).

Usage: ``python benchmarks/bench_graph_prep.py [--quick] [--sizes 20000 100000] [--out DIR]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import _common as common


def chain_model(n: int) -> onnx.ModelProto:
    """n Add nodes in a chain, each adding its own one-element float initializer."""
    inits = [numpy_helper.from_array(np.full((1,), 1e-3, np.float32), f"w{i}") for i in range(n)]
    names = ["X", *(f"h{i}" for i in range(n - 1)), "out"]
    nodes = [helper.make_node("Add", [names[i], f"w{i}"], [names[i + 1]], name=f"add{i}") for i in range(n)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _timed(stages: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    t = time.perf_counter()
    out = fn()
    stages[name] = time.perf_counter() - t
    print(f"  {name:<22} {stages[name]:8.2f} s", flush=True)
    return out


def prepare(n: int, fused: bool) -> dict[str, float]:
    """Seconds per stage of preparing the n-initializer chain for the full loop."""
    from ort_train_core import LearningRateSGD, add_loss_output
    from ort_train_core._backends import get_backend
    from ort_train_core._runtime import parse_device
    from ort_train_core.graph import default_weights_to_train, initializers_to_inputs, normalise_model

    stages: dict[str, float] = {}
    model = chain_model(n)
    _timed(stages, "normalise_model", lambda: normalise_model(model))
    loss_model = _timed(stages, "add_loss_output", lambda: add_loss_output(model))
    weights = _timed(stages, "default_weights", lambda: default_weights_to_train(loss_model, "loss"))
    fed = _timed(stages, "initializers_to_inputs", lambda: initializers_to_inputs(loss_model, weights))
    if fused:
        backend, device = get_backend(), parse_device("cpu")
        lr = LearningRateSGD()
        _timed(stages, "fused_step_graph", lambda: backend.fused_step(fed, "loss", weights, lr, device))
    stages["total"] = sum(stages.values())
    return stages


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, "20 000 initializers only")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="numbers of initializers")
    parser.add_argument("--no-fused", action="store_true", help="skip the fused step graph")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([20_000] if args.quick else [20_000, 100_000])
    rows = []
    for n in sizes:
        print(f"{n} initializers", flush=True)
        rows.append({"initializers": n, "seconds": prepare(n, not args.no_fused)})
    stage_names = list(rows[0]["seconds"])
    table = common.markdown_table(
        ["initializers", *stage_names],
        [[str(r["initializers"]), *(common.fmt(r["seconds"].get(s), 3) for s in stage_names)] for r in rows],
    )
    info = common.machine_info()
    report = {"date": common.today(), "machine": info, "rows": rows}
    text = "\n".join(["# Graph preparation (seconds)", "", common.machine_line(info), "", *table, ""])
    common.write_report(args.out, "graph_prep", args.quick, report, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
