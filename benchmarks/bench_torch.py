"""Torch adapter benchmark: ``ort_train_torch.OnnxModule`` forward + backward against the same
network as a pure-torch ``nn.Sequential``.

Case (from the issue): one forward + backward per batch through an MLP(100, 100) (100 float32
features, two hidden layers of 100 ReLU units, 1 output), batch 1000, and 100 and 10000 beside it.
Routes per batch size, over the same weights (:func:`routes.mlp_onnx` of the torch layers): the
OnnxModule and torch, each with the input not requiring a gradient (a first layer) and requiring
one (a middle layer: a second forward/backward graph that also returns the input's gradient);
and the ``floor``, ort-train-core's ``OrtGradientForwardBackward`` over the same graph with every
OrtValue made once (OnnxModule minus floor is the adapter's cost). A step: gradients set to
None, ``out = module(x)``, ``out.backward(grad)`` with a fixed random output gradient; nothing is
updated, so every step does the same work. Same work: one step's gradients of the OnnxModule and
of torch must agree within 1e-4 (relative to the largest torch gradient), else the run exits 1.

Timing: blocks of steps (tens of ms), after each route's first step (reported apart) and an
untimed warm-up block; then ``--repeats`` rounds, each timing one block of every route of every
batch size (a busy spell of a shared machine hits all alike), with an untimed pause before each
block while the previous route's thread pools spin down. us/step = best block / steps per
block, the median beside it. Threads: torch uses the usable CPUs; onnxruntime its default.

Target (from the issue): OnnxModule forward + backward <= 1.3x torch (batch 1000, MLP(100, 100)).

Run: ``python benchmarks/bench_torch.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>-torch[-quick].{json,md}``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _common as common
from routes import mlp_onnx

SEED = 0
N_FEATURES = 100
HIDDEN = (100, 100)
N_OUTPUTS = 1
#: relative gradient difference (max abs diff / max abs torch gradient) allowed between routes
GRAD_RTOL = 1e-4
#: (batch, steps per block in the full run); --quick divides the steps by QUICK_STEP_DIVISOR
BATCHES = [(100, 100), (1000, 20), (10_000, 3)]
QUICK_STEP_DIVISOR = 2
#: timed blocks per route (rounds over every case and route)
REPEATS = 20
QUICK_REPEATS = 5
#: untimed pause before every timed block: onnxruntime's intra-op workers spin for about 20-30 ms
#: after a run and torch's OpenMP threads for about 10 ms; on 2 cores a route timed inside the
#: previous route's spin shares its cores with it (torch's steps then take up to 2-4x longer)
SETTLE_SECONDS = 0.05
TARGET_BATCH = 1000
TARGET_RATIO = 1.3

TARGET_NAME = f"OnnxModule forward+backward <= {TARGET_RATIO}x torch (batch {TARGET_BATCH}, MLP(100, 100))"
#: (name, case, numerator route, denominator route, op, bound)
TARGETS = [(TARGET_NAME, f"batch {TARGET_BATCH}", "ours", "torch", "<=", TARGET_RATIO)]

ROUTE_LABELS = {
    "ours": "OnnxModule, x without grad",
    "torch": "torch nn.Sequential, x without grad",
    "ours_xgrad": "OnnxModule, x requires grad",
    "torch_xgrad": "torch nn.Sequential, x requires grad",
    "floor": "floor: TrainingAgent alone, x without grad",
}
#: route -> the torch route it is compared with
PEERS = {"ours": "torch", "ours_xgrad": "torch_xgrad", "floor": "torch"}


# ---- models -------------------------------------------------------------------------------
def torch_mlp(seed: int = SEED) -> Any:
    """Linear -> ReLU -> Linear -> ReLU -> Linear, torch's default initialisation under ``seed``."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    sizes = [N_FEATURES, *HIDDEN, N_OUTPUTS]
    mods: list[Any] = []
    for k in range(len(sizes) - 1):
        mods.append(nn.Linear(sizes[k], sizes[k + 1]))
        if k < len(sizes) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def torch_as_onnx(net: Any, grads: bool = False) -> dict[str, Any]:
    """The torch network's parameters (or their gradients) under the ONNX names, as contiguous
    copies in the graph's layout (``W{k}`` is the transpose of torch's ``weight``)."""
    from torch import nn

    out = {}
    for k, lin in enumerate(m for m in net if isinstance(m, nn.Linear)):
        w, b = (lin.weight.grad, lin.bias.grad) if grads else (lin.weight.detach(), lin.bias.detach())
        out[f"W{k}"], out[f"b{k}"] = w.T.contiguous(), b.clone()
    return out


