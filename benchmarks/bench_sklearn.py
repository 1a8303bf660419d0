"""Estimator benchmark: ``OrtMLPRegressor.fit`` (ort-train-sklearn) against scikit-learn's
``MLPRegressor.fit`` with the very same parameters.

Cases: two synthetic regression data sets (100k x 20 and 10k x 100, float32, standardised target
with a non-linear part) x two solvers (``sgd``: momentum 0.9 with Nesterov; ``adam``), each
``hidden_layer_sizes=(50,)`` ReLU, ``batch_size=200``, ``learning_rate_init=0.001`` (constant),
``alpha=1e-4``, 10 epochs. Equal work: ``shuffle=False`` on both (their random streams differ);
exactly ``max_iter`` epochs (ours ``tol=None``, scikit-learn's ``tol=0`` with
``n_iter_no_change = max_iter + 1``; ``n_iter_`` is checked); the same ``random_state``, from
which both draw the same Glorot-uniform initial weights, so they follow the same trajectory up
to float32 rounding (and Adam's epsilon, which scikit-learn adds before the bias correction).

Timing: ``fit`` end to end, one untimed warm-up fit per estimator, then the best of ``--repeats``
fits, round-robin over the two. Each fit of ours builds its initial graph and trainer again and
takes its fused step graph and session from the process-wide caches the warm-up filled (as a
grid-search candidate does): that setup is included, and timed apart too. us/step = fit time /
steps; speedup = scikit-learn's fit time / ours. Quality: both ``loss_curve_[-1]`` (scikit-learn's
scale, penalty included), their relative difference, and the R2 on held-out test rows.

Target (from the issue): ``OrtMLPRegressor.fit`` >= 2x faster than ``MLPRegressor.fit`` at equal
final training loss (relative difference <= 5 %), per case.

Run: ``python benchmarks/bench_sklearn.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>-sklearn[-quick].{json,md}``, then runs ``bench_datasets.py`` (the four drop-ins at
their defaults on scikit-learn's datasets: score and fit-time ratio), which writes
``<host>-<date>-datasets[-quick].{json,md}``, and its sparse text case and stream ``--all-cores``.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any

import numpy as np

import _common as common
import bench_datasets

SEED = 0
HIDDEN = (50,)
BATCH = 200
LEARNING_RATE = 0.001
ALPHA = 1e-4
#: "equal final loss": relative difference of the two loss_curve_[-1] at most this
LOSS_RTOL = 0.05
#: target speedup (scikit-learn fit time / ours)
TARGET_SPEEDUP = 2.0
#: (name, training rows, features); --quick divides the rows by QUICK_ROW_DIVISOR
DATASETS = [("100k x 20", 100_000, 20), ("10k x 100", 10_000, 100)]
QUICK_ROW_DIVISOR = 5
SOLVERS = ("sgd", "adam")


# ---- data ---------------------------------------------------------------------------------
def make_data(n_train: int, n_features: int, seed: int = SEED) -> tuple[np.ndarray, ...]:
    """(X_train, y_train, X_test, y_test), float32; y is standardised with the training
    rows' mean and deviation. The target has a linear part, a sine and an interaction."""
    rng = np.random.default_rng(seed + n_features)
    n = n_train + n_train // 5
    X = rng.standard_normal((n, n_features)).astype(np.float32)
    w = rng.standard_normal(n_features) / np.sqrt(n_features)
    x = X.astype(np.float64)
    y = x @ w + np.sin(2.0 * x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.1 * rng.standard_normal(n)
    mean, std = y[:n_train].mean(), y[:n_train].std()
    y = ((y - mean) / std).astype(np.float32)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


# ---- estimators ---------------------------------------------------------------------------
def common_params(solver: str, epochs: int) -> dict[str, Any]:
    return dict(
        hidden_layer_sizes=HIDDEN,
        activation="relu",
        solver=solver,
        alpha=ALPHA,
        batch_size=BATCH,
        learning_rate="constant",
        learning_rate_init=LEARNING_RATE,
        max_iter=epochs,
        shuffle=False,
        random_state=SEED,
        momentum=0.9,
        nesterovs_momentum=True,
        early_stopping=False,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        n_iter_no_change=epochs + 1,
    )


def make_estimators(solver: str, epochs: int) -> dict[str, Any]:
    from sklearn.neural_network import MLPRegressor

    from ort_train_sklearn import OrtMLPRegressor

    params = common_params(solver, epochs)
    return {
        "sklearn": MLPRegressor(**params, tol=0.0),
        "ours": OrtMLPRegressor(**params, tol=None),
    }


def timed_fit(est: Any, X: np.ndarray, y: np.ndarray) -> float:
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t = time.perf_counter()
        est.fit(X, y)
        return time.perf_counter() - t


def ours_setup_seconds(est: Any, X: np.ndarray, y: np.ndarray) -> float | None:
    """What each of our fits spends before its first step: initial graph, trainer, and its
    ``prepare`` (input checks, fused step graph(s) and session); the estimator's initial graph
    and trainer come from its private hooks (None if they changed)."""
    from sklearn.base import clone
    from sklearn.utils import check_random_state

    try:
        fresh = clone(est)
        n, d = X.shape
        t = time.perf_counter()
        rng = check_random_state(fresh.random_state)
        trainer = fresh._make_trainer(fresh._initial_graph(d, 1, rng), n, 1, rng)
        trainer.prepare(X, y.reshape(-1, 1))
        return time.perf_counter() - t
    except (AttributeError, TypeError, ValueError) as exc:
        print(f"  (setup not measured: {type(exc).__name__}: {exc})", flush=True)
        return None


def run_case(
    name: str, solver: str, data: tuple[np.ndarray, ...], epochs: int, repeats: int
) -> dict[str, Any]:
    X, y, X_test, y_test = data
    n, d = X.shape
    steps = epochs * -(-n // BATCH)
    load_before = common.loadavg()
    print(f"[{name}, {solver}] {n} x {d}, {steps} steps", flush=True)
    ests = make_estimators(solver, epochs)
    first = {key: timed_fit(est, X, y) for key, est in ests.items()}
    times: dict[str, list[float]] = {key: [] for key in ests}
    for _ in range(repeats):
        for key, est in ests.items():
            times[key].append(timed_fit(est, X, y))
    routes: dict[str, dict[str, Any]] = {}
    for key, est in ests.items():
        assert est.n_iter_ == epochs, (key, est.n_iter_)
        t = time.perf_counter()
        r2 = float(est.score(X_test, y_test))
        predict_seconds = time.perf_counter() - t
        best = min(times[key])
        routes[key] = {
            "estimator": type(est).__name__,
            "seconds": best,
            "times": times[key],
            "first_fit_seconds": first[key],
            "us_per_step": 1e6 * best / steps,
            "final_loss": float(est.loss_curve_[-1]),
            "loss_curve": [float(v) for v in est.loss_curve_],
            "test_r2": r2,
            "score_seconds": predict_seconds,
            "n_iter": int(est.n_iter_),
        }
    routes["ours"]["setup_seconds"] = ours_setup_seconds(ests["ours"], X, y)
    sk, ours = routes["sklearn"], routes["ours"]
    speedup = sk["seconds"] / ours["seconds"]
    loss_rel_diff = abs(ours["final_loss"] - sk["final_loss"]) / abs(sk["final_loss"])
    equal_loss = loss_rel_diff <= LOSS_RTOL
    for r in routes.values():
        print(
            f"  {r['estimator']:<16} {1e3 * r['seconds']:9.1f} ms  {r['us_per_step']:8.1f} us/step  "
            f"loss {r['final_loss']:.6g}  test R2 {r['test_r2']:.4f}",
            flush=True,
        )
    print(f"  speedup {speedup:.2f}x, loss rel. diff {loss_rel_diff:.1e}", flush=True)
    return {
        "name": f"{name}, {solver}",
        "dataset": name,
        "solver": solver,
        "n_rows": n,
        "n_features": d,
        "n_test_rows": int(X_test.shape[0]),
        "epochs": epochs,
        "steps": steps,
        "routes": routes,
        "speedup": speedup,
        "loss_rel_diff": loss_rel_diff,
        "equal_loss": bool(equal_loss),
        "pass": bool(equal_loss and speedup >= TARGET_SPEEDUP),
        "loadavg_1min": [load_before, common.loadavg()],
    }


# ---- report -------------------------------------------------------------------------------
def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    from ort_train_core._binding import CPU_ONE_THREAD_MAX_WORK as one_thread_max

    lines = [
        f"# OrtMLPRegressor vs scikit-learn MLPRegressor "
        f"({report['date']}{', quick' if cfg['quick'] else ''})",
        "",
        common.machine_line(report["machine"])
        + f" ort-train-sklearn {report['machine']['versions'].get('ort-train-sklearn')}; onnxruntime "
        "intra-op threads: one for a fused step whose batch rows x trained values is at most "
        f"{one_thread_max:.1e} (every case here), the default for other sessions.",
        "",
        "1-minute load average around each case (this benchmark's own threads included): "
        + common.load_text(report["cases"]),
        "",
        f"Both estimators: hidden_layer_sizes={cfg['hidden_layer_sizes']}, relu, "
        f"batch_size={cfg['batch_size']}, learning_rate_init={cfg['learning_rate_init']} (constant), "
        f"alpha={cfg['alpha']}, {cfg['epochs']} epochs exactly, shuffle=False, "
        f"random_state={cfg['seed']} (same initial weights), float32 data, standardised target; "
        "sgd = momentum 0.9 Nesterov. Fit time: best of "
        f"{cfg['repeats']} fit() calls after one warm-up, round-robin. Loss: loss_curve_[-1] "
        "(scikit-learn's scale, penalty included). R2 on held-out test rows.",
        "",
        "| case | steps | sklearn fit ms | ours fit ms | sklearn us/step | ours us/step | speedup | "
        "sklearn loss | ours loss | loss rel. diff | sklearn test R2 | ours test R2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cases"]:
        sk, ours = c["routes"]["sklearn"], c["routes"]["ours"]
        lines.append(
            f"| {c['name']} | {c['steps']} | {1e3 * sk['seconds']:.1f} | {1e3 * ours['seconds']:.1f} | "
            f"{sk['us_per_step']:.1f} | {ours['us_per_step']:.1f} | {c['speedup']:.2f} | "
            f"{sk['final_loss']:.6g} | {ours['final_loss']:.6g} | {c['loss_rel_diff']:.1e} | "
            f"{sk['test_r2']:.4f} | {ours['test_r2']:.4f} |"
        )
    lines += [
        "",
        "Ours apart (ms): setup = initial graph + trainer + prepare (input checks, fused step graph, "
        "session) as every "
        "fit after the first gets them (graphs and sessions from the process caches; included "
        "in its fit time); first fit = the warm-up, which builds them; score = "
        "predict + R2 on the test rows (ours: the first predict builds an inference session).",
        "",
        "| case | ours setup | ours first fit | sklearn first fit | ours score | sklearn score |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in report["cases"]:
        sk, ours = c["routes"]["sklearn"], c["routes"]["ours"]
        setup = "—" if ours["setup_seconds"] is None else f"{1e3 * ours['setup_seconds']:.1f}"
        lines.append(
            f"| {c['name']} | {setup} | {1e3 * ours['first_fit_seconds']:.1f} | "
            f"{1e3 * sk['first_fit_seconds']:.1f} | {1e3 * ours['score_seconds']:.1f} | "
            f"{1e3 * sk['score_seconds']:.1f} |"
        )
    lines += [
        "",
        f"Target: OrtMLPRegressor.fit >= {TARGET_SPEEDUP:g}x faster than MLPRegressor.fit at equal "
        f"final training loss (relative difference <= {LOSS_RTOL:.0%}):",
        "",
        "| case | speedup | equal loss | result |",
        "|---|---:|---|---|",
    ]
    if cfg["quick"]:
        lines[-4:-4] = [
            "Quick run: few steps per fit, so each fit's setup weighs far more than in the full run; "
            "the target applies to the full run.",
            "",
        ]
    for c in report["cases"]:
        lines.append(
            f"| {c['name']} | {c['speedup']:.2f} (>= {TARGET_SPEEDUP:g}) | "
            f"{'yes' if c['equal_loss'] else 'no'} ({c['loss_rel_diff']:.1e}) | "
            f"{'PASS' if c['pass'] else 'MISS'} |"
        )
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, f"rows / {QUICK_ROW_DIVISOR}, 3 epochs, 3 repeats")
    parser.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    parser.add_argument("--repeats", type=int, default=None, help="override the repeats")
    args = parser.parse_args(argv)

    epochs = args.epochs or (3 if args.quick else 10)
    repeats = args.repeats or (3 if args.quick else 5)

    import ort_train_sklearn  # noqa: F401  (fails early, with its fix, without a runtime)

    cases = []
    for name, n_rows, n_features in DATASETS:
        n = n_rows // QUICK_ROW_DIVISOR if args.quick else n_rows
        data = make_data(n, n_features)
        for solver in SOLVERS:
            cases.append(run_case(name, solver, data, epochs, repeats))

    report = {
        "date": common.today(),
        "config": {
            "quick": args.quick,
            "datasets": [
                {"name": name, "n_rows": n // QUICK_ROW_DIVISOR if args.quick else n, "n_features": d}
                for name, n, d in DATASETS
            ],
            "solvers": list(SOLVERS),
            "hidden_layer_sizes": list(HIDDEN),
            "batch_size": BATCH,
            "learning_rate_init": LEARNING_RATE,
            "alpha": ALPHA,
            "epochs": epochs,
            "repeats": repeats,
            "seed": SEED,
            "dtype": "float32",
            "shuffle": False,
            "loss_rtol": LOSS_RTOL,
            "target_speedup": TARGET_SPEEDUP,
        },
        "machine": common.machine_info(),
        "cases": cases,
    }
    text = markdown(report)
    print(f"\n{text}")
    common.write_report(args.out, "sklearn", args.quick, report, text)
    # the four drop-ins at their defaults on scikit-learn's datasets (issue 18), and what one SGD
    # step costs on each route: their own files
    forwarded = ["--out", str(args.out), *(["--quick"] if args.quick else [])]
    status = bench_datasets.main(forwarded)
    # the sparse text case and the partial_fit stream again under each library's own threading
    for only in ("--sparse-text-only", "--stream-only"):
        status = bench_datasets.main([*forwarded, only, "--all-cores"]) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
