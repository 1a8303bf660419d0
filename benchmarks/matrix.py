"""Benchmark matrix: every route of ``routes.py`` over a grid of data sizes, feature counts and
batch sizes, with tables and PNG plots.

Kinds: ``linear`` (linear regression), ``mlp`` (MLP(50, 10) regression: two hidden ReLU layers of
50 then 10 units), ``binary`` (binary classification with a linear logistic model). Grid: N in
{1e3, 1e4, 1e5} rows x {10, 100} features x batch {10, 100, 1000} (``--quick``: a subset, see
:data:`QUICK_GRID`). Timed runs per route: as many as give :data:`FULL_TARGET_STEPS` timed steps
(``--quick``: :data:`QUICK_TARGET_STEPS`), at least 1 and at most :data:`FULL_MAX_REPEATS`
(:data:`QUICK_MAX_REPEATS`), unless ``--repeats`` fixes the number. A route whose final loss
differs from the full loop's by more than :data:`AGREEMENT_RTOL` is flagged.

Run alone: ``python benchmarks/matrix.py [--quick] [--device cpu|cuda] [--out DIR]``; the usual
entry point is ``benchmarks/run.py``, which also runs the target benchmarks. Results:
``<host>-<date>-matrix[-cuda][-quick].{json,md}`` and ``...-{epoch-vs-n,step-vs-batch,loss-curves}.png``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as common  # noqa: E402  (the benchmarks folder, whatever the working directory)
import routes  # noqa: E402

SEED = 0
KINDS = ("linear", "mlp", "binary")
KIND_TITLES = {
    "linear": "linear regression",
    "mlp": "MLP(50, 10) regression",
    "binary": "binary classification (linear logistic)",
}
HIDDEN: dict[str, tuple[int, ...]] = {"linear": (), "mlp": (50, 10), "binary": ()}
LEARNING_RATE = {"linear": 0.01, "mlp": 0.01, "binary": 0.05}
#: a route whose final loss differs from the full loop's by more than this (relative) is flagged
AGREEMENT_RTOL = 0.05

FULL_GRID = [(n, f, b) for n in (1_000, 10_000, 100_000) for f in (10, 100) for b in (10, 100, 1000)]
QUICK_GRID = [(1_000, 10, 100), (10_000, 10, 10), (10_000, 10, 100), (10_000, 10, 1000), (10_000, 100, 100)]
FULL_EPOCHS, QUICK_EPOCHS = 3, 2
#: timed runs per route: enough for this many timed steps, within [1, max repeats]: short cases
#: get several runs (cheap), the long ones one (already thousands of steps)
FULL_TARGET_STEPS, FULL_MAX_REPEATS = 30_000, 5
QUICK_TARGET_STEPS, QUICK_MAX_REPEATS = 2_000, 3
#: the cases the plots use: epoch time against N at (features, batch); step time against batch
#: at (N, features), N falling back to the largest N run; loss curves at (N, features, batch)
PLOT_EPOCH_VS_N = (10, 100)
PLOT_STEP_VS_BATCH = (10_000, 10)
PLOT_LOSS_CASE = (10_000, 10, 100)

ROUTES = ("full", "partial", "ort_sklearn", "ort_torch", "ort_native", "numpy", "torch", "sk_sgd", "sk_mlp")
ROUTE_LABELS = {
    "full": "ort-train full loop",
    "partial": "ort-train partial loop",
    "ort_sklearn": "ort-train-sklearn",
    "ort_torch": "ort-train-torch OnnxModule",
    "ort_native": "onnxruntime training API",
    "numpy": "numpy",
    "torch": "torch loop",
    "sk_sgd": "sklearn SGD partial_fit",
    "sk_mlp": "sklearn MLP(sgd)",
    "plots": "plots",
}
#: (ours, peer) pairs that do the same job with the same API style
PAIRS = [("ort_sklearn", "sk_mlp"), ("ort_sklearn", "sk_sgd"), ("ort_torch", "torch")]


def cuda_unavailable_reason() -> str | None:
    """Why ``--device cuda`` cannot run here (None when it can)."""
    try:
        import onnxruntime

        from ort_train_core import CudaUnavailableError, check_device
    except ImportError as exc:
        return f"ort-train-core cannot be imported: {exc}"
    try:
        check_device("cuda")  # also checks the driver and the GPU, and preloads CUDA 11.8
    except (ValueError, CudaUnavailableError) as exc:
        return str(exc)
    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in providers:  # pragma: no cover - check_device said so
        return f"onnxruntime offers {providers}, no CUDAExecutionProvider"
    return None


def make_cases(
    kinds: Sequence[str], grid: Sequence[tuple[int, int, int]], epochs: int, device: str, threads: int
) -> Iterator[routes.Case]:
    """The cases of the grid, kind by kind (data drawn once per (family, features), at the
    largest N, and sliced)."""
    data: dict[tuple[bool, int], Any] = {}
    max_n = max(n for n, _, _ in grid)
    for kind in kinds:
        binary = kind == "binary"
        for n, features, batch in grid:
            if (binary, features) not in data:
                data[binary, features] = routes.make_data(
                    max_n, features, binary, SEED + features + 7 * binary
                )
            X, y = data[binary, features]
            yield routes.Case(
                name=f"{kind}-n{n}-f{features}-b{batch}",
                kind=kind,
                X=X[:n],
                y=y[:n],
                weights=routes.initial_weights(features, HIDDEN[kind], SEED + 1000 + features),
                batch=batch,
                epochs=epochs,
                lr=LEARNING_RATE[kind],
                binary=binary,
                device=device,
                threads=threads,
            )


def run_matrix(
    quick: bool = False,
    device: str = "cpu",
    out: str | Path = common.RESULTS_DIR,
    kinds: Sequence[str] = KINDS,
    route_keys: Sequence[str] = ROUTES,
    epochs: int | None = None,
    repeats: int | None = None,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Runs the matrix, writes ``<host>-<date>-matrix[-cuda][-quick].{json,md}`` and the PNG
    plots into ``out``, returns the report (``report['failed']`` lists routes that raised)."""
    t_start = time.perf_counter()
    threads = torch_threads or common.usable_cpus()
    epochs = epochs or (QUICK_EPOCHS if quick else FULL_EPOCHS)
    target_steps, max_repeats = (
        (QUICK_TARGET_STEPS, QUICK_MAX_REPEATS) if quick else (FULL_TARGET_STEPS, FULL_MAX_REPEATS)
    )
    grid = QUICK_GRID if quick else FULL_GRID
    routes.preload()
    cases = []
    for case in make_cases(kinds, grid, epochs, device, threads):
        runs = repeats or min(max_repeats, max(1, math.ceil(target_steps / case.steps)))
        selected = {key: key for key in route_keys}
        cases.append(routes.run_case(case, selected, ROUTE_LABELS, runs, rtol=AGREEMENT_RTOL))
    report: dict[str, Any] = {
        "date": common.today(),
        "config": {
            "quick": quick,
            "device": device,
            "kinds": list(kinds),
            "hidden": {k: list(HIDDEN[k]) for k in kinds},
            "grid": [list(g) for g in grid],
            "epochs": epochs,
            "repeats": repeats,
            "target_steps": target_steps,
            "max_repeats": max_repeats,
            "learning_rate": {k: LEARNING_RATE[k] for k in kinds},
            "seed": SEED,
            "dtype": "float32",
            "shuffle": False,
            "agreement_rtol": AGREEMENT_RTOL,
            "memory_method": common.RssSampler().method,
            "routes": {k: ROUTE_LABELS[k] for k in route_keys},
        },
        "machine": common.machine_info(threads, device=device),
        "max_loadavg_1min": max((v for c in cases for v in c["loadavg_1min"] if v is not None), default=None),
        "cases": cases,
        "elapsed_seconds": time.perf_counter() - t_start,
        "summary": summarise(cases),
        "failed": [
            {"case": c["name"], "route": k, "error": e} for c in cases for k, e in c["failed"].items()
        ],
    }
    name = "matrix" + ("" if device == "cpu" else f"-{device.split(':')[0]}")
    try:
        report["plots"] = write_plots(report, Path(out), common.result_stem(name, quick, report["date"]))
    except Exception as exc:  # the tables matter more than the pictures
        traceback.print_exc()
        report["failed"].append({"case": "-", "route": "plots", "error": f"{type(exc).__name__}: {exc}"})
    paths = common.write_report(out, name, quick, report, markdown(report))
    report["files"] = [*map(str, paths), *report.get("plots", [])]
    print(f"matrix: {len(cases)} cases in {report['elapsed_seconds']:.1f} s", flush=True)
    return report