def onnx_mlp(net: Any) -> Any:
    """The same network as an ONNX graph (:func:`routes.mlp_onnx`) holding copies of its weights."""
    params = torch_as_onnx(net)
    layers = [(params[f"W{k}"].numpy(), params[f"b{k}"].numpy()) for k in range(len(params) // 2)]
    return mlp_onnx(layers, names=("W", "b"), output="Y")


# ---- routes -------------------------------------------------------------------------------
def make_step(module: Any, x: Any, grad: Any) -> Callable[[], None]:
    """One forward + backward; parameter (and input) gradients set to None first."""
    params = list(module.parameters())
    needs_x_grad = x.requires_grad

    def step() -> None:
        for p in params:
            p.grad = None
        if needs_x_grad:
            x.grad = None
        out = module(x)
        out.backward(grad)

    return step


def time_block(step: Callable[[], None], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n


def check_same_work(ours: Any, net: Any, x: Any, grad: Any) -> dict[str, Any]:
    """One step of each on the same batch; relative max difference of every gradient."""
    import torch

    results: dict[str, Any] = {}
    for x_grad in (False, True):
        xs = [x.detach().clone().requires_grad_(x_grad) for _ in range(2)]
        make_step(ours, xs[0], grad)()
        make_step(net, xs[1], grad)()
        ref = torch_as_onnx(net, grads=True)
        pairs = [(name, ours.get_parameter(attr).grad, ref[name]) for attr, name in ours.onnx_names.items()]
        if x_grad:
            pairs.append(("X", xs[0].grad, xs[1].grad))
        diffs = {}
        for name, got, want in pairs:
            abs_diff = float((got - want).abs().max())
            scale = float(want.abs().max())
            diffs[name] = {"max_abs_diff": abs_diff, "rel_diff": abs_diff / max(scale, 1e-30)}
        worst = max(d["rel_diff"] for d in diffs.values())
        results["xgrad" if x_grad else "plain"] = {
            "gradients": diffs,
            "max_abs_diff": max(d["max_abs_diff"] for d in diffs.values()),
            "max_rel_diff": worst,
            "pass": bool(worst <= GRAD_RTOL),
        }
        with torch.no_grad():
            for p in (*ours.parameters(), *net.parameters()):
                p.grad = None
    return results


def make_floor_step(net: Any, x: Any, grad: Any) -> Callable[[], None]:
    """ort-train-core's ``OrtGradientForwardBackward`` over the same graph, every OrtValue made
    once: the TrainingAgent's forward + backward without the torch adapter (no autograd, no
    DLPack conversions per step)."""
    from ort_train_core import OrtGradientForwardBackward
    from ort_train_torch import ortvalue_from_tensor

    fb = OrtGradientForwardBackward(onnx_mlp(net), device="cpu")
    params = torch_as_onnx(net)
    weights = [ortvalue_from_tensor(params[name]) for name in fb.weights_to_train]
    x_value, grad_value = ortvalue_from_tensor(x), ortvalue_from_tensor(grad)
    keep = (params, x, grad)

    def step() -> None:
        fb.forward([x_value], training=True, weights=weights)
        fb.backward([grad_value])
        assert keep

    return step


def setup_case(batch: int, steps: int, warmup: int) -> dict[str, Any]:
    """Builds the routes of one batch size, checks that they do the same work, times each
    route's first step and warms it up."""
    import torch

    from ort_train_torch import OnnxModule

    gen = torch.Generator().manual_seed(SEED + batch)
    x = torch.randn(batch, N_FEATURES, generator=gen)
    grad = torch.randn(batch, N_OUTPUTS, generator=gen)
    x_req = x.clone().requires_grad_(True)

    net = torch_mlp()
    t = time.perf_counter()
    ours = OnnxModule(onnx_mlp(net))
    build_seconds = time.perf_counter() - t
    step_fns = {
        "ours": make_step(ours, x, grad),
        "torch": make_step(net, x, grad),
        "ours_xgrad": make_step(ours, x_req, grad),
        "torch_xgrad": make_step(net, x_req, grad),
        "floor": make_floor_step(net, x, grad),
    }
    # first steps before anything else ran: the x-requires-grad route builds its graph here
    first = {key: time_block(step, 1) for key, step in step_fns.items()}
    same_work = check_same_work(ours, net, x, grad)
    for step in step_fns.values():
        time_block(step, warmup)
    return {
        "batch": batch,
        "steps": steps,
        "step_fns": step_fns,
        "first": first,
        "same_work": same_work,
        "build_seconds": build_seconds,
        "times": {key: [] for key in step_fns},
    }


def finish_case(case: dict[str, Any]) -> dict[str, Any]:
    times = case["times"]
    routes: dict[str, dict[str, Any]] = {}
    for key in case["step_fns"]:
        routes[key] = {
            "label": ROUTE_LABELS[key],
            "us_per_step": 1e6 * min(times[key]),
            "median_us_per_step": 1e6 * statistics.median(times[key]),
            "times_us_per_step": [1e6 * v for v in times[key]],
            "first_step_ms": 1e3 * case["first"][key],
        }
    for key, peer in PEERS.items():
        routes[key]["ratio"] = routes[key]["us_per_step"] / routes[peer]["us_per_step"]
        routes[key]["median_ratio"] = routes[key]["median_us_per_step"] / routes[peer]["median_us_per_step"]
    print(f"[batch {case['batch']}] {case['steps']} steps per block", flush=True)
    for r in routes.values():
        ratio = f"  ratio {r['ratio']:.2f} (median {r['median_ratio']:.2f})" if "ratio" in r else ""
        print(
            f"  {r['label']:<46} {r['us_per_step']:9.1f} us/step (median {r['median_us_per_step']:9.1f})"
            f"{ratio}",
            flush=True,
        )
    for key, s in case["same_work"].items():
        print(
            f"  gradients ({key}): max abs diff {s['max_abs_diff']:.1e}, "
            f"max rel diff {s['max_rel_diff']:.1e}",
            flush=True,
        )
    return {
        "name": f"batch {case['batch']}",
        "batch": case["batch"],
        "steps_per_block": case["steps"],
        "repeats": len(next(iter(times.values()))),
        "routes": routes,
        "same_work": case["same_work"],
        "onnx_module_build_ms": 1e3 * case["build_seconds"],
    }


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine spent busy (all CPUs, /proc/stat), None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_cases(batches: list[tuple[int, int]], repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sets every case up, then ``repeats`` rounds, each timing one block of every route of
    every case: the samples of each route spread over the whole run, so that a busy spell of
    a shared machine does not fall on one case or one route only."""
    prepared = []
    for batch, steps in batches:
        print(f"[batch {batch}] setting up ({steps} steps per block)", flush=True)
        prepared.append(setup_case(batch, steps, warmup=steps))
    load_before = common.loadavg()
    busy_before, own_before, wall = busy_cpu_seconds(), os.times(), time.perf_counter()
    for k in range(repeats):
        for case in prepared:
            for key, step in case["step_fns"].items():
                time.sleep(SETTLE_SECONDS)
                case["times"][key].append(time_block(step, case["steps"]))
        print(f"  round {k + 1}/{repeats}", end="\r", flush=True)
    wall = time.perf_counter() - wall
    busy_after, own_after = busy_cpu_seconds(), os.times()
    own = (own_after.user + own_after.system) - (own_before.user + own_before.system)
    others = None
    if busy_before is not None and busy_after is not None:
        others = max(0.0, (busy_after - busy_before) - own) / (
            wall * (os.cpu_count() or common.usable_cpus())
        )
    timing = {
        "seconds": wall,
        "own_cpu_seconds": own,
        "other_processes_cpu_fraction": others,
        "loadavg_1min": [load_before, common.loadavg()],
    }
    print()
    return [finish_case(case) for case in prepared], timing


# ---- report -------------------------------------------------------------------------------
def timing_line(timing: dict[str, Any]) -> str:
    load = timing["loadavg_1min"]
    others = timing["other_processes_cpu_fraction"]
    text = f"Timed phase: {timing['seconds']:.1f} s"
    if None not in load:
        text += f", 1-minute load average {load[0]:.1f} before, {load[1]:.1f} after (own threads included)"
    if others is not None:
        text += (
            f"; CPU used by other processes meanwhile: {others:.0%} of the machine (a busy machine "
            "slows two-thread routes most; the best block is the least disturbed one)"
        )
    return text + "."


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    cfg = report["config"]
    lines = [
        f"# OnnxModule vs torch nn.Sequential, forward + backward "
        f"({report['date']}{', quick' if cfg['quick'] else ''})",
        "",
        common.machine_line(m)
        + " onnxruntime intra-op threads: the default (0: one per physical core) in every "
        f"session the OnnxModule builds; ort-train-torch {m['versions'].get('ort-train-torch')}.",
        "",
        timing_line(report["timing"]),
        "",
        f"MLP({', '.join(map(str, cfg['hidden']))}): {cfg['n_features']} float32 features -> "
        f"{' -> '.join(f'{h} ReLU' for h in cfg['hidden'])} -> {cfg['n_outputs']}, the same "
        "weights in both. A step: parameters' .grad = None (and x.grad when x requires grad), "
        "out = module(x), out.backward(grad) with a fixed random output gradient. us/step: "
        f"best of {cfg['repeats']} timed blocks per route (the steps per block are in the "
        "table) after a warm-up, round-robin over every route of every case with an untimed "
        f"{1e3 * SETTLE_SECONDS:.0f} ms pause before each block (the previous route's thread pools "
        "go idle); the median block beside it. "
        "ratio = OnnxModule / torch us/step with the same input-gradient setting (> 1: "
        "OnnxModule slower). The floor row is ort-train-core's OrtGradientForwardBackward over "
        "the same graph with every OrtValue made once (TrainingAgent forward + backward, no "
        "torch autograd, no DLPack per step): OnnxModule minus floor is the adapter's cost, "
        "floor / torch compares onnxruntime's kernels with torch's.",
        "",
        "| case | route | steps/block | us/step | median us/step | ratio ours/torch | median ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in report["cases"]:
        for r in c["routes"].values():
            ratio = f"{r['ratio']:.2f}" if "ratio" in r else "—"
            median_ratio = f"{r['median_ratio']:.2f}" if "median_ratio" in r else "—"
            lines.append(
                f"| {c['name']} | {r['label']} | {c['steps_per_block']} | {r['us_per_step']:.1f} | "
                f"{r['median_us_per_step']:.1f} | {ratio} | {median_ratio} |"
            )
    lines += [
        "",
        "First call (ms): OnnxModule construction (graph checks, forward/backward graph without "
        "input gradient, session, TrainingAgent) and the first step of each route (the "
        "x-requires-grad route builds its own graph then). The process's first OnnxModule step "
        "(batch 100) also pays torch's one-time imports on the first backward through a custom "
        "autograd Function (torch.fx.experimental.symbolic_shapes, sympy).",
        "",
        "| case | OnnxModule build | "
        + " | ".join(f"first step: {ROUTE_LABELS[k]}" for k in ROUTE_LABELS)
        + " |",
        "|---|---:|" + "---:|" * len(ROUTE_LABELS),
    ]
    for c in report["cases"]:
        lines.append(
            f"| {c['name']} | {c['onnx_module_build_ms']:.1f} | "
            + " | ".join(f"{c['routes'][k]['first_step_ms']:.1f}" for k in ROUTE_LABELS)
            + " |"
        )
    lines += [
        "",
        f"Same work: the gradients of one step on the same batch, OnnxModule against torch "
        f"(max abs difference; relative = / max abs torch gradient, must be <= {GRAD_RTOL:g}):",
        "",
        "| case | x | gradients compared | max abs diff | max rel diff | result |",
        "|---|---|---|---:|---:|---|",
    ]
    for c in report["cases"]:
        for key, s in c["same_work"].items():
            lines.append(
                f"| {c['name']} | {'requires grad' if key == 'xgrad' else 'without grad'} | "
                f"{', '.join(s['gradients'])} | {s['max_abs_diff']:.1e} | {s['max_rel_diff']:.1e} | "
                f"{'PASS' if s['pass'] else 'MISS'} |"
            )
    lines += [""]
    if cfg["quick"]:
        lines += ["Quick run: few, short blocks; the target applies to the full run.", ""]
    lines += ["Targets (ratios of us/step from this run):", "", *common.targets_table(report["targets"])]
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, f"steps per block / {QUICK_STEP_DIVISOR}, {QUICK_REPEATS} repeats")
    parser.add_argument("--repeats", type=int, default=None, help="override the timed blocks per route")
    args = parser.parse_args(argv)

    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)

    import ort_train_core  # noqa: F401  (imports onnxruntime before torch, see _runtime.py)

    threads = common.usable_cpus()
    import torch

    torch.set_num_threads(threads)

    batches = [(b, max(1, n // QUICK_STEP_DIVISOR) if args.quick else n) for b, n in BATCHES]
    cases, timing = run_cases(batches, repeats)

    report = {
        "date": common.today(),
        "config": {
            "quick": args.quick,
            "n_features": N_FEATURES,
            "hidden": list(HIDDEN),
            "n_outputs": N_OUTPUTS,
            "activation": "relu",
            "dtype": "float32",
            "batches": [b for b, _ in BATCHES],
            "repeats": repeats,
            "seed": SEED,
            "grad_rtol": GRAD_RTOL,
            "target_ratio": TARGET_RATIO,
            "target_batch": TARGET_BATCH,
        },
        "machine": common.machine_info(threads),
        "timing": timing,
        "cases": cases,
    }
    report["targets"] = common.check_targets(TARGETS, cases)
    text = markdown(report)
    print(f"\n{text}")
    common.write_report(args.out, "torch", args.quick, report, text)
    same_work_ok = all(s["pass"] for c in cases for s in c["same_work"].values())
    if not same_work_ok:
        print("gradients differ between OnnxModule and torch beyond the tolerance", file=sys.stderr)
    return 0 if same_work_ok else 1


if __name__ == "__main__":
    sys.exit(main())
