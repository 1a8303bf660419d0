"""Torch adapter benchmark: ``ort_train_torch.OnnxModule`` forward + backward against the same
network as a pure-torch ``nn.Sequential``.

Case (from the issue): one forward + backward per batch through an MLP(100, 100): 100 input
features, two hidden layers of 100 ReLU units, 1 output, float32; batch 1000, and batches 100
and 10000 beside it.

Routes (per batch size), all over the very same weights:

- ``OnnxModule, x without grad``: the MLP as an ONNX graph (MatMul/Add/Relu built with
  ``onnx.helper``, opset 17, IR 8, the weights copied from the torch ``nn.Linear`` layers,
  transposed) in an ``OnnxModule``; a step is ``for p in params: p.grad = None``,
  ``out = module(x)``, ``out.backward(grad)``. The input does not require a gradient (a
  first layer): the TrainingAgent computes the parameters' gradients only.
- ``OnnxModule, x requires grad``: the same with ``x.requires_grad=True`` (a middle layer): a
  second forward/backward graph that also returns the input's gradient; ``x.grad`` is reset
  each step too.
- ``torch nn.Sequential, x without grad`` / ``x requires grad``: ``nn.Linear -> ReLU -> ...``
  holding the same weights, the same per-step work.

``grad`` is a fixed random (batch, 1) tensor, the gradient of the output (as a loss would hand
it back), the same for every route. Nothing is updated, so every step does identical work.

Same work: on one batch the parameter gradients of the OnnxModule (``W{k}`` is the transpose
of torch's ``weight``) and those of torch, and the input gradients of the middle-layer routes,
must agree: max abs difference / max abs torch gradient <= 1e-4, per case (the report flags a
miss and the run exits with status 1).

Timing: time.perf_counter around a block of steps (``steps per block``, chosen so a block
lasts tens of ms), an untimed warm-up of each route first (its first step, which builds the
middle-layer route's graph, is reported apart), then ``--repeats`` blocks per route going
round-robin over the routes of a case, so that a busy moment of a shared machine hits all
alike. us/step = best block / steps per block; the median is reported too. ratio = OnnxModule
us/step / torch us/step (same input-gradient setting).

Threads: ``torch.set_num_threads(2)`` (the machine has 2 cores; the number is the usable CPUs);
onnxruntime's sessions (made by ort-train-core, no intra-op setting) use the default intra-op
thread count (0: one per physical core).

Target (from the issue): OnnxModule forward + backward <= 1.3x torch (batch 1000, MLP(100, 100)).

Run: ``python benchmarks/bench_torch.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>-torch.json`` and ``.md`` (``-torch-quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 0
N_FEATURES = 100
HIDDEN = (100, 100)
N_OUTPUTS = 1
#: relative gradient difference (max abs diff / max abs torch gradient) allowed between routes
GRAD_RTOL = 1e-4
#: (batch, steps per block in the full run); --quick divides the steps by QUICK_STEP_DIVISOR
BATCHES = [(100, 200), (1000, 40), (10_000, 5)]
QUICK_STEP_DIVISOR = 2
TARGET_BATCH = 1000
TARGET_RATIO = 1.3

TARGETS = [
    # (name, batch, numerator route, denominator route, op, bound)
    (
        f"OnnxModule forward+backward <= {TARGET_RATIO}x torch (batch {TARGET_BATCH}, MLP(100, 100))",
        TARGET_BATCH,
        "ours",
        "torch",
        "<=",
        TARGET_RATIO,
    ),
]

ROUTE_LABELS = {
    "ours": "OnnxModule, x without grad",
    "torch": "torch nn.Sequential, x without grad",
    "ours_xgrad": "OnnxModule, x requires grad",
    "torch_xgrad": "torch nn.Sequential, x requires grad",
}
#: route -> the torch route it is compared with
PEERS = {"ours": "torch", "ours_xgrad": "torch_xgrad"}


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


def onnx_mlp(net: Any) -> Any:
    """The same network as MatMul/Add/Relu nodes (opset 17, IR 8); initializers ``W{k}``
    (in x out: torch's weight transposed) and ``b{k}`` hold copies of the torch parameters."""
    from onnx import TensorProto, helper, numpy_helper
    from torch import nn

    linears = [m for m in net if isinstance(m, nn.Linear)]
    nodes, inits = [], []
    current = "X"
    for k, lin in enumerate(linears):
        W = lin.weight.detach().numpy().T.copy()
        b = lin.bias.detach().numpy().copy()
        inits += [numpy_helper.from_array(W, f"W{k}"), numpy_helper.from_array(b, f"b{k}")]
        last = k == len(linears) - 1
        out = "Y" if last else f"z{k}"
        nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"mm{k}"]))
        nodes.append(helper.make_node("Add", [f"mm{k}", f"b{k}"], [out]))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"a{k}"]))
            out = f"a{k}"
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", N_FEATURES])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", N_OUTPUTS])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def torch_grads_as_onnx(net: Any) -> dict[str, Any]:
    """The torch network's parameter gradients under the ONNX parameter names."""
    from torch import nn

    out = {}
    for k, lin in enumerate(m for m in net if isinstance(m, nn.Linear)):
        out[f"W{k}"] = lin.weight.grad.T
        out[f"b{k}"] = lin.bias.grad
    return out


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
        ref = torch_grads_as_onnx(net)
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


