"""Dataset benchmark: the four drop-ins at their default parameters against scikit-learn's
estimators at theirs, on scikit-learn's datasets: test score and fit-time ratio.

Datasets: iris, wine, breast_cancer, digits and ``make_classification(100_000, 50,
n_informative=10)`` for the classifiers (``OrtSGDClassifier`` / ``SGDClassifier``,
``OrtMLPClassifier`` / ``MLPClassifier``); diabetes and ``make_friedman1(5000, noise=1)`` for
the regressors (``OrtSGDRegressor`` / ``SGDRegressor``, ``OrtMLPRegressor`` / ``MLPRegressor``).
Each seed draws a 25 % test split (stratified for classifiers), standardises the features on
the training rows, and fits both estimators with ``random_state=seed`` and nothing else set
(the convergence warnings of ``max_iter`` are silenced). One thread each: scikit-learn's BLAS
pools limited by threadpoolctl, every onnxruntime session of ort-train forced to one intra-op
thread (:func:`_common.force_session_threads`); fit times are the process's CPU seconds (wall
time on a quiet machine; on a shared one they do not count the other processes' turns).
``--all-cores``: each library's own threading instead (ort-train's thread policy, scikit-learn's
BLAS pools unlimited), fit times in wall seconds.

A second table (not in ``--quick``) runs the SGD drop-ins alone on synthetic sets of growing
size, ``make_classification(n, 20, n_informative=10)`` and ``make_friedman1(n, 20)`` for n =
1000, 4000, 13332 and 40000, to show where their fit time meets scikit-learn's.

Reported per dataset and estimator: the mean test score (accuracy, R²) of each over the seeds,
their difference, the mean ``n_iter_``, and the fit-time ratio ours / scikit-learn's (the sum
of fit times over the seeds; < 1 is faster) of ours' warm fit. Each seed runs one untimed
warm-up fit of each on the first 500 training rows (imports, allocators), then ours twice: cold
(every graph and session cache of the process emptied first: the first fit of an architecture
builds them) and warm (a ``clone`` fitted again on the same rows, as ``GridSearchCV`` refits an
architecture it has fitted: no graph, no session built), whose score must equal the cold one's.
The backend is the default one (``ORT_TRAIN_BACKEND``), named in the report.

Sparse text case (``--sparse-text-only``): SGD classifiers on tf-idf-like CSR 20 000 x 50 000,
and two references timed in the same run at ours' epochs and batch size: the floor (one
hand-written onnxruntime step a batch, filled as ours) and the same step in scipy and numpy.
partial_fit stream (``--stream-only``): 100 calls of 200 and 1000 rows (--quick: 200) through
the SGD drop-ins.

Run: ``python benchmarks/bench_datasets.py [--quick] [--out benchmarks/results]``; it writes
``<host>-<date>-datasets-<backend>[-quick].{json,md}``; ``bench_sklearn.py`` runs it too.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

import _common as common

CLOCK: Callable[[], float] = time.process_time  # wall time with all cores: CPU adds the threads'

SEEDS = (0, 1, 2)
#: the untimed warm-up fit of each estimator takes the first rows of the training set
WARM_UP_ROWS = 500
#: (name, task): :func:`load` gives (X, y)
DATASETS: tuple[tuple[str, str], ...] = (
    ("iris", "classification"),
    ("wine", "classification"),
    ("breast_cancer", "classification"),
    ("digits", "classification"),
    ("make_classification_100k_50", "classification"),
    ("diabetes", "regression"),
    ("friedman1_5000", "regression"),
)
#: --quick: these datasets, one seed
QUICK_DATASETS = ("iris", "breast_cancer", "digits", "diabetes", "friedman1_5000")
#: the size series (not in --quick): the SGD drop-ins only, on synthetic sets of growing rows
#: (training rows = 3/4), to find where their fit time meets scikit-learn's
SIZE_SERIES: tuple[tuple[str, str], ...] = tuple(
    (f"{kind}_{n}_20", task)
    for kind, task in (("make_classification", "classification"), ("friedman1", "regression"))
    for n in (1_000, 4_000, 13_332, 40_000)
)
SIZE_SERIES_ESTIMATORS = ("SGDClassifier", "SGDRegressor")


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    if name == "make_classification_100k_50":
        return datasets.make_classification(100_000, 50, n_informative=10, random_state=0)
    if name == "friedman1_5000":
        return datasets.make_friedman1(5000, noise=1.0, random_state=0)
    rest, _, n_features = name.rpartition("_")  # size series: <kind>_<rows>_<features>
    kind, _, size = rest.rpartition("_")
    if kind == "make_classification":
        return datasets.make_classification(int(size), int(n_features), n_informative=10, random_state=0)
    if kind == "friedman1":
        return datasets.make_friedman1(int(size), int(n_features), noise=1.0, random_state=0)
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    return X, y


def estimators(task: str) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """(ours, scikit-learn's) constructors per estimator name."""
    from sklearn.linear_model import SGDClassifier, SGDRegressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    from ort_train_sklearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor

    if task == "classification":
        return {
            "SGDClassifier": (OrtSGDClassifier, SGDClassifier),
            "MLPClassifier": (OrtMLPClassifier, MLPClassifier),
        }
    return {"SGDRegressor": (OrtSGDRegressor, SGDRegressor), "MLPRegressor": (OrtMLPRegressor, MLPRegressor)}


def split(X: np.ndarray, y: np.ndarray, task: str, seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=seed, stratify=y if task == "classification" else None
    )
    scaler = StandardScaler().fit(X_train)
    return (
        scaler.transform(X_train).astype(np.float32),
        scaler.transform(X_test).astype(np.float32),
        y_train,
        y_test,
    )


def timed_fit(make: Callable[..., Any], seed: int, X: np.ndarray, y: np.ndarray) -> tuple[Any, float]:
    from sklearn.exceptions import ConvergenceWarning

    est = make(random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = CLOCK()
        est.fit(X, y)
        return est, CLOCK() - start


def run_case(name: str, task: str, estimator: str, seeds: tuple[int, ...]) -> dict[str, Any]:
    from sklearn.base import clone

    from ort_train_core._cache import clear_caches

    ours_make, theirs_make = estimators(task)[estimator]
    X, y = load(name)
    runs = []
    load_before = common.loadavg()
    for seed in seeds:
        X_train, X_test, y_train, y_test = split(X, y, task, seed)
        for make in (ours_make, theirs_make):  # warm-up (imports, allocators) on a few rows
            timed_fit(make, seed, X_train[:WARM_UP_ROWS], y_train[:WARM_UP_ROWS])
        clear_caches()
        cold, t_cold = timed_fit(ours_make, seed, X_train, y_train)
        ours, t_ours = timed_fit(lambda **_: clone(cold), seed, X_train, y_train)  # noqa: B023
        theirs, t_theirs = timed_fit(theirs_make, seed, X_train, y_train)
        runs.append(
            {
                "seed": seed,
                "score": float(ours.score(X_test, y_test)),
                "cold_score": float(cold.score(X_test, y_test)),
                "sklearn_score": float(theirs.score(X_test, y_test)),
                "cold_fit_s": t_cold,
                "fit_s": t_ours,
                "sklearn_fit_s": t_theirs,
                "n_iter": int(ours.n_iter_),
                "sklearn_n_iter": int(theirs.n_iter_),
            }
        )
    return {
        "name": f"{name}/{estimator}",
        "dataset": name,
        "estimator": estimator,
        "n_train": int(len(X) * 0.75),
        "n_features": int(X.shape[1]),
        "runs": runs,
        "score": float(np.mean([r["score"] for r in runs])),
        "sklearn_score": float(np.mean([r["sklearn_score"] for r in runs])),
        "time_ratio": float(sum(r["fit_s"] for r in runs) / sum(r["sklearn_fit_s"] for r in runs)),
        "cold_ratio": float(sum(r["cold_fit_s"] for r in runs) / sum(r["sklearn_fit_s"] for r in runs)),
        "warm_equals_cold": all(r["score"] == r["cold_score"] for r in runs),
        "loadavg_1min": [load_before, common.loadavg()],
    }


def run(
    quick: bool, sparse_text_only: bool = False, stream_only: bool = False, all_cores: bool = False
) -> dict[str, Any]:
    """Every case (or the sparse text case, or the partial_fit stream, alone) under one thread
    (``all_cores``: each library's own threading); the report."""
    from threadpoolctl import threadpool_limits

    import ort_train_sklearn  # noqa: F401  (fails early, with its fix, without a runtime)

    global CLOCK
    CLOCK = time.perf_counter if all_cores else time.process_time
    undo = (lambda: None) if all_cores else common.force_session_threads(1)
    seeds = SEEDS[:1] if quick else SEEDS
    cases = []
    try:
        with threadpool_limits(None if all_cores else 1):
            for name, task in () if sparse_text_only or stream_only else DATASETS:
                if quick and name not in QUICK_DATASETS:
                    continue
                for estimator in estimators(task):
                    case = run_case(name, task, estimator, seeds)
                    print(
                        f"{name:>30} {estimator:>14}: score {case['score']:.3f} vs "
                        f"{case['sklearn_score']:.3f}, time x{case['time_ratio']:.2f} (cold "
                        f"x{case['cold_ratio']:.2f}, warm score = cold: {case['warm_equals_cold']})",
                        flush=True,
                    )
                    cases.append(case)
            for name, task in () if quick or sparse_text_only or stream_only else SIZE_SERIES:
                for estimator in SIZE_SERIES_ESTIMATORS:
                    if estimator not in estimators(task):
                        continue
                    case = run_case(name, task, estimator, seeds)
                    case["series"] = "size"
                    print(f"{name:>30} {estimator:>14}: time x{case['time_ratio']:.2f}", flush=True)
                    cases.append(case)
            stream_cases = STREAM_CASES[: 0 if sparse_text_only else 4 - 2 * quick]
            streams = [run_stream(*c, seeds) for c in stream_cases]
            print(*(f"{c['name']:>44}: x{c['targets'][0]['ratio']:.2f}" for c in streams), sep="\n")
            sparse_text = None if stream_only else run_sparse_text(seeds)
            for case in [*streams, *([sparse_text] if sparse_text else [])]:
                case["threads"] = "all cores" if all_cores else "one thread"
            if sparse_text is not None:
                print(f"{'sparse text':>30} {'SGDClassifier':>14}: x{sparse_text['targets'][0]['ratio']:.2f}")
    finally:
        undo()
    from ort_train_core._backends import default_backend_name

    threads = f"all ({os.cpu_count()} cores)" if all_cores else 1
    config = {"quick": quick, "seeds": list(seeds), "threads": threads, "test_size": 0.25}
    return {
        "date": common.today(),
        "config": {**config, "backend": default_backend_name()},
        "machine": common.machine_info(),
        "cases": cases,
        "sparse_text": sparse_text,
        "partial_fit_stream": streams,
    }


def markdown_lines(report: dict[str, Any]) -> list[str]:
    """The table: one row per dataset and estimator."""
    tables = []
    for series in (None, "size"):
        cases = [c for c in report["cases"] if c.get("series") == series]
        if cases:
            tables.append(_rows(cases))
    seeds = report["config"]["seeds"]
    header = ["dataset", "train", "estimator", "ours", "scikit-learn", "diff", "n_iter_"]
    header += ["fit ms: cold / warm / scikit-learn", "time ratio (warm)"]
    align = ["l", "r", "l", "r", "r", "r", "r", "r", "r"]
    backend = report["config"].get("backend")
    lines = [
        f"### Default parameters on scikit-learn's datasets ({len(seeds)} seed(s), "
        f"{'one thread' if report['config']['threads'] == 1 else 'all cores, wall time'}, "
        f"backend {backend})",
        "",
        "Score: test accuracy or R² (25 % split) of the warm fit (equal to the cold fit's), mean over "
        "the seeds; time: warm fit seconds of ours over scikit-learn's, summed over the seeds (< 1: ours "
        "faster); cold: a fit on empty caches (graphs and sessions built).",
        "",
    ]
    lines += common.markdown_table(header, tables[0], align)
    if len(tables) > 1:
        lines += [
            "",
            "### The SGD drop-ins by training rows (synthetic sets, 20 features)",
            "",
            "Where the fit time of ours meets scikit-learn's: a fixed setup per fit (graph, session) and "
            "tens of microseconds per onnxruntime step, against scikit-learn's compiled per-sample loop.",
            "",
        ]
        lines += common.markdown_table(header, tables[1], align)
    if report.get("sparse_text"):
        lines += sparse_text_lines(report["sparse_text"])
    lines += stream_lines(report["partial_fit_stream"]) if report.get("partial_fit_stream") else []
    lines += ["", f"Load average (1 min) around each case: {common.load_text(report['cases'])}"]
    return lines


def _rows(cases: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for c in cases:
        runs = c["runs"]

        def mean(key: str, scale: float = 1.0) -> float:
            return float(scale * np.mean([r[key] for r in runs]))  # noqa: B023 (used at once)

        rows.append(
            [
                c["dataset"],
                f"{c['n_train']}x{c['n_features']}",
                c["estimator"],
                f"{c['score']:.3f}",
                f"{c['sklearn_score']:.3f}",
                f"{c['score'] - c['sklearn_score']:+.3f}",
                f"{mean('n_iter'):.0f} / {mean('sklearn_n_iter'):.0f}",
                " / ".join(f"{mean(k, 1e3):.1f}" for k in ("cold_fit_s", "fit_s", "sklearn_fit_s")),
                f"{c['time_ratio']:.2f}",
            ]
        )
    return rows


# ---- the sparse text case (issue 30 item 8): ours / scikit-learn's in the same run -----------
SPARSE_TEXT = {"train": 20_000, "predict": 5_000, "features": 50_000, "density": 1e-3}
SPARSE_TEXT_TARGETS = {"fit": 3.0, "n_iter": 1.5, "memory": 10.0, "predict": 3.0, "accuracy": 0.01}


def text_like(rows: int, features: int, density: float, seed: int) -> tuple[Any, np.ndarray]:
    """tf-idf-like float64 CSR rows (Zipf-like words, unit norm), labels from a linear function."""
    rng = np.random.default_rng(seed)
    rows_of = np.repeat(np.arange(rows), rng.poisson(density * features, rows))
    p = 1.0 / (np.arange(features) + 20.0)
    data = (rng.exponential(1.0, rows_of.size), (rows_of, rng.choice(features, rows_of.size, p=p / p.sum())))
    X = sp.csr_matrix(data, shape=(rows, features))
    X = sp.csr_matrix(sp.diags(1 / np.maximum(sp.linalg.norm(X, axis=1), 1e-12)) @ X)
    return X, (X @ rng.standard_normal(features) > 0).astype(int)


def _sparse_text_run(make: Callable[..., Any], seed: int, X: Any, y: np.ndarray, n: int) -> dict[str, float]:
    """Extra memory of an untimed fit on n rows; a timed fit's figures; its best of 5 predicts."""
    (X, X_test), (y, y_test) = (X[:n], X[n:]), (y[:n], y[n:])  # copies made before measuring
    sampler = common.RssSampler().start()
    make(random_state=seed).fit(X, y)
    memory, start = float(sampler.stop() or 0), CLOCK()
    est = make(random_state=seed).fit(X, y)
    fit, times = CLOCK() - start, [time.perf_counter()]
    for _ in range(6):  # the first builds the prediction session
        est.predict(X_test)
        times.append(time.perf_counter())
    figures = {"fit": fit, "n_iter": est.n_iter_, "accuracy": est.score(X_test, y_test), "memory": memory}
    # rows a step: 'auto' on these rows (a private method: no public name); scikit-learn's: 1
    figures["batch"] = est._batch_size(n) if hasattr(est, "_batch_size") else 1
    return {**figures, "predict": min(np.diff(times)[1:])}


def _floor_session(index_type: int) -> Any:
    """The floor of the sparse fit in onnxruntime: one hinge SGD step ``(W, b) -> (W', b')`` on
    a padded batch in as few kernels as it allows (the gather, the products and their row
    sums; the hinge's active rows; the scatter-add of the gradient straight into the decayed
    ``W``), no loss value, constant rate ``lr / rows`` and decay ``1 - lr alpha`` fed."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    from ort_train_core.graph import MAX_IR_VERSION

    n = helper.make_node
    nodes = [
        n("Reshape", ["columns", "flat"], ["cf"]),
        n("GatherElements", ["W", "cf"], ["wg"], axis=0),
        n("Shape", ["values"], ["shape"]),
        n("Reshape", ["wg", "shape"], ["wr"]),
        n("Mul", ["values", "wr"], ["p"]),
        n("ReduceSum", ["p", "axis1"], ["f0"], keepdims=0),
        n("Add", ["f0", "b"], ["f"]),
        n("Mul", ["y", "f"], ["yf"]),
        n("Less", ["yf", "one"], ["active"]),
        n("Cast", ["active"], ["af"], to=T.FLOAT),
        n("Mul", ["af", "y"], ["ay"]),
        n("Mul", ["ay", "rate"], ["s"]),  # -lr dL/df
        n("Unsqueeze", ["s", "axis1"], ["s2"]),
        n("Mul", ["values", "s2"], ["ds"]),
        n("Reshape", ["ds", "flat"], ["dsf"]),
        n("Mul", ["W", "decay"], ["Wd"]),
        n("ScatterElements", ["Wd", "cf", "dsf"], ["W2"], axis=0, reduction="add"),
        n("ReduceSum", ["s", "axis0"], ["db"], keepdims=1),
        n("Add", ["b", "db"], ["b2"]),
    ]
    info = helper.make_tensor_value_info
    consts = {"flat": [-1], "axis0": [0], "axis1": [1]}
    graph = helper.make_graph(
        nodes,
        "floor",
        [
            *(info("values", T.FLOAT, ["r", "s"]), info("columns", index_type, ["r", "s"])),
            *(info("y", T.FLOAT, ["r"]), info("W", T.FLOAT, ["F"]), info("b", T.FLOAT, [1])),
            *(info("rate", T.FLOAT, []), info("decay", T.FLOAT, [])),
        ],
        [info("W2", T.FLOAT, ["F"]), info("b2", T.FLOAT, [1])],
        [numpy_helper.from_array(np.float32(1), "one")]
        + [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = MAX_IR_VERSION
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


#: the references' constant rate and L2 (their step's cost does not depend on them)
REFERENCE_RATE, REFERENCE_ALPHA = 0.01, 1e-4


def _reference_batches(n: int, epochs: int, batch: int, seed: int) -> Iterator[np.ndarray]:
    """The rows of each batch of ``epochs`` shuffled epochs over ``n`` rows."""
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(n)
        yield from (order[s : s + batch] for s in range(0, n, batch))


def _floor_fit(X: Any, y: np.ndarray, epochs: int, batch: int, seed: int) -> float:
    """Seconds of ``epochs`` shuffled epochs of :func:`_floor_session`'s step, each batch made by
    the padded fill the fit uses (core's ``padded_rows``): what any onnxruntime graph of this
    design costs at least, the figure its fit time is to be read against."""
    from onnx import helper

    from ort_train_core.extending import padded_rows

    values, columns = padded_rows(X, dtype=np.float32)
    session = _floor_session(helper.np_dtype_to_tensor_dtype(columns.dtype))
    bufs = [np.empty((batch, values.width), a.dtype) for a in (values, columns)]
    signs = np.where(y > 0, 1, -1).astype(np.float32)
    W, b = np.zeros(X.shape[1], np.float32), np.zeros(1, np.float32)
    decay = np.array(1 - REFERENCE_RATE * REFERENCE_ALPHA, np.float32)
    start = CLOCK()
    for rows in _reference_batches(X.shape[0], epochs, batch, seed):
        for part, buf in zip((values, columns), bufs):
            part.rows_into(rows, buf[: len(rows)])
        feeds = {"values": bufs[0][: len(rows)], "columns": bufs[1][: len(rows)], "y": signs[rows]}
        rate = np.array(REFERENCE_RATE / len(rows), np.float32)
        W, b = session.run(None, {**feeds, "W": W, "b": b, "rate": rate, "decay": decay})
    return CLOCK() - start


def _scipy_fit(X: Any, y: np.ndarray, epochs: int, batch: int, seed: int) -> float:
    """Seconds of :func:`_floor_fit`'s epochs with the step's products in scipy and numpy (no
    onnxruntime): what the route that leaves them outside the graph would cost."""
    signs, W, b = np.where(y > 0, 1.0, -1.0), np.zeros(X.shape[1]), 0.0
    start = CLOCK()
    for rows in _reference_batches(X.shape[0], epochs, batch, seed):
        X_b, y_b = X[rows], signs[rows]
        step = np.where(y_b * (X_b @ W + b) < 1, y_b, 0.0) * (REFERENCE_RATE / len(rows))
        W *= 1 - REFERENCE_RATE * REFERENCE_ALPHA
        W += X_b.T @ step
        b += step.sum()
    return CLOCK() - start


def run_sparse_text(seeds: tuple[int, ...]) -> dict[str, Any]:
    """OrtSGDClassifier / SGDClassifier (defaults: hinge) on :func:`text_like` data per seed."""
    from sklearn.linear_model import SGDClassifier

    from ort_train_sklearn import OrtSGDClassifier

    cfg, runs, loads, n = SPARSE_TEXT, [], [common.loadavg()], SPARSE_TEXT["train"]
    for seed in seeds:
        X, y = text_like(n + cfg["predict"], cfg["features"], cfg["density"], seed)
        for make in (OrtSGDClassifier, SGDClassifier):  # warm-up (imports, graphs), then measured
            _sparse_text_run(make, seed, X[: n + 500], y[: n + 500], 500)
        ours, theirs = (_sparse_text_run(m, seed, X, y, n) for m in (OrtSGDClassifier, SGDClassifier))
        args = (X[:n], y[:n], round(ours["n_iter"]), int(ours["batch"]), seed)
        floor = {"fit": _floor_fit(*args), "scipy": _scipy_fit(*args)}
        runs.append({"ours": ours, "sk": theirs, "floor": floor})
    targets = []
    for k, bound in SPARSE_TEXT_TARGETS.items():  # ratio of sums; accuracy: the mean gap
        ratio = sum(r["ours"][k] for r in runs) / sum(r["sk"][k] or 1e-9 for r in runs)
        ratio = abs(np.mean([r["ours"][k] - r["sk"][k] for r in runs])) if k == "accuracy" else ratio
        targets.append({"target": k, "case": "sparse text", "ratio": ratio, "op": "<=", "bound": bound})
        targets[-1]["pass"] = ratio <= bound
    return {**cfg, "runs": runs, "targets": targets, "loadavg_1min": [*loads, common.loadavg()]}


def sparse_text_lines(case: dict[str, Any]) -> list[str]:
    """The sparse text table (means over the seeds) and its targets."""
    scale = {"fit": 1e3, "n_iter": 1, "accuracy": 1, "memory": 2.0**-20, "predict": 1e3}
    mean = {
        who: [f"{s * np.mean([r[who][k] for r in case['runs']]):.4g}" for k, s in scale.items()]
        for who in ("ours", "sk")
    }
    rows = [["OrtSGDClassifier", *mean["ours"]], ["SGDClassifier", *mean["sk"]]]
    floor_line = []  # reports written before the references (bb0ed02) have none
    if all("floor" in r for r in case["runs"]):
        sk_fit = sum(r["sk"]["fit"] for r in case["runs"])
        floor, scipy_fit = ([r["floor"][k] for r in case["runs"]] for k in ("fit", "scipy"))
        for name, fits in (("the floor (one fused step)", floor), ("the step in scipy", scipy_fit)):
            rows.append([name, f"{1e3 * np.mean(fits):.4g}", "ours'", *["-"] * 3])
        floor_line = [
            "\nThe floor: ours' epochs of one hand-written onnxruntime step a batch (gather, products,"
            " hinge, scatter-add into the decayed W; no loss value), filled as ours: "
            f"{sum(floor) / sk_fit:.2f}x scikit-learn's fit time. Any graph of this design costs at"
            f" least that. The same step in scipy and numpy: {sum(scipy_fit) / sk_fit:.2f}x."
        ]
    return [
        f"\n### Sparse text: CSR {case['train']} x {case['features']}, density {case['density']:g}, hinge, "
        f"defaults ({len(case['runs'])} seed(s), {case.get('threads', 'one thread')})\n",
        f"Extra memory: {common.RssSampler().method}; predict: {case['predict']} sparse rows, best of 5.\n",
        *common.markdown_table(["estimator", "fit ms", "n_iter_", "accuracy", "MiB", "predict ms"], rows),
        *floor_line,
        *["", *common.targets_table(case["targets"])],
    ]


# ---- the partial_fit stream (issue 30 item 9): ms a call, ours / scikit-learn's in the same run
#: (dataset, task, rows a call; 3/4 of the rows are trained on): STREAM_CALLS calls; --quick: two
STREAM_CASES = [
    (f"{kind}_{rows * 400 // 3 + 1}_{n}", task, rows)
    for rows in (200, 1000)
    for kind, task, n in (("make_classification", "classification", 50), ("friedman1", "regression", 20))
]
STREAM_CALLS, STREAM_TARGET = 100, 2.0


def run_stream(name: str, task: str, rows: int, seeds: tuple[int, ...]) -> dict[str, Any]:
    """Per seed, ours' and scikit-learn's calls in turn (a drift of the machine's speed falls on
    both): ms a call after the first (which builds the graphs), the first's, the test score."""
    makes = estimators(task)["SGDClassifier" if task == "classification" else "SGDRegressor"]
    (X, y), runs = load(name), list[dict[str, list[float]]]()
    for seed in seeds:
        X_train, X_test, y_train, y_test = split(X, y, task, seed)
        extra, runs = ({"classes": np.unique(y)} if task == "classification" else {}), [*runs, {}]
        ests, times = [make(random_state=seed) for make in makes], [[], []]
        for part in (slice(i * rows, (i + 1) * rows) for i in range(STREAM_CALLS)):
            for est, t in zip(ests, times):
                start = CLOCK()
                est.partial_fit(X_train[part], y_train[part], **extra)
                t.append(1e3 * (CLOCK() - start))
        for who, est, t in zip(("ours", "sklearn"), ests, times):
            runs[-1][who] = [float(np.mean(t[1:])), t[0], float(est.score(X_test, y_test))]
    ratio, case = sum(r["ours"][0] for r in runs) / sum(r["sklearn"][0] for r in runs), f"{name} x{rows}"
    target = {"target": "partial_fit", "case": case, "ratio": ratio, "op": "<=", "bound": STREAM_TARGET}
    return {"name": case, "runs": runs, "targets": [{**target, "pass": ratio <= STREAM_TARGET}]}


def stream_lines(cases: list[dict[str, Any]]) -> list[str]:
    """The stream table (means over the seeds) and its targets."""

    def both(c: dict[str, Any], k: int) -> str:  # ours / scikit-learn's mean over the seeds
        return " / ".join(f"{np.mean([r[who][k] for r in c['runs']]):.3g}" for who in ("ours", "sklearn"))

    rows = [[c["name"], *(both(c, k) for k in range(3))] for c in cases]
    clock = (
        "all cores, wall time" if cases and cases[0].get("threads") == "all cores" else "one thread, CPU time"
    )
    return [
        f"\n### partial_fit: {STREAM_CALLS} calls a stream, the SGD drop-ins ({clock})\n",
        *common.markdown_table(["case", "ms a call: ours / sklearn", "first call ms", "test score"], rows),
        *["", *common.targets_table([t for c in cases for t in c["targets"]])],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, f"{', '.join(QUICK_DATASETS)}, one seed")
    parser.add_argument("--sparse-text-only", action="store_true", help="the sparse text case alone")
    parser.add_argument("--stream-only", action="store_true", help="the partial_fit stream alone")
    parser.add_argument(
        "--all-cores",
        action="store_true",
        help="each library's own threading instead of one thread (ort-train's policy, scikit-learn's BLAS)",
    )
    args = parser.parse_args(argv)
    report = run(args.quick, args.sparse_text_only, args.stream_only, args.all_cores)
    if args.stream_only:
        load = f"Load average (1 min) at the end: {common.loadavg()}"
        lines = [*stream_lines(report["partial_fit_stream"]), "", load]
    else:
        lines = sparse_text_lines(report["sparse_text"]) if args.sparse_text_only else markdown_lines(report)
    text = "\n".join(["# Datasets", "", common.machine_line(report["machine"]), "", *lines])
    print(f"\n{text}")
    only = (
        "-sparse-text" * args.sparse_text_only + "-stream" * args.stream_only + "-all-cores" * args.all_cores
    )
    name = f"datasets-{report['config']['backend']}{only}"
    common.write_report(args.out, name, args.quick, report, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
