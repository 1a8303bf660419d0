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

Real sizes (``--real``, issue 28; :data:`REAL`): ResNet-18 on 3x64x64, BERT-mini, a 2-layer LSTM
and an MLP 784-512-512-10, each route on both gradient backends (``full:onnx``...) against torch,
at one thread and at all cores, one child process per setting (torch and every onnxruntime
session at that many threads); at one thread, the full loops' fused steps profiled by onnxruntime
(op types of the gradient nodes by time share: :func:`profile_step`).

A route that fails (an item of issue 17 not done yet) is reported with its error's first line;
the others still run.

Run: ``python benchmarks/bench_zoo.py [--quick] [--real] [--out benchmarks/results]``; it writes
``<host>-<date>-zoo[-real][-quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
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
TARGETS = {"transformer": 1.0, "gru": 1.0, "resnet": 1.25, "mobilenet": 1.25, "lstm": 1.25, "resnet18": 1.25}
TARGETS.update({"bert-mini": 1.0, "lstm-2x256": 1.0, "mlp-784": 1.0})  # issue 28's, real sizes


def physical_cores() -> int:
    """The physical cores among the CPUs this process may use (onnxruntime's default
    intra-op thread count), else the usable CPUs."""
    try:
        import psutil

        return max(1, min(psutil.cpu_count(logical=False) or 1, common.usable_cpus()))
    except ImportError:
        return common.usable_cpus()


class Job:
    """One architecture's training job: the network, its export, the data and the batches
    (a zoo architecture at its test size, or one of :data:`REAL`)."""

    def __init__(self, name: str, n_batches: int, epochs: int, batch: int = BATCH) -> None:
        import zoo_models as zm

        self.name, self.epochs, self.batch = name, epochs, batch
        if name in REAL:
            self.net, self.inputs, self.y, self.task = real_case(name, batch * n_batches)
        else:
            self.task = zm.ZOO[name].task
            self.net = zm.build(name)
            self.inputs, self.y = zm.data(name, batch * n_batches)
        self.model = zm.export(self.net, self.inputs, "torchscript")
        self.bounds = [slice(s, s + batch) for s in range(0, batch * n_batches, batch)]
        self.trainers: dict[str, Any] = {}  # route -> its core trainer (the profiler reads it)

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


def trainer_route(job: Job, route: str) -> Run:
    """The core trainer of ``route`` (``full`` or ``partial``, ``:<backend>`` naming one)."""
    import ort_train_core as otc

    kind, _, backend = route.partition(":")
    lr = otc.LearningRateSGD(eta0=LEARNING_RATE, learning_rate="constant")
    loop: dict[str, Any] = dict(
        max_iter=job.epochs, batch_size=job.batch, shuffle=False, learning_rate=lr, backend=backend or None
    )
    trainer: Any
    if kind == "partial":
        loss = "cross_entropy" if job.task == "classification" else "square_error"
        trainer = otc.OrtGradientForwardBackwardOptimizer(job.model, learning_loss=loss, **loop)
    else:
        score = "cross_entropy" if job.task == "classification" else "squared_error"
        trainer = otc.OrtGradientOptimizer(otc.add_loss_output(job.model, score_name=score), **loop)
    trainer.prepare(job.fit_input, job.y)
    job.trainers[route] = trainer

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
        batch_size=job.batch,
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
        # OnnxModelRegressor reports squared_error as MLPRegressor: half the other routes' loss
        return elapsed, float(estimator.loss_curve_[-1]) * (1 if job.task == "classification" else 2)

    return run


def build_route(job: Job, route: str) -> Run:
    if route == "torch":
        return torch_loop(job, copy.deepcopy(job.net))
    if route.startswith("module"):
        from ort_train_torch import OnnxModule

        return torch_loop(job, OnnxModule(job.model, backend=route.partition(":")[2] or None))
    if route == "sklearn":
        return sklearn_route(job)
    return trainer_route(job, route)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_job(job: Job, repeats: int, routes: Sequence[str] = ROUTES) -> dict[str, Any]:
    """Builds and warms every route, then times them round-robin; the best run of each."""
    built: dict[str, Run] = {}
    failed: dict[str, str] = {}
    for route in routes:
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
    results: dict[str, dict[str, Any]] = {
        route: {"us_per_step": 1e6 * best[route] / job.steps, "last_epoch_loss": last_loss[route]}
        for route in built
    }
    ref = results.get("torch")
    for r in results.values():
        r["ratio_vs_torch"] = None if ref is None else r["us_per_step"] / ref["us_per_step"]
        r["loss_rel_diff_vs_torch"] = (
            None
            if ref is None
            else abs(r["last_epoch_loss"] - ref["last_epoch_loss"]) / abs(ref["last_epoch_loss"])
        )
    return {"name": job.name, "steps": job.steps, "routes": results, "failed": failed}


# ---- the real-size preset (issue 28) ------------------------------------------------------
#: name -> (batch, batches per run: few, a step is long)
REAL = {"resnet18": (32, 3), "bert-mini": (16, 4), "lstm-2x256": (32, 4), "mlp-784": (128, 20)}
BACKENDS = {"onnxruntime-training": "training build", "onnx": "stock"}
REAL_REPEATS = 2  # timed runs (one epoch each) after the warm-up
REAL_PREFIX = "ZOO-REAL-RESULT "


def real_routes(name: str) -> list[str]:
    """torch, then full and partial (and module, but on ResNet-18) on each backend."""
    kinds = ("full", "partial") if name == "resnet18" else ("full", "partial", "module")
    return ["torch", *(f"{k}:{b}" for k in kinds for b in BACKENDS)]


def label(route: str) -> str:
    kind, _, backend = route.partition(":")
    return f"{LABELS[kind]} ({BACKENDS[backend]})" if backend else LABELS[kind]


def real_case(name: str, n: int) -> tuple[Any, dict[str, np.ndarray], np.ndarray, str]:
    """The real-size network ``name`` (seeded), ``n`` rows of its inputs and targets, its task."""
    import torch
    import zoo_models as zm
    from torch import nn

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    net: nn.Module
    inputs: dict[str, np.ndarray]
    if name == "resnet18":  # torchvision's resnet18: stem 7x7/2 + maxpool, [2, 2, 2, 2] blocks
        w = [64, 64, 128, 256, 512]
        blocks = [
            zm.BasicBlock(w[i + (j > 0)], w[i + 1], 2 if i and not j else 1) for i in range(4) for j in (0, 1)
        ]
        stem = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        net = nn.Sequential(*stem, *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))
        inputs = {"X": rng.standard_normal((n, 3, 64, 64), dtype=np.float32)}
    elif name == "bert-mini":  # google/bert_uncased_L-4_H-256_A-4's shape, random weights
        config = zm.transformers.BertConfig(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, num_labels=10
        )
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
        config._attn_implementation = "eager"  # MatMul/Softmax, as the zoo's BERT
        net = zm.TinyBert()
        net.bert = zm.transformers.BertForSequenceClassification(config)  # TinyBert's forward
        ids = rng.integers(1, config.vocab_size, size=(n, 128))
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    elif name == "lstm-2x256":
        net = zm.RecurrentRegressor("lstm", n_features=32, hidden=256)
        net.rnn = nn.LSTM(32, 256, num_layers=2, batch_first=True)
        inputs = {"X": rng.standard_normal((n, 50, 32), dtype=np.float32)}
        return net.train(), inputs, rng.standard_normal((n, 1), dtype=np.float32), "regression"
    else:
        net = nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        inputs = {"X": rng.standard_normal((n, 784), dtype=np.float32)}
    return net.train(), inputs, rng.integers(0, 10, size=n), "classification"


