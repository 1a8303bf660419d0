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

Run: ``python benchmarks/bench_full.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>[-quick].{json,md}``.
"""

from __future__ import annotations

import sys
from typing import Any

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
]

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
LABELS = {key: label for key, (_, label) in ROUTES.items()}


def check_same_work(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The partial loop does the full loop's work: its losses must equal the full loop's."""
    rows = []
    for case in cases:
        if "ort" in case["routes"] and "partial" in case["routes"]:
            full, part = case["routes"]["ort"], case["routes"]["partial"]
            diffs = [abs(part[k] - full[k]) / max(abs(full[k]), 1e-30) for k in ("epoch_loss", "final_mse")]
            rows.append(
                {
                    "case": case["name"],
                    "epoch_loss": [full["epoch_loss"], part["epoch_loss"]],
                    "final_mse": [full["final_mse"], part["final_mse"]],
                    "max_rel_diff": max(diffs),
                    "pass": bool(max(diffs) <= SAME_WORK_RTOL),
                }
            )
    return rows


def markdown(report: dict[str, Any]) -> str:
    cfg, cases = report["config"], report["cases"]
    lines = [
        f"# Training loop benchmark ({report['date']}{', quick' if cfg['quick'] else ''})",
        "",
        common.machine_line(report["machine"]) + f" onnxruntime intra-op threads: {cfg['ort_threads']}",
        "",
        "1-minute load average around each case (other processes on the machine): " + common.load_text(cases),
        "",
        f"Data: {cfg['n_rows']} x {N_FEATURES} float32, {cfg['epochs']} epochs, constant "
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
    args = parser.parse_args(argv)
    n_rows = args.rows or (20_000 if args.quick else 100_000)
    epochs = args.epochs or (2 if args.quick else 10)
    repeats = args.repeats or (1 if args.quick else 3)
    threads = common.usable_cpus()
    routes.preload()
    from ort_train_core._binding import CPU_ONE_THREAD_MAX_WORK

    X, y = routes.make_data(n_rows, N_FEATURES, False, SEED)
    cases = []
    for kind, hidden in (("linear", ()), ("mlp", (HIDDEN,))):
        weights = routes.initial_weights(N_FEATURES, hidden, SEED + 1)
        for batch in (100, 1000):
            case = routes.Case(
                f"{kind}-b{batch}", kind, X, y, weights, batch, epochs, LEARNING_RATE, threads=threads
            )
            selected = {key: factory for key, (factory, _) in ROUTES.items()}
            result = routes.run_case(case, selected, LABELS, repeats, reference="ort")
            for r in result["routes"].values():
                r["final_mse"] = r["final_loss"]
            cases.append(result)
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
    common.write_report(args.out, None, args.quick, report, text)
    return 1 if any(c["failed"] for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
