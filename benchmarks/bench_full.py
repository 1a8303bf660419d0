"""Training loop benchmark: ``OrtGradientOptimizer`` (full loop) and
``OrtGradientForwardBackwardOptimizer`` (partial loop) against their peers and the full loop's
floor, on the targets' cases: a preset of ``routes.py``.

Cases: 100k x 10 float32 synthetic regression, a linear model and an MLP with one hidden layer
of 10 ReLU units, batch 100 and 1000, 10 epochs, constant learning rate 0.01, ``shuffle=False``,
squared error with mean reduction, the same initial weights everywhere (``--quick``: 20k rows,
2 epochs, 1 repeat).

Routes (``routes.py`` describes each): the full loop (``full``), the partial loop (``partial``;
it does the same work, so its epoch loss and final MSE must equal the full loop's: the report
checks it), the floor (``floor``: the full loop's fused session pre-bound, only
``run_with_iobinding`` timed), hand-written numpy, torch, scikit-learn's
``SGDRegressor.partial_fit`` (linear only) and ``MLPRegressor(solver='sgd')``.

us/step = (best total time of a fit) / (epochs * batches per epoch), best of 3 repeats (1 with
``--quick``) after one untimed warm-up run per route, round-robin over the routes of a case.
The full and partial loops' times include everything ``fit`` does (validation, device copies,
bindings); their graphs and sessions are built apart before (``prepare``: setup). Epoch loss:
the last epoch's mean of the per-batch losses before each update (MSE); final MSE: every
route's final weights re-evaluated on all rows in float64 by one numpy function.

Gradient backends (issue 27 item 6), at one thread and at every usable CPU (the trainers' and
torch's threads): the full loop on the training build's fused step (``tb``, backend
'onnxruntime-training') and on ours (``onnx``, backend 'onnx'), both partial loops, torch's SGD
step; float32, lr 0.01: linear regression 100k x 100, batch 256; logistic regression
(cross-entropy on the logit) 100k x 1000, batch 1024 (3 epochs each); MLP 784-512-512-10 (ReLU,
softmax cross-entropy) on 20k rows, batch 128 and 256 (1 epoch). Without the training build its
routes are skipped.

Run: ``python benchmarks/bench_full.py [--quick] [--only targets|backends] [--out DIR]``; it
writes ``<host>-<date>[-backends][-stock][-quick].{json,md}``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import _common as common
import routes

N_FEATURES = 10
HIDDEN = 10
LEARNING_RATE = 0.01
SEED = 0
#: the partial loop's epoch loss and final MSE must match the full loop's within this (relative)
SAME_WORK_RTOL = 1e-5

TARGETS = [
    # (name, case or None for every case, numerator route, denominator route, op, bound)
    ("full loop <= 1.25x the floor", None, "ort", "floor", "<=", 1.25),
    ("full loop <= 1.2x numpy (linear, batch 100)", "linear-b100", "ort", "numpy", "<=", 1.2),
    ("torch / full loop >= 5 (linear, batch 100)", "linear-b100", "torch", "ort", ">=", 5.0),
    ("MLPRegressor / full loop >= 2.5 (MLP, batch 100)", "mlp-b100", "mlpregressor", "ort", ">=", 2.5),
    ("partial loop <= 2.0x full loop (linear, batch 100)", "linear-b100", "partial", "ort", "<=", 2.0),
    ("partial loop <= 1.5x full loop (MLP, batch 1000)", "mlp-b1000", "partial", "ort", "<=", 1.5),
    ("onnx backend's full loop <= 1.1x the training build's", None, "onnx", "tb", "<=", 1.1),
    ("onnx backend's partial loop <= 1.5x its full loop", None, "onnx_partial", "onnx", "<=", 1.5),
]
BACKEND_CASES = [  # (name, features, hidden, outputs, cross-entropy, batch, rows, epochs)
    ("linear-f100-b256", 100, (), 1, False, 256, 100_000, 3),
    ("logistic-f1000-b1024", 1000, (), 1, True, 1024, 100_000, 3),
    ("mlp784-b128", 784, (512, 512), 10, True, 128, 20_000, 1),
    ("mlp784-b256", 784, (512, 512), 10, True, 256, 20_000, 1),
]
BACKEND_ROUTES = {"tb": "full-onnxruntime-training", "onnx": "full-onnx", "torch": "torch"}
BACKEND_ROUTES.update(tb_partial="partial-onnxruntime-training", onnx_partial="partial-onnx")
#: the backends' table: a route's ms/step, or the ratio of two routes' (``a/b``)
COLUMNS = ["tb", "onnx", "onnx/tb", "tb_partial", "onnx_partial", "onnx_partial/onnx", "torch"]
COLUMNS += ["tb/torch", "onnx/torch", "onnx_partial/torch"]

#: result key -> (route of routes.FACTORIES, label)
ROUTES = {
    "ort": ("full", "ort-train full loop"),
    "partial": ("partial", "ort-train partial loop"),
    "floor": ("floor", "floor (pre-bound fused graph)"),
    "numpy": ("numpy", "numpy (hand-written)"),
    "torch": ("torch", "torch CPU loop"),
    "sgdregressor": ("sk_sgd", "sklearn SGDRegressor.partial_fit"),
    "mlpregressor": ("sk_mlp", "sklearn MLPRegressor(sgd)"),
}
LABELS = {key: label for key, (_, label) in ROUTES.items()} | {k: k for k in BACKEND_ROUTES}


def check_same_work(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The partial loop does the full loop's work: its losses (relative differences to the full
    loop's, run_case's reference) must equal the full loop's."""
    rows = []
    for case in (c for c in cases if {"ort", "partial"} <= set(c["routes"])):
        full, part = case["routes"]["ort"], case["routes"]["partial"]
        diff = max(part["rel_diff_epoch"], part["rel_diff_final"])
        row = {k: [full[k], part[k]] for k in ("epoch_loss", "final_mse")}
        rows.append({"case": case["name"], **row, "max_rel_diff": diff, "pass": bool(diff <= SAME_WORK_RTOL)})
    return rows


