"""Zoo benchmark (issue 17): the time of a training step of each zoo architecture on each
ort-train route, as a ratio to torch's step measured in the same run, on CPU.

Architectures: those of ``tests/zoo/zoo_models.py`` (imported from there: one definition for the
tests and the benchmark), at their test sizes (a resnet- and a mobilenet_v3-style CNN on 3x8x8
images, a TransformerEncoder text classifier on 6 token ids, a tiny BERT from ``transformers``
when it is installed, GRU and LSTM regressors on 5x4 sequences, a Conv1d+BatchNorm1d net on 4x16
signals), random-initialised, exported by the TorchScript exporter in training mode
(``do_constant_folding=False``: every parameter stays an initializer), all weights trained.

Routes: ``torch`` (the reference: ``torch.optim.SGD`` on the torch network, the loss computed by
torch), ``full`` (``OrtGradientOptimizer.fit``), ``partial``
(``OrtGradientForwardBackwardOptimizer.fit``), ``module`` (``OnnxModule`` trained by the same
torch loop) and ``sklearn`` (``OnnxModelClassifier`` / ``OnnxModelRegressor``, ``solver='sgd'``).
Plain SGD at a constant learning rate, batch 32, ``shuffle=False``, cross-entropy on the logits
or the squared error, mean over the rows.

Timing: one untimed warm-up run per route (graphs, sessions; the core trainers' ``prepare``),
then the timed runs round-robin over the routes, each from the same initial weights; us/step is
the best run's time over its steps. The core trainers' times include everything ``fit`` does;
the scikit-learn route's also its per-fit conversion of the graph. Threads: torch runs
``torch.set_num_threads(threads)`` with ``threads`` the physical cores this process may use,
which is onnxruntime's default intra-op thread count; ort-train gives a session one thread
where the fused step's work is small (its own policy). On a machine other processes keep busy,
torch's threads beyond one can cost it far more than they bring (``--threads 1`` compares one
thread against onnxruntime's default; ``--equal-threads`` gives every onnxruntime session
torch's thread count too).

A route that fails (an item of issue 17 not done yet) is reported with its error's first line;
the others still run.

Run: ``python benchmarks/bench_zoo.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>-zoo[-quick].{json,md}``.
"""

from __future__ import annotations

import copy
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import _common as common

ZOO_DIR = Path(__file__).resolve().parent.parent / "tests" / "zoo"
if str(ZOO_DIR) not in sys.path:
    sys.path.insert(0, str(ZOO_DIR))

BATCH = 32
LEARNING_RATE = 0.01
#: (batches per epoch, epochs, timed runs) of a full run and of ``--quick``
SIZES = {False: (8, 3, 5), True: (4, 1, 2)}
ROUTES = ("torch", "full", "partial", "module", "sklearn")
LABELS = {
    "torch": "torch (SGD loop)",
    "full": "full loop",
    "partial": "partial loop",
    "module": "OnnxModule + torch SGD",
    "sklearn": "OnnxModel* (scikit-learn)",
}
#: the issue's targets on the full loop's ratio to torch
TARGETS = {"transformer": 1.0, "gru": 1.0, "resnet": 1.25, "mobilenet": 1.25, "lstm": 1.25}


def physical_cores() -> int:
    """The physical cores among the CPUs this process may use (onnxruntime's default
    intra-op thread count), else the usable CPUs."""
    try:
        import psutil

        return max(1, min(psutil.cpu_count(logical=False) or 1, common.usable_cpus()))
    except ImportError:
        return common.usable_cpus()


class Job:
    """One architecture's training job: the network, its export, the data and the batches."""

    def __init__(self, name: str, n_batches: int, epochs: int) -> None:
        import zoo_models as zm

        self.name = name
        self.task = zm.ZOO[name].task
        self.net = zm.build(name)
        self.inputs, self.y = zm.data(name, BATCH * n_batches)
        self.model = zm.export(self.net, self.inputs, "torchscript")
        self.epochs = epochs
        self.bounds = [slice(s, s + BATCH) for s in range(0, BATCH * n_batches, BATCH)]

    @property
    def steps(self) -> int:
        return self.epochs * len(self.bounds)

    @property
    def fit_input(self) -> Any:
        return next(iter(self.inputs.values())) if len(self.inputs) == 1 else self.inputs

    def torch_loss(self, out: Any, y: Any) -> Any:
        from torch.nn import functional as F

        if self.task == "classification":
            return F.cross_entropy(out, y)
        return ((out - y) ** 2).sum(dim=1).mean()