# ---- summary, Markdown, plots -------------------------------------------------------------
def _geomean(values: Sequence[float]) -> float:
    return float(math.exp(sum(math.log(v) for v in values) / len(values)))


def summarise(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: each route's us/step over the full loop's (geometric mean, min, max over the
    cases) and the cases where its final loss differs by more than the tolerance; the same for
    the (ours, peer) pairs."""
    speed: list[dict[str, Any]] = []
    agreement: list[dict[str, Any]] = []
    for kind in dict.fromkeys(c["kind"] for c in cases):
        mine = [c for c in cases if c["kind"] == kind]
        for ours, peer in [("full", key) for key in ROUTES if key != "full"] + PAIRS:
            ratios = [
                (c["routes"][peer]["us_per_step"] / c["routes"][ours]["us_per_step"], c["name"])
                for c in mine
                if ours in c["routes"] and peer in c["routes"]
            ]
            if ratios:
                values = [r for r, _ in ratios]
                speed.append(
                    {
                        "kind": kind,
                        "ours": ours,
                        "peer": peer,
                        "cases": len(values),
                        "geomean": _geomean(values),
                        "min": min(ratios),
                        "max": max(ratios),
                        "ours_faster_in": sum(v > 1 for v in values),
                    }
                )
        for key in ROUTES[1:]:
            rows = [c for c in mine if key in c["routes"] and c["routes"][key].get("agrees") is not None]
            if rows:
                agreement.append(
                    {
                        "kind": kind,
                        "route": key,
                        "cases": len(rows),
                        "max_rel_diff": max(c["routes"][key]["rel_diff_final"] for c in rows),
                        "differ_in": [c["name"] for c in rows if not c["routes"][key]["agrees"]],
                    }
                )
    return {"speed": speed, "agreement": agreement}


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1e3 * seconds:.1f}"


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:.1f}"


def _header(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    runs = (
        f"{cfg['repeats']} per route"
        if cfg["repeats"]
        else f"as many as give {cfg['target_steps']} timed steps, 1 to {cfg['max_repeats']}: column 'runs'"
    )
    loads = ", ".join(
        f"{c['name']} {c['loadavg_1min'][0]:.1f}/{c['loadavg_1min'][1]:.1f}"
        for c in report["cases"]
        if None not in c["loadavg_1min"]
    )
    lrs = ", ".join(f"{k} {v:g}" for k, v in cfg["learning_rate"].items())
    lines = [
        f"# Benchmark matrix ({report['date']}, device {cfg['device']}{', quick' if cfg['quick'] else ''})",
        "",
        common.machine_line(report["machine"]),
        "",
        f"1-minute load average before/after each case (this run's own threads included): {loads}.",
        "",
        "Every route of a case: the same data (float32), the same initial weights (Glorot uniform), "
        f"{cfg['epochs']} epochs, plain SGD with a constant learning rate ({lrs}), no penalty, "
        "consecutive batches (no shuffling). us/step = best timed run / steps (runs: after one "
        f"untimed warm-up, round-robin over the routes, {runs}); in brackets: that over the full loop's "
        "us/step (> 1: slower than the full loop). Epoch = best run / epochs. Setup = graph building "
        "and sessions, timed apart where the route has one (each case's graphs carry its name, so "
        "that ort-train's process-wide graph and session caches hold none of them when the case "
        f"starts); first run = the warm-up. Peak memory: {cfg['memory_method']}.",
        "",
        "Losses on one scale (MSE for regression, mean cross-entropy on the logit for binary): "
        "epoch loss = the last epoch's mean of per-batch losses before each update; final loss = "
        "the final weights re-evaluated on all rows in float64 by one numpy function. Flag "
        f"DIFFERS: the final loss is more than {cfg['agreement_rtol']:.0%} away from the full loop's.",
        "",
        f"Run time of the matrix: {report['elapsed_seconds']:.1f} s.",
    ]
    usable, load = report["machine"]["usable_cpus"] or 1, report.get("max_loadavg_1min")
    if load is not None and load > usable:
        lines += [
            "",
            f"**Busy machine**: the 1-minute load average reached {load:.1f} on {usable} usable CPUs "
            "(this run counts for about 1): other processes competed for the cores. Multi-threaded "
            "routes suffer most (torch with several threads can wait milliseconds per step at its "
            "thread barriers while another process holds a core): prefer timings from an idle "
            "machine, or run with --torch-threads 1 to see torch without that effect.",
        ]
    return lines


def _kind_tables(kind: str, cases: list[dict[str, Any]]) -> list[str]:
    """The us/step table, the details table and the skipped routes of one kind."""
    present = [k for k in ROUTES if any(k in c["routes"] for c in cases)]
    speed_rows, detail_rows = [], []
    for c in cases:
        row = [str(c[k]) for k in ("n_rows", "n_features", "batch", "steps", "timed_runs")]
        for key in present:
            r = c["routes"].get(key)
            if r is None:
                row.append("skip" if key in c["skipped"] else ("FAIL" if key in c["failed"] else "—"))
            else:
                row.append(
                    f"{r['us_per_step']:.1f}"
                    + ("" if r.get("ratio_vs_full") is None else f" ({r['ratio_vs_full']:.2f})")
                )
        speed_rows.append(row)
        for key, r in c["routes"].items():
            diff = "—" if r["rel_diff_final"] is None else f"{r['rel_diff_final']:.1e}"
            detail_rows.append(
                [
                    *row[:3],
                    ROUTE_LABELS[key] + ("" if r["device"] == "cpu" else f" ({r['device']})"),
                    f"{r['us_per_step']:.1f}",
                    *map(_ms, (r["epoch_seconds"], r["setup_seconds"], r["first_run_seconds"])),
                    _mib(r["peak_rss_bytes"]),
                    common.fmt(r["epoch_loss"]),
                    common.fmt(r["final_loss"]),
                    diff + ("" if r["agrees"] in (True, None) else " DIFFERS"),
                ]
            )
    lines = ["", f"## {KIND_TITLES[kind]}", "", "us/step (ratio vs the full loop):", ""]
    lines += common.markdown_table(
        ["N", "F", "batch", "steps", "runs", *(ROUTE_LABELS[k] for k in present)], speed_rows
    )
    lines += ["", "Details:", ""]
    header = ["N", "F", "batch", "route", "us/step", "epoch ms", "setup ms", "first run ms", "peak MiB"]
    header += ["epoch loss", "final loss", "final vs full"]
    lines += common.markdown_table(header, detail_rows, ["r", "r", "r", "l", *["r"] * 8])
    reasons: dict[str, set[str]] = {}
    for c in cases:
        for key, why in c["skipped"].items():
            reasons.setdefault(key, set()).add(why)
        for key, why in c["failed"].items():
            reasons.setdefault(key, set()).add(f"FAILED in {c['name']}: {why}")
    if reasons:
        lines += ["", "Skipped or failed:", ""]
        lines += [f"- {ROUTE_LABELS[k]}: {'; '.join(sorted(v))}" for k, v in reasons.items()]
    return lines


def markdown(report: dict[str, Any]) -> str:
    cfg, cases, summary = report["config"], report["cases"], report["summary"]
    lines = _header(report)
    for kind in cfg["kinds"]:
        lines += _kind_tables(kind, [c for c in cases if c["kind"] == kind])
    lines += [
        "",
        "## Speed: peer us/step over ort-train's (> 1: ort-train faster)",
        "",
        "Geometric mean, min and max over the cases of a kind; 'faster in' counts the cases where "
        "the ort-train route is faster.",
        "",
    ]
    rows = [
        [
            KIND_TITLES[s["kind"]].split(" (")[0],
            ROUTE_LABELS[s["ours"]],
            ROUTE_LABELS[s["peer"]],
            f"{s['geomean']:.2f}",
            f"{s['min'][0]:.2f} ({s['min'][1]})",
            f"{s['max'][0]:.2f} ({s['max'][1]})",
            f"{s['ours_faster_in']}/{s['cases']}",
        ]
        for s in summary["speed"]
    ]
    header = ["kind", "ours", "peer", "peer / ours", "min", "max", "faster in"]
    lines += common.markdown_table(header, rows, ["l", "l", "l", "r", "r", "r", "r"])
    lines += ["", f"## Agreement of the final loss with the full loop's (<= {cfg['agreement_rtol']:.0%})", ""]
    rows = [
        [
            KIND_TITLES[a["kind"]].split(" (")[0],
            ROUTE_LABELS[a["route"]],
            str(a["cases"]),
            f"{a['max_rel_diff']:.1e}",
            "all agree" if not a["differ_in"] else "DIFFERS in " + ", ".join(a["differ_in"]),
        ]
        for a in summary["agreement"]
    ]
    lines += common.markdown_table(
        ["kind", "route", "cases", "max rel. diff", "result"], rows, ["l", "l", "r", "r", "l"]
    )
    lines += ["", "## Routes", ""]
    lines += common.route_notes(
        (ROUTE_LABELS[k], c["kind"], r["note"]) for c in cases for k, r in c["routes"].items()
    )
    if report.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


def write_plots(report: dict[str, Any], outdir: Path, stem: str) -> list[str]:
    """Three PNG files (matplotlib, Agg backend); none when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"matrix: no plots ({exc}); pip install matplotlib", flush=True)
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    cases, kinds = report["cases"], report["config"]["kinds"]
    when = f"{report['date']}, {report['config']['device']}{', quick' if report['config']['quick'] else ''}"
    style = {
        key: {"marker": m, "color": f"C{i}", "label": ROUTE_LABELS[key]}
        for i, (key, m) in enumerate(zip(ROUTES, "os^vDP*xX"))
    }
    files = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        files.append(str(outdir / f"{stem}-{name}.png"))
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    def lines_plot(name: str, title: str, x: str, select: Any, value: Any, labels: tuple[str, str]) -> None:
        """One panel per kind: per route, ``value(route result)`` against ``case[x]`` over the
        cases ``select(kind)`` returns with the panel's title."""
        fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.4), squeeze=False)
        fig.suptitle(f"{title} ({when})")
        for ax, kind in zip(axes[0], kinds):
            sel, panel = select(kind)
            for key in ROUTES:
                pts = [
                    (c[x], value(c["routes"][key]))
                    for c in sorted(sel, key=lambda c: c[x])
                    if key in c["routes"]
                ]
                if pts:
                    ax.plot(*zip(*pts), **style[key])
            ax.set(xscale="log", yscale="log", xlabel=labels[0], ylabel=labels[1], title=panel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        save(fig, name)

    features, batch = PLOT_EPOCH_VS_N
    lines_plot(
        "epoch-vs-n",
        f"Time per epoch against N (F={features}, batch={batch})",
        "n_rows",
        lambda kind: (
            [c for c in cases if c["kind"] == kind and c["n_features"] == features and c["batch"] == batch],
            KIND_TITLES[kind],
        ),
        lambda r: 1e3 * r["epoch_seconds"],
        ("N (rows)", "ms per epoch"),
    )

    def step_cases(kind: str) -> tuple[list[dict[str, Any]], str]:
        n_wanted, features = PLOT_STEP_VS_BATCH
        mine = [c for c in cases if c["kind"] == kind and c["n_features"] == features]
        ns = {c["n_rows"] for c in mine}
        n = n_wanted if n_wanted in ns else max(ns, default=n_wanted)
        return [c for c in mine if c["n_rows"] == n], f"{KIND_TITLES[kind]}, N={n}"

    lines_plot(
        "step-vs-batch",
        f"Time per step against batch size (F={PLOT_STEP_VS_BATCH[1]})",
        "batch",
        step_cases,
        lambda r: r["us_per_step"],
        ("batch size", "us per step"),
    )
    save(_loss_figure(plt, cases, kinds, style, when), "loss-curves")
    return files


def _loss_figure(
    plt: Any, cases: list[dict[str, Any]], kinds: list[str], style: dict[str, Any], when: str
) -> Any:
    """Epoch losses of every route at :data:`PLOT_LOSS_CASE`, and how far each route's final loss
    is from the full loop's."""
    n, features, batch = PLOT_LOSS_CASE
    fig, grid_axes = plt.subplots(
        2, len(kinds), figsize=(5.2 * len(kinds), 8.0), squeeze=False, height_ratios=[3, 2]
    )
    fig.suptitle(
        f"Epoch loss of every route (N={n}, F={features}, batch={batch}) and final loss against the "
        f"full loop's ({when})"
    )
    for k, kind in enumerate(kinds):
        ax, bar_ax = grid_axes[0][k], grid_axes[1][k]
        mine = [c for c in cases if c["kind"] == kind]
        sel = [c for c in mine if (c["n_rows"], c["n_features"], c["batch"]) == PLOT_LOSS_CASE] or mine[:1]
        if not sel:
            continue
        names, diffs, colors = [], [], []
        for key in ROUTES:
            r = sel[0]["routes"].get(key)
            if r is None:
                continue
            curve = r["epoch_losses"] or []
            ax.plot(range(1, len(curve) + 1), curve, alpha=0.8, **style[key])
            if r["rel_diff_final"] is not None and key != "full":
                names.append(ROUTE_LABELS[key])
                diffs.append(max(r["rel_diff_final"], 1e-10))
                colors.append(style[key]["color"])
        ax.set(
            title=f"{KIND_TITLES[kind]}\n{sel[0]['name']}",
            xlabel="epoch",
            ylabel="epoch loss (MSE / cross-entropy)",
        )
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
        bar_ax.barh(names, diffs, color=colors)
        bar_ax.axvline(AGREEMENT_RTOL, color="red", lw=1, ls="--", label=f"{AGREEMENT_RTOL:.0%}")
        bar_ax.set(xscale="log", xlabel="|final loss - full loop's| / full loop's (floor 1e-10)")
        bar_ax.tick_params(axis="y", labelsize=7)
        bar_ax.grid(True, axis="x", alpha=0.3)
        bar_ax.legend(fontsize=7)
    grid_axes[0][0].legend(fontsize=7)
    return fig


# ---- main ---------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="a subset of the grid, 2 epochs, fewer timed runs"
    )
    parser.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"), help="device of the ort and torch routes"
    )
    parser.add_argument("--out", default=str(common.RESULTS_DIR), help="folder for JSON, Markdown and PNG")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads (default: the usable CPUs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    add_arguments(parser)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    parser.add_argument("--repeats", type=int, default=None, help="override the timed repeats")
    args = parser.parse_args(argv)
    if args.device == "cuda" and (reason := cuda_unavailable_reason()) is not None:
        print(f"--device cuda cannot run here: {reason}", file=sys.stderr)
        return 2
    report = run_matrix(
        args.quick,
        args.device,
        args.out,
        args.kinds,
        args.routes,
        args.epochs,
        args.repeats,
        args.torch_threads,
    )
    print(markdown(report))
    for f in report["failed"]:
        print(f"FAILED: {f['case']} {ROUTE_LABELS[f['route']]}: {f['error']}", file=sys.stderr)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