def run_case(batch: int, steps: int, repeats: int, warmup: int) -> dict[str, Any]:
    import torch

    from ort_train_torch import OnnxModule

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"[batch {batch}] {steps} steps per block, {repeats} blocks per route", flush=True)
    gen = torch.Generator().manual_seed(SEED + batch)
    x = torch.randn(batch, N_FEATURES, generator=gen)
    grad = torch.randn(batch, N_OUTPUTS, generator=gen)
    x_req = x.clone().requires_grad_(True)

    net = torch_mlp()
    t = time.perf_counter()
    ours = OnnxModule(onnx_mlp(net))
    build_seconds = time.perf_counter() - t
    same_work = check_same_work(ours, net, x, grad)

    steps_by_route = {
        "ours": make_step(ours, x, grad),
        "torch": make_step(net, x, grad),
        "ours_xgrad": make_step(ours, x_req, grad),
        "torch_xgrad": make_step(net, x_req, grad),
    }
    first: dict[str, float] = {}
    for key, step in steps_by_route.items():
        first[key] = time_block(step, 1)
        time_block(step, warmup)
    times: dict[str, list[float]] = {key: [] for key in steps_by_route}
    for _ in range(repeats):
        for key, step in steps_by_route.items():
            times[key].append(time_block(step, steps))

    routes: dict[str, dict[str, Any]] = {}
    for key in steps_by_route:
        best = min(times[key])
        routes[key] = {
            "label": ROUTE_LABELS[key],
            "us_per_step": 1e6 * best,
            "median_us_per_step": 1e6 * statistics.median(times[key]),
            "times_us_per_step": [1e6 * v for v in times[key]],
            "first_step_ms": 1e3 * first[key],
        }
    for key, peer in PEERS.items():
        routes[key]["ratio"] = routes[key]["us_per_step"] / routes[peer]["us_per_step"]
        routes[key]["median_ratio"] = routes[key]["median_us_per_step"] / routes[peer]["median_us_per_step"]
    for r in routes.values():
        ratio = f"  ratio {r['ratio']:.2f} (median {r['median_ratio']:.2f})" if "ratio" in r else ""
        print(
            f"  {r['label']:<38} {r['us_per_step']:9.1f} us/step (median {r['median_us_per_step']:9.1f})"
            f"{ratio}",
            flush=True,
        )
    for key, s in same_work.items():
        print(
            f"  gradients ({key}): max abs diff {s['max_abs_diff']:.1e}, "
            f"max rel diff {s['max_rel_diff']:.1e}",
            flush=True,
        )
    return {
        "name": f"batch {batch}",
        "batch": batch,
        "steps_per_block": steps,
        "repeats": repeats,
        "routes": routes,
        "same_work": same_work,
        "onnx_module_build_ms": 1e3 * build_seconds,
        "loadavg_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
    }


# ---- machine ------------------------------------------------------------------------------
def machine_info(torch_threads: int) -> dict[str, Any]:
    import importlib.metadata as md

    import onnxruntime
    import torch

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str] = {"python": sys.version.split()[0]}
    for dist in (
        "numpy",
        "onnx",
        "onnxruntime-training-cpu",
        "onnxruntime-training",
        "torch",
        "ort-train-core",
        "ort-train-torch",
    ):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    versions["onnxruntime"] = onnxruntime.__version__
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "versions": versions,
        "torch_threads": torch_threads,
        "torch_get_num_threads": torch.get_num_threads(),
        "onnxruntime_intra_op_threads": "default (0: one per physical core)",
    }