# ---- routes: each returns (run() -> (seconds, last epoch's mean loss)) -----------------------
Run = Callable[[], tuple[float, float]]


def torch_loop(job: Job, module: Any) -> Run:
    """Plain SGD over the job's batches on ``module`` (a torch network or an OnnxModule), from
    the same initial parameters at each run (restored untimed)."""
    import torch

    tensors = [torch.from_numpy(v) for v in job.inputs.values()]
    target = torch.from_numpy(job.y)
    initial = copy.deepcopy(module.state_dict())

    def run() -> tuple[float, float]:
        module.load_state_dict(initial)
        module.train()
        opt = torch.optim.SGD(module.parameters(), lr=LEARNING_RATE)
        losses = []
        t = time.perf_counter()
        for _ in range(job.epochs):
            for b in job.bounds:
                opt.zero_grad()
                loss = job.torch_loss(module(*[x[b] for x in tensors]), target[b])
                loss.backward()
                opt.step()
                losses.append(loss.detach())
        elapsed = time.perf_counter() - t
        return elapsed, float(np.mean([float(v) for v in losses[-len(job.bounds) :]]))

    return run


def trainer_route(job: Job, partial: bool) -> Run:
    import ort_train_core as otc

    lr = otc.LearningRateSGD(eta0=LEARNING_RATE, learning_rate="constant")
    loop = dict(max_iter=job.epochs, batch_size=BATCH, shuffle=False, learning_rate=lr)
    trainer: Any
    if partial:
        loss = "cross_entropy" if job.task == "classification" else "square_error"
        trainer = otc.OrtGradientForwardBackwardOptimizer(job.model, learning_loss=loss, **loop)
    else:
        score = "cross_entropy" if job.task == "classification" else "squared_error"
        trainer = otc.OrtGradientOptimizer(otc.add_loss_output(job.model, score_name=score), **loop)
    trainer.prepare(job.fit_input, job.y)

    def run() -> tuple[float, float]:
        t = time.perf_counter()
        trainer.fit(job.fit_input, job.y)
        return time.perf_counter() - t, float(trainer.train_losses_[-1])

    return run


def sklearn_route(job: Job) -> Run:
    from ort_train_sklearn import OnnxModelClassifier, OnnxModelRegressor

    cls = OnnxModelClassifier if job.task == "classification" else OnnxModelRegressor
    estimator = cls(
        job.model,
        solver="sgd",
        learning_rate_init=LEARNING_RATE,
        batch_size=BATCH,
        max_iter=job.epochs,
        shuffle=False,
    )
    y = job.y if job.task == "classification" else job.y.ravel()

    def run() -> tuple[float, float]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few epochs: the ConvergenceWarning is expected
            t = time.perf_counter()
            estimator.fit(job.fit_input, y)
            elapsed = time.perf_counter() - t
        return elapsed, float(estimator.loss_curve_[-1])

    return run


def build_route(job: Job, route: str) -> Run:
    if route == "torch":
        return torch_loop(job, copy.deepcopy(job.net))
    if route == "module":
        from ort_train_torch import OnnxModule

        return torch_loop(job, OnnxModule(job.model))
    if route == "sklearn":
        return sklearn_route(job)
    return trainer_route(job, partial=route == "partial")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_job(job: Job, repeats: int) -> dict[str, Any]:
    """Builds and warms every route, then times them round-robin; the best run of each."""
    built: dict[str, Run] = {}
    failed: dict[str, str] = {}
    for route in ROUTES:
        try:
            run = build_route(job, route)
            run()  # warm-up: sessions, caches, first allocations
            built[route] = run
        except Exception as exc:
            failed[route] = _first_line(exc)
    best: dict[str, float] = {}
    last_loss: dict[str, float] = {}
    for _ in range(repeats):
        for route, run in list(built.items()):
            try:
                seconds, loss = run()
            except Exception as exc:
                failed[route] = _first_line(exc)
                del built[route]
                continue
            best[route] = min(best.get(route, np.inf), seconds)
            last_loss[route] = loss
    routes = {
        route: {"us_per_step": 1e6 * best[route] / job.steps, "last_epoch_loss": last_loss[route]}
        for route in built
    }
    ref = routes.get("torch")
    for r in routes.values():
        r["ratio_vs_torch"] = None if ref is None else r["us_per_step"] / ref["us_per_step"]
        r["loss_rel_diff_vs_torch"] = (
            None
            if ref is None
            else abs(r["last_epoch_loss"] - ref["last_epoch_loss"]) / abs(ref["last_epoch_loss"])
        )
    return {"name": job.name, "steps": job.steps, "routes": routes, "failed": failed}