def profile_step(job: Job, route: str, threads: int, steps: int = 3) -> dict[str, Any]:
    """onnxruntime's profile of the fused step the full loop ``route`` ran (``steps`` runs on
    the job's first batch, random weights): ms/step, the forward nodes' share, and the gradient
    and update nodes' time by op_type, top 8 by share of the step."""
    import tempfile

    import onnxruntime as ort

    graph = next(iter(job.trainers[route]._graphs().steps.values())).graph
    so = ort.SessionOptions()
    so.enable_profiling, so.intra_op_num_threads = True, threads
    so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "zoo")
    sess = ort.InferenceSession(graph.SerializeToString(), so, providers=["CPUExecutionProvider"])
    data, rng = {**job.inputs, "y": job.y}, np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else job.batch for d in i.shape]
        random = np.asarray(0.05 * rng.standard_normal(shape), dtype=np.float32)
        feeds[i.name] = data[i.name][: job.batch] if i.name in data else random
        feeds[i.name] = (
            np.zeros(shape, dtype=np.int64) if "int" in i.type and i.name not in data else feeds[i.name]
        )
    for _ in range(steps):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    forward, times = {n.name for n in job.model.graph.node}, dict[str, float]()
    total = forward_us = 0.0
    for e in (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")):
        total += e["dur"]
        node = e["name"][: -len("_kernel_time")].removeprefix("fused ")  # onnxruntime's fusions
        if node in forward or node.startswith("loss_"):
            forward_us += e["dur"]
        else:
            times[e["args"]["op_name"]] = times.get(e["args"]["op_name"], 0.0) + e["dur"]
    top = sorted(times.items(), key=lambda kv: -kv[1])[:8]
    return {
        "ms_per_step": total / 1e3 / steps,
        "forward_share": forward_us / total,
        "top": [(op, us / total) for op, us in top],
    }


def run_cases(names: Sequence[str], threads: int, quick: bool, real: bool) -> list[dict[str, Any]]:
    """Every case (zoo test sizes, or :data:`REAL`), printed as it ends; at real sizes torch
    and every onnxruntime session at ``threads``, and at one thread the full loops' profiles."""
    cases = []
    for name in names:
        batch, n_batches = REAL.get(name, (BATCH, 0))
        n_batches, epochs, repeats = (
            ((n_batches // 4 or 1, 1, 1) if quick else (n_batches, 1, REAL_REPEATS)) if real else SIZES[quick]
        )
        load_before = common.loadavg()
        print(
            f"[{name}, {threads} thread(s)] {n_batches * epochs} steps of batch {batch}",
            file=sys.stderr,
            flush=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporters' and trainers' advice on export settings
            try:
                job = Job(name, n_batches, epochs, batch)
            except Exception as exc:
                print(f"  could not build: {_first_line(exc)}", file=sys.stderr, flush=True)
                continue
            case = run_job(job, repeats, real_routes(name) if real else ROUTES)
            full = [f"full:{b}" for b in BACKENDS if real and threads == 1 and f"full:{b}" in case["routes"]]
            case["profile"] = {r: profile_step(job, r, threads) for r in full}
        case.update(threads=threads, loadavg_1min=[load_before, common.loadavg()])
        for route, r in case["routes"].items():
            ratio = "" if r["ratio_vs_torch"] is None else f" x{r['ratio_vs_torch']:.2f}"
            print(
                f"  {label(route):<40} {r['us_per_step']:11.1f} us/step{ratio}", file=sys.stderr, flush=True
            )
        for route, why in case["failed"].items():
            print(f"  {label(route):<40} FAILED {why}", file=sys.stderr, flush=True)
        cases.append(case)
    return cases


# ---- report -------------------------------------------------------------------------------
REAL_TEXT = (
    "ResNet-18 on 3x64x64 (batch 32, 10 classes), BERT-mini (4 layers x 256 hidden, 4 heads, intermediate "
    "1024, vocabulary 30522, sequence 128, batch 16, eager attention), LSTM (2 layers x 256 hidden, 32 "
    "features, 50 steps, batch 32, last step -> Linear, squared error), MLP 784-512-512-10 (batch 128); "
    "random weights, TorchScript export in training mode, every weight trained, plain SGD (lr {lr}), best "
    "of {repeats} timed runs (one epoch of {steps} steps) after one warm-up. One process per thread setting: "
    "torch and every onnxruntime session at that many intra-op threads. 'training build': "
    "backend='onnxruntime-training', 'stock': backend='onnx'. "
)
ZOO_TEXT = (
    "The architectures of tests/zoo at their test sizes (tiny: the per-step overhead of each framework "
    "weighs more than on full-size networks), TorchScript export in training mode, every weight trained. "
    "Batch {batch}, {batches} batches x {epochs} epochs, plain SGD (lr {lr}), best of {repeats} timed runs; "
    "torch at {threads} thread(s), onnxruntime {ort}. "
)


def markdown(report: dict[str, Any]) -> str:
    cases, info, real = report["cases"], report["machine"], report.get("real", False)
    ort = (
        f"at {report['ort_threads']} thread(s) in every session (--equal-threads)"
        if report.get("equal_threads")
        else f"at its default ({report.get('ort_threads')}: one per physical core) except where ort-train "
        "gives a small fused step one thread"
    )
    steps = ", ".join(dict.fromkeys(f"{c['name']} {c['steps']}" for c in cases))
    text = (REAL_TEXT if real else ZOO_TEXT).format(
        lr=LEARNING_RATE,
        repeats=report["repeats"],
        steps=steps,
        batch=BATCH,
        ort=ort,
        threads=info.get("torch_threads"),
        batches=report.get("batches_per_epoch"),
        epochs=report.get("epochs"),
    )
    lines = [
        f"# Zoo{' at real sizes' * real}: training step time against torch{' (quick)' * report['quick']}",
        "",
        common.machine_line(info),
        "",
        text + "Cells: us/step (ratio to torch's in the same process; lower is faster); 'fails' when the "
        "route cannot train the architecture (see below), '—' where not run. The 1-minute load average "
        "during each case: "
        + common.load_text([{**c, "name": f"{c['name']}/{c['threads']}"} for c in cases]),
        "",
    ]
    routes = list(dict.fromkeys(r for c in cases for r in (real_routes(c["name"]) if real else ROUTES)))
    rows = []
    for c in cases:
        r, target = c["routes"], TARGETS.get(c["name"])
        cells = [
            f"{r[x]['us_per_step']:,.0f} ({r[x]['ratio_vs_torch']:.2f}x)"
            if r.get(x, {}).get("ratio_vs_torch")
            else "fails"
            if x in c["failed"]
            else "—"  # not run there
            for x in routes
        ]
        rows.append([c["name"], str(c["threads"]), *cells, f"<= {target}x" if target else "—"])
    lines += common.markdown_table(["architecture", "threads", *map(label, routes), "full-loop target"], rows)
    checks = [
        {**t, "case": f"{c['name']}, {c['threads']} thread(s)"}
        for c in cases
        for r in routes
        if r.startswith("full") and c["name"] in TARGETS
        for t in common.check_targets(
            [(f"{label(r)} / torch", c["name"], r, "torch", "<=", TARGETS[c["name"]])], [c]
        )
    ]
    lines += [
        "",
        "Targets (issue 17 on the test sizes, issue 28 on the real sizes):",
        "",
        *common.targets_table(checks),
    ]
    failures = [
        f"- {c['name']}, {c['threads']} thread(s), {label(r)}: {why}"
        for c in cases
        for r, why in c["failed"].items()
    ]
    lines += ["", "Routes that fail:", "", *failures] if failures else []
    diffs = [
        f"{c['name']}{'/' + str(c['threads']) if real else ''} {r} {v['loss_rel_diff_vs_torch']:.1e}"
        for c in cases
        for r, v in c["routes"].items()
        if r != "torch" and v["loss_rel_diff_vs_torch"] is not None
    ]
    lines += [
        "",
        "Same work: the last epoch's mean loss of each route, relative to torch's: " + ", ".join(diffs) + ".",
    ]
    profiles = [(c["name"], r, p) for c in cases for r, p in c.get("profile", {}).items()]
    if profiles:
        lines += ["", "## Where the time goes", "", PROFILE_TEXT, ""]
    for name, r, p in profiles:
        top = ", ".join(f"{op} {s:.0%}" for op, s in p["top"])
        lines.append(
            f"- {name}, {label(r)}: {p['ms_per_step']:.1f} ms/step, forward {p['forward_share']:.0%}; {top}"
        )
    return "\n".join(lines)


PROFILE_TEXT = (
    "onnxruntime's profile (SessionOptions.enable_profiling) of each full loop's fused step at one thread, "
    "3 runs: ms/step of its nodes, the forward's share (the exported graph's and the loss's nodes), then the "
    "top 8 op types of the gradient and update nodes by share of the step."
)


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, "4 batches x 1 epoch, 2 timed runs (about a minute)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: physical cores)")
    parser.add_argument("--only", nargs="*", default=None, help="architectures to run (default: all)")
    parser.add_argument(
        "--equal-threads", action="store_true", help="every onnxruntime session on torch's thread count too"
    )
    parser.add_argument("--real", action="store_true", help="the real-size preset, at 1 thread and all cores")
    parser.add_argument("--real-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch
    import zoo_models as zm

    threads = args.real_child or args.threads or physical_cores()
    torch.set_num_threads(threads)
    if args.equal_threads or args.real_child:
        common.force_session_threads(threads)
    if args.real_child:  # one thread setting of --real: its cases as one JSON line
        print(
            REAL_PREFIX + json.dumps(run_cases(args.only or list(REAL), threads, args.quick, True)),
            flush=True,
        )
        return 0
    report = dict(
        date=common.today(), quick=args.quick, real=args.real, learning_rate=LEARNING_RATE, cases=[]
    )
    if args.real:
        for t in sorted({1, threads}):  # one process per thread setting
            cmd = [sys.executable, __file__, "--real-child", str(t), *(["--quick"] if args.quick else [])]
            result = common.child_result(
                [*cmd, "--only", *(args.only or REAL)], REAL_PREFIX, live_stderr=True
            )
            report["cases"] += result if isinstance(result, list) else print(f"{t} thread(s): {result}") or []
        report.update(repeats=1 if args.quick else REAL_REPEATS, machine=common.machine_info())
    else:
        n_batches, epochs, repeats = SIZES[args.quick]
        report.update(batch=BATCH, batches_per_epoch=n_batches, epochs=epochs, repeats=repeats)
        report.update(
            ort_threads=threads if args.equal_threads else physical_cores(), equal_threads=args.equal_threads
        )
        names = [n for n in (args.only or zm.ZOO) if n != "bert" or zm.transformers is not None]
        report.update(
            machine=common.machine_info(torch_threads=threads),
            cases=run_cases(names, threads, args.quick, False),
        )
    markdown_text = markdown(report)
    common.write_report(args.out, "zoo-real" if args.real else "zoo", args.quick, report, markdown_text)
    return 0 if report["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