def backend_cases(quick: bool, repeats: int) -> list[dict[str, Any]]:
    """The gradient backends' cases: y from a noisy linear score (its sign, or the arg max of
    10 scores, for cross-entropy); a fifth of the rows and one epoch when ``quick``."""
    out = []
    for name, features, hidden, outputs, binary, batch, rows, epochs in BACKEND_CASES:
        rng = np.random.default_rng(SEED)
        X = rng.standard_normal((rows // 5 if quick else rows, features), dtype=np.float32)
        w = (rng.standard_normal((features, outputs)) / np.sqrt(features)).astype(np.float32)
        z = X @ w + rng.standard_normal((len(X), outputs), dtype=np.float32)
        y = np.argmax(z, axis=1) if outputs > 1 else (z[:, 0] > 0) if binary else z[:, 0]
        weights = routes.initial_weights(features, hidden, SEED + 1, outputs)
        for threads in sorted({1, common.usable_cpus()}):
            args = (X, y.astype(np.float32).reshape(-1, 1), weights, batch, 1 if quick else epochs, 0.01)
            case = routes.Case(f"{name}-t{threads}", name, *args, binary, "cpu", threads, threads)
            result = routes.run_case(case, BACKEND_ROUTES, LABELS, repeats, "onnx", 1e-4)
            out.append({**result, "threads": threads})
    return out


def backends_table(cases: list[dict[str, Any]]) -> list[str]:
    def cell(r: dict[str, Any], column: str) -> str:
        num, _, den = column.partition("/")
        if num not in r or (den and den not in r):
            return "—"
        us = r[num]["us_per_step"]
        return f"{us / r[den]['us_per_step']:.2f}" if den else f"{us / 1e3:.3f}"

    header = ["case", "threads", *(c if "/" in c else f"{c} ms" for c in COLUMNS)]
    rows = [[c["kind"], str(c["threads"])] + [cell(c["routes"], col) for col in COLUMNS] for c in cases]
    diff = max((r["rel_diff_final"] for c in cases for r in c["routes"].values()), default=0.0)
    intro = f"Gradient backends (see bench_full.py; ms/step; a/b: ratio; final losses within {diff:.1e}"
    return ["", f"{intro} of the onnx full loop's):", "", *common.markdown_table(header, rows)]


def markdown(report: dict[str, Any]) -> str:
    cfg, cases = report["config"], report["cases"]
    lines = [
        f"# Training loop benchmark ({report['date']}{', quick' if cfg['quick'] else ''})",
        "",
        common.machine_line(report["machine"]) + f" onnxruntime intra-op threads: {cfg['ort_threads']}",
        "",
        "1-minute load average around each case (other processes on the machine): " + common.load_text(cases),
        "",
        f"Targets' cases (if run): {cfg['n_rows']} x {N_FEATURES} float32, {cfg['epochs']} epochs, constant "
        f"lr={LEARNING_RATE}, shuffle=False, MSE (mean). us/step = best of {cfg['repeats']} "
        "fit times / steps. Ratio = route us/step / full-loop us/step (> 1: slower than ours). "
        "Epoch loss: last epoch, mean of per-batch losses before each update (MSE scale). "
        "Final MSE: final weights re-evaluated on all rows (float64).",
        "",
    ]
    rows = [
        [c["name"], LABELS[k], f"{r['us_per_step']:.2f}", f"{r['ratio_vs_full']:.2f}", *losses]
        for c in cases
        for k, r in c["routes"].items()
        for losses in [(common.fmt(r["epoch_loss"]), common.fmt(r["final_mse"]))]
    ]
    header = ["case", "route", "us/step", "ratio vs full loop", "epoch loss", "final MSE"]
    lines += common.markdown_table(header, rows, ["l", "l", "r", "r", "r", "r"])
    lines += [
        "",
        "Setup of the full and partial loops (trainer + prepare: graphs and sessions, timed apart), "
        "first fit (warm-up) and best fit, in ms:",
        "",
    ]
    rows = [
        [c["name"], LABELS[k], str(c["steps"])]
        + [f"{1e3 * r[t]:.1f}" for t in ("setup_seconds", "first_run_seconds", "seconds")]
        for c in cases
        for k, r in c["routes"].items()
        if k in ("ort", "partial")
    ]
    lines += common.markdown_table(
        ["case", "loop", "steps", "setup", "first fit", "best fit"], rows, ["l", "l"] + ["r"] * 4
    )
    backends = [c for c in cases if "threads" in c]
    lines += backends_table(backends) if backends else []
    lines += ["", "Targets (ratios of us/step from this run):", "", *common.targets_table(report["targets"])]
    if report["same_work"]:
        lines += [
            "",
            f"Same work: the partial loop's epoch loss and final MSE against the full loop's "
            f"(relative difference, must be <= {SAME_WORK_RTOL:g}):",
            "",
        ]
        rows = [
            [c["case"]]
            + [f"{common.fmt(c[k][0], 8)} / {common.fmt(c[k][1], 8)}" for k in ("epoch_loss", "final_mse")]
            + [f"{c['max_rel_diff']:.1e}", "PASS" if c["pass"] else "MISS"]
            for c in report["same_work"]
        ]
        header = ["case", "epoch loss full / partial", "final MSE full / partial", "max rel. diff", "result"]
        lines += common.markdown_table(header, rows, ["l", "r", "r", "r", "l"])
    lines += ["", "Route notes:", ""]
    lines += common.route_notes(
        (LABELS[k], c["name"], r["note"]) for c in cases for k, r in c["routes"].items()
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, "20k rows, 2 epochs, 1 repeat")
    parser.add_argument("--rows", type=int, default=None, help="override the number of rows")
    parser.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    parser.add_argument("--repeats", type=int, default=None, help="override the repeats")
    parser.add_argument("--only", choices=("targets", "backends"), help="the targets' or the backends' cases")
    args = parser.parse_args(argv)
    n_rows = args.rows or (20_000 if args.quick else 100_000)
    epochs = args.epochs or (2 if args.quick else 10)
    repeats = args.repeats or (1 if args.quick else 3)
    threads = common.usable_cpus()
    routes.preload()
    from ort_train_core._binding import CPU_ONE_THREAD_MAX_WORK
    from ort_train_core._runtime import is_training_build, ort_capi

    X, y = routes.make_data(n_rows, N_FEATURES, SEED)
    cases = []
    for kind, hidden in (("linear", ()), ("mlp", (HIDDEN,))) if args.only != "backends" else ():
        weights = routes.initial_weights(N_FEATURES, hidden, SEED + 1)
        for batch in (100, 1000):
            case = routes.Case(
                f"{kind}-b{batch}", kind, X, y, weights, batch, epochs, LEARNING_RATE, threads=threads
            )
            selected = {key: factory for key, (factory, _) in ROUTES.items()}
            cases.append(routes.run_case(case, selected, LABELS, repeats, reference="ort"))
    cases += backend_cases(args.quick, repeats) if args.only != "targets" else []
    for r in (r for c in cases for r in c["routes"].values()):
        r["final_mse"] = r["final_loss"]
    report: dict[str, Any] = {
        "date": common.today(),
        "config": {
            "quick": args.quick,
            "n_rows": n_rows,
            "n_features": N_FEATURES,
            "hidden": HIDDEN,
            "epochs": epochs,
            "repeats": repeats,
            "learning_rate": LEARNING_RATE,
            "seed": SEED,
            "dtype": "float32",
            "shuffle": False,
            "loss": "squared_error, mean reduction",
            "ort_threads": "one for a fused step whose batch rows x trained values is at most "
            f"{CPU_ONE_THREAD_MAX_WORK:.1e} (every case here), the default for other sessions.",
        },
        "machine": common.machine_info(threads),
        "cases": cases,
        "targets": common.check_targets(TARGETS, cases),
        "same_work": check_same_work(cases),
    }
    text = markdown(report)
    print(f"\n{text}")
    name = ["backends"] * (args.only == "backends") + ["stock"] * (not is_training_build(ort_capi))
    common.write_report(args.out, "-".join(name) or None, args.quick, report, text)
    return 1 if any(c["failed"] for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