# ---- report -------------------------------------------------------------------------------
def markdown(report: dict[str, Any]) -> str:
    info = report["machine"]
    lines = [
        f"# Zoo: training step time against torch{' (quick)' if report['quick'] else ''}",
        "",
        common.machine_line(info),
        "",
        "The architectures of tests/zoo at their test sizes (tiny: the per-step overhead of each "
        "framework weighs more than on full-size networks), TorchScript export in training mode, "
        "every weight trained. "
        f"Batch {BATCH}, {report['batches_per_epoch']} batches x {report['epochs']} epochs, plain SGD "
        f"(lr {LEARNING_RATE}), best of {report['repeats']} timed runs; torch at "
        f"{info['torch_threads']} thread(s), onnxruntime "
        + (
            f"at {report['ort_threads']} thread(s) in every session (--equal-threads). "
            if report.get("equal_threads")
            else f"at its default ({report['ort_threads']}: one per physical core) except where ort-train "
            "gives a small fused step one thread. "
        )
        + "Cells: us/step "
        "of torch, then each route's time as a ratio to torch's (lower is faster); 'fails' when the "
        "route cannot train the architecture yet (see below). The 1-minute load average during the "
        f"run: {common.load_text(report['cases'])}",
        "",
    ]
    header = ["architecture", "torch us/step", *(LABELS[r] for r in ROUTES[1:]), "full-loop target"]
    rows = []
    for case in report["cases"]:
        routes = case["routes"]
        torch_cell = common.fmt(routes["torch"]["us_per_step"], 4) if "torch" in routes else "fails"
        cells = [
            f"{routes[r]['ratio_vs_torch']:.2f}x" if r in routes and routes[r]["ratio_vs_torch"] else "fails"
            for r in ROUTES[1:]
        ]
        target = TARGETS.get(case["name"])
        rows.append([case["name"], torch_cell, *cells, f"<= {target}x" if target else "—"])
    lines += common.markdown_table(header, rows)
    failures = [(c["name"], r, why) for c in report["cases"] for r, why in c["failed"].items()]
    if failures:
        lines += ["", "Routes that fail:", ""]
        lines += [f"- {name}, {LABELS[r]}: {why}" for name, r, why in failures]
    diffs = [
        f"{c['name']} {r} {v['loss_rel_diff_vs_torch']:.1e}"
        for c in report["cases"]
        for r, v in c["routes"].items()
        if r != "torch" and v["loss_rel_diff_vs_torch"] is not None
    ]
    lines += [
        "",
        "Same work: the last epoch's mean loss of each route, relative to torch's: " + ", ".join(diffs) + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, "4 batches x 1 epoch, 2 timed runs (about a minute)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: physical cores)")
    parser.add_argument("--only", nargs="*", default=None, help="architectures to run (default: all)")
    parser.add_argument(
        "--equal-threads", action="store_true", help="every onnxruntime session on torch's thread count too"
    )
    args = parser.parse_args(argv)
    import torch
    import zoo_models as zm

    threads = args.threads or physical_cores()
    torch.set_num_threads(threads)
    if args.equal_threads:
        common.force_session_threads(threads)
    n_batches, epochs, repeats = SIZES[args.quick]
    names = [n for n in (args.only or zm.ZOO) if n != "bert" or zm.transformers is not None]
    cases = []
    for name in names:
        load_before = common.loadavg()
        print(f"[{name}] {n_batches * epochs} steps of batch {BATCH}", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporters' and trainers' advice on export settings
            case = run_job(Job(name, n_batches, epochs), repeats)
        case["loadavg_1min"] = [load_before, common.loadavg()]
        for route, r in case["routes"].items():
            ratio = "" if r["ratio_vs_torch"] is None else f" x{r['ratio_vs_torch']:.2f}"
            print(f"  {LABELS[route]:<28} {r['us_per_step']:9.1f} us/step{ratio}", flush=True)
        for route, why in case["failed"].items():
            print(f"  {LABELS[route]:<28} FAILED {why}", flush=True)
        cases.append(case)
    report = {
        "date": common.today(),
        "quick": args.quick,
        "batch": BATCH,
        "batches_per_epoch": n_batches,
        "epochs": epochs,
        "repeats": repeats,
        "learning_rate": LEARNING_RATE,
        "ort_threads": threads if args.equal_threads else physical_cores(),
        "equal_threads": args.equal_threads,
        "machine": common.machine_info(torch_threads=threads),
        "cases": cases,
    }
    common.write_report(args.out, "zoo", args.quick, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