# ---- report -------------------------------------------------------------------------------
def evaluate_targets(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_batch = {c["batch"]: c for c in cases}
    rows = []
    for name, batch, num, den, op, bound in TARGETS:
        if batch not in by_batch:
            continue
        routes = by_batch[batch]["routes"]
        ratio = routes[num]["us_per_step"] / routes[den]["us_per_step"]
        ok = ratio <= bound if op == "<=" else ratio >= bound
        rows.append(
            {
                "target": name,
                "case": f"batch {batch}",
                "ratio": ratio,
                "op": op,
                "bound": bound,
                "pass": bool(ok),
            }
        )
    return rows


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    v = m["versions"]
    cfg = report["config"]
    lines = [
        f"# OnnxModule vs torch nn.Sequential, forward + backward "
        f"({report['date']}{', quick' if cfg['quick'] else ''})",
        "",
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs; Python {v['python']}, "
        f"onnxruntime {v.get('onnxruntime')}, torch {v.get('torch')}, "
        f"ort-train-torch {v.get('ort-train-torch')}; torch threads {m['torch_threads']} "
        "(torch.set_num_threads), onnxruntime intra-op threads: the default (0: one per physical "
        "core) in every session the OnnxModule builds.",
        "",
        "1-minute load average around each case (this benchmark's own threads included): "
        + ", ".join(
            f"{c['name']} {c['loadavg_1min'][0]:.1f}-{c['loadavg_1min'][1]:.1f}"
            for c in report["cases"]
            if None not in c["loadavg_1min"]
        )
        + ".",
        "",
        f"MLP({', '.join(map(str, cfg['hidden']))}): {cfg['n_features']} float32 features -> "
        f"{' -> '.join(f'{h} ReLU' for h in cfg['hidden'])} -> {cfg['n_outputs']}, the same "
        "weights in both. A step: parameters' .grad = None (and x.grad when x requires grad), "
        "out = module(x), out.backward(grad) with a fixed random output gradient. us/step: "
        f"best of {cfg['repeats']} timed blocks per route (the steps per block are in the "
        "table) after a warm-up, round-robin over the routes; the median block in brackets. "
        "ratio = OnnxModule / torch us/step with the same input-gradient setting (> 1: "
        "OnnxModule slower).",
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
        "x-requires-grad route builds its own graph then).",
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
    lines += [
        "",
        "Targets (ratios of us/step from this run):",
        "",
        "| target | case | ratio | bound | result |",
        "|---|---|---:|---:|---|",
    ]
    if cfg["quick"]:
        lines[-4:-4] = ["Quick run: few, short blocks; the target applies to the full run.", ""]
    for t in report["targets"]:
        lines.append(
            f"| {t['target']} | {t['case']} | {t['ratio']:.2f} | {t['op']} {t['bound']} | "
            f"{'PASS' if t['pass'] else 'MISS'} |"
        )
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"steps per block / {QUICK_STEP_DIVISOR}, 5 repeats"
    )
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "results"),
        help="folder for the JSON and Markdown results",
    )
    parser.add_argument("--repeats", type=int, default=None, help="override the timed blocks per route")
    args = parser.parse_args(argv)

    repeats = args.repeats or (5 if args.quick else 15)

    import ort_train_core  # noqa: F401  (imports onnxruntime before torch, see _runtime.py)

    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    import torch

    torch.set_num_threads(threads)

    cases = []
    for batch, steps in BATCHES:
        n = max(1, steps // QUICK_STEP_DIVISOR) if args.quick else steps
        cases.append(run_case(batch, n, repeats, warmup=n))

    date = datetime.date.today().isoformat()
    report = {
        "date": date,
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
        "machine": machine_info(threads),
        "cases": cases,
    }
    report["targets"] = evaluate_targets(cases)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9_.-]", "", socket.gethostname()) or "machine"
    stem = f"{host}-{date}-torch{'-quick' if args.quick else ''}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(report))
    print()
    print(markdown(report))
    print(f"wrote {out / stem}.json and .md")
    same_work_ok = all(s["pass"] for c in cases for s in c["same_work"].values())
    if not same_work_ok:
        print("gradients differ between OnnxModule and torch beyond the tolerance", file=sys.stderr)
    return 0 if same_work_ok else 1


if __name__ == "__main__":
    sys.exit(main())
